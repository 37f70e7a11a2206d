//! The HTTP JSON API of the standalone selection service (`run_select_service`), with the
//! reference's routes and bodies, plus `/metrics` (Prometheus text) and an optional JSON
//! lines access log.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `GET /health` | | `{"status":"ok"}` |
//! | `GET /ready` | | 200 / 503 with `ready()` |
//! | `GET /metrics` | | Prometheus text |
//! | `GET /workers?model_name=&routing_group=` | | records |
//! | `POST /workers` | registration | 201 record |
//! | `DELETE /workers/{id}` | | record / 404 |
//! | `POST /select`, `POST /select_and_reserve` | prompt | choice |
//! | `POST /reservations` | reservation | 201 booking |
//! | `POST /reservations/{id}/prefill_complete` | | `{"status":"ok"}` |
//! | `POST /reservations/{id}/output_block` | `{"decay_fraction"?}` | `{"status":"ok"}` |
//! | `DELETE /reservations/{id}` | | `{"status":"ok"}` |
//! | `POST /overlap_scores`, `POST /potential_loads` | prompt | scores / loads |
//! | `GET /loads?model_name=&routing_group=` | | loads |
//! | `GET /dump` | | index events per `model:group` |
//!
//! Errors are `{"error": message}` with the kind's status; a body that is not JSON is 400,
//! JSON of the wrong shape 422 (as axum's extractor answers in the reference).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Serialize;

use super::error::SelectionError;
use super::group::lock;
use super::prom::{Kind, PromText};
use super::recovery::RecoveryMetrics;
use super::requests::{
    OutputBlockRequest, PromptRequest, ReservationRequest, WithTokenIds, parse_classified,
    parse_with_tokens,
};
use super::service::SelectionService;

/// Where access-log lines go, and which header carries the trace id.
pub struct AccessLog {
    file: Mutex<File>,
    trace_header: String,
}

impl AccessLog {
    /// Append to `path`.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub fn open(path: &str, trace_header: &str) -> std::io::Result<Self> {
        Ok(Self {
            file: Mutex::new(File::options().create(true).append(true).open(path)?),
            trace_header: trace_header.to_ascii_lowercase(),
        })
    }
}

/// Shared state of the HTTP handlers.
pub struct HttpState {
    /// The service.
    pub svc: Arc<SelectionService>,
    /// Metric name prefix.
    pub prefix: String,
    /// Access log, when enabled.
    pub access_log: Option<AccessLog>,
    /// Start-up recovery from peers, when asked for (its counters go to `/metrics`).
    pub recovery: Option<Arc<RecoveryMetrics>>,
    requests: Mutex<BTreeMap<(String, u16), u64>>,
}

impl HttpState {
    /// State for `svc` with metrics named `prefix_*`.
    pub fn new(svc: Arc<SelectionService>, prefix: &str, access_log: Option<AccessLog>) -> Self {
        Self {
            svc,
            prefix: prefix.to_owned(),
            access_log,
            recovery: None,
            requests: Mutex::new(BTreeMap::new()),
        }
    }
}

type St = State<Arc<HttpState>>;

pub(crate) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response(),
        Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

pub(crate) fn error_response(status: StatusCode, message: &str) -> Response {
    json(status, &serde_json::json!({ "error": message }))
}

pub(crate) fn ok() -> Response {
    ok_with(StatusCode::OK)
}

/// `{"status": "ok"}` with `status` (the indexer and slot tracker answer 201 to a register).
pub(crate) fn ok_with(status: StatusCode) -> Response {
    json(status, &serde_json::json!({"status": "ok"}))
}

fn fail(e: &SelectionError) -> Response {
    let status =
        StatusCode::from_u16(e.kind.status_code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error_response(status, &e.message)
}

/// Parse a body: 400 for bytes that are not JSON, 422 for JSON of the wrong shape.
#[expect(
    clippy::result_large_err,
    reason = "the error is the finished response, returned straight from the handler"
)]
pub(crate) fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Response> {
    parse_classified(bytes).map_err(|(syntax, e)| bad_body(syntax, &e))
}

/// [`body`] for a prompt body, its `token_ids` read directly (see
/// [`super::requests::parse_with_tokens`]).
#[expect(
    clippy::result_large_err,
    reason = "the error is the finished response, returned straight from the handler"
)]
pub(crate) fn prompt_body<T: WithTokenIds>(bytes: &[u8]) -> Result<T, Response> {
    parse_with_tokens(bytes).map_err(|(syntax, e)| bad_body(syntax, &e))
}

fn bad_body(syntax: bool, e: &SelectionError) -> Response {
    if syntax {
        error_response(
            StatusCode::BAD_REQUEST,
            &format!("Failed to parse the request body as JSON: {}", e.message),
        )
    } else {
        error_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!(
                "Failed to deserialize the JSON body into the target type: {}",
                e.message
            ),
        )
    }
}

fn answer<T: Serialize>(status: StatusCode, r: Result<T, SelectionError>) -> Response {
    match r {
        Ok(v) => json(status, &v),
        Err(e) => fail(&e),
    }
}

/// `?model_name=&routing_group=` of the list routes.
#[derive(Debug, Default)]
pub(crate) struct Filter {
    model_name: Option<String>,
    routing_group: Option<String>,
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Filter {
    fn parse(query: Option<String>) -> Self {
        let mut f = Self::default();
        for pair in query.as_deref().unwrap_or("").split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "model_name" => f.model_name = Some(percent_decode(v)),
                "routing_group" => f.routing_group = Some(percent_decode(v)),
                _ => {}
            }
        }
        f
    }
}

async fn health() -> Response {
    ok()
}

async fn ready(State(s): St) -> Response {
    let r = s.svc.ready();
    let status = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, &r)
}

async fn metrics(State(s): St) -> Response {
    let mut text = s.svc.metrics_text(&s.prefix);
    text.push_str(&http_metrics_text(&s));
    prometheus_response(text)
}

pub(crate) fn http_metrics_text(s: &HttpState) -> String {
    let prefix = &s.prefix;
    let name = format!("{prefix}_http_requests_total");
    let mut out = PromText::new();
    out.family(&name, Kind::Counter, "HTTP requests by route and status");
    for ((route, status), n) in lock(&s.requests).iter() {
        out.sample(
            &name,
            &[("endpoint", route), ("status", &status.to_string())],
            n,
        );
    }
    if let Some(hub) = s.svc.replica_hub() {
        out.push_text(&hub.metrics_text(prefix));
    }
    if let Some(r) = &s.recovery {
        out.push_text(&r.metrics_text(prefix));
    }
    out.finish()
}

async fn list_workers(State(s): St, RawQuery(q): RawQuery) -> Response {
    let f = Filter::parse(q);
    json(
        StatusCode::OK,
        &s.svc
            .list_workers(f.model_name.as_deref(), f.routing_group.as_deref()),
    )
}

async fn upsert_worker(State(s): St, bytes: Bytes) -> Response {
    match body(&bytes) {
        Ok(req) => answer(StatusCode::CREATED, s.svc.upsert_worker_settled(req).await),
        Err(r) => r,
    }
}

async fn delete_worker(State(s): St, Path(id): Path<String>) -> Response {
    match id.parse::<u64>() {
        Ok(id) => answer(StatusCode::OK, s.svc.delete_worker(id)),
        Err(_) => error_response(
            StatusCode::BAD_REQUEST,
            &format!("worker id must be an unsigned integer, got {id:?}"),
        ),
    }
}

fn with_prompt<T: Serialize>(
    bytes: &[u8],
    status: StatusCode,
    f: impl FnOnce(&PromptRequest) -> Result<T, SelectionError>,
) -> Response {
    match prompt_body::<PromptRequest>(bytes) {
        Ok(req) => answer(status, f(&req)),
        Err(r) => r,
    }
}

async fn select(State(s): St, bytes: Bytes) -> Response {
    with_prompt(&bytes, StatusCode::OK, |r| s.svc.select(r))
}

async fn select_and_reserve(State(s): St, bytes: Bytes) -> Response {
    with_prompt(&bytes, StatusCode::OK, |r| s.svc.select_and_reserve(r))
}

async fn overlap_scores(State(s): St, bytes: Bytes) -> Response {
    with_prompt(&bytes, StatusCode::OK, |r| s.svc.overlap_scores(r))
}

async fn potential_loads(State(s): St, bytes: Bytes) -> Response {
    with_prompt(&bytes, StatusCode::OK, |r| s.svc.potential_loads(r))
}

async fn create_reservation(State(s): St, bytes: Bytes) -> Response {
    match prompt_body::<ReservationRequest>(&bytes) {
        Ok(req) => answer(StatusCode::CREATED, s.svc.create_reservation(&req)),
        Err(r) => r,
    }
}

fn status_ok(r: Result<(), SelectionError>) -> Response {
    match r {
        Ok(()) => ok(),
        Err(e) => fail(&e),
    }
}

async fn prefill_complete(State(s): St, Path(id): Path<String>) -> Response {
    status_ok(s.svc.prefill_complete(&id))
}

async fn output_block(State(s): St, Path(id): Path<String>, bytes: Bytes) -> Response {
    match body::<OutputBlockRequest>(&bytes) {
        Ok(req) => status_ok(s.svc.add_output_block(&id, req.decay_fraction)),
        Err(r) => r,
    }
}

async fn free_reservation(State(s): St, Path(id): Path<String>) -> Response {
    status_ok(s.svc.free_reservation(&id))
}

async fn loads(State(s): St, RawQuery(q): RawQuery) -> Response {
    let f = Filter::parse(q);
    json(
        StatusCode::OK,
        &s.svc
            .loads(f.model_name.as_deref(), f.routing_group.as_deref()),
    )
}

async fn dump(State(s): St) -> Response {
    json(StatusCode::OK, &s.svc.dump())
}

pub(crate) async fn not_found() -> Response {
    error_response(StatusCode::NOT_FOUND, "route not found")
}

/// A `/metrics` answer: Prometheus text exposition format 0.0.4.
pub(crate) fn prometheus_response(text: String) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

/// Format a UNIX time as RFC 3339 UTC with microseconds (no date library needed).
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// The route pattern of `path` (ids replaced), the label of the request counters.
fn route_of(path: &str) -> String {
    let mut parts: Vec<&str> = path.split('/').collect();
    if parts.len() >= 3 && matches!(parts[1], "workers" | "reservations") {
        parts[2] = "{id}";
    }
    parts.join("/")
}

/// Count every request per route pattern and status; write the access-log line.
pub(crate) async fn observe(State(s): St, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let route = route_of(&path);
    let trace_id = s.access_log.as_ref().and_then(|log| {
        req.headers()
            .get(log.trace_header.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let mut resp = next.run(req).await;
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED
        && resp.headers().get(header::CONTENT_TYPE).is_none()
    {
        resp = error_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let status = resp.status().as_u16();
    *lock(&s.requests).entry((route, status)).or_default() += 1;
    if let Some(log) = &s.access_log {
        let line = serde_json::json!({
            "timestamp": rfc3339(SystemTime::now()),
            "method": method.as_str(),
            "path": path,
            "status": status,
            "duration_us": start.elapsed().as_micros() as u64,
            "trace_id": trace_id,
        });
        let mut f = lock(&log.file);
        let _ = writeln!(f, "{line}");
    }
    resp
}

/// The selection service's routes.
pub fn select_router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/workers", get(list_workers).post(upsert_worker))
        .route("/workers/{id}", delete(delete_worker))
        .route("/select", post(select))
        .route("/select_and_reserve", post(select_and_reserve))
        .route("/reservations", post(create_reservation))
        .route("/reservations/{id}", delete(free_reservation))
        .route(
            "/reservations/{id}/prefill_complete",
            post(prefill_complete),
        )
        .route("/reservations/{id}/output_block", post(output_block))
        .route("/overlap_scores", post(overlap_scores))
        .route("/potential_loads", post(potential_loads))
        .route("/loads", get(loads))
        .route("/dump", get(dump))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_filters_decode() {
        let f = Filter::parse(Some("model_name=a%2Fb+c&routing_group=g&x=1".into()));
        assert_eq!(f.model_name.as_deref(), Some("a/b c"));
        assert_eq!(f.routing_group.as_deref(), Some("g"));
        assert!(Filter::parse(None).model_name.is_none());
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%\u{e9}x"), "%\u{e9}x");
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = UNIX_EPOCH + std::time::Duration::from_micros(1_764_633_600_123_456);
        assert_eq!(rfc3339(t), "2025-12-02T00:00:00.123456Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    }
}
