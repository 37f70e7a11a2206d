//! Holder sets of widely shared nodes.
//!
//! A node held by many ranks (a system prompt cached by every worker of a large fleet) keeps,
//! besides its residency list, a bitset of the worker slots that hold it and the slots that
//! hold it more than once. With it:
//!
//! * "does this rank hold the node?" is one bit test instead of a scan of the holder list
//!   (hundreds of cache misses at 1,000 workers), so the `DUPS` and `BROKEN` flags of wide
//!   nodes are exact instead of conservative, and the query fast path (equal counts, no
//!   flags) applies along shared prefixes;
//! * a query enumerates a wide node's holders from 16 words (1,000 slots) instead of walking
//!   its list, and filters the ranks still matching with bit tests.

use rustc_hash::FxHashMap;

/// Holders of one wide node.
#[derive(Debug, Default, Clone)]
pub(super) struct HolderSet {
    /// Bit `slot` is set when the slot holds the node (under one or more external hashes).
    bits: Vec<u64>,
    /// Slots holding the node under more than one external hash: the number of residencies
    /// beyond the first. Empty unless some rank stored the same block under two hashes.
    extra: FxHashMap<u32, u32>,
    /// Per slot, where its entry in the node's holder block is (`NO_HINT`: unknown). A hint,
    /// checked against the entry before it is trusted (a promoted primary or a slot with
    /// two entries leaves one stale): a wide node's block holds hundreds of entries, and
    /// scanning it at every store and remove of a fleet-wide prefix made those events the
    /// longest holds of the tree's write lock (2 bytes a slot, for wide nodes only).
    hint: Vec<u16>,
}

/// No position known (see [`HolderSet::hint`]).
const NO_HINT: u16 = u16::MAX;

impl HolderSet {
    /// Whether `slot` holds the node.
    #[inline]
    pub(super) fn contains(&self, slot: u32) -> bool {
        self.bits
            .get((slot / 64) as usize)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }

    /// Record one more residency of `slot`; returns whether the slot already held the node.
    pub(super) fn add(&mut self, slot: u32) -> bool {
        let word = (slot / 64) as usize;
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        let bit = 1 << (slot % 64);
        if self.bits[word] & bit != 0 {
            *self.extra.entry(slot).or_insert(0) += 1;
            true
        } else {
            self.bits[word] |= bit;
            false
        }
    }

    /// Forget one residency of `slot` (which must hold the node).
    pub(super) fn remove(&mut self, slot: u32) {
        if let Some(n) = self.extra.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.extra.remove(&slot);
            }
            return;
        }
        if let Some(w) = self.bits.get_mut((slot / 64) as usize) {
            *w &= !(1 << (slot % 64));
        }
    }

    /// Where `slot`'s entry in the node's holder block may be (to be checked).
    #[inline]
    pub(super) fn hint(&self, slot: u32) -> Option<u32> {
        self.hint
            .get(slot as usize)
            .copied()
            .filter(|&h| h != NO_HINT)
            .map(u32::from)
    }

    /// Record that `slot`'s entry is at `pos` in the node's holder block.
    #[inline]
    pub(super) fn set_hint(&mut self, slot: u32, pos: u32) {
        let s = slot as usize;
        if self.hint.len() <= s {
            self.hint.resize(s + 1, NO_HINT);
        }
        self.hint[s] = u16::try_from(pos).unwrap_or(NO_HINT);
    }

    /// Whether some slot holds the node more than once.
    #[inline]
    pub(super) fn has_dups(&self) -> bool {
        !self.extra.is_empty()
    }

    /// Every holding slot once, in slot order.
    #[inline]
    pub(super) fn for_each(&self, mut f: impl FnMut(u32)) {
        for (i, &w) in self.bits.iter().enumerate() {
            let mut x = w;
            while x != 0 {
                f(i as u32 * 64 + x.trailing_zeros());
                x &= x - 1;
            }
        }
    }

    /// Number of residencies recorded (distinct slots plus repeats).
    pub(super) fn residencies(&self) -> usize {
        self.bits
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum::<usize>()
            + self.extra.values().map(|&n| n as usize).sum::<usize>()
    }

    /// The number of residencies `slot` has.
    pub(super) fn multiplicity(&self, slot: u32) -> u32 {
        if self.contains(slot) {
            1 + self.extra.get(&slot).copied().unwrap_or(0)
        } else {
            0
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.bits.capacity() * 8 + self.extra.capacity() * (8 + 1) + self.hint.capacity() * 2
    }
}
