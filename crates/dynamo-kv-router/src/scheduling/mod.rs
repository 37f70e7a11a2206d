//! Worker selection for KV-aware routing.
//!
//! The [`Scheduler`] keeps, per worker rank, the load of the requests it routed
//! ([`sequences::ActiveSequences`]), the worker's taints and reported capacity. For each
//! request it filters the eligible workers (required taints, busy thresholds), computes a
//! cost per worker ([`selector::worker_cost`]) from the cache overlap the indexer found and
//! the tracked load, samples one ([`selector::sample_index`]) and, when the request has an
//! id, books its load on the chosen worker.
//!
//! **Selection and booking are atomic**: both happen under one lock, so concurrent requests
//! always see each other's load (two simultaneous identical requests do not both pick the
//! same idle worker because neither saw the other).
//!
//! Configuration lives in [`config`]; the waiting queue used when every worker is saturated
//! in [`queue`]; the sharing of bookings between router replicas in [`replica_sync`] (peers'
//! bookings live next to this scheduler's own, under keys that cannot collide with them, so
//! shared prefixes still count once per worker).

pub mod config;
mod holders;
mod overlaps;
pub mod queue;
pub mod replica_sync;
pub mod selector;
pub mod sequences;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hashing::SequenceHash;
pub use crate::protocols::WorkerWithDpRank;
use config::{KvRouterConfig, RouterConfigOverride};
use holders::BookedHolders;
use replica_sync::{BookingRecord, SyncBody};
use selector::{CandidateLoad, LoadThresholds, RoutingConstraints, TierOverlap, WorkerCapacity};
use sequences::ActiveSequences;

/// One routing question.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedulingRequest<'a> {
    /// Book the request's load under this id (query only when `None`).
    pub request_id: Option<&'a str>,
    /// Prompt length in tokens.
    pub isl_tokens: usize,
    /// Sequence hashes of the prompt's complete blocks (for load tracking).
    pub seq_hashes: &'a [SequenceHash],
    /// Cache overlap per worker rank, as found by the indexer; absent means none.
    pub overlaps: Option<&'a FxHashMap<WorkerWithDpRank, TierOverlap>>,
    /// Device-tier overlap per worker rank as the indexer lists it
    /// ([`crate::indexer::OverlapScores::scores`]; ranks absent score 0). Used only when
    /// `overlaps` is `None`: the scheduler spreads it into a dense per-worker-slot buffer of
    /// its own, so a decision over a large fleet builds no map (the same costs and
    /// decisions as the equivalent `overlaps` map; if a rank is listed twice, the later
    /// entry wins, as when collecting the list into a map).
    pub device_overlaps: Option<&'a [(WorkerWithDpRank, u32)]>,
    /// Where the index keeps the ranks of `device_overlaps`
    /// ([`crate::indexer::OverlapScores::index_slots`]), when it says: the scheduler then
    /// remembers its own slot of each index slot instead of looking every listed rank up
    /// (the same decisions; ignored unless it describes `device_overlaps`).
    pub index_slots: Option<&'a crate::indexer::IndexSlots>,
    /// Per-request configuration overrides.
    pub overrides: Option<&'a RouterConfigOverride>,
    /// Placement constraints.
    pub constraints: Option<&'a RoutingConstraints>,
    /// Route to exactly this worker rank (it must be registered); it still gets a cost.
    pub pinned: Option<WorkerWithDpRank>,
    /// Workers (all their ranks) not to choose while another eligible one exists: those
    /// known down, or that already failed this request.
    pub avoid: &'a [u64],
}

/// The outcome of a selection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selection {
    /// The chosen worker rank.
    pub worker: WorkerWithDpRank,
    /// Leading prompt blocks cached on its device.
    pub overlap_blocks: u32,
    /// Its cost.
    pub cost: f64,
}

/// Load a worker rank would have if it received a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PotentialLoad {
    /// The worker rank.
    pub worker: WorkerWithDpRank,
    /// Prompt tokens waiting for prefill, including this request's uncached ones.
    pub potential_prefill_tokens: u64,
    /// KV blocks in use, including this request's new ones.
    pub potential_decode_blocks: u64,
    /// In-flight requests (not counting this one).
    pub active_requests: u64,
}

#[derive(Debug, Default)]
struct WorkerState {
    seqs: ActiveSequences,
    /// Index of this rank in [`State::loads`] and [`State::dense`] (stable while the rank
    /// is registered).
    slot: u32,
}

/// What a decision reads of every registered rank, by slot, as a struct of arrays: the
/// filter and cost passes stream over these contiguous columns (a few KB for a thousand
/// ranks) instead of chasing each rank's [`WorkerState`] through the map. The load
/// columns mirror the rank's [`ActiveSequences`] (refreshed after every change of its
/// bookings, [`Scheduler::sync_holders`]); taints and capacity live only here. A free
/// slot has `live` false and empty figures.
#[derive(Debug, Default)]
struct SlotLoads {
    worker: Vec<WorkerWithDpRank>,
    live: Vec<bool>,
    prefill: Vec<u64>,
    blocks: Vec<u64>,
    requests: Vec<u64>,
    capacity: Vec<WorkerCapacity>,
    taints: Vec<BTreeSet<String>>,
}

impl SlotLoads {
    fn push_free(&mut self) {
        self.worker.push(WorkerWithDpRank::default());
        self.live.push(false);
        self.prefill.push(0);
        self.blocks.push(0);
        self.requests.push(0);
        self.capacity.push(WorkerCapacity::default());
        self.taints.push(BTreeSet::new());
    }

    /// Copy the load figures of `seqs` into `slot`.
    #[inline]
    fn refresh(&mut self, slot: u32, seqs: &ActiveSequences) {
        let s = slot as usize;
        self.prefill[s] = seqs.active_prefill_tokens();
        self.blocks[s] = seqs.active_blocks() as u64;
        self.requests[s] = seqs.active_requests() as u64;
    }

    fn free(&mut self, slot: u32) {
        let s = slot as usize;
        self.worker[s] = WorkerWithDpRank::default();
        self.live[s] = false;
        self.prefill[s] = 0;
        self.blocks[s] = 0;
        self.requests[s] = 0;
        self.capacity[s] = WorkerCapacity::default();
        self.taints[s] = BTreeSet::new();
    }
}

/// Receives this scheduler's own booking changes, in order (see
/// [`Scheduler::set_sync_observer`]).
pub type SyncObserver = Box<dyn Fn(SyncBody) + Send + Sync>;

/// The cost pass of one decision over its candidates.
struct CostPass<'a> {
    terms: selector::CostTerms<'a>,
    /// The request's tracked blocks.
    n_blocks: usize,
    loads: &'a SlotLoads,
    /// Per slot, how many of the tracked blocks the worker holds.
    held: &'a [u32],
    /// The constraints, when they have preferred taints (else every multiplier is 1).
    preferred: Option<&'a RoutingConstraints>,
}

impl CostPass<'_> {
    /// Write the device overlap (of `overlap(slot)`) and cost of every candidate in `slots`.
    #[inline(always)]
    fn run(
        &self,
        slots: &[u32],
        overlaps: &mut [u32],
        costs: &mut [f64],
        overlap: impl Fn(usize) -> TierOverlap,
    ) {
        // Two loops rather than a branch per worker on the taints.
        match self.preferred {
            None => self.run_with(slots, overlaps, costs, overlap, |_| 1.0),
            Some(c) => self.run_with(slots, overlaps, costs, overlap, |s| {
                c.cost_multiplier(&self.loads.taints[s])
            }),
        }
    }

    #[inline(always)]
    fn run_with(
        &self,
        slots: &[u32],
        overlaps: &mut [u32],
        costs: &mut [f64],
        overlap: impl Fn(usize) -> TierOverlap,
        multiplier: impl Fn(usize) -> f64,
    ) {
        let loads = self.loads;
        for ((&slot, o), c) in slots.iter().zip(overlaps).zip(costs) {
            let s = slot as usize;
            let ov = overlap(s);
            let load = CandidateLoad {
                overlap: ov,
                active_prefill_tokens: loads.prefill[s],
                active_blocks: loads.blocks[s],
                new_blocks: (self.n_blocks - self.held[s] as usize) as u64,
                active_requests: loads.requests[s],
            };
            *o = ov.device;
            *c = self.terms.cost(&load, multiplier(s));
        }
    }
}

impl State {
    /// Rebuild [`State::order`] after a rank joined or left.
    fn rebuild_order(&mut self) {
        self.order.clear();
        self.order.extend(self.workers.values().map(|w| w.slot));
        self.from_index.forget();
    }
}

struct State {
    workers: BTreeMap<WorkerWithDpRank, WorkerState>,
    /// Per-slot figures of the registered ranks.
    loads: SlotLoads,
    /// The slots of the registered ranks in rank order (the order of `workers`, in which
    /// candidates are listed and ties drawn); rebuilt when a rank joins or leaves.
    order: Vec<u32>,
    /// Candidates of the decision being evaluated (slots, in rank order), their device
    /// overlaps and costs; reused (no allocation per decision).
    cand_slots: Vec<u32>,
    /// Device overlap per candidate (the other tiers, when given, are read from the
    /// request's map for the chosen rank only).
    cand_device: Vec<u32>,
    cand_costs: Vec<f64>,
    /// Test only: evaluate through the map of [`WorkerState`]s, as before the per-slot
    /// arrays (the model the fast path is checked against).
    #[cfg(test)]
    naive: bool,
    /// Slot of every registered rank (the index of its entry in `dense`).
    slot_of: FxHashMap<WorkerWithDpRank, u32>,
    /// Slots of removed ranks, reused first.
    free_slots: Vec<u32>,
    /// Device overlap per slot while a decision is evaluated ([`SchedulingRequest::device_overlaps`]);
    /// all zero between decisions, reused (no allocation per decision).
    dense: Vec<u32>,
    /// The scheduler slot of each index slot (see [`overlaps`]).
    from_index: overlaps::FromIndex,
    /// Which slots hold each booked block (kept in step with every worker's `seqs`).
    holders: BookedHolders,
    /// Per slot, how many of the request's tracked blocks the worker holds, while a
    /// decision is evaluated; all zero between decisions.
    held: Vec<u32>,
    owners: FxHashMap<String, WorkerWithDpRank>,
    /// Peers' bookings ([`replica_sync::remote_key`]) and their worker ranks.
    remote: FxHashMap<String, WorkerWithDpRank>,
    /// Replica sync: told of every change of `owners`' bookings, under the lock.
    observer: Option<SyncObserver>,
    rng: fastrand::Rng,
    /// Busy thresholds; here (not a plain field) so `POST /busy_threshold` can change them
    /// while requests are being routed.
    thresholds: LoadThresholds,
}

/// Selects workers and tracks the load of the requests it routed. Thread-safe.
pub struct Scheduler {
    block_size: u32,
    config: KvRouterConfig,
    state: Mutex<State>,
}

impl Scheduler {
    /// A scheduler for blocks of `block_size` tokens.
    ///
    /// # Errors
    /// [`Error::ZeroBlockSize`], or [`Error::InvalidConfig`] from validation.
    pub fn new(
        block_size: u32,
        config: KvRouterConfig,
        thresholds: LoadThresholds,
    ) -> Result<Self> {
        Self::with_rng(block_size, config, thresholds, fastrand::Rng::new())
    }

    /// Like [`Scheduler::new`] with a seeded random source (deterministic tests).
    ///
    /// # Errors
    /// As [`Scheduler::new`].
    pub fn with_rng(
        block_size: u32,
        config: KvRouterConfig,
        thresholds: LoadThresholds,
        rng: fastrand::Rng,
    ) -> Result<Self> {
        if block_size == 0 {
            return Err(Error::ZeroBlockSize);
        }
        config.validate()?;
        Ok(Self {
            block_size,
            config,
            state: Mutex::new(State {
                workers: BTreeMap::new(),
                loads: SlotLoads::default(),
                order: Vec::new(),
                cand_slots: Vec::new(),
                cand_device: Vec::new(),
                cand_costs: Vec::new(),
                #[cfg(test)]
                naive: false,
                slot_of: FxHashMap::default(),
                free_slots: Vec::new(),
                dense: Vec::new(),
                from_index: overlaps::FromIndex::default(),
                holders: BookedHolders::default(),
                held: Vec::new(),
                owners: FxHashMap::default(),
                remote: FxHashMap::default(),
                observer: None,
                rng,
                thresholds,
            }),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &KvRouterConfig {
        &self.config
    }

    /// The busy thresholds in force.
    pub fn thresholds(&self) -> LoadThresholds {
        self.lock().thresholds
    }

    /// Replace the busy thresholds; the next selection uses them.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] from [`LoadThresholds::validate`] (nothing changes then).
    pub fn set_thresholds(&self, thresholds: LoadThresholds) -> Result<()> {
        thresholds.validate()?;
        self.lock().thresholds = thresholds;
        Ok(())
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the bookkeeping half-updated in a way
        // that matters more than refusing all further routing, so keep serving.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Register a worker rank, or update its taints and capacity.
    pub fn upsert_worker(
        &self,
        worker: WorkerWithDpRank,
        taints: BTreeSet<String>,
        capacity: WorkerCapacity,
    ) {
        let mut st = self.lock();
        let st = &mut *st;
        let (slot, joined) = match st.slot_of.get(&worker) {
            Some(&slot) => (slot, false),
            None => {
                let slot = st.free_slots.pop().unwrap_or_else(|| {
                    st.dense.push(0);
                    st.held.push(0);
                    st.loads.push_free();
                    // Fewer than 2^32 ranks.
                    (st.dense.len() - 1) as u32
                });
                st.slot_of.insert(worker, slot);
                (slot, true)
            }
        };
        let w = st.workers.entry(worker).or_default();
        w.slot = slot;
        w.seqs.track_changes();
        let s = slot as usize;
        st.loads.worker[s] = worker;
        st.loads.live[s] = true;
        st.loads.taints[s] = taints;
        st.loads.capacity[s] = capacity;
        st.loads.refresh(slot, &w.seqs);
        if joined {
            st.rebuild_order();
        }
    }

    /// Record the KV blocks a worker rank reports in use.
    pub fn set_kv_used_blocks(&self, worker: WorkerWithDpRank, used: Option<u64>) {
        let mut st = self.lock();
        if let Some(&slot) = st.slot_of.get(&worker) {
            st.loads.capacity[slot as usize].kv_used_blocks = used;
        }
    }

    /// Forget every rank of `worker_id` and the requests booked on them.
    pub fn remove_worker(&self, worker_id: u64) {
        let mut st = self.lock();
        let st = &mut *st;
        let (slot_of, free_slots, holders, loads) = (
            &mut st.slot_of,
            &mut st.free_slots,
            &mut st.holders,
            &mut st.loads,
        );
        let before = st.workers.len();
        st.workers.retain(|w, state| {
            let keep = w.worker_id != worker_id;
            if !keep {
                slot_of.remove(w);
                free_slots.push(state.slot);
                loads.free(state.slot);
                for b in state.seqs.held_blocks() {
                    holders.remove(b, state.slot);
                }
            }
            keep
        });
        if st.workers.len() != before {
            st.rebuild_order();
        }
        st.remote.retain(|_, w| w.worker_id != worker_id);
        let observer = st.observer.as_ref();
        st.owners.retain(|id, w| {
            let keep = w.worker_id != worker_id;
            if !keep && let Some(o) = observer {
                o(SyncBody::Freed {
                    request_id: id.clone(),
                });
            }
            keep
        });
    }

    /// Registered worker ranks, in order.
    pub fn workers(&self) -> Vec<WorkerWithDpRank> {
        self.lock().workers.keys().copied().collect()
    }

    /// Blocks this request would hold for load tracking (borrowed from the request
    /// unless drawn at random; copied only when booked).
    fn tracked_blocks<'r>(
        params: &config::EffectiveParams,
        seq_hashes: &'r [SequenceHash],
        rng: &mut fastrand::Rng,
    ) -> Cow<'r, [SequenceHash]> {
        if !params.track_active_blocks {
            Cow::Borrowed(&[])
        } else if params.assume_kv_reuse {
            Cow::Borrowed(seq_hashes)
        } else {
            // Without reuse every block is private to its request (disaggregated decode).
            Cow::Owned(
                seq_hashes
                    .iter()
                    .map(|_| SequenceHash(rng.u64(..)))
                    .collect(),
            )
        }
    }

    fn prefill_tokens(&self, params: &config::EffectiveParams, isl: usize, overlap: u32) -> u64 {
        if params.track_prefill_tokens {
            (isl as u64).saturating_sub(u64::from(overlap) * u64::from(self.block_size))
        } else {
            0
        }
    }

    /// Costs of every eligible worker rank for `req` (after constraints and busy filters).
    ///
    /// # Errors
    /// As [`Scheduler::select`], except that nothing is booked.
    pub fn costs(&self, req: &SchedulingRequest<'_>) -> Result<Vec<(WorkerWithDpRank, f64)>> {
        let mut st = self.lock();
        self.evaluate(&mut st, req)?;
        Ok(st
            .cand_slots
            .iter()
            .zip(&st.cand_costs)
            .map(|(&s, &c)| (st.loads.worker[s as usize], c))
            .collect())
    }

    /// Fill `st.cand_*` with the eligible candidates of `req` (in rank order), their
    /// overlaps and costs; returns the request's tracked blocks.
    fn evaluate<'r>(
        &self,
        st: &mut State,
        req: &SchedulingRequest<'r>,
    ) -> Result<Cow<'r, [SequenceHash]>> {
        if let Some(o) = req.overrides {
            o.validate()?;
        }
        let params = self.config.effective(req.overrides);
        if st.workers.is_empty() {
            return Err(Error::NoWorkers);
        }
        #[cfg(test)]
        if st.naive {
            return self.evaluate_naive(st, req, &params);
        }
        let thresholds = st.thresholds;
        let check_busy = thresholds.any();
        let default_constraints = RoutingConstraints::default();
        let constraints = req.constraints.unwrap_or(&default_constraints);
        let State {
            loads,
            order,
            slot_of,
            dense,
            from_index,
            holders,
            held,
            rng,
            cand_slots,
            cand_device,
            cand_costs,
            ..
        } = st;
        cand_slots.clear();
        let min_prefill = match req.pinned {
            Some(pin) => {
                let slot = *slot_of.get(&pin).ok_or(Error::UnknownWorker {
                    worker_id: pin.worker_id,
                    dp_rank: pin.dp_rank,
                })?;
                cand_slots.push(slot);
                loads.prefill[slot as usize]
            }
            None if req.avoid.is_empty()
                && constraints.required_taints.is_empty()
                && !check_busy =>
            {
                // Nothing to filter (the common case): every rank is a candidate.
                cand_slots.extend_from_slice(order);
                order
                    .iter()
                    .map(|&s| loads.prefill[s as usize])
                    .min()
                    .ok_or(Error::NoEligibleWorkers)?
            }
            None => {
                // One pass over the slots in rank order (this runs per request over the
                // whole fleet): the idle ones among the allowed and not avoided, and, in
                // case every allowed worker is avoided, the idle avoided ones. Avoided
                // workers only when nothing else is left: better a probe of a worker
                // believed down than no answer at all.
                let (mut allowed, mut preferred) = (0usize, 0usize);
                let (mut min_idle, mut min_avoided) = (u64::MAX, u64::MAX);
                let mut idle_avoided = Vec::new();
                let any_required = !constraints.required_taints.is_empty();
                for &slot in order.iter() {
                    let s = slot as usize;
                    if any_required && !constraints.allows(&loads.taints[s]) {
                        continue;
                    }
                    allowed += 1;
                    let avoided =
                        !req.avoid.is_empty() && req.avoid.contains(&loads.worker[s].worker_id);
                    preferred += usize::from(!avoided);
                    let prefill = loads.prefill[s];
                    if check_busy && thresholds.is_busy(&loads.capacity[s], prefill) {
                        continue;
                    }
                    if avoided {
                        idle_avoided.push(slot);
                        min_avoided = min_avoided.min(prefill);
                    } else {
                        cand_slots.push(slot);
                        min_idle = min_idle.min(prefill);
                    }
                }
                if allowed == 0 {
                    return Err(Error::NoEligibleWorkers);
                }
                let (min, considered) = if preferred == 0 {
                    *cand_slots = idle_avoided;
                    (min_avoided, allowed)
                } else {
                    (min_idle, preferred)
                };
                if cand_slots.is_empty() {
                    return Err(Error::AllWorkersBusy {
                        workers: considered,
                    });
                }
                min
            }
        };
        let blocks = Self::tracked_blocks(&params, req.seq_hashes, rng);
        let spread = overlaps::spread(slot_of, from_index, dense, req);
        let counted = holders.count_held(&blocks, held);
        let pass = CostPass {
            terms: selector::CostTerms::new(&params, self.block_size, req.isl_tokens, min_prefill),
            n_blocks: blocks.len(),
            loads,
            held,
            preferred: (!constraints.preferred_taints.is_empty()).then_some(constraints),
        };
        cand_device.clear();
        cand_device.resize(cand_slots.len(), 0);
        cand_costs.clear();
        cand_costs.resize(cand_slots.len(), 0.0);
        // One loop per overlap source, so the common one (the dense buffer) has no branch
        // on it.
        match req.overlaps {
            Some(m) => pass.run(cand_slots, cand_device, cand_costs, |s| {
                m.get(&loads.worker[s]).copied().unwrap_or_default()
            }),
            None => pass.run(cand_slots, cand_device, cand_costs, |s| TierOverlap {
                device: dense[s],
                ..Default::default()
            }),
        }
        overlaps::clear(slot_of, from_index, dense, spread);
        if counted {
            held.fill(0);
        }
        Ok(blocks)
    }

    /// The overlap of rank `id` (state `w`) for `req`: from the map when given, else from
    /// `dense` (zero when `req` has no overlaps at all).
    #[inline]
    fn overlap_of(
        req: &SchedulingRequest<'_>,
        dense: &[u32],
        id: &WorkerWithDpRank,
        w: &WorkerState,
    ) -> TierOverlap {
        match req.overlaps {
            Some(m) => m.get(id).copied().unwrap_or_default(),
            None => TierOverlap {
                device: dense[w.slot as usize],
                ..Default::default()
            },
        }
    }

    /// Choose a worker rank for `req` and, if it has an id, book its load there.
    ///
    /// # Errors
    /// [`Error::NoWorkers`], [`Error::NoEligibleWorkers`] (required taints),
    /// [`Error::AllWorkersBusy`] (thresholds), [`Error::UnknownWorker`] (pin),
    /// [`Error::DuplicateRequest`], [`Error::InvalidConfig`] (overrides).
    pub fn select(&self, req: &SchedulingRequest<'_>) -> Result<Selection> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(id) = req.request_id
            && st.owners.contains_key(id)
        {
            return Err(Error::DuplicateRequest(id.to_owned()));
        }
        let blocks = self.evaluate(st, req)?;
        let params = self.config.effective(req.overrides);
        let index = selector::sample_index(&st.cand_costs, params.temperature, &mut st.rng)
            .ok_or(Error::NoEligibleWorkers)?;
        let slot = st.cand_slots[index];
        let (worker, device, cost) = (
            st.loads.worker[slot as usize],
            st.cand_device[index],
            st.cand_costs[index],
        );
        let overlap = match req.overlaps {
            Some(m) => m.get(&worker).copied().unwrap_or_default(),
            None => TierOverlap {
                device,
                ..Default::default()
            },
        };
        if let Some(id) = req.request_id {
            let observed = st.observer.is_some();
            let prefill = self.prefill_tokens(&params, req.isl_tokens, overlap.device);
            let w = st.workers.get_mut(&worker).ok_or(Error::UnknownWorker {
                worker_id: worker.worker_id,
                dp_rank: worker.dp_rank,
            })?;
            let blocks = blocks.into_owned();
            let shared = observed.then(|| blocks.clone());
            let booked = w.seqs.add_request(id, blocks, prefill);
            Self::sync_holders(&mut st.holders, &mut st.loads, w);
            booked?;
            st.owners.insert(id.to_owned(), worker);
            if let (Some(o), Some(blocks)) = (&st.observer, shared) {
                o(SyncBody::Booked(BookingRecord {
                    request_id: id.to_owned(),
                    worker,
                    blocks,
                    prefill_tokens: prefill,
                }));
            }
        }
        Ok(Selection {
            worker,
            overlap_blocks: overlap.device,
            cost,
        })
    }

    /// Potential load of every registered worker rank if it received `req`.
    pub fn potential_loads(&self, req: &SchedulingRequest<'_>) -> Vec<PotentialLoad> {
        let mut st = self.lock();
        let params = self.config.effective(req.overrides);
        let State {
            workers,
            slot_of,
            dense,
            from_index,
            holders,
            held,
            rng,
            ..
        } = &mut *st;
        let blocks = Self::tracked_blocks(&params, req.seq_hashes, rng);
        let spread = overlaps::spread(slot_of, from_index, dense, req);
        let counted = holders.count_held(&blocks, held);
        let loads = workers
            .iter()
            .map(|(id, w)| {
                let overlap = Self::overlap_of(req, dense, id, w).device;
                PotentialLoad {
                    worker: *id,
                    potential_prefill_tokens: w.seqs.active_prefill_tokens()
                        + self.prefill_tokens(&params, req.isl_tokens, overlap),
                    potential_decode_blocks: (w.seqs.active_blocks() + blocks.len()
                        - held[w.slot as usize] as usize)
                        as u64,
                    active_requests: w.seqs.active_requests() as u64,
                }
            })
            .collect();
        overlaps::clear(slot_of, from_index, dense, spread);
        if counted {
            held.fill(0);
        }
        loads
    }

    /// [`Self::potential_loads`] of one rank (`None` when it is not registered): what the
    /// selection service reports for the rank it chose, without a pass over every rank.
    pub fn potential_load_of(
        &self,
        worker: WorkerWithDpRank,
        req: &SchedulingRequest<'_>,
    ) -> Option<PotentialLoad> {
        let mut st = self.lock();
        let params = self.config.effective(req.overrides);
        let blocks = Self::tracked_blocks(&params, req.seq_hashes, &mut st.rng);
        let w = st.workers.get(&worker)?;
        let overlap = match (req.overlaps, req.device_overlaps) {
            (Some(m), _) => m.get(&worker).map_or(0, |o| o.device),
            // The last entry wins, as in `overlaps::spread`.
            (None, Some(list)) => list
                .iter()
                .rev()
                .find(|(w, _)| *w == worker)
                .map_or(0, |&(_, d)| d),
            (None, None) => 0,
        };
        Some(PotentialLoad {
            worker,
            potential_prefill_tokens: w.seqs.active_prefill_tokens()
                + self.prefill_tokens(&params, req.isl_tokens, overlap),
            potential_decode_blocks: (w.seqs.active_blocks() + w.seqs.new_blocks(&blocks)) as u64,
            active_requests: w.seqs.active_requests() as u64,
        })
    }

    fn with_request<T>(
        &self,
        request_id: &str,
        f: impl FnOnce(&mut ActiveSequences, &mut fastrand::Rng) -> Result<T>,
    ) -> Result<T> {
        self.with_request_observed(request_id, |s, rng, _| f(s, rng))
    }

    /// As [`Self::with_request`], also handing `f` the replica-sync observer.
    fn with_request_observed<T>(
        &self,
        request_id: &str,
        f: impl FnOnce(&mut ActiveSequences, &mut fastrand::Rng, Option<&SyncObserver>) -> Result<T>,
    ) -> Result<T> {
        let mut st = self.lock();
        let st = &mut *st;
        let worker = *st
            .owners
            .get(request_id)
            .ok_or_else(|| Error::UnknownRequest(request_id.to_owned()))?;
        let w = st
            .workers
            .get_mut(&worker)
            .ok_or_else(|| Error::UnknownRequest(request_id.to_owned()))?;
        let out = f(&mut w.seqs, &mut st.rng, st.observer.as_ref());
        Self::sync_holders(&mut st.holders, &mut st.loads, w);
        out
    }

    /// Bring the reverse index of booked blocks in step with `w`'s block set, and its
    /// per-slot load figures with its bookings, after a change of its bookings.
    fn sync_holders(holders: &mut BookedHolders, loads: &mut SlotLoads, w: &mut WorkerState) {
        let slot = w.slot;
        loads.refresh(slot, &w.seqs);
        w.seqs.take_changes(|b, now_held| {
            if now_held {
                holders.insert(b, slot);
            } else {
                holders.remove(b, slot);
            }
        });
    }

    /// The request produced its first token (its prompt stops counting as prefill load).
    ///
    /// # Errors
    /// [`Error::UnknownRequest`].
    pub fn mark_prefill_completed(&self, request_id: &str) -> Result<()> {
        self.with_request_observed(request_id, |s, _, observer| {
            s.mark_prefill_completed(request_id)?;
            if let Some(o) = observer {
                o(SyncBody::PrefillCompleted {
                    request_id: request_id.to_owned(),
                });
            }
            Ok(())
        })
    }

    /// The request generated another full block, tracked whatever
    /// `router_track_output_blocks` says (the selection service's explicit call); with
    /// `decay` the blocks held only by this request weigh that much (see
    /// [`ActiveSequences::add_output_block_decayed`]). Replica peers see the block, not
    /// the decay.
    ///
    /// # Errors
    /// [`Error::UnknownRequest`].
    pub fn add_output_block_decayed(&self, request_id: &str, decay: Option<f64>) -> Result<()> {
        self.with_request_observed(request_id, |s, rng, observer| {
            let block = SequenceHash(rng.u64(..));
            s.add_output_block_decayed(request_id, block, decay)?;
            if let Some(o) = observer {
                o(SyncBody::OutputBlock {
                    request_id: request_id.to_owned(),
                    block,
                });
            }
            Ok(())
        })
    }

    /// The request generated another full block (only tracked with
    /// `router_track_output_blocks`).
    ///
    /// # Errors
    /// [`Error::UnknownRequest`].
    pub fn add_output_block(&self, request_id: &str) -> Result<()> {
        if !self.config.router_track_output_blocks {
            return self.with_request(request_id, |_, _| Ok(()));
        }
        self.with_request_observed(request_id, |s, rng, observer| {
            let block = SequenceHash(rng.u64(..));
            s.add_output_block(request_id, block)?;
            if let Some(o) = observer {
                o(SyncBody::OutputBlock {
                    request_id: request_id.to_owned(),
                    block,
                });
            }
            Ok(())
        })
    }

    /// The request finished: release its load.
    ///
    /// # Errors
    /// [`Error::UnknownRequest`].
    pub fn free(&self, request_id: &str) -> Result<()> {
        self.with_request_observed(request_id, |s, _, observer| {
            s.free(request_id)?;
            if let Some(o) = observer {
                o(SyncBody::Freed {
                    request_id: request_id.to_owned(),
                });
            }
            Ok(())
        })?;
        self.lock().owners.remove(request_id);
        Ok(())
    }

    /// Tell `observer` of every later change of this scheduler's own bookings (booked,
    /// prefill completed, output block, freed), in the order they happen: it is called
    /// under the scheduler's lock, so it must be quick and must not call back (send to a
    /// channel). Replaces any previous observer.
    pub fn set_sync_observer(&self, observer: SyncObserver) {
        self.lock().observer = Some(observer);
    }

    /// This scheduler's own bookings, as they stand.
    pub fn local_bookings(&self) -> Vec<BookingRecord> {
        let st = self.lock();
        Self::bookings_of(&st)
    }

    fn bookings_of(st: &State) -> Vec<BookingRecord> {
        st.owners
            .iter()
            .filter_map(|(id, worker)| {
                let (blocks, prefill_tokens) = st.workers.get(worker)?.seqs.request(id)?;
                Some(BookingRecord {
                    request_id: id.clone(),
                    worker: *worker,
                    blocks: blocks.to_vec(),
                    prefill_tokens,
                })
            })
            .collect()
    }

    /// Hand the observer a [`SyncBody::Snapshot`] of this scheduler's own bookings, in
    /// order with the changes it is told of (taken and sent under the lock, so no change
    /// can slip between the snapshot and its delivery). Nothing happens without observer.
    pub fn emit_snapshot(&self) {
        let st = self.lock();
        if let Some(o) = &st.observer {
            o(SyncBody::Snapshot {
                bookings: Self::bookings_of(&st),
            });
        }
    }

    /// Book a peer replica's request under `key` (see [`replica_sync::BookingTracker`]);
    /// `false` when its worker rank is not registered here. A key already booked is
    /// replaced.
    pub fn book_remote(&self, key: &str, record: &BookingRecord) -> bool {
        let mut st = self.lock();
        let st = &mut *st;
        if let Some(old) = st.remote.remove(key)
            && let Some(w) = st.workers.get_mut(&old)
        {
            let _ = w.seqs.free(key);
            Self::sync_holders(&mut st.holders, &mut st.loads, w);
        }
        let Some(w) = st.workers.get_mut(&record.worker) else {
            return false;
        };
        let booked = w
            .seqs
            .add_request(key, record.blocks.clone(), record.prefill_tokens);
        Self::sync_holders(&mut st.holders, &mut st.loads, w);
        if booked.is_err() {
            return false;
        }
        st.remote.insert(key.to_owned(), record.worker);
        true
    }

    fn with_remote(&self, key: &str, f: impl FnOnce(&mut ActiveSequences)) {
        let mut st = self.lock();
        let st = &mut *st;
        if let Some(worker) = st.remote.get(key)
            && let Some(w) = st.workers.get_mut(worker)
        {
            f(&mut w.seqs);
            Self::sync_holders(&mut st.holders, &mut st.loads, w);
        }
    }

    /// A peer's request completed prefill (unknown keys are ignored).
    pub fn remote_prefill_completed(&self, key: &str) {
        self.with_remote(key, |s| {
            let _ = s.mark_prefill_completed(key);
        });
    }

    /// A peer's request holds another block (unknown keys are ignored).
    pub fn remote_output_block(&self, key: &str, block: SequenceHash) {
        self.with_remote(key, |s| {
            let _ = s.add_output_block(key, block);
        });
    }

    /// Release a peer's request (unknown keys are ignored).
    pub fn free_remote(&self, key: &str) {
        self.with_remote(key, |s| {
            let _ = s.free(key);
        });
        self.lock().remote.remove(key);
    }

    /// Peers' bookings held here.
    pub fn remote_bookings(&self) -> usize {
        self.lock().remote.len()
    }

    /// Whether a request with these constraints must wait in the router queue: every
    /// eligible worker's prefill load is above `router_queue_threshold` of its batch size.
    pub fn must_queue(&self, constraints: Option<&RoutingConstraints>) -> bool {
        let st = self.lock();
        let default_constraints = RoutingConstraints::default();
        let c = constraints.unwrap_or(&default_constraints);
        let loads = &st.loads;
        queue::should_queue(
            self.config.router_queue_threshold,
            st.order
                .iter()
                .map(|&s| s as usize)
                .filter(|&s| c.allows(&loads.taints[s]))
                .map(|s| (loads.prefill[s], loads.capacity[s].max_num_batched_tokens)),
        )
    }
}

#[cfg(test)]
impl Scheduler {
    /// The reverse index of booked blocks equals the union of the workers' block sets.
    fn holders_consistent(&self) -> bool {
        let st = self.lock();
        let mut want: Vec<(SequenceHash, u32)> = st
            .workers
            .values()
            .flat_map(|w| w.seqs.held_blocks().map(move |b| (b, w.slot)))
            .collect();
        want.sort_unstable_by_key(|&(b, s)| (b.0, s));
        st.holders.pairs() == want && st.held.iter().all(|&h| h == 0) && st.loads_consistent()
    }

    /// Evaluate through the map of [`WorkerState`]s (the model of the per-slot path).
    fn set_naive(&self, naive: bool) {
        self.lock().naive = naive;
    }

    /// The pre-struct-of-arrays evaluation: the workers in map order, their figures read
    /// from their own [`ActiveSequences`]; fills the same candidate buffers.
    fn evaluate_naive<'r>(
        &self,
        st: &mut State,
        req: &SchedulingRequest<'r>,
        params: &config::EffectiveParams,
    ) -> Result<Cow<'r, [SequenceHash]>> {
        let thresholds = st.thresholds;
        let default_constraints = RoutingConstraints::default();
        let constraints = req.constraints.unwrap_or(&default_constraints);
        let State {
            workers,
            loads,
            slot_of,
            dense,
            from_index,
            holders,
            held,
            rng,
            cand_slots,
            cand_device,
            cand_costs,
            ..
        } = st;
        let eligible: Vec<(&WorkerWithDpRank, &WorkerState)> = match req.pinned {
            Some(pin) => {
                let w = workers.get_key_value(&pin).ok_or(Error::UnknownWorker {
                    worker_id: pin.worker_id,
                    dp_rank: pin.dp_rank,
                })?;
                vec![w]
            }
            None => {
                let (mut allowed, mut preferred) = (0usize, 0usize);
                let mut idle = Vec::new();
                let mut idle_avoided = Vec::new();
                for (id, w) in workers.iter() {
                    let s = w.slot as usize;
                    if !constraints.allows(&loads.taints[s]) {
                        continue;
                    }
                    allowed += 1;
                    let avoided = req.avoid.contains(&id.worker_id);
                    preferred += usize::from(!avoided);
                    if thresholds.is_busy(&loads.capacity[s], w.seqs.active_prefill_tokens()) {
                        continue;
                    }
                    if avoided {
                        idle_avoided.push((id, w));
                    } else {
                        idle.push((id, w));
                    }
                }
                if allowed == 0 {
                    return Err(Error::NoEligibleWorkers);
                }
                let (idle, considered) = if preferred == 0 {
                    (idle_avoided, allowed)
                } else {
                    (idle, preferred)
                };
                if idle.is_empty() {
                    return Err(Error::AllWorkersBusy {
                        workers: considered,
                    });
                }
                idle
            }
        };
        let blocks = Self::tracked_blocks(params, req.seq_hashes, rng);
        let min_prefill = eligible
            .iter()
            .map(|(_, w)| w.seqs.active_prefill_tokens())
            .min()
            .unwrap_or(0);
        let spread = overlaps::spread(slot_of, from_index, dense, req);
        let counted = holders.count_held(&blocks, held);
        cand_slots.clear();
        cand_device.clear();
        cand_costs.clear();
        for (id, w) in eligible {
            let overlap = Self::overlap_of(req, dense, id, w);
            let load = CandidateLoad {
                overlap,
                active_prefill_tokens: w.seqs.active_prefill_tokens(),
                active_blocks: w.seqs.active_blocks() as u64,
                new_blocks: w.seqs.new_blocks(&blocks) as u64,
                active_requests: w.seqs.active_requests() as u64,
            };
            cand_slots.push(w.slot);
            cand_device.push(overlap.device);
            cand_costs.push(selector::worker_cost(
                params,
                self.block_size,
                req.isl_tokens,
                &load,
                min_prefill,
                constraints.cost_multiplier(&loads.taints[w.slot as usize]),
            ));
        }
        overlaps::clear(slot_of, from_index, dense, spread);
        if counted {
            held.fill(0);
        }
        Ok(blocks)
    }
}

#[cfg(test)]
impl State {
    /// The per-slot figures mirror the ranks' own trackers, `order` is the map's order and
    /// free slots are empty.
    fn loads_consistent(&self) -> bool {
        let order: Vec<u32> = self.workers.values().map(|w| w.slot).collect();
        let live = self.workers.iter().all(|(id, w)| {
            let s = w.slot as usize;
            self.loads.live[s]
                && self.loads.worker[s] == *id
                && self.loads.prefill[s] == w.seqs.active_prefill_tokens()
                && self.loads.blocks[s] == w.seqs.active_blocks() as u64
                && self.loads.requests[s] == w.seqs.active_requests() as u64
        });
        let free = self.free_slots.iter().all(|&s| {
            let s = s as usize;
            !self.loads.live[s] && self.loads.requests[s] == 0 && self.loads.taints[s].is_empty()
        });
        live && free && order == self.order
    }
}

#[cfg(test)]
mod tests;
