//! Latency of one KV routing decision: hash a 10k-token prompt, look up its overlap in an
//! index of 64 workers, compute every worker's cost and select one.
//!
//! Prints p50/p99 over individually timed decisions (the targets: p50 <= 20 us,
//! p99 <= 100 us), then runs the same decision under criterion for a mean with confidence
//! interval.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use dynamo_kv_router::hashing::{
    BlockHashOptions, compute_block_hash_for_seq, compute_seq_hash_for_block,
};
use dynamo_kv_router::indexer::SharedRadixTree;
use dynamo_kv_router::protocols::{
    KvCacheEvent, KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData, WorkerWithDpRank,
};
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::{LoadThresholds, TierOverlap};
use dynamo_kv_router::scheduling::{Scheduler, SchedulingRequest};
use rustc_hash::FxHashMap;

const WORKERS: u64 = 64;
const PROMPT_TOKENS: usize = 10_000;
const BLOCK_SIZE: usize = 16;
/// Distinct prompt families; workers cache different prefixes of them.
const FAMILIES: u32 = 32;

fn prompt(family: u32, variant: u32) -> Vec<u32> {
    // The first 60% of tokens are shared by a family, the rest is per variant.
    (0..PROMPT_TOKENS as u32)
        .map(|i| {
            if (i as usize) < PROMPT_TOKENS * 6 / 10 {
                family * 1_000_003 + i
            } else {
                variant * 7_919 + i
            }
        })
        .collect()
}

struct Router {
    tree: SharedRadixTree,
    scheduler: Scheduler,
}

impl Router {
    fn new() -> Self {
        let tree = SharedRadixTree::new(None);
        let scheduler = Scheduler::new(
            BLOCK_SIZE as u32,
            KvRouterConfig::default(),
            LoadThresholds::default(),
        )
        .expect("valid config");
        let opts = BlockHashOptions::default();
        for w in 0..WORKERS {
            scheduler.upsert_worker(
                WorkerWithDpRank::new(w, 0),
                Default::default(),
                Default::default(),
            );
            // Each worker caches a prefix of two families, of varying depth.
            for k in 0..2 {
                let family = ((w as u32) * 2 + k) % FAMILIES;
                let tokens = prompt(family, w as u32);
                let local = compute_block_hash_for_seq(&tokens, BLOCK_SIZE, &opts).expect("bs");
                let seq = compute_seq_hash_for_block(&local);
                let depth = 100 + (w as usize * 37) % (local.len() - 100);
                let blocks = local[..depth]
                    .iter()
                    .zip(&seq)
                    .map(|(l, s)| KvCacheStoredBlockData::new(s.0, l.0))
                    .collect();
                let ev = KvCacheEvent {
                    event_id: k.into(),
                    data: KvCacheEventData::Stored(KvCacheStoreData {
                        parent_hash: None,
                        start_position: None,
                        blocks,
                    }),
                    dp_rank: 0,
                };
                tree.apply_event(w, &ev).expect("valid event");
            }
        }
        Self { tree, scheduler }
    }

    fn decide(&self, tokens: &[u32]) -> WorkerWithDpRank {
        let local = compute_block_hash_for_seq(tokens, BLOCK_SIZE, &BlockHashOptions::default())
            .expect("bs");
        let seq = compute_seq_hash_for_block(&local);
        let scores = self.tree.find_matches(&local, false);
        let overlaps: FxHashMap<WorkerWithDpRank, TierOverlap> = scores
            .scores
            .iter()
            .map(|&(w, d)| {
                (
                    w,
                    TierOverlap {
                        device: d,
                        ..Default::default()
                    },
                )
            })
            .collect();
        self.scheduler
            .select(&SchedulingRequest {
                isl_tokens: tokens.len(),
                seq_hashes: &seq,
                overlaps: Some(&overlaps),
                ..Default::default()
            })
            .expect("workers exist")
            .worker
    }
}

fn main() {
    let router = Router::new();
    let prompts: Vec<Vec<u32>> = (0..FAMILIES).map(|f| prompt(f, 999)).collect();
    for p in &prompts {
        black_box(router.decide(p));
    }
    let mut samples: Vec<Duration> = Vec::with_capacity(20_000);
    for i in 0..20_000 {
        let p = &prompts[i % prompts.len()];
        let t0 = Instant::now();
        black_box(router.decide(black_box(p)));
        samples.push(t0.elapsed());
    }
    samples.sort();
    let pct = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    // Criterion's own output goes to stdout as well; this summary line is the bench result.
    #[expect(clippy::print_stdout, reason = "a benchmark's report")]
    {
        println!(
            "routing decision (10k tokens, {WORKERS} workers): p50 {:?}, p99 {:?}, max {:?}",
            pct(0.5),
            pct(0.99),
            samples[samples.len() - 1]
        );
    }

    let mut c = Criterion::default().configure_from_args();
    c.bench_function("routing_decision_10k_tokens_64_workers", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            router.decide(&prompts[i % prompts.len()])
        })
    });
    c.final_summary();
}
