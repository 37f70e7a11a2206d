//! A spike, not the library's tree: a radix tree with **one node per unshared run** of
//! blocks and holders kept per run as prefix lengths, to measure whether that layout
//! brings the apply cost a block near the reference's compressed tree (issue 19 item 1;
//! `docs/benchmarks/kv_indexer.md`, round 18) before the library's tree is rebuilt on it.
//!
//! What it models, and what it leaves out:
//! * a run is a chain of blocks with no branch inside it (children hang off its end; a
//!   store that diverges inside a run splits it there);
//! * a rank holds a *prefix* of each run it holds (`Run::holders`: slot and length). The
//!   held sets of the bench's stream are prefix-closed, so an eviction takes a rank's last
//!   block of a run and costs a length decrement; a removal that leaves a hole (the rank
//!   keeps deeper blocks) splits the run after the block, so that what the rank keeps is
//!   a run of its own that no query reaches for it (its parent's last block is not held);
//! * one table of external hashes for all ranks (`hashes`: hash -> run and offset), an
//!   entry while some rank holds the block, as in the library's tree. A store that walks
//!   blocks already in the tree does no table work for them: it compares their
//!   `tokens_hash` in the run's array and raises its length once per run;
//! * queries compare the run's `tokens_hash` array with the prompt and intersect holders
//!   once per run, not once per block;
//! * left out: `cleared` events, expiration, dump, a rank holding a block under two
//!   hashes, a hash stored at a second place (counted in [`RunTree::anomalies`]), runs
//!   merged again after splits, and growth without a rehash under the lock (`hashes` is
//!   a std `HashMap`: its growth is the spike's largest apply events).
//!
//! Checked against the library's tree: on every query of the bench's stream by the
//! `runs-check` candidate (full score lists equal), and on random event sequences with
//! holes by this file's test (`cargo test --release` in `benches/scale`, which
//! `scripts/test.sh` runs).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use dynamo_kv_router::hashing::LocalBlockHash;
use dynamo_kv_router::indexer::RadixTree;
use dynamo_kv_router::protocols::{KvCacheEvent, KvCacheEventData, KvCacheStoredBlockData};
use rustc_hash::FxHashMap;

use crate::harness::{Candidate, Index};

const NIL: u32 = u32::MAX;

#[derive(Default)]
struct Run {
    /// `tokens_hash` and external hash of each block, in chain order.
    locals: Vec<u64>,
    exts: Vec<u64>,
    /// `(worker slot, blocks held from the run's start)`, lengths >= 1.
    holders: Vec<(u32, u32)>,
    /// The longest held prefix (0 when no rank holds the run).
    held: u32,
    /// The run this one hangs off the end of (`NIL`: the root).
    parent: u32,
    /// Child runs (keyed in `RunTree::children` by their first block).
    kids: Vec<u32>,
}

/// The spike's tree (see the module docs).
#[derive(Default)]
pub(crate) struct RunTree {
    runs: Vec<Run>,
    free: Vec<u32>,
    /// `(parent run or NIL, first tokens_hash)` -> run.
    children: FxHashMap<(u32, u64), u32>,
    /// External hash -> `(run, offset)`, for the blocks some rank holds.
    hashes: FxHashMap<u64, (u32, u32)>,
    slot_of: FxHashMap<(u64, u32), u32>,
    workers: Vec<(u64, u32)>,
    /// Per-slot scratch for queries: the held length in the run being checked, +1.
    scratch: RefCell<Vec<u32>>,
    /// Events the model does not cover (see the module docs); 0 on the bench's stream.
    pub(crate) anomalies: u64,
    /// Stores under a parent the rank does not hold, and removals of blocks it does not
    /// hold: refused, as the library's tree refuses them.
    pub(crate) rejected: u64,
}

impl RunTree {
    fn slot(&mut self, worker: (u64, u32)) -> u32 {
        if let Some(&s) = self.slot_of.get(&worker) {
            return s;
        }
        let s = self.workers.len() as u32;
        self.workers.push(worker);
        self.slot_of.insert(worker, s);
        self.scratch.get_mut().push(0);
        s
    }

    fn new_run(&mut self, parent: u32) -> u32 {
        let id = if let Some(id) = self.free.pop() {
            id
        } else {
            self.runs.push(Run::default());
            (self.runs.len() - 1) as u32
        };
        let r = &mut self.runs[id as usize];
        r.parent = parent;
        r.held = 0;
        id
    }

    /// Raise `slot`'s held length in `run` to at least `len`.
    fn hold(&mut self, run: u32, slot: u32, len: u32) {
        let r = &mut self.runs[run as usize];
        match r.holders.iter_mut().find(|h| h.0 == slot) {
            Some(h) => h.1 = h.1.max(len),
            None => r.holders.push((slot, len)),
        }
        r.held = r.held.max(len);
    }

    /// Where `slot` is in `run`'s holder list.
    fn holder_at(&self, run: u32, slot: u32) -> Option<usize> {
        self.runs[run as usize]
            .holders
            .iter()
            .position(|h| h.0 == slot)
    }

    /// How many blocks of `run` from its start `slot` holds (`None`: none).
    fn held_len(&self, run: u32, slot: u32) -> Option<u32> {
        self.holder_at(run, slot)
            .map(|i| self.runs[run as usize].holders[i].1)
    }

    /// Split `run` before offset `at` (0 < at < len): the tail becomes its only child.
    fn split(&mut self, run: u32, at: u32) -> u32 {
        let tail = self.new_run(run);
        let (locals, exts, holders, kids) = {
            let r = &mut self.runs[run as usize];
            let locals = r.locals.split_off(at as usize);
            let exts = r.exts.split_off(at as usize);
            let mut holders = Vec::new();
            for h in &mut r.holders {
                if h.1 > at {
                    holders.push((h.0, h.1 - at));
                    h.1 = at;
                }
            }
            r.held = r.held.min(at);
            (locals, exts, holders, std::mem::take(&mut r.kids))
        };
        for &k in &kids {
            let first = self.runs[k as usize].locals[0];
            self.children.remove(&(run, first));
            self.children.insert((tail, first), k);
            self.runs[k as usize].parent = tail;
        }
        for (i, e) in exts.iter().enumerate() {
            if let Some(v) = self.hashes.get_mut(e)
                && v.0 == run
            {
                *v = (tail, i as u32);
            }
        }
        let t = &mut self.runs[tail as usize];
        t.held = holders.iter().map(|h| h.1).max().unwrap_or(0);
        t.locals = locals;
        t.exts = exts;
        t.holders = holders;
        t.kids = kids;
        let first = t.locals[0];
        self.runs[run as usize].kids.push(tail);
        self.children.insert((run, first), tail);
        tail
    }

    fn store(
        &mut self,
        worker: (u64, u32),
        parent: Option<u64>,
        blocks: &[KvCacheStoredBlockData],
    ) {
        self.warm(blocks.iter().map(|b| b.block_hash.0));
        // (run, blocks of it passed): where the next block goes.
        let (mut run, mut pos) = match parent {
            None => (NIL, 0),
            Some(p) => {
                let held = self.hashes.get(&p).copied().filter(|&(r, o)| {
                    self.slot_of
                        .get(&worker)
                        .and_then(|&s| self.held_len(r, s))
                        .is_some_and(|len| len > o)
                });
                match held {
                    Some((r, o)) => (r, o + 1),
                    // The rank does not hold the parent: the event is refused whole.
                    None => {
                        self.rejected += 1;
                        return;
                    }
                }
            }
        };
        if blocks.is_empty() {
            return;
        }
        let slot = self.slot(worker);
        let mut i = 0;
        while i < blocks.len() {
            let b = &blocks[i];
            if run != NIL {
                let r = &self.runs[run as usize];
                if (pos as usize) < r.locals.len() {
                    if r.locals[pos as usize] == b.tokens_hash.0 {
                        if pos >= r.held {
                            // Nobody holds it: its table entry went with the last holder.
                            self.hashes.insert(b.block_hash.0, (run, pos));
                        } else if r.exts[pos as usize] != b.block_hash.0 {
                            self.anomalies += 1;
                        }
                        pos += 1;
                        i += 1;
                        continue;
                    }
                    // The chain leaves the run here (the rank's length in it is raised
                    // to `pos` below, at the end of what is now the run).
                    self.split(run, pos);
                }
            }
            // At the end of `run` (or at the root).
            if run != NIL {
                self.hold(run, slot, pos);
            }
            if let Some(&c) = self.children.get(&(run, b.tokens_hash.0)) {
                run = c;
                pos = 0;
                continue;
            }
            // The rest of the chain is new: the run grows when nothing hangs off its end,
            // else a new child run takes it.
            let extend = run != NIL && self.runs[run as usize].kids.is_empty();
            if !extend {
                let c = self.new_run(run);
                if run != NIL {
                    self.runs[run as usize].kids.push(c);
                }
                self.children.insert((run, b.tokens_hash.0), c);
                run = c;
                pos = 0;
            }
            let r = &mut self.runs[run as usize];
            for b in &blocks[i..] {
                r.locals.push(b.tokens_hash.0);
                r.exts.push(b.block_hash.0);
            }
            for (k, b) in blocks[i..].iter().enumerate() {
                if self
                    .hashes
                    .insert(b.block_hash.0, (run, pos + k as u32))
                    .is_some()
                {
                    self.anomalies += 1;
                }
            }
            pos += (blocks.len() - i) as u32;
            break;
        }
        self.hold(run, slot, pos);
    }

    /// Look the event's hashes up once before the work, in one loop of independent loads,
    /// so that their cache misses overlap (in the work's loop each waits for the previous
    /// block's); as the library's tree does (`warm_lookup`). Below ~256k entries the table
    /// mostly stays in cache and the extra pass costs more than it saves.
    fn warm(&self, exts: impl Iterator<Item = u64>) {
        if self.hashes.len() < 1 << 18 {
            return;
        }
        let mut acc = 0u32;
        for e in exts {
            acc ^= self.hashes.get(&e).map_or(0, |v| v.0);
        }
        std::hint::black_box(acc);
    }

    fn remove(&mut self, worker: (u64, u32), exts: impl ExactSizeIterator<Item = u64> + Clone) {
        self.warm(exts.clone());
        let Some(&slot) = self.slot_of.get(&worker) else {
            self.rejected += exts.len() as u64;
            return;
        };
        for e in exts {
            let Some(&(run, off)) = self.hashes.get(&e) else {
                self.rejected += 1;
                continue;
            };
            let Some(i) = self
                .holder_at(run, slot)
                .filter(|&i| self.runs[run as usize].holders[i].1 > off)
            else {
                self.rejected += 1;
                continue;
            };
            if self.runs[run as usize].holders[i].1 > off + 1 {
                // A hole: the rank keeps deeper blocks of the run. The run splits after the
                // block, so that the rank's blocks beyond it are a run of their own (which
                // it holds without its parent's last block, and which a query therefore
                // never reaches for it).
                self.split(run, off + 1);
            }
            // A split changes lengths in place, never the list's order: `i` still names
            // the rank, whose length is now at most `off + 1`.
            let r = &mut self.runs[run as usize];
            let len = r.holders[i].1;
            if off == 0 {
                r.holders.swap_remove(i);
            } else {
                r.holders[i].1 = off;
            }
            if len == r.held {
                r.held = r.holders.iter().map(|h| h.1).max().unwrap_or(0);
            }
            if r.held <= off {
                self.hashes.remove(&e);
                self.trim(run);
            }
        }
    }

    /// Drop the unheld tail of `run` when nothing hangs off it, and the run itself (and
    /// childless, unheld ancestors) when nothing is left.
    fn trim(&mut self, mut run: u32) {
        while run != NIL {
            let r = &mut self.runs[run as usize];
            if !r.kids.is_empty() {
                return;
            }
            let held = r.held as usize;
            let first = r.locals.first().copied();
            r.locals.truncate(held);
            r.exts.truncate(held);
            if held > 0 {
                return;
            }
            let parent = r.parent;
            r.holders.clear();
            self.free.push(run);
            if let Some(first) = first {
                self.children.remove(&(parent, first));
            }
            if parent != NIL {
                let p = &mut self.runs[parent as usize];
                if let Some(k) = p.kids.iter().position(|&k| k == run) {
                    p.kids.swap_remove(k);
                }
            }
            run = parent;
        }
    }

    fn find(&self, query: &[LocalBlockHash]) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        let Some(first) = query.first() else {
            return out;
        };
        let Some(&start) = self.children.get(&(NIL, first.0)) else {
            return out;
        };
        let mut run = start;
        let mut scratch = self.scratch.borrow_mut();
        // Ranks that held every block so far (their score is `base`).
        let mut active: Vec<u32> = Vec::new();
        let mut q = 0usize;
        let mut base = 0u32;
        let mut first_run = true;
        loop {
            let r = &self.runs[run as usize];
            let m = r
                .locals
                .iter()
                .zip(&query[q..])
                .take_while(|(a, b)| **a == b.0)
                .count() as u32;
            let full = m as usize == r.locals.len();
            if first_run {
                for &(s, len) in &r.holders {
                    let got = len.min(m);
                    if full && len == m {
                        active.push(s);
                    } else {
                        out.push((s, base + got));
                    }
                }
                first_run = false;
            } else {
                for &(s, len) in &r.holders {
                    scratch[s as usize] = len + 1;
                }
                let mut keep = 0;
                for k in 0..active.len() {
                    let s = active[k];
                    let len = scratch[s as usize].saturating_sub(1);
                    if full && len == m {
                        active[keep] = s;
                        keep += 1;
                    } else {
                        out.push((s, base + len.min(m)));
                    }
                }
                active.truncate(keep);
                for &(s, _) in &r.holders {
                    scratch[s as usize] = 0;
                }
            }
            base += m;
            q += m as usize;
            if active.is_empty() || !full || q == query.len() {
                break;
            }
            match self.children.get(&(run, query[q].0)) {
                Some(&c) => run = c,
                None => break,
            }
        }
        for s in active {
            out.push((s, base));
        }
        out.retain(|&(_, sc)| sc > 0);
        out
    }

    fn apply(&mut self, worker: u64, ev: &KvCacheEvent) {
        let w = (worker, ev.dp_rank);
        match &ev.data {
            KvCacheEventData::Stored(s) => self.store(w, s.parent_hash.map(|p| p.0), &s.blocks),
            KvCacheEventData::Removed(r) => self.remove(w, r.block_hashes.iter().map(|h| h.0)),
            KvCacheEventData::Cleared => self.anomalies += 1,
        }
    }
}

struct Runs(RunTree);

impl Index for Runs {
    fn apply(&mut self, worker: u64, event: &KvCacheEvent) -> Duration {
        let t = Instant::now();
        self.0.apply(worker, event);
        t.elapsed()
    }
    fn find(&self, query: &[LocalBlockHash]) -> (Duration, u32) {
        let t = Instant::now();
        let r = self.0.find(query);
        let e = t.elapsed();
        (e, r.iter().map(|&(_, s)| s).max().unwrap_or(0))
    }
}

/// Score per `(worker, dp rank)`, sorted.
type Scores = Vec<((u64, u32), u32)>;

/// The scores of `query` in the spike and in the library's tree.
fn both_scores(spike: &RunTree, lib: &RadixTree, query: &[LocalBlockHash]) -> (Scores, Scores) {
    let mut a: Scores = spike
        .find(query)
        .into_iter()
        .map(|(s, sc)| (spike.workers[s as usize], sc))
        .collect();
    let mut b: Scores = lib
        .find_matches(query, false)
        .scores
        .into_iter()
        .map(|(w, sc)| ((w.worker_id, w.dp_rank), sc))
        .collect();
    a.sort_unstable();
    b.sort_unstable();
    (a, b)
}

/// The spike beside the library's tree, every query's scores compared (slow: a check).
struct Checked(RunTree, RadixTree);

impl Index for Checked {
    fn apply(&mut self, worker: u64, event: &KvCacheEvent) -> Duration {
        let before = self.0.rejected;
        self.0.apply(worker, event);
        let refused = self.1.apply_event(worker, event).is_err();
        assert_eq!(
            self.0.rejected > before,
            refused,
            "spike and library tree disagree on refusing event {}",
            event.event_id
        );
        Duration::ZERO
    }
    fn find(&self, query: &[LocalBlockHash]) -> (Duration, u32) {
        let (a, b) = both_scores(&self.0, &self.1, query);
        assert_eq!(a, b, "spike and library tree disagree");
        assert_eq!(self.0.anomalies, 0, "spike met events it does not model");
        (Duration::ZERO, a.iter().map(|&(_, s)| s).max().unwrap_or(0))
    }
}

pub(crate) fn runs() -> Candidate {
    Candidate {
        name: "runs",
        single: || Box::new(Runs(RunTree::default())),
        shared: None,
    }
}

pub(crate) fn runs_checked() -> Candidate {
    Candidate {
        name: "runs-check",
        single: || Box::new(Checked(RunTree::default(), RadixTree::default())),
        shared: None,
    }
}

#[cfg(test)]
mod tests {
    use dynamo_kv_router::hashing::LocalBlockHash;
    use dynamo_kv_router::indexer::RadixTree;
    use dynamo_kv_router::protocols::{
        ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
        KvCacheStoreData, KvCacheStoredBlockData,
    };
    use rustc_hash::FxHashMap;

    use super::{RunTree, both_scores};

    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The external hash of a block: a hash of its whole path (as an engine's is).
    fn ext_of(path: &[u64]) -> u64 {
        path.iter().fold(0x51_7cc1_b727_220a, |h, &l| {
            next(&mut (h ^ l.wrapping_mul(31)))
        })
    }

    /// Random stores under held parents and removals of held blocks in any order (holes
    /// included), three ranks, a three-token alphabet so that paths share and diverge
    /// everywhere: after every event, random queries score alike in both trees.
    #[test]
    fn agrees_with_the_library_tree_on_random_events() {
        for seed in 0..300u64 {
            let mut rng = seed;
            let mut spike = RunTree::default();
            let mut lib = RadixTree::default();
            let mut held: Vec<FxHashMap<u64, Vec<u64>>> = vec![FxHashMap::default(); 3];
            for step in 0..200u64 {
                let w = (next(&mut rng) % 3) as usize;
                let data = if !next(&mut rng).is_multiple_of(3) || held[w].is_empty() {
                    let mut keys: Vec<u64> = held[w].keys().copied().collect();
                    keys.sort_unstable();
                    let parent = if keys.is_empty() || next(&mut rng).is_multiple_of(4) {
                        None
                    } else {
                        Some(keys[(next(&mut rng) % keys.len() as u64) as usize])
                    };
                    let mut path = parent.map_or_else(Vec::new, |p| held[w][&p].clone());
                    let mut blocks = Vec::new();
                    for _ in 0..1 + next(&mut rng) % 4 {
                        path.push(next(&mut rng) % 3);
                        let ext = ext_of(&path);
                        blocks.push(KvCacheStoredBlockData::new(ext, *path.last().unwrap()));
                        held[w].insert(ext, path.clone());
                    }
                    KvCacheEventData::Stored(KvCacheStoreData {
                        parent_hash: parent.map(ExternalSequenceBlockHash),
                        start_position: None,
                        blocks,
                    })
                } else {
                    let mut keys: Vec<u64> = held[w].keys().copied().collect();
                    keys.sort_unstable();
                    let mut gone = Vec::new();
                    for _ in 0..1 + next(&mut rng) % 3 {
                        if keys.is_empty() {
                            break;
                        }
                        let k = keys.swap_remove((next(&mut rng) % keys.len() as u64) as usize);
                        held[w].remove(&k);
                        gone.push(ExternalSequenceBlockHash(k));
                    }
                    KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: gone })
                };
                let ev = KvCacheEvent {
                    event_id: step,
                    dp_rank: 0,
                    data,
                };
                assert!(
                    lib.apply_event(w as u64, &ev).is_ok(),
                    "seed {seed} step {step}"
                );
                spike.apply(w as u64, &ev);
                assert_eq!(
                    (spike.anomalies, spike.rejected),
                    (0, 0),
                    "seed {seed} step {step}"
                );
                for _ in 0..4 {
                    let n = 1 + next(&mut rng) % 7;
                    let q: Vec<LocalBlockHash> =
                        (0..n).map(|_| LocalBlockHash(next(&mut rng) % 3)).collect();
                    let (a, b) = both_scores(&spike, &lib, &q);
                    assert_eq!(a, b, "seed {seed} step {step} query {q:?}");
                }
            }
        }
    }
}
