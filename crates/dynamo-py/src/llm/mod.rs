//! `dynamo.llm`: the LLM layer's classes and functions, one file per area.
//!
//! * [`model_card`]: model types, runtime config, the model deployment card,
//!   `lora_name_to_id`, `fetch_model`; [`instance_id`]: `ModelCardInstanceId`.
//! * [`discovery`]: `register_model`, `unregister_model`, `update_model_taints`.
//! * [`kv`]: block hashing, `RadixTree`, `OverlapScores`; [`router`]: the router
//!   configuration classes; [`kv_routing`]: KV event / metrics publishers, KV indexers and
//!   `KvRouter`.
//! * [`entrypoint`]: `EngineType`, `EntrypointArgs`, `make_engine`, `run_input`;
//!   [`http`]: `HttpService`; [`python_engine`]: `PythonAsyncEngine`, `HttpAsyncEngine`;
//!   [`routed_engine`]: `chat_engine_factory`'s `RoutedEngine`; [`frontend_routes`]:
//!   extension routes; [`grpc`]: `KserveGrpcService`; [`parsers`]: parser names.
//! * [`mocker_args`]: `MockEngineArgs` and its sections; [`selection`]:
//!   `SelectionService` and the standalone services' entry points.
//! * [`fpm`]: forward-pass metrics; [`mm_cache`]: the multimodal embedding cache;
//!   [`media`]: `MediaDecoder`, `MediaFetcher`; [`lora`]: `LoRADownloader`.
//! * [`block_manager`] (with [`dlpack`]): the KV block manager.

use pyo3::prelude::*;

pub(crate) mod block_manager;
pub(crate) mod discovery;
pub(crate) mod dlpack;
pub(crate) mod entrypoint;
pub(crate) mod fpm;
pub(crate) mod frontend_routes;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod instance_id;
pub(crate) mod kv;
pub(crate) mod kv_routing;
pub(crate) mod lora;
pub(crate) mod media;
pub(crate) mod mm_cache;
pub(crate) mod mocker_args;
pub(crate) mod model_card;
pub(crate) mod parsers;
pub(crate) mod python_engine;
pub(crate) mod routed_engine;
pub(crate) mod router;
pub(crate) mod selection;

/// Register every `dynamo.llm` class and function on the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    kv::register(m)?;
    router::register(m)?;
    kv_routing::register(m)?;
    instance_id::register(m)?;
    block_manager::register(m)?;
    model_card::register(m)?;
    mocker_args::register(m)?;
    lora::register(m)?;
    media::register(m)?;
    selection::register(m)?;
    discovery::register(m)?;
    entrypoint::register(m)?;
    http::register(m)?;
    python_engine::register(m)?;
    routed_engine::register(m)?;
    frontend_routes::register(m)?;
    grpc::register(m)?;
    fpm::register(m)?;
    mm_cache::register(m)?;
    parsers::register(m)?;
    Ok(())
}
