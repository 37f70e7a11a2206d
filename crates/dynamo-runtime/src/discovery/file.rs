//! A key-value store in a directory, shared by the processes of one machine.
//!
//! * Each key is one file in the root directory (`DYN_FILE_KV`, default
//!   `$TMPDIR/dynamo_store_kv`); its name is the key percent-encoded (only `[A-Za-z0-9_-]`
//!   stay raw), its content the value.
//! * Writes go to a `.tmp-*` file first and are published by rename, so readers never see
//!   a partial value; names starting with `.` are ignored.
//! * Leases: the owning process touches its files' mtime every TTL/3. Any process deletes
//!   files whose mtime is older than the TTL (default 10 s, `DYN_FILE_KV_TTL_SECS`), which
//!   cleans up after processes that died. Owned files are deleted on shutdown.
//! * Watching: a background thread rescans the directory every [`POLL_INTERVAL`] and bumps
//!   the change counter when the live set differs from the previous scan.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::{BoxFuture, KvStore};
use crate::context::lock;
use crate::error::{Error, Result};

/// Directory rescan period. Joins and leaves reach watchers within about this long; a scan
/// of a directory with a handful of small files costs a few microseconds.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Default lease TTL, matching the reference (and etcd's default lease).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

struct State {
    root: PathBuf,
    ttl: Duration,
    owned: Mutex<BTreeMap<String, String>>,
    last_scan: Mutex<BTreeMap<String, String>>,
    version: watch::Sender<u64>,
    stop: AtomicBool,
    /// Serializes lease refreshes with puts and deletes, so a refresh never resurrects a
    /// key deleted while it ran.
    io: Mutex<()>,
}

/// A handle on a directory store, with the leases of this process.
pub struct FileStore {
    state: Arc<State>,
}

impl FileStore {
    /// Open (creating it if needed) the store at `root` with lease `ttl`, and start the
    /// lease/watch thread.
    pub fn open(root: impl Into<PathBuf>, ttl: Duration) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root)?;
        let state = Arc::new(State {
            root,
            ttl,
            owned: Mutex::new(BTreeMap::new()),
            last_scan: Mutex::new(BTreeMap::new()),
            version: watch::channel(0).0,
            stop: AtomicBool::new(false),
            io: Mutex::new(()),
        });
        let bg = Arc::clone(&state);
        std::thread::Builder::new()
            .name("dynamo-file-kv".into())
            .spawn(move || bg.run())?;
        Ok(Self { state })
    }

    /// The default root: `$DYN_FILE_KV`, else `$TMPDIR/dynamo_store_kv`.
    pub fn default_root() -> PathBuf {
        match std::env::var_os("DYN_FILE_KV") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => std::env::temp_dir().join("dynamo_store_kv"),
        }
    }

    /// The lease TTL from `DYN_FILE_KV_TTL_SECS` (seconds, may be fractional), else 10 s.
    pub fn default_ttl() -> Duration {
        std::env::var("DYN_FILE_KV_TTL_SECS")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(DEFAULT_TTL)
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
    }
}

/// Percent-encode a key into a file name.
fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len() * 2);
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn write_atomic(root: &Path, key: &str, value: &str) -> std::io::Result<()> {
    let tmp = root.join(format!(".tmp-{:016x}", fastrand::u64(..)));
    fs::write(&tmp, value)?;
    fs::rename(&tmp, root.join(encode(key))).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

impl State {
    fn run(self: Arc<Self>) {
        // Refresh well inside the TTL so a short scheduling stall does not expire a lease.
        let refresh_every = (self.ttl / 3).max(POLL_INTERVAL);
        let mut last_refresh = std::time::Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(POLL_INTERVAL);
            if last_refresh.elapsed() >= refresh_every {
                self.refresh();
                last_refresh = std::time::Instant::now();
            }
            self.scan_and_publish();
        }
    }

    /// Scan, and bump the change counter when the live set differs from the previous scan
    /// (by this thread or by a watcher's `list`): every scan updates the baseline, so a
    /// change seen first by a `list` is not missed by the next poll.
    fn scan_and_publish(&self) -> BTreeMap<String, String> {
        let live = self.scan();
        let changed = {
            let mut last = lock(&self.last_scan);
            if *last == live {
                false
            } else {
                *last = live.clone();
                true
            }
        };
        if changed {
            self.bump();
        }
        live
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Touch every owned file; rewrite the ones that disappeared.
    fn refresh(&self) {
        let _io = lock(&self.io);
        let owned = lock(&self.owned).clone();
        let now = SystemTime::now();
        for (key, value) in owned {
            let path = self.root.join(encode(&key));
            let touched = fs::File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(now));
            if let Err(e) = touched {
                if e.kind() == ErrorKind::NotFound {
                    if let Err(e) = write_atomic(&self.root, &key, &value) {
                        tracing::warn!(%key, error = %e, "file store: cannot rewrite lease");
                    }
                } else {
                    tracing::warn!(%key, error = %e, "file store: cannot refresh lease");
                }
            }
        }
    }

    /// The live entries; deletes expired ones that this process does not own.
    fn scan(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let Ok(dir) = fs::read_dir(&self.root) else {
            return out;
        };
        let owned = lock(&self.owned).clone();
        let now = SystemTime::now();
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let Some(key) = decode(name) else { continue };
            let path = entry.path();
            if !owned.contains_key(&key) {
                let age = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|m| now.duration_since(m).ok());
                if age.is_some_and(|age| age > self.ttl) {
                    let _ = fs::remove_file(&path);
                    continue;
                }
            }
            if let Ok(value) = fs::read_to_string(&path) {
                out.insert(key, value);
            }
        }
        out
    }
}

impl KvStore for FileStore {
    fn put(&self, key: &str, value: &str) -> BoxFuture<'_, Result<()>> {
        let _io = lock(&self.state.io);
        let res = write_atomic(&self.state.root, key, value).map_err(Error::from);
        if res.is_ok() {
            lock(&self.state.owned).insert(key.to_owned(), value.to_owned());
            self.state.bump();
        }
        Box::pin(async move { res })
    }

    fn delete(&self, key: &str) -> BoxFuture<'_, Result<()>> {
        let _io = lock(&self.state.io);
        lock(&self.state.owned).remove(key);
        let res = match fs::remove_file(self.state.root.join(encode(key))) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(Error::from(e)),
            _ => Ok(()),
        };
        self.state.bump();
        Box::pin(async move { res })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        let out = self
            .state
            .scan_and_publish()
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect();
        Box::pin(async move { Ok(out) })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.state.version.subscribe()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        let _io = lock(&self.state.io);
        let owned = std::mem::take(&mut *lock(&self.state.owned));
        for key in owned.keys() {
            let _ = fs::remove_file(self.state.root.join(encode(key)));
        }
        self.state.stop.store(true, Ordering::Release);
        self.state.bump();
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        let k = "v1/instances/ns/comp/ep/1f";
        let e = encode(k);
        assert!(!e.contains('/') && !e.starts_with('.'));
        assert_eq!(decode(&e).as_deref(), Some(k));
    }

    #[tokio::test]
    async fn entries_are_shared_and_expire_when_not_refreshed() {
        let dir = tempfile::tempdir().unwrap();
        let a = FileStore::open(dir.path(), Duration::from_millis(600)).unwrap();
        let b = FileStore::open(dir.path(), Duration::from_millis(600)).unwrap();
        a.put("v1/x/1", "one").await.unwrap();
        assert_eq!(
            b.list("v1/x/").await.unwrap(),
            vec![("v1/x/1".into(), "one".into())]
        );
        // `a` keeps its lease alive past the TTL.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(b.list("v1/").await.unwrap().len(), 1);
        // A dead owner (no refresh): the entry expires for everyone else.
        a.state.stop.store(true, Ordering::Release);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(b.list("v1/").await.unwrap().is_empty());
        b.put("v1/y", "two").await.unwrap();
        b.shutdown().await;
        assert!(fs::read_dir(dir.path()).unwrap().next().is_none());
    }
}
