//! Simulated paged KV cache with prefix reuse and LRU eviction.
//!
//! Blocks are either *registered* (full, identified by their sequence hash, reusable by any
//! request with the same prefix) or *private* (a request's partially filled tail block, or
//! any block when prefix caching is off). Registered blocks with no holder stay cached until
//! evicted, least recently released first.
//!
//! Invariants (checked by the tests):
//! * `used() = registered + private <= capacity` at all times;
//! * the emitted events, applied in order to a radix-tree indexer, describe exactly the set
//!   of registered blocks: one `stored` when a block is first registered, one `removed` when
//!   it is evicted;
//! * releasing every holder and evicting everything returns the cache to empty.

use std::collections::BTreeMap;

use dynamo_kv_router::hashing::{LocalBlockHash, SequenceHash};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData,
};
use rustc_hash::FxHashMap;

#[derive(Debug, Clone)]
struct CachedBlock {
    refs: u32,
    /// Position in the LRU order while `refs == 0`.
    lru_tick: Option<u64>,
}

/// The KV cache of one simulated engine rank.
#[derive(Debug)]
pub struct KvCache {
    capacity: usize,
    prefix_caching: bool,
    blocks: FxHashMap<SequenceHash, CachedBlock>,
    lru: BTreeMap<u64, SequenceHash>,
    tick: u64,
    private: usize,
    events: Vec<KvCacheEventData>,
    /// With [`KvCache::record_tokens`]: for each entry of `events`, the token ids of its
    /// stored blocks, concatenated (empty for removals).
    event_tokens: Option<Vec<Vec<u32>>>,
}

impl KvCache {
    /// A cache of `capacity` blocks.
    pub fn new(capacity: usize, prefix_caching: bool) -> Self {
        Self {
            capacity,
            prefix_caching,
            blocks: FxHashMap::default(),
            lru: BTreeMap::new(),
            tick: 0,
            private: 0,
            events: Vec::new(),
            event_tokens: None,
        }
    }

    /// Also record the token ids of stored blocks (see [`KvCache::take_event_tokens`]), as
    /// engine-format KV events carry them.
    pub fn record_tokens(&mut self) {
        self.event_tokens.get_or_insert_with(Vec::new);
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks occupied (registered, held or not, plus private).
    pub fn used(&self) -> usize {
        self.blocks.len() + self.private
    }

    /// Blocks held by running requests (excludes cached blocks nobody holds).
    pub fn active(&self) -> usize {
        self.used() - self.lru.len()
    }

    /// Blocks that could be handed out now (free plus evictable).
    pub fn available(&self) -> usize {
        self.capacity - self.used() + self.lru.len()
    }

    /// Number of registered (reusable) blocks.
    pub fn registered(&self) -> usize {
        self.blocks.len()
    }

    /// Leading blocks of `hashes` present in the cache.
    pub fn match_prefix(&self, hashes: &[SequenceHash]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count()
    }

    /// Take a reference on a registered block found by [`KvCache::match_prefix`].
    pub fn acquire(&mut self, hash: SequenceHash) {
        if let Some(b) = self.blocks.get_mut(&hash) {
            if let Some(t) = b.lru_tick.take() {
                self.lru.remove(&t);
            }
            b.refs += 1;
        }
    }

    /// Make room for `n` new private blocks, evicting cached blocks if needed. All or
    /// nothing: returns `false` (and changes nothing) when `n` blocks cannot be found.
    pub fn reserve(&mut self, n: usize) -> bool {
        if n > self.available() {
            return false;
        }
        while self.capacity - self.used() < n {
            self.evict_one();
        }
        self.private += n;
        true
    }

    /// Release `n` private blocks.
    pub fn release_private(&mut self, n: usize) {
        self.private -= n.min(self.private);
    }

    /// Turn one private block, now full, into a registered block. If the same block is
    /// already registered (another request computed it meanwhile) the private copy is
    /// dropped and the existing block referenced instead.
    pub fn register(
        &mut self,
        hash: SequenceHash,
        local: LocalBlockHash,
        parent: Option<SequenceHash>,
        tokens: &[u32],
    ) {
        if !self.prefix_caching {
            // Without prefix caching the block stays private to its request.
            return;
        }
        self.private -= 1;
        if self.blocks.contains_key(&hash) {
            self.acquire(hash);
            return;
        }
        self.blocks.insert(
            hash,
            CachedBlock {
                refs: 1,
                lru_tick: None,
            },
        );
        self.push_stored(hash, local, parent, tokens);
    }

    /// Drop one reference on a registered block (or, without prefix caching, free one
    /// private block). Unreferenced blocks stay cached until evicted.
    pub fn release(&mut self, hash: SequenceHash) {
        if !self.prefix_caching {
            self.release_private(1);
            return;
        }
        let Some(b) = self.blocks.get_mut(&hash) else {
            return;
        };
        b.refs = b.refs.saturating_sub(1);
        if b.refs == 0 && b.lru_tick.is_none() {
            self.tick += 1;
            b.lru_tick = Some(self.tick);
            self.lru.insert(self.tick, hash);
        }
    }

    fn evict_one(&mut self) -> bool {
        let Some((_, hash)) = self.lru.pop_first() else {
            return false;
        };
        self.blocks.remove(&hash);
        let removed = ExternalSequenceBlockHash(hash.0);
        if let Some(KvCacheEventData::Removed(r)) = self.events.last_mut() {
            r.block_hashes.push(removed);
        } else {
            self.events
                .push(KvCacheEventData::Removed(KvCacheRemoveData {
                    block_hashes: vec![removed],
                }));
            if let Some(t) = &mut self.event_tokens {
                t.push(Vec::new());
            }
        }
        true
    }

    /// Evict every unreferenced cached block.
    pub fn evict_all_unreferenced(&mut self) {
        while self.evict_one() {}
    }

    fn push_stored(
        &mut self,
        hash: SequenceHash,
        local: LocalBlockHash,
        parent: Option<SequenceHash>,
        tokens: &[u32],
    ) {
        let block = KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(hash.0),
            tokens_hash: local,
            mm_extra_info: None,
        };
        // Extend the previous stored event when this block continues its chain.
        if let Some(KvCacheEventData::Stored(s)) = self.events.last_mut()
            && let Some(last) = s.blocks.last()
            && parent.map(|p| p.0) == Some(last.block_hash.0)
        {
            s.blocks.push(block);
            if let Some(t) = self.event_tokens.as_mut().and_then(|t| t.last_mut()) {
                t.extend_from_slice(tokens);
            }
            return;
        }
        self.events.push(KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(|p| ExternalSequenceBlockHash(p.0)),
            start_position: None,
            blocks: vec![block],
        }));
        if let Some(t) = &mut self.event_tokens {
            t.push(tokens.to_vec());
        }
    }

    /// Take the events produced since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvCacheEventData> {
        std::mem::take(&mut self.events)
    }

    /// With [`KvCache::record_tokens`]: take the token ids of the events returned by the
    /// last [`KvCache::take_events`] (one entry per event; call it right after).
    pub fn take_event_tokens(&mut self) -> Vec<Vec<u32>> {
        self.event_tokens
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}
