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

/// A body with a `token_ids` list, which [`parse_with_tokens`] reads directly.
pub trait WithTokenIds: DeserializeOwned {
    /// Put the directly read `token_ids` in place.
    fn set_token_ids(&mut self, token_ids: Vec<u32>);
}

impl WithTokenIds for PromptRequest {
    fn set_token_ids(&mut self, token_ids: Vec<u32>) {
        self.token_ids = Some(token_ids);
    }
}

impl WithTokenIds for ReservationRequest {
    fn set_token_ids(&mut self, token_ids: Vec<u32>) {
        self.prompt.token_ids = Some(token_ids);
    }
}

/// [`parse_classified`] for a body whose bulk is a `token_ids` list (a 10k-token prompt is
/// about 50 KB of digits): the list is read by a tight loop (see [`split_token_ids`]) and
/// the rest of the body by serde. Any body the direct reader does not take as it is
/// (another shape, a token that is not a `u32`, an escaped key, ...) goes through
/// [`parse_classified`], which also words the errors; both read a body the same way.
///
/// # Errors
/// As [`parse_classified`].
pub fn parse_with_tokens<T: WithTokenIds>(bytes: &[u8]) -> Result<T, (bool, SelectionError)> {
    if let Some((rest, tokens)) = split_token_ids(bytes)
        && let Ok(mut v) = serde_json::from_slice::<T>(&rest)
    {
        v.set_token_ids(tokens);
        return Ok(v);
    }
    parse_classified(bytes)
}

/// Read the top-level `"token_ids"` array of a JSON object directly: the tokens and the
/// body with that array replaced by `[]`. `None` when the body is not an object with such
/// a member spelled plainly, or the array is not a list of plain non-negative integers
/// that fit in `u32` (serde then reads it, and reports what is wrong). The rest of the
/// body is not checked here: serde parses it.
pub fn split_token_ids(bytes: &[u8]) -> Option<(Vec<u8>, Vec<u32>)> {
    let ws = |mut i: usize| {
        while matches!(bytes.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
        i
    };
    let mut i = ws(0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = ws(i);
        if bytes.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(bytes, i)?;
        let key = &bytes[i + 1..key_end - 1];
        i = ws(key_end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        i = ws(i + 1);
        if key == b"token_ids" && bytes.get(i) == Some(&b'[') {
            let (tokens, end) = token_array(bytes, i)?;
            let mut rest = Vec::with_capacity(bytes.len() - (end - i) + 2);
            rest.extend_from_slice(&bytes[..i]);
            rest.extend_from_slice(b"[]");
            rest.extend_from_slice(&bytes[end..]);
            return Some((rest, tokens));
        }
        i = ws(value_end(bytes, i)?);
        match bytes.get(i) {
            Some(b',') => i += 1,
            _ => return None,
        }
    }
}

/// The index after the JSON string that starts (with its quote) at `start`.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match bytes.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// The index after the JSON value that starts at `start` (not validated: serde parses it).
fn value_end(bytes: &[u8], start: usize) -> Option<usize> {
    match bytes.get(start)? {
        b'"' => string_end(bytes, start),
        b'[' | b'{' => {
            let mut depth = 0usize;
            let mut i = start;
            loop {
                match bytes.get(i)? {
                    b'"' => {
                        i = string_end(bytes, i)?;
                        continue;
                    }
                    b'[' | b'{' => depth += 1,
                    b']' | b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = start;
            while !matches!(
                bytes.get(i),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                i += 1;
            }
            Some(i)
        }
    }
}

/// A JSON array of plain non-negative integers that fit in `u32`, starting at `start`:
/// the values and the index after the `]`.
fn token_array(bytes: &[u8], start: usize) -> Option<(Vec<u32>, usize)> {
    let ws = |mut i: usize| {
        while matches!(bytes.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
        i
    };
    // At least two bytes per token ("1,").
    let mut out = Vec::with_capacity((bytes.len() - start) / 2);
    let mut i = ws(start + 1);
    if bytes.get(i) == Some(&b']') {
        return Some((out, i + 1));
    }
    loop {
        let first = i;
        let mut v: u64 = 0;
        while let Some(&d) = bytes.get(i) {
            if !d.is_ascii_digit() {
                break;
            }
            v = v * 10 + u64::from(d - b'0');
            if v > u64::from(u32::MAX) {
                return None;
            }
            i += 1;
        }
        // No digits, or a leading zero (JSON has none): serde says what is wrong.
        if i == first || (bytes[first] == b'0' && i - first > 1) {
            return None;
        }
        out.push(v as u32);
        i = ws(i);
        match bytes.get(i)? {
            b',' => i = ws(i + 1),
            b']' => return Some((out, i + 1)),
            _ => return None,
        }
    }
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
    fn token_lists_are_read_directly_and_the_same() {
        let body = br#" { "model_name" : "m\"token_ids\"", "x": {"token_ids": [9]},
            "token_ids" : [ 1 , 22,4294967295,0 ] , "routing_group": "g" } "#;
        let (rest, tokens) = split_token_ids(body).expect("direct");
        assert_eq!(tokens, [1, 22, 4_294_967_295, 0]);
        assert!(
            std::str::from_utf8(&rest)
                .unwrap()
                .contains(r#""token_ids" : [] ,"#)
        );
        let direct: PromptRequest = parse_with_tokens(body).map_err(|e| e.1).unwrap();
        let general: PromptRequest = parse(body).unwrap();
        assert_eq!(direct.token_ids, general.token_ids);
        assert_eq!(direct.model_name, general.model_name);
        assert_eq!(direct.routing_group.as_deref(), Some("g"));
        let r: ReservationRequest =
            parse_with_tokens(br#"{"selection_id": "a", "token_ids": [5]}"#)
                .map_err(|e| e.1)
                .unwrap();
        assert_eq!(r.prompt.token_ids, Some(vec![5]));
        assert_eq!(
            split_token_ids(br#"{"token_ids": []}"#).unwrap().1,
            Vec::<u32>::new()
        );
        // Not taken directly: serde reads them and reports what is wrong.
        for bad in [
            &br#"{"token_ids": [1, -2]}"#[..],
            br#"{"token_ids": [4294967296]}"#,
            br#"{"token_ids": [1.0]}"#,
            br#"{"token_ids": [01]}"#,
            br#"{"token_ids": [1,]}"#,
            br#"{"token_ids": [1 2]}"#,
            br#"{"token_ids": "x"}"#,
            br#"{"token\u005fids": [1]}"#,
            br#"[1]"#,
            br#"{"token_ids": [1"#,
        ] {
            assert!(
                split_token_ids(bad).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        for (bad, syntax) in [
            (&br#"{"token_ids": [1, -2]}"#[..], false),
            (br#"{"token_ids": [1,]}"#, true),
            (br#"{"token_ids": [1], "token_ids": [2]}"#, false),
            (br#"{"token_ids": [1]"#, true),
            (br#"{"token_ids": [1]} x"#, true),
        ] {
            let e = parse_with_tokens::<PromptRequest>(bad).unwrap_err();
            let g = parse_classified::<PromptRequest>(bad).unwrap_err();
            assert_eq!((e.0, &e.1.message), (syntax, &g.1.message));
        }
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
