//! The event plane: best-effort publish/subscribe between the processes of a deployment
//! (KV cache events, worker load metrics, router replica sync).
//!
//! # Model
//!
//! * A **scope** ([`EventScope`]) is a namespace, a component or an endpoint. Together with
//!   a **topic** it names a channel; its subject is
//!   `namespace.{ns}[.component.{c}[.endpoint.{e}]].{topic}` with every segment
//!   percent-encoded (only `[A-Za-z0-9_-]` stay raw), so dots or NATS wildcards in a name
//!   cannot change the channel's identity ([`EventScope::subject`]).
//! * A **publisher** ([`EventPublisher`]) has a random 53-bit `publisher_id` (one process
//!   may own several) and numbers its events `0, 1, 2, ...` (the per-publisher sequence).
//! * A **subscriber** ([`EventSubscriber`]) receives the events of every publisher of the
//!   channel, merged. It remembers the last sequence number per publisher: when an event
//!   arrives with a sequence number beyond the next expected one, the events in between
//!   were lost (publisher queue overflow, reconnection, ...). The event carries the count
//!   in [`Event::missed_before`] and the subscriber's [`SubscriberStats`] count gaps and
//!   missed events. Events older than the last one seen from the same publisher
//!   (duplicates) are dropped. Joining late is not a gap: the first event seen from a
//!   publisher starts its count.
//! * Every message is an **envelope** `{publisher_id, sequence, published_at (ms since the
//!   epoch), topic, payload (bytes)}` encoded with the runtime's codec
//!   (`DYN_EVENT_PLANE_CODEC`: `msgpack`, the default, or `json`). Decoders accept both (a
//!   JSON envelope starts with `{`, a msgpack one with a map marker), so processes with
//!   different codecs interoperate. [`EventPublisher::publish_value`] and
//!   [`Event::decode`] encode and decode a typed payload with the same codec.
//!
//! # Transports (`DYN_EVENT_PLANE`)
//!
//! * `zmq` (also accepted: `tcp`): brokerless, the runtime's own TCP pub/sub (not the ZMQ
//!   wire protocol). Each publisher listens on an ephemeral port of
//!   `DYN_EVENT_PLANE_HOST` (default: the request plane's host) and advertises itself in
//!   discovery under
//!   `v1/event_channels/namespace/{ns}[/component/{c}[/endpoint/{e}]]/topic/{topic}/{publisher_id:x}`;
//!   subscribers watch that prefix and connect to every publisher, following joins and
//!   leaves. A publisher queues at most [`PUBLISHER_QUEUE`] frames per subscriber and
//!   drops beyond that (the subscriber then sees a gap). The default for every discovery
//!   backend except etcd with `NATS_SERVER` set.
//! * `nats`: core NATS publish/subscribe on the subject (`NATS_SERVER`).
//!
//! # Example
//!
//! ```
//! use dynamo_runtime::{DistributedRuntime, RuntimeConfig};
//! use dynamo_runtime::config::{DiscoveryBackend, RequestPlane};
//! use dynamo_runtime::events::EventScope;
//!
//! let rt = dynamo_runtime::tokio_runtime().unwrap();
//! rt.block_on(async {
//!     let drt = DistributedRuntime::new(DiscoveryBackend::Mem, RequestPlane::Tcp,
//!                                       RuntimeConfig::default()).unwrap();
//!     let scope = EventScope::component("doc", "backend");
//!     let mut sub = drt.subscribe(&scope, "kv-events").await.unwrap();
//!     let publisher = drt.event_publisher(&scope, "kv-events").await.unwrap();
//!     sub.wait_for_publishers(1).await;
//!     publisher.publish(&b"hello"[..]).unwrap();
//!     let event = sub.next().await.unwrap();
//!     assert_eq!(&event.payload[..], b"hello");
//!     assert_eq!((event.publisher_id, event.sequence), (publisher.publisher_id(), 0));
//!     drt.shutdown();
//!     drt.stopped().await;
//! });
//! ```

pub(crate) mod nats;
pub(crate) mod tcp;

use std::borrow::Cow;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::RuntimeConfig;
use crate::context::lock;
use crate::discovery::{KvStore, random_instance_id};
use crate::error::{Error, Result};
use crate::names::EndpointId;

// The codec and the queue default are settings `RuntimeConfig` carries, so they are
// defined in the configuration layer (which must not import this one) and re-exported
// here under their public names.
pub use crate::config::{DEFAULT_SUBSCRIBER_CAPACITY, EventCodec};

/// Frames a brokerless publisher queues per subscriber before it drops (the reference's
/// ZMQ high-water mark): deep enough to absorb a burst of KV events while a subscriber is
/// briefly descheduled, bounded so a dead subscriber cannot grow a publisher's memory.
pub const PUBLISHER_QUEUE: usize = 100_000;

/// Where a channel lives: a namespace, a component or an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventScope {
    /// `namespace.{ns}`.
    Namespace {
        /// Namespace.
        namespace: String,
    },
    /// `namespace.{ns}.component.{c}`.
    Component {
        /// Namespace.
        namespace: String,
        /// Component.
        component: String,
    },
    /// `namespace.{ns}.component.{c}.endpoint.{e}`.
    Endpoint(EndpointId),
}

/// Percent-encode one subject or key segment: only `[A-Za-z0-9_-]` stay raw.
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl EventScope {
    /// A namespace scope.
    pub fn namespace(namespace: &str) -> Self {
        Self::Namespace {
            namespace: namespace.to_owned(),
        }
    }

    /// A component scope.
    pub fn component(namespace: &str, component: &str) -> Self {
        Self::Component {
            namespace: namespace.to_owned(),
            component: component.to_owned(),
        }
    }

    /// An endpoint scope.
    pub fn endpoint(endpoint: &EndpointId) -> Self {
        Self::Endpoint(endpoint.clone())
    }

    fn parts(&self) -> Vec<(&'static str, &str)> {
        match self {
            Self::Namespace { namespace } => vec![("namespace", namespace)],
            Self::Component {
                namespace,
                component,
            } => vec![("namespace", namespace), ("component", component)],
            Self::Endpoint(e) => vec![
                ("namespace", &e.namespace),
                ("component", &e.component),
                ("endpoint", &e.name),
            ],
        }
    }

    /// `namespace.{ns}[.component.{c}[.endpoint.{e}]]`, segments percent-encoded.
    pub fn subject_prefix(&self) -> String {
        self.parts()
            .iter()
            .map(|(k, v)| format!("{k}.{}", encode_segment(v)))
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The channel's subject: `{prefix}.{topic}`.
    pub fn subject(&self, topic: &str) -> String {
        format!("{}.{}", self.subject_prefix(), encode_segment(topic))
    }

    /// Discovery prefix of the channel's publishers (ends with `/`):
    /// `v1/event_channels/namespace/{ns}[/component/{c}[/endpoint/{e}]]/topic/{topic}/`.
    pub fn channel_prefix(&self, topic: &str) -> String {
        let mut s = String::from("v1/event_channels");
        for (k, v) in self.parts() {
            s.push('/');
            s.push_str(k);
            s.push('/');
            s.push_str(&encode_segment(v));
        }
        s.push_str("/topic/");
        s.push_str(&encode_segment(topic));
        s.push('/');
        s
    }

    /// Refuse an empty topic or scope name.
    pub(crate) fn check(&self, topic: &str) -> Result<()> {
        if topic.is_empty() || self.parts().iter().any(|(_, v)| v.is_empty()) {
            return Err(Error::InvalidArgument(
                "event scope names and topic must not be empty".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    publisher_id: u64,
    sequence: u64,
    published_at: u64,
    topic: &'a str,
    #[serde(with = "serde_bytes")]
    payload: &'a [u8],
}

#[derive(Deserialize)]
struct EnvelopeIn<'a> {
    publisher_id: u64,
    sequence: u64,
    #[serde(default)]
    published_at: u64,
    #[serde(borrow)]
    topic: Cow<'a, str>,
    /// Borrowed from the frame where the codec allows it (MessagePack's `bin`); JSON
    /// spells bytes as an array of numbers, decoded into an owned buffer.
    #[serde(borrow, with = "serde_bytes")]
    payload: Cow<'a, [u8]>,
}

/// One received event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The publisher's id.
    pub publisher_id: u64,
    /// The publisher's sequence number of this event (from 0).
    pub sequence: u64,
    /// Publication time, milliseconds since the Unix epoch (publisher's clock).
    pub published_at_ms: u64,
    /// The topic (as published, not encoded).
    pub topic: String,
    /// The payload bytes.
    pub payload: Bytes,
    /// The envelope's codec (also the codec of typed payloads, see [`Event::decode`]).
    pub codec: EventCodec,
    /// Events of this publisher lost just before this one (0 when none).
    pub missed_before: u64,
}

impl Event {
    /// Decode the payload with the envelope's codec (see [`EventPublisher::publish_value`]).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        self.codec.decode(&self.payload)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Encode an envelope.
pub fn encode_envelope(
    codec: EventCodec,
    publisher_id: u64,
    sequence: u64,
    topic: &str,
    payload: &[u8],
) -> Result<Vec<u8>> {
    codec.encode(&EnvelopeOut {
        publisher_id,
        sequence,
        published_at: now_ms(),
        topic,
        payload,
    })
}

/// Decode an envelope of either codec (JSON starts with `{`).
pub fn decode_envelope(bytes: &[u8]) -> Result<Event> {
    decode_envelope_with(bytes, Bytes::copy_from_slice)
}

/// [`decode_envelope`] of a frame the caller owns as [`Bytes`]: a MessagePack payload is a
/// slice of `frame` (no copy, no allocation); a JSON one is decoded into its own buffer.
pub fn decode_envelope_bytes(frame: &Bytes) -> Result<Event> {
    decode_envelope_with(frame, |p| frame.slice_ref(p))
}

fn decode_envelope_with(bytes: &[u8], borrowed: impl FnOnce(&[u8]) -> Bytes) -> Result<Event> {
    let codec = if bytes.first() == Some(&b'{') {
        EventCodec::Json
    } else {
        EventCodec::Msgpack
    };
    let e: EnvelopeIn<'_> = match codec {
        EventCodec::Json => serde_json::from_slice(bytes).map_err(|e| Error::Codec(e.to_string())),
        EventCodec::Msgpack => {
            rmp_serde::from_slice(bytes).map_err(|e| Error::Codec(e.to_string()))
        }
    }?;
    let payload = match e.payload {
        Cow::Borrowed(p) => borrowed(p),
        Cow::Owned(v) => Bytes::from(v),
    };
    Ok(Event {
        publisher_id: e.publisher_id,
        sequence: e.sequence,
        published_at_ms: e.published_at,
        topic: e.topic.into_owned(),
        payload,
        codec,
        missed_before: 0,
    })
}

/// Where a publisher's frames go.
pub(crate) enum Sink {
    Tcp(Arc<tcp::TcpPublisher>),
    Nats(nats::NatsPublisher),
}

struct PublisherInner {
    publisher_id: u64,
    subject: String,
    topic: String,
    codec: EventCodec,
    /// The next sequence number; held while the frame is handed to the sink, so frames
    /// leave in sequence order even when several threads publish.
    sequence: Mutex<u64>,
    sink: Sink,
    /// Discovery key of the channel (withdrawn when the publisher is dropped).
    channel_key: String,
    store: Arc<dyn KvStore>,
    cancel: CancellationToken,
}

impl Drop for PublisherInner {
    fn drop(&mut self) {
        self.cancel.cancel();
        let store = Arc::clone(&self.store);
        let key = std::mem::take(&mut self.channel_key);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = store.delete(&key).await;
            });
        }
    }
}

/// Publishes events on one channel (cheap to clone; the channel is withdrawn when the last
/// clone is dropped or the runtime shuts down).
#[derive(Clone)]
pub struct EventPublisher {
    inner: Arc<PublisherInner>,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("publisher_id", &self.inner.publisher_id)
            .field("subject", &self.inner.subject)
            .finish()
    }
}

impl EventPublisher {
    /// This publisher's id (the `publisher_id` of its envelopes).
    pub fn publisher_id(&self) -> u64 {
        self.inner.publisher_id
    }

    /// The channel's subject.
    pub fn subject(&self) -> &str {
        &self.inner.subject
    }

    /// The codec of envelopes and typed payloads.
    pub fn codec(&self) -> EventCodec {
        self.inner.codec
    }

    /// Publish `payload`; returns its sequence number. Never blocks: the frame is queued
    /// for each subscriber (brokerless) or for the NATS connection.
    pub fn publish(&self, payload: impl AsRef<[u8]>) -> Result<u64> {
        let i = &self.inner;
        if i.cancel.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let mut seq = lock(&i.sequence);
        let frame = encode_envelope(i.codec, i.publisher_id, *seq, &i.topic, payload.as_ref())?;
        match &i.sink {
            Sink::Tcp(p) => p.send(Bytes::from(frame)),
            Sink::Nats(p) => p.send(Bytes::from(frame))?,
        }
        let sent = *seq;
        *seq += 1;
        Ok(sent)
    }

    /// Encode `value` with the publisher's codec and publish it.
    pub fn publish_value<T: Serialize + ?Sized>(&self, value: &T) -> Result<u64> {
        let payload = self.inner.codec.encode(value)?;
        self.publish(payload)
    }

    /// Number of events published so far.
    pub fn published(&self) -> u64 {
        *lock(&self.inner.sequence)
    }

    /// Number of subscribers connected (brokerless transport; `None` over NATS, where the
    /// server fans out).
    pub fn subscriber_count(&self) -> Option<usize> {
        match &self.inner.sink {
            Sink::Tcp(p) => Some(p.subscriber_count()),
            Sink::Nats(_) => None,
        }
    }

    /// Whether a payload published now can reach anyone: over NATS always (the server
    /// fans out), over the brokerless transport only while a subscriber is connected (a
    /// frame sent to none is dropped). Producers check it before encoding.
    pub fn has_audience(&self) -> bool {
        self.subscriber_count() != Some(0)
    }

    /// Frames dropped because a subscriber's queue was full (brokerless transport).
    pub fn dropped(&self) -> u64 {
        match &self.inner.sink {
            Sink::Tcp(p) => p.dropped(),
            Sink::Nats(p) => p.dropped(),
        }
    }

    /// Wait until every event published so far has left this process (NATS: flushed to
    /// the server; brokerless: a no-op, frames are already queued per subscriber).
    pub async fn flush(&self) -> Result<()> {
        match &self.inner.sink {
            Sink::Tcp(_) => Ok(()),
            Sink::Nats(p) => p.flush().await,
        }
    }
}

/// Counters of one subscriber (shared; readable while the subscriber is consumed).
#[derive(Debug, Default)]
pub struct SubscriberStats {
    received: AtomicU64,
    gaps: AtomicU64,
    missed: AtomicU64,
    duplicates: AtomicU64,
    malformed: AtomicU64,
}

impl SubscriberStats {
    /// Events delivered.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
    /// Sequence gaps detected (each gap may cover several events).
    pub fn gaps(&self) -> u64 {
        self.gaps.load(Ordering::Relaxed)
    }
    /// Events lost in those gaps.
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
    /// Events dropped as duplicates (sequence not above the last one seen).
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
    /// Messages that were not valid envelopes.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
    pub(crate) fn add_malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }
}

/// What transports feed into a subscriber.
pub(crate) struct Feed {
    pub(crate) tx: mpsc::Sender<Event>,
    pub(crate) stats: Arc<SubscriberStats>,
    /// Number of publishers currently connected (brokerless) or 1 while the NATS
    /// subscription is live.
    pub(crate) connected: Arc<watch::Sender<usize>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) topic: String,
}

/// The events of one channel, from every publisher, merged. Ends (`None`) when the runtime
/// shuts down. Also a [`futures_util::Stream`].
pub struct EventSubscriber {
    rx: mpsc::Receiver<Event>,
    last: HashMap<u64, u64>,
    stats: Arc<SubscriberStats>,
    connected: watch::Receiver<usize>,
    /// Publishers advertised when the subscription opened (brokerless TCP; 0 over NATS).
    advertised: usize,
    subject: String,
    _stop: DropGuard,
}

impl std::fmt::Debug for EventSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSubscriber")
            .field("subject", &self.subject)
            .finish()
    }
}

impl EventSubscriber {
    /// The channel's subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The counters (received, gaps, missed, ...).
    pub fn stats(&self) -> Arc<SubscriberStats> {
        Arc::clone(&self.stats)
    }

    /// Sequence gaps detected so far.
    pub fn gaps(&self) -> u64 {
        self.stats.gaps()
    }

    /// Publishers currently connected (brokerless transport); over NATS, 1 while the
    /// subscription is live.
    pub fn publishers(&self) -> usize {
        *self.connected.borrow()
    }

    /// Resolves once at least `n` publishers are connected (see
    /// [`EventSubscriber::publishers`]).
    pub async fn wait_for_publishers(&self, n: usize) {
        let mut rx = self.connected.clone();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Resolves once the publishers advertised when the subscription opened are connected:
    /// from then on their events reach this subscriber (at once over NATS, whose server
    /// holds the subscription). A publisher that went away without withdrawing its
    /// advertisement keeps it pending: bound the wait.
    pub async fn wait_for_advertised(&self) {
        self.wait_for_publishers(self.advertised).await;
    }

    /// Account for one event: gap detection and duplicate suppression.
    fn admit(&mut self, mut event: Event) -> Option<Event> {
        match self.last.get_mut(&event.publisher_id) {
            Some(last) if event.sequence <= *last => {
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Some(last) => {
                let missed = event.sequence - *last - 1;
                if missed > 0 {
                    self.stats.gaps.fetch_add(1, Ordering::Relaxed);
                    self.stats.missed.fetch_add(missed, Ordering::Relaxed);
                    tracing::debug!(
                        publisher_id = event.publisher_id,
                        missed,
                        subject = %self.subject,
                        "event plane: sequence gap"
                    );
                }
                event.missed_before = missed;
                *last = event.sequence;
            }
            None => {
                self.last.insert(event.publisher_id, event.sequence);
            }
        }
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        Some(event)
    }

    /// The next event, or `None` once the subscription ended.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            let event = self.rx.recv().await?;
            if let Some(e) = self.admit(event) {
                return Some(e);
            }
        }
    }

    /// The next event if one is ready.
    pub fn try_next(&mut self) -> Option<Event> {
        loop {
            let event = self.rx.try_recv().ok()?;
            if let Some(e) = self.admit(event) {
                return Some(e);
            }
        }
    }
}

impl futures_util::Stream for EventSubscriber {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Event>> {
        loop {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(e)) => {
                    if let Some(e) = self.admit(e) {
                        return Poll::Ready(Some(e));
                    }
                }
                other => return other,
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct ChannelTransport {
    kind: String,
    config: serde_json::Value,
}

/// The discovery value of one publisher (`"type": "EventChannel"`).
#[derive(Serialize, Deserialize)]
struct ChannelEntry {
    #[serde(rename = "type")]
    kind: String,
    subject: String,
    topic: String,
    instance_id: u64,
    transport: ChannelTransport,
}

/// Parse a brokerless publisher's address out of its discovery value.
pub(crate) fn channel_address(value: &str) -> Option<String> {
    let e: ChannelEntry = serde_json::from_str(value).ok()?;
    if e.transport.kind != "tcp" {
        return None;
    }
    let ep = e.transport.config.get("endpoint")?.as_str()?;
    Some(ep.strip_prefix("tcp://").unwrap_or(ep).to_owned())
}

/// The transport of one publisher or subscriber, as the runtime resolved it. The runtime
/// owns the process's NATS connection (made on first use, shared with the request plane),
/// so it connects before handing the client over; this layer never needs the runtime.
pub(crate) enum Link {
    /// Brokerless TCP.
    Tcp,
    /// Core NATS over the runtime's connection.
    Nats(async_nats::Client),
}

impl EventPublisher {
    /// A publisher on channel `(scope, topic)` over `link`, cancelled with `cancel`.
    /// Brokerless: binds a listener and advertises it in `store` before returning, so
    /// subscribers can find it. `DistributedRuntime::event_publisher` checks the scope and
    /// the runtime's state first.
    pub(crate) async fn open(
        config: &RuntimeConfig,
        link: Link,
        store: Arc<dyn KvStore>,
        scope: &EventScope,
        topic: &str,
        cancel: CancellationToken,
    ) -> Result<Self> {
        let publisher_id = random_instance_id();
        let subject = scope.subject(topic);
        let channel_key = format!("{}{publisher_id:x}", scope.channel_prefix(topic));
        let (sink, transport) = match link {
            Link::Tcp => {
                let host = config
                    .event_host
                    .clone()
                    .unwrap_or_else(|| config.tcp_host.clone());
                let p = tcp::TcpPublisher::bind(&host, cancel.clone()).await?;
                let endpoint = format!("tcp://{}", p.address());
                (
                    Sink::Tcp(p),
                    ChannelTransport {
                        kind: "tcp".into(),
                        config: serde_json::json!({ "endpoint": endpoint }),
                    },
                )
            }
            Link::Nats(client) => {
                let p = nats::NatsPublisher::new(client, subject.clone(), cancel.clone());
                (
                    Sink::Nats(p),
                    ChannelTransport {
                        kind: "nats".into(),
                        config: serde_json::json!({ "subject_prefix": scope.subject_prefix() }),
                    },
                )
            }
        };
        let entry = ChannelEntry {
            kind: "EventChannel".into(),
            subject: subject.clone(),
            topic: topic.to_owned(),
            instance_id: publisher_id,
            transport,
        };
        let value = serde_json::to_string(&entry).map_err(|e| Error::Codec(e.to_string()))?;
        store.put(&channel_key, &value).await?;
        Ok(EventPublisher {
            inner: Arc::new(PublisherInner {
                publisher_id,
                subject,
                topic: topic.to_owned(),
                codec: config.event_codec,
                sequence: Mutex::new(0),
                sink,
                channel_key,
                store,
                cancel,
            }),
        })
    }
}

impl EventSubscriber {
    /// Subscribe to channel `(scope, topic)` over `link` until `cancel` (or the subscriber
    /// is dropped). Brokerless: the publishers advertised in `store` are connected in the
    /// background. `DistributedRuntime::subscribe` checks the scope and the runtime's state
    /// first.
    pub(crate) async fn open(
        config: &RuntimeConfig,
        link: Link,
        store: Arc<dyn KvStore>,
        scope: &EventScope,
        topic: &str,
        cancel: CancellationToken,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::channel(config.event_subscriber_capacity.max(1));
        let (connected_tx, connected) = watch::channel(0usize);
        let stats = Arc::new(SubscriberStats::default());
        let feed = Feed {
            tx,
            stats: Arc::clone(&stats),
            connected: Arc::new(connected_tx),
            cancel: cancel.clone(),
            topic: topic.to_owned(),
        };
        let subject = scope.subject(topic);
        let mut advertised = 0;
        match link {
            Link::Tcp => {
                let prefix = scope.channel_prefix(topic);
                advertised = store
                    .list(&prefix)
                    .await
                    .map(|l| {
                        l.iter()
                            .filter(|(_, v)| channel_address(v).is_some())
                            .count()
                    })
                    .unwrap_or(0);
                tcp::spawn_subscriber(store, prefix, feed, config.max_message_size);
            }
            Link::Nats(client) => {
                nats::subscribe(client, subject.clone(), feed).await?;
            }
        }
        Ok(EventSubscriber {
            rx,
            last: HashMap::new(),
            stats,
            connected,
            advertised,
            subject,
            _stop: cancel.drop_guard(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_keys_are_percent_encoded() {
        let s = EventScope::component("ns", "a.b*");
        assert_eq!(
            s.subject("kv-events"),
            "namespace.ns.component.a%2Eb%2A.kv-events"
        );
        assert_eq!(
            s.channel_prefix("kv events"),
            "v1/event_channels/namespace/ns/component/a%2Eb%2A/topic/kv%20events/"
        );
        let e = EventScope::endpoint(&EndpointId::parse("n.c.e").unwrap());
        assert_eq!(e.subject("t"), "namespace.n.component.c.endpoint.e.t");
        assert_eq!(EventScope::namespace("n").subject("x>"), "namespace.n.x%3E");
        assert!(EventScope::namespace("").check("t").is_err());
        assert!(EventScope::namespace("n").check("").is_err());
    }

    #[test]
    fn envelopes_round_trip_in_both_codecs() {
        for codec in [EventCodec::Json, EventCodec::Msgpack] {
            let bytes = encode_envelope(codec, 7, 42, "kv-events", b"\x00\xffpayload").unwrap();
            assert_eq!(bytes[0] == b'{', codec == EventCodec::Json);
            let e = decode_envelope(&bytes).unwrap();
            assert_eq!((e.publisher_id, e.sequence, e.codec), (7, 42, codec));
            assert_eq!(e.topic, "kv-events");
            assert_eq!(&e.payload[..], b"\x00\xffpayload");
            assert!(e.published_at_ms > 0);
        }
        assert!(decode_envelope(b"\x93garbage").is_err());
        assert!(decode_envelope(b"{\"x\":1}").is_err());
    }

    #[test]
    fn a_framed_msgpack_payload_is_a_slice_of_the_frame() {
        for codec in [EventCodec::Json, EventCodec::Msgpack] {
            let frame = Bytes::from(
                encode_envelope(codec, 7, 42, "kv-events", b"\x00\xffpayload").unwrap(),
            );
            let e = decode_envelope_bytes(&frame).unwrap();
            assert_eq!(e, decode_envelope(&frame).unwrap());
            let inside = frame.as_ptr_range().contains(&e.payload.as_ptr());
            // MessagePack's `bin` is borrowed; JSON's array of numbers cannot be.
            assert_eq!(inside, codec == EventCodec::Msgpack, "{codec:?}");
        }
        assert!(decode_envelope_bytes(&Bytes::from_static(b"\x93garbage")).is_err());
    }

    #[test]
    fn typed_payloads_use_the_codec() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Load {
            active: u32,
        }
        for codec in [EventCodec::Json, EventCodec::Msgpack] {
            let p = codec.encode(&Load { active: 3 }).unwrap();
            let env = encode_envelope(codec, 1, 0, "t", &p).unwrap();
            let e = decode_envelope(&env).unwrap();
            assert_eq!(e.decode::<Load>().unwrap(), Load { active: 3 });
        }
        assert_eq!(EventCodec::parse("JSON").unwrap(), EventCodec::Json);
        assert!(EventCodec::parse("cbor").is_err());
    }
}
