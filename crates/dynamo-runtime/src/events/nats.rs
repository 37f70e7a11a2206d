//! NATS event transport: core publish/subscribe on the channel's subject.
//!
//! Publishing never blocks the caller: frames go through an unbounded local queue to a
//! task that hands them to the NATS client in order (the client buffers while it
//! reconnects). Events published while this process is disconnected from the server are
//! dropped, and events published while a subscriber is disconnected are lost for it; either
//! way subscribers see the sequence gap when events resume.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Feed, decode_envelope_bytes};
use crate::error::{Error, Result};

enum Msg {
    Frame(Bytes),
    Flush(oneshot::Sender<Result<()>>),
}

/// The publishing side of one channel over NATS.
pub(crate) struct NatsPublisher {
    tx: mpsc::UnboundedSender<Msg>,
    client: async_nats::Client,
    dropped: Arc<AtomicU64>,
}

impl NatsPublisher {
    pub(crate) fn new(
        client: async_nats::Client,
        subject: String,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
        let dropped = Arc::new(AtomicU64::new(0));
        let pump_client = client.clone();
        let pump_dropped = Arc::clone(&dropped);
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = rx.recv() => m,
                    () = cancel.cancelled() => None,
                };
                match msg {
                    Some(Msg::Frame(b)) => {
                        if let Err(e) = pump_client.publish(subject.clone(), b).await {
                            pump_dropped.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(error = %e, "event plane: NATS publish failed");
                        }
                    }
                    Some(Msg::Flush(done)) => {
                        let r = pump_client
                            .flush()
                            .await
                            .map_err(|e| Error::Nats(format!("flush failed: {e}")));
                        let _ = done.send(r);
                    }
                    None => return,
                }
            }
        });
        Self {
            tx,
            client,
            dropped,
        }
    }

    pub(crate) fn send(&self, envelope: Bytes) -> Result<()> {
        let max = self.client.server_info().max_payload;
        if max > 0 && envelope.len() > max {
            return Err(Error::NatsPayloadTooLarge {
                size: envelope.len(),
                max,
            });
        }
        if self.client.connection_state() != async_nats::connection::State::Connected {
            // Best effort: an event published while the server is unreachable is dropped
            // (subscribers see the gap) rather than buffered without bound and delivered
            // stale.
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.tx
            .send(Msg::Frame(envelope))
            .map_err(|_| Error::ShuttingDown)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub(crate) async fn flush(&self) -> Result<()> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Msg::Flush(done))
            .map_err(|_| Error::ShuttingDown)?;
        wait.await.map_err(|_| Error::ShuttingDown)?
    }
}

/// Subscribe to `subject` and feed decoded envelopes into `feed` until it is cancelled.
pub(crate) async fn subscribe(
    client: async_nats::Client,
    subject: String,
    feed: Feed,
) -> Result<()> {
    let mut sub = client
        .subscribe(subject.clone())
        .await
        .map_err(|e| Error::Nats(format!("subscribe to {subject} failed: {e}")))?;
    // The subscription is live on the server once the flush returns.
    client
        .flush()
        .await
        .map_err(|e| Error::Nats(format!("flush failed: {e}")))?;
    feed.connected.send_replace(1);
    tokio::spawn(async move {
        // The stop and closed checks race the whole loop (polled once per wake-up, not
        // once per message: polling a cancellation future takes the token's lock).
        let forward = async {
            while let Some(msg) = sub.next().await {
                // The payload of a MessagePack envelope stays a slice of the message.
                match decode_envelope_bytes(&msg.payload) {
                    Ok(e) if e.topic == feed.topic => {
                        if feed.tx.send(e).await.is_err() {
                            break;
                        }
                    }
                    _ => feed.stats.add_malformed(),
                }
            }
        };
        tokio::select! {
            () = forward => {}
            () = feed.cancel.cancelled() => {}
            () = feed.tx.closed() => {}
        }
        feed.connected.send_replace(0);
        let _ = sub.unsubscribe().await;
    });
    Ok(())
}
