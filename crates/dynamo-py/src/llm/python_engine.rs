//! Python async generators as in-process OpenAI engines (`PythonAsyncEngine`,
//! `HttpAsyncEngine`) for `HttpService.add_chat_completions_model` and friends.
//!
//! The machinery is the one `serve_endpoint` uses, minus the network: the HTTP handler (a
//! tokio task) queues each request into a [`LocalInbox`]; a pump task on the engine's event
//! loop (`bridge.start_local_pump`) takes requests in batches, calls the generator with the
//! request dict (and `context=` when it accepts one) and drives it with `bridge._drive`,
//! pushing each chunk into a [`LocalSink`] with a plain synchronous call. No tokio thread
//! takes the GIL. A bounded channel between the sink and the HTTP response gives
//! back-pressure: a full channel makes the driver await `credit()`.
//!
//! Cancellation: when the HTTP response is dropped (client gone), the frontend stops the
//! request's context; the pump's watcher then cancels the task driving the generator, so
//! the coroutine sees `CancelledError` at its current `await` and its `finally` blocks run.
//!
//! Errors: `HttpAsyncEngine` answers an exception with an integer `.code` in 400..=599 (e.g.
//! `dynamo.llm.exceptions.HttpError`) with that status and its `.message`; for both engines
//! `ValueError`/`TypeError` (and a 4xx `.code` for `PythonAsyncEngine`) are 400, anything
//! else 500 (the mapping of handler errors in `errors::handler_error`).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use dynamo_frontend::http::HttpError;
use dynamo_frontend::http::static_engine::{ChunkStream, OpenAiEngine};
use dynamo_runtime::Context;
use dynamo_runtime::transport::ErrorKind;
use futures_util::StreamExt;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyTuple};
use tokio::sync::mpsc;

use crate::aio::{py_future, py_future_with};
use crate::errors::handler_error;
use crate::json::{from_json, to_json};
use crate::runtime::context::PyContext;
use crate::runtime::engine::{Ready, bridge};

/// Largest batch of requests handed to the pump in one wake-up.
const MAX_BATCH: usize = 256;

/// Chunks buffered between a generator and its HTTP response before the generator waits:
/// enough to absorb bursts, small enough that a slow client holds little memory.
const CHUNK_WINDOW: usize = 64;

type Item = Result<Bytes, HttpError>;

/// Register `PythonAsyncEngine` and `HttpAsyncEngine`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PythonAsyncEngine>()?;
    m.add_class::<HttpAsyncEngine>()?;
    Ok(())
}

/// One request for the pump.
struct LocalJob {
    body: Bytes,
    context: Context,
    tx: mpsc::Sender<Item>,
}

/// The Rust side of a Python engine: implements [`OpenAiEngine`] by queueing requests for
/// the pump on the engine's event loop.
pub(crate) struct PyOpenAiEngine {
    jobs: mpsc::UnboundedSender<LocalJob>,
}

impl OpenAiEngine for PyOpenAiEngine {
    fn generate(&self, request: Bytes, context: Context) -> ChunkStream {
        let (tx, rx) = mpsc::channel(CHUNK_WINDOW);
        let job = LocalJob {
            body: request,
            context,
            tx,
        };
        if self.jobs.send(job).is_err() {
            let e = HttpError::unavailable("the engine's event loop has stopped");
            return futures_util::stream::iter([Err(e)]).boxed();
        }
        tokio_stream_of(rx)
    }
}

fn tokio_stream_of(rx: mpsc::Receiver<Item>) -> ChunkStream {
    futures_util::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item, rx))
    })
    .boxed()
}

/// Requests waiting for the pump of one engine.
#[pyclass(module = "dynamo._core")]
pub(crate) struct LocalInbox {
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<LocalJob>>>,
    http_errors: bool,
}

/// Create the engine and start its pump on `event_loop` (scheduled thread-safely, so the
/// loop may be running elsewhere or not yet).
pub(crate) fn start(
    py: Python<'_>,
    generator: &Bound<'_, PyAny>,
    event_loop: &Bound<'_, PyAny>,
    http_errors: bool,
) -> PyResult<Arc<PyOpenAiEngine>> {
    if !generator.is_callable() {
        return Err(PyTypeError::new_err("generator must be callable"));
    }
    let b = bridge(py)?;
    let pass_context: bool = b.call_method1("accepts_context", (generator,))?.extract()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let inbox = LocalInbox {
        rx: Arc::new(tokio::sync::Mutex::new(rx)),
        http_errors,
    };
    b.call_method1(
        "start_local_pump",
        (event_loop, Bound::new(py, inbox)?, generator, pass_context),
    )?;
    Ok(Arc::new(PyOpenAiEngine { jobs: tx }))
}

fn drain(rx: &mut mpsc::UnboundedReceiver<LocalJob>, jobs: &mut Vec<LocalJob>) {
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => break,
        }
    }
}

fn make_batch(
    py: Python<'_>,
    jobs: Vec<LocalJob>,
    http_errors: bool,
) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for LocalJob { body, context, tx } in jobs {
        let request = match from_json(py, &body) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.try_send(Err(HttpError::bad_request(
                    format!("cannot decode the request: {e}"),
                    None,
                )));
                continue;
            }
        };
        let sink = LocalSink {
            context: context.clone(),
            tx: Mutex::new(Some(tx)),
            pending: Arc::new(Mutex::new(None)),
            http_errors,
        };
        let item = PyTuple::new(
            py,
            [
                request,
                Bound::new(py, sink)?.into_any(),
                Bound::new(py, PyContext::wrap(context))?.into_any(),
            ],
        )?;
        list.append(item)?;
    }
    Ok(list)
}

#[pymethods]
impl LocalInbox {
    /// Awaitable: the next batch of `(request, sink, context)` tuples, or None once the
    /// engine is gone.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let http_errors = self.http_errors;
        if let Ok(mut rx) = self.rx.try_lock() {
            let mut jobs = Vec::new();
            drain(&mut rx, &mut jobs);
            if !jobs.is_empty() {
                let batch = make_batch(py, jobs, http_errors)?;
                return Ok(Bound::new(py, Ready::new(batch.into_any()))?.into_any());
            }
        }
        let rx = Arc::clone(&self.rx);
        py_future_with(
            py,
            async move {
                let mut rx = rx.lock().await;
                let first = rx.recv().await;
                first.map(|first| {
                    let mut jobs = vec![first];
                    drain(&mut rx, &mut jobs);
                    jobs
                })
            },
            move |py, jobs| match jobs {
                None => Ok(py.None()),
                Some(jobs) => make_batch(py, jobs, http_errors).map(|b| b.into_any().unbind()),
            },
            true,
        )
    }
}

/// The generator's side of one response, driven by `bridge._drive` (same protocol as the
/// request-plane sink).
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct LocalSink {
    context: Context,
    tx: Mutex<Option<mpsc::Sender<Item>>>,
    /// A chunk that did not fit in the window; `credit()` delivers it.
    pending: Arc<Mutex<Option<Item>>>,
    http_errors: bool,
}

impl LocalSink {
    fn sender(&self) -> Option<mpsc::Sender<Item>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Deliver the last item of the stream and close it.
    fn close_with(&self, item: Option<Item>) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (Some(tx), Some(item)) = (tx, item) else {
            return;
        };
        if let Err(mpsc::error::TrySendError::Full(item)) = tx.try_send(item) {
            // The window is full (the driver never sends past it without credit, so only
            // a final error can get here): deliver it in the background.
            if let Ok(rt) = dynamo_runtime::tokio_runtime() {
                rt.spawn(async move {
                    let _ = tx.send(item).await;
                });
            }
        }
    }
}

/// The HTTP error of an exception raised by a Python engine.
fn engine_error(err: &Bound<'_, PyAny>, http_errors: bool) -> HttpError {
    if http_errors {
        let code = err
            .getattr("code")
            .ok()
            .filter(|c| !c.is_instance_of::<PyBool>())
            .and_then(|c| c.extract::<u16>().ok())
            .filter(|c| (400..600).contains(c));
        if let Some(code) = code {
            let message = err
                .getattr("message")
                .ok()
                .and_then(|m| m.extract::<String>().ok())
                .or_else(|| err.str().ok().map(|s| s.to_string()))
                .unwrap_or_default();
            return HttpError::new(code, message);
        }
    }
    let w = handler_error(err);
    // A `.code` error's message travels as `{"message", "code"}` JSON on the request plane.
    let message = serde_json::from_str::<serde_json::Value>(&w.message)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or(w.message);
    if w.kind == ErrorKind::InvalidArgument {
        HttpError::bad_request(message, None)
    } else {
        HttpError::internal(message)
    }
}

#[pymethods]
impl LocalSink {
    /// Nothing to acknowledge in-process; False: no flush needed.
    fn accept(&self) -> bool {
        false
    }

    /// Nothing is buffered in-process.
    fn flush(&self) {}

    /// Send one chunk: 0 = sent, 1 = the client went away, 2 = await `credit()` first.
    fn send(&self, item: &Bound<'_, PyAny>) -> PyResult<u8> {
        let Some(tx) = self.sender() else {
            return Ok(1);
        };
        if self.context.is_stopped() {
            return Ok(1);
        }
        let bytes = Bytes::from(to_json(item)?);
        match tx.try_send(Ok(bytes)) {
            Ok(()) => Ok(0),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(1),
            Err(mpsc::error::TrySendError::Full(item)) => {
                *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(item);
                Ok(2)
            }
        }
    }

    /// Awaitable resolving once the held-back chunk was delivered (or the client left).
    fn credit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let tx = self.sender();
        let item = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        py_future(
            py,
            async move {
                if let (Some(tx), Some(item)) = (tx, item) {
                    let _ = tx.send(item).await;
                }
                Ok(())
            },
            true,
        )
    }

    /// Whether the client went away.
    fn is_stopped(&self) -> bool {
        self.context.is_stopped() || self.sender().is_none_or(|tx| tx.is_closed())
    }

    /// End the stream successfully.
    fn finish(&self) {
        self.close_with(None);
    }

    /// End the stream with the error the generator raised.
    fn fail(&self, err: &Bound<'_, PyAny>) {
        let e = engine_error(err, self.http_errors);
        self.close_with(Some(Err(e)));
    }
}

/// The engine behind a `PythonAsyncEngine` or `HttpAsyncEngine`.
pub(crate) fn openai_engine(engine: &Bound<'_, PyAny>) -> PyResult<Arc<dyn OpenAiEngine>> {
    if let Ok(e) = engine.cast::<HttpAsyncEngine>() {
        return Ok(Arc::clone(&e.get().inner) as Arc<dyn OpenAiEngine>);
    }
    if let Ok(e) = engine.cast::<PythonAsyncEngine>() {
        return Ok(Arc::clone(&e.get().inner) as Arc<dyn OpenAiEngine>);
    }
    Err(PyTypeError::new_err(format!(
        "engine must be a PythonAsyncEngine or HttpAsyncEngine, not {}",
        engine.get_type().name()?
    )))
}

/// A Python async-generator callable wrapped as an in-process engine: `generator(request)`
/// (or `generator(request, context=...)`) yields OpenAI chunk dicts; it runs on
/// `event_loop`. Errors: `ValueError`/`TypeError` → 400, anything else → 500.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct PythonAsyncEngine {
    inner: Arc<PyOpenAiEngine>,
}

#[pymethods]
impl PythonAsyncEngine {
    #[new]
    #[pyo3(signature = (generator, event_loop))]
    fn new(
        py: Python<'_>,
        generator: &Bound<'_, PyAny>,
        event_loop: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: start(py, generator, event_loop, false)?,
        })
    }
}

/// A `PythonAsyncEngine` whose exceptions with an HTTP `.code` (`HttpError`) answer with
/// that status and `.message`.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct HttpAsyncEngine {
    inner: Arc<PyOpenAiEngine>,
}

#[pymethods]
impl HttpAsyncEngine {
    #[new]
    #[pyo3(signature = (generator, event_loop))]
    fn new(
        py: Python<'_>,
        generator: &Bound<'_, PyAny>,
        event_loop: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Self {
            inner: start(py, generator, event_loop, true)?,
        })
    }
}
