//! `DistributedRuntime`, `Endpoint`, `Client`, `Instance`, `TransportType`: thin bindings
//! over [`dynamo_runtime`].

use std::sync::{Arc, Once};

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, EventPlane, RequestPlane, parse_event_plane};
use dynamo_runtime::metrics::ExpfmtCallback;
use dynamo_runtime::runtime::ServeOptions;
use dynamo_runtime::system::EngineRoute;
use dynamo_runtime::{EndpointId, Route, RuntimeConfig};
use pyo3::exceptions::{PyDeprecationWarning, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::aio::{py_future, py_future_local};
use crate::errors::runtime_error;
use crate::json::{from_value, to_json};
use crate::msgpack::{Wide, to_msgpack};
use crate::runtime::context::{ContextMetadata, PyContext, SpanProxy};
use crate::runtime::engine::{AsyncResponseStream, Feeder, PyAsyncRequestStream, bridge, engine};

/// Register the runtime classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DistributedRuntime>()?;
    m.add_class::<Endpoint>()?;
    m.add_class::<RuntimeMetrics>()?;
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
pub(crate) fn tokio_runtime() -> PyResult<&'static tokio::runtime::Runtime> {
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
        let event_plane = parse_event_plane(event_plane).map_err(runtime_error)?;
        tokio_runtime()?;
        let mut config = RuntimeConfig::from_env().map_err(runtime_error)?;
        if let Some(p) = event_plane {
            config.event_plane = Some(EventPlane::parse(p).map_err(runtime_error)?);
        }
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

    /// Set the health flag reported by the system status server's `/health`.
    #[pyo3(signature = (ready))]
    fn set_health_status(&self, ready: bool) {
        self.inner.set_health_status(ready);
    }

    /// Mount `/engine/{route_name}` on the system status server: the request's JSON body
    /// (`{}` when empty) is passed to the async `callback`, whose result is the response.
    /// Must be called with an asyncio loop running (the callback runs on it).
    #[pyo3(signature = (route_name, callback))]
    fn register_engine_route(
        &self,
        py: Python<'_>,
        route_name: &str,
        callback: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if !callback.is_callable() {
            return Err(PyTypeError::new_err("callback must be callable"));
        }
        let locals = pyo3_async_runtimes::tokio::get_current_locals(py)?;
        let callback = Arc::new(callback.unbind());
        let route: EngineRoute = Arc::new(move |input: serde_json::Value| {
            let callback = Arc::clone(&callback);
            let locals = locals.clone();
            Box::pin(async move {
                let call = Python::attach(|py| {
                    let arg = from_value(py, &input)?;
                    let coro = callback.bind(py).call1((arg,))?;
                    pyo3_async_runtimes::into_future_with_locals(&locals, coro)
                })
                .map_err(|e| e.to_string())?;
                let out = call.await.map_err(|e| e.to_string())?;
                let bytes =
                    Python::attach(|py| to_json(out.bind(py))).map_err(|e| e.to_string())?;
                serde_json::from_slice(&bytes).map_err(|e| e.to_string())
            })
        });
        self.inner
            .register_engine_route(route_name, route)
            .map_err(runtime_error)
    }
}

/// Metrics hooks of one endpoint (`endpoint.metrics`).
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct RuntimeMetrics {
    runtime: dynamo_runtime::DistributedRuntime,
    owner: String,
}

#[pymethods]
impl RuntimeMetrics {
    /// Append the Prometheus text returned by `callback()` to every `/metrics` scrape.
    #[pyo3(signature = (callback))]
    fn register_prometheus_expfmt_callback(&self, callback: Bound<'_, PyAny>) -> PyResult<()> {
        if !callback.is_callable() {
            return Err(PyTypeError::new_err("callback must be callable"));
        }
        let callback = callback.unbind();
        let cb: ExpfmtCallback = Arc::new(move || {
            Python::attach(|py| callback.call0(py)?.extract::<String>(py))
                .map_err(|e| e.to_string())
        });
        self.runtime
            .metrics()
            .register_expfmt_callback(self.owner.clone(), cb);
        Ok(())
    }
}

fn check_metrics_labels(labels: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    let Some(labels) = labels.filter(|l| !l.is_none()) else {
        return Ok(Vec::new());
    };
    labels
        .try_iter()?
        .map(|item| {
            item?.extract::<(String, String)>().map_err(|_| {
                PyTypeError::new_err("metrics_labels must be a list of (name, value) string pairs")
            })
        })
        .collect()
}

/// One named endpoint.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct Endpoint {
    pub(crate) runtime: dynamo_runtime::DistributedRuntime,
    pub(crate) id: EndpointId,
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
        metrics_labels: Vec<(String, String)>,
        health_check_payload: Option<Bytes>,
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
                let options = ServeOptions {
                    graceful: graceful_shutdown,
                    metrics_labels,
                    health_check_payload,
                };
                let result = runtime
                    .serve_endpoint_with(&id, Arc::new(engine), options, stop)
                    .await;
                closed.cancel();
                result
            }
        });
        // The guard is made here and moved into the future, not made inside it: an
        // asyncio cancellation that aborts the future before tokio first polls it still
        // drops the guard, so the endpoint always stops (CI once saw it keep serving).
        let stop_on_cancel = stop.drop_guard();
        let serving = py_future(
            py,
            async move {
                let _stop_on_cancel = stop_on_cancel;
                match task.await {
                    Ok(r) => r.map_err(runtime_error),
                    Err(e) => Err(PyRuntimeError::new_err(format!("serving task failed: {e}"))),
                }
            },
            true,
        )?;
        let guard = b.call_method1("_StopIfDropped", (&serving,))?;
        b.call_method1("serve", (serving, pump, guard))
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
        let labels = check_metrics_labels(metrics_labels)?;
        let payload = match health_check_payload.filter(|p| !p.is_none()) {
            Some(p) if !p.is_instance_of::<PyDict>() => {
                return Err(PyTypeError::new_err("health_check_payload must be a dict"));
            }
            Some(p) => Some(Bytes::from(to_msgpack(p, Wide::Refuse)?)),
            None => None,
        };
        self.serve(py, handler, graceful_shutdown, false, labels, payload)
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
        let labels = check_metrics_labels(metrics_labels)?;
        self.serve(py, handler, graceful_shutdown, true, labels, None)
    }

    /// A client over this endpoint's live instances.
    #[pyo3(signature = (router_mode = None))]
    fn client<'py>(
        &self,
        py: Python<'py>,
        router_mode: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mode = parse_router_mode(router_mode)?;
        let block_size = match mode {
            ClientMode::Kv => Some(kv_client_block_size()?),
            _ => None,
        };
        let default_route = match mode {
            ClientMode::Route(r) => Some(r),
            _ => None,
        };
        let runtime = self.runtime.clone();
        let id = self.id.clone();
        py_future(
            py,
            async move {
                let kv = match block_size {
                    Some(bs) => Some(
                        dynamo_llm::kv_routing::KvRouter::new(
                            &runtime,
                            &id,
                            bs,
                            dynamo_kv_router::scheduling::config::KvRouterConfig::default(),
                            dynamo_kv_router::scheduling::selector::LoadThresholds::default(),
                        )
                        .map_err(|e| PyValueError::new_err(e.to_string()))?,
                    ),
                    None => None,
                };
                Ok(Client {
                    inner: runtime.client(&id),
                    default_route,
                    kv,
                })
            },
            true,
        )
    }

    /// Metrics hooks of this endpoint.
    #[getter]
    fn metrics(&self) -> RuntimeMetrics {
        RuntimeMetrics {
            runtime: self.runtime.clone(),
            owner: self.id.to_string(),
        }
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
/// What `Endpoint.client(router_mode=...)` asked for.
enum ClientMode {
    Default,
    Route(Route),
    Kv,
}

fn parse_router_mode(mode: Option<&Bound<'_, PyAny>>) -> PyResult<ClientMode> {
    let Some(mode) = mode.filter(|m| !m.is_none()) else {
        return Ok(ClientMode::Default);
    };
    let text = mode
        .str()?
        .to_string()
        .to_ascii_lowercase()
        .replace(['-', '_'], "");
    if text.ends_with("roundrobin") {
        Ok(ClientMode::Route(Route::RoundRobin))
    } else if text.ends_with("random") {
        Ok(ClientMode::Route(Route::Random))
    } else if text.ends_with(".kv") || text == "kv" {
        Ok(ClientMode::Kv)
    } else {
        Err(PyValueError::new_err(format!(
            "unsupported router_mode {text:?} for Endpoint.client: use RoundRobin, Random or KV"
        )))
    }
}

/// Block size of a KV-mode client (`DYN_KV_BLOCK_SIZE`, default 16: no model card here).
fn kv_client_block_size() -> PyResult<u32> {
    match std::env::var("DYN_KV_BLOCK_SIZE") {
        Ok(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|b| *b > 0)
            .ok_or_else(|| PyValueError::new_err(format!("invalid DYN_KV_BLOCK_SIZE {v:?}"))),
        Err(_) => Ok(16),
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
    /// `router_mode=RouterMode.KV`: `generate` routes by the request's `token_ids`.
    kv: Option<Arc<dynamo_llm::kv_routing::KvRouter>>,
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
            // MessagePack `nil`: a bidirectional call's request is its items.
            (Bytes::from_static(b"\xc0"), Some(rx))
        } else {
            (Bytes::from(to_msgpack(request, Wide::Refuse)?), None)
        };
        let client = self.inner.clone();
        // Polled on the loop: the request frame is queued before this returns, and the
        // worker's acknowledgement wakes the loop from the connection's reader.
        py_future_local(
            py,
            async move { client.generate(body, route, ctx, input).await },
            move |py, stream| {
                let stream = stream.map_err(runtime_error)?;
                Py::new(py, AsyncResponseStream::new(stream, annotated)).map(Py::into_any)
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

    /// Wait until exactly one instance's model card has `runtime_config.runtime_data[key]`
    /// equal to the JSON string `value`, and return its id (`TimeoutError` after
    /// `timeout_s`).
    #[pyo3(signature = (key, value, timeout_s = None))]
    fn wait_for_instance_by_runtime_data<'py>(
        &self,
        py: Python<'py>,
        key: String,
        value: String,
        timeout_s: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = match timeout_s {
            None => None,
            Some(t) => Some(
                std::time::Duration::try_from_secs_f64(t)
                    .ok()
                    .filter(|_| t.is_finite())
                    .ok_or_else(|| {
                        PyValueError::new_err(format!(
                            "timeout_s must be a finite number >= 0, got {t}"
                        ))
                    })?,
            ),
        };
        let client = self.inner.clone();
        py_future(
            py,
            async move {
                dynamo_llm::discovery::wait_for_instance_by_runtime_data(
                    &client, &key, &value, timeout,
                )
                .await
                .map_err(crate::errors::llm_error)
            },
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
        if let Some(kv) = &self.kv {
            return kv_generate(py, kv, request, annotated, context);
        }
        let route = self.default_route.unwrap_or(Route::Random);
        self.call(py, request, route, annotated, context)
    }
}

/// `Client.generate` in KV mode: route by the request's `token_ids`; the booking lives as
/// long as the response stream.
fn kv_generate<'py>(
    py: Python<'py>,
    kv: &Arc<dynamo_llm::kv_routing::KvRouter>,
    request: &Bound<'py, PyAny>,
    annotated: Option<bool>,
    context: Option<PyRef<'py, PyContext>>,
) -> PyResult<Bound<'py, PyAny>> {
    let tokens = request
        .cast::<PyDict>()
        .ok()
        .and_then(|d| d.get_item("token_ids").ok().flatten())
        .ok_or_else(|| {
            PyValueError::new_err("a KV-routed request must be a dict with \"token_ids\"")
        })?;
    let tokens = crate::convert::tokens(&tokens)?;
    let body = Bytes::from(to_msgpack(request, Wide::Refuse)?);
    let ctx = match context {
        Some(c) => c.inner.child(),
        None => dynamo_runtime::Context::default(),
    };
    let annotated = annotated.unwrap_or(false);
    let kv = Arc::clone(kv);
    py_future(
        py,
        async move {
            let stream = kv
                .generate(
                    &tokens,
                    body,
                    dynamo_llm::kv_routing::RouteOptions::default(),
                    ctx,
                )
                .await
                .map_err(|e| match e {
                    dynamo_llm::kv_routing::Error::Runtime(e) => runtime_error(e),
                    other => PyValueError::new_err(other.to_string()),
                })?;
            Ok(AsyncResponseStream::routed(stream, annotated))
        },
        false,
    )
}

impl DistributedRuntime {
    /// The core runtime (for the LLM bindings).
    pub(crate) fn core(&self) -> &dynamo_runtime::DistributedRuntime {
        &self.inner
    }
}
