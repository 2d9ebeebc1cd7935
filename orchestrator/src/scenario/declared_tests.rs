//! The end-to-end latency a scenario declares
//! (`tailmesh_analysis::declared`), for scenarios written as files: these
//! tests need the parser, which stays in the orchestrator, so they live
//! beside it.

use std::time::Duration;

use super::{Hop, Variant, parse};
use crate::analysis::{Declared, Dist, Grid, Undeclared, declared, declared_in_force};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// The variant of a scenario file made of `load` (the `[load]` table's
/// body) and `hops` (the `[[hop]]` tables).
fn variant(load: &str, hops: &str) -> Variant {
    let text =
        format!("name = \"t\"\n[load]\n{load}\n{hops}\n[check]\nslow_threshold = \"15ms\"\n");
    let s = parse(&text, "test").unwrap_or_else(|e| panic!("{e}"));
    s.variants.into_iter().next().expect("a variant")
}

const LOAD: &str = "mode = \"open\"\nrate = 10\nduration = \"10s\"\ntimeout = \"100ms\"";

fn predict(v: &Variant, overhead: Duration) -> Declared {
    let grid = Grid::for_horizon(v.load.timeout);
    declared(v, grid, &|_| Dist::point(grid, overhead)).expect("declared")
}

fn close(got: Option<Duration>, want: Duration, tol: Duration, what: &str) {
    let got = got.unwrap_or_else(|| panic!("{what}: beyond"));
    let diff = got.abs_diff(want);
    assert!(
        diff <= tol,
        "{what}: {got:?}, expected {want:?} within {tol:?}"
    );
}

fn near(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got}, expected {want} within {tol}"
    );
}

#[test]
fn a_chain_of_two_uniform_hops_has_the_triangles_quantiles() {
    let uniform = "work = { kind = \"sleep\", dist = \"uniform\", min = \"0ms\", max = \"10ms\" }";
    let v = variant(
        LOAD,
        &format!("[[hop]]\nname = \"a\"\n{uniform}\n[[hop]]\nname = \"b\"\n{uniform}\n"),
    );
    let d = predict(&v, ms(1)).dist;
    // 2 ms of overhead plus the sum of two U[0, 10 ms]: a triangle.
    for q in [0.1f64, 0.5, 0.9, 0.99] {
        let x = if q <= 0.5 {
            10.0 * (2.0 * q).sqrt()
        } else {
            20.0 - 10.0 * (2.0 * (1.0 - q)).sqrt()
        };
        close(
            d.quantile(q),
            Duration::from_secs_f64((2.0 + x) / 1000.0),
            us(5),
            &format!("q{q}"),
        );
    }
    assert_eq!(d.beyond(), 0.0);
}

#[test]
fn a_fan_out_waits_for_the_slowest_of_its_leaves() {
    let k = 4;
    let mut hops = format!(
        "[[hop]]\nname = \"root\"\ndownstream = [{}]\n",
        (0..k)
            .map(|i| format!("\"l{i}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for i in 0..k {
        hops.push_str(&format!(
            "[[hop]]\nname = \"l{i}\"\nwork = {{ kind = \"sleep\", dist = \"exp\", mean = \"1ms\" }}\n"
        ));
    }
    let d = predict(&variant(LOAD, &hops), Duration::ZERO).dist;
    // P(max <= x) = (1 - e^(-x / m))^k.
    for q in [0.5, 0.9, 0.99] {
        let x = -(1.0 - f64::powf(q, 1.0 / k as f64)).ln();
        close(
            d.quantile(q),
            Duration::from_secs_f64(x / 1000.0),
            us(5),
            &format!("q{q}"),
        );
    }
    // One leaf alone is far faster: the fan-out is what the test sees.
    assert!(d.quantile(0.5) > Some(ms(1)), "{:?}", d.quantile(0.5));
}

const BIMODAL: &str = "work = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }\nslow = { probability = 0.1, extra = \"50ms\" }";

#[test]
fn a_hedge_after_a_delay_cuts_the_slow_mode() {
    let plain = predict(
        &variant(LOAD, &format!("[[hop]]\nname = \"a\"\n{BIMODAL}\n")),
        Duration::ZERO,
    )
    .dist;
    close(plain.quantile(0.95), ms(51), us(5), "unhedged p95");
    let v = variant(
        LOAD,
        &format!("[[hop]]\nname = \"a\"\n{BIMODAL}\nclient = {{ hedge_after = \"10ms\" }}\n"),
    );
    let d = predict(&v, Duration::ZERO).dist;
    // 0.9 at 1 ms; 0.09 at 10 + 1 ms (the hedge); 0.01 at 51 ms (both
    // slow: the first answers first).
    near(d.cdf(ms(2)), 0.9, 1e-9, "fast");
    near(d.cdf(ms(12)), 0.99, 1e-9, "hedged");
    close(d.quantile(0.95), ms(11), us(5), "p95");
    close(d.quantile(0.995), ms(51), us(5), "p99.5");
}

#[test]
fn retries_are_a_mixture_over_the_failed_attempts() {
    let hop = "[[hop]]\nname = \"a\"\nwork = { kind = \"sleep\", dist = \"fixed\", value = \"2ms\" }\nerror = { probability = 0.1, code = \"unavailable\" }\n";
    let v = variant(
        LOAD,
        &format!("{hop}client = {{ retries = 2, retry_budget = 1.0 }}\n"),
    );
    let p = predict(&v, Duration::ZERO);
    // Each attempt takes 2 ms, failed or not.
    near(p.dist.cdf(ms(3)), 0.9, 1e-9, "first attempt");
    near(p.dist.cdf(ms(5)), 0.99, 1e-9, "second");
    near(p.dist.cdf(ms(7)), 0.999, 1e-9, "third");
    near(p.dist.beyond(), 0.001, 1e-9, "all three failed");
    assert!(p.assumptions.is_empty(), "{:?}", p.assumptions);
    // A budget of 0.05 retries per call against 0.1 failures: half
    // of them are retried.
    let v = variant(
        LOAD,
        &format!("{hop}client = {{ retries = 1, retry_budget = 0.05 }}\n"),
    );
    let p = predict(&v, Duration::ZERO);
    near(p.dist.cdf(ms(5)), 0.9 + 0.05 * 0.9, 1e-9, "budgeted");
    near(p.dist.beyond(), 0.05 + 0.05 * 0.1, 1e-9, "not retried");
    assert!(
        p.assumptions
            .iter()
            .any(|a| a.contains("budget") && a.contains("50 %")),
        "{:?}",
        p.assumptions
    );
}

#[test]
fn a_per_attempt_timeout_retries_the_late_attempts() {
    let v = variant(
        LOAD,
        "[[hop]]\nname = \"a\"\nwork = { kind = \"sleep\", dist = \"uniform\", min = \"0ms\", max = \"10ms\" }\nclient = { timeout = \"5ms\", retries = 1, retry_budget = 1.0 }\n",
    );
    let d = predict(&v, Duration::ZERO).dist;
    // Half answer before 5 ms; the other half is retried at 5 ms, and
    // half of those answer within their 5 ms.
    near(d.cdf(ms(5)), 0.5, 1e-3, "first attempt");
    near(d.cdf(ms(10) + us(2)), 0.75, 1e-3, "retry");
    near(d.beyond(), 0.25, 1e-3, "both late");
    // 0.6 is 0.1 into the retry's 0.25 spread over 5 ms: 2 ms in.
    close(d.quantile(0.6), ms(7), us(10), "within the retry");
}

#[test]
fn an_injected_error_lands_beyond() {
    let work = "work = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }";
    for code in ["internal", "unavailable"] {
        let v = variant(
            LOAD,
            &format!(
                "[[hop]]\nname = \"a\"\n{work}\n[[hop]]\nname = \"b\"\n{work}\nerror = {{ probability = 0.2, code = \"{code}\" }}\n"
            ),
        );
        let d = predict(&v, Duration::ZERO).dist;
        near(d.beyond(), 0.2, 1e-9, code);
        near(d.cdf(ms(3)), 0.8, 1e-9, code);
    }
}

#[test]
fn a_windowed_slowness_mixes_by_its_share_of_the_run() {
    let v = variant(
        LOAD,
        "[[hop]]\nname = \"a\"\nwork = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }\nslow = { probability = 1.0, extra = \"10ms\", start = \"2s\", duration = \"3s\" }\n",
    );
    let d = predict(&v, Duration::ZERO).dist;
    // 3 s of 10: 30 % slow.
    near(d.cdf(ms(5)), 0.7, 1e-9, "outside the window");
    close(d.quantile(0.9), ms(11), us(5), "inside");
    let grid = Grid::for_horizon(v.load.timeout);
    let zero = |_: &Hop| Dist::zero(grid);
    let during = declared_in_force(&v, grid, &zero, &|l| l == "slow a").expect("declared");
    near(during.dist.cdf(ms(5)), 0.0, 1e-9, "during");
    let before = declared_in_force(&v, grid, &zero, &|_| false).expect("declared");
    near(before.dist.cdf(ms(5)), 1.0, 1e-9, "before");
}

#[test]
fn a_closed_loop_sends_fewer_requests_while_slowed() {
    let v = variant(
        "mode = \"closed\"\nconcurrency = 1\nduration = \"10s\"\ntimeout = \"100ms\"",
        "[[hop]]\nname = \"a\"\nwork = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }\nslow = { probability = 1.0, extra = \"9ms\", start = \"5s\" }\n",
    );
    let d = predict(&v, Duration::ZERO).dist;
    // 5 s at 1 ms a request, then 5 s at 10 ms: 5000 fast, 500 slow.
    near(d.cdf(ms(5)), 5000.0 / 5500.0, 1e-3, "fast share");
}

#[test]
fn cpu_work_is_undeclared_and_names_the_hop() {
    let v = variant(
        LOAD,
        "[[hop]]\nname = \"a\"\n[[hop]]\nname = \"hasher\"\nwork = { kind = \"cpu\", min_rounds = 1, max_rounds = 9 }\n",
    );
    let grid = Grid::for_horizon(v.load.timeout);
    let err = declared(&v, grid, &|_| Dist::zero(grid)).expect_err("cpu work");
    assert_eq!(
        err,
        Undeclared::CpuWork {
            hop: "hasher".into()
        }
    );
    assert!(err.to_string().contains("\"hasher\""), "{err}");
}

#[test]
fn a_service_hop_is_undeclared_and_names_the_hop() {
    let v = variant(
        LOAD,
        "[[hop]]\nname = \"a\"\n[[hop]]\nname = \"real\"\n[hop.service]\naddress = \"127.0.0.1:9\"\nmethod = \"p.S/M\"\n",
    );
    let grid = Grid::for_horizon(v.load.timeout);
    let err = declared(&v, grid, &|_| Dist::zero(grid)).expect_err("a service");
    assert_eq!(err, Undeclared::Service { hop: "real".into() });
    assert!(err.to_string().contains("[hop.service]"), "{err}");
}

#[test]
fn a_busy_hop_is_named_with_its_utilization() {
    let v = variant(
        "mode = \"open\"\nrate = 360\nduration = \"10s\"\ntimeout = \"100ms\"",
        "[[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\nconcurrency = 1\nwork = { kind = \"sleep\", dist = \"fixed\", value = \"2ms\" }\n",
    );
    let p = predict(&v, Duration::ZERO);
    assert!(
        p.assumptions
            .iter()
            .any(|a| a.starts_with("hop b at 72 % utilization")),
        "{:?}",
        p.assumptions
    );
}

#[test]
fn a_slow_replica_is_a_mixture_in_equal_shares() {
    let v = variant(
        LOAD,
        "[[hop]]\nname = \"a\"\nreplicas = 4\nwork = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }\nreplica_slow = { replica = 0, factor = 10.0 }\n",
    );
    let d = predict(&v, Duration::ZERO).dist;
    near(d.cdf(ms(2)), 0.75, 1e-9, "fast replicas");
    close(d.quantile(0.9), ms(10), us(5), "the slow replica");
}

#[test]
fn a_fan_out_fails_with_the_code_of_its_first_failing_call() {
    let leaf = "work = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }";
    let hops = format!(
        "[[hop]]\nname = \"root\"\ndownstream = [\"l1\", \"l2\"]\nclient = {{ retries = 1, retry_budget = 10.0 }}\n\
         [[hop]]\nname = \"l1\"\n{leaf}\nerror = {{ probability = 0.1, code = \"internal\" }}\n\
         [[hop]]\nname = \"l2\"\n{leaf}\nerror = {{ probability = 0.2, code = \"unavailable\" }}\n"
    );
    let d = predict(&variant(LOAD, &hops), Duration::ZERO).dist;
    // Both ok: 0.72. l1 fails first (internal, not retried): 0.1. l1
    // ok and l2 fails (unavailable): 0.18, retried once from the root.
    near(d.cdf(ms(2)), 0.72, 1e-9, "first attempt");
    near(d.cdf(ms(4)), 0.72 + 0.18 * 0.72, 1e-9, "the retry");
    near(d.beyond(), 1.0 - 0.72 * 1.18, 1e-9, "failed");
}

#[test]
fn a_delayed_replica_delays_each_crossing_of_its_link() {
    let work = "work = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }";
    let v = variant(
        LOAD,
        &format!(
            "[[hop]]\nname = \"a\"\n{work}\nnet = {{ delay = \"5ms\", loss = 0.01 }}\n[[hop]]\nname = \"b\"\n{work}\n"
        ),
    );
    let p = predict(&v, Duration::ZERO);
    // Reaching a: 2 x 5 ms; a calling b: 2 x 5 ms more; 2 ms of work.
    close(p.dist.quantile(0.5), ms(22), us(5), "p50");
    assert!(
        p.assumptions
            .iter()
            .any(|a| a.contains("1 % packet loss not modelled")),
        "{:?}",
        p.assumptions
    );
    // With jitter, each crossing is uniform within delay +- jitter.
    let v = variant(
        LOAD,
        &format!("[[hop]]\nname = \"a\"\n{work}\nnet = {{ delay = \"5ms\", jitter = \"5ms\" }}\n"),
    );
    let d = predict(&v, Duration::ZERO).dist;
    // 1 ms + the sum of two U[0, 10 ms]: a triangle around 11 ms.
    close(d.quantile(0.5), ms(11), us(5), "median");
    near(d.cdf(ms(1)), 0.0, 1e-9, "nothing faster than the work");
}

#[test]
fn a_generators_delayed_link_delays_its_share_of_the_requests() {
    let hop =
        "[[hop]]\nname = \"a\"\nwork = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }\n";
    // Generator 1 of 4 has 5 ms on its link: a quarter of the requests
    // cross it twice (request and answer).
    let v = variant(
        &format!(
            "{LOAD}\ngenerators = 4\ngenerator_net = {{ generator = 1, delay = \"5ms\", loss = 0.02 }}"
        ),
        hop,
    );
    let p = predict(&v, Duration::ZERO);
    near(
        p.dist.cdf(ms(2)),
        0.75,
        1e-9,
        "the other generators' requests",
    );
    close(
        p.dist.quantile(0.9),
        ms(11),
        us(5),
        "the delayed generator's",
    );
    assert!(
        p.assumptions
            .iter()
            .any(|a| a.contains("a load generator's link: 2 % packet loss not modelled")),
        "{:?}",
        p.assumptions
    );
    // Every generator's link, for half the run: half the requests.
    let v = variant(
        &format!("{LOAD}\ngenerators = 2\nnet = {{ delay = \"5ms\", start = \"5s\" }}"),
        hop,
    );
    let d = predict(&v, Duration::ZERO).dist;
    near(d.cdf(ms(2)), 0.5, 1e-9, "before the window");
    close(d.quantile(0.9), ms(11), us(5), "in the window");
}

#[test]
fn entries_are_a_mixture_by_their_shares_and_load_their_hops_by_them() {
    // 70 % enter at a (1 ms, then db's 2 ms), 30 % at b (10 ms, then db):
    // db takes every request, a and b their shares.
    let fixed =
        |v: &str| format!("work = {{ kind = \"sleep\", dist = \"fixed\", value = \"{v}\" }}");
    let v = variant(
        "mode = \"open\"\nrate = 200\nduration = \"10s\"\ntimeout = \"100ms\"\n\
         entries = [{ hop = \"a\", weight = 7 }, { hop = \"b\", weight = 3 }]",
        &format!(
            "[[hop]]\nname = \"a\"\ndownstream = [\"db\"]\n{}\n\
             [[hop]]\nname = \"b\"\ndownstream = [\"db\"]\n{}\n\
             [[hop]]\nname = \"db\"\nconcurrency = 1\n{}\n",
            fixed("1ms"),
            fixed("10ms"),
            fixed("2ms")
        ),
    );
    let p = predict(&v, Duration::ZERO);
    close(p.dist.quantile(0.5), ms(3), us(150), "p50");
    close(p.dist.quantile(0.69), ms(3), us(150), "p69");
    close(p.dist.quantile(0.71), ms(12), us(150), "p71");
    // db is busy 200/s x 2 ms: 40 %; b 60/s x 10 ms: 60 % (a 14 %).
    let u = |hop: &str| {
        let mut v = v.clone();
        for h in &mut v.hops {
            if h.name == hop {
                h.concurrency = Some(1);
            }
        }
        predict(&v, Duration::ZERO)
            .assumptions
            .into_iter()
            .find(|a| a.starts_with(&format!("hop {hop} at")))
    };
    assert_eq!(u("db"), None, "40 % is under the threshold");
    assert!(
        u("b").is_some_and(|a| a.starts_with("hop b at 60 % utilization")),
        "{:?}",
        u("b")
    );
}
