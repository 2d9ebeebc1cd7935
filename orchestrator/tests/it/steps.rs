//! Load steps: an open loop that changes rate step by step sends each
//! step's share at its rate, from the step's own start, by the intended
//! send times of requests.csv (the measured clock).

use serde_json::Value;

use crate::support::*;

tests! {
    sync each_load_step_sends_its_rate_for_its_duration,
}

/// The steps: (rate per second, seconds).
const STEPS: [(f64, f64); 3] = [(100.0, 1.0), (200.0, 1.0), (300.0, 1.0)];

fn each_load_step_sends_its_rate_for_its_duration() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    // Warmup at the first step's rate is not in requests.csv; the steps
    // start at 0 on its clock.
    let scenario = write(
        dir.path(),
        "steps.toml",
        r#"
name = "steps"
seed = 8

[load]
mode = "open"
arrivals = "uniform"
warmup = "500ms"
steps = [
  { rate = 100, duration = "1s" },
  { rate = 200, duration = "1s" },
  { rate = 300, duration = "1s" },
]

[[hop]]
name = "a"

[[variant]]
name = "uniform"

[[variant]]
name = "poisson"
set = { "load.arrivals" = "poisson" }
"#,
    );
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &dir.path().join("results"));

    let text = std::fs::read_to_string(run_dir.join("requests.csv")).expect("read requests.csv");
    let mut rows = csv_rows(&text).into_iter();
    assert_eq!(
        rows.next().map(|h| h.join(",")).as_deref(),
        Some(CSV_HEADER)
    );
    // Sends per variant and step, by intended time.
    let mut counts: std::collections::BTreeMap<String, [u64; 3]> = Default::default();
    let ends: Vec<f64> = STEPS
        .iter()
        .scan(0.0, |end, (_, d)| {
            *end += d;
            Some(*end)
        })
        .collect();
    for f in rows {
        let line = f.join(",");
        let intended_s = f[2]
            .parse::<f64>()
            .unwrap_or_else(|e| panic!("intended_us in {line}: {e}"))
            / 1e6;
        let step = ends
            .iter()
            .position(|end| intended_s < *end)
            .unwrap_or_else(|| panic!("intended past the last step: {line}"));
        counts.entry(f[0].clone()).or_default()[step] += 1;
    }
    let out = finished.output();
    // Uniform: rate x duration, give or take 1 %; Poisson: a count with
    // variance = mean, within 3 sigma.
    let uniform: fn(f64) -> f64 = |mean| 0.01 * mean;
    let poisson: fn(f64) -> f64 = |mean| 3.0 * mean.sqrt();
    for (variant, within) in [("uniform", uniform), ("poisson", poisson)] {
        let got = counts
            .get(variant)
            .unwrap_or_else(|| panic!("no rows of {variant}:\n{out}"));
        for (i, ((rate, d), n)) in STEPS.iter().zip(got).enumerate() {
            let mean = rate * d;
            assert!(
                (*n as f64 - mean).abs() <= within(mean),
                "{variant} step {}: {n} sends, {mean} expected: {got:?}\n{out}",
                i + 1
            );
        }
    }

    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir.join("summary.json")).expect("read summary.json"),
    )
    .expect("summary.json is JSON");
    let variants = summary["variants"].as_array().expect("variants");
    assert_eq!(variants.len(), 2, "{summary:#}");
    for v in variants {
        let load = &v["load"];
        assert_eq!(load["rate"], 100.0, "{load:#}");
        assert_eq!(load["duration_s"], 3.0, "{load:#}");
        let steps: Vec<(f64, f64)> = load["steps"]
            .as_array()
            .expect("load.steps")
            .iter()
            .map(|s| {
                (
                    s["rate"].as_f64().expect("a rate"),
                    s["duration_s"].as_f64().expect("a duration"),
                )
            })
            .collect();
        assert_eq!(steps, STEPS, "{load:#}");
        assert!(
            load["description"]
                .as_str()
                .is_some_and(|d| d.starts_with("open steps 100→200→300/s ")),
            "{load:#}"
        );
    }
}
