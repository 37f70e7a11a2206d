//! Chat engines built by the embedder per discovered model (`chat_engine_factory`).
//!
//! With a [`ChatEngineFactory`] installed ([`super::HttpService::set_chat_engine_factory`]),
//! each discovered `ModelInput::Tokens` chat model gets its chat completions from the
//! engine the factory returns instead of the built-in preprocessor: the factory is called
//! once per model (not per instance, as the reference), with the identity of the first
//! instance seen, the model's card and a [`RoutedEngine`] that sends preprocessed requests
//! to the model's workers through the frontend's router (round-robin, random or KV, with
//! the frontend's migration limit), yielding the workers' raw [`LLMEngineOutput`]s.
//! Completions and the other surfaces keep the built-in pipeline.
//!
//! The engine is served as an in-process chat model under the model's name and aliases
//! (in-process models shadow discovered ones). Requests that arrive while the factory runs
//! wait for it. A factory that fails is logged, the model's chat requests answer 503 with
//! its message, and the factory is called again after 1 s, 2 s, 4 s ... (at most 30 s
//! apart) until it succeeds or the model goes away. When the model's last worker goes, the
//! engine is dropped; a model that comes back gets a fresh factory call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use dynamo_llm::discovery::{ModelEntry, ModelManager};
use dynamo_llm::model_card::ModelDeploymentCard;
use dynamo_llm::preprocessor::PreprocessedRequest;
use dynamo_runtime::{Context, EndpointId};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use tokio::sync::watch;

use super::WorkerStream;
use super::engine::WorkerSelector;
use super::error::HttpError;
use super::metrics::Metrics;
use super::static_engine::{ChunkStream, OpenAiEngine, StaticModels};

/// Longest wait between two calls of a failing factory.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Sends preprocessed requests of one model to its workers through the frontend's router.
#[derive(Clone)]
pub struct RoutedEngine {
    model: Arc<ModelEntry>,
    selector: Arc<dyn WorkerSelector>,
    metrics: Arc<Metrics>,
    migration_limit: u32,
}

impl RoutedEngine {
    /// The router of `model`'s workers.
    pub fn new(
        model: Arc<ModelEntry>,
        selector: Arc<dyn WorkerSelector>,
        metrics: Arc<Metrics>,
        migration_limit: u32,
    ) -> Self {
        Self {
            model,
            selector,
            metrics,
            migration_limit,
        }
    }

    /// The model it routes to.
    pub fn model(&self) -> &Arc<ModelEntry> {
        &self.model
    }

    /// Route `request` to a worker (booking its load in KV mode) and return the worker's
    /// stream; stopping `context` stops the worker.
    ///
    /// # Errors
    /// 503 when no worker is available, 529 when all are busy, 500 for other failures.
    pub async fn generate(
        &self,
        request: PreprocessedRequest,
        context: Context,
    ) -> Result<WorkerStream, HttpError> {
        WorkerStream::open(
            Arc::clone(&self.model),
            Arc::clone(&self.selector),
            Arc::clone(&self.metrics),
            request,
            context,
            self.migration_limit,
        )
        .await
    }
}

/// A `PreprocessedRequest` from its JSON form (a Python dict).
///
/// # Errors
/// A message naming the offending field (`token_ids: invalid type: ...`).
pub fn parse_preprocessed(value: serde_json::Value) -> Result<PreprocessedRequest, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        }
    })
}

/// What a factory is called with.
pub struct FactoryRequest {
    /// The endpoint the model's workers serve.
    pub endpoint: EndpointId,
    /// The first instance seen serving it (0 when none is listed yet).
    pub instance_id: u64,
    /// The model's card.
    pub card: ModelDeploymentCard,
    /// The model's router.
    pub routed: RoutedEngine,
}

/// Builds the chat engine of a discovered model.
pub trait ChatEngineFactory: Send + Sync + 'static {
    /// The engine serving `request.card`'s chat completions, or why there is none.
    fn create(
        &self,
        request: FactoryRequest,
    ) -> BoxFuture<'static, Result<Arc<dyn OpenAiEngine>, String>>;
}

/// A factory's outcome so far.
#[derive(Clone)]
enum Built {
    Pending,
    Ready(Arc<dyn OpenAiEngine>),
    Failed(String),
}

/// The chat model served for a discovered model: waits for its factory, then delegates.
struct FactoryEngine {
    state: watch::Receiver<Built>,
}

impl OpenAiEngine for FactoryEngine {
    fn generate(&self, request: Bytes, context: Context) -> ChunkStream {
        let mut state = self.state.clone();
        let engine = async move {
            let built = match state.wait_for(|b| !matches!(b, Built::Pending)).await {
                Ok(b) => b.clone(),
                Err(_) => Built::Failed("the model is no longer served".into()),
            };
            match built {
                Built::Ready(engine) => engine.generate(request, context),
                Built::Failed(message) => futures_util::stream::once(async move {
                    Err::<Bytes, HttpError>(HttpError::unavailable(message))
                })
                .boxed(),
                Built::Pending => futures_util::stream::empty().boxed(),
            }
        };
        futures_util::stream::once(engine).flatten().boxed()
    }
}

/// One model's served engine and the task running its factory.
struct Served {
    entry: Arc<ModelEntry>,
    names: Vec<String>,
    task: tokio::task::JoinHandle<()>,
}

/// Follow `models` until `stop` resolves: call `factory` for each new chat token model and
/// serve its engine in `statics`; drop it when the model goes.
pub(crate) async fn follow(
    models: ModelManager,
    statics: StaticModels,
    factory: Arc<dyn ChatEngineFactory>,
    selector: Arc<dyn WorkerSelector>,
    metrics: Arc<Metrics>,
    migration_limit: u32,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut changes = models.subscribe();
    let mut served: HashMap<String, Served> = HashMap::new();
    tokio::pin!(stop);
    loop {
        changes.mark_unchanged();
        let live: HashMap<String, Arc<ModelEntry>> = models
            .list()
            .into_iter()
            .filter(|e| e.is_tokens() && e.card.model_type.supports_chat())
            .map(|e| (e.name.clone(), e))
            .collect();
        served.retain(|name, s| {
            let keep = live.get(name).is_some_and(|e| Arc::ptr_eq(e, &s.entry));
            if !keep {
                s.task.abort();
                for n in &s.names {
                    statics.remove_chat(n);
                }
                tracing::info!(model = %name, "chat engine of the factory dropped");
            }
            keep
        });
        for (name, entry) in live {
            if served.contains_key(&name) {
                continue;
            }
            let (tx, rx) = watch::channel(Built::Pending);
            let mut names = vec![name.clone()];
            names.extend(entry.card.model_aliases.iter().cloned());
            let engine: Arc<dyn OpenAiEngine> = Arc::new(FactoryEngine { state: rx });
            for n in &names {
                statics.add_chat(n, Arc::clone(&engine));
            }
            let routed = RoutedEngine::new(
                Arc::clone(&entry),
                Arc::clone(&selector),
                Arc::clone(&metrics),
                migration_limit,
            );
            let task = tokio::spawn(build(Arc::clone(&factory), routed, tx));
            served.insert(name, Served { entry, names, task });
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { break },
            () = &mut stop => break,
        }
    }
    for s in served.into_values() {
        s.task.abort();
        for n in &s.names {
            statics.remove_chat(n);
        }
    }
}

/// Call the factory until it succeeds, publishing each outcome.
async fn build(
    factory: Arc<dyn ChatEngineFactory>,
    routed: RoutedEngine,
    tx: watch::Sender<Built>,
) {
    let entry = Arc::clone(routed.model());
    let mut delay = Duration::from_secs(1);
    loop {
        let instance_id = entry.serving_instances().first().copied().unwrap_or(0);
        tracing::info!(model = %entry.name, endpoint = %entry.endpoint, instance_id, "calling chat_engine_factory");
        let request = FactoryRequest {
            endpoint: entry.endpoint.clone(),
            instance_id,
            card: entry.card.clone(),
            routed: routed.clone(),
        };
        match factory.create(request).await {
            Ok(engine) => {
                tracing::info!(model = %entry.name, "chat engine of the factory ready");
                tx.send_replace(Built::Ready(engine));
                return;
            }
            Err(e) => {
                let message = format!("chat_engine_factory failed for model {:?}: {e}", entry.name);
                tracing::error!(model = %entry.name, error = %e, retry_in_secs = delay.as_secs(), "chat_engine_factory failed; the model's chat requests answer 503 until it succeeds");
                tx.send_replace(Built::Failed(message));
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}
