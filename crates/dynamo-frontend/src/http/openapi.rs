//! The frontend's route table and the OpenAPI 3.1 document generated from it
//! (`GET /openapi.json`).
//!
//! Every route is one [`ApiRoute`] in [`routes`]: the same entry registers the axum handler
//! ([`register`]) and describes the route in the document ([`document`]), so the two cannot
//! drift. A request body's schema comes from its Rust type: [`ApiRoute::json_body`] asks the
//! type's own `serde::Deserialize` implementation for its field names (serde hands them to
//! `Deserializer::deserialize_struct`), so a field added to a request struct shows up in the
//! document without anyone editing it. (A derive such as `schemars` would give field types
//! too, but would pull a proc-macro crate into the build and need a derive on every nested
//! request type; names, required-ness aside, are what drift in practice.)

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::response::Response;
use axum::routing::{MethodFilter, MethodRouter, on};
use dynamo_llm::preprocessor::openai::{ChatCompletionRequest, CompletionRequest};
use serde::de::{DeserializeOwned, Visitor};
use serde_json::{Map, Value, json};

use super::Shared;
use super::openai_routes;
use super::realtime;
use super::respond;
use super::{anthropic, responses};
use super::{busy, embeddings, media, models, rerank};

/// What a route returns on success (its OpenAPI `200` content types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Produces {
    /// One JSON document.
    Json,
    /// JSON, or server-sent events when the request asks to stream.
    JsonOrEventStream,
    /// Plain text (Prometheus exposition).
    Text,
    /// A WebSocket upgrade (`101 Switching Protocols`).
    WebSocket,
    /// Encoded audio bytes (the worker's format, e.g. `audio/wav`).
    Audio,
    /// Server-sent events only.
    EventStream,
}

/// One route of the frontend: how it is served and how it is documented.
pub(super) struct ApiRoute {
    /// HTTP method.
    pub(super) method: Method,
    /// Path in axum's syntax (`{param}`, `{*rest}`); the document writes `{*rest}` as
    /// `{rest}`.
    pub(super) path: &'static str,
    /// One line for the document.
    pub(super) summary: &'static str,
    /// JSON schema of the request body, when it has one.
    pub(super) body: Option<Value>,
    /// Success content.
    pub(super) produces: Produces,
    /// The handler, already bound to `method`.
    pub(super) handler: MethodRouter<Arc<Shared>>,
}

impl ApiRoute {
    /// A route answering `method` on `path` with `handler`.
    pub(super) fn new<H, T>(
        method: Method,
        path: &'static str,
        summary: &'static str,
        produces: Produces,
        handler: H,
    ) -> Self
    where
        H: Handler<T, Arc<Shared>>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).unwrap_or(MethodFilter::GET);
        Self {
            method,
            path,
            summary,
            body: None,
            produces,
            handler: on(filter, handler),
        }
    }

    /// `GET path`.
    pub(super) fn get<H, T>(
        path: &'static str,
        summary: &'static str,
        produces: Produces,
        handler: H,
    ) -> Self
    where
        H: Handler<T, Arc<Shared>>,
        T: 'static,
    {
        Self::new(Method::GET, path, summary, produces, handler)
    }

    /// `POST path`.
    pub(super) fn post<H, T>(
        path: &'static str,
        summary: &'static str,
        produces: Produces,
        handler: H,
    ) -> Self
    where
        H: Handler<T, Arc<Shared>>,
        T: 'static,
    {
        Self::new(Method::POST, path, summary, produces, handler)
    }

    /// The request body is a JSON `T` (its schema is derived from `T`'s serde impl).
    pub(super) fn json_body<T: DeserializeOwned>(mut self) -> Self {
        self.body = Some(schema_of::<T>());
        self
    }
}

/// Every route of the frontend.
///
/// To add a route, add one line here, e.g.
/// `ApiRoute::post("/v1/embeddings", "Create embeddings", Produces::Json, my_routes::embeddings).json_body::<EmbeddingRequest>(),`
/// (`ApiRoute::get` for GET, `ApiRoute::new(Method::DELETE, ...)` for other methods;
/// `{id}` / `{*id}` path parameters in axum's syntax; `.json_body::<T>()` when the body is a
/// serde type). Do not call `Router::route` in
/// `mod.rs`: the test `every_route_is_documented_and_every_documented_route_answers` fails
/// for routes registered outside this table.
pub(super) fn routes() -> Vec<ApiRoute> {
    use Produces::{Audio, EventStream, Json, JsonOrEventStream, Text, WebSocket};
    vec![
        ApiRoute::post(
            "/v1/chat/completions",
            "Create a chat completion (OpenAI)",
            JsonOrEventStream,
            openai_routes::chat_completions,
        )
        .json_body::<ChatCompletionRequest>(),
        ApiRoute::post(
            "/v1/completions",
            "Create a text completion (OpenAI)",
            JsonOrEventStream,
            openai_routes::completions,
        )
        .json_body::<CompletionRequest>(),
        ApiRoute::post(
            "/v1/embeddings",
            "Create embeddings (OpenAI)",
            Json,
            embeddings::embeddings,
        ),
        ApiRoute::post(
            "/v1/rerank",
            "Rerank documents against a query (Cohere/Jina style)",
            Json,
            rerank::rerank,
        ),
        ApiRoute::post("/v1/classify", "Classify inputs", Json, rerank::classify),
        ApiRoute::post(
            "/v1/pooling",
            "Pooled hidden states of inputs",
            Json,
            rerank::pooling,
        ),
        ApiRoute::post(
            "/v1/images/generations",
            "Generate images (OpenAI)",
            Json,
            media::images,
        ),
        ApiRoute::post(
            "/v1/images/edits",
            "Edit images (OpenAI, multipart/form-data)",
            Json,
            media::image_edits,
        ),
        ApiRoute::post(
            "/v1/audio/speech",
            "Text to speech (OpenAI)",
            Audio,
            media::speech,
        ),
        ApiRoute::post("/v1/videos", "Generate a video", Json, media::videos),
        ApiRoute::post(
            "/v1/videos/stream",
            "Generate a video, streamed as server-sent events",
            EventStream,
            media::videos_stream,
        ),
        ApiRoute::get(
            "/v1/models",
            "List the served models",
            Json,
            openai_routes::list_models,
        ),
        ApiRoute::get(
            "/v1/models/{*model_id}",
            "A served model, or `{model_id}/ready`: 200 when a live worker serves it, else 503",
            Json,
            models::model_route,
        ),
        ApiRoute::get(
            "/busy_threshold",
            "The per-model busy thresholds of the KV router",
            Json,
            busy::get_busy_thresholds,
        ),
        ApiRoute::post(
            "/busy_threshold",
            "Change a model's busy thresholds (from the next request on)",
            Json,
            busy::set_busy_threshold,
        )
        .json_body::<busy::ThresholdUpdate>(),
        ApiRoute::get(
            "/health",
            "Health: live endpoints, instances and models",
            Json,
            openai_routes::health,
        ),
        ApiRoute::get("/live", "Liveness", Json, openai_routes::live),
        ApiRoute::get(
            "/metrics",
            "Prometheus metrics",
            Text,
            openai_routes::metrics,
        ),
        ApiRoute::get(
            "/v1/realtime",
            "OpenAI Realtime text events over a WebSocket (`?model=`)",
            WebSocket,
            realtime::realtime,
        ),
        ApiRoute::get("/openapi.json", "This document", Json, openapi_json),
        ApiRoute::post(
            "/v1/responses",
            "Create a model response (OpenAI Responses API; nothing is stored)",
            JsonOrEventStream,
            responses::responses,
        ),
        ApiRoute::post(
            "/v1/responses/input_tokens",
            "Count the input tokens of a Responses request",
            Json,
            responses::input_tokens,
        ),
    ]
}

/// The opt-in routes of the Anthropic Messages API (`enable_anthropic_api`).
pub(super) fn anthropic_routes() -> Vec<ApiRoute> {
    vec![
        ApiRoute::post(
            "/v1/messages",
            "Create a message (Anthropic Messages API; errors in Anthropic's envelope)",
            Produces::JsonOrEventStream,
            anthropic::messages,
        ),
        ApiRoute::post(
            "/v1/messages/count_tokens",
            "Count the input tokens of an Anthropic Messages request",
            Produces::Json,
            anthropic::count_tokens,
        ),
    ]
}

/// Every route of a frontend: [`routes`], and [`anthropic_routes`] when `anthropic`.
pub(super) fn routes_with(anthropic: bool) -> Vec<ApiRoute> {
    let mut table = routes();
    if anthropic {
        table.extend(anthropic_routes());
    }
    table
}

/// Register every route of `table` on `router`.
pub(super) fn register(router: Router<Arc<Shared>>, table: Vec<ApiRoute>) -> Router<Arc<Shared>> {
    table
        .into_iter()
        .fold(router, |router, r| router.route(r.path, r.handler))
}

async fn openapi_json(axum::extract::State(shared): axum::extract::State<Arc<Shared>>) -> Response {
    // One document per route set (the Anthropic routes are opt-in).
    static DOCS: [OnceLock<Value>; 2] = [OnceLock::new(), OnceLock::new()];
    let anthropic = shared.anthropic_api;
    let doc = DOCS[usize::from(anthropic)].get_or_init(|| document(&routes_with(anthropic)));
    respond::json_response(doc)
}

/// `{*rest}` (axum's catch-all) is `{rest}` in OpenAPI.
fn openapi_path(path: &str) -> String {
    path.replace("{*", "{")
}

/// The names of a path's parameters.
fn path_params(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
        .map(|p| p.trim_start_matches('*'))
        .collect()
}

/// The OpenAPI 3.1 document of `table`.
pub(super) fn document(table: &[ApiRoute]) -> Value {
    let mut paths = Map::new();
    for r in table {
        let mut op = Map::new();
        op.insert("summary".into(), r.summary.into());
        let op_id = format!(
            "{}{}",
            r.method.as_str().to_ascii_lowercase(),
            openapi_path(r.path).replace(['/', '{', '}', '.', '-'], "_")
        );
        op.insert("operationId".into(), op_id.into());
        let params: Vec<Value> = path_params(r.path)
            .into_iter()
            .map(|name| {
                json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}})
            })
            .collect();
        if !params.is_empty() {
            op.insert("parameters".into(), params.into());
        }
        if let Some(schema) = &r.body {
            op.insert(
                "requestBody".into(),
                json!({"required": true, "content": {"application/json": {"schema": schema}}}),
            );
        }
        let ok = match r.produces {
            Produces::Json => {
                json!({"200": {"description": "OK", "content": {"application/json": {}}}})
            }
            Produces::JsonOrEventStream => json!({"200": {
                "description": "OK: one JSON response, or server-sent events when `stream` is true",
                "content": {"application/json": {}, "text/event-stream": {}}}}),
            Produces::Text => json!({"200": {"description": "OK", "content": {"text/plain": {}}}}),
            Produces::WebSocket => {
                json!({"101": {"description": "Switching Protocols (WebSocket)"}})
            }
            Produces::Audio => json!({"200": {"description": "OK", "content": {"audio/*": {}}}}),
            Produces::EventStream => {
                json!({"200": {"description": "OK", "content": {"text/event-stream": {}}}})
            }
        };
        let mut responses = ok;
        if let Some(map) = responses.as_object_mut() {
            map.insert(
                "default".into(),
                json!({"description": "Error (OpenAI error envelope)", "content": {"application/json": {"schema": error_schema()}}}),
            );
        }
        op.insert("responses".into(), responses);
        let entry = paths
            .entry(openapi_path(r.path))
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(item) = entry.as_object_mut() {
            item.insert(r.method.as_str().to_ascii_lowercase(), Value::Object(op));
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Dynamo OpenAI-compatible frontend",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "paths": paths,
    })
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"error": {"type": "object", "properties": {
            "message": {"type": "string"}, "type": {"type": "string"}, "code": {}}}},
    })
}

/// The JSON schema of a serde struct `T`: an object with `T`'s field names (and
/// `additionalProperties: false` when `T` rejects unknown fields). A type that is not a
/// plain struct (a map, a flattened struct) is documented as any object.
pub(super) fn schema_of<T: DeserializeOwned>() -> Value {
    let mut probe = FieldProbe::default();
    // Always an error: the probe stops at `deserialize_struct` after recording the fields.
    let _ = T::deserialize(&mut probe);
    let Some((name, fields)) = probe.found else {
        return json!({"type": "object"});
    };
    let properties: Map<String, Value> = fields
        .iter()
        .map(|f| ((*f).to_owned(), json!({})))
        .collect();
    let mut schema = json!({"type": "object", "title": name, "properties": properties});
    // `deny_unknown_fields` shows as an "unknown field" error for a key outside `fields`.
    let unknown = serde_json::from_str::<T>(r#"{"\u0000openapi-probe":0}"#)
        .err()
        .is_some_and(|e| e.to_string().contains("unknown field"));
    if unknown && let Some(map) = schema.as_object_mut() {
        map.insert("additionalProperties".into(), false.into());
    }
    schema
}

/// A deserializer that only records the struct name and field names it is asked for.
#[derive(Default)]
struct FieldProbe {
    found: Option<(&'static str, &'static [&'static str])>,
}

impl<'de> serde::Deserializer<'de> for &mut FieldProbe {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("schema probe"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.found = Some((name, fields));
        Err(serde::de::Error::custom("schema probe"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{FrontendConfig, HttpService};
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower_service::Service;

    /// Every documented (path, method) answers with something other than "no such route"
    /// (the test swaps the fallback for 418 to tell the two apart) and other methods on a
    /// documented path answer 405; every route in `mod.rs` goes through the table.
    #[tokio::test]
    async fn every_route_is_documented_and_every_documented_route_answers() {
        let service = HttpService::new(FrontendConfig::default());
        let mut router = service
            .router()
            .fallback(|| async { StatusCode::IM_A_TEAPOT });
        let doc = document(&routes());
        let paths = doc["paths"].as_object().expect("paths");
        assert!(paths.len() >= 7, "{paths:?}");
        for (path, item) in paths {
            let concrete = path
                .split('/')
                .map(|s| if s.starts_with('{') { "x" } else { s })
                .collect::<Vec<_>>()
                .join("/");
            for method in ["get", "post", "put", "delete", "patch"] {
                let request = Request::builder()
                    .method(method.to_ascii_uppercase().as_str())
                    .uri(&concrete)
                    .header("content-type", "application/json")
                    .body(Body::from("{}"))
                    .expect("request");
                let status = Service::<Request<Body>>::call(&mut router, request)
                    .await
                    .expect("infallible")
                    .status();
                if item.get(method).is_some() {
                    assert_ne!(status, StatusCode::IM_A_TEAPOT, "{method} {path} unrouted");
                    assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
                } else {
                    assert_eq!(
                        status,
                        StatusCode::METHOD_NOT_ALLOWED,
                        "{method} {path} answers but is not documented"
                    );
                }
            }
        }
        // An undocumented path reaches the fallback.
        let request = Request::builder()
            .uri("/v1/not-a-route")
            .body(Body::empty())
            .expect("request");
        let status = Service::<Request<Body>>::call(&mut router, request)
            .await
            .expect("infallible")
            .status();
        assert_eq!(status, StatusCode::IM_A_TEAPOT);
        // Routes registered outside the table would escape the checks above.
        let module = include_str!("mod.rs");
        for call in [".route(", ".route_service(", ".nest(", ".merge("] {
            assert!(
                !module.contains(call),
                "mod.rs registers a route with {call} outside openapi::routes()"
            );
        }
    }

    #[test]
    fn request_schemas_come_from_the_request_types() {
        let doc = document(&routes());
        let chat = &doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
            ["schema"];
        assert_eq!(chat["title"], "ChatCompletionRequest");
        assert_eq!(chat["additionalProperties"], false);
        for field in ["model", "messages", "stream", "max_tokens", "temperature"] {
            assert!(chat["properties"].get(field).is_some(), "{field}: {chat}");
        }
        let completion = &doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
            ["schema"];
        assert!(completion["properties"].get("prompt").is_some());
        assert_eq!(doc["openapi"], "3.1.0");
        assert!(doc["paths"]["/v1/models"]["get"]["requestBody"].is_null());
    }

    #[test]
    fn catch_all_parameters_are_plain_path_parameters_in_the_document() {
        assert_eq!(
            openapi_path("/v1/models/{*model_id}"),
            "/v1/models/{model_id}"
        );
        assert_eq!(
            path_params("/v1/models/{*model_id}/x/{b}"),
            ["model_id", "b"]
        );
        #[derive(serde::Deserialize)]
        #[expect(dead_code, reason = "only the field names matter")]
        struct Open {
            a: u32,
            #[serde(rename = "bee")]
            b: Option<String>,
        }
        let s = schema_of::<Open>();
        assert_eq!(s["properties"], json!({"a": {}, "bee": {}}));
        assert!(s.get("additionalProperties").is_none());
        assert_eq!(
            schema_of::<std::collections::HashMap<String, u32>>(),
            json!({"type": "object"})
        );
    }
}
