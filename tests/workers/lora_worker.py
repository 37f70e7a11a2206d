"""A worker serving a base model plus LoRA adapters, for the LoRA end-to-end tests.

Usage: ``lora_worker.py MODEL_DIR [ADAPTER_DIR ...]``. It registers the base model as
``$MODEL`` (default ``base``) on ``$ENDPOINT`` and each adapter directory (resolved with
``LoRADownloader``, as a real worker would: ``file://`` here) under its directory name.

Each request appends ``<instance id> <model> <routing.lora_name>`` to ``$MARKER`` and, as
an engine with prefix caching would, publishes the prompt's complete blocks as stored KV
blocks hashed with the request's ``lora_name``. Commands on stdin (answered ``OK`` or
``ERR <message>``): ``unregister <name>``, ``register <adapter dir>``, ``exit``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from dynamo._core import KvEventPublisher
from dynamo.llm import (
    LoRADownloader,
    ModelInput,
    ModelType,
    register_model,
    unregister_model,
)
from dynamo.runtime import DistributedRuntime, dynamo_worker

BLOCK_SIZE = 16


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    model_dir = sys.argv[1]
    endpoint = runtime.endpoint(os.environ.get("ENDPOINT", "lora.backend.generate"))
    me = endpoint.connection_id()
    publisher = KvEventPublisher(endpoint, kv_block_size=BLOCK_SIZE)
    downloader = LoRADownloader(os.environ.get("DYN_LORA_PATH"))
    kinds = ModelType.Chat | ModelType.Completions
    await register_model(
        ModelInput.Tokens, kinds, endpoint, model_dir, os.environ.get("MODEL", "base")
    )

    async def add_adapter(adapter_dir: str) -> None:
        local = await downloader.download_if_needed(f"file://{adapter_dir}")
        await register_model(
            ModelInput.Tokens,
            kinds,
            endpoint,
            local,
            lora_name=Path(adapter_dir).name,
            base_model_path=model_dir,
        )

    for adapter in sys.argv[2:]:
        await add_adapter(adapter)
    # External block ids, unique per worker (i64 on the wire).
    next_hash = [(me & 0xFFFF) << 32]

    async def generate(request, context):
        lora = (request.get("routing") or {}).get("lora_name")
        with open(os.environ["MARKER"], "a") as f:
            f.write(f"{me} {request['model']} {lora}\n")
        tokens = request["token_ids"]
        n = len(tokens) // BLOCK_SIZE
        if n:
            hashes = list(range(next_hash[0], next_hash[0] + n))
            next_hash[0] += n
            publisher.publish_stored(
                tokens[: n * BLOCK_SIZE], [BLOCK_SIZE] * n, hashes, lora_name=lora
            )
        yield {"token_ids": [7], "finish_reason": "length"}

    serving = asyncio.ensure_future(endpoint.serve_endpoint(generate))
    print(f"ID {me}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        op, _, arg = line.strip().partition(" ")
        try:
            if op == "unregister":
                await unregister_model(endpoint, lora_name=arg)
            elif op == "register":
                await add_adapter(arg)
            elif op == "exit":
                print("OK", flush=True)
                break
            print("OK", flush=True)
        except Exception as e:
            print(f"ERR {e}", flush=True)
    runtime.shutdown()
    await serving


if __name__ == "__main__":
    asyncio.run(main())
