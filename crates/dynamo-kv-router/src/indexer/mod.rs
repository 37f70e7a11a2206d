//! The KV indexer: which worker rank already holds how many leading blocks of a prompt.
//!
//! Engines report `stored` / `removed` / `cleared` events ([`crate::protocols`]); the
//! indexer keeps a radix tree of block *contents* (`tokens_hash`, the router's local hash)
//! and, for every `(worker_id, dp_rank)`, which blocks of it it holds under which *external*
//! hash (`block_hash`, the engine's opaque key). [`RadixTree::find_matches`] walks a query
//! of local hashes from the root and reports, per rank, the length of the prefix it holds.
//!
//! # Semantics (shared with the reference)
//!
//! * A `stored` event appends its blocks under the node of `parent_hash`, looked up in the
//!   emitting rank's own blocks (`None` = the root). An unknown parent rejects the whole
//!   event ([`crate::Error::ParentBlockNotFound`]) and leaves the tree unchanged; so does a
//!   chain that contains its own parent ([`crate::Error::InvalidBlockSequence`]).
//! * The same content under the same prefix is **one block**, whichever ranks store it and
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
//! The tree has **one node per run**: a chain of blocks with no branch inside it (a
//! conversation's turns, a shared prompt up to where the prompts diverge). Until round 18
//! of `docs/benchmarks/kv_indexer.md` it had one node per block, and executed 2.7x the
//! reference's instructions per block applied; on runs, 0.60x (100k blocks, round 21).
//!
//! * Blocks are ids into three arrays: `local` (`tokens_hash`), `run_of` (the block's run)
//!   and `key` (the block's canonical external hash, below; valid where the block's bit in
//!   `keyed` is set): 20 bytes and a bit a block. A run's blocks are the consecutive ids
//!   `start..start + len`, so a query compares a run's contents with the prompt as one
//!   slice, and a store that walks blocks already in the tree reads their `tokens_hash`
//!   and key in address order. A run reserves `cap >= len` ids: cut back (its deepest
//!   blocks evicted), it keeps them until it is less than half full, so that a
//!   conversation's blocks evicted and stored again cost no id bookkeeping; it grows in
//!   place while the ids after it are free. Free ids are kept as maximal ranges tagged in
//!   the arrays themselves (`run_of` marks them free, `local` holds a range's length at
//!   both ends), found from the ids beside them and by size class (`tree/free_ids.rs`:
//!   O(1) to take or return a range).
//! * `runs`: per run its first id, length, reservation, parent run, its children (a
//!   sibling list) and its **holders as prefix lengths**: `(worker slot, n)` for each rank
//!   that holds the run's first `n` blocks (the first two in the run's record, more on the
//!   heap), and the longest, `held`. A store that extends a
//!   rank's blocks along a run raises one length; evicting a rank's deepest block lowers
//!   one. A rank that releases an inner block of a run but keeps deeper ones (a hole)
//!   splits the run after the block: the blocks it keeps are then a run of their own,
//!   which it holds without its parent's last block and which a query therefore never
//!   reaches for it. A chain that diverges inside a run splits it there. A split moves no
//!   block: the tail's ids are renamed to the new run.
//! * `children`: the runs by `(parent run, first tokens_hash)` (`NIL` for the root's).
//! * `hashes`: one tag table for all ranks (`tree/ext_table.rs`: open addressing, 8-byte
//!   buckets of block id and the high half of the mixed key; grown incrementally, so no
//!   event rehashes it), finding blocks by external hash. An engine's block hash is a hash
//!   of the block's token sequence, so the ranks that hold a block hold it under the same
//!   hash: the block's *canonical key*, the first hash a residency brings to it while it
//!   has none (and no other block has that key). "Does this rank hold this hash?" is a
//!   probe for the key and a look at the rank's length in the block's run, and a store
//!   that walks a block already keyed by its hash needs no probe at all. A residency under
//!   another hash (another salt, a collision) is its rank's *own*, kept whole in `own`
//!   (`(slot, hash) -> block`, with `no_canon`: the `(slot, block)` pairs held under own
//!   hashes only); both are empty in the common case, where stores and removes take a
//!   path that never looks at them. A block leaves `hashes` with its last canonical
//!   residency. The tree keeps no index by rank, so a `cleared` rank (or a removed worker)
//!   is a pass over the runs. A `removed` event walks down a run: the hashes after one
//!   that are the keys of the blocks before it are removed without probes, the rank's
//!   length cut once.
//! * Before an event's probes the `hashes` buckets of all its hashes are prefetched, so
//!   that their cache misses overlap.
//!
//! **Exact reclamation.** At the end of every event the runs it shortened are cut back to
//! their longest holder when nothing hangs off them, and freed (with their childless,
//! unheld ancestors) when no rank holds any of their blocks; a rank with no blocks left
//! is forgotten; once the last block is gone every array and table returns to its initial
//! (empty) size. Memory is bounded by the peak number of live blocks, not by history.
//!
//! Invariants (checked by [`RadixTree::check_invariants`] in the tests):
//! 1. every live run is in `children` under `(parent, first tokens_hash)` and listed once
//!    by its parent; its blocks name it in `run_of`; its reserved ids are unused; every
//!    free id is in exactly one maximal free range;
//! 2. a run lists each holding rank once, with a length in `1..=len`, and `held` is the
//!    longest; a childless run is cut back to `held` (so a live run has a holder or a
//!    child);
//! 3. a block is keyed exactly when some rank holds it under its canonical key, and
//!    `hashes` has one entry per keyed block; `own` names blocks its ranks hold, counted
//!    per `(slot, block)`; every block a rank holds, it holds under some hash;
//! 4. `len()` equals the number of residencies, and each rank's count its own.
//!
//! # Limits
//!
//! Ids are 32-bit, so the tree has fixed limits; past one it panics with a message naming
//! it: 2^32 - 2 block ids (160 GiB of blocks), 2^32 - 2 runs, 2^32 - 2 worker ranks at
//! once, 2^32 buckets in the tag table.
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

mod scores;
#[cfg(test)]
mod tests;
mod tree;

use std::time::{Duration, Instant};

use parking_lot::{RwLock, RwLockReadGuard};

use crate::error::Result;
use crate::hashing::LocalBlockHash;
use crate::protocols::{KvCacheEvent, RouterEvent, decode_json_event};

pub use scores::{IndexSlots, OverlapScores};
pub use tree::{EventCounters, RadixTree};

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
    /// While an event holds the lock, the query spins (up to `READ_SPIN`) before it
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
