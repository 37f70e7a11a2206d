# Type stub of the `dynamo._core` extension module (crates/dynamo-py).
#
# This file is the reviewed description of the Python API. It is checked against the
# compiled module by `python -m mypy.stubtest dynamo._core` (allowlist:
# tests/stubtest_allowlist.txt) and by tests/test_stub.py, which compares public names both
# ways.

from typing import Any, Dict, List, Optional

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
