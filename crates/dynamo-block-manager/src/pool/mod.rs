//! Block pools: allocation, registration by sequence hash, reuse and eviction.
//!
//! A pool owns the blocks of one [`BlockLayout`]. Every block is in exactly one place:
//!
//! * the **free list**: Reset blocks in FIFO order (returned blocks go to the back,
//!   allocation takes from the front);
//! * the **inactive set**: Registered blocks nobody holds, kept for reuse, ordered by
//!   `(priority, return tick)`; the lowest key is evicted first (lowest priority, then least
//!   recently returned);
//! * **in use**: held by one [`MutableBlock`] or shared by [`ImmutableBlock`] handles.
//!   Registered in-use blocks are findable through a map of weak references.
//!
//! Invariants (checked by the property tests): `available + in_use == total`, where
//! `available` is free plus inactive; no block index is handed out twice; at most one
//! block per sequence hash is registered in a pool (registration deduplicates, and you may
//! get back a different block than the one you registered).
//!
//! An [`ImmutableBlock`] holds a strong reference to its parent (the block of the previous
//! sequence hash), so a parent returns to the inactive set only after all its children, with
//! a later tick: **leaves are evicted before their prefixes**.
//!
//! Handles return their block **synchronously** when the last one drops: the pool's state is
//! behind a mutex taken in `Drop`, so an allocation right after a drop sees the block. No
//! handle is ever dropped while the pool lock is held (that would deadlock); registrations
//! and parents released during an operation are dropped after the lock is released.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Weak};

use dynamo_kv_router::hashing::SequenceHash;
use parking_lot::Mutex;

use crate::block::{BlockState, TensorDesc, TokenBlock, block_tensor, layer_tensor};
use crate::error::{Error, Result};
use crate::events::Registry;
use crate::layout::BlockLayout;

pub use crate::tier::Tier;

#[derive(Debug)]
struct Slot {
    index: usize,
    state: BlockState,
    priority: u32,
}

impl Slot {
    fn sequence_hash(&self) -> Option<SequenceHash> {
        self.state.token_block().map(TokenBlock::sequence_hash)
    }
}

/// Eviction key: lowest priority first, then oldest return (LRU).
type InactiveKey = (u32, u64, SequenceHash);

#[derive(Debug, Default)]
struct PoolState {
    free: VecDeque<Slot>,
    inactive: BTreeMap<InactiveKey, Slot>,
    inactive_keys: HashMap<SequenceHash, InactiveKey>,
    active: HashMap<SequenceHash, Weak<ImmutableInner>>,
    tick: u64,
    in_use: usize,
}

impl PoolState {
    fn available(&self) -> usize {
        self.free.len() + self.inactive.len()
    }

    /// Return a slot to the back of the free list; its old state goes to `graveyard` so
    /// that a registration is released after the pool lock.
    fn free_slot(&mut self, mut slot: Slot, graveyard: &mut Vec<BlockState>) {
        graveyard.push(std::mem::take(&mut slot.state));
        slot.priority = 0;
        self.free.push_back(slot);
    }

    fn take_inactive(&mut self, hash: SequenceHash) -> Option<Slot> {
        let key = self.inactive_keys.remove(&hash)?;
        self.inactive.remove(&key)
    }

    fn live_active(&self, hash: SequenceHash) -> Option<ImmutableBlock> {
        self.active
            .get(&hash)
            .and_then(Weak::upgrade)
            .map(ImmutableBlock)
    }
}

pub(crate) struct PoolShared {
    tier: Tier,
    layout: Arc<BlockLayout>,
    registry: Registry,
    total: usize,
    state: Mutex<PoolState>,
}

impl fmt::Debug for PoolShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockPool")
            .field("tier", &self.tier)
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

/// A pool of blocks over one layout. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct BlockPool(Arc<PoolShared>);

impl BlockPool {
    /// A pool over every block of `layout`, reporting registrations to `registry`.
    pub fn new(tier: Tier, layout: Arc<BlockLayout>, registry: Registry) -> Self {
        let total = layout.config().num_blocks;
        let free = (0..total)
            .map(|index| Slot {
                index,
                state: BlockState::Reset,
                priority: 0,
            })
            .collect();
        Self(Arc::new(PoolShared {
            tier,
            layout,
            registry,
            total,
            state: Mutex::new(PoolState {
                free,
                ..Default::default()
            }),
        }))
    }

    /// The tier.
    pub fn tier(&self) -> Tier {
        self.0.tier
    }

    /// The layout (and so the memory) of the pool's blocks.
    pub fn layout(&self) -> &Arc<BlockLayout> {
        &self.0.layout
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.0.total
    }

    /// Blocks an allocation can take now: free plus evictable (inactive registered).
    pub fn available_blocks(&self) -> usize {
        self.0.state.lock().available()
    }

    /// Blocks held by handles.
    pub fn in_use_blocks(&self) -> usize {
        self.0.state.lock().in_use
    }

    /// Whether a block with `hash` is registered in this pool (in use or inactive).
    pub fn contains(&self, hash: SequenceHash) -> bool {
        let st = self.0.state.lock();
        st.inactive_keys.contains_key(&hash)
            || st.active.get(&hash).is_some_and(|w| w.strong_count() > 0)
    }

    /// Allocate `count` Reset blocks, all or nothing: free blocks first (FIFO), then by
    /// evicting inactive registered blocks in `(priority, return tick)` order.
    ///
    /// # Errors
    /// [`Error::NotEnoughBlocks`] when fewer than `count` blocks are available; nothing is
    /// allocated then.
    pub fn allocate_blocks(&self, count: usize) -> Result<Vec<MutableBlock>> {
        let mut graveyard = Vec::new();
        let slots = {
            let mut st = self.0.state.lock();
            let available = st.available();
            if count > available {
                return Err(Error::NotEnoughBlocks {
                    requested: count,
                    available,
                });
            }
            let mut slots = Vec::with_capacity(count);
            for _ in 0..count {
                let slot = match st.free.pop_front() {
                    Some(slot) => slot,
                    None => {
                        let Some((key, mut slot)) = st.inactive.pop_first() else {
                            unreachable!("available() counted this block");
                        };
                        st.inactive_keys.remove(&key.2);
                        graveyard.push(std::mem::take(&mut slot.state));
                        slot.priority = 0;
                        slot
                    }
                };
                slots.push(slot);
            }
            st.in_use += count;
            slots
        };
        // Evicted registrations are released here, outside the pool lock: this may publish
        // Removed events.
        drop(graveyard);
        Ok(slots
            .into_iter()
            .map(|slot| MutableBlock {
                slot: Some(slot),
                pool: self.0.clone(),
            })
            .collect())
    }

    /// Register complete blocks (in sequence order) and return shared handles.
    ///
    /// Per block: if the pool already holds its sequence hash (in use or inactive), that
    /// block is returned and the one passed in goes back to the free list (dedup); otherwise
    /// the block becomes Registered, which publishes a Stored event if no tier held the
    /// prefix yet.
    ///
    /// # Errors
    /// [`Error::InvalidState`] if any block is not Complete, [`Error::InvalidConfig`] if a
    /// block belongs to another pool; nothing is registered then (the blocks are freed).
    pub fn register_blocks(&self, blocks: Vec<MutableBlock>) -> Result<Vec<ImmutableBlock>> {
        Ok(self
            .register_blocks_inner(blocks)?
            .into_iter()
            .map(|(b, _)| b)
            .collect())
    }

    /// Like [`Self::register_blocks`], also telling whether each block was newly registered
    /// in this pool (and so is a candidate for offload).
    pub(crate) fn register_blocks_inner(
        &self,
        blocks: Vec<MutableBlock>,
    ) -> Result<Vec<(ImmutableBlock, bool)>> {
        for b in &blocks {
            if !Arc::ptr_eq(&b.pool, &self.0) {
                return Err(Error::InvalidConfig("block belongs to another pool".into()));
            }
            if !matches!(b.state(), BlockState::Complete(_)) {
                return Err(Error::InvalidState {
                    expected: "complete",
                    actual: b.state().name(),
                });
            }
        }
        let mut out = Vec::with_capacity(blocks.len());
        let mut graveyard = Vec::new();
        for mut block in blocks {
            let Some(mut slot) = block.slot.take() else {
                continue;
            };
            let state = std::mem::take(&mut slot.state);
            let BlockState::Complete(tb) = state else {
                unreachable!("checked above");
            };
            let hash = tb.sequence_hash();
            let mut st = self.0.state.lock();
            if let Some(existing) = st.live_active(hash) {
                st.in_use -= 1;
                st.free_slot(slot, &mut graveyard);
                out.push((existing, false));
                continue;
            }
            let (registered, newly) = match st.take_inactive(hash) {
                Some(revived) => {
                    // The inactive copy keeps its registration; ours is a duplicate.
                    st.free_slot(slot, &mut graveyard);
                    (revived, false)
                }
                None => {
                    let handle =
                        self.0
                            .registry
                            .register(hash, tb.local_hash(), tb.parent_sequence_hash());
                    slot.state = BlockState::Registered(tb, handle);
                    (slot, true)
                }
            };
            let block = activate(&mut st, &self.0, registered);
            out.push((block, newly));
        }
        drop(graveyard);
        Ok(out)
    }

    /// The longest cached prefix of `hashes`: walks them in order and stops at the first
    /// hash this pool does not hold.
    pub fn match_sequence_hashes(&self, hashes: &[SequenceHash]) -> Vec<ImmutableBlock> {
        let mut st = self.0.state.lock();
        let mut out = Vec::new();
        for &hash in hashes {
            if let Some(b) = st.live_active(hash) {
                out.push(b);
            } else if let Some(slot) = st.take_inactive(hash) {
                st.in_use += 1;
                let b = activate(&mut st, &self.0, slot);
                out.push(b);
            } else {
                break;
            }
        }
        out
    }
}

/// Make a registered slot (taken from the free list or the inactive set) an in-use shared
/// block. The caller has counted it in `in_use`.
fn activate(st: &mut PoolState, pool: &Arc<PoolShared>, slot: Slot) -> ImmutableBlock {
    let tb = slot.state.token_block();
    let hash = tb.map(TokenBlock::sequence_hash);
    let parent = tb
        .and_then(TokenBlock::parent_sequence_hash)
        .and_then(|p| st.live_active(p));
    let inner = Arc::new(ImmutableInner {
        slot: Some(slot),
        parent,
        pool: pool.clone(),
    });
    if let Some(hash) = hash {
        st.active.insert(hash, Arc::downgrade(&inner));
    }
    ImmutableBlock(inner)
}

/// A block owned by one holder: fill it, then register it or drop it (back to the free
/// list, synchronously).
pub struct MutableBlock {
    slot: Option<Slot>,
    pool: Arc<PoolShared>,
}

impl fmt::Debug for MutableBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutableBlock")
            .field("index", &self.block_index())
            .field("state", &self.state().name())
            .finish()
    }
}

impl MutableBlock {
    fn slot(&self) -> &Slot {
        self.slot
            .as_ref()
            .expect("slot is present until drop or registration")
    }

    fn slot_mut(&mut self) -> &mut Slot {
        self.slot
            .as_mut()
            .expect("slot is present until drop or registration")
    }

    /// The block's index in its layout.
    pub fn block_index(&self) -> usize {
        self.slot().index
    }

    /// The block's state.
    pub fn state(&self) -> &BlockState {
        &self.slot().state
    }

    /// The layout holding the block's memory.
    pub fn layout(&self) -> &Arc<BlockLayout> {
        &self.pool.layout
    }

    /// The pool's tier.
    pub fn tier(&self) -> Tier {
        self.pool.tier
    }

    /// Eviction priority once registered and returned: lower values are evicted first.
    pub fn set_priority(&mut self, priority: u32) {
        self.slot_mut().priority = priority;
    }

    fn page_size(&self) -> usize {
        self.pool.layout.config().page_size
    }

    /// Reset → Partial: start a sequence block hashed with `seed` after `parent`.
    ///
    /// # Errors
    /// [`Error::InvalidState`] unless Reset.
    pub fn init_sequence(&mut self, seed: u64, parent: Option<SequenceHash>) -> Result<()> {
        self.slot_mut().state.init_sequence(seed, parent)
    }

    /// Append tokens to a Partial block; returns the free slots left.
    ///
    /// # Errors
    /// [`Error::BlockFull`] if they do not fit; [`Error::InvalidState`] unless Partial.
    pub fn add_tokens(&mut self, tokens: &[u32]) -> Result<usize> {
        let cap = self.page_size();
        self.slot_mut().state.add_tokens(tokens, cap)
    }

    /// Remove the last `count` tokens of a Partial block.
    ///
    /// # Errors
    /// [`Error::InvalidState`] unless Partial; [`Error::InvalidConfig`] for too many.
    pub fn pop_tokens(&mut self, count: usize) -> Result<()> {
        self.slot_mut().state.pop_tokens(count)
    }

    /// Partial (full) → Complete: hash the tokens.
    ///
    /// # Errors
    /// [`Error::InvalidState`] unless a full Partial block.
    pub fn commit(&mut self) -> Result<()> {
        let cap = self.page_size();
        self.slot_mut().state.commit(cap)
    }

    /// Reset → Complete with a known token block (data copied from another tier).
    ///
    /// # Errors
    /// [`Error::InvalidState`] unless Reset; [`Error::InvalidConfig`] for a wrong length.
    pub fn apply_token_block(&mut self, tb: TokenBlock) -> Result<()> {
        let cap = self.page_size();
        self.slot_mut().state.apply_token_block(tb, cap)
    }

    /// Any state → Reset.
    pub fn reset(&mut self) {
        self.slot_mut().state = BlockState::Reset;
    }

    /// The whole block as a `(1, L, O, P, I)` tensor.
    ///
    /// # Errors
    /// See [`block_tensor`].
    pub fn block_tensor(&self) -> Result<TensorDesc> {
        block_tensor(&self.pool.layout, self.block_index())
    }

    /// One layer as a `(1, 1, O, P, I)` tensor.
    ///
    /// # Errors
    /// See [`layer_tensor`].
    pub fn layer_tensor(&self, layer: usize) -> Result<TensorDesc> {
        layer_tensor(&self.pool.layout, self.block_index(), layer)
    }
}

impl Drop for MutableBlock {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let mut graveyard = Vec::new();
            {
                let mut st = self.pool.state.lock();
                st.in_use -= 1;
                st.free_slot(slot, &mut graveyard);
            }
            drop(graveyard);
        }
    }
}

struct ImmutableInner {
    slot: Option<Slot>,
    parent: Option<ImmutableBlock>,
    pool: Arc<PoolShared>,
}

impl ImmutableInner {
    fn slot(&self) -> &Slot {
        self.slot.as_ref().expect("slot is present until drop")
    }
}

/// A registered block shared by every holder; the block becomes inactive (cached, evictable)
/// when the last handle drops.
#[derive(Clone)]
pub struct ImmutableBlock(Arc<ImmutableInner>);

impl fmt::Debug for ImmutableBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImmutableBlock")
            .field("index", &self.block_index())
            .field("sequence_hash", &self.sequence_hash())
            .finish()
    }
}

impl ImmutableBlock {
    /// The block's index in its layout.
    pub fn block_index(&self) -> usize {
        self.0.slot().index
    }

    /// The registered token block.
    pub fn token_block(&self) -> &TokenBlock {
        self.0
            .slot()
            .state
            .token_block()
            .expect("immutable blocks are registered")
    }

    /// The prefix hash.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.token_block().sequence_hash()
    }

    /// The eviction priority.
    pub fn priority(&self) -> u32 {
        self.0.slot().priority
    }

    /// The layout holding the block's memory.
    pub fn layout(&self) -> &Arc<BlockLayout> {
        &self.0.pool.layout
    }

    /// The pool's tier.
    pub fn tier(&self) -> Tier {
        self.0.pool.tier
    }

    /// The parent block, when it is in use in the same pool.
    pub fn parent(&self) -> Option<&ImmutableBlock> {
        self.0.parent.as_ref()
    }

    /// Whether two handles share one block.
    pub fn ptr_eq(&self, other: &ImmutableBlock) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The whole block as a `(1, L, O, P, I)` tensor.
    ///
    /// # Errors
    /// See [`block_tensor`].
    pub fn block_tensor(&self) -> Result<TensorDesc> {
        block_tensor(self.layout(), self.block_index())
    }

    /// One layer as a `(1, 1, O, P, I)` tensor.
    ///
    /// # Errors
    /// See [`layer_tensor`].
    pub fn layer_tensor(&self, layer: usize) -> Result<TensorDesc> {
        layer_tensor(self.layout(), self.block_index(), layer)
    }
}

impl ImmutableInner {
    /// Move the slot to the inactive set (or the free list if the pool meanwhile registered
    /// another block with the same hash).
    fn release_slot(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let mut graveyard = Vec::new();
        {
            let mut st = self.pool.state.lock();
            st.in_use -= 1;
            let hash = slot.sequence_hash();
            match hash {
                Some(hash)
                    if !st.inactive_keys.contains_key(&hash)
                        && st.active.get(&hash).is_none_or(|w| w.strong_count() == 0) =>
                {
                    st.active.remove(&hash);
                    st.tick += 1;
                    let key = (slot.priority, st.tick, hash);
                    st.inactive_keys.insert(hash, key);
                    st.inactive.insert(key, slot);
                }
                _ => st.free_slot(slot, &mut graveyard),
            }
        }
        drop(graveyard);
    }
}

impl Drop for ImmutableInner {
    fn drop(&mut self) {
        self.release_slot();
        // Release the parent chain iteratively: a long prompt's chain would otherwise recurse
        // once per block. Each parent we own exclusively returns to the pool after its
        // child, so it gets a later tick than the child.
        let mut next = self.parent.take();
        while let Some(parent) = next {
            match Arc::try_unwrap(parent.0) {
                Ok(mut inner) => {
                    inner.release_slot();
                    next = inner.parent.take();
                }
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests;
