"""KV routing over the NATS event plane (a real nats-server on a loopback port): events
reach the router, lost ones are recovered from the worker-local indexer, removals apply."""

from __future__ import annotations

import asyncio

import pytest
from kv_cluster import Cluster


async def eventually(c: Cluster, tokens: list[int], expected: dict[int, int]) -> None:
    for _ in range(500):
        if await c.overlaps(tokens) == expected:
            return
        await asyncio.sleep(0.01)
    assert await c.overlaps(tokens) == expected


async def test_kv_events_over_nats(nats_server, monkeypatch) -> None:
    monkeypatch.setenv("NATS_SERVER", nats_server.url)
    monkeypatch.setenv("DYN_EVENT_PLANE", "nats")
    c = await Cluster(2).start()
    try:
        p = c.prompt(6)
        bs = c.block_size
        # The router's NATS subscription may start after the first event: that event then
        # arrives as a gap (its id is not 0) and is recovered; either way the router ends up
        # with the blocks.
        await c.store(1, p, 6)
        wid, _, overlap = await c.router.best_worker(p)
        assert (wid, overlap) == (c.ids[1], 6)

        c.pubs[1]._drop_next_events(1)
        q = c.prompt(3)
        c.pubs[1].publish_stored(q[: 3 * bs], [bs] * 3, [31, 32, 33])
        r = c.prompt(2)
        c.pubs[1].publish_stored(r[: 2 * bs], [bs] * 2, [41, 42])
        await eventually(c, q, {c.ids[1]: 3})
        await eventually(c, r, {c.ids[1]: 2})

        c.pubs[1].publish_removed([32, 33])
        await eventually(c, q, {c.ids[1]: 1})
    finally:
        await c.stop()


@pytest.mark.parametrize("plane", ["tcp", "nats"])
async def test_router_started_late_learns_blocks_cached_before_it(
    plane, nats_server, monkeypatch
) -> None:
    """Events published before the router subscribed never reach it, and with no later event
    there is no gap to notice: the router syncs each worker it discovers from the worker's
    local indexer once its subscription is live (the race behind an intermittent failure of
    the test above)."""
    if plane == "nats":
        monkeypatch.setenv("NATS_SERVER", nats_server.url)
        monkeypatch.setenv("DYN_EVENT_PLANE", plane)
    c = await Cluster(2).start(router=False)
    try:
        p = c.prompt(5)
        bs = c.block_size
        c.pubs[0].publish_stored(p[: 5 * bs], [bs] * 5, [11, 12, 13, 14, 15])
        await c.start_router()
        await eventually(c, p, {c.ids[0]: 5})
        # Live events after the sync continue from the synced cursor (no duplicate, no gap).
        q = c.prompt(2)
        c.pubs[1].publish_stored(q[: 2 * bs], [bs] * 2, [21, 22])
        await eventually(c, q, {c.ids[1]: 2})
        c.pubs[0].publish_removed([14, 15])
        await eventually(c, p, {c.ids[0]: 3})
    finally:
        await c.stop()
