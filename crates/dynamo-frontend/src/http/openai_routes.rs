//! The route handlers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use dynamo_llm::discovery::ModelEntry;
use dynamo_llm::preprocessor::OutputProcessor;
use dynamo_llm::preprocessor::openai::{self, ResponseFactory, Usage};
use dynamo_parsers::{ChatParser, ParseEvent, ParserNames, RequestTools};
use dynamo_runtime::Context;

use super::Shared;
use super::engine::{RoutedRequest, WorkerStream, decode_item, route_error};
use super::error::HttpError;
use super::respond::{
    DONE, Inflight, Surface, fail, json_response, sse_data, sse_error, sse_headers,
};
use super::static_engine::{self, StaticTarget, TokenSource};

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

/// A chat request whose JSON body is already in memory (the realtime session's responses).
pub(super) async fn chat_completions_bytes(shared: Arc<Shared>, body: Bytes) -> Response {
    handle(shared, Ok(body), Surface::Chat).await
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
    // (Sized up front: `format!` grew the string, an allocation more per request.)
    let mut response_id = String::with_capacity(id_prefix.len() + 1 + ctx.id().len());
    response_id.push_str(id_prefix);
    response_id.push('-');
    response_id.push_str(ctx.id());
    let factory = ResponseFactory::new(response_id, model.clone());
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
        // Image parts are fetched and decoded first (models that enable images only).
        Parsed::Chat(r) if pre.accepts_images() => (
            match pre.load_media(r).await {
                Ok(images) => pre.preprocess_chat_with_media(r, images),
                Err(e) => Err(e),
            },
            r.include_usage(),
        ),
        Parsed::Chat(r) => (pre.preprocess_chat(r), r.include_usage()),
        Parsed::Completion(r) => (pre.preprocess_completion(r), r.include_usage()),
    };
    let mut preq = match preq {
        Ok(p) => p,
        Err(e) => return fail(&shared, &model, surface, streaming, e.into()),
    };
    // The model's tool-call and reasoning parsers (its card's, else the frontend's).
    let parser = match &parsed {
        Parsed::Chat(r) => {
            let card = match &target {
                Ok(entry) => &entry.card,
                Err(local) => &local.card,
            };
            let names = ParserNames {
                tool_call_parser: card.runtime_config.tool_call_parser.clone(),
                reasoning_parser: card.runtime_config.reasoning_parser.clone(),
            }
            .or(&shared.parsers);
            let parser = ChatParser::for_request(
                names.tool_call_parser.as_deref(),
                names.reasoning_parser.as_deref(),
                &RequestTools {
                    tools: r.tools.as_deref(),
                    tool_choice: r.tool_choice.as_ref(),
                    parallel_tool_calls: r.parallel_tool_calls,
                },
            );
            // Formats whose markers are special tokens need them in the text, unless the
            // client chose otherwise.
            if parser.is_some()
                && r.skip_special_tokens.is_none()
                && dynamo_parsers::needs_special_tokens(
                    names.tool_call_parser.as_deref(),
                    names.reasoning_parser.as_deref(),
                )
            {
                preq.output_options.skip_special_tokens = Some(false);
            }
            parser
        }
        Parsed::Completion(_) => None,
    };
    let prompt_tokens = u32::try_from(preq.token_ids.len()).unwrap_or(u32::MAX);
    let mut guard = Inflight::start(
        Arc::clone(&shared),
        model.clone(),
        surface,
        streaming,
        started,
    );
    // `n` choices are `n` independent generations of the same prompt, each its own
    // request (and its own KV booking) to a worker; validation bounds `n`.
    let n = preq.sampling_options.n.unwrap_or(1).max(1);
    let mut choices = Vec::with_capacity(n as usize);
    // The last choice (the only one, usually) takes the request itself.
    let mut requests = Vec::with_capacity(n as usize);
    requests.extend(std::iter::repeat_n(&preq, n as usize - 1).cloned());
    requests.push(preq);
    for (index, mut one) in (0..n).zip(requests) {
        let ctx = if n == 1 {
            ctx.clone()
        } else {
            one.sampling_options.n = Some(1);
            // A seeded request stays reproducible, but its choices must not all be the
            // same sample.
            one.sampling_options.seed = one
                .sampling_options
                .seed
                .map(|seed| seed.wrapping_add(i64::from(index)));
            // Distinct ids: each choice is a request of its own on the request plane.
            // Detached is enough: what stops a request here is its response being
            // dropped, which drops (and so stops) every choice.
            ctx.detached(format!("{}-{index}", ctx.id()))
        };
        let processor = pre.output_processor(&one);
        let opened = match &target {
            Ok(entry) => WorkerStream::open(
                Arc::clone(entry),
                Arc::clone(&shared.selector),
                Arc::clone(&shared.metrics),
                one,
                ctx,
                shared.migration_limit,
            )
            .await
            .map(TokenSource::Worker),
            Err(local) => static_engine::open_local(local, one, ctx).await,
        };
        match opened {
            Ok(stream) => choices.push(ChoiceRun {
                index,
                stream,
                processor,
                engine_cached: None,
                parser: parser.clone(),
            }),
            Err(e) => {
                // Dropping the choices already opened stops them on their workers.
                guard.error(&e);
                drop(guard);
                return e.into_response();
            }
        }
    }
    let run = TokenRun {
        choices,
        factory,
        surface,
        prompt_tokens,
        include_usage,
        guard,
    };
    if streaming {
        sse_response(run)
    } else {
        run.collect().await
    }
}

/// One choice of a token request: its worker stream and its detokenizer.
struct ChoiceRun {
    index: u32,
    stream: TokenSource,
    processor: OutputProcessor,
    /// Prompt tokens the engine reported as served from its prefix cache.
    engine_cached: Option<u32>,
    /// The output's tool-call / reasoning parsers (chat only; `None`: plain text).
    parser: Option<ChatParser>,
}

/// New output of a choice: plain text, or what its parsers made of it.
enum Piece {
    Text(String),
    Parsed(Vec<ParseEvent>),
}

/// One step of a choice.
enum Step {
    /// Output (possibly empty), the finish reason at the end, and how many completion
    /// tokens arrived with it.
    Delta(Piece, Option<openai::OpenAiFinishReason>, u32),
    /// Failed.
    Error(HttpError),
}

/// A step of one choice, as the merged stream of all choices yields it.
struct Event {
    index: u32,
    step: Step,
    /// The choice's completion tokens so far.
    completion_tokens: u32,
    /// The choice's cached prompt tokens, when known.
    cached_tokens: Option<u32>,
}

/// `prompt_tokens_details.cached_tokens` reported by an engine in an item's usage.
fn engine_cached_tokens(item: &dynamo_llm::preprocessor::LLMEngineOutput) -> Option<u32> {
    let c = item
        .completion_usage
        .as_ref()?
        .get("prompt_tokens_details")?
        .get("cached_tokens")?
        .as_u64()?;
    Some(u32::try_from(c).unwrap_or(u32::MAX))
}

impl ChoiceRun {
    async fn step(&mut self) -> Step {
        let mut tokens = 0;
        loop {
            let item = match self.stream.next().await {
                Some(Ok(item)) => item,
                Some(Err(e)) => return Step::Error(e),
                None => match self.processor.end_of_stream() {
                    Ok(Some(out)) => {
                        let finish = Some(openai::OpenAiFinishReason::Stop);
                        return self.delta(out.text, finish, tokens);
                    }
                    Ok(None) => {
                        let finish = Some(openai::OpenAiFinishReason::Stop);
                        return self.delta(String::new(), finish, tokens);
                    }
                    Err(e) => return Step::Error(e.into()),
                },
            };
            if let Some(c) = engine_cached_tokens(&item) {
                self.engine_cached = Some(c);
            }
            let before = self.processor.completion_tokens();
            match self.processor.process(&item) {
                Ok(out) => {
                    tokens += out.completion_tokens - before;
                    if let Some(reason) = &out.finish_reason {
                        if let dynamo_llm::preprocessor::FinishReason::Error(msg) = reason {
                            return Step::Error(HttpError::internal(format!(
                                "engine error: {msg}"
                            )));
                        }
                        return self.delta(out.text, reason.to_openai(), tokens);
                    }
                    if !out.text.is_empty() {
                        match self.delta(out.text, None, tokens) {
                            // Everything was held back by the parser: wait for more.
                            Step::Delta(Piece::Parsed(events), None, _) if events.is_empty() => {}
                            step => return step,
                        }
                    }
                }
                Err(e) => return Step::Error(e.into()),
            }
        }
    }

    /// A step carrying `text`, through the parsers when there are some; at the end
    /// (`finish` set) the parsers release what they held, and a natural end after tool
    /// calls becomes `tool_calls`.
    fn delta(
        &mut self,
        text: String,
        finish: Option<openai::OpenAiFinishReason>,
        tokens: u32,
    ) -> Step {
        let Some(parser) = self.parser.as_mut() else {
            return Step::Delta(Piece::Text(text), finish, tokens);
        };
        let mut events = Vec::new();
        parser.feed(&text, &mut events);
        let finish = match finish {
            Some(reason) => {
                parser.finish(&mut events);
                Some(match reason {
                    openai::OpenAiFinishReason::Stop if parser.finished_with_calls() => {
                        openai::OpenAiFinishReason::ToolCalls
                    }
                    other => other,
                })
            }
            None => None,
        };
        Step::Delta(Piece::Parsed(events), finish, tokens)
    }

    /// Cached prompt tokens: the engine's own count when it reports one (it knows what it
    /// actually reused), else the KV router's overlap estimate for the chosen worker.
    fn cached_tokens(&self) -> Option<u32> {
        let router = match &self.stream {
            TokenSource::Worker(w) => w.router_cached_tokens(),
            TokenSource::Local(_) => None,
        };
        self.engine_cached.or(router)
    }

    /// The choice's steps as a stream, ending after its last step (finish or error).
    fn into_events(self) -> futures_util::stream::BoxStream<'static, Event> {
        use futures_util::StreamExt as _;
        // Boxed: the state moves in and out of each step's future.
        futures_util::stream::unfold(Some(Box::new(self)), |state| async move {
            let mut choice = state?;
            let step = choice.step().await;
            let last = matches!(step, Step::Delta(_, Some(_), _) | Step::Error(_));
            let event = Event {
                index: choice.index,
                step,
                completion_tokens: choice.processor.completion_tokens(),
                cached_tokens: choice.cached_tokens(),
            };
            Some((event, (!last).then_some(choice)))
        })
        .boxed()
    }
}

/// A token request's choices and what the response needs about them.
struct TokenRun {
    choices: Vec<ChoiceRun>,
    factory: ResponseFactory,
    surface: Surface,
    prompt_tokens: u32,
    include_usage: bool,
    guard: Inflight,
}

/// The choices' events as one stream. One choice (the usual case) is polled directly:
/// `SelectAll` would allocate a task node for it again after every item.
enum Events {
    One(futures_util::stream::Fuse<futures_util::stream::BoxStream<'static, Event>>),
    Many(futures_util::stream::SelectAll<futures_util::stream::BoxStream<'static, Event>>),
}

impl Events {
    fn new(mut choices: Vec<ChoiceRun>) -> Self {
        use futures_util::StreamExt as _;
        if choices.len() == 1
            && let Some(one) = choices.pop()
        {
            return Self::One(one.into_events().fuse());
        }
        Self::Many(futures_util::stream::select_all(
            choices.into_iter().map(ChoiceRun::into_events),
        ))
    }
}

impl futures_util::Stream for Events {
    type Item = Event;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Event>> {
        use futures_util::StreamExt as _;
        match self.get_mut() {
            Self::One(s) => s.poll_next_unpin(cx),
            Self::Many(s) => s.poll_next_unpin(cx),
        }
    }
}

/// The merged progress of a token request's choices.
struct Merged {
    events: Events,
    factory: ResponseFactory,
    surface: Surface,
    prompt_tokens: u32,
    include_usage: bool,
    guard: Inflight,
    /// Per choice: completion tokens, whether its first chunk went out, tool calls sent.
    completion: Vec<u32>,
    first_sent: Vec<bool>,
    calls: Vec<u32>,
    /// The largest cached-prompt count any choice reported.
    cached: Option<u32>,
    /// Choices not finished yet.
    open: usize,
    /// The response's plain-text chunks, written straight into the frame.
    writer: openai::SseChunkWriter,
}

impl TokenRun {
    fn merge(self) -> Merged {
        let n = self.choices.len();
        let writer = match self.surface {
            Surface::Chat => openai::SseChunkWriter::chat(&self.factory),
            Surface::Completions => openai::SseChunkWriter::completion(&self.factory),
        };
        Merged {
            events: Events::new(self.choices),
            factory: self.factory,
            surface: self.surface,
            prompt_tokens: self.prompt_tokens,
            include_usage: self.include_usage,
            guard: self.guard,
            completion: vec![0; n],
            first_sent: vec![false; n],
            calls: vec![0; n],
            cached: None,
            open: n,
            writer,
        }
    }

    async fn collect(self) -> Response {
        use futures_util::StreamExt as _;
        let mut m = self.merge();
        let mut texts: Vec<(String, Option<openai::OpenAiFinishReason>)> =
            vec![(String::new(), None); m.completion.len()];
        let mut parsed: Vec<Option<ParsedMessage>> = vec![None; m.completion.len()];
        while let Some(event) = m.events.next().await {
            let index = event.index as usize;
            match m.note(event) {
                Step::Delta(piece, finish, _) => {
                    if let Some(slot) = texts.get_mut(index) {
                        match piece {
                            Piece::Text(t) => slot.0.push_str(&t),
                            Piece::Parsed(events) => {
                                let mut p = parsed
                                    .get_mut(index)
                                    .map(|p| p.get_or_insert_with(ParsedMessage::default));
                                for e in events {
                                    match e {
                                        ParseEvent::Content(t) => slot.0.push_str(&t),
                                        ParseEvent::Reasoning(t) => {
                                            if let Some(p) = p.as_deref_mut() {
                                                p.reasoning.push_str(&t);
                                            }
                                        }
                                        ParseEvent::CallStart { name, id } => {
                                            if let Some(p) = p.as_deref_mut() {
                                                p.calls.push(tool_call(name, id));
                                            }
                                        }
                                        ParseEvent::CallArgs(a) => {
                                            if let Some(c) =
                                                p.as_deref_mut().and_then(|p| p.calls.last_mut())
                                            {
                                                c.function.arguments.push_str(&a);
                                            }
                                        }
                                    }
                                }
                            }
                        }
                        if finish.is_some() {
                            slot.1 = finish;
                        }
                    }
                    if m.open == 0 {
                        m.guard.status = "success";
                        let usage = m.usage();
                        return match m.surface {
                            Surface::Chat => {
                                let mut r = m.factory.chat_response_choices(texts, usage);
                                for (choice, p) in r.choices.iter_mut().zip(parsed) {
                                    if let Some(p) = p {
                                        p.apply(&mut choice.message);
                                    }
                                }
                                json_response(&r)
                            }
                            Surface::Completions => {
                                json_response(&m.factory.completion_choices(texts, Some(usage)))
                            }
                        };
                    }
                }
                Step::Error(e) => {
                    m.guard.error(&e);
                    return e.into_response();
                }
            }
        }
        let e = HttpError::internal("the response ended early");
        m.guard.error(&e);
        e.into_response()
    }
}

/// What a choice's parsers found, beside its content.
#[derive(Debug, Clone, Default)]
struct ParsedMessage {
    reasoning: String,
    calls: Vec<openai::ToolCall>,
}

impl ParsedMessage {
    /// Fill a response message: `reasoning_content` and `tool_calls` when there are some;
    /// with tool calls, content that is only blank is `null` (as OpenAI's); beside
    /// reasoning, empty content is `null` (the output was all reasoning, as vLLM answers).
    fn apply(self, message: &mut openai::ResponseMessage) {
        if !self.reasoning.is_empty() {
            message.reasoning_content = Some(self.reasoning);
            if message.content.as_deref() == Some("") {
                message.content = None;
            }
        }
        if !self.calls.is_empty() {
            if message
                .content
                .as_deref()
                .is_some_and(|c| c.trim().is_empty())
            {
                message.content = None;
            }
            message.tool_calls = Some(self.calls);
        }
    }
}

/// A parsed call's start as OpenAI's tool call (a fresh `call_…` id unless the model
/// wrote one); its arguments follow.
fn tool_call(name: String, id: Option<String>) -> openai::ToolCall {
    openai::ToolCall {
        id: id.unwrap_or_else(dynamo_parsers::new_call_id),
        kind: "function".to_owned(),
        function: openai::FunctionCall {
            name,
            arguments: String::new(),
        },
    }
}

impl Merged {
    /// Book an event's counts; answers its step.
    fn note(&mut self, event: Event) -> Step {
        if let Step::Delta(_, _, tokens) = &event.step {
            self.guard.tokens(*tokens);
        }
        if let Some(c) = self.completion.get_mut(event.index as usize) {
            *c = event.completion_tokens;
        }
        if let Some(c) = event.cached_tokens {
            self.cached = Some(self.cached.map_or(c, |old| old.max(c)));
        }
        if let Step::Delta(_, Some(_), _) = &event.step {
            self.open = self.open.saturating_sub(1);
        }
        event.step
    }

    /// Prompt tokens once, completion tokens summed over the choices.
    fn usage(&self) -> Usage {
        let completion = self
            .completion
            .iter()
            .fold(0u32, |sum, c| sum.saturating_add(*c));
        Usage::new(self.prompt_tokens, completion).with_cached(self.cached)
    }

    /// The SSE chunks of one step: one per parsed event (a tool call's start carries its
    /// name, each arguments piece one chunk), the finish reason on the last.
    fn chunks(
        &mut self,
        index: u32,
        piece: Piece,
        finish: Option<openai::OpenAiFinishReason>,
        out: &mut BytesMut,
    ) {
        let events = match piece {
            Piece::Text(text) => return self.chunk(index, &text, finish, out),
            Piece::Parsed(events) => events,
        };
        let mut deltas = Vec::with_capacity(events.len() + 1);
        for e in events {
            match e {
                ParseEvent::Content(t) => deltas.push(openai::ChatDelta {
                    content: Some(t),
                    ..Default::default()
                }),
                ParseEvent::Reasoning(t) => deltas.push(openai::ChatDelta {
                    reasoning_content: Some(t),
                    ..Default::default()
                }),
                ParseEvent::CallStart { name, id } => {
                    let slot = self.calls.get_mut(index as usize);
                    let call_index = slot.as_ref().map_or(0, |n| **n);
                    if let Some(n) = slot {
                        *n += 1;
                    }
                    let call = tool_call(name, id);
                    deltas.push(openai::ChatDelta {
                        tool_calls: Some(vec![openai::ToolCallDelta {
                            index: call_index,
                            id: Some(call.id),
                            kind: Some(call.kind),
                            function: openai::FunctionCallDelta {
                                name: Some(call.function.name),
                                arguments: Some(String::new()),
                            },
                        }]),
                        ..Default::default()
                    });
                }
                ParseEvent::CallArgs(a) => {
                    // A piece of the arguments of the call last started.
                    let call_index = self
                        .calls
                        .get(index as usize)
                        .map_or(0, |n| n.saturating_sub(1));
                    deltas.push(openai::ChatDelta {
                        tool_calls: Some(vec![openai::ToolCallDelta {
                            index: call_index,
                            id: None,
                            kind: None,
                            function: openai::FunctionCallDelta {
                                name: None,
                                arguments: Some(a),
                            },
                        }]),
                        ..Default::default()
                    });
                }
            }
        }
        if deltas.is_empty() && finish.is_none() {
            return;
        }
        if deltas.is_empty() {
            deltas.push(openai::ChatDelta::default());
        }
        let last = deltas.len() - 1;
        for (i, mut delta) in deltas.into_iter().enumerate() {
            if let Some(sent) = self.first_sent.get_mut(index as usize)
                && !std::mem::replace(sent, true)
            {
                delta.role = Some(openai::Role::Assistant);
            }
            let chunk =
                self.factory
                    .chat_delta_chunk(index, delta, if i == last { finish } else { None });
            out.extend_from_slice(&sse_data(&serde_json::to_vec(&chunk).unwrap_or_default()));
        }
    }

    fn chunk(
        &mut self,
        index: u32,
        text: &str,
        finish: Option<openai::OpenAiFinishReason>,
        out: &mut BytesMut,
    ) {
        let first = self.surface == Surface::Chat
            && self
                .first_sent
                .get_mut(index as usize)
                .is_some_and(|sent| !std::mem::replace(sent, true));
        self.writer.write(out, index, text, first, finish);
    }

    fn usage_chunk(&self) -> Vec<u8> {
        let usage = self.usage();
        let v = match self.surface {
            Surface::Chat => serde_json::to_vec(&self.factory.chat_usage_chunk(usage)),
            Surface::Completions => serde_json::to_vec(&self.factory.completion_usage_chunk(usage)),
        };
        sse_data(&v.unwrap_or_default())
    }
}

/// The SSE frame buffer of a streamed response: room for a response of 16 tokens or so.
const FRAME_BUFFER: usize = 4096;
/// Free room a frame starts with (a chunk is about 200 bytes; more grows the buffer).
const FRAME_ROOM: usize = 1024;

fn sse_response(run: TokenRun) -> Response {
    use futures_util::{FutureExt as _, StreamExt as _};
    // The body owns the run: a client that disconnects drops it, and with it the worker
    // streams, which stops the request on the workers.
    // Boxed: the state moves in and out of each frame's future.
    // One buffer for the response's frames, each split off it: a frame is a slice of the
    // buffer, and once the connection has written and dropped the earlier frames (before
    // the next token, as a rule) `reserve` takes the same allocation back. A fresh buffer
    // or a copy per frame were among the frontend's most frequent allocations, and the
    // larger ones (over 1 KiB) make glibc consolidate its free lists.
    let state = (Box::new(run.merge()), BytesMut::with_capacity(FRAME_BUFFER));
    let stream = futures_util::stream::unfold(Some(state), |state| async move {
        let (mut m, mut out) = state?;
        out.reserve(FRAME_ROOM);
        let first = m.events.next().await;
        let mut going = m.emit(first, &mut out);
        // Events already waiting go into the same body frame: one HTTP chunk and one socket
        // write for several tokens when the workers are ahead of this task (under load),
        // instead of one each. Nothing waits for more: a pending stream ends the frame.
        while going {
            match m.events.next().now_or_never() {
                Some(event) => going = m.emit(event, &mut out),
                None => break,
            }
        }
        let frame = out.split().freeze();
        Some((Ok::<_, Infallible>(frame), going.then_some((m, out))))
    });
    sse_headers(Body::from_stream(stream))
}

impl Merged {
    /// Appends the SSE bytes for one event of the merged choice streams (`None`: they all
    /// ended) and says whether the response goes on.
    fn emit(&mut self, event: Option<Event>, out: &mut BytesMut) -> bool {
        let Some(event) = event else {
            let e = HttpError::internal("the response ended early");
            self.guard.error(&e);
            out.extend_from_slice(&sse_error(&e));
            return false;
        };
        let index = event.index;
        match self.note(event) {
            Step::Delta(t, None, _) => {
                self.chunks(index, t, None, out);
                true
            }
            Step::Delta(t, Some(reason), _) => {
                self.chunks(index, t, Some(reason), out);
                if self.open > 0 {
                    return true;
                }
                if self.include_usage {
                    out.extend_from_slice(&self.usage_chunk());
                }
                out.extend_from_slice(DONE);
                self.guard.status = "success";
                false
            }
            Step::Error(e) => {
                self.guard.error(&e);
                out.extend_from_slice(&sse_error(&e));
                false
            }
        }
    }
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
    let route = match entry.restrict_route(route, &[]) {
        Ok(r) => r,
        Err(m) => {
            let e = HttpError::unavailable(m);
            shared.metrics.error(&model, e.kind());
            return e.into_response();
        }
    };
    let mut guard = Inflight::start(
        Arc::clone(&shared),
        model.clone(),
        surface,
        streaming,
        started,
    );
    let body = match super::engine::json_body_to_wire(&body) {
        Ok(b) => b,
        Err(e) => {
            guard.error(&e);
            return e.into_response();
        }
    };
    let mut stream = match entry.client.generate(body, route, ctx, None).await {
        Ok(s) => s,
        Err(e) => {
            let e = route_error(&e);
            guard.error(&e);
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
                        guard.error(&e);
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
                    guard.error(&e);
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
                let e = HttpError::internal(format!("stream ended with an error: {e}"));
                guard.error(&e);
                return e.into_response();
            }
        };
        let v = match decode_item::<serde_json::Value>(&item) {
            Ok(Some(v)) => v,
            Ok(None) => continue,
            Err(e) => {
                guard.error(&e);
                return e.into_response();
            }
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
    let mut parents = std::collections::HashMap::new();
    for m in shared.models.list() {
        if !models.contains_key(&m.name)
            && let Some(p) = m.parent()
        {
            parents.insert(m.name.clone(), p);
        }
        models.entry(m.name.clone()).or_insert(m.created);
    }
    let data: Vec<serde_json::Value> = models
        .iter()
        .map(|(name, created)| {
            let mut entry = serde_json::json!({
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "nvidia",
            });
            // A LoRA adapter names the base model it runs on (vLLM's field).
            if let Some(p) = parents.get(name) {
                entry["parent"] = p.clone().into();
            }
            entry
        })
        .collect();
    json_response(&serde_json::json!({"object": "list", "data": data}))
}

/// The reference's body: `status`, `endpoints` (`dyn://ns.comp.ep` of every endpoint with
/// a live instance in discovery) and `instances` (their discovery records:
/// `namespace`, `component`, `endpoint`, `instance_id`, `transport`, ...); `models` (each
/// served model's endpoint and instance ids) is ours.
pub(super) async fn health(State(shared): State<Arc<Shared>>) -> Response {
    let models: Vec<serde_json::Value> = shared
        .models
        .list()
        .iter()
        .map(|m| serde_json::json!({"model": m.name, "endpoint": m.endpoint.to_string(), "instances": m.serving_instances()}))
        .collect();
    let instances = match &shared.runtime {
        Some(rt) => match rt.all_instances().await {
            Ok(all) => all,
            Err(e) => {
                let body = serde_json::json!({"status": "unhealthy", "message": format!("discovery failed: {e}")});
                let mut response = json_response(&body);
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                return response;
            }
        },
        None => Vec::new(),
    };
    let mut endpoints: Vec<String> = instances
        .iter()
        .map(|i| format!("dyn://{}.{}.{}", i.namespace, i.component, i.endpoint))
        .collect();
    endpoints.dedup();
    json_response(&serde_json::json!({
        "status": "healthy",
        "endpoints": endpoints,
        "instances": instances,
        "models": models,
    }))
}

pub(super) async fn live() -> Response {
    json_response(&serde_json::json!({"status": "live", "message": "Service is live"}))
}

pub(super) async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render() + &shared.selector.metrics_text(),
    )
        .into_response()
}

/// Unknown routes: 404 with code `not_found` (OpenAI's wording), not a model error.
pub(super) async fn not_found(method: Method, uri: Uri) -> Response {
    HttpError::new(404, format!("Invalid URL ({method} {}).", uri.path())).into_response()
}

/// 405 for a known path asked with another method: the error object (axum adds `Allow`,
/// listing the methods the path takes).
pub(super) async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    HttpError::new(
        405,
        format!(
            "Method {method} is not allowed for {} (the Allow header lists the methods it takes).",
            uri.path()
        ),
    )
    .into_response()
}
