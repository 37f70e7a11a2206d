"""Request/response (one answer) helpers over the streaming endpoint API.

A Dynamo endpoint streams any number of items per request. Application code that thinks
in single answers uses these two helpers instead of writing the generator and the
collecting loop itself:

- :func:`serve_unary_endpoint` serves a coroutine ``handler(request, context=...)`` whose
  return value is the endpoint's one item;
- :class:`UnaryClient` sends a request and returns the one item it got back, and raises
  ``RuntimeError`` when the endpoint answered with none or with more than one.

Both are thin: the streaming, routing and cancellation stay in :mod:`dynamo._core`. A
``context`` given to :meth:`UnaryClient.complete` is the call's context, so stopping it
(``context.stop_generating()``) stops the remote handler; a handler that passes its own
``context`` on to a nested call therefore propagates its caller's cancellation inward.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynamo._core import Client, Context, Endpoint

__all__ = ["UnaryClient", "serve_unary_endpoint"]

#: A unary handler: ``handler(request, context=context)`` returning the answer (a coroutine;
#: a plain return value is accepted too).
UnaryHandler = Callable[..., "Awaitable[Any] | Any"]


async def _exactly_one(stream: AsyncIterator[Any]) -> Any:
    """The single item of ``stream``; ``RuntimeError`` for none or several."""
    iterator = stream.__aiter__()
    try:
        first = await iterator.__anext__()
    except StopAsyncIteration:
        raise RuntimeError("unary endpoint returned no response") from None
    try:
        await iterator.__anext__()
    except StopAsyncIteration:
        return first
    # A second item: the endpoint is not unary. Dropping the stream stops the request.
    raise RuntimeError("unary endpoint returned multiple responses")


class UnaryClient:
    """Calls a streaming endpoint (round-robin over its instances) for exactly one answer."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def complete(self, request: Any, *, context: Context | None = None) -> Any:
        """Send ``request`` and return the endpoint's one response.

        With ``context``, the call runs under it: stopping it stops the remote handler.

        Raises:
            RuntimeError: the endpoint answered with no item or with more than one.
        """
        stream = await self._client.round_robin(request, annotated=False, context=context)
        return await _exactly_one(stream)


async def serve_unary_endpoint(endpoint: Endpoint, handler: UnaryHandler) -> None:
    """Serve ``handler`` on ``endpoint`` until the runtime shuts down.

    ``handler(request, context=context)`` gets each request and Dynamo's per-request
    :class:`~dynamo._core.Context`; what it returns is the one response item. ``None``
    sends no item (the caller's :class:`UnaryClient` then raises "no response"). An
    exception travels to the caller as the endpoint's error.
    """

    async def generate(request: Any, context: Context) -> AsyncIterator[Any]:
        answer = handler(request, context=context)
        if inspect.isawaitable(answer):
            answer = await answer
        if answer is not None:
            yield answer

    await endpoint.serve_endpoint(generate)
