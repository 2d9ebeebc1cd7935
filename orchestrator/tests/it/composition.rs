//! The whole tail composed from the hops' segments, against the measured
//! one, through a real mesh: slowness tied across hops (`slow.follow`) is
//! what an independent composition cannot predict, and the distribution
//! check says so and names it; work drawn from measured quantiles is what
//! the hop does and what the prediction reads; calls made in stages, with a
//! probability and a count, vary the path per request, and the composition
//! and the compounding check follow each path; requests that enter at
//! several hops, by their weights, compose as their entries' mixture.

use serde_json::Value;

use crate::support::*;

tests! {
    sync slowness_tied_across_hops_is_what_the_independent_prediction_misses,
    sync empirical_work_is_drawn_and_declared_as_its_quantiles_say,
    sync paths_that_vary_are_drawn_per_request_and_composed_as_a_mixture,
    sync requests_enter_at_several_hops_by_their_weights,
}

fn f64_at(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer} in:\n{v:#}"))
}

/// Runs `scenario`, checks that its one variant sent more than 500
/// requests and every one was ok, and returns the variant's summary, the
/// stdout and each request's path records as requests.csv lists them
/// (`hop/replica...`, post order: the entry's last).
fn run_every_request_ok(
    dir: &std::path::Path,
    scenario: &std::path::Path,
) -> (Value, String, Vec<Vec<String>>) {
    let (finished, run_dir) = run_ok(dir, scenario, &dir.join("results"));
    let summary = summary(&run_dir);
    let v = summary
        .pointer("/variants/0")
        .unwrap_or_else(|| panic!("no variant:\n{summary:#}"))
        .clone();
    let (sent, ok) = (f64_at(&v, "/sent"), f64_at(&v, "/ok"));
    assert!(sent > 500.0 && ok == sent, "sent {sent}, ok {ok}:\n{v:#}");
    let csv = std::fs::read_to_string(run_dir.join("requests.csv")).expect("requests.csv");
    let header: Vec<&str> = csv.lines().next().unwrap_or_default().split(',').collect();
    let path_col = header
        .iter()
        .position(|h| *h == "path")
        .unwrap_or_else(|| panic!("no path column in {header:?}"));
    let paths = csv
        .lines()
        .skip(1)
        .map(|line| {
            let path = line.split(',').nth(path_col).unwrap_or_default();
            path.split(';').map(str::to_owned).collect()
        })
        .collect();
    (v, finished.stdout, paths)
}

fn slowness_tied_across_hops_is_what_the_independent_prediction_misses() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    // b and c are each slow 4 % of the time by 40 ms. Independent, both
    // are slow for 0.3 % of requests and the p99 is about 40 ms above the
    // median; tied (c slow whenever b was), 4 % are slow at both and the
    // p99 is about 80 ms above it.
    let scenario = write(
        dir.path(),
        "tied.toml",
        r#"
name = "tied"
seed = 8

[load]
mode = "open"
rate = 200
warmup = "1s"
duration = "8s"

[[hop]]
name = "a"

[[hop]]
name = "b"
slow = { probability = 0.04, extra = "40ms" }

[[hop]]
name = "c"
slow = { probability = 0.04, extra = "40ms" }

[check]
distribution = true

[[variant]]
name = "independent"

[[variant]]
name = "tied"
set = { "hop.c.slow.follow" = 1.0 }
"#,
    );
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &dir.path().join("results"));
    let summary = summary(&run_dir);
    let composition = |v: usize| {
        summary
            .pointer(&format!("/variants/{v}/composition"))
            .unwrap_or_else(|| panic!("no composition for variant {v}:\n{summary:#}"))
            .clone()
    };
    let (independent, tied) = (composition(0), composition(1));
    for c in [&independent, &tied] {
        // Every ok request had every hop and every caller's timing.
        assert_eq!(u64_at(c, "/incomplete"), 0, "{c:#}");
        assert!(u64_at(c, "/requests") >= 1500, "{c:#}");
        let (m, p) = (f64_at(c, "/measured/p50_us"), f64_at(c, "/composed/p50_us"));
        assert!(
            (p / m - 1.0).abs() < 0.25,
            "the medians agree: measured {m}, composed {p}"
        );
    }
    let excess = |c: &Value| f64_at(c, "/dependence/excess_share/p99_us");
    assert!(
        excess(&tied) > excess(&independent) + 0.3,
        "tied slowness lifts the measured p99 above the composed one: {} against {}",
        excess(&tied),
        excess(&independent)
    );
    let verdict = tied
        .pointer("/check/verdict")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no verdict:\n{tied:#}"));
    let reason = tied
        .pointer("/check/reason")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // A busy machine makes it inconclusive, never a pass; either way the
    // reason names the tie.
    assert!(
        verdict == "fail" || verdict == "inconclusive",
        "{verdict}: {reason}"
    );
    assert!(
        reason.contains("p99"),
        "the reason names the quantile: {reason}"
    );
    assert!(
        reason.contains("slow.follow"),
        "the reason names the dependence: {reason}"
    );
    assert!(
        finished.stdout.contains("tied: distribution:"),
        "the terminal states the verdict:\n{}",
        finished.output()
    );
}

fn empirical_work_is_drawn_and_declared_as_its_quantiles_say() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    // b's own time: uniform 2-3 ms half the time, 3-20 ms for the next
    // 40 %, 20-30 ms for the last 10 %: median 3 ms, p99 29 ms.
    let scenario = write(
        dir.path(),
        "empirical.toml",
        r#"
name = "empirical"
seed = 5

[load]
mode = "open"
rate = 150
warmup = "1s"
duration = "6s"

[[hop]]
name = "a"

[[hop]]
name = "b"
work = { kind = "sleep", dist = "empirical", quantiles = { p0 = "2ms", p50 = "3ms", p90 = "20ms", p100 = "30ms" } }

[check]
distribution = true
"#,
    );
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &dir.path().join("results"));
    let summary = summary(&run_dir);
    let c = summary
        .pointer("/variants/0/composition")
        .unwrap_or_else(|| panic!("no composition:\n{summary:#}"));
    let own_b = c
        .pointer("/segments")
        .and_then(Value::as_array)
        .and_then(|s| {
            s.iter()
                .find(|s| s.pointer("/segment").and_then(Value::as_str) == Some("own:b"))
        })
        .unwrap_or_else(|| panic!("no own:b segment:\n{c:#}"));
    // The hop slept as drawn: its own time's quantiles are the declared
    // ones (plus a sleep's overshoot, well under a millisecond).
    let (p50, p99) = (f64_at(own_b, "/p50_us"), f64_at(own_b, "/p99_us"));
    assert!(
        (3000.0..4000.0).contains(&p50),
        "own:b p50 {p50} us:\n{c:#}"
    );
    assert!(
        (26_000.0..31_000.0).contains(&p99),
        "own:b p99 {p99} us:\n{c:#}"
    );
    // The prediction reads the same quantiles: the declared whole tail has
    // b's p99 in it, and agrees with the measured one.
    let (declared, measured) = (f64_at(c, "/declared/p99_us"), f64_at(c, "/measured/p99_us"));
    assert!(declared >= 29_000.0, "declared p99 {declared} us:\n{c:#}");
    assert!(
        (declared / measured - 1.0).abs() < 0.15,
        "declared p99 {declared} us, measured {measured} us:\n{c:#}"
    );
    assert!(
        finished.stdout.contains("distribution:"),
        "the terminal states the verdict:\n{}",
        finished.output()
    );
}

fn paths_that_vary_are_drawn_per_request_and_composed_as_a_mixture() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    // a calls b, then, on 30 % of the requests, c twice one after another:
    // about 2 ms for 70 % of the requests, 2 + 3 + 3 ms for the others.
    let scenario = write(
        dir.path(),
        "paths.toml",
        r#"
name = "paths"
seed = 3

[load]
mode = "open"
rate = 150
warmup = "1s"
duration = "6s"

[[hop]]
name = "a"
downstream = [["b"], [{ hop = "c", probability = 0.3, count = 2 }]]

[[hop]]
name = "b"
work = { kind = "sleep", dist = "fixed", value = "2ms" }
slow = { probability = 0.05, extra = "20ms" }

[[hop]]
name = "c"
work = { kind = "sleep", dist = "fixed", value = "3ms" }
slow = { probability = 0.1, extra = "20ms" }

[check]
distribution = true
compounding = true
slow_threshold = "16ms"
"#,
    );
    let (v, stdout, paths) = run_every_request_ok(dir.path(), &scenario);
    // Each request drew its own path: c was visited twice on about 30 %.
    let (mut with_c, mut rows) = (0u32, 0u32);
    for path in &paths {
        let cs = path.iter().filter(|r| r.starts_with("c/")).count();
        assert!(cs == 0 || cs == 2, "c visited {cs} times: {path:?}");
        with_c += u32::from(cs == 2);
        rows += 1;
    }
    let share = f64::from(with_c) / f64::from(rows);
    assert!(
        (0.25..0.35).contains(&share),
        "{with_c} of {rows} requests called c"
    );
    // The composition reads every request (none incomplete) as a mixture
    // of its paths, and agrees with the measured tail; the declared one too.
    let c = v
        .pointer("/composition")
        .unwrap_or_else(|| panic!("no composition:\n{v:#}"));
    assert_eq!(f64_at(c, "/incomplete"), 0.0, "{c:#}");
    for q in ["p50", "p90"] {
        let (measured, composed, declared) = (
            f64_at(c, &format!("/measured/{q}_us")),
            f64_at(c, &format!("/composed/{q}_us")),
            f64_at(c, &format!("/declared/{q}_us")),
        );
        for (what, x) in [("composed", composed), ("declared", declared)] {
            assert!(
                (x / measured - 1.0).abs() < 0.15,
                "{what} {q} {x} us, measured {measured} us:\n{c:#}"
            );
        }
    }
    // The compounding model is the paths' mixture: 0.05 on a path without
    // c, 1 - 0.95 x 0.9^2 on one with c twice.
    let model = f64_at(&v, "/compounding/declared_model");
    let want = share * (1.0 - 0.95 * 0.81) + (1.0 - share) * 0.05;
    assert!(
        (model - want).abs() < 0.02,
        "declared model {model}, want {want}:\n{v:#}"
    );
    assert!(stdout.contains("compounding"), "{stdout}");
}

fn requests_enter_at_several_hops_by_their_weights() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    // 70 % of the requests enter at front (1 ms), 30 % at admin (8 ms);
    // both call db (2 ms): about 3 ms for most, 10 ms for the others.
    let scenario = write(
        dir.path(),
        "entries.toml",
        r#"
name = "entries"
seed = 4

[load]
mode = "open"
rate = 150
warmup = "1s"
duration = "6s"
entries = [{ hop = "front", weight = 7 }, { hop = "admin", weight = 3 }]

[[hop]]
name = "front"
downstream = ["db"]
work = { kind = "sleep", dist = "fixed", value = "1ms" }

[[hop]]
name = "admin"
downstream = ["db"]
work = { kind = "sleep", dist = "fixed", value = "8ms" }

[[hop]]
name = "db"
work = { kind = "sleep", dist = "fixed", value = "2ms" }

[check]
distribution = true
"#,
    );
    let (v, _, paths) = run_every_request_ok(dir.path(), &scenario);
    // Each request entered at one hop, drawn by the weights; its path is
    // that entry's, db's record first.
    let (mut front, mut rows) = (0u32, 0u32);
    for path in &paths {
        let entry = path.last().map(String::as_str).unwrap_or_default();
        assert!(
            path.len() == 2 && path[0].starts_with("db/"),
            "one entry, then db: {path:?}"
        );
        assert!(
            entry.starts_with("front/") || entry.starts_with("admin/"),
            "{path:?}"
        );
        front += u32::from(entry.starts_with("front/"));
        rows += 1;
    }
    let share = f64::from(front) / f64::from(rows);
    assert!(
        (0.64..0.76).contains(&share),
        "{front} of {rows} requests entered at front"
    );
    // The composition is the entries' mixture and agrees with the measured
    // latency; so does the declared one.
    let c = v
        .pointer("/composition")
        .unwrap_or_else(|| panic!("no composition:\n{v:#}"));
    assert_eq!(f64_at(c, "/incomplete"), 0.0, "{c:#}");
    for q in ["p50", "p90"] {
        let measured = f64_at(c, &format!("/measured/{q}_us"));
        for what in ["composed", "declared"] {
            let x = f64_at(c, &format!("/{what}/{q}_us"));
            assert!(
                (x / measured - 1.0).abs() < 0.15,
                "{what} {q} {x} us, measured {measured} us:\n{c:#}"
            );
        }
    }
}
