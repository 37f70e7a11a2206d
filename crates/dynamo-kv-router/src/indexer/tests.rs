//! Unit and model-based tests of the radix tree.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::Error;
use crate::protocols::{
    ExternalSequenceBlockHash, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, WorkerWithDpRank,
};

fn w(id: u64) -> WorkerWithDpRank {
    WorkerWithDpRank::new(id, 0)
}

fn q(locals: &[u64]) -> Vec<LocalBlockHash> {
    locals.iter().map(|&l| LocalBlockHash(l)).collect()
}

fn stored(parent: Option<u64>, blocks: &[(u64, u64)]) -> KvCacheStoreData {
    KvCacheStoreData {
        parent_hash: parent.map(ExternalSequenceBlockHash),
        start_position: None,
        blocks: blocks
            .iter()
            .map(|&(b, t)| KvCacheStoredBlockData::new(b, t))
            .collect(),
    }
}

fn sorted(s: &OverlapScores) -> BTreeMap<WorkerWithDpRank, u32> {
    s.scores.iter().copied().collect()
}

#[test]
fn shared_prefix_is_one_node_and_scores_are_prefix_depths() {
    let mut t = RadixTree::default();
    t.store(w(0), &stored(None, &[(10, 100), (11, 101), (12, 102)]))
        .expect("store");
    t.store(w(1), &stored(None, &[(20, 100), (21, 101)]))
        .expect("store");
    t.check_invariants();
    assert_eq!(t.node_count(), 3);
    assert_eq!(t.len(), 5);
    let s = t.find_matches(&q(&[100, 101, 102, 103]), false);
    assert_eq!(sorted(&s), BTreeMap::from([(w(0), 3), (w(1), 2)]));
    assert!(t.find_matches(&q(&[101]), false).scores.is_empty());
}

/// The query walk checks a chain four nodes at a time: a four-node group that runs past a
/// chain's last block into the next chain in the arena (same contents as the query asks
/// next, same holder count, another parent) must stop at the chain's end.
#[test]
fn the_walk_stops_where_a_chain_ends_inside_a_four_node_group() {
    let mut t = RadixTree::default();
    // Ids 1..=3, then ids 4..=7 (a root child, not a child of 3).
    t.store(w(0), &stored(None, &[(1, 10), (2, 11), (3, 12)]))
        .expect("store");
    t.store(w(1), &stored(None, &[(4, 13), (5, 14), (6, 15), (7, 16)]))
        .expect("store");
    t.check_invariants();
    let s = t.find_matches(&q(&[10, 11, 12, 13, 14, 15, 16]), false);
    assert_eq!(sorted(&s), BTreeMap::from([(w(0), 3)]));
}

/// A `BROKEN` node inside a four-node group of equal holder counts: the ranks below it
/// are not its ranks, so the walk must look at the holders there.
#[test]
fn the_walk_checks_holders_below_a_broken_node_inside_a_four_node_group() {
    let mut t = RadixTree::default();
    let chain = |base: u64| -> Vec<(u64, u64)> { (0..7).map(|k| (base + k, 30 + k)).collect() };
    t.store(w(0), &stored(None, &chain(100))).expect("store");
    t.store(w(1), &stored(None, &chain(200))).expect("store");
    // Rank 1 drops the first three blocks but keeps the rest: the third is `BROKEN`.
    t.remove(w(1), &[202, 201, 200]).expect("remove");
    // Rank 2 takes the first three: every block now has two holders, not the same two.
    t.store(w(2), &stored(None, &chain(300)[..3]))
        .expect("store");
    t.check_invariants();
    let s = t.find_matches(&q(&[30, 31, 32, 33, 34, 35, 36]), false);
    assert_eq!(sorted(&s), BTreeMap::from([(w(0), 7), (w(2), 3)]));
}

#[test]
fn unknown_parent_rejects_without_change() {
    let mut t = RadixTree::default();
    t.store(w(0), &stored(None, &[(10, 100)])).expect("store");
    let err = t
        .store(w(0), &stored(Some(99), &[(11, 101)]))
        .expect_err("unknown parent");
    assert_eq!(err, Error::ParentBlockNotFound { parent_hash: 99 });
    // Another worker's hash is not a valid parent either.
    let err = t.store(w(1), &stored(Some(10), &[(11, 101)]));
    assert!(matches!(err, Err(Error::ParentBlockNotFound { .. })));
    let err = t.store(w(0), &stored(Some(10), &[(10, 101)]));
    assert_eq!(err, Err(Error::InvalidBlockSequence));
    t.check_invariants();
    assert_eq!((t.node_count(), t.len(), t.worker_count()), (1, 1, 1));
    // Through `apply_event` the rejection is counted.
    let ev = KvCacheEvent {
        event_id: 1,
        dp_rank: 0,
        data: KvCacheEventData::Stored(stored(Some(99), &[(11, 101)])),
    };
    assert!(t.apply_event(0, &ev).is_err());
    assert_eq!(t.counters().parent_not_found, 1);
    assert_eq!(t.counters().applied, 0);
}

#[test]
fn removing_unknown_hash_is_a_reported_no_op() {
    let mut t = RadixTree::default();
    t.store(w(0), &stored(None, &[(10, 100), (11, 101)]))
        .expect("store");
    let err = t.remove(w(0), &[11, 99]).expect_err("99 unknown");
    assert_eq!(err, Error::BlockNotFound { missing: vec![99] });
    assert_eq!(t.len(), 1);
    assert_eq!(t.node_count(), 1);
    assert_eq!(t.remove(w(5), &[]), Ok(()));
    t.check_invariants();
}

#[test]
fn removing_everything_frees_every_node_and_returns_memory() {
    let empty = RadixTree::default().heap_bytes();
    let mut t = RadixTree::default();
    for wk in 0..4 {
        for s in 0..50u64 {
            let blocks: Vec<(u64, u64)> = (0..20)
                .map(|i| {
                    (
                        wk * 1_000_000 + s * 100 + i,
                        if i < 10 { i } else { s * 100 + i },
                    )
                })
                .collect();
            t.store(w(wk), &stored(None, &blocks)).expect("store");
        }
    }
    t.check_invariants();
    assert!(t.heap_bytes() > empty);
    for wk in 0..4 {
        for s in 0..50u64 {
            let hashes: Vec<u64> = (0..20)
                .rev()
                .map(|i| wk * 1_000_000 + s * 100 + i)
                .collect();
            let _ = t.remove(w(wk), &hashes);
        }
        t.check_invariants();
    }
    assert_eq!((t.node_count(), t.len(), t.worker_count()), (0, 0, 0));
    assert_eq!(t.heap_bytes(), empty);
}

#[test]
fn inner_removal_keeps_deeper_blocks_until_parent_returns() {
    let mut t = RadixTree::default();
    t.store(w(0), &stored(None, &[(10, 100), (11, 101), (12, 102)]))
        .expect("store");
    t.remove(w(0), &[10]).expect("remove");
    assert!(t.find_matches(&q(&[100, 101]), false).scores.is_empty());
    assert_eq!(t.node_count(), 3, "structural node kept for the children");
    // The deeper block is still a valid parent.
    t.store(w(0), &stored(Some(12), &[(13, 103)]))
        .expect("store");
    t.store(w(0), &stored(None, &[(10, 100)])).expect("store");
    let s = t.find_matches(&q(&[100, 101, 102, 103]), false);
    assert_eq!(s.get(w(0)), Some(4));
    t.check_invariants();
}

#[test]
fn dp_ranks_are_separate_and_cleared_drops_one_rank() {
    let mut t = RadixTree::default();
    let a = WorkerWithDpRank::new(0, 0);
    let b = WorkerWithDpRank::new(0, 1);
    t.store(a, &stored(None, &[(10, 100)])).expect("store");
    t.store(b, &stored(None, &[(10, 100)])).expect("store");
    t.store(w(1), &stored(None, &[(10, 100)])).expect("store");
    assert_eq!(t.find_matches(&q(&[100]), false).scores.len(), 3);
    t.clear_rank(b);
    assert_eq!(
        sorted(&t.find_matches(&q(&[100]), false)),
        BTreeMap::from([(a, 1), (w(1), 1)])
    );
    t.store(b, &stored(None, &[(10, 100)])).expect("store");
    t.remove_worker(0);
    assert_eq!(
        sorted(&t.find_matches(&q(&[100]), false)),
        BTreeMap::from([(w(1), 1)])
    );
    t.check_invariants();
}

/// A worker's dp ranks go in one pass: nodes they all hold (canonical entries whose every
/// holder goes), a rank's own hash, a wide prefix, and another worker's blocks that stay.
#[test]
fn removing_a_worker_drops_all_its_ranks_at_once() {
    let mut t = RadixTree::default();
    let empty = t.heap_bytes();
    let ranks: Vec<WorkerWithDpRank> = (0..70).map(|r| WorkerWithDpRank::new(7, r)).collect();
    // Every rank holds the prefix (a wide node: more than `WIDE_MIN` holders) and a
    // branch of its own.
    for (i, &r) in ranks.iter().enumerate() {
        let i = i as u64;
        t.store(r, &stored(None, &[(10, 100), (11, 101)]))
            .expect("store");
        t.store(r, &stored(Some(11), &[(1000 + i, 200 + i)]))
            .expect("store");
    }
    // Rank 3 also holds the prefix's first block under a hash of its own.
    t.store(ranks[3], &stored(None, &[(99, 100)]))
        .expect("store");
    // Another worker shares the first block.
    t.store(w(1), &stored(None, &[(10, 100)])).expect("store");
    t.check_invariants();
    t.remove_worker(7);
    t.check_invariants();
    assert_eq!(
        sorted(&t.find_matches(&q(&[100, 101, 203]), false)),
        BTreeMap::from([(w(1), 1)])
    );
    assert_eq!((t.node_count(), t.len(), t.worker_count()), (1, 1, 1));
    // The shared block is still found by its hash: a store under it as parent works.
    t.store(w(1), &stored(Some(10), &[(12, 102)]))
        .expect("parent found");
    t.remove_worker(1);
    assert_eq!((t.node_count(), t.len(), t.worker_count()), (0, 0, 0));
    assert_eq!(t.heap_bytes(), empty);
}

#[test]
fn early_exit_stops_when_one_worker_remains() {
    let mut t = RadixTree::default();
    t.store(w(0), &stored(None, &[(10, 100), (11, 101), (12, 102)]))
        .expect("store");
    t.store(w(1), &stored(None, &[(20, 100)])).expect("store");
    let s = t.find_matches(&q(&[100, 101, 102]), true);
    assert_eq!(sorted(&s), BTreeMap::from([(w(0), 2), (w(1), 1)]));
    let s = t.find_matches(&q(&[100, 101, 102]), false);
    assert_eq!(s.get(w(0)), Some(3));
}

#[test]
fn frequencies_count_recent_lookups_within_the_window() {
    let t = RadixTree::new(Some(Duration::from_secs(10)));
    let mut t = t;
    t.store(w(0), &stored(None, &[(10, 100), (11, 101)]))
        .expect("store");
    let t0 = Instant::now();
    let s = t.find_matches_at(&q(&[100, 101]), false, t0);
    assert!(s.frequencies.is_empty());
    let s = t.find_matches_at(&q(&[100, 101]), false, t0 + Duration::from_secs(1));
    assert_eq!(s.frequencies, vec![1, 1]);
    let s = t.find_matches_at(&q(&[100]), false, t0 + Duration::from_secs(2));
    assert_eq!(s.frequencies, vec![2]);
    let s = t.find_matches_at(&q(&[100, 101]), false, t0 + Duration::from_secs(30));
    assert!(s.frequencies.is_empty(), "all older than the window");
    assert!(
        RadixTree::default()
            .find_matches(&q(&[1]), false)
            .frequencies
            .is_empty()
    );
}

#[test]
fn moving_an_external_hash_releases_the_old_position() {
    let mut t = RadixTree::default();
    t.store(w(0), &stored(None, &[(10, 100), (11, 101)]))
        .expect("store");
    t.store(w(0), &stored(None, &[(11, 105)])).expect("store");
    t.check_invariants();
    assert_eq!(t.len(), 2);
    assert_eq!(t.find_matches(&q(&[100, 101]), false).get(w(0)), Some(1));
    assert_eq!(t.find_matches(&q(&[105]), false).get(w(0)), Some(1));
    t.remove(w(0), &[11, 10]).expect("remove");
    assert_eq!(t.node_count(), 0);
}

#[test]
fn many_workers_share_nodes_and_promotion_keeps_lookups_valid() {
    let mut t = RadixTree::default();
    for wk in 0..20 {
        t.store(w(wk), &stored(None, &[(wk, 1), (100 + wk, 2)]))
            .expect("store");
    }
    assert_eq!(t.node_count(), 2);
    // Remove in an order that repeatedly removes the primary residency.
    for wk in 0..20 {
        t.remove(w(wk), &[wk]).expect("remove");
        t.check_invariants();
        let s = t.find_matches(&q(&[1, 2]), false);
        assert_eq!(s.scores.len(), (19 - wk) as usize);
    }
    for wk in (0..20).rev() {
        t.remove(w(wk), &[100 + wk]).expect("remove");
        t.check_invariants();
    }
    assert_eq!((t.node_count(), t.len()), (0, 0));
}

#[test]
fn a_freed_explicit_child_never_matches_a_reused_node() {
    let mut t = RadixTree::default();
    // Two chains under block 100: the second one's first block is an explicit child of the
    // first block, which is flagged `BRANCH` while it has one.
    t.store(w(0), &stored(None, &[(1, 100), (2, 101)]))
        .expect("store");
    t.store(w(0), &stored(Some(1), &[(3, 102), (4, 103)]))
        .expect("store");
    assert_eq!(
        t.find_matches(&q(&[100, 102, 103]), false).get(w(0)),
        Some(3)
    );
    // Free the explicit child (the flag goes), then reuse its id elsewhere with the same
    // local hash.
    t.remove(w(0), &[4, 3]).expect("remove");
    t.store(w(1), &stored(None, &[(5, 7), (6, 102)]))
        .expect("store");
    t.check_invariants();
    assert_eq!(t.find_matches(&q(&[100, 102]), false).get(w(0)), Some(1));
    assert_eq!(t.find_matches(&q(&[100, 102]), false).get(w(1)), None);
    assert_eq!(t.find_matches(&q(&[7, 102]), false).get(w(1)), Some(2));
    // Stored again, the child is found through the table (flagged again).
    t.store(w(0), &stored(Some(1), &[(3, 102)])).expect("store");
    assert_eq!(t.find_matches(&q(&[100, 102]), false).get(w(0)), Some(2));
    t.check_invariants();
}

#[test]
fn large_tree_with_warmed_lookups_and_grown_tables() {
    // Beyond the size from which lookups are warmed before each event (2^18 pairs), with
    // tables grown many times; every query checked against the expected depth.
    let mut t = RadixTree::default();
    let chains = 5_000u64;
    let len = 64u64;
    for c in 0..chains {
        let wk = c % 8;
        // Chains of one worker share their first 8 blocks (a branch per chain).
        let blocks: Vec<(u64, u64)> = (0..len)
            .map(|i| {
                let local = if i < 8 {
                    1_000 + wk * 10 + i
                } else {
                    c * 1_000 + i
                };
                (c * 1_000 + i, local)
            })
            .collect();
        t.store(w(wk), &stored(None, &blocks)).expect("store");
    }
    assert_eq!(t.len(), (chains * len) as usize);
    // Evict the second half of every other chain, deepest first.
    for c in (0..chains).step_by(2) {
        let hashes: Vec<u64> = (len / 2..len).rev().map(|i| c * 1_000 + i).collect();
        t.remove(w(c % 8), &hashes).expect("remove");
    }
    t.check_invariants();
    for c in (0..chains).step_by(97) {
        let wk = c % 8;
        let query: Vec<u64> = (0..len)
            .map(|i| {
                if i < 8 {
                    1_000 + wk * 10 + i
                } else {
                    c * 1_000 + i
                }
            })
            .collect();
        let want = if c % 2 == 0 { len / 2 } else { len };
        assert_eq!(
            t.find_matches(&q(&query), false).get(w(wk)),
            Some(want as u32)
        );
    }
    for wk in 0..8 {
        t.remove_worker(wk);
    }
    t.check_invariants();
    assert_eq!((t.node_count(), t.len()), (0, 0));
    assert_eq!(t.heap_bytes(), RadixTree::default().heap_bytes());
}

// ----- model-based property test -------------------------------------------------------

/// The naive model: per worker rank, external hash -> path of local hashes from the root.
#[derive(Default, Clone, Debug)]
struct Model {
    ranks: HashMap<WorkerWithDpRank, HashMap<u64, Vec<u64>>>,
}

impl Model {
    fn apply(&mut self, worker_id: u64, ev: &KvCacheEvent) -> std::result::Result<(), ()> {
        let wr = WorkerWithDpRank::new(worker_id, ev.dp_rank);
        match &ev.data {
            KvCacheEventData::Stored(s) => {
                let map = self.ranks.entry(wr).or_default();
                let mut path = match s.parent_hash {
                    None => Vec::new(),
                    Some(p) => {
                        if s.blocks.iter().any(|b| b.block_hash == p) {
                            return Err(());
                        }
                        match map.get(&p.0) {
                            Some(path) => path.clone(),
                            None => return Err(()),
                        }
                    }
                };
                for b in &s.blocks {
                    path.push(b.tokens_hash.0);
                    map.insert(b.block_hash.0, path.clone());
                }
                Ok(())
            }
            KvCacheEventData::Removed(r) => {
                let map = self.ranks.entry(wr).or_default();
                let mut ok = true;
                for h in &r.block_hashes {
                    ok &= map.remove(&h.0).is_some();
                }
                if ok { Ok(()) } else { Err(()) }
            }
            KvCacheEventData::Cleared => {
                self.ranks.remove(&wr);
                Ok(())
            }
        }
    }

    fn remove_worker(&mut self, worker_id: u64) {
        self.ranks.retain(|w, _| w.worker_id != worker_id);
    }

    fn full_scores(&self, query: &[u64]) -> BTreeMap<WorkerWithDpRank, u32> {
        let mut out = BTreeMap::new();
        for (wr, map) in &self.ranks {
            let paths: HashSet<&[u64]> = map.values().map(Vec::as_slice).collect();
            let mut k = 0;
            while k < query.len() && paths.contains(&query[..=k]) {
                k += 1;
            }
            if k > 0 {
                out.insert(*wr, k as u32);
            }
        }
        out
    }

    fn scores(&self, query: &[u64], early_exit: bool) -> BTreeMap<WorkerWithDpRank, u32> {
        let full = self.full_scores(query);
        if !early_exit {
            return full;
        }
        let max = full.values().copied().max().unwrap_or(0);
        let stop = (1..=max).find(|&d| full.values().filter(|&&s| s >= d).count() == 1);
        match stop {
            None => full,
            Some(d) => full.into_iter().map(|(w, s)| (w, s.min(d))).collect(),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Event(u64, KvCacheEvent),
    /// A `removed` event of worker rank `(worker, dp_rank)`'s last `k` stored hashes, newest
    /// first: an engine evicting a chain from its end (the tree walks such runs).
    EvictTail(u64, u32, usize),
    RemoveWorker(u64),
    Query(Vec<u64>, bool),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    // Small alphabets so that hashes, parents and prefixes collide often.
    ops_over(24, 4, 5)
}

/// Events over `hashes` external hashes and `locals` local hashes, stores of up to
/// `chain - 1` blocks.
fn ops_over(hashes: u64, locals: u64, chain: usize) -> impl Strategy<Value = Op> {
    let worker = 0u64..4;
    let dp = prop_oneof![4 => Just(0u32), 1 => Just(1u32)];
    let hash = 0u64..hashes;
    let local = 0u64..locals;
    let stored = (
        proptest::option::weighted(0.6, hash.clone()),
        proptest::collection::vec((hash.clone(), local.clone()), 0..chain),
    )
        .prop_map(|(p, blocks)| {
            KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: p.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks: blocks
                    .into_iter()
                    .map(|(b, t)| KvCacheStoredBlockData::new(b, t))
                    .collect(),
            })
        });
    let removed = proptest::collection::vec(hash, 0..4).prop_map(|hs| {
        KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: hs.into_iter().map(ExternalSequenceBlockHash).collect(),
        })
    });
    let data = prop_oneof![6 => stored, 3 => removed, 1 => Just(KvCacheEventData::Cleared)];
    prop_oneof![
        10 => (worker.clone(), dp, data).prop_map(|(w, dp_rank, data)| Op::Event(
            w,
            KvCacheEvent { event_id: 0, data, dp_rank }
        )),
        3 => (worker.clone(), prop_oneof![4 => Just(0u32), 1 => Just(1u32)], 1usize..8)
            .prop_map(|(w, dp, k)| Op::EvictTail(w, dp, k)),
        1 => worker.prop_map(Op::RemoveWorker),
        4 => (proptest::collection::vec(local, 0..6), any::<bool>()).prop_map(|(q, e)| Op::Query(q, e)),
    ]
}

fn all_queries() -> Vec<Vec<u64>> {
    // Every path of length <= 4 over the 4-letter local alphabet.
    let mut out = vec![vec![]];
    let mut frontier = vec![vec![]];
    for _ in 0..4 {
        let mut next = Vec::new();
        for p in &frontier {
            for l in 0..4 {
                let mut p2: Vec<u64> = p.clone();
                p2.push(l);
                next.push(p2);
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out
}

/// Apply `ops` to the tree and to the naive model; every query, the dump and the final
/// cleanup must agree.
fn check_against_model(ops: &[Op]) -> std::result::Result<(), TestCaseError> {
    let mut tree = RadixTree::default();
    let mut model = Model::default();
    // Every (epoch, index slot) seen, with its rank: an epoch names one assignment.
    let mut named: HashMap<(u64, u32), WorkerWithDpRank> = HashMap::new();
    // Per rank, the hashes of its chain of stores (a store under the chain's last hash
    // extends it, any other starts it again), for `Op::EvictTail`.
    let mut chains: HashMap<WorkerWithDpRank, Vec<u64>> = HashMap::new();
    for op in ops {
        let evicted;
        let op = match op {
            Op::EvictTail(wk, dp_rank, k) => {
                let chain = chains
                    .entry(WorkerWithDpRank::new(*wk, *dp_rank))
                    .or_default();
                let tail = chain.split_off(chain.len().saturating_sub(*k));
                evicted = Op::Event(
                    *wk,
                    KvCacheEvent {
                        event_id: 0,
                        data: KvCacheEventData::Removed(KvCacheRemoveData {
                            block_hashes: tail
                                .into_iter()
                                .rev()
                                .map(ExternalSequenceBlockHash)
                                .collect(),
                        }),
                        dp_rank: *dp_rank,
                    },
                );
                &evicted
            }
            op => op,
        };
        match op {
            Op::EvictTail(..) => unreachable!("made an event above"),
            Op::Event(wk, ev) => {
                let before = (tree.node_count(), tree.len());
                let got = tree.apply_event(*wk, ev);
                let want = model.apply(*wk, ev);
                prop_assert_eq!(got.is_ok(), want.is_ok(), "{:?} -> {:?}", ev, got);
                if matches!(
                    got,
                    Err(Error::ParentBlockNotFound { .. } | Error::InvalidBlockSequence)
                ) {
                    prop_assert_eq!(before, (tree.node_count(), tree.len()));
                }
                if let (Ok(()), KvCacheEventData::Stored(st)) = (&got, &ev.data) {
                    let chain = chains
                        .entry(WorkerWithDpRank::new(*wk, ev.dp_rank))
                        .or_default();
                    if st.parent_hash.map(|p| p.0) != chain.last().copied() {
                        chain.clear();
                    }
                    chain.extend(st.blocks.iter().map(|b| b.block_hash.0));
                }
                // Idempotence: a successful store applied again changes nothing.
                if got.is_ok() && matches!(ev.data, KvCacheEventData::Stored(_)) {
                    let snapshot = tree.dump_events();
                    prop_assert!(tree.apply_event(*wk, ev).is_ok());
                    prop_assert_eq!(snapshot, tree.dump_events());
                }
            }
            Op::RemoveWorker(wk) => {
                tree.remove_worker(*wk);
                model.remove_worker(*wk);
            }
            Op::Query(qs, early) => {
                let scores = tree.find_matches(&q(qs), *early);
                check_index_slots(&scores, &mut named)?;
                prop_assert_eq!(sorted(&scores), model.scores(qs, *early), "query {:?}", qs);
            }
        }
        tree.check_invariants();
    }
    // Every query agrees with the model, and a dump replayed on an empty tree
    // reproduces every score.
    let mut replay = RadixTree::default();
    for ev in tree.dump_events() {
        replay
            .apply_event(ev.worker_id, &ev.event)
            .expect("dump replays cleanly");
    }
    replay.check_invariants();
    for query in all_queries() {
        let want = model.scores(&query, false);
        prop_assert_eq!(sorted(&tree.find_matches(&q(&query), false)), want.clone());
        prop_assert_eq!(sorted(&replay.find_matches(&q(&query), false)), want);
    }
    // Removing everything returns to the empty tree.
    for wk in 0..4 {
        tree.remove_worker(wk);
    }
    tree.check_invariants();
    prop_assert_eq!(
        (tree.node_count(), tree.len(), tree.worker_count()),
        (0, 0, 0)
    );
    prop_assert_eq!(tree.heap_bytes(), RadixTree::default().heap_bytes());
    Ok(())
}

/// The index slots of `scores` describe its list (one distinct slot per rank), and each
/// `(epoch, slot)` names the same rank every time it is seen.
fn check_index_slots(
    scores: &OverlapScores,
    named: &mut HashMap<(u64, u32), WorkerWithDpRank>,
) -> std::result::Result<(), TestCaseError> {
    let x = &scores.index_slots;
    if scores.scores.is_empty() {
        return Ok(());
    }
    prop_assert!(x.for_list(scores.scores.len()).is_some(), "{:?}", scores);
    let distinct: HashSet<u32> = x.slots.iter().copied().collect();
    prop_assert_eq!(distinct.len(), x.slots.len());
    for (&(w, _), &slot) in scores.scores.iter().zip(&x.slots) {
        let first = *named.entry((x.epoch, slot)).or_insert(w);
        prop_assert_eq!(first, w, "epoch {} slot {} named two ranks", x.epoch, slot);
    }
    Ok(())
}

/// `cases` cases, or `PROPTEST_CASES` when set (an explicit `cases` field would ignore it).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn tree_matches_naive_model(ops in proptest::collection::vec(op_strategy(), 1..80)) {
        check_against_model(&ops)?;
    }

    /// Wider alphabets and longer runs: longer chains, more explicit children (and child
    /// hints left stale by frees and id reuse), tag tables grown several times.
    #[test]
    fn tree_matches_naive_model_wide(ops in proptest::collection::vec(ops_over(160, 12, 12), 1..300)) {
        check_against_model(&ops)?;
    }
}

/// A query issued while an event holds the lock returns once the event is applied, with its
/// result: here the hold (20 ms) outlasts the spin, so the query parks and is woken.
#[test]
fn a_query_behind_an_event_sees_it_applied() {
    let tree = SharedRadixTree::new(None);
    tree.inner
        .write()
        .store(w(1), &stored(None, &[(10, 100)]))
        .unwrap();
    let started = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let mut held = tree.inner.write();
        let query = s.spawn(|| {
            started.wait();
            tree.find_matches(&q(&[100, 101]), false)
        });
        started.wait();
        std::thread::sleep(READ_SPIN * 400);
        assert!(!query.is_finished(), "the query did not wait for the event");
        held.store(w(2), &stored(None, &[(20, 100), (21, 101)]))
            .unwrap();
        drop(held);
        let scores = query.join().unwrap();
        assert_eq!(scores.get(w(1)), Some(1));
        assert_eq!(scores.get(w(2)), Some(2));
    });
}

/// Found by `tree_matches_naive_model_wide`: a chain whose hashes repeat (each store of
/// the hash moves it deeper, freeing the node it left), on a tree where another rank's
/// `cleared` left free runs behind, must not corrupt the free runs.
#[test]
fn a_chain_repeating_its_hash_over_freed_runs() {
    let r = |dp| WorkerWithDpRank::new(3, dp);
    let mut t = RadixTree::default();
    t.store(r(1), &stored(None, &[(0, 6), (0, 0), (0, 0)]))
        .expect("store");
    t.check_invariants();
    t.store(r(0), &stored(None, &[(40, 0)])).expect("store");
    t.check_invariants();
    t.clear_rank(r(1));
    t.check_invariants();
    t.store(r(0), &stored(None, &[(40, 1), (0, 0), (0, 0)]))
        .expect("store");
    t.check_invariants();
}
