//! The frontend's KV mode end to end in one process: worker runtimes serving in-process
//! handlers, a frontend runtime driving [`WorkerStream`]s through a [`KvSelector`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::publisher::StoredInput;
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_llm::discovery::{ModelEntry, ModelServing};
use dynamo_llm::kv_routing::{KvEventPublisher, KvRouter, RouteOptions};
use dynamo_llm::model_card::{ModelInput, ModelType, RegisterModelArgs};
use dynamo_llm::preprocessor::PreprocessedRequest;
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::transport::{ErrorKind, WireError};
use dynamo_runtime::{Context, DistributedRuntime, EndpointId, Route, RuntimeConfig};
use tokio_util::sync::CancellationToken;

use super::KvSelector;
use crate::http::engine::{RoutedRequest, WorkerSelector, WorkerStream};
use crate::http::metrics::Metrics;

const BLOCK: u32 = 4;
/// `{"data": {"token_ids": [7]}}` in MessagePack (the request plane's codec).
const TOKEN: &[u8] = b"\x81\xa4data\x81\xa9token_ids\x91\x07";
/// `{"data": {"token_ids": [1, 2, 3, 4, 5, 6]}}` in MessagePack.
const SIX_TOKENS: &[u8] = b"\x81\xa4data\x81\xa9token_ids\x96\x01\x02\x03\x04\x05\x06";

/// How a test worker answers.
#[derive(Clone, Copy)]
enum Behaviour {
    /// One token at once, then hold until released (or stopped), then one more and end.
    TokenThenHold,
    /// Hold before the first token until released (or stopped), then one token and end.
    HoldThenToken,
    /// One token, then fail with `EngineShutdown`.
    TokenThenShutdown,
    /// Three items of six tokens each, then hold until released (or stopped), then end.
    BurstThenHold,
}

struct Worker {
    behaviour: Behaviour,
    started: Arc<AtomicUsize>,
    release: CancellationToken,
}

impl Handler for Worker {
    fn start(&self, request: Request, mut out: Responder) {
        self.started.fetch_add(1, Ordering::SeqCst);
        let (behaviour, release) = (self.behaviour, self.release.clone());
        tokio::spawn(async move {
            let ctx = request.context;
            // Accepted at once, as an engine that queues the request would.
            out.accept();
            if matches!(
                behaviour,
                Behaviour::TokenThenHold | Behaviour::TokenThenShutdown
            ) {
                let _ = out.send(TOKEN);
            }
            if matches!(behaviour, Behaviour::BurstThenHold) {
                for _ in 0..3 {
                    let _ = out.send(SIX_TOKENS);
                }
                tokio::select! {
                    () = release.cancelled() => {}
                    () = ctx.stopped() => return,
                }
                out.finish();
                return;
            }
            if matches!(behaviour, Behaviour::TokenThenShutdown) {
                out.fail(WireError::new(
                    ErrorKind::EngineShutdown,
                    "engine shutting down",
                    true,
                ));
                return;
            }
            tokio::select! {
                () = release.cancelled() => {}
                () = ctx.stopped() => return,
            }
            let _ = out.send(TOKEN);
            out.finish();
        });
    }
}

/// A runtime on the TCP request plane, or on NATS at `nats_port`.
fn runtime_on(nats_port: Option<u16>) -> DistributedRuntime {
    let Some(port) = nats_port else {
        return DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .unwrap();
    };
    DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Nats,
        RuntimeConfig {
            nats_server: format!("nats://127.0.0.1:{port}"),
            nats_server_set: true,
            ..RuntimeConfig::default()
        },
    )
    .unwrap()
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

struct Cluster {
    workers: Vec<DistributedRuntime>,
    started: Vec<Arc<AtomicUsize>>,
    release: CancellationToken,
    publishers: Vec<KvEventPublisher>,
    frontend: DistributedRuntime,
    model: Arc<ModelEntry>,
    selector: Arc<KvSelector>,
    router: Arc<KvRouter>,
    metrics: Arc<Metrics>,
}

impl Cluster {
    async fn start(behaviours: &[Behaviour], thresholds: LoadThresholds) -> Self {
        Self::with_config(behaviours, KvRouterConfig::default(), thresholds).await
    }

    async fn with_config(
        behaviours: &[Behaviour],
        config: KvRouterConfig,
        thresholds: LoadThresholds,
    ) -> Self {
        Self::build(behaviours, config, thresholds, None).await
    }

    async fn build(
        behaviours: &[Behaviour],
        config: KvRouterConfig,
        thresholds: LoadThresholds,
        nats_port: Option<u16>,
    ) -> Self {
        let ns = format!("kvsel{}", fastrand::u32(..));
        let ep = EndpointId::new(&ns, "backend", "generate").unwrap();
        let release = CancellationToken::new();
        let mut workers = Vec::new();
        let mut started = Vec::new();
        for &behaviour in behaviours {
            let w = runtime_on(nats_port);
            let count = Arc::new(AtomicUsize::new(0));
            let handler = Arc::new(Worker {
                behaviour,
                started: Arc::clone(&count),
                release: release.clone(),
            });
            let (w2, ep2) = (w.clone(), ep.clone());
            tokio::spawn(async move { w2.serve_endpoint(&ep2, handler, false).await });
            workers.push(w);
            started.push(count);
        }
        let publishers: Vec<KvEventPublisher> = workers
            .iter()
            .map(|w| {
                KvEventPublisher::new(
                    w,
                    &ep,
                    WorkerWithDpRank::new(w.connection_id(), 0),
                    BLOCK as usize,
                    true,
                )
                .unwrap()
            })
            .collect();
        let frontend = runtime_on(nats_port);
        let mut card = RegisterModelArgs {
            model_input: ModelInput::Tokens,
            model_type: ModelType::CHAT,
            model_path: concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../dynamo-llm/tests/data/tiny-model"
            )
            .into(),
            model_name: Some("tiny".into()),
            ..Default::default()
        }
        .build_card()
        .unwrap();
        card.kv_cache_block_size = BLOCK;
        let model = Arc::new(ModelEntry {
            name: "tiny".into(),
            card,
            endpoint: ep.clone(),
            client: frontend.client(&ep),
            preprocessor: None,
            created: 0,
            serving: ModelServing::new(None, workers.iter().map(|w| w.connection_id()).collect()),
        });
        let selector = Arc::new(KvSelector::new(frontend.clone(), config, thresholds));
        let router = selector.router(&model).unwrap();
        let n = behaviours.len();
        until("workers registered", || router.core().workers().len() == n).await;
        until("event subscriptions", || {
            publishers.iter().all(|p| p.subscriber_count() == 1)
        })
        .await;
        Self {
            workers,
            started,
            release,
            publishers,
            frontend,
            model,
            selector,
            router,
            metrics: Arc::new(Metrics::default()),
        }
    }

    fn id(&self, i: usize) -> u64 {
        self.workers[i].connection_id()
    }

    /// Worker `i` caches `prompt` (as its engine's KV events would say).
    async fn cache(&self, i: usize, prompt: &[u32]) {
        let n = prompt.len() / BLOCK as usize;
        let before = self.router.core().dump_events().len();
        self.publishers[i]
            .publish_stored(&StoredInput {
                token_ids: prompt[..n * BLOCK as usize].to_vec(),
                num_block_tokens: vec![BLOCK as usize; n],
                block_hashes: (0..n as i64).map(|b| 1000 * (i as i64 + 1) + b).collect(),
                ..Default::default()
            })
            .unwrap();
        until("stored blocks indexed", || {
            self.router.core().dump_events().len() == before + n
        })
        .await;
    }

    async fn open(&self, prompt: &[u32], migration_limit: u32) -> Result<WorkerStream, u16> {
        let request = PreprocessedRequest {
            model: "tiny".into(),
            token_ids: prompt.to_vec(),
            ..Default::default()
        };
        WorkerStream::open(
            Arc::clone(&self.model),
            Arc::clone(&self.selector) as Arc<dyn WorkerSelector>,
            Arc::clone(&self.metrics),
            request,
            Context::default(),
            migration_limit,
        )
        .await
        .map_err(|e| e.status)
    }

    /// `(active requests, active prefill tokens, decode blocks)` summed over the workers,
    /// as the scheduler books them (probed with a token sequence nobody caches).
    fn booked(&self) -> (u64, u64, u64) {
        let probe: Vec<u32> = (90_000..90_000 + BLOCK).collect();
        let loads = self
            .router
            .potential_loads(&probe, &RouteOptions::default())
            .unwrap();
        let n = loads.len() as u64;
        (
            loads.iter().map(|l| l.active_requests).sum(),
            loads
                .iter()
                .map(|l| l.potential_prefill_tokens)
                .sum::<u64>()
                - n * u64::from(BLOCK),
            loads.iter().map(|l| l.potential_decode_blocks).sum::<u64>() - n,
        )
    }

    fn started(&self) -> Vec<usize> {
        self.started
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect()
    }

    fn shutdown(self) {
        self.router.shutdown();
        for w in self.workers.iter().chain([&self.frontend]) {
            w.shutdown();
        }
    }
}

/// 32 blocks: long enough that its prefill load outweighs a 4-block cached prefix.
fn long_prompt() -> Vec<u32> {
    (0..128).collect()
}

#[test]
fn concurrent_requests_spread_by_load_and_bookings_return_to_zero() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let c = Cluster::start(
            &[Behaviour::TokenThenHold, Behaviour::TokenThenHold],
            LoadThresholds::default(),
        )
        .await;
        let prompt = long_prompt();
        // Worker 1 caches the first 4 blocks.
        c.cache(1, &prompt[..16]).await;
        assert_eq!(c.booked(), (0, 0, 0));

        // Without bookings every request would go to the prefix holder.
        let req = PreprocessedRequest {
            token_ids: prompt.clone(),
            ..Default::default()
        };
        for _ in 0..4 {
            let route = c
                .selector
                .select(&c.model, &c.model.client, &RoutedRequest::Tokens(&req));
            assert_eq!(route, Route::Direct(c.id(1)));
        }

        // Booked, four identical long requests spread over both workers.
        let mut streams = Vec::new();
        for i in 0..4 {
            streams.push(c.open(&prompt, 0).await.unwrap());
            let (active, prefill, _) = c.booked();
            assert_eq!(active, i + 1);
            assert!(prefill > 0, "the new request's prompt is booked as prefill");
        }
        until("all requests reached a worker", || {
            c.started().iter().sum::<usize>() == 4
        })
        .await;
        let started = c.started();
        assert!(
            started[1] >= 1,
            "the prefix holder gets requests: {started:?}"
        );
        assert!(started[0] >= 1, "load spreads requests: {started:?}");
        assert_eq!(
            started,
            vec![2, 2],
            "identical prompts alternate as prefill load builds"
        );
        let (_, _, decode_blocks) = c.booked();
        assert!(
            decode_blocks >= 2 * 32,
            "each worker books the prompt's 32 blocks"
        );

        // The first token ends every request's prefill.
        for s in &mut streams {
            assert_eq!(s.next().await.unwrap().unwrap().token_ids, vec![7]);
        }
        let (active, prefill, _) = c.booked();
        assert_eq!((active, prefill), (4, 0));

        // Client disconnects free their bookings at once.
        streams.truncate(2);
        assert_eq!(c.booked().0, 2);

        // Completed streams free theirs.
        c.release.cancel();
        for s in &mut streams {
            assert_eq!(s.next().await.unwrap().unwrap().token_ids, vec![7]);
            assert!(s.next().await.is_none());
        }
        assert_eq!(c.booked(), (0, 0, 0));
        drop(streams);
        assert_eq!(c.booked(), (0, 0, 0));
        c.shutdown();
    });
}

#[test]
fn migration_frees_the_old_booking_and_books_the_new_worker() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let c = Cluster::start(
            &[Behaviour::TokenThenShutdown, Behaviour::TokenThenHold],
            LoadThresholds::default(),
        )
        .await;
        let prompt = long_prompt();
        // The failing worker holds the prefix, so the request starts there and the
        // migrated attempt must not be drawn back to it.
        c.cache(0, &prompt).await;
        let mut stream = c.open(&prompt, 1).await.unwrap();
        assert_eq!(c.booked().0, 1);
        // The router's overlap on the chosen worker: the whole (block-aligned) prompt.
        assert_eq!(stream.router_cached_tokens(), Some(prompt.len() as u32));
        assert_eq!(stream.next().await.unwrap().unwrap().token_ids, vec![7]);
        // The shutdown migrates the request: worker 1 streams the rest.
        assert_eq!(stream.next().await.unwrap().unwrap().token_ids, vec![7]);
        // Usage reports the first attempt's overlap (its prompt is the client's prompt).
        assert_eq!(stream.router_cached_tokens(), Some(prompt.len() as u32));
        assert_eq!(c.started(), vec![1, 1]);
        assert_eq!(c.booked().0, 1, "only the new attempt is booked");
        assert!(
            c.metrics
                .render()
                .contains(r#"migration_type="ongoing_request"} 1"#)
        );
        c.release.cancel();
        assert_eq!(stream.next().await.unwrap().unwrap().token_ids, vec![7]);
        assert!(stream.next().await.is_none());
        assert_eq!(c.booked(), (0, 0, 0));

        c.shutdown();

        // Without migrations left the shutdown ends the stream with an error. (A fresh
        // cluster: the first one's frontend now knows worker 0 is shutting down and
        // routes around it.)
        let c = Cluster::start(
            &[Behaviour::TokenThenShutdown, Behaviour::TokenThenHold],
            LoadThresholds::default(),
        )
        .await;
        c.cache(0, &prompt).await;
        let mut stream = c.open(&prompt, 0).await.unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap().token_ids, vec![7]);
        assert!(stream.next().await.unwrap().is_err());
        assert!(stream.next().await.is_none());
        assert_eq!(c.booked(), (0, 0, 0));
        c.shutdown();
    });
}

#[test]
fn busy_workers_answer_529_and_missing_workers_503() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        // Busy as soon as any prompt is waiting for prefill.
        let thresholds = LoadThresholds {
            active_prefill_tokens_threshold: Some(0),
            ..Default::default()
        };
        let c = Cluster::start(
            &[Behaviour::HoldThenToken, Behaviour::HoldThenToken],
            thresholds,
        )
        .await;
        let prompt = long_prompt();
        let a = c.open(&prompt, 0).await.unwrap();
        let b = c.open(&prompt, 0).await.unwrap();
        assert_eq!(c.started().iter().sum::<usize>(), 2);
        assert_eq!(c.open(&prompt, 0).await.err(), Some(529));
        assert_eq!(c.booked().0, 2, "a rejected request books nothing");

        // A freed worker takes requests again.
        drop(a);
        let mut d = c.open(&prompt, 0).await.unwrap();
        drop(b);
        c.release.cancel();
        assert_eq!(d.next().await.unwrap().unwrap().token_ids, vec![7]);
        assert!(d.next().await.is_none());
        assert_eq!(c.booked(), (0, 0, 0));

        // No instance at all: 503 at once.
        for w in &c.workers {
            w.shutdown();
        }
        until("instances gone", || {
            c.model.client.instance_ids().is_empty()
        })
        .await;
        assert_eq!(c.open(&prompt, 0).await.err(), Some(503));
        c.shutdown();
    });
}

#[test]
fn output_blocks_are_booked_as_tokens_stream_and_freed_on_disconnect() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let config = KvRouterConfig {
            router_track_output_blocks: true,
            ..KvRouterConfig::default()
        };
        let c = Cluster::with_config(
            &[Behaviour::BurstThenHold],
            config,
            LoadThresholds::default(),
        )
        .await;
        let prompt = long_prompt();
        let mut stream = c.open(&prompt, 0).await.unwrap();
        assert_eq!(c.booked().2, 32, "the prompt's blocks");
        for _ in 0..3 {
            assert_eq!(stream.next().await.unwrap().unwrap().token_ids.len(), 6);
        }
        // 18 output tokens: four more full blocks of 4.
        assert_eq!(c.booked(), (1, 0, 32 + 4));
        drop(stream);
        assert_eq!(c.booked(), (0, 0, 0));
        c.shutdown();
    });
}

/// A worker killed with SIGKILL stays in discovery until its lease expires; its address
/// refuses or drops every connection. The first request routed there fails before any
/// output and is retried on the live worker although the migration limit is 0; the dead
/// worker is marked down for the runtime at once, so the KV router never picks it again
/// (even though it is the idle one), until discovery changes its entry.
#[test]
fn a_dead_worker_is_avoided_at_once_and_unsent_requests_retry_elsewhere() {
    use dynamo_runtime::discovery::{Instance, TransportAddress};
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let c = Cluster::start(&[Behaviour::TokenThenHold], LoadThresholds::default()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepts = Arc::new(AtomicUsize::new(0));
        tokio::spawn({
            let accepts = Arc::clone(&accepts);
            async move {
                while let Ok((sock, _)) = listener.accept().await {
                    accepts.fetch_add(1, Ordering::SeqCst);
                    drop(sock);
                }
            }
        });
        let ep = c.model.endpoint.clone();
        let dead = |port: u16| Instance {
            namespace: ep.namespace.clone(),
            component: ep.component.clone(),
            endpoint: ep.name.clone(),
            instance_id: 4242,
            transport: TransportAddress::Tcp(format!("127.0.0.1:{port}/{}", ep.path())),
            device_type: None,
            request_plane_codec: None,
        };
        // It serves the model as far as the frontend knows (as if it had registered it).
        let mut serving: std::collections::BTreeSet<u64> =
            c.workers.iter().map(|w| w.connection_id()).collect();
        serving.insert(4242);
        c.model.serving.set(None, serving);
        c.frontend
            .discovery()
            .register(&dead(addr.port()))
            .await
            .unwrap();
        until("dead worker known", || c.router.core().workers().len() == 2).await;
        // Held streams keep load on the live worker, so the idle dead one is the router's
        // choice whenever it is not known down.
        let prompt = long_prompt();
        let mut streams = Vec::new();
        for i in 0..20 {
            let mut s = c
                .open(&prompt, 0)
                .await
                .unwrap_or_else(|status| panic!("request {i} failed with {status}"));
            assert_eq!(s.next().await.unwrap().unwrap().token_ids, vec![7]);
            streams.push(s);
        }
        assert_eq!(
            accepts.load(Ordering::SeqCst),
            1,
            "the dead worker was tried once"
        );
        assert_eq!(c.model.client.down_instance_ids(), vec![4242]);
        assert_eq!(c.started(), vec![20]);
        assert!(
            !c.metrics
                .render()
                .contains("migration_type=\"new_request\"} 1")
        );
        // Discovery re-registers it with a changed entry: routable again at once.
        c.frontend
            .discovery()
            .unregister(&dead(addr.port()))
            .await
            .unwrap();
        c.frontend.discovery().register(&dead(1)).await.unwrap();
        until("changed entry is up", || {
            c.model.client.instances().iter().any(|i| i == &dead(1))
                && c.model.client.down_instance_ids().is_empty()
        })
        .await;
        c.release.cancel();
        drop(streams);
        c.shutdown();
    });
}

/// A nats-server process, killed when dropped (also when a test panics).
struct NatsServer(std::process::Child);

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A nats-server on `port` (loopback), ready to accept connections.
fn nats_server(port: u16) -> NatsServer {
    let child = std::process::Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nats-server is installed (scripts/test.sh)");
    let server = NatsServer(child);
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return server;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nats-server did not start");
}

/// On the NATS request plane a broker restart cuts the in-flight stream (its frames may
/// have died with the broker); with a migration left, the frontend's stream continues on
/// a worker from the tokens received so far, and the client sees one stream.
#[test]
fn a_nats_broker_restart_mid_stream_is_migrated() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let nats = nats_server(port);
        let c = Cluster::build(
            &[Behaviour::TokenThenHold, Behaviour::TokenThenHold],
            KvRouterConfig::default(),
            LoadThresholds::default(),
            Some(port),
        )
        .await;
        let prompt = long_prompt();
        let mut stream = c.open(&prompt, 1).await.unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap().token_ids, vec![7]);
        drop(nats);
        let nats = nats_server(port);
        // The cut stream migrates; the new attempt's worker sends its first token at once.
        let item = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("migrated in time")
            .unwrap()
            .expect("no error reaches the client");
        assert_eq!(item.token_ids, vec![7]);
        assert!(
            c.metrics
                .render()
                .contains(r#"migration_type="ongoing_request"} 1"#)
        );
        c.release.cancel();
        assert_eq!(stream.next().await.unwrap().unwrap().token_ids, vec![7]);
        assert!(stream.next().await.is_none());
        drop(stream);
        c.shutdown();
        drop(nats);
    });
}
