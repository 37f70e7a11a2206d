//! `MockEngineArgs` (wrapping `dynamo_mocker::MockEngineArgs`) and the option classes
//! it takes: `ReasoningConfig`, `SglangArgs`, `TrtllmArgs`.
//!
//! No field is plumbed by hand: the constructor and `with_overrides` collect their
//! arguments into one JSON object that the core crate deserialises (serde) and validates,
//! and every property reads or writes one argument through that same JSON form
//! (`MockEngineArgs::get` / an override), so defaults, validation and the handling of
//! accepted-but-unmodelled options live in one place (the core crate). `None` (and
//! `block_size=0`) mean "the engine's default". `EntrypointArgs` also takes the
//! reference's mapping form (`{"engine": {...}, "dynamo": {...}}`, see
//! [`mock_engine_args_from_py`]).

use std::path::PathBuf;

use dynamo_mocker::MockEngineArgs;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::mocker_error;
use crate::json::py_to_json;

/// Mocker reasoning simulation: a share of output tokens is wrapped in thinking markers.
#[pyclass(
    name = "ReasoningConfig",
    module = "dynamo._core",
    frozen,
    from_py_object
)]
#[derive(Clone)]
pub(crate) struct PyReasoningConfig {
    inner: serde_json::Value,
}

#[pymethods]
impl PyReasoningConfig {
    #[new]
    #[pyo3(signature = (start_thinking_token_id, end_thinking_token_id, thinking_ratio))]
    fn new(
        start_thinking_token_id: u32,
        end_thinking_token_id: u32,
        thinking_ratio: f64,
    ) -> PyResult<Self> {
        if !(0.0..=1.0).contains(&thinking_ratio) {
            return Err(PyValueError::new_err(format!(
                "thinking_ratio must be in [0, 1], got {thinking_ratio}"
            )));
        }
        Ok(Self {
            inner: serde_json::json!({
                "start_thinking_token_id": start_thinking_token_id,
                "end_thinking_token_id": end_thinking_token_id,
                "thinking_ratio": thinking_ratio,
            }),
        })
    }

    fn __repr__(&self) -> String {
        format!("ReasoningConfig({})", self.inner)
    }
}

/// SGLang-scheduler options of the mocker.
#[pyclass(name = "SglangArgs", module = "dynamo._core", frozen, from_py_object)]
#[derive(Clone)]
pub(crate) struct PySglangArgs {
    inner: serde_json::Value,
}

#[pymethods]
impl PySglangArgs {
    #[new]
    #[pyo3(signature = (schedule_policy=None, page_size=None, max_prefill_tokens=None, chunked_prefill_size=None, clip_max_new_tokens=None, schedule_conservativeness=None))]
    fn new(
        schedule_policy: Option<String>,
        page_size: Option<u32>,
        max_prefill_tokens: Option<u64>,
        chunked_prefill_size: Option<u64>,
        clip_max_new_tokens: Option<u64>,
        schedule_conservativeness: Option<f64>,
    ) -> Self {
        Self {
            inner: serde_json::json!({
                "schedule_policy": schedule_policy,
                "page_size": page_size,
                "max_prefill_tokens": max_prefill_tokens,
                "chunked_prefill_size": chunked_prefill_size,
                "clip_max_new_tokens": clip_max_new_tokens,
                "schedule_conservativeness": schedule_conservativeness,
            }),
        }
    }

    fn __repr__(&self) -> String {
        format!("SglangArgs({})", self.inner)
    }
}

/// TensorRT-LLM-scheduler options of the mocker.
#[pyclass(name = "TrtllmArgs", module = "dynamo._core", frozen, from_py_object)]
#[derive(Clone)]
pub(crate) struct PyTrtllmArgs {
    inner: serde_json::Value,
}

#[pymethods]
impl PyTrtllmArgs {
    #[new]
    #[pyo3(signature = (capacity_scheduler_policy=None))]
    fn new(capacity_scheduler_policy: Option<String>) -> Self {
        Self {
            inner: serde_json::json!({ "capacity_scheduler_policy": capacity_scheduler_policy }),
        }
    }

    fn __repr__(&self) -> String {
        format!("TrtllmArgs({})", self.inner)
    }
}

/// Configuration of the mocker (simulated engine).
// `eq` (rather than a hand-written `__eq__` inside the macro-built `#[pymethods]`, which
// trips the 2024 edition's unsafe-call lint through pyo3's expansion).
#[pyclass(name = "MockEngineArgs", module = "dynamo._core", from_py_object, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyMockEngineArgs {
    pub(crate) inner: MockEngineArgs,
}

/// Drop `null`s (and `block_size: 0`) so the core's defaults apply.
fn without_defaults(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.into_iter()
                .filter(|(k, v)| !(v.is_null() || (k == "block_size" && v.as_u64() == Some(0))))
                .collect(),
        ),
        other => other,
    }
}

impl PyMockEngineArgs {
    /// Parse, validate, and drop unmodelled options set to their inert defaults, so that
    /// equal configurations compare equal however they were written.
    fn parse(json: &str) -> PyResult<Self> {
        let mut inner = MockEngineArgs::from_json(json).map_err(mocker_error)?;
        let in_use: Vec<String> = inner
            .unsupported_in_use()
            .into_iter()
            .map(str::to_owned)
            .collect();
        inner.unsupported.retain(|k, _| in_use.contains(k));
        Ok(Self { inner })
    }

    fn from_given(given: serde_json::Value) -> PyResult<Self> {
        Self::parse(&without_defaults(given).to_string())
    }

    fn overridden(&self, overrides: serde_json::Value) -> PyResult<Self> {
        let mut base =
            serde_json::to_value(&self.inner).map_err(|e| PyValueError::new_err(e.to_string()))?;
        if let (Some(b), serde_json::Value::Object(o)) =
            (base.as_object_mut(), without_defaults(overrides))
        {
            b.extend(o);
        }
        Self::from_given(base)
    }

    /// One argument (a property's value) by name, through the core's JSON form.
    fn field<T: serde::de::DeserializeOwned>(&self, name: &str) -> PyResult<T> {
        let value = self.inner.get(name).unwrap_or_default();
        serde_json::from_value(value)
            .map_err(|e| PyValueError::new_err(format!("mocker argument {name}: {e}")))
    }

    /// Set one argument (a property) by name: a validated override; `None` unsets an
    /// unmodelled option.
    fn set_field(&mut self, name: &str, value: serde_json::Value) -> PyResult<()> {
        *self = self.overridden(serde_json::json!({ name: value }))?;
        if value.is_null() {
            self.inner.unsupported.remove(name);
        }
        Ok(())
    }
}

/// A JSON object of the given local variables, keyed by their names.
macro_rules! json_of {
    ($($name:ident),* $(,)?) => {{
        let mut map = serde_json::Map::new();
        $( map.insert(stringify!($name).to_owned(), serde_json::json!($name)); )*
        serde_json::Value::Object(map)
    }};
}

/// The `#[pymethods]` block of `MockEngineArgs`: the methods written out, plus one
/// property per table row (read-only `name: Type`, read/write `name / set_name: Type`),
/// each going through [`PyMockEngineArgs::field`] / [`PyMockEngineArgs::set_field`].
macro_rules! mock_engine_args_methods {
    (
        read_only: [$($ro:ident: $ro_ty:ty),* $(,)?],
        read_write: [$($rw:ident / $set:ident: $rw_ty:ty),* $(,)?],
        $($methods:tt)*
    ) => {
        #[pymethods]
        impl PyMockEngineArgs {
            $(
                #[getter]
                fn $ro(&self) -> PyResult<$ro_ty> {
                    self.field(stringify!($ro))
                }
            )*
            $(
                #[getter]
                fn $rw(&self) -> PyResult<$rw_ty> {
                    self.field(stringify!($rw))
                }

                #[setter]
                fn $set(&mut self, value: $rw_ty) -> PyResult<()> {
                    self.set_field(stringify!($rw), serde_json::json!(value))
                }
            )*
            $($methods)*
        }
    };
}

mock_engine_args_methods! {
    read_only: [
        block_size: usize,
        max_model_len: Option<usize>,
        max_num_seqs: Option<usize>,
        max_num_batched_tokens: Option<usize>,
        enable_local_indexer: bool,
        dp_size: u32,
        engine_type: String,
        bootstrap_port: Option<u16>,
        handoff_session_timeout_ms: u64,
        kv_transfer_timing_mode: String,
        response_replay_trace_path: Option<PathBuf>,
        num_g2_blocks: Option<u64>,
        num_g3_blocks: Option<u64>,
        offload_batch_size: Option<u64>,
        bandwidth_g1_to_g2_gbps: Option<f64>,
        bandwidth_g2_to_g1_gbps: Option<f64>,
        bandwidth_g2_to_g3_gbps: Option<f64>,
        bandwidth_g3_to_g2_gbps: Option<f64>,
        bandwidth_g2_to_g4_gbps: Option<f64>,
        bandwidth_g4_to_g2_gbps: Option<f64>,
        enable_g4_storage: bool,
    ],
    read_write: [
        num_gpu_blocks / set_num_gpu_blocks: usize,
        enable_prefix_caching / set_enable_prefix_caching: bool,
        worker_type / set_worker_type: String,
        aic_backend / set_aic_backend: Option<String>,
        aic_system / set_aic_system: Option<String>,
        aic_backend_version / set_aic_backend_version: Option<String>,
        aic_model_path / set_aic_model_path: Option<String>,
        aic_gemm_dtype / set_aic_gemm_dtype: Option<String>,
        aic_moe_dtype / set_aic_moe_dtype: Option<String>,
        aic_fmha_dtype / set_aic_fmha_dtype: Option<String>,
        aic_kv_cache_dtype / set_aic_kv_cache_dtype: Option<String>,
        aic_comm_dtype / set_aic_comm_dtype: Option<String>,
        aic_nextn_accept_rates / set_aic_nextn_accept_rates: Option<String>,
        aic_tp_size / set_aic_tp_size: Option<u32>,
        aic_moe_tp_size / set_aic_moe_tp_size: Option<u32>,
        aic_moe_ep_size / set_aic_moe_ep_size: Option<u32>,
        aic_attention_dp_size / set_aic_attention_dp_size: Option<u32>,
        aic_nextn / set_aic_nextn: Option<u32>,
        aic_mtp_seed / set_aic_mtp_seed: u64,
        gpu_memory_utilization / set_gpu_memory_utilization: Option<f64>,
        mem_fraction_static / set_mem_fraction_static: Option<f64>,
        free_gpu_memory_fraction / set_free_gpu_memory_fraction: Option<f64>,
    ],

    #[new]
    #[pyo3(signature = (
        engine_type="vllm",
        num_gpu_blocks=None,
        block_size=0,
        max_num_seqs=Some(256),
        max_num_batched_tokens=Some(8192),
        enable_prefix_caching=true,
        enable_chunked_prefill=true,
        speedup_ratio=1.0,
        decode_speedup_ratio=1.0,
        dp_size=1,
        startup_time=None,
        worker_type="aggregated",
        planner_profile_data=None,
        aic_backend=None,
        aic_system=None,
        aic_backend_version=None,
        aic_tp_size=None,
        aic_model_path=None,
        aic_moe_tp_size=None,
        aic_moe_ep_size=None,
        aic_attention_dp_size=None,
        aic_nextn=None,
        aic_nextn_accept_rates=None,
        aic_mtp_seed=42,
        aic_gemm_dtype=None,
        aic_moe_dtype=None,
        aic_fmha_dtype=None,
        aic_kv_cache_dtype=None,
        aic_comm_dtype=None,
        gpu_memory_utilization=None,
        mem_fraction_static=None,
        free_gpu_memory_fraction=None,
        enable_local_indexer=false,
        bootstrap_port=None,
        handoff_session_timeout_ms=300000,
        kv_bytes_per_token=None,
        kv_transfer_bandwidth=None,
        kv_transfer_timing_mode="full_prompt",
        reasoning=None,
        response_replay_trace_path=None,
        zmq_kv_events_port=None,
        zmq_replay_port=None,
        preemption_mode="lifo",
        router_queue_policy=None,
        sglang=None,
        trtllm=None,
        num_g2_blocks=None,
        num_g3_blocks=None,
        offload_batch_size=None,
        bandwidth_g1_to_g2_gbps=None,
        bandwidth_g2_to_g1_gbps=None,
        bandwidth_g2_to_g3_gbps=None,
        bandwidth_g3_to_g2_gbps=None,
        enable_g4_storage=false,
        bandwidth_g2_to_g4_gbps=None,
        bandwidth_g4_to_g2_gbps=None,
        max_model_len=None,
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors the documented Python constructor"
    )]
    fn new(
        engine_type: &str,
        num_gpu_blocks: Option<usize>,
        block_size: usize,
        max_num_seqs: Option<usize>,
        max_num_batched_tokens: Option<usize>,
        enable_prefix_caching: bool,
        enable_chunked_prefill: bool,
        speedup_ratio: f64,
        decode_speedup_ratio: f64,
        dp_size: u32,
        startup_time: Option<f64>,
        worker_type: &str,
        planner_profile_data: Option<PathBuf>,
        aic_backend: Option<String>,
        aic_system: Option<String>,
        aic_backend_version: Option<String>,
        aic_tp_size: Option<u32>,
        aic_model_path: Option<String>,
        aic_moe_tp_size: Option<u32>,
        aic_moe_ep_size: Option<u32>,
        aic_attention_dp_size: Option<u32>,
        aic_nextn: Option<u32>,
        aic_nextn_accept_rates: Option<String>,
        aic_mtp_seed: u64,
        aic_gemm_dtype: Option<String>,
        aic_moe_dtype: Option<String>,
        aic_fmha_dtype: Option<String>,
        aic_kv_cache_dtype: Option<String>,
        aic_comm_dtype: Option<String>,
        gpu_memory_utilization: Option<f64>,
        mem_fraction_static: Option<f64>,
        free_gpu_memory_fraction: Option<f64>,
        enable_local_indexer: bool,
        bootstrap_port: Option<u16>,
        handoff_session_timeout_ms: u64,
        kv_bytes_per_token: Option<u64>,
        kv_transfer_bandwidth: Option<f64>,
        kv_transfer_timing_mode: &str,
        reasoning: Option<PyRef<'_, PyReasoningConfig>>,
        response_replay_trace_path: Option<PathBuf>,
        zmq_kv_events_port: Option<u16>,
        zmq_replay_port: Option<u16>,
        preemption_mode: &str,
        router_queue_policy: Option<String>,
        sglang: Option<PyRef<'_, PySglangArgs>>,
        trtllm: Option<PyRef<'_, PyTrtllmArgs>>,
        num_g2_blocks: Option<u64>,
        num_g3_blocks: Option<u64>,
        offload_batch_size: Option<u64>,
        bandwidth_g1_to_g2_gbps: Option<f64>,
        bandwidth_g2_to_g1_gbps: Option<f64>,
        bandwidth_g2_to_g3_gbps: Option<f64>,
        bandwidth_g3_to_g2_gbps: Option<f64>,
        enable_g4_storage: bool,
        bandwidth_g2_to_g4_gbps: Option<f64>,
        bandwidth_g4_to_g2_gbps: Option<f64>,
        max_model_len: Option<usize>,
    ) -> PyResult<Self> {
        // Paths as text (a non-UTF-8 path is shown lossily rather than failing), option
        // objects as their JSON.
        let planner_profile_data = planner_profile_data.map(|p| p.display().to_string());
        let response_replay_trace_path =
            response_replay_trace_path.map(|p| p.display().to_string());
        let reasoning = reasoning.map(|v| v.inner.clone());
        let sglang = sglang.map(|v| v.inner.clone());
        let trtllm = trtllm.map(|v| v.inner.clone());
        Self::from_given(json_of!(
            engine_type, num_gpu_blocks, block_size, max_num_seqs, max_num_batched_tokens,
            enable_prefix_caching, enable_chunked_prefill, speedup_ratio, decode_speedup_ratio,
            dp_size, startup_time, worker_type, planner_profile_data, aic_backend, aic_system,
            aic_backend_version, aic_tp_size, aic_model_path, aic_moe_tp_size, aic_moe_ep_size,
            aic_attention_dp_size, aic_nextn, aic_nextn_accept_rates, aic_mtp_seed,
            aic_gemm_dtype, aic_moe_dtype, aic_fmha_dtype, aic_kv_cache_dtype, aic_comm_dtype,
            gpu_memory_utilization, mem_fraction_static, free_gpu_memory_fraction,
            enable_local_indexer, bootstrap_port, handoff_session_timeout_ms,
            kv_bytes_per_token, kv_transfer_bandwidth, kv_transfer_timing_mode, reasoning,
            response_replay_trace_path, zmq_kv_events_port, zmq_replay_port, preemption_mode,
            router_queue_policy, sglang, trtllm, num_g2_blocks, num_g3_blocks,
            offload_batch_size, bandwidth_g1_to_g2_gbps, bandwidth_g2_to_g1_gbps,
            bandwidth_g2_to_g3_gbps, bandwidth_g3_to_g2_gbps, enable_g4_storage,
            bandwidth_g2_to_g4_gbps, bandwidth_g4_to_g2_gbps, max_model_len,
        ))
    }

    /// Parse a JSON object (missing fields take their defaults).
    #[staticmethod]
    #[pyo3(signature = (config_json))]
    fn from_json(config_json: &str) -> PyResult<Self> {
        Self::parse(config_json)
    }

    /// The arguments as JSON (accepted by `from_json` and `--extra-engine-args`).
    #[pyo3(signature = ())]
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// An independent copy.
    #[pyo3(signature = ())]
    fn copy(&self) -> Self {
        self.clone()
    }

    /// Names of accepted options this mocker does not model that are set to values which
    /// would change a real engine's behaviour.
    #[pyo3(signature = ())]
    fn unsupported_in_use(&self) -> Vec<String> {
        self.inner
            .unsupported_in_use()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    #[pyo3(signature = ())]
    fn is_prefill(&self) -> bool {
        self.inner.is_prefill()
    }

    #[pyo3(signature = ())]
    fn is_decode(&self) -> bool {
        self.inner.is_decode()
    }

    /// A validated copy with the given (non-None) values replaced.
    #[pyo3(signature = (
        bootstrap_port=None,
        zmq_kv_events_port=None,
        zmq_replay_port=None,
        kv_bytes_per_token=None,
        num_gpu_blocks=None,
        aic_backend=None,
        aic_system=None,
        aic_backend_version=None,
        aic_tp_size=None,
        aic_model_path=None,
        aic_moe_tp_size=None,
        aic_moe_ep_size=None,
        aic_attention_dp_size=None,
        aic_nextn=None,
        aic_nextn_accept_rates=None,
        aic_mtp_seed=None,
        aic_gemm_dtype=None,
        aic_moe_dtype=None,
        aic_fmha_dtype=None,
        aic_kv_cache_dtype=None,
        aic_comm_dtype=None,
        gpu_memory_utilization=None,
        mem_fraction_static=None,
        free_gpu_memory_fraction=None,
        enable_prefix_caching=None,
        worker_type=None,
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors the documented Python method"
    )]
    fn with_overrides(
        &self,
        bootstrap_port: Option<u16>,
        zmq_kv_events_port: Option<u16>,
        zmq_replay_port: Option<u16>,
        kv_bytes_per_token: Option<u64>,
        num_gpu_blocks: Option<usize>,
        aic_backend: Option<String>,
        aic_system: Option<String>,
        aic_backend_version: Option<String>,
        aic_tp_size: Option<u32>,
        aic_model_path: Option<String>,
        aic_moe_tp_size: Option<u32>,
        aic_moe_ep_size: Option<u32>,
        aic_attention_dp_size: Option<u32>,
        aic_nextn: Option<u32>,
        aic_nextn_accept_rates: Option<String>,
        aic_mtp_seed: Option<u64>,
        aic_gemm_dtype: Option<String>,
        aic_moe_dtype: Option<String>,
        aic_fmha_dtype: Option<String>,
        aic_kv_cache_dtype: Option<String>,
        aic_comm_dtype: Option<String>,
        gpu_memory_utilization: Option<f64>,
        mem_fraction_static: Option<f64>,
        free_gpu_memory_fraction: Option<f64>,
        enable_prefix_caching: Option<bool>,
        worker_type: Option<String>,
    ) -> PyResult<Self> {
        self.overridden(json_of!(
            bootstrap_port, zmq_kv_events_port, zmq_replay_port, kv_bytes_per_token,
            num_gpu_blocks, aic_backend, aic_system, aic_backend_version, aic_tp_size,
            aic_model_path, aic_moe_tp_size, aic_moe_ep_size, aic_attention_dp_size, aic_nextn,
            aic_nextn_accept_rates, aic_mtp_seed, aic_gemm_dtype, aic_moe_dtype, aic_fmha_dtype,
            aic_kv_cache_dtype, aic_comm_dtype, gpu_memory_utilization, mem_fraction_static,
            free_gpu_memory_fraction, enable_prefix_caching, worker_type,
        ))
    }

    fn __repr__(&self) -> String {
        let json = serde_json::to_string(&self.inner).unwrap_or_else(|e| e.to_string());
        format!("MockEngineArgs({json})")
    }
}

/// `EntrypointArgs(mocker_engine_args=...)`: a `MockEngineArgs`, or the reference 1.6.x
/// mapping form `{"engine": {...}, "dynamo": {...}, <launch options>}` (an unknown key or a
/// bad value raises `ValueError` naming it).
pub(crate) fn mock_engine_args_from_py(obj: &Bound<'_, PyAny>) -> PyResult<MockEngineArgs> {
    if let Ok(args) = obj.cast::<PyMockEngineArgs>() {
        return Ok(args.borrow().inner.clone());
    }
    if !obj.is_instance(&obj.py().import("collections.abc")?.getattr("Mapping")?)? {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "mocker_engine_args must be a MockEngineArgs or a mapping, not {}",
            obj.get_type().name()?
        )));
    }
    let config = py_to_json(
        &obj.py()
            .import("builtins")?
            .getattr("dict")?
            .call1((obj,))?,
    )?;
    MockEngineArgs::from_launch_config(config).map_err(mocker_error)
}

/// Register the mocker configuration classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyReasoningConfig>()?;
    m.add_class::<PySglangArgs>()?;
    m.add_class::<PyTrtllmArgs>()?;
    m.add_class::<PyMockEngineArgs>()?;
    Ok(())
}
