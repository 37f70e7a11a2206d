//! The KV indexer: which worker rank already holds how many leading blocks of a prompt.
//!
//! Engines report `stored` / `removed` / `cleared` events ([`crate::protocols`]); the
//! indexer keeps a radix tree of block *contents* (`tokens_hash`, the router's local hash)
//! and, for every `(worker_id, dp_rank)`, which tree nodes it holds under which *external*
//! hash (`block_hash`, the engine's opaque key). [`RadixTree::find_matches`] walks a query
//! of local hashes from the root and reports, per rank, the length of the prefix it holds.
//!
//! # Semantics (shared with the reference)
//!
//! * A `stored` event appends its blocks under the node of `parent_hash`, looked up in the
//!   emitting rank's own blocks (`None` = the root). An unknown parent rejects the whole
//!   event ([`crate::Error::ParentBlockNotFound`]) and leaves the tree unchanged; so does a
//!   chain that contains its own parent ([`crate::Error::InvalidBlockSequence`]).
//! * The same content under the same prefix is **one node**, whichever ranks store it and
//!   whatever external hashes they use.
//! * A `removed` hash the rank does not hold is a counted no-op
//!   ([`crate::Error::BlockNotFound`] reports them after the known hashes were removed).
//! * `cleared` drops the emitting rank's blocks; [`RadixTree::remove_worker`] drops every
//!   rank of a worker.
//! * A rank scores `k` for a query when it holds the query's blocks at depths `1..=k`.
//!   Holding a deeper block without its parent does not count.
//! * Events are idempotent: applying a `stored` event twice changes nothing.
//!
//! Deliberate differences: storing an external hash the rank already holds at another node
//! moves it there (the newest store wins; the reference keeps both, one of them
//! unremovable). Removing a rank's inner block keeps its deeper blocks (they stop scoring
//! until the block is stored again), as in the reference's uncompressed tree; the
//! reference's compressed tree sometimes drops them too.
//!
//! # Layout and memory
//!
//! * `nodes` / `cold`: two arenas indexed by the same node id, 28 bytes a node, in chunks of
//!   2^14 nodes (`tree/arena.rs`: growing an arena allocates a chunk and never copies it).
//!   `nodes` holds what a query's walk reads at every block (16 bytes: `tokens_hash`,
//!   parent id, `meta` below), four blocks a cache line; `cold` the rest (12 bytes: the
//!   first holding rank inline, since most blocks have one holder, the low half of the
//!   node's canonical key, below, and the node's holder block), read by a walk only where
//!   the holders change. Further holders of a node live in one block of `holders`
//!   (`tree/holders.rs`: 4 bytes an entry, the worker slot; blocks of `2^c` entries from a
//!   pool per size class), so that a node's holders are one or a few cache lines read in
//!   order (where the node is `WIDE`, below, its holder set keeps a position hint per
//!   slot, checked before use: scanning hundreds of holders at every store and remove of a
//!   fleet-wide prefix made those events the longest holds of the write lock).
//! * `hashes`: one tag table for all ranks, one entry per node, finding blocks by external
//!   hash. An engine's block hash is a hash of the block's token sequence, so the ranks
//!   that hold a block hold it under the same hash: the node's *canonical key* (the hash
//!   mixed by a bijection into 64 bits; the entry's tag is its high half, the node keeps
//!   the low half, and together they name the hash exactly). "Does this rank hold this
//!   hash?" is a probe for the key and a look at the node's holders. The first key a
//!   residency brings to a node that has none becomes canonical; a residency under another
//!   key (another salt, a collision) is its rank's *own*, kept whole in `own`
//!   (`(slot, key) -> node`, empty in the common case, when lookups never reach it). A
//!   store of a block its node already has under that hash adds a holder and touches no
//!   table; a node leaves `hashes` with its last canonical residency. (Per-rank tables held
//!   an entry per rank and block: at 16 workers 2.4 entries a block, 13 of the 32 bytes a
//!   block of the index at 10M blocks.) The tree keeps no index by rank, so a `cleared`
//!   rank (or a removed worker) is a pass over the arena.
//!   Child counts are not stored per node: the implicit child
//!   (below) is detected from the arena, and the nodes that have explicit children (branch
//!   points, a few percent) are flagged `BRANCH` in `meta` and counted in `kids`, a map of
//!   their own.
//! * `children`: a tag table (see `tree/ext_table.rs`: open addressing, 8-byte buckets of
//!   node id + 32-bit hash tag, read through the arena only on a tag match, grown without
//!   reading the arena) of node ids keyed by `(parent id, tokens_hash)`. A node allocated
//!   right after its parent (`id == parent + 1`, which is every block of a stored chain but
//!   the first, since chains are allocated consecutively) is an *implicit* child: it is
//!   found by checking the next arena slot and has no table entry. A chain stored by a
//!   later event (a worker's continuation, a branch) starts with an explicit child. A
//!   parent without `BRANCH` has none, so a walk that leaves a chain where no branch is
//!   stops on the node's own line, without a table probe. The root's children (all explicit) have a
//!   table of their own, `roots`, keyed by `tokens_hash`: far smaller than `children`, so
//!   the first probe of every query stays in cache.
//! * Before an event's probes, the `hashes` buckets of all its hashes (and for removes,
//!   the nodes they name) are loaded in one loop, so that their cache misses overlap.
//! * `meta` (in the node): the node's residency count and the flags `BROKEN` (a rank
//!   released the node while it may still hold a child: children's holders may not all
//!   hold it) and `DUPS` (a rank may hold the node under two external hashes). Without
//!   them, a child whose count equals its parent's has exactly the parent's holders, so a
//!   query walks a chain checking counts and reads holder blocks only where the set of
//!   holders changes. Flags are set
//!   conservatively (a flag only costs a scan) and cleared when the node is freed; `DUPS`
//!   also when at most one holder is left.
//! * `wide`: a node held by more than 64 ranks (a system prompt cached across a large
//!   fleet) also keeps a holder set, one bit per worker slot plus the rare ranks that hold
//!   it twice (`tree/wide.rs`), flagged `WIDE` in `meta`. "Does this rank hold it?" is then
//!   a bit test, so such a node's `DUPS` and `BROKEN` are exact rather than conservative
//!   (a conservative flag on a prefix shared by 1,000 workers made every query scan 1,000
//!   holders per block), and a query enumerates or filters its holders with bit
//!   operations instead of scanning its block. It goes back to the block alone below 32
//!   holders.
//! * free node ids are kept as maximal runs of consecutive ids (merged as they are freed,
//!   or by stretches at the end of a `removed` / `cleared` event; the bookkeeping lives in
//!   the freed nodes), and a chain of `n` new blocks starts in a
//!   run of at least `n` ids when one exists (or at the end of the arena while fewer than
//!   1/4 of the ids are free), so that its blocks stay implicit children and a query walks
//!   them in address order; a chain split over runs costs every later query a branch step
//!   at each split.
//!
//! **Exact reclamation.** Every residency is found by its key (through its node's entry in
//! `hashes`, or its entry in `own`), and a node is freed the moment it has no residency
//! and no children (its ancestors are checked in turn). Removing a block therefore frees
//! its residency, the node's `hashes` entry with its last canonical residency, and every
//! node that only existed for it; a rank with no blocks left is forgotten; once the
//! last node is gone every arena and table returns to its initial (empty) size. Memory is
//! bounded by the peak number of live `(rank, block)` pairs, not by history.
//!
//! Invariants (checked by [`RadixTree::check_invariants`] in the tests):
//! 1. every live node except the root and implicit children is in `children` under
//!    `(parent, tokens_hash)`, its parent's child count (`kids`, `BRANCH`) includes it,
//!    and freed nodes have no parent;
//! 2. a live node has a residency or a child; a node with further holders has a primary
//!    residency, and one holder block of exactly `count - 1` entries (more than a quarter
//!    of its capacity unless that is 4, the smallest);
//! 3. `hashes` has one entry for each node with residencies under its canonical key and
//!    none for any other; `own` names live nodes held under its keys, each listed once in
//!    `own_slots`; every residency's hash, rebuilt from them, is found again;
//! 4. `len()` equals the number of residencies, and each rank's count its own.
//! 5. `meta` counts each live node's residencies; without `DUPS` no rank holds the node
//!    twice; without `BROKEN` every rank holding a child holds the node.
//!
//! # Limits
//!
//! Ids are 32-bit, so the tree has fixed limits; past one it panics with a message naming
//! it. In the order a growing index meets them: 2^27 holder blocks of one size class (at
//! least 270M indexed blocks, over 7 GiB of index), 2^32 - 2 nodes (112 GiB of nodes), 2^31 - 2
//! worker ranks at once, 2^28 - 1 holders of one block, 2^32 buckets in one tag table (2^32
//! nodes with canonical keys).
//!
//! # Concurrency
//!
//! [`SharedRadixTree`] wraps the tree in a `parking_lot::RwLock`. Queries take the read
//! lock (`read_recursive`: they do not queue behind a writer that is waiting, only wait
//! for one that holds the lock, spinning briefly before they park) and run on the
//! caller's thread, so any number of them proceed in parallel; each
//! event takes the write lock for the time it takes to apply that one event (a few
//! microseconds for a 64-block store), and decoding happens before the lock is taken.
//! There is no queue of pending writes in front of the tree (unlike the reference's actor
//! thread), so a query waits at most for the events already holding or waiting for the
//! lock, never for a backlog. Per-rank ordering is the order in which callers apply events;
//! a caller that needs a rank's events in order applies them from one thread (or in
//! event-id order), as the transport does.
//!
//! ```
//! use dynamo_kv_router::hashing::LocalBlockHash;
//! use dynamo_kv_router::indexer::SharedRadixTree;
//! use dynamo_kv_router::protocols::WorkerWithDpRank;
//!
//! let tree = SharedRadixTree::new(None);
//! tree.apply_json(7, br#"{"event_id":1,"data":{"stored":{"parent_hash":null,
//!     "blocks":[{"block_hash":10,"tokens_hash":100},{"block_hash":11,"tokens_hash":101}]}}}"#)?;
//! let scores = tree.find_matches(&[LocalBlockHash(100), LocalBlockHash(101), LocalBlockHash(5)], false);
//! assert_eq!(scores.get(WorkerWithDpRank::new(7, 0)), Some(2));
//! tree.remove_worker(7);
//! assert_eq!(tree.node_count(), 0);
//! # Ok::<(), dynamo_kv_router::Error>(())
//! ```

mod runs;
#[cfg(test)]
mod tests;
mod tree;

use std::time::{Duration, Instant};

use parking_lot::{RwLock, RwLockReadGuard};

pub use runs::RunTree;
pub use tree::{EventCounters, RadixTree};

use crate::error::Result;
use crate::hashing::LocalBlockHash;
use crate::protocols::{KvCacheEvent, RouterEvent, WorkerWithDpRank, decode_json_event};

/// Result of a prefix match.
///
/// Equality compares `scores` and `frequencies` only: `index_slots` says where the index
/// keeps the ranks, which is no part of the answer (two trees with the same blocks give
/// equal scores under different slots).
#[derive(Debug, Clone, Default)]
pub struct OverlapScores {
    /// Matched prefix length (in blocks) per worker rank; ranks that match nothing are
    /// absent.
    pub scores: Vec<(WorkerWithDpRank, u32)>,
    /// For each matched depth, how many lookups touched that block within the expiration
    /// window (zeros omitted). Empty unless the tree tracks frequencies.
    pub frequencies: Vec<usize>,
    /// The index's slot of each rank of `scores`; empty when the index does not say (the
    /// tree says when the prompt's first block has 32 holders or more: below that, a
    /// scheduler's lookups are cheaper than listing them).
    pub index_slots: IndexSlots,
}

impl PartialEq for OverlapScores {
    fn eq(&self, other: &Self) -> bool {
        self.scores == other.scores && self.frequencies == other.frequencies
    }
}

impl Eq for OverlapScores {}

/// Where an index keeps the ranks it lists: the slot of each (a small integer the index
/// reuses after a rank leaves) and the name of the slot assignment they belong to.
///
/// A scheduler keeps its own slot per rank and would otherwise find it by one hash lookup
/// per listed rank, hundreds per decision on a large fleet, each a likely cache miss; with
/// these it keeps a translation from the index's slots to its own, valid while `epoch`
/// stays the same ([`crate::scheduling::SchedulingRequest::index_slots`]).
#[derive(Debug, Clone, Default)]
pub struct IndexSlots {
    /// The index's slot of each listed rank, in the order of the list.
    pub slots: Vec<u32>,
    /// Unique in the process to one assignment of slots to ranks: an index takes a new one
    /// whenever one of its slots gets a rank (a freed slot need not renew it while no list
    /// names it), so two lists with the same epoch map equal slots to equal ranks. 0: no
    /// assignment (the slots mean nothing).
    pub epoch: u64,
}

impl IndexSlots {
    /// A fresh epoch (never 0, never handed out twice in this process).
    pub(crate) fn next_epoch() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The slots, when they describe a list of `len` ranks.
    pub fn for_list(&self, len: usize) -> Option<&Self> {
        (self.epoch != 0 && self.slots.len() == len).then_some(self)
    }
}

impl OverlapScores {
    /// The score of one worker rank, if it matched at least one block.
    pub fn get(&self, worker: WorkerWithDpRank) -> Option<u32> {
        self.scores
            .iter()
            .find(|(w, _)| *w == worker)
            .map(|&(_, s)| s)
    }
}

/// How long a query spins on the lock while an event holds it before it parks (see
/// [`SharedRadixTree::find_matches`]): longer than an event's apply (a 64-block store takes
/// a few microseconds, the largest events at 10M+ blocks a few milliseconds), short enough
/// that a writer preempted while holding the lock costs a spinning reader little CPU.
const READ_SPIN: Duration = Duration::from_micros(50);

/// A [`RadixTree`] shared between threads: parallel queries, one event at a time.
#[derive(Debug, Default)]
pub struct SharedRadixTree {
    inner: RwLock<RadixTree>,
}

impl SharedRadixTree {
    /// An empty shared tree; see [`RadixTree::new`] for `expiration`.
    pub fn new(expiration: Option<Duration>) -> Self {
        Self {
            inner: RwLock::new(RadixTree::new(expiration)),
        }
    }

    /// Decode a JSON `KvCacheEvent` (without holding the lock) and apply it.
    ///
    /// # Errors
    /// [`crate::Error::Decode`] for bad bytes; the apply errors of
    /// [`RadixTree::apply_event`].
    pub fn apply_json(&self, worker_id: u64, bytes: &[u8]) -> Result<()> {
        let event = decode_json_event(bytes)?;
        self.apply_event(worker_id, &event)
    }

    /// Apply one event of `worker_id`.
    ///
    /// # Errors
    /// See [`RadixTree::apply_event`].
    pub fn apply_event(&self, worker_id: u64, event: &KvCacheEvent) -> Result<()> {
        self.inner.write().apply_event(worker_id, event)
    }

    /// Apply a `RouterEvent` (worker id inside).
    ///
    /// # Errors
    /// See [`RadixTree::apply_event`].
    pub fn apply_router_event(&self, event: &RouterEvent) -> Result<()> {
        self.apply_event(event.worker_id, &event.event)
    }

    /// See [`RadixTree::find_matches`].
    ///
    /// Takes the read lock with `read_recursive`: it waits for an event being applied, but
    /// not for a writer that is only *waiting* (parking_lot's `read` queues behind it, so
    /// a query could wait for the lock to go to the writer and back). The price: readers
    /// whose holds overlap without a gap would keep a waiting writer out. A query holds the
    /// lock for microseconds, so that takes queries arriving back to back on several
    /// threads; the event-plane lag metric is where it would show.
    ///
    /// While an event holds the lock, the query spins (up to [`READ_SPIN`]) before it
    /// parks: an event holds it for microseconds, but a parked thread runs again only once
    /// the kernel has woken and scheduled it (in the 1,000-publisher storm on a 2-core VM,
    /// one routing decision in five parked here, off the CPU for 51 µs at the median and
    /// 109 µs at p90, ~35 µs of it the wake-up's scheduling delay;
    /// `docs/benchmarks/kv_router.md`).
    pub fn find_matches(&self, query: &[LocalBlockHash], early_exit: bool) -> OverlapScores {
        self.read_spinning().find_matches(query, early_exit)
    }

    /// The read lock as [`Self::find_matches`] takes it: at once when no event holds the
    /// lock; else by polling it (a plain load between attempts, so the writer's cache line
    /// is not fought over) for up to [`READ_SPIN`], then by parking.
    fn read_spinning(&self) -> RwLockReadGuard<'_, RadixTree> {
        if let Some(guard) = self.inner.try_read_recursive() {
            return guard;
        }
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                std::hint::spin_loop();
                if !self.inner.is_locked_exclusive()
                    && let Some(guard) = self.inner.try_read_recursive()
                {
                    return guard;
                }
            }
            if start.elapsed() >= READ_SPIN {
                return self.inner.read_recursive();
            }
        }
    }

    /// See [`RadixTree::remove_worker`].
    pub fn remove_worker(&self, worker_id: u64) {
        self.inner.write().remove_worker(worker_id);
    }

    /// Drop every block of every rank of `worker_id` (same effect on scores as
    /// [`Self::remove_worker`]).
    pub fn clear_all_blocks(&self, worker_id: u64) {
        self.inner.write().remove_worker(worker_id);
    }

    /// See [`RadixTree::dump_events`].
    pub fn dump_events(&self) -> Vec<RouterEvent> {
        self.inner.read().dump_events()
    }

    /// See [`RadixTree::node_count`].
    pub fn node_count(&self) -> usize {
        self.inner.read().node_count()
    }

    /// See [`RadixTree::len`].
    pub fn len(&self) -> usize {
        self.inner.read().len()
    }

    /// See [`RadixTree::is_empty`].
    pub fn is_empty(&self) -> bool {
        self.inner.read().is_empty()
    }

    /// See [`RadixTree::heap_bytes`].
    pub fn heap_bytes(&self) -> usize {
        self.inner.read().heap_bytes()
    }

    /// See [`RadixTree::counters`].
    pub fn counters(&self) -> EventCounters {
        self.inner.read().counters()
    }

    /// Run `f` with exclusive access to the tree (several changes under one lock).
    pub fn with_write<R>(&self, f: impl FnOnce(&mut RadixTree) -> R) -> R {
        f(&mut self.inner.write())
    }
}
