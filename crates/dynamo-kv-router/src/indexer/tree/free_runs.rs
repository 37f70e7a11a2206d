//! Free node ids kept as runs of consecutive ids, so that a chain stored after evictions
//! gets consecutive ids again (and its blocks stay *implicit* children: no child-table
//! entry, no hash probe; see the module docs of [`crate::indexer`]).
//!
//! Evictions free a chain's blocks deepest first, i.e. in decreasing id order, so pushing
//! an id just below (or above) the top run extends it; a new chain then takes the top run
//! from its start upwards. Only the top run is merged with: runs below it are never
//! coalesced, which keeps every operation O(1). The cost of fragmentation is one explicit
//! child per run boundary, never a wrong answer.

/// A stack of runs `(start, len)` of free ids; the ids are distinct.
#[derive(Debug, Default)]
pub(super) struct FreeRuns {
    runs: Vec<(u32, u32)>,
    count: usize,
}

impl FreeRuns {
    /// Number of free ids.
    pub(super) const fn len(&self) -> usize {
        self.count
    }

    /// Bytes reserved.
    pub(super) fn heap_bytes(&self) -> usize {
        self.runs.capacity() * std::mem::size_of::<(u32, u32)>()
    }

    /// Free `id` (not already free).
    pub(super) fn push(&mut self, id: u32) {
        self.count += 1;
        if let Some((start, len)) = self.runs.last_mut() {
            if id.checked_add(1) == Some(*start) {
                *start = id;
                *len += 1;
                return;
            }
            if start.checked_add(*len) == Some(id) {
                *len += 1;
                return;
            }
        }
        self.runs.push((id, 1));
    }

    /// Take `id` if it is the first id of the top run (the slot right after a node that
    /// was just allocated from that run).
    pub(super) fn take_at(&mut self, id: u32) -> bool {
        match self.runs.last_mut() {
            Some((start, len)) if *start == id => {
                *start += 1;
                *len -= 1;
                if *len == 0 {
                    self.runs.pop();
                }
                self.count -= 1;
                true
            }
            _ => false,
        }
    }

    /// Take the first id of the top run.
    pub(super) fn pop(&mut self) -> Option<u32> {
        let &(start, _) = self.runs.last()?;
        let taken = self.take_at(start);
        debug_assert!(taken);
        Some(start)
    }

    /// Every free id (for the invariant checks).
    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(|&(s, l)| s..s + l)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::FreeRuns;

    proptest! {
        /// Against a set of ids: the same ids are free, `take_at` takes exactly the top
        /// run's start, and a chain freed deepest first comes back as one run.
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((0u8..3, 0u32..64), 0..200)) {
            let mut runs = FreeRuns::default();
            let mut model = BTreeSet::new();
            for (op, id) in ops {
                match op {
                    0 => if model.insert(id) { runs.push(id) },
                    1 => {
                        let took = runs.take_at(id);
                        if took { prop_assert!(model.remove(&id)); }
                    }
                    _ => if let Some(id) = runs.pop() { prop_assert!(model.remove(&id)); }
                              else { prop_assert!(model.is_empty()); },
                }
                let mut listed: Vec<u32> = runs.iter().collect();
                listed.sort_unstable();
                prop_assert_eq!(listed, model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(runs.len(), model.len());
            }
        }
    }

    #[test]
    fn chain_freed_deepest_first_is_reused_in_order() {
        let mut runs = FreeRuns::default();
        for id in (10..20).rev() {
            runs.push(id);
        }
        assert_eq!(runs.runs.len(), 1);
        assert_eq!(runs.pop(), Some(10));
        for id in 11..20 {
            assert!(runs.take_at(id));
        }
        assert_eq!(runs.len(), 0);
    }
}
