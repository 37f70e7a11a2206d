"""Block manager: host blocks through DLPack (NumPy, and PyTorch when installed), errors,
lifetime; device blocks when a CUDA device is present."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import importlib.util

import numpy as np
import pytest

from dynamo._core import Block, BlockList, BlockManager, KvbmRequest, Layer

# The upstream test shape: one block is 5 * 2 * 4 * 13 * 4 B = 2,080 B.
WORKER_ID = 0
NUM_LAYER = 5
OUTER_DIM = 2
PAGE_SIZE = 4
INNER_DIM = 13
DTYPE = "FP32"
HOST_BLOCKS = 16
SHAPE = (1, NUM_LAYER, OUTER_DIM, PAGE_SIZE, INNER_DIM)
LAYER_SHAPE = (1, 1, OUTER_DIM, PAGE_SIZE, INNER_DIM)
BLOCK_BYTES = NUM_LAYER * OUTER_DIM * PAGE_SIZE * INNER_DIM * 4

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _numpy(x):
    return np.from_dlpack(x)


def _torch(x):
    import torch

    return torch.from_dlpack(x).numpy()  # shares memory with the tensor for CPU tensors


#: Every consumer the host tests run through: NumPy always, PyTorch when installed.
CONSUMERS = [pytest.param(_numpy, id="numpy")]
if HAVE_TORCH:
    CONSUMERS.append(pytest.param(_torch, id="torch"))


@pytest.fixture(params=CONSUMERS)
def view(request):
    return request.param


@pytest.fixture
def manager() -> BlockManager:
    return BlockManager(WORKER_ID, NUM_LAYER, OUTER_DIM, PAGE_SIZE, INNER_DIM, DTYPE, HOST_BLOCKS)


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def capsule_name(capsule) -> str:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(capsule).decode()


# --------------------------------------------------------------------------------------
# Construction and errors
# --------------------------------------------------------------------------------------


def test_constructor_accepts_positional_and_keyword_forms() -> None:
    args = [WORKER_ID, NUM_LAYER, OUTER_DIM, PAGE_SIZE, INNER_DIM]
    BlockManager(*args)
    BlockManager(*args, DTYPE)
    BlockManager(*args, DTYPE, 4)
    BlockManager(*args, DTYPE, 4, None)
    BlockManager(*args, DTYPE, 4, None, 0)
    BlockManager(*args, dtype="bf16", host_num_blocks=2, device_num_blocks=None, device_id=0)
    assert BlockManager(*args).block_size() == PAGE_SIZE


@pytest.mark.parametrize(
    ("dims", "field"),
    [
        ((0, 2, 4, 8), "num_layers"),
        ((1, 0, 4, 8), "outer_dim"),
        ((1, 2, 0, 8), "page_size"),
        ((1, 2, 4, 0), "inner_dim"),
    ],
)
def test_zero_dimensions_are_value_errors(dims, field) -> None:
    with pytest.raises(ValueError, match=f"{field} must be at least 1"):
        BlockManager(0, *dims, None, 4)


def test_zero_host_blocks_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="num_blocks must be at least 1"):
        BlockManager(0, 1, 2, 4, 8, None, 0)


def test_outer_dim_must_be_one_or_two() -> None:
    with pytest.raises(ValueError, match="outer_dim must be 1 or 2"):
        BlockManager(0, 1, 3, 4, 8, None, 4)


@pytest.mark.parametrize("dtype", ["fp64", "float16", "", "int4"])
def test_unsupported_dtype(dtype) -> None:
    with pytest.raises(ValueError, match="Unsupported dtype"):
        BlockManager(0, 1, 2, 4, 8, dtype, 4)


def test_not_enough_blocks_states_requested_and_available(manager) -> None:
    held = manager.allocate_host_blocks_blocking(10)
    with pytest.raises(RuntimeError, match=r"requested: 7, available: 6"):
        manager.allocate_host_blocks_blocking(7)
    # All or nothing: the failed call took nothing.
    assert len(manager.allocate_host_blocks_blocking(6)) == 6
    del held


def test_unconfigured_pools_are_runtime_errors() -> None:
    no_pools = BlockManager(0, 1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="Host allocator not available"):
        no_pools.allocate_host_blocks_blocking(1)
    with pytest.raises(RuntimeError, match="Device allocator not available"):
        no_pools.allocate_device_blocks_blocking(1)


async def test_async_allocation(manager) -> None:
    blocks = await manager.allocate_host_blocks(3)
    assert isinstance(blocks, BlockList)
    assert len(blocks) == 3
    with pytest.raises(RuntimeError, match="requested: 99"):
        await manager.allocate_host_blocks(99)
    no_device = BlockManager(0, 1, 2, 4, 8, None, 1)
    with pytest.raises(RuntimeError, match="Device allocator not available"):
        await no_device.allocate_device_blocks(1)


def test_async_allocation_under_asyncio_run(manager) -> None:
    async def main():
        return await asyncio.gather(
            manager.allocate_host_blocks(2), manager.allocate_host_blocks(3)
        )

    a, b = asyncio.run(main())
    assert (len(a), len(b)) == (2, 3)


# --------------------------------------------------------------------------------------
# Host blocks through DLPack
# --------------------------------------------------------------------------------------


def test_block_shape_dtype_strides_and_device(manager, view) -> None:
    blocks = manager.allocate_host_blocks_blocking(2)
    assert len(blocks.to_list()) == 2
    for block in blocks:
        assert block.__dlpack_device__() == (1, 0)
        a = view(block)
        assert a.shape == SHAPE
        assert a.dtype == np.float32
        assert a.flags["C_CONTIGUOUS"]
        assert a.strides == (BLOCK_BYTES, 416, 208, 52, 4)


def test_layer_shape_and_offsets(manager, view) -> None:
    block = manager.allocate_host_blocks_blocking(1)[0]
    base = address(view(block))
    layers = block.to_list()
    assert len(layers) == NUM_LAYER
    for i, layer in enumerate(layers):
        assert isinstance(layer, Layer)
        assert layer.__dlpack_device__() == (1, 0)
        a = view(layer)
        assert a.shape == LAYER_SHAPE
        assert a.dtype == np.float32
        assert a.flags["C_CONTIGUOUS"]
        # Layer l starts l * outer_dim * page_size * inner_dim elements into the block.
        assert address(a) == base + i * OUTER_DIM * PAGE_SIZE * INNER_DIM * 4


def test_blocks_are_adjacent_in_the_contiguous_pool(manager, view) -> None:
    blocks = manager.allocate_host_blocks_blocking(3).to_list()
    addrs = [address(view(b)) for b in blocks]
    assert addrs[1] - addrs[0] == BLOCK_BYTES
    assert addrs[2] - addrs[1] == BLOCK_BYTES


def test_writes_are_visible_through_every_view(manager, view) -> None:
    blocks = manager.allocate_host_blocks_blocking(2)
    first = [view(b) for b in blocks.to_list()]
    for i, a in enumerate(first):
        a[0, 0, 0, 0, 0] = 1.5 + i
        a[0, -1, -1, -1, -1] = -2.5 - i
    again = blocks.to_list()
    assert again is not blocks.to_list()
    for i, b in enumerate(again):
        a = view(b)
        np.testing.assert_array_equal(a, first[i])
        assert a[0, 0, 0, 0, 0] == 1.5 + i
    # A write through a layer shows in the whole-block view and vice versa.
    block = blocks[0]
    whole = view(block)
    for i in range(NUM_LAYER):
        layer = view(block[i])
        layer[...] = np.arange(layer.size, dtype=np.float32).reshape(layer.shape) + 100 * i
    for i in range(NUM_LAYER):
        np.testing.assert_array_equal(whole[0, i], view(block[i])[0, 0])
        assert whole[0, i, 0, 0, 0] == 100 * i
    whole[0, 3] = 7.0
    assert (view(block[3]) == 7.0).all()
    assert not (view(block[2]) == 7.0).all()


def test_fill_in_c_order_and_read_back_through_permuted_view(manager, view) -> None:
    block = manager.allocate_host_blocks_blocking(1)[0]
    a = view(block)
    n = a.size
    expected = np.arange(n, dtype=np.float32)
    a.reshape(-1)[:] = expected
    # A second export, permuted and permuted back, sees every element in C order.
    permuted = view(block).transpose(0, 2, 4, 3, 1)
    assert not permuted.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(permuted.transpose(0, 4, 1, 3, 2).reshape(-1), expected)
    # Zero through the permuted view: the first export sees it.
    permuted[...] = 0
    assert not a.any()


def test_block_list_indexing_and_iteration(manager) -> None:
    blocks = manager.allocate_host_blocks_blocking(4)
    assert len(blocks) == 4
    for i in range(4):
        np.from_dlpack(blocks[i])[0, 0, 0, 0, 0] = float(i)
    assert np.from_dlpack(blocks[-1])[0, 0, 0, 0, 0] == 3.0
    assert np.from_dlpack(blocks[-4])[0, 0, 0, 0, 0] == 0.0
    for bad in (4, 100, -5):
        with pytest.raises(IndexError):
            blocks[bad]
    # Iteration restarts from the first block every time.
    for _ in range(2):
        seen = [np.from_dlpack(b)[0, 0, 0, 0, 0] for b in blocks]
        assert seen == [0.0, 1.0, 2.0, 3.0]
    assert all(isinstance(b, Block) for b in blocks.to_list())
    assert blocks.to_list() is not blocks.to_list()


def test_block_indexing_and_iteration_over_layers(manager) -> None:
    block = manager.allocate_host_blocks_blocking(1)[0]
    assert len(block) == NUM_LAYER
    for i in range(NUM_LAYER):
        np.from_dlpack(block[i])[0, 0, 0, 0, 0] = float(i)
    assert np.from_dlpack(block[-1])[0, 0, 0, 0, 0] == float(NUM_LAYER - 1)
    for bad in (NUM_LAYER, -NUM_LAYER - 1):
        with pytest.raises(IndexError):
            block[bad]
    for _ in range(2):
        assert [np.from_dlpack(layer)[0, 0, 0, 0, 0] for layer in block] == [
            0.0,
            1.0,
            2.0,
            3.0,
            4.0,
        ]


@pytest.mark.parametrize(
    ("dtype", "np_dtype"),
    [
        ("fp8", np.uint8),
        ("FP16", np.float16),
        ("fp32", np.float32),
        ("u8", np.uint8),
        ("u16", np.uint16),
        ("u32", np.uint32),
        ("u64", np.uint64),
        ("i8", np.int8),
        ("i16", np.int16),
        ("I32", np.int32),
        ("i64", np.int64),
    ],
)
def test_dtypes(dtype, np_dtype) -> None:
    bm = BlockManager(0, 2, 1, 4, 8, dtype, 2)
    blocks = bm.allocate_host_blocks_blocking(2)
    a = np.from_dlpack(blocks[0])
    assert a.dtype == np_dtype
    assert a.shape == (1, 2, 1, 4, 8)
    size = np.dtype(np_dtype).itemsize
    assert a.strides == (2 * 32 * size, 32 * size, 32 * size, 8 * size, size)
    assert address(np.from_dlpack(blocks[1])) - address(a) == 2 * 32 * size


class _DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class _DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class _DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


def raw_tensor(obj) -> _DLTensor:
    """The DLTensor inside a legacy capsule (the first member of DLManagedTensor). The capsule
    is returned alongside so the tensor stays valid while the caller reads it."""
    capsule = obj.__dlpack__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    tensor = _DLTensor.from_address(get_pointer(capsule, b"dltensor"))
    tensor._capsule = capsule  # keep the capsule (and so the tensor) alive
    return tensor


@pytest.mark.parametrize(
    ("dtype", "code", "bits"),
    [("fp8", 1, 8), ("fp16", 2, 16), ("bf16", 4, 16), ("fp32", 2, 32), ("i64", 0, 64)],
)
def test_raw_dlpack_fields(dtype, code, bits) -> None:
    bm = BlockManager(0, 2, 2, 4, 8, dtype, 1)
    block = bm.allocate_host_blocks_blocking(1)[0]
    t = raw_tensor(block)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1)
    assert (t.device.device_type, t.device.device_id) == (1, 0)
    assert t.ndim == 5 and t.byte_offset == 0
    assert [t.shape[i] for i in range(5)] == [1, 2, 2, 4, 8]
    assert [t.strides[i] for i in range(5)] == [128, 64, 32, 8, 1]  # in elements
    layer = raw_tensor(block[1])
    assert [layer.shape[i] for i in range(5)] == [1, 1, 2, 4, 8]
    assert layer.data - t.data == 64 * bits // 8


def test_bf16_exports_as_bfloat16() -> None:
    bm = BlockManager(0, 2, 2, 4, 8, "bf16", 1)
    block = bm.allocate_host_blocks_blocking(1)[0]
    if HAVE_TORCH:
        import torch

        t = torch.from_dlpack(block)
        assert t.dtype == torch.bfloat16
        assert t.shape == (1, 2, 2, 4, 8)
    else:
        # NumPy has no bfloat16; it refuses the dtype rather than misreading it.
        with pytest.raises(RuntimeError, match="Unsupported dtype"):
            np.from_dlpack(block)


def test_versioned_and_legacy_capsules(manager) -> None:
    block = manager.allocate_host_blocks_blocking(1)[0]
    assert capsule_name(block.__dlpack__()) == "dltensor"
    assert capsule_name(block.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(block.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(block[0].__dlpack__(stream=None, max_version=(1, 2))) == (
        "dltensor_versioned"
    )


def test_dlpack_argument_checks(manager) -> None:
    block = manager.allocate_host_blocks_blocking(1)[0]
    with pytest.raises(BufferError, match="copy=True"):
        block.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="cannot export to device"):
        block.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        block[0].__dlpack__(dl_device=(2, 1))
    block.__dlpack__(dl_device=(1, 0), copy=False, stream=-1)
    np.from_dlpack(block, device="cpu")


# --------------------------------------------------------------------------------------
# Lifetime
# --------------------------------------------------------------------------------------


def test_array_outlives_block_list_and_manager(view) -> None:
    bm = BlockManager(0, NUM_LAYER, OUTER_DIM, PAGE_SIZE, INNER_DIM, DTYPE, 2)
    blocks = bm.allocate_host_blocks_blocking(2)
    a = view(blocks[1])
    a[...] = 4.25
    del blocks, bm
    gc.collect()
    # The pool memory is still alive and untouched.
    assert (a == 4.25).all()
    a[0, 0, 0, 0, 0] = 1.0
    assert a[0, 0, 0, 0, 0] == 1.0


def test_a_live_array_keeps_its_block_allocated(manager) -> None:
    blocks = manager.allocate_host_blocks_blocking(HOST_BLOCKS)
    arr = np.from_dlpack(blocks[5])
    layer = np.from_dlpack(blocks[6][2])
    del blocks
    with pytest.raises(RuntimeError, match=f"requested: {HOST_BLOCKS}, available: 14"):
        manager.allocate_host_blocks_blocking(HOST_BLOCKS)
    del arr
    with pytest.raises(RuntimeError, match="available: 15"):
        manager.allocate_host_blocks_blocking(HOST_BLOCKS)
    del layer
    # Returned synchronously: no sleep before re-allocating.
    assert len(manager.allocate_host_blocks_blocking(HOST_BLOCKS)) == HOST_BLOCKS


def test_unconsumed_capsules_release_their_block(manager) -> None:
    blocks = manager.allocate_host_blocks_blocking(HOST_BLOCKS)
    capsules = [blocks[0].__dlpack__(), blocks[1].__dlpack__(max_version=(1, 0))]
    del blocks
    with pytest.raises(RuntimeError, match="available: 14"):
        manager.allocate_host_blocks_blocking(HOST_BLOCKS)
    del capsules
    assert len(manager.allocate_host_blocks_blocking(HOST_BLOCKS)) == HOST_BLOCKS


def test_block_objects_keep_blocks_allocated(manager) -> None:
    blocks = manager.allocate_host_blocks_blocking(HOST_BLOCKS)
    one_block = blocks[3]
    one_layer = blocks[4][0]
    del blocks
    with pytest.raises(RuntimeError, match="available: 14"):
        manager.allocate_host_blocks_blocking(HOST_BLOCKS)
    del one_block, one_layer
    assert len(manager.allocate_host_blocks_blocking(HOST_BLOCKS)) == HOST_BLOCKS


# --------------------------------------------------------------------------------------
# KvbmRequest
# --------------------------------------------------------------------------------------


def test_kvbm_request() -> None:
    plain = KvbmRequest("req-1")
    assert plain.request_id == "req-1"
    assert plain.lora_name is None and plain.salt_hash is None
    assert plain.salt_seed == 1337
    salted = KvbmRequest("req-2", salt_hash="tenant-a")
    lora = KvbmRequest("req-3", lora_name="adapter", salt_hash=None)
    both = KvbmRequest("req-4", "adapter", "tenant-a")
    assert salted.salt_hash == "tenant-a" and lora.lora_name == "adapter"
    seeds = {plain.salt_seed, salted.salt_seed, lora.salt_seed, both.salt_seed}
    assert len(seeds) == 4
    assert KvbmRequest("other", salt_hash="tenant-a").salt_seed == salted.salt_seed


# --------------------------------------------------------------------------------------
# Device blocks (need a CUDA device)
# --------------------------------------------------------------------------------------


def _cuda_unavailable_reason() -> str | None:
    try:
        BlockManager(0, 1, 1, 1, 1, None, None, 1, 0)
    except RuntimeError as e:
        return f"no CUDA device: {e}"
    return None


CUDA_REASON = _cuda_unavailable_reason()
needs_gpu = pytest.mark.skipif(CUDA_REASON is not None, reason=str(CUDA_REASON))


def test_device_pool_without_cuda_is_a_runtime_error() -> None:
    if CUDA_REASON is None:
        # With a GPU the device pool is created; its own tests below cover it.
        bm = BlockManager(0, 1, 1, 1, 1, None, None, 1, 0)
        assert len(bm.allocate_device_blocks_blocking(1)) == 1
        return
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        BlockManager(0, 1, 2, 4, 8, None, 2, 2, 0)
    # The host pool alone still works on a machine without CUDA.
    assert len(BlockManager(0, 1, 2, 4, 8, None, 2).allocate_host_blocks_blocking(2)) == 2


def _gpu_manager() -> BlockManager:
    return BlockManager(
        WORKER_ID,
        NUM_LAYER,
        OUTER_DIM,
        PAGE_SIZE,
        INNER_DIM,
        DTYPE,
        HOST_BLOCKS,
        device_num_blocks=16,
        device_id=0,
    )


@needs_gpu
async def test_gpu_device_allocation_and_device_id() -> None:
    bm = _gpu_manager()
    blocks = await bm.allocate_device_blocks(6)
    assert len(blocks.to_list()) == 6
    for b in blocks:
        assert b.__dlpack_device__() == (2, 0)
        assert b[0].__dlpack_device__() == (2, 0)
    with pytest.raises(RuntimeError, match="requested: 11, available: 10"):
        bm.allocate_device_blocks_blocking(11)


@needs_gpu
def test_gpu_round_trip_through_permuted_views() -> None:
    torch = pytest.importorskip("torch", reason="the device round trip copies through torch")
    bm = _gpu_manager()
    host = bm.allocate_host_blocks_blocking(1)[0]
    dev = bm.allocate_device_blocks_blocking(1)[0]
    h = torch.from_dlpack(host)
    d = torch.from_dlpack(dev)
    assert h.get_device() == -1 and d.get_device() == 0
    assert d.shape == SHAPE and d.dtype == torch.float32
    n = h.numel()
    h.view(-1).copy_(torch.arange(n, dtype=torch.float32))
    d.permute(0, 2, 4, 3, 1).copy_(h.permute(0, 2, 4, 3, 1))
    torch.cuda.synchronize()
    assert torch.equal(torch.from_dlpack(dev).cpu().view(-1), torch.arange(n, dtype=torch.float32))
    h.permute(0, 2, 4, 3, 1).zero_()
    h.copy_(d)
    torch.cuda.synchronize()
    assert torch.equal(h.view(-1), torch.arange(n, dtype=torch.float32))


@needs_gpu
def test_gpu_layer_copies() -> None:
    torch = pytest.importorskip("torch", reason="the layer copy goes through torch")
    bm = _gpu_manager()
    host = bm.allocate_host_blocks_blocking(1)[0]
    dev = bm.allocate_device_blocks_blocking(1)[0]
    for i, layer in enumerate(host):
        torch.from_dlpack(layer).fill_(float(i))
    torch.from_dlpack(dev).copy_(torch.from_dlpack(host))
    torch.cuda.synchronize()
    for i, layer in enumerate(dev):
        t = torch.from_dlpack(layer)
        assert t.get_device() == 0 and t.shape == LAYER_SHAPE
        assert bool((t == float(i)).all())
