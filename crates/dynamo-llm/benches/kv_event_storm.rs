//! KV event storm: 1,000 simulated workers publish KV events over the event plane while a
//! router applies them and a query thread keeps asking for routing decisions.
//!
//! * Router side: a real [`KvRouter`] (what a frontend with `--router-mode kv` builds per
//!   endpoint), subscribed to the component's `kv-events` channel over the runtime's event
//!   plane (brokerless TCP by default, `--plane nats` against a `nats-server` this bench
//!   starts on a free loopback port). It runs on its own tokio runtime (`--router-threads`).
//! * Publishers: `--workers` event-plane publishers (one per worker: its own listener,
//!   connection, publisher id and event ids), on a second runtime, fed by `--drivers`
//!   plain threads that pace the whole stream at `--rate` block events per second. Each
//!   worker simulates an engine's cache of `--capacity` blocks: requests store a shared
//!   system prompt (one of 16 families, 32 blocks, stored once while referenced) and a
//!   private suffix (1-64 blocks in one event) followed by 0-3 single-block decode events;
//!   past capacity the oldest request's blocks go in one `removed` event (and its family's
//!   prefix when no request of the worker uses it any more).
//! * Query thread: `--qps` decisions per second, each `KvRouterCore::best_worker` (hash the
//!   prompt, `find_matches`, cost and select over every worker) for an `--isl`-token prompt
//!   that starts with one of the families.
//! * Lag, measured exactly: the drivers record when each event id was published; a sampler
//!   reads the router's per-worker event cursor every millisecond (16 workers in turn) and
//!   records the age of the oldest published event not yet applied. The router's own lag
//!   metric (`KvRouter::event_stats`, exposed on the frontend's `/metrics`) is reported too.
//! * Phases: warm-up storm (`--warmup` s, fills the index), measured storm (`--secs` s),
//!   drain (publishers stop; time until every event is applied), then the same decisions on
//!   the quiet, filled index for comparison.
//!
//! CPU per role comes from `/proc/self/task/*/stat` (threads are named by role).
//!
//! Run: `cargo bench -p dynamo-llm --bench kv_event_storm -- [--workers 1000] [--rate 1000000]
//! [--secs 10] [--plane tcp|nats] ...` (see `Args`).

#![allow(clippy::print_stdout, reason = "a bench reports on stdout")]

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use dynamo_kv_router::hashing::{BlockHashOptions, LocalBlockHash, compute_block_hash_for_seq};
use dynamo_kv_router::kv_router::RouteRequest;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, RouterEvent, StorageTier, WorkerWithDpRank, encode_json_router_event,
};
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::{LoadThresholds, WorkerCapacity};
use dynamo_kv_router::scheduling::{SchedulingRequest, Selection};
use dynamo_llm::kv_routing::{KV_EVENTS_TOPIC, KvRouter};
use dynamo_runtime::config::{DiscoveryBackend, EventPlane, RequestPlane};
use dynamo_runtime::events::{EventPublisher, EventScope};
use dynamo_runtime::{DistributedRuntime, EndpointId, RuntimeConfig};

const BLOCK_SIZE: usize = 16;
const FAMILIES: usize = 16;
const FAMILY_BLOCKS: usize = 32;
/// Publish times kept per worker (event ids modulo this).
const RING: usize = 1 << 14;
const WORKER_ID_BASE: u64 = 0x5000_0000;

#[derive(Debug, Clone)]
struct Args {
    workers: usize,
    rate: f64,
    secs: f64,
    warmup: f64,
    capacity: usize,
    plane: String,
    router_threads: usize,
    pub_threads: usize,
    drivers: usize,
    qps: f64,
    isl: usize,
    /// Skip the event plane: fill the index directly, then time decisions on it.
    quiet_only: bool,
    /// Nice value of the simulated side's threads (publisher runtime and drivers). On a
    /// machine with few cores they stand in for engines on other machines, so a positive
    /// value keeps their CPU from being taken out of the router's and the query thread's
    /// (the kernel still gives them every cycle those leave idle).
    sim_nice: i32,
    /// Real-time (`SCHED_FIFO`) priority for the router's runtime threads and the query
    /// thread, 0 for none. With every core busy (the simulated side included), a woken
    /// decision otherwise waits out another thread's time slice (milliseconds); this shows
    /// what the router itself costs when the machine gives it a core, as a latency-critical
    /// frontend host would. Needs root or `CAP_SYS_NICE`.
    rt: i32,
    /// Time a storm decision's three steps apart (hash the prompt, `find_matches`, the
    /// scheduler's `select`: what `best_worker` does for an event-fed index) and report
    /// each one's percentiles and their share of the slowest 1 % of decisions.
    split: bool,
}

impl Args {
    fn parse() -> Self {
        let mut a = Self {
            workers: 1000,
            rate: 1_000_000.0,
            secs: 10.0,
            warmup: 3.0,
            capacity: 1024,
            plane: "tcp".into(),
            router_threads: 2,
            pub_threads: 1,
            drivers: 1,
            qps: 1000.0,
            isl: 2048,
            quiet_only: false,
            sim_nice: 0,
            rt: 0,
            split: false,
        };
        let argv: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < argv.len() {
            let v = argv.get(i + 1).cloned().unwrap_or_default();
            let mut take = true;
            match argv[i].as_str() {
                "--workers" => a.workers = v.parse().expect("--workers N"),
                "--rate" => a.rate = v.parse().expect("--rate blocks/s"),
                "--secs" => a.secs = v.parse().expect("--secs S"),
                "--warmup" => a.warmup = v.parse().expect("--warmup S"),
                "--capacity" => a.capacity = v.parse().expect("--capacity blocks"),
                "--plane" => a.plane = v,
                "--router-threads" => a.router_threads = v.parse().expect("--router-threads N"),
                "--pub-threads" => a.pub_threads = v.parse().expect("--pub-threads N"),
                "--drivers" => a.drivers = v.parse().expect("--drivers N"),
                "--qps" => a.qps = v.parse().expect("--qps N"),
                "--isl" => a.isl = v.parse().expect("--isl tokens"),
                "--sim-nice" => a.sim_nice = v.parse().expect("--sim-nice N"),
                "--rt" => a.rt = v.parse().expect("--rt PRIORITY (1-99)"),
                "--quiet-only" => {
                    a.quiet_only = true;
                    take = false;
                }
                "--split" => {
                    a.split = true;
                    take = false;
                }
                _ => take = false, // `--bench` and the like from cargo
            }
            i += if take { 2 } else { 1 };
        }
        assert!(a.workers > 0 && a.rate > 0.0 && a.drivers > 0);
        a
    }
}

/// The shared system prompts: tokens and the router's block hashes of each.
struct Families {
    tokens: Vec<Vec<u32>>,
    local: Vec<Vec<LocalBlockHash>>,
}

impl Families {
    fn new() -> Self {
        let tokens: Vec<Vec<u32>> = (0..FAMILIES as u32)
            .map(|f| {
                (0..(FAMILY_BLOCKS * BLOCK_SIZE) as u32)
                    .map(|i| f * 100_003 + i * 7 + 1)
                    .collect()
            })
            .collect();
        let local = tokens
            .iter()
            .map(|t| {
                compute_block_hash_for_seq(t, BLOCK_SIZE, &BlockHashOptions::default())
                    .expect("block size")
            })
            .collect();
        Self { tokens, local }
    }

    fn ext(f: usize, i: usize) -> u64 {
        mix(0xFA_0000 + (f * 1024 + i) as u64)
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

struct Req {
    family: usize,
    /// Private blocks (external hashes), parent first.
    blocks: Vec<u64>,
}

/// One simulated engine's cache, producing its event stream.
struct SimWorker {
    id: u64,
    rng: fastrand::Rng,
    counter: u64,
    /// Next event id (`--quiet-only`; the drivers keep their own).
    counter_events: u64,
    live: usize,
    reqs: VecDeque<Req>,
    fam_refs: [u32; FAMILIES],
    pending: VecDeque<KvCacheEventData>,
}

fn stored(parent: Option<u64>, blocks: Vec<KvCacheStoredBlockData>) -> KvCacheEventData {
    KvCacheEventData::Stored(KvCacheStoreData {
        parent_hash: parent.map(ExternalSequenceBlockHash),
        start_position: None,
        blocks,
    })
}

fn removed(mut hashes: Vec<u64>) -> KvCacheEventData {
    hashes.reverse(); // leaves first
    KvCacheEventData::Removed(KvCacheRemoveData {
        block_hashes: hashes.into_iter().map(ExternalSequenceBlockHash).collect(),
    })
}

impl SimWorker {
    fn new(id: u64) -> Self {
        Self {
            id,
            rng: fastrand::Rng::with_seed(id),
            counter: 0,
            counter_events: 0,
            live: 0,
            reqs: VecDeque::new(),
            fam_refs: [0; FAMILIES],
            pending: VecDeque::new(),
        }
    }

    fn fresh(&mut self) -> u64 {
        self.counter += 1;
        mix(self.id.rotate_left(32) ^ self.counter)
    }

    fn next_event(&mut self, families: &Families, capacity: usize) -> KvCacheEventData {
        while self.pending.is_empty() {
            if self.live > capacity
                && let Some(req) = self.reqs.pop_front()
            {
                self.live -= req.blocks.len();
                self.pending.push_back(removed(req.blocks));
                self.fam_refs[req.family] -= 1;
                if self.fam_refs[req.family] == 0 {
                    self.live -= FAMILY_BLOCKS;
                    let f = req.family;
                    self.pending.push_back(removed(
                        (0..FAMILY_BLOCKS).map(|i| Families::ext(f, i)).collect(),
                    ));
                }
                continue;
            }
            let f = self.rng.usize(..FAMILIES).min(self.rng.usize(..FAMILIES));
            if self.fam_refs[f] == 0 {
                let blocks = (0..FAMILY_BLOCKS)
                    .map(|i| {
                        KvCacheStoredBlockData::new(Families::ext(f, i), families.local[f][i].0)
                    })
                    .collect();
                self.pending.push_back(stored(None, blocks));
                self.live += FAMILY_BLOCKS;
            }
            self.fam_refs[f] += 1;
            let suffix = self.rng.usize(1..=64);
            let decode = self.rng.usize(0..=3);
            let hashes: Vec<u64> = (0..suffix + decode).map(|_| self.fresh()).collect();
            let mut parent = Families::ext(f, FAMILY_BLOCKS - 1);
            let prefill = hashes[..suffix]
                .iter()
                .map(|&h| KvCacheStoredBlockData::new(h, self.rng.u64(..)))
                .collect();
            self.pending.push_back(stored(Some(parent), prefill));
            parent = hashes[suffix - 1];
            for &h in &hashes[suffix..] {
                let b = KvCacheStoredBlockData::new(h, self.rng.u64(..));
                self.pending.push_back(stored(Some(parent), vec![b]));
                parent = h;
            }
            self.live += hashes.len();
            self.reqs.push_back(Req {
                family: f,
                blocks: hashes,
            });
        }
        self.pending.pop_front().expect("refilled")
    }
}

fn blocks_of(d: &KvCacheEventData) -> usize {
    match d {
        KvCacheEventData::Stored(s) => s.blocks.len(),
        KvCacheEventData::Removed(r) => r.block_hashes.len(),
        KvCacheEventData::Cleared => 0,
    }
}

/// What the drivers share with the sampler: per worker, publish times by event id and the
/// number of events published.
struct Published {
    times: Vec<Box<[AtomicU64]>>,
    count: Vec<AtomicU64>,
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// CPU seconds per thread-name group of this process.
fn cpu_by_group() -> HashMap<String, f64> {
    let mut out = HashMap::new();
    let tick = 100.0; // USER_HZ
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let path = t.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (Some(u), Some(s)) = (f.get(11), f.get(12)) else {
            continue;
        };
        let ticks = u.parse::<f64>().unwrap_or(0.0) + s.parse::<f64>().unwrap_or(0.0);
        let comm = comm.trim();
        let group = [
            "storm-router",
            "storm-pub",
            "storm-driver",
            "storm-query",
            "storm-sample",
        ]
        .iter()
        .find(|g| comm.starts_with(*g))
        .map_or("other", |g| g);
        *out.entry(group.to_string()).or_insert(0.0) += ticks / tick;
    }
    out
}

fn start_nats() -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut child = Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server on PATH");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (child, port);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("nats-server did not start");
}

/// A runtime whose threads run at `nice`, or at real-time priority `rt` when non-zero.
fn runtime(name: &'static str, threads: usize, nice: i32, rt: i32) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(name)
        .on_thread_start(move || set_thread_priority(nice, rt))
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Set the calling thread's nice value, then put it under `SCHED_FIFO` at priority `rt`
/// (Linux: both are per thread, and id 0 names the caller). A 0 leaves that setting
/// alone; a failure (no privilege) is reported, not fatal.
#[expect(
    unsafe_code,
    reason = "bench only: libc's setpriority / sched_setscheduler have no safe wrapper in std"
)]
fn set_thread_priority(nice: i32, rt: i32) {
    let report = |rc: i32, what: &str| {
        if rc != 0 {
            eprintln!("{what} failed: {}", std::io::Error::last_os_error());
        }
    };
    if nice != 0 {
        // SAFETY: setpriority takes plain integers and touches no memory of ours.
        report(
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) },
            &format!("setpriority({nice})"),
        );
    }
    if rt != 0 {
        let param = libc::sched_param { sched_priority: rt };
        // SAFETY: `param` is a valid `sched_param` that outlives the call.
        report(
            unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) },
            &format!("sched_setscheduler(SCHED_FIFO, {rt})"),
        );
    }
}

/// Check the workload against a bare tree: no event may be rejected.
fn self_check(families: &Families, capacity: usize) {
    let tree = dynamo_kv_router::indexer::SharedRadixTree::new(None);
    for w in 0..3u64 {
        let mut sim = SimWorker::new(WORKER_ID_BASE + w);
        for id in 0..20_000u64 {
            let data = sim.next_event(families, capacity);
            let ev = KvCacheEvent {
                event_id: id,
                data,
                dp_rank: 0,
            };
            tree.apply_event(sim.id, &ev)
                .unwrap_or_else(|e| panic!("workload event {id} of worker {w} rejected: {e}"));
        }
    }
}

fn main() {
    let args = Args::parse();
    let families = Arc::new(Families::new());
    self_check(&families, args.capacity);
    println!("# KV event storm: {args:?}");

    let mut nats = None;
    let mut config = RuntimeConfig::default();
    match args.plane.as_str() {
        "tcp" | "zmq" => config.event_plane = Some(EventPlane::Tcp),
        "nats" => {
            let (child, port) = start_nats();
            config.event_plane = Some(EventPlane::Nats);
            config.nats_server = format!("nats://127.0.0.1:{port}");
            config.nats_server_set = true;
            nats = Some(child);
        }
        other => panic!("--plane tcp|nats, not {other}"),
    }
    config.event_subscriber_capacity = dynamo_runtime::events::DEFAULT_SUBSCRIBER_CAPACITY;
    let endpoint = EndpointId::parse("storm.backend.generate").expect("endpoint");
    let scope = EventScope::component(&endpoint.namespace, &endpoint.component);

    // Router side.
    let router_rt = runtime("storm-router", args.router_threads, 0, args.rt);
    let (router_drt, router) = router_rt.block_on(async {
        let drt = DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp, config.clone())
            .expect("router runtime");
        let router = KvRouter::new(
            &drt,
            &endpoint,
            BLOCK_SIZE as u32,
            KvRouterConfig::default(),
            LoadThresholds::default(),
        )
        .expect("router");
        (drt, router)
    });
    let ranks: Vec<WorkerWithDpRank> = (0..args.workers as u64)
        .map(|i| WorkerWithDpRank::new(WORKER_ID_BASE + i, 0))
        .collect();
    for r in &ranks {
        router
            .core()
            .upsert_worker(*r, BTreeSet::new(), WorkerCapacity::default());
    }

    if args.quiet_only {
        quiet_only(&args, &router, &families, &ranks);
        router_rt.block_on(async { router_drt.shutdown() });
        drop(router);
        router_rt.shutdown_timeout(Duration::from_secs(1));
        return;
    }

    // Publishers.
    let pub_rt = runtime("storm-pub", args.pub_threads, args.sim_nice, 0);
    let setup = Instant::now();
    let (pub_drt, publishers) = pub_rt.block_on(async {
        let drt = DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp, config.clone())
            .expect("publisher runtime");
        let mut pubs: Vec<EventPublisher> = Vec::with_capacity(args.workers);
        for _ in 0..args.workers {
            pubs.push(
                drt.event_publisher(&scope, KV_EVENTS_TOPIC)
                    .await
                    .expect("publisher"),
            );
        }
        (drt, pubs)
    });
    // Every publisher must reach the router before the first event (a first id the router
    // does not see would be a gap).
    let deadline = Instant::now() + Duration::from_secs(60);
    if args.plane == "nats" {
        std::thread::sleep(Duration::from_millis(500));
    } else {
        while publishers
            .iter()
            .any(|p| p.subscriber_count().unwrap_or(1) == 0)
        {
            assert!(
                Instant::now() < deadline,
                "publishers not connected in 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!(
        "setup: {} publishers connected in {:.2} s",
        args.workers,
        setup.elapsed().as_secs_f64()
    );

    let published = Arc::new(Published {
        times: (0..args.workers)
            .map(|_| (0..RING).map(|_| AtomicU64::new(0)).collect())
            .collect(),
        count: (0..args.workers).map(|_| AtomicU64::new(0)).collect(),
    });
    let epoch = Instant::now();
    let now_ns = move || u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let stop_pub = Arc::new(AtomicBool::new(false));
    let offered_blocks = Arc::new(AtomicU64::new(0));
    let offered_events = Arc::new(AtomicU64::new(0));
    let start = Barrier::new(args.drivers + 1);
    let start = Arc::new(start);

    // Drivers: each owns a contiguous slice of the workers.
    let publishers = Arc::new(publishers);
    let mut drivers = Vec::new();
    let per = args.workers.div_ceil(args.drivers);
    for d in 0..args.drivers {
        let lo = d * per;
        let hi = ((d + 1) * per).min(args.workers);
        let (publishers, published, families) = (
            Arc::clone(&publishers),
            Arc::clone(&published),
            Arc::clone(&families),
        );
        let (stop, start, offered_blocks, offered_events) = (
            Arc::clone(&stop_pub),
            Arc::clone(&start),
            Arc::clone(&offered_blocks),
            Arc::clone(&offered_events),
        );
        let rate = args.rate * (hi - lo) as f64 / args.workers as f64;
        let capacity = args.capacity;
        let nice = args.sim_nice;
        drivers.push(
            std::thread::Builder::new()
                .name(format!("storm-driver-{d}"))
                .spawn(move || {
                    set_thread_priority(nice, 0);
                    let mut sims: Vec<SimWorker> = (lo..hi)
                        .map(|i| SimWorker::new(WORKER_ID_BASE + i as u64))
                        .collect();
                    let mut next_id = vec![0u64; hi - lo];
                    start.wait();
                    let t0 = Instant::now();
                    // Cumulative blocks and events of this driver; reported as deltas.
                    let (mut blocks, mut events) = (0u64, 0u64);
                    let (mut rep_blocks, mut rep_events) = (0u64, 0u64);
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let target = (t0.elapsed().as_secs_f64() * rate) as u64;
                        while blocks < target {
                            let w = lo + i;
                            let sim = &mut sims[i];
                            let data = sim.next_event(&families, capacity);
                            let n = blocks_of(&data);
                            let id = next_id[i];
                            let ev = RouterEvent {
                                worker_id: sim.id,
                                storage_tier: StorageTier::Device,
                                event: KvCacheEvent {
                                    event_id: id,
                                    data,
                                    dp_rank: 0,
                                },
                            };
                            let json = encode_json_router_event(&ev);
                            published.times[w][id as usize % RING]
                                .store(now_ns(), Ordering::Relaxed);
                            let _ = publishers[w].publish(json.as_bytes());
                            next_id[i] = id + 1;
                            published.count[w].store(id + 1, Ordering::Release);
                            blocks += n as u64;
                            events += 1;
                            i = (i + 1) % (hi - lo);
                            // A driver slower than its rate still sees the stop.
                            if events % 256 == 0 && stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                        offered_blocks.fetch_add(blocks - rep_blocks, Ordering::Relaxed);
                        offered_events.fetch_add(events - rep_events, Ordering::Relaxed);
                        (rep_blocks, rep_events) = (blocks, events);
                        std::thread::sleep(Duration::from_micros(500));
                    }
                })
                .expect("driver thread"),
        );
    }
    run(
        &args,
        &router,
        &families,
        &publishers,
        &published,
        &ranks,
        Phases {
            start: &start,
            stop_pub: &stop_pub,
            offered_blocks: &offered_blocks,
            offered_events: &offered_events,
            now_ns: &now_ns,
        },
    );
    for d in drivers {
        let _ = d.join();
    }
    pub_rt.block_on(async { pub_drt.shutdown() });
    router_rt.block_on(async { router_drt.shutdown() });
    drop(router);
    router_rt.shutdown_timeout(Duration::from_secs(1));
    pub_rt.shutdown_timeout(Duration::from_secs(1));
    if let Some(mut child) = nats {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `--quiet-only`: apply `--warmup` seconds' worth of the storm's events (at `--rate`)
/// straight to the router's index, without the event plane, then time back-to-back routing
/// decisions for `--secs` seconds on the quiet, filled index. For profiling `best_worker`
/// (`perf record -g` on this binary) without the publishers' noise.
fn quiet_only(args: &Args, router: &KvRouter, families: &Families, ranks: &[WorkerWithDpRank]) {
    let mut sims: Vec<SimWorker> = ranks.iter().map(|r| SimWorker::new(r.worker_id)).collect();
    let total = (args.rate * args.warmup) as u64;
    let (mut blocks, mut events) = (0u64, 0u64);
    let mut applies: Vec<(u64, &str, usize)> = Vec::new();
    let fill = Instant::now();
    while blocks < total {
        for sim in &mut sims {
            let data = sim.next_event(families, args.capacity);
            blocks += blocks_of(&data) as u64;
            let ev = RouterEvent {
                worker_id: sim.id,
                storage_tier: StorageTier::Device,
                event: KvCacheEvent {
                    event_id: sim.counter_events,
                    data,
                    dp_rank: 0,
                },
            };
            sim.counter_events += 1;
            let kind = match &ev.event.data {
                KvCacheEventData::Stored(_) => "stored",
                KvCacheEventData::Removed(_) => "removed",
                KvCacheEventData::Cleared => "cleared",
            };
            let n = blocks_of(&ev.event.data);
            let t = Instant::now();
            let _ = router.core().apply_event(&ev);
            // The second half: past the fill, where every worker's cache is at capacity.
            if blocks * 2 > total {
                applies.push((
                    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX),
                    kind,
                    n,
                ));
            }
            events += 1;
        }
    }
    let fill = fill.elapsed().as_secs_f64();
    println!(
        "quiet-only: applied {events} events ({blocks} blocks) directly in {fill:.2} s ({:.0} block events/s on one thread)",
        blocks as f64 / fill
    );
    // How long one event holds the tree's write lock (a query waits for at most that), in
    // the second half of the fill (steady state: caches full, evicting as they store).
    applies.sort_unstable_by_key(|a| a.0);
    let times: Vec<u64> = applies.iter().map(|a| a.0).collect();
    let slowest = &applies[applies.len() - applies.len().div_ceil(1000)..];
    let count = |k: &str| slowest.iter().filter(|a| a.1 == k).count();
    println!(
        "apply per event (the write lock's hold): p50 {} us, p99 {} us, p99.9 {} us, max {} us; slowest 0.1 %: {} stored / {} removed, {:.1} blocks on average",
        fmt_us(percentile(&times, 0.5)),
        fmt_us(percentile(&times, 0.99)),
        fmt_us(percentile(&times, 0.999)),
        fmt_us(times.last().copied().unwrap_or(0)),
        count("stored"),
        count("removed"),
        slowest.iter().map(|a| a.2 as f64).sum::<f64>() / slowest.len().max(1) as f64,
    );
    let prompts = prompts(families, args.isl);
    let mut times = Vec::new();
    let mut hits = 0u64;
    let t0 = Instant::now();
    let mut k = 0usize;
    while t0.elapsed().as_secs_f64() < args.secs {
        let tokens = &prompts[k % prompts.len()];
        k += 1;
        let t = Instant::now();
        let sel = router.core().best_worker(&RouteRequest {
            tokens,
            ..Default::default()
        });
        times.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        if sel.is_ok_and(|s| s.overlap_blocks > 0) {
            hits += 1;
        }
    }
    times.sort_unstable();
    println!(
        "routing decision, quiet filled index ({} decisions back to back, {} tokens, {} workers): p50 {} us, p99 {} us, max {} us; with a cached prefix: {hits}",
        times.len(),
        args.isl,
        ranks.len(),
        fmt_us(percentile(&times, 0.5)),
        fmt_us(percentile(&times, 0.99)),
        fmt_us(times.last().copied().unwrap_or(0)),
    );
}

struct Phases<'a> {
    start: &'a Barrier,
    stop_pub: &'a AtomicBool,
    offered_blocks: &'a AtomicU64,
    offered_events: &'a AtomicU64,
    now_ns: &'a (dyn Fn() -> u64 + Sync),
}

const WARMUP: u8 = 0;
const STORM: u8 = 1;
const DRAIN: u8 = 2;
const IDLE: u8 = 3;
const DONE: u8 = 4;

fn prompts(families: &Families, isl: usize) -> Vec<Vec<u32>> {
    let mut rng = fastrand::Rng::with_seed(7);
    (0..256)
        .map(|_| {
            let f = rng.usize(..FAMILIES).min(rng.usize(..FAMILIES));
            let mut t = families.tokens[f].clone();
            t.truncate(isl);
            while t.len() < isl {
                t.push(rng.u32(..50_000));
            }
            t
        })
        .collect()
}

/// Nanoseconds this thread has spent runnable but waiting for a CPU (second field of
/// `/proc/thread-self/schedstat`); 0 where unavailable.
fn runqueue_wait_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// `best_worker` as its three steps, each timed: hash the prompt, `find_matches` (the
/// tree's read lock, the walk), the scheduler's `select`.
fn decide_in_steps(
    router: &KvRouter,
    req: &RouteRequest<'_>,
) -> (dynamo_kv_router::Result<Selection>, [u64; 3]) {
    let core = router.core();
    let ns = |t: Instant| u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let t = Instant::now();
    let (local, seq) = match core.hash_request(req) {
        Ok(h) => h,
        Err(e) => return (Err(e), [ns(t), 0, 0]),
    };
    let hash = ns(t);
    let t = Instant::now();
    let scores = core.find_matches(&local);
    let find = ns(t);
    let t = Instant::now();
    let sel = core.scheduler().select(&SchedulingRequest {
        isl_tokens: req.tokens.len(),
        seq_hashes: &seq,
        device_overlaps: Some(&scores.scores),
        index_slots: Some(&scores.index_slots),
        ..Default::default()
    });
    (sel, [hash, find, ns(t)])
}

/// `--split`: each step's p50 / p99 over the storm's decisions, and the mean of each in
/// the slowest 1 % of them (where the tail comes from).
fn split_report(total: &[u64], steps: &[[u64; 3]]) -> String {
    let mut line = String::from("  steps (--split):");
    for (k, name) in ["hash", "find_matches", "select"].iter().enumerate() {
        let mut v: Vec<u64> = steps.iter().map(|s| s[k]).collect();
        v.sort_unstable();
        line.push_str(&format!(
            " {name} p50 {} / p99 {} us;",
            fmt_us(percentile(&v, 0.5)),
            fmt_us(percentile(&v, 0.99))
        ));
    }
    let mut order: Vec<usize> = (0..total.len().min(steps.len())).collect();
    order.sort_unstable_by_key(|&i| std::cmp::Reverse(total[i]));
    let tail = &order[..order.len().div_ceil(100)];
    let n = tail.len().max(1) as u64;
    let mean = |k: usize| tail.iter().map(|&i| steps[i][k]).sum::<u64>() / n;
    let rest = tail
        .iter()
        .map(|&i| total[i].saturating_sub(steps[i].iter().sum()))
        .sum::<u64>()
        / n;
    line.push_str(&format!(
        " slowest 1 % ({} decisions), mean: hash {} / find_matches {} / select {} / between {} us",
        tail.len(),
        fmt_us(mean(0)),
        fmt_us(mean(1)),
        fmt_us(mean(2)),
        fmt_us(rest)
    ));
    line
}

fn fmt_us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

fn fmt_ms(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e6)
}

fn run(
    args: &Args,
    router: &KvRouter,
    families: &Families,
    publishers: &[EventPublisher],
    published: &Published,
    ranks: &[WorkerWithDpRank],
    ph: Phases<'_>,
) {
    let prompts = prompts(families, args.isl);
    let phase = AtomicU8::new(WARMUP);
    let applied_of = |w: usize| router.core().event_cursor(ranks[w]).map_or(0, |c| c + 1);
    let stats = router.event_stats();
    std::thread::scope(|scope| {
        // Routing decisions.
        let query = std::thread::Builder::new()
            .name("storm-query".into())
            .spawn_scoped(scope, || {
                set_thread_priority(0, args.rt);
                let (mut storm, mut idle) = (Vec::new(), Vec::new());
                // Per storm decision: wall time less the time the thread sat runnable but
                // preempted (a 2-core box shared by the storm's own threads).
                let mut storm_unpreempted = Vec::new();
                // `--split`: per storm decision, ns in hashing, find_matches and select.
                let mut storm_steps: Vec<[u64; 3]> = Vec::new();
                let mut overlap_hits = 0u64;
                let period = Duration::from_secs_f64(1.0 / args.qps);
                let mut next = Instant::now();
                let mut k = 0usize;
                loop {
                    let p = phase.load(Ordering::Relaxed);
                    if p == DONE {
                        break;
                    }
                    let tokens = &prompts[k % prompts.len()];
                    k += 1;
                    let wait0 = runqueue_wait_ns();
                    let t = Instant::now();
                    let req = RouteRequest {
                        tokens,
                        ..Default::default()
                    };
                    let (sel, steps) = if args.split {
                        decide_in_steps(router, &req)
                    } else {
                        (router.core().best_worker(&req), [0; 3])
                    };
                    let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    let preempted = runqueue_wait_ns().saturating_sub(wait0);
                    if let Ok(sel) = &sel
                        && sel.overlap_blocks > 0
                    {
                        overlap_hits += 1;
                    }
                    match p {
                        STORM => {
                            storm.push(ns);
                            storm_unpreempted.push(ns.saturating_sub(preempted));
                            storm_steps.push(steps);
                        }
                        IDLE => idle.push(ns),
                        _ => {}
                    }
                    next += period;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
                (storm, idle, overlap_hits, k, storm_unpreempted, storm_steps)
            })
            .expect("query thread");
        // Lag sampler.
        let sampler = std::thread::Builder::new()
            .name("storm-sampler".into())
            .spawn_scoped(scope, || {
                let mut ages = Vec::new();
                let (mut overflow, mut max_queue, mut max_backlog) = (0u64, 0u64, 0u64);
                let mut w = 0usize;
                let mut last_full = Instant::now();
                loop {
                    let p = phase.load(Ordering::Relaxed);
                    if p >= IDLE {
                        break;
                    }
                    if p == STORM {
                        for _ in 0..16 {
                            w = (w + 1) % ranks.len();
                            let applied = applied_of(w);
                            let count = published.count[w].load(Ordering::Acquire);
                            let now = (ph.now_ns)();
                            if applied >= count {
                                ages.push(0);
                            } else if count - applied >= RING as u64 {
                                overflow += 1;
                            } else {
                                let t = published.times[w][applied as usize % RING]
                                    .load(Ordering::Relaxed);
                                ages.push(now.saturating_sub(t));
                            }
                        }
                        max_queue = max_queue.max(stats.snapshot().queued);
                        if last_full.elapsed() >= Duration::from_millis(100) {
                            last_full = Instant::now();
                            let backlog: u64 = (0..ranks.len())
                                .map(|i| {
                                    published.count[i]
                                        .load(Ordering::Acquire)
                                        .saturating_sub(applied_of(i))
                                })
                                .sum();
                            max_backlog = max_backlog.max(backlog);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                (ages, overflow, max_queue, max_backlog)
            })
            .expect("sampler thread");

        ph.start.wait();
        std::thread::sleep(Duration::from_secs_f64(args.warmup));
        let cpu0 = cpu_by_group();
        let s0 = stats.snapshot();
        let (ob0, oe0) = (
            ph.offered_blocks.load(Ordering::Relaxed),
            ph.offered_events.load(Ordering::Relaxed),
        );
        let t0 = Instant::now();
        phase.store(STORM, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs_f64(args.secs));
        phase.store(DRAIN, Ordering::Relaxed);
        let window = t0.elapsed().as_secs_f64();
        let cpu1 = cpu_by_group();
        let s1 = stats.snapshot();
        let (ob1, oe1) = (
            ph.offered_blocks.load(Ordering::Relaxed),
            ph.offered_events.load(Ordering::Relaxed),
        );
        ph.stop_pub.store(true, Ordering::Relaxed);
        // Drain: until every published event is applied (bounded).
        let drain_start = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let drained = loop {
            let behind = (0..ranks.len())
                .any(|i| applied_of(i) < published.count[i].load(Ordering::Acquire));
            if !behind {
                break true;
            }
            if drain_start.elapsed() > Duration::from_secs(60) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let drain = drain_start.elapsed();
        phase.store(IDLE, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(2));
        phase.store(DONE, Ordering::Relaxed);
        let (storm, idle, hits, decisions, mut unpreempted, steps) =
            query.join().expect("query thread");
        let split_line = args.split.then(|| split_report(&storm, &steps));
        unpreempted.sort_unstable();
        let (ages, overflow, max_queue, max_backlog) = sampler.join().expect("sampler");
        let s2 = stats.snapshot();

        let mut storm = storm;
        let mut idle = idle;
        let mut ages = ages;
        storm.sort_unstable();
        idle.sort_unstable();
        ages.sort_unstable();
        let offered_blocks = (ob1 - ob0) as f64 / window;
        let offered_events = (oe1 - oe0) as f64 / window;
        let applied_blocks = (s1.blocks - s0.blocks) as f64 / window;
        let applied_events = (s1.applied - s0.applied) as f64 / window;
        let dropped: u64 = publishers.iter().map(EventPublisher::dropped).sum();
        let mut window_lag = s1;
        window_lag.lag_count = s1.lag_count - s0.lag_count;
        for (b, b0) in window_lag.lag_buckets.iter_mut().zip(s0.lag_buckets) {
            *b -= b0;
        }
        println!(
            "plane: {}, workers: {}, capacity/worker: {} blocks, router threads: {}, publisher threads: {}, drivers: {}",
            args.plane,
            args.workers,
            args.capacity,
            args.router_threads,
            args.pub_threads,
            args.drivers
        );
        println!("window: {window:.2} s after {:.1} s warm-up", args.warmup);
        println!(
            "offered: {offered_blocks:.0} block events/s ({offered_events:.0} events/s, {:.1} blocks/event); target {:.0}",
            offered_blocks / offered_events.max(1.0),
            args.rate
        );
        println!(
            "applied: {applied_blocks:.0} block events/s ({applied_events:.0} events/s) = {:.1}% of offered",
            100.0 * applied_blocks / offered_blocks.max(1.0)
        );
        println!(
            "lag (publish -> applied, sampled {} times): p50 {} ms, p99 {} ms, max {} ms; {} samples over {} events behind",
            ages.len(),
            fmt_ms(percentile(&ages, 0.5)),
            fmt_ms(percentile(&ages, 0.99)),
            fmt_ms(ages.last().copied().unwrap_or(0)),
            overflow,
            RING
        );
        println!(
            "router metric: lag p50 <= {} s, p99 <= {} s (histogram bounds, ms clock), last {:.3} s; queue depth max {max_queue}; backlog max {max_backlog} events",
            window_lag.lag_quantile_bound(0.5),
            window_lag.lag_quantile_bound(0.99),
            s1.last_lag_secs,
        );
        println!(
            "drain after stop: {:.1} ms ({})",
            drain.as_secs_f64() * 1e3,
            if drained {
                "all applied"
            } else {
                "NOT drained in 60 s"
            }
        );
        println!(
            "losses: publisher drops {dropped}, router gaps {}, rejected {}",
            s2.gaps, s2.rejected
        );
        println!(
            "routing decision during storm ({} decisions, {} tokens): p50 {} us, p99 {} us, max {} us",
            storm.len(),
            args.isl,
            fmt_us(percentile(&storm, 0.5)),
            fmt_us(percentile(&storm, 0.99)),
            fmt_us(storm.last().copied().unwrap_or(0))
        );
        println!(
            "  the same less time preempted (runnable, waiting for a CPU; /proc/thread-self/schedstat): p50 {} us, p99 {} us, max {} us",
            fmt_us(percentile(&unpreempted, 0.5)),
            fmt_us(percentile(&unpreempted, 0.99)),
            fmt_us(unpreempted.last().copied().unwrap_or(0))
        );
        if let Some(line) = &split_line {
            println!("{line}");
        }
        println!(
            "routing decision idle, filled index ({} decisions): p50 {} us, p99 {} us, max {} us; decisions with a cached prefix: {hits}/{decisions}",
            idle.len(),
            fmt_us(percentile(&idle, 0.5)),
            fmt_us(percentile(&idle, 0.99)),
            fmt_us(idle.last().copied().unwrap_or(0))
        );
        let mut groups: Vec<_> = cpu1.keys().cloned().collect();
        groups.sort();
        let mut line = String::from("CPU during the window (cores):");
        for g in groups {
            let c = (cpu1.get(&g).copied().unwrap_or(0.0) - cpu0.get(&g).copied().unwrap_or(0.0))
                / window;
            line.push_str(&format!(" {g} {c:.2},"));
        }
        println!("{}", line.trim_end_matches(','));
        let router_cores = (cpu1.get("storm-router").copied().unwrap_or(0.0)
            - cpu0.get("storm-router").copied().unwrap_or(0.0))
            / window;
        println!(
            "router CPU per million block events applied: {:.2} core-seconds",
            router_cores / (applied_blocks / 1e6).max(1e-9)
        );
    });
}
