//! [`LiveConnections`]: the count of request-plane tasks that may still have frames to
//! send, which the server's `flushed` waits on at shutdown. Shared by the TCP server and
//! the NATS subject server; a module of its own so that neither of those imports the
//! other for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Count of connection tasks still running (to let the last frames flush at shutdown):
/// TCP connections, and for the NATS request plane each subject's serving task and each
/// virtual connection's publisher.
#[derive(Default)]
pub(crate) struct LiveConnections {
    count: AtomicUsize,
    idle: Notify,
}

impl LiveConnections {
    /// Count one more live task until the guard drops.
    pub(crate) fn guard(self: &Arc<Self>) -> LiveGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        LiveGuard(Arc::clone(self))
    }

    /// Resolves when no task is counted any more (or after `timeout`).
    pub(crate) async fn idle(&self, timeout: Duration) {
        let wait = async {
            loop {
                let notified = self.idle.notified();
                if self.count.load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
    }
}

pub(crate) struct LiveGuard(Arc<LiveConnections>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
