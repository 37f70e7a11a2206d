//! [`FpmDirectPublisher`]: an in-process FPM producer.
//!
//! `publish` only validates the rank and hands the sample to that rank's task (an unbounded
//! channel send, no serialisation on the caller's thread). Each rank's task numbers its
//! snapshots (`counter_id` from 1), encodes them and, after [`IDLE_HEARTBEAT_INTERVAL`]
//! without a sample, emits a zeroed heartbeat (then one per interval while idle). One
//! outlet task owns the event-plane publisher, so snapshots of a rank leave in order.

use std::sync::Arc;

use bytes::Bytes;
use dynamo_runtime::events::EventScope;
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
        Self { tx }
    }

    /// Queue a payload (never blocks).
    pub(crate) fn send(&self, payload: Bytes) {
        let _ = self.tx.send(payload);
    }
}

/// An in-process FPM producer with one channel per DP rank (dropping it shuts it down).
pub struct FpmDirectPublisher {
    ranks: Vec<mpsc::UnboundedSender<FpmSample>>,
    stop: CancellationToken,
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
                tokio::spawn(rank_task(
                    rx,
                    worker_id.to_owned(),
                    rank,
                    Arc::clone(&outlet),
                    stop.clone(),
                ));
                tx
            })
            .collect();
        tracing::debug!(worker_id, dp_size, "FPM direct publisher started");
        Self { ranks, stop }
    }

    /// Publish one pass of `dp_rank`. After [`FpmDirectPublisher::shutdown`] samples are
    /// ignored (as the reference does).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `dp_rank` is not below `dp_size`.
    pub fn publish(&self, dp_rank: u32, sample: FpmSample) -> Result<()> {
        let tx = self.ranks.get(dp_rank as usize).ok_or_else(|| {
            Error::config(
                "dp_rank",
                format!(
                    "{dp_rank} out of range; the publisher was constructed with dp_size={}",
                    self.ranks.len()
                ),
            )
        })?;
        let _ = tx.send(sample);
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
