"""The worker of docs/guide/02-your-own-worker.md grown up: ``@dynamo_worker`` +
``register_model`` + ``serve_endpoint``, with cancellation and ``EngineShutdown`` migration.

Run a frontend and this worker in two terminals::

    python -m dynamo.llm.tiny_model /tmp/tiny-model
    python -m dynamo.frontend --http-port 8000 --migration-limit 2
    python examples/custom_worker.py /tmp/tiny-model

then ``curl localhost:8000/v1/chat/completions -d '{"model": "tiny-echo", "messages":
[{"role": "user", "content": "hi"}], "max_tokens": 8}' -H 'Content-Type: application/json'``.
The engine "generates" the prompt's tokens back. SIGUSR1 makes in-flight requests end
with ``EngineShutdown``, which the frontend migrates to another worker, then stops.
With ``DYN_EXAMPLE_TRACE=<file>`` the handler appends one line per request event
(``start``, ``cancelled``, ``migrating``, with the request id and the worker's pid) to
that file: the tests watch it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import uvloop

from dynamo.llm import ModelInput, ModelType, register_model
from dynamo.llm.exceptions import EngineShutdown
from dynamo.runtime import DistributedRuntime, dynamo_worker

TRACE = os.environ.get("DYN_EXAMPLE_TRACE")


def trace(event: str, context) -> None:
    if TRACE:
        with open(TRACE, "a") as f:
            f.write(f"{event} {context.id()} {os.getpid()}\n")


class EchoEngine:
    """Streams the prompt's token ids back, one every 10 ms."""

    async def generate_streaming(self, request):
        max_tokens = request["stop_conditions"].get("max_tokens") or 16
        # Without its end-of-sequence tokens (the chat template's BOS is one): echoing
        # those would end the answer at once.
        eos = set(request.get("eos_token_ids") or [])
        prompt = [t for t in request["token_ids"] if t not in eos] or request["token_ids"]
        for i in range(max_tokens):
            await asyncio.sleep(0.01)
            yield {"token_ids": [prompt[i % len(prompt)]]}
        yield {"token_ids": [], "finish_reason": "length"}


class RequestHandler:
    def __init__(self, engine: EchoEngine, runtime: DistributedRuntime) -> None:
        self.engine = engine
        self.runtime = runtime
        self.shutting_down = False

    async def generate(self, request, context):
        """Generate, with cancellation and migration support."""
        trace("start", context)
        try:
            async for result in self.engine.generate_streaming(request):
                if context.is_stopped():
                    # The client went away: stop working on it.
                    break
                if self.shutting_down:
                    # Closes the stream as incomplete; the frontend migrates the request.
                    trace("migrating", context)
                    raise EngineShutdown("Worker shutting down, migrating request")
                yield result
        finally:
            # Reached by the stop check above, or when the runtime closes this generator
            # because the client went away while it waited at a `yield`.
            if context.is_stopped():
                trace("cancelled", context)


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    model_path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-model"
    endpoint = runtime.endpoint("demo.backend.generate")
    await register_model(
        ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, model_path, "tiny-echo"
    )
    handler = RequestHandler(EchoEngine(), runtime)

    def drain() -> None:
        # SIGUSR1: hand in-flight requests to other workers, then shut down.
        handler.shutting_down = True
        asyncio.get_running_loop().call_later(0.5, runtime.shutdown)

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, drain)
    await endpoint.serve_endpoint(handler.generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
