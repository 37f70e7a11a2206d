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
}
