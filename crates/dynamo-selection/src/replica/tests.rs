use std::collections::BTreeSet;

use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::scheduling::SchedulingRequest;
use dynamo_kv_router::scheduling::config::KvRouterConfig;
use dynamo_kv_router::scheduling::selector::{LoadThresholds, WorkerCapacity};

use super::*;

struct Target(Scheduler);

impl SyncTarget for Target {
    fn scheduler(&self) -> &Scheduler {
        &self.0
    }
}

fn target(workers: &[u64]) -> Arc<Target> {
    let s = Scheduler::new(16, KvRouterConfig::default(), LoadThresholds::default()).unwrap();
    for &w in workers {
        s.upsert_worker(
            WorkerWithDpRank::new(w, 0),
            BTreeSet::new(),
            WorkerCapacity::default(),
        );
    }
    Arc::new(Target(s))
}

fn book(t: &Target, id: &str, worker: u64) {
    let seq: Vec<SequenceHash> = (0..4).map(SequenceHash).collect();
    t.0.select(&SchedulingRequest {
        request_id: Some(id),
        isl_tokens: 64,
        seq_hashes: &seq,
        pinned: Some(WorkerWithDpRank::new(worker, 0)),
        ..Default::default()
    })
    .unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn hub(
    rt: &tokio::runtime::Runtime,
    port: u16,
    peers: &[u16],
    stop: &CancellationToken,
) -> Arc<ReplicaHub> {
    let options = ReplicaSyncOptions {
        host: "127.0.0.1".into(),
        port,
        peers: peers
            .iter()
            .map(|p| format!("tcp://127.0.0.1:{p}"))
            .collect(),
        config: ReplicaSyncConfig::with_ttl(Duration::from_secs(3)),
    };
    ReplicaHub::start(&options, rt.handle(), stop.child_token()).unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn wire_message_is_the_group_next_to_the_runtime_message() {
    let wire = WireMessage {
        model_name: "m".into(),
        routing_group: "g".into(),
        msg: SyncMessage {
            replica: 5,
            seq: 2,
            body: SyncBody::Freed {
                request_id: "r".into(),
            },
        },
    };
    let v: serde_json::Value = serde_json::to_value(&wire).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"model_name": "m", "routing_group": "g", "replica": 5, "seq": 2,
                           "type": "freed", "request_id": "r"})
    );
    let back: WireMessage = serde_json::from_value(v).unwrap();
    assert_eq!(back, wire);
}

#[test]
fn peers_parse_with_or_without_scheme() {
    assert_eq!(
        parse_peers("127.0.0.1:5000, tcp://h:6000,").unwrap(),
        vec!["tcp://127.0.0.1:5000", "tcp://h:6000"]
    );
    assert!(parse_peers("h").unwrap_err().contains("has no port"));
    assert!(
        parse_peers("http://h:1")
            .unwrap_err()
            .contains("only tcp://")
    );
}

/// Two hubs over loopback: a booking on one counts on the other until freed, a third
/// replica that starts late catches up from a snapshot, a group that appears late gets
/// the bookings already made in it, and a stopping replica's bookings are released by
/// its goodbye.
#[test]
fn bookings_cross_replicas_and_late_starters_catch_up() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let stop = CancellationToken::new();
    let a = hub(&rt, pa, &[pb, pc], &stop);
    let b = hub(&rt, pb, &[pa, pc], &stop);
    let key: GroupKey = ("m".into(), "default".into());
    let (ta, tb) = (target(&[1, 2]), target(&[1, 2]));
    a.attach(&key, ta.clone());
    b.attach(&key, tb.clone());
    wait_until("links", || {
        a.metrics_text("x")
            .contains("x_replica_sync_peer_links{state=\"connected\"} 1")
            && b.metrics_text("x")
                .contains("x_replica_sync_peer_links{state=\"connected\"} 1")
    });
    book(&ta, "r1", 1);
    wait_until("remote booking on b", || tb.0.remote_bookings() == 1);
    let loads = tb.0.potential_loads(&SchedulingRequest::default());
    let w1 = loads.iter().find(|l| l.worker.worker_id == 1).unwrap();
    assert_eq!((w1.active_requests, w1.potential_prefill_tokens), (1, 64));
    tb.0.mark_prefill_completed("zz").unwrap_err();
    ta.0.mark_prefill_completed("r1").unwrap();
    wait_until("prefill completed on b", || {
        tb.0.potential_loads(&SchedulingRequest::default())
            .iter()
            .all(|l| l.potential_prefill_tokens == 0)
    });
    book(&tb, "s1", 2);
    wait_until("remote booking on a", || ta.0.remote_bookings() == 1);

    // A late starter: it has both bookings once it runs.
    let c = hub(&rt, pc, &[pa, pb], &stop);
    let tc = target(&[1, 2]);
    c.attach(&key, tc.clone());
    wait_until("late starter caught up", || tc.0.remote_bookings() == 2);

    // A group that appears late on b: a's booking in it is applied then.
    let other: GroupKey = ("n".into(), "default".into());
    let ta2 = target(&[7]);
    a.attach(&other, ta2.clone());
    book(&ta2, "r2", 7);
    std::thread::sleep(Duration::from_millis(200));
    let tb2 = target(&[7]);
    b.attach(&other, tb2.clone());
    wait_until("late group", || tb2.0.remote_bookings() == 1);

    ta.0.free("r1").unwrap();
    wait_until("free reaches b and c", || {
        tb.0.remote_bookings() == 0 && tc.0.remote_bookings() == 1
    });
    rt.block_on(b.stop_and_wait(Duration::from_secs(5)));
    wait_until("goodbye releases b's bookings", || {
        ta.0.remote_bookings() == 0 && tc.0.remote_bookings() == 0
    });
    stop.cancel();
}
