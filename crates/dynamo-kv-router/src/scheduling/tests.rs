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

/// One step of [`dense_overlaps_decide_like_the_map`].
#[derive(Debug, Clone)]
enum DenseOp {
    /// Register (or update) a rank.
    Upsert(u64, u32),
    /// Remove every rank of a worker (its slots are reused by later ranks).
    Remove(u64),
    /// A decision with these `(worker, dp_rank, device overlap)` entries (unregistered
    /// ranks and repeated ranks included), booked under an id when `book`, with this
    /// temperature override and, possibly, a pin or an avoided worker.
    Decide {
        overlaps: Vec<(u64, u32, u32)>,
        isl: usize,
        book: bool,
        temperature: f64,
        pin: Option<(u64, u32)>,
        avoid: Option<u64>,
    },
    /// Free the oldest booking.
    Free,
    /// The oldest booking generates an output block.
    Output,
    /// A peer's booking of these blocks on a rank (replacing the key's previous one).
    Remote(u8, u64, u32, Vec<u64>),
    /// A peer frees its booking.
    FreeRemote(u8),
}

fn dense_op() -> impl Strategy<Value = DenseOp> {
    prop_oneof![
        (0u64..10, 0u32..2).prop_map(|(w, r)| DenseOp::Upsert(w, r)),
        (0u64..10).prop_map(DenseOp::Remove),
        (
            proptest::collection::vec((0u64..12, 0u32..2, 0u32..9), 0..24),
            0usize..200,
            any::<bool>(),
            prop_oneof![Just(0.0), Just(0.7)],
            proptest::option::weighted(0.15, (0u64..12, 0u32..2)),
            proptest::option::weighted(0.15, 0u64..12),
        )
            .prop_map(|(overlaps, isl, book, temperature, pin, avoid)| {
                DenseOp::Decide {
                    overlaps,
                    isl,
                    book,
                    temperature,
                    pin,
                    avoid,
                }
            }),
        Just(DenseOp::Free),
        Just(DenseOp::Output),
        (
            0u8..3,
            0u64..12,
            0u32..2,
            proptest::collection::vec(0u64..9, 0..6)
        )
            .prop_map(|(k, w, r, b)| DenseOp::Remote(k, w, r, b)),
        (0u8..3).prop_map(DenseOp::FreeRemote),
    ]
}

proptest! {
    /// The dense path (`device_overlaps`, spread into the scheduler's per-slot buffer) gives
    /// the same selections, costs and potential loads as the map path (`overlaps`, the list
    /// collected into a map) on a twin scheduler with the same random seed, through rank
    /// registrations, removals (slot reuse), bookings and frees.
    #[test]
    fn dense_overlaps_decide_like_the_map(ops in proptest::collection::vec(dense_op(), 1..60)) {
        let twin = || Scheduler::with_rng(
            4,
            KvRouterConfig::default(),
            LoadThresholds::default(),
            fastrand::Rng::with_seed(9),
        ).expect("valid config");
        let (by_map, by_list) = (twin(), twin());
        let mut booked = std::collections::VecDeque::new();
        let mut next = 0u32;
        for op in ops {
            match op {
                DenseOp::Upsert(id, rank) => {
                    for s in [&by_map, &by_list] {
                        s.upsert_worker(WorkerWithDpRank::new(id, rank), BTreeSet::new(), WorkerCapacity::default());
                    }
                }
                DenseOp::Remove(id) => {
                    for s in [&by_map, &by_list] {
                        s.remove_worker(id);
                    }
                    booked.retain(|(_, w): &(String, WorkerWithDpRank)| w.worker_id != id);
                }
                DenseOp::Free => {
                    if let Some((id, _)) = booked.pop_front() {
                        prop_assert!(by_map.free(&id).is_ok());
                        prop_assert!(by_list.free(&id).is_ok());
                    }
                }
                DenseOp::Output => {
                    if let Some((id, _)) = booked.front() {
                        prop_assert!(by_map.add_output_block_decayed(id, None).is_ok());
                        prop_assert!(by_list.add_output_block_decayed(id, None).is_ok());
                    }
                }
                DenseOp::Remote(k, id, rank, blocks) => {
                    let record = replica_sync::BookingRecord {
                        request_id: format!("peer{k}"),
                        worker: WorkerWithDpRank::new(id, rank),
                        blocks: blocks.into_iter().map(SequenceHash).collect(),
                        prefill_tokens: 8,
                    };
                    let key = format!("remote{k}");
                    prop_assert_eq!(by_map.book_remote(&key, &record), by_list.book_remote(&key, &record));
                }
                DenseOp::FreeRemote(k) => {
                    for s in [&by_map, &by_list] {
                        s.free_remote(&format!("remote{k}"));
                    }
                }
                DenseOp::Decide { overlaps, isl, book, temperature, pin, avoid } => {
                    let list: Vec<(WorkerWithDpRank, u32)> = overlaps
                        .iter()
                        .map(|&(id, rank, d)| (WorkerWithDpRank::new(id, rank), d))
                        .collect();
                    let map: FxHashMap<WorkerWithDpRank, TierOverlap> = list
                        .iter()
                        .map(|&(w, device)| (w, TierOverlap { device, ..Default::default() }))
                        .collect();
                    let seq: Vec<SequenceHash> = (0..(isl / 4) as u64).map(|b| SequenceHash(b % 7)).collect();
                    let rid = format!("r{next}");
                    next += 1;
                    let avoid: Vec<u64> = avoid.into_iter().collect();
                    let overrides = RouterConfigOverride {
                        router_temperature: Some(temperature),
                        ..Default::default()
                    };
                    let base = SchedulingRequest {
                        request_id: book.then_some(rid.as_str()),
                        isl_tokens: isl,
                        seq_hashes: &seq,
                        overrides: Some(&overrides),
                        pinned: pin.map(|(id, rank)| WorkerWithDpRank::new(id, rank)),
                        avoid: &avoid,
                        ..Default::default()
                    };
                    let with_map = SchedulingRequest { overlaps: Some(&map), ..base };
                    let with_list = SchedulingRequest { device_overlaps: Some(&list), ..base };
                    prop_assert_eq!(
                        by_map.costs(&SchedulingRequest { request_id: None, ..with_map }),
                        by_list.costs(&SchedulingRequest { request_id: None, ..with_list })
                    );
                    prop_assert_eq!(
                        by_map.potential_loads(&with_map),
                        by_list.potential_loads(&with_list)
                    );
                    for &(w, _) in &list {
                        prop_assert_eq!(
                            by_map.potential_load_of(w, &with_map),
                            by_list.potential_load_of(w, &with_list)
                        );
                    }
                    // The reverse index of booked blocks against each worker's own set.
                    let all = by_list.potential_loads(&with_list);
                    for l in &all {
                        prop_assert_eq!(Some(*l), by_list.potential_load_of(l.worker, &with_list));
                    }
                    let (a, b) = (by_map.select(&with_map), by_list.select(&with_list));
                    prop_assert_eq!(&a, &b);
                    if let (Ok(sel), true) = (a, book) {
                        booked.push_back((rid, sel.worker));
                    }
                }
            }
            // Between decisions the dense buffer is all zero again.
            prop_assert!(by_list.lock().dense.iter().all(|&d| d == 0));
            prop_assert!(by_list.holders_consistent());
        }
    }
}

/// One step of [`per_slot_arrays_decide_like_the_map_of_workers`].
#[derive(Debug, Clone)]
enum SoaOp {
    /// Register (or update) a rank with these taints (bits of `["a", "b"]`) and capacity.
    Upsert(u64, u32, u8, Option<u64>, Option<u64>),
    /// Remove every rank of a worker.
    Remove(u64),
    /// A rank reports its KV usage.
    Used(u64, u32, Option<u64>),
    /// New busy thresholds (prefill tokens, fraction of the batch, decode-block fraction).
    Thresholds(Option<u64>, Option<f64>, Option<f64>),
    /// A decision.
    Decide {
        overlaps: Vec<(u64, u32, u32)>,
        by_map: bool,
        blocks: Vec<u64>,
        isl: usize,
        book: bool,
        temperature: f64,
        reuse: bool,
        track_prefill: bool,
        required: u8,
        preferred: u8,
        pin: Option<(u64, u32)>,
        avoid: Vec<u64>,
    },
    /// Prefill of the oldest booking completed.
    Prefilled,
    /// Free the oldest booking.
    Free,
    /// The newest booking generates an output block (decayed with `Some`).
    Output(Option<f64>),
    /// A peer's booking on a rank.
    Remote(u8, u64, u32, Vec<u64>),
}

fn soa_op() -> impl Strategy<Value = SoaOp> {
    prop_oneof![
        2 => (0u64..9, 0u32..2, 0u8..4, proptest::option::of(1u64..64), proptest::option::of(16u64..400))
            .prop_map(|(w, r, t, total, batch)| SoaOp::Upsert(w, r, t, total, batch)),
        1 => (0u64..9).prop_map(SoaOp::Remove),
        1 => (0u64..9, 0u32..2, proptest::option::of(0u64..64)).prop_map(|(w, r, u)| SoaOp::Used(w, r, u)),
        1 => (
            proptest::option::weighted(0.3, 0u64..300),
            proptest::option::weighted(0.3, 0.0f64..2.0),
            proptest::option::weighted(0.3, 0.0f64..1.0),
        )
            .prop_map(|(t, f, d)| SoaOp::Thresholds(t, f, d)),
        6 => (
            (
                proptest::collection::vec((0u64..10, 0u32..2, 0u32..9), 0..20),
                any::<bool>(),
                proptest::collection::vec(0u64..12, 0..12),
                0usize..200,
                any::<bool>(),
            ),
            (
                prop_oneof![Just(0.0), Just(0.5)],
                any::<bool>(),
                any::<bool>(),
                prop_oneof![4 => Just(0u8), 1 => 1u8..4],
                prop_oneof![4 => Just(0u8), 1 => 1u8..4],
                proptest::option::weighted(0.1, (0u64..10, 0u32..2)),
                proptest::collection::vec(0u64..10, 0..3),
            ),
        )
            .prop_map(
                |(
                    (overlaps, by_map, blocks, isl, book),
                    (temperature, reuse, track_prefill, required, preferred, pin, avoid),
                )| SoaOp::Decide {
                    overlaps,
                    by_map,
                    blocks,
                    isl,
                    book,
                    temperature,
                    reuse,
                    track_prefill,
                    required,
                    preferred,
                    pin,
                    avoid,
                },
            ),
        1 => Just(SoaOp::Prefilled),
        1 => Just(SoaOp::Free),
        1 => proptest::option::weighted(0.3, 0.0f64..1.0).prop_map(SoaOp::Output),
        1 => (0u8..3, 0u64..10, 0u32..2, proptest::collection::vec(0u64..12, 0..6))
            .prop_map(|(k, w, r, b)| SoaOp::Remote(k, w, r, b)),
    ]
}

fn taint_set(bits: u8) -> BTreeSet<String> {
    ["a", "b"]
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, t)| (*t).to_owned())
        .collect()
}

proptest! {
    /// The per-slot struct-of-arrays evaluation decides exactly like the evaluation over
    /// the map of worker states it replaced (kept as a test model): twin schedulers with the
    /// same seed, one forced onto the model, give the same candidates, costs, selections
    /// and errors through registrations (slot reuse), taints, capacities, usage reports,
    /// thresholds, constraints, pins, avoided workers, bookings, prefill completions,
    /// output blocks (decayed), frees and peers' bookings; the per-slot figures mirror
    /// every worker's own tracker after each step.
    #[test]
    fn per_slot_arrays_decide_like_the_map_of_workers(ops in proptest::collection::vec(soa_op(), 1..80)) {
        let config = KvRouterConfig {
            overlap_score_credit_decay: 0.5,
            decode_active_request_weight: 0.25,
            ..Default::default()
        };
        let twin = || Scheduler::with_rng(
            4,
            config.clone(),
            LoadThresholds::default(),
            fastrand::Rng::with_seed(11),
        ).expect("valid config");
        let (fast, model) = (twin(), twin());
        model.set_naive(true);
        let both = [&fast, &model];
        let mut booked: std::collections::VecDeque<(String, WorkerWithDpRank)> = Default::default();
        let mut next = 0u32;
        // An index's slots for the listed ranks (given to `fast` only): slots reused after
        // a rank leaves the index, a new epoch at every change. The index forgets the ranks
        // of even worker ids when the schedulers do; it keeps those of odd ones, as an
        // index does that still holds blocks of a worker the scheduler dropped.
        let mut index: FxHashMap<WorkerWithDpRank, u32> = FxHashMap::default();
        let mut index_free: Vec<u32> = Vec::new();
        let mut index_len = 0u32;
        let mut epoch = crate::indexer::IndexSlots::next_epoch();
        for op in ops {
            match op {
                SoaOp::Upsert(id, rank, t, total, batch) => {
                    for s in both {
                        s.upsert_worker(WorkerWithDpRank::new(id, rank), taint_set(t), WorkerCapacity {
                            total_kv_blocks: total,
                            max_num_batched_tokens: batch,
                            kv_used_blocks: None,
                        });
                    }
                }
                SoaOp::Remove(id) => {
                    for s in both {
                        s.remove_worker(id);
                    }
                    booked.retain(|(_, w)| w.worker_id != id);
                    if id.is_multiple_of(2) {
                        index.retain(|w, slot| {
                            let keep = w.worker_id != id;
                            if !keep {
                                index_free.push(*slot);
                            }
                            keep
                        });
                        epoch = crate::indexer::IndexSlots::next_epoch();
                    }
                }
                SoaOp::Used(id, rank, used) => {
                    for s in both {
                        s.set_kv_used_blocks(WorkerWithDpRank::new(id, rank), used);
                    }
                }
                SoaOp::Thresholds(t, f, d) => {
                    let th = LoadThresholds {
                        active_prefill_tokens_threshold: t,
                        active_prefill_tokens_threshold_frac: f,
                        active_decode_blocks_threshold: d,
                    };
                    for s in both {
                        prop_assert!(s.set_thresholds(th).is_ok());
                    }
                }
                SoaOp::Prefilled => {
                    if let Some((id, _)) = booked.front() {
                        prop_assert!(fast.mark_prefill_completed(id).is_ok());
                        prop_assert!(model.mark_prefill_completed(id).is_ok());
                    }
                }
                SoaOp::Free => {
                    if let Some((id, _)) = booked.pop_front() {
                        prop_assert!(fast.free(&id).is_ok());
                        prop_assert!(model.free(&id).is_ok());
                    }
                }
                SoaOp::Output(decay) => {
                    if let Some((id, _)) = booked.back() {
                        prop_assert!(fast.add_output_block_decayed(id, decay).is_ok());
                        prop_assert!(model.add_output_block_decayed(id, decay).is_ok());
                    }
                }
                SoaOp::Remote(k, id, rank, blocks) => {
                    let record = replica_sync::BookingRecord {
                        request_id: format!("peer{k}"),
                        worker: WorkerWithDpRank::new(id, rank),
                        blocks: blocks.into_iter().map(SequenceHash).collect(),
                        prefill_tokens: 12,
                    };
                    let key = format!("remote{k}");
                    prop_assert_eq!(fast.book_remote(&key, &record), model.book_remote(&key, &record));
                }
                SoaOp::Decide {
                    overlaps, by_map, blocks, isl, book, temperature, reuse, track_prefill,
                    required, preferred, pin, avoid,
                } => {
                    let list: Vec<(WorkerWithDpRank, u32)> = overlaps
                        .iter()
                        .map(|&(id, rank, d)| (WorkerWithDpRank::new(id, rank), d))
                        .collect();
                    let slots: Vec<u32> = list
                        .iter()
                        .map(|(w, _)| {
                            *index.entry(*w).or_insert_with(|| {
                                epoch = crate::indexer::IndexSlots::next_epoch();
                                index_free.pop().unwrap_or_else(|| {
                                    index_len += 1;
                                    index_len - 1
                                })
                            })
                        })
                        .collect();
                    let index_slots = crate::indexer::IndexSlots { slots, epoch };
                    let map: FxHashMap<WorkerWithDpRank, TierOverlap> = overlaps
                        .iter()
                        .map(|&(id, rank, d)| {
                            (WorkerWithDpRank::new(id, rank), TierOverlap { device: d, host: d / 2, disk: d / 3, shared: 0 })
                        })
                        .collect();
                    let seq: Vec<SequenceHash> = blocks.into_iter().map(SequenceHash).collect();
                    let constraints = RoutingConstraints {
                        required_taints: taint_set(required),
                        preferred_taints: taint_set(preferred)
                            .into_iter()
                            .zip([1.5, -0.75])
                            .collect(),
                    };
                    let overrides = RouterConfigOverride {
                        router_temperature: Some(temperature),
                        assume_kv_reuse: Some(reuse),
                        track_prefill_tokens: Some(track_prefill),
                        ..Default::default()
                    };
                    let rid = format!("r{next}");
                    next += 1;
                    let req = SchedulingRequest {
                        request_id: book.then_some(rid.as_str()),
                        isl_tokens: isl,
                        seq_hashes: &seq,
                        overlaps: by_map.then_some(&map),
                        device_overlaps: (!by_map).then_some(list.as_slice()),
                        overrides: Some(&overrides),
                        constraints: Some(&constraints),
                        pinned: pin.map(|(id, rank)| WorkerWithDpRank::new(id, rank)),
                        avoid: &avoid,
                        index_slots: None,
                    };
                    // The fast path with the index's slots most of the time, the model
                    // never (it looks every listed rank up).
                    let req_fast = SchedulingRequest {
                        index_slots: (!next.is_multiple_of(4)).then_some(&index_slots),
                        ..req
                    };
                    let query = SchedulingRequest { request_id: None, ..req };
                    prop_assert_eq!(
                        fast.costs(&SchedulingRequest { request_id: None, ..req_fast }),
                        model.costs(&query)
                    );
                    let (a, b) = (fast.select(&req_fast), model.select(&req));
                    prop_assert_eq!(&a, &b);
                    if let (Ok(sel), true) = (a, book) {
                        booked.push_back((rid, sel.worker));
                    }
                }
            }
            prop_assert!(fast.holders_consistent());
            prop_assert!(model.holders_consistent());
        }
    }
}
