"""compute_block_hash_for_seq: bit-exact against the reference, properties, bad input."""

from __future__ import annotations

import hashlib
import json
import struct
from array import array
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamo._core import compute_block_hash_for_seq as block_hashes

U32 = st.integers(min_value=0, max_value=2**32 - 1)
TOKENS = st.lists(U32, max_size=200)
BLOCK_SIZE = st.integers(min_value=1, max_value=40)


def lcg_tokens(seed: int, n: int, vocab: int = 152_064) -> list[int]:
    # Same generator as tests/data/generate_block_hash_vectors.py.
    out, x = [], seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 33) % vocab)
    return out


def load_vectors(data_dir: Path) -> dict:
    return json.loads((data_dir / "block_hash_vectors.json").read_text())


VECTORS = load_vectors(Path(__file__).resolve().parent / "data")


@pytest.mark.parametrize("case", VECTORS["vectors"], ids=lambda c: c["name"])
def test_matches_reference_vectors(case: dict) -> None:
    spec = case["tokens"]
    tokens = lcg_tokens(spec["seed"], spec["n"]) if isinstance(spec, dict) else spec
    got = block_hashes(tokens, case["kv_block_size"], **case["options"])
    assert len(got) == case["count"]
    if "expected" in case:
        assert got == case["expected"]
    else:
        assert got[:8] == case["expected_head"]
        packed = b"".join(struct.pack("<Q", v) for v in got)
        assert hashlib.sha256(packed).hexdigest() == case["expected_sha256"]


@pytest.mark.parametrize("case", VECTORS["errors"], ids=lambda c: c["name"])
def test_bad_input_raises_the_reference_error_class(case: dict) -> None:
    expected = {"ValueError": ValueError, "OverflowError": OverflowError, "TypeError": TypeError}
    with pytest.raises(expected[case["error"]]):
        block_hashes(case["tokens"], case["kv_block_size"])


def test_zero_block_size_message() -> None:
    with pytest.raises(ValueError, match=r"^kv_block_size cannot be 0$"):
        block_hashes([1, 2, 3], 0)


def test_vectors_cover_every_option_and_long_prompts() -> None:
    options = set()
    sizes = set()
    longest = 0
    for case in VECTORS["vectors"]:
        options.update(k for k, v in case["options"].items() if v not in (None, "", False))
        sizes.add(case["kv_block_size"])
        spec = case["tokens"]
        longest = max(longest, spec["n"] if isinstance(spec, dict) else len(spec))
    assert options == {"lora_name", "cache_namespace", "is_eagle", "block_mm_infos"}
    assert {1, 16, 32, 64, 512} <= sizes
    assert longest >= 100_000


@pytest.mark.parametrize(
    "make",
    [tuple, lambda t: array("I", t), lambda t: np.array(t, dtype=np.int64), bytes],
    ids=["tuple", "array", "numpy", "bytes"],
)
def test_other_int_sequences_hash_like_lists(make) -> None:
    tokens = [(i * 7) % 256 for i in range(100)]
    assert block_hashes(make(tokens), 16) == block_hashes(tokens, 16)


def test_bool_tokens_are_ints() -> None:
    assert block_hashes([True, False], 2) == block_hashes([1, 0], 2)


@pytest.mark.parametrize("bad", ["abc", 5, None, iter([1, 2])], ids=repr)
def test_non_sequences_are_type_errors(bad) -> None:
    with pytest.raises(TypeError):
        block_hashes(bad, 2)


@pytest.mark.parametrize(
    ("infos", "field"),
    [
        ([{"mmobjects": []}], r"block_mm_infos\[0\]: missing field 'mm_objects'"),
        ([5], r"block_mm_infos\[0\]: expected a dict"),
        ("nope", r"block_mm_infos: expected a list"),
        ([None, {"mm_objects": 3}], r"block_mm_infos\[1\]\.mm_objects: expected a list"),
        ([{"mm_objects": [{"offsets": []}]}], r"mm_objects\[0\]: missing field 'mm_hash'"),
        ([{"mm_objects": [{"mm_hash": "x"}]}], r"mm_objects\[0\]\.mm_hash"),
        ([{"mm_objects": [{"mm_hash": -1}]}], r"mm_objects\[0\]\.mm_hash"),
        ([{"mm_objects": [{"mm_hash": 1, "offsets": [[1]]}]}], r"offsets\[0\]"),
    ],
)
def test_malformed_mm_infos_name_the_field(infos, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        block_hashes([1, 2, 3, 4], 2, infos)


def test_mm_offsets_may_be_omitted() -> None:
    with_offsets = block_hashes([1, 2], 2, [{"mm_objects": [{"mm_hash": 5, "offsets": []}]}])
    assert block_hashes([1, 2], 2, [{"mm_objects": [{"mm_hash": 5}]}]) == with_offsets


def test_long_prompt_hashes_from_another_thread() -> None:
    # Hashing long prompts releases the GIL; it must give the same answer from any thread.
    import threading

    tokens = lcg_tokens(1, 200_000)
    expected = block_hashes(tokens, 16)
    results: list[list[int]] = []
    threads = [
        threading.Thread(target=lambda: results.append(block_hashes(tokens, 16))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------


@given(TOKENS, BLOCK_SIZE)
def test_deterministic(tokens: list[int], bs: int) -> None:
    assert block_hashes(tokens, bs) == block_hashes(list(tokens), bs)


@given(TOKENS, BLOCK_SIZE, st.booleans())
def test_length_formula(tokens: list[int], bs: int, eagle: bool) -> None:
    n = len(tokens)
    expected = max(n - 1, 0) // bs if eagle else n // bs
    assert len(block_hashes(tokens, bs, is_eagle=eagle)) == expected


@given(TOKENS, st.integers(min_value=0, max_value=200), BLOCK_SIZE, st.booleans())
def test_prefix_stability(tokens: list[int], cut: int, bs: int, eagle: bool) -> None:
    full = block_hashes(tokens, bs, is_eagle=eagle)
    prefix = block_hashes(tokens[:cut], bs, is_eagle=eagle)
    assert full[: len(prefix)] == prefix


@given(TOKENS.filter(lambda t: len(t) >= 2), BLOCK_SIZE, st.text(min_size=1, max_size=20))
@settings(max_examples=200)
def test_every_option_changes_hashes(tokens: list[int], bs: int, name: str) -> None:
    bs = min(bs, len(tokens) - 1)  # at least one block, also in eagle mode
    plain = block_hashes(tokens, bs)
    assert block_hashes(tokens, bs, lora_name=name) != plain
    assert block_hashes(tokens, bs, cache_namespace=name) != plain
    assert block_hashes(tokens, bs, lora_name=name) != block_hashes(
        tokens, bs, cache_namespace=name
    )
    mm = [{"mm_objects": [{"mm_hash": 1, "offsets": [[0, 1]]}]}]
    assert block_hashes(tokens, bs, mm)[0] != plain[0]
    eagle = block_hashes(tokens, bs, is_eagle=True)
    assert eagle[0] != plain[0]
    # Empty strings and None entries mean "no option".
    assert block_hashes(tokens, bs, [None], lora_name="", cache_namespace="") == plain


@given(st.lists(U32, min_size=1, max_size=64), BLOCK_SIZE)
def test_changing_one_token_changes_its_block(tokens: list[int], bs: int) -> None:
    hashes = block_hashes(tokens, bs)
    i = len(tokens) // 2
    mutated = list(tokens)
    mutated[i] = (mutated[i] + 1) % 2**32
    other = block_hashes(mutated, bs)
    for b, (x, y) in enumerate(zip(hashes, other, strict=True)):
        assert (x != y) == (b * bs <= i < (b + 1) * bs)
