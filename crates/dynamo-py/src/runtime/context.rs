//! `Context`, `ContextMetadata` and `SpanProxy`: thin views over the runtime's
//! [`dynamo_runtime::Context`].

use std::collections::BTreeMap;

use dynamo_runtime::context::Metadata;
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Lock a metadata map, recovering from poisoning (entries are plain strings).
fn lock(m: &Metadata) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The per-request handle: cancellation, id, metadata, spans.
#[pyclass(module = "dynamo._core", name = "Context", frozen)]
pub(crate) struct PyContext {
    pub(crate) inner: dynamo_runtime::Context,
}

impl PyContext {
    pub(crate) fn wrap(inner: dynamo_runtime::Context) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (id = None, metadata = None))]
    fn new(id: Option<String>, metadata: Option<BTreeMap<String, String>>) -> Self {
        Self::wrap(dynamo_runtime::Context::new(
            id,
            metadata.unwrap_or_default(),
        ))
    }

    /// Whether a graceful stop was requested.
    #[pyo3(signature = ())]
    fn is_stopped(&self) -> bool {
        self.inner.is_stopped()
    }

    /// Whether a kill was requested.
    #[pyo3(signature = ())]
    fn is_killed(&self) -> bool {
        self.inner.is_killed()
    }

    /// Request a graceful stop.
    #[pyo3(signature = ())]
    fn stop_generating(&self) {
        self.inner.stop_generating();
    }

    /// The request id.
    #[pyo3(signature = ())]
    fn id(&self) -> String {
        self.inner.id().to_owned()
    }

    /// A new context with its own cancellation, the given id and a copy of the metadata.
    #[pyo3(signature = (id))]
    fn detached(&self, id: String) -> Self {
        Self::wrap(self.inner.detached(id))
    }

    /// An awaitable resolving to True once the context is stopped or killed.
    #[pyo3(signature = ())]
    fn async_killed_or_stopped<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ctx = self.inner.clone();
        crate::aio::py_future(
            py,
            async move {
                ctx.stopped().await;
                Ok(true)
            },
            true,
        )
    }

    /// Fire the first-token signal (idempotent; a no-op without a listener).
    #[pyo3(signature = ())]
    fn notify_first_token(&self) {
        self.inner.notify_first_token();
    }

    /// Live view of the metadata.
    #[getter]
    fn metadata(&self) -> ContextMetadata {
        ContextMetadata {
            map: self.inner.metadata().clone(),
        }
    }

    #[setter]
    fn set_metadata(&self, value: BTreeMap<String, String>) {
        *self.inner.lock_metadata() = value;
    }

    /// Trace id of the inbound trace context (None: no tracing in this build).
    #[getter]
    fn trace_id(&self) -> Option<String> {
        None
    }

    /// Span id of the inbound trace context (None: no tracing in this build).
    #[getter]
    fn span_id(&self) -> Option<String> {
        None
    }

    /// Parent span id of the inbound trace context (None: no tracing in this build).
    #[getter]
    fn parent_span_id(&self) -> Option<String> {
        None
    }

    /// W3C trace headers (None: no trace information).
    #[pyo3(signature = ())]
    fn trace_headers(&self) -> Option<BTreeMap<String, String>> {
        None
    }

    /// The request's span (a no-op proxy in this build).
    #[pyo3(signature = ())]
    fn current_span(&self) -> SpanProxy {
        SpanProxy::default()
    }

    /// Open a child span (a no-op proxy in this build).
    #[pyo3(signature = (name, attrs = None))]
    fn start_span(&self, name: &str, attrs: Option<&Bound<'_, PyDict>>) -> SpanProxy {
        let _ = (name, attrs);
        SpanProxy::default()
    }

    fn __repr__(&self) -> String {
        format!(
            "Context(id='{}', stopped={}, killed={})",
            self.inner.id(),
            self.inner.is_stopped(),
            self.inner.is_killed()
        )
    }
}

/// A live `str -> str` mapping shared with its `Context`.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct ContextMetadata {
    map: Metadata,
}

#[pymethods]
impl ContextMetadata {
    fn __getitem__(&self, key: &str) -> PyResult<String> {
        lock(&self.map)
            .get(key)
            .cloned()
            .ok_or_else(|| PyKeyError::new_err(key.to_owned()))
    }

    fn __setitem__(&self, key: String, value: String) {
        lock(&self.map).insert(key, value);
    }

    fn __delitem__(&self, key: &str) -> PyResult<()> {
        lock(&self.map)
            .remove(key)
            .map(|_| ())
            .ok_or_else(|| PyKeyError::new_err(key.to_owned()))
    }

    fn __len__(&self) -> usize {
        lock(&self.map).len()
    }

    fn __contains__(&self, key: &str) -> bool {
        lock(&self.map).contains_key(key)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.keys()
            .into_pyobject(py)?
            .try_iter()
            .map(Bound::into_any)
    }

    /// The value of `key`, or `default`.
    #[pyo3(signature = (key, default = None))]
    fn get(&self, key: &str, default: Option<String>) -> Option<String> {
        lock(&self.map).get(key).cloned().or(default)
    }

    /// Remove `key` and return its value; without a default a missing key raises KeyError.
    #[pyo3(signature = (key, *args))]
    fn pop(&self, key: &str, args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<Option<String>> {
        if args.len() > 1 {
            return Err(PyValueError::new_err("pop expected at most 2 arguments"));
        }
        match lock(&self.map).remove(key) {
            Some(v) => Ok(Some(v)),
            None if args.len() == 1 => args.get_item(0)?.extract(),
            None => Err(PyKeyError::new_err(key.to_owned())),
        }
    }

    /// The keys, sorted.
    #[pyo3(signature = ())]
    fn keys(&self) -> Vec<String> {
        lock(&self.map).keys().cloned().collect()
    }

    /// The values, in key order.
    #[pyo3(signature = ())]
    fn values(&self) -> Vec<String> {
        lock(&self.map).values().cloned().collect()
    }

    /// The `(key, value)` pairs, sorted by key.
    #[pyo3(signature = ())]
    fn items(&self) -> Vec<(String, String)> {
        lock(&self.map)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Remove every entry.
    #[pyo3(signature = ())]
    fn clear(&self) {
        lock(&self.map).clear();
    }

    /// A detached dict snapshot.
    #[pyo3(signature = ())]
    fn copy(&self) -> BTreeMap<String, String> {
        lock(&self.map).clone()
    }

    fn __repr__(&self) -> String {
        let body: Vec<String> = lock(&self.map)
            .iter()
            .map(|(k, v)| format!("{k:?}: {v:?}"))
            .collect();
        format!("ContextMetadata({{{}}})", body.join(", "))
    }
}

/// A span handle mirroring the OpenTelemetry Span API. This build has no tracing exporter,
/// so every call is a validated no-op.
#[pyclass(module = "dynamo._core", frozen)]
#[derive(Default)]
pub(crate) struct SpanProxy {}

#[pymethods]
impl SpanProxy {
    /// Set an attribute (no-op).
    #[pyo3(signature = (key, value))]
    fn set_attribute(&self, key: &str, value: &Bound<'_, PyAny>) {
        let _ = (key, value);
    }

    /// Record an event (no-op).
    #[pyo3(signature = (name, attrs = None))]
    fn add_event(&self, name: &str, attrs: Option<&Bound<'_, PyDict>>) {
        let _ = (name, attrs);
    }

    /// Set the status: "ok" or "error" (anything else raises ValueError).
    #[pyo3(signature = (status, description = None))]
    fn set_status(&self, status: &str, description: Option<&str>) -> PyResult<()> {
        let _ = description;
        match status {
            "ok" | "error" => Ok(()),
            other => Err(PyValueError::new_err(format!(
                "invalid span status {other:?}: expected 'ok' or 'error'"
            ))),
        }
    }

    /// End the span (idempotent).
    #[pyo3(signature = ())]
    fn close(&self) {}

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, exc_value, traceback))]
    fn __exit__(
        &self,
        exc_type: &Bound<'_, PyAny>,
        exc_value: &Bound<'_, PyAny>,
        traceback: &Bound<'_, PyAny>,
    ) -> bool {
        let _ = (exc_type, exc_value, traceback);
        false
    }
}
