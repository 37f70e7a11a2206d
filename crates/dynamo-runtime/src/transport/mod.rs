//! The TCP request plane: one listener per serving process, persistent multiplexed
//! connections from callers, request and response frames on the same connection.
//!
//! The wire format is documented in `docs/design/request_plane.md`; [`frame`] implements it.
//! [`server`] accepts connections and dispatches requests to endpoint handlers by path;
//! [`client`] keeps one connection per worker address and turns frames into
//! [`client::ResponseStream`]s.

pub mod client;
pub mod codec;
pub mod frame;
mod live;
pub mod nats;
pub mod server;

use serde::{Deserialize, Serialize};

/// Per-stream flow-control window, in response items: a worker may send this many items
/// ahead of the caller's consumption. Large enough that a fast consumer never waits for a
/// credit round trip (credits are returned every half window), small enough that a stalled
/// consumer of a long stream holds at most a few hundred items in memory.
pub const STREAM_WINDOW: u32 = 256;

/// Default maximum size of one message (request body or response item): 32 MiB, as the
/// reference's `DYN_TCP_MAX_MESSAGE_SIZE`.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 32 * 1024 * 1024;

/// Category of an error carried on the wire. The first eight mirror the Python exception
/// classes; `NotFound` and `Unavailable` are rejections before a stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Uncategorised.
    Unknown,
    /// Bad input.
    InvalidArgument,
    /// A connection could not be established.
    CannotConnect,
    /// A connection was lost.
    Disconnected,
    /// Something timed out.
    ConnectionTimeout,
    /// The request was cancelled.
    Cancelled,
    /// The engine is shutting down; the request may be migrated.
    EngineShutdown,
    /// The stream ended before completion.
    StreamIncomplete,
    /// The worker does not serve the requested endpoint.
    NotFound,
    /// The worker is not accepting requests (shutting down or sleeping); retry elsewhere.
    Unavailable,
}

/// An error sent by a worker to end a stream (or reject a request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// Category.
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
    /// Whether the handler raised one of the runtime's own typed errors (so the caller
    /// re-raises the same class); otherwise the caller raises a generic error.
    #[serde(default)]
    pub typed: bool,
}

impl WireError {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>, typed: bool) -> Self {
        Self {
            kind,
            message: message.into(),
            typed,
        }
    }
}

/// The JSON header of a request frame.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RequestHeader {
    /// The request/context id (cancellation and tracing line up across processes).
    pub id: String,
    /// The caller context's metadata.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `true` for a bidirectional call: request items follow as `ITEM` frames.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streaming: bool,
    /// `true` when the caller's context was already stopped when the request was sent:
    /// the handler still runs (as in the reference) but sees `is_stopped()` from its first
    /// line, and its items are not sent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}
