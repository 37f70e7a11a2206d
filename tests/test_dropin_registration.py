"""Drop-in behaviour of ``register_endpoint_instance`` / ``unregister_endpoint_instance`` on
an endpoint this process does not serve, and of the ``wait_for_instance_by_runtime_data``
timeout message.

Observed with the reference wheel ``ai-dynamo-runtime==1.6.1`` (file discovery, tcp request
plane), on an endpoint never served by the process:

* ``register_endpoint_instance()`` succeeds; a client of the endpoint then sees one
  instance whose id is ``endpoint.connection_id()`` and whose transport is
  ``TransportType(kind="tcp", address="<host>:<port>/<hex>/ns/comp/ep")`` -- the process's
  request-plane server and the path serving the endpoint would use;
* a request sent to it fails (``Unavailable: Server unavailable: unknown endpoint ...``);
* ``unregister_endpoint_instance()`` succeeds and the client sees no instance again;
* ``wait_for_instance_by_runtime_data("k", "v", timeout_s=0.3)`` raises ``TimeoutError``:
  ``Timed out waiting for one endpoint instance with runtime_data["k"] == "v";
  last_match_count=0, matching_ids=[]``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from runtime_util import collect, local_runtime, unique_ns, wait_until


@pytest.fixture(params=["tcp", "nats"])
def plane(request, monkeypatch):
    if request.param == "nats":
        server = request.getfixturevalue("nats_server")
        monkeypatch.setenv("NATS_SERVER", server.url)
    return request.param


async def test_register_an_endpoint_this_process_does_not_serve(plane) -> None:
    async with local_runtime("mem", plane) as rt:
        ns = unique_ns()
        ep = rt.endpoint(f"{ns}.leader.generate")
        client = await rt.endpoint(f"{ns}.leader.generate").client()
        assert client.instance_ids() == []
        await ep.register_endpoint_instance()
        await wait_until(lambda: client.instance_ids() == [ep.connection_id()])
        [instance] = client.instances()
        assert instance.instance_id == ep.connection_id()
        assert instance.transport.kind == ("tcp" if plane == "tcp" else "nats_tcp")
        # Nothing serves it here: a request is refused, not hung.
        with pytest.raises(Exception):  # noqa: B017 - the error text is the request plane's
            await collect(await client.generate({"x": 1}))
        await ep.unregister_endpoint_instance()
        await wait_until(lambda: client.instance_ids() == [])
        # Withdrawing what is not published is not an error either.
        await ep.unregister_endpoint_instance()


async def test_serving_after_registering_reuses_the_instance() -> None:
    async def handler(request):
        yield {"echo": request}

    async with local_runtime("mem") as rt:
        ns = unique_ns()
        ep = rt.endpoint(f"{ns}.w.generate")
        await ep.register_endpoint_instance()
        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        assert client.instance_ids() == [ep.connection_id()]
        # The pre-registered instance is listed at once, but serve_endpoint installs the
        # handler asynchronously: until then the instance answers "Unknown endpoint".
        deadline = time.monotonic() + 10
        while True:
            try:
                answer = await collect(await client.generate({"a": 1}, annotated=False))
                break
            except ValueError as e:
                assert "Unknown endpoint" in str(e) and time.monotonic() < deadline, e
                await asyncio.sleep(0.02)
        assert answer == [{"echo": {"a": 1}}]
        # Still the one instance: serving reused the registered one.
        assert client.instance_ids() == [ep.connection_id()]


async def test_wait_for_instance_by_runtime_data_timeout_names_the_match_count() -> None:
    async with local_runtime("mem") as rt:
        client = await rt.endpoint(f"{unique_ns()}.w.generate").client()
        with pytest.raises(TimeoutError, match=r"last_match_count=0, matching_ids=\[\]"):
            await client.wait_for_instance_by_runtime_data("k", "v", timeout_s=0.2)
