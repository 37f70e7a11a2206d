//! The bridge between the request plane and Python: handlers on the worker side, response
//! and request streams on both sides.
//!
//! Worker side: [`PyEngine`] (a request-plane [`Handler`]) queues each request into an
//! [`Inbox`]; the endpoint's pump task (`bridge.py`, started on the event loop captured by
//! `serve_endpoint`) takes requests in batches, calls the handler and drives each async
//! generator to completion, pushing items into a [`Sink`] (the stream's
//! [`Responder`]) with plain synchronous calls.
//!
//! Awaitables: when a value is already available, `__anext__` and friends return a
//! [`Ready`] awaitable (no event-loop round trip); otherwise an asyncio future polled on
//! the loop ([`py_future_local`]), which the producer's tokio thread wakes directly.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use dynamo_llm::kv_routing::RoutedStream;
use dynamo_runtime::transport::client::ResponseStream;
use dynamo_runtime::transport::codec;
use dynamo_runtime::transport::server::{Handler, Request, Responder, SendStatus};
use dynamo_runtime::transport::{ErrorKind, WireError};
use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyModule, PyTuple};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::aio::py_future_local;
use crate::errors::{handler_error, runtime_error};
use crate::msgpack::{Wide, from_msgpack, to_msgpack, write_value};
use crate::runtime::context::PyContext;

/// Largest batch of requests handed to the pump in one wake-up.
const MAX_BATCH: usize = 512;

static BRIDGE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The `bridge.py` helper module.
pub(crate) fn bridge(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    BRIDGE
        .get_or_try_init(py, || {
            let code = CString::new(include_str!("bridge.py"))
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            PyModule::from_code(
                py,
                &code,
                c"dynamo/_core/bridge.py",
                c"dynamo._core._bridge",
            )
            .map(Bound::unbind)
        })
        .map(|m| m.bind(py))
}

/// An awaitable whose result is already known.
#[pyclass(module = "dynamo._core")]
pub(crate) struct Ready {
    value: Option<Py<PyAny>>,
}

impl Ready {
    pub(crate) fn new(value: Bound<'_, PyAny>) -> Self {
        Self {
            value: Some(value.unbind()),
        }
    }
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<()> {
        let value = self.value.take().unwrap_or_else(|| py.None());
        Err(PyStopIteration::new_err((value,)))
    }

    #[pyo3(signature = (_value))]
    fn send(&mut self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.__next__(py)
    }
}

struct Job {
    request: Request,
    responder: Responder,
}

/// The request-plane handler of a Python endpoint: queues requests for the pump.
pub(crate) struct PyEngine {
    tx: mpsc::UnboundedSender<Job>,
}

impl Handler for PyEngine {
    fn start(&self, request: Request, responder: Responder) {
        if let Err(mpsc::error::SendError(job)) = self.tx.send(Job { request, responder }) {
            job.responder.fail(WireError::new(
                ErrorKind::Unavailable,
                "Server unavailable: the endpoint's handler has stopped",
                false,
            ));
        }
    }
}

/// Requests waiting for the pump.
#[pyclass(module = "dynamo._core")]
pub(crate) struct Inbox {
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Job>>>,
    closed: CancellationToken,
    bidirectional: bool,
}

/// Create an engine and its inbox; cancelling `closed` ends the pump.
pub(crate) fn engine(bidirectional: bool, closed: CancellationToken) -> (PyEngine, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        PyEngine { tx },
        Inbox {
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            closed,
            bidirectional,
        },
    )
}

fn make_batch(py: Python<'_>, jobs: Vec<Job>, bidirectional: bool) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for job in jobs {
        let Job { request, responder } = job;
        let context = request.context.clone();
        let request_obj = if bidirectional {
            let rx = request.input.unwrap_or_else(|| mpsc::unbounded_channel().1);
            Bound::new(py, PyAsyncRequestStream::new(rx))?.into_any()
        } else {
            match from_msgpack(py, &request.body) {
                Ok(v) => v,
                Err(e) => {
                    responder.fail(WireError::new(
                        ErrorKind::InvalidArgument,
                        format!("cannot decode the request: {e}"),
                        false,
                    ));
                    continue;
                }
            }
        };
        let mut responder = responder;
        responder.set_corked(true);
        let sink = Sink {
            context: context.clone(),
            responder: Mutex::new(Some(responder)),
            flush_scheduled: AtomicBool::new(false),
        };
        let item = PyTuple::new(
            py,
            [
                request_obj,
                Bound::new(py, sink)?.into_any(),
                Bound::new(py, PyContext::wrap(context))?.into_any(),
            ],
        )?;
        list.append(item)?;
    }
    Ok(list)
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Job>, jobs: &mut Vec<Job>) {
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => break,
        }
    }
}

#[pymethods]
impl Inbox {
    /// Awaitable: the next batch of `(request, sink, context)` tuples, or None when the
    /// endpoint stopped.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(mut rx) = self.rx.try_lock() {
            let mut jobs = Vec::new();
            drain(&mut rx, &mut jobs);
            if !jobs.is_empty() {
                let batch = make_batch(py, jobs, self.bidirectional)?;
                return Ok(Bound::new(py, Ready::new(batch.into_any()))?.into_any());
            }
        }
        let rx = Arc::clone(&self.rx);
        let closed = self.closed.clone();
        let bidirectional = self.bidirectional;
        py_future_local(
            py,
            async move {
                let mut rx = rx.lock().await;
                let first = tokio::select! {
                    j = rx.recv() => j,
                    () = closed.cancelled() => None,
                };
                first.map(|first| {
                    let mut jobs = vec![first];
                    drain(&mut rx, &mut jobs);
                    jobs
                })
            },
            move |py, jobs| match jobs {
                None => Ok(py.None()),
                Some(jobs) => make_batch(py, jobs, bidirectional).map(|b| b.into_any().unbind()),
            },
            false,
        )
    }
}

/// The worker's side of one response stream, driven by `bridge._drive`.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct Sink {
    context: dynamo_runtime::Context,
    responder: Mutex<Option<Responder>>,
    /// A `flush` is queued on the event loop (frames are buffered until it runs: the
    /// frames a handler produces in one step of its task leave in one write).
    flush_scheduled: AtomicBool,
}

impl Sink {
    /// After buffering: `true` when the caller must queue a `flush` on the loop.
    fn needs_flush(&self, r: &Responder) -> bool {
        r.has_pending() && !self.flush_scheduled.swap(true, Ordering::AcqRel)
    }

    fn take(&self) -> Option<Responder> {
        self.responder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// The envelope of one response item (MessagePack): `{"data": item}`, or the fields of an
/// annotated envelope (a dict with `"_dynamo_annotated": True`).
fn item_payload(item: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    if let Ok(d) = item.cast::<PyDict>() {
        let flagged = d
            .get_item("_dynamo_annotated")?
            .is_some_and(|v| v.is_truthy().unwrap_or(false));
        if flagged {
            let mut fields = Vec::with_capacity(4);
            for key in ["data", "id", "event", "comment"] {
                if let Some(v) = d.get_item(key)?.filter(|v| !v.is_none()) {
                    fields.push((key, v));
                }
            }
            codec::write_map_len(&mut out, fields.len());
            for (key, v) in fields {
                codec::write_str(&mut out, key);
                write_value(&mut out, &v, Wide::Bytes, 0)?;
            }
            return Ok(out);
        }
    }
    codec::write_map_len(&mut out, 1);
    codec::write_str(&mut out, "data");
    write_value(&mut out, item, Wide::Bytes, 0)?;
    Ok(out)
}

/// The text the caller sees for an item that cannot be serialised (the reference's).
fn serialize_failure(err: &PyErr, py: Python<'_>) -> String {
    let detail = err.value(py).to_string();
    let detail = if err.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
        format!("OverflowError: {detail}")
    } else {
        detail
    };
    format!("critical error: failed serializing Python response as msgpack: {detail}")
}

#[pymethods]
impl Sink {
    /// Tell the caller the request was accepted (buffered); True when a `flush` must be
    /// queued on the loop.
    fn accept(&self) -> bool {
        let mut guard = self.responder.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_mut().is_some_and(|r| {
            r.accept();
            self.needs_flush(r)
        })
    }

    /// Send the buffered frames.
    fn flush(&self) {
        self.flush_scheduled.store(false, Ordering::Release);
        if let Some(r) = self
            .responder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            r.flush();
        }
    }

    /// Send one item: 0 = buffered, 1 = the caller stopped the stream, 2 = sent but await
    /// `credit()` before the next one, 3 = buffered and a `flush` must be queued, 4 = the
    /// item could not be serialised: the stream ended with that error, 5 = the stream was
    /// killed.
    fn send(&self, item: &Bound<'_, PyAny>) -> PyResult<u8> {
        let payload = match item_payload(item) {
            Ok(p) => p,
            Err(e) => {
                if let Some(r) = self.take() {
                    r.fail(WireError::new(
                        ErrorKind::Unknown,
                        serialize_failure(&e, item.py()),
                        false,
                    ));
                }
                return Ok(4);
            }
        };
        let mut guard = self.responder.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = guard.as_mut() else {
            return Ok(1);
        };
        match r.send(&payload).map_err(runtime_error)? {
            SendStatus::Ready if self.needs_flush(r) => Ok(3),
            SendStatus::Ready => Ok(0),
            SendStatus::Stopped if self.context.is_killed() => Ok(5),
            SendStatus::Stopped => Ok(1),
            SendStatus::Wait => Ok(2),
        }
    }

    /// Awaitable resolving when more items may be sent (or the stream was stopped).
    fn credit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let waiter = self
            .responder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Responder::credit_waiter);
        py_future_local(
            py,
            async move {
                if let Some(w) = waiter {
                    w.await;
                }
            },
            |py, ()| Ok(py.None()),
            false,
        )
    }

    /// Whether the caller stopped the stream.
    fn is_stopped(&self) -> bool {
        self.context.is_stopped()
    }

    /// End the stream successfully.
    fn finish(&self) {
        if let Some(r) = self.take() {
            r.finish();
        }
    }

    /// End the stream with the error the handler raised.
    fn fail(&self, err: &Bound<'_, PyAny>) {
        if let Some(r) = self.take() {
            r.fail(handler_error(err));
        }
    }
}

/// The inbound request items of a bidirectional call.
#[pyclass(module = "dynamo._core", name = "PyAsyncRequestStream")]
pub(crate) struct PyAsyncRequestStream {
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Bytes>>>,
}

impl PyAsyncRequestStream {
    fn new(rx: mpsc::UnboundedReceiver<Bytes>) -> Self {
        Self {
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
        }
    }
}

#[pymethods]
impl PyAsyncRequestStream {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(mut rx) = self.rx.try_lock() {
            match rx.try_recv() {
                Ok(b) => return Ok(Bound::new(py, Ready::new(from_msgpack(py, &b)?))?.into_any()),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(PyStopAsyncIteration::new_err(()));
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
        }
        let rx = Arc::clone(&self.rx);
        py_future_local(
            py,
            async move { rx.lock().await.recv().await },
            |py, item| match item {
                Some(b) => from_msgpack(py, &b).map(Bound::unbind),
                None => Err(PyStopAsyncIteration::new_err(())),
            },
            false,
        )
    }
}

/// Sends the items of a caller's request iterator (bidirectional calls).
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct Feeder {
    tx: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
}

impl Feeder {
    pub(crate) fn new(tx: mpsc::UnboundedSender<Bytes>) -> Self {
        Self {
            tx: Mutex::new(Some(tx)),
        }
    }
}

#[pymethods]
impl Feeder {
    /// Queue one item; False once the call is over.
    fn send(&self, item: &Bound<'_, PyAny>) -> PyResult<bool> {
        let bytes = Bytes::from(to_msgpack(item, Wide::Refuse)?);
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        Ok(guard.as_ref().is_some_and(|tx| tx.send(bytes).is_ok()))
    }

    /// End the request stream.
    fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// One response item with its annotations.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct Annotated {
    data: Option<Py<PyAny>>,
    id: Option<String>,
    event: Option<String>,
    comments: Option<Vec<String>>,
}

#[pymethods]
impl Annotated {
    /// The payload.
    fn data(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.data.as_ref().map(|d| d.clone_ref(py))
    }

    /// The event name.
    fn event(&self) -> Option<String> {
        self.event.clone()
    }

    /// The comments.
    fn comments(&self) -> Option<Vec<String>> {
        self.comments.clone()
    }

    /// The item id.
    fn id(&self) -> Option<String> {
        self.id.clone()
    }

    /// Whether this is an error item.
    fn is_error(&self) -> bool {
        self.event.as_deref() == Some("error")
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let data = match &self.data {
            Some(d) => d.bind(py).repr()?.to_string(),
            None => "None".into(),
        };
        Ok(format!(
            "Annotated(data={data}, id={:?}, event={:?}, comments={:?})",
            self.id, self.event, self.comments
        ))
    }
}

/// One response item, its envelope parsed (no Python objects yet).
pub(crate) struct Item {
    payload: Bytes,
    env: codec::Envelope,
}

/// Parse one response payload (no GIL needed). `Ok(None)`: nothing to yield (no data, raw
/// mode). An `event == "error"` item is an error.
fn parse_item(payload: Bytes, annotated: bool) -> PyResult<Option<Item>> {
    let env = codec::parse_envelope(&payload)
        .map_err(|e| PyValueError::new_err(format!("malformed response item: {e}")))?;
    if env.event.as_deref() == Some("error") {
        let msg = env
            .comment
            .as_ref()
            .map(|c| c.join("; "))
            .unwrap_or_else(|| "error".into());
        return Err(PyValueError::new_err(msg));
    }
    if !annotated && env.data.is_none() {
        return Ok(None);
    }
    Ok(Some(Item { payload, env }))
}

/// The Python object for an item: an `Annotated` wrapper, or the raw data.
fn item_to_py(py: Python<'_>, item: Item, annotated: bool) -> PyResult<Py<PyAny>> {
    let Item { payload, env } = item;
    let data = match env.data {
        Some(range) => Some(from_msgpack(py, &payload[range])?),
        None => None,
    };
    if !annotated {
        return Ok(data.map_or_else(|| py.None(), Bound::unbind));
    }
    let wrapped = Annotated {
        data: data.map(Bound::unbind),
        id: env.id,
        event: env.event,
        comments: env.comment,
    };
    Ok(Bound::new(py, wrapped)?.into_any().unbind())
}

/// A response stream as a Python async iterator.
#[pyclass(module = "dynamo._core", name = "AsyncResponseStream")]
pub(crate) struct AsyncResponseStream {
    stream: Arc<tokio::sync::Mutex<AnyStream>>,
    annotated: bool,
}

/// A plain response stream, or one routed by the KV router (which tracks the request's
/// progress as items arrive and releases its booking when dropped).
enum AnyStream {
    Plain(ResponseStream),
    Routed(RoutedStream),
    /// A frontend model's worker stream (`RoutedEngine.generate`), re-encoded as envelopes.
    Worker(Box<dynamo_frontend::http::WorkerStream>),
}

/// One worker output (or the error ending the stream) as a request-plane envelope.
fn worker_envelope(
    item: Result<dynamo_llm::preprocessor::LLMEngineOutput, dynamo_frontend::http::HttpError>,
) -> Bytes {
    use dynamo_llm::engines::Annotated as Envelope;
    let encoded = match item {
        Ok(out) => codec::encode(&Envelope::data(out)).map_err(|e| e.to_string()),
        Err(e) => Err(e.message),
    };
    let bytes = encoded.unwrap_or_else(|message| {
        let err: Envelope<()> = Envelope {
            data: None,
            event: Some("error".into()),
            comment: Some(vec![message]),
        };
        codec::encode(&err).unwrap_or_default()
    });
    Bytes::from(bytes)
}

impl AnyStream {
    fn try_next(&mut self) -> Result<Option<dynamo_runtime::Result<Bytes>>, ()> {
        match self {
            Self::Plain(s) => s.try_next(),
            Self::Routed(s) => s.try_next(),
            Self::Worker(_) => Err(()),
        }
    }

    async fn next(&mut self) -> Option<dynamo_runtime::Result<Bytes>> {
        match self {
            Self::Plain(s) => s.next().await,
            Self::Routed(s) => s.next().await,
            Self::Worker(s) => s.next().await.map(|item| Ok(worker_envelope(item))),
        }
    }

    fn context(&self) -> &dynamo_runtime::Context {
        match self {
            Self::Plain(s) => s.context(),
            Self::Routed(s) => s.context(),
            Self::Worker(s) => s.context(),
        }
    }
}

impl AsyncResponseStream {
    pub(crate) fn new(stream: ResponseStream, annotated: bool) -> Self {
        Self {
            stream: Arc::new(tokio::sync::Mutex::new(AnyStream::Plain(stream))),
            annotated,
        }
    }

    /// A frontend model's worker stream (`RoutedEngine.generate`).
    pub(crate) fn worker(stream: dynamo_frontend::http::WorkerStream, annotated: bool) -> Self {
        Self {
            stream: Arc::new(tokio::sync::Mutex::new(AnyStream::Worker(Box::new(stream)))),
            annotated,
        }
    }

    /// A stream routed by a `KvRouter`.
    pub(crate) fn routed(stream: RoutedStream, annotated: bool) -> Self {
        Self {
            stream: Arc::new(tokio::sync::Mutex::new(AnyStream::Routed(stream))),
            annotated,
        }
    }
}

#[pymethods]
impl AsyncResponseStream {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(mut s) = self.stream.try_lock() {
            loop {
                match s.try_next() {
                    // After the caller stopped the stream, late items are dropped and
                    // the stream ends quietly (as the reference).
                    Ok(Some(Ok(_))) if s.context().is_stopped() => {}
                    Ok(Some(Ok(b))) => {
                        if let Some(item) = parse_item(b, self.annotated)? {
                            let obj = item_to_py(py, item, self.annotated)?.into_bound(py);
                            return Ok(Bound::new(py, Ready::new(obj))?.into_any());
                        }
                    }
                    Ok(Some(Err(e))) => return Err(runtime_error(e)),
                    Ok(None) => return Err(PyStopAsyncIteration::new_err(())),
                    Err(()) => break,
                }
            }
        }
        let stream = Arc::clone(&self.stream);
        let annotated = self.annotated;
        py_future_local(
            py,
            async move {
                let mut s = stream.lock().await;
                loop {
                    match s.next().await {
                        Some(Ok(_)) if s.context().is_stopped() => {}
                        Some(Ok(b)) => {
                            if let Some(item) = parse_item(b, annotated)? {
                                return Ok(item);
                            }
                        }
                        Some(Err(e)) => return Err(runtime_error(e)),
                        None => return Err(PyStopAsyncIteration::new_err(())),
                    }
                }
            },
            move |py, item: PyResult<Item>| item.and_then(|i| item_to_py(py, i, annotated)),
            false,
        )
    }

    /// The stream's request id.
    fn id(&self) -> PyResult<String> {
        self.stream
            .try_lock()
            .map(|s| s.context().id().to_owned())
            .map_err(|_| PyRuntimeError::new_err("the stream is being read"))
    }
}
