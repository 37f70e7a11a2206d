//! Incremental detokenization and stop strings.
//!
//! [`IncrementalDecoder`] turns a growing token sequence into text deltas that are always
//! valid UTF-8: a token that ends in the middle of a multi-byte character produces no text
//! until the character is complete. It decodes a small window (the tokens since the last
//! emission plus the ones before them as context), so the cost per token does not grow with
//! the sequence, and tokenizers whose decoders depend on context (SentencePiece's leading
//! space) still come out right. Invariant: the concatenation of every delta plus
//! [`IncrementalDecoder::flush`] equals decoding the whole sequence at once.
//!
//! [`StopStringMatcher`] finds stop strings in the text stream, including ones that span
//! deltas: it holds back any suffix that could be the beginning of a stop string, so a stop
//! string never leaks to the client.

use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// Streams text deltas out of a growing token sequence.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the decoding window (context for the tokens after `read_offset`).
    prefix_offset: usize,
    /// Tokens before this index have been emitted as text.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder with `prompt_context` (e.g. the last few prompt tokens, which give
    /// context-dependent decoders their context; may be empty).
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        skip_special_tokens: bool,
        prompt_context: &[u32],
    ) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: prompt_context.to_vec(),
            prefix_offset: 0,
            read_offset: prompt_context.len(),
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, self.skip_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Add tokens; returns the new text (possibly empty while a character is incomplete).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when decoding fails (e.g. an id outside the vocabulary).
    pub fn step(&mut self, ids: &[u32]) -> Result<String> {
        self.ids.extend_from_slice(ids);
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            let delta = match full.strip_prefix(prefix.as_str()) {
                Some(d) => d.to_owned(),
                // A decoder that rewrites earlier text: emit from the first difference.
                None => {
                    let common = prefix
                        .char_indices()
                        .zip(full.chars())
                        .find(|((_, a), b)| a != b)
                        .map_or(prefix.len(), |((i, _), _)| i);
                    full[common..].to_owned()
                }
            };
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(delta);
        }
        Ok(String::new())
    }

    /// The text held back so far (an incomplete character at the end of the stream is
    /// decoded as U+FFFD). Call once, when the stream ends.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when decoding fails.
    pub fn flush(&mut self) -> Result<String> {
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_owned())
    }

    /// Every token id seen (prompt context included).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// Finds stop strings in a stream of text deltas.
#[derive(Debug, Clone, Default)]
pub struct StopStringMatcher {
    stops: Vec<String>,
    include_stop_str: bool,
    pending: String,
}

/// What [`StopStringMatcher::push`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopMatch {
    /// Text that is safe to send.
    pub text: String,
    /// The stop string that matched, if any (the stream is over).
    pub matched: Option<String>,
    /// On a match: the text after the stop string (dropped, unless the caller keeps
    /// going, e.g. because `min_tokens` is not reached yet).
    pub after: String,
}

impl StopStringMatcher {
    /// A matcher for `stops` (empty strings are ignored). With `include_stop_str`, the
    /// matched stop string is part of the emitted text.
    pub fn new(stops: impl IntoIterator<Item = String>, include_stop_str: bool) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            include_stop_str,
            pending: String::new(),
        }
    }

    /// Whether there are stop strings at all.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Add a delta. Returns what may be sent now and the stop string if one completed
    /// (text after it is dropped).
    pub fn push(&mut self, delta: &str) -> StopMatch {
        if self.stops.is_empty() {
            return StopMatch {
                text: delta.to_owned(),
                ..StopMatch::default()
            };
        }
        self.pending.push_str(delta);
        // Earliest match wins; at the same position, the longest stop string.
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|pos| (pos, s)))
            .min_by_key(|(pos, s)| (*pos, std::cmp::Reverse(s.len())));
        if let Some((pos, stop)) = found {
            let end = if self.include_stop_str {
                pos + stop.len()
            } else {
                pos
            };
            let text = self.pending[..end].to_owned();
            let after = self.pending[pos + stop.len()..].to_owned();
            let matched = Some(stop.clone());
            self.pending.clear();
            return StopMatch {
                text,
                matched,
                after,
            };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let hold = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let suffix = &self.pending[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            })
            .unwrap_or(self.pending.len());
        let text = self.pending[..hold].to_owned();
        self.pending.drain(..hold);
        StopMatch {
            text,
            ..StopMatch::default()
        }
    }

    /// Whether matched stop strings are part of the emitted text.
    pub fn includes_stop_str(&self) -> bool {
        self.include_stop_str
    }

    /// Release the held-back text (the stream ended without completing a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_spanning_deltas_is_caught_and_not_leaked() {
        let mut m = StopStringMatcher::new(["STOP".to_owned()], false);
        let mut sent = String::new();
        for d in ["Hello S", "T", "O", "P and more"] {
            let r = m.push(d);
            sent.push_str(&r.text);
            if let Some(s) = r.matched {
                assert_eq!(s, "STOP");
                break;
            }
        }
        assert_eq!(sent, "Hello ");
    }

    #[test]
    fn false_start_is_released() {
        let mut m = StopStringMatcher::new(["</end>".to_owned()], false);
        assert_eq!(m.push("a </e").text, "a ");
        assert_eq!(m.push("nx").text, "</enx");
        assert_eq!(m.push("</").text, "");
        assert_eq!(m.flush(), "</");
    }

    #[test]
    fn include_stop_str_and_earliest_match() {
        let mut m = StopStringMatcher::new(["b".to_owned(), "abc".to_owned()], true);
        let r = m.push("xxabcd");
        assert_eq!(r.text, "xxabc");
        assert_eq!(r.matched.as_deref(), Some("abc"));
        let mut m = StopStringMatcher::new(["é!".to_owned()], false);
        assert_eq!(m.push("caf").text, "caf");
        assert_eq!(m.push("é").text, "");
        let r = m.push("!");
        assert_eq!((r.text.as_str(), r.matched.is_some()), ("", true));
    }

    #[test]
    fn no_stops_passes_through() {
        let mut m = StopStringMatcher::new(["".to_owned()], false);
        assert!(m.is_empty());
        assert_eq!(m.push("abc").text, "abc");
    }
}
