//! `DistributedRuntime`, `Endpoint`, `Client`, `Instance`, `TransportType`: thin bindings
//! over [`dynamo_runtime`].

use std::sync::{Arc, Once};

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane, parse_event_plane};
use dynamo_runtime::{EndpointId, Route, RuntimeConfig};
use pyo3::exceptions::{PyDeprecationWarning, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::aio::py_future;
use crate::context::{ContextMetadata, PyContext, SpanProxy};
use crate::engine::{AsyncResponseStream, Feeder, PyAsyncRequestStream, bridge, engine};
use crate::errors::runtime_error;
use crate::json::to_json;

/// Register the runtime classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DistributedRuntime>()?;
    m.add_class::<Endpoint>()?;
    m.add_class::<Client>()?;
    m.add_class::<Instance>()?;
    m.add_class::<TransportType>()?;
    m.add_class::<PyContext>()?;
    m.add_class::<ContextMetadata>()?;
    m.add_class::<SpanProxy>()?;
    m.add_class::<PyAsyncRequestStream>()?;
    Ok(())
}

/// The runtime crate's tokio runtime, handed to pyo3-async-runtimes once.
fn tokio_runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static HANDED: Once = Once::new();
    let rt = dynamo_runtime::tokio_runtime().map_err(runtime_error)?;
    HANDED.call_once(|| {
        // Fails only if pyo3-async-runtimes already has a runtime, which then is ours.
        let _ = pyo3_async_runtimes::tokio::init_with_runtime(rt);
    });
    Ok(rt)
}

/// The process-wide runtime handle.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct DistributedRuntime {
    inner: dynamo_runtime::DistributedRuntime,
    event_loop: Py<PyAny>,
}

#[pymethods]
impl DistributedRuntime {
    #[new]
    #[pyo3(signature = (event_loop, discovery_backend, request_plane, enable_nats = None, *, event_plane = None))]
    fn new(
        py: Python<'_>,
        event_loop: Py<PyAny>,
        discovery_backend: &str,
        request_plane: &str,
        enable_nats: Option<bool>,
        event_plane: Option<&str>,
    ) -> PyResult<Self> {
        if enable_nats.is_some() {
            PyErr::warn(
                py,
                &py.get_type::<PyDeprecationWarning>(),
                c"enable_nats is deprecated and ignored; NATS is enabled by the request or event plane",
                2,
            )?;
        }
        let discovery = DiscoveryBackend::parse(discovery_backend).map_err(runtime_error)?;
        let plane = RequestPlane::parse(request_plane).map_err(runtime_error)?;
        parse_event_plane(event_plane).map_err(runtime_error)?;
        tokio_runtime()?;
        let config = RuntimeConfig::from_env().map_err(runtime_error)?;
        let inner = py
            .detach(|| dynamo_runtime::DistributedRuntime::new(discovery, plane, config))
            .map_err(runtime_error)?;
        Ok(Self { inner, event_loop })
    }

    /// The endpoint `namespace.component.endpoint` (optionally `dyn://`-prefixed).
    #[pyo3(signature = (path))]
    fn endpoint(&self, py: Python<'_>, path: &str) -> PyResult<Endpoint> {
        let id = EndpointId::parse(path).map_err(runtime_error)?;
        Ok(Endpoint {
            runtime: self.inner.clone(),
            id,
            event_loop: self.event_loop.clone_ref(py),
        })
    }

    /// Start the graceful shutdown (returns at once; `serve_endpoint` calls resolve when it
    /// completes).
    #[pyo3(signature = ())]
    fn shutdown(&self) -> PyResult<()> {
        let _guard = tokio_runtime()?.enter();
        self.inner.shutdown();
        Ok(())
    }

    /// The event loop given at construction.
    #[pyo3(signature = ())]
    fn event_loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.event_loop.clone_ref(py)
    }
}

impl DistributedRuntime {
    /// The core runtime (for the LLM bindings).
    pub(crate) fn core(&self) -> &dynamo_runtime::DistributedRuntime {
        &self.inner
    }
}

fn check_metrics_labels(labels: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let Some(labels) = labels.filter(|l| !l.is_none()) else {
        return Ok(());
    };
    for item in labels.try_iter()? {
        item?.extract::<(String, String)>().map_err(|_| {
            PyTypeError::new_err("metrics_labels must be a list of (name, value) string pairs")
        })?;
    }
    Ok(())
}

/// One named endpoint.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct Endpoint {
    runtime: dynamo_runtime::DistributedRuntime,
    id: EndpointId,
    event_loop: Py<PyAny>,
}

impl Endpoint {
    /// The runtime and the endpoint's name (for the LLM bindings).
    pub(crate) fn parts(&self) -> (&dynamo_runtime::DistributedRuntime, &EndpointId) {
        (&self.runtime, &self.id)
    }

    fn serve<'py>(
        &self,
        py: Python<'py>,
        handler: &Bound<'py, PyAny>,
        graceful_shutdown: bool,
        bidirectional: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !handler.is_callable() {
            return Err(PyTypeError::new_err("handler must be callable"));
        }
        let b = bridge(py)?;
        let pass_context: bool = b.call_method1("accepts_context", (handler,))?.extract()?;
        let closed = CancellationToken::new();
        let (engine, inbox) = engine(bidirectional, closed.clone());
        // The pump runs on the caller's loop when there is one (it carries the caller's
        // contextvars), else on the runtime's loop.
        let event_loop = pyo3_async_runtimes::get_running_loop(py)
            .unwrap_or_else(|_| self.event_loop.bind(py).clone());
        let pump = b.call_method1(
            "start_pump",
            (event_loop, Bound::new(py, inbox)?, handler, pass_context),
        )?;
        let runtime = self.runtime.clone();
        let id = self.id.clone();
        // Serving runs in its own task: cancelling the awaitable stops this endpoint
        // gracefully (leave discovery, drain) instead of dropping it mid-flight.
        let stop = CancellationToken::new();
        let task = tokio_runtime()?.spawn({
            let stop = stop.clone();
            async move {
                let result = runtime
                    .serve_endpoint_until(&id, Arc::new(engine), graceful_shutdown, stop)
                    .await;
                closed.cancel();
                result
            }
        });
        let serving = py_future(
            py,
            async move {
                let _stop_on_cancel = stop.drop_guard();
                match task.await {
                    Ok(r) => r.map_err(runtime_error),
                    Err(e) => Err(PyRuntimeError::new_err(format!("serving task failed: {e}"))),
                }
            },
            true,
        )?;
        b.call_method1("serve", (serving, pump))
    }
}

#[pymethods]
impl Endpoint {
    /// Serve this endpoint with an async-generator handler until the runtime shuts down.
    #[pyo3(signature = (handler, graceful_shutdown = true, metrics_labels = None, health_check_payload = None))]
    fn serve_endpoint<'py>(
        &self,
        py: Python<'py>,
        handler: &Bound<'py, PyAny>,
        graceful_shutdown: bool,
        metrics_labels: Option<&Bound<'py, PyAny>>,
        health_check_payload: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_metrics_labels(metrics_labels)?;
        if health_check_payload.is_some_and(|p| !p.is_none() && !p.is_instance_of::<PyDict>()) {
            return Err(PyTypeError::new_err("health_check_payload must be a dict"));
        }
        self.serve(py, handler, graceful_shutdown, false)
    }

    /// Serve a streaming-in, streaming-out handler (it receives a `PyAsyncRequestStream`).
    #[pyo3(signature = (handler, graceful_shutdown = true, metrics_labels = None))]
    fn serve_bidirectional_endpoint<'py>(
        &self,
        py: Python<'py>,
        handler: &Bound<'py, PyAny>,
        graceful_shutdown: bool,
        metrics_labels: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_metrics_labels(metrics_labels)?;
        self.serve(py, handler, graceful_shutdown, true)
    }

    /// A client over this endpoint's live instances.
    #[pyo3(signature = (router_mode = None))]
    fn client<'py>(
        &self,
        py: Python<'py>,
        router_mode: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let default_route = parse_router_mode(router_mode)?;
        let runtime = self.runtime.clone();
        let id = self.id.clone();
        py_future(
            py,
            async move {
                Ok(Client {
                    inner: runtime.client(&id),
                    default_route,
                })
            },
            true,
        )
    }

    /// This process's discovery instance id.
    #[pyo3(signature = ())]
    fn connection_id(&self) -> u64 {
        self.runtime.connection_id()
    }

    /// Withdraw this instance from discovery ("sleep").
    #[pyo3(signature = ())]
    fn unregister_endpoint_instance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let runtime = self.runtime.clone();
        let id = self.id.clone();
        py_future(
            py,
            async move {
                runtime
                    .unregister_endpoint_instance(&id)
                    .await
                    .map_err(runtime_error)
            },
            true,
        )
    }

    /// Publish this instance again ("wake").
    #[pyo3(signature = ())]
    fn register_endpoint_instance<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let runtime = self.runtime.clone();
        let id = self.id.clone();
        py_future(
            py,
            async move {
                runtime
                    .register_endpoint_instance(&id)
                    .await
                    .map_err(runtime_error)
            },
            true,
        )
    }

    fn __repr__(&self) -> String {
        format!("Endpoint('{}')", self.id)
    }
}

/// `None` → round-robin; `"random"` / `"round_robin"` (or a `RouterMode`-like object whose
/// name says so).
fn parse_router_mode(mode: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Route>> {
    let Some(mode) = mode.filter(|m| !m.is_none()) else {
        return Ok(None);
    };
    let text = mode
        .str()?
        .to_string()
        .to_ascii_lowercase()
        .replace(['-', '_'], "");
    if text.ends_with("roundrobin") {
        Ok(Some(Route::RoundRobin))
    } else if text.ends_with("random") {
        Ok(Some(Route::Random))
    } else {
        Err(PyValueError::new_err(format!(
            "unsupported router_mode {text:?} for Endpoint.client: use RoundRobin or Random \
             (KV routing goes through KvRouter)"
        )))
    }
}

/// The transport of an instance.
#[pyclass(module = "dynamo._core", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash, Clone)]
pub(crate) struct TransportType {
    kind: String,
    address: String,
}

#[pymethods]
impl TransportType {
    /// `"tcp"` or `"nats_tcp"`.
    #[getter]
    fn kind(&self) -> String {
        self.kind.clone()
    }

    /// The address (format not stable).
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "TransportType(kind='{}', address='{}')",
            self.kind, self.address
        )
    }
}

/// A snapshot of one registered endpoint instance.
#[pyclass(module = "dynamo._core", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash, Clone)]
pub(crate) struct Instance {
    inner: dynamo_runtime::discovery::Instance,
}

#[pymethods]
impl Instance {
    #[getter]
    fn instance_id(&self) -> u64 {
        self.inner.instance_id
    }

    #[getter]
    fn namespace(&self) -> String {
        self.inner.namespace.clone()
    }

    #[getter]
    fn component(&self) -> String {
        self.inner.component.clone()
    }

    #[getter]
    fn endpoint(&self) -> String {
        self.inner.endpoint.clone()
    }

    #[getter]
    fn transport(&self) -> TransportType {
        TransportType {
            kind: self.inner.transport.kind().to_owned(),
            address: self.inner.transport.address().to_owned(),
        }
    }

    #[getter]
    fn device_type(&self) -> Option<String> {
        self.inner.device_type.clone()
    }

    fn __str__(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.inner.namespace, self.inner.component, self.inner.endpoint, self.inner.instance_id
        )
    }

    fn __repr__(&self) -> String {
        format!("Instance({})", self.__str__())
    }
}

/// A client of one endpoint.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct Client {
    inner: dynamo_runtime::Client,
    default_route: Option<Route>,
}

impl Client {
    fn call<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        route: Route,
        annotated: Option<bool>,
        context: Option<PyRef<'py, PyContext>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let annotated = annotated.unwrap_or(false);
        let ctx = match context {
            Some(c) => c.inner.child(),
            None => dynamo_runtime::Context::default(),
        };
        let is_stream = !request.is_instance_of::<PyDict>()
            && !request.is_instance_of::<PyList>()
            && request.hasattr(pyo3::intern!(py, "__aiter__"))?;
        let (body, input) = if is_stream {
            let (tx, rx) = mpsc::unbounded_channel();
            let event_loop = pyo3_async_runtimes::get_running_loop(py)?;
            bridge(py)?.call_method1(
                "start_feed",
                (event_loop, request, Bound::new(py, Feeder::new(tx))?),
            )?;
            (Bytes::from_static(b"null"), Some(rx))
        } else {
            (Bytes::from(to_json(request)?), None)
        };
        let client = self.inner.clone();
        py_future(
            py,
            async move {
                let stream = client
                    .generate(body, route, ctx, input)
                    .await
                    .map_err(runtime_error)?;
                Ok(AsyncResponseStream::new(stream, annotated))
            },
            false,
        )
    }
}

#[pymethods]
impl Client {
    /// The known instance ids.
    #[pyo3(signature = ())]
    fn instance_ids(&self) -> Vec<u64> {
        self.inner.instance_ids()
    }

    /// The known instances.
    #[pyo3(signature = ())]
    fn instances(&self) -> Vec<Instance> {
        self.inner
            .instances()
            .into_iter()
            .map(|inner| Instance { inner })
            .collect()
    }

    /// Resolves with the instance ids once at least one instance exists.
    #[pyo3(signature = ())]
    fn wait_for_instances<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.inner.clone();
        py_future(
            py,
            async move { client.wait_for_instances().await.map_err(runtime_error) },
            true,
        )
    }

    /// Send to a random instance.
    #[pyo3(signature = (request, annotated = Some(true), context = None), text_signature = "(self, request, annotated=True, context=None)")]
    fn random<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        annotated: Option<bool>,
        context: Option<PyRef<'py, PyContext>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.call(py, request, Route::Random, annotated, context)
    }

    /// Send to the next instance in turn.
    #[pyo3(signature = (request, annotated = Some(true), context = None), text_signature = "(self, request, annotated=True, context=None)")]
    fn round_robin<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        annotated: Option<bool>,
        context: Option<PyRef<'py, PyContext>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.call(py, request, Route::RoundRobin, annotated, context)
    }

    /// Send to one instance.
    #[pyo3(signature = (request, instance_id, annotated = Some(true), context = None), text_signature = "(self, request, instance_id, annotated=True, context=None)")]
    fn direct<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        instance_id: u64,
        annotated: Option<bool>,
        context: Option<PyRef<'py, PyContext>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.call(py, request, Route::Direct(instance_id), annotated, context)
    }

    /// Send with the client's default strategy (its router mode, else random).
    #[pyo3(signature = (request, annotated = Some(true), context = None), text_signature = "(self, request, annotated=True, context=None)")]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        annotated: Option<bool>,
        context: Option<PyRef<'py, PyContext>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let route = self.default_route.unwrap_or(Route::Random);
        self.call(py, request, route, annotated, context)
    }
}
