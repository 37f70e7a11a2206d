//! Active-load tracking for one worker (data-parallel rank): which KV blocks its in-flight
//! requests hold and how many prompt tokens still wait for prefill.
//!
//! Invariants (checked by the tests against a naive model):
//! * `active_blocks()` is the number of distinct block hashes held by in-flight requests: a
//!   prefix shared by several requests counts once.
//! * `active_prefill_tokens()` is the sum of the prefill tokens of requests whose prefill has
//!   not completed.
//! * Freeing every request returns the tracker to empty (no leaked hashes).
//! * Decay (`add_output_block_decayed`, the selection service's `decay_fraction`): the
//!   blocks held only by the decaying request get that weight (shared blocks keep theirs;
//!   a block keeps its weight until it is released). `active_blocks()` is then the sum of
//!   the weights, rounded; without decay every weight is 1 and it is the distinct count.

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::hashing::SequenceHash;

#[derive(Debug, Clone)]
struct ActiveRequest {
    blocks: Vec<SequenceHash>,
    prefill_tokens: u64,
}

/// In-flight requests of one worker rank.
#[derive(Debug, Clone, Default)]
pub struct ActiveSequences {
    block_refs: FxHashMap<SequenceHash, u32>,
    requests: FxHashMap<String, ActiveRequest>,
    active_prefill_tokens: u64,
    /// Weights below 1 of held blocks (decayed output).
    weights: FxHashMap<SequenceHash, f64>,
    /// Sum of `1 - weight` over `weights`.
    discount: f64,
    /// With change tracking on ([`Self::track_changes`]): blocks that became held (`true`)
    /// or were released (`false`) since the last [`Self::take_changes`].
    changes: Option<Vec<(SequenceHash, bool)>>,
}

impl ActiveSequences {
    /// Record which blocks become held or released, for [`Self::take_changes`] (the
    /// scheduler's reverse index of booked blocks).
    pub(crate) fn track_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// Hand `f` every block that became held (`true`) or was released (`false`) since the
    /// last call, in order.
    pub(crate) fn take_changes(&mut self, mut f: impl FnMut(SequenceHash, bool)) {
        if let Some(changes) = &mut self.changes {
            for (b, held) in changes.drain(..) {
                f(b, held);
            }
        }
    }

    /// The distinct blocks held.
    pub(crate) fn held_blocks(&self) -> impl Iterator<Item = SequenceHash> + '_ {
        self.block_refs.keys().copied()
    }

    #[inline]
    fn hold(&mut self, b: SequenceHash) {
        let count = self.block_refs.entry(b).or_insert(0);
        *count += 1;
        if *count == 1
            && let Some(c) = &mut self.changes
        {
            c.push((b, true));
        }
    }

    /// Book a request holding `blocks` with `prefill_tokens` still to prefill.
    ///
    /// # Errors
    /// [`Error::DuplicateRequest`] if `request_id` is already active here.
    pub fn add_request(
        &mut self,
        request_id: &str,
        blocks: Vec<SequenceHash>,
        prefill_tokens: u64,
    ) -> Result<()> {
        if self.requests.contains_key(request_id) {
            return Err(Error::DuplicateRequest(request_id.to_owned()));
        }
        for &b in &blocks {
            self.hold(b);
        }
        self.active_prefill_tokens += prefill_tokens;
        self.requests.insert(
            request_id.to_owned(),
            ActiveRequest {
                blocks,
                prefill_tokens,
            },
        );
        Ok(())
    }

    /// The request produced its first token: its prompt no longer counts as prefill load.
    /// Idempotent.
    ///
    /// # Errors
    /// [`Error::UnknownRequest`] if the request is not active here.
    pub fn mark_prefill_completed(&mut self, request_id: &str) -> Result<()> {
        let req = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| Error::UnknownRequest(request_id.to_owned()))?;
        self.active_prefill_tokens -= req.prefill_tokens;
        req.prefill_tokens = 0;
        Ok(())
    }

    /// The request generated another full block.
    ///
    /// # Errors
    /// [`Error::UnknownRequest`] if the request is not active here.
    pub fn add_output_block(&mut self, request_id: &str, block: SequenceHash) -> Result<()> {
        let req = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| Error::UnknownRequest(request_id.to_owned()))?;
        req.blocks.push(block);
        self.hold(block);
        Ok(())
    }

    /// [`Self::add_output_block`], then, with `decay` (a weight in `[0, 1]`), weigh every
    /// block held only by this request by `decay`.
    ///
    /// # Errors
    /// [`Error::UnknownRequest`] if the request is not active here.
    pub fn add_output_block_decayed(
        &mut self,
        request_id: &str,
        block: SequenceHash,
        decay: Option<f64>,
    ) -> Result<()> {
        self.add_output_block(request_id, block)?;
        let Some(w) = decay else {
            return Ok(());
        };
        let w = w.clamp(0.0, 1.0);
        let Some(req) = self.requests.get(request_id) else {
            return Ok(());
        };
        for b in &req.blocks {
            if self.block_refs.get(b) != Some(&1) {
                continue;
            }
            let old = self.weights.get(b).copied().unwrap_or(1.0);
            self.discount += old - w;
            if w < 1.0 {
                self.weights.insert(*b, w);
            } else {
                self.weights.remove(b);
            }
        }
        if self.weights.is_empty() {
            // No drift once nothing is decayed.
            self.discount = 0.0;
        }
        Ok(())
    }

    /// The request finished: release its blocks and any remaining prefill tokens.
    ///
    /// # Errors
    /// [`Error::UnknownRequest`] if the request is not active here.
    pub fn free(&mut self, request_id: &str) -> Result<()> {
        let req = self
            .requests
            .remove(request_id)
            .ok_or_else(|| Error::UnknownRequest(request_id.to_owned()))?;
        self.active_prefill_tokens -= req.prefill_tokens;
        for b in req.blocks {
            if let Some(count) = self.block_refs.get_mut(&b) {
                *count -= 1;
                if *count == 0 {
                    self.block_refs.remove(&b);
                    if let Some(c) = &mut self.changes {
                        c.push((b, false));
                    }
                    if let Some(w) = self.weights.remove(&b) {
                        self.discount -= 1.0 - w;
                        if self.weights.is_empty() {
                            self.discount = 0.0;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether `request_id` is active here.
    pub fn contains(&self, request_id: &str) -> bool {
        self.requests.contains_key(request_id)
    }

    /// Distinct blocks held by in-flight requests (decayed blocks count their weight; the
    /// sum is rounded).
    pub fn active_blocks(&self) -> usize {
        if self.weights.is_empty() {
            return self.block_refs.len();
        }
        // A block count (far below 2^52); the weighted sum is non-negative.
        (self.block_refs.len() as f64 - self.discount)
            .round()
            .max(0.0) as usize
    }

    /// Prompt tokens of in-flight requests still waiting for prefill.
    pub fn active_prefill_tokens(&self) -> u64 {
        self.active_prefill_tokens
    }

    /// Number of in-flight requests.
    pub fn active_requests(&self) -> usize {
        self.requests.len()
    }

    /// The blocks and remaining prefill tokens of one active request.
    pub fn request(&self, request_id: &str) -> Option<(&[SequenceHash], u64)> {
        self.requests
            .get(request_id)
            .map(|r| (r.blocks.as_slice(), r.prefill_tokens))
    }

    /// How many of `blocks` are not yet held by an in-flight request.
    pub fn new_blocks(&self, blocks: &[SequenceHash]) -> usize {
        // An idle worker (most of a large fleet at any moment) holds nothing: no lookups.
        if self.block_refs.is_empty() {
            return blocks.len();
        }
        blocks
            .iter()
            .filter(|b| !self.block_refs.contains_key(b))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn h(v: u64) -> SequenceHash {
        SequenceHash(v)
    }

    #[test]
    fn shared_prefix_counts_once() {
        let mut s = ActiveSequences::default();
        s.add_request("a", vec![h(1), h(2), h(3)], 48).expect("new");
        s.add_request("b", vec![h(1), h(2), h(4)], 16).expect("new");
        assert_eq!(s.active_blocks(), 4);
        assert_eq!(s.active_prefill_tokens(), 64);
        assert_eq!(s.new_blocks(&[h(1), h(5), h(6)]), 2);
        s.mark_prefill_completed("a").expect("active");
        s.mark_prefill_completed("a").expect("idempotent");
        assert_eq!(s.active_prefill_tokens(), 16);
        s.free("a").expect("active");
        assert_eq!(s.active_blocks(), 3);
        s.free("b").expect("active");
        assert_eq!((s.active_blocks(), s.active_prefill_tokens()), (0, 0));
        assert_eq!(s.free("b"), Err(Error::UnknownRequest("b".into())));
    }

    #[test]
    fn duplicate_request_is_rejected_without_change() {
        let mut s = ActiveSequences::default();
        s.add_request("a", vec![h(1)], 5).expect("new");
        assert!(s.add_request("a", vec![h(2)], 7).is_err());
        assert_eq!((s.active_blocks(), s.active_prefill_tokens()), (1, 5));
    }

    /// The reference's `add_output_block(decay_fraction=)` walk (1.6.1, observed with
    /// `scripts/observe_selection_decay_reference.py decay`): 4 prompt blocks, output
    /// blocks with the decays below, a second request on the same prompt, then frees.
    #[test]
    fn decay_matches_the_reference_walk() {
        let mut s = ActiveSequences::default();
        s.add_request("a", vec![h(1), h(2), h(3), h(4)], 16)
            .expect("new");
        let mut next = 100;
        let mut out = |s: &mut ActiveSequences, id: &str, d: Option<f64>| {
            next += 1;
            s.add_output_block_decayed(id, h(next), d).expect("active");
            s.active_blocks()
        };
        let seen: Vec<usize> = [
            None,
            None,
            Some(0.5),
            Some(0.5),
            Some(0.0),
            Some(1.0),
            Some(0.25),
        ]
        .into_iter()
        .map(|d| out(&mut s, "a", d))
        .collect();
        assert_eq!(seen, vec![5, 6, 4, 4, 0, 10, 3]);
        s.add_request("b", vec![h(1), h(2), h(3), h(4)], 16)
            .expect("new");
        assert_eq!(s.active_blocks(), 3);
        assert_eq!(out(&mut s, "b", Some(0.5)), 3);
        s.free("a").expect("active");
        assert_eq!(s.active_blocks(), 2);
        s.free("b").expect("active");
        assert_eq!(s.active_blocks(), 0);
        assert!(s.weights.is_empty() && s.discount == 0.0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(u8, Vec<u8>, u16),
        Prefill(u8),
        Output(u8, u8),
        Free(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6, proptest::collection::vec(0u8..12, 0..6), 0u16..100)
                .prop_map(|(r, b, p)| Op::Add(r, b, p)),
            (0u8..6).prop_map(Op::Prefill),
            (0u8..6, 0u8..12).prop_map(|(r, b)| Op::Output(r, b)),
            (0u8..6).prop_map(Op::Free),
        ]
    }

    proptest! {
        #[test]
        fn matches_naive_model(ops in proptest::collection::vec(op(), 0..60)) {
            let mut s = ActiveSequences::default();
            // Model: request -> (blocks, prefill tokens).
            let mut model: BTreeMap<String, (Vec<u64>, u64)> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Add(r, blocks, p) => {
                        let id = r.to_string();
                        let res = s.add_request(
                            &id, blocks.iter().map(|&b| h(b.into())).collect(), p.into());
                        prop_assert_eq!(res.is_ok(), !model.contains_key(&id));
                        model.entry(id).or_insert((blocks.iter().map(|&b| b.into()).collect(), p.into()));
                    }
                    Op::Prefill(r) => {
                        let id = r.to_string();
                        prop_assert_eq!(s.mark_prefill_completed(&id).is_ok(), model.contains_key(&id));
                        if let Some(e) = model.get_mut(&id) { e.1 = 0; }
                    }
                    Op::Output(r, b) => {
                        let id = r.to_string();
                        prop_assert_eq!(s.add_output_block(&id, h(b.into())).is_ok(), model.contains_key(&id));
                        if let Some(e) = model.get_mut(&id) { e.0.push(b.into()); }
                    }
                    Op::Free(r) => {
                        let id = r.to_string();
                        prop_assert_eq!(s.free(&id).is_ok(), model.remove(&id).is_some());
                    }
                }
                let distinct: BTreeSet<u64> = model.values().flat_map(|e| e.0.iter().copied()).collect();
                prop_assert_eq!(s.active_blocks(), distinct.len());
                prop_assert_eq!(s.active_prefill_tokens(), model.values().map(|e| e.1).sum::<u64>());
                prop_assert_eq!(s.active_requests(), model.len());
            }
        }
    }
}
