//! The wire types between the frontend and `ModelInput.Tokens` workers: the
//! [`PreprocessedRequest`] a worker's `generate` receives (as a JSON dict in Python) and the
//! [`LLMEngineOutput`] items it streams back.
//!
//! Field names follow the reference, so workers written for it (which read
//! `request["token_ids"]`, `request["stop_conditions"]["max_tokens"]`, ... and yield
//! `{"token_ids": [...], "finish_reason": ...}`) work unchanged. Unknown fields are ignored
//! in both directions, so either side can be newer.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// When to stop generating.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopConditions {
    /// Most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stop strings (applied by the frontend on the detokenized text; workers may ignore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// Token ids that end generation without appearing in the output (besides eos).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids_hidden: Option<Vec<u32>>,
    /// Do not stop before this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Generate past eos tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
}

/// Sampling parameters (engines apply them; the mocker ignores them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingOptions {
    /// Choices per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Presence penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Top-p.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// Min-p.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Keep the matched stop string in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// Structured-output request (`response_format`), passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_decoding: Option<serde_json::Value>,
}

/// What to return besides tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputOptions {
    /// Top alternatives per token to return with log probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Prompt log probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<u32>,
    /// Drop special tokens from the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// The rendered prompt, when the client asked to see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formatted_prompt: Option<String>,
}

/// Hints for the router and the worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingHints {
    /// Send to this instance (direct routing / migration pinning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_instance_id: Option<u64>,
    /// Data-parallel rank chosen by the router.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    /// LoRA adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_name: Option<String>,
    /// Prefix blocks the router expects to hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_prefix_hit_num_blocks: Option<u32>,
}

/// The request a `ModelInput.Tokens` worker receives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreprocessedRequest {
    /// Served model name.
    pub model: String,
    /// Prompt token ids (for a migrated request: prompt plus tokens generated so far).
    pub token_ids: Vec<u32>,
    /// When to stop.
    #[serde(default)]
    pub stop_conditions: StopConditions,
    /// Sampling parameters.
    #[serde(default)]
    pub sampling_options: SamplingOptions,
    /// Extra outputs.
    #[serde(default)]
    pub output_options: OutputOptions,
    /// Token ids that end generation (the model's eos tokens), unless `ignore_eos`.
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// Checksum of the model card the frontend used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mdc_sum: Option<String>,
    /// Requested annotations (`nvext.annotations`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<String>,
    /// Routing hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingHints>,
    /// Decoded images of a multimodal chat request (`docs/design/multimodal.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_modal_data: Option<MultiModalData>,
    /// Per-block image hashes: what the KV router and the engine's KV events hash with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mm_routing_info: Option<MmRoutingInfo>,
}

/// Decoded media of one request, in prompt order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiModalData {
    /// Images.
    #[serde(default)]
    pub images: Vec<ImageData>,
}

/// One decoded image as a worker receives it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageData {
    /// Content hash of the pixels (`dynamo_multimodal::mm_hash_of`).
    pub mm_hash: u64,
    /// `[height, width, channels]`.
    pub shape: [u32; 3],
    /// Element type of `data` (always `"uint8"`).
    pub dtype: String,
    /// The pixels, row-major, channels last (msgpack `bin`, Python `bytes`).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Format of the source file (`png`, `jpeg`, `webp`, `gif`).
    pub format: String,
    /// `[start, end)` of the image's placeholder tokens in `token_ids`, when the prompt
    /// has them.
    #[serde(default)]
    pub token_range: Option<(usize, usize)>,
}

/// Routing information of a multimodal request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmRoutingInfo {
    /// Per-block image hashes (index = block number), as `compute_block_hash_for_seq`
    /// takes them.
    #[serde(default)]
    pub block_mm_infos: Vec<Option<dynamo_kv_router::hashing::BlockExtraInfo>>,
}

impl PreprocessedRequest {
    /// The request to send after a stream broke with `generated` tokens already streamed:
    /// they are appended to the prompt and `max_tokens` shrinks by their count
    /// (migration).
    #[must_use]
    pub fn continued(&self, generated: &[u32]) -> Self {
        let mut next = self.clone();
        next.token_ids.extend_from_slice(generated);
        let n = u32::try_from(generated.len()).unwrap_or(u32::MAX);
        if let Some(m) = next.stop_conditions.max_tokens.as_mut() {
            *m = m.saturating_sub(n);
        }
        if let Some(m) = next.stop_conditions.min_tokens.as_mut() {
            *m = m.saturating_sub(n);
        }
        next
    }
}

/// Why a worker's stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An eos token.
    Eos,
    /// A stop string or stop token.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Cancelled by the client.
    Cancelled,
    /// Filtered.
    ContentFilter,
    /// The engine failed.
    Error(String),
}

impl FinishReason {
    /// The OpenAI `finish_reason` (`stop` for eos/stop/cancelled, `length`,
    /// `content_filter`); `None` for errors, which become error events instead.
    pub fn to_openai(&self) -> Option<super::openai::OpenAiFinishReason> {
        use super::openai::OpenAiFinishReason as O;
        match self {
            Self::Eos | Self::Stop | Self::Cancelled => Some(O::Stop),
            Self::Length => Some(O::Length),
            Self::ContentFilter => Some(O::ContentFilter),
            Self::Error(_) => None,
        }
    }
}

impl Serialize for FinishReason {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Self::Eos => s.serialize_str("eos"),
            Self::Stop => s.serialize_str("stop"),
            Self::Length => s.serialize_str("length"),
            Self::Cancelled => s.serialize_str("cancelled"),
            Self::ContentFilter => s.serialize_str("content_filter"),
            Self::Error(msg) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("error", msg)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for FinishReason {
    /// Lenient: the names above in any case, `abort` (= cancelled), `error`, and
    /// `{"error": message}`.
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match &v {
            serde_json::Value::String(s) => match s.to_ascii_lowercase().as_str() {
                "eos" => Ok(Self::Eos),
                "stop" => Ok(Self::Stop),
                "length" => Ok(Self::Length),
                "cancelled" | "canceled" | "abort" => Ok(Self::Cancelled),
                "content_filter" => Ok(Self::ContentFilter),
                "error" => Ok(Self::Error(String::new())),
                other => Err(serde::de::Error::custom(format!(
                    "unknown finish_reason {other:?}"
                ))),
            },
            serde_json::Value::Object(o) if o.contains_key("error") => Ok(Self::Error(
                o.get("error")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            )),
            _ => Err(serde::de::Error::custom(format!(
                "invalid finish_reason {v}"
            ))),
        }
    }
}

/// One item a worker streams back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LLMEngineOutput {
    /// New token ids (usually one).
    #[serde(default)]
    pub token_ids: Vec<u32>,
    /// Decoded token strings, if the engine detokenizes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<String>>,
    /// New text, if the engine detokenizes (the frontend decodes `token_ids` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Cumulative log probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cum_log_probs: Option<f64>,
    /// Log probability of each new token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_probs: Option<Vec<f64>>,
    /// Top alternatives per new token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<serde_json::Value>,
    /// Set on the last item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Choice index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Usage reported by the engine (e.g. cached prompt tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_usage: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_shape() {
        let req = PreprocessedRequest {
            model: "m".into(),
            token_ids: vec![1, 2, 3],
            stop_conditions: StopConditions {
                max_tokens: Some(10),
                ..Default::default()
            },
            eos_token_ids: vec![2],
            ..Default::default()
        };
        let v = serde_json::to_value(&req).expect("json");
        assert_eq!(v["token_ids"], serde_json::json!([1, 2, 3]));
        assert_eq!(v["stop_conditions"]["max_tokens"], 10);
        assert_eq!(v["eos_token_ids"], serde_json::json!([2]));
        let back: PreprocessedRequest = serde_json::from_value(v).expect("back");
        assert_eq!(back, req);
        // Minimal worker-side construction and unknown fields.
        let min: PreprocessedRequest =
            serde_json::from_str(r#"{"model":"m","token_ids":[5],"future_field":1}"#).expect("min");
        assert_eq!(min.token_ids, [5]);
    }

    #[test]
    fn continued_request_appends_generated_tokens() {
        let req = PreprocessedRequest {
            token_ids: vec![1, 2],
            stop_conditions: StopConditions {
                max_tokens: Some(5),
                min_tokens: Some(1),
                ..Default::default()
            },
            ..Default::default()
        };
        let next = req.continued(&[7, 8]);
        assert_eq!(next.token_ids, [1, 2, 7, 8]);
        assert_eq!(next.stop_conditions.max_tokens, Some(3));
        assert_eq!(next.stop_conditions.min_tokens, Some(0));
    }

    #[test]
    fn finish_reasons_parse_leniently() {
        for (json, want) in [
            (r#""eos""#, FinishReason::Eos),
            (r#""STOP""#, FinishReason::Stop),
            (r#""length""#, FinishReason::Length),
            (r#""abort""#, FinishReason::Cancelled),
            (r#"{"error":"boom"}"#, FinishReason::Error("boom".into())),
        ] {
            assert_eq!(
                serde_json::from_str::<FinishReason>(json).expect(json),
                want
            );
        }
        assert!(serde_json::from_str::<FinishReason>(r#""weird""#).is_err());
        let out: LLMEngineOutput =
            serde_json::from_str(r#"{"token_ids":[4],"finish_reason":"length"}"#).expect("out");
        assert_eq!(out.finish_reason, Some(FinishReason::Length));
        assert_eq!(
            serde_json::to_string(&FinishReason::Error("x".into())).expect("ser"),
            r#"{"error":"x"}"#
        );
    }
}
