//! [`FpmEventRelay`]: FPM snapshots from an engine's local ZMQ PUB socket (vLLM's
//! instrumented scheduler in the engine-core child process) to the event plane.
//!
//! The engine sends `[topic, sequence, payload]` multipart messages; the payload (the last
//! part) is forwarded unchanged, so consumers see the engine's own bytes. The reference
//! drops messages with another part count; here any message's last part is its payload
//! (single-part publishers work too). Payloads are not decoded on this hop: subscribers
//! check them (and count the malformed ones). The ZMQ connection is re-dialled when the
//! engine restarts its socket (the shared SUB client of `kv_routing::zmq`).

use bytes::Bytes;
use dynamo_runtime::{DistributedRuntime, EndpointId};
use tokio_util::sync::CancellationToken;

use super::publisher::Outlet;
use crate::kv_routing::zmq::subscribe_loop;

/// Forwards FPM from a ZMQ PUB socket to `endpoint`'s FPM channel (dropping it stops it).
pub struct FpmEventRelay {
    stop: CancellationToken,
}

impl Drop for FpmEventRelay {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FpmEventRelay {
    /// Start relaying `zmq_endpoint` (`tcp://host:port`). Must be called inside the tokio
    /// runtime. The event-plane publisher registers itself in discovery.
    pub fn new(runtime: &DistributedRuntime, endpoint: &EndpointId, zmq_endpoint: &str) -> Self {
        let stop = CancellationToken::new();
        let outlet = Outlet::start(runtime, endpoint, stop.clone());
        tokio::spawn(subscribe_loop(
            zmq_endpoint.to_owned(),
            Vec::new(),
            stop.clone(),
            || true,
            move |mut message: Vec<Vec<u8>>| {
                if let Some(payload) = message.pop() {
                    outlet.send(Bytes::from(payload));
                }
                true
            },
        ));
        Self { stop }
    }

    /// Stop relaying (idempotent).
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}
