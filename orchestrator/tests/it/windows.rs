//! Fault windows without root: application-level faults with a `start`
//! and a `duration`, set and cleared at runtime through each hop's Control
//! service under the local launcher, on the measured clock (from the end of
//! warmup, the clock of requests.csv).

use serde_json::Value;

use crate::support::*;

tests! {
    sync a_slowness_window_slows_the_requests_intended_inside_it,
}

/// Seconds either side of a window's edges where requests are not judged:
/// a fault lands a few milliseconds (plus the Control call) after its
/// planned time, and a request is judged by when it was meant to be sent.
const EDGE_S: f64 = 0.5;

fn a_slowness_window_slows_the_requests_intended_inside_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    // A 1 s warmup: a window applied on the load's own clock (warmup
    // included) would open 1 s early and slow requests before 2 s.
    let scenario = write(
        dir.path(),
        "window.toml",
        r#"
name = "window"
seed = 4

[load]
mode = "open"
rate = 150
warmup = "1s"
duration = "6s"

[[hop]]
name = "a"

[[hop]]
name = "b"
slow = { probability = 1.0, extra = "50ms", start = "2s", duration = "2s" }
"#,
    );
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &dir.path().join("results"));

    let text = std::fs::read_to_string(run_dir.join("requests.csv")).expect("read requests.csv");
    let mut rows = csv_rows(&text).into_iter();
    assert_eq!(
        rows.next().map(|h| h.join(",")).as_deref(),
        Some(CSV_HEADER)
    );
    let (mut inside, mut outside) = (0, 0);
    for f in rows {
        let line = f.join(",");
        let intended_s = f[2]
            .parse::<f64>()
            .unwrap_or_else(|e| panic!("intended_us in {line}: {e}"))
            / 1e6;
        let slowed_at_b = f[7].split(';').any(|h| h == "b");
        assert_eq!(f[6], "ok", "every request answered: {line}");
        if (2.0 + EDGE_S..4.0 - EDGE_S).contains(&intended_s) {
            inside += 1;
            assert!(
                slowed_at_b,
                "intended inside the window, not slowed: {line}"
            );
        } else if !(2.0 - EDGE_S..4.0 + EDGE_S).contains(&intended_s) {
            outside += 1;
            assert!(!slowed_at_b, "intended outside the window, slowed: {line}");
        }
    }
    // 150/s: 1 s clearly inside, 3 s clearly outside.
    assert!(inside >= 140, "{inside} requests inside the window");
    assert!(outside >= 420, "{outside} requests outside the window");

    let summary = summary(&run_dir);
    let window = summary
        .pointer("/variants/0/fault_windows/0")
        .unwrap_or_else(|| panic!("no fault window in summary.json:\n{summary:#}"));
    assert_eq!(window["hop"], "b");
    assert_eq!(window["kind"], "slow");
    assert_eq!(window["start_s"].as_f64(), Some(2.0));
    assert_eq!(window["end_s"].as_f64(), Some(4.0));
    let at = |key: &str| {
        window[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key} in {window:#}"))
    };
    // Applied when its time came, never before; cleared after its end.
    assert!(at("applied_at_s") >= 2.0, "{window:#}");
    assert!(at("cleared_at_s") >= 4.0, "{window:#}");
    assert!(at("cleared_at_s") > at("applied_at_s"), "{window:#}");
    assert_eq!(
        summary.pointer("/variants/0/fault_windows/1"),
        None::<&Value>,
        "one window on one replica"
    );
    assert_phases(&summary["variants"][0]);
    assert!(
        !finished.output().contains("fault not"),
        "{}",
        finished.output()
    );
}

/// The run's phases: before, during and after the window, by intended send
/// time; every request in one of them; the tail up during the window
/// only; a recovery judged after it, against the before phase.
fn assert_phases(v: &Value) {
    let (phases, p99) = before_during_after(v, "slow b");
    let edges: Vec<(f64, f64)> = phases
        .iter()
        .map(|p| {
            (
                p["start_s"].as_f64().unwrap_or(-1.0),
                p["end_s"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect();
    assert_eq!(edges, [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)], "{phases:#?}");
    // 50 ms of injected slowness on every request during the window: well
    // above what a busy machine adds to the tail of a debug build (23 ms
    // p99 seen with a build running beside it).
    assert!(
        p99[1] > p99[0] && p99[1] > p99[2] && p99[1] >= 50_000,
        "p99 before, during, after: {p99:?}"
    );
    let recovery = &phases[2]["recovery"];
    // 300 requests on each side: enough for the rule to judge (on a busy
    // machine the after phase's tail may stay above the band, which the
    // rule then says).
    let status = recovery["status"].as_str().unwrap_or_default();
    assert!(
        ["recovered", "not_recovered"].contains(&status),
        "{recovery:#}"
    );
    if status == "recovered" {
        let s = recovery["recovery_s"].as_f64().unwrap_or(-1.0);
        assert!((0.0..2.0).contains(&s), "{recovery:#}");
    }
}
