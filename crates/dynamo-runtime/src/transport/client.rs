//! The caller side of the TCP request plane: a pool of persistent, multiplexed
//! connections (one per worker address) and the response streams read from them.
//!
//! Invariants:
//! * A stream ends exactly once: with `END`, an `ERROR`, or — when the connection drops
//!   first — with [`Error::Disconnected`] (or quietly, if the caller had stopped it).
//! * Dropping a [`ResponseStream`] before its end sends `STOP` so the worker's handler sees
//!   the cancellation.
//! * A connection that failed is never reused: the next request dials again.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::frame::{self, Read};
use super::server::{Outbox, Peer, Server, write_loop};
use super::{ErrorKind, RequestHeader, STREAM_WINDOW, WireError};
use crate::context::{Context, lock};
use crate::error::{Error, Result};

/// What a connection's reader delivers to one stream.
#[derive(Debug)]
pub enum Event {
    /// The worker accepted the request.
    Ack,
    /// One response item.
    Data(Bytes),
    /// The stream completed.
    End,
    /// The stream ended with an error.
    Error(WireError),
    /// The connection was lost.
    Disconnected(String),
    /// NATS request plane: the server found no subscriber for a message published to the
    /// worker's subject (the worker is gone, or has not re-subscribed after a broker
    /// restart). Ends a stream not yet acknowledged; ignored by one already accepted.
    NoResponders,
    /// The acknowledgement did not arrive in time (from the connection's `AckWatch`);
    /// ignored by a stream already accepted.
    AckTimeout,
}

/// The acknowledgement deadlines of one connection's new streams, watched by one task per
/// connection. A timer per request would cost a wake-up of a parked tokio worker per
/// request (arming a timer that expires before every armed one unparks the time driver);
/// the watchdog instead sleeps until the earliest deadline it knows, and a later deadline
/// (every new request's, the timeout being the same) is picked up when it wakes.
#[derive(Default)]
struct AckWatch {
    state: Mutex<AckState>,
    wake: Notify,
}

#[derive(Default)]
struct AckState {
    /// `(deadline, stream)` of the streams waiting for their acknowledgement.
    pending: BTreeSet<(Instant, u64)>,
    /// The deadline the watchdog sleeps until; `None` while it waits for `wake`.
    armed: Option<Instant>,
    closed: bool,
}

impl AckWatch {
    fn expect(&self, stream: u64, deadline: Instant) {
        let mut st = lock(&self.state);
        st.pending.insert((deadline, stream));
        if st.armed.is_none_or(|a| deadline < a) {
            st.armed = Some(deadline);
            drop(st);
            self.wake.notify_one();
        }
    }

    fn done(&self, stream: u64, deadline: Instant) {
        lock(&self.state).pending.remove(&(deadline, stream));
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.wake.notify_one();
    }
}

/// The watchdog of `conn`'s acknowledgement deadlines: a stream past its deadline gets
/// [`Event::AckTimeout`]. Ends when the connection closes or is dropped.
async fn watch_acks(watch: Arc<AckWatch>, conn: Weak<Connection>) {
    loop {
        let now = Instant::now();
        let mut expired = Vec::new();
        let next = {
            let mut st = lock(&watch.state);
            if st.closed {
                return;
            }
            while let Some(&(deadline, stream)) = st.pending.first() {
                if deadline > now {
                    break;
                }
                st.pending.pop_first();
                expired.push(stream);
            }
            st.armed = st.pending.first().map(|(d, _)| *d);
            st.armed
        };
        if !expired.is_empty() {
            let Some(conn) = conn.upgrade() else { return };
            let streams = lock(&conn.streams);
            for stream in expired {
                if let Some(tx) = streams.get(&stream) {
                    let _ = tx.send(Event::AckTimeout);
                }
            }
        }
        match next {
            Some(deadline) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = watch.wake.notified() => {}
                }
            }
            None => watch.wake.notified().await,
        }
    }
}

/// One multiplexed connection to a worker.
pub struct Connection {
    address: String,
    writer: Outbox,
    streams: Mutex<HashMap<u64, mpsc::UnboundedSender<Event>>>,
    next_stream: AtomicU64,
    closed: AtomicBool,
    max_message: usize,
    /// The NATS server's `max_payload` (NATS request plane only).
    nats_max_payload: Option<usize>,
    /// When the last stream was opened (ms since `created`), for the NATS liveness check.
    last_open_ms: AtomicU64,
    created: std::time::Instant,
    acks: Arc<AckWatch>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.acks.close();
    }
}

impl Connection {
    /// A connection with no stream yet, sending through `writer` (the transport's tasks
    /// are the caller's to start).
    fn new(
        address: &str,
        writer: Outbox,
        max_message: usize,
        nats_max_payload: Option<usize>,
    ) -> Self {
        Self {
            address: address.to_owned(),
            writer,
            streams: Mutex::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            max_message,
            nats_max_payload,
            last_open_ms: AtomicU64::new(0),
            created: std::time::Instant::now(),
            acks: Arc::default(),
        }
    }

    /// A logical connection to the worker subject `subject` over NATS (see
    /// [`super::nats`]).
    async fn connect_nats(
        client: async_nats::Client,
        subject: &str,
        max_message: usize,
        mut losses: tokio::sync::watch::Receiver<u64>,
    ) -> Result<Arc<Self>> {
        losses.mark_unchanged();
        let inbox = client.new_inbox();
        let mut sub = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| Error::Nats(format!("subscribe to {inbox} failed: {e}")))?;
        client
            .flush()
            .await
            .map_err(|e| Error::Nats(format!("flush failed: {e}")))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = Arc::new(Self::new(
            subject,
            Outbox::Queued(tx),
            max_message,
            Some(client.server_info().max_payload),
        ));
        tokio::spawn(watch_acks(Arc::clone(&conn.acks), Arc::downgrade(&conn)));
        tokio::spawn(super::nats::pump(
            client,
            subject.to_owned(),
            Some(inbox),
            rx,
            |_, _, _| None,
        ));
        let reader_conn = Arc::clone(&conn);
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let reason = loop {
                let next = tokio::select! {
                    n = tokio::time::timeout(super::nats::LIVENESS_TIMEOUT, sub.next()) => n,
                    r = losses.changed() => {
                        if r.is_err() {
                            break "the NATS client closed".to_owned();
                        }
                        // Frames in flight may have died with the broker and carry no
                        // sequence numbers to resume from: end every stream now (a
                        // migratable error) rather than risk a silent gap. The workers
                        // are told to stop once the connection is back.
                        let open: Vec<u64> = lock(&reader_conn.streams).keys().copied().collect();
                        for id in open {
                            reader_conn.control(id, frame::STOP);
                        }
                        break "the NATS connection was lost (broker restart or network failure), \
                               so frames may have been lost"
                            .to_owned();
                    }
                };
                match next {
                    Ok(Some(msg)) => {
                        if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                            reader_conn.no_responders();
                            continue;
                        }
                        for f in super::nats::split_frames(msg.payload) {
                            reader_conn.deliver(f);
                        }
                    }
                    Ok(None) => break "the NATS subscription ended".to_owned(),
                    Err(_) => {
                        let since_open = reader_conn.created.elapsed().as_millis() as u64
                            - reader_conn.last_open_ms.load(Ordering::Relaxed);
                        let idle = lock(&reader_conn.streams).is_empty();
                        let timeout = super::nats::LIVENESS_TIMEOUT.as_millis() as u64;
                        if !idle && since_open >= timeout {
                            break format!(
                                "the worker sent nothing for {:?} (presumed dead)",
                                super::nats::LIVENESS_TIMEOUT
                            );
                        }
                        if reader_conn.is_closed() {
                            break "closed".to_owned();
                        }
                    }
                }
            };
            reader_conn.close(&reason);
        });
        Ok(conn)
    }

    async fn connect(address: &str, max_message: usize, timeout: Duration) -> Result<Arc<Self>> {
        let cannot = |reason: String| Error::CannotConnect {
            address: address.to_owned(),
            reason,
        };
        let sock = tokio::time::timeout(timeout, TcpStream::connect(address))
            .await
            .map_err(|_| cannot(format!("timed out after {timeout:?}")))?
            .map_err(|e| cannot(e.to_string()))?;
        let _ = sock.set_nodelay(true);
        let (r, w) = sock.into_split();
        let (outbox, direct, rx) = Outbox::tcp(w);
        let conn = Arc::new(Self::new(address, outbox, max_message, None));
        tokio::spawn(watch_acks(Arc::clone(&conn.acks), Arc::downgrade(&conn)));
        tokio::spawn(write_loop(direct, rx));
        let reader_conn = Arc::clone(&conn);
        tokio::spawn(async move {
            let mut reader = frame::FrameReader::new(r, usize::MAX);
            let reason = loop {
                match reader.next().await {
                    Ok(Read::Frame(f)) => reader_conn.deliver(f),
                    Ok(Read::TooLarge { .. }) => {}
                    Ok(Read::Eof) => break "connection closed by the worker".to_owned(),
                    Err(e) => break format!("connection to the worker failed: {e}"),
                }
            };
            reader_conn.close(&reason);
        });
        Ok(conn)
    }

    /// A connection to `server`, a listener of this process at `address`, without sockets
    /// (see [`Server::accept_local`]): the same frames, streams and errors as a TCP
    /// connection to it, each handled by the other end on the sender's thread.
    fn connect_local(server: &Server, address: &str, max_message: usize) -> Arc<Self> {
        let closed = CancellationToken::new();
        let conn = Arc::new_cyclic(|me: &Weak<Self>| {
            let end = Arc::new(LocalEnd {
                conn: me.clone(),
                closed: closed.clone(),
            });
            Self::new(
                address,
                Outbox::Local(server.accept_local(end, closed)),
                max_message,
                None,
            )
        });
        tokio::spawn(watch_acks(Arc::clone(&conn.acks), Arc::downgrade(&conn)));
        conn
    }

    fn deliver(&self, f: frame::Frame) {
        let event = match f.kind {
            frame::ACK => Event::Ack,
            frame::DATA => Event::Data(f.payload),
            frame::END => Event::End,
            frame::ERROR => Event::Error(serde_json::from_slice(&f.payload).unwrap_or_else(|e| {
                WireError::new(
                    ErrorKind::Unknown,
                    format!("malformed error frame: {e}"),
                    false,
                )
            })),
            _ => return,
        };
        let terminal = matches!(event, Event::End | Event::Error(_));
        let mut streams = lock(&self.streams);
        if let Some(tx) = streams.get(&f.stream) {
            let _ = tx.send(event);
        }
        if terminal {
            streams.remove(&f.stream);
        }
    }

    /// Tell every stream that a message to the worker found no subscriber.
    fn no_responders(&self) {
        for tx in lock(&self.streams).values() {
            let _ = tx.send(Event::NoResponders);
        }
    }

    fn close(&self, reason: &str) {
        self.closed.store(true, Ordering::Release);
        self.acks.close();
        let streams: Vec<_> = lock(&self.streams).drain().map(|(_, tx)| tx).collect();
        for tx in streams {
            let _ = tx.send(Event::Disconnected(format!(
                "Stream ended before generation completed: {reason} ({})",
                self.address
            )));
        }
    }

    /// Whether the connection reaches a listener of this process without sockets
    /// ([`ConnectionPool::in_process`]).
    pub fn is_in_process(&self) -> bool {
        matches!(self.writer, Outbox::Local(_))
    }

    /// Whether the connection is unusable.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn send(&self, frame: Bytes) -> Result<()> {
        if self.is_closed() {
            return Err(Error::Disconnected(format!(
                "connection to {} is closed",
                self.address
            )));
        }
        let lone = lock(&self.streams).len() <= 1;
        self.writer
            .send(frame, lone)
            .map_err(|()| Error::Disconnected(format!("connection to {} is closed", self.address)))
    }

    fn check_size(&self, size: usize) -> Result<()> {
        if let Some(max) = self.nats_max_payload
            && size + 4 + frame::HEADER_LEN > max
        {
            return Err(Error::NatsPayloadTooLarge { size, max });
        }
        if size > self.max_message {
            return Err(Error::MessageTooLarge {
                size,
                max: self.max_message,
            });
        }
        Ok(())
    }

    /// Send a request; returns the stream id and its event receiver.
    fn open(
        &self,
        path: &str,
        header: &RequestHeader,
        body: &[u8],
    ) -> Result<(u64, mpsc::UnboundedReceiver<Event>)> {
        let header =
            serde_json::to_vec(header).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let prefix = frame::request_prefix(path, &header);
        self.check_size(prefix.len() + body.len())?;
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        self.last_open_ms
            .store(self.created.elapsed().as_millis() as u64, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.streams).insert(id, tx);
        if let Err(e) = self.send(frame::encode(frame::REQUEST, id, &[&prefix, body])) {
            lock(&self.streams).remove(&id);
            return Err(e);
        }
        // The reader may have closed the connection between the check and the insert.
        if self.is_closed() {
            lock(&self.streams).remove(&id);
            return Err(Error::Disconnected(format!(
                "connection to {} is closed",
                self.address
            )));
        }
        Ok((id, rx))
    }

    fn control(&self, stream: u64, kind: u8) {
        let _ = self.send(frame::encode(kind, stream, &[]));
    }
}

/// The caller's end of an in-process connection ([`Connection::connect_local`]): the
/// server's frames, delivered at once.
struct LocalEnd {
    conn: Weak<Connection>,
    /// Cancelled when the server's side is gone (its last responder finished).
    closed: CancellationToken,
}

impl Peer for LocalEnd {
    fn receive(&self, frames: Bytes) -> std::result::Result<(), ()> {
        let conn = self.conn.upgrade().ok_or(())?;
        for f in super::nats::split_frames(frames) {
            conn.deliver(f);
        }
        Ok(())
    }
}

impl Drop for LocalEnd {
    /// The server's side of the connection ended: as a TCP reader's end of file.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.upgrade() {
            conn.close("connection closed by the worker");
        }
        self.closed.cancel();
    }
}

/// Per-address connections, shared by every client of a runtime.
pub struct ConnectionPool {
    conns: tokio::sync::Mutex<HashMap<String, Arc<Connection>>>,
    max_message: usize,
    connect_timeout: Duration,
    in_process: bool,
}

impl ConnectionPool {
    /// An empty pool.
    pub fn new(max_message: usize, connect_timeout: Duration) -> Self {
        Self {
            conns: tokio::sync::Mutex::new(HashMap::new()),
            max_message,
            connect_timeout,
            in_process: true,
        }
    }

    /// Whether an address served by a listener of this process is reached in process
    /// (`Server::accept_local`, the default) rather than through the loopback.
    pub fn in_process(mut self, on: bool) -> Self {
        self.in_process = on;
        self
    }

    /// The maximum message size of this pool's connections.
    pub fn max_message(&self) -> usize {
        self.max_message
    }

    /// A live connection to `address` (`host:port`), dialling if needed.
    pub async fn get(&self, address: &str) -> Result<Arc<Connection>> {
        let mut conns = self.conns.lock().await;
        if let Some(c) = conns.get(address).filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(c));
        }
        let local = self
            .in_process
            .then(|| Server::in_process(address))
            .flatten();
        let c = match local {
            Some(server) => Connection::connect_local(&server, address, self.max_message),
            None => Connection::connect(address, self.max_message, self.connect_timeout).await?,
        };
        conns.insert(address.to_owned(), Arc::clone(&c));
        Ok(c)
    }

    /// A live logical connection to the NATS worker subject `subject`.
    pub async fn get_nats(
        &self,
        client: async_nats::Client,
        subject: &str,
        losses: tokio::sync::watch::Receiver<u64>,
    ) -> Result<Arc<Connection>> {
        let key = format!("nats:{subject}");
        let mut conns = self.conns.lock().await;
        if let Some(c) = conns.get(&key).filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(c));
        }
        let c = Connection::connect_nats(client, subject, self.max_message, losses).await?;
        conns.insert(key, Arc::clone(&c));
        Ok(c)
    }

    /// Close every connection (their streams end with `Disconnected`).
    pub async fn close_all(&self) {
        let conns: Vec<_> = self.conns.lock().await.drain().map(|(_, c)| c).collect();
        for c in conns {
            c.close("the caller's runtime shut down");
        }
    }
}

/// The caller's side of one response stream.
pub struct ResponseStream {
    conn: Arc<Connection>,
    stream: u64,
    rx: mpsc::UnboundedReceiver<Event>,
    context: Context,
    consumed: u32,
    finished: bool,
    done: CancellationToken,
    on_disconnect: Option<Box<dyn Fn() + Send + Sync>>,
}

impl ResponseStream {
    /// Send a request on `conn` and wait (up to `ack_timeout`) for the worker to accept it.
    /// With `input`, the call is bidirectional: each received item is sent as a request
    /// item, and the end of `input` ends the request stream.
    pub async fn open(
        conn: Arc<Connection>,
        path: &str,
        body: &[u8],
        context: Context,
        input: Option<mpsc::UnboundedReceiver<Bytes>>,
        ack_timeout: Duration,
    ) -> Result<Self> {
        let header = RequestHeader {
            id: context.id().to_owned(),
            metadata: context.metadata_snapshot(),
            streaming: input.is_some(),
            stopped: context.is_stopped(),
        };
        let (stream, rx) = conn.open(path, &header, body)?;
        let deadline = Instant::now() + ack_timeout;
        conn.acks.expect(stream, deadline);
        let mut s = Self {
            conn,
            stream,
            rx,
            context,
            consumed: 0,
            finished: false,
            done: CancellationToken::new(),
            on_disconnect: None,
        };
        let first = s.rx.recv().await;
        s.conn.acks.done(s.stream, deadline);
        match first {
            Some(Event::AckTimeout) => {
                return Err(Error::ConnectionTimeout(format!(
                    "no acknowledgement from {} within {ack_timeout:?}",
                    s.conn.address
                )));
            }
            Some(Event::Ack) => {}
            Some(Event::Error(e)) => {
                s.finished = true;
                return Err(Error::Remote(e));
            }
            Some(Event::Disconnected(m)) => {
                s.finished = true;
                return Err(Error::Disconnected(m));
            }
            Some(Event::NoResponders) => {
                // Not delivered (or, if another message of this connection was the one
                // refused, delivered but abandoned now: stopped, so it is not run twice).
                s.conn.control(s.stream, frame::STOP);
                lock(&s.conn.streams).remove(&s.stream);
                s.finished = true;
                return Err(Error::CannotConnect {
                    address: s.conn.address.clone(),
                    reason: "no worker is subscribed to this subject (NATS no responders): \
                             the worker is gone or re-subscribing after a broker restart"
                        .to_owned(),
                });
            }
            Some(other) => {
                s.finished = true;
                return Err(Error::Remote(WireError::new(
                    ErrorKind::Unknown,
                    format!("protocol error: expected an acknowledgement, got {other:?}"),
                    false,
                )));
            }
            None => {
                s.finished = true;
                return Err(Error::Disconnected("connection closed".into()));
            }
        }
        if let Some(input) = input {
            tokio::spawn(forward_input(
                Arc::clone(&s.conn),
                s.stream,
                input,
                s.done.clone(),
            ));
        }
        // A stream whose end (or error) already arrived with its acknowledgement, as a short
        // reply's does, has nothing left on the worker for a stop to reach: no watcher task
        // (the task and the wake-up ending it cost more than the rest of such a call).
        if lock(&s.conn.streams).contains_key(&s.stream) {
            s.watch_context();
        }
        Ok(s)
    }

    /// Call `f` when the stream breaks because the connection was lost or the worker's
    /// engine is shutting down (`EngineShutdown`): used to report the instance down, so
    /// a migrated request does not go back to it.
    pub fn set_on_disconnect(&mut self, f: Box<dyn Fn() + Send + Sync>) {
        self.on_disconnect = Some(f);
    }

    /// Forward the caller context's stop/kill to the worker while the stream is open.
    fn watch_context(&self) {
        let ctx = self.context.clone();
        if ctx.is_stopped() {
            self.conn.control(
                self.stream,
                if ctx.is_killed() {
                    frame::KILL
                } else {
                    frame::STOP
                },
            );
            return;
        }
        let conn = Arc::clone(&self.conn);
        let stream = self.stream;
        let done = self.done.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = ctx.stopped() => {
                    conn.control(stream, if ctx.is_killed() { frame::KILL } else { frame::STOP });
                    tokio::select! {
                        () = ctx.killed() => conn.control(stream, frame::KILL),
                        () = done.cancelled() => {}
                    }
                }
                () = done.cancelled() => {}
            }
        });
    }

    /// The stream's context.
    pub fn context(&self) -> &Context {
        &self.context
    }

    fn on_event(&mut self, event: Option<Event>) -> Option<Result<Bytes>> {
        match event {
            Some(Event::Data(b)) => {
                self.consumed += 1;
                if self.consumed >= STREAM_WINDOW / 2 {
                    let n = self.consumed;
                    self.consumed = 0;
                    let _ = self.conn.send(frame::encode(
                        frame::CREDIT,
                        self.stream,
                        &[&n.to_be_bytes()],
                    ));
                }
                Some(Ok(b))
            }
            Some(Event::Ack | Event::NoResponders | Event::AckTimeout) => None,
            Some(Event::End) | None => {
                self.finish();
                None
            }
            Some(Event::Error(e)) => {
                self.finish();
                if e.kind == super::ErrorKind::EngineShutdown
                    && let Some(f) = &self.on_disconnect
                {
                    f();
                }
                Some(Err(Error::Remote(e)))
            }
            Some(Event::Disconnected(m)) => {
                self.finish();
                if self.context.is_stopped() {
                    None
                } else {
                    if let Some(f) = &self.on_disconnect {
                        f();
                    }
                    Some(Err(Error::Disconnected(m)))
                }
            }
        }
    }

    fn finish(&mut self) {
        self.finished = true;
        self.done.cancel();
    }

    /// The next item without waiting: `Ok(Some(item))`, `Ok(None)` at the end, or
    /// `Err(())` when nothing has arrived yet.
    #[expect(clippy::result_unit_err, reason = "a three-state poll, not an error")]
    pub fn try_next(&mut self) -> Result<Option<Result<Bytes>>, ()> {
        loop {
            if self.finished {
                return Ok(None);
            }
            let event = match self.rx.try_recv() {
                Ok(e) => Some(e),
                Err(mpsc::error::TryRecvError::Empty) => return Err(()),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            };
            let is_ack = matches!(
                event,
                Some(Event::Ack | Event::NoResponders | Event::AckTimeout)
            );
            let out = self.on_event(event);
            if out.is_some() || !is_ack {
                return Ok(out);
            }
        }
    }

    /// The next item: `Some(Ok(item))`, `Some(Err(e))` (the stream then ends), or `None`
    /// at the end.
    pub async fn next(&mut self) -> Option<Result<Bytes>> {
        loop {
            if self.finished {
                return None;
            }
            let event = self.rx.recv().await;
            let is_ack = matches!(
                event,
                Some(Event::Ack | Event::NoResponders | Event::AckTimeout)
            );
            let out = self.on_event(event);
            if out.is_some() || !is_ack {
                return out;
            }
        }
    }

    /// Whether the stream has ended.
    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if !self.finished {
            self.context.stop_generating();
            self.conn.control(self.stream, frame::STOP);
            lock(&self.conn.streams).remove(&self.stream);
        }
        self.done.cancel();
    }
}

async fn forward_input(
    conn: Arc<Connection>,
    stream: u64,
    mut input: mpsc::UnboundedReceiver<Bytes>,
    done: CancellationToken,
) {
    loop {
        let item = tokio::select! {
            i = input.recv() => i,
            () = done.cancelled() => return,
        };
        match item {
            Some(b) => {
                if b.len() > conn.max_message {
                    // The worker would reject it; end the request stream instead.
                    tracing::warn!(
                        size = b.len(),
                        "request item over the maximum message size dropped"
                    );
                    conn.control(stream, frame::KILL);
                    return;
                }
                if conn
                    .send(frame::encode(frame::ITEM, stream, &[&b]))
                    .is_err()
                {
                    return;
                }
            }
            None => {
                conn.control(stream, frame::INPUT_END);
                return;
            }
        }
    }
}
