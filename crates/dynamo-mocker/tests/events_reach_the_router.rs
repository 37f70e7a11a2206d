//! A mocker's KV events and load reach a KV router in another runtime of the same process
//! (`mem` discovery, TCP request plane): the router then sends the prompt to the worker that
//! holds its blocks.

use std::sync::Arc;
use std::time::Duration;

use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::publisher::StoredInput;
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::LoadThresholds;
use dynamo_llm::kv_routing::{KvEventPublisher, KvRouter, RouteOptions, WorkerMetricsPublisher};
use dynamo_mocker::runner::MockEngineRunner;
use dynamo_mocker::{MockEngineArgs, MockRequest};
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::{DistributedRuntime, EndpointId, RuntimeConfig};

/// Answers every request with its body: the routing decision is what is under test.
struct Echo;
impl Handler for Echo {
    fn start(&self, request: Request, mut out: Responder) {
        let _ = out.send(&request.body);
        out.finish();
    }
}

fn runtime() -> DistributedRuntime {
    DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Tcp,
        RuntimeConfig::default(),
    )
    .expect("an in-process runtime")
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
fn mocker_events_reach_the_router() {
    let rt = dynamo_runtime::tokio_runtime().unwrap();
    rt.block_on(async {
        // A namespace of its own: the mem store is shared by the whole process.
        let ns = format!("kvm{}", fastrand::u32(..));
        let ep = EndpointId::new(&ns, "mocker", "generate").unwrap();
        let router_rt = runtime();
        let router = KvRouter::new(
            &router_rt,
            &ep,
            4,
            KvRouterConfig::default(),
            LoadThresholds::default(),
        )
        .unwrap();
        let workers: Vec<DistributedRuntime> = (0..2).map(|_| runtime()).collect();
        for w in &workers {
            let (w, ep) = (w.clone(), ep.clone());
            tokio::spawn(async move { w.serve_endpoint(&ep, Arc::new(Echo), false).await });
        }
        until(|| router.core().workers().len() == 2).await;
        let w1 = &workers[1];
        let publisher = Arc::new(
            KvEventPublisher::new_raw(w1, &ep, WorkerWithDpRank::new(w1.connection_id(), 0), true)
                .unwrap(),
        );
        until(|| publisher.subscriber_count() == 1).await;
        let metrics = WorkerMetricsPublisher::new(w1, &ep, w1.connection_id()).unwrap();
        until(|| metrics.subscriber_count() == 1).await;
        let args = MockEngineArgs {
            block_size: 4,
            speedup_ratio: 1000.0,
            ..Default::default()
        };
        let engine = MockEngineRunner::spawn(args, publisher.event_sink()).unwrap();
        dynamo_mocker::publish::follow_load(&metrics, 0, engine.watch_metrics());
        let prompt: Vec<u32> = (0..32).collect();
        let mut out = engine
            .submit(MockRequest::new("m1", prompt.clone(), 2))
            .await
            .unwrap();
        while out.recv().await.is_some() {}
        until(|| {
            router
                .core()
                .dump_events()
                .iter()
                .filter(|e| e.worker_id == w1.connection_id())
                .count()
                >= 8
        })
        .await;
        let sel = router
            .route(&prompt, &RouteOptions::default())
            .await
            .unwrap();
        assert_eq!(sel.worker.worker_id, w1.connection_id());
        assert_eq!(sel.overlap_blocks, 8);
        assert!(publisher.next_event_id() > 0);
        // A raw publisher numbers the engine's own events; token-level input is refused.
        let stored = StoredInput {
            token_ids: prompt.clone(),
            num_block_tokens: vec![4; 8],
            block_hashes: (1..=8).collect(),
            ..Default::default()
        };
        assert!(publisher.publish_stored(&stored).is_err());
        router.shutdown();
        for w in workers.iter().chain([&router_rt]) {
            w.shutdown();
        }
    });
}
