//! LoRA adapters: resolving an adapter URI to a local directory, downloading and caching.
//!
//! [`LoraDownloader::download_if_needed`] takes
//! - `file:///path/to/adapter`: returned as is once it is checked to hold an adapter
//!   (`adapter_config.json` plus weights, see [`cache::is_adapter_dir`]);
//! - `s3://bucket/prefix`: every object under the prefix is downloaded into a partial
//!   directory in the cache root, validated, and renamed into place as the entry
//!   [`uri_to_cache_key`]`(uri)` (see [`cache`] for the layout and the crash invariant).
//!   An entry already in the cache is returned without contacting the server.
//!
//! Concurrency: calls for the same URI in one process are single-flight (the second
//! waits for the first and then finds the entry). Across processes a lock file per key
//! (`.lock.<key>`, holding the owner's pid; taken over when that process is gone) makes
//! the others wait and then use the entry. Even without it (a holder wedged past the wait
//! limit) the atomic rename makes the first complete copy win and the others discard
//! theirs, so the cache is never torn.
//!
//! ```
//! use dynamo_lora::uri_to_cache_key;
//! assert_eq!(uri_to_cache_key("s3://bucket/adapters/my.lora"), "s3__bucket_adapters_my_lora");
//! ```

pub mod cache;
pub mod s3;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use cache::{LoraCache, uri_to_cache_key};

/// Result alias of the LoRA module.
pub type Result<T, E = LoraError> = std::result::Result<T, E>;

/// What can go wrong resolving or caching an adapter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoraError {
    /// The URI's scheme is not supported, or the URI is malformed.
    #[error("unsupported LoRA URI: {0}")]
    InvalidUri(String),
    /// A cache key that would name a path outside the cache root.
    #[error("invalid LoRA cache key {0:?}: must be one path component (see uri_to_cache_key)")]
    InvalidCacheKey(String),
    /// No usable cache directory.
    #[error("LoRA cache: {0}")]
    CacheDir(String),
    /// A cache entry or adapter directory could not be checked.
    #[error("invalid LoRA cache: {0}")]
    Validation(String),
    /// Fetching the adapter failed; the message names the URI and the cause.
    #[error("{0}")]
    Download(String),
}

/// Resolves adapter URIs to local directories through a [`LoraCache`].
#[derive(Debug)]
pub struct LoraDownloader {
    cache: LoraCache,
    /// One lock per URI being downloaded: concurrent calls for the same URI queue on it.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl LoraDownloader {
    /// A downloader caching under `cache_path`, or the root from the environment
    /// ([`LoraCache::from_env`]).
    ///
    /// # Errors
    /// [`LoraError::CacheDir`] without a path and without a usable environment.
    pub fn new(cache_path: Option<PathBuf>) -> Result<Self> {
        let cache = match cache_path {
            Some(p) => LoraCache::new(p),
            None => LoraCache::from_env()?,
        };
        Ok(Self {
            cache,
            inflight: Mutex::new(HashMap::new()),
        })
    }

    /// The cache.
    pub fn cache(&self) -> &LoraCache {
        &self.cache
    }

    /// Whether `uri_or_key` is cached: a `file://` URI that holds an adapter, another URI
    /// whose cache entry is complete, or (without `://`) a cache key whose entry is
    /// complete. Never an error: anything unreadable is "not cached".
    pub fn is_cached(&self, uri_or_key: &str) -> bool {
        if let Some(path) = uri_or_key.strip_prefix("file://") {
            return cache::is_adapter_dir(std::path::Path::new(path)).unwrap_or(false);
        }
        let key = if uri_or_key.contains("://") {
            uri_to_cache_key(uri_or_key)
        } else {
            uri_or_key.to_owned()
        };
        self.cache.validate(&key).unwrap_or(false)
    }

    /// The local directory of the adapter at `uri`, downloading it first when needed.
    ///
    /// # Errors
    /// [`LoraError::InvalidUri`] for a scheme other than `file://` and `s3://` (or a
    /// malformed `s3://` URI); [`LoraError::Download`] (message naming the URI and the
    /// cause) for everything else.
    pub async fn download_if_needed(&self, uri: &str) -> Result<PathBuf> {
        if let Some(path) = uri.strip_prefix("file://") {
            let path = PathBuf::from(path);
            return match cache::is_adapter_dir(&path) {
                Ok(true) => Ok(path),
                Ok(false) if !path.exists() => {
                    Err(LoraError::Download(format!("Local LoRA not found: {uri}")))
                }
                Ok(false) => Err(LoraError::Download(format!(
                    "{uri} is not a valid LoRA: expected {} and adapter weights ({})",
                    cache::ADAPTER_CONFIG,
                    cache::ADAPTER_WEIGHTS.join(", ")
                ))),
                Err(e) => Err(LoraError::Download(format!("{uri}: {e}"))),
            };
        }
        if uri.starts_with("s3://") {
            let parsed = s3::S3Uri::parse(uri)?;
            return self
                .cached_or(uri, |partial| async move {
                    s3::download_prefix(&parsed, &partial).await.map(|_| ())
                })
                .await;
        }
        let scheme = uri.split_once("://").map_or("", |(s, _)| s);
        Err(LoraError::InvalidUri(if scheme.is_empty() {
            format!("{uri:?} has no scheme; expected file:// or s3://")
        } else {
            format!("{uri:?}: scheme {scheme}:// is not supported; expected file:// or s3://")
        }))
    }

    /// The entry of `uri` from the cache, or after `fetch` filled a partial directory
    /// (single-flight per URI in this process).
    async fn cached_or<F, Fut>(&self, uri: &str, fetch: F) -> Result<PathBuf>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let key = uri_to_cache_key(uri);
        let lock = Arc::clone(
            self.inflight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(uri.to_owned())
                .or_default(),
        );
        let result = {
            let _guard = lock.lock().await;
            self.fill(uri, &key, fetch).await
        };
        drop(lock);
        // Forget the lock once nobody else holds or waits on it.
        let mut map = self
            .inflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.get(uri).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(uri);
        }
        result
    }

    async fn fill<F, Fut>(&self, uri: &str, key: &str, fetch: F) -> Result<PathBuf>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let failed = |e: LoraError| LoraError::Download(format!("{uri}: {e}"));
        if self.cache.validate(key).map_err(failed)? {
            return self.hit(uri, key);
        }
        // Across processes: wait while another live process downloads this key, then
        // use its entry (or download ourselves if it failed). Past the wait limit we
        // download anyway; the atomic install keeps the cache whole either way.
        let started = tokio::time::Instant::now();
        let _lock = loop {
            if let Some(lock) = self.cache.try_lock(key).map_err(failed)? {
                break Some(lock);
            }
            if started.elapsed() >= CROSS_PROCESS_WAIT {
                tracing::warn!(%uri, "another process holds the LoRA download lock too long; downloading anyway");
                break None;
            }
            tokio::time::sleep(LOCK_POLL).await;
            if self.cache.validate(key).map_err(failed)? {
                return self.hit(uri, key);
            }
        };
        // The previous holder may have finished between our check and our lock.
        if self.cache.validate(key).map_err(failed)? {
            return self.hit(uri, key);
        }
        tracing::info!(%uri, "downloading LoRA");
        let partial = PartialDir(self.cache.new_partial(key).map_err(failed)?);
        async {
            fetch(partial.0.clone()).await?;
            std::fs::write(partial.0.join(cache::SOURCE_MARKER), format!("{uri}\n")).map_err(
                |e| LoraError::CacheDir(format!("writing {}: {e}", cache::SOURCE_MARKER)),
            )?;
            self.cache.install(&partial.0, key)
        }
        .await
        .map_err(failed)
    }
}

impl LoraDownloader {
    /// The complete entry `key`, unless it was downloaded from another URI.
    fn hit(&self, uri: &str, key: &str) -> Result<PathBuf> {
        match self.cache.source_of(key) {
            Some(src) if src != uri => Err(LoraError::Download(format!(
                "{uri}: cache entry {key} holds {src} (the two URIs share a cache key)"
            ))),
            _ => {
                tracing::debug!(%uri, "LoRA found in cache");
                self.cache.entry_path(key)
            }
        }
    }
}

/// How long a download waits for another process downloading the same key: long enough
/// for a multi-gigabyte adapter on a slow link, short enough that a wedged (but live)
/// holder cannot block a worker forever.
const CROSS_PROCESS_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// How often a waiting download re-checks the lock and the entry.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Removes a partial download directory when the download fails or is cancelled (the
/// future dropped mid-way); after a successful install the path no longer exists.
struct PartialDir(PathBuf);

impl Drop for PartialDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests;
