//! A [`SelectionService`]'s links to its peers: replica sync of its bookings
//! (`super::super::replica`) and loading a peer's `/dump` into its indexes at start-up
//! (`super::super::recovery`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_kv_router::protocols::RouterEvent;
use dynamo_kv_router::scheduling::Scheduler;
use serde::Deserialize;

use super::super::error::{Result, SelectionError};
use super::super::replica::{self, ReplicaHub, SyncTarget};
use super::{GroupKey, SelectionService, State};
use crate::group::{Group, lock};

impl SyncTarget for Group {
    fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
}

/// One group of a peer's `/dump` (the shape [`SelectionService::dump`] serves).
#[derive(Debug, Clone, Deserialize)]
pub struct PeerDump {
    /// Tokens per block of the peer's group.
    pub block_size: u32,
    /// The peer's index as stored events.
    pub events: Vec<RouterEvent>,
}

/// What [`SelectionService::load_dump`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpLoad {
    /// Events applied to a local index.
    pub applied: u64,
    /// Events the index rejected.
    pub rejected: u64,
    /// Events not applied yet: their group or worker is not registered here, or the
    /// group's block size differs (kept for a worker that registers later).
    pub skipped: u64,
}

impl SelectionService {
    /// Share bookings with peer services over ZMQ: bind a PUB socket on `host:port` (0:
    /// any free port) and subscribe to `peers` (`host:port` or `tcp://host:port`). Groups
    /// that already exist are shared at once; later ones when they appear. Stops with
    /// [`Self::shutdown`].
    ///
    /// # Errors
    /// [`super::super::error::ErrorKind::InvalidRequest`] for a bad peer, a port that
    /// cannot be bound, or replica sync already on.
    pub fn enable_replica_sync(
        &self,
        host: &str,
        port: u16,
        peers: &[String],
    ) -> Result<Arc<ReplicaHub>> {
        let mut st = lock(&self.state);
        Self::check_running(&st)?;
        if st.replica.is_some() {
            return Err(SelectionError::invalid("replica sync is already enabled"));
        }
        let hub = replica::start_from(host, port, peers, &self.handle, self.stop.child_token())
            .map_err(SelectionError::invalid)?;
        for (key, g) in &st.groups {
            hub.attach(key, g.clone());
        }
        st.replica = Some(hub.clone());
        Ok(hub)
    }

    /// The replica sync, when enabled.
    pub fn replica_hub(&self) -> Option<Arc<ReplicaHub>> {
        lock(&self.state).replica.clone()
    }

    /// Apply a peer's `/dump` (keyed `"model:group"`) to the local indexes: the events of
    /// each group that exists here with the same block size, for the workers registered
    /// here in it. The other events are kept for [`RECOVERED_TTL`] and applied when their
    /// worker registers in that group (with that block size). Stored events are
    /// idempotent, so applying a dump to an index that already received some of the same
    /// events from the engines is harmless.
    pub fn load_dump(&self, dump: &BTreeMap<String, PeerDump>) -> DumpLoad {
        // A one-time start-up step: the state lock is held throughout, so a worker that
        // registers meanwhile gets its events either here or at its registration.
        let mut st = lock(&self.state);
        let mut out = DumpLoad::default();
        let mut later: BTreeMap<(String, u64), (u32, Vec<RouterEvent>)> = BTreeMap::new();
        for (name, d) in dump {
            for e in &d.events {
                let group = st.workers.get(&e.worker_id).and_then(|w| {
                    w.group
                        .as_ref()
                        .filter(|(k, g)| {
                            format!("{}:{}", k.0, k.1) == *name && g.block_size == d.block_size
                        })
                        .map(|(_, g)| g.clone())
                });
                match group {
                    Some(g) => match g.tree.apply_router_event(e) {
                        Ok(()) => out.applied += 1,
                        Err(_) => out.rejected += 1,
                    },
                    None => {
                        out.skipped += 1;
                        later
                            .entry((name.clone(), e.worker_id))
                            .or_insert_with(|| (d.block_size, Vec::new()))
                            .1
                            .push(e.clone());
                    }
                }
            }
        }
        st.recovered = Some(Recovered {
            until: Instant::now() + RECOVERED_TTL,
            events: later,
        });
        out
    }

    /// Apply the recovered events kept for `worker_id` in group `key` (it has just
    /// registered there), under the state lock.
    pub(super) fn apply_recovered(st: &mut State, key: &GroupKey, worker_id: u64, group: &Group) {
        let Some(rec) = &mut st.recovered else {
            return;
        };
        if Instant::now() > rec.until {
            st.recovered = None;
            return;
        }
        let name = format!("{}:{}", key.0, key.1);
        if let Some((bs, events)) = rec.events.remove(&(name, worker_id)) {
            if bs != group.block_size {
                return;
            }
            let applied = events
                .iter()
                .filter(|e| group.tree.apply_router_event(e).is_ok())
                .count();
            tracing::info!(
                worker_id,
                applied,
                "recovered index events applied at registration"
            );
        }
    }
}

/// How long events of a peer's dump wait for their worker to register.
pub(crate) const RECOVERED_TTL: Duration = Duration::from_secs(60);

/// Events of a peer's dump not applied yet: `("model:group", worker)` → (block size,
/// events).
pub(super) struct Recovered {
    until: Instant,
    events: BTreeMap<(String, u64), (u32, Vec<RouterEvent>)>,
}
