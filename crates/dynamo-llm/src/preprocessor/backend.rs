//! The frontend's "backend" stage: turns the [`LLMEngineOutput`] items a worker streams
//! into text deltas, enforcing the request's stop conditions (eos and hidden stop token
//! ids, stop strings, `max_tokens`, `min_tokens`) whatever the worker does.

use std::sync::Arc;

use rustc_hash::FxHashSet;
use tokenizers::Tokenizer;

use super::detokenizer::{IncrementalDecoder, StopStringMatcher, TokenBytes};
use super::protocols::{FinishReason, LLMEngineOutput, PreprocessedRequest};
use crate::error::Result;

/// Prompt tokens given to the decoder as context (enough for any decoder's lookback).
const DECODE_CONTEXT_TOKENS: usize = 8;

/// What one engine item became.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendOutput {
    /// Text to send (may be empty).
    pub text: String,
    /// The item's token ids that count as output (ids after a stop are dropped).
    pub token_ids: Vec<u32>,
    /// Set when the request is finished.
    pub finish_reason: Option<FinishReason>,
    /// Output tokens so far.
    pub completion_tokens: u32,
}

/// Applies detokenization and stop conditions to one request's stream.
#[derive(Debug, Clone)]
pub struct OutputProcessor {
    decoder: Option<IncrementalDecoder>,
    stop: StopStringMatcher,
    eos_ids: FxHashSet<u32>,
    hidden_stop_ids: FxHashSet<u32>,
    max_tokens: Option<u32>,
    min_tokens: u32,
    generated: u32,
    finished: Option<FinishReason>,
}

impl OutputProcessor {
    /// A processor for `request`. Without a tokenizer, the engine's `text` is used.
    pub fn new(request: &PreprocessedRequest, tokenizer: Option<Arc<Tokenizer>>) -> Self {
        let sc = &request.stop_conditions;
        let skip_special = request.output_options.skip_special_tokens.unwrap_or(true);
        let ctx_start = request
            .token_ids
            .len()
            .saturating_sub(DECODE_CONTEXT_TOKENS);
        let decoder = tokenizer
            .map(|t| IncrementalDecoder::new(t, skip_special, &request.token_ids[ctx_start..]));
        let eos_ids = if sc.ignore_eos == Some(true) {
            FxHashSet::default()
        } else {
            request.eos_token_ids.iter().copied().collect()
        };
        Self {
            decoder,
            stop: StopStringMatcher::new(
                sc.stop.clone().unwrap_or_default(),
                request.sampling_options.include_stop_str_in_output == Some(true),
            ),
            eos_ids,
            hidden_stop_ids: sc.stop_token_ids_hidden.iter().flatten().copied().collect(),
            max_tokens: sc.max_tokens,
            min_tokens: sc.min_tokens.unwrap_or(0),
            generated: 0,
            finished: None,
        }
    }

    /// Decode through `table` (the tokenizer's per-id bytes, see
    /// [`super::detokenizer::TokenBytes`]) when there is one: the same text, less work.
    #[must_use]
    pub fn with_token_bytes(mut self, table: Option<Arc<TokenBytes>>) -> Self {
        if table.is_some() {
            self.decoder = self.decoder.map(|d| d.with_table(table));
        }
        self
    }

    /// Whether the request is finished (later items are ignored).
    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// Output tokens so far.
    pub fn completion_tokens(&self) -> u32 {
        self.generated
    }

    fn finish(
        &mut self,
        reason: FinishReason,
        out: &mut BackendOutput,
        release_held: bool,
    ) -> Result<()> {
        if release_held {
            if let Some(d) = self.decoder.as_mut() {
                let tail = d.flush()?;
                let r = self.stop.push(&tail);
                out.text.push_str(&r.text);
                if r.matched.is_some() {
                    self.finished = Some(FinishReason::Stop);
                    out.finish_reason = self.finished.clone();
                    return Ok(());
                }
            }
            out.text.push_str(&self.stop.flush());
        }
        self.finished = Some(reason);
        out.finish_reason = self.finished.clone();
        Ok(())
    }

    /// Process one engine item.
    ///
    /// # Errors
    /// [`crate::Error::Tokenizer`] when a token id cannot be decoded.
    pub fn process(&mut self, item: &LLMEngineOutput) -> Result<BackendOutput> {
        let mut out = BackendOutput::default();
        if self.finished.is_some() {
            out.completion_tokens = self.generated;
            return Ok(out);
        }
        for &id in &item.token_ids {
            self.generated += 1;
            out.token_ids.push(id);
            let may_stop = self.generated > self.min_tokens;
            if may_stop && (self.eos_ids.contains(&id) || self.hidden_stop_ids.contains(&id)) {
                let reason = if self.eos_ids.contains(&id) {
                    FinishReason::Eos
                } else {
                    FinishReason::Stop
                };
                self.finish(reason, &mut out, true)?;
                break;
            }
            if let Some(d) = self.decoder.as_mut() {
                let delta = d.step(&[id])?;
                if self.stop.is_empty() {
                    // No stop strings: the delta is the text (moved, not copied, when it is
                    // the item's first).
                    if out.text.is_empty() {
                        out.text = delta;
                    } else {
                        out.text.push_str(&delta);
                    }
                    if self.max_tokens.is_some_and(|m| self.generated >= m) {
                        self.finish(FinishReason::Length, &mut out, true)?;
                        break;
                    }
                    continue;
                }
                let r = self.stop.push(&delta);
                out.text.push_str(&r.text);
                if let Some(stop) = r.matched {
                    if may_stop {
                        self.finish(FinishReason::Stop, &mut out, false)?;
                        break;
                    }
                    // Too early to stop (`min_tokens`): the stop string is ordinary text.
                    if !self.stop.includes_stop_str() {
                        out.text.push_str(&stop);
                    }
                    out.text.push_str(&r.after);
                }
            }
            if self.max_tokens.is_some_and(|m| self.generated >= m) {
                self.finish(FinishReason::Length, &mut out, true)?;
                break;
            }
        }
        if self.decoder.is_none()
            && self.finished.is_none()
            && let Some(text) = &item.text
        {
            let r = self.stop.push(text);
            out.text.push_str(&r.text);
            // Text-only engines may not report token ids; count the stream as far as they do.
            if r.matched.is_some() && self.generated >= self.min_tokens {
                self.finish(FinishReason::Stop, &mut out, false)?;
            }
        }
        if self.finished.is_none()
            && let Some(reason) = &item.finish_reason
        {
            self.finish(reason.clone(), &mut out, true)?;
        }
        out.completion_tokens = self.generated;
        Ok(out)
    }

    /// The stream ended without a finish reason: release held text. Returns `None` if the
    /// request had already finished.
    ///
    /// # Errors
    /// [`crate::Error::Tokenizer`] when decoding fails.
    pub fn end_of_stream(&mut self) -> Result<Option<BackendOutput>> {
        if self.finished.is_some() {
            return Ok(None);
        }
        let mut out = BackendOutput::default();
        self.finish(FinishReason::Stop, &mut out, true)?;
        out.completion_tokens = self.generated;
        Ok(Some(out))
    }
}
