//! Downloading an adapter from S3 (or any S3 API server) into a partial cache directory.
//!
//! Configuration comes from the standard AWS environment variables, read when a download
//! starts (so a worker picks up rotated credentials): `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` / `AWS_DEFAULT_REGION`,
//! `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` (a custom endpoint implies path-style
//! requests; an `http://` one allows plain HTTP), plus the rest of what
//! `object_store`'s `AmazonS3Builder::from_env` reads (web identity, container
//! credentials, `AWS_SKIP_SIGNATURE`, ...).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use tokio::io::AsyncWriteExt;

use super::{LoraError, Result};

/// A stalled transfer (no bytes for this long) fails instead of hanging the worker. Long
/// enough for a slow link to deliver one chunk; there is deliberately no limit on the
/// whole transfer, as adapters range from megabytes to gigabytes.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// TCP connect limit: a dead endpoint fails in seconds, not minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Retries per request (object_store retries 5xx, connection errors and broken bodies,
/// resuming with a range request); a few, so that a dead server fails within seconds.
const MAX_RETRIES: usize = 3;

/// Objects fetched at once: adapters are a handful of files, so this mostly overlaps the
/// config with the weights.
const PARALLEL_FILES: usize = 4;

/// `s3://bucket/prefix` split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Uri {
    /// The bucket.
    pub bucket: String,
    /// The key prefix, without leading or trailing `/` (may be empty: the whole bucket).
    pub prefix: String,
}

impl S3Uri {
    /// Parse `s3://bucket[/prefix]`.
    ///
    /// # Errors
    /// [`LoraError::InvalidUri`] without a bucket or with a malformed prefix (empty or
    /// `.`/`..` segments).
    pub fn parse(uri: &str) -> Result<Self> {
        let rest = uri
            .strip_prefix("s3://")
            .ok_or_else(|| LoraError::InvalidUri(format!("{uri:?} is not an s3:// URI")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(LoraError::InvalidUri(format!("{uri:?} names no bucket")));
        }
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            ObjectPath::parse(prefix)
                .map_err(|e| LoraError::InvalidUri(format!("{uri:?}: bad key prefix: {e}")))?;
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn store_for(bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    // The service-specific variable wins, as in the AWS SDKs.
    let endpoint = env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL"));
    let allow_http = endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"))
        || env("AWS_ALLOW_HTTP").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if let Some(e) = endpoint {
        b = b.with_endpoint(e);
    }
    if let Some(r) = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")) {
        b = b.with_region(r);
    }
    b.with_client_options(
        ClientOptions::new()
            .with_allow_http(allow_http)
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout_disabled(),
    )
    .with_retry(RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: MAX_RETRIES,
        retry_timeout: Duration::from_secs(30),
    })
    .build()
    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
    .map_err(|e| LoraError::Download(e.to_string()))
}

/// Download every object under `uri`'s prefix into `dest` (an empty directory), keeping
/// the key layout below the prefix. Returns the number of files written.
///
/// # Errors
/// [`LoraError::Download`] naming the cause: the store's error (credentials, missing
/// bucket, HTTP status), an empty prefix, a truncated or stalled transfer, or a local
/// write failure.
pub async fn download_prefix(uri: &S3Uri, dest: &Path) -> Result<usize> {
    let store = store_for(&uri.bucket)?;
    let prefix = (!uri.prefix.is_empty()).then(|| ObjectPath::from(uri.prefix.as_str()));
    let mut objects = Vec::new();
    let mut listing = store.list(prefix.as_ref());
    while let Some(meta) = idle(listing.next(), "listing").await? {
        let meta = meta.map_err(|e| LoraError::Download(e.to_string()))?;
        let rel = relative_path(&meta.location, prefix.as_ref())?;
        objects.push((meta.location, meta.size, rel));
    }
    if objects.is_empty() {
        return Err(LoraError::Download(format!(
            "no objects under s3://{}/{}",
            uri.bucket, uri.prefix
        )));
    }
    let count = objects.len();
    let mut fetches = futures_util::stream::iter(objects.into_iter().map(|(loc, size, rel)| {
        let store = Arc::clone(&store);
        let target = dest.join(rel);
        async move { fetch_object(store.as_ref(), &loc, size, &target).await }
    }))
    .buffer_unordered(PARALLEL_FILES);
    while let Some(r) = fetches.next().await {
        r?;
    }
    Ok(count)
}

/// The object's path below the prefix as a relative local path (object_store's paths
/// never hold empty, `.` or `..` segments, so this cannot leave `dest`).
fn relative_path(location: &ObjectPath, prefix: Option<&ObjectPath>) -> Result<PathBuf> {
    let parts: Vec<String> = match prefix {
        Some(p) => location
            .prefix_match(p)
            .ok_or_else(|| LoraError::Download(format!("listed {location} outside {p}")))?
            .map(|part| part.as_ref().to_owned())
            .collect(),
        None => location.parts().map(|p| p.as_ref().to_owned()).collect(),
    };
    if parts.is_empty() || parts.iter().any(|p| p.contains('\\')) {
        return Err(LoraError::Download(format!(
            "object key {location} cannot be stored as a file"
        )));
    }
    Ok(parts.iter().collect())
}

async fn fetch_object(
    store: &dyn ObjectStore,
    location: &ObjectPath,
    size: u64,
    target: &Path,
) -> Result<()> {
    let io = |e: std::io::Error| LoraError::Download(format!("writing {}: {e}", target.display()));
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(io)?;
    }
    let what = format!("reading {location}");
    let got = idle(store.get(location), &what)
        .await?
        .map_err(|e| LoraError::Download(e.to_string()))?;
    let mut body = got.into_stream();
    let mut file = tokio::fs::File::create(target).await.map_err(io)?;
    let mut written: u64 = 0;
    while let Some(chunk) = idle(body.next(), &what).await? {
        let chunk = chunk.map_err(|e| LoraError::Download(format!("{what}: {e}")))?;
        written += chunk.len() as u64;
        file.write_all(&chunk).await.map_err(io)?;
    }
    // A server that closes early without a Content-Length error still cannot pass off a
    // short file: the listing said how big the object is.
    if written != size {
        return Err(LoraError::Download(format!(
            "{what}: got {written} of {size} bytes"
        )));
    }
    file.sync_all().await.map_err(io)?;
    Ok(())
}

async fn idle<T>(fut: impl std::future::Future<Output = T>, what: &str) -> Result<T> {
    tokio::time::timeout(IDLE_TIMEOUT, fut).await.map_err(|_| {
        LoraError::Download(format!("{what}: no data for {}s", IDLE_TIMEOUT.as_secs()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_uris_split_into_bucket_and_prefix() {
        let u = S3Uri::parse("s3://bucket/a/b/").expect("uri");
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("bucket", "a/b"));
        let u = S3Uri::parse("s3://bucket").expect("uri");
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("bucket", ""));
        for bad in [
            "s3://",
            "s3:///x",
            "s3://b/a//c",
            "s3://b/../x",
            "file:///x",
        ] {
            assert!(
                matches!(S3Uri::parse(bad), Err(LoraError::InvalidUri(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn object_keys_map_below_the_prefix() {
        let prefix = ObjectPath::from("adapters/a");
        let loc = ObjectPath::from("adapters/a/sub/w.bin");
        assert_eq!(
            relative_path(&loc, Some(&prefix)).expect("rel"),
            PathBuf::from("sub/w.bin")
        );
        let other = ObjectPath::from("adapters/b/w.bin");
        assert!(relative_path(&other, Some(&prefix)).is_err());
        assert_eq!(
            relative_path(&loc, None).expect("rel"),
            PathBuf::from("adapters/a/sub/w.bin")
        );
    }
}
