//! Worker-side construction of KV events (what `KvEventPublisher` publishes).
//!
//! [`PublisherCore`] turns what an engine reports (block token ids and the engine's own
//! signed 64-bit block hashes) into [`RouterEvent`]s: it recomputes each block's
//! `tokens_hash` with the shared hashing (so routers can match prompts against it),
//! reinterprets engine hashes bit for bit as `u64`, numbers events with a per-rank
//! monotonic id starting at 0, and feeds the optional worker-local indexer used for
//! recovery. Ids advance only for events actually produced, so routers see no false gaps.
//!
//! Blocks whose token count differs from the publisher's block size cannot be matched by
//! the router; the first such block ends the stored chain (its descendants would have an
//! unknown parent) and is counted in [`PublisherCore::dropped_blocks`].

use crate::error::{Error, Result};
use crate::hashing::{BlockExtraInfo, BlockHashOptions, compute_block_hash_for_seq};
use crate::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, RouterEvent, StorageTier, WorkerWithDpRank,
};
use crate::recovery::{LocalKvIndexer, REPLAY_BUFFER_EVENTS};

/// A `stored` report from an engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredInput {
    /// Token ids of the blocks, concatenated (eagle: plus one look-ahead token).
    pub token_ids: Vec<u32>,
    /// Tokens in each block.
    pub num_block_tokens: Vec<usize>,
    /// The engine's hash of each block (signed, as engines produce them).
    pub block_hashes: Vec<i64>,
    /// The engine's hash of the parent block, if the chain does not start at the root.
    pub parent_hash: Option<i64>,
    /// Per-block multimodal info.
    pub block_mm_infos: Option<Vec<Option<BlockExtraInfo>>>,
    /// LoRA adapter.
    pub lora_name: Option<String>,
    /// Eagle windows (`block_size + 1` tokens).
    pub is_eagle: bool,
    /// Cache salt (namespace).
    pub cache_salt: Option<String>,
}

/// One item of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum PublishInput {
    /// Blocks were stored.
    Stored(StoredInput),
    /// Blocks were removed.
    Removed(Vec<i64>),
    /// Every block was dropped.
    Cleared,
}

/// Event construction for one worker rank.
#[derive(Debug)]
pub struct PublisherCore {
    worker: WorkerWithDpRank,
    block_size: usize,
    tier: StorageTier,
    next_event_id: u64,
    dropped_blocks: u64,
    local: Option<LocalKvIndexer>,
}

impl PublisherCore {
    /// A publisher for `worker` with blocks of `block_size` tokens.
    ///
    /// # Errors
    /// [`Error::ZeroBlockSize`] when `block_size == 0`.
    pub fn new(
        worker: WorkerWithDpRank,
        block_size: usize,
        enable_local_indexer: bool,
    ) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::ZeroBlockSize);
        }
        Ok(Self {
            worker,
            block_size,
            tier: StorageTier::Device,
            next_event_id: 0,
            dropped_blocks: 0,
            local: enable_local_indexer.then(|| LocalKvIndexer::new(worker, REPLAY_BUFFER_EVENTS)),
        })
    }

    /// The rank this publisher speaks for.
    pub fn worker(&self) -> WorkerWithDpRank {
        self.worker
    }

    /// Blocks dropped because their size was not the block size.
    pub fn dropped_blocks(&self) -> u64 {
        self.dropped_blocks
    }

    /// The worker-local indexer, when enabled.
    pub fn local_indexer(&self) -> Option<&LocalKvIndexer> {
        self.local.as_ref()
    }

    /// The id the next event will get.
    pub fn next_event_id(&self) -> u64 {
        self.next_event_id
    }

    /// Validate `input` and build its payload without numbering it.
    fn stored_data(&self, input: &StoredInput) -> Result<(Option<KvCacheEventData>, u64)> {
        let bad = |reason: String| Error::InvalidInput(reason);
        if input.num_block_tokens.len() != input.block_hashes.len() {
            return Err(bad(format!(
                "num_block_tokens has {} entries but block_hashes has {}",
                input.num_block_tokens.len(),
                input.block_hashes.len()
            )));
        }
        let total: usize = input.num_block_tokens.iter().sum();
        let lookahead = usize::from(input.is_eagle);
        if input.token_ids.len() != total && input.token_ids.len() != total + lookahead {
            return Err(bad(format!(
                "token_ids has {} tokens but num_block_tokens sums to {total}",
                input.token_ids.len()
            )));
        }
        if let Some(mm) = &input.block_mm_infos
            && mm.len() > input.block_hashes.len()
        {
            return Err(bad(format!(
                "block_mm_infos has {} entries for {} blocks",
                mm.len(),
                input.block_hashes.len()
            )));
        }
        let mut kept = input
            .num_block_tokens
            .iter()
            .take_while(|&&n| n == self.block_size)
            .count();
        // Eagle windows need the first token of the next block.
        if input.is_eagle && kept * self.block_size + 1 > input.token_ids.len() {
            kept = kept.saturating_sub(1);
        }
        let dropped = (input.block_hashes.len() - kept) as u64;
        if kept == 0 {
            return Ok((None, dropped));
        }
        let end = (kept * self.block_size + lookahead).min(input.token_ids.len());
        let options = BlockHashOptions {
            block_mm_infos: input.block_mm_infos.as_deref(),
            lora_name: input.lora_name.as_deref(),
            cache_namespace: input.cache_salt.as_deref(),
            is_eagle: input.is_eagle,
        };
        let local = compute_block_hash_for_seq(&input.token_ids[..end], self.block_size, &options)?;
        let mm = input.block_mm_infos.as_deref().unwrap_or(&[]);
        let blocks = local
            .iter()
            .take(kept)
            .enumerate()
            .map(|(i, &tokens_hash)| KvCacheStoredBlockData {
                block_hash: ExternalSequenceBlockHash::from_i64(input.block_hashes[i]),
                tokens_hash,
                mm_extra_info: mm.get(i).cloned().flatten(),
            })
            .collect();
        Ok((
            Some(KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: input.parent_hash.map(ExternalSequenceBlockHash::from_i64),
                start_position: None,
                blocks,
            })),
            dropped,
        ))
    }

    fn emit(&mut self, data: KvCacheEventData) -> RouterEvent {
        let event = KvCacheEvent {
            event_id: self.next_event_id,
            data,
            dp_rank: self.worker.dp_rank,
        };
        self.next_event_id += 1;
        if let Some(local) = &mut self.local {
            // The worker's own index may reject an event (e.g. an unknown parent after a
            // restart); the event is still published, as the engine reported it.
            let _ = local.record(event.clone());
        }
        RouterEvent {
            worker_id: self.worker.worker_id,
            storage_tier: self.tier,
            event,
        }
    }

    /// Build the event for a `stored` report. `None` when no block could be kept.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for inconsistent lengths.
    pub fn stored(&mut self, input: &StoredInput) -> Result<Option<RouterEvent>> {
        let (data, dropped) = self.stored_data(input)?;
        self.dropped_blocks += dropped;
        Ok(data.map(|d| self.emit(d)))
    }

    /// Build the event for a `removed` report. `None` for an empty list.
    pub fn removed(&mut self, block_hashes: &[i64]) -> Option<RouterEvent> {
        (!block_hashes.is_empty()).then(|| {
            self.emit(KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: block_hashes
                    .iter()
                    .map(|&h| ExternalSequenceBlockHash::from_i64(h))
                    .collect(),
            }))
        })
    }

    /// Build the event for "every block dropped".
    pub fn cleared(&mut self) -> RouterEvent {
        self.emit(KvCacheEventData::Cleared)
    }

    /// Validate a whole batch, then build its events, merging neighbours that continue
    /// each other (a store whose parent is the previous store's last block; consecutive
    /// removes). Nothing is numbered or recorded if any item is invalid.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the index of the first bad item.
    pub fn batch(&mut self, items: &[PublishInput]) -> Result<Vec<RouterEvent>> {
        let mut payloads: Vec<KvCacheEventData> = Vec::new();
        let mut dropped = 0;
        for (i, item) in items.iter().enumerate() {
            let data = match item {
                PublishInput::Stored(s) => {
                    let (d, n) = self
                        .stored_data(s)
                        .map_err(|e| Error::InvalidInput(format!("item {i}: {e}")))?;
                    dropped += n;
                    d
                }
                PublishInput::Removed(h) if h.is_empty() => None,
                PublishInput::Removed(h) => Some(KvCacheEventData::Removed(KvCacheRemoveData {
                    block_hashes: h
                        .iter()
                        .map(|&x| ExternalSequenceBlockHash::from_i64(x))
                        .collect(),
                })),
                PublishInput::Cleared => Some(KvCacheEventData::Cleared),
            };
            let Some(data) = data else { continue };
            match (payloads.last_mut(), data) {
                (Some(KvCacheEventData::Stored(prev)), KvCacheEventData::Stored(next))
                    if next.parent_hash.is_some()
                        && prev.blocks.last().map(|b| b.block_hash) == next.parent_hash =>
                {
                    prev.blocks.extend(next.blocks);
                }
                (Some(KvCacheEventData::Removed(prev)), KvCacheEventData::Removed(next)) => {
                    prev.block_hashes.extend(next.block_hashes);
                }
                (_, data) => payloads.push(data),
            }
        }
        self.dropped_blocks += dropped;
        Ok(payloads.into_iter().map(|d| self.emit(d)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::LocalBlockHash;

    fn publisher() -> PublisherCore {
        PublisherCore::new(WorkerWithDpRank::new(7, 1), 4, true).expect("bs > 0")
    }

    fn stored(tokens: std::ops::Range<u32>, hashes: &[i64], parent: Option<i64>) -> StoredInput {
        let token_ids: Vec<u32> = tokens.collect();
        StoredInput {
            num_block_tokens: vec![4; token_ids.len() / 4],
            token_ids,
            block_hashes: hashes.to_vec(),
            parent_hash: parent,
            ..Default::default()
        }
    }

    #[test]
    fn stored_event_recomputes_tokens_hash_and_bitcasts_hashes() {
        let mut p = publisher();
        let ev = p
            .stored(&stored(0..8, &[-1, 5], None))
            .expect("valid")
            .expect("blocks kept");
        assert_eq!(
            (ev.worker_id, ev.event.event_id, ev.event.dp_rank),
            (7, 0, 1)
        );
        let KvCacheEventData::Stored(s) = &ev.event.data else {
            panic!("stored")
        };
        assert_eq!(s.blocks[0].block_hash.0, u64::MAX);
        assert_eq!(
            s.blocks.iter().map(|b| b.tokens_hash).collect::<Vec<_>>(),
            [
                LocalBlockHash(9_143_094_415_614_847_814),
                LocalBlockHash(12_124_091_508_212_882_195)
            ]
        );
        let next = p.removed(&[5]).expect("non-empty");
        assert_eq!(next.event.event_id, 1);
        assert!(p.removed(&[]).is_none());
        assert_eq!(p.next_event_id(), 2);
        let local = p.local_indexer().expect("enabled");
        assert_eq!(local.last_event_id(), Some(1));
    }

    #[test]
    fn wrong_sized_blocks_end_the_chain_without_consuming_ids() {
        let mut p = publisher();
        let input = StoredInput {
            token_ids: (0..11).collect(),
            num_block_tokens: vec![4, 3, 4],
            block_hashes: vec![1, 2, 3],
            ..Default::default()
        };
        let ev = p.stored(&input).expect("valid").expect("first block kept");
        let KvCacheEventData::Stored(s) = &ev.event.data else {
            panic!("stored")
        };
        assert_eq!(s.blocks.len(), 1);
        assert_eq!(p.dropped_blocks(), 2);
        let none = StoredInput {
            token_ids: (0..3).collect(),
            num_block_tokens: vec![3],
            block_hashes: vec![9],
            ..Default::default()
        };
        assert!(p.stored(&none).expect("valid").is_none());
        assert_eq!(p.next_event_id(), 1);
    }

    #[test]
    fn inconsistent_lengths_are_errors() {
        let mut p = publisher();
        let mut bad = stored(0..8, &[1], None);
        assert!(matches!(p.stored(&bad), Err(Error::InvalidInput(_))));
        bad.block_hashes = vec![1, 2];
        bad.token_ids.pop();
        assert!(matches!(p.stored(&bad), Err(Error::InvalidInput(_))));
        assert_eq!(p.next_event_id(), 0);
    }

    #[test]
    fn batches_validate_first_and_coalesce() {
        let mut p = publisher();
        let bad = vec![
            PublishInput::Stored(stored(0..4, &[1], None)),
            PublishInput::Stored(stored(0..4, &[1, 2], None)),
        ];
        assert!(p.batch(&bad).is_err());
        assert_eq!(p.next_event_id(), 0);
        let ok = vec![
            PublishInput::Stored(stored(0..4, &[1], None)),
            PublishInput::Stored(stored(4..8, &[2], Some(1))),
            PublishInput::Removed(vec![9]),
            PublishInput::Removed(vec![10]),
            PublishInput::Cleared,
        ];
        let events = p.batch(&ok).expect("valid");
        assert_eq!(events.len(), 3);
        let KvCacheEventData::Stored(s) = &events[0].event.data else {
            panic!("stored")
        };
        assert_eq!(s.blocks.len(), 2);
        let KvCacheEventData::Removed(r) = &events[1].event.data else {
            panic!("removed")
        };
        assert_eq!(r.block_hashes.len(), 2);
        assert_eq!(events[2].event.data, KvCacheEventData::Cleared);
        assert_eq!(
            events.iter().map(|e| e.event.event_id).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    #[test]
    fn eagle_blocks_use_the_lookahead_token() {
        let mut p = publisher();
        let input = StoredInput {
            token_ids: (0..9).collect(),
            num_block_tokens: vec![4, 4],
            block_hashes: vec![1, 2],
            is_eagle: true,
            ..Default::default()
        };
        let ev = p.stored(&input).expect("valid").expect("kept");
        let KvCacheEventData::Stored(s) = &ev.event.data else {
            panic!("stored")
        };
        let want = compute_block_hash_for_seq(
            &(0..9).collect::<Vec<_>>(),
            4,
            &BlockHashOptions {
                is_eagle: true,
                ..Default::default()
            },
        )
        .expect("bs");
        assert_eq!(
            s.blocks.iter().map(|b| b.tokens_hash).collect::<Vec<_>>(),
            want
        );
    }
}
