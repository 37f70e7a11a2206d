//! DLPack managed tensors over block memory, independent of Python.
//!
//! [`ManagedTensor::new`] builds a `DLManagedTensor` (legacy) or `DLManagedTensorVersioned`
//! (DLPack 1.0) describing a [`TensorDesc`], owning a strong reference to whatever keeps the
//! memory alive (a block handle). [`ManagedTensor::into_raw`] hands the C struct to a
//! consumer; the consumer's single call of the struct's `deleter` frees it and drops the
//! owner, from any thread. [`release_unconsumed`] runs that deleter for a producer whose
//! tensor was never consumed (an unused Python capsule).
//!
//! The layouts follow `dlpack.h` (v1.0): `DLTensor { data, device, ndim, dtype, shape,
//! strides, byte_offset }`; strides are in elements and always present.

#![expect(
    unsafe_code,
    reason = "DLPack is a C ABI: raw structs handed to a foreign consumer and a C deleter"
)]

use std::any::Any;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::block::TensorDesc;
use crate::dtype::DTypeCode;
use crate::storage::MemoryKind;

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub const DEVICE_CUDA: i32 = 2;

/// The `(device_type, device_id)` of memory: host memory (pinned or not) is `kDLCPU` device
/// 0, so consumers treat it as ordinary CPU memory; device memory is `kDLCUDA`.
pub fn device_of(memory: MemoryKind) -> (i32, i32) {
    match memory {
        MemoryKind::Device(id) => (DEVICE_CUDA, i32::try_from(id).unwrap_or(i32::MAX)),
        _ => (DEVICE_CPU, 0),
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The DLPack version of versioned tensors.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// Owner of one exported tensor. `managed` is the first field of a `repr(C)` struct, so a
/// pointer to the context is also a pointer to the managed tensor (and `manager_ctx`).
#[repr(C)]
struct Context<M> {
    managed: M,
    shape: [i64; 5],
    strides: [i64; 5],
    _owner: Arc<dyn Any + Send + Sync>,
}

fn dl_tensor(desc: &TensorDesc) -> DLTensor {
    let (device_type, device_id) = device_of(desc.memory);
    let (code, bits) = desc.dtype.dlpack();
    let code = match code {
        DTypeCode::Int => 0,
        DTypeCode::UInt => 1,
        DTypeCode::Float => 2,
        DTypeCode::Bfloat => 4,
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
        // Set once the context has its final (boxed) address.
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn dims(v: [usize; 5]) -> [i64; 5] {
    v.map(|x| i64::try_from(x).unwrap_or(i64::MAX))
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: `managed` is the first field of a `Context<DLManagedTensor>` leaked by
        // `ManagedTensor::new` (same address, `repr(C)`); the protocol calls the deleter
        // exactly once.
        drop(unsafe { Box::from_raw(managed.cast::<Context<DLManagedTensor>>()) });
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if !managed.is_null() {
        // SAFETY: as in `delete_legacy`, for `Context<DLManagedTensorVersioned>`.
        drop(unsafe { Box::from_raw(managed.cast::<Context<DLManagedTensorVersioned>>()) });
    }
}

/// A DLPack managed tensor not yet handed to a consumer; dropping it frees it.
#[derive(Debug)]
pub struct ManagedTensor {
    ptr: NonNull<c_void>,
    versioned: bool,
}

// SAFETY: the context is exclusively owned until `into_raw`; its owner is `Send + Sync` and
// its raw pointers only describe memory kept alive by that owner.
unsafe impl Send for ManagedTensor {}

impl ManagedTensor {
    /// Describe `desc`, keeping `owner` alive until the tensor is deleted. `versioned`
    /// selects `DLManagedTensorVersioned` (DLPack 1.0) over the legacy `DLManagedTensor`.
    pub fn new(desc: &TensorDesc, owner: Arc<dyn Any + Send + Sync>, versioned: bool) -> Self {
        let shape = dims(desc.shape);
        let strides = dims(desc.strides());
        let tensor = dl_tensor(desc);
        let ptr: *mut c_void = if versioned {
            let ctx = Box::into_raw(Box::new(Context {
                managed: DLManagedTensorVersioned {
                    version: VERSION,
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_versioned),
                    flags: 0,
                    dl_tensor: tensor,
                },
                shape,
                strides,
                _owner: owner,
            }));
            // SAFETY: `ctx` was just leaked from a Box and is exclusively ours; shape and
            // strides point into the same heap allocation, which does not move.
            unsafe {
                (*ctx).managed.manager_ctx = ctx.cast();
                (*ctx).managed.dl_tensor.shape = (&raw mut (*ctx).shape).cast();
                (*ctx).managed.dl_tensor.strides = (&raw mut (*ctx).strides).cast();
            }
            ctx.cast()
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
                (*ctx).managed.dl_tensor.shape = (&raw mut (*ctx).shape).cast();
                (*ctx).managed.dl_tensor.strides = (&raw mut (*ctx).strides).cast();
            }
            ctx.cast()
        };
        Self {
            // A Box allocation is never null.
            ptr: NonNull::new(ptr).unwrap_or_else(|| unreachable!("Box::into_raw is non-null")),
            versioned,
        }
    }

    /// Whether this is a `DLManagedTensorVersioned`.
    pub fn is_versioned(&self) -> bool {
        self.versioned
    }

    /// Give up ownership: the returned pointer is a `DLManagedTensor*` (or
    /// `DLManagedTensorVersioned*`) whose `deleter` must be called exactly once, either by a
    /// consumer or through [`release_unconsumed`].
    pub fn into_raw(self) -> *mut c_void {
        let ptr = self.ptr.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl Drop for ManagedTensor {
    fn drop(&mut self) {
        // SAFETY: we still own the tensor (not handed out by `into_raw`).
        unsafe { release_unconsumed(self.ptr.as_ptr(), self.versioned) };
    }
}

/// Call the deleter of a tensor from [`ManagedTensor::into_raw`] that no consumer took.
///
/// # Safety
/// `ptr` must come from [`ManagedTensor::into_raw`] with the same `versioned`, and its
/// deleter must not have been called (by anyone) before or after this call.
pub unsafe fn release_unconsumed(ptr: *mut c_void, versioned: bool) {
    if versioned {
        let managed = ptr.cast::<DLManagedTensorVersioned>();
        // SAFETY: per the contract `managed` is a live versioned tensor.
        if let Some(deleter) = unsafe { (*managed).deleter } {
            // SAFETY: called exactly once, per the contract.
            unsafe { deleter(managed) };
        }
    } else {
        let managed = ptr.cast::<DLManagedTensor>();
        // SAFETY: per the contract `managed` is a live legacy tensor.
        if let Some(deleter) = unsafe { (*managed).deleter } {
            // SAFETY: called exactly once, per the contract.
            unsafe { deleter(managed) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn desc(memory: MemoryKind, dtype: DType) -> TensorDesc {
        TensorDesc {
            addr: 0x1000,
            shape: [1, 5, 2, 4, 13],
            dtype,
            memory,
        }
    }

    /// Read the DLTensor of a raw tensor like a C consumer would.
    fn read(
        ptr: *mut c_void,
        versioned: bool,
    ) -> (Vec<i64>, Vec<i64>, DLDataType, DLDevice, usize) {
        // SAFETY: test helper; `ptr` is a live tensor from `into_raw`.
        unsafe {
            let t: *const DLTensor = if versioned {
                let m = ptr.cast::<DLManagedTensorVersioned>();
                assert_eq!((*m).version.major, 1);
                assert_eq!((*m).flags, 0);
                assert_eq!((*m).manager_ctx, ptr);
                &raw const (*m).dl_tensor
            } else {
                let m = ptr.cast::<DLManagedTensor>();
                assert_eq!((*m).manager_ctx, ptr);
                &raw const (*m).dl_tensor
            };
            let n = (*t).ndim as usize;
            let shape = std::slice::from_raw_parts((*t).shape, n).to_vec();
            let strides = std::slice::from_raw_parts((*t).strides, n).to_vec();
            assert_eq!((*t).byte_offset, 0);
            (shape, strides, (*t).dtype, (*t).device, (*t).data as usize)
        }
    }

    #[test]
    fn fields_and_lifetime_for_both_versions() {
        for versioned in [false, true] {
            let owner: Arc<dyn Any + Send + Sync> = Arc::new(7u32);
            let t = ManagedTensor::new(
                &desc(MemoryKind::Device(3), DType::Bf16),
                owner.clone(),
                versioned,
            );
            assert_eq!(t.is_versioned(), versioned);
            assert_eq!(Arc::strong_count(&owner), 2, "the tensor holds the owner");
            let raw = t.into_raw();
            let (shape, strides, dtype, device, data) = read(raw, versioned);
            assert_eq!(shape, [1, 5, 2, 4, 13]);
            assert_eq!(strides, [520, 104, 52, 13, 1]);
            assert_eq!(
                dtype,
                DLDataType {
                    code: 4,
                    bits: 16,
                    lanes: 1
                }
            );
            assert_eq!(
                device,
                DLDevice {
                    device_type: DEVICE_CUDA,
                    device_id: 3
                }
            );
            assert_eq!(data, 0x1000);
            assert_eq!(Arc::strong_count(&owner), 2);
            // SAFETY: `raw` came from `into_raw` and its deleter has not run.
            unsafe { release_unconsumed(raw, versioned) };
            assert_eq!(Arc::strong_count(&owner), 1, "deleting releases the owner");
        }
    }

    #[test]
    fn consumer_deleter_runs_on_another_thread() {
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(());
        let raw = ManagedTensor::new(&desc(MemoryKind::System, DType::Fp8), owner.clone(), false)
            .into_raw() as usize;
        std::thread::spawn(move || {
            let m = raw as *mut DLManagedTensor;
            // SAFETY: a consumer calls the deleter exactly once, from any thread.
            unsafe {
                assert_eq!(
                    (*m).dl_tensor.dtype,
                    DLDataType {
                        code: 1,
                        bits: 8,
                        lanes: 1
                    }
                );
                assert_eq!(
                    (*m).dl_tensor.device,
                    DLDevice {
                        device_type: DEVICE_CPU,
                        device_id: 0
                    }
                );
                ((*m).deleter.unwrap())(m);
            }
        })
        .join()
        .unwrap();
        assert_eq!(Arc::strong_count(&owner), 1);
    }

    #[test]
    fn dropping_an_unexported_tensor_frees_it() {
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(());
        drop(ManagedTensor::new(
            &desc(MemoryKind::Pinned, DType::I32),
            owner.clone(),
            true,
        ));
        assert_eq!(Arc::strong_count(&owner), 1);
    }
}
