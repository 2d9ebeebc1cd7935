//! The composition checked on rows and requests whose composition is known.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use tailmesh_model::policy::Hedge;

use super::*;
use crate::testing::{hop, variant};
use crate::verdict::Verdict;
use correlation::*;
use segments::*;

const MS: u64 = 1_000_000;

/// a -> b -> c, no slowness declared.
fn chain() -> Variant {
    let mut hops = vec![hop("a", None), hop("b", None), hop("c", None)];
    hops[0].downstream = vec!["b".into()];
    hops[1].downstream = vec!["c".into()];
    variant("chain", hops)
}

fn quiet() -> MachineState {
    MachineState {
        busy: false,
        reasons: Vec::new(),
    }
}

fn no_declared(
    _: Grid,
    _: &dyn Fn(usize) -> Dist,
    _: Option<&[String]>,
) -> Result<Dist, Undeclared> {
    Err(Undeclared::CpuWork { hop: "a".into() })
}

fn context(machine: &MachineState) -> CompositionContext<'_> {
    CompositionContext {
        machine,
        check: true,
        tolerance: tailmesh_model::scenario::DEFAULT_DISTRIBUTION_TOLERANCE,
        declare: &no_declared,
        faults: None,
    }
}

/// A row of a plain chain whose latency is the sum of its segments.
fn row(lateness: u64, parts: Vec<[u64; 4]>) -> Row {
    let mut hops: Vec<HopPart> = parts
        .iter()
        .map(|s| HopPart {
            reach: s[0],
            queue: s[1],
            own: s[2],
            rest: s[3],
            call: 0,
            attempts: Vec::new(),
        })
        .collect();
    // Each call is its segments plus the calls below it.
    let mut below = 0;
    for part in hops.iter_mut().rev() {
        part.call = part.reach + part.queue + part.own + part.rest + below;
        below = part.call;
    }
    Row {
        lateness,
        latency: lateness + below,
        hops,
    }
}

fn run(
    variant: &Variant,
    rows: impl IntoIterator<Item = Row>,
    machine: &MachineState,
) -> CompositionReport {
    let mut acc = CompositionAcc::new(variant);
    for r in rows {
        acc.record(Some(r));
    }
    acc.finish(&context(machine)).expect("a composition")
}

fn rel(a: Option<f64>, b: Option<f64>) -> f64 {
    let (a, b) = (a.expect("a value"), b.expect("a value"));
    (a - b).abs() / b
}

#[test]
fn a_row_recomposes_to_its_latency() {
    let v = chain();
    let tree = Tree::of(&v);
    let r = row(
        7_000,
        vec![
            [100_000, 0, MS, 5_000],
            [90_000, 2_000, 3 * MS, 4_000],
            [80_000, 0, 2 * MS, 1_000],
        ],
    );
    assert_eq!(recompose(&tree, &columns(&r)), r.latency);
    // A fan-out waits for its slowest branch.
    let mut fan = vec![hop("root", None), hop("x", None), hop("y", None)];
    fan[0].downstream = vec!["x".into(), "y".into()];
    let tree = Tree::of(&variant("fan", fan));
    let cols = columns(&Row {
        lateness: 0,
        latency: 0,
        hops: vec![
            HopPart {
                own: MS,
                ..HopPart::default()
            },
            HopPart {
                own: 5 * MS,
                ..HopPart::default()
            },
            HopPart {
                own: 2 * MS,
                ..HopPart::default()
            },
        ],
    });
    assert_eq!(recompose(&tree, &cols), 6 * MS);
}

#[test]
fn independent_hops_compose_to_what_was_measured() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let work = Exp::new(1.0 / 2e6).expect("rate");
    let rows: Vec<Row> = (0..30_000)
        .map(|_| {
            let mut part = || {
                [
                    50_000 + rng.random_range(0..20_000),
                    0,
                    work.sample(&mut rng) as u64,
                    10_000,
                ]
            };
            let parts = vec![part(), part(), part()];
            row(rng.random_range(0..5_000), parts)
        })
        .collect();
    let report = run(&chain(), rows, &quiet());
    // The segments shorter than a bin (a queue of 0, 10 µs of rest, a
    // few µs of lateness) keep their means: the composed median is the
    // shuffled one, to the grid's resolution.
    let (c, s) = (report.composed.point.get(0), report.shuffled.get(0));
    assert!(
        rel(c, s) < 0.005,
        "median: composed {c:?} shuffled {s:?}, bin {} µs",
        report.bin_us
    );
    for k in 0..3 {
        let (m, c) = (report.measured.point.get(k), report.composed.point.get(k));
        assert!(
            rel(c, m) < 0.03,
            "quantile {k}: composed {c:?} measured {m:?}"
        );
        assert!(
            rel(report.shuffled.get(k), m) < 0.03,
            "quantile {k}: shuffled {:?} measured {m:?}",
            report.shuffled.get(k)
        );
    }
    let check = report.check.expect("checked");
    assert_eq!(check.verdict, Verdict::Pass, "{}", check.reason);
    assert!(
        report.dependence.correlations.is_empty(),
        "{:?}",
        report.dependence.correlations
    );
    // Intervals hold the points.
    for band in [&report.measured, &report.composed] {
        for k in 0..3 {
            let (lo, p, hi) = (
                band.low.get(k).expect("low"),
                band.point.get(k).expect("p"),
                band.high.get(k).expect("high"),
            );
            assert!(lo <= p * 1.01 && p <= hi * 1.01, "{lo} {p} {hi}");
        }
    }
}

#[test]
fn slowness_shared_by_two_hops_is_named_and_fails_the_check() {
    // A request slow at b is slow at c too: 3 % of requests take 30 ms
    // at both. Independence predicts 30 ms more for about 6 % of
    // requests and 60 ms for 0.09 %: a p99 about 33 ms, where the
    // measured one is 63 ms.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let rows: Vec<Row> = (0..30_000)
        .map(|_| {
            let slow = rng.random::<f64>() < 0.03;
            let extra = if slow { 30 * MS } else { 0 };
            let jitter = |rng: &mut ChaCha8Rng| MS + rng.random_range(0..100_000);
            row(
                1_000,
                vec![
                    [60_000, 0, jitter(&mut rng), 5_000],
                    [60_000, 0, jitter(&mut rng) + extra, 5_000],
                    [60_000, 0, jitter(&mut rng) + extra, 5_000],
                ],
            )
        })
        .collect();
    let report = run(&chain(), rows.clone(), &quiet());
    let check = report.check.clone().expect("checked");
    assert_eq!(check.verdict, Verdict::Fail, "{}", check.reason);
    assert!(check.reason.contains("p99"), "{}", check.reason);
    let top = &report.dependence.correlations[0];
    assert_eq!(
        (top.a.as_str(), top.b.as_str()),
        ("own:b", "own:c"),
        "{:?}",
        report.dependence.correlations
    );
    assert!(top.r > 0.5, "{top:?}");
    assert!(check.reason.contains("own:b and own:c"), "{}", check.reason);
    let excess = report.dependence.excess.p99_us.expect("p99 excess");
    assert!(
        excess > 20_000.0,
        "measured above the prediction by {excess} µs"
    );
    // On a busy machine the same miss is inconclusive, never a fail.
    let busy = MachineState {
        busy: true,
        reasons: vec!["CPU pressure 90 %".into()],
    };
    let check = run(&chain(), rows, &busy).check.expect("checked");
    assert_eq!(check.verdict, Verdict::Inconclusive, "{}", check.reason);
    assert!(check.reason.contains("busy"), "{}", check.reason);
}

#[test]
fn a_hedged_call_is_composed_from_all_its_attempts() {
    // Attempts take 1 ms, or 50 ms one time in ten; the caller hedges
    // after 5 ms. The answer is min(X1, 5 ms + X2): 1 ms 90 %, 6 ms
    // 9 %, 50 ms 1 %. The cancelled attempts are censored: dropping
    // them (the winners only) would see no 50 ms at all.
    let mut hops = vec![hop("front", None), hop("leaf", None)];
    hops[0].downstream = vec!["leaf".into()];
    hops[1].client.hedge = Some(Hedge::After(Duration::from_millis(5)));
    let v = variant("hedged", hops);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let draw = |rng: &mut ChaCha8Rng| {
        if rng.random::<f64>() < 0.1 {
            50 * MS
        } else {
            MS
        }
    };
    let rows: Vec<Row> = (0..40_000)
        .map(|_| {
            let (x1, x2) = (draw(&mut rng), draw(&mut rng));
            let attempts = if x1 <= 5 * MS {
                vec![Attempt {
                    start_ns: 0,
                    took_ns: x1,
                    end: AttemptEnd::Ok,
                }]
            } else if 5 * MS + x2 < x1 {
                vec![
                    Attempt {
                        start_ns: 0,
                        took_ns: 5 * MS + x2,
                        end: AttemptEnd::Cancelled,
                    },
                    Attempt {
                        start_ns: 5 * MS,
                        took_ns: x2,
                        end: AttemptEnd::Ok,
                    },
                ]
            } else {
                vec![
                    Attempt {
                        start_ns: 0,
                        took_ns: x1,
                        end: AttemptEnd::Ok,
                    },
                    Attempt {
                        start_ns: 5 * MS,
                        took_ns: x1 - 5 * MS,
                        end: AttemptEnd::Cancelled,
                    },
                ]
            };
            let call = x1.min(5 * MS + x2);
            Row {
                lateness: 0,
                latency: 10_000 + call,
                hops: vec![
                    HopPart {
                        reach: 10_000,
                        call: 10_000 + call,
                        ..HopPart::default()
                    },
                    HopPart {
                        own: call,
                        call,
                        attempts,
                        ..HopPart::default()
                    },
                ],
            }
        })
        .collect();
    let report = run(&v, rows, &quiet());
    let c = |k| report.composed.point.get(k).expect("composed");
    assert!((c(0) / 1_010.0 - 1.0).abs() < 0.05, "p50 {}", c(0));
    assert!(
        (c(2) / 16_010.0 - 1.0).abs() < 0.02 || (c(2) - 6_010.0).abs() < 300.0,
        "p99 {}",
        c(2)
    );
    assert!((c(3) / 50_010.0 - 1.0).abs() < 0.05, "p99.9 {}", c(3));
    let check = report.check.expect("checked");
    assert_eq!(check.verdict, Verdict::Pass, "{}", check.reason);
}

#[test]
fn failed_requests_are_censored_past_every_latency() {
    let v = chain();
    let mut acc = CompositionAcc::new(&v);
    for _ in 0..980 {
        acc.record(Some(row(
            0,
            vec![[0, 0, MS, 0], [0, 0, MS, 0], [0, 0, MS, 0]],
        )));
    }
    for _ in 0..20 {
        acc.censored();
    }
    acc.record(None);
    let report = acc.finish(&context(&quiet())).expect("composition");
    assert_eq!(
        (report.requests, report.censored, report.incomplete),
        (1000, 20, 1)
    );
    assert!(report.measured.point.p50_us.is_some() && report.composed.point.p50_us.is_some());
    // 2 % failed: p99 and p99.9 lie among them, in both.
    assert_eq!(
        (report.measured.point.p99_us, report.composed.point.p99_us),
        (None, None)
    );
    assert_eq!(report.shuffled.p999_us, None);
    assert_eq!(
        report.declared_note,
        Some(Undeclared::CpuWork { hop: "a".into() }.to_string())
    );
    // Nothing ok: nothing to compose.
    let mut acc = CompositionAcc::new(&v);
    acc.censored();
    assert!(acc.finish(&context(&quiet())).is_none());
}

#[test]
fn a_declared_cause_is_named_before_a_stronger_correlation() {
    let pair = |a: &str, b: &str, r: f64| Correlation {
        a: a.into(),
        b: b.into(),
        r,
    };
    let hops = ["a".to_string(), "b".to_string(), "c".to_string()];
    let found = [
        pair("lateness", "reach:a", 0.6),
        pair("reach:a", "reach:b", 0.5),
        pair("queue:b", "own:a", 0.3),
        pair("own:b", "own:c", 0.2),
    ];
    // c follows b's slowness: that is the cause, though weaker.
    let (source, named) = explain(&found, &[], &[false, false, true], &hops).expect("a source");
    assert_eq!(named, found[3]);
    assert!(source.starts_with("injected slowness follows"), "{source}");
    // Nothing follows: queueing comes next.
    let (source, named) = explain(&found, &[], &[false; 3], &hops).expect("a source");
    assert_eq!(named, found[2]);
    assert!(source.starts_with("queueing"), "{source}");
    // Only negative correlations: no source.
    assert!(explain(&[pair("own:a", "own:b", -0.4)], &[], &[false; 3], &hops).is_none());
}

#[test]
fn a_far_outlier_coarsens_the_grid_and_the_quantiles_it_cannot_place_are_not_judged() {
    // A lost packet's retransmission: one request of 2 000 takes 3 s
    // where the median is 6 ms. The grid spans the 3 s in 16 384 bins
    // (184 µs each), too coarse to judge the median (3 % of it), fine
    // enough for the p99 near 11 ms.
    let mut v = chain();
    v.load.timeout = Duration::from_secs(5);
    let mut rows: Vec<Row> = (0..2_000u64)
        .map(|i| {
            row(
                0,
                vec![
                    [0, 0, MS / 2 + i % 100 * 100_000, 0],
                    [0, 0, MS / 4, 0],
                    [0, 0, MS / 4, 0],
                ],
            )
        })
        .collect();
    rows.push(row(
        0,
        vec![
            [3_000 * MS, 0, MS / 2, 0],
            [0, 0, MS / 4, 0],
            [0, 0, MS / 4, 0],
        ],
    ));
    let report = run(&v, rows, &quiet());
    assert!(report.bin_us > 150.0, "bin {} µs", report.bin_us);
    let check = report.check.expect("checked");
    assert!(
        !check.reason.contains("p50"),
        "p50 is not judged: {}",
        check.reason
    );
    assert!(check.reason.contains("p99"), "p99 is: {}", check.reason);
}

#[test]
fn requests_entering_at_two_hops_compose_as_the_mixture_of_their_entries() {
    // 70 % enter at a (1 ms of own time), 30 % at b (10 ms), both leaves.
    let mut v = variant("entries", vec![hop("a", None), hop("b", None)]);
    v.load.entries = vec![
        tailmesh_model::scenario::Entry {
            hop: "a".into(),
            share: 0.2,
        },
        tailmesh_model::scenario::Entry {
            hop: "b".into(),
            share: 0.8,
        },
    ];
    let mut acc = CompositionAcc::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (mut at_a, mut latencies) = (0u32, Vec::new());
    for id in 0..4_000u64 {
        let (name, own) = if rng.random::<f64>() < 0.7 {
            at_a += 1;
            ("a", MS)
        } else {
            ("b", 10 * MS)
        };
        let own = own + rng.random_range(0..MS / 10);
        let mut h = crate::testing::hop_record(name, 0, 0, false);
        h.service_ns = own;
        h.total_ns = own + 20_000;
        let took = h.total_ns + 50_000;
        let start = Duration::from_nanos(id * 10 * MS);
        acc.observe(&RequestRecord {
            id,
            intended: start,
            start,
            end: start + Duration::from_nanos(took),
            outcome: Outcome::Ok,
            path: vec![h],
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        });
        latencies.push(took);
    }
    // Every request read, whichever its entry.
    assert_eq!(acc.incomplete, 0);
    assert_eq!(
        acc.counts.entered,
        [u64::from(at_a), 4_000 - u64::from(at_a)]
    );
    let machine = quiet();
    let r = acc.finish(&context(&machine)).expect("composed");
    latencies.sort_unstable();
    let measured = |q: f64| latencies[((q * latencies.len() as f64) as usize).min(3_999)] as f64;
    // The measured shares weigh the mixture, not the declared ones: the
    // median is an a request's, p90 a b request's.
    for (q, got) in [
        (0.5, r.composed.point.p50_us),
        (0.9, r.composed.point.p90_us),
    ] {
        let want = measured(q) / 1_000.0;
        let got = got.expect("within the grid");
        assert!(
            (got - want).abs() / want < 0.05,
            "q{q}: composed {got} µs, measured {want} µs"
        );
    }
}
