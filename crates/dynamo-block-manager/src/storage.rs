//! Backing memory of block layouts: page-aligned system memory, pinned host memory and
//! device memory.
//!
//! A [`Storage`] owns one allocation and frees it on drop. Host storages (system and pinned)
//! are readable and writable from the CPU through the bounds-checked [`Storage::write_host`],
//! [`Storage::read_host`] and [`copy_host`]; device storage is reached only through the CUDA
//! transfer path. Contents start zeroed for system memory and unspecified for CUDA memory
//! (like `cuMemAlloc`).
//!
//! Invariants: `addr()` is non-null, aligned to [`PAGE_SIZE`] for host memory, and
//! `addr()..addr() + size()` stays valid until the storage is dropped. Layouts and blocks
//! hold their storage through an `Arc`, so memory outlives every view of it.

#![expect(
    unsafe_code,
    reason = "owning raw allocations and copying between them needs pointer arithmetic; every access is bounds-checked first"
)]

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of host allocations: one 4 KiB page, so that every host pool starts on a page
/// boundary (DMA engines and `O_DIRECT` I/O want page-aligned buffers).
pub const PAGE_SIZE: usize = 4096;

/// Where a storage's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Ordinary (pageable) host memory from the Rust allocator.
    System,
    /// Page-locked host memory from `cuMemHostAlloc` (not write-combined).
    Pinned,
    /// GPU memory from `cuMemAlloc` on the given device.
    Device(usize),
}

impl MemoryKind {
    /// Whether the CPU can read and write the memory directly.
    pub const fn is_host(self) -> bool {
        matches!(self, MemoryKind::System | MemoryKind::Pinned)
    }
}

/// How a layout should obtain its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageRequest {
    /// Page-aligned system memory.
    System,
    /// Pinned host memory when CUDA is usable, otherwise page-aligned system memory, so that
    /// every host-side feature works on machines without a GPU.
    PinnedOrSystem,
    /// Pinned host memory; [`Error::CudaUnavailable`] without CUDA.
    Pinned,
    /// Device memory on the given CUDA device; [`Error::CudaUnavailable`] without CUDA.
    Device(usize),
}

enum Backing {
    System(Layout),
    #[cfg(feature = "cuda")]
    Pinned(std::sync::Arc<cudarc::driver::CudaContext>),
    #[cfg(feature = "cuda")]
    Device(std::sync::Arc<cudarc::driver::CudaContext>),
}

/// One owned allocation.
pub struct Storage {
    ptr: NonNull<u8>,
    size: usize,
    kind: MemoryKind,
    backing: Backing,
}

// SAFETY: a Storage exclusively owns its allocation (no thread-local state: CUDA contexts
// are `Send + Sync` and are bound before each driver call); the pointer is only dereferenced
// through bounds-checked copies.
unsafe impl Send for Storage {}
// SAFETY: `&Storage` exposes no interior mutability of Rust-visible data; concurrent copies
// into the same bytes are the same hazard as two DLPack consumers writing one buffer, which
// is the documented contract of shared KV blocks.
unsafe impl Sync for Storage {}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("size", &self.size)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Storage {
    /// Allocate storage as `request` says.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for `size == 0`, [`Error::HostAllocation`] when the host
    /// allocator fails, [`Error::CudaUnavailable`] / [`Error::Cuda`] for CUDA requests.
    pub fn allocate(request: StorageRequest, size: usize) -> Result<Self> {
        match request {
            StorageRequest::System => Self::system(size),
            StorageRequest::PinnedOrSystem => {
                if crate::cuda_probe::cuda_available() {
                    Self::pinned(size)
                } else {
                    Self::system(size)
                }
            }
            StorageRequest::Pinned => Self::pinned(size),
            StorageRequest::Device(id) => Self::device(size, id),
        }
    }

    /// Zeroed, page-aligned system memory.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for `size == 0`; [`Error::HostAllocation`] if the allocator
    /// fails.
    pub fn system(size: usize) -> Result<Self> {
        if size == 0 {
            return Err(Error::InvalidConfig("storage size must be non-zero".into()));
        }
        let layout = Layout::from_size_align(size, PAGE_SIZE).map_err(|_| Error::SizeOverflow)?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(Error::HostAllocation(size))?;
        Ok(Self {
            ptr,
            size,
            kind: MemoryKind::System,
            backing: Backing::System(layout),
        })
    }

    /// Pinned (page-locked, not write-combined) host memory.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without CUDA (or without the `cuda` feature).
    pub fn pinned(size: usize) -> Result<Self> {
        if size == 0 {
            return Err(Error::InvalidConfig("storage size must be non-zero".into()));
        }
        #[cfg(feature = "cuda")]
        {
            let (ptr, ctx) = crate::cuda::alloc_pinned(size)?;
            let ptr = NonNull::new(ptr).ok_or(Error::HostAllocation(size))?;
            Ok(Self {
                ptr,
                size,
                kind: MemoryKind::Pinned,
                backing: Backing::Pinned(ctx),
            })
        }
        #[cfg(not(feature = "cuda"))]
        Err(Error::CudaUnavailable(
            "built without the `cuda` feature".into(),
        ))
    }

    /// Device memory on CUDA device `device_id`.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without CUDA or without that device.
    pub fn device(size: usize, device_id: usize) -> Result<Self> {
        if size == 0 {
            return Err(Error::InvalidConfig("storage size must be non-zero".into()));
        }
        #[cfg(feature = "cuda")]
        {
            let (addr, ctx) = crate::cuda::alloc_device(size, device_id)?;
            let ptr = NonNull::new(addr as usize as *mut u8)
                .ok_or(Error::InvalidConfig("cuMemAlloc returned null".into()))?;
            Ok(Self {
                ptr,
                size,
                kind: MemoryKind::Device(device_id),
                backing: Backing::Device(ctx),
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = device_id;
            Err(Error::CudaUnavailable(
                "built without the `cuda` feature".into(),
            ))
        }
    }

    /// The first byte's address (a host pointer or a CUDA device pointer).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Where the memory lives.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::InvalidCopy(format!(
                "range {offset}..{offset}+{len} outside a storage of {} bytes",
                self.size
            ))),
        }
    }

    fn require_host(&self) -> Result<()> {
        if self.kind.is_host() {
            Ok(())
        } else {
            Err(Error::InvalidCopy(format!(
                "{:?} memory is not host-accessible",
                self.kind
            )))
        }
    }

    /// Copy `data` into host storage at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidCopy`] for device storage or an out-of-range write.
    pub fn write_host(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.require_host()?;
        self.check_range(offset, data.len())?;
        // SAFETY: the destination range lies inside this live host allocation (checked), and
        // `data` is a distinct Rust slice, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len());
        }
        Ok(())
    }

    /// Copy bytes of host storage at `offset` into `out`.
    ///
    /// # Errors
    /// [`Error::InvalidCopy`] for device storage or an out-of-range read.
    pub fn read_host(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.require_host()?;
        self.check_range(offset, out.len())?;
        // SAFETY: the source range lies inside this live host allocation (checked); `out` is
        // an exclusive Rust slice and cannot alias the allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            );
        }
        Ok(())
    }
}

/// Copy `len` bytes between two host storages (or within one).
///
/// # Errors
/// [`Error::InvalidCopy`] when either side is not host memory, a range is out of bounds, or
/// the two ranges overlap.
pub fn copy_host(
    src: &Storage,
    src_offset: usize,
    dst: &Storage,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    src.require_host()?;
    dst.require_host()?;
    src.check_range(src_offset, len)?;
    dst.check_range(dst_offset, len)?;
    let s = src.addr() as usize + src_offset;
    let d = dst.addr() as usize + dst_offset;
    if len > 0 && s < d + len && d < s + len {
        return Err(Error::InvalidCopy(format!(
            "source {s:#x} and destination {d:#x} overlap ({len} bytes)"
        )));
    }
    // SAFETY: both ranges lie inside live host allocations (checked) and do not overlap
    // (checked); pointers are derived from the owning `NonNull`s, keeping provenance.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.ptr.as_ptr().add(src_offset),
            dst.ptr.as_ptr().add(dst_offset),
            len,
        );
    }
    Ok(())
}

impl Drop for Storage {
    fn drop(&mut self) {
        match &self.backing {
            Backing::System(layout) => {
                // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed exactly once.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) };
            }
            #[cfg(feature = "cuda")]
            Backing::Pinned(ctx) => {
                crate::cuda::free_pinned(ctx, self.ptr.as_ptr());
            }
            #[cfg(feature = "cuda")]
            Backing::Device(ctx) => {
                crate::cuda::free_device(ctx, self.addr());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_memory_is_page_aligned_and_zeroed() {
        let s = Storage::system(10_000).unwrap();
        assert_eq!(s.addr() % PAGE_SIZE as u64, 0);
        assert_eq!(s.kind(), MemoryKind::System);
        let mut out = vec![1u8; 10_000];
        s.read_host(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        assert!(matches!(Storage::system(0), Err(Error::InvalidConfig(_))));
    }

    #[test]
    fn host_reads_and_writes_are_bounds_checked() {
        let s = Storage::system(64).unwrap();
        s.write_host(60, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 4];
        s.read_host(60, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(s.write_host(61, &[1, 2, 3, 4]).is_err());
        assert!(s.read_host(usize::MAX, &mut out).is_err());
    }

    #[test]
    fn copy_host_moves_bytes_and_rejects_overlap() {
        let a = Storage::system(128).unwrap();
        let b = Storage::system(128).unwrap();
        let data: Vec<u8> = (0..64).collect();
        a.write_host(10, &data).unwrap();
        copy_host(&a, 10, &b, 64, 64).unwrap();
        let mut out = vec![0u8; 64];
        b.read_host(64, &mut out).unwrap();
        assert_eq!(out, data);
        // Within one storage: disjoint is fine, overlapping is refused.
        copy_host(&a, 10, &a, 74, 54).unwrap();
        assert!(matches!(
            copy_host(&a, 0, &a, 10, 20),
            Err(Error::InvalidCopy(_))
        ));
        assert!(copy_host(&a, 100, &b, 0, 64).is_err());
    }

    #[test]
    fn pinned_or_system_falls_back_without_cuda() {
        let s = Storage::allocate(StorageRequest::PinnedOrSystem, 4096).unwrap();
        if crate::cuda_probe::cuda_available() {
            assert_eq!(s.kind(), MemoryKind::Pinned);
        } else {
            assert_eq!(s.kind(), MemoryKind::System);
            assert!(matches!(
                Storage::pinned(4096),
                Err(Error::CudaUnavailable(_))
            ));
            assert!(matches!(
                Storage::device(4096, 0),
                Err(Error::CudaUnavailable(_))
            ));
        }
    }
}
