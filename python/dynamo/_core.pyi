# Type stub of the `dynamo._core` extension module (crates/dynamo-py).
#
# This file is the reviewed description of the Python API. It is checked against the
# compiled module by `python -m mypy.stubtest dynamo._core` (allowlist:
# tests/stubtest_allowlist.txt) and by tests/test_stub.py, which compares public names both
# ways.

from typing import Any, Awaitable, Dict, List, Optional, Tuple, final

__version__: str

# ---------------------------------------------------------------------------------------
# Exceptions
# ---------------------------------------------------------------------------------------

class DynamoException(Exception):
    """Base class of every error category raised by the Dynamo runtime."""

class Unknown(DynamoException):
    """An error that fits no other category."""

class InvalidArgument(DynamoException):
    """The request or an argument was invalid (for example a prompt longer than the context)."""

class CannotConnect(DynamoException):
    """A connection could not be established."""

class Disconnected(DynamoException):
    """An established connection was lost."""

class ConnectionTimeout(DynamoException):
    """A connection or request timed out."""

class Cancelled(DynamoException):
    """The request was cancelled."""

class EngineShutdown(DynamoException):
    """The engine shut down or crashed; the request may be migrated to another worker."""

class StreamIncomplete(DynamoException):
    """The response stream ended before completion; the request may be migrated."""

class RouterQueueLimitExceeded(DynamoException):
    """A router queue rejected the request.

    The runtime sets the attributes on the instance it raises.
    """

    policy_class: str
    limit_kind: str
    current: int
    limit: int

class SelectionServiceError(DynamoException):
    """A selection-service call failed. The runtime sets the attributes when raising."""

    kind: str
    status_code: int

# ---------------------------------------------------------------------------------------
# KV routing
# ---------------------------------------------------------------------------------------

def compute_block_hash_for_seq(
    tokens: List[int],
    kv_block_size: int,
    block_mm_infos: Optional[List[Optional[Dict[str, Any]]]] = None,
    lora_name: Optional[str] = None,
    is_eagle: Optional[bool] = None,
    cache_namespace: Optional[str] = None,
) -> List[int]:
    """Local block hashes (``tokens_hash``) of every complete block of ``tokens``.

    XXH3-64 (seed 1337, or a seed derived from ``lora_name`` / ``cache_namespace``; empty
    strings count as absent) over each block's tokens as little-endian u32. A trailing
    partial block is not hashed, so the result has ``len(tokens) // kv_block_size`` items
    (``(len(tokens) - 1) // kv_block_size`` with ``is_eagle``, whose windows are
    ``kv_block_size + 1`` tokens long with a stride of ``kv_block_size``).

    ``block_mm_infos[i]``, when not None, is ``{"mm_objects": [{"mm_hash": int,
    "offsets": [[start, end], ...]}]}``: the block's ``mm_hash`` values, sorted, are
    appended to its bytes as u64 little-endian (offsets are not hashed).

    Raises:
        ValueError: ``kv_block_size`` is 0, or ``block_mm_infos`` is malformed (the message
            names the bad field).
        OverflowError: a token id or ``kv_block_size`` is negative or too large.
        TypeError: a token is not an int.
    """

# ---------------------------------------------------------------------------------------
# Block manager
# ---------------------------------------------------------------------------------------

@final
class Layer:
    """One layer of a KV block, exported through DLPack as a C-contiguous tensor of shape
    ``(1, 1, outer_dim, page_size, inner_dim)``.

    The tensor keeps the block alive: it returns to its pool only when every ``BlockList``,
    ``Block``, ``Layer`` and exported tensor viewing it is gone.
    """

    def __dlpack__(
        self,
        stream: Optional[Any] = None,
        max_version: Optional[Any] = None,
        dl_device: Optional[Any] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule (``dltensor_versioned`` when ``max_version >= (1, 0)``, else the
        legacy ``dltensor``). ``stream`` is accepted and needs no synchronisation (block
        copies complete before they return).

        Raises:
            BufferError: ``copy=True``, or ``dl_device`` differs from the block's device.
        """

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(1, 0)`` (kDLCPU) for host blocks, ``(2, device_id)`` (kDLCUDA) for device
        blocks."""

@final
class Block:
    """One KV block: a sequence of ``Layer``s, exported as ``(1, num_layer, outer_dim,
    page_size, inner_dim)``."""

    def __len__(self) -> int:
        """The number of layers."""

    def __getitem__(self, index: int, /) -> Layer:
        """Layer ``index``; negative indices count from the end.

        Raises:
            IndexError: ``index`` is out of range.
        """

    def __iter__(self) -> Block:
        """Restart iteration at layer 0 and return ``self``; use ``to_list()`` for nested
        iteration."""

    def __next__(self) -> Layer: ...
    def to_list(self) -> List[Layer]:
        """A new list of new ``Layer`` objects."""

    def __dlpack__(
        self,
        stream: Optional[Any] = None,
        max_version: Optional[Any] = None,
        dl_device: Optional[Any] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule of the whole block (see ``Layer.__dlpack__``).

        Raises:
            BufferError: the block is not contiguous in its layout, ``copy=True``, or
                ``dl_device`` differs from the block's device.
        """

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(1, 0)`` for host blocks, ``(2, device_id)`` for device blocks."""

@final
class BlockList:
    """The blocks of one allocation."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Block:
        """Block ``index`` (a new ``Block`` object each time); negative indices count from
        the end.

        Raises:
            IndexError: ``index`` is out of range.
        """

    def __iter__(self) -> BlockList:
        """Restart iteration at block 0 and return ``self``."""

    def __next__(self) -> Block: ...
    def to_list(self) -> List[Block]:
        """A new list of new ``Block`` objects."""

@final
class BlockManager:
    """KV block manager with an optional host pool and an optional device pool.

    The host pool is pinned memory when CUDA is available and page-aligned system memory
    otherwise; the device pool is memory on CUDA device ``device_id``. Each pool is one
    allocation laid out as ``[blocks][num_layer][outer_dim][page_size][inner_dim]``.

    ``dtype`` is one of ``fp8`` (exported as uint8), ``fp16`` (default), ``bf16``, ``fp32``,
    ``u8``, ``u16``, ``u32``, ``u64``, ``i8``, ``i16``, ``i32``, ``i64``, in any case. A
    ``None`` block count means no pool of that kind.

    Raises:
        ValueError: a zero dimension, ``outer_dim`` not 1 or 2, or an unsupported dtype.
        RuntimeError: a device pool was requested and CUDA (driver or device) is not
            available.
        MemoryError: the host pool could not be allocated.
    """

    def __new__(
        cls,
        worker_id: int,
        num_layer: int,
        outer_dim: int,
        page_size: int,
        inner_dim: int,
        dtype: Optional[str] = None,
        host_num_blocks: Optional[int] = None,
        device_num_blocks: Optional[int] = None,
        device_id: int = 0,
    ) -> BlockManager: ...
    def block_size(self) -> int:
        """Tokens per block (``page_size``)."""

    def allocate_host_blocks_blocking(self, count: int) -> BlockList:
        """Allocate ``count`` host blocks (contents unspecified), all or nothing.

        Raises:
            RuntimeError: there is no host pool, or fewer than ``count`` blocks are free
                ("Not enough blocks available, requested: X, available: Y"); it does not
                wait for blocks to come back.
        """

    def allocate_host_blocks(self, count: int) -> Awaitable[BlockList]:
        """Awaitable form of ``allocate_host_blocks_blocking``; errors are raised on
        ``await``."""

    def allocate_device_blocks_blocking(self, count: int) -> BlockList:
        """Allocate ``count`` device blocks, all or nothing.

        Raises:
            RuntimeError: there is no device pool, or fewer than ``count`` blocks are free.
        """

    def allocate_device_blocks(self, count: int) -> Awaitable[BlockList]:
        """Awaitable form of ``allocate_device_blocks_blocking``."""

@final
class KvbmRequest:
    """A request's identity for KV block hashing. Blocks of requests with a different
    ``salt_hash`` (cache salt) or ``lora_name`` never share cached blocks."""

    def __new__(
        cls, request_id: str, lora_name: Optional[str] = None, salt_hash: Optional[str] = None
    ) -> KvbmRequest: ...
    @property
    def request_id(self) -> str: ...
    @property
    def lora_name(self) -> Optional[str]: ...
    @property
    def salt_hash(self) -> Optional[str]: ...
    @property
    def salt_seed(self) -> int:
        """The seed of this request's block hashes: the router's salted seed for
        ``lora_name`` and cache namespace ``salt_hash`` (1337 for neither)."""
