"""Request-plane payloads as the reference (ai-dynamo-runtime 1.6.1) carries them: MessagePack.

Observed black-box on the reference (worker and caller in separate processes, ``file``
discovery, ``tcp`` request plane; see each test's docstring), then checked here on both of
our request planes (``tcp``, and ``nats`` with a real nats-server).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from runtime_util import collect, local_runtime, unique_ns


@pytest.fixture(params=["tcp", "nats"])
def plane(request, monkeypatch, tmp_path) -> str:
    """The request plane; discovery is ``file`` in a temp dir (so entries can be read)."""
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path / "kv"))
    if request.param == "nats":
        monkeypatch.setenv("NATS_SERVER", request.getfixturevalue("nats_server").url)
    return request.param


def _discovery_entries(tmp_path) -> list[dict]:
    out = []
    for f in (tmp_path / "kv").rglob("*"):
        if f.is_file():
            try:
                out.append(json.loads(f.read_text()))
            except (ValueError, UnicodeDecodeError):
                continue
    return out


async def test_python_types_survive_the_request_plane(plane, tmp_path) -> None:
    """Item 1. Reference: ``bytes`` arrive as ``bytes`` both ways (a top-level ``b"raw"``
    too), ``True`` stays ``bool``, ``-5`` an int, a tuple arrives as a list, ``None``
    survives in dicts and lists, dict keys keep their type (``{1: .., 2.5: .., b"k": ..}``),
    a set arrives as a list; its instances advertise ``request_plane_codec: msgpack``. Ours
    before the change: ``TypeError: Object of type bytes is not JSON serializable``."""
    payload = {
        "b": b"\x00\xffab",
        "t": True,
        "f": False,
        "n": -5,
        "big": 2**64 - 1,
        "small": -(2**63),
        "x": 1.5,
        "tup": (1, (2, "a")),
        "none": None,
        "l": [None, 1.5, b""],
        1: "int key",
        2.5: "float key",
        b"k": "bytes key",
        "s": {7},
        "text": "é" * 40,
    }
    expected = {**payload, "tup": [1, [2, "a"]], "s": [7]}
    seen = []
    async with local_runtime("file", plane) as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")

        async def handler(request):
            seen.append(request)
            yield request
            yield b"raw"
            yield [True, None, -1]

        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        items = await collect(await client.round_robin(payload, annotated=False))
        assert seen == [expected]
        assert items == [expected, b"raw", [True, None, -1]]
        got = items[0]
        assert type(got["b"]) is bytes and type(got["t"]) is bool and type(got["n"]) is int
        assert type(got["l"][2]) is bytes and type(items[1]) is bytes
        # Annotated mode carries the same data.
        annotated = await collect(await client.round_robin(b"\x01", annotated=True))
        assert [a.data() for a in annotated] == [b"\x01", b"raw", [True, None, -1]]
        entries = [e for e in _discovery_entries(tmp_path) if "transport" in e]
        assert entries and all(e["request_plane_codec"] == "msgpack" for e in entries)


async def test_wide_integers_follow_the_reference(plane) -> None:
    """Item 2. Reference: a request with ``2**70`` raises (a plain ``Exception``) "invalid
    type: integer `1180591620717411303424` as u128, expected any valid MessagePack value"
    (``as i128`` for ``-2**70``), one with ``2**130`` raises ``OverflowError: Python int too
    large to convert to C long``; a handler yielding ``2**70`` (or ``-2**70``) delivers the
    16 big-endian bytes of the 128-bit integer as ``bytes``, one yielding ``2**130`` ends the
    stream with ``ValueError('Internal: critical error: failed serializing Python response
    as msgpack: OverflowError: Python int too large to convert to C long')``. Ours raises
    ``ValueError`` (an ``Exception``) where the reference raises a bare ``Exception``."""
    async with local_runtime("mem", plane) as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")

        async def handler(request):
            yield request["v"]

        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        with pytest.raises(ValueError, match=r"integer `1180591620717411303424` as u128"):
            await client.round_robin({"v": 2**70})
        with pytest.raises(ValueError, match=r"integer `-1180591620717411303424` as i128"):
            await client.round_robin({"v": -(2**70)})
        with pytest.raises(OverflowError, match="Python int too large to convert to C long"):
            await client.round_robin({"v": 2**130})

        async def wide(value):
            return await collect(await client.round_robin({"w": value}, annotated=False))

        async def widening(request):
            yield 2**130 if request["w"] is None else request["w"] * 2**64

        ep2 = rt.endpoint(f"{unique_ns()}.backend.generate")
        rt.serve(ep2, widening)
        client = await ep2.client()
        await client.wait_for_instances()
        assert await wide(64) == [(2**70).to_bytes(16, "big")]
        assert await wide(-64) == [(-(2**70)).to_bytes(16, "big", signed=True)]
        with pytest.raises(ValueError) as info:
            await wide(None)
        assert str(info.value) == (
            "Internal: critical error: failed serializing Python response as msgpack: "
            "OverflowError: Python int too large to convert to C long"
        )


async def test_unserialisable_item_fails_the_stream_and_the_worker_carries_on(plane) -> None:
    """Item 3. Reference: a handler yielding ``object()`` ends the caller's iteration with
    ``ValueError('Internal: critical error: failed serializing Python response as msgpack:
    unsupported type object')``, after the items before it; the next request succeeds."""
    closed = []
    async with local_runtime("mem", plane) as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")

        async def handler(request):
            try:
                yield {"i": 0}
                if request.get("bad"):
                    yield object()
                yield {"i": 1}
            finally:
                closed.append(request.get("bad", False))

        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        stream = await client.round_robin({"bad": True}, annotated=False)
        assert await stream.__anext__() == {"i": 0}
        with pytest.raises(ValueError) as info:
            await stream.__anext__()
        assert "failed serializing Python response" in str(info.value)
        assert str(info.value).endswith("unsupported type object")
        assert await collect(await client.round_robin({}, annotated=False)) == [
            {"i": 0},
            {"i": 1},
        ]
        assert closed == [True, False]


async def test_push_mode_handlers_keep_the_same_types(plane) -> None:
    """Item 4. Reference: a handler declaring ``response_sender`` is called with a sender
    (``send(item)``, ``close()``) instead of yielding; its items travel with the same codec,
    so every exact-type case of items 1-2 holds, and one that yields instead fails with
    "critical error: push-mode handler yielded a response instead of pushing it to its
    response_sender"."""
    async with local_runtime("mem", plane) as rt:
        ep = rt.endpoint(f"{unique_ns()}.backend.generate")

        async def handler(request, context, response_sender=None):
            assert response_sender is not None and not context.is_stopped()
            if request.get("yield"):
                yield "not allowed"
                return
            response_sender.send(request["payload"])
            response_sender.send(b"raw")
            response_sender.send(request["w"] * 2**64)
            if request.get("bad"):
                response_sender.send(object())
            response_sender.close()

        rt.serve(ep, handler)
        client = await ep.client()
        await client.wait_for_instances()
        payload = {"b": b"\x00", "t": True, "n": -5, "tup": (1, 2), "d": {"k": None}, 3: [None]}
        items = await collect(
            await client.round_robin({"payload": payload, "w": -64}, annotated=False)
        )
        assert items == [
            {"b": b"\x00", "t": True, "n": -5, "tup": [1, 2], "d": {"k": None}, 3: [None]},
            b"raw",
            (-(2**70)).to_bytes(16, "big", signed=True),
        ]
        assert type(items[0]["t"]) is bool
        with pytest.raises(ValueError, match="failed serializing Python response"):
            await collect(await client.round_robin({"payload": 1, "w": 1, "bad": True}))
        with pytest.raises(ValueError, match="push-mode handler yielded a response"):
            await collect(await client.round_robin({"yield": True}))
        # A coroutine handler (no yield at all) works too, and returning closes the stream.

        async def coroutine_handler(request, response_sender):
            for i in range(3):
                response_sender.send((i, b"x"))
            # From another thread too.
            await asyncio.to_thread(response_sender.send, {b"t": True})

        ep2 = rt.endpoint(f"{unique_ns()}.backend.generate")
        rt.serve(ep2, coroutine_handler)
        c2 = await ep2.client()
        await c2.wait_for_instances()
        assert await collect(await c2.round_robin({}, annotated=False)) == [
            [0, b"x"],
            [1, b"x"],
            [2, b"x"],
            {b"t": True},
        ]
