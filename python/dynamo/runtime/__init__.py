"""Distributed runtime: endpoints, clients and the ``@dynamo_worker`` decorator.

The runtime classes are implemented in :mod:`dynamo._core` and re-exported here.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import warnings
from collections.abc import AsyncIterator, Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from dynamo._core import (
    Client,
    Context,
    DistributedRuntime,
    Endpoint,
    PyAsyncRequestStream,
)
from dynamo._env import default_discovery_backend as _default_discovery_backend
from dynamo._env import default_request_plane as _default_request_plane
from dynamo.runtime._unary import UnaryClient, serve_unary_endpoint

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "Client",
    "Context",
    "DistributedRuntime",
    "Endpoint",
    "PyAsyncRequestStream",
    "UnaryClient",
    "dynamo_endpoint",
    "dynamo_worker",
    "serve_unary_endpoint",
]

F = TypeVar("F", bound=Callable[..., Any])


def _install_signal_handlers(loop: asyncio.AbstractEventLoop, runtime: DistributedRuntime) -> list:
    """SIGTERM/SIGINT start the runtime's graceful shutdown (main thread only)."""
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, runtime.shutdown)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread, or a loop without signal support: leave defaults.
            pass
    return installed


def dynamo_worker(enable_nats: bool | None = None) -> Callable[[F], F]:
    """Decorator factory: build a :class:`DistributedRuntime` and pass it to ``func``.

    The wrapped coroutine function is called as ``func(runtime, *args, **kwargs)``. The
    runtime comes from ``DYN_DISCOVERY_BACKEND`` (default: etcd when ``ETCD_ENDPOINTS`` is
    set, else the embedded ``file`` backend) and ``DYN_REQUEST_PLANE`` (default ``tcp``).
    While it runs, SIGTERM and SIGINT start a graceful shutdown (endpoints stop accepting
    work, in-flight streams drain, ``serve_endpoint`` returns).
    """
    if enable_nats is not None:
        warnings.warn(
            "dynamo_worker(enable_nats=...) is deprecated and ignored; NATS is enabled by the "
            "request or event plane configuration",
            DeprecationWarning,
            stacklevel=2,
        )

    def decorator(func: F) -> F:
        @wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> None:
            loop = asyncio.get_running_loop()
            runtime = DistributedRuntime(
                loop, _default_discovery_backend(), _default_request_plane()
            )
            installed = _install_signal_handlers(loop, runtime)
            try:
                await func(runtime, *args, **kwargs)
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)

        return wrapper  # type: ignore[return-value]

    return decorator


def dynamo_endpoint(
    request_model: type[BaseModel] | type[Any], response_model: type[BaseModel]
) -> Callable[[Callable[..., AsyncIterator[Any]]], Callable[..., AsyncIterator[Any]]]:
    """Decorator factory validating a handler's request with a pydantic v2 model.

    For calls ``(request)`` or ``(self, request)`` with a ``BaseModel`` request model, the
    request is parsed (a ``str`` as JSON, a ``dict`` as fields); anything else, or a
    validation failure, raises ``ValueError("Invalid request: ...")`` on the first
    iteration. ``response_model`` is accepted and not enforced.
    """

    def decorator(func: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        @wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            # pydantic is not imported here: a request model that is a pydantic class means
            # the caller has imported it already, and processes that never use this
            # decorator skip its ~50 ms / ~10 MiB import (start-up and RSS, issue 19).
            pydantic = sys.modules.get("pydantic")
            if len(args) in (1, 2) and isinstance(request_model, type) and pydantic:
                BaseModel, ValidationError = pydantic.BaseModel, pydantic.ValidationError
                if issubclass(request_model, BaseModel):
                    args_list = list(args)
                    raw = args_list[-1]
                    try:
                        if isinstance(raw, str):
                            args_list[-1] = request_model.model_validate_json(raw)
                        elif isinstance(raw, dict):
                            args_list[-1] = request_model.model_validate(raw)
                        else:
                            raise ValueError(f"Invalid request: {raw}")
                    except ValidationError as e:
                        raise ValueError(f"Invalid request: {e}") from e
                    args = tuple(args_list)
            async for item in func(*args, **kwargs):
                yield item

        return wrapper

    return decorator
