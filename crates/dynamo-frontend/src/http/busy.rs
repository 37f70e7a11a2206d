//! `GET /busy_threshold` and `POST /busy_threshold`: the per-model busy thresholds of the
//! KV router ([`LoadThresholds`]), readable and changeable while the frontend serves.
//!
//! The frontend flags give every model the same starting thresholds; a `POST` overrides
//! them for one discovered model. The KV selector reads [`BusyThresholds::get`] for every
//! request, so a change applies to the next request (see
//! [`super::kv_selector::KvSelector`]).
//!
//! Body shapes are the reference's (ai-dynamo-runtime 1.6.1):
//! * `GET` → `{"thresholds": [{"model", "active_decode_blocks_threshold",
//!   "active_prefill_tokens_threshold", "active_prefill_tokens_threshold_frac"}, ...]}`
//!   for every discovered model (in-process models are not listed);
//! * `POST {"model": ..., <any of the three>}` → that model's thresholds after the change.
//!   Absent or `null` fields keep their value (there is no way to clear one), unknown fields
//!   are ignored; a body with only `model` reads the current values;
//! * errors are `{"error": "..."}`: 404 for a model that is not discovered, 400 for a value
//!   out of range, a wrong type, a missing `model` or a body that is not JSON (the
//!   reference answers 422 for the last three: axum's `Json` rejection).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use serde::{Deserialize, Serialize};

use super::Shared;

/// The thresholds in force, per model.
#[derive(Debug, Default)]
pub struct BusyThresholds {
    /// From the frontend flags; a model without an override uses them.
    default: LoadThresholds,
    overrides: Mutex<HashMap<String, LoadThresholds>>,
}

/// A `POST /busy_threshold` body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ThresholdUpdate {
    /// The model whose thresholds change.
    pub model: String,
    /// New `active_decode_blocks_threshold` (fraction in `[0, 1]`).
    #[serde(default)]
    pub active_decode_blocks_threshold: Option<f64>,
    /// New `active_prefill_tokens_threshold` (tokens).
    #[serde(default)]
    pub active_prefill_tokens_threshold: Option<u64>,
    /// New `active_prefill_tokens_threshold_frac` (finite, `>= 0`).
    #[serde(default)]
    pub active_prefill_tokens_threshold_frac: Option<f64>,
}

/// One model's thresholds as the API shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelThresholds {
    /// The model.
    pub model: String,
    /// See [`LoadThresholds`].
    pub active_decode_blocks_threshold: Option<f64>,
    /// See [`LoadThresholds`].
    pub active_prefill_tokens_threshold: Option<u64>,
    /// See [`LoadThresholds`].
    pub active_prefill_tokens_threshold_frac: Option<f64>,
}

impl ModelThresholds {
    fn new(model: &str, t: LoadThresholds) -> Self {
        Self {
            model: model.to_owned(),
            active_decode_blocks_threshold: t.active_decode_blocks_threshold,
            active_prefill_tokens_threshold: t.active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac: t.active_prefill_tokens_threshold_frac,
        }
    }
}

impl BusyThresholds {
    /// Every model starts with `default`.
    pub fn new(default: LoadThresholds) -> Arc<Self> {
        Arc::new(Self {
            default,
            overrides: Mutex::new(HashMap::new()),
        })
    }

    /// The thresholds in force for `model`.
    pub fn get(&self, model: &str) -> LoadThresholds {
        self.lock().get(model).copied().unwrap_or(self.default)
    }

    /// Merge `update` into its model's thresholds (absent fields keep their value) and
    /// return the result.
    ///
    /// # Errors
    /// A message naming the field when a value is out of range; nothing changes then.
    pub fn update(&self, update: &ThresholdUpdate) -> Result<LoadThresholds, String> {
        if let Some(t) = update.active_decode_blocks_threshold
            && !(0.0..=1.0).contains(&t)
        {
            return Err(format!(
                "active_decode_blocks_threshold must be between 0.0 and 1.0, got {t}"
            ));
        }
        if let Some(t) = update.active_prefill_tokens_threshold_frac
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(format!(
                "active_prefill_tokens_threshold_frac must be a finite value greater than or equal to 0.0, got {t}"
            ));
        }
        let mut overrides = self.lock();
        let mut t = overrides
            .get(&update.model)
            .copied()
            .unwrap_or(self.default);
        if let Some(v) = update.active_decode_blocks_threshold {
            t.active_decode_blocks_threshold = Some(v);
        }
        if let Some(v) = update.active_prefill_tokens_threshold {
            t.active_prefill_tokens_threshold = Some(v);
        }
        if let Some(v) = update.active_prefill_tokens_threshold_frac {
            t.active_prefill_tokens_threshold_frac = Some(v);
        }
        t.validate().map_err(|e| e.to_string())?;
        overrides.insert(update.model.clone(), t);
        Ok(t)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, LoadThresholds>> {
        self.overrides
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    super::json_status(status, &serde_json::json!({"error": message.into()}))
}

/// `GET /busy_threshold`.
pub(super) async fn get_busy_thresholds(State(shared): State<Arc<Shared>>) -> Response {
    let thresholds: Vec<ModelThresholds> = shared
        .models
        .list()
        .iter()
        .map(|m| ModelThresholds::new(&m.name, shared.busy.get(&m.name)))
        .collect();
    super::respond::json_response(&serde_json::json!({ "thresholds": thresholds }))
}

/// `POST /busy_threshold`.
pub(super) async fn set_busy_threshold(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // The same media-type check, size limit and read deadline as the OpenAI routes.
    let body = match super::request_body::read(
        &headers,
        body,
        shared.body_limit,
        shared.body_read_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let update: ThresholdUpdate = match serde_json::from_slice(&body) {
        Ok(u) => u,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid request body: {e}"),
            );
        }
    };
    let Some(entry) = shared.models.get(&update.model) else {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "Model '{}' not found. Thresholds can only be set for discovered models.",
                update.model
            ),
        );
    };
    // An alias sets the thresholds of the model it names.
    let update = ThresholdUpdate {
        model: entry.name.clone(),
        ..update
    };
    match shared.busy.update(&update) {
        Ok(t) => super::respond::json_response(&ModelThresholds::new(&update.model, t)),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(model: &str) -> ThresholdUpdate {
        ThresholdUpdate {
            model: model.into(),
            ..Default::default()
        }
    }

    #[test]
    fn updates_merge_per_model_and_bad_values_change_nothing() {
        let start = LoadThresholds {
            active_prefill_tokens_threshold: Some(7),
            ..Default::default()
        };
        let busy = BusyThresholds::new(start);
        let t = busy
            .update(&ThresholdUpdate {
                active_decode_blocks_threshold: Some(0.5),
                ..update("a")
            })
            .expect("valid");
        assert_eq!(t.active_decode_blocks_threshold, Some(0.5));
        assert_eq!(
            t.active_prefill_tokens_threshold,
            Some(7),
            "flag value kept"
        );
        assert_eq!(busy.get("b"), start, "other models keep the flags' values");
        let e = busy
            .update(&ThresholdUpdate {
                active_decode_blocks_threshold: Some(1.5),
                active_prefill_tokens_threshold: Some(1),
                ..update("a")
            })
            .expect_err("out of range");
        assert_eq!(
            e,
            "active_decode_blocks_threshold must be between 0.0 and 1.0, got 1.5"
        );
        let e = busy
            .update(&ThresholdUpdate {
                active_prefill_tokens_threshold_frac: Some(-1.0),
                ..update("a")
            })
            .expect_err("negative");
        assert!(e.starts_with("active_prefill_tokens_threshold_frac must be a finite value"));
        assert_eq!(busy.get("a"), t, "a refused update changes nothing");
        // A body with only the model reads the values.
        assert_eq!(busy.update(&update("a")).expect("read"), t);
    }
}
