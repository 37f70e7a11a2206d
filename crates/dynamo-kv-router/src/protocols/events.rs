//! The event types themselves (the wire format is in the module docs of
//! [`crate::protocols`]). Apart from their codecs in `mod.rs` because the fast JSON decoder
//! builds them and `mod.rs` calls that decoder: both import this file.

use serde::{Deserialize, Serialize};

use crate::hashing::{BlockExtraInfo, LocalBlockHash};

/// The engine's hash of a block together with its prefix (`block_hash` / `parent_hash` on the
/// wire). Opaque to the router: it only links parents and names blocks to remove.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
#[repr(transparent)]
pub struct ExternalSequenceBlockHash(pub u64);

impl ExternalSequenceBlockHash {
    /// Reinterpret a signed engine hash bit for bit (`-1` becomes `u64::MAX`).
    pub const fn from_i64(value: i64) -> Self {
        Self(value as u64)
    }
}

/// A worker (engine process) and one of its data-parallel ranks: the key of every score.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub struct WorkerWithDpRank {
    /// The worker (instance) id.
    pub worker_id: u64,
    /// The data-parallel rank inside the worker (0 when the engine has no data parallelism).
    pub dp_rank: u32,
}

impl WorkerWithDpRank {
    /// Shorthand constructor.
    pub const fn new(worker_id: u64, dp_rank: u32) -> Self {
        Self { worker_id, dp_rank }
    }
}

/// Where a reported block lives. Only `device` blocks are prefix-cache hits on a GPU; the
/// other tiers are carried for tier-aware routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageTier {
    /// GPU memory (the default when the field is absent).
    #[default]
    Device,
    /// Pinned host memory.
    HostPinned,
    /// Local disk.
    Disk,
    /// Storage shared outside the worker.
    External,
}

/// One block of a `stored` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheStoredBlockData {
    /// The engine's hash of the block and its prefix.
    pub block_hash: ExternalSequenceBlockHash,
    /// The router's content hash of the block (what `find_matches` looks up).
    pub tokens_hash: LocalBlockHash,
    /// Multimodal objects of the block; already folded into `tokens_hash` by the publisher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mm_extra_info: Option<BlockExtraInfo>,
}

impl KvCacheStoredBlockData {
    /// A plain block (no multimodal info).
    pub const fn new(block_hash: u64, tokens_hash: u64) -> Self {
        Self {
            block_hash: ExternalSequenceBlockHash(block_hash),
            tokens_hash: LocalBlockHash(tokens_hash),
            mm_extra_info: None,
        }
    }
}

/// Payload of a `stored` event: a chain of blocks appended under `parent_hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheStoreData {
    /// The block this chain continues, or `None` for a chain that starts at the root.
    pub parent_hash: Option<ExternalSequenceBlockHash>,
    /// Position of the first block in the sequence (newer publishers; informational here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_position: Option<u32>,
    /// The blocks, parent first.
    pub blocks: Vec<KvCacheStoredBlockData>,
}

/// Payload of a `removed` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheRemoveData {
    /// External hashes of the evicted blocks.
    pub block_hashes: Vec<ExternalSequenceBlockHash>,
}

/// What happened to the worker's cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheEventData {
    /// Blocks were stored (computed or loaded) and can be reused.
    Stored(KvCacheStoreData),
    /// Blocks were evicted.
    Removed(KvCacheRemoveData),
    /// Every block of the emitting `(worker, dp_rank)` was dropped.
    Cleared,
}

/// One event of one worker rank, as `RadixTree.apply_event` receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheEvent {
    /// Monotonic per `(worker, dp_rank)`; used by transports to detect gaps.
    pub event_id: u64,
    /// The change.
    pub data: KvCacheEventData,
    /// The data-parallel rank that emitted the event.
    #[serde(default)]
    pub dp_rank: u32,
}

/// An event together with the worker that emitted it (the event-plane message and the unit of
/// `dump_tree_as_events`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterEvent {
    /// The emitting worker.
    pub worker_id: u64,
    /// Where the blocks live.
    #[serde(default)]
    pub storage_tier: StorageTier,
    /// The event.
    pub event: KvCacheEvent,
}

impl RouterEvent {
    /// The `(worker, dp_rank)` this event applies to.
    pub const fn worker(&self) -> WorkerWithDpRank {
        WorkerWithDpRank::new(self.worker_id, self.event.dp_rank)
    }
}
