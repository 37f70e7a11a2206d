//! The simulated engine as a [`TokenEngine`]: requests go to a [`MockEngineRunner`], its
//! tokens come back as [`LLMEngineOutput`] items, so the mocker can be served on a worker
//! endpoint, behind the in-process frontend or in a terminal like any token engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dynamo_llm::engines::{TokenEngine, TokenStream};
use dynamo_llm::preprocessor::{FinishReason, LLMEngineOutput, PreprocessedRequest};
use dynamo_llm::{Error, Result};
use dynamo_runtime::Context;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

use crate::engine::MockRequest;
use crate::runner::MockEngineRunner;

/// Output tokens when a request does not say (`max_tokens` unset and no context length).
const DEFAULT_MAX_TOKENS: usize = 256;

/// The mocker as a [`TokenEngine`].
pub struct MockTokenEngine {
    runner: MockEngineRunner,
    next: AtomicU64,
    vocab_size: u32,
}

impl MockTokenEngine {
    /// Serve `runner`, whose tokens fall below `vocab_size`.
    pub fn new(runner: MockEngineRunner, vocab_size: u32) -> Self {
        Self {
            runner,
            next: AtomicU64::new(0),
            vocab_size: vocab_size.max(2),
        }
    }
}

impl TokenEngine for MockTokenEngine {
    fn generate(
        &self,
        mut request: PreprocessedRequest,
        context: Context,
    ) -> BoxFuture<'static, Result<TokenStream>> {
        let runner = self.runner.clone();
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let vocab = self.vocab_size;
        Box::pin(async move {
            let max = request
                .stop_conditions
                .max_tokens
                .map_or(DEFAULT_MAX_TOKENS, |m| m as usize);
            if max == 0 {
                let item = LLMEngineOutput {
                    finish_reason: Some(FinishReason::Length),
                    ..Default::default()
                };
                return Ok(futures_util::stream::iter([Ok(item)]).boxed());
            }
            let id = format!("{}-{seq}", context.id());
            let rx = runner
                .submit(MockRequest {
                    block_mm_infos: request
                        .mm_routing_info
                        .as_ref()
                        .map(|m| m.block_mm_infos.clone())
                        .unwrap_or_default(),
                    ..MockRequest::new(id, std::mem::take(&mut request.token_ids), max)
                })
                .await
                .map_err(|e| Error::InvalidRequest {
                    message: e.to_string(),
                    param: None,
                })?;
            let eos = Arc::new(request.eos_token_ids);
            // Dropping the stream drops the receiver, which cancels an unfinished request
            // in the engine.
            let state = (rx, context, false);
            let stream = futures_util::stream::unfold(state, move |(mut rx, ctx, done)| {
                let eos = Arc::clone(&eos);
                async move {
                    if done {
                        return None;
                    }
                    // Biased: a token already waiting is taken without polling the stop
                    // future (each poll of it takes the context token's lock).
                    let o = tokio::select! {
                        biased;
                        o = rx.recv() => o?,
                        () = ctx.stopped() => return None,
                    };
                    // The mocker samples ids at random: keep them off the eos ids, so a
                    // request runs to `max_tokens` as a real model asked to ignore eos would.
                    let mut token = o.token_id % vocab;
                    while eos.contains(&token) {
                        token = (token + 1) % vocab;
                    }
                    let item = LLMEngineOutput {
                        token_ids: vec![token],
                        finish_reason: o.finished.then_some(FinishReason::Length),
                        completion_usage: o.cached_tokens.map(
                            |c| serde_json::json!({"prompt_tokens_details": {"cached_tokens": c}}),
                        ),
                        ..Default::default()
                    };
                    Some((Ok(item), (rx, ctx, o.finished)))
                }
            });
            Ok(stream.boxed())
        })
    }
}
