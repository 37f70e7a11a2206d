//! [`FpmSubscriber`]: FPM snapshots of every publisher of an endpoint, discovered through
//! the event plane.
//!
//! Two modes, chosen by the first call and exclusive afterwards:
//!
//! * **recv**: [`FpmSubscriber::recv`] yields each valid payload (raw msgpack bytes), or
//!   `None` once the subscriber is shut down or the runtime stops.
//! * **tracking**: [`FpmSubscriber::start_tracking`] keeps the latest payload per
//!   `(worker_id, dp_rank)`. As in the reference, only workers whose model card is in
//!   discovery (`v1/mdc/{ns}/{component}/...`, the worker id being the instance id in
//!   decimal) are kept, and a worker's entries are purged when its card disappears (the
//!   worker stopped or died).
//!
//! Payloads that are not snapshots are dropped and counted in both modes
//! ([`super::malformed_total`]); the subscription itself never ends because of one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use dynamo_runtime::discovery::watch_prefix;
use dynamo_runtime::events::EventScope;
use dynamo_runtime::{DistributedRuntime, EndpointId};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{FPM_TOPIC, ForwardPassMetrics, count_malformed};
use crate::discovery::MDC_ROOT;

/// Snapshots a slow `recv` consumer may lag behind before new ones are dropped (about a
/// minute of one busy engine at 1 ms passes; bounded so a forgotten subscriber cannot grow).
const RECV_QUEUE: usize = 65_536;

/// Latest snapshots by `(worker_id, dp_rank)`.
pub type RecentStats = HashMap<(String, u32), Bytes>;

#[derive(Default)]
struct Tracker {
    stats: Mutex<RecentStats>,
    /// worker id (decimal instance id) → model card JSON.
    cards: Mutex<BTreeMap<String, String>>,
}

enum Mode {
    Idle,
    Recv(Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>),
    Tracking(Arc<Tracker>),
}

/// A consumer of an endpoint's FPM channel (dropping it stops its tasks).
pub struct FpmSubscriber {
    runtime: DistributedRuntime,
    endpoint: EndpointId,
    mode: Mutex<Mode>,
    stop: CancellationToken,
}

impl Drop for FpmSubscriber {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Subscribe and hand each valid snapshot (decoded, with its raw bytes) to `on_payload`
/// until `stop`, the runtime, or `on_payload` (returning false) ends it.
fn spawn_consumer<F>(
    runtime: &DistributedRuntime,
    endpoint: &EndpointId,
    stop: CancellationToken,
    mut on_payload: F,
) where
    F: FnMut(ForwardPassMetrics, Bytes) -> bool + Send + 'static,
{
    let (rt, scope) = (runtime.clone(), EventScope::endpoint(endpoint));
    tokio::spawn(async move {
        let sub = tokio::select! {
            s = rt.subscribe(&scope, FPM_TOPIC) => s,
            () = stop.cancelled() => return,
        };
        let mut sub = match sub {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "FPM subscription failed");
                return;
            }
        };
        loop {
            let event = tokio::select! {
                biased;
                () = stop.cancelled() => None,
                e = sub.next() => e,
            };
            let Some(event) = event else { break };
            match ForwardPassMetrics::decode(&event.payload) {
                Ok(m) => {
                    if !on_payload(m, event.payload) {
                        break;
                    }
                }
                Err(e) => {
                    count_malformed();
                    tracing::warn!(error = %e, publisher_id = event.publisher_id, "malformed FPM payload dropped");
                }
            }
        }
    });
}

impl FpmSubscriber {
    /// A subscriber of `endpoint`'s FPM channel; starts nothing yet.
    pub fn new(runtime: &DistributedRuntime, endpoint: &EndpointId) -> Self {
        expose_counter(runtime);
        Self {
            runtime: runtime.clone(),
            endpoint: endpoint.clone(),
            mode: Mutex::new(Mode::Idle),
            stop: CancellationToken::new(),
        }
    }

    fn receiver(&self) -> Result<Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>, String> {
        let mut mode = lock(&self.mode);
        match &*mode {
            Mode::Recv(rx) => return Ok(Arc::clone(rx)),
            Mode::Tracking(_) => return Err("Cannot call recv() after start_tracking()".into()),
            Mode::Idle => {}
        }
        let (tx, rx) = mpsc::channel(RECV_QUEUE);
        spawn_consumer(
            &self.runtime,
            &self.endpoint,
            self.stop.clone(),
            move |_, payload| match tx.try_send(payload) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::debug!("FPM recv queue full: snapshot dropped");
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
        );
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        *mode = Mode::Recv(Arc::clone(&rx));
        Ok(rx)
    }

    /// The next payload; `None` once shut down. The first call starts recv mode (must be
    /// called inside the tokio runtime or from a thread that can enter it).
    ///
    /// # Errors
    /// Tracking mode is active.
    pub async fn recv(&self) -> Result<Option<Bytes>, String> {
        let rx = self.receiver()?;
        let mut rx = rx.lock().await;
        Ok(tokio::select! {
            biased;
            () = self.stop.cancelled() => None,
            () = self.runtime.stopped() => None,
            p = rx.recv() => p,
        })
    }

    /// Start tracking mode. Must be called inside the tokio runtime.
    ///
    /// # Errors
    /// recv mode is active, or tracking already started.
    pub fn start_tracking(&self) -> Result<(), String> {
        let mut mode = lock(&self.mode);
        match &*mode {
            Mode::Recv(_) => return Err("Cannot call start_tracking() after recv()".into()),
            Mode::Tracking(_) => return Err("Tracking already started".into()),
            Mode::Idle => {}
        }
        let tracker = Arc::new(Tracker::default());
        let t = Arc::clone(&tracker);
        spawn_consumer(
            &self.runtime,
            &self.endpoint,
            self.stop.clone(),
            move |m, payload| {
                if lock(&t.cards).contains_key(&m.worker_id) {
                    lock(&t.stats).insert((m.worker_id, m.dp_rank), payload);
                }
                true
            },
        );
        let prefix = format!(
            "{MDC_ROOT}{}/{}/",
            self.endpoint.namespace, self.endpoint.component
        );
        let mut cards = watch_prefix(Arc::clone(self.runtime.kv_store()), prefix.clone());
        let (t, stop) = (Arc::clone(&tracker), self.stop.clone());
        tokio::spawn(async move {
            loop {
                let now = cards_by_worker(&cards.borrow_and_update(), &prefix);
                lock(&t.stats).retain(|(w, _), _| now.contains_key(w));
                *lock(&t.cards) = now;
                tokio::select! {
                    r = cards.changed() => if r.is_err() { break },
                    () = stop.cancelled() => break,
                }
            }
        });
        *mode = Mode::Tracking(tracker);
        Ok(())
    }

    fn tracker(&self) -> Result<Arc<Tracker>, String> {
        match &*lock(&self.mode) {
            Mode::Tracking(t) => Ok(Arc::clone(t)),
            _ => Err("start_tracking() has not been called".into()),
        }
    }

    /// The latest payload per `(worker_id, dp_rank)`.
    ///
    /// # Errors
    /// Tracking has not started.
    pub fn recent_stats(&self) -> Result<RecentStats, String> {
        Ok(lock(&self.tracker()?.stats).clone())
    }

    /// Model cards of the known workers: worker id → card JSON.
    ///
    /// # Errors
    /// Tracking has not started.
    pub fn model_cards(&self) -> Result<BTreeMap<String, String>, String> {
        Ok(lock(&self.tracker()?.cards).clone())
    }

    /// Stop the tasks; a blocked or later `recv` returns `None` (idempotent).
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}

/// Expose the process-wide malformed-payload counter on `runtime`'s `/metrics`, once per
/// runtime (registries are remembered weakly, so a dropped runtime's slot is not reused).
fn expose_counter(runtime: &DistributedRuntime) {
    use dynamo_runtime::metrics::MetricsRegistry;
    static EXPOSED: Mutex<Vec<std::sync::Weak<MetricsRegistry>>> = Mutex::new(Vec::new());
    let registry = runtime.metrics();
    let mut exposed = lock(&EXPOSED);
    exposed.retain(|w| w.strong_count() > 0);
    if exposed
        .iter()
        .any(|w| w.upgrade().is_some_and(|r| Arc::ptr_eq(&r, registry)))
    {
        return;
    }
    exposed.push(Arc::downgrade(registry));
    registry.register_expfmt_callback("fpm".into(), Arc::new(|| Ok(super::expfmt())));
}

/// `{endpoint}/{instance_id:x}` keys under `prefix` (base-model cards; LoRA cards have one
/// more segment) → decimal instance id → card JSON.
fn cards_by_worker(entries: &[(String, String)], prefix: &str) -> BTreeMap<String, String> {
    entries
        .iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix(prefix)?;
            let mut parts = rest.split('/');
            let (_endpoint, id, extra) = (parts.next()?, parts.next()?, parts.next());
            if extra.is_some() {
                return None;
            }
            let id = u64::from_str_radix(id, 16).ok()?;
            Some((id.to_string(), v.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_keys_map_to_decimal_worker_ids() {
        let p = "v1/mdc/ns/comp/";
        let entries = vec![
            ("v1/mdc/ns/comp/gen/ff".to_owned(), "{\"a\":1}".to_owned()),
            ("v1/mdc/ns/comp/gen/ff/lora-x".to_owned(), "{}".to_owned()),
            ("v1/mdc/ns/comp/gen/zz".to_owned(), "{}".to_owned()),
        ];
        let m = cards_by_worker(&entries, p);
        assert_eq!(m.len(), 1);
        assert_eq!(m["255"], "{\"a\":1}");
    }
}
