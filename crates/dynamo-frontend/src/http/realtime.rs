//! `GET /v1/realtime?model=…`: the OpenAI Realtime API's text events over a WebSocket.
//!
//! Client events: `session.update` (`instructions`, `temperature`,
//! `max_response_output_tokens`, `modalities`), `conversation.item.create` (a `message`
//! item with `input_text`/`text` parts), `response.create` (optional per-response
//! `instructions`, `temperature`, `max_output_tokens`). Server events: `session.created`,
//! `session.updated`, `conversation.item.created`, `response.created`,
//! `response.text.delta`, `response.text.done`, `response.done`, `error`.
//!
//! A response is one streamed chat completion through the ordinary chat path
//! ([`openai_routes::chat_completions`]: preprocessing, routing, migration, detokenising,
//! metrics), whose SSE chunks become `response.text.delta` events; so the realtime route has
//! no generation code of its own. Audio (an `audio` modality, `input_audio` parts,
//! `input_audio_buffer.*` events, binary frames) is refused with an `error` event and the
//! session stays open. A missing or unknown model is a 404 before the upgrade, as in the
//! reference.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::Shared;
use super::error::HttpError;
use super::openai_routes;
use super::respond::Surface;

/// The route's handler.
pub(super) async fn realtime(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    // As the reference does, an unknown model is refused before the upgrade (an HTTP 404 the
    // client's handshake reports), not with an event on an open socket.
    let model = query_param(uri.query().unwrap_or_default(), "model").unwrap_or_default();
    if !serves_chat(&shared, &model) {
        return HttpError::model_not_found(&model).into_response();
    }
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(e) => {
            let message = format!("/v1/realtime needs a WebSocket upgrade: {}", e.body_text());
            return HttpError::new(e.status().as_u16(), message).into_response();
        }
    };
    upgrade.on_upgrade(move |socket| Session::new(shared, model, socket).run())
}

/// One query parameter, percent-decoded (`model=Qwen%2FQwen3-0.6B`).
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}

/// Whether `model` answers chat (an in-process or a discovered model).
fn serves_chat(shared: &Shared, model: &str) -> bool {
    shared.statics.resolve(model, Surface::Chat).is_some()
        || shared
            .models
            .get(model)
            .is_some_and(|e| e.card.model_type.supports_chat())
}

fn error_event(
    kind: &str,
    code: &str,
    message: impl Into<String>,
    event_id: Option<&str>,
) -> Value {
    json!({
        "type": "error",
        "event_id": new_id("event"),
        "error": {
            "type": kind,
            "code": code,
            "message": message.into(),
            "param": null,
            "event_id": event_id,
        },
    })
}

/// The socket closed (or failed): the session ends.
struct Closed;

struct Session {
    shared: Arc<Shared>,
    model: String,
    socket: WebSocket,
    id: String,
    instructions: String,
    temperature: Option<f64>,
    max_tokens: Option<u64>,
    /// The conversation as chat messages.
    messages: Vec<Value>,
}

impl Session {
    fn new(shared: Arc<Shared>, model: String, socket: WebSocket) -> Self {
        Self {
            shared,
            model,
            socket,
            id: new_id("sess"),
            instructions: String::new(),
            temperature: None,
            max_tokens: None,
            messages: Vec::new(),
        }
    }

    fn session_object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "realtime.session",
            "model": self.model,
            "modalities": ["text"],
            "instructions": self.instructions,
            "temperature": self.temperature,
            "max_response_output_tokens": self.max_tokens.map_or(json!("inf"), Value::from),
        })
    }

    async fn send(&mut self, event: Value) -> Result<(), Closed> {
        self.socket
            .send(Message::Text(event.to_string().into()))
            .await
            .map_err(|_| Closed)
    }

    async fn run(mut self) {
        let _ = self.serve().await;
    }

    async fn serve(&mut self) -> Result<(), Closed> {
        let created = json!({"type": "session.created", "event_id": new_id("event"), "session": self.session_object()});
        self.send(created).await?;
        while let Some(message) = self.socket.recv().await {
            match message.map_err(|_| Closed)? {
                Message::Text(text) => match serde_json::from_str::<Value>(text.as_str()) {
                    Ok(event) if event.is_object() => self.handle(event).await?,
                    _ => {
                        let e = error_event(
                            "invalid_request_error",
                            "invalid_json",
                            "client events are JSON objects",
                            None,
                        );
                        self.send(e).await?;
                    }
                },
                Message::Binary(_) => {
                    let e = error_event(
                        "invalid_request_error",
                        "unsupported",
                        "binary frames (audio) are not supported: this endpoint is text only",
                        None,
                    );
                    self.send(e).await?;
                }
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
        Ok(())
    }

    async fn handle(&mut self, event: Value) -> Result<(), Closed> {
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        let event_id = event["event_id"].as_str().map(str::to_owned);
        let invalid = |message: String| {
            error_event(
                "invalid_request_error",
                "invalid_value",
                message,
                event_id.as_deref(),
            )
        };
        match kind.as_str() {
            "session.update" => {
                let session = &event["session"];
                if let Err(message) = text_only(&session["modalities"]) {
                    return self.send(invalid(message)).await;
                }
                if let Some(s) = session["instructions"].as_str() {
                    s.clone_into(&mut self.instructions);
                }
                if let Some(t) = session["temperature"].as_f64() {
                    self.temperature = Some(t);
                }
                match &session["max_response_output_tokens"] {
                    Value::Number(n) => self.max_tokens = n.as_u64(),
                    Value::String(s) if s == "inf" => self.max_tokens = None,
                    _ => {}
                }
                let updated = json!({"type": "session.updated", "event_id": new_id("event"), "session": self.session_object()});
                self.send(updated).await
            }
            "conversation.item.create" => match chat_message(&event["item"]) {
                Ok((message, mut item)) => {
                    self.messages.push(message);
                    if item.get("id").is_none_or(Value::is_null) {
                        item["id"] = new_id("item").into();
                    }
                    let previous = event["previous_item_id"].clone();
                    let created = json!({"type": "conversation.item.created", "event_id": new_id("event"), "previous_item_id": previous, "item": item});
                    self.send(created).await
                }
                Err(message) => self.send(invalid(message)).await,
            },
            "response.create" => {
                let response = &event["response"];
                if let Err(message) = text_only(&response["modalities"]) {
                    return self.send(invalid(message)).await;
                }
                self.respond(response).await
            }
            k if k.starts_with("input_audio_buffer.") => {
                let e = error_event(
                    "invalid_request_error",
                    "unsupported",
                    format!("`{k}`: audio input is not supported: this endpoint is text only"),
                    event_id.as_deref(),
                );
                self.send(e).await
            }
            "response.cancel" => Ok(()),
            other => {
                let e = error_event(
                    "invalid_request_error",
                    "invalid_event",
                    format!("unsupported client event type `{other}`"),
                    event_id.as_deref(),
                );
                self.send(e).await
            }
        }
    }

    /// Generate one response: a streamed chat completion of the conversation.
    async fn respond(&mut self, options: &Value) -> Result<(), Closed> {
        let response_id = new_id("resp");
        let item_id = new_id("item");
        let created = json!({"type": "response.created", "event_id": new_id("event"),
            "response": {"id": response_id, "object": "realtime.response", "status": "in_progress", "output": []}});
        self.send(created).await?;
        let instructions = options["instructions"]
            .as_str()
            .unwrap_or(&self.instructions)
            .to_owned();
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if !instructions.is_empty() {
            messages.push(json!({"role": "system", "content": instructions}));
        }
        messages.extend(self.messages.iter().cloned());
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(t) = options["temperature"].as_f64().or(self.temperature) {
            body["temperature"] = t.into();
        }
        if let Some(m) = options["max_output_tokens"].as_u64().or(self.max_tokens) {
            body["max_tokens"] = m.into();
        }
        let bytes = Bytes::from(body.to_string());
        let http = openai_routes::chat_completions_bytes(Arc::clone(&self.shared), bytes).await;
        let mut text = String::new();
        let mut usage = Value::Null;
        let mut failure: Option<Value> = None;
        if http.status().is_success() {
            let mut sse = SseLines::new(http.into_body());
            while let Some(data) = sse.next().await {
                let Ok(chunk) = serde_json::from_slice::<Value>(&data) else {
                    continue;
                };
                if chunk.get("error").is_some() {
                    failure = Some(chunk["error"].clone());
                    break;
                }
                if !chunk["usage"].is_null() {
                    usage = chunk["usage"].clone();
                }
                let delta = chunk["choices"][0]["delta"]["content"]
                    .as_str()
                    .unwrap_or_default();
                if !delta.is_empty() {
                    text.push_str(delta);
                    let event = json!({"type": "response.text.delta", "event_id": new_id("event"),
                        "response_id": response_id, "item_id": item_id, "output_index": 0,
                        "content_index": 0, "delta": delta});
                    self.send(event).await?;
                }
            }
        } else {
            let body = axum::body::to_bytes(http.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            let error = serde_json::from_slice::<Value>(&body).unwrap_or_default();
            failure = Some(error["error"].clone());
        }
        if let Some(error) = failure {
            let kind = error["type"].as_str().unwrap_or("server_error");
            let code = error["code"].as_str().unwrap_or("generation_failed");
            let message = error["message"].as_str().unwrap_or("generation failed");
            self.send(error_event(kind, code, message, None)).await?;
            let done = json!({"type": "response.done", "event_id": new_id("event"),
                "response": {"id": response_id, "object": "realtime.response", "status": "failed",
                    "status_details": {"type": "failed", "error": error}, "output": [], "usage": usage}});
            return self.send(done).await;
        }
        let done_text = json!({"type": "response.text.done", "event_id": new_id("event"),
            "response_id": response_id, "item_id": item_id, "output_index": 0,
            "content_index": 0, "text": text});
        self.send(done_text).await?;
        let item = json!({"id": item_id, "object": "realtime.item", "type": "message",
            "status": "completed", "role": "assistant",
            "content": [{"type": "text", "text": text}]});
        self.messages
            .push(json!({"role": "assistant", "content": text}));
        let usage = json!({
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        });
        let done = json!({"type": "response.done", "event_id": new_id("event"),
            "response": {"id": response_id, "object": "realtime.response", "status": "completed",
                "output": [item], "usage": usage}});
        self.send(done).await
    }
}

/// A `modalities` value without `audio` (absent is fine).
fn text_only(modalities: &Value) -> Result<(), String> {
    match modalities {
        Value::Null => Ok(()),
        Value::Array(list) if list.iter().all(|m| m == "text") => Ok(()),
        Value::Array(_) => Err(
            "only the \"text\" modality is supported: audio is not supported on this endpoint"
                .into(),
        ),
        _ => Err("`modalities` must be a list".into()),
    }
}

/// A `conversation.item.create` item as a chat message (and the item to echo back).
fn chat_message(item: &Value) -> Result<(Value, Value), String> {
    if item["type"].as_str().unwrap_or("message") != "message" {
        return Err(format!(
            "unsupported item type `{}`: only `message` items are supported",
            item["type"]
        ));
    }
    let role = match item["role"].as_str() {
        Some(r @ ("user" | "assistant" | "system")) => r,
        _ => return Err("`item.role` must be \"user\", \"assistant\" or \"system\"".into()),
    };
    let Some(parts) = item["content"].as_array() else {
        return Err("`item.content` must be a list of content parts".into());
    };
    let mut text = String::new();
    for part in parts {
        match part["type"].as_str() {
            Some("input_text" | "text") => match part["text"].as_str() {
                Some(t) => text.push_str(t),
                None => return Err("a text content part needs `text`".into()),
            },
            Some(t @ ("input_audio" | "audio")) => {
                return Err(format!(
                    "`{t}` content is not supported: this endpoint is text only"
                ));
            }
            other => return Err(format!("unsupported content part type {other:?}")),
        }
    }
    let mut echoed = item.clone();
    echoed["object"] = "realtime.item".into();
    echoed["type"] = "message".into();
    echoed["status"] = "completed".into();
    Ok((json!({"role": role, "content": text}), echoed))
}

/// The `data:` payloads of an SSE body (the chat route's stream), without `[DONE]`.
pub(super) struct SseLines {
    body: axum::body::BodyDataStream,
    buffer: Vec<u8>,
    done: bool,
}

impl SseLines {
    pub(super) fn new(body: Body) -> Self {
        Self {
            body: body.into_data_stream(),
            buffer: Vec::new(),
            done: false,
        }
    }

    pub(super) async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let frame: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let data = frame
                    .split(|b| *b == b'\n')
                    .filter_map(|line| line.strip_prefix(b"data:"))
                    .flat_map(|d| d.strip_prefix(b" ").unwrap_or(d).iter().copied())
                    .collect::<Vec<u8>>();
                if data == b"[DONE]" {
                    self.done = true;
                    return None;
                }
                if data.is_empty() {
                    continue;
                }
                return Some(data);
            }
            if self.done {
                return None;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(_)) | None => {
                    self.done = true;
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_percent_decoded() {
        assert_eq!(
            query_param("a=1&model=Qwen%2FQwen3-0.6B", "model").as_deref(),
            Some("Qwen/Qwen3-0.6B")
        );
        assert_eq!(query_param("model=a+b", "model").as_deref(), Some("a b"));
        assert_eq!(query_param("x=1", "model"), None);
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }

    #[test]
    fn items_become_chat_messages_and_audio_is_refused() {
        let item = json!({"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hi "}, {"type": "text", "text": "there"}]});
        let (message, echoed) = chat_message(&item).expect("text item");
        assert_eq!(message, json!({"role": "user", "content": "hi there"}));
        assert_eq!(echoed["object"], "realtime.item");
        let audio = json!({"type": "message", "role": "user",
            "content": [{"type": "input_audio", "audio": "AAAA"}]});
        assert!(chat_message(&audio).unwrap_err().contains("not supported"));
        assert!(text_only(&json!(["text", "audio"])).is_err());
        assert!(text_only(&json!(["text"])).is_ok());
        assert!(chat_message(&json!({"role": "tool", "content": []})).is_err());
    }
}
