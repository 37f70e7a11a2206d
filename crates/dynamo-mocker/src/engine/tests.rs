use dynamo_kv_router::hashing::{BlockHashOptions, compute_block_hash_for_seq};
use dynamo_kv_router::indexer::SharedRadixTree;
use dynamo_kv_router::protocols::{KvCacheEvent, WorkerWithDpRank};
use proptest::prelude::*;

use super::*;

fn args(blocks: usize, bs: usize) -> MockEngineArgs {
    MockEngineArgs {
        num_gpu_blocks: blocks,
        block_size: bs,
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        watermark: 0.0,
        ..Default::default()
    }
}

/// Run until idle, applying events to `tree` as worker 1; returns outputs per request.
fn drain(engine: &mut MockEngine, tree: &SharedRadixTree, event_id: &mut u64) -> Vec<StepResult> {
    let mut steps = Vec::new();
    let mut guard = 0;
    while engine.has_work() {
        let step = engine.step();
        apply(tree, &step.events, event_id);
        steps.push(step);
        guard += 1;
        assert!(guard < 100_000, "engine made no progress");
    }
    steps
}

fn apply(tree: &SharedRadixTree, events: &[KvCacheEventData], event_id: &mut u64) {
    for data in events {
        *event_id += 1;
        let ev = KvCacheEvent {
            event_id: *event_id,
            data: data.clone(),
            dp_rank: 0,
        };
        tree.apply_event(1, &ev)
            .expect("mocker events apply cleanly");
    }
}

fn router_score(tree: &SharedRadixTree, tokens: &[u32], bs: usize) -> usize {
    let local =
        compute_block_hash_for_seq(tokens, bs, &BlockHashOptions::default()).expect("bs > 0");
    tree.find_matches(&local, false)
        .get(WorkerWithDpRank::new(1, 0))
        .unwrap_or(0) as usize
}

#[test]
fn generates_exactly_max_tokens() {
    let mut e = MockEngine::new(args(64, 4)).expect("valid");
    e.add_request(MockRequest::new("a", (0..10).collect(), 5))
        .expect("fits");
    let tree = SharedRadixTree::new(None);
    let steps = drain(&mut e, &tree, &mut 0);
    let outs: Vec<_> = steps.iter().flat_map(|s| s.outputs.clone()).collect();
    assert_eq!(outs.len(), 5);
    assert_eq!(
        outs.iter().map(|o| o.index).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(outs[4].finished && !outs[3].finished);
    assert_eq!(outs[0].cached_tokens, Some(0));
    assert!(outs.iter().all(|o| o.token_id < 32_000));
    // Nothing is held once the request is done; its full blocks stay cached.
    assert_eq!(e.kv_cache().active(), 0);
    assert_eq!(e.kv_cache().used(), e.kv_cache().registered());
    // 14 tokens computed (10 prompt + 4 of the generated) -> 3 full blocks of 4.
    assert_eq!(e.kv_cache().registered(), 3);
}

#[test]
fn prefix_reuse_lowers_time_to_first_token() {
    let bs = 16;
    let shared: Vec<u32> = (0..1024).collect();
    let mut e = MockEngine::new(MockEngineArgs {
        max_num_batched_tokens: 4096,
        ..args(1024, bs)
    })
    .expect("valid");
    let tree = SharedRadixTree::new(None);
    let mut id = 0;
    let mut prompt = shared.clone();
    prompt.extend(5000..5032);
    e.add_request(MockRequest::new("first", prompt.clone(), 1))
        .expect("fits");
    let cold = drain(&mut e, &tree, &mut id);
    let mut second = shared.clone();
    second.extend(6000..6032);
    // The router sees the shared prefix cached on this worker before routing.
    assert_eq!(router_score(&tree, &second, bs), 1024 / bs);
    e.add_request(MockRequest::new("second", second, 1))
        .expect("fits");
    let warm = drain(&mut e, &tree, &mut id);
    assert_eq!(warm[0].outputs[0].cached_tokens, Some(1024));
    assert!(
        warm[0].duration_ms * 4.0 < cold[0].duration_ms,
        "warm {} vs cold {}",
        warm[0].duration_ms,
        cold[0].duration_ms
    );
    assert!(e.metrics().prefix_hit_rate > 0.4);
}

#[test]
fn chunked_prefill_spreads_long_prompts_over_steps() {
    let mut e = MockEngine::new(args(256, 16)).expect("valid");
    e.add_request(MockRequest::new("long", (0..1000).collect(), 2))
        .expect("fits");
    let steps = drain(&mut e, &SharedRadixTree::new(None), &mut 0);
    // 1000 tokens at 256 per pass: 4 prefill passes, the last one yields the first token.
    assert!(steps[..3].iter().all(|s| s.outputs.is_empty()));
    assert_eq!(steps[3].outputs.len(), 1);
    assert_eq!(steps.iter().map(|s| s.prefill_tokens).sum::<usize>(), 1000);

    let mut no_chunk = MockEngine::new(MockEngineArgs {
        enable_chunked_prefill: false,
        max_num_batched_tokens: 2048,
        ..args(256, 16)
    })
    .expect("valid");
    no_chunk
        .add_request(MockRequest::new("long", (0..1000).collect(), 1))
        .expect("fits");
    assert_eq!(no_chunk.step().outputs.len(), 1);
}

#[test]
fn speedup_ratio_scales_durations() {
    let run = |speedup| {
        let mut e = MockEngine::new(MockEngineArgs {
            speedup_ratio: speedup,
            ..args(64, 16)
        })
        .expect("valid");
        e.add_request(MockRequest::new("a", (0..100).collect(), 1))
            .expect("fits");
        e.step().duration_ms
    };
    let slow = run(1.0);
    assert!((slow / run(10.0) - 10.0).abs() < 1e-9);
}

#[test]
fn rejects_impossible_and_duplicate_requests() {
    let mut e = MockEngine::new(MockEngineArgs {
        max_model_len: Some(100),
        ..args(4, 16)
    })
    .expect("valid");
    assert!(matches!(
        e.add_request(MockRequest::new("big", vec![1; 70], 1)),
        Err(Error::RequestRejected { .. })
    ));
    assert!(matches!(
        e.add_request(MockRequest::new("long", vec![1; 90], 20)),
        Err(Error::RequestRejected { .. })
    ));
    assert!(e.add_request(MockRequest::new("empty", vec![], 1)).is_err());
    e.add_request(MockRequest::new("ok", vec![1; 10], 1))
        .expect("fits");
    assert_eq!(
        e.add_request(MockRequest::new("ok", vec![1; 10], 1)),
        Err(Error::DuplicateRequest("ok".into()))
    );
}

#[test]
fn cancel_releases_blocks() {
    let mut e = MockEngine::new(args(64, 4)).expect("valid");
    e.add_request(MockRequest::new("a", (0..30).collect(), 100))
        .expect("fits");
    e.step();
    assert!(e.kv_cache().active() > 0);
    assert!(e.cancel("a"));
    assert!(!e.cancel("a"));
    assert_eq!(e.kv_cache().active(), 0);
    assert!(!e.has_work());
}

#[derive(Debug, Clone)]
struct Workload {
    prompts: Vec<(u8, u16, u8)>,
}

fn workload() -> impl Strategy<Value = Workload> {
    // (shared-prefix family, unique suffix length, output tokens)
    proptest::collection::vec((0u8..4, 1u16..80, 1u8..24), 1..16)
        .prop_map(|prompts| Workload { prompts })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Under memory pressure (small cache, preemption, eviction) every request still gets
    /// exactly its tokens, the cache never exceeds capacity, and the router's view built
    /// from the emitted events equals the cache's content for every prompt.
    #[test]
    fn events_track_cache_under_pressure(w in workload(), blocks in 24usize..64) {
        let bs = 8;
        let mut e = MockEngine::new(MockEngineArgs {
            num_gpu_blocks: blocks,
            block_size: bs,
            max_num_batched_tokens: 64,
            max_num_seqs: 4,
            watermark: 0.0,
            ..Default::default()
        }).expect("valid");
        let tree = SharedRadixTree::new(None);
        let mut prompts = Vec::new();
        let mut expected = std::collections::BTreeMap::new();
        for (i, &(family, suffix, out)) in w.prompts.iter().enumerate() {
            let mut p: Vec<u32> = (0..48).map(|t| u32::from(family) * 1000 + t).collect();
            p.extend((0..u32::from(suffix)).map(|t| 100_000 + i as u32 * 1000 + t));
            let id = format!("r{i}");
            if e.add_request(MockRequest::new(id.clone(), p.clone(), out.into())).is_ok() {
                expected.insert(id, usize::from(out));
            }
            prompts.push(p);
        }
        let mut got = std::collections::BTreeMap::<String, usize>::new();
        let mut event_id = 0;
        let mut guard = 0;
        while e.has_work() {
            let step = e.step();
            prop_assert!(e.kv_cache().used() <= blocks);
            apply(&tree, &step.events, &mut event_id);
            for o in &step.outputs {
                *got.entry(o.request_id.to_string()).or_default() += 1;
            }
            for p in &prompts {
                prop_assert_eq!(router_score(&tree, p, bs), e.cached_prefix_blocks(p));
            }
            guard += 1;
            prop_assert!(guard < 20_000, "no progress");
        }
        // Preempted requests regenerate from where they were: counts are exact.
        prop_assert_eq!(got, expected);
        prop_assert_eq!(e.kv_cache().active(), 0);
        e.cache.evict_all_unreferenced();
        apply(&tree, &e.cache.take_events(), &mut event_id);
        prop_assert_eq!(e.kv_cache().used(), 0);
        prop_assert_eq!(tree.node_count(), 0);
    }
}

#[test]
fn pressure_workload_preempts_and_evicts() {
    // A deterministic instance of the property test's workload: tiny cache, many requests.
    let bs = 8;
    let mut e = MockEngine::new(MockEngineArgs {
        num_gpu_blocks: 24,
        block_size: bs,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        watermark: 0.0,
        ..Default::default()
    })
    .expect("valid");
    for i in 0..12u32 {
        let mut p: Vec<u32> = (0..48).map(|t| (i % 3) * 1000 + t).collect();
        p.extend((0..40).map(|t| 100_000 + i * 1000 + t));
        e.add_request(MockRequest::new(format!("r{i}"), p, 40))
            .expect("fits");
    }
    let tree = SharedRadixTree::new(None);
    let (mut preempted, mut removed, mut outputs) = (0, 0, 0);
    let mut id = 0;
    while e.has_work() {
        let step = e.step();
        preempted += step.preempted.len();
        removed += step
            .events
            .iter()
            .filter(|ev| matches!(ev, KvCacheEventData::Removed(_)))
            .count();
        outputs += step.outputs.len();
        apply(&tree, &step.events, &mut id);
    }
    assert_eq!(outputs, 12 * 40);
    assert!(preempted > 0, "workload should force preemption");
    assert!(removed > 0, "workload should force eviction");
}
