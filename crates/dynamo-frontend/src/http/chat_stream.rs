//! What the Responses and Anthropic Messages surfaces share: each translates its request
//! into a streamed chat completion, runs it through the ordinary chat path
//! ([`openai_routes::chat_completions_bytes`]: preprocessing, tool-call and reasoning
//! parsing, routing, migration, detokenising, metrics) and translates the chat chunks back.
//!
//! [`ChunkDecoder`] turns OpenAI chat chunks (`delta.content`, `delta.reasoning_content`,
//! `delta.tool_calls[{index, id, type, function: {name, arguments}}]`, `finish_reason`,
//! `usage`) into a flat sequence of [`ChatEvent`]s that both surfaces fold into their own
//! events; so neither has generation code of its own, and a feature of the chat path (a
//! parser, a router) reaches them without change.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use axum::body::Bytes;
use serde_json::Value;

use super::Shared;
use super::error::HttpError;
use super::openai_routes;
use super::realtime::SseLines;
use super::respond;

/// One step of a chat completion, surface-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ChatEvent {
    /// Reasoning text (`delta.reasoning_content`).
    Reasoning(String),
    /// Answer text (`delta.content`).
    Text(String),
    /// A tool call begins: the chat chunk's call index, its id and function name.
    ToolStart {
        /// `tool_calls[].index`.
        index: u32,
        /// `tool_calls[].id`.
        id: String,
        /// `tool_calls[].function.name`.
        name: String,
    },
    /// A piece of a tool call's JSON arguments.
    ToolArgs {
        /// `tool_calls[].index`.
        index: u32,
        /// The piece.
        delta: String,
    },
    /// The chat `finish_reason` (`stop`, `length`, `tool_calls`, `content_filter`, ...).
    Finish(String),
    /// The token counts of the request.
    Usage(ChatUsage),
}

/// The chat usage of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ChatUsage {
    pub(super) prompt: u64,
    pub(super) completion: u64,
    /// Prompt tokens served from the prefix cache.
    pub(super) cached: u64,
    /// Completion tokens spent on reasoning, when the chat path reports them.
    pub(super) reasoning: u64,
}

impl ChatUsage {
    fn from_json(u: &Value) -> Self {
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        Self {
            prompt: n(&u["prompt_tokens"]),
            completion: n(&u["completion_tokens"]),
            cached: n(&u["prompt_tokens_details"]["cached_tokens"]),
            reasoning: n(&u["completion_tokens_details"]["reasoning_tokens"]),
        }
    }
}

/// A fresh id with `prefix` (`resp`, `msg`, `fc`, `toolu`, ...).
pub(super) fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}_{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

/// Turns chat chunks into [`ChatEvent`]s (the first delta of a tool-call index starts the
/// call; later deltas of the index carry argument pieces).
///
/// Blank text that would open a text block (the `\n\n` a model writes between `</think>` and
/// its tool call) is held until it is known to matter: it is dropped before a tool call and at
/// the end after one (the chat path's `null` content beside calls), and released with the
/// next text, before reasoning, or at an end without calls. So neither surface shows an empty
/// text block or message item next to a call.
#[derive(Debug, Default)]
pub(super) struct ChunkDecoder {
    started: BTreeSet<u32>,
    /// Whether the last event was text (blank text then continues a block).
    in_text: bool,
    /// Blank text held at the start of a would-be text block.
    blank: String,
}

impl ChunkDecoder {
    /// The events of one chat chunk (of choice 0), in the order the surfaces need them:
    /// reasoning, text, tool calls, usage, finish.
    pub(super) fn decode(&mut self, chunk: &Value, out: &mut impl Extend<ChatEvent>) {
        let choice = &chunk["choices"][0];
        // A worker that answers one whole message instead of deltas still translates.
        let delta = match (&choice["delta"], &choice["message"]) {
            (Value::Object(_), _) => &choice["delta"],
            (_, m) => m,
        };
        let reasoning = delta["reasoning_content"]
            .as_str()
            .or_else(|| delta["reasoning"].as_str());
        if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
            self.release_blank(out);
            self.in_text = false;
            out.extend([ChatEvent::Reasoning(r.to_owned())]);
        }
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            if !self.in_text && t.trim().is_empty() {
                self.blank.push_str(t);
            } else {
                let text = std::mem::take(&mut self.blank) + t;
                self.in_text = true;
                out.extend([ChatEvent::Text(text)]);
            }
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for (position, call) in calls.iter().enumerate() {
                let index = call["index"]
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX));
                let function = &call["function"];
                if self.started.insert(index) {
                    // Blank text before a call is no content (as the chat path's `null`).
                    self.blank.clear();
                    self.in_text = false;
                    let id = call["id"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map_or_else(|| new_id("call"), str::to_owned);
                    let name = function["name"].as_str().unwrap_or_default().to_owned();
                    out.extend([ChatEvent::ToolStart { index, id, name }]);
                }
                if let Some(args) = function["arguments"].as_str().filter(|a| !a.is_empty()) {
                    out.extend([ChatEvent::ToolArgs {
                        index,
                        delta: args.to_owned(),
                    }]);
                }
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            out.extend([ChatEvent::Usage(ChatUsage::from_json(u))]);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.end(out);
            out.extend([ChatEvent::Finish(f.to_owned())]);
        }
    }

    /// The output ended: held blank text is content unless a tool call came before it.
    pub(super) fn end(&mut self, out: &mut impl Extend<ChatEvent>) {
        if self.started.is_empty() {
            self.release_blank(out);
        } else {
            self.blank.clear();
        }
    }

    fn release_blank(&mut self, out: &mut impl Extend<ChatEvent>) {
        if !self.blank.is_empty() {
            out.extend([ChatEvent::Text(std::mem::take(&mut self.blank))]);
        }
    }
}

/// The error a failed chat response carries (its status, message and parameter), with
/// parameter names mapped through `rename` into the caller's surface.
async fn error_of(response: axum::response::Response, rename: fn(&str) -> String) -> HttpError {
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let v = serde_json::from_slice::<Value>(&body).unwrap_or_default();
    let error = &v["error"];
    HttpError {
        status,
        message: error["message"].as_str().map_or_else(
            || String::from_utf8_lossy(&body).into_owned(),
            str::to_owned,
        ),
        param: error["param"].as_str().map(rename),
    }
}

/// A streamed chat completion, as [`ChatEvent`]s.
pub(super) struct ChatStream {
    sse: SseLines,
    decoder: ChunkDecoder,
    pending: VecDeque<ChatEvent>,
    finished: bool,
    ended: bool,
}

impl ChatStream {
    /// Run `body` (a chat completion request; `stream` and `include_usage` are set here)
    /// through the chat path.
    ///
    /// # Errors
    /// The chat path's error (status, message, parameter renamed by `rename`) when it
    /// refuses the request before streaming.
    pub(super) async fn open(
        shared: Arc<Shared>,
        mut body: Value,
        rename: fn(&str) -> String,
    ) -> Result<Self, HttpError> {
        body["stream"] = true.into();
        body["stream_options"] = serde_json::json!({"include_usage": true});
        let response =
            openai_routes::chat_completions_bytes(shared, Bytes::from(body.to_string())).await;
        if !response.status().is_success() {
            return Err(error_of(response, rename).await);
        }
        Ok(Self {
            sse: SseLines::new(response.into_body()),
            decoder: ChunkDecoder::default(),
            pending: VecDeque::new(),
            finished: false,
            ended: false,
        })
    }

    /// The next event; `None` after the last. A stream that ends without a finish reason
    /// (a text worker that just stops) ends with `Finish("stop")`.
    ///
    /// # Errors
    /// An error the chat path reported mid-stream (the stream ends after it).
    pub(super) async fn next(&mut self) -> Option<Result<ChatEvent, HttpError>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                if matches!(e, ChatEvent::Finish(_)) {
                    self.finished = true;
                }
                return Some(Ok(e));
            }
            if self.ended {
                return None;
            }
            let Some(data) = self.sse.next().await else {
                self.ended = true;
                if !self.finished {
                    self.decoder.end(&mut self.pending);
                    self.pending.push_back(ChatEvent::Finish("stop".into()));
                }
                continue;
            };
            let Ok(chunk) = serde_json::from_slice::<Value>(&data) else {
                continue;
            };
            if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
                self.ended = true;
                let message = error["message"]
                    .as_str()
                    .unwrap_or("generation failed")
                    .to_owned();
                let status = match error["type"].as_str() {
                    Some("invalid_request_error") => 400,
                    Some("service_unavailable") => 503,
                    _ => 500,
                };
                return Some(Err(HttpError::new(status, message)));
            }
            self.decoder.decode(&chunk, &mut self.pending);
        }
    }
}

/// A tool call's arguments as the JSON object Anthropic's `tool_use.input` needs: the
/// arguments parsed, `{}` when they are empty, and `{"arguments": text}` when they are not
/// a JSON object (so no text is lost).
pub(super) fn arguments_object(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => serde_json::json!({"arguments": arguments}),
    }
}

/// A chat-path request for counting a conversation's prompt tokens: the templated prompt
/// of `chat` (a chat request body) on the model's own preprocessor.
///
/// # Errors
/// 404 for an unknown model; 400 for a model without a tokenizer here (a text model, an
/// in-process OpenAI engine) and for a request the chat path would refuse.
pub(super) fn count_prompt_tokens(
    shared: &Shared,
    chat: &Value,
    rename: fn(&str) -> String,
) -> Result<u64, HttpError> {
    use super::static_engine::StaticTarget;
    let model = chat["model"].as_str().unwrap_or_default();
    let rename_err = |e: HttpError| HttpError {
        param: e.param.as_deref().map(rename),
        ..e
    };
    let request = dynamo_llm::preprocessor::openai::parse_chat_request(chat.to_string().as_bytes())
        .map_err(|e| rename_err(e.into()))?;
    let count = |p: &dynamo_llm::preprocessor::Preprocessor| {
        p.preprocess_chat(&request)
            .map(|r| r.token_ids.len() as u64)
            .map_err(|e| rename_err(e.into()))
    };
    let no_tokenizer = || {
        HttpError::bad_request(
            format!(
                "The model `{model}` has no tokenizer in this frontend: its prompt tokens cannot be counted here."
            ),
            Some("model".into()),
        )
    };
    match shared.statics.resolve(model, respond::Surface::Chat) {
        Some(StaticTarget::Tokens(m)) => return count(&m.preprocessor),
        Some(StaticTarget::OpenAi(_)) => return Err(no_tokenizer()),
        None => {}
    }
    let entry = shared
        .models
        .get(model)
        .filter(|e| e.card.model_type.supports_chat())
        .ok_or_else(|| HttpError::model_not_found(model))?;
    match entry.preprocessor.as_ref() {
        Some(p) if entry.is_tokens() => count(p),
        _ => Err(no_tokenizer()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(chunks: &[Value]) -> Vec<ChatEvent> {
        let mut d = ChunkDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.decode(c, &mut out);
        }
        out
    }

    #[test]
    fn chunks_become_events_in_order() {
        let events = decode(&[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "hmm"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "{\"a\":"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": "1}"}},
                {"index": 1, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 4}}}),
        ]);
        assert_eq!(
            events,
            vec![
                ChatEvent::Reasoning("hmm".into()),
                ChatEvent::Text("Hi".into()),
                ChatEvent::ToolStart {
                    index: 0,
                    id: "call_1".into(),
                    name: "f".into()
                },
                ChatEvent::ToolArgs {
                    index: 0,
                    delta: "{\"a\":".into()
                },
                ChatEvent::ToolArgs {
                    index: 0,
                    delta: "1}".into()
                },
                ChatEvent::ToolStart {
                    index: 1,
                    id: "call_2".into(),
                    name: "g".into()
                },
                ChatEvent::ToolArgs {
                    index: 1,
                    delta: "{}".into()
                },
                ChatEvent::Finish("tool_calls".into()),
                ChatEvent::Usage(ChatUsage {
                    prompt: 7,
                    completion: 3,
                    cached: 4,
                    reasoning: 0
                }),
            ]
        );
    }

    #[test]
    fn a_whole_message_and_a_missing_id_still_translate() {
        let events = decode(&[json!({"choices": [{"index": 0, "message": {
            "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            "finish_reason": "stop"}]})]);
        assert_eq!(events[0], ChatEvent::Text("x".into()));
        match &events[1] {
            ChatEvent::ToolStart { index: 0, id, name } => {
                assert!(id.starts_with("call_"), "{id}");
                assert_eq!(name, "f");
            }
            other => panic!("{other:?}"),
        }
    }

    fn content(text: &str) -> Value {
        json!({"choices": [{"index": 0, "delta": {"content": text}}]})
    }

    fn call(index: u32) -> Value {
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index,
            "id": format!("call_{index}"), "function": {"name": "f", "arguments": "{}"}}]}}]})
    }

    fn finish(reason: &str) -> Value {
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    }

    fn texts(events: &[ChatEvent]) -> Vec<&str> {
        events
            .iter()
            .filter_map(|e| match e {
                ChatEvent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn blank_text_beside_calls_opens_no_text_block() {
        let think = json!({"choices": [{"index": 0, "delta": {"reasoning_content": "r"}}]});
        // `</think>\n\n<tool_call>...`: no text at all.
        let events = decode(&[
            think.clone(),
            content("\n"),
            content("\n"),
            call(0),
            finish("tool_calls"),
        ]);
        assert!(texts(&events).is_empty(), "{events:?}");
        // Blank text after the calls is dropped too.
        let events = decode(&[
            call(0),
            content("\n"),
            call(1),
            content(" \n"),
            finish("tool_calls"),
        ]);
        assert!(texts(&events).is_empty(), "{events:?}");
        // Text that goes on keeps its blank start; blank text inside a block stays.
        let events = decode(&[
            content("\n"),
            content("Hi"),
            content("\n"),
            call(0),
            finish("tool_calls"),
        ]);
        assert_eq!(texts(&events), ["\nHi", "\n"]);
        // Without calls, blank text is the content (here, all of it).
        let events = decode(&[think, content("\n\n"), finish("stop")]);
        assert_eq!(texts(&events), ["\n\n"]);
        assert_eq!(events.last(), Some(&ChatEvent::Finish("stop".into())));
        let events = decode(&[
            content("\n"),
            json!({"choices": [{"index": 0, "delta": {"reasoning_content": "r"}}]}),
        ]);
        assert_eq!(events[0], ChatEvent::Text("\n".into()));
    }

    #[test]
    fn arguments_that_are_not_an_object_keep_their_text() {
        assert_eq!(arguments_object(""), json!({}));
        assert_eq!(arguments_object("{\"a\": [1]}"), json!({"a": [1]}));
        assert_eq!(arguments_object("[1"), json!({"arguments": "[1"}));
    }
}
