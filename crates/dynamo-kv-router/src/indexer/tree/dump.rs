//! Dumping the run tree as `stored` events that rebuild it.

use rustc_hash::FxHashMap;

use super::state::{NIL, RadixTree};
use crate::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, RouterEvent, StorageTier,
};

impl RadixTree {
    /// The tree as one single-block `stored` event per reachable residency, parents before
    /// children, each naming its parent by that rank's (smallest) external hash there.
    /// Replaying the events (in order, on an empty tree) reproduces every score.
    ///
    /// A residency below a block its rank no longer holds can never score and has no
    /// parent to name, so it is not dumped. The order depends on the tree's contents only
    /// (depth, then rank, then hash), not on where the tree keeps them.
    pub fn dump_events(&self) -> Vec<RouterEvent> {
        // Depth of each run's first block (the root's children start at depth 1).
        let mut depth: FxHashMap<u32, u32> = FxHashMap::default();
        for run in 0..self.runs.len() as u32 {
            self.run_depth(run, &mut depth);
        }
        let mut items: Vec<(u32, WorkerWithDpRankKey, u64, u64, Option<u64>)> = Vec::new();
        for (slot, residencies) in self.residencies_by_slot() {
            // block -> this rank's smallest hash there.
            let mut held: FxHashMap<u32, u64> = FxHashMap::default();
            for &(b, h) in &residencies {
                held.entry(b).and_modify(|e| *e = (*e).min(h)).or_insert(h);
            }
            let worker = self.slot_worker[slot as usize];
            for &(b, h) in &residencies {
                if !self.reachable(slot, b) {
                    continue;
                }
                let run = self.run_of[b as usize];
                let r = &self.runs[run as usize];
                let parent = if b > r.start {
                    Some(b - 1)
                } else if r.parent != NIL {
                    let p = &self.runs[r.parent as usize];
                    Some(p.start + p.len - 1)
                } else {
                    None
                };
                let d = depth[&run] + (b - r.start);
                items.push((
                    d,
                    (worker.worker_id, worker.dp_rank),
                    h,
                    self.local[b as usize],
                    parent.map(|p| held[&p]),
                ));
            }
        }
        items.sort_unstable_by_key(|&(d, w, h, _, _)| (d, w, h));
        items
            .into_iter()
            .enumerate()
            .map(
                |(i, (_, (worker_id, dp_rank), h, local, parent))| RouterEvent {
                    worker_id,
                    storage_tier: StorageTier::Device,
                    event: KvCacheEvent {
                        event_id: i as u64,
                        dp_rank,
                        data: KvCacheEventData::Stored(KvCacheStoreData {
                            parent_hash: parent.map(ExternalSequenceBlockHash),
                            start_position: None,
                            blocks: vec![KvCacheStoredBlockData::new(h, local)],
                        }),
                    },
                },
            )
            .collect()
    }

    /// Every residency, `(block, hash)` per slot.
    pub(super) fn residencies_by_slot(&self) -> FxHashMap<u32, Vec<(u32, u64)>> {
        let mut out: FxHashMap<u32, Vec<(u32, u64)>> = FxHashMap::default();
        for r in self.runs.iter() {
            for &(slot, len) in &r.holders {
                for b in r.start..r.start + len {
                    if self.no_canon.contains(&(slot, b)) {
                        continue;
                    }
                    let k = self.key_at(b).expect("a canonical residency has a key");
                    out.entry(slot).or_default().push((b, k));
                }
            }
        }
        for (&(slot, h), &b) in &self.own {
            out.entry(slot).or_default().push((b, h));
        }
        out
    }

    /// Whether `slot` holds `b` and every block above it.
    pub(super) fn reachable(&self, slot: u32, b: u32) -> bool {
        if !self.covers(slot, b) {
            return false;
        }
        let mut up = self.runs[self.run_of[b as usize] as usize].parent;
        while up != NIL {
            let r = &self.runs[up as usize];
            if r.length_of(slot) != r.len {
                return false;
            }
            up = r.parent;
        }
        true
    }

    /// The depth of `run`'s first block (memoized; 0 for a freed run). Iterative: chains
    /// of runs can be thousands deep.
    fn run_depth(&self, run: u32, memo: &mut FxHashMap<u32, u32>) -> u32 {
        if self.runs[run as usize].len == 0 {
            return 0;
        }
        let mut path = Vec::new();
        let mut cur = run;
        // The depth of the block above the path's first run, once known.
        let mut base = 0;
        while cur != NIL {
            if let Some(&d) = memo.get(&cur) {
                base = d + self.runs[cur as usize].len - 1;
                break;
            }
            path.push(cur);
            cur = self.runs[cur as usize].parent;
        }
        for &r in path.iter().rev() {
            memo.insert(r, base + 1);
            base += self.runs[r as usize].len;
        }
        memo[&run]
    }
}

/// A rank as a sortable pair.
type WorkerWithDpRankKey = (u64, u32);
