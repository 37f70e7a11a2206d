//! The selection service's one error type: a stable `kind`, the HTTP status it maps to,
//! and a message. Python sees `ValueError` for [`ErrorKind::InvalidRequest`] and
//! `SelectionServiceError(kind, status_code)` for everything else; HTTP sees the status.

use dynamo_kv_router::Error as RouterError;

/// What went wrong, as a stable machine-readable category.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A malformed request (a missing or mistyped field); names the field.
    InvalidRequest,
    /// No schedulable worker (or the service is shutting down).
    NotReady,
    /// An unknown worker, reservation or pending selection.
    NotFound,
    /// A selection id that is already reserved.
    Conflict,
    /// Every eligible worker is over its busy threshold.
    Busy,
    /// A failure of the service itself.
    Internal,
}

impl ErrorKind {
    /// The `kind` string Python and HTTP clients see.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::NotReady => "not_ready",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::Busy => "busy",
            Self::Internal => "internal",
        }
    }

    /// The HTTP status of the kind.
    pub fn status_code(self) -> u16 {
        match self {
            Self::InvalidRequest => 400,
            Self::NotReady => 503,
            Self::NotFound => 404,
            Self::Conflict => 409,
            // The frontend's overload status (DYN_HTTP_OVERLOAD_STATUS_CODE's default).
            Self::Busy => 529,
            Self::Internal => 500,
        }
    }
}

/// A selection-service failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SelectionError {
    /// The category.
    pub kind: ErrorKind,
    /// What happened, for people.
    pub message: String,
}

impl SelectionError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A malformed request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// Something unknown.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// Map a scheduler error met while serving `model`/`group`.
    pub(crate) fn from_router(err: RouterError, model: &str, group: &str) -> Self {
        match err {
            RouterError::NoWorkers | RouterError::NoEligibleWorkers => Self::new(
                ErrorKind::NotReady,
                format!("no schedulable workers for model={model} routing_group={group}"),
            ),
            RouterError::AllWorkersBusy { .. } => Self::new(
                ErrorKind::Busy,
                format!("all workers are busy for model={model} routing_group={group}"),
            ),
            RouterError::UnknownWorker { worker_id, .. } => Self::not_found(format!(
                "schedulable worker {worker_id} not found for model={model} routing_group={group}"
            )),
            RouterError::DuplicateRequest(id) => Self::new(
                ErrorKind::Conflict,
                format!("selection {id} is already reserved or being reserved"),
            ),
            RouterError::UnknownRequest(id) => {
                Self::not_found(format!("reservation {id} not found"))
            }
            e @ RouterError::InvalidConfig { .. } => Self::invalid(e.to_string()),
            RouterError::InvalidInput(m) => Self::invalid(m),
            other => Self::new(ErrorKind::Internal, other.to_string()),
        }
    }
}

/// `Result` with [`SelectionError`].
pub type Result<T, E = SelectionError> = std::result::Result<T, E>;
