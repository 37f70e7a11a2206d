//! The distributed runtime of dynamo-rs: endpoints, discovery, the request and event
//! planes, per-request contexts with cancellation, and graceful shutdown.
//!
//! The modules stand in layers, each importing only those below it: [`config`] (plain
//! settings) < [`discovery`] < [`transport`] < [`events`] < [`runtime`] < [`router`] <
//! [`system`].
//!
//! Main types:
//! * [`DistributedRuntime`]: one per process (or several in one process with `mem`
//!   discovery); serves endpoints and creates clients.
//! * [`EndpointId`]: the name `namespace.component.endpoint`.
//! * [`config`]: the runtime's settings (`DYN_*` environment variables) as plain types.
//! * [`discovery`]: the [`discovery::Discovery`] and [`discovery::KvStore`] traits with
//!   the `mem`, `file` and `etcd` stores.
//! * [`transport`]: the request plane (frames, server, pooled client connections) over
//!   TCP or NATS.
//! * [`events`]: the event plane: [`DistributedRuntime::event_publisher`] and
//!   [`DistributedRuntime::subscribe`] over brokerless TCP or NATS, with per-publisher
//!   sequence numbers and gap detection.
//! * [`system`] and [`metrics`]: the system status server (`DYN_SYSTEM_PORT`: `/health`,
//!   `/live`, `/metrics`, `/engine/*`), the endpoint canary, and the per-endpoint
//!   Prometheus metrics.
//! * [`Client`] ([`router`]): round-robin / random / direct routing over live instances.
//! * [`Context`]: request id, stop/kill, metadata.
//! * [`planner`]: the virtual connector between the planner and its workers.
//!
//! ```
//! use std::sync::Arc;
//! use dynamo_runtime::transport::server::{Handler, Request, Responder};
//! use dynamo_runtime::{Context, DistributedRuntime, EndpointId, Route, RuntimeConfig};
//! use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
//!
//! struct Echo;
//! impl Handler for Echo {
//!     fn start(&self, request: Request, mut out: Responder) {
//!         out.accept();
//!         let _ = out.send(&request.body);
//!         out.finish();
//!     }
//! }
//!
//! let rt = dynamo_runtime::tokio_runtime().unwrap();
//! rt.block_on(async {
//!     let drt = DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp,
//!                                       RuntimeConfig::default()).unwrap();
//!     let ep = EndpointId::parse("doc.echo.generate").unwrap();
//!     let server = drt.clone();
//!     let ep2 = ep.clone();
//!     tokio::spawn(async move { server.serve_endpoint(&ep2, Arc::new(Echo), true).await });
//!     let client = drt.client(&ep);
//!     client.wait_for_instances().await.unwrap();
//!     let mut stream = client
//!         .generate("\"hi\"".into(), Route::RoundRobin, Context::default(), None)
//!         .await
//!         .unwrap();
//!     assert_eq!(&stream.next().await.unwrap().unwrap()[..], b"\"hi\"");
//!     assert!(stream.next().await.is_none());
//!     drt.shutdown();
//!     drt.stopped().await;
//! });
//! ```

pub mod config;
pub mod context;
pub mod discovery;
pub mod error;
pub mod events;
pub mod expfmt;
pub mod log_limit;
pub mod metrics;
pub mod names;
mod nats;
pub mod planner;
pub mod router;
pub mod runtime;
mod status;
pub mod system;
pub mod transport;

pub use config::RuntimeConfig;
pub use context::Context;
pub use error::{Error, Result};
pub use names::EndpointId;
pub use router::{Client, Route};
pub use runtime::{DistributedRuntime, tokio_runtime};
