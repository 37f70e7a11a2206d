//! The ingress of the runtime: the OpenAI-compatible HTTP frontend, the KServe v2 gRPC
//! frontend, and the entry points that put an in-process engine behind an input.
//!
//! * [`http`]: the OpenAI HTTP frontend (axum on hyper): chat, completions, embeddings,
//!   responses, Anthropic messages, realtime, the OpenAPI document, model readiness, busy
//!   thresholds, routing (round robin, random, direct, KV-aware) and request migration.
//! * [`grpc`]: the KServe v2 gRPC ingress (tonic) for text and tensor models.
//! * [`entrypoint`]: in-process engines (echo, mocker) behind an input (`dyn://`, `http`,
//!   `grpc`, `text`, `stdin`): what `make_engine` / `run_input` assemble.
//!
//! Everything below this crate is free of HTTP: model cards, preprocessing and discovery
//! are `dynamo_llm`, the simulated engine is `dynamo_mocker`, parsers are `dynamo_parsers`.
//!
//! ```no_run
//! use dynamo_frontend::http::{FrontendConfig, HttpService};
//! use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
//! use dynamo_runtime::{DistributedRuntime, RuntimeConfig};
//!
//! let rt = dynamo_runtime::tokio_runtime()?;
//! rt.block_on(async {
//!     let drt = DistributedRuntime::new(DiscoveryBackend::File, RequestPlane::Tcp,
//!                                       RuntimeConfig::default())?;
//!     // Serves every model that workers register, until the runtime shuts down.
//!     HttpService::new(FrontendConfig { port: 8000, ..FrontendConfig::default() })
//!         .run(drt)
//!         .await?;
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod entrypoint;
pub mod error;
pub mod grpc;
pub mod http;

pub use error::{Error, Result};
