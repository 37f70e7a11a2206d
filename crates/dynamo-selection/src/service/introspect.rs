//! Read-only views of a [`SelectionService`] for the HTTP services: Prometheus text, the
//! indexer's listener states and raw prefix matches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use dynamo_kv_router::hashing::{BlockHashOptions, LocalBlockHash, compute_block_hash_for_seq};
use dynamo_kv_router::protocols::WorkerWithDpRank;

use super::super::catalog::{Lifecycle, WorkerRequest};
use super::super::error::{Result, SelectionError};
use super::super::listener::Link;
use super::super::prom::{Kind, PromText};
use super::super::requests::PromptRequest;
use super::SelectionService;
use crate::group::lock;

impl SelectionService {
    /// Prometheus text of the service's gauges and counters, names prefixed `prefix`.
    pub fn metrics_text(&self, prefix: &str) -> String {
        let (mut active, mut pending, mut down) = (0u64, 0u64, 0u64);
        let mut lifecycle: BTreeMap<&'static str, u64> =
            [("incomplete", 0), ("schedulable", 0), ("unschedulable", 0)].into();
        let (models, reservations) = {
            let st = lock(&self.state);
            for w in st.workers.values() {
                for (_, cell) in w.links.values() {
                    match &*lock(cell) {
                        Link::Up => active += 1,
                        Link::Pending => pending += 1,
                        Link::Down(_) => down += 1,
                    }
                }
                let name = match w.record().lifecycle {
                    Lifecycle::Incomplete => "incomplete",
                    Lifecycle::Schedulable => "schedulable",
                    Lifecycle::Unschedulable => "unschedulable",
                };
                *lifecycle.entry(name).or_default() += 1;
            }
            (st.groups.len(), st.reservations.len())
        };
        let (cached, cache_bytes, evicted) = {
            let c = lock(&self.cache);
            (c.len(), c.bytes(), c.evicted())
        };
        let m = &self.listeners;
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let name = |n: &str| format!("{prefix}_{n}");
        let mut out = PromText::new();
        out.by_label(
            &name("listeners"),
            Kind::Gauge,
            "ZMQ KV-event listeners by status",
            "status",
            [("active", active), ("pending", pending), ("down", down)],
        )
        .by_label(
            &name("workers"),
            Kind::Gauge,
            "Catalog workers by lifecycle",
            "lifecycle",
            lifecycle,
        )
        .by_label(
            &name("kv_events_total"),
            Kind::Counter,
            "Engine KV events by outcome",
            "outcome",
            [
                ("applied", g(&m.events_applied)),
                ("rejected", g(&m.events_rejected)),
                ("skipped_tier", g(&m.events_skipped_tier)),
            ],
        );
        for (n, help, kind, v) in [
            (
                "malformed_frames_total",
                "ZMQ messages that did not decode (skipped)",
                Kind::Counter,
                g(&m.malformed_frames),
            ),
            (
                "sequence_gaps_total",
                "Jumps in an engine's message sequence",
                Kind::Counter,
                g(&m.sequence_gaps),
            ),
            (
                "sequence_gaps_repaired_total",
                "Sequence gaps whose lost messages were replayed from the engine's replay endpoint",
                Kind::Counter,
                g(&m.gaps_repaired),
            ),
            (
                "sequence_gaps_unrepaired_total",
                "Sequence gaps not (completely) replayed: no replay endpoint, or it failed or no longer held them",
                Kind::Counter,
                g(&m.gaps_unrepaired),
            ),
            (
                "replayed_messages_total",
                "Engine messages applied from replay answers",
                Kind::Counter,
                g(&m.replayed_messages),
            ),
            (
                "engine_restarts_total",
                "Engine sequence restarts seen",
                Kind::Counter,
                g(&m.engine_restarts),
            ),
            (
                "models",
                "Model + routing-group indexes",
                Kind::Gauge,
                models as u64,
            ),
            (
                "selections_total",
                "Successful selections",
                Kind::Counter,
                g(&self.counters.selections),
            ),
            (
                "reservations_total",
                "Bookings made",
                Kind::Counter,
                g(&self.counters.reservations),
            ),
            (
                "reservations_active",
                "Bookings not yet freed",
                Kind::Gauge,
                reservations as u64,
            ),
            (
                "errors_total",
                "Failed selection-service calls",
                Kind::Counter,
                g(&self.counters.errors),
            ),
            (
                "pending_selections",
                "Cached selections awaiting a reservation",
                Kind::Gauge,
                cached as u64,
            ),
            (
                "pending_selection_bytes",
                "Estimated bytes of cached selections",
                Kind::Gauge,
                cache_bytes as u64,
            ),
            (
                "pending_selection_evictions_total",
                "Cached selections dropped (TTL, entries, bytes)",
                Kind::Counter,
                evicted,
            ),
        ] {
            out.single(&name(n), kind, help, v);
        }
        out.finish()
    }
}

/// A group's block size and the device prefix (in blocks) of each rank that matched.
pub type RankMatches = (u32, Vec<(WorkerWithDpRank, u32)>);

/// One worker's listeners, for the indexer's `/workers`.
#[derive(Debug, Clone)]
pub struct ListenerView {
    /// The registration.
    pub worker: WorkerRequest,
    /// Rank → (endpoint, `"active" | "pending" | "failed"`).
    pub listeners: BTreeMap<u32, (String, &'static str)>,
}

impl SelectionService {
    /// Every worker with its listeners' states.
    pub fn listener_views(&self) -> Vec<ListenerView> {
        let st = lock(&self.state);
        st.workers
            .values()
            .map(|w| ListenerView {
                worker: w.req.clone(),
                listeners: w
                    .links
                    .iter()
                    .map(|(r, (ep, cell))| {
                        let s = match &*lock(cell) {
                            Link::Up => "active",
                            Link::Pending => "pending",
                            Link::Down(_) => "failed",
                        };
                        (*r, (ep.clone(), s))
                    })
                    .collect(),
            })
            .collect()
    }

    /// The registration of `worker_id`, if any.
    pub fn registration(&self, worker_id: u64) -> Option<WorkerRequest> {
        lock(&self.state)
            .workers
            .get(&worker_id)
            .map(|w| w.req.clone())
    }

    /// Device prefix (in blocks) per rank for a prompt in `model`/`group`, without
    /// readiness checks (the indexer's `/query`); `None` for an unknown group.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidRequest`] for a prompt without tokens or block hashes.
    pub fn index_matches(&self, req: &PromptRequest) -> Result<Option<RankMatches>> {
        let group = lock(&self.state)
            .groups
            .get(&(req.model().to_owned(), req.group().to_owned()))
            .cloned();
        let Some(group) = group else {
            return Ok(None);
        };
        let local: Vec<LocalBlockHash> = if let Some(tokens) = &req.token_ids {
            compute_block_hash_for_seq(
                tokens,
                group.block_size as usize,
                &BlockHashOptions {
                    block_mm_infos: None,
                    lora_name: req.lora_name.as_deref(),
                    cache_namespace: req.cache_namespace.as_deref(),
                    is_eagle: false,
                },
            )
            .map_err(|e| SelectionError::invalid(e.to_string()))?
        } else {
            req.block_hashes
                .as_ref()
                .ok_or_else(|| {
                    SelectionError::invalid("block_hashes is required without token_ids")
                })?
                .iter()
                .map(|h| LocalBlockHash(h.0))
                .collect()
        };
        Ok(Some((
            group.block_size,
            group.tree.find_matches(&local, false).scores,
        )))
    }
}
