//! Reasoning parsers: split a model's output into reasoning text and answer text.
//!
//! Every supported format is a pair of markers around the reasoning (`<think>` /
//! `</think>`, `[THINK]` / `[/THINK]`, granite's plain-text phrases, ...) and one flag:
//! whether the output starts inside the reasoning (templates that open `<think>` in the
//! prompt, e.g. DeepSeek-R1). The parser is incremental: it holds back only a tail that
//! may still become a marker.

use super::text::{find_first, partial_suffix_len};

/// A reasoning format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningFormat {
    /// Opens the reasoning.
    pub start: &'static str,
    /// Closes it.
    pub end: &'static str,
    /// The output begins inside the reasoning (the start marker is in the prompt); a
    /// leading start marker is still accepted and dropped.
    pub starts_in_reasoning: bool,
}

/// `<think>` … `</think>`, reasoning only after an explicit `<think>`.
pub const THINK: ReasoningFormat = ReasoningFormat {
    start: "<think>",
    end: "</think>",
    starts_in_reasoning: false,
};

/// `<think>` opened by the prompt: everything before `</think>` is reasoning.
pub const THINK_FORCED: ReasoningFormat = ReasoningFormat {
    start: "<think>",
    end: "</think>",
    starts_in_reasoning: true,
};

/// Granite's plain-text markers.
pub const GRANITE: ReasoningFormat = ReasoningFormat {
    start: "Here is my thought process:",
    end: "Here is my response:",
    starts_in_reasoning: false,
};

/// Kimi (k1.5 style) markers.
pub const KIMI: ReasoningFormat = ReasoningFormat {
    start: "◁think▷",
    end: "◁/think▷",
    starts_in_reasoning: false,
};

/// Mistral (Magistral) markers.
pub const MISTRAL: ReasoningFormat = ReasoningFormat {
    start: "[THINK]",
    end: "[/THINK]",
    starts_in_reasoning: false,
};

/// Where text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// `reasoning_content`.
    Reasoning,
    /// `content`.
    Content,
}

/// Incremental splitter for one [`ReasoningFormat`].
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    format: ReasoningFormat,
    in_reasoning: bool,
    /// Nothing but whitespace was seen yet (a leading start marker is dropped when the
    /// output starts in reasoning).
    at_start: bool,
    held: String,
}

impl ReasoningParser {
    /// A parser at the start of an output.
    pub fn new(format: ReasoningFormat) -> Self {
        Self {
            format,
            in_reasoning: format.starts_in_reasoning,
            at_start: true,
            held: String::new(),
        }
    }

    /// Feed the next text; `emit(channel, text)` receives what is decided.
    pub fn feed(&mut self, text: &str, emit: &mut impl FnMut(Channel, &str)) {
        if self.held.is_empty() {
            // Common case: no held tail; work on the borrowed text.
            let rest = self.run(text, emit);
            if rest > 0 {
                self.held.push_str(&text[text.len() - rest..]);
            }
            return;
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        let rest = self.run(&buf, emit);
        buf.drain(..buf.len() - rest);
        self.held = buf;
    }

    /// Process `buf`; returns the length of the tail to hold back.
    fn run(&mut self, mut buf: &str, emit: &mut impl FnMut(Channel, &str)) -> usize {
        loop {
            if self.at_start {
                let t = buf.trim_start();
                if t.is_empty() {
                    // Leading whitespace: hold it until we know whether a marker follows.
                    return buf.len();
                }
                let start = self.format.start;
                if start.starts_with(t) && t.len() < start.len() {
                    return buf.len();
                }
                self.at_start = false;
                if let Some(after) = t.strip_prefix(start) {
                    // A leading start marker: drop it (and the whitespace before it).
                    self.in_reasoning = true;
                    buf = after;
                    continue;
                }
            }
            let (marker, channel) = if self.in_reasoning {
                (self.format.end, Channel::Reasoning)
            } else {
                (self.format.start, Channel::Content)
            };
            match find_first(buf, &[marker]) {
                Some((pos, _)) => {
                    if pos > 0 {
                        emit(channel, &buf[..pos]);
                    }
                    self.in_reasoning = !self.in_reasoning;
                    buf = &buf[pos + marker.len()..];
                }
                None => {
                    let keep = partial_suffix_len(buf, &[marker]);
                    let cut = buf.len() - keep;
                    if cut > 0 {
                        emit(channel, &buf[..cut]);
                    }
                    return keep;
                }
            }
        }
    }

    /// The output ended: release what was held (a marker that never completed is text).
    pub fn finish(&mut self, emit: &mut impl FnMut(Channel, &str)) {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return;
        }
        let channel = if self.in_reasoning {
            Channel::Reasoning
        } else {
            Channel::Content
        };
        emit(channel, &held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: ReasoningFormat, pieces: &[&str]) -> (String, String) {
        let mut p = ReasoningParser::new(format);
        let (mut r, mut c) = (String::new(), String::new());
        let mut emit = |ch: Channel, t: &str| match ch {
            Channel::Reasoning => r.push_str(t),
            Channel::Content => c.push_str(t),
        };
        for piece in pieces {
            p.feed(piece, &mut emit);
        }
        p.finish(&mut emit);
        (r, c)
    }

    #[test]
    fn think_tags() {
        assert_eq!(
            run(THINK, &["<th", "ink>why", "</thi", "nk>answer"]),
            ("why".into(), "answer".into())
        );
        assert_eq!(run(THINK, &["plain"]), ("".into(), "plain".into()));
        assert_eq!(
            run(THINK_FORCED, &["why</think>ans"]),
            ("why".into(), "ans".into())
        );
        assert_eq!(
            run(THINK_FORCED, &["<think>why</think>ans"]),
            ("why".into(), "ans".into())
        );
        // Unterminated reasoning stays reasoning (the model ran out of tokens).
        assert_eq!(run(THINK, &["<think>hmm"]), ("hmm".into(), "".into()));
        // A marker that never completes is text.
        assert_eq!(run(THINK, &["a <thi"]), ("".into(), "a <thi".into()));
        assert_eq!(
            run(
                GRANITE,
                &["Here is my thought process: x Here is my response: y"]
            ),
            (" x ".into(), " y".into())
        );
    }
}
