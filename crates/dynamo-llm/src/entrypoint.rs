//! Entry points: the mocker served as a worker endpoint, and the pieces the Python
//! `make_engine` / `run_input` and the CLIs assemble.
//!
//! [`MockerHandler`] serves a [`MockEngineRunner`] on the request plane: it takes a
//! [`PreprocessedRequest`] (tokens in) and streams [`LLMEngineOutput`] items (one token
//! each) until `max_tokens`; a stop from the caller (client disconnect) drops the engine's
//! output channel, which cancels the request in the engine. [`serve_mocker`] registers the
//! worker's model card and serves the endpoint until the runtime stops.

use std::path::Path;
use std::sync::Arc;

use dynamo_kv_router::protocols::WorkerWithDpRank;

use crate::kv_routing::KvEventPublisher;
use std::sync::atomic::{AtomicU64, Ordering};

use dynamo_runtime::transport::server::{Handler, Request, Responder, SendStatus};
use dynamo_runtime::transport::{ErrorKind, WireError};
use dynamo_runtime::{DistributedRuntime, EndpointId};

use crate::discovery::register_model;
use crate::error::{Error, Result};
use crate::http::engine::Annotated;
use crate::mocker::runner::MockEngineRunner;
use crate::mocker::{MockEngineArgs, MockRequest};
use crate::model_card::{ModelInput, ModelType, RegisterModelArgs};
use crate::preprocessor::{FinishReason, LLMEngineOutput, PreprocessedRequest};

/// Output tokens when a request does not say (`max_tokens` unset and no context length).
const DEFAULT_MAX_TOKENS: usize = 256;

/// A mocker engine serving an endpoint.
pub struct MockerHandler {
    runner: MockEngineRunner,
    next: AtomicU64,
    vocab_size: u32,
}

impl MockerHandler {
    /// Serve `runner`, whose tokens fall below `vocab_size`.
    pub fn new(runner: MockEngineRunner, vocab_size: u32) -> Self {
        Self {
            runner,
            next: AtomicU64::new(0),
            vocab_size: vocab_size.max(2),
        }
    }
}

impl Handler for MockerHandler {
    fn start(&self, request: Request, out: Responder) {
        let runner = self.runner.clone();
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let vocab = self.vocab_size;
        tokio::spawn(async move { run_mock_request(runner, request, out, seq, vocab).await });
    }
}

async fn run_mock_request(
    runner: MockEngineRunner,
    request: Request,
    mut out: Responder,
    seq: u64,
    vocab: u32,
) {
    let req: PreprocessedRequest = match serde_json::from_slice(&request.body) {
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
    let max = req
        .stop_conditions
        .max_tokens
        .map_or(DEFAULT_MAX_TOKENS, |m| m as usize);
    if max == 0 {
        let item = LLMEngineOutput {
            finish_reason: Some(FinishReason::Length),
            ..Default::default()
        };
        let _ = out.send(&serde_json::to_vec(&Annotated::data(item)).unwrap_or_default());
        out.finish();
        return;
    }
    let id = format!("{}-{seq}", request.context.id());
    let mut rx = match runner
        .submit(MockRequest::new(id, req.token_ids.clone(), max))
        .await
    {
        Ok(rx) => rx,
        Err(e) => {
            out.fail(WireError::new(
                ErrorKind::InvalidArgument,
                e.to_string(),
                true,
            ));
            return;
        }
    };
    out.accept();
    let ctx = request.context.clone();
    loop {
        let next = tokio::select! {
            o = rx.recv() => o,
            () = ctx.stopped() => None,
        };
        let Some(o) = next else { break };
        // The mocker samples ids at random: keep them off the eos ids, so a request runs
        // to `max_tokens` as a real model asked to ignore eos would.
        let mut token = o.token_id % vocab;
        while req.eos_token_ids.contains(&token) {
            token = (token + 1) % vocab;
        }
        let item = LLMEngineOutput {
            token_ids: vec![token],
            finish_reason: o.finished.then_some(FinishReason::Length),
            completion_usage: o
                .cached_tokens
                .map(|c| serde_json::json!({"prompt_tokens_details": {"cached_tokens": c}})),
            ..Default::default()
        };
        let bytes = serde_json::to_vec(&Annotated::data(item)).unwrap_or_default();
        match out.send(&bytes) {
            Ok(SendStatus::Ready) => {}
            Ok(SendStatus::Wait) => out.credit().await,
            Ok(SendStatus::Stopped) | Err(_) => break,
        }
        if o.finished {
            break;
        }
    }
    // Dropping the receiver cancels an unfinished request in the engine.
    drop(rx);
    out.finish();
}

/// What a mocker worker serves.
#[derive(Debug, Clone)]
pub struct MockerWorkerConfig {
    /// Local model directory (config and tokenizer; no weights).
    pub model_path: String,
    /// Served name (defaults to the model path).
    pub model_name: Option<String>,
    /// The endpoint.
    pub endpoint: EndpointId,
    /// Engine settings.
    pub engine_args: MockEngineArgs,
}

/// `vocab_size` of a model directory's `config.json`.
fn model_vocab_size(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("vocab_size")
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

/// Start the mocker engine, register its card and serve the endpoint until the runtime
/// stops.
///
/// # Errors
/// Invalid engine arguments, a model directory that cannot be loaded, or a runtime error.
pub async fn serve_mocker(runtime: DistributedRuntime, config: MockerWorkerConfig) -> Result<()> {
    let reg = RegisterModelArgs {
        model_input: ModelInput::Tokens,
        model_type: ModelType::CHAT.union(ModelType::COMPLETIONS),
        model_path: config.model_path.clone(),
        model_name: config.model_name.clone(),
        kv_cache_block_size: u32::try_from(config.engine_args.block_size)
            .ok()
            .filter(|b| *b > 0),
        ..Default::default()
    };
    let card = reg.build_card()?;
    let mut args = config.engine_args.clone();
    let vocab = model_vocab_size(&card.local_dir()).unwrap_or(args.vocab_size);
    args.vocab_size = vocab;
    // The engine's KV events go to routers on the event plane (with a worker-local index for
    // their gap recovery), numbered per rank like a real engine's.
    let worker = WorkerWithDpRank::new(runtime.connection_id(), 0);
    let publisher = Arc::new(
        KvEventPublisher::new_raw(&runtime, &config.endpoint, worker, true)
            .map_err(|e| Error::Runtime(e.to_string()))?,
    );
    let runner = MockEngineRunner::spawn(args, publisher.event_sink())?;
    let handler = Arc::new(MockerHandler::new(runner, vocab));
    register_model(&runtime, &config.endpoint, &card).await?;
    runtime
        .serve_endpoint(&config.endpoint, handler, true)
        .await
        .map_err(|e| Error::Runtime(e.to_string()))
}
