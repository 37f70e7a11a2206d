//! Dumping the tree as `stored` events that rebuild it.

use rustc_hash::FxHashMap;

use super::{ROOT, RadixTree, unmix};
use crate::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, RouterEvent, StorageTier,
};

impl RadixTree {
    /// The tree as one single-block `stored` event per reachable `(worker rank, block)`,
    /// parents before children, each naming its parent by that rank's external hash.
    /// Replaying the events (in order, on an empty tree) reproduces every score.
    ///
    /// A residency below a block its rank no longer holds can never score (scores are
    /// prefixes) and has no parent to name, so it is not dumped.
    pub fn dump_events(&self) -> Vec<RouterEvent> {
        let mut depth_memo: FxHashMap<u32, u32> = FxHashMap::default();
        let mut items: Vec<(u32, u32, u32, u64, Option<u64>)> = Vec::new();
        let mut order: Vec<u32> = (0..self.slots.len() as u32).collect();
        order.sort_by_key(|&s| {
            self.slots[s as usize]
                .as_ref()
                .map(|_| self.slot_worker[s as usize])
        });
        let mut by_slot: FxHashMap<u32, Vec<(u32, u64)>> = FxHashMap::default();
        for (slot, node, ext) in self.all_residencies() {
            by_slot.entry(slot).or_default().push((node, ext));
        }
        for slot in order {
            let Some(residencies) = by_slot.get(&slot) else {
                continue;
            };
            // node -> this rank's external hash at that node (the smallest, when the rank
            // holds the node under several hashes, so that the dump does not depend on the
            // lookup table's iteration order).
            let mut held: FxHashMap<u32, u64> = FxHashMap::default();
            for &(node, ext) in residencies {
                held.entry(node)
                    .and_modify(|e| *e = (*e).min(ext))
                    .or_insert(ext);
            }
            for &(node, ext) in residencies {
                // Reachable iff the rank holds every ancestor.
                let mut up = self.nodes[node as usize].parent;
                let mut reachable = true;
                while up != ROOT {
                    if !held.contains_key(&up) {
                        reachable = false;
                        break;
                    }
                    up = self.nodes[up as usize].parent;
                }
                if !reachable {
                    continue;
                }
                let parent = self.nodes[node as usize].parent;
                let parent_ext = (parent != ROOT).then(|| held[&parent]);
                let depth = self.depth(node, &mut depth_memo);
                items.push((depth, slot, node, ext, parent_ext));
            }
        }
        items.sort_unstable_by_key(|&(depth, slot, node, ext, _)| (depth, slot, node, ext));
        items
            .into_iter()
            .enumerate()
            .filter_map(|(i, (_, slot, node, ext, parent_ext))| {
                self.slots[slot as usize].as_ref()?;
                let worker = self.slot_worker[slot as usize];
                Some(RouterEvent {
                    worker_id: worker.worker_id,
                    storage_tier: StorageTier::Device,
                    event: KvCacheEvent {
                        event_id: i as u64,
                        dp_rank: worker.dp_rank,
                        data: KvCacheEventData::Stored(KvCacheStoreData {
                            parent_hash: parent_ext.map(ExternalSequenceBlockHash),
                            start_position: None,
                            blocks: vec![KvCacheStoredBlockData::new(
                                ext,
                                self.nodes[node as usize].local,
                            )],
                        }),
                    },
                })
            })
            .collect()
    }

    /// Every residency as `(slot, node, external hash)`, in no particular order: for each
    /// entry of `hashes`, the node's canonical key (the entry's tag and the node's low
    /// half) for each rank holding the node more times than under keys of its own; then
    /// the keys in `own`.
    pub(super) fn all_residencies(&self) -> Vec<(u32, u32, u64)> {
        let mut out = Vec::with_capacity(self.residencies);
        let mut slots = Vec::new();
        for (tag, node) in self.hashes.entries() {
            let key = u64::from(tag) << 32 | u64::from(self.cold[node as usize].key);
            slots.clear();
            self.for_each_residency(node, |s| slots.push(s));
            slots.sort_unstable();
            slots.dedup();
            for &slot in &slots {
                if self.multiplicity(node, slot) > self.own_count(node, slot) {
                    out.push((slot, node, unmix(key)));
                }
            }
        }
        for (&(slot, key), &node) in &self.own {
            out.push((slot, node, unmix(key)));
        }
        out
    }

    fn depth(&self, node: u32, memo: &mut FxHashMap<u32, u32>) -> u32 {
        if node == ROOT {
            return 0;
        }
        if let Some(&d) = memo.get(&node) {
            return d;
        }
        // Walk up to the first memoized ancestor, then fill the path on the way back.
        let mut path = Vec::new();
        let mut cur = node;
        let mut base = 0;
        while cur != ROOT {
            if let Some(&d) = memo.get(&cur) {
                base = d;
                break;
            }
            path.push(cur);
            cur = self.nodes[cur as usize].parent;
        }
        for (k, &n) in path.iter().rev().enumerate() {
            memo.insert(n, base + k as u32 + 1);
        }
        memo[&node]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::super::{mix, unmix};
    use super::RadixTree;
    use crate::protocols::{KvCacheEventData, KvCacheStoredBlockData, WorkerWithDpRank};

    /// `(worker, external hash, tokens hash)` of every block a dump stores.
    fn dumped(t: &RadixTree) -> BTreeSet<(u64, u64, u64)> {
        t.dump_events()
            .into_iter()
            .flat_map(|ev| match ev.event.data {
                KvCacheEventData::Stored(d) => d
                    .blocks
                    .iter()
                    .map(|b| (ev.worker_id, b.block_hash.0, b.tokens_hash.0))
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect()
    }

    proptest! {
        /// The node and holder entries keep half of a residency's key: the other half
        /// and `unmix` must give the exact external hash back.
        #[test]
        fn unmix_inverts_mix(x in any::<u64>()) {
            prop_assert_eq!(unmix(mix(x)), x);
            prop_assert_eq!(mix(unmix(x)), x);
        }
    }

    /// A rank holding one block under three hashes, another rank holding it too, the
    /// hashes removed in every order: the dump names exactly the hashes still held (the
    /// other rank's is the node's canonical key, the first rank's others are its own), and
    /// the lookups find each of them.
    #[test]
    fn a_block_held_under_several_hashes_dumps_each_of_them() {
        let (a, b) = (WorkerWithDpRank::new(1, 0), WorkerWithDpRank::new(2, 0));
        let hashes = [7u64, 8, u64::MAX - 3];
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        for order in orders {
            let mut t = RadixTree::default();
            t.store_blocks(b, None, &[KvCacheStoredBlockData::new(100, 5)])
                .expect("store");
            for &h in &hashes {
                t.store_blocks(a, None, &[KvCacheStoredBlockData::new(h, 5)])
                    .expect("store");
            }
            t.check_invariants();
            let mut held: BTreeSet<u64> = hashes.iter().copied().collect();
            for &i in &order {
                let want: BTreeSet<(u64, u64, u64)> = held
                    .iter()
                    .map(|&h| (1, h, 5))
                    .chain([(2, 100, 5)])
                    .collect();
                assert_eq!(dumped(&t), want, "order {order:?}, held {held:?}");
                t.remove(a, &[hashes[i]]).expect("remove");
                held.remove(&hashes[i]);
                t.check_invariants();
            }
            assert_eq!(dumped(&t), BTreeSet::from([(2, 100, 5)]));
            assert!(t.own.is_empty(), "no key of its own once one hash is left");
        }
    }

    /// Ranks holding one block under different hashes: the first hash is the node's
    /// canonical key and the other rank's is its own. When the canonical holder goes
    /// (removed or cleared), the other rank keeps its block under its own hash, and a
    /// later store gives the node a new canonical key; every rank's hashes stay findable
    /// (as parents of new stores) and dumped.
    #[test]
    fn a_node_changes_canonical_key_when_its_holders_under_it_go() {
        use crate::protocols::ExternalSequenceBlockHash;
        let w = |id| WorkerWithDpRank::new(id, 0);
        let block = |ext| [KvCacheStoredBlockData::new(ext, 5)];
        for clear in [false, true] {
            let mut t = RadixTree::default();
            t.store_blocks(w(1), None, &block(10)).expect("store");
            t.store_blocks(w(2), None, &block(20)).expect("store");
            assert_eq!(t.own.len(), 1, "the second rank's hash is its own");
            if clear {
                t.clear_rank(w(1));
            } else {
                t.remove(w(1), &[10]).expect("remove");
            }
            t.check_invariants();
            assert_eq!(
                t.hashes.len(),
                0,
                "no residency under the canonical key is left"
            );
            assert_eq!(dumped(&t), BTreeSet::from([(2, 20, 5)]));
            // A third rank's store gives the node its hash as the canonical key.
            t.store_blocks(w(3), None, &block(30)).expect("store");
            t.check_invariants();
            assert_eq!(t.hashes.len(), 1);
            // Every rank's hash names the node as a parent.
            for (id, ext) in [(2, 20), (3, 30)] {
                t.store_blocks(
                    w(id),
                    Some(ExternalSequenceBlockHash(ext)),
                    &[KvCacheStoredBlockData::new(ext + 1, 6)],
                )
                .expect("parent found");
            }
            t.check_invariants();
            assert_eq!(
                dumped(&t),
                BTreeSet::from([(2, 20, 5), (2, 21, 6), (3, 30, 5), (3, 31, 6)])
            );
            t.clear_rank(w(2));
            t.clear_rank(w(3));
            t.check_invariants();
            assert_eq!((t.node_count(), t.len()), (0, 0));
            assert!(t.own.is_empty() && t.own_slots.is_empty());
        }
    }
}
