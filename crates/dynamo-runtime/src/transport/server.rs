//! The worker side of the TCP request plane.
//!
//! One [`Server`] per process listens on `DYN_TCP_RPC_HOST:DYN_TCP_RPC_PORT` and serves
//! every endpoint the process registers, dispatching requests by endpoint path. Each
//! connection has a reader task (decodes frames, dispatches them) and a writer task (drains
//! a queue of encoded frames, coalescing them into large writes). A frame of the only stream
//! of a connection, sent from outside the runtime's tasks (the Python event loop) while
//! nothing is queued, is written by its sender at once (`Outbox`).
//!
//! Invariants:
//! * Every accepted request ends with exactly one `END` or `ERROR` frame, unless the
//!   connection is gone (then nobody is listening).
//! * When a connection drops, every stream it carried is killed (its context is killed), as
//!   the reference treats a dropped response socket.
//! * A request frame over the size limit gets an `ERROR` for its stream; the connection and
//!   the worker carry on.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::frame::{self, Read};
use super::live::LiveConnections;
use super::{ErrorKind, RequestHeader, STREAM_WINDOW, WireError};
use crate::context::{Context, lock};
use crate::log_limit::LogLimiter;

/// Cancellation log lines: each one at the default level, a few per second at most.
static CANCEL_LOG: LogLimiter = LogLimiter::new(5);
use crate::error::{Error, Result};
use crate::metrics::EndpointMetrics;

/// One request as a handler sees it.
pub struct Request {
    /// The request body (JSON).
    pub body: Bytes,
    /// The request's context (id and metadata from the caller; stop/kill from the caller).
    pub context: Context,
    /// For bidirectional calls: the request items, ending when the caller sends
    /// `INPUT_END` or disconnects.
    pub input: Option<mpsc::UnboundedReceiver<Bytes>>,
}

/// Something that serves an endpoint. `start` must not block: it hands the request to
/// whatever runs it (a task, an event loop) and returns.
pub trait Handler: Send + Sync + 'static {
    /// Start handling `request`, answering through `responder`.
    fn start(&self, request: Request, responder: Responder);
}

/// A served endpoint in the server's registry.
pub struct EndpointEntry {
    handler: Arc<dyn Handler>,
    metrics: Option<Arc<EndpointMetrics>>,
    accepting: AtomicBool,
    inflight: AtomicUsize,
    idle: Notify,
}

impl EndpointEntry {
    /// A new entry that accepts requests.
    pub fn new(handler: Arc<dyn Handler>) -> Arc<Self> {
        Self::with_metrics(handler, None)
    }

    /// A new entry whose requests are counted in `metrics`.
    pub fn with_metrics(
        handler: Arc<dyn Handler>,
        metrics: Option<Arc<EndpointMetrics>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            handler,
            metrics,
            accepting: AtomicBool::new(true),
            inflight: AtomicUsize::new(0),
            idle: Notify::new(),
        })
    }

    /// Start or stop accepting new requests (in-flight ones carry on).
    pub fn set_accepting(&self, accepting: bool) {
        self.accepting.store(accepting, Ordering::Release);
    }

    /// Number of streams in flight.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    /// Resolves when no stream is in flight.
    pub async fn drained(&self) {
        loop {
            let notified = self.idle.notified();
            if self.inflight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Decrements the endpoint's in-flight count (and records the duration) when a stream ends.
struct InflightGuard(Arc<EndpointEntry>, Instant);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if let Some(m) = &self.0.metrics {
            m.request_finished(self.1.elapsed());
        }
        if self.0.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

struct StreamState {
    context: Context,
    credits: AtomicI64,
    credit_notify: Notify,
}

struct StreamEntry {
    state: Arc<StreamState>,
    metrics: Option<Arc<EndpointMetrics>>,
    input: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
}

/// The sending side of a connection: frames for its writer (the TCP writer task, or the
/// NATS publisher), or for the other end of an in-process connection.
///
/// A TCP connection's sender may write a frame itself instead, when nothing is queued
/// before it, the frame's stream is the connection's only one and the sender runs outside
/// the runtime's tasks (the Python event loop's thread, which polls its waits itself). Handing
/// the frame to the writer task would wake a parked tokio worker (which in turn wakes the
/// other one to look for work) just to make that one write; with several streams in flight
/// the writer task stays in charge, as its batching is what makes many small frames cheap.
pub(crate) enum Outbox {
    /// Frames go to a queue only (the NATS request plane's publisher).
    Queued(mpsc::UnboundedSender<Bytes>),
    /// A TCP connection: the writer task's queue, or a direct write.
    Tcp {
        tx: mpsc::UnboundedSender<Bytes>,
        direct: Arc<Direct>,
    },
    /// An in-process connection ([`Peer`]): the frames are handled by the other end at once,
    /// on the sender's thread.
    Local(Arc<dyn Peer>),
}

/// The receiving end of an in-process connection (a caller and a server of the same
/// process): what a TCP connection's reader would do with the frames, done by the sender.
pub(crate) trait Peer: Send + Sync {
    /// Handle `frames` (one or more encoded frames, in order). Fails when the other end is
    /// gone, as a write to a closed connection does.
    fn receive(&self, frames: Bytes) -> std::result::Result<(), ()>;
}

/// A TCP connection's socket, shared by its writer task and the senders.
pub(crate) struct Direct {
    sock: OwnedWriteHalf,
    /// Frames are queued for the writer task or being written by it (or it has ended): a
    /// sender must queue behind them.
    busy: Mutex<bool>,
}

impl Outbox {
    /// A TCP connection's outbox and the writer task's end of it.
    pub(crate) fn tcp(sock: OwnedWriteHalf) -> (Self, Arc<Direct>, mpsc::UnboundedReceiver<Bytes>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let direct = Arc::new(Direct {
            sock,
            busy: Mutex::new(false),
        });
        let outbox = Self::Tcp {
            tx,
            direct: Arc::clone(&direct),
        };
        (outbox, direct, rx)
    }

    /// Send `frame` (in order with every frame sent before); `lone`: its stream is the only
    /// one on the connection. Fails when the writer (or the other end) has ended.
    pub(crate) fn send(&self, frame: Bytes, lone: bool) -> std::result::Result<(), ()> {
        match self {
            Self::Queued(tx) => tx.send(frame).map_err(drop),
            Self::Local(peer) => peer.receive(frame),
            Self::Tcp { tx, direct: d } => {
                let mut busy = lock(&d.busy);
                if !*busy && lone && tokio::task::try_id().is_none() {
                    match d.sock.try_write(&frame) {
                        Ok(n) if n == frame.len() => return Ok(()),
                        Ok(n) => {
                            *busy = true;
                            return tx.send(frame.slice(n..)).map_err(drop);
                        }
                        // Not writable now (or broken): the writer task deals with it.
                        Err(_) => {}
                    }
                }
                *busy = true;
                tx.send(frame).map_err(drop)
            }
        }
    }
}

struct Conn {
    writer: Outbox,
    streams: Mutex<HashMap<u64, Arc<StreamEntry>>>,
    closed: CancellationToken,
    /// `closed` as a flag: checked per item sent, where the token's check takes a lock.
    is_closed: AtomicBool,
    max_message: usize,
}

impl Conn {
    fn new(writer: Outbox, max_message: usize) -> Self {
        Self {
            writer,
            streams: Mutex::new(HashMap::new()),
            closed: CancellationToken::new(),
            is_closed: AtomicBool::new(false),
            max_message,
        }
    }

    /// The connection ended: every stream it carried is killed.
    fn close(&self) {
        self.is_closed.store(true, Ordering::Release);
        self.closed.cancel();
        let streams: Vec<_> = lock(&self.streams).drain().map(|(_, s)| s).collect();
        let open = streams
            .iter()
            .filter(|s| !s.state.context.is_stopped())
            .count();
        if open > 0
            && let Some(left_out) = CANCEL_LOG.admit()
        {
            tracing::info!(
                requests = open,
                left_out,
                "caller connection lost: its requests in flight are cancelled"
            );
        }
        for s in streams {
            s.state.context.kill();
            lock(&s.input).take();
            s.state.credit_notify.notify_waiters();
        }
    }

    fn send(&self, frame: Bytes) {
        let lone = lock(&self.streams).len() <= 1;
        // A closed writer means the connection is gone; the reader kills the streams.
        let _ = self.writer.send(frame, lone);
    }

    fn send_error(&self, stream: u64, err: &WireError) {
        let json = serde_json::to_vec(err).unwrap_or_default();
        self.send(frame::encode(frame::ERROR, stream, &[&json]));
    }
}

/// What [`Responder::send`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Sent (or buffered, when corked); send the next one when ready.
    Ready,
    /// Sent, but the caller's window is exhausted: await [`Responder::credit`] before
    /// sending more. Buffered frames were flushed.
    Wait,
    /// Not sent: the caller stopped the stream (or went away). Finish the stream.
    Stopped,
}

/// The worker's handle on one response stream.
///
/// A corked responder ([`Responder::set_corked`]) buffers its frames until
/// [`Responder::flush`] (or the end of the stream): a handler that produces several items
/// in one go then costs one write, and the acknowledgement travels with the first items.
pub struct Responder {
    conn: Arc<Conn>,
    stream: u64,
    state: Arc<StreamState>,
    done: bool,
    accepted: bool,
    corked: bool,
    pending: BytesMut,
    _guard: InflightGuard,
}

impl Responder {
    /// The request's context.
    pub fn context(&self) -> &Context {
        &self.state.context
    }

    /// Buffer frames until [`Responder::flush`] while `corked`.
    pub fn set_corked(&mut self, corked: bool) {
        self.corked = corked;
        if !corked {
            self.flush();
        }
    }

    fn push(&mut self, kind: u8, payload: &[u8]) {
        frame::encode_into(&mut self.pending, kind, self.stream, payload);
        if !self.corked {
            self.flush();
        }
    }

    /// Send the buffered frames.
    pub fn flush(&mut self) {
        if !self.pending.is_empty() {
            let frames = self.pending.split().freeze();
            self.conn.send(frames);
        }
    }

    /// Whether frames are waiting for [`Responder::flush`].
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Tell the caller the request was accepted (its `generate()` call resolves). Implied
    /// by the first item or the end of the stream; idempotent.
    pub fn accept(&mut self) {
        if !self.accepted {
            self.accepted = true;
            self.push(frame::ACK, &[]);
        }
    }

    /// Send one response item (JSON).
    pub fn send(&mut self, item: &[u8]) -> Result<SendStatus> {
        if self.state.context.is_stopped() || self.conn.is_closed.load(Ordering::Acquire) {
            return Ok(SendStatus::Stopped);
        }
        if item.len() > self.conn.max_message {
            return Err(Error::MessageTooLarge {
                size: item.len(),
                max: self.conn.max_message,
            });
        }
        self.accept();
        if let Some(m) = &self._guard.0.metrics {
            m.response_sent(item.len());
        }
        self.push(frame::DATA, item);
        if self.state.credits.fetch_sub(1, Ordering::AcqRel) <= 1 {
            self.flush();
            Ok(SendStatus::Wait)
        } else {
            Ok(SendStatus::Ready)
        }
    }

    /// Resolves when the caller granted more credit, stopped the stream or went away.
    pub async fn credit(&self) {
        self.credit_waiter().await;
    }

    /// A future that resolves like [`Responder::credit`], independent of this handle's
    /// lifetime.
    pub fn credit_waiter(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let state = Arc::clone(&self.state);
        let closed = self.conn.closed.clone();
        async move {
            loop {
                let notified = state.credit_notify.notified();
                if state.credits.load(Ordering::Acquire) > 0 || state.context.is_stopped() {
                    return;
                }
                tokio::select! {
                    () = notified => {}
                    () = state.context.stopped() => return,
                    () = closed.cancelled() => return,
                }
            }
        }
    }

    /// End the stream successfully (the explicit final frame).
    pub fn finish(mut self) {
        self.done = true;
        self.accept();
        self.push(frame::END, &[]);
        self.flush();
    }

    /// End the stream with an error.
    pub fn fail(mut self, err: WireError) {
        self.done = true;
        if let (Some(m), false) = (&self._guard.0.metrics, err.kind == ErrorKind::Cancelled) {
            m.handler_error();
        }
        let json = serde_json::to_vec(&err).unwrap_or_default();
        self.push(frame::ERROR, &json);
        self.flush();
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if !self.done {
            let err = WireError::new(
                ErrorKind::StreamIncomplete,
                "the handler ended without completing the stream",
                true,
            );
            let json = serde_json::to_vec(&err).unwrap_or_default();
            self.push(frame::ERROR, &json);
        }
        self.flush();
        lock(&self.conn.streams).remove(&self.stream);
    }
}

/// The process's request-plane listener.
pub struct Server {
    address: SocketAddr,
    endpoints: Arc<Mutex<HashMap<String, Arc<EndpointEntry>>>>,
    cancel: CancellationToken,
    live: Arc<LiveConnections>,
    max_message: usize,
}

/// The listeners of this process by advertised address (`host:port`, as in the discovery
/// records), for callers of the same process ([`Server::in_process`]).
static IN_PROCESS: Mutex<Vec<(String, Weak<Server>)>> = Mutex::new(Vec::new());

impl Server {
    /// Bind `host:port` (port 0: OS-assigned) and start accepting.
    pub async fn bind(host: &str, port: u16, max_message: usize) -> Result<Arc<Self>> {
        let listener = TcpListener::bind((host, port)).await?;
        let address = listener.local_addr()?;
        let server = Arc::new(Self {
            address,
            endpoints: Arc::new(Mutex::new(HashMap::new())),
            cancel: CancellationToken::new(),
            live: Arc::new(LiveConnections::default()),
            max_message,
        });
        lock(&IN_PROCESS).push((address.to_string(), Arc::downgrade(&server)));
        let endpoints = Arc::clone(&server.endpoints);
        let cancel = server.cancel.clone();
        let live = Arc::clone(&server.live);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    r = listener.accept() => r,
                    () = cancel.cancelled() => break,
                };
                match accepted {
                    Ok((sock, _)) => {
                        let endpoints = Arc::clone(&endpoints);
                        let cancel = cancel.clone();
                        let guard = live.guard();
                        tokio::spawn(async move {
                            serve_connection(sock, endpoints, max_message, cancel).await;
                            drop(guard);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "request plane: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(server)
    }

    /// The bound address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serve `path` with `entry` (replacing a previous entry of the same path).
    pub fn add_endpoint(&self, path: String, entry: Arc<EndpointEntry>) {
        lock(&self.endpoints).insert(path, entry);
    }

    /// Stop serving `path` (new requests get `Unknown endpoint`).
    pub fn remove_endpoint(&self, path: &str) {
        lock(&self.endpoints).remove(path);
    }

    /// Close the listener and every connection.
    pub fn close(&self) {
        self.cancel.cancel();
    }

    /// The open listener of this process whose address is `address`: a caller of the same
    /// process may then connect in process ([`Server::accept_local`]) instead of through
    /// the loopback. A connection to that address would reach this listener anyway.
    pub(crate) fn in_process(address: &str) -> Option<Arc<Self>> {
        let mut all = lock(&IN_PROCESS);
        all.retain(|(_, s)| s.upgrade().is_some_and(|s| !s.cancel.is_cancelled()));
        all.iter()
            .find(|(a, _)| a == address)
            .and_then(|(_, s)| s.upgrade())
    }

    /// Accept an in-process connection whose caller receives this side's frames through
    /// `caller`; returns the end the caller sends its frames to.
    ///
    /// The same connection as a TCP one, without the sockets: the caller's frames are
    /// dispatched on the caller's thread as this server's reader would dispatch them
    /// (same size limit, same per-stream state), and the responses are delivered to the
    /// caller's streams on the responder's thread as the caller's reader would. A
    /// sequential request of one process then crosses no thread at all. When the server
    /// closes, the connection's streams are killed as on a TCP connection, and the caller
    /// sees the connection end (`closed`) once every responder has finished; the caller
    /// is told by `caller` being dropped.
    pub(crate) fn accept_local(
        &self,
        caller: Arc<dyn Peer>,
        closed: CancellationToken,
    ) -> Arc<dyn Peer> {
        let conn = Arc::new(Conn::new(Outbox::Local(caller), self.max_message));
        let end = Arc::new(LocalEnd {
            conn: Arc::downgrade(&conn),
            endpoints: Arc::clone(&self.endpoints),
            runtime: tokio::runtime::Handle::current(),
        });
        let cancel = self.cancel.clone();
        let guard = self.live.guard();
        tokio::spawn(async move {
            cancel.cancelled().await;
            conn.close();
            // Only the responders hold the connection now: it ends with the last of them.
            drop(conn);
            // As a TCP connection's writer: the last responders' frames, for a moment.
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(1), closed.cancelled()).await;
            drop(guard);
        });
        end
    }

    /// Resolves when every connection task has flushed its last frames and ended (or after
    /// `timeout`).
    pub async fn flushed(&self, timeout: std::time::Duration) {
        self.live.idle(timeout).await;
    }
}

/// One caller inbox of the NATS request plane, served like a TCP connection.
struct NatsConn {
    conn: Arc<Conn>,
    endpoints: Arc<Mutex<HashMap<String, Arc<EndpointEntry>>>>,
}

impl super::nats::VirtualConn for NatsConn {
    fn dispatch(&self, f: frame::Frame) {
        dispatch(&self.conn, &self.endpoints, f);
    }

    fn has_streams(&self) -> bool {
        !lock(&self.conn.streams).is_empty()
    }

    fn closed(&self) -> CancellationToken {
        self.conn.closed.clone()
    }

    fn close(&self) {
        self.conn.close();
    }
}

impl Server {
    /// Serve this server's endpoints on the NATS subject `subject` (the NATS request plane)
    /// until `cancel`.
    pub(crate) async fn serve_nats(
        &self,
        client: async_nats::Client,
        subject: String,
        max_message: usize,
        cancel: CancellationToken,
    ) -> Result<()> {
        let endpoints = Arc::clone(&self.endpoints);
        let make: Arc<
            dyn Fn(mpsc::UnboundedSender<Bytes>) -> Arc<dyn super::nats::VirtualConn> + Send + Sync,
        > = Arc::new(move |writer| {
            Arc::new(NatsConn {
                conn: Arc::new(Conn::new(Outbox::Queued(writer), max_message)),
                endpoints: Arc::clone(&endpoints),
            })
        });
        super::nats::serve_subject(client, subject, make, Arc::clone(&self.live), cancel).await
    }
}

async fn write_all(sock: &OwnedWriteHalf, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        sock.writable().await?;
        match sock.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The writer task of a TCP connection ([`Outbox::tcp`]).
pub(crate) async fn write_loop(direct: Arc<Direct>, mut rx: mpsc::UnboundedReceiver<Bytes>) {
    // Coalesce queued frames into one write: under load many small frames are ready at
    // once, and one syscall for all of them is what makes small items cheap.
    const MAX_BATCH: usize = 256 * 1024;
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        if first.len() >= MAX_BATCH {
            if write_all(&direct.sock, &first).await.is_err() {
                break;
            }
            direct.idle_if_drained(&rx);
            continue;
        }
        buf.extend_from_slice(&first);
        // Let the tasks that are runnable now queue their frames first: a worker's step
        // wakes every stream's task at once, and without this the writer (woken into the
        // scheduler's LIFO slot by the first frame) ran right after each one, writing one
        // frame per syscall (12 sends per 16-token response, about as many wake-ups of the
        // caller's reader). `yield_now` waits for no timer and no frame that is not being
        // produced: the writer runs again once the runnable tasks have run.
        tokio::task::yield_now().await;
        while buf.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(f) => buf.extend_from_slice(&f),
                Err(_) => break,
            }
        }
        if write_all(&direct.sock, &buf).await.is_err() {
            break;
        }
        buf.clear();
        direct.idle_if_drained(&rx);
    }
    // No sender writes past the end of the writer (their frames fail to queue instead).
    *lock(&direct.busy) = true;
    drop(rx);
    if let Ok(d) = Arc::try_unwrap(direct) {
        let mut sock = d.sock;
        let _ = sock.shutdown().await;
    }
}

impl Direct {
    /// After a write: senders may write themselves again unless more frames are queued.
    fn idle_if_drained(&self, rx: &mpsc::UnboundedReceiver<Bytes>) {
        let mut busy = lock(&self.busy);
        if rx.is_empty() {
            *busy = false;
        }
    }
}

/// The server's end of an in-process connection: the caller's frames, dispatched at once.
struct LocalEnd {
    conn: Weak<Conn>,
    endpoints: Arc<Mutex<HashMap<String, Arc<EndpointEntry>>>>,
    /// Entered for the dispatch when the caller's thread is outside the runtime (handlers
    /// may spawn tasks).
    runtime: tokio::runtime::Handle,
}

impl Peer for LocalEnd {
    fn receive(&self, frames: Bytes) -> std::result::Result<(), ()> {
        let conn = self.conn.upgrade().ok_or(())?;
        if conn.is_closed.load(Ordering::Acquire) {
            // The connection is closing: its reader would read nothing more.
            return Ok(());
        }
        let _rt = tokio::runtime::Handle::try_current()
            .is_err()
            .then(|| self.runtime.enter());
        for f in super::nats::split_frames(frames) {
            if f.payload.len() > conn.max_message {
                too_large(&conn, f.kind, f.stream, f.payload.len());
            } else {
                dispatch(&conn, &self.endpoints, f);
            }
        }
        Ok(())
    }
}

/// A frame over the size limit, skipped by the reader: a request (or a request item) gets an
/// `ERROR` for its stream (an item also kills its stream); the connection carries on.
fn too_large(conn: &Conn, kind: u8, stream: u64, size: usize) {
    if kind == frame::REQUEST || kind == frame::ITEM {
        conn.send_error(
            stream,
            &WireError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "Request too large: {size} bytes exceeds the maximum message \
                     size of {} bytes",
                    conn.max_message
                ),
                false,
            ),
        );
        let streams = lock(&conn.streams);
        if let (frame::ITEM, Some(s)) = (kind, streams.get(&stream)) {
            s.state.context.kill();
        }
    }
}

async fn serve_connection(
    sock: TcpStream,
    endpoints: Arc<Mutex<HashMap<String, Arc<EndpointEntry>>>>,
    max_message: usize,
    cancel: CancellationToken,
) {
    let _ = sock.set_nodelay(true);
    let (r, w) = sock.into_split();
    let (outbox, direct, rx) = Outbox::tcp(w);
    let conn = Arc::new(Conn::new(outbox, max_message));
    let writer = tokio::spawn(write_loop(direct, rx));
    let mut reader = frame::FrameReader::new(r, max_message);
    loop {
        let read = tokio::select! {
            r = reader.next() => r,
            () = cancel.cancelled() => break,
        };
        match read {
            Ok(Read::Frame(f)) => dispatch(&conn, &endpoints, f),
            Ok(Read::TooLarge { kind, stream, size }) => too_large(&conn, kind, stream, size),
            Ok(Read::Eof) => break,
            Err(e) => {
                tracing::debug!(error = %e, "request plane: connection error");
                break;
            }
        }
    }
    conn.close();
    drop(conn);
    // The writer ends once every responder (each holds the connection) is gone; give it a
    // moment to flush the final frames.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), writer).await;
}

fn dispatch(
    conn: &Arc<Conn>,
    endpoints: &Mutex<HashMap<String, Arc<EndpointEntry>>>,
    f: frame::Frame,
) {
    match f.kind {
        frame::REQUEST => start_request(conn, endpoints, f.stream, &f.payload),
        frame::ITEM => {
            let streams = lock(&conn.streams);
            if let Some(tx) = streams.get(&f.stream).and_then(|s| lock(&s.input).clone()) {
                let _ = tx.send(f.payload);
            }
        }
        frame::INPUT_END => {
            if let Some(s) = lock(&conn.streams).get(&f.stream) {
                lock(&s.input).take();
            }
        }
        frame::STOP | frame::KILL => {
            if let Some(s) = lock(&conn.streams).get(&f.stream) {
                if !s.state.context.is_stopped() {
                    if let Some(m) = &s.metrics {
                        m.cancelled();
                    }
                    if let Some(left_out) = CANCEL_LOG.admit() {
                        tracing::info!(
                            request_id = %s.state.context.id(),
                            left_out,
                            "request cancelled by the caller"
                        );
                    }
                }
                if f.kind == frame::KILL {
                    s.state.context.kill();
                } else {
                    s.state.context.stop_generating();
                }
                lock(&s.input).take();
                s.state.credit_notify.notify_waiters();
            }
        }
        frame::CREDIT => {
            let n = f
                .payload
                .get(0..4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes)
                .unwrap_or(0);
            if let Some(s) = lock(&conn.streams).get(&f.stream) {
                s.state.credits.fetch_add(i64::from(n), Ordering::AcqRel);
                s.state.credit_notify.notify_waiters();
            }
        }
        other => tracing::debug!(kind = other, "request plane: ignoring unexpected frame"),
    }
}

fn start_request(
    conn: &Arc<Conn>,
    endpoints: &Mutex<HashMap<String, Arc<EndpointEntry>>>,
    stream: u64,
    payload: &Bytes,
) {
    let reject = |kind, msg: String| conn.send_error(stream, &WireError::new(kind, msg, false));
    let Some((path, header, body)) = frame::split_request(payload) else {
        return reject(ErrorKind::InvalidArgument, "malformed request frame".into());
    };
    let header: RequestHeader = match serde_json::from_slice(&header) {
        Ok(h) => h,
        Err(e) => {
            return reject(
                ErrorKind::InvalidArgument,
                format!("malformed request header: {e}"),
            );
        }
    };
    let entry = lock(endpoints).get(&path).cloned();
    let Some(entry) = entry else {
        return reject(ErrorKind::NotFound, format!("Unknown endpoint: {path}"));
    };
    if !entry.accepting.load(Ordering::Acquire) {
        return reject(
            ErrorKind::Unavailable,
            format!("Server unavailable: endpoint {path} is not accepting requests"),
        );
    }
    entry.inflight.fetch_add(1, Ordering::AcqRel);
    if let Some(m) = &entry.metrics {
        m.request_started(body.len());
    }
    let guard = InflightGuard(Arc::clone(&entry), Instant::now());
    let context = Context::new(Some(header.id), header.metadata);
    if header.stopped {
        context.stop_generating();
    }
    let state = Arc::new(StreamState {
        context: context.clone(),
        credits: AtomicI64::new(i64::from(STREAM_WINDOW)),
        credit_notify: Notify::new(),
    });
    let (input_tx, input) = if header.streaming {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    lock(&conn.streams).insert(
        stream,
        Arc::new(StreamEntry {
            state: Arc::clone(&state),
            metrics: entry.metrics.clone(),
            input: Mutex::new(input_tx),
        }),
    );
    let responder = Responder {
        conn: Arc::clone(conn),
        stream,
        state,
        done: false,
        accepted: false,
        corked: false,
        pending: BytesMut::new(),
        _guard: guard,
    };
    entry.handler.start(
        Request {
            body,
            context,
            input,
        },
        responder,
    );
}
