"""A test worker: serves ``<ns>.worker.generate`` until SIGTERM (graceful shutdown).

Request fields (all optional): ``n`` items to yield (default 3), ``delay`` seconds between
items, ``raise`` ("value" → ValueError, "shutdown" → EngineShutdown) after the first item.
Each item is ``{"worker": <instance id>, "i": <index>}``.
"""

from __future__ import annotations

import asyncio
import sys

from dynamo._core import EngineShutdown
from dynamo.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker()
async def main(runtime: DistributedRuntime, ns: str) -> None:
    endpoint = runtime.endpoint(f"{ns}.worker.generate")
    me = endpoint.connection_id()

    async def handler(request):
        n = request.get("n", 3) if isinstance(request, dict) else 3
        delay = request.get("delay", 0) if isinstance(request, dict) else 0
        for i in range(n):
            if i == 1 and isinstance(request, dict):
                if request.get("raise") == "value":
                    raise ValueError("bad input from worker")
                if request.get("raise") == "shutdown":
                    raise EngineShutdown("worker shutting down, migrate")
            yield {"worker": me, "i": i}
            if delay:
                await asyncio.sleep(delay)

    print(f"ID {me}", flush=True)
    await endpoint.serve_endpoint(handler)
    print("SERVED", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
