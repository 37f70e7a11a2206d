//! The route handlers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use dynamo_runtime::Context;

use super::Shared;
use super::engine::{RoutedRequest, WorkerStream, decode_item, route_error};
use super::error::HttpError;
use super::static_engine::{self, StaticTarget, TokenSource};
use crate::discovery::ModelEntry;
use crate::preprocessor::OutputProcessor;
use crate::preprocessor::openai::{self, ResponseFactory, Usage};

/// Which OpenAI surface a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Surface {
    Chat,
    Completions,
}

impl Surface {
    fn label(self) -> &'static str {
        match self {
            Self::Chat => "chat_completions",
            Self::Completions => "completions",
        }
    }

    /// The `enable_endpoint` type of the surface.
    fn endpoint_type(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completion",
        }
    }
}

pub(super) fn json_response(value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(v) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            v,
        )
            .into_response(),
        Err(e) => HttpError::internal(e.to_string()).into_response(),
    }
}

/// The model of a request, peeked without a full parse (for the 404 before validation).
fn lookup(shared: &Shared, model: &str, surface: Surface) -> Result<Arc<ModelEntry>, HttpError> {
    let entry = shared
        .models
        .get(model)
        .ok_or_else(|| HttpError::model_not_found(model))?;
    let t = entry.card.model_type;
    let ok = match surface {
        Surface::Chat => t.supports_chat(),
        Surface::Completions => t.supports_completions(),
    };
    if ok {
        Ok(entry)
    } else {
        Err(HttpError::model_not_found(model))
    }
}

pub(super) fn fail(
    shared: &Shared,
    model: &str,
    surface: Surface,
    streaming: bool,
    e: HttpError,
) -> Response {
    shared.metrics.error(model, e.kind());
    shared
        .metrics
        .request(model, surface.label(), streaming, "error");
    e.into_response()
}

pub(super) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body =
        super::request_body::read(&headers, body, shared.body_limit, shared.body_read_timeout)
            .await;
    handle(shared, body, Surface::Chat).await
}

pub(super) async fn completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body =
        super::request_body::read(&headers, body, shared.body_limit, shared.body_read_timeout)
            .await;
    handle(shared, body, Surface::Completions).await
}

/// Peek `model` and `stream` from a body that parsed as JSON.
fn peek(body: &[u8]) -> (String, bool) {
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(default)]
        model: Option<serde_json::Value>,
        #[serde(default)]
        stream: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Peek>(body) {
        Ok(p) => (
            p.model
                .as_ref()
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            p.stream
                .as_ref()
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
        ),
        Err(_) => (String::new(), false),
    }
}

/// A parsed OpenAI request of either surface (one per request: the size difference of the
/// variants does not matter).
#[expect(
    clippy::large_enum_variant,
    reason = "one short-lived value per request"
)]
enum Parsed {
    Chat(openai::ChatCompletionRequest),
    Completion(openai::CompletionRequest),
}

impl Parsed {
    fn is_stream(&self) -> bool {
        match self {
            Self::Chat(r) => r.is_stream(),
            Self::Completion(r) => r.is_stream(),
        }
    }

    fn model(&self) -> &str {
        match self {
            Self::Chat(r) => &r.model,
            Self::Completion(r) => &r.model,
        }
    }
}

async fn handle(shared: Arc<Shared>, body: Result<Bytes, HttpError>, surface: Surface) -> Response {
    let started = Instant::now();
    let body = match body {
        Ok(b) => b,
        Err(e) => return fail(&shared, "", surface, false, e),
    };
    if !shared.statics.is_enabled(surface.endpoint_type()) {
        return fail(
            &shared,
            "",
            surface,
            false,
            HttpError::new(404, "not found"),
        );
    }
    let (model, streaming) = peek(&body);
    let local = match shared.statics.resolve(&model, surface) {
        Some(StaticTarget::OpenAi(engine)) => {
            return static_engine::openai_request(shared, engine, model, body, surface, started)
                .await;
        }
        Some(StaticTarget::Tokens(m)) => Some(m),
        None => None,
    };
    // Unknown models answer 404 even when the rest of the body is invalid, as OpenAI does,
    // but a body that is not JSON at all is a 400.
    let entry = if model.is_empty() || local.is_some() {
        None
    } else {
        match lookup(&shared, &model, surface) {
            Ok(e) => Some(e),
            Err(e) => return fail(&shared, &model, surface, streaming, e),
        }
    };
    let id_prefix = match surface {
        Surface::Chat => "chatcmpl",
        Surface::Completions => "cmpl",
    };
    let ctx = Context::default();
    let factory = ResponseFactory::new(format!("{id_prefix}-{}", ctx.id()), model.clone());
    // Parse first: a body that is not a valid request is a 400 whatever its model.
    let parsed = match surface {
        Surface::Chat => openai::parse_chat_request(&body).map(Parsed::Chat),
        Surface::Completions => openai::parse_completion_request(&body).map(Parsed::Completion),
    };
    let parsed = match parsed {
        Ok(p) => p,
        Err(e) => return fail(&shared, &model, surface, streaming, e.into()),
    };
    let streaming = parsed.is_stream();
    // Where the request goes: an in-process token model or a discovered token model (both
    // preprocessed here), or a discovered text model, which receives the raw request.
    let target: Result<Arc<ModelEntry>, Arc<static_engine::StaticTokenModel>> = match (local, entry)
    {
        (Some(m), _) => Err(m),
        (None, Some(entry)) if !entry.is_tokens() => {
            return text_request(
                shared, entry, body, surface, streaming, factory, ctx, started,
            )
            .await;
        }
        (None, Some(entry)) => Ok(entry),
        (None, None) => {
            let error = HttpError::model_not_found(parsed.model());
            return fail(&shared, &model, surface, streaming, error);
        }
    };
    let pre = match &target {
        Err(m) => &m.preprocessor,
        // Discovery gives every token model a preprocessor.
        Ok(entry) => match entry.preprocessor.as_ref() {
            Some(p) => p,
            None => {
                let error = HttpError::internal("the model has no preprocessor");
                return fail(&shared, &model, surface, streaming, error);
            }
        },
    };
    let (preq, include_usage) = match &parsed {
        Parsed::Chat(r) => (pre.preprocess_chat(r), r.include_usage()),
        Parsed::Completion(r) => (pre.preprocess_completion(r), r.include_usage()),
    };
    let preq = match preq {
        Ok(p) => p,
        Err(e) => return fail(&shared, &model, surface, streaming, e.into()),
    };
    let processor = pre.output_processor(&preq);
    let entry = target;
    let prompt_tokens = u32::try_from(preq.token_ids.len()).unwrap_or(u32::MAX);
    let guard = Inflight::start(
        Arc::clone(&shared),
        model.clone(),
        surface,
        streaming,
        started,
    );
    let opened = match entry {
        Ok(entry) => WorkerStream::open(
            entry,
            Arc::clone(&shared.selector),
            Arc::clone(&shared.metrics),
            preq,
            ctx,
            shared.migration_limit,
        )
        .await
        .map(TokenSource::Worker),
        Err(local) => static_engine::open_local(&local, preq, ctx).await,
    };
    let stream = match opened {
        Ok(s) => s,
        Err(e) => {
            shared.metrics.error(&model, e.kind());
            drop(guard);
            return e.into_response();
        }
    };
    let run = TokenRun {
        stream,
        processor,
        factory,
        surface,
        prompt_tokens,
        include_usage,
        first_chunk: true,
        guard,
    };
    if streaming {
        sse_response(run)
    } else {
        run.collect().await
    }
}

/// Records the request's metrics when it ends, however it ends.
pub(super) struct Inflight {
    shared: Arc<Shared>,
    model: String,
    surface: Surface,
    streaming: bool,
    pub(super) status: &'static str,
    started: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u32,
}

impl Inflight {
    /// Count a request in flight until the guard drops.
    pub(super) fn start(
        shared: Arc<Shared>,
        model: String,
        surface: Surface,
        streaming: bool,
        started: Instant,
    ) -> Self {
        shared.metrics.inflight(&model, 1);
        Self {
            shared,
            model,
            surface,
            streaming,
            status: "error",
            started,
            first: None,
            last: None,
            tokens: 0,
        }
    }

    /// Record an error of the request.
    pub(super) fn error(&self, e: &HttpError) {
        self.shared.metrics.error(&self.model, e.kind());
    }

    pub(super) fn tokens(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        if self.first.is_none() {
            self.first = Some(now);
            self.shared.metrics.ttft(&self.model, now - self.started);
        }
        self.last = Some(now);
        self.tokens += n;
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        let m = &self.shared.metrics;
        m.inflight(&self.model, -1);
        m.request(
            &self.model,
            self.surface.label(),
            self.streaming,
            self.status,
        );
        let itl = match (self.first, self.last) {
            (Some(f), Some(l)) if self.tokens > 1 => Some((l - f) / (self.tokens - 1)),
            _ => None,
        };
        m.finished(&self.model, self.started.elapsed(), itl, self.tokens);
    }
}

struct TokenRun {
    stream: TokenSource,
    processor: OutputProcessor,
    factory: ResponseFactory,
    surface: Surface,
    prompt_tokens: u32,
    include_usage: bool,
    first_chunk: bool,
    guard: Inflight,
}

/// One step of a token run.
enum Step {
    /// Text (possibly empty) and, at the end, the finish reason.
    Delta(String, Option<openai::OpenAiFinishReason>),
    /// Failed.
    Error(HttpError),
}

impl TokenRun {
    async fn step(&mut self) -> Step {
        loop {
            let item = match self.stream.next().await {
                Some(Ok(item)) => item,
                Some(Err(e)) => return Step::Error(e),
                None => match self.processor.end_of_stream() {
                    Ok(Some(out)) => {
                        return Step::Delta(out.text, Some(openai::OpenAiFinishReason::Stop));
                    }
                    Ok(None) => {
                        return Step::Delta(String::new(), Some(openai::OpenAiFinishReason::Stop));
                    }
                    Err(e) => return Step::Error(e.into()),
                },
            };
            let before = self.processor.completion_tokens();
            match self.processor.process(&item) {
                Ok(out) => {
                    self.guard.tokens(out.completion_tokens - before);
                    if let Some(reason) = &out.finish_reason {
                        if let crate::preprocessor::FinishReason::Error(msg) = reason {
                            return Step::Error(HttpError::internal(format!(
                                "engine error: {msg}"
                            )));
                        }
                        return Step::Delta(out.text, reason.to_openai());
                    }
                    if !out.text.is_empty() {
                        return Step::Delta(out.text, None);
                    }
                }
                Err(e) => return Step::Error(e.into()),
            }
        }
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.processor.completion_tokens())
    }

    fn chunk(&mut self, text: String, finish: Option<openai::OpenAiFinishReason>) -> Vec<u8> {
        let v = match self.surface {
            Surface::Chat => {
                let first = std::mem::replace(&mut self.first_chunk, false);
                serde_json::to_vec(&self.factory.chat_chunk(Some(text), first, finish))
            }
            Surface::Completions => {
                serde_json::to_vec(&self.factory.completion(text, finish, None))
            }
        };
        sse_data(&v.unwrap_or_default())
    }

    fn usage_chunk(&self) -> Vec<u8> {
        let usage = self.usage();
        let v = match self.surface {
            Surface::Chat => serde_json::to_vec(&self.factory.chat_usage_chunk(usage)),
            Surface::Completions => serde_json::to_vec(&self.factory.completion_usage_chunk(usage)),
        };
        sse_data(&v.unwrap_or_default())
    }

    async fn collect(mut self) -> Response {
        let mut text = String::new();
        loop {
            match self.step().await {
                Step::Delta(t, None) => text.push_str(&t),
                Step::Delta(t, Some(reason)) => {
                    text.push_str(&t);
                    self.guard.status = "success";
                    let usage = self.usage();
                    return match self.surface {
                        Surface::Chat => {
                            json_response(&self.factory.chat_response(text, Some(reason), usage))
                        }
                        Surface::Completions => {
                            json_response(&self.factory.completion(text, Some(reason), Some(usage)))
                        }
                    };
                }
                Step::Error(e) => {
                    self.guard.shared.metrics.error(&self.guard.model, e.kind());
                    return e.into_response();
                }
            }
        }
    }
}

pub(super) fn sse_data(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    out
}

pub(super) const DONE: &[u8] = b"data: [DONE]\n\n";

/// An SSE `error` event carrying `e`'s envelope.
pub(super) fn sse_error(e: &HttpError) -> Vec<u8> {
    let mut out = b"event: error\n".to_vec();
    out.extend_from_slice(&sse_data(e.body().to_string().as_bytes()));
    out
}

pub(super) fn sse_headers(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|e| HttpError::internal(e.to_string()).into_response())
}

fn sse_response(run: TokenRun) -> Response {
    // The body owns the run: a client that disconnects drops it, and with it the worker
    // stream, which stops the request on the worker.
    let stream = futures_util::stream::unfold(Some(run), |state| async move {
        let mut run = state?;
        let (bytes, next) = match run.step().await {
            Step::Delta(t, None) => (run.chunk(t, None), Some(run)),
            Step::Delta(t, Some(reason)) => {
                let mut out = run.chunk(t, Some(reason));
                if run.include_usage {
                    out.extend_from_slice(&run.usage_chunk());
                }
                out.extend_from_slice(DONE);
                run.guard.status = "success";
                (out, None)
            }
            Step::Error(e) => {
                run.guard.shared.metrics.error(&run.guard.model, e.kind());
                let mut out = b"event: error\n".to_vec();
                out.extend_from_slice(&sse_data(e.body().to_string().as_bytes()));
                (out, None)
            }
        };
        Some((Ok::<_, Infallible>(Bytes::from(bytes)), next))
    });
    sse_headers(Body::from_stream(stream))
}

/// `ModelInput::Text` models: forward the raw body; the worker streams OpenAI chunks.
#[expect(
    clippy::too_many_arguments,
    reason = "the request's parts, passed once"
)]
async fn text_request(
    shared: Arc<Shared>,
    entry: Arc<ModelEntry>,
    body: Bytes,
    surface: Surface,
    streaming: bool,
    factory: ResponseFactory,
    ctx: Context,
    started: Instant,
) -> Response {
    let model = entry.name.clone();
    let route = shared
        .selector
        .select(&entry, &entry.client, &RoutedRequest::Text(&body));
    let mut guard = Inflight::start(
        Arc::clone(&shared),
        model.clone(),
        surface,
        streaming,
        started,
    );
    let mut stream = match entry.client.generate(body, route, ctx, None).await {
        Ok(s) => s,
        Err(e) => {
            let e = route_error(&e);
            shared.metrics.error(&model, e.kind());
            return e.into_response();
        }
    };
    if streaming {
        let s = futures_util::stream::unfold(Some((stream, guard)), |state| async move {
            let (mut stream, mut guard) = state?;
            match stream.next().await {
                Some(Ok(item)) => match decode_item::<serde_json::Value>(&item) {
                    Ok(Some(v)) => {
                        guard.tokens(1);
                        let json = serde_json::to_vec(&v).unwrap_or_default();
                        Some((
                            Ok::<_, Infallible>(Bytes::from(sse_data(&json))),
                            Some((stream, guard)),
                        ))
                    }
                    Ok(None) => Some((Ok(Bytes::new()), Some((stream, guard)))),
                    Err(e) => {
                        let mut out = b"event: error\n".to_vec();
                        out.extend_from_slice(&sse_data(e.body().to_string().as_bytes()));
                        Some((Ok(Bytes::from(out)), None))
                    }
                },
                None => {
                    guard.status = "success";
                    Some((Ok(Bytes::from_static(DONE)), None))
                }
                Some(Err(e)) => {
                    let e = HttpError::internal(format!("stream ended with an error: {e}"));
                    let mut out = b"event: error\n".to_vec();
                    out.extend_from_slice(&sse_data(e.body().to_string().as_bytes()));
                    Some((Ok(Bytes::from(out)), None))
                }
            }
        });
        return sse_headers(Body::from_stream(s));
    }
    // Fold the chunks into one response.
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    while let Some(item) = stream.next().await {
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                return HttpError::internal(format!("stream ended with an error: {e}"))
                    .into_response();
            }
        };
        let v = match decode_item::<serde_json::Value>(&item) {
            Ok(Some(v)) => v,
            Ok(None) => continue,
            Err(e) => return e.into_response(),
        };
        guard.tokens(1);
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = serde_json::from_value::<Usage>(u.clone()).ok();
        }
        if let Some(c) = v.get("choices").and_then(|c| c.get(0)) {
            let piece = match surface {
                Surface::Chat => c
                    .get("delta")
                    .or_else(|| c.get("message"))
                    .and_then(|d| d.get("content")),
                Surface::Completions => c.get("text"),
            };
            if let Some(s) = piece.and_then(serde_json::Value::as_str) {
                text.push_str(s);
            }
            if let Some(f) = c.get("finish_reason").filter(|f| !f.is_null()) {
                finish = serde_json::from_value(f.clone()).ok();
            }
        }
    }
    guard.status = "success";
    let usage = usage.unwrap_or_default();
    match surface {
        Surface::Chat => json_response(&factory.chat_response(text, finish, usage)),
        Surface::Completions => json_response(&factory.completion(text, finish, Some(usage))),
    }
}

pub(super) async fn list_models(State(shared): State<Arc<Shared>>) -> Response {
    // Static models first; a discovered model of the same name is shadowed by them.
    let mut models = shared.statics.names();
    for m in shared.models.list() {
        models.entry(m.name.clone()).or_insert(m.created);
    }
    let data: Vec<serde_json::Value> = models
        .iter()
        .map(|(name, created)| {
            serde_json::json!({
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "nvidia",
            })
        })
        .collect();
    json_response(&serde_json::json!({"object": "list", "data": data}))
}

pub(super) async fn health(State(shared): State<Arc<Shared>>) -> Response {
    let models = shared.models.list();
    let instances: Vec<serde_json::Value> = models
        .iter()
        .map(|m| serde_json::json!({"model": m.name, "endpoint": m.endpoint.to_string(), "instances": m.client.instance_ids()}))
        .collect();
    json_response(&serde_json::json!({"status": "healthy", "models": instances}))
}

pub(super) async fn live() -> Response {
    json_response(&serde_json::json!({"status": "live"}))
}

pub(super) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(),
    )
        .into_response()
}

/// Unknown routes: 404 with code `not_found` (OpenAI's wording), not a model error.
pub(super) async fn not_found(method: Method, uri: Uri) -> Response {
    HttpError::new(404, format!("Invalid URL ({method} {}).", uri.path())).into_response()
}
