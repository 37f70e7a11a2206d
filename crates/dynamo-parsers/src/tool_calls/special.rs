//! Formats built from special-token markers: Mistral, DeepSeek V3 / V3.1, Kimi K2.

use super::format::{End, Format, RawCall, ToolSet, inner};
use super::head::{Head, json_head, marked, need, object_at, skip_optional, ws};
use super::json::parse_calls;

/// A JSON object's text, validated.
fn object_text(s: &str) -> Option<String> {
    let s = s.trim();
    let v: serde_json::Value = serde_json::from_str(s).ok()?;
    v.is_object().then(|| s.to_owned())
}

fn mistral(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    let body = section.strip_prefix("[TOOL_CALLS]")?;
    let t = body.trim_start();
    if t.starts_with('[') || t.starts_with('{') {
        // v0.3 tokenizers: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
        return parse_calls(t);
    }
    // v11+ tokenizers: `[TOOL_CALLS]name[ARGS]{...}` (optionally `[CALL_ID]id`), repeated.
    body.split("[TOOL_CALLS]")
        .map(|one| {
            let (head, args) = one.split_once("[ARGS]")?;
            let (name, id) = match head.split_once("[CALL_ID]") {
                Some((n, id)) => (n, Some(id.trim().to_owned())),
                None => (head, None),
            };
            let name = name.trim();
            (!name.is_empty()).then_some(())?;
            Some(RawCall {
                name: name.to_owned(),
                arguments: object_text(args)?,
                id,
            })
        })
        .collect()
}

/// Mistral: `[TOOL_CALLS]` then JSON call objects (v0.3) or `name[ARGS]{...}`
/// (optionally `name[CALL_ID]id[ARGS]`), v11.
fn mistral_head(s: &str) -> Head {
    let Some(i) = skip_optional(s, 0, &["[TOOL_CALLS]"]) else {
        return Head::Need;
    };
    match s.as_bytes().get(i) {
        None => return Head::Need,
        Some(b'[' | b'{' | b'}' | b']' | b',') => return json_head(&s[i..]).shift(i),
        Some(_) => {}
    }
    let Some(p) = s[i..].find("[ARGS]") else {
        return Head::Need;
    };
    let head = &s[i..i + p];
    let (name, id) = match head.split_once("[CALL_ID]") {
        Some((n, id)) => (n, Some(id.trim().to_owned())),
        None => (head, None),
    };
    let name = name.trim();
    if name.is_empty() || name.contains('[') {
        return Head::Bad;
    }
    let args_at = need!(object_at(s, i + p + "[ARGS]".len()));
    Head::Call {
        name: name.to_owned(),
        id,
        args_at,
    }
}

/// Mistral: `[TOOL_CALLS]` then the calls, to the end of the output.
pub(crate) const MISTRAL: Format = Format {
    name: "mistral",
    starts: &[("[TOOL_CALLS]", End::Output)],
    leading: &[],
    parse: mistral,
    special_tokens: true,
    head: Some(mistral_head),
    viable: None,
};

const DS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";

/// Both DeepSeek layouts: V3 `function<sep>name\n```json\n{...}\n```` and V3.1
/// `name<sep>{...}`.
fn deepseek(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    let body = inner(section, DS_BEGIN, DS_END).trim();
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let after = rest.strip_prefix(DS_CALL_BEGIN)?;
        let (one, next) = match after.find(DS_CALL_END) {
            Some(p) => (&after[..p], &after[p + DS_CALL_END.len()..]),
            // The last call may lack its end marker when the output stopped there.
            None => (after, ""),
        };
        let (head, tail) = one.split_once(DS_SEP)?;
        let call = if head.trim() == "function" && tail.contains("```") {
            let (name, json) = tail.split_once('\n')?;
            let json = json.trim();
            let json = json
                .strip_prefix("```json")
                .or_else(|| json.strip_prefix("```"))?;
            let json = json.trim_end().strip_suffix("```")?;
            RawCall {
                name: name.trim().to_owned(),
                arguments: object_text(json)?,
                id: None,
            }
        } else {
            RawCall {
                name: head.trim().to_owned(),
                arguments: object_text(tail)?,
                id: None,
            }
        };
        if call.name.is_empty() {
            return None;
        }
        calls.push(call);
        rest = next.trim_start();
    }
    Some(calls)
}

/// DeepSeek V3.1 `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{` and V3
/// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{`.
fn deepseek_head(s: &str) -> Head {
    let Some(i) = skip_optional(s, 0, &["```", DS_CALL_END]) else {
        return Head::Need;
    };
    let (head, j) = need!(marked(s, i, DS_CALL_BEGIN, DS_SEP));
    let head = head.trim();
    let b = s.as_bytes();
    let k = ws(b, j);
    if k == b.len() {
        return Head::Need;
    }
    if head == "function" && b[k] != b'{' {
        // V3: the name runs to the end of the line, then a fenced JSON block.
        let Some(nl) = s[j..].find('\n') else {
            return Head::Need;
        };
        let name = s[j..j + nl].trim();
        let Some(f) = skip_optional(s, j + nl, &["```json", "```"]) else {
            return Head::Need;
        };
        if name.is_empty() {
            return Head::Bad;
        }
        let args_at = need!(object_at(s, f));
        return Head::Call {
            name: name.to_owned(),
            id: None,
            args_at,
        };
    }
    if head.is_empty() || b[k] != b'{' {
        return Head::Bad;
    }
    Head::Call {
        name: head.to_owned(),
        id: None,
        args_at: k,
    }
}

/// DeepSeek V3 (`function<｜tool▁sep｜>name` and a fenced JSON block).
pub(crate) const DEEPSEEK_V3: Format = Format {
    name: "deepseek_v3",
    starts: &[(DS_BEGIN, End::Marker(DS_END))],
    leading: &[],
    parse: deepseek,
    special_tokens: true,
    head: Some(deepseek_head),
    viable: None,
};

/// DeepSeek V3.1 (`name<｜tool▁sep｜>{json}`).
pub(crate) const DEEPSEEK_V3_1: Format = Format {
    name: "deepseek_v3_1",
    starts: &[(DS_BEGIN, End::Marker(DS_END))],
    leading: &[],
    parse: deepseek,
    special_tokens: true,
    head: Some(deepseek_head),
    viable: None,
};

const KIMI_BEGIN: &str = "<|tool_calls_section_begin|>";
const KIMI_END: &str = "<|tool_calls_section_end|>";
const KIMI_CALL_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";

fn kimi(section: &str, _: &ToolSet) -> Option<Vec<RawCall>> {
    let body = inner(section, KIMI_BEGIN, KIMI_END).trim();
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let after = rest.strip_prefix(KIMI_CALL_BEGIN)?;
        let (one, next) = match after.find(KIMI_CALL_END) {
            Some(p) => (&after[..p], &after[p + KIMI_CALL_END.len()..]),
            None => (after, ""),
        };
        let (id, args) = one.split_once(KIMI_ARGS)?;
        let id = id.trim();
        // `functions.get_weather:0`: the name sits between the prefix and the index.
        let name = id.strip_prefix("functions.").unwrap_or(id);
        let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
        if name.is_empty() {
            return None;
        }
        calls.push(RawCall {
            name: name.to_owned(),
            arguments: object_text(args)?,
            id: Some(id.to_owned()),
        });
        rest = next.trim_start();
    }
    Some(calls)
}

/// Kimi K2 `<|tool_call_begin|>functions.name:N<|tool_call_argument_begin|>{`.
fn kimi_head(s: &str) -> Head {
    let Some(i) = skip_optional(s, 0, &[KIMI_CALL_END]) else {
        return Head::Need;
    };
    let (id, j) = need!(marked(s, i, KIMI_CALL_BEGIN, KIMI_ARGS));
    let id = id.trim();
    let name = id.strip_prefix("functions.").unwrap_or(id);
    let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
    if name.is_empty() {
        return Head::Bad;
    }
    let args_at = need!(object_at(s, j));
    Head::Call {
        name: name.to_owned(),
        id: Some(id.to_owned()),
        args_at,
    }
}

/// Kimi K2: a section of `<|tool_call_begin|>functions.name:N<|tool_call_argument_begin|>{...}<|tool_call_end|>`.
pub(crate) const KIMI_K2: Format = Format {
    name: "kimi_k2",
    starts: &[(KIMI_BEGIN, End::Marker(KIMI_END))],
    leading: &[],
    parse: kimi,
    special_tokens: true,
    head: Some(kimi_head),
    viable: None,
};
