//! MessagePack conversion of request-plane payloads, straight between Python objects and
//! bytes (no intermediate value tree on the hot path).
//!
//! The request plane's codec is MessagePack (`dynamo_runtime::transport::codec`), as the
//! reference's. Python → MessagePack: `None`, `bool`, `int`, `float`, `str`, `bytes`
//! (`bin`), `list`/`tuple`/`set` (array), `dict` (map; keys keep their type), and objects
//! with `model_dump()` (pydantic models). MessagePack → Python: the same types; arrays come
//! back as lists.
//!
//! Integers outside the 64-bit range follow the reference (observed on 1.6.1): in a request
//! they are refused (`ValueError`, its text "invalid type: integer `N` as u128, expected any
//! valid MessagePack value"; beyond 128 bits `OverflowError`); in a response item they
//! travel as the 16 big-endian bytes of the 128-bit integer (a `bin`, so the caller gets
//! `bytes`), and beyond 128 bits the item cannot be serialised.

use dynamo_runtime::transport::codec::{
    Head, Reader, write_array_len, write_bin, write_bool, write_f64, write_i64, write_map_len,
    write_nil, write_str, write_u64,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString,
    PyTuple,
};

/// Nesting bound: deeper values are almost certainly cyclic.
const MAX_DEPTH: usize = 256;

/// What to do with an integer that needs more than 64 bits (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wide {
    /// Refuse it (request bodies and request items).
    Refuse,
    /// Send its 128-bit big-endian bytes (response items).
    Bytes,
}

/// Encode a Python value.
pub(crate) fn to_msgpack(obj: &Bound<'_, PyAny>, wide: Wide) -> PyResult<Vec<u8>> {
    let mut buf = Vec::with_capacity(64);
    write_value(&mut buf, obj, wide, 0)?;
    Ok(buf)
}

/// Append the encoding of a Python value to `buf`.
pub(crate) fn write_value(
    buf: &mut Vec<u8>,
    obj: &Bound<'_, PyAny>,
    wide: Wide,
    depth: usize,
) -> PyResult<()> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(
            "value is nested too deeply to serialize (circular reference?)",
        ));
    }
    if obj.is_none() {
        write_nil(buf);
    } else if let Ok(s) = obj.cast::<PyString>() {
        write_str(buf, s.to_str()?);
    } else if let Ok(b) = obj.cast::<PyBool>() {
        write_bool(buf, b.is_true());
    } else if obj.is_instance_of::<PyInt>() {
        write_int(buf, obj, wide)?;
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        write_f64(buf, f.value());
    } else if let Ok(d) = obj.cast::<PyDict>() {
        write_map_len(buf, d.len());
        for (k, v) in d.iter() {
            write_value(buf, &k, wide, depth + 1)?;
            write_value(buf, &v, wide, depth + 1)?;
        }
    } else if let Ok(l) = obj.cast::<PyList>() {
        write_array_len(buf, l.len());
        for v in l.iter() {
            write_value(buf, &v, wide, depth + 1)?;
        }
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        write_array_len(buf, t.len());
        for v in t.iter() {
            write_value(buf, &v, wide, depth + 1)?;
        }
    } else if let Ok(b) = obj.cast::<PyBytes>() {
        write_bin(buf, b.as_bytes());
    } else if let Ok(b) = obj.cast::<PyByteArray>() {
        write_bin(buf, &b.to_vec());
    } else if let Ok(s) = obj.cast::<PySet>() {
        write_array_len(buf, s.len());
        for v in s.iter() {
            write_value(buf, &v, wide, depth + 1)?;
        }
    } else if let Ok(s) = obj.cast::<PyFrozenSet>() {
        write_array_len(buf, s.len());
        for v in s.iter() {
            write_value(buf, &v, wide, depth + 1)?;
        }
    } else if obj.hasattr(pyo3::intern!(obj.py(), "model_dump"))? {
        let dumped = obj.call_method0(pyo3::intern!(obj.py(), "model_dump"))?;
        write_value(buf, &dumped, wide, depth + 1)?;
    } else {
        return Err(PyTypeError::new_err(format!(
            "unsupported type {}",
            obj.get_type().name()?
        )));
    }
    Ok(())
}

fn write_int(buf: &mut Vec<u8>, obj: &Bound<'_, PyAny>, wide: Wide) -> PyResult<()> {
    if let Ok(v) = obj.extract::<i64>() {
        write_i64(buf, v);
        return Ok(());
    }
    if let Ok(v) = obj.extract::<u64>() {
        write_u64(buf, v);
        return Ok(());
    }
    let (wide128, unsigned) = match obj.extract::<u128>() {
        Ok(v) => (Some(v.to_be_bytes()), true),
        Err(_) => (obj.extract::<i128>().ok().map(i128::to_be_bytes), false),
    };
    match (wide, wide128) {
        (Wide::Bytes, Some(bytes)) => {
            write_bin(buf, &bytes);
            Ok(())
        }
        (Wide::Refuse, Some(_)) => Err(PyValueError::new_err(format!(
            "invalid type: integer `{}` as {}, expected any valid MessagePack value",
            obj.str()?,
            if unsigned { "u128" } else { "i128" }
        ))),
        (_, None) => Err(PyOverflowError::new_err(
            "Python int too large to convert to C long",
        )),
    }
}

/// Decode one value that fills `bytes`.
pub(crate) fn from_msgpack<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let mut r = Reader::new(bytes);
    let v = read_value(py, &mut r, 0)?;
    if r.remaining() != 0 {
        return Err(PyValueError::new_err(
            "malformed MessagePack payload: trailing bytes",
        ));
    }
    Ok(v)
}

fn malformed(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("malformed MessagePack payload: {e}"))
}

fn read_value<'py>(
    py: Python<'py>,
    r: &mut Reader<'_>,
    depth: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if depth > MAX_DEPTH {
        return Err(malformed("nested too deeply"));
    }
    Ok(match r.head().map_err(malformed)? {
        Head::Nil => py.None().into_bound(py),
        Head::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
        Head::Int(i) => i.into_pyobject(py)?.into_any(),
        Head::UInt(u) => u.into_pyobject(py)?.into_any(),
        Head::Float(f) => PyFloat::new(py, f).into_any(),
        Head::Str(s) => {
            let s = std::str::from_utf8(s).map_err(malformed)?;
            PyString::new(py, s).into_any()
        }
        Head::Bin(b) => PyBytes::new(py, b).into_any(),
        Head::Array(n) => {
            // Never trust a length for preallocation beyond what the bytes can hold.
            let mut items = Vec::with_capacity(n.min(r.remaining()));
            for _ in 0..n {
                items.push(read_value(py, r, depth + 1)?);
            }
            PyList::new(py, items)?.into_any()
        }
        Head::Map(n) => {
            let dict = PyDict::new(py);
            for _ in 0..n {
                let k = read_value(py, r, depth + 1)?;
                let v = read_value(py, r, depth + 1)?;
                dict.set_item(k, v)?;
            }
            dict.into_any()
        }
        Head::Ext => {
            return Err(PyValueError::new_err(
                "unsupported MessagePack extension type",
            ));
        }
    })
}
