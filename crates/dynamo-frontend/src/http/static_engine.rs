//! In-process ("static") models of the HTTP frontend, served next to the discovered ones.
//!
//! * [`OpenAiEngine`]: takes the raw OpenAI request body and streams OpenAI response chunks
//!   (JSON). Python's `PythonAsyncEngine` / `HttpAsyncEngine` implement it; they are added
//!   per surface with `HttpService.add_chat_completions_model` /
//!   `add_completions_model`. The frontend validates the request (400 before the engine sees
//!   it), streams the chunks as SSE ending with `data: [DONE]`, or folds them into one
//!   response. An engine error before the first chunk is answered with its status (always
//!   for non-streaming requests; for streaming ones when the service waits for the first
//!   item, see [`PreCommit`]); after it, the stream ends with an SSE `error` event.
//! * [`StaticTokenModel`]: a [`TokenEngine`] (echo, mocker) with the model's preprocessor:
//!   the frontend templates, tokenizes and detokenizes exactly as for a remote worker.
//!
//! Cancellation: each request's [`Context`] is stopped when its response is dropped before
//! the engine finished (the client went away), and the engine's stream is dropped.
//!
//! Invariant: a model name maps to at most one engine per surface; static models shadow
//! discovered models of the same name.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use dynamo_llm::engines::{TokenEngine, TokenStream};
use dynamo_llm::error::{Error, Result};
use dynamo_llm::model_card::ModelDeploymentCard;
use dynamo_llm::preprocessor::openai;
use dynamo_llm::preprocessor::{LLMEngineOutput, Preprocessor};
use dynamo_runtime::Context;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use super::error::HttpError;
use super::respond::{
    DONE, Inflight, Surface, fail, json_response, sse_data, sse_error, sse_headers,
};
use super::{Shared, WorkerStream};

/// The chunks of one request: each item is the JSON of one OpenAI response chunk, or the
/// error that ends the stream.
pub type ChunkStream = BoxStream<'static, Result<Bytes, HttpError>>;

/// An engine that answers raw OpenAI requests with OpenAI chunks.
pub trait OpenAiEngine: Send + Sync + 'static {
    /// Start `request` (the request body, already validated). Stopping `context` asks the
    /// engine to stop; dropping the stream abandons the request.
    fn generate(&self, request: Bytes, context: Context) -> ChunkStream;
}

/// A token engine served in-process, with its model's preprocessing.
pub struct StaticTokenModel {
    /// Served name.
    pub name: String,
    /// The model card.
    pub card: ModelDeploymentCard,
    /// Template, tokenizer and stop handling.
    pub preprocessor: Preprocessor,
    /// The engine.
    pub engine: Arc<dyn TokenEngine>,
}

impl StaticTokenModel {
    /// Serve `engine` under `card`'s name.
    ///
    /// # Errors
    /// The card's tokenizer or template cannot be loaded.
    pub fn new(card: ModelDeploymentCard, engine: Arc<dyn TokenEngine>) -> Result<Self> {
        let preprocessor = Preprocessor::from_card(&card)?;
        Ok(Self {
            name: card.display_name.clone(),
            card,
            preprocessor,
            engine,
        })
    }
}

/// The endpoint families `HttpService.enable_endpoint` names (the reference's list; this
/// frontend serves `chat` and `completion`, the others have no route here).
const ENDPOINT_TYPES: [&str; 14] = [
    "chat",
    "completion",
    "embedding",
    "images",
    "audios",
    "videos",
    "realtime",
    "classify",
    "pooling",
    "rerank",
    "responses",
    "anthropic_messages",
    "generate",
    "batch",
];

/// Parse an endpoint type (case-insensitive).
///
/// # Errors
/// [`Error::InvalidConfig`] naming the valid types.
pub fn parse_endpoint_type(name: &str) -> Result<&'static str> {
    let lower = name.to_ascii_lowercase();
    ENDPOINT_TYPES
        .iter()
        .find(|t| **t == lower)
        .copied()
        .ok_or_else(|| Error::InvalidConfig {
            field: "endpoint_type".into(),
            reason: format!(
                "invalid endpoint type {name:?}; valid types are: {}",
                ENDPOINT_TYPES.join(", ")
            ),
        })
}

struct OpenAiModel {
    engine: Arc<dyn OpenAiEngine>,
    created: u64,
}

#[derive(Default)]
struct Registry {
    chat: BTreeMap<String, OpenAiModel>,
    completions: BTreeMap<String, OpenAiModel>,
    tokens: BTreeMap<String, (Arc<StaticTokenModel>, u64)>,
    disabled: BTreeSet<&'static str>,
}

/// What a static model resolves to for one request.
pub(super) enum StaticTarget {
    OpenAi(Arc<dyn OpenAiEngine>),
    Tokens(Arc<StaticTokenModel>),
}

/// The static models of a service (cheap to clone; changes apply to a running service).
#[derive(Clone, Default)]
pub struct StaticModels {
    inner: Arc<RwLock<Registry>>,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl StaticModels {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serve `engine` as chat model `name` (replacing one of the same name).
    pub fn add_chat(&self, name: &str, engine: Arc<dyn OpenAiEngine>) {
        let created = now_secs();
        self.write()
            .chat
            .insert(name.to_owned(), OpenAiModel { engine, created });
    }

    /// Serve `engine` as completions model `name` (replacing one of the same name).
    pub fn add_completions(&self, name: &str, engine: Arc<dyn OpenAiEngine>) {
        let created = now_secs();
        self.write()
            .completions
            .insert(name.to_owned(), OpenAiModel { engine, created });
    }

    /// Stop serving chat model `name`; false when there was none.
    pub fn remove_chat(&self, name: &str) -> bool {
        self.write().chat.remove(name).is_some()
    }

    /// Stop serving completions model `name`; false when there was none.
    pub fn remove_completions(&self, name: &str) -> bool {
        self.write().completions.remove(name).is_some()
    }

    /// Chat model names, sorted.
    pub fn list_chat(&self) -> Vec<String> {
        self.read().chat.keys().cloned().collect()
    }

    /// Completions model names, sorted.
    pub fn list_completions(&self) -> Vec<String> {
        self.read().completions.keys().cloned().collect()
    }

    /// Serve a token engine (chat and completions, as its card says).
    pub fn add_token_model(&self, model: StaticTokenModel) {
        let name = model.name.clone();
        self.write()
            .tokens
            .insert(name, (Arc::new(model), now_secs()));
    }

    /// The token model `name` (for in-process callers such as the text input).
    pub fn token_model(&self, name: &str) -> Option<Arc<StaticTokenModel>> {
        self.read().tokens.get(name).map(|(m, _)| Arc::clone(m))
    }

    /// Turn an endpoint family on or off (all are on by default).
    ///
    /// # Errors
    /// An unknown endpoint type, or `batch`: as in the reference, whether the batch
    /// endpoint exists is decided when the service is built and cannot change at run time.
    pub fn enable_endpoint(&self, endpoint_type: &str, enabled: bool) -> Result<()> {
        let t = parse_endpoint_type(endpoint_type)?;
        if t == "batch" {
            return Err(Error::config(
                "endpoint_type",
                "batch endpoint availability is fixed when the HTTP service is built",
            ));
        }
        let mut reg = self.write();
        if enabled {
            reg.disabled.remove(&t);
        } else {
            reg.disabled.insert(t);
        }
        Ok(())
    }

    /// Whether the endpoint family is served.
    pub fn is_enabled(&self, endpoint_type: &str) -> bool {
        !self.read().disabled.iter().any(|d| *d == endpoint_type)
    }

    /// Every static model name with its creation time (for `/v1/models`).
    pub fn names(&self) -> BTreeMap<String, u64> {
        let reg = self.read();
        let mut out = BTreeMap::new();
        for (name, m) in reg.chat.iter().chain(reg.completions.iter()) {
            out.entry(name.clone()).or_insert(m.created);
        }
        for (name, (_, created)) in &reg.tokens {
            out.entry(name.clone()).or_insert(*created);
        }
        out
    }

    pub(super) fn resolve(&self, name: &str, surface: Surface) -> Option<StaticTarget> {
        let reg = self.read();
        let openai = match surface {
            Surface::Chat => reg.chat.get(name),
            Surface::Completions => reg.completions.get(name),
        };
        if let Some(m) = openai {
            return Some(StaticTarget::OpenAi(Arc::clone(&m.engine)));
        }
        let (m, _) = reg.tokens.get(name)?;
        let t = m.card.model_type;
        let ok = match surface {
            Surface::Chat => t.supports_chat(),
            Surface::Completions => t.supports_completions(),
        };
        ok.then(|| StaticTarget::Tokens(Arc::clone(m)))
    }
}

/// When a streaming response commits its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreCommit {
    /// At once: an engine error before the first chunk is an SSE error event.
    Immediate,
    /// After the first chunk (or the error that replaces it).
    FirstItem,
    /// After the first chunk or this long, whichever comes first.
    Peek(Duration),
}

impl PreCommit {
    /// `wait_for_first_item`, else `DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS` (unset or 0: at once).
    pub fn from_env(wait_for_first_item: bool) -> Self {
        if wait_for_first_item {
            return Self::FirstItem;
        }
        std::env::var("DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map_or(Self::Immediate, |ms| Self::Peek(Duration::from_millis(ms)))
    }
}

/// Where a token request's items come from.
#[expect(
    clippy::large_enum_variant,
    reason = "one per request, moved once into the response; boxing the worker stream would \
              add an allocation to every remote request"
)]
pub(super) enum TokenSource {
    /// A remote worker (with migration).
    Worker(WorkerStream),
    /// An in-process engine.
    Local(TokenStream),
}

impl TokenSource {
    pub(super) async fn next(&mut self) -> Option<Result<LLMEngineOutput, HttpError>> {
        match self {
            Self::Worker(w) => w.next().await,
            Self::Local(s) => s.next().await.map(|r| r.map_err(HttpError::from)),
        }
    }
}

/// Start a token request on an in-process engine.
pub(super) async fn open_local(
    model: &StaticTokenModel,
    request: dynamo_llm::preprocessor::PreprocessedRequest,
    context: Context,
) -> Result<TokenSource, HttpError> {
    let stream = model.engine.generate(request, context.clone()).await?;
    // The engine watches the context; stop it when the response is dropped early.
    let stop = StopOnDrop {
        context,
        finished: false,
    };
    let stream = futures_util::stream::unfold((stream, stop), |(mut s, mut stop)| async move {
        let item = s.next().await;
        match &item {
            Some(Ok(o)) if o.finish_reason.is_some() => stop.finished = true,
            Some(Ok(_)) => {}
            Some(Err(_)) | None => stop.finished = true,
        }
        item.map(|i| (i, (s, stop)))
    });
    Ok(TokenSource::Local(stream.boxed()))
}

/// Stops the request's context when the response is dropped before the engine finished.
struct StopOnDrop {
    context: Context,
    finished: bool,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            self.context.stop_generating();
        }
    }
}

/// One OpenAI-engine request in flight.
struct ChunkRun {
    stream: ChunkStream,
    stop: StopOnDrop,
    guard: Inflight,
}

/// Serve a request for an [`OpenAiEngine`] model.
pub(super) async fn openai_request(
    shared: Arc<Shared>,
    engine: Arc<dyn OpenAiEngine>,
    model: String,
    body: Bytes,
    surface: Surface,
    started: Instant,
) -> Response {
    let streaming = match surface {
        Surface::Chat => openai::parse_chat_request(&body).map(|r| r.is_stream()),
        Surface::Completions => openai::parse_completion_request(&body).map(|r| r.is_stream()),
    };
    let streaming = match streaming {
        Ok(s) => s,
        Err(e) => return fail(&shared, &model, surface, false, e.into()),
    };
    let context = Context::default();
    let stream = engine.generate(body, context.clone());
    let guard = Inflight::start(Arc::clone(&shared), model, surface, streaming, started);
    let mut run = ChunkRun {
        stream,
        stop: StopOnDrop {
            context,
            finished: false,
        },
        guard,
    };
    if !streaming {
        return run.collect(surface).await;
    }
    let first = match shared.pre_commit {
        PreCommit::Immediate => None,
        PreCommit::FirstItem => Some(run.next().await),
        PreCommit::Peek(d) => tokio::time::timeout(d, run.next()).await.ok(),
    };
    if let Some(Some(Err(e))) = first {
        return run.error_response(e);
    }
    sse_chunks(run, first.flatten())
}

impl ChunkRun {
    async fn next(&mut self) -> Option<Result<Bytes, HttpError>> {
        let item = self.stream.next().await;
        match &item {
            Some(Ok(_)) => self.guard.tokens(1),
            Some(Err(_)) | None => self.stop.finished = true,
        }
        item
    }

    fn error_response(mut self, e: HttpError) -> Response {
        self.guard.error(&e);
        e.into_response()
    }

    async fn collect(mut self, surface: Surface) -> Response {
        let mut fold = Fold::default();
        loop {
            match self.next().await {
                Some(Ok(chunk)) => {
                    if let Err(e) = fold.add(&chunk) {
                        return self.error_response(e);
                    }
                }
                Some(Err(e)) => return self.error_response(e),
                None => break,
            }
        }
        self.guard.status = "success";
        json_response(&fold.finish(surface, self.stop.context.id()))
    }
}

fn sse_chunks(run: ChunkRun, first: Option<Result<Bytes, HttpError>>) -> Response {
    // The body owns the run: a client that disconnects drops it, which stops the context
    // and drops the engine's stream.
    let stream = futures_util::stream::unfold(Some((run, first)), |state| async move {
        let (mut run, pending) = state?;
        let item = match pending {
            Some(item) => Some(item),
            None => run.next().await,
        };
        let bytes = match item {
            Some(Ok(chunk)) => {
                return Some((
                    Ok::<_, Infallible>(Bytes::from(sse_data(&chunk))),
                    Some((run, None)),
                ));
            }
            Some(Err(e)) => {
                run.guard.error(&e);
                sse_error(&e)
            }
            None => {
                run.guard.status = "success";
                DONE.to_vec()
            }
        };
        Some((Ok(Bytes::from(bytes)), None))
    });
    sse_headers(Body::from_stream(stream))
}

/// One choice being folded.
#[derive(Default)]
struct ChoiceFold {
    role: Option<serde_json::Value>,
    content: String,
    reasoning: String,
    tool_calls: Vec<serde_json::Value>,
    finish_reason: Option<serde_json::Value>,
}

/// Folds OpenAI chunks into one response, keeping the engine's id, creation time and model.
#[derive(Default)]
struct Fold {
    id: Option<serde_json::Value>,
    created: Option<serde_json::Value>,
    model: Option<serde_json::Value>,
    system_fingerprint: Option<serde_json::Value>,
    usage: Option<serde_json::Value>,
    choices: BTreeMap<u64, ChoiceFold>,
}

fn non_null(v: Option<&serde_json::Value>) -> Option<serde_json::Value> {
    v.filter(|v| !v.is_null()).cloned()
}

impl Fold {
    fn add(&mut self, chunk: &[u8]) -> Result<(), HttpError> {
        let v: serde_json::Value = serde_json::from_slice(chunk)
            .map_err(|e| HttpError::internal(format!("malformed engine output: {e}")))?;
        let Some(obj) = v.as_object() else {
            return Err(HttpError::internal(
                "malformed engine output: a chunk must be a JSON object",
            ));
        };
        self.id = self.id.take().or_else(|| non_null(obj.get("id")));
        self.created = self.created.take().or_else(|| non_null(obj.get("created")));
        self.model = self.model.take().or_else(|| non_null(obj.get("model")));
        self.system_fingerprint = self
            .system_fingerprint
            .take()
            .or_else(|| non_null(obj.get("system_fingerprint")));
        if let Some(u) = non_null(obj.get("usage")) {
            self.usage = Some(u);
        }
        let choices = obj.get("choices").and_then(serde_json::Value::as_array);
        for c in choices.into_iter().flatten() {
            let index = c
                .get("index")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            let acc = self.choices.entry(index).or_default();
            // Chat chunks carry a delta (a full response, a message); completions, text.
            let part = c.get("delta").or_else(|| c.get("message"));
            if let Some(d) = part {
                if acc.role.is_none() {
                    acc.role = non_null(d.get("role"));
                }
                if let Some(s) = d.get("content").and_then(serde_json::Value::as_str) {
                    acc.content.push_str(s);
                }
                if let Some(s) = d
                    .get("reasoning_content")
                    .and_then(serde_json::Value::as_str)
                {
                    acc.reasoning.push_str(s);
                }
                if let Some(calls) = d.get("tool_calls").and_then(serde_json::Value::as_array) {
                    acc.tool_calls.extend(calls.iter().cloned());
                }
            }
            if let Some(s) = c.get("text").and_then(serde_json::Value::as_str) {
                acc.content.push_str(s);
            }
            if let Some(f) = non_null(c.get("finish_reason")) {
                acc.finish_reason = Some(f);
            }
        }
        Ok(())
    }

    fn finish(self, surface: Surface, request_id: &str) -> serde_json::Value {
        use serde_json::{Value, json};
        let (prefix, object) = match surface {
            Surface::Chat => ("chatcmpl", "chat.completion"),
            Surface::Completions => ("cmpl", "text_completion"),
        };
        let mut choices = self.choices;
        if choices.is_empty() {
            choices.insert(0, ChoiceFold::default());
        }
        let choices: Vec<Value> = choices
            .into_iter()
            .map(|(index, c)| {
                let finish = c.finish_reason.unwrap_or(Value::Null);
                match surface {
                    Surface::Chat => {
                        let mut message = json!({
                            "role": c.role.unwrap_or_else(|| json!("assistant")),
                            "content": c.content,
                        });
                        if !c.reasoning.is_empty() {
                            message["reasoning_content"] = json!(c.reasoning);
                        }
                        if !c.tool_calls.is_empty() {
                            message["tool_calls"] = Value::Array(c.tool_calls);
                        }
                        json!({"index": index, "message": message, "finish_reason": finish, "logprobs": null})
                    }
                    Surface::Completions => {
                        json!({"index": index, "text": c.content, "finish_reason": finish, "logprobs": null})
                    }
                }
            })
            .collect();
        let mut out = json!({
            "id": self.id.unwrap_or_else(|| json!(format!("{prefix}-{request_id}"))),
            "object": object,
            "created": self.created.unwrap_or_else(|| json!(now_secs())),
            "model": self.model.unwrap_or(Value::Null),
            "choices": choices,
        });
        if let Some(fp) = self.system_fingerprint {
            out["system_fingerprint"] = fp;
        }
        if let Some(u) = self.usage {
            out["usage"] = u;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(chunks: &[serde_json::Value], surface: Surface) -> serde_json::Value {
        let mut f = Fold::default();
        for c in chunks {
            f.add(&serde_json::to_vec(c).expect("json")).expect("chunk");
        }
        f.finish(surface, "rid")
    }

    #[test]
    fn chat_chunks_fold_into_one_message_keeping_the_engine_id() {
        let out = fold(
            &[
                serde_json::json!({"id": "x1", "created": 7, "model": "m", "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": null}]}),
                serde_json::json!({"id": "x1", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}),
            ],
            Surface::Chat,
        );
        assert_eq!(out["id"], "x1");
        assert_eq!(out["created"], 7);
        assert_eq!(out["object"], "chat.completion");
        assert_eq!(out["choices"][0]["message"]["content"], "Hello");
        assert_eq!(out["choices"][0]["message"]["role"], "assistant");
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
        assert_eq!(out["usage"]["total_tokens"], 3);
    }

    #[test]
    fn completion_chunks_fold_per_choice_index() {
        let out = fold(
            &[
                serde_json::json!({"choices": [{"index": 1, "text": "b"}, {"index": 0, "text": "a"}]}),
                serde_json::json!({"choices": [{"index": 0, "text": "c", "finish_reason": "length"}]}),
            ],
            Surface::Completions,
        );
        assert_eq!(out["id"], "cmpl-rid");
        assert_eq!(out["object"], "text_completion");
        assert_eq!(out["choices"][0]["text"], "ac");
        assert_eq!(out["choices"][0]["finish_reason"], "length");
        assert_eq!(out["choices"][1]["text"], "b");
    }

    #[test]
    fn a_chunk_that_is_not_an_object_is_an_engine_error() {
        let mut f = Fold::default();
        let e = f.add(b"[1, 2]").expect_err("not an object");
        assert_eq!(e.status, 500);
    }

    #[test]
    fn endpoint_types_parse_case_insensitively_and_toggle() {
        assert_eq!(parse_endpoint_type("Chat").expect("chat"), "chat");
        let err = parse_endpoint_type("completions").expect_err("plural is not a type");
        assert!(
            err.to_string()
                .contains("valid types are: chat, completion")
        );
        let m = StaticModels::default();
        assert!(m.is_enabled("chat"));
        m.enable_endpoint("chat", false).expect("toggle");
        assert!(!m.is_enabled("chat") && m.is_enabled("completion"));
        m.enable_endpoint("CHAT", true).expect("toggle");
        assert!(m.is_enabled("chat"));
    }

    struct Nothing;
    impl OpenAiEngine for Nothing {
        fn generate(&self, _: Bytes, _: Context) -> ChunkStream {
            futures_util::stream::empty().boxed()
        }
    }

    #[test]
    fn models_are_registered_per_surface() {
        let m = StaticModels::default();
        m.add_chat("b", Arc::new(Nothing));
        m.add_chat("a", Arc::new(Nothing));
        m.add_completions("a", Arc::new(Nothing));
        assert_eq!(m.list_chat(), ["a", "b"]);
        assert_eq!(m.list_completions(), ["a"]);
        assert!(m.resolve("b", Surface::Completions).is_none());
        assert!(m.remove_chat("a"));
        assert!(!m.remove_chat("a"));
        assert_eq!(m.names().keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(matches!(
            m.resolve("a", Surface::Completions),
            Some(StaticTarget::OpenAi(_))
        ));
    }
}
