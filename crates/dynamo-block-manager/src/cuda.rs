//! CUDA driver access through cudarc (feature `cuda`).
//!
//! cudarc is built with `dynamic-loading`: `libcuda` is opened at run time, so this module
//! compiles without a CUDA toolkit. cudarc panics if a driver call is made without the
//! library, so [`context`] first checks `is_culib_present()` (cached) and every entry point
//! goes through [`context`]. A missing library, the toolkit's stub library, no device or a
//! device id out of range all become [`Error::CudaUnavailable`].
//!
//! Transfers use two dedicated streams per device (one for offload, device→host, one for
//! onboard, host→device and device→device) so that offloads overlap onboards. A batch of
//! copies is issued asynchronously and completed by one blocking-sync CUDA event, which the
//! calling thread waits on (the Python bindings release the GIL around it).

#![expect(
    unsafe_code,
    reason = "raw CUDA driver calls (allocation, async memcpy) on addresses owned by `Storage`"
)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult, cudaError_enum};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use parking_lot::Mutex;

use crate::error::{Error, Result};

fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on candidate names; it never panics.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn driver_error(op: &'static str, err: DriverError) -> Error {
    let code: CUresult = err.0;
    match code {
        cudaError_enum::CUDA_ERROR_NO_DEVICE
        | cudaError_enum::CUDA_ERROR_STUB_LIBRARY
        | cudaError_enum::CUDA_ERROR_INVALID_DEVICE
        | cudaError_enum::CUDA_ERROR_NOT_INITIALIZED
        | cudaError_enum::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => {
            Error::CudaUnavailable(format!("{op}: {code:?}"))
        }
        _ => Error::Cuda {
            op,
            message: format!("{code:?}"),
        },
    }
}

/// The primary context of CUDA device `device_id`, created once per device.
///
/// # Errors
/// [`Error::CudaUnavailable`] when the driver library is missing or unusable or the device
/// does not exist.
pub(crate) fn context(device_id: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    if !library_present() {
        return Err(Error::CudaUnavailable(
            "the CUDA driver library (libcuda.so) could not be loaded".into(),
        ));
    }
    let mut map = CONTEXTS.get_or_init(Default::default).lock();
    if let Some(ctx) = map.get(&device_id) {
        return Ok(ctx.clone());
    }
    let ctx = CudaContext::new(device_id)
        .map_err(|e| driver_error("cuInit/cuDevicePrimaryCtxRetain", e))?;
    map.insert(device_id, ctx.clone());
    Ok(ctx)
}

/// Whether device 0 can be used (driver library present, initialised, device present).
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| context(0).is_ok())
}

/// Number of CUDA devices; 0 without CUDA.
pub(crate) fn device_count() -> usize {
    if !available() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

/// Allocate `size` bytes of pinned host memory (portable across contexts, not
/// write-combined, so CPU reads through DLPack views stay fast).
pub(crate) fn alloc_pinned(size: usize) -> Result<(*mut u8, Arc<CudaContext>)> {
    let ctx = context(0)?;
    ctx.bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    // SAFETY: a context is current; the returned memory is owned by the caller's `Storage`
    // and freed with `free_pinned`.
    let ptr = unsafe { cudarc::driver::result::malloc_host(size, sys::CU_MEMHOSTALLOC_PORTABLE) }
        .map_err(|e| driver_error("cuMemHostAlloc", e))?;
    // Match system memory: contents start zeroed (also makes CPU reads well-defined).
    // SAFETY: `ptr` points to `size` writable host bytes just allocated.
    unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, size) };
    Ok((ptr.cast(), ctx))
}

/// Free memory from [`alloc_pinned`]. Errors are ignored: this runs in `Drop`.
pub(crate) fn free_pinned(ctx: &Arc<CudaContext>, ptr: *mut u8) {
    let _ = ctx.bind_to_thread();
    // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed exactly once (Storage::drop).
    let _ = unsafe { cudarc::driver::result::free_host(ptr.cast::<c_void>()) };
}

/// Allocate `size` bytes on device `device_id`.
pub(crate) fn alloc_device(size: usize, device_id: usize) -> Result<(u64, Arc<CudaContext>)> {
    let ctx = context(device_id)?;
    ctx.bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    // SAFETY: the device's context is current; the allocation is owned by the caller.
    let ptr = unsafe { cudarc::driver::result::malloc_sync(size) }
        .map_err(|e| driver_error("cuMemAlloc", e))?;
    Ok((ptr, ctx))
}

/// Free memory from [`alloc_device`]. Errors are ignored: this runs in `Drop`.
pub(crate) fn free_device(ctx: &Arc<CudaContext>, addr: u64) {
    let _ = ctx.bind_to_thread();
    // SAFETY: `addr` came from `cuMemAlloc` in `ctx` and is freed exactly once.
    let _ = unsafe { cudarc::driver::result::free_sync(addr) };
}

/// Direction of a CUDA copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// One copy: `(source address, destination address, bytes)`.
pub(crate) type CopyOp = (u64, u64, usize);

/// The copy streams of one device.
pub(crate) struct CopyStreams {
    offload: Arc<CudaStream>,
    onboard: Arc<CudaStream>,
}

impl CopyStreams {
    /// The streams of `device_id`, created once per device.
    pub(crate) fn for_device(device_id: usize) -> Result<Arc<CopyStreams>> {
        static STREAMS: OnceLock<Mutex<HashMap<usize, Arc<CopyStreams>>>> = OnceLock::new();
        let ctx = context(device_id)?;
        let mut map = STREAMS.get_or_init(Default::default).lock();
        if let Some(s) = map.get(&device_id) {
            return Ok(s.clone());
        }
        let offload = ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        let onboard = ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        let streams = Arc::new(CopyStreams { offload, onboard });
        map.insert(device_id, streams.clone());
        Ok(streams)
    }

    /// Issue every copy of the batch asynchronously on the stream of `direction`, then wait
    /// for one blocking-sync event recorded after the batch.
    ///
    /// # Safety
    /// Every source range must be readable and every destination range writable memory of
    /// the kind `direction` names, alive until this returns; destinations must not overlap
    /// sources. `transfer::copy_blocks` derives the ranges from bounds-checked layouts.
    pub(crate) unsafe fn copy_batch(&self, direction: Direction, ops: &[CopyOp]) -> Result<()> {
        let stream = match direction {
            Direction::DeviceToHost => &self.offload,
            Direction::HostToDevice | Direction::DeviceToDevice => &self.onboard,
        };
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        let cu_stream = stream.cu_stream();
        for &(src, dst, len) in ops {
            // SAFETY: the caller guarantees the ranges (see the function's contract) and the
            // stream's context is current.
            let res = unsafe {
                match direction {
                    Direction::HostToDevice => sys::cuMemcpyHtoDAsync_v2(
                        dst,
                        src as usize as *const c_void,
                        len,
                        cu_stream,
                    ),
                    Direction::DeviceToHost => {
                        sys::cuMemcpyDtoHAsync_v2(dst as usize as *mut c_void, src, len, cu_stream)
                    }
                    Direction::DeviceToDevice => {
                        sys::cuMemcpyDtoDAsync_v2(dst, src, len, cu_stream)
                    }
                }
            };
            res.result().map_err(|e| driver_error("cuMemcpyAsync", e))?;
        }
        let event = stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(|e| driver_error("cuEventRecord", e))?;
        event
            .synchronize()
            .map_err(|e| driver_error("cuEventSynchronize", e))
    }
}
