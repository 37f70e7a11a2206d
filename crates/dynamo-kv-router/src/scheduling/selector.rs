//! Worker cost, routing constraints and sampling: the pure decision functions of the
//! scheduler. Everything here is a function of its arguments, which is what lets the tests
//! compare it with a brute-force model.
//!
//! Cost of one worker (lower is better), with `B` the block size:
//!
//! ```text
//! prefill_blocks = (active_prefill_tokens + isl_tokens) / B       (0 without prefill tracking)
//! decay          = 1 / (1 + credit_decay * ((active_prefill_tokens - min_active_prefill) / B)
//!                                        / request_blocks)
//! credit         = overlap_score_credit * decay * device_overlap
//!                + host_cache_hit_weight * host_overlap + disk_cache_hit_weight * disk_overlap
//!                + shared_cache_multiplier * shared_overlap
//! decode_blocks  = active_blocks + new_blocks                       (0 without block tracking)
//! cost           = prefill_load_scale * max(0, prefill_blocks - credit) + decode_blocks
//!                + decode_active_request_weight * active_requests
//! ```
//!
//! Without prefill tracking but with a positive credit (a decode worker in conditional
//! disaggregation) the credit applies to the decode blocks instead:
//! `cost = max(0, decode_blocks - credit) + decode_active_request_weight * active_requests`.
//! Preferred taints multiply the cost by `exp(-tanh(sum of matching weights))`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::config::EffectiveParams;

/// Hard and soft placement constraints of one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoutingConstraints {
    /// A worker is eligible only if it carries every one of these taints.
    pub required_taints: BTreeSet<String>,
    /// Weights summed over the worker's matching taints: positive favours, negative avoids.
    pub preferred_taints: BTreeMap<String, f64>,
}

impl RoutingConstraints {
    /// Whether a worker with `taints` satisfies the hard constraints.
    #[inline]
    pub fn allows(&self, taints: &BTreeSet<String>) -> bool {
        self.required_taints.is_empty() || self.required_taints.is_subset(taints)
    }

    /// Cost multiplier for a worker with `taints`, in `[e^-1, e]`.
    #[inline]
    pub fn cost_multiplier(&self, taints: &BTreeSet<String>) -> f64 {
        // exp(-tanh(0)) is exactly 1: skip the transcendental calls (once per worker and
        // request).
        if self.preferred_taints.is_empty() {
            return 1.0;
        }
        let sum: f64 = self
            .preferred_taints
            .iter()
            .filter(|(t, _)| taints.contains(*t))
            .map(|(_, w)| *w)
            .sum();
        (-sum.tanh()).exp()
    }
}

/// Overlap of a request's prompt with one worker's caches, in blocks, per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierOverlap {
    /// Leading blocks cached in device (GPU) memory.
    pub device: u32,
    /// Leading blocks cached in host memory.
    pub host: u32,
    /// Leading blocks cached on disk.
    pub disk: u32,
    /// Blocks in a shared cache beyond the device prefix.
    pub shared: u32,
}

/// The load and cache state of one candidate worker for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CandidateLoad {
    /// Cache overlap with the request's prompt.
    pub overlap: TierOverlap,
    /// Prompt tokens of in-flight requests still waiting for prefill.
    pub active_prefill_tokens: u64,
    /// Distinct KV blocks held by in-flight requests.
    pub active_blocks: u64,
    /// Blocks of this request not yet held on the worker.
    pub new_blocks: u64,
    /// In-flight requests.
    pub active_requests: u64,
}

/// Cost of routing a request of `isl_tokens` prompt tokens to a worker with `load`.
///
/// `min_active_prefill` is the smallest `active_prefill_tokens` among the eligible workers
/// (it anchors the credit decay); `multiplier` comes from the preferred taints.
#[inline]
pub fn worker_cost(
    params: &EffectiveParams,
    block_size: u32,
    isl_tokens: usize,
    load: &CandidateLoad,
    min_active_prefill: u64,
    multiplier: f64,
) -> f64 {
    CostTerms::new(params, block_size, isl_tokens, min_active_prefill).cost(load, multiplier)
}

/// [`worker_cost`] split in what one request shares across every worker (computed once a
/// decision) and the per-worker part, which the scheduler runs over the whole fleet.
#[derive(Debug, Clone, Copy)]
pub struct CostTerms<'a> {
    params: &'a EffectiveParams,
    isl_tokens: f64,
    block_size: f64,
    /// `1 / block_size` when the block size is a power of two: multiplying by it is then
    /// exactly dividing by the block size (no rounding either way), at a fraction of a
    /// division's cost in a loop over a thousand workers.
    inv_block_size: Option<f64>,
    request_blocks: f64,
    min_active_prefill: u64,
    decay: bool,
}

impl<'a> CostTerms<'a> {
    /// The request's share of the cost function.
    #[inline]
    pub fn new(
        params: &'a EffectiveParams,
        block_size: u32,
        isl_tokens: usize,
        min_active_prefill: u64,
    ) -> Self {
        let bs = block_size.max(1);
        let block_size = f64::from(bs);
        Self {
            params,
            isl_tokens: isl_tokens as f64,
            block_size,
            inv_block_size: bs.is_power_of_two().then(|| 1.0 / block_size),
            request_blocks: (isl_tokens as f64 / block_size).max(1.0),
            min_active_prefill,
            decay: params.overlap_score_credit_decay > 0.0 && params.track_prefill_tokens,
        }
    }

    #[inline(always)]
    fn per_block(&self, tokens: f64) -> f64 {
        match self.inv_block_size {
            Some(inv) => tokens * inv,
            None => tokens / self.block_size,
        }
    }

    /// The cost of one worker with `load` (see the module docs for the formula).
    #[inline(always)]
    pub fn cost(&self, load: &CandidateLoad, multiplier: f64) -> f64 {
        let params = self.params;
        let o = load.overlap;
        // The decay only scales the device credit: skipped when there is none (the common
        // case across a fleet; the product is zero either way, the decay being finite).
        let decay = if self.decay && o.device > 0 {
            let excess = self.per_block(count(
                load.active_prefill_tokens
                    .saturating_sub(self.min_active_prefill),
            ));
            1.0 / (1.0 + params.overlap_score_credit_decay * excess / self.request_blocks)
        } else {
            1.0
        };
        let credit = params.overlap_score_credit * decay * f64::from(o.device)
            + params.host_cache_hit_weight * f64::from(o.host)
            + params.disk_cache_hit_weight * f64::from(o.disk)
            + params.shared_cache_multiplier * f64::from(o.shared);
        let decode_blocks = if params.track_active_blocks {
            count(load.active_blocks + load.new_blocks)
        } else {
            0.0
        };
        let request_term = params.decode_active_request_weight * count(load.active_requests);
        let cost = if params.track_prefill_tokens {
            let prefill_blocks =
                self.per_block(count(load.active_prefill_tokens) + self.isl_tokens);
            params.prefill_load_scale * (prefill_blocks - credit).max(0.0)
                + decode_blocks
                + request_term
        } else if credit > 0.0 {
            (decode_blocks - credit).max(0.0) + request_term
        } else {
            decode_blocks + request_term
        };
        cost * multiplier
    }
}

/// `x as f64`, through the one-instruction signed conversion below 2^63 (every count in
/// practice; x86-64 without AVX-512 has no unsigned one, and the emulation is several
/// instructions, once per count and worker in a decision). The same value either way.
#[inline(always)]
fn count(x: u64) -> f64 {
    match i64::try_from(x) {
        Ok(v) => v as f64,
        Err(_) => x as f64,
    }
}

/// Pick an index from `costs` (lower is better).
///
/// At `temperature == 0` (or when every cost is equal) the cheapest index wins, ties broken
/// uniformly at random. At `temperature > 0` index `i` is drawn with probability
/// proportional to `exp(-(c_i - c_min) / ((c_max - c_min) * temperature))`: costs are
/// normalised by their range, so the temperature is scale-free.
///
/// Returns `None` for an empty slice.
pub fn sample_index(costs: &[f64], temperature: f64, rng: &mut fastrand::Rng) -> Option<usize> {
    let (min, max) = costs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &c| {
            (lo.min(c), hi.max(c))
        });
    if costs.is_empty() {
        return None;
    }
    let range = max - min;
    if temperature <= 0.0 || range <= 0.0 || !range.is_finite() {
        // Uniform among the minima: count them, draw one rank among them, find it. One
        // draw, however many tie (half of a large idle fleet can: with the reservoir
        // form's draw per tie, a 1,000-worker decision spent ~1.5 us in the random source).
        let ties = costs.iter().map(|&c| usize::from(c == min)).sum::<usize>();
        if ties == 0 {
            return None;
        }
        let chosen = rng.usize(..ties);
        let mut seen = 0usize;
        for (i, &c) in costs.iter().enumerate() {
            if c == min {
                if seen == chosen {
                    return Some(i);
                }
                seen += 1;
            }
        }
        return None;
    }
    let scale = range * temperature;
    let weights: Vec<f64> = costs.iter().map(|&c| (-(c - min) / scale).exp()).collect();
    let total: f64 = weights.iter().sum();
    let target = rng.f64() * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if acc >= target {
            return Some(i);
        }
    }
    Some(costs.len() - 1)
}

/// Softmax probabilities used by [`sample_index`] (for tests and observability).
pub fn selection_probabilities(costs: &[f64], temperature: f64) -> Vec<f64> {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let range = max - min;
    let weights: Vec<f64> = if temperature <= 0.0 || range <= 0.0 || !range.is_finite() {
        costs
            .iter()
            .map(|&c| if c == min { 1.0 } else { 0.0 })
            .collect()
    } else {
        costs
            .iter()
            .map(|&c| (-(c - min) / (range * temperature)).exp())
            .collect()
    };
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// Busy thresholds of the frontend: a worker above **any** configured threshold is skipped;
/// when every eligible worker is busy the request is rejected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadThresholds {
    /// Busy when `kv_used_blocks / total_kv_blocks` exceeds this fraction (in `[0, 1]`).
    pub active_decode_blocks_threshold: Option<f64>,
    /// Busy when the worker's active prefill tokens exceed this count.
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Busy when active prefill tokens exceed this fraction of `max_num_batched_tokens`.
    pub active_prefill_tokens_threshold_frac: Option<f64>,
}

/// What a worker told the router about its capacity and usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerCapacity {
    /// Total KV blocks of the worker's cache.
    pub total_kv_blocks: Option<u64>,
    /// Largest token batch of one forward pass.
    pub max_num_batched_tokens: Option<u64>,
    /// KV blocks in use, as last reported by the engine.
    pub kv_used_blocks: Option<u64>,
}

/// `max_num_batched_tokens` assumed for workers that did not report one: large enough that
/// such a worker is never considered busy by the fraction thresholds (the reference's
/// choice).
pub const UNKNOWN_MAX_BATCHED_TOKENS: u64 = 10_000_000;

impl LoadThresholds {
    /// Check the thresholds' ranges.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] naming the offending threshold.
    pub fn validate(&self) -> crate::Result<()> {
        if let Some(t) = self.active_decode_blocks_threshold
            && !(0.0..=1.0).contains(&t)
        {
            return Err(crate::Error::InvalidConfig {
                field: "active_decode_blocks_threshold",
                reason: format!("must be in [0, 1], got {t}"),
            });
        }
        if let Some(t) = self.active_prefill_tokens_threshold_frac
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(crate::Error::InvalidConfig {
                field: "active_prefill_tokens_threshold_frac",
                reason: format!("must be finite and >= 0, got {t}"),
            });
        }
        Ok(())
    }

    /// Whether any threshold is set (without one no worker is ever busy).
    #[inline]
    pub fn any(&self) -> bool {
        self.active_decode_blocks_threshold.is_some()
            || self.active_prefill_tokens_threshold.is_some()
            || self.active_prefill_tokens_threshold_frac.is_some()
    }

    /// Whether a worker with this capacity and router-side prefill load is busy.
    pub fn is_busy(&self, capacity: &WorkerCapacity, active_prefill_tokens: u64) -> bool {
        if let (Some(t), Some(total), Some(used)) = (
            self.active_decode_blocks_threshold,
            capacity.total_kv_blocks,
            capacity.kv_used_blocks,
        ) && total > 0
            && used as f64 / total as f64 > t
        {
            return true;
        }
        if let Some(t) = self.active_prefill_tokens_threshold
            && active_prefill_tokens > t
        {
            return true;
        }
        if let Some(frac) = self.active_prefill_tokens_threshold_frac {
            let max = capacity
                .max_num_batched_tokens
                .unwrap_or(UNKNOWN_MAX_BATCHED_TOKENS);
            if active_prefill_tokens as f64 > frac * max as f64 {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::config::KvRouterConfig;

    fn params() -> EffectiveParams {
        KvRouterConfig::default().effective(None)
    }

    /// The worked example of the reference's documentation (credit 1, block size 16,
    /// 160-token prompt, no active prefill).
    #[test]
    fn documented_example() {
        let p = params();
        let cost = |ov: u32, decode: u64| {
            let load = CandidateLoad {
                overlap: TierOverlap {
                    device: ov,
                    ..Default::default()
                },
                active_blocks: decode,
                ..Default::default()
            };
            worker_cost(&p, 16, 160, &load, 0, 1.0)
        };
        assert_eq!(cost(2, 10), 18.0);
        assert_eq!(cost(5, 5), 10.0);
        assert_eq!(cost(8, 9), 11.0);
    }

    #[test]
    fn tiers_and_request_weight_enter_the_cost() {
        let mut p = params();
        p.decode_active_request_weight = 2.0;
        let load = CandidateLoad {
            overlap: TierOverlap {
                device: 1,
                host: 4,
                disk: 4,
                shared: 0,
            },
            active_requests: 3,
            ..Default::default()
        };
        // prefill 10 blocks - (1 + 0.75*4 + 0.25*4) = 5; + 2*3 requests.
        assert_eq!(worker_cost(&p, 16, 160, &load, 0, 1.0), 11.0);
    }

    #[test]
    fn decode_worker_applies_credit_to_decode_blocks() {
        let mut p = params();
        p.track_prefill_tokens = false;
        let load = CandidateLoad {
            overlap: TierOverlap {
                device: 3,
                ..Default::default()
            },
            active_blocks: 5,
            new_blocks: 2,
            ..Default::default()
        };
        assert_eq!(worker_cost(&p, 16, 160, &load, 0, 1.0), 4.0);
    }

    #[test]
    fn credit_decays_with_excess_prefill() {
        let mut p = params();
        p.overlap_score_credit_decay = 1.0;
        let load = CandidateLoad {
            overlap: TierOverlap {
                device: 10,
                ..Default::default()
            },
            active_prefill_tokens: 160,
            ..Default::default()
        };
        // excess 10 blocks over 10 request blocks: decay 1/2, credit 5; prefill (160+160)/16=20.
        assert_eq!(worker_cost(&p, 16, 160, &load, 0, 1.0), 15.0);
        // As the least loaded worker it keeps its full credit.
        assert_eq!(worker_cost(&p, 16, 160, &load, 160, 1.0), 10.0);
    }

    #[test]
    fn taints() {
        let c = RoutingConstraints {
            required_taints: ["gpu".to_owned()].into(),
            preferred_taints: [("fast".to_owned(), 100.0), ("slow".to_owned(), -100.0)].into(),
        };
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert!(c.allows(&set(&["gpu", "x"])));
        assert!(!c.allows(&set(&["x"])));
        assert!((c.cost_multiplier(&set(&["fast"])) - (-1f64).exp()).abs() < 1e-12);
        assert!((c.cost_multiplier(&set(&["slow"])) - 1f64.exp()).abs() < 1e-12);
        assert_eq!(c.cost_multiplier(&set(&[])), 1.0);
    }

    #[test]
    fn argmin_and_uniform_ties() {
        let mut rng = fastrand::Rng::with_seed(7);
        assert_eq!(sample_index(&[], 0.0, &mut rng), None);
        assert_eq!(sample_index(&[3.0, 1.0, 2.0], 0.0, &mut rng), Some(1));
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            counts[sample_index(&[1.0, 5.0, 1.0], 0.0, &mut rng).expect("non-empty")] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!(counts[0] > 1300 && counts[2] > 1300, "{counts:?}");
        // Five minima among 1,000 costs: each drawn a fifth of the time (+-15 %).
        let costs: Vec<f64> = (0..1000)
            .map(|i| if i % 200 == 7 { 0.5 } else { 2.0 })
            .collect();
        let mut counts = [0usize; 1000];
        for _ in 0..10_000 {
            counts[sample_index(&costs, 0.0, &mut rng).expect("non-empty")] += 1;
        }
        for (i, &n) in counts.iter().enumerate() {
            if i % 200 == 7 {
                assert!((1700..=2300).contains(&n), "minimum {i} drawn {n} times");
            } else {
                assert_eq!(n, 0, "non-minimum {i} drawn");
            }
        }
    }

    proptest::proptest! {
        /// At temperature 0 the pick is one of the minima, and every minimum is drawn
        /// (uniformity itself: `argmin_and_uniform_ties`).
        #[test]
        fn tie_draw_picks_a_minimum(
            costs in proptest::collection::vec(
                proptest::prop_oneof![0.0f64..3.0, proptest::strategy::Just(1.0), proptest::strategy::Just(f64::INFINITY)],
                0..300,
            ),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let mut rng = fastrand::Rng::with_seed(seed);
            let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
            match sample_index(&costs, 0.0, &mut rng) {
                None => proptest::prop_assert!(costs.is_empty()),
                Some(i) => proptest::prop_assert_eq!(costs[i], min),
            }
            let ties: Vec<usize> = (0..costs.len()).filter(|&i| costs[i] == min).collect();
            if (1..=8).contains(&ties.len()) {
                let mut seen = vec![false; costs.len()];
                for _ in 0..400 {
                    seen[sample_index(&costs, 0.0, &mut rng).expect("non-empty")] = true;
                }
                proptest::prop_assert!(ties.iter().all(|&i| seen[i]), "ties {:?} not all drawn", ties);
            }
        }
    }

    #[test]
    fn busy_thresholds() {
        let t = LoadThresholds {
            active_decode_blocks_threshold: Some(0.9),
            active_prefill_tokens_threshold: Some(1000),
            active_prefill_tokens_threshold_frac: Some(0.5),
        };
        let cap = WorkerCapacity {
            total_kv_blocks: Some(100),
            max_num_batched_tokens: Some(1600),
            kv_used_blocks: Some(50),
        };
        assert!(!t.is_busy(&cap, 700));
        assert!(t.is_busy(&cap, 801)); // frac: 0.5 * 1600
        assert!(t.is_busy(
            &WorkerCapacity {
                kv_used_blocks: Some(91),
                ..cap
            },
            0
        ));
        assert!(!LoadThresholds::default().is_busy(&cap, u64::MAX));
    }
}
