//! Many threads allocating, registering, matching and dropping blocks of one pool: no
//! deadlock (blocks return inside `Drop` while other threads hold handles), balanced books,
//! and KV events that add up to what is still cached.

use std::collections::HashMap;
use std::sync::Arc;

use dynamo_block_manager::events::{KvCacheEventData, Registry};
use dynamo_block_manager::{
    BlockLayout, BlockPool, DType, Error, KvbmRequest, LayoutConfig, LayoutKind,
    RecordingEventSink, StorageRequest, Tier, TokenBlock,
};

#[test]
fn concurrent_pool_use_keeps_books_and_events_consistent() {
    const TOTAL: usize = 24;
    const THREADS: usize = 4;
    // Miri interprets every step; a few rounds still interleave the threads.
    const ROUNDS: usize = if cfg!(miri) { 40 } else { 2_000 };
    let sink = Arc::new(RecordingEventSink::default());
    let registry = Registry::new(3, sink.clone());
    let layout = BlockLayout::allocate(
        LayoutConfig::new(TOTAL, 1, 1, 4, 2, DType::U8),
        LayoutKind::FullyContiguous,
        StorageRequest::System,
    )
    .unwrap();
    let pool = BlockPool::new(Tier::Host, Arc::new(layout), registry.clone());
    // 6 prompts of 4 blocks: threads share prefixes and collide on registration.
    let prompts: Vec<Vec<TokenBlock>> = (0..6u32)
        .map(|p| {
            let tokens: Vec<u32> = (0..16).map(|t| p * 1000 + t).collect();
            TokenBlock::split(&tokens, 4, &KvbmRequest::default())
        })
        .collect();

    std::thread::scope(|s| {
        for t in 0..THREADS {
            let pool = pool.clone();
            let prompts = &prompts;
            s.spawn(move || {
                let mut held = Vec::new();
                for round in 0..ROUNDS {
                    let prompt = &prompts[(round * 7 + t * 3) % prompts.len()];
                    let hashes: Vec<_> = prompt.iter().map(TokenBlock::sequence_hash).collect();
                    let cached = pool.match_sequence_hashes(&hashes);
                    let need = &prompt[cached.len()..];
                    match pool.allocate_blocks(need.len()) {
                        Ok(mut blocks) => {
                            for (b, tb) in blocks.iter_mut().zip(need) {
                                b.apply_token_block(tb.clone()).unwrap();
                            }
                            let registered = pool.register_blocks(blocks).unwrap();
                            for (b, h) in registered.iter().zip(&hashes[cached.len()..]) {
                                assert_eq!(b.sequence_hash(), *h);
                            }
                            held.push((cached, registered));
                        }
                        Err(Error::NotEnoughBlocks { .. }) => drop(cached),
                        Err(e) => panic!("{e}"),
                    }
                    // Keep at most two prompts per thread alive.
                    if held.len() > 2 {
                        held.remove(0);
                    }
                }
            });
        }
    });

    assert_eq!(pool.in_use_blocks(), 0);
    assert_eq!(pool.available_blocks(), TOTAL);
    // Replaying the events gives exactly the prefixes still registered.
    let mut live: HashMap<_, i64> = HashMap::new();
    let events = sink.take();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.event.event_id, i as u64,
            "event ids are dense and ordered"
        );
        match &e.event.data {
            KvCacheEventData::Stored { blocks, .. } => {
                for b in blocks {
                    *live.entry(b.block_hash).or_default() += 1;
                }
            }
            KvCacheEventData::Removed { block_hashes } => {
                for h in block_hashes {
                    *live.entry(*h).or_default() -= 1;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    for (hash, count) in live {
        assert!(
            count == 0 || count == 1,
            "{hash:?} stored {count} more times than removed"
        );
        assert_eq!(count == 1, registry.is_registered(hash), "{hash:?}");
        assert_eq!(count == 1, pool.contains(hash), "{hash:?}");
    }
}
