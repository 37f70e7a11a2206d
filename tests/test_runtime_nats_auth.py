"""NATS with authorization (tests/services.py): a nats-server requiring a user and password,
or a token. Workers and callers with the right ``NATS_AUTH_*`` variables serve and call over
the NATS request plane; wrong or missing credentials fail at once with ``CannotConnect``
naming the variables."""

from __future__ import annotations

import asyncio

import pytest
from runtime_util import Worker, collect, local_runtime, unique_ns, wait_until

from dynamo._core import CannotConnect

AUTH_VARS = ("NATS_AUTH_USERNAME", "NATS_AUTH_PASSWORD", "NATS_AUTH_TOKEN")


@pytest.fixture(scope="module", params=["user", "token"])
def secured_nats(request):
    from services import Nats

    if request.param == "user":
        server = Nats(user="alice", password="s3cret pw")
        wrong = {"NATS_AUTH_USERNAME": "alice", "NATS_AUTH_PASSWORD": "nope"}
        source = "NATS_AUTH_USERNAME/NATS_AUTH_PASSWORD"
    else:
        server = Nats(token="t0ken-123")
        wrong = {"NATS_AUTH_TOKEN": "t0ken-456"}
        source = "NATS_AUTH_TOKEN"
    server.start()
    server.wrong_env = wrong  # type: ignore[attr-defined]
    server.source = source  # type: ignore[attr-defined]
    yield server
    server.close()


@pytest.fixture
def env(secured_nats, tmp_path, monkeypatch):
    """File discovery in a temp directory, NATS request plane on the secured server; the
    test's own process starts without credentials."""
    values = {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "DYN_FILE_KV_TTL_SECS": "2",
        "DYN_REQUEST_PLANE": "nats",
        "NATS_SERVER": secured_nats.url,
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    for k in AUTH_VARS:
        monkeypatch.delenv(k, raising=False)
    return values


def set_auth(monkeypatch, auth: dict[str, str]) -> None:
    for k in AUTH_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in auth.items():
        monkeypatch.setenv(k, v)


async def test_right_credentials_serve_and_call(secured_nats, env, tmp_path, monkeypatch):
    ns = unique_ns()
    worker = Worker(tmp_path / "kv", ns, **env, **secured_nats.auth_env)
    try:
        set_auth(monkeypatch, secured_nats.auth_env)
        async with local_runtime("file", "nats") as rt:
            client = await rt.endpoint(f"{ns}.worker.generate").client()
            await wait_until(lambda: client.instance_ids() == [worker.instance_id])
            items = await collect(await client.round_robin({"n": 3}, annotated=False))
            assert [x["i"] for x in items] == [0, 1, 2]
        assert worker.stop() == 0
    finally:
        worker.kill()


@pytest.mark.parametrize("credentials", ["wrong", "missing"])
async def test_bad_credentials_fail_with_cannot_connect(
    secured_nats, env, tmp_path, monkeypatch, credentials
):
    ns = unique_ns()
    worker = Worker(tmp_path / "kv", ns, **env, **secured_nats.auth_env)
    try:
        bad = secured_nats.wrong_env if credentials == "wrong" else {}
        source = secured_nats.source if credentials == "wrong" else "no NATS_AUTH_"
        set_auth(monkeypatch, bad)
        async with local_runtime("file", "nats") as rt:
            # Serving: refused by the NATS server, at once.
            endpoint = rt.endpoint(f"{ns}.other.generate")

            async def handler(request):
                yield request

            with pytest.raises(CannotConnect, match="authorization") as served:
                await asyncio.wait_for(endpoint.serve_endpoint(handler), 10)
            assert source in str(served.value)
            # Calling the worker (discovered through the file store): refused too.
            client = await rt.endpoint(f"{ns}.worker.generate").client()
            await wait_until(lambda: client.instance_ids() == [worker.instance_id])
            with pytest.raises(CannotConnect, match="authorization"):
                await asyncio.wait_for(client.round_robin({}, annotated=False), 10)
    finally:
        worker.kill()
