//! Router configuration: [`KvRouterConfig`] (process-wide) and [`RouterConfigOverride`]
//! (per request). Defined once here, with their defaults and validation; the Python classes
//! wrap these types.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How the router hashes blocks for its own active-load tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TrackingHash {
    /// The public block/sequence hashes (`xxh3`, seed 1337), shared with the KV events.
    #[default]
    #[serde(rename = "public-xxh3-v1")]
    PublicXxh3V1,
    /// Hashes keyed with a secret (`router_tracking_key_file`), so tracking state cannot be
    /// probed with chosen prompts.
    #[serde(rename = "keyed-xxh3-v1")]
    KeyedXxh3V1,
}

/// Model of how long queued prefill work takes on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefillLoadModel {
    /// Active prefill tokens count until the worker reports its first token.
    #[default]
    None,
    /// AIConfigurator performance model (decays the oldest prefill by its predicted time).
    Aic,
}

/// Order in which queued requests are dispatched when every worker is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueuePolicy {
    /// First come, first served: optimises tail time-to-first-token.
    #[default]
    Fcfs,
    /// Last come, first served (for experiments).
    Lcfs,
    /// Weighted shortest processing time (Smith's rule): optimises mean time-to-first-token.
    Wspt,
}

/// Kind of cache shared between workers (e.g. a hierarchical cache) that the cost credits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedCacheType {
    /// No shared cache.
    #[default]
    None,
    /// SGLang HiCache.
    Hicache,
}

macro_rules! parse_named_enum {
    ($ty:ident, $field:literal, { $($name:literal => $variant:ident),+ $(,)? }) => {
        impl std::str::FromStr for $ty {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    other => Err(Error::InvalidConfig {
                        field: $field,
                        reason: format!(
                            "must be one of {}, got {other:?}",
                            [$($name),+].join(", ")
                        ),
                    }),
                }
            }
        }
        impl $ty {
            /// The configuration string of this value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }
    };
}

parse_named_enum!(TrackingHash, "router_tracking_hash", {
    "public-xxh3-v1" => PublicXxh3V1,
    "keyed-xxh3-v1" => KeyedXxh3V1,
});
parse_named_enum!(PrefillLoadModel, "router_prefill_load_model", {
    "none" => None,
    "aic" => Aic,
});
parse_named_enum!(QueuePolicy, "router_queue_policy", {
    "fcfs" => Fcfs,
    "lcfs" => Lcfs,
    "wspt" => Wspt,
});
parse_named_enum!(SharedCacheType, "shared_cache_type", {
    "none" => None,
    "hicache" => Hicache,
});

/// Configuration of the KV-aware router. Every field has the reference's default.
///
/// The selection cost of a worker (lower is better) is
/// `prefill_load_scale * max(0, prefill_blocks - credit) + decode_blocks
///  + decode_active_request_weight * active_requests`, where `credit` is the overlap credit
/// (see [`crate::scheduling::selector`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvRouterConfig {
    /// Credit (in blocks) per block of the prompt already cached on the worker's device.
    pub overlap_score_credit: f64,
    /// Shrinks the overlap credit of workers with more queued prefill than the least loaded.
    pub overlap_score_credit_decay: f64,
    /// Weight of the (credited) prefill load in the cost.
    pub prefill_load_scale: f64,
    /// Block-equivalents added per active request.
    pub decode_active_request_weight: f64,
    /// Credit per block cached in the worker's host (pinned) memory tier, in `[0, 1]`.
    pub host_cache_hit_weight: f64,
    /// Credit per block cached in the worker's disk tier, in `[0, 1]`.
    pub disk_cache_hit_weight: f64,
    /// Softmax temperature of the selection; 0 picks the cheapest worker.
    pub router_temperature: f64,
    /// Follow the workers' KV events (otherwise predict caches from routing decisions).
    pub use_kv_events: bool,
    /// Share active-load bookings with other router replicas.
    pub router_replica_sync: bool,
    /// Track the KV blocks of in-flight requests per worker (decode load).
    pub router_track_active_blocks: bool,
    /// Also track blocks generated by in-flight requests.
    pub router_track_output_blocks: bool,
    /// Assume a worker reuses cached blocks (shared prefixes count once).
    pub router_assume_kv_reuse: bool,
    /// Track prompt tokens waiting for prefill per worker (prefill load).
    pub router_track_prefill_tokens: bool,
    /// Hash scheme of the router's own tracking.
    pub router_tracking_hash: TrackingHash,
    /// 32-byte key file for [`TrackingHash::KeyedXxh3V1`].
    pub router_tracking_key_file: Option<String>,
    /// Identifier of the tracking key (keyed mode only).
    pub router_tracking_key_id: Option<String>,
    /// Prefill duration model.
    pub router_prefill_load_model: PrefillLoadModel,
    /// Lifetime of predicted cache entries when `use_kv_events` is off, in seconds.
    pub router_ttl_secs: f64,
    /// Queue requests when every worker's prefill load exceeds this fraction of its
    /// `max_num_batched_tokens`; `None` disables the queue.
    pub router_queue_threshold: Option<f64>,
    /// Threads applying KV events to the index.
    pub router_event_threads: u32,
    /// Dispatch order of queued requests.
    pub router_queue_policy: QueuePolicy,
    /// Query a remote indexer instead of keeping a local one.
    pub use_remote_indexer: bool,
    /// Serve this router's index to others.
    pub serve_indexer: bool,
    /// Credit per block found in a shared cache beyond the device prefix.
    pub shared_cache_multiplier: f64,
    /// Kind of shared cache.
    pub shared_cache_type: SharedCacheType,
    /// Lifetime of predict-on-route entries next to the event-driven index, in seconds.
    pub router_predicted_ttl_secs: Option<f64>,
    /// YAML policy file read at start-up.
    pub router_policy_config: Option<String>,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        Self {
            overlap_score_credit: 1.0,
            overlap_score_credit_decay: 0.0,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
            host_cache_hit_weight: 0.75,
            disk_cache_hit_weight: 0.25,
            router_temperature: 0.0,
            use_kv_events: true,
            router_replica_sync: false,
            router_track_active_blocks: true,
            router_track_output_blocks: false,
            router_assume_kv_reuse: true,
            router_track_prefill_tokens: true,
            router_tracking_hash: TrackingHash::PublicXxh3V1,
            router_tracking_key_file: None,
            router_tracking_key_id: None,
            router_prefill_load_model: PrefillLoadModel::None,
            // Long enough to cover a multi-turn conversation's think time, short enough that
            // predictions of evicted blocks fade (the reference's default).
            router_ttl_secs: 120.0,
            router_queue_threshold: None,
            // Event application parallelism; the reference's default.
            router_event_threads: 4,
            router_queue_policy: QueuePolicy::Fcfs,
            use_remote_indexer: false,
            serve_indexer: false,
            shared_cache_multiplier: 0.0,
            shared_cache_type: SharedCacheType::None,
            router_predicted_ttl_secs: None,
            router_policy_config: None,
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

fn non_negative(field: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(field, format!("must be finite and >= 0, got {v}")))
    }
}

fn unit_interval(field: &'static str, v: f64) -> Result<()> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(field, format!("must be in [0, 1], got {v}")))
    }
}

fn positive(field: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(invalid(field, format!("must be finite and > 0, got {v}")))
    }
}

impl KvRouterConfig {
    /// Apply the deprecated `overlap_score_weight` knob: it sets `prefill_load_scale`, and
    /// a weight of 0 (ignore the cache) also zeroes the overlap credit.
    pub fn apply_overlap_score_weight(&mut self, weight: f64) {
        self.prefill_load_scale = weight;
        if weight == 0.0 {
            self.overlap_score_credit = 0.0;
        }
    }

    /// Check every field and the combinations that cannot work together.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first offending field.
    pub fn validate(&self) -> Result<()> {
        non_negative("overlap_score_credit", self.overlap_score_credit)?;
        non_negative(
            "overlap_score_credit_decay",
            self.overlap_score_credit_decay,
        )?;
        non_negative("prefill_load_scale", self.prefill_load_scale)?;
        non_negative(
            "decode_active_request_weight",
            self.decode_active_request_weight,
        )?;
        unit_interval("host_cache_hit_weight", self.host_cache_hit_weight)?;
        unit_interval("disk_cache_hit_weight", self.disk_cache_hit_weight)?;
        non_negative("router_temperature", self.router_temperature)?;
        non_negative("shared_cache_multiplier", self.shared_cache_multiplier)?;
        positive("router_ttl_secs", self.router_ttl_secs)?;
        if let Some(t) = self.router_queue_threshold {
            non_negative("router_queue_threshold", t)?;
        }
        if let Some(t) = self.router_predicted_ttl_secs {
            positive("router_predicted_ttl_secs", t)?;
            if !self.use_kv_events {
                return Err(invalid(
                    "router_predicted_ttl_secs",
                    "predict-on-route needs use_kv_events=True",
                ));
            }
        }
        if self.router_event_threads == 0 {
            return Err(invalid("router_event_threads", "must be >= 1, got 0"));
        }
        if self.router_track_output_blocks && !self.router_track_active_blocks {
            return Err(invalid(
                "router_track_output_blocks",
                "needs router_track_active_blocks=True",
            ));
        }
        if self.router_prefill_load_model == PrefillLoadModel::Aic
            && (!self.router_track_prefill_tokens || self.router_queue_policy != QueuePolicy::Fcfs)
        {
            return Err(invalid(
                "router_prefill_load_model",
                "'aic' needs router_track_prefill_tokens=True and router_queue_policy='fcfs'",
            ));
        }
        if self.use_remote_indexer && self.serve_indexer {
            return Err(invalid(
                "serve_indexer",
                "use_remote_indexer and serve_indexer are mutually exclusive",
            ));
        }
        if self.serve_indexer && self.overlap_score_credit == 0.0 {
            return Err(invalid(
                "serve_indexer",
                "serving an index needs overlap_score_credit > 0",
            ));
        }
        match self.router_tracking_hash {
            TrackingHash::KeyedXxh3V1 => {
                if self
                    .router_tracking_key_file
                    .as_deref()
                    .is_none_or(str::is_empty)
                {
                    return Err(invalid(
                        "router_tracking_key_file",
                        "keyed-xxh3-v1 needs a 32-byte key file",
                    ));
                }
                if self
                    .router_tracking_key_id
                    .as_deref()
                    .is_none_or(str::is_empty)
                {
                    return Err(invalid(
                        "router_tracking_key_id",
                        "keyed-xxh3-v1 needs a non-empty key id",
                    ));
                }
            }
            TrackingHash::PublicXxh3V1 => {
                if self.router_tracking_key_file.is_some() || self.router_tracking_key_id.is_some()
                {
                    return Err(invalid(
                        "router_tracking_key_file",
                        "tracking key options need router_tracking_hash='keyed-xxh3-v1'",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Parse a JSON object (missing fields take their defaults) and validate it.
    ///
    /// # Errors
    /// [`Error::InvalidJson`] for malformed JSON or unknown fields, or
    /// [`Error::InvalidConfig`].
    pub fn from_json(json: &str) -> Result<Self> {
        let config: Self =
            serde_json::from_str(json).map_err(|e| Error::InvalidJson(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Whether the router needs a KV-event subscription at all.
    pub fn needs_kv_events(&self) -> bool {
        self.use_kv_events && self.overlap_score_credit > 0.0
    }

    /// The effective parameters of one request: this configuration with `overrides`
    /// applied.
    pub fn effective(&self, overrides: Option<&RouterConfigOverride>) -> EffectiveParams {
        let mut p = EffectiveParams {
            overlap_score_credit: self.overlap_score_credit,
            overlap_score_credit_decay: self.overlap_score_credit_decay,
            prefill_load_scale: self.prefill_load_scale,
            decode_active_request_weight: self.decode_active_request_weight,
            host_cache_hit_weight: self.host_cache_hit_weight,
            disk_cache_hit_weight: self.disk_cache_hit_weight,
            shared_cache_multiplier: self.shared_cache_multiplier,
            temperature: self.router_temperature,
            assume_kv_reuse: self.router_assume_kv_reuse,
            track_prefill_tokens: self.router_track_prefill_tokens,
            track_active_blocks: self.router_track_active_blocks,
        };
        if let Some(o) = overrides {
            if let Some(w) = o.overlap_score_weight {
                p.prefill_load_scale = w;
                if w == 0.0 {
                    p.overlap_score_credit = 0.0;
                }
            }
            if let Some(v) = o.overlap_score_credit {
                p.overlap_score_credit = v;
            }
            if let Some(v) = o.prefill_load_scale {
                p.prefill_load_scale = v;
            }
            if let Some(v) = o.router_temperature {
                p.temperature = v;
            }
            if let Some(v) = o.assume_kv_reuse {
                p.assume_kv_reuse = v;
            }
            if let Some(v) = o.track_prefill_tokens {
                p.track_prefill_tokens = v;
            }
            if let Some(v) = o.shared_cache_multiplier {
                p.shared_cache_multiplier = v;
            }
        }
        p
    }
}

/// Per-request overrides of the router configuration (the `router_config_override` dict).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfigOverride {
    /// Deprecated alias of `prefill_load_scale` (0 also zeroes the credit).
    pub overlap_score_weight: Option<f64>,
    /// See [`KvRouterConfig::overlap_score_credit`].
    pub overlap_score_credit: Option<f64>,
    /// See [`KvRouterConfig::prefill_load_scale`].
    pub prefill_load_scale: Option<f64>,
    /// See [`KvRouterConfig::router_temperature`].
    pub router_temperature: Option<f64>,
    /// See [`KvRouterConfig::router_assume_kv_reuse`].
    pub assume_kv_reuse: Option<bool>,
    /// See [`KvRouterConfig::router_track_prefill_tokens`].
    pub track_prefill_tokens: Option<bool>,
    /// See [`KvRouterConfig::shared_cache_multiplier`].
    pub shared_cache_multiplier: Option<f64>,
}

impl RouterConfigOverride {
    /// Check the overridden values with the same rules as [`KvRouterConfig::validate`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first offending field.
    pub fn validate(&self) -> Result<()> {
        let checks = [
            ("overlap_score_weight", self.overlap_score_weight),
            ("overlap_score_credit", self.overlap_score_credit),
            ("prefill_load_scale", self.prefill_load_scale),
            ("router_temperature", self.router_temperature),
            ("shared_cache_multiplier", self.shared_cache_multiplier),
        ];
        for (field, value) in checks {
            if let Some(v) = value {
                non_negative(field, v)?;
            }
        }
        Ok(())
    }
}

/// The cost parameters in force for one request (configuration plus overrides).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EffectiveParams {
    /// Device overlap credit per block.
    pub overlap_score_credit: f64,
    /// Credit decay with excess prefill load.
    pub overlap_score_credit_decay: f64,
    /// Weight of credited prefill blocks.
    pub prefill_load_scale: f64,
    /// Block-equivalents per active request.
    pub decode_active_request_weight: f64,
    /// Credit per host-tier block.
    pub host_cache_hit_weight: f64,
    /// Credit per disk-tier block.
    pub disk_cache_hit_weight: f64,
    /// Credit per shared-cache block beyond the device prefix.
    pub shared_cache_multiplier: f64,
    /// Softmax temperature.
    pub temperature: f64,
    /// Shared prefixes of in-flight requests count once per worker.
    pub assume_kv_reuse: bool,
    /// Prompt tokens count as prefill load until the first token.
    pub track_prefill_tokens: bool,
    /// In-flight blocks count as decode load.
    pub track_active_blocks: bool,
}

/// An AIConfigurator performance-model specification (used by the `aic` prefill load
/// model). Only validated and carried; the model itself is not part of this project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AicPerfConfig {
    /// Inference backend name (e.g. `vllm`).
    pub aic_backend: String,
    /// Hardware system name (e.g. `h200_sxm`).
    pub aic_system: String,
    /// Model path or id.
    pub aic_model_path: String,
    /// Tensor-parallel size (>= 1).
    pub aic_tp_size: u32,
    /// Backend version.
    pub aic_backend_version: Option<String>,
    /// MoE tensor-parallel size (>= 1 when set).
    pub aic_moe_tp_size: Option<u32>,
    /// MoE expert-parallel size (>= 1 when set).
    pub aic_moe_ep_size: Option<u32>,
    /// Attention data-parallel size (>= 1 when set).
    pub aic_attention_dp_size: Option<u32>,
    /// Speculative next-n tokens (1..=5 when set).
    pub aic_nextn: Option<u32>,
    /// Acceptance rates of the speculative tokens.
    pub aic_nextn_accept_rates: Option<String>,
    /// GEMM data type.
    pub aic_gemm_dtype: Option<String>,
    /// MoE data type.
    pub aic_moe_dtype: Option<String>,
    /// Attention data type.
    pub aic_fmha_dtype: Option<String>,
    /// KV-cache data type.
    pub aic_kv_cache_dtype: Option<String>,
    /// Communication data type.
    pub aic_comm_dtype: Option<String>,
}

impl AicPerfConfig {
    /// Check the required strings and the parallelism sizes.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the offending field.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("aic_backend", &self.aic_backend),
            ("aic_system", &self.aic_system),
            ("aic_model_path", &self.aic_model_path),
        ] {
            if value.trim().is_empty() {
                return Err(invalid(field, "must be a non-empty string"));
            }
        }
        if self.aic_tp_size == 0 {
            return Err(invalid("aic_tp_size", "must be >= 1, got 0"));
        }
        for (field, value) in [
            ("aic_moe_tp_size", self.aic_moe_tp_size),
            ("aic_moe_ep_size", self.aic_moe_ep_size),
            ("aic_attention_dp_size", self.aic_attention_dp_size),
        ] {
            if value == Some(0) {
                return Err(invalid(field, "must be >= 1 when set, got 0"));
            }
        }
        if let Some(n) = self.aic_nextn
            && !(1..=5).contains(&n)
        {
            return Err(invalid("aic_nextn", format!("must be in 1..=5, got {n}")));
        }
        Ok(())
    }
}
