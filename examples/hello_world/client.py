"""Hello-world client: calls ``hello_world.backend.generate`` and prints the stream.

Start ``python examples/hello_world/server.py`` first (see its docstring).
"""

from __future__ import annotations

import asyncio

from dynamo.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    client = await runtime.endpoint("hello_world.backend.generate").client()
    ids = await asyncio.wait_for(client.wait_for_instances(), 30)
    print(f"instances: {[f'{i:x}' for i in ids]}")
    for _ in range(3):
        stream = await client.round_robin("world,sun,moon,star")
        async for item in stream:
            print(item.data())
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
