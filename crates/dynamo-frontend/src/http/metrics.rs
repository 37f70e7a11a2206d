//! The frontend's Prometheus metrics (`dynamo_frontend_*`), in the text exposition format.
//!
//! A small hand-written registry: a handful of counters, one gauge and three histograms,
//! labelled by model. It avoids a metrics crate and its locking on the hot path: every
//! update is one mutex on a small map, far below the cost of the request it measures.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Bucket bounds in seconds, shared by the TTFT, ITL and duration histograms: from sub-ms
/// (sped-up mockers) to minutes (long generations).
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (i, b) in BUCKETS.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

#[derive(Default)]
struct State {
    /// (model, endpoint, request_type, status) → count.
    requests: BTreeMap<(String, &'static str, &'static str, &'static str), u64>,
    /// model → in flight.
    inflight: BTreeMap<String, i64>,
    /// (model, kind) → count.
    errors: BTreeMap<(String, String), u64>,
    /// (model, migration_type) → count.
    migrations: BTreeMap<(String, &'static str), u64>,
    ttft: BTreeMap<String, Histogram>,
    itl: BTreeMap<String, Histogram>,
    duration: BTreeMap<String, Histogram>,
    output_tokens: BTreeMap<String, u64>,
    /// Requests whose client went away before the response ended.
    disconnected: u64,
}

/// The frontend's metrics.
#[derive(Default)]
pub struct Metrics {
    state: Mutex<State>,
}

/// Which migration happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationType {
    /// The stream could not be created.
    NewRequest,
    /// The stream broke after it started.
    OngoingRequest,
}

impl Metrics {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request finished with `status` (`success`, `error`, or `disconnected` when its
    /// client went away first).
    pub fn request(
        &self,
        model: &str,
        endpoint: &'static str,
        streaming: bool,
        status: &'static str,
    ) {
        let kind = if streaming { "stream" } else { "unary" };
        let mut s = self.state();
        if status == "disconnected" {
            s.disconnected += 1;
        }
        *s.requests
            .entry((model.to_owned(), endpoint, kind, status))
            .or_default() += 1;
    }

    /// In-flight requests of `model` changed by `delta`.
    pub fn inflight(&self, model: &str, delta: i64) {
        *self.state().inflight.entry(model.to_owned()).or_default() += delta;
    }

    /// An error answered to a client (`kind`: the OpenAI error type or HTTP status).
    pub fn error(&self, model: &str, kind: &str) {
        *self
            .state()
            .errors
            .entry((model.to_owned(), kind.to_owned()))
            .or_default() += 1;
    }

    /// A request was re-dispatched to another worker.
    pub fn migration(&self, model: &str, kind: MigrationType) {
        let kind = match kind {
            MigrationType::NewRequest => "new_request",
            MigrationType::OngoingRequest => "ongoing_request",
        };
        *self
            .state()
            .migrations
            .entry((model.to_owned(), kind))
            .or_default() += 1;
    }

    /// Time to first token.
    pub fn ttft(&self, model: &str, d: Duration) {
        self.state()
            .ttft
            .entry(model.to_owned())
            .or_default()
            .observe(d.as_secs_f64());
    }

    /// Mean inter-token latency of one request, and its output token count.
    pub fn finished(&self, model: &str, total: Duration, itl: Option<Duration>, tokens: u32) {
        let mut s = self.state();
        s.duration
            .entry(model.to_owned())
            .or_default()
            .observe(total.as_secs_f64());
        if let Some(itl) = itl {
            s.itl
                .entry(model.to_owned())
                .or_default()
                .observe(itl.as_secs_f64());
        }
        *s.output_tokens.entry(model.to_owned()).or_default() += u64::from(tokens);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let s = self.state();
        let mut out = String::new();
        let esc = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"");
        // The reference's family: a gauge of the clients that went away mid-request.
        let _ = writeln!(
            out,
            "# HELP dynamo_frontend_disconnected_clients Requests whose client disconnected \
             before the response ended.\n# TYPE dynamo_frontend_disconnected_clients gauge\n\
             dynamo_frontend_disconnected_clients {}",
            s.disconnected
        );
        let _ = writeln!(
            out,
            "# HELP dynamo_frontend_requests_total Requests answered."
        );
        let _ = writeln!(out, "# TYPE dynamo_frontend_requests_total counter");
        for ((m, ep, kind, status), n) in &s.requests {
            let _ = writeln!(
                out,
                "dynamo_frontend_requests_total{{model=\"{}\",endpoint=\"{ep}\",request_type=\"{kind}\",status=\"{status}\"}} {n}",
                esc(m)
            );
        }
        let _ = writeln!(
            out,
            "# HELP dynamo_frontend_inflight_requests Requests in flight."
        );
        let _ = writeln!(out, "# TYPE dynamo_frontend_inflight_requests gauge");
        for (m, n) in &s.inflight {
            let _ = writeln!(
                out,
                "dynamo_frontend_inflight_requests{{model=\"{}\"}} {n}",
                esc(m)
            );
        }
        let _ = writeln!(
            out,
            "# HELP dynamo_frontend_errors_total Errors answered to clients."
        );
        let _ = writeln!(out, "# TYPE dynamo_frontend_errors_total counter");
        for ((m, k), n) in &s.errors {
            let _ = writeln!(
                out,
                "dynamo_frontend_errors_total{{model=\"{}\",error_type=\"{}\"}} {n}",
                esc(m),
                esc(k)
            );
        }
        let _ = writeln!(
            out,
            "# HELP dynamo_frontend_model_migration_total Requests re-dispatched after a worker failure."
        );
        let _ = writeln!(out, "# TYPE dynamo_frontend_model_migration_total counter");
        for ((m, k), n) in &s.migrations {
            let _ = writeln!(
                out,
                "dynamo_frontend_model_migration_total{{model=\"{}\",migration_type=\"{k}\"}} {n}",
                esc(m)
            );
        }
        let _ = writeln!(
            out,
            "# HELP dynamo_frontend_output_tokens_total Output tokens."
        );
        let _ = writeln!(out, "# TYPE dynamo_frontend_output_tokens_total counter");
        for (m, n) in &s.output_tokens {
            let _ = writeln!(
                out,
                "dynamo_frontend_output_tokens_total{{model=\"{}\"}} {n}",
                esc(m)
            );
        }
        for (name, help, map) in [
            (
                "time_to_first_token_seconds",
                "Time to first token.",
                &s.ttft,
            ),
            (
                "inter_token_latency_seconds",
                "Mean inter-token latency per request.",
                &s.itl,
            ),
            ("request_duration_seconds", "Request duration.", &s.duration),
        ] {
            let _ = writeln!(out, "# HELP dynamo_frontend_{name} {help}");
            let _ = writeln!(out, "# TYPE dynamo_frontend_{name} histogram");
            for (m, h) in map {
                let m = esc(m);
                for (b, c) in BUCKETS.iter().zip(&h.counts) {
                    let _ = writeln!(
                        out,
                        "dynamo_frontend_{name}_bucket{{model=\"{m}\",le=\"{b}\"}} {c}"
                    );
                }
                let _ = writeln!(
                    out,
                    "dynamo_frontend_{name}_bucket{{model=\"{m}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(out, "dynamo_frontend_{name}_sum{{model=\"{m}\"}} {}", h.sum);
                let _ = writeln!(
                    out,
                    "dynamo_frontend_{name}_count{{model=\"{m}\"}} {}",
                    h.count
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_counters_and_cumulative_buckets() {
        let m = Metrics::default();
        m.request("tiny", "chat_completions", true, "success");
        m.migration("tiny", MigrationType::OngoingRequest);
        m.ttft("tiny", Duration::from_millis(3));
        m.ttft("tiny", Duration::from_millis(30));
        let text = m.render();
        assert!(text.contains(
            "dynamo_frontend_requests_total{model=\"tiny\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"success\"} 1"
        ));
        assert!(text.contains(
            "dynamo_frontend_model_migration_total{model=\"tiny\",migration_type=\"ongoing_request\"} 1"
        ));
        assert!(text.contains(
            "dynamo_frontend_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.005\"} 1"
        ));
        assert!(text.contains(
            "dynamo_frontend_time_to_first_token_seconds_bucket{model=\"tiny\",le=\"0.05\"} 2"
        ));
        assert!(
            text.contains("dynamo_frontend_time_to_first_token_seconds_count{model=\"tiny\"} 2")
        );
    }
}
