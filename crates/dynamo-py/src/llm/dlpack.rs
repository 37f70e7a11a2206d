//! DLPack capsules for block manager tensors: the only place the bindings touch raw DLPack
//! pointers.
//!
//! The managed tensor itself (C structs, deleter, a strong reference to the block) is built
//! by `dynamo_block_manager::dlpack`, where Miri checks it. This module wraps it in a
//! `PyCapsule` following the DLPack protocol:
//!
//! * a consumer (NumPy, PyTorch) renames the capsule to `used_dltensor[_versioned]` and later
//!   calls the tensor's deleter itself, from any thread, with or without the GIL (the deleter
//!   only releases the block, which takes the pool's mutex);
//! * a capsule that was never consumed keeps its name, and its destructor calls the deleter.
//!
//! Either way the deleter runs exactly once, and the block (with its memory) lives until
//! then, so a tensor can outlive every Python object of the block manager.

#![expect(
    unsafe_code,
    reason = "PyCapsule creation and its C destructor for DLPack export"
)]

use std::any::Any;
use std::ffi::CStr;
use std::sync::Arc;

use dynamo_block_manager::TensorDesc;
use dynamo_block_manager::dlpack::{ManagedTensor, release_unconsumed};
use pyo3::ffi;
use pyo3::prelude::*;

pub(crate) use dynamo_block_manager::dlpack::device_of;

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// Release the tensor of a capsule nobody consumed.
///
/// # Safety
/// `capsule` is a live capsule created by [`export`] with `name` / `versioned` matching.
unsafe fn destroy(capsule: *mut ffi::PyObject, name: &CStr, versioned: bool) {
    // SAFETY: called by Python with the GIL on a live capsule. A consumed capsule was
    // renamed, so `IsValid` is false and the consumer owns the tensor (and its deleter);
    // `IsValid` never sets an exception. An unconsumed capsule still holds the pointer from
    // `ManagedTensor::into_raw`, whose deleter has not run.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, name.as_ptr()) == 1 {
            let ptr = ffi::PyCapsule_GetPointer(capsule, name.as_ptr());
            if !ptr.is_null() {
                release_unconsumed(ptr, versioned);
            }
        }
    }
}

unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: installed only on legacy capsules by `export`.
    unsafe { destroy(capsule, LEGACY_NAME, false) }
}

unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: installed only on versioned capsules by `export`.
    unsafe { destroy(capsule, VERSIONED_NAME, true) }
}

/// Wrap `desc` in a DLPack capsule that keeps `owner` alive until the consumer releases the
/// tensor. `versioned` selects DLPack 1.0 (`dltensor_versioned`) over the legacy capsule.
pub(crate) fn export(
    py: Python<'_>,
    desc: &TensorDesc,
    owner: Arc<dyn Any + Send + Sync>,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    let (name, destructor): (&CStr, ffi::PyCapsule_Destructor) = if versioned {
        (VERSIONED_NAME, destroy_versioned)
    } else {
        (LEGACY_NAME, destroy_legacy)
    };
    let ptr = ManagedTensor::new(desc, owner, versioned).into_raw();
    // SAFETY: `ptr` is a live managed tensor; `name` is a 'static C string as the capsule API
    // requires; we hold the GIL.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        // No capsule exists, so nobody else will delete the tensor.
        // SAFETY: `ptr` came from `into_raw` with this `versioned`; its deleter has not run.
        unsafe { release_unconsumed(ptr, versioned) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `capsule` is a new, non-null, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}
