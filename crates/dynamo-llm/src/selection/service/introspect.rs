//! Read-only views of a [`SelectionService`] for the HTTP services: Prometheus text, the
//! indexer's listener states and raw prefix matches.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use dynamo_kv_router::hashing::{BlockHashOptions, LocalBlockHash, compute_block_hash_for_seq};
use dynamo_kv_router::protocols::WorkerWithDpRank;

use super::super::catalog::{Lifecycle, WorkerRequest};
use super::super::error::{Result, SelectionError};
use super::super::listener::Link;
use super::super::requests::PromptRequest;
use super::{SelectionService, lock};

impl SelectionService {
    /// Prometheus text of the service's gauges and counters, names prefixed `prefix`.
    pub fn metrics_text(&self, prefix: &str) -> String {
        let mut out = String::new();
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
        let _ = writeln!(
            out,
            "# HELP {prefix}_listeners ZMQ KV-event listeners by status"
        );
        let _ = writeln!(out, "# TYPE {prefix}_listeners gauge");
        for (s, v) in [("active", active), ("pending", pending), ("down", down)] {
            let _ = writeln!(out, "{prefix}_listeners{{status=\"{s}\"}} {v}");
        }
        let _ = writeln!(out, "# HELP {prefix}_workers Catalog workers by lifecycle");
        let _ = writeln!(out, "# TYPE {prefix}_workers gauge");
        for (s, v) in &lifecycle {
            let _ = writeln!(out, "{prefix}_workers{{lifecycle=\"{s}\"}} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP {prefix}_kv_events_total Engine KV events by outcome"
        );
        let _ = writeln!(out, "# TYPE {prefix}_kv_events_total counter");
        for (s, v) in [
            ("applied", g(&m.events_applied)),
            ("rejected", g(&m.events_rejected)),
            ("skipped_tier", g(&m.events_skipped_tier)),
        ] {
            let _ = writeln!(out, "{prefix}_kv_events_total{{outcome=\"{s}\"}} {v}");
        }
        for (name, help, kind, v) in [
            (
                "malformed_frames_total",
                "ZMQ messages that did not decode (skipped)",
                "counter",
                g(&m.malformed_frames),
            ),
            (
                "sequence_gaps_total",
                "Jumps in an engine's message sequence",
                "counter",
                g(&m.sequence_gaps),
            ),
            (
                "sequence_gaps_repaired_total",
                "Sequence gaps whose lost messages were replayed from the engine's replay endpoint",
                "counter",
                g(&m.gaps_repaired),
            ),
            (
                "sequence_gaps_unrepaired_total",
                "Sequence gaps not (completely) replayed: no replay endpoint, or it failed or no longer held them",
                "counter",
                g(&m.gaps_unrepaired),
            ),
            (
                "replayed_messages_total",
                "Engine messages applied from replay answers",
                "counter",
                g(&m.replayed_messages),
            ),
            (
                "engine_restarts_total",
                "Engine sequence restarts seen",
                "counter",
                g(&m.engine_restarts),
            ),
            (
                "models",
                "Model + routing-group indexes",
                "gauge",
                models as u64,
            ),
            (
                "selections_total",
                "Successful selections",
                "counter",
                g(&self.counters.selections),
            ),
            (
                "reservations_total",
                "Bookings made",
                "counter",
                g(&self.counters.reservations),
            ),
            (
                "reservations_active",
                "Bookings not yet freed",
                "gauge",
                reservations as u64,
            ),
            (
                "errors_total",
                "Failed selection-service calls",
                "counter",
                g(&self.counters.errors),
            ),
            (
                "pending_selections",
                "Cached selections awaiting a reservation",
                "gauge",
                cached as u64,
            ),
            (
                "pending_selection_bytes",
                "Estimated bytes of cached selections",
                "gauge",
                cache_bytes as u64,
            ),
            (
                "pending_selection_evictions_total",
                "Cached selections dropped (TTL, entries, bytes)",
                "counter",
                evicted,
            ),
        ] {
            let _ = writeln!(out, "# HELP {prefix}_{name} {help}");
            let _ = writeln!(out, "# TYPE {prefix}_{name} {kind}");
            let _ = writeln!(out, "{prefix}_{name} {v}");
        }
        out
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
