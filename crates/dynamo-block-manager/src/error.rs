//! The error type of the block manager.

/// Which tier a pool serves.
pub use crate::tier::Tier;

/// Errors of the block manager. Every absence of CUDA (no driver library, a stub library, no
/// device) is [`Error::CudaUnavailable`]; nothing in this crate panics because of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A layout dimension was zero.
    #[error("{0} must be at least 1")]
    ZeroDimension(&'static str),
    /// A layout or manager argument is outside its valid range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The dtype string is not one of the supported spellings.
    #[error(
        "Unsupported dtype: {0:?} (expected one of fp8, fp16, bf16, fp32, u8, u16, u32, u64, i8, i16, i32, i64)"
    )]
    UnsupportedDtype(String),
    /// The layout's total size overflows `usize`.
    #[error("layout size overflows the address space")]
    SizeOverflow,
    /// An allocation asked for more blocks than the pool can hand out right now.
    #[error("Not enough blocks available, requested: {requested}, available: {available}")]
    NotEnoughBlocks {
        /// Blocks asked for.
        requested: usize,
        /// Blocks free or evictable at the time of the call.
        available: usize,
    },
    /// The manager has no pool for this tier.
    #[error("{0} allocator not available (the block manager was built without {0} blocks)")]
    PoolNotConfigured(Tier),
    /// CUDA is not usable on this machine.
    #[error("CUDA is not available: {0}")]
    CudaUnavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {op}: {message}")]
    Cuda {
        /// The operation that failed.
        op: &'static str,
        /// The driver's error name.
        message: String,
    },
    /// A host allocation failed.
    #[error("cannot allocate {0} bytes of host memory")]
    HostAllocation(usize),
    /// A block or layer index is out of range.
    #[error("{what} index {index} out of range (length {len})")]
    IndexOutOfRange {
        /// "block" or "layer".
        what: &'static str,
        /// The index asked for.
        index: usize,
        /// The number of items.
        len: usize,
    },
    /// The block is not one contiguous region in this layout, so no whole-block view exists.
    #[error("the block is not contiguous in a layer-separate layout")]
    NotContiguous,
    /// A block is in the wrong state for the operation.
    #[error("block is {actual}, expected {expected}")]
    InvalidState {
        /// The state the operation needs.
        expected: &'static str,
        /// The block's state.
        actual: &'static str,
    },
    /// Too many tokens were added to a block.
    #[error("block is full ({0} tokens)")]
    BlockFull(usize),
    /// Two layouts cannot exchange blocks (different shapes or dtypes).
    #[error("incompatible layouts: {0}")]
    IncompatibleLayouts(String),
    /// A copy range falls outside its storage, or source and destination overlap.
    #[error("invalid copy: {0}")]
    InvalidCopy(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
