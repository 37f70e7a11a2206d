use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::block::KvbmRequest;
use crate::dtype::DType;
use crate::events::{KvCacheEventData, RecordingEventSink};
use crate::layout::{LayoutConfig, LayoutKind};
use crate::storage::StorageRequest;

const PAGE: usize = 4;

fn pool(n: usize) -> (BlockPool, Arc<RecordingEventSink>) {
    let sink = Arc::new(RecordingEventSink::default());
    let layout = BlockLayout::allocate(
        LayoutConfig::new(n, 2, 2, PAGE, 3, DType::U8),
        LayoutKind::FullyContiguous,
        StorageRequest::System,
    )
    .unwrap();
    let registry = Registry::new(42, sink.clone());
    (BlockPool::new(Tier::Host, Arc::new(layout), registry), sink)
}

/// Token blocks of a sequence whose tokens start at `start`.
fn seq(start: u32, blocks: usize) -> Vec<TokenBlock> {
    let tokens: Vec<u32> = (start..start + (blocks * PAGE) as u32).collect();
    TokenBlock::split(&tokens, PAGE, &KvbmRequest::default())
}

/// Allocate, fill and register `tbs`.
fn register(pool: &BlockPool, tbs: &[TokenBlock]) -> Vec<ImmutableBlock> {
    let mut blocks = pool.allocate_blocks(tbs.len()).unwrap();
    for (b, tb) in blocks.iter_mut().zip(tbs) {
        b.apply_token_block(tb.clone()).unwrap();
    }
    pool.register_blocks(blocks).unwrap()
}

fn hashes(tbs: &[TokenBlock]) -> Vec<SequenceHash> {
    tbs.iter().map(TokenBlock::sequence_hash).collect()
}

fn indices(blocks: &[MutableBlock]) -> Vec<usize> {
    blocks.iter().map(MutableBlock::block_index).collect()
}

#[test]
fn free_list_is_fifo() {
    let (pool, _) = pool(8);
    let first = pool.allocate_blocks(2).unwrap();
    assert_eq!(indices(&first), [0, 1]);
    let second = pool.allocate_blocks(3).unwrap();
    assert_eq!(indices(&second), [2, 3, 4]);
    drop(first);
    // Freed blocks go to the back: 5, 6 come before the freed 0, 1.
    let third = pool.allocate_blocks(2).unwrap();
    assert_eq!(indices(&third), [5, 6]);
    let fourth = pool.allocate_blocks(3).unwrap();
    assert_eq!(indices(&fourth), [7, 0, 1]);
}

#[test]
fn blocks_return_synchronously_on_drop() {
    let (pool, _) = pool(4);
    for _ in 0..100 {
        let blocks = pool.allocate_blocks(4).unwrap();
        assert_eq!(pool.available_blocks(), 0);
        assert_eq!(pool.in_use_blocks(), 4);
        drop(blocks);
        // No sleep: the blocks are back as soon as the handles are gone.
        assert_eq!(pool.available_blocks(), 4);
        assert_eq!(pool.in_use_blocks(), 0);
    }
}

#[test]
fn allocation_is_all_or_nothing() {
    let (pool, _) = pool(4);
    let held = pool.allocate_blocks(3).unwrap();
    let err = pool.allocate_blocks(2).unwrap_err();
    assert!(matches!(
        err,
        Error::NotEnoughBlocks {
            requested: 2,
            available: 1
        }
    ));
    assert_eq!(
        err.to_string(),
        "Not enough blocks available, requested: 2, available: 1"
    );
    assert_eq!(
        pool.available_blocks(),
        1,
        "a failed allocation takes nothing"
    );
    drop(held);
    assert_eq!(pool.allocate_blocks(4).unwrap().len(), 4);
    assert_eq!(pool.allocate_blocks(0).unwrap().len(), 0);
}

#[test]
fn registration_publishes_stored_with_parent_and_removed_on_eviction() {
    let (pool, sink) = pool(2);
    let tbs = seq(0, 2);
    let blocks = register(&pool, &tbs);
    let events = sink.take();
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[1].event.data,
        KvCacheEventData::Stored {
            parent_hash: Some(tbs[0].sequence_hash()),
            blocks: vec![crate::events::StoredBlock {
                block_hash: tbs[1].sequence_hash(),
                tokens_hash: tbs[1].local_hash(),
            }],
        }
    );
    assert!(matches!(
        events[0].event.data,
        KvCacheEventData::Stored {
            parent_hash: None,
            ..
        }
    ));
    assert!(events.iter().all(|e| e.worker_id == 42));
    drop(blocks);
    assert!(sink.take().is_empty(), "inactive blocks stay cached");
    // Evicting both publishes one Removed per block, leaf first.
    let _b = pool.allocate_blocks(2).unwrap();
    let removed: Vec<_> = sink.take().into_iter().map(|e| e.event.data).collect();
    assert_eq!(
        removed,
        vec![
            KvCacheEventData::Removed {
                block_hashes: vec![tbs[1].sequence_hash()]
            },
            KvCacheEventData::Removed {
                block_hashes: vec![tbs[0].sequence_hash()]
            },
        ]
    );
}

#[test]
fn registration_deduplicates() {
    let (pool, sink) = pool(4);
    let tbs = seq(0, 1);
    let a = register(&pool, &tbs);
    // Registering the same content again returns the block already registered.
    let b = register(&pool, &tbs);
    assert!(a[0].ptr_eq(&b[0]));
    assert_eq!(sink.take().len(), 1, "one Stored for one prefix");
    assert_eq!(
        pool.in_use_blocks(),
        1,
        "the duplicate went back to the free list"
    );
    assert_eq!(pool.available_blocks(), 3);
    // Same once the block is inactive: the cached block is revived.
    let index = a[0].block_index();
    drop((a, b));
    let c = register(&pool, &tbs);
    assert_eq!(c[0].block_index(), index);
    assert_eq!(pool.in_use_blocks(), 1);
    assert!(sink.take().is_empty());
}

#[test]
fn match_returns_longest_cached_prefix() {
    let (pool, _) = pool(8);
    let tbs = seq(0, 4);
    let held = register(&pool, &tbs[..3]);
    let hs = hashes(&tbs);
    let m = pool.match_sequence_hashes(&hs);
    assert_eq!(m.len(), 3);
    for (b, h) in m.iter().zip(&held) {
        assert!(b.ptr_eq(h));
    }
    // Inactive blocks match too, and a miss stops the walk.
    drop((held, m));
    let mut gap = hs.clone();
    gap[1] = SequenceHash(12345);
    assert_eq!(pool.match_sequence_hashes(&gap).len(), 1);
    let m = pool.match_sequence_hashes(&hs);
    assert_eq!(m.len(), 3);
    assert_eq!(pool.in_use_blocks(), 3);
    assert!(m[1].parent().is_some_and(|p| p.ptr_eq(&m[0])));
    assert!(pool.match_sequence_hashes(&[]).is_empty());
    assert!(pool.match_sequence_hashes(&[SequenceHash(1)]).is_empty());
}

#[test]
fn eviction_is_lru_by_return_tick() {
    let (pool, _) = pool(3);
    let a = register(&pool, &seq(0, 1));
    let b = register(&pool, &seq(100, 1));
    let c = register(&pool, &seq(200, 1));
    let (ha, hb, hc) = (
        a[0].sequence_hash(),
        b[0].sequence_hash(),
        c[0].sequence_hash(),
    );
    // Return order b, c, a: b is least recently used.
    drop(b);
    drop(c);
    drop(a);
    let taken = pool.allocate_blocks(1).unwrap();
    assert!(!pool.contains(hb));
    assert!(pool.contains(hc) && pool.contains(ha));
    drop(taken);
    // The freed block is reused first (free list before eviction).
    let taken = pool.allocate_blocks(1).unwrap();
    assert!(pool.contains(hc) && pool.contains(ha));
    let _more = pool.allocate_blocks(1).unwrap();
    assert!(!pool.contains(hc) && pool.contains(ha));
    drop(taken);
}

#[test]
fn a_match_refreshes_recency() {
    let (pool, _) = pool(2);
    let a = register(&pool, &seq(0, 1));
    let b = register(&pool, &seq(100, 1));
    let (ha, hb) = (a[0].sequence_hash(), b[0].sequence_hash());
    drop(a);
    drop(b);
    drop(pool.match_sequence_hashes(&[ha])); // a is now the most recently returned
    let _x = pool.allocate_blocks(1).unwrap();
    assert!(pool.contains(ha) && !pool.contains(hb));
}

#[test]
fn lower_priority_is_evicted_first() {
    let (pool, _) = pool(2);
    let mut blocks = pool.allocate_blocks(2).unwrap();
    let tbs = [seq(0, 1).remove(0), seq(100, 1).remove(0)];
    blocks[0].set_priority(10);
    blocks[1].set_priority(1);
    for (b, tb) in blocks.iter_mut().zip(&tbs) {
        b.apply_token_block(tb.clone()).unwrap();
    }
    let reg = pool.register_blocks(blocks).unwrap();
    assert_eq!(reg[0].priority(), 10);
    // Return the high-priority block last-but-not-least: LRU alone would evict it first.
    let (hi, lo) = (reg[0].clone(), reg[1].clone());
    drop(reg);
    drop(hi);
    drop(lo);
    let _x = pool.allocate_blocks(1).unwrap();
    assert!(pool.contains(tbs[0].sequence_hash()));
    assert!(!pool.contains(tbs[1].sequence_hash()));
}

#[test]
fn leaves_are_evicted_before_parents() {
    let (pool, _) = pool(6);
    let tbs = seq(0, 3);
    let chain = register(&pool, &tbs);
    // Drop the root handle first: the child still holds it, so it cannot become inactive
    // (and get an older tick) before its descendants.
    let mut chain = chain.into_iter();
    let root = chain.next().unwrap();
    let rest: Vec<_> = chain.collect();
    drop(root);
    assert_eq!(pool.in_use_blocks(), 3);
    drop(rest);
    assert_eq!(pool.in_use_blocks(), 0);
    let _free = pool.allocate_blocks(3).unwrap(); // the 3 never-used blocks
    let hs = hashes(&tbs);
    let _e1 = pool.allocate_blocks(1).unwrap();
    assert_eq!(
        hs.iter().map(|h| pool.contains(*h)).collect::<Vec<_>>(),
        [true, true, false]
    );
    let _e2 = pool.allocate_blocks(1).unwrap();
    assert_eq!(
        hs.iter().map(|h| pool.contains(*h)).collect::<Vec<_>>(),
        [true, false, false]
    );
}

#[test]
fn long_chains_release_without_deep_recursion() {
    let n = 50_000;
    let (pool, _) = pool(n);
    let tbs = seq(0, n);
    let chain = register(&pool, &tbs);
    let leaf = chain.last().unwrap().clone();
    drop(chain);
    assert_eq!(pool.in_use_blocks(), n, "the leaf holds the whole chain");
    drop(leaf);
    assert_eq!(pool.in_use_blocks(), 0);
    assert_eq!(pool.available_blocks(), n);
}

#[test]
fn register_requires_complete_blocks_of_this_pool() {
    let (pool, _) = pool(2);
    let (other, _) = super::tests::pool(2);
    let b = pool.allocate_blocks(1).unwrap();
    assert!(matches!(
        pool.register_blocks(b),
        Err(Error::InvalidState {
            expected: "complete",
            actual: "reset"
        })
    ));
    assert_eq!(pool.available_blocks(), 2, "rejected blocks are freed");
    let mut foreign = other.allocate_blocks(1).unwrap();
    foreign[0].apply_token_block(seq(0, 1).remove(0)).unwrap();
    assert!(matches!(
        pool.register_blocks(foreign),
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(other.available_blocks(), 2);
}

#[test]
fn commit_path_registers_the_same_hash_as_split() {
    let (pool, _) = pool(2);
    let mut blocks = pool.allocate_blocks(1).unwrap();
    let req = KvbmRequest::new("r", None, Some("salt".into()));
    blocks[0].init_sequence(req.salt_seed(), None).unwrap();
    blocks[0].add_tokens(&[5, 6]).unwrap();
    blocks[0].add_tokens(&[7, 8]).unwrap();
    blocks[0].commit().unwrap();
    let reg = pool.register_blocks(blocks).unwrap();
    let expected = TokenBlock::split(&[5, 6, 7, 8], PAGE, &req);
    assert_eq!(reg[0].sequence_hash(), expected[0].sequence_hash());
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(usize),
    DropMutable(usize),
    Register(usize, u32),
    DropImmutable(usize),
    Match(u32, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..6).prop_map(Op::Allocate),
        any::<usize>().prop_map(Op::DropMutable),
        (any::<usize>(), 0u32..4).prop_map(|(i, s)| Op::Register(i, s)),
        any::<usize>().prop_map(Op::DropImmutable),
        (0u32..4, 1usize..4).prop_map(|(s, n)| Op::Match(s, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random allocate / register / match / drop sequences keep the pool's books balanced
    /// and never hand one block to two owners.
    #[test]
    fn pool_invariants_hold(ops in proptest::collection::vec(op(), 1..60)) {
        const TOTAL: usize = 8;
        let (pool, _) = pool(TOTAL);
        let mut mutables: Vec<MutableBlock> = Vec::new();
        let mut immutables: Vec<ImmutableBlock> = Vec::new();
        // Sequences come from 4 seeds of 3 blocks each, so registrations collide often.
        let seqs: Vec<Vec<TokenBlock>> = (0..4).map(|s| seq(s * 1000, 3)).collect();
        for op in ops {
            match op {
                Op::Allocate(n) => {
                    let available = pool.available_blocks();
                    match pool.allocate_blocks(n) {
                        Ok(bs) => {
                            prop_assert!(n <= available);
                            mutables.extend(bs);
                        }
                        Err(Error::NotEnoughBlocks { requested, available: a }) => {
                            prop_assert!(n > available);
                            prop_assert_eq!((requested, a), (n, available));
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                Op::DropMutable(i) => {
                    if !mutables.is_empty() {
                        mutables.swap_remove(i % mutables.len());
                    }
                }
                Op::Register(i, s) => {
                    if !mutables.is_empty() {
                        let mut b = mutables.swap_remove(i % mutables.len());
                        let pos = i % 3;
                        b.apply_token_block(seqs[s as usize][pos].clone()).unwrap();
                        let r = pool.register_blocks(vec![b]).unwrap();
                        prop_assert_eq!(r[0].sequence_hash(), seqs[s as usize][pos].sequence_hash());
                        immutables.extend(r);
                    }
                }
                Op::DropImmutable(i) => {
                    if !immutables.is_empty() {
                        immutables.swap_remove(i % immutables.len());
                    }
                }
                Op::Match(s, n) => {
                    let hs = hashes(&seqs[s as usize][..n]);
                    let m = pool.match_sequence_hashes(&hs);
                    prop_assert!(m.len() <= n);
                    for (b, h) in m.iter().zip(&hs) {
                        prop_assert_eq!(b.sequence_hash(), *h);
                    }
                    immutables.extend(m);
                }
            }
            // Books balance.
            prop_assert_eq!(pool.available_blocks() + pool.in_use_blocks(), TOTAL);
            // No block index is owned twice: mutable blocks are unique, and distinct
            // immutable blocks (by identity) have distinct indices disjoint from them.
            let mut owned: Vec<usize> = mutables.iter().map(MutableBlock::block_index).collect();
            let mut distinct: Vec<&ImmutableBlock> = Vec::new();
            // Children keep their parents in use, so walk the parent chains too.
            for b in &immutables {
                let mut cur = Some(b);
                while let Some(c) = cur {
                    if !distinct.iter().any(|d| d.ptr_eq(c)) {
                        distinct.push(c);
                    }
                    cur = c.parent();
                }
            }
            owned.extend(distinct.iter().map(|b| b.block_index()));
            let n = owned.len();
            owned.sort_unstable();
            owned.dedup();
            prop_assert_eq!(owned.len(), n, "a block index is owned twice");
            prop_assert_eq!(n, pool.in_use_blocks());
            // One registered block per hash among the live handles.
            let mut hs: Vec<_> = distinct.iter().map(|b| b.sequence_hash()).collect();
            let m = hs.len();
            hs.sort_unstable();
            hs.dedup();
            prop_assert_eq!(hs.len(), m, "two live blocks share a sequence hash");
        }
    }
}
