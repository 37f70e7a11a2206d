"""KV routing over the NATS event plane (a real nats-server on a loopback port): events
reach the router, lost ones are recovered from the worker-local indexer, removals apply."""

from __future__ import annotations

import asyncio

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
