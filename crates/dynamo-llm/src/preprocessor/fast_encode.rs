//! Prompt token ids without the `tokenizers` pipeline's bookkeeping.
//!
//! `Tokenizer::encode_fast` builds, for every prompt, a normalised string with a byte
//! alignment table, re-aligns it through each pre-tokenizer step, and returns an `Encoding`
//! holding every token's text and offsets. The frontend needs only the ids: under load that
//! bookkeeping was about a sixth of the frontend's CPU (docs/benchmarks/frontend.md).
//!
//! For the tokenizer shape of most chat models — byte-level BPE (GPT-2, Llama 3, Qwen,
//! Mistral-Nemo, DeepSeek, ...): no normaliser (or NFC, used here only for ASCII text, where
//! it is the identity), a regex pre-tokenizer plus the byte-to-character map, a BPE model
//! without dropout, no truncation or padding, and no post-processor that adds tokens — this
//! encoder does the same steps on plain string slices:
//!
//! 1. split out the added tokens (those matched on the raw text first, then those matched on
//!    the normalised text, each leftmost-longest, as `tokenizers`' added vocabulary does);
//! 2. split the text between them with the pre-tokenizer's regex, keeping both the matches
//!    and the gaps between them (the `Isolated` behaviour);
//! 3. map each piece's bytes to the byte-level alphabet and hand it to the tokenizer's own
//!    BPE model (so merges, `ignore_merges` and the vocabulary are the tokenizer's), caching
//!    each piece's ids.
//!
//! Any other shape (added tokens with `lstrip`/`rstrip`/`single_word`, other normalisers or
//! pre-tokenizers, a post-processor with special tokens when they are asked for) keeps the
//! tokenizer's own path. At construction the encoder checks itself against the tokenizer on
//! a set of probe strings and turns itself off on any difference, so a tokenizer whose
//! behaviour this module does not reproduce costs speed, never correctness.

use std::sync::{Arc, RwLock};

use aho_corasick::{AhoCorasick, MatchKind};
use rustc_hash::FxHashMap;
use serde_json::Value as Json;
use tokenizers::models::ModelWrapper;
use tokenizers::{Model, Tokenizer};

/// The byte-level pre-tokenizer's own split pattern (GPT-2's), used when its `use_regex` is
/// on.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Pieces cached per encoder; past this, new pieces are tokenised without being kept (the
/// common pieces of a workload are seen early). An entry is about 100 bytes (a short piece,
/// its ids, the table slot), so a full cache adds under 2 MiB to the frontend's RSS.
const CACHE_ENTRIES: usize = 1 << 14;
/// Longer pieces (long numbers, whitespace runs) are rare enough not to be worth keeping.
const CACHE_PIECE_BYTES: usize = 64;

/// Strings the encoder must tokenise exactly as the tokenizer does before it is used.
const PROBES: &[&str] = &[
    "",
    "Hello, world! How are you today?",
    "I'm sure they'll say it's fine, we've seen 'em. Don't worry, I'd go.",
    "Tell me about routing.",
    "  leading and trailing spaces   ",
    "a\n\nb\n \n\tc\r\n d  e",
    "x = f(1, 2) + 3.14159 * 1_000_000 // comment\n    return {\"k\": [1, 2]};",
    "12345678901234567890 0.5 -7 1e10",
    "URLs: https://example.com/a/b?c=d&e=f#g, mail@example.org",
    "MIXED case WORDS with CamelCase and snake_case_names",
    "\u{00e9}l\u{00e8}ve na\u{00ef}ve r\u{00e9}sum\u{00e9} \u{00fc}ber stra\u{00df}e",
    "\u{4f60}\u{597d}\u{ff0c}\u{4e16}\u{754c}\u{3002} \u{3053}\u{3093}\u{306b}\u{3061}\u{306f}",
    "emoji \u{1f642}\u{1f680} and symbols \u{2192} \u{2264} \u{20ac}5",
    "tabs\tand\u{00a0}no-break\u{2003}spaces",
    "!!!??? ... --- *** ###",
];

/// Token ids of prompts, for tokenizers of the supported shape (see the module docs).
pub(crate) struct FastEncoder {
    tokenizer: Arc<Tokenizer>,
    /// Added tokens matched on the raw text, and their ids by pattern index.
    raw_added: Option<(AhoCorasick, Vec<u32>)>,
    /// Added tokens matched on the normalised text (after the raw ones are split out).
    normalized_added: Option<(AhoCorasick, Vec<u32>)>,
    split: Splitter,
    /// The tokenizer normalises with NFC: only ASCII text (which NFC leaves alone) is
    /// encoded here.
    ascii_only: bool,
    /// The post-processor adds no tokens: `add_special_tokens` changes nothing.
    post_adds_nothing: bool,
    byte_chars: [char; 256],
    pieces: RwLock<FxHashMap<Box<str>, Box<[u32]>>>,
}

impl std::fmt::Debug for FastEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastEncoder")
            .field("split", &self.split)
            .field("ascii_only", &self.ascii_only)
            .finish_non_exhaustive()
    }
}

impl FastEncoder {
    /// The encoder for `tokenizer`, or `None` (with the reason) when its shape is not the
    /// one this module reproduces or the probe check finds a difference.
    pub(crate) fn new(tokenizer: &Arc<Tokenizer>) -> Result<Self, String> {
        let encoder = Self::for_shape(tokenizer)?;
        for probe in PROBES
            .iter()
            .map(|p| (*p).to_owned())
            .chain(encoder.added_token_probes())
        {
            let expected = tokenizer
                .encode_fast(probe.as_str(), false)
                .map_err(|e| format!("probe {probe:?} fails in the tokenizer: {e}"))?;
            match encoder.encode(&probe, false) {
                Some(ids) if ids == expected.get_ids() => {}
                // Non-ASCII probes of an NFC tokenizer are not encoded here: fine.
                None if encoder.ascii_only && !probe.is_ascii() => {}
                other => {
                    return Err(format!(
                        "probe {probe:?}: {other:?} here, {:?} from the tokenizer",
                        expected.get_ids()
                    ));
                }
            }
        }
        Ok(encoder)
    }

    fn for_shape(tokenizer: &Arc<Tokenizer>) -> Result<Self, String> {
        let json = |v: Option<Result<Json, serde_json::Error>>| -> Result<Json, String> {
            v.unwrap_or(Ok(Json::Null)).map_err(|e| e.to_string())
        };
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return Err("truncation or padding is configured".to_owned());
        }
        if tokenizer.get_encode_special_tokens() {
            return Err("encode_special_tokens is on".to_owned());
        }
        match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none_or(|d| d == 0.0) => {}
            _ => return Err("the model is not BPE without dropout".to_owned()),
        }
        let normalizer = json(tokenizer.get_normalizer().map(serde_json::to_value))?;
        let ascii_only = match normalizer.get("type").and_then(Json::as_str) {
            None if normalizer.is_null() => false,
            Some("NFC") => true,
            _ => return Err(format!("normaliser {normalizer} is not supported")),
        };
        let post = json(tokenizer.get_post_processor().map(serde_json::to_value))?;
        let post_adds_nothing =
            post.is_null() || post.get("type").and_then(Json::as_str) == Some("ByteLevel");
        let pre = json(tokenizer.get_pre_tokenizer().map(serde_json::to_value))?;
        let pattern =
            split_pattern(&pre).ok_or_else(|| format!("pre-tokenizer {pre} is not supported"))?;
        let split = Splitter::new(&pattern)?;

        let mut raw = (Vec::new(), Vec::new());
        let mut normalized = (Vec::new(), Vec::new());
        for (id, token) in tokenizer.get_added_tokens_decoder() {
            if token.lstrip || token.rstrip || token.single_word {
                return Err(format!(
                    "added token {:?} strips or is single-word",
                    token.content
                ));
            }
            if token.content.is_empty() {
                continue;
            }
            let set = if token.normalized {
                &mut normalized
            } else {
                &mut raw
            };
            set.0.push(token.content);
            set.1.push(id);
        }
        let automaton = |(patterns, ids): (Vec<String>, Vec<u32>)| {
            if patterns.is_empty() {
                return Ok(None);
            }
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&patterns)
                .map(|ac| Some((ac, ids)))
                .map_err(|e| e.to_string())
        };
        Ok(Self {
            tokenizer: Arc::clone(tokenizer),
            raw_added: automaton(raw)?,
            normalized_added: automaton(normalized)?,
            split,
            ascii_only,
            post_adds_nothing,
            byte_chars: byte_chars(),
            pieces: RwLock::new(FxHashMap::default()),
        })
    }

    /// Probes with the added tokens inside text, at the edges and next to each other.
    fn added_token_probes(&self) -> Vec<String> {
        let added = self.tokenizer.get_added_tokens_decoder();
        let mut ids: Vec<&u32> = added.keys().collect();
        ids.sort_unstable();
        ids.iter()
            .take(16)
            .map(|id| {
                let c = &added[*id].content;
                format!("{c}system\nYou are helpful.{c}\n{c}{c} user: hi {c}x{c}")
            })
            .collect()
    }

    /// The ids of `text`, or `None` when this text must go through the tokenizer (non-ASCII
    /// text for an NFC tokenizer, special tokens asked of a post-processor that adds them,
    /// or a piece the model or the regex engine refuses).
    pub(crate) fn encode(&self, text: &str, add_special_tokens: bool) -> Option<Vec<u32>> {
        if (self.ascii_only && !text.is_ascii()) || (add_special_tokens && !self.post_adds_nothing)
        {
            return None;
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut buf = String::new();
        for (piece, id) in split_added(&self.raw_added, text) {
            if let Some(id) = id {
                ids.push(id);
                continue;
            }
            for (part, id) in split_added(&self.normalized_added, piece) {
                match id {
                    Some(id) => ids.push(id),
                    None => self.encode_text(part, &mut ids, &mut buf)?,
                }
            }
        }
        Some(ids)
    }

    /// Pre-tokenise `text` (no added tokens in it) and append its pieces' ids.
    fn encode_text(&self, text: &str, ids: &mut Vec<u32>, buf: &mut String) -> Option<()> {
        let mut prev = 0;
        let mut piece = |start: usize, end: usize| -> Option<()> {
            // The gap before a match is a piece of its own (`Isolated`).
            if prev != start {
                self.encode_piece(&text[prev..start], ids, buf)?;
            }
            self.encode_piece(&text[start..end], ids, buf)?;
            prev = end;
            Some(())
        };
        match &self.split {
            Splitter::Fancy(re) => {
                for m in re.find_iter(text) {
                    let m = m.ok()?;
                    piece(m.start(), m.end())?;
                }
            }
            Splitter::Lookahead(re) => {
                let mut locs = re.capture_locations();
                let mut at = 0;
                while let Some(m) = re.find_at(text, at) {
                    let (start, mut end) = (m.start(), m.end());
                    if start == end {
                        // Not produced by these patterns; step over it as a search would.
                        at = end + text[end..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    // Only an all-whitespace match may be the final `\s+`: ask the capture
                    // engine (slower than the search) just then.
                    if end < text.len()
                        && m.as_str().chars().all(char::is_whitespace)
                        && re.captures_read_at(&mut locs, text, at).is_some()
                        && locs.get(WS_GROUP).is_some()
                    {
                        // `\s+(?!\S)` before `\s+`: a whitespace run followed by text gives
                        // all but its last character, unless it is one character long.
                        let last = m.as_str().chars().next_back()?;
                        if end - last.len_utf8() > start {
                            end -= last.len_utf8();
                        }
                    }
                    piece(start, end)?;
                    at = end;
                }
            }
        }
        if prev != text.len() {
            self.encode_piece(&text[prev..], ids, buf)?;
        }
        Some(())
    }

    fn encode_piece(&self, piece: &str, ids: &mut Vec<u32>, buf: &mut String) -> Option<()> {
        if piece.is_empty() {
            return Some(());
        }
        buf.clear();
        buf.extend(piece.bytes().map(|b| self.byte_chars[usize::from(b)]));
        let cacheable = piece.len() <= CACHE_PIECE_BYTES;
        if cacheable {
            let pieces = self.pieces.read().unwrap_or_else(|e| e.into_inner());
            if let Some(hit) = pieces.get(buf.as_str()) {
                ids.extend_from_slice(hit);
                return Some(());
            }
        }
        let tokens = self.tokenizer.get_model().tokenize(buf).ok()?;
        let start = ids.len();
        ids.extend(tokens.iter().map(|t| t.id));
        if cacheable {
            let mut pieces = self.pieces.write().unwrap_or_else(|e| e.into_inner());
            if pieces.len() < CACHE_ENTRIES {
                pieces.insert(buf.as_str().into(), ids[start..].into());
            }
        }
        Some(())
    }
}

/// The pre-tokenizer's split regex.
///
/// Byte-level patterns (GPT-2's, Llama 3's, Qwen's, ...) end in `\s+(?!\S)|\s+`: the only
/// part the `regex` crate cannot run is that lookahead, whose effect is simple (a whitespace
/// run followed by text leaves its last character to the next piece). Such a pattern runs as
/// `(?:prefix)|(\s+)` on the `regex` crate's automata with that rule applied to group 1,
/// several times faster than the backtracking engine; any other pattern runs on
/// `fancy_regex`, the engine `tokenizers` uses.
/// The capture group of the final `\\s+` (the prefix must have none of its own).
const WS_GROUP: usize = 1;

#[derive(Debug)]
enum Splitter {
    Fancy(fancy_regex::Regex),
    Lookahead(regex::Regex),
}

impl Splitter {
    fn new(pattern: &str) -> Result<Self, String> {
        const TAIL: &str = r"|\s+(?!\S)|\s+";
        if let Some(prefix) = pattern.strip_suffix(TAIL)
            && let Ok(re) = regex::Regex::new(&format!(r"(?:{prefix})|(\s+)"))
            && re.captures_len() == WS_GROUP + 1
        {
            return Ok(Self::Lookahead(re));
        }
        fancy_regex::Regex::new(pattern)
            .map(Self::Fancy)
            .map_err(|e| e.to_string())
    }
}

/// `text` cut at the matches of `added` (leftmost-longest): the pieces in order, each with
/// the added token's id when it is one. Empty pieces are left out. Lazy: no allocation per
/// call.
fn split_added<'a>(
    added: &'a Option<(AhoCorasick, Vec<u32>)>,
    text: &'a str,
) -> impl Iterator<Item = (&'a str, Option<u32>)> + 'a {
    let mut matches = added.as_ref().map(|(ac, ids)| (ac.find_iter(text), ids));
    let mut prev = 0;
    // An added token found after a gap: the gap goes first, the token on the next call.
    let mut held: Option<(&'a str, Option<u32>)> = None;
    std::iter::from_fn(move || {
        if let Some(token) = held.take() {
            return Some(token);
        }
        if let Some((found, ids)) = matches.as_mut() {
            match found.next() {
                Some(m) => {
                    let token = (
                        &text[m.start()..m.end()],
                        ids.get(m.pattern().as_usize()).copied(),
                    );
                    let gap = &text[prev..m.start()];
                    prev = m.end();
                    if gap.is_empty() {
                        return Some(token);
                    }
                    held = Some(token);
                    return Some((gap, None));
                }
                None => matches = None,
            }
        }
        if prev < text.len() {
            let rest = &text[prev..];
            prev = text.len();
            return Some((rest, None));
        }
        None
    })
}

/// The split regex of a supported pre-tokenizer: byte-level with its own regex, or a
/// sequence of one `Split` (a regex, `Isolated`, not inverted) and a byte-level step without
/// regex. Neither may add a prefix space.
fn split_pattern(pre: &Json) -> Option<String> {
    let byte_level = |v: &Json| {
        v.get("type")?.as_str().filter(|t| *t == "ByteLevel")?;
        if v.get("add_prefix_space")?.as_bool()? {
            return None;
        }
        v.get("use_regex")?.as_bool()
    };
    match pre.get("type")?.as_str()? {
        "ByteLevel" => byte_level(pre)?.then(|| GPT2_PATTERN.to_owned()),
        "Sequence" => {
            let [split, bl] = pre.get("pretokenizers")?.as_array()?.as_slice() else {
                return None;
            };
            if byte_level(bl)? {
                return None;
            }
            (split.get("type")?.as_str()? == "Split"
                && split.get("behavior")?.as_str()? == "Isolated"
                && !split.get("invert")?.as_bool()?)
            .then_some(())?;
            split
                .get("pattern")?
                .get("Regex")?
                .as_str()
                .map(str::to_owned)
        }
        _ => None,
    }
}

/// GPT-2's byte-to-character map: printable Latin-1 bytes stand for themselves, the others
/// take the characters from U+0100 on, in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        out[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use proptest::prelude::*;

    use super::*;

    const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    /// The tiny test model's tokenizer (byte-level pre-tokenizer with its own regex), with
    /// `edit` applied to its JSON.
    fn tokenizer_with(edit: impl FnOnce(&mut Json)) -> Arc<Tokenizer> {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-model/tokenizer.json");
        let mut json: Json =
            serde_json::from_slice(&std::fs::read(path).expect("read")).expect("json");
        edit(&mut json);
        Arc::new(Tokenizer::from_bytes(serde_json::to_vec(&json).expect("ser")).expect("tokenizer"))
    }

    /// A pattern with a lookahead the `regex` crate cannot run (kept on `fancy_regex`).
    const FANCY_PATTERN: &str = r"\p{L}+(?=\s)|\p{L}+|\p{N}{1,2}|\s+|[^\s\p{L}\p{N}]+";

    /// Llama 3's shape: a `Split` regex then byte-level without regex, and (as Qwen 2) NFC.
    fn llama3_shape(nfc: bool) -> Arc<Tokenizer> {
        split_shape(LLAMA3_PATTERN, nfc)
    }

    fn split_shape(pattern: &str, nfc: bool) -> Arc<Tokenizer> {
        tokenizer_with(|j| {
            j["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]});
            if nfc {
                j["normalizer"] = serde_json::json!({"type": "NFC"});
            }
        })
    }

    fn check(tok: &Arc<Tokenizer>, enc: &FastEncoder, text: &str) {
        for special in [false, true] {
            let expected = tok.encode_fast(text, special).expect("tokenizer");
            match enc.encode(text, special) {
                Some(ids) => assert_eq!(ids, expected.get_ids(), "{text:?}"),
                None => assert!(enc.ascii_only && !text.is_ascii(), "{text:?} not encoded"),
            }
        }
    }

    fn text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("<|im_start|>".to_owned()),
            Just("<|im_end|>".to_owned()),
            Just("<|endoftext|>".to_owned()),
            Just("<|im_".to_owned()),
            "[ \t\n\r]{1,4}",
            "[a-zA-Z']{1,8}",
            "[0-9]{1,7}",
            "[!-/:-@\\[-`{-~]{1,3}",
            "\\PC{1,4}",
            "[\u{a0}\u{2003}\u{3000}\u{85} \n]{1,3}",
        ];
        prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn same_ids_as_the_tokenizer_for_every_supported_shape(t in text()) {
            let shapes = [
                tokenizer_with(|_| {}),
                llama3_shape(false),
                llama3_shape(true),
                split_shape(FANCY_PATTERN, false),
            ];
            for tok in shapes {
                let enc = FastEncoder::new(&tok).expect("supported shape");
                check(&tok, &enc, &t);
                // Twice: the second answer comes from the piece cache.
                check(&tok, &enc, &t);
            }
        }
    }

    #[test]
    fn byte_level_patterns_run_on_the_regex_crate_others_on_fancy_regex() {
        for tok in [
            tokenizer_with(|_| {}),
            llama3_shape(false),
            llama3_shape(true),
        ] {
            let enc = FastEncoder::new(&tok).expect("supported");
            assert!(
                matches!(enc.split, Splitter::Lookahead(_)),
                "{:?}",
                enc.split
            );
        }
        let enc = FastEncoder::new(&split_shape(FANCY_PATTERN, false)).expect("supported");
        assert!(matches!(enc.split, Splitter::Fancy(_)));
    }

    #[test]
    fn unsupported_shapes_are_refused_with_the_reason() {
        let prefix = tokenizer_with(|j| j["pre_tokenizer"]["add_prefix_space"] = true.into());
        assert!(
            FastEncoder::new(&prefix)
                .unwrap_err()
                .contains("pre-tokenizer")
        );
        let lower = tokenizer_with(|j| j["normalizer"] = serde_json::json!({"type": "Lowercase"}));
        assert!(FastEncoder::new(&lower).unwrap_err().contains("normaliser"));
        let lstrip = tokenizer_with(|j| j["added_tokens"][1]["lstrip"] = true.into());
        assert!(FastEncoder::new(&lstrip).unwrap_err().contains("strips"));
        let dropout = tokenizer_with(|j| j["model"]["dropout"] = 0.1.into());
        assert!(FastEncoder::new(&dropout).unwrap_err().contains("dropout"));
    }

    #[test]
    fn a_post_processor_that_adds_tokens_leaves_special_requests_to_the_tokenizer() {
        let tok = tokenizer_with(|j| {
            j["post_processor"] = serde_json::json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}});
        });
        let enc = FastEncoder::new(&tok).expect("supported without special tokens");
        assert_eq!(enc.encode("hi there", true), None);
        let plain = enc.encode("hi there", false).expect("fast");
        assert_eq!(
            plain,
            tok.encode_fast("hi there", false).expect("tok").get_ids()
        );
    }

    #[test]
    fn nfc_tokenizers_leave_non_ascii_text_to_the_tokenizer() {
        let enc = FastEncoder::new(&llama3_shape(true)).expect("supported");
        assert_eq!(enc.encode("caf\u{00e9}", false), None);
        assert!(enc.encode("cafe", false).is_some());
    }

    #[test]
    fn split_added_yields_gaps_and_tokens_in_order_without_empty_pieces() {
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(["<a>", "<ab>"])
            .expect("automaton");
        let added = Some((ac, vec![7, 8]));
        let pieces: Vec<_> = split_added(&added, "<a>x<ab><a>y z<ab>").collect();
        assert_eq!(
            pieces,
            [
                ("<a>", Some(7)),
                ("x", None),
                ("<ab>", Some(8)),
                ("<a>", Some(7)),
                ("y z", None),
                ("<ab>", Some(8)),
            ]
        );
        assert_eq!(split_added(&added, "").count(), 0);
        assert_eq!(
            split_added(&added, "plain").collect::<Vec<_>>(),
            [("plain", None)]
        );
        assert_eq!(
            split_added(&None, "<a>").collect::<Vec<_>>(),
            [("<a>", None)]
        );
    }

    #[test]
    fn byte_chars_match_the_gpt2_table() {
        let t = byte_chars();
        assert_eq!(t[usize::from(b'A')], 'A');
        assert_eq!(t[0], '\u{100}');
        assert_eq!(t[usize::from(b' ')], '\u{120}'); // "Ġ"
        assert_eq!(t[usize::from(b'\n')], '\u{10a}'); // "Ċ"
        assert_eq!(t[0xAD], '\u{143}');
        let mut seen: Vec<char> = t.to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 256, "the map is one to one");
    }
}
