//! `FrontendRoute`, `FrontendResponse`, `FrontendExtensionContext`: Python handlers as
//! extension routes of the HTTP frontend. Validation, routing and the failure answer live
//! in `dynamo_frontend::http::extensions`; this file only converts between Python and it.

use std::sync::Arc;

use dynamo_frontend::http::extensions::{
    ExtensionContext, ExtensionHandler, ExtensionResponse, ExtensionRoute, check_routes,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FrontendRoute>()?;
    m.add_class::<FrontendResponse>()?;
    m.add_class::<FrontendExtensionContext>()?;
    Ok(())
}

/// A trusted extension route on the HTTP frontend (static-path `GET` only).
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct FrontendRoute {
    inner: ExtensionRoute,
}

#[pymethods]
impl FrontendRoute {
    #[new]
    #[pyo3(signature = (method, path, handler))]
    fn new(method: &str, path: &str, handler: Bound<'_, PyAny>) -> PyResult<Self> {
        if !handler.is_callable() {
            return Err(PyTypeError::new_err(
                "FrontendRoute handler must be callable",
            ));
        }
        let inspect = handler.py().import("inspect")?;
        let is_async = inspect
            .call_method1("iscoroutinefunction", (&handler,))?
            .is_truthy()?
            || match handler.getattr("__call__") {
                Ok(call) => inspect
                    .call_method1("iscoroutinefunction", (call,))?
                    .is_truthy()?,
                Err(_) => false,
            };
        if is_async {
            return Err(PyValueError::new_err(
                "FrontendRoute handler must be synchronous; async def handlers are not supported",
            ));
        }
        let handler = handler.unbind();
        let call: ExtensionHandler = Arc::new(move |ctx| {
            Python::attach(|py| call_handler(py, &handler, ctx)).map_err(|e| e.to_string())
        });
        let inner = ExtensionRoute::new(method, path, call)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { inner })
    }

    /// Always `"GET"`.
    #[getter]
    fn method(&self) -> &'static str {
        self.inner.method()
    }

    #[getter]
    fn path(&self) -> &str {
        self.inner.path()
    }

    fn __repr__(&self) -> String {
        format!("FrontendRoute(method='GET', path={:?})", self.inner.path())
    }
}

/// A handler's answer with an explicit status.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct FrontendResponse {
    status: u16,
    body: Py<PyAny>,
}

#[pymethods]
impl FrontendResponse {
    #[new]
    #[pyo3(signature = (status_code, body))]
    fn new(status_code: i64, body: Py<PyAny>) -> PyResult<Self> {
        let checked = ExtensionResponse::new(status_code, serde_json::Value::Null)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            status: checked.status,
            body,
        })
    }

    fn __repr__(&self) -> String {
        format!("FrontendResponse(status_code={})", self.status)
    }
}

/// The read-only, live view of the frontend a handler receives.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct FrontendExtensionContext {
    inner: ExtensionContext,
}

#[pymethods]
impl FrontendExtensionContext {
    fn is_ready(&self) -> bool {
        self.inner.is_ready()
    }

    fn is_cancelled(&self) -> bool {
        self.inner.is_cancelled()
    }

    fn has_any_ready_model(&self) -> bool {
        self.inner.has_any_ready_model()
    }

    fn is_model_ready_to_serve(&self, model: &str) -> bool {
        self.inner.is_model_ready_to_serve(model)
    }

    fn model_display_names(&self) -> Vec<String> {
        self.inner.model_display_names()
    }

    fn serving_ready_display_names(&self) -> Vec<String> {
        self.inner.serving_ready_display_names()
    }
}

/// Run `handler` (on the caller's blocking thread) and convert its answer.
fn call_handler(
    py: Python<'_>,
    handler: &Py<PyAny>,
    ctx: ExtensionContext,
) -> PyResult<ExtensionResponse> {
    let ctx = Py::new(py, FrontendExtensionContext { inner: ctx })?;
    let out = handler.bind(py).call1((ctx,))?;
    if py
        .import("inspect")?
        .call_method1("isawaitable", (&out,))?
        .is_truthy()?
    {
        // Close a coroutine so Python does not warn that it was never awaited.
        if let Ok(close) = out.getattr("close") {
            let _ = close.call0();
        }
        return Err(PyTypeError::new_err(
            "FrontendRoute handler returned an awaitable; return synchronously (a JSON body or a FrontendResponse)",
        ));
    }
    if let Ok(r) = out.cast::<FrontendResponse>() {
        let r = r.get();
        return Ok(ExtensionResponse {
            status: r.status,
            body: to_json(r.body.bind(py))?,
        });
    }
    Ok(ExtensionResponse {
        status: 200,
        body: to_json(&out)?,
    })
}

/// JSON of a handler's body: tuples become arrays (as `json`), and so do sets (as the
/// reference's serializer); anything else unserializable is an error.
fn to_json(obj: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("default", py.import("builtins")?.getattr("list")?)?;
    let text: String = py
        .import("json")?
        .call_method("dumps", (obj,), Some(&kwargs))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The routes of `run_input(..., frontend_route_extensions=...)`.
///
/// # Errors
/// `TypeError` for an item that is not a `FrontendRoute` (or a non-iterable);
/// `ValueError` when two share a path.
pub(crate) fn routes_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Vec<ExtensionRoute>> {
    let mut routes = Vec::new();
    for item in obj.try_iter()? {
        let item = item?;
        let route = item.cast::<FrontendRoute>().map_err(|_| {
            PyTypeError::new_err(format!(
                "frontend_route_extensions items must be FrontendRoute, got {}",
                item.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
        routes.push(route.get().inner.clone());
    }
    check_routes(&routes, &[]).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(routes)
}
