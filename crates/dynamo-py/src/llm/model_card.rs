//! Model bindings: `ModelInput`, `ModelType`, `WorkerType`, `ModelRuntimeConfig`,
//! `ModelDeploymentCard`, `lora_name_to_id`, `fetch_model`.
//!
//! The types, their validation and the card logic live in `dynamo_llm::model_card`; these
//! classes convert arguments and delegate.

use std::collections::{BTreeMap, HashMap, HashSet};

use dynamo_llm::model_card::{
    self, ModelDeploymentCard, ModelInput, ModelRuntimeConfig, ModelType, WorkerType,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::errors::llm_error;
use crate::json::{json_to_py, py_to_json};

/// What a worker's `generate` receives.
#[pyclass(
    name = "ModelInput",
    module = "dynamo._core",
    eq,
    eq_int,
    frozen,
    hash,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum PyModelInput {
    Text = 1,
    Tokens = 2,
    Tensor = 3,
}

impl From<PyModelInput> for ModelInput {
    fn from(v: PyModelInput) -> Self {
        match v {
            PyModelInput::Text => Self::Text,
            PyModelInput::Tokens => Self::Tokens,
            PyModelInput::Tensor => Self::Tensor,
        }
    }
}

#[pymethods]
impl PyModelInput {
    fn __repr__(&self) -> String {
        format!("ModelInput.{self:?}")
    }

    fn __str__(&self) -> String {
        self.__repr__()
    }
}

/// The role of a worker in (dis)aggregated serving.
#[pyclass(
    name = "WorkerType",
    module = "dynamo._core",
    eq,
    eq_int,
    frozen,
    hash,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum PyWorkerType {
    Prefill = 1,
    Decode = 2,
    Encode = 3,
    Aggregated = 4,
}

impl From<PyWorkerType> for WorkerType {
    fn from(v: PyWorkerType) -> Self {
        match v {
            PyWorkerType::Prefill => Self::Prefill,
            PyWorkerType::Decode => Self::Decode,
            PyWorkerType::Encode => Self::Encode,
            PyWorkerType::Aggregated => Self::Aggregated,
        }
    }
}

#[pymethods]
impl PyWorkerType {
    fn __repr__(&self) -> String {
        format!("WorkerType.{self:?}")
    }

    fn __str__(&self) -> &'static str {
        WorkerType::from(*self).as_str()
    }
}

/// A set of OpenAI-style API surfaces (bit flags; combine with `|`).
#[pyclass(name = "ModelType", module = "dynamo._core", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct PyModelType {
    pub(crate) inner: ModelType,
}

#[pymethods]
impl PyModelType {
    #[classattr]
    #[pyo3(name = "Empty")]
    fn empty() -> Self {
        Self {
            inner: ModelType::EMPTY,
        }
    }
    #[classattr]
    #[pyo3(name = "Chat")]
    fn chat() -> Self {
        Self {
            inner: ModelType::CHAT,
        }
    }
    #[classattr]
    #[pyo3(name = "Completions")]
    fn completions() -> Self {
        Self {
            inner: ModelType::COMPLETIONS,
        }
    }
    #[classattr]
    #[pyo3(name = "Embedding")]
    fn embedding() -> Self {
        Self {
            inner: ModelType::EMBEDDING,
        }
    }
    #[classattr]
    #[pyo3(name = "TensorBased")]
    fn tensor_based() -> Self {
        Self {
            inner: ModelType::TENSOR_BASED,
        }
    }
    #[classattr]
    #[pyo3(name = "Prefill")]
    fn prefill() -> Self {
        Self {
            inner: ModelType::PREFILL,
        }
    }
    #[classattr]
    #[pyo3(name = "Images")]
    fn images() -> Self {
        Self {
            inner: ModelType::IMAGES,
        }
    }
    #[classattr]
    #[pyo3(name = "Audios")]
    fn audios() -> Self {
        Self {
            inner: ModelType::AUDIOS,
        }
    }
    #[classattr]
    #[pyo3(name = "Videos")]
    fn videos() -> Self {
        Self {
            inner: ModelType::VIDEOS,
        }
    }
    #[classattr]
    #[pyo3(name = "Realtime")]
    fn realtime() -> Self {
        Self {
            inner: ModelType::REALTIME,
        }
    }
    #[classattr]
    #[pyo3(name = "Classify")]
    fn classify() -> Self {
        Self {
            inner: ModelType::CLASSIFY,
        }
    }
    #[classattr]
    #[pyo3(name = "Pooling")]
    fn pooling() -> Self {
        Self {
            inner: ModelType::POOLING,
        }
    }

    fn __or__(&self, other: &Self) -> Self {
        Self {
            inner: self.inner | other.inner,
        }
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        u64::from(self.inner.bits())
    }

    fn __int__(&self) -> u32 {
        self.inner.bits()
    }

    /// Names of the set flags joined by `,` (`chat,completions`); empty for `Empty`.
    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("ModelType({:?})", self.inner.to_string())
    }

    #[pyo3(signature = ())]
    fn supports_chat(&self) -> bool {
        self.inner.supports_chat()
    }

    #[pyo3(signature = ())]
    fn supports_completions(&self) -> bool {
        self.inner.supports_completions()
    }

    #[pyo3(signature = ())]
    fn supports_embedding(&self) -> bool {
        self.inner.supports_embedding()
    }

    #[pyo3(signature = ())]
    fn supports_classify(&self) -> bool {
        self.inner.supports_classify()
    }

    #[pyo3(signature = ())]
    fn supports_pooling(&self) -> bool {
        self.inner.supports_pooling()
    }
}

/// Runtime facts a worker advertises in its model card.
#[pyclass(name = "ModelRuntimeConfig", module = "dynamo._core", from_py_object)]
#[derive(Clone, Default)]
pub(crate) struct PyModelRuntimeConfig {
    pub(crate) inner: ModelRuntimeConfig,
}

#[pymethods]
impl PyModelRuntimeConfig {
    #[new]
    #[pyo3(signature = ())]
    fn new() -> Self {
        Self::default()
    }

    #[getter(context_length)]
    fn get_context_length(&self) -> Option<u32> {
        self.inner.context_length
    }
    #[setter(context_length)]
    fn set_context_length(&mut self, value: Option<u32>) -> PyResult<()> {
        if value == Some(0) {
            return Err(PyValueError::new_err("context_length must be > 0"));
        }
        self.inner.context_length = value;
        Ok(())
    }
    #[getter(total_kv_blocks)]
    fn get_total_kv_blocks(&self) -> Option<u64> {
        self.inner.total_kv_blocks
    }
    #[setter(total_kv_blocks)]
    fn set_total_kv_blocks(&mut self, value: Option<u64>) {
        self.inner.total_kv_blocks = value;
    }
    #[getter(max_num_seqs)]
    fn get_max_num_seqs(&self) -> Option<u64> {
        self.inner.max_num_seqs
    }
    #[setter(max_num_seqs)]
    fn set_max_num_seqs(&mut self, value: Option<u64>) {
        self.inner.max_num_seqs = value;
    }
    #[getter(max_num_batched_tokens)]
    fn get_max_num_batched_tokens(&self) -> Option<u64> {
        self.inner.max_num_batched_tokens
    }
    #[setter(max_num_batched_tokens)]
    fn set_max_num_batched_tokens(&mut self, value: Option<u64>) {
        self.inner.max_num_batched_tokens = value;
    }
    #[getter(tool_call_parser)]
    fn get_tool_call_parser(&self) -> Option<String> {
        self.inner.tool_call_parser.clone()
    }
    #[setter(tool_call_parser)]
    fn set_tool_call_parser(&mut self, value: Option<String>) {
        self.inner.tool_call_parser = value;
    }
    #[getter(reasoning_parser)]
    fn get_reasoning_parser(&self) -> Option<String> {
        self.inner.reasoning_parser.clone()
    }
    #[setter(reasoning_parser)]
    fn set_reasoning_parser(&mut self, value: Option<String>) {
        self.inner.reasoning_parser = value;
    }
    #[getter]
    fn tokenizer_backend(&self) -> Option<String> {
        self.inner.tokenizer_backend.clone()
    }
    #[setter]
    fn set_tokenizer_backend(&mut self, value: Option<String>) -> PyResult<()> {
        if let Some(v) = &value {
            ModelRuntimeConfig::check_tokenizer_backend(v).map_err(llm_error)?;
        }
        self.inner.tokenizer_backend = value;
        Ok(())
    }
    #[getter(exclude_tools_when_tool_choice_none)]
    fn get_exclude_tools(&self) -> bool {
        self.inner.exclude_tools_when_tool_choice_none
    }
    #[setter(exclude_tools_when_tool_choice_none)]
    fn set_exclude_tools(&mut self, value: bool) {
        self.inner.exclude_tools_when_tool_choice_none = value;
    }
    #[getter(data_parallel_start_rank)]
    fn get_dp_start_rank(&self) -> u32 {
        self.inner.data_parallel_start_rank
    }
    #[setter(data_parallel_start_rank)]
    fn set_dp_start_rank(&mut self, value: u32) {
        self.inner.data_parallel_start_rank = value;
    }
    #[getter(data_parallel_size)]
    fn get_dp_size(&self) -> u32 {
        self.inner.data_parallel_size
    }
    #[setter(data_parallel_size)]
    fn set_dp_size(&mut self, value: u32) -> PyResult<()> {
        if value == 0 {
            return Err(PyValueError::new_err("data_parallel_size must be >= 1"));
        }
        self.inner.data_parallel_size = value;
        Ok(())
    }
    #[getter(enable_local_indexer)]
    fn get_enable_local_indexer(&self) -> bool {
        self.inner.enable_local_indexer
    }
    #[setter(enable_local_indexer)]
    fn set_enable_local_indexer(&mut self, value: bool) {
        self.inner.enable_local_indexer = value;
    }
    #[getter(enable_eagle)]
    fn get_enable_eagle(&self) -> bool {
        self.inner.enable_eagle
    }
    #[setter(enable_eagle)]
    fn set_enable_eagle(&mut self, value: bool) {
        self.inner.enable_eagle = value;
    }
    #[getter]
    fn taints(&self) -> HashSet<String> {
        self.inner.taints.iter().cloned().collect()
    }
    #[setter]
    fn set_taints(&mut self, value: HashSet<String>) -> PyResult<()> {
        ModelRuntimeConfig::check_taints(&value).map_err(llm_error)?;
        self.inner.taints = value.into_iter().collect();
        Ok(())
    }
    #[getter(stable_routing_id)]
    fn get_stable_routing_id(&self) -> Option<String> {
        self.inner.stable_routing_id.clone()
    }
    #[setter(stable_routing_id)]
    fn set_stable_routing_id(&mut self, value: Option<String>) {
        self.inner.stable_routing_id = value;
    }
    /// Engine-specific values, each as its JSON text.
    #[getter]
    fn runtime_data(&self) -> HashMap<String, String> {
        self.inner
            .runtime_data
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect()
    }
    #[getter]
    fn topology_domains(&self) -> HashMap<String, String> {
        self.inner.topology_domains.clone().into_iter().collect()
    }
    #[setter]
    fn set_topology_domains(&mut self, value: HashMap<String, String>) {
        self.inner.topology_domains = value.into_iter().collect::<BTreeMap<_, _>>();
    }
    #[getter(kv_transfer_domain)]
    fn get_kv_transfer_domain(&self) -> Option<String> {
        self.inner.kv_transfer_domain.clone()
    }
    #[setter(kv_transfer_domain)]
    fn set_kv_transfer_domain(&mut self, value: Option<String>) {
        self.inner.kv_transfer_domain = value;
    }
    #[getter]
    fn kv_transfer_enforcement(&self) -> Option<String> {
        self.inner
            .kv_transfer_enforcement
            .and_then(|e| serde_json::to_value(e).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
    }
    #[setter]
    fn set_kv_transfer_enforcement(&mut self, value: Option<String>) -> PyResult<()> {
        self.inner.kv_transfer_enforcement =
            ModelRuntimeConfig::parse_kv_transfer_enforcement(value.as_deref())
                .map_err(llm_error)?;
        Ok(())
    }
    #[getter]
    fn kv_transfer_preferred_weight(&self) -> Option<f64> {
        self.inner.kv_transfer_preferred_weight
    }
    #[setter]
    fn set_kv_transfer_preferred_weight(&mut self, value: Option<f64>) -> PyResult<()> {
        if let Some(w) = value
            && !(w.is_finite() && w >= 0.0)
        {
            return Err(PyValueError::new_err(format!(
                "kv_transfer_preferred_weight must be finite and >= 0, got {w}"
            )));
        }
        self.inner.kv_transfer_preferred_weight = value;
        Ok(())
    }
    #[getter]
    fn bootstrap_host(&self) -> Option<String> {
        self.inner.bootstrap_host.clone()
    }
    #[getter]
    fn bootstrap_port(&self) -> Option<u16> {
        self.inner.bootstrap_port
    }
    #[getter(kv_event_publishing_enabled)]
    fn get_kv_event_publishing_enabled(&self) -> Option<bool> {
        self.inner.kv_event_publishing_enabled
    }
    #[setter(kv_event_publishing_enabled)]
    fn set_kv_event_publishing_enabled(&mut self, value: Option<bool>) {
        self.inner.kv_event_publishing_enabled = value;
    }
    #[getter(kv_event_source_mode)]
    fn get_kv_event_source_mode(&self) -> Option<String> {
        self.inner.kv_event_source_mode.clone()
    }
    #[setter(kv_event_source_mode)]
    fn set_kv_event_source_mode(&mut self, value: Option<String>) {
        self.inner.kv_event_source_mode = value;
    }
    #[getter(kv_state_endpoint)]
    fn get_kv_state_endpoint(&self) -> Option<String> {
        self.inner.kv_state_endpoint.clone()
    }
    #[setter(kv_state_endpoint)]
    fn set_kv_state_endpoint(&mut self, value: Option<String>) {
        self.inner.kv_state_endpoint = value;
    }

    /// Store an engine-specific value: JSON text, or any JSON-able object.
    #[pyo3(signature = (key, value))]
    fn set_engine_specific(&mut self, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let json = match value.cast::<PyString>() {
            Ok(s) => s.to_str()?.to_owned(),
            Err(_) => py_to_json(value)?.to_string(),
        };
        self.inner
            .set_engine_specific(key, &json)
            .map_err(llm_error)
    }

    /// An engine-specific value as JSON text, or None.
    #[pyo3(signature = (key))]
    fn get_engine_specific(&self, key: &str) -> Option<String> {
        self.inner.get_engine_specific(key)
    }

    #[pyo3(signature = (mode))]
    fn set_structural_tag_mode(&mut self, mode: &str) -> PyResult<()> {
        self.inner.set_structural_tag_mode(mode).map_err(llm_error)
    }

    #[pyo3(signature = (scope))]
    fn set_structural_tag_scope(&mut self, scope: &str) -> PyResult<()> {
        self.inner
            .set_structural_tag_scope(scope)
            .map_err(llm_error)
    }

    #[pyo3(signature = (schema))]
    fn set_structural_tag_schema(&mut self, schema: &str) -> PyResult<()> {
        self.inner
            .set_structural_tag_schema(schema)
            .map_err(llm_error)
    }

    #[pyo3(signature = (bootstrap_host=None, bootstrap_port=None))]
    fn set_disaggregated_endpoint(
        &mut self,
        bootstrap_host: Option<String>,
        bootstrap_port: Option<u16>,
    ) {
        self.inner
            .set_disaggregated_endpoint(bootstrap_host, bootstrap_port);
    }

    /// Check the whole configuration (`ValueError` naming the first bad field).
    #[pyo3(signature = ())]
    fn validate(&self) -> PyResult<()> {
        self.inner.validate().map_err(llm_error)
    }

    /// The configuration as JSON.
    #[pyo3(signature = ())]
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.borrow().inner == self.inner)
    }

    fn __repr__(&self) -> String {
        let json = serde_json::to_string(&self.inner).unwrap_or_else(|e| e.to_string());
        format!("ModelRuntimeConfig({json})")
    }
}

/// The model metadata a worker registers.
#[pyclass(name = "ModelDeploymentCard", module = "dynamo._core", from_py_object)]
#[derive(Clone)]
pub(crate) struct PyModelDeploymentCard {
    pub(crate) inner: ModelDeploymentCard,
}

#[pymethods]
impl PyModelDeploymentCard {
    /// Build a card from a local model directory.
    #[staticmethod]
    #[pyo3(signature = (path, model_name=None))]
    fn load(path: std::path::PathBuf, model_name: Option<&str>) -> PyResult<Self> {
        ModelDeploymentCard::load_from_disk(&path, model_name)
            .map(|inner| Self { inner })
            .map_err(llm_error)
    }

    #[pyo3(signature = ())]
    fn to_json_str(&self) -> PyResult<String> {
        self.inner.to_json_str().map_err(llm_error)
    }

    #[staticmethod]
    #[pyo3(signature = (json))]
    fn from_json_str(json: &str) -> PyResult<Self> {
        ModelDeploymentCard::from_json_str(json)
            .map(|inner| Self { inner })
            .map_err(llm_error)
    }

    #[pyo3(signature = ())]
    fn model_type(&self) -> PyModelType {
        PyModelType {
            inner: self.inner.model_type,
        }
    }

    #[pyo3(signature = ())]
    fn source_path(&self) -> String {
        self.inner.source_path.clone()
    }

    #[pyo3(signature = ())]
    fn local_dir(&self) -> PyResult<String> {
        let dir = self.inner.local_dir();
        dir.to_str().map(str::to_owned).ok_or_else(|| {
            PyValueError::new_err(format!("local_dir is not valid UTF-8: {}", dir.display()))
        })
    }

    #[pyo3(signature = ())]
    fn name(&self) -> String {
        self.inner.display_name.clone()
    }

    /// The runtime config as a dict.
    #[pyo3(signature = ())]
    fn runtime_config(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let value = serde_json::to_value(&self.inner.runtime_config)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        json_to_py(py, &value)
    }

    /// Checksum of what must agree between workers serving the model.
    #[pyo3(signature = ())]
    fn mdcsum(&self) -> String {
        self.inner.mdcsum()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.borrow().inner == self.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "ModelDeploymentCard(name={:?}, model_type={:?}, source_path={:?})",
            self.inner.display_name,
            self.inner.model_type.to_string(),
            self.inner.source_path
        )
    }
}

/// A deterministic positive 31-bit id for a LoRA adapter name (blake3-based).
#[pyfunction]
#[pyo3(signature = (lora_name))]
fn lora_name_to_id(lora_name: &str) -> i32 {
    model_card::lora_name_to_id(lora_name)
}

/// The local directory of a model: a local path, or a Hugging Face repo id already in the
/// offline cache. Nothing is downloaded; a miss raises `FileNotFoundError` naming the paths
/// tried.
#[pyfunction]
#[pyo3(signature = (remote_name, ignore_weights=false))]
fn fetch_model(
    py: Python<'_>,
    remote_name: String,
    ignore_weights: bool,
) -> PyResult<Bound<'_, PyAny>> {
    crate::aio::py_future(
        py,
        async move {
            let path = model_card::fetch_model(&remote_name, ignore_weights).map_err(llm_error)?;
            Ok(path.display().to_string())
        },
        true,
    )
}

/// Register the model classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyModelInput>()?;
    m.add_class::<PyModelType>()?;
    m.add_class::<PyWorkerType>()?;
    m.add_class::<PyModelRuntimeConfig>()?;
    m.add_class::<PyModelDeploymentCard>()?;
    m.add_function(wrap_pyfunction!(lora_name_to_id, m)?)?;
    m.add_function(wrap_pyfunction!(fetch_model, m)?)?;
    Ok(())
}
