//! The runtime's integration tests, one binary: each module is one area of behaviour
//! through the public API. One binary links the crate and its dependencies once instead
//! of once per area (six links and six copies of the same generic code before).
//!
//! Run one area with `cargo test -p dynamo-runtime --release --test runtime distributed::`.

mod common;
mod distributed;
mod event_plane;
mod health_and_registration;
mod in_process;
mod request_plane;
mod secured_backends;
