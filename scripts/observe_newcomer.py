"""Observe, black-box, what a newcomer meets on a frontend (issue 54, items 1, 5, 6).

Run with an interpreter that has a ``dynamo`` package providing ``python -m
dynamo.frontend`` and ``python -m dynamo.mocker`` (this project's ``.venv``, or the
reference's venv made by ``bash benches/setup_reference.sh --cli``)::

    .venv/bin/python scripts/observe_newcomer.py --python .bench-ref-venv/bin/python

It starts a frontend, a mocker serving ``tiny`` and a text worker serving ``texty``
(``tests/workers/text_worker.py``) on the same endpoint, all on file discovery in a
temporary directory and loopback ports, and prints one JSON object: the answers to a wrong
method, a field of the wrong type, an unknown model, which worker answered each model's
requests, a second frontend on the same port, and the metrics after a client disconnect.
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
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENDPOINT = "dynamo.backend.generate"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(method: str, url: str, body: dict | None = None, timeout: float = 30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode(errors="replace")


def wait_models(base: str, want: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, _, body = request("GET", f"{base}/v1/models", timeout=2)
            if want <= {m["id"] for m in json.loads(body)["data"]}:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"models {want} never listed")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable, help="interpreter of the side to observe")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="observe-newcomer-"))
    env = dict(os.environ)
    env.update(
        {
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(tmp / "kv"),
            "DYN_REQUEST_PLANE": "tcp",
            "MARKER": str(tmp / "texty.jsonl"),
            "ENDPOINT": ENDPOINT,
        }
    )
    model = tmp / "model"
    subprocess.run(
        [sys.executable, "-m", "dynamo.llm.tiny_model", str(model)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(name: str, argv: list[str]) -> None:
        log = open(tmp / f"{name}.log", "wb")
        procs.append(
            subprocess.Popen([args.python, *argv], env=env, stdout=log, stderr=subprocess.STDOUT)
        )

    out: dict = {"python": args.python}
    try:
        start(
            "frontend",
            ["-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)],
        )
        start(
            "mocker",
            [
                "-m",
                "dynamo.mocker",
                "--model-path",
                str(model),
                "--model-name",
                "tiny",
                "--endpoint",
                f"dyn://{ENDPOINT}",
                "--speedup-ratio",
                "10",
            ],
        )
        wait_models(base, {"tiny"})
        start("text", [str(ROOT / "tests" / "workers" / "text_worker.py"), str(model)])
        wait_models(base, {"tiny", "texty"})
        time.sleep(1)

        status, headers, body = request("GET", f"{base}/v1/chat/completions")
        out["get_chat"] = {"status": status, "allow": headers.get("allow"), "body": body}
        status, _, body = request(
            "POST", f"{base}/v1/chat/completions", {"model": "tiny", "messages": "Hi"}
        )
        out["messages_string"] = {"status": status, "body": body}
        msg = [{"role": "user", "content": "Hello there!"}]
        status, _, body = request(
            "POST", f"{base}/v1/chat/completions", {"model": "nope", "messages": msg}
        )
        out["unknown_model"] = {"status": status, "body": body}

        texty_by_text = tiny_by_text = 0
        for _ in range(8):
            status, _, body = request(
                "POST", f"{base}/v1/chat/completions", {"model": "texty", "messages": msg}
            )
            texty_by_text += status == 200 and "echo: Hello there!" in body
            status, _, body = request(
                "POST",
                f"{base}/v1/chat/completions",
                {"model": "tiny", "messages": msg, "max_tokens": 4},
            )
            tiny_by_text += "echo:" in body
        marker = tmp / "texty.jsonl"
        out["two_models_one_endpoint"] = {
            "texty_answered_by_text_worker_of_8": texty_by_text,
            "tiny_answered_by_text_worker_of_8": tiny_by_text,
            "requests_seen_by_text_worker": len(marker.read_text().splitlines())
            if marker.exists()
            else 0,
        }

        second = subprocess.run(
            [
                args.python,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        out["busy_port"] = {
            "exit": second.returncode,
            "stderr_lines": len(second.stderr.strip().splitlines()),
            "stderr_tail": second.stderr.strip().splitlines()[-1:] if second.stderr else [],
        }

        req = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps(
                {"model": "tiny", "messages": msg, "stream": True, "max_tokens": 3000}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            r.readline()
        time.sleep(2)
        _, _, metrics = request("GET", f"{base}/metrics")
        out["after_disconnect"] = [
            line
            for line in metrics.splitlines()
            if ("requests_total" in line and 'model="tiny"' in line and "stream" in line)
            or line.startswith("dynamo_frontend_disconnected_clients")
        ]
        out["logs_mention_disconnect_or_cancel"] = {
            name: [
                line.strip()[:200]
                for line in (tmp / f"{name}.log").read_text(errors="replace").splitlines()
                if "isconnect" in line or "ancel" in line
            ][:3]
            for name in ("frontend", "mocker")
        }
        out["mocker_start_lines_at_info"] = [
            line.strip()[:200]
            for line in (tmp / "mocker.log").read_text(errors="replace").splitlines()
            if " INFO " in line
        ][:5]
        out["text_worker_warning"] = [
            line.strip()[:240]
            for line in (tmp / "text.log").read_text(errors="replace").splitlines()
            if "WARN" in line
        ][:3]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
