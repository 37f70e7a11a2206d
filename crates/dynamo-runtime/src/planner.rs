//! The planner's virtual connector: scaling decisions handed from a planner to whatever
//! starts and stops workers (the "environment"), through the discovery store.
//!
//! # State (reference layout)
//!
//! Keys under `v1/{namespace}/planner/`, values decimal strings:
//!
//! | key | written by | meaning |
//! |---|---|---|
//! | `num_prefill_workers` | coordinator | wanted prefill workers (absent: not set) |
//! | `num_decode_workers` | coordinator | wanted decode (or aggregated) workers |
//! | `decision_id` | coordinator | id of the latest decision, from 0 |
//! | `scaled_decision_id` | client | the latest decision the environment carried out |
//!
//! Keys are owned by their writer's process (etcd: its lease), as in the reference: when
//! the planner dies its decision disappears with it. Every backend works (`etcd`, `file`,
//! `mem`): only [`KvStore`] is used.
//!
//! # Protocol
//!
//! [`VirtualConnectorCoordinator::update_scaling_decision`] writes the changed counts and
//! bumps `decision_id`; while the previous decision is not acknowledged it skips (no
//! write), until `max_wait_time` has passed since the first skip, then proceeds anyway.
//! [`VirtualConnectorClient::wait`] resolves when a decision is pending (already or
//! later), [`VirtualConnectorClient::complete`] acknowledges one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::context::lock;
use crate::discovery::KvStore;
use crate::error::{Error, Result};
use crate::runtime::DistributedRuntime;

/// "Not set" in every field of a [`PlannerDecision`].
pub const UNSET: i64 = -1;

/// A scaling request: worker counts and the decision's id (`-1`: not set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannerDecision {
    /// Wanted prefill workers.
    pub num_prefill_workers: i64,
    /// Wanted decode (or aggregated) workers.
    pub num_decode_workers: i64,
    /// Id of the decision.
    pub decision_id: i64,
}

impl Default for PlannerDecision {
    fn default() -> Self {
        Self {
            num_prefill_workers: UNSET,
            num_decode_workers: UNSET,
            decision_id: UNSET,
        }
    }
}

/// Everything under the planner prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannerState {
    /// The current decision.
    pub decision: PlannerDecision,
    /// The latest acknowledged decision id (`-1`: none).
    pub scaled_decision_id: i64,
}

impl Default for PlannerState {
    fn default() -> Self {
        Self {
            decision: PlannerDecision::default(),
            scaled_decision_id: UNSET,
        }
    }
}

impl PlannerState {
    /// No decision yet, or the current one is acknowledged.
    pub fn is_scaling_ready(&self) -> bool {
        self.decision.decision_id == UNSET || self.scaled_decision_id >= self.decision.decision_id
    }
}

/// `v1/{namespace}/planner/`.
pub fn planner_prefix(namespace: &str) -> String {
    format!("v1/{namespace}/planner/")
}

/// Read the state under `namespace`'s prefix.
///
/// # Errors
/// The store fails, or a value is not a decimal integer ([`Error::Codec`]).
pub async fn read_state(store: &dyn KvStore, namespace: &str) -> Result<PlannerState> {
    let prefix = planner_prefix(namespace);
    let mut state = PlannerState::default();
    for (key, value) in store.list(&prefix).await? {
        let slot = match key.strip_prefix(&prefix) {
            Some("num_prefill_workers") => &mut state.decision.num_prefill_workers,
            Some("num_decode_workers") => &mut state.decision.num_decode_workers,
            Some("decision_id") => &mut state.decision.decision_id,
            Some("scaled_decision_id") => &mut state.scaled_decision_id,
            _ => continue,
        };
        *slot = value.trim().parse().map_err(|e| {
            Error::Codec(format!("planner key {key}: invalid value {value:?}: {e}"))
        })?;
    }
    Ok(state)
}

#[derive(Default)]
struct CoordinatorState {
    decision: Option<PlannerDecision>,
    first_skip: Option<Instant>,
}

/// The planner side.
pub struct VirtualConnectorCoordinator {
    store: Arc<dyn KvStore>,
    namespace: String,
    check_interval: Duration,
    max_wait_time: Duration,
    max_retries: u32,
    state: Mutex<CoordinatorState>,
    /// Serialises updates, so two concurrent calls cannot both bump `decision_id`.
    update: tokio::sync::Mutex<()>,
}

fn not_initialized() -> Error {
    Error::InvalidArgument("Call async_init before using this object".into())
}

impl VirtualConnectorCoordinator {
    /// A coordinator for `namespace`; call [`Self::init`] before anything else.
    pub fn new(
        runtime: &DistributedRuntime,
        namespace: &str,
        check_interval: Duration,
        max_wait_time: Duration,
        max_retries: u32,
    ) -> Self {
        Self {
            store: Arc::clone(runtime.kv_store()),
            namespace: namespace.to_owned(),
            check_interval,
            max_wait_time,
            max_retries,
            state: Mutex::new(CoordinatorState::default()),
            update: tokio::sync::Mutex::new(()),
        }
    }

    /// Load the current decision from the store.
    ///
    /// # Errors
    /// As [`read_state`].
    pub async fn init(&self) -> Result<()> {
        let state = read_state(self.store.as_ref(), &self.namespace).await?;
        lock(&self.state).decision = Some(state.decision);
        Ok(())
    }

    /// Whether [`Self::init`] succeeded.
    pub fn is_initialized(&self) -> bool {
        lock(&self.state).decision.is_some()
    }

    /// The in-memory decision (all `-1` before [`Self::init`], as the reference).
    pub fn read_state(&self) -> PlannerDecision {
        lock(&self.state).decision.unwrap_or_default()
    }

    fn current(&self) -> Result<PlannerDecision> {
        lock(&self.state).decision.ok_or_else(not_initialized)
    }

    /// Whether the environment acknowledged the current decision (or there is none).
    ///
    /// # Errors
    /// Not initialised, or the store fails.
    pub async fn is_scaling_ready(&self) -> Result<bool> {
        let current = self.current()?;
        if current.decision_id == UNSET {
            return Ok(true);
        }
        let state = read_state(self.store.as_ref(), &self.namespace).await?;
        Ok(state.scaled_decision_id >= current.decision_id)
    }

    /// Request new counts (`None`: unchanged). Returns whether a decision was written: not
    /// when nothing changed, nor while the previous decision is unacknowledged and
    /// `max_wait_time` has not passed since the first skipped update.
    ///
    /// # Errors
    /// Not initialised, a negative count, or the store fails.
    pub async fn update_scaling_decision(
        &self,
        num_prefill: Option<i64>,
        num_decode: Option<i64>,
    ) -> Result<bool> {
        if num_prefill.is_some_and(|n| n < 0) || num_decode.is_some_and(|n| n < 0) {
            return Err(Error::InvalidArgument(
                "worker counts must not be negative".into(),
            ));
        }
        let _serial = self.update.lock().await;
        let current = self.current()?;
        let prefill = num_prefill.filter(|n| *n != current.num_prefill_workers);
        let decode = num_decode.filter(|n| *n != current.num_decode_workers);
        if prefill.is_none() && decode.is_none() {
            return Ok(false);
        }
        if !self.is_scaling_ready().await? {
            let mut st = lock(&self.state);
            let first = *st.first_skip.get_or_insert_with(Instant::now);
            if first.elapsed() < self.max_wait_time {
                tracing::info!(
                    decision_id = current.decision_id,
                    "planner: previous scaling decision not acknowledged yet; skipping update"
                );
                return Ok(false);
            }
            tracing::warn!(
                decision_id = current.decision_id,
                "planner: previous scaling decision still unacknowledged after max_wait_time; proceeding"
            );
        }
        let prefix = planner_prefix(&self.namespace);
        let mut next = current;
        if let Some(n) = prefill {
            self.store
                .put(&format!("{prefix}num_prefill_workers"), &n.to_string())
                .await?;
            next.num_prefill_workers = n;
        }
        if let Some(n) = decode {
            self.store
                .put(&format!("{prefix}num_decode_workers"), &n.to_string())
                .await?;
            next.num_decode_workers = n;
        }
        next.decision_id = current.decision_id.max(UNSET) + 1;
        self.store
            .put(
                &format!("{prefix}decision_id"),
                &next.decision_id.to_string(),
            )
            .await?;
        let mut st = lock(&self.state);
        st.decision = Some(next);
        st.first_skip = None;
        Ok(true)
    }

    /// Poll every `check_interval`, at most `max_retries` times, until the current decision
    /// is acknowledged. Returns `true` when it was, `false` on timeout (logged).
    ///
    /// # Errors
    /// Not initialised, or the store fails.
    pub async fn wait_for_scaling_completion(&self) -> Result<bool> {
        let current = self.current()?;
        if current.decision_id == UNSET {
            return Ok(true);
        }
        for _ in 0..self.max_retries {
            let state = read_state(self.store.as_ref(), &self.namespace).await?;
            if state.scaled_decision_id >= current.decision_id {
                return Ok(true);
            }
            tokio::time::sleep(self.check_interval).await;
        }
        tracing::warn!(
            decision_id = current.decision_id,
            "planner: scaling decision not acknowledged in time"
        );
        Ok(false)
    }
}

/// The environment side.
pub struct VirtualConnectorClient {
    runtime: DistributedRuntime,
    namespace: String,
}

impl VirtualConnectorClient {
    /// A client for `namespace`.
    pub fn new(runtime: &DistributedRuntime, namespace: &str) -> Self {
        Self {
            runtime: runtime.clone(),
            namespace: namespace.to_owned(),
        }
    }

    /// The current decision.
    ///
    /// # Errors
    /// As [`read_state`].
    pub async fn get(&self) -> Result<PlannerDecision> {
        Ok(
            read_state(self.runtime.kv_store().as_ref(), &self.namespace)
                .await?
                .decision,
        )
    }

    /// Acknowledge `decision` (write `scaled_decision_id`).
    ///
    /// # Errors
    /// The store fails.
    pub async fn complete(&self, decision: &PlannerDecision) -> Result<()> {
        let key = format!("{}scaled_decision_id", planner_prefix(&self.namespace));
        self.runtime
            .kv_store()
            .put(&key, &decision.decision_id.to_string())
            .await
    }

    /// Resolve once a decision is pending (published and not acknowledged), including one
    /// that already is.
    ///
    /// # Errors
    /// [`Error::ShuttingDown`] when the runtime stops; the store fails.
    pub async fn wait(&self) -> Result<()> {
        let store = self.runtime.kv_store();
        let mut changes = store.changes();
        loop {
            changes.mark_unchanged();
            let state = read_state(store.as_ref(), &self.namespace).await?;
            if !state.is_scaling_ready() {
                return Ok(());
            }
            // The periodic re-read is a safety net against a missed change notification.
            tokio::select! {
                r = changes.changed() => if r.is_err() { return Err(Error::ShuttingDown) },
                () = self.runtime.stopped() => return Err(Error::ShuttingDown),
                () = tokio::time::sleep(crate::discovery::RELIST_INTERVAL) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RuntimeConfig;
    use crate::config::{DiscoveryBackend, RequestPlane};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn decisions_skip_until_acknowledged_or_max_wait() {
        let drt = DistributedRuntime::new(
            DiscoveryBackend::Mem,
            RequestPlane::Tcp,
            RuntimeConfig::default(),
        )
        .unwrap();
        let ns = format!("p{}", fastrand::u32(..));
        let c = VirtualConnectorCoordinator::new(
            &drt,
            &ns,
            Duration::from_millis(20),
            Duration::from_millis(300),
            3,
        );
        assert!(c.update_scaling_decision(Some(1), None).await.is_err());
        assert_eq!(c.read_state(), PlannerDecision::default());
        c.init().await.unwrap();
        assert!(c.is_scaling_ready().await.unwrap());
        assert!(c.wait_for_scaling_completion().await.unwrap());
        assert!(c.update_scaling_decision(None, Some(2)).await.unwrap());
        let d = c.read_state();
        assert_eq!(
            (d.num_prefill_workers, d.num_decode_workers, d.decision_id),
            (-1, 2, 0)
        );
        let client = VirtualConnectorClient::new(&drt, &ns);
        assert_eq!(client.get().await.unwrap(), d);
        // Pending: wait resolves at once; the coordinator skips a new update.
        client.wait().await.unwrap();
        assert!(!c.update_scaling_decision(None, Some(3)).await.unwrap());
        assert!(!c.wait_for_scaling_completion().await.unwrap());
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(c.update_scaling_decision(None, Some(3)).await.unwrap());
        assert_eq!(c.read_state().decision_id, 1);
        // Same values: no-op.
        assert!(
            !c.update_scaling_decision(Some(-1), Some(3))
                .await
                .is_ok_and(|w| w)
        );
        client.complete(&client.get().await.unwrap()).await.unwrap();
        assert!(c.is_scaling_ready().await.unwrap());
        // wait() blocks while everything is acknowledged, resolves on the next decision.
        let waiter = tokio::spawn(async move { client.wait().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        assert!(c.update_scaling_decision(Some(1), None).await.unwrap());
        tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        // A fresh coordinator loads the state.
        let c2 = VirtualConnectorCoordinator::new(&drt, &ns, Duration::ZERO, Duration::ZERO, 1);
        c2.init().await.unwrap();
        let d2 = c2.read_state();
        assert_eq!(
            (
                d2.num_prefill_workers,
                d2.num_decode_workers,
                d2.decision_id
            ),
            (1, 3, 2)
        );
        drt.kv_store()
            .put(&format!("{}decision_id", planner_prefix(&ns)), "abc")
            .await
            .unwrap();
        assert!(c2.init().await.is_err());
        drt.shutdown();
    }
}
