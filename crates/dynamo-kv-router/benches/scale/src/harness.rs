//! The indexer scale harness: a realistic event stream at 100k–50M live blocks, applied to
//! every candidate index in turn (same stream, same process), with apply ns/block, find
//! p50/p99 and heap bytes per live block; and a reader/writer pass (N reader threads while
//! one writer applies events).
//!
//! Compiled twice: as the workspace bench `indexer_scale` (our tree only) and as the binary
//! of the standalone `dynamo-kv-router-scale-bench` crate, which adds the published
//! reference crate behind its `bench-reference` feature (see its Cargo.toml for why it is a
//! workspace of its own).
//!
//! # The stream
//! The Mooncake FAST'25 trace (`MOONCAKE_TRACE`, default `shared/data/mooncake/
//! synthetic_trace.jsonl` beside the repository; 3,993 requests, one id per 512-token
//! block, equal ids = shared prefix) is replayed round after round, every round with its
//! ids offset past the previous round's, so prefixes are shared within a round as in the
//! trace and the set of distinct blocks grows without bound. Request `k` goes to worker
//! `mix(k) % workers`. Each simulated worker keeps at most `live / workers` blocks: a new
//! request stores only the blocks the worker does not already hold (one `stored` event whose
//! parent is the last held block, as an engine reports newly computed blocks), and while
//! the worker is over capacity its oldest request's blocks that no newer request uses are
//! evicted deepest first (one `removed` event): an LRU at request granularity. The run
//! fills to the target number of live `(worker, block)` pairs, then continues in steady
//! state (stores and evictions) for `max(live / 4, 20,000 requests)`.
//!
//! # The figures
//! * apply ns/block: time inside `apply` (fill and steady state) / block operations
//!   (stored + removed blocks); per-event max shows growth spikes.
//! * find p50/p99: in the steady state, one `find_matches` of each request's blocks just
//!   before its events are applied (the router's order), timed one by one.
//! * heap B/block: live heap bytes (a counting global allocator) released when the index is
//!   dropped at the end, divided by the live blocks.
//! * With `SCALE_CLEAR_RANK=1`, the time of one rank's `cleared` event on the full index
//!   (printed per round, before the index is dropped).

#![expect(clippy::print_stdout, reason = "the bench prints its tables")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::VecDeque;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dynamo_kv_router::hashing::{LocalBlockHash, compute_seq_hash_for_block};
use dynamo_kv_router::indexer::{RadixTree, SharedRadixTree};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData,
};
use rustc_hash::FxHashMap;

// ----- heap accounting ------------------------------------------------------------------

/// The system allocator, counting live bytes (for heap bytes per block).
pub(crate) struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
#[expect(
    unsafe_code,
    reason = "a counting wrapper of the system allocator (heap bytes per block)"
)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

// ----- the candidates -------------------------------------------------------------------

/// A single-threaded index under test. `apply` and `find` time only the index's own work
/// (conversion of the event into the index's types happens before the clock starts).
pub(crate) trait Index {
    /// Apply one event of `worker`; returns the time spent inside the index.
    fn apply(&mut self, worker: u64, event: &KvCacheEvent) -> Duration;
    /// One prefix match; returns its time and the best score (to check agreement).
    fn find(&self, query: &[LocalBlockHash]) -> (Duration, u32);
}

/// An index shared between one writer and N reader threads.
pub(crate) trait SharedIndex: Send + Sync {
    /// Apply (or hand to the index's own writer) one event of `worker`.
    fn apply(&self, worker: u64, event: &KvCacheEvent);
    /// One prefix match; returns the best score.
    fn find(&self, query: &[LocalBlockHash]) -> u32;
    /// Wait until every applied event is visible to readers.
    fn sync(&self) {}
}

/// A named constructor of an index under test.
pub(crate) struct Candidate {
    /// Shown in the tables.
    pub(crate) name: &'static str,
    /// A fresh empty single-threaded index.
    pub(crate) single: fn() -> Box<dyn Index>,
    /// A fresh empty shared index (for the reader/writer pass), where it has one.
    pub(crate) shared: Option<fn() -> Arc<dyn SharedIndex>>,
}

struct Ours(RadixTree);

impl Index for Ours {
    fn apply(&mut self, worker: u64, event: &KvCacheEvent) -> Duration {
        let t = Instant::now();
        // Evictions of blocks a newer store moved are reported, not fatal.
        let _ = black_box(self.0.apply_event(worker, event));
        t.elapsed()
    }
    fn find(&self, query: &[LocalBlockHash]) -> (Duration, u32) {
        let t = Instant::now();
        let r = self.0.find_matches(query, false);
        let e = t.elapsed();
        (e, r.scores.iter().map(|&(_, s)| s).max().unwrap_or(0))
    }
}

struct OursShared(SharedRadixTree);

impl SharedIndex for OursShared {
    fn apply(&self, worker: u64, event: &KvCacheEvent) {
        let _ = self.0.apply_event(worker, event);
    }
    fn find(&self, query: &[LocalBlockHash]) -> u32 {
        let r = self.0.find_matches(query, false);
        r.scores.iter().map(|&(_, s)| s).max().unwrap_or(0)
    }
}

/// This project's tree.
pub(crate) fn ours() -> Candidate {
    Candidate {
        name: "ours",
        single: || Box::new(Ours(RadixTree::default())),
        shared: Some(|| Arc::new(OursShared(SharedRadixTree::new(None)))),
    }
}

// ----- the stream -----------------------------------------------------------------------

#[inline]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn trace_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MOONCAKE_TRACE") {
        return PathBuf::from(p);
    }
    // `shared/` beside the repository, found from either crate that compiles this file.
    let rel = "shared/data/mooncake/synthetic_trace.jsonl";
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|d| d.join(rel))
        .find(|p| p.exists())
        .unwrap_or_else(|| here.join(rel))
}

/// The trace's requests (block ids), and one past the largest id.
fn load_trace() -> Result<(Vec<Vec<u64>>, u64), String> {
    let path = trace_path();
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut reqs = Vec::new();
    let mut max = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let ids: Vec<u64> = v["hash_ids"]
            .as_array()
            .ok_or("hash_ids")?
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect();
        if let Some(&m) = ids.iter().max() {
            max = max.max(m + 1);
        }
        if !ids.is_empty() {
            reqs.push(ids);
        }
    }
    Ok((reqs, max))
}

#[derive(Default)]
struct SimWorker {
    /// Live requests, oldest first, as sequence hashes.
    fifo: VecDeque<Vec<u64>>,
    /// How many live requests use each held block.
    refs: FxHashMap<u64, u32>,
}

/// One request of the stream: the router's query and the events the request causes.
struct Request {
    query: Vec<LocalBlockHash>,
    events: Vec<(u64, KvCacheEvent)>,
    block_ops: usize,
}

/// Deterministic generator of the stream (see the module docs).
struct Stream<'a> {
    trace: &'a [Vec<u64>],
    id_span: u64,
    workers: Vec<SimWorker>,
    capacity: usize,
    next: u64,
    live: usize,
}

impl<'a> Stream<'a> {
    fn new(trace: &'a [Vec<u64>], id_span: u64, workers: usize, live_target: usize) -> Self {
        Self {
            trace,
            id_span,
            workers: (0..workers).map(|_| SimWorker::default()).collect(),
            capacity: (live_target / workers).max(1),
            next: 0,
            live: 0,
        }
    }

    fn next_request(&mut self) -> Request {
        let k = self.next;
        self.next += 1;
        let round = k / self.trace.len() as u64;
        let ids = &self.trace[(k % self.trace.len() as u64) as usize];
        let query: Vec<LocalBlockHash> = ids
            .iter()
            .map(|&i| LocalBlockHash(i + round * self.id_span))
            .collect();
        let seq: Vec<u64> = compute_seq_hash_for_block(&query)
            .iter()
            .map(|s| s.0)
            .collect();
        let w = (mix(k) % self.workers.len() as u64) as usize;
        let worker_id = w as u64;
        let sim = &mut self.workers[w];
        // Held sets are prefix-closed (a request holds a whole chain, evictions drop the
        // blocks only a departing request used), so the held blocks form a prefix.
        let held = seq.iter().take_while(|s| sim.refs.contains_key(s)).count();
        let mut events = Vec::new();
        let mut block_ops = 0;
        if held < seq.len() {
            let blocks: Vec<KvCacheStoredBlockData> = (held..seq.len())
                .map(|i| KvCacheStoredBlockData::new(seq[i], query[i].0))
                .collect();
            block_ops += blocks.len();
            events.push((
                worker_id,
                KvCacheEvent {
                    event_id: k,
                    dp_rank: 0,
                    data: KvCacheEventData::Stored(KvCacheStoreData {
                        parent_hash: (held > 0).then(|| ExternalSequenceBlockHash(seq[held - 1])),
                        start_position: None,
                        blocks,
                    }),
                },
            ));
        }
        for s in &seq {
            let r = sim.refs.entry(*s).or_default();
            if *r == 0 {
                self.live += 1;
            }
            *r += 1;
        }
        sim.fifo.push_back(seq);
        while sim.refs.len() > self.capacity && sim.fifo.len() > 1 {
            let Some(old) = sim.fifo.pop_front() else {
                break;
            };
            let mut gone = Vec::new();
            for s in old.iter().rev() {
                if let Some(r) = sim.refs.get_mut(s) {
                    *r -= 1;
                    if *r == 0 {
                        sim.refs.remove(s);
                        gone.push(ExternalSequenceBlockHash(*s));
                    }
                }
            }
            if !gone.is_empty() {
                self.live -= gone.len();
                block_ops += gone.len();
                events.push((
                    worker_id,
                    KvCacheEvent {
                        event_id: k,
                        dp_rank: 0,
                        data: KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: gone }),
                    },
                ));
            }
        }
        Request {
            query,
            events,
            block_ops,
        }
    }
}

/// Run the stream until 98 % of `target` blocks are live, or until the live count has not
/// reached a new maximum for a while (with many workers and small capacities a worker's
/// LRU often holds fewer blocks than its capacity, so the target may be out of reach).
fn fill(stream: &mut Stream<'_>, target: usize, mut apply: impl FnMut(&Request)) {
    let patience = 5_000 + 4 * stream.workers.len() as u64;
    let (mut best, mut since) = (0, 0u64);
    while stream.live < target * 98 / 100 && since < patience {
        let r = stream.next_request();
        apply(&r);
        if stream.live > best {
            best = stream.live;
            since = 0;
        } else {
            since += 1;
        }
    }
}

// ----- single-threaded scale pass ----------------------------------------------------------

#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    apply_ns_per_block: f64,
    apply_event_max_us: f64,
    /// The largest single event in the thread's CPU time (work done by the event, page
    /// faults included, without the time the thread was descheduled: on a loaded machine
    /// the wall-clock maximum is mostly a time slice given to another process).
    apply_event_max_cpu_us: f64,
    find_p50_ns: f64,
    find_p99_ns: f64,
    /// Tail shape (printed per round only): p90, p99.9, and p99 of the queries of at least
    /// 100 blocks (the trace's longest 2 %).
    find_p90_ns: f64,
    find_p999_ns: f64,
    find_long_p99_ns: f64,
    heap_b_per_block: f64,
    live: usize,
    score_sum: u64,
}

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`; zero off 64-bit Linux).
/// Declared here rather than through `libc` so that the workspace copy of this harness
/// (`benches/indexer_scale.rs`) needs no new dependency.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[expect(unsafe_code, reason = "one libc call: the thread's CPU clock")]
fn thread_cpu() -> Duration {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec of the platform's layout (64-bit Linux).
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu() -> Duration {
    Duration::ZERO
}

/// The calling thread's system (kernel) CPU time and minor page faults so far
/// (`getrusage(RUSAGE_THREAD)`; zeros off 64-bit Linux): what of an event's CPU time was
/// the kernel's, e.g. first-touch page faults.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
#[expect(unsafe_code, reason = "one libc call: the thread's resource usage")]
fn thread_sys() -> (Duration, u64) {
    #[repr(C)]
    struct Rusage {
        utime: [i64; 2],
        stime: [i64; 2],
        /// maxrss, ixrss, idrss, isrss, minflt, majflt, nswap, inblock, oublock, msgsnd,
        /// msgrcv, nsignals, nvcsw, nivcsw
        rest: [i64; 14],
    }
    unsafe extern "C" {
        fn getrusage(who: i32, usage: *mut Rusage) -> i32;
    }
    const RUSAGE_THREAD: i32 = 1;
    let mut u = Rusage {
        utime: [0; 2],
        stime: [0; 2],
        rest: [0; 14],
    };
    // SAFETY: `u` is a valid, writable rusage of the platform's layout (64-bit Linux).
    if unsafe { getrusage(RUSAGE_THREAD, &raw mut u) } != 0 {
        return (Duration::ZERO, 0);
    }
    (
        Duration::new(u.stime[0] as u64, (u.stime[1] * 1000) as u32),
        u.rest[4] as u64,
    )
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_sys() -> (Duration, u64) {
    (Duration::ZERO, 0)
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize].as_nanos() as f64
}

fn run_single(
    c: &Candidate,
    trace: &[Vec<u64>],
    span: u64,
    workers: usize,
    live_target: usize,
) -> Figures {
    let mut stream = Stream::new(trace, span, workers, live_target);
    let before = live_bytes();
    let mut index = (c.single)();
    let (mut apply, mut ops, mut max_event) = (Duration::ZERO, 0usize, Duration::ZERO);
    let mut max_cpu = Duration::ZERO;
    // `SCALE_SHOW_EVENTS_US=N`: print every event over N µs of CPU time (what it was, its
    // size, when), to find what the largest events are.
    let show_over = std::env::var("SCALE_SHOW_EVENTS_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_micros);
    let mut n_events = 0u64;
    // `SCALE_LONG_WARM=1`: ask every query of 100+ blocks a second time right after the
    // first, and print both latencies' percentiles: cold (the first, as measured for the
    // figures) against warm (its nodes now in cache), to tell cache misses from work.
    let long_warm = std::env::var_os("SCALE_LONG_WARM").is_some();
    let mut long_pairs: Vec<(Duration, Duration)> = Vec::new();
    let mut apply_req = |index: &mut Box<dyn Index>, r: &Request| {
        for (w, ev) in &r.events {
            // The CPU clock is read outside the index's own (wall-clock) timing.
            let s0 = show_over.map(|_| thread_sys());
            let c0 = thread_cpu();
            let d = index.apply(*w, ev);
            let cpu = thread_cpu().saturating_sub(c0);
            max_cpu = max_cpu.max(cpu);
            apply += d;
            max_event = max_event.max(d);
            n_events += 1;
            if let Some((sys0, faults0)) = s0
                && show_over.is_some_and(|t| cpu > t)
            {
                let (sys1, faults1) = thread_sys();
                let (kind, blocks) = match &ev.data {
                    KvCacheEventData::Stored(s) => ("stored", s.blocks.len()),
                    KvCacheEventData::Removed(r) => ("removed", r.block_hashes.len()),
                    KvCacheEventData::Cleared => ("cleared", 0),
                };
                println!(
                    "    event {n_events} ({} {kind} {blocks} blocks, worker {w}): CPU {} us \
                     (kernel {} us, {} minor faults), wall {} us",
                    c.name,
                    cpu.as_micros(),
                    sys1.saturating_sub(sys0).as_micros(),
                    faults1 - faults0,
                    d.as_micros()
                );
            }
        }
        ops += r.block_ops;
    };
    fill(&mut stream, live_target, |r| apply_req(&mut index, r));
    let steady_ops = (live_target / 4).max(1);
    let mut steady = 0;
    let mut lat = Vec::new();
    let mut long_lat = Vec::new();
    let mut score_sum = 0u64;
    while steady < steady_ops || lat.len() < 20_000 {
        let r = stream.next_request();
        let (d, s) = index.find(&r.query);
        lat.push(d);
        if r.query.len() >= 100 {
            long_lat.push(d);
            if long_warm {
                long_pairs.push((d, index.find(&r.query).0));
            }
        }
        score_sum += u64::from(s);
        steady += r.block_ops;
        apply_req(&mut index, &r);
    }
    if !long_pairs.is_empty() {
        let (mut cold, mut warm): (Vec<Duration>, Vec<Duration>) = long_pairs.into_iter().unzip();
        cold.sort_unstable();
        warm.sort_unstable();
        println!(
            "    {} queries of 100+ blocks, ns: cold p50 {:.0} p90 {:.0} p99 {:.0}, asked again right after p50 {:.0} p90 {:.0} p99 {:.0}",
            cold.len(),
            pct(&cold, 0.5),
            pct(&cold, 0.9),
            pct(&cold, 0.99),
            pct(&warm, 0.5),
            pct(&warm, 0.9),
            pct(&warm, 0.99)
        );
    }
    let with_index = live_bytes();
    if std::env::var_os("SCALE_CLEAR_RANK").is_some() {
        // One rank's `cleared` event on the full index (a worker leaving or resetting its
        // cache), after the index's bytes are counted: ours walks its arena for it.
        let cleared = KvCacheEvent {
            event_id: u64::MAX,
            dp_rank: 0,
            data: KvCacheEventData::Cleared,
        };
        let d = index.apply(0, &cleared);
        println!(
            "    {}: cleared rank 0 of {workers}: {} us (heap released {:.1} MB)",
            c.name,
            d.as_micros(),
            (with_index - live_bytes()) as f64 / 1e6
        );
    }
    drop(index);
    let heap = (with_index - live_bytes()).max(0) as f64;
    let _ = before;
    lat.sort_unstable();
    long_lat.sort_unstable();
    Figures {
        apply_ns_per_block: apply.as_nanos() as f64 / ops as f64,
        apply_event_max_us: max_event.as_nanos() as f64 / 1e3,
        apply_event_max_cpu_us: max_cpu.as_nanos() as f64 / 1e3,
        find_p50_ns: pct(&lat, 0.5),
        find_p99_ns: pct(&lat, 0.99),
        find_p90_ns: pct(&lat, 0.9),
        find_p999_ns: pct(&lat, 0.999),
        find_long_p99_ns: pct(&long_lat, 0.99),
        heap_b_per_block: heap / stream.live as f64,
        live: stream.live,
        score_sum,
    }
}

/// One column of the scale table.
type Metric = fn(&Figures) -> f64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

fn mem_available() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn scale_pass(cands: &[Candidate], opts: &Opts, trace: &[Vec<u64>], span: u64) {
    // Peak bytes per live block: the generator (~70 B: per-worker refcounts and request
    // lists) plus the hungriest candidate (the reference's tree measured ~110 B; ours ~50).
    let need_per_block = 70 + if cands.len() > 1 { 130 } else { 70 };
    for &workers in &opts.workers {
        for &live in &opts.scales {
            let need = live * need_per_block;
            if let Some(avail) = mem_available()
                && need > avail * 3 / 4
            {
                println!(
                    "| {live} | {workers} | skipped: needs ~{:.1} GiB, {:.1} GiB available (3/4 of it may be used; machine shared) |",
                    need as f64 / (1u64 << 30) as f64,
                    avail as f64 / (1u64 << 30) as f64
                );
                continue;
            }
            let mut all: Vec<Vec<Figures>> = vec![Vec::new(); cands.len()];
            for round in 0..opts.rounds {
                for (i, c) in cands.iter().enumerate() {
                    let f = run_single(c, trace, span, workers, live);
                    eprintln!(
                        "  round {round} {} live={} workers={workers}: apply {:.1} ns/block (max event {:.0} us, CPU {:.0} us), find p50 {:.0} ns p99 {:.0} ns (p90 {:.0}, p99.9 {:.0}, p99 of >=100-block queries {:.0}), heap {:.1} B/block",
                        c.name,
                        f.live,
                        f.apply_ns_per_block,
                        f.apply_event_max_us,
                        f.apply_event_max_cpu_us,
                        f.find_p50_ns,
                        f.find_p99_ns,
                        f.find_p90_ns,
                        f.find_p999_ns,
                        f.find_long_p99_ns,
                        f.heap_b_per_block
                    );
                    all[i].push(f);
                }
                if cands.len() > 1 && all[0][round].score_sum != all[1][round].score_sum {
                    eprintln!(
                        "  note: best-score sums differ ({} vs {})",
                        all[0][round].score_sum, all[1][round].score_sum
                    );
                }
            }
            let med = |i: usize, f: fn(&Figures) -> f64| median(all[i].iter().map(f).collect());
            let ratio = |f: fn(&Figures) -> f64| {
                median(
                    (0..opts.rounds)
                        .map(|r| f(&all[0][r]) / f(&all[1][r]))
                        .collect(),
                )
            };
            let metrics: [Metric; 6] = [
                |f| f.apply_ns_per_block,
                |f| f.apply_event_max_us,
                |f| f.apply_event_max_cpu_us,
                |f| f.find_p50_ns,
                |f| f.find_p99_ns,
                |f| f.heap_b_per_block,
            ];
            let mut row = format!("| {live} | {workers} |");
            for f in metrics {
                let vals: Vec<String> = (0..cands.len())
                    .map(|i| format!("{:.0}", med(i, f)))
                    .collect();
                row += &format!(" {}", vals.join(" / "));
                if cands.len() > 1 {
                    row += &format!(" ({:.2}x)", ratio(f));
                }
                row += " |";
            }
            println!("{row}");
        }
    }
}

// ----- reader/writer pass ---------------------------------------------------------------

fn rw_pass(cands: &[Candidate], opts: &Opts, trace: &[Vec<u64>], span: u64) {
    let live = opts.rw_live;
    let workers = opts.workers[0];
    for c in cands {
        let Some(make) = c.shared else { continue };
        for &readers in &opts.readers {
            let mut reads = Vec::new();
            let mut p99s = Vec::new();
            let mut p50s = Vec::new();
            let mut writes = Vec::new();
            for _ in 0..opts.rounds {
                let (r, p50, p99, w) = rw_once(make, trace, span, workers, live, readers, opts);
                reads.push(r);
                p50s.push(p50);
                p99s.push(p99);
                writes.push(w);
            }
            println!(
                "| {} | {live} | {readers} | {:.2} M/s | {:.0} ns | {:.0} ns | {:.2} M blocks/s |",
                c.name,
                median(reads) / 1e6,
                median(p50s),
                median(p99s),
                median(writes) / 1e6
            );
        }
    }
}

fn rw_once(
    make: fn() -> Arc<dyn SharedIndex>,
    trace: &[Vec<u64>],
    span: u64,
    workers: usize,
    live: usize,
    readers: usize,
    opts: &Opts,
) -> (f64, f64, f64, f64) {
    let index = make();
    let mut stream = Stream::new(trace, span, workers, live);
    fill(&mut stream, live, |r| {
        for (w, ev) in &r.events {
            index.apply(*w, ev);
        }
    });
    index.sync();
    // The writer's events and the readers' queries, generated before the clock starts.
    let secs = opts.rw_secs;
    let budget = (opts.write_rate as f64 * secs * 1.2) as usize;
    let mut events: Vec<(u64, KvCacheEvent, usize)> = Vec::new();
    let mut queries: Vec<Vec<LocalBlockHash>> = Vec::new();
    let mut total = 0;
    while total < budget {
        let r = stream.next_request();
        total += r.block_ops;
        queries.push(r.query);
        let n = r.events.len();
        for (j, (w, ev)) in r.events.into_iter().enumerate() {
            let ops = if j + 1 == n { r.block_ops } else { 0 };
            events.push((w, ev, ops));
        }
    }
    drop(stream);
    let queries = Arc::new(queries);
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let writer = {
        let index = Arc::clone(&index);
        let stop = Arc::clone(&stop);
        let written = Arc::clone(&written);
        let rate = opts.write_rate as f64;
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut done = 0usize;
            for (w, ev, ops) in &events {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // Pace to the target block rate (the writer must not starve the readers of
                // the 2 cores; a real router applies what the fleet emits, not more).
                let due = Duration::from_secs_f64(done as f64 / rate);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
                index.apply(*w, ev);
                done += ops;
            }
            index.sync();
            written.store(done as u64, Ordering::Relaxed);
        })
    };
    let handles: Vec<_> = (0..readers)
        .map(|t| {
            let index = Arc::clone(&index);
            let stop = Arc::clone(&stop);
            let queries = Arc::clone(&queries);
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(1 << 20);
                let mut i = t * 7919;
                while !stop.load(Ordering::Relaxed) {
                    let q = &queries[i % queries.len()];
                    i += 1;
                    let t = Instant::now();
                    black_box(index.find(q));
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.join().unwrap_or_default());
    }
    let elapsed = start.elapsed().as_secs_f64();
    let _ = writer.join();
    let w = written.load(Ordering::Relaxed) as f64 / elapsed;
    lat.sort_unstable();
    (
        lat.len() as f64 / elapsed,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        w,
    )
}

// ----- command line ---------------------------------------------------------------------

struct Opts {
    scales: Vec<usize>,
    workers: Vec<usize>,
    rounds: usize,
    readers: Vec<usize>,
    rw_live: usize,
    rw_secs: f64,
    write_rate: usize,
    scale: bool,
    rw: bool,
    cands: Option<Vec<String>>,
}

fn list(v: &str) -> Vec<usize> {
    v.split(',')
        .filter_map(|x| {
            let x = x.trim().to_ascii_lowercase();
            let (n, m) = if let Some(n) = x.strip_suffix('m') {
                (n, 1_000_000)
            } else if let Some(n) = x.strip_suffix('k') {
                (n, 1_000)
            } else {
                (x.as_str(), 1)
            };
            n.parse::<usize>().ok().map(|n| n * m)
        })
        .collect()
}

const USAGE: &str = "indexer scale bench
  --scales 100k,1m,10m,50m   live (worker, block) pairs to build (default)
  --workers 16,1000          simulated workers (default 16)
  --rounds 3                 repetitions; figures are medians (ratios: median of per-round ratios)
  --only scale|rw            run one pass (default both)
  --cands ours,ref           candidates to run, in this order (default: all built in)
  --readers 1,2,4            reader threads of the reader/writer pass
  --rw-live 1m               live blocks before the reader/writer pass
  --rw-secs 3                duration of each reader/writer run
  --write-rate 1000000       writer's block operations per second in that pass";

fn parse() -> Opts {
    let mut o = Opts {
        scales: list("100k,1m,10m,50m"),
        workers: vec![16],
        rounds: 3,
        readers: vec![1, 2, 4],
        rw_live: 1_000_000,
        rw_secs: 3.0,
        write_rate: 1_000_000,
        scale: true,
        rw: true,
        cands: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--scales" => o.scales = list(&v),
            "--workers" => o.workers = list(&v),
            "--rounds" => o.rounds = v.parse().unwrap_or(3).max(1),
            "--readers" => o.readers = list(&v),
            "--rw-live" => o.rw_live = list(&v).first().copied().unwrap_or(1_000_000),
            "--rw-secs" => o.rw_secs = v.parse().unwrap_or(3.0),
            "--write-rate" => o.write_rate = v.parse().unwrap_or(1_000_000),
            "--cands" => o.cands = Some(v.split(',').map(str::to_owned).collect()),
            "--only" => {
                o.scale = v == "scale";
                o.rw = v == "rw";
            }
            // cargo bench passes `--bench`.
            "--bench" => {
                i += 1;
                continue;
            }
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    o
}

/// Run the passes over `cands` (the first is ours; ratios are first / second).
pub(crate) fn main_with(cands: Vec<Candidate>) {
    let opts = parse();
    let mut cands = cands;
    // In the order given: ratios are the first named over the second.
    if let Some(keep) = &opts.cands {
        let built: Vec<&str> = cands.iter().map(|c| c.name).collect();
        let mut named = Vec::new();
        for k in keep {
            let Some(i) = cands.iter().position(|c| c.name == k) else {
                eprintln!(
                    "indexer scale bench: no candidate {k:?}, or named twice (built: {}; \
                         `ref` needs the bench-reference feature)",
                    built.join(", ")
                );
                std::process::exit(2);
            };
            named.push(cands.remove(i));
        }
        cands = named;
    }
    let (trace, span) = match load_trace() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("indexer scale bench: no trace ({e}); set MOONCAKE_TRACE");
            return;
        }
    };
    let names: Vec<&str> = cands.iter().map(|c| c.name).collect();
    println!(
        "candidates: {} (ratios: {} / {}); {} rounds, medians",
        names.join(", "),
        names[0],
        names.get(1).unwrap_or(&names[0]),
        opts.rounds
    );
    if opts.scale {
        println!(
            "\n| live blocks | workers | apply ns/block | apply max event µs | max event CPU µs | find p50 ns | find p99 ns | heap B/block |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        scale_pass(&cands, &opts, &trace, span);
    }
    if opts.rw {
        println!(
            "\n| index | live blocks | readers | reads/s (all readers) | find p50 | find p99 | writes applied |"
        );
        println!("|---|---|---|---|---|---|---|");
        rw_pass(&cands, &opts, &trace, span);
    }
}
