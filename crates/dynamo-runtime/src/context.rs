//! Per-request context: id, cancellation (stop and kill), metadata, first-token signal.
//!
//! Invariants:
//! * `kill()` implies `stop()`: a killed context is also stopped.
//! * A child context ([`Context::child`]) is stopped or killed whenever its parent is, and
//!   is created already stopped when the parent already was. Stopping a child does not
//!   stop its parent.
//! * The metadata map is shared by every handle of the same context; [`Context::child`]
//!   and [`Context::detached`] take a snapshot copy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

/// Shared, mutable string map of a context.
pub type Metadata = Arc<Mutex<BTreeMap<String, String>>>;

/// A cheap-to-clone handle on one request's context.
#[derive(Clone, Debug)]
pub struct Context {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    id: String,
    stop: CancellationToken,
    kill: CancellationToken,
    metadata: Metadata,
    first_token: AtomicBool,
    /// Set by this context's own stop or kill, before the token is cancelled: what
    /// `is_stopped` reads first (a worker checks it per item sent, and the token's check
    /// takes a lock).
    stopped: AtomicBool,
    /// Whether a parent's stop reaches `stop` (a [`Context::child`]), bypassing `stopped`.
    linked: bool,
}

impl Default for Context {
    fn default() -> Self {
        Self::new(None, BTreeMap::new())
    }
}

impl Context {
    /// A standalone context; without `id` a fresh UUID-like id is generated.
    pub fn new(id: Option<String>, metadata: BTreeMap<String, String>) -> Self {
        Self::from_parts(
            id.unwrap_or_else(new_request_id),
            CancellationToken::new(),
            CancellationToken::new(),
            metadata,
            false,
        )
    }

    fn from_parts(
        id: String,
        stop: CancellationToken,
        kill: CancellationToken,
        metadata: BTreeMap<String, String>,
        linked: bool,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                id,
                stop,
                kill,
                metadata: Arc::new(Mutex::new(metadata)),
                first_token: AtomicBool::new(false),
                stopped: AtomicBool::new(false),
                linked,
            }),
        }
    }

    /// A linked child with the same id and a snapshot of the metadata: stopping or killing
    /// `self` stops or kills the child.
    pub fn child(&self) -> Self {
        Self::from_parts(
            self.inner.id.clone(),
            self.inner.stop.child_token(),
            self.inner.kill.child_token(),
            self.metadata_snapshot(),
            true,
        )
    }

    /// A new, independent context with the given id and a snapshot of the metadata.
    pub fn detached(&self, id: String) -> Self {
        Self::new(Some(id), self.metadata_snapshot())
    }

    /// The request id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Request a graceful stop (idempotent).
    pub fn stop_generating(&self) {
        self.inner.stopped.store(true, Ordering::Release);
        self.inner.stop.cancel();
    }

    /// Request termination without draining; implies stop.
    pub fn kill(&self) {
        self.inner.stopped.store(true, Ordering::Release);
        self.inner.kill.cancel();
        self.inner.stop.cancel();
    }

    /// Whether a stop (or kill) was requested.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Acquire)
            || (self.inner.linked && self.inner.stop.is_cancelled())
    }

    /// Whether a kill was requested.
    pub fn is_killed(&self) -> bool {
        self.inner.kill.is_cancelled()
    }

    /// Resolves once the context is stopped or killed.
    pub async fn stopped(&self) {
        self.inner.stop.cancelled().await;
    }

    /// Resolves once the context is killed.
    pub async fn killed(&self) {
        self.inner.kill.cancelled().await;
    }

    /// The live metadata map shared by every handle of this context.
    pub fn metadata(&self) -> &Metadata {
        &self.inner.metadata
    }

    /// Lock the metadata map (a poisoned lock is recovered: the map holds plain strings).
    pub fn lock_metadata(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        lock(&self.inner.metadata)
    }

    /// A copy of the metadata.
    pub fn metadata_snapshot(&self) -> BTreeMap<String, String> {
        self.lock_metadata().clone()
    }

    /// Fire the first-token signal (idempotent).
    pub fn notify_first_token(&self) {
        self.inner.first_token.store(true, Ordering::Release);
    }

    /// Whether [`Context::notify_first_token`] was called.
    pub fn first_token_notified(&self) -> bool {
        self.inner.first_token.load(Ordering::Acquire)
    }
}

/// Lock a mutex, recovering from poisoning (the protected data stays consistent because
/// every critical section in this crate is a single map operation).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A random UUID-v4-formatted id.
pub fn new_request_id() -> String {
    let hi = fastrand::u64(..);
    let lo = fastrand::u64(..);
    let hi = (hi & 0xffff_ffff_ffff_0fff) | 0x4000;
    let lo = (lo & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    // Written digit by digit into one allocation of the final size: `format!` grew the
    // string several times, and one id is made per request (11 % of the frontend's
    // allocations under load).
    fn put(id: &mut String, v: u64, digits: u32) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for k in (0..digits).rev() {
            id.push(char::from(HEX[(v >> (4 * k)) as usize & 0xf]));
        }
    }
    let mut id = String::with_capacity(36);
    put(&mut id, hi >> 32, 8);
    id.push('-');
    put(&mut id, (hi >> 16) & 0xffff, 4);
    id.push('-');
    put(&mut id, hi & 0xffff, 4);
    id.push('-');
    put(&mut id, lo >> 48, 4);
    id.push('-');
    put(&mut id, lo & 0xffff_ffff_ffff, 12);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_implies_stop_and_children_follow_parents() {
        let parent = Context::default();
        let child = parent.child();
        assert_eq!(child.id(), parent.id());
        child.stop_generating();
        assert!(!parent.is_stopped());
        let child2 = parent.child();
        parent.kill();
        assert!(parent.is_stopped() && parent.is_killed());
        assert!(child2.is_stopped() && child2.is_killed());
        let late = parent.child();
        assert!(
            late.is_stopped(),
            "a child of a stopped parent starts stopped"
        );
    }

    #[test]
    fn metadata_is_shared_and_snapshotted() {
        let ctx = Context::new(Some("abc".into()), BTreeMap::new());
        let same = ctx.clone();
        same.lock_metadata().insert("k".into(), "v".into());
        assert_eq!(
            ctx.metadata_snapshot().get("k").map(String::as_str),
            Some("v")
        );
        let det = ctx.detached("other".into());
        ctx.lock_metadata().insert("k2".into(), "v2".into());
        assert_eq!(det.id(), "other");
        assert!(!det.metadata_snapshot().contains_key("k2"));
        assert!(!det.is_stopped());
    }

    #[test]
    fn request_ids_look_like_uuids() {
        let id = new_request_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, new_request_id());
        for _ in 0..200 {
            let id = new_request_id();
            for (i, c) in id.char_indices() {
                if [8, 13, 18, 23].contains(&i) {
                    assert_eq!(c, '-', "{id}");
                } else {
                    assert!(c.is_ascii_hexdigit() && !c.is_ascii_uppercase(), "{id}");
                }
            }
            assert!("89ab".contains(&id[19..20]), "variant nibble of {id}");
        }
    }

    #[tokio::test]
    async fn stopped_resolves_after_stop() {
        let ctx = Context::default();
        let c2 = ctx.clone();
        let waiter = tokio::spawn(async move { c2.stopped().await });
        ctx.stop_generating();
        waiter.await.unwrap();
    }
}
