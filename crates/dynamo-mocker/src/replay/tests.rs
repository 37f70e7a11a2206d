use std::io::Write as _;

use serde_json::json;

use super::*;

fn trace_file(lines: &[&str]) -> tempfile_path::TempPath {
    tempfile_path::write(lines)
}

/// A throwaway file under the system temp dir, removed on drop.
mod tempfile_path {
    use std::io::Write as _;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    pub(super) struct TempPath(pub(super) PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    pub(super) fn write(lines: &[&str]) -> TempPath {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "replay-test-{}-{}.jsonl",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = std::fs::File::create(&p).expect("temp file");
        for l in lines {
            writeln!(f, "{l}").expect("write");
        }
        TempPath(p)
    }
}

fn mooncake(p: &tempfile_path::TempPath) -> Workload {
    Workload::Mooncake {
        files: vec![p.0.clone()],
        trace_block_size: Some(64),
    }
}

fn small_opts(mode: RouterMode) -> ReplayOptions {
    ReplayOptions {
        engine_args: json!({"engine": {"num_gpu_blocks": 512, "block_size": 16}}),
        num_workers: 2,
        router_mode: mode,
        ..Default::default()
    }
}

fn err_of(lines: &[&str]) -> String {
    let f = trace_file(lines);
    match run_offline(&small_opts(RouterMode::RoundRobin), &mooncake(&f)) {
        Ok(_) => panic!("trace {lines:?} was accepted"),
        Err(e) => {
            assert!(matches!(e, ReplayError::InvalidTrace { .. }), "{e:?}");
            e.to_string()
        }
    }
}

#[test]
fn bad_traces_name_the_line() {
    let ok = r#"{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [1, 2]}"#;
    let e = err_of(&[
        ok,
        r#"{"timestamp": 5, "output_length": 4, "hash_ids": [1]}"#,
    ]);
    assert!(e.contains(":2:") && e.contains("input_length"), "{e}");
    let e = err_of(&[
        r#"{"timestamp": 10, "input_length": 10, "output_length": 4, "hash_ids": [1]}"#,
        r#"{"timestamp": 5, "input_length": 10, "output_length": 4, "hash_ids": [1]}"#,
    ]);
    assert!(e.contains(":2:") && e.contains("earlier"), "{e}");
    let e = err_of(&[ok, "", "not json"]);
    assert!(e.contains(":3:") && e.contains("JSON"), "{e}");
    let e =
        err_of(&[r#"{"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [1]}"#]);
    assert!(e.contains(":1:") && e.contains("exceeds"), "{e}");
    let e = err_of(&[]);
    assert!(e.contains("no requests"), "{e}");
}

#[test]
fn missing_file_is_io_error() {
    let w = Workload::Mooncake {
        files: vec!["/nonexistent/trace.jsonl".into()],
        trace_block_size: None,
    };
    let e = run_offline(&small_opts(RouterMode::RoundRobin), &w).unwrap_err();
    assert!(matches!(e, ReplayError::Io { .. }), "{e:?}");
}

#[test]
fn engine_args_forms() {
    let (d, startup) = engine_descriptor(
        &json!({"engine": {"block_size": 32}, "dp_size": 1, "startup_time": 2.0}),
    )
    .expect("reference form");
    assert_eq!(d["rank"]["block_size"], 32);
    assert_eq!(startup, Some(2.0));
    let (d, _) = engine_descriptor(&json!({"num_gpu_blocks": 100, "engine_type": "vllm"}))
        .expect("flat form");
    assert_eq!(d["rank"]["num_gpu_blocks"], 100);
    assert_eq!(d["rank"]["backend"], "vllm");
    assert!(engine_descriptor(&json!({"engine": {}, "bogus": 1})).is_err());
    let mocker = crate::args::MockEngineArgs {
        num_gpu_blocks: 77,
        block_size: 16,
        ..Default::default()
    };
    let (d, _) = engine_descriptor(&engine_args_from_mocker(&mocker)).expect("mocker args");
    assert_eq!(d["rank"]["num_gpu_blocks"], 77);
    assert_eq!(engine_block_size(&d).expect("valid"), 16);
}

/// Requests sharing long prefixes in two families, interleaved: the KV router keeps each
/// family on one worker, round robin alternates and recomputes.
fn family_trace() -> tempfile_path::TempPath {
    let mut lines = Vec::new();
    for i in 0..40u32 {
        let fam = i % 2;
        let ids: Vec<u32> = (0..8).map(|b| fam * 1000 + b).chain([10_000 + i]).collect();
        lines.push(
            json!({"timestamp": i * 40, "input_length": 9 * 64, "output_length": 8, "hash_ids": ids})
                .to_string(),
        );
    }
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    trace_file(&refs)
}

#[test]
fn kv_router_reuses_more_than_round_robin() {
    let f = family_trace();
    let rr = run_offline(&small_opts(RouterMode::RoundRobin), &mooncake(&f)).expect("rr");
    let kv = run_offline(&small_opts(RouterMode::KvRouter), &mooncake(&f)).expect("kv");
    let reuse = |o: &ReplayOutput| {
        o.summary["prefix_cache_reused_ratio"]
            .as_f64()
            .expect("f64")
    };
    assert_eq!(kv.summary["completed_requests"], 40);
    assert_eq!(rr.summary["completed_requests"], 40);
    // Round robin sends family 0 to worker 0 and family 1 to worker 1 by accident of
    // parity, so stagger with 3 workers to make it alternate.
    let mut three = small_opts(RouterMode::RoundRobin);
    three.num_workers = 3;
    let rr3 = run_offline(&three, &mooncake(&f)).expect("rr3");
    three.router_mode = RouterMode::KvRouter;
    let kv3 = run_offline(&three, &mooncake(&f)).expect("kv3");
    assert!(
        reuse(&kv3) > reuse(&rr3),
        "kv {} rr {}",
        reuse(&kv3),
        reuse(&rr3)
    );
    assert!(reuse(&kv) >= reuse(&rr) - 1e-9);
    for key in [
        "mean_ttft_ms",
        "median_ttft_ms",
        "p75_ttft_ms",
        "p90_ttft_ms",
        "p95_ttft_ms",
        "p99_ttft_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_tpot_ms",
        "mean_e2e_latency_ms",
        "output_throughput_tok_s",
        "request_throughput_rps",
    ] {
        assert!(kv.summary[key].is_number(), "{key}");
    }
}

#[test]
fn per_request_jsonl_timeline_and_sla() {
    let f = family_trace();
    let dir = std::env::temp_dir().join(format!("replay-jsonl-{}.jsonl", std::process::id()));
    let mut opts = small_opts(RouterMode::KvRouter);
    opts.capture_per_request = true;
    opts.report_jsonl_path = Some(dir.clone());
    opts.timeline_interval_ms = Some(100.0);
    opts.sla.ttft_ms = Some(1.0);
    let out = run_offline(&opts, &mooncake(&f)).expect("replay");
    let rows = out.per_request.expect("captured");
    assert_eq!(rows.len(), 40);
    assert!(rows[0]["ttft_ms"].as_f64().is_some_and(|t| t > 0.0));
    let text = std::fs::read_to_string(&dir).expect("jsonl written");
    let _ = std::fs::remove_file(&dir);
    assert_eq!(text.lines().count(), 40);
    assert!(!out.timeline.is_empty());
    assert!(out.timeline.iter().any(|s| s.active_kv_blocks > 0));
    assert!(out.summary.contains_key("goodput_completed_requests"));
    // A tight max_sim_time_ms stops the run before everything completes.
    let mut cut = small_opts(RouterMode::RoundRobin);
    cut.max_sim_time_ms = Some(200.0);
    let out = run_offline(&cut, &mooncake(&f)).expect("cut");
    assert!(out.summary["completed_requests"].as_u64().expect("count") < 40);
}

#[test]
fn synthetic_needs_an_arrival_process() {
    let w = |interval: Option<f64>| {
        Workload::Synthetic(SyntheticWorkload {
            input_tokens: 256,
            output_tokens: 8,
            request_count: 10,
            request_rate: None,
            arrival_interval_ms: interval,
            arrival_seed: 42,
            turns_per_session: 1,
            shared_prefix_ratio: 0.0,
            num_prefix_groups: 0,
            inter_turn_delay_ms: 0.0,
        })
    };
    let opts = small_opts(RouterMode::RoundRobin);
    assert!(matches!(
        run_offline(&opts, &w(None)),
        Err(ReplayError::InvalidArgument(_))
    ));
    let out = run_offline(&opts, &w(Some(10.0))).expect("synthetic");
    assert_eq!(out.summary["num_requests"], 10);
    let mut closed = opts.clone();
    closed.replay_concurrency = Some(2);
    let out = run_offline(&closed, &w(None)).expect("closed loop");
    assert_eq!(out.summary["completed_requests"], 10);
}

#[test]
fn bad_arguments() {
    let f = family_trace();
    for mutate in [
        (|o: &mut ReplayOptions| o.num_workers = 0) as fn(&mut ReplayOptions),
        |o| o.arrival_speedup_ratio = 0.0,
        |o| o.replay_concurrency = Some(0),
        |o| o.engine_args = json!({"engine": {"bogus_key": 1}}),
    ] {
        let mut o = small_opts(RouterMode::KvRouter);
        mutate(&mut o);
        let e = run_offline(&o, &mooncake(&f)).unwrap_err();
        assert!(matches!(e, ReplayError::InvalidArgument(_)), "{e:?}");
    }
    let _ = std::io::stdout().flush();
}

fn online_opts(mode: RouterMode) -> ReplayOptions {
    ReplayOptions {
        // The live mocker 100x faster than real time, arrivals 4x: a few hundred ms.
        engine_args: json!({"engine": {"num_gpu_blocks": 512, "block_size": 16,
                                       "speedup_ratio": 100.0}}),
        num_workers: 3,
        router_mode: mode,
        arrival_speedup_ratio: 4.0,
        capture_per_request: true,
        ..Default::default()
    }
}

#[test]
fn online_replay_both_router_modes() {
    let f = family_trace();
    let mut reuse = Vec::new();
    for mode in [RouterMode::RoundRobin, RouterMode::KvRouter] {
        let out = online::run_online(&online_opts(mode), &mooncake(&f)).expect("online");
        let s = &out.summary;
        assert_eq!(s["num_requests"], 40, "{mode:?}");
        assert_eq!(s["completed_requests"], 40, "{mode:?}");
        assert_eq!(s["total_output_tokens"], 40 * 8, "{mode:?}");
        assert_eq!(s["replay_mode"], "online");
        for key in [
            "mean_ttft_ms",
            "median_ttft_ms",
            "p99_ttft_ms",
            "mean_e2e_latency_ms",
        ] {
            assert!(
                s[key].as_f64().is_some_and(|v| v > 0.0),
                "{mode:?} {key}: {}",
                s[key]
            );
        }
        assert!(s["mean_itl_ms"].as_f64().is_some_and(|v| v >= 0.0));
        let rows = out.per_request.expect("captured");
        assert_eq!(rows.len(), 40);
        assert!(
            rows.iter().all(|r| r["output_length"] == 8),
            "{:?}",
            rows[0]
        );
        reuse.push(s["prefix_cache_reused_ratio"].as_f64().expect("reuse"));
    }
    // Every request after a family's first shares 8 of its 9 blocks with it.
    assert!(reuse[1] > 0.0, "kv reuse {reuse:?}");
}

#[test]
fn online_closed_loop_synthetic_and_cut_off() {
    let synthetic = |concurrency: Option<usize>, interval: Option<f64>| {
        let mut o = online_opts(RouterMode::KvRouter);
        o.replay_concurrency = concurrency;
        (
            o,
            Workload::Synthetic(SyntheticWorkload {
                input_tokens: 128,
                output_tokens: 4,
                request_count: 20,
                request_rate: None,
                arrival_interval_ms: interval,
                arrival_seed: 7,
                turns_per_session: 1,
                shared_prefix_ratio: 0.5,
                num_prefix_groups: 2,
                inter_turn_delay_ms: 0.0,
            }),
        )
    };
    let (o, w) = synthetic(Some(4), None);
    let out = online::run_online(&o, &w).expect("closed loop");
    assert_eq!(out.summary["completed_requests"], 20);
    // Exactly one arrival process.
    let (o, w) = synthetic(Some(4), Some(5.0));
    assert!(matches!(
        online::run_online(&o, &w),
        Err(ReplayError::InvalidArgument(_))
    ));
    // max_sim_time_ms caps the wall-clock run: arrivals 1 s apart, cut at 300 ms.
    let (mut o, w) = synthetic(None, Some(4000.0));
    o.max_sim_time_ms = Some(300.0);
    let out = online::run_online(&o, &w).expect("cut");
    let done = out.summary["completed_requests"].as_u64().expect("count");
    assert!(done < 20, "{done}");
}

/// The router thread only pipelines the router's inputs with the simulator: every decision,
/// and so the whole report, must be identical to the run with the router inline. A tight
/// cache (evictions, hence removal events) and many prefix families exercise every input.
#[test]
fn router_thread_gives_the_inline_router_s_results() {
    let mut lines = Vec::new();
    for i in 0..240u32 {
        let fam = (i * 7) % 11;
        let shared = 2 + (i % 5);
        let ids: Vec<u32> = (0..shared)
            .map(|b| fam * 1000 + b)
            .chain([100_000 + i, 200_000 + i])
            .collect();
        let len = ids.len() as u32 * 64 - (i % 50);
        lines.push(
            json!({"timestamp": i * 9, "input_length": len, "output_length": 4 + i % 13,
                   "hash_ids": ids})
            .to_string(),
        );
    }
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let f = trace_file(&refs);
    let run = |thread: bool, seed: u64| {
        let mut o = small_opts(RouterMode::KvRouter);
        o.num_workers = 3;
        o.engine_args = json!({"engine": {"num_gpu_blocks": 96, "block_size": 16}});
        o.capture_per_request = true;
        o.router_thread = thread;
        o.seed = seed;
        let mut out = run_offline(&o, &mooncake(&f)).expect("kv replay");
        // Wall-clock figures (the simulator's processed-tokens rates divide by real elapsed
        // time) differ between any two runs; drop them.
        for key in [
            "wall_time_ms",
            "processed_tokens_per_s",
            "processed_output_tokens_per_s",
        ] {
            out.summary.remove(key);
        }
        // Request UUIDs are drawn per run; everything else must match.
        let rows: Vec<Value> = out
            .per_request
            .take()
            .expect("per-request records")
            .into_iter()
            .map(|mut r| {
                r.as_object_mut().expect("record").remove("uuid");
                r
            })
            .collect();
        (out.summary, rows)
    };
    for seed in [1, 42] {
        let (inline_summary, inline_rows) = run(false, seed);
        let (thread_summary, thread_rows) = run(true, seed);
        assert_eq!(inline_summary["completed_requests"], 240);
        assert!(
            inline_summary["prefix_cache_reused_ratio"]
                .as_f64()
                .expect("reuse")
                > 0.0
        );
        same_up_to_float_order(
            &Value::Object(inline_summary),
            &Value::Object(thread_summary),
            &format!("seed {seed} summary"),
        );
        same_up_to_float_order(
            &Value::Array(inline_rows),
            &Value::Array(thread_rows),
            &format!("seed {seed} rows"),
        );
    }
}

/// Equal JSON, except that floats may differ in their last bits: the summary's means and
/// deviations are sums whose order follows the completion order of same-time events.
fn same_up_to_float_order(a: &Value, b: &Value, at: &str) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}: keys"
            );
            for (k, v) in x {
                same_up_to_float_order(v, &y[k], &format!("{at}.{k}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: length");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                same_up_to_float_order(v, w, &format!("{at}[{i}]"));
            }
        }
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().expect("number"), y.as_f64().expect("number"));
            assert!(
                (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
                "{at}: {x} != {y}"
            );
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}
