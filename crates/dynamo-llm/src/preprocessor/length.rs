//! Refusing prompts that cannot fit the context without tokenising them whole.
//!
//! Tokenising costs ~100 bytes of memory per token (the `Encoding` keeps ids, offsets,
//! token strings, masks and word ids), so a prompt of a few hundred MB that is tokenised in
//! one call needs tens of GB before the context-length check can refuse it. Instead, text
//! that may be longer than the limit is counted first, [`COUNT_CHUNK_BYTES`] at a time with
//! each piece's encoding dropped before the next, and the count stops as soon as it passes
//! the limit. The peak memory of a refusal is then one chunk's encoding whatever the size of
//! the prompt, and its time is bounded by the context length, not by the body size.
//!
//! The count of pieces may differ from the count of the whole text by a token or two where a
//! piece ends (a merge across the cut); pieces end just before whitespace, where pre-tokenizers
//! split anyway, and the refusal waits for [`SLACK_PER_CUT`] extra tokens per cut, so a prompt
//! that would fit is never refused by the estimate. Text that passes is tokenised whole and
//! checked exactly (it holds at most about `limit` tokens, so that is bounded too).

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// Size of the pieces text is counted in. 64 KiB of text is at most 64 Ki tokens, a few MB
/// of encoding: small next to the body, large enough that per-call overhead is negligible.
pub const COUNT_CHUNK_BYTES: usize = 64 * 1024;

/// Tokens a cut between pieces may add to the count (a merge split in two, a prefix space).
const SLACK_PER_CUT: usize = 4;

/// A piece is extended by at most this many bytes looking for whitespace to end at (text
/// without whitespace, e.g. base64, is cut at a char boundary instead).
const MAX_CUT_SEARCH: usize = 4 * 1024;

/// Prompt-token limit for models whose card does not give a context length: nothing real
/// is that long, and it keeps one request's tokenisation bounded.
pub const UNKNOWN_CONTEXT_TOKEN_CAP: usize = 4 * 1024 * 1024;

/// Counts tokens of several texts against one limit.
pub(super) struct TokenBudget<'a> {
    tokenizer: &'a Tokenizer,
    limit: usize,
    counted: usize,
    cuts: usize,
}

impl<'a> TokenBudget<'a> {
    /// A budget of `limit` tokens.
    pub(super) fn new(tokenizer: &'a Tokenizer, limit: usize) -> Self {
        Self {
            tokenizer,
            limit,
            counted: 0,
            cuts: 0,
        }
    }

    /// Tokens counted so far (a lower bound of the texts' token count, up to the slack).
    pub(super) fn counted(&self) -> usize {
        self.counted
    }

    /// Whether the count so far proves the texts do not fit.
    pub(super) fn exceeded(&self) -> bool {
        self.counted >= self.limit.saturating_add(SLACK_PER_CUT * self.cuts)
    }

    /// Count `text`, stopping once the budget is exceeded. Returns whether it still fits.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] when the tokenizer fails.
    pub(super) fn add(&mut self, text: &str) -> Result<bool> {
        let mut rest = text;
        while !rest.is_empty() {
            if self.exceeded() {
                return Ok(false);
            }
            let end = cut(rest, COUNT_CHUNK_BYTES);
            let (piece, tail) = rest.split_at(end);
            let n = self
                .tokenizer
                .encode_fast(piece, false)
                .map_err(|e| Error::Tokenizer(e.to_string()))?
                .len();
            self.counted = self.counted.saturating_add(n);
            self.cuts += 1;
            rest = tail;
        }
        Ok(!self.exceeded())
    }
}

/// Where to end a piece of `text` of about `size` bytes: just before the first whitespace at
/// or after `size` (within [`MAX_CUT_SEARCH`]), else at the char boundary at `size`.
fn cut(text: &str, size: usize) -> usize {
    if text.len() <= size {
        return text.len();
    }
    let mut at = size;
    while !text.is_char_boundary(at) {
        at += 1;
    }
    let window_end = (at + MAX_CUT_SEARCH).min(text.len());
    let mut end = window_end;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[at..end]
        .find(char::is_whitespace)
        .map_or(at, |i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_ends_before_whitespace_on_char_boundaries() {
        assert_eq!(cut("abc", 10), 3);
        assert_eq!(cut("abcdef ghi", 4), 6);
        // No whitespace in the window: the char boundary at the size.
        let s = "é".repeat(10);
        let at = cut(&s, 5);
        assert!(s.is_char_boundary(at) && (5..=6).contains(&at));
        assert_eq!(cut("abcd efgh", 4), 4);
    }

    fn tiny_tokenizer() -> Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/tiny-model/tokenizer.json"
        );
        Tokenizer::from_file(path).expect("tiny tokenizer")
    }

    /// Random text of about `bytes` bytes: words, runs of spaces and newlines, non-ASCII
    /// characters, and long runs without whitespace.
    fn random_text(rng: &mut fastrand::Rng, bytes: usize) -> String {
        const WORDS: [&str; 10] = [
            "hello",
            "world",
            "the",
            "cache",
            "Dynamo",
            "tokens",
            "é",
            "日本語",
            "🙂",
            "42",
        ];
        let mut s = String::new();
        while s.len() < bytes {
            match rng.u8(0..10) {
                0 => s.push_str(&"   ".repeat(rng.usize(1..4))),
                1 => s.push('\n'),
                2 => s.push_str(&"x".repeat(rng.usize(1..5000))),
                _ => {
                    s.push_str(WORDS[rng.usize(0..WORDS.len())]);
                    s.push(' ');
                }
            }
        }
        s
    }

    #[test]
    fn counting_in_pieces_stays_within_the_slack_of_the_whole_count() {
        let tok = tiny_tokenizer();
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..12 {
            let size = 3 * COUNT_CHUNK_BYTES + rng.usize(0..1000);
            let text = random_text(&mut rng, size);
            let whole = tok.encode_fast(text.as_str(), false).expect("encode").len();
            let mut budget = TokenBudget::new(&tok, usize::MAX / 2);
            assert!(budget.add(&text).expect("count"));
            let slack = SLACK_PER_CUT * budget.cuts;
            assert!(
                budget.counted().abs_diff(whole) <= slack,
                "pieces {} vs whole {whole} (slack {slack})",
                budget.counted()
            );
            // A budget the whole text fits in is never reported exceeded...
            let mut fits = TokenBudget::new(&tok, whole + 1);
            assert!(fits.add(&text).expect("count"));
            // ...and one far below stops early.
            let mut small = TokenBudget::new(&tok, 10);
            assert!(!small.add(&text).expect("count"));
            assert_eq!(small.cuts, 1, "stops after the first piece");
        }
    }
}
