//! In-process key-value store. Every [`MemStore`] handle in the process sees the same
//! keys, so several runtimes of one process discover each other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{LazyLock, Mutex};

use tokio::sync::watch;

use super::{BoxFuture, KvStore};
use crate::context::lock;
use crate::error::Result;

struct Shared {
    map: Mutex<BTreeMap<String, String>>,
    version: watch::Sender<u64>,
}

static SHARED: LazyLock<Shared> = LazyLock::new(|| Shared {
    map: Mutex::new(BTreeMap::new()),
    version: watch::channel(0).0,
});

/// A handle on the process-wide store; keys it puts are deleted by [`KvStore::shutdown`].
#[derive(Default)]
pub struct MemStore {
    owned: Mutex<BTreeSet<String>>,
}

impl MemStore {
    /// A new handle.
    pub fn new() -> Self {
        Self::default()
    }
}

fn bump() {
    SHARED.version.send_modify(|v| *v = v.wrapping_add(1));
}

impl KvStore for MemStore {
    fn put(&self, key: &str, value: &str) -> BoxFuture<'_, Result<()>> {
        lock(&SHARED.map).insert(key.to_owned(), value.to_owned());
        lock(&self.owned).insert(key.to_owned());
        bump();
        Box::pin(async { Ok(()) })
    }

    fn delete(&self, key: &str) -> BoxFuture<'_, Result<()>> {
        let removed = lock(&SHARED.map).remove(key).is_some();
        lock(&self.owned).remove(key);
        if removed {
            bump();
        }
        Box::pin(async { Ok(()) })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, String)>>> {
        let out = lock(&SHARED.map)
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Box::pin(async { Ok(out) })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        SHARED.version.subscribe()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        let owned = std::mem::take(&mut *lock(&self.owned));
        {
            let mut map = lock(&SHARED.map);
            for k in &owned {
                map.remove(k);
            }
        }
        if !owned.is_empty() {
            bump();
        }
        Box::pin(async {})
    }
}
