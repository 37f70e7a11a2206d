//! One KV-event listener per worker rank: subscribes to the engine's ZMQ PUB endpoint
//! (the project's own SUB client, `kv_routing::zmq`), decodes each message with
//! `dynamo_kv_router::engine_events`, turns it into router events with the rank's own
//! `PublisherCore` (which recomputes the blocks' content hashes with the group's block
//! size and numbers events) and applies them to the group's radix tree.
//!
//! * The connection state is published to the worker's [`LinkCell`], which the catalog
//!   turns into `not_schedulable_reasons` while the publisher is unreachable.
//! * A malformed message is counted and skipped; it never stops the listener.
//! * The engine's 8-byte sequence frame is checked: a jump is counted as a gap (events
//!   were lost while the SUB socket was disconnected: PUB semantics); a sequence that goes
//!   backwards means the engine restarted, so the rank's old blocks are dropped. Replay
//!   through the engine's replay endpoint is not implemented: lost events are repaired by
//!   the engine's later stores and removes only.
//! * Events of tiers other than the device (host, disk offload) are counted and skipped:
//!   the tree scores device prefixes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dynamo_kv_router::engine_events::{EngineEvent, decode_engine_batch, decode_sequence};
use dynamo_kv_router::protocols::{StorageTier, WorkerWithDpRank};
use dynamo_kv_router::publisher::PublisherCore;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::service::{Group, lock};
use crate::kv_routing::zmq::{LinkState, subscribe_loop_observed};

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
    /// Sequence jumps (lost messages).
    pub sequence_gaps: AtomicU64,
    /// Engine restarts seen (sequence went backwards).
    pub engine_restarts: AtomicU64,
}

/// Start the listener of `rank` on `endpoint` (a validated `tcp://` address).
pub(crate) fn spawn(
    handle: &tokio::runtime::Handle,
    group: Arc<Group>,
    rank: WorkerWithDpRank,
    endpoint: String,
    link: LinkCell,
    stop: CancellationToken,
    metrics: Arc<ListenerMetrics>,
) {
    handle.spawn(async move {
        let Ok(mut publisher) = PublisherCore::new(rank, group.block_size as usize, false) else {
            *lock(&link) = Link::Down("block_size must be greater than 0".to_owned());
            return;
        };
        let mut last_seq: Option<u64> = None;
        let link_cb = link.clone();
        let on_message = |message: Vec<Vec<u8>>| {
            on_message(
                &group,
                rank,
                &mut publisher,
                &mut last_seq,
                &metrics,
                &message,
            );
            true
        };
        subscribe_loop_observed(
            endpoint,
            Vec::new(),
            stop,
            || true,
            on_message,
            move |state| {
                *lock(&link_cb) = match state {
                    LinkState::Connected => Link::Up,
                    LinkState::Down(why) => Link::Down(why),
                };
            },
        )
        .await;
    });
}

fn on_message(
    group: &Group,
    rank: WorkerWithDpRank,
    publisher: &mut PublisherCore,
    last_seq: &mut Option<u64>,
    metrics: &ListenerMetrics,
    message: &[Vec<u8>],
) {
    let Some(payload) = message.last() else {
        metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if message.len() >= 3 {
        match decode_sequence(&message[message.len() - 2]) {
            Ok(seq) => {
                if let Some(last) = *last_seq {
                    if seq <= last {
                        // The engine restarted (its counter starts again): its cache is new.
                        metrics.engine_restarts.fetch_add(1, Ordering::Relaxed);
                        group.tree.with_write(|t| t.clear_rank(rank));
                    } else if seq > last + 1 {
                        metrics.sequence_gaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
                *last_seq = Some(seq);
            }
            Err(_) => {
                metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    let batch = match decode_engine_batch(payload) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(worker = rank.worker_id, error = %e, "malformed engine KV message");
            metrics.malformed_frames.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    for event in &batch.events {
        let tier = match event {
            EngineEvent::BlockStored { tier, .. } | EngineEvent::BlockRemoved { tier, .. } => *tier,
            EngineEvent::AllBlocksCleared => StorageTier::Device,
        };
        if tier != StorageTier::Device {
            metrics.events_skipped_tier.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let input = event.to_publish_input(None);
        match publisher.batch(std::slice::from_ref(&input)) {
            Ok(events) => {
                for e in events {
                    match group.tree.apply_event(rank.worker_id, &e.event) {
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
