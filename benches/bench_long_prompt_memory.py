"""Frontend memory for prompts longer than the context: RSS before, peak and after.

Starts ``python -m dynamo.frontend`` (optionally under ``prlimit --as``) and one mocker on
the tiny model (context 8192 tokens) over file discovery, then sends chat requests whose
prompt is ``hello world `` repeated to each size, and prints the status, the time to the
answer and the frontend's ``VmRSS`` / ``VmHWM`` (peak) after each.

Usage: python benches/bench_long_prompt_memory.py [--cap BYTES] SIZE_MB [SIZE_MB ...]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def memory_mb(pid: int) -> tuple[float, float]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sizes", type=float, nargs="+", help="prompt sizes in MB")
    p.add_argument("--cap", type=int, default=None, help="address-space cap (bytes)")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp())
    py = sys.executable
    subprocess.run([py, "-m", "dynamo.llm.tiny_model", str(root / "tiny")], check=True)
    limit_mb = int(max(a.sizes)) + 16
    env = dict(
        os.environ,
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(root / "kv"),
        DYN_HTTP_BODY_LIMIT_MB=str(limit_mb),
    )
    port = free_port()
    prefix = ["prlimit", f"--as={a.cap}", "--"] if a.cap else []
    frontend = subprocess.Popen(
        [*prefix, py, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)],
        env=env, stdout=open(root / "frontend.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    mocker = subprocess.Popen(
        [py, "-m", "dynamo.mocker", "--model-path", str(root / "tiny"), "--model-name", "tiny"],
        env=env, stdout=open(root / "mocker.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    small = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if post(base, small)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the frontend never served the tiny model")
            time.sleep(0.2)
        rss, peak = memory_mb(frontend.pid)
        print(f"idle: RSS {rss:.0f} MB, peak {peak:.0f} MB (body limit {limit_mb} MiB)")
        for mb in a.sizes:
            n = int(mb * 1e6)
            text = ("hello world " * (n // 12 + 1))[:n]
            body = json.dumps(
                {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
            ).encode()
            del text
            started = time.monotonic()
            status, _ = post(base, body)
            elapsed = time.monotonic() - started
            del body
            time.sleep(1)
            alive = frontend.poll() is None
            rss, peak = memory_mb(frontend.pid) if alive else (0.0, 0.0)
            after = post(base, small)[0] if alive else None
            print(
                f"{mb:g} MB prompt: {status} in {elapsed:.2f} s; RSS {rss:.0f} MB, peak "
                f"{peak:.0f} MB; alive {alive}; next request {after}"
            )
    finally:
        for proc in (frontend, mocker):
            proc.terminate()
        for proc in (frontend, mocker):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
