//! The single-threaded arena radix tree. See the module docs of [`crate::indexer`] for the
//! layout and the invariants; this file implements them.

mod arena;
mod dump;
pub(super) mod ext_table;
mod free_runs;
mod holders;
pub(super) mod id_set;
mod invariants;
mod wide;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use self::arena::Arena;
use self::ext_table::{ExtTable, Vacant, tag_of};
use self::free_runs::{FreeRuns, TAKEN};
use self::holders::{Holder, Holders};
use self::id_set::IdSet;
use self::wide::HolderSet;
use super::{IndexSlots, OverlapScores};
use crate::error::{Error, Result};
use crate::hashing::LocalBlockHash;
use crate::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, WorkerWithDpRank,
};

/// "No node / no slot / no entry".
const NIL: u32 = u32::MAX;
/// The root node: never freed, never in the child table, holds no residency.
const ROOT: u32 = 0;

/// Set in `Cold::slot` when the node has residencies beyond the primary one (their block
/// is `Cold::link`).
const HAS_EXTRAS: u32 = 1 << 31;

/// `meta` bits: number of residencies of the node (low bits) and four flags.
const COUNT_MASK: u32 = (1 << 28) - 1;
/// Some child of the node may be held by a rank that does not hold the node (a rank
/// released it while holding a deeper block); see [`RadixTree::find_matches_at`].
const BROKEN: u32 = 1 << 31;
/// Some rank may hold the node under two external hashes (its count exceeds its ranks).
const DUPS: u32 = 1 << 30;
/// The node is *wide*: it has a [`HolderSet`] in `RadixTree::wide` (exact, O(1) membership).
const WIDE: u32 = 1 << 28;
/// The node (not the root) has explicit children (counted in `RadixTree::kids`): without
/// it, a child that is not the next arena slot does not exist, known from the node's own
/// line without a child-table probe.
const BRANCH: u32 = 1 << 29;
/// A node becomes wide when its holder count exceeds this; narrower nodes answer "does
/// this rank hold it?" by scanning their holder block, so this bounds that scan on the
/// apply path. 64 holders: a scan of 64 block entries is 8 cache lines in order, while a
/// holder set costs one bit per worker slot (125 bytes at 1,000 slots), about a quarter
/// of the 64 residencies' own 8-byte block entries. (Tiny under `cfg(test)`, so that the property
/// tests' handful of ranks exercises both representations.)
const WIDE_MIN: u32 = if cfg!(test) { 3 } else { 64 };
/// A wide node goes back to its block alone when its holder count falls below this (half of
/// [`WIDE_MIN`]: hysteresis, so a count oscillating around the limit does not rebuild the
/// set at every event).
const WIDE_DROP: u32 = if cfg!(test) { 2 } else { 32 };
/// From this many live `(rank, block)` pairs up, a remove's residencies are looked up
/// ahead (see [`RadixTree::warm_residencies`]): below it the tree mostly stays in cache and
/// the extra pass costs more than it saves.
const WARM_MIN: usize = 1 << 18;

/// A block position in the tree: one per distinct `(parent node, tokens_hash)`.
///
/// 28 bytes in two arrays of the same ids: what a query's walk reads of every block (this
/// 16-byte part: content, parent, holder count and flags) and the rest ([`Cold`], 12 bytes:
/// the primary residency and the holder block). A walk along a chain of implicit children
/// therefore reads 16 bytes a block, four blocks a cache line, in address order.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// `tokens_hash` of the block.
    local: u64,
    /// Parent node (`NIL` for the root and for freed nodes).
    parent: u32,
    /// Residency count and the `BROKEN` / `DUPS` / `WIDE` / `BRANCH` flags.
    meta: u32,
}

/// The part of a node that a walk reads only where the holders change.
///
/// The first worker rank that holds the block (its *primary residency*) is stored inline
/// because most blocks are held by one rank; further ranks go to a block of `holders`
/// (contiguous, see `tree/holders.rs`) named here. The child count is not stored: a
/// node's implicit child is the next arena slot, and explicit children are counted in
/// `RadixTree::kids` (only branch points have any; flagged `BRANCH` in `meta`).
///
/// The node keeps the low half of its *canonical key* (the mixed external hash under
/// which its holders hold it, see [`key_of`]); the high half is the tag of the node's
/// entry in `RadixTree::hashes`, so the two halves together are the external hash.
#[derive(Clone, Copy, Debug)]
struct Cold {
    /// Low half of the node's canonical key (meaningless while no residency is under it).
    key: u32,
    /// Worker slot of the primary residency (`| HAS_EXTRAS`), or `NIL` when no rank holds
    /// the block.
    slot: u32,
    /// The node's holder block when `HAS_EXTRAS` is set (its `count - 1` entries).
    link: u32,
}

/// A node's [`Cold`] part before any residency.
const EMPTY_COLD: Cold = Cold {
    key: 0,
    slot: NIL,
    link: NIL,
};

impl Cold {
    #[inline]
    const fn primary(&self) -> u32 {
        if self.slot == NIL {
            NIL
        } else {
            self.slot & !HAS_EXTRAS
        }
    }

    #[inline]
    const fn has_extras(&self) -> bool {
        self.slot != NIL && self.slot & HAS_EXTRAS != 0
    }
}

/// A worker rank known to the tree (its id is in `RadixTree::slot_worker`, under the
/// same slot).
#[derive(Debug)]
struct Slot {
    /// Its residencies.
    count: usize,
}

/// Queries whose first block has fewer holders list no index slots
/// (`OverlapScores::index_slots`): for a short list, a scheduler's lookups cost less than
/// the second allocation per query (a tenth of a small query's time). Tests list them
/// always, so the model checks see them.
const INDEX_SLOTS_MIN: usize = if cfg!(test) { 1 } else { 32 };

/// Per-node access timestamps for `OverlapScores::frequencies`.
#[derive(Debug)]
struct RecentUses {
    window: Duration,
    uses: Mutex<FxHashMap<u32, VecDeque<Instant>>>,
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

/// Inverse of [`mix`]: each step undone in reverse order (`x ^= x >> 33` is its own
/// inverse on 64 bits; the multipliers are odd, so they have inverses modulo 2^64).
#[inline]
const fn unmix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(inverse(0xc4ce_b9fe_1a85_ec53));
    x ^= x >> 33;
    x = x.wrapping_mul(inverse(0xff51_afd7_ed55_8ccd));
    x ^ (x >> 33)
}

/// The inverse of odd `a` modulo 2^64 (Newton's iteration: `a` is its own inverse modulo
/// 8, and each step doubles the correct low bits: 3, 6, 12, 24, 48, 96).
const fn inverse(a: u64) -> u64 {
    let mut x = a;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// The key of a residency's external hash: `hashes` is keyed by its high half ([`tag_of`])
/// and the node keeps its low half ([`key_lo`]); [`unmix`] gives the hash back.
#[inline]
fn key_of(ext: u64) -> u64 {
    mix(ext)
}

#[inline]
const fn key_lo(key: u64) -> u32 {
    key as u32
}

#[inline]
fn child_hash(parent: u32, local: u64) -> u64 {
    mix(local ^ u64::from(parent).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// The explicit child `(parent, local)` in `table`: `roots` for the root's children,
/// `children` for everyone else's.
#[inline]
fn find_child(nodes: &Arena<Node>, table: &ExtTable, parent: u32, local: u64) -> Option<u32> {
    table
        .find(tag_of(child_hash(parent, local)), |id| {
            let n = &nodes[id as usize];
            n.parent == parent && n.local == local
        })
        .map(|i| table.get(i))
}

/// Where an entry of `slot` is among the `len` further holders (block `link`) of the wide
/// `node`, when the slot's position hint names it (see `HolderSet::hint`); `None` leaves
/// the caller to scan.
#[inline]
fn hinted_entry(
    wide: &FxHashMap<u32, HolderSet>,
    holders: &Holders,
    node: u32,
    link: u32,
    len: u32,
    slot: u32,
) -> Option<u32> {
    let j = wide.get(&node)?.hint(slot)?;
    if j >= len {
        return None;
    }
    (holders.get(link, j).slot == slot).then_some(j)
}

/// How a rank holds a block (see [`RadixTree::find_residency`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Under the node's canonical key.
    Canonical(u32),
    /// Under a key of its own (listed in `RadixTree::own`).
    Own(u32),
}

impl Held {
    const fn node(self) -> u32 {
        match self {
            Self::Canonical(n) | Self::Own(n) => n,
        }
    }

    /// The release of this residency, under `key`.
    const fn release(self, key: u64) -> Release {
        match self {
            Self::Canonical(_) => Release::Canonical(key),
            Self::Own(_) => Release::Own(key),
        }
    }
}

/// What a store's probe of `hashes` learnt (see [`RadixTree::probe_residency`]).
#[derive(Clone, Copy, Debug)]
struct Probe {
    /// Where the probe missed (`None` after a hit, which may have stopped it before the
    /// entry of the store's node).
    vacant: Option<Vacant>,
    /// An entry with the store's key names the store's node (known `false` only after a
    /// miss).
    canonical_at_node: bool,
    /// Whether the rank holds the store's node, when the probe had to find out.
    holds_node: Option<bool>,
}

/// Which residency a release takes.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// The one under the node's canonical key `key`.
    Canonical(u64),
    /// The one under `key`, the rank's own.
    Own(u64),
    /// Any (the rank's every block goes: its table entries and own keys are dealt with
    /// by the caller).
    Cleared,
}

/// Per-thread query scratch, reused so that a query allocates only its result.
#[derive(Default)]
struct Scratch {
    /// A stamp per worker slot: slots marked with `stamp` hold the node being checked.
    stamps: Vec<u32>,
    stamp: u32,
    /// Score per worker slot while the result is assembled; all zero between queries.
    by_slot: Vec<u32>,
    /// Ranks still matching; ranks that left with their score; the first block's ranks.
    active: Vec<u32>,
    left: Vec<(u32, u32)>,
    first: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The radix tree indexer (not synchronized; see [`super::SharedRadixTree`]).
#[derive(Debug)]
pub struct RadixTree {
    /// Arenas in chunks (see `tree/arena.rs`): growing one never copies it.
    nodes: Arena<Node>,
    /// The rest of each node (same ids as `nodes`).
    cold: Arena<Cold>,
    free_nodes: FreeRuns,
    /// Holder blocks of the nodes with more than one residency.
    holders: Holders,
    /// Node ids hashed by `(parent, local)`, except implicit children (`id == parent + 1`),
    /// the root and the root's children.
    children: ExtTable,
    /// The root's children (all explicit, even id 1), keyed by `tokens_hash`: a table of
    /// their own (thousands to a few hundred thousand entries, against millions in
    /// `children`), so that every query's first probe, and every store's under the root,
    /// hits a table small enough to stay in cache, and goes there directly.
    roots: ExtTable,
    /// Number of explicit (non-implicit) children of each non-root node that has any (the
    /// nodes flagged `BRANCH`; the root's are never counted).
    kids: FxHashMap<u32, u32>,
    slots: Vec<Option<Slot>>,
    /// The rank of each slot (default when free), apart from `slots` for the query walk:
    /// it reads one per listed rank, hundreds on a large fleet, and a `Slot` spans two
    /// cache lines where this is 16 bytes. The only copy of a slot's rank.
    slot_worker: Vec<WorkerWithDpRank>,
    free_slots: Vec<u32>,
    slot_of: FxHashMap<WorkerWithDpRank, u32>,
    /// Names the current assignment of slots to ranks (see [`IndexSlots::epoch`]): a new
    /// one whenever a slot gets a rank (a freed slot is listed by no query until then).
    slot_epoch: u64,
    /// Holder sets of the nodes flagged `WIDE` (more than [`WIDE_MIN`] holders).
    wide: FxHashMap<u32, HolderSet>,
    /// One entry per node that has residencies under its *canonical key*, keyed by that
    /// key's high half (the node keeps the low half): the residencies of all ranks, found
    /// by hash. An engine's block hash is a hash of the block's token sequence, so every
    /// rank holding a block holds it under the same hash, and one entry serves them all
    /// (per-rank tables held one entry per rank and block: 2.4 a block with 16 workers).
    /// A node's canonical key is the first key a residency brings to it while it has none.
    hashes: ExtTable,
    /// Residencies under another key than their node's canonical one (another salt, a
    /// collision): `(slot, key) -> node`. Rare; empty in the common case, where a lookup
    /// never reaches it.
    own: FxHashMap<(u32, u64), u32>,
    /// The slots of each node's residencies in `own` (once per residency).
    own_slots: FxHashMap<u32, Vec<u32>>,
    /// Live residencies (`(worker rank, block)` pairs).
    residencies: usize,
    recent: Option<RecentUses>,
    counters: EventCounters,
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
            nodes: std::iter::once(Self::root()).collect(),
            cold: std::iter::once(EMPTY_COLD).collect(),
            free_nodes: FreeRuns::default(),
            holders: Holders::default(),
            children: ExtTable::default(),
            roots: ExtTable::default(),
            kids: FxHashMap::default(),
            slots: Vec::new(),
            slot_worker: Vec::new(),
            free_slots: Vec::new(),
            slot_of: FxHashMap::default(),
            slot_epoch: IndexSlots::next_epoch(),
            wide: FxHashMap::default(),
            hashes: ExtTable::default(),
            own: FxHashMap::default(),
            own_slots: FxHashMap::default(),
            residencies: 0,
            recent: expiration.map(|window| RecentUses {
                window,
                uses: Mutex::new(FxHashMap::default()),
            }),
            counters: EventCounters::default(),
        }
    }

    const fn root() -> Node {
        Node {
            local: 0,
            parent: NIL,
            meta: 0,
        }
    }

    /// Number of block nodes (distinct cached prefixes), excluding the root.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - 1 - self.free_nodes.len()
    }

    /// Number of stored `(worker rank, block)` pairs.
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

    /// Heap bytes reserved by the tree's own structures (arenas, hash tables, free lists).
    /// Returns to the empty tree's value once every block is removed.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.nodes.heap_bytes()
            + self.cold.heap_bytes()
            + self.free_nodes.heap_bytes()
            + self.holders.heap_bytes()
            + self.children.heap_bytes()
            + self.roots.heap_bytes()
            + self.kids.capacity() * (size_of::<(u32, u32)>() + 1)
            + self.slots.capacity() * size_of::<Option<Slot>>()
            + self.slot_worker.capacity() * size_of::<WorkerWithDpRank>()
            + self.free_slots.capacity() * 4
            + self.hashes.heap_bytes()
            + self.slot_of.capacity() * (size_of::<(WorkerWithDpRank, u32)>() + 1)
            + self.wide.capacity() * (size_of::<(u32, HolderSet)>() + 1)
            + self.wide.values().map(HolderSet::heap_bytes).sum::<usize>()
            + self.own.capacity() * (size_of::<((u32, u64), u32)>() + 1)
            + self.own_slots.capacity() * (size_of::<(u32, Vec<u32>)>() + 1)
            + self
                .own_slots
                .values()
                .map(|v| v.capacity() * 4)
                .sum::<usize>()
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
            KvCacheEventData::Removed(data) => self.remove(
                worker,
                data.block_hashes
                    .iter()
                    .map(|h| h.0)
                    .collect::<Vec<_>>()
                    .as_slice(),
            ),
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
        // The parent's bucket and the blocks' first: their cache misses overlap the
        // parent's lookup.
        self.warm_lookup(
            parent_hash
                .iter()
                .chain(blocks.iter().map(|b| &b.block_hash))
                .map(|h| h.0),
        );
        // Validate everything before the first mutation: a rejected event changes nothing.
        let mut parent = ROOT;
        if let Some(p) = parent_hash {
            if blocks.iter().any(|b| b.block_hash == p) {
                return Err(Error::InvalidBlockSequence);
            }
            let node = self
                .slot_of
                .get(&worker)
                .and_then(|&slot| self.find_residency(slot, key_of(p.0)));
            match node {
                Some(n) => parent = n.node(),
                None => return Err(Error::ParentBlockNotFound { parent_hash: p.0 }),
            }
        }
        if blocks.is_empty() {
            return Ok(());
        }
        let slot = self.slot_for(worker);
        // Once a block is new, the rest of the chain is too: a node created by this call
        // has no children yet, so its child is created without probing for one.
        let mut fresh = false;
        // Whether the rank is known not to hold `parent`'s children: it did not hold
        // `parent` before this call, and `parent` is not `BROKEN` (children's holders hold
        // it). Spares the duplicate scan of `add_residency` along the chain.
        let mut absent = false;
        // Node ids taken from a free run for the rest of the chain (see `insert_child`):
        // marked taken (`free_runs::TAKEN`), in no run; all used by the end of the chain,
        // whose new blocks are known when the first is created.
        let mut reserved = 0..0;
        for (i, block) in blocks.iter().enumerate() {
            // The chain's new blocks from here on, for a run of ids that fits them all.
            let want = (blocks.len() - i) as u32;
            let child = if fresh {
                self.insert_child(parent, block.tokens_hash.0, want, &mut reserved)
            } else {
                match self.child(parent, block.tokens_hash.0) {
                    Some(c) => c,
                    None => {
                        fresh = true;
                        self.insert_child(parent, block.tokens_hash.0, want, &mut reserved)
                    }
                }
            };
            let known_absent = absent && self.nodes[parent as usize].meta & BROKEN == 0;
            absent = self.set_residency(slot, child, block.block_hash.0, known_absent);
            parent = child;
        }
        debug_assert_eq!(
            reserved.start, reserved.end,
            "reserved node ids left unused"
        );
        Ok(())
    }

    /// Remove blocks of `worker` by external hash. Unknown hashes are skipped.
    ///
    /// # Errors
    /// [`Error::BlockNotFound`] listing the skipped hashes (the others were removed).
    pub fn remove(&mut self, worker: WorkerWithDpRank, hashes: &[u64]) -> Result<()> {
        let Some(&slot) = self.slot_of.get(&worker) else {
            return if hashes.is_empty() {
                Ok(())
            } else {
                Err(Error::BlockNotFound {
                    missing: hashes.to_vec(),
                })
            };
        };
        self.warm_lookup(hashes.iter().copied());
        self.warm_residencies(slot, hashes);
        // The ids this event frees go into free runs at its end, a stretch at a time.
        self.free_nodes.begin_batch();
        let mut missing = Vec::new();
        let mut released = NIL;
        for &h in hashes {
            let key = key_of(h);
            let Some(held) = self.find_residency(slot, key) else {
                missing.push(h);
                continue;
            };
            let node = held.node();
            // Without `DUPS` the rank held `node` once: after this it holds it no more,
            // which the release of its parent (evictions go deepest first) uses instead of
            // scanning.
            let once = self.nodes[node as usize].meta & DUPS == 0;
            self.release_marking(node, slot, held.release(key), true, released);
            released = if once { node } else { NIL };
        }
        self.free_nodes.end_batch(&mut self.nodes, &mut self.cold);
        self.free_slot_if_empty(slot);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::BlockNotFound { missing })
        }
    }

    /// Drop every block of one worker rank (a `cleared` event).
    ///
    /// The tree keeps no index by rank, so this is a pass over every node (see
    /// [`Self::clear_slots`]): tens of milliseconds at 10M blocks, for an event that comes
    /// when a worker leaves or resets its cache.
    pub fn clear_rank(&mut self, worker: WorkerWithDpRank) {
        if let Some(&slot) = self.slot_of.get(&worker) {
            self.clear_slots(&[slot]);
        }
    }

    /// Drop every block of every dp rank of `worker_id` (`clear_all_blocks` /
    /// `remove_worker`; the tree keeps no per-worker state once its blocks are gone), all
    /// ranks in one pass over the tree.
    pub fn remove_worker(&mut self, worker_id: u64) {
        let slots: Vec<u32> = self
            .slot_of
            .iter()
            .filter(|(w, _)| w.worker_id == worker_id)
            .map(|(_, &slot)| slot)
            .collect();
        self.clear_slots(&slots);
    }

    /// Drop every residency of the worker slots `slots` (distinct, each known).
    ///
    /// One pass over the arena releases the slots' residencies as it meets their nodes
    /// (each node, cold part and holder block read once; a pass per rank made removing a
    /// worker of 16 dp ranks sixteen passes), and one pass over `hashes` takes the entries
    /// of the nodes whose residencies under their canonical key were all the slots'.
    fn clear_slots(&mut self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        let mut wanted = IdSet::new(self.slots.len());
        for &s in slots {
            wanted.insert(s);
        }
        // (Never `NIL`: unused holder entries and nodes without a primary are not wanted.)
        let is_wanted = |s: u32| wanted.contains(s);
        // The nodes whose `hashes` entries go: their tags are not known here (a node keeps
        // the low half of its key), and a probe each would be a cache miss each, so they
        // are marked by node id and the table is filtered once at the end.
        let mut last = IdSet::new(self.nodes.len());
        let mut any_last = false;
        // The holder blocks that list one of the slots: the walk reads no other node's
        // block (a random read each, at most nodes). Releases change only the block of the
        // node being released, so the marks stay exact for the nodes ahead.
        let holding = self.holders.blocks_holding(is_wanted);
        // The slots' residencies at the node being visited: `(slot, times)`.
        let mut here: Vec<(u32, u32)> = Vec::new();
        self.free_nodes.begin_batch();
        // Releasing may free the node's ancestors (whatever their ids: an explicit child
        // can have a lower id than its parent), which the walk then skips as freed; and
        // the node count reaching zero resets the arenas, which ends the walk.
        let mut id = 1;
        while (id as usize) < self.nodes.len() {
            let n = self.nodes[id as usize];
            here.clear();
            if n.parent == NIL || n.parent == TAKEN {
                // Freed, or reserved by a store in progress (none during a clear).
            } else if n.meta & WIDE != 0 {
                for &s in slots {
                    let times = self.multiplicity(id, s);
                    if times > 0 {
                        here.push((s, times));
                    }
                }
            } else {
                let c = self.cold[id as usize];
                if is_wanted(c.primary()) {
                    here.push((c.primary(), 1));
                }
                // (`&`: whether a node has further holders is random, a branch on it
                // mispredicted; the marks are rarely set.)
                if c.has_extras() & holding.contains(c.link) {
                    self.holders.scan(c.link, |h| {
                        if is_wanted(h.slot) {
                            match here.iter_mut().find(|(s, _)| *s == h.slot) {
                                Some((_, times)) => *times += 1,
                                None => here.push((h.slot, 1)),
                            }
                        }
                        true
                    });
                }
            }
            if !here.is_empty() {
                // Before the releases: the count still includes the slots' residencies,
                // and `own_slots` their own ones (forgotten below).
                let canonical: u32 = here.iter().map(|&(s, t)| t - self.own_count(id, s)).sum();
                if canonical > 0 && canonical == self.canonical_count(id) {
                    last.insert(id);
                    any_last = true;
                }
                // The slots keep no block, so no child can be held without its parent by
                // one of them.
                for &(s, times) in &here {
                    for _ in 0..times {
                        self.release_marking(id, s, Release::Cleared, false, NIL);
                    }
                }
            }
            id += 1;
        }
        self.free_nodes.end_batch(&mut self.nodes, &mut self.cold);
        if !self.own.is_empty() {
            let theirs: Vec<((u32, u64), u32)> = self
                .own
                .iter()
                .filter(|&(&(s, _), _)| is_wanted(s))
                .map(|(&k, &n)| (k, n))
                .collect();
            for ((slot, key), node) in theirs {
                self.forget_own(node, slot, key);
            }
        }
        if any_last {
            self.hashes.remove_marked(&last);
        }
        for &s in slots {
            self.free_slot_if_empty(s);
        }
    }

    /// Drop everything.
    pub fn clear(&mut self) {
        let recent = self.recent.take();
        let counters = self.counters;
        *self = Self::new(recent.map(|r| r.window));
        self.counters = counters;
    }

    /// Per-worker-rank length of the longest prefix of `query` it holds.
    ///
    /// A rank scores `k` when it holds the blocks at depths `1..=k` of the query path. With
    /// `early_exit` the walk stops after the first depth at which exactly one rank is still
    /// matching; that rank's score is then the depth reached, not its full match.
    pub fn find_matches(&self, query: &[LocalBlockHash], early_exit: bool) -> OverlapScores {
        // The clock is read only when frequencies are tracked (~40 ns a read here).
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

    /// The query walk; `now` is needed only when frequencies are tracked.
    fn walk(
        &self,
        query: &[LocalBlockHash],
        early_exit: bool,
        now: Option<Instant>,
    ) -> OverlapScores {
        let mut out = OverlapScores::default();
        let mut recent = self
            .recent
            .as_ref()
            .zip(now)
            .map(|(r, now)| (r.window, r.uses.lock(), now));
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let Scratch {
                stamps,
                stamp,
                by_slot,
                active,
                left,
                first,
            } = &mut *scratch;
            active.clear();
            left.clear();
            first.clear();
            if stamps.len() < self.slots.len() {
                stamps.resize(self.slots.len(), 0);
                by_slot.resize(self.slots.len(), 0);
            }
            // Every rank in `active` matches the first `depth` blocks.
            let mut depth = 0u32;
            let mut node = ROOT;
            // Without frequencies or early exit, a run of implicit children holding
            // exactly their parent's ranks (see `same_holders`) changes nothing but the
            // depth: a tight loop over the 16-byte nodes, whose loads do not depend on one
            // another, so a cold chain's cache misses overlap.
            let fast = recent.is_none() && !early_exit;
            let mut i = 0;
            loop {
                if fast && depth > 0 {
                    let nodes = &self.nodes;
                    let pm = nodes[node as usize].meta;
                    let count = pm & COUNT_MASK;
                    // Over the rest of the arena chunk as a slice; at its end, on in the
                    // next chunk.
                    let mut more = pm & BROKEN == 0;
                    while more {
                        let run = nodes.tail(node as usize + 1);
                        more = !run.is_empty();
                        // Four nodes (64 bytes) at a time while all four continue the
                        // chain and none is `BROKEN`: their checks are combined without a
                        // branch each, one branch per four blocks (warm, a 100-block
                        // query's time was this loop's, block by block: ~240 -> ~185 ns).
                        // The group where the chain stops, a `BROKEN` node included, goes
                        // through the block-by-block loop below.
                        let rest = query.get(i..).unwrap_or_default();
                        let quads = run
                            .chunks_exact(4)
                            .zip(rest.chunks_exact(4))
                            .zip((node..).step_by(4))
                            .take_while(|&((ns, qs), base)| {
                                ns.iter().zip(qs).zip(base..).fold(true, |ok, ((n, q), p)| {
                                    ok & (n.parent == p)
                                        & (n.local == q.0)
                                        & (n.meta & (BROKEN | DUPS | COUNT_MASK) == count)
                                })
                            })
                            .count();
                        let k = quads * 4;
                        node += k as u32;
                        depth += k as u32;
                        i += k;
                        for n in &run[k..] {
                            if let Some(l) = query.get(i)
                                && n.parent == node
                                && n.local == l.0
                                && n.meta & (DUPS | COUNT_MASK) == count
                            {
                                node += 1;
                                depth += 1;
                                i += 1;
                                if n.meta & BROKEN == 0 {
                                    continue;
                                }
                            }
                            more = false;
                            break;
                        }
                    }
                }
                let Some(local) = query.get(i) else {
                    break;
                };
                i += 1;
                let Some(child) = self.child(node, local.0) else {
                    break;
                };
                if depth == 0 {
                    if let Some(set) = self.holder_set(child) {
                        set.for_each(|slot| active.push(slot));
                    } else {
                        self.for_each_residency(child, |slot| active.push(slot));
                        // A rank holding the block under two hashes is one rank.
                        if self.nodes[child as usize].meta & DUPS != 0 {
                            let mut seen = rustc_hash::FxHashSet::default();
                            active.retain(|&s| seen.insert(s));
                        }
                    }
                    first.extend_from_slice(active);
                } else if !self.same_holders(node, child) {
                    // Ranks that hold `child` go on; the others score `depth`.
                    if let Some(set) = self.holder_set(child) {
                        // A wide node: bit tests instead of a pass over its holder block.
                        active.retain(|&slot| {
                            let keep = set.contains(slot);
                            if !keep {
                                left.push((slot, depth));
                            }
                            keep
                        });
                    } else {
                        *stamp = stamp.wrapping_add(1);
                        if *stamp == 0 {
                            stamps.fill(0);
                            *stamp = 1;
                        }
                        let s = *stamp;
                        self.for_each_residency(child, |slot| stamps[slot as usize] = s);
                        active.retain(|&slot| {
                            let keep = stamps[slot as usize] == s;
                            if !keep {
                                left.push((slot, depth));
                            }
                            keep
                        });
                    }
                }
                if active.is_empty() {
                    break;
                }
                node = child;
                depth += 1;
                if let Some((window, uses, now)) = recent.as_mut() {
                    let now = *now;
                    let q = uses.entry(node).or_default();
                    while q.front().is_some_and(|&t| now.duration_since(t) > *window) {
                        q.pop_front();
                    }
                    if !q.is_empty() {
                        out.frequencies.push(q.len());
                    }
                    q.push_back(now);
                }
                if early_exit && active.len() == 1 {
                    break;
                }
            }
            if depth == 0 {
                return;
            }
            // In the order of the first block's holders, as before the walk was lazy.
            for &(slot, d) in left.iter() {
                by_slot[slot as usize] = d;
            }
            for &slot in active.iter() {
                by_slot[slot as usize] = depth;
            }
            out.scores.reserve(first.len());
            let list_slots = first.len() >= INDEX_SLOTS_MIN;
            if list_slots {
                out.index_slots.slots.reserve(first.len());
                out.index_slots.epoch = self.slot_epoch;
            }
            // Every slot in `first` holds a block, so it has a rank.
            for &slot in first.iter() {
                let d = std::mem::take(&mut by_slot[slot as usize]);
                if d > 0 {
                    out.scores.push((self.slot_worker[slot as usize], d));
                    if list_slots {
                        out.index_slots.slots.push(slot);
                    }
                }
            }
        });
        out
    }

    /// Whether `child` (of `parent`, not the root) is held by exactly the ranks that hold
    /// `parent`, known without looking at the holders: unless `parent` is `BROKEN`, every
    /// holder of a child holds the parent (a rank stores a block only under one it holds),
    /// so equal counts mean equal sets when no rank holds `child` twice (`DUPS`). This is
    /// the common case along a chain, and it makes a query cost one check per block plus
    /// one holder scan per block where the set of holders changes.
    #[inline]
    fn same_holders(&self, parent: u32, child: u32) -> bool {
        let (p, c) = (
            self.nodes[parent as usize].meta,
            self.nodes[child as usize].meta,
        );
        p & BROKEN == 0 && c & DUPS == 0 && c & COUNT_MASK == p & COUNT_MASK
    }

    /// The holder set of `node` when it is wide.
    #[inline]
    fn holder_set(&self, node: u32) -> Option<&HolderSet> {
        if self.nodes[node as usize].meta & WIDE != 0 {
            self.wide.get(&node)
        } else {
            None
        }
    }

    // ----- internals ---------------------------------------------------------------------

    /// Whether `id` is an *implicit* child: allocated right after its parent, and therefore
    /// found without the child table (see the module docs). The root has none: its
    /// children are all in `roots`.
    #[inline]
    const fn is_implicit(id: u32, parent: u32) -> bool {
        parent != ROOT && id == parent.wrapping_add(1)
    }

    #[inline]
    fn child(&self, parent: u32, local: u64) -> Option<u32> {
        if parent == ROOT {
            return find_child(&self.nodes, &self.roots, ROOT, local);
        }
        let next = parent as usize + 1;
        if let Some(n) = self.nodes.get(next)
            && n.parent == parent
            && n.local == local
        {
            return Some(next as u32);
        }
        if self.nodes[parent as usize].meta & BRANCH == 0 {
            return None;
        }
        find_child(&self.nodes, &self.children, parent, local)
    }

    /// Create the child `(parent, local)`, which must not exist; `want` is the number of
    /// new blocks of the chain from this one on (they will take the ids after it).
    /// `reserved`: ids taken for this chain by an earlier call (the next one is used when
    /// it is the slot after `parent`), refilled here when a free run is taken.
    fn insert_child(
        &mut self,
        parent: u32,
        local: u64,
        want: u32,
        reserved: &mut std::ops::Range<u32>,
    ) -> u32 {
        let node = Node {
            local,
            parent,
            meta: 0,
        };
        // The slot right after the parent makes the node an implicit child (no child-table
        // entry): the end of the arena, or a free id right after the parent (the next id
        // of the run the parent came from). Otherwise the start of a free run long enough
        // for the rest of the chain, which then continues in it (or the end of the arena:
        // see `FreeRuns::pop`).
        //
        // Free ids are taken for the whole rest of the chain at once (`reserved`), so the
        // free runs are relinked once a chain, not once a block.
        let next = parent + 1;
        let id = if reserved.start == next && reserved.start < reserved.end {
            reserved.start += 1;
            self.nodes[next as usize] = node;
            self.cold[next as usize] = EMPTY_COLD;
            next
        } else if next as usize == self.nodes.len() {
            self.push_node(node)
        } else {
            let taken = self
                .free_nodes
                .take_run_at(&mut self.nodes, &mut self.cold, next, want);
            let run = if taken > 0 {
                Some((next, taken))
            } else {
                self.free_nodes
                    .pop_run(&mut self.nodes, &mut self.cold, want, want)
            };
            match run {
                Some((id, n)) => {
                    *reserved = id + 1..id + n;
                    self.nodes[id as usize] = node;
                    self.cold[id as usize] = EMPTY_COLD;
                    id
                }
                None => self.push_node(node),
            }
        };
        if !Self::is_implicit(id, parent) {
            let tag = tag_of(child_hash(parent, local));
            if parent == ROOT {
                self.roots.insert_new(tag, id);
            } else {
                *self.kids.entry(parent).or_insert(0) += 1;
                self.nodes[parent as usize].meta |= BRANCH;
                self.children.insert_new(tag, id);
            }
        }
        id
    }

    fn push_node(&mut self, node: Node) -> u32 {
        let id = self.nodes.len() as u32;
        assert!(id < TAKEN, "radix tree node capacity (2^32 - 2) exceeded");
        self.nodes.push(node);
        self.cold.push(EMPTY_COLD);
        id
    }

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
            // Slot ids share a word with the `HAS_EXTRAS` flag (and `NIL`).
            assert!(
                id < HAS_EXTRAS - 1,
                "radix tree worker-rank capacity exceeded"
            );
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

    /// Prefetch the table buckets of `hashes` before they are probed one by one, so that
    /// their cache misses overlap (in the apply loop each miss would wait for the previous
    /// block's work). At every size: at 100k blocks the table mostly fits in the caches,
    /// but the work between events evicts it, and the load of the probe's first bucket
    /// was two thirds of the probe's time.
    fn warm_lookup(&self, hashes: impl Iterator<Item = u64>) {
        for h in hashes {
            self.hashes.prefetch(tag_of(key_of(h)));
        }
    }

    /// After [`Self::warm_lookup`]: load each hash's node (its first bucket with a matching
    /// tag, unverified: this only loads), then find each residency (which reads a further
    /// holder's block), each pass one loop of independent loads (the next misses of a
    /// remove).
    fn warm_residencies(&self, slot: u32, hashes: &[u64]) {
        if self.residencies < WARM_MIN {
            return;
        }
        let mut acc = 0u32;
        for &h in hashes {
            if let Some(i) = self.hashes.find(tag_of(key_of(h)), |_| true) {
                let node = self.hashes.get(i) as usize;
                if let (Some(n), Some(c)) = (self.nodes.get(node), self.cold.get(node)) {
                    acc ^= n.meta ^ c.slot;
                }
            }
        }
        for &h in hashes {
            acc ^= self.find_residency(slot, key_of(h)).map_or(0, Held::node);
        }
        std::hint::black_box(acc);
    }

    /// How `slot` holds the block of key `key`, if it does: the node with that canonical
    /// key that the rank holds under it, or the rank's own residency under it.
    fn find_residency(&self, slot: u32, key: u64) -> Option<Held> {
        self.probe_residency(slot, key, NIL, false).0
    }

    /// [`Self::find_residency`], and what a store of `key` at `node` needs to know from
    /// the same probe of `hashes`: on a miss, the bucket where an entry for `key` would go
    /// (for [`Self::add_residency`] while `hashes` is unchanged), and whether `key` is
    /// `node`'s canonical key (an entry passed on the way). `absent`: the rank is known not
    /// to hold `node` (its holders need no scan).
    fn probe_residency(
        &self,
        slot: u32,
        key: u64,
        node: u32,
        absent: bool,
    ) -> (Option<Held>, Probe) {
        let lo = key_lo(key);
        let mut canonical_at_node = false;
        let mut holds_node = None;
        let found = self.hashes.find_or_vacant(tag_of(key), |n| {
            if self.cold[n as usize].key != lo {
                return false;
            }
            let holds = !(absent && n == node) && self.holds_canonically(n, slot);
            if n == node {
                canonical_at_node = true;
                // Without own residencies anywhere, holding canonically is holding.
                if self.own_slots.is_empty() {
                    holds_node = Some(holds);
                }
            }
            holds
        });
        let vacant = match found {
            Ok(i) => {
                let probe = Probe {
                    vacant: None,
                    canonical_at_node,
                    holds_node,
                };
                return (Some(Held::Canonical(self.hashes.get(i))), probe);
            }
            Err(v) => v,
        };
        let own = if self.own.is_empty() {
            None
        } else {
            self.own.get(&(slot, key)).map(|&n| Held::Own(n))
        };
        let probe = Probe {
            vacant: Some(vacant),
            canonical_at_node,
            holds_node,
        };
        (own, probe)
    }

    /// Whether `slot` holds `node` under the node's canonical key: it holds it more times
    /// than under keys of its own.
    fn holds_canonically(&self, node: u32, slot: u32) -> bool {
        let own = self.own_count(node, slot);
        if own == 0 {
            self.holds(node, slot)
        } else {
            self.multiplicity(node, slot) > own
        }
    }

    /// How many of `slot`'s residencies at `node` are under keys of its own.
    fn own_count(&self, node: u32, slot: u32) -> u32 {
        if self.own_slots.is_empty() {
            return 0;
        }
        self.own_slots
            .get(&node)
            .map_or(0, |v| v.iter().filter(|&&s| s == slot).count() as u32)
    }

    /// `node`'s residencies under its canonical key.
    fn canonical_count(&self, node: u32) -> u32 {
        let all = self.nodes[node as usize].meta & COUNT_MASK;
        if self.own_slots.is_empty() {
            return all;
        }
        all - self.own_slots.get(&node).map_or(0, |v| v.len() as u32)
    }

    /// How many times `slot` holds `node` (under any keys).
    fn multiplicity(&self, node: u32, slot: u32) -> u32 {
        if let Some(set) = self.holder_set(node) {
            return set.multiplicity(slot);
        }
        let mut times = 0;
        self.for_each_residency(node, |s| times += u32::from(s == slot));
        times
    }

    /// Make `slot` hold `node` under external hash `ext`. A previous residency of the same
    /// hash elsewhere is released (the newest store of a hash wins).
    ///
    /// Returns whether the rank did not hold `node` before (as far as is known cheaply);
    /// `known_absent` says the caller already knows it did not.
    fn set_residency(&mut self, slot: u32, node: u32, ext: u64, known_absent: bool) -> bool {
        let key = key_of(ext);
        let (found, probe) = self.probe_residency(slot, key, node, known_absent);
        // Exact: `lacks` is, and `known_absent` is a proof.
        let absent = known_absent
            || match probe.holds_node {
                Some(holds) => !holds,
                None => self.lacks(node, slot),
            };
        let Some(old) = found else {
            self.add_residency(slot, node, key, !absent, probe);
            return absent;
        };
        if old.node() == node {
            return false;
        }
        // Add the new residency before releasing the old one so that no node on the
        // current path can be freed in between.
        self.add_residency(slot, node, key, !absent, probe);
        self.release_marking(old.node(), slot, old.release(key), true, NIL);
        // The release may have changed `node`'s parent chain; claim nothing below.
        false
    }

    /// Whether `slot` does not hold `node` (exact: a holder set's bit, or a scan of at most
    /// [`WIDE_MIN`] holders).
    fn lacks(&self, node: u32, slot: u32) -> bool {
        self.nodes[node as usize].meta & COUNT_MASK == 0 || !self.holds(node, slot)
    }

    /// Attach a residency under `key` to `node`: under the node's canonical key when it is
    /// `key`, or when the node has none (`key` becomes it: an entry in `hashes`), else as
    /// the rank's own (`own`). `dup`: the rank already holds `node` (under another key).
    /// `probe`: what a probe of `hashes` for `key` found on the way, `hashes` unchanged
    /// since (see [`Self::probe_residency`]).
    fn add_residency(&mut self, slot: u32, node: u32, key: u64, dup: bool, probe: Probe) {
        self.residencies += 1;
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.count += 1;
        }
        let (tag, lo) = (tag_of(key), key_lo(key));
        if self.canonical_count(node) == 0 {
            self.cold[node as usize].key = lo;
            match probe.vacant {
                Some(v) => self.hashes.insert_vacant(v, tag, node),
                None => self.hashes.insert_new(tag, node),
            }
        } else if !probe.canonical_at_node
            && (probe.vacant.is_some()
                || self.cold[node as usize].key != lo
                || self.hashes.find(tag, |n| n == node).is_none())
        {
            self.own.insert((slot, key), node);
            self.own_slots.entry(node).or_default().push(slot);
        }
        let m = self.nodes[node as usize].meta;
        let count = m & COUNT_MASK;
        assert!(count < COUNT_MASK, "radix tree holders per node exceeded");
        let mut flags = m & !COUNT_MASK;
        if m & WIDE != 0 {
            // Exact: whether the slot already held the node is one bit.
            if let Some(set) = self.wide.get_mut(&node) {
                set.add(slot);
                if set.has_dups() {
                    flags |= DUPS;
                } else {
                    flags &= !DUPS;
                }
            }
        } else if count > 0 && dup {
            flags |= DUPS;
        }
        self.nodes[node as usize].meta = flags | (count + 1);
        self.attach(slot, node);
        if m & WIDE == 0 && count + 1 > WIDE_MIN {
            self.widen(node);
        }
    }

    /// Give `node` a holder set built from its holder block (which makes its `DUPS` exact).
    fn widen(&mut self, node: u32) {
        let mut set = HolderSet::default();
        self.for_each_residency(node, |s| {
            set.add(s);
        });
        // Where each slot's entry is, from now on kept up to date (see `HolderSet::hint`).
        let c = self.cold[node as usize];
        if c.has_extras() {
            let mut j = 0;
            self.holders.scan(c.link, |h| {
                set.set_hint(h.slot, j);
                j += 1;
                true
            });
        }
        let m = &mut self.nodes[node as usize].meta;
        *m |= WIDE;
        if set.has_dups() {
            *m |= DUPS;
        } else {
            *m &= !DUPS;
        }
        self.wide.insert(node, set);
    }

    /// Attach a residency of `slot` to `node` (its count already includes it).
    fn attach(&mut self, slot: u32, node: u32) {
        let n = &mut self.cold[node as usize];
        if n.slot == NIL {
            n.slot = slot;
            return;
        }
        // The node's residencies before this one: the primary and `len` further ones.
        let meta = self.nodes[node as usize].meta;
        let len = (meta & COUNT_MASK) - 2;
        let block = if n.has_extras() { n.link } else { NIL };
        let block = self.holders.push(block, len, Holder::new(slot));
        if meta & WIDE != 0
            && let Some(set) = self.wide.get_mut(&node)
        {
            set.set_hint(slot, len);
        }
        let n = &mut self.cold[node as usize];
        n.slot |= HAS_EXTRAS;
        n.link = block;
    }

    /// Detach a residency of worker slot `slot` (`which`) from `node`, and free the node and
    /// any ancestors left empty and childless. With `mark`, flag the node `BROKEN` when the
    /// releasing rank may still hold one of its children (not needed when the rank's every
    /// block goes). `gone`: a node the rank is known not to hold (or `NIL`).
    fn release_marking(&mut self, node: u32, slot: u32, which: Release, mark: bool, gone: u32) {
        match which {
            Release::Canonical(key) => {
                // The node's last residency under its canonical key takes its entry along.
                if self.canonical_count(node) == 1
                    && let Some(i) = self.hashes.find(tag_of(key), |n| n == node)
                {
                    self.hashes.remove_at(i);
                }
            }
            Release::Own(key) => self.forget_own(node, slot, key),
            Release::Cleared => {}
        }
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.count -= 1;
        }
        {
            let m = &mut self.nodes[node as usize].meta;
            *m -= 1;
            if *m & COUNT_MASK <= 1 {
                *m &= !DUPS;
            }
        }
        if self.nodes[node as usize].meta & WIDE != 0 {
            self.narrow(node, slot);
        }
        self.detach(node, slot);
        // A node that is still live keeps its parent (freed ones have none).
        if mark
            && node != ROOT
            && self
                .nodes
                .get(node as usize)
                .is_some_and(|n| n.parent != NIL)
        {
            self.mark_if_orphaning(node, slot, gone);
        }
    }

    /// `slot`'s own residency under `key` at `node` is going (its entry in `own` names
    /// `node`, unless a store has just moved the key to another node).
    fn forget_own(&mut self, node: u32, slot: u32, key: u64) {
        if self.own.get(&(slot, key)) == Some(&node) {
            self.own.remove(&(slot, key));
            if self.own.is_empty() {
                self.own = FxHashMap::default();
            }
        }
        if let Some(list) = self.own_slots.get_mut(&node) {
            if let Some(i) = list.iter().position(|&s| s == slot) {
                list.swap_remove(i);
            }
            if list.is_empty() {
                self.own_slots.remove(&node);
                if self.own_slots.is_empty() {
                    self.own_slots = FxHashMap::default();
                }
            }
        }
    }

    /// `slot` left the wide `node` (its count already dropped): update the holder set and
    /// the exact `DUPS`; below [`WIDE_DROP`] holders the node goes back to its block alone.
    fn narrow(&mut self, node: u32, slot: u32) {
        let Some(set) = self.wide.get_mut(&node) else {
            return;
        };
        set.remove(slot);
        let dups = set.has_dups();
        let m = &mut self.nodes[node as usize].meta;
        if dups {
            *m |= DUPS;
        } else {
            *m &= !DUPS;
        }
        if *m & COUNT_MASK < WIDE_DROP {
            *m &= !WIDE;
            self.wide.remove(&node);
            if self.wide.is_empty() {
                self.wide = FxHashMap::default();
            }
        }
    }

    /// After `slot` left `node`: if `slot` may still hold a child of `node`, the child's
    /// holders are no longer a subset of the node's; flag the node.
    fn mark_if_orphaning(&mut self, node: u32, slot: u32, gone: u32) {
        if self.nodes[node as usize].meta & BROKEN != 0 {
            return;
        }
        let broken = if self.nodes[node as usize].meta & BRANCH != 0 {
            true
        } else {
            let c = node + 1;
            self.nodes.get(c as usize).is_some_and(|n| n.parent == node)
                && c != gone
                && self.holds(c, slot)
        };
        if broken {
            self.nodes[node as usize].meta |= BROKEN;
        }
    }

    /// Whether `slot` holds `node` (a bit test for wide nodes; otherwise scans at most
    /// [`WIDE_MIN`] holders).
    fn holds(&self, node: u32, slot: u32) -> bool {
        if let Some(set) = self.holder_set(node) {
            return set.contains(slot);
        }
        // Stops at the entry: a holder block is scanned to its end only on a miss.
        !self.residencies_while(node, |s| s != slot)
    }

    /// Take one of `slot`'s residencies off `node` (see [`Self::release_marking`]; the
    /// node's count already excludes it). A node lists its holders by slot alone, so the
    /// rank's residencies there are interchangeable: which keys they are under is known
    /// from `hashes` and `own`.
    fn detach(&mut self, node: u32, slot: u32) {
        self.residencies -= 1;
        // The node's further residencies before this call.
        let len = self.nodes[node as usize].meta & COUNT_MASK;
        let n = self.cold[node as usize];
        if n.primary() != slot {
            let wide = self.nodes[node as usize].meta & WIDE != 0;
            // A wide node's hint, checked; else (or when stale) a scan.
            let hinted = if wide {
                hinted_entry(&self.wide, &self.holders, node, n.link, len, slot)
            } else {
                None
            };
            let at = hinted.unwrap_or_else(|| {
                let mut at = 0;
                let mut found = false;
                self.holders.scan(n.link, |h| {
                    found = h.slot == slot;
                    at += u32::from(!found);
                    !found
                });
                debug_assert!(found, "holder entry of slot {slot} in node {node}");
                at
            });
            // The block's last entry takes the removed one's place.
            let last = if wide {
                self.holders.get(n.link, len - 1)
            } else {
                Holder::new(NIL)
            };
            let block = self.holders.swap_remove(n.link, len, at);
            if wide {
                if at < len - 1
                    && let Some(w) = self.wide.get_mut(&node)
                {
                    w.set_hint(last.slot, at);
                }
                self.set_holder_block(node, block);
                // A rank holding the node twice keeps a further entry to point at.
                self.rehint(node, slot);
                return;
            }
            self.set_holder_block(node, block);
            return;
        }
        if !n.has_extras() {
            self.cold[node as usize].slot = NIL;
            self.free_upwards(node);
            return;
        }
        // Promote the last further holder to primary.
        let e = self.holders.get(n.link, len - 1);
        let block = self.holders.swap_remove(n.link, len, len - 1);
        self.cold[node as usize].slot = e.slot;
        self.set_holder_block(node, block);
        if self.nodes[node as usize].meta & WIDE != 0 {
            self.rehint(node, e.slot);
        }
    }

    /// Point `slot`'s position hint in the wide `node` at a further entry it still has,
    /// if any (a scan, only when the rank holds the node more than once: its hint may
    /// have named the entry that just left).
    fn rehint(&mut self, node: u32, slot: u32) {
        let c = self.cold[node as usize];
        let Some(set) = self.wide.get(&node) else {
            return;
        };
        if !c.has_extras() || set.multiplicity(slot) <= u32::from(c.primary() == slot) {
            return;
        }
        let (mut j, mut at) = (0, None);
        self.holders.scan(c.link, |h| {
            if h.slot == slot {
                at = Some(j);
            }
            j += 1;
            at.is_none()
        });
        if let (Some(at), Some(set)) = (at, self.wide.get_mut(&node)) {
            set.set_hint(slot, at);
        }
    }

    fn free_upwards(&mut self, mut node: u32) {
        while node != ROOT {
            let n = self.nodes[node as usize];
            if self.cold[node as usize].slot != NIL || self.has_children(node) {
                return;
            }
            if !Self::is_implicit(node, n.parent) {
                let table = if n.parent == ROOT {
                    &mut self.roots
                } else {
                    self.drop_kid(n.parent);
                    &mut self.children
                };
                if let Some(index) =
                    table.find(tag_of(child_hash(n.parent, n.local)), |x| x == node)
                {
                    table.remove_at(index);
                }
            }
            // A freed node has no parent, so `child` never mistakes it for an implicit child.
            self.nodes[node as usize].parent = NIL;
            self.nodes[node as usize].meta = 0;
            self.free_nodes.push(&mut self.nodes, &mut self.cold, node);
            if let Some(r) = self.recent.as_mut() {
                r.uses.get_mut().remove(&node);
            }
            node = n.parent;
        }
        if self.node_count() == 0 {
            self.reset_arenas();
        }
    }

    /// One explicit child of `parent` (not the root) is gone.
    fn drop_kid(&mut self, parent: u32) {
        if let Some(k) = self.kids.get_mut(&parent) {
            *k -= 1;
            if *k == 0 {
                self.kids.remove(&parent);
                self.nodes[parent as usize].meta &= !BRANCH;
            }
        }
    }

    /// Return every arena to its empty size once the last node is gone.
    fn reset_arenas(&mut self) {
        self.nodes = std::iter::once(Self::root()).collect();
        self.cold = std::iter::once(EMPTY_COLD).collect();
        self.free_nodes = FreeRuns::default();
        self.holders = Holders::default();
        self.children = ExtTable::default();
        self.roots = ExtTable::default();
        self.kids = FxHashMap::default();
        self.wide = FxHashMap::default();
        self.hashes = ExtTable::default();
        if let Some(r) = self.recent.as_mut() {
            *r.uses.get_mut() = FxHashMap::default();
        }
    }

    /// Name `block` (`NIL`: none) as `node`'s holder block.
    fn set_holder_block(&mut self, node: u32, block: u32) {
        let n = &mut self.cold[node as usize];
        if block == NIL {
            n.slot &= !HAS_EXTRAS;
            n.link = NIL;
        } else {
            n.slot |= HAS_EXTRAS;
            n.link = block;
        }
    }

    /// Whether `node` has a child: its implicit child (the next arena slot, if that node's
    /// parent is `node`) or an explicit one.
    fn has_children(&self, node: u32) -> bool {
        self.nodes
            .get(node as usize + 1)
            .is_some_and(|n| n.parent == node)
            || self.nodes[node as usize].meta & BRANCH != 0
    }

    #[inline]
    fn for_each_residency(&self, node: u32, mut f: impl FnMut(u32)) {
        self.residencies_while(node, |s| {
            f(s);
            true
        });
    }

    /// The slot of each of `node`'s residencies (the primary first) until `f` returns
    /// `false`; returns whether it never did.
    #[inline]
    fn residencies_while(&self, node: u32, mut f: impl FnMut(u32) -> bool) -> bool {
        let n = &self.cold[node as usize];
        if n.slot == NIL {
            return true;
        }
        if !f(n.primary()) {
            return false;
        }
        let mut all = true;
        if n.has_extras() {
            self.holders.scan(n.link, |h| {
                all = f(h.slot);
                all
            });
        }
        all
    }
}
