//! Tail attribution end to end: the amplification scenario fails with queue
//! wait named as the cause of its excess; the default scenario on a machine
//! whose every core is kept busy passes or is inconclusive (naming the
//! generator or the machine), never fails.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

tests! {
    sync queue_amplification_fails_with_queue_wait_as_the_cause_of_the_excess,
    sync a_busy_machine_is_never_a_failed_mesh,
}

fn shipped(name: &str) -> String {
    let path = format!("{}/../scenarios/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn queue_amplification_fails_with_queue_wait_as_the_cause_of_the_excess() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let text = shipped("queue-amplification.toml");
    let scaled = text.replace("duration = \"10s\"", "duration = \"6s\"");
    assert_ne!(
        scaled, text,
        "the scenario's load keys changed: update this test"
    );
    let scenario = write(dir.path(), "amplification.toml", &scaled);
    let results = dir.path().join("results");
    let out = tailmesh(
        dir.path(),
        &run_args(&scenario, &results, &["--check", "--no-traces"]),
    );
    assert_eq!(out.code(), Some(3), "{}", out.output());
    let run_dir = only_run_dir(&results);
    let summary = summary(&run_dir);
    for v in variants(&summary) {
        let name = str_at(v, "/name");
        let context = format!("{name}: {v:#}\n{}", out.output());
        let c = v.pointer("/compounding").expect("the check ran");
        assert_eq!(str_at(c, "/verdict"), "fail", "{context}");
        let reason = str_at(c, "/reason");
        assert!(
            reason.contains("queue wait at hop worker behind injected-slow requests"),
            "{context}"
        );
        let excess = v
            .pointer("/attribution/excess")
            .and_then(|e| e.as_object())
            .expect("the excess by cause");
        let total: u64 = excess.values().filter_map(|n| n.as_u64()).sum();
        let queue = excess
            .get("queue:worker")
            .and_then(|n| n.as_u64())
            .unwrap_or(0);
        assert!(total > 0, "{context}");
        assert!(
            queue as f64 >= 0.8 * total as f64,
            "queue wait is the primary cause of {queue} of {total}: {context}"
        );
    }
    // requests.csv names the same causes.
    let rows = requests_csv(&run_dir);
    assert!(
        rows.iter().any(|r| r.cause == "queue:worker"),
        "no row attributed to queue:worker"
    );
    assert!(
        rows.iter()
            .all(|r| r.cause.is_empty() || r.latency_ns > 15_000_000),
        "only slow requests have a cause"
    );
    assert!(
        out.stderr.contains("check failed (verdict fail"),
        "{}",
        out.output()
    );
}

/// Busy-loop child processes, one per CPU, each ending by itself after
/// `bound` and killed by PID when dropped (also when the test fails).
struct Hogs(Vec<Child>);

impl Hogs {
    fn start(bound: Duration) -> Hogs {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let script = format!(
            "end=$(( $(date +%s) + {} )); while [ $(date +%s) -lt $end ]; do :; done",
            bound.as_secs()
        );
        Hogs(
            (0..cpus)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", &script])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("spawn a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn a_busy_machine_is_never_a_failed_mesh() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let text = shipped("default.toml");
    let scaled = text
        .replace("duration = \"10s\"", "duration = \"8s\"")
        .replace("warmup = \"1s\"", "warmup = \"500ms\"");
    assert_ne!(
        scaled, text,
        "the scenario's load keys changed: update this test"
    );
    let scenario = write(dir.path(), "default-busy.toml", &scaled);
    let results = dir.path().join("results");
    let started = Instant::now();
    let hogs = Hogs::start(Duration::from_secs(120));
    let out = tailmesh(
        dir.path(),
        &run_args(&scenario, &results, &["--check", "--no-traces"]),
    );
    drop(hogs);
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the run outlasted the busy loops"
    );
    let code = out.code();
    assert!(
        code == Some(0) || code == Some(4),
        "pass (0) or inconclusive (4), never fail: {}",
        out.output()
    );
    let summary = summary(&only_run_dir(&results));
    let v = &variants(&summary)[0];
    let context = format!("{v:#}\n{}", out.output());
    let c = v.pointer("/compounding").expect("the check ran");
    let verdict = str_at(c, "/verdict");
    assert_ne!(verdict, "fail", "{context}");
    if verdict == "inconclusive" {
        let reason = str_at(c, "/reason");
        assert!(
            reason.contains("the machine was busy") || reason.contains("load generator"),
            "an inconclusive verdict names the machine or the generator: {context}"
        );
        assert!(out.stderr.contains("check inconclusive"), "{context}");
    }
    // The self-watch saw the busy loops.
    let busy = v.pointer("/instrument/busy").and_then(|b| b.as_bool());
    assert_eq!(busy, Some(true), "{context}");
}
