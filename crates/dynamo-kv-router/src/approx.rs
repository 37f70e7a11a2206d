//! The approximate indexer: a KV index for engines that publish no KV events.
//!
//! After the router sends a prompt to a worker rank it assumes the rank now caches the
//! prompt's complete blocks, and records them as if the rank had sent a `stored` event
//! (parent = root, `block_hash` = the router's chained
//! [`SequenceHash`](crate::hashing::SequenceHash), `tokens_hash` = the local hash). The
//! assumption is only trusted for a time-to-live:
//!
//! * every recorded block expires `ttl` after the **latest** routing decision that covered
//!   it (default [`DEFAULT_TTL`], 120 s like the reference's `router_ttl_secs`); routing
//!   the same prefix again refreshes it;
//! * expiry is lazy: a min-heap of deadlines is drained at the start of each call that
//!   takes a clock reading (`find_matches`, `process_routing_decision`, `expire`); heap
//!   entries made stale by a refresh are skipped, and the heap is rebuilt when it holds
//!   more than [`HEAP_REBUILD_FACTOR`] times the live entries, so it stays bounded;
//! * the index is bounded: when it holds more than `max_size` `(rank, block)` pairs it is
//!   pruned down to `max_size * prune_target_ratio`, earliest expiry first and, among equal
//!   expiries, deepest first (leaves before their prefixes).
//!
//! Because a prefix is always refreshed together with (or after) its extensions, a block
//! never expires before its descendants on the same rank, so expiry and pruning only ever
//! remove leaves of a rank's chains.
//!
//! Time is passed in explicitly (`now: Instant`) so the behaviour is testable; the type is
//! not synchronized (wrap it in a mutex to share it).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use dynamo_kv_router::approx::ApproxIndexer;
//! use dynamo_kv_router::hashing::LocalBlockHash;
//! use dynamo_kv_router::protocols::WorkerWithDpRank;
//!
//! let mut idx = ApproxIndexer::new(Duration::from_secs(120), 1 << 20, 0.8);
//! let t0 = Instant::now();
//! let prompt = [LocalBlockHash(1), LocalBlockHash(2)];
//! let rank = WorkerWithDpRank::new(3, 0);
//! idx.process_routing_decision(rank, &prompt, t0);
//! assert_eq!(idx.find_matches(&prompt, t0).get(rank), Some(2));
//! assert!(idx.find_matches(&prompt, t0 + Duration::from_secs(121)).scores.is_empty());
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::hashing::{LocalBlockHash, compute_seq_hash_for_block};
use crate::indexer::{OverlapScores, RadixTree};
use crate::protocols::{ExternalSequenceBlockHash, KvCacheStoredBlockData, WorkerWithDpRank};

/// Default time a routed block is assumed cached (the reference's `router_ttl_secs`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(120);
/// Default bound on recorded `(rank, block)` pairs (the reference's `router_max_tree_size`,
/// 2^20: about 50 MB of index at worst, far more blocks than a rank's GPU holds).
pub const DEFAULT_MAX_SIZE: usize = 1 << 20;
/// Default fraction of `max_size` kept after pruning (the reference's
/// `router_prune_target_ratio`): pruning 20 % at once amortizes its sort.
pub const DEFAULT_PRUNE_TARGET_RATIO: f64 = 0.8;
/// The deadline heap is rebuilt from the live entries when it grows past this many times
/// their number (each refresh leaves one stale heap entry behind).
pub const HEAP_REBUILD_FACTOR: usize = 50;

type Key = (WorkerWithDpRank, u64);

/// Routing-decision-driven KV index with TTL expiry and size pruning.
#[derive(Debug)]
pub struct ApproxIndexer {
    tree: RadixTree,
    ttl: Duration,
    max_size: usize,
    prune_target_ratio: f64,
    /// Live recorded block -> (deadline, depth from the root, 1-based).
    entries: FxHashMap<Key, (Instant, u32)>,
    /// Deadlines, possibly stale (an entry is live only if `entries` holds the same deadline).
    timers: BinaryHeap<Reverse<(Instant, Key)>>,
}

impl Default for ApproxIndexer {
    fn default() -> Self {
        Self::new(DEFAULT_TTL, DEFAULT_MAX_SIZE, DEFAULT_PRUNE_TARGET_RATIO)
    }
}

impl ApproxIndexer {
    /// An empty index. `max_size` is clamped to at least 1 and `prune_target_ratio` to
    /// `[0, 1]`.
    pub fn new(ttl: Duration, max_size: usize, prune_target_ratio: f64) -> Self {
        Self {
            tree: RadixTree::default(),
            ttl,
            max_size: max_size.max(1),
            prune_target_ratio: if prune_target_ratio.is_finite() {
                prune_target_ratio.clamp(0.0, 1.0)
            } else {
                DEFAULT_PRUNE_TARGET_RATIO
            },
            entries: FxHashMap::default(),
            timers: BinaryHeap::new(),
        }
    }

    /// The time-to-live of a routing decision.
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Number of recorded `(rank, block)` pairs.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    /// Number of tree nodes (for memory checks).
    pub fn node_count(&self) -> usize {
        self.tree.node_count()
    }

    /// Record that the prompt with these local block hashes was routed to `worker` at
    /// `now`: every block is assumed cached there until `now + ttl`.
    pub fn process_routing_decision(
        &mut self,
        worker: WorkerWithDpRank,
        local_hashes: &[LocalBlockHash],
        now: Instant,
    ) {
        self.expire(now);
        if local_hashes.is_empty() {
            return;
        }
        let seq = compute_seq_hash_for_block(local_hashes);
        let blocks: Vec<KvCacheStoredBlockData> = seq
            .iter()
            .zip(local_hashes)
            .map(|(s, l)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash(s.0),
                tokens_hash: *l,
                mm_extra_info: None,
            })
            .collect();
        // A root-anchored store cannot be rejected: it has no parent to look up.
        if self.tree.store_blocks(worker, None, &blocks).is_err() {
            return;
        }
        let deadline = now + self.ttl;
        for (i, s) in seq.iter().enumerate() {
            let key = (worker, s.0);
            self.entries.insert(key, (deadline, i as u32 + 1));
            self.timers.push(Reverse((deadline, key)));
        }
        if self.timers.len() > HEAP_REBUILD_FACTOR * self.entries.len().max(1) {
            self.timers = self
                .entries
                .iter()
                .map(|(&k, &(t, _))| Reverse((t, k)))
                .collect();
        }
        self.prune();
    }

    /// Scores of the ranks predicted to hold a prefix of `local_hashes` at `now`.
    pub fn find_matches(&mut self, local_hashes: &[LocalBlockHash], now: Instant) -> OverlapScores {
        self.expire(now);
        self.tree.find_matches(local_hashes, false)
    }

    /// Drop every block whose deadline is at or before `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some(Reverse((t, key))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            if self.entries.get(&key).is_some_and(|&(live, _)| live == t) {
                self.entries.remove(&key);
                // The block is recorded, so the remove cannot miss.
                let _ = self.tree.remove(key.0, &[key.1]);
            }
        }
    }

    /// Forget every block of every rank of `worker_id`.
    pub fn remove_worker(&mut self, worker_id: u64) {
        self.tree.remove_worker(worker_id);
        self.entries.retain(|(w, _), _| w.worker_id != worker_id);
    }

    fn prune(&mut self) {
        if self.tree.len() <= self.max_size {
            return;
        }
        let target = (self.max_size as f64 * self.prune_target_ratio) as usize;
        let mut all: Vec<(Instant, Reverse<u32>, Key)> = self
            .entries
            .iter()
            .map(|(&k, &(t, d))| (t, Reverse(d), k))
            .collect();
        all.sort_unstable();
        let excess = self.tree.len().saturating_sub(target);
        for &(_, _, key) in all.iter().take(excess) {
            self.entries.remove(&key);
            let _ = self.tree.remove(key.0, &[key.1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(xs: &[u64]) -> Vec<LocalBlockHash> {
        xs.iter().map(|&x| LocalBlockHash(x)).collect()
    }

    const A: WorkerWithDpRank = WorkerWithDpRank::new(1, 0);
    const B: WorkerWithDpRank = WorkerWithDpRank::new(2, 0);

    #[test]
    fn routed_blocks_expire_after_ttl() {
        let mut idx = ApproxIndexer::new(Duration::from_secs(10), 100, 0.8);
        let t0 = Instant::now();
        idx.process_routing_decision(A, &l(&[1, 2, 3]), t0);
        assert_eq!(idx.find_matches(&l(&[1, 2, 3, 4]), t0).get(A), Some(3));
        assert_eq!(
            idx.find_matches(&l(&[1, 2]), t0 + Duration::from_secs(9))
                .get(A),
            Some(2)
        );
        assert!(
            idx.find_matches(&l(&[1]), t0 + Duration::from_secs(10))
                .scores
                .is_empty()
        );
        assert_eq!((idx.len(), idx.node_count()), (0, 0));
    }

    #[test]
    fn rerouting_refreshes_the_shared_prefix_only() {
        let mut idx = ApproxIndexer::new(Duration::from_secs(10), 100, 0.8);
        let t0 = Instant::now();
        idx.process_routing_decision(A, &l(&[1, 2, 3]), t0);
        idx.process_routing_decision(A, &l(&[1, 2, 9]), t0 + Duration::from_secs(5));
        let t = t0 + Duration::from_secs(11);
        assert_eq!(idx.find_matches(&l(&[1, 2, 3]), t).get(A), Some(2));
        assert_eq!(idx.find_matches(&l(&[1, 2, 9]), t).get(A), Some(3));
        assert!(
            idx.find_matches(&l(&[1]), t0 + Duration::from_secs(15))
                .scores
                .is_empty()
        );
        assert_eq!(idx.len(), 0);
    }

    #[test]
    fn pruning_evicts_oldest_then_deepest() {
        let mut idx = ApproxIndexer::new(Duration::from_secs(100), 6, 0.5);
        let t0 = Instant::now();
        idx.process_routing_decision(A, &l(&[1, 2, 3]), t0);
        idx.process_routing_decision(B, &l(&[7, 8, 9]), t0 + Duration::from_secs(1));
        assert_eq!(idx.len(), 6);
        // One more block exceeds 6: prune to 3, the oldest (A's) first, deepest first.
        idx.process_routing_decision(B, &l(&[7, 8, 9, 10]), t0 + Duration::from_secs(2));
        assert_eq!(idx.len(), 3);
        let now = t0 + Duration::from_secs(3);
        assert!(idx.find_matches(&l(&[1]), now).scores.is_empty());
        assert_eq!(idx.find_matches(&l(&[7, 8, 9, 10]), now).get(B), Some(3));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Route(u64, Vec<u64>, u64),
        Query(Vec<u64>, u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let path = proptest::collection::vec(0u64..3, 0..5);
        prop_oneof![
            (0u64..3, path.clone(), 0u64..4).prop_map(|(w, p, dt)| Op::Route(w, p, dt)),
            (path, 0u64..4).prop_map(|(p, dt)| Op::Query(p, dt)),
        ]
    }

    proptest::proptest! {
        /// Against a model: per rank, path -> deadline of its latest routing; a rank scores
        /// the longest prefix of the query whose every step is still alive.
        #[test]
        fn approx_indexer_matches_ttl_model(ops in proptest::collection::vec(op(), 1..60)) {
            let ttl = Duration::from_secs(5);
            let mut idx = ApproxIndexer::new(ttl, 1 << 20, 0.8);
            let mut model: std::collections::HashMap<u64, std::collections::HashMap<Vec<u64>, Instant>> =
                Default::default();
            let t0 = Instant::now();
            let mut now = t0;
            for op in ops {
                match op {
                    Op::Route(w, p, dt) => {
                        now += Duration::from_secs(dt);
                        idx.process_routing_decision(WorkerWithDpRank::new(w, 0), &l(&p), now);
                        let m = model.entry(w).or_default();
                        for k in 1..=p.len() {
                            m.insert(p[..k].to_vec(), now + ttl);
                        }
                    }
                    Op::Query(q, dt) => {
                        now += Duration::from_secs(dt);
                        let got: std::collections::BTreeMap<u64, u32> = idx
                            .find_matches(&l(&q), now)
                            .scores
                            .iter()
                            .map(|(w, s)| (w.worker_id, *s))
                            .collect();
                        let mut want = std::collections::BTreeMap::new();
                        for (w, m) in &model {
                            let k = (1..=q.len())
                                .take_while(|&k| m.get(&q[..k]).is_some_and(|&d| d > now))
                                .count();
                            if k > 0 {
                                want.insert(*w, k as u32);
                            }
                        }
                        proptest::prop_assert_eq!(got, want);
                    }
                }
                idx.tree.check_invariants();
            }
            idx.expire(now + ttl);
            proptest::prop_assert_eq!((idx.len(), idx.node_count()), (0, 0));
        }

        #[test]
        fn approx_indexer_stays_within_its_size_bound(
            routes in proptest::collection::vec((0u64..4, proptest::collection::vec(0u64..6, 1..6)), 1..80)
        ) {
            let mut idx = ApproxIndexer::new(Duration::from_secs(100), 12, 0.5);
            let t0 = Instant::now();
            for (i, (w, p)) in routes.into_iter().enumerate() {
                idx.process_routing_decision(WorkerWithDpRank::new(w, 0), &l(&p), t0 + Duration::from_millis(i as u64));
                proptest::prop_assert!(idx.len() <= 12);
                idx.tree.check_invariants();
                // The most recent decision is never pruned away entirely.
                proptest::prop_assert!(idx.find_matches(&l(&p), t0 + Duration::from_millis(i as u64)).get(WorkerWithDpRank::new(w, 0)).is_some());
            }
        }
    }

    #[test]
    fn stale_timers_stay_bounded_and_remove_worker_forgets() {
        let mut idx = ApproxIndexer::new(Duration::from_secs(1000), 1000, 0.8);
        let t0 = Instant::now();
        for i in 0..500 {
            idx.process_routing_decision(A, &l(&[1, 2]), t0 + Duration::from_millis(i));
        }
        assert!(idx.timers.len() <= HEAP_REBUILD_FACTOR * 2 + 2);
        idx.process_routing_decision(B, &l(&[1]), t0);
        idx.remove_worker(1);
        assert_eq!(idx.len(), 1);
        assert_eq!(idx.find_matches(&l(&[1, 2]), t0).get(B), Some(1));
    }
}
