//! The per-process system status server (`DYN_SYSTEM_PORT`: `-1` disabled, the default; `0`
//! a random port; `DYN_SYSTEM_HOST`, default `0.0.0.0`) and the health model behind it.
//!
//! Routes (HTTP/1.1, one request per connection):
//! * `GET /health` and `GET /live` (`DYN_SYSTEM_HEALTH_PATH`, `DYN_SYSTEM_LIVE_PATH`): 200
//!   when ready, else 503, with JSON
//!   `{"status": "ready"|"notready", "uptime": {"secs", "nanos"}, "endpoints": {name: "ready"|"notready"}}`.
//! * `GET /metrics`: Prometheus text ([`crate::metrics`]).
//! * `/engine/{route}` (any method): the JSON body (`{}` when empty) goes to the callback
//!   registered for `route`; its JSON result is the response (500 with `{"error": ...}` when
//!   it fails, 404 for an unknown route).
//! * anything else: 404 `Route not found`.
//!
//! Health: the process is ready when every served endpoint is ready and, once
//! `set_health_status` was called (or `DYN_SYSTEM_STARTING_HEALTH_STATUS` is set), the
//! flag it set is `ready`. Without either, a process serving no endpoint is not ready. An
//! endpoint is ready while it serves; with health checks enabled
//! (`DYN_HEALTH_CHECK_ENABLED=true`) an endpoint with a `health_check_payload` starts not
//! ready, and becomes ready as soon as it sends a response item (to real traffic or to a
//! canary). When it sent nothing for `DYN_CANARY_WAIT_TIME` (10 s, also the delay before
//! the first canary) it is sent the payload through its own handler; it is ready when the
//! first response item arrives without error within `DYN_HEALTH_CHECK_REQUEST_TIMEOUT`
//! (3 s), not ready otherwise. A handler that never answers keeps it not ready.
//!
//! Layout: the server and the health model live in a private `status` module below the
//! runtime (which owns their state and starts the server) and are re-exported here. This
//! module sits above the runtime and the router: the canary is a client of its own
//! endpoint, so endpoint serving (`DistributedRuntime::serve_endpoint*`), which starts and
//! stops the canary, is implemented here too.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::error::Result;
use crate::metrics::EndpointMetrics;
use crate::names::EndpointId;
use crate::router::Route;
use crate::runtime::{DistributedRuntime, ServeOptions};
use crate::transport::server::Handler;

// Defined in the layers below (the runtime holds the state, `RuntimeConfig` the canary
// timing); these are their public paths.
pub use crate::config::CanaryConfig;
pub use crate::status::{EngineRoute, SystemHealth};

/// How often the health checker looks for response items sent to real traffic: a
/// not-ready endpoint that answers becomes ready within this delay (the reference flips
/// on the item itself), cheap enough (one atomic load) to run per endpoint.
const ACTIVITY_POLL: Duration = Duration::from_millis(100);
/// How long a timed-out canary may take to end once killed (the kill is one frame away).
const KILL_GRACE: Duration = Duration::from_millis(500);

impl DistributedRuntime {
    /// Serve `endpoint` with `handler` until the runtime shuts down. Resolves after the
    /// endpoint stopped, its in-flight streams drained (when `graceful`) and the runtime
    /// finished shutting down.
    pub async fn serve_endpoint(
        &self,
        endpoint: &EndpointId,
        handler: Arc<dyn Handler>,
        graceful: bool,
    ) -> Result<()> {
        self.serve_endpoint_until(endpoint, handler, graceful, CancellationToken::new())
            .await
    }

    /// [`DistributedRuntime::serve_endpoint`] that also stops when `stop` is cancelled:
    /// the endpoint alone then leaves discovery, drains (when `graceful`) and the future
    /// resolves without waiting for the runtime.
    pub async fn serve_endpoint_until(
        &self,
        endpoint: &EndpointId,
        handler: Arc<dyn Handler>,
        graceful: bool,
        stop: CancellationToken,
    ) -> Result<()> {
        let options = ServeOptions {
            graceful,
            ..ServeOptions::default()
        };
        self.serve_endpoint_with(endpoint, handler, options, stop)
            .await
    }

    /// [`DistributedRuntime::serve_endpoint_until`] with metrics labels and a health-check
    /// payload.
    pub async fn serve_endpoint_with(
        &self,
        endpoint: &EndpointId,
        handler: Arc<dyn Handler>,
        options: ServeOptions,
        stop: CancellationToken,
    ) -> Result<()> {
        let graceful = options.graceful;
        let serving = self.start_serving(endpoint, handler, &options).await?;
        let health_name = endpoint.to_string();
        let health = Arc::clone(&self.inner.system.health);
        let canary_stop = self.inner.endpoint_shutdown.child_token();
        let canary_payload = options
            .health_check_payload
            .filter(|_| self.inner.config.health_check_enabled);
        // A health-checked endpoint is not ready until it has answered (a canary or real
        // traffic), as in the reference; any other endpoint is ready while it serves.
        health.set_endpoint(&health_name, canary_payload.is_none());
        if let Some(payload) = canary_payload {
            spawn_canary(
                self.clone(),
                endpoint.clone(),
                payload,
                Arc::clone(&serving.metrics),
                Arc::clone(&health),
                self.inner.config.canary,
                canary_stop.clone(),
            );
        }
        let runtime_stopping = tokio::select! {
            () = self.inner.endpoint_shutdown.cancelled() => true,
            () = stop.cancelled() => false,
        };
        canary_stop.cancel();
        health.remove_endpoint(&health_name);
        // Phases 1 and 2: stop taking work, withdraw from discovery, drain.
        self.stop_serving(endpoint, serving, graceful).await;
        if runtime_stopping {
            // Phase 3 is run by `shutdown`; resolve once it is done.
            self.inner.primary.cancelled().await;
        }
        Ok(())
    }
}

/// Probe `endpoint` with `payload` whenever it was idle for `config.wait`, and record the
/// outcome in `health`, until `cancel`.
pub(crate) fn spawn_canary(
    drt: DistributedRuntime,
    endpoint: EndpointId,
    payload: Bytes,
    metrics: Arc<EndpointMetrics>,
    health: Arc<SystemHealth>,
    config: CanaryConfig,
    cancel: CancellationToken,
) {
    tokio::spawn(async move {
        let name = endpoint.to_string();
        let client = drt.client(&endpoint);
        let mut seen = metrics.responses();
        let mut last_alive = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(config.wait.min(ACTIVITY_POLL)) => {}
                () = cancel.cancelled() => return,
            }
            let now = metrics.responses();
            if now != seen {
                // The handler answered real traffic meanwhile: proof enough of life.
                seen = now;
                last_alive = tokio::time::Instant::now();
                health.set_endpoint(&name, true);
                continue;
            }
            if last_alive.elapsed() < config.wait {
                continue;
            }
            let context = Context::default();
            let probe = async {
                let mut stream = client
                    .generate(
                        payload.clone(),
                        Route::Direct(drt.connection_id()),
                        context.clone(),
                        None,
                    )
                    .await?;
                let first = stream.next().await;
                // Drain the rest so the handler finishes; its outcome does not matter.
                while stream.next().await.is_some() {}
                match first {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(e)) => Err(e),
                    None => Err(crate::Error::Disconnected("empty canary stream".into())),
                }
            };
            tokio::pin!(probe);
            let ok = match tokio::time::timeout(config.timeout, &mut probe).await {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    tracing::warn!(endpoint = %name, error = %e, "health check failed");
                    false
                }
                Err(_) => {
                    tracing::warn!(endpoint = %name, "health check timed out");
                    // Kill the canary in the handler too (the reference cancels it), so
                    // wedged canaries do not pile up and hold a graceful shutdown: the
                    // kill travels while the stream is open, so let it end.
                    context.kill();
                    let _ = tokio::time::timeout(KILL_GRACE, &mut probe).await;
                    false
                }
            };
            if cancel.is_cancelled() {
                return;
            }
            health.set_endpoint(&name, ok);
            // The canary's own items are not traffic.
            seen = metrics.responses();
            last_alive = tokio::time::Instant::now();
        }
    });
}
