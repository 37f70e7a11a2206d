//! [`DistributedRuntime`]: discovery, the request-plane server and connection pool, served
//! endpoints, the event plane's entry points, and the shutdown sequence.
//!
//! Shutdown ([`DistributedRuntime::shutdown`]) runs once, in three phases as in the
//! reference:
//! 1. every served endpoint stops accepting and withdraws its instance from discovery;
//! 2. graceful endpoints wait for their in-flight streams (bounded by
//!    `graceful_shutdown_timeout`);
//! 3. the listener and every connection close, discovery withdraws what is left, and the
//!    `serve_endpoint` futures resolve.
//!
//! Layering: this module imports configuration, discovery, transport, metrics, the
//! status server's state and the event plane, and none of them imports it back. Code that
//! needs a whole runtime handle lives above it, in `impl DistributedRuntime` blocks of the
//! modules that import it: `client` beside `Client` in `router.rs`, and the
//! `serve_endpoint*` methods in `system.rs`, because a health-checked endpoint's canary is
//! a client of the endpoint. The halves of serving that touch the runtime's internals stay
//! here (`start_serving`, `stop_serving`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::{DiscoveryBackend, EventPlane, RequestPlane, RuntimeConfig};
use crate::context::lock;
use crate::discovery::etcd::EtcdStore;
use crate::discovery::file::FileStore;
use crate::discovery::mem::MemStore;
use crate::discovery::{
    Discovery, Instance, KvDiscovery, KvStore, TransportAddress, random_instance_id,
};
use crate::error::{Error, Result};
use crate::events::{EventPublisher, EventScope, EventSubscriber, Link};
use crate::metrics::{EndpointMetrics, MetricsRegistry};
use crate::names::EndpointId;
use crate::status::{EngineRoute, SystemHealth, SystemState};
use crate::transport::client::ConnectionPool;
use crate::transport::server::{EndpointEntry, Handler, Server};

static TOKIO: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The process's tokio runtime (multi-threaded; `DYN_RUNTIME_NUM_WORKER_THREADS` workers,
/// default one per core), built on first use and shared by every runtime of the process.
pub fn tokio_runtime() -> Result<&'static tokio::runtime::Runtime> {
    if let Some(rt) = TOKIO.get() {
        return Ok(rt);
    }
    let threads = std::env::var("DYN_RUNTIME_NUM_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("dynamo-rt")
        .enable_all()
        .build()?;
    // Another thread may have won the race; its runtime is the one everybody uses.
    let _ = TOKIO.set(rt);
    TOKIO
        .get()
        .ok_or_else(|| Error::InvalidArgument("tokio runtime unavailable".into()))
}

struct Served {
    entry: Arc<EndpointEntry>,
    instance: Instance,
}

pub(crate) struct Inner {
    pub(crate) config: RuntimeConfig,
    pub(crate) discovery: Arc<dyn Discovery>,
    pub(crate) store: Arc<dyn KvStore>,
    pub(crate) event_plane: EventPlane,
    pub(crate) request_plane: RequestPlane,
    nats: OnceCell<async_nats::Client>,
    /// The NATS connection's history (request-plane recovery after a broker restart).
    pub(crate) nats_link: Arc<crate::nats::NatsLink>,
    pub(crate) system: Arc<SystemState>,
    system_address: Option<SocketAddr>,
    server: OnceCell<Arc<Server>>,
    pub(crate) pool: ConnectionPool,
    /// Instances seen failing, shared by every client and router of this runtime.
    pub(crate) down: DownInstances,
    /// Cancelled when shutdown starts: every served endpoint begins phase 1.
    pub(crate) endpoint_shutdown: CancellationToken,
    pub(crate) primary: CancellationToken,
    served: Mutex<HashMap<String, Served>>,
    draining: AtomicUsize,
    drained: Notify,
    shutdown_started: AtomicBool,
}

/// The process-wide runtime handle (cheap to clone).
#[derive(Clone)]
pub struct DistributedRuntime {
    pub(crate) inner: Arc<Inner>,
}

impl DistributedRuntime {
    /// A runtime with the given backends. Discovery `mem` and `file` are built at once;
    /// `etcd` connects first, which needs [`DistributedRuntime::connect`] when called from
    /// inside the tokio runtime (outside it, this blocks on the process's runtime).
    pub fn new(
        discovery: DiscoveryBackend,
        request_plane: RequestPlane,
        config: RuntimeConfig,
    ) -> Result<Self> {
        let store: Arc<dyn KvStore> = match discovery {
            DiscoveryBackend::Mem => Arc::new(MemStore::new()),
            DiscoveryBackend::File => {
                Arc::new(FileStore::open(&config.file_kv_root, config.file_kv_ttl)?)
            }
            DiscoveryBackend::Etcd => {
                if tokio::runtime::Handle::try_current().is_ok() {
                    return Err(Error::InvalidArgument(
                        "etcd discovery connects asynchronously: use DistributedRuntime::connect \
                         inside the tokio runtime"
                            .into(),
                    ));
                }
                return tokio_runtime()?.block_on(Self::connect(discovery, request_plane, config));
            }
            DiscoveryBackend::Kubernetes => {
                return Err(Error::InvalidArgument(
                    "discovery backend 'kubernetes' is not available in this build; use 'etcd', \
                     'file' (several local processes) or 'mem' (one process)"
                        .into(),
                ));
            }
        };
        Self::assemble(
            discovery,
            request_plane,
            store,
            random_instance_id(),
            config,
        )
    }

    /// A runtime with the given backends, connecting to etcd when discovery is `etcd` (see
    /// [`crate::discovery::etcd`]; losing the lease shuts the runtime down).
    pub async fn connect(
        discovery: DiscoveryBackend,
        request_plane: RequestPlane,
        config: RuntimeConfig,
    ) -> Result<Self> {
        if discovery != DiscoveryBackend::Etcd {
            return Self::new(discovery, request_plane, config);
        }
        let store = EtcdStore::connect(&config).await?;
        let lost = store.lease_lost();
        // Lease ids are positive i64s.
        let id = store.lease_id().unsigned_abs();
        let drt = Self::assemble(discovery, request_plane, Arc::new(store), id, config)?;
        let weak = Arc::downgrade(&drt.inner);
        let primary = drt.inner.primary.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = lost.cancelled() => {
                    if let Some(inner) = weak.upgrade() {
                        tracing::error!("etcd lease lost: shutting the runtime down");
                        DistributedRuntime { inner }.shutdown();
                    }
                }
                () = primary.cancelled() => {}
            }
        });
        Ok(drt)
    }

    fn assemble(
        backend: DiscoveryBackend,
        request_plane: RequestPlane,
        store: Arc<dyn KvStore>,
        instance_id: u64,
        config: RuntimeConfig,
    ) -> Result<Self> {
        let discovery = Arc::new(KvDiscovery::new(Arc::clone(&store), instance_id));
        let primary = CancellationToken::new();
        let system = Arc::new(SystemState::new(config.starting_health));
        let system_address = match u16::try_from(config.system_port) {
            Ok(port) => {
                let handle = match tokio::runtime::Handle::try_current() {
                    Ok(h) => h,
                    Err(_) => tokio_runtime()?.handle().clone(),
                };
                Some(crate::status::start(
                    &config.system_host,
                    port,
                    Arc::clone(&system),
                    primary.clone(),
                    &handle,
                )?)
            }
            // Negative: disabled.
            Err(_) => None,
        };
        let pool = ConnectionPool::new(config.max_message_size, config.connect_timeout)
            .in_process(config.tcp_in_process);
        let event_plane = config
            .event_plane
            .unwrap_or_else(|| EventPlane::default_for(backend, &config));
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                discovery,
                store,
                event_plane,
                nats: OnceCell::new(),
                nats_link: Arc::default(),
                request_plane,
                system,
                system_address,
                server: OnceCell::new(),
                pool,
                down: DownInstances::default(),
                endpoint_shutdown: CancellationToken::new(),
                primary,
                served: Mutex::new(HashMap::new()),
                draining: AtomicUsize::new(0),
                drained: Notify::new(),
                shutdown_started: AtomicBool::new(false),
            }),
        })
    }

    /// The address of the system status server, when enabled (`DYN_SYSTEM_PORT` >= 0).
    pub fn system_status_address(&self) -> Option<SocketAddr> {
        self.inner.system_address
    }

    /// Set the process's health flag (reported by `/health`).
    pub fn set_health_status(&self, ready: bool) {
        self.inner.system.health.set_ready(ready);
    }

    /// The process's health state.
    pub fn health(&self) -> &Arc<SystemHealth> {
        &self.inner.system.health
    }

    /// The metrics registry rendered by `/metrics`.
    pub fn metrics(&self) -> &Arc<MetricsRegistry> {
        &self.inner.system.metrics
    }

    /// Serve `callback` at `/engine/{route}` on the status server (replacing a previous
    /// callback of the same route). Routes may contain `/`.
    pub fn register_engine_route(&self, route: &str, callback: EngineRoute) -> Result<()> {
        let route = route.trim_matches('/');
        if route.is_empty() {
            return Err(Error::InvalidArgument(
                "engine route name must not be empty".into(),
            ));
        }
        lock(&self.inner.system.routes).insert(route.to_owned(), callback);
        Ok(())
    }

    /// The process's key-value store (the discovery store): keys put through it belong to
    /// this process (deleted at shutdown, expired by the lease if the process dies). Model
    /// cards live under `v1/mdc/...`.
    pub fn kv_store(&self) -> &Arc<dyn KvStore> {
        &self.inner.store
    }

    /// The NATS client, connected on first use (`NATS_SERVER`).
    pub(crate) async fn nats(&self) -> Result<async_nats::Client> {
        self.inner
            .nats
            .get_or_try_init(|| {
                crate::nats::connect(&self.inner.config, Arc::clone(&self.inner.nats_link))
            })
            .await
            .cloned()
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// This process's discovery instance id.
    pub fn connection_id(&self) -> u64 {
        self.inner.discovery.instance_id()
    }

    /// The discovery client.
    pub fn discovery(&self) -> &Arc<dyn Discovery> {
        &self.inner.discovery
    }

    /// Whether shutdown has started.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutdown_started.load(Ordering::Acquire)
    }

    /// Resolves when the runtime has fully shut down.
    pub async fn stopped(&self) {
        self.inner.primary.cancelled().await;
    }

    async fn server(&self) -> Result<&Arc<Server>> {
        let c = &self.inner.config;
        self.inner
            .server
            .get_or_try_init(|| Server::bind(&c.tcp_host, c.tcp_port, c.max_message_size))
            .await
    }

    /// First half of serving `endpoint` with `handler` (the `serve_endpoint*` methods, in
    /// `system.rs` with the health checks they start in between): subscribe the NATS
    /// subject when that is the request plane, add the endpoint to the server and publish
    /// its instance in discovery. On error nothing stays registered.
    pub(crate) async fn start_serving(
        &self,
        endpoint: &EndpointId,
        handler: Arc<dyn Handler>,
        options: &ServeOptions,
    ) -> Result<Serving> {
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        let server = Arc::clone(self.server().await?);
        let path = endpoint.path();
        let instance = self.instance_of(endpoint, &server);
        // Cancelled once the endpoint has drained: callers' STOP and CREDIT frames must
        // still arrive while it drains.
        let nats_ingress = CancellationToken::new();
        let nats_ingress_stop = nats_ingress.clone().drop_guard();
        if let TransportAddress::NatsTcp(subject) = &instance.transport {
            let client = self.nats().await?;
            server
                .serve_nats(
                    client,
                    subject.clone(),
                    self.inner.config.max_message_size,
                    nats_ingress.clone(),
                )
                .await?;
        }
        let metrics = self
            .inner
            .system
            .metrics
            .endpoint(endpoint, &options.metrics_labels);
        let entry = EndpointEntry::with_metrics(handler, Some(Arc::clone(&metrics)));
        self.inner.draining.fetch_add(1, Ordering::AcqRel);
        let drain_guard = DrainGuard(Arc::clone(&self.inner));
        server.add_endpoint(path.clone(), Arc::clone(&entry));
        lock(&self.inner.served).insert(
            path.clone(),
            Served {
                entry: Arc::clone(&entry),
                instance: instance.clone(),
            },
        );
        if let Err(e) = self.inner.discovery.register(&instance).await {
            server.remove_endpoint(&path);
            lock(&self.inner.served).remove(&path);
            return Err(e);
        }
        // The worker's sign of life: where it serves, under which instance id (the id of
        // `/health`, the router's logs and the model card keys, `{:x}`).
        tracing::info!(
            endpoint = %endpoint,
            instance_id = instance.instance_id,
            transport = %format_args!("{}://{}", instance.transport.kind(), instance.transport.address()),
            "serving"
        );
        Ok(Serving {
            server,
            path,
            instance,
            entry,
            metrics,
            nats_ingress,
            drain_guard,
            _nats_ingress_stop: nats_ingress_stop,
        })
    }

    /// Second half of serving: phases 1 and 2 of the shutdown sequence for this endpoint
    /// (stop taking work and withdraw from discovery, then drain when `graceful`), then
    /// take it off the server.
    pub(crate) async fn stop_serving(
        &self,
        endpoint: &EndpointId,
        serving: Serving,
        graceful: bool,
    ) {
        let Serving {
            server,
            path,
            instance,
            entry,
            nats_ingress,
            drain_guard,
            ..
        } = serving;
        // Phase 1: stop taking work, withdraw from discovery.
        entry.set_accepting(false);
        if let Err(e) = self.inner.discovery.unregister(&instance).await {
            tracing::warn!(endpoint = %endpoint, error = %e, "unregister failed");
        }
        // Phase 2: drain.
        if graceful {
            let timeout = self.inner.config.graceful_shutdown_timeout;
            if tokio::time::timeout(timeout, entry.drained())
                .await
                .is_err()
            {
                tracing::warn!(endpoint = %endpoint, inflight = entry.inflight(), "drain timed out");
            }
        }
        server.remove_endpoint(&path);
        lock(&self.inner.served).remove(&path);
        // Drained: stop the NATS subject now, before `drain_guard` lets phase 3 close the
        // NATS connection, so the last frames are published and flushed first (the
        // server's `flushed` waits for them).
        nats_ingress.cancel();
        drop(drain_guard);
    }

    /// The discovery record of this process's instance of `endpoint`: id
    /// [`DistributedRuntime::connection_id`], reached through this process's request-plane
    /// server (its TCP address and the endpoint's path, or the instance's NATS subject).
    fn instance_of(&self, endpoint: &EndpointId, server: &Server) -> Instance {
        let transport = match self.inner.request_plane {
            RequestPlane::Tcp => {
                TransportAddress::Tcp(format!("{}/{}", server.address(), endpoint.path()))
            }
            RequestPlane::Nats => {
                TransportAddress::NatsTcp(crate::transport::nats::instance_subject(
                    &endpoint.namespace,
                    &endpoint.component,
                    &endpoint.name,
                    self.connection_id(),
                ))
            }
        };
        Instance {
            request_plane_codec: Some(crate::transport::codec::CODEC_NAME.to_owned()),
            ..Instance::new(endpoint, self.connection_id(), transport)
        }
    }

    /// This process's instance of `endpoint`: the served one, or (for an endpoint this
    /// process does not serve) the record serving it would publish.
    async fn own_instance(&self, endpoint: &EndpointId) -> Result<Instance> {
        if let Some(s) = lock(&self.inner.served).get(&endpoint.path()) {
            return Ok(s.instance.clone());
        }
        let server = Arc::clone(self.server().await?);
        Ok(self.instance_of(endpoint, &server))
    }

    /// Withdraw this process's instance of `endpoint` from discovery ("sleep"); a served
    /// endpoint keeps serving requests addressed to it directly. Withdrawing an instance
    /// that is not published is not an error.
    pub async fn unregister_endpoint_instance(&self, endpoint: &EndpointId) -> Result<()> {
        let instance = self.own_instance(endpoint).await?;
        self.inner.discovery.unregister(&instance).await
    }

    /// Publish this process's instance of `endpoint` ("wake"). As in the reference this also
    /// works for an endpoint the process does not serve (multinode groups publish the
    /// leader's instance for their other ranks): the record is the one serving would
    /// publish, and requests reaching it are refused as addressed to an unknown endpoint
    /// until the endpoint is served.
    pub async fn register_endpoint_instance(&self, endpoint: &EndpointId) -> Result<()> {
        let instance = self.own_instance(endpoint).await?;
        if let Some(s) = lock(&self.inner.served).get(&endpoint.path()) {
            s.entry.set_accepting(true);
        }
        self.inner.discovery.register(&instance).await
    }

    /// Every instance in discovery, of every endpoint (the frontend's `/health` lists
    /// them), sorted by endpoint then instance id.
    ///
    /// # Errors
    /// The discovery store failed.
    pub async fn all_instances(&self) -> Result<Vec<Instance>> {
        let mut all =
            crate::discovery::list_instances(self.kv_store().as_ref(), "v1/instances/").await?;
        all.sort_by(|a, b| {
            (&a.namespace, &a.component, &a.endpoint, a.instance_id).cmp(&(
                &b.namespace,
                &b.component,
                &b.endpoint,
                b.instance_id,
            ))
        });
        Ok(all)
    }

    /// The event-plane transport of this runtime.
    pub fn event_plane(&self) -> EventPlane {
        self.inner.event_plane
    }

    /// The transport of a new publisher or subscriber: over NATS, the runtime's connection
    /// (made on first use).
    async fn event_link(&self) -> Result<Link> {
        Ok(match self.inner.event_plane {
            EventPlane::Tcp => Link::Tcp,
            EventPlane::Nats => Link::Nats(self.nats().await?),
        })
    }

    /// A publisher on channel `(scope, topic)`. Brokerless: binds a listener and advertises
    /// it in discovery before returning, so subscribers can find it.
    pub async fn event_publisher(&self, scope: &EventScope, topic: &str) -> Result<EventPublisher> {
        scope.check(topic)?;
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        let link = self.event_link().await?;
        EventPublisher::open(
            self.config(),
            link,
            Arc::clone(&self.inner.store),
            scope,
            topic,
            self.inner.primary.child_token(),
        )
        .await
    }

    /// Subscribe to channel `(scope, topic)`: events of every current and future publisher.
    /// Brokerless: publishers are connected in the background; see
    /// [`EventSubscriber::wait_for_publishers`].
    pub async fn subscribe(&self, scope: &EventScope, topic: &str) -> Result<EventSubscriber> {
        scope.check(topic)?;
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        let link = self.event_link().await?;
        EventSubscriber::open(
            self.config(),
            link,
            Arc::clone(&self.inner.store),
            scope,
            topic,
            self.inner.primary.child_token(),
        )
        .await
    }

    /// Start the shutdown sequence (idempotent; returns at once). Must be called inside the
    /// tokio runtime.
    pub fn shutdown(&self) {
        if self.inner.shutdown_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move { run_shutdown(inner).await });
    }
}

/// How `DistributedRuntime::serve_endpoint_with` serves an endpoint.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Drain in-flight streams at shutdown (default true).
    pub graceful: bool,
    /// Extra constant Prometheus labels of the endpoint's metrics.
    pub metrics_labels: Vec<(String, String)>,
    /// The canary request (JSON) sent through the handler when health checks are enabled.
    pub health_check_payload: Option<bytes::Bytes>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            graceful: true,
            metrics_labels: Vec::new(),
            health_check_payload: None,
        }
    }
}

/// The instances this runtime saw fail, shared by all its clients and routers (public as
/// `router::DownInstances`; defined here because the runtime holds the set). Keyed by
/// the whole discovery entry, so a re-registered worker with a changed entry (new address
/// or endpoint) is a different key and routable at once.
#[derive(Default)]
pub struct DownInstances {
    down: Mutex<HashMap<Instance, Instant>>,
}

impl DownInstances {
    /// Mark `instance` down (again: the time restarts).
    pub fn mark(&self, instance: &Instance) {
        let fresh = lock(&self.down)
            .insert(instance.clone(), Instant::now())
            .is_none();
        if fresh {
            tracing::info!(
                instance_id = instance.instance_id,
                address = instance.transport.address(),
                "instance marked down"
            );
        }
    }

    /// A request to `instance` succeeded: it is up.
    pub fn clear(&self, instance: &Instance) {
        let mut down = lock(&self.down);
        // The usual case, checked before hashing the entry's strings.
        if down.is_empty() {
            return;
        }
        if down.remove(instance).is_some() {
            tracing::info!(instance_id = instance.instance_id, "instance up again");
        }
    }

    /// Of `live` (the discovered instances of `endpoint`), those down for less than
    /// `ttl`. Forgets the entries of `endpoint` that expired or that discovery dropped or
    /// changed.
    pub fn down_among(&self, endpoint: &EndpointId, live: &[Instance], ttl: Duration) -> Vec<u64> {
        let mut down = lock(&self.down);
        if down.is_empty() {
            return Vec::new();
        }
        down.retain(|i, at| {
            let mine = i.namespace == endpoint.namespace
                && i.component == endpoint.component
                && i.endpoint == endpoint.name;
            !mine || (at.elapsed() < ttl && live.contains(i))
        });
        live.iter()
            .filter(|i| down.contains_key(*i))
            .map(|i| i.instance_id)
            .collect()
    }
}

/// An endpoint between [`DistributedRuntime::start_serving`] and
/// [`DistributedRuntime::stop_serving`].
pub(crate) struct Serving {
    server: Arc<Server>,
    path: String,
    instance: Instance,
    entry: Arc<EndpointEntry>,
    /// The endpoint's metrics (the health canary watches its response count).
    pub(crate) metrics: Arc<EndpointMetrics>,
    nats_ingress: CancellationToken,
    // Last: fields drop in declaration order, so a serve future dropped while serving
    // releases its drain count before it stops the NATS subject.
    drain_guard: DrainGuard,
    _nats_ingress_stop: DropGuard,
}

struct DrainGuard(Arc<Inner>);

impl Drop for DrainGuard {
    fn drop(&mut self) {
        if self.0.draining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.drained.notify_waiters();
        }
    }
}

async fn run_shutdown(inner: Arc<Inner>) {
    inner.endpoint_shutdown.cancel();
    let wait_drained = async {
        loop {
            let notified = inner.drained.notified();
            if inner.draining.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    };
    // Each endpoint bounds its own drain; this bound only guards against a stuck one.
    let bound = inner.config.graceful_shutdown_timeout + std::time::Duration::from_secs(1);
    let _ = tokio::time::timeout(bound, wait_drained).await;
    if let Some(server) = inner.server.get() {
        server.close();
        server.flushed(std::time::Duration::from_secs(1)).await;
    }
    inner.pool.close_all().await;
    if let Some(nats) = inner.nats.get() {
        // `flush` resolves once the server has everything published so far (the last
        // response frames, events): `drain` alone only queues an unsubscribe-and-close
        // command and returns, and the process may exit before the frames are written.
        // Then close: no reconnection attempts after shutdown.
        let bound = std::time::Duration::from_secs(1);
        if tokio::time::timeout(bound, nats.flush()).await.is_err() {
            tracing::warn!("NATS flush at shutdown timed out; the last messages may be lost");
        }
        let _ = tokio::time::timeout(bound, nats.drain()).await;
    }
    inner.discovery.shutdown().await;
    inner.primary.cancel();
}
