//! The runtime's error type.
//!
//! Variants follow the reference's error taxonomy so that the binding can map each one to
//! the matching Python exception class (`CannotConnect`, `Disconnected`, ...). A
//! [`Error::Remote`] carries an error that a worker's handler raised, with the category
//! that the worker reported on the wire.

use crate::transport::WireError;

/// Errors of the distributed runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A namespace, component or endpoint name, or an endpoint path, is malformed.
    #[error("{0}")]
    InvalidName(String),
    /// An argument or configuration value is invalid.
    #[error("{0}")]
    InvalidArgument(String),
    /// A message is larger than the configured maximum (`DYN_TCP_MAX_MESSAGE_SIZE`).
    #[error(
        "message of {size} bytes exceeds the maximum message size of {max} bytes (DYN_TCP_MAX_MESSAGE_SIZE)"
    )]
    MessageTooLarge {
        /// Size of the rejected message.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// No connection to the worker could be established.
    #[error("cannot connect to {address}: {reason}")]
    CannotConnect {
        /// Address that was dialled.
        address: String,
        /// Why it failed.
        reason: String,
    },
    /// An established connection was lost before the stream ended.
    #[error("{0}")]
    Disconnected(String),
    /// A connection or acknowledgement did not arrive in time.
    #[error("{0}")]
    ConnectionTimeout(String),
    /// No instance of the endpoint is available.
    #[error("no instances found for endpoint {0}")]
    NoInstances(String),
    /// `direct` named an instance that is not known.
    #[error("instance_id={instance_id} not found for endpoint {endpoint}")]
    UnknownInstance {
        /// The endpoint's path.
        endpoint: String,
        /// The requested instance.
        instance_id: u64,
    },
    /// The runtime (or the endpoint) is shutting down.
    #[error("runtime is shutting down")]
    ShuttingDown,
    /// An error reported by the worker (raised by its handler, or a rejection).
    #[error("{}", .0.message)]
    Remote(WireError),
    /// A discovery backend failed.
    #[error("discovery: {0}")]
    Discovery(String),
    /// A value could not be encoded or decoded (event envelopes and payloads).
    #[error("codec: {0}")]
    Codec(String),
    /// The NATS connection failed or a NATS operation failed.
    #[error("NATS: {0}")]
    Nats(String),
    /// The NATS server refused the credentials (`NATS_AUTH_*`), or they could not be read.
    #[error("NATS authorization failed: {0}")]
    NatsAuth(String),
    /// A message is larger than the NATS server accepts.
    #[error(
        "message of {size} bytes exceeds the NATS server's max_payload of {max} bytes \
         (raise max_payload in the nats-server configuration, or use the tcp request plane)"
    )]
    NatsPayloadTooLarge {
        /// Size of the rejected message.
        size: usize,
        /// The server's `max_payload`.
        max: usize,
    },
    /// The discovery lease was lost (etcd): the process must shut down.
    #[error("discovery lease lost: {0}")]
    LeaseLost(String),
    /// An I/O error outside a request stream (binding a listener, the file store).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Whether a request that failed with this error may be retried on another instance
    /// (the reference's migratable set: CannotConnect, Disconnected, ConnectionTimeout,
    /// EngineShutdown).
    pub fn is_migratable(&self) -> bool {
        match self {
            Error::CannotConnect { .. } | Error::Disconnected(_) | Error::ConnectionTimeout(_) => {
                true
            }
            Error::Remote(e) => e.kind == crate::transport::ErrorKind::EngineShutdown,
            _ => false,
        }
    }
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
