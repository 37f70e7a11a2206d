//! The NATS request plane (`DYN_REQUEST_PLANE=nats`): the same frames as the TCP plane
//! (`docs/design/request_plane.md`), carried in NATS messages instead of a TCP byte stream.
//!
//! * Each served endpoint subscribes to its instance subject
//!   `{ns}_{component}.{endpoint}-{instance_id:x}` (the discovery transport
//!   `{"nats_tcp": subject}`).
//! * A caller keeps one logical connection per instance subject: its own inbox, subscribed
//!   once. Caller → worker frames (`REQUEST`, `STOP`, `CREDIT`, ...) are published to the
//!   instance subject with the inbox as reply subject; worker → caller frames (`ACK`,
//!   `DATA`, `END`, `ERROR`) are published to the inbox. Frames queued together travel in
//!   one message (up to the server's `max_payload`).
//! * Liveness: NATS has no connection between caller and worker, so while a caller has
//!   streams open on a worker the worker sends a `PING` frame every [`PING_INTERVAL`]; a
//!   caller that hears nothing from it for [`LIVENESS_TIMEOUT`] ends those streams with
//!   `Disconnected` (a killed worker), as a dropped TCP connection would.
//! * A request or response item larger than the server's `max_payload` fails at once with
//!   an error naming the limit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::frame;
use super::live::LiveConnections;
use super::{ErrorKind, WireError};

/// Worker → caller keep-alive period while streams are open.
pub const PING_INTERVAL: Duration = Duration::from_millis(500);
/// Silence after which a caller considers a worker with open streams dead: four missed
/// pings, so a briefly descheduled worker is not declared dead.
pub const LIVENESS_TIMEOUT: Duration = Duration::from_secs(2);

/// The subject of one instance: `{ns}_{component}.{endpoint}-{instance_id:x}`.
pub fn instance_subject(ns: &str, component: &str, endpoint: &str, id: u64) -> String {
    format!("{ns}_{component}.{endpoint}-{id:x}")
}

/// Split a message payload into frames (a message carries one or more whole frames).
pub(crate) fn split_frames(mut b: Bytes) -> Vec<frame::Frame> {
    let mut out = Vec::new();
    while b.len() >= 4 + frame::HEADER_LEN {
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if len < frame::HEADER_LEN || b.len() < 4 + len {
            break;
        }
        let kind = b[4];
        let stream = u64::from_be_bytes(b[5..13].try_into().unwrap_or_default());
        let payload = b.slice(4 + frame::HEADER_LEN..4 + len);
        out.push(frame::Frame {
            kind,
            stream,
            payload,
        });
        b = b.slice(4 + len..);
    }
    out
}

/// The stream id of an encoded frame.
fn frame_stream(f: &[u8]) -> u64 {
    f.get(5..13)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// Publish frames from `rx` to `subject` (with `reply` when given), coalescing queued
/// frames up to `max_payload` per message. A single frame over the limit is replaced by
/// `oversize(stream, size)` when that returns a frame, else dropped.
pub(crate) async fn pump(
    client: async_nats::Client,
    subject: String,
    reply: Option<String>,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    oversize: impl Fn(u64, usize, usize) -> Option<Bytes> + Send,
) {
    let max = client.server_info().max_payload.max(1024);
    let mut buf = BytesMut::new();
    let mut pending: Option<Bytes> = None;
    loop {
        let first = match pending.take() {
            Some(f) => f,
            None => match rx.recv().await {
                Some(f) => f,
                None => return,
            },
        };
        let first = if first.len() > max {
            match oversize(frame_stream(&first), first.len(), max) {
                Some(f) => f,
                None => continue,
            }
        } else {
            first
        };
        buf.extend_from_slice(&first);
        while let Ok(f) = rx.try_recv() {
            if buf.len() + f.len() > max {
                pending = Some(f);
                break;
            }
            buf.extend_from_slice(&f);
        }
        let msg = buf.split().freeze();
        let sent = match &reply {
            Some(r) => {
                client
                    .publish_with_reply(subject.clone(), r.clone(), msg)
                    .await
            }
            None => client.publish(subject.clone(), msg).await,
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, %subject, "request plane: NATS publish failed");
        }
    }
}

/// Worker side: serve `subject`, dispatching frames to the server's endpoints through one
/// virtual connection per caller inbox, until `cancel`.
///
/// Shutdown order matters: `cancel` must come only after the endpoint drained (callers'
/// `STOP` and `CREDIT` frames arrive on this subscription while it drains). Then every
/// virtual connection closes and its publisher sends what is queued, flushes, and ends;
/// `live` counts the serving task and each publisher until then, so the server's
/// `flushed` ([`LiveConnections::idle`]) waits for the last `END` frames to reach the NATS
/// server before the runtime drains and closes the NATS connection (a publish after
/// `drain` is dropped silently, and the caller would only notice after
/// [`LIVENESS_TIMEOUT`]).
pub(crate) async fn serve_subject(
    client: async_nats::Client,
    subject: String,
    make_conn: Arc<dyn Fn(mpsc::UnboundedSender<Bytes>) -> Arc<dyn VirtualConn> + Send + Sync>,
    live: Arc<LiveConnections>,
    cancel: CancellationToken,
) -> crate::Result<()> {
    let mut sub = client
        .subscribe(subject.clone())
        .await
        .map_err(|e| crate::Error::Nats(format!("subscribe to {subject} failed: {e}")))?;
    client
        .flush()
        .await
        .map_err(|e| crate::Error::Nats(format!("flush failed: {e}")))?;
    let serving = live.guard();
    tokio::spawn(async move {
        let mut conns: HashMap<String, Arc<dyn VirtualConn>> = HashMap::new();
        loop {
            let msg = tokio::select! {
                m = sub.next() => m,
                () = cancel.cancelled() => break,
            };
            let Some(msg) = msg else { break };
            let Some(reply) = msg.reply.map(|r| r.to_string()) else {
                continue;
            };
            let conn = Arc::clone(conns.entry(reply).or_insert_with_key(|reply| {
                let (tx, rx) = mpsc::unbounded_channel();
                let conn = make_conn(tx.clone());
                let publishing = live.guard();
                let client = client.clone();
                let reply = reply.clone();
                tokio::spawn(async move {
                    pump(client.clone(), reply, None, rx, |stream, size, max| {
                        Some(oversize_error_frame(stream, size, max))
                    })
                    .await;
                    // Everything queued was handed to the client; make sure it left.
                    let _ = tokio::time::timeout(FLUSH_TIMEOUT, client.flush()).await;
                    drop(publishing);
                });
                tokio::spawn(ping(tx, Arc::clone(&conn)));
                conn
            }));
            for f in split_frames(msg.payload) {
                conn.dispatch(f);
            }
        }
        tracing::debug!(%subject, callers = conns.len(), "request plane: NATS subject closing");
        for (_, c) in conns.drain() {
            c.close();
        }
        let _ = sub.unsubscribe().await;
        drop(serving);
    });
    Ok(())
}

/// An `ERROR` frame for a response item that NATS cannot carry.
fn oversize_error_frame(stream: u64, size: usize, max: usize) -> Bytes {
    let err = WireError::new(
        ErrorKind::InvalidArgument,
        format!(
            "message of {size} bytes exceeds the NATS server's max_payload of {max} bytes \
             (raise max_payload in the nats-server configuration, or use the tcp request plane)"
        ),
        false,
    );
    frame::encode(
        frame::ERROR,
        stream,
        &[&serde_json::to_vec(&err).unwrap_or_default()],
    )
}

/// Bound on the final flush of a closing virtual connection (the NATS server is local or
/// close; a server that does not answer within this is gone anyway).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Send `PING` every [`PING_INTERVAL`] while `conn` has streams; ends (dropping its sender,
/// so the publisher can finish) as soon as `conn` closes.
async fn ping(tx: mpsc::UnboundedSender<Bytes>, conn: Arc<dyn VirtualConn>) {
    let ping = frame::encode(frame::PING, 0, &[]);
    let closed = conn.closed();
    loop {
        tokio::select! {
            () = tokio::time::sleep(PING_INTERVAL) => {}
            () = closed.cancelled() => return,
        }
        if tx.is_closed() {
            return;
        }
        if conn.has_streams() && tx.send(ping.clone()).is_err() {
            return;
        }
    }
}

/// A worker-side connection fed by NATS messages (implemented by the TCP server's
/// connection type, so both planes share the dispatch code).
pub(crate) trait VirtualConn: Send + Sync {
    fn dispatch(&self, f: frame::Frame);
    fn has_streams(&self) -> bool;
    fn closed(&self) -> CancellationToken;
    fn close(&self);
}
