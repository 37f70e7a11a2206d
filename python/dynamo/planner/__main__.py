"""``python -m dynamo.planner``: the scaling planner.

Every flag is a field of the Rust ``PlannerConfig`` (``--ttft-ms 500 --itl-ms 50
--endpoint ns.backend.generate --min-workers 1 --max-workers 8 ...``; ``--help`` lists them
with their defaults; see docs/design/planner.md), parsed and validated in Rust before the
runtime starts; this module only builds the runtime and handles signals. Runtime selection:
``--discovery-backend`` / ``--request-plane`` (defaults as the other entry points:
``$DYN_DISCOVERY_BACKEND``, else etcd with ``ETCD_ENDPOINTS``, else file).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from dynamo._core import DistributedRuntime, parse_planner_args, run_planner
from dynamo.runtime import _default_discovery_backend, _default_request_plane


async def main(argv: list[str], backend: str | None, plane: str | None) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(
        loop, backend or _default_discovery_backend(), plane or _default_request_plane()
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runtime.shutdown)
    await run_planner(runtime, argv)


def run(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # --help and usage errors end here (SystemExit), before any runtime is built.
    backend, plane = parse_planner_args(args)
    asyncio.run(main(args, backend, plane))


if __name__ == "__main__":
    run()
