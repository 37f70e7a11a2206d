//! `HttpService`: the OpenAI-compatible HTTP frontend ([`dynamo_frontend::http`]) with the
//! in-process Python engines of [`super::python_engine`] served next to discovered models.

use std::sync::Arc;

use dynamo_frontend::http::{FrontendConfig, HttpService as CoreHttpService};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::aio::py_async;
use crate::errors::llm_error;
use crate::llm::python_engine::openai_engine;
use crate::runtime::distributed_runtime::DistributedRuntime;

/// Register `HttpService`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HttpService>()?;
    Ok(())
}

/// An OpenAI-compatible HTTP ingress following the runtime's model cards, plus the
/// in-process models added with `add_chat_completions_model` / `add_completions_model`.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct HttpService {
    inner: Arc<CoreHttpService>,
}

fn not_found(model: &str) -> PyErr {
    PyValueError::new_err(format!("Model not found: {model}"))
}

#[pymethods]
impl HttpService {
    #[new]
    #[pyo3(signature = (port = None, *, wait_for_first_item = false))]
    fn new(port: Option<u16>, wait_for_first_item: bool) -> Self {
        let mut c = FrontendConfig::default();
        if let Some(p) = port {
            c.port = p;
        }
        c.wait_for_first_item = wait_for_first_item;
        Self {
            inner: CoreHttpService::new(c),
        }
    }

    /// Serve `engine` as chat-completions model `model` (replacing one of that name).
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

    /// Serve `engine` as completions model `model` (replacing one of that name).
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

    /// Stop serving chat model `model` (`ValueError` when it is not served).
    #[pyo3(signature = (model))]
    fn remove_chat_completions_model(&self, model: &str) -> PyResult<()> {
        if self.inner.statics().remove_chat(model) {
            Ok(())
        } else {
            Err(not_found(model))
        }
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

    /// The added chat models, sorted.
    #[pyo3(signature = ())]
    fn list_chat_completions_models(&self) -> Vec<String> {
        self.inner.statics().list_chat()
    }

    /// The added completions models, sorted.
    #[pyo3(signature = ())]
    fn list_completions_models(&self) -> Vec<String> {
        self.inner.statics().list_completions()
    }

    /// Turn an endpoint family (`"chat"`, `"completion"`, ...) on or off; a disabled one
    /// answers 404. All are on by default.
    #[pyo3(signature = (endpoint_type, enabled))]
    fn enable_endpoint(&self, endpoint_type: &str, enabled: bool) -> PyResult<()> {
        self.inner
            .statics()
            .enable_endpoint(endpoint_type, enabled)
            .map_err(llm_error)
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
        py_async(py, async move { service.run(drt).await.map_err(llm_error) })
    }

    /// Stop serving.
    #[pyo3(signature = ())]
    fn shutdown(&self) {
        self.inner.shutdown();
    }
}
