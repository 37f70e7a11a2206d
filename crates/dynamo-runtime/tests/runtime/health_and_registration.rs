//! Health-checked endpoints start not ready until they answer, and a process can publish
//! (and withdraw) its instance of an endpoint it does not serve.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::discovery::TransportAddress;
use dynamo_runtime::runtime::ServeOptions;
use dynamo_runtime::system::CanaryConfig;
use dynamo_runtime::transport::server::{Handler, Request, Responder};
use dynamo_runtime::{DistributedRuntime, EndpointId, RuntimeConfig};
use tokio_util::sync::CancellationToken;

fn unique(name: &str) -> EndpointId {
    EndpointId::parse(&format!("hr{:x}.{name}.generate", fastrand::u64(..))).expect("valid name")
}

/// Answers one item once `open`, else holds the request without answering.
struct Gated(Arc<AtomicBool>);

impl Handler for Gated {
    fn start(&self, _request: Request, mut out: Responder) {
        if self.0.load(Ordering::Acquire) {
            let _ = out.send(b"{}");
            out.finish();
        } else {
            // Never answers: the responder is parked until the caller gives up.
            tokio::spawn(async move {
                out.accept();
                tokio::time::sleep(Duration::from_secs(3600)).await;
                drop(out);
            });
        }
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what} not reached in 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_checked_endpoint_is_not_ready_until_a_canary_succeeds() {
    let config = RuntimeConfig {
        health_check_enabled: true,
        canary: CanaryConfig {
            wait: Duration::from_millis(100),
            timeout: Duration::from_millis(100),
        },
        ..RuntimeConfig::default()
    };
    let drt =
        DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp, config).expect("runtime");
    let ep = unique("canary");
    let open = Arc::new(AtomicBool::new(false));
    let options = ServeOptions {
        health_check_payload: Some(Bytes::from_static(b"{\"canary\":true}")),
        // The parked canaries must not hold the shutdown.
        graceful: false,
        ..ServeOptions::default()
    };
    let serving = {
        let (drt, ep, handler) = (drt.clone(), ep.clone(), Arc::new(Gated(Arc::clone(&open))));
        tokio::spawn(async move {
            drt.serve_endpoint_with(&ep, handler, options, CancellationToken::new())
                .await
        })
    };
    let health = Arc::clone(drt.health());
    eventually("endpoint listed", || {
        health.json()["endpoints"].get(ep.to_string()).is_some()
    })
    .await;
    // Several canary rounds time out: still not ready.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!health.is_ready(), "{}", health.json());
    open.store(true, Ordering::Release);
    eventually("ready after a successful canary", || health.is_ready()).await;
    drt.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(10), serving).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_an_unserved_endpoint_publishes_this_process_instance() {
    let drt = DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Tcp,
        RuntimeConfig::default(),
    )
    .expect("runtime");
    let ep = unique("leader");
    drt.register_endpoint_instance(&ep).await.expect("register");
    let listed = drt.discovery().list(&ep).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].instance_id, drt.connection_id());
    match &listed[0].transport {
        TransportAddress::Tcp(address) => assert!(address.ends_with(&ep.path()), "{address}"),
        other => panic!("unexpected transport {other:?}"),
    }
    let all = drt.all_instances().await.expect("all");
    assert!(all.iter().any(|i| i == &listed[0]));
    drt.unregister_endpoint_instance(&ep)
        .await
        .expect("unregister");
    assert!(drt.discovery().list(&ep).await.expect("list").is_empty());
    // Withdrawing what is not published is not an error.
    drt.unregister_endpoint_instance(&ep)
        .await
        .expect("unregister again");
    drt.shutdown();
}
