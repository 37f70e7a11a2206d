//! KV-aware routing end to end: worker-side publishers, router-side indexers and the
//! async [`KvRouter`] that the frontend (and the Python `KvRouter`) drive.
//!
//! The pure logic (hashing, index, cost, sampling, event cursors, replay buffer) lives in
//! the `dynamo-kv-router` crate; this module adds what needs the runtime: channels between
//! processes, discovery of workers, recovery queries and request dispatch. It lives in
//! `dynamo-llm` (not in the runtime or the pure crate) because its users are here: the
//! mocker engine publishes through [`KvEventPublisher::publish_raw`] and the frontend
//! routes through [`KvRouter`].
//!
//! Channels (all scoped to the worker endpoint's `namespace.component`):
//!
//! | name | kind | payload |
//! |---|---|---|
//! | `kv-events` | event plane, worker → routers | one JSON `RouterEvent` per event |
//! | `kv_metrics` | event plane, worker → routers | JSON [`ActiveLoad`] |
//! | `router-replicas.{endpoint}` | event plane, router ↔ routers (`router_replica_sync`) | JSON `SyncMessage` ([`replica_sync`]) |
//! | `worker_kv_indexer_query_dp{rank}` | request plane (request/response) | `WorkerKvQueryRequest` → `WorkerKvQueryResponse` |
//!
//! The topics go through [`bus`], a thin synchronous front of the runtime's event plane
//! (brokerless TCP or NATS). See `docs/design/kv_routing.md`.
//!
//! Frontend use (a sketch; `crates/dynamo-frontend/src/http/kv_selector.rs` is the real caller):
//!
//! ```text
//! let router = KvRouter::new(&drt, &endpoint, block_size, KvRouterConfig::default(),
//!                            LoadThresholds::default())?;
//! let stream = router.generate(&tokens, body, RouteOptions::default(), ctx).await?;
//! // `stream.next()` marks prefill complete at the first item; dropping it frees the
//! // request's load.
//! ```
//!
//! Mocker use: one [`KvEventPublisher::new_raw`] per worker rank; its engine event sink
//! calls [`KvEventPublisher::publish_raw`] with each step's `Vec<KvCacheEventData>`, and a
//! [`WorkerMetricsPublisher`] reports `kv_used_blocks`.
//!
//! Block-manager use: give `KvBlockManager::new` a [`BlockManagerEventSink`] over a raw
//! publisher, and routers learn the prefixes the manager registers (one Stored when a
//! prefix first appears in any tier, one Removed when its last copy is gone).

mod block_events;
pub mod bus;
pub mod event_stats;
mod publisher;
pub mod replica_sync;
mod router;
pub mod zmq;
pub mod zmq_pub;

use std::sync::{Mutex, MutexGuard};

pub use block_events::BlockManagerEventSink;
pub use event_stats::{KvEventStats, KvEventStatsSnapshot};
pub use publisher::{ActiveLoad, KvEventPublisher, WorkerMetricsPublisher};
pub use router::{Booking, KvRouter, RouteOptions, RoutedStream};

/// KV events topic.
pub const KV_EVENTS_TOPIC: &str = "kv-events";
/// Load metrics topic.
pub const KV_METRICS_TOPIC: &str = "kv_metrics";

/// The replay endpoint of a rank's worker-local indexer.
pub fn query_endpoint_name(dp_rank: u32) -> String {
    format!("worker_kv_indexer_query_dp{dp_rank}")
}

/// Errors of KV routing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the routing core (bad input, no workers, unknown request, ...).
    #[error(transparent)]
    Router(#[from] dynamo_kv_router::Error),
    /// From the runtime (discovery, transport, remote errors).
    #[error(transparent)]
    Runtime(#[from] dynamo_runtime::Error),
    /// Bad arguments.
    #[error("{0}")]
    InvalidArgument(String),
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
