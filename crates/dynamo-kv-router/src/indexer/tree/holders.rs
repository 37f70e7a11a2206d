//! The holders of a node beyond its primary one, **contiguous**: one block per node, of
//! `2^c` entries for the smallest `c` that fits them (4 entries at least), from a pool per
//! size class.
//!
//! They were a doubly linked list of 24-byte entries scattered over one arena: a query
//! enumerating a popular block's 16 holders followed 15 dependent cache misses, and
//! detaching a holder wrote its two neighbours (two more lines). Here an entry is 4
//! bytes (the worker slot: the node, the links and the key are gone), a node's
//! holders are one or a few cache lines read in order, and removing one moves the
//! block's last entry into its place.
//!
//! A block is named by its size class and its index among the blocks of that class,
//! packed into one `u32` (the node's `Cold::link`): [`BlockRef`]. Each class has a pool of
//! its own, where block `i` of class `c` is entries `i << c ..` (blocks never straddle a
//! chunk of the pool while `2^c` fits a chunk). The number of entries in use is not
//! stored: the node's holder count gives it to writers (`count - 1`, the primary being
//! inline), and readers stop at the first unused entry (`slot == NIL`) or the block's end.
//! A block moves to the next class (copying its entries) when a push finds it full, and
//! to a class twice its length when removals leave it a quarter full (hysteresis: a length
//! that oscillates around a power of two does not move its block at every event); freed
//! blocks go to their class's free list. The pools are [`Arena`]s (in chunks: growth
//! never copies).
//!
//! Capacity: 2^27 blocks **per class** (the index bits of a [`BlockRef`]), so the first
//! limit reached is 2^27 nodes with exactly two holders: at least 270M indexed blocks
//! (past 8 GiB of index). With one pool for all classes, indexed by entry, it was 2^27
//! entries in all, slack included, where the index panicked: about 250M indexed blocks
//! at the 16-worker stream's mix (estimated: ~0.4 further holders per indexed block,
//! blocks ~3/4 full), sooner where more workers share blocks. A pool per class costs one
//! more load before a block (the class's pool header, in cache in practice); measured
//! within the noise of one pool in round 6 of
//! `docs/benchmarks/kv_indexer.md` and again in round 7.

use super::NIL;
use super::arena::{Arena, CHUNK};
use super::id_set::IdSet;

/// Size classes (block of class `c`: `2^c` entries).
const CLASSES: usize = 32;
/// The smallest class: blocks of 4 entries (16 bytes, a quarter of a cache line). With
/// 1- and 2-entry classes, half of all pushes at 100k blocks moved a block to the next
/// class (259k moves, 68M of the apply's 813M instructions in callgrind); the heap is
/// about the same, power-of-two blocks being a quarter empty on average anyway.
const MIN_CLASS: u32 = 2;
/// Bits of a [`BlockRef`] that hold the block's index in its class (the top bits hold the
/// class): at most 2^27 blocks of each class.
const INDEX_BITS: u32 = 27;

/// One holder: its worker slot (the key it holds the node under is the node's canonical
/// one, or listed in `RadixTree::own`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    /// Worker slot, or `NIL` for an unused entry.
    pub(super) slot: u32,
}

impl Holder {
    const UNUSED: Self = Self { slot: NIL };

    pub(super) const fn new(slot: u32) -> Self {
        Self { slot }
    }
}

/// The class of a block for `len >= 1` entries.
#[inline]
pub(super) const fn class_of(len: u32) -> u32 {
    32 - (len - 1).leading_zeros()
}

/// A block: its class and index, packed (see the module docs).
pub(super) type BlockRef = u32;

/// The class of block `b` and its index among that class's blocks.
#[inline]
const fn class_and_index(b: BlockRef) -> (usize, u32) {
    ((b >> INDEX_BITS) as usize, b & ((1 << INDEX_BITS) - 1))
}

/// The class of block `b` and the index of its first entry in that class's pool.
#[inline]
const fn class_and_base(b: BlockRef) -> (usize, usize) {
    let (c, i) = class_and_index(b);
    (c, (i as usize) << c)
}

/// A set of blocks: the indices of each class's blocks (from [`Holders::blocks_holding`]).
#[derive(Debug)]
pub(super) struct BlockMarks {
    classes: Vec<IdSet>,
}

impl BlockMarks {
    /// Whether block `b` is in the set (`false` for `NIL` and blocks past the pools).
    #[inline]
    pub(super) fn contains(&self, b: BlockRef) -> bool {
        let (c, i) = class_and_index(b);
        self.classes.get(c).is_some_and(|blocks| blocks.contains(i))
    }
}

/// The pools of holder blocks (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Holders {
    /// One pool per class (index `c`: blocks of `2^c` entries), created on first use.
    pools: Vec<Arena<Holder>>,
    /// Free blocks of each class (their [`BlockRef`]s).
    free: Vec<Vec<BlockRef>>,
    /// Blocks in use, and their entries (used or not).
    blocks: usize,
    capacity: usize,
}

impl Holders {
    /// A free block of class `c`, its entries unused.
    fn alloc(&mut self, c: u32) -> BlockRef {
        let c = c as usize;
        if self.free.len() <= c {
            self.free.resize_with(c + 1, Vec::new);
            self.pools.resize_with(c + 1, Arena::default);
        }
        self.blocks += 1;
        self.capacity += 1 << c;
        if let Some(b) = self.free[c].pop() {
            return b;
        }
        let pool = &mut self.pools[c];
        let index = pool.len() >> c;
        // Past 8 GiB of index at the smallest class (see the module docs).
        assert!(
            index < 1 << INDEX_BITS && c < CLASSES,
            "radix tree holder blocks of class {c} exhausted"
        );
        for _ in 0..1usize << c {
            pool.push(Holder::UNUSED);
        }
        (c as u32) << INDEX_BITS | index as u32
    }

    /// Free block `b`, whose entries from `used` on are unused already.
    fn release(&mut self, b: BlockRef, used: u32) {
        let (c, base) = class_and_base(b);
        self.blocks -= 1;
        self.capacity -= 1 << c;
        let pool = &mut self.pools[c];
        for i in base..base + used as usize {
            pool[i] = Holder::UNUSED;
        }
        self.free[c].push(b);
    }

    /// Entry `j` of block `b`.
    #[inline]
    pub(super) fn get(&self, b: BlockRef, j: u32) -> Holder {
        let (c, base) = class_and_base(b);
        self.pools[c][base + j as usize]
    }

    fn set(&mut self, b: BlockRef, j: u32, h: Holder) {
        let (c, base) = class_and_base(b);
        self.pools[c][base + j as usize] = h;
    }

    /// The entries in use of block `b`, in order, until `f` returns `false`.
    #[inline]
    pub(super) fn scan(&self, b: BlockRef, mut f: impl FnMut(Holder) -> bool) {
        let (c, base) = class_and_base(b);
        let pool = &self.pools[c];
        let end = base + (1 << c);
        let mut i = base;
        while i < end {
            let run = pool.tail(i);
            let run = &run[..run.len().min(end - i)];
            for &h in run {
                if h.slot == NIL || !f(h) {
                    return;
                }
            }
            i += run.len();
        }
    }

    /// Append `h` to block `b` holding `len` entries (`NIL` and 0 for none); returns the
    /// block, which moved when it was full.
    pub(super) fn push(&mut self, b: BlockRef, len: u32, h: Holder) -> BlockRef {
        let b = if len == 0 {
            self.alloc(MIN_CLASS)
        } else if len == 1 << (b >> INDEX_BITS) {
            self.moved(b, len, class_of(len + 1))
        } else {
            b
        };
        self.set(b, len, h);
        b
    }

    /// Remove entry `j` of block `b` holding `len` entries (the last one takes its place);
    /// returns the block (`NIL` once empty), which moved to a class twice the rest when the
    /// rest fills a quarter of it.
    pub(super) fn swap_remove(&mut self, b: BlockRef, len: u32, j: u32) -> BlockRef {
        let last = self.get(b, len - 1);
        self.set(b, j, last);
        self.set(b, len - 1, Holder::UNUSED);
        let c = b >> INDEX_BITS;
        if len == 1 {
            self.release(b, 0);
            NIL
        } else if c > MIN_CLASS && len - 1 <= 1 << (c - 2) {
            self.moved(b, len - 1, (class_of(len - 1) + 1).max(MIN_CLASS))
        } else {
            b
        }
    }

    /// The first `len` entries of `b` moved to a new block of class `c`; `b` is freed.
    fn moved(&mut self, b: BlockRef, len: u32, c: u32) -> BlockRef {
        let n = self.alloc(c);
        for j in 0..len {
            let h = self.get(b, j);
            self.set(n, j, h);
        }
        self.release(b, len);
        n
    }

    /// The blocks that list a slot for which `wanted` holds (`wanted(NIL)` must be false:
    /// unused entries are `NIL`), from one pass over the pools in order (for a rank's `cleared`
    /// event: a walk over the arena then reads only the blocks that hold the rank, instead
    /// of every node's block at random).
    pub(super) fn blocks_holding(&self, wanted: impl Fn(u32) -> bool) -> BlockMarks {
        let classes = self
            .pools
            .iter()
            .enumerate()
            .map(|(c, pool)| {
                let size = 1usize << c;
                let blocks = pool.len() >> c;
                let mut marks = IdSet::new(blocks);
                let mut mark = |b: usize| marks.insert(b as u32);
                if size <= CHUNK {
                    // A block never straddles a chunk of its pool.
                    let mut i = 0;
                    while i < pool.len() {
                        let run = pool.tail(i);
                        for (k, block) in run.chunks_exact(size).enumerate() {
                            // Without a branch per entry: which entries match is random.
                            if block.iter().fold(false, |any, h| any | wanted(h.slot)) {
                                mark((i >> c) + k);
                            }
                        }
                        i += run.len();
                    }
                } else {
                    for b in 0..blocks {
                        let mut found = false;
                        self.scan((c as u32) << INDEX_BITS | b as u32, |h| {
                            found = wanted(h.slot);
                            !found
                        });
                        if found {
                            mark(b);
                        }
                    }
                }
                marks
            })
            .collect();
        BlockMarks { classes }
    }

    /// Whether a block of `cap` entries may hold as few as one (the smallest class).
    pub(super) const fn is_smallest(cap: u32) -> bool {
        cap <= 1 << MIN_CLASS
    }

    /// Number of entries block `b` can hold.
    pub(super) const fn capacity(b: BlockRef) -> u32 {
        1 << (b >> INDEX_BITS)
    }

    /// Bytes reserved.
    pub(super) fn heap_bytes(&self) -> usize {
        self.pools.iter().map(Arena::heap_bytes).sum::<usize>()
            + self.pools.capacity() * size_of::<Arena<Holder>>()
            + self.free.iter().map(|f| f.capacity() * 4).sum::<usize>()
            + self.free.capacity() * size_of::<Vec<BlockRef>>()
    }

    /// Number of blocks in use (for the invariant checks), with the free blocks checked to
    /// be unused and, with the blocks in use, to fill the pool.
    pub(super) fn checked_blocks(&self) -> usize {
        let mut entries = 0;
        let mut free = 0;
        for (c, list) in self.free.iter().enumerate() {
            for &b in list {
                assert_eq!((b >> INDEX_BITS) as usize, c, "free block in its class");
                let mut any = false;
                self.scan(b, |_| {
                    any = true;
                    false
                });
                assert!(!any, "free block {b} holds entries");
                free += 1usize << c;
            }
        }
        entries += free + self.capacity;
        assert_eq!(
            entries,
            self.pools.iter().map(Arena::len).sum::<usize>(),
            "blocks in use and free fill the pools"
        );
        self.blocks
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Holder, Holders, NIL};

    /// A [`BlockRef`]'s index counts blocks of its class, not entries: the limit is 2^27
    /// blocks of each class (see the module docs).
    #[test]
    fn blocks_are_numbered_within_their_class() {
        let mut h = Holders::default();
        let small: Vec<u32> = (0..3).map(|_| h.alloc(0)).collect();
        let large: Vec<u32> = (0..3).map(|_| h.alloc(5)).collect();
        let index = |b: u32| super::class_and_index(b).1;
        assert_eq!(
            small.iter().map(|&b| index(b)).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(
            large.iter().map(|&b| index(b)).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(h.pools[5].len(), 3 << 5);
        // Entries of different blocks never alias.
        for (k, &b) in small.iter().chain(&large).enumerate() {
            h.set(b, 0, Holder::new(k as u32));
        }
        for (k, &b) in small.iter().chain(&large).enumerate() {
            assert_eq!(h.get(b, 0), Holder::new(k as u32));
        }
        h.release(large[1], 1);
        assert_eq!(h.alloc(5), large[1], "a freed block is reused in its class");
        assert_eq!(h.checked_blocks(), 6);
    }

    proptest! {
        /// Blocks against `Vec`s: pushes, swap-removes, class changes, reuse of freed
        /// blocks; the entries in use always read back as the model's, and
        /// `blocks_holding` marks exactly the blocks that list a slot (blocks of up to 64
        /// entries: pool chunks are 8 entries under `cfg(test)`, so blocks from 16 entries
        /// on straddle them).
        #[test]
        fn behaves_like_vecs(
            ops in proptest::collection::vec((0usize..6, any::<bool>(), 0u32..40), 0..400)
        ) {
            let mut h = Holders::default();
            let mut model: Vec<Vec<Holder>> = vec![Vec::new(); 6];
            let mut refs = [NIL; 6];
            for (k, push, x) in ops {
                let len = model[k].len() as u32;
                if push || len == 0 {
                    let e = Holder::new(x << 3 | k as u32);
                    refs[k] = h.push(refs[k], len, e);
                    model[k].push(e);
                } else {
                    let j = x % len;
                    refs[k] = h.swap_remove(refs[k], len, j);
                    model[k].swap_remove(j as usize);
                }
                for (m, &b) in model.iter().zip(&refs) {
                    let mut got = Vec::new();
                    if b != NIL {
                        h.scan(b, |e| { got.push(e); true });
                    }
                    prop_assert_eq!(&got, m);
                }
                let in_use = model.iter().filter(|m| !m.is_empty()).count();
                prop_assert_eq!(h.checked_blocks(), in_use);
                // Which blocks list a slot (this op's and another), as the model says.
                for slot in [(x << 3) | k as u32, (x << 3) | ((k as u32 + 1) % 6)] {
                    let marks = h.blocks_holding(|s| s == slot);
                    for (m, &b) in model.iter().zip(&refs) {
                        let listed = m.contains(&Holder::new(slot));
                        prop_assert_eq!(b != NIL && marks.contains(b), listed);
                    }
                    prop_assert!(!marks.contains(NIL));
                }
            }
        }
    }
}
