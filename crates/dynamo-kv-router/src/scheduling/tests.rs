use super::*;
use proptest::prelude::*;
use selector::selection_probabilities;

fn w(id: u64) -> WorkerWithDpRank {
    WorkerWithDpRank::new(id, 0)
}

fn hashes(range: std::ops::Range<u64>) -> Vec<SequenceHash> {
    range.map(SequenceHash).collect()
}

fn scheduler(workers: &[u64]) -> Scheduler {
    let s = Scheduler::with_rng(
        16,
        KvRouterConfig::default(),
        LoadThresholds::default(),
        fastrand::Rng::with_seed(1),
    )
    .expect("valid config");
    for &id in workers {
        s.upsert_worker(w(id), BTreeSet::new(), WorkerCapacity::default());
    }
    s
}

fn overlaps(pairs: &[(u64, u32)]) -> FxHashMap<WorkerWithDpRank, TierOverlap> {
    pairs
        .iter()
        .map(|&(id, device)| {
            (
                w(id),
                TierOverlap {
                    device,
                    ..Default::default()
                },
            )
        })
        .collect()
}

#[test]
fn routes_to_the_worker_holding_the_prefix() {
    let s = scheduler(&[1, 2, 3]);
    let ov = overlaps(&[(2, 8)]);
    let blocks = hashes(0..10);
    let req = SchedulingRequest {
        isl_tokens: 160,
        seq_hashes: &blocks,
        overlaps: Some(&ov),
        ..Default::default()
    };
    let sel = s.select(&req).expect("workers exist");
    assert_eq!(sel.worker, w(2));
    assert_eq!(sel.overlap_blocks, 8);
    assert_eq!(sel.cost, 2.0 + 10.0);
}

#[test]
fn booking_raises_load_and_free_lowers_it() {
    let s = scheduler(&[1, 2]);
    let blocks = hashes(0..4);
    let req = |id| SchedulingRequest {
        request_id: Some(id),
        isl_tokens: 64,
        seq_hashes: &blocks,
        ..Default::default()
    };
    let first = s.select(&req("a")).expect("ok").worker;
    // The second identical request sees the first one's load and goes elsewhere.
    let second = s.select(&req("b")).expect("ok").worker;
    assert_ne!(first, second);
    let loads = s.potential_loads(&SchedulingRequest::default());
    assert!(loads.iter().all(|l| l.active_requests == 1
        && l.potential_prefill_tokens == 64
        && l.potential_decode_blocks == 4));
    s.mark_prefill_completed("a").expect("active");
    s.free("b").expect("active");
    let loads = s.potential_loads(&SchedulingRequest::default());
    let by_worker: BTreeMap<_, _> = loads.iter().map(|l| (l.worker, *l)).collect();
    assert_eq!(by_worker[&first].potential_prefill_tokens, 0);
    assert_eq!(by_worker[&first].potential_decode_blocks, 4);
    assert_eq!(by_worker[&second].active_requests, 0);
    assert_eq!(s.free("b"), Err(Error::UnknownRequest("b".into())));
    assert_eq!(
        s.select(&req("a")),
        Err(Error::DuplicateRequest("a".into()))
    );
}

#[test]
fn concurrent_selections_spread_over_workers() {
    let s = std::sync::Arc::new(scheduler(&[1, 2, 3, 4]));
    let blocks = hashes(0..8);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let s = s.clone();
            let blocks = &blocks;
            scope.spawn(move || {
                for i in 0..25 {
                    let id = format!("{t}-{i}");
                    let req = SchedulingRequest {
                        request_id: Some(&id),
                        isl_tokens: 128,
                        seq_hashes: blocks,
                        ..Default::default()
                    };
                    s.select(&req).expect("workers exist");
                }
            });
        }
    });
    let loads = s.potential_loads(&SchedulingRequest::default());
    // Atomic select+book keeps identical requests perfectly balanced.
    assert!(loads.iter().all(|l| l.active_requests == 25), "{loads:?}");
}

#[test]
fn pinned_constraints_and_busy_workers() {
    let s = Scheduler::with_rng(
        16,
        KvRouterConfig::default(),
        LoadThresholds {
            active_prefill_tokens_threshold: Some(100),
            ..Default::default()
        },
        fastrand::Rng::with_seed(3),
    )
    .expect("valid");
    assert_eq!(
        s.select(&SchedulingRequest::default()),
        Err(Error::NoWorkers)
    );
    s.upsert_worker(w(1), ["gpu".to_owned()].into(), WorkerCapacity::default());
    s.upsert_worker(w(2), BTreeSet::new(), WorkerCapacity::default());
    let gpu = RoutingConstraints {
        required_taints: ["gpu".to_owned()].into(),
        ..Default::default()
    };
    let tpu = RoutingConstraints {
        required_taints: ["tpu".to_owned()].into(),
        ..Default::default()
    };
    fn with(c: &RoutingConstraints) -> SchedulingRequest<'_> {
        SchedulingRequest {
            constraints: Some(c),
            isl_tokens: 200,
            ..Default::default()
        }
    }
    assert_eq!(s.select(&with(&gpu)).expect("gpu").worker, w(1));
    assert_eq!(s.select(&with(&tpu)), Err(Error::NoEligibleWorkers));
    let pinned = SchedulingRequest {
        pinned: Some(w(2)),
        request_id: Some("p"),
        isl_tokens: 200,
        ..Default::default()
    };
    assert_eq!(s.select(&pinned).expect("pinned").worker, w(2));
    // Worker 2 now has 200 prefill tokens > 100: busy; worker 1 takes the rest.
    let any = SchedulingRequest {
        request_id: Some("q"),
        isl_tokens: 200,
        ..Default::default()
    };
    assert_eq!(s.select(&any).expect("one idle").worker, w(1));
    assert_eq!(
        s.select(&SchedulingRequest::default()),
        Err(Error::AllWorkersBusy { workers: 2 })
    );
    assert!(matches!(
        s.select(&SchedulingRequest {
            pinned: Some(w(9)),
            ..Default::default()
        }),
        Err(Error::UnknownWorker { worker_id: 9, .. })
    ));
    s.remove_worker(1);
    assert_eq!(s.workers(), vec![w(2)]);
    assert_eq!(s.free("q"), Err(Error::UnknownRequest("q".into())));
}

#[test]
fn overrides_apply_only_to_their_request() {
    let s = scheduler(&[1, 2]);
    let ov = overlaps(&[(1, 10)]);
    let o = RouterConfigOverride {
        overlap_score_credit: Some(0.0),
        ..Default::default()
    };
    let req = |overrides| SchedulingRequest {
        isl_tokens: 160,
        overlaps: Some(&ov),
        overrides,
        ..Default::default()
    };
    let with: BTreeMap<_, _> = s.costs(&req(Some(&o))).expect("ok").into_iter().collect();
    let without: BTreeMap<_, _> = s.costs(&req(None)).expect("ok").into_iter().collect();
    assert_eq!(with[&w(1)], 10.0);
    assert_eq!(without[&w(1)], 0.0);
    let bad = RouterConfigOverride {
        router_temperature: Some(-1.0),
        ..Default::default()
    };
    assert!(matches!(
        s.select(&req(Some(&bad))),
        Err(Error::InvalidConfig { .. })
    ));
}

#[test]
fn queue_decision_follows_threshold() {
    let config = KvRouterConfig {
        router_queue_threshold: Some(1.0),
        ..Default::default()
    };
    let s = Scheduler::new(16, config, LoadThresholds::default()).expect("valid");
    let cap = WorkerCapacity {
        max_num_batched_tokens: Some(100),
        ..Default::default()
    };
    s.upsert_worker(w(1), BTreeSet::new(), cap);
    assert!(!s.must_queue(None));
    let req = SchedulingRequest {
        request_id: Some("r"),
        isl_tokens: 101,
        ..Default::default()
    };
    s.select(&req).expect("ok");
    assert!(s.must_queue(None));
    s.mark_prefill_completed("r").expect("active");
    assert!(!s.must_queue(None));
}

#[test]
fn config_validation_and_json() {
    assert!(KvRouterConfig::default().validate().is_ok());
    let bad = KvRouterConfig {
        decode_active_request_weight: f64::NAN,
        ..Default::default()
    };
    assert_eq!(
        bad.validate().map_err(|e| e.to_string()),
        Err("invalid decode_active_request_weight: must be finite and >= 0, got NaN".into())
    );
    let c =
        KvRouterConfig::from_json(r#"{"router_temperature": 0.5, "router_queue_policy": "wspt"}"#)
            .expect("valid");
    assert_eq!(c.router_temperature, 0.5);
    assert_eq!(c.router_queue_policy, config::QueuePolicy::Wspt);
    assert!(matches!(
        KvRouterConfig::from_json(r#"{"no_such_field": 1}"#),
        Err(Error::InvalidJson(_))
    ));
    assert!(matches!(
        KvRouterConfig::from_json(
            r#"{"router_track_output_blocks": true, "router_track_active_blocks": false}"#
        ),
        Err(Error::InvalidConfig {
            field: "router_track_output_blocks",
            ..
        })
    ));
    let mut c = KvRouterConfig::default();
    c.apply_overlap_score_weight(0.0);
    assert_eq!((c.prefill_load_scale, c.overlap_score_credit), (0.0, 0.0));
}

proptest! {
    /// At temperature 0 the chosen worker has the minimum cost of a brute-force
    /// recomputation, and booking changes nothing for a query-only request.
    #[test]
    fn argmin_matches_brute_force(
        ov in proptest::collection::vec(0u32..12, 1..8),
        active in proptest::collection::vec(0u64..400, 1..8),
        isl in 0usize..400,
    ) {
        let n = ov.len().min(active.len());
        let ids: Vec<u64> = (0..n as u64).collect();
        let s = scheduler(&ids);
        // Give workers prefill load by booking requests that are never freed.
        for (i, &a) in active.iter().take(n).enumerate() {
            let id = format!("bg{i}");
            s.select(&SchedulingRequest {
                request_id: Some(&id),
                isl_tokens: a as usize,
                pinned: Some(w(i as u64)),
                ..Default::default()
            }).expect("pinned");
        }
        let overlap = overlaps(&ids.iter().map(|&i| (i, ov[i as usize])).collect::<Vec<_>>());
        let req = SchedulingRequest { isl_tokens: isl, overlaps: Some(&overlap), ..Default::default() };
        let sel = s.select(&req).expect("workers");
        // Brute force with the documented formula (credit 1, scale 1, no decode blocks).
        let brute = |i: usize| {
            let prefill = (active[i] as f64 + isl as f64) / 16.0;
            (prefill - f64::from(ov[i])).max(0.0) + 0.0 * 1.0 + 0.0
        };
        let min = (0..n).map(brute).fold(f64::INFINITY, f64::min);
        prop_assert!((brute(sel.worker.worker_id as usize) - min).abs() < 1e-9);
        prop_assert!((sel.cost - min).abs() < 1e-9);
    }

    /// Cost never decreases when load grows and never increases when overlap grows.
    #[test]
    fn cost_is_monotone(
        device in 0u32..20, extra in 1u32..5,
        prefill in 0u64..1000, more in 1u64..500,
        blocks in 0u64..50, isl in 0usize..500,
    ) {
        let p = KvRouterConfig::default().effective(None);
        let load = selector::CandidateLoad {
            overlap: TierOverlap { device, ..Default::default() },
            active_prefill_tokens: prefill,
            active_blocks: blocks,
            ..Default::default()
        };
        let base = selector::worker_cost(&p, 16, isl, &load, 0, 1.0);
        let more_overlap = selector::CandidateLoad {
            overlap: TierOverlap { device: device + extra, ..Default::default() },
            ..load
        };
        prop_assert!(selector::worker_cost(&p, 16, isl, &more_overlap, 0, 1.0) <= base);
        let more_load = selector::CandidateLoad {
            active_prefill_tokens: prefill + more,
            active_blocks: blocks + 1,
            ..load
        };
        prop_assert!(selector::worker_cost(&p, 16, isl, &more_load, 0, 1.0) >= base);
    }

    /// Probabilities sum to one and favour cheaper workers.
    #[test]
    fn probabilities_are_a_distribution(
        costs in proptest::collection::vec(0.0f64..100.0, 1..10),
        t in 0.0f64..3.0,
    ) {
        let p = selection_probabilities(&costs, t);
        prop_assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        for i in 0..costs.len() {
            for j in 0..costs.len() {
                if costs[i] < costs[j] {
                    prop_assert!(p[i] >= p[j]);
                }
            }
        }
    }
}

#[test]
fn sampling_matches_softmax_distribution() {
    let costs = [1.0, 2.0, 4.0];
    let t = 0.5;
    let expected = selection_probabilities(&costs, t);
    let mut rng = fastrand::Rng::with_seed(11);
    let n = 60_000;
    let mut counts = [0f64; 3];
    for _ in 0..n {
        counts[selector::sample_index(&costs, t, &mut rng).expect("non-empty")] += 1.0;
    }
    // Chi-square goodness of fit, 2 degrees of freedom: 13.8 is the 0.1% critical value.
    let chi2: f64 = counts
        .iter()
        .zip(&expected)
        .map(|(o, p)| (o - p * n as f64).powi(2) / (p * n as f64))
        .sum();
    assert!(
        chi2 < 13.8,
        "chi2 {chi2}, counts {counts:?}, expected {expected:?}"
    );
}

#[test]
fn avoided_workers_are_chosen_only_when_nothing_else_is_eligible() {
    let s = scheduler(&[1, 2]);
    let ov = overlaps(&[(2, 8)]);
    let blocks = hashes(0..10);
    let req = |avoid: &'static [u64]| SchedulingRequest {
        isl_tokens: 160,
        seq_hashes: &blocks,
        overlaps: Some(&ov),
        avoid,
        ..Default::default()
    };
    // Worker 2 holds the prefix and wins unless avoided (down, or failed this request).
    assert_eq!(s.select(&req(&[])).expect("ok").worker, w(2));
    assert_eq!(s.select(&req(&[2])).expect("ok").worker, w(1));
    // Every worker avoided: the best of them rather than no answer.
    assert_eq!(s.select(&req(&[1, 2])).expect("ok").worker, w(2));
}

#[test]
fn thresholds_can_change_while_routing() {
    let s = scheduler(&[1]);
    let booked = SchedulingRequest {
        request_id: Some("a"),
        isl_tokens: 200,
        ..Default::default()
    };
    assert_eq!(s.select(&booked).expect("no thresholds").worker, w(1));
    // 200 prefill tokens booked on the only worker: a 100-token threshold makes it busy for
    // the very next selection, and lifting the threshold frees it again.
    let strict = LoadThresholds {
        active_prefill_tokens_threshold: Some(100),
        ..Default::default()
    };
    s.set_thresholds(strict).expect("valid");
    assert_eq!(s.thresholds(), strict);
    assert_eq!(
        s.select(&SchedulingRequest::default()),
        Err(Error::AllWorkersBusy { workers: 1 })
    );
    let invalid = LoadThresholds {
        active_decode_blocks_threshold: Some(1.5),
        ..Default::default()
    };
    assert!(matches!(
        s.set_thresholds(invalid),
        Err(Error::InvalidConfig { .. })
    ));
    assert_eq!(
        s.thresholds(),
        strict,
        "a refused change leaves the old ones"
    );
    s.set_thresholds(LoadThresholds::default()).expect("valid");
    assert!(s.select(&SchedulingRequest::default()).is_ok());
}
