//! Block hashing shared by the router, the indexer, the mocker and the block manager.
//!
//! The values computed here travel on the wire (KV events, overlap queries), so they are
//! bit-identical to the reference implementation:
//!
//! * A block's **local hash** ([`LocalBlockHash`], the `tokens_hash` of a KV event) is
//!   XXH3-64 over the block's tokens encoded as `u32` little-endian, seeded with
//!   [`XXH3_SEED`] (1337) or the salted seed of [`salt_seed`].
//! * Only complete blocks are hashed; a trailing partial block is dropped.
//! * Multimodal blocks append their objects' `mm_hash` values, sorted ascending, as `u64`
//!   little-endian after the token bytes. Offsets are not hashed.
//! * Eagle (speculative decoding) mode hashes windows of `block_size + 1` tokens with a
//!   stride of `block_size`.
//! * A **sequence hash** ([`SequenceHash`]) chains local hashes:
//!   `seq[0] = local[0]`, `seq[i] = xxh3(LE8(seq[i-1]) ++ LE8(local[i]), 1337)`. The chain
//!   seed is always 1337: salts enter only through the local hashes.
//!
//! ```
//! use dynamo_kv_router::hashing::{compute_block_hash_for_seq, compute_seq_hash_for_block, BlockHashOptions};
//!
//! let tokens: Vec<u32> = (0..8).collect();
//! let local = compute_block_hash_for_seq(&tokens, 4, &BlockHashOptions::default()).unwrap();
//! assert_eq!(local.len(), 2);
//! assert_eq!(local[0].0, 9_143_094_415_614_847_814);
//! let seq = compute_seq_hash_for_block(&local);
//! assert_eq!(seq[0].0, local[0].0);
//! assert_eq!(seq[1].0, 9_510_318_385_840_434_533);
//! ```

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::{Error, Result};

/// Seed of every block hash and of the sequence-hash chain (the reference's `XXH3_SEED`).
pub const XXH3_SEED: u64 = 1337;

/// Inner seed used to hash a LoRA adapter name into the block seed.
const LORA_NAME_SEED: u64 = 0;
/// Inner seed used to hash a cache namespace (salt) into the block seed. It differs from
/// [`LORA_NAME_SEED`] so that `lora_name = X` and `cache_namespace = X` give distinct hashes.
const CACHE_NAMESPACE_SEED: u64 = 1;

/// Hash of one block's content (tokens plus multimodal identifiers), independent of its
/// position in the sequence. This is the `tokens_hash` of a KV event.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
#[repr(transparent)]
pub struct LocalBlockHash(pub u64);

/// Hash of a block together with every block before it (a chained hash).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
#[repr(transparent)]
pub struct SequenceHash(pub u64);

/// One multimodal object (an image, an audio clip, ...) that overlaps a block.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct BlockMmObjectInfo {
    /// Content hash of the object; it changes the block's hash.
    pub mm_hash: u64,
    /// `(start, end)` token ranges of the object, relative to the block. Carried for the
    /// engine; **not** part of the hash.
    pub offsets: Vec<(usize, usize)>,
}

/// Per-block multimodal information (`mm_extra_info` of a KV event).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct BlockExtraInfo {
    /// Objects overlapping the block; an empty list hashes like a plain block.
    pub mm_objects: Vec<BlockMmObjectInfo>,
}

/// Options that change how blocks are hashed. The default hashes plain token blocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockHashOptions<'a> {
    /// Per-block multimodal info, indexed by block number. Missing entries (the slice is
    /// shorter than the block count) and `None` entries hash as plain blocks.
    pub block_mm_infos: Option<&'a [Option<BlockExtraInfo>]>,
    /// LoRA adapter name; `None` and `""` mean the base model.
    pub lora_name: Option<&'a str>,
    /// Cache namespace (salt) that isolates tenants; `None` and `""` mean no namespace.
    pub cache_namespace: Option<&'a str>,
    /// Eagle mode: each block also covers the first token of the next block.
    pub is_eagle: bool,
}

/// The seed a block hash uses for the given LoRA adapter and cache namespace.
///
/// `1337`, plus `xxh3(lora_name, 0)` when a LoRA name is given, plus
/// `xxh3(cache_namespace, 1)` when a namespace is given (wrapping arithmetic). Empty
/// strings count as absent.
pub fn salt_seed(lora_name: Option<&str>, cache_namespace: Option<&str>) -> u64 {
    let mut seed = XXH3_SEED;
    if let Some(name) = lora_name.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(name.as_bytes(), LORA_NAME_SEED));
    }
    if let Some(ns) = cache_namespace.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(ns.as_bytes(), CACHE_NAMESPACE_SEED));
    }
    seed
}

/// Hash one block of tokens (no multimodal info) with `seed`.
#[inline]
pub fn hash_token_block(tokens: &[u32], seed: u64) -> LocalBlockHash {
    LocalBlockHash(xxh3_64_with_seed(token_bytes(tokens).as_ref(), seed))
}

/// Hash one block of tokens followed by the sorted multimodal hashes of `info`.
pub fn hash_token_block_with_mm(
    tokens: &[u32],
    info: Option<&BlockExtraInfo>,
    seed: u64,
) -> LocalBlockHash {
    let Some(info) = info.filter(|i| !i.mm_objects.is_empty()) else {
        return hash_token_block(tokens, seed);
    };
    let mut mm_hashes: Vec<u64> = info.mm_objects.iter().map(|o| o.mm_hash).collect();
    mm_hashes.sort_unstable();
    let mut bytes = Vec::with_capacity(tokens.len() * 4 + mm_hashes.len() * 8);
    bytes.extend_from_slice(token_bytes(tokens).as_ref());
    for h in mm_hashes {
        bytes.extend_from_slice(&h.to_le_bytes());
    }
    LocalBlockHash(xxh3_64_with_seed(&bytes, seed))
}

/// The little-endian byte image of `tokens`: borrowed on little-endian hosts, copied on
/// big-endian ones.
#[inline]
fn token_bytes(tokens: &[u32]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(tokens))
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(tokens.iter().flat_map(|t| t.to_le_bytes()).collect())
    }
}

/// Number of complete blocks that [`compute_block_hash_for_seq`] produces for `num_tokens`.
pub fn num_complete_blocks(num_tokens: usize, block_size: usize, is_eagle: bool) -> usize {
    if block_size == 0 {
        0
    } else if is_eagle {
        num_tokens.saturating_sub(1) / block_size
    } else {
        num_tokens / block_size
    }
}

/// Local hashes of every complete block of `tokens`.
///
/// # Errors
/// [`Error::ZeroBlockSize`] when `block_size == 0`.
pub fn compute_block_hash_for_seq(
    tokens: &[u32],
    block_size: usize,
    options: &BlockHashOptions<'_>,
) -> Result<Vec<LocalBlockHash>> {
    if block_size == 0 {
        return Err(Error::ZeroBlockSize);
    }
    let seed = salt_seed(options.lora_name, options.cache_namespace);
    let count = num_complete_blocks(tokens.len(), block_size, options.is_eagle);
    let window = if options.is_eagle {
        block_size + 1
    } else {
        block_size
    };
    let mm_infos = options.block_mm_infos.unwrap_or(&[]);

    let mut out = Vec::with_capacity(count);
    if mm_infos.iter().all(Option::is_none) && !options.is_eagle {
        // Hot path: plain, non-overlapping blocks.
        out.extend(
            tokens
                .chunks_exact(block_size)
                .map(|block| hash_token_block(block, seed)),
        );
        return Ok(out);
    }
    for i in 0..count {
        let start = i * block_size;
        let block = &tokens[start..start + window];
        let info = mm_infos.get(i).and_then(Option::as_ref);
        out.push(hash_token_block_with_mm(block, info, seed));
    }
    Ok(out)
}

/// Chain one more block onto a sequence hash.
#[inline]
pub fn chain_seq_hash(parent: SequenceHash, local: LocalBlockHash) -> SequenceHash {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.0.to_le_bytes());
    bytes[8..].copy_from_slice(&local.0.to_le_bytes());
    SequenceHash(xxh3_64_with_seed(&bytes, XXH3_SEED))
}

/// Sequence hashes of a run of local hashes starting at the root:
/// `seq[0] = local[0]`, `seq[i] = chain_seq_hash(seq[i-1], local[i])`.
pub fn compute_seq_hash_for_block(local: &[LocalBlockHash]) -> Vec<SequenceHash> {
    let mut out = Vec::with_capacity(local.len());
    let mut iter = local.iter();
    if let Some(first) = iter.next() {
        let mut prev = SequenceHash(first.0);
        out.push(prev);
        for &l in iter {
            prev = chain_seq_hash(prev, l);
            out.push(prev);
        }
    }
    out
}

#[cfg(test)]
mod tests;
