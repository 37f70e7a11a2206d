//! Router side: [`KvRouter`] (index + scheduler + event subscription + worker discovery
//! + load metrics + dispatch).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_kv_router::hashing::BlockExtraInfo;
use dynamo_kv_router::kv_router::{EventOutcome, KvRouterCore, RouteRequest};
use dynamo_kv_router::protocols::{
    KvCacheEventData, RouterEvent, WorkerWithDpRank, decode_json_router_event,
};
use dynamo_kv_router::recovery::WorkerKvQueryResponse;
use dynamo_kv_router::scheduling::Selection;
use dynamo_kv_router::scheduling::config::{KvRouterConfig, RouterConfigOverride};
use dynamo_kv_router::scheduling::queue::{QueueEntryInfo, RouterQueue};
use dynamo_kv_router::scheduling::selector::{LoadThresholds, RoutingConstraints, WorkerCapacity};
use dynamo_runtime::transport::client::ResponseStream;
use dynamo_runtime::{Context, DistributedRuntime, EndpointId, Route};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::bus::{self, TopicMessage};
use super::event_stats::{KvEventStats, now_ms};
use super::publisher::{ActiveLoad, query_worker};
use super::{KV_EVENTS_TOPIC, KV_METRICS_TOPIC, Result, lock};

/// Live events buffered per rank while it recovers (as the reference).
const RECOVERY_BUFFER: usize = 1024;
/// How often a queued request re-checks the load when nothing signalled.
const QUEUE_POLL: Duration = Duration::from_millis(20);
/// Events the event loop takes off its queue at once (one wake-up, one clock read).
const EVENT_BATCH: usize = 128;

/// Options of one routing decision.
#[derive(Debug, Clone, Default)]
pub struct RouteOptions {
    /// Book the request's load under this id (`free` it later).
    pub request_id: Option<String>,
    /// Per-request configuration overrides.
    pub overrides: Option<RouterConfigOverride>,
    /// Placement constraints.
    pub constraints: Option<RoutingConstraints>,
    /// LoRA adapter.
    pub lora_name: Option<String>,
    /// Cache namespace / salt.
    pub cache_namespace: Option<String>,
    /// Per-block multimodal info.
    pub block_mm_infos: Option<Vec<Option<BlockExtraInfo>>>,
    /// Route to exactly this rank.
    pub pinned: Option<WorkerWithDpRank>,
    /// Workers not to choose while another is eligible (e.g. those a migrated request
    /// already failed on). Instances the runtime knows are down are always avoided.
    pub avoid: Vec<u64>,
    /// Record the decision in the approximate index.
    pub update_indexer: bool,
    /// Router-queue priority tier (higher first).
    pub strict_priority: u32,
}

impl RouteOptions {
    fn request<'a>(&'a self, tokens: &'a [u32]) -> RouteRequest<'a> {
        RouteRequest {
            tokens,
            request_id: self.request_id.as_deref(),
            lora_name: self.lora_name.as_deref(),
            cache_namespace: self.cache_namespace.as_deref(),
            block_mm_infos: self.block_mm_infos.as_deref(),
            overrides: self.overrides.as_ref(),
            constraints: self.constraints.as_ref(),
            pinned: self.pinned,
            avoid: &self.avoid,
            update_indexer: self.update_indexer,
        }
    }
}

struct Shared {
    core: KvRouterCore,
    /// Signalled when load falls or workers join (router queue, waiting for workers).
    changed: Notify,
    /// Worker ids discovered on the generate endpoint.
    instances: Mutex<HashSet<u64>>,
    /// Ranks registered with the scheduler.
    ranks: Mutex<HashSet<WorkerWithDpRank>>,
    /// Taints per worker (all its ranks).
    taints: Mutex<HashMap<u64, BTreeSet<String>>>,
    /// Reported capacity per rank.
    capacity: Mutex<HashMap<WorkerWithDpRank, WorkerCapacity>>,
    /// Requests waiting for capacity (`router_queue_threshold`), in policy order.
    queue: Mutex<RouterQueue<oneshot::Sender<()>>>,
    /// Epoch of the queue's arrival offsets.
    epoch: Instant,
    /// Signalled (one permit) when a rank is registered, for replica sync.
    rank_joined: Notify,
    /// KV event ingestion counters and lag.
    events: KvEventStats,
    /// True once the KV-event subscription is live on the event plane (or there is none:
    /// routing without events, or a subscription that failed).
    subscribed: tokio::sync::watch::Sender<bool>,
}

impl super::replica_sync::SyncedRouter for Shared {
    fn scheduler(&self) -> &dynamo_kv_router::scheduling::Scheduler {
        self.core.scheduler()
    }

    fn rank_joined(&self) -> &Notify {
        &self.rank_joined
    }
}

impl Shared {
    fn ensure_rank(&self, worker: WorkerWithDpRank) {
        if !lock(&self.instances).contains(&worker.worker_id) {
            return;
        }
        if lock(&self.ranks).insert(worker) {
            self.register(worker);
            self.changed.notify_waiters();
            self.rank_joined.notify_one();
        }
    }

    /// (Re-)register a rank with its taints and capacity.
    fn register(&self, worker: WorkerWithDpRank) {
        let taints = lock(&self.taints)
            .get(&worker.worker_id)
            .cloned()
            .unwrap_or_default();
        let capacity = lock(&self.capacity)
            .get(&worker)
            .copied()
            .unwrap_or_default();
        self.core.upsert_worker(worker, taints, capacity);
    }

    fn remove_worker(&self, worker_id: u64) {
        lock(&self.instances).remove(&worker_id);
        lock(&self.ranks).retain(|r| r.worker_id != worker_id);
        lock(&self.taints).remove(&worker_id);
        lock(&self.capacity).retain(|r, _| r.worker_id != worker_id);
        self.core.remove_worker(worker_id);
    }

    fn apply_load(&self, load: &ActiveLoad) {
        let rank = WorkerWithDpRank::new(load.worker_id, load.dp_rank);
        if load.total_kv_blocks.is_some() || load.max_num_batched_tokens.is_some() {
            let changed = {
                let mut caps = lock(&self.capacity);
                let cap = caps.entry(rank).or_default();
                let before = *cap;
                cap.total_kv_blocks = load.total_kv_blocks.or(cap.total_kv_blocks);
                cap.max_num_batched_tokens =
                    load.max_num_batched_tokens.or(cap.max_num_batched_tokens);
                *cap != before
            };
            if changed && lock(&self.ranks).contains(&rank) {
                self.register(rank);
            }
        }
        self.ensure_rank(rank);
        self.core.set_kv_used_blocks(rank, load.kv_used_blocks);
        self.changed.notify_waiters();
    }
}

/// A KV-aware router over one endpoint's workers.
///
/// Background tasks (stopped when the router is dropped or the runtime shuts down):
/// * discovery of the endpoint's instances → `upsert_worker` / `remove_worker`;
/// * the component's `kv_events` topic → the index, with gap detection and recovery from
///   the worker-local indexer (live events buffered meanwhile);
/// * the `kv_metrics` topic → `set_kv_used_blocks`;
/// * with `router_replica_sync`, the `router-replicas.{endpoint}` topic: bookings shared
///   with the other routers of the endpoint (see [`super::replica_sync`]).
pub struct KvRouter {
    shared: Arc<Shared>,
    runtime: DistributedRuntime,
    endpoint: EndpointId,
    client: dynamo_runtime::Client,
    stop: CancellationToken,
}

impl Drop for KvRouter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl KvRouter {
    /// Resolves once the router's KV-event subscription is live on the event plane: an
    /// event published after it is applied. At once without events; a subscription that
    /// failed resolves it too (the router then routes on its own bookings).
    pub async fn events_subscribed(&self) {
        let mut rx = self.shared.subscribed.subscribe();
        let _ = rx.wait_for(|live| *live).await;
    }

    /// A router for `endpoint` with blocks of `block_size` tokens. Must be called inside the
    /// tokio runtime.
    ///
    /// # Errors
    /// A zero block size or an invalid configuration.
    pub fn new(
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
        block_size: u32,
        config: KvRouterConfig,
        thresholds: LoadThresholds,
    ) -> Result<Arc<Self>> {
        Self::with_client(
            runtime,
            runtime.client(endpoint),
            block_size,
            config,
            thresholds,
        )
    }

    /// A router over the workers of `client`'s endpoint that follows `client`'s own view
    /// of the instances: a caller that sends the routed requests through the same client
    /// (the frontend) can never be handed a worker that client does not know yet.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn with_client(
        runtime: &DistributedRuntime,
        client: dynamo_runtime::Client,
        block_size: u32,
        config: KvRouterConfig,
        thresholds: LoadThresholds,
    ) -> Result<Arc<Self>> {
        let endpoint = &client.endpoint().clone();
        let use_events = config.use_kv_events;
        let policy = config.router_queue_policy;
        let queued = config.router_queue_threshold.is_some();
        let core = KvRouterCore::new(block_size, config, thresholds)?;
        let shared = Arc::new(Shared {
            core,
            changed: Notify::new(),
            instances: Mutex::new(HashSet::new()),
            ranks: Mutex::new(HashSet::new()),
            taints: Mutex::new(HashMap::new()),
            capacity: Mutex::new(HashMap::new()),
            queue: Mutex::new(RouterQueue::new(policy)),
            epoch: Instant::now(),
            rank_joined: Notify::new(),
            events: KvEventStats::default(),
            subscribed: tokio::sync::watch::Sender::new(!use_events),
        });
        let stop = CancellationToken::new();
        let ns = endpoint.namespace.clone();
        let comp = endpoint.component.clone();

        // Newly discovered workers, for the event loop's initial sync from their local
        // indexers.
        let (sync_tx, sync_rx) = mpsc::unbounded_channel::<WorkerWithDpRank>();

        // Worker discovery, through the client's own watch: a worker becomes routable
        // here only once the client that sends to it knows its address.
        let mut watch = client.watch_instances();
        tokio::spawn({
            let shared = Arc::clone(&shared);
            let stop = stop.clone();
            let rt = runtime.clone();
            let sync_tx = use_events.then_some(sync_tx);
            async move {
                loop {
                    let ids: HashSet<u64> = watch.borrow().iter().map(|i| i.instance_id).collect();
                    let known: Vec<u64> = lock(&shared.instances).iter().copied().collect();
                    for gone in known.iter().filter(|id| !ids.contains(id)) {
                        shared.remove_worker(*gone);
                    }
                    for id in &ids {
                        if lock(&shared.instances).insert(*id) {
                            let rank = WorkerWithDpRank::new(*id, 0);
                            shared.ensure_rank(rank);
                            if let Some(tx) = &sync_tx {
                                let _ = tx.send(rank);
                            }
                        }
                    }
                    tokio::select! {
                        r = watch.changed() => if r.is_err() { break },
                        () = stop.cancelled() => break,
                        () = rt.stopped() => break,
                    }
                }
            }
        });

        if use_events {
            let (rx, ready) = bus::subscribe_with_ready(
                runtime,
                &ns,
                &comp,
                KV_EVENTS_TOPIC,
                stop.child_token(),
            )?;
            bus::spawn_until(
                stop.clone(),
                event_loop(
                    Arc::clone(&shared),
                    EventSource {
                        runtime: runtime.clone(),
                        namespace: ns.clone(),
                        component: comp.clone(),
                        events: rx,
                        ready,
                        sync: sync_rx,
                    },
                ),
            );
        }

        let mut metrics =
            bus::subscribe(runtime, &ns, &comp, KV_METRICS_TOPIC, stop.child_token())?;
        tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                while let Some(msg) = metrics.recv().await {
                    let TopicMessage::Payload { payload, .. } = msg;
                    if let Ok(load) = serde_json::from_slice::<ActiveLoad>(&payload) {
                        shared.apply_load(&load);
                    }
                }
            }
        });

        if queued {
            tokio::spawn(dispatch_queue(Arc::clone(&shared), stop.clone()));
        }

        if shared.core.config().router_replica_sync {
            super::replica_sync::spawn(runtime, endpoint, Arc::clone(&shared), stop.clone())?;
        }

        Ok(Arc::new(Self {
            shared,
            runtime: runtime.clone(),
            endpoint: endpoint.clone(),
            client,
            stop,
        }))
    }

    /// The routing core (index, scheduler, cursors).
    pub fn core(&self) -> &KvRouterCore {
        &self.shared.core
    }

    /// The endpoint routed to.
    pub fn endpoint(&self) -> &EndpointId {
        &self.endpoint
    }

    /// Block size in tokens.
    pub fn block_size(&self) -> u32 {
        self.shared.core.block_size()
    }

    /// Resolves once at least one worker rank is registered (bounded by `timeout`).
    pub async fn wait_for_workers(&self, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.shared.changed.notified();
                if !self.shared.core.workers().is_empty() {
                    return;
                }
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep(QUEUE_POLL) => {}
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// Choose a worker rank (booking the request when it has an id). Waits in the router
    /// queue while every eligible rank is over the busy threshold (`router_queue_threshold`),
    /// and for the first worker (bounded by the runtime's request timeout).
    ///
    /// # Errors
    /// No workers, no worker satisfying the constraints, bad input.
    pub async fn route(&self, tokens: &[u32], opts: &RouteOptions) -> Result<Selection> {
        if opts.pinned.is_none() {
            self.wait_for_workers(self.runtime.config().request_timeout)
                .await;
        }
        if opts.pinned.is_none()
            && self.shared.core.config().router_queue_threshold.is_some()
            && (!lock(&self.shared.queue).is_empty()
                || self.shared.core.must_queue(opts.constraints.as_ref()))
        {
            self.wait_in_queue(tokens, opts).await?;
        }
        // A worker any client of this runtime saw fail is avoided at once, before
        // discovery drops it: routing to it would only fail (or cost a retry).
        let down = self.client.down_instance_ids();
        if down.is_empty() {
            return Ok(self.shared.core.best_worker(&opts.request(tokens))?);
        }
        let mut opts = opts.clone();
        opts.avoid.extend(down);
        Ok(self.shared.core.best_worker(&opts.request(tokens))?)
    }

    /// Park the request in the router queue until the dispatcher lets it through.
    async fn wait_in_queue(&self, tokens: &[u32], opts: &RouteOptions) -> Result<()> {
        let best_cached_tokens = {
            let (local, _) = self.shared.core.hash_request(&opts.request(tokens))?;
            let scores = self.shared.core.find_matches(&local);
            let best = scores.scores.iter().map(|(_, n)| *n).max().unwrap_or(0);
            u64::from(best) * u64::from(self.block_size())
        };
        let info = QueueEntryInfo {
            strict_priority: opts.strict_priority,
            priority_jump: 0.0,
            arrival_offset_secs: self.shared.epoch.elapsed().as_secs_f64(),
            isl_tokens: tokens.len() as u64,
            best_cached_tokens,
        };
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.queue).push(tx, &info);
        self.shared.changed.notify_waiters();
        tokio::select! {
            _ = rx => Ok(()),
            () = self.stop.cancelled() => Err(super::Error::InvalidArgument("the router stopped".into())),
        }
    }

    /// The capacity a rank reported on `kv_metrics` (`None` before its first report).
    pub fn capacity(&self, worker: WorkerWithDpRank) -> Option<WorkerCapacity> {
        lock(&self.shared.capacity).get(&worker).copied()
    }

    /// KV event ingestion: events and blocks applied, queue depth, publish-to-applied lag
    /// (see [`super::event_stats`]).
    pub fn event_stats(&self) -> &KvEventStats {
        &self.shared.events
    }

    /// Requests waiting in the router queue.
    pub fn queued(&self) -> usize {
        lock(&self.shared.queue).len()
    }

    /// The load each rank would have with this request.
    ///
    /// # Errors
    /// Bad input.
    pub fn potential_loads(
        &self,
        tokens: &[u32],
        opts: &RouteOptions,
    ) -> Result<Vec<dynamo_kv_router::scheduling::PotentialLoad>> {
        Ok(self.shared.core.potential_loads(&opts.request(tokens))?)
    }

    /// The request's prefill is done (its prompt tokens stop counting).
    ///
    /// # Errors
    /// Unknown request.
    pub fn mark_prefill_complete(&self, request_id: &str) -> Result<()> {
        self.shared.core.mark_prefill_completed(request_id)?;
        self.shared.changed.notify_waiters();
        Ok(())
    }

    /// The request finished: release its load.
    ///
    /// # Errors
    /// Unknown request.
    pub fn free(&self, request_id: &str) -> Result<()> {
        self.shared.core.free(request_id)?;
        self.shared.changed.notify_waiters();
        Ok(())
    }

    /// Choose a worker rank for `tokens` as [`Self::route`] does and book the request's
    /// load there under `opts.request_id` (required). The returned [`Booking`] marks
    /// prefill complete at the first output, books output blocks when
    /// `router_track_output_blocks` is on, and frees the load when dropped.
    ///
    /// # Errors
    /// As [`Self::route`]; a missing request id is [`super::Error::InvalidArgument`].
    pub async fn book(
        self: &Arc<Self>,
        tokens: &[u32],
        opts: &RouteOptions,
    ) -> Result<(Selection, Booking)> {
        let Some(request_id) = opts.request_id.clone() else {
            return Err(super::Error::InvalidArgument(
                "booking a request needs a request id".into(),
            ));
        };
        let selection = self.route(tokens, opts).await?;
        let booking = Booking {
            router: Arc::clone(self),
            request_id,
            prefilled: false,
            freed: false,
            output_tokens: self
                .shared
                .core
                .config()
                .router_track_output_blocks
                .then_some(0),
        };
        Ok((selection, booking))
    }

    /// Route `body` (a JSON request for the worker) by `tokens` and send it to the chosen
    /// worker. The request is booked under the context's id (or `opts.request_id`); the
    /// returned stream marks prefill complete at its first item and frees the booking
    /// when it ends or is dropped (error, cancellation).
    ///
    /// # Errors
    /// Routing or sending failed (the booking is released).
    pub async fn generate(
        self: &Arc<Self>,
        tokens: &[u32],
        body: Bytes,
        mut opts: RouteOptions,
        context: Context,
    ) -> Result<RoutedStream> {
        opts.request_id
            .get_or_insert_with(|| context.id().to_owned());
        let (selection, booking) = self.book(tokens, &opts).await?;
        let stream = self
            .client
            .generate(
                body,
                Route::Direct(selection.worker.worker_id),
                context,
                None,
            )
            .await?;
        Ok(RoutedStream {
            stream,
            selection,
            booking,
        })
    }

    /// Set a worker's taints (all its registered ranks; rank 0 when none is registered
    /// yet), as its model registration would.
    pub fn set_worker_taints(&self, worker_id: u64, taints: BTreeSet<String>) {
        lock(&self.shared.taints).insert(worker_id, taints);
        let mut ranks: Vec<WorkerWithDpRank> = lock(&self.shared.ranks)
            .iter()
            .filter(|r| r.worker_id == worker_id)
            .copied()
            .collect();
        if ranks.is_empty() {
            ranks.push(WorkerWithDpRank::new(worker_id, 0));
        }
        for rank in ranks {
            self.shared.register(rank);
        }
    }

    /// Stop the background tasks.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}

/// One request's load booked in the router's scheduler (see [`KvRouter::book`]).
///
/// The first [`Self::on_output`] marks the prompt's prefill complete (its tokens stop
/// counting as prefill load); with `router_track_output_blocks` every `block_size` output
/// tokens book one more decode block. [`Self::release`], or dropping the booking, frees
/// the request's load (once).
pub struct Booking {
    router: Arc<KvRouter>,
    request_id: String,
    prefilled: bool,
    freed: bool,
    /// Output tokens seen, when output blocks are tracked.
    output_tokens: Option<usize>,
}

impl Booking {
    /// The id the load is booked under.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Whether output tokens are counted (`router_track_output_blocks`): callers may skip
    /// counting them otherwise.
    pub fn tracks_output(&self) -> bool {
        self.output_tokens.is_some()
    }

    /// The worker produced an item carrying `tokens` output tokens.
    pub fn on_output(&mut self, tokens: usize) {
        if self.freed {
            return;
        }
        if !self.prefilled {
            self.prefilled = true;
            let _ = self.router.mark_prefill_complete(&self.request_id);
        }
        let block = self.router.block_size().max(1) as usize;
        let Some(seen) = self.output_tokens.as_mut() else {
            return;
        };
        let before = *seen / block;
        *seen += tokens;
        for _ in before..*seen / block {
            let _ = self.router.core().add_output_block(&self.request_id);
        }
    }

    /// Free the request's load now (idempotent; dropping does the same).
    pub fn release(&mut self) {
        if !std::mem::replace(&mut self.freed, true) {
            let _ = self.router.free(&self.request_id);
        }
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        self.release();
    }
}

/// A routed response stream (see [`KvRouter::generate`]).
pub struct RoutedStream {
    stream: ResponseStream,
    selection: Selection,
    booking: Booking,
}

impl RoutedStream {
    /// The routing decision.
    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// The underlying stream's context.
    pub fn context(&self) -> &Context {
        self.stream.context()
    }

    fn seen(&mut self, item: Option<&dynamo_runtime::Result<Bytes>>) {
        match item {
            Some(Ok(bytes)) => {
                let tokens = if self.booking.tracks_output() {
                    output_token_count(bytes)
                } else {
                    0
                };
                self.booking.on_output(tokens);
            }
            Some(Err(_)) | None => self.booking.release(),
        }
    }

    /// The next item without waiting (`Err(())`: none ready yet).
    #[expect(clippy::result_unit_err, reason = "mirrors ResponseStream::try_next")]
    pub fn try_next(&mut self) -> std::result::Result<Option<dynamo_runtime::Result<Bytes>>, ()> {
        let item = self.stream.try_next()?;
        self.seen(item.as_ref());
        Ok(item)
    }

    /// The next item; `None` at the end.
    pub async fn next(&mut self) -> Option<dynamo_runtime::Result<Bytes>> {
        let item = self.stream.next().await;
        self.seen(item.as_ref());
        item
    }
}

/// The number of `token_ids` in a worker item (an `LLMEngineOutput` in the envelope's
/// `data`); 0 for annotations and anything else.
fn output_token_count(bytes: &[u8]) -> usize {
    #[derive(serde::Deserialize)]
    struct Output {
        #[serde(default)]
        token_ids: Vec<serde::de::IgnoredAny>,
    }
    #[derive(serde::Deserialize)]
    struct Envelope {
        data: Option<Output>,
    }
    match dynamo_runtime::transport::codec::decode::<Envelope>(bytes) {
        Ok(Envelope { data: Some(out) }) => out.token_ids.len(),
        _ => 0,
    }
}

/// Let queued requests through, one at a time in policy order, while some eligible rank
/// has capacity. Each released request books itself before the next check.
async fn dispatch_queue(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let notified = shared.changed.notified();
        loop {
            if shared.core.must_queue(None) {
                break;
            }
            let Some(waiter) = lock(&shared.queue).pop() else {
                break;
            };
            if waiter.send(()).is_err() {
                continue; // the caller gave up
            }
            // Give the released request time to book before looking again.
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(QUEUE_POLL) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// What the event loop reads: the `kv_events` subscription (and when it is live), and the
/// workers discovery found.
struct EventSource {
    runtime: DistributedRuntime,
    namespace: String,
    component: String,
    events: mpsc::UnboundedReceiver<TopicMessage>,
    ready: oneshot::Receiver<()>,
    sync: mpsc::UnboundedReceiver<WorkerWithDpRank>,
}

/// Applies live KV events, recovers gaps, and syncs new workers.
///
/// Gap detection alone cannot repair a loss at the very start: events a worker published
/// before this router's subscription was live are never seen, and if the worker then goes
/// quiet no later event reveals the gap. So each newly discovered worker is asked once for
/// its local indexer's events, after the subscription is live (anything published later
/// arrives live). The answer is applied only if no live event of that rank has been applied
/// meanwhile; otherwise live events are flowing and gap recovery covers any loss. A worker
/// without a local indexer simply fails the query (logged at debug).
///
/// Runs until the subscription ends; the caller aborts it when the router stops
/// ([`bus::spawn_until`]), so the loop polls no stop token per wake-up.
async fn event_loop(shared: Arc<Shared>, source: EventSource) {
    let EventSource {
        runtime,
        namespace,
        component,
        events: mut rx,
        mut ready,
        sync: mut sync_rx,
    } = source;
    let (rec_tx, mut rec_rx) =
        mpsc::unbounded_channel::<(WorkerWithDpRank, Result<WorkerKvQueryResponse>)>();
    let (synced_tx, mut synced_rx) =
        mpsc::unbounded_channel::<(WorkerWithDpRank, Result<WorkerKvQueryResponse>)>();
    let mut live = false;
    let mut pending_sync: Vec<WorkerWithDpRank> = Vec::new();
    let spawn_sync = |worker: WorkerWithDpRank| {
        let tx = synced_tx.clone();
        let rt = runtime.clone();
        let (ns, comp) = (namespace.clone(), component.clone());
        tokio::spawn(async move {
            let res = query_worker(&rt, &ns, &comp, worker, None).await;
            let _ = tx.send((worker, res));
        });
    };
    // Buffered live events of recovering ranks, with their publication times.
    let mut recovering: HashMap<WorkerWithDpRank, VecDeque<(RouterEvent, u64)>> = HashMap::new();
    let stats = &shared.events;
    let handle =
        |event: RouterEvent,
         published_at_ms: u64,
         now: u64,
         recovering: &mut HashMap<WorkerWithDpRank, VecDeque<(RouterEvent, u64)>>| {
            let worker = event.worker();
            if let Some(buf) = recovering.get_mut(&worker) {
                if buf.len() >= RECOVERY_BUFFER {
                    buf.pop_front();
                }
                buf.push_back((event, published_at_ms));
                return;
            }
            shared.ensure_rank(worker);
            let outcome = shared.core.apply_event(&event);
            if matches!(outcome, EventOutcome::Applied | EventOutcome::Rejected(_)) {
                stats.applied(event_blocks(&event), published_at_ms, now);
            }
            match outcome {
                EventOutcome::Gap { expected, got, .. } => {
                    tracing::debug!(?worker, expected, got, "KV event gap; recovering");
                    stats.gap();
                    recovering.insert(worker, VecDeque::from([(event, published_at_ms)]));
                    let tx = rec_tx.clone();
                    let rt = runtime.clone();
                    let (ns, comp) = (namespace.clone(), component.clone());
                    tokio::spawn(async move {
                        let res = query_worker(&rt, &ns, &comp, worker, Some(expected)).await;
                        let _ = tx.send((worker, res));
                    });
                }
                EventOutcome::Rejected(e) => {
                    stats.rejected();
                    tracing::debug!(?worker, error = %e, "KV event rejected");
                }
                EventOutcome::Applied | EventOutcome::Duplicate => {}
            }
        };
    let mut batch: Vec<TopicMessage> = Vec::with_capacity(EVENT_BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, EVENT_BATCH) => {
                if n == 0 {
                    break;
                }
                let now = now_ms();
                for TopicMessage::Payload { payload, published_at_ms, .. } in batch.drain(..) {
                    match decode_json_router_event(&payload) {
                        Ok(event) => handle(event, published_at_ms, now, &mut recovering),
                        Err(e) => tracing::debug!(error = %e, "malformed KV event"),
                    }
                }
                stats.set_queued(rx.len());
            },
            Some((worker, res)) = rec_rx.recv() => {
                let Some(buf) = recovering.remove(&worker) else { continue };
                match res {
                    Ok(answer) => {
                        if let Err(e) = shared.core.recover(worker, answer) {
                            tracing::debug!(?worker, error = %e, "recovery applied with errors");
                        }
                    }
                    Err(e) => {
                        // Nothing to recover from: accept the loss and carry on from the
                        // first buffered event.
                        tracing::warn!(?worker, error = %e, "KV recovery failed; events lost");
                        let last = buf.front().and_then(|(ev, _)| ev.event.event_id.checked_sub(1));
                        let _ = shared.core.recover(
                            worker,
                            WorkerKvQueryResponse::Events { events: Vec::new(), last_event_id: last },
                        );
                    }
                }
                let now = now_ms();
                for (event, published_at_ms) in buf {
                    handle(event, published_at_ms, now, &mut recovering);
                }
            }
            // Fired, or dropped because the subscription failed: either way nothing more
            // is to be waited for before syncing.
            _ = &mut ready, if !live => {
                live = true;
                shared.subscribed.send_replace(true);
                pending_sync.drain(..).for_each(&spawn_sync);
            }
            Some(worker) = sync_rx.recv() => {
                if live {
                    spawn_sync(worker);
                } else {
                    pending_sync.push(worker);
                }
            }
            Some((worker, res)) = synced_rx.recv() => {
                let known = lock(&shared.instances).contains(&worker.worker_id);
                if !known
                    || recovering.contains_key(&worker)
                    || shared.core.event_cursor(worker).is_some()
                {
                    continue;
                }
                match res {
                    Ok(answer) => {
                        if let Err(e) = shared.core.recover(worker, answer) {
                            tracing::debug!(?worker, error = %e, "initial KV sync applied with errors");
                        }
                    }
                    Err(e) => tracing::debug!(?worker, error = %e, "no initial KV sync (no local indexer?)"),
                }
            }
        }
    }
}

/// Blocks an event carries (stored or removed; 0 for `cleared`).
fn event_blocks(event: &RouterEvent) -> usize {
    match &event.event.data {
        KvCacheEventData::Stored(s) => s.blocks.len(),
        KvCacheEventData::Removed(r) => r.block_hashes.len(),
        KvCacheEventData::Cleared => 0,
    }
}
