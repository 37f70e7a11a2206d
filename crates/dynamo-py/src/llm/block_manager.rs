//! Block manager bindings: `BlockManager`, `BlockList`, `Block`, `Layer`, `KvbmRequest`.
//!
//! Every Python object (and every exported tensor) holds an `Arc` of the block it views;
//! the block returns to its pool when the last one is gone. The pool keeps its memory alive,
//! so tensors may outlive the `BlockManager` too.

use std::sync::Arc;

use dynamo_block_manager::{
    DType, KvBlockManager, KvBlockManagerConfig, MutableBlock, NullEventSink, TensorDesc, Tier,
};
use pyo3::exceptions::{PyBufferError, PyIndexError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors;
use crate::llm::dlpack;

/// A KV block manager with an optional host pool (pinned memory, or system memory without
/// CUDA) and an optional device pool.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct BlockManager {
    inner: Arc<KvBlockManager>,
}

#[pymethods]
impl BlockManager {
    #[new]
    #[pyo3(signature = (worker_id, num_layer, outer_dim, page_size, inner_dim, dtype=None, host_num_blocks=None, device_num_blocks=None, device_id=0))]
    #[expect(
        clippy::too_many_arguments,
        reason = "the Python constructor's signature"
    )]
    fn new(
        py: Python<'_>,
        worker_id: u64,
        num_layer: usize,
        outer_dim: usize,
        page_size: usize,
        inner_dim: usize,
        dtype: Option<&str>,
        host_num_blocks: Option<usize>,
        device_num_blocks: Option<usize>,
        device_id: usize,
    ) -> PyResult<Self> {
        let dtype = match dtype {
            Some(s) => s.parse::<DType>().map_err(errors::block_manager_error)?,
            None => DType::Fp16,
        };
        let config = KvBlockManagerConfig::standard(
            worker_id,
            num_layer,
            outer_dim,
            page_size,
            inner_dim,
            dtype,
            host_num_blocks,
            device_num_blocks,
            device_id,
        );
        // Pinned allocations of large pools take seconds: let other threads run.
        let inner = py
            .detach(|| KvBlockManager::new(config, Arc::new(NullEventSink)))
            .map_err(errors::block_manager_error)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Tokens per block (`page_size`).
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    /// Allocate `count` host blocks now.
    #[pyo3(signature = (count))]
    fn allocate_host_blocks_blocking(&self, count: usize) -> PyResult<BlockList> {
        self.allocate(Tier::Host, count)
    }

    /// Allocate `count` host blocks; returns an awaitable.
    #[pyo3(signature = (count))]
    fn allocate_host_blocks(&self, py: Python<'_>, count: usize) -> PyResult<Ready> {
        Ready::new(py, self.allocate(Tier::Host, count))
    }

    /// Allocate `count` device blocks now.
    #[pyo3(signature = (count))]
    fn allocate_device_blocks_blocking(&self, count: usize) -> PyResult<BlockList> {
        self.allocate(Tier::Device, count)
    }

    /// Allocate `count` device blocks; returns an awaitable.
    #[pyo3(signature = (count))]
    fn allocate_device_blocks(&self, py: Python<'_>, count: usize) -> PyResult<Ready> {
        Ready::new(py, self.allocate(Tier::Device, count))
    }
}

impl BlockManager {
    fn allocate(&self, tier: Tier, count: usize) -> PyResult<BlockList> {
        let blocks = self
            .inner
            .allocate_blocks(tier, count)
            .map_err(errors::block_manager_error)?;
        Ok(BlockList {
            blocks: blocks.into_iter().map(Arc::new).collect(),
            cursor: 0,
        })
    }
}

/// An awaitable whose result is already known.
///
/// Allocation never waits for blocks (it fails at once when too few are free), so the async
/// allocation methods complete immediately; awaiting yields the result or raises the error.
/// When the runtime crate owns a tokio runtime these can become `future_into_py` futures
/// without changing the Python API.
#[pyclass(module = "dynamo._core")]
pub(crate) struct Ready {
    result: Option<PyResult<Py<PyAny>>>,
}

impl Ready {
    fn new(py: Python<'_>, result: PyResult<BlockList>) -> PyResult<Self> {
        let result = match result {
            Ok(v) => Ok(Py::new(py, v)?.into_any()),
            Err(e) => Err(e),
        };
        Ok(Self {
            result: Some(result),
        })
    }
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.result.take() {
            Some(Ok(value)) => Err(PyStopIteration::new_err((value.clone_ref(py),))),
            Some(Err(err)) => Err(err),
            None => Err(PyStopIteration::new_err(())),
        }
    }
}

/// Map a Python index (negative counts from the end) to `0..len`.
fn normalize(index: isize, len: usize, what: &str) -> PyResult<usize> {
    let n = isize::try_from(len).unwrap_or(isize::MAX);
    let i = if index < 0 { index + n } else { index };
    if (0..n).contains(&i) {
        Ok(i as usize)
    } else {
        Err(PyIndexError::new_err(format!(
            "{what} index {index} out of range for length {len}"
        )))
    }
}

/// Blocks from one allocation. Iterating restarts from the first block on each `iter()`.
#[pyclass(module = "dynamo._core")]
pub(crate) struct BlockList {
    blocks: Vec<Arc<MutableBlock>>,
    cursor: usize,
}

#[pymethods]
impl BlockList {
    fn __len__(&self) -> usize {
        self.blocks.len()
    }

    fn __getitem__(&self, index: isize) -> PyResult<Block> {
        let i = normalize(index, self.blocks.len(), "block")?;
        Ok(Block::new(self.blocks[i].clone()))
    }

    fn __iter__(mut slf: PyRefMut<'_, Self>) -> PyRefMut<'_, Self> {
        slf.cursor = 0;
        slf
    }

    fn __next__(&mut self) -> Option<Block> {
        let b = self.blocks.get(self.cursor)?.clone();
        self.cursor += 1;
        Some(Block::new(b))
    }

    /// A new list of new `Block` objects.
    fn to_list(&self) -> Vec<Block> {
        self.blocks.iter().cloned().map(Block::new).collect()
    }
}

/// Common `__dlpack__` handling for blocks and layers.
fn export(
    py: Python<'_>,
    desc: PyResult<TensorDesc>,
    owner: &Arc<MutableBlock>,
    max_version: Option<&Bound<'_, PyAny>>,
    dl_device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
) -> PyResult<Py<PyAny>> {
    let desc = desc?;
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "copy=True is not supported: blocks are exported without copying",
        ));
    }
    if let Some(dev) = dl_device.filter(|d| !d.is_none()) {
        let want: (i32, i32) = dev.extract()?;
        if want != dlpack::device_of(desc.memory) {
            return Err(PyBufferError::new_err(format!(
                "cannot export to device {want:?}: the block lives on {:?}",
                dlpack::device_of(desc.memory)
            )));
        }
    }
    let versioned = match max_version.filter(|v| !v.is_none()) {
        Some(v) => v.extract::<(u32, u32)>()?.0 >= 1,
        None => false,
    };
    dlpack::export(py, &desc, owner.clone(), versioned)
}

/// One KV block: `len()` layers; exported as `(1, num_layer, outer_dim, page_size,
/// inner_dim)`.
#[pyclass(module = "dynamo._core")]
pub(crate) struct Block {
    block: Arc<MutableBlock>,
    cursor: usize,
}

impl Block {
    fn new(block: Arc<MutableBlock>) -> Self {
        Self { block, cursor: 0 }
    }

    fn num_layers(&self) -> usize {
        self.block.layout().config().num_layers
    }
}

#[pymethods]
impl Block {
    fn __len__(&self) -> usize {
        self.num_layers()
    }

    fn __getitem__(&self, index: isize) -> PyResult<Layer> {
        let layer = normalize(index, self.num_layers(), "layer")?;
        Ok(Layer {
            block: self.block.clone(),
            layer,
        })
    }

    fn __iter__(mut slf: PyRefMut<'_, Self>) -> PyRefMut<'_, Self> {
        slf.cursor = 0;
        slf
    }

    fn __next__(&mut self) -> Option<Layer> {
        if self.cursor >= self.num_layers() {
            return None;
        }
        self.cursor += 1;
        Some(Layer {
            block: self.block.clone(),
            layer: self.cursor - 1,
        })
    }

    /// A new list of new `Layer` objects.
    fn to_list(&self) -> Vec<Layer> {
        (0..self.num_layers())
            .map(|layer| Layer {
                block: self.block.clone(),
                layer,
            })
            .collect()
    }

    #[pyo3(signature = (stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        // Copies into and out of blocks complete before they return, so the data is ready
        // on every stream: `stream` needs no synchronisation.
        let _ = stream;
        let desc = self
            .block
            .block_tensor()
            .map_err(errors::block_manager_error);
        export(py, desc, &self.block, max_version, dl_device, copy)
    }

    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, <[i32; 2]>::from(device_pair(&self.block)))
    }
}

fn device_pair(block: &MutableBlock) -> (i32, i32) {
    dlpack::device_of(block.layout().memory_kind())
}

/// One layer of a block; exported as `(1, 1, outer_dim, page_size, inner_dim)`.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct Layer {
    block: Arc<MutableBlock>,
    layer: usize,
}

#[pymethods]
impl Layer {
    #[pyo3(signature = (stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = stream;
        let desc = self
            .block
            .layer_tensor(self.layer)
            .map_err(errors::block_manager_error);
        export(py, desc, &self.block, max_version, dl_device, copy)
    }

    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, <[i32; 2]>::from(device_pair(&self.block)))
    }
}

/// A request's identity for KV block hashing: its salt and LoRA adapter.
#[pyclass(module = "dynamo._core", frozen)]
pub(crate) struct KvbmRequest {
    inner: dynamo_block_manager::KvbmRequest,
}

#[pymethods]
impl KvbmRequest {
    #[new]
    #[pyo3(signature = (request_id, lora_name=None, salt_hash=None))]
    fn new(request_id: String, lora_name: Option<String>, salt_hash: Option<String>) -> Self {
        Self {
            inner: dynamo_block_manager::KvbmRequest::new(request_id, lora_name, salt_hash),
        }
    }

    /// The request id.
    #[getter]
    fn request_id(&self) -> &str {
        &self.inner.request_id
    }

    /// The LoRA adapter name, if any.
    #[getter]
    fn lora_name(&self) -> Option<&str> {
        self.inner.lora_name.as_deref()
    }

    /// The cache salt, if any.
    #[getter]
    fn salt_hash(&self) -> Option<&str> {
        self.inner.salt.as_deref()
    }

    /// The seed of this request's block hashes (the router's salted seed).
    #[getter]
    fn salt_seed(&self) -> u64 {
        self.inner.salt_seed()
    }
}

/// Register the block manager classes.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlockManager>()?;
    m.add_class::<BlockList>()?;
    m.add_class::<Block>()?;
    m.add_class::<Layer>()?;
    m.add_class::<KvbmRequest>()?;
    Ok(())
}
