"""The environment side of the planner's virtual connector: starts and stops mocker
workers (``python -m dynamo.mocker``) as the planner decides, and acknowledges each
decision once the workers are registered (or gone).

    python examples/planner/virtual_env.py --namespace dynamo --model-path /tmp/tiny \\
        --endpoint dynamo.backend.generate --initial-workers 1 -- --speedup-ratio 10

Arguments after ``--`` go to every mocker. Each decision is printed as one JSON line
(``{"event": "scaled", "decision_id": ..., "workers": ..., "prefill_workers": ...}``).

Aggregated deployments scale ``--endpoint`` on ``num_decode_workers``. With
``--prefill-endpoint`` (a disaggregated deployment, planner ``--mode disagg``) a second
set of mockers on that endpoint follows ``num_prefill_workers``; both sets are scaled at
once and the decision is acknowledged when both show their count in discovery. (The
prefill mockers are ordinary mocker workers: this example exercises the control plane,
not the KV transfer between the two pools.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys

from dynamo._core import DistributedRuntime, VirtualConnectorClient
from dynamo.runtime import _default_discovery_backend, _default_request_plane


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namespace", default="dynamo")
    p.add_argument(
        "--endpoint",
        default="dynamo.backend.generate",
        help="aggregated (or decode) workers' endpoint: num_decode_workers",
    )
    p.add_argument(
        "--prefill-endpoint",
        default=None,
        help="prefill workers' endpoint (disaggregated): num_prefill_workers",
    )
    p.add_argument("--model-path", required=True)
    p.add_argument("--model-name", default=None)
    p.add_argument("--initial-workers", type=int, default=1)
    p.add_argument("--initial-prefill-workers", type=int, default=1)
    p.add_argument("--ready-timeout", type=float, default=30.0)
    return p.parse_args(argv), extra


class Workers:
    """Mocker worker processes of one endpoint."""

    def __init__(
        self, rt: DistributedRuntime, endpoint: str, args: argparse.Namespace, extra: list[str]
    ):
        self.rt, self.endpoint, self.args, self.extra = rt, endpoint, args, extra
        self.procs: list[subprocess.Popen] = []
        self.client = None

    def start_one(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "dynamo.mocker",
            "--model-path",
            self.args.model_path,
            "--endpoint",
            f"dyn://{self.endpoint}",
            *(["--model-name", self.args.model_name] if self.args.model_name else []),
            *self.extra,
        ]
        self.procs.append(subprocess.Popen(cmd))

    def stop_one(self) -> None:
        proc = self.procs.pop()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    async def registered(self) -> int:
        if self.client is None:
            self.client = await self.rt.endpoint(self.endpoint).client()
        return len(self.client.instance_ids())

    async def scale_to(self, n: int) -> None:
        while len(self.procs) < n:
            self.start_one()
        while len(self.procs) > n:
            await asyncio.to_thread(self.stop_one)
        # Acknowledge once discovery shows the new count (bounded: a worker that fails to
        # start must not block the planner forever).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.args.ready_timeout
        while await self.registered() != n and loop.time() < deadline:
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        while self.procs:
            await asyncio.to_thread(self.stop_one)


async def main(args: argparse.Namespace, extra: list[str]) -> None:
    loop = asyncio.get_running_loop()
    rt = DistributedRuntime(loop, _default_discovery_backend(), _default_request_plane())
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    decode = Workers(rt, args.endpoint, args, extra)
    prefill = Workers(rt, args.prefill_endpoint, args, extra) if args.prefill_endpoint else None
    client = VirtualConnectorClient(rt, args.namespace)

    def counts() -> dict:
        out = {"workers": len(decode.procs)}
        if prefill is not None:
            out["prefill_workers"] = len(prefill.procs)
        return out

    try:
        await asyncio.gather(
            decode.scale_to(args.initial_workers),
            *([prefill.scale_to(args.initial_prefill_workers)] if prefill else []),
        )
        print(json.dumps({"event": "ready", **counts()}), flush=True)
        while not stop.is_set():
            waiter = asyncio.ensure_future(client.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if stop.is_set():
                waiter.cancel()
                break
            decision = await client.get()
            steps = []
            if decision.num_decode_workers >= 0:
                steps.append(decode.scale_to(decision.num_decode_workers))
            if prefill is not None and decision.num_prefill_workers >= 0:
                steps.append(prefill.scale_to(decision.num_prefill_workers))
            await asyncio.gather(*steps)
            await client.complete(decision)
            print(
                json.dumps({"event": "scaled", "decision_id": decision.decision_id, **counts()}),
                flush=True,
            )
    finally:
        await decode.close()
        if prefill is not None:
            await prefill.close()
        rt.shutdown()


if __name__ == "__main__":
    ns, rest = parse_args()
    asyncio.run(main(ns, rest))
