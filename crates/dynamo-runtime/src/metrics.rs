//! Prometheus metrics of served endpoints, rendered in the text exposition format by the
//! system status server (`/metrics`).
//!
//! Every endpoint a process serves gets one [`EndpointMetrics`], labelled
//! `dynamo_namespace`, `dynamo_component`, `dynamo_endpoint` plus the endpoint's
//! `metrics_labels`. The request plane updates it:
//!
//! | family | type | meaning |
//! |---|---|---|
//! | `dynamo_component_requests_total` | counter | requests accepted by the endpoint |
//! | `dynamo_component_errors_total{error_type}` | counter | streams ended by a handler error (`generate`) |
//! | `dynamo_component_cancellation_total` | counter | requests stopped or killed by the caller |
//! | `dynamo_component_inflight_requests` | gauge | streams in flight |
//! | `dynamo_component_request_bytes_total` | counter | request body bytes |
//! | `dynamo_component_response_bytes_total` | counter | response item bytes |
//! | `dynamo_component_request_duration_seconds` | histogram | request start to stream end |
//! | `dynamo_component_uptime_seconds` | gauge | since the runtime started (no endpoint labels) |
//!
//! Callbacks registered with [`MetricsRegistry::register_expfmt_callback`] (Python:
//! `endpoint.metrics.register_prometheus_expfmt_callback`) return text in the exposition
//! format that is appended as is; a failing callback is logged and skipped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::context::lock;
use crate::names::EndpointId;

/// Upper bounds of the request-duration histogram, in seconds: 5 ms to 600 s as in the
/// reference (LLM streams range from a cached short answer to many minutes).
pub const DURATION_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// A text-format callback: returns exposition text, or an error message.
pub type ExpfmtCallback = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Counters of one served endpoint.
#[derive(Debug)]
pub struct EndpointMetrics {
    labels: String,
    requests: AtomicU64,
    errors_generate: AtomicU64,
    cancellations: AtomicU64,
    inflight: AtomicI64,
    request_bytes: AtomicU64,
    response_bytes: AtomicU64,
    responses: AtomicU64,
    buckets: [AtomicU64; DURATION_BUCKETS.len()],
    duration_count: AtomicU64,
    duration_sum_ns: AtomicU64,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn valid_label_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl EndpointMetrics {
    /// Metrics of `endpoint` with extra constant labels (invalid label names and the
    /// reserved `dynamo_*` names are dropped with a warning).
    pub fn new(endpoint: &EndpointId, extra: &[(String, String)]) -> Self {
        let mut labels = format!(
            "dynamo_namespace=\"{}\",dynamo_component=\"{}\",dynamo_endpoint=\"{}\"",
            escape(&endpoint.namespace),
            escape(&endpoint.component),
            escape(&endpoint.name)
        );
        for (k, v) in extra {
            if !valid_label_name(k) || k.starts_with("dynamo_") || k == "error_type" || k == "le" {
                tracing::warn!(label = %k, "metrics label ignored (invalid or reserved name)");
                continue;
            }
            let _ = write!(labels, ",{k}=\"{}\"", escape(v));
        }
        Self {
            labels,
            requests: AtomicU64::new(0),
            errors_generate: AtomicU64::new(0),
            cancellations: AtomicU64::new(0),
            inflight: AtomicI64::new(0),
            request_bytes: AtomicU64::new(0),
            response_bytes: AtomicU64::new(0),
            responses: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            duration_count: AtomicU64::new(0),
            duration_sum_ns: AtomicU64::new(0),
        }
    }

    /// A request was accepted.
    pub fn request_started(&self, body_len: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.request_bytes
            .fetch_add(body_len as u64, Ordering::Relaxed);
    }

    /// A request's stream ended after `elapsed`.
    pub fn request_finished(&self, elapsed: Duration) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        let secs = elapsed.as_secs_f64();
        for (b, le) in self.buckets.iter().zip(DURATION_BUCKETS) {
            if secs <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.duration_count.fetch_add(1, Ordering::Relaxed);
        self.duration_sum_ns.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// A response item of `len` bytes was sent.
    pub fn response_sent(&self, len: usize) {
        self.response_bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.responses.fetch_add(1, Ordering::Relaxed);
    }

    /// A handler ended its stream with an error.
    pub fn handler_error(&self) {
        self.errors_generate.fetch_add(1, Ordering::Relaxed);
    }

    /// The caller stopped or killed a request.
    pub fn cancelled(&self) {
        self.cancellations.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests accepted so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Response items sent so far (the health checker's proof of life).
    pub fn responses(&self) -> u64 {
        self.responses.load(Ordering::Relaxed)
    }
}

/// The metrics of one runtime: served endpoints and registered callbacks.
pub struct MetricsRegistry {
    started: Instant,
    endpoints: Mutex<BTreeMap<String, Arc<EndpointMetrics>>>,
    callbacks: Mutex<Vec<(String, ExpfmtCallback)>>,
}

impl Default for MetricsRegistry {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            endpoints: Mutex::new(BTreeMap::new()),
            callbacks: Mutex::new(Vec::new()),
        }
    }
}

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const FAMILIES: [Family; 7] = [
    Family {
        name: "dynamo_component_requests_total",
        kind: "counter",
        help: "Requests accepted by the endpoint.",
    },
    Family {
        name: "dynamo_component_errors_total",
        kind: "counter",
        help: "Streams ended by an error, by type.",
    },
    Family {
        name: "dynamo_component_cancellation_total",
        kind: "counter",
        help: "Requests stopped or killed by the caller.",
    },
    Family {
        name: "dynamo_component_inflight_requests",
        kind: "gauge",
        help: "Streams in flight.",
    },
    Family {
        name: "dynamo_component_request_bytes_total",
        kind: "counter",
        help: "Request body bytes received.",
    },
    Family {
        name: "dynamo_component_response_bytes_total",
        kind: "counter",
        help: "Response item bytes sent.",
    },
    Family {
        name: "dynamo_component_request_duration_seconds",
        kind: "histogram",
        help: "Time from accepting a request to the end of its stream.",
    },
];

impl MetricsRegistry {
    /// The metrics of `endpoint` (created on first use; serving the same endpoint again
    /// keeps counting in the same series).
    pub fn endpoint(
        &self,
        endpoint: &EndpointId,
        labels: &[(String, String)],
    ) -> Arc<EndpointMetrics> {
        Arc::clone(
            lock(&self.endpoints)
                .entry(endpoint.path())
                .or_insert_with(|| Arc::new(EndpointMetrics::new(endpoint, labels))),
        )
    }

    /// Append the text returned by `callback` to every scrape. `owner` names the endpoint
    /// (for logs).
    pub fn register_expfmt_callback(&self, owner: String, callback: ExpfmtCallback) {
        lock(&self.callbacks).push((owner, callback));
    }

    /// The Prometheus text exposition of everything.
    pub fn render(&self) -> String {
        let endpoints: Vec<Arc<EndpointMetrics>> =
            lock(&self.endpoints).values().cloned().collect();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP dynamo_component_uptime_seconds Seconds since the runtime started.\n\
             # TYPE dynamo_component_uptime_seconds gauge\n\
             dynamo_component_uptime_seconds {}",
            self.started.elapsed().as_secs_f64()
        );
        for (i, f) in FAMILIES.iter().enumerate() {
            if endpoints.is_empty() {
                break;
            }
            let _ = writeln!(
                out,
                "# HELP {} {}\n# TYPE {} {}",
                f.name, f.help, f.name, f.kind
            );
            for m in &endpoints {
                let l = &m.labels;
                let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
                match i {
                    0 => {
                        let _ = writeln!(out, "{}{{{l}}} {}", f.name, v(&m.requests));
                    }
                    1 => {
                        let _ = writeln!(
                            out,
                            "{}{{{l},error_type=\"generate\"}} {}",
                            f.name,
                            v(&m.errors_generate)
                        );
                    }
                    2 => {
                        let _ = writeln!(out, "{}{{{l}}} {}", f.name, v(&m.cancellations));
                    }
                    3 => {
                        let _ = writeln!(
                            out,
                            "{}{{{l}}} {}",
                            f.name,
                            m.inflight.load(Ordering::Relaxed).max(0)
                        );
                    }
                    4 => {
                        let _ = writeln!(out, "{}{{{l}}} {}", f.name, v(&m.request_bytes));
                    }
                    5 => {
                        let _ = writeln!(out, "{}{{{l}}} {}", f.name, v(&m.response_bytes));
                    }
                    _ => {
                        for (b, le) in m.buckets.iter().zip(DURATION_BUCKETS) {
                            let _ = writeln!(out, "{}_bucket{{{l},le=\"{le}\"}} {}", f.name, v(b));
                        }
                        let count = v(&m.duration_count);
                        let _ = writeln!(out, "{}_bucket{{{l},le=\"+Inf\"}} {count}", f.name);
                        let _ = writeln!(out, "{}_count{{{l}}} {count}", f.name);
                        let sum = v(&m.duration_sum_ns) as f64 / 1e9;
                        let _ = writeln!(out, "{}_sum{{{l}}} {sum}", f.name);
                    }
                }
            }
        }
        let callbacks = lock(&self.callbacks).clone();
        let mut texts = Vec::with_capacity(callbacks.len());
        for (owner, cb) in callbacks {
            match cb() {
                Ok(text) => texts.push(text),
                Err(e) => tracing::warn!(%owner, error = %e, "metrics callback failed"),
            }
        }
        if texts.iter().all(String::is_empty) {
            return out;
        }
        // Callbacks may repeat our families (or each other's): merge into one valid
        // exposition rather than concatenate (see `crate::expfmt`).
        let mut parts: Vec<&str> = vec![&out];
        parts.extend(texts.iter().map(String::as_str));
        crate::expfmt::merge(&parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_labelled_counters_and_histograms() {
        let reg = MetricsRegistry::default();
        let ep = EndpointId::parse("ns.comp.gen").unwrap();
        let m = reg.endpoint(
            &ep,
            &[
                ("model".into(), "q\"x".into()),
                ("bad-name".into(), "v".into()),
            ],
        );
        m.request_started(10);
        m.response_sent(7);
        m.request_finished(Duration::from_millis(30));
        m.request_started(5);
        m.handler_error();
        reg.register_expfmt_callback("t".into(), Arc::new(|| Ok("my_gauge 3".into())));
        reg.register_expfmt_callback("t".into(), Arc::new(|| Err("boom".into())));
        let text = reg.render();
        let l =
            r#"dynamo_namespace="ns",dynamo_component="comp",dynamo_endpoint="gen",model="q\"x""#;
        assert!(
            text.contains(&format!("dynamo_component_requests_total{{{l}}} 2\n")),
            "{text}"
        );
        assert!(text.contains(&format!("dynamo_component_inflight_requests{{{l}}} 1\n")));
        assert!(text.contains(&format!("dynamo_component_request_bytes_total{{{l}}} 15\n")));
        assert!(text.contains(&format!("dynamo_component_response_bytes_total{{{l}}} 7\n")));
        assert!(text.contains(&format!(
            "dynamo_component_errors_total{{{l},error_type=\"generate\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "dynamo_component_request_duration_seconds_bucket{{{l},le=\"0.025\"}} 0\n"
        )));
        assert!(text.contains(&format!(
            "dynamo_component_request_duration_seconds_bucket{{{l},le=\"0.05\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "dynamo_component_request_duration_seconds_count{{{l}}} 1\n"
        )));
        assert!(!text.contains("bad-name"));
        assert!(text.ends_with("my_gauge 3\n"));
        // Serving the same endpoint again keeps the series.
        assert_eq!(reg.endpoint(&ep, &[]).requests(), 2);
    }
}
