# Type stub of the `dynamo._core` extension module (crates/dynamo-py).
#
# This file is the reviewed description of the Python API. It is checked against the
# compiled module by `python -m mypy.stubtest dynamo._core` (allowlist:
# tests/stubtest_allowlist.txt) and by tests/test_stub.py, which compares public names both
# ways.

from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Tuple,
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

        ``discovery_backend``: "file" (local processes, ``DYN_FILE_KV``) or "mem" (one
        process); "etcd" and "kubernetes" are recognised but not available in this build.
        ``request_plane``: "tcp" ("nats" is recognised but not available in this build).
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
        ``context``. Each yielded JSON-like item is one response frame. An exception ends
        the stream with an error the caller raises (the same class for ``dynamo._core``
        exceptions, ``ValueError`` otherwise); the worker keeps serving.

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
        """A client over this endpoint's live instances (default mode round-robin)."""

    def connection_id(self) -> int:
        """This process's discovery instance id."""

    async def unregister_endpoint_instance(self) -> None:
        """Withdraw this instance from discovery ("sleep")."""

    async def register_endpoint_instance(self) -> None:
        """Publish this instance again ("wake")."""

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
