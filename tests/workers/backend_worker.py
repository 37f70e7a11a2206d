"""A worker built with ``dynamo._core.backend.Worker`` around a Python engine object:
``backend_worker.py MODEL_DIR NAMESPACE``. The engine echoes the prompt's first token ids
back (at most ``max_tokens``), logging its life-cycle calls as lines on stdout
(``START <instance id>``, ``READY <endpoint>``, ``GENERATE <n prompt tokens>``,
``CLEANUP``)."""

from __future__ import annotations

import asyncio
import sys

from dynamo._core import backend


class EchoEngine:
    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir

    async def start(self, instance_id: int) -> backend.EngineConfig:
        print(f"START {instance_id}", flush=True)
        return backend.EngineConfig(
            self.model_dir,
            served_model_name="tiny-backend",
            llm=backend.LlmRegistration(context_length=512, kv_cache_block_size=16),
        )

    async def on_endpoint_ready(self, endpoint) -> None:
        print(f"READY {endpoint.connection_id()}", flush=True)

    async def generate(self, request, context):
        tokens = request["token_ids"]
        print(f"GENERATE {len(tokens)}", flush=True)
        limit = (request.get("stop_conditions") or {}).get("max_tokens") or 4
        out = tokens[:limit]
        for i, t in enumerate(out):
            if context.is_stopped():
                break
            last = i == len(out) - 1
            yield {"token_ids": [t], **({"finish_reason": "length"} if last else {})}

    async def cleanup(self) -> None:
        print("CLEANUP", flush=True)


async def main(model_dir: str, ns: str) -> None:
    config = backend.WorkerConfig(ns, runtime=backend.RuntimeConfig(discovery_backend="file"))
    worker = backend.Worker(EchoEngine(model_dir), config, asyncio.get_running_loop())
    await worker.run()
    print("EXITED", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
