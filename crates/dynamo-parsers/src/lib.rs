//! Tool-call and reasoning parsers of model output.
//!
//! A model writes its tool calls and its reasoning as text in its own format
//! (`<tool_call>{...}</tool_call>`, `<think>...</think>`, gpt-oss channels, ...). The
//! frontend turns that text into OpenAI's `tool_calls` and `reasoning_content`, as the
//! tokens stream. The model's parsers are chosen by name (the model card's
//! `runtime_config.tool_call_parser` / `reasoning_parser`, or the frontend's defaults);
//! [`tool_parser_names`] and [`reasoning_parser_names`] list the accepted names, aliases
//! included.
//!
//! * [`reasoning`]: marker pairs around reasoning text.
//! * [`tool_calls`]: the streaming engine and every tool-call format.
//! * [`harmony`]: gpt-oss channels (reasoning and tool calls in one format).
//!
//! [`ChatParser`] combines them for one output: reasoning first, then tool calls in what
//! is left. It is pure (no I/O), incremental, and holds back only text that can still
//! become a marker or a call. A call is a [`ParseEvent::CallStart`] (its name, sent as
//! soon as it is known and allowed) then [`ParseEvent::CallArgs`] pieces, which stream
//! as the model writes them in the formats whose arguments are a JSON object (the rest
//! send them whole once the call is complete). How malformed output falls back to
//! content is in `docs/design/tool_calling.md` and `tool_calls/stream.rs`.

mod event;
pub mod harmony;
pub mod reasoning;
mod text;
pub mod tool_calls;

use std::sync::Arc;

use reasoning::{Channel, ReasoningFormat, ReasoningParser};
use tool_calls::{CallPolicy, Format, ToolCallParser, ToolEvent, ToolSet};

pub use event::ParseEvent;
pub use tool_calls::RawCall;

/// Tool-call parser names (aliases included) and the format each one means.
const TOOL_PARSERS: &[(&str, Option<&str>)] = &[
    ("default", Some("default")),
    ("hermes", Some("hermes")),
    ("qwen25", Some("hermes")),
    ("qwen3", Some("hermes")),
    ("llama3_json", Some("llama3_json")),
    ("mistral", Some("mistral")),
    ("pythonic", Some("pythonic")),
    ("qwen3_coder", Some("qwen3_coder")),
    ("nemotron_nano", Some("qwen3_coder")),
    ("deepseek_v3", Some("deepseek_v3")),
    ("deepseek_v3_1", Some("deepseek_v3_1")),
    ("deepseek_v3_2", Some("deepseek_v3_2")),
    ("kimi_k2", Some("kimi_k2")),
    ("kimi_k25", Some("kimi_k2")),
    // `None`: harmony (gpt-oss), its own parser.
    ("harmony", None),
    ("phi4", Some("phi4")),
    ("nemotron_deci", Some("nemotron_deci")),
    ("glm45", Some("glm45")),
    ("glm47", Some("glm45")),
    ("jamba", Some("jamba")),
    ("minimax_m2", Some("minimax_m2")),
];

/// Reasoning parser names (aliases included) and their formats (`None`: harmony).
const REASONING_PARSERS: &[(&str, Option<ReasoningFormat>)] = &[
    ("basic", Some(reasoning::THINK)),
    ("deepseek_r1", Some(reasoning::THINK_FORCED)),
    ("deepseek_v3", Some(reasoning::THINK)),
    ("deepseek_v3_1", Some(reasoning::THINK)),
    ("deepseek_v3_2", Some(reasoning::THINK)),
    ("qwen3", Some(reasoning::THINK)),
    ("qwen3_coder", Some(reasoning::THINK)),
    ("gpt_oss", None),
    ("granite", Some(reasoning::GRANITE)),
    ("kimi", Some(reasoning::KIMI)),
    ("kimi_k2", Some(reasoning::THINK)),
    ("kimi_k25", Some(reasoning::THINK)),
    ("mistral", Some(reasoning::MISTRAL)),
    ("nemotron_deci", Some(reasoning::THINK)),
    ("nemotron_v3", Some(reasoning::THINK_FORCED)),
    ("nemotron3", Some(reasoning::THINK_FORCED)),
    ("nemotron_nano", Some(reasoning::THINK_FORCED)),
    ("step3", Some(reasoning::THINK_FORCED)),
    ("glm45", Some(reasoning::THINK)),
    ("glm47", Some(reasoning::THINK)),
    ("minimax_m2", Some(reasoning::THINK)),
    ("minimax_append_think", Some(reasoning::THINK_FORCED)),
];

/// Every accepted tool-call parser name, sorted.
pub fn tool_parser_names() -> Vec<&'static str> {
    let mut v: Vec<_> = TOOL_PARSERS.iter().map(|(n, _)| *n).collect();
    v.sort_unstable();
    v
}

/// Every accepted reasoning parser name, sorted.
pub fn reasoning_parser_names() -> Vec<&'static str> {
    let mut v: Vec<_> = REASONING_PARSERS.iter().map(|(n, _)| *n).collect();
    v.sort_unstable();
    v
}

/// A tool-call parser, resolved.
#[derive(Debug, Clone, Copy)]
enum ToolKind {
    Format(&'static Format),
    Harmony,
}

fn tool_kind(name: &str) -> Option<ToolKind> {
    let (_, format) = TOOL_PARSERS.iter().find(|(n, _)| *n == name)?;
    Some(match format {
        Some(f) => ToolKind::Format(tool_calls::format(f)?),
        None => ToolKind::Harmony,
    })
}

/// `Err(message listing the known names)` when `name` is not a tool-call parser.
///
/// # Errors
/// The message for the user.
pub fn check_tool_parser(name: &str) -> Result<(), String> {
    match tool_kind(name) {
        Some(_) => Ok(()),
        None => Err(format!(
            "unknown tool_call_parser {name:?}; known parsers: {}",
            tool_parser_names().join(", ")
        )),
    }
}

/// `Err(message listing the known names)` when `name` is not a reasoning parser.
///
/// # Errors
/// The message for the user.
pub fn check_reasoning_parser(name: &str) -> Result<(), String> {
    if REASONING_PARSERS.iter().any(|(n, _)| *n == name) {
        Ok(())
    } else {
        Err(format!(
            "unknown reasoning_parser {name:?}; known parsers: {}",
            reasoning_parser_names().join(", ")
        ))
    }
}

/// Whether the named parsers need the model's special tokens in the text (their markers
/// are special tokens that detokenization would otherwise drop).
pub fn needs_special_tokens(tool: Option<&str>, reasoning: Option<&str>) -> bool {
    let tool = tool.and_then(tool_kind).is_some_and(|k| match k {
        ToolKind::Format(f) => f.special_tokens,
        ToolKind::Harmony => true,
    });
    tool || reasoning == Some("gpt_oss")
}

/// The parser names of a model (or a frontend's defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParserNames {
    /// Tool-call parser.
    pub tool_call_parser: Option<String>,
    /// Reasoning parser.
    pub reasoning_parser: Option<String>,
}

impl ParserNames {
    /// Check both names.
    ///
    /// # Errors
    /// A message naming the unknown parser and listing the known ones.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(t) = &self.tool_call_parser {
            check_tool_parser(t)?;
        }
        if let Some(r) = &self.reasoning_parser {
            check_reasoning_parser(r)?;
        }
        Ok(())
    }

    /// These names, each falling back to `defaults`'.
    #[must_use]
    pub fn or(&self, defaults: &Self) -> Self {
        Self {
            tool_call_parser: self
                .tool_call_parser
                .clone()
                .or_else(|| defaults.tool_call_parser.clone()),
            reasoning_parser: self
                .reasoning_parser
                .clone()
                .or_else(|| defaults.reasoning_parser.clone()),
        }
    }
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tools: output is text.
    None,
    /// The model decides (the default).
    Auto,
    /// The model must call a tool.
    Required,
    /// The model must call this function.
    Named(String),
}

impl ToolChoice {
    /// From a request's `tool_choice` value (validated by the request parser; unknown
    /// shapes mean `auto`).
    pub fn from_request(v: Option<&serde_json::Value>) -> Self {
        match v {
            Some(serde_json::Value::String(s)) => match s.as_str() {
                "none" => Self::None,
                "required" => Self::Required,
                _ => Self::Auto,
            },
            Some(serde_json::Value::Object(o)) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(serde_json::Value::as_str)
                .map_or(Self::Auto, |n| Self::Named(n.to_owned())),
            _ => Self::Auto,
        }
    }
}

/// The request's side of parsing: its declared tools and choices.
#[derive(Debug, Clone)]
pub struct RequestTools<'a> {
    /// `tools`.
    pub tools: Option<&'a [serde_json::Value]>,
    /// `tool_choice`.
    pub tool_choice: Option<&'a serde_json::Value>,
    /// `parallel_tool_calls`.
    pub parallel_tool_calls: Option<bool>,
}

#[derive(Debug, Clone)]
enum Engine {
    Split {
        reasoning: Option<ReasoningParser>,
        tools: Option<ToolCallParser>,
    },
    Harmony(harmony::HarmonyParser),
}

/// The parsers of one output (one choice of one request).
#[derive(Debug, Clone)]
pub struct ChatParser {
    engine: Engine,
    named: bool,
    calls: usize,
    tool_events: Vec<ToolEvent>,
}

impl ChatParser {
    /// The parsers for one request, or `None` when its output is plain text (no
    /// reasoning parser, and no tool parsing: no tools declared, `tool_choice: none`, or
    /// no tool parser with `tool_choice: auto`). Unknown names count as unset (they are
    /// refused at registration).
    pub fn for_request(
        tool_parser: Option<&str>,
        reasoning_parser: Option<&str>,
        req: &RequestTools<'_>,
    ) -> Option<Self> {
        let choice = ToolChoice::from_request(req.tool_choice);
        let declared = req.tools.filter(|t| !t.is_empty());
        let tool = match (declared, &choice) {
            (None, _) | (_, ToolChoice::None) => None,
            (Some(_), ToolChoice::Auto) => tool_parser.and_then(tool_kind),
            // A forced call without a configured parser: the generic JSON format.
            (Some(_), _) => tool_parser
                .and_then(tool_kind)
                .or_else(|| tool_calls::format("default").map(ToolKind::Format)),
        };
        let reasoning = reasoning_parser.and_then(|n| {
            REASONING_PARSERS
                .iter()
                .find(|(name, _)| *name == n)
                .map(|(_, f)| *f)
        });
        let policy = || {
            let tools = Arc::new(ToolSet::from_request(declared.unwrap_or_default()));
            let p = CallPolicy {
                only: match &choice {
                    ToolChoice::Named(n) => Some(n.clone()),
                    _ => None,
                },
                single: req.parallel_tool_calls == Some(false),
            };
            (tools, p)
        };
        let engine = match (tool, reasoning) {
            (None, None) => return None,
            (Some(ToolKind::Harmony), _) => {
                Engine::Harmony(harmony::HarmonyParser::new(Some(policy())))
            }
            (None, Some(None)) => Engine::Harmony(harmony::HarmonyParser::new(None)),
            (Some(ToolKind::Format(f)), Some(None)) => {
                // gpt_oss reasoning with another tool format: harmony carries the calls.
                let _ = f;
                Engine::Harmony(harmony::HarmonyParser::new(Some(policy())))
            }
            (tool, reasoning) => Engine::Split {
                reasoning: reasoning.flatten().map(ReasoningParser::new),
                tools: match tool {
                    Some(ToolKind::Format(f)) => {
                        let (tools, p) = policy();
                        Some(ToolCallParser::new(f, tools, p))
                    }
                    _ => None,
                },
            },
        };
        Some(Self {
            engine,
            named: matches!(choice, ToolChoice::Named(_)),
            calls: 0,
            tool_events: Vec::new(),
        })
    }

    /// Tool calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Whether the finish reason should be `tool_calls` (calls were made, and
    /// `tool_choice` did not name the function: OpenAI then reports `stop`).
    pub fn finished_with_calls(&self) -> bool {
        self.calls > 0 && !self.named
    }

    /// Feed the next text of the output; events are appended to `out` in output order.
    pub fn feed(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        let before = out.len();
        match &mut self.engine {
            Engine::Harmony(h) => h.feed(text, out),
            Engine::Split { reasoning, tools } => {
                let tool_events = &mut self.tool_events;
                let mut sink = |ch: Channel, t: &str| match ch {
                    Channel::Reasoning => push(out, ParseEvent::Reasoning(t.to_owned())),
                    Channel::Content => match tools.as_mut() {
                        Some(tp) => {
                            tp.feed(t, tool_events);
                            drain_tools(tool_events, out);
                        }
                        None => push(out, ParseEvent::Content(t.to_owned())),
                    },
                };
                match reasoning.as_mut() {
                    Some(r) => r.feed(text, &mut sink),
                    None => sink(Channel::Content, text),
                }
            }
        }
        self.count(before, out);
    }

    /// The output ended: release everything held.
    pub fn finish(&mut self, out: &mut Vec<ParseEvent>) {
        let before = out.len();
        match &mut self.engine {
            Engine::Harmony(h) => h.finish(out),
            Engine::Split { reasoning, tools } => {
                let tool_events = &mut self.tool_events;
                let mut sink = |ch: Channel, t: &str| match ch {
                    Channel::Reasoning => push(out, ParseEvent::Reasoning(t.to_owned())),
                    Channel::Content => match tools.as_mut() {
                        Some(tp) => {
                            tp.feed(t, tool_events);
                            drain_tools(tool_events, out);
                        }
                        None => push(out, ParseEvent::Content(t.to_owned())),
                    },
                };
                if let Some(r) = reasoning.as_mut() {
                    r.finish(&mut sink);
                }
                if let Some(tp) = tools.as_mut() {
                    tp.finish(tool_events);
                    drain_tools(tool_events, out);
                }
            }
        }
        self.count(before, out);
    }

    fn count(&mut self, before: usize, out: &[ParseEvent]) {
        self.calls += out[before..]
            .iter()
            .filter(|e| matches!(e, ParseEvent::CallStart { .. }))
            .count();
    }
}

fn drain_tools(events: &mut Vec<ToolEvent>, out: &mut Vec<ParseEvent>) {
    for e in events.drain(..) {
        push(
            out,
            match e {
                ToolEvent::Content(s) => ParseEvent::Content(s),
                ToolEvent::CallStart { name, id } => ParseEvent::CallStart { name, id },
                ToolEvent::CallArgs(s) => ParseEvent::CallArgs(s),
            },
        );
    }
}

/// Append, merging with a previous event of the same text kind.
fn push(out: &mut Vec<ParseEvent>, e: ParseEvent) {
    match (out.last_mut(), e) {
        (_, ParseEvent::Content(s) | ParseEvent::Reasoning(s) | ParseEvent::CallArgs(s))
            if s.is_empty() => {}
        (Some(ParseEvent::Content(last)), ParseEvent::Content(s))
        | (Some(ParseEvent::Reasoning(last)), ParseEvent::Reasoning(s))
        | (Some(ParseEvent::CallArgs(last)), ParseEvent::CallArgs(s)) => last.push_str(&s),
        (_, e) => out.push(e),
    }
}

/// A new tool-call id: `call_` and 24 random alphanumerics, as OpenAI's look.
pub fn new_call_id() -> String {
    let mut s = String::with_capacity(29);
    s.push_str("call_");
    for _ in 0..24 {
        s.push(fastrand::alphanumeric());
    }
    s
}

#[cfg(test)]
mod tests;
