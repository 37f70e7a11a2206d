"""Trace replay: run_mocker_trace_replay / run_mocker_synthetic_trace_replay and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_util import fresh_python

from dynamo._core import (
    KvRouterConfig,
    MockEngineArgs,
    ReplayProgress,
    run_mocker_synthetic_trace_replay,
    run_mocker_trace_replay,
)
from dynamo.llm import run_mocker_trace_replay as llm_replay

ENGINE = {"engine": {"num_gpu_blocks": 512, "block_size": 16}}


def write_trace(path: Path, rows: list[dict] | list[str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def family_rows(n: int = 40) -> list[dict]:
    """Two interleaved families of requests sharing an 8-block prefix (block size 64)."""
    rows = []
    for i in range(n):
        fam = i % 2
        ids = [fam * 1000 + b for b in range(8)] + [10_000 + i]
        rows.append(
            {"timestamp": i * 40, "input_length": 9 * 64, "output_length": 8, "hash_ids": ids}
        )
    return rows


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "trace.jsonl", family_rows())


def test_offline_summary_has_reference_keys(trace: Path) -> None:
    r = run_mocker_trace_replay(
        [trace], extra_engine_args=ENGINE, num_workers=3, trace_block_size=64
    )
    s = r.summary
    assert s["num_requests"] == 40 and s["completed_requests"] == 40
    for stat in ("mean", "median", "p75", "p90", "p95", "p99"):
        for metric in ("ttft", "itl", "tpot", "e2e_latency"):
            assert isinstance(s[f"{stat}_{metric}_ms"], float), (stat, metric)
    for k in (
        "prefix_cache_reused_ratio",
        "request_throughput_rps",
        "output_throughput_tok_s",
        "input_throughput_tok_s",
        "total_throughput_tok_s",
        "duration_ms",
        "wall_time_ms",
    ):
        assert k in s, k
    assert r.per_request is None
    assert r["summary"]["num_requests"] == 40
    assert llm_replay is run_mocker_trace_replay


def test_kv_router_reuses_more_than_round_robin(trace: Path) -> None:
    common = dict(extra_engine_args=ENGINE, num_workers=3, trace_block_size=64)
    rr = run_mocker_trace_replay([trace], router_mode="round_robin", **common).summary
    kv = run_mocker_trace_replay(
        [trace], router_mode="kv_router", router_config=KvRouterConfig(), **common
    ).summary
    assert kv["prefix_cache_reused_ratio"] > rr["prefix_cache_reused_ratio"]


def test_per_request_jsonl_sla_and_telemetry(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "per_request.jsonl"
    progress = ReplayProgress()
    r = run_mocker_trace_replay(
        [trace],
        extra_engine_args=ENGINE,
        num_workers=2,
        router_mode="kv_router",
        trace_block_size=64,
        report_jsonl_path=out,
        capture_per_request=True,
        sla_ttft_ms=1.0,
        sla_itl_ms=1000.0,
        capture_telemetry=True,
        telemetry_sample_interval_ms=100.0,
        progress=progress,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 40 and len(r.per_request) == 40
    assert all(row["ttft_ms"] > 0 and row["output_length"] == 8 for row in rows)
    assert "goodput_completed_requests" in r.summary
    samples = r.telemetry["samples"]
    assert samples and any(s["active_kv_blocks"] > 0 for s in samples)
    assert progress.completed == 40
    assert r.coverage["per_request_records"] == 40


def test_mock_engine_args_and_flat_mapping(trace: Path) -> None:
    a = run_mocker_trace_replay(
        [trace],
        extra_engine_args=MockEngineArgs(num_gpu_blocks=512, block_size=16),
        trace_block_size=64,
    ).summary
    b = run_mocker_trace_replay(
        [trace], extra_engine_args={"num_gpu_blocks": 512, "block_size": 16}, trace_block_size=64
    ).summary
    c = run_mocker_trace_replay([trace], extra_engine_args=ENGINE, trace_block_size=64).summary
    assert a["mean_ttft_ms"] == pytest.approx(c["mean_ttft_ms"])
    assert b["mean_ttft_ms"] == pytest.approx(c["mean_ttft_ms"])


def test_max_sim_time_and_concurrency(trace: Path) -> None:
    cut = run_mocker_trace_replay(
        [trace], extra_engine_args=ENGINE, trace_block_size=64, max_sim_time_ms=200.0
    ).summary
    assert cut["completed_requests"] < 40
    closed = run_mocker_trace_replay(
        [trace], extra_engine_args=ENGINE, trace_block_size=64, replay_concurrency=2
    ).summary
    assert closed["completed_requests"] == 40


def test_synthetic_replay() -> None:
    r = run_mocker_synthetic_trace_replay(
        256, 8, 12, extra_engine_args=ENGINE, num_workers=2, arrival_interval_ms=10.0
    )
    assert r.summary["num_requests"] == 12
    r = run_mocker_synthetic_trace_replay(
        256, 8, 12, extra_engine_args=ENGINE, replay_concurrency=3, router_mode="kv_router"
    )
    assert r.summary["completed_requests"] == 12
    with pytest.raises(ValueError, match="requires exactly one"):
        run_mocker_synthetic_trace_replay(256, 8, 12)
    for arrival in ({"request_rate": 5.0}, {"arrival_interval_ms": 10.0}):
        with pytest.raises(ValueError, match="requires exactly one"):
            run_mocker_synthetic_trace_replay(256, 8, 12, replay_concurrency=2, **arrival)


def test_arrival_speedup_shrinks_the_simulated_duration(trace: Path) -> None:
    common = dict(extra_engine_args=ENGINE, num_workers=3, trace_block_size=64)
    slow = run_mocker_trace_replay([trace], arrival_speedup_ratio=1.0, **common).summary
    fast = run_mocker_trace_replay([trace], arrival_speedup_ratio=4.0, **common).summary
    assert slow["completed_requests"] == fast["completed_requests"] == 40
    # 40 arrivals 40 ms apart: the last arrives at 1560 ms at 1x, at 390 ms at 4x.
    assert fast["duration_ms"] < slow["duration_ms"]
    assert slow["duration_ms"] >= 1560.0 and fast["duration_ms"] < 1560.0


def test_empty_trace_error_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "empty_trace.jsonl"
    f.write_text("\n\n")
    with pytest.raises(ValueError, match="no requests") as exc:
        run_mocker_trace_replay([f], trace_block_size=64)
    assert str(f) in str(exc.value)


@pytest.mark.parametrize("router_mode", ["round_robin", "kv_router"])
def test_sglang_engine(tmp_path: Path, router_mode: str) -> None:
    # A burst: the schedulers' admission policies differ, so must their timings.
    rows = [dict(r, timestamp=0) for r in family_rows()]
    burst = write_trace(tmp_path / "burst.jsonl", rows)
    common = dict(num_workers=3, router_mode=router_mode, trace_block_size=64)
    sglang = {"engine": {"backend": "sglang", "num_gpu_blocks": 2048, "block_size": 16}}
    r = run_mocker_trace_replay(
        [burst], extra_engine_args=sglang, capture_per_request=True, **common
    )
    s = r.summary
    assert s["num_requests"] == s["completed_requests"] == 40
    assert s["total_output_tokens"] == 40 * 8
    assert 0 < s["median_ttft_ms"] <= s["p99_ttft_ms"] <= s["max_ttft_ms"]
    assert s["mean_itl_ms"] > 0
    assert 0 <= s["prefix_cache_reused_ratio"] < 1
    assert len(r.per_request) == 40
    vllm = {"engine": {"backend": "vllm", "num_gpu_blocks": 2048, "block_size": 16}}
    v = run_mocker_trace_replay([burst], extra_engine_args=vllm, **common).summary
    assert v["completed_requests"] == 40
    assert s["mean_ttft_ms"] != pytest.approx(v["mean_ttft_ms"], rel=1e-3)
    with pytest.raises(ValueError, match="bogus"):
        run_mocker_trace_replay([burst], extra_engine_args={"engine": {"backend": "bogus"}})


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (
            [family_rows(1)[0], {"timestamp": 5, "output_length": 4, "hash_ids": [1]}],
            r":2: .*input_length",
        ),
        ([{"timestamp": 0, "input_length": 10, "output_length": 4}], r":1: .*hash_ids"),
        (
            [
                {"timestamp": 10, "input_length": 10, "output_length": 4, "hash_ids": [1]},
                {"timestamp": 5, "input_length": 10, "output_length": 4, "hash_ids": [1]},
            ],
            r":2: timestamp 5.* earlier",
        ),
        ([family_rows(1)[0], "", "{not json"], r":3: not valid JSON"),
        ([], r"no requests"),
        (
            [{"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [1]}],
            r":1: input_length 1000 exceeds",
        ),
    ],
)
def test_bad_traces_raise_value_error_naming_the_line(
    tmp_path: Path, rows: list, match: str
) -> None:
    f = write_trace(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=match):
        run_mocker_trace_replay([f], trace_block_size=64)


def test_bad_arguments(trace: Path) -> None:
    with pytest.raises(FileNotFoundError):
        run_mocker_trace_replay(["/nonexistent/trace.jsonl"])
    for kwargs, match in [
        ({"router_mode": "bogus"}, "router_mode"),
        ({"replay_mode": "bogus"}, "replay_mode"),
        ({"arrival_speedup_ratio": 0.0}, "arrival_speedup_ratio"),
        ({"num_workers": 0}, "num_workers"),
        ({"trace_format": "weka"}, "trace_format"),
        ({"extra_engine_args": {"bogus": 1}}, "bogus"),
        ({"extra_engine_args": {"engine": {}, "bogus": 1}}, "unknown field"),
        ({"prefill_engine_args": {}}, "not supported"),
        ({"replay_mode": "online", "extra_engine_args": {"engine": {"bogus": 1}}}, "bogus"),
        ({"replay_mode": "online", "num_workers": 0}, "num_workers"),
    ]:
        with pytest.raises(ValueError, match=match):
            run_mocker_trace_replay([trace], trace_block_size=64, **kwargs)
    with pytest.raises(TypeError):
        run_mocker_trace_replay([trace], extra_engine_args=[1, 2])


ONLINE_ENGINE = {"engine": {"num_gpu_blocks": 512, "block_size": 16, "speedup_ratio": 100.0}}


@pytest.mark.parametrize("router_mode", ["round_robin", "kv_router"])
def test_online_replay(trace: Path, tmp_path: Path, router_mode: str) -> None:
    out = tmp_path / "online.jsonl"
    progress = ReplayProgress()
    r = run_mocker_trace_replay(
        [trace],
        extra_engine_args=ONLINE_ENGINE,
        num_workers=3,
        router_mode=router_mode,
        replay_mode="online",
        arrival_speedup_ratio=4.0,
        trace_block_size=64,
        capture_per_request=True,
        report_jsonl_path=out,
        progress=progress,
    )
    s = r.summary
    offline = run_mocker_trace_replay(
        [trace], extra_engine_args=ENGINE, num_workers=3, trace_block_size=64
    ).summary
    assert s["replay_mode"] == "online"
    assert set(offline) - {"replay_mode"} <= set(s)
    assert s["num_requests"] == s["completed_requests"] == 40
    assert s["total_input_tokens"] == offline["total_input_tokens"]
    assert s["total_output_tokens"] == 40 * 8
    assert 0 < s["median_ttft_ms"] <= s["p99_ttft_ms"] <= s["max_ttft_ms"]
    assert s["mean_e2e_latency_ms"] >= s["mean_ttft_ms"]
    assert len(r.per_request) == 40
    assert all(row["ttft_ms"] > 0 and row["output_length"] == 8 for row in r.per_request)
    assert len(out.read_text().splitlines()) == 40
    assert progress.completed == 40
    if router_mode == "kv_router":
        # Each family's later requests find its 8-block prefix on the worker holding it.
        assert s["prefix_cache_reused_ratio"] > 0


def test_online_kv_router_reuses_more_than_round_robin(trace: Path) -> None:
    # Three workers, two interleaved families: round robin spreads each family over all
    # three (three cold prefills each), the KV router keeps it where its prefix is (one).
    # Arrivals 20 ms apart leave the KV events ample time to reach the router.
    reuse = {}
    for mode in ("round_robin", "kv_router"):
        s = run_mocker_trace_replay(
            [trace],
            extra_engine_args=ONLINE_ENGINE,
            num_workers=3,
            router_mode=mode,
            replay_mode="online",
            arrival_speedup_ratio=2.0,
            trace_block_size=64,
        )
        assert s["completed_requests"] == 40  # the reference's dict-style access
        reuse[mode] = s["prefix_cache_reused_ratio"]
    assert reuse["kv_router"] > reuse["round_robin"] > 0, reuse


def test_online_synthetic_closed_loop() -> None:
    r = run_mocker_synthetic_trace_replay(
        128,
        4,
        20,
        extra_engine_args=ONLINE_ENGINE,
        num_workers=2,
        replay_concurrency=4,
        replay_mode="online",
        router_mode="kv_router",
    )
    assert r.summary["completed_requests"] == 20
    with pytest.raises(ValueError, match="requires exactly one"):
        run_mocker_synthetic_trace_replay(
            128, 4, 20, replay_concurrency=4, request_rate=5.0, replay_mode="online"
        )


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dynamo.replay", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_writes_summary_jsonl_and_plots(trace: Path, tmp_path: Path) -> None:
    import matplotlib  # noqa: F401  (installed by scripts/test.sh)

    out = tmp_path / "report"
    p = run_cli(
        str(trace),
        "--workers",
        "3",
        "--router",
        "kv,round_robin",
        "--speedup",
        "2",
        "--num-gpu-blocks",
        "512",
        "--block-size",
        "16",
        "--trace-block-size",
        "64",
        "--sample-interval-ms",
        "50",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["modes"]) == {"kv_router", "round_robin"}
    assert summary["workers"] == 3 and summary["arrival_speedup_ratio"] == 2.0
    for mode in ("kv_router", "round_robin"):
        lines = (out / f"per_request_{mode}.jsonl").read_text().splitlines()
        assert len(lines) == 40
        assert json.loads((out / f"timeline_{mode}.json").read_text())
    for png in ("ttft_cdf.png", "prefix_reuse.png", "queue_depth.png", "active_kv_blocks.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, png
    assert "kv_router" in p.stdout and "round_robin" in p.stdout
    assert "40/40" in p.stderr  # the progress bar's last line


def test_cli_without_matplotlib(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    # Hide matplotlib from the child: a meta-path finder that refuses it.
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'matplotlib' or name.startswith('matplotlib.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from dynamo.replay.__main__ import main\n"
        f"sys.exit(main([{str(trace)!r}, '--workers', '2', '--router', 'kv', "
        f"'--trace-block-size', '64', '--block-size', '16', '--out', {str(out)!r}]))\n"
    )
    p = fresh_python(code, timeout=300)
    assert "matplotlib is not installed" in p.stderr
    assert (out / "summary.json").exists() and (out / "per_request_kv_router.jsonl").exists()
    assert not list(out.glob("*.png"))


def test_cli_online(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    p = run_cli(
        str(trace),
        "--workers",
        "3",
        "--router",
        "kv,rr",
        "--speedup",
        "4",
        "--replay-mode",
        "online",
        "--engine-args",
        json.dumps(ONLINE_ENGINE),
        "--block-size",
        "16",
        "--trace-block-size",
        "64",
        "--no-plots",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["replay_mode"] == "online"
    for mode in ("kv_router", "round_robin"):
        s = summary["modes"][mode]
        assert s["replay_mode"] == "online" and s["completed_requests"] == 40
        assert len((out / f"per_request_{mode}.jsonl").read_text().splitlines()) == 40
    assert "40/40" in p.stderr


def test_cli_simulator_failure_is_one_line(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import dynamo.replay.__main__ as cli

    def failing(*args: object, **kwargs: object) -> None:
        raise RuntimeError("replay failed: engine refused\nthe pass")

    monkeypatch.setattr(cli, "run_mocker_trace_replay", failing)
    rc = cli.main([str(trace), "--router", "kv", "--out", str(tmp_path / "o"), "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "error: kv_router: replay failed: engine refused the pass" in err
    assert "Traceback" not in err


def test_cli_bad_trace_exits_2(tmp_path: Path) -> None:
    f = write_trace(tmp_path / "bad.jsonl", [{"timestamp": 0}])
    p = run_cli(str(f), "--out", str(tmp_path / "o"), "--router", "rr")
    assert p.returncode == 2
    assert "bad.jsonl:1:" in p.stderr
