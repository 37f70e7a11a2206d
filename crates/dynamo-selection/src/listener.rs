//! One KV-event listener per worker rank: subscribes to the engine's ZMQ PUB endpoint
//! (the project's own SUB client, `kv_routing::zmq`), decodes each message with
//! `dynamo_kv_router::engine_events`, turns it into router events with the rank's own
//! `PublisherCore` (which recomputes the blocks' content hashes with the group's block
//! size and numbers events) and applies them to the group's radix tree.
//!
//! * Every message that has already arrived on the connection is handled in one go: the
//!   frames are parsed in place in the connection's read buffer, the events decoded and
//!   numbered, and then applied under one tree write lock (at most [`MAX_PENDING`] events
//!   per lock), so a busy publisher costs one lock per read rather than per message.
//!
//! * The connection state is published to the worker's [`LinkCell`], which the catalog
//!   turns into `not_schedulable_reasons` while the publisher is unreachable.
//! * A malformed message is counted and skipped; it never stops the listener.
//! * The engine's 8-byte sequence frame is checked. A jump means messages were lost (PUB
//!   semantics: sent while the SUB socket was disconnected or too slow). When the worker
//!   registered a `replay_endpoint`, the listener asks it (vLLM's replay protocol, see
//!   `kv_routing::zmq::request_replay`) for the missing range before applying the new
//!   message: if the answer covers it, the missed messages are applied in order and the gap
//!   counts as repaired; otherwise (no replay endpoint, unreachable, or the engine's buffer
//!   no longer holds them) whatever part came back is applied and the gap counts as
//!   unrepaired — the engine's later stores and removes repair the index over time. A
//!   sequence that goes backwards means the engine restarted, so the rank's old blocks are
//!   dropped.
//! * Events of tiers other than the device (host, disk offload) are counted and skipped:
//!   the tree scores device prefixes.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dynamo_kv_router::engine_events::{EngineEvent, decode_engine_batch, decode_sequence};
use dynamo_kv_router::protocols::{RouterEvent, StorageTier, WorkerWithDpRank};
use dynamo_kv_router::publisher::{PublishInput, PublisherCore};
use dynamo_llm::kv_routing::zmq::{Backoff, Frames, SubConnection, dial_address, request_replay};
use tokio_util::sync::CancellationToken;

use super::group::{Group, lock};

/// Most router events built from one connection's buffered messages before they are
/// applied (bounds how long one tree write lock is held).
const MAX_PENDING: usize = 256;

/// How long a replay request may take before the gap is given up as unrepaired.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// Connection state of one rank's listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// No attempt finished yet.
    Pending,
    /// Connected and subscribed.
    Up,
    /// Unreachable (why).
    Down(String),
}

/// Shared, updated by the listener task.
pub type LinkCell = Arc<Mutex<Link>>;

/// Counters of every listener of a service.
#[derive(Debug, Default)]
pub struct ListenerMetrics {
    /// Events applied to a tree.
    pub events_applied: AtomicU64,
    /// Events the tree rejected (unknown parent, ...).
    pub events_rejected: AtomicU64,
    /// Events of a non-device tier, skipped.
    pub events_skipped_tier: AtomicU64,
    /// Messages that did not decode.
    pub malformed_frames: AtomicU64,
    /// Sequence jumps (lost messages), repaired or not.
    pub sequence_gaps: AtomicU64,
    /// Gaps whose missing messages were all replayed from the engine's replay endpoint.
    pub gaps_repaired: AtomicU64,
    /// Gaps that could not be (completely) replayed.
    pub gaps_unrepaired: AtomicU64,
    /// Messages applied from replay answers.
    pub replayed_messages: AtomicU64,
    /// Engine restarts seen (sequence went backwards).
    pub engine_restarts: AtomicU64,
}

/// The replay endpoint of the rank at `offset` from the worker's first rank: vLLM's (and
/// the mocker's) convention is one replay port per rank, `base_port + offset`. `None` when
/// `replay_endpoint` is not a `tcp://host:port` address.
pub(crate) fn rank_replay_address(replay_endpoint: &str, offset: u32) -> Option<String> {
    let address = crate::catalog::zmq_tcp_address(replay_endpoint).ok()?;
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse::<u32>().ok()?.checked_add(offset)?;
    let port = u16::try_from(port).ok()?;
    Some(format!("{host}:{port}"))
}

/// What one rank's listener keeps between messages.
struct RankState {
    group: Arc<Group>,
    rank: WorkerWithDpRank,
    publisher: PublisherCore,
    last_seq: Option<u64>,
    replay: Option<String>,
    metrics: Arc<ListenerMetrics>,
    /// Events decoded and numbered, waiting for one tree write.
    pending: Vec<RouterEvent>,
}

/// Start the listener of `rank` on `endpoint` (a validated `host:port` address), with the
/// rank's replay socket at `replay` (`host:port`) when the worker registered one.
#[expect(clippy::too_many_arguments, reason = "the listener's whole context")]
pub(crate) fn spawn(
    handle: &tokio::runtime::Handle,
    group: Arc<Group>,
    rank: WorkerWithDpRank,
    endpoint: String,
    replay: Option<String>,
    link: LinkCell,
    stop: CancellationToken,
    metrics: Arc<ListenerMetrics>,
) {
    handle.spawn(async move {
        let Ok(publisher) = PublisherCore::new(rank, group.block_size as usize, false) else {
            *lock(&link) = Link::Down("block_size must be greater than 0".to_owned());
            return;
        };
        let mut state = RankState {
            group,
            rank,
            publisher,
            last_seq: None,
            replay,
            metrics,
            pending: Vec::with_capacity(MAX_PENDING),
        };
        let address = dial_address(&endpoint);
        let mut backoff = Backoff::new();
        while !stop.is_cancelled() {
            let attempt = tokio::select! {
                c = SubConnection::connect(&address, b"") => c,
                () = stop.cancelled() => return,
            };
            match attempt {
                Ok(mut conn) => {
                    backoff.reset();
                    *lock(&link) = Link::Up;
                    loop {
                        let filled = tokio::select! {
                            r = conn.fill() => r,
                            () = stop.cancelled() => return,
                        };
                        // Every message that has arrived, applied in a few tree writes.
                        let drained = match filled {
                            Ok(()) => state.drain(&mut conn).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = drained {
                            tracing::debug!(endpoint = %endpoint, error = %e, "engine ZMQ connection lost");
                            *lock(&link) = Link::Down(format!("connection lost: {e}"));
                            break;
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(endpoint = %endpoint, error = %e, "engine ZMQ connect failed");
                    *lock(&link) = Link::Down(format!("connect failed: {e}"));
                }
            }
            if !backoff.wait(&stop).await {
                return;
            }
        }
    });
}

impl RankState {
    /// Handle every message already buffered on `conn`, then apply what they built.
    async fn drain(&mut self, conn: &mut SubConnection) -> std::io::Result<()> {
        while let Some(message) = conn.next_buffered()? {
            self.on_message(&message).await;
        }
        self.flush();
        Ok(())
    }

    async fn on_message(&mut self, message: &Frames<'_>) {
        let Some(payload) = message.last() else {
            self.metrics
                .malformed_frames
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        if message.len() >= 3 {
            let Some(Ok(seq)) = message.get(message.len() - 2).map(decode_sequence) else {
                self.metrics
                    .malformed_frames
                    .fetch_add(1, Ordering::Relaxed);
                return;
            };
            if let Some(last) = self.last_seq {
                if seq <= last {
                    // The engine restarted (its counter starts again): its cache is new.
                    self.metrics.engine_restarts.fetch_add(1, Ordering::Relaxed);
                    self.flush();
                    let rank = self.rank;
                    self.group.tree.with_write(|t| t.clear_rank(rank));
                } else if seq > last + 1 {
                    self.metrics.sequence_gaps.fetch_add(1, Ordering::Relaxed);
                    self.flush();
                    self.repair(last, seq).await;
                }
            }
            self.last_seq = Some(seq);
        }
        self.add_payload(payload);
    }

    /// Replay the messages after `last` and before `seq` from the engine's replay socket
    /// (applied before this returns).
    async fn repair(&mut self, last: u64, seq: u64) {
        let metrics = self.metrics.clone();
        let Some(replay) = self.replay.clone() else {
            metrics.gaps_unrepaired.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let answer = match request_replay(&replay, last + 1, REPLAY_TIMEOUT).await {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(worker = self.rank.worker_id, error = %e, "KV event replay failed");
                metrics.gaps_unrepaired.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let mut expected = last + 1;
        let mut complete = true;
        for (s, payload) in answer {
            if s <= last || s >= seq {
                continue;
            }
            if s != expected {
                complete = false;
            }
            expected = s + 1;
            metrics.replayed_messages.fetch_add(1, Ordering::Relaxed);
            self.add_payload(&payload);
        }
        self.flush();
        if complete && expected == seq {
            metrics.gaps_repaired.fetch_add(1, Ordering::Relaxed);
        } else {
            metrics.gaps_unrepaired.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Decode one engine payload into router events, queued for the next [`Self::flush`].
    fn add_payload(&mut self, payload: &[u8]) {
        let metrics = &self.metrics;
        let batch = match decode_engine_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(worker = self.rank.worker_id, error = %e, "malformed engine KV message");
                metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        for event in batch.events {
            let tier = match &event {
                EngineEvent::BlockStored { tier, .. } | EngineEvent::BlockRemoved { tier, .. } => {
                    *tier
                }
                EngineEvent::AllBlocksCleared => StorageTier::Device,
            };
            if tier != StorageTier::Device {
                metrics.events_skipped_tier.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let built = match event.into_publish_input(None) {
                PublishInput::Stored(s) => self.publisher.stored(&s),
                PublishInput::Removed(h) => Ok(self.publisher.removed(&h)),
                PublishInput::Cleared => Ok(Some(self.publisher.cleared())),
            };
            match built {
                Ok(Some(e)) => self.pending.push(e),
                Ok(None) => {}
                Err(_) => {
                    metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if self.pending.len() >= MAX_PENDING {
            self.flush();
        }
    }

    /// Apply the queued events to the tree under one write lock.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let worker_id = self.rank.worker_id;
        let pending = &self.pending;
        let applied = self.group.tree.with_write(|t| {
            pending
                .iter()
                .filter(|e| t.apply_event(worker_id, &e.event).is_ok())
                .count()
        });
        let rejected = self.pending.len() - applied;
        self.pending.clear();
        self.metrics
            .events_applied
            .fetch_add(applied as u64, Ordering::Relaxed);
        if rejected > 0 {
            self.metrics
                .events_rejected
                .fetch_add(rejected as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_ports_follow_the_rank() {
        assert_eq!(
            rank_replay_address("tcp://10.0.0.5:5600", 0).as_deref(),
            Some("10.0.0.5:5600")
        );
        assert_eq!(
            rank_replay_address("tcp://*:5600", 2).as_deref(),
            Some("127.0.0.1:5602")
        );
        assert_eq!(rank_replay_address("tcp://h:65535", 1), None);
        assert_eq!(rank_replay_address("ipc:///x", 0), None);
    }
}
