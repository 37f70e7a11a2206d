//! gpt-oss "harmony" output: messages `<|channel|>NAME [to=RECIPIENT] ...<|message|>BODY`
//! ended by `<|end|>`, `<|call|>` or `<|return|>`, each after an optional
//! `<|start|>assistant`. The `analysis` channel is reasoning, `final` (and `commentary`
//! without a recipient) is content, and a message to `functions.NAME` is a tool call whose
//! body is the JSON arguments. One parser serves both the `harmony` tool parser and the
//! `gpt_oss` reasoning parser.

//!
//! A call's arguments stream as they arrive once its function is known to be allowed and
//! its body starts with `{` (see `tool_calls/stream.rs` for the rule when the body
//! then turns out malformed).

use super::event::ParseEvent;
use super::text::{find_first, floor_boundary, partial_suffix_len};
use super::tool_calls::stream::ObjectScan;
use super::tool_calls::{CallPolicy, RawCall, ToolSet};

const MESSAGE: &str = "<|message|>";
const HEADER_STARTS: &[&str] = &["<|start|>", "<|channel|>"];
/// What ends a message body.
const BODY_ENDS: &[&str] = &[
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|start|>",
    "<|channel|>",
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call to this function.
    Call(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Text outside any message: content until a header starts.
    Outside,
    /// Reading a header (up to `<|message|>`).
    Header,
    /// Inside a message body.
    Body(Body),
}

/// The longest body terminator, less one: how far back the search for one resumes.
const END_OVERLAP: usize = "<|channel|>".len() - 1;

/// A call body being streamed: where its arguments start and how far they were sent.
#[derive(Debug, Clone)]
struct Streamed {
    from: usize,
    to: usize,
    scan: ObjectScan,
    closed: bool,
}

/// The incremental harmony parser of one output.
#[derive(Debug, Clone)]
pub struct HarmonyParser {
    state: State,
    buf: String,
    /// `None`: tool calls are not parsed (their bodies are content).
    tools: Option<(std::sync::Arc<ToolSet>, CallPolicy)>,
    calls: usize,
    /// The open call body's streaming (`None`: not committed yet).
    streamed: Option<Streamed>,
    /// The open call body is not streamed (held whole, as before a commit).
    stream_off: bool,
    /// Call body: where the search for its terminator resumes.
    body_scan: usize,
}

impl HarmonyParser {
    /// A parser at the start of an output (which begins with a header: the prompt ends
    /// with `<|start|>assistant`).
    pub fn new(tools: Option<(std::sync::Arc<ToolSet>, CallPolicy)>) -> Self {
        Self {
            state: State::Header,
            buf: String::new(),
            tools,
            calls: 0,
            streamed: None,
            stream_off: false,
            body_scan: 0,
        }
    }

    /// Feed text.
    pub fn feed(&mut self, text: &str, out: &mut Vec<ParseEvent>) {
        self.buf.push_str(text);
        self.run(out);
    }

    fn run(&mut self, out: &mut Vec<ParseEvent>) {
        loop {
            match &self.state {
                State::Outside => match find_first(&self.buf, HEADER_STARTS) {
                    Some((p, _)) => {
                        let text = take_front(&mut self.buf, p);
                        emit(out, ParseEvent::Content(text));
                        self.state = State::Header;
                    }
                    None => {
                        let keep = partial_suffix_len(&self.buf, HEADER_STARTS);
                        let n = self.buf.len() - keep;
                        let text = take_front(&mut self.buf, n);
                        emit(out, ParseEvent::Content(text));
                        return;
                    }
                },
                State::Header => {
                    let t = self.buf.trim_start();
                    if !t.is_empty()
                        && !HEADER_STARTS
                            .iter()
                            .any(|h| t.starts_with(h) || h.starts_with(t))
                    {
                        // Not harmony structure: plain text.
                        self.state = State::Outside;
                        continue;
                    }
                    let Some(p) = self.buf.find(MESSAGE) else {
                        return;
                    };
                    let header = take_front(&mut self.buf, p + MESSAGE.len());
                    self.state = State::Body(self.body_of(&header[..p]));
                    self.streamed = None;
                    self.stream_off = false;
                    self.body_scan = 0;
                }
                State::Body(body) => {
                    let body = body.clone();
                    // Only call bodies stay in `buf` while they grow: resume the search.
                    let from =
                        floor_boundary(&self.buf, self.body_scan.saturating_sub(END_OVERLAP));
                    match find_first(&self.buf[from..], BODY_ENDS).map(|(p, i)| (p + from, i)) {
                        Some((p, i)) => {
                            if let Body::Call(name) = &body {
                                self.stream_call(name, p, out);
                            }
                            let text = take_front(&mut self.buf, p);
                            self.body_text(&body, text, true, out);
                            // `<|start|>` / `<|channel|>` begin the next header; the
                            // other markers are dropped.
                            if BODY_ENDS[i] != "<|start|>" && BODY_ENDS[i] != "<|channel|>" {
                                self.buf.drain(..BODY_ENDS[i].len());
                            }
                            self.state = State::Header;
                        }
                        None => {
                            if let Body::Call(name) = &body {
                                self.body_scan = self.buf.len();
                                let limit =
                                    self.buf.len() - partial_suffix_len(&self.buf, BODY_ENDS);
                                self.stream_call(name, limit, out);
                                return;
                            }
                            let keep = partial_suffix_len(&self.buf, BODY_ENDS);
                            let n = self.buf.len() - keep;
                            let text = take_front(&mut self.buf, n);
                            self.body_text(&body, text, false, out);
                            return;
                        }
                    }
                }
            }
        }
    }

    fn body_of(&self, header: &str) -> Body {
        let channel = header
            .split("<|channel|>")
            .nth(1)
            .and_then(|c| c.split(|ch: char| ch.is_whitespace() || ch == '<').next())
            .unwrap_or("");
        let recipient = header
            .split_whitespace()
            .flat_map(|w| w.split("<|"))
            .find_map(|w| w.strip_prefix("to="))
            .map(|r| r.split("<|").next().unwrap_or(r));
        match recipient.and_then(|r| r.strip_prefix("functions.")) {
            Some(name) if self.tools.is_some() => Body::Call(name.to_owned()),
            _ if channel == "analysis" => Body::Reasoning,
            _ => Body::Content,
        }
    }

    fn body_text(&mut self, body: &Body, text: String, complete: bool, out: &mut Vec<ParseEvent>) {
        match body {
            Body::Reasoning => emit(out, ParseEvent::Reasoning(text)),
            Body::Content => emit(out, ParseEvent::Content(text)),
            Body::Call(name) => {
                debug_assert!(complete);
                match self.streamed.take() {
                    None => match self.call(name, &text) {
                        Some(call) => {
                            self.calls += 1;
                            out.push(ParseEvent::CallStart {
                                name: call.name,
                                id: None,
                            });
                            emit(out, ParseEvent::CallArgs(call.arguments));
                        }
                        None => emit(out, ParseEvent::Content(text)),
                    },
                    Some(st) => {
                        let trimmed = text.trim();
                        let valid = trimmed == &text[st.from..st.to]
                            && serde_json::from_str::<serde_json::Value>(trimmed)
                                .is_ok_and(|v| v.is_object());
                        if !valid {
                            // What was sent stays sent; the rest of the body is content.
                            emit(out, ParseEvent::Content(text[st.to..].to_owned()));
                        }
                    }
                }
            }
        }
    }

    /// Whether a call to `name` may be made now.
    fn allowed(&self, name: &str) -> bool {
        self.tools.as_ref().is_some_and(|(tools, policy)| {
            tools.has(name)
                && policy.only.as_ref().is_none_or(|o| o == name)
                && !(policy.single && self.calls > 0)
        })
    }

    /// Stream the open call body's arguments over `buf[..limit]`.
    fn stream_call(&mut self, name: &str, limit: usize, out: &mut Vec<ParseEvent>) {
        if self.stream_off {
            return;
        }
        if self.streamed.is_none() {
            let t = &self.buf[..limit];
            let from = t.len() - t.trim_start().len();
            if from == limit {
                return;
            }
            if t.as_bytes()[from] != b'{' || !self.allowed(name) {
                self.stream_off = true;
                return;
            }
            self.calls += 1;
            out.push(ParseEvent::CallStart {
                name: name.to_owned(),
                id: None,
            });
            self.streamed = Some(Streamed {
                from,
                to: from,
                scan: ObjectScan::default(),
                closed: false,
            });
        }
        let Some(st) = self.streamed.as_mut() else {
            return;
        };
        if st.closed || st.to >= limit {
            return;
        }
        let end = match st.scan.feed(&self.buf.as_bytes()[st.to..limit]) {
            Some(k) => {
                st.closed = true;
                st.to + k
            }
            None => limit,
        };
        let piece = self.buf[st.to..end].to_owned();
        st.to = end;
        emit(out, ParseEvent::CallArgs(piece));
    }

    fn call(&self, name: &str, args: &str) -> Option<RawCall> {
        let (tools, policy) = self.tools.as_ref()?;
        if !tools.has(name)
            || policy.only.as_ref().is_some_and(|o| o != name)
            || (policy.single && self.calls > 0)
        {
            return None;
        }
        let args = args.trim();
        let v: serde_json::Value = serde_json::from_str(args).ok()?;
        v.is_object().then(|| RawCall {
            name: name.to_owned(),
            arguments: args.to_owned(),
            id: None,
        })
    }

    /// The output ended (the last terminator may be a stop token the engine did not
    /// send): close the open message. A header that never reached its body is structure,
    /// not text, and is dropped.
    pub fn finish(&mut self, out: &mut Vec<ParseEvent>) {
        if let State::Body(Body::Call(name)) = &self.state {
            let name = name.clone();
            self.stream_call(&name, self.buf.len(), out);
        }
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Header) {
            State::Outside => emit(out, ParseEvent::Content(rest)),
            State::Header => {
                let t = rest.trim_start();
                if !HEADER_STARTS.iter().any(|h| t.starts_with(h)) {
                    emit(out, ParseEvent::Content(rest));
                }
            }
            State::Body(body) => self.body_text(&body, rest, true, out),
        }
    }
}

/// The first `n` bytes of `buf`, removed from it.
fn take_front(buf: &mut String, n: usize) -> String {
    let front = buf[..n].to_owned();
    buf.drain(..n);
    front
}

fn emit(out: &mut Vec<ParseEvent>, e: ParseEvent) {
    match e {
        ParseEvent::Content(s) | ParseEvent::Reasoning(s) if s.is_empty() => {}
        ParseEvent::Content(s) => {
            if let Some(ParseEvent::Content(last)) = out.last_mut() {
                last.push_str(&s);
            } else {
                out.push(ParseEvent::Content(s));
            }
        }
        ParseEvent::Reasoning(s) => {
            if let Some(ParseEvent::Reasoning(last)) = out.last_mut() {
                last.push_str(&s);
            } else {
                out.push(ParseEvent::Reasoning(s));
            }
        }
        ParseEvent::CallArgs(s) if s.is_empty() => {}
        ParseEvent::CallArgs(s) => {
            if let Some(ParseEvent::CallArgs(last)) = out.last_mut() {
                last.push_str(&s);
            } else {
                out.push(ParseEvent::CallArgs(s));
            }
        }
        start @ ParseEvent::CallStart { .. } => out.push(start),
    }
}
