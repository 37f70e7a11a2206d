"""A ``ModelInput.Text`` worker: it receives the raw OpenAI request (no tokens) and
streams OpenAI chunks itself, echoing the last user message (or the prompt) word by word.

Each request body is appended as one JSON line to ``$MARKER``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import uvloop

from dynamo.llm import ModelInput, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime, dynamo_worker


def _words(request: dict) -> list[str]:
    if "messages" in request:
        text = request["messages"][-1]["content"]
    else:
        text = request["prompt"]
    words = f"echo: {text}".split(" ")
    return [w if i == 0 else f" {w}" for i, w in enumerate(words)]


class RequestHandler:
    async def generate(self, request, context):
        with open(os.environ["MARKER"], "a") as f:
            f.write(json.dumps(request) + "\n")
        chat = "messages" in request
        base = {"id": "text-1", "created": 0, "model": request["model"]}
        for word in _words(request):
            await asyncio.sleep(0.005)
            if chat:
                yield {
                    **base,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
                }
            else:
                yield {
                    **base,
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": word, "finish_reason": None}],
                }
        last = {"delta": {}} if chat else {"text": ""}
        yield {
            **base,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "choices": [{"index": 0, **last, "finish_reason": "stop"}],
        }


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    endpoint = runtime.endpoint(os.environ.get("ENDPOINT", "text.backend.generate"))
    # worker_type: required by the reference's register_model (ours defaults it), so the
    # same worker runs on both (scripts/observe_newcomer.py).
    await register_model(
        ModelInput.Text,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        sys.argv[1],
        "texty",
        worker_type=WorkerType.Aggregated,
    )
    await endpoint.serve_endpoint(RequestHandler().generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
