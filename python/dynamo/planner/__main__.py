"""``python -m dynamo.planner``: the scaling planner.

Every flag is a field of the Rust ``PlannerConfig`` (``--ttft-ms 500 --itl-ms 50
--endpoint ns.backend.generate --min-workers 1 --max-workers 8 ...``; see docs/planner.md),
parsed and validated in Rust; this module only builds the runtime and handles signals.
Runtime selection: ``--discovery-backend`` / ``--request-plane`` (defaults as the other
entry points: ``$DYN_DISCOVERY_BACKEND``, else etcd with ``ETCD_ENDPOINTS``, else file).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from dynamo._core import DistributedRuntime, run_planner
from dynamo.runtime import _default_discovery_backend, _default_request_plane


def _split(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """Take the runtime flags out of ``argv``; the rest goes to the planner."""
    backend = plane = None
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        key, _, value = arg.partition("=")
        if key in ("--discovery-backend", "--request-plane"):
            value = value or next(it, "")
            if key == "--discovery-backend":
                backend = value
            else:
                plane = value
        else:
            rest.append(arg)
    return backend, plane, rest


async def main(argv: list[str]) -> None:
    backend, plane, rest = _split(argv)
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(
        loop, backend or _default_discovery_backend(), plane or _default_request_plane()
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runtime.shutdown)
    await run_planner(runtime, rest)


def run(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return
    asyncio.run(main(args))


if __name__ == "__main__":
    run()
