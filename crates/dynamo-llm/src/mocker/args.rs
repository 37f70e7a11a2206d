//! Mocker engine arguments ([`MockEngineArgs`]), with the reference's defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Role of a worker in (dis)aggregated serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MockWorkerType {
    /// Prefill and decode in one worker.
    #[default]
    Aggregated,
    /// Prefill only (disaggregated serving).
    Prefill,
    /// Decode only (disaggregated serving).
    Decode,
}

/// Which request to preempt when the KV cache runs out during decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreemptionMode {
    /// The most recently admitted request (vLLM's policy).
    #[default]
    Lifo,
    /// The oldest running request.
    Fifo,
}

/// Arguments the reference accepts that this mocker does not model. They are accepted (so
/// existing command lines and JSON keep working) and reported by
/// [`MockEngineArgs::unsupported_in_use`] when set to a value that would change behaviour.
pub const UNSUPPORTED_ARGS: &[&str] = &[
    "planner_profile_data",
    "aic_backend",
    "aic_system",
    "aic_backend_version",
    "aic_tp_size",
    "aic_model_path",
    "aic_moe_tp_size",
    "aic_moe_ep_size",
    "aic_attention_dp_size",
    "aic_nextn",
    "aic_nextn_accept_rates",
    "aic_mtp_seed",
    "aic_gemm_dtype",
    "aic_moe_dtype",
    "aic_fmha_dtype",
    "aic_kv_cache_dtype",
    "aic_comm_dtype",
    "gpu_memory_utilization",
    "mem_fraction_static",
    "free_gpu_memory_fraction",
    "bootstrap_port",
    "handoff_session_timeout_ms",
    "kv_bytes_per_token",
    "kv_transfer_bandwidth",
    "kv_transfer_timing_mode",
    "reasoning",
    "response_replay_trace_path",
    "zmq_kv_events_port",
    "zmq_replay_port",
    "router_queue_policy",
    "sglang",
    "trtllm",
    "num_g2_blocks",
    "num_g3_blocks",
    "offload_batch_size",
    "bandwidth_g1_to_g2_gbps",
    "bandwidth_g2_to_g1_gbps",
    "bandwidth_g2_to_g3_gbps",
    "bandwidth_g3_to_g2_gbps",
    "enable_g4_storage",
    "bandwidth_g2_to_g4_gbps",
    "bandwidth_g4_to_g2_gbps",
];

/// Values of unsupported arguments that mean "not used" (the reference's defaults).
fn is_inert(name: &str, value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (name, value) {
        (_, Value::Null) | (_, Value::Bool(false)) => true,
        ("aic_mtp_seed", v) => v.as_u64() == Some(42),
        ("handoff_session_timeout_ms", v) => v.as_u64() == Some(300_000),
        ("kv_transfer_timing_mode", v) => v.as_str() == Some("full_prompt"),
        _ => false,
    }
}

/// Configuration of one simulated engine (one data-parallel rank per [`super::MockEngine`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MockEngineArgs {
    /// Scheduler flavour; `vllm` and `sglang` are both simulated with the vLLM-style
    /// scheduler.
    pub engine_type: String,
    /// KV-cache capacity in blocks.
    pub num_gpu_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Token budget of one forward pass.
    pub max_num_batched_tokens: usize,
    /// Reuse cached prefix blocks across requests.
    pub enable_prefix_caching: bool,
    /// Split long prompts over several forward passes.
    pub enable_chunked_prefill: bool,
    /// Fraction of blocks kept free when admitting new requests.
    pub watermark: f64,
    /// Simulated time runs this many times faster than real time.
    pub speedup_ratio: f64,
    /// Extra speed-up of decode steps.
    pub decode_speedup_ratio: f64,
    /// Data-parallel ranks (one engine each).
    pub dp_size: u32,
    /// Simulated start-up delay in seconds.
    pub startup_time: Option<f64>,
    /// Aggregated, prefill or decode worker.
    pub worker_type: MockWorkerType,
    /// Longest sequence (prompt plus output) accepted.
    pub max_model_len: Option<usize>,
    /// Keep a worker-local KV indexer for router recovery.
    pub enable_local_indexer: bool,
    /// Which request to preempt under memory pressure.
    pub preemption_mode: PreemptionMode,
    /// Vocabulary size of generated token ids.
    pub vocab_size: u32,
    /// Accepted-but-unmodelled arguments of the reference (see [`UNSUPPORTED_ARGS`]).
    #[serde(flatten)]
    pub unsupported: BTreeMap<String, serde_json::Value>,
}

impl Default for MockEngineArgs {
    fn default() -> Self {
        Self {
            engine_type: "vllm".to_owned(),
            // The reference's defaults (vLLM-like engine on one large GPU).
            num_gpu_blocks: 16_384,
            block_size: 64,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            watermark: 0.01,
            speedup_ratio: 1.0,
            decode_speedup_ratio: 1.0,
            dp_size: 1,
            startup_time: None,
            worker_type: MockWorkerType::Aggregated,
            max_model_len: None,
            enable_local_indexer: false,
            preemption_mode: PreemptionMode::Lifo,
            // Large enough for any real tokenizer's ids to look plausible; the serving layer
            // sets the model's real vocabulary size.
            vocab_size: 32_000,
            unsupported: BTreeMap::new(),
        }
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> Error {
    Error::InvalidEngineArgs {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

impl MockEngineArgs {
    /// Parse JSON (missing fields take defaults) and validate.
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`] for malformed JSON, unknown fields or invalid values.
    pub fn from_json(json: &str) -> Result<Self> {
        let args: Self =
            serde_json::from_str(json).map_err(|e| invalid("<json>", e.to_string()))?;
        args.validate()?;
        Ok(args)
    }

    /// Check every field.
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`] naming the first offending field.
    pub fn validate(&self) -> Result<()> {
        if !matches!(self.engine_type.as_str(), "vllm" | "sglang") {
            return Err(invalid(
                "engine_type",
                format!("must be 'vllm' or 'sglang', got {:?}", self.engine_type),
            ));
        }
        for (field, value) in [
            ("num_gpu_blocks", self.num_gpu_blocks),
            ("block_size", self.block_size),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("vocab_size", self.vocab_size as usize),
            ("dp_size", self.dp_size as usize),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be > 0"));
            }
        }
        if !(0.0..1.0).contains(&self.watermark) {
            return Err(invalid(
                "watermark",
                format!("must be in [0, 1), got {}", self.watermark),
            ));
        }
        for (field, value) in [
            ("speedup_ratio", self.speedup_ratio),
            ("decode_speedup_ratio", self.decode_speedup_ratio),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(invalid(
                    field,
                    format!("must be finite and > 0, got {value}"),
                ));
            }
        }
        if let Some(t) = self.startup_time
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(invalid("startup_time", format!("must be >= 0, got {t}")));
        }
        if let Some(unknown) = self
            .unsupported
            .keys()
            .find(|k| !UNSUPPORTED_ARGS.contains(&k.as_str()))
        {
            return Err(invalid(unknown, "unknown mocker argument"));
        }
        Ok(())
    }

    /// Names of accepted-but-unmodelled arguments set to values that would change the
    /// behaviour of a real engine; callers should warn about them.
    pub fn unsupported_in_use(&self) -> Vec<&str> {
        self.unsupported
            .iter()
            .filter(|(k, v)| !is_inert(k, v))
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Whether this is a prefill-only worker.
    pub fn is_prefill(&self) -> bool {
        self.worker_type == MockWorkerType::Prefill
    }

    /// Whether this is a decode-only worker.
    pub fn is_decode(&self) -> bool {
        self.worker_type == MockWorkerType::Decode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip() {
        let args = MockEngineArgs::default();
        args.validate().expect("defaults are valid");
        let json = serde_json::to_string(&args).expect("serialize");
        assert_eq!(MockEngineArgs::from_json(&json).expect("parse"), args);
        assert_eq!(MockEngineArgs::from_json("{}").expect("parse"), args);
    }

    #[test]
    fn unsupported_args_are_accepted_and_reported() {
        let args = MockEngineArgs::from_json(
            r#"{"aic_backend": "vllm", "aic_mtp_seed": 42, "num_g2_blocks": null, "block_size": 16}"#,
        )
        .expect("accepted");
        assert_eq!(args.block_size, 16);
        assert_eq!(args.unsupported_in_use(), ["aic_backend"]);
    }

    #[test]
    fn invalid_values_name_the_field() {
        for (json, field) in [
            (r#"{"block_size": 0}"#, "block_size"),
            (r#"{"speedup_ratio": -1}"#, "speedup_ratio"),
            (r#"{"watermark": 1.5}"#, "watermark"),
            (r#"{"engine_type": "trt"}"#, "engine_type"),
            (r#"{"no_such_arg": 1}"#, "no_such_arg"),
        ] {
            let err = MockEngineArgs::from_json(json).expect_err(json);
            assert!(err.to_string().contains(field), "{err}");
        }
    }
}
