//! The pending-selection cache: what `select` chose under a caller's `selection_id`, kept
//! until `create_reservation` books it, it expires, or room is needed.
//!
//! Invariants: no entry older than `ttl` is ever returned; at most `max_entries` entries
//! and at most `max_bytes` of estimated entry size are resident after every insert (the
//! oldest entries are evicted first; an entry larger than `max_bytes` on its own is not
//! kept at all). Inserting an id that is already cached replaces it (it becomes the
//! newest). Every operation is O(log n) in the number of resident entries.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Default lifetime of an unclaimed selection: long enough for a gateway to forward the
/// request and book it, short enough that abandoned selections do not pile up.
pub const DEFAULT_TTL_SECS: f64 = 60.0;
/// Default bound on resident selections (about 100k concurrent in-flight selections).
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
/// Default byte budget (the reference's CLI default, 256 MiB).
pub const DEFAULT_MAX_BYTES: usize = 268_435_456;

/// Bounds of the cache; `None` keeps the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SelectionCacheConfig {
    /// Seconds an unclaimed selection lives.
    pub ttl_secs: Option<f64>,
    /// Resident selections at most.
    pub max_entries: Option<usize>,
    /// Estimated bytes of resident selections at most.
    pub max_bytes: Option<usize>,
}

impl SelectionCacheConfig {
    /// Check the ranges.
    ///
    /// # Errors
    /// A message naming the field when `ttl_secs` is negative or not finite.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(t) = self.ttl_secs
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(format!(
                "ttl_secs must be a finite number of seconds >= 0, got {t}"
            ));
        }
        Ok(())
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs_f64(self.ttl_secs.unwrap_or(DEFAULT_TTL_SECS).max(0.0))
    }
}

struct Entry<V> {
    seq: u64,
    at: Instant,
    bytes: usize,
    value: V,
}

/// Cached values of type `V` by id, bounded by age, count and bytes.
pub struct PendingCache<V> {
    ttl: Duration,
    max_entries: usize,
    max_bytes: usize,
    entries: HashMap<String, Entry<V>>,
    order: BTreeMap<u64, String>,
    next_seq: u64,
    bytes: usize,
    evicted: u64,
}

impl<V> PendingCache<V> {
    /// An empty cache with `config`'s bounds.
    pub fn new(config: &SelectionCacheConfig) -> Self {
        Self {
            ttl: config.ttl(),
            max_entries: config.max_entries.unwrap_or(DEFAULT_MAX_ENTRIES),
            max_bytes: config.max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
            evicted: 0,
        }
    }

    /// Resident entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Estimated bytes of resident entries.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries dropped for age, count or size so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    fn unlink(&mut self, id: &str) -> Option<Entry<V>> {
        let e = self.entries.remove(id)?;
        self.order.remove(&e.seq);
        self.bytes -= e.bytes;
        Some(e)
    }

    fn evict_oldest(&mut self) {
        if let Some((_, id)) = self.order.pop_first() {
            if let Some(e) = self.entries.remove(&id) {
                self.bytes -= e.bytes;
            }
            self.evicted += 1;
        }
    }

    /// Drop every entry older than the TTL.
    pub fn expire(&mut self, now: Instant) {
        while let Some((_, id)) = self.order.first_key_value() {
            let stale = self
                .entries
                .get(id)
                .is_none_or(|e| now.duration_since(e.at) > self.ttl);
            if !stale {
                break;
            }
            self.evict_oldest();
        }
    }

    /// Cache `value` (estimated at `bytes`) under `id`, replacing an older entry, then
    /// evict the oldest entries until the bounds hold.
    pub fn insert(&mut self, id: String, value: V, bytes: usize, now: Instant) {
        self.unlink(&id);
        self.expire(now);
        if bytes > self.max_bytes || self.max_entries == 0 {
            self.evicted += 1;
            return;
        }
        while self.entries.len() >= self.max_entries || self.bytes + bytes > self.max_bytes {
            self.evict_oldest();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, id.clone());
        self.bytes += bytes;
        self.entries.insert(
            id,
            Entry {
                seq,
                at: now,
                bytes,
                value,
            },
        );
    }

    /// Remove and return the live entry under `id`.
    pub fn take(&mut self, id: &str, now: Instant) -> Option<V> {
        self.expire(now);
        self.unlink(id).map(|e| e.value)
    }

    /// Whether a live entry is cached under `id`.
    pub fn contains(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        self.entries.contains_key(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(ttl: f64, entries: usize, bytes: usize) -> PendingCache<u32> {
        PendingCache::new(&SelectionCacheConfig {
            ttl_secs: Some(ttl),
            max_entries: Some(entries),
            max_bytes: Some(bytes),
        })
    }

    #[test]
    fn ttl_expires_entries() {
        let mut c = cache(1.0, 10, 1000);
        let t0 = Instant::now();
        c.insert("a".into(), 1, 10, t0);
        c.insert("b".into(), 2, 10, t0 + Duration::from_millis(800));
        assert!(c.contains("a", t0 + Duration::from_millis(900)));
        assert_eq!(c.take("a", t0 + Duration::from_millis(1100)), None);
        assert_eq!(c.take("b", t0 + Duration::from_millis(1100)), Some(2));
        assert!(c.is_empty());
        assert_eq!((c.bytes(), c.evicted()), (0, 1));
    }

    #[test]
    fn max_entries_evicts_oldest() {
        let mut c = cache(60.0, 2, 1000);
        let t = Instant::now();
        for (i, id) in ["c0", "c1", "c2", "c3"].into_iter().enumerate() {
            c.insert(id.into(), i as u32, 1, t);
        }
        assert_eq!(c.len(), 2);
        assert_eq!(c.take("c0", t), None);
        assert_eq!(c.take("c1", t), None);
        assert_eq!(c.take("c2", t), Some(2));
        assert_eq!(c.take("c3", t), Some(3));
        assert_eq!(c.evicted(), 2);
    }

    #[test]
    fn max_bytes_bounds_the_total_and_rejects_oversized() {
        let mut c = cache(60.0, 100, 100);
        let t = Instant::now();
        c.insert("big".into(), 0, 101, t);
        assert!(!c.contains("big", t));
        c.insert("a".into(), 1, 60, t);
        c.insert("b".into(), 2, 30, t);
        c.insert("c".into(), 3, 30, t);
        assert!(c.bytes() <= 100);
        assert!(!c.contains("a", t));
        assert!(c.contains("b", t) && c.contains("c", t));
        assert_eq!(c.bytes(), 60);
    }

    #[test]
    fn reinsert_replaces_and_counts_bytes_once() {
        let mut c = cache(60.0, 10, 100);
        let t = Instant::now();
        c.insert("a".into(), 1, 40, t);
        c.insert("a".into(), 2, 50, t);
        assert_eq!((c.len(), c.bytes()), (1, 50));
        assert_eq!(c.take("a", t), Some(2));
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn zero_ttl_and_zero_entries() {
        let t = Instant::now();
        let mut c = cache(0.0, 10, 100);
        c.insert("a".into(), 1, 1, t);
        assert_eq!(c.take("a", t + Duration::from_millis(1)), None);
        let mut c = cache(60.0, 0, 100);
        c.insert("a".into(), 1, 1, t);
        assert!(c.is_empty());
    }

    #[test]
    fn negative_ttl_is_rejected() {
        let bad = SelectionCacheConfig {
            ttl_secs: Some(-1.0),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("ttl_secs"));
        assert!(SelectionCacheConfig::default().validate().is_ok());
    }
}
