//! What a prefix query answers: [`OverlapScores`], with the [`IndexSlots`] that let a
//! scheduler map the ranks to its own slots. Defined apart from `mod.rs` because the tree
//! builds them and `mod.rs` re-exports the tree: here both can import them.

use crate::protocols::WorkerWithDpRank;

/// Result of a prefix match.
///
/// Equality compares `scores` and `frequencies` only: `index_slots` says where the index
/// keeps the ranks, which is no part of the answer (two trees with the same blocks give
/// equal scores under different slots).
#[derive(Debug, Clone, Default)]
pub struct OverlapScores {
    /// Matched prefix length (in blocks) per worker rank; ranks that match nothing are
    /// absent.
    pub scores: Vec<(WorkerWithDpRank, u32)>,
    /// For each matched depth, how many lookups touched that block within the expiration
    /// window (zeros omitted). Empty unless the tree tracks frequencies.
    pub frequencies: Vec<usize>,
    /// The index's slot of each rank of `scores`; empty when the index does not say (the
    /// tree says when the prompt's first block has 32 holders or more: below that, a
    /// scheduler's lookups are cheaper than listing them).
    pub index_slots: IndexSlots,
}

impl PartialEq for OverlapScores {
    fn eq(&self, other: &Self) -> bool {
        self.scores == other.scores && self.frequencies == other.frequencies
    }
}

impl Eq for OverlapScores {}

/// Where an index keeps the ranks it lists: the slot of each (a small integer the index
/// reuses after a rank leaves) and the name of the slot assignment they belong to.
///
/// A scheduler keeps its own slot per rank and would otherwise find it by one hash lookup
/// per listed rank, hundreds per decision on a large fleet, each a likely cache miss; with
/// these it keeps a translation from the index's slots to its own, valid while `epoch`
/// stays the same ([`crate::scheduling::SchedulingRequest::index_slots`]).
#[derive(Debug, Clone, Default)]
pub struct IndexSlots {
    /// The index's slot of each listed rank, in the order of the list.
    pub slots: Vec<u32>,
    /// Unique in the process to one assignment of slots to ranks: an index takes a new one
    /// whenever one of its slots gets a rank (a freed slot need not renew it while no list
    /// names it), so two lists with the same epoch map equal slots to equal ranks. 0: no
    /// assignment (the slots mean nothing).
    pub epoch: u64,
}

impl IndexSlots {
    /// A fresh epoch (never 0, never handed out twice in this process).
    pub(crate) fn next_epoch() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The slots, when they describe a list of `len` ranks.
    pub fn for_list(&self, len: usize) -> Option<&Self> {
        (self.epoch != 0 && self.slots.len() == len).then_some(self)
    }
}

impl OverlapScores {
    /// The score of one worker rank, if it matched at least one block.
    pub fn get(&self, worker: WorkerWithDpRank) -> Option<u32> {
        self.scores
            .iter()
            .find(|(w, _)| *w == worker)
            .map(|&(_, s)| s)
    }
}
