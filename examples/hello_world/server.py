"""Hello-world worker: serves ``hello_world.backend.generate``.

Run it in one terminal, then ``python examples/hello_world/client.py`` in another. Workers
and clients find each other through the embedded ``file`` discovery backend (a directory,
``$DYN_FILE_KV``, else a per-user one such as ``/tmp/dynamo_store_kv-<uid>``): no etcd or NATS needed. Start several
servers to see the client's round-robin spread requests. Ctrl-C (or SIGTERM) shuts the
worker down gracefully: it leaves discovery and finishes the streams in flight.
"""

from __future__ import annotations

import asyncio

from dynamo.runtime import DistributedRuntime, dynamo_worker
from dynamo.runtime.logging import configure_dynamo_logging


class RequestHandler:
    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id

    async def generate(self, request: str, context):
        for word in request.split(","):
            if context.is_stopped():
                break
            await asyncio.sleep(0.1)
            yield f"Hello {word.strip()} (from worker {self.worker_id:x})"


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    configure_dynamo_logging()
    endpoint = runtime.endpoint("hello_world.backend.generate")
    handler = RequestHandler(endpoint.connection_id())
    print(f"serving hello_world.backend.generate as instance {endpoint.connection_id():x}")
    await endpoint.serve_endpoint(handler.generate)


if __name__ == "__main__":
    asyncio.run(worker())
