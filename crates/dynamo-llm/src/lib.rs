//! The LLM layer of the runtime: what sits between the distributed runtime and the
//! engines, with no HTTP and no simulator in it.
//!
//! * [`model_card`]: the model deployment card, model types, runtime configuration, the
//!   argument rules of `register_model`, and offline model resolution (`fetch_model`).
//! * [`preprocessor`]: OpenAI request/response types, chat templates, tokenization, the
//!   request sent to workers and the stop conditions / detokenization of their output.
//! * [`discovery`]: model cards in discovery (`register_model`) and the frontend's model
//!   watcher.
//! * [`engines`]: the token-engine contract ([`engines::TokenEngine`]), its request-plane
//!   handler, the response envelope ([`engines::Annotated`]) and the echo engine.
//! * [`kv_routing`]: KV-aware routing between processes: event and metrics publishers,
//!   recovery, the ZMQ transport of engine events, and the async `KvRouter`.
//! * [`fpm`]: forward-pass metrics (publisher, relay, subscriber).
//! * [`planner`]: the SLA planner's loop and the virtual connector.
//! * [`mm_cache`]: which worker holds which multimodal embedding.
//!
//! Below it: `dynamo-runtime`, `dynamo-kv-router`, `dynamo-parsers` and
//! `dynamo-multimodal` (media of chat requests, which cards and the preprocessor carry).
//! Above it: `dynamo-mocker` (the simulated engine), `dynamo-selection` (standalone
//! selection services), `dynamo-frontend` (HTTP and gRPC ingress).
//!
//! ```
//! use dynamo_llm::model_card::slugify;
//!
//! assert_eq!(slugify("Qwen/Qwen3-0.6B"), "qwen_qwen3-0.6b");
//! ```

pub mod discovery;
pub mod engines;
pub mod error;
pub mod fpm;
pub mod kv_routing;
pub mod mm_cache;
pub mod model_card;
pub mod planner;
pub mod preprocessor;

pub use error::{Error, Result};
