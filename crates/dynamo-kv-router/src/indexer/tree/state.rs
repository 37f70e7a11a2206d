//! The run tree's data: [`RadixTree`]'s fields and the records they hold (runs, rank
//! slots, the free-id lists), with the id markers [`NIL`] and [`FREE`].
//!
//! Only definitions live here (and the key mixing that the tables' layout is defined by);
//! the tree's behaviour is in the files that import this one (`mod.rs`: events and
//! queries; `free_ids.rs`: block-id allocation; `dump.rs`; `invariants.rs`). `mod.rs`
//! calls into `free_ids.rs`, so with the struct in `mod.rs` each of the two would need the
//! other. Hence the `pub(super)` fields: visible to the `tree` module and the files under
//! it only.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use smallvec::SmallVec;

use super::arena::Arena;
use super::ext_table::{ExtTable, tag_of};
use crate::protocols::WorkerWithDpRank;

/// "No run / no block / the root".
pub(super) const NIL: u32 = u32::MAX;

/// `run_of` of an id in a free range (no run has this id: see `take_run_slot`).
pub(super) const FREE: u32 = NIL - 1;

/// The child table's tag of the run under `parent` whose first block is `local`.
#[inline]
pub(super) fn child_tag(parent: u32, local: u64) -> u32 {
    tag_of(mix(
        local ^ u64::from(parent).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    ))
}

/// Counters of event outcomes (the reference's `kv_cache_events_applied{status}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounters {
    /// Events applied without any problem.
    pub applied: u64,
    /// `stored` events rejected because the parent is unknown to the worker rank.
    pub parent_not_found: u64,
    /// Hashes of `removed` events that the worker rank did not hold (skipped).
    pub block_not_found: u64,
    /// `stored` events rejected because they contain their own parent.
    pub invalid_sequence: u64,
}

/// Finalizer of MurmurHash3: a full-avalanche mix of a 64-bit key. Keys are engine hashes
/// (often already random) but tests and some engines use small integers, so they are mixed.
#[inline]
pub(super) fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A run's holders, the first two in the run's record: most runs have one or two (a
/// prefix shared by the whole fleet has many), and a list on the heap was a cache miss
/// after the run's own on every store, removal and query step of such a run. Same size
/// as a `Vec` (24 bytes, with smallvec's `union` layout).
pub(super) type Holders = SmallVec<[(u32, u32); 2]>;

/// A chain of blocks without a branch inside it (see the module docs of [`crate::indexer`]).
#[derive(Clone, Debug)]
pub(super) struct Run {
    /// First block id; the run's blocks are `start..start + len`.
    pub(super) start: u32,
    /// Number of blocks; 0 for a freed run.
    pub(super) len: u32,
    /// Ids reserved for the run: `start..start + cap` (`cap >= len`). A run cut back
    /// keeps its ids (free again in the block arrays, but not in the free ranges) until
    /// it is less than half full, so that evicting a run's blocks one at a time and
    /// storing them again costs no free-range work.
    pub(super) cap: u32,
    /// The run whose last block this one follows (`NIL`: the root).
    pub(super) parent: u32,
    /// The longest holder's length (0: no rank holds any block of the run).
    pub(super) held: u32,
    /// `(worker slot, blocks held from the run's start)`, each length `1..=len`, sorted
    /// by slot.
    pub(super) holders: Holders,
    /// The first child run (`NIL`: none); the others follow through `next`.
    pub(super) kid: u32,
    /// The next child of the same parent (`NIL`: the last).
    pub(super) next: u32,
    /// The previous child of the same parent (`NIL`: the first), so that a child leaves
    /// the list in O(1) (a prefix run can have a child per conversation that shares it).
    pub(super) prev: u32,
}

/// A freed run.
pub(super) const FREED: Run = Run {
    start: 0,
    len: 0,
    cap: 0,
    parent: NIL,
    held: 0,
    holders: Holders::new_const(),
    kid: NIL,
    next: NIL,
    prev: NIL,
};

/// Per-worker-rank bookkeeping.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Slot {
    /// Its residencies.
    pub(super) count: usize,
}

/// Per-block access timestamps for `OverlapScores::frequencies`.
#[derive(Debug)]
pub(super) struct RecentUses {
    pub(super) window: Duration,
    pub(super) uses: Mutex<FxHashMap<u32, VecDeque<Instant>>>,
}

/// The run tree (not synchronized). See the module docs of [`crate::indexer`].
#[derive(Debug)]
pub struct RadixTree {
    /// `tokens_hash` of each block id (at both ends of a free range: its length).
    pub(super) local: Arena<u64>,
    /// The run of each block id (`NIL`: unused, in a run's reserved ids; [`FREE`]: in a
    /// free range).
    pub(super) run_of: Arena<u32>,
    /// The canonical key of each block, while some rank holds it under that key (valid
    /// where its bit in `keyed` is set).
    pub(super) key: Arena<u64>,
    pub(super) keyed: Arena<u64>,
    /// Free block ids: maximal ranges tagged in `run_of` and `local`, listed by size
    /// class (`free_ids.rs`).
    pub(super) free: FreeIds,
    pub(super) live_blocks: usize,
    pub(super) runs: Arena<Run>,
    pub(super) free_runs: Vec<u32>,
    /// `(parent run or NIL, first tokens_hash)` -> run.
    pub(super) children: ExtTable,
    /// Canonical key -> block: a tag table (`ext_table.rs`: 8-byte buckets of block id and
    /// the key's mixed high half, grown incrementally, never rehashed in one event); the
    /// key itself is the block's `key`.
    pub(super) hashes: ExtTable,
    /// `(slot, hash)` -> block, for residencies under another hash than the block's
    /// canonical key.
    pub(super) own: FxHashMap<(u32, u64), u32>,
    /// `(slot, block)` -> how many of the slot's residencies at the block are in `own`.
    pub(super) own_count: FxHashMap<(u32, u32), u32>,
    /// `(slot, block)` pairs held only under hashes of the slot's own.
    pub(super) no_canon: FxHashSet<(u32, u32)>,
    pub(super) slots: Vec<Option<Slot>>,
    pub(super) slot_worker: Vec<WorkerWithDpRank>,
    pub(super) free_slots: Vec<u32>,
    pub(super) slot_of: FxHashMap<WorkerWithDpRank, u32>,
    /// Names the current assignment of slots to ranks (see
    /// [`IndexSlots::epoch`](crate::indexer::IndexSlots::epoch)).
    pub(super) slot_epoch: u64,
    /// Live residencies (`(worker rank, external hash)` pairs).
    pub(super) residencies: usize,
    /// Runs an event may have left with an unheld tail, trimmed at its end.
    pub(super) pending: Vec<u32>,
    /// Where the last holder looked up was in its run's list: an event's blocks are one
    /// rank's, mostly in the same few runs, so this saves most scans of wide lists.
    pub(super) hint: AtomicU32,
    pub(super) recent: Option<RecentUses>,
    pub(super) counters: EventCounters,
}

/// The class stacks of the free block ids (the ranges themselves are in the block arrays;
/// `free_ids.rs` has the scheme and the operations).
#[derive(Debug, Default)]
pub(super) struct FreeIds {
    /// Starts of ranges by size class, possibly stale (see `free_ids.rs`).
    pub(super) classes: Vec<Vec<u32>>,
    /// Entries in `classes`.
    pub(super) listed: usize,
    /// Number of free ranges.
    pub(super) ranges: usize,
    /// The sweep in progress, if any: the stack and position it is at.
    pub(super) sweep: Option<(usize, usize)>,
    /// The current (or last) sweep's number, marked on the ranges it kept (never 0).
    pub(super) pass: u32,
}
