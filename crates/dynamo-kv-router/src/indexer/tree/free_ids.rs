//! The free block ids of the run tree, as maximal ranges.
//!
//! A run's blocks are consecutive ids, so a new run needs a free range of its length and a
//! freed run returns one, merged with its free neighbours. Both are O(1) (expected): the
//! ranges are found by start and by end in two hash maps, and for allocation by size
//! class (`floor(log2(len))`) in one stack per class, whose entries are checked when
//! popped (a range merged or taken since leaves its entry behind, skipped then, and the
//! stacks are compacted once they hold twice the live ranges). A B-tree by length (a best
//! fit) cost ~1,000 instructions per run created or freed, a sixth of the tree's apply at
//! 100k blocks; this is first fit by class, ~200.

use rustc_hash::FxHashMap;

/// Size class of a range of `len` ids (`len >= 1`).
const fn class(len: u32) -> usize {
    (31 - len.leading_zeros()) as usize
}

#[derive(Debug, Default)]
pub(super) struct FreeIds {
    /// `start -> len` of each free range.
    at: FxHashMap<u32, u32>,
    /// `end -> start` of each free range.
    end: FxHashMap<u32, u32>,
    /// Starts of ranges by size class, possibly stale (see the module docs).
    classes: Vec<Vec<u32>>,
    /// Entries in `classes`.
    listed: usize,
}

impl FreeIds {
    /// Number of free ranges.
    pub(super) fn len(&self) -> usize {
        self.at.len()
    }

    /// Every free range as `(start, len)`, in no particular order.
    pub(super) fn ranges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.at.iter().map(|(&s, &l)| (s, l))
    }

    /// The range starting at `start`, if one does.
    pub(super) fn starting_at(&self, start: u32) -> Option<u32> {
        self.at.get(&start).copied()
    }

    /// The start of the range ending at `end`, if one does.
    pub(super) fn ending_at(&self, end: u32) -> Option<u32> {
        self.end.get(&end).copied()
    }

    pub(super) fn heap_bytes(&self) -> usize {
        (self.at.capacity() + self.end.capacity()) * 9
            + self.classes.capacity() * std::mem::size_of::<Vec<u32>>()
            + self.classes.iter().map(|c| c.capacity() * 4).sum::<usize>()
    }

    /// Add the free range `start..start + len` (not touching another).
    pub(super) fn put(&mut self, start: u32, len: u32) {
        self.at.insert(start, len);
        self.end.insert(start + len, start);
        let c = class(len);
        if self.classes.len() <= c {
            self.classes.resize_with(c + 1, Vec::new);
        }
        self.classes[c].push(start);
        self.listed += 1;
        if self.listed > 2 * self.at.len() + 64 {
            self.compact();
        }
    }

    /// Take the range starting at `start` out; returns its length.
    pub(super) fn take(&mut self, start: u32) -> u32 {
        let len = self.at.remove(&start).expect("a free range");
        self.end.remove(&(start + len));
        len
    }

    /// `n` consecutive free ids from a range that fits (its rest stays free), if any.
    pub(super) fn alloc(&mut self, n: u32) -> Option<u32> {
        let fits = class(n);
        // Every range of a class above `floor(log2(n))` fits; in that class, only the top
        // entry is looked at.
        if let Some(&s) = self.classes.get(fits).and_then(|c| c.last())
            && self.at.get(&s).is_some_and(|&l| l >= n && class(l) == fits)
        {
            self.classes[fits].pop();
            self.listed -= 1;
            return Some(self.take_front(s, n));
        }
        for c in fits + 1..self.classes.len() {
            while let Some(s) = self.classes[c].pop() {
                self.listed -= 1;
                if self.at.get(&s).is_some_and(|&l| class(l) == c) {
                    return Some(self.take_front(s, n));
                }
            }
        }
        None
    }

    /// The first `n` ids of the range at `start` (which has at least `n`).
    fn take_front(&mut self, start: u32, n: u32) -> u32 {
        let len = self.take(start);
        if len > n {
            self.put(start + n, len - n);
        }
        start
    }

    /// Take the `n` ids from `start` on, when a free range starts there and holds them.
    pub(super) fn take_at(&mut self, start: u32, n: u32) -> bool {
        match self.at.get(&start) {
            Some(&len) if len >= n => {
                self.take_front(start, n);
                true
            }
            _ => false,
        }
    }

    /// Free ids `start..start + n` merged with the free ranges around them, taken out:
    /// the caller puts the merged range back (or drops it at the arrays' end).
    pub(super) fn merge(&mut self, start: u32, n: u32) -> (u32, u32) {
        let (mut start, mut n) = (start, n);
        if let Some(s) = self.ending_at(start) {
            n += self.take(s);
            start = s;
        }
        if self.at.contains_key(&(start + n)) {
            n += self.take(start + n);
        }
        (start, n)
    }

    /// Drop the stale entries of the class stacks.
    fn compact(&mut self) {
        let at = &self.at;
        let mut listed = 0;
        for (c, starts) in self.classes.iter_mut().enumerate() {
            starts.retain(|s| at.get(s).is_some_and(|&l| class(l) == c));
            starts.sort_unstable();
            starts.dedup();
            listed += starts.len();
        }
        self.listed = listed;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{FreeIds, class};

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
        /// Against a bit per id: after every operation the ranges are exactly the maximal
        /// runs of free ids, found by start and by end; an allocation takes free ids and
        /// fails only when no range of a larger size class exists; `take_at` succeeds
        /// exactly when a range starts there and holds the ids. (The stale class entries
        /// are exercised too: 64 ids, many merges between allocations.)
        #[test]
        fn behaves_like_a_bitmap(ops in proptest::collection::vec((0u8..3, 0u32..64, 1u32..12), 1..300)) {
            let mut f = FreeIds::default();
            let mut free = vec![false; 64];
            for (op, at, n) in ops {
                let end = (at + n).min(64);
                match op {
                    // Free `at..end` where it is all in use.
                    0 if (at..end).all(|i| !free[i as usize]) => {
                        let (s, l) = f.merge(at, end - at);
                        f.put(s, l);
                        for i in at..end {
                            free[i as usize] = true;
                        }
                        prop_assert!(runs(&free).contains(&(s, l)), "merged {}+{}", s, l);
                    }
                    1 => match f.alloc(n) {
                        Some(s) => {
                            prop_assert!((s..s + n).all(|i| free[i as usize]), "alloc {} at {}", n, s);
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
                        let got = f.take_at(at, n);
                        prop_assert_eq!(got, starts && fits);
                        if got {
                            for i in at..end {
                                free[i as usize] = false;
                            }
                        }
                    }
                    _ => {}
                }
                let mut have: Vec<(u32, u32)> = f.ranges().collect();
                have.sort_unstable();
                let want = runs(&free);
                prop_assert_eq!(&have, &want);
                for &(s, l) in &want {
                    prop_assert_eq!(f.starting_at(s), Some(l));
                    prop_assert_eq!(f.ending_at(s + l), Some(s));
                }
                prop_assert!(f.listed >= f.len());
            }
        }
    }
}
