//! What the OpenAI routes answer with, shared by the routes of discovered models
//! ([`super::openai_routes`]) and of in-process engines ([`super::static_engine`]): the
//! surface a request came in on, JSON and SSE responses, failure answers, and the guard
//! that records a request's metrics however it ends.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Shared;
use super::error::HttpError;

/// Which OpenAI surface a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Surface {
    Chat,
    Completions,
}

impl Surface {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Chat => "chat_completions",
            Self::Completions => "completions",
        }
    }

    /// The `enable_endpoint` type of the surface.
    pub(super) fn endpoint_type(self) -> &'static str {
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

/// Client-disconnect log lines: each one at the default level, a few per second at most.
static DISCONNECT_LOG: dynamo_runtime::log_limit::LogLimiter =
    dynamo_runtime::log_limit::LogLimiter::new(5);

/// Records the request's metrics when it ends, however it ends. A request that neither
/// finished (`status = "success"`) nor failed ([`Inflight::error`]) when the guard drops
/// was dropped with its response: the client went away. It counts as `disconnected` and
/// is logged (its workers were told to stop when the response dropped their streams).
pub(super) struct Inflight {
    pub(super) shared: Arc<Shared>,
    pub(super) model: String,
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
            status: "disconnected",
            started,
            first: None,
            last: None,
            tokens: 0,
        }
    }

    /// Record an error of the request (it ends with `status="error"`).
    pub(super) fn error(&mut self, e: &HttpError) {
        self.shared.metrics.error(&self.model, e.kind());
        self.status = "error";
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
        if self.status == "disconnected"
            && let Some(left_out) = DISCONNECT_LOG.admit()
        {
            tracing::info!(
                model = %self.model,
                endpoint = self.surface.label(),
                streaming = self.streaming,
                tokens_sent = self.tokens,
                elapsed_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                left_out,
                "client disconnected; request cancelled"
            );
        }
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
