//! Incremental argument streaming inside a tool-call section.
//!
//! A [`Streamer`] walks a section's text as it grows. A format that supports streaming
//! gives a [`HeadFn`]: it reads the text before one call's arguments (markers, the
//! name, a JSON call object's keys) and says where the arguments object starts. Once the
//! name is complete, allowed (declared, and permitted by `tool_choice` /
//! `parallel_tool_calls`) and the arguments begin with `{`, the call is *committed*: its
//! name goes out at once, then the arguments text as it arrives, up to the `}` that closes
//! the object (a bracket-and-string scan, [`ObjectScan`]). Before a commit nothing of the
//! section is sent, so an undeclared call or text that is not a call falls back to content
//! whole, as with formats that do not stream.
//!
//! The complete section is then parsed as usual ([`super::Format::parse`]) and checked
//! against what was sent: when the parse agrees (same names, arguments beginning with
//! what was sent) the rest of the calls follow; when it does not (the arguments turned
//! out to be invalid JSON, the section never closed, a later call is undeclared), what was
//! sent stays sent and the section's text from the first unsent byte on is content.
//!
//! Every step is linear in the new text: the head of a call is re-read while incomplete,
//! but never past [`MAX_HEAD`] bytes.

use super::head::{Head, HeadFn};

/// The most bytes a call's head (markers, name, keys before the arguments) may take;
/// a longer head is not streamed (the section is then parsed whole, as formats without
/// streaming). 512 is far above real heads (`{"name": "get_current_weather",
/// "arguments": ` is 45 bytes) and bounds the re-reading of an incomplete head.
pub(crate) const MAX_HEAD: usize = 512;

/// Finds the end of a JSON object by brackets and strings (not a validator: the
/// section's parse validates).
#[derive(Debug, Clone, Default)]
pub(crate) struct ObjectScan {
    depth: u32,
    in_str: bool,
    esc: bool,
}

impl ObjectScan {
    /// Scan `bytes` (the first call starts at the object's `{`); the offset just past
    /// the closing `}` when the object closes within them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &b) in bytes.iter().enumerate() {
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if b == b'\\' {
                    self.esc = true;
                } else if b == b'"' {
                    self.in_str = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_str = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// A committed call: its name and the span of the section sent as its arguments.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) name: String,
    /// Where its arguments start (the `{`).
    pub(crate) from: usize,
    /// The end of what was sent.
    pub(crate) to: usize,
}

#[derive(Debug, Clone)]
enum State {
    Head,
    Args(ObjectScan),
    /// Streaming stopped for this section.
    Off,
}

/// What a streamer emits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Emit {
    /// A call is committed.
    Start { name: String, id: Option<String> },
    /// A piece of its arguments.
    Args(String),
}

/// The streaming state of one section.
#[derive(Debug, Clone)]
pub(crate) struct Streamer {
    head: HeadFn,
    pos: usize,
    state: State,
    pub(crate) sent: Vec<Sent>,
}

impl Streamer {
    /// A streamer whose first head starts at byte `pos` of the section.
    pub(crate) fn new(head: HeadFn, pos: usize) -> Self {
        Self {
            head,
            pos,
            state: State::Head,
            sent: Vec::new(),
        }
    }

    /// Read `section[..limit]` (it only grows between calls); `allowed(name, calls
    /// committed in this section)` says whether a call may be committed.
    pub(crate) fn advance(
        &mut self,
        section: &str,
        limit: usize,
        allowed: &dyn Fn(&str, usize) -> bool,
        out: &mut impl FnMut(Emit),
    ) {
        while self.pos < limit {
            match &mut self.state {
                State::Off => return,
                State::Head => match (self.head)(&section[self.pos..limit]) {
                    Head::Need => {
                        if limit - self.pos > MAX_HEAD {
                            self.state = State::Off;
                        }
                        return;
                    }
                    Head::Bad => {
                        self.state = State::Off;
                        return;
                    }
                    Head::Call { name, id, args_at } => {
                        if !allowed(&name, self.sent.len()) {
                            self.state = State::Off;
                            return;
                        }
                        let from = self.pos + args_at;
                        self.sent.push(Sent {
                            name: name.clone(),
                            from,
                            to: from,
                        });
                        out(Emit::Start { name, id });
                        self.pos = from;
                        self.state = State::Args(ObjectScan::default());
                    }
                },
                State::Args(scan) => {
                    let closed = scan
                        .feed(&section.as_bytes()[self.pos..limit])
                        .map(|k| self.pos + k);
                    let end = closed.unwrap_or(limit);
                    if let Some(last) = self.sent.last_mut() {
                        out(Emit::Args(section[last.to..end].to_owned()));
                        last.to = end;
                    }
                    self.pos = end;
                    if closed.is_some() {
                        self.state = State::Head;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_scan_finds_the_end_across_pieces() {
        let s = br#"{"a": "}\"{", "b": [1, {"c": 2}]} tail"#;
        for cut in 1..s.len() {
            let mut scan = ObjectScan::default();
            let got = scan
                .feed(&s[..cut])
                .or_else(|| scan.feed(&s[cut..]).map(|k| k + cut));
            assert_eq!(got, Some(s.len() - 5), "{cut}");
        }
    }
}
