//! KV routing bindings: block hashing.

use dynamo_kv_router::hashing::{self, BlockHashOptions};
use pyo3::prelude::*;

use crate::{convert, errors};

/// Prompts at least this long are hashed with the GIL released. Below it, releasing and
/// re-acquiring the GIL (~0.2 µs) costs more than hashing (~4 ns per 16-token block).
const DETACH_MIN_TOKENS: usize = 16_384;

/// Local block hashes (`tokens_hash`) of every complete block of `tokens`.
#[pyfunction]
#[pyo3(signature = (tokens, kv_block_size, block_mm_infos=None, lora_name=None, is_eagle=None, cache_namespace=None))]
pub(crate) fn compute_block_hash_for_seq(
    py: Python<'_>,
    tokens: &Bound<'_, PyAny>,
    kv_block_size: usize,
    block_mm_infos: Option<&Bound<'_, PyAny>>,
    lora_name: Option<&str>,
    is_eagle: Option<bool>,
    cache_namespace: Option<&str>,
) -> PyResult<Vec<u64>> {
    let tokens = convert::tokens(tokens)?;
    let mm = block_mm_infos
        .filter(|o| !o.is_none())
        .map(convert::block_mm_infos)
        .transpose()?;
    let options = BlockHashOptions {
        block_mm_infos: mm.as_deref(),
        lora_name,
        cache_namespace,
        is_eagle: is_eagle.unwrap_or(false),
    };
    let run = || hashing::compute_block_hash_for_seq(&tokens, kv_block_size, &options);
    let hashes = if tokens.len() >= DETACH_MIN_TOKENS {
        py.detach(run)
    } else {
        run()
    }
    .map_err(errors::kv_router_error)?;
    // `LocalBlockHash` is a transparent u64; converting here keeps the core type strong.
    Ok(hashes.into_iter().map(|h| h.0).collect())
}

/// Register the KV routing classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(compute_block_hash_for_seq, m)?)?;
    Ok(())
}
