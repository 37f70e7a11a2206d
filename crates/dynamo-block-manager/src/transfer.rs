//! Copying blocks between layouts.
//!
//! Host ↔ host copies are `memcpy`s. Copies that touch device memory go through the CUDA
//! copy streams (feature `cuda`): device → host on the offload stream, host → device and
//! device → device on the onboard stream, issued asynchronously in batches and completed by
//! one CUDA event per batch.
//!
//! When both layouts are fully contiguous, each block moves as **one** copy of
//! `L × O × P × I × elem` bytes; otherwise each `(layer, outer)` page moves separately.

use crate::error::{Error, Result};
use crate::layout::{BlockLayout, Region};
use crate::storage::{MemoryKind, copy_host};

/// Blocks per CUDA batch: one event per batch amortises the ~10 µs event round trip over
/// 16 whole-block copies while keeping the time a batch holds the stream short (the value
/// upstream KVBM found to work; revisit with GPU measurements).
pub const MAX_TRANSFER_BATCH_BLOCKS: usize = 16;

fn check_compatible(src: &BlockLayout, dst: &BlockLayout) -> Result<()> {
    let (s, d) = (src.config(), dst.config());
    if (s.num_layers, s.outer_dim, s.page_size, s.inner_dim, s.dtype)
        != (d.num_layers, d.outer_dim, d.page_size, d.inner_dim, d.dtype)
    {
        return Err(Error::IncompatibleLayouts(format!(
            "source {s:?} and destination {d:?} differ in block shape or dtype"
        )));
    }
    Ok(())
}

/// The `(source region, destination region)` pairs that move block `s` of `src` to block
/// `d` of `dst`.
fn block_regions(
    src: &BlockLayout,
    s: usize,
    dst: &BlockLayout,
    d: usize,
    out: &mut Vec<(Region, Region)>,
) -> Result<()> {
    if let (Ok(a), Ok(b)) = (src.block_region(s), dst.block_region(d)) {
        out.push((a, b));
        return Ok(());
    }
    let c = src.config();
    for layer in 0..c.num_layers {
        for outer in 0..c.outer_dim {
            out.push((
                src.memory_region(s, layer, outer)?,
                dst.memory_region(d, layer, outer)?,
            ));
        }
    }
    Ok(())
}

/// Copy blocks `pairs[i].0` of `src` into blocks `pairs[i].1` of `dst`.
///
/// # Errors
/// [`Error::IncompatibleLayouts`] for different block shapes or dtypes;
/// [`Error::IndexOutOfRange`]; [`Error::InvalidCopy`] for a destination block listed twice
/// or a copy of a block onto itself; CUDA errors for device copies (and
/// [`Error::CudaUnavailable`] when device memory is involved without CUDA).
pub fn copy_blocks(src: &BlockLayout, dst: &BlockLayout, pairs: &[(usize, usize)]) -> Result<()> {
    check_compatible(src, dst)?;
    let mut seen = std::collections::HashSet::with_capacity(pairs.len());
    for &(s, d) in pairs {
        if !seen.insert(d) {
            return Err(Error::InvalidCopy(format!(
                "destination block {d} listed twice"
            )));
        }
        if std::ptr::eq(src, dst) && s == d {
            return Err(Error::InvalidCopy(format!("block {s} copied onto itself")));
        }
    }
    let mut regions = Vec::new();
    for chunk in pairs.chunks(MAX_TRANSFER_BATCH_BLOCKS) {
        regions.clear();
        for &(s, d) in chunk {
            block_regions(src, s, dst, d, &mut regions)?;
        }
        match (src.memory_kind(), dst.memory_kind()) {
            (a, b) if a.is_host() && b.is_host() => {
                for &(r, w) in &regions {
                    copy_host(
                        &src.storages()[r.storage],
                        r.offset,
                        &dst.storages()[w.storage],
                        w.offset,
                        r.len,
                    )?;
                }
            }
            (a, b) => cuda_copy(src, dst, a, b, &regions)?,
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn cuda_copy(
    src: &BlockLayout,
    dst: &BlockLayout,
    a: MemoryKind,
    b: MemoryKind,
    regions: &[(Region, Region)],
) -> Result<()> {
    use crate::cuda::{CopyStreams, Direction};
    let (direction, device) = match (a, b) {
        (MemoryKind::Device(id), MemoryKind::Device(_)) => (Direction::DeviceToDevice, id),
        (MemoryKind::Device(id), _) => (Direction::DeviceToHost, id),
        (_, MemoryKind::Device(id)) => (Direction::HostToDevice, id),
        _ => unreachable!("host-to-host copies are handled by memcpy"),
    };
    let streams = CopyStreams::for_device(device)?;
    let ops: Vec<_> = regions
        .iter()
        .map(|&(r, w)| (src.addr(r), dst.addr(w), r.len))
        .collect();
    #[expect(unsafe_code, reason = "the CUDA copy contract is discharged here")]
    // SAFETY: every region comes from `BlockLayout::{block_region, memory_region}`, which
    // stay inside their storage (layout invariant); `src` and `dst` borrow the layouts (and
    // so their storages) until the batch's event has completed inside `copy_batch`; the
    // destination blocks are distinct and never the source block (checked above).
    unsafe {
        streams.copy_batch(direction, &ops)
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_copy(
    _src: &BlockLayout,
    _dst: &BlockLayout,
    _a: MemoryKind,
    _b: MemoryKind,
    _regions: &[(Region, Region)],
) -> Result<()> {
    Err(Error::CudaUnavailable(
        "built without the `cuda` feature".into(),
    ))
}
