"""examples/hello_world: server and client as separate processes over file discovery."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "hello_world"


def test_hello_world_server_and_client(tmp_path) -> None:
    env = dict(os.environ, DYN_FILE_KV=str(tmp_path / "kv"), DYN_LOG="warn")
    env.pop("DYN_DISCOVERY_BACKEND", None)
    env.pop("ETCD_ENDPOINTS", None)
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "server.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "serving hello_world.backend.generate" in (server.stdout.readline() or "")
        client = subprocess.run(
            [sys.executable, str(EXAMPLES / "client.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        lines = [line for line in client.stdout.splitlines() if line.startswith("Hello")]
        assert len(lines) == 12
        assert [line.split(" (")[0] for line in lines[:4]] == [
            "Hello world",
            "Hello sun",
            "Hello moon",
            "Hello star",
        ]
        server.terminate()
        assert server.wait(15) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(5)
