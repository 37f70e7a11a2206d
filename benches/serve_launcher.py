"""Start a frontend or a mocker worker through the ``dynamo._core`` entry-point API only.

Run by ``bench_frontend.py`` under this project's interpreter and under the reference's, so
both implementations start through the same code path (``EntrypointArgs`` ->
``make_engine`` -> ``run_input``); the reference runtime wheel ships no ``dynamo.frontend``
or ``dynamo.mocker`` modules.

Usage: ``serve_launcher.py frontend PORT`` or ``serve_launcher.py mocker MODEL_DIR ARGS_JSON``.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from dynamo.llm import EngineType, EntrypointArgs, make_engine, run_input
from dynamo.runtime import DistributedRuntime


async def main(argv: list[str]) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runtime.shutdown)
    if argv[0] == "frontend":
        args = EntrypointArgs(EngineType.Dynamic, http_host="127.0.0.1", http_port=int(argv[1]))
        await run_input(runtime, "http", await make_engine(runtime, args))
    else:
        args = EntrypointArgs(
            EngineType.Mocker, model_path=argv[1], model_name="tiny", extra_engine_args=argv[2]
        )
        engine = await make_engine(runtime, args)
        await run_input(runtime, "dyn://dynamo.backend.generate", engine)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
