//! A hash table of `u32` handles keyed by a 32-bit tag (the tree's `hashes`: external block
//! hash -> node; and the child index: `(parent, tokens_hash)` -> node).
//!
//! Open addressing with linear probing over one array of 8-byte entries: the handle plus
//! one (low 32 bits, 0 for an empty bucket) and a 32-bit tag of the key's hash (high 32
//! bits). The key itself is not stored: it lives in the arena, read through the handle only
//! when a tag matches, i.e. almost only for the entry being looked for. A probe therefore
//! touches one cache line in the common case (hashbrown's layout touches a control line
//! and a data line, then the arena to compare).
//!
//! An entry's home bucket is the top bits of its tag, so the table grows without reading a
//! single key (a rehash that recomputes every hash through the arena is one random read per
//! entry), and **it grows incrementally**: at 13/16 load (11/16 from 2^19 buckets, see
//! [`LARGE_BITS`]) a zeroed array of twice the size becomes the table, the old one is kept
//! beside it, and each later insert first moves the entries of the next [`MIGRATE_STEP`]
//! old buckets across (in bucket order, so the new array is written nearly in order). Until
//! the old array is empty a lookup that misses in the new array probes the old one too. A
//! whole-table doubling in one insert was the largest single event of CPU time at 10M
//! blocks (a rank's 8 -> 16 MiB lookup: 8–15 ms); now an insert moves at most a few dozen
//! entries. A table's new array is **zeroed ahead of time**: from 1/32 below that load on,
//! each insert appends [`PREPARE_STEP`] zeroed buckets to it (or more, so that it is
//! complete by the growth insert; allocated once at its full size, so it never moves), and
//! the growth insert finds it ready: writing 16 MiB of zeros in that one insert was the
//! largest event left at 10M (~4.5 ms), 256 MiB at 50M ~170 ms (a calloc of untouched pages
//! instead costs a page fault per first touch on the probe path, measured slower), and
//! while only tables of 2^20 buckets or more were prepared, the 8 MiB arrays of the
//! 2^19-bucket ones still made 2–4 ms events at 10M. A table that settles just below its
//! growth would hold twice its size for good (from 12/16 load, every rank's lookup at 100k
//! blocks did, +40 % heap; from 25/32, the child table at 10M blocks did, +4 MiB), so an
//! array that has gained nothing for a sixteenth of the table's size in inserts
//! ([`IDLE_INSERTS`]: complete but not grown into, or left behind when the table fell back
//! below that load) is released, and not prepared again until the table has grown by a
//! [`RESUME_GROWTH`]th of its size. Tables under [`PREPARE_MIN`] buckets zero theirs at
//! growth (short anyway). Deletion shifts the following entries of the cluster back (no
//! tombstones), so nothing is ever rehashed in place either.

use super::id_set::IdSet;

/// Smallest non-empty table (log2 of its buckets).
const MIN_BITS: u32 = 3;
/// Old buckets swept (or entries moved) per insert while the table grows: the old array
/// (half the new one, at most 13/16 full) is empty after `old buckets / MIGRATE_STEP`
/// inserts, long before the new one (at most 13/32 full when it started) needs to grow in
/// turn.
/// (One under `cfg(test)`, so that the property tests' small tables spend most of their
/// life half migrated.)
const MIGRATE_STEP: usize = if cfg!(test) { 1 } else { 16 };
/// Smallest table (buckets) whose next array is zeroed ahead of time: 2^15 buckets (256 KiB;
/// zeroing its 512 KiB next array at once took ~0.2 ms here). (16 under `cfg(test)`.)
const PREPARE_MIN: usize = if cfg!(test) { 16 } else { 1 << 15 };
/// A complete next array is released after a sixteenth of the table's buckets in inserts
/// without growth (zeroing it again costs 32 bucket writes, in order, per such insert).
const IDLE_INSERTS: usize = 16;
/// ... and prepared again once the table holds a 128th of its buckets more than when it
/// was released.
const RESUME_GROWTH: usize = 128;
/// Buckets of the next array zeroed per insert from 1/32 below the growth load on: a table
/// of `n` buckets goes from there to its growth in `n / 32` inserts (more when removals
/// come in between) and the next array has `2n` buckets, so 64 an insert would just do; 128
/// (1 KiB, 16 sequential lines) is done halfway. (More when preparing starts later, after a
/// release: as many as complete it by the growth insert.)
const PREPARE_STEP: usize = 128;
/// An old array of at least this many buckets, once migrated (or a next array released
/// unused), is not freed at once but [`RETIRE_STEP`] buckets an operation (shrunk in
/// place; the last step frees it): freeing the 128 MiB old array of a 2^25-bucket table
/// (one table for all ranks at 50M blocks) unmapped 32k pages inside one event, 8 ms,
/// and releasing a 64 MiB next array at 10M blocks 2.6 ms. (Small under `cfg(test)`.)
const RETIRE_MIN: usize = if cfg!(test) { 16 } else { 1 << 17 };
/// Buckets of a retired array released per step: 1 MiB, 60-120 µs of unmapping.
const RETIRE_STEP: usize = if cfg!(test) { 8 } else { 1 << 17 };
/// Operations between two release steps. A step every operation let one event of many
/// inserts (a 39-block store) release a whole 4 MiB array inside it: 0.4-0.6 ms of
/// unmapping on a 2-core guest, the largest apply event at 1M blocks with 1,000 workers.
/// One step per 64 operations is at most one in all but the largest events, and a 128 MiB
/// array is still gone within 8,192 operations, long before its table can grow again.
/// (Two under `cfg(test)`.)
const RETIRE_PACE: u32 = if cfg!(test) { 2 } else { 64 };
/// Set in an index from [`ExtTable::find`] for an entry of the old array.
const IN_OLD: usize = 1 << 63;
/// Load (in 32nds) at which a table grows: 26 (13/16), or [`LARGE_LIMIT`] in tables of at
/// least 2^`LARGE_BITS` buckets.
const SMALL_LIMIT: usize = 26;
/// From 2^12 buckets (32 KiB) a table grows at 22/32 load instead. A store of a new block
/// probes for its hash and misses, walking to the first empty bucket: at 25/32 load ~15
/// buckets, in two cache lines two times in three (only the first is prefetched); ~6.5 on
/// average over the loads a table passes through between 13/32 and 26/32, ~4.5 between
/// 11/32 and 22/32 (counted in the scale bench, round 16 of `docs/benchmarks/kv_indexer.md`).
/// The cost is heap in a quarter of the sizes (log2(26/22) of each doubling), where the
/// table has doubled and would not have at 26/32. Until round 19 only tables of 2^19
/// buckets and more did (the node-per-block tree's heap was close to its target at smaller
/// sizes); the run tree's heap is 0.2-0.4x the reference's, and with 1,000 workers at 100k
/// blocks the removals' probe walks were its hottest loop (apply 0.71x -> 0.61x the
/// reference's, heap 35 -> 42 B a live block there). Tiny tables keep 26/32.
/// (2^11 under `cfg(test)`: the table tests below use 1,024-bucket tables at the small
/// limit, and `large_tables_grow_at_their_own_limit` crosses into the large one.)
const LARGE_BITS: u32 = if cfg!(test) { 11 } else { 12 };
/// Growth load (in 32nds) of the tables of at least 2^`LARGE_BITS` buckets.
const LARGE_LIMIT: usize = 22;

/// The 32-bit tag of a key's (already mixed) hash.
#[inline]
pub(super) const fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// `handle + 1`: 0 is an empty bucket.
#[inline]
const fn stored(e: u64) -> u32 {
    e as u32
}

#[inline]
const fn handle_of(e: u64) -> u32 {
    (e as u32).wrapping_sub(1)
}

#[inline]
const fn entry_tag(e: u64) -> u32 {
    (e >> 32) as u32
}

#[inline]
const fn entry(tag: u32, handle: u32) -> u64 {
    ((tag as u64) << 32) | (handle as u64 + 1)
}

/// Home bucket of `tag` in an array of `2^bits` buckets (`bits > 0`).
#[inline]
const fn home(tag: u32, bits: u32) -> usize {
    (tag >> (32 - bits)) as usize
}

/// A hint that `x` is about to be read (no effect on what any load returns).
#[inline(always)]
pub(super) fn prefetch_read<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    #[expect(unsafe_code, reason = "a prefetch hint: reads nothing, cannot fault")]
    // SAFETY: `_mm_prefetch` only hints the cache; it needs SSE, which every x86_64 has.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(x).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Index of the entry with tag `tag` whose handle satisfies `eq`, in one array; on a miss,
/// the first empty bucket from `tag`'s home on (where [`place`] would put such an entry).
/// Always inlined, with the caller's `eq`: as a call (LLVM's choice for the tree's
/// closures) its entry, exit and captures took ~18 of a lookup's ~70 instructions.
#[inline(always)]
fn probe(a: &[u64], bits: u32, tag: u32, eq: &mut impl FnMut(u32) -> bool) -> Result<usize, usize> {
    let mask = a.len() - 1;
    let mut i = home(tag, bits);
    loop {
        let e = a[i];
        if stored(e) == 0 {
            return Err(i);
        }
        if entry_tag(e) == tag && eq(handle_of(e)) {
            return Ok(i);
        }
        i = (i + 1) & mask;
    }
}

/// Put an entry in the first empty bucket from its home on.
#[inline]
fn place(a: &mut [u64], bits: u32, e: u64) {
    let mask = a.len() - 1;
    let mut i = home(entry_tag(e), bits);
    while stored(a[i]) != 0 {
        i = (i + 1) & mask;
    }
    a[i] = e;
}

/// Empty bucket `index` of one array by backward shift: later entries of the cluster move
/// into the hole when it lies between their home and their position. Entries only move
/// to lower positions (cyclically), into the hole.
fn remove_from(a: &mut [u64], bits: u32, mut index: usize) {
    let mask = a.len() - 1;
    // An entry's home is the top `bits` bits of its tag, i.e. of the entry itself.
    let shift = 64 - bits;
    let mut j = index;
    loop {
        j = (j + 1) & mask;
        // (`j` is masked, so always in range: `get` only spares the panic path.)
        let Some(&e) = a.get(j) else { break };
        if stored(e) == 0 {
            break;
        }
        debug_assert_eq!((e >> shift) as usize, home(entry_tag(e), bits));
        // `e` may move to `index` iff its home is not in the cyclic range (index, j], i.e.
        // it is at least as far from its home as from the hole.
        if j.wrapping_sub((e >> shift) as usize) & mask >= j.wrapping_sub(index) & mask {
            a[index] = e;
            index = j;
        }
    }
    a[index] = 0;
}

/// Remove the entries of one array whose handle is marked; returns how many.
///
/// The scan starts just after an empty bucket, so no cluster wraps past its start. A
/// removal shifts later entries of the cluster back into the hole, only from buckets not
/// yet visited to the current one or later, so re-reading the current bucket after a
/// removal visits every entry exactly once.
fn remove_marked_in(a: &mut [u64], bits: u32, marked: &IdSet) -> usize {
    let mask = a.len() - 1;
    // A table is never full (13/16 load at most), so it has an empty bucket.
    let Some(empty) = a.iter().position(|&e| stored(e) == 0) else {
        return 0;
    };
    let mut removed = 0;
    let mut k = 1;
    while k <= a.len() {
        let i = (empty + k) & mask;
        // (An empty bucket's handle is `NIL`, never in the set: no branch on emptiness.)
        if marked.contains(handle_of(a[i])) {
            remove_from(a, bits, i);
            removed += 1;
        } else {
            k += 1;
        }
    }
    removed
}

/// Where a missed key goes (from [`ExtTable::find_or_vacant`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Vacant(usize);

/// `tag -> u32 handle` (several handles may share a tag; the caller's `eq` tells them
/// apart); handles are never `u32::MAX`.
#[derive(Debug, Default)]
pub(super) struct ExtTable {
    entries: Vec<u64>,
    /// log2 of `entries.len()` (0 when unallocated).
    bits: u32,
    /// Entries in both arrays.
    len: usize,
    /// While growing: the previous array, whose buckets before `cursor` are empty.
    old: Vec<u64>,
    old_bits: u32,
    old_len: usize,
    cursor: usize,
    /// The next array (twice `entries`), zeroed up to its length, allocated at its full
    /// capacity from 25/32 load on in tables of at least [`PREPARE_MIN`] buckets (see the
    /// module docs).
    next: Vec<u64>,
    /// Inserts since `next` last gained zeroed buckets (see [`IDLE_INSERTS`]).
    idle: usize,
    /// No preparing while `len` is below this (set when an unused next array is released).
    resume_at: usize,
    /// A migrated old array being released a step at a time (see [`RETIRE_MIN`]).
    retired: Vec<u64>,
    /// Operations until its next step (see [`RETIRE_PACE`]).
    retire_wait: u32,
    /// While `len` is below this, an insert only writes its entry: no migration, release,
    /// preparing or growth is due (0 while one is; see [`Self::settle`]). The checks it
    /// stands for were ~40 of the ~60 instructions of every insert.
    quiet: usize,
}

impl ExtTable {
    /// Number of entries.
    pub(super) const fn len(&self) -> usize {
        self.len
    }

    /// Bytes reserved.
    pub(super) fn heap_bytes(&self) -> usize {
        (self.entries.capacity()
            + self.old.capacity()
            + self.next.capacity()
            + self.retired.capacity())
            * 8
    }

    /// Index of the entry whose key has tag `tag` and satisfies `eq(handle)`.
    #[inline]
    pub(super) fn find(&self, tag: u32, eq: impl FnMut(u32) -> bool) -> Option<usize> {
        self.find_or_vacant(tag, eq).ok()
    }

    /// [`Self::find`], and on a miss a [`Vacant`] for [`Self::insert_vacant`]: the bucket
    /// the probe stopped at, so that inserting the missing key does not walk the cluster a
    /// second time (a lookup at 13/16 load walks ~15 buckets to an empty one).
    #[inline]
    pub(super) fn find_or_vacant(
        &self,
        tag: u32,
        mut eq: impl FnMut(u32) -> bool,
    ) -> Result<usize, Vacant> {
        if self.len == 0 {
            return Err(Vacant(usize::MAX));
        }
        let vacant = match probe(&self.entries, self.bits, tag, &mut eq) {
            Ok(i) => return Ok(i),
            Err(v) => v,
        };
        if self.old_len != 0
            && let Ok(i) = probe(&self.old, self.old_bits, tag, &mut eq)
        {
            return Ok(i | IN_OLD);
        }
        Err(Vacant(vacant))
    }

    /// [`Self::insert_new`] for the key that [`Self::find_or_vacant`] just missed (no
    /// change to the table in between): straight into the vacant bucket unless this insert
    /// migrates or grows the table, which moves entries.
    pub(super) fn insert_vacant(&mut self, vacant: Vacant, tag: u32, handle: u32) {
        let Vacant(i) = vacant;
        debug_assert_ne!(handle, u32::MAX);
        if self.len < self.quiet {
            debug_assert_eq!(stored(self.entries[i]), 0);
            self.entries[i] = entry(tag, handle);
            self.len += 1;
            return;
        }
        if i == usize::MAX
            || self.old_len != 0
            || !self.retired.is_empty()
            || self.grows_on_insert()
        {
            return self.insert_new(tag, handle);
        }
        debug_assert_eq!(stored(self.entries[i]), 0);
        if self.prepares_on_insert() {
            self.prepare();
        }
        self.entries[i] = entry(tag, handle);
        self.len += 1;
        self.settle();
    }

    /// Recompute [`Self::quiet`] after a change of state: the first length at which an
    /// insert grows the table or zeroes ahead (both only become due as `len` grows), or 0
    /// while an old, next or retired array needs inserts' work.
    fn settle(&mut self) {
        self.quiet = if self.bits == 0
            || self.old_len != 0
            || !self.retired.is_empty()
            || self.next.capacity() != 0
        {
            0
        } else if self.entries.len() < PREPARE_MIN {
            self.growth_len()
        } else {
            // `zeroes_ahead` holds from `(len + 1) * 32 > buckets * (limit - 1)` on, i.e.
            // from `len = buckets * (limit - 1) / 32`, once `len >= resume_at`.
            let ahead = (self.entries.len() * (self.limit() - 1) / 32).max(self.resume_at);
            self.growth_len().min(ahead)
        };
    }

    /// Ask the CPU to load the home bucket of `tag` into cache, without waiting for it: a
    /// caller that knows several keys ahead asks for all their buckets first, so that the
    /// cache misses overlap instead of following one another. A hint, not a load: it
    /// retires at once, so the work after it is not held up behind the miss (loads in a
    /// loop instead, as this was until round 15, stalled the apply behind the first one
    /// and were slower than nothing in tables that mostly fit in cache).
    #[inline]
    pub(super) fn prefetch(&self, tag: u32) {
        if self.bits == 0 {
            return;
        }
        prefetch_read(&self.entries[home(tag, self.bits)]);
        if self.old_len != 0 {
            prefetch_read(&self.old[home(tag, self.old_bits)]);
        }
    }

    /// [`Self::prefetch`] for each of `tags`, with the table's state read once (an event
    /// asks for all its hashes' buckets first; per tag, the checks were a quarter of it).
    #[inline]
    pub(super) fn prefetch_all(&self, tags: impl Iterator<Item = u32>) {
        if self.bits == 0 {
            return;
        }
        let (new, bits) = (self.entries.as_slice(), self.bits);
        if self.old_len == 0 {
            for tag in tags {
                prefetch_read(&new[home(tag, bits)]);
            }
        } else {
            let (old, old_bits) = (self.old.as_slice(), self.old_bits);
            for tag in tags {
                prefetch_read(&new[home(tag, bits)]);
                prefetch_read(&old[home(tag, old_bits)]);
            }
        }
    }

    #[inline]
    fn at(&self, index: usize) -> u64 {
        if index & IN_OLD == 0 {
            self.entries[index]
        } else {
            self.old[index & !IN_OLD]
        }
    }

    /// The handle at `index` (from [`Self::find`]).
    #[inline]
    pub(super) fn get(&self, index: usize) -> u32 {
        handle_of(self.at(index))
    }

    /// Add an entry whose key is not in the table. (Invalidates indices from `find`.)
    pub(super) fn insert_new(&mut self, tag: u32, handle: u32) {
        debug_assert_ne!(handle, u32::MAX);
        if !self.retired.is_empty() {
            self.release_retired();
        }
        if self.old_len != 0 {
            self.migrate(MIGRATE_STEP);
        }
        if self.prepares_on_insert() {
            self.prepare();
        }
        if self.grows_on_insert() {
            self.grow();
        }
        place(&mut self.entries, self.bits, entry(tag, handle));
        self.len += 1;
        self.settle();
    }

    /// Whether the next insert grows the table: at its load limit (see [`SMALL_LIMIT`],
    /// [`LARGE_LIMIT`]) of all entries (linear probing stays within a line or two).
    #[inline]
    fn grows_on_insert(&self) -> bool {
        self.len >= self.growth_len()
    }

    /// The number of entries at which an insert grows the table.
    #[inline]
    const fn growth_len(&self) -> usize {
        self.entries.len() * self.limit() / 32
    }

    /// The load (in 32nds) at which the table grows.
    #[inline]
    const fn limit(&self) -> usize {
        if self.bits >= LARGE_BITS {
            LARGE_LIMIT
        } else {
            SMALL_LIMIT
        }
    }

    /// Whether the next insert zeroes more of the next array, or counts towards releasing
    /// it (see [`Self::prepare`]).
    #[inline]
    fn prepares_on_insert(&self) -> bool {
        self.next.capacity() != 0 || self.zeroes_ahead()
    }

    /// Whether the table is where its next array is zeroed ahead: from 1/32 below its
    /// growth load on (in tables of [`PREPARE_MIN`] buckets or more), unless an unused one
    /// was released since the table last grew and it has not grown enough since (see
    /// [`RESUME_GROWTH`]).
    #[inline]
    fn zeroes_ahead(&self) -> bool {
        self.entries.len() >= PREPARE_MIN
            && (self.len + 1) * 32 > self.entries.len() * (self.limit() - 1)
            && self.len >= self.resume_at
    }

    /// Zero the next [`PREPARE_STEP`] buckets of the next array (allocating it, at its
    /// full size, the first time), or as many more as complete it by the growth insert;
    /// or, once it has been complete (or the table has fallen back below that load) for
    /// [`IDLE_INSERTS`] inserts, release it.
    fn prepare(&mut self) {
        let want = self.entries.len() * 2;
        if self.next.len() == want || !self.zeroes_ahead() {
            self.idle += 1;
            if self.idle * IDLE_INSERTS > self.entries.len() {
                let next = std::mem::take(&mut self.next);
                self.retire(next);
                self.idle = 0;
                // Not so close to the growth insert that zeroing the whole array again
                // takes more than 512 buckets an insert.
                let cap = self.entries.len();
                self.resume_at =
                    (self.len + cap / RESUME_GROWTH).min(self.growth_len() - cap / 256);
            }
            return;
        }
        if self.next.capacity() < want {
            self.next = Vec::with_capacity(want);
        }
        // Inserts before the growth one, at least (removals in between only add to them).
        let left = self.growth_len().saturating_sub(self.len).max(1);
        let step = PREPARE_STEP.max((want - self.next.len()).div_ceil(left));
        let n = (self.next.len() + step).min(want);
        self.next.resize(n, 0);
        self.idle = 0;
    }

    /// Start growing: the next array (zeroed by the inserts before, see [`Self::prepare`])
    /// becomes the table and the current one is migrated by later inserts.
    fn grow(&mut self) {
        // Not reached in practice (see `MIGRATE_STEP`); keeps a single old array.
        if self.old_len != 0 {
            self.migrate(usize::MAX);
        }
        let bits = if self.bits == 0 {
            MIN_BITS
        } else {
            self.bits + 1
        };
        assert!(bits <= 32, "lookup table capacity exceeded");
        // Zeroed by writes (`resize`, not `vec![0; n]`, which would be a calloc of
        // untouched pages): a bucket is then one page fault's worth cheaper when the
        // migration and later probes first touch it. Complete already in a table of
        // `PREPARE_MIN` buckets or more; the rest (if any) is written here.
        let mut fresh = std::mem::take(&mut self.next);
        fresh.resize(1usize << bits, 0);
        self.idle = 0;
        self.resume_at = 0;
        self.old = std::mem::replace(&mut self.entries, fresh);
        self.old_bits = self.bits;
        self.bits = bits;
        self.old_len = self.len;
        self.cursor = 0;
        if self.old_len == 0 {
            self.old = Vec::new();
        }
    }

    /// Move the entries of the next `buckets` old buckets (at least) to the new array,
    /// stopping only at an empty bucket: the old array then holds whole clusters after
    /// `cursor` (a cluster that wraps keeps its head, at the end of the array), so it stays
    /// a valid table of the rest with nothing shifted. (Removing entry by entry with
    /// backward shift moved each cluster's rest once per entry: quadratic in the cluster,
    /// 3 % of the whole bench's samples at 10M.)
    fn migrate(&mut self, buckets: usize) {
        let mut n = 0;
        while self.cursor < self.old.len() {
            let e = self.old[self.cursor];
            if stored(e) == 0 {
                if n >= buckets {
                    break;
                }
            } else {
                place(&mut self.entries, self.bits, e);
                self.old[self.cursor] = 0;
                self.old_len -= 1;
            }
            self.cursor += 1;
            n += 1;
        }
        if self.old_len == 0 {
            self.retire_old();
        }
    }

    /// The old array is empty: free it, or retire it when large (see [`RETIRE_MIN`]).
    fn retire_old(&mut self) {
        let old = std::mem::take(&mut self.old);
        self.cursor = 0;
        self.retire(old);
    }

    /// Free `array`, or when it is large retire it (see [`RETIRE_MIN`]; a retired array
    /// still being released is freed at once then, which takes two growths or releases
    /// of one table within `RETIRE_PACE` operations per MiB of the first: 8,192 for the
    /// largest, 128 MiB, whose table then needs millions of inserts to grow again).
    fn retire(&mut self, array: Vec<u64>) {
        if array.len() >= RETIRE_MIN {
            self.retired = array;
            self.retire_wait = RETIRE_PACE - 1;
        }
    }

    /// Release the next [`RETIRE_STEP`] buckets of the retired array, once every
    /// [`RETIRE_PACE`] calls.
    fn release_retired(&mut self) {
        if self.retire_wait > 0 {
            self.retire_wait -= 1;
            return;
        }
        self.retire_wait = RETIRE_PACE - 1;
        let keep = self.retired.len().saturating_sub(RETIRE_STEP);
        if keep == 0 {
            self.retired = Vec::new();
        } else {
            self.retired.truncate(keep);
            self.retired.shrink_to_fit();
        }
    }

    /// Remove the entry at `index`; returns its handle.
    pub(super) fn remove_at(&mut self, index: usize) -> u32 {
        let handle = self.get(index);
        if index & IN_OLD == 0 {
            remove_from(&mut self.entries, self.bits, index);
        } else {
            remove_from(&mut self.old, self.old_bits, index & !IN_OLD);
            self.old_len -= 1;
            if self.old_len == 0 {
                self.retire_old();
                self.settle();
            }
        }
        if !self.retired.is_empty() {
            self.release_retired();
            self.settle();
        }
        self.len -= 1;
        if self.len == 0 {
            *self = Self::default();
        }
        handle
    }

    /// Remove the entry of `handle` under `tag` (the table holds it). The probe compares
    /// whole buckets (tag and handle are both known: no key is read), and in a table that
    /// is not growing or releasing an array, nothing but the bucket's removal is done
    /// (through `find` and `remove_at`, a key's removal was ~130 instructions).
    pub(super) fn remove_entry(&mut self, tag: u32, handle: u32) {
        if self.old_len == 0 && self.retired.is_empty() {
            let want = entry(tag, handle);
            let mask = self.entries.len() - 1;
            let mut i = home(tag, self.bits);
            while self.entries[i] != want {
                assert_ne!(stored(self.entries[i]), 0, "the entry is in the table");
                i = (i + 1) & mask;
            }
            remove_from(&mut self.entries, self.bits, i);
            self.len -= 1;
            if self.len == 0 {
                *self = Self::default();
            }
            return;
        }
        let i = self
            .find(tag, |x| x == handle)
            .expect("the entry is in the table");
        self.remove_at(i);
    }

    /// Remove every entry whose handle is in `marked`, in one pass over the table (the
    /// entries of a bulk removal, e.g. a cleared rank's, without a probe each: a probe at
    /// 10M blocks is a cache miss).
    pub(super) fn remove_marked(&mut self, marked: &IdSet) {
        if self.len == 0 {
            return;
        }
        let removed = remove_marked_in(&mut self.entries, self.bits, marked);
        self.len -= removed;
        if self.old_len != 0 {
            let removed = remove_marked_in(&mut self.old, self.old_bits, marked);
            self.old_len -= removed;
            self.len -= removed;
            if self.old_len == 0 {
                self.retire_old();
            }
        }
        self.settle();
        if self.len == 0 {
            *self = Self::default();
        }
    }

    /// Every entry as `(tag, handle)` (in table order).
    pub(super) fn entries(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries
            .iter()
            .chain(self.old.iter())
            .copied()
            .filter(|&e| stored(e) != 0)
            .map(|e| (entry_tag(e), handle_of(e)))
    }

    /// Check the layout: every entry reachable from its home bucket without crossing an
    /// empty one (in both arrays), nothing before the cursor, and the counts.
    #[cfg(test)]
    pub(super) fn check(&self) {
        let mut total = 0;
        for (a, bits, from) in [
            (&self.entries, self.bits, 0),
            (&self.old, self.old_bits, self.cursor),
        ] {
            for (i, &e) in a.iter().enumerate() {
                if stored(e) == 0 {
                    continue;
                }
                assert!(i >= from, "entry before the migration cursor");
                total += 1;
                let mut j = home(entry_tag(e), bits);
                while j != i {
                    assert_ne!(stored(a[j]), 0, "gap in a cluster");
                    j = (j + 1) & (a.len() - 1);
                }
            }
        }
        assert_eq!(total, self.len);
        assert_eq!(
            self.old.iter().filter(|&&e| stored(e) != 0).count(),
            self.old_len
        );
        assert_eq!(
            self.old.is_empty(),
            self.old_len == 0,
            "old array kept empty"
        );
        assert!(self.next.iter().all(|&e| e == 0), "next array not zero");
        if self.len < self.quiet {
            assert!(
                self.old_len == 0
                    && self.retired.is_empty()
                    && !self.grows_on_insert()
                    && !self.prepares_on_insert(),
                "an insert below `quiet` would have work to do"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::{
        ExtTable, IdSet, LARGE_BITS, LARGE_LIMIT, MIGRATE_STEP, PREPARE_MIN, RETIRE_MIN,
        RETIRE_PACE, RETIRE_STEP, SMALL_LIMIT, stored, tag_of,
    };

    /// A deliberately weak mix so that tags collide and clusters form.
    fn hash(k: u64) -> u64 {
        (k % 7).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k << 40)
    }

    /// A full-avalanche mix (the tree's own keys are mixed like this).
    fn strong(k: u64) -> u64 {
        let mut x = k ^ (k >> 33);
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }

    /// Run `ops` against the table and a map (`hash` makes the tags; op 0 inserts with
    /// `insert_new`, 1 with `find_or_vacant` and `insert_vacant`, 3 now and then removes
    /// a marked set of handles in one pass, the others remove one); the table is checked
    /// after every operation (segment of each entry, clusters, counts, directory spans).
    fn against_map(
        ops: &[(u8, u64, u32)],
        hash: impl Fn(u64) -> u64,
    ) -> Result<ExtTable, TestCaseError> {
        let mut t = ExtTable::default();
        // key -> handle; handles are also used to recover the key (handle = key * 1000 + n).
        let mut model: HashMap<u64, u32> = HashMap::new();
        let key_of = |h: u32| u64::from(h / 1000);
        for &(op, k, n) in ops {
            let tag = tag_of(hash(k));
            let found = t.find(tag, |h| key_of(h) == k);
            prop_assert_eq!(found.map(|i| t.get(i)), model.get(&k).copied());
            match op {
                0 => {
                    if found.is_none() {
                        let h = u32::try_from(k).unwrap() * 1000 + n;
                        t.insert_new(tag, h);
                        model.insert(k, h);
                    }
                }
                1 => {
                    // The same through the vacant bucket of the miss.
                    let h = u32::try_from(k).unwrap() * 1000 + n;
                    match t.find_or_vacant(tag, |h| key_of(h) == k) {
                        Ok(i) => prop_assert_eq!(Some(i), found),
                        Err(v) => {
                            prop_assert!(found.is_none());
                            t.insert_vacant(v, tag, h);
                            model.insert(k, h);
                        }
                    }
                }
                3 if n % 16 == 0 => {
                    // Bulk removal (one op in 64): every handle whose key is divisible by
                    // a small number drawn from `n`.
                    let m = u64::from(n / 16 % 5 + 2);
                    let limit = model.values().max().map_or(0, |&h| h as usize + 1);
                    let mut marks = IdSet::new(limit);
                    for (&key, &h) in &model {
                        if key % m == 0 {
                            marks.insert(h);
                        }
                    }
                    t.remove_marked(&marks);
                    model.retain(|key, _| key % m != 0);
                }
                // By tag and handle, half the removals (whole-bucket compare).
                2 if n % 2 == 0 => {
                    if let Some(h) = model.remove(&k) {
                        t.remove_entry(tag, h);
                    }
                }
                _ => {
                    if let Some(i) = found {
                        prop_assert_eq!(Some(t.remove_at(i)), model.remove(&k));
                    }
                }
            }
            t.check();
            prop_assert_eq!(t.len(), model.len());
            let mut listed: Vec<u32> = t.entries().map(|(_, h)| h).collect();
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
        Ok(t)
    }

    proptest! {
        /// Against a map: keys are found exactly while present, handles follow `set`, and
        /// removal keeps every other key reachable (long clusters, wrap-around, backward
        /// shift, segments doubled past the maximum when their tags cannot be split).
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..4, 0u64..48, 0u32..1000), 0..400)) {
            against_map(&ops, hash)?;
        }

        /// The growth path: with well-spread tags and mostly inserts the table grows many
        /// times and spends most operations half migrated (lookups in both arrays, removals
        /// and `set` in the old one); every key stays reachable.
        #[test]
        fn grows_incrementally(ops in proptest::collection::vec((0u8..4, 0u64..4000, 0u32..1000), 0..1500)) {
            against_map(&ops, strong)?;
        }
    }

    /// Longest run of non-empty buckets (cyclic).
    fn longest_cluster(a: &[u64]) -> usize {
        let (mut best, mut run) = (0, 0);
        for &e in a.iter().chain(a.iter()) {
            run = if stored(e) == 0 { 0 } else { run + 1 };
            best = best.max(run);
        }
        best.min(a.len())
    }

    #[test]
    fn an_insert_moves_a_bounded_number_of_entries() {
        let mut t = ExtTable::default();
        let n = 5_000u32;
        let mut grown = 0;
        let mut longest = 0;
        for k in 0..n {
            let (cap, old_len) = (t.entries.len(), t.old_len);
            let (next, prepared) = (t.next.as_ptr(), t.next.len());
            t.insert_new(tag_of(strong(u64::from(k))), k);
            if t.entries.len() == cap {
                // Not a growth step: the migration moved the rest of at most one cluster
                // beyond its step, and stopped between clusters.
                assert!(old_len - t.old_len <= MIGRATE_STEP + longest);
                assert!(t.old.is_empty() || stored(t.old[t.cursor]) == 0);
            } else {
                // A growth step moves nothing: the old array is the whole previous table.
                grown += 1;
                assert_eq!(t.old_len, t.len() - 1);
                // ... and, in a table large enough, writes nothing: the new array was
                // zeroed by earlier inserts.
                if cap >= PREPARE_MIN {
                    assert_eq!(prepared, t.entries.len(), "next array not ready at {cap}");
                    assert!(std::ptr::eq(next, t.entries.as_ptr()), "next array moved");
                }
                longest = longest_cluster(&t.old);
            }
            if k % 97 == 0 {
                t.check();
            }
        }
        t.check();
        assert!(grown >= 8, "{grown}");
        for k in (0..n).step_by(3) {
            let i = t
                .find(tag_of(strong(u64::from(k))), |h| h == k)
                .expect("present");
            assert_eq!(t.remove_at(i), k);
        }
        t.check();
        for k in 0..n {
            let found = t.find(tag_of(strong(u64::from(k))), |h| h == k);
            assert_eq!(found.is_some(), k % 3 != 0);
        }
    }

    fn tag(k: u32) -> u32 {
        tag_of(strong(u64::from(k)))
    }

    /// A table of keys `0..n` (1,024 buckets for `n` from 417 to 831).
    fn filled(n: u32) -> ExtTable {
        let mut t = ExtTable::default();
        for k in 0..n {
            t.insert_new(tag(k), k);
        }
        t
    }

    /// Remove key `k`, which must be present.
    fn remove(t: &mut ExtTable, k: u32) {
        let i = t.find(tag(k), |h| h == k).expect("present");
        t.remove_at(i);
    }

    /// Steady state: insert each key of `keys` and remove the one `live` keys before it.
    fn churn(t: &mut ExtTable, keys: std::ops::Range<u32>, live: u32) {
        for k in keys {
            t.insert_new(tag(k), k);
            remove(t, k - live);
        }
    }

    /// Insert key `k`; when that grows the table (from at least [`PREPARE_MIN`] buckets),
    /// check that the next array prepared ahead was complete and became the table.
    /// Returns `(buckets, entries)` before a growth.
    fn insert_checking_growth(t: &mut ExtTable, k: u32) -> Option<(usize, usize)> {
        let (cap, len, next, prepared) = (t.entries.len(), t.len, t.next.as_ptr(), t.next.len());
        t.insert_new(tag(k), k);
        if t.entries.len() == cap || cap == 0 {
            return None;
        }
        if cap >= PREPARE_MIN {
            assert_eq!(prepared, 2 * cap, "next array incomplete at growth");
            assert!(
                std::ptr::eq(next, t.entries.as_ptr()),
                "next array not used"
            );
        }
        Some((cap, len))
    }

    /// A table that settles just below its growth does not keep a prepared next array for
    /// good, and one that grows after all still finds it complete.
    #[test]
    fn an_unused_next_array_is_released_and_prepared_again() {
        // 816 entries: 1,024 buckets at 25.5/32 load, between preparing (25/32) and
        // growing (26/32).
        let mut t = filled(816);
        assert_eq!(t.entries.len(), 1024);
        churn(&mut t, 816..3816, 816);
        t.check();
        assert_eq!(t.next.capacity(), 0, "unused next array kept");
        // Growing after all: preparing resumes and completes by the growth insert.
        let mut k = 3816u32;
        loop {
            let grew = insert_checking_growth(&mut t, k);
            k += 1;
            if grew.is_some() {
                break;
            }
        }
        t.check();
        for j in 3000..k {
            assert!(t.find(tag(j), |h| h == j).is_some());
        }
    }

    /// Tables grow at 26/32 load below 2^`LARGE_BITS` buckets and at 22/32 from there
    /// on, each with its next array prepared by then; every key is found across the change.
    #[test]
    fn large_tables_grow_at_their_own_limit() {
        let mut t = ExtTable::default();
        let mut growths = Vec::new();
        for k in 0..20_000u32 {
            growths.extend(insert_checking_growth(&mut t, k));
        }
        t.check();
        assert!(growths.len() >= 6, "{growths:?}");
        for &(cap, len) in &growths {
            let limit = if cap >= 1 << LARGE_BITS {
                LARGE_LIMIT
            } else {
                SMALL_LIMIT
            };
            assert_eq!(len, cap * limit / 32, "growth of {cap} buckets");
        }
        assert!(growths.iter().any(|&(cap, _)| cap >= 1 << LARGE_BITS));
        for k in 0..20_000u32 {
            assert!(t.find(tag(k), |h| h == k).is_some(), "key {k} lost");
        }
    }

    /// A table that starts preparing its next array and then shrinks back below 25/32
    /// load releases the array too.
    #[test]
    fn a_next_array_is_released_when_the_table_shrinks_back() {
        let mut t = filled(820);
        assert_eq!(t.entries.len(), 1024);
        assert!(
            t.next.capacity() > 0,
            "no next array prepared at 820 entries"
        );
        // Down to 700 entries (22/32 load), then one insert and one removal at a time.
        for k in 0..120 {
            remove(&mut t, k);
        }
        churn(&mut t, 820..2820, 700);
        t.check();
        assert_eq!(t.entries.len(), 1024);
        assert_eq!(t.next.capacity(), 0, "next array kept below 25/32 load");
    }

    /// A large migrated old array is released a step every [`RETIRE_PACE`] operations
    /// after the migration, and heap_bytes counts it until it is gone.
    #[test]
    fn a_migrated_old_array_is_released_in_steps() {
        let mut t = ExtTable::default();
        let mut k = 0u32;
        // Until a growth from at least `RETIRE_MIN` buckets has migrated all of the old array.
        loop {
            t.insert_new(tag(k), k);
            k += 1;
            if t.entries.len() > RETIRE_MIN && t.old_len == 0 && !t.retired.is_empty() {
                break;
            }
            assert!(k < 100_000, "no old array retired");
        }
        let retired = t.retired.len();
        assert!(retired >= RETIRE_MIN);
        assert_eq!(
            t.heap_bytes(),
            (t.entries.capacity() + t.next.capacity() + t.retired.capacity()) * 8
        );
        for step in 1..=retired.div_ceil(RETIRE_STEP) {
            // Nothing released until the pace's last operation.
            for _ in 1..RETIRE_PACE {
                t.insert_new(tag(k), k);
                k += 1;
                let before = retired.saturating_sub((step - 1) * RETIRE_STEP);
                assert_eq!(t.retired.len(), before, "released ahead of the pace");
            }
            t.insert_new(tag(k), k);
            k += 1;
            assert_eq!(t.retired.len(), retired.saturating_sub(step * RETIRE_STEP));
            assert_eq!(
                t.retired.capacity(),
                t.retired.len(),
                "released, not only truncated"
            );
        }
        t.check();
        for j in 0..k {
            assert!(t.find(tag(j), |h| h == j).is_some());
        }
    }

    #[test]
    fn equal_tags_grow_and_migrate() {
        let mut t = ExtTable::default();
        for k in 0..100u32 {
            t.insert_new(0xdead_beef, k);
        }
        t.check();
        for k in 0..100u32 {
            assert!(t.find(0xdead_beef, |h| h == k).is_some());
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
