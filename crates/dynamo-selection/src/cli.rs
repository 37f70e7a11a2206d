//! Command lines of the standalone services (`python -m dynamo.select_service`,
//! `python -m dynamo.indexer`, `python -m dynamo.slot_tracker`), parsed with clap with the
//! reference's flags and defaults, and the code that starts each service.
//!
//! Peer recovery (`--peers`, `--indexer-peers`: [`super::recovery`]) and replica sync
//! (`--replica-sync-port`, `--replica-sync-peers`: [`super::replica`]) are started with the
//! service. Session affinity is parsed but refused at start-up with a "not supported yet"
//! error, rather than silently ignored.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_kv_router::scheduling::config::{KvRouterConfig, TrackingHash};
use tokio_util::sync::CancellationToken;

use super::cache::SelectionCacheConfig;
use super::catalog::WorkerRequest;
use super::http::{AccessLog, HttpState, select_router};
use super::recovery::{self, RecoveryMetrics};
use super::replica::{self, ReplicaHub};
use super::service::{SelectionService, ServiceOptions};

pub use clap::Error as ArgsError;
pub use clap::Parser;

/// Flags shared by the services that write an access log.
#[derive(Debug, Clone, clap::Args)]
pub struct AccessLogArgs {
    /// Write access log (JSON lines) to this file
    #[arg(long)]
    pub access_log: Option<String>,
    /// HTTP header name to extract trace-id from
    #[arg(long, default_value = "x-trace-id")]
    pub trace_id_header: String,
    /// Use local timezone for access log timestamps (default: UTC; accepted, timestamps are
    /// always written in UTC)
    #[arg(long)]
    pub access_log_local_time: bool,
}

/// `python -m dynamo.select_service`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "python -m dynamo.select_service",
    about = "Runtime-free Dynamo worker selection service"
)]
pub struct SelectArgs {
    /// HTTP server port
    #[arg(long, default_value_t = 8092)]
    pub port: u16,
    /// Address to bind
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// Number of KV indexer worker threads (queries run on the callers' threads against a
    /// shared index; accepted for compatibility)
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Comma-separated selector/indexer HTTP URLs used for startup KV recovery
    #[arg(long)]
    pub indexer_peers: Option<String>,
    /// Local ZMQ PUB port for active-load replica events
    #[arg(long)]
    pub replica_sync_port: Option<u16>,
    /// Comma-separated ZMQ PUB endpoints for peer selectors
    #[arg(long)]
    pub replica_sync_peers: Option<String>,
    /// Pin each session id (`session_id` on the request) to the worker that served it for
    /// this many seconds after its last request
    #[arg(long)]
    pub session_affinity_ttl_secs: Option<f64>,
    /// Seconds an unclaimed pending selection lives before eviction
    #[arg(long)]
    pub selection_cache_ttl_secs: Option<f64>,
    /// Maximum number of resident pending selections
    #[arg(long)]
    pub selection_cache_max_entries: Option<usize>,
    /// Approximate byte budget across resident pending selections
    #[arg(long)]
    pub selection_cache_max_bytes: Option<usize>,
    /// Assume KV cache reuse when deriving active-sequence identities
    #[arg(long, overrides_with = "no_router_assume_kv_reuse")]
    pub router_assume_kv_reuse: bool,
    /// Generate random active-sequence identities instead of assuming KV reuse
    #[arg(long)]
    pub no_router_assume_kv_reuse: bool,
    /// Hash function for router-derived active-sequence identities
    #[arg(long, value_parser = ["public-xxh3-v1", "keyed-xxh3-v1"])]
    pub router_tracking_hash: Option<String>,
    /// File containing the 32-byte provider tracking key
    #[arg(long)]
    pub router_tracking_key_file: Option<String>,
    /// Provider-managed tracking-key epoch identifier
    #[arg(long)]
    pub router_tracking_key_id: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub log: AccessLogArgs,
}

/// `python -m dynamo.indexer`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "python -m dynamo.indexer",
    about = "Standalone KV cache indexer"
)]
pub struct IndexerArgs {
    /// KV cache block size for initial workers registered via --workers
    #[arg(long)]
    pub block_size: Option<u32>,
    /// HTTP server port
    #[arg(long, default_value_t = 8090)]
    pub port: u16,
    /// Address to bind
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// Number of indexer threads (accepted for compatibility; queries share one index)
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Initial workers as "worker_id[:dp_rank]=zmq_address,..." (e.g.
    /// "1=tcp://host:5557,1:1=tcp://host:5558")
    #[arg(long)]
    pub workers: Option<String>,
    /// Model name for initial workers registered via --workers
    #[arg(long, default_value = "default")]
    pub model_name: String,
    /// Routing group for initial workers registered via --workers
    #[arg(long, default_value = "default")]
    pub routing_group: String,
    /// Comma-separated peer URLs for P2P recovery (e.g. "http://host1:8090,http://host2:8091")
    #[arg(long)]
    pub peers: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub log: AccessLogArgs,
}

/// `python -m dynamo.slot_tracker`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "python -m dynamo.slot_tracker",
    about = "Standalone KV router slot tracker"
)]
pub struct SlotTrackerArgs {
    /// HTTP server port
    #[arg(long, default_value_t = 8091)]
    pub port: u16,
    /// Address to bind
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// Local ZMQ PUB port for replica-sync events
    #[arg(long)]
    pub replica_sync_port: Option<u16>,
    /// Comma-separated ZMQ PUB endpoints for peer slot trackers
    #[arg(long)]
    pub replica_sync_peers: Option<String>,
}

/// Parse `argv` (without the program name) for `A`.
///
/// # Errors
/// clap's error (also for `--help`, whose "error" is the help text with exit code 0).
pub fn parse_args<A: Parser>(argv: &[String]) -> Result<A, clap::Error> {
    A::try_parse_from(std::iter::once(String::new()).chain(argv.iter().cloned()))
}

/// One `--workers` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Worker id.
    pub worker_id: u64,
    /// Rank.
    pub dp_rank: u32,
    /// ZMQ endpoint.
    pub endpoint: String,
}

/// Parse `"id[:dp]=tcp://...,..."`.
///
/// # Errors
/// A message naming the bad entry.
pub fn parse_workers(spec: &str) -> Result<Vec<WorkerSpec>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let (id, endpoint) = entry.split_once('=').ok_or_else(|| {
                format!("--workers entry {entry:?} is not worker_id[:dp_rank]=address")
            })?;
            let (id, rank) = id.split_once(':').unwrap_or((id, "0"));
            let worker_id = id
                .trim()
                .parse()
                .map_err(|_| format!("--workers entry {entry:?}: bad worker id {id:?}"))?;
            let dp_rank = rank
                .trim()
                .parse()
                .map_err(|_| format!("--workers entry {entry:?}: bad dp_rank {rank:?}"))?;
            super::catalog::zmq_tcp_address(endpoint.trim())
                .map_err(|e| format!("--workers entry {entry:?}: {e}"))?;
            Ok(WorkerSpec {
                worker_id,
                dp_rank,
                endpoint: endpoint.trim().to_owned(),
            })
        })
        .collect()
}

fn unsupported(flag: &str, given: bool) -> Result<(), String> {
    if given {
        return Err(format!(
            "{flag} is not supported yet by this implementation (session affinity of the \
             standalone services is not implemented); start without it"
        ));
    }
    Ok(())
}

/// The replica-sync peers of `--replica-sync-peers` (which needs `--replica-sync-port`).
fn sync_peers(
    port: Option<u16>,
    peers: Option<&str>,
) -> Result<Option<(u16, Vec<String>)>, String> {
    let peers = peers.map(replica::parse_peers).transpose()?;
    match (port, peers) {
        (None, Some(p)) if !p.is_empty() => {
            Err("--replica-sync-peers requires --replica-sync-port".to_owned())
        }
        (None, _) => Ok(None),
        (Some(port), p) => Ok(Some((port, p.unwrap_or_default()))),
    }
}

/// Start recovery from `--peers` / `--indexer-peers` (after the slow-joiner delay).
fn start_recovery(
    svc: &Arc<SelectionService>,
    peers: Option<&str>,
    handle: &tokio::runtime::Handle,
) -> Result<Option<Arc<RecoveryMetrics>>, String> {
    let Some(peers) = peers.map(recovery::parse_peer_urls).transpose()? else {
        return Ok(None);
    };
    Ok(Some(recovery::spawn(
        svc.clone(),
        peers,
        recovery::SLOW_JOINER_DELAY,
        handle,
    )))
}

/// A started service: stop it with [`Running::stop`], wait with [`Running::wait`].
pub struct Running {
    stop: CancellationToken,
    done: Mutex<mpsc::Receiver<Result<(), String>>>,
    /// The bound address.
    pub addr: SocketAddr,
    svc: Option<Arc<SelectionService>>,
}

impl Running {
    /// Ask the service to stop (graceful: in-flight requests finish).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Wait up to `timeout` for the service to end; `None` while it runs.
    pub fn wait(&self, timeout: Duration) -> Option<Result<(), String>> {
        let done = self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match done.recv_timeout(timeout) {
            Ok(r) => Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Ok(())),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(svc) = &self.svc {
            svc.shutdown();
        }
    }
}

fn start_router(
    handle: &tokio::runtime::Handle,
    host: &str,
    port: u16,
    router: axum::Router,
    svc: Option<Arc<SelectionService>>,
    hub: Option<Arc<ReplicaHub>>,
) -> Result<Running, String> {
    let listener = std::net::TcpListener::bind((host, port))
        .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    let stop = CancellationToken::new();
    let (tx, done) = mpsc::channel();
    let token = stop.clone();
    let svc2 = svc.clone();
    handle.spawn(async move {
        let r = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => axum::serve(l, router)
                .with_graceful_shutdown(token.cancelled_owned())
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        // Peers release our bookings now (goodbye) rather than at TTL expiry.
        if let Some(h) = hub {
            h.stop_and_wait(Duration::from_secs(2)).await;
        }
        if let Some(s) = svc2 {
            s.shutdown();
        }
        let _ = tx.send(r);
    });
    tracing::info!(%addr, "service listening");
    Ok(Running {
        stop,
        done: Mutex::new(done),
        addr,
        svc,
    })
}

fn access_log(args: &AccessLogArgs) -> Result<Option<AccessLog>, String> {
    args.access_log
        .as_deref()
        .map(|p| {
            AccessLog::open(p, &args.trace_id_header)
                .map_err(|e| format!("cannot open access log {p}: {e}"))
        })
        .transpose()
}

/// The router configuration of the select service's flags.
fn router_config(args: &SelectArgs) -> Result<KvRouterConfig, String> {
    // The DYN_ROUTER_* environment first; flags given on the command line win.
    let mut c = super::service::router_config_from_env(KvRouterConfig::default())?;
    if args.no_router_assume_kv_reuse {
        c.router_assume_kv_reuse = false;
    } else if args.router_assume_kv_reuse {
        c.router_assume_kv_reuse = true;
    }
    if let Some(h) = &args.router_tracking_hash {
        c.router_tracking_hash = serde_json::from_value::<TrackingHash>(serde_json::json!(h))
            .map_err(|e| format!("--router-tracking-hash: {e}"))?;
    }
    if args.router_tracking_key_file.is_some() {
        c.router_tracking_key_file
            .clone_from(&args.router_tracking_key_file);
    }
    if args.router_tracking_key_id.is_some() {
        c.router_tracking_key_id
            .clone_from(&args.router_tracking_key_id);
    }
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

/// Start the select service on `handle`.
///
/// # Errors
/// Unsupported flags, bad values, a port that cannot be bound.
pub fn start_select(args: &SelectArgs, handle: &tokio::runtime::Handle) -> Result<Running, String> {
    let sync = sync_peers(args.replica_sync_port, args.replica_sync_peers.as_deref())?;
    unsupported(
        "--session-affinity-ttl-secs",
        args.session_affinity_ttl_secs.is_some(),
    )?;
    let options = ServiceOptions {
        router: router_config(args)?,
        selection_cache: SelectionCacheConfig {
            ttl_secs: args.selection_cache_ttl_secs,
            max_entries: args.selection_cache_max_entries,
            max_bytes: args.selection_cache_max_bytes,
        },
    };
    let log = access_log(&args.log)?;
    let svc = Arc::new(SelectionService::new(options, handle.clone()).map_err(|e| e.message)?);
    let hub = match &sync {
        Some((port, peers)) => Some(
            svc.enable_replica_sync(&args.host, *port, peers)
                .map_err(|e| e.message)?,
        ),
        None => None,
    };
    let mut state = HttpState::new(svc.clone(), "dynamo_select_service", log);
    state.recovery = start_recovery(&svc, args.indexer_peers.as_deref(), handle)?;
    start_router(
        handle,
        &args.host,
        args.port,
        select_router(Arc::new(state)),
        Some(svc),
        hub,
    )
}

/// Start the KV indexer on `handle`, registering `--workers`.
///
/// # Errors
/// As [`start_select`]; a bad `--workers` list.
pub fn start_indexer(
    args: &IndexerArgs,
    handle: &tokio::runtime::Handle,
) -> Result<Running, String> {
    let peers = args
        .peers
        .as_deref()
        .map(recovery::parse_peer_urls)
        .transpose()?;
    let specs = args
        .workers
        .as_deref()
        .map(parse_workers)
        .transpose()?
        .unwrap_or_default();
    if !specs.is_empty() && args.block_size.is_none() {
        return Err("--workers needs --block-size".to_owned());
    }
    let svc = Arc::new(
        SelectionService::new(ServiceOptions::default(), handle.clone()).map_err(|e| e.message)?,
    );
    let mut by_worker: std::collections::BTreeMap<u64, WorkerRequest> = Default::default();
    for s in specs {
        let w = by_worker
            .entry(s.worker_id)
            .or_insert_with(|| WorkerRequest {
                worker_id: s.worker_id,
                model_name: Some(args.model_name.clone()),
                routing_group: Some(args.routing_group.clone()),
                block_size: args.block_size,
                kv_events_endpoints: Some(Default::default()),
                ..Default::default()
            });
        if let Some(m) = &mut w.kv_events_endpoints {
            m.insert(s.dp_rank, s.endpoint);
        }
    }
    for mut w in by_worker.into_values() {
        super::indexer::complete_for_indexing(&mut w);
        svc.upsert_worker(w).map_err(|e| e.message)?;
    }
    let mut state = HttpState::new(svc.clone(), "dynamo_kvindexer", access_log(&args.log)?);
    state.recovery =
        peers.map(|p| recovery::spawn(svc.clone(), p, recovery::SLOW_JOINER_DELAY, handle));
    start_router(
        handle,
        &args.host,
        args.port,
        super::indexer::router(Arc::new(state)),
        Some(svc),
        None,
    )
}

/// Start the slot tracker on `handle`.
///
/// # Errors
/// As [`start_select`].
pub fn start_slot_tracker(
    args: &SlotTrackerArgs,
    handle: &tokio::runtime::Handle,
) -> Result<Running, String> {
    let sync = sync_peers(args.replica_sync_port, args.replica_sync_peers.as_deref())?;
    // Stopped with the service (start_router waits for its goodbyes).
    let hub = sync
        .map(|(port, peers)| {
            replica::ReplicaHub::start(
                &replica::ReplicaSyncOptions::new(&args.host, port, peers),
                handle,
                CancellationToken::new(),
            )
        })
        .transpose()?;
    let tracker = match &hub {
        Some(h) => super::slots::SlotTracker::with_replica(h.clone()),
        None => super::slots::SlotTracker::default(),
    };
    let router = super::slots::router(Arc::new(tracker));
    start_router(handle, &args.host, args.port, router, None, hub.clone()).inspect_err(|_| {
        if let Some(h) = &hub {
            h.stop();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_spec_parses_ranks_and_rejects_garbage() {
        let w = parse_workers("1=tcp://h:5557, 1:1=tcp://h:5558,2=tcp://*:9").unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!((w[1].worker_id, w[1].dp_rank), (1, 1));
        assert_eq!(w[2].endpoint, "tcp://*:9");
        assert!(
            parse_workers("1tcp://h:1")
                .unwrap_err()
                .contains("worker_id")
        );
        assert!(
            parse_workers("x=tcp://h:1")
                .unwrap_err()
                .contains("bad worker id")
        );
        assert!(
            parse_workers("1=garbage")
                .unwrap_err()
                .contains("missing scheme")
        );
    }

    #[test]
    fn defaults_and_parse_errors() {
        let a: SelectArgs = parse_args(&[]).unwrap();
        assert_eq!((a.port, a.threads), (8092, 4));
        let a: IndexerArgs = parse_args(&[]).unwrap();
        assert_eq!((a.port, a.model_name.as_str()), (8090, "default"));
        let a: SlotTrackerArgs = parse_args(&[]).unwrap();
        assert_eq!(a.port, 8091);
        let e = parse_args::<SelectArgs>(&["--port".into(), "x".into()]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = parse_args::<SelectArgs>(&["--help".into()]).unwrap_err();
        assert_eq!(e.exit_code(), 0);
        assert!(e.to_string().contains("--selection-cache-max-bytes"));
    }

    #[test]
    fn replica_sync_peers_need_a_port() {
        assert_eq!(sync_peers(None, None).unwrap(), None);
        assert!(
            sync_peers(None, Some("h:1"))
                .unwrap_err()
                .contains("requires --replica-sync-port")
        );
        assert_eq!(
            sync_peers(Some(5), Some("h:1,tcp://g:2")).unwrap(),
            Some((5, vec!["tcp://h:1".to_owned(), "tcp://g:2".to_owned()]))
        );
        assert!(
            sync_peers(Some(5), Some("h"))
                .unwrap_err()
                .contains("no port")
        );
    }

    #[test]
    fn cache_flags_reach_the_options() {
        let a: SelectArgs = parse_args(&[
            "--selection-cache-ttl-secs".into(),
            "2.5".into(),
            "--no-router-assume-kv-reuse".into(),
        ])
        .unwrap();
        assert_eq!(a.selection_cache_ttl_secs, Some(2.5));
        assert!(!router_config(&a).unwrap().router_assume_kv_reuse);
    }
}
