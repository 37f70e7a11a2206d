//! `GET /v1/models/{model_id}` and `GET /v1/models/{model_id}/ready`.
//!
//! Model ids may contain `/` (`Qwen/Qwen3-0.6B`), so both are served by one catch-all route
//! (`/v1/models/{*model_id}`, as the reference routes it): the whole rest of the path is
//! tried as a model first, then, when it ends in `/ready`, the part before as a model whose
//! readiness is asked.
//!
//! Reference (ai-dynamo-runtime 1.6.1) bodies: the model is the `/v1/models` list entry
//! (`id`, `object`, `created`, `owned_by`); readiness is `{"model", "ready", "namespaces":
//! {ns: {"ready", "worker_types": {"aggregated": {"workers", "needs": []}}, "present",
//! "missing_worker_types"}}}` (in-process models use the namespace `__local_<surface>_<name>`;
//! ours report `__local`). When not ready we answer 503 with `ready: false` and a `reason`.
//! An unknown model is 404 (the reference's body is `{"message": "Model not found", "type":
//! "Not Found", "code": 404}`; ours is the OpenAI error envelope every other 404 uses).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dynamo_llm::discovery::ModelManager;

use super::{HttpError, Shared, StaticModels};

/// Whether a model can serve, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// The served name.
    pub model: String,
    /// The namespace of its workers (`__local` for an in-process model).
    pub namespace: String,
    /// Live workers (1 for an in-process model).
    pub workers: usize,
}

impl Readiness {
    /// Whether a live worker serves it.
    pub fn ready(&self) -> bool {
        self.workers > 0
    }

    fn body(&self) -> serde_json::Value {
        let ready = self.ready();
        let mut ns = serde_json::json!({
            "ready": ready,
            "worker_types": {"aggregated": {"workers": self.workers, "needs": []}},
            "present": if ready { vec!["aggregated"] } else { vec![] },
            "missing_worker_types": if ready { vec![] } else { vec!["aggregated"] },
        });
        let mut body = serde_json::json!({"model": self.model, "ready": ready});
        if !ready {
            let reason = format!(
                "no live worker serves model '{}' (its workers in namespace '{}' are gone)",
                self.model, self.namespace
            );
            ns["reason"] = reason.clone().into();
            body["reason"] = reason.into();
        }
        body["namespaces"] = serde_json::json!({ self.namespace.clone(): ns });
        body
    }
}

/// Model lookups shared by the routes and [`super::extensions::ExtensionContext`].
#[derive(Clone)]
pub(crate) struct ModelView {
    pub(crate) models: ModelManager,
    pub(crate) statics: StaticModels,
}

impl ModelView {
    /// Every served name with its creation time (in-process models shadow discovered ones
    /// of the same name, as in `/v1/models`).
    pub(crate) fn names(&self) -> BTreeMap<String, u64> {
        let mut names = self.statics.names();
        for m in self.models.list() {
            names.entry(m.name.clone()).or_insert(m.created);
        }
        names
    }

    /// `model`'s readiness; `None` when it is not served at all.
    pub(crate) fn readiness(&self, model: &str) -> Option<Readiness> {
        if self.statics.names().contains_key(model) {
            return Some(Readiness {
                model: model.to_owned(),
                namespace: "__local".into(),
                workers: 1,
            });
        }
        let entry = self.models.get(model)?;
        Some(Readiness {
            model: entry.name.clone(),
            namespace: entry.endpoint.namespace.clone(),
            workers: entry.serving_instances().len(),
        })
    }

    fn card(&self, model: &str) -> Option<serde_json::Value> {
        let (created, parent) = match self.statics.names().get(model) {
            Some(c) => (*c, None),
            None => {
                let m = self.models.get(model)?;
                (m.created, m.parent())
            }
        };
        let mut card = serde_json::json!({
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "nvidia",
        });
        // A LoRA adapter names its base model, as in `/v1/models`.
        if let Some(p) = parent {
            card["parent"] = p.into();
        }
        Some(card)
    }
}

/// `GET /v1/models/{*model_id}`.
pub(super) async fn model_route(
    State(shared): State<Arc<Shared>>,
    Path(model_id): Path<String>,
) -> Response {
    let view = shared.view();
    if let Some(card) = view.card(&model_id) {
        return super::respond::json_response(&card);
    }
    if let Some(model) = model_id.strip_suffix("/ready")
        && let Some(r) = view.readiness(model)
    {
        let status = if r.ready() {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        return super::json_status(status, &r.body());
    }
    let model = model_id.strip_suffix("/ready").unwrap_or(&model_id);
    HttpError::model_not_found(model).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_body_says_why() {
        let gone = Readiness {
            model: "m".into(),
            namespace: "ns".into(),
            workers: 0,
        };
        let body = gone.body();
        assert_eq!(body["ready"], false);
        assert!(
            body["reason"]
                .as_str()
                .is_some_and(|r| r.contains("no live worker"))
        );
        assert_eq!(
            body["namespaces"]["ns"]["missing_worker_types"][0],
            "aggregated"
        );
        let up = Readiness { workers: 2, ..gone };
        let body = up.body();
        assert_eq!(body["ready"], true);
        assert!(body.get("reason").is_none());
        assert_eq!(
            body["namespaces"]["ns"]["worker_types"]["aggregated"]["workers"],
            2
        );
    }
}
