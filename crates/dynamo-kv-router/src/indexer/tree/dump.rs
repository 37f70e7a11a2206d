//! Dumping the tree as `stored` events that rebuild it.

use rustc_hash::FxHashMap;

use super::{EXTRA_BIT, ROOT, RadixTree, node_of};
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
        for slot in order {
            let Some(s) = &self.slots[slot as usize] else {
                continue;
            };
            // The rank's residencies: (node, external hash), each once (a rank holding a
            // node under several hashes has as many equal `EXTRA_BIT | node` handles).
            let mut handles: Vec<u32> = s.lookup.iter().collect();
            handles.sort_unstable();
            handles.dedup();
            let mut residencies: Vec<(u32, u64)> = Vec::new();
            for &h in &handles {
                let node = node_of(h);
                let c = &self.cold[node as usize];
                if h & EXTRA_BIT == 0 {
                    residencies.push((node, c.ext));
                } else if c.has_extras() {
                    self.holders.scan(c.link, |e| {
                        if e.slot == slot {
                            residencies.push((node, e.ext()));
                        }
                        true
                    });
                }
            }
            // node -> this rank's external hash at that node (the smallest, when the rank
            // holds the node under several hashes, so that the dump does not depend on the
            // lookup table's iteration order).
            let mut held: FxHashMap<u32, u64> = FxHashMap::default();
            for &(node, ext) in &residencies {
                held.entry(node)
                    .and_modify(|e| *e = (*e).min(ext))
                    .or_insert(ext);
            }
            for &(node, ext) in &residencies {
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
