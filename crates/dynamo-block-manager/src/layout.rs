//! Block layouts: where each `(block, layer, outer)` page of a KV pool lives in memory.
//!
//! A *page* (memory region) is `page_size × inner_dim` elements, contiguous. A block has
//! `num_layers × outer_dim` pages (`outer_dim` is 2 when K and V are stored separately, 1 for
//! MLA-style caches).
//!
//! * [`LayoutKind::FullyContiguous`]: one allocation shaped
//!   `[num_blocks][num_layers][outer_dim][page_size][inner_dim]`. A whole block is one
//!   contiguous range of exactly `L × O × P × I × elem` bytes, which is what whole-block
//!   copies and DLPack block views use.
//! * [`LayoutKind::LayerSeparate`]: one allocation per layer, shaped
//!   `[outer_dim][num_blocks][page][inner]` (`outer_contiguous`) or
//!   `[num_blocks][outer_dim][page][inner]`. A whole block is not contiguous
//!   ([`Error::NotContiguous`]); pages and (block-contiguous) layers are.
//!
//! Invariants: every region returned lies inside its storage (checked at construction: each
//! storage is at least [`LayoutConfig::required_bytes`]); the first block starts at an
//! address aligned to `alignment`; block strides are multiples of `alignment`, so every block
//! (or per-layer block slice) starts aligned. With the default alignment of 1 there is no
//! padding and block `b` starts at `b × block_bytes`.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::storage::{MemoryKind, Storage, StorageRequest};

/// Dimensions of a KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayoutConfig {
    /// Blocks in the pool (≥ 1).
    pub num_blocks: usize,
    /// Transformer layers (≥ 1).
    pub num_layers: usize,
    /// 2 for separate K and V pages, 1 for a single (MLA-style) page per layer.
    pub outer_dim: usize,
    /// Tokens per block (≥ 1).
    pub page_size: usize,
    /// Elements per token per page: heads × head_dim (≥ 1).
    pub inner_dim: usize,
    /// Alignment of block starts in bytes: a power of two; 1 means no padding.
    pub alignment: usize,
    /// Element type.
    pub dtype: DType,
}

impl LayoutConfig {
    /// A configuration with alignment 1.
    pub fn new(
        num_blocks: usize,
        num_layers: usize,
        outer_dim: usize,
        page_size: usize,
        inner_dim: usize,
        dtype: DType,
    ) -> Self {
        Self {
            num_blocks,
            num_layers,
            outer_dim,
            page_size,
            inner_dim,
            alignment: 1,
            dtype,
        }
    }

    /// Check every dimension.
    ///
    /// # Errors
    /// [`Error::ZeroDimension`] for a zero dimension; [`Error::InvalidConfig`] for
    /// `outer_dim ∉ {1, 2}` or a non-power-of-two alignment; [`Error::SizeOverflow`] when the
    /// pool does not fit the address space.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("num_blocks", self.num_blocks),
            ("num_layers", self.num_layers),
            ("outer_dim", self.outer_dim),
            ("page_size", self.page_size),
            ("inner_dim", self.inner_dim),
        ] {
            if v == 0 {
                return Err(Error::ZeroDimension(name));
            }
        }
        if self.outer_dim > 2 {
            return Err(Error::InvalidConfig(format!(
                "outer_dim must be 1 or 2, got {}",
                self.outer_dim
            )));
        }
        if !self.alignment.is_power_of_two() {
            return Err(Error::InvalidConfig(format!(
                "alignment must be a power of two, got {}",
                self.alignment
            )));
        }
        self.required_bytes(LayoutKind::FullyContiguous)?;
        for outer_contiguous in [false, true] {
            self.required_bytes(LayoutKind::LayerSeparate { outer_contiguous })?;
        }
        Ok(())
    }

    /// Bytes of one page: `page_size × inner_dim × elem`.
    pub fn region_bytes(&self) -> usize {
        self.page_size * self.inner_dim * self.dtype.size_bytes()
    }

    /// Bytes of one layer of one block: `outer_dim × region`.
    pub fn layer_bytes(&self) -> usize {
        self.outer_dim * self.region_bytes()
    }

    /// Bytes of one whole block: `num_layers × outer_dim × page_size × inner_dim × elem`.
    pub fn block_bytes(&self) -> usize {
        self.num_layers * self.layer_bytes()
    }

    /// Bytes each storage of a layout of `kind` needs, including `alignment − 1` bytes of
    /// slack for aligning the first block.
    ///
    /// # Errors
    /// [`Error::SizeOverflow`].
    pub fn required_bytes(&self, kind: LayoutKind) -> Result<usize> {
        let e = self.dtype.size_bytes();
        let region = self
            .page_size
            .checked_mul(self.inner_dim)
            .and_then(|x| x.checked_mul(e))
            .ok_or(Error::SizeOverflow)?;
        let a = self.alignment;
        // (bytes between aligned units, units per storage)
        let (unit, units) = match kind {
            LayoutKind::FullyContiguous => (
                region
                    .checked_mul(self.outer_dim)
                    .and_then(|x| x.checked_mul(self.num_layers)),
                Some(self.num_blocks),
            ),
            LayoutKind::LayerSeparate {
                outer_contiguous: false,
            } => (region.checked_mul(self.outer_dim), Some(self.num_blocks)),
            // Each page is its own aligned unit: `outer_dim` runs of `num_blocks` pages.
            LayoutKind::LayerSeparate {
                outer_contiguous: true,
            } => (Some(region), self.num_blocks.checked_mul(self.outer_dim)),
        };
        let stride = unit
            .and_then(|u| round_up(u, a))
            .ok_or(Error::SizeOverflow)?;
        units
            .and_then(|n| stride.checked_mul(n))
            .and_then(|x| x.checked_add(a - 1))
            .ok_or(Error::SizeOverflow)
    }
}

fn round_up(x: usize, align: usize) -> Option<usize> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// How blocks are arranged in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LayoutKind {
    /// One allocation: `[blocks][layers][outer][page][inner]`.
    #[default]
    FullyContiguous,
    /// One allocation per layer.
    LayerSeparate {
        /// `[outer][blocks][page][inner]` when true, `[blocks][outer][page][inner]` when false.
        outer_contiguous: bool,
    },
}

/// A contiguous byte range inside one storage of a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Index of the storage (0 for fully contiguous layouts, the layer for layer-separate).
    pub storage: usize,
    /// Offset from the storage's first byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

/// A layout over owned storage.
#[derive(Debug)]
pub struct BlockLayout {
    config: LayoutConfig,
    kind: LayoutKind,
    storages: Vec<Storage>,
    /// Per storage: offset of the first block from the storage start (alignment padding).
    base_offsets: Vec<usize>,
    block_stride: usize,
    layer_stride: usize,
    outer_stride: usize,
}

impl BlockLayout {
    /// Allocate storage as `request` says and lay blocks out in it.
    ///
    /// # Errors
    /// Configuration errors from [`LayoutConfig::validate`] and allocation errors.
    pub fn allocate(
        config: LayoutConfig,
        kind: LayoutKind,
        request: StorageRequest,
    ) -> Result<Self> {
        config.validate()?;
        let size = config.required_bytes(kind)?;
        let count = match kind {
            LayoutKind::FullyContiguous => 1,
            LayoutKind::LayerSeparate { .. } => config.num_layers,
        };
        let storages = (0..count)
            .map(|_| Storage::allocate(request, size))
            .collect::<Result<Vec<_>>>()?;
        Self::from_storage(config, kind, storages)
    }

    /// Lay blocks out in existing storage: one storage for a fully contiguous layout, one
    /// per layer otherwise, all of the same memory kind and each at least
    /// [`LayoutConfig::required_bytes`] long.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a wrong storage count, size or mixed memory kinds.
    pub fn from_storage(
        config: LayoutConfig,
        kind: LayoutKind,
        storages: Vec<Storage>,
    ) -> Result<Self> {
        config.validate()?;
        let need = config.required_bytes(kind)?;
        let expected = match kind {
            LayoutKind::FullyContiguous => 1,
            LayoutKind::LayerSeparate { .. } => config.num_layers,
        };
        if storages.len() != expected {
            return Err(Error::InvalidConfig(format!(
                "{kind:?} needs {expected} storages, got {}",
                storages.len()
            )));
        }
        if let Some(s) = storages.iter().find(|s| s.size() < need) {
            return Err(Error::InvalidConfig(format!(
                "storage of {} bytes is smaller than the {need} bytes the layout needs",
                s.size()
            )));
        }
        if storages.iter().any(|s| s.kind() != storages[0].kind()) {
            return Err(Error::InvalidConfig(
                "storages of mixed memory kinds".into(),
            ));
        }
        let a = config.alignment;
        let base_offsets = storages
            .iter()
            .map(|s| {
                let addr = s.addr() as usize;
                // `need` includes `a − 1` bytes of slack, so the padding always fits.
                (a - addr % a) % a
            })
            .collect();
        let region = config.region_bytes();
        let (block_stride, layer_stride, outer_stride) = match kind {
            LayoutKind::FullyContiguous => {
                let bs = round_up(config.block_bytes(), a).ok_or(Error::SizeOverflow)?;
                (bs, config.layer_bytes(), region)
            }
            LayoutKind::LayerSeparate {
                outer_contiguous: false,
            } => {
                let bs = round_up(config.layer_bytes(), a).ok_or(Error::SizeOverflow)?;
                (bs, 0, region)
            }
            LayoutKind::LayerSeparate {
                outer_contiguous: true,
            } => {
                let bs = round_up(region, a).ok_or(Error::SizeOverflow)?;
                (bs, 0, bs * config.num_blocks)
            }
        };
        Ok(Self {
            config,
            kind,
            storages,
            base_offsets,
            block_stride,
            layer_stride,
            outer_stride,
        })
    }

    /// The dimensions.
    pub fn config(&self) -> &LayoutConfig {
        &self.config
    }

    /// The arrangement.
    pub fn kind(&self) -> LayoutKind {
        self.kind
    }

    /// Where the memory lives.
    pub fn memory_kind(&self) -> MemoryKind {
        self.storages[0].kind()
    }

    /// The storages (one, or one per layer).
    pub fn storages(&self) -> &[Storage] {
        &self.storages
    }

    /// Byte distance between consecutive blocks (within one storage).
    pub fn block_stride(&self) -> usize {
        self.block_stride
    }

    fn check(&self, block: usize, layer: usize, outer: usize) -> Result<()> {
        let c = &self.config;
        for (what, index, len) in [
            ("block", block, c.num_blocks),
            ("layer", layer, c.num_layers),
            ("outer", outer, c.outer_dim),
        ] {
            if index >= len {
                return Err(Error::IndexOutOfRange { what, index, len });
            }
        }
        Ok(())
    }

    /// The page of `(block, layer, outer)`: `page_size × inner_dim` contiguous elements.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`].
    pub fn memory_region(&self, block: usize, layer: usize, outer: usize) -> Result<Region> {
        self.check(block, layer, outer)?;
        let len = self.config.region_bytes();
        Ok(match self.kind {
            LayoutKind::FullyContiguous => Region {
                storage: 0,
                offset: self.base_offsets[0]
                    + block * self.block_stride
                    + layer * self.layer_stride
                    + outer * self.outer_stride,
                len,
            },
            LayoutKind::LayerSeparate { .. } => Region {
                storage: layer,
                offset: self.base_offsets[layer]
                    + block * self.block_stride
                    + outer * self.outer_stride,
                len,
            },
        })
    }

    /// All `outer_dim` pages of one layer of one block, as one contiguous range.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`]; [`Error::NotContiguous`] for an outer-contiguous
    /// layer-separate layout with `outer_dim > 1`.
    pub fn layer_region(&self, block: usize, layer: usize) -> Result<Region> {
        let first = self.memory_region(block, layer, 0)?;
        if self.config.outer_dim > 1 && self.outer_stride != self.config.region_bytes() {
            return Err(Error::NotContiguous);
        }
        Ok(Region {
            len: self.config.layer_bytes(),
            ..first
        })
    }

    /// A whole block as one contiguous range of [`LayoutConfig::block_bytes`].
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`]; [`Error::NotContiguous`] for layer-separate layouts with
    /// more than one layer.
    pub fn block_region(&self, block: usize) -> Result<Region> {
        let first = self.layer_region(block, 0)?;
        if self.config.num_layers > 1 && !matches!(self.kind, LayoutKind::FullyContiguous) {
            return Err(Error::NotContiguous);
        }
        Ok(Region {
            len: self.config.block_bytes(),
            ..first
        })
    }

    /// Whether whole blocks are contiguous (one copy per block).
    pub fn is_fully_contiguous(&self) -> bool {
        matches!(self.kind, LayoutKind::FullyContiguous)
            || self.config.num_layers == 1 && self.layer_region(0, 0).is_ok()
    }

    /// The address of a region (host pointer or device pointer).
    pub fn addr(&self, region: Region) -> u64 {
        self.storages[region.storage].addr() + region.offset as u64
    }
}

#[cfg(test)]
mod tests;
