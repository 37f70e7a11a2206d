use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::cache::{ADAPTER_CONFIG, SOURCE_MARKER};
use super::*;

fn write_adapter(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join(ADAPTER_CONFIG), "{}").expect("config");
    std::fs::write(dir.join("adapter_model.safetensors"), b"weights").expect("weights");
}

fn entries(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn cache_keys_match_the_reference() {
    // Observed from ai-dynamo-runtime 1.6.1's LoRADownloader.uri_to_cache_key.
    for (uri, key) in [
        ("file:///tmp/a/b", "file___tmp_a_b"),
        ("file://rel/x", "file__rel_x"),
        ("s3://bucket/prefix/adapter", "s3__bucket_prefix_adapter"),
        ("s3://bucket/prefix/adapter/", "s3__bucket_prefix_adapter_"),
        ("s3://bucket", "s3__bucket"),
        ("hf://org/name", "hf__org_name"),
        ("/abs/path", "_abs_path"),
        ("s3://b/a b/c?x=1#y", "s3__b_a b_c?x=1#y"),
        ("", ""),
        ("S3://Bucket/X", "S3__Bucket_X"),
        ("s3://bucket//double", "s3__bucket__double"),
        ("a:b", "a:b"),
        ("a:/b", "a:_b"),
        ("a\\b", "a_b"),
        ("..", "__"),
        ("s3://b/../../etc", "s3__b_______etc"),
        ("x://y://z", "x__y__z"),
        ("s3://b/x.y/z", "s3__b_x_y_z"),
        ("s3://b/ü", "s3__b_ü"),
    ] {
        assert_eq!(uri_to_cache_key(uri), key, "{uri:?}");
    }
}

#[test]
fn cache_keys_stay_inside_the_root() {
    let cache = LoraCache::new("/cache");
    assert_eq!(
        cache.entry_path("s3__b_x").expect("key"),
        Path::new("/cache/s3__b_x")
    );
    for bad in ["", ".", "..", "../etc", "a/b", "a\\b", "a\0b"] {
        assert!(
            matches!(cache.entry_path(bad), Err(LoraError::InvalidCacheKey(_))),
            "{bad:?}"
        );
    }
    // Whatever the URI, its key is a valid single component.
    for uri in ["s3://b/../..", "file:///", "..", "s3://b/./."] {
        assert!(cache.entry_path(&uri_to_cache_key(uri)).is_ok(), "{uri:?}");
    }
}

#[test]
fn an_adapter_needs_a_config_and_weights() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path().join("a");
    assert!(!cache::is_adapter_dir(&d).expect("missing"));
    std::fs::create_dir(&d).expect("mkdir");
    std::fs::write(d.join(ADAPTER_CONFIG), "{}").expect("config");
    assert!(!cache::is_adapter_dir(&d).expect("no weights"));
    for w in cache::ADAPTER_WEIGHTS {
        std::fs::write(d.join(w), b"x").expect("weights");
        assert!(cache::is_adapter_dir(&d).expect("adapter"), "{w}");
        std::fs::remove_file(d.join(w)).expect("rm");
    }
    // A directory where the weights file should be does not count.
    std::fs::create_dir(d.join("adapter_model.bin")).expect("mkdir");
    assert!(!cache::is_adapter_dir(&d).expect("dir weights"));
    // A file is not an adapter directory.
    assert!(!cache::is_adapter_dir(&d.join(ADAPTER_CONFIG)).expect("file"));
}

#[test]
fn install_is_one_rename_and_refuses_incomplete_downloads() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cache = LoraCache::new(tmp.path().join("root"));
    let partial = cache.new_partial("k").expect("partial");
    std::fs::write(partial.join(ADAPTER_CONFIG), "{}").expect("config");
    // Config without weights: refused, nothing appears under the key.
    let err = cache.install(&partial, "k").expect_err("incomplete");
    assert!(matches!(err, LoraError::Validation(_)), "{err}");
    assert!(!cache.validate("k").expect("validate"));
    assert!(!cache.entry_path("k").expect("key").exists());

    std::fs::write(partial.join("adapter_model.bin"), b"w").expect("weights");
    let dest = cache.install(&partial, "k").expect("install");
    assert_eq!(dest, cache.entry_path("k").expect("key"));
    assert!(!partial.exists(), "the partial directory was renamed");
    assert!(cache.validate("k").expect("validate"));
    assert_eq!(entries(cache.root()), ["k"]);
}

#[test]
fn install_keeps_a_valid_entry_and_replaces_an_invalid_one() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cache = LoraCache::new(tmp.path());
    // Another process won the race: its entry stays, ours is discarded.
    write_adapter(&cache.entry_path("k").expect("key"));
    std::fs::write(cache.entry_path("k").expect("key").join("theirs"), "").expect("mark");
    let partial = cache.new_partial("k").expect("partial");
    write_adapter(&partial);
    cache.install(&partial, "k").expect("install");
    assert!(cache.entry_path("k").expect("key").join("theirs").exists());
    assert!(!partial.exists());
    // An entry emptied by hand is replaced by the complete download.
    let stale = cache.entry_path("j").expect("key");
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join(ADAPTER_CONFIG), "{}").expect("config");
    let partial = cache.new_partial("j").expect("partial");
    write_adapter(&partial);
    std::fs::write(partial.join("ours"), "").expect("mark");
    cache.install(&partial, "j").expect("install");
    assert!(stale.join("ours").exists());
    assert_eq!(entries(cache.root()), ["j", "k"]);
}

#[test]
fn partials_of_dead_processes_are_swept() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cache = LoraCache::new(tmp.path());
    // pid 0 is never a user process; our own pid is alive.
    let dead = tmp.path().join(".partial.k.0.1");
    let live = tmp
        .path()
        .join(format!(".partial.k.{}.2", std::process::id()));
    let other_key = tmp.path().join(".partial.other.0.3");
    for d in [&dead, &live, &other_key] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let fresh = cache.new_partial("k").expect("partial");
    assert!(!dead.exists(), "dead process's partial removed");
    assert!(live.exists() && other_key.exists() && fresh.exists());
    assert!(
        !cache.validate("k").expect("validate"),
        "partials are not entries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_downloads_of_one_uri_fetch_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dl = Arc::new(LoraDownloader::new(Some(tmp.path().into())).expect("downloader"));
    let fetches = Arc::new(AtomicUsize::new(0));
    let uri = "s3://bucket/adapter";
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (dl, fetches) = (Arc::clone(&dl), Arc::clone(&fetches));
            tokio::spawn(async move {
                dl.cached_or(uri, |partial| async move {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    write_adapter(&partial);
                    Ok(())
                })
                .await
            })
        })
        .collect();
    for t in tasks {
        let path = t.await.expect("join").expect("download");
        assert_eq!(path, tmp.path().join("s3__bucket_adapter"));
    }
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert!(dl.is_cached(uri) && dl.is_cached("s3__bucket_adapter"));
    assert_eq!(
        dl.cache().source_of("s3__bucket_adapter").as_deref(),
        Some(uri)
    );
    assert!(dl.inflight.lock().expect("lock").is_empty());
    assert_eq!(entries(tmp.path()), ["s3__bucket_adapter"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_cancelled_download_leaves_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dl = LoraDownloader::new(Some(tmp.path().into())).expect("downloader");
    let err = dl
        .cached_or("s3://b/x", |partial| async move {
            std::fs::write(partial.join(ADAPTER_CONFIG), "{}").expect("half");
            Err(LoraError::Download("connection reset".into()))
        })
        .await
        .expect_err("fails");
    assert_eq!(err.to_string(), "s3://b/x: connection reset");
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
    // Cancelled mid-download (the future dropped): the partial directory goes too.
    let fut = dl.cached_or("s3://b/x", |partial| async move {
        write_adapter(&partial);
        std::future::pending::<()>().await;
        Ok(())
    });
    let r = tokio::time::timeout(std::time::Duration::from_millis(50), fut).await;
    assert!(r.is_err(), "still pending");
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
    assert!(!dl.is_cached("s3://b/x"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_uris_sharing_a_key_are_told_apart() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dl = LoraDownloader::new(Some(tmp.path().into())).expect("downloader");
    dl.cached_or("s3://b/a_b", |p| async move {
        write_adapter(&p);
        Ok(())
    })
    .await
    .expect("first");
    let err = dl
        .cached_or("s3://b/a/b", |_| async { unreachable!("cached") })
        .await
        .expect_err("collision");
    assert!(err.to_string().contains("share a cache key"), "{err}");
    // An entry without a marker (made by hand or by another tool) is trusted.
    std::fs::remove_file(tmp.path().join("s3__b_a_b").join(SOURCE_MARKER)).expect("rm");
    dl.cached_or("s3://b/a/b", |_| async { unreachable!("cached") })
        .await
        .expect("hit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_uris_are_checked_and_returned_as_is() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dl = LoraDownloader::new(Some(tmp.path().join("cache"))).expect("downloader");
    let good = tmp.path().join("good");
    write_adapter(&good);
    let uri = format!("file://{}", good.display());
    assert_eq!(dl.download_if_needed(&uri).await.expect("file"), good);
    assert!(dl.is_cached(&uri));
    assert!(!tmp.path().join("cache").exists(), "nothing copied");

    let missing = format!("file://{}/missing", tmp.path().display());
    let err = dl.download_if_needed(&missing).await.expect_err("missing");
    assert_eq!(err.to_string(), format!("Local LoRA not found: {missing}"));
    let half = tmp.path().join("half");
    std::fs::create_dir(&half).expect("mkdir");
    std::fs::write(half.join(ADAPTER_CONFIG), "{}").expect("config");
    let half_uri = format!("file://{}", half.display());
    let err = dl.download_if_needed(&half_uri).await.expect_err("half");
    assert!(err.to_string().contains("is not a valid LoRA"), "{err}");
    assert!(!dl.is_cached(&half_uri));

    for bad in ["http://x/y", "gs://b/x", "/plain/path", "", "s3://"] {
        let err = dl.download_if_needed(bad).await.expect_err(bad);
        assert!(matches!(err, LoraError::InvalidUri(_)), "{bad}: {err}");
    }
}

#[test]
fn the_download_lock_is_exclusive_and_taken_over_from_dead_processes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cache = LoraCache::new(tmp.path());
    let held = cache.try_lock("k").expect("lock").expect("free");
    assert!(
        cache.try_lock("k").expect("lock").is_none(),
        "held by a live process"
    );
    assert!(cache.try_lock("other").expect("lock").is_some(), "per key");
    drop(held);
    assert!(!tmp.path().join(".lock.k").exists(), "released on drop");
    // A lock left by a process that no longer runs (pid 0 is never one) is taken over.
    std::fs::write(tmp.path().join(".lock.k"), "0").expect("stale");
    let lock = cache.try_lock("k").expect("lock").expect("taken over");
    drop(lock);
    assert!(entries(tmp.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_waits_for_another_process_and_uses_its_entry() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dl = Arc::new(LoraDownloader::new(Some(tmp.path().into())).expect("downloader"));
    let key = uri_to_cache_key("s3://b/x");
    // "Another process" (the lock file names a live pid: ours) is downloading.
    let other = dl.cache().try_lock(&key).expect("lock").expect("free");
    let fetches = Arc::new(AtomicUsize::new(0));
    let waiting = {
        let (dl, fetches) = (Arc::clone(&dl), Arc::clone(&fetches));
        tokio::spawn(async move {
            dl.cached_or("s3://b/x", |p| async move {
                fetches.fetch_add(1, Ordering::SeqCst);
                write_adapter(&p);
                Ok(())
            })
            .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "waits while the lock is held");
    write_adapter(&tmp.path().join(&key));
    drop(other);
    let path = waiting.await.expect("join").expect("entry");
    assert_eq!(path, tmp.path().join(&key));
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        0,
        "used the other process's entry"
    );
}
