//! Free node ids kept as maximal runs of consecutive ids, so that a chain stored after
//! evictions gets consecutive ids again (and its blocks stay *implicit* children: no
//! child-table entry, no hash probe, and a query walks them in address order; see the
//! module docs of [`crate::indexer`]).
//!
//! A boundary-tag allocator over the node arena, with no memory of its own: a run's
//! bookkeeping lives in its freed nodes (which nothing else reads: a freed node's `parent`
//! is `NIL`, and every reader of a node checks its parent first; reuse overwrites it). The
//! first node of a run holds its length and its next link in a list of runs of the same
//! size class (low and high halves of its [`Node`]'s `local`) and the previous one (its
//! [`Cold`]'s `link`); the last node holds the run's start (its [`Cold`]'s `slot`). A node is free when its `parent` (in [`Node`]) is
//! `NIL` and it is not the root, so freeing an id
//! merges it with the runs on either side in O(1) (runs are always maximal), and
//! allocation takes a run of at least the requested length from the smallest size class
//! that guarantees one (O(1) with a bit mask of non-empty classes): a chain of `n` new
//! blocks gets `n` consecutive ids whenever a free run that long exists. An event that
//! only frees ids links them at its end, a stretch of consecutive ids at a time
//! ([`FreeRuns::begin_batch`]).

use super::arena::Arena;
use super::{Cold, NIL, Node};

/// `parent` of an id taken from a run but not yet written by the caller (see
/// [`FreeRuns::take_run_at`]): neither free (`NIL`) nor any node's id.
pub(super) const TAKEN: u32 = NIL - 1;

/// A run head's length (the low half of its `local`).
#[inline]
const fn run_len(n: &Node) -> u32 {
    n.local as u32
}

/// A run head's next run in its class (the high half of its `local`).
#[inline]
const fn run_next(n: &Node) -> u32 {
    (n.local >> 32) as u32
}

#[inline]
fn set_run_next(n: &mut Node, next: u32) {
    n.local = (n.local & 0xffff_ffff) | (u64::from(next) << 32);
}

/// Free ids are *scarce* while fewer than `1 / SCARCE` of the arena's ids are free: a chain
/// longer than every free run is then appended to the arena whole, not split over the
/// largest run and the ones after it. Each split is a branch step for every later query
/// walking the chain (a child-table probe and a node load, dependent misses). Round 7 of
/// `docs/benchmarks/kv_indexer.md`: at 1M live blocks 16 (the previous value) left 0.69
/// branch steps in a 100-block query, 8 leaves 0.08, and the p99 of those queries from a
/// cold cache halved (4.7 / 3.9 -> 2.3 / 2.0 us in two runs), for +0.9 B/block of free ids
/// (+1.6 at 100k). Round 8: 4 instead of 8 takes find p99 at 100k from ~0.85x to ~0.73x
/// the reference's (16 workers; 0.87x -> 0.62x with 1,000 workers, and 1.08x -> 0.75x at
/// 1M there) for +3 B/block at 100k (46 -> 49) and none from 1M up with 16 workers (+3 at
/// 1M with 1,000): routing latency over a few hundred kilobytes.
const SCARCE: usize = 4;

/// Largest batch list kept between events (ids): an eviction's worth.
const PENDING_KEPT: usize = 1024;

/// Size classes: class `c` holds the runs of length `2^c ..= 2^(c+1) - 1`.
const CLASSES: usize = 32;

/// The free ids of the node arena, as maximal runs (see the module docs).
#[derive(Debug)]
pub(super) struct FreeRuns {
    /// First run of each size class (`NIL` when empty).
    heads: [u32; CLASSES],
    /// Bit `c` set when class `c` is not empty.
    nonempty: u32,
    /// Number of free ids (those in `pending` included).
    count: usize,
    /// Whether a batch is open (see [`Self::begin_batch`]).
    batch: bool,
    /// Ids freed while the batch is open, not yet in any run.
    pending: Vec<u32>,
}

impl Default for FreeRuns {
    fn default() -> Self {
        Self {
            heads: [NIL; CLASSES],
            nonempty: 0,
            count: 0,
            batch: false,
            pending: Vec::new(),
        }
    }
}

#[inline]
const fn class_of(len: u32) -> usize {
    (31 - len.leading_zeros()) as usize
}

/// Whether node `id` is free (see the module docs).
#[inline]
fn is_free(nodes: &Arena<Node>, id: usize) -> bool {
    id != 0 && nodes.get(id).is_some_and(|n| n.parent == NIL)
}

impl FreeRuns {
    /// Number of free ids.
    pub(super) const fn len(&self) -> usize {
        self.count
    }

    /// Bytes reserved: the batch list's (the runs' bookkeeping lives in the freed nodes).
    pub(super) fn heap_bytes(&self) -> usize {
        self.pending.capacity() * size_of::<u32>()
    }

    /// Until [`Self::end_batch`], freed ids are only collected (counted free, `parent`
    /// already `NIL`, in no run). For events that only free ids (a `removed` or `cleared`
    /// event takes none), so no allocation can see them missing from the runs.
    ///
    /// Why: an eviction frees a chain deepest block first, and each id freed on its own
    /// merged with the run after it: an unlink and a link, each writing the run headers of
    /// its list neighbours (anywhere in the arena), once per block. A batch links each
    /// stretch of consecutive freed ids once.
    pub(super) fn begin_batch(&mut self) {
        debug_assert!(self.pending.is_empty());
        self.batch = true;
    }

    /// Close the batch: link the collected ids as runs, each stretch of consecutive ids
    /// merged with the runs on either side.
    pub(super) fn end_batch(&mut self, nodes: &mut Arena<Node>, cold: &mut Arena<Cold>) {
        self.batch = false;
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        // Evictions free deepest first: mostly descending, which the sort takes as one run.
        pending.sort_unstable();
        let mut rest = pending.as_slice();
        while let Some(&start) = rest.first() {
            let n = rest
                .iter()
                .zip(start..)
                .take_while(|&(&id, want)| id == want)
                .count();
            // The stretch is maximal, so the ids on either side are in runs if free.
            self.link_merged(nodes, cold, start, n as u32);
            rest = &rest[n..];
        }
        // Kept for the next event unless a large one (a `cleared` rank, a long eviction)
        // grew it: that memory would stay with the tree until it empties.
        if pending.capacity() <= PENDING_KEPT {
            pending.clear();
            self.pending = pending;
        }
    }

    /// Link the free ids `[id, id + n)` (in no run) as a run, merged with the runs that
    /// end right before it and start right after it.
    fn link_merged(&mut self, nodes: &mut Arena<Node>, cold: &mut Arena<Cold>, id: u32, n: u32) {
        let (mut start, mut len) = (id, n);
        if is_free(nodes, id as usize - 1) {
            // `id - 1` ends a run.
            let s = cold[id as usize - 1].slot;
            let l = self.unlink(nodes, cold, s);
            start = s;
            len += l;
        }
        if is_free(nodes, (id + n) as usize) {
            // `id + n` starts a run.
            len += self.unlink(nodes, cold, id + n);
        }
        self.link(nodes, cold, start, len);
    }

    /// Record the run `[start, start + len)` (its nodes are free) and link it in its class.
    fn link(&mut self, nodes: &mut Arena<Node>, cold: &mut Arena<Cold>, start: u32, len: u32) {
        let c = class_of(len);
        let next = self.heads[c];
        nodes[start as usize].local = u64::from(len) | (u64::from(next) << 32);
        cold[start as usize].link = NIL;
        cold[(start + len - 1) as usize].slot = start;
        if next != NIL {
            cold[next as usize].link = start;
        }
        self.heads[c] = start;
        self.nonempty |= 1 << c;
    }

    /// Unlink the run starting at `start` from its class list; returns its length.
    fn unlink(&mut self, nodes: &mut Arena<Node>, cold: &mut Arena<Cold>, start: u32) -> u32 {
        let h = nodes[start as usize];
        let (len, next, prev) = (run_len(&h), run_next(&h), cold[start as usize].link);
        let c = class_of(len);
        if prev == NIL {
            self.heads[c] = next;
            if next == NIL {
                self.nonempty &= !(1 << c);
            }
        } else {
            set_run_next(&mut nodes[prev as usize], next);
        }
        if next != NIL {
            cold[next as usize].link = prev;
        }
        len
    }

    /// Free `id` (a live node that the caller has just detached: `parent` already `NIL`),
    /// merging it with the free runs on either side.
    pub(super) fn push(&mut self, nodes: &mut Arena<Node>, cold: &mut Arena<Cold>, id: u32) {
        debug_assert!(id != 0 && nodes[id as usize].parent == NIL);
        self.count += 1;
        if self.batch {
            self.pending.push(id);
            return;
        }
        self.link_merged(nodes, cold, id, 1);
    }

    /// Take `id` and the ids after it in its run, up to `max` of them, if `id` is free and
    /// starts its run (as the slot right after a live node does); returns how many (0 when
    /// it is not a free run's start). The ids taken are marked [`TAKEN`] until the caller
    /// overwrites them: no longer free, so that an id freed next to them while the chain
    /// is being stored (a store that moves one of its hashes releases a node) does not
    /// merge with them as if they were a run (it did: a corrupt run, then an index out of
    /// bounds). A chain takes its ids in one call: one unlink and one link, which touch
    /// the run headers of its list neighbours (anywhere in the arena), instead of one of
    /// each per id.
    pub(super) fn take_run_at(
        &mut self,
        nodes: &mut Arena<Node>,
        cold: &mut Arena<Cold>,
        id: u32,
        max: u32,
    ) -> u32 {
        debug_assert!(max > 0);
        if !is_free(nodes, id as usize) || is_free(nodes, id as usize - 1) {
            return 0;
        }
        let len = self.unlink(nodes, cold, id);
        let n = len.min(max);
        if len > n {
            self.link(nodes, cold, id + n, len - n);
        }
        for i in id..id + n {
            nodes[i as usize].parent = TAKEN;
        }
        self.count -= n as usize;
        n
    }

    /// [`Self::take_run_at`] for one id (tests).
    #[cfg(test)]
    pub(super) fn take_at(
        &mut self,
        nodes: &mut Arena<Node>,
        cold: &mut Arena<Cold>,
        id: u32,
    ) -> bool {
        self.take_run_at(nodes, cold, id, 1) == 1
    }

    /// [`Self::pop_run`] for one id (tests).
    #[cfg(test)]
    pub(super) fn pop(
        &mut self,
        nodes: &mut Arena<Node>,
        cold: &mut Arena<Cold>,
        want: u32,
    ) -> Option<u32> {
        self.pop_run(nodes, cold, want, 1).map(|(start, _)| start)
    }

    /// Choose a run of at least `want` ids if there is one (the smallest size class that
    /// guarantees it, or the first run of the class below when it is long enough), and
    /// take up to `max` ids from its start (see [`Self::take_run_at`]); returns the first
    /// and how many. Otherwise `None` when free ids are scarce (under 1/[`SCARCE`] of the
    /// arena): the caller appends the chain to the arena instead of splitting it over
    /// short runs, which shorter chains will use; else the start of a run of the largest
    /// class. The rest of the run stays free.
    pub(super) fn pop_run(
        &mut self,
        nodes: &mut Arena<Node>,
        cold: &mut Arena<Cold>,
        want: u32,
        max: u32,
    ) -> Option<(u32, u32)> {
        if self.nonempty == 0 {
            return None;
        }
        let want = want.max(1);
        // Smallest class whose every run is at least `want` long.
        let c0 = if want == 1 {
            0
        } else {
            32 - (want - 1).leading_zeros()
        };
        let fit = if c0 < 32 {
            self.nonempty & !((1u32 << c0) - 1)
        } else {
            0
        };
        // Below that class, its first run may be long enough too.
        let below = c0.checked_sub(1).map_or(NIL, |c| self.heads[c as usize]);
        let c = if fit != 0 {
            fit.trailing_zeros()
        } else if below != NIL && run_len(&nodes[below as usize]) >= want {
            c0 - 1
        } else if self.count * SCARCE < nodes.len() {
            return None;
        } else {
            31 - self.nonempty.leading_zeros()
        };
        let start = self.heads[c as usize];
        let taken = self.take_run_at(nodes, cold, start, max);
        debug_assert!(taken > 0);
        Some((start, taken))
    }

    /// Every free id, run by run, with a check of the runs' bookkeeping (for the
    /// invariant checks): runs are maximal, in the right class, and their tags agree.
    pub(super) fn checked_ids(&self, nodes: &Arena<Node>, cold: &Arena<Cold>) -> Vec<u32> {
        assert!(
            !self.batch && self.pending.is_empty(),
            "a free batch left open"
        );
        let mut ids = Vec::new();
        for (c, &head) in self.heads.iter().enumerate() {
            assert_eq!(head == NIL, self.nonempty & (1 << c) == 0, "class mask {c}");
            let mut prev = NIL;
            let mut r = head;
            while r != NIL {
                let h = &nodes[r as usize];
                assert_eq!(cold[r as usize].link, prev, "run list links");
                assert_eq!(class_of(run_len(h)), c, "run class");
                let end = r + run_len(h);
                assert_eq!(cold[(end - 1) as usize].slot, r, "run tail tag");
                assert!(!is_free(nodes, r as usize - 1), "run not merged below");
                assert!(!is_free(nodes, end as usize), "run not merged above");
                for id in r..end {
                    assert!(is_free(nodes, id as usize), "run holds a live node");
                    ids.push(id);
                }
                prev = r;
                r = run_next(h);
            }
        }
        assert_eq!(ids.len(), self.count, "free count");
        ids
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::super::arena::Arena;
    use super::super::{Cold, EMPTY_COLD, NIL, Node, RadixTree};
    use super::{FreeRuns, PENDING_KEPT, SCARCE};

    fn arena(n: usize) -> (Arena<Node>, Arena<Cold>) {
        let nodes = (0..n)
            .map(|i| {
                let mut x = RadixTree::root();
                // Live (any non-NIL parent) except the root.
                x.parent = if i == 0 { NIL } else { 0 };
                x
            })
            .collect();
        (nodes, std::iter::repeat_n(EMPTY_COLD, n).collect())
    }

    fn free(runs: &mut FreeRuns, nodes: &mut Arena<Node>, cold: &mut Arena<Cold>, id: u32) {
        nodes[id as usize].parent = NIL;
        runs.push(nodes, cold, id);
    }

    fn alloc(nodes: &mut Arena<Node>, id: u32) {
        nodes[id as usize].parent = 0;
    }

    proptest! {
        /// Against a set of ids: the same ids are free, runs are maximal and consistent,
        /// `take_run_at` takes exactly from free run starts, as many ids as asked and the
        /// run holds, and `pop_run` takes from a run of at least the requested length when
        /// the model has one (the even requests take one id, the odd ones up to `want`).
        /// Op 3 frees up to `want` ids in one batch (`begin_batch` / `end_batch`), in an
        /// order that mixes stretches, gaps and ids next to existing runs.
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((0u8..4, 1u32..64, 1u32..20), 0..300)) {
            let (mut nodes, mut cold) = arena(64);
            let mut runs = FreeRuns::default();
            let mut model = BTreeSet::new();
            for (op, id, want) in ops {
                match op {
                    0 => if model.insert(id) { free(&mut runs, &mut nodes, &mut cold, id) },
                    3 => {
                        runs.begin_batch();
                        for k in 0..want {
                            let x = 1 + (id + k * (1 + want % 3)) % 63;
                            if model.insert(x) {
                                free(&mut runs, &mut nodes, &mut cold, x);
                            }
                        }
                        prop_assert_eq!(runs.len(), model.len());
                        runs.end_batch(&mut nodes, &mut cold);
                    }
                    1 => {
                        let starts = model.contains(&id) && !model.contains(&(id - 1));
                        let len = (id..).take_while(|x| model.contains(x)).count() as u32;
                        let took = runs.take_run_at(&mut nodes, &mut cold, id, want);
                        prop_assert_eq!(took, if starts { len.min(want) } else { 0 });
                        for x in id..id + took {
                            alloc(&mut nodes, x);
                            prop_assert!(model.remove(&x));
                        }
                    }
                    _ => {
                        // The longest run in the model.
                        let (mut best, mut cur, mut last) = (0u32, 0u32, None);
                        for &x in &model {
                            cur = if last == Some(x - 1) { cur + 1 } else { 1 };
                            best = best.max(cur);
                            last = Some(x);
                        }
                        let max = if want % 2 == 0 { 1 } else { want };
                        match runs.pop_run(&mut nodes, &mut cold, want, max) {
                            Some((id, took)) => {
                                prop_assert!(model.contains(&id) && !model.contains(&(id - 1)));
                                let len = (id..).take_while(|x| model.contains(x)).count() as u32;
                                if best >= want.next_power_of_two() {
                                    prop_assert!(len >= want, "run of {} for {}", len, want);
                                }
                                prop_assert_eq!(took, len.min(max));
                                for x in id..id + took {
                                    alloc(&mut nodes, x);
                                    prop_assert!(model.remove(&x));
                                }
                            }
                            // Only when free ids are scarce and no run's size class
                            // guarantees `want`.
                            None => prop_assert!(
                                model.is_empty()
                                    || (best < want.next_power_of_two()
                                        && model.len() * SCARCE < nodes.len())
                            ),
                        }
                    }
                }
                let mut listed = runs.checked_ids(&nodes, &cold);
                listed.sort_unstable();
                prop_assert_eq!(listed, model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(runs.len(), model.len());
            }
        }
    }

    /// A batch links its stretches like single frees would, and a large batch does not
    /// leave its list's memory with the tree.
    #[test]
    fn a_batch_links_stretches_and_keeps_no_large_list() {
        let n = 3 * PENDING_KEPT;
        let (mut nodes, mut cold) = arena(n + 2);
        let mut runs = FreeRuns::default();
        free(&mut runs, &mut nodes, &mut cold, 5);
        runs.begin_batch();
        // Deepest first, next to the run at 5, then a gap and a stretch of two.
        for id in (1..5).rev().chain([9, 8]) {
            free(&mut runs, &mut nodes, &mut cold, id);
        }
        runs.end_batch(&mut nodes, &mut cold);
        assert_eq!(runs.checked_ids(&nodes, &cold).len(), 7);
        assert_eq!(
            runs.pop(&mut nodes, &mut cold, 5),
            Some(1),
            "one run of 1..=5"
        );
        alloc(&mut nodes, 1);
        assert!(runs.heap_bytes() > 0, "a small batch's list is kept");
        runs.begin_batch();
        for id in (10..=n as u32).rev() {
            free(&mut runs, &mut nodes, &mut cold, id);
        }
        runs.end_batch(&mut nodes, &mut cold);
        assert_eq!(runs.heap_bytes(), 0);
        assert_eq!(runs.len(), 4 + 2 + n - 9);
        runs.checked_ids(&nodes, &cold);
    }

    #[test]
    fn chain_freed_deepest_first_is_reused_in_order() {
        let (mut nodes, mut cold) = arena(32);
        let mut runs = FreeRuns::default();
        for id in (10..20).rev() {
            free(&mut runs, &mut nodes, &mut cold, id);
        }
        // One run of 10, wherever the ids were freed from.
        assert_eq!(runs.checked_ids(&nodes, &cold).len(), 10);
        assert_eq!(runs.nonempty.count_ones(), 1);
        assert_eq!(runs.pop(&mut nodes, &mut cold, 10), Some(10));
        alloc(&mut nodes, 10);
        for id in 11..20 {
            assert!(runs.take_at(&mut nodes, &mut cold, id));
            alloc(&mut nodes, id);
        }
        assert_eq!(runs.len(), 0);
    }

    #[test]
    fn a_long_chain_gets_a_run_that_fits() {
        // 48 ids, 15 then 14 of them free: not scarce (see `SCARCE`), so a chain longer
        // than every run is split, not appended.
        let (mut nodes, mut cold) = arena(48);
        const { assert!(14 * SCARCE >= 48) };
        let mut runs = FreeRuns::default();
        // Runs of 2 (at 2), 9 (at 10) and 4 (at 30), freed out of order.
        for id in [3, 2, 12, 10, 11, 14, 13, 18, 15, 17, 16, 31, 33, 30, 32] {
            free(&mut runs, &mut nodes, &mut cold, id);
        }
        let mut pop = |want| {
            let id = runs.pop(&mut nodes, &mut cold, want);
            if let Some(id) = id {
                alloc(&mut nodes, id);
            }
            id
        };
        assert_eq!(pop(8), Some(10));
        // Nothing fits 30: the longest run's class.
        assert_eq!(pop(30), Some(11));
        // The rest of that run went back to the front of its (smaller) class.
        assert_eq!(pop(3), Some(12));
        assert_eq!(pop(1), Some(2));
        assert_eq!(
            runs.checked_ids(&nodes, &cold),
            [3, 13, 14, 15, 16, 17, 18, 30, 31, 32, 33]
        );
    }
}
