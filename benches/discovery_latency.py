"""Worker registration to the frontend's "model added", this project only (issue 19 item 6).

Spawns frontend and mocker worker through ``serve_launcher.py`` with file discovery (as
``startup_timeline.py`` does), and per round reports the milliseconds from the mtime of the
worker's ``generate`` instance entry in the discovery directory to the timestamp of the
frontend's ``model added`` log line: how long the frontend took to see a new worker. File
mtimes move with the kernel's coarse clock (a few ms), so single figures are approximate
(one can even be slightly negative); compare medians.

    python benches/discovery_latency.py --rounds 12

Run it with the interpreter (and ``PYTHONPATH``) whose ``dynamo`` is measured.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, server_commands, server_env, stop_processes

ADDED = re.compile(r"(\d{4}-\d\d-\d\dT[\d:.]+)Z.*model added")


def one_round(model: str, tmp: Path) -> float:
    kv = tmp / "kv"
    log = tmp / "frontend.log"
    env = server_env(str(kv))
    env.update(DYN_LOG="info", NO_COLOR="1")
    frontend, worker = server_commands(sys.executable, "launcher", model, free_port())
    with open(log, "wb") as out:
        procs = [
            subprocess.Popen(frontend, env=env, stdout=out, stderr=out),
            subprocess.Popen(worker, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        ]
    try:
        deadline = time.monotonic() + 30
        while True:
            text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
            if m := ADDED.search(text):
                stamp = datetime.datetime.fromisoformat(m.group(1))
                added = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"no 'model added' line:\n{text[-3000:]}")
            time.sleep(0.01)
        registered = max(
            (kv / f).stat().st_mtime for f in os.listdir(kv) if "instances" in f and "generate" in f
        )
        return (added - registered) * 1e3
    finally:
        stop_processes(procs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    from dynamo.llm.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(write_tiny_model(Path(tmp) / "tiny"))
        gaps = []
        for i in range(args.rounds):
            work = Path(tmp) / f"round{i}"
            work.mkdir()
            gaps.append(one_round(model, work))
    gaps.sort()
    print(" ".join(f"{g:.2f}" for g in gaps), f"| median {statistics.median(gaps):.2f} ms")


if __name__ == "__main__":
    main()
