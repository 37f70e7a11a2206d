//! In-process tests: several runtimes with `mem` discovery in one process.

use std::sync::Arc;
use std::time::Duration;

use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::publisher::StoredInput;
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::{Context, DistributedRuntime, EndpointId, RuntimeConfig};
use tokio_util::sync::CancellationToken;

use super::{KvEventPublisher, KvRouter, RouteOptions, WorkerMetricsPublisher};

struct Echo;
impl Handler for Echo {
    fn start(&self, request: Request, mut out: Responder) {
        let _ = out.send(&request.body);
        let _ = out.send(b"2");
        out.finish();
    }
}

fn runtime() -> DistributedRuntime {
    DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Tcp,
        RuntimeConfig::default(),
    )
    .unwrap()
}

fn stored(tokens: &[u32], block: usize, base: i64) -> StoredInput {
    let n = tokens.len() / block;
    StoredInput {
        token_ids: tokens[..n * block].to_vec(),
        num_block_tokens: vec![block; n],
        block_hashes: (0..n as i64).map(|i| base + i).collect(),
        ..Default::default()
    }
}

/// One test's scene: an endpoint in a fresh namespace (so tests running side by side do
/// not see each other's workers) and a KV router over it with 4-token blocks, on its own
/// runtime.
struct Scene {
    ns: String,
    ep: EndpointId,
    router_rt: DistributedRuntime,
    router: Arc<KvRouter>,
}

impl Scene {
    /// Must be called inside the tokio runtime (the router starts its tasks).
    fn new(prefix: &str, component: &str, config: KvRouterConfig) -> Self {
        let ns = format!("{prefix}{}", fastrand::u32(..));
        let ep = EndpointId::new(&ns, component, "generate").unwrap();
        let router_rt = runtime();
        let router = KvRouter::new(&router_rt, &ep, 4, config, LoadThresholds::default()).unwrap();
        Self {
            ns,
            ep,
            router_rt,
            router,
        }
    }

    /// Serve the endpoint on `worker` with `handler` until `stop` is cancelled.
    fn serve(
        &self,
        worker: &DistributedRuntime,
        handler: Arc<dyn Handler>,
        stop: CancellationToken,
    ) {
        let (w, ep) = (worker.clone(), self.ep.clone());
        tokio::spawn(async move { w.serve_endpoint_until(&ep, handler, false, stop).await });
    }

    /// Stop the router, then `workers` and the router's runtime.
    fn shutdown(self, workers: &[DistributedRuntime]) {
        self.router.shutdown();
        for w in workers.iter().chain([&self.router_rt]) {
            w.shutdown();
        }
    }
}

async fn until(mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met within 2 s");
}

#[test]
fn routes_to_prefix_holder_recovers_and_forgets() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let scene = Scene::new("kvr", "backend", KvRouterConfig::default());
        let (ep, router) = (&scene.ep, &scene.router);
        let workers: Vec<DistributedRuntime> = (0..2).map(|_| runtime()).collect();
        let stops: Vec<CancellationToken> =
            workers.iter().map(|_| CancellationToken::new()).collect();
        for (w, stop) in workers.iter().zip(&stops) {
            scene.serve(w, Arc::new(Echo), stop.clone());
        }
        let pubs: Vec<KvEventPublisher> = workers
            .iter()
            .map(|w| {
                KvEventPublisher::new(w, ep, WorkerWithDpRank::new(w.connection_id(), 0), 4, true)
                    .unwrap()
            })
            .collect();
        assert!(router.wait_for_workers(Duration::from_secs(2)).await);
        until(|| router.core().workers().len() == 2).await;
        until(|| pubs.iter().all(|p| p.subscriber_count() == 1)).await;

        // Worker 1 holds the prompt's prefix.
        let prompt: Vec<u32> = (0..32).collect();
        pubs[1].publish_stored(&stored(&prompt, 4, 100)).unwrap();
        let w1 = workers[1].connection_id();
        until(|| router.core().dump_events().len() == 8).await;
        let sel = router
            .route(&prompt, &RouteOptions::default())
            .await
            .unwrap();
        assert_eq!(sel.worker.worker_id, w1);
        assert_eq!(sel.overlap_blocks, 8);

        // Loads rise with a booking and fall after free.
        let opts = RouteOptions {
            request_id: Some("r1".into()),
            ..Default::default()
        };
        let sel = router.route(&prompt, &opts).await.unwrap();
        let load = |r: &KvRouter| {
            r.potential_loads(&prompt, &RouteOptions::default())
                .unwrap()
                .into_iter()
                .find(|l| l.worker == sel.worker)
                .unwrap()
                .active_requests
        };
        assert_eq!(load(router), 1);
        router.free("r1").unwrap();
        assert_eq!(load(router), 0);

        // generate: dispatched to the chosen worker, booking released at the end.
        let mut stream = router
            .generate(
                &prompt,
                "1".into(),
                RouteOptions::default(),
                Context::default(),
            )
            .await
            .unwrap();
        assert_eq!(stream.selection().worker.worker_id, w1);
        assert_eq!(load(router), 1);
        assert_eq!(&stream.next().await.unwrap().unwrap()[..], b"1");
        assert_eq!(&stream.next().await.unwrap().unwrap()[..], b"2");
        assert!(stream.next().await.is_none());
        assert_eq!(load(router), 0);
        drop(stream);

        // Lost events are recovered from the worker-local indexer.
        pubs[0].drop_next_events(1);
        let other: Vec<u32> = (1000..1016).collect();
        pubs[0].publish_stored(&stored(&other, 4, 500)).unwrap();
        let more: Vec<u32> = (2000..2008).collect();
        pubs[0].publish_stored(&stored(&more, 4, 900)).unwrap();
        until(|| router.core().dump_events().len() == 8 + 4 + 2).await;
        let sel = router
            .route(&other, &RouteOptions::default())
            .await
            .unwrap();
        assert_eq!(sel.worker.worker_id, workers[0].connection_id());
        assert_eq!(sel.overlap_blocks, 4);

        // Metrics reach the scheduler (no panic, rank known).
        let metrics =
            WorkerMetricsPublisher::new(&workers[0], ep, workers[0].connection_id()).unwrap();
        until(|| metrics.subscriber_count() == 1).await;
        metrics.publish(0, Some(3), Some(3));

        // A worker that leaves discovery vanishes from scores.
        stops[1].cancel();
        until(|| router.core().workers().len() == 1).await;
        drop(pubs);
        until(|| {
            router
                .core()
                .dump_events()
                .iter()
                .all(|e| e.worker_id != w1)
        })
        .await;
        let sel = router
            .route(&prompt, &RouteOptions::default())
            .await
            .unwrap();
        assert_eq!(sel.overlap_blocks, 0);

        scene.shutdown(&workers);
    });
}

struct Tokens;
impl Handler for Tokens {
    fn start(&self, _request: Request, mut out: Responder) {
        for _ in 0..3 {
            // `{"data": {"token_ids": [1, 2, 3, 4, 5, 6]}}` in MessagePack.
            let _ = out.send(b"\x81\xa4data\x81\xa9token_ids\x96\x01\x02\x03\x04\x05\x06");
        }
        out.finish();
    }
}

#[test]
fn output_blocks_are_tracked_while_streaming() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let config = KvRouterConfig {
            router_track_output_blocks: true,
            ..KvRouterConfig::default()
        };
        let scene = Scene::new("kvo", "backend", config);
        let router = &scene.router;
        let worker = runtime();
        scene.serve(&worker, Arc::new(Tokens), CancellationToken::new());
        assert!(router.wait_for_workers(Duration::from_secs(2)).await);
        let prompt: Vec<u32> = (0..8).collect();
        let decode_blocks = |r: &KvRouter| {
            r.potential_loads(&(100..104).collect::<Vec<u32>>(), &RouteOptions::default())
                .unwrap()[0]
                .potential_decode_blocks
        };
        let idle = decode_blocks(router);
        let mut stream = router
            .generate(
                &prompt,
                "{}".into(),
                RouteOptions::default(),
                Context::default(),
            )
            .await
            .unwrap();
        let booked = decode_blocks(router);
        assert_eq!(booked, idle + 2, "two prompt blocks booked");
        for _ in 0..3 {
            stream.next().await.unwrap().unwrap();
        }
        // 18 output tokens: four more full blocks of 4.
        assert_eq!(decode_blocks(router), booked + 4);
        assert!(stream.next().await.is_none());
        assert_eq!(decode_blocks(router), idle);
        scene.shutdown(&[worker]);
    });
}

#[test]
fn block_manager_prefixes_reach_the_router() {
    use dynamo_block_manager::{
        DType, KvBlockManager, KvBlockManagerConfig, KvbmRequest, Tier, TokenBlock,
    };

    use super::BlockManagerEventSink;

    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let scene = Scene::new("kvbm", "backend", KvRouterConfig::default());
        let (ep, router) = (&scene.ep, &scene.router);
        let worker = runtime();
        scene.serve(&worker, Arc::new(Echo), CancellationToken::new());
        assert!(router.wait_for_workers(Duration::from_secs(2)).await);

        let id = worker.connection_id();
        let publisher = Arc::new(
            KvEventPublisher::new_raw(&worker, ep, WorkerWithDpRank::new(id, 0), false).unwrap(),
        );
        // Events published before the router's subscription connects are not replayed
        // (no worker-local indexer here): wait for it.
        until(|| publisher.subscriber_count() == 1).await;
        // A host pool of exactly two 4-token blocks (system memory without CUDA).
        let config = KvBlockManagerConfig::standard(id, 1, 2, 4, 8, DType::Fp16, Some(2), None, 0);
        let manager =
            KvBlockManager::new(config, BlockManagerEventSink::new(Arc::clone(&publisher)))
                .unwrap();
        let prompt: Vec<u32> = (0..8).collect();
        let mut blocks = manager.allocate_blocks(Tier::Host, 2).unwrap();
        for (b, tb) in blocks
            .iter_mut()
            .zip(TokenBlock::split(&prompt, 4, &KvbmRequest::default()))
        {
            b.apply_token_block(tb).unwrap();
        }
        let registered = manager.register_host_blocks(blocks).unwrap();
        let overlap = || {
            let r = Arc::clone(router);
            let p = prompt.clone();
            async move {
                r.route(&p, &RouteOptions::default())
                    .await
                    .unwrap()
                    .overlap_blocks
            }
        };
        for _ in 0..200 {
            if overlap().await == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(overlap().await, 2, "the router sees both registered blocks");

        // Released blocks stay cached; reallocating the whole pool evicts them, which the
        // router hears as Removed.
        drop(registered);
        assert_eq!(overlap().await, 2);
        let _fresh = manager.allocate_blocks(Tier::Host, 2).unwrap();
        for _ in 0..200 {
            if overlap().await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            overlap().await,
            0,
            "evicted prefixes leave the router's index"
        );
        scene.shutdown(&[worker]);
    });
}

/// The router's KV event counters and lag metric follow what was published: every event
/// and block counted once, nothing left queued, lags within the 1-second bucket on an
/// idle loopback, and the Prometheus text shows the same numbers.
#[test]
fn event_stats_count_applied_events_and_lag() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let scene = Scene::new("kvl", "backend", KvRouterConfig::default());
        let (ns, ep, router) = (&scene.ns, &scene.ep, &scene.router);
        let worker = runtime();
        let publisher =
            KvEventPublisher::new(&worker, ep, WorkerWithDpRank::new(7, 0), 4, false).unwrap();
        assert_eq!(router.event_stats().snapshot().applied, 0);
        until(|| publisher.subscriber_count() == 1).await;

        // 20 stored events of 3 blocks each (ids 0..20), then one removal of 2 blocks.
        for i in 0..20u32 {
            let tokens: Vec<u32> = (i * 1000..i * 1000 + 12).collect();
            publisher
                .publish_stored(&stored(&tokens, 4, i64::from(i) * 10))
                .unwrap();
        }
        publisher.publish_removed(&[192, 191]).unwrap();
        until(|| router.event_stats().snapshot().applied == 21).await;
        let s = router.event_stats().snapshot();
        assert_eq!((s.blocks, s.rejected, s.gaps, s.queued), (62, 0, 0, 0));
        assert_eq!(s.lag_count, 21);
        assert!(s.last_lag_secs < 1.0, "{s:?}");
        assert!(s.lag_quantile_bound(1.0) <= 1.0, "{s:?}");
        assert!(s.lag_sum_secs < 21.0);

        let text = super::event_stats::render_prometheus(&[(
            (ep.namespace.as_str(), ep.component.as_str(), ep.name.as_str()),
            s,
        )]);
        assert!(
            text.contains(&format!(
                "dynamo_router_kv_events_applied_total{{dynamo_namespace=\"{ns}\",dynamo_component=\"backend\",dynamo_endpoint=\"generate\"}} 21"
            )),
            "{text}"
        );
        assert!(text.contains("dynamo_router_kv_event_lag_seconds_count{"), "{text}");

        scene.shutdown(&[worker]);
    });
}

/// A topic is wanted before its publisher is set up: what is published then queues for it.
#[test]
fn topic_wanted_before_its_publisher_is_set_up() {
    // A current-thread runtime runs the set-up task only at the first await, so the
    // topic is observed before it (on a multi-threaded one the task races the check).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ns = format!("tb{}", fastrand::u32(..));
        let drt = runtime();
        let topic = super::bus::TopicPublisher::new(&drt, &ns, "c", "t").unwrap();
        assert!(topic.wanted(), "not set up yet: payloads must queue");
        assert_eq!(topic.subscriber_count(), 0);
    });
}

/// A topic over the brokerless plane is wanted while its publisher is being set up (what
/// is published then queues for it) and while a subscriber is connected, and not when
/// nobody listens: payloads are then dropped before they are queued or encoded.
#[test]
fn topic_wanted_only_while_someone_can_receive() {
    use super::bus::{TopicMessage, TopicPublisher, subscribe};

    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        let ns = format!("tw{}", fastrand::u32(..));
        let (publisher_rt, subscriber_rt) = (runtime(), runtime());
        let topic = TopicPublisher::new(&publisher_rt, &ns, "c", "t").unwrap();
        // Whether it is wanted before its set-up task has run is the test above's (on a
        // current-thread runtime): on this one that task may already have finished.
        // Set up, nobody subscribed: not wanted, and a payload is dropped.
        tokio::time::timeout(Duration::from_secs(5), async {
            while topic.wanted() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the publisher never came up");
        topic.publish(bytes::Bytes::from_static(b"lost"));
        let stop = CancellationToken::new();
        let mut rx = subscribe(&subscriber_rt, &ns, "c", "t", stop.clone()).unwrap();
        until(|| topic.subscriber_count() == 1).await;
        assert!(topic.wanted());
        topic.publish(bytes::Bytes::from_static(b"kept"));
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("no message")
            .expect("subscription ended");
        let TopicMessage::Payload { payload, .. } = got;
        assert_eq!(&payload[..], b"kept");
        stop.cancel();
        drop(rx);
        until(|| !topic.wanted()).await;
        publisher_rt.shutdown();
        subscriber_rt.shutdown();
    });
}
