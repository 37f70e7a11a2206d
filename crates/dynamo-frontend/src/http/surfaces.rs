//! What the non-generative surfaces (`/v1/embeddings`, `/v1/rerank`, `/v1/classify`,
//! `/v1/pooling`, images, audio, videos) share: finding a model that serves the surface,
//! sending one request to one of its workers and collecting the worker's items.
//!
//! These surfaces are unary: the worker answers with one item (or a few, which the
//! surface folds); the frontend validates, shapes the request, routes it like chat and
//! shapes the response. The worker contracts are in `docs/design/frontend_surfaces.md`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use dynamo_llm::discovery::ModelEntry;
use dynamo_llm::model_card::ModelType;
use dynamo_runtime::Context;

use super::Shared;
use super::engine::{RoutedRequest, decode_item, route_error};
use super::error::HttpError;

/// A non-generative surface: its path (for messages), metrics label and model flag.
#[derive(Debug, Clone, Copy)]
pub(super) struct Surface {
    pub(super) path: &'static str,
    pub(super) label: &'static str,
    pub(super) flag: ModelType,
}

/// A 400 naming the offending field.
pub(super) fn bad(msg: impl Into<String>, param: &str) -> HttpError {
    HttpError::bad_request(msg, Some(param.into()))
}

/// Parse a JSON object body (400 otherwise).
pub(super) fn json_object(
    body: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, HttpError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(HttpError::bad_request(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(HttpError::bad_request(
            format!("invalid JSON body: {e}"),
            None,
        )),
    }
}

/// The required string `model` of a body.
pub(super) fn model_field(
    body: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, HttpError> {
    match body.get("model") {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        None | Some(serde_json::Value::Null) => Err(HttpError::bad_request(
            "missing required parameter: 'model'",
            Some("model".into()),
        )),
        Some(_) => Err(HttpError::bad_request(
            "'model' must be a non-empty string",
            Some("model".into()),
        )),
    }
}

/// The model `name` when it serves `surface`: 404 for an unknown model, and 404 naming the
/// model and the surface for a model registered without it.
pub(super) fn lookup(
    shared: &Shared,
    name: &str,
    surface: Surface,
) -> Result<Arc<ModelEntry>, HttpError> {
    let entry = shared
        .models
        .get(name)
        .ok_or_else(|| HttpError::model_not_found(name))?;
    if entry.card.model_type.contains(surface.flag) {
        Ok(entry)
    } else {
        Err(HttpError {
            status: 404,
            message: format!(
                "The model `{name}` does not support {} (it serves: {}).",
                surface.path, entry.card.model_type
            ),
            param: Some("model".into()),
        })
    }
}

/// Send `value` (MessagePack on the request plane) to one of `entry`'s workers, routed
/// by the frontend's selector; the worker's items as they come.
pub(super) async fn open_worker(
    shared: &Shared,
    entry: &ModelEntry,
    value: &impl serde::Serialize,
) -> Result<dynamo_runtime::transport::client::ResponseStream, HttpError> {
    let body = dynamo_runtime::transport::codec::encode(value)
        .map_err(|e| HttpError::internal(format!("cannot encode the request: {e}")))?;
    // The selector sees the request as an opaque body: these surfaces have no KV prefix
    // worth routing on, and no load to book.
    let route = shared
        .selector
        .select(entry, &entry.client, &RoutedRequest::Text(&body));
    let route = entry
        .restrict_route(route, &[])
        .map_err(HttpError::unavailable)?;
    entry
        .client
        .generate(Bytes::from(body), route, Context::default(), None)
        .await
        .map_err(|e| route_error(&e))
}

/// [`open_worker`], collecting the data of every item the worker answers.
pub(super) async fn call_worker(
    shared: &Shared,
    entry: &ModelEntry,
    value: &impl serde::Serialize,
) -> Result<Vec<serde_json::Value>, HttpError> {
    let mut stream = open_worker(shared, entry, value).await?;
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        let bytes =
            item.map_err(|e| HttpError::internal(format!("stream ended with an error: {e}")))?;
        if let Some(v) = decode_item::<serde_json::Value>(&bytes)? {
            items.push(v);
        }
    }
    if items.is_empty() {
        return Err(HttpError::internal("the worker returned no result"));
    }
    Ok(items)
}

/// Records one request of a surface (count, errors, duration, in-flight gauge).
pub(super) struct Record {
    shared: Arc<Shared>,
    model: String,
    label: &'static str,
    started: Instant,
    inflight: bool,
}

impl Record {
    pub(super) fn new(shared: Arc<Shared>, label: &'static str) -> Self {
        Self {
            shared,
            model: String::new(),
            label,
            started: Instant::now(),
            inflight: false,
        }
    }

    /// The request's model is known and the request goes to a worker.
    pub(super) fn begin(&mut self, model: &str) {
        model.clone_into(&mut self.model);
        self.shared.metrics.inflight(model, 1);
        self.inflight = true;
    }

    /// Answer `result`, recording its outcome.
    pub(super) fn finish(mut self, result: Result<Response, HttpError>) -> Response {
        let m = &self.shared.metrics;
        if self.inflight {
            m.inflight(&self.model, -1);
            self.inflight = false;
            m.finished(&self.model, self.started.elapsed(), None, 0);
        }
        match result {
            Ok(r) => {
                m.request(&self.model, self.label, false, "success");
                r
            }
            Err(e) => {
                m.error(&self.model, e.kind());
                m.request(&self.model, self.label, false, "error");
                e.into_response()
            }
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        // A client that went away drops the handler mid-request.
        if self.inflight {
            self.shared.metrics.inflight(&self.model, -1);
        }
    }
}

/// A non-negative integer field (`None` when absent or null).
pub(super) fn opt_uint(
    body: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<Option<u64>, HttpError> {
    match body.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            HttpError::bad_request(
                format!("'{key}' must be a non-negative integer"),
                Some(key.into()),
            )
        }),
    }
}

/// An optional boolean field.
pub(super) fn opt_bool(
    body: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<Option<bool>, HttpError> {
    match body.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(HttpError::bad_request(
            format!("'{key}' must be a boolean"),
            Some(key.into()),
        )),
    }
}
