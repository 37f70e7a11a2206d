//! Latency of one KV routing decision: hash a 10k-token prompt, look up its overlap in an
//! index of 64 workers, compute every worker's cost and select one.
//!
//! Prints p50/p99 over individually timed decisions (the targets: p50 <= 20 us,
//! p99 <= 100 us), then runs the same decision under criterion for a mean with confidence
//! interval.
//!
//! A second part times a fleet of 1,000 workers sharing 16 32-block system prompts (each
//! worker holds 8 of them plus private suffixes, so ~500 workers match a prompt), with the
//! scheduler given the overlaps as a map (`overlaps`, built per decision), as the
//! indexer's list (`device_overlaps`, spread into the scheduler's dense per-slot buffer by
//! a lookup per listed worker) and as that list with the index's slots (`index_slots`: the
//! lookups remembered by index slot, what `KvRouterCore` passes), alternating the three
//! paths decision by decision.

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
use dynamo_kv_router::scheduling::sequences::ActiveSequences;
use dynamo_kv_router::scheduling::{Scheduler, SchedulingRequest};
use rustc_hash::FxHashMap;

const WORKERS: u64 = 64;
const PROMPT_TOKENS: usize = 10_000;
const BLOCK_SIZE: usize = 16;
/// Distinct prompt families; workers cache different prefixes of them.
const FAMILIES: u32 = 32;

/// The per-worker overlap map the scheduler's map path takes (device tier only), built as
/// the router did before the dense path.
fn overlap_map(scores: &[(WorkerWithDpRank, u32)]) -> FxHashMap<WorkerWithDpRank, TierOverlap> {
    scores
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
        .collect()
}

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
        let overlaps = overlap_map(&scores.scores);
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

/// 1,000 workers sharing system prompts: the map path vs the dense path.
struct Fleet {
    tree: SharedRadixTree,
    scheduler: Scheduler,
}

const FLEET: u64 = 1_000;
const FLEET_FAMILIES: u32 = 16;
const FLEET_FAMILY_BLOCKS: usize = 32;

fn fleet_prompt(family: u32, variant: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK_SIZE) as u32)
        .map(|i| {
            if (i as usize) < FLEET_FAMILY_BLOCKS * BLOCK_SIZE {
                family * 1_000_003 + i
            } else {
                (variant + 1) * 7_919_993 + i
            }
        })
        .collect()
}

impl Fleet {
    fn new() -> Self {
        let tree = SharedRadixTree::new(None);
        let scheduler = Scheduler::new(
            BLOCK_SIZE as u32,
            KvRouterConfig::default(),
            LoadThresholds::default(),
        )
        .expect("valid config");
        let opts = BlockHashOptions::default();
        let mut rng = fastrand::Rng::with_seed(3);
        for w in 0..FLEET {
            scheduler.upsert_worker(
                WorkerWithDpRank::new(w, 0),
                Default::default(),
                Default::default(),
            );
            let mut families: Vec<u32> = (0..FLEET_FAMILIES).collect();
            rng.shuffle(&mut families);
            for (k, &family) in families[..8].iter().enumerate() {
                let tokens = fleet_prompt(family, (w * 8 + k as u64) as u32, 48);
                let local = compute_block_hash_for_seq(&tokens, BLOCK_SIZE, &opts).expect("bs");
                let seq = compute_seq_hash_for_block(&local);
                let blocks = local
                    .iter()
                    .zip(&seq)
                    .map(|(l, s)| KvCacheStoredBlockData::new(s.0, l.0))
                    .collect();
                let ev = KvCacheEvent {
                    event_id: k as u64,
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

    fn decide(&self, tokens: &[u32], path: Path) -> WorkerWithDpRank {
        let local = compute_block_hash_for_seq(tokens, BLOCK_SIZE, &BlockHashOptions::default())
            .expect("bs");
        let seq = compute_seq_hash_for_block(&local);
        let scores = self.tree.find_matches(&local, false);
        let req = SchedulingRequest {
            isl_tokens: tokens.len(),
            seq_hashes: &seq,
            ..Default::default()
        };
        let sel = match path {
            Path::Map => {
                let overlaps = overlap_map(&scores.scores);
                self.scheduler.select(&SchedulingRequest {
                    overlaps: Some(&overlaps),
                    ..req
                })
            }
            Path::ByWorker => self.scheduler.select(&SchedulingRequest {
                device_overlaps: Some(&scores.scores),
                ..req
            }),
            Path::BySlot => self.scheduler.select(&SchedulingRequest {
                device_overlaps: Some(&scores.scores),
                index_slots: Some(&scores.index_slots),
                ..req
            }),
        };
        sel.expect("workers exist").worker
    }
}

/// How the fleet's scheduler is given the overlaps.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// A map built per decision.
    Map,
    /// The indexer's list, by worker id (a lookup per listed worker).
    ByWorker,
    /// The list with the index's slots (what `KvRouterCore` passes).
    BySlot,
}

fn fleet_ab() {
    let fleet = Fleet::new();
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|v| fleet_prompt(v % FLEET_FAMILIES, 1_000_000 + v, 128))
        .collect();
    let paths = [Path::Map, Path::ByWorker, Path::BySlot];
    let mut by_path: [Vec<Duration>; 3] = std::array::from_fn(|_| Vec::with_capacity(20_000));
    for i in 0..60_000 {
        let p = &prompts[i % prompts.len()];
        let k = i % paths.len();
        let t0 = Instant::now();
        black_box(fleet.decide(black_box(p), paths[k]));
        let t = t0.elapsed();
        if i >= 1_500 {
            by_path[k].push(t);
        }
    }
    let [map, by_worker, by_slot] = by_path;
    // Busy fleet: every worker has 4 booked requests (a shared system prompt and a private
    // suffix each), then decisions (dense path) that book nothing. Beside it, the per-worker
    // scan the scheduler did before the reverse index of booked blocks: one
    // `ActiveSequences::new_blocks` per worker (a lookup per request block).
    let mut seqs: Vec<ActiveSequences> = Vec::new();
    for w in 0..FLEET {
        let mut s = ActiveSequences::default();
        for k in 0..4u64 {
            let p = fleet_prompt(
                ((w + k) % u64::from(FLEET_FAMILIES)) as u32,
                (w * 4 + k) as u32,
                64,
            );
            let local = compute_block_hash_for_seq(&p, BLOCK_SIZE, &BlockHashOptions::default())
                .expect("bs");
            let seq = compute_seq_hash_for_block(&local);
            let id = format!("b{w}-{k}");
            fleet
                .scheduler
                .select(&SchedulingRequest {
                    request_id: Some(&id),
                    isl_tokens: p.len(),
                    seq_hashes: &seq,
                    pinned: Some(WorkerWithDpRank::new(w, 0)),
                    ..Default::default()
                })
                .expect("pinned");
            s.add_request(&id, seq, 0).expect("new");
        }
        seqs.push(s);
    }
    let mut busy = Vec::with_capacity(20_000);
    let mut scan = Vec::with_capacity(20_000);
    for i in 0..20_000 {
        let p = &prompts[i % prompts.len()];
        let t0 = Instant::now();
        black_box(fleet.decide(black_box(p), Path::BySlot));
        busy.push(t0.elapsed());
        let local =
            compute_block_hash_for_seq(p, BLOCK_SIZE, &BlockHashOptions::default()).expect("bs");
        let seq = compute_seq_hash_for_block(&local);
        let t0 = Instant::now();
        let n: usize = seqs.iter().map(|s| s.new_blocks(black_box(&seq))).sum();
        black_box(n);
        scan.push(t0.elapsed());
    }
    for (name, mut samples) in [
        ("map", map),
        ("dense, by worker", by_worker),
        ("dense, by index slot", by_slot),
        ("dense by index slot, 4 bookings per worker", busy),
        (
            "old per-worker booked-block scan alone (1,000 x new_blocks)",
            scan,
        ),
    ] {
        samples.sort();
        let pct = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
        #[expect(clippy::print_stdout, reason = "a benchmark's report")]
        {
            println!(
                "routing decision (2,048 tokens, {FLEET} workers sharing prefixes), {name}: p50 {:?}, p99 {:?}, max {:?}",
                pct(0.5),
                pct(0.99),
                samples[samples.len() - 1]
            );
        }
    }
}

/// `--fleet-idle N`: only the idle fleet's dense decisions, `N` of them (0: only build the
/// fleet), for a CPU-time comparison that preemption on a shared machine does not blur:
/// `perf stat -e task-clock` of a run with `N` decisions minus one with 0, divided by `N`.
///
/// With `--cold MB`, every decision starts with cold caches: an `MB`-megabyte buffer is
/// written between decisions (untimed), as the event ingestion on the other core does to a
/// router's caches between two routing decisions (the 1,000-publisher storm). A profile
/// of this mode shows where a decision waits on memory rather than where it computes.
///
/// With `--by-worker`, the scheduler is not given the index's slots (one lookup per listed
/// worker, as before they were passed): an A/B in one binary.
fn fleet_idle(n: usize, cold_mb: usize, path: Path) {
    let fleet = Fleet::new();
    let prompts: Vec<Vec<u32>> = (0..64)
        .map(|v| fleet_prompt(v % FLEET_FAMILIES, 1_000_000 + v, 128))
        .collect();
    let mut samples = Vec::with_capacity(n);
    let mut sweep = vec![0u64; cold_mb << 17];
    for i in 0..n {
        let p = &prompts[i % prompts.len()];
        for (k, x) in sweep.iter_mut().enumerate().step_by(8) {
            *x = x.wrapping_add(k as u64);
        }
        black_box(&sweep);
        let t0 = Instant::now();
        black_box(fleet.decide(black_box(p), path));
        samples.push(t0.elapsed());
    }
    if samples.is_empty() {
        return;
    }
    samples.sort();
    let pct = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    #[expect(clippy::print_stdout, reason = "a benchmark's report")]
    {
        println!(
            "routing decision (2,048 tokens, {FLEET} workers sharing prefixes), dense ({path:?}), idle fleet, {n} decisions, caches swept by {cold_mb} MB between: p10 {:?}, p50 {:?}, p99 {:?}",
            pct(0.1),
            pct(0.5),
            pct(0.99)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--fleet-idle") {
        let cold_mb = args
            .iter()
            .position(|a| a == "--cold")
            .and_then(|j| args.get(j + 1)?.parse().ok())
            .unwrap_or(0);
        fleet_idle(
            args.get(i + 1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(40_000),
            cold_mb,
            if args.iter().any(|a| a == "--by-worker") {
                Path::ByWorker
            } else {
                Path::BySlot
            },
        );
        return;
    }
    if args.iter().any(|a| a == "--fleet-only") {
        fleet_ab();
        return;
    }
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
    fleet_ab();
}
