//! A key-value store in a directory, shared by the processes of one machine.
//!
//! * Each key is one file in the root directory (`DYN_FILE_KV`, default
//!   `$XDG_RUNTIME_DIR/dynamo_store_kv`, else `$TMPDIR/dynamo_store_kv-<uid>`, created mode
//!   0700 and refused when another user owns it or others may write to it); its name is the
//!   key percent-encoded (only `[A-Za-z0-9_-]` stay raw), its content the value.
//! * Writes go to a `.tmp-*` file first and are published by rename, so readers never see
//!   a partial value; names starting with `.` are ignored.
//! * Leases: the owning process touches its files' mtime every TTL/3. Any process deletes
//!   files whose mtime is older than the TTL (default 10 s, `DYN_FILE_KV_TTL_SECS`), which
//!   cleans up after processes that died. Owned files are deleted on shutdown.
//! * Watching: a background thread rescans the directory every [`POLL_INTERVAL`] and bumps
//!   the change counter when the live set differs from the previous scan. Between full
//!   scans it sleeps on an inotify watch of the directory: every write here is a rename
//!   into the directory and every delete an unlink, so a join or leave is scanned as soon
//!   as it happens (process start to "model listed" is issue 19's start-up figure, and an
//!   idle process is not woken every few milliseconds). Where no inotify instance can be
//!   had (the per-user limit reached) the thread checks the directory's own mtime every
//!   [`FAST_POLL`] instead, which renames and unlinks change too. The full scans stay as
//!   the safety net for lease expiry, for coarse mtimes, and for network filesystems
//!   (inotify sees only this machine's changes there).
//!
//! The directory is not trusted: only regular files are read, opened with `O_NOFOLLOW |
//! O_NONBLOCK` (a symlink, FIFO or device never blocks or feeds a reader), up to
//! [`MAX_ENTRY_BYTES`] each (larger entries are skipped with a warning); reads run off the
//! async worker threads; and a scan that fails (`read_dir` error, or an entry that cannot
//! be opened for a reason other than having gone) keeps the last known state instead of
//! reporting every key gone.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustix::event::{PollFd, PollFlags};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use tokio::sync::watch;

use super::{BoxFuture, KvStore};
use crate::config::private_file_kv_root;
use crate::context::lock;
use crate::error::{Error, Result};

/// Directory rescan period. Joins and leaves reach watchers within about this long; a scan
/// of a directory with a handful of small files costs a few microseconds.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How often the directory's mtime is checked between full scans (one `stat`) where the
/// directory cannot be watched with inotify.
pub const FAST_POLL: Duration = Duration::from_millis(5);

/// Shortest time between two scans that inotify events start.
const MIN_SCAN_GAP: Duration = Duration::from_millis(1);

/// Default lease TTL, matching the reference (and etcd's default lease). The value lives in
/// the configuration layer, whose defaults need it and which must not import discovery.
pub const DEFAULT_TTL: Duration = crate::config::DEFAULT_FILE_KV_TTL;

/// Largest entry read, in bytes. Discovery values are instance records and model cards
/// (a few KiB); etcd refuses values over 1.5 MiB by default, so anything that works with
/// etcd fits with room to spare, while a huge or endless file cannot exhaust memory.
pub const MAX_ENTRY_BYTES: u64 = 8 << 20;

struct State {
    root: PathBuf,
    ttl: Duration,
    owned: Mutex<BTreeMap<String, String>>,
    last_scan: Mutex<BTreeMap<String, String>>,
    /// Names already reported as unreadable (warn once per name, not every poll).
    warned: Mutex<BTreeSet<String>>,
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
        Self::open_with(root.into(), ttl, true)
    }

    /// [`Self::open`] whose watch thread polls the directory's mtime, as where no inotify
    /// instance can be had (tests of that path).
    #[cfg(test)]
    pub(crate) fn open_polling(root: impl Into<PathBuf>, ttl: Duration) -> Result<Self> {
        Self::open_with(root.into(), ttl, false)
    }

    fn open_with(root: PathBuf, ttl: Duration, inotify: bool) -> Result<Self> {
        // New directories are private; an existing one is used as it is (an explicit
        // `DYN_FILE_KV` is the operator's choice), except the default, checked below.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)?;
        if root == private_file_kv_root() {
            check_private(&root)?;
        }
        let state = Arc::new(State {
            root,
            ttl,
            owned: Mutex::new(BTreeMap::new()),
            last_scan: Mutex::new(BTreeMap::new()),
            warned: Mutex::new(BTreeSet::new()),
            version: watch::channel(0).0,
            stop: AtomicBool::new(false),
            io: Mutex::new(()),
        });
        let watch = inotify
            .then(|| {
                DirWatch::new(&state.root)
                    .inspect_err(|e| {
                        tracing::debug!(root = %state.root.display(), error = %e, "file store: no inotify watch; polling the directory's mtime");
                    })
                    .ok()
            })
            .flatten();
        let bg = Arc::clone(&state);
        std::thread::Builder::new()
            .name("dynamo-file-kv".into())
            .spawn(move || bg.run(watch))?;
        Ok(Self { state })
    }

    /// The default root: `$DYN_FILE_KV`, else a directory private to the user:
    /// `$XDG_RUNTIME_DIR/dynamo_store_kv` when that is set, else
    /// `$TMPDIR/dynamo_store_kv-<uid>` (a shared, world-writable `/tmp/dynamo_store_kv`
    /// would let any local user plant or read discovery entries).
    pub fn default_root() -> PathBuf {
        // Read by `RuntimeConfig::from_env` too: the environment parsing lives with the
        // configuration, below discovery.
        crate::config::file_kv_root_from_env()
    }

    /// The lease TTL from `DYN_FILE_KV_TTL_SECS` (seconds, may be fractional), else 10 s.
    pub fn default_ttl() -> Duration {
        crate::config::file_kv_ttl_from_env()
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
    }
}

/// Refuse a default directory that someone else owns, or that others may write to (it
/// may have been created in advance by another user of a shared `/tmp`).
fn check_private(root: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(root)?;
    let me = fs::metadata("/proc/self").map(|m| m.uid()).ok();
    let refuse = |why: &str| {
        Err(Error::Discovery(format!(
            "file discovery directory {} {why}; set DYN_FILE_KV to a private directory",
            root.display()
        )))
    };
    if !meta.is_dir() {
        return refuse("is not a directory");
    }
    if me.is_some_and(|uid| uid != meta.uid()) {
        return refuse("belongs to another user");
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return refuse("is writable by other users");
    }
    Ok(())
}

/// Why an entry was not read.
enum Skip {
    /// It is gone (deleted or renamed while scanning): not an error.
    Gone,
    /// It is not something the store wrote (not a regular file, too big, not UTF-8).
    Rejected(String),
    /// It could not be read now (e.g. out of file descriptors): keep its last value.
    Failed(std::io::Error),
}

/// Read one entry, trusting nothing about it: no symlink is followed, nothing blocks (a
/// FIFO opens without a writer and is then rejected), only a regular file of at most
/// [`MAX_ENTRY_BYTES`] is read.
fn read_entry(path: &Path) -> std::result::Result<String, Skip> {
    let file = fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => Skip::Gone,
            // ELOOP: the name is a symlink (O_NOFOLLOW); ENXIO: a FIFO/socket with no peer.
            _ if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => {
                Skip::Rejected(format!("not a regular file ({e})"))
            }
            _ => Skip::Failed(e),
        })?;
    let meta = file.metadata().map_err(Skip::Failed)?;
    if !meta.file_type().is_file() {
        return Err(Skip::Rejected("not a regular file".to_owned()));
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(Skip::Rejected(format!(
            "{} bytes, over the {MAX_ENTRY_BYTES}-byte limit",
            meta.len()
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // `take` bounds the read even if the file grows after the size check.
    file.take(MAX_ENTRY_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(Skip::Failed)?;
    if buf.len() as u64 > MAX_ENTRY_BYTES {
        return Err(Skip::Rejected(
            "grew over the size limit while read".to_owned(),
        ));
    }
    String::from_utf8(buf).map_err(|_| Skip::Rejected("not UTF-8".to_owned()))
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

/// An inotify watch on the store's directory, for the watch thread to sleep on.
struct DirWatch {
    fd: rustix::fd::OwnedFd,
    root: PathBuf,
}

impl DirWatch {
    /// Entries appear by rename into the directory and go by unlink (or by rename away);
    /// `MODIFY` catches a value written in place by hand. Lease refreshes open the file for
    /// writing and set both its times: `CLOSE_WRITE` and `ATTRIB`, neither watched.
    const EVENTS: WatchFlags = WatchFlags::MOVED_TO
        .union(WatchFlags::MOVED_FROM)
        .union(WatchFlags::DELETE)
        .union(WatchFlags::MODIFY)
        .union(WatchFlags::DELETE_SELF)
        .union(WatchFlags::MOVE_SELF);

    fn new(root: &Path) -> std::io::Result<Self> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        inotify::add_watch(&fd, root, Self::EVENTS)?;
        Ok(Self {
            fd,
            root: root.to_owned(),
        })
    }

    /// Wait up to `timeout` for a change to the directory's entries; returns whether one
    /// came (every queued event is consumed). Events about this store's own temporary
    /// files (`.tmp-*`, ignored by scans) do not count.
    fn wait(&self, timeout: Duration) -> bool {
        let timeout =
            rustix::event::Timespec::try_from(timeout).unwrap_or(rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            });
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => return false,
            Ok(_) => {}
            // Interrupted, or a failure that should not happen with one valid fd: report
            // a change, so the caller scans rather than missing one.
            Err(_) => return true,
        }
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut events = inotify::Reader::new(&self.fd, &mut buf);
        let mut changed = false;
        loop {
            match events.next() {
                Ok(ev) => {
                    let ours = ev
                        .file_name()
                        .is_some_and(|n| n.to_bytes().starts_with(b"."));
                    changed |= !ours || ev.events().contains(ReadFlags::QUEUE_OVERFLOW);
                    if ev.events().contains(ReadFlags::IGNORED) {
                        // The directory went (or moved): watch whatever is at the root
                        // now; until one is there, the full scans carry on alone.
                        let _ = inotify::add_watch(&self.fd, &self.root, Self::EVENTS);
                    }
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return changed,
                Err(_) => return true,
            }
        }
    }
}

impl State {
    /// The watch thread: sleeps on `watch` (else polls the directory's mtime), scans,
    /// refreshes leases, until the store stops.
    fn run(self: Arc<Self>, watch: Option<DirWatch>) {
        // Refresh well inside the TTL so a short scheduling stall does not expire a lease.
        let refresh_every = (self.ttl / 3).max(POLL_INTERVAL);
        let mut last_refresh = std::time::Instant::now();
        let mut last_scan = std::time::Instant::now();
        let dir_mtime = || fs::metadata(&self.root).and_then(|m| m.modified()).ok();
        let mut seen_mtime = dir_mtime();
        while !self.stop.load(Ordering::Acquire) {
            let changed = match &watch {
                Some(w) => {
                    let changed = w.wait(POLL_INTERVAL.saturating_sub(last_scan.elapsed()));
                    // At most one scan per `MIN_SCAN_GAP`: a process that writes a stream
                    // of entries into the directory would otherwise keep this thread
                    // scanning back to back (the mtime poll allowed one per `FAST_POLL`).
                    // Events that come meanwhile wait in the queue for the next round.
                    let since = last_scan.elapsed();
                    if changed && since < MIN_SCAN_GAP {
                        std::thread::sleep(MIN_SCAN_GAP - since);
                    }
                    changed
                }
                None => {
                    std::thread::sleep(FAST_POLL);
                    dir_mtime() != seen_mtime
                }
            };
            if !changed && last_scan.elapsed() < POLL_INTERVAL {
                continue;
            }
            if last_refresh.elapsed() >= refresh_every {
                self.refresh();
                last_refresh = std::time::Instant::now();
            }
            // Read the mtime before scanning: a change during the scan then triggers
            // another one (with inotify, its event is still queued).
            if watch.is_none() {
                seen_mtime = dir_mtime();
            }
            last_scan = std::time::Instant::now();
            self.scan_and_publish();
        }
    }

    /// Scan, and bump the change counter when the live set differs from the previous scan
    /// (by this thread or by a watcher's `list`): every scan updates the baseline, so a
    /// change seen first by a `list` is not missed by the next poll. A scan that fails
    /// leaves the last known state in place (and answers it).
    fn scan_and_publish(&self) -> BTreeMap<String, String> {
        let live = match self.scan() {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(root = %self.root.display(), error = %e, "file store: cannot scan the directory; keeping the last known entries");
                return lock(&self.last_scan).clone();
            }
        };
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
            // Not following a symlink nor blocking on a FIFO someone put in its place; a
            // non-regular file is replaced by a rewrite.
            let touched = fs::File::options()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&path)
                .and_then(|f| {
                    if f.metadata()?.file_type().is_file() {
                        // Both times: setting the mtime alone is an inotify `MODIFY`, which
                        // watchers take for a value written in place (see `DirWatch`); both
                        // at once is an `ATTRIB`.
                        f.set_times(fs::FileTimes::new().set_accessed(now).set_modified(now))
                    } else {
                        Err(std::io::Error::from(ErrorKind::NotFound))
                    }
                })
                .map_err(|e| {
                    if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) {
                        std::io::Error::from(ErrorKind::NotFound)
                    } else {
                        e
                    }
                });
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

    /// The live entries; deletes expired ones that this process does not own. An entry
    /// that cannot be read for now keeps its last known value; the whole scan fails when
    /// the directory cannot be listed.
    fn scan(&self) -> std::io::Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        let dir = fs::read_dir(&self.root)?;
        let owned = lock(&self.owned).clone();
        let last = lock(&self.last_scan).clone();
        let now = SystemTime::now();
        for entry in dir {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let Some(key) = decode(name) else { continue };
            let path = entry.path();
            if !owned.contains_key(&key) {
                // `DirEntry::metadata` is an lstat: a symlink's own age, never its target's.
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
            match read_entry(&path) {
                Ok(value) => {
                    out.insert(key, value);
                }
                Err(Skip::Gone) => {}
                Err(Skip::Rejected(why)) => {
                    if lock(&self.warned).insert(name.to_owned()) {
                        tracing::warn!(entry = %path.display(), reason = %why, "file store: ignoring entry");
                    }
                }
                Err(Skip::Failed(e)) => {
                    if let Some(v) = last.get(&key) {
                        out.insert(key, v.clone());
                    }
                    tracing::warn!(entry = %path.display(), error = %e, "file store: cannot read entry; keeping its last value");
                }
            }
        }
        Ok(out)
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
        // Directory I/O runs on the blocking pool: whatever the directory holds, it never
        // stalls the async worker threads.
        let state = Arc::clone(&self.state);
        let prefix = prefix.to_owned();
        Box::pin(async move {
            let all = match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle
                    .spawn_blocking(move || state.scan_and_publish())
                    .await
                    .map_err(|e| Error::Discovery(format!("file store scan failed: {e}")))?,
                // Polled outside tokio (no async worker threads to protect): scan here.
                Err(_) => state.scan_and_publish(),
            };
            Ok(all
                .into_iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .collect())
        })
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
    use crate::discovery::{Discovery, Instance, KvDiscovery, TransportAddress};
    use crate::names::EndpointId;

    #[tokio::test]
    async fn dir_watch_reports_entries_not_temporary_files_or_lease_refreshes() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path(), DEFAULT_TTL).unwrap();
        let w = DirWatch::new(dir.path()).unwrap();
        fs::write(dir.path().join(".tmp-0123456789abcdef"), "v").unwrap();
        assert!(!w.wait(Duration::ZERO), "a temporary file is not an entry");
        store.put("v1/a", "one").await.unwrap();
        assert!(w.wait(Duration::ZERO), "a put renames a new entry in");
        store.state.refresh();
        assert!(!w.wait(Duration::ZERO), "a lease refresh changes no entry");
        let entry = dir.path().join(encode("v1/a"));
        fs::write(&entry, "edited in place").unwrap();
        assert!(w.wait(Duration::ZERO), "a value written in place");
        store.delete("v1/a").await.unwrap();
        assert!(w.wait(Duration::ZERO), "a delete");
        assert!(!w.wait(Duration::from_millis(5)), "nothing since");
        store.shutdown().await;
    }

    #[test]
    fn dir_watch_follows_a_root_that_is_replaced() {
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("kv");
        fs::create_dir(&root).unwrap();
        let w = DirWatch::new(&root).unwrap();
        fs::remove_dir(&root).unwrap();
        fs::create_dir(&root).unwrap();
        assert!(w.wait(Duration::ZERO), "the directory itself went");
        fs::write(root.join(encode("v1/b")), "v").unwrap();
        assert!(w.wait(Duration::ZERO), "an entry in the new directory");
    }

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

    /// A FIFO, a symlink to `/dev/zero`, a 3 GiB sparse file and a symlink to a real
    /// value are all ignored, promptly: the scan neither blocks (FIFO) nor reads them
    /// whole (the process would run out of memory), and the good entry stays visible.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_entries_are_skipped_without_blocking_or_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path(), Duration::from_secs(60)).unwrap();
        store.put("v1/good", "ok").await.unwrap();
        let fifo = dir.path().join(encode("v1/fifo"));
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        std::os::unix::fs::symlink("/dev/zero", dir.path().join(encode("v1/zero"))).unwrap();
        let big = fs::File::create(dir.path().join(encode("v1/big"))).unwrap();
        big.set_len(3 << 30).unwrap();
        let real = dir.path().join("real-value");
        fs::write(&real, "secret").unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join(encode("v1/link"))).unwrap();
        let started = std::time::Instant::now();
        let listed = tokio::time::timeout(Duration::from_secs(5), store.list("v1/"))
            .await
            .expect("list must not hang on a FIFO")
            .unwrap();
        assert_eq!(listed, vec![("v1/good".to_owned(), "ok".to_owned())]);
        assert!(started.elapsed() < Duration::from_secs(2));
        // The background poller keeps running over them too.
        tokio::time::sleep(POLL_INTERVAL * 3).await;
        assert_eq!(store.list("v1/").await.unwrap().len(), 1);
        store.shutdown().await;
    }

    /// A scan that fails (here: the directory cannot be listed) keeps the last known
    /// entries instead of reporting every key gone.
    #[tokio::test]
    async fn failed_scan_keeps_the_last_known_state() {
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("kv");
        let store = FileStore::open(&root, Duration::from_secs(60)).unwrap();
        store.put("v1/a", "one").await.unwrap();
        let before = store.list("v1/").await.unwrap();
        assert_eq!(before.len(), 1);
        let moved = parent.path().join("moved");
        fs::rename(&root, &moved).unwrap();
        // The directory is gone: `read_dir` fails, the last state stands.
        assert_eq!(store.list("v1/").await.unwrap(), before);
        // Per-entry read failures other than "gone" keep that entry's last value too.
        let state = &store.state;
        assert!(matches!(read_entry(&moved.join("absent")), Err(Skip::Gone)));
        fs::rename(&moved, &root).unwrap();
        assert_eq!(state.scan().unwrap(), before.into_iter().collect());
        store.shutdown().await;
    }

    #[test]
    fn default_directory_must_be_private() {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert!(check_private(dir.path()).is_ok());
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        let err = check_private(dir.path()).unwrap_err().to_string();
        assert!(err.contains("writable by other users"), "{err}");
        let file = dir.path().join("f");
        fs::write(&file, "").unwrap();
        assert!(check_private(&file).is_err());
        let root = private_file_kv_root();
        let name = root.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("dynamo_store_kv"), "{name}");
        assert_ne!(root, std::env::temp_dir().join("dynamo_store_kv"));
    }

    // Discovery over file stores is tested here rather than in `discovery/mod.rs`: the
    // parent does not import its `file` child, which imports the parent's `KvStore`.

    fn instance(ep: &EndpointId, id: u64) -> Instance {
        Instance::new(
            ep,
            id,
            TransportAddress::Tcp(format!("127.0.0.1:1/{}", ep.path())),
        )
    }

    async fn until(rx: &mut watch::Receiver<Arc<Vec<Instance>>>, ids: &[u64]) {
        let deadline = Duration::from_millis(700); // well under the 1 s safety-net re-list
        tokio::time::timeout(deadline, async {
            loop {
                let now: Vec<u64> = rx.borrow().iter().map(|i| i.instance_id).collect();
                if now == ids {
                    return;
                }
                rx.changed().await.unwrap();
            }
        })
        .await
        .unwrap_or_else(|_| panic!("watch did not reach {ids:?}"));
    }

    #[tokio::test]
    async fn file_watchers_see_joins_and_quick_leaves_across_stores() {
        file_watchers_see_joins_and_quick_leaves(|p, t| FileStore::open(p, t)).await;
    }

    /// The same where the watch threads poll the directory's mtime (no inotify instance).
    #[tokio::test]
    async fn polling_file_watchers_see_joins_and_quick_leaves_across_stores() {
        file_watchers_see_joins_and_quick_leaves(|p, t| FileStore::open_polling(p, t)).await;
    }

    async fn file_watchers_see_joins_and_quick_leaves(
        open: fn(&std::path::Path, Duration) -> crate::error::Result<FileStore>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(10);
        let a = KvDiscovery::new(Arc::new(open(dir.path(), ttl).unwrap()), 1);
        let ep = EndpointId::parse("ns.comp.ep").unwrap();
        for _ in 0..3 {
            // A fresh store whose poller has not scanned yet: its watcher's first list sees
            // the entry, and the removal right after must still be noticed.
            let b = KvDiscovery::new(Arc::new(open(dir.path(), ttl).unwrap()), 2);
            a.register(&instance(&ep, 1)).await.unwrap();
            let mut rx = b.watch(&ep);
            until(&mut rx, &[1]).await;
            a.unregister(&instance(&ep, 1)).await.unwrap();
            until(&mut rx, &[]).await;
            b.shutdown().await;
        }
        let b = KvDiscovery::new(Arc::new(open(dir.path(), ttl).unwrap()), 2);
        let mut rx = b.watch(&ep);
        b.register(&instance(&ep, 2)).await.unwrap();
        a.register(&instance(&ep, 1)).await.unwrap();
        until(&mut rx, &[1, 2]).await;
        assert_eq!(b.list(&ep).await.unwrap().len(), 2);
        a.shutdown().await;
        until(&mut rx, &[2]).await;
    }
}
