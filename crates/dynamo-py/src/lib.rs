//! The `dynamo._core` Python extension module.
//!
//! This crate is the PyO3 layer only: each function converts its arguments, calls one
//! function of a core crate and maps the result or error. Business logic lives in the core
//! crates, where `cargo test` covers it. One file per Python-visible area:
//!
//! * [`errors`]: the `DynamoException` hierarchy and the mapping of core errors.
//! * [`convert`]: fast, validated conversions of Python arguments.
//! * [`kv`]: block hashing, the `RadixTree` indexer and `OverlapScores`.
//! * [`router`]: router configuration classes.
//! * [`kv_routing`]: KV event/metrics publishers, KV indexers and `KvRouter`.
//! * [`runtime`]: `DistributedRuntime`, `Endpoint`, `Client`, `Instance`, `TransportType`.
//! * [`context`]: `Context`, `ContextMetadata`, `SpanProxy`.
//! * [`instance_id`]: the `ModelCardInstanceId` class.
//! * [`backend`]: the `dynamo._core.backend` submodule (`Worker` over a Python engine).
//! * [`aio`]: Rust futures as asyncio futures (completed on the loop thread).
//! * [`engine`]: the bridge between the request plane and Python handlers and streams.
//! * [`json`]: payload conversion; [`logging`]: `log_message` and the tracing subscriber.
//! * [`block_manager`]: the KV block manager (`BlockManager`, `BlockList`, `Block`, `Layer`).
//! * [`dlpack`]: DLPack capsules (PyCapsule glue over the core crate's managed tensors).
//! * [`llm`]: model types, runtime config, model deployment card, `MockEngineArgs`,
//!   `lora_name_to_id`, `fetch_model`.
//! * [`llm_serving`]: `register_model`, the OpenAI frontend (`HttpService`), entry points
//!   (`EntrypointArgs`, `make_engine`, `run_input`).
//! * [`frontend_routes`]: `FrontendRoute`, `FrontendResponse`, `FrontendExtensionContext`
//!   (extension routes of the HTTP frontend).
//! * [`replay`]: `run_mocker_trace_replay`, `run_mocker_synthetic_trace_replay` (trace replay).
//! * [`llm_static`]: Python async generators as in-process OpenAI engines
//!   (`PythonAsyncEngine`, `HttpAsyncEngine`).
//! * [`grpc`]: the KServe v2 gRPC ingress (`KserveGrpcService`).
//! * [`fpm`]: forward-pass metrics (`FpmDirectPublisher`, `FpmEventRelay`,
//!   `FpmEventSubscriber`).
//! * [`planner`]: `PlannerDecision`, the virtual connector, `run_planner`,
//!   `MultimodalEmbeddingCachePublisher`.
//! * [`parsers`]: `get_tool_parser_names`, `get_reasoning_parser_names`.

use pyo3::prelude::*;

mod aio;
mod backend;
mod block_manager;
mod context;
mod convert;
mod dlpack;
mod engine;
mod errors;
mod fpm;
mod frontend_routes;
mod grpc;
mod instance_id;
mod json;
mod kv;
mod kv_routing;
mod llm;
mod llm_serving;
mod llm_static;
mod logging;
mod msgpack;
mod parsers;
mod planner;
mod replay;
mod routed_engine;
mod router;
mod runtime;

/// The extension module. Each area registers its own classes and functions.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    kv::register(m)?;
    router::register(m)?;
    kv_routing::register(m)?;
    runtime::register(m)?;
    instance_id::register(m)?;
    backend::register(m)?;
    logging::register(m)?;
    block_manager::register(m)?;
    llm::register(m)?;
    llm_serving::register(m)?;
    frontend_routes::register(m)?;
    grpc::register(m)?;
    fpm::register(m)?;
    planner::register(m)?;
    replay::register(m)?;
    parsers::register(m)?;
    Ok(())
}
