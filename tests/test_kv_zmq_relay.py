"""Relay mode: a ``KvEventPublisher`` with ``zmq_endpoint`` reads an engine's KV events from a
real ZMQ PUB socket (pyzmq, vLLM's msgpack format) and the router sees them."""

from __future__ import annotations

import asyncio
import time

import msgpack
import zmq
from kv_cluster import Cluster
from runtime_util import wait_until

from dynamo._core import KvEventPublisher, KvRouter, KvRouterConfig

BS = 4


def batch(seq: int, events: list) -> list[bytes]:
    payload = msgpack.packb([time.time(), events, 0])
    return [b"kv", seq.to_bytes(8, "big"), payload]


async def test_engine_events_are_relayed_to_the_router() -> None:
    c = await Cluster(1).start()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        ep = c.endpoints[0]
        relay = KvEventPublisher(
            ep, kv_block_size=BS, dp_rank=1, zmq_endpoint=f"tcp://127.0.0.1:{port}", zmq_topic="kv"
        )
        router = KvRouter(c.router_rt.endpoint(f"{c.ns}.backend.generate"), BS, KvRouterConfig())
        await wait_until(lambda: relay._subscriber_count() >= 1)
        tokens = c.prompt(3)
        # Two engine blocks, a wrong-size block (dropped by the relay), vLLM's tagged arrays.
        stored = ["BlockStored", [11, 12], None, tokens[: 2 * BS], BS, None, "GPU"]
        odd = ["BlockStored", [13], 12, tokens[2 * BS : 3 * BS - 1], BS - 1, None, "GPU"]
        seq = 0
        # PUB drops messages until the relay's subscription arrives: repeat (stores are
        # idempotent) until the router has them.
        for _ in range(200):
            pub.send_multipart(batch(seq, [stored, odd]))
            seq += 1
            await asyncio.sleep(0.02)
            scores = await router.get_overlap_scores(tokens)
            if scores["workers"]:
                break
        scores = await router.get_overlap_scores(tokens)
        assert [
            (w["worker_id"], w["dp_rank"], w["device_overlap_blocks"]) for w in scores["workers"]
        ] == [(c.ids[0], 1, 2)]
        # A message on another topic is not delivered.
        pub.send_multipart(
            [b"other", (seq).to_bytes(8, "big"), msgpack.packb([0.0, [["AllBlocksCleared"]], 0])]
        )
        # Removal of one block, as a map-encoded event.
        pub.send_multipart(
            batch(seq + 1, [{"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"}])
        )
        for _ in range(300):
            scores = await router.get_overlap_scores(tokens)
            if scores["workers"] and scores["workers"][0]["device_overlap_blocks"] == 1:
                break
            await asyncio.sleep(0.01)
        assert [w["device_overlap_blocks"] for w in scores["workers"]] == [1]
        relay.shutdown()
    finally:
        pub.close(0)
        ctx.term()
        await c.stop()
