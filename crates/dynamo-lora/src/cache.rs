//! The on-disk LoRA cache: one directory per adapter under the cache root.
//!
//! Layout (`root` is `cache_path`, else `$DYN_LORA_PATH`, else
//! `$HOME/.cache/dynamo_loras`):
//!
//! ```text
//! root/
//!   s3__bucket_adapters_my-lora/         a complete adapter (the cache key of its URI)
//!     adapter_config.json
//!     adapter_model.safetensors
//!     .dynamo-lora-source                the URI it was downloaded from
//!   .partial.s3__bucket_x.<pid>.<n>/     a download in progress (or left by a crash)
//!   .lock.s3__bucket_x                   the pid of the process downloading that key
//! ```
//!
//! Invariant: a directory named by a cache key is only ever created by one `rename(2)` of
//! a fully downloaded and validated partial directory, so a crash at any point leaves
//! either no entry or a complete one. Partial directories start with `.` and contain `.`,
//! which no cache key does ([`uri_to_cache_key`] maps `.` to `_`), so they can never be
//! mistaken for an entry; the next download of the same key removes those whose process
//! is gone.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::{LoraError, Result};

/// Environment variable naming the cache root (the reference's name).
pub const CACHE_DIR_ENV: &str = "DYN_LORA_PATH";

/// The adapter's configuration file (PEFT's name).
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// Weight files, any one of which makes a directory an adapter: PEFT safetensors, PEFT
/// pickles, TensorRT-LLM's converted weights (the same list as the reference).
pub const ADAPTER_WEIGHTS: [&str; 3] = [
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.lora_weights.npy",
];

/// Written into each downloaded entry: the URI it came from, so that two URIs that map to
/// the same cache key (the key format is lossy: `a/b`, `a.b` and `a_b` all become `a_b`)
/// are detected instead of silently serving the wrong adapter.
pub const SOURCE_MARKER: &str = ".dynamo-lora-source";

const PARTIAL_PREFIX: &str = ".partial.";
const LOCK_PREFIX: &str = ".lock.";

/// The cache key of a LoRA URI, in the reference's format: `://` becomes `__`, then every
/// `/`, `\` and `.` becomes `_` (`s3://bucket/a/b` -> `s3__bucket_a_b`). The result never
/// contains a path separator or a dot, so it is always one path component under the root.
pub fn uri_to_cache_key(uri: &str) -> String {
    uri.replace("://", "__")
        .chars()
        .map(|c| {
            if matches!(c, '/' | '\\' | '.') {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// Whether `dir` holds an adapter: a regular `adapter_config.json` and one of
/// [`ADAPTER_WEIGHTS`] (symlinks to regular files count, as HF snapshot directories are
/// made of them).
///
/// # Errors
/// [`LoraError::Validation`] when the directory or one of the files cannot be inspected
/// for a reason other than not existing (e.g. permission denied).
pub fn is_adapter_dir(dir: &Path) -> Result<bool> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(validation(dir, &e)),
    }
    if !is_file(&dir.join(ADAPTER_CONFIG))? {
        return Ok(false);
    }
    for w in ADAPTER_WEIGHTS {
        if is_file(&dir.join(w))? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn is_file(p: &Path) -> Result<bool> {
    match std::fs::metadata(p) {
        Ok(m) => Ok(m.is_file()),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(false),
        Err(e) => Err(validation(p, &e)),
    }
}

fn validation(p: &Path, e: &std::io::Error) -> LoraError {
    LoraError::Validation(format!("cannot inspect {}: {e}", p.display()))
}

/// The cache root and the operations on its entries.
#[derive(Debug, Clone)]
pub struct LoraCache {
    root: PathBuf,
}

impl LoraCache {
    /// A cache rooted at `root` (created on the first download, not here).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root from the environment: `$DYN_LORA_PATH`, else `$HOME/.cache/dynamo_loras`
    /// (`%USERPROFILE%` on Windows).
    ///
    /// # Errors
    /// [`LoraError::CacheDir`] when neither is set.
    pub fn from_env() -> Result<Self> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        if let Some(p) = var(CACHE_DIR_ENV) {
            return Ok(Self::new(p));
        }
        let home = var("HOME").or_else(|| var("USERPROFILE")).ok_or_else(|| {
            LoraError::CacheDir(format!(
                "no LoRA cache directory: set {CACHE_DIR_ENV} (or HOME) or pass cache_path"
            ))
        })?;
        Ok(Self::new(
            PathBuf::from(home).join(".cache").join("dynamo_loras"),
        ))
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of the entry `cache_key`.
    ///
    /// # Errors
    /// [`LoraError::InvalidCacheKey`] for a key that is not a single plain path component
    /// (empty, `.`, `..`, or containing `/`, `\` or NUL), which would name a path outside
    /// the cache.
    pub fn entry_path(&self, cache_key: &str) -> Result<PathBuf> {
        if cache_key.is_empty()
            || cache_key == "."
            || cache_key == ".."
            || cache_key.contains(['/', '\\', '\0'])
        {
            return Err(LoraError::InvalidCacheKey(cache_key.to_owned()));
        }
        Ok(self.root.join(cache_key))
    }

    /// Whether the entry `cache_key` holds a complete adapter.
    ///
    /// # Errors
    /// As [`Self::entry_path`] and [`is_adapter_dir`].
    pub fn validate(&self, cache_key: &str) -> Result<bool> {
        is_adapter_dir(&self.entry_path(cache_key)?)
    }

    /// The URI recorded in the entry `cache_key`, if it has a marker.
    pub fn source_of(&self, cache_key: &str) -> Option<String> {
        let p = self.entry_path(cache_key).ok()?.join(SOURCE_MARKER);
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim_end().to_owned())
    }

    /// A fresh, empty partial directory for a download of `cache_key` (creating the root
    /// if needed), after removing partial directories of the same key whose process is
    /// gone.
    ///
    /// # Errors
    /// [`LoraError::CacheDir`] when the root or the directory cannot be created.
    pub fn new_partial(&self, cache_key: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.root).map_err(|e| {
            LoraError::CacheDir(format!("cannot create {}: {e}", self.root.display()))
        })?;
        self.remove_stale_partials(cache_key);
        let pid = std::process::id();
        for _ in 0..16 {
            let p = self.root.join(format!(
                "{PARTIAL_PREFIX}{cache_key}.{pid}.{}",
                fastrand::u64(..)
            ));
            match std::fs::create_dir(&p) {
                Ok(()) => return Ok(p),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(LoraError::CacheDir(format!(
                        "cannot create {}: {e}",
                        p.display()
                    )));
                }
            }
        }
        Err(LoraError::CacheDir(format!(
            "cannot create a partial directory in {}",
            self.root.display()
        )))
    }

    /// Take the cross-process download lock of `cache_key`: the file `.lock.<key>` in the
    /// root, created exclusively and holding the owner's pid. `None` while a live process
    /// holds it; a lock left by a process that no longer runs is taken over.
    ///
    /// # Errors
    /// [`LoraError::CacheDir`] when the root or the lock file cannot be created.
    pub fn try_lock(&self, cache_key: &str) -> Result<Option<KeyLock>> {
        std::fs::create_dir_all(&self.root).map_err(|e| {
            LoraError::CacheDir(format!("cannot create {}: {e}", self.root.display()))
        })?;
        let path = self.root.join(format!("{LOCK_PREFIX}{cache_key}"));
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    use std::io::Write as _;
                    // Written after creation: a reader that sees an empty file treats the
                    // lock as held (its owner is alive: it is still writing).
                    let _ = write!(f, "{}", std::process::id());
                    return Ok(Some(KeyLock { path }));
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let owner = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match owner {
                        Some(pid) if pid != std::process::id() && !process_alive(pid) => {
                            tracing::warn!(path = %path.display(), pid, "taking over the LoRA download lock of a dead process");
                            let _ = std::fs::remove_file(&path);
                        }
                        _ => return Ok(None),
                    }
                }
                Err(e) => {
                    return Err(LoraError::CacheDir(format!(
                        "cannot create {}: {e}",
                        path.display()
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Best effort: partial directories of `cache_key` left by processes that no longer
    /// run (crashes). Others' live downloads are left alone.
    fn remove_stale_partials(&self, cache_key: &str) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let prefix = format!("{PARTIAL_PREFIX}{cache_key}.");
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid != std::process::id() && !process_alive(pid) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    /// Move the complete download in `partial` into place as the entry `cache_key`
    /// (one `rename`, so the entry appears whole or not at all) and return the entry's path.
    /// When another process installed the same key meanwhile, its valid entry wins and
    /// `partial` is discarded; an invalid entry in the way (e.g. one emptied by hand) is
    /// moved aside first.
    ///
    /// # Errors
    /// [`LoraError::Validation`] when `partial` is not an adapter; [`LoraError::CacheDir`]
    /// when the rename fails.
    pub fn install(&self, partial: &Path, cache_key: &str) -> Result<PathBuf> {
        let dest = self.entry_path(cache_key)?;
        if !is_adapter_dir(partial)? {
            return Err(LoraError::Validation(format!(
                "the download holds no {ADAPTER_CONFIG} plus adapter weights ({})",
                ADAPTER_WEIGHTS.join(", ")
            )));
        }
        for _ in 0..3 {
            match std::fs::rename(partial, &dest) {
                Ok(()) => return Ok(dest),
                Err(e) if dest.exists() => {
                    if is_adapter_dir(&dest)? {
                        let _ = std::fs::remove_dir_all(partial);
                        return Ok(dest);
                    }
                    // An incomplete entry not made by us: move it aside (atomic too), then
                    // retry. `e` is the expected "directory not empty".
                    tracing::warn!(path = %dest.display(), error = %e, "replacing an invalid LoRA cache entry");
                    let aside = self.root.join(format!(
                        "{PARTIAL_PREFIX}{cache_key}.{}.{}",
                        std::process::id(),
                        fastrand::u64(..)
                    ));
                    std::fs::rename(&dest, &aside).map_err(|e| rename_err(&dest, &aside, &e))?;
                    let _ = std::fs::remove_dir_all(&aside);
                }
                Err(e) => return Err(rename_err(partial, &dest, &e)),
            }
        }
        Err(LoraError::CacheDir(format!(
            "{} keeps changing under us",
            dest.display()
        )))
    }
}

/// A held download lock ([`LoraCache::try_lock`]); dropping it releases the lock.
#[derive(Debug)]
pub struct KeyLock {
    path: PathBuf,
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn rename_err(from: &Path, to: &Path, e: &std::io::Error) -> LoraError {
    LoraError::CacheDir(format!(
        "cannot rename {} to {}: {e}",
        from.display(),
        to.display()
    ))
}

/// Whether process `pid` exists (Linux: `/proc/<pid>`; elsewhere assume it does, so that
/// nothing live is ever removed).
fn process_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}
