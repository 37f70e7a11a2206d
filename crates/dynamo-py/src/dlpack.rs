//! DLPack export of block manager tensors: the only place the bindings build raw DLPack
//! structures.
//!
//! A capsule owns a boxed [`Context`] holding the `DLManagedTensor` (or
//! `DLManagedTensorVersioned`), its shape and strides, and a strong reference to the block.
//! Ownership follows the DLPack protocol:
//!
//! * a consumer (NumPy, PyTorch) renames the capsule to `used_dltensor[_versioned]` and later
//!   calls the tensor's `deleter`, which frees the context and releases the block, from any
//!   thread, with or without the GIL (releasing a block takes only the pool's mutex);
//! * a capsule that was never consumed still has its original name when Python destroys it;
//!   the capsule destructor then calls the deleter itself.
//!
//! Either way the deleter runs exactly once, and the block (with its memory) lives until
//! then, so a tensor can outlive every Python object of the block manager.

#![expect(
    unsafe_code,
    reason = "DLPack is a C ABI: raw structs, a PyCapsule and a C deleter"
)]

use std::any::Any;
use std::ffi::{CStr, c_void};
use std::sync::Arc;

use dynamo_block_manager::{DTypeCode, MemoryKind, TensorDesc};
use pyo3::ffi;
use pyo3::prelude::*;

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const DEVICE_CUDA: i32 = 2;

/// The DLPack version this module produces for versioned requests.
const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// Owner of one exported tensor. `managed` is the first field of a `repr(C)` struct, so a
/// pointer to the context is also a pointer to the managed tensor.
#[repr(C)]
struct Context<M> {
    managed: M,
    shape: [i64; 5],
    strides: [i64; 5],
    _owner: Arc<dyn Any + Send + Sync>,
}

/// The `(device_type, device_id)` pair of `__dlpack_device__`, consistent with the capsule:
/// host memory (pinned or not) is `kDLCPU` device 0, device memory is `kDLCUDA`.
pub(crate) fn device_of(memory: MemoryKind) -> (i32, i32) {
    match memory {
        MemoryKind::Device(id) => (DEVICE_CUDA, i32::try_from(id).unwrap_or(i32::MAX)),
        _ => (DEVICE_CPU, 0),
    }
}

fn dl_tensor(desc: &TensorDesc) -> DLTensor {
    let (device_type, device_id) = device_of(desc.memory);
    let (code, bits) = desc.dtype.dlpack();
    let code = match code {
        DTypeCode::Int => 0,
        DTypeCode::UInt => 1,
        DTypeCode::Float => 2,
        DTypeCode::Bfloat => 4,
        _ => 1,
    };
    DLTensor {
        data: desc.addr as usize as *mut c_void,
        device: DLDevice {
            device_type,
            device_id,
        },
        ndim: 5,
        dtype: DLDataType {
            code,
            bits,
            lanes: 1,
        },
        // Filled in once the context has its final (boxed) address.
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn dims(v: [usize; 5]) -> [i64; 5] {
    v.map(|x| i64::try_from(x).unwrap_or(i64::MAX))
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` is the first field of a `Context<DLManagedTensor>` leaked by
    // `export` (same address, `repr(C)`); the protocol calls the deleter exactly once.
    drop(unsafe { Box::from_raw(managed.cast::<Context<DLManagedTensor>>()) });
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`, for `Context<DLManagedTensorVersioned>`.
    drop(unsafe { Box::from_raw(managed.cast::<Context<DLManagedTensorVersioned>>()) });
}

unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the GIL and a live capsule. A consumed capsule has been
    // renamed, so `IsValid` is false and the consumer owns the tensor; `IsValid` never sets
    // an exception.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = managed.as_ref().and_then(|m| m.deleter) {
                deleter(managed);
            }
        }
    }
}

unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_legacy_capsule`, for the versioned name and struct.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = managed.as_ref().and_then(|m| m.deleter) {
                deleter(managed);
            }
        }
    }
}

/// Wrap `desc` in a DLPack capsule that keeps `owner` alive until the consumer releases the
/// tensor. `versioned` selects DLPack 1.0 (`dltensor_versioned`) over the legacy capsule.
pub(crate) fn export(
    py: Python<'_>,
    desc: &TensorDesc,
    owner: Arc<dyn Any + Send + Sync>,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    let shape = dims(desc.shape);
    let strides = dims(desc.strides());
    let tensor = dl_tensor(desc);
    let (ptr, name, destructor): (*mut c_void, &CStr, ffi::PyCapsule_Destructor) = if versioned {
        let ctx = Box::into_raw(Box::new(Context {
            managed: DLManagedTensorVersioned {
                version: DLPACK_VERSION,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor: tensor,
            },
            shape,
            strides,
            _owner: owner,
        }));
        // SAFETY: `ctx` was just leaked from a Box and is exclusively ours until the capsule
        // exists; the shape/strides pointers target the context's own (pinned) arrays.
        unsafe {
            (*ctx).managed.manager_ctx = ctx.cast();
            (*ctx).managed.dl_tensor.shape = (*ctx).shape.as_mut_ptr();
            (*ctx).managed.dl_tensor.strides = (*ctx).strides.as_mut_ptr();
        }
        (ctx.cast(), VERSIONED_NAME, destroy_versioned_capsule)
    } else {
        let ctx = Box::into_raw(Box::new(Context {
            managed: DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape,
            strides,
            _owner: owner,
        }));
        // SAFETY: as above.
        unsafe {
            (*ctx).managed.manager_ctx = ctx.cast();
            (*ctx).managed.dl_tensor.shape = (*ctx).shape.as_mut_ptr();
            (*ctx).managed.dl_tensor.strides = (*ctx).strides.as_mut_ptr();
        }
        (ctx.cast(), LEGACY_NAME, destroy_legacy_capsule)
    };
    // SAFETY: `ptr` is a valid context whose first field is the managed tensor; `name` is a
    // 'static C string as the capsule API requires; we hold the GIL.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        // The capsule does not exist, so nobody else will free the context.
        // SAFETY: `ptr` is the context leaked above, not shared with anyone.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `capsule` is a new, non-null, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}
