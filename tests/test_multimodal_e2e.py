"""Image chats end to end through the frontend with the official ``openai`` client.

* A Python worker (``tests/workers/mm_worker.py``) gets each image decoded (shape, dtype,
  RGB bytes, ``mm_hash``) and answers with its size and hash; for a Qwen2-VL-style model
  the prompt carries the image's placeholder tokens (one marker expanded to the grid's
  token count).
* KV routing with two mocker workers (``--router-mode kv``): the same text with another
  image shares no cached blocks, the same image re-sent hits the blocks cached for it.
* ``resolve_routing_image_token_id`` on model directories of each known family.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
from mm_util import ImageServer, MmCluster, data_url, gradient, image_bytes
from openai import OpenAI
from serving_util import Procs, free_port, wait_for_instances
from tokenizers import AddedToken, Tokenizer

from dynamo.llm import resolve_routing_image_token_id
from dynamo.llm.tiny_model import write_tiny_model

QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def fake_family(
    base: Path, dest: Path, config: dict, specials: list[str], template: str | None = None
) -> dict:
    """A copy of the tiny model with ``config`` merged into its ``config.json`` and
    ``specials`` added to its tokenizer; returns the special tokens' ids."""
    shutil.copytree(base, dest)
    tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.save(str(dest / "tokenizer.json"))
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(config)
    (dest / "config.json").write_text(json.dumps(cfg))
    if template is not None:
        tc = json.loads((dest / "tokenizer_config.json").read_text())
        tc["chat_template"] = template
        (dest / "tokenizer_config.json").write_text(json.dumps(tc))
    return {s: tok.token_to_id(s) for s in specials}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def qwen(tiny, tmp_path_factory) -> tuple[Path, dict]:
    dest = tmp_path_factory.mktemp("qwen") / "qwen-vl"
    ids = fake_family(
        tiny,
        dest,
        {"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"]},
        ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"],
        QWEN_TEMPLATE,
    )
    return dest, ids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny):
    c = MmCluster(
        tmp_path_factory.mktemp("mm-e2e"),
        tiny,
        {"plain": {"fetcher": {"allow_direct_ip": True, "allow_direct_port": True}}},
    )
    yield c
    c.close()


def image_message(url: str, text: str = "What is in this image?") -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


def test_image_chat_reaches_a_python_worker(cluster):
    c = cluster
    img = gradient(48, 32, seed=7)
    png = image_bytes(img, "PNG")
    server = ImageServer({"/cat.png": ("image/png", png)})
    try:
        client = OpenAI(base_url=f"{c.base}/v1", api_key="unused")
        by_url = client.chat.completions.create(
            model="plain", messages=image_message(server.url("/cat.png")), max_tokens=200
        )
        by_data = client.chat.completions.create(
            model="plain", messages=image_message(data_url(png)), max_tokens=200
        )
    finally:
        server.close()
    want_digest = hashlib.sha256(img.tobytes()).hexdigest()[:16]
    got = by_url.choices[0].message.content
    shape, dtype, mm_hash, digest = got.split()
    assert (shape, dtype, digest) == ("32x48x3", "uint8", want_digest), got
    # The hash is of the pixels: the URL and the data URL give the same one.
    assert by_data.choices[0].message.content == got
    assert int(mm_hash) > 0
    # No placeholder family: the prompt is the text, and the image's hash rides on block 0.
    seen = c.last_request()
    assert seen["ranges"] == [None]
    infos = seen["mm_routing_info"]["block_mm_infos"]
    assert infos[0]["mm_objects"][0]["mm_hash"] == int(mm_hash)
    # A streamed request works too.
    stream = client.chat.completions.create(
        model="plain", messages=image_message(data_url(png)), max_tokens=200, stream=True
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == got


def test_qwen_style_prompt_gets_placeholder_tokens(tmp_path, qwen):
    qwen_dir, ids = qwen
    c = MmCluster(tmp_path, qwen_dir, {"qwen": {}})
    try:
        client = OpenAI(base_url=f"{c.base}/v1", api_key="unused")
        img = gradient(100, 60, seed=8)
        r = client.chat.completions.create(
            model="qwen", messages=image_message(data_url(image_bytes(img, "PNG"))), max_tokens=200
        )
        assert r.choices[0].message.content.startswith("60x100x3 uint8 ")
        seen = c.last_request()
        pad = ids["<|image_pad|>"]
        # smart_resize(60, 100) with 28-pixel cells and min_pixels 3136: 56 x 112 -> 2 x 4.
        (start, end) = seen["ranges"][0]
        assert end - start == 8
        tokens = seen["token_ids"]
        assert tokens[start:end] == [pad] * 8
        assert tokens.count(pad) == 8
        assert tokens[start - 1] == ids["<|vision_start|>"] and tokens[end] == ids["<|vision_end|>"]
        # Two images: two ranges; the answer lists both.
        two = [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": data_url(image_bytes(gradient(28, 28), "PNG"))},
                    },
                    {"type": "text", "text": "and"},
                    {"type": "image_url", "image_url": {"url": data_url(image_bytes(img, "PNG"))}},
                ],
            }
        ]
        r = client.chat.completions.create(model="qwen", messages=two, max_tokens=300)
        assert len(r.choices[0].message.content.split(";")) == 2
        ranges = c.last_request()["ranges"]
        assert ranges[0][1] - ranges[0][0] == 4  # 28 x 28 grows to 56 x 56: 2 x 2
        assert ranges[1][1] - ranges[1][0] == 8
    finally:
        c.close()


def test_kv_routing_keeps_images_apart(tmp_path, tiny):
    (tmp_path / "kv").mkdir()
    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "kv", tmp_path / "logs")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--router-mode", "kv")
        procs.mocker(tiny, "--num-workers", "2", "--enable-image", "--block-size", "16")
        wait_for_instances(base, "tiny", 2)
        client = OpenAI(base_url=f"{base}/v1", api_key="unused")
        text = " ".join(f"word{i}" for i in range(80))
        x = data_url(image_bytes(gradient(32, 32, seed=1), "PNG"))
        y = data_url(image_bytes(gradient(32, 32, seed=2), "PNG"))

        def cached(messages) -> int:
            r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
            details = r.usage.prompt_tokens_details
            return (details.cached_tokens or 0) if details else 0

        assert cached(image_message(x, text)) == 0
        # The same text and image again: its blocks are cached on the worker that served
        # it (KV events reach the router shortly after the first request).
        deadline = time.monotonic() + 10
        hit = 0
        while time.monotonic() < deadline and hit == 0:
            time.sleep(0.2)
            hit = cached(image_message(x, text))
        assert hit >= 64, hit
        # The same text with another image, or with none, shares no cached block.
        assert cached(image_message(y, text)) == 0
        assert cached([{"role": "user", "content": text}]) == 0
        # And each of those is cached in turn, apart from the others.
        time.sleep(0.5)
        assert cached(image_message(y, text)) >= 64
        assert cached(image_message(x, text)) >= 64
    finally:
        procs.close()


def family_dir(
    tiny: Path, root: Path, name: str, config: dict, specials: list[str]
) -> tuple[Path, dict]:
    dest = root / name
    return dest, fake_family(tiny, dest, config, specials)


def test_resolve_routing_image_token_id(tiny, tmp_path):
    qwen_specials = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
    cases = [
        # (name, config, specials, expected: token name or an explicit id)
        ("qwen2", {"model_type": "qwen2_vl", "image_token_id": 151655}, qwen_specials, 151655),
        ("qwen25", {"model_type": "qwen2_5_vl"}, qwen_specials, "<|image_pad|>"),
        ("qwen3", {"model_type": "qwen3_vl", "image_token_id": 151655}, qwen_specials, 151655),
        ("llava", {"model_type": "llava", "image_token_index": 32000}, ["<image>"], 32000),
        ("llava-tok", {"model_type": "llava"}, ["<image>"], "<image>"),
        (
            "llama4",
            {"model_type": "llama4", "image_token_index": 200092},
            ["<|image|>", "<|patch|>"],
            200092,
        ),
        ("llama4-tok", {"model_type": "llama4"}, ["<|image|>", "<|patch|>"], "<|image|>"),
        (
            "gemma3",
            {"model_type": "gemma3", "image_token_index": 262144},
            ["<start_of_image>", "<image_soft_token>", "<end_of_image>"],
            262144,
        ),
        (
            "internvl",
            {"model_type": "internvl_chat"},
            ["<img>", "<IMG_CONTEXT>", "</img>"],
            "<IMG_CONTEXT>",
        ),
        (
            "internvl-hf",
            {
                "architectures": ["InternVLForConditionalGeneration"],
                "model_type": "x",
                "image_token_id": 151667,
            },
            ["<img>", "<IMG_CONTEXT>", "</img>"],
            151667,
        ),
    ]
    for name, config, specials, want in cases:
        d, ids = family_dir(tiny, tmp_path, name, config, specials)
        expected = ids[want] if isinstance(want, str) else want
        assert resolve_routing_image_token_id(f"org/{name}", str(d)) == expected, name
        # model_dir defaults to model_id.
        assert resolve_routing_image_token_id(str(d)) == expected, name
    # Unknown families, missing tokens, unreadable configs: None.
    assert resolve_routing_image_token_id("tiny", str(tiny)) is None
    d, _ = family_dir(tiny, tmp_path, "qwen-no-token", {"model_type": "qwen2_vl"}, [])
    assert resolve_routing_image_token_id("q", str(d)) is None
    assert resolve_routing_image_token_id("x", str(tmp_path / "missing")) is None
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert resolve_routing_image_token_id("x", str(bad)) is None
