"""``make_engine`` + ``run_input`` in a process, for the entry-point tests.

``entrypoint.py ENGINE MODEL_DIR INPUT [--namespace NS] [--speedup R]``: ENGINE is an
``EngineType`` name (``Echo``, ``Mocker``, ``Dynamic``), INPUT a ``run_input`` input
(``text``, ``stdin``, ``http``, ``dyn://ns.comp.ep``). The discovery backend comes from
``DYN_DISCOVERY_BACKEND`` (default ``mem``).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from dynamo._core import (
    DistributedRuntime,
    EngineType,
    EntrypointArgs,
    MockEngineArgs,
    make_engine,
    run_input,
)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("engine")
    p.add_argument("model_dir")
    p.add_argument("input")
    p.add_argument("--namespace")
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--http-port", type=int)
    a = p.parse_args()
    backend = os.environ.get("DYN_DISCOVERY_BACKEND", "mem")
    rt = DistributedRuntime(asyncio.get_running_loop(), backend, "tcp")
    args = EntrypointArgs(
        getattr(EngineType, a.engine),
        model_path=a.model_dir,
        model_name="tiny",
        namespace=a.namespace,
        http_host="127.0.0.1",
        http_port=a.http_port,
        mocker_engine_args=MockEngineArgs(speedup_ratio=a.speedup),
    )
    engine = await make_engine(rt, args)
    try:
        await run_input(rt, a.input, engine)
    finally:
        rt.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
