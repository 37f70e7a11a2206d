"""Unary (one answer) helpers for token-level ``generate`` endpoints.

A token model's ``generate`` endpoint takes a preprocessed request (``token_ids``,
``stop_conditions``, ``sampling_options``, ``output_options``, ...) and streams engine
outputs (``{"index": 0, "token_ids": [...], "finish_reason": ...}``). These helpers let
application code treat it as request/response:

- :class:`LLMUnaryClient` sends one request and joins the stream into one terminal
  completion: the last chunk (the one with a ``finish_reason``) with ``token_ids``
  replaced by every generated token in order;
- :class:`UnaryChatModel` publishes a unary handler as a chat model the OpenAI frontend
  serves (the handler returns that terminal completion itself);
- :func:`with_engine_data` adds ``engine_data`` entries to a completion without
  overwriting any.

Only single-choice requests without log probabilities are supported: a unary answer has
no place for several choices, and log probabilities would have to be joined per token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynamo._core import ModelInput, ModelType, WorkerType, register_model
from dynamo.runtime._unary import UnaryHandler, serve_unary_endpoint

if TYPE_CHECKING:
    # Only an annotation here: importing pathlib at run time (with urllib.parse and
    # ipaddress) costs every worker and frontend process ~0.85 MiB and ~5 ms at start-up.
    from pathlib import Path

    from dynamo._core import Client, Context, DistributedRuntime

__all__ = ["LLMUnaryClient", "UnaryChatModel", "with_engine_data"]

# Also this module's names, as in the reference's: `ModelInput`, `ModelType`, `WorkerType`
# and `register_model` (which `UnaryChatModel.serve` looks up here at call time).

#: Chunk fields that carry log probabilities, which :class:`LLMUnaryClient` does not join:
#: a chunk that has one (even as ``null``) is refused, as the reference's client does.
_LOGPROB_FIELDS = ("log_probs", "top_logprobs")


def with_engine_data(completion: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``completion`` whose ``engine_data`` also holds ``values``.

    ``completion`` is not modified. Empty ``values`` leave ``engine_data`` as it was.

    Raises:
        ValueError: an argument or the existing ``engine_data`` is not a mapping, or a key
            of ``values`` is already in ``engine_data``.
    """
    if not isinstance(completion, Mapping):
        raise ValueError("LLM completion must be an object")
    if not isinstance(values, Mapping):
        raise ValueError("engine_data values must be an object")
    result = dict(completion)
    if not values:
        return result
    existing = result.get("engine_data")
    if existing is None:
        existing = {}
    elif not isinstance(existing, Mapping):
        raise ValueError("existing engine_data must be an object")
    clash = sorted(k for k in values if k in existing)
    if clash:
        names = ", ".join(repr(k) for k in clash)
        raise ValueError(f"engine_data already contains keys: {names}")
    result["engine_data"] = {**existing, **values}
    return result


def _check_request(request: Any) -> None:
    """Reject requests a single joined answer cannot represent."""
    if not isinstance(request, Mapping):
        raise ValueError("LLM request must be an object")
    for field in ("sampling_options", "output_options"):
        if field in request and not isinstance(request[field], Mapping):
            raise ValueError(f"{field} must be an object")
    n = request.get("sampling_options", {}).get("n")
    if n is not None and n != 1:
        raise ValueError("LLMUnaryClient requires n=1")
    output = request.get("output_options", {})
    if output.get("logprobs") is not None or output.get("prompt_logprobs") is not None:
        raise ValueError("LLMUnaryClient does not support logprobs")


def _is_token_list(value: Any) -> bool:
    """A list of integers (``bool`` is not one, though Python makes it an ``int``)."""
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


async def _join(stream: AsyncIterator[Any]) -> dict[str, Any]:
    """Join an engine-output stream into its terminal chunk holding every token.

    Each chunk must be an object for choice ``index`` 0 with a ``token_ids`` list of
    integers and no log-probability field; the terminal one has a non-empty string
    ``finish_reason`` (any such string: engines name their own reasons) and nothing may
    follow it.
    """
    tokens: list[int] = []
    terminal: dict[str, Any] | None = None
    async for chunk in stream:
        if not isinstance(chunk, Mapping):
            raise RuntimeError("LLM endpoint returned a non-object chunk")
        if terminal is not None:
            raise RuntimeError("LLM endpoint returned data after terminal")
        index = chunk.get("index")
        if index != 0 or isinstance(index, bool):
            raise RuntimeError("LLM endpoint requires choice index 0")
        if any(f in chunk for f in _LOGPROB_FIELDS):
            raise RuntimeError("LLM endpoint returned unsupported logprobs")
        token_ids = chunk.get("token_ids")
        if not _is_token_list(token_ids):
            raise RuntimeError("LLM endpoint returned invalid token_ids")
        tokens.extend(token_ids)
        finish = chunk.get("finish_reason")
        if finish is not None:
            if not isinstance(finish, str) or not finish:
                raise RuntimeError("LLM endpoint returned invalid finish_reason")
            terminal = dict(chunk)
    if terminal is None:
        raise RuntimeError("LLM endpoint returned no terminal chunk")
    terminal["token_ids"] = tokens
    return terminal


class LLMUnaryClient:
    """Sends a preprocessed request to a ``generate`` endpoint and returns one completion."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @classmethod
    async def connect(cls, runtime: DistributedRuntime, endpoint_name: str) -> LLMUnaryClient:
        """A client of ``endpoint_name`` (``ns.component.endpoint``), once an instance is up.

        Waits for the first instance (wrap it in ``asyncio.wait_for`` to bound the wait).

        Raises:
            ValueError: ``endpoint_name`` is not a valid endpoint path.
        """
        client = await runtime.endpoint(endpoint_name).client()
        await client.wait_for_instances()
        return cls(client)

    async def complete(
        self, request: Mapping[str, Any], *, context: Context | None = None
    ) -> dict[str, Any]:
        """Send ``request``; return the terminal chunk with all generated ``token_ids``.

        With ``context``, the call runs under it: stopping it stops the worker's handler.

        The response stream is closed (``aclose()``) however the call ends: an answer, a
        stream it refuses, or cancellation (which propagates as
        ``asyncio.CancelledError``), so the worker's handler is stopped at once.

        Raises:
            ValueError: ``request`` is not an object, has non-object ``sampling_options`` /
                ``output_options``, asks for ``n`` other than 1 or for log probabilities.
            RuntimeError: the endpoint's stream is not one index-0 choice of integer
                ``token_ids`` ending in a chunk with a non-empty ``finish_reason``, carries
                log probabilities, or goes on after its terminal chunk (the message names
                the problem).
        """
        _check_request(request)
        stream = await self._client.round_robin(dict(request), annotated=False, context=context)
        try:
            return await _join(stream)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


@dataclass(frozen=True)
class UnaryChatModel:
    """Publishes an application's unary handler as a chat model of the OpenAI frontend.

    The handler serves ``<service_name>.app.generate``, a token-input chat model named
    ``public_model_name`` (default ``service_name``) whose tokenizer and chat template come
    from ``model_path`` (``chat_template`` replaces the template). The frontend sends it
    preprocessed requests; the handler returns the terminal completion
    (``{"index": 0, "token_ids": [...], "finish_reason": "stop"}``).
    """

    model_path: str
    service_name: str
    public_model_name: str | None = None
    chat_template: Path | None = None

    async def serve(self, runtime: DistributedRuntime, handler: UnaryHandler) -> None:
        """Register the model, then serve ``handler`` until the runtime shuts down.

        ``register_model`` is looked up in this module when called, so a test (or an
        application) can replace ``dynamo.llm._unary.register_model``.
        """
        endpoint = runtime.endpoint(f"{self.service_name}.app.generate")
        template = None if self.chat_template is None else str(self.chat_template)
        await register_model(
            ModelInput.Tokens,
            ModelType.Chat,
            endpoint,
            self.model_path,
            self.public_model_name or self.service_name,
            custom_template_path=template,
            worker_type=WorkerType.Aggregated,
        )
        await serve_unary_endpoint(endpoint, handler)
