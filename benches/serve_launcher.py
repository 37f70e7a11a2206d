"""Start a frontend or a mocker worker through the ``dynamo._core`` entry-point API only.

Run by ``bench_frontend.py`` under this project's interpreter and under the reference's, so
both implementations start through the same code path (``EntrypointArgs`` ->
``make_engine`` -> ``run_input``); the reference runtime wheel ships no ``dynamo.frontend``
or ``dynamo.mocker`` modules.

Usage: ``serve_launcher.py frontend PORT [TOOL_PARSER REASONING_PARSER]`` or ``serve_launcher.py mocker MODEL_DIR JSON``
(``JSON``: the mocker's engine arguments, e.g. ``{"speedup_ratio": 1000}``).

The mocker must be told the endpoint it is served on (``endpoint_id``), not only
``run_input``: the reference's mocker engine waits until instances of the component named
by ``endpoint_id`` appear in discovery before it generates. Without ``endpoint_id`` it
makes up a component (``<uuid>/local_model``) that nobody serves, so it polls for it forever
("Component service not available yet, retrying..." at ``DYN_LOG=debug``) and never answers
a request, although the frontend lists the model and routes to the worker.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile

import dynamo._core as core
from dynamo.llm import EngineType, EntrypointArgs, make_engine, run_input
from dynamo.runtime import DistributedRuntime

ENDPOINT = "dyn://dynamo.backend.generate"


async def main(argv: list[str]) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runtime.shutdown)
    if argv[0] == "frontend":
        extra = {}
        if len(argv) > 2:
            # Frontend-wide parser defaults (this project only: ``bench_frontend.py
            # --parsers``): models whose card names none get them.
            config = core.ModelRuntimeConfig()
            config.tool_call_parser, config.reasoning_parser = argv[2], argv[3]
            extra["runtime_config"] = config
        args = EntrypointArgs(
            EngineType.Dynamic, http_host="127.0.0.1", http_port=int(argv[1]), **extra
        )
        await run_input(runtime, "http", await make_engine(runtime, args))
    else:
        config = json.loads(argv[2])
        if hasattr(core, "_normalize_mocker_config"):
            # Newer reference wheels take the canonical {"engine": {...}} layout.
            config = {"engine": config}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(config, f)
        args = EntrypointArgs(
            EngineType.Mocker,
            model_path=argv[1],
            model_name="tiny",
            endpoint_id=ENDPOINT,
            extra_engine_args=f.name,
        )
        engine = await make_engine(runtime, args)
        await run_input(runtime, ENDPOINT, engine)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
