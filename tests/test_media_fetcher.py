"""MediaFetcher: the builder, and the frontend's fetches of image URLs under its rules.

Real processes: ``python -m dynamo.frontend`` and ``tests/workers/mm_worker.py`` (which
registers one model per fetcher setting) over file discovery, plus an HTTP server on
127.0.0.1 serving images the tests generate. Every refusal must be an HTTP 400 whose
message names the rule.
"""

from __future__ import annotations

import hashlib
import os

import pytest
from mm_util import ImageServer, MmCluster, gradient, image_bytes
from PIL import Image

from dynamo.llm import MediaFetcher
from dynamo.llm.tiny_model import write_tiny_model

PICTURE = gradient(40, 24)
PNG = image_bytes(PICTURE, "PNG")
# Noise does not compress: about 3 * 256 * 256 bytes.
BIG_PNG = image_bytes(Image.frombytes("RGB", (256, 256), os.urandom(3 * 256 * 256)), "PNG")

MODELS = {
    # IP literals and ports allowed (the loopback server), small caps.
    "open": {
        "fetcher": {
            "allow_direct_ip": True,
            "allow_direct_port": True,
            "timeout_ms": 1000,
            "max_bytes": 100_000,
            "user_agent": "mm-test/1",
        }
    },
    # Secure defaults, except the port (so the address rules are what refuses).
    "strict": {"fetcher": {"allow_direct_port": True}},
    # Names may resolve to private addresses, IP literals are still refused.
    "names": {"fetcher": {"allow_private_ips": True, "allow_direct_port": True}},
    # IP literals allowed, but only the scheme's default port.
    "noport": {"fetcher": {"allow_direct_ip": True}},
    # Only localhost (and subdomains) may be fetched.
    "domains": {
        "fetcher": {
            "allow_private_ips": True,
            "allow_direct_port": True,
            "allowed_media_domains": ["localhost"],
        }
    },
}


@pytest.fixture(scope="module")
def server():
    s = ImageServer(
        {
            "/pic.png": ("image/png", PNG),
            "/pic.bin": ("application/octet-stream", PNG),
            "/big.png": ("image/png", BIG_PNG),
            "/page.html": ("text/html", b"<html>not an image</html>"),
        }
    )
    yield s
    s.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mm-fetch")
    c = MmCluster(tmp, write_tiny_model(tmp / "tiny"), MODELS)
    yield c
    c.close()


def expected_answer(img) -> str:
    rgb = img.convert("RGB")
    digest = hashlib.sha256(rgb.tobytes()).hexdigest()[:16]
    return f"{rgb.height}x{rgb.width}x3 uint8", digest


def refused(cluster, model: str, url: str, rule: str) -> str:
    status, body = cluster.chat(model, url)
    assert status == 400, (status, body)
    message = body["error"]["message"]
    assert rule in message, message
    return message


def test_builder_setters_return_none_and_validate():
    f = MediaFetcher()
    assert f.user_agent("x") is None
    assert f.allow_direct_ip(True) is None
    assert f.allow_direct_port(False) is None
    assert f.allow_private_ips(False) is None
    assert f.allowed_media_domains(["a.example"]) is None
    assert f.timeout_ms(100) is None
    assert f.max_bytes(10) is None
    with pytest.raises(ValueError, match="timeout_ms"):
        f.timeout_ms(0)
    with pytest.raises(OverflowError):
        f.timeout_ms(-1)
    with pytest.raises(TypeError):
        f.user_agent(3)
    with pytest.raises(TypeError):
        f.allow_direct_ip(1)
    with pytest.raises(TypeError):
        f.allowed_media_domains("a.example")


def test_fetches_an_image_from_an_allowed_server(cluster, server):
    status, body = cluster.chat("open", server.url("/pic.png"))
    assert status == 200, body
    shape, digest = expected_answer(PICTURE)
    answer = body["choices"][0]["message"]["content"]
    assert answer.startswith(shape) and answer.endswith(digest), answer
    # The configured User-Agent is sent.
    assert ("/pic.png", "mm-test/1") in server.requests
    # octet-stream is accepted (the decoder sniffs the format).
    status, body = cluster.chat("open", server.url("/pic.bin"))
    assert status == 200, body


def test_a_name_resolving_to_loopback_is_refused(cluster, server):
    message = refused(
        cluster, "strict", server.url("/pic.png", host="localhost"), "private_address"
    )
    assert "127.0.0.1" in message or "::1" in message


def test_ip_literals_are_refused_without_allow_direct_ip(cluster, server):
    refused(cluster, "strict", server.url("/pic.png"), "direct_ip")
    refused(cluster, "names", server.url("/pic.png"), "direct_ip")
    refused(cluster, "strict", "http://169.254.169.254/latest/meta-data", "direct_ip")


def test_non_default_ports_need_allow_direct_port(cluster, server):
    refused(cluster, "noport", server.url("/pic.png"), "direct_port")


def test_redirects_are_rechecked(cluster, server):
    # localhost is fine for "names", but the redirect goes to an IP literal.
    refused(
        cluster,
        "names",
        server.url("/redirect?to=" + server.url("/pic.png"), host="localhost"),
        "redirect",
    )
    # And to the metadata service.
    message = refused(
        cluster,
        "names",
        server.url("/redirect?to=http://169.254.169.254/latest/meta-data", host="localhost"),
        "redirect",
    )
    assert "direct_ip" in message
    # A redirect within the rules is followed.
    status, body = cluster.chat(
        "names",
        server.url("/redirect?to=" + server.url("/pic.png", host="localhost"), host="localhost"),
    )
    assert status == 200, body


def test_allowed_media_domains(cluster, server):
    status, body = cluster.chat("domains", server.url("/pic.png", host="localhost"))
    assert status == 200, body
    refused(cluster, "domains", "https://example.com/a.png", "allowed_media_domains")


def test_oversize_bodies_are_refused(cluster, server):
    assert len(BIG_PNG) > 100_000
    message = refused(cluster, "open", server.url("/big.png"), "max_bytes")
    assert "100000" in message
    # Without Content-Length the streamed body is cut at the cap.
    refused(cluster, "open", server.url("/chunked/big.png"), "max_bytes")
    # Data URLs are capped too.
    refused(cluster, "open", "data:image/png;base64," + "A" * 200_000, "max_bytes")


def test_a_slow_server_times_out(cluster, server):
    message = refused(cluster, "open", server.url("/slow"), "timeout")
    assert "1000 ms" in message


def test_wrong_content_type_is_refused(cluster, server):
    refused(cluster, "open", server.url("/page.html"), "content_type")
    refused(cluster, "open", "data:text/plain;base64,aGVsbG8=", "content_type")


def test_other_refusals(cluster, server):
    refused(cluster, "open", "ftp://127.0.0.1/x.png", "scheme")
    refused(cluster, "open", "file:///etc/passwd", "scheme")
    refused(cluster, "open", server.url("/missing.png"), "http_status")
    refused(cluster, "open", "data:image/png,raw", "data_url")
