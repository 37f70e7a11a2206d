//! `KserveGrpcService`: the KServe v2 gRPC ingress ([`dynamo_frontend::grpc`]). Each method
//! converts its arguments and calls one function of the core service.

use std::sync::Arc;

use dynamo_frontend::grpc::tensor::TensorModelConfig;
use dynamo_frontend::grpc::{DEFAULT_GRPC_PORT, KserveService};
use dynamo_frontend::http::FrontendConfig;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::llm_error;
use crate::json::py_to_json;
use crate::llm::model_card::PyModelRuntimeConfig;
use crate::llm::python_engine::openai_engine;
use crate::runtime::distributed_runtime::DistributedRuntime;

/// Register the class.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KserveGrpcService>()
}

fn not_found(model: &str) -> PyErr {
    PyValueError::new_err(format!("Model not found: {model}"))
}

/// A KServe v2 gRPC ingress following the runtime's model cards, plus the in-process
/// models added with `add_completions_model`, `add_chat_completions_model` and
/// `add_tensor_model`.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct KserveGrpcService {
    inner: Arc<KserveService>,
}

#[pymethods]
impl KserveGrpcService {
    #[new]
    #[pyo3(signature = (port = None, host = None))]
    fn new(port: Option<u16>, host: Option<String>) -> Self {
        let mut c = FrontendConfig {
            port: DEFAULT_GRPC_PORT,
            ..FrontendConfig::default()
        };
        if let Some(p) = port {
            c.port = p;
        }
        if let Some(h) = host {
            c.host = h;
        }
        Self {
            inner: KserveService::new(c),
        }
    }

    /// Serve `engine` as completions model `model` (`text_input` → `text_output`).
    #[pyo3(signature = (model, checksum, engine))]
    fn add_completions_model(
        &self,
        model: &str,
        checksum: &str,
        engine: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _ = checksum;
        self.inner
            .statics()
            .add_completions(model, openai_engine(engine)?);
        Ok(())
    }

    /// Serve `engine` as chat model `model` (listed and ready; as in the reference,
    /// `ModelInfer` serves completions models only).
    #[pyo3(signature = (model, checksum, engine))]
    fn add_chat_completions_model(
        &self,
        model: &str,
        checksum: &str,
        engine: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _ = checksum;
        self.inner.statics().add_chat(model, openai_engine(engine)?);
        Ok(())
    }

    /// Serve `engine` as tensor model `model`; `tensor_model_config` (a dict: `name`,
    /// `inputs`, `outputs`) describes and validates its tensors; `runtime_config`'s
    /// engine-specific values are reported as the `ModelConfig` parameters.
    #[pyo3(signature = (model, checksum, engine, *, runtime_config = None, tensor_model_config = None))]
    fn add_tensor_model(
        &self,
        model: &str,
        checksum: &str,
        engine: &Bound<'_, PyAny>,
        runtime_config: Option<PyModelRuntimeConfig>,
        tensor_model_config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _ = checksum;
        let config = match tensor_model_config.filter(|c| !c.is_none()) {
            Some(c) => Some(TensorModelConfig::from_json(py_to_json(c)?).map_err(llm_error)?),
            None => None,
        };
        self.inner.tensors().add(
            model,
            openai_engine(engine)?,
            config,
            runtime_config.map(|c| c.inner),
        );
        Ok(())
    }

    /// Stop serving completions model `model` (`ValueError` when it is not served).
    #[pyo3(signature = (model))]
    fn remove_completions_model(&self, model: &str) -> PyResult<()> {
        if self.inner.statics().remove_completions(model) {
            Ok(())
        } else {
            Err(not_found(model))
        }
    }

    /// Stop serving chat model `model` (`ValueError` when it is not served).
    #[pyo3(signature = (model))]
    fn remove_chat_completions_model(&self, model: &str) -> PyResult<()> {
        if self.inner.statics().remove_chat(model) {
            Ok(())
        } else {
            Err(not_found(model))
        }
    }

    /// Stop serving tensor model `model` (`ValueError` when it is not served).
    #[pyo3(signature = (model))]
    fn remove_tensor_model(&self, model: &str) -> PyResult<()> {
        if self.inner.tensors().remove(model) {
            Ok(())
        } else {
            Err(not_found(model))
        }
    }

    /// The added completions models, sorted.
    #[pyo3(signature = ())]
    fn list_completions_models(&self) -> Vec<String> {
        self.inner.statics().list_completions()
    }

    /// The added chat models, sorted.
    #[pyo3(signature = ())]
    fn list_chat_completions_models(&self) -> Vec<String> {
        self.inner.statics().list_chat()
    }

    /// The added tensor models, sorted.
    #[pyo3(signature = ())]
    fn list_tensor_models(&self) -> Vec<String> {
        self.inner.tensors().list()
    }

    /// Serve until `shutdown()` or the runtime stops.
    #[pyo3(signature = (runtime))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        runtime: &DistributedRuntime,
    ) -> PyResult<Bound<'py, PyAny>> {
        let service = Arc::clone(&self.inner);
        let drt = runtime.core().clone();
        crate::aio::py_future(
            py,
            async move { service.run(drt).await.map_err(llm_error) },
            true,
        )
    }

    /// Stop serving.
    #[pyo3(signature = ())]
    fn shutdown(&self) {
        self.inner.shutdown();
    }
}
