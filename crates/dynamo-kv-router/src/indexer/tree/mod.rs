//! The run tree: one node per unshared run of blocks. See the module docs of
//! [`crate::indexer`] for the layout and the invariants; this file implements them.
//!
//! Three paths carry nearly all the work, each a run at a time where it can:
//! [`RadixTree::store_along`] (a store walking a run whose blocks are already keyed by
//! the event's hashes, or are new), [`RadixTree::remove_canonical`] (a removal without own
//! hashes) and the query walk. Everything else (own hashes, holes, moved hashes) goes
//! through [`RadixTree::add_residency`] and [`RadixTree::release`], block by block.
//!
//! The tree's fields and records are defined in `state.rs`, below every file that adds to
//! its behaviour: this one (events and queries), `free_ids.rs` (block-id allocation, which
//! the events here call), `dump.rs` and `invariants.rs`.

mod arena;
mod dump;
mod ext_table;
mod free_ids;
mod id_set;
mod invariants;
mod state;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};

use self::arena::Arena;
use self::ext_table::{ExtTable, prefetch_read, tag_of};
use self::id_set::IdSet;
use self::state::{FREE, FREED, FreeIds, Holders, NIL, RecentUses, Run, Slot, child_tag, mix};
use super::scores::{IndexSlots, OverlapScores};
use crate::error::{Error, Result};
use crate::hashing::LocalBlockHash;
use crate::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, WorkerWithDpRank,
};

pub use self::state::{EventCounters, RadixTree};

/// Queries whose first run has fewer holders list no index slots
/// (`OverlapScores::index_slots`): for a short list, a scheduler's lookups cost less than
/// the second allocation per query. Tests list them always, so the model checks see them.
const INDEX_SLOTS_MIN: usize = if cfg!(test) { 1 } else { 32 };

impl Run {
    const fn has_kids(&self) -> bool {
        self.kid != NIL
    }

    /// Where `slot` is in the holder list (sorted by slot: a run shared by a fleet has
    /// a thousand holders, and a scan of them at every store and removal on it was most
    /// of the apply with 1,000 workers).
    fn holder(&self, slot: u32) -> Option<usize> {
        if self.holders.len() <= 8 {
            self.holders.iter().position(|h| h.0 == slot)
        } else {
            self.holders.binary_search_by_key(&slot, |h| h.0).ok()
        }
    }

    /// Add `slot`, which does not hold the run, with length `len`.
    fn add_holder(&mut self, slot: u32, len: u32) {
        let at = self.holders.partition_point(|h| h.0 < slot);
        self.holders.insert(at, (slot, len));
    }

    fn length_of(&self, slot: u32) -> u32 {
        self.holder(slot).map_or(0, |i| self.holders[i].1)
    }

    /// After a holder's length fell from `top + 1` (the longest) to `top` or less:
    /// another holder at `top + 1` keeps `held` (found at once where many ranks hold the
    /// whole run: a recount at every eviction was quadratic in the holders of a fleet-wide
    /// run).
    fn shortened(&mut self, top: u32) {
        if !self.holders.iter().any(|h| h.1 > top) {
            self.recount();
        }
    }

    fn recount(&mut self) {
        self.held = self.holders.iter().map(|h| h.1).max().unwrap_or(0);
    }
}

/// How a rank holds a block (see [`RadixTree::find_residency`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Under the block's canonical key.
    Canonical(u32),
    /// Under a hash of its own (listed in `own`).
    Own(u32),
}

impl Held {
    const fn block(self) -> u32 {
        match self {
            Self::Canonical(b) | Self::Own(b) => b,
        }
    }
}

/// Per-thread query scratch: the score per worker slot while a result is assembled (all
/// zero between queries), and the first run's holders.
#[derive(Default)]
struct Scratch {
    score: Vec<u32>,
    first: Vec<u32>,
    path: Vec<(u32, u32)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Default for RadixTree {
    fn default() -> Self {
        Self::new(None)
    }
}

impl RadixTree {
    /// An empty tree. With `expiration`, `find_matches` also reports how often each matched
    /// block was looked up within that window (`OverlapScores::frequencies`).
    pub fn new(expiration: Option<Duration>) -> Self {
        Self {
            local: Arena::new(),
            run_of: Arena::new(),
            key: Arena::new(),
            keyed: Arena::new(),
            free: FreeIds::default(),
            live_blocks: 0,
            runs: Arena::new(),
            free_runs: Vec::new(),
            children: ExtTable::default(),
            hashes: ExtTable::default(),
            own: FxHashMap::default(),
            own_count: FxHashMap::default(),
            no_canon: FxHashSet::default(),
            slots: Vec::new(),
            slot_worker: Vec::new(),
            free_slots: Vec::new(),
            slot_of: FxHashMap::default(),
            slot_epoch: IndexSlots::next_epoch(),
            residencies: 0,
            pending: Vec::new(),
            hint: AtomicU32::new(0),
            recent: expiration.map(|window| RecentUses {
                window,
                uses: Mutex::new(FxHashMap::default()),
            }),
            counters: EventCounters::default(),
        }
    }

    /// Number of blocks (distinct cached prefixes).
    pub const fn node_count(&self) -> usize {
        self.live_blocks
    }

    /// Number of stored `(worker rank, external hash)` pairs.
    pub const fn len(&self) -> usize {
        self.residencies
    }

    /// Whether no worker rank holds any block.
    pub const fn is_empty(&self) -> bool {
        self.residencies == 0
    }

    /// Number of worker ranks that hold at least one block.
    pub fn worker_count(&self) -> usize {
        self.slot_of.len()
    }

    /// Event outcome counters since creation.
    pub const fn counters(&self) -> EventCounters {
        self.counters
    }

    /// Heap bytes reserved by the tree's own structures. Returns to the empty tree's value
    /// once every block is removed.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        // A hashbrown table: a control byte per bucket besides the entry.
        fn map<K, V>(capacity: usize) -> usize {
            capacity * (size_of::<(K, V)>() + 1)
        }
        self.local.heap_bytes()
            + self.run_of.heap_bytes()
            + self.key.heap_bytes()
            + self.keyed.heap_bytes()
            + self.free.heap_bytes()
            + self.runs.heap_bytes()
            + self
                .runs
                .iter()
                .filter(|r| r.holders.spilled())
                .map(|r| r.holders.capacity() * 8)
                .sum::<usize>()
            + self.free_runs.capacity() * 4
            + self.children.heap_bytes()
            + self.hashes.heap_bytes()
            + map::<(u32, u64), u32>(self.own.capacity())
            + map::<(u32, u32), u32>(self.own_count.capacity())
            + map::<(u32, u32), ()>(self.no_canon.capacity())
            + self.slots.capacity() * size_of::<Option<Slot>>()
            + self.slot_worker.capacity() * size_of::<WorkerWithDpRank>()
            + self.free_slots.capacity() * 4
            + map::<WorkerWithDpRank, u32>(self.slot_of.capacity())
            + self.pending.capacity() * 4
    }

    /// Apply one event of `worker_id` (the rank is the event's `dp_rank`).
    ///
    /// # Errors
    /// * [`Error::ParentBlockNotFound`] / [`Error::InvalidBlockSequence`]: a rejected store;
    ///   the tree is unchanged.
    /// * [`Error::BlockNotFound`]: a remove named unknown hashes; they were skipped and the
    ///   known ones removed.
    pub fn apply_event(&mut self, worker_id: u64, event: &KvCacheEvent) -> Result<()> {
        let worker = WorkerWithDpRank::new(worker_id, event.dp_rank);
        let result = match &event.data {
            KvCacheEventData::Stored(data) => self.store(worker, data),
            KvCacheEventData::Removed(data) => {
                self.remove_each(worker, data.block_hashes.iter().map(|h| h.0))
            }
            KvCacheEventData::Cleared => {
                self.clear_rank(worker);
                Ok(())
            }
        };
        match &result {
            Ok(()) => self.counters.applied += 1,
            Err(Error::ParentBlockNotFound { .. }) => self.counters.parent_not_found += 1,
            Err(Error::InvalidBlockSequence) => self.counters.invalid_sequence += 1,
            Err(Error::BlockNotFound { missing }) => {
                self.counters.block_not_found += missing.len() as u64;
            }
            Err(_) => {}
        }
        result
    }

    /// Store a chain of blocks for `worker` under `data.parent_hash`.
    ///
    /// # Errors
    /// [`Error::ParentBlockNotFound`], [`Error::InvalidBlockSequence`]; the tree is unchanged.
    pub fn store(&mut self, worker: WorkerWithDpRank, data: &KvCacheStoreData) -> Result<()> {
        self.store_blocks(worker, data.parent_hash, &data.blocks)
    }

    /// [`Self::store`] with the parts of the event passed separately.
    ///
    /// # Errors
    /// See [`Self::store`].
    pub fn store_blocks(
        &mut self,
        worker: WorkerWithDpRank,
        parent_hash: Option<ExternalSequenceBlockHash>,
        blocks: &[KvCacheStoredBlockData],
    ) -> Result<()> {
        if let Some(p) = parent_hash
            && blocks.iter().any(|b| b.block_hash == p)
        {
            return Err(Error::InvalidBlockSequence);
        }
        let slot = self.slot_of.get(&worker).copied();
        // The block the next one hangs under (`NIL`: the root).
        let mut cursor = match parent_hash {
            None => NIL,
            Some(p) => match slot.and_then(|s| self.find_residency(s, p.0)) {
                Some(held) => held.block(),
                None => {
                    return Err(Error::ParentBlockNotFound { parent_hash: p.0 });
                }
            },
        };
        if blocks.is_empty() {
            return Ok(());
        }
        let slot = slot.unwrap_or_else(|| self.slot_for(worker));
        // An event's `hashes` buckets are asked for before its probes, so that their
        // cache misses overlap, at every size: from 100k blocks up the table (2 MiB and
        // more) is mostly out of the core's caches; below, the hint costs a few
        // instructions a block (apply at 100k 35 -> 31.5 ns/block, 1M 51 -> 48.5, round
        // 20). Only blocks new to the tree probe, but which ones is known only on the way.
        self.hashes
            .prefetch_all(blocks.iter().map(|b| tag_of(mix(b.block_hash.0))));
        let mut i = 0;
        while i < blocks.len() {
            let b = self.descend(cursor, &blocks[i..]);
            match self.store_along(slot, b, &blocks[i..]) {
                0 => {
                    self.add_residency(slot, blocks[i].block_hash.0, b);
                    cursor = b;
                    i += 1;
                }
                k => {
                    cursor = b + k as u32 - 1;
                    i += k;
                }
            }
        }
        self.trim_pending();
        Ok(())
    }

    /// Remove `hashes` from `worker`'s blocks (a `removed` event).
    ///
    /// # Errors
    /// [`Error::BlockNotFound`] naming the hashes the rank did not hold (skipped; the rest
    /// are removed).
    pub fn remove(&mut self, worker: WorkerWithDpRank, hashes: &[u64]) -> Result<()> {
        self.remove_each(worker, hashes.iter().copied())
    }

    /// [`Self::remove`] over any (cloneable) sequence of hashes: an event's
    /// `ExternalSequenceBlockHash`es are read in place (collecting them into a `Vec` first
    /// was an allocation per `removed` event, ~7 % of the apply at 100k blocks).
    fn remove_each(
        &mut self,
        worker: WorkerWithDpRank,
        hashes: impl Iterator<Item = u64> + Clone,
    ) -> Result<()> {
        let Some(&slot) = self.slot_of.get(&worker) else {
            let missing: Vec<u64> = hashes.collect();
            return if missing.is_empty() {
                Ok(())
            } else {
                Err(Error::BlockNotFound { missing })
            };
        };
        // (As in `store_blocks`.)
        self.hashes
            .prefetch_all(hashes.clone().map(|h| tag_of(mix(h))));
        let mut missing = Vec::new();
        let mut hashes = hashes.peekable();
        while let Some(h) = hashes.next() {
            if self.own.is_empty() && self.no_canon.is_empty() {
                if !self.remove_canonical(slot, h, &mut hashes) {
                    missing.push(h);
                }
                continue;
            }
            match self.find_residency(slot, h) {
                Some(held) => self.release(slot, h, held),
                None => missing.push(h),
            }
        }
        self.trim_pending();
        self.free_slot_if_empty(slot);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::BlockNotFound { missing })
        }
    }

    /// Drop every block of one worker rank (a `cleared` event): a pass over the runs.
    pub fn clear_rank(&mut self, worker: WorkerWithDpRank) {
        if let Some(&slot) = self.slot_of.get(&worker) {
            self.clear_slots(&[slot]);
        }
    }

    /// Drop every block of every dp rank of `worker_id`, all ranks in one pass.
    pub fn remove_worker(&mut self, worker_id: u64) {
        let slots: Vec<u32> = self
            .slot_of
            .iter()
            .filter(|(w, _)| w.worker_id == worker_id)
            .map(|(_, &slot)| slot)
            .collect();
        self.clear_slots(&slots);
    }

    /// Drop everything.
    pub fn clear(&mut self) {
        let recent = self.recent.take();
        let counters = self.counters;
        *self = Self::new(recent.map(|r| r.window));
        self.counters = counters;
    }

    /// Per-worker-rank length of the longest prefix of `query` it holds; with
    /// `early_exit`, the walk stops after the first depth at which exactly one rank is still
    /// matching (that rank then scores the depth reached). See
    /// [`super::RadixTree::find_matches`].
    pub fn find_matches(&self, query: &[LocalBlockHash], early_exit: bool) -> OverlapScores {
        let now = self.recent.as_ref().map(|_| Instant::now());
        self.walk(query, early_exit, now)
    }

    /// [`Self::find_matches`] with an explicit clock (for frequencies).
    pub fn find_matches_at(
        &self,
        query: &[LocalBlockHash],
        early_exit: bool,
        now: Instant,
    ) -> OverlapScores {
        self.walk(query, early_exit, Some(now))
    }

    // ----- the query walk ----------------------------------------------------------------

    fn walk(
        &self,
        query: &[LocalBlockHash],
        early_exit: bool,
        now: Option<Instant>,
    ) -> OverlapScores {
        let mut out = OverlapScores::default();
        let Some(run0) = query.first().and_then(|q| self.child(NIL, q.0)) else {
            return out;
        };
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let Scratch { score, first, path } = &mut *scratch;
            if score.len() < self.slots.len() {
                score.resize(self.slots.len(), 0);
            }
            first.clear();
            path.clear();
            // Ranks with `score == depth` hold every block so far (a rank that left scored
            // less: it stopped inside a run it did not hold whole).
            let mut depth = 0u32;
            let mut run = run0;
            let mut i = 0usize;
            loop {
                let r = &self.runs[run as usize];
                // Where the walk goes next if the run matches whole: its table bucket
                // loads while the run's blocks and holders are compared.
                if let Some(q) = query.get(i + r.len as usize) {
                    self.children.prefetch(child_tag(run, q.0));
                }
                // A list of more than two holders is its own allocation: its miss overlaps
                // the compare (two or fewer are in the run's record, already loaded).
                // (A spilled list keeps its allocation when it empties.)
                if r.holders.spilled()
                    && let Some(h) = r.holders.first()
                {
                    prefetch_read(h);
                }
                let m = self.matching(r.start, r.len, &query[i..]);
                let mut going_on = 0usize;
                if depth == 0 {
                    for &(slot, len) in &r.holders {
                        first.push(slot);
                        score[slot as usize] = len.min(m);
                        going_on += usize::from(len == r.len);
                    }
                } else {
                    for &(slot, len) in &r.holders {
                        let s = &mut score[slot as usize];
                        if *s == depth {
                            *s = depth + len.min(m);
                            going_on += usize::from(len == r.len);
                        }
                    }
                }
                path.push((r.start, m));
                depth += m;
                i += m as usize;
                if m < r.len || going_on == 0 || (early_exit && going_on == 1) {
                    break;
                }
                let Some(next) = query.get(i).and_then(|q| self.child(run, q.0)) else {
                    break;
                };
                run = next;
            }
            if early_exit {
                // The first depth at which one rank alone still matches ends the walk: the
                // best rank scores one more than the second best, when it leads alone.
                let (mut top, mut second) = (0u32, 0u32);
                for &slot in first.iter() {
                    let s = score[slot as usize];
                    if s > top {
                        second = top;
                        top = s;
                    } else if s > second {
                        second = s;
                    }
                }
                if top > second {
                    for &slot in first.iter() {
                        let s = &mut score[slot as usize];
                        *s = (*s).min(second + 1);
                    }
                }
            }
            let reached = first
                .iter()
                .map(|&slot| score[slot as usize])
                .max()
                .unwrap_or(0);
            if let (Some(recent), Some(now)) = (self.recent.as_ref(), now) {
                let mut uses = recent.uses.lock();
                let mut left = reached;
                for &(start, m) in path.iter() {
                    for b in start..start + m.min(left) {
                        let q = uses.entry(b).or_default();
                        while q
                            .front()
                            .is_some_and(|&t| now.duration_since(t) > recent.window)
                        {
                            q.pop_front();
                        }
                        if !q.is_empty() {
                            out.frequencies.push(q.len());
                        }
                        q.push_back(now);
                    }
                    left = left.saturating_sub(m);
                }
            }
            let list_slots = first.len() >= INDEX_SLOTS_MIN;
            out.scores.reserve(first.len());
            if list_slots {
                out.index_slots.slots.reserve(first.len());
                out.index_slots.epoch = self.slot_epoch;
            }
            for &slot in first.iter() {
                let d = std::mem::take(&mut score[slot as usize]);
                out.scores.push((self.slot_worker[slot as usize], d));
                if list_slots {
                    out.index_slots.slots.push(slot);
                }
            }
        });
        out
    }

    // ----- residencies -------------------------------------------------------------------

    /// The common case of a store, a run at a time: the blocks of `rest` from block `b` on
    /// along `b`'s run, for as long as each is the next block of the chain and already
    /// keyed by its hash (the rank then holds it under that hash or not at all) or unkeyed
    /// with its hash free (the rank holds that hash nowhere, and it becomes the block's
    /// key). The rank's length in the run is raised once. Returns how many blocks it
    /// stored; 0 leaves `rest[0]` to [`Self::add_residency`] (own hashes exist, or the
    /// rank would hold `b` without the block before it).
    fn store_along(&mut self, slot: u32, b: u32, rest: &[KvCacheStoredBlockData]) -> usize {
        if !self.own.is_empty() || !self.no_canon.is_empty() {
            return 0;
        }
        let run = self.run_of[b as usize];
        let r = &self.runs[run as usize];
        let (start, end) = (r.start, r.start + r.len);
        let o = b - start;
        let at = self.holder_index(r, slot);
        let have = at.map_or(0, |i| r.holders[i].1);
        if have < o {
            return 0;
        }
        let mut k = 0usize;
        for (id, blk) in (b..end).zip(rest) {
            if self.local[id as usize] != blk.tokens_hash.0 {
                break;
            }
            let h = blk.block_hash.0;
            match self.key_at(id) {
                Some(key) if key == h => {}
                Some(_) => break,
                // Unkeyed: no rank holds it (with no own hashes, every holder is
                // canonical).
                None if self.key_if_free(id, h) => {}
                None => break,
            }
            k += 1;
        }
        if k == 0 {
            return 0;
        }
        let reach = o + k as u32;
        if reach > have {
            let r = &mut self.runs[run as usize];
            match at {
                Some(i) => r.holders[i].1 = reach,
                None => r.add_holder(slot, reach),
            }
            r.held = r.held.max(reach);
            let added = (reach - have) as usize;
            self.residencies += added;
            if let Some(s) = self.slots[slot as usize].as_mut() {
                s.count += added;
            }
        }
        k
    }

    /// The child run of `parent` (`NIL`: the root) whose first block is `local`.
    #[inline]
    fn child(&self, parent: u32, local: u64) -> Option<u32> {
        self.children
            .find(child_tag(parent, local), |k| {
                let r = &self.runs[k as usize];
                r.parent == parent && self.local[r.start as usize] == local
            })
            .map(|i| self.children.get(i))
    }

    /// Take run `kid` out of `children`, where it is listed under `(parent, local)`.
    fn forget_child(&mut self, parent: u32, local: u64, kid: u32) {
        self.children.remove_entry(child_tag(parent, local), kid);
    }

    /// How many leading hashes of `query` equal the `len` blocks' from block `start` on
    /// (a chunk of the arena at a time).
    #[inline]
    fn matching(&self, start: u32, len: u32, query: &[LocalBlockHash]) -> u32 {
        let want = (len as usize).min(query.len());
        let mut m = 0;
        while m < want {
            let piece = self.local.tail(start as usize + m);
            let piece = &piece[..piece.len().min(want - m)];
            let k = piece
                .iter()
                .zip(&query[m..])
                .take_while(|(b, q)| **b == q.0)
                .count();
            m += k;
            if k < piece.len() {
                break;
            }
        }
        m as u32
    }

    /// The canonical key of block `b`, if it has one.
    #[inline]
    fn key_at(&self, b: u32) -> Option<u64> {
        let keyed = self.keyed[b as usize / 64] >> (b % 64) & 1 != 0;
        keyed.then(|| self.key[b as usize])
    }

    /// The block whose canonical key is `h`.
    #[inline]
    fn block_of_key(&self, h: u64) -> Option<u32> {
        self.hashes
            .find(tag_of(mix(h)), |b| self.key[b as usize] == h)
            .map(|i| self.hashes.get(i))
    }

    /// Make `h` the key of unkeyed block `b` when no block has that key; returns whether
    /// it did (one probe either way).
    fn key_if_free(&mut self, b: u32, h: u64) -> bool {
        let tag = tag_of(mix(h));
        match self
            .hashes
            .find_or_vacant(tag, |x| self.key[x as usize] == h)
        {
            Ok(_) => false,
            Err(vacant) => {
                self.hashes.insert_vacant(vacant, tag, b);
                self.key[b as usize] = h;
                self.keyed[b as usize / 64] |= 1 << (b % 64);
                true
            }
        }
    }

    /// Drop block `b`'s key (its last canonical residency went).
    fn unkey(&mut self, b: u32) {
        let h = self.key[b as usize];
        self.hashes.remove_entry(tag_of(mix(h)), b);
        self.keyed[b as usize / 64] &= !(1 << (b % 64));
    }

    /// Where `slot` is in `run`'s holder list (the hint first).
    #[inline]
    fn holder_index(&self, run: &Run, slot: u32) -> Option<usize> {
        let hint = self.hint.load(Ordering::Relaxed) as usize;
        if run.holders.get(hint).is_some_and(|h| h.0 == slot) {
            return Some(hint);
        }
        let i = run.holder(slot)?;
        self.hint.store(i as u32, Ordering::Relaxed);
        Some(i)
    }

    /// Whether `slot` holds block `b` (under any hash).
    fn covers(&self, slot: u32, b: u32) -> bool {
        let r = &self.runs[self.run_of[b as usize] as usize];
        self.holder_index(r, slot)
            .is_some_and(|i| r.holders[i].1 > b - r.start)
    }

    /// The residency of `slot` under external hash `h`.
    fn find_residency(&self, slot: u32, h: u64) -> Option<Held> {
        if let Some(b) = self.block_of_key(h)
            && self.covers(slot, b)
            && (self.no_canon.is_empty() || !self.no_canon.contains(&(slot, b)))
        {
            return Some(Held::Canonical(b));
        }
        if self.own.is_empty() {
            return None;
        }
        self.own.get(&(slot, h)).map(|&b| Held::Own(b))
    }

    /// Whether a rank other than `except` holds block `b` under its canonical key.
    /// (Called where `except` no longer holds `b` canonically: without `no_canon` entries
    /// that is whether the run's longest holder reaches `b`.)
    fn other_canonical(&self, b: u32, except: u32) -> bool {
        let r = &self.runs[self.run_of[b as usize] as usize];
        let o = b - r.start;
        if self.no_canon.is_empty() {
            debug_assert!(except == NIL || r.length_of(except) <= o);
            return r.held > o;
        }
        r.holders.iter().any(|&(s, len)| {
            s != except && len > o && (self.no_canon.is_empty() || !self.no_canon.contains(&(s, b)))
        })
    }

    /// Give `slot` a residency under `h` at block `b` (the newest store of a hash wins:
    /// the rank's residency under `h` elsewhere goes first).
    fn add_residency(&mut self, slot: u32, h: u64, b: u32) {
        if self.key_at(b) == Some(h) {
            // The common case of a block already in the tree: `hashes` maps `h` here, so
            // the rank's residency under `h` is here or in `own`, known without a probe.
            let covered = self.covers(slot, b);
            if covered && (self.no_canon.is_empty() || !self.no_canon.contains(&(slot, b))) {
                return;
            }
            if !self.own.is_empty()
                && let Some(&elsewhere) = self.own.get(&(slot, h))
            {
                if elsewhere == b {
                    return;
                }
                self.release(slot, h, Held::Own(elsewhere));
            }
            if self.key_at(b) == Some(h) {
                if self.covers(slot, b) {
                    self.no_canon.remove(&(slot, b));
                } else {
                    self.cover(slot, b);
                }
                self.count_residency(slot);
                return;
            }
            // (The release took the block's key: on as for any other block.)
        }
        match self.find_residency(slot, h) {
            Some(held) if held.block() == b => return,
            Some(held) => self.release(slot, h, held),
            None => {}
        }
        let covered = self.covers(slot, b);
        let canonical = match self.key_at(b) {
            Some(k) => k == h,
            None => self.key_if_free(b, h),
        };
        if canonical {
            if covered {
                // It held the block under hashes of its own only.
                self.no_canon.remove(&(slot, b));
            } else {
                self.cover(slot, b);
            }
        } else {
            self.own.insert((slot, h), b);
            *self.own_count.entry((slot, b)).or_default() += 1;
            if !covered {
                self.cover(slot, b);
                self.no_canon.insert((slot, b));
            }
        }
        self.count_residency(slot);
    }

    fn count_residency(&mut self, slot: u32) {
        self.residencies += 1;
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.count += 1;
        }
    }

    /// [`Self::remove`]'s common case, without own hashes: `slot`'s residency under `h`
    /// is the canonical one of `h`'s block or none. Returns whether it had one.
    ///
    /// An engine evicts a chain from its end, so the hashes after `h` in the event are
    /// mostly the keys of the blocks before `h`'s in the same run: each of those that is
    /// (the block's key read from the arena, next to the last one's) is taken from `rest`
    /// and removed here without a probe of `hashes`, the rank's length cut once for all
    /// of them, and a probe comparing handles only for the blocks whose keys go. (With a
    /// probe and a cut per hash, removals took 166M of the apply's 297M instructions at
    /// 100k blocks in the scale bench; walking, 95M of 227M. Round 21.)
    fn remove_canonical(
        &mut self,
        slot: u32,
        h: u64,
        rest: &mut std::iter::Peekable<impl Iterator<Item = u64>>,
    ) -> bool {
        let tag = tag_of(mix(h));
        let Some(at) = self.hashes.find(tag, |b| self.key[b as usize] == h) else {
            return false;
        };
        let b = self.hashes.get(at);
        let run = self.run_of[b as usize];
        let r = &self.runs[run as usize];
        let (start, top) = (r.start, b - r.start);
        let Some(i) = self.holder_index(r, slot).filter(|&i| r.holders[i].1 > top) else {
            return false;
        };
        let len = r.holders[i].1;
        // The walk down the run: the rank keeps `o` blocks of it. Every block it holds is
        // keyed (all holders are canonical), so only the keys are compared, over the
        // slice of ids below `b` in its chunk (a walk that reaches the chunk's start
        // stops there; the next hash then takes the probe).
        let mut o = top;
        let below = self.key.before(b as usize);
        let mut keys = below[below.len().saturating_sub(top as usize)..]
            .iter()
            .rev();
        while let (Some(&next), Some(&key)) = (rest.peek(), keys.next()) {
            debug_assert_eq!(self.key_at(start + o - 1), Some(key));
            if key != next {
                break;
            }
            rest.next();
            o -= 1;
        }
        let held = self.cut_holder(run, i, o, top, len);
        // Every holder is canonical: a block keeps its key while one reaches it. The
        // first block's entry goes by its index before any other entry moves.
        if held <= top {
            self.hashes.remove_at(at);
            self.keyed[b as usize / 64] &= !(1 << (b % 64));
            for x in held..top {
                self.unkey(start + x);
            }
        }
        let removed = (top - o + 1) as usize;
        self.residencies -= removed;
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.count -= removed;
        }
        true
    }

    /// Drop `slot`'s residency `held` under `h`.
    fn release(&mut self, slot: u32, h: u64, held: Held) {
        match held {
            Held::Canonical(b) => {
                if self.own_count.contains_key(&(slot, b)) {
                    self.no_canon.insert((slot, b));
                } else {
                    self.uncover(slot, b);
                }
                if !self.other_canonical(b, slot) {
                    self.unkey(b);
                }
            }
            Held::Own(b) => {
                self.own.remove(&(slot, h));
                let n = self
                    .own_count
                    .get_mut(&(slot, b))
                    .expect("own residency counted");
                *n -= 1;
                if *n == 0 {
                    self.own_count.remove(&(slot, b));
                    if self.no_canon.remove(&(slot, b)) {
                        self.uncover(slot, b);
                    }
                }
            }
        }
        self.residencies -= 1;
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.count -= 1;
        }
    }

    /// Make `slot` hold block `b`, which it does not, while holding its predecessor.
    fn cover(&mut self, slot: u32, b: u32) {
        let mut run = self.run_of[b as usize];
        let r = &self.runs[run as usize];
        let o = b - r.start;
        let have = self.holder_index(r, slot).map_or(0, |i| r.holders[i].1);
        debug_assert!(have <= o);
        if have < o {
            // A hole before `b` (the rank let go of an earlier block of the run): `b`
            // starts a run of its own.
            run = self.split(run, o);
        }
        let i = self.holder_index(&self.runs[run as usize], slot);
        let r = &mut self.runs[run as usize];
        let o = b - r.start;
        match i {
            Some(i) => r.holders[i].1 = o + 1,
            None => r.add_holder(slot, o + 1),
        }
        r.held = r.held.max(o + 1);
    }

    /// Make `slot` stop holding block `b`.
    fn uncover(&mut self, slot: u32, b: u32) {
        let run = self.run_of[b as usize];
        let r = &self.runs[run as usize];
        let o = b - r.start;
        let i = self
            .holder_index(r, slot)
            .expect("the rank holds the block");
        self.cut_holder(run, i, o, o, r.holders[i].1);
    }

    /// Holder `i` of `run`, of length `len` (more than `top`), lets go of the blocks at
    /// offsets `o..=top`: its length becomes `o`; returns the run's new longest length.
    /// Where it held deeper blocks of the run (a hole), they become a run of their own
    /// first (a split changes lengths in place, never the list's order: `i` stays, and
    /// leaves `hashes` alone). The run is trimmed at the event's end. It is on the path of
    /// nearly every removal: the caller passes the length it already read and gets `held`
    /// back, because each lookup of a run in the arena is a few instructions (written
    /// once per caller, re-reading both, the apply took 5-9 % more instructions, round 19).
    #[inline(always)]
    fn cut_holder(&mut self, run: u32, i: usize, o: u32, top: u32, len: u32) -> u32 {
        if len > top + 1 {
            self.split(run, top + 1);
        }
        let r = &mut self.runs[run as usize];
        if o == 0 {
            r.holders.remove(i);
        } else {
            r.holders[i].1 = o;
        }
        if r.held == top + 1 {
            r.shortened(top);
        }
        let held = r.held;
        if self.pending.last() != Some(&run) {
            self.pending.push(run);
        }
        held
    }

    // ----- structure ---------------------------------------------------------------------

    /// The block for the first of `rest` under block `cursor` (`NIL`: the root), made if
    /// missing (with the rest of the chain after it, consecutive ids where possible).
    fn descend(&mut self, cursor: u32, rest: &[KvCacheStoredBlockData]) -> u32 {
        let local = rest[0].tokens_hash.0;
        if cursor == NIL {
            if let Some(c) = self.child(NIL, local) {
                return self.runs[c as usize].start;
            }
            return self.new_run(NIL, rest);
        }
        let run = self.run_of[cursor as usize];
        let r = &self.runs[run as usize];
        let end = r.start + r.len;
        if cursor + 1 < end {
            if self.local[cursor as usize + 1] == local {
                return cursor + 1;
            }
            // The chain diverges inside the run.
            self.split(run, cursor + 1 - r.start);
            return self.new_run(run, rest);
        }
        if let Some(c) = self.child(run, local) {
            return self.runs[c as usize].start;
        }
        let n = rest.len() as u32;
        let (len, cap) = (r.len, r.cap);
        if !r.has_kids() && (len + n <= cap || self.take_ids_at(r.start + cap, len + n - cap)) {
            // A childless run grows in place.
            self.local
                .write(end as usize, rest.iter().map(|b| b.tokens_hash.0));
            self.run_of.fill(end as usize, rest.len(), run);
            let r = &mut self.runs[run as usize];
            r.len += n;
            r.cap = r.cap.max(r.len);
            self.live_blocks += n as usize;
            self.pending.push(run);
            return end;
        }
        self.new_run(run, rest)
    }

    /// A free slot in `runs` (a freed run's, else a new one), to be filled by the caller.
    fn take_run_slot(&mut self) -> u32 {
        if let Some(id) = self.free_runs.pop() {
            return id;
        }
        // Run ids stay below `FREE` (`NIL` and `FREE` are markers).
        assert!(
            self.runs.len() < FREE as usize,
            "run tree run capacity exceeded"
        );
        self.runs.push(FREED);
        (self.runs.len() - 1) as u32
    }

    /// A new run under `parent` with the blocks of `rest`; returns its first block.
    fn new_run(&mut self, parent: u32, rest: &[KvCacheStoredBlockData]) -> u32 {
        let n = rest.len() as u32;
        let start = self.alloc_ids(n);
        let run = self.take_run_slot();
        self.local
            .write(start as usize, rest.iter().map(|b| b.tokens_hash.0));
        self.run_of.fill(start as usize, rest.len(), run);
        self.runs[run as usize] = Run {
            start,
            len: n,
            cap: n,
            parent,
            held: 0,
            holders: Holders::new(),
            kid: NIL,
            next: NIL,
            prev: NIL,
        };
        self.children
            .insert_new(child_tag(parent, rest[0].tokens_hash.0), run);
        if parent != NIL {
            let first = std::mem::replace(&mut self.runs[parent as usize].kid, run);
            self.runs[run as usize].next = first;
            if first != NIL {
                self.runs[first as usize].prev = run;
            }
        }
        self.live_blocks += n as usize;
        self.pending.push(run);
        start
    }

    /// Split `run` before its offset `at` (`0 < at < len`): the tail keeps its block ids,
    /// the holders' lengths past `at` and the run's children, and becomes the head's only
    /// child. Returns the tail.
    fn split(&mut self, run: u32, at: u32) -> u32 {
        let tail = self.take_run_slot();
        let head = &mut self.runs[run as usize];
        debug_assert!(0 < at && at < head.len);
        let (start, len, cap) = (head.start + at, head.len - at, head.cap - at);
        let mut holders = Holders::new();
        for h in &mut head.holders {
            if h.1 > at {
                holders.push((h.0, h.1 - at));
                h.1 = at;
            }
        }
        head.len = at;
        head.cap = at;
        head.held = head.held.min(at);
        let kids = std::mem::replace(&mut head.kid, tail);
        let mut k = kids;
        while k != NIL {
            let first = self.local[self.runs[k as usize].start as usize];
            self.forget_child(run, first, k);
            self.children.insert_new(child_tag(tail, first), k);
            self.runs[k as usize].parent = tail;
            k = self.runs[k as usize].next;
        }
        self.run_of.fill(start as usize, len as usize, tail);
        let held = holders.iter().map(|h| h.1).max().unwrap_or(0);
        self.runs[tail as usize] = Run {
            start,
            len,
            cap,
            parent: run,
            held,
            holders,
            kid: kids,
            next: NIL,
            prev: NIL,
        };
        self.children
            .insert_new(child_tag(run, self.local[start as usize]), tail);
        // The head may have had an unheld tail waiting for the event's end: it is the
        // tail's now.
        self.pending.push(tail);
        tail
    }

    /// Cut back or free the runs the event touched (see [`Self::trim`]).
    fn trim_pending(&mut self) {
        while let Some(run) = self.pending.pop() {
            self.trim(run);
        }
        if self.live_blocks == 0 {
            self.reset_blocks();
        }
    }

    /// Cut a childless run back to its longest holder's prefix; free it when no rank holds
    /// any of it, and its ancestors in turn.
    fn trim(&mut self, mut run: u32) {
        while run != NIL {
            let r = &self.runs[run as usize];
            if r.len == 0 || r.has_kids() || r.held == r.len {
                return;
            }
            if r.held > 0 {
                let (start, held, len, cap) = (r.start, r.held, r.len, r.cap);
                self.clear_ids(start + held, len - held);
                self.live_blocks -= (len - held) as usize;
                let r = &mut self.runs[run as usize];
                r.len = held;
                if held < cap / 2 {
                    r.cap = held;
                    self.free_ids(start + held, cap - held);
                }
                return;
            }
            let r = std::mem::replace(&mut self.runs[run as usize], FREED);
            self.forget_child(r.parent, self.local[r.start as usize], run);
            if r.parent != NIL {
                self.unlink(r.parent, r.prev, r.next);
            }
            self.clear_ids(r.start, r.len);
            self.live_blocks -= r.len as usize;
            self.free_ids(r.start, r.cap);
            self.free_runs.push(run);
            run = r.parent;
        }
    }

    /// Take a child of `parent` whose neighbours in the list are `prev` and `next` off
    /// the list.
    fn unlink(&mut self, parent: u32, prev: u32, next: u32) {
        if prev == NIL {
            self.runs[parent as usize].kid = next;
        } else {
            self.runs[prev as usize].next = next;
        }
        if next != NIL {
            self.runs[next as usize].prev = prev;
        }
    }

    /// Every table back to its empty size (no block is left).
    fn reset_blocks(&mut self) {
        self.local = Arena::new();
        self.run_of = Arena::new();
        self.key = Arena::new();
        self.keyed = Arena::new();
        self.free = FreeIds::default();
        self.runs = Arena::new();
        self.free_runs = Vec::new();
        self.children = ExtTable::default();
        self.hashes = ExtTable::default();
        self.own = FxHashMap::default();
        self.own_count = FxHashMap::default();
        self.no_canon = FxHashSet::default();
        self.pending = Vec::new();
    }

    // ----- block ids ---------------------------------------------------------------------

    /// Mark ids `start..start + n` (no residency left on them) unused.
    fn clear_ids(&mut self, start: u32, n: u32) {
        debug_assert!((start..start + n).all(|b| self.key_at(b).is_none()));
        self.run_of.fill(start as usize, n as usize, NIL);
        self.local.fill(start as usize, n as usize, 0);
    }

    // ----- ranks -------------------------------------------------------------------------

    fn slot_for(&mut self, worker: WorkerWithDpRank) -> u32 {
        if let Some(&s) = self.slot_of.get(&worker) {
            return s;
        }
        let slot = Slot { count: 0 };
        let id = if let Some(id) = self.free_slots.pop() {
            self.slots[id as usize] = Some(slot);
            self.slot_worker[id as usize] = worker;
            id
        } else {
            let id = self.slots.len() as u32;
            assert!(id < NIL - 1, "run tree worker-rank capacity exceeded");
            self.slots.push(Some(slot));
            self.slot_worker.push(worker);
            id
        };
        self.slot_of.insert(worker, id);
        self.slot_epoch = IndexSlots::next_epoch();
        id
    }

    fn free_slot_if_empty(&mut self, slot: u32) {
        let empty = self.slots[slot as usize]
            .as_ref()
            .is_some_and(|s| s.count == 0);
        if empty {
            self.slots[slot as usize] = None;
            let worker = std::mem::take(&mut self.slot_worker[slot as usize]);
            self.slot_of.remove(&worker);
            self.free_slots.push(slot);
            if self.slot_of.is_empty() {
                self.slots = Vec::new();
                self.slot_worker = Vec::new();
                self.free_slots = Vec::new();
                self.slot_of = FxHashMap::default();
            }
        }
    }

    /// Drop every residency of the worker slots `slots` (distinct, each known): one pass
    /// over the runs, then the slots' own hashes.
    fn clear_slots(&mut self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        let wanted: FxHashSet<u32> = slots.iter().copied().collect();
        // The blocks whose keys go: marked here, and the table filtered once at the end
        // (a probe each would be a cache miss each at 10M blocks).
        let mut unkeyed = IdSet::new(self.local.len());
        let mut any = false;
        for run in 0..self.runs.len() as u32 {
            let r = &mut self.runs[run as usize];
            if r.len == 0 || !r.holders.iter().any(|h| wanted.contains(&h.0)) {
                continue;
            }
            let mut longest = 0;
            r.holders.retain(|&mut (s, len)| {
                let go = wanted.contains(&s);
                if go {
                    longest = longest.max(len);
                }
                !go
            });
            r.recount();
            let start = r.start;
            // Blocks whose canonical residencies were all the slots' leave `hashes`.
            for b in start..start + longest {
                if self.key_at(b).is_some() && !self.other_canonical(b, NIL) {
                    unkeyed.insert(b);
                    any = true;
                    self.keyed[b as usize / 64] &= !(1 << (b % 64));
                }
            }
            self.pending.push(run);
        }
        if any {
            self.hashes.remove_marked(&unkeyed);
        }
        if !self.own.is_empty() {
            self.own.retain(|&(s, _), _| !wanted.contains(&s));
            self.own_count.retain(|&(s, _), _| !wanted.contains(&s));
            self.no_canon.retain(|&(s, _)| !wanted.contains(&s));
        }
        for &s in slots {
            if let Some(slot) = self.slots[s as usize].as_mut() {
                self.residencies -= slot.count;
                slot.count = 0;
            }
        }
        self.trim_pending();
        for &s in slots {
            self.free_slot_if_empty(s);
        }
    }
}
