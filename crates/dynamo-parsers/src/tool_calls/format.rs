//! What a tool-call format is ([`Format`]), and the pieces its section parsers share:
//! the calls they return, the request's declared tools, and small text helpers.
//!
//! These live apart from the streaming engine (`mod.rs`, `stream.rs`) because every format
//! file needs them and the engine needs every format: the formats import this file, the
//! engine imports the formats, and nothing imports back up.

use super::head::{HeadFn, ViableFn};

/// A complete call found in a section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawCall {
    /// The function name.
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
    /// The call id the model wrote, when the format has one (Kimi).
    pub id: Option<String>,
}

/// How a section ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// At this marker (included in the section).
    Marker(&'static str),
    /// At the end of the output.
    Output,
}

/// Parses a complete section (markers included); `None` when malformed.
pub type SectionParser = fn(&str, &ToolSet) -> Option<Vec<RawCall>>;

/// A tool-call format.
#[derive(Clone, Copy)]
pub struct Format {
    /// Canonical name.
    pub name: &'static str,
    /// Markers that open a section anywhere, with how that section ends.
    pub starts: &'static [(&'static str, End)],
    /// Markers that open a section only as the first non-blank text of the output
    /// (bare JSON or Python lists); such sections run to the end of the output.
    pub leading: &'static [&'static str],
    /// The section parser.
    pub parse: SectionParser,
    /// The format's markers are special tokens: the detokenizer must keep them.
    pub special_tokens: bool,
    /// Reads one call's head, for formats whose arguments stream (see [`super::stream`]).
    pub(crate) head: Option<HeadFn>,
    /// Judges early whether a leading section can be calls (else it is content at once).
    pub(crate) viable: Option<ViableFn>,
}

impl std::fmt::Debug for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The functions a request declared (`tools`), with their parameter schemas.
#[derive(Debug, Clone, Default)]
pub struct ToolSet {
    tools: Vec<(String, Option<serde_json::Value>)>,
}

impl ToolSet {
    /// From a request's `tools` list (`{"type": "function", "function": {...}}` entries;
    /// other entries are ignored).
    pub fn from_request(tools: &[serde_json::Value]) -> Self {
        let tools = tools
            .iter()
            .filter_map(|t| {
                let f = t.get("function")?;
                let name = f.get("name")?.as_str()?.to_owned();
                Some((name, f.get("parameters").cloned()))
            })
            .collect();
        Self { tools }
    }

    /// Whether `name` was declared.
    pub fn has(&self, name: &str) -> bool {
        self.tools.iter().any(|(n, _)| n == name)
    }

    /// Whether no function was declared.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The JSON-schema `type` of parameter `param` of `function`, when declared.
    pub fn param_type(&self, function: &str, param: &str) -> Option<&str> {
        let (_, schema) = self.tools.iter().find(|(n, _)| n == function)?;
        let t = schema
            .as_ref()?
            .get("properties")?
            .get(param)?
            .get("type")?;
        match t {
            serde_json::Value::String(s) => Some(s),
            // `["string", "null"]`: the first non-null type.
            serde_json::Value::Array(a) => {
                a.iter().filter_map(|v| v.as_str()).find(|s| *s != "null")
            }
            _ => None,
        }
    }
}

/// The inside of a section: `section` without `start` and (when present) `end`.
pub(crate) fn inner<'a>(section: &'a str, start: &str, end: &str) -> &'a str {
    let s = section.strip_prefix(start).unwrap_or(section);
    s.strip_suffix(end).unwrap_or(s)
}

/// Convert a parameter's text value to JSON text, by its declared schema type: strings
/// stay strings; other types are parsed as JSON when they are JSON, else kept as strings.
/// Without a declared type, JSON values are kept as such.
pub(crate) fn param_json(tools: &ToolSet, function: &str, param: &str, value: &str) -> String {
    let as_string = || serde_json::to_string(value).unwrap_or_default();
    match tools.param_type(function, param) {
        Some("string") => as_string(),
        _ => {
            let v = value.trim();
            match serde_json::from_str::<serde_json::Value>(v) {
                Ok(_) => v.to_owned(),
                Err(_) => match v {
                    "True" => "true".to_owned(),
                    "False" => "false".to_owned(),
                    "None" => "null".to_owned(),
                    _ => as_string(),
                },
            }
        }
    }
}

/// Builds a JSON object's text in the order keys arrive.
pub(crate) struct ObjectText(String);

impl ObjectText {
    pub(crate) fn new() -> Self {
        Self(String::from("{"))
    }

    pub(crate) fn push(&mut self, key: &str, value_json: &str) {
        if self.0.len() > 1 {
            self.0.push_str(", ");
        }
        self.0
            .push_str(&serde_json::to_string(key).unwrap_or_default());
        self.0.push_str(": ");
        self.0.push_str(value_json);
    }

    pub(crate) fn finish(mut self) -> String {
        self.0.push('}');
        self.0
    }
}
