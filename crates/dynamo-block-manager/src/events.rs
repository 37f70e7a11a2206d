//! KV events: what the router learns about cached prefixes.
//!
//! The block manager reports prefixes, not copies: one [`KvCacheEventData::Stored`] when a
//! sequence hash is first registered in *any* tier, and one [`KvCacheEventData::Removed`]
//! when its last copy is gone from every tier. A host copy made by offload therefore
//! publishes nothing, and evicting the device copy while the host copy lives publishes
//! nothing either.
//!
//! The types serialise to the router's wire shape
//! (`{"event_id":N,"data":{"stored":{"parent_hash":H|null,"blocks":[{"block_hash":H,
//! "tokens_hash":H}]}}}`, `{"removed":{"block_hashes":[...]}}`), where `block_hash` is the
//! sequence hash and `tokens_hash` the local block hash. Delivery goes through an
//! [`EventSink`]. This crate does not depend on the runtime: the sink that publishes on the
//! event plane, where KV routers consume the events, is
//! `dynamo_llm::kv_routing::BlockManagerEventSink`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use dynamo_kv_router::hashing::{LocalBlockHash, SequenceHash};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// One stored block of a [`KvCacheEventData::Stored`] event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBlock {
    /// The block's sequence hash.
    pub block_hash: SequenceHash,
    /// The block's local (content) hash.
    pub tokens_hash: LocalBlockHash,
}

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KvCacheEventData {
    /// Blocks were stored; `parent_hash` is the sequence hash of the block before the first.
    Stored {
        /// Sequence hash of the parent block, `None` for a sequence's first block.
        parent_hash: Option<SequenceHash>,
        /// The stored blocks, in sequence order.
        blocks: Vec<StoredBlock>,
    },
    /// Blocks were removed.
    Removed {
        /// Sequence hashes of the removed blocks.
        block_hashes: Vec<SequenceHash>,
    },
    /// Everything was removed.
    Cleared,
}

/// One event with its per-worker sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheEvent {
    /// Increases by one per event of this worker, starting at 0.
    pub event_id: u64,
    /// The change.
    pub data: KvCacheEventData,
}

/// An event tagged with the worker that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterEvent {
    /// The block manager's worker id.
    pub worker_id: u64,
    /// The event.
    pub event: KvCacheEvent,
}

/// Receives events. Called synchronously, in event-id order, while the registry lock is
/// held: implementations must be quick and must not call back into the block manager.
pub trait EventSink: Send + Sync {
    /// Deliver one event.
    fn publish(&self, event: RouterEvent);
}

/// Drops every event.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullEventSink;

impl EventSink for NullEventSink {
    fn publish(&self, _event: RouterEvent) {}
}

/// Keeps every event in memory (tests, debugging).
#[derive(Debug, Default)]
pub struct RecordingEventSink {
    events: Mutex<Vec<RouterEvent>>,
}

impl RecordingEventSink {
    /// Remove and return the events received so far.
    pub fn take(&self) -> Vec<RouterEvent> {
        std::mem::take(&mut *self.events.lock())
    }
}

impl EventSink for RecordingEventSink {
    fn publish(&self, event: RouterEvent) {
        self.events.lock().push(event);
    }
}

/// The registration of one sequence hash, shared by every copy of the block in every tier.
/// Creating the first one publishes Stored; dropping the last one publishes Removed.
#[derive(Debug)]
pub struct RegistrationHandle {
    sequence_hash: SequenceHash,
    registry: Arc<RegistryInner>,
}

impl RegistrationHandle {
    /// The registered sequence hash.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.sequence_hash
    }
}

struct RegistryInner {
    worker_id: u64,
    sink: Arc<dyn EventSink>,
    next_event_id: AtomicU64,
    live: Mutex<HashMap<SequenceHash, Weak<RegistrationHandle>>>,
}

impl std::fmt::Debug for RegistryInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryInner")
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

impl RegistryInner {
    fn emit(&self, data: KvCacheEventData) {
        let event_id = self.next_event_id.fetch_add(1, Ordering::Relaxed);
        self.sink.publish(RouterEvent {
            worker_id: self.worker_id,
            event: KvCacheEvent { event_id, data },
        });
    }
}

/// The registry shared by all pools of one block manager: sequence hash → live registration.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<RegistryInner>,
}

impl Registry {
    /// A registry that reports to `sink` as `worker_id`.
    pub fn new(worker_id: u64, sink: Arc<dyn EventSink>) -> Self {
        Self {
            inner: Arc::new(RegistryInner {
                worker_id,
                sink,
                next_event_id: AtomicU64::new(0),
                live: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The registration of `sequence_hash`: the live one if any tier holds the prefix,
    /// otherwise a new one, announced with a Stored event.
    pub fn register(
        &self,
        sequence_hash: SequenceHash,
        tokens_hash: LocalBlockHash,
        parent_hash: Option<SequenceHash>,
    ) -> Arc<RegistrationHandle> {
        let mut live = self.inner.live.lock();
        let announced = match live.get(&sequence_hash) {
            Some(weak) => match weak.upgrade() {
                Some(handle) => return handle,
                // The last handle is being dropped but has not reached the lock yet: the
                // prefix is still announced, so the new handle takes over without a Stored
                // event and the dying one will see a live entry and publish no Removed.
                None => true,
            },
            None => false,
        };
        let handle = Arc::new(RegistrationHandle {
            sequence_hash,
            registry: self.inner.clone(),
        });
        live.insert(sequence_hash, Arc::downgrade(&handle));
        if !announced {
            self.inner.emit(KvCacheEventData::Stored {
                parent_hash,
                blocks: vec![StoredBlock {
                    block_hash: sequence_hash,
                    tokens_hash,
                }],
            });
        }
        handle
    }

    /// Whether any tier holds `sequence_hash`.
    pub fn is_registered(&self, sequence_hash: SequenceHash) -> bool {
        self.inner
            .live
            .lock()
            .get(&sequence_hash)
            .is_some_and(|w| w.strong_count() > 0)
    }
}

impl Drop for RegistrationHandle {
    fn drop(&mut self) {
        let mut live = self.registry.live.lock();
        // Invariant: the map has an entry for a hash exactly while the hash is announced
        // (a Stored was published and no Removed since). A live entry means a registration
        // created after our strong count hit zero took over the announcement; no entry means
        // another dying handle already published the Removed. Only a dead entry (ours, or
        // one that took over from us and died too) is removed, with one Removed event.
        let dead = live
            .get(&self.sequence_hash)
            .is_some_and(|w| w.strong_count() == 0);
        if dead {
            live.remove(&self.sequence_hash);
            self.registry.emit(KvCacheEventData::Removed {
                block_hashes: vec![self.sequence_hash],
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stored_per_prefix_and_one_removed_when_last_copy_goes() {
        let sink = Arc::new(RecordingEventSink::default());
        let reg = Registry::new(7, sink.clone());
        let a = reg.register(SequenceHash(1), LocalBlockHash(11), None);
        let b = reg.register(SequenceHash(1), LocalBlockHash(11), None);
        let events = sink.take();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].worker_id, 7);
        assert_eq!(events[0].event.event_id, 0);
        drop(a);
        assert!(sink.take().is_empty());
        assert!(reg.is_registered(SequenceHash(1)));
        drop(b);
        let events = sink.take();
        assert_eq!(
            events[0].event.data,
            KvCacheEventData::Removed {
                block_hashes: vec![SequenceHash(1)]
            }
        );
        assert_eq!(events[0].event.event_id, 1);
        assert!(!reg.is_registered(SequenceHash(1)));
    }

    #[test]
    fn events_have_the_router_wire_shape() {
        let ev = KvCacheEvent {
            event_id: 3,
            data: KvCacheEventData::Stored {
                parent_hash: None,
                blocks: vec![StoredBlock {
                    block_hash: SequenceHash(5),
                    tokens_hash: LocalBlockHash(6),
                }],
            },
        };
        assert_eq!(
            serde_json::to_string(&ev).unwrap(),
            r#"{"event_id":3,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":5,"tokens_hash":6}]}}}"#
        );
        let removed = KvCacheEventData::Removed {
            block_hashes: vec![SequenceHash(9)],
        };
        assert_eq!(
            serde_json::to_string(&removed).unwrap(),
            r#"{"removed":{"block_hashes":[9]}}"#
        );
        assert_eq!(
            serde_json::to_string(&KvCacheEventData::Cleared).unwrap(),
            r#""cleared""#
        );
    }
}
