//! Which multimodal embedding keys each encode worker holds in its cache.
//!
//! * [`MultimodalEmbeddingCachePublisher`] (the encode worker) publishes each change as a
//!   delta on the event plane, channel `(endpoint scope, "multimodal_embedding_cache")`,
//!   payload `{worker_id: u64, update: {added_keys: [str], removed_keys: [str]}}` in the
//!   event codec (msgpack by default), as the reference does. A key both added and removed
//!   in one call cancels out; a delta that is empty after that is not sent.
//! * It also keeps its full key set in the discovery store, at
//!   `v1/mm_embedding_cache/{ns}/{component}/{endpoint}/{worker_id:x}` (JSON
//!   `{worker_id, publisher_id, sequence, keys}`, `sequence` being the event-plane sequence
//!   number of the last delta included, -1 for none), rewritten at most every
//!   [`SNAPSHOT_DEBOUNCE`]. The key is owned by the worker's process, so it disappears when
//!   the worker stops or dies. (Not in the reference, which has no late-join story.)
//! * [`MultimodalEmbeddingCacheIndex`] (the router) rebuilds the view: deltas are applied
//!   in sequence order per worker; a worker first seen mid-stream (the index started late)
//!   or after a lost event waits for a snapshot at least as new, then replays the deltas
//!   buffered after it. A worker whose snapshot key disappears is forgotten.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dynamo_runtime::discovery::watch_prefix;
use dynamo_runtime::events::{EventPublisher, EventScope};
use dynamo_runtime::{DistributedRuntime, EndpointId};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// Event-plane topic (endpoint scope).
pub const MM_CACHE_TOPIC: &str = "multimodal_embedding_cache";

/// Root of the snapshot keys in the discovery store.
pub const SNAPSHOT_ROOT: &str = "v1/mm_embedding_cache/";

/// Snapshots are rewritten at most this often: a late index waits about this long for a
/// current view, while a worker churning its cache does not rewrite etcd on every delta.
pub const SNAPSHOT_DEBOUNCE: Duration = Duration::from_millis(100);

/// Deltas buffered per worker while it waits for a snapshot (beyond that the oldest are
/// dropped; the next snapshot supersedes them anyway).
const MAX_PENDING: usize = 4096;

/// One cache mutation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheUpdate {
    /// Keys now cached.
    pub added_keys: Vec<String>,
    /// Keys no longer cached.
    pub removed_keys: Vec<String>,
}

/// The event payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheDelta {
    /// The encode worker (its instance id).
    pub worker_id: u64,
    /// The mutation.
    pub update: CacheUpdate,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Snapshot {
    worker_id: u64,
    publisher_id: u64,
    sequence: i64,
    keys: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn snapshot_prefix(endpoint: &EndpointId) -> String {
    format!(
        "{SNAPSHOT_ROOT}{}/{}/{}/",
        endpoint.namespace, endpoint.component, endpoint.name
    )
}

struct PubState {
    publisher: EventPublisher,
    worker_id: u64,
    keys: BTreeSet<String>,
    sequence: i64,
}

/// The encode worker's side. [`Self::create_endpoint`] must be called before publishing.
#[derive(Default)]
pub struct MultimodalEmbeddingCachePublisher {
    state: Arc<Mutex<Option<PubState>>>,
    dirty: Arc<Notify>,
    stop: CancellationToken,
}

impl Drop for MultimodalEmbeddingCachePublisher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl MultimodalEmbeddingCachePublisher {
    /// A publisher bound to nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bind to `endpoint`'s channel (worker id: this process's instance id) and start the
    /// snapshot writer.
    ///
    /// # Errors
    /// The event plane or the store fails.
    pub async fn create_endpoint(
        &self,
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
    ) -> Result<()> {
        let publisher = runtime
            .event_publisher(&EventScope::endpoint(endpoint), MM_CACHE_TOPIC)
            .await
            .map_err(|e| Error::Runtime(e.to_string()))?;
        let worker_id = runtime.connection_id();
        *lock(&self.state) = Some(PubState {
            publisher,
            worker_id,
            keys: BTreeSet::new(),
            sequence: -1,
        });
        let key = format!("{}{worker_id:x}", snapshot_prefix(endpoint));
        let (store, state, dirty, stop) = (
            Arc::clone(runtime.kv_store()),
            Arc::clone(&self.state),
            Arc::clone(&self.dirty),
            self.stop.clone(),
        );
        self.dirty.notify_one();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = dirty.notified() => {}
                    () = stop.cancelled() => return,
                }
                let snap = {
                    let st = lock(&state);
                    let Some(st) = st.as_ref() else { continue };
                    Snapshot {
                        worker_id: st.worker_id,
                        publisher_id: st.publisher.publisher_id(),
                        sequence: st.sequence,
                        keys: st.keys.iter().cloned().collect(),
                    }
                };
                match serde_json::to_string(&snap) {
                    Ok(v) => {
                        if let Err(e) = store.put(&key, &v).await {
                            tracing::warn!(error = %e, "multimodal cache snapshot not written");
                            dirty.notify_one(); // retry after the debounce
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "multimodal cache snapshot not encoded"),
                }
                tokio::select! {
                    () = tokio::time::sleep(SNAPSHOT_DEBOUNCE) => {}
                    () = stop.cancelled() => return,
                }
            }
        });
        Ok(())
    }

    /// Publish a mutation of this worker's cache.
    ///
    /// # Errors
    /// [`Error::Runtime`] before [`Self::create_endpoint`] or after shutdown.
    pub fn publish_delta(&self, added_keys: &[String], removed_keys: &[String]) -> Result<()> {
        let added: BTreeSet<&String> = added_keys.iter().collect();
        let removed: BTreeSet<&String> = removed_keys.iter().collect();
        let update = CacheUpdate {
            added_keys: added.difference(&removed).map(|k| (*k).clone()).collect(),
            removed_keys: removed.difference(&added).map(|k| (*k).clone()).collect(),
        };
        let mut st = lock(&self.state);
        let st = st.as_mut().ok_or_else(|| {
            Error::Runtime("multimodal embedding cache publisher not initialized".into())
        })?;
        if update.added_keys.is_empty() && update.removed_keys.is_empty() {
            return Ok(());
        }
        let delta = CacheDelta {
            worker_id: st.worker_id,
            update,
        };
        // Published under the lock, so the snapshot's sequence matches its key set.
        let seq = st
            .publisher
            .publish_value(&delta)
            .map_err(|e| Error::Runtime(e.to_string()))?;
        for k in &delta.update.removed_keys {
            st.keys.remove(k);
        }
        st.keys.extend(delta.update.added_keys.iter().cloned());
        st.sequence = i64::try_from(seq).unwrap_or(i64::MAX);
        self.dirty.notify_one();
        Ok(())
    }
}

#[derive(Default)]
struct WorkerView {
    keys: HashSet<String>,
    publisher_id: u64,
    /// Sequence of the last delta applied (-1: none).
    applied: i64,
    /// A snapshot set the baseline and no delta was lost since.
    synced: bool,
    /// The worker has (had) a snapshot key.
    snapshotted: bool,
    pending: BTreeMap<u64, (u64, CacheUpdate)>,
}

impl WorkerView {
    fn apply(&mut self, update: &CacheUpdate) {
        for k in &update.removed_keys {
            self.keys.remove(k);
        }
        self.keys.extend(update.added_keys.iter().cloned());
    }

    fn on_delta(&mut self, publisher_id: u64, seq: u64, update: CacheUpdate) {
        let s = i64::try_from(seq).unwrap_or(i64::MAX);
        if self.synced && publisher_id == self.publisher_id {
            if s == self.applied + 1 {
                self.apply(&update);
                self.applied = s;
                return;
            }
            if s <= self.applied {
                return;
            }
            self.synced = false; // a gap: wait for a newer snapshot
        }
        self.pending.insert(seq, (publisher_id, update));
        while self.pending.len() > MAX_PENDING {
            self.pending.pop_first();
        }
    }

    fn on_snapshot(&mut self, snap: &Snapshot) {
        self.snapshotted = true;
        let newer =
            !self.synced || snap.publisher_id != self.publisher_id || snap.sequence > self.applied;
        if !newer {
            return;
        }
        self.keys = snap.keys.iter().cloned().collect();
        self.publisher_id = snap.publisher_id;
        self.applied = snap.sequence;
        self.synced = true;
        let pending = std::mem::take(&mut self.pending);
        for (seq, (pid, update)) in pending {
            if pid != self.publisher_id || i64::try_from(seq).unwrap_or(i64::MAX) <= self.applied {
                continue;
            }
            self.on_delta(pid, seq, update);
        }
    }
}

#[derive(Default)]
struct IndexState {
    workers: HashMap<u64, WorkerView>,
}

/// The router's view of every encode worker's cache on one endpoint (dropping it stops it).
pub struct MultimodalEmbeddingCacheIndex {
    state: Arc<Mutex<IndexState>>,
    stop: CancellationToken,
}

impl Drop for MultimodalEmbeddingCacheIndex {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl MultimodalEmbeddingCacheIndex {
    /// Follow `endpoint`'s encode workers (subscribes before reading snapshots, so nothing
    /// falls between the two).
    ///
    /// # Errors
    /// The subscription fails.
    pub async fn start(runtime: &DistributedRuntime, endpoint: &EndpointId) -> Result<Self> {
        let mut sub = runtime
            .subscribe(&EventScope::endpoint(endpoint), MM_CACHE_TOPIC)
            .await
            .map_err(|e| Error::Runtime(e.to_string()))?;
        let prefix = snapshot_prefix(endpoint);
        let mut snaps = watch_prefix(Arc::clone(runtime.kv_store()), prefix);
        let state = Arc::new(Mutex::new(IndexState::default()));
        let stop = CancellationToken::new();
        let (st, token) = (Arc::clone(&state), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    () = token.cancelled() => return,
                    r = snaps.changed() => {
                        if r.is_err() { return }
                        let list = snaps.borrow_and_update().clone();
                        apply_snapshots(&mut lock(&st), &list);
                    }
                    e = sub.next() => {
                        let Some(e) = e else { return };
                        match e.decode::<CacheDelta>() {
                            Ok(d) => lock(&st)
                                .workers
                                .entry(d.worker_id)
                                .or_default()
                                .on_delta(e.publisher_id, e.sequence, d.update),
                            Err(err) => tracing::warn!(error = %err, "malformed multimodal cache delta dropped"),
                        }
                    }
                }
            }
        });
        Ok(Self { state, stop })
    }

    /// Workers known to hold `key`, sorted.
    pub fn holders(&self, key: &str) -> Vec<u64> {
        let st = lock(&self.state);
        let mut out: Vec<u64> = st
            .workers
            .iter()
            .filter(|(_, w)| w.synced && w.keys.contains(key))
            .map(|(id, _)| *id)
            .collect();
        out.sort_unstable();
        out
    }

    /// The keys of `worker_id`, sorted (`None` while its view is not known).
    pub fn keys(&self, worker_id: u64) -> Option<Vec<String>> {
        let st = lock(&self.state);
        let w = st.workers.get(&worker_id).filter(|w| w.synced)?;
        let mut keys: Vec<String> = w.keys.iter().cloned().collect();
        keys.sort();
        Some(keys)
    }

    /// Stop following the endpoint (idempotent); the view is kept as it was.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    /// Workers with a known view, sorted.
    pub fn workers(&self) -> Vec<u64> {
        let st = lock(&self.state);
        let mut out: Vec<u64> = st
            .workers
            .iter()
            .filter(|(_, w)| w.synced)
            .map(|(id, _)| *id)
            .collect();
        out.sort_unstable();
        out
    }
}

fn apply_snapshots(st: &mut IndexState, list: &[(String, String)]) {
    let mut present = HashSet::new();
    for (key, value) in list {
        match serde_json::from_str::<Snapshot>(value) {
            Ok(snap) => {
                present.insert(snap.worker_id);
                st.workers
                    .entry(snap.worker_id)
                    .or_default()
                    .on_snapshot(&snap);
            }
            Err(e) => tracing::warn!(%key, error = %e, "malformed multimodal cache snapshot"),
        }
    }
    // A worker whose snapshot key is gone stopped (or died: its lease expired).
    st.workers
        .retain(|id, w| present.contains(id) || !w.snapshotted);
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_runtime::RuntimeConfig;
    use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[test]
    fn late_views_wait_for_a_snapshot_then_replay() {
        let mut w = WorkerView::default();
        let up = |a: &[&str], r: &[&str]| CacheUpdate {
            added_keys: s(a),
            removed_keys: s(r),
        };
        // Joined late: deltas 5 and 6 arrive before any snapshot.
        w.on_delta(9, 5, up(&["e"], &[]));
        w.on_delta(9, 6, up(&[], &["a"]));
        assert!(!w.synced);
        w.on_snapshot(&Snapshot {
            worker_id: 1,
            publisher_id: 9,
            sequence: 4,
            keys: s(&["a", "b"]),
        });
        assert!(w.synced);
        let mut keys: Vec<_> = w.keys.iter().cloned().collect();
        keys.sort();
        assert_eq!(keys, s(&["b", "e"]));
        // A gap unsyncs until a newer snapshot.
        w.on_delta(9, 8, up(&["z"], &[]));
        assert!(!w.synced);
        w.on_snapshot(&Snapshot {
            worker_id: 1,
            publisher_id: 9,
            sequence: 8,
            keys: s(&["b", "e", "y", "z"]),
        });
        assert!(w.synced && w.keys.contains("y") && w.applied == 8);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn index_follows_deltas_late_start_and_worker_exit() {
        let drt = DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .unwrap();
        let ep = EndpointId::parse(&format!("mm{}.encoder.generate", fastrand::u32(..))).unwrap();
        let p = MultimodalEmbeddingCachePublisher::new();
        assert!(p.publish_delta(&s(&["a"]), &[]).is_err());
        p.create_endpoint(&drt, &ep).await.unwrap();
        let early = MultimodalEmbeddingCacheIndex::start(&drt, &ep)
            .await
            .unwrap();
        let wid = drt.connection_id();
        until("early view", || early.keys(wid).is_some()).await;
        p.publish_delta(&s(&["k1", "k2"]), &[]).unwrap();
        p.publish_delta(&[], &s(&["k1"])).unwrap();
        p.publish_delta(&s(&["k3"]), &s(&["k3"])).unwrap(); // cancels out
        until("early deltas", || early.keys(wid) == Some(s(&["k2"]))).await;
        // An index started now rebuilds the same view from the snapshot.
        let late = MultimodalEmbeddingCacheIndex::start(&drt, &ep)
            .await
            .unwrap();
        until("late view", || late.keys(wid) == Some(s(&["k2"]))).await;
        p.publish_delta(&s(&["k4"]), &[]).unwrap();
        until("late deltas", || late.holders("k4") == vec![wid]).await;
        assert_eq!(late.workers(), vec![wid]);
        // A stopped index keeps its last view and applies nothing more.
        early.shutdown();
        early.shutdown();
        p.publish_delta(&s(&["k5"]), &[]).unwrap();
        until("late sees k5", || late.holders("k5") == vec![wid]).await;
        assert!(early.holders("k5").is_empty());
        assert_eq!(early.holders("k4"), vec![wid]);
        drop(p);
        // The snapshot key is the worker's: deleting it (as its shutdown or lease expiry
        // would) makes the index forget the worker.
        drt.kv_store()
            .delete(&format!("{}{wid:x}", snapshot_prefix(&ep)))
            .await
            .unwrap();
        until("worker forgotten", || late.workers().is_empty()).await;
        drt.shutdown();
    }
}
