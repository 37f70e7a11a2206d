//! `MockEngineArgs` (wrapping `dynamo_llm::mocker::MockEngineArgs`) and the option classes
//! it takes: `ReasoningConfig`, `SglangArgs`, `TrtllmArgs`.
//!
//! Every constructor and `with_overrides` builds one JSON object of the given values and
//! hands it to `MockEngineArgs::from_json`, so defaults, validation and the handling of
//! accepted-but-unmodelled options live in one place (the core crate). `None` (and
//! `block_size=0`) mean "the engine's default".

use std::path::PathBuf;

use dynamo_llm::mocker::{MockEngineArgs, MockWorkerType};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::llm_error;

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
#[pyclass(name = "MockEngineArgs", module = "dynamo._core", from_py_object)]
#[derive(Clone)]
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
        let mut inner = MockEngineArgs::from_json(json).map_err(llm_error)?;
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

    /// An accepted-but-unmodelled option's value.
    fn unsupported<T: serde::de::DeserializeOwned>(&self, name: &str) -> Option<T> {
        self.inner
            .unsupported
            .get(name)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    fn set_unsupported(&mut self, name: &str, value: serde_json::Value) -> PyResult<()> {
        *self = self.overridden(serde_json::json!({ name: value }))?;
        if value.is_null() {
            self.inner.unsupported.remove(name);
        }
        Ok(())
    }
}

#[pymethods]
impl PyMockEngineArgs {
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
        let mut given = serde_json::Map::new();
        given.insert("engine_type".to_owned(), serde_json::json!(engine_type));
        given.insert(
            "num_gpu_blocks".to_owned(),
            serde_json::json!(num_gpu_blocks),
        );
        given.insert("block_size".to_owned(), serde_json::json!(block_size));
        given.insert("max_num_seqs".to_owned(), serde_json::json!(max_num_seqs));
        given.insert(
            "max_num_batched_tokens".to_owned(),
            serde_json::json!(max_num_batched_tokens),
        );
        given.insert(
            "enable_prefix_caching".to_owned(),
            serde_json::json!(enable_prefix_caching),
        );
        given.insert(
            "enable_chunked_prefill".to_owned(),
            serde_json::json!(enable_chunked_prefill),
        );
        given.insert("speedup_ratio".to_owned(), serde_json::json!(speedup_ratio));
        given.insert(
            "decode_speedup_ratio".to_owned(),
            serde_json::json!(decode_speedup_ratio),
        );
        given.insert("dp_size".to_owned(), serde_json::json!(dp_size));
        given.insert("startup_time".to_owned(), serde_json::json!(startup_time));
        given.insert("worker_type".to_owned(), serde_json::json!(worker_type));
        given.insert(
            "planner_profile_data".to_owned(),
            serde_json::json!(planner_profile_data.map(|p| p.display().to_string())),
        );
        given.insert("aic_backend".to_owned(), serde_json::json!(aic_backend));
        given.insert("aic_system".to_owned(), serde_json::json!(aic_system));
        given.insert(
            "aic_backend_version".to_owned(),
            serde_json::json!(aic_backend_version),
        );
        given.insert("aic_tp_size".to_owned(), serde_json::json!(aic_tp_size));
        given.insert(
            "aic_model_path".to_owned(),
            serde_json::json!(aic_model_path),
        );
        given.insert(
            "aic_moe_tp_size".to_owned(),
            serde_json::json!(aic_moe_tp_size),
        );
        given.insert(
            "aic_moe_ep_size".to_owned(),
            serde_json::json!(aic_moe_ep_size),
        );
        given.insert(
            "aic_attention_dp_size".to_owned(),
            serde_json::json!(aic_attention_dp_size),
        );
        given.insert("aic_nextn".to_owned(), serde_json::json!(aic_nextn));
        given.insert(
            "aic_nextn_accept_rates".to_owned(),
            serde_json::json!(aic_nextn_accept_rates),
        );
        given.insert("aic_mtp_seed".to_owned(), serde_json::json!(aic_mtp_seed));
        given.insert(
            "aic_gemm_dtype".to_owned(),
            serde_json::json!(aic_gemm_dtype),
        );
        given.insert("aic_moe_dtype".to_owned(), serde_json::json!(aic_moe_dtype));
        given.insert(
            "aic_fmha_dtype".to_owned(),
            serde_json::json!(aic_fmha_dtype),
        );
        given.insert(
            "aic_kv_cache_dtype".to_owned(),
            serde_json::json!(aic_kv_cache_dtype),
        );
        given.insert(
            "aic_comm_dtype".to_owned(),
            serde_json::json!(aic_comm_dtype),
        );
        given.insert(
            "gpu_memory_utilization".to_owned(),
            serde_json::json!(gpu_memory_utilization),
        );
        given.insert(
            "mem_fraction_static".to_owned(),
            serde_json::json!(mem_fraction_static),
        );
        given.insert(
            "free_gpu_memory_fraction".to_owned(),
            serde_json::json!(free_gpu_memory_fraction),
        );
        given.insert(
            "enable_local_indexer".to_owned(),
            serde_json::json!(enable_local_indexer),
        );
        given.insert(
            "bootstrap_port".to_owned(),
            serde_json::json!(bootstrap_port),
        );
        given.insert(
            "handoff_session_timeout_ms".to_owned(),
            serde_json::json!(handoff_session_timeout_ms),
        );
        given.insert(
            "kv_bytes_per_token".to_owned(),
            serde_json::json!(kv_bytes_per_token),
        );
        given.insert(
            "kv_transfer_bandwidth".to_owned(),
            serde_json::json!(kv_transfer_bandwidth),
        );
        given.insert(
            "kv_transfer_timing_mode".to_owned(),
            serde_json::json!(kv_transfer_timing_mode),
        );
        given.insert(
            "reasoning".to_owned(),
            serde_json::json!(reasoning.map(|v| v.inner.clone())),
        );
        given.insert(
            "response_replay_trace_path".to_owned(),
            serde_json::json!(response_replay_trace_path.map(|p| p.display().to_string())),
        );
        given.insert(
            "zmq_kv_events_port".to_owned(),
            serde_json::json!(zmq_kv_events_port),
        );
        given.insert(
            "zmq_replay_port".to_owned(),
            serde_json::json!(zmq_replay_port),
        );
        given.insert(
            "preemption_mode".to_owned(),
            serde_json::json!(preemption_mode),
        );
        given.insert(
            "router_queue_policy".to_owned(),
            serde_json::json!(router_queue_policy),
        );
        given.insert(
            "sglang".to_owned(),
            serde_json::json!(sglang.map(|v| v.inner.clone())),
        );
        given.insert(
            "trtllm".to_owned(),
            serde_json::json!(trtllm.map(|v| v.inner.clone())),
        );
        given.insert("num_g2_blocks".to_owned(), serde_json::json!(num_g2_blocks));
        given.insert("num_g3_blocks".to_owned(), serde_json::json!(num_g3_blocks));
        given.insert(
            "offload_batch_size".to_owned(),
            serde_json::json!(offload_batch_size),
        );
        given.insert(
            "bandwidth_g1_to_g2_gbps".to_owned(),
            serde_json::json!(bandwidth_g1_to_g2_gbps),
        );
        given.insert(
            "bandwidth_g2_to_g1_gbps".to_owned(),
            serde_json::json!(bandwidth_g2_to_g1_gbps),
        );
        given.insert(
            "bandwidth_g2_to_g3_gbps".to_owned(),
            serde_json::json!(bandwidth_g2_to_g3_gbps),
        );
        given.insert(
            "bandwidth_g3_to_g2_gbps".to_owned(),
            serde_json::json!(bandwidth_g3_to_g2_gbps),
        );
        given.insert(
            "enable_g4_storage".to_owned(),
            serde_json::json!(enable_g4_storage),
        );
        given.insert(
            "bandwidth_g2_to_g4_gbps".to_owned(),
            serde_json::json!(bandwidth_g2_to_g4_gbps),
        );
        given.insert(
            "bandwidth_g4_to_g2_gbps".to_owned(),
            serde_json::json!(bandwidth_g4_to_g2_gbps),
        );
        given.insert("max_model_len".to_owned(), serde_json::json!(max_model_len));
        Self::from_given(serde_json::Value::Object(given))
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
        let mut overrides = serde_json::Map::new();
        overrides.insert(
            "bootstrap_port".to_owned(),
            serde_json::json!(bootstrap_port),
        );
        overrides.insert(
            "zmq_kv_events_port".to_owned(),
            serde_json::json!(zmq_kv_events_port),
        );
        overrides.insert(
            "zmq_replay_port".to_owned(),
            serde_json::json!(zmq_replay_port),
        );
        overrides.insert(
            "kv_bytes_per_token".to_owned(),
            serde_json::json!(kv_bytes_per_token),
        );
        overrides.insert(
            "num_gpu_blocks".to_owned(),
            serde_json::json!(num_gpu_blocks),
        );
        overrides.insert("aic_backend".to_owned(), serde_json::json!(aic_backend));
        overrides.insert("aic_system".to_owned(), serde_json::json!(aic_system));
        overrides.insert(
            "aic_backend_version".to_owned(),
            serde_json::json!(aic_backend_version),
        );
        overrides.insert("aic_tp_size".to_owned(), serde_json::json!(aic_tp_size));
        overrides.insert(
            "aic_model_path".to_owned(),
            serde_json::json!(aic_model_path),
        );
        overrides.insert(
            "aic_moe_tp_size".to_owned(),
            serde_json::json!(aic_moe_tp_size),
        );
        overrides.insert(
            "aic_moe_ep_size".to_owned(),
            serde_json::json!(aic_moe_ep_size),
        );
        overrides.insert(
            "aic_attention_dp_size".to_owned(),
            serde_json::json!(aic_attention_dp_size),
        );
        overrides.insert("aic_nextn".to_owned(), serde_json::json!(aic_nextn));
        overrides.insert(
            "aic_nextn_accept_rates".to_owned(),
            serde_json::json!(aic_nextn_accept_rates),
        );
        overrides.insert("aic_mtp_seed".to_owned(), serde_json::json!(aic_mtp_seed));
        overrides.insert(
            "aic_gemm_dtype".to_owned(),
            serde_json::json!(aic_gemm_dtype),
        );
        overrides.insert("aic_moe_dtype".to_owned(), serde_json::json!(aic_moe_dtype));
        overrides.insert(
            "aic_fmha_dtype".to_owned(),
            serde_json::json!(aic_fmha_dtype),
        );
        overrides.insert(
            "aic_kv_cache_dtype".to_owned(),
            serde_json::json!(aic_kv_cache_dtype),
        );
        overrides.insert(
            "aic_comm_dtype".to_owned(),
            serde_json::json!(aic_comm_dtype),
        );
        overrides.insert(
            "gpu_memory_utilization".to_owned(),
            serde_json::json!(gpu_memory_utilization),
        );
        overrides.insert(
            "mem_fraction_static".to_owned(),
            serde_json::json!(mem_fraction_static),
        );
        overrides.insert(
            "free_gpu_memory_fraction".to_owned(),
            serde_json::json!(free_gpu_memory_fraction),
        );
        overrides.insert(
            "enable_prefix_caching".to_owned(),
            serde_json::json!(enable_prefix_caching),
        );
        overrides.insert("worker_type".to_owned(), serde_json::json!(worker_type));
        self.overridden(serde_json::Value::Object(overrides))
    }

    #[getter]
    fn num_gpu_blocks(&self) -> usize {
        self.inner.num_gpu_blocks
    }

    #[setter]
    fn set_num_gpu_blocks(&mut self, value: usize) -> PyResult<()> {
        *self = self.overridden(serde_json::json!({ "num_gpu_blocks": value }))?;
        Ok(())
    }

    #[getter]
    fn enable_prefix_caching(&self) -> bool {
        self.inner.enable_prefix_caching
    }

    #[setter]
    fn set_enable_prefix_caching(&mut self, value: bool) {
        self.inner.enable_prefix_caching = value;
    }

    #[getter]
    fn worker_type(&self) -> &'static str {
        match self.inner.worker_type {
            MockWorkerType::Aggregated => "aggregated",
            MockWorkerType::Prefill => "prefill",
            MockWorkerType::Decode => "decode",
        }
    }

    #[setter]
    fn set_worker_type(&mut self, value: &str) -> PyResult<()> {
        *self = self.overridden(serde_json::json!({ "worker_type": value }))?;
        Ok(())
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size
    }

    #[getter]
    fn max_model_len(&self) -> Option<usize> {
        self.inner.max_model_len
    }

    #[getter]
    fn max_num_seqs(&self) -> Option<usize> {
        Some(self.inner.max_num_seqs)
    }

    #[getter]
    fn max_num_batched_tokens(&self) -> Option<usize> {
        Some(self.inner.max_num_batched_tokens)
    }

    #[getter]
    fn enable_local_indexer(&self) -> bool {
        self.inner.enable_local_indexer
    }

    #[getter]
    fn dp_size(&self) -> u32 {
        self.inner.dp_size
    }

    #[getter]
    fn engine_type(&self) -> String {
        self.inner.engine_type.clone()
    }

    #[getter]
    fn bootstrap_port(&self) -> Option<u16> {
        self.unsupported("bootstrap_port").unwrap_or_default()
    }

    #[getter]
    fn handoff_session_timeout_ms(&self) -> u64 {
        self.unsupported("handoff_session_timeout_ms")
            .unwrap_or(300_000)
    }

    #[getter]
    fn kv_transfer_timing_mode(&self) -> String {
        self.unsupported("kv_transfer_timing_mode")
            .unwrap_or("full_prompt".to_owned())
    }

    #[getter]
    fn response_replay_trace_path(&self) -> Option<PathBuf> {
        self.unsupported("response_replay_trace_path")
            .unwrap_or_default()
    }

    #[getter]
    fn num_g2_blocks(&self) -> Option<u64> {
        self.unsupported("num_g2_blocks").unwrap_or_default()
    }

    #[getter]
    fn num_g3_blocks(&self) -> Option<u64> {
        self.unsupported("num_g3_blocks").unwrap_or_default()
    }

    #[getter]
    fn offload_batch_size(&self) -> Option<u64> {
        self.unsupported("offload_batch_size").unwrap_or_default()
    }

    #[getter]
    fn bandwidth_g1_to_g2_gbps(&self) -> Option<f64> {
        self.unsupported("bandwidth_g1_to_g2_gbps")
            .unwrap_or_default()
    }

    #[getter]
    fn bandwidth_g2_to_g1_gbps(&self) -> Option<f64> {
        self.unsupported("bandwidth_g2_to_g1_gbps")
            .unwrap_or_default()
    }

    #[getter]
    fn bandwidth_g2_to_g3_gbps(&self) -> Option<f64> {
        self.unsupported("bandwidth_g2_to_g3_gbps")
            .unwrap_or_default()
    }

    #[getter]
    fn bandwidth_g3_to_g2_gbps(&self) -> Option<f64> {
        self.unsupported("bandwidth_g3_to_g2_gbps")
            .unwrap_or_default()
    }

    #[getter]
    fn bandwidth_g2_to_g4_gbps(&self) -> Option<f64> {
        self.unsupported("bandwidth_g2_to_g4_gbps")
            .unwrap_or_default()
    }

    #[getter]
    fn bandwidth_g4_to_g2_gbps(&self) -> Option<f64> {
        self.unsupported("bandwidth_g4_to_g2_gbps")
            .unwrap_or_default()
    }

    #[getter]
    fn enable_g4_storage(&self) -> bool {
        self.unsupported("enable_g4_storage").unwrap_or(false)
    }

    #[getter]
    fn aic_backend(&self) -> Option<String> {
        self.unsupported("aic_backend").unwrap_or_default()
    }

    #[setter]
    fn set_aic_backend(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_backend", serde_json::json!(value))
    }

    #[getter]
    fn aic_system(&self) -> Option<String> {
        self.unsupported("aic_system").unwrap_or_default()
    }

    #[setter]
    fn set_aic_system(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_system", serde_json::json!(value))
    }

    #[getter]
    fn aic_backend_version(&self) -> Option<String> {
        self.unsupported("aic_backend_version").unwrap_or_default()
    }

    #[setter]
    fn set_aic_backend_version(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_backend_version", serde_json::json!(value))
    }

    #[getter]
    fn aic_model_path(&self) -> Option<String> {
        self.unsupported("aic_model_path").unwrap_or_default()
    }

    #[setter]
    fn set_aic_model_path(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_model_path", serde_json::json!(value))
    }

    #[getter]
    fn aic_gemm_dtype(&self) -> Option<String> {
        self.unsupported("aic_gemm_dtype").unwrap_or_default()
    }

    #[setter]
    fn set_aic_gemm_dtype(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_gemm_dtype", serde_json::json!(value))
    }

    #[getter]
    fn aic_moe_dtype(&self) -> Option<String> {
        self.unsupported("aic_moe_dtype").unwrap_or_default()
    }

    #[setter]
    fn set_aic_moe_dtype(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_moe_dtype", serde_json::json!(value))
    }

    #[getter]
    fn aic_fmha_dtype(&self) -> Option<String> {
        self.unsupported("aic_fmha_dtype").unwrap_or_default()
    }

    #[setter]
    fn set_aic_fmha_dtype(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_fmha_dtype", serde_json::json!(value))
    }

    #[getter]
    fn aic_kv_cache_dtype(&self) -> Option<String> {
        self.unsupported("aic_kv_cache_dtype").unwrap_or_default()
    }

    #[setter]
    fn set_aic_kv_cache_dtype(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_kv_cache_dtype", serde_json::json!(value))
    }

    #[getter]
    fn aic_comm_dtype(&self) -> Option<String> {
        self.unsupported("aic_comm_dtype").unwrap_or_default()
    }

    #[setter]
    fn set_aic_comm_dtype(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_comm_dtype", serde_json::json!(value))
    }

    #[getter]
    fn aic_nextn_accept_rates(&self) -> Option<String> {
        self.unsupported("aic_nextn_accept_rates")
            .unwrap_or_default()
    }

    #[setter]
    fn set_aic_nextn_accept_rates(&mut self, value: Option<String>) -> PyResult<()> {
        self.set_unsupported("aic_nextn_accept_rates", serde_json::json!(value))
    }

    #[getter]
    fn aic_tp_size(&self) -> Option<u32> {
        self.unsupported("aic_tp_size").unwrap_or_default()
    }

    #[setter]
    fn set_aic_tp_size(&mut self, value: Option<u32>) -> PyResult<()> {
        self.set_unsupported("aic_tp_size", serde_json::json!(value))
    }

    #[getter]
    fn aic_moe_tp_size(&self) -> Option<u32> {
        self.unsupported("aic_moe_tp_size").unwrap_or_default()
    }

    #[setter]
    fn set_aic_moe_tp_size(&mut self, value: Option<u32>) -> PyResult<()> {
        self.set_unsupported("aic_moe_tp_size", serde_json::json!(value))
    }

    #[getter]
    fn aic_moe_ep_size(&self) -> Option<u32> {
        self.unsupported("aic_moe_ep_size").unwrap_or_default()
    }

    #[setter]
    fn set_aic_moe_ep_size(&mut self, value: Option<u32>) -> PyResult<()> {
        self.set_unsupported("aic_moe_ep_size", serde_json::json!(value))
    }

    #[getter]
    fn aic_attention_dp_size(&self) -> Option<u32> {
        self.unsupported("aic_attention_dp_size")
            .unwrap_or_default()
    }

    #[setter]
    fn set_aic_attention_dp_size(&mut self, value: Option<u32>) -> PyResult<()> {
        self.set_unsupported("aic_attention_dp_size", serde_json::json!(value))
    }

    #[getter]
    fn aic_nextn(&self) -> Option<u32> {
        self.unsupported("aic_nextn").unwrap_or_default()
    }

    #[setter]
    fn set_aic_nextn(&mut self, value: Option<u32>) -> PyResult<()> {
        self.set_unsupported("aic_nextn", serde_json::json!(value))
    }

    #[getter]
    fn aic_mtp_seed(&self) -> u64 {
        self.unsupported("aic_mtp_seed").unwrap_or(42)
    }

    #[setter]
    fn set_aic_mtp_seed(&mut self, value: u64) -> PyResult<()> {
        self.set_unsupported("aic_mtp_seed", serde_json::json!(value))
    }

    #[getter]
    fn gpu_memory_utilization(&self) -> Option<f64> {
        self.unsupported("gpu_memory_utilization")
            .unwrap_or_default()
    }

    #[setter]
    fn set_gpu_memory_utilization(&mut self, value: Option<f64>) -> PyResult<()> {
        self.set_unsupported("gpu_memory_utilization", serde_json::json!(value))
    }

    #[getter]
    fn mem_fraction_static(&self) -> Option<f64> {
        self.unsupported("mem_fraction_static").unwrap_or_default()
    }

    #[setter]
    fn set_mem_fraction_static(&mut self, value: Option<f64>) -> PyResult<()> {
        self.set_unsupported("mem_fraction_static", serde_json::json!(value))
    }

    #[getter]
    fn free_gpu_memory_fraction(&self) -> Option<f64> {
        self.unsupported("free_gpu_memory_fraction")
            .unwrap_or_default()
    }

    #[setter]
    fn set_free_gpu_memory_fraction(&mut self, value: Option<f64>) -> PyResult<()> {
        self.set_unsupported("free_gpu_memory_fraction", serde_json::json!(value))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.borrow().inner == self.inner)
    }

    fn __repr__(&self) -> String {
        let json = serde_json::to_string(&self.inner).unwrap_or_else(|e| e.to_string());
        format!("MockEngineArgs({json})")
    }
}

/// Register the mocker configuration classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyReasoningConfig>()?;
    m.add_class::<PySglangArgs>()?;
    m.add_class::<PyTrtllmArgs>()?;
    m.add_class::<PyMockEngineArgs>()?;
    Ok(())
}
