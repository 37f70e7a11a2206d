//! OpenAI chat-completions and completions request and response types.
//!
//! Requests accept every documented OpenAI field (the official clients send several that
//! this server does not act on, such as `user`, `store`, `metadata` or
//! `parallel_tool_calls`) plus the common engine extensions (`top_k`, `min_p`,
//! `repetition_penalty`, `ignore_eos`, `min_tokens`, `chat_template_kwargs`, `nvext`, ...).
//! Any other top-level field is rejected the way OpenAI does it ("Unrecognized request
//! argument supplied: …", HTTP 400): see [`parse_chat_request`] and
//! [`parse_completion_request`].

use bytes::BufMut;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One string or several (`stop`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StringOrList {
    /// A single string.
    One(String),
    /// A list of strings.
    Many(Vec<String>),
}

impl StringOrList {
    /// The strings, in order.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (and `choices: []`).
    #[serde(default)]
    pub include_usage: bool,
    /// Send usage on every chunk (accepted; OpenAI's newer option).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous_usage_stats: Option<bool>,
    /// Obfuscation padding (accepted and ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_obfuscation: Option<bool>,
}

/// Author of a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System prompt.
    System,
    /// OpenAI's newer name for system prompts of reasoning models.
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
    /// Legacy function result.
    Function,
}

/// One part of an array-valued message `content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image (passed to the template as is).
    ImageUrl {
        /// `{"url": ..., "detail": ...}`.
        image_url: serde_json::Value,
    },
    /// Audio input.
    InputAudio {
        /// `{"data": ..., "format": ...}`.
        input_audio: serde_json::Value,
    },
    /// A video (engine extension).
    VideoUrl {
        /// `{"url": ...}`.
        video_url: serde_json::Value,
    },
    /// A file.
    File {
        /// File reference.
        file: serde_json::Value,
    },
    /// An assistant refusal.
    Refusal {
        /// The refusal text.
        refusal: String,
    },
}

/// Message `content`: a string, or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts.
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text of the content: the string, or the text parts joined by newlines
    /// (what chat templates that expect a string get).
    pub fn text(&self) -> String {
        match self {
            Self::Text(s) => s.clone(),
            Self::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Whether every part is text (so the content can be flattened to a string).
    pub fn is_text_only(&self) -> bool {
        match self {
            Self::Text(_) => true,
            Self::Parts(parts) => parts.iter().all(|p| matches!(p, ContentPart::Text { .. })),
        }
    }
}

/// A chat message. Fields other than `role` and `content` (`name`, `tool_calls`,
/// `tool_call_id`, `reasoning_content`, ...) are kept and passed to the chat template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Author.
    pub role: Role,
    /// Content (may be absent on assistant messages with tool calls).
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `POST /v1/chat/completions` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    /// Served model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Stream chunks as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Deprecated output limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Output limit (includes reasoning tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature, 0..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling, (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Number of choices (only 1 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StringOrList>,
    /// -2..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// -2..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Token id → bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Return log probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Top alternatives per token, 0..=20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// End-user id (accepted, ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Tools the model may call (passed to the template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<serde_json::Value>>,
    /// `none` | `auto` | `required` | a named tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<serde_json::Value>,
    /// Accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Legacy functions (accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<Vec<serde_json::Value>>,
    /// Legacy function call (accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<serde_json::Value>,
    /// `text` | `json_object` | `json_schema` (accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<serde_json::Value>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modalities: Option<Vec<String>>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<serde_json::Value>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<serde_json::Value>,
    /// Passed to the template as `reasoning_effort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_options: Option<serde_json::Value>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
    /// Accepted, ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_identifier: Option<String>,
    /// Top-k sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// Min-p sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Repetition penalty (> 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Keep generating past eos tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// Do not stop (on eos or stop strings) before this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Extra stop token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Keep the matched stop string in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// Drop special tokens from the text (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Dynamo's extension object (annotations, routing hints; passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<serde_json::Value>,
    /// Extra variables for the chat template (alias `chat_template_args`).
    #[serde(
        default,
        alias = "chat_template_args",
        skip_serializing_if = "Option::is_none"
    )]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Continue the last (assistant) message instead of starting a new turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// Override `add_generation_prompt` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
}

/// Engine extensions accepted by both request kinds (vLLM / Dynamo names); see
/// [`ChatCompletionRequest::ext`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingExtensions {
    /// Top-k sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// Min-p sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Repetition penalty (> 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Keep generating past eos tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// Do not stop (on eos or stop strings) before this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Extra stop token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Keep the matched stop string in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// Drop special tokens from the text (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Dynamo's extension object (annotations, routing hints; passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<serde_json::Value>,
}

/// The `prompt` of a completions request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Several texts (only one is supported).
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Several token lists (only one is supported).
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// Served model name.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Stream chunks as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Output limit (OpenAI's default is 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature, 0..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling, (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Number of choices (only 1 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Server-side candidates (only 1 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<u32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StringOrList>,
    /// -2..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// -2..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Token id → bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Top alternatives per token, 0..=5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Echo the prompt before the completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Text after the completion (not supported: must be absent or empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// End-user id (accepted, ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Top-k sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// Min-p sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Repetition penalty (> 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Keep generating past eos tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// Do not stop (on eos or stop strings) before this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Extra stop token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Keep the matched stop string in the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// Drop special tokens from the text (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Dynamo's extension object (annotations, routing hints; passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<serde_json::Value>,
}

/// Parse a JSON body, turning serde's messages into OpenAI-style 400 errors.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| {
        let msg = e.to_string();
        if let Some(rest) = msg.strip_prefix("unknown field `")
            && let Some(end) = rest.find('`')
        {
            let field = &rest[..end];
            return Error::request(
                format!("Unrecognized request argument supplied: {field}"),
                Some(field),
            );
        }
        if let Some(rest) = msg.strip_prefix("missing field `")
            && let Some(end) = rest.find('`')
        {
            let field = &rest[..end];
            return Error::request(
                format!("Missing required parameter: '{field}'."),
                Some(field),
            );
        }
        if e.is_syntax() || e.is_eof() {
            return Error::request(
                format!("We could not parse the JSON body of your request: {msg}"),
                None,
            );
        }
        // A value of the wrong type: parse again (failures only, so the hot path pays
        // nothing) tracking the path, to name the field (`messages`, `messages[0].role`).
        let mut de = serde_json::Deserializer::from_slice(body);
        match serde_path_to_error::deserialize::<_, T>(&mut de) {
            Err(e) if e.path().to_string() != "." => {
                let path = e.path().to_string();
                Error::request(
                    format!("Invalid value for '{path}': {}", e.inner()),
                    Some(&path),
                )
            }
            _ => Error::request(format!("Invalid request body: {msg}"), None),
        }
    })
}

/// Parse and validate a chat-completions body.
///
/// # Errors
/// [`Error::InvalidRequest`] (HTTP 400) naming the parameter where possible.
pub fn parse_chat_request(body: &[u8]) -> Result<ChatCompletionRequest> {
    let req: ChatCompletionRequest = parse_body(body)?;
    req.validate()?;
    Ok(req)
}

/// Parse and validate a completions body.
///
/// # Errors
/// [`Error::InvalidRequest`] (HTTP 400) naming the parameter where possible.
pub fn parse_completion_request(body: &[u8]) -> Result<CompletionRequest> {
    let req: CompletionRequest = parse_body(body)?;
    req.validate()?;
    Ok(req)
}

fn check_range(value: Option<f32>, lo: f32, hi: f32, param: &str) -> Result<()> {
    match value {
        Some(v) if !(v.is_finite() && v >= lo && v <= hi) => Err(Error::request(
            format!("{v} is not a valid value for '{param}': must be between {lo} and {hi}."),
            Some(param),
        )),
        _ => Ok(()),
    }
}

/// Most stop sequences per request (OpenAI allows 4; engines commonly allow more).
pub const MAX_STOP_SEQUENCES: usize = 16;

/// The most choices (`n`) one request may ask for.
pub const MAX_CHOICES: u32 = 128;

#[expect(
    clippy::too_many_arguments,
    reason = "one flat list of the parameters both request kinds share"
)]
fn validate_common(
    stream: Option<bool>,
    stream_options: Option<&StreamOptions>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<u32>,
    penalties: [(Option<f32>, &str); 2],
    stop: Option<&StringOrList>,
    ext: &SamplingExtensions,
) -> Result<()> {
    check_range(temperature, 0.0, 2.0, "temperature")?;
    if let Some(p) = top_p
        && !(p.is_finite() && p > 0.0 && p <= 1.0)
    {
        return Err(Error::request(
            format!("{p} is not a valid value for 'top_p': must be greater than 0 and at most 1."),
            Some("top_p"),
        ));
    }
    for (v, param) in penalties {
        check_range(v, -2.0, 2.0, param)?;
    }
    // Each choice is its own generation: bound the fan-out of one request (the
    // reference's range and message).
    if let Some(n) = n
        && !(1..=MAX_CHOICES).contains(&n)
    {
        return Err(Error::request(
            format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
            Some("n"),
        ));
    }
    if stream_options.is_some() && stream != Some(true) {
        return Err(Error::request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            Some("stream_options"),
        ));
    }
    if let Some(stop) = stop {
        let count = match stop {
            StringOrList::One(_) => 1,
            StringOrList::Many(v) => v.len(),
        };
        if count > MAX_STOP_SEQUENCES {
            return Err(Error::request(
                format!("at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {count}."),
                Some("stop"),
            ));
        }
    }
    if let Some(r) = ext.repetition_penalty
        && !(r.is_finite() && r > 0.0)
    {
        return Err(Error::request(
            format!("{r} is not a valid value for 'repetition_penalty': must be > 0."),
            Some("repetition_penalty"),
        ));
    }
    check_range(ext.min_p, 0.0, 1.0, "min_p")?;
    // -1 and 0 are the engines' (vLLM's) "no top-k"; anything lower is a mistake.
    if let Some(k) = ext.top_k
        && k < -1
    {
        return Err(Error::request(
            format!(
                "{k} is not a valid value for 'top_k': must be -1 or 0 (disabled), or at least 1."
            ),
            Some("top_k"),
        ));
    }
    check_object(ext.nvext.as_ref(), "nvext")?;
    Ok(())
}

/// JSON's name for the kind of `v` (for error messages).
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// `value`, when present, must be a JSON object.
fn check_object(value: Option<&serde_json::Value>, param: &str) -> Result<()> {
    match value {
        Some(v) if !v.is_object() => Err(Error::request(
            format!(
                "Invalid type for '{param}': expected an object, but got {} instead.",
                json_kind(v)
            ),
            Some(param),
        )),
        _ => Ok(()),
    }
}

/// `response_format`: an object with a string `type` (`text`, `json_object`, `json_schema`,
/// or an engine's own kind, passed on).
fn check_response_format(value: Option<&serde_json::Value>) -> Result<()> {
    check_object(value, "response_format")?;
    if let Some(v) = value
        && !v.get("type").is_some_and(serde_json::Value::is_string)
    {
        return Err(Error::request(
            "Missing required parameter: 'response_format.type'.",
            Some("response_format.type"),
        ));
    }
    Ok(())
}

/// The function name of a named `tool_choice` (`{"type": "function", "function": {"name"}}`)
/// or of a tool (`{"type": "function", "function": {"name"}}`); flat `{"name"}` too.
fn function_name(v: &serde_json::Value) -> Option<&str> {
    v.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| v.get("name"))
        .and_then(serde_json::Value::as_str)
}

/// `tool_choice`: `none`, `auto`, `required`, or an object naming a tool. As OpenAI: a choice
/// that needs a tool (`required`, a named function) needs `tools`, and a named function must
/// be one of them (the output could never satisfy it).
fn check_tool_choice(
    value: Option<&serde_json::Value>,
    tools: Option<&[serde_json::Value]>,
) -> Result<()> {
    let tools = tools.unwrap_or_default();
    let needs_tools = |what: &str| {
        Err(Error::request(
            format!(
                "Invalid value for 'tool_choice': {what} is only allowed when 'tools' are specified."
            ),
            Some("tool_choice"),
        ))
    };
    match value {
        Some(serde_json::Value::String(s)) if s == "required" && tools.is_empty() => {
            needs_tools("'required'")
        }
        Some(choice @ serde_json::Value::Object(_)) => match function_name(choice) {
            Some(name) if tools.is_empty() => needs_tools(&format!("function {name:?}")),
            Some(name) if !tools.iter().any(|t| function_name(t) == Some(name)) => {
                Err(Error::request(
                    format!(
                        "Invalid value for 'tool_choice': function {name:?} is not one of 'tools'."
                    ),
                    Some("tool_choice"),
                ))
            }
            _ => Ok(()),
        },
        None => Ok(()),
        Some(serde_json::Value::String(s))
            if matches!(s.as_str(), "none" | "auto" | "required") =>
        {
            Ok(())
        }
        Some(v) => Err(Error::request(
            format!(
                "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or an object naming a tool, but got {}.",
                match v {
                    serde_json::Value::String(s) => format!("{s:?}"),
                    other => json_kind(other).to_owned(),
                }
            ),
            Some("tool_choice"),
        )),
    }
}

/// Every message but an assistant's (which may carry only `tool_calls`) and a legacy
/// `function` result must have content: a `null` or missing one would reach the template as
/// `None` and silently become the text "None" or nothing.
fn check_message_contents(messages: &[ChatMessage]) -> Result<()> {
    for (i, m) in messages.iter().enumerate() {
        if m.content.is_none() && !matches!(m.role, Role::Assistant | Role::Function) {
            let param = format!("messages.[{i}].content");
            return Err(Error::request(
                format!(
                    "Invalid value for '{param}': a {} message must have content (a string or a list of parts), not null.",
                    serde_json::to_value(m.role)
                        .ok()
                        .and_then(|r| r.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
                Some(&param),
            ));
        }
    }
    Ok(())
}

impl ChatCompletionRequest {
    /// The engine extensions of the request.
    pub fn ext(&self) -> SamplingExtensions {
        SamplingExtensions {
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            ignore_eos: self.ignore_eos,
            min_tokens: self.min_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            include_stop_str_in_output: self.include_stop_str_in_output,
            skip_special_tokens: self.skip_special_tokens,
            nvext: self.nvext.clone(),
        }
    }

    /// The output limit: `max_completion_tokens`, else `max_tokens`.
    pub fn max_output_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    /// Whether a final usage chunk was asked for.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// Check values (ranges, unsupported options).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the parameter.
    pub fn validate(&self) -> Result<()> {
        if self.messages.is_empty() {
            return Err(Error::request(
                "[] is too short - 'messages'",
                Some("messages"),
            ));
        }
        check_message_contents(&self.messages)?;
        check_response_format(self.response_format.as_ref())?;
        check_tool_choice(self.tool_choice.as_ref(), self.tools.as_deref())?;
        if self.max_output_tokens() == Some(0) {
            return Err(Error::request(
                "max_tokens must be at least 1.",
                Some("max_tokens"),
            ));
        }
        if let Some(k) = self.top_logprobs
            && k > 20
        {
            return Err(Error::request(
                format!("{k} is not a valid value for 'top_logprobs': must be between 0 and 20."),
                Some("top_logprobs"),
            ));
        }
        validate_common(
            self.stream,
            self.stream_options.as_ref(),
            self.temperature,
            self.top_p,
            self.n,
            [
                (self.presence_penalty, "presence_penalty"),
                (self.frequency_penalty, "frequency_penalty"),
            ],
            self.stop.as_ref(),
            &self.ext(),
        )
    }
}

impl CompletionRequest {
    /// The engine extensions of the request.
    pub fn ext(&self) -> SamplingExtensions {
        SamplingExtensions {
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            ignore_eos: self.ignore_eos,
            min_tokens: self.min_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            include_stop_str_in_output: self.include_stop_str_in_output,
            skip_special_tokens: self.skip_special_tokens,
            nvext: self.nvext.clone(),
        }
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    /// Whether a final usage chunk was asked for.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// Check values (ranges, unsupported options).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the parameter.
    pub fn validate(&self) -> Result<()> {
        let empty = match &self.prompt {
            Prompt::Text(_) | Prompt::Tokens(_) => false,
            Prompt::Texts(v) => v.len() != 1,
            Prompt::TokenLists(v) => v.len() != 1,
        };
        if empty {
            return Err(Error::request(
                "'prompt' must be a string, a list of token ids, or a list with exactly one of them (batched prompts are not supported).",
                Some("prompt"),
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(Error::request(
                "max_tokens must be at least 1.",
                Some("max_tokens"),
            ));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(Error::request("best_of must be 1.", Some("best_of")));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(Error::request("'suffix' is not supported.", Some("suffix")));
        }
        if let Some(k) = self.logprobs
            && k > 5
        {
            return Err(Error::request(
                format!("{k} is not a valid value for 'logprobs': must be between 0 and 5."),
                Some("logprobs"),
            ));
        }
        validate_common(
            self.stream,
            self.stream_options.as_ref(),
            self.temperature,
            self.top_p,
            self.n,
            [
                (self.presence_penalty, "presence_penalty"),
                (self.frequency_penalty, "frequency_penalty"),
            ],
            self.stop.as_ref(),
            &self.ext(),
        )
    }
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Sum of both.
    pub total_tokens: u32,
    /// Prompt tokens served from the prefix cache, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// Details of the prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    /// Usage of `prompt` prompt tokens and `completion` generated tokens.
    pub fn new(prompt: u32, completion: u32) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: None,
        }
    }

    /// The same usage reporting `cached` prompt tokens served from the prefix cache
    /// (`prompt_tokens_details` stays absent when `cached` is `None`).
    #[must_use]
    pub fn with_cached(mut self, cached: Option<u32>) -> Self {
        self.prompt_tokens_details = cached.map(|c| PromptTokensDetails {
            cached_tokens: c.min(self.prompt_tokens),
        });
        self
    }
}

/// Why a choice ended, as OpenAI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiFinishReason {
    /// Natural end or a stop sequence.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// The model called tools.
    ToolCalls,
    /// Filtered.
    ContentFilter,
}

/// A message in a non-streaming chat response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseMessage {
    /// Always `assistant`.
    pub role: Role,
    /// The text.
    pub content: Option<String>,
    /// A refusal message; always `null` (the engines here do not refuse), present as in
    /// OpenAI's responses.
    #[serde(default)]
    pub refusal: Option<String>,
    /// The reasoning text split off by the model's reasoning parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tool calls found by the model's tool-call parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A tool call of a response message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// `call_…` (or the model's own id).
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The call.
    pub function: FunctionCall,
}

/// The function of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments, JSON text.
    pub arguments: String,
}

/// A piece of a streamed tool call: the first piece of a call carries `id`, `type` and
/// `function.name`; later ones carry `function.arguments` text to append.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call of the message.
    pub index: u32,
    /// On the first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, on the first piece.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name and/or arguments text.
    pub function: FunctionCallDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// On the first piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Arguments text to append.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// One choice of a non-streaming chat response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Choice index (0).
    pub index: u32,
    /// The answer.
    pub message: ResponseMessage,
    /// Why it ended.
    pub finish_reason: Option<OpenAiFinishReason>,
    /// Log probabilities, when asked for.
    pub logprobs: Option<serde_json::Value>,
}

/// `chat.completion` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Option<Usage>,
}

/// The delta of a streamed chat choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant` on the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool-call pieces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Choice index (0).
    pub index: u32,
    /// What is new.
    pub delta: ChatDelta,
    /// Set on the last chunk of the choice.
    pub finish_reason: Option<OpenAiFinishReason>,
    /// Log probabilities, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<serde_json::Value>,
}

/// `chat.completion.chunk`: one server-sent event of a streamed chat response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// Same for every chunk of a response.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// One choice, or none on the final usage chunk.
    pub choices: Vec<ChatChunkChoice>,
    /// `null` except on the final chunk when `stream_options.include_usage` is set.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One choice of a completions response or chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Choice index (0).
    pub index: u32,
    /// The (new) text.
    pub text: String,
    /// Why it ended.
    pub finish_reason: Option<OpenAiFinishReason>,
    /// Log probabilities, when asked for.
    pub logprobs: Option<serde_json::Value>,
}

/// `text_completion` response (also each streamed chunk of one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// `cmpl-…`.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
    /// The choices (none on the final usage chunk).
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// Builds the chunks and responses of one request (same id, timestamp and model on all).
#[derive(Debug, Clone)]
pub struct ResponseFactory {
    /// Response id.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
}

impl ResponseFactory {
    /// A factory for `model`, with `id` (e.g. `chatcmpl-<uuid>`), stamped now.
    pub fn new(id: impl Into<String>, model: impl Into<String>) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            id: id.into(),
            created,
            model: model.into(),
        }
    }

    /// A chat chunk with a text delta (`role: assistant` when `first`).
    pub fn chat_chunk(
        &self,
        text: Option<String>,
        first: bool,
        finish_reason: Option<OpenAiFinishReason>,
    ) -> ChatCompletionChunk {
        self.chat_chunk_at(0, text, first, finish_reason)
    }

    /// A chat chunk of choice `index` (for `n > 1`).
    pub fn chat_chunk_at(
        &self,
        index: u32,
        text: Option<String>,
        first: bool,
        finish_reason: Option<OpenAiFinishReason>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChatChunkChoice {
                index,
                delta: ChatDelta {
                    role: first.then_some(Role::Assistant),
                    content: text,
                    ..ChatDelta::default()
                },
                finish_reason,
                logprobs: None,
            }],
            usage: None,
        }
    }

    /// A chat chunk of choice `index` carrying `delta`.
    pub fn chat_delta_chunk(
        &self,
        index: u32,
        delta: ChatDelta,
        finish_reason: Option<OpenAiFinishReason>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChatChunkChoice {
                index,
                delta,
                finish_reason,
                logprobs: None,
            }],
            usage: None,
        }
    }

    /// The final usage-only chat chunk (`choices: []`).
    pub fn chat_usage_chunk(&self, usage: Usage) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices: Vec::new(),
            usage: Some(usage),
        }
    }

    /// A complete chat response.
    pub fn chat_response(
        &self,
        text: String,
        finish_reason: Option<OpenAiFinishReason>,
        usage: Usage,
    ) -> ChatCompletionResponse {
        self.chat_response_choices(vec![(text, finish_reason)], usage)
    }

    /// A complete chat response with one choice per `(text, finish_reason)`, indexed in
    /// order.
    pub fn chat_response_choices(
        &self,
        choices: Vec<(String, Option<OpenAiFinishReason>)>,
        usage: Usage,
    ) -> ChatCompletionResponse {
        ChatCompletionResponse {
            id: self.id.clone(),
            object: "chat.completion".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices: (0u32..)
                .zip(choices)
                .map(|(index, (text, finish_reason))| ChatChoice {
                    index,
                    message: ResponseMessage {
                        role: Role::Assistant,
                        content: Some(text),
                        refusal: None,
                        reasoning_content: None,
                        tool_calls: None,
                    },
                    finish_reason,
                    logprobs: None,
                })
                .collect(),
            usage: Some(usage),
        }
    }

    /// A completions chunk, or with `usage` a complete response.
    pub fn completion(
        &self,
        text: String,
        finish_reason: Option<OpenAiFinishReason>,
        usage: Option<Usage>,
    ) -> CompletionResponse {
        self.completion_choices(vec![(text, finish_reason)], usage)
    }

    /// A completions chunk of choice `index` (for `n > 1`).
    pub fn completion_chunk_at(
        &self,
        index: u32,
        text: String,
        finish_reason: Option<OpenAiFinishReason>,
    ) -> CompletionResponse {
        let mut chunk = self.completion(text, finish_reason, None);
        for c in &mut chunk.choices {
            c.index = index;
        }
        chunk
    }

    /// A completions response with one choice per `(text, finish_reason)`, indexed in
    /// order.
    pub fn completion_choices(
        &self,
        choices: Vec<(String, Option<OpenAiFinishReason>)>,
        usage: Option<Usage>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices: (0u32..)
                .zip(choices)
                .map(|(index, (text, finish_reason))| CompletionChoice {
                    index,
                    text,
                    finish_reason,
                    logprobs: None,
                })
                .collect(),
            usage,
        }
    }

    /// The final usage-only completions chunk (`choices: []`).
    pub fn completion_usage_chunk(&self, usage: Usage) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices: Vec::new(),
            usage: Some(usage),
        }
    }
}

/// Writes a response's plain-text stream chunks (`data: {...}\n\n`) straight into a body
/// frame: the parts that are the same in every chunk (id, object, created, model) are
/// serialised once per response, the text is escaped in place, and nothing is allocated
/// per chunk. The bytes are those of [`ResponseFactory::chat_chunk_at`] /
/// [`ResponseFactory::completion_chunk_at`] serialised by `serde_json` in an SSE `data:`
/// line (the tests check it).
#[derive(Debug, Clone)]
pub struct SseChunkWriter {
    /// `data: {"id":…,"object":…,"created":…,"model":…,"choices":[{"index":`
    head: Vec<u8>,
    chat: bool,
}

impl SseChunkWriter {
    /// `chat.completion.chunk`s of `factory`'s response.
    pub fn chat(factory: &ResponseFactory) -> Self {
        Self::new(factory, true)
    }

    /// `text_completion` chunks of `factory`'s response.
    pub fn completion(factory: &ResponseFactory) -> Self {
        Self::new(factory, false)
    }

    fn new(factory: &ResponseFactory, chat: bool) -> Self {
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        // The fixed parts take 97 bytes with the longest object name and a 10-digit time,
        // and the id and model may need escaping: room enough not to grow.
        let mut head = Vec::with_capacity(128 + factory.id.len() + factory.model.len());
        head.extend_from_slice(b"data: {\"id\":");
        json_str(&mut head, &factory.id);
        head.extend_from_slice(b",\"object\":");
        json_str(&mut head, object);
        head.extend_from_slice(b",\"created\":");
        // (Written in place: `to_string` was an allocation per response.)
        let _ = std::io::Write::write_fmt(&mut head, format_args!("{}", factory.created));
        head.extend_from_slice(b",\"model\":");
        json_str(&mut head, &factory.model);
        head.extend_from_slice(b",\"choices\":[{\"index\":");
        Self { head, chat }
    }

    /// Append the chunk of choice `index` carrying `text` (chat: with `role: assistant`
    /// when `first`; ignored for completions) to `out` (a `Vec<u8>` or a `BytesMut`).
    pub fn write<B: BufMut>(
        &self,
        out: &mut B,
        index: u32,
        text: &str,
        first: bool,
        finish: Option<OpenAiFinishReason>,
    ) {
        out.put_slice(&self.head);
        let mut digits = [0u8; 10];
        out.put_slice(decimal(index, &mut digits));
        if self.chat {
            out.put_slice(b",\"delta\":{");
            if first {
                out.put_slice(b"\"role\":\"assistant\",");
            }
            out.put_slice(b"\"content\":");
            json_str(out, text);
            out.put_slice(b"},\"finish_reason\":");
            json_finish(out, finish);
            out.put_slice(b"}],\"usage\":null}\n\n");
        } else {
            out.put_slice(b",\"text\":");
            json_str(out, text);
            out.put_slice(b",\"finish_reason\":");
            json_finish(out, finish);
            out.put_slice(b",\"logprobs\":null}],\"usage\":null}\n\n");
        }
    }
}

/// `n` in decimal, in `buf`.
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// `s` as a JSON string (`serde_json`'s escaping).
fn json_str<B: BufMut>(out: &mut B, s: &str) {
    // Writing into memory cannot fail.
    let _ = serde_json::to_writer((&mut *out).writer(), s);
}

fn json_finish<B: BufMut>(out: &mut B, finish: Option<OpenAiFinishReason>) {
    out.put_slice(match finish {
        None => b"null".as_slice(),
        Some(OpenAiFinishReason::Stop) => b"\"stop\"",
        Some(OpenAiFinishReason::Length) => b"\"length\"",
        Some(OpenAiFinishReason::ToolCalls) => b"\"tool_calls\"",
        Some(OpenAiFinishReason::ContentFilter) => b"\"content_filter\"",
    });
}
