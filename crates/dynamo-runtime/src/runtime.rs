//! [`DistributedRuntime`]: discovery, the request-plane server and connection pool, served
//! endpoints, and the shutdown sequence.
//!
//! Shutdown ([`DistributedRuntime::shutdown`]) runs once, in three phases as in the
//! reference:
//! 1. every served endpoint stops accepting and withdraws its instance from discovery;
//! 2. graceful endpoints wait for their in-flight streams (bounded by
//!    `graceful_shutdown_timeout`);
//! 3. the listener and every connection close, discovery withdraws what is left, and the
//!    `serve_endpoint` futures resolve.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::CancellationToken;

use crate::config::{DiscoveryBackend, RequestPlane, RuntimeConfig};
use crate::context::lock;
use crate::discovery::file::FileStore;
use crate::discovery::mem::MemStore;
use crate::discovery::{
    Discovery, Instance, KvDiscovery, KvStore, TransportAddress, random_instance_id,
};
use crate::error::{Error, Result};
use crate::names::EndpointId;
use crate::router::Client;
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
    store: Arc<dyn KvStore>,
    server: OnceCell<Arc<Server>>,
    pub(crate) pool: ConnectionPool,
    endpoint_shutdown: CancellationToken,
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
    /// A runtime with the given backends. Only the embedded backends exist in this build:
    /// discovery `mem` or `file`, request plane `tcp`.
    pub fn new(
        discovery: DiscoveryBackend,
        request_plane: RequestPlane,
        config: RuntimeConfig,
    ) -> Result<Self> {
        if request_plane != RequestPlane::Tcp {
            return Err(Error::InvalidArgument(
                "request plane 'nats' is not available in this build; use 'tcp'".into(),
            ));
        }
        let store: Arc<dyn KvStore> = match discovery {
            DiscoveryBackend::Mem => Arc::new(MemStore::new()),
            DiscoveryBackend::File => {
                Arc::new(FileStore::open(&config.file_kv_root, config.file_kv_ttl)?)
            }
            DiscoveryBackend::Etcd | DiscoveryBackend::Kubernetes => {
                return Err(Error::InvalidArgument(format!(
                    "discovery backend {discovery:?} is not available in this build; use 'file' \
                     (several local processes) or 'mem' (one process)"
                )));
            }
        };
        let discovery = Arc::new(KvDiscovery::new(Arc::clone(&store), random_instance_id()));
        let pool = ConnectionPool::new(config.max_message_size, config.connect_timeout);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                discovery,
                store,
                server: OnceCell::new(),
                pool,
                endpoint_shutdown: CancellationToken::new(),
                primary: CancellationToken::new(),
                served: Mutex::new(HashMap::new()),
                draining: AtomicUsize::new(0),
                drained: Notify::new(),
                shutdown_started: AtomicBool::new(false),
            }),
        })
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

    /// The key-value store behind discovery. Keys put here belong to this process and
    /// disappear with it (deleted on shutdown, expired by the lease/TTL if it dies), which is
    /// what model cards registered next to an instance need.
    pub fn kv_store(&self) -> &Arc<dyn KvStore> {
        &self.inner.store
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

    /// Serve `endpoint` with `handler` until the runtime shuts down. Resolves after the
    /// endpoint stopped, its in-flight streams drained (when `graceful`) and the runtime
    /// finished shutting down.
    pub async fn serve_endpoint(
        &self,
        endpoint: &EndpointId,
        handler: Arc<dyn Handler>,
        graceful: bool,
    ) -> Result<()> {
        self.serve_endpoint_until(endpoint, handler, graceful, CancellationToken::new())
            .await
    }

    /// [`DistributedRuntime::serve_endpoint`] that also stops when `stop` is cancelled:
    /// the endpoint alone then leaves discovery, drains (when `graceful`) and the future
    /// resolves without waiting for the runtime.
    pub async fn serve_endpoint_until(
        &self,
        endpoint: &EndpointId,
        handler: Arc<dyn Handler>,
        graceful: bool,
        stop: CancellationToken,
    ) -> Result<()> {
        if self.is_shutting_down() {
            return Err(Error::ShuttingDown);
        }
        let server = Arc::clone(self.server().await?);
        let path = endpoint.path();
        let instance = Instance {
            namespace: endpoint.namespace.clone(),
            component: endpoint.component.clone(),
            endpoint: endpoint.name.clone(),
            instance_id: self.connection_id(),
            transport: TransportAddress::Tcp(format!("{}/{}", server.address(), path)),
            device_type: None,
        };
        let entry = EndpointEntry::new(handler);
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
        tracing::debug!(endpoint = %endpoint, instance_id = instance.instance_id, "serving");
        let runtime_stopping = tokio::select! {
            () = self.inner.endpoint_shutdown.cancelled() => true,
            () = stop.cancelled() => false,
        };

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
        drop(drain_guard);
        if runtime_stopping {
            // Phase 3 is run by `shutdown`; resolve once it is done.
            self.inner.primary.cancelled().await;
        }
        Ok(())
    }

    fn served_instance(&self, endpoint: &EndpointId) -> Result<Instance> {
        lock(&self.inner.served)
            .get(&endpoint.path())
            .map(|s| s.instance.clone())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("endpoint {endpoint} is not served by this process"))
            })
    }

    /// Withdraw a served endpoint's instance from discovery ("sleep"); it keeps serving
    /// requests addressed to it directly.
    pub async fn unregister_endpoint_instance(&self, endpoint: &EndpointId) -> Result<()> {
        let instance = self.served_instance(endpoint)?;
        self.inner.discovery.unregister(&instance).await
    }

    /// Publish a served endpoint's instance again ("wake").
    pub async fn register_endpoint_instance(&self, endpoint: &EndpointId) -> Result<()> {
        let instance = self.served_instance(endpoint)?;
        if let Some(s) = lock(&self.inner.served).get(&endpoint.path()) {
            s.entry.set_accepting(true);
        }
        self.inner.discovery.register(&instance).await
    }

    /// A client of `endpoint`, following its instances live. Must be called inside the
    /// tokio runtime.
    pub fn client(&self, endpoint: &EndpointId) -> Client {
        Client::new(self.clone(), endpoint.clone())
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
    inner.discovery.shutdown().await;
    inner.primary.cancel();
}
