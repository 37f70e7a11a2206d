"""LLM layer: model registration, KV-aware routing, block hashing and the KV block manager.

Re-exports the public LLM classes and functions of :mod:`dynamo._core`.
"""

from dynamo._core import AicPerfConfig as AicPerfConfig
from dynamo._core import Block as Block
from dynamo._core import BlockList as BlockList
from dynamo._core import BlockManager as BlockManager
from dynamo._core import KvbmRequest as KvbmRequest
from dynamo._core import KvRouterConfig as KvRouterConfig
from dynamo._core import Layer as Layer
from dynamo._core import ModelInput as ModelInput
from dynamo._core import ModelRuntimeConfig as ModelRuntimeConfig
from dynamo._core import ModelType as ModelType
from dynamo._core import OverlapScores as OverlapScores
from dynamo._core import RadixTree as RadixTree
from dynamo._core import RouterConfig as RouterConfig
from dynamo._core import RouterMode as RouterMode
from dynamo._core import RoutingConstraints as RoutingConstraints
from dynamo._core import WorkerType as WorkerType
from dynamo._core import compute_block_hash_for_seq as compute_block_hash_for_seq
from dynamo._core import fetch_model as fetch_model
from dynamo._core import lora_name_to_id as lora_name_to_id
from dynamo.llm.exceptions import HttpError as HttpError
from dynamo.llm.exceptions import RouterQueueLimitExceeded as RouterQueueLimitExceeded

#: Older name of :func:`fetch_model`.
fetch_llm = fetch_model

__all__ = [
    "AicPerfConfig",
    "Block",
    "BlockList",
    "BlockManager",
    "HttpError",
    "KvRouterConfig",
    "KvbmRequest",
    "Layer",
    "ModelInput",
    "ModelRuntimeConfig",
    "ModelType",
    "OverlapScores",
    "RadixTree",
    "RouterConfig",
    "RouterMode",
    "RouterQueueLimitExceeded",
    "RoutingConstraints",
    "WorkerType",
    "compute_block_hash_for_seq",
    "fetch_llm",
    "fetch_model",
    "lora_name_to_id",
]
