//! The system status server's machinery: the health model, the HTTP server and the
//! `/engine` callbacks. Public through the `system` module, whose docs describe the routes
//! and the health rules. It sits below the runtime, which owns one [`SystemState`] and
//! starts the server; the health canaries, which need a runtime and a client, live in
//! `system.rs` above both.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::context::lock;
use crate::discovery::BoxFuture;
use crate::error::Result;
use crate::metrics::MetricsRegistry;

/// Largest request head accepted (probes and scrapers send a few hundred bytes).
const MAX_HEAD: usize = 64 * 1024;
/// Largest `/engine` request body.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// A client that sends nothing for this long is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// An `/engine/{route}` callback: JSON in, JSON out.
pub type EngineRoute = Arc<
    dyn Fn(serde_json::Value) -> BoxFuture<'static, Result<serde_json::Value, String>>
        + Send
        + Sync,
>;

/// Ready/not-ready state of the process and its endpoints.
pub struct SystemHealth {
    started: Instant,
    flag: Mutex<Option<bool>>,
    endpoints: Mutex<BTreeMap<String, bool>>,
}

impl SystemHealth {
    /// Health with an optional starting flag.
    pub fn new(starting: Option<bool>) -> Self {
        Self {
            started: Instant::now(),
            flag: Mutex::new(starting),
            endpoints: Mutex::new(BTreeMap::new()),
        }
    }

    /// Set the process flag (Python `runtime.set_health_status`).
    pub fn set_ready(&self, ready: bool) {
        *lock(&self.flag) = Some(ready);
    }

    /// Set one endpoint's status.
    pub fn set_endpoint(&self, name: &str, ready: bool) {
        lock(&self.endpoints).insert(name.to_owned(), ready);
    }

    /// Forget an endpoint (it stopped serving).
    pub fn remove_endpoint(&self, name: &str) {
        lock(&self.endpoints).remove(name);
    }

    /// Whether the process is ready (see the `system` module docs).
    pub fn is_ready(&self) -> bool {
        let endpoints = lock(&self.endpoints);
        let all = endpoints.values().all(|r| *r);
        match *lock(&self.flag) {
            Some(flag) => flag && all,
            None => !endpoints.is_empty() && all,
        }
    }

    /// The `/health` JSON.
    pub fn json(&self) -> serde_json::Value {
        let up = self.started.elapsed();
        let status = |r: bool| if r { "ready" } else { "notready" };
        let endpoints: serde_json::Map<String, serde_json::Value> = lock(&self.endpoints)
            .iter()
            .map(|(k, v)| (k.clone(), status(*v).into()))
            .collect();
        serde_json::json!({
            "status": status(self.is_ready()),
            "uptime": {"secs": up.as_secs(), "nanos": up.subsec_nanos()},
            "endpoints": endpoints,
        })
    }
}

/// What the status server serves.
pub(crate) struct SystemState {
    pub(crate) health: Arc<SystemHealth>,
    pub(crate) metrics: Arc<MetricsRegistry>,
    pub(crate) routes: Mutex<HashMap<String, EngineRoute>>,
    health_path: String,
    live_path: String,
}

impl SystemState {
    pub(crate) fn new(starting: Option<bool>) -> Self {
        let path = |var: &str, default: &str| {
            std::env::var(var)
                .ok()
                .filter(|p| p.starts_with('/'))
                .unwrap_or_else(|| default.to_owned())
        };
        Self {
            health: Arc::new(SystemHealth::new(starting)),
            metrics: Arc::new(MetricsRegistry::default()),
            routes: Mutex::new(HashMap::new()),
            health_path: path("DYN_SYSTEM_HEALTH_PATH", "/health"),
            live_path: path("DYN_SYSTEM_LIVE_PATH", "/live"),
        }
    }
}

/// Bind `host:port` and serve until `cancel`. Returns the bound address.
pub(crate) fn start(
    host: &str,
    port: u16,
    state: Arc<SystemState>,
    cancel: CancellationToken,
    handle: &tokio::runtime::Handle,
) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind((host, port))?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    handle.spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "system status server: cannot listen");
                return;
            }
        };
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                () = cancel.cancelled() => return,
            };
            match accepted {
                Ok((sock, _)) => {
                    let state = Arc::clone(&state);
                    tokio::spawn(async move {
                        if let Err(e) = serve(sock, &state).await {
                            tracing::debug!(error = %e, "system status server: connection error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "system status server: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
    tracing::info!(%address, "system status server listening");
    Ok(address)
}

struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
}

async fn read_request(sock: &mut TcpStream) -> std::io::Result<Option<HttpRequest>> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(READ_TIMEOUT, sock.read(&mut chunk))
            .await
            .map_err(|_| std::io::ErrorKind::TimedOut)??;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_owned();
    let target = first.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if length > MAX_BODY {
        return Ok(None);
    }
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; (length - body.len()).min(64 * 1024)];
        let n = tokio::time::timeout(READ_TIMEOUT, sock.read(&mut chunk))
            .await
            .map_err(|_| std::io::ErrorKind::TimedOut)??;
        if n == 0 {
            return Ok(None);
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok(Some(HttpRequest { method, path, body }))
}

async fn respond(
    sock: &mut TcpStream,
    code: u16,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    if !head_only {
        sock.write_all(body).await?;
    }
    sock.shutdown().await
}

const JSON: &str = "application/json";

async fn serve(mut sock: TcpStream, state: &SystemState) -> std::io::Result<()> {
    let Some(req) = read_request(&mut sock).await? else {
        return respond(&mut sock, 400, "text/plain", b"Bad request", false).await;
    };
    let head_only = req.method == "HEAD";
    let get = req.method == "GET" || head_only;
    if get && (req.path == state.health_path || req.path == state.live_path) {
        let code = if state.health.is_ready() { 200 } else { 503 };
        let body = state.health.json().to_string();
        return respond(&mut sock, code, JSON, body.as_bytes(), head_only).await;
    }
    if get && req.path == "/metrics" {
        // Callbacks may call into Python: render off the async workers.
        let metrics = Arc::clone(&state.metrics);
        let text = tokio::task::spawn_blocking(move || metrics.render())
            .await
            .unwrap_or_default();
        return respond(
            &mut sock,
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            text.as_bytes(),
            head_only,
        )
        .await;
    }
    if let Some(route) = req.path.strip_prefix("/engine/") {
        let callback = lock(&state.routes).get(route).cloned();
        let Some(callback) = callback else {
            let body = serde_json::json!({"error": format!("unknown engine route {route:?}")});
            return respond(&mut sock, 404, JSON, body.to_string().as_bytes(), head_only).await;
        };
        let input = if req.body.iter().all(u8::is_ascii_whitespace) {
            serde_json::json!({})
        } else {
            match serde_json::from_slice(&req.body) {
                Ok(v) => v,
                Err(e) => {
                    let body = serde_json::json!({"error": format!("invalid JSON body: {e}")});
                    return respond(&mut sock, 400, JSON, body.to_string().as_bytes(), head_only)
                        .await;
                }
            }
        };
        let (code, body) = match callback(input).await {
            Ok(v) => (200, v.to_string()),
            Err(e) => (500, serde_json::json!({"error": e}).to_string()),
        };
        return respond(&mut sock, code, JSON, body.as_bytes(), head_only).await;
    }
    respond(&mut sock, 404, "text/plain", b"Route not found", head_only).await
}
