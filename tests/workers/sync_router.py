"""A router replica for the replica-sync tests: a ``KvRouter`` with
``router_replica_sync=True`` over ``<ns>.backend.generate`` (argv[1]; block size argv[2]).
Prints ``READY`` once it sees workers, then answers JSON-line commands on stdin with
``OK [json]`` (or ``ERR <message>``):

* ``{"op": "book", "tokens": [...], "request_id": R}``: answers the chosen worker id
* ``{"op": "prefill", "request_id": R}`` / ``{"op": "free", "request_id": R}``
* ``{"op": "loads"}``: the booked load, ``{worker_id: [active_requests, prefill_tokens]}``
* ``{"op": "workers"}``: the number of registered worker ranks
"""

from __future__ import annotations

import asyncio
import json
import sys

from dynamo._core import KvRouter, KvRouterConfig
from dynamo.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker()
async def main(runtime: DistributedRuntime, ns: str, block_size: int) -> None:
    router = KvRouter(
        runtime.endpoint(f"{ns}.backend.generate"),
        block_size,
        KvRouterConfig(router_replica_sync=True),
    )
    while not router._workers():
        await asyncio.sleep(0.02)
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        try:
            cmd = json.loads(line)
            op = cmd["op"]
            out = None
            if op == "book":
                worker, _, _ = await router.best_worker(cmd["tokens"], request_id=cmd["request_id"])
                out = worker
            elif op == "prefill":
                await router.mark_prefill_complete(cmd["request_id"])
            elif op == "free":
                await router.free(cmd["request_id"])
            elif op == "loads":
                # An empty prompt adds nothing: the potential load is the booked load.
                loads = await router.get_potential_loads([])
                out = {
                    str(x["worker_id"]): [x["active_requests"], x["potential_prefill_tokens"]]
                    for x in loads
                }
            elif op == "workers":
                out = len(router._workers())
            else:
                raise ValueError(f"unknown op {op}")
            print("OK" if out is None else f"OK {json.dumps(out)}", flush=True)
        except Exception as e:  # reported to the test, which fails on it
            print(f"ERR {e}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
