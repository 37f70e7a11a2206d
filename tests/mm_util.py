"""Helpers of the multimodal tests: test images, a loopback image server, and a frontend
with ``tests/workers/mm_worker.py`` behind it."""

from __future__ import annotations

import base64
import http.server
import io
import json
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from PIL import Image
from serving_util import WORKERS, Procs, free_port
from serving_util import http as http_request


def image_bytes(img: Image.Image, fmt: str, **save) -> bytes:
    out = io.BytesIO()
    img.save(out, format=fmt, **save)
    return out.getvalue()


def gradient(w: int, h: int, seed: int = 0) -> Image.Image:
    """A deterministic RGB test picture (different ``seed``: different pixels)."""
    img = Image.new("RGB", (w, h))
    img.putdata(
        [
            ((x * 7 + seed * 31) % 256, (y * 5 + seed) % 256, (x + y + seed * 3) % 256)
            for y in range(h)
            for x in range(w)
        ]
    )
    return img


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def header_bomb_png(w: int, h: int) -> bytes:
    """A valid-looking PNG declaring ``w`` x ``h`` with a few bytes of pixel data."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def zeros_bomb_png(side: int) -> bytes:
    """A real decompression bomb: a ``side`` x ``side`` black PNG, a few KB compressed,
    ``3 * side**2`` bytes decoded."""
    row = b"\x00" + b"\x00" * (3 * side)
    comp = zlib.compressobj(9)
    body = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", body)
        + png_chunk(b"IEND", b"")
    )


class ImageServer:
    """A threaded HTTP server on 127.0.0.1 serving ``files`` (path → (content type,
    bytes)) plus ``/redirect?to=<url>`` (302), ``/slow`` (headers, then a 3 s stall) and
    ``/chunked/<path>`` (the file without ``Content-Length``)."""

    def __init__(self, files: dict[str, tuple[str, bytes]]) -> None:
        self.files = files
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                try:
                    self.serve()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the fetcher hung up on purpose (size cap, timeout)

            def serve(self) -> None:
                server.requests.append((self.path, self.headers.get("User-Agent", "")))
                path, _, query = self.path.partition("?")
                if path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", query.removeprefix("to="))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if path == "/slow":
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.flush()
                    time.sleep(3)
                    return
                chunked = path.startswith("/chunked/")
                key = path.removeprefix("/chunked")
                if key not in server.files:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                ctype, body = server.files[key]
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(body), 16384):
                        piece = body[i : i + 16384]
                        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class MmCluster:
    """``python -m dynamo.frontend`` plus one ``mm_worker.py`` serving ``models``."""

    def __init__(self, tmp: Path, model_dir: Path, models: dict) -> None:
        (tmp / "kv").mkdir()
        (tmp / "logs").mkdir()
        self.procs = Procs(tmp / "kv", tmp / "logs")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.procs.frontend(self.port)
        self.mm_log = tmp / "logs" / "requests.jsonl"
        env = dict(self.procs.env, MM_MODELS=json.dumps(models), MM_LOG=str(self.mm_log))
        self.log = open(tmp / "logs" / "mm_worker.log", "wb")
        self.worker = subprocess.Popen(
            [sys.executable, str(WORKERS / "mm_worker.py"), str(model_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.procs.procs.append(self.worker)
        line = self.worker.stdout.readline()
        assert line.strip() == "READY", line
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                status, body = http_request("GET", f"{self.base}/v1/models", timeout=2)
                if status == 200 and {m["id"] for m in json.loads(body)["data"]} >= set(models):
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("the frontend never listed the models")

    def chat(self, model: str, url: str, text: str = "Describe the image.") -> tuple[int, dict]:
        """``(status, JSON body)`` of one chat request with one image part."""
        body = {
            "model": model,
            "max_tokens": 200,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": text},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ],
        }
        status, raw = http_request(
            "POST", f"{self.base}/v1/chat/completions", json.dumps(body).encode(), timeout=30
        )
        return status, json.loads(raw)

    def last_request(self) -> dict:
        """What the worker received last (``token_ids``, ``ranges``, ``mm_routing_info``)."""
        return json.loads(self.mm_log.read_text().splitlines()[-1])

    def close(self) -> None:
        self.procs.close()
        self.log.close()
