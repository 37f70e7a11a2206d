//! A growable array in fixed-size chunks: growing it allocates one chunk and never moves
//! an element.
//!
//! The node arenas were `Vec`s. At 10M blocks the `cold` arena is ~100 MB, and once the
//! process's heap holds freed memory (any process that has built and dropped an index, or
//! just churned), `realloc` serves its growth from that memory and copies the whole array:
//! 39–360 ms inside one apply event, under the write lock (measured, see
//! `docs/benchmarks/kv_indexer.md`, round 4). Here growth allocates one more chunk of
//! [`CHUNK`] elements (uninitialised: the pages are touched as elements are pushed), so
//! the cost of an event that grows an arena is one allocation, at any size.
//!
//! Element `i` is `chunks[i >> CHUNK_BITS][i & MASK]`: a shift, a mask and one load from
//! the chunk table (a few KiB at 10M elements, so it stays in cache) more than a `Vec`.
//! Consecutive ids are consecutive addresses within a chunk; [`Arena::tail`] gives the
//! rest of a chunk as a slice, so that loops over consecutive ids (the query walk along a
//! chain) run over a plain slice and change chunks only at a boundary.
//!
//! Each chunk starts small and grows like a `Vec` (by a quarter, as the arenas did) until
//! it is full, so that a partly used last chunk wastes at most a quarter of itself (a
//! whole chunk allocated up front leaves up to a chunk unused per arena, megabytes for a
//! tree of 100k blocks); a growth step copies at most one chunk.

use std::ops::{Index, IndexMut};

/// log2 of the elements in a chunk: 2^14, i.e. 256 KiB of 16-byte nodes or 384 KiB of
/// 24-byte ones. Small enough that a growth step copies at most 384 KiB (tens of
/// microseconds) and a partly used last chunk wastes at most a quarter of that; large
/// enough that the chunk table of a 10M-node arena is 611 entries (15 KiB, cache
/// resident) and a chain rarely straddles a boundary (one per 16,384 ids). (2^3 under
/// `cfg(test)`, so that the property tests' trees of a few dozen nodes cross chunk
/// boundaries all the time.)
pub(super) const CHUNK_BITS: u32 = if cfg!(test) { 3 } else { 14 };
/// Elements in a chunk.
pub(super) const CHUNK: usize = 1 << CHUNK_BITS;
const MASK: usize = CHUNK - 1;

/// A growable array of `T` in chunks of [`CHUNK`] elements (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct Arena<T> {
    /// Every chunk but the last holds exactly [`CHUNK`] elements; the last holds
    /// `1..=CHUNK` (there is no chunk while the arena is empty). Only the last chunk ever
    /// grows (up to a capacity of exactly [`CHUNK`]).
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Arena<T> {
    /// An empty arena (allocates nothing).
    pub(super) const fn new() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// Number of elements.
    #[inline]
    pub(super) const fn len(&self) -> usize {
        self.len
    }

    /// Element `i`, if `i < len()`.
    #[cfg(test)]
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i >> CHUNK_BITS)?.get(i & MASK)
    }

    /// Elements `i..` up to the end of `i`'s chunk (or of the arena): consecutive ids as
    /// one slice. Empty when `i >= len()`.
    #[inline]
    pub(super) fn tail(&self, i: usize) -> &[T] {
        self.chunks
            .get(i >> CHUNK_BITS)
            .and_then(|c| c.get(i & MASK..))
            .unwrap_or(&[])
    }

    /// Elements of `i`'s chunk before `i` (`i <= len()`): the ids just below `i` as one
    /// slice, for loops that walk down a chain of consecutive ids. Empty at a chunk's start.
    #[inline]
    pub(super) fn before(&self, i: usize) -> &[T] {
        self.chunks
            .get(i >> CHUNK_BITS)
            .and_then(|c| c.get(..i & MASK))
            .unwrap_or(&[])
    }

    /// Set elements `start..start + n` (all `< len()`) to `x`, a chunk slice at a time
    /// (a run's ids are consecutive: one `fill` per chunk instead of an index per id).
    pub(super) fn fill(&mut self, start: usize, n: usize, x: T)
    where
        T: Copy,
    {
        let end = start + n;
        let mut i = start;
        while i < end {
            let piece = &mut self.chunks[i >> CHUNK_BITS][i & MASK..];
            let k = piece.len().min(end - i);
            assert!(k > 0, "arena fill past its end");
            piece[..k].fill(x);
            i += k;
        }
    }

    /// Set the elements from `start` on (all `< len()`) to the items of `xs`, a chunk
    /// slice at a time.
    pub(super) fn write(&mut self, start: usize, xs: impl IntoIterator<Item = T>) {
        let mut xs = xs.into_iter().peekable();
        let mut i = start;
        while xs.peek().is_some() {
            let piece = &mut self.chunks[i >> CHUNK_BITS][i & MASK..];
            assert!(!piece.is_empty(), "arena write past its end");
            let mut k = 0;
            for (slot, x) in piece.iter_mut().zip(&mut xs) {
                *slot = x;
                k += 1;
            }
            i += k;
        }
    }

    /// The last chunk, with room for `k` more elements (`k` at most what it lacks of
    /// [`CHUNK`]; a new chunk when the last is full or there is none): grown like a `Vec`,
    /// by a quarter and at least 64, up to [`CHUNK`]. Never moves an element of a full
    /// chunk.
    fn room(&mut self, k: usize) -> &mut Vec<T> {
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(64.min(CHUNK)));
        }
        let c = self.chunks.last_mut().expect("a chunk was just ensured");
        debug_assert!(k <= CHUNK - c.len());
        let want = c.len() + k;
        if want > c.capacity() {
            let grown = (c.capacity() + (c.capacity() / 4).max(64)).min(CHUNK);
            c.reserve_exact(want.max(grown) - c.len());
        }
        c
    }

    /// Append `x`.
    pub(super) fn push(&mut self, x: T) {
        self.room(1).push(x);
        self.len += 1;
    }

    /// Append `n` copies of `x`, a chunk slice at a time (a new run's ids are appended
    /// together, and a push per id per arena was ~55 instructions).
    pub(super) fn extend_with(&mut self, n: usize, x: T)
    where
        T: Copy,
    {
        let mut left = n;
        while left > 0 {
            let lacks = match self.chunks.last() {
                Some(c) if c.len() < CHUNK => CHUNK - c.len(),
                _ => CHUNK,
            };
            let k = left.min(lacks);
            let c = self.room(k);
            c.resize(c.len() + k, x);
            left -= k;
        }
        self.len += n;
    }

    /// Every element in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// Bytes reserved (elements' capacity and the chunk table).
    pub(super) fn heap_bytes(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| c.capacity() * size_of::<T>())
            .sum::<usize>()
            + self.chunks.capacity() * size_of::<Vec<T>>()
    }
}

// Indexing checks `i` against the arena's length once. Every chunk but the last holds
// exactly `CHUNK` elements and the last holds the rest (`push` and `extend_with` start a
// chunk only when the last is full, and nothing shrinks one), so `i < len` puts
// `i >> CHUNK_BITS` inside `chunks` and `i & MASK` inside that chunk. The two slice
// checks this replaces (each loading a length from a different line) were ~4 % of the
// tree's apply instructions: every block step reads several arenas (round 21).

impl<T> Index<usize> for Arena<T> {
    type Output = T;

    #[inline]
    #[expect(unsafe_code, reason = "one bounds check per index instead of two")]
    fn index(&self, i: usize) -> &T {
        assert!(i < self.len, "arena index {i} out of bounds ({})", self.len);
        // SAFETY: `i < len`, and see the comment above the impl.
        unsafe {
            self.chunks
                .get_unchecked(i >> CHUNK_BITS)
                .get_unchecked(i & MASK)
        }
    }
}

impl<T> IndexMut<usize> for Arena<T> {
    #[inline]
    #[expect(unsafe_code, reason = "one bounds check per index instead of two")]
    fn index_mut(&mut self, i: usize) -> &mut T {
        assert!(i < self.len, "arena index {i} out of bounds ({})", self.len);
        // SAFETY: `i < len`, and see the comment above the impl.
        unsafe {
            self.chunks
                .get_unchecked_mut(i >> CHUNK_BITS)
                .get_unchecked_mut(i & MASK)
        }
    }
}

impl<T> FromIterator<T> for Arena<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut a = Self::new();
        for x in iter {
            a.push(x);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Arena, CHUNK};

    proptest! {
        /// Against a `Vec`: the same elements at every index, `get` and `tail` agree with
        /// slices of the `Vec` (across and at chunk boundaries), and mutation through an
        /// index lands where reads see it.
        #[test]
        fn behaves_like_a_vec(ops in proptest::collection::vec((0u8..4, 0usize..80, any::<u32>()), 0..200)) {
            let mut a = Arena::new();
            let mut v: Vec<u32> = Vec::new();
            for (op, i, x) in ops {
                match op {
                    0 => {
                        a.push(x);
                        v.push(x);
                    }
                    2 => {
                        a.extend_with(i % 20, x);
                        v.extend(std::iter::repeat_n(x, i % 20));
                    }
                    1 if i < v.len() => {
                        a[i] = x;
                        v[i] = x;
                    }
                    _ => {}
                }
                prop_assert_eq!(a.len(), v.len());
                prop_assert_eq!(a.get(i), v.get(i));
                let end = if i < v.len() { ((i / CHUNK + 1) * CHUNK).min(v.len()) } else { i };
                prop_assert_eq!(a.tail(i), v.get(i..end).unwrap_or(&[]));
                if i <= v.len() {
                    prop_assert_eq!(a.before(i), &v[i / CHUNK * CHUNK..i]);
                }
            }
            prop_assert_eq!(a.iter().copied().collect::<Vec<_>>(), v.clone());
            for (i, x) in v.iter().enumerate() {
                prop_assert_eq!(&a[i], x);
            }
        }
    }

    proptest! {
        /// `fill` and `write` over ranges that cross chunk boundaries set exactly the
        /// elements a `Vec`'s slice operations would.
        #[test]
        fn fill_and_write_match_a_vec(len in 1usize..60, ops in proptest::collection::vec((any::<bool>(), 0usize..60, 0usize..30, any::<u32>()), 0..30)) {
            let mut a: Arena<u32> = (0..len as u32).collect();
            let mut v: Vec<u32> = (0..len as u32).collect();
            for (fill, start, n, x) in ops {
                let start = start % len;
                let n = n.min(len - start);
                if fill {
                    a.fill(start, n, x);
                    v[start..start + n].fill(x);
                } else {
                    let xs: Vec<u32> = (0..n as u32).map(|k| x.wrapping_add(k)).collect();
                    a.write(start, xs.iter().copied());
                    v[start..start + n].copy_from_slice(&xs);
                }
                prop_assert_eq!(a.iter().copied().collect::<Vec<_>>(), v.clone());
            }
        }
    }

    #[test]
    fn growth_never_moves_an_element_of_a_full_chunk() {
        let mut a: Arena<u64> = Arena::new();
        for i in 0..CHUNK as u64 {
            a.push(i);
        }
        // The first chunk is full: from here on no element may move.
        let first: *const u64 = &a[0];
        let last: *const u64 = &a[CHUNK - 1];
        for i in 0..(CHUNK * 40) as u64 {
            a.push(i);
        }
        assert!(std::ptr::eq(first, &a[0]));
        assert!(std::ptr::eq(last, &a[CHUNK - 1]));
        // Nor any of a later full chunk.
        let second: *const u64 = &a[CHUNK];
        a.push(0);
        assert!(std::ptr::eq(second, &a[CHUNK]));
        // Every chunk but the last is exactly full; the last has room for the rest.
        assert_eq!(a.chunks.len(), 42);
        assert!(a.chunks[..41].iter().all(|c| c.capacity() == CHUNK));
        assert_eq!(a.chunks[41].len(), 1);
        assert!(a.chunks[41].capacity() <= CHUNK);
    }

    /// An index past the length panics, also inside the last chunk's capacity (the
    /// unchecked chunk access relies on the length check).
    #[test]
    #[should_panic(expected = "out of bounds")]
    fn an_index_past_the_length_panics() {
        let mut a: Arena<u64> = Arena::new();
        a.extend_with(CHUNK + 3, 7);
        assert_eq!(a[CHUNK + 2], 7);
        let _ = a[CHUNK + 3];
    }

    #[test]
    fn tail_stops_at_the_chunk_boundary() {
        let a: Arena<usize> = (0..CHUNK * 2 + 3).collect();
        assert_eq!(a.tail(1), &(1..CHUNK).collect::<Vec<_>>()[..]);
        assert_eq!(a.tail(CHUNK - 1), &[CHUNK - 1]);
        assert_eq!(a.tail(CHUNK), &(CHUNK..CHUNK * 2).collect::<Vec<_>>()[..]);
        assert_eq!(a.tail(CHUNK * 2 + 2), &[CHUNK * 2 + 2]);
        assert!(a.tail(CHUNK * 2 + 3).is_empty());
        assert!(a.tail(CHUNK * 9).is_empty());
        assert_eq!(a.get(CHUNK * 2 + 3), None);
    }
}

/// The tree over chunked arenas (`CHUNK` is 8 under `cfg(test)`).
#[cfg(test)]
mod tree_tests {
    use super::super::RadixTree;
    use super::CHUNK;
    use crate::hashing::LocalBlockHash;
    use crate::protocols::{ExternalSequenceBlockHash, KvCacheStoredBlockData, WorkerWithDpRank};

    /// Blocks with external hashes `ext` and local hashes from `local` on.
    fn blocks(ext: std::ops::Range<u64>, local: u64) -> Vec<KvCacheStoredBlockData> {
        let start = ext.start;
        ext.map(|b| KvCacheStoredBlockData::new(b, local + b - start))
            .collect()
    }

    fn q(locals: impl Iterator<Item = u64>) -> Vec<LocalBlockHash> {
        locals.map(LocalBlockHash).collect()
    }

    #[test]
    fn a_chain_across_chunks_scores_its_full_length() {
        let mut t = RadixTree::default();
        let (a, b) = (WorkerWithDpRank::new(1, 0), WorkerWithDpRank::new(2, 0));
        // This chain (ids 0..) crosses four chunk boundaries.
        let n = CHUNK as u64 * 4 + 3;
        t.store_blocks(a, None, &blocks(0..n, 1000)).expect("store");
        // A second rank holds exactly the first chunk and a half (same contents).
        let half = CHUNK as u64 * 3 / 2;
        t.store_blocks(b, None, &blocks(5000..5000 + half, 1000))
            .expect("store");
        t.check_invariants();
        let full = t.find_matches(&q(1000..1000 + n + 2), false);
        assert_eq!(full.get(a), Some(n as u32));
        assert_eq!(full.get(b), Some(half as u32));
        // A query that leaves the chain right at a chunk boundary (ids are depth).
        for stop in [
            CHUNK as u64 - 1,
            CHUNK as u64,
            CHUNK as u64 * 2 - 1,
            CHUNK as u64 * 2,
        ] {
            let mut query = q(1000..1000 + stop);
            query.push(LocalBlockHash(7));
            let s = t.find_matches(&query, false);
            assert_eq!(s.get(a), Some(stop as u32), "stop at {stop}");
            // With early exit `b` leaves at depth `half` at the latest, then `a` is alone
            // and stops there.
            let e = t.find_matches(&query, true);
            assert_eq!(
                e.get(a),
                Some(stop.min(half + 1) as u32),
                "early exit at {stop}"
            );
        }
        // Evicting the chain's tail frees the last chunks' ids, and a new chain reuses
        // them, across the same boundaries.
        let tail: Vec<u64> = (CHUNK as u64 * 2..n).rev().collect();
        t.remove(a, &tail).expect("remove");
        t.check_invariants();
        t.store_blocks(
            a,
            Some(ExternalSequenceBlockHash(CHUNK as u64 * 2 - 1)),
            &blocks(9000..9000 + n, 9077),
        )
        .expect("store");
        t.check_invariants();
        let mut query = q(1000..1000 + CHUNK as u64 * 2);
        query.extend(q(9077..9077 + n));
        assert_eq!(
            t.find_matches(&query, false).get(a),
            Some((CHUNK as u64 * 2 + n) as u32)
        );
        t.remove_worker(1);
        t.remove_worker(2);
        assert_eq!(t.node_count(), 0);
        assert_eq!(t.heap_bytes(), RadixTree::default().heap_bytes());
    }
}
