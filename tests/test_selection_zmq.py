"""ZMQ KV events into the selection services, end to end.

* The mocker publishes its KV events on ZMQ like a vLLM engine (``--zmq-kv-events-ports``,
  ``--zmq-replay-ports``): after a completion through a frontend, an in-process
  ``SelectionService`` and a standalone ``python -m dynamo.select_service`` both score the
  prompt's blocks on the worker that served it and select it.
* Gap repair: a pyzmq publisher that loses messages on PUB but serves them on its replay
  (ROUTER) socket, vLLM's protocol -> the index is complete and the repaired-gap counter
  moves; no replay endpoint, or a replay buffer that no longer holds the range -> an
  unrepaired gap, and the subscriber keeps working.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
from selection_util import BS, Service, stored, wait_for
from serving_util import Procs, free_port, http, wait_for_instances

from dynamo.llm import SelectionService
from dynamo.llm.tiny_model import write_tiny_model


class SelectService(Service):
    """``python -m dynamo.select_service`` on a free loopback port (log to a file)."""

    def __init__(self, log: Path) -> None:
        super().__init__("dynamo.select_service", log=log)


def device_blocks(scores: dict) -> dict[int, int]:
    return {w["worker_id"]: w["device_blocks"] for w in scores["workers"]}


# ----------------------------------------------------------------------------------------
# The mocker as a ZMQ KV-event publisher
# ----------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_mocker_zmq_kv_events_feed_both_selection_services(tmp_path: Path) -> None:
    model_dir = write_tiny_model(tmp_path / "tiny")
    procs = Procs(tmp_path / "kv", tmp_path)
    pub_ports = [free_port(), free_port()]
    replay_ports = [free_port(), free_port()]
    fe = free_port()
    base = f"http://127.0.0.1:{fe}"
    svc = SelectionService()
    standalone = None
    try:
        procs.frontend(fe, "--namespace", "zsel")
        procs.mocker(
            model_dir, "--endpoint", "dyn://zsel.backend.generate", "--num-workers", "2",
            "--block-size", str(BS), "--speedup-ratio", "10",
            "--zmq-kv-events-ports", ",".join(map(str, pub_ports)),
            "--zmq-replay-ports", ",".join(map(str, replay_ports)),
        )  # fmt: skip
        standalone = SelectService(tmp_path / "select.log")
        wait_for_instances(base, "tiny", 2)
        workers = [
            {
                "worker_id": i + 1,
                "model_name": "tiny",
                "block_size": BS,
                "endpoint": f"http://mocker-{i}",
                "kv_events_endpoint": f"tcp://127.0.0.1:{pub_ports[i]}",
                "replay_endpoint": f"tcp://127.0.0.1:{replay_ports[i]}",
            }
            for i in range(2)
        ]
        for w in workers:
            rec = await svc.upsert_worker(w)
            assert rec["replay_endpoint"] == w["replay_endpoint"]
            assert standalone.call("POST", "/workers", w)[0] in (200, 201)

        deadline = time.monotonic() + 15
        while not all(r["lifecycle"] == "schedulable" for r in svc.list_workers()):
            assert time.monotonic() < deadline, svc.list_workers()
            await asyncio.sleep(0.05)
        wait_for(
            lambda: all(
                r["lifecycle"] == "schedulable" for r in standalone.call("GET", "/workers")[1]
            )
        )
        # Let the subscriptions reach the mocker's PUB sockets.
        await asyncio.sleep(0.5)

        # 32 prompt tokens = 8 full blocks, cached on whichever worker serves the request.
        prompt = list(range(1, 33))
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2}).encode()
        status, _ = await asyncio.to_thread(http, "POST", f"{base}/v1/completions", body)
        assert status == 200
        query = {"model_name": "tiny", "token_ids": prompt}

        async def inproc_scored() -> dict[int, int] | None:
            blocks = device_blocks(await svc.overlap_scores(query))
            return blocks if sorted(blocks.values()) == [0, 8] else None

        deadline = time.monotonic() + 15
        while (blocks := await inproc_scored()) is None:
            assert time.monotonic() < deadline, await svc.overlap_scores(query)
            await asyncio.sleep(0.05)
        served = next(w for w, b in blocks.items() if b == 8)
        choice = await svc.select(query)
        assert choice["worker_id"] == served
        assert choice["overlap"]["gpu"] == 8 * BS

        def standalone_scored() -> dict[int, int] | None:
            status, scores = standalone.call("POST", "/overlap_scores", query)
            assert status == 200, scores
            return device_blocks(scores) if device_blocks(scores).get(served) == 8 else None

        assert wait_for(standalone_scored) == blocks
        status, choice = standalone.call("POST", "/select", query)
        assert status == 200 and choice["worker_id"] == served
        m = standalone.metrics()
        assert m['dynamo_select_service_kv_events_total{outcome="applied"}'] >= 1
        assert m["dynamo_select_service_malformed_frames_total"] == 0
        assert m["dynamo_select_service_sequence_gaps_unrepaired_total"] == 0
    finally:
        svc.shutdown()
        if standalone is not None:
            assert standalone.stop() == 0
        procs.close()


def test_mocker_zmq_ports_are_validated(tmp_path: Path) -> None:
    model_dir = write_tiny_model(tmp_path / "tiny")
    out = subprocess.run(
        [sys.executable, "-m", "dynamo.mocker", "--model-path", str(model_dir),
         "--num-workers", "2", "--zmq-kv-events-ports", "5600"],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert b"--zmq-kv-events-ports lists 1 ports for 2 workers" in out.stderr


# ----------------------------------------------------------------------------------------
# Gap repair with pyzmq publishers
# ----------------------------------------------------------------------------------------


TOKENS = list(range(100, 132))  # 8 blocks


def chain(i: int) -> list:
    """Store block ``i`` of TOKENS (hash 1000 + i, parent the previous block)."""
    return stored([1000 + i], 1000 + i - 1 if i else None, TOKENS[i * BS : (i + 1) * BS])


class EnginePub:
    """A vLLM-like publisher: PUB ``[topic, seq, payload]`` plus, optionally, a replay
    ROUTER socket answering ``["", start_seq]`` with ``["", seq, payload]`` for each
    buffered message from ``start_seq`` on, then ``["", -1, ""]`` (vLLM's layout)."""

    def __init__(self, ctx: zmq.Context, replay: bool, buffer: int = 100) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.replay_port = None
        self.requests: list[int] = []
        if replay:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.requests.append(start_seq)
            with self.lock:
                items = [(s, p) for s, p in self.buffer if s >= start_seq]
            for s, p in items:
                self.router.send_multipart([ident, b"", s.to_bytes(8, "big"), p])
            self.router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def message(self, events: list, send: bool = True) -> None:
        payload = msgpack.packb([time.time(), events, 0])
        with self.lock:
            self.buffer.append((self.seq, payload))
        if send:
            self.pub.send_multipart([b"", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def worker(self, wid: int) -> dict:
        w = {
            "worker_id": wid,
            "model_name": "m",
            "block_size": BS,
            "endpoint": f"http://w{wid}",
            "kv_events_endpoint": f"tcp://127.0.0.1:{self.port}",
        }
        if self.replay_port is not None:
            w["replay_endpoint"] = f"tcp://127.0.0.1:{self.replay_port}"
        return w

    def close(self) -> None:
        self.stop.set()
        if self.replay_port is not None:
            self.thread.join(timeout=5)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SelectService]:
    s = SelectService(tmp_path / "select.log")
    yield s
    assert s.stop() == 0


def scored(svc: SelectService, wid: int, blocks: int) -> bool:
    status, scores = svc.call("POST", "/overlap_scores", {"model_name": "m", "token_ids": TOKENS})
    assert status == 200, scores
    return device_blocks(scores).get(wid) == blocks


def connect(svc: SelectService, pub: EnginePub, wid: int) -> None:
    """Register and repeat block 0 (idempotent, one sequence number each) until the
    subscription is live and the service holds it."""
    assert svc.call("POST", "/workers", pub.worker(wid))[0] in (200, 201)

    def first() -> bool:
        pub.message([chain(0)])
        return scored(svc, wid, 1)

    wait_for(first)


def gaps(svc: SelectService) -> tuple[float, float, float]:
    m = svc.metrics()
    p = "dynamo_select_service_sequence_gaps"
    return m[f"{p}_total"], m[f"{p}_repaired_total"], m[f"{p}_unrepaired_total"]


def test_gap_is_repaired_from_the_replay_socket(ctx: zmq.Context, service: SelectService) -> None:
    pub = EnginePub(ctx, replay=True)
    try:
        connect(service, pub, 1)
        assert gaps(service) == (0, 0, 0)
        # Blocks 1-5 are lost on PUB (but buffered), block 6 arrives: the listener asks the
        # replay socket for the missing range and applies it first, so the chain is whole.
        for i in range(1, 6):
            pub.message([chain(i)], send=False)
        missing_from = pub.seq - 5
        pub.message([chain(6)])
        wait_for(lambda: scored(service, 1, 7))
        assert gaps(service) == (1, 1, 0)
        assert pub.requests == [missing_from]
        m = service.metrics()
        assert m["dynamo_select_service_replayed_messages_total"] == 5
        # Live messages keep flowing afterwards.
        pub.message([chain(7)])
        wait_for(lambda: scored(service, 1, 8))
    finally:
        pub.close()


def test_unrepairable_gaps_are_counted_and_the_subscriber_keeps_working(
    ctx: zmq.Context, service: SelectService
) -> None:
    plain = EnginePub(ctx, replay=False)
    short = EnginePub(ctx, replay=True, buffer=2)
    try:
        connect(service, plain, 1)
        connect(service, short, 2)
        # No replay endpoint: block 1 is lost for good; block 2 cannot attach to it.
        plain.message([chain(1)], send=False)
        plain.message([chain(2)])
        wait_for(lambda: gaps(service) == (1, 0, 1))
        # The subscriber still works: re-storing the chain completes the prefix.
        plain.message([chain(1), chain(2), chain(3)])
        wait_for(lambda: scored(service, 1, 4))
        # A replay buffer of 2 no longer holds the first of 4 lost messages: the replay
        # answer starts too late, the gap stays unrepaired (what came back is applied).
        for i in range(1, 5):
            short.message([chain(i)], send=False)
        short.message([chain(5)])
        wait_for(lambda: gaps(service) == (2, 0, 2))
        assert len(short.requests) == 1
        short.message([chain(1), chain(2), chain(3), chain(4), chain(5), chain(6)])
        wait_for(lambda: scored(service, 2, 7))
        # Malformed frames in between are counted and skipped (no gap: same sequence use).
        before = service.metrics()["dynamo_select_service_malformed_frames_total"]
        short.pub.send_multipart([b"", b"\x01", b"junk"])
        short.message([chain(7)])
        wait_for(lambda: scored(service, 2, 8))
        assert service.metrics()["dynamo_select_service_malformed_frames_total"] == before + 1
    finally:
        plain.close()
        short.close()
