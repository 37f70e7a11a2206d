//! Hugging Face chat templates rendered with minijinja.
//!
//! The environment matches what `transformers` gives templates: `trim_blocks` and
//! `lstrip_blocks`, lenient undefined values, `raise_exception(msg)`, `strftime_now(fmt)`,
//! the `tojson` filter, Python string/dict methods (`.strip()`, `.startswith()`,
//! `.items()`, ...) and the variables `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`, `unk_token`, `pad_token`, `tools`, plus any `chat_template_kwargs`.

use std::sync::Arc;

use minijinja::{Environment, ErrorKind, Value};
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};

/// Template name inside the environment.
const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template with the model's special tokens.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// `bos_token`, `eos_token`, `unk_token`, `pad_token` as the template sees them
    /// (names and values made template values once: each render shares them).
    special_tokens: Vec<(&'static str, Value)>,
}

/// A token in `tokenizer_config.json`: a string or an `AddedToken` object.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}

/// The template of a `chat_template` value: a string, or a list of `{name, template}`
/// from which `default` is taken (else the first).
fn template_source(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Array(items) => {
            let named = |n: &str| {
                items.iter().find_map(|i| {
                    (i.get("name").and_then(Json::as_str) == Some(n))
                        .then(|| i.get("template").and_then(Json::as_str))
                        .flatten()
                })
            };
            named("default")
                .or_else(|| {
                    items
                        .first()
                        .and_then(|i| i.get("template"))
                        .and_then(Json::as_str)
                })
                .map(str::to_owned)
        }
        _ => None,
    }
}

/// `strftime_now(fmt)`: the current UTC time, for templates that print today's date.
/// Supports `%Y %m %d %B %b %H %M %S %%`.
fn strftime_now(fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

impl ChatTemplate {
    /// Compile `source` with the special tokens of `tokenizer_config` (a parsed
    /// `tokenizer_config.json`, or `Null`).
    ///
    /// # Errors
    /// [`Error::Template`] when the template does not compile.
    pub fn new(source: &str, tokenizer_config: &Json) -> Result<Self> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| Error::Template(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| Error::Template(format!("cannot compile: {e:#}")))?;
        let special_tokens = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .into_iter()
            .filter_map(|key| {
                let text = tokenizer_config.get(key).and_then(token_text)?;
                Some((key, Value::from(text)))
            })
            .collect();
        Ok(Self {
            env: Arc::new(env),
            special_tokens,
        })
    }

    /// The template of a parsed `tokenizer_config.json`, if it has one.
    ///
    /// # Errors
    /// [`Error::Template`] when the template does not compile.
    pub fn from_tokenizer_config(tokenizer_config: &Json) -> Result<Option<Self>> {
        tokenizer_config
            .get("chat_template")
            .and_then(template_source)
            .map(|src| Self::new(&src, tokenizer_config))
            .transpose()
    }

    /// A custom template file: raw jinja, or JSON with a `chat_template` key (as
    /// `tokenizer_config.json` or `chat_template.json` have).
    ///
    /// # Errors
    /// [`Error::Template`] when the file has no template or it does not compile.
    pub fn from_custom_file(content: &str, tokenizer_config: &Json) -> Result<Self> {
        if let Ok(json) = serde_json::from_str::<Json>(content)
            && json.is_object()
        {
            let src = json
                .get("chat_template")
                .and_then(template_source)
                .ok_or_else(|| {
                    Error::Template("custom template JSON has no chat_template".into())
                })?;
            return Self::new(&src, tokenizer_config);
        }
        Self::new(content, tokenizer_config)
    }

    /// The special token the template sees as `name` (e.g. `bos_token`).
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(key, _)| *key == name)
            .and_then(|(_, v)| v.as_str())
    }

    /// Render `messages` (each a JSON object with at least `role` and `content`).
    ///
    /// `extra` adds variables (`tools`, `chat_template_kwargs`, ...); it cannot override
    /// `messages` or `add_generation_prompt`.
    ///
    /// # Errors
    /// [`Error::Template`] when rendering fails, including a template's own
    /// `raise_exception` (which models use to reject malformed conversations: HTTP 400).
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String> {
        // Later pairs override earlier ones: `extra` can shadow a special token, not the
        // messages or the flag. The JSON is converted straight into template values (no
        // intermediate copy of the conversation).
        let ctx = Value::from_pairs(
            self.special_tokens
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .chain(extra.iter().map(|(k, v)| {
                    (
                        Value::from(k.as_str()),
                        Value::from(minijinja::value::Serde(v)),
                    )
                }))
                .chain([
                    (
                        Value::from("messages"),
                        Value::from(minijinja::value::Serde(messages)),
                    ),
                    (
                        Value::from("add_generation_prompt"),
                        Value::from(add_generation_prompt),
                    ),
                ]),
        );
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        tmpl.render(ctx).map_err(|e| {
            // `raise_exception` messages are the template author's words: pass them through.
            match e.kind() {
                ErrorKind::InvalidOperation => {
                    Error::Template(e.detail().unwrap_or("invalid operation").to_owned())
                }
                _ => Error::Template(format!("{e:#}")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CHATML: &str = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    fn msgs() -> Vec<Json> {
        vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
        ]
    }

    #[test]
    fn renders_chatml_with_special_tokens() {
        let cfg = json!({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}});
        let t = ChatTemplate::new(CHATML, &cfg).expect("compile");
        assert_eq!(t.special_token("eos_token"), Some("</s>"));
        let out = t.render(&msgs(), true, &Map::new()).expect("render");
        assert_eq!(
            out,
            "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&msgs(), false, &Map::new()).expect("render");
        assert!(out.ends_with("Hi<|im_end|>\n"), "{out}");
    }

    #[test]
    fn raise_exception_becomes_a_template_error() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, &Json::Null).expect("compile");
        let err = t.render(&msgs(), true, &Map::new()).expect_err("raises");
        assert_eq!(
            err.to_string(),
            "chat template error: Conversation must start with user"
        );
        assert_eq!(err.http_status(), 400);
    }

    #[test]
    fn hf_template_features() {
        // Whitespace control, loop variables, namespace(), tojson, python string methods,
        // trim_blocks/lstrip_blocks, kwargs and tools. Output follows Python: `True`, and
        // `tojson` with json.dumps' separators, as transformers renders it.
        let src = r#"
{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
    {%- set ns.n = ns.n + 1 -%}
    [{{ m.role | upper }}:{{ m.content.strip() }}{% if not loop.last %},{% endif %}]
{%- endfor -%}
{% if tools %}
TOOLS={{ tools | tojson }}
{% endif %}
{{- ns.n }}{{ " thinking" if enable_thinking else "" }}{{ "|" ~ ("abc".startswith("a")) }}"#;
        let t = ChatTemplate::new(src, &Json::Null).expect("compile");
        let messages = vec![
            json!({"role": "user", "content": "  hi  "}),
            json!({"role": "assistant", "content": "yo"}),
        ];
        let mut extra = Map::new();
        extra.insert(
            "tools".into(),
            json!([{"type": "function", "function": {"name": "f"}}]),
        );
        extra.insert("enable_thinking".into(), json!(true));
        let out = t.render(&messages, false, &extra).expect("render");
        assert_eq!(
            out,
            "[USER:hi,][ASSISTANT:yo]TOOLS=[{\"function\": {\"name\": \"f\"}, \"type\": \"function\"}]\n2 thinking|True"
        );
    }

    #[test]
    fn reasoning_model_template_idioms() {
        // Idioms of current open-model templates: reversed slices, `is string`, splitting
        // off reasoning, namespace flags, tool JSON, `loop.index0`.
        let src = r#"
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages[::-1] -%}
    {%- set i = (messages|length - 1) - loop.index0 -%}
    {%- if m.role == "user" and m.content is string and ns.last_query == -1 -%}
        {%- set ns.last_query = i -%}
    {%- endif -%}
{%- endfor -%}
{%- if tools -%}
<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
{% endif -%}
{%- for m in messages -%}
    {%- if m.role == "assistant" -%}
        {%- set content = m.content.split("</think>")[-1].lstrip("\n") -%}
        <a>{{ content }}</a>
    {%- else -%}
        <{{ m.role[0] }}{{ loop.index0 }}>{{ m.content }}
    {%- endif -%}
{%- endfor -%}
{{ "|last=" ~ ns.last_query }}"#;
        let t = ChatTemplate::new(src, &Json::Null).expect("compile");
        let messages = vec![
            json!({"role": "user", "content": "q1"}),
            json!({"role": "assistant", "content": "<think>hmm</think>\n\nA1"}),
            json!({"role": "user", "content": "q2"}),
        ];
        let mut extra = Map::new();
        extra.insert("tools".into(), json!([{"name": "f"}]));
        let out = t.render(&messages, true, &extra).expect("render");
        assert_eq!(
            out,
            "<tools>{\"name\": \"f\"}</tools>\n<u0>q1<a>A1</a><u2>q2|last=2"
        );
    }

    #[test]
    fn template_lists_and_custom_files() {
        let cfg = json!({"chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "default:{{ messages | length }}"}
        ]});
        let t = ChatTemplate::from_tokenizer_config(&cfg)
            .expect("ok")
            .expect("some");
        assert_eq!(
            t.render(&msgs(), true, &Map::new()).expect("render"),
            "default:2"
        );
        assert!(
            ChatTemplate::from_tokenizer_config(&json!({}))
                .expect("ok")
                .is_none()
        );
        let t = ChatTemplate::from_custom_file(
            r#"{"chat_template": "J{{ messages[1].content }}"}"#,
            &Json::Null,
        )
        .expect("json");
        assert_eq!(t.render(&msgs(), true, &Map::new()).expect("render"), "JHi");
        let t = ChatTemplate::from_custom_file("raw {{ messages[0].content }}", &Json::Null)
            .expect("raw");
        assert_eq!(
            t.render(&msgs(), true, &Map::new()).expect("render"),
            "raw Be brief."
        );
        assert!(ChatTemplate::new("{% for %}", &Json::Null).is_err());
    }

    #[test]
    fn strftime_now_formats_a_date() {
        let s = strftime_now("%d %b %Y|%%");
        assert_eq!(s.len(), "01 Jan 2026|%".len(), "{s}");
        assert!(s.ends_with("|%"));
    }
}
