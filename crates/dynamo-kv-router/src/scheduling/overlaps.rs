//! The device overlaps of a decision, spread by scheduler slot.
//!
//! The indexer lists the ranks that match a prompt by worker id
//! ([`SchedulingRequest::device_overlaps`]); the cost pass reads them by the scheduler's slot
//! of each rank, from a dense buffer that is all zero between decisions. Finding a rank's
//! slot is a hash lookup, once per listed rank: on a fleet of a thousand ranks sharing a
//! system prompt, hundreds of lookups per decision, each a likely cache miss when event
//! ingestion has just swept the caches (a fifth of a cold decision). When the index also
//! says where it keeps each listed rank ([`IndexSlots`]), the lookups are remembered by the
//! index's slot, in a small array, for as long as neither side reassigns its slots.

use rustc_hash::FxHashMap;

use super::SchedulingRequest;
use crate::indexer::IndexSlots;
use crate::protocols::WorkerWithDpRank;

/// Not looked up yet under the current epoch.
const UNSEEN: u32 = u32::MAX;
/// Looked up: not registered with the scheduler (its overlap is ignored).
const UNREGISTERED: u32 = u32::MAX - 1;
/// Index slots from here on are looked up every time rather than remembered: indexes reuse
/// their slots, so theirs stay below their number of ranks; this bounds the array should
/// one not.
const MAX_REMEMBERED: usize = 1 << 20;

/// The scheduler slot of each index slot, for one index epoch and one set of registered
/// ranks (forgotten when either changes).
#[derive(Debug, Default)]
pub(super) struct FromIndex {
    /// The [`IndexSlots::epoch`] the entries belong to; 0: none.
    epoch: u64,
    /// By index slot: the scheduler slot, [`UNSEEN`] or [`UNREGISTERED`].
    slot: Vec<u32>,
}

impl FromIndex {
    /// Forget every entry (the scheduler's ranks changed).
    pub(super) fn forget(&mut self) {
        self.epoch = 0;
    }

    /// Make the entries those of `epoch`.
    fn enter(&mut self, epoch: u64) {
        if self.epoch != epoch {
            self.slot.fill(UNSEEN);
            self.epoch = epoch;
        }
    }

    /// The scheduler slot of the rank `worker`, kept by the index in `index_slot`.
    #[inline]
    fn resolve(
        &mut self,
        slot_of: &FxHashMap<WorkerWithDpRank, u32>,
        index_slot: u32,
        worker: &WorkerWithDpRank,
    ) -> Option<u32> {
        let i = index_slot as usize;
        let lookup = || slot_of.get(worker).copied();
        if i >= MAX_REMEMBERED {
            return lookup();
        }
        if i >= self.slot.len() {
            self.slot.resize(i + 1, UNSEEN);
        }
        let s = match self.slot[i] {
            UNSEEN => {
                let s = lookup().unwrap_or(UNREGISTERED);
                self.slot[i] = s;
                s
            }
            s => s,
        };
        debug_assert_eq!(
            (s != UNREGISTERED).then_some(s),
            lookup(),
            "index slot {i} remembered for another rank than {worker:?}"
        );
        (s != UNREGISTERED).then_some(s)
    }
}

/// Write `req.device_overlaps` into `dense` by slot (when it is the overlap source);
/// returns what [`clear`] needs to zero it again. If a rank is listed twice, the later
/// entry wins.
pub(super) fn spread<'r>(
    slot_of: &FxHashMap<WorkerWithDpRank, u32>,
    from_index: &mut FromIndex,
    dense: &mut [u32],
    req: &SchedulingRequest<'r>,
) -> Option<Spread<'r>> {
    let list = match (req.overlaps, req.device_overlaps) {
        (None, Some(list)) => list,
        _ => return None,
    };
    let spread = Spread {
        list,
        index: req.index_slots.and_then(|x| x.for_list(list.len())),
    };
    if let Some(x) = spread.index {
        from_index.enter(x.epoch);
    }
    spread.for_each_slot(slot_of, from_index, |slot, d| dense[slot as usize] = d);
    Some(spread)
}

/// What [`spread`] wrote.
pub(super) struct Spread<'r> {
    list: &'r [(WorkerWithDpRank, u32)],
    index: Option<&'r IndexSlots>,
}

impl Spread<'_> {
    /// `f(scheduler slot, overlap)` for every listed rank the scheduler knows: by the
    /// index's slots when given (the epoch entered), else by a lookup per rank.
    #[inline]
    fn for_each_slot(
        &self,
        slot_of: &FxHashMap<WorkerWithDpRank, u32>,
        from_index: &mut FromIndex,
        mut f: impl FnMut(u32, u32),
    ) {
        match self.index {
            Some(x) => {
                for ((w, d), &i) in self.list.iter().zip(&x.slots) {
                    if let Some(slot) = from_index.resolve(slot_of, i, w) {
                        f(slot, *d);
                    }
                }
            }
            None => {
                for (w, d) in self.list {
                    if let Some(&slot) = slot_of.get(w) {
                        f(slot, *d);
                    }
                }
            }
        }
    }
}

/// Zero what [`spread`] wrote: a fill when the list covers a good part of the fleet, else
/// by slot again (through the translation `spread` just filled).
pub(super) fn clear(
    slot_of: &FxHashMap<WorkerWithDpRank, u32>,
    from_index: &mut FromIndex,
    dense: &mut [u32],
    spread: Option<Spread<'_>>,
) {
    let Some(spread) = spread else {
        return;
    };
    if spread.list.len() * 16 >= dense.len() {
        dense.fill(0);
    } else {
        spread.for_each_slot(slot_of, from_index, |slot, _| dense[slot as usize] = 0);
    }
}
