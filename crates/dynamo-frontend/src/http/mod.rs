//! The OpenAI-compatible HTTP frontend (axum on hyper, HTTP/1).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (SSE streaming ending with
//! `data: [DONE]`, `stream_options.include_usage`, or one JSON response), `GET /v1/models`,
//! `GET /v1/models/{*model_id}` (a model, or `…/ready`: [`models`]), `GET|POST
//! /busy_threshold` ([`busy`]), `GET /health`, `GET /live`, `GET /metrics`, `GET /v1/realtime` (WebSocket, see
//! [`realtime`]), `GET /openapi.json` (see [`openapi`]: one table registers every route and
//! generates the document); the unary non-generative surfaces `POST /v1/embeddings`,
//! `/v1/rerank`, `/v1/classify`, `/v1/pooling`, `/v1/images/generations`, `/v1/images/edits`,
//! `/v1/audio/speech`, `/v1/videos`, `/v1/videos/stream` (see [`surfaces`] and
//! `docs/design/frontend_surfaces.md`); the agent surfaces on top of chat, `POST /v1/responses`,
//! `/v1/responses/input_tokens` ([`responses`]) and, with `enable_anthropic_api`,
//! `/v1/messages`, `/v1/messages/count_tokens` ([`anthropic`]); plus the embedder's extension routes ([`extensions`]). Errors use OpenAI's envelope with 400
//! (malformed JSON, unknown fields, invalid values, prompts longer than the context), 404
//! (unknown model: code `model_not_found`; unknown route: code `not_found`), 408 (body not
//! received within the body-read timeout), 413 (body over the limit), 415 (a POST body that
//! is not `application/json`), 429 (too many connections from one client), 503 (no
//! workers), 529 (every worker over the KV router's busy thresholds).
//!
//! Limits that keep one client from taking the process down (see `docs/design/reliability.md`):
//! the body limit ([`DEFAULT_BODY_LIMIT`]), the header-read and body-read timeouts
//! ([`DEFAULT_HEADER_READ_TIMEOUT`], [`DEFAULT_BODY_READ_TIMEOUT`]), the per-client
//! connection limit ([`DEFAULT_MAX_CONNECTIONS_PER_IP`]), and prompts refused by length
//! without being tokenised whole ([`dynamo_llm::preprocessor::COUNT_CHUNK_BYTES`]).
//!
//! Models come from a [`ModelManager`] that a [`dynamo_llm::discovery::ModelWatcher`] keeps in
//! step with the cards workers register. For `ModelInput::Tokens` models the frontend
//! templates and tokenizes ([`dynamo_llm::preprocessor::Preprocessor`]), sends a
//! [`dynamo_llm::preprocessor::PreprocessedRequest`] and turns the worker's token stream back
//! into text with the stop conditions applied; `ModelInput::Text` models receive the raw
//! OpenAI body and stream OpenAI chunks back.
//!
//! In-process models ([`StaticModels`]: Python engines added with
//! `add_chat_completions_model`, the echo engine or mocker of `run_input(rt, "http", …)`)
//! are served next to the discovered ones; see [`static_engine`].
//!
//! Cancellation: the response body owns the worker stream, so a client that disconnects
//! drops it, which sends a stop to the worker.

mod anthropic;
pub mod busy;
mod chat_stream;
mod embeddings;
pub mod engine;
pub mod engine_factory;
pub mod error;
pub mod extensions;
pub mod kv_selector;
mod media;
pub mod metrics;
pub mod models;
mod openai_routes;
mod openapi;
mod realtime;
mod request_body;
mod rerank;
mod respond;
mod responses;
mod serve;
pub mod static_engine;
mod surfaces;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use dynamo_llm::discovery::{ModelManager, ModelWatcher};
use dynamo_llm::error::{Error, Result};
use dynamo_runtime::{DistributedRuntime, Route};
use tokio::sync::watch;

pub use engine::{
    RequestBooking, RoutedRequest, RouterMode, Selected, SimpleSelector, WorkerSelector,
    WorkerStream,
};
pub use error::HttpError;
pub use metrics::Metrics;
pub use static_engine::{OpenAiEngine, PreCommit, StaticModels, StaticTokenModel};

/// Default request body limit, `DYN_HTTP_BODY_LIMIT_MB` (the reference's default is 192 MiB).
///
/// 32 MiB holds any text prompt a model can take (a 1M-token context is ~4 MB of text; JSON
/// escaping at most sextuples it) plus a few base64 images, while keeping what one request
/// can make the frontend hold small: the body, one parsed copy of its text and one chunk of
/// tokenisation (a prompt longer than the context is refused before it is tokenised whole).
pub const DEFAULT_BODY_LIMIT: usize = 32 * 1024 * 1024;

/// Default deadline for a request head, `DYN_HTTP_HEADER_TIMEOUT_SECS` (also closes idle
/// keep-alive connections after as long). hyper's default: long enough for any real client,
/// short enough that a slow sender's connection is reclaimed soon.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Default deadline for a whole request body, `DYN_HTTP_BODY_TIMEOUT_SECS`: a body at the
/// default limit arrives in it at ~0.5 MB/s.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Default most open connections per client address, `DYN_HTTP_MAX_CONNECTIONS_PER_IP`
/// (0: no limit). Above the concurrency of common load generators on one host, well under
/// the usual open-file limits.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1024;

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
    /// Deadline for a request head (`None`: none).
    pub header_read_timeout: Option<Duration>,
    /// Deadline for a whole request body (`None`: none).
    pub body_read_timeout: Option<Duration>,
    /// Most open connections per client address (0: no limit).
    pub max_connections_per_ip: usize,
    /// KV router configuration (`--router-mode kv`).
    pub kv_router_config: dynamo_kv_router::scheduling::config::KvRouterConfig,
    /// Busy thresholds of the KV router: when every worker is over one, requests are
    /// rejected with 529.
    pub load_thresholds: dynamo_kv_router::scheduling::selector::LoadThresholds,
    /// Streaming responses of static models wait for the engine's first item before
    /// committing the HTTP status (see [`PreCommit`]).
    pub wait_for_first_item: bool,
    /// Tool-call / reasoning parsers of models whose card names none
    /// (`--dyn-tool-call-parser`, `--dyn-reasoning-parser`).
    pub parsers: dynamo_parsers::ParserNames,
    /// Serve the Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`);
    /// default from `DYN_ENABLE_ANTHROPIC_API`.
    pub enable_anthropic_api: bool,
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
            header_read_timeout: timeout_from_env(
                "DYN_HTTP_HEADER_TIMEOUT_SECS",
                DEFAULT_HEADER_READ_TIMEOUT,
            ),
            body_read_timeout: timeout_from_env(
                "DYN_HTTP_BODY_TIMEOUT_SECS",
                DEFAULT_BODY_READ_TIMEOUT,
            ),
            max_connections_per_ip: std::env::var("DYN_HTTP_MAX_CONNECTIONS_PER_IP")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_IP),
            kv_router_config: Default::default(),
            load_thresholds: Default::default(),
            wait_for_first_item: false,
            parsers: Default::default(),
            enable_anthropic_api: anthropic_api_from_env(),
        }
    }
}

/// `DYN_ENABLE_ANTHROPIC_API` (`1`/`true`/`yes`/`on`, any case), else off.
pub fn anthropic_api_from_env() -> bool {
    std::env::var("DYN_ENABLE_ANTHROPIC_API").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// `DYN_HTTP_BODY_LIMIT_MB`, else [`DEFAULT_BODY_LIMIT`].
pub fn body_limit_from_env() -> usize {
    std::env::var("DYN_HTTP_BODY_LIMIT_MB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(DEFAULT_BODY_LIMIT, |mb| mb * 1024 * 1024)
}

/// A timeout in seconds from `var` (fractions allowed; 0: none), else `default`.
fn timeout_from_env(var: &str, default: Duration) -> Option<Duration> {
    match std::env::var(var).ok().map(|v| v.trim().parse::<f64>()) {
        Some(Ok(0.0)) => None,
        Some(Ok(secs)) if secs.is_finite() && secs > 0.0 => Some(Duration::from_secs_f64(secs)),
        _ => Some(default),
    }
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
    pub(crate) body_limit: usize,
    pub(crate) body_read_timeout: Option<Duration>,
    /// Per-model busy thresholds (`/busy_threshold`).
    pub(crate) busy: Arc<busy::BusyThresholds>,
    /// The frontend's default parsers (see [`FrontendConfig::parsers`]).
    pub(crate) parsers: dynamo_parsers::ParserNames,
    /// The Anthropic Messages API is served.
    pub(crate) anthropic_api: bool,
}

impl Shared {
    pub(crate) fn view(&self) -> models::ModelView {
        models::ModelView {
            models: self.models.clone(),
            statics: self.statics.clone(),
        }
    }
}

/// `value` as a JSON response with `status`.
pub(crate) fn json_status(
    status: axum::http::StatusCode,
    value: &impl serde::Serialize,
) -> axum::response::Response {
    let mut response = respond::json_response(value);
    *response.status_mut() = status;
    response
}

/// The built-in `GET` paths (extension routes may not take them), from the route table.
pub fn builtin_get_paths() -> Vec<&'static str> {
    openapi::routes()
        .iter()
        .filter(|r| r.method == axum::http::Method::GET)
        .map(|r| r.path)
        .collect()
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
    busy: Arc<busy::BusyThresholds>,
    extensions: std::sync::Mutex<Vec<extensions::ExtensionRoute>>,
    chat_engine_factory: std::sync::Mutex<Option<Arc<dyn engine_factory::ChatEngineFactory>>>,
}

impl HttpService {
    /// A service with `config` (nothing runs until [`Self::run`]).
    pub fn new(config: FrontendConfig) -> Arc<Self> {
        Arc::new(Self {
            models: ModelManager::new(),
            statics: StaticModels::default(),
            metrics: Arc::new(Metrics::default()),
            selector: std::sync::Mutex::new(None),
            stop: watch::channel(false).0,
            bound: watch::channel(None).0,
            busy: busy::BusyThresholds::new(config.load_thresholds),
            extensions: std::sync::Mutex::new(Vec::new()),
            chat_engine_factory: std::sync::Mutex::new(None),
            config,
        })
    }

    /// The per-model busy thresholds (`GET|POST /busy_threshold`).
    pub fn busy_thresholds(&self) -> &Arc<busy::BusyThresholds> {
        &self.busy
    }

    /// Serve `routes` next to the built-in ones (from the next [`Self::run`]).
    ///
    /// # Errors
    /// [`extensions::RouteError`] when two routes share a path (including ones added
    /// before) or one takes a built-in `GET` path; nothing is added then.
    pub fn add_extension_routes(
        &self,
        routes: Vec<extensions::ExtensionRoute>,
    ) -> std::result::Result<(), extensions::RouteError> {
        let mut installed = self
            .extensions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all = installed.clone();
        all.extend(routes);
        extensions::check_routes(&all, &builtin_get_paths())?;
        *installed = all;
        Ok(())
    }

    /// Build each discovered chat token model's chat engine with `factory` (see
    /// [`engine_factory`]); takes effect at the next [`Self::run`].
    pub fn set_chat_engine_factory(&self, factory: Arc<dyn engine_factory::ChatEngineFactory>) {
        *self
            .chat_engine_factory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(factory);
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
            let selector = Arc::new(kv_selector::KvSelector::with_busy(
                runtime.clone(),
                self.config.kv_router_config.clone(),
                Arc::clone(&self.busy),
            ));
            selector.follow(&self.models);
            *installed = Some(selector);
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
            body_limit: self.config.body_limit,
            body_read_timeout: self.config.body_read_timeout,
            busy: Arc::clone(&self.busy),
            parsers: self.config.parsers.clone(),
            anthropic_api: self.config.enable_anthropic_api,
        });
        let context = extensions::ExtensionContext {
            view: shared.view(),
            stop: self.stop.subscribe(),
            runtime: shared.runtime.clone(),
        };
        // Extension routes first (they may share a path with a built-in route of another
        // method); every built-in route comes from the one table that also writes
        // `/openapi.json`.
        let extensions = self
            .extensions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let router = extensions::register(Router::new(), &extensions, &context);
        let table = openapi::routes_with(self.config.enable_anthropic_api);
        openapi::register(router, table)
            .method_not_allowed_fallback(openai_routes::method_not_allowed)
            .fallback(openai_routes::not_found)
            .layer(DefaultBodyLimit::max(self.config.body_limit))
            .with_state(shared)
    }

    /// Follow the runtime's model cards and serve HTTP until [`Self::shutdown`] or the
    /// runtime stops.
    ///
    /// # Errors
    /// [`Error::Listen`](dynamo_llm::Error::Listen) when the listener cannot be bound.
    pub async fn run(self: Arc<Self>, runtime: DistributedRuntime) -> Result<()> {
        // Bind first: a taken port fails at once, before anything else starts. Connections
        // wait in the backlog until the first discovery round is in (below).
        let addr = format!("{}:{}", self.config.host, self.config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::listen(&addr, &e))?;
        self.install_kv_selector(&runtime);
        ModelWatcher::start(
            runtime.clone(),
            self.config.namespace.clone(),
            self.models.clone(),
        )
        .await;
        let factory = self
            .chat_engine_factory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(factory) = factory {
            let mut stop = self.stop.subscribe();
            let rt = runtime.clone();
            tokio::spawn(engine_factory::follow(
                self.models.clone(),
                self.statics.clone(),
                factory,
                self.selector(),
                Arc::clone(&self.metrics),
                self.config.migration_limit,
                async move {
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => {}
                        () = rt.stopped() => {}
                    }
                },
            ));
        }
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
        let limits = serve::ConnLimits {
            header_read_timeout: self.config.header_read_timeout,
            max_connections_per_ip: self.config.max_connections_per_ip,
        };
        serve::serve(listener, router, limits, shutdown).await;
        Ok(())
    }

    /// Stop serving (idempotent).
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }
}
