//! The reverse of every worker's booked blocks: which worker slots hold each block that an
//! in-flight request booked (the union of the workers' [`super::sequences::ActiveSequences`]
//! block sets, turned around).
//!
//! A decision needs, per eligible worker, how many of the request's blocks the worker does
//! not hold yet (`new_blocks`). Asking every worker's own block set costs one hash lookup
//! per worker and request block (128 blocks x 1,000 busy workers: 128,000 lookups); here
//! it is one lookup per request block plus one increment per holding worker
//! ([`BookedHolders::count_held`]).
//!
//! Invariant (checked by the scheduler's tests): `slot` is in `holders(b)` exactly when the
//! worker in `slot` has `b` among its booked blocks.

use rustc_hash::FxHashMap;

use crate::hashing::SequenceHash;

/// Holders of one block; most blocks (private suffixes) have exactly one.
#[derive(Debug, Clone)]
enum Holders {
    One(u32),
    Few(Vec<u32>),
    /// A bit per slot, with the number of bits set.
    Many(Vec<u64>, u32),
}

/// Above this many holders a block's holders are a bitset (O(1) removal).
const FEW_MAX: usize = 32;

impl Holders {
    fn insert(&mut self, slot: u32) {
        match self {
            Self::One(s) => *self = Self::Few(vec![*s, slot]),
            Self::Few(v) if v.len() < FEW_MAX => v.push(slot),
            Self::Few(v) => {
                let mut bits = Vec::new();
                for &s in v.iter().chain([&slot]) {
                    set_bit(&mut bits, s);
                }
                *self = Self::Many(bits, v.len() as u32 + 1);
            }
            Self::Many(bits, n) => {
                set_bit(bits, slot);
                *n += 1;
            }
        }
    }

    /// Remove `slot`; `true` when no holder is left.
    fn remove(&mut self, slot: u32) -> bool {
        match self {
            Self::One(s) => *s == slot,
            Self::Few(v) => {
                if let Some(i) = v.iter().position(|&s| s == slot) {
                    v.swap_remove(i);
                }
                if v.len() == 1 {
                    *self = Self::One(v[0]);
                }
                false
            }
            Self::Many(bits, n) => {
                let (word, bit) = (slot as usize / 64, slot % 64);
                if let Some(w) = bits.get_mut(word)
                    && *w & (1 << bit) != 0
                {
                    *w &= !(1 << bit);
                    *n -= 1;
                }
                *n == 0
            }
        }
    }

    #[inline]
    fn for_each(&self, mut f: impl FnMut(u32)) {
        match self {
            Self::One(s) => f(*s),
            Self::Few(v) => v.iter().for_each(|&s| f(s)),
            Self::Many(bits, _) => {
                for (i, &word) in bits.iter().enumerate() {
                    let mut w = word;
                    while w != 0 {
                        f(i as u32 * 64 + w.trailing_zeros());
                        w &= w - 1;
                    }
                }
            }
        }
    }
}

fn set_bit(bits: &mut Vec<u64>, slot: u32) {
    let word = slot as usize / 64;
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    bits[word] |= 1 << (slot % 64);
}

/// Worker slots holding each booked block.
#[derive(Debug, Clone, Default)]
pub(crate) struct BookedHolders {
    map: FxHashMap<SequenceHash, Holders>,
}

impl BookedHolders {
    /// The worker in `slot` now holds `block` (it did not before).
    pub(crate) fn insert(&mut self, block: SequenceHash, slot: u32) {
        match self.map.entry(block) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().insert(slot),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Holders::One(slot));
            }
        }
    }

    /// The worker in `slot` no longer holds `block`.
    pub(crate) fn remove(&mut self, block: SequenceHash, slot: u32) {
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.map.entry(block)
            && e.get_mut().remove(slot)
        {
            e.remove();
        }
    }

    /// Whether no block is booked anywhere.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Add to `held[slot]`, for every element of `blocks` (repeats count again), 1 when the
    /// worker in `slot` holds it. Returns whether anything was added.
    pub(crate) fn count_held(&self, blocks: &[SequenceHash], held: &mut [u32]) -> bool {
        if self.map.is_empty() {
            return false;
        }
        let mut any = false;
        for b in blocks {
            if let Some(h) = self.map.get(b) {
                any = true;
                h.for_each(|slot| held[slot as usize] += 1);
            }
        }
        any
    }

    /// The slots holding `block`, sorted (tests).
    #[cfg(test)]
    pub(crate) fn holders_of(&self, block: SequenceHash) -> Vec<u32> {
        let mut v = Vec::new();
        if let Some(h) = self.map.get(&block) {
            h.for_each(|s| v.push(s));
        }
        v.sort_unstable();
        v
    }

    /// Every `(block, slot)` pair, sorted (tests).
    #[cfg(test)]
    pub(crate) fn pairs(&self) -> Vec<(SequenceHash, u32)> {
        let mut v: Vec<(SequenceHash, u32)> = self
            .map
            .keys()
            .flat_map(|&b| self.holders_of(b).into_iter().map(move |s| (b, s)))
            .collect();
        v.sort_unstable_by_key(|&(b, s)| (b.0, s));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// Inserts and removals (of held pairs) against a set of pairs, across the
        /// one/few/many representations (up to 200 slots on a few blocks).
        #[test]
        fn matches_a_set_of_pairs(ops in proptest::collection::vec((any::<bool>(), 0u64..4, 0u32..200), 0..600)) {
            let mut h = BookedHolders::default();
            let mut model: BTreeSet<(u64, u32)> = BTreeSet::new();
            for (add, b, s) in ops {
                let key = (b, s);
                if add && !model.contains(&key) {
                    h.insert(SequenceHash(b), s);
                    model.insert(key);
                } else if !add && model.contains(&key) {
                    h.remove(SequenceHash(b), s);
                    model.remove(&key);
                }
            }
            let want: Vec<(SequenceHash, u32)> = model.iter().map(|&(b, s)| (SequenceHash(b), s)).collect();
            prop_assert_eq!(h.pairs(), want);
            prop_assert_eq!(h.is_empty(), model.is_empty());
            let blocks = [SequenceHash(0), SequenceHash(1), SequenceHash(1), SequenceHash(9)];
            let mut held = vec![0u32; 200];
            h.count_held(&blocks, &mut held);
            for (s, &n) in held.iter().enumerate() {
                let want = blocks.iter().filter(|b| model.contains(&(b.0, s as u32))).count() as u32;
                prop_assert_eq!(n, want);
            }
        }
    }
}
