//! Overload and queue disciplines end to end: the real binary offering a
//! worker twice what it can serve, the same scenario and seed run with a
//! fifo and an adaptive queue, pushed and pulled, compared within one run.

use crate::support::*;
use serde_json::Value;

tests! {
    sync adaptive_keeps_the_answered_tail_bounded_under_overload_where_fifo_does_not,
}

/// 400 requests/s into a worker that serves about 200/s (5 ms, one at a
/// time), for 2.5 s with a 500 ms timeout: a fifo queue fills until every
/// answered request has waited most of the timeout; the adaptive one sheds
/// what waited over its target and answers fresh requests.
const OVERLOAD: &str = r#"
name = "overload-small"
seed = 5

[load]
mode = "open"
rate = 400
duration = "2500ms"
warmup = "300ms"
timeout = "500ms"

[[hop]]
name = "front"

[[hop]]
name = "worker"
concurrency = 1
work = { kind = "sleep", dist = "fixed", value = "5ms" }

[[variant]]
name = "push-fifo"

[[variant]]
name = "push-adaptive"
set = { "hop.worker.discipline" = "adaptive" }

[[variant]]
name = "pull-fifo"
set = { "hop.worker.transport" = "pull" }

[[variant]]
name = "pull-adaptive"
set = { "hop.worker.transport" = "pull", "hop.worker.discipline" = "adaptive" }

[check]
max_error_rate = 1.0

[telemetry]
sampling = 0.0
"#;

fn adaptive_keeps_the_answered_tail_bounded_under_overload_where_fifo_does_not() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "overload-small.toml", OVERLOAD);
    let results = dir.path().join("results");
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
    let summary = summary(&run_dir);
    let context = format!("{summary:#}\n{}", finished.output());
    let by_name = variants_by_name(&summary);
    for v in by_name.values() {
        let (sent, ok, timeouts) = (u64_at(v, "/sent"), u64_at(v, "/ok"), u64_at(v, "/timeouts"));
        let failed: u64 = errors(v).values().sum::<u64>() + timeouts;
        assert_eq!(sent, ok + failed, "every request accounted for:\n{context}");
        // Overloaded: a good part of what was offered cannot be served.
        assert!(failed * 5 > sent, "not overloaded:\n{context}");
    }
    let p90 = |name: &str| u64_at(by_name[name], "/latency/p90_us");
    let ok = |name: &str| u64_at(by_name[name], "/ok");
    for transport in ["push", "pull"] {
        let (fifo, adaptive) = (format!("{transport}-fifo"), format!("{transport}-adaptive"));
        // fifo answers only what waited most of the timeout; adaptive
        // answers what waited about its target. (p90: in a run this short
        // on a busy machine, its p99 is a handful of requests served in a
        // fifo phase or behind a stalled process; bench/overload.sh
        // measures the p99.)
        assert!(
            p90(&adaptive) * 3 < p90(&fifo),
            "{transport}: p90 adaptive {} us vs fifo {} us:\n{context}",
            p90(&adaptive),
            p90(&fifo)
        );
        // And it does not buy the tail with goodput.
        assert!(
            ok(&adaptive) * 10 >= ok(&fifo) * 9,
            "{transport}: ok adaptive {} vs fifo {}:\n{context}",
            ok(&adaptive),
            ok(&fifo)
        );
    }

    // Push: the worker's shed requests are its resource_exhausted errors.
    let worker_errors = |name: &str| -> u64 {
        by_name[name]
            .pointer("/hops")
            .and_then(Value::as_array)
            .and_then(|hops| hops.iter().find(|h| h["hop"] == "worker"))
            .and_then(|h| h.pointer("/errors/resource_exhausted"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    assert!(worker_errors("push-adaptive") > 0, "{context}");
    assert_eq!(worker_errors("push-fifo"), 0, "{context}");

    // Pull: the broker names each topic's discipline and counts its sheds.
    let topic = |name: &str| -> &Value {
        by_name[name]
            .pointer("/broker")
            .and_then(Value::as_array)
            .and_then(|topics| topics.iter().find(|t| t["topic"] == "worker"))
            .unwrap_or_else(|| panic!("{name}: no broker topic worker:\n{context}"))
    };
    assert_eq!(str_at(topic("pull-fifo"), "/discipline"), "fifo");
    assert_eq!(u64_at(topic("pull-fifo"), "/shed"), 0, "{context}");
    assert_eq!(str_at(topic("pull-adaptive"), "/discipline"), "adaptive");
    assert!(u64_at(topic("pull-adaptive"), "/shed") > 0, "{context}");
    // Shed tasks are answered RESOURCE_EXHAUSTED (the broker counts the
    // warmup's too).
    let exhausted = errors(by_name["pull-adaptive"])
        .get("resource_exhausted")
        .copied()
        .unwrap_or(0);
    assert!(
        exhausted > 0 && exhausted <= u64_at(topic("pull-adaptive"), "/shed"),
        "{context}"
    );
}
