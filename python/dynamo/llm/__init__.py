"""LLM layer: model registration, KV-aware routing, block hashing and the KV block manager.

Re-exports the public LLM classes and functions of :mod:`dynamo._core`.
"""

from dynamo._core import Block as Block
from dynamo._core import BlockList as BlockList
from dynamo._core import BlockManager as BlockManager
from dynamo._core import KvbmRequest as KvbmRequest
from dynamo._core import Layer as Layer
from dynamo._core import compute_block_hash_for_seq as compute_block_hash_for_seq
from dynamo.llm.exceptions import HttpError as HttpError
from dynamo.llm.exceptions import RouterQueueLimitExceeded as RouterQueueLimitExceeded

__all__ = [
    "Block",
    "BlockList",
    "BlockManager",
    "HttpError",
    "KvbmRequest",
    "Layer",
    "RouterQueueLimitExceeded",
    "compute_block_hash_for_seq",
]
