"""RadixTree / OverlapScores: behaviour, a model-based property test, threads, dump+replay."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo.llm import OverlapScores, RadixTree, compute_block_hash_for_seq


def stored(
    parent: int | None, blocks: list[tuple[int, int]], dp_rank: int | None = None, event_id: int = 1
) -> bytes:
    ev: dict = {
        "event_id": event_id,
        "data": {
            "stored": {
                "parent_hash": parent,
                "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks],
            }
        },
    }
    if dp_rank is not None:
        ev["dp_rank"] = dp_rank
    return json.dumps(ev).encode()


def removed(hashes: list[int], dp_rank: int = 0) -> bytes:
    return json.dumps(
        {"event_id": 1, "data": {"removed": {"block_hashes": hashes}}, "dp_rank": dp_rank}
    ).encode()


def cleared(dp_rank: int = 0) -> bytes:
    return json.dumps({"event_id": 1, "data": "cleared", "dp_rank": dp_rank}).encode()


# ----- basic behaviour ----------------------------------------------------------------


def test_minimal_event_scores_one_block() -> None:
    tree = RadixTree()
    tree.apply_event(
        0,
        b'{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":0,"tokens_hash":0}]}}}',
    )
    scores = tree.find_matches([0])
    assert isinstance(scores, OverlapScores)
    assert scores.scores == {(0, 0): 1}
    assert scores.frequencies == []
    dump = tree.dump_tree_as_events()
    assert len(dump) == 1
    event = json.loads(dump[0])
    assert event["worker_id"] == 0 and event["storage_tier"] == "device"
    assert event["event"]["data"]["stored"]["blocks"] == [{"block_hash": 0, "tokens_hash": 0}]
    tree.remove_worker(0)
    assert tree.dump_tree_as_events() == []
    assert tree.find_matches([0]).scores == {}


def test_scores_are_prefix_depths_keyed_by_worker_and_rank() -> None:
    tree = RadixTree()
    tree.apply_event(1, stored(None, [(10, 100), (11, 101), (12, 102)]))
    tree.apply_event(2, stored(None, [(10, 100), (11, 101)], dp_rank=3))
    tree.apply_event(3, stored(None, [(30, 101)]))
    assert tree.find_matches([100, 101, 102, 103]).scores == {(1, 0): 3, (2, 3): 2}
    assert tree.find_matches([101]).scores == {(3, 0): 1}
    assert tree.find_matches([]).scores == {}
    # One node per distinct prefix, whoever stores it.
    assert tree.node_count() == 4
    assert len(tree) == 6


def test_early_exit_stops_once_a_single_worker_remains() -> None:
    tree = RadixTree()
    tree.apply_event(0, stored(None, [(1, 100), (2, 101), (3, 102), (4, 103)]))
    tree.apply_event(1, stored(None, [(1, 100)]))
    assert tree.find_matches([100, 101, 102, 103]).scores == {(0, 0): 4, (1, 0): 1}
    early = tree.find_matches([100, 101, 102, 103], early_exit=True).scores
    assert early == {(0, 0): 2, (1, 0): 1}
    assert max(early, key=early.__getitem__) == (0, 0)


def test_with_hashes_from_compute_block_hash_for_seq() -> None:
    tokens = list(range(64))
    local = compute_block_hash_for_seq(tokens, 16)
    tree = RadixTree()
    tree.apply_event(5, stored(None, [(1000 + i, h) for i, h in enumerate(local)]))
    assert tree.find_matches(local).scores == {(5, 0): 4}
    assert tree.find_matches(compute_block_hash_for_seq(tokens[:32] + [7] * 32, 16)).scores == {
        (5, 0): 2
    }


def test_u64_extremes_round_trip() -> None:
    tree = RadixTree()
    top = 2**64 - 1
    tree.apply_event(top, stored(None, [(top, top - 1)], dp_rank=2**32 - 1))
    assert tree.find_matches([top - 1]).scores == {(top, 2**32 - 1): 1}
    (line,) = tree.dump_tree_as_events()
    assert json.loads(line)["worker_id"] == top


# ----- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"", "EOF while parsing"),
        (b"\xff\xfe", "expected value"),
        (b'{"event_id":1,"data":"foo"}', "unknown variant `foo`"),
        (b'{"event_id":1}', "missing field `data`"),
        (b'{"event_id":1,"data":{"removed":{"block_hashes":[-5]}}}', "expected u64"),
        (
            b'{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1}]}}}',
            "missing field `tokens_hash`",
        ),
        (b'{"event_id":1,"data":"cleared","dp_rank":4294967296}', "expected u32"),
    ],
)
def test_malformed_bytes_raise_value_error_and_change_nothing(payload: bytes, needle: str) -> None:
    tree = RadixTree()
    tree.apply_event(0, stored(None, [(1, 100)]))
    with pytest.raises(ValueError, match=r"^Failed to deserialize KvCacheEvent: ") as info:
        tree.apply_event(0, payload)
    assert needle in str(info.value)
    assert tree.find_matches([100]).scores == {(0, 0): 1}


def test_unknown_parent_is_rejected_with_runtime_error_and_tree_unchanged() -> None:
    tree = RadixTree()
    tree.apply_event(0, stored(None, [(1, 100), (2, 101)]))
    before = (tree.dump_tree_as_events(), tree.node_count(), len(tree))
    with pytest.raises(RuntimeError, match=r"^Failed to apply event: Failed to find parent block$"):
        tree.apply_event(0, stored(99, [(3, 102)]))
    # Another worker's block is not a parent for this worker.
    with pytest.raises(RuntimeError):
        tree.apply_event(1, stored(2, [(3, 102)]))
    with pytest.raises(RuntimeError, match="Invalid block sequence"):
        tree.apply_event(0, stored(2, [(2, 102)]))
    assert (tree.dump_tree_as_events(), tree.node_count(), len(tree)) == before


def test_unknown_removal_is_reported_after_removing_known_hashes() -> None:
    tree = RadixTree()
    tree.apply_event(0, stored(None, [(1, 100), (2, 101), (3, 102)]))
    with pytest.raises(RuntimeError, match="Failed to find block"):
        tree.apply_event(0, removed([3, 999, 2]))
    assert tree.find_matches([100, 101, 102]).scores == {(0, 0): 1}
    assert len(tree) == 1


def test_argument_errors() -> None:
    tree = RadixTree()
    with pytest.raises(OverflowError):
        tree.find_matches([-1])
    with pytest.raises(OverflowError):
        tree.find_matches([2**64])
    with pytest.raises(TypeError):
        tree.find_matches("ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tree.apply_event(0, '{"event_id":1,"data":"cleared"}')  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        tree.apply_event(-1, cleared())
    with pytest.raises(ValueError, match="expiration_duration_secs"):
        RadixTree(expiration_duration_secs=-1.0)


# ----- lifecycle ----------------------------------------------------------------------


def test_cleared_drops_one_rank_and_remove_worker_all_ranks() -> None:
    tree = RadixTree()
    for dp in (0, 1):
        tree.apply_event(0, stored(None, [(1, 100)], dp_rank=dp))
    tree.apply_event(1, stored(None, [(1, 100)]))
    tree.apply_event(0, cleared(dp_rank=1))
    assert tree.find_matches([100]).scores == {(0, 0): 1, (1, 0): 1}
    tree.apply_event(0, stored(None, [(1, 100)], dp_rank=1))
    tree.clear_all_blocks(0)
    assert tree.find_matches([100]).scores == {(1, 0): 1}
    tree.apply_event(0, stored(None, [(1, 100)], dp_rank=4))
    tree.remove_worker(0)
    tree.remove_worker(12345)  # unknown: no-op
    assert tree.find_matches([100]).scores == {(1, 0): 1}


def test_frequencies_with_expiration_window() -> None:
    tree = RadixTree(expiration_duration_secs=60.0)
    tree.apply_event(0, stored(None, [(1, 100), (2, 101)]))
    assert tree.find_matches([100, 101]).frequencies == []
    assert tree.find_matches([100, 101]).frequencies == [1, 1]
    assert tree.find_matches([100]).frequencies == [2]
    assert tree.find_matches([100, 101]).frequencies == [3, 2]


def test_removing_everything_returns_to_an_empty_tree() -> None:
    tree = RadixTree()
    for w in range(8):
        for s in range(40):
            blocks = [(w << 32 | s << 8 | i, i if i < 8 else s << 8 | i) for i in range(16)]
            tree.apply_event(w, stored(None, blocks))
    assert tree.node_count() == 8 + 40 * 8
    for w in range(8):
        for s in range(40):
            tree.apply_event(w, removed([w << 32 | s << 8 | i for i in reversed(range(16))]))
    assert (tree.node_count(), len(tree), tree.dump_tree_as_events()) == (0, 0, [])


# ----- model-based property test --------------------------------------------------------


class Model:
    """Naive reference: per (worker, dp_rank), external hash -> path of local hashes."""

    def __init__(self) -> None:
        self.ranks: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}

    def apply(self, worker: int, ev: dict) -> str | None:
        key = (worker, ev.get("dp_rank", 0))
        data = ev["data"]
        rank = self.ranks.setdefault(key, {})
        if data == "cleared":
            rank.clear()
            return None
        if "stored" in data:
            s = data["stored"]
            parent = s["parent_hash"]
            path: tuple[int, ...] = ()
            if parent is not None:
                if any(b["block_hash"] == parent for b in s["blocks"]) or parent not in rank:
                    return "RuntimeError"
                path = rank[parent]
            for b in s["blocks"]:
                path = (*path, b["tokens_hash"])
                rank[b["block_hash"]] = path
            return None
        missing = [h for h in data["removed"]["block_hashes"] if rank.pop(h, None) is None]
        return "RuntimeError" if missing else None

    def remove_worker(self, worker: int) -> None:
        for key in [k for k in self.ranks if k[0] == worker]:
            del self.ranks[key]

    def scores(self, query: list[int]) -> dict[tuple[int, int], int]:
        out = {}
        for key, rank in self.ranks.items():
            paths = set(rank.values())
            k = 0
            while k < len(query) and tuple(query[: k + 1]) in paths:
                k += 1
            if k:
                out[key] = k
        return out


hashes = st.integers(0, 15)
locals_ = st.integers(0, 3)
stored_ev = st.builds(
    lambda p, blocks: {
        "stored": {
            "parent_hash": p,
            "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks],
        }
    },
    st.none() | hashes,
    st.lists(st.tuples(hashes, locals_), max_size=4),
)
removed_ev = st.builds(lambda hs: {"removed": {"block_hashes": hs}}, st.lists(hashes, max_size=3))
event = st.fixed_dictionaries(
    {
        "event_id": st.just(1),
        "data": st.one_of(stored_ev, stored_ev, removed_ev, st.just("cleared")),
        "dp_rank": st.sampled_from([0, 0, 1]),
    }
)
operation = st.one_of(
    st.tuples(st.just("event"), st.integers(0, 3), event),
    st.tuples(st.just("remove_worker"), st.integers(0, 3), st.none()),
    st.tuples(st.just("clear_all_blocks"), st.integers(0, 3), st.none()),
    st.tuples(st.just("query"), st.lists(locals_, max_size=5), st.none()),
)
ALL_QUERIES = [
    [a, b, c][:n] for a in range(4) for b in range(4) for c in range(4) for n in (1, 2, 3)
]


@settings(max_examples=150, deadline=None)
@given(st.lists(operation, max_size=60))
def test_tree_agrees_with_naive_model(ops: list) -> None:
    tree, model = RadixTree(), Model()
    for kind, arg, ev in ops:
        if kind == "event":
            want = model.apply(arg, ev)
            got = None
            try:
                tree.apply_event(arg, json.dumps(ev).encode())
            except RuntimeError:
                got = "RuntimeError"
            assert got == want, ev
            if want is None and "stored" in ev["data"]:
                # Applying a successful store twice changes nothing.
                dump = sorted(tree.dump_tree_as_events())
                tree.apply_event(arg, json.dumps(ev).encode())
                assert sorted(tree.dump_tree_as_events()) == dump
        elif kind == "query":
            assert tree.find_matches(arg).scores == model.scores(arg)
        else:
            getattr(tree, kind)(arg)
            model.remove_worker(arg)
    # Dump + replay reproduces every score.
    replay = RadixTree()
    for line in tree.dump_tree_as_events():
        ev = json.loads(line)
        replay.apply_event(ev["worker_id"], json.dumps(ev["event"]).encode())
    for q in ALL_QUERIES:
        want = model.scores(q)
        assert tree.find_matches(q).scores == want
        assert replay.find_matches(q).scores == want
    for w in range(4):
        tree.remove_worker(w)
    assert (tree.node_count(), len(tree)) == (0, 0)


# ----- threads ----------------------------------------------------------------------------


def dump_set(tree: RadixTree) -> list[str]:
    """The dump without its synthetic event ids (they follow worker registration order)."""
    out = []
    for line in tree.dump_tree_as_events():
        ev = json.loads(line)
        del ev["event"]["event_id"]
        out.append(json.dumps(ev, sort_keys=True))
    return sorted(out)


def chain_events(worker: int, n_chains: int, depth: int) -> list[bytes]:
    """A worker's stores (shared 4-block prefix, then distinct) and then removal of half."""
    events = []
    for c in range(n_chains):
        blocks = [(worker << 40 | c << 16 | i, i if i < 4 else (c << 16 | i)) for i in range(depth)]
        events.append(stored(None, blocks))
    for c in range(0, n_chains, 2):
        events.append(removed([worker << 40 | c << 16 | i for i in reversed(range(depth))]))
    return events


@pytest.mark.parametrize("threads", [2, 5, 16])
def test_concurrent_apply_and_query_equals_sequential(threads: int) -> None:
    per_worker = {w: chain_events(w, 30, 12) for w in range(threads)}
    tree = RadixTree()
    errors: list[BaseException] = []
    stop = threading.Event()
    barrier = threading.Barrier(threads + 2)

    def writer(w: int) -> None:
        try:
            barrier.wait()
            for ev in per_worker[w]:
                tree.apply_event(w, ev)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader() -> None:
        try:
            barrier.wait()
            while not stop.is_set():
                scores = tree.find_matches([0, 1, 2, 3, 4]).scores
                # Every worker only ever holds whole chains: depth 4 or more, never partial.
                assert all(v >= 4 for v in scores.values()), scores
                tree.dump_tree_as_events()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    pool = [threading.Thread(target=writer, args=(w,)) for w in range(threads)]
    pool += [threading.Thread(target=reader) for _ in range(2)]
    for t in pool:
        t.start()
    for t in pool[:threads]:
        t.join()
    stop.set()
    for t in pool[threads:]:
        t.join()
    assert not errors, errors

    sequential = RadixTree()
    for w in range(threads):
        for ev in per_worker[w]:
            sequential.apply_event(w, ev)
    assert dump_set(tree) == dump_set(sequential)
    for c in range(30):
        q = [i if i < 4 else (c << 16 | i) for i in range(12)]
        assert tree.find_matches(q).scores == sequential.find_matches(q).scores
    # 15 chains of 12 blocks left per worker; every worker stores the same contents, so the
    # tree holds each block once.
    assert len(tree) == threads * 15 * 12
    assert tree.node_count() == 4 + 15 * 8


def test_remove_worker_races_with_applies_of_other_workers() -> None:
    tree = RadixTree()
    for ev in chain_events(99, 10, 8):
        tree.apply_event(99, ev)

    def churn(w: int) -> None:
        for ev in chain_events(w, 20, 8):
            tree.apply_event(w, ev)
        tree.remove_worker(w)

    pool = [threading.Thread(target=churn, args=(w,)) for w in range(6)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len(tree) == 5 * 8
    tree.remove_worker(99)
    assert (len(tree), tree.node_count()) == (0, 0)


def test_long_calls_release_the_gil() -> None:
    """While one thread dumps a large tree, another Python thread keeps running."""
    tree = RadixTree()
    for w in range(4):
        for s in range(400):
            base = w << 40 | s << 16
            tree.apply_event(w, stored(None, [(base | i, base | i) for i in range(64)]))
    assert len(tree) == 4 * 400 * 64
    window: list[float] = []
    sizes: list[int] = []

    def dump() -> None:
        window.append(time.perf_counter())
        sizes.append(len(tree.dump_tree_as_events()))
        window.append(time.perf_counter())

    t = threading.Thread(target=dump)
    stamps: list[float] = []
    t.start()
    while t.is_alive():
        stamps.append(time.perf_counter())
        time.sleep(0.0005)
    t.join()
    assert sizes == [4 * 400 * 64]
    start, end = window
    # The conversion of the result to Python strings needs the GIL; the Rust part (most of
    # the call) must not hold it, so this thread gets to run during the call.
    inside = [x for x in stamps if start < x < end]
    assert end - start > 0.02, "dump too short to observe"
    assert len(inside) >= 3, (len(inside), end - start)
