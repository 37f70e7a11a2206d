//! [`FpmDirectPublisher`]: an in-process FPM producer.
//!
//! `publish` only validates the rank and hands the sample to that rank's task (an unbounded
//! channel send, no serialisation on the caller's thread). Each rank's task numbers its
//! snapshots (`counter_id` from 1), encodes them and, after [`IDLE_HEARTBEAT_INTERVAL`]
//! without a sample, emits a zeroed heartbeat (then one per interval while idle). One
//! outlet task owns the event-plane publisher, so snapshots of a rank leave in order.
//!
//! On the brokerless event plane, while no subscriber is connected (a worker behind a
//! frontend that runs no planner), samples are dropped in `publish`: no task wakes and
//! nothing is encoded per pass. `counter_id` numbers the snapshots sent, so a subscriber
//! that connects later sees them numbered without gaps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use dynamo_runtime::events::{EventPublisher, EventScope};
use dynamo_runtime::{DistributedRuntime, EndpointId};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{FPM_TOPIC, FpmSample, IDLE_HEARTBEAT_INTERVAL};
use crate::error::{Error, Result};

/// The event-plane side shared by FPM producers: a queue drained by a task that owns the
/// endpoint-scoped publisher (creating one is asynchronous).
pub(crate) struct Outlet {
    tx: mpsc::UnboundedSender<Bytes>,
    /// The publisher once the task has set it up (for [`Outlet::wanted`]).
    publisher: Arc<OnceLock<EventPublisher>>,
}

impl Outlet {
    /// Start the outlet task. Must be called inside the tokio runtime.
    pub(crate) fn start(
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
        stop: CancellationToken,
    ) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        let (rt, scope) = (runtime.clone(), EventScope::endpoint(endpoint));
        let shared = Arc::new(OnceLock::new());
        let set = Arc::clone(&shared);
        tokio::spawn(async move {
            let publisher = tokio::select! {
                p = rt.event_publisher(&scope, FPM_TOPIC) => p,
                () = stop.cancelled() => return,
            };
            let publisher = match publisher {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "FPM: event publisher unavailable");
                    return;
                }
            };
            let _ = set.set(publisher.clone());
            loop {
                let item = tokio::select! {
                    biased;
                    () = stop.cancelled() => None,
                    item = rx.recv() => item,
                };
                let Some(item) = item else { break };
                if let Err(e) = publisher.publish(&item) {
                    tracing::debug!(error = %e, "FPM snapshot not published");
                }
            }
            // Let NATS deliver what was queued before the channel goes away.
            let _ = publisher.flush().await;
        });
        Self {
            tx,
            publisher: shared,
        }
    }

    /// Whether a payload sent now can reach anyone: until the publisher is set up (payloads
    /// queue for it) and over NATS, always; on the brokerless plane, only while a
    /// subscriber is connected (a frame sent to none is dropped there).
    pub(crate) fn wanted(&self) -> bool {
        self.publisher
            .get()
            .is_none_or(EventPublisher::has_audience)
    }

    /// Queue a payload (never blocks).
    pub(crate) fn send(&self, payload: Bytes) {
        let _ = self.tx.send(payload);
    }
}

/// An in-process FPM producer with one channel per DP rank (dropping it shuts it down).
pub struct FpmDirectPublisher {
    ranks: Vec<Rank>,
    outlet: Arc<Outlet>,
    stop: CancellationToken,
}

/// One DP rank's channel to its task.
struct Rank {
    tx: mpsc::UnboundedSender<FpmSample>,
    /// A sample was dropped (no subscriber) since the task last looked: the rank is busy,
    /// so its idle heartbeat is not due.
    dropped: Arc<AtomicBool>,
}

impl Drop for FpmDirectPublisher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FpmDirectPublisher {
    /// A publisher for `worker_id` with `dp_size` ranks on `endpoint`'s FPM channel. Must
    /// be called inside the tokio runtime.
    pub fn new(
        runtime: &DistributedRuntime,
        endpoint: &EndpointId,
        worker_id: &str,
        dp_size: u32,
    ) -> Self {
        let stop = CancellationToken::new();
        let outlet = Arc::new(Outlet::start(runtime, endpoint, stop.clone()));
        let ranks = (0..dp_size)
            .map(|rank| {
                let (tx, rx) = mpsc::unbounded_channel();
                let dropped = Arc::new(AtomicBool::new(false));
                tokio::spawn(rank_task(
                    rx,
                    worker_id.to_owned(),
                    rank,
                    Arc::clone(&outlet),
                    Arc::clone(&dropped),
                    stop.clone(),
                ));
                Rank { tx, dropped }
            })
            .collect();
        tracing::debug!(worker_id, dp_size, "FPM direct publisher started");
        Self {
            ranks,
            outlet,
            stop,
        }
    }

    /// Publish one pass of `dp_rank`. After [`FpmDirectPublisher::shutdown`] samples are
    /// ignored (as the reference does).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `dp_rank` is not below `dp_size`.
    pub fn publish(&self, dp_rank: u32, sample: FpmSample) -> Result<()> {
        let rank = self.ranks.get(dp_rank as usize).ok_or_else(|| {
            Error::config(
                "dp_rank",
                format!(
                    "{dp_rank} out of range; the publisher was constructed with dp_size={}",
                    self.ranks.len()
                ),
            )
        })?;
        if self.outlet.wanted() {
            let _ = rank.tx.send(sample);
        } else {
            rank.dropped.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stop the rank tasks and withdraw the channel (idempotent).
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}

async fn rank_task(
    mut rx: mpsc::UnboundedReceiver<FpmSample>,
    worker_id: String,
    rank: u32,
    outlet: Arc<Outlet>,
    dropped: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let mut counter = 0u64;
    let mut deadline = Instant::now() + IDLE_HEARTBEAT_INTERVAL;
    let idle = FpmSample::default();
    loop {
        let sample = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            s = rx.recv() => match s {
                Some(s) => Some(s),
                None => break,
            },
            () = tokio::time::sleep_until(deadline) => None,
        };
        // Passes that ran unseen (dropped in `publish`) mean the rank is not idle; and
        // nothing is numbered or encoded for nobody.
        let ran_unseen = sample.is_none() && dropped.swap(false, Ordering::Relaxed);
        if ran_unseen || !outlet.wanted() {
            deadline = Instant::now() + IDLE_HEARTBEAT_INTERVAL;
            continue;
        }
        counter += 1;
        let snapshot = sample
            .as_ref()
            .unwrap_or(&idle)
            .snapshot(&worker_id, rank, counter);
        match snapshot.encode() {
            Ok(bytes) => outlet.send(Bytes::from(bytes)),
            Err(e) => tracing::warn!(error = %e, "FPM snapshot not encoded"),
        }
        deadline = if sample.is_some() {
            Instant::now() + IDLE_HEARTBEAT_INTERVAL
        } else {
            deadline + IDLE_HEARTBEAT_INTERVAL
        };
    }
}
