//! Entry points: the pieces the Python `make_engine` / `run_input` and the CLIs assemble.
//!
//! An in-process engine ([`LocalEngine`]: the echo engine or the mocker, both
//! [`TokenEngine`]s) runs behind one of the inputs:
//! * `dyn://ns.comp.ep` ([`serve_token_engine`]): served on the request plane by a
//!   [`TokenEngineHandler`] with its model card registered, so frontends discover it (the
//!   mocker worker is this path, [`serve_mocker`]);
//! * `http` ([`serve_http`]): the OpenAI frontend with the engine as an in-process model;
//! * `text` / `stdin` ([`text`]): a terminal chat;
//! * `grpc` ([`serve_grpc`]): the KServe v2 gRPC ingress ([`crate::grpc`]).

pub mod text;

use std::path::Path;
use std::sync::Arc;

use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_llm::discovery::register_model;
use dynamo_llm::engines::{EchoEngine, TokenEngine, TokenEngineHandler};
use dynamo_llm::kv_routing::KvEventPublisher;
use dynamo_llm::model_card::{ModelDeploymentCard, ModelInput, ModelType, RegisterModelArgs};
use dynamo_mocker::MockEngineArgs;
use dynamo_mocker::runner::MockEngineRunner;
use dynamo_mocker::token_engine::MockTokenEngine;
use dynamo_runtime::{DistributedRuntime, EndpointId};

use crate::error::{Error, Result};
use crate::http::static_engine::StaticTokenModel;
use crate::http::{FrontendConfig, HttpService};

/// Which in-process engine.
#[derive(Debug, Clone)]
pub enum LocalEngineKind {
    /// [`EchoEngine`]: streams the prompt back.
    Echo,
    /// The mocker with these settings.
    Mocker(MockEngineArgs),
}

/// An in-process engine and the model directory it serves (what `make_engine` builds for
/// `EngineType.Echo` / `EngineType.Mocker`).
#[derive(Debug, Clone)]
pub struct LocalEngine {
    /// Local model directory (config, tokenizer and chat template; no weights).
    pub model_path: String,
    /// Served name (defaults to the model path).
    pub model_name: Option<String>,
    /// The engine.
    pub kind: LocalEngineKind,
    /// Media decoding the card enables (images for multimodal tests of the mocker).
    pub media_decoder: Option<dynamo_multimodal::MediaDecoderConfig>,
    /// Media fetcher settings of the card.
    pub media_fetcher: Option<dynamo_multimodal::MediaFetcherConfig>,
}

/// `vocab_size` of a model directory's `config.json`.
fn model_vocab_size(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("vocab_size")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

fn runtime_err(e: dynamo_runtime::Error) -> Error {
    dynamo_llm::Error::Runtime(e.to_string()).into()
}

impl LocalEngine {
    /// The model card the engine serves (tokens in, chat and completions).
    ///
    /// # Errors
    /// A model directory that cannot be loaded.
    pub fn card(&self) -> Result<ModelDeploymentCard> {
        let block_size = match &self.kind {
            LocalEngineKind::Mocker(args) => u32::try_from(args.block_size).ok().filter(|b| *b > 0),
            LocalEngineKind::Echo => None,
        };
        Ok(RegisterModelArgs {
            model_input: ModelInput::Tokens,
            model_type: ModelType::CHAT.union(ModelType::COMPLETIONS),
            model_path: self.model_path.clone(),
            model_name: self.model_name.clone(),
            kv_cache_block_size: block_size,
            media_decoder: self.media_decoder.clone(),
            media_fetcher: self.media_fetcher.clone(),
            ..Default::default()
        }
        .build_card()?)
    }

    /// Start the engine for `card`. A mocker serving `endpoint` publishes its KV events
    /// for that endpoint's routers; an in-process one keeps them to itself.
    ///
    /// # Errors
    /// Invalid engine arguments or a runtime error.
    pub fn start(
        &self,
        card: &ModelDeploymentCard,
        endpoint: Option<(&DistributedRuntime, &EndpointId)>,
    ) -> Result<Arc<dyn TokenEngine>> {
        match &self.kind {
            LocalEngineKind::Echo => Ok(Arc::new(EchoEngine::from_env())),
            LocalEngineKind::Mocker(args) => {
                let mut args = args.clone();
                let vocab = model_vocab_size(&card.local_dir()).unwrap_or(args.vocab_size);
                args.vocab_size = vocab;
                let (events, fpm): (dynamo_mocker::runner::EventSink, _) = match endpoint {
                    // KV events go to routers on the event plane (with a worker-local index
                    // for their gap recovery), numbered per rank like a real engine's.
                    Some((runtime, ep)) => {
                        let worker = WorkerWithDpRank::new(runtime.connection_id(), 0);
                        let publisher = Arc::new(
                            KvEventPublisher::new_raw(runtime, ep, worker, true)
                                .map_err(|e| dynamo_llm::Error::Runtime(e.to_string()))?,
                        );
                        // Each simulated pass is also published as forward-pass metrics
                        // (worker id: the instance id in decimal, as planners expect).
                        let fpm = dynamo_llm::fpm::FpmDirectPublisher::new(
                            runtime,
                            ep,
                            &runtime.connection_id().to_string(),
                            1,
                        );
                        let sink: dynamo_mocker::runner::FpmSink = Box::new(move |sample| {
                            let _ = fpm.publish(0, sample);
                        });
                        (publisher.event_sink(), Some(sink))
                    }
                    None => (Box::new(|_| {}), None),
                };
                // `zmq_kv_events_port`: also publish them on ZMQ like a vLLM engine.
                let zmq = match args.zmq_kv_events_port {
                    Some(port) => {
                        let sink = dynamo_mocker::zmq_events::ZmqKvEventSink::bind(
                            port,
                            args.zmq_replay_port,
                            args.block_size,
                            0,
                        )?;
                        let f: dynamo_mocker::runner::EngineEventSink =
                            Box::new(move |events, tokens| sink.publish(events, tokens));
                        Some(f)
                    }
                    None => None,
                };
                let runner = MockEngineRunner::spawn_with_sinks(args, events, fpm, zmq)?;
                Ok(Arc::new(MockTokenEngine::new(runner, vocab)))
            }
        }
    }

    /// Start the engine and serve it on `endpoint` (registering its card) until the
    /// runtime stops.
    ///
    /// # Errors
    /// Invalid engine arguments, a model directory that cannot be loaded, or a runtime error.
    pub async fn serve_endpoint(
        &self,
        runtime: DistributedRuntime,
        endpoint: EndpointId,
    ) -> Result<()> {
        let card = self.card()?;
        let engine = self.start(&card, Some((&runtime, &endpoint)))?;
        serve_token_engine(runtime, endpoint, &card, engine).await
    }

    /// The engine as an in-process model of an HTTP frontend (started, without KV events).
    ///
    /// # Errors
    /// Invalid engine arguments or a model directory that cannot be loaded.
    pub fn static_model(&self) -> Result<StaticTokenModel> {
        let card = self.card()?;
        let engine = self.start(&card, None)?;
        Ok(StaticTokenModel::new(card, engine)?)
    }
}

/// Register `card` for `endpoint` and serve `engine` there until the runtime stops.
///
/// # Errors
/// [`Error::Runtime`] when discovery or the request plane fails.
pub async fn serve_token_engine(
    runtime: DistributedRuntime,
    endpoint: EndpointId,
    card: &ModelDeploymentCard,
    engine: Arc<dyn TokenEngine>,
) -> Result<()> {
    let handler = Arc::new(TokenEngineHandler::new(engine));
    register_model(&runtime, &endpoint, card).await?;
    runtime
        .serve_endpoint(&endpoint, handler, true)
        .await
        .map_err(runtime_err)
}

/// Serve OpenAI HTTP with `config`: discovered models, plus `local` as an in-process model
/// when given, until the runtime stops.
///
/// # Errors
/// The engine cannot start or the listener cannot be bound.
pub async fn serve_http(
    runtime: DistributedRuntime,
    config: FrontendConfig,
    local: Option<&LocalEngine>,
) -> Result<()> {
    serve_http_with_routes(runtime, config, local, Vec::new()).await
}

/// [`serve_http`] with extension routes next to the built-in ones.
///
/// # Errors
/// As [`serve_http`], and [`dynamo_llm::Error::Route`] when a route takes a built-in path or
/// two share one (before anything is served).
pub async fn serve_http_with_routes(
    runtime: DistributedRuntime,
    config: FrontendConfig,
    local: Option<&LocalEngine>,
    routes: Vec<crate::http::extensions::ExtensionRoute>,
) -> Result<()> {
    serve_http_with_factory(runtime, config, local, routes, None).await
}

/// [`serve_http_with_routes`], with discovered chat models' chat engines built by
/// `factory` (see [`crate::http::engine_factory`]).
///
/// # Errors
/// As [`serve_http_with_routes`].
pub async fn serve_http_with_factory(
    runtime: DistributedRuntime,
    config: FrontendConfig,
    local: Option<&LocalEngine>,
    routes: Vec<crate::http::extensions::ExtensionRoute>,
    factory: Option<Arc<dyn crate::http::engine_factory::ChatEngineFactory>>,
) -> Result<()> {
    let service = HttpService::new(config);
    service.add_extension_routes(routes)?;
    if let Some(factory) = factory {
        service.set_chat_engine_factory(factory);
    }
    if let Some(local) = local {
        service.statics().add_token_model(local.static_model()?);
    }
    Ok(service.run(runtime).await?)
}

/// Serve the KServe v2 gRPC ingress on `config.host:config.port`: discovered models, plus
/// `local` as an in-process text model when given, until the runtime stops.
///
/// # Errors
/// The engine cannot start or the listener cannot be bound.
pub async fn serve_grpc(
    runtime: DistributedRuntime,
    config: FrontendConfig,
    local: Option<&LocalEngine>,
) -> Result<()> {
    let service = crate::grpc::KserveService::new(config);
    if let Some(local) = local {
        service.statics().add_token_model(local.static_model()?);
    }
    Ok(service.run(runtime).await?)
}
