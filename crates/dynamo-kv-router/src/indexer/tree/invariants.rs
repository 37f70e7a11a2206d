//! Structural invariant checks (used by the tests and the fuzz target).

use super::{BRANCH, BROKEN, COUNT_MASK, DUPS, NIL, ROOT, RadixTree, WIDE, WIDE_DROP, WIDE_MIN};
use rustc_hash::FxHashMap;

use super::free_runs::TAKEN;
use super::holders::Holders;

impl RadixTree {
    /// Check every structural invariant (tests and debugging).
    ///
    /// # Panics
    /// When an invariant is violated.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let mut live = vec![true; self.nodes.len()];
        let free = self.free_nodes.checked_ids(&self.nodes, &self.cold);
        for &f in &free {
            live[f as usize] = false;
        }
        let mut children = vec![0u32; self.nodes.len()];
        let mut count = 0;
        for (id, n) in self.nodes.iter().enumerate().skip(1) {
            if !live[id] {
                continue;
            }
            assert_ne!(
                n.parent, TAKEN,
                "node {id} taken for a chain but never written"
            );
            assert!(live[n.parent as usize], "node {id} has a freed parent");
            children[n.parent as usize] += 1;
            assert_eq!(
                self.child(n.parent, n.local),
                Some(id as u32),
                "child index"
            );
            let c = &self.cold[id];
            assert!(!c.has_extras() || c.link != NIL, "extras flag of {id}");
            assert!(
                c.slot != NIL || self.has_children(id as u32),
                "node {id} is empty and childless"
            );
            self.for_each_residency(id as u32, |_| count += 1);
        }
        for id in 1..self.nodes.len() {
            if !live[id] {
                continue;
            }
            let implicit = self
                .nodes
                .get(id + 1)
                .is_some_and(|c| c.parent == id as u32);
            let explicit = self.kids.get(&(id as u32)).copied().unwrap_or(0);
            assert_eq!(
                self.nodes[id].meta & BRANCH != 0,
                explicit != 0,
                "BRANCH flag of {id}"
            );
            assert_eq!(
                u32::from(implicit) + explicit,
                children[id],
                "child count of {id}"
            );
        }
        for (&id, &k) in &self.kids {
            assert!(
                id != ROOT && live[id as usize] && k > 0,
                "explicit count of {id}"
            );
        }
        assert_eq!(
            self.nodes[ROOT as usize].meta & BRANCH,
            0,
            "root flagged BRANCH"
        );
        assert_eq!(count, self.residencies, "residency count");
        // Holder counts and flags: the count is exact; without `DUPS` no rank holds a node
        // twice; without `BROKEN` every holder of a child holds its parent.
        for (id, &is_live) in live.iter().enumerate().skip(1) {
            if !is_live {
                assert_eq!(self.nodes[id].meta, 0, "freed node keeps meta");
                continue;
            }
            let mut holders = Vec::new();
            self.for_each_residency(id as u32, |s| holders.push(s));
            let m = self.nodes[id].meta;
            assert_eq!(
                (m & COUNT_MASK) as usize,
                holders.len(),
                "holder count of {id}"
            );
            let mut distinct = holders.clone();
            distinct.sort_unstable();
            distinct.dedup();
            if m & DUPS == 0 {
                assert_eq!(
                    distinct.len(),
                    holders.len(),
                    "{id} has duplicates unflagged"
                );
            }
            // A wide node's holder set is exact (so is its `DUPS`); the others are narrow.
            if m & WIDE != 0 {
                let set = self
                    .wide
                    .get(&(id as u32))
                    .expect("wide node without a set");
                assert_eq!(set.residencies(), holders.len(), "holder set count of {id}");
                for &h in &distinct {
                    let n = holders.iter().filter(|&&x| x == h).count();
                    assert_eq!(set.multiplicity(h) as usize, n, "multiplicity in {id}");
                }
                assert_eq!(m & DUPS != 0, set.has_dups(), "DUPS of wide {id}");
                assert!(
                    m & COUNT_MASK >= WIDE_DROP,
                    "wide {id} below the drop limit"
                );
            } else {
                assert!(
                    !self.wide.contains_key(&(id as u32)),
                    "narrow {id} has a set"
                );
                assert!(m & COUNT_MASK <= WIDE_MIN, "narrow {id} above the limit");
            }
            let parent = self.nodes[id].parent;
            if parent != ROOT && self.nodes[parent as usize].meta & BROKEN == 0 {
                let mut up = Vec::new();
                self.for_each_residency(parent, |s| up.push(s));
                for h in &distinct {
                    assert!(
                        up.contains(h),
                        "holder {h} of {id} misses parent {parent} unflagged"
                    );
                }
            }
        }
        let wide_nodes = live
            .iter()
            .enumerate()
            .filter(|&(id, &l)| l && self.nodes[id].meta & WIDE != 0)
            .count();
        assert_eq!(self.wide.len(), wide_nodes, "holder sets of freed nodes");
        // A wide node's position hint of every slot in its block names one of the slot's
        // entries (a stale one would only cost a scan, but would mean the upkeep is wrong).
        for (&node, set) in &self.wide {
            let c = &self.cold[node as usize];
            if !c.has_extras() {
                continue;
            }
            let len = (self.nodes[node as usize].meta & COUNT_MASK) - 1;
            self.holders.scan(c.link, |h| {
                let named = set
                    .hint(h.slot)
                    .filter(|&j| j < len)
                    .map(|j| self.holders.get(c.link, j).slot);
                assert_eq!(named, Some(h.slot), "position hint of {node}");
                true
            });
        }
        let explicit = |root: bool| {
            (1..self.nodes.len())
                .filter(|&id| {
                    let parent = self.nodes[id].parent;
                    live[id] && !Self::is_implicit(id as u32, parent) && (parent == ROOT) == root
                })
                .count()
        };
        assert_eq!(self.children.len(), explicit(false), "child table size");
        assert_eq!(self.roots.len(), explicit(true), "root table size");
        for &f in &free {
            assert_eq!(
                self.nodes[f as usize].parent, NIL,
                "freed node keeps a parent"
            );
        }
        assert_eq!(self.slot_worker.len(), self.slots.len());
        for (slot, s) in self.slots.iter().enumerate() {
            let Some(s) = s else { continue };
            assert_eq!(
                self.slot_of.get(&self.slot_worker[slot]),
                Some(&(slot as u32))
            );
            assert!(s.count > 0, "empty slot kept");
        }
        // Each rank's count is its residencies.
        let mut counts: FxHashMap<u32, usize> = FxHashMap::default();
        for (id, &is_live) in live.iter().enumerate().skip(1) {
            if is_live {
                self.for_each_residency(id as u32, |s| *counts.entry(s).or_default() += 1);
            }
        }
        for (slot, s) in self.slots.iter().enumerate() {
            if let Some(s) = s {
                assert_eq!(
                    counts.get(&(slot as u32)).copied(),
                    Some(s.count),
                    "count of slot {slot}"
                );
            }
        }
        // `hashes`: one entry per node with residencies under its canonical key, none for
        // any other node.
        let mut entries: FxHashMap<u32, usize> = FxHashMap::default();
        for (_, node) in self.hashes.entries() {
            assert!(live[node as usize], "hash entry of freed node {node}");
            *entries.entry(node).or_default() += 1;
        }
        for (id, &is_live) in live.iter().enumerate().skip(1) {
            if is_live {
                let want = usize::from(self.canonical_count(id as u32) > 0);
                assert_eq!(
                    entries.get(&(id as u32)).copied().unwrap_or(0),
                    want,
                    "hash entries of {id}"
                );
            }
        }
        // `own`: each key names a live node its rank holds under it (it may have become the
        // node's canonical key since, after the node had none); `own_slots` lists each once.
        let mut listed: FxHashMap<u32, usize> = FxHashMap::default();
        for (&(slot, key), &node) in &self.own {
            assert!(live[node as usize], "own key {key:x} of freed node {node}");
            assert!(
                self.own_count(node, slot) > 0,
                "own key {key:x} of slot {slot} unlisted"
            );
            *listed.entry(node).or_default() += 1;
        }
        for (&node, list) in &self.own_slots {
            assert!(
                !list.is_empty() && live[node as usize],
                "own slots of {node}"
            );
            assert_eq!(
                listed.get(&node).copied(),
                Some(list.len()),
                "own slots of {node}"
            );
            for &slot in list {
                assert!(
                    self.multiplicity(node, slot) >= self.own_count(node, slot),
                    "own residencies of slot {slot} at {node}"
                );
            }
        }
        // Every residency's hash, rebuilt from the tables, finds its node again.
        let all = self.all_residencies();
        assert_eq!(all.len(), self.residencies, "rebuilt hashes");
        for (slot, node, ext) in all {
            assert_eq!(
                self.find_residency(slot, super::key_of(ext))
                    .map(super::Held::node),
                Some(node),
                "hash {ext:x} of slot {slot} rebuilt"
            );
        }
        // Holder blocks: one per node with further holders, exactly `count - 1` entries in
        // use, none left on freed nodes.
        let mut blocks = 0;
        for (id, &is_live) in live.iter().enumerate().skip(1) {
            let c = &self.cold[id];
            if !is_live || !c.has_extras() {
                continue;
            }
            blocks += 1;
            let mut entries = 0;
            self.holders.scan(c.link, |_| {
                entries += 1;
                true
            });
            assert_eq!(
                entries + 1,
                self.nodes[id].meta & COUNT_MASK,
                "holder block of {id}"
            );
            // Full at most, and over a quarter full unless it is of the smallest class.
            let cap = Holders::capacity(c.link);
            assert!(
                entries <= cap && (Holders::is_smallest(cap) || entries * 4 > cap),
                "holder block of {id}: {entries} in {cap}"
            );
        }
        assert_eq!(
            self.holders.checked_blocks(),
            blocks,
            "holder blocks in use"
        );
    }
}
