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
    /// A configuration field has an invalid value or conflicts with another field.
    #[error("invalid {field}: {reason}")]
    InvalidConfig {
        /// Name of the offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// JSON input could not be parsed into the expected structure.
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    /// Arguments that contradict each other (e.g. list lengths that do not match).
    #[error("{0}")]
    InvalidInput(String),
    /// A request id was booked twice.
    #[error("request {0:?} is already active")]
    DuplicateRequest(String),
    /// A request id is not active.
    #[error("request {0:?} is not active")]
    UnknownRequest(String),
    /// No worker is registered.
    #[error("no workers are available")]
    NoWorkers,
    /// No registered worker satisfies the request's required taints.
    #[error("no worker satisfies the required taints")]
    NoEligibleWorkers,
    /// Every eligible worker is above a busy threshold.
    #[error("all {workers} eligible workers are busy")]
    AllWorkersBusy {
        /// Number of eligible workers.
        workers: usize,
    },
    /// A pinned worker rank is not registered.
    #[error("worker {worker_id} (dp_rank {dp_rank}) is not registered")]
    UnknownWorker {
        /// Worker id.
        worker_id: u64,
        /// Data-parallel rank.
        dp_rank: u32,
    },
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
