//! `run_mocker_trace_replay` / `run_mocker_synthetic_trace_replay`: thin bindings over
//! `dynamo_mocker::replay`. Arguments are converted here; the simulation, validation and report
//! live in the core crate. The GIL is released while a replay runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dynamo_mocker::replay::{
    self, ReplayError, ReplayOptions, ReplayOutput, RouterMode, SyntheticWorkload, Workload,
};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

use crate::json::from_value;
use crate::llm::mocker_args::PyMockEngineArgs;
use crate::llm::router::PyKvRouterConfig;

fn replay_error(e: ReplayError) -> PyErr {
    match e {
        ReplayError::InvalidTrace { .. } | ReplayError::InvalidArgument(_) => {
            PyValueError::new_err(e.to_string())
        }
        ReplayError::Io { .. } => PyFileNotFoundError::new_err(e.to_string()),
        ReplayError::Simulation(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Completed-request counter a caller can poll from another thread while a replay runs.
#[pyclass(name = "ReplayProgress", module = "dynamo._core", frozen)]
pub(crate) struct PyReplayProgress {
    inner: Arc<AtomicU64>,
}

#[pymethods]
impl PyReplayProgress {
    #[new]
    fn new() -> Self {
        Self {
            inner: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Requests completed so far (updated every simulated second).
    #[getter]
    fn completed(&self) -> u64 {
        self.inner.load(Ordering::Relaxed)
    }
}

/// Result of an offline replay (`summary`, `per_request`, ...).
#[pyclass(name = "_OfflineReplayResult", module = "dynamo._core", frozen)]
pub(crate) struct PyOfflineReplayResult {
    out: ReplayOutput,
    sample_interval_ms: Option<f64>,
}

#[pymethods]
impl PyOfflineReplayResult {
    /// The report: the reference's keys (`mean_ttft_ms`, `prefix_cache_reused_ratio`, ...).
    #[getter]
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        from_value(py, &Value::Object(self.out.summary.clone()))
    }

    /// One dict per request when `capture_per_request=True`, else `None`.
    #[getter]
    fn per_request<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.out.per_request {
            Some(rows) => {
                let list = PyList::empty(py);
                for r in rows {
                    list.append(from_value(py, r)?)?;
                }
                Ok(list.into_any())
            }
            None => Ok(py.None().into_bound(py)),
        }
    }

    #[getter]
    fn coverage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("capture_per_request", self.out.per_request.is_some())?;
        d.set_item("capture_planner_details", false)?;
        d.set_item(
            "per_request_records",
            self.out.per_request.as_ref().map_or(0, Vec::len),
        )?;
        Ok(d)
    }

    #[getter]
    fn lifecycle_operations<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        PyList::empty(py)
    }

    /// `{"sample_interval_ms", "samples"}` when `capture_telemetry=True`; each sample has
    /// `t_ms`, `queue_depth`, `running_requests`, `active_kv_blocks`, `completed_requests`.
    #[getter]
    fn telemetry<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(iv) = self.sample_interval_ms else {
            return Ok(py.None().into_bound(py));
        };
        let samples = serde_json::to_value(&self.out.timeline)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        from_value(
            py,
            &serde_json::json!({"sample_interval_ms": iv, "samples": samples}),
        )
    }

    /// `result["summary"]` etc., for code written against a dict-shaped result.
    fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        match key {
            "summary" => self.summary(py),
            "per_request" => self.per_request(py),
            "telemetry" => self.telemetry(py),
            // The reference's online replay returns the summary dict itself: its keys
            // work here too (`result["mean_ttft_ms"]`).
            _ => match self.out.summary.get(key) {
                Some(v) => from_value(py, v),
                None => Err(pyo3::exceptions::PyKeyError::new_err(key.to_owned())),
            },
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "_OfflineReplayResult(num_requests={}, mean_ttft_ms={})",
            self.out.summary.get("num_requests").unwrap_or(&Value::Null),
            self.out.summary.get("mean_ttft_ms").unwrap_or(&Value::Null)
        )
    }
}

fn engine_args(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Value> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Value::Null);
    };
    if let Ok(args) = obj.cast::<PyMockEngineArgs>() {
        return Ok(replay::engine_args_from_mocker(&args.borrow().inner));
    }
    if !obj.is_instance(&obj.py().import("collections.abc")?.getattr("Mapping")?)? {
        return Err(PyTypeError::new_err(format!(
            "extra_engine_args must be a mapping or MockEngineArgs, not {}",
            obj.get_type().name()?
        )));
    }
    let dict = obj
        .py()
        .import("builtins")?
        .getattr("dict")?
        .call1((obj,))?;
    let bytes = crate::json::to_json(&dict)?;
    serde_json::from_slice(&bytes).map_err(|e| PyValueError::new_err(e.to_string()))
}

fn unsupported(name: &str, given: bool) -> PyResult<()> {
    if given {
        return Err(PyValueError::new_err(format!(
            "{name} is not supported by this replay (see docs/replay.md, known gaps)"
        )));
    }
    Ok(())
}

/// Arguments common to both entry points.
struct Common<'a, 'py> {
    extra_engine_args: Option<&'a Bound<'py, PyAny>>,
    prefill_engine_args: Option<&'a Bound<'py, PyAny>>,
    decode_engine_args: Option<&'a Bound<'py, PyAny>>,
    router_config: Option<PyKvRouterConfig>,
    ais_perf_config: Option<&'a Bound<'py, PyAny>>,
    num_workers: usize,
    replay_concurrency: Option<usize>,
    replay_mode: &'a str,
    router_mode: &'a str,
    arrival_speedup_ratio: f64,
    sla: (Option<f64>, Option<f64>, Option<f64>),
    capture_per_request: bool,
    scaling_policy: Option<&'a Bound<'py, PyAny>>,
    capture_telemetry: bool,
    telemetry_sample_interval_ms: f64,
    kv_event_lag_ms: Option<f64>,
    progress: Option<&'a Bound<'py, PyReplayProgress>>,
    seed: u64,
}

fn run<'py>(
    py: Python<'py>,
    c: Common<'_, 'py>,
    workload: Workload,
    extra: ReplayOptions,
) -> PyResult<Bound<'py, PyAny>> {
    let router_mode: RouterMode = c.router_mode.parse().map_err(replay_error)?;
    let online = match c.replay_mode {
        "offline" => false,
        "online" => true,
        other => {
            return Err(PyValueError::new_err(format!(
                "replay_mode must be either 'offline' or 'online', got '{other}'"
            )));
        }
    };
    unsupported(
        "prefill_engine_args/decode_engine_args (disaggregated replay)",
        c.prefill_engine_args.is_some_and(|o| !o.is_none())
            || c.decode_engine_args.is_some_and(|o| !o.is_none()),
    )?;
    unsupported(
        "ais_perf_config",
        c.ais_perf_config.is_some_and(|o| !o.is_none()),
    )?;
    if c.scaling_policy.is_some_and(|o| !o.is_none()) {
        return Err(PyValueError::new_err(
            "scaling_policy is not supported by this replay",
        ));
    }
    unsupported(
        "kv_event_lag_ms",
        c.kv_event_lag_ms.is_some_and(|v| v != 0.0),
    )?;
    let opts = ReplayOptions {
        engine_args: engine_args(c.extra_engine_args)?,
        router_config: c.router_config.map(|r| r.inner).unwrap_or_default(),
        num_workers: c.num_workers,
        router_mode,
        arrival_speedup_ratio: c.arrival_speedup_ratio,
        replay_concurrency: c.replay_concurrency,
        sla: aisimulate_sla(c.sla),
        capture_per_request: c.capture_per_request,
        timeline_interval_ms: c
            .capture_telemetry
            .then_some(c.telemetry_sample_interval_ms),
        seed: c.seed,
        progress: c.progress.map(|p| Arc::clone(&p.get().inner)),
        ..extra
    };
    let sample_interval_ms = opts.timeline_interval_ms;
    let out = if online {
        // Wall-clock time through live mocker workers: the same result object, without
        // telemetry samples.
        py.detach(|| replay::online::run_online(&opts, &workload))
            .map_err(replay_error)?
    } else {
        py.detach(|| replay::run_offline(&opts, &workload))
            .map_err(replay_error)?
    };
    Ok(Bound::new(
        py,
        PyOfflineReplayResult {
            out,
            sample_interval_ms,
        },
    )?
    .into_any())
}

fn aisimulate_sla(
    (ttft, itl, e2e): (Option<f64>, Option<f64>, Option<f64>),
) -> replay::SlaThresholds {
    replay::SlaThresholds {
        ttft_ms: ttft,
        itl_ms: itl,
        e2e_ms: e2e,
    }
}

/// Replay Mooncake trace files on simulated mocker workers behind a router.
#[pyfunction]
#[pyo3(signature = (
    trace_files, extra_engine_args=None, prefill_engine_args=None, decode_engine_args=None,
    router_config=None, ais_perf_config=None, num_workers=1, num_prefill_workers=1,
    num_decode_workers=1, replay_concurrency=None, replay_mode="offline",
    router_mode="round_robin", arrival_speedup_ratio=1.0, trace_block_size=None,
    trace_format="mooncake", trace_shared_prefix_ratio=0.0, trace_num_prefix_groups=0,
    report_jsonl_path=None, max_sim_time_ms=None, model_name=None, sla_ttft_ms=None,
    sla_itl_ms=None, sla_e2e_ms=None, capture_per_request=false,
    capture_planner_details=true, scaling_policy=None, agentic_lanes=None,
    execution_model=None, weka_nested_timestamp_basis=None, capture_telemetry=false,
    telemetry_sample_interval_ms=1000.0, telemetry_callback=None, telemetry_jsonl_path=None,
    kv_event_lag_ms=None, *, progress=None, seed=42
))]
#[allow(clippy::too_many_arguments)]
#[allow(unused_variables)]
pub(crate) fn run_mocker_trace_replay<'py>(
    py: Python<'py>,
    trace_files: Vec<PathBuf>,
    extra_engine_args: Option<&Bound<'py, PyAny>>,
    prefill_engine_args: Option<&Bound<'py, PyAny>>,
    decode_engine_args: Option<&Bound<'py, PyAny>>,
    router_config: Option<PyKvRouterConfig>,
    ais_perf_config: Option<&Bound<'py, PyAny>>,
    num_workers: usize,
    num_prefill_workers: usize,
    num_decode_workers: usize,
    replay_concurrency: Option<usize>,
    replay_mode: &str,
    router_mode: &str,
    arrival_speedup_ratio: f64,
    trace_block_size: Option<usize>,
    trace_format: &str,
    trace_shared_prefix_ratio: f64,
    trace_num_prefix_groups: usize,
    report_jsonl_path: Option<PathBuf>,
    max_sim_time_ms: Option<f64>,
    model_name: Option<String>,
    sla_ttft_ms: Option<f64>,
    sla_itl_ms: Option<f64>,
    sla_e2e_ms: Option<f64>,
    capture_per_request: bool,
    capture_planner_details: bool,
    scaling_policy: Option<&Bound<'py, PyAny>>,
    agentic_lanes: Option<usize>,
    execution_model: Option<String>,
    weka_nested_timestamp_basis: Option<String>,
    capture_telemetry: bool,
    telemetry_sample_interval_ms: f64,
    telemetry_callback: Option<&Bound<'py, PyAny>>,
    telemetry_jsonl_path: Option<PathBuf>,
    kv_event_lag_ms: Option<f64>,
    progress: Option<&Bound<'py, PyReplayProgress>>,
    seed: u64,
) -> PyResult<Bound<'py, PyAny>> {
    if !matches!(trace_format, "mooncake") {
        return Err(PyValueError::new_err(format!(
            "trace_format must be 'mooncake' (the only format this replay reads), got '{trace_format}'"
        )));
    }
    unsupported(
        "trace_shared_prefix_ratio/trace_num_prefix_groups",
        trace_shared_prefix_ratio != 0.0 || trace_num_prefix_groups != 0,
    )?;
    unsupported(
        "agentic_lanes/execution_model/weka_nested_timestamp_basis",
        agentic_lanes.is_some()
            || execution_model.is_some()
            || weka_nested_timestamp_basis.is_some(),
    )?;
    unsupported(
        "telemetry_callback/telemetry_jsonl_path",
        telemetry_callback.is_some_and(|o| !o.is_none()) || telemetry_jsonl_path.is_some(),
    )?;
    let common = Common {
        extra_engine_args,
        prefill_engine_args,
        decode_engine_args,
        router_config,
        ais_perf_config,
        num_workers,
        replay_concurrency,
        replay_mode,
        router_mode,
        arrival_speedup_ratio,
        sla: (sla_ttft_ms, sla_itl_ms, sla_e2e_ms),
        capture_per_request,
        scaling_policy,
        capture_telemetry,
        telemetry_sample_interval_ms,
        kv_event_lag_ms,
        progress,
        seed,
    };
    let extra = ReplayOptions {
        max_sim_time_ms,
        report_jsonl_path,
        ..Default::default()
    };
    run(
        py,
        common,
        Workload::Mooncake {
            files: trace_files,
            trace_block_size,
        },
        extra,
    )
}

/// Replay a synthetic workload (fixed input/output lengths) without a trace file.
#[pyfunction]
#[pyo3(signature = (
    input_tokens, output_tokens, request_count, extra_engine_args=None,
    prefill_engine_args=None, decode_engine_args=None, router_config=None,
    ais_perf_config=None, num_workers=1, num_prefill_workers=1, num_decode_workers=1,
    replay_concurrency=None, replay_mode="offline", router_mode="round_robin",
    arrival_speedup_ratio=1.0, request_rate=None, arrival_interval_ms=None, arrival_seed=42,
    turns_per_session=1, shared_prefix_ratio=0.0, num_prefix_groups=0,
    inter_turn_delay_ms=0.0, model_name=None, sla_ttft_ms=None, sla_itl_ms=None,
    sla_e2e_ms=None, capture_per_request=false, capture_planner_details=true,
    scaling_policy=None, capture_telemetry=false, telemetry_sample_interval_ms=1000.0,
    telemetry_callback=None, telemetry_jsonl_path=None, kv_event_lag_ms=None, *,
    progress=None, seed=42
))]
#[allow(clippy::too_many_arguments)]
#[allow(unused_variables)]
pub(crate) fn run_mocker_synthetic_trace_replay<'py>(
    py: Python<'py>,
    input_tokens: usize,
    output_tokens: usize,
    request_count: usize,
    extra_engine_args: Option<&Bound<'py, PyAny>>,
    prefill_engine_args: Option<&Bound<'py, PyAny>>,
    decode_engine_args: Option<&Bound<'py, PyAny>>,
    router_config: Option<PyKvRouterConfig>,
    ais_perf_config: Option<&Bound<'py, PyAny>>,
    num_workers: usize,
    num_prefill_workers: usize,
    num_decode_workers: usize,
    replay_concurrency: Option<usize>,
    replay_mode: &str,
    router_mode: &str,
    arrival_speedup_ratio: f64,
    request_rate: Option<f64>,
    arrival_interval_ms: Option<f64>,
    arrival_seed: u64,
    turns_per_session: usize,
    shared_prefix_ratio: f64,
    num_prefix_groups: usize,
    inter_turn_delay_ms: f64,
    model_name: Option<String>,
    sla_ttft_ms: Option<f64>,
    sla_itl_ms: Option<f64>,
    sla_e2e_ms: Option<f64>,
    capture_per_request: bool,
    capture_planner_details: bool,
    scaling_policy: Option<&Bound<'py, PyAny>>,
    capture_telemetry: bool,
    telemetry_sample_interval_ms: f64,
    telemetry_callback: Option<&Bound<'py, PyAny>>,
    telemetry_jsonl_path: Option<PathBuf>,
    kv_event_lag_ms: Option<f64>,
    progress: Option<&Bound<'py, PyReplayProgress>>,
    seed: u64,
) -> PyResult<Bound<'py, PyAny>> {
    unsupported(
        "telemetry_callback/telemetry_jsonl_path",
        telemetry_callback.is_some_and(|o| !o.is_none()) || telemetry_jsonl_path.is_some(),
    )?;
    let common = Common {
        extra_engine_args,
        prefill_engine_args,
        decode_engine_args,
        router_config,
        ais_perf_config,
        num_workers,
        replay_concurrency,
        replay_mode,
        router_mode,
        arrival_speedup_ratio,
        sla: (sla_ttft_ms, sla_itl_ms, sla_e2e_ms),
        capture_per_request,
        scaling_policy,
        capture_telemetry,
        telemetry_sample_interval_ms,
        kv_event_lag_ms,
        progress,
        seed,
    };
    run(
        py,
        common,
        Workload::Synthetic(SyntheticWorkload {
            input_tokens,
            output_tokens,
            request_count,
            request_rate,
            arrival_interval_ms,
            arrival_seed,
            turns_per_session,
            shared_prefix_ratio,
            num_prefix_groups,
            inter_turn_delay_ms,
        }),
        ReplayOptions::default(),
    )
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyOfflineReplayResult>()?;
    m.add_class::<PyReplayProgress>()?;
    m.add_function(wrap_pyfunction!(run_mocker_trace_replay, m)?)?;
    m.add_function(wrap_pyfunction!(run_mocker_synthetic_trace_replay, m)?)?;
    Ok(())
}
