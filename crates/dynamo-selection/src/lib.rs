//! Runtime-free worker selection: gateways that do not run the Dynamo runtime register
//! workers, the service subscribes to each worker's KV events straight from the engine's
//! ZMQ publisher, and answers "which worker?" in process ([`SelectionService`]) or over
//! HTTP (the standalone services of [`cli`]: `run_select_service`, `run_kv_indexer`,
//! `run_slot_tracker`).
//!
//! * [`catalog`]: worker registrations and the records (`lifecycle`,
//!   `not_schedulable_reasons`) the service reports.
//! * [`service`]: the catalog, one radix-tree index + scheduler per (model, routing
//!   group) — the same `dynamo_kv_router` index and scheduler the KV router uses — the
//!   pending-selection cache ([`cache`]) and the reservations.
//! * [`group`]: one (model, routing group)'s index and scheduler, which the service
//!   selects in and the listeners feed.
//! * [`listener`]: one ZMQ KV-event listener per worker rank.
//! * [`requests`]: request and response bodies (the reference's field names).
//! * [`http`] (select service), [`indexer`], [`slots`] (slot tracker): the HTTP services;
//!   [`cli`]: their command lines.
//! * [`replica`]: replica sync of bookings between services over ZMQ PUB/SUB;
//!   [`recovery`]: loading a peer's `/dump` into the indexes at start-up.
//!
//! ```
//! use dynamo_selection::{SelectionService, ServiceOptions, WorkerRequest, parse};
//!
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let svc = SelectionService::new(ServiceOptions::default(), rt.handle().clone())?;
//! // A registration without endpoints is kept but is not schedulable yet.
//! let rec = svc.upsert_worker(WorkerRequest { worker_id: 1, ..Default::default() })?;
//! assert!(!rec.not_schedulable_reasons.is_empty());
//! let err = svc.select(&parse(br#"{"token_ids": [1, 2, 3]}"#)?).unwrap_err();
//! assert_eq!(err.kind.as_str(), "not_ready");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cache;
pub mod catalog;
pub mod cli;
pub mod error;
pub mod group;
pub mod http;
pub mod indexer;
pub mod listener;
mod prom;
pub mod recovery;
pub mod replica;
pub mod requests;
pub mod service;
pub mod slots;

pub use cache::SelectionCacheConfig;
pub use catalog::{Lifecycle, WorkerRecord, WorkerRequest};
pub use error::{ErrorKind, SelectionError};
pub use requests::{PromptRequest, ReservationRequest, parse};
pub use service::{SelectionService, ServiceOptions};
