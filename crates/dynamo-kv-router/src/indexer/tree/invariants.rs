//! Structural invariant checks of the run tree (used by the tests).

use rustc_hash::{FxHashMap, FxHashSet};

use super::ext_table::tag_of;
use super::state::{NIL, RadixTree, child_tag, mix};

impl RadixTree {
    /// The children of `run`.
    fn kids(&self, run: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(
            Some(self.runs[run as usize].kid).filter(|&k| k != NIL),
            |&k| Some(self.runs[k as usize].next).filter(|&k| k != NIL),
        )
    }

    /// Check every structural invariant (tests and debugging).
    ///
    /// # Panics
    /// When an invariant is violated.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let n = self.local.len();
        // The tables' own layout (their unit tests' check, in the tree's tests too).
        #[cfg(test)]
        {
            self.hashes.check();
            self.children.check();
        }
        assert_eq!(self.run_of.len(), n);
        assert_eq!(self.key.len(), n);
        assert_eq!(self.keyed.len(), n.div_ceil(64));
        // Free ranges: maximal, disjoint, tagged at both ends, counted.
        let mut free = 0usize;
        let ranges = self.free_ranges();
        for &(s, l) in &ranges {
            assert_eq!(
                self.free_range_at(s),
                Some(l),
                "free range {s}+{l} by start"
            );
            assert_eq!(
                self.free_range_ending_at(s + l),
                Some(s),
                "free range {s}+{l} by end"
            );
            free += l as usize;
        }
        assert_eq!(ranges.len(), self.free.len());
        let slack: usize = self.runs.iter().map(|r| (r.cap - r.len) as usize).sum();
        assert_eq!(
            self.live_blocks + free + slack,
            n,
            "ids: live + free + reserved"
        );
        let free_runs: FxHashSet<u32> = self.free_runs.iter().copied().collect();
        assert_eq!(free_runs.len(), self.free_runs.len());
        let mut blocks = 0usize;
        let mut residencies = 0usize;
        let mut per_slot: FxHashMap<u32, usize> = FxHashMap::default();
        for (id, r) in self.runs.iter().enumerate() {
            let id = id as u32;
            if r.len == 0 {
                assert_eq!(r.cap, 0, "freed run {id} keeps ids");
                assert!(free_runs.contains(&id), "run {id} empty but not free");
                continue;
            }
            assert!(!free_runs.contains(&id), "run {id} live and free");
            blocks += r.len as usize;
            for b in r.start..r.start + r.len {
                assert_eq!(self.run_of[b as usize], id, "block {b} of run {id}");
            }
            assert!(r.cap >= r.len, "run {id}: capacity below length");
            for b in r.start + r.len..r.start + r.cap {
                assert_eq!(
                    self.run_of[b as usize], NIL,
                    "reserved id {b} of run {id} in use"
                );
            }
            assert_eq!(
                self.child(r.parent, self.local[r.start as usize]),
                Some(id),
                "run {id} in the child table"
            );
            if r.parent != NIL {
                let p = &self.runs[r.parent as usize];
                assert!(p.len > 0, "run {id} under a freed run");
                assert_eq!(
                    self.kids(r.parent).filter(|&k| k == id).count(),
                    1,
                    "run {id} listed once by its parent"
                );
            }
            let mut prev = NIL;
            for k in self.kids(id) {
                assert_eq!(self.runs[k as usize].parent, id, "kid {k} of run {id}");
                assert_eq!(
                    self.runs[k as usize].prev, prev,
                    "kid {k} of run {id}: prev"
                );
                prev = k;
            }
            assert!(
                r.holders.windows(2).all(|w| w[0].0 < w[1].0),
                "run {id}: holders not sorted by slot, or a rank listed twice"
            );
            for &(s, len) in &r.holders {
                assert!(
                    len >= 1 && len <= r.len,
                    "run {id}: length {len} of slot {s}"
                );
                assert!(self.slots[s as usize].is_some(), "run {id}: free slot {s}");
            }
            assert_eq!(
                r.held,
                r.holders.iter().map(|h| h.1).max().unwrap_or(0),
                "run {id}: longest holder"
            );
            // A childless run is trimmed to what its ranks hold; a run without holders has
            // children.
            if !r.has_kids() {
                assert_eq!(r.held, r.len, "run {id} has an unheld tail");
            }
            for b in r.start..r.start + r.len {
                let o = b - r.start;
                let canonical: Vec<u32> = r
                    .holders
                    .iter()
                    .filter(|&&(s, len)| len > o && !self.no_canon.contains(&(s, b)))
                    .map(|h| h.0)
                    .collect();
                match self.key_at(b) {
                    Some(k) => {
                        assert!(!canonical.is_empty(), "block {b} keyed without holders");
                        assert_eq!(self.block_of_key(k), Some(b), "block {b} key in hashes");
                    }
                    None => assert!(canonical.is_empty(), "block {b} held without a key"),
                }
                residencies += canonical.len();
                for s in canonical {
                    *per_slot.entry(s).or_default() += 1;
                }
            }
        }
        assert_eq!(blocks, self.live_blocks, "live blocks");
        let mut entries = 0;
        for (tag, b) in self.hashes.entries() {
            let k = self.key_at(b).expect("hashes names a keyed block");
            assert_eq!(tag_of(mix(k)), tag, "hashes entry of block {b}");
            entries += 1;
        }
        assert_eq!(entries, self.hashes.len());
        // The children map names live runs only.
        let mut children = 0;
        for (tag, c) in self.children.entries() {
            let r = &self.runs[c as usize];
            assert!(r.len > 0, "child table names freed run {c}");
            assert_eq!(tag, child_tag(r.parent, self.local[r.start as usize]));
            children += 1;
        }
        assert_eq!(children, self.children.len(), "child table entries");
        // Own residencies: their rank holds the block; counted per (slot, block).
        let mut counted: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        for (&(s, h), &b) in &self.own {
            assert!(
                self.covers(s, b),
                "own residency ({s}, {h}) at unheld block {b}"
            );
            // (An own hash may since have become the block's key, when the block lost its
            // key and another rank brought that hash: the rank still holds it as its own.)
            *counted.entry((s, b)).or_default() += 1;
            *per_slot.entry(s).or_default() += 1;
        }
        residencies += self.own.len();
        assert_eq!(counted, self.own_count, "own counts");
        for &(s, b) in &self.no_canon {
            assert!(
                counted.contains_key(&(s, b)),
                "no_canon ({s}, {b}) without own hashes"
            );
        }
        // Every block a rank holds is held under some hash.
        for r in self.runs.iter().filter(|r| r.len > 0) {
            for &(s, len) in &r.holders {
                for b in r.start..r.start + len {
                    let canonical = !self.no_canon.contains(&(s, b));
                    assert!(
                        canonical || counted.contains_key(&(s, b)),
                        "slot {s} holds block {b} under no hash"
                    );
                }
            }
        }
        assert_eq!(residencies, self.residencies, "residency count");
        for (slot, s) in self.slots.iter().enumerate() {
            let want = per_slot.get(&(slot as u32)).copied().unwrap_or(0);
            match s {
                Some(s) => {
                    assert_eq!(s.count, want, "slot {slot} count");
                    assert!(s.count > 0, "slot {slot} kept without residencies");
                }
                None => assert_eq!(want, 0, "free slot {slot} holds blocks"),
            }
        }
        assert_eq!(
            self.slot_of.len(),
            self.slots.iter().filter(|s| s.is_some()).count()
        );
        assert!(self.pending.is_empty(), "trims left pending");
    }
}
