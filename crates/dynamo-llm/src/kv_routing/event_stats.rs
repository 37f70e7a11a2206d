//! Ingestion counters of a router's KV event stream: how much was applied, how much waits,
//! and how far behind the publishers the index is (the lag metric of `/metrics`).
//!
//! The router's event loop updates them; readers (the frontend's `/metrics`, benches,
//! tests) take a [`KvEventStatsSnapshot`] or render the Prometheus families with
//! [`render_prometheus`]:
//!
//! | family | type | meaning |
//! |---|---|---|
//! | `dynamo_router_kv_events_applied_total` | counter | events applied to the index (rejected ones included) |
//! | `dynamo_router_kv_event_blocks_applied_total` | counter | blocks in those events (stored + removed) |
//! | `dynamo_router_kv_events_rejected_total` | counter | events the index rejected (unknown parent or block) |
//! | `dynamo_router_kv_event_gaps_total` | counter | id gaps seen (each starts a recovery) |
//! | `dynamo_router_kv_event_queue_depth` | gauge | events received from the event plane, not yet applied |
//! | `dynamo_router_kv_event_lag_seconds` | histogram | publish (envelope time) to applied, per event |
//! | `dynamo_router_kv_event_last_lag_seconds` | gauge | that lag for the last event applied |
//!
//! The lag compares the publisher's clock (the envelope's `published_at`, milliseconds) with
//! the router's: across machines it includes their clock offset, and it is 0 for an event
//! applied within the millisecond it was published. A router that keeps up shows a queue
//! depth near 0 and a lag of a few milliseconds at most; one that falls behind shows both
//! growing.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Upper bounds of the lag histogram, in seconds.
pub const LAG_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0,
];

/// The counters (shared by the event loop and readers; all updates are relaxed atomics).
#[derive(Debug, Default)]
pub struct KvEventStats {
    applied: AtomicU64,
    blocks: AtomicU64,
    rejected: AtomicU64,
    gaps: AtomicU64,
    queued: AtomicU64,
    last_lag_ms: AtomicU64,
    lag_buckets: [AtomicU64; LAG_BUCKETS.len()],
    lag_count: AtomicU64,
    lag_sum_ms: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KvEventStatsSnapshot {
    /// Events applied (rejected ones included).
    pub applied: u64,
    /// Blocks in the applied events.
    pub blocks: u64,
    /// Events the index rejected.
    pub rejected: u64,
    /// Id gaps seen.
    pub gaps: u64,
    /// Events received and not yet applied.
    pub queued: u64,
    /// Lag of the last applied event, seconds.
    pub last_lag_secs: f64,
    /// Events whose lag was measured.
    pub lag_count: u64,
    /// Sum of their lags, seconds.
    pub lag_sum_secs: f64,
    /// Cumulative histogram counts, one per [`LAG_BUCKETS`] bound.
    pub lag_buckets: [u64; LAG_BUCKETS.len()],
}

impl KvEventStatsSnapshot {
    /// The smallest bucket bound that at least `q` (0..=1) of the measured lags fall
    /// under (`f64::INFINITY` beyond the last bound, 0 with no lag measured).
    pub fn lag_quantile_bound(&self, q: f64) -> f64 {
        if self.lag_count == 0 {
            return 0.0;
        }
        let want = (q * self.lag_count as f64).ceil() as u64;
        LAG_BUCKETS
            .iter()
            .zip(self.lag_buckets)
            .find(|(_, c)| *c >= want)
            .map_or(f64::INFINITY, |(b, _)| *b)
    }
}

/// Milliseconds since the Unix epoch (the envelope's clock).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl KvEventStats {
    /// One event applied: `blocks` blocks, published at `published_at_ms` (0: unknown,
    /// no lag recorded), seen at `now_ms`.
    pub(crate) fn applied(&self, blocks: usize, published_at_ms: u64, now_ms: u64) {
        self.applied.fetch_add(1, Ordering::Relaxed);
        self.blocks.fetch_add(blocks as u64, Ordering::Relaxed);
        if published_at_ms == 0 {
            return;
        }
        let lag = now_ms.saturating_sub(published_at_ms);
        self.last_lag_ms.store(lag, Ordering::Relaxed);
        self.lag_count.fetch_add(1, Ordering::Relaxed);
        self.lag_sum_ms.fetch_add(lag, Ordering::Relaxed);
        let secs = lag as f64 / 1000.0;
        // Buckets are cumulative: bump every bound the lag fits under.
        for (bucket, bound) in self.lag_buckets.iter().zip(LAG_BUCKETS) {
            if secs <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn gap(&self) {
        self.gaps.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_queued(&self, n: usize) {
        self.queued.store(n as u64, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> KvEventStatsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        KvEventStatsSnapshot {
            applied: r(&self.applied),
            blocks: r(&self.blocks),
            rejected: r(&self.rejected),
            gaps: r(&self.gaps),
            queued: r(&self.queued),
            last_lag_secs: r(&self.last_lag_ms) as f64 / 1000.0,
            lag_count: r(&self.lag_count),
            lag_sum_secs: r(&self.lag_sum_ms) as f64 / 1000.0,
            lag_buckets: std::array::from_fn(|i| r(&self.lag_buckets[i])),
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text of several routers' counters, each family once. `routers` pairs an
/// endpoint's `(namespace, component, endpoint)` with its snapshot. Empty when there are
/// no routers.
pub fn render_prometheus(routers: &[((&str, &str, &str), KvEventStatsSnapshot)]) -> String {
    let mut out = String::new();
    if routers.is_empty() {
        return out;
    }
    let labels: Vec<String> = routers
        .iter()
        .map(|((ns, c, e), _)| {
            format!(
                "dynamo_namespace=\"{}\",dynamo_component=\"{}\",dynamo_endpoint=\"{}\"",
                escape(ns),
                escape(c),
                escape(e)
            )
        })
        .collect();
    let scalar = |out: &mut String,
                  name: &str,
                  kind: &str,
                  help: &str,
                  f: &dyn Fn(&KvEventStatsSnapshot) -> String| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (l, (_, s)) in labels.iter().zip(routers) {
            let _ = writeln!(out, "{name}{{{l}}} {}", f(s));
        }
    };
    scalar(
        &mut out,
        "dynamo_router_kv_events_applied_total",
        "counter",
        "KV events applied to the router's index (rejected ones included).",
        &|s| s.applied.to_string(),
    );
    scalar(
        &mut out,
        "dynamo_router_kv_event_blocks_applied_total",
        "counter",
        "Blocks in the KV events applied (stored and removed).",
        &|s| s.blocks.to_string(),
    );
    scalar(
        &mut out,
        "dynamo_router_kv_events_rejected_total",
        "counter",
        "KV events the index rejected (unknown parent or block).",
        &|s| s.rejected.to_string(),
    );
    scalar(
        &mut out,
        "dynamo_router_kv_event_gaps_total",
        "counter",
        "KV event id gaps seen (each starts a recovery).",
        &|s| s.gaps.to_string(),
    );
    scalar(
        &mut out,
        "dynamo_router_kv_event_queue_depth",
        "gauge",
        "KV events received from the event plane and not yet applied.",
        &|s| s.queued.to_string(),
    );
    scalar(
        &mut out,
        "dynamo_router_kv_event_last_lag_seconds",
        "gauge",
        "Publish-to-applied lag of the last KV event applied.",
        &|s| s.last_lag_secs.to_string(),
    );
    let name = "dynamo_router_kv_event_lag_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Publish (envelope time) to applied lag of KV events."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (l, (_, s)) in labels.iter().zip(routers) {
        for (bound, count) in LAG_BUCKETS.iter().zip(s.lag_buckets) {
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {}", s.lag_count);
        let _ = writeln!(out, "{name}_sum{{{l}}} {}", s.lag_sum_secs);
        let _ = writeln!(out, "{name}_count{{{l}}} {}", s.lag_count);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_histogram_and_quantiles_read_sensibly() {
        let stats = KvEventStats::default();
        let now = 1_000_000;
        // 98 events applied within 1 ms, one 15 ms late, one 3 s late.
        for _ in 0..98 {
            stats.applied(4, now, now);
        }
        stats.applied(2, now - 15, now);
        stats.applied(1, now - 3_000, now);
        stats.applied(7, 0, now); // publish time unknown: counted, no lag
        stats.set_queued(5);
        let s = stats.snapshot();
        assert_eq!(
            (s.applied, s.blocks, s.queued),
            (101, 98 * 4 + 2 + 1 + 7, 5)
        );
        assert_eq!(s.lag_count, 100);
        assert!((s.last_lag_secs - 3.0).abs() < 1e-9);
        assert!((s.lag_sum_secs - 3.015).abs() < 1e-9);
        assert_eq!(s.lag_quantile_bound(0.5), 0.001);
        assert_eq!(s.lag_quantile_bound(0.99), 0.02);
        assert_eq!(s.lag_quantile_bound(1.0), 5.0);
        let text = render_prometheus(&[(("ns", "backend", "generate"), s)]);
        let l = "dynamo_namespace=\"ns\",dynamo_component=\"backend\",dynamo_endpoint=\"generate\"";
        for line in [
            format!("dynamo_router_kv_events_applied_total{{{l}}} 101"),
            format!("dynamo_router_kv_event_queue_depth{{{l}}} 5"),
            format!("dynamo_router_kv_event_lag_seconds_bucket{{{l},le=\"0.001\"}} 98"),
            format!("dynamo_router_kv_event_lag_seconds_bucket{{{l},le=\"0.02\"}} 99"),
            format!("dynamo_router_kv_event_lag_seconds_bucket{{{l},le=\"+Inf\"}} 100"),
            format!("dynamo_router_kv_event_lag_seconds_count{{{l}}} 100"),
            format!("dynamo_router_kv_event_last_lag_seconds{{{l}}} 3"),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        assert_eq!(text.matches("# TYPE ").count(), 7);
        assert!(render_prometheus(&[]).is_empty());
    }
}
