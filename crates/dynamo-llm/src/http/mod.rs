//! The OpenAI-compatible HTTP frontend (axum on hyper, HTTP/1).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (SSE streaming ending with
//! `data: [DONE]`, `stream_options.include_usage`, or one JSON response), `GET /v1/models`,
//! `GET /health`, `GET /live`, `GET /metrics`; the unary non-generative surfaces
//! `POST /v1/embeddings`, `/v1/rerank`, `/v1/classify`, `/v1/pooling`, `/v1/images/generations`, `/v1/images/edits`,
//! `/v1/audio/speech`, `/v1/videos`, `/v1/videos/stream` (see [`surfaces`] and
//! `docs/frontend_surfaces.md`). Errors use OpenAI's envelope with 400
//! (malformed JSON, unknown fields, invalid values), 404 (unknown model), 413 (body over
//! the limit), 503 (no workers), 529 (every worker over the KV router's busy thresholds).
//!
//! Models come from a [`ModelManager`] that a [`crate::discovery::ModelWatcher`] keeps in
//! step with the cards workers register. For `ModelInput::Tokens` models the frontend
//! templates and tokenizes ([`crate::preprocessor::Preprocessor`]), sends a
//! [`crate::preprocessor::PreprocessedRequest`] and turns the worker's token stream back
//! into text with the stop conditions applied; `ModelInput::Text` models receive the raw
//! OpenAI body and stream OpenAI chunks back.
//!
//! In-process models ([`StaticModels`]: Python engines added with
//! `add_chat_completions_model`, the echo engine or mocker of `run_input(rt, "http", …)`)
//! are served next to the discovered ones; see [`static_engine`].
//!
//! Cancellation: the response body owns the worker stream, so a client that disconnects
//! drops it, which sends a stop to the worker.

mod embeddings;
pub mod engine;
pub mod error;
pub mod kv_selector;
mod media;
pub mod metrics;
mod openai_routes;
mod rerank;
pub mod static_engine;
mod surfaces;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use dynamo_runtime::{DistributedRuntime, Route};
use tokio::sync::watch;

pub use engine::{
    RequestBooking, RoutedRequest, RouterMode, Selected, SimpleSelector, WorkerSelector,
    WorkerStream,
};
pub use error::HttpError;
pub use metrics::Metrics;
pub use static_engine::{OpenAiEngine, PreCommit, StaticModels, StaticTokenModel};

use crate::discovery::{ModelManager, ModelWatcher};
use crate::error::{Error, Result};

/// Default request body limit (the reference's `DYN_HTTP_BODY_LIMIT_MB`, 192 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 192 * 1024 * 1024;

/// Frontend settings.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Listen address.
    pub host: String,
    /// Listen port (0: any free port).
    pub port: u16,
    /// Worker selection.
    pub router_mode: RouterMode,
    /// Re-dispatches allowed per request when a worker stream breaks.
    pub migration_limit: u32,
    /// Follow only this namespace's models.
    pub namespace: Option<String>,
    /// Largest accepted request body.
    pub body_limit: usize,
    /// KV router configuration (`--router-mode kv`).
    pub kv_router_config: dynamo_kv_router::scheduling::config::KvRouterConfig,
    /// Busy thresholds of the KV router: when every worker is over one, requests are
    /// rejected with 529.
    pub load_thresholds: dynamo_kv_router::scheduling::selector::LoadThresholds,
    /// Streaming responses of static models wait for the engine's first item before
    /// committing the HTTP status (see [`PreCommit`]).
    pub wait_for_first_item: bool,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".into(),
            port: 8080,
            router_mode: RouterMode::RoundRobin,
            migration_limit: 0,
            namespace: None,
            body_limit: body_limit_from_env(),
            kv_router_config: Default::default(),
            load_thresholds: Default::default(),
            wait_for_first_item: false,
        }
    }
}

/// `DYN_HTTP_BODY_LIMIT_MB`, else [`DEFAULT_BODY_LIMIT`].
pub fn body_limit_from_env() -> usize {
    std::env::var("DYN_HTTP_BODY_LIMIT_MB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(DEFAULT_BODY_LIMIT, |mb| mb * 1024 * 1024)
}

/// State shared by the handlers.
pub(crate) struct Shared {
    pub(crate) models: ModelManager,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) selector: Arc<dyn WorkerSelector>,
    pub(crate) migration_limit: u32,
    pub(crate) statics: StaticModels,
    pub(crate) pre_commit: PreCommit,
    /// The runtime whose discovery `/health` reports (absent for a router built without
    /// [`HttpService::run`]).
    pub(crate) runtime: Option<DistributedRuntime>,
}

/// The HTTP service.
pub struct HttpService {
    config: FrontendConfig,
    models: ModelManager,
    statics: StaticModels,
    metrics: Arc<Metrics>,
    selector: std::sync::Mutex<Option<Arc<dyn WorkerSelector>>>,
    stop: watch::Sender<bool>,
    bound: watch::Sender<Option<SocketAddr>>,
}

impl HttpService {
    /// A service with `config` (nothing runs until [`Self::run`]).
    pub fn new(config: FrontendConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            models: ModelManager::new(),
            statics: StaticModels::default(),
            metrics: Arc::new(Metrics::default()),
            selector: std::sync::Mutex::new(None),
            stop: watch::channel(false).0,
            bound: watch::channel(None).0,
        })
    }

    /// The models it serves.
    pub fn models(&self) -> &ModelManager {
        &self.models
    }

    /// Its in-process models (`add_chat_completions_model`, local engines).
    pub fn statics(&self) -> &StaticModels {
        &self.statics
    }

    /// Its metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Install a worker selector (the KV router's hook); replaces the one implied by the
    /// router mode. Takes effect at the next [`Self::run`].
    pub fn set_selector(&self, selector: Arc<dyn WorkerSelector>) {
        *self
            .selector
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(selector);
    }

    /// In KV mode, install the KV router's selector over `runtime` unless a selector was
    /// installed already. [`Self::run`] and the terminal inputs call it before serving.
    pub(crate) fn install_kv_selector(&self, runtime: &DistributedRuntime) {
        let mut installed = self
            .selector
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.config.router_mode == RouterMode::Kv && installed.is_none() {
            *installed = Some(Arc::new(kv_selector::KvSelector::new(
                runtime.clone(),
                self.config.kv_router_config.clone(),
                self.config.load_thresholds,
            )));
        }
    }

    fn selector(&self) -> Arc<dyn WorkerSelector> {
        let installed = self
            .selector
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        installed.unwrap_or_else(|| match self.config.router_mode {
            RouterMode::Random => Arc::new(SimpleSelector(Route::Random)),
            RouterMode::RoundRobin => Arc::new(SimpleSelector(Route::RoundRobin)),
            // `run` installs the KV selector; a router built before `run` (tests, embedding)
            // has no runtime to follow yet.
            RouterMode::Kv => Arc::new(SimpleSelector(Route::RoundRobin)),
        })
    }

    /// The address it listens on, once bound.
    pub async fn local_addr(&self) -> Option<SocketAddr> {
        let mut rx = self.bound.subscribe();
        rx.wait_for(Option::is_some).await.ok().and_then(|a| *a)
    }

    /// The axum router (for embedding or tests).
    pub fn router(&self) -> Router {
        self.router_over(None)
    }

    fn router_over(&self, runtime: Option<DistributedRuntime>) -> Router {
        let shared = Arc::new(Shared {
            runtime,
            models: self.models.clone(),
            metrics: Arc::clone(&self.metrics),
            selector: self.selector(),
            migration_limit: self.config.migration_limit,
            statics: self.statics.clone(),
            pre_commit: PreCommit::from_env(self.config.wait_for_first_item),
        });
        Router::new()
            .route(
                "/v1/chat/completions",
                post(openai_routes::chat_completions),
            )
            .route("/v1/completions", post(openai_routes::completions))
            .route("/v1/embeddings", post(embeddings::embeddings))
            .route("/v1/rerank", post(rerank::rerank))
            .route("/v1/classify", post(rerank::classify))
            .route("/v1/pooling", post(rerank::pooling))
            .route("/v1/images/generations", post(media::images))
            .route("/v1/images/edits", post(media::image_edits))
            .route("/v1/audio/speech", post(media::speech))
            .route("/v1/videos", post(media::videos))
            .route("/v1/videos/stream", post(media::videos_stream))
            .route("/v1/models", get(openai_routes::list_models))
            .route("/health", get(openai_routes::health))
            .route("/live", get(openai_routes::live))
            .route("/metrics", get(openai_routes::metrics))
            .fallback(openai_routes::not_found)
            .layer(DefaultBodyLimit::max(self.config.body_limit))
            .with_state(shared)
    }

    /// Follow the runtime's model cards and serve HTTP until [`Self::shutdown`] or the
    /// runtime stops.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the listener cannot be bound.
    pub async fn run(self: Arc<Self>, runtime: DistributedRuntime) -> Result<()> {
        self.install_kv_selector(&runtime);
        ModelWatcher::start(
            runtime.clone(),
            self.config.namespace.clone(),
            self.models.clone(),
        )
        .await;
        let addr = format!("{}:{}", self.config.host, self.config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::Runtime(format!("cannot listen on {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Runtime(e.to_string()))?;
        tracing::info!(address = %local, "OpenAI frontend listening");
        self.bound.send_replace(Some(local));
        let router = self.router_over(Some(runtime.clone()));
        let mut stop = self.stop.subscribe();
        let shutdown = async move {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                () = runtime.stopped() => {}
            }
        };
        // Small SSE frames must leave at once: without TCP_NODELAY, Nagle plus the client's
        // delayed ACK adds ~40 ms to every short streamed response.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| Error::Runtime(format!("HTTP server failed: {e}")))
    }

    /// Stop serving (idempotent).
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }
}
