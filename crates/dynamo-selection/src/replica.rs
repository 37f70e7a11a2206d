//! Replica sync between standalone services (`--replica-sync-port`,
//! `--replica-sync-peers`; `SelectionService(replica_sync_port=..., replica_sync_peers=...)`)
//! over ZMQ PUB/SUB: several select services or slot trackers in front of the same workers
//! share the load they booked, so a burst split across them spreads as if one had seen it.
//!
//! The protocol and its merge state are the runtime routers' own
//! (`dynamo_kv_router::scheduling::replica_sync`: [`ReplicaSync`], [`SyncBody`]), run once
//! per (model, routing group) — each group has its own scheduler — under one random
//! replica id per process. This module is only the transport and the clock:
//!
//! * Each replica binds a PUB socket (`kv_routing::zmq_pub`) on its sync port and
//!   subscribes (`kv_routing::zmq`'s SUB client, re-dialling 100 ms → 2 s) to every peer's.
//! * A message is two frames: the topic [`TOPIC`] and a JSON object — the group's
//!   `model_name` and `routing_group` next to the runtime sync message's fields
//!   (`replica`, `seq`, `type`, ...), e.g.
//!   `{"model_name":"m","routing_group":"default","replica":12345,"seq":7,"type":"booked",
//!   "request_id":"r1","worker":{"worker_id":1,"dp_rank":0},"blocks":[...],"prefill_tokens":64}`.
//!   `seq` counts per (replica, group) from 0.
//! * A scheduler's own booking changes (booked, prefill completed, output block, freed)
//!   reach the sync task through its observer, in order, and are published at once.
//! * Every heartbeat (a sixth of the TTL, at most 1 s) each group with a local scheduler
//!   publishes `heartbeat`; a peer silent for longer than the TTL
//!   (`DYN_ROUTER_REPLICA_SYNC_TTL_SECS`, default 6 s) is forgotten here and its bookings
//!   are released. A replica that stops cleanly publishes `goodbye` (released at once).
//! * Catch-up: a replica whose first message from a peer is not that peer's message 0
//!   (it started late, restarted, or missed messages) asks that peer for a `snapshot` on
//!   its own PUB socket, again every heartbeat until one arrives; a snapshot replaces
//!   everything known of that peer in that group. A group that appears here (its first
//!   worker registered) publishes its own (empty) snapshot and asks every peer for
//!   theirs. Requests travel on the asker's PUB socket, so peers must list each other
//!   (a symmetric mesh); a one-way subscriber still applies every change it hears but
//!   stays without the bookings made before it joined.
//! * A peer's booking on a worker not registered here yet is kept and booked once the
//!   worker registers; bookings held for a group whose scheduler is made again (its
//!   workers all left and came back) are booked on the new scheduler.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dynamo_kv_router::hashing::SequenceHash;
use dynamo_kv_router::scheduling::Scheduler;
use dynamo_kv_router::scheduling::replica_sync::{
    BookingRecord, BookingTracker, ReplicaSync, ReplicaSyncConfig, SyncAction, SyncBody,
    SyncMessage,
};
use dynamo_llm::kv_routing::zmq::{LinkState, subscribe_loop_observed};
use dynamo_llm::kv_routing::zmq_pub::PubSocket;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::prom::{Kind, PromText};

/// First frame of every replica-sync message (and the peers' subscription).
pub const TOPIC: &[u8] = b"dynamo.replica_sync";

/// A model + routing group.
pub type GroupKey = (String, String);

/// Something that owns a group's scheduler (the select service's group, the slot
/// tracker's).
pub trait SyncTarget: Send + Sync + 'static {
    /// The group's scheduler.
    fn scheduler(&self) -> &Scheduler;
}

/// Where to bind and whom to subscribe to.
#[derive(Debug, Clone)]
pub struct ReplicaSyncOptions {
    /// Address of the PUB socket.
    pub host: String,
    /// Port of the PUB socket (0: any free port).
    pub port: u16,
    /// Peers' PUB endpoints (`tcp://host:port`).
    pub peers: Vec<String>,
    /// Heartbeat and TTL.
    pub config: ReplicaSyncConfig,
}

impl ReplicaSyncOptions {
    /// Options for `port` and `peers`, timing from `DYN_ROUTER_REPLICA_SYNC_TTL_SECS`.
    pub fn new(host: &str, port: u16, peers: Vec<String>) -> Self {
        Self {
            host: host.to_owned(),
            port,
            peers,
            config: dynamo_llm::kv_routing::replica_sync::config_from_env(),
        }
    }
}

/// Parse `"host:port,tcp://host:port,..."` into `tcp://` endpoints.
///
/// # Errors
/// An entry without a numeric port, or another scheme than `tcp`.
pub fn parse_peers(spec: &str) -> Result<Vec<String>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_peer)
        .collect()
}

/// One peer endpoint (see [`parse_peers`]).
///
/// # Errors
/// As [`parse_peers`].
pub fn parse_peer(peer: &str) -> Result<String, String> {
    let rest = match peer.split_once("://") {
        Some(("tcp", rest)) => rest,
        Some((scheme, _)) => {
            return Err(format!(
                "replica sync peer {peer:?}: only tcp:// endpoints are supported, not {scheme}://"
            ));
        }
        None => peer,
    };
    match rest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(format!("tcp://{rest}"))
        }
        _ => Err(format!("replica sync peer {peer:?} has no port")),
    }
}

/// The wire message: the group, then the runtime sync message's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireMessage {
    /// The group's model.
    pub model_name: String,
    /// The group's routing group.
    pub routing_group: String,
    /// The message.
    #[serde(flatten)]
    pub msg: SyncMessage,
}

enum Cmd {
    Own(GroupKey, SyncBody),
    Attach(GroupKey, Arc<dyn SyncTarget>),
    Detach(GroupKey),
    Incoming(Vec<Vec<u8>>),
}

/// Counters and gauges of the sync task.
#[derive(Debug, Default)]
pub struct SyncMetrics {
    /// Messages published.
    pub sent: AtomicU64,
    /// Peers' messages received.
    pub received: AtomicU64,
    /// Messages that did not decode (skipped).
    pub malformed: AtomicU64,
    /// Snapshots received from peers.
    pub snapshots_received: AtomicU64,
    /// Peers that went silent past the TTL or said goodbye.
    pub peers_expired: AtomicU64,
    /// Peer replicas known now (over every group).
    pub peer_replicas: AtomicU64,
    /// Peers' bookings held now (applied or waiting for their worker).
    pub peer_bookings: AtomicU64,
}

/// A running replica sync: its PUB socket, its subscriptions and the task that owns the
/// per-group [`ReplicaSync`] states.
pub struct ReplicaHub {
    tx: mpsc::UnboundedSender<Cmd>,
    addr: SocketAddr,
    peers: Vec<(String, Arc<AtomicBool>)>,
    metrics: Arc<SyncMetrics>,
    stop: CancellationToken,
    finished: CancellationToken,
}

impl ReplicaHub {
    /// Bind the PUB socket, subscribe to the peers and start the sync task on `handle`,
    /// until `stop` fires (then goodbyes are published and the socket closes).
    ///
    /// # Errors
    /// The port cannot be bound.
    pub fn start(
        options: &ReplicaSyncOptions,
        handle: &tokio::runtime::Handle,
        stop: CancellationToken,
    ) -> Result<Arc<Self>, String> {
        let socket = PubSocket::bind(handle, &options.host, options.port).map_err(|e| {
            format!(
                "cannot bind the replica sync port {}:{}: {e}",
                options.host, options.port
            )
        })?;
        let addr = socket.local_addr();
        let (tx, rx) = mpsc::unbounded_channel();
        let metrics = Arc::new(SyncMetrics::default());
        let mut peers = Vec::new();
        for endpoint in &options.peers {
            let up = Arc::new(AtomicBool::new(false));
            peers.push((endpoint.clone(), up.clone()));
            let tx = tx.clone();
            let stop = stop.clone();
            let endpoint = endpoint.clone();
            handle.spawn(async move {
                subscribe_loop_observed(
                    endpoint,
                    TOPIC.to_vec(),
                    stop,
                    || true,
                    move |parts| tx.send(Cmd::Incoming(parts)).is_ok(),
                    move |link| up.store(link == LinkState::Connected, Ordering::Relaxed),
                )
                .await;
            });
        }
        // Kept below 2^53 so JSON readers that use doubles keep it exact.
        let me = fastrand::u64(1..1 << 53);
        let finished = CancellationToken::new();
        let task = Task {
            me,
            config: options.config,
            groups: HashMap::new(),
            socket,
            metrics: metrics.clone(),
        };
        handle.spawn(run(task, rx, stop.clone(), finished.clone()));
        tracing::info!(%addr, replica = format_args!("{me:x}"), peers = options.peers.len(), "replica sync on");
        Ok(Arc::new(Self {
            tx,
            addr,
            peers,
            metrics,
            stop,
            finished,
        }))
    }

    /// The PUB socket's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters.
    pub fn metrics(&self) -> &SyncMetrics {
        &self.metrics
    }

    /// Share the bookings of `target`'s scheduler as group `key`, and book peers' bookings
    /// of that group on it. Call it under the lock that publishes the group (before any
    /// request can be booked on it) and again whenever a worker rank joins the group
    /// (peers' bookings waiting for that worker are booked then).
    pub fn attach(&self, key: &GroupKey, target: Arc<dyn SyncTarget>) {
        let tx = self.tx.clone();
        let k = key.clone();
        // Called under the scheduler's lock: only a channel send.
        target.scheduler().set_sync_observer(Box::new(move |body| {
            let _ = tx.send(Cmd::Own(k.clone(), body));
        }));
        let _ = self.tx.send(Cmd::Attach(key.clone(), target));
    }

    /// The group's scheduler is gone here: its bookings are released at the peers.
    pub fn detach(&self, key: &GroupKey) {
        let _ = self.tx.send(Cmd::Detach(key.clone()));
    }

    /// Stop (goodbyes are published) without waiting.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Stop (goodbyes are published) and wait up to `timeout` for the task to end.
    pub async fn stop_and_wait(&self, timeout: Duration) {
        self.stop.cancel();
        let _ = tokio::time::timeout(timeout, self.finished.cancelled()).await;
    }

    /// Prometheus text, names prefixed `prefix_replica_sync_`.
    pub fn metrics_text(&self, prefix: &str) -> String {
        let m = &self.metrics;
        let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let connected = self
            .peers
            .iter()
            .filter(|(_, up)| up.load(Ordering::Relaxed))
            .count();
        let p = |n: &str| format!("{prefix}_replica_sync_{n}");
        let mut out = PromText::new();
        out.by_label(
            &p("peer_links"),
            Kind::Gauge,
            "Subscriptions to peers' PUB sockets by state",
            "state",
            [
                ("connected", connected),
                ("down", self.peers.len() - connected),
            ],
        )
        .by_label(
            &p("messages_total"),
            Kind::Counter,
            "Replica sync messages",
            "direction",
            [
                ("sent", g(&m.sent)),
                ("received", g(&m.received)),
                ("malformed", g(&m.malformed)),
            ],
        );
        for (name, help, kind, v) in [
            (
                "snapshots_received_total",
                "Snapshots received from peers",
                Kind::Counter,
                g(&m.snapshots_received),
            ),
            (
                "peers_expired_total",
                "Peers forgotten (silent past the TTL, or goodbye)",
                Kind::Counter,
                g(&m.peers_expired),
            ),
            (
                "peer_replicas",
                "Peer replicas known (summed over groups)",
                Kind::Gauge,
                g(&m.peer_replicas),
            ),
            (
                "peer_bookings",
                "Peers' bookings held (applied or waiting for their worker)",
                Kind::Gauge,
                g(&m.peer_bookings),
            ),
        ] {
            out.single(&p(name), kind, help, v);
        }
        out.finish()
    }
}

/// A tracker for a group without a local scheduler: peers' bookings wait.
struct NoTracker;

impl BookingTracker for NoTracker {
    fn book_remote(&self, _: &str, _: &BookingRecord) -> bool {
        false
    }
    fn remote_prefill_completed(&self, _: &str) {}
    fn remote_output_block(&self, _: &str, _: SequenceHash) {}
    fn free_remote(&self, _: &str) {}
}

struct GroupState {
    sync: ReplicaSync,
    target: Option<Arc<dyn SyncTarget>>,
}

struct Task {
    me: u64,
    config: ReplicaSyncConfig,
    /// Never shrinks: a group's own message numbers must not start again.
    groups: HashMap<GroupKey, GroupState>,
    socket: PubSocket,
    metrics: Arc<SyncMetrics>,
}

impl Task {
    fn state(&mut self, key: &GroupKey) -> &mut GroupState {
        let (me, config) = (self.me, self.config);
        self.groups
            .entry(key.clone())
            .or_insert_with(|| GroupState {
                sync: ReplicaSync::new(me, config),
                target: None,
            })
    }

    fn send(&mut self, key: &GroupKey, body: SyncBody) {
        let msg = self.state(key).sync.outgoing(body);
        let wire = WireMessage {
            model_name: key.0.clone(),
            routing_group: key.1.clone(),
            msg,
        };
        match serde_json::to_vec(&wire) {
            Ok(bytes) => {
                self.socket.send(&[TOPIC, bytes.as_slice()]);
                self.metrics.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "replica sync message not encoded"),
        }
    }

    fn act(&mut self, key: &GroupKey, actions: Vec<SyncAction>) {
        for action in actions {
            match action {
                SyncAction::RequestSnapshot(peer) => {
                    self.send(key, SyncBody::SnapshotRequest { target: Some(peer) });
                }
                SyncAction::SendSnapshot => {
                    // Through the observer, in order with our booking changes. Without a
                    // scheduler here we have no bookings in the group (and said goodbye
                    // when it went): nothing to answer.
                    if let Some(t) = self.state(key).target.clone() {
                        t.scheduler().emit_snapshot();
                    }
                }
            }
        }
    }

    fn incoming(&mut self, parts: &[Vec<u8>]) {
        let Some(wire) = parts
            .last()
            .and_then(|p| serde_json::from_slice::<WireMessage>(p).ok())
        else {
            self.metrics.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if wire.msg.replica == self.me {
            return;
        }
        self.metrics.received.fetch_add(1, Ordering::Relaxed);
        if matches!(wire.msg.body, SyncBody::Snapshot { .. }) {
            self.metrics
                .snapshots_received
                .fetch_add(1, Ordering::Relaxed);
        }
        if wire.msg.body == SyncBody::Goodbye {
            self.metrics.peers_expired.fetch_add(1, Ordering::Relaxed);
        }
        let key = (wire.model_name, wire.routing_group);
        let now = Instant::now();
        let st = self.state(&key);
        let actions = match st.target.clone() {
            Some(t) => st.sync.handle(wire.msg, now, t.scheduler()),
            None => st.sync.handle(wire.msg, now, &NoTracker),
        };
        self.act(&key, actions);
    }

    fn attach(&mut self, key: &GroupKey, target: Arc<dyn SyncTarget>) {
        let st = self.state(key);
        let same = st
            .target
            .as_ref()
            .is_some_and(|t| std::ptr::addr_eq(Arc::as_ptr(t), Arc::as_ptr(&target)));
        // A worker (re)joined, or the scheduler is new: book every peer booking (again:
        // removing a worker drops the bookings on it, and re-booking a key replaces it).
        st.sync.mark_unapplied();
        st.sync.reapply(target.scheduler());
        if same {
            return;
        }
        st.target = Some(target.clone());
        // Peers learn our (new, empty) state of the group and tell us theirs.
        target.scheduler().emit_snapshot();
        self.send(key, SyncBody::SnapshotRequest { target: None });
    }

    fn detach(&mut self, key: &GroupKey) {
        let st = self.state(key);
        if st.target.take().is_some() {
            st.sync.mark_unapplied();
            self.send(key, SyncBody::Goodbye);
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        let keys: Vec<GroupKey> = self.groups.keys().cloned().collect();
        let mut expired = 0;
        for key in keys {
            let st = self.state(&key);
            let before = st.sync.peers().len();
            let (local, actions) = match st.target.clone() {
                Some(t) => (true, st.sync.tick(now, t.scheduler())),
                None => (false, st.sync.tick(now, &NoTracker)),
            };
            expired += before.saturating_sub(st.sync.peers().len());
            if local {
                self.send(&key, SyncBody::Heartbeat);
            }
            self.act(&key, actions);
        }
        let after: usize = self.groups.values().map(|g| g.sync.peers().len()).sum();
        let bookings: usize = self
            .groups
            .values()
            .map(|g| g.sync.total_peer_bookings())
            .sum();
        self.metrics
            .peers_expired
            .fetch_add(expired as u64, Ordering::Relaxed);
        self.metrics
            .peer_replicas
            .store(after as u64, Ordering::Relaxed);
        self.metrics
            .peer_bookings
            .store(bookings as u64, Ordering::Relaxed);
    }
}

async fn run(
    mut task: Task,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    stop: CancellationToken,
    finished: CancellationToken,
) {
    let mut tick = tokio::time::interval(task.config.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some(cmd) = rx.recv() => match cmd {
                Cmd::Own(key, body) => task.send(&key, body),
                Cmd::Attach(key, target) => task.attach(&key, target),
                Cmd::Detach(key) => task.detach(&key),
                Cmd::Incoming(parts) => task.incoming(&parts),
            },
            _ = tick.tick() => task.tick(),
        }
    }
    // Publish what is still queued (our own last changes), then goodbyes, so peers
    // release our bookings now rather than at TTL expiry.
    while let Ok(cmd) = rx.try_recv() {
        if let Cmd::Own(key, body) = cmd {
            task.send(&key, body);
        }
    }
    let local: Vec<GroupKey> = task
        .groups
        .iter()
        .filter(|(_, g)| g.target.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    for key in local {
        task.send(&key, SyncBody::Goodbye);
    }
    // The connections' writer tasks drain their queues; give them a moment.
    tokio::time::sleep(Duration::from_millis(50)).await;
    task.socket.close();
    finished.cancel();
}

/// Parse the peers of the `SelectionService` constructor or a command line, and start.
///
/// # Errors
/// Bad peers, a port that cannot be bound.
pub fn start_from(
    host: &str,
    port: u16,
    peers: &[String],
    handle: &tokio::runtime::Handle,
    stop: CancellationToken,
) -> Result<Arc<ReplicaHub>, String> {
    let peers = peers
        .iter()
        .map(|p| parse_peer(p))
        .collect::<Result<Vec<_>, _>>()?;
    ReplicaHub::start(&ReplicaSyncOptions::new(host, port, peers), handle, stop)
}

#[cfg(test)]
mod tests;
