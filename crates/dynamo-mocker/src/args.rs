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
    // Only in the reference's mapping form (see [`MockEngineArgs::from_launch_config`]).
    "prefill_schedule_interval",
    "prefill_decode_interval",
    "emit_kv_events",
    "emit_kv_token_ids",
    "kv_cache_bytes_per_token",
    "kv_cache_groups",
    "kv_cache_capacity_bytes",
    "native_host_offload",
    "state_cache",
    "prefix_match_unit",
    "g3_offload",
    "timing_model",
    "tensor_parallel_size",
    "num_gpu_blocks_is_explicit",
    "cuda_graph_reserved_bytes",
];

/// Values of unsupported arguments that mean "not used" (the reference's defaults).
fn is_inert(name: &str, value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (name, value) {
        (_, Value::Null) | (_, Value::Bool(false)) => true,
        ("aic_mtp_seed", v) => v.as_u64() == Some(42),
        ("handoff_session_timeout_ms", v) => v.as_u64() == Some(300_000),
        ("kv_transfer_timing_mode", v) => v.as_str() == Some("full_prompt"),
        ("prefill_schedule_interval" | "tensor_parallel_size", v) => v.as_u64() == Some(1),
        ("prefill_decode_interval", v) => v.as_u64() == Some(0),
        ("timing_model", v) => *v == serde_json::json!({"type": "polynomial"}),
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
    /// Also publish the KV events on a ZMQ PUB socket bound on this port, in the vLLM
    /// engine wire format (see `mocker::zmq_events`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zmq_kv_events_port: Option<u16>,
    /// With `zmq_kv_events_port`: keep recent KV-event messages for replay on a ROUTER
    /// socket bound on this port (vLLM's replay protocol).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zmq_replay_port: Option<u16>,
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
            zmq_kv_events_port: None,
            zmq_replay_port: None,
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
    /// Parse JSON (missing fields take defaults) and validate: the flat form, or the
    /// reference's mapping form (an object with an `engine` or `dynamo` key, see
    /// [`MockEngineArgs::from_launch_config`]).
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`] for malformed JSON, unknown fields or invalid values.
    pub fn from_json(json: &str) -> Result<Self> {
        match serde_json::from_str(json).map_err(|e| invalid("<json>", e.to_string()))? {
            // The reference's mapping form (an `extra_engine_args` file written for it):
            // neither section name is a flat-form key.
            serde_json::Value::Object(map)
                if map.contains_key("engine") || map.contains_key("dynamo") =>
            {
                Self::from_launch_config(serde_json::Value::Object(map))
            }
            serde_json::Value::Object(flat) => Self::from_flat(flat),
            other => Err(invalid(
                "<json>",
                format!("expected an object, got {other}"),
            )),
        }
    }

    /// Parse the reference 1.6.x mapping form, `{"engine": {...}, "dynamo": {...}}` plus
    /// the launch options beside them (`dp_size`, `startup_time`, ...), and validate. The
    /// sections hold the same arguments as the flat form, with the reference's names
    /// (`engine.backend` is `engine_type`, `engine.kv_transfer_bytes_per_token` is
    /// `kv_bytes_per_token`); `null` means the default.
    ///
    /// # Errors
    /// [`Error::InvalidEngineArgs`] naming an unknown key (with its section) or an invalid
    /// value.
    pub fn from_launch_config(config: serde_json::Value) -> Result<Self> {
        let launch: LaunchConfig = serde_json::from_value(config).map_err(|e| {
            invalid(
                "<launch config>",
                format!("invalid engine launch config: {e}"),
            )
        })?;
        let mut flat = serde_json::Map::new();
        for (section, value) in [
            (
                "<launch config>",
                section::<LaunchOptions>("", launch.options)?,
            ),
            ("engine", section::<EngineSection>("engine", launch.engine)?),
            ("dynamo", section::<DynamoSection>("dynamo", launch.dynamo)?),
        ] {
            let serde_json::Value::Object(map) = value else {
                return Err(invalid(section, "must be a mapping"));
            };
            flat.extend(map.into_iter().filter(|(_, v)| !v.is_null()));
        }
        Self::from_flat(flat)
    }

    /// Deserialise the flat form (missing keys take defaults) and validate; a value of
    /// the wrong type is reported with its key.
    fn from_flat(flat: serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        let args: Self =
            serde_json::from_value(serde_json::Value::Object(flat.clone())).map_err(|e| {
                // serde_json does not name the field in a type error: find it (error path
                // only) by parsing each key alone.
                let key = flat.iter().find(|(k, v)| {
                    let one = serde_json::Map::from_iter([((*k).clone(), (*v).clone())]);
                    serde_json::from_value::<Self>(serde_json::Value::Object(one)).is_err()
                });
                invalid(key.map_or("<json>", |(k, _)| k.as_str()), e.to_string())
            })?;
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

    /// One argument by its flat-form name: a modelled field's value, or an accepted but
    /// unmodelled argument's value (its reference default when unset). `None` for a name
    /// that is neither.
    pub fn get(&self, name: &str) -> Option<serde_json::Value> {
        if let Some(v) = self.unsupported.get(name) {
            return Some(v.clone());
        }
        if UNSUPPORTED_ARGS.contains(&name) {
            return Some(match name {
                "aic_mtp_seed" => 42.into(),
                "handoff_session_timeout_ms" => 300_000.into(),
                "kv_transfer_timing_mode" => "full_prompt".into(),
                "enable_g4_storage" => false.into(),
                _ => serde_json::Value::Null,
            });
        }
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(mut all)) => all.remove(name),
            _ => None,
        }
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

/// The keys of one section of the mapping form: each is an optional raw value,
/// serialised back under its flat-form name (`as`), so that serde's unknown-field check
/// names the offending key and [`MockEngineArgs`] checks the values.
macro_rules! launch_section {
    ($(#[$meta:meta])* $name:ident { $($key:ident $(as $flat:literal)?),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Default, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $name {
            $(
                $(#[serde(rename(serialize = $flat))])?
                #[serde(default, skip_serializing_if = "Option::is_none")]
                $key: Option<serde_json::Value>,
            )*
        }
    };
}

launch_section!(
    /// `engine`: the simulated engine's own arguments.
    EngineSection {
        backend as "engine_type", num_gpu_blocks, block_size, max_model_len, max_num_seqs,
        max_num_batched_tokens, prefill_schedule_interval, prefill_decode_interval,
        enable_prefix_caching, enable_chunked_prefill, speedup_ratio, decode_speedup_ratio,
        aic_nextn, aic_nextn_accept_rates, aic_mtp_seed, worker_type, preemption_mode,
        emit_kv_events, emit_kv_token_ids, kv_bytes_per_token,
        kv_transfer_bytes_per_token as "kv_bytes_per_token", kv_cache_bytes_per_token,
        kv_cache_groups, kv_cache_capacity_bytes, native_host_offload, state_cache,
        prefix_match_unit, g3_offload, kv_transfer_bandwidth, kv_transfer_timing_mode,
        timing_model, sglang, trtllm,
    }
);

launch_section!(
    /// `dynamo`: how the worker joins the Dynamo deployment.
    DynamoSection {
        enable_local_indexer, bootstrap_port, handoff_session_timeout_ms, reasoning,
        response_replay_trace_path, zmq_kv_events_port, zmq_replay_port, router_queue_policy,
    }
);

launch_section!(
    /// The launch options beside the two sections.
    LaunchOptions {
        dp_size, tensor_parallel_size, startup_time, num_gpu_blocks_is_explicit,
        gpu_memory_utilization, mem_fraction_static, free_gpu_memory_fraction,
        cuda_graph_reserved_bytes,
    }
);

/// The mapping form's top level: the two sections (absent or `null`: defaults) and the
/// launch options, kept raw so each part's unknown keys are reported with its name.
#[derive(Deserialize)]
struct LaunchConfig {
    #[serde(default)]
    engine: serde_json::Value,
    #[serde(default)]
    dynamo: serde_json::Value,
    #[serde(flatten)]
    options: serde_json::Map<String, serde_json::Value>,
}

/// Check one section's keys and return it as flat-form JSON.
fn section<T: Default + Serialize + serde::de::DeserializeOwned>(
    name: &str,
    value: impl Into<serde_json::Value>,
) -> Result<serde_json::Value> {
    let value = value.into();
    let parsed: T = if value.is_null() {
        T::default()
    } else {
        serde_json::from_value(value).map_err(|e| {
            let reason = e.to_string();
            match reason.strip_prefix("unknown field `") {
                // Name the key with its section, as the reference does (`engine.bogus`).
                Some(rest) if !name.is_empty() => {
                    let key = rest.split('`').next().unwrap_or_default();
                    invalid(&format!("{name}.{key}"), reason.clone())
                }
                _ => invalid(
                    if name.is_empty() {
                        "<launch config>"
                    } else {
                        name
                    },
                    reason,
                ),
            }
        })?
    };
    serde_json::to_value(parsed).map_err(|e| invalid(name, e.to_string()))
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
    fn launch_config_maps_sections_onto_the_flat_form() {
        let args = MockEngineArgs::from_launch_config(serde_json::json!({
            "engine": {"backend": "sglang", "block_size": 16, "max_model_len": null,
                       "timing_model": {"type": "polynomial"}},
            "dynamo": {"enable_local_indexer": true, "bootstrap_port": 9000},
            "dp_size": 2,
        }))
        .expect("accepted");
        assert_eq!(
            (args.engine_type.as_str(), args.block_size, args.dp_size),
            ("sglang", 16, 2)
        );
        assert!(args.enable_local_indexer);
        assert_eq!(args.unsupported_in_use(), ["bootstrap_port"]);
        let defaults = MockEngineArgs::from_launch_config(serde_json::json!({})).expect("empty");
        assert_eq!(
            defaults.num_gpu_blocks,
            MockEngineArgs::default().num_gpu_blocks
        );
        // A JSON text in the mapping form (an `extra_engine_args` file) is recognised.
        let text = MockEngineArgs::from_json(r#"{"engine": {"block_size": 32}}"#).expect("text");
        assert_eq!(text.block_size, 32);
    }

    #[test]
    fn launch_config_names_unknown_keys() {
        for (config, name) in [
            (serde_json::json!({"engine": {"bogus": 1}}), "engine.bogus"),
            (serde_json::json!({"dynamo": {"nope": 1}}), "dynamo.nope"),
            (serde_json::json!({"zzz": {}}), "zzz"),
            (
                serde_json::json!({"engine": {"block_size": "x"}}),
                "block_size",
            ),
        ] {
            let err = MockEngineArgs::from_launch_config(config).expect_err(name);
            assert!(err.to_string().contains(name), "{err}");
        }
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
