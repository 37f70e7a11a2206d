//! Validated conversions of Python arguments into core types.
//!
//! Token lists are the hottest conversion in the API (a 100k-token prompt is converted on
//! every hashing or routing call), so [`tokens`] has a fast path for `list` and `tuple`
//! that avoids pyo3's generic sequence extraction.

use dynamo_kv_router::hashing::{BlockExtraInfo, BlockMmObjectInfo};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySequence, PyString, PyTuple};

/// Convert a sequence of token ids (`list`, `tuple`, or any other sequence of ints such as
/// `bytes` or a NumPy array) into `u32`s.
///
/// Errors: a non-sequence or `str` → `TypeError`; a non-integer item → `TypeError`; a
/// negative or too large id → `OverflowError` (Python's own messages).
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return indexed_tokens(list.as_any(), list.len(), ffi::PyList_GetItem);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return indexed_tokens(tuple.as_any(), tuple.len(), ffi::PyTuple_GetItem);
    }
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "tokens must be a sequence of ints, not str",
        ));
    }
    // Other sized iterables of ints: `bytes`, `array.array`, NumPy arrays (not registered
    // as `Sequence`). Unsized iterators are rejected: consuming a generator here would lose
    // the caller's data on error.
    let not_a_sequence = || {
        PyTypeError::new_err(format!(
            "tokens must be a sequence of ints, not {}",
            type_name(obj)
        ))
    };
    let len = obj.len().map_err(|_| not_a_sequence())?;
    let mut out = Vec::with_capacity(len);
    for item in obj.try_iter().map_err(|_| not_a_sequence())? {
        out.push(item?.extract::<u32>()?);
    }
    Ok(out)
}

/// Signature shared by `PyList_GetItem` and `PyTuple_GetItem`: a bounds-checked borrowed
/// item, or NULL with `IndexError` set.
type GetItem = unsafe extern "C" fn(*mut ffi::PyObject, ffi::Py_ssize_t) -> *mut ffi::PyObject;

/// Token extraction for `list`/`tuple` through the stable C API.
///
/// pyo3's generic path costs ~11 ns per item (an owned reference per item plus a
/// `__index__`-aware conversion); this loop costs ~4 ns, which is what lets hashing run at
/// more than twice the reference's tokens/s. Exact ints take the fast path; anything else
/// (negative, too large, not an int, objects with `__index__`) falls back to pyo3's
/// conversion, which produces Python's usual `OverflowError` / `TypeError`.
#[expect(
    unsafe_code,
    reason = "raw stable-ABI item access is the measured bottleneck of hashing long prompts"
)]
fn indexed_tokens(obj: &Bound<'_, PyAny>, len: usize, get_item: GetItem) -> PyResult<Vec<u32>> {
    let py = obj.py();
    let mut out = Vec::with_capacity(len);
    for i in 0..len {
        // A Python list index always fits in Py_ssize_t: len() returned it.
        let index = i as ffi::Py_ssize_t;
        // SAFETY: `obj` is a live list/tuple (we hold the GIL through `Bound`), `get_item`
        // is the matching bounds-checked accessor and returns a borrowed reference or NULL.
        // The list cannot shrink under us: nothing in the fast path runs Python code, and
        // after a slow-path call (which may) the next access is bounds-checked again.
        let item = unsafe { get_item(obj.as_ptr(), index) };
        if item.is_null() {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `item` is a valid borrowed reference; PyLong_AsUnsignedLong runs no
        // Python code (it does not call `__index__`).
        let value = unsafe { ffi::PyLong_AsUnsignedLong(item) };
        // `c_ulong::MAX` is also the error marker, and u32::MAX itself goes the slow way,
        // which keeps this branch correct where c_ulong is 32 bits wide.
        #[allow(
            clippy::useless_conversion,
            reason = "c_ulong is u64 here but u32 on other platforms (not `expect`: it would not fire there)"
        )]
        let value = u64::from(value);
        if value < u64::from(u32::MAX) {
            out.push(value as u32);
            continue;
        }
        // SAFETY: clearing a (possibly absent) pending error is always sound with the GIL.
        unsafe { ffi::PyErr_Clear() };
        // SAFETY: `item` is a valid borrowed reference; the Bound takes its own reference,
        // so it stays valid even if the slow-path conversion mutates the container.
        let item = unsafe { Bound::from_borrowed_ptr(py, item) };
        out.push(item.extract::<u32>()?);
    }
    Ok(out)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "<unknown>".to_owned())
}

/// Convert `block_mm_infos` (`[None | {"mm_objects": [{"mm_hash": int, "offsets":
/// [[start, end], ...]}]}]`) into core values. Errors are `ValueError`s naming the path of
/// the bad field, e.g. `block_mm_infos[2].mm_objects[0].mm_hash`.
pub(crate) fn block_mm_infos(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Option<BlockExtraInfo>>> {
    let path = "block_mm_infos";
    let items = sequence_items(obj, path)?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            if item.is_none() {
                Ok(None)
            } else {
                block_extra_info(item, &format!("{path}[{i}]")).map(Some)
            }
        })
        .collect()
}

/// Convert one `{"mm_objects": [...]}` mapping; `path` names it in errors.
pub(crate) fn block_extra_info(obj: &Bound<'_, PyAny>, path: &str) -> PyResult<BlockExtraInfo> {
    let dict = obj.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err(format!(
            "{path}: expected a dict with key 'mm_objects' or None, got {}",
            type_name(obj)
        ))
    })?;
    let objects = dict
        .get_item("mm_objects")?
        .ok_or_else(|| PyValueError::new_err(format!("{path}: missing field 'mm_objects'")))?;
    let path = format!("{path}.mm_objects");
    let mm_objects = sequence_items(&objects, &path)?
        .iter()
        .enumerate()
        .map(|(j, o)| mm_object(o, &format!("{path}[{j}]")))
        .collect::<PyResult<_>>()?;
    Ok(BlockExtraInfo { mm_objects })
}

fn mm_object(obj: &Bound<'_, PyAny>, path: &str) -> PyResult<BlockMmObjectInfo> {
    let dict = obj.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err(format!(
            "{path}: expected a dict with keys 'mm_hash' and 'offsets', got {}",
            type_name(obj)
        ))
    })?;
    let mm_hash = dict
        .get_item("mm_hash")?
        .ok_or_else(|| PyValueError::new_err(format!("{path}: missing field 'mm_hash'")))?;
    let mm_hash = mm_hash.extract::<u64>().map_err(|e| {
        PyValueError::new_err(format!(
            "{path}.mm_hash: expected an unsigned 64-bit integer ({e})"
        ))
    })?;
    // Offsets are informational (never hashed); an absent list is accepted as empty.
    let offsets = match dict.get_item("offsets")? {
        None => Vec::new(),
        Some(o) if o.is_none() => Vec::new(),
        Some(o) => {
            let opath = format!("{path}.offsets");
            sequence_items(&o, &opath)?
                .iter()
                .enumerate()
                .map(|(k, pair)| offset_pair(pair, &format!("{opath}[{k}]")))
                .collect::<PyResult<_>>()?
        }
    };
    Ok(BlockMmObjectInfo { mm_hash, offsets })
}

/// One `[start, end]` pair of non-negative ints (a list or a tuple).
fn offset_pair(obj: &Bound<'_, PyAny>, path: &str) -> PyResult<(usize, usize)> {
    let bad = |detail: String| {
        PyValueError::new_err(format!(
            "{path}: expected a [start, end] pair of non-negative ints ({detail})"
        ))
    };
    let items = sequence_items(obj, path).map_err(|e| bad(e.to_string()))?;
    let [start, end] = items.as_slice() else {
        return Err(bad(format!("got {} items", items.len())));
    };
    let int = |o: &Bound<'_, PyAny>| o.extract::<usize>().map_err(|e| bad(e.to_string()));
    Ok((int(start)?, int(end)?))
}

fn sequence_items<'py>(obj: &Bound<'py, PyAny>, path: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let not_a_list =
        || PyValueError::new_err(format!("{path}: expected a list, got {}", type_name(obj)));
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyDict>() {
        return Err(not_a_list());
    }
    let seq = obj.cast::<PySequence>().map_err(|_| not_a_list())?;
    seq.try_iter()?.collect()
}
