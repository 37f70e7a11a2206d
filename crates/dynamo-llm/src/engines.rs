//! In-process token engines: a [`TokenEngine`] takes a [`PreprocessedRequest`] (tokens in)
//! and streams [`LLMEngineOutput`] items (tokens out), exactly what a worker streams on the
//! request plane. The same engine can be served three ways: on a worker endpoint
//! ([`TokenEngineHandler`], `run_input(rt, "dyn://…", engine)`), behind the in-process
//! OpenAI frontend (`run_input(rt, "http", engine)`) or a terminal chat (`"text"`/`"stdin"`).
//!
//! * [`EchoEngine`]: streams the prompt's tokens back, one per item, `DYN_TOKEN_ECHO_DELAY_MS`
//!   (default 10 ms) apart, and ends with `finish_reason = stop`; the answer of a chat request
//!   is therefore its templated prompt (without end-of-sequence tokens, which would end it).
//!
//! The simulated engine's token engine (`MockTokenEngine`) lives in the mocker crate, which
//! builds on this one.
//!
//! Cancellation: every engine watches the request's [`Context`]; a stopped context ends the
//! stream, and dropping the stream cancels the request in the engine.

use std::sync::Arc;
use std::time::Duration;

use dynamo_runtime::Context;
use dynamo_runtime::transport::server::{Handler, Request, Responder, SendStatus};
use dynamo_runtime::transport::{ErrorKind, WireError, codec};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use crate::error::{Error, Result};
use crate::preprocessor::{FinishReason, LLMEngineOutput, PreprocessedRequest};

/// The items of one token-engine request.
pub type TokenStream = BoxStream<'static, Result<LLMEngineOutput>>;

/// An engine that generates tokens for preprocessed requests.
pub trait TokenEngine: Send + Sync + 'static {
    /// Start `request`; the stream ends after the item carrying a finish reason, or early
    /// when `context` is stopped.
    ///
    /// # Errors
    /// The engine rejected the request (e.g. [`Error::InvalidRequest`]).
    fn generate(
        &self,
        request: PreprocessedRequest,
        context: Context,
    ) -> BoxFuture<'static, Result<TokenStream>>;
}

/// One response item on the request plane: the runtime's annotated envelope
/// `{"data": item, "id"?, "event"?, "comment"?}` (what Python handlers' items become).
#[derive(serde::Deserialize, serde::Serialize)]
pub struct Annotated<T> {
    /// The item (absent on pure annotations).
    #[serde(default = "Option::default", skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    /// `"error"` ends the stream with the comments as message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Annotations or the error message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<Vec<String>>,
}

impl<T> Annotated<T> {
    /// Wrap an item.
    pub fn data(item: T) -> Self {
        Self {
            data: Some(item),
            event: None,
            comment: None,
        }
    }
}

/// Default delay between echoed tokens (the reference's `DYN_TOKEN_ECHO_DELAY_MS`): slow
/// enough to watch a stream arrive, fast enough for tests.
const DEFAULT_ECHO_DELAY: Duration = Duration::from_millis(10);

/// Streams the prompt's tokens back.
#[derive(Debug, Clone)]
pub struct EchoEngine {
    delay: Duration,
}

impl EchoEngine {
    /// An echo engine with `delay` between tokens.
    pub fn new(delay: Duration) -> Self {
        Self { delay }
    }

    /// An echo engine with the delay of `DYN_TOKEN_ECHO_DELAY_MS` (default 10 ms).
    pub fn from_env() -> Self {
        let delay = std::env::var("DYN_TOKEN_ECHO_DELAY_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(DEFAULT_ECHO_DELAY, Duration::from_millis);
        Self::new(delay)
    }
}

impl TokenEngine for EchoEngine {
    fn generate(
        &self,
        request: PreprocessedRequest,
        context: Context,
    ) -> BoxFuture<'static, Result<TokenStream>> {
        let delay = self.delay;
        Box::pin(async move {
            let max = request
                .stop_conditions
                .max_tokens
                .map_or(usize::MAX, |m| m as usize);
            // End-of-sequence ids in the prompt (a template's bos or turn ends) would end
            // the answer at once: they are not echoed.
            let eos = request.eos_token_ids;
            let tokens: Vec<u32> = request
                .token_ids
                .into_iter()
                .filter(|t| !eos.contains(t))
                .take(max)
                .collect();
            let truncated = tokens.len() == max;
            let state = (tokens.into_iter(), context, false);
            let stream =
                futures_util::stream::unfold(state, move |(mut it, ctx, done)| async move {
                    if done {
                        return None;
                    }
                    let Some(token) = it.next() else {
                        let last = LLMEngineOutput {
                            finish_reason: Some(if truncated {
                                FinishReason::Length
                            } else {
                                FinishReason::Stop
                            }),
                            ..Default::default()
                        };
                        return Some((Ok(last), (it, ctx, true)));
                    };
                    if !delay.is_zero() {
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = ctx.stopped() => return None,
                        }
                    } else if ctx.is_stopped() {
                        return None;
                    }
                    let item = LLMEngineOutput {
                        token_ids: vec![token],
                        ..Default::default()
                    };
                    Some((Ok(item), (it, ctx, false)))
                });
            Ok(stream.boxed())
        })
    }
}

/// Serves a [`TokenEngine`] on the request plane: decodes the [`PreprocessedRequest`],
/// streams the engine's items as annotated envelopes, honours the caller's credit window
/// and stops the engine when the caller stops the stream.
pub struct TokenEngineHandler {
    engine: Arc<dyn TokenEngine>,
}

impl TokenEngineHandler {
    /// Serve `engine`.
    pub fn new(engine: Arc<dyn TokenEngine>) -> Self {
        Self { engine }
    }
}

fn wire_error(e: &Error) -> WireError {
    let kind = match e {
        Error::InvalidRequest { .. } => ErrorKind::InvalidArgument,
        _ => ErrorKind::Unknown,
    };
    WireError::new(kind, e.to_string(), true)
}

impl Handler for TokenEngineHandler {
    fn start(&self, request: Request, out: Responder) {
        let engine = Arc::clone(&self.engine);
        tokio::spawn(async move { serve_request(engine, request, out).await });
    }
}

async fn serve_request(engine: Arc<dyn TokenEngine>, request: Request, mut out: Responder) {
    let req: PreprocessedRequest = match codec::decode(&request.body) {
        Ok(r) => r,
        Err(e) => {
            out.fail(WireError::new(
                ErrorKind::InvalidArgument,
                format!("expected a preprocessed request: {e}"),
                true,
            ));
            return;
        }
    };
    let mut stream = match engine.generate(req, request.context.clone()).await {
        Ok(s) => s,
        Err(e) => {
            out.fail(wire_error(&e));
            return;
        }
    };
    out.accept();
    // One encoding buffer for the stream's items (`send` copies each out).
    let mut bytes = Vec::with_capacity(128);
    while let Some(item) = stream.next().await {
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                out.fail(wire_error(&e));
                return;
            }
        };
        let finished = item.finish_reason.is_some();
        bytes.clear();
        if codec::encode_into(&mut bytes, &Annotated::data(item)).is_err() {
            bytes.clear();
        }
        match out.send(&bytes) {
            Ok(SendStatus::Ready) => {}
            Ok(SendStatus::Wait) => out.credit().await,
            Ok(SendStatus::Stopped) | Err(_) => break,
        }
        if finished {
            break;
        }
    }
    drop(stream);
    out.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tokens: Vec<u32>, max: Option<u32>) -> PreprocessedRequest {
        serde_json::from_value(serde_json::json!({
            "model": "m",
            "token_ids": tokens,
            "stop_conditions": {"max_tokens": max},
        }))
        .expect("request")
    }

    async fn collect(s: TokenStream) -> Vec<LLMEngineOutput> {
        s.map(|i| i.expect("item")).collect().await
    }

    #[tokio::test]
    async fn echo_streams_the_prompt_then_stops() {
        let e = EchoEngine::new(Duration::ZERO);
        let items = collect(
            e.generate(request(vec![5, 6, 7], None), Context::default())
                .await
                .expect("stream"),
        )
        .await;
        let tokens: Vec<u32> = items.iter().flat_map(|i| i.token_ids.clone()).collect();
        assert_eq!(tokens, vec![5, 6, 7]);
        assert_eq!(
            items.last().and_then(|i| i.finish_reason.clone()),
            Some(FinishReason::Stop)
        );
    }

    #[tokio::test]
    async fn echo_skips_end_of_sequence_tokens() {
        let e = EchoEngine::new(Duration::ZERO);
        let mut req = request(vec![0, 5, 2, 6], None);
        req.eos_token_ids = vec![0, 2];
        let items = collect(e.generate(req, Context::default()).await.expect("stream")).await;
        let tokens: Vec<u32> = items.iter().flat_map(|i| i.token_ids.clone()).collect();
        assert_eq!(tokens, vec![5, 6]);
    }

    #[tokio::test]
    async fn echo_honours_max_tokens() {
        let e = EchoEngine::new(Duration::ZERO);
        let items = collect(
            e.generate(request(vec![1, 2, 3, 4], Some(2)), Context::default())
                .await
                .expect("stream"),
        )
        .await;
        let tokens: Vec<u32> = items.iter().flat_map(|i| i.token_ids.clone()).collect();
        assert_eq!(tokens, vec![1, 2]);
        assert_eq!(
            items.last().and_then(|i| i.finish_reason.clone()),
            Some(FinishReason::Length)
        );
    }

    #[tokio::test]
    async fn echo_stops_with_its_context() {
        let e = EchoEngine::new(Duration::from_millis(20));
        let ctx = Context::default();
        let mut s = e
            .generate(request((0..100).collect(), None), ctx.clone())
            .await
            .expect("stream");
        assert!(s.next().await.is_some());
        ctx.stop_generating();
        assert!(s.next().await.is_none());
    }
}
