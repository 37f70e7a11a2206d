use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use super::*;
use crate::scheduling::config::KvRouterConfig;
use crate::scheduling::selector::{LoadThresholds, WorkerCapacity};
use crate::scheduling::{Scheduler, SchedulingRequest};

fn w(id: u64) -> WorkerWithDpRank {
    WorkerWithDpRank::new(id, 0)
}

fn hashes(range: std::ops::Range<u64>) -> Vec<SequenceHash> {
    range.map(SequenceHash).collect()
}

/// A router replica: scheduler, sync state and the outbox its observer fills.
struct Replica {
    sched: Scheduler,
    sync: ReplicaSync,
    outbox: Arc<Mutex<Vec<SyncBody>>>,
}

impl Replica {
    fn new(id: ReplicaId, workers: &[u64]) -> Self {
        Self::seeded(id, workers, id)
    }

    /// A replica whose scheduler draws ties from `seed`.
    fn seeded(id: ReplicaId, workers: &[u64], seed: u64) -> Self {
        let sched = Scheduler::with_rng(
            16,
            KvRouterConfig {
                router_track_output_blocks: true,
                ..KvRouterConfig::default()
            },
            LoadThresholds::default(),
            fastrand::Rng::with_seed(seed),
        )
        .expect("valid config");
        for &wid in workers {
            sched.upsert_worker(w(wid), BTreeSet::new(), WorkerCapacity::default());
        }
        let outbox = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&outbox);
        sched.set_sync_observer(Box::new(move |b| sink.lock().expect("outbox").push(b)));
        Self {
            sched,
            sync: ReplicaSync::new(id, ReplicaSyncConfig::default()),
            outbox,
        }
    }

    /// Book `request` on `worker` with `blocks` (pinned, as a router would after choosing).
    fn book(&self, request: &str, worker: u64, blocks: &[SequenceHash]) {
        self.sched
            .select(&SchedulingRequest {
                request_id: Some(request),
                isl_tokens: blocks.len() * 16,
                seq_hashes: blocks,
                pinned: Some(w(worker)),
                ..Default::default()
            })
            .expect("pinned worker exists");
    }

    /// Number the outbox's bodies as this replica's messages.
    fn drain(&mut self) -> Vec<SyncMessage> {
        let bodies: Vec<SyncBody> = std::mem::take(&mut *self.outbox.lock().expect("outbox"));
        bodies.into_iter().map(|b| self.sync.outgoing(b)).collect()
    }

    /// Handle `msg`, carrying out the actions (their messages land in the outbox).
    fn receive(&mut self, msg: SyncMessage, now: Instant) {
        let actions = self.sync.handle(msg, now, &self.sched);
        self.act(actions);
    }

    fn act(&mut self, actions: Vec<SyncAction>) {
        for a in actions {
            match a {
                SyncAction::RequestSnapshot(peer) => self
                    .outbox
                    .lock()
                    .expect("outbox")
                    .push(SyncBody::SnapshotRequest { target: Some(peer) }),
                SyncAction::SendSnapshot => self.sched.emit_snapshot(),
            }
        }
    }

    fn tick(&mut self, now: Instant) {
        self.outbox
            .lock()
            .expect("outbox")
            .push(SyncBody::Heartbeat);
        let actions = self.sync.tick(now, &self.sched);
        self.act(actions);
    }

    /// Per worker: (distinct active blocks, prefill tokens, active requests).
    fn loads(&self) -> BTreeMap<u64, (u64, u64, u64)> {
        self.sched
            .potential_loads(&SchedulingRequest::default())
            .into_iter()
            .map(|l| {
                (
                    l.worker.worker_id,
                    (
                        l.potential_decode_blocks,
                        l.potential_prefill_tokens,
                        l.active_requests,
                    ),
                )
            })
            .collect()
    }
}

#[test]
fn wire_format_is_flat_tagged_json() {
    let msg = SyncMessage {
        replica: 7,
        seq: 3,
        body: SyncBody::Booked(BookingRecord {
            request_id: "r1".into(),
            worker: WorkerWithDpRank::new(5, 1),
            blocks: hashes(1..3),
            prefill_tokens: 32,
        }),
    };
    let json = serde_json::to_value(&msg).expect("serializable");
    assert_eq!(
        json,
        serde_json::json!({
            "replica": 7, "seq": 3, "type": "booked", "request_id": "r1",
            "worker": {"worker_id": 5, "dp_rank": 1}, "blocks": [1, 2], "prefill_tokens": 32
        })
    );
    let back: SyncMessage = serde_json::from_value(json).expect("round trip");
    assert_eq!(back, msg);
    for body in [
        SyncBody::Heartbeat,
        SyncBody::Goodbye,
        SyncBody::SnapshotRequest { target: None },
        SyncBody::Snapshot { bookings: vec![] },
        SyncBody::Freed {
            request_id: "x".into(),
        },
    ] {
        let m = SyncMessage {
            replica: 1,
            seq: 0,
            body,
        };
        let text = serde_json::to_string(&m).expect("serializable");
        assert_eq!(
            serde_json::from_str::<SyncMessage>(&text).expect("parse"),
            m
        );
    }
    assert!(serde_json::from_str::<SyncMessage>(r#"{"replica":1,"seq":0,"type":"nope"}"#).is_err());
}

#[test]
fn a_peer_booking_counts_until_freed() {
    let now = Instant::now();
    let mut a = Replica::new(1, &[10, 11]);
    let mut b = Replica::new(2, &[10, 11]);
    a.book("r", 10, &hashes(0..4));
    for m in a.drain() {
        b.receive(m, now);
    }
    assert_eq!(b.loads()[&10], (4, 64, 1));
    assert_eq!(b.sched.remote_bookings(), 1);
    // B's own request sharing the prefix adds only its new block.
    b.book("r", 10, &hashes(0..5));
    assert_eq!(b.loads()[&10], (5, 144, 2));
    a.sched.mark_prefill_completed("r").expect("booked");
    a.sched.free("r").expect("booked");
    let msgs = a.drain();
    assert_eq!(msgs.len(), 2);
    b.receive(msgs[0].clone(), now);
    assert_eq!(b.loads()[&10], (5, 80, 2));
    b.receive(msgs[1].clone(), now);
    assert_eq!(b.loads()[&10], (5, 80, 1));
    assert_eq!(b.sched.remote_bookings(), 0);
    // A never saw B's messages: its view holds nothing of B.
    assert_eq!(a.loads()[&10], (0, 0, 0));
}

#[test]
fn own_messages_and_duplicates_are_ignored() {
    let now = Instant::now();
    let mut a = Replica::new(1, &[10]);
    let mut b = Replica::new(2, &[10]);
    a.book("r", 10, &hashes(0..2));
    let msgs = a.drain();
    a.receive(msgs[0].clone(), now);
    assert_eq!(a.loads()[&10], (2, 32, 1));
    b.receive(msgs[0].clone(), now);
    b.receive(msgs[0].clone(), now);
    assert_eq!(b.loads()[&10], (2, 32, 1));
}

#[test]
fn late_start_catches_up_from_a_snapshot() {
    let now = Instant::now();
    let mut a = Replica::new(1, &[10, 11]);
    a.book("r1", 10, &hashes(0..3));
    a.book("r2", 11, &hashes(10..12));
    a.sched.mark_prefill_completed("r2").expect("booked");
    let _missed = a.drain(); // B was not running yet
    let mut b = Replica::new(2, &[10, 11]);
    a.tick(now);
    for m in a.drain() {
        b.receive(m, now);
    }
    assert!(
        !b.sync.all_synced(),
        "a heartbeat with seq > 0 reveals the missed start"
    );
    let requests = b.drain();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].body,
        SyncBody::SnapshotRequest { target: Some(1) }
    );
    a.receive(requests[0].clone(), now);
    for m in a.drain() {
        b.receive(m, now);
    }
    assert!(b.sync.all_synced());
    assert_eq!(b.loads(), a.loads());
    assert_eq!(b.loads()[&11], (2, 0, 1));
}

#[test]
fn a_gap_is_repaired_by_a_snapshot() {
    let now = Instant::now();
    let mut a = Replica::new(1, &[10]);
    let mut b = Replica::new(2, &[10]);
    a.book("r1", 10, &hashes(0..3));
    a.book("r2", 10, &hashes(5..6));
    let msgs = a.drain();
    b.receive(msgs[0].clone(), now);
    // msgs[1] is lost; the next message reveals the gap.
    a.sched.free("r1").expect("booked");
    for m in a.drain() {
        b.receive(m, now);
    }
    assert!(!b.sync.all_synced());
    assert_eq!(b.loads()[&10], (0, 0, 0));
    // A snapshot request lost too: the tick asks again.
    let _lost = b.drain();
    b.tick(now);
    for m in b.drain() {
        a.receive(m, now);
    }
    for m in a.drain() {
        b.receive(m, now);
    }
    assert!(b.sync.all_synced());
    assert_eq!(b.loads(), a.loads());
}

#[test]
fn a_silent_peer_expires_and_goodbye_releases_at_once() {
    let t0 = Instant::now();
    let mut a = Replica::new(1, &[10]);
    let mut c = Replica::new(3, &[10]);
    let mut b = Replica::new(2, &[10]);
    a.book("r", 10, &hashes(0..4));
    c.book("r", 10, &hashes(7..8));
    for m in a.drain().into_iter().chain(c.drain()) {
        b.receive(m, t0);
    }
    assert_eq!(b.loads()[&10], (5, 80, 2));
    let ttl = b.sync.config().peer_ttl;
    b.tick(t0 + ttl);
    assert_eq!(b.sync.peers(), vec![1, 3], "not yet past the TTL");
    // C keeps talking; A went silent.
    c.tick(t0 + ttl);
    for m in c.drain() {
        b.receive(m, t0 + ttl);
    }
    b.tick(t0 + ttl + Duration::from_millis(1));
    assert_eq!(b.sync.peers(), vec![3]);
    assert_eq!(b.loads()[&10], (1, 16, 1));
    let bye = c.sync.outgoing(SyncBody::Goodbye);
    b.receive(bye, t0 + ttl);
    assert!(b.sync.peers().is_empty());
    assert_eq!(b.loads()[&10], (0, 0, 0));
}

#[test]
fn booking_for_an_unknown_worker_waits_until_it_registers() {
    let now = Instant::now();
    let mut a = Replica::new(1, &[10, 11]);
    let mut b = Replica::new(2, &[10]);
    a.book("r", 11, &hashes(0..2));
    for m in a.drain() {
        b.receive(m, now);
    }
    assert_eq!(b.sched.remote_bookings(), 0);
    assert_eq!(b.sync.peer_bookings(1), 1);
    b.sched
        .upsert_worker(w(11), BTreeSet::new(), WorkerCapacity::default());
    b.sync.reapply(&b.sched);
    assert_eq!(b.loads()[&11], (2, 32, 1));
}

#[test]
fn a_replaced_tracker_gets_every_peer_booking_again() {
    let now = Instant::now();
    let mut a = Replica::new(1, &[10, 11]);
    let mut b = Replica::new(2, &[10, 11]);
    a.book("r", 11, &hashes(0..2));
    a.book("s", 10, &hashes(4..5));
    for m in a.drain() {
        b.receive(m, now);
    }
    assert_eq!(b.sync.total_peer_bookings(), 2);
    // The group's scheduler was dropped and made again (all its workers left and came
    // back): the peer's bookings are booked on the new one.
    let fresh = Replica::new(3, &[10, 11]);
    b.sync.mark_unapplied();
    b.sync.reapply(&fresh.sched);
    assert_eq!(fresh.loads()[&11], (2, 32, 1));
    assert_eq!(fresh.loads()[&10], (1, 16, 1));
    assert_eq!(fresh.sched.remote_bookings(), 2);
}

#[test]
fn removed_worker_frees_its_local_bookings_for_peers() {
    let now = Instant::now();
    let mut a = Replica::new(1, &[10, 11]);
    let mut b = Replica::new(2, &[10, 11]);
    a.book("r", 11, &hashes(0..2));
    a.sched.remove_worker(11);
    let msgs = a.drain();
    assert_eq!(
        msgs[1].body,
        SyncBody::Freed {
            request_id: "r".into()
        }
    );
    for m in msgs {
        b.receive(m, now);
    }
    assert_eq!(b.sync.peer_bookings(1), 0);
    assert_eq!(b.loads()[&11], (0, 0, 0));
}

/// A burst of identical prompts split across two synced schedulers spreads over the
/// workers exactly as one scheduler spreads it; unsynced, both pile onto the same workers
/// (here with certainty: both draw their ties from the same seed, so each makes the
/// other's picks).
#[test]
fn a_split_burst_spreads_like_one_router() {
    let prompt = hashes(0..8);
    let route = |r: &Replica, id: &str| {
        r.sched
            .select(&SchedulingRequest {
                request_id: Some(id),
                isl_tokens: 128,
                seq_hashes: &prompt,
                ..Default::default()
            })
            .expect("workers")
            .worker
            .worker_id
    };
    let spread = |sync: bool| {
        let now = Instant::now();
        let mut a = Replica::seeded(1, &[1, 2, 3, 4], 7);
        let mut b = Replica::seeded(2, &[1, 2, 3, 4], 7);
        let mut count = BTreeMap::<u64, u32>::new();
        for i in 0..4 {
            let (from, to) = if i % 2 == 0 {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            *count.entry(route(from, &format!("q{i}"))).or_default() += 1;
            let msgs = from.drain();
            if sync {
                for m in msgs {
                    to.receive(m, now);
                }
            }
        }
        count
    };
    let one = {
        let r = Replica::new(1, &[1, 2, 3, 4]);
        let mut count = BTreeMap::<u64, u32>::new();
        for i in 0..4 {
            *count.entry(route(&r, &format!("q{i}"))).or_default() += 1;
        }
        count
    };
    assert_eq!(one.values().copied().collect::<Vec<_>>(), vec![1, 1, 1, 1]);
    assert_eq!(spread(true), one);
    let off = spread(false);
    assert!(
        off.values().any(|&n| n > 1),
        "unsynced replicas collide: {off:?}"
    );
}

#[derive(Debug, Clone)]
enum Op {
    /// Replica books request on worker with blocks `lo..lo+len`.
    Book(usize, u8, u64, u8, u8),
    Prefill(usize, u8),
    Output(usize, u8),
    Free(usize, u8),
    /// Deliver replica's pending messages; the `bool` drops the first one.
    Deliver(usize, bool),
    Tick,
    /// Replica dies (a new one, with a new id, takes its place).
    Restart(usize),
}

const REPLICAS: usize = 3;
const WORKERS: u64 = 3;

fn op() -> impl Strategy<Value = Op> {
    let r = 0..REPLICAS;
    prop_oneof![
        4 => (r.clone(), 0u8..6, 0..WORKERS, 0u8..6, 0u8..4)
            .prop_map(|(r, q, w, lo, len)| Op::Book(r, q, w, lo, len)),
        2 => (r.clone(), 0u8..6).prop_map(|(r, q)| Op::Prefill(r, q)),
        1 => (r.clone(), 0u8..6).prop_map(|(r, q)| Op::Output(r, q)),
        3 => (r.clone(), 0u8..6).prop_map(|(r, q)| Op::Free(r, q)),
        4 => (r.clone(), prop::bool::weighted(0.2)).prop_map(|(r, d)| Op::Deliver(r, d)),
        1 => Just(Op::Tick),
        1 => r.prop_map(Op::Restart),
    ]
}

/// Naive model: per replica, its own live requests → (worker, prompt blocks, prefill
/// tokens, output blocks). Output blocks get random hashes: each is distinct.
type Model = Vec<BTreeMap<String, (u64, Vec<u64>, u64, u64)>>;

fn expected_loads(model: &Model) -> BTreeMap<u64, (u64, u64, u64)> {
    (0..WORKERS)
        .map(|wid| {
            let mut blocks = BTreeSet::new();
            let (mut prefill, mut reqs, mut outputs) = (0, 0, 0);
            for own in model {
                for (worker, b, p, o) in own.values() {
                    if *worker == wid {
                        blocks.extend(b.iter().copied());
                        prefill += p;
                        reqs += 1;
                        outputs += o;
                    }
                }
            }
            (wid, (blocks.len() as u64 + outputs, prefill, reqs))
        })
        .collect()
}

struct Cluster {
    replicas: Vec<Replica>,
    /// Messages sent by each replica and not yet delivered.
    queues: Vec<VecDeque<SyncMessage>>,
    next_id: ReplicaId,
    now: Instant,
}

impl Cluster {
    fn collect(&mut self) {
        for (i, r) in self.replicas.iter_mut().enumerate() {
            self.queues[i].extend(r.drain());
        }
    }

    /// Deliver replica `i`'s queue to every other replica (in order; optionally dropping
    /// the first message for everyone).
    fn deliver(&mut self, i: usize, drop_first: bool) {
        self.collect();
        let mut msgs: Vec<_> = self.queues[i].drain(..).collect();
        if drop_first && !msgs.is_empty() {
            msgs.remove(0);
        }
        let now = self.now;
        for m in msgs {
            for (j, r) in self.replicas.iter_mut().enumerate() {
                if j != i {
                    r.receive(m.clone(), now);
                }
            }
        }
    }

    fn tick(&mut self) {
        self.now += Duration::from_millis(100);
        let now = self.now;
        for r in &mut self.replicas {
            r.tick(now);
        }
    }

    /// Lossless rounds until every queue is empty and every view is synced.
    fn settle(&mut self) {
        for _ in 0..6 {
            self.tick();
            for _ in 0..3 {
                for i in 0..self.replicas.len() {
                    self.deliver(i, false);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever the interleaving, losses and restarts, once messages flow again every
    /// replica's view of every worker's load equals the union of all live replicas' own
    /// bookings (the naive model), and dead replicas' bookings are gone.
    #[test]
    fn views_converge_to_the_union_of_live_bookings(ops in proptest::collection::vec(op(), 0..80)) {
        let workers: Vec<u64> = (0..WORKERS).collect();
        let mut cluster = Cluster {
            replicas: (0..REPLICAS).map(|i| Replica::new(i as u64 + 1, &workers)).collect(),
            queues: vec![VecDeque::new(); REPLICAS],
            next_id: REPLICAS as u64 + 1,
            now: Instant::now(),
        };
        let mut model: Model = vec![BTreeMap::new(); REPLICAS];
        for op in ops {
            match op {
                Op::Book(r, q, wid, lo, len) => {
                    let id = format!("q{q}");
                    if model[r].contains_key(&id) { continue; }
                    let blocks = hashes(u64::from(lo)..u64::from(lo + len));
                    cluster.replicas[r].book(&id, wid, &blocks);
                    model[r].insert(id, (wid, blocks.iter().map(|b| b.0).collect(), blocks.len() as u64 * 16, 0));
                }
                Op::Prefill(r, q) => {
                    let id = format!("q{q}");
                    let ok = cluster.replicas[r].sched.mark_prefill_completed(&id).is_ok();
                    prop_assert_eq!(ok, model[r].contains_key(&id));
                    if let Some(e) = model[r].get_mut(&id) { e.2 = 0; }
                }
                Op::Output(r, q) => {
                    let id = format!("q{q}");
                    prop_assert_eq!(cluster.replicas[r].sched.add_output_block(&id).is_ok(), model[r].contains_key(&id));
                    if let Some(e) = model[r].get_mut(&id) { e.3 += 1; }
                }
                Op::Free(r, q) => {
                    let id = format!("q{q}");
                    prop_assert_eq!(cluster.replicas[r].sched.free(&id).is_ok(), model[r].remove(&id).is_some());
                }
                Op::Deliver(r, drop_first) => cluster.deliver(r, drop_first),
                Op::Tick => cluster.tick(),
                Op::Restart(r) => {
                    let id = cluster.next_id;
                    cluster.next_id += 1;
                    cluster.collect();
                    cluster.queues[r].clear();
                    cluster.replicas[r] = Replica::new(id, &workers);
                    model[r].clear();
                    // Peers only learn of the death by silence.
                    cluster.now += cluster.replicas[r].sync.config().peer_ttl;
                }
            }
        }
        cluster.settle();
        let expected = expected_loads(&model);
        for (i, r) in cluster.replicas.iter().enumerate() {
            prop_assert!(r.sync.all_synced(), "replica {} unsynced", i);
            prop_assert_eq!(r.loads(), expected.clone(), "replica {}", i);
        }
    }
}
