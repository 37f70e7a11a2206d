//! Service discovery: which instances serve which endpoint.
//!
//! [`Discovery`] is the interface the runtime uses (register, unregister, list, watch).
//! [`KvDiscovery`] implements it over any [`KvStore`], with the reference's key layout
//! `v1/instances/{ns}/{component}/{endpoint}/{instance_id:x}` and the [`Instance`] as its
//! JSON value. Two stores exist today:
//!
//! * [`mem::MemStore`]: process-wide, for one process (tests, benchmarks, in-process
//!   frontends);
//! * [`file::FileStore`]: a directory of leased files shared by the processes of one
//!   machine (`DYN_FILE_KV`).
//!
//! * [`etcd::EtcdStore`]: etcd, with one lease per process (the lease id is the instance
//!   id) and keep-alive; `changes()` is fed by an etcd watch.

pub mod etcd;
pub mod file;
pub mod mem;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::names::EndpointId;

/// Period of the safety-net re-list of every watch (see [`Discovery::watch`]).
pub const RELIST_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A boxed, sendable future (the traits here must be object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How to reach an instance. Serialized as the reference's tagged form,
/// `{"tcp": "host:port/ns/comp/ep"}` or `{"nats_tcp": "<subject>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportAddress {
    /// The TCP request plane: `host:port/endpoint-path`.
    Tcp(String),
    /// The NATS request plane: the instance's subject.
    NatsTcp(String),
}

impl TransportAddress {
    /// `"tcp"` or `"nats_tcp"`.
    pub fn kind(&self) -> &'static str {
        match self {
            TransportAddress::Tcp(_) => "tcp",
            TransportAddress::NatsTcp(_) => "nats_tcp",
        }
    }

    /// The address string.
    pub fn address(&self) -> &str {
        match self {
            TransportAddress::Tcp(a) | TransportAddress::NatsTcp(a) => a,
        }
    }
}

/// One process serving one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Instance {
    /// Namespace of the endpoint.
    pub namespace: String,
    /// Component of the endpoint.
    pub component: String,
    /// Endpoint name.
    pub endpoint: String,
    /// The serving process's discovery id.
    pub instance_id: u64,
    /// How to reach it.
    pub transport: TransportAddress,
    /// `"cpu"`, `"cuda"` or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_type: Option<String>,
    /// The payload codec of its request plane (`"msgpack"`, as the reference advertises;
    /// see `transport::codec`). Absent in entries written by older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_plane_codec: Option<String>,
}

impl Instance {
    /// The record of instance `instance_id` of `endpoint`, reached at `transport` (no
    /// device type, no codec advertised).
    pub fn new(endpoint: &EndpointId, instance_id: u64, transport: TransportAddress) -> Self {
        Self {
            namespace: endpoint.namespace.clone(),
            component: endpoint.component.clone(),
            endpoint: endpoint.name.clone(),
            instance_id,
            transport,
            device_type: None,
            request_plane_codec: None,
        }
    }

    /// The discovery key of this instance.
    pub fn key(&self) -> String {
        format!(
            "v1/instances/{}/{}/{}/{:x}",
            self.namespace, self.component, self.endpoint, self.instance_id
        )
    }
}

/// A key-value store with ownership: keys put by a store handle belong to its process and
/// disappear when the process stops (deleted on shutdown, or expired by a lease/TTL when
/// the process dies).
pub trait KvStore: Send + Sync + 'static {
    /// Create or replace an owned key.
    fn put(&self, key: &str, value: &str) -> BoxFuture<'_, Result<()>>;
    /// Delete a key (owned or not; deleting an absent key is not an error).
    fn delete(&self, key: &str) -> BoxFuture<'_, Result<()>>;
    /// All live `(key, value)` pairs under `prefix`, sorted by key.
    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, String)>>>;
    /// A counter that changes whenever any key may have changed; watchers re-list.
    fn changes(&self) -> watch::Receiver<u64>;
    /// Delete the owned keys and stop background work.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}

/// Discovery of endpoint instances.
pub trait Discovery: Send + Sync + 'static {
    /// This process's instance id (the lease id in etcd, random for file and mem).
    fn instance_id(&self) -> u64;
    /// Publish an instance.
    fn register(&self, instance: &Instance) -> BoxFuture<'_, Result<()>>;
    /// Withdraw an instance.
    fn unregister(&self, instance: &Instance) -> BoxFuture<'_, Result<()>>;
    /// The current instances of an endpoint, sorted by instance id.
    fn list(&self, endpoint: &EndpointId) -> BoxFuture<'_, Result<Vec<Instance>>>;
    /// A live view of the instances of an endpoint. Must be called inside the tokio runtime.
    fn watch(&self, endpoint: &EndpointId) -> watch::Receiver<Arc<Vec<Instance>>>;
    /// Withdraw everything this process registered and stop background work.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}

/// [`Discovery`] over a [`KvStore`].
pub struct KvDiscovery {
    store: Arc<dyn KvStore>,
    instance_id: u64,
}

impl KvDiscovery {
    /// Discovery over `store`, identifying this process as `instance_id`.
    pub fn new(store: Arc<dyn KvStore>, instance_id: u64) -> Self {
        Self { store, instance_id }
    }
}

pub(crate) async fn list_instances(store: &dyn KvStore, prefix: &str) -> Result<Vec<Instance>> {
    let mut out: Vec<Instance> = store
        .list(prefix)
        .await?
        .into_iter()
        .filter_map(|(key, value)| match serde_json::from_str(&value) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::warn!(%key, error = %e, "ignoring malformed discovery entry");
                None
            }
        })
        .collect();
    out.sort_by_key(|i| i.instance_id);
    Ok(out)
}

impl Discovery for KvDiscovery {
    fn instance_id(&self) -> u64 {
        self.instance_id
    }

    fn register(&self, instance: &Instance) -> BoxFuture<'_, Result<()>> {
        let key = instance.key();
        let value = serde_json::to_string(instance).map_err(|e| Error::Discovery(e.to_string()));
        Box::pin(async move { self.store.put(&key, &value?).await })
    }

    fn unregister(&self, instance: &Instance) -> BoxFuture<'_, Result<()>> {
        let key = instance.key();
        Box::pin(async move { self.store.delete(&key).await })
    }

    fn list(&self, endpoint: &EndpointId) -> BoxFuture<'_, Result<Vec<Instance>>> {
        let prefix = endpoint.instances_prefix();
        Box::pin(async move { list_instances(self.store.as_ref(), &prefix).await })
    }

    fn watch(&self, endpoint: &EndpointId) -> watch::Receiver<Arc<Vec<Instance>>> {
        let (tx, rx) = watch::channel(Arc::new(Vec::new()));
        let store = Arc::clone(&self.store);
        let prefix = endpoint.instances_prefix();
        let mut changes = store.changes();
        tokio::spawn(async move {
            loop {
                changes.mark_unchanged();
                match list_instances(store.as_ref(), &prefix).await {
                    Ok(list) => {
                        tx.send_if_modified(|cur| {
                            if **cur == list {
                                false
                            } else {
                                *cur = Arc::new(list);
                                true
                            }
                        });
                    }
                    Err(e) => tracing::warn!(error = %e, "discovery list failed"),
                }
                // The periodic re-list is a safety net: a backend that misses a change
                // notification costs at most this much staleness.
                tokio::select! {
                    r = changes.changed() => if r.is_err() { break },
                    () = tx.closed() => break,
                    () = tokio::time::sleep(RELIST_INTERVAL) => {}
                }
            }
        });
        rx
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.store.shutdown()
    }
}

/// A live view of every `(key, value)` under `prefix` of `store`, sorted by key: re-listed
/// on every change notification of the store, and every [`RELIST_INTERVAL`] as a safety
/// net. The task ends when every receiver is dropped. Must be called inside the tokio
/// runtime.
pub fn watch_prefix(
    store: Arc<dyn KvStore>,
    prefix: String,
) -> watch::Receiver<Arc<Vec<(String, String)>>> {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    let mut changes = store.changes();
    tokio::spawn(async move {
        loop {
            changes.mark_unchanged();
            match store.list(&prefix).await {
                Ok(list) => {
                    tx.send_if_modified(|cur| {
                        if **cur == list {
                            false
                        } else {
                            *cur = Arc::new(list);
                            true
                        }
                    });
                }
                Err(e) => tracing::warn!(error = %e, %prefix, "discovery list failed"),
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { break },
                () = tx.closed() => break,
                () = tokio::time::sleep(RELIST_INTERVAL) => {}
            }
        }
    });
    rx
}

/// A random, non-zero instance id that is exact in JSON numbers (53 bits).
pub fn random_instance_id() -> u64 {
    loop {
        let id = fastrand::u64(..) & ((1 << 53) - 1);
        if id != 0 {
            return id;
        }
    }
}
