"""Frontend overhead of an image chat request: frontend (``--router-mode kv``) + 1 mocker
worker registered with a MediaDecoder (``--enable-image``, speedup 1000, 2 output tokens),
over file discovery on loopback.

The same chat request is sent sequentially (non-streaming, keep-alive) without an image,
with a 512x512 PNG, a 1024x1024 PNG and a 1024x1024 JPEG as data URLs; the overhead per
image request is its latency minus the text-only latency of the same run (fetch of the data
URL, base64 decode, image decode on the blocking pool, mm_hash, per-block hashes, and the
larger request to the worker: 3 bytes per pixel travel on the request plane).

Usage: ``python benches/bench_multimodal.py [--requests N]``
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def picture(side: int) -> Image.Image:
    noise = Image.frombytes("L", (side, side), os.urandom(side * side)).convert("RGB")
    grad = Image.linear_gradient("L").resize((side, side)).convert("RGB")
    return Image.blend(grad, noise, 0.1)


def data_url(img: Image.Image, fmt: str) -> str:
    out = io.BytesIO()
    img.save(out, format=fmt, quality=90) if fmt == "JPEG" else img.save(out, format=fmt)
    mime = "image/jpeg" if fmt == "JPEG" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(out.getvalue()).decode()}", len(out.getvalue())


def body(url: str | None) -> bytes:
    content: object = "Describe this picture in two words."
    if url is not None:
        content = [
            {"type": "text", "text": "Describe this picture in two words."},
            {"type": "image_url", "image_url": {"url": url}},
        ]
    return json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    ).encode()


def measure(port: int, payload: bytes, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", payload, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        assert r.status == 200, data[:300]
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - t0)
    conn.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-mm-"))
    py = sys.executable
    subprocess.run([py, "-m", "dynamo.llm.tiny_model", str(tmp / "tiny")], check=True)
    env = dict(os.environ, DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(tmp / "kv"))
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                py,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--router-mode",
                "kv",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                py,
                "-m",
                "dynamo.mocker",
                "--model-path",
                str(tmp / "tiny"),
                "--model-name",
                "tiny",
                "--enable-image",
                "--speedup-ratio",
                "1000",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                measure(port, body(None), 0)
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        cases = [("text only", None, 0)]
        for side, fmt in [(512, "PNG"), (1024, "PNG"), (1024, "JPEG")]:
            url, size = data_url(picture(side), fmt)
            cases.append((f"{side}x{side} {fmt} ({size // 1024} KiB)", url, size))
        rows = []
        base = None
        for name, url, _ in cases:
            t = measure(port, body(url), args.requests)
            p50 = statistics.median(t) * 1000
            mean = statistics.fmean(t) * 1000
            base = p50 if base is None else base
            rows.append((name, p50, mean, p50 - base))
        print(f"machine: {machine()}; {args.requests} sequential requests per case\n")
        print("| request | p50 ms | mean ms | overhead vs text (p50) ms |")
        print("|---|---|---|---|")
        for name, p50, mean, over in rows:
            print(f"| {name} | {p50:.2f} | {mean:.2f} | {over:+.2f} |")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


if __name__ == "__main__":
    main()
