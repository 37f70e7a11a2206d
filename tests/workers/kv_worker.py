"""A test worker for KV routing: serves ``<ns>.backend.generate`` and publishes KV events
with a worker-local indexer. Commands arrive as JSON lines on stdin; each is answered with
``OK`` (or ``ERR <message>``) on stdout:

* ``{"op": "store", "tokens": [...], "hashes": [...], "block_size": B}``
* ``{"op": "remove", "hashes": [...]}``
* ``{"op": "drop", "n": N}``: number the next N events but do not send them (routers see
  an id gap and recover from this worker's local indexer)
* ``{"op": "subscribers"}``: answers ``OK <n>``
* ``{"op": "exit"}``

Generate requests: ``{"extra_args": {"n": items, "delay": seconds}}``; each item is
``{"worker": <instance id>, "i": <index>}``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from dynamo._core import KvEventPublisher
from dynamo.runtime import DistributedRuntime, dynamo_worker

BLOCK_SIZE = 4


@dynamo_worker()
async def main(runtime: DistributedRuntime, ns: str) -> None:
    endpoint = runtime.endpoint(f"{ns}.backend.generate")
    me = endpoint.connection_id()
    publisher = KvEventPublisher(endpoint, kv_block_size=BLOCK_SIZE, enable_local_indexer=True)

    async def handler(request):
        extra = request.get("extra_args") or {}
        for i in range(int(extra.get("n", 2))):
            yield {"worker": me, "i": i}
            await asyncio.sleep(float(extra.get("delay", 0)))

    serving = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    print(f"ID {me}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        try:
            cmd = json.loads(line)
            op = cmd["op"]
            reply = "OK"
            if op == "store":
                n = len(cmd["hashes"])
                publisher.publish_stored(
                    cmd["tokens"][: n * BLOCK_SIZE], [BLOCK_SIZE] * n, cmd["hashes"]
                )
            elif op == "remove":
                publisher.publish_removed(cmd["hashes"])
            elif op == "drop":
                publisher._drop_next_events(cmd["n"])
            elif op == "subscribers":
                reply = f"OK {publisher._subscriber_count()}"
            elif op == "exit":
                print("OK", flush=True)
                break
            print(reply, flush=True)
        except Exception as e:
            print(f"ERR {e}", flush=True)
    runtime.shutdown()
    await serving


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
