//! Trace replay: simulate a Mooncake trace (or a synthetic workload) on mocker engines behind
//! a router, in simulated time, and report TTFT/ITL/TPOT/E2E percentiles and prefix reuse.
//!
//! The engines, virtual clock and report are `aisimulate-core`, the simulation library the
//! reference's mocker and replay are built on, so the same `MockEngineArgs` and trace give the
//! reference's timing (see `docs/design/mocker_fidelity.md` for the decision and the figures). The
//! router is ours: round robin is the simulator's own policy, `kv_router` is
//! [`kv_placement::KvRouterPlacement`], the project's radix indexer and cost scheduler.
//!
//! Entry points: [`run_offline`] (simulated time) and [`online::run_online`] (wall-clock time
//! through the mocker engines and our router).
// The option/result fields mirror the reference's keyword arguments and summary keys,
// documented once in docs/design/replay.md rather than field by field.
#![allow(missing_docs)]

mod kv_placement;
pub mod online;
mod trace;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Goodput SLA bounds (`sla_ttft_ms`, `sla_itl_ms`, `sla_e2e_ms`).
pub use aisimulate_core::replay::SlaThresholds;
use aisimulate_core::replay::loadgen::{
    ArrivalSpec, DelaySpec, LengthSpec, MooncakeRow, SyntheticTraceSpec, Trace,
};
use aisimulate_core::replay::{
    ProviderSpec, ReplayAdapters, ReplayCaptureOptions, ReplayEngineFactory, ReplayRuntimeInput,
    ReplaySpec, ReplayTelemetryObserver, ReplayTelemetrySnapshot, ReplayTopology, Replayer,
    WorkerPoolSpec,
};
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::WorkerCapacity;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use kv_placement::{KvRouterComposition, KvRouterPlacement};

/// Errors of a replay. `InvalidTrace` and `InvalidArgument` are the caller's fault (Python
/// `ValueError`); `Io` is a missing/unreadable file; `Simulation` is the simulator refusing
/// a configuration or failing mid-run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{path}:{line}: {message}")]
    InvalidTrace {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("cannot read trace file {path}: {message}")]
    Io { path: String, message: String },
    #[error("replay failed: {0}")]
    Simulation(String),
}

fn bad(msg: impl Into<String>) -> ReplayError {
    ReplayError::InvalidArgument(msg.into())
}

/// Which router places requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterMode {
    #[default]
    RoundRobin,
    KvRouter,
}

impl std::str::FromStr for RouterMode {
    type Err = ReplayError;
    fn from_str(s: &str) -> Result<Self, ReplayError> {
        match s {
            "round_robin" | "round-robin" | "rr" => Ok(Self::RoundRobin),
            "kv_router" | "kv" | "kv-router" => Ok(Self::KvRouter),
            other => Err(bad(format!(
                "router_mode must be either 'round_robin' or 'kv_router', got '{other}'"
            ))),
        }
    }
}

/// Settings shared by trace and synthetic replays (the reference's keyword arguments).
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Engine arguments in the reference's mapping form (`{"engine": {...}, "dp_size": ...}`)
    /// or flat (`{"num_gpu_blocks": ..., "block_size": ...}`); `Value::Null` for defaults.
    pub engine_args: Value,
    pub router_config: KvRouterConfig,
    pub num_workers: usize,
    pub router_mode: RouterMode,
    pub arrival_speedup_ratio: f64,
    pub replay_concurrency: Option<usize>,
    pub max_sim_time_ms: Option<f64>,
    pub sla: SlaThresholds,
    pub capture_per_request: bool,
    /// Write one JSON object per request here (implies per-request capture).
    pub report_jsonl_path: Option<PathBuf>,
    /// Sample queue depth / active KV blocks every this many simulated ms (for plots).
    pub timeline_interval_ms: Option<f64>,
    /// Seed of the KV router's tie-breaking.
    pub seed: u64,
    /// Completed requests so far, updated at each timeline sample (for progress bars).
    pub progress: Option<Arc<AtomicU64>>,
    /// Offline KV routing: run our router on its own thread, pipelined with the simulator
    /// (identical decisions and report). Off by default: on a loaded 2-core machine the
    /// hand-offs cost more than the overlap saves (docs/benchmarks/replay.md).
    pub router_thread: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            engine_args: Value::Null,
            router_config: KvRouterConfig::default(),
            num_workers: 1,
            router_mode: RouterMode::RoundRobin,
            arrival_speedup_ratio: 1.0,
            replay_concurrency: None,
            max_sim_time_ms: None,
            sla: SlaThresholds::default(),
            capture_per_request: false,
            report_jsonl_path: None,
            timeline_interval_ms: None,
            seed: 42,
            progress: None,
            router_thread: false,
        }
    }
}

/// Where the requests come from.
#[derive(Debug, Clone)]
pub enum Workload {
    /// Mooncake JSONL files (`timestamp`, `input_length`, `output_length`, `hash_ids`).
    Mooncake {
        files: Vec<PathBuf>,
        /// Tokens per trace hash id; defaults to the engine block size.
        trace_block_size: Option<usize>,
    },
    /// Fixed-length requests at a fixed interval, a Poisson rate, or a closed loop.
    Synthetic(SyntheticWorkload),
}

#[derive(Debug, Clone)]
pub struct SyntheticWorkload {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub request_count: usize,
    pub request_rate: Option<f64>,
    pub arrival_interval_ms: Option<f64>,
    pub arrival_seed: u64,
    pub turns_per_session: usize,
    pub shared_prefix_ratio: f64,
    pub num_prefix_groups: usize,
    pub inter_turn_delay_ms: f64,
}

/// One timeline sample (simulated time), summed over workers.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineSample {
    pub t_ms: f64,
    /// Requests waiting in engine queues plus those the router holds.
    pub queue_depth: u64,
    pub running_requests: u64,
    pub active_kv_blocks: u64,
    pub completed_requests: u64,
}

/// Result of a replay.
#[derive(Debug, Clone)]
pub struct ReplayOutput {
    /// The reference's summary keys (`mean_ttft_ms`, `prefix_cache_reused_ratio`, ...).
    pub summary: Map<String, Value>,
    /// One record per request when capture was asked for.
    pub per_request: Option<Vec<Value>>,
    pub timeline: Vec<TimelineSample>,
}

/// The simulator's engine descriptor from the reference's `extra_engine_args` mapping.
///
/// The reference accepts `{"engine": {<engine config>}, "dp_size", "tensor_parallel_size",
/// "startup_time", "num_gpu_blocks_is_explicit", ...}`. A flat mapping of engine keys (our
/// `MockEngineArgs` names; `engine_type` for `backend`) is accepted too.
pub fn engine_descriptor(args: &Value) -> Result<(Value, Option<f64>), ReplayError> {
    const OUTER: &[&str] = &[
        "engine",
        "dp_size",
        "tensor_parallel_size",
        "startup_time",
        "num_gpu_blocks_is_explicit",
        "gpu_memory_utilization",
        "mem_fraction_static",
        "free_gpu_memory_fraction",
        "cuda_graph_reserved_bytes",
        "dynamo",
    ];
    let map = match args {
        Value::Null => Map::new(),
        Value::Object(m) => m.clone(),
        other => {
            return Err(bad(format!(
                "extra_engine_args must be a mapping, got {other}"
            )));
        }
    };
    let (mut engine, outer) = if map.contains_key("engine") {
        for k in map.keys() {
            if !OUTER.contains(&k.as_str()) {
                return Err(bad(format!(
                    "invalid engine launch config: unknown field `{k}`, expected one of {}",
                    OUTER.join(", ")
                )));
            }
        }
        let engine = match map.get("engine") {
            Some(Value::Object(e)) => e.clone(),
            Some(other) => {
                return Err(bad(format!(
                    "invalid engine launch config: engine must be a mapping, got {other}"
                )));
            }
            None => Map::new(),
        };
        (engine, map)
    } else {
        // Flat form: outer keys out, everything else is engine config.
        let mut engine = Map::new();
        let mut outer = Map::new();
        for (k, v) in map {
            if OUTER.contains(&k.as_str()) {
                outer.insert(k, v);
            } else if k == "engine_type" {
                engine.insert("backend".into(), v);
            } else if !v.is_null() {
                engine.insert(k, v);
            }
        }
        (engine, outer)
    };
    for k in [
        "gpu_memory_utilization",
        "mem_fraction_static",
        "free_gpu_memory_fraction",
    ] {
        if outer.get(k).is_some_and(|v| !v.is_null()) {
            return Err(bad(format!(
                "{k} needs the AIC perf model to size the KV cache, which this replay does not \
                 ship; set engine.num_gpu_blocks instead"
            )));
        }
    }
    // The simulator's engine defaults to vLLM-style; block size 0 means "unset" in
    // MockEngineArgs, so drop it rather than fail.
    if engine.get("block_size").and_then(Value::as_u64) == Some(0) {
        engine.remove("block_size");
    }
    let mut desc = Map::new();
    desc.insert("rank".into(), Value::Object(engine));
    for k in [
        "dp_size",
        "tensor_parallel_size",
        "num_gpu_blocks_is_explicit",
    ] {
        if let Some(v) = outer.get(k).filter(|v| !v.is_null()) {
            desc.insert(k.into(), v.clone());
        }
    }
    let startup = outer.get("startup_time").and_then(Value::as_f64);
    Ok((Value::Object(desc), startup))
}

/// The reference mapping form of our [`MockEngineArgs`](crate::args::MockEngineArgs), so a
/// `MockEngineArgs` object can be passed as `extra_engine_args` too.
pub fn engine_args_from_mocker(args: &crate::args::MockEngineArgs) -> Value {
    let mut engine = serde_json::json!({
        "backend": args.engine_type,
        "num_gpu_blocks": args.num_gpu_blocks,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_prefix_caching": args.enable_prefix_caching,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "speedup_ratio": args.speedup_ratio,
        "decode_speedup_ratio": args.decode_speedup_ratio,
        "preemption_mode": args.preemption_mode,
    });
    if args.block_size > 0 {
        engine["block_size"] = args.block_size.into();
    }
    if let Some(m) = args.max_model_len {
        engine["max_model_len"] = m.into();
    }
    serde_json::json!({
        "engine": engine,
        "dp_size": args.dp_size,
        "startup_time": args.startup_time,
    })
}

fn engine_block_size(desc: &Value) -> Result<usize, ReplayError> {
    let cfg: aisimulate_core::replay::ReplayEngineConfig = serde_json::from_value(desc.clone())
        .map_err(|e| bad(format!("invalid engine launch config: {e}")))?;
    Ok(cfg.rank.block_size)
}

struct TimelineObserver(Arc<Mutex<Vec<TimelineSample>>>, u64, Option<Arc<AtomicU64>>);

impl ReplayTelemetryObserver for TimelineObserver {
    fn on_sample(&mut self, s: ReplayTelemetrySnapshot) -> anyhow::Result<()> {
        let rows = s
            .decode_scheduler_metrics
            .iter()
            .chain(s.prefill_scheduler_metrics.iter());
        let (mut waiting, mut running, mut active) = (0u64, 0u64, 0u64);
        for r in rows {
            waiting += r.waiting_requests;
            running += r.running_requests;
            active += r.active_blocks;
        }
        self.1 += s.traffic.completed_requests as u64;
        if let Some(p) = &self.2 {
            p.store(self.1, Ordering::Relaxed);
        }
        if let Ok(mut v) = self.0.lock() {
            v.push(TimelineSample {
                t_ms: s.sampled_at_ms,
                queue_depth: waiting
                    + (s.router_pending_decode_requests + s.router_pending_prefill_requests) as u64,
                running_requests: running,
                active_kv_blocks: active,
                completed_requests: self.1,
            });
        }
        Ok(())
    }
}

fn validate(opts: &ReplayOptions) -> Result<(), ReplayError> {
    if opts.num_workers == 0 {
        return Err(bad("num_workers must be positive"));
    }
    if !opts.arrival_speedup_ratio.is_finite() || opts.arrival_speedup_ratio <= 0.0 {
        return Err(bad(format!(
            "arrival_speedup_ratio must be a finite positive number, got {}",
            opts.arrival_speedup_ratio
        )));
    }
    if opts.replay_concurrency == Some(0) {
        return Err(bad("replay_concurrency must be positive"));
    }
    if let Some(t) = opts.max_sim_time_ms
        && (!t.is_finite() || t < 0.0)
    {
        return Err(bad(format!("max_sim_time_ms must be >= 0, got {t}")));
    }
    for (name, v) in [
        ("sla_ttft_ms", opts.sla.ttft_ms),
        ("sla_itl_ms", opts.sla.itl_ms),
        ("sla_e2e_ms", opts.sla.e2e_ms),
    ] {
        if let Some(v) = v
            && (!v.is_finite() || v <= 0.0)
        {
            return Err(bad(format!("{name} must be a positive number, got {v}")));
        }
    }
    if let Some(t) = opts.timeline_interval_ms
        && (!t.is_finite() || t <= 0.0)
    {
        return Err(bad(format!("timeline interval must be positive, got {t}")));
    }
    opts.router_config
        .validate()
        .map_err(|e| bad(format!("invalid router_config: {e}")))?;
    Ok(())
}

/// A synthetic workload needs exactly one arrival process: a closed loop
/// (`replay_concurrency`), a Poisson rate (`request_rate`) or a fixed interval
/// (`arrival_interval_ms`).
fn check_arrival_process(opts: &ReplayOptions, workload: &Workload) -> Result<(), ReplayError> {
    if let Workload::Synthetic(s) = workload {
        let given = usize::from(opts.replay_concurrency.is_some())
            + usize::from(s.request_rate.is_some())
            + usize::from(s.arrival_interval_ms.is_some());
        if given != 1 {
            return Err(bad(
                "synthetic replay requires exactly one of replay_concurrency, request_rate, or \
                 arrival_interval_ms",
            ));
        }
    }
    Ok(())
}

/// Build the simulator's trace for a workload.
fn build_trace(
    workload: &Workload,
    engine_block: usize,
    speedup: f64,
) -> Result<Trace, ReplayError> {
    let sim = |e: anyhow::Error| ReplayError::Simulation(format!("{e:#}"));
    let trace = match workload {
        Workload::Mooncake {
            files,
            trace_block_size,
        } => {
            if files.is_empty() {
                return Err(bad("trace_files must name at least one file"));
            }
            let tbs = trace_block_size.unwrap_or(engine_block);
            if tbs == 0 {
                return Err(bad("trace_block_size must be positive"));
            }
            let mut rows: Vec<MooncakeRow> = Vec::new();
            for f in files {
                rows.extend(trace::load_mooncake(f, tbs)?);
            }
            // Several files merge by arrival time (each is already in order; the sort is
            // stable so equal timestamps keep file order).
            if files.len() > 1 {
                rows.sort_by(|a, b| {
                    a.timestamp
                        .unwrap_or(0.0)
                        .total_cmp(&b.timestamp.unwrap_or(0.0))
                });
            }
            Trace::from_mooncake_rows(rows, tbs).map_err(sim)?
        }
        Workload::Synthetic(s) => {
            if s.input_tokens == 0 || s.output_tokens == 0 || s.request_count == 0 {
                return Err(bad(
                    "input_tokens, output_tokens and request_count must be positive",
                ));
            }
            if s.turns_per_session == 0 {
                return Err(bad("turns_per_session must be positive"));
            }
            let arrivals = match (s.request_rate, s.arrival_interval_ms) {
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "pass at most one of request_rate and arrival_interval_ms",
                    ));
                }
                (Some(r), None) => {
                    if !r.is_finite() || r <= 0.0 {
                        return Err(bad(format!("request_rate must be positive, got {r}")));
                    }
                    ArrivalSpec::PoissonQps { qps: r }
                }
                (None, Some(ms)) => {
                    if !ms.is_finite() || ms < 0.0 {
                        return Err(bad(format!("arrival_interval_ms must be >= 0, got {ms}")));
                    }
                    if ms == 0.0 {
                        ArrivalSpec::Burst
                    } else {
                        ArrivalSpec::ConstantQps { qps: 1000.0 / ms }
                    }
                }
                (None, None) => ArrivalSpec::Burst,
            };
            let sessions = s.request_count.div_ceil(s.turns_per_session);
            Trace::synthetic(SyntheticTraceSpec {
                block_size: engine_block,
                num_sessions: sessions,
                turns_per_session: s.turns_per_session,
                input_tokens: LengthSpec {
                    mean: s.input_tokens,
                    stddev: 0.0,
                },
                output_tokens: LengthSpec {
                    mean: s.output_tokens,
                    stddev: 0.0,
                },
                cached_prefix_tokens: 0,
                shared_prefix_ratio: s.shared_prefix_ratio,
                num_prefix_groups: s.num_prefix_groups,
                first_turn_arrivals: arrivals,
                inter_turn_delays: if s.inter_turn_delay_ms > 0.0 {
                    DelaySpec::ConstantMs(s.inter_turn_delay_ms)
                } else {
                    DelaySpec::None
                },
                seed: s.arrival_seed,
                arrival_seed: s.arrival_seed,
            })
            .map_err(|e| bad(format!("{e:#}")))?
        }
    };
    trace
        .normalize_session_starts()
        .and_then(|t| t.speed_up_timing(speedup))
        .map_err(sim)
}

/// Run a replay in simulated time.
///
/// # Errors
/// [`ReplayError::InvalidTrace`] (naming file and line), [`ReplayError::InvalidArgument`],
/// [`ReplayError::Io`], or [`ReplayError::Simulation`].
pub fn run_offline(opts: &ReplayOptions, workload: &Workload) -> Result<ReplayOutput, ReplayError> {
    validate(opts)?;
    check_arrival_process(opts, workload)?;
    let wall = Instant::now();
    let (engine, startup_time) = engine_descriptor(&opts.engine_args)?;
    let block = engine_block_size(&engine)?;
    if block == 0 {
        return Err(bad("block_size must be positive"));
    }
    let trace = build_trace(workload, block, opts.arrival_speedup_ratio)?;
    let sim = |e: anyhow::Error| ReplayError::Simulation(format!("{e:#}"));
    let driver = match opts.replay_concurrency {
        Some(n) => trace.into_concurrency_driver_with_block_size(block, n),
        None => trace.into_trace_driver_with_block_size(block),
    }
    .map_err(sim)?;

    let spec = ReplaySpec {
        version: aisimulate_core::replay::CURRENT_REPLAY_SPEC_VERSION,
        topology: ReplayTopology::Aggregated {
            workers: WorkerPoolSpec {
                initial_workers: opts.num_workers,
                startup_delay_ms: startup_time.map_or(0.0, |s| s * 1000.0),
            },
        },
        engine: engine.clone(),
        adapters: ReplayAdapters {
            placement: match opts.router_mode {
                RouterMode::RoundRobin => ProviderSpec::round_robin(),
                RouterMode::KvRouter => ProviderSpec {
                    provider: "kv_router".into(),
                    config: Value::Null,
                },
            },
            scaling: ProviderSpec::no_scaling(),
        },
        max_sim_time_ms: opts.max_sim_time_ms,
        max_in_flight: opts.replay_concurrency,
        record_per_request: false,
        sla: opts.sla,
        requests: Vec::new(),
    };
    let capture = ReplayCaptureOptions {
        capture_per_request: opts.capture_per_request || opts.report_jsonl_path.is_some(),
        ..Default::default()
    };
    let timeline = Arc::new(Mutex::new(Vec::new()));
    // Progress alone samples every simulated second; the samples are then not returned.
    let sample_interval = opts
        .timeline_interval_ms
        .or(opts.progress.as_ref().map(|_| 1000.0));
    let observer = || -> Box<dyn ReplayTelemetryObserver> {
        Box::new(TimelineObserver(
            Arc::clone(&timeline),
            0,
            opts.progress.clone(),
        ))
    };
    let cfg: aisimulate_core::replay::ReplayEngineConfig =
        serde_json::from_value(engine).map_err(|e| bad(format!("{e}")))?;
    let simerr = |e: aisimulate_core::replay::ReplayError| match e {
        aisimulate_core::replay::ReplayError::InvalidSpec(m) => {
            bad(format!("invalid replay configuration: {m}"))
        }
        other => ReplayError::Simulation(other.to_string()),
    };
    let report = match opts.router_mode {
        RouterMode::RoundRobin => {
            let mut r = Replayer::new(spec, ReplayEngineFactory::new())
                .map_err(simerr)?
                .with_runtime_input(ReplayRuntimeInput::Workload(driver))
                .with_capture_options(capture);
            if let Some(iv) = sample_interval {
                r = r.with_telemetry_observer(iv, observer()).map_err(simerr)?;
            }
            r.run().map_err(simerr)?
        }
        RouterMode::KvRouter => {
            let composition = KvRouterComposition {
                config: opts.router_config.clone(),
                block_size: block as u32,
                capacity: WorkerCapacity {
                    total_kv_blocks: Some(cfg.rank.num_gpu_blocks as u64),
                    max_num_batched_tokens: Some(cfg.rank.max_num_batched_tokens as u64),
                    kv_used_blocks: None,
                },
                seed: opts.seed,
                router_thread: opts.router_thread,
            };
            let mut r = Replayer::with_composition(spec, ReplayEngineFactory::new(), composition)
                .map_err(simerr)?
                .with_runtime_input(ReplayRuntimeInput::Workload(driver))
                .with_capture_options(capture);
            if let Some(iv) = sample_interval {
                r = r.with_telemetry_observer(iv, observer()).map_err(simerr)?;
            }
            r.run().map_err(simerr)?
        }
    };
    let mut summary = match serde_json::to_value(&report) {
        Ok(Value::Object(m)) => m,
        Ok(_) | Err(_) => return Err(ReplayError::Simulation("unserializable report".into())),
    };
    summary.insert(
        "wall_time_ms".into(),
        Value::from(wall.elapsed().as_secs_f64() * 1000.0),
    );
    let per_request = if capture.capture_per_request {
        let records: Vec<Value> = report
            .per_request
            .iter()
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            .collect();
        if let Some(path) = &opts.report_jsonl_path {
            write_jsonl(path, &records)?;
        }
        opts.capture_per_request.then_some(records)
    } else {
        None
    };
    let mut timeline = std::mem::take(&mut *timeline.lock().unwrap_or_else(|p| p.into_inner()));
    if opts.timeline_interval_ms.is_none() {
        timeline.clear();
    }
    if let Some(p) = &opts.progress {
        p.store(
            report.request_counts.completed_requests as u64,
            Ordering::Relaxed,
        );
    }
    Ok(ReplayOutput {
        summary,
        per_request,
        timeline,
    })
}

fn write_jsonl(path: &std::path::Path, records: &[Value]) -> Result<(), ReplayError> {
    use std::io::Write as _;
    let io = |e: std::io::Error| ReplayError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    for r in records {
        serde_json::to_writer(&mut w, r).map_err(|e| io(e.into()))?;
        w.write_all(b"\n").map_err(io)?;
    }
    w.flush().map_err(io)
}

#[cfg(test)]
mod tests;
