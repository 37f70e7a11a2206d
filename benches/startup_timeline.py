"""Start-up timeline of frontend + mocker worker (issue 19 item 6), finer than
``bench_frontend.py``'s single figure.

Spawns both processes through ``serve_launcher.py`` (as the frontend bench does) and polls
every 2 ms: when the frontend first answers HTTP, when the worker's registration first
appears in the discovery directory, and when ``/v1/models`` lists the model. One line per
round; run it once with this project's interpreter and once with the reference's:

    python benches/startup_timeline.py .venv/bin/python --rounds 5
    python benches/startup_timeline.py .bench-ref-venv/bin/python --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, stop_processes

LAUNCHER = Path(__file__).resolve().parent / "serve_launcher.py"


def _has_file(root: str) -> bool:
    return any(files for _, _, files in os.walk(root))


def one_round(python: str, model: str) -> tuple[float | None, float | None, float | None]:
    """Seconds from spawning both processes to: HTTP up, first discovery file, listed."""
    port = free_port()
    kv = tempfile.mkdtemp()
    env = dict(os.environ, DYN_FILE_KV=kv, DYN_LOG="warn", DYN_NAMESPACE="dynamo")
    mocker = json.dumps({"speedup_ratio": 1000.0, "block_size": 16})
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [python, str(LAUNCHER), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for args in (["frontend", str(port)], ["mocker", model, mocker])
    ]
    http_up = registered = listed = None
    try:
        while listed is None and time.monotonic() - t0 < 30:
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
            time.sleep(0.002)
    finally:
        stop_processes(procs)
    return http_up, registered, listed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("python", help="interpreter whose `dynamo` serves (ours or the reference's)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    from dynamo.llm.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(write_tiny_model(Path(tmp) / "tiny"))
        for _ in range(args.rounds):
            up, reg, listed = one_round(args.python, model)

            def fmt(x: float | None) -> str:
                return "-" if x is None else f"{x:.3f}"

            print(
                f"http up {fmt(up)} s, worker in discovery {fmt(reg)} s, "
                f"model listed {fmt(listed)} s"
            )


if __name__ == "__main__":
    main()
