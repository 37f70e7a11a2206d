//! Request and response bodies of the selection service (in process and over HTTP), with
//! the reference's field names and shapes.
//!
//! A prompt is given either as `token_ids` (the service hashes them with the group's block
//! size) or, for callers that hash themselves, as `block_hashes` (local block hashes, for
//! the cache lookup) plus `sequence_hashes` (chained hashes, for load tracking) and
//! optionally `isl_tokens`. 64-bit hashes are accepted signed or unsigned.

use std::collections::BTreeMap;

use dynamo_kv_router::scheduling::config::RouterConfigOverride;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use super::error::{Result, SelectionError};

/// Parse a JSON body, naming the offending field in the error.
///
/// # Errors
/// [`SelectionError::invalid`] with `field: reason`.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    parse_classified(bytes).map_err(|(_, e)| e)
}

/// [`parse`], also telling whether the bytes are not JSON at all (`true`) or JSON of the
/// wrong shape (`false`). The fast path is a plain parse; only a failing body is parsed
/// again with path tracking, to name the field.
///
/// # Errors
/// As [`parse`].
pub fn parse_classified<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, (bool, SelectionError)> {
    let first = match serde_json::from_slice(bytes) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let syntax = matches!(
        first.classify(),
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof
    );
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let err = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(_) => SelectionError::invalid(first.to_string()),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path.is_empty() || path == "." {
                SelectionError::invalid(inner.to_string())
            } else {
                SelectionError::invalid(format!("{path}: {inner}"))
            }
        }
    };
    Err((syntax, err))
}

/// A 64-bit hash given as a signed or unsigned JSON integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Hash64(pub u64);

impl<'de> Deserialize<'de> for Hash64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            U(u64),
            I(i64),
        }
        match Either::deserialize(d) {
            Ok(Either::U(u)) => Ok(Self(u)),
            Ok(Either::I(i)) => Ok(Self(i as u64)),
            Err(_) => Err(serde::de::Error::custom(
                "expected a 64-bit integer hash (signed or unsigned)",
            )),
        }
    }
}

/// The prompt and target of `select`, `select_and_reserve`, `overlap_scores`,
/// `potential_loads` and (with `worker_id`) `create_reservation`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PromptRequest {
    /// Caller-chosen id: `select` caches its choice under it, `select_and_reserve` books
    /// under it (a fresh UUID when absent).
    #[serde(default)]
    pub selection_id: Option<String>,
    /// Model (default `"default"`).
    #[serde(default)]
    pub model_name: Option<String>,
    /// Routing group (default `"default"`).
    #[serde(default)]
    pub routing_group: Option<String>,
    /// Prompt token ids.
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    /// Local block hashes (without `token_ids`).
    #[serde(default)]
    pub block_hashes: Option<Vec<Hash64>>,
    /// Sequence hashes (without `token_ids`).
    #[serde(default)]
    pub sequence_hashes: Option<Vec<Hash64>>,
    /// Prompt length in tokens (without `token_ids`; default blocks x block size).
    #[serde(default)]
    pub isl_tokens: Option<usize>,
    /// LoRA adapter (changes block hashes).
    #[serde(default)]
    pub lora_name: Option<String>,
    /// Cache namespace (changes block hashes).
    #[serde(default)]
    pub cache_namespace: Option<String>,
    /// Per-request router overrides.
    #[serde(default)]
    pub router_config_override: Option<RouterConfigOverride>,
    /// `create_reservation`: book on this worker.
    #[serde(default)]
    pub worker_id: Option<u64>,
    /// `create_reservation`: book on this rank (default the worker's first).
    #[serde(default)]
    pub dp_rank: Option<u32>,
}

impl PromptRequest {
    /// Model, defaulted.
    pub fn model(&self) -> &str {
        self.model_name
            .as_deref()
            .unwrap_or(super::catalog::DEFAULT_MODEL)
    }

    /// Group, defaulted.
    pub fn group(&self) -> &str {
        self.routing_group
            .as_deref()
            .unwrap_or(super::catalog::DEFAULT_GROUP)
    }
}

/// `create_reservation`'s body: `selection_id` is required; the rest as [`PromptRequest`].
#[derive(Debug, Clone, Deserialize)]
pub struct ReservationRequest {
    /// The id to book under (and of the cached selection to replay).
    pub selection_id: String,
    /// Everything else.
    #[serde(flatten)]
    pub prompt: PromptRequest,
}

/// The body of `POST /reservations/{id}/output_block`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct OutputBlockRequest {
    /// Optional decay of the booked decode load.
    #[serde(default)]
    pub decay_fraction: Option<f64>,
}

/// Cache overlap of the chosen worker, in tokens (blocks x block size).
#[derive(Debug, Clone, Serialize)]
pub struct OverlapSummary {
    /// The longest device prefix any candidate holds.
    pub longest_matched: u32,
    /// The chosen rank's device prefix.
    pub gpu: u32,
    /// Per data-parallel rank of the chosen worker.
    pub dp: BTreeMap<String, u32>,
    /// Prefix reachable from host memory (the device prefix: offload tiers are not indexed).
    pub cpu: u32,
    /// Prefix reachable from disk (likewise).
    pub disk: u32,
}

/// What was chosen.
#[derive(Debug, Clone, Serialize)]
pub struct Selected {
    /// Model.
    pub model_name: String,
    /// Group.
    pub routing_group: String,
    /// Chosen worker.
    pub worker_id: u64,
    /// Chosen rank.
    pub dp_rank: u32,
    /// The worker's request endpoint.
    pub endpoint: Option<String>,
    /// Tokens per block.
    pub block_size: u32,
    /// Cache overlap.
    pub overlap: OverlapSummary,
    /// Prompt tokens left to prefill after the cached prefix.
    pub effective_prefill_tokens: usize,
    /// KV blocks the chosen rank would hold with this request.
    pub potential_decode_blocks: u64,
}

/// `select`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct SelectResponse {
    /// The caller's id, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection_id: Option<String>,
    /// The choice.
    #[serde(flatten)]
    pub selected: Selected,
}

/// `select_and_reserve`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct ReserveResponse {
    /// The booking id.
    pub selection_id: String,
    /// Sequence hashes booked (signed, as the reference reports them).
    pub sequence_hashes: Vec<i64>,
    /// Prompt tokens.
    pub isl_tokens: usize,
    /// Whether prompt tokens are tracked until prefill completes.
    pub track_prefill_tokens: bool,
    /// The choice.
    #[serde(flatten)]
    pub selected: Selected,
}

/// `create_reservation`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct ReservationResponse {
    /// The booking id.
    pub selection_id: String,
    /// Model.
    pub model_name: String,
    /// Group.
    pub routing_group: String,
    /// Booked worker.
    pub worker_id: u64,
    /// Booked rank.
    pub dp_rank: u32,
    /// The worker's request endpoint.
    pub endpoint: Option<String>,
}

/// Load of one rank.
#[derive(Debug, Clone, Serialize)]
pub struct LoadEntry {
    /// Worker.
    pub worker_id: u64,
    /// Rank.
    pub dp_rank: u32,
    /// Prompt tokens waiting for prefill (with the request, for `potential_loads`).
    pub potential_prefill_tokens: u64,
    /// KV blocks held (with the request, for `potential_loads`).
    pub potential_decode_blocks: u64,
    /// In-flight requests.
    pub active_requests: u64,
}

/// `loads`' entry for one model and group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupLoads {
    /// Model.
    pub model_name: String,
    /// Group.
    pub routing_group: String,
    /// Per rank.
    pub loads: Vec<LoadEntry>,
    /// Requests waiting in a queue (the service does not queue: 0).
    pub pending_count: u64,
    /// Their prompt tokens (0).
    pub pending_isl_tokens: u64,
}

/// Overlap of one rank, per tier.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerOverlap {
    /// Worker.
    pub worker_id: u64,
    /// Rank.
    pub dp_rank: u32,
    /// Leading blocks on the device.
    pub device_blocks: u32,
    /// Leading blocks reachable from host memory (the device prefix).
    pub host_pinned_blocks: u32,
    /// Leading blocks reachable from disk (the device prefix).
    pub disk_blocks: u32,
    /// Host blocks beyond the device prefix (0).
    pub host_pinned_extension_blocks: u32,
    /// Disk blocks beyond the device prefix (0).
    pub disk_extension_blocks: u32,
    /// Shared-cache blocks beyond the device prefix (no shared cache: null).
    pub shared_beyond_device_blocks: Option<u32>,
}

/// Shared-cache part of `overlap_scores` (no shared cache is configured).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SharedCache {
    /// Always false.
    pub enabled: bool,
    /// 0.
    pub total_hit_blocks: u32,
    /// Empty.
    pub ranges: Vec<(u32, u32)>,
    /// None.
    pub error: Option<String>,
}

/// `overlap_scores`' answer.
#[derive(Debug, Clone, Serialize)]
pub struct OverlapResponse {
    /// Tokens per block.
    pub block_size: u32,
    /// Complete blocks of the prompt.
    pub num_blocks: usize,
    /// Every rank of the group.
    pub workers: Vec<WorkerOverlap>,
    /// Shared cache.
    pub shared_cache: SharedCache,
}

/// `ready`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct ReadyResponse {
    /// At least one worker is schedulable and the service runs.
    pub ready: bool,
    /// Schedulable workers.
    pub schedulable_workers: usize,
    /// Every catalog record.
    pub workers: Vec<super::catalog::WorkerRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field() {
        let e = parse::<PromptRequest>(br#"{"token_ids": "x"}"#).unwrap_err();
        assert!(e.message.starts_with("token_ids:"), "{}", e.message);
        let e = parse::<PromptRequest>(br#"{"token_ids": [-1]}"#).unwrap_err();
        assert!(e.message.contains("token_ids"), "{}", e.message);
        let e = parse::<ReservationRequest>(br#"{}"#).unwrap_err();
        assert!(e.message.contains("selection_id"), "{}", e.message);
    }

    #[test]
    fn hashes_accept_signed_and_unsigned() {
        let r: PromptRequest =
            parse(br#"{"block_hashes": [-1, 18446744073709551615], "sequence_hashes": [1]}"#)
                .unwrap();
        let b = r.block_hashes.unwrap();
        assert_eq!(b[0], b[1]);
    }
}
