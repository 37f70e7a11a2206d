//! Router replica sync: several routers in front of the same workers share the load they
//! booked, so a burst split across replicas spreads as if one router had seen it.
//!
//! This module is transport-agnostic: it defines the messages ([`SyncMessage`]), the state
//! each replica keeps about its peers ([`ReplicaSync`]) and how peers' bookings are applied
//! to a load tracker ([`BookingTracker`], implemented by [`Scheduler`]). The runtime routers
//! carry the messages over the event plane (`dynamo-llm`'s `kv_routing::replica_sync`);
//! standalone services can carry the same JSON over ZMQ PUB/SUB.
//!
//! # Protocol
//!
//! Every replica has a random [`ReplicaId`] (a restart is a new replica) and numbers its
//! messages `0, 1, 2, ...`. It broadcasts:
//! * [`SyncBody::Booked`] / [`SyncBody::PrefillCompleted`] / [`SyncBody::OutputBlock`] /
//!   [`SyncBody::Freed`] for each change of its **own** bookings, in the order they happened
//!   (the scheduler emits them under its lock, see [`Scheduler::set_sync_observer`]);
//! * [`SyncBody::Heartbeat`] every heartbeat interval;
//! * [`SyncBody::Snapshot`] (all its own bookings) when a peer asks with
//!   [`SyncBody::SnapshotRequest`];
//! * [`SyncBody::Goodbye`] when it stops cleanly.
//!
//! # Invariants
//!
//! * A replica never applies its own messages, and keeps peers' bookings under keys
//!   ([`remote_key`]) that cannot collide with its own request ids.
//! * Per-peer FIFO delivery is assumed (both event planes provide it). A peer whose stream
//!   is not known from its first message (late start, restart of the observer) or shows a
//!   sequence gap (lost messages) is *unsynced*: its snapshot is requested at once and again
//!   on every [`ReplicaSync::tick`] until it arrives. A snapshot replaces everything known
//!   about that peer, so after it the peer's bookings here equal its own.
//! * A peer silent for longer than the TTL (no heartbeat), or that said goodbye, is
//!   forgotten and all its bookings are released here.
//! * A booking for a worker this replica has not registered yet is kept pending and applied
//!   by [`ReplicaSync::reapply`] once the worker is known.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Scheduler;
use crate::hashing::SequenceHash;
use crate::protocols::WorkerWithDpRank;

/// Identity of one router replica (random per process start).
pub type ReplicaId = u64;

/// One booking as a replica holds it: which worker rank, which blocks, how many prompt
/// tokens still wait for prefill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookingRecord {
    /// The owning replica's request id.
    pub request_id: String,
    /// The worker rank the request was routed to.
    pub worker: WorkerWithDpRank,
    /// Tracked blocks (prompt blocks, plus output blocks when those are tracked).
    pub blocks: Vec<SequenceHash>,
    /// Prompt tokens still waiting for prefill (0 once prefill completed).
    pub prefill_tokens: u64,
}

/// What a replica says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SyncBody {
    /// A request of the sender was booked.
    Booked(BookingRecord),
    /// The request's prefill completed (its prompt tokens stop counting).
    PrefillCompleted {
        /// The sender's request id.
        request_id: String,
    },
    /// The request generated another tracked block.
    OutputBlock {
        /// The sender's request id.
        request_id: String,
        /// The block's (tracking) hash.
        block: SequenceHash,
    },
    /// The request finished: its load is released.
    Freed {
        /// The sender's request id.
        request_id: String,
    },
    /// The sender is alive.
    Heartbeat,
    /// The sender asks for a snapshot: of `target` only, or of every peer when `None`.
    SnapshotRequest {
        /// The replica asked (`None`: all).
        target: Option<ReplicaId>,
    },
    /// All the sender's bookings now (answer to a [`SyncBody::SnapshotRequest`]).
    Snapshot {
        /// The bookings.
        bookings: Vec<BookingRecord>,
    },
    /// The sender stops: release its bookings now rather than at TTL expiry.
    Goodbye,
}

/// One message on the wire (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncMessage {
    /// The sender.
    pub replica: ReplicaId,
    /// The sender's message number (consecutive from 0).
    pub seq: u64,
    /// The content.
    #[serde(flatten)]
    pub body: SyncBody,
}

/// Timing of replica sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSyncConfig {
    /// How often a replica says it is alive (and re-asks unsynced peers for snapshots).
    pub heartbeat: Duration,
    /// Silence after which a peer is considered dead and its bookings are released.
    pub peer_ttl: Duration,
}

impl Default for ReplicaSyncConfig {
    fn default() -> Self {
        // One heartbeat a second costs nothing; a TTL of six heartbeats rides out a busy
        // event loop or a NATS reconnect without dropping a live peer's load, while a dead
        // replica's bookings stop skewing routing within seconds.
        Self {
            heartbeat: Duration::from_secs(1),
            peer_ttl: Duration::from_secs(6),
        }
    }
}

impl ReplicaSyncConfig {
    /// A config with `peer_ttl`, and a heartbeat of a sixth of it (at most 1 s) so a live
    /// peer always sends several heartbeats per TTL.
    pub fn with_ttl(peer_ttl: Duration) -> Self {
        Self {
            heartbeat: (peer_ttl / 6).min(Duration::from_secs(1)),
            peer_ttl,
        }
    }
}

/// Something the transport must do after [`ReplicaSync::handle`] or [`ReplicaSync::tick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncAction {
    /// Send a [`SyncBody::SnapshotRequest`] targeted at this peer.
    RequestSnapshot(ReplicaId),
    /// Send a snapshot of our bookings (ordered with our other messages: for a
    /// [`Scheduler`], call [`Scheduler::emit_snapshot`]).
    SendSnapshot,
}

/// A load tracker that can hold peers' bookings next to its own.
///
/// `key` is [`remote_key`] of the booking's replica and request id. Every method is
/// infallible from the caller's view: unknown keys are ignored (a peer's `Freed` for a
/// booking this replica never saw is normal after a late start).
pub trait BookingTracker {
    /// Book a peer's request; `false` if its worker is not registered here (yet).
    fn book_remote(&self, key: &str, record: &BookingRecord) -> bool;
    /// A peer's request completed prefill.
    fn remote_prefill_completed(&self, key: &str);
    /// A peer's request holds another block.
    fn remote_output_block(&self, key: &str, block: SequenceHash);
    /// Release a peer's request.
    fn free_remote(&self, key: &str);
}

/// The tracker key of `replica`'s request `request_id`. It starts with a NUL byte, which
/// request ids (HTTP request ids, UUIDs) never do, so it cannot collide with a local id.
pub fn remote_key(replica: ReplicaId, request_id: &str) -> String {
    format!("\0{replica:016x}\0{request_id}")
}

#[derive(Debug)]
struct PeerBooking {
    record: BookingRecord,
    applied: bool,
}

#[derive(Debug)]
struct Peer {
    last_seen: Instant,
    next_seq: u64,
    synced: bool,
    bookings: HashMap<String, PeerBooking>,
}

/// One replica's view of its peers (not thread-safe: owned by the transport's task).
#[derive(Debug)]
pub struct ReplicaSync {
    me: ReplicaId,
    next_seq: u64,
    config: ReplicaSyncConfig,
    peers: HashMap<ReplicaId, Peer>,
}

impl ReplicaSync {
    /// The sync state of replica `me`.
    pub fn new(me: ReplicaId, config: ReplicaSyncConfig) -> Self {
        Self {
            me,
            next_seq: 0,
            config,
            peers: HashMap::new(),
        }
    }

    /// This replica's id.
    pub fn id(&self) -> ReplicaId {
        self.me
    }

    /// The timing in force.
    pub fn config(&self) -> ReplicaSyncConfig {
        self.config
    }

    /// Number `body` as this replica's next message.
    pub fn outgoing(&mut self, body: SyncBody) -> SyncMessage {
        let seq = self.next_seq;
        self.next_seq += 1;
        SyncMessage {
            replica: self.me,
            seq,
            body,
        }
    }

    /// Live peers, in id order.
    pub fn peers(&self) -> Vec<ReplicaId> {
        let mut ids: Vec<_> = self.peers.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Whether every known peer's bookings are in sync (no snapshot outstanding).
    pub fn all_synced(&self) -> bool {
        self.peers.values().all(|p| p.synced)
    }

    /// Bookings held for `peer` (applied or pending).
    pub fn peer_bookings(&self, peer: ReplicaId) -> usize {
        self.peers.get(&peer).map_or(0, |p| p.bookings.len())
    }

    /// Apply one received message.
    pub fn handle(
        &mut self,
        msg: SyncMessage,
        now: Instant,
        tracker: &impl BookingTracker,
    ) -> Vec<SyncAction> {
        let mut actions = Vec::new();
        if msg.replica == self.me {
            return actions;
        }
        if let SyncBody::SnapshotRequest { target } = &msg.body
            && target.is_none_or(|t| t == self.me)
        {
            actions.push(SyncAction::SendSnapshot);
        }
        if msg.body == SyncBody::Goodbye {
            if let Some(peer) = self.peers.remove(&msg.replica) {
                release(peer, tracker);
            }
            return actions;
        }
        let peer = self.peers.entry(msg.replica).or_insert_with(|| Peer {
            last_seen: now,
            // A stream seen from its first message needs no snapshot.
            next_seq: 0,
            synced: msg.seq == 0,
            bookings: HashMap::new(),
        });
        peer.last_seen = now;
        if msg.seq < peer.next_seq {
            return actions; // duplicate or stale
        }
        if msg.seq > peer.next_seq {
            peer.synced = false;
        }
        peer.next_seq = msg.seq + 1;
        let replica = msg.replica;
        match msg.body {
            SyncBody::Booked(record) => {
                let key = remote_key(replica, &record.request_id);
                if let Some(old) = peer.bookings.remove(&key)
                    && old.applied
                {
                    tracker.free_remote(&key);
                }
                let applied = tracker.book_remote(&key, &record);
                peer.bookings.insert(key, PeerBooking { record, applied });
            }
            SyncBody::PrefillCompleted { request_id } => {
                let key = remote_key(replica, &request_id);
                if let Some(b) = peer.bookings.get_mut(&key) {
                    b.record.prefill_tokens = 0;
                    if b.applied {
                        tracker.remote_prefill_completed(&key);
                    }
                }
            }
            SyncBody::OutputBlock { request_id, block } => {
                let key = remote_key(replica, &request_id);
                if let Some(b) = peer.bookings.get_mut(&key) {
                    b.record.blocks.push(block);
                    if b.applied {
                        tracker.remote_output_block(&key, block);
                    }
                }
            }
            SyncBody::Freed { request_id } => {
                let key = remote_key(replica, &request_id);
                if let Some(b) = peer.bookings.remove(&key)
                    && b.applied
                {
                    tracker.free_remote(&key);
                }
            }
            SyncBody::Snapshot { bookings } => {
                for (key, b) in peer.bookings.drain() {
                    if b.applied {
                        tracker.free_remote(&key);
                    }
                }
                for record in bookings {
                    let key = remote_key(replica, &record.request_id);
                    let applied = tracker.book_remote(&key, &record);
                    peer.bookings.insert(key, PeerBooking { record, applied });
                }
                peer.synced = true;
            }
            SyncBody::Heartbeat | SyncBody::SnapshotRequest { .. } | SyncBody::Goodbye => {}
        }
        if !peer.synced {
            actions.push(SyncAction::RequestSnapshot(replica));
        }
        actions
    }

    /// Periodic work (every heartbeat): forget peers silent for longer than the TTL
    /// (releasing their bookings), apply pending bookings whose worker is now known, and
    /// re-ask unsynced peers for their snapshot. The caller also sends a heartbeat.
    pub fn tick(&mut self, now: Instant, tracker: &impl BookingTracker) -> Vec<SyncAction> {
        let ttl = self.config.peer_ttl;
        let dead: Vec<ReplicaId> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.last_seen) > ttl)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            if let Some(peer) = self.peers.remove(&id) {
                release(peer, tracker);
            }
        }
        self.reapply(tracker);
        let mut unsynced: Vec<ReplicaId> = self
            .peers
            .iter()
            .filter(|(_, p)| !p.synced)
            .map(|(id, _)| *id)
            .collect();
        unsynced.sort_unstable();
        unsynced
            .into_iter()
            .map(SyncAction::RequestSnapshot)
            .collect()
    }

    /// Forget which peers' bookings were applied: the tracker was replaced (a new
    /// scheduler for the same workers), so the next [`Self::reapply`] books them all on it.
    pub fn mark_unapplied(&mut self) {
        for peer in self.peers.values_mut() {
            for b in peer.bookings.values_mut() {
                b.applied = false;
            }
        }
    }

    /// Bookings held for every peer (applied or pending).
    pub fn total_peer_bookings(&self) -> usize {
        self.peers.values().map(|p| p.bookings.len()).sum()
    }

    /// Apply pending bookings (their worker was not registered when they arrived).
    pub fn reapply(&mut self, tracker: &impl BookingTracker) {
        for peer in self.peers.values_mut() {
            for (key, b) in &mut peer.bookings {
                if !b.applied {
                    b.applied = tracker.book_remote(key, &b.record);
                }
            }
        }
    }
}

fn release(peer: Peer, tracker: &impl BookingTracker) {
    for (key, b) in peer.bookings {
        if b.applied {
            tracker.free_remote(&key);
        }
    }
}

impl BookingTracker for Scheduler {
    fn book_remote(&self, key: &str, record: &BookingRecord) -> bool {
        self.book_remote(key, record)
    }

    fn remote_prefill_completed(&self, key: &str) {
        self.remote_prefill_completed(key);
    }

    fn remote_output_block(&self, key: &str, block: SequenceHash) {
        self.remote_output_block(key, block);
    }

    fn free_remote(&self, key: &str) {
        self.free_remote(key);
    }
}

#[cfg(test)]
mod tests;
