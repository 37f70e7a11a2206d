"""Generate `block_hash_vectors.json` from the reference wheel (run once, result committed).

    /path/to/reference-venv/bin/python tests/data/generate_block_hash_vectors.py

Must run under an interpreter that has ``ai-dynamo-runtime==1.6.1`` installed (see
``benches/setup_reference.sh``); this project never imports that package itself. Token
lists are described by a seeded generator (``tokens.lcg``) instead of being stored, and long
outputs are stored as a SHA-256 digest of their little-endian u64 bytes, which keeps the
file small while still pinning every value. `tests/test_hashing.py` and the Rust test
`crates/dynamo-kv-router/tests/reference_vectors.rs` regenerate the inputs the same way.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

#: Outputs longer than this are stored as a digest plus their first values.
MAX_INLINE = 64
VOCAB = 152_064


def lcg_tokens(seed: int, n: int, vocab: int = VOCAB) -> list[int]:
    """Deterministic token ids: a 64-bit LCG, high bits reduced modulo the vocabulary."""
    out = []
    x = seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 33) % vocab)
    return out


def digest(values: list[int]) -> str:
    return hashlib.sha256(b"".join(struct.pack("<Q", v) for v in values)).hexdigest()


def expand(tokens_spec) -> list[int]:
    if isinstance(tokens_spec, list):
        return tokens_spec
    return lcg_tokens(tokens_spec["seed"], tokens_spec["n"], tokens_spec.get("vocab", VOCAB))


def mm(*hashes: int, offsets=((0, 1),)) -> dict:
    return {"mm_objects": [{"mm_hash": h, "offsets": [list(o) for o in offsets]} for h in hashes]}


def cases() -> list[dict]:
    out: list[dict] = []

    def add(name, tokens, bs, **opts):
        out.append({"name": name, "tokens": tokens, "kv_block_size": bs, "options": opts})

    # Plain blocks over block sizes and lengths, including partial tails and empty input.
    for bs in (1, 16, 32, 64, 512):
        for n in (0, bs - 1, bs, bs + 1, 1000, 4096):
            if n >= 0:
                add(f"plain bs={bs} n={n}", {"lcg": True, "seed": bs * 1000 + n, "n": n}, bs)
    for bs in (1, 16, 32, 64, 512):
        add(f"long bs={bs} n=100000", {"lcg": True, "seed": 42, "n": 100_000}, bs)
    add("long bs=16 n=131072", {"lcg": True, "seed": 7, "n": 131_072}, 16)
    add("extreme token ids", [0, 4294967295, 1, 4294967294] * 8, 4)
    add("range 0..8 bs=4", list(range(8)), 4)

    # LoRA and cache namespace seeds; empty strings count as absent.
    base = {"lcg": True, "seed": 5, "n": 1000}
    for lora in ("adapter-a", "", "ünïcødé-lora", "x" * 300):
        add(f"lora={lora[:20]!r}", base, 16, lora_name=lora)
    for ns in ("tenant-a", "", "tenant-b"):
        add(f"namespace={ns!r}", base, 16, cache_namespace=ns)
    add("lora+namespace", base, 16, lora_name="adapter-a", cache_namespace="tenant-a")
    add("same string as lora vs namespace", base, 16, lora_name="same")
    add("same string as namespace vs lora", base, 16, cache_namespace="same")
    add("lora long bs=32", {"lcg": True, "seed": 9, "n": 100_000}, 32, lora_name="adapter-a")

    # Eagle windows.
    for bs in (1, 2, 16, 64):
        for n in (0, 1, bs, bs + 1, 2 * bs + 1, 1000):
            add(f"eagle bs={bs} n={n}", {"lcg": True, "seed": 77 + n, "n": n}, bs, is_eagle=True)
    add("eagle False", base, 16, is_eagle=False)
    add("eagle+lora+namespace", base, 16, is_eagle=True, lora_name="a", cache_namespace="b")
    add("eagle long", {"lcg": True, "seed": 3, "n": 100_000}, 16, is_eagle=True)

    # Multimodal blocks.
    mm_tokens = {"lcg": True, "seed": 11, "n": 64}
    add("mm one object", mm_tokens, 16, block_mm_infos=[mm(0xDEADBEEF)])
    add(
        "mm [100]*32 known vector",
        [100] * 32,
        32,
        block_mm_infos=[mm(0xDEADBEEF, offsets=[(0, 32)])],
    )
    add("mm unsorted objects", mm_tokens, 16, block_mm_infos=[None, mm(9, 3, 7)])
    add("mm sorted objects", mm_tokens, 16, block_mm_infos=[None, mm(3, 7, 9)])
    add(
        "mm other offsets",
        mm_tokens,
        16,
        block_mm_infos=[mm(0xDEADBEEF, offsets=[(3, 9), (10, 12)])],
    )
    add("mm empty objects", mm_tokens, 16, block_mm_infos=[{"mm_objects": []}])
    add("mm None entries", mm_tokens, 16, block_mm_infos=[None, None, None, None])
    add("mm shorter than blocks", mm_tokens, 16, block_mm_infos=[mm(1)])
    add("mm longer than blocks", mm_tokens, 16, block_mm_infos=[None] * 4 + [mm(1), mm(2)])
    add("mm max u64", mm_tokens, 16, block_mm_infos=[mm(2**64 - 1, 0)])
    add("mm duplicate hashes", mm_tokens, 16, block_mm_infos=[mm(5, 5)])
    add("mm + lora", mm_tokens, 16, block_mm_infos=[mm(1), None, mm(2)], lora_name="adapter-a")
    add("mm + eagle", mm_tokens, 16, block_mm_infos=[None, mm(4)], is_eagle=True)
    add("mm + namespace", mm_tokens, 16, block_mm_infos=[mm(8)], cache_namespace="tenant-a")
    return out


def errors() -> list[dict]:
    return [
        {"name": "block size 0", "tokens": [1, 2, 3], "kv_block_size": 0},
        {"name": "negative block size", "tokens": [1, 2, 3], "kv_block_size": -1},
        {"name": "negative token", "tokens": [-1, 2], "kv_block_size": 2},
        {"name": "token above u32", "tokens": [2**32, 2], "kv_block_size": 2},
        {"name": "token above u64", "tokens": [2**64, 2], "kv_block_size": 2},
        {"name": "str token", "tokens": ["a", 2], "kv_block_size": 2},
        {"name": "float token", "tokens": [1.0, 2], "kv_block_size": 2},
    ]


def main() -> None:
    from dynamo._core import __version__, compute_block_hash_for_seq

    vectors = []
    for case in cases():
        spec = case["tokens"]
        tokens = lcg_tokens(spec["seed"], spec["n"]) if isinstance(spec, dict) else spec
        got = compute_block_hash_for_seq(tokens, case["kv_block_size"], **case["options"])
        entry = dict(case)
        entry["count"] = len(got)
        if len(got) <= MAX_INLINE:
            entry["expected"] = got
        else:
            entry["expected_head"] = got[:8]
            entry["expected_sha256"] = digest(got)
        vectors.append(entry)
    errs = []
    for case in errors():
        try:
            compute_block_hash_for_seq(case["tokens"], case["kv_block_size"])
        except Exception as e:  # recording the reference error class
            errs.append({**case, "error": type(e).__name__})
        else:
            raise SystemExit(f"reference accepted {case['name']}")
    doc = {
        "generator": "tests/data/generate_block_hash_vectors.py",
        "reference": f"ai-dynamo-runtime {__version__}",
        "token_generator": "lcg: x = x*6364136223846793005 + 1442695040888963407 mod 2^64; "
        f"token = (x >> 33) % {VOCAB}",
        "vectors": vectors,
        "errors": errs,
    }
    path = Path(__file__).with_name("block_hash_vectors.json")
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(vectors)} vectors and {len(errs)} error cases to {path}")


if __name__ == "__main__":
    main()
