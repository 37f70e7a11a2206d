"""LLM layer: model registration, KV-aware routing, block hashing and the KV block manager.

Re-exports the public LLM classes and functions of :mod:`dynamo._core`.
"""

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from dynamo._core import AicPerfConfig as AicPerfConfig
from dynamo._core import ApproxKvIndexer as ApproxKvIndexer
from dynamo._core import Block as Block
from dynamo._core import BlockList as BlockList
from dynamo._core import BlockManager as BlockManager
from dynamo._core import EngineConfig as EngineConfig
from dynamo._core import EngineType as EngineType
from dynamo._core import EntrypointArgs as EntrypointArgs
from dynamo._core import FpmDirectPublisher as FpmDirectPublisher
from dynamo._core import FpmEventRelay as FpmEventRelay
from dynamo._core import FpmEventSubscriber as FpmEventSubscriber
from dynamo._core import FrontendExtensionContext as FrontendExtensionContext
from dynamo._core import FrontendResponse as FrontendResponse
from dynamo._core import FrontendRoute as FrontendRoute
from dynamo._core import HttpAsyncEngine as HttpAsyncEngine
from dynamo._core import HttpService as HttpService
from dynamo._core import KserveGrpcService as KserveGrpcService
from dynamo._core import KvbmRequest as KvbmRequest
from dynamo._core import KvEventPublisher as KvEventPublisher
from dynamo._core import KvIndexer as KvIndexer
from dynamo._core import KvRemovedEventInput as KvRemovedEventInput
from dynamo._core import KvRouter as KvRouter
from dynamo._core import KvRouterConfig as KvRouterConfig
from dynamo._core import KvStoredEventInput as KvStoredEventInput
from dynamo._core import Layer as Layer
from dynamo._core import LoRADownloader as LoRADownloader
from dynamo._core import MediaDecoder as MediaDecoder
from dynamo._core import MediaFetcher as MediaFetcher
from dynamo._core import ModelCardInstanceId as ModelCardInstanceId
from dynamo._core import ModelInput as ModelInput
from dynamo._core import ModelRuntimeConfig as ModelRuntimeConfig
from dynamo._core import ModelType as ModelType
from dynamo._core import (
    MultimodalEmbeddingCacheIndex as MultimodalEmbeddingCacheIndex,
)
from dynamo._core import (
    MultimodalEmbeddingCachePublisher as MultimodalEmbeddingCachePublisher,
)
from dynamo._core import OverlapScores as OverlapScores
from dynamo._core import PythonAsyncEngine as PythonAsyncEngine
from dynamo._core import RadixTree as RadixTree
from dynamo._core import RouterConfig as RouterConfig
from dynamo._core import RouterMode as RouterMode
from dynamo._core import RoutingConstraints as RoutingConstraints
from dynamo._core import SelectionCacheConfig as SelectionCacheConfig
from dynamo._core import SelectionService as SelectionService
from dynamo._core import WorkerMetricsPublisher as WorkerMetricsPublisher
from dynamo._core import WorkerType as WorkerType
from dynamo._core import compute_block_hash_for_seq as compute_block_hash_for_seq
from dynamo._core import fetch_model as fetch_model
from dynamo._core import lora_name_to_id as lora_name_to_id
from dynamo._core import make_engine as make_engine
from dynamo._core import register_model as register_model
from dynamo._core import (
    resolve_routing_image_token_id as resolve_routing_image_token_id,
)
from dynamo._core import run_input as run_input
from dynamo._core import run_kv_indexer as run_kv_indexer
from dynamo._core import (
    run_mocker_synthetic_trace_replay as run_mocker_synthetic_trace_replay,
)
from dynamo._core import run_mocker_trace_replay as run_mocker_trace_replay
from dynamo._core import run_select_service as run_select_service
from dynamo._core import run_slot_tracker as run_slot_tracker
from dynamo._core import unregister_model as unregister_model
from dynamo._core import update_model_taints as update_model_taints
from dynamo.llm.exceptions import HttpError as HttpError
from dynamo.llm.exceptions import RouterQueueLimitExceeded as RouterQueueLimitExceeded

if TYPE_CHECKING:
    from dynamo.llm._unary import LLMUnaryClient as LLMUnaryClient
    from dynamo.llm._unary import UnaryChatModel as UnaryChatModel
    from dynamo.llm._unary import with_engine_data as with_engine_data

#: Names loaded on first use (PEP 562): the unary helpers' module builds a frozen dataclass
#: and imports ``dataclasses``, ~3 ms of the start-up of every process that imports this
#: package, most of which never use them (issue 19's start-up figure).
_LAZY = {
    "LLMUnaryClient": "dynamo.llm._unary",
    "UnaryChatModel": "dynamo.llm._unary",
    "with_engine_data": "dynamo.llm._unary",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class RoutedEngine(Protocol):
    """What a ``chat_engine_factory`` receives as its third argument (the runtime class is
    :class:`dynamo._core.RoutedEngine`)."""

    async def generate(self, request: Any, **kwargs: Any) -> AsyncIterator[Any]: ...


#: Older name of :func:`fetch_model`.
fetch_llm = fetch_model
#: Older names of :func:`register_model` / :func:`unregister_model`.
register_llm = register_model
unregister_llm = unregister_model

__all__ = [
    "AicPerfConfig",
    "ApproxKvIndexer",
    "Block",
    "BlockList",
    "BlockManager",
    "EngineConfig",
    "EngineType",
    "EntrypointArgs",
    "FpmDirectPublisher",
    "FpmEventRelay",
    "FpmEventSubscriber",
    "HttpAsyncEngine",
    "HttpError",
    "HttpService",
    "KserveGrpcService",
    "KvEventPublisher",
    "KvIndexer",
    "KvRemovedEventInput",
    "KvRouter",
    "KvRouterConfig",
    "KvStoredEventInput",
    "KvbmRequest",
    "LLMUnaryClient",
    "Layer",
    "LoRADownloader",
    "MediaDecoder",
    "MediaFetcher",
    "ModelInput",
    "ModelRuntimeConfig",
    "ModelType",
    "MultimodalEmbeddingCacheIndex",
    "MultimodalEmbeddingCachePublisher",
    "OverlapScores",
    "PythonAsyncEngine",
    "RadixTree",
    "RoutedEngine",
    "RouterConfig",
    "RouterMode",
    "RouterQueueLimitExceeded",
    "RoutingConstraints",
    "SelectionCacheConfig",
    "SelectionService",
    "UnaryChatModel",
    "WorkerMetricsPublisher",
    "WorkerType",
    "compute_block_hash_for_seq",
    "fetch_llm",
    "fetch_model",
    "lora_name_to_id",
    "make_engine",
    "register_llm",
    "register_model",
    "resolve_routing_image_token_id",
    "run_input",
    "run_kv_indexer",
    "run_mocker_synthetic_trace_replay",
    "run_mocker_trace_replay",
    "run_select_service",
    "run_slot_tracker",
    "unregister_llm",
    "unregister_model",
    "update_model_taints",
    "with_engine_data",
]
