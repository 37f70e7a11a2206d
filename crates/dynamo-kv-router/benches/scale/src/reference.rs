//! The published `dynamo-kv-router` 1.6.1 as candidates: its `RadixTree` for the scale
//! pass and its `ConcurrentRadixTreeCompressed` (readers on the caller's threads, events
//! applied by the tree's own worker thread from a channel, as its indexer runs it) for the
//! reader/writer pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_kv_router::hashing::LocalBlockHash;
use dynamo_kv_router::protocols::{KvCacheEvent, KvCacheEventData};
use dynamo_kv_router_ref as r;
use r::SyncIndexer;
use r::indexer::WorkerTask;
use r::protocols as rp;

use crate::harness::{Candidate, Index, SharedIndex};

/// Our event as the reference's `RouterEvent` (done before any clock starts).
fn convert(worker: u64, ev: &KvCacheEvent) -> rp::RouterEvent {
    let data = match &ev.data {
        KvCacheEventData::Stored(s) => rp::KvCacheEventData::Stored(rp::KvCacheStoreData {
            parent_hash: s.parent_hash.map(|p| rp::ExternalSequenceBlockHash(p.0)),
            start_position: None,
            blocks: s
                .blocks
                .iter()
                .map(|b| rp::KvCacheStoredBlockData {
                    block_hash: rp::ExternalSequenceBlockHash(b.block_hash.0),
                    tokens_hash: rp::LocalBlockHash(b.tokens_hash.0),
                    mm_extra_info: None,
                })
                .collect(),
        }),
        KvCacheEventData::Removed(d) => rp::KvCacheEventData::Removed(rp::KvCacheRemoveData {
            block_hashes: d
                .block_hashes
                .iter()
                .map(|h| rp::ExternalSequenceBlockHash(h.0))
                .collect(),
        }),
        KvCacheEventData::Cleared => rp::KvCacheEventData::Cleared,
    };
    rp::RouterEvent::new(
        worker,
        rp::KvCacheEvent {
            event_id: ev.event_id,
            data,
            dp_rank: ev.dp_rank,
        },
    )
}

fn query(q: &[LocalBlockHash]) -> Vec<rp::LocalBlockHash> {
    q.iter().map(|h| rp::LocalBlockHash(h.0)).collect()
}

fn best(s: &rp::OverlapScores) -> u32 {
    s.scores.values().copied().max().unwrap_or(0)
}

struct RefTree(r::RadixTree);

impl Index for RefTree {
    fn apply(&mut self, worker: u64, event: &KvCacheEvent) -> Duration {
        let ev = convert(worker, event);
        let t = Instant::now();
        let _ = std::hint::black_box(self.0.apply_event(ev));
        t.elapsed()
    }
    fn find(&self, q: &[LocalBlockHash]) -> (Duration, u32) {
        let q = query(q);
        let t = Instant::now();
        let s = self.0.find_matches(q, false);
        let e = t.elapsed();
        (e, best(&s))
    }
}

struct RefConcurrent {
    tree: Arc<r::ConcurrentRadixTreeCompressed>,
    tx: flume::Sender<WorkerTask>,
}

impl SharedIndex for RefConcurrent {
    fn apply(&self, worker: u64, event: &KvCacheEvent) {
        let _ = self.tx.send(WorkerTask::Event(convert(worker, event)));
    }
    fn find(&self, q: &[LocalBlockHash]) -> u32 {
        let q = query(q);
        best(&SyncIndexer::find_matches(&*self.tree, &q, false))
    }
    fn sync(&self) {
        // The worker thread applies in order: an acknowledged no-op event after the others
        // means they are applied.
        let (resp, rx) = tokio_oneshot();
        let ev = rp::RouterEvent::new(
            u64::MAX,
            rp::KvCacheEvent {
                event_id: 0,
                data: rp::KvCacheEventData::Cleared,
                dp_rank: 0,
            },
        );
        let _ = self.tx.send(WorkerTask::EventWithAck { event: ev, resp });
        let _ = rx.blocking_recv();
    }
}

fn tokio_oneshot() -> (
    tokio::sync::oneshot::Sender<bool>,
    tokio::sync::oneshot::Receiver<bool>,
) {
    tokio::sync::oneshot::channel()
}

fn shared_ref() -> Arc<dyn SharedIndex> {
    let tree = Arc::new(r::ConcurrentRadixTreeCompressed::new());
    // Bounded like a real event channel: a writer faster than the tree blocks instead of
    // queueing without limit.
    let (tx, rx) = flume::bounded(4096);
    let worker = Arc::clone(&tree);
    std::thread::spawn(move || {
        let _ = worker.worker(rx, None);
    });
    Arc::new(RefConcurrent { tree, tx })
}

/// The reference candidates.
pub fn reference() -> Candidate {
    Candidate {
        name: "ref",
        single: || Box::new(RefTree(r::RadixTree::new())),
        shared: Some(shared_ref),
    }
}
