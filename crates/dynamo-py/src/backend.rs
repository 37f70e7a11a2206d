//! `dynamo._core.backend`: a worker built from a Python engine object.
//!
//! The submodule is registered in `sys.modules` as `dynamo._core.backend`, as the
//! reference does. Its classes are plain records (read-only properties, as the
//! reference's) and `Worker`, whose `run()` drives the engine through its life:
//! `await engine.start(instance_id)` → a [`EngineConfig`]; `register_model` with the card it
//! describes; `await engine.on_endpoint_ready(endpoint)` when the engine has it;
//! `Endpoint.serve_endpoint(engine.generate)` until shutdown (SIGTERM/SIGINT); then
//! `await engine.cleanup()`. The sequencing is `backend.py` (every step awaits Python);
//! each step is the project's public API.

use std::ffi::CString;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

use crate::llm::model_card::PyModelInput;

/// Register the `backend` submodule on `m` (and in `sys.modules`).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let sub = PyModule::new(py, "backend")?;
    sub.add_class::<DisaggregationMode>()?;
    sub.add_class::<LlmRegistration>()?;
    sub.add_class::<EngineConfig>()?;
    sub.add_class::<RuntimeConfig>()?;
    sub.add_class::<WorkerConfig>()?;
    sub.add_class::<Worker>()?;
    m.add_submodule(&sub)?;
    py.import("sys")?
        .getattr("modules")?
        .set_item("dynamo._core.backend", &sub)?;
    Ok(())
}

static ORCHESTRATOR: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The `backend.py` helper module.
fn orchestrator(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    ORCHESTRATOR
        .get_or_try_init(py, || {
            let code = CString::new(include_str!("backend.py"))
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            PyModule::from_code(
                py,
                &code,
                c"dynamo/_core/backend.py",
                c"dynamo._core._backend",
            )
            .map(Bound::unbind)
        })
        .map(|m| m.bind(py))
}

/// The role of the worker (the reference's integer values).
#[pyclass(module = "dynamo._core.backend", eq, eq_int, frozen, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DisaggregationMode {
    Aggregated = 1,
    Prefill = 2,
    Decode = 3,
    Encode = 4,
}

#[pymethods]
impl DisaggregationMode {
    /// The member's name (`backend.py` maps it to a `WorkerType`).
    #[getter]
    fn name(&self) -> String {
        format!("{self:?}")
    }
}

/// What the engine reports about its model and capacity (read-only).
#[pyclass(module = "dynamo._core.backend", frozen, get_all, from_py_object)]
#[derive(Clone, Debug, Default)]
pub(crate) struct LlmRegistration {
    context_length: Option<u32>,
    kv_cache_block_size: Option<u32>,
    total_kv_blocks: Option<u64>,
    max_num_seqs: Option<u64>,
    max_num_batched_tokens: Option<u64>,
    data_parallel_size: Option<u32>,
    data_parallel_start_rank: Option<u32>,
    bootstrap_host: Option<String>,
    bootstrap_port: Option<u16>,
    enable_eagle: bool,
    max_gpu_lora_count: Option<u32>,
}

#[pymethods]
impl LlmRegistration {
    #[new]
    #[pyo3(signature = (
        context_length = None, kv_cache_block_size = None, total_kv_blocks = None,
        max_num_seqs = None, max_num_batched_tokens = None, data_parallel_size = None,
        data_parallel_start_rank = None, bootstrap_host = None, bootstrap_port = None,
        enable_eagle = false, max_gpu_lora_count = None
    ))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn new(
        context_length: Option<u32>,
        kv_cache_block_size: Option<u32>,
        total_kv_blocks: Option<u64>,
        max_num_seqs: Option<u64>,
        max_num_batched_tokens: Option<u64>,
        data_parallel_size: Option<u32>,
        data_parallel_start_rank: Option<u32>,
        bootstrap_host: Option<String>,
        bootstrap_port: Option<u16>,
        enable_eagle: bool,
        max_gpu_lora_count: Option<u32>,
    ) -> PyResult<Self> {
        if kv_cache_block_size == Some(0) {
            return Err(PyValueError::new_err(
                "kv_cache_block_size must be positive",
            ));
        }
        Ok(Self {
            context_length,
            kv_cache_block_size,
            total_kv_blocks,
            max_num_seqs,
            max_num_batched_tokens,
            data_parallel_size,
            data_parallel_start_rank,
            bootstrap_host,
            bootstrap_port,
            enable_eagle,
            max_gpu_lora_count,
        })
    }
}

/// What `engine.start()` returns: the model to register (read-only).
#[pyclass(module = "dynamo._core.backend", frozen, get_all)]
pub(crate) struct EngineConfig {
    model: String,
    served_model_name: Option<String>,
    runtime_data: Py<PyDict>,
    llm: Option<Py<LlmRegistration>>,
    model_aliases: Vec<String>,
}

#[pymethods]
impl EngineConfig {
    #[new]
    #[pyo3(signature = (model, served_model_name = None, runtime_data = None, llm = None, model_aliases = None))]
    fn new(
        py: Python<'_>,
        model: String,
        served_model_name: Option<String>,
        runtime_data: Option<Bound<'_, PyDict>>,
        llm: Option<Py<LlmRegistration>>,
        model_aliases: Option<Vec<String>>,
    ) -> Self {
        Self {
            model,
            served_model_name,
            runtime_data: runtime_data.map_or_else(|| PyDict::new(py).unbind(), Bound::unbind),
            llm,
            model_aliases: model_aliases.unwrap_or_default(),
        }
    }
}

/// Transport selection of the worker's runtime; `None` keeps the environment's default.
#[pyclass(module = "dynamo._core.backend", frozen, get_all, from_py_object)]
#[derive(Clone, Debug, Default)]
pub(crate) struct RuntimeConfig {
    discovery_backend: Option<String>,
    request_plane: Option<String>,
    event_plane: Option<String>,
    response_plane: Option<String>,
}

#[pymethods]
impl RuntimeConfig {
    #[new]
    #[pyo3(signature = (discovery_backend = None, request_plane = None, event_plane = None, *, response_plane = None))]
    fn new(
        discovery_backend: Option<String>,
        request_plane: Option<String>,
        event_plane: Option<String>,
        response_plane: Option<String>,
    ) -> Self {
        Self {
            discovery_backend,
            request_plane,
            event_plane,
            response_plane,
        }
    }
}

/// Where and how the worker serves (read-only).
#[pyclass(module = "dynamo._core.backend", frozen, get_all)]
pub(crate) struct WorkerConfig {
    namespace: String,
    component: String,
    endpoint: String,
    model_name: String,
    served_model_name: Option<String>,
    model_input: PyModelInput,
    endpoint_types: String,
    custom_jinja_template: Option<String>,
    tool_call_parser: Option<String>,
    reasoning_parser: Option<String>,
    exclude_tools_when_tool_choice_none: bool,
    enable_local_indexer: bool,
    enable_kv_routing: bool,
    metrics_labels: Vec<(String, String)>,
    runtime: Option<RuntimeConfig>,
    disaggregation_mode: DisaggregationMode,
    health_check_payload: Option<Py<PyAny>>,
    structural_tag: Option<Py<PyAny>>,
    route_to_encoder: bool,
    media_decoder: Option<Py<PyAny>>,
    media_fetcher: Option<Py<PyAny>>,
    kv_state_endpoint: Option<String>,
    default_thinking_mode: Option<Py<PyAny>>,
}

#[pymethods]
impl WorkerConfig {
    #[new]
    #[pyo3(signature = (
        namespace, component = "backend".to_owned(), endpoint = "generate".to_owned(),
        model_name = String::new(), served_model_name = None, model_input = PyModelInput::Tokens,
        endpoint_types = "chat,completions".to_owned(), custom_jinja_template = None,
        tool_call_parser = None, reasoning_parser = None,
        exclude_tools_when_tool_choice_none = true, enable_local_indexer = true,
        enable_kv_routing = true, metrics_labels = Vec::new(), runtime = None,
        disaggregation_mode = DisaggregationMode::Aggregated, health_check_payload = None,
        structural_tag = None, route_to_encoder = false, media_decoder = None,
        media_fetcher = None, kv_state_endpoint = None, default_thinking_mode = None
    ))]
    #[expect(clippy::too_many_arguments, reason = "the Python signature")]
    fn new(
        py: Python<'_>,
        namespace: String,
        component: String,
        endpoint: String,
        model_name: String,
        served_model_name: Option<String>,
        model_input: PyModelInput,
        endpoint_types: String,
        custom_jinja_template: Option<String>,
        tool_call_parser: Option<String>,
        reasoning_parser: Option<String>,
        exclude_tools_when_tool_choice_none: bool,
        enable_local_indexer: bool,
        enable_kv_routing: bool,
        metrics_labels: Vec<(String, String)>,
        runtime: Option<RuntimeConfig>,
        disaggregation_mode: DisaggregationMode,
        health_check_payload: Option<Py<PyAny>>,
        structural_tag: Option<Py<PyAny>>,
        route_to_encoder: bool,
        media_decoder: Option<Py<PyAny>>,
        media_fetcher: Option<Py<PyAny>>,
        kv_state_endpoint: Option<String>,
        default_thinking_mode: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        // Fail at construction, not when the worker starts, on a name that cannot serve
        // or an endpoint type that does not exist.
        dynamo_runtime::EndpointId::new(&namespace, &component, &endpoint)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        orchestrator(py)?.call_method1("model_type", (&endpoint_types,))?;
        Ok(Self {
            namespace,
            component,
            endpoint,
            model_name,
            served_model_name,
            model_input,
            endpoint_types,
            custom_jinja_template,
            tool_call_parser,
            reasoning_parser,
            exclude_tools_when_tool_choice_none,
            enable_local_indexer,
            enable_kv_routing,
            metrics_labels,
            runtime,
            disaggregation_mode,
            health_check_payload,
            structural_tag,
            route_to_encoder,
            media_decoder,
            media_fetcher,
            kv_state_endpoint,
            default_thinking_mode,
        })
    }
}

/// A worker serving `engine` as `config` describes, on `event_loop`.
#[pyclass(module = "dynamo._core.backend", frozen)]
pub(crate) struct Worker {
    engine: Py<PyAny>,
    config: Py<WorkerConfig>,
    event_loop: Py<PyAny>,
    raw: bool,
}

#[pymethods]
impl Worker {
    #[new]
    #[pyo3(signature = (engine, config, event_loop, raw = false))]
    fn new(engine: Py<PyAny>, config: Py<WorkerConfig>, event_loop: Py<PyAny>, raw: bool) -> Self {
        Self {
            engine,
            config,
            event_loop,
            raw,
        }
    }

    /// Start the engine, register its model and serve it until the runtime shuts down
    /// (an awaitable).
    fn run<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let types = (
            py.get_type::<EngineConfig>(),
            py.get_type::<LlmRegistration>(),
        );
        orchestrator(py)?.call_method1(
            "run_worker",
            (
                &self.engine,
                &self.config,
                &self.event_loop,
                self.raw,
                types.0,
                types.1,
            ),
        )
    }
}
