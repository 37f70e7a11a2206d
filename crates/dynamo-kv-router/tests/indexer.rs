//! Behaviour of the shared indexer through its public API: JSON events in, scores out.

use std::sync::Arc;

use dynamo_kv_router::Error;
use dynamo_kv_router::hashing::{BlockHashOptions, LocalBlockHash, compute_block_hash_for_seq};
use dynamo_kv_router::indexer::SharedRadixTree;
use dynamo_kv_router::protocols::{
    WorkerWithDpRank, decode_json_router_event, encode_json_router_event,
};

fn stored_json(parent: Option<u64>, blocks: &[(u64, u64)], dp_rank: u32) -> Vec<u8> {
    let blocks: Vec<String> = blocks
        .iter()
        .map(|(b, t)| format!(r#"{{"block_hash":{b},"tokens_hash":{t}}}"#))
        .collect();
    let parent = parent.map_or_else(|| "null".to_owned(), |p| p.to_string());
    format!(
        r#"{{"event_id":1,"data":{{"stored":{{"parent_hash":{parent},"blocks":[{}]}}}},"dp_rank":{dp_rank}}}"#,
        blocks.join(",")
    )
    .into_bytes()
}

fn q(xs: &[u64]) -> Vec<LocalBlockHash> {
    xs.iter().map(|&x| LocalBlockHash(x)).collect()
}

#[test]
fn remove_worker_forgets_blocks_and_frees_nodes() {
    let tree = SharedRadixTree::new(None);
    tree.apply_json(1, &stored_json(None, &[(1, 10), (2, 11)], 0))
        .expect("store");
    tree.apply_json(1, &stored_json(None, &[(1, 10), (3, 12)], 1))
        .expect("store");
    tree.apply_json(2, &stored_json(None, &[(1, 10)], 0))
        .expect("store");
    assert_eq!(tree.node_count(), 3);
    tree.remove_worker(1);
    let s = tree.find_matches(&q(&[10, 11]), false);
    assert_eq!(s.scores, vec![(WorkerWithDpRank::new(2, 0), 1)]);
    assert_eq!((tree.node_count(), tree.len()), (1, 1));
    tree.clear_all_blocks(2);
    assert_eq!((tree.node_count(), tree.len()), (0, 0));
    assert!(tree.is_empty());
}

#[test]
fn json_dump_replays_into_an_equivalent_tree() {
    let tree = SharedRadixTree::new(None);
    let prompt: Vec<u32> = (0..256).collect();
    let local =
        compute_block_hash_for_seq(&prompt, 16, &BlockHashOptions::default()).expect("hashes");
    for w in 0..8u64 {
        let n = 2 + w as usize;
        let blocks: Vec<(u64, u64)> = local[..n]
            .iter()
            .enumerate()
            .map(|(i, h)| (1000 + i as u64, h.0))
            .collect();
        tree.apply_json(w, &stored_json(None, &blocks, (w % 2) as u32))
            .expect("store");
    }
    let replay = SharedRadixTree::new(None);
    for ev in tree.dump_events() {
        let line = encode_json_router_event(&ev);
        let back = decode_json_router_event(line.as_bytes()).expect("dump line decodes");
        replay.apply_router_event(&back).expect("replays");
    }
    for k in 0..=local.len() {
        let mut a = tree.find_matches(&local[..k], false).scores;
        let mut b = replay.find_matches(&local[..k], false).scores;
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "prefix {k}");
    }
    assert_eq!(tree.node_count(), replay.node_count());
    assert_eq!(tree.len(), replay.len());
}

#[test]
fn rejected_store_and_unknown_removal_are_reported() {
    let tree = SharedRadixTree::new(None);
    tree.apply_json(1, &stored_json(None, &[(1, 10)], 0))
        .expect("store");
    let err = tree
        .apply_json(1, &stored_json(Some(7), &[(2, 11)], 0))
        .expect_err("unknown parent");
    assert!(err.is_apply_error());
    assert_eq!(err.to_string(), "Failed to find parent block");
    let err = tree
        .apply_json(
            1,
            br#"{"event_id":2,"data":{"removed":{"block_hashes":[5]}}}"#,
        )
        .expect_err("unknown hash");
    assert_eq!(err, Error::BlockNotFound { missing: vec![5] });
    let err = tree.apply_json(1, b"not json").expect_err("bad bytes");
    assert!(!err.is_apply_error());
    let c = tree.counters();
    assert_eq!(
        (c.applied, c.parent_not_found, c.block_not_found),
        (1, 1, 1)
    );
    assert_eq!(tree.len(), 1);
}

#[test]
fn concurrent_writers_and_readers_end_in_the_sequential_state() {
    let tree = Arc::new(SharedRadixTree::new(None));
    let events = |w: u64| -> Vec<Vec<u8>> {
        (0..50u64)
            .map(|c| {
                let blocks: Vec<(u64, u64)> = (0..10)
                    .map(|i| (w << 32 | c << 8 | i, if i < 3 { i } else { c << 8 | i }))
                    .collect();
                stored_json(None, &blocks, 0)
            })
            .collect()
    };
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let tree = Arc::clone(&tree);
            std::thread::spawn(move || {
                for ev in events(w) {
                    tree.apply_json(w, &ev).expect("store");
                }
            })
        })
        .collect();
    let reader = {
        let tree = Arc::clone(&tree);
        std::thread::spawn(move || {
            for _ in 0..2000 {
                let s = tree.find_matches(&q(&[0, 1, 2, 3]), false);
                // A worker's chain is stored atomically: scores are 3 (prefix only) or more.
                assert!(s.scores.iter().all(|&(_, d)| d >= 3), "{s:?}");
            }
        })
    };
    for h in writers {
        h.join().expect("writer");
    }
    reader.join().expect("reader");
    let sequential = SharedRadixTree::new(None);
    for w in 0..4 {
        for ev in events(w) {
            sequential.apply_json(w, &ev).expect("store");
        }
    }
    assert_eq!(tree.len(), sequential.len());
    assert_eq!(tree.node_count(), sequential.node_count());
    for c in 0..50u64 {
        let query: Vec<u64> = (0..10)
            .map(|i| if i < 3 { i } else { c << 8 | i })
            .collect();
        let mut a = tree.find_matches(&q(&query), false).scores;
        let mut b = sequential.find_matches(&q(&query), false).scores;
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }
}

/// Hundreds of ranks sharing prefixes (the nodes past the tree's holder-set limit, with
/// exact membership): stores, removals in any order, a rank storing a block under a second
/// hash, and clears, checked against a naive model of every rank's paths after each step.
#[test]
fn prefixes_shared_by_hundreds_of_ranks_score_like_a_naive_model() {
    use std::collections::{BTreeMap, HashMap, HashSet};

    use dynamo_kv_router::indexer::RadixTree;
    use dynamo_kv_router::protocols::{
        ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
        KvCacheStoreData, KvCacheStoredBlockData,
    };

    const RANKS: u64 = 300;
    const FAMILIES: u64 = 3;
    const CHAIN: u64 = 6;
    // Family block `i` of family `f` under hash variant `v` (a second variant makes a rank
    // hold the same block under two hashes).
    let fam_ext = |f: u64, i: u64, v: u64| 1_000_000 * (v + 1) + f * 1_000 + i;
    let fam_local = |f: u64, i: u64| f * 100 + i;

    #[derive(Default)]
    struct Model(HashMap<u64, HashMap<u64, Vec<u64>>>);
    impl Model {
        fn apply(&mut self, w: u64, data: &KvCacheEventData) -> bool {
            let map = self.0.entry(w).or_default();
            match data {
                KvCacheEventData::Stored(s) => {
                    let mut path = match s.parent_hash {
                        None => Vec::new(),
                        Some(p) => match map.get(&p.0) {
                            Some(path) => path.clone(),
                            None => return false,
                        },
                    };
                    for b in &s.blocks {
                        path.push(b.tokens_hash.0);
                        map.insert(b.block_hash.0, path.clone());
                    }
                    true
                }
                KvCacheEventData::Removed(r) => {
                    for h in &r.block_hashes {
                        map.remove(&h.0);
                    }
                    true
                }
                KvCacheEventData::Cleared => {
                    map.clear();
                    true
                }
            }
        }

        fn scores(&self, query: &[u64]) -> BTreeMap<WorkerWithDpRank, u32> {
            let mut out = BTreeMap::new();
            for (w, map) in &self.0 {
                let paths: HashSet<&[u64]> = map.values().map(Vec::as_slice).collect();
                let k = (0..query.len())
                    .take_while(|&k| paths.contains(&query[..=k]))
                    .count();
                if k > 0 {
                    out.insert(WorkerWithDpRank::new(*w, 0), k as u32);
                }
            }
            out
        }
    }

    let mut rng = fastrand::Rng::with_seed(19);
    let mut tree = RadixTree::default();
    let mut model = Model::default();
    let mut next_ext = 10_000_000u64;
    // Most ranks holding family 0's first block at a check (the tree's holder sets start
    // above 64 holders).
    let mut widest = 0;
    let queries: Vec<Vec<u64>> = (0..FAMILIES)
        .flat_map(|f| {
            (0..4u64).map(move |s| {
                let mut q: Vec<u64> = (0..CHAIN).map(|i| fam_local(f, i)).collect();
                q.extend([900 + s, 950 + s % 2]);
                q
            })
        })
        .collect();
    for step in 0..6_000 {
        let w = rng.u64(..RANKS);
        let data = match rng.u32(..10) {
            // A family prefix (whole, or its first blocks), mostly under variant 0.
            0..=3 => {
                let f = rng.u64(..FAMILIES);
                let v = u64::from(rng.u32(..20) == 0);
                let n = if rng.bool() {
                    CHAIN
                } else {
                    rng.u64(1..=CHAIN)
                };
                KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: None,
                    start_position: None,
                    blocks: (0..n)
                        .map(|i| KvCacheStoredBlockData::new(fam_ext(f, i, v), fam_local(f, i)))
                        .collect(),
                })
            }
            // A suffix under some family block (rejected when the rank lacks it).
            4..=6 => {
                let (f, i) = (rng.u64(..FAMILIES), rng.u64(..CHAIN));
                let n = rng.u64(1..=2);
                KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: Some(ExternalSequenceBlockHash(fam_ext(f, i, 0))),
                    start_position: None,
                    blocks: (0..n)
                        .map(|k| {
                            next_ext += 1;
                            KvCacheStoredBlockData::new(next_ext, 900 + rng.u64(..4) + 50 * k)
                        })
                        .collect(),
                })
            }
            // Remove some of the rank's blocks, in any order.
            7 | 8 => {
                let mut held: Vec<u64> = model
                    .0
                    .get(&w)
                    .map(|m| m.keys().copied().collect())
                    .unwrap_or_default();
                rng.shuffle(&mut held);
                held.truncate(rng.usize(..=held.len().min(8)));
                KvCacheEventData::Removed(KvCacheRemoveData {
                    block_hashes: held.into_iter().map(ExternalSequenceBlockHash).collect(),
                })
            }
            _ => KvCacheEventData::Cleared,
        };
        let ev = KvCacheEvent {
            event_id: step,
            data,
            dp_rank: 0,
        };
        let ok = model.apply(w, &ev.data);
        assert_eq!(tree.apply_event(w, &ev).is_ok(), ok, "step {step}: {ev:?}");
        if step % 200 == 0 {
            tree.check_invariants();
            let first = [fam_local(0, 0)];
            let holders = model
                .0
                .values()
                .filter(|m| m.values().any(|p| p[..] == first))
                .count();
            widest = widest.max(holders);
        }
        let query = &queries[step as usize % queries.len()];
        let mut got = tree.find_matches(&q(query), false).scores;
        got.sort_unstable();
        let want: Vec<_> = model.scores(query).into_iter().collect();
        assert_eq!(got, want, "step {step}, query {query:?}");
    }
    assert!(
        widest > 100,
        "the workload must share blocks widely: {widest}"
    );
    tree.check_invariants();
    for w in 0..RANKS {
        tree.remove_worker(w);
    }
    assert_eq!((tree.node_count(), tree.len()), (0, 0));
    assert_eq!(tree.heap_bytes(), RadixTree::default().heap_bytes());
}
