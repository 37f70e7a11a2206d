//! `POST /v1/messages` (Anthropic's Messages API) and `POST /v1/messages/count_tokens`,
//! served only when the frontend is started with `enable_anthropic_api`
//! (`--enable-anthropic-api`, `DYN_ENABLE_ANTHROPIC_API`), as in the reference.
//!
//! A message is one streamed chat completion through the ordinary chat path (see
//! [`chat_stream`]): `system` and `messages` (text, image, `tool_use`, `tool_result` and
//! `thinking` blocks) become chat messages; `tools` (`input_schema`), `tool_choice`
//! (`auto`, `any`, `tool`, `none`, `disable_parallel_tool_use`), `max_tokens`,
//! `stop_sequences`, `temperature`, `top_p`, `top_k` and `thinking` the chat fields of the
//! same meaning. The chat deltas become content blocks (`thinking` from the reasoning
//! parser, `text`, `tool_use` from the tool-call parser) and, with `stream: true`, the
//! events `message_start`, `ping`, `content_block_start`, `content_block_delta`
//! (`thinking_delta`, `text_delta`, `input_json_delta`), `content_block_stop`,
//! `message_delta` (`stop_reason`, usage) and `message_stop`. Errors use Anthropic's
//! envelope `{"type": "error", "error": {"type", "message"}}`, mid-stream as an `error`
//! event.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::Shared;
use super::chat_stream::{
    ChatEvent, ChatStream, ChatUsage, arguments_object, count_prompt_tokens, new_id,
};
use super::error::HttpError;
use super::request_body::JsonBody;
use super::respond::{json_response, sse_headers};
use super::surfaces::{bad, json_object, model_field};

/// Top-level request fields this surface knows; anything else is a 400, as Anthropic
/// answers ("Extra inputs are not permitted").
const KNOWN: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "service_tier",
    // Engine extensions, passed to the chat path as they are.
    "nvext",
    "chat_template_kwargs",
];

/// An error in Anthropic's envelope.
pub(super) struct AnthropicError(pub(super) HttpError);

impl AnthropicError {
    /// Anthropic's error type for the status.
    fn kind(&self) -> &'static str {
        match self.0.status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if (400..500).contains(&s) => "invalid_request_error",
            _ => "api_error",
        }
    }

    fn body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.kind(), "message": self.0.message}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response()
    }
}

/// A chat parameter name in an error, as this surface names it.
fn rename(param: &str) -> String {
    match param {
        "max_completion_tokens" => "max_tokens",
        "stop" => "stop_sequences",
        other => other,
    }
    .to_owned()
}

/// The text of `tool_result` content (a string or text blocks; images are refused).
fn tool_result_text(content: &Value) -> Result<String, HttpError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for b in blocks {
                match (b["type"].as_str(), b["text"].as_str()) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(bad(
                            format!(
                                "unsupported `tool_result` content block {kind:?}: only text is supported"
                            ),
                            "messages",
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(bad(
            "`tool_result.content` must be a string or a list of blocks",
            "messages",
        )),
    }
}

/// An image block as a chat `image_url` part.
fn image_part(block: &Value) -> Result<Value, HttpError> {
    let source = &block["source"];
    let url = match source["type"].as_str() {
        Some("base64") => format!(
            "data:{};base64,{}",
            source["media_type"].as_str().unwrap_or("image/png"),
            source["data"].as_str().unwrap_or_default()
        ),
        Some("url") => source["url"].as_str().unwrap_or_default().to_owned(),
        _ => {
            return Err(bad(
                "an image block's `source` must be base64 or url",
                "messages",
            ));
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// Chat content of text and image parts: a string when all are text.
fn chat_content(parts: Vec<Value>) -> Value {
    if parts.iter().all(|p| p["type"] == "text") {
        let text: String = parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("");
        Value::String(text)
    } else {
        Value::Array(parts)
    }
}

/// The chat messages of one Anthropic message.
fn translate_message(message: &Value, out: &mut Vec<Value>) -> Result<(), HttpError> {
    let role = match message["role"].as_str() {
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(bad(
                "a message's `role` must be \"user\" or \"assistant\" (the system prompt goes in `system`)",
                "messages",
            ));
        }
    };
    let blocks = match &message["content"] {
        Value::String(s) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => {
            return Err(bad(
                "a message's `content` must be a string or a list of content blocks",
                "messages",
            ));
        }
    };
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    let mut thinking = String::new();
    for block in blocks {
        match (role, block["type"].as_str()) {
            (_, Some("text")) => {
                parts.push(
                    json!({"type": "text", "text": block["text"].as_str().unwrap_or_default()}),
                );
            }
            ("user", Some("image")) => parts.push(image_part(block)?),
            ("user", Some("tool_result")) => {
                let Some(id) = block["tool_use_id"].as_str() else {
                    return Err(bad("a `tool_result` block needs `tool_use_id`", "messages"));
                };
                let mut content = tool_result_text(&block["content"])?;
                if block["is_error"] == Value::Bool(true) && content.is_empty() {
                    "error".clone_into(&mut content);
                }
                // Tool results answer the previous assistant turn: they come first.
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("assistant", Some("tool_use")) => {
                let (Some(id), Some(name)) = (block["id"].as_str(), block["name"].as_str()) else {
                    return Err(bad("a `tool_use` block needs `id` and `name`", "messages"));
                };
                let input = match &block["input"] {
                    Value::Null => "{}".to_owned(),
                    v => v.to_string(),
                };
                tool_calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input}}));
            }
            ("assistant", Some("thinking")) => {
                thinking.push_str(block["thinking"].as_str().unwrap_or_default());
            }
            // Redacted reasoning has no text a template could use.
            ("assistant", Some("redacted_thinking")) => {}
            (_, kind) => {
                return Err(bad(
                    format!("unsupported content block type {kind:?} in a {role} message"),
                    "messages",
                ));
            }
        }
    }
    if role == "user" && parts.is_empty() {
        return Ok(());
    }
    let mut chat = json!({"role": role, "content": chat_content(parts)});
    if !tool_calls.is_empty() {
        if chat["content"] == "" {
            chat["content"] = Value::Null;
        }
        chat["tool_calls"] = tool_calls.into();
    }
    if !thinking.is_empty() {
        chat["reasoning_content"] = thinking.into();
    }
    out.push(chat);
    Ok(())
}

/// The chat request of an Anthropic request (`max_tokens` required when `generate`).
fn translate(body: &Map<String, Value>, generate: bool) -> Result<Value, HttpError> {
    if let Some(unknown) = body.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(bad(
            format!("{unknown}: Extra inputs are not permitted"),
            unknown,
        ));
    }
    let model = model_field(body)?;
    let mut messages = Vec::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let mut text = Vec::with_capacity(blocks.len());
            for b in blocks {
                match (b["type"].as_str(), b["text"].as_str()) {
                    (Some("text"), Some(t)) => text.push(t),
                    _ => return Err(bad("`system` blocks must be text blocks", "system")),
                }
            }
            messages.push(json!({"role": "system", "content": text.join("\n")}));
        }
        Some(_) => {
            return Err(bad(
                "`system` must be a string or a list of text blocks",
                "system",
            ));
        }
    }
    let Some(list) = body.get("messages").and_then(Value::as_array) else {
        return Err(bad(
            "messages: Field required (a list of messages)",
            "messages",
        ));
    };
    if list.is_empty() {
        return Err(bad(
            "messages: at least one message is required",
            "messages",
        ));
    }
    for m in list {
        translate_message(m, &mut messages)?;
    }
    let mut chat = json!({"model": model, "messages": messages});
    match body.get("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => {
            chat["max_completion_tokens"] = n.clone().into();
        }
        None | Some(Value::Null) if !generate => {}
        None | Some(Value::Null) => {
            return Err(bad("max_tokens: Field required", "max_tokens"));
        }
        Some(_) => {
            return Err(bad(
                "max_tokens: must be an integer of at least 1",
                "max_tokens",
            ));
        }
    }
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "nvext",
        "chat_template_kwargs",
    ] {
        if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
            chat[key] = v.clone();
        }
    }
    if let Some(stop) = body.get("stop_sequences").filter(|v| !v.is_null()) {
        chat["stop"] = stop.clone();
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        let Some(tools) = tools.as_array() else {
            return Err(bad("`tools` must be a list", "tools"));
        };
        let mut list = Vec::with_capacity(tools.len());
        for t in tools {
            match t["type"].as_str() {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(bad(
                        format!(
                            "unsupported tool type {other:?}: only custom (client) tools are supported"
                        ),
                        "tools",
                    ));
                }
            }
            let Some(name) = t["name"].as_str() else {
                return Err(bad("a tool needs a `name`", "tools"));
            };
            let mut function = json!({"name": name,
                "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}))});
            if let Some(d) = t["description"].as_str() {
                function["description"] = d.into();
            }
            list.push(json!({"type": "function", "function": function}));
        }
        chat["tools"] = list.into();
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let mapped = match (choice["type"].as_str(), choice["name"].as_str()) {
            (Some("auto"), _) => json!("auto"),
            (Some("any"), _) => json!("required"),
            (Some("none"), _) => json!("none"),
            (Some("tool"), Some(name)) => json!({"type": "function", "function": {"name": name}}),
            _ => {
                return Err(bad(
                    "`tool_choice.type` must be auto, any, none, or tool with a `name`",
                    "tool_choice",
                ));
            }
        };
        chat["tool_choice"] = mapped;
        if choice["disable_parallel_tool_use"] == Value::Bool(true) {
            chat["parallel_tool_calls"] = false.into();
        }
    }
    if let Some(thinking) = body.get("thinking").filter(|v| !v.is_null()) {
        // Templates of reasoning models (Qwen3, DeepSeek, ...) read `enable_thinking`.
        let enabled = match thinking["type"].as_str() {
            Some("enabled" | "adaptive") => true,
            Some("disabled") => false,
            _ => {
                return Err(bad(
                    "`thinking.type` must be enabled or disabled",
                    "thinking",
                ));
            }
        };
        if !chat["chat_template_kwargs"].is_object() {
            chat["chat_template_kwargs"] = json!({});
        }
        chat["chat_template_kwargs"]["enable_thinking"] = enabled.into();
    }
    Ok(chat)
}

/// What a content block is.
#[derive(Debug)]
enum Block {
    Thinking(String),
    Text(String),
    ToolUse {
        id: String,
        name: String,
        arguments: String,
    },
}

impl Block {
    fn json(&self, streaming_start: bool) -> Value {
        match self {
            Self::Thinking(t) => json!({"type": "thinking",
                "thinking": if streaming_start { "" } else { t.as_str() }, "signature": ""}),
            Self::Text(t) => {
                json!({"type": "text", "text": if streaming_start { "" } else { t.as_str() }})
            }
            Self::ToolUse {
                id,
                name,
                arguments,
            } => json!({"type": "tool_use", "id": id, "name": name,
                "input": if streaming_start { json!({}) } else { arguments_object(arguments) }}),
        }
    }
}

/// Folds chat events into the message and its stream events.
struct Builder {
    id: String,
    model: String,
    blocks: Vec<Block>,
    /// The block being streamed.
    open: Option<usize>,
    tools: BTreeMap<u32, usize>,
    finish: Option<String>,
    usage: ChatUsage,
    events: Vec<Value>,
}

impl Builder {
    fn new(model: String) -> Self {
        Self {
            id: new_id("msg"),
            model,
            blocks: Vec::new(),
            open: None,
            tools: BTreeMap::new(),
            finish: None,
            usage: ChatUsage::default(),
            events: Vec::new(),
        }
    }

    fn usage_json(&self) -> Value {
        json!({
            "input_tokens": self.usage.prompt,
            "output_tokens": self.usage.completion,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.usage.cached,
        })
    }

    fn stop_reason(&self) -> &'static str {
        match self.finish.as_deref() {
            Some("length") => "max_tokens",
            Some("tool_calls") => "tool_use",
            Some("content_filter") => "refusal",
            _ => "end_turn",
        }
    }

    fn message(&self, done: bool) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": if done { self.blocks.iter().map(|b| b.json(false)).collect::<Vec<_>>() } else { Vec::new() },
            "stop_reason": if done { Value::from(self.stop_reason()) } else { Value::Null },
            "stop_sequence": null,
            "usage": self.usage_json(),
        })
    }

    fn start(&mut self) {
        let message = self.message(false);
        self.events
            .push(json!({"type": "message_start", "message": message}));
        self.events.push(json!({"type": "ping"}));
    }

    fn close_open(&mut self) {
        if let Some(index) = self.open.take() {
            self.events
                .push(json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// The open block when it is of `kind`, else a new one (closing the open one).
    fn block(&mut self, same: fn(&Block) -> bool, new: Block) -> usize {
        if let Some(i) = self.open
            && same(&self.blocks[i])
        {
            return i;
        }
        self.close_open();
        let index = self.blocks.len();
        let start = new.json(true);
        self.blocks.push(new);
        self.open = Some(index);
        self.events
            .push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        index
    }

    fn on(&mut self, event: ChatEvent) {
        match event {
            ChatEvent::Reasoning(delta) => {
                let i = self.block(
                    |b| matches!(b, Block::Thinking(_)),
                    Block::Thinking(String::new()),
                );
                if let Block::Thinking(t) = &mut self.blocks[i] {
                    t.push_str(&delta);
                }
                self.events
                    .push(json!({"type": "content_block_delta", "index": i,
                    "delta": {"type": "thinking_delta", "thinking": delta}}));
            }
            ChatEvent::Text(delta) => {
                let i = self.block(|b| matches!(b, Block::Text(_)), Block::Text(String::new()));
                if let Block::Text(t) = &mut self.blocks[i] {
                    t.push_str(&delta);
                }
                self.events
                    .push(json!({"type": "content_block_delta", "index": i,
                    "delta": {"type": "text_delta", "text": delta}}));
            }
            ChatEvent::ToolStart { index, id, name } => {
                self.close_open();
                let i = self.block(
                    |_| false,
                    Block::ToolUse {
                        id,
                        name,
                        arguments: String::new(),
                    },
                );
                self.tools.insert(index, i);
            }
            ChatEvent::ToolArgs { index, delta } => {
                let Some(&i) = self.tools.get(&index) else {
                    return;
                };
                if let Block::ToolUse { arguments, .. } = &mut self.blocks[i] {
                    arguments.push_str(&delta);
                }
                // Blocks stream one at a time: pieces of a call whose block was closed
                // (calls interleaved by the engine) are only in the final message.
                if self.open == Some(i) {
                    self.events
                        .push(json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": delta}}));
                }
            }
            ChatEvent::Finish(reason) => self.finish = Some(reason),
            ChatEvent::Usage(u) => self.usage = u,
        }
    }

    fn end(&mut self) {
        self.close_open();
        let usage = self.usage_json();
        let stop = self.stop_reason();
        self.events.push(json!({"type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": usage}));
        self.events.push(json!({"type": "message_stop"}));
    }

    fn drain_sse(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        for event in self.events.drain(..) {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(event["type"].as_str().unwrap_or("message").as_bytes());
            out.extend_from_slice(b"\ndata: ");
            out.extend_from_slice(event.to_string().as_bytes());
            out.extend_from_slice(b"\n\n");
        }
        out
    }
}

fn parse(shared: &Shared, body: Result<Bytes, HttpError>) -> Result<Map<String, Value>, HttpError> {
    let body = body?;
    if !shared.statics.is_enabled("anthropic_messages") {
        return Err(HttpError::new(404, "not found"));
    }
    json_object(&body)
}

/// `POST /v1/messages`.
pub(super) async fn messages(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    match create(shared, body).await {
        Ok(r) => r,
        Err(e) => AnthropicError(e).into_response(),
    }
}

async fn create(
    shared: Arc<Shared>,
    body: Result<Bytes, HttpError>,
) -> Result<Response, HttpError> {
    let body = parse(&shared, body)?;
    let streaming = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream: must be a boolean", "stream")),
    };
    let chat = translate(&body, true)?;
    let model = chat["model"].as_str().unwrap_or_default().to_owned();
    let mut stream = ChatStream::open(shared, chat, rename).await?;
    let mut builder = Builder::new(model);
    if !streaming {
        while let Some(event) = stream.next().await {
            builder.on(event?);
        }
        return Ok(json_response(&builder.message(true)));
    }
    builder.start();
    let first = builder.drain_sse();
    // The body owns the chat stream: a client that disconnects drops it, which stops the
    // generation on the worker.
    let rest = futures_util::stream::unfold(Some((stream, builder)), |state| async move {
        let (mut stream, mut builder) = state?;
        let (bytes, next) = match stream.next().await {
            Some(Ok(event)) => {
                builder.on(event);
                (builder.drain_sse(), Some((stream, builder)))
            }
            Some(Err(e)) => {
                let mut out = builder.drain_sse();
                out.extend_from_slice(b"event: error\ndata: ");
                out.extend_from_slice(AnthropicError(e).body().to_string().as_bytes());
                out.extend_from_slice(b"\n\n");
                (out, None)
            }
            None => {
                builder.end();
                (builder.drain_sse(), None)
            }
        };
        Some((Ok::<_, Infallible>(Bytes::from(bytes)), next))
    });
    let head = futures_util::stream::once(async move { Ok::<_, Infallible>(Bytes::from(first)) });
    Ok(sse_headers(Body::from_stream(
        futures_util::StreamExt::chain(head, rest),
    )))
}

/// `POST /v1/messages/count_tokens`: the prompt tokens of the request.
pub(super) async fn count_tokens(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let result = parse(&shared, body).and_then(|body| {
        let chat = translate(&body, false)?;
        count_prompt_tokens(&shared, &chat, rename)
    });
    match result {
        Ok(n) => json_response(&json!({"input_tokens": n})),
        Err(e) => AnthropicError(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("object")
    }

    #[test]
    fn a_tool_turn_becomes_chat_messages() {
        let body = obj(json!({
            "model": "m",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "need the tool", "signature": ""},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "and tomorrow?"}]},
            ],
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }));
        let chat = translate(&body, true).expect("valid");
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": "Let me check.", "reasoning_content": "need the tool",
                 "tool_calls": [{"id": "toolu_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "user", "content": "and tomorrow?"},
            ])
        );
        assert_eq!(
            chat["tools"][0],
            json!({"type": "function", "function": {"name": "get_weather",
                "description": "w", "parameters": {"type": "object"}}})
        );
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["max_completion_tokens"], 100);
        assert_eq!(chat["chat_template_kwargs"]["enable_thinking"], true);
    }

    #[test]
    fn invalid_requests_name_the_field() {
        for (body, param) in [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (json!({"model": "m", "max_tokens": 5}), "messages"),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "messages",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "bogus": 1, "messages": [{"role": "user", "content": "x"}]}),
                "bogus",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools",
            ),
        ] {
            let e = translate(&obj(body.clone()), true).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(
                AnthropicError(e).body()["error"]["type"],
                "invalid_request_error"
            );
        }
        // count_tokens needs no max_tokens.
        let ok = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        assert!(translate(&obj(ok), false).is_ok());
        let e = AnthropicError(HttpError::model_not_found("m"));
        assert_eq!(e.body()["error"]["type"], "not_found_error");
        assert_eq!(
            AnthropicError(HttpError::new(529, "busy")).body()["error"]["type"],
            "overloaded_error"
        );
    }

    #[test]
    fn chat_events_become_content_blocks_and_stream_events() {
        let mut b = Builder::new("m".into());
        b.start();
        for e in [
            ChatEvent::Reasoning("hmm".into()),
            ChatEvent::Text("Let me check.".into()),
            ChatEvent::ToolStart {
                index: 0,
                id: "call_1".into(),
                name: "get_weather".into(),
            },
            ChatEvent::ToolArgs {
                index: 0,
                delta: "{\"city\":".into(),
            },
            ChatEvent::ToolArgs {
                index: 0,
                delta: "\"Paris\"}".into(),
            },
            ChatEvent::Finish("tool_calls".into()),
            ChatEvent::Usage(ChatUsage {
                prompt: 9,
                completion: 4,
                cached: 2,
                reasoning: 0,
            }),
        ] {
            b.on(e);
        }
        b.end();
        let m = b.message(true);
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(
            m["content"],
            json!([
                {"type": "thinking", "thinking": "hmm", "signature": ""},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
            ])
        );
        assert_eq!(m["usage"]["input_tokens"], 9);
        assert_eq!(m["usage"]["cache_read_input_tokens"], 2);
        let kinds: Vec<String> = b
            .events
            .iter()
            .map(|e| {
                let t = e["type"].as_str().unwrap_or_default();
                match e["delta"]["type"].as_str() {
                    Some(d) if t == "content_block_delta" => format!("{t}:{d}"),
                    _ => t.to_owned(),
                }
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta:thinking_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta:text_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta:input_json_delta",
                "content_block_delta:input_json_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        let last = &b.events[b.events.len() - 2];
        assert_eq!(last["delta"]["stop_reason"], "tool_use");
        assert_eq!(last["usage"]["output_tokens"], 4);
        assert_eq!(b.stop_reason(), "tool_use");
        b.finish = Some("length".into());
        assert_eq!(b.stop_reason(), "max_tokens");
    }
}

#[cfg(test)]
mod route_tests {
    use crate::http::{FrontendConfig, HttpService};
    use axum::body::Body;
    use axum::http::Request;
    use serde_json::Value;
    use tower_service::Service;

    async fn call(router: &mut axum::Router, method: &str, path: &str, body: &str) -> (u16, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .expect("request");
        let response = Service::<Request<Body>>::call(router, request)
            .await
            .expect("infallible");
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    /// `/v1/messages` and `/v1/messages/count_tokens` exist (and are documented) only with
    /// `enable_anthropic_api`; `/v1/responses` always.
    #[tokio::test]
    async fn the_anthropic_routes_exist_only_when_enabled() {
        let body =
            r#"{"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}"#;
        for enabled in [false, true] {
            let service = HttpService::new(FrontendConfig {
                enable_anthropic_api: enabled,
                ..FrontendConfig::default()
            });
            let mut router = service.router();
            for path in ["/v1/messages", "/v1/messages/count_tokens"] {
                let (status, v) = call(&mut router, "POST", path, body).await;
                assert_eq!(status, 404, "{path}: {v}");
                if enabled {
                    // The route answers: the model is unknown, in Anthropic's envelope.
                    assert_eq!(v["type"], "error", "{v}");
                    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
                } else {
                    assert_eq!(v["error"]["code"], "not_found", "{v}");
                }
            }
            let (status, v) = call(
                &mut router,
                "POST",
                "/v1/responses",
                r#"{"model": "nope", "input": "x"}"#,
            )
            .await;
            assert_eq!(status, 404, "{v}");
            assert_eq!(v["error"]["code"], "model_not_found", "{v}");
            let (_, doc) = call(&mut router, "GET", "/openapi.json", "").await;
            assert_eq!(doc["paths"].get("/v1/messages").is_some(), enabled);
            assert!(doc["paths"]["/v1/responses"]["post"].is_object());
            assert!(doc["paths"]["/v1/responses/input_tokens"]["post"].is_object());
        }
    }
}
