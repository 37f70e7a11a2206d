//! Forward-pass metrics (FPM): what an engine did on each forward pass, for planners and
//! dashboards.
//!
//! # Wire format
//!
//! One snapshot per forward pass and DP rank, a msgpack map with named fields in this order
//! (the reference's `msgspec` layout, checked against `ai-dynamo-runtime` 1.6.1):
//!
//! ```text
//! {version: 1, worker_id: str, dp_rank: int, counter_id: int, wall_time: float64,
//!  scheduled_requests: {num_prefill_requests, sum_prefill_tokens, var_prefill_length,
//!                       sum_prefill_kv_tokens, num_decode_requests, sum_decode_kv_tokens,
//!                       var_decode_kv_tokens},
//!  queued_requests:    {num_prefill_requests, sum_prefill_tokens, var_prefill_length,
//!                       num_decode_requests, sum_decode_kv_tokens, var_decode_kv_tokens}}
//! ```
//!
//! Counts are unsigned integers, `var_*` and `wall_time` are always float64. `counter_id`
//! numbers the snapshots of one rank from 1 (heartbeats included).
//!
//! Snapshots travel on the event plane, channel `(endpoint scope, "forward-pass-metrics")`.
//!
//! # Variance
//!
//! The reference always sends `var_* = 0.0`. Here, when the producer hands the per-request
//! lengths of the batch ([`FpmSample::lengths`]; the mocker always does), the four
//! variance fields are the **population variance** of those lengths, computed in one pass
//! with Welford's algorithm ([`Welford`]); without lengths they stay 0.0.
//!
//! # Parts
//!
//! * [`publisher::FpmDirectPublisher`]: in-process producer, one serialisation task per DP
//!   rank with a zeroed heartbeat after [`IDLE_HEARTBEAT_INTERVAL`] without a snapshot.
//! * [`relay::FpmEventRelay`]: forwards snapshots from an engine's local ZMQ PUB socket.
//! * [`subscriber::FpmSubscriber`]: receives them (raw stream or latest per
//!   `(worker_id, dp_rank)`, purged when a worker's model card disappears). Payloads that
//!   do not decode as a snapshot are dropped and counted ([`malformed_total`]).

pub mod publisher;
pub mod relay;
pub mod subscriber;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use publisher::FpmDirectPublisher;
pub use relay::FpmEventRelay;
pub use subscriber::FpmSubscriber;

/// The event-plane topic of FPM snapshots (endpoint scope).
pub const FPM_TOPIC: &str = "forward-pass-metrics";

/// Schema version written in every snapshot.
pub const FPM_VERSION: u32 = 1;

/// A rank that published nothing for this long sends a zeroed snapshot, so consumers can
/// tell an idle engine from a dead one (vLLM's scheduler heartbeat is 1.0 s too).
pub const IDLE_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// What was scheduled in the forward pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScheduledRequests {
    /// Requests that ran (part of) their prefill.
    pub num_prefill_requests: u64,
    /// New prompt tokens computed.
    pub sum_prefill_tokens: u64,
    /// Population variance of the prefill lengths of those requests.
    pub var_prefill_length: f64,
    /// KV tokens (context) the prefill requests attended to.
    pub sum_prefill_kv_tokens: u64,
    /// Requests that decoded one token.
    pub num_decode_requests: u64,
    /// KV tokens of the decoding requests.
    pub sum_decode_kv_tokens: u64,
    /// Population variance of the decoding requests' KV lengths.
    pub var_decode_kv_tokens: f64,
}

/// What waited in the queue after the forward pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueuedRequests {
    /// Requests waiting for their prefill.
    pub num_prefill_requests: u64,
    /// Their prompt tokens.
    pub sum_prefill_tokens: u64,
    /// Population variance of their prompt lengths.
    pub var_prefill_length: f64,
    /// Requests waiting to resume decoding (preempted).
    pub num_decode_requests: u64,
    /// Their KV tokens.
    pub sum_decode_kv_tokens: u64,
    /// Population variance of their KV lengths.
    pub var_decode_kv_tokens: f64,
}

/// One forward-pass snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForwardPassMetrics {
    /// [`FPM_VERSION`].
    pub version: u32,
    /// The producing worker (decimal instance id for Dynamo workers).
    pub worker_id: String,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Per-rank snapshot number, from 1.
    pub counter_id: u64,
    /// Duration of the forward pass, seconds (0.0 in heartbeats).
    pub wall_time: f64,
    /// Scheduled work.
    pub scheduled_requests: ScheduledRequests,
    /// Queued work.
    pub queued_requests: QueuedRequests,
}

impl ForwardPassMetrics {
    /// The msgpack payload.
    ///
    /// # Errors
    /// Never in practice (every field is serialisable); kept fallible for the codec.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        rmp_serde::to_vec_named(self).map_err(|e| e.to_string())
    }

    /// Decode and check a payload.
    ///
    /// # Errors
    /// Not a snapshot of this schema.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// Population variance in one pass (Welford): numerically stable, no second pass over the
/// batch and no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Welford {
    n: u64,
    mean: f64,
    m2: f64,
}

impl Welford {
    /// Add one value.
    pub fn push(&mut self, x: f64) {
        self.n += 1;
        let delta = x - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// Population variance of the values so far (0.0 for fewer than two).
    pub fn variance(&self) -> f64 {
        if self.n < 2 {
            0.0
        } else {
            (self.m2 / self.n as f64).max(0.0)
        }
    }

    /// The variance of `values`.
    pub fn of(values: &[u64]) -> f64 {
        let mut w = Self::default();
        for v in values {
            w.push(*v as f64);
        }
        w.variance()
    }
}

/// Optional per-request lengths of a pass, for the variance fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FpmLengths {
    /// Prefill lengths of the scheduled prefill requests.
    pub scheduled_prefill: Vec<u64>,
    /// KV lengths of the scheduled decode requests.
    pub scheduled_decode_kv: Vec<u64>,
    /// Prompt lengths of the queued prefill requests.
    pub queued_prefill: Vec<u64>,
    /// KV lengths of the queued decode requests.
    pub queued_decode_kv: Vec<u64>,
}

/// What a producer reports for one forward pass of one rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FpmSample {
    /// Scheduled prefill requests.
    pub scheduled_num_prefill_requests: u64,
    /// Their new tokens.
    pub scheduled_sum_prefill_tokens: u64,
    /// Their context tokens.
    pub scheduled_sum_prefill_kv_tokens: u64,
    /// Scheduled decode requests.
    pub scheduled_num_decode_requests: u64,
    /// Their KV tokens.
    pub scheduled_sum_decode_kv_tokens: u64,
    /// Queued prefill requests.
    pub queued_num_prefill_requests: u64,
    /// Their prompt tokens.
    pub queued_sum_prefill_tokens: u64,
    /// Queued decode requests.
    pub queued_num_decode_requests: u64,
    /// Their KV tokens.
    pub queued_sum_decode_kv_tokens: u64,
    /// Pass duration, seconds.
    pub wall_time_secs: f64,
    /// Per-request lengths for the variance fields (zeros when absent).
    pub lengths: Option<Box<FpmLengths>>,
}

impl FpmSample {
    /// The snapshot of this sample.
    pub fn snapshot(&self, worker_id: &str, dp_rank: u32, counter_id: u64) -> ForwardPassMetrics {
        let var = |f: fn(&FpmLengths) -> &Vec<u64>| {
            self.lengths.as_deref().map_or(0.0, |l| Welford::of(f(l)))
        };
        ForwardPassMetrics {
            version: FPM_VERSION,
            worker_id: worker_id.to_owned(),
            dp_rank,
            counter_id,
            wall_time: self.wall_time_secs,
            scheduled_requests: ScheduledRequests {
                num_prefill_requests: self.scheduled_num_prefill_requests,
                sum_prefill_tokens: self.scheduled_sum_prefill_tokens,
                var_prefill_length: var(|l| &l.scheduled_prefill),
                sum_prefill_kv_tokens: self.scheduled_sum_prefill_kv_tokens,
                num_decode_requests: self.scheduled_num_decode_requests,
                sum_decode_kv_tokens: self.scheduled_sum_decode_kv_tokens,
                var_decode_kv_tokens: var(|l| &l.scheduled_decode_kv),
            },
            queued_requests: QueuedRequests {
                num_prefill_requests: self.queued_num_prefill_requests,
                sum_prefill_tokens: self.queued_sum_prefill_tokens,
                var_prefill_length: var(|l| &l.queued_prefill),
                num_decode_requests: self.queued_num_decode_requests,
                sum_decode_kv_tokens: self.queued_sum_decode_kv_tokens,
                var_decode_kv_tokens: var(|l| &l.queued_decode_kv),
            },
        }
    }
}

static MALFORMED: AtomicU64 = AtomicU64::new(0);

/// FPM payloads dropped by subscribers of this process because they did not decode.
pub fn malformed_total() -> u64 {
    MALFORMED.load(Ordering::Relaxed)
}

pub(crate) fn count_malformed() {
    MALFORMED.fetch_add(1, Ordering::Relaxed);
}

/// The `(worker_id, dp_rank)` of a payload, if it is a valid snapshot.
pub fn payload_key(bytes: &[u8]) -> Option<(String, u32)> {
    ForwardPassMetrics::decode(bytes)
        .ok()
        .map(|m| (m.worker_id, m.dp_rank))
}

/// Exposition text of the process-wide FPM counters (appended to `/metrics`).
pub fn expfmt() -> String {
    format!(
        "# HELP dynamo_fpm_malformed_payloads_total FPM payloads dropped because they did not decode.\n\
         # TYPE dynamo_fpm_malformed_payloads_total counter\n\
         dynamo_fpm_malformed_payloads_total {}\n",
        malformed_total()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_matches_the_two_pass_formula() {
        let xs = [3u64, 7, 7, 19, 1000, 2];
        let mean = xs.iter().sum::<u64>() as f64 / xs.len() as f64;
        let two_pass = xs.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!((Welford::of(&xs) - two_pass).abs() < 1e-6);
        assert_eq!(Welford::of(&[]), 0.0);
        assert_eq!(Welford::of(&[42]), 0.0);
        assert_eq!(Welford::of(&[5, 5, 5]), 0.0);
    }

    #[test]
    fn snapshot_layout_matches_the_reference_bytes() {
        // Bytes the reference (ai-dynamo-runtime 1.6.1) published for this sample.
        let sample = FpmSample {
            scheduled_num_prefill_requests: 2,
            scheduled_sum_prefill_tokens: 300,
            scheduled_sum_prefill_kv_tokens: 400,
            scheduled_num_decode_requests: 5,
            scheduled_sum_decode_kv_tokens: 600,
            queued_num_prefill_requests: 7,
            queued_sum_prefill_tokens: 800,
            queued_num_decode_requests: 9,
            queued_sum_decode_kv_tokens: 1000,
            wall_time_secs: 0.025,
            lengths: None,
        };
        let bytes = sample.snapshot("w1", 1, 1).encode().unwrap();
        let reference: &[u8] = b"\x87\xa7version\x01\xa9worker_id\xa2w1\xa7dp_rank\x01\xaacounter_id\x01\xa9wall_time\xcb?\x99\x99\x99\x99\x99\x99\x9a\xb2scheduled_requests\x87\xb4num_prefill_requests\x02\xb2sum_prefill_tokens\xcd\x01,\xb2var_prefill_length\xcb\x00\x00\x00\x00\x00\x00\x00\x00\xb5sum_prefill_kv_tokens\xcd\x01\x90\xb3num_decode_requests\x05\xb4sum_decode_kv_tokens\xcd\x02X\xb4var_decode_kv_tokens\xcb\x00\x00\x00\x00\x00\x00\x00\x00\xafqueued_requests\x86\xb4num_prefill_requests\x07\xb2sum_prefill_tokens\xcd\x03 \xb2var_prefill_length\xcb\x00\x00\x00\x00\x00\x00\x00\x00\xb3num_decode_requests\t\xb4sum_decode_kv_tokens\xcd\x03\xe8\xb4var_decode_kv_tokens\xcb\x00\x00\x00\x00\x00\x00\x00\x00";
        assert_eq!(bytes, reference);
        assert_eq!(payload_key(&bytes), Some(("w1".into(), 1)));
        assert_eq!(payload_key(b"\xc1garbage"), None);
        // A map missing fields is not a snapshot.
        assert_eq!(payload_key(b"\x81\xa9worker_id\xa1d"), None);
    }

    #[test]
    fn variance_fields_use_the_lengths() {
        let sample = FpmSample {
            scheduled_num_prefill_requests: 2,
            lengths: Some(Box::new(FpmLengths {
                scheduled_prefill: vec![10, 30],
                ..FpmLengths::default()
            })),
            ..FpmSample::default()
        };
        let m = sample.snapshot("w", 0, 1);
        assert_eq!(m.scheduled_requests.var_prefill_length, 100.0);
        assert_eq!(m.queued_requests.var_prefill_length, 0.0);
    }
}
