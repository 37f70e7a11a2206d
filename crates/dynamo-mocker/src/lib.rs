//! A GPU-free simulated inference engine, and trace replay on a simulator.
//!
//! [`MockEngine`] is a discrete-time model of one engine rank: a vLLM-style continuous
//! batching scheduler (running and waiting queues, a per-pass token budget, chunked
//! prefill, recompute preemption under memory pressure) over a paged KV cache
//! ([`kv_cache`]) with prefix reuse and LRU eviction. Each call to [`MockEngine::step`]
//! simulates one forward pass and returns how long it took ([`timing`], scaled by
//! `speedup_ratio`), the tokens it produced and the KV events the cache emitted, in the
//! router's event format, with the router's block and sequence hashes, so a KV router fed by
//! these events sees exactly what a real engine would report.
//!
//! The engine has no clock and no threads: callers drive it. The modules around it:
//! * [`args`]: `MockEngineArgs` (the reference's engine arguments and their validation);
//! * [`runner`]: the engine on a tokio task in real (scaled) time, with KV-event, load and
//!   forward-pass-metric sinks;
//! * [`token_engine`]: the runner as a `dynamo_llm` token engine, so it can be served on a
//!   worker endpoint or behind the in-process frontend;
//! * [`publish`]: the runner's load figures published to routers;
//! * [`zmq_events`]: engine-format KV events on a ZMQ PUB socket, as vLLM publishes them;
//! * [`replay`] (feature `replay`, on by default): a trace or synthetic workload replayed on
//!   the `aisimulate-core` simulator behind our router (this is the only crate that builds
//!   that library).
//!
//! ```
//! use dynamo_mocker::{MockEngine, MockEngineArgs, MockRequest};
//!
//! let mut engine = MockEngine::new(MockEngineArgs { block_size: 4, ..Default::default() })?;
//! engine.add_request(MockRequest::new("r1", (0..10).collect(), 3))?;
//! let mut tokens = 0;
//! while engine.has_work() {
//!     let step = engine.step();
//!     tokens += step.outputs.len();
//! }
//! assert_eq!(tokens, 3);
//! # Ok::<(), dynamo_mocker::Error>(())
//! ```

pub mod args;
pub mod engine;
pub mod error;
pub mod kv_cache;
pub mod publish;
#[cfg(feature = "replay")]
pub mod replay;
pub mod runner;
pub mod timing;
pub mod token_engine;
pub mod zmq_events;

pub use args::{MockEngineArgs, MockWorkerType, PreemptionMode};
pub use engine::{MockEngine, MockOutput, MockRequest, MockerMetrics, StepResult};
pub use error::{Error, Result};
