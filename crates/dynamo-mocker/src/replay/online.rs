//! `replay_mode="online"`: the trace replayed in wall-clock time through live mocker workers
//! served on the request plane, behind our router.
//!
//! Each worker is its own [`DistributedRuntime`] (`mem` discovery, TCP request plane) in this
//! process, serving this project's mocker ([`MockEngineRunner`] behind a
//! [`TokenEngineHandler`]) on one endpoint and publishing its KV events and load. A router
//! runtime sends each request as the frontend would (a [`PreprocessedRequest`] with
//! `max_tokens` = the trace's output length and `ignore_eos`): through [`KvRouter::generate`]
//! for `kv_router`, or a round-robin [`Route`] for `round_robin`. Prompts are the offline
//! replay's (the same trace build, the same hash-id token expansion); arrivals follow the
//! (sped-up) timestamps or a closed loop of `replay_concurrency`.
//!
//! Timing is therefore our live mocker's (`crate`), not the `aisimulate-core`
//! engines of the offline replay, plus the runtime's real transport and scheduling delays.
//! The measured times are fed to `aisimulate-core`'s report collector, so the summary has the
//! offline keys.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aisimulate_core::replay::{ReplayTerminalStatus, TraceCollector};
use bytes::Bytes;
use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_llm::engines::Annotated;
use dynamo_llm::engines::TokenEngineHandler;
use dynamo_llm::kv_routing::{KvEventPublisher, KvRouter, RouteOptions, WorkerMetricsPublisher};
use dynamo_llm::preprocessor::{LLMEngineOutput, PreprocessedRequest};
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::transport::codec;
use dynamo_runtime::{Client, Context, DistributedRuntime, EndpointId, Route, RuntimeConfig};
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::{
    ReplayError, ReplayOptions, ReplayOutput, RouterMode, Workload, bad, build_trace,
    check_arrival_process, validate, write_jsonl,
};
use crate::args::MockEngineArgs;
use crate::runner::{EventSink, MockEngineRunner};
use crate::token_engine::MockTokenEngine;

/// How long workers get to appear in discovery (and routers to subscribe to their events).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

fn sim(msg: impl std::fmt::Display) -> ReplayError {
    ReplayError::Simulation(msg.to_string())
}

/// The live mocker's arguments from the same `extra_engine_args` mapping the offline replay
/// takes (the reference's `{"engine": {...}}` form or flat `MockEngineArgs` keys).
fn mocker_args(engine_args: &Value) -> Result<MockEngineArgs, ReplayError> {
    match engine_args {
        Value::Null => Ok(MockEngineArgs::default()),
        Value::Object(_) => MockEngineArgs::from_json(&engine_args.to_string())
            .map_err(|e| bad(format!("invalid engine args for online replay: {e}"))),
        other => Err(bad(format!(
            "extra_engine_args must be a mapping, got {other}"
        ))),
    }
}

/// One request of the trace: its prompt and its place in a session.
struct Turn {
    tokens: Arc<Vec<u32>>,
    output_length: usize,
    /// Wait after the previous turn of the session completed (0 for the first).
    delay_ms: f64,
}

struct Session {
    /// Arrival of the first turn (ms after the start; already divided by the speed-up).
    start_ms: f64,
    turns: Vec<Turn>,
}

/// How requests reach the workers.
#[derive(Clone)]
enum Sender {
    Kv(Arc<KvRouter>),
    RoundRobin(Client),
}

/// What every request task shares.
struct Shared {
    sender: Sender,
    collector: Mutex<TraceCollector>,
    started: Instant,
    /// Worker instance id -> index in the report.
    worker_index: Vec<u64>,
    /// Completed requests so far (the caller's progress bar).
    progress: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl Shared {
    fn now_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    fn collect(&self, f: impl FnOnce(&mut TraceCollector)) {
        let mut c = self
            .collector
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut c);
    }

    /// Send one request and record its arrival, tokens and end.
    async fn request(&self, turn: &Turn) {
        let uuid = Uuid::new_v4();
        let arrival = self.now_ms();
        self.collect(|c| c.on_arrival(uuid, arrival, turn.tokens.len(), turn.output_length));
        let status = match self.stream(uuid, turn).await {
            Ok(()) => ReplayTerminalStatus::Completed,
            Err(_) => ReplayTerminalStatus::Failed,
        };
        let end = self.now_ms();
        self.collect(|c| c.on_terminal(uuid, end, status));
        if let Some(p) = &self.progress
            && status == ReplayTerminalStatus::Completed
        {
            p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    async fn stream(&self, uuid: Uuid, turn: &Turn) -> Result<(), String> {
        let request: PreprocessedRequest = serde_json::from_value(serde_json::json!({
            "model": "replay",
            "token_ids": *turn.tokens,
            "stop_conditions": {
                "max_tokens": turn.output_length,
                "ignore_eos": true,
            },
        }))
        .map_err(|e| e.to_string())?;
        let body = Bytes::from(codec::encode(&request).map_err(|e| e.to_string())?);
        let ctx = Context::default();
        let mut first = true;
        let mut on_item = |bytes: &[u8]| -> Result<bool, String> {
            let t = self.now_ms();
            let item: Annotated<LLMEngineOutput> =
                codec::decode(bytes).map_err(|e| e.to_string())?;
            if item.event.as_deref() == Some("error") {
                return Err(item.comment.unwrap_or_default().join("; "));
            }
            let Some(out) = item.data else {
                return Ok(false);
            };
            self.collect(|c| {
                if first && !out.token_ids.is_empty() {
                    // The mocker reports the prompt tokens it served from its prefix cache
                    // with the first token (`prompt_tokens_details.cached_tokens`).
                    let cached = out
                        .completion_usage
                        .as_ref()
                        .and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    c.on_admit(uuid, t, usize::try_from(cached).unwrap_or(0));
                    first = false;
                }
                for _ in &out.token_ids {
                    c.on_token(uuid, t);
                }
            });
            Ok(out.finish_reason.is_some())
        };
        match &self.sender {
            Sender::Kv(router) => {
                let mut s = router
                    .generate(&turn.tokens, body, RouteOptions::default(), ctx)
                    .await
                    .map_err(|e| e.to_string())?;
                let worker = s.selection().worker.worker_id;
                if let Some(idx) = self.worker_index.iter().position(|w| *w == worker) {
                    self.collect(|c| c.on_decode_assigned(uuid, idx));
                }
                while let Some(item) = s.next().await {
                    if on_item(&item.map_err(|e| e.to_string())?)? {
                        break;
                    }
                }
            }
            Sender::RoundRobin(client) => {
                let mut s = client
                    .generate(body, Route::RoundRobin, ctx, None)
                    .await
                    .map_err(|e| e.to_string())?;
                while let Some(item) = s.next().await {
                    if on_item(&item.map_err(|e| e.to_string())?)? {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) -> Result<(), ReplayError> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while !ok() {
        if Instant::now() >= deadline {
            return Err(sim(format!(
                "online replay: {what} within {STARTUP_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn runtime() -> Result<DistributedRuntime, ReplayError> {
    DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Tcp,
        RuntimeConfig::default(),
    )
    .map_err(|e| sim(format!("online replay: cannot start a runtime: {e}")))
}

/// The sessions of the workload, prompts expanded as the offline replay does.
fn sessions(
    workload: &Workload,
    block_size: usize,
    speedup: f64,
) -> Result<Vec<Session>, ReplayError> {
    let trace = build_trace(workload, block_size, speedup)?;
    let mut out = Vec::with_capacity(trace.sessions.len());
    for s in &trace.sessions {
        let mut turns = Vec::with_capacity(s.turns.len());
        for t in &s.turns {
            let tokens = t
                .synthesize_tokens(trace.block_size)
                .map_err(|e| sim(format!("{e:#}")))?;
            turns.push(Turn {
                tokens: Arc::new(tokens),
                output_length: t.max_output_tokens.max(1),
                delay_ms: t.delay_after_previous_ms.max(0.0),
            });
        }
        out.push(Session {
            start_ms: s.first_arrival_timestamp_ms.unwrap_or(0.0).max(0.0),
            turns,
        });
    }
    // Open-loop arrivals are launched in order of their start.
    out.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    Ok(out)
}

async fn run_session(shared: Arc<Shared>, session: Arc<Session>) {
    for (i, turn) in session.turns.iter().enumerate() {
        if i > 0 && turn.delay_ms > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(turn.delay_ms / 1000.0)).await;
        }
        shared.request(turn).await;
    }
}

/// Start the workers and the router, replay, and tear everything down.
async fn replay(
    opts: &ReplayOptions,
    args: MockEngineArgs,
    sessions: Vec<Session>,
) -> Result<TraceCollector, ReplayError> {
    let ns = format!("replay{}", Uuid::new_v4().simple());
    let ep = EndpointId::new(&ns, "mocker", "generate").map_err(sim)?;
    let n = opts.num_workers;
    let block = u32::try_from(args.block_size).map_err(|_| bad("block_size is too large"))?;
    let workers: Vec<DistributedRuntime> = (0..n).map(|_| runtime()).collect::<Result<_, _>>()?;
    let router_rt = runtime()?;
    let mut all = workers.clone();
    all.push(router_rt.clone());
    let result = async {
        // The router subscribes to KV events first, so no worker's first blocks are lost.
        let kv = match opts.router_mode {
            RouterMode::KvRouter => Some(
                KvRouter::new(
                    &router_rt,
                    &ep,
                    block,
                    opts.router_config.clone(),
                    LoadThresholds::default(),
                )
                .map_err(sim)?,
            ),
            RouterMode::RoundRobin => None,
        };
        let mut keep = Vec::new();
        for w in &workers {
            let events: EventSink = if kv.is_some() {
                let publisher = Arc::new(
                    KvEventPublisher::new_raw(
                        w,
                        &ep,
                        WorkerWithDpRank::new(w.connection_id(), 0),
                        true,
                    )
                    .map_err(sim)?,
                );
                until(
                    "the router did not subscribe to a worker's KV events",
                    || publisher.subscriber_count() >= 1,
                )
                .await?;
                let sink = publisher.event_sink();
                keep.push(Box::new(publisher) as Box<dyn Send>);
                sink
            } else {
                Box::new(|_| {})
            };
            let runner = MockEngineRunner::spawn(args.clone(), events)
                .map_err(|e| bad(format!("invalid engine args for online replay: {e}")))?;
            if kv.is_some() {
                let metrics =
                    WorkerMetricsPublisher::new(w, &ep, w.connection_id()).map_err(sim)?;
                crate::publish::follow_load(&metrics, 0, runner.watch_metrics());
                keep.push(Box::new(metrics) as Box<dyn Send>);
            }
            let handler = Arc::new(TokenEngineHandler::new(Arc::new(MockTokenEngine::new(
                runner,
                args.vocab_size,
            ))));
            let (w, ep) = (w.clone(), ep.clone());
            tokio::spawn(async move { w.serve_endpoint(&ep, handler, false).await });
        }
        let sender = match &kv {
            Some(router) => {
                until("the workers did not reach the router", || {
                    router.core().workers().len() == n
                })
                .await?;
                Sender::Kv(Arc::clone(router))
            }
            None => {
                let client = router_rt.client(&ep);
                until("the workers did not appear in discovery", || {
                    client.instance_ids().len() == n
                })
                .await?;
                Sender::RoundRobin(client)
            }
        };
        let mut collector = TraceCollector::default();
        collector
            .set_capture_per_request(opts.capture_per_request || opts.report_jsonl_path.is_some());
        collector.set_sla_thresholds(opts.sla);
        collector.set_static_worker_count(0, n);
        collector.set_gpus_per_worker(0, 1);
        let shared = Arc::new(Shared {
            sender,
            collector: Mutex::new(collector),
            started: Instant::now(),
            worker_index: workers
                .iter()
                .map(DistributedRuntime::connection_id)
                .collect(),
            progress: opts.progress.clone(),
        });
        let deadline = opts
            .max_sim_time_ms
            .map(|ms| shared.started + Duration::from_secs_f64(ms / 1000.0));
        let mut tasks = JoinSet::new();
        let drive = async {
            match opts.replay_concurrency {
                Some(limit) => {
                    // Closed loop: at most `limit` sessions in flight, timestamps ignored.
                    let slots = Arc::new(Semaphore::new(limit));
                    for s in sessions {
                        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                            break;
                        };
                        let shared = Arc::clone(&shared);
                        tasks.spawn(async move {
                            run_session(shared, Arc::new(s)).await;
                            drop(permit);
                        });
                    }
                }
                None => {
                    for s in sessions {
                        let at = shared.started + Duration::from_secs_f64(s.start_ms / 1000.0);
                        tokio::time::sleep_until(at.into()).await;
                        tasks.spawn(run_session(Arc::clone(&shared), Arc::new(s)));
                    }
                }
            }
            while tasks.join_next().await.is_some() {}
        };
        match deadline {
            Some(d) => {
                let _ = tokio::time::timeout_at(d.into(), drive).await;
            }
            None => drive.await,
        }
        // Past the cut-off: what is still running is abandoned (no terminal record).
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        if let Some(router) = &kv {
            router.shutdown();
        }
        drop(keep);
        let shared = Arc::into_inner(shared)
            .ok_or_else(|| sim("online replay: a request task outlived the replay"))?;
        Ok(shared
            .collector
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
    .await;
    for rt in &all {
        rt.shutdown();
    }
    result
}

/// Online replay: wall-clock time through live mocker workers and our router.
///
/// # Errors
/// As [`super::run_offline`]; [`ReplayError::Simulation`] when the workers or the router
/// cannot start.
pub fn run_online(opts: &ReplayOptions, workload: &Workload) -> Result<ReplayOutput, ReplayError> {
    validate(opts)?;
    check_arrival_process(opts, workload)?;
    let args = mocker_args(&opts.engine_args)?;
    if args.block_size == 0 {
        return Err(bad("block_size must be positive"));
    }
    let sessions = sessions(workload, args.block_size, opts.arrival_speedup_ratio)?;
    let wall = Instant::now();
    let rt = dynamo_runtime::tokio_runtime().map_err(sim)?;
    let collector = rt.block_on(replay(opts, args, sessions))?;
    let capture = opts.capture_per_request || opts.report_jsonl_path.is_some();
    let records: Vec<Value> = if capture {
        collector
            .per_request_records()
            .iter()
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            .collect()
    } else {
        Vec::new()
    };
    let report = collector.finish();
    let mut summary: Map<String, Value> = match serde_json::to_value(&report) {
        Ok(Value::Object(m)) => m,
        Ok(_) | Err(_) => return Err(sim("unserializable report")),
    };
    summary.insert(
        "wall_time_ms".into(),
        Value::from(wall.elapsed().as_secs_f64() * 1000.0),
    );
    summary.insert("replay_mode".into(), Value::from("online"));
    if let Some(path) = &opts.report_jsonl_path {
        write_jsonl(path, &records)?;
    }
    Ok(ReplayOutput {
        summary,
        per_request: opts.capture_per_request.then_some(records),
        timeline: Vec::new(),
    })
}
