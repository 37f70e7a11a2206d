//! Tool-call parsers: find a model's tool calls in its output text, incrementally.
//!
//! Every format is described by [`Format`]: the markers that open a tool-call section
//! (anywhere in the text, or only as the first non-blank text of the output), how a
//! section ends (a closing marker, or the end of the output), and a function that turns a
//! complete section into calls. [`ToolCallParser`] is the one streaming engine for all of
//! them: text outside sections is content and streams at once (only a tail that may
//! still become an opening marker is held back). Inside a section, formats whose
//! arguments are a JSON object stream each call (its name once known and allowed, then
//! its arguments as they arrive: `stream.rs`); the others hold the section until it is
//! complete. The complete section is parsed and checked against what streamed. A section
//! that does not parse, or that calls a function the request did not declare, is released
//! as content (from its first unsent byte, when a call of it already streamed): nothing
//! the model wrote is ever lost. A leading section (bare JSON or a Python list) is
//! released as content as soon as it can no longer be calls.

mod format;
mod head;
mod json;
mod pythonic;
mod special;
pub(crate) mod stream;
mod xml;

use std::sync::Arc;

use stream::{Emit, Streamer};

use super::text::{find_first, partial_suffix_len};

pub use format::{End, Format, RawCall, SectionParser, ToolSet};

/// What a call filter allows.
#[derive(Debug, Clone, Default)]
pub struct CallPolicy {
    /// Only this function (`tool_choice` naming one).
    pub only: Option<String>,
    /// At most one call (`parallel_tool_calls: false`).
    pub single: bool,
}

/// One output of the tool-call parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text for `content`.
    Content(String),
    /// A call begins: its function name, and the id the model wrote when the format has
    /// one. Its arguments follow as [`ToolEvent::CallArgs`].
    CallStart {
        /// The function name.
        name: String,
        /// The model's call id (Kimi, Mistral `[CALL_ID]`).
        id: Option<String>,
    },
    /// A piece of the arguments (JSON text) of the call last started.
    CallArgs(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before any non-blank text (leading markers possible).
    Leading,
    Content,
    /// Inside a section that ends as given.
    Section(End),
}

/// The streaming engine of one output.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: &'static Format,
    tools: Arc<ToolSet>,
    policy: CallPolicy,
    mode: Mode,
    buf: String,
    /// Section mode: where the search for the closing marker resumes.
    scan: usize,
    /// Calls emitted so far.
    calls: usize,
    /// Calls emitted before the open section.
    calls_at_open: usize,
    /// Blank text held: after a call (dropped before the next call or the end), or
    /// before a section (dropped when it is calls, kept when it falls back to content).
    blank: String,
    /// The open section's argument streamer (formats that stream).
    stream: Option<Streamer>,
    /// The open section is a leading one not yet known to be able to hold calls.
    judging: bool,
    start_markers: Vec<&'static str>,
}

/// Whether a call to `name` may be made after `calls` calls.
fn allowed(tools: &ToolSet, policy: &CallPolicy, name: &str, calls: usize) -> bool {
    tools.has(name)
        && policy.only.as_ref().is_none_or(|only| only == name)
        && !(policy.single && calls > 0)
}

impl ToolCallParser {
    /// A parser for one output of `format`, accepting calls to `tools` under `policy`.
    pub fn new(format: &'static Format, tools: Arc<ToolSet>, policy: CallPolicy) -> Self {
        Self {
            format,
            tools,
            policy,
            mode: if format.leading.is_empty() {
                Mode::Content
            } else {
                Mode::Leading
            },
            buf: String::new(),
            scan: 0,
            calls: 0,
            calls_at_open: 0,
            blank: String::new(),
            stream: None,
            judging: false,
            start_markers: format.starts.iter().map(|(m, _)| *m).collect(),
        }
    }

    /// Calls emitted so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feed the next content text.
    pub fn feed(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if matches!(self.mode, Mode::Content) && self.buf.is_empty() {
            // Fast path: nothing held; most text contains no marker at all.
            let keep = self.content_step(text, out);
            if let Some(keep) = keep {
                self.buf.push_str(&text[text.len() - keep..]);
                return;
            }
            // A section opened: the rest of the text is in `buf`; go on below.
        } else {
            self.buf.push_str(text);
        }
        self.run(out);
    }

    /// Content mode over borrowed text: `Some(tail to hold)` when no section opened,
    /// `None` after moving the text from the opening marker on into `buf`.
    fn content_step(&mut self, text: &str, out: &mut Vec<ToolEvent>) -> Option<usize> {
        match find_first(text, &self.start_markers) {
            Some((pos, i)) => {
                self.content(&text[..pos], out);
                let (marker, end) = self.format.starts[i];
                self.open_section(end, marker.len(), false);
                self.buf.push_str(&text[pos..]);
                None
            }
            None => {
                let keep = partial_suffix_len(text, &self.start_markers);
                self.content(&text[..text.len() - keep], out);
                Some(keep)
            }
        }
    }

    /// A section opens; `body` is where its calls start (after the opening marker; 0 for
    /// a leading section, whose marker is the calls' first character).
    fn open_section(&mut self, end: End, body: usize, leading: bool) {
        self.mode = Mode::Section(end);
        self.scan = body;
        self.calls_at_open = self.calls;
        self.judging = leading && self.format.viable.is_some();
        self.stream = self.format.head.map(|h| Streamer::new(h, body));
    }

    fn run(&mut self, out: &mut Vec<ToolEvent>) {
        loop {
            match self.mode {
                Mode::Leading => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    let mut partial = false;
                    let mut hit = false;
                    for m in self.format.leading {
                        if t.starts_with(m) {
                            hit = true;
                            break;
                        }
                        partial |= m.starts_with(t);
                    }
                    if hit {
                        // The leading blank is held: dropped if the section is calls.
                        let skip = self.buf.len() - t.len();
                        let lead: String = self.buf.drain(..skip).collect();
                        self.open_section(End::Output, 0, true);
                        self.blank.push_str(&lead);
                        continue;
                    }
                    if partial {
                        return;
                    }
                    self.mode = Mode::Content;
                }
                Mode::Content => {
                    let buf = std::mem::take(&mut self.buf);
                    match self.content_step(&buf, out) {
                        Some(keep) => {
                            self.buf.push_str(&buf[buf.len() - keep..]);
                            return;
                        }
                        None => {
                            // `content_step` put the section's text in `buf`.
                            continue;
                        }
                    }
                }
                Mode::Section(End::Output) => {
                    if self.judging {
                        let viable = self.format.viable.and_then(|v| {
                            let (tools, policy) = (&self.tools, &self.policy);
                            v(&self.buf, &|n| allowed(tools, policy, n, 0))
                        });
                        match viable {
                            None => return,
                            Some(true) => self.judging = false,
                            Some(false) => {
                                // It can no longer be calls: it is content, markers
                                // and all (a start marker later in it still counts).
                                self.judging = false;
                                self.stream = None;
                                self.mode = Mode::Content;
                                continue;
                            }
                        }
                    }
                    let buf = std::mem::take(&mut self.buf);
                    self.stream_section(&buf, buf.len(), out);
                    self.buf = buf;
                    return;
                }
                Mode::Section(End::Marker(m)) => {
                    let from = super::text::floor_boundary(
                        &self.buf,
                        self.scan.saturating_sub(m.len().saturating_sub(1)),
                    );
                    match super::text::find(&self.buf[from..], m) {
                        Some(p) => {
                            let end = from + p + m.len();
                            let rest = self.buf.split_off(end);
                            let section = std::mem::replace(&mut self.buf, rest);
                            self.stream_section(&section, section.len() - m.len(), out);
                            self.section(&section, out);
                            self.mode = Mode::Content;
                        }
                        None => {
                            self.scan = self.buf.len();
                            let buf = std::mem::take(&mut self.buf);
                            // A tail that may be the closing marker is not streamed yet.
                            let limit = buf.len() - partial_suffix_len(&buf, &[m]);
                            self.stream_section(&buf, limit, out);
                            self.buf = buf;
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Stream the open section's calls over `section[..limit]`.
    fn stream_section(&mut self, section: &str, limit: usize, out: &mut Vec<ToolEvent>) {
        let Some(mut st) = self.stream.take() else {
            return;
        };
        let (tools, policy, before) = (&self.tools, &self.policy, self.calls_at_open);
        let ok = |name: &str, in_section: usize| allowed(tools, policy, name, before + in_section);
        let mut started = 0;
        st.advance(section, limit, &ok, &mut |e| match e {
            Emit::Start { name, id } => {
                started += 1;
                out.push(ToolEvent::CallStart { name, id });
            }
            Emit::Args(a) => push_args(out, a),
        });
        if started > 0 {
            self.blank.clear();
            self.calls += started;
        }
        self.stream = Some(st);
    }

    /// Emit content, holding blank text that follows a call.
    fn content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if text.is_empty() {
            return;
        }
        if self.calls > 0 && text.trim().is_empty() {
            self.blank.push_str(text);
            return;
        }
        let mut s = std::mem::take(&mut self.blank);
        s.push_str(text);
        push_content(out, s);
    }

    /// A complete section (its streaming done): the rest of its calls, or content when
    /// it does not qualify (see the module doc of [`stream`]).
    fn section(&mut self, section: &str, out: &mut Vec<ToolEvent>) {
        let sent = self.stream.take().map(|s| s.sent).unwrap_or_default();
        let parsed = if self.policy.single && self.calls_at_open > 0 {
            // `parallel_tool_calls: false` and a call was made: later sections are text.
            None
        } else {
            (self.format.parse)(section, &self.tools).filter(|calls| {
                !calls.is_empty()
                    && calls.iter().all(|c| {
                        self.tools.has(&c.name)
                            && self.policy.only.as_ref().is_none_or(|only| *only == c.name)
                    })
            })
        };
        let agrees = |calls: &[RawCall]| {
            calls.len() >= sent.len()
                && sent.iter().zip(calls).enumerate().all(|(i, (s, c))| {
                    let text = &section[s.from..s.to];
                    s.name == c.name
                        && c.arguments.starts_with(text)
                        && (i + 1 == sent.len() || c.arguments.len() == text.len())
                })
        };
        match parsed {
            Some(calls) if agrees(&calls) => {
                let take = if self.policy.single { 1 } else { calls.len() };
                let mut calls = calls.into_iter().take(take);
                if let Some(s) = sent.last() {
                    // The rest of the last streamed call's arguments (empty unless its
                    // object never closed in the text yet parsed).
                    if let Some(c) = calls.by_ref().take(sent.len()).last() {
                        push_args(out, c.arguments[s.to - s.from..].to_owned());
                    }
                }
                for c in calls {
                    self.calls += 1;
                    out.push(ToolEvent::CallStart {
                        name: c.name,
                        id: c.id,
                    });
                    push_args(out, c.arguments);
                }
                self.blank.clear();
            }
            _ => {
                let s = match sent.last() {
                    None => std::mem::take(&mut self.blank) + section,
                    // What was sent stays sent; the rest of the section is content.
                    Some(s) => section[s.to..].to_owned(),
                };
                push_content(out, s);
            }
        }
    }

    /// The output ended: parse an open section (it may lack only its closing marker) and
    /// release held text. Blank text after the last call is dropped.
    pub fn finish(&mut self, out: &mut Vec<ToolEvent>) {
        let buf = std::mem::take(&mut self.buf);
        match self.mode {
            Mode::Section(_) => {
                self.stream_section(&buf, buf.len(), out);
                self.section(&buf, out);
            }
            Mode::Leading | Mode::Content => self.content(&buf, out),
        }
        self.mode = Mode::Content;
        self.blank.clear();
    }
}

fn push_content(out: &mut Vec<ToolEvent>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(ToolEvent::Content(last)) = out.last_mut() {
        last.push_str(&s);
    } else {
        out.push(ToolEvent::Content(s));
    }
}

fn push_args(out: &mut Vec<ToolEvent>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(ToolEvent::CallArgs(last)) = out.last_mut() {
        last.push_str(&s);
    } else {
        out.push(ToolEvent::CallArgs(s));
    }
}

/// Every format, by canonical name.
pub static FORMATS: &[Format] = &[
    json::HERMES,
    json::LLAMA3_JSON,
    json::PHI4,
    json::NEMOTRON_DECI,
    json::JAMBA,
    json::DEFAULT,
    special::MISTRAL,
    special::DEEPSEEK_V3,
    special::DEEPSEEK_V3_1,
    special::KIMI_K2,
    xml::QWEN3_CODER,
    xml::GLM45,
    xml::DEEPSEEK_V3_2,
    xml::MINIMAX_M2,
    pythonic::PYTHONIC,
];

/// The format of canonical name `name`.
pub fn format(name: &str) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.name == name)
}

#[cfg(test)]
mod tests;
