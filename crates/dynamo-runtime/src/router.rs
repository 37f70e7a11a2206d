//! [`Client`]: routes requests of one endpoint over its live instances.
//!
//! The routable set is the discovered instances minus those marked down: an instance
//! that any client or router of this runtime saw fail (connection refused or lost, worker
//! unavailable) is excluded at once for every client of the runtime and for the KV
//! router's worker selection ([`Client::down_instance_ids`]), through one shared
//! [`DownInstances`] set. It returns when discovery says so (its entry disappears or
//! changes: a re-registered worker), when a request to it succeeds, or after
//! `inhibited_duration`, when the next request serves as the probe (a failed probe marks
//! it down again, and the request is retried elsewhere). If every discovered instance is
//! down, all of them are tried again rather than failing outright.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::context::Context;
use crate::discovery::{Instance, TransportAddress};
use crate::error::{Error, Result};
use crate::names::EndpointId;
use crate::runtime::DistributedRuntime;
use crate::transport::ErrorKind;
use crate::transport::client::ResponseStream;

// The shared down set lives with the runtime that holds it (this module imports the
// runtime, not the reverse); its public path stays here.
pub use crate::runtime::DownInstances;

/// Pause between re-sends to a NATS worker while the connection settles after a broker
/// restart (a worker re-subscribes within about a reconnection delay).
const SETTLE_RETRY_DELAY: Duration = Duration::from_millis(100);

/// How a request picks its instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The next instance in turn.
    RoundRobin,
    /// A uniformly random instance.
    Random,
    /// This instance.
    Direct(u64),
}

struct ClientInner {
    runtime: DistributedRuntime,
    endpoint: EndpointId,
    instances: watch::Receiver<Arc<Vec<Instance>>>,
    next: AtomicUsize,
}

/// A client of one endpoint (cheap to clone).
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

fn split_address(t: &TransportAddress) -> Result<(&str, &str)> {
    match t {
        TransportAddress::Tcp(a) => {
            let a = a.strip_prefix("tcp://").unwrap_or(a);
            a.split_once('/')
                .ok_or_else(|| Error::Discovery(format!("invalid TCP address {a:?}")))
        }
        TransportAddress::NatsTcp(s) => Err(Error::Discovery(format!(
            "instance is served on the NATS request plane ({s}), not TCP"
        ))),
    }
}

impl DistributedRuntime {
    /// A client of `endpoint`, following its instances live. Must be called inside the
    /// tokio runtime.
    pub fn client(&self, endpoint: &EndpointId) -> Client {
        Client::new(self.clone(), endpoint.clone())
    }
}

impl Client {
    fn new(runtime: DistributedRuntime, endpoint: EndpointId) -> Self {
        let instances = runtime.discovery().watch(&endpoint);
        Self {
            inner: Arc::new(ClientInner {
                runtime,
                endpoint,
                instances,
                next: AtomicUsize::new(0),
            }),
        }
    }

    /// The runtime the client belongs to.
    pub fn runtime(&self) -> &DistributedRuntime {
        &self.inner.runtime
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &EndpointId {
        &self.inner.endpoint
    }

    /// The discovered instances, sorted by id.
    pub fn instances(&self) -> Vec<Instance> {
        self.inner.instances.borrow().as_ref().clone()
    }

    /// A receiver of this client's view of the discovered instances. Components that
    /// pick instances themselves and then call [`Route::Direct`] (the KV router) watch
    /// this same channel, so any instance they have seen is already routable here; a
    /// second, independent discovery watch could lag behind and reject it as unknown.
    pub fn watch_instances(&self) -> watch::Receiver<Arc<Vec<Instance>>> {
        self.inner.instances.clone()
    }

    /// The discovered instance ids, sorted.
    pub fn instance_ids(&self) -> Vec<u64> {
        self.inner
            .instances
            .borrow()
            .iter()
            .map(|i| i.instance_id)
            .collect()
    }

    /// Resolves with the instance ids once at least one instance exists.
    pub async fn wait_for_instances(&self) -> Result<Vec<u64>> {
        let mut rx = self.inner.instances.clone();
        loop {
            let ids = self.instance_ids();
            if !ids.is_empty() {
                return Ok(ids);
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return Err(Error::ShuttingDown) },
                () = self.inner.runtime.inner.primary.cancelled() => return Err(Error::ShuttingDown),
            }
        }
    }

    /// Mark an instance down for every client and router of this runtime (see the module
    /// docs for when it returns).
    pub fn report_instance_down(&self, instance_id: u64) {
        inhibit(&self.inner, instance_id);
    }

    /// The discovered instances currently marked down (sorted). Selectors that pick
    /// instances themselves (the KV router) avoid these.
    pub fn down_instance_ids(&self) -> Vec<u64> {
        let all = self.inner.instances.borrow().clone();
        self.inner.runtime.inner.down.down_among(
            &self.inner.endpoint,
            &all,
            self.inner.runtime.config().inhibited_duration,
        )
    }

    /// Send `body` (JSON) to an instance chosen by `route` and return its response stream
    /// once the worker accepted the request. With `input`, the call is bidirectional.
    /// Round-robin and random retry on another instance when one cannot be reached or is
    /// not accepting work (not bidirectional calls: their input is consumed by the first
    /// attempt).
    pub async fn generate(
        &self,
        body: Bytes,
        route: Route,
        context: Context,
        input: Option<mpsc::UnboundedReceiver<Bytes>>,
    ) -> Result<ResponseStream> {
        let max = self.inner.runtime.inner.pool.max_message();
        if body.len() > max {
            return Err(Error::MessageTooLarge {
                size: body.len(),
                max,
            });
        }
        let bidirectional = input.is_some();
        let mut input = input;
        let mut tried: Vec<u64> = Vec::new();
        let mut again: Option<Picked> = None;
        let settle_deadline = Instant::now() + crate::nats::SETTLE_WINDOW;
        loop {
            let picked = match again.take() {
                Some(p) => p,
                None => self.pick(route, &tried)?,
            };
            let instance = picked.get();
            if !tried.contains(&instance.instance_id) {
                tried.push(instance.instance_id);
            }
            let attempt = async {
                let (conn, path) = match &instance.transport {
                    TransportAddress::NatsTcp(subject) => {
                        let client = self.inner.runtime.nats().await?;
                        let rt = &self.inner.runtime.inner;
                        let conn = rt
                            .pool
                            .get_nats(client, subject, rt.nats_link.losses())
                            .await?;
                        let path = format!(
                            "{}/{}/{}",
                            instance.namespace, instance.component, instance.endpoint
                        );
                        (conn, std::borrow::Cow::Owned(path))
                    }
                    TransportAddress::Tcp(_) => {
                        let (address, path) = split_address(&instance.transport)?;
                        (
                            self.inner.runtime.inner.pool.get(address).await?,
                            path.into(),
                        )
                    }
                };
                let path: &str = &path;
                // The input can only be consumed once: a retry after it was handed over is
                // impossible, so bidirectional calls are not retried past this point.
                ResponseStream::open(
                    conn,
                    path,
                    &body,
                    context.clone(),
                    input.take(),
                    self.inner.runtime.config().request_timeout,
                )
                .await
            };
            match attempt.await {
                Ok(mut stream) => {
                    // The worker accepted: it is up, whatever an earlier failure said.
                    self.inner.runtime.inner.down.clear(instance);
                    let weak: Weak<ClientInner> = Arc::downgrade(&self.inner);
                    stream.set_on_disconnect(Box::new(move || {
                        let lost = picked.get();
                        if let Some(inner) = weak.upgrade() {
                            // A stream cut by our own NATS connection's loss says nothing
                            // about the worker.
                            let nats = matches!(lost.transport, TransportAddress::NatsTcp(_));
                            if !(nats && inner.runtime.inner.nats_link.unsettled()) {
                                inner.runtime.inner.down.mark(lost);
                            }
                        }
                    }));
                    return Ok(stream);
                }
                Err(e) if self.settling(instance, &e, bidirectional, settle_deadline) => {
                    tracing::debug!(instance_id = instance.instance_id, error = %e, "NATS reconnected recently; retrying the same worker");
                    tokio::time::sleep(SETTLE_RETRY_DELAY).await;
                    again = Some(picked);
                }
                Err(e) => {
                    let retryable =
                        matches!(&e, Error::CannotConnect { .. } | Error::Disconnected(_))
                            || matches!(&e, Error::Remote(w) if w.kind == ErrorKind::Unavailable);
                    if retryable {
                        self.inner.runtime.inner.down.mark(instance);
                    }
                    let more = self.instance_ids().iter().any(|id| !tried.contains(id));
                    if !retryable || matches!(route, Route::Direct(_)) || !more || bidirectional {
                        return Err(e);
                    }
                    tracing::debug!(instance_id = instance.instance_id, error = %e, "retrying on another instance");
                }
            }
        }
    }

    /// Whether a NATS request that failed before being accepted should be re-sent to the
    /// same worker: our NATS connection is down or came back moments ago, so the failure
    /// (no subscriber yet, connection lost) says nothing about the worker. Nothing was
    /// accepted, so nothing runs twice; bounded by `deadline`.
    fn settling(
        &self,
        instance: &Instance,
        e: &Error,
        bidirectional: bool,
        deadline: Instant,
    ) -> bool {
        matches!(instance.transport, TransportAddress::NatsTcp(_))
            && !bidirectional
            && matches!(e, Error::CannotConnect { .. } | Error::Disconnected(_))
            && Instant::now() + SETTLE_RETRY_DELAY < deadline
            && self.inner.runtime.inner.nats_link.unsettled()
    }

    fn pick(&self, route: Route, tried: &[u64]) -> Result<Picked> {
        let endpoint = || self.inner.endpoint.to_string();
        let all = self.inner.instances.borrow().clone();
        let at = match route {
            Route::Direct(id) => all
                .iter()
                .position(|i| i.instance_id == id)
                .ok_or_else(|| Error::UnknownInstance {
                    endpoint: endpoint(),
                    instance_id: id,
                })?,
            Route::RoundRobin | Route::Random => {
                // The routable set is the instances not marked down, or all of them when
                // every one is; of those, the ones this request has not tried.
                let down = self.inner.runtime.inner.down.down_among(
                    &self.inner.endpoint,
                    &all,
                    self.inner.runtime.config().inhibited_duration,
                );
                let any_up = all.iter().any(|i| !down.contains(&i.instance_id));
                let eligible = |i: &Instance| {
                    !(tried.contains(&i.instance_id) || any_up && down.contains(&i.instance_id))
                };
                let n = all.iter().filter(|i| eligible(i)).count();
                if n == 0 {
                    return Err(Error::NoInstances(endpoint()));
                }
                let nth = if route == Route::RoundRobin {
                    self.inner.next.fetch_add(1, Ordering::Relaxed) % n
                } else {
                    fastrand::usize(..n)
                };
                all.iter()
                    .enumerate()
                    .filter(|(_, i)| eligible(i))
                    .nth(nth)
                    .map(|(at, _)| at)
                    .expect("nth below the number of eligible instances")
            }
        };
        Ok(Picked { all, at })
    }
}

/// The instance a request goes to: the discovery snapshot it was picked from and its
/// place there (kept for the stream's disconnect report without copying the entry).
struct Picked {
    all: Arc<Vec<Instance>>,
    at: usize,
}

impl Picked {
    fn get(&self) -> &Instance {
        &self.all[self.at]
    }
}

fn inhibit(inner: &ClientInner, instance_id: u64) {
    let instance = inner
        .instances
        .borrow()
        .iter()
        .find(|i| i.instance_id == instance_id)
        .cloned();
    if let Some(instance) = instance {
        inner.runtime.inner.down.mark(&instance);
    }
}
