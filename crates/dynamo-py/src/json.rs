//! JSON conversion of Python values, for what is JSON outside the request plane: the
//! system server's `/engine` routes, in-process engines behind the HTTP frontend, and
//! configuration values. Request-plane payloads are MessagePack (`msgpack.rs`).
//!
//! Python values go to JSON bytes (`None`, `bool`, `int`, `float`, `str`, `list`, `tuple`,
//! `dict` with `str`/`int`/`float`/`bool` keys, and pydantic models through
//! `model_dump()`), and JSON bytes come back as plain Python values.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Nesting bound: deeper values are almost certainly cyclic.
const MAX_DEPTH: usize = 256;

/// Convert a Python value to JSON bytes.
pub(crate) fn to_json(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let value = to_value(obj, 0)?;
    serde_json::to_vec(&value).map_err(|e| PyValueError::new_err(e.to_string()))
}

fn to_value(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(
            "value is nested too deeply to serialize (circular reference?)",
        ));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(Value::Number(v.into()));
        }
        if let Ok(v) = obj.extract::<u64>() {
            return Ok(Value::Number(v.into()));
        }
        return Err(PyValueError::new_err(
            "integer out of range for JSON serialization (must fit in 64 bits)",
        ));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Number::from_f64(f.value()).map_or(Value::Null, Value::Number));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            map.insert(key_string(&k)?, to_value(&v, depth + 1)?);
        }
        return Ok(Value::Object(map));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l.iter().map(|v| to_value(&v, depth + 1)).collect();
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t.iter().map(|v| to_value(&v, depth + 1)).collect();
    }
    if obj.hasattr(pyo3::intern!(obj.py(), "model_dump"))? {
        let dumped = obj.call_method1(pyo3::intern!(obj.py(), "model_dump"), ())?;
        return to_value(&dumped, depth + 1);
    }
    Err(PyTypeError::new_err(format!(
        "Object of type {} is not JSON serializable",
        obj.get_type().name()?
    )))
}

fn key_string(k: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = k.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    if k.is_instance_of::<PyBool>() {
        return Ok(if k.is_truthy()? { "true" } else { "false" }.to_owned());
    }
    if k.is_instance_of::<PyInt>() || k.is_instance_of::<PyFloat>() {
        return Ok(k.str()?.to_str()?.to_owned());
    }
    Err(PyTypeError::new_err(format!(
        "keys must be str, int, float or bool, not {}",
        k.get_type().name()?
    )))
}

/// Convert JSON bytes to a Python value.
pub(crate) fn from_json<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| PyValueError::new_err(format!("malformed JSON payload: {e}")))?;
    from_value(py, &value)
}

/// Convert a JSON value to a Python value.
pub(crate) fn from_value<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(from_value(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, from_value(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// Convert a JSON value to a Python object (via the `json` module: exact for every JSON
/// type, and not a hot path).
pub(crate) fn json_to_py(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (value.to_string(),))?.unbind())
}

/// Convert a JSON-able Python object to a JSON value (`TypeError` from `json.dumps`
/// otherwise).
pub(crate) fn py_to_json(obj: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let text: String = obj
        .py()
        .import("json")?
        .call_method1("dumps", (obj,))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// [`py_to_json`] of an optional argument (`None` and a missing one are both `None`).
pub(crate) fn opt_json(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<serde_json::Value>> {
    obj.filter(|o| !o.is_none()).map(py_to_json).transpose()
}
