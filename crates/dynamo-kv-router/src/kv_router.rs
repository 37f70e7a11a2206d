//! The KV router's synchronous core: hashing, the cache index (event-driven or
//! approximate), event-gap detection and the scheduler, behind one type.
//!
//! [`KvRouterCore`] is what the async `KvRouter` of the serving layer drives: it feeds KV
//! events in ([`KvRouterCore::apply_event`]), asks for decisions
//! ([`KvRouterCore::best_worker`]) and reports request progress
//! ([`KvRouterCore::mark_prefill_completed`], [`KvRouterCore::free`]). Everything here is
//! thread-safe and non-blocking apart from short critical sections.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::approx::ApproxIndexer;
use crate::error::{Error, Result};
use crate::hashing::{
    BlockExtraInfo, BlockHashOptions, LocalBlockHash, SequenceHash, compute_block_hash_for_seq,
    compute_seq_hash_for_block,
};
use crate::indexer::{OverlapScores, SharedRadixTree};
use crate::protocols::{RouterEvent, WorkerWithDpRank};
use crate::recovery::{CursorDecision, EventCursors, WorkerKvQueryResponse};
use crate::scheduling::config::{KvRouterConfig, RouterConfigOverride};
use crate::scheduling::selector::{LoadThresholds, RoutingConstraints, WorkerCapacity};
use crate::scheduling::{PotentialLoad, Scheduler, SchedulingRequest, Selection};

/// Bound of the approximate index, in `(rank, block)` entries (the reference's
/// `router_max_tree_size`): about 100 MB of index at worst.
const APPROX_MAX_ENTRIES: usize = 1 << 20;
/// Fraction of the bound kept after pruning (the reference's `router_prune_target_ratio`).
const APPROX_PRUNE_TARGET: f64 = 0.8;

/// One routing question, in tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteRequest<'a> {
    /// Prompt token ids.
    pub tokens: &'a [u32],
    /// Book the request's load under this id.
    pub request_id: Option<&'a str>,
    /// LoRA adapter (changes block hashes).
    pub lora_name: Option<&'a str>,
    /// Cache namespace / salt (changes block hashes).
    pub cache_namespace: Option<&'a str>,
    /// Per-block multimodal info.
    pub block_mm_infos: Option<&'a [Option<BlockExtraInfo>]>,
    /// Per-request configuration overrides.
    pub overrides: Option<&'a RouterConfigOverride>,
    /// Placement constraints.
    pub constraints: Option<&'a RoutingConstraints>,
    /// Route to exactly this rank.
    pub pinned: Option<WorkerWithDpRank>,
    /// Workers not to choose while another eligible one exists (known down, or already
    /// failed this request).
    pub avoid: &'a [u64],
    /// Record the decision in the approximate index even without booking.
    pub update_indexer: bool,
}

/// What happened to an incoming event.
#[derive(Debug, Clone, PartialEq)]
pub enum EventOutcome {
    /// Applied to the index.
    Applied,
    /// Older than the rank's cursor: ignored.
    Duplicate,
    /// Events were lost: the caller must recover the rank (query the worker's local
    /// indexer from `expected`) before this event can be applied.
    Gap {
        /// The rank.
        worker: WorkerWithDpRank,
        /// First missing id.
        expected: u64,
        /// The id that arrived.
        got: u64,
    },
    /// In order, but the index rejected it (unknown parent, unknown block, ...); counted.
    Rejected(Error),
}

enum Index {
    Events(SharedRadixTree),
    Approx(Mutex<ApproxIndexer>),
}

/// Indexer + scheduler + event cursors of one KV router.
pub struct KvRouterCore {
    block_size: u32,
    index: Index,
    scheduler: Scheduler,
    cursors: Mutex<EventCursors>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl KvRouterCore {
    /// A router for blocks of `block_size` tokens.
    ///
    /// # Errors
    /// [`Error::ZeroBlockSize`] or [`Error::InvalidConfig`].
    pub fn new(
        block_size: u32,
        config: KvRouterConfig,
        thresholds: LoadThresholds,
    ) -> Result<Self> {
        thresholds.validate()?;
        let index = if config.use_kv_events {
            Index::Events(SharedRadixTree::new(None))
        } else {
            Index::Approx(Mutex::new(ApproxIndexer::new(
                Duration::from_secs_f64(config.router_ttl_secs),
                APPROX_MAX_ENTRIES,
                APPROX_PRUNE_TARGET,
            )))
        };
        let scheduler = Scheduler::new(block_size, config, thresholds)?;
        Ok(Self {
            block_size,
            index,
            scheduler,
            cursors: Mutex::new(EventCursors::default()),
        })
    }

    /// The scheduler (load tracking; replica sync applies peers' bookings to it).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The scheduler's busy thresholds.
    pub fn thresholds(&self) -> LoadThresholds {
        self.scheduler.thresholds()
    }

    /// Replace the busy thresholds (see [`Scheduler::set_thresholds`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when they are out of range.
    pub fn set_thresholds(&self, thresholds: LoadThresholds) -> Result<()> {
        self.scheduler.set_thresholds(thresholds)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The configuration in force.
    pub fn config(&self) -> &KvRouterConfig {
        self.scheduler.config()
    }

    /// Register a worker rank (or update its taints and capacity).
    pub fn upsert_worker(
        &self,
        worker: WorkerWithDpRank,
        taints: BTreeSet<String>,
        capacity: WorkerCapacity,
    ) {
        self.scheduler.upsert_worker(worker, taints, capacity);
    }

    /// Record a rank's reported KV usage.
    pub fn set_kv_used_blocks(&self, worker: WorkerWithDpRank, used: Option<u64>) {
        self.scheduler.set_kv_used_blocks(worker, used);
    }

    /// A worker left: forget its ranks, cached blocks, bookings and cursors.
    pub fn remove_worker(&self, worker_id: u64) {
        self.scheduler.remove_worker(worker_id);
        lock(&self.cursors).remove_worker(worker_id);
        match &self.index {
            Index::Events(tree) => tree.remove_worker(worker_id),
            Index::Approx(approx) => lock(approx).remove_worker(worker_id),
        }
    }

    /// The id of the last event applied for `worker`, `None` before its first one.
    pub fn event_cursor(&self, worker: WorkerWithDpRank) -> Option<u64> {
        lock(&self.cursors).last(worker)
    }

    /// Registered worker ranks.
    pub fn workers(&self) -> Vec<WorkerWithDpRank> {
        self.scheduler.workers()
    }

    /// Feed one event from the event plane.
    pub fn apply_event(&self, event: &RouterEvent) -> EventOutcome {
        let Index::Events(tree) = &self.index else {
            // Approximate mode ignores events by design.
            return EventOutcome::Duplicate;
        };
        let worker = event.worker();
        match lock(&self.cursors).check(worker, event.event.event_id) {
            CursorDecision::Apply => {}
            CursorDecision::Duplicate => return EventOutcome::Duplicate,
            CursorDecision::Gap { expected, got } => {
                return EventOutcome::Gap {
                    worker,
                    expected,
                    got,
                };
            }
        }
        match tree.apply_event(event.worker_id, &event.event) {
            Ok(()) => EventOutcome::Applied,
            Err(e) => EventOutcome::Rejected(e),
        }
    }

    /// Repair a rank with a worker's answer to a replay query.
    ///
    /// Buffered events are applied in order (duplicates skipped); a tree dump replaces the
    /// rank's state. The rank's cursor ends at the worker's `last_event_id`.
    ///
    /// # Errors
    /// [`Error::Decode`] is never returned; index errors of individual events are
    /// counted, not returned, and the first one is reported after the whole answer is
    /// applied.
    pub fn recover(&self, worker: WorkerWithDpRank, response: WorkerKvQueryResponse) -> Result<()> {
        let Index::Events(tree) = &self.index else {
            return Ok(());
        };
        let mut first_error = None;
        let mut cursors = lock(&self.cursors);
        match response {
            WorkerKvQueryResponse::Events {
                events,
                last_event_id,
            } => {
                for e in events {
                    if cursors.last(worker).is_some_and(|l| e.event_id <= l) {
                        continue;
                    }
                    if let Err(err) = tree.apply_event(worker.worker_id, &e) {
                        first_error.get_or_insert(err);
                    }
                    cursors.set(worker, e.event_id);
                }
                if let Some(last) = last_event_id {
                    cursors.set(worker, last);
                }
            }
            WorkerKvQueryResponse::TreeDump {
                events,
                last_event_id,
            } => {
                tree.with_write(|t| {
                    t.clear_rank(worker);
                    for e in &events {
                        if let Err(err) = t.apply_event(worker.worker_id, e) {
                            first_error.get_or_insert(err);
                        }
                    }
                });
                if let Some(last) = last_event_id {
                    cursors.set(worker, last);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Local and sequence hashes of a request's complete blocks.
    ///
    /// # Errors
    /// [`Error::ZeroBlockSize`] cannot happen (checked at construction).
    pub fn hash_request(
        &self,
        req: &RouteRequest<'_>,
    ) -> Result<(Vec<LocalBlockHash>, Vec<SequenceHash>)> {
        let local = compute_block_hash_for_seq(
            req.tokens,
            self.block_size as usize,
            &BlockHashOptions {
                block_mm_infos: req.block_mm_infos,
                lora_name: req.lora_name,
                cache_namespace: req.cache_namespace,
                is_eagle: false,
            },
        )?;
        let seq = compute_seq_hash_for_block(&local);
        Ok((local, seq))
    }

    /// Overlap scores of a request's blocks (device tier).
    pub fn find_matches(&self, local: &[LocalBlockHash]) -> OverlapScores {
        match &self.index {
            Index::Events(tree) => tree.find_matches(local, false),
            Index::Approx(approx) => lock(approx).find_matches(local, Instant::now()),
        }
    }

    /// Choose a worker rank for the request (booking it when it has an id).
    ///
    /// # Errors
    /// As [`Scheduler::select`].
    pub fn best_worker(&self, req: &RouteRequest<'_>) -> Result<Selection> {
        let (local, seq) = self.hash_request(req)?;
        let scores = self.find_matches(&local);
        let selection = self.scheduler.select(&SchedulingRequest {
            request_id: req.request_id,
            isl_tokens: req.tokens.len(),
            seq_hashes: &seq,
            overlaps: None,
            device_overlaps: Some(&scores.scores),
            index_slots: Some(&scores.index_slots),
            overrides: req.overrides,
            constraints: req.constraints,
            pinned: req.pinned,
            avoid: req.avoid,
        })?;
        if let Index::Approx(approx) = &self.index
            && (req.request_id.is_some() || req.update_indexer)
        {
            lock(approx).process_routing_decision(selection.worker, &local, Instant::now());
        }
        Ok(selection)
    }

    /// Record that a request was routed to `worker` (approximate mode's input).
    ///
    /// # Errors
    /// [`Error::ZeroBlockSize`] cannot happen.
    pub fn record_routing_decision(&self, tokens: &[u32], worker: WorkerWithDpRank) -> Result<()> {
        if let Index::Approx(approx) = &self.index {
            let (local, _) = self.hash_request(&RouteRequest {
                tokens,
                ..Default::default()
            })?;
            lock(approx).process_routing_decision(worker, &local, Instant::now());
        }
        Ok(())
    }

    /// The load every rank would have with this request.
    ///
    /// # Errors
    /// [`Error::ZeroBlockSize`] cannot happen.
    pub fn potential_loads(&self, req: &RouteRequest<'_>) -> Result<Vec<PotentialLoad>> {
        let (local, seq) = self.hash_request(req)?;
        let scores = self.find_matches(&local);
        Ok(self.scheduler.potential_loads(&SchedulingRequest {
            isl_tokens: req.tokens.len(),
            seq_hashes: &seq,
            device_overlaps: Some(&scores.scores),
            index_slots: Some(&scores.index_slots),
            overrides: req.overrides,
            ..Default::default()
        }))
    }

    /// See [`Scheduler::mark_prefill_completed`].
    ///
    /// # Errors
    /// [`Error::UnknownRequest`].
    pub fn mark_prefill_completed(&self, request_id: &str) -> Result<()> {
        self.scheduler.mark_prefill_completed(request_id)
    }

    /// See [`Scheduler::add_output_block`].
    ///
    /// # Errors
    /// [`Error::UnknownRequest`].
    pub fn add_output_block(&self, request_id: &str) -> Result<()> {
        self.scheduler.add_output_block(request_id)
    }

    /// See [`Scheduler::free`].
    ///
    /// # Errors
    /// [`Error::UnknownRequest`].
    pub fn free(&self, request_id: &str) -> Result<()> {
        self.scheduler.free(request_id)
    }

    /// Whether a request must wait in the router queue (every eligible rank saturated).
    pub fn must_queue(&self, constraints: Option<&RoutingConstraints>) -> bool {
        self.scheduler.must_queue(constraints)
    }

    /// The index as events (empty in approximate mode).
    pub fn dump_events(&self) -> Vec<RouterEvent> {
        match &self.index {
            Index::Events(tree) => tree.dump_events(),
            Index::Approx(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::{
        KvCacheEvent, KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData, StorageTier,
    };
    use crate::recovery::{LocalKvIndexer, WorkerKvQueryRequest};

    const BS: u32 = 4;

    fn store_event(core: &KvRouterCore, worker: u64, id: u64, tokens: &[u32]) -> RouterEvent {
        let (local, seq) = core
            .hash_request(&RouteRequest {
                tokens,
                ..Default::default()
            })
            .expect("hashes");
        RouterEvent {
            worker_id: worker,
            storage_tier: StorageTier::Device,
            event: KvCacheEvent {
                event_id: id,
                data: KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: None,
                    start_position: None,
                    blocks: local
                        .iter()
                        .zip(&seq)
                        .map(|(l, s)| KvCacheStoredBlockData::new(s.0, l.0))
                        .collect(),
                }),
                dp_rank: 0,
            },
        }
    }

    fn core(config: KvRouterConfig) -> KvRouterCore {
        let c = KvRouterCore::new(BS, config, LoadThresholds::default()).expect("valid");
        for w in 0..3 {
            c.upsert_worker(
                WorkerWithDpRank::new(w, 0),
                BTreeSet::new(),
                Default::default(),
            );
        }
        c
    }

    #[test]
    fn routes_to_the_worker_that_reported_the_prefix() {
        let c = core(KvRouterConfig::default());
        let prompt: Vec<u32> = (0..64).collect();
        assert_eq!(
            c.apply_event(&store_event(&c, 2, 0, &prompt[..48])),
            EventOutcome::Applied
        );
        let sel = c
            .best_worker(&RouteRequest {
                tokens: &prompt,
                ..Default::default()
            })
            .expect("workers");
        assert_eq!(sel.worker, WorkerWithDpRank::new(2, 0));
        assert_eq!(sel.overlap_blocks, 12);
        c.remove_worker(2);
        assert!(
            c.find_matches(
                &c.hash_request(&RouteRequest {
                    tokens: &prompt,
                    ..Default::default()
                })
                .expect("h")
                .0
            )
            .scores
            .is_empty()
        );
    }

    /// The scheduler reads overlaps through its remembered translation from the tree's
    /// slots to its own: workers leaving and others taking their slots, on either side or
    /// on both in different orders, must never credit one worker with another's prefix.
    #[test]
    fn overlaps_follow_workers_through_slot_reuse() {
        let c = core(KvRouterConfig::default());
        let prompt: Vec<u32> = (0..64).collect();
        let register = |worker: u64| {
            c.upsert_worker(
                WorkerWithDpRank::new(worker, 0),
                BTreeSet::new(),
                Default::default(),
            );
        };
        let publish = |worker: u64, id: u64, blocks: usize| {
            let ev = store_event(&c, worker, id, &prompt[..blocks * BS as usize]);
            assert_eq!(c.apply_event(&ev), EventOutcome::Applied);
        };
        let decide = || {
            let sel = c
                .best_worker(&RouteRequest {
                    tokens: &prompt,
                    ..Default::default()
                })
                .expect("workers");
            (sel.worker.worker_id, sel.overlap_blocks)
        };
        // 40 workers hold the first 4 blocks, worker 49 holds 8; worker 200 is known to
        // the scheduler but has published nothing yet.
        for w in 10..50 {
            register(w);
            publish(w, 0, if w == 49 { 8 } else { 4 });
        }
        register(200);
        assert_eq!(decide(), (49, 8));
        // The scheduler alone: it drops worker 49 (the tree still lists its blocks) and
        // gives its slot to a newcomer holding nothing.
        c.scheduler().remove_worker(49);
        register(500);
        let (worker, overlap) = decide();
        assert_eq!(overlap, 4);
        assert_ne!(worker, 500);
        // The tree alone: worker 47 drops its blocks (its tree slot is freed), then worker
        // 200 publishes and takes that slot.
        let cleared = RouterEvent {
            worker_id: 47,
            storage_tier: StorageTier::Device,
            event: KvCacheEvent {
                event_id: 1,
                data: KvCacheEventData::Cleared,
                dp_rank: 0,
            },
        };
        assert_eq!(c.apply_event(&cleared), EventOutcome::Applied);
        assert_eq!(decide().1, 4);
        publish(200, 0, 9);
        assert_eq!(decide(), (200, 9));
        // Both sides, in different orders: two workers leave; two newcomers register in one
        // order and publish in the other, so each side gives them the freed slots the other
        // way round.
        for round in 0..4u64 {
            c.remove_worker(10 + 2 * round);
            c.remove_worker(11 + 2 * round);
            let (long, short) = (300 + round, 400 + round);
            register(long);
            register(short);
            publish(short, 0, 2);
            publish(long, 0, 10 + round as usize);
            assert_eq!(decide(), (long, 10 + round as u32), "round {round}");
        }
    }

    #[test]
    fn gaps_are_detected_and_recovered_from_the_local_indexer() {
        let c = core(KvRouterConfig::default());
        let w = WorkerWithDpRank::new(1, 0);
        let mut local = LocalKvIndexer::new(w, 8);
        let prompts: Vec<Vec<u32>> = (0..4u32)
            .map(|p| (p * 100..p * 100 + 16).collect())
            .collect();
        let events: Vec<RouterEvent> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| store_event(&c, 1, i as u64, p))
            .collect();
        for e in &events {
            local.record(e.event.clone()).expect("worker applies");
        }
        // The router receives 0 and 3; 1 and 2 are lost.
        assert_eq!(c.apply_event(&events[0]), EventOutcome::Applied);
        let gap = c.apply_event(&events[3]);
        assert_eq!(
            gap,
            EventOutcome::Gap {
                worker: w,
                expected: 1,
                got: 3
            }
        );
        let answer = local.query(&WorkerKvQueryRequest {
            worker_id: 1,
            dp_rank: 0,
            start_event_id: Some(1),
            end_event_id: None,
        });
        c.recover(w, answer).expect("replay applies");
        for p in &prompts {
            let (l, _) = c
                .hash_request(&RouteRequest {
                    tokens: p,
                    ..Default::default()
                })
                .expect("h");
            assert_eq!(c.find_matches(&l).get(w), Some(4), "prompt {p:?}");
        }
        assert_eq!(c.apply_event(&events[3]), EventOutcome::Duplicate);
        assert_eq!(
            c.apply_event(&store_event(&c, 1, 4, &[9; 8])),
            EventOutcome::Applied
        );
    }

    #[test]
    fn dump_recovery_replaces_rank_state() {
        let c = core(KvRouterConfig::default());
        let w = WorkerWithDpRank::new(1, 0);
        // The router holds stale state the worker has since evicted.
        c.apply_event(&store_event(&c, 1, 0, &[7; 8]));
        let mut local = LocalKvIndexer::new(w, 1);
        let fresh = store_event(&c, 1, 5, &[5; 8]);
        local.record(fresh.event.clone()).expect("worker applies");
        local
            .record(store_event(&c, 1, 6, &[6; 8]).event)
            .expect("worker applies");
        let answer = local.query(&WorkerKvQueryRequest {
            worker_id: 1,
            start_event_id: Some(1),
            ..Default::default()
        });
        assert!(matches!(answer, WorkerKvQueryResponse::TreeDump { .. }));
        c.recover(w, answer).expect("dump applies");
        let score = |t: &[u32]| {
            let (l, _) = c
                .hash_request(&RouteRequest {
                    tokens: t,
                    ..Default::default()
                })
                .expect("h");
            c.find_matches(&l).get(w)
        };
        assert_eq!(score(&[7; 8]), None);
        assert_eq!(score(&[5; 8]), Some(2));
        assert_eq!(score(&[6; 8]), Some(2));
    }

    #[test]
    fn approximate_mode_learns_from_its_own_decisions() {
        let c = core(KvRouterConfig {
            use_kv_events: false,
            ..Default::default()
        });
        let prompt: Vec<u32> = (0..32).collect();
        let first = c
            .best_worker(&RouteRequest {
                tokens: &prompt,
                request_id: Some("a"),
                ..Default::default()
            })
            .expect("workers");
        c.free("a").expect("booked");
        let second = c
            .best_worker(&RouteRequest {
                tokens: &prompt,
                ..Default::default()
            })
            .expect("workers");
        assert_eq!(second.worker, first.worker);
        assert_eq!(second.overlap_blocks, 8);
        assert!(c.dump_events().is_empty());
    }
}
