"""A Python LLM worker for the serving tests (the worker guide's shape).

``ModelInput.Tokens``: it streams token ids slowly and, when the frontend stops the
request (client disconnect), writes ``cancelled <request id>`` to ``$MARKER`` and stops.

Optional: ``$MODEL`` (served name, default ``slow``); while the file ``$HOLD`` exists a
request waits before its first token (it stays in prefill); the worker registers its model
at once but serves its endpoint only once the file ``$SERVE_AFTER`` exists.
"""

from __future__ import annotations

import asyncio
import os
import sys

import uvloop

from dynamo.llm import ModelInput, ModelType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker


class RequestHandler:
    async def generate(self, request, context):
        max_tokens = request["stop_conditions"].get("max_tokens") or 100
        hold = os.environ.get("HOLD")
        try:
            while hold and os.path.exists(hold) and not context.is_stopped():
                await asyncio.sleep(0.02)
            for i in range(max_tokens):
                if context.is_stopped():
                    return
                await asyncio.sleep(0.05)
                yield {"token_ids": [300 + i % 40]}
            yield {"token_ids": [], "finish_reason": "length"}
        finally:
            # Reached by a stop check or by the runtime closing the generator after a stop.
            if context.is_stopped():
                with open(os.environ["MARKER"], "a") as f:
                    f.write(f"cancelled {context.id()}\n")


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    endpoint = runtime.endpoint(os.environ.get("ENDPOINT", "slow.backend.generate"))
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        sys.argv[1],
        os.environ.get("MODEL", "slow"),
    )
    serve_after = os.environ.get("SERVE_AFTER")
    while serve_after and not os.path.exists(serve_after):
        await asyncio.sleep(0.05)
    await endpoint.serve_endpoint(RequestHandler().generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
