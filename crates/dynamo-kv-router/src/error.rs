//! Errors of the KV-router core.

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the KV-router core.
///
/// Variants carry enough context to produce a user-facing message; the binding crate maps
/// them to Python exceptions (`ValueError` for bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A block size of zero was requested; no block can be formed.
    #[error("kv_block_size cannot be 0")]
    ZeroBlockSize,
}
