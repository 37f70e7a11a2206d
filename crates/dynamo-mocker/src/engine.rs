//! The engine model: one rank's scheduler and paged KV cache, stepped one forward pass at a
//! time ([`MockEngine::step`]), with no clock and no threads of its own.

use std::collections::VecDeque;
use std::sync::Arc;

use dynamo_kv_router::hashing::{
    LocalBlockHash, SequenceHash, XXH3_SEED, chain_seq_hash, hash_token_block,
};
use dynamo_kv_router::protocols::KvCacheEventData;
use rustc_hash::FxHashSet;

use crate::args::{MockEngineArgs, PreemptionMode};
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::timing::{self, PrefillChunk};

/// A generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockRequest {
    /// Unique id.
    pub request_id: String,
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Output tokens to generate.
    pub max_output_tokens: usize,
    /// Per-block image hashes (`mm_routing_info.block_mm_infos`): blocks covering an image
    /// hash with it, so the KV events match the router's hashes.
    pub block_mm_infos: Vec<Option<dynamo_kv_router::hashing::BlockExtraInfo>>,
}

impl MockRequest {
    /// A request for `max_output_tokens` tokens after `tokens`.
    pub fn new(request_id: impl Into<String>, tokens: Vec<u32>, max_output_tokens: usize) -> Self {
        Self {
            request_id: request_id.into(),
            tokens,
            max_output_tokens,
            block_mm_infos: Vec::new(),
        }
    }
}

/// One generated token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockOutput {
    /// The request (shared with the engine's sequence: one per token, so not a copy).
    pub request_id: Arc<str>,
    /// The token.
    pub token_id: u32,
    /// 0 for the first output token.
    pub index: usize,
    /// The request is complete (this was its last token).
    pub finished: bool,
    /// On the first token: prompt tokens that were served from the prefix cache.
    pub cached_tokens: Option<usize>,
}

/// What one forward pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepResult {
    /// Simulated wall time of the pass, in ms, after `speedup_ratio`.
    pub duration_ms: f64,
    /// Tokens produced.
    pub outputs: Vec<MockOutput>,
    /// KV events, in order.
    pub events: Vec<KvCacheEventData>,
    /// When the engine publishes engine-format events (`zmq_kv_events_port`): for each
    /// entry of `events`, the token ids of its stored blocks (empty for removals);
    /// otherwise empty.
    pub event_tokens: Vec<Vec<u32>>,
    /// Prompt tokens computed.
    pub prefill_tokens: usize,
    /// Sequences that decoded one token.
    pub decode_seqs: usize,
    /// Requests preempted (they will be recomputed).
    pub preempted: Vec<String>,
    /// The pass as forward-pass metrics (with per-request lengths for the variances).
    pub fpm: dynamo_llm::fpm::FpmSample,
}

/// Load figures of the engine, as published to routers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MockerMetrics {
    /// Blocks in use (including cached, unreferenced ones).
    pub kv_used_blocks: usize,
    /// Blocks held by running requests.
    pub kv_active_blocks: usize,
    /// Cache capacity in blocks.
    pub kv_total_blocks: usize,
    /// Running requests.
    pub num_requests_running: usize,
    /// Waiting requests.
    pub num_requests_waiting: usize,
    /// Prompt tokens served from cache / prompt tokens admitted, over the engine's life.
    pub prefix_hit_rate: f64,
}

#[derive(Debug)]
struct Seq {
    id: Arc<str>,
    tokens: Vec<u32>,
    prompt_len: usize,
    max_output: usize,
    generated: usize,
    num_computed: usize,
    /// Hashes of the full blocks of `tokens` computed so far.
    local: Vec<LocalBlockHash>,
    seq: Vec<SequenceHash>,
    /// Leading full blocks held in the cache.
    held: usize,
    /// A private, partially filled tail block is held.
    tail: bool,
    seed: u64,
    cached_tokens: usize,
    block_mm_infos: Vec<Option<dynamo_kv_router::hashing::BlockExtraInfo>>,
}

impl Seq {
    fn new(req: MockRequest) -> Self {
        let seed = xxhash_seed(&req.request_id);
        let mut tokens = req.tokens;
        // The generated tokens join the prompt: one allocation instead of regrowth.
        tokens.reserve_exact(req.max_output_tokens);
        Self {
            id: req.request_id.into(),
            prompt_len: tokens.len(),
            tokens,
            max_output: req.max_output_tokens,
            generated: 0,
            num_computed: 0,
            local: Vec::new(),
            seq: Vec::new(),
            held: 0,
            tail: false,
            seed,
            cached_tokens: 0,
            block_mm_infos: req.block_mm_infos,
        }
    }

    /// Tokens that must be computed before the next token can be sampled.
    fn compute_target(&self) -> usize {
        if self.generated == 0 {
            self.prompt_len
        } else {
            // Resuming after preemption: everything but the last sampled token.
            self.tokens.len() - 1
        }
    }

    fn in_prefill(&self) -> bool {
        self.num_computed < self.compute_target()
    }

    /// Extend the block hashes to cover `full_blocks` full blocks.
    fn ensure_hashes(&mut self, full_blocks: usize, block_size: usize) {
        while self.local.len() < full_blocks {
            let i = self.local.len();
            let local = dynamo_kv_router::hashing::hash_token_block_with_mm(
                &self.tokens[i * block_size..(i + 1) * block_size],
                self.block_mm_infos.get(i).and_then(Option::as_ref),
                XXH3_SEED,
            );
            let seq = match self.seq.last() {
                Some(&parent) => chain_seq_hash(parent, local),
                None => SequenceHash(local.0),
            };
            self.local.push(local);
            self.seq.push(seq);
        }
    }

    fn next_token(&self, vocab: u32) -> u32 {
        // A deterministic pseudo-random token per (request, position): splitmix64.
        let mut z = self
            .seed
            .wrapping_add((self.generated as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % u64::from(vocab)) as u32
    }
}

fn xxhash_seed(id: &str) -> u64 {
    // Reuse the hashing crate's xxh3 through a byte block: ids are short.
    let bytes: Vec<u32> = id.bytes().map(u32::from).collect();
    hash_token_block(&bytes, 0).0
}

/// A simulated engine rank. See the module docs.
#[derive(Debug)]
pub struct MockEngine {
    args: MockEngineArgs,
    cache: KvCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    ids: FxHashSet<String>,
    admitted_prompt_tokens: u64,
    cached_prompt_tokens: u64,
}

impl MockEngine {
    /// An idle engine with an empty cache.
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`].
    pub fn new(args: MockEngineArgs) -> Result<Self> {
        args.validate()?;
        let mut cache = KvCache::new(args.num_gpu_blocks, args.enable_prefix_caching);
        if args.zmq_kv_events_port.is_some() {
            cache.record_tokens();
        }
        Ok(Self {
            cache,
            args,
            waiting: VecDeque::new(),
            running: Vec::new(),
            ids: FxHashSet::default(),
            admitted_prompt_tokens: 0,
            cached_prompt_tokens: 0,
        })
    }

    /// The engine's arguments.
    pub fn args(&self) -> &MockEngineArgs {
        &self.args
    }

    /// Queue a request.
    ///
    /// # Errors
    /// [`Error::DuplicateRequest`]; [`Error::RequestRejected`] for an empty prompt, a
    /// request longer than `max_model_len`, or one that needs more KV blocks than exist.
    pub fn add_request(&mut self, req: MockRequest) -> Result<()> {
        let reject = |reason: String| Error::RequestRejected {
            request_id: req.request_id.clone(),
            reason,
        };
        if req.tokens.is_empty() {
            return Err(reject("empty prompt".into()));
        }
        let total = req.tokens.len() + req.max_output_tokens;
        if let Some(max) = self.args.max_model_len
            && total > max
        {
            return Err(reject(format!(
                "prompt ({}) + max tokens ({}) exceeds max_model_len {max}",
                req.tokens.len(),
                req.max_output_tokens
            )));
        }
        let blocks = total.div_ceil(self.args.block_size);
        if blocks > self.args.num_gpu_blocks {
            return Err(reject(format!(
                "needs {blocks} KV blocks, the cache has {}",
                self.args.num_gpu_blocks
            )));
        }
        if !self.ids.insert(req.request_id.clone()) {
            return Err(Error::DuplicateRequest(req.request_id));
        }
        self.waiting.push_back(Seq::new(req));
        Ok(())
    }

    /// Drop a request wherever it is (client cancelled); its blocks are released. Returns
    /// whether it was known.
    pub fn cancel(&mut self, request_id: &str) -> bool {
        if !self.ids.remove(request_id) {
            return false;
        }
        if let Some(pos) = self.running.iter().position(|s| &*s.id == request_id) {
            let mut seq = self.running.remove(pos);
            self.release(&mut seq);
        } else {
            self.waiting.retain(|s| &*s.id != request_id);
        }
        true
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Current load figures.
    pub fn metrics(&self) -> MockerMetrics {
        MockerMetrics {
            kv_used_blocks: self.cache.used(),
            kv_active_blocks: self.cache.active(),
            kv_total_blocks: self.cache.capacity(),
            num_requests_running: self.running.len(),
            num_requests_waiting: self.waiting.len(),
            prefix_hit_rate: if self.admitted_prompt_tokens == 0 {
                0.0
            } else {
                self.cached_prompt_tokens as f64 / self.admitted_prompt_tokens as f64
            },
        }
    }

    /// Leading blocks of `tokens` that are cached (what a router should predict).
    pub fn cached_prefix_blocks(&self, tokens: &[u32]) -> usize {
        let mut probe = Seq::new(MockRequest::new("", tokens.to_vec(), 0));
        probe.ensure_hashes(tokens.len() / self.args.block_size, self.args.block_size);
        self.cache.match_prefix(&probe.seq)
    }

    /// Compute `n` more tokens of `seq`, reserving and registering blocks. All or nothing.
    fn compute(&mut self, seq: &mut Seq, n: usize) -> bool {
        let bs = self.args.block_size;
        let before = seq.held + usize::from(seq.tail);
        let after_computed = seq.num_computed + n;
        let after_full = after_computed / bs;
        let after_tail = !after_computed.is_multiple_of(bs);
        let need = (after_full + usize::from(after_tail)).saturating_sub(before);
        if !self.cache.reserve(need) {
            return false;
        }
        seq.ensure_hashes(after_full, bs);
        for i in seq.held..after_full {
            let parent = i.checked_sub(1).map(|p| seq.seq[p]);
            let tokens = &seq.tokens[i * bs..(i + 1) * bs];
            self.cache
                .register(seq.seq[i], seq.local[i], parent, tokens);
        }
        seq.held = after_full;
        seq.tail = after_tail;
        seq.num_computed = after_computed;
        true
    }

    /// Release every block of `seq` (tail first, so leaves are evicted before parents).
    fn release(&mut self, seq: &mut Seq) {
        if seq.tail {
            self.cache.release_private(1);
        }
        for i in (0..seq.held).rev() {
            self.cache.release(seq.seq[i]);
        }
        seq.held = 0;
        seq.tail = false;
        seq.num_computed = 0;
    }

    fn sample(&mut self, seq: &mut Seq, outputs: &mut Vec<MockOutput>) -> bool {
        let token = seq.next_token(self.args.vocab_size);
        let index = seq.generated;
        seq.tokens.push(token);
        seq.generated += 1;
        let finished = seq.generated >= seq.max_output;
        outputs.push(MockOutput {
            request_id: Arc::clone(&seq.id),
            token_id: token,
            index,
            finished,
            cached_tokens: (index == 0).then_some(seq.cached_tokens),
        });
        finished
    }

    /// Simulate one forward pass.
    pub fn step(&mut self) -> StepResult {
        let bs = self.args.block_size;
        let mut budget = self.args.max_num_batched_tokens;
        let mut result = StepResult {
            // At most one token per running request: no regrowth while sampling.
            outputs: Vec::with_capacity(
                (self.running.len() + self.waiting.len()).min(self.args.max_num_seqs),
            ),
            ..StepResult::default()
        };
        let mut chunks = Vec::new();
        let mut decode_kv = 0usize;
        let mut decode_lengths: Vec<u64> = Vec::new();

        // Phase 1: running requests, in admission order.
        let mut running = std::mem::take(&mut self.running);
        let mut done = vec![false; running.len()];
        let mut i = 0;
        while i < running.len() {
            if done[i] {
                i += 1;
                continue;
            }
            if running[i].in_prefill() {
                let remaining = running[i].compute_target() - running[i].num_computed;
                let chunk = if self.args.enable_chunked_prefill {
                    remaining.min(budget)
                } else if remaining <= budget {
                    remaining
                } else {
                    0
                };
                let context = running[i].num_computed;
                if chunk > 0 && self.compute(&mut running[i], chunk) {
                    budget -= chunk;
                    result.prefill_tokens += chunk;
                    chunks.push(PrefillChunk {
                        new_tokens: chunk,
                        context_tokens: context,
                    });
                    if !running[i].in_prefill()
                        && running[i].generated == 0
                        && self.sample(&mut running[i], &mut result.outputs)
                    {
                        self.finish(&mut running[i]);
                        done[i] = true;
                    }
                }
                i += 1;
                continue;
            }
            if budget == 0 {
                i += 1;
                continue;
            }
            // Decode one token; preempt others (or this one) until a block is found.
            loop {
                if self.compute(&mut running[i], 1) {
                    break;
                }
                let victim = self.pick_victim(&done, i);
                done[victim] = true;
                self.release(&mut running[victim]);
                result.preempted.push(running[victim].id.to_string());
                if victim == i {
                    break;
                }
            }
            if done[i] {
                i += 1;
                continue;
            }
            budget -= 1;
            result.decode_seqs += 1;
            decode_kv += running[i].num_computed;
            decode_lengths.push(running[i].num_computed as u64);
            if self.sample(&mut running[i], &mut result.outputs) {
                self.finish(&mut running[i]);
                done[i] = true;
            }
            i += 1;
        }
        // Preempted requests go back to the head of the queue, oldest first.
        let mut kept = Vec::with_capacity(running.len());
        let mut requeue = Vec::new();
        for (seq, d) in running.into_iter().zip(done) {
            if !d {
                kept.push(seq);
            } else if self.ids.contains(&*seq.id) && result.preempted.iter().any(|p| **p == *seq.id)
            {
                requeue.push(seq);
            }
        }
        for seq in requeue.into_iter().rev() {
            self.waiting.push_front(seq);
        }
        self.running = kept;

        // Phase 2: admit waiting requests while budget, slots and memory allow.
        let watermark = (self.args.watermark * self.args.num_gpu_blocks as f64).ceil() as usize;
        while self.running.len() < self.args.max_num_seqs && budget > 0 {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            // Match the cached prefix, leaving at least one token to compute.
            let fresh = seq.generated == 0;
            let target = seq.compute_target();
            seq.ensure_hashes(target.saturating_sub(1) / bs, bs);
            let matched = self
                .cache
                .match_prefix(&seq.seq[..target.saturating_sub(1) / bs]);
            for h in 0..matched {
                self.cache.acquire(seq.seq[h]);
            }
            seq.held = matched;
            seq.num_computed = matched * bs;
            let remaining = target - seq.num_computed;
            let chunk = if self.args.enable_chunked_prefill {
                remaining.min(budget)
            } else {
                remaining
            };
            let need = (seq.num_computed + chunk).div_ceil(bs) - seq.held;
            let fits_budget = chunk <= budget;
            let fits_memory = self.cache.available() >= need + watermark;
            if !fits_budget || !fits_memory || !self.compute(&mut seq, chunk) {
                self.release(&mut seq);
                self.waiting.push_front(seq);
                break;
            }
            if fresh {
                seq.cached_tokens = matched * bs;
                self.admitted_prompt_tokens += seq.prompt_len as u64;
                self.cached_prompt_tokens += seq.cached_tokens as u64;
            }
            budget -= chunk;
            result.prefill_tokens += chunk;
            chunks.push(PrefillChunk {
                new_tokens: chunk,
                context_tokens: matched * bs,
            });
            if !seq.in_prefill() && seq.generated == 0 && self.sample(&mut seq, &mut result.outputs)
            {
                self.finish(&mut seq);
                continue;
            }
            self.running.push(seq);
        }

        // Memory deadlock guard: running prefills hold blocks but none could advance and
        // nothing decoded. Preempt the most recent one so the others can proceed.
        if result.prefill_tokens == 0
            && result.decode_seqs == 0
            && self.running.len() > 1
            && let Some(mut seq) = self.running.pop()
        {
            self.release(&mut seq);
            result.preempted.push(seq.id.to_string());
            self.waiting.push_front(seq);
        }

        let (prefill_ms, decode_ms) = timing::step_ms(&chunks, result.decode_seqs, decode_kv);
        result.duration_ms = prefill_ms / self.args.speedup_ratio
            + decode_ms / (self.args.speedup_ratio * self.args.decode_speedup_ratio);
        result.events = self.cache.take_events();
        result.event_tokens = self.cache.take_event_tokens();
        result.fpm = self.fpm_sample(&chunks, decode_lengths, result.duration_ms);
        result
    }

    /// Forward-pass metrics of a pass that ran `chunks` and decoded sequences of
    /// `decode_lengths` KV tokens, plus the queue left behind.
    fn fpm_sample(
        &self,
        chunks: &[PrefillChunk],
        decode_lengths: Vec<u64>,
        duration_ms: f64,
    ) -> dynamo_llm::fpm::FpmSample {
        let mut lengths = dynamo_llm::fpm::FpmLengths {
            scheduled_prefill: chunks.iter().map(|c| c.new_tokens as u64).collect(),
            scheduled_decode_kv: decode_lengths,
            ..Default::default()
        };
        for seq in &self.waiting {
            if seq.generated == 0 {
                lengths.queued_prefill.push(seq.prompt_len as u64);
            } else {
                lengths.queued_decode_kv.push(seq.tokens.len() as u64);
            }
        }
        let sum = |v: &[u64]| v.iter().sum::<u64>();
        dynamo_llm::fpm::FpmSample {
            scheduled_num_prefill_requests: chunks.len() as u64,
            scheduled_sum_prefill_tokens: sum(&lengths.scheduled_prefill),
            scheduled_sum_prefill_kv_tokens: chunks.iter().map(|c| c.context_tokens as u64).sum(),
            scheduled_num_decode_requests: lengths.scheduled_decode_kv.len() as u64,
            scheduled_sum_decode_kv_tokens: sum(&lengths.scheduled_decode_kv),
            queued_num_prefill_requests: lengths.queued_prefill.len() as u64,
            queued_sum_prefill_tokens: sum(&lengths.queued_prefill),
            queued_num_decode_requests: lengths.queued_decode_kv.len() as u64,
            queued_sum_decode_kv_tokens: sum(&lengths.queued_decode_kv),
            wall_time_secs: duration_ms / 1000.0,
            lengths: Some(Box::new(lengths)),
        }
    }

    fn finish(&mut self, seq: &mut Seq) {
        self.release(seq);
        self.ids.remove(&*seq.id);
    }

    /// The request to preempt when `current` cannot get a block.
    fn pick_victim(&self, done: &[bool], current: usize) -> usize {
        let candidates = (0..done.len()).filter(|&j| !done[j] && j != current);
        let victim = match self.args.preemption_mode {
            PreemptionMode::Lifo => candidates.max(),
            PreemptionMode::Fifo => candidates.min(),
        };
        victim.unwrap_or(current)
    }

    /// Blocks currently held or cached (for invariants in tests).
    pub fn kv_cache(&self) -> &KvCache {
        &self.cache
    }
}

#[cfg(test)]
mod tests;
