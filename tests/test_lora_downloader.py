"""LoRADownloader: file:// and s3:// adapters, the cache, and the failure modes.

S3 runs against a real S3 API server on loopback (``moto.server`` with IAM auth on);
transfers that must break at a chosen byte come from ``FakeS3`` (tests/s3_services.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from s3_services import FakeS3, Moto

from dynamo.llm import LoRADownloader

BUCKET = "adapters"
AWS_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
)


@pytest.fixture(scope="module")
def moto():
    server = Moto()
    server.s3.create_bucket(Bucket=BUCKET)
    yield server
    server.close()


def use_env(monkeypatch, env: dict[str, str]) -> None:
    for k in AWS_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def assert_same_tree(local: Path, files: dict[str, bytes]) -> None:
    got = {
        str(p.relative_to(local)): p.read_bytes()
        for p in local.rglob("*")
        if p.is_file() and p.name != ".dynamo-lora-source"
    }
    assert got == files


def test_cache_keys_match_the_reference() -> None:
    # Observed from ai-dynamo-runtime 1.6.1.
    cases = {
        "file:///tmp/a/b": "file___tmp_a_b",
        "s3://bucket/prefix/adapter": "s3__bucket_prefix_adapter",
        "s3://bucket/prefix/adapter/": "s3__bucket_prefix_adapter_",
        "s3://b/x.y/z": "s3__b_x_y_z",
        "s3://b/../../etc": "s3__b_______etc",
        "hf://org/name": "hf__org_name",
        "a:b": "a:b",
        "": "",
    }
    for uri, key in cases.items():
        assert LoRADownloader.uri_to_cache_key(uri) == key, uri


def test_cache_root_from_argument_env_or_home(tmp_path, monkeypatch) -> None:
    assert LoRADownloader(str(tmp_path)).get_cache_path("k") == str(tmp_path / "k")
    monkeypatch.setenv("DYN_LORA_PATH", str(tmp_path / "env"))
    assert LoRADownloader().get_cache_path("k") == str(tmp_path / "env" / "k")
    monkeypatch.delenv("DYN_LORA_PATH")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert LoRADownloader().get_cache_path("k") == str(tmp_path / "home/.cache/dynamo_loras/k")
    monkeypatch.delenv("HOME")
    monkeypatch.delenv("USERPROFILE", raising=False)
    with pytest.raises(RuntimeError, match="DYN_LORA_PATH"):
        LoRADownloader()
    assert not (tmp_path / "env").exists(), "the constructor creates nothing"


def test_cache_keys_cannot_leave_the_cache(tmp_path) -> None:
    d = LoRADownloader(str(tmp_path))
    for bad in ["", ".", "..", "../etc", "a/b"]:
        with pytest.raises(ValueError, match="cache key"):
            d.get_cache_path(bad)
        assert d.validate_cached(bad) is False
        assert d.is_cached(bad) is False


def test_validate_cached_checks_config_and_weights(tmp_path) -> None:
    d = LoRADownloader(str(tmp_path))
    for name, files in {
        "good": ["adapter_config.json", "adapter_model.safetensors"],
        "bin": ["adapter_config.json", "adapter_model.bin"],
        "npy": ["adapter_config.json", "model.lora_weights.npy"],
        "noweights": ["adapter_config.json"],
        "noconfig": ["adapter_model.safetensors"],
    }.items():
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text("{}")
    assert [d.validate_cached(k) for k in ["good", "bin", "npy", "noweights", "noconfig"]] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert d.validate_cached("missing") is False
    assert d.is_cached("good") and not d.is_cached("noweights")
    if os.geteuid() != 0:  # root reads through permissions
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0)
        try:
            with pytest.raises(RuntimeError, match="invalid LoRA cache"):
                d.validate_cached("locked")
        finally:
            locked.chmod(0o700)


async def test_file_uris_are_checked_and_returned_as_is(tmp_path) -> None:
    d = LoRADownloader(str(tmp_path / "cache"))
    good = tmp_path / "good"
    good.mkdir()
    (good / "adapter_config.json").write_text("{}")
    (good / "adapter_model.safetensors").write_bytes(b"w")
    assert await d.download_if_needed(f"file://{good}") == str(good)
    assert d.is_cached(f"file://{good}")
    assert not (tmp_path / "cache").exists(), "file:// adapters are not copied"

    missing = f"file://{tmp_path}/missing"
    with pytest.raises(
        RuntimeError, match=f"^Download failed: Local LoRA not found: {re.escape(missing)}$"
    ):
        await d.download_if_needed(missing)
    half = tmp_path / "half"
    half.mkdir()
    (half / "adapter_config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"Download failed: .*half is not a valid LoRA"):
        await d.download_if_needed(f"file://{half}")
    assert not d.is_cached(f"file://{half}")


@pytest.mark.parametrize(
    "uri", ["http://host/x", "gs://b/x", "/plain/path", "", "s3://", "s3:///x"]
)
async def test_other_schemes_raise_value_error(tmp_path, uri) -> None:
    with pytest.raises(ValueError, match="LoRA URI"):
        await LoRADownloader(str(tmp_path)).download_if_needed(uri)
    assert entries(tmp_path) == []


async def test_s3_download_then_cache_hit_without_the_server(moto, tmp_path, monkeypatch) -> None:
    use_env(monkeypatch, moto.env())
    files = moto.upload_adapter(BUCKET, "team/my.adapter", os.urandom(300_000))
    uri = f"s3://{BUCKET}/team/my.adapter"
    d = LoRADownloader(str(tmp_path))
    key = LoRADownloader.uri_to_cache_key(uri)
    assert key == "s3__adapters_team_my_adapter"
    assert not d.is_cached(uri)
    path = await d.download_if_needed(uri)
    assert path == d.get_cache_path(key)
    assert_same_tree(Path(path), files)
    assert d.is_cached(uri) and d.is_cached(key) and d.validate_cached(key)
    assert entries(tmp_path) == [key], "no partial directory left behind"
    assert (Path(path) / ".dynamo-lora-source").read_text() == uri + "\n"

    # The objects are gone and the endpoint is dead: a cache hit never asks the server.
    for rel in files:
        moto.s3.delete_object(Bucket=BUCKET, Key=f"team/my.adapter/{rel}")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert await d.download_if_needed(uri) == path
    assert await LoRADownloader(str(tmp_path)).download_if_needed(uri) == path


async def test_s3_endpoint_url_s3_wins_and_prefix_is_a_directory(
    moto, tmp_path, monkeypatch
) -> None:
    env = moto.env()
    env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # the generic one is dead
    env["AWS_ENDPOINT_URL_S3"] = moto.url
    env["AWS_DEFAULT_REGION"] = env.pop("AWS_REGION")
    use_env(monkeypatch, env)
    files = moto.upload_adapter(BUCKET, "dir/a", b"weights-a", extra=False)
    moto.upload_adapter(BUCKET, "dir/ab", b"weights-ab", extra=False)
    path = await LoRADownloader(str(tmp_path)).download_if_needed(f"s3://{BUCKET}/dir/a/")
    # `dir/a` does not pick up `dir/ab/...`.
    assert_same_tree(Path(path), files)


async def test_s3_missing_prefix_bucket_or_weights(moto, tmp_path, monkeypatch) -> None:
    use_env(monkeypatch, moto.env())
    d = LoRADownloader(str(tmp_path))
    uri = f"s3://{BUCKET}/does/not/exist"
    with pytest.raises(RuntimeError, match=f"^Download failed: {re.escape(uri)}: no objects under"):
        await d.download_if_needed(uri)
    uri = "s3://no-such-bucket-here/x"
    with pytest.raises(
        RuntimeError, match=f"(?s)^Download failed: {re.escape(uri)}: .*NoSuchBucket"
    ):
        await d.download_if_needed(uri)
    moto.s3.put_object(Bucket=BUCKET, Key="configonly/adapter_config.json", Body=b"{}")
    uri = f"s3://{BUCKET}/configonly"
    with pytest.raises(RuntimeError, match=r"holds no adapter_config\.json plus adapter weights"):
        await d.download_if_needed(uri)
    assert not d.is_cached(uri)
    assert entries(tmp_path) == [], "failed downloads leave nothing in the cache"


async def test_s3_wrong_credentials_are_refused(moto, tmp_path, monkeypatch) -> None:
    moto.upload_adapter(BUCKET, "secret", b"w", extra=False)
    uri = f"s3://{BUCKET}/secret"
    d = LoRADownloader(str(tmp_path))
    use_env(monkeypatch, dict(moto.env(), AWS_SECRET_ACCESS_KEY="wrong"))
    with pytest.raises(
        RuntimeError, match=f"(?s)^Download failed: {re.escape(uri)}: .*SignatureDoesNotMatch"
    ):
        await d.download_if_needed(uri)
    use_env(monkeypatch, dict(moto.env(), AWS_ACCESS_KEY_ID="AKIAUNKNOWN0000000000"))
    with pytest.raises(
        RuntimeError, match=f"(?s)^Download failed: {re.escape(uri)}: .*InvalidAccessKeyId"
    ):
        await d.download_if_needed(uri)
    assert not d.is_cached(uri) and entries(tmp_path) == []
    use_env(monkeypatch, moto.env())
    assert Path(await d.download_if_needed(uri)).is_dir()


def adapter_objects(prefix: str, weights: int) -> dict[str, bytes]:
    return {
        f"{prefix}/adapter_config.json": b'{"r": 8}',
        f"{prefix}/adapter_model.safetensors": os.urandom(weights),
    }


async def test_concurrent_downloads_of_one_uri_fetch_once(tmp_path, monkeypatch) -> None:
    objects = adapter_objects("slow", 1 << 20)
    server = FakeS3(BUCKET, objects, chunk_delay=0.01)  # ~0.16 s per body
    try:
        use_env(monkeypatch, server.env())
        d = LoRADownloader(str(tmp_path))
        uri = f"s3://{BUCKET}/slow"
        paths = await asyncio.gather(*(d.download_if_needed(uri) for _ in range(8)))
        assert len(set(paths)) == 1
        assert server.lists == 1
        assert server.gets == {k: 1 for k in objects}
        assert entries(tmp_path) == [LoRADownloader.uri_to_cache_key(uri)]
    finally:
        server.close()


async def test_server_dying_mid_download_leaves_no_entry(tmp_path, monkeypatch) -> None:
    objects = adapter_objects("dies", 1 << 20)
    server = FakeS3(BUCKET, objects, cut_after=200_000, die_after_cut=True)
    try:
        use_env(monkeypatch, server.env())
        d = LoRADownloader(str(tmp_path))
        uri = f"s3://{BUCKET}/dies"
        with pytest.raises(RuntimeError, match=f"^Download failed: {re.escape(uri)}: "):
            await d.download_if_needed(uri)
        assert server.cut.is_set()
        key = LoRADownloader.uri_to_cache_key(uri)
        assert not d.is_cached(uri) and not d.validate_cached(key)
        assert entries(tmp_path) == [], "the partial download is removed"
    finally:
        server.close()


async def test_truncated_bodies_and_short_objects_are_refused(tmp_path, monkeypatch) -> None:
    d = LoRADownloader(str(tmp_path))
    # Every GET is cut short (the retries, which resume with a range, are cut too).
    cut = FakeS3(BUCKET, adapter_objects("cut", 1 << 20), cut_after=100_000)
    # The listing promises more bytes than the server then sends.
    short = FakeS3(BUCKET, adapter_objects("short", 10_000), lie_size=5)
    try:
        for server, uri in [(cut, f"s3://{BUCKET}/cut"), (short, f"s3://{BUCKET}/short")]:
            use_env(monkeypatch, server.env())
            with pytest.raises(RuntimeError, match=f"^Download failed: {re.escape(uri)}: "):
                await d.download_if_needed(uri)
            assert not d.is_cached(uri)
        assert entries(tmp_path) == []
    finally:
        cut.close()
        short.close()


CRASHING_DOWNLOAD = textwrap.dedent(
    """
    import asyncio, sys
    from dynamo.llm import LoRADownloader
    async def main():
        await LoRADownloader(sys.argv[1]).download_if_needed(sys.argv[2])
    asyncio.run(main())
    """
)


async def test_a_killed_downloader_leaves_only_a_partial_that_is_not_cached(
    tmp_path, monkeypatch
) -> None:
    objects = adapter_objects("crash", 4 << 20)
    slow = FakeS3(BUCKET, objects, chunk_delay=0.05)  # ~3 s per body
    uri = f"s3://{BUCKET}/crash"
    key = LoRADownloader.uri_to_cache_key(uri)
    try:
        env = dict(os.environ, **slow.env())
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASHING_DOWNLOAD, str(tmp_path), uri], env=env
        )
        deadline = time.monotonic() + 30
        weights = None
        while weights is None:
            assert time.monotonic() < deadline, "the download never started writing"
            assert proc.poll() is None, "the downloader exited early"
            for p in tmp_path.glob(f".partial.{key}.*/adapter_model.safetensors"):
                if p.stat().st_size > 0:
                    weights = p
            await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        d = LoRADownloader(str(tmp_path))
        assert not d.is_cached(uri) and not d.validate_cached(key)
        assert not (tmp_path / key).exists()
        # Only the dead process's partial directory and lock file (both dot names).
        assert [n for n in entries(tmp_path) if not n.startswith(".")] == []
    finally:
        slow.close()
    # The next download (a healthy server) completes and sweeps the dead process's partial.
    fast = FakeS3(BUCKET, objects)
    try:
        use_env(monkeypatch, fast.env())
        path = await d.download_if_needed(uri)
        assert entries(tmp_path) == [key]
        assert (Path(path) / "adapter_model.safetensors").read_bytes() == objects[
            "crash/adapter_model.safetensors"
        ]
    finally:
        fast.close()


async def test_processes_downloading_one_uri_fetch_it_once(tmp_path) -> None:
    objects = adapter_objects("shared", 1 << 20)
    server = FakeS3(BUCKET, objects, chunk_delay=0.01)  # ~0.16 s per body
    uri = f"s3://{BUCKET}/shared"
    script = CRASHING_DOWNLOAD + "print(LoRADownloader.uri_to_cache_key(sys.argv[2]))\n"
    try:
        env = dict(os.environ, **server.env())
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(tmp_path), uri],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        outs = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0]
        key = LoRADownloader.uri_to_cache_key(uri)
        assert outs == [key] * 3
        assert server.gets == {k: 1 for k in objects}, "one process downloaded, two waited"
        assert entries(tmp_path) == [key]
    finally:
        server.close()
