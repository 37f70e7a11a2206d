"""The NATS request plane across a broker restart (our own nats-server, same port).

A worker subprocess and an in-process client on ``DYN_REQUEST_PLANE=nats``; 16 streams
are in flight when the broker is stopped and started again.

Reported in issue 20 (before the fix): every in-flight stream failed (16/16) only after
the 2 s liveness timeout, and requests sent right after the reconnection were lost (the
worker had not re-subscribed yet) and waited out the 10 s acknowledgement timeout; the
reference 1.6.1 lost none.

Now: an in-flight stream either completes or, since frames may have died with the broker
and carry no sequence numbers to resume from, ends at once with a typed ``Disconnected``
error that names the NATS connection loss (migratable: the frontend's migration resumes
it on a worker when ``--migration-limit`` allows); the items it delivered are a gap-free
prefix. Requests sent right after the restart all complete: a request that finds no
subscriber yet (NATS "no responders") is re-sent to the same worker while the connection
settles, instead of vanishing.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from runtime_util import Worker, local_runtime, unique_ns, wait_until
from services import Nats

from dynamo._core import CannotConnect, Disconnected

pytestmark = pytest.mark.slow

STREAMS = 16
ITEMS = 40
OUTAGE_S = 1.0


@pytest.fixture
def nats():
    n = Nats()
    n.start()
    try:
        yield n
    finally:
        n.close()


async def _drain(stream) -> tuple[list[int], BaseException | None, float]:
    """``(item indices, error, monotonic time it ended)``."""
    got: list[int] = []
    try:
        async for item in stream:
            got.append(item["i"])
    except Disconnected as e:
        return got, e, time.monotonic()
    return got, None, time.monotonic()


async def _one_request(client) -> float:
    t0 = time.monotonic()
    items = [i async for i in await client.round_robin({"n": 3}, annotated=False)]
    assert [i["i"] for i in items] == [0, 1, 2]
    return time.monotonic() - t0


async def test_streams_and_new_requests_across_a_broker_restart(
    tmp_path, monkeypatch, nats
) -> None:
    env = {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "DYN_REQUEST_PLANE": "nats",
        "NATS_SERVER": nats.url,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ns = unique_ns()
    worker = Worker(tmp_path / "kv", ns, **env)
    try:
        async with local_runtime("file", "nats") as rt:
            client = await rt.endpoint(f"{ns}.worker.generate").client()
            await wait_until(lambda: client.instance_ids() == [worker.instance_id])
            assert await _one_request(client) < 5

            streams = [
                await client.round_robin({"n": ITEMS, "delay": 0.05}, annotated=False)
                for _ in range(STREAMS)
            ]
            firsts = [(await anext(s))["i"] for s in streams]
            assert firsts == [0] * STREAMS
            drains = [asyncio.ensure_future(_drain(s)) for s in streams]
            await asyncio.sleep(0.2)

            stopped_at = time.monotonic()
            await asyncio.to_thread(nats.stop)
            # Requests sent during the outage (queued) and right after the restart (the
            # client and the worker reconnect at different moments, up to 1 s apart):
            # none may vanish into a 10 s timeout.
            during = [asyncio.ensure_future(_one_request(client)) for _ in range(5)]
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(nats.start)
            restarted_at = time.monotonic()
            after = [asyncio.ensure_future(_one_request(client)) for _ in range(10)]
            latencies = await asyncio.wait_for(asyncio.gather(*during, *after), 30)
            results = await asyncio.wait_for(asyncio.gather(*drains), 30)

            # A worker that is really gone: NATS answers "no responders", a typed
            # CannotConnect well before the 10 s acknowledgement timeout.
            await asyncio.sleep(3.5)  # past the settle window of the reconnection
            worker.kill()
            t0 = time.monotonic()
            with pytest.raises(CannotConnect, match="no responders"):
                await client.direct({"n": 1}, worker.instance_id, annotated=False)
            gone_after = time.monotonic() - t0
            assert gone_after < 2, gone_after

        completed = failed = 0
        for got, err, ended in results:
            full = [0, *got]
            assert full == list(range(len(full))), "a stream must never skip items"
            if err is None:
                assert len(full) == ITEMS
                completed += 1
            else:
                assert "NATS connection was lost" in str(err), err
                assert ended - stopped_at < 5, "the error must come promptly"
                failed += 1
        print(
            f"restart took {restarted_at - stopped_at:.2f} s; streams: {completed} completed, "
            f"{failed} ended with Disconnected; requests after restart: max "
            f"{max(latencies):.2f} s (outage {OUTAGE_S} s); dead worker refused in "
            f"{gone_after:.2f} s"
        )
        assert completed + failed == STREAMS
        assert max(latencies) < OUTAGE_S + 5, latencies
    finally:
        worker.kill()
