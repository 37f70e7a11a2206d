//! Router configuration classes: `KvRouterConfig`, `RouterConfig`, `RouterMode`,
//! `RoutingConstraints`, `AicPerfConfig`.
//!
//! The configuration types, their defaults and their validation live in
//! `dynamo_kv_router::scheduling`; these classes convert arguments and delegate.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use dynamo_kv_router::scheduling::config::{self, KvRouterConfig};
use dynamo_kv_router::scheduling::selector::{self, LoadThresholds};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors;

/// Parse a configuration enum from its string form.
fn parse<T: std::str::FromStr<Err = dynamo_kv_router::Error>>(s: &str) -> PyResult<T> {
    s.parse().map_err(errors::kv_router_error)
}

/// Configuration of the KV-aware router.
#[pyclass(name = "KvRouterConfig", module = "dynamo._core", from_py_object)]
#[derive(Clone)]
pub(crate) struct PyKvRouterConfig {
    pub(crate) inner: KvRouterConfig,
}

impl PyKvRouterConfig {
    fn validated(inner: KvRouterConfig) -> PyResult<Self> {
        inner.validate().map_err(errors::kv_router_error)?;
        Ok(Self { inner })
    }

    fn update(&mut self, f: impl FnOnce(&mut KvRouterConfig)) -> PyResult<()> {
        let mut next = self.inner.clone();
        f(&mut next);
        next.validate().map_err(errors::kv_router_error)?;
        self.inner = next;
        Ok(())
    }
}

#[pymethods]
impl PyKvRouterConfig {
    // The defaults below are the Rust `KvRouterConfig::default()` values;
    // tests/test_router_config.py checks they agree with `from_json("{}")`.
    #[new]
    #[pyo3(signature = (
        overlap_score_weight=None,
        host_cache_hit_weight=0.75,
        disk_cache_hit_weight=0.25,
        router_temperature=0.0,
        use_kv_events=true,
        *,
        router_replica_sync=false,
        router_track_active_blocks=true,
        router_track_output_blocks=false,
        router_assume_kv_reuse=true,
        router_track_prefill_tokens=true,
        router_tracking_hash="public-xxh3-v1",
        router_tracking_key_file=None,
        router_tracking_key_id=None,
        router_prefill_load_model="none",
        router_ttl_secs=120.0,
        router_queue_threshold=None,
        router_event_threads=4,
        router_queue_policy="fcfs",
        use_remote_indexer=false,
        serve_indexer=false,
        shared_cache_multiplier=0.0,
        shared_cache_type="none",
        router_predicted_ttl_secs=None,
        overlap_score_credit=1.0,
        overlap_score_credit_decay=0.0,
        prefill_load_scale=1.0,
        decode_active_request_weight=0.0,
        router_policy_config=None,
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors the documented Python constructor"
    )]
    fn new(
        overlap_score_weight: Option<f64>,
        host_cache_hit_weight: f64,
        disk_cache_hit_weight: f64,
        router_temperature: f64,
        use_kv_events: bool,
        router_replica_sync: bool,
        router_track_active_blocks: bool,
        router_track_output_blocks: bool,
        router_assume_kv_reuse: bool,
        router_track_prefill_tokens: bool,
        router_tracking_hash: &str,
        router_tracking_key_file: Option<String>,
        router_tracking_key_id: Option<String>,
        router_prefill_load_model: &str,
        router_ttl_secs: f64,
        router_queue_threshold: Option<f64>,
        router_event_threads: u32,
        router_queue_policy: &str,
        use_remote_indexer: bool,
        serve_indexer: bool,
        shared_cache_multiplier: f64,
        shared_cache_type: &str,
        router_predicted_ttl_secs: Option<f64>,
        overlap_score_credit: f64,
        overlap_score_credit_decay: f64,
        prefill_load_scale: f64,
        decode_active_request_weight: f64,
        router_policy_config: Option<String>,
    ) -> PyResult<Self> {
        let mut inner = KvRouterConfig {
            overlap_score_credit,
            overlap_score_credit_decay,
            prefill_load_scale,
            decode_active_request_weight,
            host_cache_hit_weight,
            disk_cache_hit_weight,
            router_temperature,
            use_kv_events,
            router_replica_sync,
            router_track_active_blocks,
            router_track_output_blocks,
            router_assume_kv_reuse,
            router_track_prefill_tokens,
            router_tracking_hash: parse(router_tracking_hash)?,
            router_tracking_key_file,
            router_tracking_key_id,
            router_prefill_load_model: parse(router_prefill_load_model)?,
            router_ttl_secs,
            router_queue_threshold,
            router_event_threads,
            router_queue_policy: parse(router_queue_policy)?,
            use_remote_indexer,
            serve_indexer,
            shared_cache_multiplier,
            shared_cache_type: parse(shared_cache_type)?,
            router_predicted_ttl_secs,
            router_policy_config,
        };
        if let Some(w) = overlap_score_weight {
            inner.apply_overlap_score_weight(w);
        }
        Self::validated(inner)
    }

    /// Parse a JSON object; missing fields take their defaults.
    #[staticmethod]
    #[pyo3(signature = (config_json))]
    fn from_json(config_json: &str) -> PyResult<Self> {
        KvRouterConfig::from_json(config_json)
            .map(|inner| Self { inner })
            .map_err(errors::kv_router_error)
    }

    /// An independent copy.
    #[pyo3(signature = ())]
    fn copy(&self) -> Self {
        self.clone()
    }

    /// A validated copy with some cost parameters replaced.
    #[pyo3(signature = (
        overlap_score_weight=None,
        *,
        overlap_score_credit=None,
        overlap_score_credit_decay=None,
        prefill_load_scale=None,
        decode_active_request_weight=None,
    ))]
    fn with_overrides(
        &self,
        overlap_score_weight: Option<f64>,
        overlap_score_credit: Option<f64>,
        overlap_score_credit_decay: Option<f64>,
        prefill_load_scale: Option<f64>,
        decode_active_request_weight: Option<f64>,
    ) -> PyResult<Self> {
        let mut next = self.clone();
        next.update(|c| {
            if let Some(w) = overlap_score_weight {
                c.apply_overlap_score_weight(w);
            }
            c.overlap_score_credit = overlap_score_credit.unwrap_or(c.overlap_score_credit);
            c.overlap_score_credit_decay =
                overlap_score_credit_decay.unwrap_or(c.overlap_score_credit_decay);
            c.prefill_load_scale = prefill_load_scale.unwrap_or(c.prefill_load_scale);
            c.decode_active_request_weight =
                decode_active_request_weight.unwrap_or(c.decode_active_request_weight);
        })?;
        Ok(next)
    }

    #[getter]
    fn overlap_score_credit(&self) -> f64 {
        self.inner.overlap_score_credit
    }

    #[setter]
    fn set_overlap_score_credit(&mut self, value: f64) -> PyResult<()> {
        self.update(|c| c.overlap_score_credit = value)
    }

    #[getter]
    fn overlap_score_credit_decay(&self) -> f64 {
        self.inner.overlap_score_credit_decay
    }

    #[setter]
    fn set_overlap_score_credit_decay(&mut self, value: f64) -> PyResult<()> {
        self.update(|c| c.overlap_score_credit_decay = value)
    }

    /// Deprecated alias of `prefill_load_scale` (setting 0 also zeroes the overlap credit).
    #[getter]
    fn overlap_score_weight(&self) -> f64 {
        self.inner.prefill_load_scale
    }

    #[setter]
    fn set_overlap_score_weight(&mut self, value: f64) -> PyResult<()> {
        self.update(|c| c.apply_overlap_score_weight(value))
    }

    #[getter]
    fn prefill_load_scale(&self) -> f64 {
        self.inner.prefill_load_scale
    }

    #[setter]
    fn set_prefill_load_scale(&mut self, value: f64) -> PyResult<()> {
        self.update(|c| c.prefill_load_scale = value)
    }

    #[getter]
    fn decode_active_request_weight(&self) -> f64 {
        self.inner.decode_active_request_weight
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.inner == other.inner
    }

    fn __repr__(&self) -> String {
        let json = serde_json::to_string(&self.inner).unwrap_or_else(|e| e.to_string());
        format!("KvRouterConfig({json})")
    }
}

/// How a client picks a worker instance.
#[pyclass(
    name = "RouterMode",
    module = "dynamo._core",
    eq,
    eq_int,
    frozen,
    hash,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum PyRouterMode {
    RoundRobin,
    Random,
    PowerOfTwoChoices,
    #[pyo3(name = "KV")]
    Kv,
    Direct,
    LeastLoaded,
    DeviceAwareWeighted,
}

#[pymethods]
impl PyRouterMode {
    fn __repr__(&self) -> String {
        format!("RouterMode.{self:?}").replace("Kv", "KV")
    }
}

/// Routing mode, KV router configuration and busy thresholds of a client.
#[pyclass(name = "RouterConfig", module = "dynamo._core", from_py_object)]
#[derive(Clone)]
pub(crate) struct PyRouterConfig {
    #[pyo3(get, set)]
    router_mode: PyRouterMode,
    #[pyo3(get, set)]
    pub(crate) kv_router_config: PyKvRouterConfig,
    pub(crate) thresholds: LoadThresholds,
    #[expect(
        dead_code,
        reason = "read by the KV router once session affinity lands"
    )]
    pub(crate) session_affinity_ttl_secs: Option<u64>,
}

#[pymethods]
impl PyRouterConfig {
    #[new]
    #[pyo3(signature = (
        mode,
        config=None,
        active_decode_blocks_threshold=None,
        active_prefill_tokens_threshold=None,
        active_prefill_tokens_threshold_frac=None,
        enforce_disagg=false,
        session_affinity_ttl_secs=None,
    ))]
    fn new(
        mode: PyRouterMode,
        config: Option<PyKvRouterConfig>,
        active_decode_blocks_threshold: Option<f64>,
        active_prefill_tokens_threshold: Option<u64>,
        active_prefill_tokens_threshold_frac: Option<f64>,
        enforce_disagg: bool,
        session_affinity_ttl_secs: Option<u64>,
    ) -> PyResult<Self> {
        // Deprecated and ignored, as in the reference.
        let _ = enforce_disagg;
        let thresholds = LoadThresholds {
            active_decode_blocks_threshold,
            active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac,
        };
        thresholds.validate().map_err(errors::kv_router_error)?;
        Ok(Self {
            router_mode: mode,
            kv_router_config: config.unwrap_or_else(|| PyKvRouterConfig {
                inner: KvRouterConfig::default(),
            }),
            thresholds,
            session_affinity_ttl_secs,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "RouterConfig(mode={}, thresholds={:?})",
            self.router_mode.__repr__(),
            self.thresholds
        )
    }
}

/// Hard (required) and soft (preferred) taint constraints of a request.
#[pyclass(name = "RoutingConstraints", module = "dynamo._core", from_py_object)]
#[derive(Clone, Default)]
pub(crate) struct PyRoutingConstraints {
    pub(crate) inner: selector::RoutingConstraints,
}

#[pymethods]
impl PyRoutingConstraints {
    #[new]
    #[pyo3(signature = (required_taints=None, preferred_taints=None))]
    fn new(
        required_taints: Option<HashSet<String>>,
        preferred_taints: Option<HashMap<String, f64>>,
    ) -> PyResult<Self> {
        let mut c = Self::default();
        c.set_required_taints(required_taints.unwrap_or_default());
        c.set_preferred_taints(preferred_taints.unwrap_or_default())?;
        Ok(c)
    }

    #[getter]
    fn required_taints(&self) -> HashSet<String> {
        self.inner.required_taints.iter().cloned().collect()
    }

    #[setter]
    fn set_required_taints(&mut self, value: HashSet<String>) {
        self.inner.required_taints = value.into_iter().collect::<BTreeSet<_>>();
    }

    #[getter]
    fn preferred_taints(&self) -> HashMap<String, f64> {
        self.inner
            .preferred_taints
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    #[setter]
    fn set_preferred_taints(&mut self, value: HashMap<String, f64>) -> PyResult<()> {
        if let Some((taint, w)) = value.iter().find(|(_, w)| !w.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "preferred_taints[{taint:?}] must be finite, got {w}"
            )));
        }
        self.inner.preferred_taints = value.into_iter().collect::<BTreeMap<_, _>>();
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "RoutingConstraints(required_taints={:?}, preferred_taints={:?})",
            self.inner.required_taints, self.inner.preferred_taints
        )
    }
}

/// An AIConfigurator performance-model specification for prefill-load estimation.
#[pyclass(name = "AicPerfConfig", module = "dynamo._core", from_py_object)]
#[derive(Clone)]
pub(crate) struct PyAicPerfConfig {
    pub(crate) inner: config::AicPerfConfig,
}

#[pymethods]
impl PyAicPerfConfig {
    #[new]
    #[pyo3(signature = (
        aic_backend,
        aic_system,
        aic_model_path,
        aic_tp_size=1,
        aic_backend_version=None,
        aic_moe_tp_size=None,
        aic_moe_ep_size=None,
        aic_attention_dp_size=None,
        aic_nextn=None,
        aic_nextn_accept_rates=None,
        aic_gemm_dtype=None,
        aic_moe_dtype=None,
        aic_fmha_dtype=None,
        aic_kv_cache_dtype=None,
        aic_comm_dtype=None,
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "mirrors the documented Python constructor"
    )]
    fn new(
        aic_backend: String,
        aic_system: String,
        aic_model_path: String,
        aic_tp_size: u32,
        aic_backend_version: Option<String>,
        aic_moe_tp_size: Option<u32>,
        aic_moe_ep_size: Option<u32>,
        aic_attention_dp_size: Option<u32>,
        aic_nextn: Option<u32>,
        aic_nextn_accept_rates: Option<String>,
        aic_gemm_dtype: Option<String>,
        aic_moe_dtype: Option<String>,
        aic_fmha_dtype: Option<String>,
        aic_kv_cache_dtype: Option<String>,
        aic_comm_dtype: Option<String>,
    ) -> PyResult<Self> {
        let inner = config::AicPerfConfig {
            aic_backend,
            aic_system,
            aic_model_path,
            aic_tp_size,
            aic_backend_version,
            aic_moe_tp_size,
            aic_moe_ep_size,
            aic_attention_dp_size,
            aic_nextn,
            aic_nextn_accept_rates,
            aic_gemm_dtype,
            aic_moe_dtype,
            aic_fmha_dtype,
            aic_kv_cache_dtype,
            aic_comm_dtype,
        };
        inner.validate().map_err(errors::kv_router_error)?;
        Ok(Self { inner })
    }

    fn __repr__(&self) -> String {
        format!("AicPerfConfig({:?})", self.inner)
    }
}

/// Register the router configuration classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvRouterConfig>()?;
    m.add_class::<PyRouterMode>()?;
    m.add_class::<PyRouterConfig>()?;
    m.add_class::<PyRoutingConstraints>()?;
    m.add_class::<PyAicPerfConfig>()?;
    Ok(())
}
