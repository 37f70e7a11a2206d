"""The frontend's non-generative surfaces end to end: Python workers registered with
``ModelType.Embedding`` / ``Classify`` / ``Pooling`` (``tests/workers/surface_worker.py``)
behind ``python -m dynamo.frontend``, over file discovery and the request plane.

Worker contracts (documented in ``docs/design/frontend_surfaces.md``): a ``ModelInput.Tokens``
embedding worker receives ``{"model", "token_ids": [[...]]}`` tokenized by the frontend and
answers ``{"embeddings", "prompt_tokens", "total_tokens"}``; a ``ModelInput.Text`` one
receives the OpenAI body and may answer an OpenAI embeddings response. ``base64`` is
encoded by the frontend (little-endian f32), as the ``openai`` client decodes it.

Reference 1.6.1 observed (its ``make_engine(EngineType.Dynamic)`` + ``run_input("http")``
frontend, file discovery, tcp request plane, a Python ``ModelType.Embedding`` worker over
the same tiny model): a Tokens worker receives ``{"token_ids": [[...]], "model",
"dimensions": null|int, "mdc_sum", "annotations": []}`` (plus ``encoding_format`` when the
client sent one) with the same token ids as ours; a Text worker receives the client's body
unchanged; ``input: []`` is not rejected; an unknown model is 404 outside OpenAI's envelope.
Details and deliberate differences: ``docs/compatibility.md``.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import urllib.error
import urllib.request
import wave
from pathlib import Path

import openai
import pytest
from serving_util import WORKERS, Procs, free_port, http, wait_for_instances
from tokenizers import Tokenizer

from dynamo.llm.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow

MODELS = {
    "embed-text": "emb-text",
    "embed-tokens": "emb-tok",
    "classify": "scorer",
    "pooling": "pooler",
    "images": "painter",
    "audio": "speaker",
    "videos": "filmer",
}


def text_vector(s: str) -> list[float]:
    return [float(len(s)), float(ord(s[0])), 1.0, 0.5]


def token_vector(ids: list[int]) -> list[float]:
    return [float(len(ids)), float(sum(ids) % 97), 0.25, -2.0]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("surfaces")
    model_dir = write_tiny_model(tmp / "tiny")
    (tmp / "disc").mkdir()
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "disc", tmp / "logs")
    marker = tmp / "marker.jsonl"
    procs.env["MARKER"] = str(marker)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.frontend(port, "--namespace", "surf")
        for kind, name in MODELS.items():
            procs.start(kind, [str(WORKERS / "surface_worker.py"), kind, str(model_dir), name])
        for name in MODELS.values():
            wait_for_instances(base, name, 1)
        yield base, model_dir, marker
    finally:
        procs.close()


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)


def _post(base: str, path: str, body) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, out = http("POST", f"{base}{path}", raw)
    return status, json.loads(out)


def _requests(marker: Path) -> list[dict]:
    return [json.loads(line) for line in marker.read_text().splitlines()]


def test_embeddings_text_worker_float_and_base64(served):
    base, _, marker = served
    client = _client(base)
    r = client.embeddings.create(model="emb-text", input=["hello", "yo"])
    assert [d.index for d in r.data] == [0, 1]
    assert [d.embedding for d in r.data] == [text_vector("hello"), text_vector("yo")]
    assert r.usage.prompt_tokens == 5 and r.usage.total_tokens == 5
    assert r.model == "emb-text" and r.object == "list"
    # Without encoding_format the openai client asks for base64 and decodes it itself (the
    # call above); asked explicitly, it hands the string back.
    b = client.embeddings.create(model="emb-text", input="hello", encoding_format="base64")
    assert list(struct.unpack("<4f", base64.b64decode(b.data[0].embedding))) == text_vector("hello")
    status, raw = _post(
        base, "/v1/embeddings", {"model": "emb-text", "input": "hi", "encoding_format": "base64"}
    )
    assert status == 200
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack("<4f", packed)) == text_vector("hi")
    # The text worker got the body with the format the frontend decodes from.
    last = _requests(marker)[-1]
    assert last["input"] == "hi" and last["encoding_format"] == "float"


def test_embeddings_tokens_worker_gets_frontend_tokens(served):
    base, model_dir, marker = served
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    client = _client(base)
    texts = ["hello world", "abc"]
    r = client.embeddings.create(model="emb-tok", input=texts, encoding_format="float")
    ids = [tok.encode(t, add_special_tokens=True).ids for t in texts]
    assert [d.embedding for d in r.data] == [token_vector(i) for i in ids]
    assert r.usage.prompt_tokens == sum(len(i) for i in ids)
    sent = _requests(marker)[-1]
    assert sent["token_ids"] == ids and sent["model"] == "emb-tok"
    assert sent["dimensions"] is None and sent["annotations"] == []
    # Token-id input, single list and list of lists, goes through untouched.
    r = client.embeddings.create(model="emb-tok", input=[5, 6, 7], encoding_format="float")
    assert r.data[0].embedding == token_vector([5, 6, 7])
    r = client.embeddings.create(model="emb-tok", input=[[1, 2], [3]], encoding_format="float")
    assert [d.embedding for d in r.data] == [token_vector([1, 2]), token_vector([3])]
    # dimensions reaches the worker and truncates a longer vector.
    r = client.embeddings.create(
        model="emb-tok", input="abc", dimensions=2, encoding_format="float"
    )
    assert r.data[0].embedding == token_vector(ids[1])[:2]
    assert _requests(marker)[-1]["dimensions"] == 2


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": "x"}, "model"),
        ({"model": 3, "input": "x"}, "model"),
        ({"model": "emb-tok"}, "input"),
        ({"model": "emb-tok", "input": 5}, "input"),
        ({"model": "emb-tok", "input": []}, "input"),
        ({"model": "emb-tok", "input": [""]}, "input"),
        ({"model": "emb-tok", "input": ["a", 1]}, "input"),
        ({"model": "emb-tok", "input": [-1]}, "input"),
        ({"model": "emb-tok", "input": ["a"] * 2049}, "input"),
        ({"model": "emb-tok", "input": "x " * 5000}, "input"),
        ({"model": "emb-tok", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "emb-tok", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "emb-tok", "input": "x", "dimensions": "4"}, "dimensions"),
    ],
)
def test_embeddings_validation(served, body, param):
    base, _, _ = served
    status, err = _post(base, "/v1/embeddings", body)
    assert status == 400, err
    assert err["error"]["type"] == "invalid_request_error"
    assert err["error"]["param"] == param


def test_unknown_model_and_wrong_surface_are_404(served):
    base, _, _ = served
    status, err = _post(base, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert status == 404 and "nope" in err["error"]["message"]
    status, err = _post(base, "/v1/embeddings", {"model": "scorer", "input": "x"})
    assert status == 404
    assert "scorer" in err["error"]["message"] and "/v1/embeddings" in err["error"]["message"]
    status, err = _post(base, "/v1/rerank", {"model": "emb-text", "query": "q", "documents": ["a"]})
    assert status == 404 and "/v1/rerank" in err["error"]["message"]
    status, err = _post(base, "/v1/pooling", {"model": "scorer", "input": "x"})
    assert status == 404 and "/v1/pooling" in err["error"]["message"]
    status, err = _post(base, "/v1/embeddings", b"{not json")
    assert status == 400 and "error" in err


def test_rerank_sorts_and_cuts(served):
    base, _, marker = served
    docs = ["short", {"text": "a much longer document"}, "mid size"]
    status, r = _post(
        base,
        "/v1/rerank",
        {"model": "scorer", "query": "q", "documents": docs, "top_n": 2, "return_documents": True},
    )
    assert status == 200, r
    assert [x["index"] for x in r["results"]] == [1, 2]
    assert r["results"][0]["relevance_score"] == pytest.approx(len(docs[1]["text"]) / 100)
    assert r["results"][0]["document"] == {"text": "a much longer document"}
    assert r["usage"]["total_tokens"] == 11 and r["model"] == "scorer"
    sent = _requests(marker)[-1]
    assert sent["documents"] == ["short", "a much longer document", "mid size"]
    status, r = _post(
        base, "/v1/rerank", {"model": "scorer", "query": "q", "documents": ["a", "bb"]}
    )
    assert [x["index"] for x in r["results"]] == [1, 0]
    assert "document" not in r["results"][0]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "scorer", "documents": ["a"]}, "query"),
        ({"model": "scorer", "query": 1, "documents": ["a"]}, "query"),
        ({"model": "scorer", "query": "q"}, "documents"),
        ({"model": "scorer", "query": "q", "documents": []}, "documents"),
        ({"model": "scorer", "query": "q", "documents": [1]}, "documents"),
        ({"model": "scorer", "query": "q", "documents": ["a"] * 1001}, "documents"),
        ({"model": "scorer", "query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"model": "scorer", "query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
        (
            {"model": "scorer", "query": "q", "documents": ["a"], "return_documents": 1},
            "return_documents",
        ),
    ],
)
def test_rerank_validation(served, body, param):
    base, _, _ = served
    status, err = _post(base, "/v1/rerank", body)
    assert status == 400, err
    assert err["error"]["param"] == param


def test_classify_and_pooling(served):
    base, _, _ = served
    status, r = _post(base, "/v1/classify", {"model": "scorer", "input": ["hi", "hello"]})
    assert status == 200, r
    assert [d["label"] for d in r["data"]] == ["short", "long"]
    assert r["object"] == "list" and r["model"] == "scorer"
    status, r = _post(base, "/v1/pooling", {"model": "pooler", "input": "abcd"})
    assert status == 200, r
    assert r["data"] == [{"index": 0, "object": "pooling", "data": [4.0]}]
    assert r["usage"]["prompt_tokens"] == 2
    for path, model in (("/v1/classify", "scorer"), ("/v1/pooling", "pooler")):
        status, err = _post(base, path, {"model": model})
        assert status == 400 and err["error"]["param"] == "input"
        status, err = _post(base, path, {"model": model, "input": {"a": 1}})
        assert status == 400 and err["error"]["param"] == "input"
        status, err = _post(base, path, {"model": "ghost", "input": "x"})
        assert status == 404 and "ghost" in err["error"]["message"]


def test_images_generate_with_the_openai_client(served):
    base, _, marker = served
    r = _client(base).images.generate(
        model="painter", prompt="a red dot", n=2, size="256x256", response_format="b64_json"
    )
    assert r.created == 7 and len(r.data) == 2
    png = base64.b64decode(r.data[0].b64_json)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and b"IHDR" in png
    assert r.data[0].revised_prompt == "a red dot"
    sent = _requests(marker)[-1]
    assert sent["prompt"] == "a red dot" and sent["n"] == 2 and sent["size"] == "256x256"


def test_audio_speech_returns_the_workers_wav(served):
    base, _, _ = served
    r = _client(base).audio.speech.create(
        model="speaker", input="hello", voice="alloy", response_format="wav"
    )
    assert r.response.headers["content-type"] == "audio/wav"
    with wave.open(io.BytesIO(r.content)) as w:
        assert w.getnframes() == 5 and w.getframerate() == 8000


def test_videos_json_and_stream(served):
    base, _, _ = served
    status, v = _post(base, "/v1/videos", {"model": "filmer", "prompt": "waves", "seconds": "4"})
    assert status == 200, v
    assert v["id"] == "video-1" and v["object"] == "video" and v["model"] == "filmer"
    status, raw = http(
        "POST",
        f"{base}/v1/videos/stream",
        json.dumps({"model": "filmer", "prompt": "waves", "stream_test": True}).encode(),
    )
    assert status == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert [c["index"] for c in chunks] == [0, 1, 2]
    status, err = _post(base, "/v1/videos/stream", {"model": "filmer"})
    assert status == 400 and err["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/images/generations", {"model": "painter"}, "prompt"),
        ("/v1/images/generations", {"model": "painter", "prompt": 3}, "prompt"),
        ("/v1/images/generations", {"model": "painter", "prompt": "x" * 32001}, "prompt"),
        ("/v1/images/generations", {"model": "painter", "prompt": "p", "n": 0}, "n"),
        ("/v1/images/generations", {"model": "painter", "prompt": "p", "n": 11}, "n"),
        ("/v1/images/generations", {"model": "painter", "prompt": "p", "size": "big"}, "size"),
        (
            "/v1/images/generations",
            {"model": "painter", "prompt": "p", "response_format": "gif"},
            "response_format",
        ),
        ("/v1/audio/speech", {"model": "speaker", "voice": "a"}, "input"),
        ("/v1/audio/speech", {"model": "speaker", "input": "x" * 4097, "voice": "a"}, "input"),
        ("/v1/audio/speech", {"model": "speaker", "input": "x"}, "voice"),
        (
            "/v1/audio/speech",
            {"model": "speaker", "input": "x", "voice": "a", "response_format": "ogg"},
            "response_format",
        ),
        ("/v1/audio/speech", {"model": "speaker", "input": "x", "voice": "a", "speed": 9}, "speed"),
        ("/v1/videos", {"model": "filmer"}, "prompt"),
        ("/v1/videos", {"model": "filmer", "prompt": "p", "seconds": -1}, "seconds"),
        ("/v1/videos", {"prompt": "p"}, "model"),
    ],
)
def test_media_validation(served, path, body, param):
    base, _, _ = served
    status, err = _post(base, path, body)
    assert status == 400, err
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param


def test_media_routes_need_the_model_type(served):
    base, _, _ = served
    for path, body in (
        ("/v1/images/generations", {"prompt": "p"}),
        ("/v1/audio/speech", {"input": "x", "voice": "a"}),
        ("/v1/videos", {"prompt": "p"}),
    ):
        status, err = _post(base, path, {"model": "scorer", **body})
        assert status == 404 and path in err["error"]["message"], err
        status, err = _post(base, path, {"model": "ghost", **body})
        assert status == 404 and "ghost" in err["error"]["message"]


def test_image_edits_take_multipart_files(served):
    base, _, marker = served
    png = b"\x89PNG\r\n\x1a\nnot-really-a-png"
    r = _client(base).images.edit(
        model="painter",
        image=("a.png", png, "image/png"),
        mask=("m.png", b"mask-bytes", "image/png"),
        prompt="make it blue",
        n=2,
        response_format="b64_json",
    )
    assert len(r.data) == 2
    assert base64.b64decode(r.data[0].b64_json) == png
    assert r.data[0].revised_prompt == "make it blue|1|True"
    sent = _requests(marker)[-1]
    assert sent["n"] == 2 and base64.b64decode(sent["mask"]) == b"mask-bytes"


def _multipart(fields: list[tuple[str, str | None, bytes]]) -> tuple[bytes, str]:
    out = b""
    for name, filename, data in fields:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--BND\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    return out + b"--BND--\r\n", "multipart/form-data; boundary=BND"


def _post_raw(base: str, path: str, body: bytes, content_type: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"{base}{path}", data=body, method="POST")
    req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_image_edits_validation(served):
    base, _, _ = served
    ok_image = ("image", "a.png", b"png")
    cases = [
        ([("model", None, b"painter"), ok_image], 400, "prompt"),
        ([("model", None, b"painter"), ("prompt", None, b"p")], 400, "image"),
        (
            [("model", None, b"painter"), ("prompt", None, b"p"), ("image", "a.png", b"")],
            400,
            "image",
        ),
        ([("prompt", None, b"p"), ok_image], 400, "model"),
        (
            [("model", None, b"painter"), ("prompt", None, b"p"), ok_image, ("n", None, b"x")],
            400,
            "n",
        ),
        ([("model", None, b"ghost"), ("prompt", None, b"p"), ok_image], 404, "model"),
        ([("model", None, b"scorer"), ("prompt", None, b"p"), ok_image], 404, "model"),
    ]
    for fields, status, param in cases:
        body, ct = _multipart(fields)
        got, err = _post_raw(base, "/v1/images/edits", body, ct)
        assert got == status and err["error"]["param"] == param, (fields, err)
    got, err = _post_raw(
        base, "/v1/images/edits", b"--BND\r\nbroken", "multipart/form-data; boundary=BND"
    )
    assert got == 400 and "multipart" in err["error"]["message"]
    got, err = _post_raw(base, "/v1/images/edits", b"{}", "application/json")
    assert got == 415 and "multipart/form-data" in err["error"]["message"]
