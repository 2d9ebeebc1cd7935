//! The instrument under overload: the load generator keeps its own
//! connections whatever the mesh does, and the same scenario and seed give
//! the same kinds of outcome run after run.

use std::collections::BTreeMap;

use crate::support::*;
use serde_json::Value;

tests! {
    sync ten_times_overload_keeps_the_generators_connections_and_its_outcome_kinds,
    sync one_mib_tasks_stop_at_the_brokers_byte_limit_and_memory_stays_bounded,
}

/// One hop, 4 ms of work one request at a time (250/s), offered 2500/s
/// for 4 s with a 10 s deadline: pushed (the replica's wait line holds at
/// most 1000, about 4 s of work: the rest is refused), and pulled (the
/// broker's topic holds them all, and most expire there). About 9000
/// requests are outstanding at the peak, all on one connection.
const OVERLOAD: &str = r#"
name = "overload-10x"
seed = 12

[load]
mode = "open"
rate = 2500
arrivals = "uniform"
duration = "4s"
timeout = "10s"

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
    // The two runs side by side: each is its own run of the scenario, and
    // both meet the same machine, which the comparison below allows for.
    let done: Vec<(Finished, std::path::PathBuf)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|round| {
                let (dir, scenario) = (dir.path(), &scenario);
                s.spawn(move || run_ok(dir, scenario, &dir.join(format!("results-{round}"))))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut runs = Vec::new();
    for (round, (finished, run_dir)) in done.into_iter().enumerate() {
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
            // Pushed, the replica's wait line (1000 requests, 4 s of work)
            // is shorter than the deadline: the overflow is refused.
            // Pulled, the topic holds them all: deadlines pass there.
            let overflow = if name == "push" {
                "resource_exhausted"
            } else {
                "timeout"
            };
            assert!(outcome.contains_key(overflow), "{context}");
            let sent = u64_at(v, "/sent");
            kinds.insert(name, (sent, outcome));
        }
        eprintln!("round {round}: (sent, outcome counts) by variant: {kinds:?}");
        runs.push(kinds);
    }
    // The same kinds both times: every kind that holds 1 % of the requests
    // in one run is there in the other, in a count within 3x (plus 1 % of
    // the requests). The counts follow how many requests a second the hop
    // serves, which a busy machine lowers: each is 4 ms of sleep plus its
    // CPU time, the timer's wake-up and, pulled, the broker's round trip.
    // Measured, answered: pulled, 2000 to 2100 on a quiet machine and 1300
    // to 1450 with two busy loops on the two cores (1.6x: the 1.5x this
    // compared before fails when one run is quiet and the other busy);
    // pushed, 1850 and 1200 to 1700 (the 1000 the replica's line holds
    // are answered whatever the load).
    // Apart by 3x, one run's hop would serve a third of the other's: over
    // 8 ms of delay per request beside its 4 ms of sleep, for seconds on
    // end, from processes that mostly sleep.
    for (variant, (sent, first)) in &runs[0] {
        let (_, second) = &runs[1][variant];
        let floor = sent / 100;
        for (kind, a, b) in first
            .iter()
            .map(|(k, &a)| (k, a, second.get(k).copied().unwrap_or(0)))
            .chain(
                second
                    .iter()
                    .filter(|(k, _)| !first.contains_key(*k))
                    .map(|(k, &b)| (k, 0, b)),
            )
        {
            let (lo, hi) = (a.min(b), a.max(b));
            assert!(
                hi <= floor || lo * 3 + floor >= hi,
                "variant {variant}: {kind} {a} vs {b}: {first:?} vs {second:?}"
            );
        }
    }
}

/// 1 MiB requests at twice a pulled hop's capacity, for long enough that
/// the broker's topic would hold about 600 MiB if it counted tasks only.
const ONE_MIB: &str = r#"
name = "one-mib"
seed = 4

[load]
mode = "open"
rate = 200
arrivals = "uniform"
duration = "3s"
timeout = "5s"
payload = 1048576

[[hop]]
name = "front"
transport = "pull"
concurrency = 1
work = { kind = "sleep", value = "10ms" }

[telemetry]
sampling = 0
"#;

fn one_mib_tasks_stop_at_the_brokers_byte_limit_and_memory_stays_bounded() {
    const MIB: u64 = 1 << 20;
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "one-mib.toml", ONE_MIB);
    let results = dir.path().join("results");
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    let context = format!("{v:#}\n{}", finished.output());
    assert_eq!(v["accounted"], Value::Bool(true), "{context}");
    // The topic stopped at its 64 MiB and refused the rest at once.
    let topic = &v["broker"][0];
    assert!(
        u64_at(topic, "/max_depth_bytes") <= 64 * MIB,
        "queued bytes over the limit\n{context}"
    );
    assert!(u64_at(topic, "/rejected_full") > 0, "{context}");
    assert!(errors(v).contains_key("resource_exhausted"), "{context}");
    // Memory: the broker under its limit plus a fixed margin; the load
    // generator, which shares one payload buffer among its requests, well
    // under the 1 GiB that a copy per request in flight (about 1000)
    // would take (it peaks at 100 to 200 MiB: each task's encoding on its
    // way out, and what the allocator keeps).
    let peak = |process: &str| {
        v["peak_memory"]
            .as_array()
            .and_then(|all| all.iter().find(|m| m["process"] == process))
            .map(|m| u64_at(m, "/peak_rss_bytes"))
            .unwrap_or_else(|| panic!("no peak_memory for {process}\n{context}"))
    };
    assert!(peak("broker") < 64 * MIB + 64 * MIB, "{context}");
    assert!(peak("orchestrator") < 512 * MIB, "{context}");
}
