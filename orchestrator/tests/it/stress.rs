//! The instrument under overload: the load generator keeps its own
//! connections whatever the mesh does, and the same scenario and seed give
//! the same kinds of outcome run after run.

use std::collections::BTreeMap;

use crate::support::*;
use serde_json::Value;

tests! {
    sync ten_times_overload_keeps_the_generators_connections_and_its_outcome_kinds,
}

/// One hop, 4 ms of work one request at a time (250/s), offered 2500/s
/// for 4 s with a 5 s deadline: pushed (the replica's wait line holds at
/// most 1000), and pulled (the broker's topic holds them all). About 9000
/// requests are outstanding at the peak, all on one connection.
const OVERLOAD: &str = r#"
name = "overload-10x"
seed = 12

[load]
mode = "open"
rate = 2500
arrivals = "uniform"
duration = "4s"
timeout = "5s"

[[hop]]
name = "front"
concurrency = 1
work = { kind = "sleep", value = "4ms" }

[[variant]]
name = "push"

[[variant]]
name = "pull"
set = { "hop.front.transport" = "pull" }

[telemetry]
sampling = 0
"#;

/// Outcome counts of one variant: "ok", "timeout" and each error label.
fn outcome_kinds(v: &Value) -> BTreeMap<String, u64> {
    let mut kinds = errors(v);
    for (kind, pointer) in [("ok", "/ok"), ("timeout", "/timeouts")] {
        let n = u64_at(v, pointer);
        if n > 0 {
            kinds.insert(kind.to_string(), n);
        }
    }
    kinds
}

fn ten_times_overload_keeps_the_generators_connections_and_its_outcome_kinds() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "overload.toml", OVERLOAD);
    let mut runs = Vec::new();
    for round in 0..2 {
        let results = dir.path().join(format!("results-{round}"));
        let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
        let summary = summary(&run_dir);
        let mut kinds = BTreeMap::new();
        for v in variants(&summary) {
            let name = str_at(v, "/name").to_string();
            let context = format!(
                "round {round}, variant {name}:\n{v:#}\n{}",
                finished.output()
            );
            assert_eq!(v["accounted"], Value::Bool(true), "{context}");
            // The generator's own counters: one connection (to the hop, or
            // to the broker), never lost, no call ended by the transport.
            let links = &v["generator_links"];
            for (field, want) in [
                ("opened", 1),
                ("closed", 0),
                ("goaway_received", 0),
                ("goaway_sent", 0),
                ("reset_by_peer", 0),
                ("broken", 0),
            ] {
                assert_eq!(
                    u64_at(links, &format!("/{field}")),
                    want,
                    "generator_links.{field}\n{context}"
                );
            }
            let outcome = outcome_kinds(v);
            // What an overloaded hop does: answers, refuses (push: its wait
            // line is full) or lets the deadline pass; never a transport
            // error of the instrument's making.
            for kind in outcome.keys() {
                assert!(
                    ["ok", "timeout", "resource_exhausted"].contains(&kind.as_str()),
                    "outcome {kind:?}\n{context}"
                );
            }
            assert!(outcome.contains_key("ok"), "{context}");
            // Pushed, the replica's line (1000 requests, 4 s of work) is
            // shorter than the deadline: the overflow is refused, and
            // whether any request in line outlives 5 s depends on the
            // machine. Pulled, the topic holds them all: deadlines pass.
            let overflow = if name == "push" {
                "resource_exhausted"
            } else {
                "timeout"
            };
            assert!(outcome.contains_key(overflow), "{context}");
            kinds.insert(name, outcome);
        }
        runs.push(kinds);
    }
    // The same kinds both times, in counts within the noise of a shared
    // machine (the hop's capacity is what varies).
    for (variant, first) in &runs[0] {
        let second = &runs[1][variant];
        assert_eq!(
            first.keys().collect::<Vec<_>>(),
            second.keys().collect::<Vec<_>>(),
            "variant {variant}: outcome kinds differ between runs: {first:?} vs {second:?}"
        );
        for (kind, &a) in first {
            let b = second[kind];
            let (lo, hi) = (a.min(b) as f64, a.max(b) as f64);
            assert!(
                hi <= lo * 1.5 + 100.0,
                "variant {variant}: {kind} {a} vs {b}: {first:?} vs {second:?}"
            );
        }
    }
}
