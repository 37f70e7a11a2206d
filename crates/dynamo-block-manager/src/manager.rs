//! The block manager: a device pool (G1) and a host pool (G2) sharing one registry, with
//! automatic offload of newly registered device blocks and explicit onboard.
//!
//! Offload is synchronous in [`KvBlockManager::register_device_blocks`]: each block newly
//! registered on the device whose hash the host pool does not hold gets a host block (if one
//! is available; a full host pool skips the block, like upstream's "target pool full"), the
//! data is copied in one batch, and the host copies are registered and left in the host
//! pool's inactive set, ready for reuse. The registration is shared across tiers, so offload
//! publishes no event.

use std::sync::Arc;

use dynamo_kv_router::hashing::SequenceHash;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::events::{EventSink, Registry};
use crate::layout::{BlockLayout, LayoutConfig, LayoutKind};
use crate::pool::{BlockPool, ImmutableBlock, MutableBlock, Tier};
use crate::storage::StorageRequest;
use crate::transfer::copy_blocks;

/// One tier's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierConfig {
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Where the memory comes from.
    pub storage: StorageRequest,
    /// How blocks are arranged.
    pub layout: LayoutKind,
}

/// Configuration of a [`KvBlockManager`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBlockManagerConfig {
    /// Worker id stamped on KV events.
    pub worker_id: u64,
    /// Transformer layers.
    pub num_layers: usize,
    /// 1 or 2 pages per layer.
    pub outer_dim: usize,
    /// Tokens per block.
    pub page_size: usize,
    /// Elements per token per page.
    pub inner_dim: usize,
    /// Element type.
    pub dtype: DType,
    /// Block alignment in bytes (power of two).
    pub alignment: usize,
    /// The device pool, if any.
    pub device: Option<TierConfig>,
    /// The host pool, if any.
    pub host: Option<TierConfig>,
}

impl KvBlockManagerConfig {
    /// The usual configuration: fully contiguous pools, device memory on `device_id` and
    /// pinned host memory (system memory without CUDA).
    #[expect(clippy::too_many_arguments, reason = "mirrors the Python constructor")]
    pub fn standard(
        worker_id: u64,
        num_layers: usize,
        outer_dim: usize,
        page_size: usize,
        inner_dim: usize,
        dtype: DType,
        host_num_blocks: Option<usize>,
        device_num_blocks: Option<usize>,
        device_id: usize,
    ) -> Self {
        let tier = |n, storage| TierConfig {
            num_blocks: n,
            storage,
            layout: LayoutKind::FullyContiguous,
        };
        Self {
            worker_id,
            num_layers,
            outer_dim,
            page_size,
            inner_dim,
            dtype,
            alignment: 1,
            device: device_num_blocks.map(|n| tier(n, StorageRequest::Device(device_id))),
            host: host_num_blocks.map(|n| tier(n, StorageRequest::PinnedOrSystem)),
        }
    }

    fn layout_config(&self, num_blocks: usize) -> LayoutConfig {
        LayoutConfig {
            num_blocks,
            num_layers: self.num_layers,
            outer_dim: self.outer_dim,
            page_size: self.page_size,
            inner_dim: self.inner_dim,
            alignment: self.alignment,
            dtype: self.dtype,
        }
    }
}

/// Device and host pools over one registry.
#[derive(Debug)]
pub struct KvBlockManager {
    config: KvBlockManagerConfig,
    registry: Registry,
    device: Option<BlockPool>,
    host: Option<BlockPool>,
}

impl KvBlockManager {
    /// Validate the configuration and allocate every configured pool up front.
    ///
    /// # Errors
    /// Configuration errors ([`Error::ZeroDimension`], [`Error::InvalidConfig`]) and
    /// allocation errors ([`Error::CudaUnavailable`] for a device pool without CUDA).
    pub fn new(config: KvBlockManagerConfig, sink: Arc<dyn EventSink>) -> Result<Self> {
        // Validate the block shape even when no pool is configured.
        config.layout_config(1).validate()?;
        let registry = Registry::new(config.worker_id, sink);
        let pool = |tier: Tier, t: Option<TierConfig>| -> Result<Option<BlockPool>> {
            t.map(|t| {
                let layout =
                    BlockLayout::allocate(config.layout_config(t.num_blocks), t.layout, t.storage)?;
                Ok(BlockPool::new(tier, Arc::new(layout), registry.clone()))
            })
            .transpose()
        };
        let device = pool(Tier::Device, config.device)?;
        let host = pool(Tier::Host, config.host)?;
        Ok(Self {
            config,
            registry,
            device,
            host,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &KvBlockManagerConfig {
        &self.config
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.config.page_size
    }

    /// The registry shared by both pools.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The pool of `tier`.
    ///
    /// # Errors
    /// [`Error::PoolNotConfigured`].
    pub fn pool(&self, tier: Tier) -> Result<&BlockPool> {
        match tier {
            Tier::Device => self.device.as_ref(),
            Tier::Host => self.host.as_ref(),
        }
        .ok_or(Error::PoolNotConfigured(tier))
    }

    /// Allocate `count` blocks of `tier`, all or nothing.
    ///
    /// # Errors
    /// [`Error::PoolNotConfigured`], [`Error::NotEnoughBlocks`].
    pub fn allocate_blocks(&self, tier: Tier, count: usize) -> Result<Vec<MutableBlock>> {
        self.pool(tier)?.allocate_blocks(count)
    }

    /// Register complete device blocks and offload the newly registered ones to the host
    /// pool (when there is one).
    ///
    /// # Errors
    /// Registration errors; transfer errors (the device blocks stay registered).
    pub fn register_device_blocks(&self, blocks: Vec<MutableBlock>) -> Result<Vec<ImmutableBlock>> {
        let registered = self.pool(Tier::Device)?.register_blocks_inner(blocks)?;
        let fresh: Vec<&ImmutableBlock> = registered
            .iter()
            .filter(|(_, newly)| *newly)
            .map(|(b, _)| b)
            .collect();
        if let Some(host) = &self.host {
            offload(&fresh, host)?;
        }
        Ok(registered.into_iter().map(|(b, _)| b).collect())
    }

    /// Register complete host blocks.
    ///
    /// # Errors
    /// See [`BlockPool::register_blocks`].
    pub fn register_host_blocks(&self, blocks: Vec<MutableBlock>) -> Result<Vec<ImmutableBlock>> {
        self.pool(Tier::Host)?.register_blocks(blocks)
    }

    /// The longest prefix of `hashes` cached in `tier`.
    ///
    /// # Errors
    /// [`Error::PoolNotConfigured`].
    pub fn match_sequence_hashes(
        &self,
        tier: Tier,
        hashes: &[SequenceHash],
    ) -> Result<Vec<ImmutableBlock>> {
        Ok(self.pool(tier)?.match_sequence_hashes(hashes))
    }

    /// Copy registered host blocks to newly allocated device blocks and register them on the
    /// device. Blocks the device already holds are returned without a copy.
    ///
    /// # Errors
    /// [`Error::PoolNotConfigured`], [`Error::NotEnoughBlocks`] (nothing is copied then),
    /// [`Error::InvalidConfig`] for blocks that are not host blocks, transfer errors.
    pub fn onboard_blocks(&self, host_blocks: &[ImmutableBlock]) -> Result<Vec<ImmutableBlock>> {
        let device = self.pool(Tier::Device)?;
        if host_blocks.iter().any(|b| b.tier() != Tier::Host) {
            return Err(Error::InvalidConfig("onboard takes host blocks".into()));
        }
        let hashes: Vec<_> = host_blocks
            .iter()
            .map(ImmutableBlock::sequence_hash)
            .collect();
        let mut present = device.match_sequence_hashes(&hashes);
        if present.len() == host_blocks.len() {
            return Ok(present);
        }
        let missing = &host_blocks[present.len()..];
        let mut targets = device.allocate_blocks(missing.len())?;
        let pairs: Vec<_> = missing
            .iter()
            .zip(&targets)
            .map(|(s, d)| (s.block_index(), d.block_index()))
            .collect();
        if let Some(first) = missing.first() {
            copy_blocks(first.layout(), device.layout(), &pairs)?;
        }
        for (t, s) in targets.iter_mut().zip(missing) {
            t.apply_token_block(s.token_block().clone())?;
        }
        present.extend(device.register_blocks(targets)?);
        Ok(present)
    }
}

/// Copy `blocks` into `host` unless it already holds them; host blocks are registered and
/// released at once (they stay cached in the host pool's inactive set).
fn offload(blocks: &[&ImmutableBlock], host: &BlockPool) -> Result<()> {
    let todo: Vec<&ImmutableBlock> = blocks
        .iter()
        .copied()
        .filter(|b| !host.contains(b.sequence_hash()))
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    // Take what fits: a full host pool skips the remaining blocks rather than failing the
    // registration on the device.
    let take = todo.len().min(host.available_blocks());
    let Ok(mut targets) = host.allocate_blocks(take) else {
        return Ok(());
    };
    let todo = &todo[..targets.len()];
    let pairs: Vec<_> = todo
        .iter()
        .zip(&targets)
        .map(|(s, d)| (s.block_index(), d.block_index()))
        .collect();
    if let Some(first) = todo.first() {
        copy_blocks(first.layout(), host.layout(), &pairs)?;
    }
    for (t, s) in targets.iter_mut().zip(todo) {
        t.set_priority(s.priority());
        t.apply_token_block(s.token_block().clone())?;
    }
    drop(host.register_blocks(targets)?);
    Ok(())
}
