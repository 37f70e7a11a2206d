"""Two models whose workers share one endpoint: each request reaches only a worker that
registered the model it names, in every router mode, and the second worker to register
logs a warning naming both models (issue 54, item 1).

A mocker serves ``tiny`` (a token model: the frontend tokenizes) and a text worker serves
``texty`` (the raw OpenAI request; it answers ``echo: <message>``), both on the default
endpoint ``dynamo.backend.generate``. Before the fix, requests were spread over both
workers whatever model they named.
"""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest
from serving_util import WORKERS, Procs, free_port, metric_total, wait_for_instances

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Hello there!"}]
ENDPOINT = "dynamo.backend.generate"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def _log_of(tmp_path: Path, name: str) -> str:
    return "".join(p.read_text(errors="replace") for p in tmp_path.glob(f"{name}-*.log"))


@pytest.mark.parametrize("router_mode", ["round-robin", "random", "kv"])
def test_requests_reach_only_workers_of_their_model(tmp_path, model_dir, router_mode) -> None:
    procs = Procs(tmp_path / "kv", tmp_path)
    procs.env["MARKER"] = str(tmp_path / "requests.jsonl")
    procs.env["ENDPOINT"] = ENDPOINT
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--router-mode", router_mode)
        procs.mocker(model_dir, "--endpoint", f"dyn://{ENDPOINT}")
        wait_for_instances(base, "tiny", 1)
        procs.start("text", [str(WORKERS / "text_worker.py"), str(model_dir)])
        wait_for_instances(base, "texty", 1)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)

        for _ in range(8):
            texty = client.chat.completions.create(model="texty", messages=MESSAGES)
            assert texty.choices[0].message.content == "echo: Hello there!"
            tiny = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
            # The mocker's answer: token ids of the tiny model, never the text worker's echo.
            assert tiny.usage.completion_tokens == 4
            assert not (tiny.choices[0].message.content or "").startswith("echo:")
        # Every request for texty reached the text worker, and only those did.
        assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 8

        deadline = time.monotonic() + 10
        while "whose other instances serve" not in _log_of(tmp_path, "text"):
            assert time.monotonic() < deadline, _log_of(tmp_path, "text")
            time.sleep(0.1)
        warning = next(
            line
            for line in _log_of(tmp_path, "text").splitlines()
            if "whose other instances serve" in line
        )
        assert "WARN" in warning and '"texty"' in warning and '"tiny"' in warning, warning
    finally:
        procs.close()


@pytest.mark.parametrize("event_plane", ["tcp", "nats"])
def test_the_kv_router_sees_the_first_requests_kv_events(
    tmp_path, model_dir, event_plane, request
) -> None:
    """The frontend starts a model's KV router when the model appears, not at its first
    request: the blocks that first request stores are applied (over NATS a router started
    later would never see them)."""
    procs = Procs(tmp_path / "kv", tmp_path)
    procs.env["DYN_EVENT_PLANE"] = event_plane
    if event_plane == "nats":
        procs.env["NATS_SERVER"] = request.getfixturevalue("nats_server").url
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--router-mode", "kv")
        procs.mocker(model_dir, "--block-size", "16")
        wait_for_instances(base, "tiny", 1)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        long = [{"role": "user", "content": "one two three four five six seven " * 8}]
        client.chat.completions.create(model="tiny", messages=long, max_tokens=2)
        deadline = time.monotonic() + 10
        while metric_total(base, "dynamo_router_kv_events_applied_total") < 1:
            assert time.monotonic() < deadline, "the first request's KV events never arrived"
            time.sleep(0.05)
    finally:
        procs.close()
