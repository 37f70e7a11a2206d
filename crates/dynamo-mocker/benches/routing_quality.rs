//! Routing quality on the Mooncake trace: round-robin vs random vs KV-aware routing over
//! simulated mocker workers with finite KV caches.
//!
//! ```text
//! cargo bench -p dynamo-mocker --bench routing_quality [-- --workers 8 --blocks 4096 ...]
//! ```
//!
//! A discrete-event simulation (simulated time, no sleeping): requests arrive at the trace's
//! timestamps divided by a compression factor; each worker is a [`MockEngine`] whose steps
//! take the mocker's simulated time; KV events and first-token/finish notifications reach
//! the router when the step that produced them ends. The KV router is the real
//! `dynamo_kv_router` indexer ([`SharedRadixTree`]) and [`Scheduler`]. Reported per mode and
//! load: prefix-hit ratio (prompt tokens served from cache), time to first token, and the
//! rejection rate (requests no worker could take).
//!
//! Trace tokens: each 512-token Mooncake block id expands deterministically into 512 token
//! ids, so equal ids give equal tokens and equal KV blocks.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::io::BufRead;

use dynamo_kv_router::hashing::{
    BlockHashOptions, compute_block_hash_for_seq, compute_seq_hash_for_block,
};
use dynamo_kv_router::indexer::SharedRadixTree;
use dynamo_kv_router::protocols::{KvCacheEvent, KvCacheEventData, WorkerWithDpRank};
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::{LoadThresholds, TierOverlap, WorkerCapacity};
use dynamo_kv_router::scheduling::{Scheduler, SchedulingRequest};
use dynamo_mocker::{MockEngine, MockEngineArgs, MockRequest};
use rustc_hash::FxHashMap;

const MOONCAKE_BLOCK: usize = 512;

struct Row {
    arrival_ms: f64,
    input_length: usize,
    output_length: usize,
    hash_ids: Vec<u64>,
}

fn load_trace(path: &str) -> Vec<Row> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    std::io::BufReader::new(file)
        .lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(&line.expect("readable trace")).expect("JSON row");
            Row {
                arrival_ms: v["timestamp"].as_f64().expect("timestamp"),
                input_length: v["input_length"].as_u64().expect("input_length") as usize,
                output_length: v["output_length"].as_u64().expect("output_length") as usize,
                hash_ids: v["hash_ids"]
                    .as_array()
                    .expect("hash_ids")
                    .iter()
                    .map(|h| h.as_u64().expect("u64 id"))
                    .collect(),
            }
        })
        .collect()
}

fn tokens_for(row: &Row) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(row.input_length);
    'outer: for &id in &row.hash_ids {
        for j in 0..MOONCAKE_BLOCK as u64 {
            if tokens.len() == row.input_length {
                break 'outer;
            }
            let x =
                (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ j).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            tokens.push((x >> 40) as u32 % 32_000);
        }
    }
    // Prompts longer than their ids cover get unique filler tokens.
    let salt = row.arrival_ms.to_bits();
    while tokens.len() < row.input_length {
        tokens.push((salt.wrapping_add(tokens.len() as u64) % 32_000) as u32);
    }
    tokens
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    RoundRobin,
    Random,
    Kv,
}

/// A router-side update that becomes visible at `at_ms`.
enum Update {
    Events(u64, Vec<KvCacheEventData>),
    FirstToken(String),
    Finished(String),
}

struct Pending {
    at_ms: f64,
    seq: u64,
    update: Update,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on time, then insertion order.
        o.at_ms
            .total_cmp(&self.at_ms)
            .then_with(|| o.seq.cmp(&self.seq))
    }
}

struct Report {
    hit_ratio: f64,
    ttft_mean: f64,
    ttft_p50: f64,
    ttft_p99: f64,
    rejected: f64,
    makespan_s: f64,
}

struct Config {
    workers: usize,
    blocks: usize,
    block_size: usize,
    speedup: f64,
}

fn simulate(trace: &[Row], mode: Mode, compression: f64, cfg: &Config) -> Report {
    let args = MockEngineArgs {
        num_gpu_blocks: cfg.blocks,
        block_size: cfg.block_size,
        speedup_ratio: cfg.speedup,
        ..Default::default()
    };
    let mut engines: Vec<MockEngine> = (0..cfg.workers)
        .map(|_| MockEngine::new(args.clone()).expect("valid args"))
        .collect();
    let mut clock = vec![0.0f64; cfg.workers];
    let tree = SharedRadixTree::new(None);
    let scheduler = Scheduler::with_rng(
        cfg.block_size as u32,
        KvRouterConfig::default(),
        LoadThresholds::default(),
        fastrand::Rng::with_seed(7),
    )
    .expect("valid router config");
    for w in 0..cfg.workers {
        scheduler.upsert_worker(
            WorkerWithDpRank::new(w as u64, 0),
            Default::default(),
            WorkerCapacity {
                total_kv_blocks: Some(cfg.blocks as u64),
                max_num_batched_tokens: Some(args.max_num_batched_tokens as u64),
                kv_used_blocks: None,
            },
        );
    }
    let mut rng = fastrand::Rng::with_seed(11);
    let mut pending = BinaryHeap::new();
    let mut pending_seq = 0u64;
    let mut event_ids = vec![0u64; cfg.workers];
    let mut arrivals: FxHashMap<String, (f64, usize)> = FxHashMap::default();
    let (mut ttfts, mut prompt_tokens, mut cached_tokens, mut rejected) =
        (Vec::new(), 0u64, 0u64, 0usize);
    let mut next = 0usize;
    let mut rr = 0usize;

    let apply_until = |t: f64, pending: &mut BinaryHeap<Pending>, event_ids: &mut Vec<u64>| {
        while pending.peek().is_some_and(|p| p.at_ms <= t) {
            let Some(p) = pending.pop() else { break };
            match p.update {
                Update::Events(worker, events) => {
                    for data in events {
                        event_ids[worker as usize] += 1;
                        let ev = KvCacheEvent {
                            event_id: event_ids[worker as usize],
                            data,
                            dp_rank: 0,
                        };
                        // A remove of an already-dropped parent's child is a counted no-op.
                        let _ = tree.apply_event(worker, &ev);
                    }
                }
                Update::FirstToken(id) => {
                    let _ = scheduler.mark_prefill_completed(&id);
                }
                Update::Finished(id) => {
                    let _ = scheduler.free(&id);
                }
            }
        }
    };

    loop {
        let busy = (0..cfg.workers)
            .filter(|&w| engines[w].has_work())
            .min_by(|&a, &b| clock[a].total_cmp(&clock[b]));
        let arrival = trace.get(next).map(|r| r.arrival_ms / compression);
        match (arrival, busy) {
            (None, None) => break,
            (Some(t), b) if b.is_none_or(|w| t <= clock[w]) => {
                apply_until(t, &mut pending, &mut event_ids);
                let row = &trace[next];
                let id = format!("req-{next}");
                next += 1;
                let tokens = tokens_for(row);
                let worker = match mode {
                    Mode::RoundRobin => {
                        rr += 1;
                        (rr - 1) % cfg.workers
                    }
                    Mode::Random => rng.usize(..cfg.workers),
                    Mode::Kv => {
                        let local = compute_block_hash_for_seq(
                            &tokens,
                            cfg.block_size,
                            &BlockHashOptions::default(),
                        )
                        .expect("block size > 0");
                        let seq = compute_seq_hash_for_block(&local);
                        let scores = tree.find_matches(&local, false);
                        let overlaps: FxHashMap<WorkerWithDpRank, TierOverlap> = (0..cfg.workers)
                            .filter_map(|w| {
                                let key = WorkerWithDpRank::new(w as u64, 0);
                                scores.get(key).map(|d| {
                                    (
                                        key,
                                        TierOverlap {
                                            device: d,
                                            ..Default::default()
                                        },
                                    )
                                })
                            })
                            .collect();
                        let sel = scheduler.select(&SchedulingRequest {
                            request_id: Some(&id),
                            isl_tokens: tokens.len(),
                            seq_hashes: &seq,
                            overlaps: Some(&overlaps),
                            ..Default::default()
                        });
                        match sel {
                            Ok(s) => s.worker.worker_id as usize,
                            Err(_) => {
                                rejected += 1;
                                continue;
                            }
                        }
                    }
                };
                let n = tokens.len();
                match engines[worker].add_request(MockRequest::new(
                    id.clone(),
                    tokens,
                    row.output_length.max(1),
                )) {
                    Ok(()) => {
                        clock[worker] = clock[worker].max(t);
                        arrivals.insert(id, (t, n));
                    }
                    Err(_) => {
                        rejected += 1;
                        if mode == Mode::Kv {
                            let _ = scheduler.free(&id);
                        }
                    }
                }
            }
            (_, Some(w)) => {
                let step = engines[w].step();
                let end = clock[w] + step.duration_ms;
                clock[w] = end;
                for out in &step.outputs {
                    if out.index == 0
                        && let Some(&(arrived, n)) = arrivals.get(&*out.request_id)
                    {
                        ttfts.push(end - arrived);
                        prompt_tokens += n as u64;
                        cached_tokens += out.cached_tokens.unwrap_or(0) as u64;
                        pending_seq += 1;
                        pending.push(Pending {
                            at_ms: end,
                            seq: pending_seq,
                            update: Update::FirstToken(out.request_id.to_string()),
                        });
                    }
                    if out.finished {
                        pending_seq += 1;
                        pending.push(Pending {
                            at_ms: end,
                            seq: pending_seq,
                            update: Update::Finished(out.request_id.to_string()),
                        });
                    }
                }
                if !step.events.is_empty() {
                    pending_seq += 1;
                    pending.push(Pending {
                        at_ms: end,
                        seq: pending_seq,
                        update: Update::Events(w as u64, step.events),
                    });
                }
            }
            (Some(_), None) => unreachable!("handled by the arrival arm"),
        }
    }
    ttfts.sort_by(f64::total_cmp);
    let pct = |p: f64| ttfts[((ttfts.len() - 1) as f64 * p) as usize];
    Report {
        hit_ratio: cached_tokens as f64 / prompt_tokens.max(1) as f64,
        ttft_mean: ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64,
        ttft_p50: pct(0.5),
        ttft_p99: pct(0.99),
        rejected: rejected as f64 / trace.len() as f64,
        makespan_s: clock.iter().copied().fold(0.0, f64::max) / 1000.0,
    }
}

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[expect(clippy::print_stdout, reason = "the benchmark's report is its output")]
fn main() {
    let default_trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/mooncake/synthetic_trace.jsonl"
    );
    let path = std::env::var("MOONCAKE_TRACE").unwrap_or_else(|_| default_trace.to_owned());
    let limit = arg("--requests", f64::INFINITY);
    let mut trace = load_trace(&path);
    if limit.is_finite() {
        trace.truncate(limit as usize);
    }
    let cfg = Config {
        workers: arg("--workers", 8.0) as usize,
        blocks: arg("--blocks", 16384.0) as usize,
        block_size: arg("--block-size", 64.0) as usize,
        speedup: 1.0,
    };
    let loads = [
        ("moderate", arg("--moderate", 2.0)),
        ("high", arg("--high", 4.0)),
    ];
    println!(
        "Mooncake synthetic trace: {} requests; {} workers x {} blocks of {} tokens; \
         trace time compressed by the factor shown.\n",
        trace.len(),
        cfg.workers,
        cfg.blocks,
        cfg.block_size
    );
    println!(
        "| load | mode | prefix-hit ratio | TTFT mean (ms) | TTFT p50 (ms) | TTFT p99 (ms) | rejected | makespan (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, compression) in loads {
        for mode in [Mode::RoundRobin, Mode::Random, Mode::Kv] {
            let r = simulate(&trace, mode, compression, &cfg);
            println!(
                "| {label} ({compression}x) | {mode:?} | {:.3} | {:.0} | {:.0} | {:.0} | {:.2}% | {:.0} |",
                r.hit_ratio,
                r.ttft_mean,
                r.ttft_p50,
                r.ttft_p99,
                r.rejected * 100.0,
                r.makespan_s
            );
        }
    }
}
