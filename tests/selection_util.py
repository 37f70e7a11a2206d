"""Helpers shared by the selection-service tests (``tests/test_selection_*.py``): engine
KV-event messages in vLLM's ZMQ wire format, pyzmq PUB sockets, polling, and the standalone
services as processes on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import zmq
from services import free_port

BS = 4


def frame(seq: int, events: list, dp_rank: int = 0) -> list[bytes]:
    """An engine message: ``[topic, seq (8-byte big-endian), msgpack payload]``."""
    return [b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), events, dp_rank])]


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> list:
    """vLLM's ``BlockStored`` event (tagged array) of ``BS``-token blocks on the GPU."""
    return ["BlockStored", hashes, parent, tokens, BS, None, "GPU"]


def pub(ctx: zmq.Context) -> tuple[zmq.Socket, str]:
    """A PUB socket on a free loopback port and its endpoint."""
    s = ctx.socket(zmq.PUB)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    return s, f"tcp://127.0.0.1:{port}"


class Pub:
    """A PUB socket on a free loopback port (or ``port``), numbering its messages."""

    def __init__(self, ctx: zmq.Context, port: int | None = None) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        if port is None:
            self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        else:
            self.port = port
            self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.seq = 0

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def send(self, events: list) -> None:
        self.sock.send_multipart(frame(self.seq, events))
        self.seq += 1

    def send_raw(self, parts: list[bytes]) -> None:
        self.sock.send_multipart(parts)


def wait_for(check, timeout: float = 15.0, every: float = 0.03):
    """Poll ``check`` until it returns a truthy value (which is returned)."""
    deadline = time.monotonic() + timeout
    while True:
        out = check()
        if out:
            return out
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(every)


async def eventually(check, timeout: float = 10.0, every: float = 0.02):
    """Poll ``check`` (sync or async) until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        out = check()
        if asyncio.iscoroutine(out):
            out = await out
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(every)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as ``{"name{labels}": value}``."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class Service:
    """``python -m <module>`` on a free loopback port, stopped with SIGTERM. Its output goes
    to ``log`` when given (else it is kept for the start-up error)."""

    def __init__(self, module: str, *args: str, log: Path | None = None) -> None:
        self.port = free_port()
        self.log = open(log, "wb") if log is not None else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(self.port), *args],
            env={**os.environ, "DYN_LOG": "warn"},
            stdout=self.log if self.log else subprocess.PIPE,
            stderr=subprocess.STDOUT if self.log else subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.call("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                if self.proc.poll() is None:
                    self.proc.kill()
                _, err = self.proc.communicate(timeout=5)
                why = f"see {log}" if self.log else (err or b"").decode()
                raise AssertionError(f"{module} did not start: {why}")
            time.sleep(0.05)

    def call(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        """One request; the answer parsed as JSON when it is JSON."""
        data = (
            None
            if body is None
            else (body if isinstance(body, bytes) else json.dumps(body).encode())
        )
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "x-trace-id": "trace-1"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(str(self.call("GET", "/metrics")[1]))

    def stop(self) -> int:
        """SIGTERM, wait; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.communicate(timeout=5)
            if self.log:
                self.log.close()
