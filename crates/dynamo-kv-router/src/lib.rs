//! KV-cache-aware routing core.
//!
//! This crate is the pure, synchronous heart of the KV router: it has no async runtime and
//! no I/O, so every piece can be unit- and property-tested in isolation and called from any
//! thread (including the Python binding layer with the GIL released).
//!
//! * [`hashing`]: bit-exact block hashing (local and chained sequence hashes) shared by the
//!   router, the indexer, the mocker engine and the block manager.
//! * [`scheduling`]: worker selection: configuration, cost function, sampling, active-load
//!   tracking and the router queue.
//! * [`protocols`]: KV-cache events (`stored` / `removed` / `cleared`) and their JSON and
//!   msgpack codecs.
//! * [`indexer`]: the radix-tree index of which worker rank holds which cached prefix, with
//!   exact memory reclamation and lock-light concurrent queries.
//! * [`engine_events`]: decoding engines' ZMQ KV-event payloads (vLLM msgpack format).
//! * [`publisher`]: worker-side construction of KV events from engine reports.
//! * [`recovery`]: event-gap detection and the worker-local indexer with its replay buffer.
//! * [`kv_router`]: indexer, scheduler and gap detection behind one router type.
//! * [`approx`]: the approximate indexer that predicts cache contents from routing
//!   decisions (no events), with TTL expiry and size pruning.
//!
//! ```
//! use dynamo_kv_router::hashing::{compute_block_hash_for_seq, BlockHashOptions};
//!
//! let prompt: Vec<u32> = (0..40).collect();
//! // 40 tokens in blocks of 16: two complete blocks, the 8-token tail is not hashed.
//! let hashes = compute_block_hash_for_seq(&prompt, 16, &BlockHashOptions::default())?;
//! assert_eq!(hashes.len(), 2);
//! # Ok::<(), dynamo_kv_router::Error>(())
//! ```

pub mod approx;
pub mod engine_events;
pub mod error;
pub mod hashing;
pub mod indexer;
pub mod kv_router;
pub mod protocols;
pub mod publisher;
pub mod recovery;
pub mod scheduling;

pub use error::{Error, Result};
