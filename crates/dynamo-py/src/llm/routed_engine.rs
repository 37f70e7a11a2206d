//! `chat_engine_factory`: the Python side of [`dynamo_frontend::http::engine_factory`].
//!
//! `EntrypointArgs(chat_engine_factory=...)` captures the running event loop (as the
//! reference, it must be created while one runs). When the frontend discovers a chat token
//! model it calls the factory on that loop with `(ModelCardInstanceId, ModelDeploymentCard,
//! RoutedEngine)` and serves the model's chat completions with the `PythonAsyncEngine` /
//! `HttpAsyncEngine` it returns. `RoutedEngine.generate(preprocessed, context=None)` sends
//! a `PreprocessedRequest` dict to the model's workers through the frontend's router and
//! returns the worker stream as an `AsyncResponseStream` of `Annotated` items (the worker's
//! raw `LLMEngineOutput` dicts, not detokenized).

use std::sync::Arc;
use std::time::Duration;

use dynamo_frontend::http::engine_factory::{
    ChatEngineFactory, FactoryRequest, RoutedEngine, parse_preprocessed,
};
use dynamo_frontend::http::{HttpError, OpenAiEngine};
use futures_util::future::BoxFuture;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::json::py_to_json;
use crate::llm::instance_id::ModelCardInstanceId;
use crate::llm::model_card::PyModelDeploymentCard;
use crate::runtime::context::PyContext;
use crate::runtime::engine::AsyncResponseStream;

/// Register `RoutedEngine`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRoutedEngine>()
}

/// A model's router, handed to `chat_engine_factory` callbacks.
#[pyclass(module = "dynamo._core", name = "RoutedEngine", frozen)]
pub(crate) struct PyRoutedEngine {
    inner: RoutedEngine,
}

/// The Python exception of a routing failure: `ValueError` for a bad request (400),
/// `RuntimeError` otherwise; the message starts with the HTTP status it stands for.
fn routing_error(e: &HttpError) -> PyErr {
    let message = format!("{} {}", e.status, e.message);
    if e.status == 400 {
        PyValueError::new_err(message)
    } else {
        PyRuntimeError::new_err(message)
    }
}

#[pymethods]
impl PyRoutedEngine {
    /// Route `preprocessed` (a `PreprocessedRequest` dict) to a worker; the awaitable
    /// resolves to an async iterator of `Annotated` worker outputs. With `context`, the
    /// worker request is its child (stopping it stops the worker).
    #[pyo3(signature = (preprocessed, context = None))]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        preprocessed: &Bound<'py, PyAny>,
        context: Option<PyRef<'py, PyContext>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let value = py_to_json(preprocessed)?;
        let request = parse_preprocessed(value)
            .map_err(|e| PyValueError::new_err(format!("invalid preprocessed request: {e}")))?;
        let ctx = context.map_or_else(dynamo_runtime::Context::default, |c| c.inner.clone());
        let engine = self.inner.clone();
        crate::aio::py_future(
            py,
            async move {
                let stream = engine
                    .generate(request, ctx)
                    .await
                    .map_err(|e| routing_error(&e))?;
                Ok(AsyncResponseStream::worker(stream, true))
            },
            true,
        )
    }

    fn __repr__(&self) -> String {
        format!("RoutedEngine(model={:?})", self.inner.model().name)
    }
}

/// A Python `chat_engine_factory` and the event loop it runs on.
pub(crate) struct PyChatEngineFactory {
    inner: Arc<FactoryInner>,
}

struct FactoryInner {
    callback: Py<PyAny>,
    event_loop: Py<PyAny>,
}

impl PyChatEngineFactory {
    /// `callback` on the running event loop.
    ///
    /// # Errors
    /// `RuntimeError` when no event loop is running (the reference's message).
    pub(crate) fn new(py: Python<'_>, callback: &Bound<'_, PyAny>) -> PyResult<Self> {
        let event_loop = py
            .import("asyncio")?
            .call_method0("get_running_loop")
            .map_err(|e| {
                PyRuntimeError::new_err(format!(
                    "Failed to get TaskLocals for chat_engine_factory: {e}"
                ))
            })?;
        Ok(Self {
            inner: Arc::new(FactoryInner {
                callback: callback.clone().unbind(),
                event_loop: event_loop.unbind(),
            }),
        })
    }
}

impl FactoryInner {
    /// Call the factory and wait (on this blocking thread) for its engine.
    fn call(&self, py: Python<'_>, request: FactoryRequest) -> PyResult<Arc<dyn OpenAiEngine>> {
        tracing::debug!(instance_id = request.instance_id, endpoint = %request.endpoint, "chat_engine_factory call");
        let instance = Py::new(
            py,
            ModelCardInstanceId::new(request.endpoint, request.instance_id),
        )?;
        let card = Py::new(
            py,
            PyModelDeploymentCard {
                inner: request.card,
            },
        )?;
        let routed = Py::new(
            py,
            PyRoutedEngine {
                inner: request.routed,
            },
        )?;
        let out = self.callback.bind(py).call1((instance, card, routed))?;
        let asyncio = py.import("asyncio")?;
        let engine = if asyncio.call_method1("iscoroutine", (&out,))?.is_truthy()? {
            let loop_ = self.event_loop.bind(py);
            let fut = asyncio.call_method1("run_coroutine_threadsafe", (out, loop_))?;
            let timeout_error = py.import("concurrent.futures")?.getattr("TimeoutError")?;
            loop {
                // `result` waits with the GIL released; wake now and then to notice a loop
                // that stopped without running the coroutine.
                match fut.call_method1("result", (0.5,)) {
                    Ok(engine) => break engine,
                    Err(e) if e.is_instance(py, &timeout_error) => {
                        if loop_.call_method0("is_closed")?.is_truthy()? {
                            return Err(PyRuntimeError::new_err(
                                "the event loop of chat_engine_factory was closed",
                            ));
                        }
                        py.detach(|| std::thread::sleep(Duration::from_millis(1)));
                    }
                    Err(e) => return Err(e),
                }
            }
        } else {
            out
        };
        crate::llm::python_engine::openai_engine(&engine)
    }
}

impl ChatEngineFactory for PyChatEngineFactory {
    fn create(
        &self,
        request: FactoryRequest,
    ) -> BoxFuture<'static, Result<Arc<dyn OpenAiEngine>, String>> {
        let this = Arc::clone(&self.inner);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                Python::attach(|py| this.call(py, request).map_err(|e| e.to_string()))
            })
            .await
            .map_err(|e| format!("chat_engine_factory did not complete: {e}"))?
        })
    }
}
