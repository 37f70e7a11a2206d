//! A worker rank's lookup: external block hash -> residency handle.
//!
//! Open addressing with linear probing over one array of 8-byte entries: the handle (low
//! 32 bits) and a 32-bit tag of the key's hash (high 32 bits). The key itself (the external
//! hash) is not stored: it lives in the arena, read through the handle only when a tag
//! matches, i.e. almost only for the entry being looked for. A probe therefore touches one
//! cache line in the common case (hashbrown's layout touches a control line and a data
//! line, then the arena to compare).
//!
//! An entry's home bucket is the top bits of its tag, so the table can grow without
//! reading a single key: doubling maps home `i` to `2i` or `2i + 1`, and the old array is
//! streamed in order into the new one (no random arena reads, unlike a rehash that has to
//! recompute every hash through the arena; that was the per-event spike at 10M blocks).
//! Deletion shifts the following entries back (no tombstones), so the table never needs
//! an in-place rehash either.

/// Low 32 bits of an empty entry.
const EMPTY_HANDLE: u32 = u32::MAX;
const EMPTY: u64 = u64::MAX;
/// Smallest non-empty table (buckets).
const MIN_BITS: u32 = 3;

/// `external hash -> u32 handle`; handles are never `u32::MAX`.
#[derive(Debug, Default)]
pub(super) struct ExtTable {
    entries: Vec<u64>,
    len: usize,
    /// log2 of `entries.len()` (0 when unallocated).
    bits: u32,
}

/// The 32-bit tag of a key's (already mixed) hash.
#[inline]
pub(super) const fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

#[inline]
const fn handle_of(e: u64) -> u32 {
    e as u32
}

#[inline]
const fn entry_tag(e: u64) -> u32 {
    (e >> 32) as u32
}

impl ExtTable {
    /// Number of entries.
    pub(super) const fn len(&self) -> usize {
        self.len
    }

    pub(super) const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes reserved.
    pub(super) fn heap_bytes(&self) -> usize {
        self.entries.capacity() * 8
    }

    #[inline]
    const fn mask(&self) -> usize {
        (1usize << self.bits) - 1
    }

    #[inline]
    const fn home(&self, tag: u32) -> usize {
        // `bits >= MIN_BITS > 0` whenever this is called.
        (tag >> (32 - self.bits)) as usize
    }

    /// Index of the entry whose key has tag `tag` and satisfies `eq(handle)`.
    #[inline]
    pub(super) fn find(&self, tag: u32, mut eq: impl FnMut(u32) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(tag);
        loop {
            let e = self.entries[i];
            if handle_of(e) == EMPTY_HANDLE {
                return None;
            }
            if entry_tag(e) == tag && eq(handle_of(e)) {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Load the home bucket of `tag` and return it (meaningless; for warming the cache: a
    /// caller that knows several keys ahead loads their buckets in one loop, so that the
    /// cache misses overlap instead of following one another).
    #[inline]
    pub(super) fn touch(&self, tag: u32) -> u64 {
        if self.bits == 0 {
            return 0;
        }
        self.entries[self.home(tag)]
    }

    /// The handle at `index` (from [`Self::find`]).
    #[inline]
    pub(super) fn get(&self, index: usize) -> u32 {
        handle_of(self.entries[index])
    }

    /// Replace the handle at `index` (the key is unchanged).
    #[inline]
    pub(super) fn set(&mut self, index: usize, handle: u32) {
        debug_assert_ne!(handle, EMPTY_HANDLE);
        let e = &mut self.entries[index];
        *e = (*e & !u64::from(u32::MAX)) | u64::from(handle);
    }

    /// Add an entry whose key is not in the table.
    pub(super) fn insert_new(&mut self, tag: u32, handle: u32) {
        debug_assert_ne!(handle, EMPTY_HANDLE);
        // Grow at 13/16 load: linear probing stays within a line or two.
        if (self.len + 1) * 16 > (self.entries.len() * 13) {
            self.grow();
        }
        self.place(tag, handle);
        self.len += 1;
    }

    #[inline]
    fn place(&mut self, tag: u32, handle: u32) {
        let mask = self.mask();
        let mut i = self.home(tag);
        while handle_of(self.entries[i]) != EMPTY_HANDLE {
            i = (i + 1) & mask;
        }
        self.entries[i] = (u64::from(tag) << 32) | u64::from(handle);
    }

    fn grow(&mut self) {
        let bits = if self.bits == 0 {
            MIN_BITS
        } else {
            self.bits + 1
        };
        assert!(bits <= 32, "lookup table capacity exceeded");
        let old = std::mem::replace(&mut self.entries, vec![EMPTY; 1usize << bits]);
        self.bits = bits;
        // Entries wrapped past the end sit at the start of the old array; placing them first
        // could let them take the slots of entries homed at the start. Order does not matter
        // for correctness (linear probing finds every entry from its home), only for speed.
        for e in old {
            if handle_of(e) != EMPTY_HANDLE {
                self.place(entry_tag(e), handle_of(e));
            }
        }
    }

    /// Remove the entry at `index`; returns its handle.
    pub(super) fn remove_at(&mut self, mut index: usize) -> u32 {
        let handle = handle_of(self.entries[index]);
        let mask = self.mask();
        // Backward shift: pull later entries of the cluster into the hole when the hole
        // lies between their home and their position.
        let mut j = index;
        loop {
            j = (j + 1) & mask;
            let e = self.entries[j];
            if handle_of(e) == EMPTY_HANDLE {
                break;
            }
            let home = self.home(entry_tag(e));
            // `e` may move to `index` iff `home` is not in the cyclic range (index, j].
            let dist_j = j.wrapping_sub(home) & mask;
            let dist_hole = j.wrapping_sub(index) & mask;
            if dist_j >= dist_hole {
                self.entries[index] = e;
                index = j;
            }
        }
        self.entries[index] = EMPTY;
        self.len -= 1;
        if self.len == 0 {
            *self = Self::default();
        }
        handle
    }

    /// Every handle (in table order).
    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries
            .iter()
            .copied()
            .filter(|&e| handle_of(e) != EMPTY_HANDLE)
            .map(handle_of)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::{ExtTable, tag_of};

    /// A deliberately weak mix so that tags collide and clusters form.
    fn hash(k: u64) -> u64 {
        (k % 7).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k << 40)
    }

    proptest! {
        /// Against a map: keys are found exactly while present, handles follow `set`, and
        /// removal keeps every other key reachable.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..4, 0u64..48, 0u32..1000), 0..400)) {
            let mut t = ExtTable::default();
            // key -> handle; handles are also used to recover the key (handle = key * 1000 + n).
            let mut model: HashMap<u64, u32> = HashMap::new();
            let key_of = |h: u32| u64::from(h / 1000);
            for (op, k, n) in ops {
                let tag = tag_of(hash(k));
                let found = t.find(tag, |h| key_of(h) == k);
                prop_assert_eq!(found.map(|i| t.get(i)), model.get(&k).copied());
                match op {
                    0 | 1 => if found.is_none() {
                        let h = u32::try_from(k).unwrap() * 1000 + n;
                        t.insert_new(tag, h);
                        model.insert(k, h);
                    },
                    2 => if let Some(i) = found {
                        prop_assert_eq!(Some(t.remove_at(i)), model.remove(&k));
                    },
                    _ => if let Some(i) = found {
                        let h = u32::try_from(k).unwrap() * 1000 + (n + 1) % 1000;
                        t.set(i, h);
                        model.insert(k, h);
                    },
                }
                prop_assert_eq!(t.len(), model.len());
                let mut listed: Vec<u32> = t.iter().collect();
                listed.sort_unstable();
                let mut want: Vec<u32> = model.values().copied().collect();
                want.sort_unstable();
                prop_assert_eq!(listed, want);
            }
            for (k, h) in &model {
                let tag = tag_of(hash(*k));
                let i = t.find(tag, |x| key_of(x) == *k);
                prop_assert_eq!(i.map(|i| t.get(i)), Some(*h));
            }
        }
    }

    #[test]
    fn emptied_table_releases_memory() {
        let mut t = ExtTable::default();
        for k in 0..1000u32 {
            t.insert_new(tag_of(hash(u64::from(k))), k);
        }
        assert!(t.heap_bytes() >= 1000 * 8);
        for k in 0..1000u32 {
            let i = t
                .find(tag_of(hash(u64::from(k))), |h| h == k)
                .expect("present");
            t.remove_at(i);
        }
        assert_eq!((t.len(), t.heap_bytes()), (0, 0));
    }
}
