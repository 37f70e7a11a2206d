//! Resolving a model name to a local directory without network access.
//!
//! A model is either a local directory or a Hugging Face repo id (`org/name`, optionally
//! prefixed `hf://`) already present in the offline Hugging Face cache
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
//! `~/.cache/huggingface/hub`), laid out as `models--org--name/snapshots/<revision>/`.
//! Nothing is downloaded: a miss fails at once with [`Error::ModelNotFound`] listing the
//! paths tried, so a machine without network never hangs.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Strip the optional `hf://` prefix of a repo id.
pub fn strip_hf_prefix(name: &str) -> &str {
    name.strip_prefix("hf://").unwrap_or(name)
}

/// The Hugging Face hub cache directory from the environment (see the module docs).
pub fn hf_hub_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("HF_HUB_CACHE")
        .or_else(|| env("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| env("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| env("XDG_CACHE_HOME").map(|c| c.join("huggingface").join("hub")))
        .or_else(|| env("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// Resolve `name` to a local model directory: the directory itself if it exists, else its
/// snapshot in the Hugging Face cache `cache_dir`.
///
/// In the cache, the revision named by `refs/main` wins; otherwise the most recently
/// modified snapshot. `ignore_weights` is accepted for API parity: nothing is downloaded, so
/// there is nothing to skip.
///
/// # Errors
/// [`Error::ModelNotFound`] naming every path tried.
pub fn resolve_model_path_in(name: &str, cache_dir: Option<&Path>) -> Result<PathBuf> {
    let mut tried = Vec::new();
    let local = Path::new(name);
    if local.is_dir() {
        return Ok(local.to_path_buf());
    }
    tried.push(local.to_path_buf());
    let repo = strip_hf_prefix(name);
    // A repo id is `name` or `org/name`; anything else (absolute paths, `..`) is a path only.
    let looks_like_repo = !repo.is_empty()
        && !repo.starts_with(['/', '.', '~'])
        && repo.split('/').count() <= 2
        && repo.split('/').all(|p| !p.is_empty());
    if let (true, Some(cache)) = (looks_like_repo, cache_dir) {
        let repo_dir = cache.join(format!("models--{}", repo.replace('/', "--")));
        if let Ok(rev) = std::fs::read_to_string(repo_dir.join("refs").join("main")) {
            let snap = repo_dir.join("snapshots").join(rev.trim());
            if snap.is_dir() {
                return Ok(snap);
            }
            tried.push(snap);
        }
        let snapshots = repo_dir.join("snapshots");
        let newest = std::fs::read_dir(&snapshots).ok().and_then(|entries| {
            entries
                .filter_map(std::result::Result::ok)
                .filter(|e| e.path().is_dir())
                .max_by_key(|e| (e.metadata().and_then(|m| m.modified()).ok(), e.file_name()))
                .map(|e| e.path())
        });
        match newest {
            Some(snap) => return Ok(snap),
            None => tried.push(snapshots),
        }
    }
    Err(Error::ModelNotFound {
        name: name.to_owned(),
        tried,
    })
}

/// [`resolve_model_path_in`] with the cache directory from the environment.
///
/// # Errors
/// [`Error::ModelNotFound`] naming every path tried.
pub fn resolve_model_path(name: &str) -> Result<PathBuf> {
    resolve_model_path_in(name, hf_hub_cache_dir().as_deref())
}

/// `fetch_model`: the local directory of `remote_name` (see [`resolve_model_path`]).
///
/// # Errors
/// [`Error::ModelNotFound`] naming every path tried.
pub fn fetch_model(remote_name: &str, ignore_weights: bool) -> Result<PathBuf> {
    let _ = ignore_weights;
    resolve_model_path(remote_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "dynamo-llm-fetch-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[test]
    fn local_directory_is_returned_as_is() {
        let dir = temp_dir("local");
        let got = resolve_model_path_in(dir.to_str().expect("utf8"), None).expect("found");
        assert_eq!(got, dir);
    }

    #[test]
    fn hf_cache_snapshot_is_found_offline() {
        let cache = temp_dir("cache");
        let repo = cache.join("models--org--tiny");
        std::fs::create_dir_all(repo.join("snapshots").join("abc123")).expect("mkdir");
        std::fs::create_dir_all(repo.join("snapshots").join("def456")).expect("mkdir");
        std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
        std::fs::write(repo.join("refs").join("main"), "abc123\n").expect("write");
        let got = resolve_model_path_in("hf://org/tiny", Some(&cache)).expect("found");
        assert_eq!(got, repo.join("snapshots").join("abc123"));
        // Without refs/main, any snapshot will do.
        std::fs::remove_dir_all(repo.join("refs")).expect("rm");
        let got = resolve_model_path_in("org/tiny", Some(&cache)).expect("found");
        assert!(got.starts_with(repo.join("snapshots")), "{}", got.display());
    }

    #[test]
    fn a_miss_names_every_path_tried() {
        let cache = temp_dir("miss");
        let err = resolve_model_path_in("org/absent", Some(&cache)).expect_err("absent");
        let msg = err.to_string();
        assert!(msg.contains("org/absent"), "{msg}");
        assert!(msg.contains("models--org--absent"), "{msg}");
        let err = resolve_model_path_in("/no/such/dir", Some(&cache)).expect_err("absent");
        assert!(err.to_string().contains("/no/such/dir"), "{err}");
        assert!(matches!(err, Error::ModelNotFound { .. }));
    }
}
