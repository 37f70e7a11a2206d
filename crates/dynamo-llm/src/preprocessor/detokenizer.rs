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
use tokenizers::decoders::DecoderWrapper;

use crate::error::{Error, Result};

/// Each token id's decoded bytes, for tokenizers whose decoding is the concatenation of
/// per-token bytes: byte-level BPE (GPT-2, Llama 3, Qwen, the tiny test model), whose
/// decoder maps every character of a token to one byte (a token with a character outside
/// that alphabet, e.g. an added token with a space, is its own UTF-8 bytes) and then reads
/// the bytes as UTF-8. With the table, a decoder appends bytes per token instead of asking
/// the tokenizer to decode a window of ids twice (a `String` per id, a byte vector and a
/// lossy conversion each time).
pub struct TokenBytes {
    /// Every id's bytes, back to back.
    bytes: Vec<u8>,
    /// `offsets[id]..offsets[id + 1]` are `id`'s bytes.
    offsets: Vec<u32>,
    /// Whether an id is a special token (dropped when special tokens are skipped).
    special: Vec<bool>,
}

/// Characters of the byte-level alphabet, by byte: printable Latin-1 bytes stand for
/// themselves, the others for U+0100 onwards in byte order (OpenAI's GPT-2 encoder).
fn byte_level_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for (b, c) in chars.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *c = char::from_u32(code).unwrap_or('\0');
    }
    chars
}

impl std::fmt::Debug for TokenBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBytes")
            .field("ids", &self.len())
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl TokenBytes {
    /// The table of `tokenizer`, or `None` when its decoding is not per-token bytes (any
    /// decoder but a plain `ByteLevel`), or when the table disagrees with the tokenizer's
    /// own decoding of a sample of ids.
    pub fn build(tokenizer: &Tokenizer) -> Option<Self> {
        if !matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let by_byte = byte_level_chars();
        // The alphabet the tokenizer's own byte-level decoder uses must be this one.
        let alphabet = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
        if alphabet.len() != 256 || !by_byte.iter().all(|c| alphabet.contains(c)) {
            return None;
        }
        let mut byte_of = vec![None; 324];
        for (b, c) in by_byte.iter().enumerate() {
            byte_of[*c as usize] = Some(b as u8);
        }
        let added = tokenizer.get_added_vocabulary();
        let n = tokenizer.get_vocab_size(true);
        let n = u32::try_from(n).ok()?;
        let mut table = Self {
            bytes: Vec::new(),
            offsets: Vec::with_capacity(n as usize + 1),
            special: Vec::with_capacity(n as usize),
        };
        table.offsets.push(0);
        for id in 0..n {
            if let Some(token) = tokenizer.id_to_token(id) {
                table.special.push(added.is_special_token(&token));
                let start = table.bytes.len();
                let mapped = token.chars().all(|c| match byte_of.get(c as usize) {
                    Some(Some(b)) => {
                        table.bytes.push(*b);
                        true
                    }
                    _ => false,
                });
                if !mapped {
                    table.bytes.truncate(start);
                    table.bytes.extend_from_slice(token.as_bytes());
                }
            } else {
                table.special.push(false);
            }
            table.offsets.push(u32::try_from(table.bytes.len()).ok()?);
        }
        table.bytes.shrink_to_fit();
        // Check against the tokenizer itself: every id of small vocabularies, an even
        // spread of large ones (the last ids, usually the added tokens, always).
        let step = (n / 4096).max(1);
        let sample = (0..n)
            .step_by(step as usize)
            .chain(n.saturating_sub(512)..n);
        for id in sample {
            for skip in [false, true] {
                let mut mine = Vec::new();
                table.append(id, skip, &mut mine);
                let theirs = tokenizer.decode(&[id], skip).ok()?;
                if String::from_utf8_lossy(&mine) != theirs {
                    return None;
                }
            }
        }
        Some(table)
    }

    /// Append `id`'s bytes (nothing for special tokens when `skip_special`, or for ids
    /// outside the vocabulary, as the tokenizer's decoding does).
    pub fn append(&self, id: u32, skip_special: bool, out: &mut Vec<u8>) {
        let i = id as usize;
        if skip_special && self.special.get(i).copied().unwrap_or(false) {
            return;
        }
        if let (Some(&start), Some(&end)) = (self.offsets.get(i), self.offsets.get(i + 1)) {
            out.extend_from_slice(&self.bytes[start as usize..end as usize]);
        }
    }

    /// Ids in the table.
    pub fn len(&self) -> usize {
        self.special.len()
    }

    /// Whether the table has no ids.
    pub fn is_empty(&self) -> bool {
        self.special.is_empty()
    }
}

/// Streams text deltas out of a growing token sequence.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    /// The tokenizer's per-id bytes, when its decoding is that simple.
    table: Option<Arc<TokenBytes>>,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the decoding window (context for the tokens after `read_offset`).
    prefix_offset: usize,
    /// Tokens before this index have been emitted as text.
    read_offset: usize,
    /// With a table: the bytes of the tokens not emitted yet.
    pending: Vec<u8>,
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
            table: None,
            skip_special_tokens,
            // Room for a response's first tokens: grown from exactly the context, the
            // arrays were reallocated on the first steps of every response.
            ids: {
                let mut ids = Vec::with_capacity(prompt_context.len() + 64);
                ids.extend_from_slice(prompt_context);
                ids
            },
            prefix_offset: 0,
            read_offset: prompt_context.len(),
            pending: Vec::with_capacity(64),
        }
    }

    /// Decode through `table` (built from this decoder's tokenizer by
    /// [`TokenBytes::build`]): the same deltas, without the tokenizer's per-call work.
    #[must_use]
    pub fn with_table(mut self, table: Option<Arc<TokenBytes>>) -> Self {
        self.table = table;
        self
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, self.skip_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// With a table: the pending bytes as text once they do not end inside a character
    /// (the lossy decoding does not end with U+FFFD, as [`Self::step`] decides).
    fn release_pending(&mut self, force: bool) -> String {
        if self.pending.is_empty() {
            return String::new();
        }
        // The lossy text is the valid pieces with U+FFFD for each invalid sequence (as
        // `String::from_utf8_lossy` builds it); whether it would end with U+FFFD is read
        // off the last piece, so that holding the bytes back allocates nothing (building
        // the lossy text to look at its end was most of the frontend's allocations when a
        // model streams byte tokens that are not whole characters).
        if !force
            && self
                .pending
                .utf8_chunks()
                .last()
                .is_some_and(|c| !c.invalid().is_empty() || c.valid().ends_with('\u{FFFD}'))
        {
            return String::new();
        }
        let mut text = String::with_capacity(self.pending.len() + 3);
        for c in self.pending.utf8_chunks() {
            text.push_str(c.valid());
            if !c.invalid().is_empty() {
                text.push('\u{FFFD}');
            }
        }
        self.pending.clear();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        text
    }

    /// Add tokens; returns the new text (possibly empty while a character is incomplete).
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when decoding fails (e.g. an id outside the vocabulary).
    pub fn step(&mut self, ids: &[u32]) -> Result<String> {
        self.ids.extend_from_slice(ids);
        if let Some(table) = &self.table {
            for &id in ids {
                table.append(id, self.skip_special_tokens, &mut self.pending);
            }
            return Ok(self.release_pending(false));
        }
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
        if self.table.is_some() {
            return Ok(self.release_pending(true));
        }
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
