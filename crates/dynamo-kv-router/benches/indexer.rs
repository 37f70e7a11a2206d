//! Radix-tree indexer benchmarks on a replay of the Mooncake FAST'25 synthetic trace.
//!
//! The trace (`MOONCAKE_TRACE`, default the repository's `tests/data/mooncake/synthetic_trace.jsonl`
//! next to the repository) has one request per line with `hash_ids`, one id per 512-token
//! block; the ids are used directly as local block hashes and their chained sequence
//! hashes as external hashes. Requests go to 1,000 simulated workers (a multiplicative
//! hash of the request index); each worker keeps at most `WORKER_CAPACITY` blocks and
//! evicts its oldest request's blocks that no newer request of it still uses (deepest
//! first), so the replay contains both `stored` and `removed` events.
//!
//! Benchmarks:
//! * `indexer/apply_all_events`: every event of the replay into a fresh tree (throughput in
//!   events; blocks/s is printed too);
//! * `indexer/find_matches_trace`: all request prefixes against the final tree;
//! * a percentile pass (printed to stderr): p50/p99 latency of `find_matches` issued
//!   before each request in replay order (as a router does), alone and with a concurrent
//!   writer thread applying the replay.

use std::collections::VecDeque;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dynamo_kv_router::hashing::{LocalBlockHash, compute_seq_hash_for_block};
use dynamo_kv_router::indexer::{RadixTree, SharedRadixTree};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, decode_json_event, decode_json_event_serde,
};
use rustc_hash::FxHashMap;

const WORKERS: u64 = 1_000;
/// Blocks a simulated worker keeps before evicting (512-token blocks: 64 blocks = 32k
/// tokens). The trace spreads ~120 blocks over each of the 1,000 workers, so this bound
/// makes about a third of the requests evict, exercising `removed` events.
const WORKER_CAPACITY: usize = 64;

/// Events of one request: `(worker_id, event)`.
type Events = Vec<(u64, KvCacheEvent)>;

/// A simulated worker: its requests (oldest first, as sequence hashes), how many live
/// requests use each of its blocks, and how many distinct blocks it holds.
#[derive(Default)]
struct SimWorker {
    fifo: VecDeque<Vec<u64>>,
    refs: FxHashMap<u64, u32>,
    held: usize,
}

struct Replay {
    /// Per request: its query and the events it causes.
    requests: Vec<(Vec<LocalBlockHash>, Events)>,
    events: usize,
    blocks: usize,
}

fn trace_path() -> PathBuf {
    std::env::var_os("MOONCAKE_TRACE").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/data/mooncake/synthetic_trace.jsonl")
        },
        PathBuf::from,
    )
}

fn load_replay() -> Option<Replay> {
    let text = std::fs::read_to_string(trace_path()).ok()?;
    let mut workers: FxHashMap<u64, SimWorker> = FxHashMap::default();
    let mut requests = Vec::new();
    let (mut events, mut blocks) = (0, 0);
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let ids: Vec<LocalBlockHash> = v["hash_ids"]
            .as_array()?
            .iter()
            .filter_map(|x| x.as_u64().map(LocalBlockHash))
            .collect();
        if ids.is_empty() {
            continue;
        }
        let seq: Vec<u64> = compute_seq_hash_for_block(&ids)
            .iter()
            .map(|s| s.0)
            .collect();
        let worker = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) % WORKERS;
        let SimWorker { fifo, refs, held } = workers.entry(worker).or_default();
        let mut evs = vec![(
            worker,
            KvCacheEvent {
                event_id: 0,
                dp_rank: 0,
                data: KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: None,
                    start_position: None,
                    blocks: ids
                        .iter()
                        .zip(&seq)
                        .map(|(l, s)| KvCacheStoredBlockData::new(*s, l.0))
                        .collect(),
                }),
            },
        )];
        blocks += ids.len();
        for s in &seq {
            let r = refs.entry(*s).or_default();
            if *r == 0 {
                *held += 1;
            }
            *r += 1;
        }
        fifo.push_back(seq);
        while *held > WORKER_CAPACITY && fifo.len() > 1 {
            let Some(old) = fifo.pop_front() else { break };
            let mut gone = Vec::new();
            for s in old.iter().rev() {
                if let Some(r) = refs.get_mut(s) {
                    *r -= 1;
                    if *r == 0 {
                        refs.remove(s);
                        *held -= 1;
                        gone.push(ExternalSequenceBlockHash(*s));
                    }
                }
            }
            if !gone.is_empty() {
                blocks += gone.len();
                evs.push((
                    worker,
                    KvCacheEvent {
                        event_id: 0,
                        dp_rank: 0,
                        data: KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: gone }),
                    },
                ));
            }
        }
        events += evs.len();
        requests.push((ids, evs));
    }
    Some(Replay {
        requests,
        events,
        blocks,
    })
}

fn apply_all(tree: &mut RadixTree, replay: &Replay) {
    for (_, evs) in &replay.requests {
        for (w, ev) in evs {
            // Evictions of blocks a newer store moved are reported, not fatal.
            let _ = tree.apply_event(*w, ev);
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn percentiles(replay: &Replay) {
    // Router order: query, then the request's events.
    let tree = SharedRadixTree::new(None);
    let mut lat = Vec::with_capacity(replay.requests.len());
    for (q, evs) in &replay.requests {
        let t = Instant::now();
        black_box(tree.find_matches(q, false));
        lat.push(t.elapsed());
        for (w, ev) in evs {
            let _ = tree.apply_event(*w, ev);
        }
    }
    lat.sort_unstable();
    eprintln!(
        "find_matches in replay order ({} queries, {} workers): p50 {:?}, p99 {:?}, max {:?}",
        lat.len(),
        WORKERS,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat[lat.len() - 1]
    );

    // The same queries on the final tree while a writer thread replays everything again
    // into it (reads must not wait behind a backlog of writes).
    let tree = Arc::new(tree);
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let tree = Arc::clone(&tree);
        let done = Arc::clone(&done);
        let evs: Events = replay
            .requests
            .iter()
            .flat_map(|(_, e)| e.iter().cloned())
            .collect();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                for (w, ev) in &evs {
                    let _ = tree.apply_event(*w, ev);
                }
            }
        })
    };
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for (q, _) in &replay.requests {
            let t = Instant::now();
            black_box(tree.find_matches(q, false));
            lat.push(t.elapsed());
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = writer.join();
    lat.sort_unstable();
    eprintln!(
        "find_matches with a concurrent writer ({} queries): p50 {:?}, p99 {:?}, max {:?}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat[lat.len() - 1]
    );
}

fn bench_decode(c: &mut Criterion) {
    // A 64-block store with random-looking 20-digit hashes (4.5 kB of JSON).
    let blocks: Vec<String> = (0..64u64)
        .map(|i| {
            let h = |k: u64| (k ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xff51_afd7_ed55_8ccd);
            format!(
                r#"{{"block_hash":{},"tokens_hash":{}}}"#,
                h(2 * i),
                h(2 * i + 1)
            )
        })
        .collect();
    let text = format!(
        r#"{{"event_id":1,"data":{{"stored":{{"parent_hash":null,"blocks":[{}]}}}}}}"#,
        blocks.join(",")
    );
    let mut g = c.benchmark_group("decode_json_64_blocks");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("fast_path", |b| {
        b.iter(|| decode_json_event(black_box(text.as_bytes())));
    });
    g.bench_function("serde_json", |b| {
        b.iter(|| decode_json_event_serde(black_box(text.as_bytes())));
    });
    g.finish();
}

fn bench(c: &mut Criterion) {
    let Some(replay) = load_replay() else {
        eprintln!(
            "indexer bench: trace not found at {} (set MOONCAKE_TRACE); skipping",
            trace_path().display()
        );
        return;
    };
    eprintln!(
        "replay: {} requests, {} events, {} block operations, {} workers",
        replay.requests.len(),
        replay.events,
        replay.blocks,
        WORKERS
    );
    let mut g = c.benchmark_group("indexer");
    g.sample_size(20);
    g.throughput(Throughput::Elements(replay.events as u64));
    g.bench_function("apply_all_events", |b| {
        b.iter_batched(
            RadixTree::default,
            |mut t| {
                apply_all(&mut t, &replay);
                t
            },
            criterion::BatchSize::LargeInput,
        );
    });
    let mut tree = RadixTree::default();
    apply_all(&mut tree, &replay);
    g.throughput(Throughput::Elements(replay.requests.len() as u64));
    g.bench_function("find_matches_trace", |b| {
        b.iter(|| {
            for (q, _) in &replay.requests {
                black_box(tree.find_matches(q, false));
            }
        });
    });
    g.finish();

    let t = Instant::now();
    let mut fresh = RadixTree::default();
    apply_all(&mut fresh, &replay);
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "apply: {:.2} M events/s, {:.2} M block operations/s; final tree {} nodes, {} entries, {} KiB",
        replay.events as f64 / secs / 1e6,
        replay.blocks as f64 / secs / 1e6,
        fresh.node_count(),
        fresh.len(),
        fresh.heap_bytes() / 1024
    );
    percentiles(&replay);
}

criterion_group!(benches, bench_decode, bench);
criterion_main!(benches);
