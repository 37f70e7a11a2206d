//! A planner that closes the loop: it watches the workers' forward-pass metrics (and, when
//! configured, the frontend's TTFT/ITL histograms), decides how many workers each pool
//! needs with the load-based hysteresis policy of [`policy`], and publishes decisions
//! through the [`VirtualConnectorCoordinator`]; an environment (see
//! `examples/planner/`) carries them out and acknowledges them.
//!
//! Pools: aggregated (one pool, its count is `num_decode_workers`, as the reference's
//! virtual connector does for aggregated deployments) or disaggregated (prefill pool →
//! `num_prefill_workers`, decode pool → `num_decode_workers`).
//!
//! The worker count a controller starts from is the last decision when there is one (the
//! environment may still be starting workers), else the instances in discovery. A decision
//! skipped by the coordinator (the previous one not acknowledged yet) is retried every tick
//! until written.

pub mod policy;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dynamo_runtime::planner::{UNSET, VirtualConnectorCoordinator};
use dynamo_runtime::{DistributedRuntime, EndpointId};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::fpm::{ForwardPassMetrics, FpmSubscriber};
pub use policy::{Controller, Hysteresis};

/// Aggregated or disaggregated serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PlannerMode {
    /// One pool of aggregated workers.
    Agg,
    /// Prefill and decode pools.
    Disagg,
}

/// Planner settings: the flags of `python -m dynamo.planner` (each field's doc comment is
/// its `--help` text, its default that of [`PlannerConfig::default`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default)]
pub struct PlannerConfig {
    /// Dynamo namespace of the planner's decisions (`v1/{namespace}/planner/`) [default:
    /// $DYN_NAMESPACE, else dynamo]
    #[arg(long, default_value_t = PlannerConfig::default().namespace, hide_default_value = true)]
    pub namespace: String,
    /// `ns.component.endpoint` of the aggregated (or decode) workers [default:
    /// $DYN_NAMESPACE.backend.generate]
    #[arg(long, default_value_t = PlannerConfig::default().endpoint, hide_default_value = true)]
    pub endpoint: String,
    /// `ns.component.endpoint` of the prefill workers (disagg mode)
    #[arg(long)]
    pub prefill_endpoint: Option<String>,
    /// One pool of aggregated workers, or prefill and decode pools
    #[arg(long, value_enum, default_value_t = PlannerConfig::default().mode)]
    pub mode: PlannerMode,
    /// Time-to-first-token target, in milliseconds
    #[arg(long, default_value_t = PlannerConfig::default().ttft_ms)]
    pub ttft_ms: f64,
    /// Inter-token-latency target, in milliseconds
    #[arg(long, default_value_t = PlannerConfig::default().itl_ms)]
    pub itl_ms: f64,
    /// Seconds between two decisions
    #[arg(long, default_value_t = PlannerConfig::default().adjustment_interval_secs)]
    pub adjustment_interval_secs: f64,
    /// The frontend's metrics URL (`http://host:port/metrics`); without it TTFT and ITL are
    /// estimated from the workers' forward-pass metrics
    #[arg(long)]
    pub frontend_metrics_url: Option<String>,
    /// Prefix of the frontend's metric names
    #[arg(long, default_value_t = PlannerConfig::default().frontend_metrics_prefix)]
    pub frontend_metrics_prefix: String,
    /// Seconds between checks that a decision was acknowledged
    #[arg(long, default_value_t = PlannerConfig::default().check_interval_secs)]
    pub check_interval_secs: u64,
    /// Seconds an unacknowledged decision blocks the next one
    #[arg(long, default_value_t = PlannerConfig::default().max_wait_time_secs)]
    pub max_wait_time_secs: u64,
    /// Acknowledgement checks of one decision
    #[arg(long, default_value_t = PlannerConfig::default().max_retries)]
    pub max_retries: u32,
    /// Controller thresholds.
    #[serde(flatten)]
    #[command(flatten)]
    pub hysteresis: Hysteresis,
}

/// The whole command line of `python -m dynamo.planner`: the runtime's flags (read by the
/// Python entry point) and the planner's.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "python -m dynamo.planner",
    about = "The scaling planner: watches the workers' load, decides how many workers each \
             pool needs and publishes the decisions for an environment to carry out",
    after_help = PLANNER_ENVIRONMENT,
)]
pub struct PlannerCli {
    /// How workers are found: file, etcd or mem [default: $DYN_DISCOVERY_BACKEND, else etcd
    /// when $ETCD_ENDPOINTS is set, else file]
    #[arg(long)]
    pub discovery_backend: Option<String>,
    /// How requests reach workers: tcp or nats [default: $DYN_REQUEST_PLANE, else tcp]
    #[arg(long)]
    pub request_plane: Option<String>,
    /// The planner's own flags.
    #[command(flatten)]
    pub config: PlannerConfig,
}

const PLANNER_ENVIRONMENT: &str = "Environment:
  DYN_DISCOVERY_BACKEND  file, etcd or mem (default: etcd when ETCD_ENDPOINTS is set, else file)
  DYN_FILE_KV            directory of file discovery, shared by the processes of one machine
  ETCD_ENDPOINTS         etcd URLs, comma-separated (etcd discovery)
  DYN_REQUEST_PLANE      tcp or nats (default: tcp)
  NATS_SERVER            NATS URL (nats request plane, forward-pass metrics over NATS)
  DYN_NAMESPACE          default of --namespace and --endpoint (default: dynamo)
  DYN_LOG                log filter, e.g. info, debug (default: info)
  NO_COLOR               set: no colour in logs";

impl PlannerCli {
    /// Parse `argv` (without the program name).
    ///
    /// # Errors
    /// clap's error (also for `--help`, whose "error" is the help text with exit code 0).
    pub fn parse_args(argv: &[String]) -> std::result::Result<Self, clap::Error> {
        <Self as clap::Parser>::try_parse_from(
            std::iter::once(String::new()).chain(argv.iter().cloned()),
        )
    }
}

impl Default for PlannerConfig {
    fn default() -> Self {
        let ns = std::env::var("DYN_NAMESPACE").unwrap_or_else(|_| "dynamo".into());
        Self {
            endpoint: format!("{ns}.backend.generate"),
            namespace: ns,
            prefill_endpoint: None,
            mode: PlannerMode::Agg,
            ttft_ms: 500.0,
            itl_ms: 50.0,
            adjustment_interval_secs: 5.0,
            frontend_metrics_url: None,
            frontend_metrics_prefix: "dynamo_frontend".into(),
            check_interval_secs: 1,
            max_wait_time_secs: 30,
            max_retries: 3,
            hysteresis: Hysteresis::default(),
        }
    }
}

impl PlannerConfig {
    /// Parse the planner's `--flag value` arguments (the runtime's `--discovery-backend`
    /// and `--request-plane` are accepted and ignored here).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the flag: an unknown one, one without value, or a
    /// value of the wrong type.
    pub fn from_args(args: &[String]) -> Result<Self> {
        PlannerCli::parse_args(args)
            .map(|cli| cli.config)
            .map_err(|e| {
                let text = e.render().to_string();
                let first = text.lines().next().unwrap_or("invalid arguments");
                Error::config(
                    "planner arguments",
                    first.trim_start_matches("error: ").to_owned(),
                )
            })
    }
}

/// FPM aggregates of one pool over one interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// Snapshots received (heartbeats included).
    pub snapshots: u64,
    /// Passes that scheduled work, and their total duration (s).
    pub busy_passes: u64,
    /// Total duration of busy passes, seconds.
    pub busy_wall: f64,
    /// Prefill tokens computed, and the duration of the passes that computed them (s).
    pub prefill_tokens: u64,
    /// Duration of passes with prefill, seconds.
    pub prefill_wall: f64,
    /// Sum over snapshots of the queued prefill tokens.
    pub queued_prefill_tokens: u64,
    /// Sum over snapshots of the queued prefill requests.
    pub queued_prefill_requests: u64,
}

impl Window {
    /// Account for one snapshot.
    pub fn add(&mut self, m: &ForwardPassMetrics) {
        let s = &m.scheduled_requests;
        self.snapshots += 1;
        if s.num_prefill_requests + s.num_decode_requests > 0 {
            self.busy_passes += 1;
            self.busy_wall += m.wall_time;
        }
        if s.sum_prefill_tokens > 0 {
            self.prefill_tokens += s.sum_prefill_tokens;
            self.prefill_wall += m.wall_time;
        }
        self.queued_prefill_tokens += m.queued_requests.sum_prefill_tokens;
        self.queued_prefill_requests += m.queued_requests.num_prefill_requests;
    }

    /// Estimated ITL, seconds: the mean busy pass (0 when idle; None without data).
    pub fn itl(&self) -> Option<f64> {
        (self.snapshots > 0).then(|| {
            if self.busy_passes == 0 {
                0.0
            } else {
                self.busy_wall / self.busy_passes as f64
            }
        })
    }

    /// Estimated TTFT, seconds: a pass plus the mean queued prefill tokens over the
    /// measured prefill throughput. Requests queued with no prefill progress at all in the
    /// interval count as a wait of the whole `interval`.
    pub fn ttft(&self, interval: f64) -> Option<f64> {
        let itl = self.itl()?;
        let queued = self.queued_prefill_tokens as f64 / self.snapshots as f64;
        if queued <= 0.0 {
            return Some(itl);
        }
        if self.prefill_tokens == 0 || self.prefill_wall <= 0.0 {
            return Some(itl + interval);
        }
        let throughput = self.prefill_tokens as f64 / self.prefill_wall;
        Some(itl + queued / throughput)
    }
}

/// Mean TTFT and ITL (seconds) from two scrapes of the frontend's histograms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct FrontendTotals {
    ttft_sum: f64,
    ttft_count: f64,
    itl_sum: f64,
    itl_count: f64,
}

fn frontend_totals(text: &str, prefix: &str) -> FrontendTotals {
    let mut t = FrontendTotals::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let slot = match line[..name_end].strip_prefix(prefix) {
            Some("_time_to_first_token_seconds_sum") => &mut t.ttft_sum,
            Some("_time_to_first_token_seconds_count") => &mut t.ttft_count,
            Some("_inter_token_latency_seconds_sum") => &mut t.itl_sum,
            Some("_inter_token_latency_seconds_count") => &mut t.itl_count,
            _ => continue,
        };
        *slot += value;
    }
    t
}

/// GET `url` (`http://host:port/path`) with a short timeout.
async fn http_get(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::config("frontend_metrics_url", "must start with http://"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(host).await?;
        s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        std::io::Result::Ok(body)
    };
    let body = tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .map_err(|_| Error::Timeout(format!("GET {url}")))?
        .map_err(|e| Error::Runtime(format!("GET {url}: {e}")))?;
    Ok(body
        .split_once("\r\n\r\n")
        .map_or(body.as_str(), |(_, b)| b)
        .to_owned())
}

struct Pool {
    endpoint: EndpointId,
    window: Arc<Mutex<Window>>,
    controller: Controller,
    _subscriber: Arc<FpmSubscriber>,
}

impl Pool {
    fn start(runtime: &DistributedRuntime, endpoint: &str) -> Result<Self> {
        let endpoint =
            EndpointId::parse(endpoint).map_err(|e| Error::config("endpoint", e.to_string()))?;
        let subscriber = Arc::new(FpmSubscriber::new(runtime, &endpoint));
        let window = Arc::new(Mutex::new(Window::default()));
        let (sub, w) = (Arc::clone(&subscriber), Arc::clone(&window));
        tokio::spawn(async move {
            while let Ok(Some(bytes)) = sub.recv().await {
                if let Ok(m) = ForwardPassMetrics::decode(&bytes) {
                    w.lock().unwrap_or_else(PoisonError::into_inner).add(&m);
                }
            }
        });
        Ok(Self {
            endpoint,
            window,
            controller: Controller::default(),
            _subscriber: subscriber,
        })
    }

    fn take(&self) -> Window {
        std::mem::take(&mut *self.window.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Run the planner until the runtime stops.
///
/// # Errors
/// Invalid settings, or the connector state cannot be loaded.
pub async fn run(runtime: DistributedRuntime, config: PlannerConfig) -> Result<()> {
    let coordinator = VirtualConnectorCoordinator::new(
        &runtime,
        &config.namespace,
        Duration::from_secs(config.check_interval_secs),
        Duration::from_secs(config.max_wait_time_secs),
        config.max_retries,
    );
    coordinator
        .init()
        .await
        .map_err(|e| Error::Runtime(e.to_string()))?;
    let mut decode = Pool::start(&runtime, &config.endpoint)?;
    let mut prefill = match (config.mode, &config.prefill_endpoint) {
        (PlannerMode::Disagg, Some(ep)) => Some(Pool::start(&runtime, ep)?),
        (PlannerMode::Disagg, None) => {
            return Err(Error::config("prefill_endpoint", "required in disagg mode"));
        }
        (PlannerMode::Agg, _) => None,
    };
    let interval = config.adjustment_interval_secs.max(0.05);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(interval));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut last_frontend: Option<FrontendTotals> = None;
    let mut pending: Option<(Option<i64>, Option<i64>)> = None;
    tracing::info!(?config, "planner started");
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = runtime.stopped() => return Ok(()),
        }
        // Frontend means over the interval, when configured and reachable.
        let mut fe: Option<(Option<f64>, Option<f64>)> = None;
        if let Some(url) = &config.frontend_metrics_url {
            match http_get(url).await {
                Ok(text) => {
                    let now = frontend_totals(&text, &config.frontend_metrics_prefix);
                    if let Some(prev) = last_frontend {
                        let mean = |s: f64, c: f64| (c > 0.0).then(|| s / c);
                        fe = Some((
                            mean(
                                now.ttft_sum - prev.ttft_sum,
                                now.ttft_count - prev.ttft_count,
                            ),
                            mean(now.itl_sum - prev.itl_sum, now.itl_count - prev.itl_count),
                        ));
                    }
                    last_frontend = Some(now);
                }
                Err(e) => tracing::debug!(error = %e, "planner: frontend metrics unavailable"),
            }
        }
        let decided = coordinator.read_state();
        let ttft_target = config.ttft_ms / 1000.0;
        let itl_target = config.itl_ms / 1000.0;
        let mut ratios = |pool: &Pool| -> (Option<f64>, Option<f64>) {
            let w = pool.take();
            let ttft = fe.and_then(|f| f.0).or_else(|| w.ttft(interval));
            let itl = fe.and_then(|f| f.1).or_else(|| w.itl());
            (ttft.map(|t| t / ttft_target), itl.map(|t| t / itl_target))
        };
        let decode_ratios = ratios(&decode);
        let prefill_ratios = prefill.as_ref().map(&mut ratios);
        let mut want = pending.take().unwrap_or((None, None));
        let observed = |pool: &Pool| {
            let rt = runtime.clone();
            let ep = pool.endpoint.clone();
            async move {
                rt.discovery()
                    .list(&ep)
                    .await
                    .map(|l| u32::try_from(l.len()).unwrap_or(u32::MAX))
                    .unwrap_or(0)
            }
        };
        let current = |decided: i64, observed: u32| {
            if decided == UNSET {
                observed
            } else {
                u32::try_from(decided).unwrap_or(0)
            }
        };
        let n = current(decided.num_decode_workers, observed(&decode).await);
        let r = match prefill {
            None => max_ratio(decode_ratios.0, decode_ratios.1),
            Some(_) => decode_ratios.1,
        };
        if let Some(next) = decode.controller.tick(&config.hysteresis, n, r) {
            tracing::info!(pool = "decode", from = n, to = next, ratio = ?r, "planner: scaling");
            want.1 = Some(i64::from(next));
        }
        if let (Some(pool), Some(pr)) = (prefill.as_mut(), prefill_ratios) {
            let n = current(decided.num_prefill_workers, observed(pool).await);
            if let Some(next) = pool.controller.tick(&config.hysteresis, n, pr.0) {
                tracing::info!(pool = "prefill", from = n, to = next, ratio = ?pr.0, "planner: scaling");
                want.0 = Some(i64::from(next));
            }
        }
        if want != (None, None) {
            match coordinator.update_scaling_decision(want.0, want.1).await {
                Ok(true) => {
                    let d = coordinator.read_state();
                    tracing::info!(
                        decision_id = d.decision_id,
                        num_prefill_workers = d.num_prefill_workers,
                        num_decode_workers = d.num_decode_workers,
                        "planner: decision published"
                    );
                }
                Ok(false) => {
                    // Skipped (unacknowledged predecessor) or unchanged: retry next tick
                    // unless it already matches.
                    let d = coordinator.read_state();
                    let same = want.0.is_none_or(|p| p == d.num_prefill_workers)
                        && want.1.is_none_or(|x| x == d.num_decode_workers);
                    if !same {
                        pending = Some(want);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "planner: decision not published");
                    pending = Some(want);
                }
            }
        }
    }
}

fn max_ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fpm::FpmSample;

    #[test]
    fn args_parse_over_defaults_and_reject_unknown_flags() {
        let args: Vec<String> = [
            "--namespace",
            "ns",
            "--ttft-ms=250",
            "--mode",
            "disagg",
            "--prefill-endpoint",
            "ns.prefill.generate",
            "--max-workers",
            "4",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let c = PlannerConfig::from_args(&args).unwrap();
        assert_eq!(c.namespace, "ns");
        assert_eq!(c.ttft_ms, 250.0);
        assert_eq!(c.mode, PlannerMode::Disagg);
        assert_eq!(c.hysteresis.max_workers, 4);
        assert_eq!(c.itl_ms, 50.0);
        assert!(PlannerConfig::from_args(&["--bogus".into(), "1".into()]).is_err());
        assert!(PlannerConfig::from_args(&["--ttft-ms".into()]).is_err());
        assert!(PlannerConfig::from_args(&["--ttft-ms".into(), "fast".into()]).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn disaggregated_loop_scales_the_loaded_pool_only() {
        use dynamo_runtime::RuntimeConfig;
        use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
        use dynamo_runtime::planner::VirtualConnectorClient;

        use crate::fpm::FpmDirectPublisher;

        let drt = DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .unwrap();
        let ns = format!("pl{}", fastrand::u32(..));
        let prefill_ep = EndpointId::parse(&format!("{ns}.prefill.generate")).unwrap();
        let config = PlannerConfig {
            namespace: ns.clone(),
            endpoint: format!("{ns}.decode.generate"),
            prefill_endpoint: Some(prefill_ep.to_string()),
            mode: PlannerMode::Disagg,
            ttft_ms: 20.0,
            itl_ms: 1000.0,
            adjustment_interval_secs: 0.1,
            max_wait_time_secs: 30,
            ..PlannerConfig::default()
        };
        let planner = tokio::spawn(run(drt.clone(), config));
        // The environment: acknowledge every decision at once.
        let client = Arc::new(VirtualConnectorClient::new(&drt, &ns));
        let env = {
            let client = Arc::clone(&client);
            tokio::spawn(async move {
                while client.wait().await.is_ok() {
                    let d = client.get().await.unwrap();
                    client.complete(&d).await.unwrap();
                }
            })
        };
        // Load on the prefill pool: a long queue at 10k prefill tokens/s (TTFT ~110 ms).
        let publisher = FpmDirectPublisher::new(&drt, &prefill_ep, "1", 1);
        let loaded = FpmSample {
            scheduled_num_prefill_requests: 1,
            scheduled_sum_prefill_tokens: 100,
            queued_num_prefill_requests: 10,
            queued_sum_prefill_tokens: 1000,
            wall_time_secs: 0.01,
            ..FpmSample::default()
        };
        let mut peak = 0;
        for _ in 0..300 {
            publisher.publish(0, loaded.clone()).unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            let d = client.get().await.unwrap();
            peak = peak.max(d.num_prefill_workers);
            if peak >= 3 {
                break;
            }
        }
        assert!(peak >= 3, "prefill pool never scaled up");
        assert_eq!(client.get().await.unwrap().num_decode_workers, 1);
        // Idle (heartbeats only): back down to one prefill worker.
        let mut down = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if client.get().await.unwrap().num_prefill_workers == 1 {
                down = true;
                break;
            }
        }
        assert!(down, "prefill pool never scaled down");
        drt.shutdown();
        let _ = tokio::time::timeout(Duration::from_secs(5), planner).await;
        env.abort();
    }

    #[test]
    fn window_estimates_itl_and_ttft() {
        let mut w = Window::default();
        assert_eq!(w.itl(), None);
        let busy = FpmSample {
            scheduled_num_prefill_requests: 1,
            scheduled_sum_prefill_tokens: 1000,
            queued_num_prefill_requests: 2,
            queued_sum_prefill_tokens: 2000,
            wall_time_secs: 0.1,
            ..FpmSample::default()
        };
        w.add(&busy.snapshot("1", 0, 1));
        w.add(&FpmSample::default().snapshot("1", 0, 2));
        assert!((w.itl().unwrap() - 0.1).abs() < 1e-9);
        // Queue of 1000 tokens on average at 10k tokens/s: 0.1 s wait + 0.1 s pass.
        assert!((w.ttft(5.0).unwrap() - 0.2).abs() < 1e-9);
        let t = frontend_totals(
            "# TYPE x histogram\nfe_time_to_first_token_seconds_sum{model=\"m\"} 3\n\
             fe_time_to_first_token_seconds_count{model=\"m\"} 6\nfe_inter_token_latency_seconds_sum 1\n",
            "fe",
        );
        assert_eq!((t.ttft_sum, t.ttft_count, t.itl_sum), (3.0, 6.0, 1.0));
    }
}
