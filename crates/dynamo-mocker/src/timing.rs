//! How long a simulated forward pass takes.
//!
//! A forward pass costs a fixed launch overhead, a per-token cost for the prompt tokens it
//! prefills, an attention cost that grows with each prefill token's context (quadratic in
//! prompt length overall), and for decoding a per-sequence cost plus a cost per token of
//! KV cache read. The constants give the order of magnitude of an 8B-parameter model on one
//! H100-class GPU; they are illustrative, not a calibrated profile.

/// Fixed cost of one forward pass, in ms.
const STEP_BASE_MS: f64 = 4.0;
/// Linear cost per prefilled token, in ms (~25k tokens/s of prefill).
const PREFILL_MS_PER_TOKEN: f64 = 0.04;
/// Attention cost per (prefilled token x context token), in ms.
const PREFILL_MS_PER_TOKEN_CONTEXT: f64 = 2.0e-7;
/// Cost per decoding sequence in the batch, in ms.
const DECODE_MS_PER_SEQ: f64 = 0.03;
/// Cost per KV-cache token read while decoding, in ms.
const DECODE_MS_PER_KV_TOKEN: f64 = 1.0e-5;

/// One prefill chunk of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    /// Tokens computed in this pass.
    pub new_tokens: usize,
    /// Tokens of the same sequence already in the cache before this pass.
    pub context_tokens: usize,
}

/// Duration of a forward pass in simulated milliseconds (before any speed-up).
///
/// Returns `(prefill_ms, decode_ms)` so that callers can apply separate speed-ups.
pub fn step_ms(
    prefill: &[PrefillChunk],
    decode_seqs: usize,
    decode_kv_tokens: usize,
) -> (f64, f64) {
    let prefill_ms: f64 = prefill
        .iter()
        .map(|c| {
            let n = c.new_tokens as f64;
            // Each new token attends to the context plus, on average, half of the chunk.
            let attention = n * (c.context_tokens as f64 + n / 2.0);
            PREFILL_MS_PER_TOKEN * n + PREFILL_MS_PER_TOKEN_CONTEXT * attention
        })
        .sum();
    let decode_ms = if decode_seqs == 0 {
        0.0
    } else {
        DECODE_MS_PER_SEQ * decode_seqs as f64 + DECODE_MS_PER_KV_TOKEN * decode_kv_tokens as f64
    };
    if prefill.is_empty() && decode_seqs == 0 {
        (0.0, 0.0)
    } else if prefill.is_empty() {
        (0.0, STEP_BASE_MS + decode_ms)
    } else {
        (STEP_BASE_MS + prefill_ms, decode_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_context_makes_prefill_cheaper_than_full_prompt() {
        let full = step_ms(
            &[PrefillChunk {
                new_tokens: 4096,
                context_tokens: 0,
            }],
            0,
            0,
        );
        let tail = step_ms(
            &[PrefillChunk {
                new_tokens: 512,
                context_tokens: 3584,
            }],
            0,
            0,
        );
        assert!(tail.0 < full.0 / 4.0, "{tail:?} vs {full:?}");
        assert_eq!(step_ms(&[], 0, 0), (0.0, 0.0));
        let decode = step_ms(&[], 8, 8000);
        assert!(decode.1 > STEP_BASE_MS && decode.0 == 0.0);
    }
}
