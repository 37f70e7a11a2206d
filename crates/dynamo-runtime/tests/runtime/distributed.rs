//! Distributed backends against real servers started by the test on free loopback ports:
//! `nats-server` (event plane over NATS, reconnection and gap detection, payload limit) and
//! `etcd` (discovery with a lease, event channels advertised in etcd).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_runtime::config::{DiscoveryBackend, EventPlane, RequestPlane};
use dynamo_runtime::events::{EventScope, EventSubscriber};
use dynamo_runtime::{DistributedRuntime, EndpointId, RuntimeConfig};

use crate::common::{WAIT, etcd_server, free_port, nats_server};

fn nats_config(port: u16) -> RuntimeConfig {
    RuntimeConfig {
        event_plane: Some(EventPlane::Nats),
        nats_server: format!("nats://127.0.0.1:{port}"),
        nats_server_set: true,
        ..RuntimeConfig::default()
    }
}

async fn next(sub: &mut EventSubscriber) -> dynamo_runtime::events::Event {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("event in time")
        .expect("subscription open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_events_survive_a_server_restart_with_the_gap_detected() {
    let mut server = nats_server(&[]);
    let a = DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Tcp,
        nats_config(server.port),
    )
    .unwrap();
    let b = DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Tcp,
        nats_config(server.port),
    )
    .unwrap();
    assert_eq!(a.event_plane(), EventPlane::Nats);
    let scope = EventScope::component("natsev", "backend");
    let mut sub = b.subscribe(&scope, "kv-events").await.unwrap();
    let publisher = a.event_publisher(&scope, "kv-events").await.unwrap();
    assert_eq!(
        publisher.subject(),
        "namespace.natsev.component.backend.kv-events"
    );
    for i in 0..10u8 {
        publisher.publish([i]).unwrap();
    }
    publisher.flush().await.unwrap();
    for i in 0..10u64 {
        let e = next(&mut sub).await;
        assert_eq!((e.sequence, e.missed_before), (i, 0));
    }

    // The server goes away: events published meanwhile are lost.
    server.stop();
    let deadline = Instant::now() + WAIT;
    while publisher.dropped() < 5 {
        assert!(
            Instant::now() < deadline,
            "publisher never noticed the outage"
        );
        publisher.publish(b"lost").unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart();

    // Both clients reconnect by themselves; the subscriber sees the gap. A "lost" event
    // published before the client noticed the outage may still sit in its write buffer and
    // arrive after the reconnect: it is delivered, not missed.
    let mut late = 0u64;
    let e = tokio::time::timeout(WAIT, async {
        loop {
            publisher.publish(b"back").unwrap();
            tokio::select! {
                e = sub.next() => {
                    let e = e.expect("subscription open");
                    if e.payload.as_ref() == b"lost" {
                        late += 1;
                        continue;
                    }
                    break e;
                }
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    })
    .await
    .expect("events flow again after the restart");
    assert!(e.sequence >= 15 && e.missed_before >= 5, "{e:?}");
    assert!(sub.gaps() >= 1);
    assert_eq!(sub.stats().missed(), e.sequence - 10 - late);
    for rt in [a, b] {
        rt.shutdown();
        tokio::time::timeout(WAIT, rt.stopped()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_payloads_over_max_payload_fail_with_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, "max_payload: 4096\n").unwrap();
    let server = nats_server(&["-c", conf.to_str().unwrap()]);
    let rt = DistributedRuntime::new(
        DiscoveryBackend::Mem,
        RequestPlane::Tcp,
        nats_config(server.port),
    )
    .unwrap();
    let publisher = rt
        .event_publisher(&EventScope::namespace("big"), "t")
        .await
        .unwrap();
    let err = publisher.publish(vec![0u8; 8192]).unwrap_err().to_string();
    assert!(err.contains("max_payload of 4096 bytes"), "{err}");
    assert!(publisher.publish(vec![0u8; 1024]).is_ok());
    rt.shutdown();
    rt.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_nats_is_a_clear_error() {
    let port = free_port();
    let rt = DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp, nats_config(port))
        .unwrap();
    let err = rt
        .subscribe(&EventScope::namespace("x"), "t")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot connect to NATS") && err.contains("NATS_SERVER"),
        "{err}"
    );
    rt.shutdown();
}

fn etcd_config(port: u16, ttl: u64) -> RuntimeConfig {
    RuntimeConfig {
        etcd_endpoints: vec![format!("http://127.0.0.1:{port}")],
        etcd_endpoints_set: true,
        etcd_lease_ttl: Duration::from_secs(ttl),
        ..RuntimeConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_discovery_leases_kv_store_and_event_channels() {
    let etcd = etcd_server();
    let connect = || {
        DistributedRuntime::connect(
            DiscoveryBackend::Etcd,
            RequestPlane::Tcp,
            etcd_config(etcd.port, 2),
        )
    };
    let a = connect().await.unwrap();
    let b = connect().await.unwrap();
    assert_ne!(a.connection_id(), b.connection_id());
    // Brokerless events, publishers advertised in etcd.
    assert_eq!(a.event_plane(), EventPlane::Tcp);
    let scope = EventScope::endpoint(&EndpointId::parse("etcdns.comp.gen").unwrap());
    let mut sub = b.subscribe(&scope, "load").await.unwrap();
    let publisher = a.event_publisher(&scope, "load").await.unwrap();
    tokio::time::timeout(WAIT, sub.wait_for_publishers(1))
        .await
        .unwrap();
    publisher.publish_value(&42u32).unwrap();
    assert_eq!(next(&mut sub).await.decode::<u32>().unwrap(), 42);

    // The generic KV store: keys carry the lease and are listed by prefix.
    let key = format!("v1/mdc/etcdns/comp/gen/{:x}", a.connection_id());
    a.kv_store().put(&key, "{\"card\":1}").await.unwrap();
    let listed = b.kv_store().list("v1/mdc/etcdns/").await.unwrap();
    assert_eq!(listed, vec![(key.clone(), "{\"card\":1}".to_owned())]);

    // Shutting `a` down revokes its lease: its keys and its channel are gone at once.
    a.shutdown();
    tokio::time::timeout(WAIT, a.stopped()).await.unwrap();
    assert!(
        b.kv_store()
            .list("v1/mdc/etcdns/")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        b.kv_store()
            .list(&scope.channel_prefix("load"))
            .await
            .unwrap()
            .is_empty()
    );
    b.shutdown();
    tokio::time::timeout(WAIT, b.stopped()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_etcd_lease_shuts_the_runtime_down() {
    let mut etcd = etcd_server();
    let rt = DistributedRuntime::connect(
        DiscoveryBackend::Etcd,
        RequestPlane::Tcp,
        etcd_config(etcd.port, 1),
    )
    .await
    .unwrap();
    etcd.stop();
    let started = Instant::now();
    tokio::time::timeout(WAIT, rt.stopped())
        .await
        .expect("runtime shut down after losing its lease");
    assert!(rt.is_shutting_down());
    assert!(started.elapsed() < Duration::from_secs(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_etcd_is_a_clear_error() {
    let port = free_port();
    let err = DistributedRuntime::connect(
        DiscoveryBackend::Etcd,
        RequestPlane::Tcp,
        etcd_config(port, 2),
    )
    .await
    .err()
    .expect("no etcd there")
    .to_string();
    assert!(err.contains("ETCD_ENDPOINTS"), "{err}");
}

struct Echo;

impl dynamo_runtime::transport::server::Handler for Echo {
    fn start(
        &self,
        request: dynamo_runtime::transport::server::Request,
        mut out: dynamo_runtime::transport::server::Responder,
    ) {
        out.accept();
        let _ = out.send(&request.body);
        let _ = out.send(&request.body);
        out.finish();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_request_plane_round_trips_and_names_the_payload_limit() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, "max_payload: 65536\n").unwrap();
    let server = nats_server(&["-c", conf.to_str().unwrap()]);
    let rt = |_: ()| {
        DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Nats,
            nats_config(server.port),
        )
        .unwrap()
    };
    let (worker, caller) = (rt(()), rt(()));
    let ep = EndpointId::parse("natsrp.backend.generate").unwrap();
    let serving = {
        let (worker, ep) = (worker.clone(), ep.clone());
        tokio::spawn(async move {
            worker
                .serve_endpoint(&ep, std::sync::Arc::new(Echo), true)
                .await
        })
    };
    let client = caller.client(&ep);
    tokio::time::timeout(WAIT, client.wait_for_instances())
        .await
        .unwrap()
        .unwrap();
    let instance = &client.instances()[0];
    assert_eq!(
        instance.transport,
        dynamo_runtime::discovery::TransportAddress::NatsTcp(format!(
            "natsrp_backend.generate-{:x}",
            worker.connection_id()
        ))
    );
    for i in 0..20 {
        let body = bytes::Bytes::from(format!("\"req-{i}\""));
        let mut stream = client
            .generate(
                body.clone(),
                dynamo_runtime::Route::RoundRobin,
                Default::default(),
                None,
            )
            .await
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), body);
        assert_eq!(stream.next().await.unwrap().unwrap(), body);
        assert!(stream.next().await.is_none());
    }
    let big = bytes::Bytes::from(vec![b'x'; 100_000]);
    let err = client
        .generate(
            big,
            dynamo_runtime::Route::RoundRobin,
            Default::default(),
            None,
        )
        .await
        .err()
        .expect("over max_payload")
        .to_string();
    assert!(err.contains("max_payload of 65536 bytes"), "{err}");
    worker.shutdown();
    tokio::time::timeout(WAIT, serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    caller.shutdown();
}

/// Retry `op` (an etcd request that fails while the client reconnects) until it succeeds.
async fn until_ok<F, Fut>(mut op: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = dynamo_runtime::Result<()>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        match op().await {
            Ok(()) => return,
            Err(e) => assert!(Instant::now() < deadline, "etcd never came back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_watch_resyncs_after_an_etcd_restart() {
    let mut etcd = etcd_server();
    let connect = || {
        DistributedRuntime::connect(
            DiscoveryBackend::Etcd,
            RequestPlane::Tcp,
            etcd_config(etcd.port, 10),
        )
    };
    let (watcher, writer) = (connect().await.unwrap(), connect().await.unwrap());
    let prefix = "v1/mdc/resync/".to_owned();
    let key = |name: &str| format!("{prefix}{name}");
    let mut view =
        dynamo_runtime::discovery::watch_prefix(Arc::clone(watcher.kv_store()), prefix.clone());
    let mut changes = watcher.kv_store().changes();
    writer.kv_store().put(&key("gone"), "1").await.unwrap();
    let names = |v: &[(String, String)]| -> Vec<String> {
        v.iter()
            .map(|(k, _)| k[prefix.len()..].to_owned())
            .collect()
    };
    let converge = |view: &mut tokio::sync::watch::Receiver<_>, want: Vec<&str>| {
        let want: Vec<String> = want.into_iter().map(str::to_owned).collect();
        let mut view = view.clone();
        async move {
            tokio::time::timeout(
                WAIT,
                view.wait_for(|v: &Arc<Vec<(String, String)>>| names(v) == want),
            )
            .await
            .expect("the watcher's view converges")
            .expect("view open");
        }
    };
    converge(&mut view, vec!["gone"]).await;

    // etcd goes away for less than the lease TTL; while the watcher's watch is broken,
    // one key is deleted and two are put as soon as etcd is back.
    etcd.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    etcd.restart();
    let w = &writer;
    until_ok(|| async move { w.kv_store().delete(&key("gone")).await }).await;
    until_ok(|| async move { w.kv_store().put(&key("new-a"), "2").await }).await;
    until_ok(|| async move { w.kv_store().put(&key("new-b"), "3").await }).await;
    converge(&mut view, vec!["new-a", "new-b"]).await;

    // The watch itself is live again: a later change is signalled (not just re-listed).
    tokio::time::timeout(WAIT, async {
        loop {
            changes.mark_unchanged();
            writer.kv_store().put(&key("later"), "4").await.unwrap();
            if tokio::time::timeout(Duration::from_millis(500), changes.changed())
                .await
                .is_ok()
            {
                return;
            }
        }
    })
    .await
    .expect("the etcd watch signals changes after the restart");
    converge(&mut view, vec!["later", "new-a", "new-b"]).await;
    drop(view);
    for rt in [watcher, writer] {
        rt.shutdown();
        tokio::time::timeout(WAIT, rt.stopped()).await.unwrap();
    }
}

/// Streams `n` items (the request body says how many), 20 ms apart.
struct Slow;

impl dynamo_runtime::transport::server::Handler for Slow {
    fn start(
        &self,
        request: dynamo_runtime::transport::server::Request,
        mut out: dynamo_runtime::transport::server::Responder,
    ) {
        let n: u32 = serde_json::from_slice(&request.body).unwrap_or(1);
        tokio::spawn(async move {
            for i in 0..n {
                let _ = out.send(i.to_string().as_bytes());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            out.finish();
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_request_plane_shutdown_drains_streams_to_the_end() {
    let server = nats_server(&[]);
    // Each round: a stream in flight when the worker shuts down must end with every item
    // and a clean end (the last frames leave before the NATS connection closes).
    for round in 0..10 {
        let rt = || {
            DistributedRuntime::new(
                DiscoveryBackend::Mem,
                RequestPlane::Nats,
                nats_config(server.port),
            )
            .unwrap()
        };
        let (worker, caller) = (rt(), rt());
        let ep = EndpointId::parse(&format!("natsdrain{round}.backend.generate")).unwrap();
        let serving = {
            let (worker, ep) = (worker.clone(), ep.clone());
            tokio::spawn(async move { worker.serve_endpoint(&ep, Arc::new(Slow), true).await })
        };
        let client = caller.client(&ep);
        tokio::time::timeout(WAIT, client.wait_for_instances())
            .await
            .unwrap()
            .unwrap();
        let mut stream = client
            .generate(
                bytes::Bytes::from_static(b"10"),
                dynamo_runtime::Route::RoundRobin,
                Default::default(),
                None,
            )
            .await
            .unwrap();
        assert_eq!(&stream.next().await.unwrap().unwrap()[..], b"0");
        worker.shutdown();
        let mut rest = Vec::new();
        while let Some(item) = tokio::time::timeout(WAIT, stream.next()).await.unwrap() {
            let item = item.unwrap_or_else(|e| panic!("round {round}: {e}"));
            rest.push(String::from_utf8(item.to_vec()).unwrap());
        }
        let want: Vec<String> = (1..10).map(|i| i.to_string()).collect();
        assert_eq!(rest, want, "round {round}");
        tokio::time::timeout(WAIT, serving)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        caller.shutdown();
        tokio::time::timeout(WAIT, caller.stopped()).await.unwrap();
    }
}

/// NATS "no responders": with a settled connection, a request to a subject nobody serves
/// (a gone worker) is refused at once with `CannotConnect` instead of waiting out the
/// acknowledgement timeout; right after a broker restart, the same situation (the worker
/// has not re-subscribed yet) makes the request wait for the worker instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_no_responders_is_refused_at_once_or_awaited_after_a_broker_restart() {
    use dynamo_runtime::discovery::{Instance, TransportAddress};
    let mut server = nats_server(&[]);
    let rt = || {
        DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Nats,
            nats_config(server.port),
        )
        .unwrap()
    };
    let (worker, caller) = (rt(), rt());
    let ep = EndpointId::parse("natsnr.backend.generate").unwrap();
    let id = worker.connection_id();
    // The worker's discovery entry, before it serves (nobody subscribed to the subject).
    let instance = Instance::new(
        &ep,
        id,
        TransportAddress::NatsTcp(format!("natsnr_backend.generate-{id:x}")),
    );
    caller.discovery().register(&instance).await.unwrap();
    let client = caller.client(&ep);
    tokio::time::timeout(WAIT, client.wait_for_instances())
        .await
        .unwrap()
        .unwrap();
    let body = bytes::Bytes::from_static(b"\"hello\"");
    let direct = dynamo_runtime::Route::Direct(id);

    let t0 = Instant::now();
    let err = client
        .generate(body.clone(), direct, Default::default(), None)
        .await
        .err()
        .expect("nobody serves the subject");
    assert!(
        matches!(err, dynamo_runtime::Error::CannotConnect { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("no responders"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());

    // Broker restart; the worker subscribes 500 ms into the request.
    server.stop();
    server.restart();
    let serving = {
        let (worker, ep) = (worker.clone(), ep.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            worker.serve_endpoint(&ep, Arc::new(Echo), true).await
        })
    };
    let t0 = Instant::now();
    let mut stream = client
        .generate(body.clone(), direct, Default::default(), None)
        .await
        .expect("awaited the re-subscribing worker");
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(stream.next().await.unwrap().unwrap(), body);
    drop(stream);
    worker.shutdown();
    tokio::time::timeout(WAIT, serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    caller.shutdown();
}
