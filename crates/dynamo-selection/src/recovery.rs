//! Peer recovery of the indexes at start-up (`python -m dynamo.indexer --peers`,
//! `python -m dynamo.select_service --indexer-peers`, `SelectionService(indexer_peers=...)`):
//! a restarted indexer asks a peer for its `/dump` — the index as stored events per
//! `"model:group"`, the shape both services serve — and loads it into its own trees, so it
//! answers queries with the peer's state instead of an empty index.
//!
//! * The fetch waits [`SLOW_JOINER_DELAY`] (1 s, as the reference) after start-up: the
//!   ZMQ KV-event subscriptions of the workers registered at start are connected by then,
//!   so the events the engines publish from then on are not lost while the dump loads
//!   (events that arrive both ways are idempotent stores).
//! * Peers are tried in order; the first that answers with a dump is used. An unreachable
//!   peer or one that answers garbage is logged and counted in `/metrics`
//!   (`..._peer_recovery_total{outcome=...}`), and the next is tried; with none the
//!   service just starts empty, as without peers.
//! * Only groups and workers registered here when the dump arrives are loaded (with the
//!   same block size); the other events are counted as skipped. Register workers with
//!   `--workers` (or within the first second) to have their state recovered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::prom::{Kind, PromText};
use super::service::{PeerDump, SelectionService};

/// Delay before the first fetch.
pub const SLOW_JOINER_DELAY: Duration = Duration::from_secs(1);

/// Time allowed for one peer's answer.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Outcome counters.
#[derive(Debug, Default)]
pub struct RecoveryMetrics {
    /// Peers whose dump was loaded (0 or 1).
    pub recovered: AtomicU64,
    /// Peers that could not be reached (or answered an error status).
    pub unreachable: AtomicU64,
    /// Peers whose answer was not a dump.
    pub invalid: AtomicU64,
    /// Events applied from the dump.
    pub events_applied: AtomicU64,
    /// Events skipped or rejected (group or worker not registered here, ...).
    pub events_skipped: AtomicU64,
}

impl RecoveryMetrics {
    /// Prometheus text, names prefixed `prefix_peer_recovery_`.
    pub fn metrics_text(&self, prefix: &str) -> String {
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let p = |n: &str| format!("{prefix}_peer_recovery_{n}");
        let mut out = PromText::new();
        out.by_label(
            &p("total"),
            Kind::Counter,
            "Start-up recovery attempts from peers by outcome",
            "outcome",
            [
                ("recovered", g(&self.recovered)),
                ("unreachable", g(&self.unreachable)),
                ("invalid", g(&self.invalid)),
            ],
        )
        .by_label(
            &p("events_total"),
            Kind::Counter,
            "Events of the peer's dump",
            "outcome",
            [
                ("applied", g(&self.events_applied)),
                ("skipped", g(&self.events_skipped)),
            ],
        );
        out.finish()
    }
}

/// Parse `"http://host:port,host:port,..."` into base URLs (`http://` when no scheme).
///
/// # Errors
/// An entry without a port or with another scheme than http(s).
pub fn parse_peer_urls(spec: &str) -> Result<Vec<String>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_peer_url)
        .collect()
}

/// One peer URL (see [`parse_peer_urls`]).
///
/// # Errors
/// As [`parse_peer_urls`].
pub fn parse_peer_url(peer: &str) -> Result<String, String> {
    let (scheme, rest) = match peer.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        Some((s, _)) => {
            return Err(format!(
                "indexer peer {peer:?}: only http:// and https:// URLs are supported, not {s}://"
            ));
        }
        None => ("http", peer),
    };
    let rest = rest.trim_end_matches('/');
    let authority = rest.split('/').next().unwrap_or("");
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(format!("{scheme}://{rest}"))
        }
        _ => Err(format!("indexer peer {peer:?} has no port")),
    }
}

#[derive(Debug)]
enum FetchError {
    Unreachable(String),
    Invalid(String),
}

async fn fetch(
    client: &reqwest::Client,
    base: &str,
) -> Result<BTreeMap<String, PeerDump>, FetchError> {
    let resp = client
        .get(format!("{base}/dump"))
        .send()
        .await
        .map_err(|e| FetchError::Unreachable(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(FetchError::Unreachable(format!("status {}", resp.status())));
    }
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| FetchError::Unreachable(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| FetchError::Invalid(e.to_string()))
}

/// Recover `svc`'s indexes from the first peer that answers, after `delay`, on `handle`.
/// Returns the counters (also while it runs).
pub fn spawn(
    svc: Arc<SelectionService>,
    peers: Vec<String>,
    delay: Duration,
    handle: &tokio::runtime::Handle,
) -> Arc<RecoveryMetrics> {
    let metrics = Arc::new(RecoveryMetrics::default());
    if peers.is_empty() {
        return metrics;
    }
    let m = metrics.clone();
    handle.spawn(async move {
        tokio::time::sleep(delay).await;
        let client = match reqwest::Client::builder()
            .no_proxy()
            .timeout(FETCH_TIMEOUT)
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "peer recovery: no HTTP client");
                return;
            }
        };
        for peer in &peers {
            if svc.is_shut_down() {
                return;
            }
            match fetch(&client, peer).await {
                Ok(dump) => {
                    let load = svc.load_dump(&dump);
                    m.recovered.fetch_add(1, Ordering::Relaxed);
                    m.events_applied.fetch_add(load.applied, Ordering::Relaxed);
                    m.events_skipped
                        .fetch_add(load.skipped + load.rejected, Ordering::Relaxed);
                    tracing::info!(
                        %peer,
                        applied = load.applied,
                        skipped = load.skipped,
                        rejected = load.rejected,
                        "recovered the index from a peer"
                    );
                    return;
                }
                Err(FetchError::Unreachable(e)) => {
                    m.unreachable.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, error = %e, "peer recovery: peer unreachable");
                }
                Err(FetchError::Invalid(e)) => {
                    m.invalid.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, error = %e, "peer recovery: not a dump");
                }
            }
        }
        tracing::warn!("peer recovery: no peer answered; starting with an empty index");
    });
    metrics
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_get_a_scheme_and_need_a_port() {
        assert_eq!(
            parse_peer_urls("http://a:8090/, b:8091 ,https://c:1/x").unwrap(),
            vec!["http://a:8090", "http://b:8091", "https://c:1/x"]
        );
        assert!(
            parse_peer_urls("http://a")
                .unwrap_err()
                .contains("has no port")
        );
        assert!(
            parse_peer_urls("tcp://a:1")
                .unwrap_err()
                .contains("only http")
        );
    }
}
