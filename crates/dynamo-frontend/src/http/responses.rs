//! `POST /v1/responses` (OpenAI's Responses API) and `POST /v1/responses/input_tokens`.
//!
//! A response is one streamed chat completion through the ordinary chat path (see
//! [`chat_stream`]): the request's `instructions` and `input` (a string, or message,
//! `function_call`, `function_call_output` and `reasoning` items) become chat messages, its
//! function `tools`, `tool_choice`, `max_output_tokens`, `text.format` and `reasoning.effort`
//! the chat fields of the same meaning; the chat deltas become the Responses output items
//! (`reasoning`, `message`, `function_call`) and, with `stream: true`, the Responses
//! events (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`, `response.output_text.done`,
//! `response.reasoning_text.delta`, `response.function_call_arguments.delta`/`.done`,
//! `response.content_part.done`, `response.output_item.done`, then `response.completed`,
//! `response.incomplete` (the output limit was reached: `incomplete_details.reason` is
//! `max_output_tokens`) or `response.failed`). Nothing is stored: `previous_response_id`,
//! `conversation`, `background` and `prompt` are refused with 501, as the reference does.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::Shared;
use super::chat_stream::{ChatEvent, ChatStream, ChatUsage, count_prompt_tokens, new_id};
use super::error::HttpError;
use super::request_body::JsonBody;
use super::respond::{json_response, sse_headers};
use super::surfaces::{bad, json_object, model_field};

/// Top-level request fields this surface knows (OpenAI's `responses.create` parameters and
/// the engine extensions the chat path takes); anything else is a 400, as OpenAI answers.
const KNOWN: &[&str] = &[
    "model",
    "input",
    "instructions",
    "stream",
    "stream_options",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "metadata",
    "store",
    "user",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "truncation",
    "include",
    "max_tool_calls",
    "top_logprobs",
    "background",
    "conversation",
    "previous_response_id",
    "prompt",
    // Engine extensions, passed to the chat path as they are.
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "ignore_eos",
    "min_tokens",
    "nvext",
    "chat_template_kwargs",
];

/// Engine extensions copied to the chat request unchanged.
const PASSTHROUGH: &[&str] = &[
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "ignore_eos",
    "min_tokens",
    "nvext",
    "chat_template_kwargs",
];

/// A chat parameter name in an error, as this surface names it.
fn rename(param: &str) -> String {
    match param {
        "messages" | "prompt" => "input",
        "max_tokens" | "max_completion_tokens" => "max_output_tokens",
        "response_format" => "text",
        "reasoning_effort" => "reasoning",
        other => other,
    }
    .to_owned()
}

fn not_supported(what: &str, param: &str) -> HttpError {
    HttpError {
        status: 501,
        message: format!("`{what}` is not supported: this frontend does not store responses."),
        param: Some(param.into()),
    }
}

/// The text of content that is a string or a list of text parts.
fn text_of(content: &Value, param: &str) -> Result<String, HttpError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (
                        Some(
                            "input_text" | "output_text" | "text" | "reasoning_text"
                            | "summary_text",
                        ),
                        Some(t),
                    ) => text.push_str(t),
                    (Some("refusal"), _) => text.push_str(part["refusal"].as_str().unwrap_or("")),
                    (kind, _) => {
                        return Err(bad(
                            format!(
                                "unsupported content part type {kind:?} in `{param}`: only text parts are supported here"
                            ),
                            param,
                        ));
                    }
                }
            }
            Ok(text)
        }
        Value::Null => Ok(String::new()),
        _ => Err(bad(
            format!("`{param}` must be a string or a list of content parts"),
            param,
        )),
    }
}

/// A message item's content as chat content: a string when it is all text, else chat
/// parts (images become `image_url` parts).
fn message_content(content: &Value) -> Result<Value, HttpError> {
    let Value::Array(parts) = content else {
        return Ok(Value::String(text_of(content, "input")?));
    };
    if parts
        .iter()
        .all(|p| p["type"].as_str() != Some("input_image"))
    {
        return Ok(Value::String(text_of(content, "input")?));
    }
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        if part["type"].as_str() == Some("input_image") {
            let Some(url) = part["image_url"].as_str() else {
                return Err(bad(
                    "`input_image` parts need an `image_url` (uploaded files are not supported)",
                    "input",
                ));
            };
            let mut image = json!({"url": url});
            if let Some(d) = part["detail"].as_str() {
                image["detail"] = d.into();
            }
            out.push(json!({"type": "image_url", "image_url": image}));
        } else {
            out.push(json!({"type": "text", "text": text_of(&Value::Array(vec![part.clone()]), "input")?}));
        }
    }
    Ok(Value::Array(out))
}

/// The chat messages of `instructions` and `input`.
fn chat_messages(body: &Map<String, Value>) -> Result<Vec<Value>, HttpError> {
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => return Err(bad("`instructions` must be a string", "instructions")),
    }
    let items = match body.get("input") {
        Some(Value::String(s)) => {
            messages.push(json!({"role": "user", "content": s}));
            return Ok(messages);
        }
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => {
            return Err(bad("missing required parameter: 'input'", "input"));
        }
        Some(_) => {
            return Err(bad(
                "`input` must be a string or a list of input items",
                "input",
            ));
        }
    };
    // Reasoning items belong to the assistant turn that follows them.
    let mut reasoning: Option<String> = None;
    for item in items {
        let kind = item["type"]
            .as_str()
            .unwrap_or(if item.get("role").is_some() {
                "message"
            } else {
                ""
            });
        match kind {
            "message" => {
                let role = match item["role"].as_str() {
                    Some(r @ ("user" | "assistant" | "system" | "developer")) => r,
                    _ => {
                        return Err(bad(
                            "a message item's `role` must be user, assistant, system or developer",
                            "input",
                        ));
                    }
                };
                let mut message =
                    json!({"role": role, "content": message_content(&item["content"])?});
                if role == "assistant"
                    && let Some(r) = reasoning.take()
                {
                    message["reasoning_content"] = r.into();
                }
                messages.push(message);
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (item["call_id"].as_str(), item["name"].as_str())
                else {
                    return Err(bad(
                        "a `function_call` item needs `call_id` and `name`",
                        "input",
                    ));
                };
                let call = json!({"id": call_id, "type": "function", "function": {
                    "name": name, "arguments": item["arguments"].as_str().unwrap_or("{}")}});
                // Calls of one assistant turn join its message.
                match messages.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last["tool_calls"].as_array_mut() {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => messages
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
                if let Some(r) = reasoning.take()
                    && let Some(last) = messages.last_mut()
                {
                    last["reasoning_content"] = r.into();
                }
            }
            "function_call_output" => {
                let Some(call_id) = item["call_id"].as_str() else {
                    return Err(bad(
                        "a `function_call_output` item needs `call_id`",
                        "input",
                    ));
                };
                let output = text_of(&item["output"], "input")?;
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "reasoning" => {
                let mut text = text_of(&item["content"], "input")?;
                if text.is_empty() {
                    text = text_of(&item["summary"], "input")?;
                }
                reasoning.get_or_insert_with(String::new).push_str(&text);
            }
            "item_reference" => return Err(not_supported("item_reference", "input")),
            other => {
                return Err(bad(
                    format!(
                        "unsupported input item type {other:?}: supported are message, function_call, function_call_output and reasoning"
                    ),
                    "input",
                ));
            }
        }
    }
    Ok(messages)
}

/// Function tools as chat tools.
fn chat_tools(tools: &Value) -> Result<Option<Vec<Value>>, HttpError> {
    let list = match tools {
        Value::Null => return Ok(None),
        Value::Array(list) => list,
        _ => return Err(bad("`tools` must be a list", "tools")),
    };
    let mut out = Vec::with_capacity(list.len());
    for tool in list {
        match tool["type"].as_str() {
            Some("function") => {}
            other => {
                return Err(bad(
                    format!("unsupported tool type {other:?}: only `function` tools are supported"),
                    "tools",
                ));
            }
        }
        let Some(name) = tool["name"].as_str() else {
            return Err(bad("a function tool needs a `name`", "tools"));
        };
        let mut function = json!({"name": name});
        for key in ["description", "parameters", "strict"] {
            if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                function[key] = v.clone();
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Some(out))
}

/// `tool_choice` as the chat's, and the tool names an `allowed_tools` choice keeps.
fn chat_tool_choice(choice: &Value) -> Result<(Option<Value>, Option<Vec<String>>), HttpError> {
    let invalid = || {
        bad(
            "`tool_choice` must be none, auto, required, {\"type\": \"function\", \"name\": ...} or an allowed_tools choice of function tools",
            "tool_choice",
        )
    };
    match choice {
        Value::Null => Ok((None, None)),
        Value::String(s) if matches!(s.as_str(), "none" | "auto" | "required") => {
            Ok((Some(choice.clone()), None))
        }
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = o.get("name").and_then(Value::as_str).ok_or_else(invalid)?;
                Ok((
                    Some(json!({"type": "function", "function": {"name": name}})),
                    None,
                ))
            }
            Some("allowed_tools") => {
                let mode = o.get("mode").and_then(Value::as_str).unwrap_or("auto");
                if !matches!(mode, "auto" | "required") {
                    return Err(invalid());
                }
                let names = o
                    .get("tools")
                    .and_then(Value::as_array)
                    .ok_or_else(invalid)?
                    .iter()
                    .map(|t| match (t["type"].as_str(), t["name"].as_str()) {
                        (Some("function"), Some(n)) => Ok(n.to_owned()),
                        _ => Err(invalid()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((Some(mode.into()), Some(names)))
            }
            _ => Err(invalid()),
        },
        _ => Err(invalid()),
    }
}

/// The chat request of a Responses request, and the response object's fields that echo it.
fn translate(body: &Map<String, Value>) -> Result<(Value, Map<String, Value>), HttpError> {
    if let Some(unknown) = body.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(bad(format!("Unknown parameter: '{unknown}'."), unknown));
    }
    let model = model_field(body)?;
    for (key, what) in [
        ("previous_response_id", "previous_response_id"),
        ("conversation", "conversation"),
        ("prompt", "prompt"),
    ] {
        if body.get(key).is_some_and(|v| !v.is_null()) {
            return Err(not_supported(what, key));
        }
    }
    if body.get("background") == Some(&Value::Bool(true)) {
        return Err(not_supported("background: true", "background"));
    }
    let mut chat = json!({"model": model, "messages": chat_messages(body)?});
    for key in PASSTHROUGH {
        if let Some(v) = body.get(*key).filter(|v| !v.is_null()) {
            chat[*key] = v.clone();
        }
    }
    let null = Value::Null;
    let max = body.get("max_output_tokens").unwrap_or(&null);
    if !max.is_null() {
        chat["max_completion_tokens"] = max.clone();
    }
    let mut tools = chat_tools(body.get("tools").unwrap_or(&null))?;
    let (choice, allowed) = chat_tool_choice(body.get("tool_choice").unwrap_or(&null))?;
    if let (Some(names), Some(list)) = (allowed, tools.as_mut()) {
        list.retain(|t| {
            t["function"]["name"]
                .as_str()
                .is_some_and(|n| names.iter().any(|a| a == n))
        });
    }
    if let Some(list) = tools {
        chat["tools"] = list.into();
    }
    if let Some(c) = choice {
        chat["tool_choice"] = c;
    }
    let text = body.get("text").unwrap_or(&null);
    match text["format"]["type"].as_str() {
        None | Some("text") => {}
        Some("json_object") => chat["response_format"] = json!({"type": "json_object"}),
        Some("json_schema") => {
            let f = &text["format"];
            let mut schema =
                json!({"name": f["name"].as_str().unwrap_or("response"), "schema": f["schema"]});
            for key in ["strict", "description"] {
                if !f[key].is_null() {
                    schema[key] = f[key].clone();
                }
            }
            chat["response_format"] = json!({"type": "json_schema", "json_schema": schema});
        }
        Some(other) => {
            return Err(bad(
                format!(
                    "unsupported `text.format.type` {other:?}: use text, json_object or json_schema"
                ),
                "text",
            ));
        }
    }
    let reasoning = body.get("reasoning").unwrap_or(&null);
    if let Some(effort) = reasoning["effort"].as_str() {
        chat["reasoning_effort"] = effort.into();
    }
    // The fields the response object echoes (OpenAI's defaults where the request is silent).
    let pick = |key: &str, default: Value| {
        body.get(key)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    let mut echo = Map::new();
    echo.insert("model".into(), model.into());
    for (key, default) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        ("max_tool_calls", Value::Null),
        ("metadata", json!({})),
        ("parallel_tool_calls", true.into()),
        ("prompt_cache_key", Value::Null),
        ("reasoning", Value::Null),
        ("safety_identifier", Value::Null),
        ("service_tier", "auto".into()),
        ("temperature", 1.0.into()),
        ("text", json!({"format": {"type": "text"}})),
        ("tool_choice", "auto".into()),
        ("tools", json!([])),
        ("top_logprobs", 0.into()),
        ("top_p", 1.0.into()),
        ("truncation", "disabled".into()),
        ("user", Value::Null),
    ] {
        echo.insert(key.into(), pick(key, default));
    }
    for key in [
        "billing",
        "conversation",
        "previous_response_id",
        "prompt",
        "prompt_cache_retention",
    ] {
        echo.insert(key.into(), Value::Null);
    }
    echo.insert("background".into(), false.into());
    // Nothing is kept, whatever `store` asked.
    echo.insert("store".into(), false.into());
    Ok((chat, echo))
}

/// What an output item is.
#[derive(Debug)]
enum Kind {
    Reasoning(String),
    Message(String),
    Function {
        call_id: String,
        name: String,
        arguments: String,
    },
}

#[derive(Debug)]
struct Item {
    id: String,
    kind: Kind,
    /// `None` while open, else the item's final status.
    status: Option<&'static str>,
}

impl Item {
    fn json(&self) -> Value {
        let status = self.status.unwrap_or("in_progress");
        match &self.kind {
            Kind::Reasoning(text) => json!({"type": "reasoning", "id": self.id, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}], "status": status}),
            Kind::Message(text) => json!({"type": "message", "id": self.id, "role": "assistant",
                "status": status, "content": [output_text(text)]}),
            Kind::Function {
                call_id,
                name,
                arguments,
            } => json!({"type": "function_call", "id": self.id, "call_id": call_id,
                "name": name, "arguments": arguments, "status": status}),
        }
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// Folds chat events into the response object and its stream events.
struct Builder {
    id: String,
    created_at: u64,
    echo: Map<String, Value>,
    seq: u64,
    items: Vec<Item>,
    open_reasoning: Option<usize>,
    open_message: Option<usize>,
    tools: BTreeMap<u32, usize>,
    finish: Option<String>,
    usage: Option<ChatUsage>,
    /// The stream events not yet sent.
    events: Vec<Value>,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Builder {
    fn new(echo: Map<String, Value>) -> Self {
        Self {
            id: new_id("resp"),
            created_at: now(),
            echo,
            seq: 0,
            items: Vec::new(),
            open_reasoning: None,
            open_message: None,
            tools: BTreeMap::new(),
            finish: None,
            usage: None,
            events: Vec::new(),
        }
    }

    fn emit(&mut self, kind: &str, mut event: Value) {
        event["type"] = kind.into();
        event["sequence_number"] = self.seq.into();
        self.seq += 1;
        self.events.push(event);
    }

    /// The response object with `status`.
    fn response(&self, status: &str, error: Value, incomplete: Value) -> Value {
        let mut r = self.echo.clone();
        r.insert("id".into(), self.id.clone().into());
        r.insert("object".into(), "response".into());
        r.insert("created_at".into(), self.created_at.into());
        let done = !matches!(status, "in_progress" | "queued");
        r.insert(
            "completed_at".into(),
            if done { now().into() } else { Value::Null },
        );
        r.insert("status".into(), status.into());
        r.insert("error".into(), error);
        r.insert("incomplete_details".into(), incomplete);
        r.insert(
            "output".into(),
            self.items.iter().map(Item::json).collect::<Vec<_>>().into(),
        );
        let usage = self.usage.map_or(Value::Null, |u| {
            json!({
                "input_tokens": u.prompt,
                "input_tokens_details": {"cached_tokens": u.cached},
                "output_tokens": u.completion,
                "output_tokens_details": {"reasoning_tokens": u.reasoning},
                "total_tokens": u.prompt + u.completion,
            })
        });
        r.insert("usage".into(), usage);
        Value::Object(r)
    }

    fn start(&mut self) {
        let r = self.response("in_progress", Value::Null, Value::Null);
        self.emit("response.created", json!({"response": r}));
        self.emit("response.in_progress", json!({"response": r}));
    }

    fn open(&mut self, kind: Kind, prefix: &str) -> usize {
        let index = self.items.len();
        self.items.push(Item {
            id: new_id(prefix),
            kind,
            status: None,
        });
        let item = self.items[index].json();
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        let part = match self.items[index].kind {
            Kind::Reasoning(_) => Some(json!({"type": "reasoning_text", "text": ""})),
            Kind::Message(_) => Some(output_text("")),
            Kind::Function { .. } => None,
        };
        if let Some(part) = part {
            let item_id = self.items[index].id.clone();
            self.emit(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
            );
        }
        index
    }

    fn close(&mut self, index: usize, status: &'static str) {
        let Some(item) = self.items.get_mut(index) else {
            return;
        };
        if item.status.is_some() {
            return;
        }
        item.status = Some(status);
        let item_id = item.id.clone();
        let ids = json!({"item_id": item_id, "output_index": index});
        let with = |extra: Value| {
            let mut v = ids.clone();
            if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
                v.extend(extra);
            }
            v
        };
        match &self.items[index].kind {
            Kind::Reasoning(text) => {
                let text = text.clone();
                self.emit(
                    "response.reasoning_text.done",
                    with(json!({"content_index": 0, "text": text})),
                );
                self.emit(
                    "response.content_part.done",
                    with(
                        json!({"content_index": 0, "part": {"type": "reasoning_text", "text": text}}),
                    ),
                );
            }
            Kind::Message(text) => {
                let text = text.clone();
                self.emit(
                    "response.output_text.done",
                    with(json!({"content_index": 0, "text": text, "logprobs": []})),
                );
                self.emit(
                    "response.content_part.done",
                    with(json!({"content_index": 0, "part": output_text(&text)})),
                );
            }
            Kind::Function {
                name, arguments, ..
            } => {
                let (name, arguments) = (name.clone(), arguments.clone());
                self.emit(
                    "response.function_call_arguments.done",
                    with(json!({"name": name, "arguments": arguments})),
                );
            }
        }
        let item = self.items[index].json();
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }

    fn on(&mut self, event: ChatEvent) {
        match event {
            ChatEvent::Reasoning(delta) => {
                if let Some(m) = self.open_message.take() {
                    self.close(m, "completed");
                }
                let index = match self.open_reasoning {
                    Some(i) => i,
                    None => {
                        let i = self.open(Kind::Reasoning(String::new()), "rs");
                        self.open_reasoning = Some(i);
                        i
                    }
                };
                if let Kind::Reasoning(text) = &mut self.items[index].kind {
                    text.push_str(&delta);
                }
                let item_id = self.items[index].id.clone();
                self.emit(
                    "response.reasoning_text.delta",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta}),
                );
            }
            ChatEvent::Text(delta) => {
                if let Some(r) = self.open_reasoning.take() {
                    self.close(r, "completed");
                }
                let index = match self.open_message {
                    Some(i) => i,
                    None => {
                        let i = self.open(Kind::Message(String::new()), "msg");
                        self.open_message = Some(i);
                        i
                    }
                };
                if let Kind::Message(text) = &mut self.items[index].kind {
                    text.push_str(&delta);
                }
                let item_id = self.items[index].id.clone();
                self.emit(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0,
                        "delta": delta, "logprobs": []}),
                );
            }
            ChatEvent::ToolStart { index, id, name } => {
                for open in [self.open_reasoning.take(), self.open_message.take()]
                    .into_iter()
                    .flatten()
                {
                    self.close(open, "completed");
                }
                let item = self.open(
                    Kind::Function {
                        call_id: id,
                        name,
                        arguments: String::new(),
                    },
                    "fc",
                );
                self.tools.insert(index, item);
            }
            ChatEvent::ToolArgs { index, delta } => {
                let Some(&item) = self.tools.get(&index) else {
                    return;
                };
                if let Kind::Function { arguments, .. } = &mut self.items[item].kind {
                    arguments.push_str(&delta);
                }
                let item_id = self.items[item].id.clone();
                self.emit(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": item, "delta": delta}),
                );
            }
            ChatEvent::Finish(reason) => self.finish = Some(reason),
            ChatEvent::Usage(u) => self.usage = Some(u),
        }
    }

    /// Close every open item and answer the final response (and its terminal event).
    fn end(&mut self) -> Value {
        let incomplete = match self.finish.as_deref() {
            Some("length") => Some("max_output_tokens"),
            Some("content_filter") => Some("content_filter"),
            _ => None,
        };
        let item_status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        for index in 0..self.items.len() {
            self.close(index, item_status);
        }
        let (status, details, event) = match incomplete {
            Some(reason) => (
                "incomplete",
                json!({"reason": reason}),
                "response.incomplete",
            ),
            None => ("completed", Value::Null, "response.completed"),
        };
        let r = self.response(status, Value::Null, details);
        self.emit(event, json!({"response": r}));
        r
    }

    fn fail(&mut self, e: &HttpError) {
        let error = json!({"code": "server_error", "message": e.message});
        let r = self.response("failed", error, Value::Null);
        self.emit("response.failed", json!({"response": r}));
    }

    /// The pending events as SSE frames.
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

/// `POST /v1/responses`.
pub(super) async fn responses(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    match create(shared, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn parse(shared: &Shared, body: Result<Bytes, HttpError>) -> Result<Map<String, Value>, HttpError> {
    let body = body?;
    if !shared.statics.is_enabled("responses") {
        return Err(HttpError::new(404, "not found"));
    }
    json_object(&body)
}

async fn create(
    shared: Arc<Shared>,
    body: Result<Bytes, HttpError>,
) -> Result<Response, HttpError> {
    let body = parse(&shared, body)?;
    let streaming = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("'stream' must be a boolean", "stream")),
    };
    let (chat, echo) = translate(&body)?;
    let mut stream = ChatStream::open(shared, chat, rename).await?;
    let mut builder = Builder::new(echo);
    if !streaming {
        while let Some(event) = stream.next().await {
            builder.on(event?);
        }
        return Ok(json_response(&builder.end()));
    }
    builder.start();
    let first = builder.drain_sse();
    // The body owns the chat stream: a client that disconnects drops it, which stops the
    // generation on the worker.
    let rest = futures_util::stream::unfold(Some((stream, builder)), |state| async move {
        let (mut stream, mut builder) = state?;
        let next = match stream.next().await {
            Some(Ok(event)) => {
                builder.on(event);
                let out = builder.drain_sse();
                Some((out, Some((stream, builder))))
            }
            Some(Err(e)) => {
                builder.fail(&e);
                Some((builder.drain_sse(), None))
            }
            None => {
                builder.end();
                let mut out = builder.drain_sse();
                out.extend_from_slice(super::respond::DONE);
                Some((out, None))
            }
        };
        next.map(|(bytes, state)| (Ok::<_, Infallible>(Bytes::from(bytes)), state))
    });
    let head = futures_util::stream::once(async move { Ok::<_, Infallible>(Bytes::from(first)) });
    Ok(sse_headers(Body::from_stream(
        futures_util::StreamExt::chain(head, rest),
    )))
}

/// `POST /v1/responses/input_tokens`: the prompt tokens the request would take.
pub(super) async fn input_tokens(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody,
) -> Response {
    let result = parse(&shared, body).and_then(|mut body| {
        // Generation options do not change the count.
        body.remove("stream");
        let (chat, _) = translate(&body)?;
        count_prompt_tokens(&shared, &chat, rename)
    });
    match result {
        Ok(n) => json_response(&json!({"object": "response.input_tokens", "input_tokens": n})),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("object")
    }

    #[test]
    fn input_items_become_chat_messages() {
        let body = obj(json!({
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather in "}, {"type": "input_text", "text": "Paris?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny at noon."}]},
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                      {"type": "function", "name": "get_time"}],
            "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]},
            "max_output_tokens": 64,
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
        }));
        let (chat, echo) = translate(&body).expect("valid");
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": null, "reasoning_content": "call it", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "c2", "content": "noon"},
                {"role": "assistant", "content": "Sunny at noon."},
            ])
        );
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "get_time"}}])
        );
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["max_completion_tokens"], 64);
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["response_format"]["json_schema"]["name"], "w");
        assert_eq!(echo["max_output_tokens"], 64);
        assert_eq!(echo["store"], false);
    }

    #[test]
    fn unsupported_requests_are_refused_with_the_parameter() {
        let cases = [
            (
                json!({"model": "m", "input": "x", "bogus": 1}),
                400,
                "bogus",
            ),
            (
                json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
                501,
                "previous_response_id",
            ),
            (
                json!({"model": "m", "input": "x", "background": true}),
                501,
                "background",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                400,
                "tools",
            ),
            (json!({"model": "m", "input": 5}), 400, "input"),
            (json!({"model": "m"}), 400, "input"),
            (json!({"input": "x"}), 400, "model"),
            (
                json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}),
                501,
                "input",
            ),
            (
                json!({"model": "m", "input": "x", "tool_choice": {"type": "web_search"}}),
                400,
                "tool_choice",
            ),
        ];
        for (body, status, param) in cases {
            let e = translate(&obj(body.clone())).expect_err("refused");
            assert_eq!(
                (e.status, e.param.as_deref()),
                (status, Some(param)),
                "{body}"
            );
        }
    }

    fn run(events: Vec<ChatEvent>) -> (Value, Vec<Value>) {
        let mut b = Builder::new(Map::new());
        b.start();
        for e in events {
            b.on(e);
        }
        let r = b.end();
        (r, b.events)
    }

    #[test]
    fn reasoning_text_and_tool_calls_become_output_items_and_events() {
        let (r, events) = run(vec![
            ChatEvent::Reasoning("let me ".into()),
            ChatEvent::Reasoning("check".into()),
            ChatEvent::Text("Checking.".into()),
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
                prompt: 10,
                completion: 5,
                cached: 0,
                reasoning: 2,
            }),
        ]);
        assert_eq!(r["status"], "completed");
        let output = r["output"].as_array().expect("output");
        assert_eq!(output[0]["type"], "reasoning");
        assert_eq!(output[0]["content"][0]["text"], "let me check");
        assert_eq!(output[1]["content"][0]["text"], "Checking.");
        assert_eq!(output[2]["type"], "function_call");
        assert_eq!(output[2]["call_id"], "call_1");
        assert_eq!(output[2]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(r["usage"]["total_tokens"], 15);
        assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let seq: Vec<u64> = events
            .iter()
            .filter_map(|e| e["sequence_number"].as_u64())
            .collect();
        assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
    }

    #[test]
    fn the_output_limit_makes_the_response_incomplete() {
        let (r, events) = run(vec![
            ChatEvent::Text("trunc".into()),
            ChatEvent::Finish("length".into()),
        ]);
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["output"][0]["status"], "incomplete");
        assert_eq!(
            events.last().expect("events")["type"],
            "response.incomplete"
        );
    }

    #[test]
    fn parallel_calls_keep_their_own_items() {
        let (r, _) = run(vec![
            ChatEvent::ToolStart {
                index: 0,
                id: "a".into(),
                name: "f".into(),
            },
            ChatEvent::ToolStart {
                index: 1,
                id: "b".into(),
                name: "g".into(),
            },
            ChatEvent::ToolArgs {
                index: 0,
                delta: "{}".into(),
            },
            ChatEvent::ToolArgs {
                index: 1,
                delta: "{\"x\":1}".into(),
            },
            ChatEvent::Finish("tool_calls".into()),
        ]);
        assert_eq!(r["output"][0]["arguments"], "{}");
        assert_eq!(r["output"][1]["arguments"], "{\"x\":1}");
        assert_eq!(r["output"][1]["name"], "g");
    }
}
