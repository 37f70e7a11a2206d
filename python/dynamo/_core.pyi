# Type stub of the `dynamo._core` extension module (crates/dynamo-py).
#
# This file is the reviewed description of the Python API. It is checked against the
# compiled module by `python -m mypy.stubtest dynamo._core` (allowlist:
# tests/stubtest_allowlist.txt) and by tests/test_stub.py, which compares public names both
# ways.

import os
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypedDict,
    Union,
    final,
)

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
# Runtime
# ---------------------------------------------------------------------------------------

def log_message(level: str, message: str, module: str, file: str, line: int) -> None:
    """Send one formatted Python log record to the Rust tracing subscriber.

    ``level`` is a lower-case Python level name ("debug", "info", "warning", "error",
    "critical"); ``module`` is the logger target, ``file``/``line`` the source location.
    """

@final
class DistributedRuntime:
    """The process-wide runtime: discovery, the request plane and served endpoints."""

    def __new__(
        cls,
        event_loop: Any,
        discovery_backend: str,
        request_plane: str,
        enable_nats: Optional[bool] = None,
        *,
        event_plane: Optional[str] = None,
    ) -> DistributedRuntime:
        """Create a runtime.

        ``discovery_backend``: "file" (local processes, ``DYN_FILE_KV``), "mem" (one
        process) or "etcd" (``ETCD_ENDPOINTS``, one lease per process); "kubernetes" is
        recognised but not available in this build.
        ``request_plane``: "tcp" or "nats" (``NATS_SERVER``).
        ``event_plane``: "nats", "zmq", "" or None. ``enable_nats`` is deprecated and
        ignored (any non-None value warns).

        Raises:
            ValueError: an unknown or unavailable backend or plane.
        """

    def endpoint(self, path: str) -> Endpoint:
        """The endpoint ``"namespace.component.endpoint"`` (optionally ``dyn://``-prefixed).

        Each part must match ``[a-z0-9-_]+``. Raises ``ValueError`` otherwise.
        """

    def shutdown(self) -> None:
        """Start the graceful shutdown and return.

        Endpoints stop accepting work and leave discovery, graceful endpoints drain their
        in-flight streams, then connections close and ``serve_endpoint`` awaitables resolve.
        """

    def event_loop(self) -> Any:
        """The event loop given at construction."""

    def set_health_status(self, ready: bool) -> None:
        """Set the health flag reported by the system status server (``/health``)."""

    def register_engine_route(
        self, route_name: str, callback: Callable[[Dict[str, Any]], Awaitable[Dict[str, Any]]]
    ) -> None:
        """Mount ``/engine/{route_name}`` on the system status server.

        The request's JSON body (``{}`` when empty) is passed to the async ``callback``; the
        dict it returns is the JSON response (500 with ``{"error": ...}`` if it raises).
        Must be called while an asyncio loop is running: the callback runs on it.
        """

@final
class Endpoint:
    """One named endpoint (``namespace/component/endpoint``)."""

    async def serve_endpoint(
        self,
        handler: Callable[..., AsyncIterator[Any]],
        graceful_shutdown: bool = True,
        metrics_labels: Optional[List[Tuple[str, str]]] = None,
        health_check_payload: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Serve this endpoint until the runtime shuts down.

        ``handler`` is an async-generator function called as ``handler(request)``, or as
        ``handler(request, context=Context)`` when it declares a parameter named
        ``context``. Each yielded item is one response frame, sent as MessagePack (``None``,
        ``bool``, ``int``, ``float``, ``str``, ``bytes``, lists/tuples/sets, dicts, pydantic
        models; tuples and sets arrive as lists). A handler declaring ``response_sender``
        runs in push mode: it calls ``response_sender.send(item)`` and ``close()`` instead
        of yielding. An exception ends the stream with an error the caller raises as
        ``ValueError("{category}: {type}: {text}")`` (for ``dynamo._core`` exceptions, a
        class deriving from that class and ``ValueError``); the worker keeps serving.
        After the caller's ``stop_generating()`` the handler's pending ``yield`` returns
        with ``context.is_stopped()`` True; a further ``yield`` closes the generator.

        Raises:
            TypeError: ``health_check_payload`` is not a dict, or ``metrics_labels`` is not a
                list of string pairs.
        """

    async def serve_bidirectional_endpoint(
        self,
        handler: Callable[..., AsyncIterator[Any]],
        graceful_shutdown: bool = True,
        metrics_labels: Optional[List[Tuple[str, str]]] = None,
    ) -> None:
        """Serve a streaming-in, streaming-out handler.

        The handler receives a :class:`PyAsyncRequestStream` (and ``context`` when it
        declares it). Callers pass an async iterable as the request.
        """

    async def client(self, router_mode: Optional[Any] = None) -> Client:
        """A client over this endpoint's live instances (default mode round-robin).

        ``router_mode``: ``RouterMode.RoundRobin``, ``RouterMode.Random`` or ``RouterMode.KV``.
        In KV mode ``generate`` routes each request (a dict with ``token_ids``) with a
        :class:`KvRouter` of block size ``DYN_KV_BLOCK_SIZE`` (default 16) and the default
        :class:`KvRouterConfig`; other modes raise ``ValueError``."""

    def connection_id(self) -> int:
        """This process's discovery instance id."""

    @property
    def metrics(self) -> RuntimeMetrics:
        """Metrics hooks of this endpoint (``/metrics`` of the system status server)."""

    async def unregister_endpoint_instance(self) -> None:
        """Withdraw this process's instance of the endpoint from discovery ("sleep"); a
        served endpoint keeps answering requests addressed to it directly."""

    async def register_endpoint_instance(self) -> None:
        """Publish this process's instance of the endpoint ("wake"): id
        :meth:`connection_id`, reached through this process's request plane. Works on an
        endpoint this process does not serve too (multinode groups publish the leader's
        instance); requests reaching it then fail until the endpoint is served."""

@final
class RuntimeMetrics:
    """Metrics hooks of one endpoint."""

    def register_prometheus_expfmt_callback(self, callback: Callable[[], str]) -> None:
        """Append the Prometheus text exposition returned by ``callback()`` to every
        ``/metrics`` scrape (a callback that raises is logged and skipped)."""

@final
class PyAsyncRequestStream:
    """The inbound request items of a bidirectional call."""

    def __aiter__(self) -> PyAsyncRequestStream: ...
    def __anext__(self) -> Awaitable[Any]:
        """The next request item; ``StopAsyncIteration`` when the caller stops sending."""

@final
class TransportType:
    """How an instance is reached (read-only)."""

    @property
    def kind(self) -> str:
        """``"tcp"`` or ``"nats_tcp"``."""

    @property
    def address(self) -> str:
        """The transport address (format not stable)."""

    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Instance:
    """A snapshot of one registered endpoint instance (read-only)."""

    @property
    def instance_id(self) -> int: ...
    @property
    def namespace(self) -> str: ...
    @property
    def component(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def transport(self) -> TransportType: ...
    @property
    def device_type(self) -> Optional[str]: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class ModelCardInstanceId:
    """Identity of a worker instance (namespace, component, endpoint, instance id).

    Handed to ``chat_engine_factory`` callbacks; it has no Python constructor and, as in
    the reference, the instance id is not exposed.
    """

    def triple(self) -> Tuple[str, str, str]:
        """``(namespace, component, endpoint)`` this worker is serving."""

@final
class RoutedEngine:
    """A discovered model's router, handed to ``chat_engine_factory`` callbacks: sends
    preprocessed requests to the model's workers with the frontend's router mode (KV
    bookings, migration). No Python constructor."""

    def generate(
        self, preprocessed: Any, context: Optional[Context] = None
    ) -> Awaitable[AsyncIterator[Any]]:
        """Route ``preprocessed`` (a ``PreprocessedRequest`` dict: ``token_ids``,
        ``stop_conditions``, ``sampling_options``, ``output_options``, ``eos_token_ids``,
        ...); resolves to an async iterator of ``Annotated`` items whose ``data()`` is the
        worker's raw ``LLMEngineOutput`` dict. With ``context``, stopping it stops the worker.

        Raises:
            ValueError: ``preprocessed`` is malformed (the message names the field), or the
                request is refused as invalid (400).
            RuntimeError: no worker is available (``"503 ..."``) or routing failed.
        """

class backend:
    """The ``dynamo._core.backend`` submodule (in ``sys.modules``): a worker around a
    Python engine object.

    ``Worker(engine, config, event_loop).run()`` awaits ``engine.start(instance_id)`` (it
    returns an :class:`backend.EngineConfig`), registers the model it describes on
    ``{namespace}.{component}.{endpoint}``, awaits ``engine.on_endpoint_ready(endpoint)``
    when the engine defines it, serves ``engine.generate`` (called as
    ``generate(request, context=Context)`` when it declares ``context``) until the
    runtime shuts down (SIGTERM/SIGINT), then awaits ``engine.cleanup()``.
    """

    @final
    class DisaggregationMode:
        """The worker's role (an int-backed enum: 1, 2, 3, 4)."""

        Aggregated: backend.DisaggregationMode
        Prefill: backend.DisaggregationMode
        Decode: backend.DisaggregationMode
        Encode: backend.DisaggregationMode
        @property
        def name(self) -> str: ...
        def __int__(self) -> int: ...
        def __eq__(self, other: object, /) -> bool: ...

    @final
    class LlmRegistration:
        """The engine's model and capacity (read-only)."""

        def __new__(
            cls,
            context_length: Optional[int] = None,
            kv_cache_block_size: Optional[int] = None,
            total_kv_blocks: Optional[int] = None,
            max_num_seqs: Optional[int] = None,
            max_num_batched_tokens: Optional[int] = None,
            data_parallel_size: Optional[int] = None,
            data_parallel_start_rank: Optional[int] = None,
            bootstrap_host: Optional[str] = None,
            bootstrap_port: Optional[int] = None,
            enable_eagle: bool = False,
            max_gpu_lora_count: Optional[int] = None,
        ) -> backend.LlmRegistration:
            """Raises ValueError for ``kv_cache_block_size=0``."""

        @property
        def context_length(self) -> Optional[int]: ...
        @property
        def kv_cache_block_size(self) -> Optional[int]: ...
        @property
        def total_kv_blocks(self) -> Optional[int]: ...
        @property
        def max_num_seqs(self) -> Optional[int]: ...
        @property
        def max_num_batched_tokens(self) -> Optional[int]: ...
        @property
        def data_parallel_size(self) -> Optional[int]: ...
        @property
        def data_parallel_start_rank(self) -> Optional[int]: ...
        @property
        def bootstrap_host(self) -> Optional[str]: ...
        @property
        def bootstrap_port(self) -> Optional[int]: ...
        @property
        def enable_eagle(self) -> bool: ...
        @property
        def max_gpu_lora_count(self) -> Optional[int]: ...

    @final
    class EngineConfig:
        """What ``engine.start()`` returns (read-only)."""

        def __new__(
            cls,
            model: str,
            served_model_name: Optional[str] = None,
            runtime_data: Optional[Dict[str, Any]] = None,
            llm: Optional[backend.LlmRegistration] = None,
            model_aliases: Optional[List[str]] = None,
        ) -> backend.EngineConfig: ...
        @property
        def model(self) -> str:
            """The model directory (or offline Hugging Face cache id) to register."""

        @property
        def served_model_name(self) -> Optional[str]: ...
        @property
        def runtime_data(self) -> Dict[str, Any]:
            """Engine-specific values for the card's runtime config (default ``{}``)."""

        @property
        def llm(self) -> Optional[backend.LlmRegistration]: ...
        @property
        def model_aliases(self) -> List[str]: ...

    @final
    class RuntimeConfig:
        """Transports of the worker's runtime; ``None`` keeps the environment's default."""

        def __new__(
            cls,
            discovery_backend: Optional[str] = None,
            request_plane: Optional[str] = None,
            event_plane: Optional[str] = None,
            *,
            response_plane: Optional[str] = None,
        ) -> backend.RuntimeConfig: ...
        @property
        def discovery_backend(self) -> Optional[str]: ...
        @property
        def request_plane(self) -> Optional[str]: ...
        @property
        def event_plane(self) -> Optional[str]: ...
        @property
        def response_plane(self) -> Optional[str]:
            """Accepted; responses travel on the request plane's connection."""

    @final
    class WorkerConfig:
        """Where and how the worker serves (read-only properties of the same names)."""

        def __new__(
            cls,
            namespace: str,
            component: str = "backend",
            endpoint: str = "generate",
            model_name: str = "",
            served_model_name: Optional[str] = None,
            model_input: ModelInput = ...,
            endpoint_types: str = "chat,completions",
            custom_jinja_template: Optional[str] = None,
            tool_call_parser: Optional[str] = None,
            reasoning_parser: Optional[str] = None,
            exclude_tools_when_tool_choice_none: bool = True,
            enable_local_indexer: bool = True,
            enable_kv_routing: bool = True,
            metrics_labels: List[Tuple[str, str]] = ...,
            runtime: Optional[backend.RuntimeConfig] = None,
            disaggregation_mode: backend.DisaggregationMode = ...,
            health_check_payload: Optional[Dict[str, Any]] = None,
            structural_tag: Optional[Any] = None,
            route_to_encoder: bool = False,
            media_decoder: Optional[MediaDecoder] = None,
            media_fetcher: Optional[MediaFetcher] = None,
            kv_state_endpoint: Optional[str] = None,
            default_thinking_mode: Optional[Any] = None,
        ) -> backend.WorkerConfig:
            """Raises ValueError for an invalid endpoint name part or an unknown
            ``endpoint_types`` entry (chat, completions, embedding, classify, pooling,
            images, audios, videos, tensor, prefill)."""

        @property
        def namespace(self) -> str: ...
        @property
        def component(self) -> str: ...
        @property
        def endpoint(self) -> str: ...
        @property
        def model_name(self) -> str: ...
        @property
        def served_model_name(self) -> Optional[str]: ...
        @property
        def model_input(self) -> ModelInput: ...
        @property
        def endpoint_types(self) -> str: ...
        @property
        def custom_jinja_template(self) -> Optional[str]: ...
        @property
        def tool_call_parser(self) -> Optional[str]: ...
        @property
        def reasoning_parser(self) -> Optional[str]: ...
        @property
        def exclude_tools_when_tool_choice_none(self) -> bool: ...
        @property
        def enable_local_indexer(self) -> bool: ...
        @property
        def enable_kv_routing(self) -> bool: ...
        @property
        def metrics_labels(self) -> List[Tuple[str, str]]: ...
        @property
        def runtime(self) -> Optional[backend.RuntimeConfig]: ...
        @property
        def disaggregation_mode(self) -> backend.DisaggregationMode: ...
        @property
        def health_check_payload(self) -> Optional[Any]: ...
        @property
        def structural_tag(self) -> Optional[Any]: ...
        @property
        def route_to_encoder(self) -> bool: ...
        @property
        def media_decoder(self) -> Optional[Any]: ...
        @property
        def media_fetcher(self) -> Optional[Any]: ...
        @property
        def kv_state_endpoint(self) -> Optional[str]: ...
        @property
        def default_thinking_mode(self) -> Optional[Any]: ...

    @final
    class Worker:
        """Serves a Python engine object (see the class docstring of ``backend``)."""

        def __new__(
            cls, engine: Any, config: backend.WorkerConfig, event_loop: Any, raw: bool = False
        ) -> backend.Worker: ...
        def run(self) -> Awaitable[None]:
            """Start, register, serve until shutdown, clean up."""

@final
class Client:
    """A client of one endpoint; its instance list follows discovery live.

    Each call method, awaited, returns an async iterator over the response items:
    ``Annotated``-style objects (``data()``, ``event()``, ``comments()``, ``id()``,
    ``is_error()``) when ``annotated`` is true (the default), raw data otherwise. A request
    that is an async iterable makes a bidirectional call.
    """

    def instance_ids(self) -> List[int]:
        """The known instance ids."""

    def instances(self) -> List[Instance]:
        """The known instances."""

    async def wait_for_instances(self) -> List[int]:
        """Resolves with the instance ids once at least one instance exists."""

    async def wait_for_instance_by_runtime_data(
        self, key: str, value: str, timeout_s: Optional[float] = None
    ) -> int:
        """Wait until exactly one live instance's model card has
        ``runtime_config.runtime_data[key]`` equal to the JSON string ``value``; its id.

        Raises:
            ValueError: ``timeout_s`` negative or not finite.
            TimeoutError: after ``timeout_s`` seconds (the message names the last matches:
                ``last_match_count=N, matching_ids=[...]``).
        """

    async def random(
        self, request: Any, annotated: Optional[bool] = True, context: Optional[Context] = None
    ) -> AsyncIterator[Any]:
        """Send to a random instance."""

    async def round_robin(
        self, request: Any, annotated: Optional[bool] = True, context: Optional[Context] = None
    ) -> AsyncIterator[Any]:
        """Send to the next instance in turn."""

    async def direct(
        self,
        request: Any,
        instance_id: int,
        annotated: Optional[bool] = True,
        context: Optional[Context] = None,
    ) -> AsyncIterator[Any]:
        """Send to one instance (``ValueError`` when it is unknown)."""

    async def generate(
        self, request: Any, annotated: Optional[bool] = True, context: Optional[Context] = None
    ) -> AsyncIterator[Any]:
        """Send with the client's router mode (random when none was given)."""

@final
class ContextMetadata:
    """A live ``str -> str`` mapping shared with its :class:`Context` (sorted keys)."""

    def __getitem__(self, key: str, /) -> str: ...
    def __setitem__(self, key: str, value: str, /) -> None: ...
    def __delitem__(self, key: str, /) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: str, /) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def get(self, key: str, default: Optional[str] = None) -> Optional[str]: ...
    def pop(self, key: str, *args: Optional[str]) -> Optional[str]:
        """Remove ``key``; ``pop(key)`` raises ``KeyError`` when missing, ``pop(key, d)`` returns ``d``."""

    def keys(self) -> List[str]: ...
    def values(self) -> List[str]: ...
    def items(self) -> List[Tuple[str, str]]: ...
    def clear(self) -> None: ...
    def copy(self) -> Dict[str, str]: ...

@final
class Context:
    """The per-request handle: id, cancellation, metadata, spans."""

    def __new__(
        cls, id: Optional[str] = None, metadata: Optional[Dict[str, str]] = None
    ) -> Context:
        """A standalone context (a fresh UUID-like id when ``id`` is None)."""

    def is_stopped(self) -> bool: ...
    def is_killed(self) -> bool: ...
    def stop_generating(self) -> None:
        """Request a graceful stop; propagated to the worker handling a linked call."""

    def id(self) -> str: ...
    def detached(self, id: str) -> Context:
        """A new context with its own cancellation, this id and a copy of the metadata."""

    def async_killed_or_stopped(self) -> Awaitable[bool]:
        """An awaitable resolving to True once the context is stopped or killed."""

    def notify_first_token(self) -> None: ...
    @property
    def metadata(self) -> ContextMetadata: ...
    @metadata.setter
    def metadata(self, value: Dict[str, str]) -> None: ...
    @property
    def trace_id(self) -> Optional[str]: ...
    @property
    def span_id(self) -> Optional[str]: ...
    @property
    def parent_span_id(self) -> Optional[str]: ...
    def trace_headers(self) -> Optional[Dict[str, str]]:
        """W3C trace headers; None without trace information (always, in this build)."""

    def current_span(self) -> SpanProxy: ...
    def start_span(self, name: str, attrs: Optional[Dict[str, Any]] = None) -> SpanProxy: ...

@final
class SpanProxy:
    """A span handle mirroring the OpenTelemetry Span API (validated no-ops in this build)."""

    def set_attribute(self, key: str, value: Any) -> None: ...
    def add_event(self, name: str, attrs: Optional[Dict[str, Any]] = None) -> None: ...
    def set_status(self, status: str, description: Optional[str] = None) -> None:
        """``status`` must be "ok" or "error" (``ValueError`` otherwise)."""

    def close(self) -> None: ...
    def __enter__(self) -> SpanProxy: ...
    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> bool: ...

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

@final
class OverlapScores:
    """Result of a prefix match (:meth:`RadixTree.find_matches`)."""

    @property
    def scores(self) -> Dict[Tuple[int, int], int]:
        """Matched prefix length in blocks, keyed by ``(worker_id, dp_rank)``.

        Ranks that match no block are absent. A new dict is built on every access.
        """

    @property
    def frequencies(self) -> List[int]:
        """For each matched depth, how many lookups touched that block within the tree's
        ``expiration_duration_secs`` window (zeros omitted). Empty when the tree was built
        without a window."""

@final
class RadixTree:
    """In-process prefix index of which ``(worker_id, dp_rank)`` holds which cached blocks.

    Fed with KV events (:meth:`apply_event`), queried with local block hashes
    (:meth:`find_matches`). Thread-safe: any number of threads may query and apply events
    concurrently; queries run in parallel, each event is applied atomically, and every call
    releases the GIL while it works. Removing blocks frees their memory exactly.
    """

    def __new__(cls, expiration_duration_secs: Optional[float] = None) -> RadixTree:
        """Create an empty tree.

        Args:
            expiration_duration_secs: when given, :attr:`OverlapScores.frequencies` reports
                how often each matched block was looked up within this many seconds.

        Raises:
            ValueError: ``expiration_duration_secs`` is negative or not finite.
        """

    def find_matches(self, sequence: List[int], early_exit: bool = False) -> OverlapScores:
        """Score every worker rank by how many leading blocks of ``sequence`` it holds.

        ``sequence`` is a list of local block hashes (``tokens_hash`` values, e.g. from
        :func:`compute_block_hash_for_seq`). With ``early_exit=True`` the walk stops at the
        first depth where a single rank is still matching; that rank's score is then the
        depth reached, not its full match length.

        Raises:
            OverflowError: a hash is negative or does not fit in 64 bits.
            TypeError: ``sequence`` is not a sequence of ints.
        """

    def apply_event(self, worker_id: int, kv_cache_event_bytes: bytes) -> None:
        """Apply one JSON-encoded ``KvCacheEvent`` of ``worker_id``.

        Format: ``{"event_id": int, "data": {"stored": {"parent_hash": int | None,
        "blocks": [{"block_hash": int, "tokens_hash": int}, ...]}} | {"removed":
        {"block_hashes": [int, ...]}} | "cleared", "dp_rank": int (optional, default 0)}``.
        Hashes are unsigned 64-bit integers.

        Raises:
            ValueError: the bytes are not a valid event (malformed JSON, unknown variant,
                missing field, negative or too large integer); message
                ``"Failed to deserialize KvCacheEvent: ..."``. Nothing was applied.
            RuntimeError: ``"Failed to apply event: Failed to find parent block"`` (the
                store's ``parent_hash`` is not a block this rank holds) or ``"Failed to
                apply event: Invalid block sequence"`` (the blocks contain their own
                parent): the event was rejected and the tree is unchanged.
                ``"Failed to apply event: Failed to find block"``: a removed event named
                hashes this rank does not hold; those were skipped, the others removed.
        """

    def remove_worker(self, worker_id: int) -> None:
        """Forget every block of every dp rank of ``worker_id``."""

    def clear_all_blocks(self, worker_id: int) -> None:
        """Drop every block of every dp rank of ``worker_id`` (same effect on scores as
        :meth:`remove_worker`)."""

    def dump_tree_as_events(self) -> List[str]:
        """The tree as JSON ``RouterEvent`` strings, one single-block ``stored`` event per
        ``(worker, dp_rank, block)``, parents first:
        ``{"worker_id": int, "storage_tier": "device", "event": {"event_id": int,
        "data": {"stored": {"parent_hash": int | None, "blocks": [...]}}, "dp_rank": int}}``.
        Applying each ``event`` with its ``worker_id`` to an empty tree reproduces every
        score. Empty when no worker holds a block."""

    def node_count(self) -> int:
        """Number of distinct cached blocks (tree nodes). 0 once every block is removed."""

    def __len__(self) -> int:
        """Number of stored ``(worker, dp_rank, block)`` entries."""

@final
class RouterMode:
    """How a client picks a worker instance (an int-backed enum)."""

    RoundRobin: RouterMode
    Random: RouterMode
    PowerOfTwoChoices: RouterMode
    KV: RouterMode
    Direct: RouterMode
    """The worker id comes from each request's routing hints."""
    LeastLoaded: RouterMode
    DeviceAwareWeighted: RouterMode
    def __int__(self) -> int: ...

@final
class KvRouterConfig:
    """Configuration of the KV-aware router.

    Worker cost (lower is better):
    ``prefill_load_scale * max(0, prefill_blocks - credit) + decode_blocks
    + decode_active_request_weight * active_requests``, where ``credit`` is
    ``overlap_score_credit`` per device-cached block (decayed by
    ``overlap_score_credit_decay`` on workers with excess prefill load) plus the host, disk
    and shared-cache credits. Invalid values raise ``ValueError`` naming the field.

    ``router_replica_sync=True``: routers of the same endpoint (frontends, ``KvRouter``s)
    share their booked load over the event plane, and a late starter catches up from its
    peers' snapshots; a silent peer's bookings expire after
    ``DYN_ROUTER_REPLICA_SYNC_TTL_SECS`` (default 6). See ``docs/design/kv_routing.md``.
    """

    def __new__(
        cls,
        overlap_score_weight: Optional[float] = None,
        host_cache_hit_weight: float = 0.75,
        disk_cache_hit_weight: float = 0.25,
        router_temperature: float = 0.0,
        use_kv_events: bool = True,
        *,
        router_replica_sync: bool = False,
        router_track_active_blocks: bool = True,
        router_track_output_blocks: bool = False,
        router_assume_kv_reuse: bool = True,
        router_track_prefill_tokens: bool = True,
        router_tracking_hash: str = "public-xxh3-v1",
        router_tracking_key_file: Optional[str] = None,
        router_tracking_key_id: Optional[str] = None,
        router_prefill_load_model: str = "none",
        router_ttl_secs: float = 120.0,
        router_queue_threshold: Optional[float] = None,
        router_event_threads: int = 4,
        router_queue_policy: str = "fcfs",
        use_remote_indexer: bool = False,
        serve_indexer: bool = False,
        shared_cache_multiplier: float = 0.0,
        shared_cache_type: str = "none",
        router_predicted_ttl_secs: Optional[float] = None,
        overlap_score_credit: float = 1.0,
        overlap_score_credit_decay: float = 0.0,
        prefill_load_scale: float = 1.0,
        decode_active_request_weight: float = 0.0,
        router_policy_config: Optional[str] = None,
    ) -> KvRouterConfig: ...
    @staticmethod
    def from_json(config_json: str) -> KvRouterConfig:
        """Parse a JSON object (missing fields take their defaults); ``ValueError`` on
        malformed JSON, unknown fields or invalid values."""
    def copy(self) -> KvRouterConfig: ...
    def with_overrides(
        self,
        overlap_score_weight: Optional[float] = None,
        *,
        overlap_score_credit: Optional[float] = None,
        overlap_score_credit_decay: Optional[float] = None,
        prefill_load_scale: Optional[float] = None,
        decode_active_request_weight: Optional[float] = None,
    ) -> KvRouterConfig:
        """A validated copy with the given cost parameters replaced."""
    @property
    def overlap_score_credit(self) -> float: ...
    @overlap_score_credit.setter
    def overlap_score_credit(self, value: float) -> None: ...
    @property
    def overlap_score_credit_decay(self) -> float: ...
    @overlap_score_credit_decay.setter
    def overlap_score_credit_decay(self, value: float) -> None: ...
    @property
    def overlap_score_weight(self) -> float:
        """Deprecated alias of ``prefill_load_scale``; setting 0 also zeroes the credit."""
    @overlap_score_weight.setter
    def overlap_score_weight(self, value: float) -> None: ...
    @property
    def prefill_load_scale(self) -> float: ...
    @prefill_load_scale.setter
    def prefill_load_scale(self, value: float) -> None: ...
    @property
    def decode_active_request_weight(self) -> float: ...

@final
class RouterConfig:
    """Routing mode, KV router configuration and busy thresholds of a client.

    ``active_decode_blocks_threshold`` is a fraction in [0, 1] of the worker's KV blocks,
    ``active_prefill_tokens_threshold`` a token count, ``..._frac`` a fraction of
    ``max_num_batched_tokens``; a worker above any of them is busy. ``enforce_disagg`` is
    accepted and ignored (deprecated).
    """

    router_mode: RouterMode
    kv_router_config: KvRouterConfig
    def __new__(
        cls,
        mode: RouterMode,
        config: Optional[KvRouterConfig] = None,
        active_decode_blocks_threshold: Optional[float] = None,
        active_prefill_tokens_threshold: Optional[int] = None,
        active_prefill_tokens_threshold_frac: Optional[float] = None,
        enforce_disagg: bool = False,
        session_affinity_ttl_secs: Optional[int] = None,
    ) -> RouterConfig: ...

@final
class RoutingConstraints:
    """Placement constraints of a request.

    A worker is eligible only if it carries every ``required_taints`` entry. The weights of
    the worker's matching ``preferred_taints`` are summed and turn into the cost multiplier
    ``exp(-tanh(sum))`` (in [1/e, e]): positive weights favour a worker, negative avoid it.
    """

    required_taints: Set[str]
    preferred_taints: Dict[str, float]
    def __new__(
        cls,
        required_taints: Optional[Set[str]] = None,
        preferred_taints: Optional[Dict[str, float]] = None,
    ) -> RoutingConstraints: ...

@final
class AicPerfConfig:
    """AIConfigurator performance-model specification (``ValueError`` on invalid values)."""

    def __new__(
        cls,
        aic_backend: str,
        aic_system: str,
        aic_model_path: str,
        aic_tp_size: int = 1,
        aic_backend_version: Optional[str] = None,
        aic_moe_tp_size: Optional[int] = None,
        aic_moe_ep_size: Optional[int] = None,
        aic_attention_dp_size: Optional[int] = None,
        aic_nextn: Optional[int] = None,
        aic_nextn_accept_rates: Optional[str] = None,
        aic_gemm_dtype: Optional[str] = None,
        aic_moe_dtype: Optional[str] = None,
        aic_fmha_dtype: Optional[str] = None,
        aic_kv_cache_dtype: Optional[str] = None,
        aic_comm_dtype: Optional[str] = None,
    ) -> AicPerfConfig: ...

# ---------------------------------------------------------------------------------------
# KV routing between processes
# ---------------------------------------------------------------------------------------

class KvStoredEventInput(TypedDict, total=False):
    """A ``stored`` item of :meth:`KvEventPublisher.publish_batch` (``type="stored"``;
    ``token_ids``, ``num_block_tokens`` and ``block_hashes`` are required). Hashes are
    signed 64-bit engine hashes. Unknown keys are rejected."""

    type: str
    token_ids: List[int]
    num_block_tokens: List[int]
    block_hashes: List[int]
    parent_hash: Optional[int]
    block_mm_infos: Optional[List[Optional[Dict[str, Any]]]]
    lora_name: Optional[str]
    is_eagle: Optional[bool]
    cache_salt: Optional[str]

class KvRemovedEventInput(TypedDict, total=False):
    """A ``removed`` item of :meth:`KvEventPublisher.publish_batch` (``type="removed"``)."""

    type: str
    block_hashes: List[int]

@final
class KvEventPublisher:
    """Publishes one worker rank's KV-cache events for the routers of the endpoint's
    component (channel ``kv_events``). Event ids are assigned internally from 0.

    With ``enable_local_indexer=True`` the worker keeps its own index and a replay buffer of
    its last 1024 events, served on ``worker_kv_indexer_query_dp{dp_rank}``: a router that
    missed events recovers from it. With ``zmq_endpoint`` (``tcp://host:port``) the
    publisher relays the engine's KV events from its ZMQ PUB socket (vLLM/SGLang msgpack
    format; messages whose topic starts with ``zmq_topic``, default all).
    """

    def __new__(
        cls,
        endpoint: Endpoint,
        worker_id: Optional[int] = None,
        kv_block_size: int = 0,
        dp_rank: int = 0,
        enable_local_indexer: bool = False,
        zmq_endpoint: Optional[str] = None,
        zmq_topic: Optional[str] = None,
        batching_timeout_ms: Optional[int] = None,
        image_token_id: Optional[int] = None,
        kv_state_endpoint: Optional[str] = None,
    ) -> KvEventPublisher:
        """Raises ``ValueError`` when ``kv_block_size`` is 0 or ``batching_timeout_ms`` >
        15000. ``worker_id=None`` uses the endpoint's connection id."""

    @property
    def kv_block_size(self) -> int: ...
    def publish_stored(
        self,
        token_ids: List[int],
        num_block_tokens: List[int],
        block_hashes: List[int],
        parent_hash: Optional[int] = None,
        block_mm_infos: Optional[List[Optional[Dict[str, Any]]]] = None,
        lora_name: Optional[str] = None,
        is_eagle: Optional[bool] = None,
        cache_salt: Optional[str] = None,
    ) -> None:
        """Publish stored blocks (``tokens_hash`` recomputed from ``token_ids``).
        Blocks whose size is not ``kv_block_size`` are dropped."""

    def publish_removed(self, block_hashes: List[int]) -> None:
        """Publish removed blocks (engine hashes)."""

    def publish_batch(
        self, events: Sequence[Union[KvStoredEventInput, KvRemovedEventInput]]
    ) -> None:
        """Validate the whole list (``ValueError("invalid KV event batch: ...")``, nothing
        published), then publish it in order, coalescing compatible neighbours."""

    def shutdown(self) -> None:
        """Stop serving the replay endpoint."""

    def _subscriber_count(self) -> int: ...
    def _drop_next_events(self, n: int) -> None: ...

@final
class WorkerMetricsPublisher:
    """Publishes a worker's load (channel ``kv_metrics``) for router load balancing."""

    def __new__(cls) -> WorkerMetricsPublisher: ...
    def create_endpoint(self, endpoint: Endpoint) -> Awaitable[None]:
        """Bind to the endpoint's component; ``publish`` has no effect before."""

    def publish(
        self,
        dp_rank: Optional[int] = None,
        active_decode_blocks: Optional[int] = None,
        kv_used_blocks: Optional[int] = None,
        *,
        total_kv_blocks: Optional[int] = None,
        max_num_batched_tokens: Optional[int] = None,
    ) -> None:
        """Publish one rank's load (``dp_rank=None`` means 0). ``total_kv_blocks`` and
        ``max_num_batched_tokens`` (extensions) report the rank's capacity, which the busy
        thresholds and the router queue (``router_queue_threshold``) need."""

@final
class KvIndexer:
    """A KV index fed by the KV events of the endpoint's component, with gap detection and
    recovery from the workers' local indexers. Workers that leave are removed."""

    def __new__(cls, endpoint: Endpoint, block_size: int) -> KvIndexer: ...
    def find_matches(self, sequence: List[int]) -> OverlapScores:
        """Match local block hashes."""

    def find_matches_for_request(
        self, token_ids: List[int], lora_name: Optional[str] = None, is_eagle: Optional[bool] = None
    ) -> OverlapScores:
        """Hash ``token_ids`` with the indexer's block size, then match."""

    def block_size(self) -> int: ...

@final
class ApproxKvIndexer:
    """An index without KV events: routing decisions count as cached for a TTL."""

    def __new__(
        cls, endpoint: Endpoint, kv_block_size: int, router_ttl_secs: float = 120.0
    ) -> ApproxKvIndexer: ...
    def find_matches_for_request(
        self, token_ids: List[int], lora_name: Optional[str] = None, is_eagle: Optional[bool] = None
    ) -> OverlapScores: ...
    def block_size(self) -> int: ...
    def process_routing_decision_for_request(
        self, tokens: List[int], worker_id: int, dp_rank: int = 0
    ) -> Awaitable[None]:
        """Mark the blocks of ``tokens`` as cached on ``(worker_id, dp_rank)``."""

@final
class KvRouter:
    """A KV-aware router over an endpoint's workers: index (KV events or approximate),
    load tracking, router queue and dispatch."""

    def __new__(
        cls,
        endpoint: Endpoint,
        block_size: int,
        kv_router_config: KvRouterConfig,
        aic_perf_config: Optional[AicPerfConfig] = None,
    ) -> KvRouter: ...
    def generate(
        self,
        token_ids: List[int],
        model: str,
        stop_conditions: Optional[Any] = None,
        sampling_options: Optional[Any] = None,
        output_options: Optional[Any] = None,
        router_config_override: Optional[Any] = None,
        worker_id: Optional[int] = None,
        dp_rank: Optional[int] = None,
        extra_args: Optional[Any] = None,
        block_mm_infos: Optional[List[Optional[Dict[str, Any]]]] = None,
        multi_modal_data: Optional[Any] = None,
        mm_routing_info: Optional[Any] = None,
        routing_constraints: Optional[RoutingConstraints] = None,
        response_buffer_size: int = 100,
    ) -> Awaitable[AsyncIterator[Any]]:
        """Route the request and stream the chosen worker's response items (plain data).
        Prefill is marked complete at the first item; the request is freed at the end,
        on error or when the stream is dropped."""

    def generate_from_request(
        self, request: Any, response_buffer_size: int = 100
    ) -> Awaitable[AsyncIterator[Any]]:
        """:meth:`generate` for a ``PreprocessedRequest`` dict."""

    def best_worker(
        self,
        token_ids: List[int],
        router_config_override: Optional[Any] = None,
        request_id: Optional[str] = None,
        update_indexer: bool = False,
        block_mm_infos: Optional[List[Optional[Dict[str, Any]]]] = None,
        lora_name: Optional[str] = None,
        routing_constraints: Optional[RoutingConstraints] = None,
        strict_priority: int = 0,
        policy_class: Optional[str] = None,
        cache_namespace: Optional[str] = None,
    ) -> Awaitable[Tuple[int, int, int]]:
        """``(worker_id, dp_rank, overlap_blocks)``; with ``request_id`` the request is
        booked (call :meth:`mark_prefill_complete` and :meth:`free` later)."""

    def get_potential_loads(
        self,
        token_ids: List[int],
        block_mm_infos: Optional[List[Optional[Dict[str, Any]]]] = None,
        lora_name: Optional[str] = None,
        cache_namespace: Optional[str] = None,
    ) -> Awaitable[List[Dict[str, int]]]: ...
    def get_overlap_scores(
        self,
        token_ids: List[int],
        router_config_override: Optional[Any] = None,
        block_mm_infos: Optional[List[Optional[Dict[str, Any]]]] = None,
        lora_name: Optional[str] = None,
        include_shared: bool = True,
        cache_namespace: Optional[str] = None,
    ) -> Awaitable[Dict[str, Any]]: ...
    def dump_events(self) -> Awaitable[str]:
        """The index as a JSON list of ``RouterEvent`` objects."""

    def mark_prefill_complete(self, request_id: str) -> Awaitable[None]: ...
    def free(self, request_id: str) -> Awaitable[None]: ...
    def _workers(self) -> List[Tuple[int, int]]: ...
    def _queued(self) -> int: ...
    def _capacity(
        self, worker_id: int, dp_rank: int = 0
    ) -> Optional[Tuple[Optional[int], Optional[int]]]: ...
    def _set_worker_taints(self, worker_id: int, taints: Set[str]) -> None: ...

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

# ---------------------------------------------------------------------------------------
# LLM / model
# ---------------------------------------------------------------------------------------

@final
class ModelInput:
    """What a worker's ``generate`` receives (an int-backed enum)."""

    Text: ModelInput
    """The raw OpenAI request; the engine templates and tokenizes itself."""
    Tokens: ModelInput
    """A preprocessed request (``token_ids``, ``stop_conditions``, ``sampling_options``, ...)."""
    Tensor: ModelInput
    """The tensor protocol."""
    def __int__(self) -> int: ...

@final
class ModelType:
    """A set of OpenAI-style API surfaces (bit flags; combine with ``|``).

    ``str()`` gives the flag names joined by ``,`` (``"chat,completions"``); ``Empty`` is
    ``""``. Instances compare equal by value and are hashable.
    """

    Empty: ModelType
    """No surface (prefill and encode workers)."""
    Chat: ModelType
    Completions: ModelType
    Embedding: ModelType
    TensorBased: ModelType
    Prefill: ModelType
    """Legacy marker of prefill workers (not an OpenAI surface)."""
    Images: ModelType
    Audios: ModelType
    Videos: ModelType
    Realtime: ModelType
    Classify: ModelType
    Pooling: ModelType
    def __or__(self, other: ModelType, /) -> ModelType: ...
    def __ror__(self, other: ModelType, /) -> ModelType: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __int__(self) -> int: ...
    def supports_chat(self) -> bool: ...
    def supports_completions(self) -> bool: ...
    def supports_embedding(self) -> bool: ...
    def supports_classify(self) -> bool: ...
    def supports_pooling(self) -> bool: ...

@final
class WorkerType:
    """The role of a worker (an int-backed enum; not combinable).

    ``str()`` gives ``"prefill"``, ``"decode"``, ``"encode"`` or ``"aggregated"``.
    """

    Prefill: WorkerType
    Decode: WorkerType
    Encode: WorkerType
    Aggregated: WorkerType
    """Prefill and decode in one worker (what ``register_model`` assumes by default)."""
    def __int__(self) -> int: ...

@final
class ModelRuntimeConfig:
    """Runtime facts a worker advertises in its model card.

    Setters validate their value (``ValueError``); :meth:`validate` checks the whole
    configuration, as model registration does.
    """

    def __new__(cls) -> ModelRuntimeConfig: ...
    context_length: Optional[int]
    total_kv_blocks: Optional[int]
    max_num_seqs: Optional[int]
    max_num_batched_tokens: Optional[int]
    tool_call_parser: Optional[str]
    reasoning_parser: Optional[str]
    tokenizer_backend: Optional[str]
    """``"default"`` or ``"fastokens"`` (anything else: ``ValueError``)."""
    exclude_tools_when_tool_choice_none: bool
    data_parallel_start_rank: int
    data_parallel_size: int
    enable_local_indexer: bool
    enable_eagle: bool
    taints: Set[str]
    """Caller-managed taints; ``dynamo.topology/*`` is reserved (``ValueError``)."""
    stable_routing_id: Optional[str]
    @property
    def runtime_data(self) -> Dict[str, str]:
        """Engine-specific values (:meth:`set_engine_specific`), each as JSON text."""
    topology_domains: Dict[str, str]
    kv_transfer_domain: Optional[str]
    kv_transfer_enforcement: Optional[str]
    """``"required"``, ``"preferred"`` or None (``""`` reads back as None)."""
    kv_transfer_preferred_weight: Optional[float]
    @property
    def bootstrap_host(self) -> Optional[str]: ...
    @property
    def bootstrap_port(self) -> Optional[int]: ...
    kv_event_publishing_enabled: Optional[bool]
    kv_event_source_mode: Optional[str]
    kv_state_endpoint: Optional[str]
    def set_engine_specific(self, key: str, value: Any) -> None:
        """Store a value: JSON text (invalid JSON: ``ValueError``) or any JSON-able object."""
    def get_engine_specific(self, key: str) -> Optional[str]:
        """The value as JSON text, or None."""
    def set_structural_tag_mode(self, mode: str) -> None:
        """``"off"`` or ``"on"`` (anything else: ``ValueError``)."""
    def set_structural_tag_scope(self, scope: str) -> None:
        """``"auto"`` or ``"always"`` (anything else: ``ValueError``)."""
    def set_structural_tag_schema(self, schema: str) -> None:
        """``"auto"`` or ``"strict"`` (anything else: ``ValueError``)."""
    def set_disaggregated_endpoint(
        self, bootstrap_host: Optional[str] = None, bootstrap_port: Optional[int] = None
    ) -> None: ...
    def validate(self) -> None:
        """Check the whole configuration (``ValueError`` naming the first bad field)."""
    def to_json(self) -> str: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class ModelDeploymentCard:
    """The model metadata (MDC) a worker registers: name, surfaces, input, runtime config
    and the model's metadata files with blake3 checksums."""

    @staticmethod
    def load(path: str | os.PathLike[str], model_name: Optional[str] = None) -> ModelDeploymentCard:
        """Build a card from a local model directory (``config.json`` and/or
        ``tokenizer.json``, plus ``tokenizer_config.json`` and ``generation_config.json``
        when present).

        Raises:
            FileNotFoundError: ``path`` is not a directory (the message names it).
            ValueError: the directory has no model files, or one is malformed.
        """
    def to_json_str(self) -> str: ...
    @staticmethod
    def from_json_str(json: str) -> ModelDeploymentCard:
        """Parse a card (``ValueError`` when malformed)."""
    def model_type(self) -> ModelType: ...
    def source_path(self) -> str: ...
    def local_dir(self) -> str:
        """The directory the metadata files were read from (``ValueError`` if not UTF-8)."""
    def name(self) -> str: ...
    def runtime_config(self) -> Any:
        """The runtime config as a dict."""
    def mdcsum(self) -> str:
        """Checksum of what must agree between workers serving the same model."""
    def __eq__(self, other: object, /) -> bool: ...

@final
class MediaDecoder:
    """Which media the frontend decodes for a model (``register_model(media_decoder=)``).

    Without one, image parts reach the chat template as they are. See
    ``docs/design/multimodal.md``.
    """

    def __init__(self) -> None: ...
    def enable_image(self, decoder_options: Dict[str, Any]) -> None:
        """Decode PNG, JPEG, WebP and GIF (first frame) images to RGB8.

        ``decoder_options``: ``{"limits": {"max_image_width": int, "max_image_height": int,
        "max_alloc": int, "max_pixels": int}, "formats": ["png", "jpeg", "webp", "gif"]}``,
        every key optional (defaults 16384, 16384, 512 MiB, 50 MP, all formats).

        Raises:
            ValueError: an unknown key, a bad value or an unsupported format.
        """

@final
class MediaFetcher:
    """How the frontend fetches image URLs for a model (``register_model(media_fetcher=)``).

    Secure by default: IP-literal hosts, non-default ports and names resolving to private,
    loopback, link-local, CGNAT, unique-local or metadata-service addresses are refused
    (checked on the resolved addresses and again on every redirect); bodies are capped at
    20 MiB, must be ``image/*`` and must arrive within 30 s. The setters return None.
    """

    def __init__(self) -> None: ...
    def user_agent(self, user_agent: str) -> None: ...
    def allow_direct_ip(self, allow: bool) -> None:
        """Allow IP-literal hosts and addresses of every class."""
    def allow_direct_port(self, allow: bool) -> None:
        """Allow explicit non-default ports."""
    def allow_private_ips(self, allow: bool) -> None:
        """Allow names that resolve to private addresses (IP literals stay refused)."""
    def allowed_media_domains(self, domains: List[str]) -> None:
        """Only fetch from these domains and their subdomains."""
    def timeout_ms(self, timeout_ms: int) -> None:
        """Whole-fetch timeout (``ValueError`` for 0)."""
    def max_bytes(self, max_bytes: int) -> None:
        """Largest response or data-URL payload (``ValueError`` for 0)."""

def resolve_routing_image_token_id(model_id: str, model_dir: Optional[str] = None) -> Optional[int]:
    """The image placeholder token id the frontend repeats for each image of a model
    (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA, Llama-4, Gemma-3, InternVL), read from
    ``config.json`` (``image_token_id`` / ``image_token_index``) or else the tokenizer;
    None for other families or unreadable files. ``model_dir`` defaults to ``model_id``."""

def lora_name_to_id(lora_name: str) -> int:
    """A deterministic positive 31-bit id for a LoRA adapter name (blake3-based; the
    reference's values)."""

@final
class LoRADownloader:
    """Resolves LoRA adapter URIs to local directories through an on-disk cache.

    Sources: ``file:///path`` (returned as is once it holds ``adapter_config.json`` plus
    ``adapter_model.safetensors``, ``adapter_model.bin`` or ``model.lora_weights.npy``) and
    ``s3://bucket/prefix`` (every object under the prefix, downloaded into the cache with
    the standard ``AWS_*`` environment variables; see ``docs/design/lora.md``).

    The cache root is ``cache_path``, else ``$DYN_LORA_PATH``, else
    ``~/.cache/dynamo_loras`` (``RuntimeError`` when none can be determined).
    """

    def __new__(cls, cache_path: Optional[str] = None) -> LoRADownloader: ...
    def download_if_needed(self, lora_uri: str) -> Awaitable[str]:
        """The adapter's local directory, downloading it first when it is not cached.

        Raises:
            ValueError: a scheme other than ``file://`` / ``s3://``, or a malformed URI.
            RuntimeError: ``"Download failed: <uri>: <cause>"`` for everything else (a
                missing path or object, refused credentials, a broken transfer, a
                download that is not an adapter).
        """
    def get_cache_path(self, cache_key: str) -> str:
        """The cache directory of ``cache_key`` (``ValueError`` for a key that would name
        a path outside the cache: empty, ``.``, ``..`` or containing a separator)."""
    def is_cached(self, lora_uri: str) -> bool:
        """Whether a URI (or, without ``://``, a cache key) is available locally."""
    def validate_cached(self, cache_key: str) -> bool:
        """Whether the entry ``cache_key`` holds ``adapter_config.json`` plus weights
        (``RuntimeError`` when it cannot be inspected, e.g. permission denied)."""
    @staticmethod
    def uri_to_cache_key(uri: str) -> str:
        """The reference's cache key: ``://`` becomes ``__``, then ``/``, ``\\`` and ``.``
        become ``_`` (``s3://b/a/x.y`` -> ``s3__b_a_x_y``)."""

async def fetch_model(remote_name: str, ignore_weights: bool = False) -> str:
    """The local directory of a model.

    ``remote_name`` is a local directory (returned as given) or a Hugging Face repo id
    (``org/name``, optionally ``hf://org/name``) already in the offline Hugging Face cache
    (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``). Nothing is
    downloaded.

    Raises:
        FileNotFoundError: not found; the message lists every path tried.
    """

@final
class ReasoningConfig:
    """Mocker reasoning simulation (``ValueError`` unless ``0 <= thinking_ratio <= 1``)."""

    def __new__(
        cls, start_thinking_token_id: int, end_thinking_token_id: int, thinking_ratio: float
    ) -> ReasoningConfig: ...

@final
class SglangArgs:
    """SGLang-scheduler options of the mocker (accepted; not modelled)."""

    def __new__(
        cls,
        schedule_policy: Optional[str] = None,
        page_size: Optional[int] = None,
        max_prefill_tokens: Optional[int] = None,
        chunked_prefill_size: Optional[int] = None,
        clip_max_new_tokens: Optional[int] = None,
        schedule_conservativeness: Optional[float] = None,
    ) -> SglangArgs: ...

@final
class TrtllmArgs:
    """TensorRT-LLM-scheduler options of the mocker (accepted; not modelled)."""

    def __new__(cls, capacity_scheduler_policy: Optional[str] = None) -> TrtllmArgs: ...

@final
class MockEngineArgs:
    """Configuration of the mocker (simulated engine).

    ``None`` (and ``block_size=0``) select the engine's defaults (16384 blocks of 64
    tokens); ``max_num_seqs`` defaults to 256 and ``max_num_batched_tokens`` to 8192. Options of the reference that the mocker does not model (AIConfigurator,
    KV-transfer, offload tiers, ...) are accepted and listed by
    :meth:`unsupported_in_use` when set to values that would change a real engine's
    behaviour.

    Raises:
        ValueError: an invalid value (the message names the field).
    """

    def __new__(
        cls,
        engine_type: str = "vllm",
        num_gpu_blocks: Optional[int] = None,
        block_size: int = 0,
        max_num_seqs: Optional[int] = ...,
        max_num_batched_tokens: Optional[int] = ...,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        speedup_ratio: float = 1.0,
        decode_speedup_ratio: float = 1.0,
        dp_size: int = 1,
        startup_time: Optional[float] = None,
        worker_type: str = "aggregated",
        planner_profile_data: Optional[str | os.PathLike[str]] = None,
        aic_backend: Optional[str] = None,
        aic_system: Optional[str] = None,
        aic_backend_version: Optional[str] = None,
        aic_tp_size: Optional[int] = None,
        aic_model_path: Optional[str] = None,
        aic_moe_tp_size: Optional[int] = None,
        aic_moe_ep_size: Optional[int] = None,
        aic_attention_dp_size: Optional[int] = None,
        aic_nextn: Optional[int] = None,
        aic_nextn_accept_rates: Optional[str] = None,
        aic_mtp_seed: int = 42,
        aic_gemm_dtype: Optional[str] = None,
        aic_moe_dtype: Optional[str] = None,
        aic_fmha_dtype: Optional[str] = None,
        aic_kv_cache_dtype: Optional[str] = None,
        aic_comm_dtype: Optional[str] = None,
        gpu_memory_utilization: Optional[float] = None,
        mem_fraction_static: Optional[float] = None,
        free_gpu_memory_fraction: Optional[float] = None,
        enable_local_indexer: bool = False,
        bootstrap_port: Optional[int] = None,
        handoff_session_timeout_ms: int = 300000,
        kv_bytes_per_token: Optional[int] = None,
        kv_transfer_bandwidth: Optional[float] = None,
        kv_transfer_timing_mode: str = "full_prompt",
        reasoning: Optional[ReasoningConfig] = None,
        response_replay_trace_path: Optional[str | os.PathLike[str]] = None,
        zmq_kv_events_port: Optional[int] = None,
        zmq_replay_port: Optional[int] = None,
        preemption_mode: str = "lifo",
        router_queue_policy: Optional[str] = None,
        sglang: Optional[SglangArgs] = None,
        trtllm: Optional[TrtllmArgs] = None,
        num_g2_blocks: Optional[int] = None,
        num_g3_blocks: Optional[int] = None,
        offload_batch_size: Optional[int] = None,
        bandwidth_g1_to_g2_gbps: Optional[float] = None,
        bandwidth_g2_to_g1_gbps: Optional[float] = None,
        bandwidth_g2_to_g3_gbps: Optional[float] = None,
        bandwidth_g3_to_g2_gbps: Optional[float] = None,
        enable_g4_storage: bool = False,
        bandwidth_g2_to_g4_gbps: Optional[float] = None,
        bandwidth_g4_to_g2_gbps: Optional[float] = None,
        max_model_len: Optional[int] = None,
    ) -> MockEngineArgs: ...
    @staticmethod
    def from_json(config_json: str) -> MockEngineArgs:
        """Parse a JSON object -- the flat form (these arguments), or the reference's
        mapping form ``{"engine": {...}, "dynamo": {...}}``; missing fields take their
        defaults (``ValueError`` on unknown fields or invalid values)."""
    def to_json(self) -> str:
        """The arguments as JSON (accepted by :meth:`from_json`)."""
    def copy(self) -> MockEngineArgs: ...
    def unsupported_in_use(self) -> List[str]: ...
    def is_prefill(self) -> bool: ...
    def is_decode(self) -> bool: ...
    def with_overrides(
        self,
        bootstrap_port: Optional[int] = None,
        zmq_kv_events_port: Optional[int] = None,
        zmq_replay_port: Optional[int] = None,
        kv_bytes_per_token: Optional[int] = None,
        num_gpu_blocks: Optional[int] = None,
        aic_backend: Optional[str] = None,
        aic_system: Optional[str] = None,
        aic_backend_version: Optional[str] = None,
        aic_tp_size: Optional[int] = None,
        aic_model_path: Optional[str] = None,
        aic_moe_tp_size: Optional[int] = None,
        aic_moe_ep_size: Optional[int] = None,
        aic_attention_dp_size: Optional[int] = None,
        aic_nextn: Optional[int] = None,
        aic_nextn_accept_rates: Optional[str] = None,
        aic_mtp_seed: Optional[int] = None,
        aic_gemm_dtype: Optional[str] = None,
        aic_moe_dtype: Optional[str] = None,
        aic_fmha_dtype: Optional[str] = None,
        aic_kv_cache_dtype: Optional[str] = None,
        aic_comm_dtype: Optional[str] = None,
        gpu_memory_utilization: Optional[float] = None,
        mem_fraction_static: Optional[float] = None,
        free_gpu_memory_fraction: Optional[float] = None,
        enable_prefix_caching: Optional[bool] = None,
        worker_type: Optional[str] = None,
    ) -> MockEngineArgs:
        """A validated copy with the given (non-None) values replaced."""
    num_gpu_blocks: int
    enable_prefix_caching: bool
    worker_type: str
    """``"aggregated"``, ``"prefill"`` or ``"decode"``."""
    @property
    def block_size(self) -> int: ...
    @property
    def max_model_len(self) -> Optional[int]: ...
    @property
    def max_num_seqs(self) -> Optional[int]: ...
    @property
    def max_num_batched_tokens(self) -> Optional[int]: ...
    @property
    def enable_local_indexer(self) -> bool: ...
    @property
    def dp_size(self) -> int: ...
    @property
    def engine_type(self) -> str: ...
    @property
    def bootstrap_port(self) -> Optional[int]: ...
    @property
    def handoff_session_timeout_ms(self) -> int: ...
    @property
    def kv_transfer_timing_mode(self) -> str: ...
    @property
    def response_replay_trace_path(self) -> Optional[os.PathLike[str]]: ...
    @property
    def num_g2_blocks(self) -> Optional[int]: ...
    @property
    def num_g3_blocks(self) -> Optional[int]: ...
    @property
    def offload_batch_size(self) -> Optional[int]: ...
    @property
    def bandwidth_g1_to_g2_gbps(self) -> Optional[float]: ...
    @property
    def bandwidth_g2_to_g1_gbps(self) -> Optional[float]: ...
    @property
    def bandwidth_g2_to_g3_gbps(self) -> Optional[float]: ...
    @property
    def bandwidth_g3_to_g2_gbps(self) -> Optional[float]: ...
    @property
    def bandwidth_g2_to_g4_gbps(self) -> Optional[float]: ...
    @property
    def bandwidth_g4_to_g2_gbps(self) -> Optional[float]: ...
    @property
    def enable_g4_storage(self) -> bool: ...
    @property
    def aic_backend(self) -> Optional[str]: ...
    @aic_backend.setter
    def aic_backend(self, value: Optional[str]) -> None: ...
    @property
    def aic_system(self) -> Optional[str]: ...
    @aic_system.setter
    def aic_system(self, value: Optional[str]) -> None: ...
    @property
    def aic_backend_version(self) -> Optional[str]: ...
    @aic_backend_version.setter
    def aic_backend_version(self, value: Optional[str]) -> None: ...
    @property
    def aic_model_path(self) -> Optional[str]: ...
    @aic_model_path.setter
    def aic_model_path(self, value: Optional[str]) -> None: ...
    @property
    def aic_gemm_dtype(self) -> Optional[str]: ...
    @aic_gemm_dtype.setter
    def aic_gemm_dtype(self, value: Optional[str]) -> None: ...
    @property
    def aic_moe_dtype(self) -> Optional[str]: ...
    @aic_moe_dtype.setter
    def aic_moe_dtype(self, value: Optional[str]) -> None: ...
    @property
    def aic_fmha_dtype(self) -> Optional[str]: ...
    @aic_fmha_dtype.setter
    def aic_fmha_dtype(self, value: Optional[str]) -> None: ...
    @property
    def aic_kv_cache_dtype(self) -> Optional[str]: ...
    @aic_kv_cache_dtype.setter
    def aic_kv_cache_dtype(self, value: Optional[str]) -> None: ...
    @property
    def aic_comm_dtype(self) -> Optional[str]: ...
    @aic_comm_dtype.setter
    def aic_comm_dtype(self, value: Optional[str]) -> None: ...
    @property
    def aic_nextn_accept_rates(self) -> Optional[str]: ...
    @aic_nextn_accept_rates.setter
    def aic_nextn_accept_rates(self, value: Optional[str]) -> None: ...
    @property
    def aic_tp_size(self) -> Optional[int]: ...
    @aic_tp_size.setter
    def aic_tp_size(self, value: Optional[int]) -> None: ...
    @property
    def aic_moe_tp_size(self) -> Optional[int]: ...
    @aic_moe_tp_size.setter
    def aic_moe_tp_size(self, value: Optional[int]) -> None: ...
    @property
    def aic_moe_ep_size(self) -> Optional[int]: ...
    @aic_moe_ep_size.setter
    def aic_moe_ep_size(self, value: Optional[int]) -> None: ...
    @property
    def aic_attention_dp_size(self) -> Optional[int]: ...
    @aic_attention_dp_size.setter
    def aic_attention_dp_size(self, value: Optional[int]) -> None: ...
    @property
    def aic_nextn(self) -> Optional[int]: ...
    @aic_nextn.setter
    def aic_nextn(self, value: Optional[int]) -> None: ...
    @property
    def aic_mtp_seed(self) -> int: ...
    @aic_mtp_seed.setter
    def aic_mtp_seed(self, value: int) -> None: ...
    @property
    def gpu_memory_utilization(self) -> Optional[float]: ...
    @gpu_memory_utilization.setter
    def gpu_memory_utilization(self, value: Optional[float]) -> None: ...
    @property
    def mem_fraction_static(self) -> Optional[float]: ...
    @mem_fraction_static.setter
    def mem_fraction_static(self, value: Optional[float]) -> None: ...
    @property
    def free_gpu_memory_fraction(self) -> Optional[float]: ...
    @free_gpu_memory_fraction.setter
    def free_gpu_memory_fraction(self, value: Optional[float]) -> None: ...
    def __eq__(self, other: object, /) -> bool: ...

# ---------------------------------------------------------------------------------------
# LLM serving: model registration, the OpenAI frontend, entry points
# ---------------------------------------------------------------------------------------

async def register_model(
    model_input: ModelInput,
    model_type: ModelType,
    endpoint: Endpoint,
    model_path: str,
    model_name: Optional[str] = None,
    *,
    worker_type: Optional[WorkerType] = None,
    context_length: Optional[int] = None,
    kv_cache_block_size: Optional[int] = None,
    router_mode: Optional[RouterMode] = None,
    router_config: Optional[RouterConfig] = None,
    runtime_config: Optional[ModelRuntimeConfig] = None,
    tensor_model_config: Optional[Dict[str, Any]] = None,
    user_data: Optional[Dict[str, Any]] = None,
    custom_template_path: Optional[str] = None,
    media_decoder: Optional[MediaDecoder] = None,
    media_fetcher: Optional[MediaFetcher] = None,
    forward_inline_media_in_messages: Optional[bool] = None,
    lora_name: Optional[str] = None,
    base_model_path: Optional[str] = None,
    needs: Optional[List[List[WorkerType]]] = None,
    self_host_metadata: Optional[bool] = None,
    ignore_weights: bool = False,
    max_gpu_lora_count: Optional[int] = None,
    model_aliases: Optional[List[str]] = None,
    migration_limit: int = 0,
) -> None:
    """Publish this worker's model card in discovery next to its endpoint instance, so
    frontends serve the model. The card disappears with the worker process.

    ``worker_type`` defaults to ``WorkerType.Aggregated``; ``context_length`` overrides the
    model's. ``model_path`` is a local directory (or a repo id in the offline Hugging Face
    cache).

    Raises:
        ValueError: an invalid argument combination (see the contract's rules).
        FileNotFoundError: the model or ``custom_template_path`` does not exist.
    """

async def unregister_model(endpoint: Endpoint, lora_name: Optional[str] = None) -> None:
    """Remove this worker's base model card (or the LoRA adapter card)."""

async def update_model_taints(endpoint: Endpoint, taints: Set[str]) -> None:
    """Replace the caller-managed taints on this worker's base model card.

    Raises:
        ValueError: a reserved ``dynamo.topology/`` taint, or no card registered here.
    """

@final
class EngineType:
    """The engine an entry point runs (an int-backed enum)."""

    Echo: EngineType
    """An in-process echo engine: streams the templated, tokenized prompt back as the answer
    (``DYN_TOKEN_ECHO_DELAY_MS`` apart, default 10 ms)."""
    Dynamic: EngineType
    """The frontend: workers discovered through the runtime."""
    Mocker: EngineType
    """The simulated engine."""
    def __int__(self) -> int: ...

@final
class EngineConfig:
    """What ``make_engine`` built; consumed by ``run_input``."""

@final
class EntrypointArgs:
    """Arguments of :func:`make_engine`. Options this build does not model are accepted.

    ``mocker_engine_args`` is a :class:`MockEngineArgs` or the reference 1.6.x mapping form
    ``{"engine": {...}, "dynamo": {...}}`` plus launch options beside them (``dp_size``,
    ``startup_time``, ...); ``engine.backend`` is ``engine_type``.

    Raises:
        ValueError: ``tls_cert_path`` without ``tls_key_path`` (or the reverse), an
            unsupported router mode, unreadable ``extra_engine_args``, or a
            ``mocker_engine_args`` mapping with an unknown key (named, e.g.
            ``engine.bogus``) or an invalid value.
        TypeError: ``mocker_engine_args`` neither a ``MockEngineArgs`` nor a mapping.
        RuntimeError: ``chat_engine_factory`` given while no event loop runs.

    ``chat_engine_factory``: an async callable ``(ModelCardInstanceId, ModelDeploymentCard,
    RoutedEngine) -> PythonAsyncEngine`` (or ``HttpAsyncEngine``), called on the event loop
    running when the args are made, once per discovered chat token model (HTTP input). The
    model's chat completions are then served by the engine it returns; while it runs they
    wait, and when it raises they answer 503 with its message while it is retried (1 s,
    2 s, 4 s, ... at most 30 s apart).
    """

    def __new__(
        cls,
        engine_type: EngineType,
        model_path: Optional[str] = None,
        model_name: Optional[str] = None,
        endpoint_id: Optional[str] = None,
        context_length: Optional[int] = None,
        template_file: Optional[str] = None,
        router_config: Optional[RouterConfig] = None,
        kv_cache_block_size: Optional[int] = None,
        http_host: Optional[str] = None,
        http_port: Optional[int] = None,
        http_metrics_port: Optional[int] = None,
        tls_cert_path: Optional[str] = None,
        tls_key_path: Optional[str] = None,
        extra_engine_args: Optional[str | os.PathLike[str]] = None,
        mocker_engine_args: Optional[MockEngineArgs | Mapping[str, Any]] = None,
        runtime_config: Optional[ModelRuntimeConfig] = None,
        namespace: Optional[str] = None,
        namespace_prefix: Optional[str] = None,
        is_prefill: bool = False,
        is_decode: bool = False,
        migration_limit: int = 0,
        migration_max_seq_len: Optional[int] = None,
        chat_engine_factory: Optional[Callable[..., Any]] = None,
        aic_perf_config: Optional[AicPerfConfig] = None,
        *,
        metrics_prefix: Optional[str] = None,
        enable_anthropic_api: Optional[bool] = None,
        strip_anthropic_preamble: Optional[bool] = None,
        enable_streaming_tool_dispatch: Optional[bool] = None,
        enable_streaming_reasoning_dispatch: Optional[bool] = None,
        tokenizer_backend: Optional[str] = None,
        media_decoder: Optional[MediaDecoder] = None,
        media_fetcher: Optional[MediaFetcher] = None,
    ) -> EntrypointArgs: ...

async def make_engine(
    distributed_runtime: DistributedRuntime, args: EntrypointArgs
) -> EngineConfig:
    """Build the engine: ``Dynamic`` → the discovery-driven frontend, ``Mocker`` → the
    simulated engine (``mocker_engine_args``, else ``extra_engine_args``, else defaults),
    ``Echo`` → the echo engine. ``Echo`` and ``Mocker`` need a local ``model_path`` (its
    tokenizer and chat template).

    Raises:
        ValueError: ``model_path`` missing or not a usable model directory.
    """

async def run_input(
    runtime: DistributedRuntime,
    input: str,
    engine_config: EngineConfig,
    frontend_route_extensions: Optional[Iterable[FrontendRoute]] = None,
) -> None:
    """Run ``engine_config`` behind ``input``:

    * ``"http"``: the OpenAI API (discovered workers, plus the in-process engine of ``Echo``
      / ``Mocker``) until the runtime stops;
    * ``"dyn://ns.comp.ep"``: serve an ``Echo`` / ``Mocker`` engine as a worker endpoint and
      register its model card, until the runtime stops;
    * ``"text"``: an interactive chat on stdin/stdout (one message per line, the answer
      streamed to stdout, the conversation kept) until EOF;
    * ``"stdin"``: all of stdin is one message; prints the answer and returns;
    * ``"grpc"``: the KServe v2 gRPC API (see :class:`KserveGrpcService`) on the engine's
      ``http_host`` / ``http_port``, until the runtime stops.

    ``text`` and ``stdin`` use the in-process engine, or for ``Dynamic`` wait for a
    discovered chat model.

    ``frontend_route_extensions`` (``"http"`` only): extra ``GET`` routes (see
    :class:`FrontendRoute`).

    Raises:
        ValueError: an unknown or unsupported input for this engine; two extension routes
            on one path (``duplicate frontend route registered: GET /x``, at the call); an
            extension on a built-in ``GET`` path (``duplicate HTTP route registered: GET
            /health conflicts with GET /health``, when awaited, before serving).
        TypeError: an extension that is not a :class:`FrontendRoute`.
    """

def run_inputs_blocking(
    inputs: Sequence[Tuple[DistributedRuntime, str, EntrypointArgs]],
) -> None:
    """Run each ``(runtime, input, args)`` as ``await run_input(runtime, input, await
    make_engine(runtime, args))`` would, all at once, blocking the calling thread (the GIL
    released) without an asyncio event loop, until every one has returned.

    SIGINT and SIGTERM start every runtime's graceful shutdown (while it runs, SIGINT does
    not raise ``KeyboardInterrupt``; Python's handler is restored on return). The first
    input to fail shuts the others down, and its error is raised once they have stopped.
    When all have returned, every runtime is shut down. Meant to be called once, from the
    main thread of a command-line entry point whose engines run no Python code (this
    project's ``python -m dynamo.frontend`` and ``python -m dynamo.mocker``): such a process
    need not import :mod:`asyncio`. The runtimes may be created with ``event_loop=None``.

    Raises:
        ValueError: as ``make_engine`` / ``run_input`` for bad arguments (before anything is
            served); an engine with a ``chat_engine_factory`` (it calls Python).
        DynamoException: as the awaited ``run_input`` would (``Unknown``: ``cannot listen
            on 127.0.0.1:8000: Address already in use``, ...).
    """

@final
class FrontendExtensionContext:
    """A read-only, live view of the frontend given to :class:`FrontendRoute` handlers
    (never constructed by users)."""

    def is_ready(self) -> bool:
        """Whether the frontend serves (is not draining)."""
        ...
    def is_cancelled(self) -> bool:
        """Whether the frontend is shutting down (draining)."""
        ...
    def has_any_ready_model(self) -> bool:
        """Whether some model has a live worker (or is in-process)."""
        ...
    def is_model_ready_to_serve(self, model: str) -> bool:
        """Whether ``model`` is served and a live worker serves it."""
        ...
    def model_display_names(self) -> List[str]:
        """Every served model's name, sorted."""
        ...
    def serving_ready_display_names(self) -> List[str]:
        """The served models with a live worker, sorted."""
        ...

@final
class FrontendRoute:
    """A trusted extension route on the HTTP frontend.

    ``method`` must be ``"GET"`` (any case); ``path`` must start with ``/`` and hold no
    ``{``, ``}``, ``*``, whitespace or control characters. ``handler`` is a synchronous
    callable taking a :class:`FrontendExtensionContext`; it runs on a blocking thread and
    returns a JSON-serializable body (HTTP 200; tuples and sets become arrays) or a
    :class:`FrontendResponse`. Any failure (an exception, an awaitable, an unserializable
    body) answers 500 ``{"error": "frontend route extension failed"}``.

    Raises:
        TypeError: ``handler`` is not callable.
        ValueError: another method, a non-static path, or an ``async def`` handler.
    """

    def __new__(
        cls, method: str, path: str, handler: Callable[[FrontendExtensionContext], Any]
    ) -> FrontendRoute: ...
    @property
    def method(self) -> str:
        """Always ``"GET"``."""
        ...
    @property
    def path(self) -> str: ...

@final
class FrontendResponse:
    """A handler's answer with an explicit status (``ValueError`` outside 100..=999)."""

    def __new__(cls, status_code: int, body: Any) -> FrontendResponse: ...

@final
class HttpService:
    """An OpenAI-compatible HTTP ingress following the runtime's model cards, plus in-process
    models added with :meth:`add_chat_completions_model` / :meth:`add_completions_model`.

    Args:
        port: the port (default 8080; 0 picks a free one).
        wait_for_first_item: a streaming request to an added model waits for the engine's
            first item before committing HTTP 200, so an error raised before the first
            ``yield`` answers with its status, as for a non-streaming request. When False,
            ``DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS`` (milliseconds, unset or 0: no wait)
            applies and such an error is an SSE ``error`` event.
    """

    def __new__(
        cls, port: Optional[int] = None, *, wait_for_first_item: bool = False
    ) -> HttpService: ...
    def add_chat_completions_model(
        self, model: str, checksum: str, engine: PythonAsyncEngine | HttpAsyncEngine
    ) -> None:
        """Serve ``engine`` on ``/v1/chat/completions`` as ``model`` (replacing one of that
        name); it is listed by ``/v1/models``."""

    def add_completions_model(
        self, model: str, checksum: str, engine: PythonAsyncEngine | HttpAsyncEngine
    ) -> None:
        """Serve ``engine`` on ``/v1/completions`` as ``model``."""

    def remove_chat_completions_model(self, model: str) -> None:
        """Stop serving chat model ``model``.

        Raises:
            ValueError: ``model`` is not served.
        """

    def remove_completions_model(self, model: str) -> None:
        """Stop serving completions model ``model``.

        Raises:
            ValueError: ``model`` is not served.
        """

    def list_chat_completions_models(self) -> List[str]:
        """The added chat models, sorted."""

    def list_completions_models(self) -> List[str]:
        """The added completions models, sorted."""

    def enable_endpoint(self, endpoint_type: str, enabled: bool) -> None:
        """Turn an endpoint family on or off (all are on by default; a disabled one answers
        404). Types: ``chat``, ``completion``, ``embedding``, ``images``, ``audios``,
        ``videos``, ``realtime``, ``classify``, ``pooling``, ``rerank``, ``responses``,
        ``anthropic_messages``, ``generate``, ``batch``.

        Raises:
            ValueError: an unknown type, or ``batch`` (as in the reference: "batch endpoint
                availability is fixed when the HTTP service is built").
        """
    async def run(self, runtime: DistributedRuntime) -> None:
        """Serve until :meth:`shutdown` or the runtime stops."""

    def shutdown(self) -> None:
        """Stop serving."""

@final
class PythonAsyncEngine:
    """A Python callable returning an async generator, wrapped as an in-process engine.

    ``generator(request)`` (or ``generator(request, context=...)`` when it declares a
    ``context`` parameter) receives the OpenAI request as a dict and yields OpenAI response
    chunk dicts; it runs on ``event_loop``. A client that disconnects cancels it (and stops
    ``context``). Exceptions: ``ValueError`` / ``TypeError`` answer 400, anything else 500.
    """

    def __new__(cls, generator: Any, event_loop: Any) -> PythonAsyncEngine: ...

@final
class HttpAsyncEngine:
    """A :class:`PythonAsyncEngine` whose ``HttpError`` exceptions (anything with an int
    ``.code`` in 400..599 and a ``.message``) answer with that status; after the first
    chunk they end the stream with an SSE ``error`` event."""

    def __new__(cls, generator: Any, event_loop: Any) -> HttpAsyncEngine: ...

@final
class KserveGrpcService:
    """A KServe v2 gRPC ingress (``inference.GRPCInferenceService``) following the
    runtime's model cards, plus in-process models added with :meth:`add_completions_model`,
    :meth:`add_chat_completions_model` and :meth:`add_tensor_model`.

    Text models take a ``text_input`` BYTES tensor (and an optional ``stream`` BOOL, or a
    ``stream`` request parameter; sampling fields as tensors or parameters) and
    answer ``text_output`` and ``finish_reason`` BYTES tensors; tensor models' handlers
    receive ``{"id", "model", "tensors": [{"metadata": {"name", "data_type", "shape"},
    "data": {"data_type", "values"}}], "parameters"?}`` and answer ``{"tensors": [...]}``.

    Args:
        port: the port (default 8787; 0 picks a free one).
        host: the listen address (default ``0.0.0.0``).
    """

    def __new__(
        cls, port: Optional[int] = None, host: Optional[str] = None
    ) -> KserveGrpcService: ...
    def add_completions_model(
        self, model: str, checksum: str, engine: PythonAsyncEngine | HttpAsyncEngine
    ) -> None:
        """Serve ``engine`` as text model ``model`` (it receives an OpenAI completions
        request and yields completion chunks)."""

    def add_chat_completions_model(
        self, model: str, checksum: str, engine: PythonAsyncEngine | HttpAsyncEngine
    ) -> None:
        """Add chat model ``model`` (listed and ready; ``ModelInfer`` serves completions
        models only, as in the reference)."""

    def add_tensor_model(
        self,
        model: str,
        checksum: str,
        engine: PythonAsyncEngine | HttpAsyncEngine,
        *,
        runtime_config: Optional[ModelRuntimeConfig] = None,
        tensor_model_config: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Serve ``engine`` as tensor model ``model``. ``tensor_model_config``
        (``{"name", "inputs": [{"name", "data_type", "shape"}], "outputs": [...]}``, data
        types ``Bool``, ``Uint8``..``Uint64``, ``Int8``..``Int64``, ``Float16``,
        ``BFloat16``, ``Float32``, ``Float64``, ``Bytes``) describes its tensors, which are
        then validated. ``runtime_config``'s engine-specific values (``runtime_data``) are
        reported as the model's ``ModelConfig`` parameters.

        Raises:
            ValueError: a malformed ``tensor_model_config``.
        """

    def remove_completions_model(self, model: str) -> None:
        """Stop serving completions model ``model``.

        Raises:
            ValueError: ``model`` is not served.
        """

    def remove_chat_completions_model(self, model: str) -> None:
        """Stop serving chat model ``model``.

        Raises:
            ValueError: ``model`` is not served.
        """

    def remove_tensor_model(self, model: str) -> None:
        """Stop serving tensor model ``model``.

        Raises:
            ValueError: ``model`` is not served.
        """

    def list_completions_models(self) -> List[str]:
        """The added completions models, sorted."""

    def list_chat_completions_models(self) -> List[str]:
        """The added chat models, sorted."""

    def list_tensor_models(self) -> List[str]:
        """The added tensor models, sorted."""

    async def run(self, runtime: DistributedRuntime) -> None:
        """Serve until :meth:`shutdown` or the runtime stops."""

    def shutdown(self) -> None:
        """Stop serving."""

# ---------------------------------------------------------------------------------------
# Engine telemetry and the planner's control plane (forward-pass metrics, virtual
# connector, multimodal cache events)
# ---------------------------------------------------------------------------------------

#: The seed API's name of :class:`RuntimeMetrics` (the same class).
PyRuntimeMetrics = RuntimeMetrics

@final
class FpmDirectPublisher:
    """In-process forward-pass-metrics producer with one channel per DP rank.

    Each rank has its own serialisation task; a rank without ``publish`` for 1.0 s emits a
    zeroed heartbeat snapshot (then one per second while idle). Snapshots go to the event
    plane, channel ``(endpoint, "forward-pass-metrics")``, as msgpack."""

    def __new__(
        cls, endpoint: Endpoint, worker_id: str, dp_size: int = 1
    ) -> FpmDirectPublisher: ...
    def publish(
        self,
        *,
        dp_rank: int,
        scheduled_num_prefill_requests: int,
        scheduled_sum_prefill_tokens: int,
        scheduled_sum_prefill_kv_tokens: int,
        scheduled_num_decode_requests: int,
        scheduled_sum_decode_kv_tokens: int,
        queued_num_prefill_requests: int,
        queued_sum_prefill_tokens: int,
        queued_num_decode_requests: int,
        queued_sum_decode_kv_tokens: int,
        wall_time_secs: float,
        scheduled_prefill_lengths: Optional[List[int]] = None,
        scheduled_decode_kv_lengths: Optional[List[int]] = None,
        queued_prefill_lengths: Optional[List[int]] = None,
        queued_decode_kv_lengths: Optional[List[int]] = None,
    ) -> None:
        """Publish one pass of ``dp_rank``. The optional per-request length lists feed the
        four variance fields (population variance, Welford); without them they are 0.0.

        Raises:
            ValueError: ``dp_rank`` not below ``dp_size``, a negative count, or a negative
                or non-finite ``wall_time_secs``.
        """

    def shutdown(self) -> None:
        """Stop the rank tasks and withdraw the channel (idempotent)."""

@final
class FpmEventRelay:
    """Forwards FPM payloads from a local ZMQ PUB socket (``[topic, seq, payload]``
    messages; the last part is the payload) to the event plane; re-dials when the ZMQ
    publisher restarts."""

    def __new__(cls, endpoint: Endpoint, zmq_endpoint: str) -> FpmEventRelay: ...
    def shutdown(self) -> None:
        """Stop relaying (idempotent)."""

@final
class FpmEventSubscriber:
    """FPM consumer of an endpoint: ``recv()`` mode or tracking mode (exclusive).
    Payloads that are not snapshots are dropped and counted
    (``dynamo_fpm_malformed_payloads_total`` on ``/metrics``)."""

    def __new__(cls, endpoint: Endpoint) -> FpmEventSubscriber: ...
    def recv(self) -> Optional[bytes]:
        """The next raw msgpack payload (blocking, GIL released); None once closed.

        Raises:
            RuntimeError: tracking mode is active.
        """

    def start_tracking(self) -> None:
        """Keep the latest payload per ``(worker_id, dp_rank)`` of workers with a model
        card; purge a worker's entries when its card disappears.

        Raises:
            RuntimeError: after ``recv()``, or when already tracking.
        """

    def get_recent_stats(self) -> Dict[Tuple[str, int], bytes]:
        """Latest payloads. Raises ``RuntimeError`` before ``start_tracking``."""

    def get_model_cards(self) -> Dict[str, str]:
        """worker id (decimal instance id) → model card JSON. Raises ``RuntimeError``
        before ``start_tracking``."""

    def shutdown(self) -> None:
        """Stop; a blocked ``recv`` returns None (idempotent)."""

@final
class PlannerDecision:
    """A scaling request from the planner (``-1``: not set)."""

    @property
    def num_prefill_workers(self) -> int: ...
    @property
    def num_decode_workers(self) -> int: ...
    @property
    def decision_id(self) -> int: ...

@final
class VirtualConnectorCoordinator:
    """The planner side of the virtual connector (state under ``v1/{namespace}/planner/``
    of the discovery store)."""

    def __new__(
        cls,
        runtime: DistributedRuntime,
        dynamo_namespace: str,
        check_interval_secs: int,
        max_wait_time_secs: int,
        max_retries: int,
    ) -> VirtualConnectorCoordinator: ...
    async def async_init(self) -> None:
        """Load the current state; call first."""

    def read_state(self) -> PlannerDecision:
        """The in-memory decision (all -1 before ``async_init``)."""

    async def update_scaling_decision(
        self, num_prefill: Optional[int] = None, num_decode: Optional[int] = None
    ) -> None:
        """Write the changed counts and bump ``decision_id``; skipped while the previous
        decision is unacknowledged, until ``max_wait_time_secs`` after the first skip."""

    async def wait_for_scaling_completion(self) -> None:
        """Poll every ``check_interval_secs``, at most ``max_retries`` times, for the
        acknowledgement (a timeout is only logged)."""

    async def is_scaling_ready(self) -> bool:
        """True when there is no decision or it is acknowledged."""

@final
class VirtualConnectorClient:
    """The environment side of the virtual connector."""

    def __new__(
        cls, runtime: DistributedRuntime, dynamo_namespace: str
    ) -> VirtualConnectorClient: ...
    async def get(self) -> PlannerDecision:
        """The current decision."""

    async def complete(self, decision: PlannerDecision) -> None:
        """Acknowledge ``decision`` (writes ``scaled_decision_id``)."""

    async def wait(self) -> None:
        """Resolve once a decision is pending (including one already published); raises
        when the runtime shuts down."""

@final
class MultimodalEmbeddingCachePublisher:
    """Publishes which multimodal embedding keys this encode worker caches (deltas on the
    event plane, plus a snapshot in discovery for consumers that start late)."""

    def __new__(cls) -> MultimodalEmbeddingCachePublisher: ...
    async def create_endpoint(self, endpoint: Endpoint) -> None:
        """Bind to ``endpoint``'s channel ``multimodal_embedding_cache``."""

    def publish_delta(self, added_keys: List[str], removed_keys: List[str]) -> None:
        """Publish a mutation. Raises ``RuntimeError`` before ``create_endpoint``."""

@final
class MultimodalEmbeddingCacheIndex:
    """The routing side's view of which encode worker holds which embedding keys on an
    endpoint, rebuilt from the publishers' deltas and discovery snapshots (so it converges
    when it starts late). Not in the reference (its consumer is Rust-only)."""

    @staticmethod
    async def create(endpoint: Endpoint) -> MultimodalEmbeddingCacheIndex:
        """Start following ``endpoint``'s encode workers."""

    def holders(self, key: str) -> List[int]:
        """Worker ids (instance ids) known to hold ``key``, sorted."""

    def keys(self, worker_id: int) -> Optional[List[str]]:
        """The keys of ``worker_id``, sorted; None while its view is not known."""

    def workers(self) -> List[int]:
        """Workers with a known view, sorted."""

    def shutdown(self) -> None:
        """Stop following (idempotent); the last view is kept."""

async def run_planner(runtime: DistributedRuntime, argv: List[str]) -> None:
    """Run the planner loop (``python -m dynamo.planner``) until the runtime stops.

    Raises:
        ValueError: an unknown flag or a bad value.
    """

def parse_planner_args(argv: List[str]) -> Tuple[Optional[str], Optional[str]]:
    """Parse ``python -m dynamo.planner``'s command line before a runtime exists.

    ``--help`` prints every flag (with its default and unit) and raises ``SystemExit(0)``;
    an unknown flag or bad value prints a usage error and raises ``SystemExit(2)``.
    Returns ``(discovery_backend, request_plane)``, each ``None`` when not given.
    """

# ---------------------------------------------------------------------------------------
# Trace replay (issue 18)
# ---------------------------------------------------------------------------------------

@final
class ReplayProgress:
    """Completed-request counter polled from another thread while a replay runs
    (pass it as ``progress=``; updated every simulated second)."""

    def __new__(cls) -> ReplayProgress: ...
    @property
    def completed(self) -> int: ...

@final
class _OfflineReplayResult:
    """Result of a replay (offline, or online: then ``summary["replay_mode"] == "online"``
    and ``telemetry`` has no samples)."""

    @property
    def summary(self) -> Dict[str, Any]:
        """The reference's summary keys: ``prefix_cache_reused_ratio``,
        ``{mean,median,p75,p90,p95,p99,min,max,std}_{ttft,ttst,itl,tpot,e2e_latency}_ms``,
        throughput fields, ``goodput_*`` when an SLA is set, ``wall_time_ms``."""
    @property
    def per_request(self) -> Optional[List[Dict[str, Any]]]:
        """One dict per request when ``capture_per_request=True``."""
    @property
    def coverage(self) -> Dict[str, Any]: ...
    @property
    def lifecycle_operations(self) -> List[Dict[str, Any]]: ...
    @property
    def telemetry(self) -> Optional[Dict[str, Any]]:
        """``{"sample_interval_ms", "samples"}`` when ``capture_telemetry=True``; each sample
        has ``t_ms``, ``queue_depth``, ``running_requests``, ``active_kv_blocks``,
        ``completed_requests``."""
    def __getitem__(self, key: str, /) -> Any: ...

def run_mocker_trace_replay(
    trace_files: Sequence[Union[str, os.PathLike[str]]],
    extra_engine_args: Optional[Union[Mapping[str, Any], MockEngineArgs]] = None,
    prefill_engine_args: Optional[Any] = None,
    decode_engine_args: Optional[Any] = None,
    router_config: Optional[KvRouterConfig] = None,
    ais_perf_config: Optional[Any] = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    replay_concurrency: Optional[int] = None,
    replay_mode: str = "offline",
    router_mode: str = "round_robin",
    arrival_speedup_ratio: float = 1.0,
    trace_block_size: Optional[int] = None,
    trace_format: str = "mooncake",
    trace_shared_prefix_ratio: float = 0.0,
    trace_num_prefix_groups: int = 0,
    report_jsonl_path: Optional[Union[str, os.PathLike[str]]] = None,
    max_sim_time_ms: Optional[float] = None,
    model_name: Optional[str] = None,
    sla_ttft_ms: Optional[float] = None,
    sla_itl_ms: Optional[float] = None,
    sla_e2e_ms: Optional[float] = None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    scaling_policy: Optional[Any] = None,
    agentic_lanes: Optional[int] = None,
    execution_model: Optional[str] = None,
    weka_nested_timestamp_basis: Optional[str] = None,
    capture_telemetry: bool = False,
    telemetry_sample_interval_ms: float = 1000.0,
    telemetry_callback: Optional[Any] = None,
    telemetry_jsonl_path: Optional[Union[str, os.PathLike[str]]] = None,
    kv_event_lag_ms: Optional[float] = None,
    *,
    progress: Optional[ReplayProgress] = None,
    seed: int = 42,
) -> Any:
    """Replay Mooncake trace files on simulated mocker workers behind a router.

    ``router_mode``: ``"round_robin"`` or ``"kv_router"`` (the project's KV router).
    Offline (simulated time, the ``aisimulate-core`` engines) and online (wall-clock time
    through live in-process mocker workers on the request plane; timing is this project's
    mocker's) both return an :class:`_OfflineReplayResult`. ``extra_engine_args``
    is the reference's mapping (``{"engine": {"num_gpu_blocks": ..., "block_size": ...}}``),
    a flat mapping of engine keys, or a :class:`MockEngineArgs`. A bad trace (missing field,
    decreasing timestamp, bad JSON, empty file) raises ``ValueError`` naming file and line; a
    missing file raises ``FileNotFoundError``. Disaggregated engine args, ``ais_perf_config``, ``scaling_policy`` and the agentic/Weka options raise
    ``ValueError`` (not supported).
    """

def run_mocker_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    extra_engine_args: Optional[Union[Mapping[str, Any], MockEngineArgs]] = None,
    prefill_engine_args: Optional[Any] = None,
    decode_engine_args: Optional[Any] = None,
    router_config: Optional[KvRouterConfig] = None,
    ais_perf_config: Optional[Any] = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    replay_concurrency: Optional[int] = None,
    replay_mode: str = "offline",
    router_mode: str = "round_robin",
    arrival_speedup_ratio: float = 1.0,
    request_rate: Optional[float] = None,
    arrival_interval_ms: Optional[float] = None,
    arrival_seed: int = 42,
    turns_per_session: int = 1,
    shared_prefix_ratio: float = 0.0,
    num_prefix_groups: int = 0,
    inter_turn_delay_ms: float = 0.0,
    model_name: Optional[str] = None,
    sla_ttft_ms: Optional[float] = None,
    sla_itl_ms: Optional[float] = None,
    sla_e2e_ms: Optional[float] = None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    scaling_policy: Optional[Any] = None,
    capture_telemetry: bool = False,
    telemetry_sample_interval_ms: float = 1000.0,
    telemetry_callback: Optional[Any] = None,
    telemetry_jsonl_path: Optional[Union[str, os.PathLike[str]]] = None,
    kv_event_lag_ms: Optional[float] = None,
    *,
    progress: Optional[ReplayProgress] = None,
    seed: int = 42,
) -> Any:
    """Replay a synthetic workload (fixed lengths) without a trace file; needs exactly one of
    ``replay_concurrency``, ``request_rate`` or ``arrival_interval_ms``."""

def get_tool_parser_names() -> List[str]:
    """Every tool-call parser name the frontend accepts (aliases included), sorted."""
    ...

def get_reasoning_parser_names() -> List[str]:
    """Every reasoning parser name the frontend accepts (aliases included), sorted."""
    ...

# ---------------------------------------------------------------------------------------
# Runtime-free selection (crates/dynamo-py/src/llm/selection.rs)
# ---------------------------------------------------------------------------------------

@final
class SelectionCacheConfig:
    """Bounds of the pending-selection cache; an omitted field keeps the service default
    (TTL 60 s, 100000 entries, 268435456 bytes). A negative TTL raises ValueError."""

    def __new__(
        cls,
        *,
        ttl_secs: Optional[float] = None,
        max_entries: Optional[int] = None,
        max_bytes: Optional[int] = None,
    ) -> SelectionCacheConfig: ...

@final
class SelectionService:
    """In-process, runtime-free worker selection: a catalog of workers, a KV index fed by
    each worker's ZMQ KV-event publisher, and load accounting. Requests and answers are
    dicts; malformed ones raise ValueError naming the field, selector failures raise
    SelectionServiceError with ``kind`` and ``status_code``. ``replica_sync_port`` /
    ``replica_sync_peers`` share bookings with peer services over ZMQ PUB/SUB (the PUB
    socket binds ``DYN_SELECTION_REPLICA_SYNC_HOST``, default ``0.0.0.0``);
    ``indexer_peers`` loads a peer's ``/dump`` into the index one second after start.
    Session affinity is not supported yet (ValueError when requested)."""

    def __new__(
        cls,
        *,
        indexer_threads: int = 4,
        indexer_peers: Optional[List[str]] = None,
        replica_sync_port: Optional[int] = None,
        replica_sync_peers: Optional[List[str]] = None,
        selection_cache: Optional[SelectionCacheConfig] = None,
        session_affinity_ttl_secs: Optional[float] = None,
    ) -> SelectionService: ...
    def shutdown(self) -> None:
        """Stop listeners; further selections fail with ``not_ready``. Idempotent."""
        ...
    def upsert_worker(self, worker: Dict[str, Any]) -> Awaitable[Dict[str, Any]]:
        """Register or replace a worker and subscribe to its KV events; its record."""
        ...
    def delete_worker(self, worker_id: int) -> Awaitable[Dict[str, Any]]:
        """Remove a worker and its listeners; its last record."""
        ...
    def list_workers(
        self, *, model_name: Optional[str] = None, routing_group: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        """Catalog records, optionally filtered."""
        ...
    def ready(self) -> Dict[str, Any]:
        """``{ready, schedulable_workers, workers}``."""
        ...
    def overlap_scores(self, request: Dict[str, Any]) -> Awaitable[Dict[str, Any]]:
        """Per-rank cached prefix of a prompt."""
        ...
    def select(self, request: Dict[str, Any]) -> Awaitable[Dict[str, Any]]:
        """Choose a worker without booking (cached under ``selection_id`` when given)."""
        ...
    def select_and_reserve(self, request: Dict[str, Any]) -> Awaitable[Dict[str, Any]]:
        """Choose a worker and book the request's load."""
        ...
    def create_reservation(self, request: Dict[str, Any]) -> Awaitable[Dict[str, Any]]:
        """Book under ``selection_id``: replay its cached selection, or book on
        ``worker_id`` with the prompt."""
        ...
    def prefill_complete(self, selection_id: str) -> Awaitable[None]:
        """The reservation's prefill is done."""
        ...
    def add_output_block(
        self, selection_id: str, *, decay_fraction: Optional[float] = None
    ) -> None:
        """One more decode output block for the reservation."""
        ...
    def free_reservation(self, selection_id: str) -> Awaitable[None]:
        """Free a finished reservation."""
        ...
    def loads(
        self, *, model_name: Optional[str] = None, routing_group: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        """Current load per model and routing group."""
        ...
    def potential_loads(self, request: Dict[str, Any]) -> Awaitable[List[Dict[str, Any]]]:
        """Per-rank load with this prompt, without booking."""
        ...

def run_select_service(args: Optional[List[str]] = None) -> None:
    """Run the selection service (``--port`` 8092) until SIGINT/SIGTERM; the GIL is
    released while it runs. A parse error prints clap's message and raises SystemExit."""
    ...

def run_kv_indexer(args: Optional[List[str]] = None) -> None:
    """Run the standalone KV indexer (``--port`` 8090) until SIGINT/SIGTERM."""
    ...

def run_slot_tracker(args: Optional[List[str]] = None) -> None:
    """Run the standalone slot tracker (``--port`` 8091) until SIGINT/SIGTERM."""
    ...
