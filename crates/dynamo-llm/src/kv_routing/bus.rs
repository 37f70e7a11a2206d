//! Publish/subscribe for KV events and load metrics over the runtime's event plane
//! (`dynamo_runtime::events`: brokerless TCP by default, NATS with `DYN_EVENT_PLANE=nats`),
//! on component-scoped channels.
//!
//! Publishing is synchronous and never blocks: payloads go through a queue to a task that
//! owns the event-plane publisher (creating one is asynchronous: it binds and advertises),
//! so the order of publication is kept. Delivery is best effort and ordered per publisher;
//! the KV router notices lost events from their ids and recovers from the worker-local
//! indexer, so nothing here depends on the envelope's own sequence numbers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use dynamo_runtime::DistributedRuntime;
use dynamo_runtime::events::{EventPublisher, EventScope};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

struct TopicInner {
    tx: mpsc::UnboundedSender<Bytes>,
    publisher: Arc<OnceLock<EventPublisher>>,
    /// Payloads to swallow (fault injection for recovery tests).
    drop_next: AtomicU64,
    stop: CancellationToken,
}

impl Drop for TopicInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The publishing side of a topic (cheap to clone; the channel is withdrawn when the last
/// clone is dropped).
#[derive(Clone)]
pub struct TopicPublisher {
    inner: Arc<TopicInner>,
}

impl TopicPublisher {
    /// A publisher on `(component scope, topic)`. Must be called inside the tokio runtime.
    ///
    /// # Errors
    /// Empty names.
    pub fn new(
        runtime: &DistributedRuntime,
        namespace: &str,
        component: &str,
        topic: &str,
    ) -> dynamo_runtime::Result<Self> {
        if namespace.is_empty() || component.is_empty() || topic.is_empty() {
            return Err(dynamo_runtime::Error::InvalidArgument(
                "event scope names and topic must not be empty".into(),
            ));
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        let publisher = Arc::new(OnceLock::new());
        let stop = CancellationToken::new();
        let scope = EventScope::component(namespace, component);
        let (rt, topic_name, slot, token) = (
            runtime.clone(),
            topic.to_owned(),
            Arc::clone(&publisher),
            stop.clone(),
        );
        tokio::spawn(async move {
            let p = tokio::select! {
                p = rt.event_publisher(&scope, &topic_name) => p,
                () = token.cancelled() => return,
            };
            let p = match p {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(topic = %topic_name, error = %e, "event publisher unavailable");
                    return;
                }
            };
            let _ = slot.set(p.clone());
            loop {
                let item = tokio::select! {
                    item = rx.recv() => item,
                    () = token.cancelled() => None,
                };
                let Some(item) = item else { break };
                if let Err(e) = p.publish(&item) {
                    tracing::debug!(topic = %topic_name, error = %e, "event not published");
                }
            }
        });
        Ok(Self {
            inner: Arc::new(TopicInner {
                tx,
                publisher,
                drop_next: AtomicU64::new(0),
                stop,
            }),
        })
    }

    /// Queue `payload` for publication (never blocks). Over the brokerless plane with no
    /// subscriber connected it is dropped here (see [`TopicPublisher::wanted`]).
    pub fn publish(&self, payload: Bytes) {
        let skip = self
            .inner
            .drop_next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if !skip && self.wanted() {
            let _ = self.inner.tx.send(payload);
        }
    }

    /// Whether a payload published now can reach anyone: until the event-plane publisher
    /// is set up (payloads queue for it) and over NATS, always; over the brokerless plane,
    /// only while a subscriber is connected, since a frame sent to none is dropped there.
    /// Callers check it before encoding: a worker behind a round-robin frontend has no
    /// subscriber and need not serialise its KV events.
    pub fn wanted(&self) -> bool {
        self.inner
            .publisher
            .get()
            .is_none_or(EventPublisher::has_audience)
    }

    /// Connected subscribers (brokerless event plane). Over NATS, where the server fans
    /// out, 1 once the publisher is set up.
    pub fn subscriber_count(&self) -> usize {
        self.inner
            .publisher
            .get()
            .map_or(0, |p| p.subscriber_count().unwrap_or(1))
    }

    /// Swallow the next `n` payloads (fault injection: subscribers see an id gap).
    pub fn drop_next(&self, n: u64) {
        self.inner.drop_next.fetch_add(n, Ordering::AcqRel);
    }
}

/// What a subscriber receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicMessage {
    /// A payload.
    Payload {
        /// The event-plane publisher's id.
        publisher_id: u64,
        /// When it was published (the envelope's time: publisher's clock, milliseconds
        /// since the Unix epoch).
        published_at_ms: u64,
        /// The payload.
        payload: Bytes,
    },
}

/// Subscribe to every publisher of `(component scope, topic)`. Messages arrive on the
/// returned receiver until `stop` is cancelled or the runtime shuts down. Must be called
/// inside the tokio runtime.
///
/// # Errors
/// Empty names.
pub fn subscribe(
    runtime: &DistributedRuntime,
    namespace: &str,
    component: &str,
    topic: &str,
    stop: CancellationToken,
) -> dynamo_runtime::Result<mpsc::UnboundedReceiver<TopicMessage>> {
    subscribe_with_ready(runtime, namespace, component, topic, stop).map(|(rx, _)| rx)
}

/// The longest [`subscribe_with_ready`] waits for the advertised publishers to connect.
const ADVERTISED_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// As [`subscribe`], with a signal that fires once the subscription is live on the event
/// plane (over NATS: registered on the server; over TCP: connected to the publishers
/// advertised when it opened, or after a second; a message published after it is
/// delivered).
/// The signal is dropped unfired when the subscription fails or is stopped first.
///
/// # Errors
/// Empty names.
pub fn subscribe_with_ready(
    runtime: &DistributedRuntime,
    namespace: &str,
    component: &str,
    topic: &str,
    stop: CancellationToken,
) -> dynamo_runtime::Result<(mpsc::UnboundedReceiver<TopicMessage>, oneshot::Receiver<()>)> {
    if namespace.is_empty() || component.is_empty() || topic.is_empty() {
        return Err(dynamo_runtime::Error::InvalidArgument(
            "event scope names and topic must not be empty".into(),
        ));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = oneshot::channel();
    let scope = EventScope::component(namespace, component);
    let (rt, topic) = (runtime.clone(), topic.to_owned());
    tokio::spawn(async move {
        let sub = tokio::select! {
            s = rt.subscribe(&scope, &topic) => s,
            () = stop.cancelled() => return,
        };
        let mut sub = match sub {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(topic = %topic, error = %e, "event subscription failed");
                return;
            }
        };
        // Brokerless TCP: live once the publishers advertised now are connected (bounded:
        // an advertisement can outlive its publisher until its lease expires).
        let _ = tokio::time::timeout(ADVERTISED_WAIT, sub.wait_for_advertised()).await;
        let _ = ready_tx.send(());
        // Forward until the stream ends, the receiver goes or `stop` fires. The forwarding
        // task wakes once per message and polls nothing else; this task only watches for
        // the end (see `spawn_until` for why the token is not raced per wake-up).
        let closed = tx.clone();
        let mut forward = tokio::spawn(async move {
            while let Some(event) = sub.next().await {
                let msg = TopicMessage::Payload {
                    publisher_id: event.publisher_id,
                    published_at_ms: event.published_at_ms,
                    payload: event.payload,
                };
                if tx.send(msg).is_err() {
                    break;
                }
            }
        });
        tokio::select! {
            _ = &mut forward => {}
            () = stop.cancelled() => forward.abort(),
            () = closed.closed() => forward.abort(),
        }
    });
    Ok((rx, ready_rx))
}

/// Spawns `task` and aborts it (at its next `.await`) when `stop` fires.
///
/// A watcher task waits on the token rather than `task` racing it in its own `select!`:
/// polling a cancellation future takes the token's mutex, and a task that wakes once per
/// event would take it once per event (about 3% of the router's CPU at a million block
/// events a second). The watcher wakes twice in all: when the token fires or the task ends.
pub(crate) fn spawn_until<F>(stop: CancellationToken, task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut handle = tokio::spawn(task);
    tokio::spawn(async move {
        tokio::select! {
            _ = &mut handle => {}
            () = stop.cancelled() => handle.abort(),
        }
    });
}
