//! Router replica sync over the event plane (`router_replica_sync`): routers of the same
//! endpoint share their bookings so each sees the load the others placed.
//!
//! The protocol and its state live in `dynamo_kv_router::scheduling::replica_sync`; this
//! module only carries its JSON messages on the topic `router-replicas.{endpoint}` of the
//! workers' component scope (brokerless TCP or NATS, whichever the runtime uses), and
//! drives its clock. One task per router owns the [`ReplicaSync`] state: it numbers and
//! publishes the scheduler's own booking changes (handed over by the scheduler's observer,
//! in order), applies peers' messages to the scheduler, heartbeats, expires silent peers
//! and answers snapshot requests.
//!
//! Timing: `DYN_ROUTER_REPLICA_SYNC_TTL_SECS` (default 6) is how long a silent peer keeps
//! its bookings here; heartbeats go out at a sixth of it (at most every second).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_kv_router::scheduling::Scheduler;
use dynamo_kv_router::scheduling::replica_sync::{
    ReplicaSync, ReplicaSyncConfig, SyncAction, SyncBody, SyncMessage,
};
use dynamo_runtime::{DistributedRuntime, EndpointId};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::Result;
use super::bus::{self, TopicMessage, TopicPublisher};

/// Topic prefix of replica sync (the endpoint name follows).
pub const REPLICA_SYNC_TOPIC: &str = "router-replicas";

/// Environment variable: a silent peer's bookings expire after this many seconds.
pub const REPLICA_SYNC_TTL_ENV: &str = "DYN_ROUTER_REPLICA_SYNC_TTL_SECS";

/// What the sync task needs from its router.
pub(super) trait SyncedRouter: Send + Sync + 'static {
    /// The router's scheduler.
    fn scheduler(&self) -> &Scheduler;
    /// Notified when a worker rank is registered (pending peer bookings may now apply).
    fn rank_joined(&self) -> &Notify;
}

/// Timing from the environment (defaults of [`ReplicaSyncConfig`] otherwise).
pub fn config_from_env() -> ReplicaSyncConfig {
    std::env::var(REPLICA_SYNC_TTL_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or_else(ReplicaSyncConfig::default, |s| {
            ReplicaSyncConfig::with_ttl(Duration::from_secs_f64(s))
        })
}

/// Start replica sync for the router of `endpoint` until `stop` fires. Must be called
/// inside the tokio runtime.
///
/// # Errors
/// Empty names.
pub(super) fn spawn(
    runtime: &DistributedRuntime,
    endpoint: &EndpointId,
    router: Arc<impl SyncedRouter>,
    stop: CancellationToken,
) -> Result<()> {
    let topic = format!("{REPLICA_SYNC_TOPIC}.{}", endpoint.name);
    let publisher = TopicPublisher::new(runtime, &endpoint.namespace, &endpoint.component, &topic)?;
    let incoming = bus::subscribe(
        runtime,
        &endpoint.namespace,
        &endpoint.component,
        &topic,
        stop.child_token(),
    )?;
    let (tx, own) = mpsc::unbounded_channel::<SyncBody>();
    // Called under the scheduler's lock: only a channel send.
    router.scheduler().set_sync_observer(Box::new(move |body| {
        let _ = tx.send(body);
    }));
    // Kept below 2^53 so JSON readers that use doubles keep it exact.
    let id = fastrand::u64(1..1 << 53);
    let sync = ReplicaSync::new(id, config_from_env());
    tracing::debug!(replica = format_args!("{id:x}"), %endpoint, "router replica sync on");
    tokio::spawn(run(
        Task {
            sync,
            router,
            publisher,
        },
        own,
        incoming,
        stop,
    ));
    Ok(())
}

struct Task<R> {
    sync: ReplicaSync,
    router: Arc<R>,
    publisher: TopicPublisher,
}

impl<R: SyncedRouter> Task<R> {
    fn send(&mut self, body: SyncBody) {
        let msg = self.sync.outgoing(body);
        match serde_json::to_vec(&msg) {
            Ok(bytes) => self.publisher.publish(bytes.into()),
            Err(e) => tracing::warn!(error = %e, "replica sync message not encoded"),
        }
    }

    fn act(&mut self, actions: Vec<SyncAction>) {
        for action in actions {
            match action {
                SyncAction::RequestSnapshot(peer) => {
                    self.send(SyncBody::SnapshotRequest { target: Some(peer) });
                }
                // Through the observer channel, in order with our booking changes.
                SyncAction::SendSnapshot => self.router.scheduler().emit_snapshot(),
            }
        }
    }
}

async fn run<R: SyncedRouter>(
    mut task: Task<R>,
    mut own: mpsc::UnboundedReceiver<SyncBody>,
    mut incoming: mpsc::UnboundedReceiver<TopicMessage>,
    stop: CancellationToken,
) {
    // Peers already running answer with their snapshots; those that miss this request
    // are noticed later (their first message seen has seq > 0) and asked again.
    task.send(SyncBody::SnapshotRequest { target: None });
    let mut tick = tokio::time::interval(task.sync.config().heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let router = Arc::clone(&task.router);
    loop {
        tokio::select! {
            Some(body) = own.recv() => task.send(body),
            msg = incoming.recv() => {
                let Some(TopicMessage::Payload { payload, .. }) = msg else { break };
                match serde_json::from_slice::<SyncMessage>(&payload) {
                    Ok(msg) => {
                        let actions = task.sync.handle(msg, Instant::now(), router.scheduler());
                        task.act(actions);
                    }
                    Err(e) => tracing::debug!(error = %e, "malformed replica sync message"),
                }
            }
            _ = tick.tick() => {
                task.send(SyncBody::Heartbeat);
                let actions = task.sync.tick(Instant::now(), router.scheduler());
                task.act(actions);
            }
            () = router.rank_joined().notified() => task.sync.reapply(router.scheduler()),
            () = stop.cancelled() => break,
        }
    }
    // Best effort: peers release our bookings now instead of at TTL expiry. The
    // publisher's queue is drained by its own task; give it a moment before dropping it.
    task.send(SyncBody::Goodbye);
    tokio::time::sleep(Duration::from_millis(20)).await;
}
