//! Errors of the KV-router core.

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the KV-router core.
///
/// Variants carry enough context to produce a user-facing message; the binding crate maps
/// them to Python exceptions: bad input (`ZeroBlockSize`, `Decode`) becomes `ValueError`, an
/// event the index cannot apply (`ParentBlockNotFound`, `BlockNotFound`,
/// `InvalidBlockSequence`) becomes `RuntimeError("Failed to apply event: ...")` like the
/// reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A block size of zero was requested; no block can be formed.
    #[error("kv_block_size cannot be 0")]
    ZeroBlockSize,
    /// Bytes that are not a valid event (malformed, unknown variant, missing field). The
    /// message is the decoder's, prefixed with what was being decoded.
    #[error("{0}")]
    Decode(String),
    /// An event could not be encoded (never expected for the event types).
    #[error("failed to encode event: {0}")]
    Encode(String),
    /// A `stored` event names a parent this worker rank does not hold. The event was
    /// rejected and the index is unchanged.
    #[error("Failed to find parent block")]
    ParentBlockNotFound {
        /// The unknown parent hash.
        parent_hash: u64,
    },
    /// A `removed` event names blocks this worker rank does not hold. Those hashes were
    /// skipped (no-ops); every known hash of the event was removed.
    #[error("Failed to find block")]
    BlockNotFound {
        /// The unknown hashes, in event order.
        missing: Vec<u64>,
    },
    /// A `stored` event whose blocks contain its own parent (a cycle). The event was
    /// rejected and the index is unchanged.
    #[error("Invalid block sequence")]
    InvalidBlockSequence,
}

impl Error {
    /// Whether this error reports an event the index could not (fully) apply, as opposed
    /// to bad input bytes or arguments.
    pub const fn is_apply_error(&self) -> bool {
        matches!(
            self,
            Self::ParentBlockNotFound { .. }
                | Self::BlockNotFound { .. }
                | Self::InvalidBlockSequence
        )
    }
}
