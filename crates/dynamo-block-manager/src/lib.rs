//! KV block manager: blocks of KV-cache memory on the GPU (G1, device) and in host memory
//! (G2), allocated, shared by prefix, evicted, offloaded and onboarded.
//!
//! * [`storage`]: page-aligned system memory, pinned host memory and device memory.
//! * [`layout`]: where each `(block, layer, outer)` page lives ([`LayoutKind`]).
//! * [`block`]: token blocks, hashes (shared with the KV router) and the block state
//!   machine; [`TensorDesc`] views for DLPack.
//! * [`pool`]: [`BlockPool`] with FIFO free list, registration by sequence hash, reuse,
//!   longest-prefix matching and LRU eviction (leaves before parents).
//! * [`dlpack`]: DLPack managed tensors over block memory (the C ABI, without Python).
//! * [`events`]: Stored/Removed KV events in the router's shape, through an [`EventSink`].
//! * [`transfer`]: block copies (memcpy on the host, async CUDA copies otherwise).
//! * [`manager`]: [`KvBlockManager`], the two tiers with offload and onboard.
//!
//! CUDA is reached through cudarc with run-time loading of `libcuda` (feature `cuda`, on by
//! default). Builds need no CUDA toolkit; on machines without a driver or a device, host
//! pools fall back to system memory and device requests fail with
//! [`Error::CudaUnavailable`]. Nothing panics for lack of CUDA.
//!
//! ```
//! use std::sync::Arc;
//! use dynamo_block_manager::{
//!     DType, KvBlockManager, KvBlockManagerConfig, KvbmRequest, RecordingEventSink, Tier,
//!     TokenBlock,
//! };
//!
//! let sink = Arc::new(RecordingEventSink::default());
//! // 2 layers, K and V, 4 tokens per block, 8 elements per token, 16 host blocks.
//! let config = KvBlockManagerConfig::standard(0, 2, 2, 4, 8, DType::Fp16, Some(16), None, 0);
//! let manager = KvBlockManager::new(config, sink.clone())?;
//! let pool = manager.pool(Tier::Host)?;
//! assert_eq!(pool.layout().config().block_bytes(), 2 * 2 * 4 * 8 * 2);
//!
//! // Fill two blocks with a prompt and register them: one Stored event per block.
//! let prompt: Vec<u32> = (0..8).collect();
//! let token_blocks = TokenBlock::split(&prompt, 4, &KvbmRequest::default());
//! let mut blocks = manager.allocate_blocks(Tier::Host, 2)?;
//! for (b, tb) in blocks.iter_mut().zip(&token_blocks) {
//!     b.apply_token_block(tb.clone())?;
//! }
//! let registered = manager.register_host_blocks(blocks)?;
//! assert_eq!(sink.take().len(), 2);
//!
//! // Once released, the blocks stay cached and a later request finds the prefix.
//! drop(registered);
//! let hashes: Vec<_> = token_blocks.iter().map(TokenBlock::sequence_hash).collect();
//! assert_eq!(pool.match_sequence_hashes(&hashes).len(), 2);
//! # Ok::<(), dynamo_block_manager::Error>(())
//! ```

pub mod block;
#[cfg(feature = "cuda")]
mod cuda;
mod cuda_probe;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod events;
pub mod layout;
pub mod manager;
pub mod pool;
pub mod storage;
mod tier;
pub mod transfer;

pub use block::{BlockState, KvbmRequest, TensorDesc, TokenBlock};
pub use cuda_probe::{cuda_available, cuda_device_count};
pub use dtype::{DType, DTypeCode};
pub use error::{Error, Result};
pub use events::{EventSink, NullEventSink, RecordingEventSink, RouterEvent};
pub use layout::{BlockLayout, LayoutConfig, LayoutKind};
pub use manager::{KvBlockManager, KvBlockManagerConfig, TierConfig};
pub use pool::{BlockPool, ImmutableBlock, MutableBlock, Tier};
pub use storage::{MemoryKind, Storage, StorageRequest};
