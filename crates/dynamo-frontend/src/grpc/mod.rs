//! The KServe v2 gRPC ingress (`inference.GRPCInferenceService`, tonic).
//!
//! RPCs: `ServerLive`, `ServerReady`, `ServerMetadata`, `ModelReady`, `ModelMetadata`,
//! `ModelConfig` (Triton's extension), `ModelInfer` and `ModelStreamInfer` (bidirectional:
//! many responses per request, as Triton's decoupled models answer); the other Triton RPCs
//! answer `UNIMPLEMENTED`.
//!
//! Models, served next to each other:
//! * text models (completions): discovered workers registered with `Completions`, and
//!   in-process Python engines (`add_completions_model`). A request's `text_input` becomes
//!   an OpenAI completions request ([`text`]) sent through the HTTP frontend's own router,
//!   in-process, so preprocessing, routing, migration and detokenisation are the ones
//!   `/v1/completions` uses;
//! * tensor models: discovered workers registered with `ModelInput.Tensor` /
//!   `ModelType.TensorBased` (their `tensor_model_config` travels in the model card), and
//!   in-process engines (`add_tensor_model`). The handler receives and answers the tensor
//!   maps of [`tensor`].
//!
//! Errors are gRPC statuses: an unknown model `NOT_FOUND`, a bad input `INVALID_ARGUMENT`
//! naming it, no worker `UNAVAILABLE`, every worker busy `RESOURCE_EXHAUSTED`. On
//! `ModelStreamInfer` a failed request answers a response with `error_message` and the
//! stream goes on.
//!
//! Cancellation: a unary call the client abandons drops its future, and a cancelled stream
//! drops its response stream; either way the worker streams are dropped, which stops the
//! requests on the workers.

mod service;
pub mod tensor;
pub mod text;

/// The generated protocol types (`inference` package).
#[expect(missing_docs, reason = "generated code")]
#[allow(
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    reason = "generated code"
)]
pub mod proto {
    tonic::include_proto!("inference");
}

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use dynamo_llm::discovery::ModelWatcher;
use dynamo_llm::error::{Error, Result};
use dynamo_llm::model_card::ModelRuntimeConfig;
use dynamo_runtime::DistributedRuntime;
use tensor::TensorModelConfig;
use tokio::sync::watch;

use crate::http::{FrontendConfig, HttpService, OpenAiEngine, StaticModels};

/// The reference's default port of `KserveGrpcService`.
pub const DEFAULT_GRPC_PORT: u16 = 8787;

/// An in-process tensor model.
#[derive(Clone)]
pub(crate) struct StaticTensorModel {
    pub(crate) engine: Arc<dyn OpenAiEngine>,
    pub(crate) config: Option<Arc<TensorModelConfig>>,
    /// `add_tensor_model(runtime_config=...)`: its `runtime_data` is reported as the
    /// `ModelConfig` parameters, as a discovered worker's card's is.
    pub(crate) runtime_config: Option<Arc<ModelRuntimeConfig>>,
}

/// The in-process tensor models of a service (cheap to clone).
#[derive(Clone, Default)]
pub struct TensorModels {
    inner: Arc<RwLock<BTreeMap<String, StaticTensorModel>>>,
}

impl TensorModels {
    /// Serve `engine` as tensor model `name` (replacing one of the same name).
    pub fn add(
        &self,
        name: &str,
        engine: Arc<dyn OpenAiEngine>,
        config: Option<TensorModelConfig>,
        runtime_config: Option<ModelRuntimeConfig>,
    ) {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(
                name.to_owned(),
                StaticTensorModel {
                    engine,
                    config: config.map(Arc::new),
                    runtime_config: runtime_config.map(Arc::new),
                },
            );
    }

    /// Stop serving `name`; false when there was none.
    pub fn remove(&self, name: &str) -> bool {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name)
            .is_some()
    }

    /// Names, sorted.
    pub fn list(&self) -> Vec<String> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<StaticTensorModel> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }
}

/// The KServe gRPC service.
pub struct KserveService {
    /// Host, port, router mode, namespace, migration and message limit (the HTTP
    /// frontend's settings; only its router is used, nothing listens on HTTP).
    config: FrontendConfig,
    http: Arc<HttpService>,
    tensors: TensorModels,
    stop: watch::Sender<bool>,
    bound: watch::Sender<Option<SocketAddr>>,
}

impl KserveService {
    /// A service listening on `config.host:config.port` (nothing runs until [`Self::run`]).
    pub fn new(config: FrontendConfig) -> Arc<Self> {
        Arc::new(Self {
            http: HttpService::new(config.clone()),
            config,
            tensors: TensorModels::default(),
            stop: watch::channel(false).0,
            bound: watch::channel(None).0,
        })
    }

    /// Its in-process text models (`add_completions_model`, `add_chat_completions_model`).
    pub fn statics(&self) -> &StaticModels {
        self.http.statics()
    }

    /// Its in-process tensor models (`add_tensor_model`).
    pub fn tensors(&self) -> &TensorModels {
        &self.tensors
    }

    /// The address it listens on, once bound.
    pub async fn local_addr(&self) -> Option<SocketAddr> {
        let mut rx = self.bound.subscribe();
        rx.wait_for(Option::is_some).await.ok().and_then(|a| *a)
    }

    /// Follow the runtime's model cards and serve gRPC until [`Self::shutdown`] or the
    /// runtime stops.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the listener cannot be bound or the server fails.
    pub async fn run(self: Arc<Self>, runtime: DistributedRuntime) -> Result<()> {
        self.http.install_kv_selector(&runtime);
        ModelWatcher::start(
            runtime.clone(),
            self.config.namespace.clone(),
            self.http.models().clone(),
        )
        .await;
        let addr = format!("{}:{}", self.config.host, self.config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::listen(&addr, &e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Runtime(e.to_string()))?;
        tracing::info!(address = %local, "KServe gRPC service listening");
        self.bound.send_replace(Some(local));
        let svc = service::Kserve::new(
            self.http.router(),
            self.http.models().clone(),
            self.http.statics().clone(),
            self.tensors.clone(),
        );
        let limit = self.config.body_limit;
        let server = proto::grpc_inference_service_server::GrpcInferenceServiceServer::new(svc)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let mut stop = self.stop.subscribe();
        let shutdown = async move {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                () = runtime.stopped() => {}
            }
        };
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| Error::Runtime(format!("gRPC server failed: {e}")))
    }

    /// Stop serving (idempotent).
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }
}
