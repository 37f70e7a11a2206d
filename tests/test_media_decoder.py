"""MediaDecoder: option validation, and the frontend's decoding of PNG, JPEG, WebP and GIF
(first frame) images into the RGB8 pixels a worker receives; bombs refused.

Real processes: ``python -m dynamo.frontend`` and ``tests/workers/mm_worker.py`` over file
discovery; the images are data URLs of pictures Pillow generates here.
"""

from __future__ import annotations

import hashlib

import pytest
from mm_util import MmCluster, data_url, gradient, header_bomb_png, image_bytes, zeros_bomb_png
from PIL import Image

from dynamo.llm import MediaDecoder
from dynamo.llm.tiny_model import write_tiny_model

MODELS = {
    "any": {"decoder": {}},
    "small": {"decoder": {"limits": {"max_pixels": 1_000_000, "max_image_width": 2500}}},
    "jpeg-only": {"decoder": {"formats": ["jpeg"]}},
    "tight-alloc": {"decoder": {"limits": {"max_alloc": 10_000}}},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mm-decode")
    c = MmCluster(tmp, write_tiny_model(tmp / "tiny"), MODELS)
    yield c
    c.close()


def answer(cluster, model: str, url: str) -> str:
    status, body = cluster.chat(model, url)
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def refused(cluster, model: str, url: str, rule: str) -> str:
    status, body = cluster.chat(model, url)
    assert status == 400, (status, body)
    assert rule in body["error"]["message"], body
    return body["error"]["message"]


def digest(img: Image.Image) -> str:
    return hashlib.sha256(img.convert("RGB").tobytes()).hexdigest()[:16]


def test_enable_image_options_are_validated():
    d = MediaDecoder()
    assert d.enable_image({}) is None
    assert d.enable_image({"limits": {"max_image_width": 10, "max_image_height": None}}) is None
    assert d.enable_image({"limits": {"max_alloc": 1 << 30, "max_pixels": 4096}}) is None
    assert d.enable_image({"formats": ["png", "JPG", "webp", "gif"]}) is None
    for bad, field in [
        ({"max_image_width": 10}, "max_image_width"),
        ({"limits": {"foo": 1}}, "foo"),
        ({"limits": {"max_image_width": -1}}, "max_image_width"),
        ({"limits": {"max_image_width": "a"}}, "max_image_width"),
        ({"limits": 5}, "limits"),
        ({"limits": None}, "limits"),
        ({"formats": ["tiff"]}, "tiff"),
        ({"limits": {"max_pixels": 0}}, "positive"),
    ]:
        with pytest.raises(ValueError, match="Failed to parse image decoder config") as e:
            d.enable_image(bad)
        assert field in str(e.value), (bad, str(e.value))
    with pytest.raises(TypeError):
        d.enable_image(None)


def test_png_pixels_reach_the_worker_exactly(cluster):
    img = gradient(33, 17, seed=1)
    got = answer(cluster, "any", data_url(image_bytes(img, "PNG")))
    assert got.startswith("17x33x3 uint8 ") and got.endswith(digest(img)), got
    # RGBA and greyscale become RGB.
    rgba = img.convert("RGBA")
    assert answer(cluster, "any", data_url(image_bytes(rgba, "PNG"))).endswith(digest(img))
    grey = img.convert("L")
    assert answer(cluster, "any", data_url(image_bytes(grey, "PNG"))).endswith(digest(grey))


def test_lossless_webp_and_gif_first_frame(cluster):
    img = gradient(20, 12, seed=2)
    webp = image_bytes(img, "WEBP", lossless=True)
    assert answer(cluster, "any", data_url(webp, "image/webp")).endswith(digest(img))
    # A two-frame GIF: the worker gets the first frame.
    red = Image.new("RGB", (8, 6), (255, 0, 0))
    blue = Image.new("RGB", (8, 6), (0, 0, 255))
    gif = image_bytes(red, "GIF", save_all=True, append_images=[blue], duration=100, loop=0)
    assert answer(cluster, "any", data_url(gif, "image/gif")).endswith(digest(red))


def test_jpeg_decodes_to_its_shape(cluster):
    img = gradient(64, 48, seed=3)
    got = answer(cluster, "any", data_url(image_bytes(img, "JPEG", quality=95), "image/jpeg"))
    assert got.startswith("48x64x3 uint8 "), got
    # The same JPEG twice: the same mm_hash.
    again = answer(cluster, "any", data_url(image_bytes(img, "JPEG", quality=95), "image/jpeg"))
    assert again == got


def test_mm_hash_follows_the_pixels(cluster):
    a, b = gradient(16, 16, seed=4), gradient(16, 16, seed=5)
    ha = answer(cluster, "any", data_url(image_bytes(a, "PNG"))).split()[2]
    hb = answer(cluster, "any", data_url(image_bytes(b, "PNG"))).split()[2]
    # The same pixels in another lossless format: the same hash.
    ha_webp = answer(
        cluster, "any", data_url(image_bytes(a, "WEBP", lossless=True), "image/webp")
    ).split()[2]
    assert ha != hb
    assert ha == ha_webp


def test_bombs_are_refused(cluster):
    # A header declaring 100000 x 100000 over a few bytes of data.
    refused(cluster, "any", data_url(header_bomb_png(100_000, 100_000)), "max_image_width")
    refused(cluster, "any", data_url(header_bomb_png(10_000, 10_000)), "max_pixels")
    # A real decompression bomb: 2000 x 2000 black pixels in a few KB.
    bomb = zeros_bomb_png(2000)
    assert len(bomb) < 50_000
    message = refused(cluster, "small", data_url(bomb), "max_pixels")
    assert "4000000" in message
    refused(cluster, "small", data_url(header_bomb_png(2600, 10)), "max_image_width")
    # The decoder's allocation cap.
    refused(cluster, "tight-alloc", data_url(image_bytes(gradient(80, 80), "PNG")), "max_alloc")


def test_formats_and_garbage(cluster):
    refused(cluster, "jpeg-only", data_url(image_bytes(gradient(4, 4), "PNG")), "format")
    assert answer(
        cluster, "jpeg-only", data_url(image_bytes(gradient(4, 4), "JPEG"), "image/jpeg")
    ).startswith("4x4x3")
    refused(cluster, "any", data_url(b"definitely not an image"), "format")
    truncated = image_bytes(gradient(64, 64), "PNG")
    refused(cluster, "any", data_url(truncated[: len(truncated) // 2]), "decode")
