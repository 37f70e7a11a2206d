//! Errors of the simulated engine: bad engine arguments, requests it cannot serve, and a
//! stopped engine task. Trace replay has its own error type ([`crate::replay::ReplayError`]).

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the mocker.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An engine argument is invalid.
    #[error("invalid mocker argument {field}: {reason}")]
    InvalidEngineArgs {
        /// Name of the argument.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A request can never be served (e.g. its prompt needs more KV blocks than exist).
    #[error("request {request_id:?} rejected: {reason}")]
    RequestRejected {
        /// The request.
        request_id: String,
        /// Why.
        reason: String,
    },
    /// The engine task has stopped.
    #[error("the engine has stopped")]
    EngineStopped,
    /// A request id is already in the engine.
    #[error("request {0:?} is already in the engine")]
    DuplicateRequest(String),
    /// The engine's KV events cannot be published (e.g. the ZMQ port cannot be bound).
    #[error("runtime: {0}")]
    Runtime(String),
}
