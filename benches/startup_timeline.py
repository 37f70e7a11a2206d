"""Start-up timeline of frontend + mocker worker (issue 19 item 6), finer than
``bench_frontend.py``'s single figure.

Spawns both processes and polls every 2 ms: when the frontend first answers HTTP, when the
worker's registration first appears in the discovery directory, and when ``/v1/models``
lists the model (``PYTHONPATH`` passes through, so two builds of this project can be
compared as two package directories). One line per start, then the medians per interpreter and their ratio to
the first one. Give several interpreters to run them alternately, round by round, so that
host drift falls on all of them alike:

    python benches/startup_timeline.py .venv/bin/python .bench-ref-venv/bin/python --rounds 9

Two ways to start the processes:

- ``--via launcher`` (default): ``serve_launcher.py`` under each interpreter, the same
  script on both sides, through the ``dynamo._core`` entry-point API only (``EntrypointArgs``
  -> ``make_engine`` -> ``run_input``). It needs nothing but the runtime wheel on the
  reference side; both sides pay the launcher's standard-library imports.
- ``--via cli``: what an operator types, ``python -m dynamo.frontend`` and ``python -m
  dynamo.mocker`` with the same flags on both sides (file discovery and the TCP request
  plane through ``DYN_DISCOVERY_BACKEND`` / ``DYN_REQUEST_PLANE``). The reference's modules
  ship in the ``ai-dynamo`` wheel, not in the runtime wheel: ``bash
  benches/setup_reference.sh --cli`` installs it beside the runtime wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, server_commands, server_env, stop_processes


def _has_file(root: str) -> bool:
    return any(files for _, _, files in os.walk(root))


def one_round(python: str, via: str, model: str) -> tuple[float | None, float | None, float | None]:
    """Seconds from spawning both processes to: HTTP up, first discovery file, listed."""
    port = free_port()
    kv = tempfile.mkdtemp()
    env = server_env(kv)
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for cmd in server_commands(python, via, model, port)
    ]
    http_up = registered = listed = None
    try:
        while listed is None and time.monotonic() - t0 < 60:
            if registered is None and _has_file(kv):
                registered = time.monotonic() - t0
            try:
                url = f"http://127.0.0.1:{port}/v1/models"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if http_up is None:
                        http_up = time.monotonic() - t0
                    if any(m["id"] == "tiny" for m in json.loads(r.read())["data"]):
                        listed = time.monotonic() - t0
            except OSError:
                pass
            if any(p.poll() is not None for p in procs):
                break  # a process died: no point waiting for the deadline
            time.sleep(0.002)
    finally:
        stop_processes(procs)
        shutil.rmtree(kv, ignore_errors=True)
    return http_up, registered, listed


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "python",
        nargs="+",
        help="interpreters whose `dynamo` serves (ours, the reference's), run alternately",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--via", choices=["launcher", "cli"], default="launcher")
    args = p.parse_args()
    from dynamo.llm.tiny_model import write_tiny_model

    listed: dict[str, list[float]] = {py: [] for py in args.python}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(write_tiny_model(Path(tmp) / "tiny"))
        for i in range(args.rounds):
            for py in args.python:
                for _ in range(3):
                    # A process that died (a port taken between `free_port` and its bind:
                    # the worker beside it binds ports of its own) is started again.
                    up, reg, done = one_round(py, args.via, model)
                    if done is not None:
                        break
                    print(f"{py}: the model was not listed; starting again", file=sys.stderr)
                else:
                    raise SystemExit(f"{py}: the model was never listed (round {i + 1})")
                listed[py].append(done)
                print(
                    f"{py}: http up {_fmt(up)} s, worker in discovery {_fmt(reg)} s, "
                    f"model listed {_fmt(done)} s",
                    flush=True,
                )
    first = statistics.median(listed[args.python[0]])
    print(f"\nmedians over {args.rounds} starts each (--via {args.via}):")
    for py, times in listed.items():
        q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        med = statistics.median(times)
        print(
            f"  {py}: listed {med:.3f} s (p25 {q[0]:.3f}, p75 {q[2]:.3f}), "
            f"first / this {first / med:.2f}"
        )


if __name__ == "__main__":
    main()
