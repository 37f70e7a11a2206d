//! KV routing bindings: block hashing, the radix-tree indexer and its overlap scores.

use std::time::Duration;

use dynamo_kv_router::hashing::{self, BlockHashOptions, LocalBlockHash};
use dynamo_kv_router::indexer::{self, SharedRadixTree};
use dynamo_kv_router::protocols::encode_json_router_event;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

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

/// Result of a prefix match: matched blocks per `(worker_id, dp_rank)`.
#[pyclass(module = "dynamo._core", name = "OverlapScores", frozen)]
pub(crate) struct OverlapScores {
    pub(crate) inner: indexer::OverlapScores,
}

#[pymethods]
impl OverlapScores {
    /// `{(worker_id, dp_rank): matched_blocks}` (a new dict on every access).
    #[getter]
    fn scores<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (w, score) in &self.inner.scores {
            dict.set_item(
                PyTuple::new(py, [w.worker_id, u64::from(w.dp_rank)])?,
                score,
            )?;
        }
        Ok(dict)
    }

    /// Per matched depth, recent lookups of that block (zeros omitted).
    #[getter]
    fn frequencies(&self) -> Vec<usize> {
        self.inner.frequencies.clone()
    }

    fn __repr__(&self) -> String {
        let scores: Vec<String> = self
            .inner
            .scores
            .iter()
            .map(|(w, s)| format!("({}, {}): {s}", w.worker_id, w.dp_rank))
            .collect();
        format!(
            "OverlapScores(scores={{{}}}, frequencies={:?})",
            scores.join(", "),
            self.inner.frequencies
        )
    }
}

/// In-process prefix index of which `(worker_id, dp_rank)` holds which cached blocks.
#[pyclass(module = "dynamo._core", name = "RadixTree", frozen)]
pub(crate) struct RadixTree {
    inner: SharedRadixTree,
}

#[pymethods]
impl RadixTree {
    #[new]
    #[pyo3(signature = (expiration_duration_secs=None))]
    fn new(expiration_duration_secs: Option<f64>) -> PyResult<Self> {
        let expiration = expiration_duration_secs
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|e| {
                PyValueError::new_err(format!(
                    "expiration_duration_secs must be a finite non-negative number ({e})"
                ))
            })?;
        Ok(Self {
            inner: SharedRadixTree::new(expiration),
        })
    }

    #[pyo3(signature = (sequence, early_exit=false))]
    fn find_matches(&self, py: Python<'_>, sequence: Vec<u64>, early_exit: bool) -> OverlapScores {
        let query: Vec<LocalBlockHash> = sequence.into_iter().map(LocalBlockHash).collect();
        let inner = py.detach(|| self.inner.find_matches(&query, early_exit));
        OverlapScores { inner }
    }

    #[pyo3(signature = (worker_id, kv_cache_event_bytes))]
    fn apply_event(
        &self,
        py: Python<'_>,
        worker_id: u64,
        kv_cache_event_bytes: &[u8],
    ) -> PyResult<()> {
        py.detach(|| self.inner.apply_json(worker_id, kv_cache_event_bytes))
            .map_err(errors::kv_router_error)
    }

    #[pyo3(signature = (worker_id))]
    fn remove_worker(&self, py: Python<'_>, worker_id: u64) {
        py.detach(|| self.inner.remove_worker(worker_id));
    }

    #[pyo3(signature = (worker_id))]
    fn clear_all_blocks(&self, py: Python<'_>, worker_id: u64) {
        py.detach(|| self.inner.clear_all_blocks(worker_id));
    }

    #[pyo3(signature = ())]
    fn dump_tree_as_events(&self, py: Python<'_>) -> Vec<String> {
        py.detach(|| {
            self.inner
                .dump_events()
                .iter()
                .map(encode_json_router_event)
                .collect()
        })
    }

    /// Number of distinct cached blocks (tree nodes, the root excluded).
    #[pyo3(signature = ())]
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }

    /// Number of stored `(worker rank, block)` pairs.
    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// Register the KV routing classes and functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(compute_block_hash_for_seq, m)?)?;
    m.add_class::<OverlapScores>()?;
    m.add_class::<RadixTree>()?;
    Ok(())
}
