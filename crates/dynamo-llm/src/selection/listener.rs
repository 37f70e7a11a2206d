//! One KV-event listener per worker rank: subscribes to the engine's ZMQ PUB endpoint
//! (the project's own SUB client, `kv_routing::zmq`), decodes each message with
//! `dynamo_kv_router::engine_events`, turns it into router events with the rank's own
//! `PublisherCore` (which recomputes the blocks' content hashes with the group's block
//! size and numbers events) and applies them to the group's radix tree.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dynamo_kv_router::engine_events::{EngineEvent, decode_engine_batch, decode_sequence};
use dynamo_kv_router::protocols::{StorageTier, WorkerWithDpRank};
use dynamo_kv_router::publisher::PublisherCore;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::service::{Group, lock};
use crate::kv_routing::zmq::{Backoff, SubConnection, dial_address, request_replay};

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
    let address = crate::selection::catalog::zmq_tcp_address(replay_endpoint).ok()?;
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
                        let message = tokio::select! {
                            m = conn.recv() => m,
                            () = stop.cancelled() => return,
                        };
                        match message {
                            Ok(m) => state.on_message(&m).await,
                            Err(e) => {
                                tracing::debug!(endpoint = %endpoint, error = %e, "engine ZMQ connection lost");
                                *lock(&link) = Link::Down(format!("connection lost: {e}"));
                                break;
                            }
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
    async fn on_message(&mut self, message: &[Vec<u8>]) {
        let Some(payload) = message.last() else {
            self.metrics
                .malformed_frames
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        if message.len() >= 3 {
            let Ok(seq) = decode_sequence(&message[message.len() - 2]) else {
                self.metrics
                    .malformed_frames
                    .fetch_add(1, Ordering::Relaxed);
                return;
            };
            if let Some(last) = self.last_seq {
                if seq <= last {
                    // The engine restarted (its counter starts again): its cache is new.
                    self.metrics.engine_restarts.fetch_add(1, Ordering::Relaxed);
                    let rank = self.rank;
                    self.group.tree.with_write(|t| t.clear_rank(rank));
                } else if seq > last + 1 {
                    self.metrics.sequence_gaps.fetch_add(1, Ordering::Relaxed);
                    self.repair(last, seq).await;
                }
            }
            self.last_seq = Some(seq);
        }
        self.apply_payload(payload);
    }

    /// Replay the messages after `last` and before `seq` from the engine's replay socket.
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
            self.apply_payload(&payload);
        }
        if complete && expected == seq {
            metrics.gaps_repaired.fetch_add(1, Ordering::Relaxed);
        } else {
            metrics.gaps_unrepaired.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn apply_payload(&mut self, payload: &[u8]) {
        let metrics = &self.metrics;
        let batch = match decode_engine_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(worker = self.rank.worker_id, error = %e, "malformed engine KV message");
                metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        for event in &batch.events {
            let tier = match event {
                EngineEvent::BlockStored { tier, .. } | EngineEvent::BlockRemoved { tier, .. } => {
                    *tier
                }
                EngineEvent::AllBlocksCleared => StorageTier::Device,
            };
            if tier != StorageTier::Device {
                metrics.events_skipped_tier.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let input = event.to_publish_input(None);
            match self.publisher.batch(std::slice::from_ref(&input)) {
                Ok(events) => {
                    for e in events {
                        match self.group.tree.apply_event(self.rank.worker_id, &e.event) {
                            Ok(()) => metrics.events_applied.fetch_add(1, Ordering::Relaxed),
                            Err(_) => metrics.events_rejected.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }
                Err(_) => {
                    metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
                }
            }
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
