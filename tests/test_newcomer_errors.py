"""What a newcomer sees when something is off (issue 54, items 5 and 6).

Errors say what to do: a second frontend on a busy port ends with one line naming the flag
(no traceback, no ``Unknown``); an unknown model points at ``/v1/models``; a body field of
the wrong type is named; a wrong method gets the error object and ``Allow``. Signs of life:
a worker logs that it serves (endpoint, instance id) and which model it registered; a
client that goes away is logged on both sides and counted as ``status="disconnected"``
and in ``dynamo_frontend_disconnected_clients``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from serving_util import Procs, free_port, http, metric, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A frontend and one mocker; yields ``(procs, base, port, log_dir)``."""
    tmp = tmp_path_factory.mktemp("stack")
    model = write_tiny_model(tmp / "model")
    procs = Procs(tmp / "kv", tmp)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port)
        procs.mocker(model)
        wait_for_instances(base, "tiny", 1)
        yield procs, base, port, tmp
    finally:
        procs.close()


def _log(tmp: Path, name: str) -> str:
    return "".join(p.read_text(errors="replace") for p in tmp.glob(f"{name}-*.log"))


def _until_logged(tmp: Path, name: str, text: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while text not in _log(tmp, name):
        assert time.monotonic() < deadline, f"{text!r} not in {name}'s log:\n{_log(tmp, name)}"
        time.sleep(0.05)
    return next(line for line in _log(tmp, name).splitlines() if text in line)


def test_a_busy_port_is_one_line_naming_the_flag(stack) -> None:
    procs, _, port, _ = stack
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynamo.frontend",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(port),
        ],
        env=procs.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out
    assert "Traceback" not in out.stderr and "Unknown" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    line = lines[0]
    assert line.startswith("python -m dynamo.frontend: error: cannot listen on 127.0.0.1:"), line
    assert "Address already in use" in line and "--http-port" in line, line


def _post(base: str, path: str, body: dict) -> tuple[int, dict]:
    status, raw = http("POST", f"{base}{path}", json.dumps(body).encode())
    return status, json.loads(raw)


def test_an_unknown_model_points_at_the_model_list(stack) -> None:
    _, base, _, _ = stack
    status, body = _post(
        base,
        "/v1/chat/completions",
        {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 404
    assert body["error"]["code"] == "model_not_found"
    assert "/v1/models" in body["error"]["message"], body


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "messages": "Hi"}, "messages"),
        ({"model": "tiny", "messages": [{"role": "user", "content": 5}]}, "messages[0]"),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "a"},
            "max_tokens",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_named(stack, body, param) -> None:
    _, base, _, _ = stack
    status, answer = _post(base, "/v1/chat/completions", body)
    assert status == 400, answer
    assert answer["error"]["param"] is not None and answer["error"]["param"].startswith(param), (
        answer
    )
    assert f"'{answer['error']['param']}'" in answer["error"]["message"], answer


def test_a_wrong_method_gets_the_error_object_and_allow(stack) -> None:
    _, base, _, _ = stack
    req = urllib.request.Request(f"{base}/v1/chat/completions", method="GET")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("GET /v1/chat/completions succeeded")
    except urllib.error.HTTPError as e:
        assert e.code == 405
        assert e.headers["Allow"] == "POST"
        body = json.loads(e.read())
    assert body["error"]["code"] == "method_not_allowed", body
    assert "GET" in body["error"]["message"], body


def test_a_worker_says_it_is_up(stack) -> None:
    _, _, _, tmp = stack
    serving = _until_logged(tmp, "mocker", "serving endpoint=dynamo.backend.generate")
    assert "INFO" in serving and "instance_id=" in serving and "transport=tcp://" in serving
    registered = _until_logged(tmp, "mocker", "model registered")
    assert "model=tiny" in registered and "endpoint=dynamo.backend.generate" in registered


def test_a_client_disconnect_is_logged_and_counted_apart(stack) -> None:
    _, base, port, tmp = stack
    before = metric(base, "dynamo_frontend_disconnected_clients")
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
            "max_tokens": 5000,
        }
    ).encode()
    req = urllib.request.Request(
        f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.readline().startswith(b"data: ")
    # The connection is closed with the stream still running.
    line = _until_logged(tmp, "frontend", "client disconnected; request cancelled")
    assert "INFO" in line and "model=tiny" in line
    worker = _until_logged(tmp, "mocker", "request cancelled by the caller")
    assert "request_id=" in worker
    deadline = time.monotonic() + 10
    while metric(base, "dynamo_frontend_disconnected_clients") != before + 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (
        metric(
            base,
            "dynamo_frontend_requests_total",
            model="tiny",
            endpoint="chat_completions",
            request_type="stream",
            status="disconnected",
        )
        >= 1
    )
    assert port


def test_two_mocker_workers_with_a_system_port_serve_one_status_server_each(tmp_path) -> None:
    model = write_tiny_model(tmp_path / "model")
    procs = Procs(tmp_path / "kv", tmp_path)
    # Two consecutive free ports (worker i serves on DYN_SYSTEM_PORT + i).
    port = free_port()
    while True:
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            port = free_port()
    procs.env.update({"DYN_SYSTEM_PORT": str(port), "DYN_SYSTEM_HOST": "127.0.0.1"})
    try:
        mocker = procs.mocker(model, "--num-workers", "2")
        for p in (port, port + 1):
            deadline = time.monotonic() + 20
            while True:
                assert mocker.poll() is None, _log(tmp_path, "mocker")
                try:
                    status, body = http("GET", f"http://127.0.0.1:{p}/health", timeout=2)
                    if status == 200 and json.loads(body)["status"] == "ready":
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, _log(tmp_path, "mocker")
                time.sleep(0.1)
    finally:
        procs.close()
