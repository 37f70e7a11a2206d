//! The standalone KV indexer's HTTP API (`run_kv_indexer`, port 8090): workers register
//! their engines' ZMQ KV-event endpoints and callers ask which worker rank holds how much
//! of a prompt. It is the selection service's catalog and index without the scheduler's
//! answers; routes and bodies follow the reference:
//!
//! | route | body | answer |
//! |---|---|---|
//! | `GET /health`, `GET /metrics` | | ok / Prometheus text |
//! | `GET /workers` | | listeners per worker |
//! | `POST /register` | `{instance_id, endpoint, model_name, block_size?, routing_group?, dp_rank?, replay_endpoint?}` | 201 / 409 |
//! | `POST /unregister` | `{instance_id, model_name, routing_group?}` | ok / 404 |
//! | `POST /query` | `{token_ids, model_name, routing_group?, lora_name?}` | scores |
//! | `POST /query_by_hash` | `{block_hashes, model_name, routing_group?}` | scores |
//! | `GET /dump` | | index events per `model:group` |
//!
//! Scores are in tokens (matched blocks x block size), keyed by worker id then dp rank.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::Response;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::catalog::WorkerRequest;
use super::http::{
    HttpState, body, error_response, http_metrics_text, json, not_found, observe, ok, ok_with,
    prometheus_response, prompt_body,
};
use super::requests::{Hash64, PromptRequest, WithTokenIds};

/// Give an index-only registration what the catalog needs to index it: the KV-event
/// endpoint stands in for the request endpoint (the indexer never routes), and the ranks
/// span the registered endpoints.
pub fn complete_for_indexing(w: &mut WorkerRequest) {
    if let Some(m) = &w.kv_events_endpoints
        && let (Some(lo), Some(hi)) = (m.keys().next().copied(), m.keys().last().copied())
    {
        w.data_parallel_start_rank = Some(lo);
        w.data_parallel_size = Some(hi - lo + 1);
        if w.endpoint.is_none() {
            w.endpoint = m.values().next().cloned();
        }
    }
}

#[derive(Debug, Deserialize)]
struct Register {
    instance_id: u64,
    endpoint: String,
    model_name: String,
    #[serde(default)]
    block_size: Option<u32>,
    #[serde(default)]
    routing_group: Option<String>,
    #[serde(default)]
    dp_rank: Option<u32>,
    #[serde(default)]
    replay_endpoint: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Unregister {
    instance_id: u64,
    model_name: String,
    #[serde(default)]
    routing_group: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Query {
    token_ids: Vec<u32>,
    model_name: String,
    #[serde(default)]
    routing_group: Option<String>,
    #[serde(default)]
    lora_name: Option<String>,
}

impl WithTokenIds for Query {
    fn set_token_ids(&mut self, token_ids: Vec<u32>) {
        self.token_ids = token_ids;
    }
}

#[derive(Debug, Deserialize)]
struct QueryByHash {
    block_hashes: Vec<Hash64>,
    model_name: String,
    #[serde(default)]
    routing_group: Option<String>,
}

#[derive(Debug, Serialize)]
struct Instance {
    longest_matched: u32,
    gpu: u32,
    dp: BTreeMap<String, u32>,
    cpu: u32,
    disk: u32,
}

#[derive(Debug, Serialize)]
struct Scores {
    scores: BTreeMap<String, BTreeMap<String, u32>>,
    frequencies: Vec<u64>,
    instances: BTreeMap<String, Instance>,
}

#[derive(Debug, Serialize)]
struct Listener {
    endpoint: String,
    status: &'static str,
}

#[derive(Debug, Serialize)]
struct WorkerView {
    instance_id: u64,
    source: &'static str,
    status: &'static str,
    model_name: String,
    routing_group: String,
    block_size: Option<u32>,
    endpoints: BTreeMap<String, String>,
    listeners: BTreeMap<String, Listener>,
}

type St = State<Arc<HttpState>>;

async fn register(State(s): St, bytes: Bytes) -> Response {
    let r: Register = match body(&bytes) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let rank = r.dp_rank.unwrap_or(0);
    let mut w = s
        .svc
        .registration(r.instance_id)
        .unwrap_or_else(|| WorkerRequest {
            worker_id: r.instance_id,
            model_name: Some(r.model_name.clone()),
            routing_group: r.routing_group.clone(),
            block_size: r.block_size,
            replay_endpoint: r.replay_endpoint.clone(),
            kv_events_endpoints: Some(BTreeMap::new()),
            ..Default::default()
        });
    let map = w.kv_events_endpoints.get_or_insert_with(BTreeMap::new);
    if map.contains_key(&rank) {
        return error_response(
            StatusCode::CONFLICT,
            &format!(
                "instance {} dp_rank {rank} already registered",
                r.instance_id
            ),
        );
    }
    map.insert(rank, r.endpoint);
    if w.block_size.is_none() {
        w.block_size = r.block_size;
    }
    complete_for_indexing(&mut w);
    match s.svc.upsert_worker_settled(w).await {
        Ok(_) => ok_with(StatusCode::CREATED),
        Err(e) => error_response(
            StatusCode::from_u16(e.kind.status_code()).unwrap_or(StatusCode::BAD_REQUEST),
            &e.message,
        ),
    }
}

async fn unregister(State(s): St, bytes: Bytes) -> Response {
    let r: Unregister = match body(&bytes) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let group = r
        .routing_group
        .as_deref()
        .unwrap_or(super::catalog::DEFAULT_GROUP);
    let known = s
        .svc
        .registration(r.instance_id)
        .is_some_and(|w| w.model() == r.model_name && w.group() == group);
    if !known || s.svc.delete_worker(r.instance_id).is_err() {
        return error_response(
            StatusCode::NOT_FOUND,
            &format!("instance {} not found", r.instance_id),
        );
    }
    ok()
}

fn scores(s: &HttpState, req: &PromptRequest) -> Response {
    match s.svc.index_matches(req) {
        Err(e) => error_response(StatusCode::BAD_REQUEST, &e.message),
        Ok(found) => {
            let mut out = Scores {
                scores: BTreeMap::new(),
                frequencies: Vec::new(),
                instances: BTreeMap::new(),
            };
            if let Some((bs, matches)) = found {
                for (w, blocks) in matches {
                    let tokens = blocks * bs;
                    out.scores
                        .entry(w.worker_id.to_string())
                        .or_default()
                        .insert(w.dp_rank.to_string(), tokens);
                }
                for (id, ranks) in &out.scores {
                    let best = ranks.values().copied().max().unwrap_or(0);
                    out.instances.insert(
                        id.clone(),
                        Instance {
                            longest_matched: best,
                            gpu: best,
                            dp: ranks.clone(),
                            cpu: best,
                            disk: best,
                        },
                    );
                }
            }
            json(StatusCode::OK, &out)
        }
    }
}

async fn query(State(s): St, bytes: Bytes) -> Response {
    match prompt_body::<Query>(&bytes) {
        Ok(q) => scores(
            &s,
            &PromptRequest {
                model_name: Some(q.model_name),
                routing_group: q.routing_group,
                token_ids: Some(q.token_ids),
                lora_name: q.lora_name,
                ..Default::default()
            },
        ),
        Err(r) => r,
    }
}

async fn query_by_hash(State(s): St, bytes: Bytes) -> Response {
    match body::<QueryByHash>(&bytes) {
        Ok(q) => scores(
            &s,
            &PromptRequest {
                model_name: Some(q.model_name),
                routing_group: q.routing_group,
                block_hashes: Some(q.block_hashes),
                ..Default::default()
            },
        ),
        Err(r) => r,
    }
}

async fn workers(State(s): St) -> Response {
    let views: Vec<WorkerView> = s
        .svc
        .listener_views()
        .into_iter()
        .map(|v| {
            let status = if v.listeners.values().all(|(_, st)| *st == "active") {
                "active"
            } else if v.listeners.values().any(|(_, st)| *st == "failed") {
                "failed"
            } else {
                "pending"
            };
            WorkerView {
                instance_id: v.worker.worker_id,
                source: "zmq",
                status,
                model_name: v.worker.model().to_owned(),
                routing_group: v.worker.group().to_owned(),
                block_size: v.worker.block_size,
                endpoints: v
                    .worker
                    .rank_endpoints()
                    .into_iter()
                    .map(|(r, e)| (r.to_string(), e))
                    .collect(),
                listeners: v
                    .listeners
                    .into_iter()
                    .map(|(r, (endpoint, status))| (r.to_string(), Listener { endpoint, status }))
                    .collect(),
            }
        })
        .collect();
    json(StatusCode::OK, &views)
}

async fn dump(State(s): St) -> Response {
    json(StatusCode::OK, &s.svc.dump())
}

async fn health() -> Response {
    ok()
}

async fn metrics(State(s): St) -> Response {
    let mut text = s.svc.metrics_text(&s.prefix);
    text.push_str(&http_metrics_text(&s));
    prometheus_response(text)
}

/// The indexer's routes.
pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/workers", get(workers))
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/dump", get(dump))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}
