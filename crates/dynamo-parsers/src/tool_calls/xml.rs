//! XML-like formats whose parameters are separate elements: Qwen3-Coder, GLM-4.5/4.7,
//! DeepSeek V3.2 (DSML) and MiniMax M2. Parameter values are text, typed by the request's
//! tool schema (see [`super::format::param_json`]).

use super::format::{End, Format, ObjectText, RawCall, ToolSet, inner, param_json};

/// The text between `open` and `close` starting at the front of `s` (after blanks), and
/// what follows.
fn element<'a>(s: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
    let s = s.trim_start().strip_prefix(open)?;
    let p = s.find(close)?;
    Some((&s[..p], &s[p + close.len()..]))
}

/// One leading and one trailing newline around a value are layout, not value.
fn value_text(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

fn qwen3_coder(section: &str, tools: &ToolSet) -> Option<Vec<RawCall>> {
    let mut rest = inner(section, "<tool_call>", "</tool_call>").trim();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let body = rest.strip_prefix("<function=")?;
        let (head, after) = body.split_once('>')?;
        let name = head.trim();
        let (params, next) = match after.find("</function>") {
            Some(p) => (&after[..p], &after[p + "</function>".len()..]),
            None => (after, ""),
        };
        let mut args = ObjectText::new();
        let mut ps = params.trim();
        while !ps.is_empty() {
            let b = ps.strip_prefix("<parameter=")?;
            let (key, after) = b.split_once('>')?;
            let (value, next) = match after.find("</parameter>") {
                Some(p) => (&after[..p], &after[p + "</parameter>".len()..]),
                None => return None,
            };
            args.push(
                key.trim(),
                &param_json(tools, name, key.trim(), value_text(value)),
            );
            ps = next.trim();
        }
        if name.is_empty() {
            return None;
        }
        calls.push(RawCall {
            name: name.to_owned(),
            arguments: args.finish(),
            id: None,
        });
        rest = next.trim();
    }
    Some(calls)
}

/// Qwen3-Coder: `<tool_call><function=name><parameter=key>value</parameter></function></tool_call>`.
pub(crate) const QWEN3_CODER: Format = Format {
    name: "qwen3_coder",
    starts: &[("<tool_call>", End::Marker("</tool_call>"))],
    leading: &[],
    parse: qwen3_coder,
    special_tokens: false,
    head: None,
    viable: None,
};

fn glm(section: &str, tools: &ToolSet) -> Option<Vec<RawCall>> {
    let body = inner(section, "<tool_call>", "</tool_call>");
    let (name, mut rest) = match body.find("<arg_key>") {
        Some(p) => (&body[..p], &body[p..]),
        None => (body, ""),
    };
    let name = name.trim();
    if name.is_empty() || name.contains('<') || name.contains('{') {
        return None;
    }
    let mut args = ObjectText::new();
    while !rest.trim().is_empty() {
        let (key, after) = element(rest, "<arg_key>", "</arg_key>")?;
        let (value, next) = element(after, "<arg_value>", "</arg_value>")?;
        args.push(key.trim(), &param_json(tools, name, key.trim(), value));
        rest = next;
    }
    Some(vec![RawCall {
        name: name.to_owned(),
        arguments: args.finish(),
        id: None,
    }])
}

/// GLM-4.5 / 4.7: `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`
/// (4.5 puts newlines between the parts).
pub(crate) const GLM45: Format = Format {
    name: "glm45",
    starts: &[("<tool_call>", End::Marker("</tool_call>"))],
    leading: &[],
    parse: glm,
    special_tokens: false,
    head: None,
    viable: None,
};

/// `<{p}invoke name="f"><{p}parameter name="k" ...>v</{p}parameter></{p}invoke>` lists.
fn invokes(body: &str, p: &str, tools: &ToolSet) -> Option<Vec<RawCall>> {
    let invoke_open = format!("<{p}invoke name=\"");
    let invoke_close = format!("</{p}invoke>");
    let param_open = format!("<{p}parameter name=\"");
    let param_close = format!("</{p}parameter>");
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let b = rest.strip_prefix(invoke_open.as_str())?;
        let (name, after) = b.split_once('"')?;
        let after = after.trim_start().strip_prefix('>')?;
        let (params, next) = match after.find(invoke_close.as_str()) {
            Some(i) => (&after[..i], &after[i + invoke_close.len()..]),
            None => (after, ""),
        };
        let mut args = ObjectText::new();
        let mut ps = params.trim();
        while !ps.is_empty() {
            let b = ps.strip_prefix(param_open.as_str())?;
            let (key, after) = b.split_once('"')?;
            let (attrs, after) = after.split_once('>')?;
            let i = after.find(param_close.as_str())?;
            let value = &after[..i];
            // DSML marks raw strings `string="true"`; other values are JSON.
            let json = if attrs.contains("string=\"true\"") {
                serde_json::to_string(value).ok()?
            } else if attrs.contains("string=\"false\"") {
                let v = value.trim();
                serde_json::from_str::<serde_json::Value>(v).ok()?;
                v.to_owned()
            } else {
                param_json(tools, name, key, value_text(value))
            };
            args.push(key, &json);
            ps = after[i + param_close.len()..].trim();
        }
        if name.is_empty() {
            return None;
        }
        calls.push(RawCall {
            name: name.to_owned(),
            arguments: args.finish(),
            id: None,
        });
        rest = next.trim();
    }
    Some(calls)
}

const DSML_BEGIN: &str = "<｜DSML｜function_calls>";
const DSML_END: &str = "</｜DSML｜function_calls>";

fn dsml(section: &str, tools: &ToolSet) -> Option<Vec<RawCall>> {
    invokes(inner(section, DSML_BEGIN, DSML_END), "｜DSML｜", tools)
}

/// DeepSeek V3.2 DSML: `<｜DSML｜function_calls><｜DSML｜invoke name="f">...`.
pub(crate) const DEEPSEEK_V3_2: Format = Format {
    name: "deepseek_v3_2",
    starts: &[(DSML_BEGIN, End::Marker(DSML_END))],
    leading: &[],
    parse: dsml,
    special_tokens: true,
    head: None,
    viable: None,
};

fn minimax(section: &str, tools: &ToolSet) -> Option<Vec<RawCall>> {
    invokes(
        inner(section, "<minimax:tool_call>", "</minimax:tool_call>"),
        "",
        tools,
    )
}

/// MiniMax M2: `<minimax:tool_call><invoke name="f"><parameter name="k">v</parameter></invoke></minimax:tool_call>`.
pub(crate) const MINIMAX_M2: Format = Format {
    name: "minimax_m2",
    starts: &[("<minimax:tool_call>", End::Marker("</minimax:tool_call>"))],
    leading: &[],
    parse: minimax,
    special_tokens: false,
    head: None,
    viable: None,
};
