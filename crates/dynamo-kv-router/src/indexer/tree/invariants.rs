//! Structural invariant checks (used by the tests and the fuzz target).

use super::{BROKEN, COUNT_MASK, DUPS, EXTRA_BIT, NIL, RadixTree, node_of};

impl RadixTree {
    /// Check every structural invariant (tests and debugging).
    ///
    /// # Panics
    /// When an invariant is violated.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        let mut live = vec![true; self.nodes.len()];
        for f in self.free_nodes.iter() {
            live[f as usize] = false;
        }
        let mut children = vec![0u32; self.nodes.len()];
        let mut count = 0;
        for (id, n) in self.nodes.iter().enumerate().skip(1) {
            if !live[id] {
                continue;
            }
            assert!(live[n.parent as usize], "node {id} has a freed parent");
            children[n.parent as usize] += 1;
            assert_eq!(
                self.child(n.parent, n.local),
                Some(id as u32),
                "child index"
            );
            assert!(!n.has_extras() || n.link != NIL, "extras flag of {id}");
            assert!(
                n.slot != NIL || self.has_children(id as u32),
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
            let explicit = self.nodes[id].kids;
            assert_eq!(
                u32::from(implicit) + explicit,
                children[id],
                "child count of {id}"
            );
        }
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
            let parent = self.nodes[id].parent;
            if parent != super::ROOT && self.nodes[parent as usize].meta & BROKEN == 0 {
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
        let explicit = (1..self.nodes.len())
            .filter(|&id| live[id] && !Self::is_implicit(id as u32, self.nodes[id].parent))
            .count();
        assert_eq!(self.children.len(), explicit, "child table size");
        for f in self.free_nodes.iter() {
            assert_eq!(
                self.nodes[f as usize].parent, NIL,
                "freed node keeps a parent"
            );
        }
        let mut lookups = 0;
        for (slot, s) in self.slots.iter().enumerate() {
            let Some(s) = s else { continue };
            assert_eq!(self.slot_of.get(&s.worker), Some(&(slot as u32)));
            assert!(!s.lookup.is_empty(), "empty slot kept");
            for h in s.lookup.iter() {
                let node = node_of(&self.extras, h);
                assert!(live[node as usize]);
                let owner = if h & EXTRA_BIT == 0 {
                    self.nodes[h as usize].primary()
                } else {
                    self.extras[(h & !EXTRA_BIT) as usize].slot
                };
                assert_eq!(owner, slot as u32, "lookup entry owned by another slot");
                lookups += 1;
            }
        }
        assert_eq!(lookups, self.residencies, "lookup entries");
    }
}
