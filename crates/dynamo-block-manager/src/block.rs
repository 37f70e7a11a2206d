//! Block contents: token sequences, hashes and the block state machine.
//!
//! ```text
//! Reset ──init_sequence──▶ Partial ──add_tokens… / commit──▶ Complete ──register──▶ Registered
//!   ▲ └────────────────apply_token_block─────────────────────▶ ▲                       │
//!   └──────────────── reset (any state), eviction ◀──────────────────────────────────┘
//! ```
//!
//! Hashes come from the shared `dynamo_kv_router::hashing` module, so they are exactly the
//! hashes the KV router computes for the same tokens, LoRA and cache namespace: the local
//! hash is XXH3 of the tokens seeded by [`KvbmRequest::salt_seed`], and the sequence hash
//! chains it onto the parent block's sequence hash.

use std::sync::Arc;

use dynamo_kv_router::hashing::{
    LocalBlockHash, SequenceHash, chain_seq_hash, hash_token_block, salt_seed,
};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::events::RegistrationHandle;
use crate::layout::BlockLayout;
use crate::storage::MemoryKind;

/// The identity of a request for hashing purposes: its salt and LoRA adapter. Two requests
/// with a different salt or LoRA never share cached blocks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct KvbmRequest {
    /// The request's id (informational).
    pub request_id: String,
    /// LoRA adapter name; `None` for the base model.
    pub lora_name: Option<String>,
    /// Cache salt (the router's cache namespace); `None` for none.
    pub salt: Option<String>,
}

impl KvbmRequest {
    /// A request descriptor.
    pub fn new(
        request_id: impl Into<String>,
        lora_name: Option<String>,
        salt: Option<String>,
    ) -> Self {
        Self {
            request_id: request_id.into(),
            lora_name,
            salt,
        }
    }

    /// The seed of this request's block hashes (the router's `salt_seed(lora, namespace)`).
    pub fn salt_seed(&self) -> u64 {
        salt_seed(self.lora_name.as_deref(), self.salt.as_deref())
    }
}

/// A complete block of tokens with its hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBlock {
    tokens: Vec<u32>,
    seed: u64,
    parent: Option<SequenceHash>,
    local: LocalBlockHash,
    sequence: SequenceHash,
}

impl TokenBlock {
    /// Hash `tokens` with `seed` and chain onto `parent` (`None` for a first block).
    pub fn new(tokens: Vec<u32>, seed: u64, parent: Option<SequenceHash>) -> Self {
        let local = hash_token_block(&tokens, seed);
        let sequence = match parent {
            None => SequenceHash(local.0),
            Some(p) => chain_seq_hash(p, local),
        };
        Self {
            tokens,
            seed,
            parent,
            local,
            sequence,
        }
    }

    /// The complete blocks of `tokens` in blocks of `page_size` for `request`; a trailing
    /// partial block is dropped (like the router).
    pub fn split(tokens: &[u32], page_size: usize, request: &KvbmRequest) -> Vec<TokenBlock> {
        let seed = request.salt_seed();
        let mut parent = None;
        tokens
            .chunks_exact(page_size.max(1))
            .map(|chunk| {
                let b = TokenBlock::new(chunk.to_vec(), seed, parent);
                parent = Some(b.sequence);
                b
            })
            .collect()
    }

    /// The tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The hash seed (salt).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The previous block's sequence hash.
    pub fn parent_sequence_hash(&self) -> Option<SequenceHash> {
        self.parent
    }

    /// The content hash (`tokens_hash` of a KV event).
    pub fn local_hash(&self) -> LocalBlockHash {
        self.local
    }

    /// The prefix hash (`block_hash` of a KV event).
    pub fn sequence_hash(&self) -> SequenceHash {
        self.sequence
    }
}

/// A block being filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialBlock {
    seed: u64,
    parent: Option<SequenceHash>,
    tokens: Vec<u32>,
}

/// The state of a block.
#[derive(Debug, Default)]
#[non_exhaustive]
pub enum BlockState {
    /// No sequence: free or freshly allocated.
    #[default]
    Reset,
    /// Accumulating tokens.
    Partial(PartialBlock),
    /// Full, hashed, not yet registered.
    Complete(TokenBlock),
    /// Registered in a pool: reusable by sequence hash, reported to the router.
    Registered(TokenBlock, Arc<RegistrationHandle>),
}

impl BlockState {
    /// The state's name.
    pub fn name(&self) -> &'static str {
        match self {
            BlockState::Reset => "reset",
            BlockState::Partial(_) => "partial",
            BlockState::Complete(_) => "complete",
            BlockState::Registered(..) => "registered",
        }
    }

    /// The token block of a complete or registered block.
    pub fn token_block(&self) -> Option<&TokenBlock> {
        match self {
            BlockState::Complete(tb) | BlockState::Registered(tb, _) => Some(tb),
            _ => None,
        }
    }

    pub(crate) fn init_sequence(&mut self, seed: u64, parent: Option<SequenceHash>) -> Result<()> {
        self.expect_reset()?;
        *self = BlockState::Partial(PartialBlock {
            seed,
            parent,
            tokens: Vec::new(),
        });
        Ok(())
    }

    pub(crate) fn add_tokens(&mut self, tokens: &[u32], capacity: usize) -> Result<usize> {
        let BlockState::Partial(p) = self else {
            return Err(self.invalid("partial"));
        };
        if p.tokens.len() + tokens.len() > capacity {
            return Err(Error::BlockFull(capacity));
        }
        p.tokens.extend_from_slice(tokens);
        Ok(capacity - p.tokens.len())
    }

    pub(crate) fn pop_tokens(&mut self, count: usize) -> Result<()> {
        let BlockState::Partial(p) = self else {
            return Err(self.invalid("partial"));
        };
        if count > p.tokens.len() {
            return Err(Error::InvalidConfig(format!(
                "cannot pop {count} tokens from a block holding {}",
                p.tokens.len()
            )));
        }
        p.tokens.truncate(p.tokens.len() - count);
        Ok(())
    }

    pub(crate) fn commit(&mut self, capacity: usize) -> Result<()> {
        let BlockState::Partial(p) = self else {
            return Err(self.invalid("partial"));
        };
        if p.tokens.len() != capacity {
            return Err(Error::InvalidState {
                expected: "full",
                actual: "partial",
            });
        }
        let tb = TokenBlock::new(std::mem::take(&mut p.tokens), p.seed, p.parent);
        *self = BlockState::Complete(tb);
        Ok(())
    }

    pub(crate) fn apply_token_block(&mut self, tb: TokenBlock, capacity: usize) -> Result<()> {
        self.expect_reset()?;
        if tb.tokens.len() != capacity {
            return Err(Error::InvalidConfig(format!(
                "token block has {} tokens, the block holds {capacity}",
                tb.tokens.len()
            )));
        }
        *self = BlockState::Complete(tb);
        Ok(())
    }

    fn expect_reset(&self) -> Result<()> {
        match self {
            BlockState::Reset => Ok(()),
            other => Err(other.invalid("reset")),
        }
    }

    fn invalid(&self, expected: &'static str) -> Error {
        Error::InvalidState {
            expected,
            actual: self.name(),
        }
    }
}

/// A C-contiguous tensor over block memory, for DLPack export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// Address of the first element.
    pub addr: u64,
    /// `(1, L, O, P, I)` for a block, `(1, 1, O, P, I)` for a layer.
    pub shape: [usize; 5],
    /// Element type.
    pub dtype: DType,
    /// Where the memory lives.
    pub memory: MemoryKind,
}

impl TensorDesc {
    /// C-contiguous strides in elements.
    pub fn strides(&self) -> [usize; 5] {
        let mut strides = [1usize; 5];
        for i in (0..4).rev() {
            strides[i] = strides[i + 1] * self.shape[i + 1];
        }
        strides
    }

    /// Total bytes.
    pub fn size_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_bytes()
    }
}

/// The whole block `block` of `layout` as a `(1, L, O, P, I)` tensor.
///
/// # Errors
/// [`Error::NotContiguous`] for layer-separate layouts; [`Error::IndexOutOfRange`].
pub fn block_tensor(layout: &BlockLayout, block: usize) -> Result<TensorDesc> {
    let region = layout.block_region(block)?;
    let c = layout.config();
    Ok(TensorDesc {
        addr: layout.addr(region),
        shape: [1, c.num_layers, c.outer_dim, c.page_size, c.inner_dim],
        dtype: c.dtype,
        memory: layout.memory_kind(),
    })
}

/// Layer `layer` of block `block` as a `(1, 1, O, P, I)` tensor.
///
/// # Errors
/// [`Error::NotContiguous`] when the layer's pages are not adjacent;
/// [`Error::IndexOutOfRange`].
pub fn layer_tensor(layout: &BlockLayout, block: usize, layer: usize) -> Result<TensorDesc> {
    let region = layout.layer_region(block, layer)?;
    let c = layout.config();
    Ok(TensorDesc {
        addr: layout.addr(region),
        shape: [1, 1, c.outer_dim, c.page_size, c.inner_dim],
        dtype: c.dtype,
        memory: layout.memory_kind(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_kv_router::hashing::{
        BlockHashOptions, compute_block_hash_for_seq, compute_seq_hash_for_block,
    };

    #[test]
    fn hashes_match_the_router() {
        let tokens: Vec<u32> = (0..40).collect();
        for (lora, salt) in [(None, None), (Some("adapter"), Some("tenant"))] {
            let req = KvbmRequest::new("r", lora.map(String::from), salt.map(String::from));
            let blocks = TokenBlock::split(&tokens, 16, &req);
            let opts = BlockHashOptions {
                lora_name: lora,
                cache_namespace: salt,
                ..Default::default()
            };
            let local = compute_block_hash_for_seq(&tokens, 16, &opts).unwrap();
            let seq = compute_seq_hash_for_block(&local);
            assert_eq!(blocks.len(), 2);
            for (i, b) in blocks.iter().enumerate() {
                assert_eq!(b.local_hash(), local[i]);
                assert_eq!(b.sequence_hash(), seq[i]);
            }
            assert_eq!(blocks[1].parent_sequence_hash(), Some(seq[0]));
        }
    }

    #[test]
    fn salt_separates_requests() {
        let tokens: Vec<u32> = (0..4).collect();
        let a = TokenBlock::split(&tokens, 4, &KvbmRequest::new("a", None, None));
        let b = TokenBlock::split(&tokens, 4, &KvbmRequest::new("b", None, Some("s".into())));
        let c = TokenBlock::split(&tokens, 4, &KvbmRequest::new("c", Some("l".into()), None));
        assert_ne!(a[0].sequence_hash(), b[0].sequence_hash());
        assert_ne!(a[0].sequence_hash(), c[0].sequence_hash());
        assert_ne!(b[0].sequence_hash(), c[0].sequence_hash());
    }

    #[test]
    fn state_machine_transitions() {
        let mut s = BlockState::default();
        assert!(s.add_tokens(&[1], 4).is_err());
        s.init_sequence(1337, None).unwrap();
        assert!(s.init_sequence(1337, None).is_err());
        assert_eq!(s.add_tokens(&[1, 2, 3], 4).unwrap(), 1);
        assert!(matches!(s.add_tokens(&[4, 5], 4), Err(Error::BlockFull(4))));
        assert!(s.commit(4).is_err(), "commit needs a full block");
        s.pop_tokens(1).unwrap();
        assert_eq!(s.add_tokens(&[3, 4], 4).unwrap(), 0);
        s.commit(4).unwrap();
        assert_eq!(s.name(), "complete");
        let tb = s.token_block().unwrap().clone();
        assert_eq!(tb, TokenBlock::new(vec![1, 2, 3, 4], 1337, None));
        let mut r = BlockState::default();
        r.apply_token_block(tb.clone(), 4).unwrap();
        assert_eq!(r.token_block(), Some(&tb));
        let mut wrong = BlockState::default();
        assert!(wrong.apply_token_block(tb, 8).is_err());
    }

    #[test]
    fn strides_are_c_contiguous() {
        let t = TensorDesc {
            addr: 0,
            shape: [1, 5, 2, 4, 13],
            dtype: DType::Fp32,
            memory: MemoryKind::System,
        };
        assert_eq!(t.strides(), [520, 104, 52, 13, 1]);
        assert_eq!(t.size_bytes(), 2080);
    }
}
