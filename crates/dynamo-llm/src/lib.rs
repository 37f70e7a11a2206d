//! The LLM layer of the runtime.
//!
//! * [`mocker`]: a GPU-free simulated inference engine (continuous batching, paged KV cache
//!   with prefix reuse and LRU eviction, chunked prefill, a timing model) that emits real KV
//!   events, so routing, load balancing and the whole serving path can run and be measured
//!   on any machine.
//! * [`model_card`]: the model deployment card, model types, runtime configuration, the
//!   argument rules of `register_model`, and offline model resolution (`fetch_model`).
//! * [`preprocessor`]: OpenAI request/response types, chat templates, tokenization, the
//!   request sent to workers and the stop conditions / detokenization of their output.
//! * [`kv_routing`]: KV-aware routing between processes: event and metrics publishers,
//!   recovery, and the async `KvRouter` used by the frontend.
//!
//! * [`discovery`]: model cards in discovery (`register_model`) and the frontend's model
//!   watcher.
//! * [`http`]: the OpenAI-compatible HTTP frontend (routing, migration, metrics).
//! * [`engines`]: in-process token engines (echo, mocker) and their request-plane handler.
//! * [`entrypoint`]: in-process engines behind an input (`dyn://`, `http`, `text`, `stdin`).
//! * [`grpc`]: the KServe v2 gRPC ingress (text and tensor models).
//! * [`parsers`]: tool-call and reasoning parsers of model output (streaming).
//! * [`lora`]: LoRA adapter URIs (`file://`, `s3://`) resolved to local directories through
//!   an on-disk cache (`LoRADownloader`).
//!
//! ```
//! use dynamo_llm::mocker::{MockEngine, MockEngineArgs, MockRequest};
//!
//! let mut engine = MockEngine::new(MockEngineArgs { block_size: 4, ..Default::default() })?;
//! engine.add_request(MockRequest::new("r1", (0..10).collect(), 3))?;
//! let mut tokens = 0;
//! while engine.has_work() {
//!     let step = engine.step();
//!     tokens += step.outputs.len();
//! }
//! assert_eq!(tokens, 3);
//! # Ok::<(), dynamo_llm::Error>(())
//! ```

pub mod discovery;
pub mod engines;
pub mod entrypoint;
pub mod error;
pub mod fpm;
pub mod grpc;
pub mod http;
pub mod kv_routing;
pub mod lora;
pub mod mm_cache;
pub mod mocker;
pub mod model_card;
pub mod multimodal;
pub mod parsers;
pub mod planner;
pub mod preprocessor;
#[cfg(feature = "replay")]
pub mod replay;
pub mod selection;

pub use error::{Error, Result};
