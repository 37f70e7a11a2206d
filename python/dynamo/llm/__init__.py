"""LLM layer: model registration, KV-aware routing and block hashing.

Re-exports the public LLM classes and functions of :mod:`dynamo._core`.
"""

from dynamo._core import OverlapScores as OverlapScores
from dynamo._core import RadixTree as RadixTree
from dynamo._core import compute_block_hash_for_seq as compute_block_hash_for_seq
from dynamo.llm.exceptions import HttpError as HttpError
from dynamo.llm.exceptions import RouterQueueLimitExceeded as RouterQueueLimitExceeded

__all__ = [
    "HttpError",
    "OverlapScores",
    "RadixTree",
    "RouterQueueLimitExceeded",
    "compute_block_hash_for_seq",
]
