//! Formats whose calls are JSON objects `{"name": ..., "arguments": {...}}` (or
//! `"parameters"`), alone, in lists, or separated by `;`.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::format::{End, Format, RawCall, ToolSet, inner};
use super::head::{json_head, json_viable};

/// One call object. `arguments` is kept as written (key order and all).
#[derive(Deserialize)]
struct CallJson<'a> {
    name: String,
    #[serde(default, alias = "parameters", borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(default)]
    id: Option<String>,
}

/// The arguments' JSON text: an object as written; a string holding an object (some
/// models quote their arguments) is unquoted. Anything else is malformed.
fn arguments_text(raw: Option<&RawValue>) -> Option<String> {
    let Some(raw) = raw else {
        return Some("{}".to_owned());
    };
    let text = raw.get().trim();
    if text.starts_with('{') {
        return Some(text.to_owned());
    }
    if text == "null" {
        return Some("{}".to_owned());
    }
    let s: String = serde_json::from_str(text).ok()?;
    let v: serde_json::Value = serde_json::from_str(&s).ok()?;
    v.is_object().then(|| s.trim().to_owned())
}

fn call(c: CallJson<'_>) -> Option<RawCall> {
    if c.name.is_empty() {
        return None;
    }
    Some(RawCall {
        arguments: arguments_text(c.arguments)?,
        name: c.name,
        id: c.id,
    })
}

/// Calls in `text`: a JSON list of call objects, or call objects separated by blanks,
/// `;` or `,`. `None` unless all of `text` is calls.
pub(crate) fn parse_calls(text: &str) -> Option<Vec<RawCall>> {
    let text = text.trim();
    if text.starts_with('[') {
        let list: Vec<CallJson<'_>> = serde_json::from_str(text).ok()?;
        return list.into_iter().map(call).collect();
    }
    let mut calls = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<CallJson<'_>>();
        let c = it.next()?.ok()?;
        let used = it.byte_offset();
        calls.push(call(c)?);
        rest = rest[used..].trim_start();
        rest = rest
            .strip_prefix(';')
            .or_else(|| rest.strip_prefix(','))
            .unwrap_or(rest)
            .trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

fn hermes(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    parse_calls(inner(section, "<tool_call>", "</tool_call>"))
}

/// `<tool_call>{json}</tool_call>`, one call per section (Hermes, Qwen 2.5 / 3).
pub(crate) const HERMES: Format = Format {
    name: "hermes",
    starts: &[("<tool_call>", End::Marker("</tool_call>"))],
    leading: &[],
    parse: hermes,
    special_tokens: false,
    head: Some(json_head),
    viable: None,
};

fn llama3(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    let s = section.trim_start();
    parse_calls(
        s.strip_prefix("<|python_tag|>")
            .unwrap_or(s)
            .trim_end_matches("<|eom_id|>"),
    )
}

/// Llama 3.x JSON: the output is `{"name": ..., "parameters": {...}}` (several separated
/// by `;`), optionally after `<|python_tag|>`.
pub(crate) const LLAMA3_JSON: Format = Format {
    name: "llama3_json",
    starts: &[("<|python_tag|>", End::Output)],
    leading: &["{"],
    parse: llama3,
    special_tokens: true,
    head: Some(json_head),
    viable: Some(json_viable),
};

fn phi4(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    parse_calls(section.strip_prefix("functools")?)
}

/// Phi-4 mini: `functools[{...}, ...]` to the end of the output.
pub(crate) const PHI4: Format = Format {
    name: "phi4",
    starts: &[("functools", End::Output)],
    leading: &[],
    parse: phi4,
    special_tokens: false,
    head: Some(json_head),
    viable: None,
};

fn nemotron_deci(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    parse_calls(inner(section, "<TOOLCALL>", "</TOOLCALL>"))
}

/// Nemotron (Deci): `<TOOLCALL>[{...}, ...]</TOOLCALL>`.
pub(crate) const NEMOTRON_DECI: Format = Format {
    name: "nemotron_deci",
    starts: &[("<TOOLCALL>", End::Marker("</TOOLCALL>"))],
    leading: &[],
    parse: nemotron_deci,
    special_tokens: false,
    head: Some(json_head),
    viable: None,
};

fn jamba(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    parse_calls(inner(section, "<tool_calls>", "</tool_calls>"))
}

/// Jamba: `<tool_calls>[{...}, ...]</tool_calls>`.
pub(crate) const JAMBA: Format = Format {
    name: "jamba",
    starts: &[("<tool_calls>", End::Marker("</tool_calls>"))],
    leading: &[],
    parse: jamba,
    special_tokens: false,
    head: Some(json_head),
    viable: None,
};

fn default(section: &str, tools: &ToolSet) -> Option<Vec<RawCall>> {
    if section.starts_with("<tool_call>") {
        return hermes(section, tools);
    }
    if section.starts_with("<TOOLCALL>") {
        return nemotron_deci(section, tools);
    }
    parse_calls(section)
}

/// The fallback format: hermes tags, `<TOOLCALL>` lists, or an output that is only JSON
/// call objects (a list or one object).
pub(crate) const DEFAULT: Format = Format {
    name: "default",
    starts: &[
        ("<tool_call>", End::Marker("</tool_call>")),
        ("<TOOLCALL>", End::Marker("</TOOLCALL>")),
    ],
    leading: &["{", "["],
    parse: default,
    special_tokens: false,
    head: Some(json_head),
    viable: Some(json_viable),
};
