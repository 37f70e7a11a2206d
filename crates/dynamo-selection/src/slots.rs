//! The standalone slot tracker (`run_slot_tracker`, port 8091): active-load bookkeeping
//! only, for callers that pick workers themselves. Workers are registered with their
//! block size and data-parallel ranks; requests are added on a chosen rank, marked
//! prefill-complete and freed; `potential_loads` answers what each rank's load would be
//! with a new request. One `dynamo_kv_router` scheduler per (model, routing group).
//! With `--replica-sync-port` / `--replica-sync-peers` the bookings are shared with peer
//! trackers (see `super::replica`): peers' requests count in `/loads` and
//! `/potential_loads`.
//!
//! | route | body |
//! |---|---|
//! | `POST /register` | `{worker_id, model_name, routing_group?, block_size, dp_start, dp_size}` |
//! | `POST /unregister` | `{worker_id, model_name, routing_group?}` |
//! | `GET /workers`, `GET /loads` | |
//! | `POST /add` | `{model_name, routing_group?, request_id, worker_id, dp_rank, sequence_hashes?, isl_tokens?, overlap_blocks?}` |
//! | `POST /prefill_complete`, `POST /free` | `{model_name, routing_group?, request_id}` |
//! | `POST /potential_loads` | `{model_name, routing_group?, sequence_hashes, isl_tokens?}` |

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use dynamo_kv_router::hashing::SequenceHash;
use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::{LoadThresholds, TierOverlap, WorkerCapacity};
use dynamo_kv_router::scheduling::{Scheduler, SchedulingRequest};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::catalog::DEFAULT_GROUP;
use super::group::lock;
use super::http::{body, error_response, json, not_found, ok, ok_with, prometheus_response};
use super::prom::{Kind, PromText};
use super::replica::{ReplicaHub, SyncTarget};
use super::requests::{Hash64, LoadEntry};

type Key = (String, String);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Registration {
    worker_id: u64,
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    block_size: u32,
    dp_start: u32,
    dp_size: u32,
}

fn default_group() -> String {
    DEFAULT_GROUP.to_owned()
}

struct Tracked {
    scheduler: Scheduler,
}

impl SyncTarget for Tracked {
    fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
}

/// The tracker's state.
#[derive(Default)]
pub struct SlotTracker {
    groups: Mutex<BTreeMap<Key, Arc<Tracked>>>,
    registrations: Mutex<BTreeMap<Key, BTreeMap<u64, Registration>>>,
    replica: Option<Arc<ReplicaHub>>,
}

#[derive(Debug, Deserialize)]
struct Unregister {
    worker_id: u64,
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
}

#[derive(Debug, Deserialize)]
struct Add {
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    request_id: String,
    worker_id: u64,
    dp_rank: u32,
    #[serde(default)]
    sequence_hashes: Vec<Hash64>,
    #[serde(default)]
    isl_tokens: usize,
    #[serde(default)]
    overlap_blocks: u32,
}

#[derive(Debug, Deserialize)]
struct RequestRef {
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    request_id: String,
}

#[derive(Debug, Deserialize)]
struct Potential {
    model_name: String,
    #[serde(default = "default_group")]
    routing_group: String,
    sequence_hashes: Vec<Hash64>,
    #[serde(default)]
    isl_tokens: usize,
}

#[derive(Debug, Serialize)]
struct FlatLoad {
    model_name: String,
    routing_group: String,
    worker_id: u64,
    dp_rank: u32,
    active_prefill_tokens: u64,
    active_decode_blocks: u64,
}

type St = State<Arc<SlotTracker>>;

impl SlotTracker {
    /// A tracker that shares its bookings through `hub` (replica sync).
    pub fn with_replica(hub: Arc<ReplicaHub>) -> Self {
        Self {
            replica: Some(hub),
            ..Self::default()
        }
    }

    fn group(&self, key: &Key) -> Option<Arc<Tracked>> {
        lock(&self.groups).get(key).cloned()
    }

    /// Rebuild-free upsert: the group's scheduler is created with the first worker's block
    /// size; a worker with another block size is refused.
    fn register(&self, r: Registration) -> Result<(), (StatusCode, String)> {
        if r.block_size == 0 || r.dp_size == 0 {
            return Err((
                StatusCode::BAD_REQUEST,
                "block_size and dp_size must be greater than 0".to_owned(),
            ));
        }
        let key = (r.model_name.clone(), r.routing_group.clone());
        let mut groups = lock(&self.groups);
        let g = if let Some(g) = groups.get(&key) {
            g.clone()
        } else {
            let scheduler = Scheduler::new(
                r.block_size,
                KvRouterConfig::default(),
                LoadThresholds::default(),
            )
            .map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
            let g = Arc::new(Tracked { scheduler });
            groups.insert(key.clone(), g.clone());
            g
        };
        if g.scheduler.block_size() != r.block_size {
            return Err((
                StatusCode::CONFLICT,
                format!(
                    "block_size {} differs from block_size {} of model={} routing_group={}",
                    r.block_size,
                    g.scheduler.block_size(),
                    key.0,
                    key.1
                ),
            ));
        }
        for rank in r.dp_start..r.dp_start.saturating_add(r.dp_size) {
            g.scheduler.upsert_worker(
                WorkerWithDpRank::new(r.worker_id, rank),
                BTreeSet::new(),
                WorkerCapacity::default(),
            );
        }
        // Under the groups lock: no request is booked on a new scheduler before it is
        // shared; for a known group, peers' bookings waiting for these ranks apply now.
        if let Some(hub) = &self.replica {
            hub.attach(&key, g.clone());
        }
        lock(&self.registrations)
            .entry(key)
            .or_default()
            .insert(r.worker_id, r);
        Ok(())
    }
}

async fn register(State(t): St, bytes: Bytes) -> Response {
    match body::<Registration>(&bytes) {
        Ok(r) => match t.register(r) {
            Ok(()) => ok_with(StatusCode::CREATED),
            Err((s, m)) => error_response(s, &m),
        },
        Err(r) => r,
    }
}

async fn unregister(State(t): St, bytes: Bytes) -> Response {
    let r: Unregister = match body(&bytes) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let key = (r.model_name.clone(), r.routing_group.clone());
    let removed = lock(&t.registrations)
        .get_mut(&key)
        .and_then(|m| m.remove(&r.worker_id));
    match (removed, t.group(&key)) {
        (Some(_), Some(g)) => {
            g.scheduler.remove_worker(r.worker_id);
            ok()
        }
        _ => error_response(
            StatusCode::NOT_FOUND,
            &format!(
                "worker {} not found for model={} routing_group={}",
                r.worker_id, r.model_name, r.routing_group
            ),
        ),
    }
}

async fn workers(State(t): St) -> Response {
    let all: Vec<Registration> = lock(&t.registrations)
        .values()
        .flat_map(|m| m.values().cloned())
        .collect();
    json(StatusCode::OK, &all)
}

async fn loads(State(t): St) -> Response {
    let groups: Vec<(Key, Arc<Tracked>)> = lock(&t.groups)
        .iter()
        .map(|(k, g)| (k.clone(), g.clone()))
        .collect();
    let mut out = Vec::new();
    for (k, g) in groups {
        for l in g.scheduler.potential_loads(&SchedulingRequest::default()) {
            out.push(FlatLoad {
                model_name: k.0.clone(),
                routing_group: k.1.clone(),
                worker_id: l.worker.worker_id,
                dp_rank: l.worker.dp_rank,
                active_prefill_tokens: l.potential_prefill_tokens,
                active_decode_blocks: l.potential_decode_blocks,
            });
        }
    }
    json(StatusCode::OK, &out)
}

fn missing_group(model: &str, group: &str) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        &format!("no workers registered for model={model} routing_group={group}"),
    )
}

async fn add(State(t): St, bytes: Bytes) -> Response {
    let a: Add = match body(&bytes) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let Some(g) = t.group(&(a.model_name.clone(), a.routing_group.clone())) else {
        return missing_group(&a.model_name, &a.routing_group);
    };
    let worker = WorkerWithDpRank::new(a.worker_id, a.dp_rank);
    let seq: Vec<SequenceHash> = a
        .sequence_hashes
        .iter()
        .map(|h| SequenceHash(h.0))
        .collect();
    let mut overlaps = FxHashMap::default();
    overlaps.insert(
        worker,
        TierOverlap {
            device: a.overlap_blocks,
            ..Default::default()
        },
    );
    match g.scheduler.select(&SchedulingRequest {
        request_id: Some(&a.request_id),
        isl_tokens: a.isl_tokens,
        seq_hashes: &seq,
        overlaps: Some(&overlaps),
        pinned: Some(worker),
        ..Default::default()
    }) {
        Ok(_) => ok(),
        Err(e) => {
            let err = super::error::SelectionError::from_router(e, &a.model_name, &a.routing_group);
            error_response(
                StatusCode::from_u16(err.kind.status_code()).unwrap_or(StatusCode::BAD_REQUEST),
                &err.message,
            )
        }
    }
}

async fn prefill_complete(State(t): St, bytes: Bytes) -> Response {
    let r: RequestRef = match body(&bytes) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match t.group(&(r.model_name.clone(), r.routing_group.clone())) {
        Some(g) if g.scheduler.mark_prefill_completed(&r.request_id).is_ok() => ok(),
        _ => error_response(
            StatusCode::NOT_FOUND,
            &format!("Request {} not found", r.request_id),
        ),
    }
}

async fn free(State(t): St, bytes: Bytes) -> Response {
    let r: RequestRef = match body(&bytes) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    // Freeing an unknown request is a no-op (as in the reference): frees are retried.
    if let Some(g) = t.group(&(r.model_name.clone(), r.routing_group.clone())) {
        let _ = g.scheduler.free(&r.request_id);
    }
    ok()
}

async fn potential_loads(State(t): St, bytes: Bytes) -> Response {
    let p: Potential = match body(&bytes) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Some(g) = t.group(&(p.model_name.clone(), p.routing_group.clone())) else {
        return json(StatusCode::OK, &Vec::<LoadEntry>::new());
    };
    let seq: Vec<SequenceHash> = p
        .sequence_hashes
        .iter()
        .map(|h| SequenceHash(h.0))
        .collect();
    let loads: Vec<LoadEntry> = g
        .scheduler
        .potential_loads(&SchedulingRequest {
            isl_tokens: p.isl_tokens,
            seq_hashes: &seq,
            ..Default::default()
        })
        .into_iter()
        .map(|l| LoadEntry {
            worker_id: l.worker.worker_id,
            dp_rank: l.worker.dp_rank,
            potential_prefill_tokens: l.potential_prefill_tokens,
            potential_decode_blocks: l.potential_decode_blocks,
            active_requests: l.active_requests,
        })
        .collect();
    json(StatusCode::OK, &loads)
}

async fn health() -> Response {
    ok()
}

async fn metrics(State(t): St) -> Response {
    let groups = lock(&t.groups).len();
    let workers: usize = lock(&t.registrations).values().map(BTreeMap::len).sum();
    let mut out = PromText::new();
    out.single(
        "dynamo_slot_tracker_models",
        Kind::Gauge,
        "Model + routing-group trackers",
        groups,
    )
    .single(
        "dynamo_slot_tracker_workers",
        Kind::Gauge,
        "Registered workers",
        workers,
    );
    if let Some(hub) = &t.replica {
        out.push_text(&hub.metrics_text("dynamo_slot_tracker"));
    }
    let text = out.finish();
    prometheus_response(text)
}

/// The slot tracker's routes.
pub fn router(state: Arc<SlotTracker>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/workers", get(workers))
        .route("/loads", get(loads))
        .route("/add", post(add))
        .route("/prefill_complete", post(prefill_complete))
        .route("/free", post(free))
        .route("/potential_loads", post(potential_loads))
        .fallback(not_found)
        .with_state(state)
}
