"""The main job: a KV-routing frontend and N mocker workers on a generated tiny model.

Generates the tiny model (no downloads), starts ``python -m dynamo.frontend`` and
``python -m dynamo.mocker --num-workers N`` on a private file-discovery directory, waits for
the model to appear, sends one chat request with urllib and prints it and the answer, then
stops everything with SIGTERM (graceful shutdown).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from dynamo.llm.tiny_model import write_tiny_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prompt", default="Tell me a story about a tiny model.")
    p.add_argument("--max-tokens", type=int, default=24)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="dynamo-demo-") as tmp:
        model = write_tiny_model(Path(tmp) / "tiny-model")
        env = dict(os.environ, DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=f"{tmp}/kv")
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                 "--http-port", str(port), "--router-mode", "kv"],
                env=env,
            ),
            subprocess.Popen(
                [sys.executable, "-m", "dynamo.mocker", "--model-path", str(model),
                 "--model-name", "tiny", "--num-workers", str(args.workers),
                 "--speedup-ratio", "10"],
                env=env,
            ),
        ]  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    health = _get(f"{base}/health")
                    if any(len(m["instances"]) == args.workers for m in health["models"]):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    print("the workers did not come up in time", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            print(
                f"frontend on {base}; models: {[m['id'] for m in _get(f'{base}/v1/models')['data']]}"
            )
            request = {
                "model": "tiny",
                "messages": [{"role": "user", "content": args.prompt}],
                "max_tokens": args.max_tokens,
            }
            print(f"request:  {json.dumps(request)}")
            req = urllib.request.Request(
                f"{base}/v1/chat/completions",
                data=json.dumps(request).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                answer = json.loads(r.read())
            print(f"answer:   {answer['choices'][0]['message']['content']!r}")
            print(f"usage:    {answer['usage']}")
            return 0
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    sys.exit(main())
