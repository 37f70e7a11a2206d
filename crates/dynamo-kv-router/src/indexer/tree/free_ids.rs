//! The free block ids of the run tree, as maximal ranges, kept in the block arrays
//! themselves (boundary tags).
//!
//! A run's blocks are consecutive ids, so a new run needs a free range of its length and a
//! freed run returns one, merged with its free neighbours. Every id of a free range has
//! [`FREE`] for its run (`run_of`), and the range's first and last ids hold its length in
//! `local` (a free id has no tokens hash): the range after a freed run is found by
//! reading the id after it, the range before it by reading the id before it and that id's
//! length. For allocation, the range starts are also listed by size class
//! (`floor(log2(len))`) in one stack per class, whose entries are checked when popped (a
//! range merged or taken since leaves its entry behind, skipped then, and the stacks are
//! swept once they hold twice the live ranges).
//!
//! The sweep is incremental: [`SWEEP_STEP`] entries per free-id operation, stale ones and
//! duplicates swapped out. Compacting every stack at once (a validity read per entry, a
//! random one into the arrays, then a sort to drop duplicates) was the largest apply event
//! at 1M blocks with 1,000 workers: 0.35-0.6 ms under the write lock, for a one-block
//! removal. A duplicate is recognised by a mark the sweep leaves on the range it keeps
//! (the pass's number in the high half of the range's first `local`; only the low half is
//! the length, and listing a range again writes it whole, clearing the mark).
//!
//! A B-tree by length (a best fit) cost ~1,000 instructions per run created or freed, a
//! sixth of the tree's apply at 100k blocks; two hash maps (start -> length, end -> start)
//! beside the class stacks ~300 per run created and ~400 per run freed (8 % of the apply,
//! round 20); the tags, a few reads and writes next to the ids the run had or gets.

use super::arena::Arena;
use super::state::{FREE, FreeIds, NIL, RadixTree};

/// Entries of the class stacks checked per free-id operation (a free, an allocation)
/// while a sweep runs: a pass ends after `listed / SWEEP_STEP` operations, each listing at
/// most one range, long before the stacks could double again. (One under `cfg(test)`, so
/// that the property test's stacks are mostly mid-sweep.)
const SWEEP_STEP: usize = if cfg!(test) { 1 } else { 32 };
/// Entries beyond twice the ranges before a sweep starts (tiny stacks are not swept).
const SWEEP_SLACK: usize = if cfg!(test) { 2 } else { 64 };

/// Size class of a range of `len` ids (`len >= 1`).
const fn class(len: u32) -> usize {
    (31 - len.leading_zeros()) as usize
}

/// The length of the free range starting at `start`, if one does.
fn range_at(run_of: &Arena<u32>, local: &Arena<u64>, start: u32) -> Option<u32> {
    let s = start as usize;
    let starts = s < run_of.len() && run_of[s] == FREE && (s == 0 || run_of[s - 1] != FREE);
    starts.then(|| local[s] as u32)
}

/// The start of the free range that ends just before `end`, if one does (`end` itself is
/// not free, or is the arrays' end).
fn range_ending_at(run_of: &Arena<u32>, local: &Arena<u64>, end: u32) -> Option<u32> {
    let e = end as usize;
    (e > 0 && e <= run_of.len() && run_of[e - 1] == FREE).then(|| end - local[e - 1] as u32)
}

impl FreeIds {
    /// Number of free ranges.
    pub(super) const fn len(&self) -> usize {
        self.ranges
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.classes.capacity() * std::mem::size_of::<Vec<u32>>()
            + self.classes.iter().map(|c| c.capacity() * 4).sum::<usize>()
    }
}

impl RadixTree {
    /// Every free range as `(start, len)`, in order (a scan of the arrays: for checks).
    pub(super) fn free_ranges(&self) -> Vec<(u32, u32)> {
        let n = self.run_of.len();
        let mut out = Vec::new();
        let mut i = 0;
        while i < n {
            if self.run_of[i] == FREE {
                let s = i;
                while i < n && self.run_of[i] == FREE {
                    i += 1;
                }
                out.push((s as u32, (i - s) as u32));
            } else {
                i += 1;
            }
        }
        out
    }

    /// The length of the free range starting at `start`, if one does.
    pub(super) fn free_range_at(&self, start: u32) -> Option<u32> {
        range_at(&self.run_of, &self.local, start)
    }

    /// The start of the free range ending just before `end` (not free itself), if any.
    pub(super) fn free_range_ending_at(&self, end: u32) -> Option<u32> {
        range_ending_at(&self.run_of, &self.local, end)
    }

    /// Make ids `start..start + len`, all [`FREE`] already and touching no other free
    /// range, one range: its tags and its class entry.
    fn put_range(&mut self, start: u32, len: u32) {
        self.local[start as usize] = u64::from(len);
        self.local[(start + len - 1) as usize] = u64::from(len);
        let f = &mut self.free;
        f.ranges += 1;
        let c = class(len);
        if f.classes.len() <= c {
            f.classes.resize_with(c + 1, Vec::new);
        }
        f.classes[c].push(start);
        f.listed += 1;
        if f.sweep.is_none() && f.listed > 2 * f.ranges + SWEEP_SLACK {
            f.pass = f.pass.checked_add(1).unwrap_or(1);
            f.sweep = Some((0, 0));
        }
    }

    /// The first `n` ids of the free range at `start`, of length `len >= n`, taken out
    /// (their `run_of` is the caller's to write); the rest stays a range.
    fn take_front(&mut self, start: u32, len: u32, n: u32) -> u32 {
        self.free.ranges -= 1;
        if len > n {
            self.put_range(start + n, len - n);
        }
        start
    }

    /// `n` consecutive free ids (to be written by the caller): a free range that fits
    /// (first fit by size class), else the end of the arrays.
    pub(super) fn alloc_ids(&mut self, n: u32) -> u32 {
        if let Some(start) = self.alloc_free(n) {
            return start;
        }
        let start = self.local.len() as u32;
        // A free range at the end is extended rather than left behind.
        if let Some(s) = self.free_range_ending_at(start) {
            let have = start - s;
            if have >= n {
                return self.take_front(s, have, n);
            }
            self.free.ranges -= 1;
            self.grow(n - have);
            return s;
        }
        assert!(
            start as usize + (n as usize) < FREE as usize,
            "run tree block capacity exceeded"
        );
        self.grow(n);
        start
    }

    /// Append `n` unused ids to the block arrays (allocation past the end).
    fn grow(&mut self, n: u32) {
        let n = n as usize;
        self.local.extend_with(n, 0);
        self.run_of.extend_with(n, NIL);
        self.key.extend_with(n, 0);
        let words = self.local.len().div_ceil(64);
        self.keyed.extend_with(words - self.keyed.len(), 0);
    }

    /// `n` ids from a range that fits, if any.
    fn alloc_free(&mut self, n: u32) -> Option<u32> {
        self.sweep_free();
        let fits = class(n);
        // Every range of a class above `floor(log2(n))` fits; in that class, only the top
        // entry is looked at.
        if let Some(&s) = self.free.classes.get(fits).and_then(|c| c.last())
            && let Some(len) = self
                .free_range_at(s)
                .filter(|&l| l >= n && class(l) == fits)
        {
            self.free.classes[fits].pop();
            self.free.listed -= 1;
            return Some(self.take_front(s, len, n));
        }
        for c in fits + 1..self.free.classes.len() {
            while let Some(s) = self.free.classes[c].pop() {
                self.free.listed -= 1;
                if let Some(len) = self.free_range_at(s).filter(|&l| class(l) == c) {
                    return Some(self.take_front(s, len, n));
                }
            }
        }
        None
    }

    /// Take the `n` ids from `at` on (to be written by the caller) when they are free, or
    /// past the end.
    pub(super) fn take_ids_at(&mut self, at: u32, n: u32) -> bool {
        self.sweep_free();
        if at as usize == self.local.len() {
            self.grow(n);
            return true;
        }
        match self.free_range_at(at) {
            Some(len) if len >= n => {
                self.take_front(at, len, n);
                true
            }
            _ => false,
        }
    }

    /// Return ids `start..start + n` (unused) to the free ranges, merged with the ranges
    /// around them.
    pub(super) fn free_ids(&mut self, start: u32, n: u32) {
        self.sweep_free();
        self.run_of.fill(start as usize, n as usize, FREE);
        let (mut s, mut len) = (start, n);
        if let Some(before) = self.free_range_ending_at(start) {
            len += start - before;
            s = before;
            self.free.ranges -= 1;
        }
        // (Not `free_range_at`: the id before it is free now.) A range there starts there:
        // it is maximal, and the id before it was in use.
        let after = (start + n) as usize;
        if after < self.run_of.len() && self.run_of[after] == FREE {
            len += self.local[after] as u32;
            self.free.ranges -= 1;
        }
        self.put_range(s, len);
    }

    /// A step of the sweep in progress, if any. Called where an operation on the free ids
    /// starts, never inside one: while ids just taken are not written yet (`take_front`'s
    /// caller writes them), the range after them reads as no range's start, and a check
    /// then would drop its entry for good. (The one-shot compaction this replaced ran
    /// there, and so could leave a range unlisted, its ids never reused.)
    #[inline]
    fn sweep_free(&mut self) {
        if self.free.sweep.is_some() {
            self.sweep_step();
        }
    }

    /// The next [`SWEEP_STEP`] entries of the sweep: an entry whose range is gone (or now
    /// of another class), or whose range this pass already kept, is swapped out (the
    /// stack's top takes its place and is checked next); the others are kept and their
    /// range marked.
    fn sweep_step(&mut self) {
        let (run_of, local, f) = (&self.run_of, &mut self.local, &mut self.free);
        let Some((mut c, mut i)) = f.sweep else {
            return;
        };
        let mark = u64::from(f.pass) << 32;
        let mut budget = SWEEP_STEP;
        while budget > 0 {
            let Some(starts) = f.classes.get_mut(c) else {
                f.sweep = None;
                return;
            };
            let Some(&s) = starts.get(i) else {
                (c, i) = (c + 1, 0);
                continue;
            };
            budget -= 1;
            let kept = range_at(run_of, local, s)
                .is_some_and(|l| class(l) == c && local[s as usize] >> 32 != u64::from(f.pass));
            if kept {
                local[s as usize] = (local[s as usize] & u64::from(u32::MAX)) | mark;
                i += 1;
            } else {
                starts.swap_remove(i);
                f.listed -= 1;
            }
        }
        f.sweep = Some((c, i));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{FREE, class};
    use crate::indexer::tree::RadixTree;

    /// The maximal runs of free ids in `free` as `(start, len)`, in order.
    fn runs(free: &[bool]) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < free.len() {
            if free[i] {
                let s = i;
                while i < free.len() && free[i] {
                    i += 1;
                }
                out.push((s as u32, (i - s) as u32));
            } else {
                i += 1;
            }
        }
        out
    }

    proptest! {
        /// Against a bit per id, over 64 ids of a tree's arrays (an id in use has run 0):
        /// after every operation the ranges are exactly the maximal runs of free ids, found
        /// by start and by end through their tags; an allocation takes free ids and fails
        /// only when no range of a larger size class exists; `take_ids_at` succeeds exactly
        /// when a range starts there and holds the ids. (The stale class entries are
        /// exercised too: 64 ids, many merges between allocations.) Allocations past the
        /// end are the tree's model tests'.
        #[test]
        fn behaves_like_a_bitmap(ops in proptest::collection::vec((0u8..3, 0u32..64, 1u32..12), 1..300)) {
            let mut t = RadixTree::default();
            t.grow(64);
            t.run_of.fill(0, 64, 0);
            let mut free = vec![false; 64];
            for (op, at, n) in ops {
                let end = (at + n).min(64);
                match op {
                    // Free `at..end` where it is all in use.
                    0 if (at..end).all(|i| !free[i as usize]) => {
                        t.free_ids(at, end - at);
                        for i in at..end {
                            free[i as usize] = true;
                        }
                    }
                    1 => match t.alloc_free(n) {
                        Some(s) => {
                            prop_assert!((s..s + n).all(|i| free[i as usize]), "alloc {} at {}", n, s);
                            t.run_of.fill(s as usize, n as usize, 0);
                            for i in s..s + n {
                                free[i as usize] = false;
                            }
                        }
                        None => prop_assert!(
                            runs(&free).iter().all(|&(_, l)| class(l) <= class(n)),
                            "alloc {} failed with a larger range free", n
                        ),
                    },
                    2 => {
                        let starts = at < 64 && free[at as usize] && (at == 0 || !free[at as usize - 1]);
                        let fits = end - at == n && (at..end).all(|i| free[i as usize]);
                        let got = t.take_ids_at(at, n);
                        prop_assert_eq!(got, starts && fits);
                        if got {
                            t.run_of.fill(at as usize, n as usize, 0);
                            for i in at..end {
                                free[i as usize] = false;
                            }
                        }
                    }
                    _ => {}
                }
                let want = runs(&free);
                prop_assert_eq!(&t.free_ranges(), &want);
                prop_assert_eq!(t.free.len(), want.len());
                for &(s, l) in &want {
                    prop_assert_eq!(t.free_range_at(s), Some(l));
                    prop_assert_eq!(t.free_range_ending_at(s + l), Some(s));
                }
                for i in 0..64u32 {
                    prop_assert_eq!(t.run_of[i as usize] == FREE, free[i as usize]);
                }
                prop_assert!(t.free.listed >= t.free.len());
                prop_assert_eq!(t.free.listed, t.free.classes.iter().map(Vec::len).sum::<usize>());
            }
            // A whole pass, uninterrupted, leaves every range listed once, in its class,
            // and nothing else.
            t.free.pass += 1;
            t.free.sweep = Some((0, 0));
            while t.free.sweep.is_some() {
                t.sweep_free();
            }
            for (c, starts) in t.free.classes.iter().enumerate() {
                let mut got = starts.clone();
                got.sort_unstable();
                let want: Vec<u32> = runs(&free).iter().filter(|&&(_, l)| class(l) == c).map(|&(s, _)| s).collect();
                prop_assert_eq!(got, want, "class {}", c);
            }
        }
    }
}
