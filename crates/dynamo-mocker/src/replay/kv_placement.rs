//! The project's KV router as the simulator's placement policy.
//!
//! `aisimulate-core` owns virtual time and the engines; it asks a [`PlacementPolicy`] where
//! each arriving request goes and feeds it the engines' KV events. This adapter answers with
//! the same two pieces the live router uses: the radix-tree indexer
//! ([`SharedRadixTree`]) fed with every stored/removed block, and the cost-based
//! [`Scheduler`] that books each request's prefill and decode load until it finishes.
// The option/result fields mirror the reference's keyword arguments and summary keys,
// documented once in docs/design/replay.md rather than field by field.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::mpsc;

use aisimulate_core::engine::{KvEvent, KvEventData, KvEventTier};
use aisimulate_core::replay::loadgen::{ReplayRequestHashes, ReplayRequestPayload};
use aisimulate_core::replay::{
    EngineEventBatch, Placement, PlacementCacheSample, PlacementDecision, PlacementEffects,
    PlacementPolicy, ReplayAdmissionMetadata, ReplayComposition, ReplayEngineObservation,
    RequestIdentity, WorkerStage, WorkerTopology,
};
use anyhow::{Context as _, anyhow};
use dynamo_kv_router::hashing::{LocalBlockHash, SequenceHash};
use dynamo_kv_router::indexer::SharedRadixTree;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, WorkerWithDpRank,
};
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::{LoadThresholds, TierOverlap, WorkerCapacity};
use dynamo_kv_router::scheduling::{Scheduler, SchedulingRequest};
use rustc_hash::FxHashMap;
use uuid::Uuid;

/// The prompt's block hashes, handed over by the simulator at admission.
#[derive(Debug, Default)]
pub struct KvMetadata(Option<ReplayRequestHashes>);

impl ReplayAdmissionMetadata for KvMetadata {
    fn from_hashes(hashes: Option<ReplayRequestHashes>) -> Self {
        Self(hashes)
    }
    fn for_prefill(self) -> Self {
        self
    }
    fn max_output_tokens_override(&self) -> Option<usize> {
        None
    }
    fn into_hashes(self) -> Option<ReplayRequestHashes> {
        self.0
    }
}

/// Device-tier KV events of one pass, tagged with the logical worker that emitted them.
#[derive(Debug, Default)]
pub struct KvBatch(Vec<(usize, u32, Vec<KvEvent>)>);

impl EngineEventBatch for KvBatch {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn append(&mut self, mut other: Self) {
        self.0.append(&mut other.0);
    }
}

/// Asks the engines to emit KV events and tags them with their worker.
#[derive(Debug, Default)]
pub struct KvObservation;

impl ReplayEngineObservation for KvObservation {
    type Batch = KvBatch;
    const CAPTURE_ENGINE_KV_EVENTS: bool = true;

    fn observe_engine_events(
        _stage: WorkerStage,
        worker_id: usize,
        dp_rank: u32,
        events: Vec<KvEvent>,
    ) -> KvBatch {
        if events.is_empty() {
            KvBatch::default()
        } else {
            KvBatch(vec![(worker_id, dp_rank, events)])
        }
    }

    fn stored_hashes(batch: &KvBatch) -> Vec<u64> {
        batch
            .0
            .iter()
            .flat_map(|(_, _, events)| events.iter())
            .filter(|e| e.tier == KvEventTier::Device)
            .flat_map(|e| match &e.data {
                KvEventData::Stored(s) => s.blocks.as_slice(),
                KvEventData::Removed { .. } => &[],
            })
            .map(|b| b.tokens_hash)
            .collect()
    }
}

/// The router's state: the radix indexer, the cost scheduler and the worker map. It runs on
/// the simulator's thread ([`Backend::Inline`]) or on a thread of its own
/// ([`Backend::Thread`]), fed in the simulator's order either way.
struct RouterCore {
    tree: SharedRadixTree,
    scheduler: Scheduler,
    /// Logical worker id -> scheduler ids by attention-DP rank.
    workers: BTreeMap<usize, Vec<usize>>,
    capacity: WorkerCapacity,
    event_ids: FxHashMap<(usize, u32), u64>,
}

/// What `place` needs from the request (owned, so it can cross to the router thread).
struct PlaceArgs {
    request_id: Uuid,
    isl_tokens: usize,
    hashes: ReplayRequestHashes,
}

/// The router's answer to one `place`.
struct Placed {
    scheduler_id: usize,
    overlap_blocks: u32,
    best_overlap_blocks: u32,
    isl_blocks: u32,
}

impl RouterCore {
    fn new(
        config: KvRouterConfig,
        block_size: u32,
        capacity: WorkerCapacity,
        seed: u64,
        topology: Vec<WorkerTopology>,
    ) -> anyhow::Result<Self> {
        let scheduler = Scheduler::with_rng(
            block_size,
            config,
            LoadThresholds::default(),
            fastrand::Rng::with_seed(seed),
        )
        .map_err(|e| anyhow!("{e}"))?;
        let mut me = Self {
            tree: SharedRadixTree::new(None),
            scheduler,
            workers: BTreeMap::new(),
            capacity,
            event_ids: FxHashMap::default(),
        };
        for w in topology {
            me.add_worker(w);
        }
        Ok(me)
    }

    fn add_worker(&mut self, w: WorkerTopology) {
        for rank in 0..w.scheduler_ids.len() {
            self.scheduler.upsert_worker(
                WorkerWithDpRank::new(w.worker_id as u64, rank as u32),
                Default::default(),
                self.capacity,
            );
        }
        self.workers.insert(w.worker_id, w.scheduler_ids);
    }

    fn worker_draining(&mut self, worker_id: usize) {
        self.scheduler.remove_worker(worker_id as u64);
        self.workers.remove(&worker_id);
    }

    fn worker_removed(&mut self, worker_id: usize) {
        self.scheduler.remove_worker(worker_id as u64);
        self.tree.remove_worker(worker_id as u64);
        self.workers.remove(&worker_id);
    }

    fn apply_batch(&mut self, batch: Vec<(usize, u32, Vec<KvEvent>)>) {
        for (worker, rank, events) in batch {
            for e in events {
                self.apply(worker, rank, e);
            }
        }
    }

    fn apply(&mut self, worker_id: usize, dp_rank: u32, event: KvEvent) {
        if event.tier != KvEventTier::Device {
            return;
        }
        let data = match event.data {
            KvEventData::Stored(s) => KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: s.parent_hash.map(ExternalSequenceBlockHash),
                start_position: s.start_position.map(|p| p as u32),
                blocks: s
                    .blocks
                    .into_iter()
                    .map(|b| KvCacheStoredBlockData {
                        block_hash: ExternalSequenceBlockHash(b.block_hash),
                        tokens_hash: LocalBlockHash(b.tokens_hash),
                        mm_extra_info: None,
                    })
                    .collect(),
            }),
            KvEventData::Removed { block_hashes } => KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: block_hashes
                    .into_iter()
                    .map(ExternalSequenceBlockHash)
                    .collect(),
            }),
        };
        let id = self.event_ids.entry((worker_id, dp_rank)).or_insert(0);
        *id += 1;
        // A removal of a block the index never saw is harmless; the index reports it and
        // stays consistent, so the error is dropped as the live router's event loop does.
        let _ = self.tree.apply_event(
            worker_id as u64,
            &KvCacheEvent {
                event_id: *id,
                data,
                dp_rank,
            },
        );
    }

    fn scheduler_id(&self, worker: WorkerWithDpRank) -> anyhow::Result<usize> {
        self.workers
            .get(&(worker.worker_id as usize))
            .and_then(|ranks| ranks.get(worker.dp_rank as usize))
            .copied()
            .ok_or_else(|| anyhow!("router chose unknown worker {worker:?}"))
    }

    fn place(&mut self, args: PlaceArgs) -> anyhow::Result<Placed> {
        let local: Vec<LocalBlockHash> = args
            .hashes
            .local_block_hashes
            .iter()
            .map(|&h| LocalBlockHash(h))
            .collect();
        let seq: Vec<SequenceHash> = args
            .hashes
            .sequence_hashes
            .iter()
            .map(|&h| SequenceHash(h))
            .collect();
        let scores = self.tree.find_matches(&local, false);
        let overlaps: FxHashMap<WorkerWithDpRank, TierOverlap> = scores
            .scores
            .iter()
            .map(|&(w, device)| {
                (
                    w,
                    TierOverlap {
                        device,
                        ..Default::default()
                    },
                )
            })
            .collect();
        let best = scores.scores.iter().map(|&(_, d)| d).max().unwrap_or(0);
        let id = key(args.request_id);
        let selection = self
            .scheduler
            .select(&SchedulingRequest {
                request_id: Some(&id),
                isl_tokens: args.isl_tokens,
                seq_hashes: &seq,
                overlaps: Some(&overlaps),
                ..Default::default()
            })
            .map_err(|e| anyhow!("KV router selection failed: {e}"))?;
        Ok(Placed {
            scheduler_id: self.scheduler_id(selection.worker)?,
            overlap_blocks: selection.overlap_blocks,
            best_overlap_blocks: best,
            isl_blocks: local.len() as u32,
        })
    }

    fn run(&mut self, cmd: Cmd) -> Option<anyhow::Result<Placed>> {
        match cmd {
            Cmd::Events(batch) => self.apply_batch(batch),
            Cmd::Place(args) => return Some(self.place(args)),
            // Unknown ids (already freed) are not an error for the simulation.
            Cmd::PrefillCompleted(id) => {
                let _ = self.scheduler.mark_prefill_completed(&key(id));
            }
            Cmd::Terminal(id) => {
                let _ = self.scheduler.free(&key(id));
            }
            Cmd::AddWorker(w) => self.add_worker(w),
            Cmd::Draining(w) => self.worker_draining(w),
            Cmd::Removed(w) => self.worker_removed(w),
        }
        None
    }
}

/// One input to the router, in the simulator's order.
enum Cmd {
    Events(Vec<(usize, u32, Vec<KvEvent>)>),
    Place(PlaceArgs),
    PrefillCompleted(Uuid),
    Terminal(Uuid),
    AddWorker(WorkerTopology),
    Draining(usize),
    Removed(usize),
}

/// KV event batches buffered before they are handed to the router thread (one hand-off,
/// and at most one wake-up, per this many passes that emitted events).
const EVENT_BATCHES_PER_SEND: usize = 32;

/// Where the router state lives.
///
/// Between two placements the router only absorbs inputs (KV events, prefill completions,
/// terminations) whose effects nothing reads until the next `place`. `Thread` therefore
/// applies them on a thread of its own while the simulator keeps stepping engines; `place`
/// sends its request behind them and waits for the answer. Every input is applied in the
/// order the simulator produced it, so the decisions (and the report) are identical to
/// `Inline`'s: this is pipelining, not reordering.
enum Backend {
    Inline(Box<RouterCore>),
    Thread {
        tx: Option<mpsc::Sender<Cmd>>,
        rx: mpsc::Receiver<anyhow::Result<Placed>>,
        handle: Option<std::thread::JoinHandle<()>>,
        pending: Vec<(usize, u32, Vec<KvEvent>)>,
    },
}

impl Backend {
    fn spawn(core: RouterCore) -> anyhow::Result<Self> {
        let (tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (reply_tx, rx) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("replay-kv-router".into())
            .spawn(move || {
                let mut core = core;
                while let Ok(cmd) = cmd_rx.recv() {
                    if let Some(reply) = core.run(cmd)
                        && reply_tx.send(reply).is_err()
                    {
                        return;
                    }
                }
            })
            .context("cannot start the replay router thread")?;
        Ok(Self::Thread {
            tx: Some(tx),
            rx,
            handle: Some(handle),
            pending: Vec::new(),
        })
    }

    /// Apply `cmd` (inline) or queue it behind everything sent before (thread).
    fn send(&mut self, cmd: Cmd) -> anyhow::Result<()> {
        match self {
            Self::Inline(core) => {
                if let Some(reply) = core.run(cmd) {
                    reply?;
                }
                Ok(())
            }
            Self::Thread { tx, pending, .. } => {
                let tx = tx.as_ref().ok_or_else(router_thread_gone)?;
                if !pending.is_empty() {
                    tx.send(Cmd::Events(std::mem::take(pending)))
                        .map_err(|_| router_thread_gone())?;
                }
                tx.send(cmd).map_err(|_| router_thread_gone())
            }
        }
    }

    fn events(&mut self, batch: Vec<(usize, u32, Vec<KvEvent>)>) -> anyhow::Result<()> {
        match self {
            Self::Inline(core) => {
                core.apply_batch(batch);
                Ok(())
            }
            Self::Thread { pending, .. } => {
                pending.extend(batch);
                if pending.len() >= EVENT_BATCHES_PER_SEND {
                    let batch = std::mem::take(pending);
                    self.send(Cmd::Events(batch))?;
                }
                Ok(())
            }
        }
    }

    fn place(&mut self, args: PlaceArgs) -> anyhow::Result<Placed> {
        match self {
            Self::Inline(core) => core.place(args),
            Self::Thread { .. } => {
                self.send(Cmd::Place(args))?;
                let Self::Thread { rx, .. } = self else {
                    unreachable!("matched above")
                };
                rx.recv().map_err(|_| router_thread_gone())?
            }
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Self::Thread { tx, handle, .. } = self {
            // Closing the channel ends the thread's loop.
            tx.take();
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

fn router_thread_gone() -> anyhow::Error {
    anyhow!("the replay router thread stopped")
}

/// Our KV router deciding placements inside the simulator.
pub struct KvRouterPlacement {
    backend: Backend,
    block_size: u32,
}

impl KvRouterPlacement {
    fn new(
        composition: &KvRouterComposition,
        seed: u64,
        topology: Vec<WorkerTopology>,
    ) -> anyhow::Result<Self> {
        let core = RouterCore::new(
            composition.config.clone(),
            composition.block_size,
            composition.capacity,
            seed,
            topology,
        )?;
        let backend = if composition.router_thread {
            Backend::spawn(core)?
        } else {
            Backend::Inline(Box::new(core))
        };
        Ok(Self {
            backend,
            block_size: composition.block_size,
        })
    }
}

fn key(id: Uuid) -> String {
    id.as_simple().to_string()
}

impl PlacementPolicy<ReplayRequestPayload> for KvRouterPlacement {
    type Metadata = KvMetadata;
    type Observation = KvBatch;

    fn place(
        &mut self,
        request: &ReplayRequestPayload,
        metadata: KvMetadata,
        _session_id: Option<String>,
        _now_ms: f64,
    ) -> anyhow::Result<PlacementEffects> {
        let request_id = request
            .request_id()
            .context("KV placement requires a request UUID")?;
        let hashes = metadata.0.unwrap_or_else(|| {
            ReplayRequestHashes::from_tokens(&request.prompt_tokens(), self.block_size)
        });
        let placed = self.backend.place(PlaceArgs {
            request_id,
            isl_tokens: request.input_length(),
            hashes,
        })?;
        Ok(PlacementEffects {
            decision: PlacementDecision::Immediate(Placement {
                request_id,
                scheduler_id: placed.scheduler_id,
                reported_overlap_tokens: placed.overlap_blocks as usize * self.block_size as usize,
                cache_sample: Some(PlacementCacheSample {
                    overlap_blocks: placed.overlap_blocks,
                    best_available_overlap_blocks: placed.best_overlap_blocks,
                    isl_blocks: placed.isl_blocks,
                }),
                placement_replica_id: None,
            }),
            released: Vec::new(),
        })
    }

    fn observe(&mut self, batch: KvBatch, _now_ms: f64) -> anyhow::Result<Vec<Placement>> {
        self.backend.events(batch.0)?;
        Ok(Vec::new())
    }

    fn cancel_pending(&mut self, _request_id: Uuid) -> bool {
        false
    }

    fn request_terminal(
        &mut self,
        request_id: Uuid,
        _now_ms: f64,
    ) -> anyhow::Result<Vec<Placement>> {
        self.backend.send(Cmd::Terminal(request_id))?;
        Ok(Vec::new())
    }

    fn prefill_completed(
        &mut self,
        request_id: Uuid,
        _now_ms: f64,
    ) -> anyhow::Result<Vec<Placement>> {
        self.backend.send(Cmd::PrefillCompleted(request_id))?;
        Ok(Vec::new())
    }

    fn pending_count(&self) -> usize {
        0
    }

    fn worker_ready(
        &mut self,
        worker: WorkerTopology,
        _now_ms: f64,
    ) -> anyhow::Result<Vec<Placement>> {
        self.backend.send(Cmd::AddWorker(worker))?;
        Ok(Vec::new())
    }

    fn worker_draining(
        &mut self,
        worker: WorkerTopology,
        _now_ms: f64,
    ) -> anyhow::Result<Vec<Placement>> {
        self.backend.send(Cmd::Draining(worker.worker_id))?;
        Ok(Vec::new())
    }

    fn worker_removed(
        &mut self,
        worker: WorkerTopology,
        _now_ms: f64,
    ) -> anyhow::Result<Vec<Placement>> {
        self.backend.send(Cmd::Removed(worker.worker_id))?;
        Ok(Vec::new())
    }

    fn topology_settled(&mut self, _now_ms: f64) -> anyhow::Result<Vec<Placement>> {
        Ok(Vec::new())
    }
}

/// Composition handed to `Replayer::with_composition` for `router_mode="kv_router"`.
pub struct KvRouterComposition {
    pub config: KvRouterConfig,
    pub block_size: u32,
    pub capacity: WorkerCapacity,
    pub seed: u64,
    /// Run the router on a thread of its own, pipelined with the simulator (same
    /// decisions; see [`Backend`]).
    pub router_thread: bool,
}

impl ReplayComposition for KvRouterComposition {
    type Metadata = KvMetadata;
    type Observation = KvObservation;
    type AggregatedPlacement = KvRouterPlacement;
    type DisaggregatedPlacement = KvRouterPlacement;

    fn create_aggregated_placement(
        &mut self,
        _dp_size: u32,
        topology: Vec<WorkerTopology>,
    ) -> anyhow::Result<KvRouterPlacement> {
        KvRouterPlacement::new(self, self.seed, topology)
    }

    fn create_disaggregated_placements(
        &mut self,
        _prefill_dp_size: u32,
        prefill_topology: Vec<WorkerTopology>,
        _decode_dp_size: u32,
        decode_topology: Vec<WorkerTopology>,
    ) -> anyhow::Result<(KvRouterPlacement, KvRouterPlacement)> {
        Ok((
            KvRouterPlacement::new(self, self.seed, prefill_topology)?,
            KvRouterPlacement::new(self, self.seed ^ 1, decode_topology)?,
        ))
    }
}
