//! From a routed request to a stream of worker items: worker selection, the request plane
//! call, and migration.
//!
//! [`WorkerSelector`] is the routing hook: round-robin and random are plain client routes;
//! the KV-aware selector ([`super::kv_selector`]) answers [`Route::Direct`] with the worker
//! of the best prefix overlap weighed against load, and books the request's load there
//! ([`RequestBooking`]) for as long as the attempt runs.
//!
//! [`WorkerStream`] hides migration: when a stream breaks with a migratable error
//! (connection lost, worker gone, `EngineShutdown`) and migrations are left, it re-sends
//! the request to another worker with the tokens generated so far appended to the prompt
//! and `max_tokens` reduced ([`PreprocessedRequest::continued`]), so its caller sees one
//! stream. `Cancelled` and any error after the client went away never migrate.
//!
//! Retries before output: an attempt that fails before the request produced anything
//! (the worker could not be reached, dropped the connection, or was not accepting) is
//! re-sent to another worker whatever the migration limit, up to [`MAX_UNSENT_RETRIES`]
//! times: nothing was produced, so nothing can be duplicated. The failed worker is also
//! marked down for every router of the runtime (see [`dynamo_runtime::router`]).
//!
//! Bookings: each attempt's booking lives in the [`WorkerStream`] and sees every worker
//! item; it is dropped (releasing the load) when the stream ends, fails, migrates (before
//! the next attempt books) or is dropped because the client went away.

use std::sync::Arc;

use bytes::Bytes;
use dynamo_llm::discovery::ModelEntry;
use dynamo_llm::engines::Annotated;
use dynamo_llm::preprocessor::{LLMEngineOutput, PreprocessedRequest};
use dynamo_runtime::transport::ErrorKind;
use dynamo_runtime::transport::client::ResponseStream;
use dynamo_runtime::{Client, Context, Route};
use futures_util::future::BoxFuture;

use super::error::HttpError;
use super::metrics::{Metrics, MigrationType};

/// Retries of a request that failed before producing anything, on other workers, not
/// counted as migrations. Bounds the cost of a burst of dead workers (each failed attempt
/// costs a refused connection, or at worst the connect timeout).
pub const MAX_UNSENT_RETRIES: u32 = 3;

/// How the frontend picks a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouterMode {
    /// Next instance in turn.
    #[default]
    RoundRobin,
    /// A random instance.
    Random,
    /// KV-cache aware: needs a [`WorkerSelector`] from the KV router; without one the
    /// frontend falls back to round-robin.
    Kv,
}

impl RouterMode {
    /// Parse `round-robin` / `round_robin` / `random` / `kv`.
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "round-robin" | "roundrobin" => Ok(Self::RoundRobin),
            "random" => Ok(Self::Random),
            "kv" => Ok(Self::Kv),
            other => Err(format!(
                "unknown router mode {other:?}: expected round-robin, random or kv"
            )),
        }
    }
}

/// Chooses the worker of one request: the routing hook of the frontend.
pub trait WorkerSelector: Send + Sync + 'static {
    /// The route of `request` to `model`'s workers (`client` lists the live instances).
    fn select(&self, model: &ModelEntry, client: &Client, request: &RoutedRequest<'_>) -> Route;

    /// Choose the worker of one attempt of a request and book the attempt's load there.
    /// `attempt_id` is unique per attempt (a migrated request books again under a new
    /// one); `avoid` lists the instances this request already failed on. The default
    /// books nothing and answers [`Self::select`].
    ///
    /// # Errors
    /// An [`HttpError`] for the client: 503 when no worker exists, 529 when every worker
    /// is over the busy thresholds.
    fn book<'a>(
        &'a self,
        model: &'a ModelEntry,
        request: RoutedRequest<'a>,
        attempt_id: &'a str,
        avoid: &'a [u64],
    ) -> BoxFuture<'a, Result<Selected, HttpError>> {
        let _ = (attempt_id, avoid);
        Box::pin(async move {
            Ok(Selected {
                route: self.select(model, &model.client, &request),
                booking: None,
                cached_tokens: None,
            })
        })
    }

    /// Prometheus text this selector adds to the frontend's `/metrics` (the KV router's
    /// event ingestion and lag families); empty by default.
    fn metrics_text(&self) -> String {
        String::new()
    }
}

/// A request's hold on a worker's capacity, booked by a load-aware selector. The frontend
/// reports each worker item to it and drops it when the attempt ends, however it ends;
/// dropping releases the load.
pub trait RequestBooking: Send + 'static {
    /// A worker item carrying `tokens` output tokens arrived.
    fn on_output(&mut self, tokens: usize);
}

impl RequestBooking for dynamo_llm::kv_routing::Booking {
    fn on_output(&mut self, tokens: usize) {
        dynamo_llm::kv_routing::Booking::on_output(self, tokens);
    }
}

/// A selector's answer for one attempt.
pub struct Selected {
    /// Where to send it.
    pub route: Route,
    /// Its booking, if the selector books load.
    pub booking: Option<Box<dyn RequestBooking>>,
    /// Prompt tokens the selector expects the chosen worker to hold in its KV cache (the
    /// KV router's prefix overlap × block size); `None` when the selector does not know.
    pub cached_tokens: Option<u32>,
}

/// What a selector may look at.
#[derive(Clone, Copy)]
pub enum RoutedRequest<'a> {
    /// A preprocessed (`ModelInput::Tokens`) request.
    Tokens(&'a PreprocessedRequest),
    /// A raw OpenAI request body (`ModelInput::Text`).
    Text(&'a [u8]),
}

/// Round-robin or random over live instances.
pub struct SimpleSelector(pub Route);

impl WorkerSelector for SimpleSelector {
    fn select(&self, _: &ModelEntry, _: &Client, _: &RoutedRequest<'_>) -> Route {
        self.0
    }
}

/// Decode one envelope: `Ok(None)` for pure annotations, an error for error events.
pub(crate) fn decode_item<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<Option<T>, HttpError> {
    let a: Annotated<T> = dynamo_runtime::transport::codec::decode(bytes)
        .map_err(|e| HttpError::internal(format!("malformed worker output: {e}")))?;
    if a.event.as_deref() == Some("error") {
        let msg = a
            .comment
            .map_or_else(|| "error".to_owned(), |c| c.join("; "));
        return Err(HttpError::internal(format!("engine error: {msg}")));
    }
    Ok(a.data)
}

/// Re-encode an HTTP JSON body for the request plane (whose payloads are MessagePack):
/// text-input workers receive the OpenAI request as a map.
pub(crate) fn json_body_to_wire(body: &[u8]) -> Result<Bytes, HttpError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| HttpError::bad_request(format!("invalid JSON body: {e}"), None))?;
    dynamo_runtime::transport::codec::encode(&value)
        .map(Bytes::from)
        .map_err(|e| HttpError::internal(format!("cannot encode the request: {e}")))
}

/// Map a request-plane error to the client's HTTP error.
pub(crate) fn route_error(e: &dynamo_runtime::Error) -> HttpError {
    use dynamo_runtime::Error as E;
    match e {
        E::NoInstances(_) | E::UnknownInstance { .. } => {
            HttpError::unavailable(format!("no workers available: {e}"))
        }
        E::Remote(w) if w.kind == ErrorKind::InvalidArgument => {
            HttpError::bad_request(w.message.clone(), None)
        }
        E::Remote(w) if w.kind == ErrorKind::Unavailable => {
            HttpError::unavailable(format!("no worker accepted the request: {}", w.message))
        }
        E::MessageTooLarge { .. } => HttpError::bad_request(e.to_string(), None),
        _ => HttpError::internal(format!("worker failed: {e}")),
    }
}

/// A worker's response stream for one `ModelInput::Tokens` request, with migration.
pub struct WorkerStream {
    model: Arc<ModelEntry>,
    selector: Arc<dyn WorkerSelector>,
    metrics: Arc<Metrics>,
    request: PreprocessedRequest,
    context: Context,
    generated: Vec<u32>,
    migrations_left: u32,
    stream: Option<ResponseStream>,
    /// The current attempt's booking (dropped with the attempt).
    booking: Option<Box<dyn RequestBooking>>,
    /// Attempts made (names each attempt's booking).
    attempts: u32,
    /// The current attempt's instance, when the selector named one.
    instance: Option<u64>,
    /// Instances this request failed on.
    failed: Vec<u64>,
    /// The selector's cached-prefix estimate for the first attempt (the one whose prompt
    /// the response's usage reports).
    router_cached_tokens: Option<u32>,
    /// Whether any item reached the caller (no free retry after that).
    produced: bool,
    /// Free retries used (see [`MAX_UNSENT_RETRIES`]).
    unsent_retries: u32,
    done: bool,
}

/// Whether an attempt that failed with `e` before any output may be re-sent elsewhere.
fn retryable_before_output(e: &dynamo_runtime::Error) -> bool {
    e.is_migratable()
        || matches!(e, dynamo_runtime::Error::Remote(w) if w.kind == ErrorKind::Unavailable)
}

impl WorkerStream {
    /// Send `request` and return its stream once a worker accepted it.
    ///
    /// # Errors
    /// [`HttpError`] 503 when no worker is available, 500 for other worker failures.
    pub async fn open(
        model: Arc<ModelEntry>,
        selector: Arc<dyn WorkerSelector>,
        metrics: Arc<Metrics>,
        request: PreprocessedRequest,
        context: Context,
        migration_limit: u32,
    ) -> Result<Self, HttpError> {
        let mut request = request;
        // The worker loads the adapter the request names (the reference sends it so too).
        if let Some(lora) = model.lora_name() {
            request.routing.get_or_insert_default().lora_name = Some(lora.to_owned());
        }
        let mut s = Self {
            model,
            selector,
            metrics,
            request,
            context,
            generated: Vec::new(),
            migrations_left: migration_limit,
            stream: None,
            booking: None,
            attempts: 0,
            instance: None,
            failed: Vec::new(),
            router_cached_tokens: None,
            produced: false,
            unsent_retries: 0,
            done: false,
        };
        s.connect(MigrationType::NewRequest).await?;
        Ok(s)
    }

    async fn connect(&mut self, kind: MigrationType) -> Result<(), HttpError> {
        loop {
            // The first attempt sends the request as it is (no copy).
            let request = if self.generated.is_empty() {
                std::borrow::Cow::Borrowed(&self.request)
            } else {
                std::borrow::Cow::Owned(self.request.continued(&self.generated))
            };
            // Sized for the prompt (a token id is 1-5 bytes, most 3; the other fields a few
            // hundred): growing from 128 bytes took 3-6 reallocations a request.
            let capacity = 512 + 3 * request.token_ids.len();
            let body = dynamo_runtime::transport::codec::encode_with_capacity(&*request, capacity)
                .map_err(|e| HttpError::internal(format!("cannot encode the request: {e}")))?;
            // The previous attempt's load is released before the next one books (the
            // fields directly: `request` may borrow `self.request`).
            self.stream = None;
            self.booking = None;
            // Sized up front (`format!` grew it: an allocation more per request).
            let mut attempt_id = String::with_capacity(self.context.id().len() + 11);
            attempt_id.push_str(self.context.id());
            attempt_id.push('#');
            let _ = std::fmt::Write::write_fmt(&mut attempt_id, format_args!("{}", self.attempts));
            self.attempts += 1;
            let selected = self
                .selector
                .book(
                    &self.model,
                    RoutedRequest::Tokens(&request),
                    &attempt_id,
                    &self.failed,
                )
                .await?;
            drop(request);
            self.booking = selected.booking;
            if self.attempts == 1 {
                self.router_cached_tokens = selected.cached_tokens;
            }
            // An adapter is served only by the instances that registered it.
            let route = self
                .model
                .restrict_route(selected.route, &self.failed)
                .map_err(HttpError::unavailable)?;
            self.instance = match route {
                Route::Direct(id) => Some(id),
                Route::RoundRobin | Route::Random => None,
            };
            // Each attempt gets a linked child: dropping a broken attempt stops only it.
            let ctx = self.context.child();
            match self
                .model
                .client
                .generate(Bytes::from(body), route, ctx, None)
                .await
            {
                Ok(s) => {
                    self.stream = Some(s);
                    return Ok(());
                }
                Err(e) if self.may_retry_unsent(&e) => {
                    self.attempt_failed();
                    self.unsent_retries += 1;
                    tracing::info!(model = %self.model.name, error = %e, "no worker output yet; retrying on another worker");
                }
                Err(e) if e.is_migratable() && self.may_migrate() => {
                    self.attempt_failed();
                    self.migrations_left -= 1;
                    self.metrics.migration(&self.model.name, kind);
                    tracing::info!(model = %self.model.name, error = %e, "migrating request");
                }
                Err(e) => {
                    self.end_attempt();
                    return Err(route_error(&e));
                }
            }
        }
    }

    /// Release the current attempt (its stream and booking).
    fn end_attempt(&mut self) {
        self.stream = None;
        self.booking = None;
    }

    /// The current attempt's worker failed: remember it, then release the attempt.
    fn attempt_failed(&mut self) {
        if let Some(id) = self.instance.take() {
            self.failed.push(id);
        }
        self.end_attempt();
    }

    fn may_migrate(&self) -> bool {
        self.migrations_left > 0 && !self.context.is_stopped()
    }

    /// The request's context (stopping it stops the worker).
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Prompt tokens the KV router expected the first worker to have cached (`None` outside
    /// KV mode).
    pub fn router_cached_tokens(&self) -> Option<u32> {
        self.router_cached_tokens
    }

    /// A failure before any output, with free retries left and a worker not tried yet.
    /// Called before the failed attempt is recorded, so the current instance counts as
    /// tried.
    fn may_retry_unsent(&self, e: &dynamo_runtime::Error) -> bool {
        if self.produced
            || self.unsent_retries >= MAX_UNSENT_RETRIES
            || self.context.is_stopped()
            || !retryable_before_output(e)
        {
            return false;
        }
        let tried = |id: &u64| self.failed.contains(id) || self.instance == Some(*id);
        self.model.serving_instances().iter().any(|id| !tried(id))
    }

    /// The next worker item; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<LLMEngineOutput, HttpError>> {
        loop {
            if self.done {
                return None;
            }
            let stream = self.stream.as_mut()?;
            match stream.next().await {
                None => {
                    self.done = true;
                    self.end_attempt();
                    return None;
                }
                Some(Ok(bytes)) => {
                    return Some(match decode_item::<LLMEngineOutput>(&bytes) {
                        Ok(Some(item)) => {
                            self.produced = true;
                            if let Some(b) = self.booking.as_mut() {
                                b.on_output(item.token_ids.len());
                            }
                            self.generated.extend_from_slice(&item.token_ids);
                            Ok(item)
                        }
                        Ok(None) => continue,
                        Err(e) => {
                            self.done = true;
                            self.end_attempt();
                            Err(e)
                        }
                    });
                }
                Some(Err(e)) => {
                    if self.may_retry_unsent(&e) {
                        // The worker accepted, then died before its first item.
                        self.attempt_failed();
                        self.unsent_retries += 1;
                        tracing::info!(model = %self.model.name, error = %e, "stream broke before any output; retrying on another worker");
                        if let Err(e) = self.connect(MigrationType::NewRequest).await {
                            self.done = true;
                            return Some(Err(e));
                        }
                        continue;
                    }
                    if e.is_migratable() {
                        self.attempt_failed();
                    } else {
                        self.end_attempt();
                    }
                    if e.is_migratable() && self.may_migrate() {
                        self.migrations_left -= 1;
                        self.metrics
                            .migration(&self.model.name, MigrationType::OngoingRequest);
                        tracing::info!(model = %self.model.name, error = %e, generated = self.generated.len(), "stream broke; migrating");
                        if let Err(e) = self.connect(MigrationType::NewRequest).await {
                            self.done = true;
                            return Some(Err(e));
                        }
                        continue;
                    }
                    self.done = true;
                    let cancelled = matches!(&e, dynamo_runtime::Error::Remote(w) if w.kind == ErrorKind::Cancelled);
                    return Some(Err(if cancelled {
                        HttpError::internal("the request was cancelled".to_owned())
                    } else {
                        HttpError::internal(format!("stream ended with an error: {e}"))
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod codec_tests {
    use dynamo_runtime::transport::codec;

    use super::*;
    use dynamo_llm::preprocessor::FinishReason;

    /// A worker item as a Python handler's bridge writes it: a map with `data`.
    fn python_item(write_data: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut b = Vec::new();
        codec::write_map_len(&mut b, 1);
        codec::write_str(&mut b, "data");
        write_data(&mut b);
        b
    }

    #[test]
    fn python_worker_items_decode_into_engine_outputs() {
        let bytes = python_item(|b| {
            codec::write_map_len(b, 4);
            codec::write_str(b, "token_ids");
            codec::write_array_len(b, 2);
            codec::write_u64(b, 7);
            codec::write_u64(b, 300);
            codec::write_str(b, "text");
            codec::write_str(b, "hi");
            codec::write_str(b, "finish_reason");
            codec::write_str(b, "length");
            codec::write_str(b, "cum_log_probs");
            codec::write_f64(b, -0.5);
        });
        let out = decode_item::<LLMEngineOutput>(&bytes)
            .expect("decodes")
            .expect("has data");
        assert_eq!(out.token_ids, vec![7, 300]);
        assert_eq!(out.text.as_deref(), Some("hi"));
        assert_eq!(out.finish_reason, Some(FinishReason::Length));
        assert_eq!(out.cum_log_probs, Some(-0.5));
    }

    #[test]
    fn error_items_and_json_bytes_are_errors() {
        let mut b = Vec::new();
        codec::write_map_len(&mut b, 2);
        codec::write_str(&mut b, "event");
        codec::write_str(&mut b, "error");
        codec::write_str(&mut b, "comment");
        codec::write_array_len(&mut b, 1);
        codec::write_str(&mut b, "boom");
        assert!(decode_item::<LLMEngineOutput>(&b).is_err());
        assert!(decode_item::<LLMEngineOutput>(br#"{"data":{"token_ids":[1]}}"#).is_err());
    }

    #[test]
    fn mocker_items_round_trip_through_the_codec() {
        let item = LLMEngineOutput {
            token_ids: vec![1, 2],
            finish_reason: Some(FinishReason::Stop),
            ..Default::default()
        };
        let bytes = codec::encode(&Annotated::data(item.clone())).expect("encodes");
        assert_eq!(
            decode_item::<LLMEngineOutput>(&bytes).ok().flatten(),
            Some(item)
        );
    }

    #[test]
    fn json_bodies_are_reencoded_for_text_workers() {
        let json = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1,"t":0.5}"#;
        let wire = json_body_to_wire(json).expect("valid JSON");
        let back: serde_json::Value = codec::decode(&wire).expect("decodes");
        assert_eq!(
            back,
            serde_json::from_slice::<serde_json::Value>(json).unwrap()
        );
        assert!(json_body_to_wire(b"{not json").is_err());
    }
}
