//! Model cards in discovery: workers publish, frontends follow.
//!
//! A worker's [`register_model`] stores its [`ModelDeploymentCard`] in the runtime's
//! key-value store at `v1/mdc/{ns}/{component}/{endpoint}/{instance_id:x}` (a LoRA adapter
//! adds `/{lora_slug}`), next to the instance key. The key belongs to the worker process,
//! so it disappears with it: deleted on shutdown, expired by the store's lease/TTL when the
//! process dies.
//!
//! A frontend's [`ModelWatcher`] re-lists `v1/mdc/` whenever the store reports a change and
//! keeps a [`ModelManager`] in step: a model appears with its first card and disappears
//! with its last one. Invariant: every name in the manager has at least one live card; the
//! first card seen for a name fixes its endpoint and preprocessing (later cards of other
//! endpoints under the same name are counted but routed to the first endpoint's workers).
//!
//! Every [`ModelEntry::serving`] lists the instances whose card for that model is live,
//! refreshed on every discovery round: a request for a model goes only to those
//! ([`ModelEntry::restrict_route`]; the KV router avoids the others), so two models whose
//! workers share an endpoint never answer each other's requests (a worker registering on
//! such an endpoint logs a warning naming both).
//!
//! LoRA adapters: an adapter card (`register_model(..., lora_name=...)`) is served under
//! the adapter's name by the instances that loaded it, with the served name of their base
//! model as `parent` in `/v1/models`. Requests for an adapter carry `routing.lora_name`
//! and are KV-routed with the adapter mixed into the block hashes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use dynamo_runtime::{Client, DistributedRuntime, EndpointId, Route};

use crate::error::{Error, Result};
use crate::model_card::{ModelDeploymentCard, ModelInput, slugify};
use crate::preprocessor::Preprocessor;

/// Prefix of every model card key.
pub const MDC_ROOT: &str = "v1/mdc/";

/// The key of the card of `endpoint` served by `instance_id` (plus a LoRA adapter).
pub fn card_key(endpoint: &EndpointId, instance_id: u64, lora_name: Option<&str>) -> String {
    let base = format!(
        "{MDC_ROOT}{}/{}/{}/{instance_id:x}",
        endpoint.namespace, endpoint.component, endpoint.name
    );
    match lora_name {
        Some(l) => format!("{base}/{}", slugify(l)),
        None => base,
    }
}

fn runtime_err(e: dynamo_runtime::Error) -> Error {
    Error::Runtime(e.to_string())
}

/// Publish `card` for this process's instance of `endpoint`.
///
/// # Errors
/// [`Error::Runtime`] when the store fails.
pub async fn register_model(
    runtime: &DistributedRuntime,
    endpoint: &EndpointId,
    card: &ModelDeploymentCard,
) -> Result<()> {
    let lora = card.lora.as_ref().map(|l| l.name.as_str());
    let key = card_key(endpoint, runtime.connection_id(), lora);
    let json = card.to_json_str()?;
    if lora.is_none() {
        warn_if_endpoint_shared(runtime, endpoint, card).await;
    }
    runtime
        .kv_store()
        .put(&key, &json)
        .await
        .map_err(runtime_err)?;
    match lora {
        None => tracing::info!(
            model = %card.display_name,
            endpoint = %endpoint,
            instance_id = runtime.connection_id(),
            "model registered"
        ),
        Some(adapter) => tracing::info!(
            adapter,
            endpoint = %endpoint,
            instance_id = runtime.connection_id(),
            "LoRA adapter registered"
        ),
    }
    Ok(())
}

/// Log a warning when other instances of `endpoint` serve a base model other than
/// `card`'s: requests are kept apart by model (each goes only to instances that registered
/// it), but two models on one endpoint is usually a copy-pasted endpoint name.
async fn warn_if_endpoint_shared(
    runtime: &DistributedRuntime,
    endpoint: &EndpointId,
    card: &ModelDeploymentCard,
) {
    let prefix = format!(
        "{MDC_ROOT}{}/{}/{}/",
        endpoint.namespace, endpoint.component, endpoint.name
    );
    let Ok(cards) = runtime.kv_store().list(&prefix).await else {
        return;
    };
    let own = runtime.connection_id();
    let others: BTreeSet<String> = cards
        .iter()
        .filter_map(|(k, json)| {
            // Base cards of other instances only (adapter cards add a `/{slug}` level).
            let id = u64::from_str_radix(k.strip_prefix(&prefix)?, 16).ok()?;
            let other = ModelDeploymentCard::from_json_str(json).ok()?;
            (id != own && other.display_name != card.display_name).then_some(other.display_name)
        })
        .collect();
    if !others.is_empty() {
        tracing::warn!(
            model = %card.display_name,
            other_models = ?others,
            endpoint = %endpoint,
            "registering model {:?} on endpoint {endpoint}, whose other instances serve {:?}; \
             requests for each model go only to the instances that registered it (give each \
             model its own endpoint to avoid surprises)",
            card.display_name,
            others,
        );
    }
}

/// Remove this process's base card (or its LoRA adapter card) for `endpoint`.
///
/// # Errors
/// [`Error::Runtime`] when the store fails.
pub async fn unregister_model(
    runtime: &DistributedRuntime,
    endpoint: &EndpointId,
    lora_name: Option<&str>,
) -> Result<()> {
    let key = card_key(endpoint, runtime.connection_id(), lora_name);
    runtime.kv_store().delete(&key).await.map_err(runtime_err)
}

/// Replace the caller-managed taints of this process's base card for `endpoint`.
///
/// # Errors
/// [`Error::InvalidConfig`] for reserved taints or when no card is registered here;
/// [`Error::Runtime`] when the store fails.
pub async fn update_model_taints(
    runtime: &DistributedRuntime,
    endpoint: &EndpointId,
    taints: BTreeSet<String>,
) -> Result<()> {
    crate::model_card::ModelRuntimeConfig::check_taints(taints.iter())?;
    let key = card_key(endpoint, runtime.connection_id(), None);
    let store = runtime.kv_store();
    let found = store
        .list(&key)
        .await
        .map_err(runtime_err)?
        .into_iter()
        .find(|(k, _)| *k == key);
    let Some((_, json)) = found else {
        return Err(Error::InvalidConfig {
            field: "endpoint".into(),
            reason: format!("no model is registered on {endpoint} by this worker"),
        });
    };
    let mut card = ModelDeploymentCard::from_json_str(&json)?;
    card.runtime_config.taints = taints;
    store
        .put(&key, &card.to_json_str()?)
        .await
        .map_err(runtime_err)
}

/// The live instances of `client`'s endpoint whose base model card has
/// `runtime_config.runtime_data[key] == value`, sorted.
///
/// # Errors
/// [`Error::Runtime`] when the store fails.
pub async fn instances_by_runtime_data(
    client: &Client,
    key: &str,
    value: &serde_json::Value,
) -> Result<Vec<u64>> {
    let ep = client.endpoint();
    let prefix = format!("{MDC_ROOT}{}/{}/{}/", ep.namespace, ep.component, ep.name);
    let live: BTreeSet<u64> = client.instance_ids().into_iter().collect();
    let cards = client
        .runtime()
        .kv_store()
        .list(&prefix)
        .await
        .map_err(runtime_err)?;
    let mut ids: Vec<u64> = cards
        .iter()
        .filter_map(|(k, json)| {
            // Base cards only: LoRA adapter cards add a `/{slug}` level.
            let id = u64::from_str_radix(k.strip_prefix(&prefix)?, 16).ok()?;
            let card = ModelDeploymentCard::from_json_str(json).ok()?;
            (live.contains(&id) && card.runtime_config.runtime_data_matches(key, value))
                .then_some(id)
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// How often [`wait_for_instance_by_runtime_data`] re-checks when no change was notified
/// (a safety net: card and instance changes wake it at once).
const RUNTIME_DATA_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Wait until exactly one live instance of `client`'s endpoint has a model card whose
/// `runtime_config.runtime_data[key]` is the JSON string `value`, and return its id.
///
/// # Errors
/// [`Error::Timeout`] after `timeout` (naming how many instances matched last, and which);
/// [`Error::Runtime`] when the store fails or the runtime stops.
pub async fn wait_for_instance_by_runtime_data(
    client: &Client,
    key: &str,
    value: &str,
    timeout: Option<std::time::Duration>,
) -> Result<u64> {
    let want = serde_json::Value::String(value.to_owned());
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let runtime = client.runtime().clone();
    let mut changes = runtime.kv_store().changes();
    let mut instances = client.watch_instances();
    loop {
        changes.mark_unchanged();
        instances.mark_unchanged();
        let ids = instances_by_runtime_data(client, key, &want).await?;
        if let [id] = ids.as_slice() {
            return Ok(*id);
        }
        let now = tokio::time::Instant::now();
        let wake = match deadline {
            Some(d) if d <= now => {
                // `last_match_count=` and `matching_ids=` as in the reference's message.
                return Err(Error::Timeout(format!(
                    "waiting for one instance of {} with runtime_data[{key:?}] == {want} \
                     after {:?}; last_match_count={}, matching_ids={ids:?}",
                    client.endpoint(),
                    timeout.unwrap_or_default(),
                    ids.len()
                )));
            }
            Some(d) => d.min(now + RUNTIME_DATA_POLL),
            None => now + RUNTIME_DATA_POLL,
        };
        tokio::select! {
            _ = changes.changed() => {}
            _ = instances.changed() => {}
            () = tokio::time::sleep_until(wake) => {}
            () = runtime.stopped() => return Err(Error::Runtime("the runtime is shutting down".into())),
        }
    }
}

/// A served model as the frontend sees it.
pub struct ModelEntry {
    /// Served name.
    pub name: String,
    /// The first card seen.
    pub card: ModelDeploymentCard,
    /// The endpoint its workers serve.
    pub endpoint: EndpointId,
    /// Client of that endpoint (follows its instances).
    pub client: Client,
    /// For `ModelInput::Tokens` models: template, tokenizer and stop handling.
    pub preprocessor: Option<Preprocessor>,
    /// Unix seconds when the model appeared.
    pub created: u64,
    /// The instances of `endpoint` that registered this model (for a LoRA adapter: that
    /// have it loaded), as of the last discovery round. Other workers may serve the same
    /// endpoint for another model; requests for this one never reach them.
    pub serving: ModelServing,
}

/// The instances serving one model, as of the last discovery round.
#[derive(Debug, Default)]
pub struct ModelServing {
    state: RwLock<ServingState>,
    /// Round-robin cursor over the serving instances (used only when the endpoint is
    /// shared with other models or adapters).
    next: AtomicUsize,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct ServingState {
    /// For a LoRA adapter: the served name of its base model.
    parent: Option<String>,
    instances: BTreeSet<u64>,
}

impl ModelServing {
    /// Serving `instances`; `parent` is the base model's served name for an adapter.
    pub fn new(parent: Option<String>, instances: BTreeSet<u64>) -> Self {
        Self {
            state: RwLock::new(ServingState { parent, instances }),
            next: AtomicUsize::new(0),
        }
    }

    /// Replace the serving set (each discovery round does).
    pub fn set(&self, parent: Option<String>, instances: BTreeSet<u64>) {
        *self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            ServingState { parent, instances };
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ServingState> {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ModelEntry {
    /// Whether the frontend tokenizes for this model.
    pub fn is_tokens(&self) -> bool {
        self.card.model_input == ModelInput::Tokens
    }

    /// The adapter name, for a LoRA adapter.
    pub fn lora_name(&self) -> Option<&str> {
        self.card.lora.as_ref().map(|l| l.name.as_str())
    }

    /// For a LoRA adapter: the served name of the base model it is loaded on.
    pub fn parent(&self) -> Option<String> {
        self.card.lora.as_ref()?;
        self.serving.read().parent.clone()
    }

    /// The endpoint's live instances split into those that registered this model and the
    /// others (workers of another model or adapter on the same endpoint, or not
    /// registered yet; none in the usual case of one model per endpoint).
    fn split_live(&self) -> (Vec<u64>, Vec<u64>) {
        let live = self.client.instance_ids();
        let state = self.serving.read();
        live.into_iter()
            .partition(|id| state.instances.contains(id))
    }

    /// The live instances that may serve this model: those that registered it.
    pub fn serving_instances(&self) -> Vec<u64> {
        self.split_live().0
    }

    /// The endpoint's live instances that do not serve this model (see
    /// [`Self::serving_instances`]). Empty in the usual case of one model per endpoint.
    pub fn not_serving_instances(&self) -> Vec<u64> {
        self.split_live().1
    }

    /// `route` (a selector's answer) narrowed to the instances serving this model: kept
    /// when every live instance of the endpoint serves it (the usual case) or when it
    /// already names a serving one; otherwise a serving instance, round-robin, preferring
    /// those not in `avoid` (instances the request failed on) and not known down.
    ///
    /// # Errors
    /// A message for the client when no live instance serves the model.
    pub fn restrict_route(
        &self,
        route: Route,
        avoid: &[u64],
    ) -> std::result::Result<Route, String> {
        let (serving, others) = self.split_live();
        if others.is_empty() {
            return Ok(route);
        }
        if let Route::Direct(id) = route
            && serving.contains(&id)
        {
            return Ok(route);
        }
        let down = self.client.down_instance_ids();
        let preferred: Vec<u64> = serving
            .iter()
            .copied()
            .filter(|id| !avoid.contains(id) && !down.contains(id))
            .collect();
        let pool = if preferred.is_empty() {
            &serving
        } else {
            &preferred
        };
        if pool.is_empty() {
            return Err(match self.lora_name() {
                Some(lora) => format!("no live worker has LoRA adapter {lora:?} loaded"),
                None => format!(
                    "no live worker of {} serves model {:?} (its other workers serve other \
                     models)",
                    self.endpoint, self.name
                ),
            });
        }
        let i = self.serving.next.fetch_add(1, Ordering::Relaxed) % pool.len();
        Ok(Route::Direct(pool[i]))
    }
}

/// Models by served name (cheap to clone).
#[derive(Clone)]
pub struct ModelManager {
    inner: Arc<RwLock<HashMap<String, Arc<ModelEntry>>>>,
    /// Bumped on every change of the set (see [`Self::subscribe`]).
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    /// Called for each new model before it is announced ([`Self::before_announce`]).
    prepare: Arc<RwLock<Option<PrepareModel>>>,
}

/// What must be ready for a model before requests can name it (see
/// [`ModelManager::before_announce`]).
pub type PrepareModel =
    Arc<dyn Fn(Arc<ModelEntry>) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

impl Default for ModelManager {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            generation: Arc::new(tokio::sync::watch::channel(0).0),
            prepare: Arc::default(),
        }
    }
}

impl ModelManager {
    /// An empty manager.
    pub fn new() -> Self {
        Self::default()
    }

    /// Have the watcher await `prepare(model)` for each new model before announcing it
    /// (bounded by the same wait as its first instance): e.g. the KV router subscribing to
    /// the model's KV events, which the first request's prefill already publishes.
    pub fn before_announce(&self, prepare: PrepareModel) {
        *self
            .prepare
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(prepare);
    }

    /// A receiver that sees a new value whenever models are added or removed.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The model served under `name` (or one of its aliases).
    pub fn get(&self, name: &str) -> Option<Arc<ModelEntry>> {
        let map = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(name).cloned().or_else(|| {
            map.values()
                .find(|e| e.card.model_aliases.iter().any(|a| a == name))
                .cloned()
        })
    }

    /// All models, sorted by name.
    pub fn list(&self) -> Vec<Arc<ModelEntry>> {
        let map = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v: Vec<_> = map.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    fn replace(&self, models: HashMap<String, Arc<ModelEntry>>) {
        *self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = models;
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }
}

fn endpoint_of_key(key: &str) -> Option<EndpointId> {
    let rest = key.strip_prefix(MDC_ROOT)?;
    let mut parts = rest.split('/');
    let (ns, comp, ep) = (parts.next()?, parts.next()?, parts.next()?);
    EndpointId::parse(&format!("{ns}.{comp}.{ep}")).ok()
}

/// The instance id of a card key (`.../{endpoint}/{instance_id:x}[/{lora_slug}]`).
fn instance_of_key(key: &str) -> Option<u64> {
    let hex = key.strip_prefix(MDC_ROOT)?.split('/').nth(3)?;
    u64::from_str_radix(hex, 16).ok()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long a new model's announcement waits for its client to see a first instance.
const FIRST_INSTANCE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Follows model cards in discovery and keeps a [`ModelManager`] up to date.
pub struct ModelWatcher;

impl ModelWatcher {
    /// Start following cards (of `namespace` only, when given) until the runtime stops.
    /// Must be called inside the tokio runtime. Resolves after the first listing, so the
    /// models registered before the call are known when it returns.
    pub async fn start(
        runtime: DistributedRuntime,
        namespace: Option<String>,
        manager: ModelManager,
    ) {
        let mut state = WatchState::default();
        let store = Arc::clone(runtime.kv_store());
        let mut changes = store.changes();
        changes.mark_unchanged();
        state.sync(&runtime, namespace.as_deref(), &manager).await;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = changes.changed() => if r.is_err() { break },
                    () = runtime.stopped() => break,
                    // Safety net, as the instance watches: a missed notification costs at
                    // most this much staleness.
                    () = tokio::time::sleep(dynamo_runtime::discovery::RELIST_INTERVAL) => {}
                }
                changes.mark_unchanged();
                state.sync(&runtime, namespace.as_deref(), &manager).await;
            }
        });
    }
}

#[derive(Default)]
struct WatchState {
    /// Cards by key (the raw JSON, to skip unchanged ones).
    cards: BTreeMap<String, String>,
    models: HashMap<String, Arc<ModelEntry>>,
}

impl WatchState {
    async fn sync(
        &mut self,
        runtime: &DistributedRuntime,
        namespace: Option<&str>,
        manager: &ModelManager,
    ) {
        let listed = match runtime.kv_store().list(MDC_ROOT).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "model card listing failed");
                return;
            }
        };
        let listed: BTreeMap<String, String> = listed
            .into_iter()
            .filter(|(k, _)| {
                namespace.is_none_or(|ns| k[MDC_ROOT.len()..].starts_with(&format!("{ns}/")))
            })
            .collect();
        if listed == self.cards {
            return;
        }
        // Cards still live, grouped by model name.
        let mut live: HashMap<String, Vec<(EndpointId, ModelDeploymentCard)>> = HashMap::new();
        // Per model name and endpoint: the instances with a card (adapters' serving sets).
        let mut instances: HashMap<(String, EndpointId), BTreeSet<u64>> = HashMap::new();
        // The served name of each instance's base model (adapters' `parent`).
        let mut base_names: HashMap<(EndpointId, u64), String> = HashMap::new();
        for (key, json) in &listed {
            let Some(ep) = endpoint_of_key(key) else {
                continue;
            };
            match ModelDeploymentCard::from_json_str(json) {
                Ok(card) if card.model_type.has_openai_surface() => {
                    if let Some(id) = instance_of_key(key) {
                        instances
                            .entry((card.display_name.clone(), ep.clone()))
                            .or_default()
                            .insert(id);
                        if card.lora.is_none() {
                            base_names.insert((ep.clone(), id), card.display_name.clone());
                        }
                    }
                    live.entry(card.display_name.clone())
                        .or_default()
                        .push((ep, card));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(%key, error = %e, "ignoring malformed model card"),
            }
        }
        // A model's serving instances on `endpoint` and, for an adapter, the base model of
        // the first of them.
        let serving = |name: &str, endpoint: &EndpointId| {
            let ids = instances
                .get(&(name.to_owned(), endpoint.clone()))
                .cloned()
                .unwrap_or_default();
            let parent = ids
                .iter()
                .find_map(|id| base_names.get(&(endpoint.clone(), *id)).cloned());
            (parent, ids)
        };
        let mut models = HashMap::new();
        let mut added: Vec<Client> = Vec::new();
        let mut new_entries: Vec<Arc<ModelEntry>> = Vec::new();
        for (name, cards) in live {
            if let Some(existing) = self.models.get(&name)
                && cards.iter().any(|(ep, _)| *ep == existing.endpoint)
            {
                let (parent, ids) = serving(&name, &existing.endpoint);
                existing.serving.set(parent, ids);
                models.insert(name, Arc::clone(existing));
                continue;
            }
            let (endpoint, card) = cards.into_iter().next().expect("non-empty group");
            let preprocessor = if card.model_input == ModelInput::Tokens {
                match Preprocessor::from_card(&card) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        tracing::warn!(model = %name, error = %e, "cannot load the model's tokenizer; model not served");
                        continue;
                    }
                }
            } else {
                None
            };
            tracing::info!(model = %name, endpoint = %endpoint, "model added");
            let (parent, ids) = serving(&name, &endpoint);
            let serving = ModelServing::new(card.lora.is_some().then_some(parent).flatten(), ids);
            let client = runtime.client(&endpoint);
            added.push(client.clone());
            let entry = Arc::new(ModelEntry {
                name: name.clone(),
                card,
                endpoint,
                client,
                preprocessor,
                created: now_secs(),
                serving,
            });
            new_entries.push(Arc::clone(&entry));
            models.insert(name, entry);
        }
        for name in self.models.keys() {
            if !models.contains_key(name) {
                tracing::info!(model = %name, "model removed");
            }
        }
        // A new client's instance list fills from its own discovery watch, a moment after
        // the card was read here: announcing the model before that would answer the first
        // request after `/v1/models` lists it with a 503 ("no instances"). Wait, bounded,
        // for each new model's first instance (a card without a live instance is announced
        // when the wait runs out, as before).
        // Then what the frontend prepares for a new model (its KV router's subscription),
        // so that the first request finds it in place.
        if !added.is_empty() {
            let first_instances =
                futures_util::future::join_all(added.iter().map(Client::wait_for_instances));
            if tokio::time::timeout(FIRST_INSTANCE_WAIT, first_instances)
                .await
                .is_err()
            {
                tracing::debug!("a new model has no live instance yet; announcing it anyway");
            }
            let prepare = manager
                .prepare
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            if let Some(prepare) = prepare {
                let ready =
                    futures_util::future::join_all(new_entries.into_iter().map(|e| prepare(e)));
                if tokio::time::timeout(FIRST_INSTANCE_WAIT, ready)
                    .await
                    .is_err()
                {
                    tracing::debug!("a new model is not prepared yet; announcing it anyway");
                }
            }
        }
        manager.replace(models.clone());
        self.models = models;
        self.cards = listed;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dynamo_runtime::RuntimeConfig;
    use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};

    use super::*;
    use crate::model_card::{ModelType, RegisterModelArgs};

    fn tiny_card(name: &str) -> ModelDeploymentCard {
        RegisterModelArgs {
            model_input: ModelInput::Tokens,
            model_type: ModelType::CHAT,
            model_path: concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-model").into(),
            model_name: Some(name.into()),
            ..Default::default()
        }
        .build_card()
        .expect("card")
    }

    async fn until(manager: &ModelManager, want: &[&str]) {
        tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                let names: Vec<String> = manager.list().iter().map(|m| m.name.clone()).collect();
                if names == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("models never became {want:?}"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runtime_data_wait_finds_the_one_matching_instance_or_times_out() {
        let ns = format!("r{}", fastrand::u64(..));
        let worker = DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .expect("runtime");
        let caller = DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .expect("runtime");
        let ep = EndpointId::parse(&format!("{ns}.backend.generate")).expect("ep");
        let client = caller.client(&ep);
        let short = Some(Duration::from_millis(150));
        let err = wait_for_instance_by_runtime_data(&client, "role", "leader", short)
            .await
            .expect_err("nothing registered yet");
        assert!(matches!(err, Error::Timeout(_)), "{err}");
        assert!(err.to_string().contains("last_match_count=0"), "{err}");

        let mut card = tiny_card("tiny");
        card.runtime_config
            .set_engine_specific("role", "\"leader\"")
            .expect("json");
        let handler = Arc::new(crate::engines::TokenEngineHandler::new(Arc::new(
            crate::engines::EchoEngine::new(Duration::ZERO),
        )));
        let serving = {
            let (worker, ep) = (worker.clone(), ep.clone());
            tokio::spawn(async move { worker.serve_endpoint(&ep, handler, false).await })
        };
        register_model(&worker, &ep, &card).await.expect("register");
        let id = wait_for_instance_by_runtime_data(
            &client,
            "role",
            "leader",
            Some(Duration::from_secs(5)),
        )
        .await
        .expect("found");
        assert_eq!(id, worker.connection_id());
        let err = wait_for_instance_by_runtime_data(&client, "role", "follower", short)
            .await
            .expect_err("no follower");
        assert!(matches!(err, Error::Timeout(_)), "{err}");
        worker.shutdown();
        let _ = serving.await;
        caller.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_model_is_announced_with_its_first_instance_known() {
        // The file store (the embedded default, and the CI failure's backend): its
        // instance watch lists a directory, so a client's first listing takes a moment.
        let dir = tempfile::tempdir().expect("tempdir");
        let config = RuntimeConfig {
            file_kv_root: dir.path().to_path_buf(),
            ..RuntimeConfig::default()
        };
        let ns = format!("i{}", fastrand::u64(..));
        let worker =
            DistributedRuntime::new(DiscoveryBackend::File, RequestPlane::Tcp, config.clone())
                .expect("runtime");
        let frontend = DistributedRuntime::new(DiscoveryBackend::File, RequestPlane::Tcp, config)
            .expect("runtime");
        let ep = EndpointId::parse(&format!("{ns}.backend.generate")).expect("ep");
        let handler = Arc::new(crate::engines::TokenEngineHandler::new(Arc::new(
            crate::engines::EchoEngine::new(Duration::ZERO),
        )));
        let serving = {
            let (worker, ep) = (worker.clone(), ep.clone());
            tokio::spawn(async move { worker.serve_endpoint(&ep, handler, false).await })
        };
        register_model(&worker, &ep, &tiny_card("tiny"))
            .await
            .expect("register");
        // (A probe on the worker's own runtime: the instance is in the store.)
        worker
            .client(&ep)
            .wait_for_instances()
            .await
            .expect("instance registered");
        // The worker is up and registered before the frontend starts, as when
        // `dynamo.frontend -i` joins a running deployment: the model is known once the
        // first listing returns, and it must already route (its new client has listed the
        // worker's instance) rather than answer the first request with "no instances".
        let manager = ModelManager::new();
        ModelWatcher::start(frontend.clone(), Some(ns.clone()), manager.clone()).await;
        let entry = manager
            .get("tiny")
            .expect("model known after the first listing");
        assert_eq!(entry.client.instance_ids(), vec![worker.connection_id()]);
        worker.shutdown();
        let _ = serving.await;
        frontend.shutdown();
    }

    #[test]
    fn card_keys_sit_next_to_the_instance() {
        let ep = EndpointId::parse("ns.comp.ep").expect("ep");
        assert_eq!(card_key(&ep, 0xab, None), "v1/mdc/ns/comp/ep/ab");
        assert_eq!(
            card_key(&ep, 0xab, Some("My Adapter")),
            format!("v1/mdc/ns/comp/ep/ab/{}", slugify("My Adapter"))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watcher_follows_registrations_taints_and_namespaces() {
        let ns = format!("w{}", fastrand::u64(..));
        let worker = DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .expect("runtime");
        let frontend = DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .expect("runtime");
        let manager = ModelManager::new();
        ModelWatcher::start(frontend.clone(), Some(ns.clone()), manager.clone()).await;
        let ep = EndpointId::parse(&format!("{ns}.backend.generate")).expect("ep");
        let other = EndpointId::parse("elsewhere.backend.generate").expect("ep");
        register_model(&worker, &ep, &tiny_card("tiny"))
            .await
            .expect("register");
        register_model(&worker, &other, &tiny_card("hidden"))
            .await
            .expect("register");
        until(&manager, &["tiny"]).await;
        let entry = manager.get("tiny").expect("tiny");
        assert!(entry.is_tokens() && entry.preprocessor.is_some());
        assert_eq!(entry.endpoint, ep);

        update_model_taints(&worker, &ep, BTreeSet::from(["gpu-a".to_owned()]))
            .await
            .expect("taints");
        let key = card_key(&ep, worker.connection_id(), None);
        let stored = worker.kv_store().list(&key).await.expect("list");
        let card = ModelDeploymentCard::from_json_str(&stored[0].1).expect("card");
        assert!(card.runtime_config.taints.contains("gpu-a"));
        assert!(
            update_model_taints(&frontend, &ep, BTreeSet::new())
                .await
                .is_err()
        );

        unregister_model(&worker, &ep, None)
            .await
            .expect("unregister");
        until(&manager, &[]).await;
        unregister_model(&worker, &other, None)
            .await
            .expect("unregister");
        worker.shutdown();
        frontend.shutdown();
    }
}
