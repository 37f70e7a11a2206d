//! A small publish/subscribe channel over the request plane, used for KV events and load
//! metrics until the runtime's event plane (`events5`) is merged.
//!
//! A publisher serves a streaming endpoint `{namespace}.{component}.{topic}` whose handler
//! never ends: every caller is a subscriber and receives each published payload as one
//! response item. A subscriber watches that endpoint's instances in discovery and keeps one
//! direct stream open to each (re-opened after a break, closed when the instance leaves).
//!
//! Delivery is best effort and ordered per publisher. Payloads published while a subscriber
//! is not connected are lost for it; the KV router notices such losses from the event ids
//! and recovers from the worker-local indexer, so the channel itself carries no envelope.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::transport::server::{Handler, Request, Responder, SendStatus};
use dynamo_runtime::{Context, DistributedRuntime, EndpointId, Route};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Delay before re-opening a broken subscription stream.
const RESUBSCRIBE_DELAY: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct TopicInner {
    endpoint: EndpointId,
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Bytes>>>,
    stop: CancellationToken,
}

impl Drop for TopicInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One topic endpoint per (runtime, endpoint path): several publishers of a process (one
/// per dp rank, say) share it.
type Registry = Mutex<HashMap<(u64, String), Weak<TopicInner>>>;
static TOPICS: LazyLock<Registry> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The publishing side of a topic (cheap to clone). The endpoint stops serving when the
/// last clone of the last publisher of this topic in this runtime is dropped.
#[derive(Clone)]
pub struct TopicPublisher {
    inner: Arc<TopicInner>,
}

struct TopicHandler {
    inner: Weak<TopicInner>,
    stop: CancellationToken,
}

impl Handler for TopicHandler {
    fn start(&self, request: Request, mut out: Responder) {
        let Some(inner) = self.inner.upgrade() else {
            out.finish();
            return;
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        lock(&inner.subscribers).push(tx);
        drop(inner);
        let stop = self.stop.clone();
        let ctx = request.context;
        out.accept();
        out.flush();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    item = rx.recv() => item,
                    () = ctx.stopped() => None,
                    () = stop.cancelled() => None,
                };
                let Some(item) = item else { break };
                match out.send(&item) {
                    Ok(SendStatus::Ready) => {}
                    Ok(SendStatus::Wait) => out.credit().await,
                    Ok(SendStatus::Stopped) | Err(_) => break,
                }
            }
            out.finish();
        });
    }
}

impl TopicPublisher {
    /// Serve `{namespace}.{component}.{topic}` on `runtime` (or join the process's existing
    /// publisher of it). Must be called inside the tokio runtime.
    ///
    /// # Errors
    /// An invalid topic name.
    pub fn new(
        runtime: &DistributedRuntime,
        namespace: &str,
        component: &str,
        topic: &str,
    ) -> dynamo_runtime::Result<Self> {
        let endpoint = EndpointId::new(namespace, component, topic)?;
        let key = (runtime.connection_id(), endpoint.path());
        let mut topics = lock(&TOPICS);
        if let Some(inner) = topics.get(&key).and_then(Weak::upgrade) {
            return Ok(Self { inner });
        }
        let stop = CancellationToken::new();
        let inner = Arc::new(TopicInner {
            endpoint: endpoint.clone(),
            subscribers: Mutex::new(Vec::new()),
            stop: stop.clone(),
        });
        topics.retain(|_, w| w.strong_count() > 0);
        topics.insert(key, Arc::downgrade(&inner));
        drop(topics);
        let handler = Arc::new(TopicHandler {
            inner: Arc::downgrade(&inner),
            stop: stop.clone(),
        });
        let rt = runtime.clone();
        tokio::spawn(async move {
            if let Err(e) = rt
                .serve_endpoint_until(&endpoint, handler, false, stop)
                .await
            {
                tracing::warn!(endpoint = %endpoint, error = %e, "topic endpoint stopped");
            }
        });
        Ok(Self { inner })
    }

    /// The topic's endpoint.
    pub fn endpoint(&self) -> &EndpointId {
        &self.inner.endpoint
    }

    /// Send `payload` to every connected subscriber (never blocks).
    pub fn publish(&self, payload: Bytes) {
        lock(&self.inner.subscribers).retain(|tx| tx.send(payload.clone()).is_ok());
    }

    /// Connected subscribers.
    pub fn subscriber_count(&self) -> usize {
        let mut subs = lock(&self.inner.subscribers);
        subs.retain(|tx| !tx.is_closed());
        subs.len()
    }

    /// Close every subscriber's stream (they re-subscribe after a short delay; what is
    /// published meanwhile is lost for them). A fault-injection hook for tests.
    pub fn disconnect_subscribers(&self) {
        lock(&self.inner.subscribers).clear();
    }
}

/// What a subscriber receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicMessage {
    /// A payload from the publisher of instance `instance_id`.
    Payload {
        /// The publishing process's instance id.
        instance_id: u64,
        /// The payload.
        payload: Bytes,
    },
    /// The publisher of `instance_id` left discovery.
    Left {
        /// The instance.
        instance_id: u64,
    },
}

/// Subscribe to every publisher of `{namespace}.{component}.{topic}`. Messages arrive on
/// the returned receiver until `stop` is cancelled or the runtime shuts down. Must be
/// called inside the tokio runtime.
///
/// # Errors
/// An invalid topic name.
pub fn subscribe(
    runtime: &DistributedRuntime,
    namespace: &str,
    component: &str,
    topic: &str,
    stop: CancellationToken,
) -> dynamo_runtime::Result<mpsc::UnboundedReceiver<TopicMessage>> {
    let endpoint = EndpointId::new(namespace, component, topic)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut instances = runtime.discovery().watch(&endpoint);
    let client = runtime.client(&endpoint);
    let rt = runtime.clone();
    tokio::spawn(async move {
        let mut connected: HashMap<u64, CancellationToken> = HashMap::new();
        loop {
            let ids: Vec<u64> = instances.borrow().iter().map(|i| i.instance_id).collect();
            connected.retain(|id, token| {
                let keep = ids.contains(id);
                if !keep {
                    token.cancel();
                    let _ = tx.send(TopicMessage::Left { instance_id: *id });
                }
                keep
            });
            for id in ids {
                if connected.contains_key(&id) {
                    continue;
                }
                let token = stop.child_token();
                connected.insert(id, token.clone());
                tokio::spawn(follow(client.clone(), id, tx.clone(), token));
            }
            tokio::select! {
                r = instances.changed() => if r.is_err() { break },
                () = stop.cancelled() => break,
                () = rt.stopped() => break,
                () = tx.closed() => break,
            }
        }
        for token in connected.values() {
            token.cancel();
        }
    });
    Ok(rx)
}

/// Keep one stream open to one publisher.
async fn follow(
    client: dynamo_runtime::Client,
    instance_id: u64,
    tx: mpsc::UnboundedSender<TopicMessage>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() && !tx.is_closed() {
        let ctx = Context::default();
        let opened = tokio::select! {
            s = client.generate(Bytes::from_static(b"{}"), Route::Direct(instance_id), ctx.clone(), None) => s,
            () = stop.cancelled() => break,
        };
        if let Ok(mut stream) = opened {
            loop {
                let item = tokio::select! {
                    item = stream.next() => item,
                    () = stop.cancelled() => { ctx.stop_generating(); return; }
                };
                match item {
                    Some(Ok(payload)) => {
                        if tx
                            .send(TopicMessage::Payload {
                                instance_id,
                                payload,
                            })
                            .is_err()
                        {
                            ctx.stop_generating();
                            return;
                        }
                    }
                    Some(Err(_)) | None => break,
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(RESUBSCRIBE_DELAY) => {}
            () = stop.cancelled() => break,
        }
    }
}
