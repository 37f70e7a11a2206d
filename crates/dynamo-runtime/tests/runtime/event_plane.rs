//! Event plane integration tests: several runtimes in one process, with mem and file
//! discovery, over the brokerless transport.

use std::time::Duration;

use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
use dynamo_runtime::events::{EventCodec, EventScope, EventSubscriber, encode_envelope};
use dynamo_runtime::{DistributedRuntime, RuntimeConfig};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(5);

fn runtime(backend: DiscoveryBackend, root: Option<&std::path::Path>) -> DistributedRuntime {
    let mut config = RuntimeConfig::default();
    if let Some(root) = root {
        config.file_kv_root = root.to_owned();
    }
    DistributedRuntime::new(backend, RequestPlane::Tcp, config).expect("runtime")
}

async fn next(sub: &mut EventSubscriber) -> dynamo_runtime::events::Event {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("event in time")
        .expect("subscription open")
}

async fn wait_publishers(sub: &EventSubscriber, n: usize) {
    tokio::time::timeout(WAIT, async {
        loop {
            if sub.publishers() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("expected {n} publishers, have {}", sub.publishers()));
}

#[expect(
    clippy::unwrap_used,
    reason = "test helper, shared by the mem and file tests"
)]
async fn two_runtimes_exchange_events(a: DistributedRuntime, b: DistributedRuntime) {
    let scope = EventScope::component("evt", "backend");
    let mut sub = b.subscribe(&scope, "kv-events").await.unwrap();
    let other_topic = b.subscribe(&scope, "kv-metrics").await.unwrap();
    let p1 = a.event_publisher(&scope, "kv-events").await.unwrap();
    wait_publishers(&sub, 1).await;
    for i in 0..100u32 {
        assert_eq!(p1.publish(i.to_be_bytes()).unwrap(), u64::from(i));
    }
    for i in 0..100u32 {
        let e = next(&mut sub).await;
        assert_eq!(e.publisher_id, p1.publisher_id());
        assert_eq!(e.sequence, u64::from(i));
        assert_eq!(&e.payload[..], &i.to_be_bytes());
        assert_eq!(e.missed_before, 0);
    }

    // A second publisher joins (in the subscriber's runtime); both are merged.
    let p2 = b.event_publisher(&scope, "kv-events").await.unwrap();
    wait_publishers(&sub, 2).await;
    p1.publish_value(&"from-a").unwrap();
    p2.publish_value(&"from-b").unwrap();
    let mut got = vec![
        next(&mut sub).await.decode::<String>().unwrap(),
        next(&mut sub).await.decode::<String>().unwrap(),
    ];
    got.sort();
    assert_eq!(got, ["from-a", "from-b"]);

    // The first publisher leaves; the second carries on; a third joins.
    drop(p1);
    wait_publishers(&sub, 1).await;
    p2.publish(b"still here").unwrap();
    assert_eq!(&next(&mut sub).await.payload[..], b"still here");
    let p3 = a.event_publisher(&scope, "kv-events").await.unwrap();
    wait_publishers(&sub, 2).await;
    p3.publish(b"newcomer").unwrap();
    let e = next(&mut sub).await;
    assert_eq!((e.publisher_id, e.sequence), (p3.publisher_id(), 0));

    // Nothing crossed topics, and nothing was lost.
    assert_eq!(other_topic.stats().received(), 0);
    assert_eq!(sub.gaps(), 0);
    assert_eq!(sub.stats().received(), 104);
    assert!(sub.try_next().is_none());

    for rt in [a, b] {
        rt.shutdown();
        tokio::time::timeout(WAIT, rt.stopped()).await.unwrap();
    }
    // Shutdown ends the subscription.
    assert!(
        tokio::time::timeout(WAIT, sub.next())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_runtimes_exchange_events_as_publishers_join_and_leave() {
    two_runtimes_exchange_events(
        runtime(DiscoveryBackend::Mem, None),
        runtime(DiscoveryBackend::Mem, None),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_runtimes_exchange_events_as_publishers_join_and_leave() {
    let dir = tempfile::tempdir().unwrap();
    two_runtimes_exchange_events(
        runtime(DiscoveryBackend::File, Some(dir.path())),
        runtime(DiscoveryBackend::File, Some(dir.path())),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_are_distinct_channels() {
    let rt = runtime(DiscoveryBackend::Mem, None);
    let ep = dynamo_runtime::EndpointId::parse("scoped.comp.gen").unwrap();
    let scopes = [
        EventScope::namespace("scoped"),
        EventScope::component("scoped", "comp"),
        EventScope::endpoint(&ep),
    ];
    let mut subs = Vec::new();
    let mut pubs = Vec::new();
    for s in &scopes {
        subs.push(rt.subscribe(s, "t").await.unwrap());
        pubs.push(rt.event_publisher(s, "t").await.unwrap());
    }
    for (i, sub) in subs.iter().enumerate() {
        wait_publishers(sub, 1).await;
        pubs[i].publish([i as u8]).unwrap();
    }
    for (i, sub) in subs.iter_mut().enumerate() {
        assert_eq!(&next(sub).await.payload[..], &[i as u8]);
        assert!(sub.try_next().is_none());
    }
    rt.shutdown();
    rt.stopped().await;
}

/// A hand-driven publisher: its frames skip sequence numbers, as a publisher whose queue
/// overflowed would. The subscriber finds it through discovery like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_count_sequence_gaps_and_drop_duplicates() {
    let rt = runtime(DiscoveryBackend::Mem, None);
    let scope = EventScope::namespace("gaps");
    let mut sub = rt.subscribe(&scope, "kv-events").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let key = format!("{}{:x}", scope.channel_prefix("kv-events"), 99);
    let value = serde_json::json!({
        "type": "EventChannel", "subject": scope.subject("kv-events"), "topic": "kv-events",
        "instance_id": 99, "transport": {"kind": "tcp", "config": {"endpoint": format!("tcp://{addr}")}}
    });
    rt.kv_store().put(&key, &value.to_string()).await.unwrap();
    let (mut sock, _) = tokio::time::timeout(WAIT, listener.accept())
        .await
        .unwrap()
        .unwrap();
    // The hello frame: the subscriber's queue is in place.
    sock.write_u32(0).await.unwrap();
    for (seq, codec) in [
        (5u64, EventCodec::Msgpack),
        (6, EventCodec::Json),
        (9, EventCodec::Msgpack),
        (9, EventCodec::Msgpack),
        (7, EventCodec::Msgpack),
        (10, EventCodec::Json),
    ] {
        let env = encode_envelope(codec, 99, seq, "kv-events", b"x").unwrap();
        sock.write_u32(env.len() as u32).await.unwrap();
        sock.write_all(&env).await.unwrap();
    }
    let got: Vec<(u64, u64)> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            let e = next(&mut sub).await;
            v.push((e.sequence, e.missed_before));
        }
        v
    };
    // Joining at 5 is not a gap; 9 after 6 misses 7 and 8; the late 7 and the repeated 9
    // are duplicates.
    assert_eq!(got, [(5, 0), (6, 0), (9, 2), (10, 0)]);
    let stats = sub.stats();
    assert_eq!(
        (stats.gaps(), stats.missed(), stats.duplicates()),
        (1, 2, 2)
    );
    assert_eq!(stats.received(), 4);
    rt.shutdown();
    rt.stopped().await;
}
