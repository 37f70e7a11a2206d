//! [`SelectionService`]: the catalog, one index + scheduler per (model, routing group),
//! the pending-selection cache and the reservations, behind one thread-safe type.
//!
//! Every operation but `upsert_worker` is synchronous and short (a few locks, hashing the
//! prompt, one tree walk, one scheduler decision), so callers run them on their own thread
//! (the Python binding with the GIL released, the HTTP handlers inline). KV-event
//! listeners run on the tokio runtime given at construction.
//!
//! Locking: `state` (catalog, groups, reservations) is held only to look things up or
//! change registrations, never while hashing or selecting; each group's tree and scheduler
//! have their own locks. Selection and booking are atomic inside the scheduler.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dynamo_kv_router::hashing::{
    BlockHashOptions, LocalBlockHash, SequenceHash, compute_block_hash_for_seq,
    compute_seq_hash_for_block,
};
use dynamo_kv_router::indexer::SharedRadixTree;
use dynamo_kv_router::protocols::{RouterEvent, WorkerWithDpRank};
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::{LoadThresholds, TierOverlap, WorkerCapacity};
use dynamo_kv_router::scheduling::{Scheduler, SchedulingRequest};
use rustc_hash::FxHashMap;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::cache::{PendingCache, SelectionCacheConfig};
use super::catalog::{Lifecycle, WorkerRecord, WorkerRequest, zmq_tcp_address};
use super::error::{ErrorKind, Result, SelectionError};
use super::group::{Group, lock};
use super::listener::{self, Link, LinkCell, ListenerMetrics};
use super::replica::ReplicaHub;
use super::requests::{
    GroupLoads, LoadEntry, OverlapResponse, OverlapSummary, PromptRequest, ReadyResponse,
    ReservationRequest, ReservationResponse, ReserveResponse, SelectResponse, Selected,
    SharedCache, WorkerOverlap,
};

/// How long `upsert_worker_settled` waits for the first connection attempt of a new
/// listener, so the returned record already says whether the publisher is reachable
/// (a refused loopback connect takes well under a millisecond; a remote one a round trip).
const FIRST_CONNECT_WAIT: Duration = Duration::from_millis(300);
/// Options of a service.
#[derive(Debug, Clone, Default)]
pub struct ServiceOptions {
    /// Router configuration (costs, tracking).
    pub router: KvRouterConfig,
    /// Pending-selection cache bounds.
    pub selection_cache: SelectionCacheConfig,
}

type GroupKey = (String, String);

struct WorkerEntry {
    req: WorkerRequest,
    /// Registration problems (incomplete) — includes a block-size mismatch with the group.
    config_reasons: Vec<String>,
    /// Rank → (endpoint, link), while listeners run.
    links: BTreeMap<u32, (String, LinkCell)>,
    stop: CancellationToken,
    /// The group it is registered in (complete registrations only).
    group: Option<(GroupKey, Arc<Group>)>,
}

impl WorkerEntry {
    fn link_reasons(&self) -> Vec<String> {
        self.links
            .iter()
            .filter_map(|(rank, (ep, cell))| match &*lock(cell) {
                Link::Down(why) => Some(format!(
                    "kv_events endpoint {ep} for dp_rank {rank} is unreachable: {why}"
                )),
                _ => None,
            })
            .collect()
    }

    fn is_down(&self) -> bool {
        self.links
            .values()
            .any(|(_, cell)| matches!(&*lock(cell), Link::Down(_)))
    }

    fn record(&self) -> WorkerRecord {
        if !self.config_reasons.is_empty() {
            return self
                .req
                .record(Lifecycle::Incomplete, self.config_reasons.clone());
        }
        let down = self.link_reasons();
        if down.is_empty() {
            self.req.record(Lifecycle::Schedulable, Vec::new())
        } else {
            self.req.record(Lifecycle::Unschedulable, down)
        }
    }
}

#[derive(Clone)]
struct Pending {
    key: GroupKey,
    worker: WorkerWithDpRank,
    seq: Vec<SequenceHash>,
    isl: usize,
    overlap: u32,
}

#[derive(Default)]
struct State {
    workers: BTreeMap<u64, WorkerEntry>,
    groups: HashMap<GroupKey, Arc<Group>>,
    /// Selection id → its group, while booked.
    reservations: HashMap<String, GroupKey>,
    shut_down: bool,
    /// Replica sync with peer services, when enabled (see `sync.rs`).
    replica: Option<Arc<ReplicaHub>>,
    /// A peer's dump events waiting for their workers to register (see `sync.rs`).
    recovered: Option<sync::Recovered>,
}

#[derive(Debug, Default)]
struct Counters {
    selections: AtomicU64,
    reservations: AtomicU64,
    errors: AtomicU64,
}

/// The runtime-free selection core.
pub struct SelectionService {
    options: ServiceOptions,
    state: Mutex<State>,
    cache: Mutex<PendingCache<Pending>>,
    handle: tokio::runtime::Handle,
    stop: CancellationToken,
    listeners: Arc<ListenerMetrics>,
    counters: Counters,
}

struct Prepared {
    key: GroupKey,
    group: Arc<Group>,
    down: Vec<u64>,
    local: Vec<LocalBlockHash>,
    seq: Vec<SequenceHash>,
    isl: usize,
}

fn new_uuid() -> String {
    let a = fastrand::u64(..);
    let b = fastrand::u64(..);
    // Version 4, variant 1 bits.
    let b = (b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    let a = (a & 0xffff_ffff_ffff_0fff) | 0x0000_0000_0000_4000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

fn not_ready(model: &str, group: &str) -> SelectionError {
    SelectionError::new(
        ErrorKind::NotReady,
        format!("no schedulable workers for model={model} routing_group={group}"),
    )
}

impl SelectionService {
    /// A service whose listeners run on `handle`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidRequest`] for an invalid configuration.
    pub fn new(options: ServiceOptions, handle: tokio::runtime::Handle) -> Result<Self> {
        options
            .selection_cache
            .validate()
            .map_err(SelectionError::invalid)?;
        options
            .router
            .validate()
            .map_err(|e| SelectionError::invalid(e.to_string()))?;
        Ok(Self {
            cache: Mutex::new(PendingCache::new(&options.selection_cache)),
            options,
            state: Mutex::new(State::default()),
            handle,
            stop: CancellationToken::new(),
            listeners: Arc::new(ListenerMetrics::default()),
            counters: Counters::default(),
        })
    }

    fn check_running(st: &State) -> Result<()> {
        if st.shut_down {
            return Err(SelectionError::new(
                ErrorKind::NotReady,
                "selection service is shutting down",
            ));
        }
        Ok(())
    }

    /// Register or replace a worker and (re)start its KV-event listeners.
    ///
    /// # Errors
    /// [`ErrorKind::NotReady`] after shutdown.
    pub fn upsert_worker(&self, req: WorkerRequest) -> Result<WorkerRecord> {
        let mut st = lock(&self.state);
        Self::check_running(&st)?;
        let key: GroupKey = (req.model().to_owned(), req.group().to_owned());
        let mut config_reasons = req.config_reasons();
        let endpoints = req.rank_endpoints();
        // Keep the running listeners when nothing they depend on changed.
        let unchanged = st.workers.get(&req.worker_id).is_some_and(|old| {
            old.config_reasons.is_empty()
                && old.group.as_ref().map(|(k, _)| k) == Some(&key)
                && old.req.block_size == req.block_size
                && old.req.rank_endpoints() == endpoints
                && old.req.replay_endpoint == req.replay_endpoint
        });
        if !unchanged && let Some(old) = st.workers.remove(&req.worker_id) {
            Self::detach(&mut st, req.worker_id, old);
        }
        let bs = req.block_size.unwrap_or(0);
        let group = if !config_reasons.is_empty() {
            None
        } else if let Some(g) = st.groups.get(&key) {
            if g.block_size == bs {
                Some(g.clone())
            } else {
                config_reasons.push(format!(
                    "block_size {bs} differs from block_size {} of the workers of model={} routing_group={}",
                    g.block_size, key.0, key.1
                ));
                None
            }
        } else {
            let scheduler =
                Scheduler::new(bs, self.options.router.clone(), LoadThresholds::default())
                    .map_err(|e| SelectionError::from_router(e, &key.0, &key.1))?;
            let g = Arc::new(Group {
                block_size: bs,
                tree: SharedRadixTree::new(None),
                scheduler,
            });
            st.groups.insert(key.clone(), g.clone());
            Some(g)
        };
        if let Some(g) = &group {
            let taints: BTreeSet<String> = req.taints.iter().cloned().collect();
            let capacity = WorkerCapacity {
                total_kv_blocks: req.total_kv_blocks,
                max_num_batched_tokens: req.max_num_batched_tokens,
                kv_used_blocks: None,
            };
            for rank in req.ranks() {
                g.scheduler.upsert_worker(
                    WorkerWithDpRank::new(req.worker_id, rank),
                    taints.clone(),
                    capacity,
                );
            }
            if let Some(hub) = &st.replica {
                hub.attach(&key, g.clone());
            }
            Self::apply_recovered(&mut st, &key, req.worker_id, g);
        }
        let entry = if unchanged {
            let mut e = st
                .workers
                .remove(&req.worker_id)
                .ok_or_else(|| SelectionError::new(ErrorKind::Internal, "worker vanished"))?;
            e.req = req;
            e.config_reasons = config_reasons;
            e
        } else {
            let stop = self.stop.child_token();
            let mut links = BTreeMap::new();
            if let Some(g) = &group {
                for (rank, ep) in &endpoints {
                    let cell: LinkCell = Arc::new(Mutex::new(Link::Pending));
                    if let Ok(address) = zmq_tcp_address(ep) {
                        let replay = req.replay_endpoint.as_deref().and_then(|r| {
                            listener::rank_replay_address(r, rank - req.ranks().start)
                        });
                        listener::spawn(
                            &self.handle,
                            g.clone(),
                            WorkerWithDpRank::new(req.worker_id, *rank),
                            address,
                            replay,
                            cell.clone(),
                            stop.clone(),
                            self.listeners.clone(),
                        );
                    }
                    links.insert(*rank, (ep.clone(), cell));
                }
            }
            WorkerEntry {
                req,
                config_reasons,
                links,
                stop,
                group: group.map(|g| (key, g)),
            }
        };
        let record = entry.record();
        st.workers.insert(record.worker_id, entry);
        Ok(record)
    }

    /// [`Self::upsert_worker`], then wait (briefly) for new listeners' first connection
    /// attempt so the record says whether the publishers are reachable.
    ///
    /// # Errors
    /// As [`Self::upsert_worker`].
    pub async fn upsert_worker_settled(&self, req: WorkerRequest) -> Result<WorkerRecord> {
        let id = req.worker_id;
        let mut record = self.upsert_worker(req)?;
        let deadline = Instant::now() + FIRST_CONNECT_WAIT;
        while Instant::now() < deadline {
            let pending = {
                let st = lock(&self.state);
                st.workers.get(&id).is_some_and(|w| {
                    w.links
                        .values()
                        .any(|(_, c)| matches!(&*lock(c), Link::Pending))
                })
            };
            if !pending {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Some(w) = lock(&self.state).workers.get(&id) {
            record = w.record();
        }
        Ok(record)
    }

    /// Stop a worker's listeners and forget it in its group.
    fn detach(st: &mut State, worker_id: u64, entry: WorkerEntry) {
        entry.stop.cancel();
        if let Some((key, g)) = entry.group {
            g.scheduler.remove_worker(worker_id);
            g.tree.remove_worker(worker_id);
            let still_used = st
                .workers
                .values()
                .any(|w| w.group.as_ref().is_some_and(|(k, _)| *k == key));
            if !still_used {
                st.groups.remove(&key);
                if let Some(hub) = &st.replica {
                    hub.detach(&key);
                }
            }
        }
    }

    /// Remove a worker; returns its last record (lifecycle `unschedulable`).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`].
    pub fn delete_worker(&self, worker_id: u64) -> Result<WorkerRecord> {
        let mut st = lock(&self.state);
        let entry = st
            .workers
            .remove(&worker_id)
            .ok_or_else(|| SelectionError::not_found(format!("worker {worker_id} not found")))?;
        let record = entry.req.record(Lifecycle::Unschedulable, Vec::new());
        Self::detach(&mut st, worker_id, entry);
        Ok(record)
    }

    /// Catalog records, optionally filtered.
    pub fn list_workers(&self, model: Option<&str>, group: Option<&str>) -> Vec<WorkerRecord> {
        let st = lock(&self.state);
        st.workers
            .values()
            .filter(|w| model.is_none_or(|m| w.req.model() == m))
            .filter(|w| group.is_none_or(|g| w.req.group() == g))
            .map(WorkerEntry::record)
            .collect()
    }

    /// Readiness and the catalog.
    pub fn ready(&self) -> ReadyResponse {
        let shut = lock(&self.state).shut_down;
        let workers = self.list_workers(None, None);
        let schedulable = workers
            .iter()
            .filter(|w| w.lifecycle == Lifecycle::Schedulable)
            .count();
        ReadyResponse {
            ready: !shut && schedulable > 0,
            schedulable_workers: schedulable,
            workers,
        }
    }

    /// Look up the group and hash the prompt.
    fn prepare(&self, req: &PromptRequest) -> Result<Prepared> {
        let (model, gname) = (req.model(), req.group());
        let (key, group, down) = {
            let st = lock(&self.state);
            Self::check_running(&st)?;
            let key: GroupKey = (model.to_owned(), gname.to_owned());
            let group = st
                .groups
                .get(&key)
                .cloned()
                .ok_or_else(|| not_ready(model, gname))?;
            let mut down = Vec::new();
            let mut up = 0usize;
            for (id, w) in &st.workers {
                if w.group.as_ref().is_some_and(|(k, _)| *k == key) {
                    if w.is_down() {
                        down.push(*id);
                    } else {
                        up += 1;
                    }
                }
            }
            if up == 0 {
                return Err(not_ready(model, gname));
            }
            (key, group, down)
        };
        let bs = group.block_size as usize;
        let (local, seq, isl) = if let Some(tokens) = &req.token_ids {
            let local = compute_block_hash_for_seq(
                tokens,
                bs,
                &BlockHashOptions {
                    block_mm_infos: None,
                    lora_name: req.lora_name.as_deref(),
                    cache_namespace: req.cache_namespace.as_deref(),
                    is_eagle: false,
                },
            )
            .map_err(|e| SelectionError::invalid(e.to_string()))?;
            let seq = compute_seq_hash_for_block(&local);
            (local, seq, tokens.len())
        } else {
            let blocks = req.block_hashes.as_ref().ok_or_else(|| {
                SelectionError::invalid("block_hashes is required without token_ids")
            })?;
            let seqs = req.sequence_hashes.as_ref().ok_or_else(|| {
                SelectionError::invalid("sequence_hashes is required without token_ids")
            })?;
            (
                blocks.iter().map(|h| LocalBlockHash(h.0)).collect(),
                seqs.iter().map(|h| SequenceHash(h.0)).collect::<Vec<_>>(),
                req.isl_tokens.unwrap_or(blocks.len() * bs),
            )
        };
        Ok(Prepared {
            key,
            group,
            down,
            local,
            seq,
            isl,
        })
    }

    fn overlaps(p: &Prepared) -> FxHashMap<WorkerWithDpRank, TierOverlap> {
        p.group
            .tree
            .find_matches(&p.local, false)
            .scores
            .into_iter()
            .map(|(w, device)| {
                (
                    w,
                    TierOverlap {
                        device,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    fn endpoint_of(&self, worker_id: u64) -> Option<String> {
        lock(&self.state)
            .workers
            .get(&worker_id)
            .and_then(|w| w.req.endpoint.clone())
    }

    /// Choose (and with `book`, book under it) for a prepared prompt.
    fn choose(
        &self,
        p: &Prepared,
        req: &PromptRequest,
        book: Option<&str>,
        pinned: Option<WorkerWithDpRank>,
    ) -> Result<Selected> {
        let overlaps = Self::overlaps(p);
        let sreq = SchedulingRequest {
            request_id: book,
            isl_tokens: p.isl,
            seq_hashes: &p.seq,
            overlaps: Some(&overlaps),
            device_overlaps: None,
            index_slots: None,
            overrides: req.router_config_override.as_ref(),
            constraints: None,
            pinned,
            avoid: &p.down,
        };
        let sel = p
            .group
            .scheduler
            .select(&sreq)
            .map_err(|e| SelectionError::from_router(e, &p.key.0, &p.key.1))?;
        if p.down.contains(&sel.worker.worker_id) {
            if let Some(id) = book {
                let _ = p.group.scheduler.free(id);
            }
            return Err(not_ready(&p.key.0, &p.key.1));
        }
        // The chosen rank's load with this request (before it is booked, when it is).
        let decode = p
            .group
            .scheduler
            .potential_load_of(
                sel.worker,
                &SchedulingRequest {
                    request_id: None,
                    ..sreq
                },
            )
            // After booking, the request's blocks are active and none is new: the same sum.
            .map_or(p.seq.len() as u64, |l| l.potential_decode_blocks);
        // Overlaps are reported in tokens (blocks x block size), as the reference does.
        let bs = p.group.block_size;
        let longest = overlaps.values().map(|o| o.device).max().unwrap_or(0) * bs;
        let mut dp = BTreeMap::new();
        for (w, o) in &overlaps {
            if w.worker_id == sel.worker.worker_id {
                dp.insert(w.dp_rank.to_string(), o.device * bs);
            }
        }
        dp.entry(sel.worker.dp_rank.to_string())
            .or_insert(sel.overlap_blocks * bs);
        let gpu = sel.overlap_blocks * bs;
        self.counters.selections.fetch_add(1, Ordering::Relaxed);
        Ok(Selected {
            model_name: p.key.0.clone(),
            routing_group: p.key.1.clone(),
            worker_id: sel.worker.worker_id,
            dp_rank: sel.worker.dp_rank,
            endpoint: self.endpoint_of(sel.worker.worker_id),
            block_size: p.group.block_size,
            // A block on the device also counts as reachable from the lower tiers.
            overlap: OverlapSummary {
                longest_matched: longest,
                gpu,
                dp,
                cpu: gpu,
                disk: gpu,
            },
            effective_prefill_tokens: p
                .isl
                .saturating_sub(sel.overlap_blocks as usize * p.group.block_size as usize),
            potential_decode_blocks: decode,
        })
    }

    fn count_err<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Choose a worker without booking; with a `selection_id` the choice is cached for
    /// [`Self::create_reservation`].
    ///
    /// # Errors
    /// [`ErrorKind::NotReady`], [`ErrorKind::InvalidRequest`], ...
    pub fn select(&self, req: &PromptRequest) -> Result<SelectResponse> {
        self.count_err(self.select_inner(req))
    }

    fn select_inner(&self, req: &PromptRequest) -> Result<SelectResponse> {
        let p = self.prepare(req)?;
        let selected = self.choose(&p, req, None, None)?;
        if let Some(id) = &req.selection_id {
            let bytes = id.len() + p.seq.len() * 8 + 2 * std::mem::size_of::<Pending>();
            let pending = Pending {
                key: p.key.clone(),
                worker: WorkerWithDpRank::new(selected.worker_id, selected.dp_rank),
                seq: p.seq,
                isl: p.isl,
                overlap: selected.overlap.gpu / p.group.block_size,
            };
            lock(&self.cache).insert(id.clone(), pending, bytes, Instant::now());
        }
        Ok(SelectResponse {
            selection_id: req.selection_id.clone(),
            selected,
        })
    }

    fn claim(&self, id: &str) -> Result<()> {
        let st = lock(&self.state);
        Self::check_running(&st)?;
        if st.reservations.contains_key(id) {
            return Err(SelectionError::new(
                ErrorKind::Conflict,
                format!("selection {id} is already reserved or being reserved"),
            ));
        }
        Ok(())
    }

    fn booked(&self, id: &str, key: &GroupKey) {
        lock(&self.state)
            .reservations
            .insert(id.to_owned(), key.clone());
        self.counters.reservations.fetch_add(1, Ordering::Relaxed);
    }

    /// Choose a worker and book the request's load on it.
    ///
    /// # Errors
    /// As [`Self::select`]; [`ErrorKind::Conflict`] for an id already booked.
    pub fn select_and_reserve(&self, req: &PromptRequest) -> Result<ReserveResponse> {
        self.count_err(self.select_and_reserve_inner(req))
    }

    fn select_and_reserve_inner(&self, req: &PromptRequest) -> Result<ReserveResponse> {
        let id = req.selection_id.clone().unwrap_or_else(new_uuid);
        self.claim(&id)?;
        let p = self.prepare(req)?;
        let selected = self.choose(&p, req, Some(&id), None)?;
        self.booked(&id, &p.key);
        let track = req
            .router_config_override
            .as_ref()
            .and_then(|o| o.track_prefill_tokens)
            .unwrap_or(self.options.router.router_track_prefill_tokens);
        Ok(ReserveResponse {
            selection_id: id,
            sequence_hashes: p.seq.iter().map(|h| h.0 as i64).collect(),
            isl_tokens: p.isl,
            track_prefill_tokens: track,
            selected,
        })
    }

    /// Book under `selection_id`: replay its cached selection (no `worker_id`) or book
    /// the prompt on `worker_id` explicitly (dropping any cached selection for the id).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] (no such pending selection / worker),
    /// [`ErrorKind::Conflict`], [`ErrorKind::NotReady`], [`ErrorKind::InvalidRequest`].
    pub fn create_reservation(&self, req: &ReservationRequest) -> Result<ReservationResponse> {
        self.count_err(self.create_reservation_inner(req))
    }

    fn create_reservation_inner(&self, req: &ReservationRequest) -> Result<ReservationResponse> {
        let id = req.selection_id.as_str();
        let prompt = &req.prompt;
        self.claim(id)?;
        let (model, gname) = (prompt.model(), prompt.group());
        let (key, worker) = if let Some(worker_id) = prompt.worker_id {
            let p = self.prepare(prompt)?;
            let rank = prompt.dp_rank.unwrap_or_else(|| {
                lock(&self.state)
                    .workers
                    .get(&worker_id)
                    .map_or(0, |w| w.req.ranks().start)
            });
            let pinned = WorkerWithDpRank::new(worker_id, rank);
            if !p.group.scheduler.workers().contains(&pinned) || p.down.contains(&worker_id) {
                return Err(SelectionError::not_found(format!(
                    "schedulable worker {worker_id} not found for model={model} routing_group={gname}"
                )));
            }
            self.choose(&p, prompt, Some(id), Some(pinned))?;
            lock(&self.cache).take(id, Instant::now());
            (p.key, pinned)
        } else {
            let missing = || {
                SelectionError::not_found(format!(
                    "no pending selection {id} for model={model} routing_group={gname} (expired, already used, or never selected)"
                ))
            };
            let pending = {
                let mut cache = lock(&self.cache);
                let now = Instant::now();
                let p = cache.take(id, now).ok_or_else(missing)?;
                if p.key.0 != model || p.key.1 != gname {
                    // Not this caller's model/group: leave it for the right one.
                    let bytes = id.len() + p.seq.len() * 8 + 2 * std::mem::size_of::<Pending>();
                    cache.insert(id.to_owned(), p, bytes, now);
                    return Err(missing());
                }
                p
            };
            let group = lock(&self.state)
                .groups
                .get(&pending.key)
                .cloned()
                .ok_or_else(|| not_ready(model, gname))?;
            let mut overlaps = FxHashMap::default();
            overlaps.insert(
                pending.worker,
                TierOverlap {
                    device: pending.overlap,
                    ..Default::default()
                },
            );
            group
                .scheduler
                .select(&SchedulingRequest {
                    request_id: Some(id),
                    isl_tokens: pending.isl,
                    seq_hashes: &pending.seq,
                    overlaps: Some(&overlaps),
                    pinned: Some(pending.worker),
                    ..Default::default()
                })
                .map_err(|e| SelectionError::from_router(e, model, gname))?;
            (pending.key, pending.worker)
        };
        self.booked(id, &key);
        Ok(ReservationResponse {
            selection_id: id.to_owned(),
            model_name: key.0,
            routing_group: key.1,
            worker_id: worker.worker_id,
            dp_rank: worker.dp_rank,
            endpoint: self.endpoint_of(worker.worker_id),
        })
    }

    fn reservation_group(&self, id: &str) -> Result<Arc<Group>> {
        let st = lock(&self.state);
        st.reservations
            .get(id)
            .and_then(|k| st.groups.get(k).cloned())
            .ok_or_else(|| SelectionError::not_found(format!("reservation {id} not found")))
    }

    fn on_reservation(
        &self,
        id: &str,
        f: impl FnOnce(&Scheduler) -> dynamo_kv_router::Result<()>,
    ) -> Result<()> {
        let g = self.reservation_group(id)?;
        f(&g.scheduler)
            .map_err(|_| SelectionError::not_found(format!("reservation {id} not found")))
    }

    /// The reservation's prefill is done: its prompt tokens stop counting.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`].
    pub fn prefill_complete(&self, id: &str) -> Result<()> {
        self.count_err(self.on_reservation(id, |s| s.mark_prefill_completed(id)))
    }

    /// One more output block for the reservation (counted whatever
    /// `router_track_output_blocks` says, as the reference's service). With
    /// `decay_fraction` (in `[0, 1]`), the blocks held only by this reservation then weigh
    /// that fraction in the worker's decode load (shared blocks keep their weight), as the
    /// reference 1.6.1 does (see `docs/design/selection_service.md`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidRequest`] for a decay outside `[0, 1]`, [`ErrorKind::NotFound`].
    pub fn add_output_block(&self, id: &str, decay_fraction: Option<f64>) -> Result<()> {
        if let Some(d) = decay_fraction
            && !(0.0..=1.0).contains(&d)
        {
            return Err(SelectionError::invalid(
                "decay_fraction must be between 0.0 and 1.0",
            ));
        }
        self.count_err(self.on_reservation(id, |s| s.add_output_block_decayed(id, decay_fraction)))
    }

    /// The reservation finished: release its load.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`].
    pub fn free_reservation(&self, id: &str) -> Result<()> {
        let r = self.on_reservation(id, |s| s.free(id));
        lock(&self.state).reservations.remove(id);
        self.count_err(r)
    }

    fn loads_of(group: &Group, req: &SchedulingRequest<'_>) -> Vec<LoadEntry> {
        group
            .scheduler
            .potential_loads(req)
            .into_iter()
            .map(|l| LoadEntry {
                worker_id: l.worker.worker_id,
                dp_rank: l.worker.dp_rank,
                potential_prefill_tokens: l.potential_prefill_tokens,
                potential_decode_blocks: l.potential_decode_blocks,
                active_requests: l.active_requests,
            })
            .collect()
    }

    /// Current load per model and group.
    pub fn loads(&self, model: Option<&str>, group: Option<&str>) -> Vec<GroupLoads> {
        let groups: Vec<(GroupKey, Arc<Group>)> = {
            let st = lock(&self.state);
            let mut v: Vec<_> = st
                .groups
                .iter()
                .filter(|(k, _)| model.is_none_or(|m| k.0 == m) && group.is_none_or(|g| k.1 == g))
                .map(|(k, g)| (k.clone(), g.clone()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        groups
            .into_iter()
            .map(|(k, g)| GroupLoads {
                loads: Self::loads_of(&g, &SchedulingRequest::default()),
                model_name: k.0,
                routing_group: k.1,
                pending_count: 0,
                pending_isl_tokens: 0,
            })
            .collect()
    }

    /// Load of every rank if it received the prompt (nothing is booked).
    ///
    /// # Errors
    /// As [`Self::select`].
    pub fn potential_loads(&self, req: &PromptRequest) -> Result<Vec<LoadEntry>> {
        let p = self.count_err(self.prepare(req))?;
        let overlaps = Self::overlaps(&p);
        Ok(Self::loads_of(
            &p.group,
            &SchedulingRequest {
                isl_tokens: p.isl,
                seq_hashes: &p.seq,
                overlaps: Some(&overlaps),
                overrides: req.router_config_override.as_ref(),
                ..Default::default()
            },
        ))
    }

    /// Cached prefix of the prompt on every rank.
    ///
    /// # Errors
    /// As [`Self::select`].
    pub fn overlap_scores(&self, req: &PromptRequest) -> Result<OverlapResponse> {
        let p = self.count_err(self.prepare(req))?;
        let overlaps = Self::overlaps(&p);
        let workers = p
            .group
            .scheduler
            .workers()
            .into_iter()
            .map(|w| WorkerOverlap {
                worker_id: w.worker_id,
                dp_rank: w.dp_rank,
                device_blocks: overlaps.get(&w).map_or(0, |o| o.device),
                // Device blocks are reachable from the lower tiers too (as the reference
                // reports them); offloaded-only blocks are not indexed.
                host_pinned_blocks: overlaps.get(&w).map_or(0, |o| o.device),
                disk_blocks: overlaps.get(&w).map_or(0, |o| o.device),
                host_pinned_extension_blocks: 0,
                disk_extension_blocks: 0,
                shared_beyond_device_blocks: None,
            })
            .collect();
        Ok(OverlapResponse {
            block_size: p.group.block_size,
            num_blocks: p.local.len(),
            workers,
            shared_cache: SharedCache::default(),
        })
    }

    /// Every group's index as events, keyed `"model:group"` (the `/dump` shape).
    pub fn dump(&self) -> BTreeMap<String, GroupDump> {
        let st = lock(&self.state);
        st.groups
            .iter()
            .map(|(k, g)| {
                (
                    format!("{}:{}", k.0, k.1),
                    GroupDump {
                        block_size: g.block_size,
                        events: g.tree.dump_events(),
                    },
                )
            })
            .collect()
    }

    /// Stop listeners and refuse further selections. Idempotent.
    pub fn shutdown(&self) {
        lock(&self.state).shut_down = true;
        self.stop.cancel();
    }

    /// Whether [`Self::shutdown`] ran.
    pub fn is_shut_down(&self) -> bool {
        lock(&self.state).shut_down
    }
}

impl Drop for SelectionService {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One group in `/dump`.
#[derive(Debug, Clone, Serialize)]
pub struct GroupDump {
    /// Tokens per block.
    pub block_size: u32,
    /// The index as stored events.
    pub events: Vec<RouterEvent>,
}

mod env;
mod introspect;
mod sync;

pub use env::{router_config_from, router_config_from_env, router_env_vars};
pub use introspect::{ListenerView, RankMatches};
pub use sync::{DumpLoad, PeerDump};
