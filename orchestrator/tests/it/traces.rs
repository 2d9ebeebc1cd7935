//! Traces end to end: the real binary on a mixed push/pull chain, its
//! `traces.jaeger.json` checked span by span against requests.csv, its
//! spans forwarded to a second receiver started here, and an unreachable
//! forward target that must not fail the run.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
};

use crate::support::*;
use serde_json::Value;
use tailmesh::traces::collector::ReceiverThread;

tests! {
    sync mixed_push_pull_run_is_one_trace_per_request_and_forwards_every_span,
    sync unreachable_forward_target_neither_fails_nor_slows_the_run,
    sync no_traces_writes_no_trace_file_and_no_breakdown,
    sync failed_requests_have_error_spans_from_the_failing_hop_up,
    sync partial_sampling_traces_only_the_sampled_requests_end_to_end,
    sync the_jaeger_file_keeps_exactly_the_tail_and_a_share_and_the_breakdown_sees_every_path,
    sync fan_out_and_pulled_hop_traces_are_complete_and_well_formed,
    sync a_traced_run_states_its_observer_cost,
    sync held_spans_are_sent_for_kept_traces_only_and_a_too_small_hold_loses_some,
}

const MIXED: &str = r#"
name = "mixed"
seed = 3
[load]
mode = "open"
rate = 100
requests = 40
timeout = "2s"
[[hop]]
name = "a"
work = { kind = "sleep", dist = "fixed", value = "200us" }
[[hop]]
name = "b"
transport = "pull"
work = { kind = "sleep", dist = "fixed", value = "200us" }
slow = { probability = 0.2, extra = "2ms" }
[[hop]]
name = "c"
replicas = 2
work = { kind = "sleep", dist = "fixed", value = "200us" }
"#;

/// The requests of MIXED and the spans each one's trace must have.
const REQUESTS: usize = 40;
const SPANS_PER_TRACE: usize = 7;

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn mixed_push_pull_run_is_one_trace_per_request_and_forwards_every_span() {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), "mixed.toml", MIXED);
    let second = ReceiverThread::start(1_000_000, None, ([127, 0, 0, 1], 0).into(), scratch.path())
        .expect("second receiver");
    let (_, run_dir) = run_ok_with(
        scratch.path(),
        &scenario,
        &scratch.results(),
        &["--otlp-forward", &second.endpoint],
    );
    let rows = requests_csv(&run_dir);
    assert_eq!(rows.len(), REQUESTS);
    assert!(rows.iter().all(|r| r.status == "ok"), "{rows:?}");
    let latency: HashMap<u64, u64> = rows.iter().map(|r| (r.id, r.latency_ns)).collect();

    let traces = &jaeger_traces(&run_dir);
    assert_eq!(traces.len(), REQUESTS, "one trace per request");
    let mut seen_ids = Vec::new();
    for trace in traces {
        let trace_id = trace["traceID"].as_str().expect("traceID");
        assert!(is_hex(trace_id, 32), "trace id {trace_id}");
        let spans = trace["spans"].as_array().expect("spans");
        assert_eq!(spans.len(), SPANS_PER_TRACE, "{trace:#}");
        let processes = trace["processes"].as_object().expect("processes");
        let by_id: BTreeMap<&str, &Value> = spans
            .iter()
            .map(|s| (s["spanID"].as_str().expect("spanID"), s))
            .collect();
        assert_eq!(by_id.len(), spans.len(), "span ids are unique");
        for s in spans {
            assert_eq!(s["traceID"], trace_id);
            assert!(is_hex(s["spanID"].as_str().expect("id"), 16), "{s}");
            assert!(processes.contains_key(s["processID"].as_str().expect("processID")));
            for r in s["references"].as_array().expect("references") {
                assert_eq!(r["refType"], "CHILD_OF");
                assert_eq!(r["traceID"], trace_id);
                let parent = r["spanID"].as_str().expect("parent id");
                assert!(
                    by_id.contains_key(parent),
                    "reference {parent} resolves: {trace:#}"
                );
            }
        }
        let parent_of = |s: &Value| -> Option<&Value> {
            let r = s["references"].as_array()?.first()?;
            by_id.get(r["spanID"].as_str()?).copied()
        };
        let service = |s: &Value| -> String {
            processes[s["processID"].as_str().expect("pid")]["serviceName"]
                .as_str()
                .expect("serviceName")
                .to_string()
        };
        // The chain, leaf up: c's server span, b's client span to c, b's
        // server span, the broker's queue wait, a's client span to b, a's
        // server span, the load generator's span (the only root).
        let leaf = spans
            .iter()
            .find(|s| s["operationName"] == "c")
            .unwrap_or_else(|| panic!("c's server span: {trace:#}"));
        let expected = [
            ("c", "hop-c"),
            ("b -> c", "hop-b"),
            ("b", "hop-b"),
            ("queue wait b", "broker"),
            ("a -> b", "hop-a"),
            ("a", "hop-a"),
        ];
        let mut at = leaf;
        for (name, svc) in expected {
            assert_eq!(at["operationName"], name, "{trace:#}");
            assert_eq!(service(at), svc, "{trace:#}");
            at = parent_of(at).unwrap_or_else(|| panic!("parent of {name}: {trace:#}"));
        }
        let root = at;
        assert_eq!(service(root), "loadgen");
        assert!(root["references"].as_array().expect("refs").is_empty());
        let roots = spans
            .iter()
            .filter(|s| s["references"].as_array().is_some_and(Vec::is_empty))
            .count();
        assert_eq!(roots, 1, "no orphan spans: {trace:#}");
        let id = tag(root, "request_id")
            .and_then(Value::as_u64)
            .expect("request id");
        seen_ids.push(id);
        let measured_us = latency[&id] / 1_000;
        let duration = root["duration"].as_u64().expect("duration");
        assert!(
            duration.abs_diff(measured_us) <= 2,
            "request {id}: span {duration}us vs measured {measured_us}us"
        );
        let (start, end) = (
            root["startTime"].as_u64().expect("start"),
            root["startTime"].as_u64().expect("start") + duration,
        );
        // Same host, same clock: every span lies within its request's span
        // (1 ms of slack for rounding and clock reads).
        for s in spans {
            let (s_start, s_dur) = (
                s["startTime"].as_u64().expect("start"),
                s["duration"].as_u64().expect("duration"),
            );
            assert!(s_dur <= duration, "{s} longer than its request");
            assert!(s_start + 1_000 >= start, "{s} starts before its request");
            assert!(s_start + s_dur <= end + 1_000, "{s} ends after its request");
            assert_eq!(
                jaeger_attribute(trace, s, "variant"),
                Some(&Value::from("base")),
                "{s}"
            );
        }
        // A hop's server span names its hop and replica through its
        // process (the OTLP resource), not on the span itself; the replica
        // is the one the reply path says served the request.
        let path: HashMap<&str, u32> = rows
            .iter()
            .find(|r| r.id == id)
            .expect("the request's row")
            .path
            .iter()
            .map(|(hop, replica)| (hop.as_str(), *replica))
            .collect();
        for hop in ["a", "b", "c"] {
            let server = spans
                .iter()
                .find(|s| s["operationName"] == hop)
                .unwrap_or_else(|| panic!("{hop}'s server span: {trace:#}"));
            assert_eq!(tag(server, "hop"), None, "{server}");
            assert_eq!(
                jaeger_attribute(trace, server, "hop"),
                Some(&Value::from(hop)),
                "{trace:#}"
            );
            assert_eq!(
                jaeger_attribute(trace, server, "replica"),
                Some(&Value::from(path[hop])),
                "{trace:#}"
            );
        }
        // The broker serves many hops: its span names its own.
        let wait = spans
            .iter()
            .find(|s| s["operationName"] == "queue wait b")
            .expect("b's queue wait");
        assert_eq!(tag(wait, "hop"), Some(&Value::from("b")), "{wait}");
        let server_a = parent_of(leaf)
            .and_then(parent_of)
            .and_then(parent_of)
            .and_then(parent_of)
            .and_then(parent_of)
            .expect("a's server span");
        assert_eq!(tag(server_a, "request_id"), Some(&Value::from(id)));
        assert_eq!(
            jaeger_attribute(trace, server_a, "transport"),
            Some(&Value::from("push"))
        );
        assert!(tag(server_a, "slow").is_some_and(Value::is_boolean));
    }
    seen_ids.sort_unstable();
    let mut ids: Vec<u64> = latency.keys().copied().collect();
    ids.sort_unstable();
    assert_eq!(seen_ids, ids, "each request's trace, once");

    let summary = summary(&run_dir);
    let t = &variants(&summary)[0]["traces"];
    assert_eq!(u64_at(t, "/expected"), REQUESTS as u64);
    assert_eq!(u64_at(t, "/complete"), REQUESTS as u64);
    assert_eq!(u64_at(t, "/missing"), 0);
    assert_eq!(u64_at(t, "/orphan_spans"), 0);
    assert_eq!(u64_at(t, "/timing_disagreements"), 0);
    let hops: Vec<&str> = t["hops"]
        .as_array()
        .expect("hops")
        .iter()
        .map(|h| h["hop"].as_str().expect("hop"))
        .collect();
    assert_eq!(hops, ["a", "b", "c"]);
    assert!(
        t["hops"][1]["queue_wait"]["max_us"]
            .as_f64()
            .expect("b queue")
            > 0.0
    );
    let total = (REQUESTS * SPANS_PER_TRACE) as u64;
    assert_eq!(u64_at(&summary, "/traces/spans"), total);
    assert_eq!(u64_at(&summary, "/traces/forwarded"), total);
    assert_eq!(u64_at(&summary, "/traces/forward_dropped"), 0);
    // The run waited for forwarding to finish before writing the summary.
    assert_eq!(
        second.collector.counts().spans,
        total,
        "every span forwarded"
    );
}

fn unreachable_forward_target_neither_fails_nor_slows_the_run() {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), "mixed.toml", MIXED);
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let (finished, run_dir) = run_ok_with(
        scratch.path(),
        &scenario,
        &scratch.results(),
        &["--otlp-forward", &url],
    );
    let summary = summary(&run_dir);
    let total = (REQUESTS * SPANS_PER_TRACE) as u64;
    assert_eq!(u64_at(&summary, "/traces/spans"), total);
    assert_eq!(u64_at(&summary, "/traces/forwarded"), 0);
    assert_eq!(u64_at(&summary, "/traces/forward_dropped"), total);
    assert!(
        finished.output().contains("could not be forwarded"),
        "{}",
        finished.output()
    );
    assert_eq!(
        u64_at(&variants(&summary)[0], "/traces/complete"),
        REQUESTS as u64
    );
}

fn no_traces_writes_no_trace_file_and_no_breakdown() {
    let scratch = Scratch::shared();
    let scenario = write(scratch.path(), "mixed.toml", MIXED);
    let (finished, run_dir) = run_ok_with(
        scratch.path(),
        &scenario,
        &scratch.results(),
        &["--no-traces"],
    );
    assert!(!Path::new(&run_dir.join("traces.jaeger.json")).exists());
    let summary = summary(&run_dir);
    assert!(summary.get("traces").is_none());
    assert!(variants(&summary)[0].get("traces").is_none());
    assert_eq!(requests_csv(&run_dir).len(), REQUESTS);
    // Nothing traced, nothing spent on it, by construction.
    let o = &variants(&summary)[0]["observer"];
    assert_eq!(o["traced"], false, "{o}");
    assert_eq!(o["cpu_us"]["total"].as_f64(), Some(0.0), "{o}");
    assert_eq!(o["share_of_cpu"].as_f64(), Some(0.0), "{o}");
    assert!(
        finished.output().contains("base: observer: traces off"),
        "{}",
        finished.output()
    );
}

fn failed_requests_have_error_spans_from_the_failing_hop_up() {
    let scratch = Scratch::shared();
    let scenario = write(
        scratch.path(),
        "err.toml",
        r#"
name = "err"
seed = 5
[load]
mode = "open"
rate = 100
requests = 40
[[hop]]
name = "a"
[[hop]]
name = "b"
transport = "pull"
error = { probability = 0.3, code = "unavailable" }
"#,
    );
    let (_, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let failed: Vec<u64> = requests_csv(&run_dir)
        .iter()
        .filter(|r| r.status != "ok")
        .map(|r| r.id)
        .collect();
    assert!(!failed.is_empty(), "30 % errors in 40 requests");
    let mut errored = Vec::new();
    for trace in &jaeger_traces(&run_dir) {
        let spans = trace["spans"].as_array().expect("spans");
        let root = spans
            .iter()
            .find(|s| s["references"].as_array().is_some_and(Vec::is_empty))
            .expect("root");
        let is_error = |s: &Value| tag(s, "error") == Some(&Value::Bool(true));
        if !is_error(root) {
            assert!(!spans.iter().any(is_error), "{trace:#}");
            continue;
        }
        errored.push(tag(root, "request_id").and_then(Value::as_u64).expect("id"));
        let names: Vec<&str> = spans
            .iter()
            .filter(|s| is_error(s))
            .map(|s| s["operationName"].as_str().expect("name"))
            .collect();
        for name in ["a", "a -> b", "b"] {
            assert!(names.contains(&name), "{name} marked failed: {trace:#}");
        }
        let b = spans.iter().find(|s| s["operationName"] == "b").expect("b");
        assert!(tag(b, "grpc_code").is_some(), "{b}");
    }
    errored.sort_unstable();
    assert_eq!(errored, failed);
    let summary = summary(&run_dir);
    let t = &variants(&summary)[0]["traces"];
    assert_eq!(u64_at(t, "/expected"), 40 - failed.len() as u64);
    assert_eq!(u64_at(t, "/complete"), 40 - failed.len() as u64);
}

fn partial_sampling_traces_only_the_sampled_requests_end_to_end() {
    let scratch = Scratch::shared();
    let scenario = write(
        scratch.path(),
        "half.toml",
        &format!("{MIXED}\n[telemetry]\nsampling = 0.5\n"),
    );
    let (_, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let traces = &jaeger_traces(&run_dir);
    assert!(
        (5..=35).contains(&traces.len()),
        "about half of {REQUESTS}: {}",
        traces.len()
    );
    // Hops follow the load generator's decision: no hop span of an
    // unsampled request, and every sampled request's trace is whole.
    for trace in traces {
        assert_eq!(
            trace["spans"].as_array().expect("spans").len(),
            SPANS_PER_TRACE,
            "{trace:#}"
        );
    }
    let summary = summary(&run_dir);
    let t = &variants(&summary)[0]["traces"];
    assert_eq!(u64_at(t, "/expected"), traces.len() as u64);
    assert_eq!(u64_at(t, "/complete"), traces.len() as u64);
    assert_eq!(u64_at(t, "/missing"), 0);
}

/// Hop a is hedged by the load generator after 8 ms; b works 3 ms on
/// average (exponential: 7 % of requests over 8 ms, hedged but not slow),
/// is slow (30 ms more) for 5 % of requests and fails 5 %; slow means over
/// 20 ms; a tenth of the other traces is kept.
const TAIL: &str = r#"
name = "tail"
seed = 11
[load]
mode = "open"
rate = 200
requests = 400
timeout = "2s"
[[hop]]
name = "a"
client = { hedge_after = "8ms" }
work = { kind = "sleep", dist = "fixed", value = "200us" }
[[hop]]
name = "b"
work = { kind = "sleep", dist = "exp", mean = "3ms" }
slow = { probability = 0.05, extra = "30ms" }
error = { probability = 0.05, code = "unavailable" }
[check]
slow_threshold = "20ms"
[telemetry]
keep_share = 0.1
"#;

/// Each request id in requests.csv with its load generator's extra
/// attempts (the column found by its name).
fn extra_attempts(run_dir: &Path) -> HashMap<u64, u64> {
    let text = std::fs::read_to_string(run_dir.join("requests.csv")).expect("requests.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column"))
    };
    let (id, extra) = (column("id"), column("extra_attempts"));
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            (
                f[id].parse().expect("id"),
                f[extra].parse().expect("extra attempts"),
            )
        })
        .collect()
}

fn the_jaeger_file_keeps_exactly_the_tail_and_a_share_and_the_breakdown_sees_every_path() {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), "tail.toml", TAIL);
    let (_, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let rows = requests_csv(&run_dir);
    let extra = extra_attempts(&run_dir);
    let threshold_ns = 20_000_000;
    // The tail by the first reason that applies, from the records.
    let failed: Vec<u64> = rows
        .iter()
        .filter(|r| r.status != "ok")
        .map(|r| r.id)
        .collect();
    let slow: Vec<u64> = rows
        .iter()
        .filter(|r| r.status == "ok" && r.latency_ns > threshold_ns)
        .map(|r| r.id)
        .collect();
    let retried: Vec<u64> = rows
        .iter()
        .filter(|r| r.status == "ok" && r.latency_ns <= threshold_ns && extra[&r.id] > 0)
        .map(|r| r.id)
        .collect();
    assert!(
        !failed.is_empty() && !slow.is_empty() && !retried.is_empty(),
        "the scenario makes each kind: {} failed, {} slow, {} hedged",
        failed.len(),
        slow.len(),
        retried.len()
    );

    let summary = summary(&run_dir);
    let t = &variants(&summary)[0]["traces"];
    let s = &t["sampling"];
    assert_eq!(u64_at(s, "/traced"), rows.len() as u64);
    assert_eq!(u64_at(s, "/kept_failed"), failed.len() as u64);
    assert_eq!(u64_at(s, "/kept_slow"), slow.len() as u64);
    assert_eq!(u64_at(s, "/kept_retried"), retried.len() as u64);
    assert_eq!(s["keep_share"].as_f64(), Some(0.1));
    assert_eq!(u64_at(s, "/files"), 1);
    let sampled = u64_at(s, "/kept_sampled");
    let kept =
        u64_at(s, "/kept_failed") + u64_at(s, "/kept_slow") + u64_at(s, "/kept_retried") + sampled;
    assert_eq!(kept + u64_at(s, "/dropped"), rows.len() as u64);
    let others = rows.len() as u64 - kept + sampled;
    assert!(
        sampled >= others / 30 && sampled <= others / 4,
        "about a tenth of {others}: {sampled}"
    );
    let files = summary["files"].as_object().expect("files");
    assert!(files.contains_key("traces.jaeger.json"));
    assert!(!files.contains_key("traces-2.jaeger.json"));

    // The Jaeger file: exactly the kept requests, each trace whole.
    let mut in_file = Vec::new();
    for trace in &jaeger_traces(&run_dir) {
        let spans = trace["spans"].as_array().expect("spans");
        let ids: Vec<&str> = spans
            .iter()
            .map(|s| s["spanID"].as_str().expect("id"))
            .collect();
        let roots: Vec<&Value> = spans
            .iter()
            .filter(|s| s["references"].as_array().is_some_and(Vec::is_empty))
            .collect();
        assert_eq!(roots.len(), 1, "one root: {trace:#}");
        for s in spans {
            for r in s["references"].as_array().expect("references") {
                let parent = r["spanID"].as_str().expect("parent");
                assert!(ids.contains(&parent), "{parent} resolves: {trace:#}");
            }
        }
        let id = tag(roots[0], "request_id")
            .and_then(Value::as_u64)
            .expect("request id");
        let ok = rows.iter().any(|r| r.id == id && r.status == "ok");
        for hop in ["a", "b"] {
            assert!(
                !ok || spans.iter().any(|s| s["operationName"] == hop),
                "request {id}: {hop}'s server span: {trace:#}"
            );
        }
        in_file.push(id);
    }
    in_file.sort_unstable();
    assert_eq!(in_file.len() as u64, kept, "one trace per kept request");
    assert_eq!(u64_at(s, "/written"), kept);
    for id in failed.iter().chain(&slow).chain(&retried) {
        assert!(
            in_file.binary_search(id).is_ok(),
            "request {id} of the tail is kept"
        );
    }

    // The processes held their spans and sent the kept traces' only:
    // each kept ok request's trace is checked against its path, none is
    // missing or lost; the breakdown comes from every ok request's path.
    let ok = rows.iter().filter(|r| r.status == "ok").count() as u64;
    let kept_ok = rows
        .iter()
        .filter(|r| r.status == "ok" && in_file.binary_search(&r.id).is_ok())
        .count() as u64;
    assert_eq!(u64_at(t, "/expected"), kept_ok);
    assert_eq!(u64_at(t, "/missing"), 0);
    assert_eq!(u64_at(t, "/lost"), 0);
    assert_eq!(u64_at(t, "/complete") + u64_at(t, "/incomplete"), kept_ok);
    // Hedged requests have a's and b's spans twice, their paths once.
    let hedged_ok = rows
        .iter()
        .filter(|r| r.status == "ok" && extra[&r.id] > 0)
        .count() as u64;
    assert!(
        u64_at(t, "/complete") + hedged_ok >= kept_ok,
        "{} complete, {hedged_ok} hedged, {kept_ok} kept ok",
        u64_at(t, "/complete")
    );
    // a's times: every ok request's, from its path, and the failed ones'
    // whose traces came (kept: all of them), from their spans (a hedged
    // one's twice).
    let a_times = u64_at(t, "/hops/0/spans");
    assert!(
        a_times >= ok && a_times <= ok + 2 * failed.len() as u64,
        "a's times of {a_times} requests: {ok} ok, {} failed",
        failed.len()
    );
    // Only the kept traces reached the receiver, the load generator's
    // spans included.
    assert_eq!(u64_at(t, "/traces"), kept);
    // Nothing of the spool, the facts or the kept traces is left behind.
    let hidden: Vec<String> = std::fs::read_dir(&run_dir)
        .expect("run dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
}

/// The shape of [`TREE`]: each hop, whether its caller reaches it through
/// the broker, and the hops it calls (in parallel).
const TREE_SHAPE: &[(&str, bool, &[&str])] = &[
    ("a", false, &["b", "c"]),
    ("b", false, &[]),
    ("c", true, &["d"]),
    ("d", false, &[]),
];
/// A fan-out (a calls b and c) whose second branch is pulled through the
/// broker and calls on (c calls d). Every request traced, every trace kept.
const TREE: &str = r#"
name = "tree"
seed = 11
[load]
mode = "open"
rate = 100
requests = 30
timeout = "2s"
[[hop]]
name = "a"
downstream = ["b", "c"]
[[hop]]
name = "b"
work = { kind = "sleep", dist = "fixed", value = "100us" }
[[hop]]
name = "c"
transport = "pull"
downstream = ["d"]
work = { kind = "sleep", dist = "fixed", value = "100us" }
[[hop]]
name = "d"
work = { kind = "sleep", dist = "fixed", value = "100us" }
[telemetry]
sampling = 1.0
keep_share = 1.0
"#;
const TREE_REQUESTS: usize = 30;

/// The spans one request's trace must hold for [`TREE_SHAPE`]: (operation,
/// service, parent operation). The load generator's root span ("request
/// <id>", its parent `None`); per hop its server span, whose parent is its
/// caller's client span (through the broker's queue wait when pulled);
/// per call a client span in the caller, child of the caller's server
/// span. So 1 + hops + calls + pulled calls spans.
fn expected_tree_spans() -> Vec<(String, String, Option<String>)> {
    let mut spans = vec![("request".to_owned(), "loadgen".to_owned(), None)];
    let (entry, ..) = TREE_SHAPE[0];
    spans.push((entry.into(), format!("hop-{entry}"), Some("request".into())));
    for (hop, _, downstream) in TREE_SHAPE {
        for child in *downstream {
            let call = format!("{hop} -> {child}");
            spans.push((call.clone(), format!("hop-{hop}"), Some((*hop).into())));
            let pulled = TREE_SHAPE
                .iter()
                .any(|(name, pulled, _)| name == child && *pulled);
            let server_parent = if pulled {
                let wait = format!("queue wait {child}");
                spans.push((wait.clone(), "broker".into(), Some(call)));
                wait
            } else {
                call
            };
            spans.push(((*child).into(), format!("hop-{child}"), Some(server_parent)));
        }
    }
    spans
}

/// One trace per request, each whole and well formed: unique span ids,
/// every parent present in the same trace, the load generator's span the
/// only root, exactly the spans the shape calls for with the right
/// parents, no span longer than its parent or starting before it.
fn fan_out_and_pulled_hop_traces_are_complete_and_well_formed() {
    let scratch = Scratch::shared();
    let scenario = write(scratch.path(), "tree.toml", TREE);
    let (_, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let rows = requests_csv(&run_dir);
    assert_eq!(rows.len(), TREE_REQUESTS);
    assert!(rows.iter().all(|r| r.status == "ok"), "{rows:?}");
    let mut sent: Vec<u64> = rows.iter().map(|r| r.id).collect();
    sent.sort_unstable();

    let expected = expected_tree_spans();
    let calls: usize = TREE_SHAPE.iter().map(|(_, _, d)| d.len()).sum();
    let pulled = TREE_SHAPE.iter().filter(|(_, p, _)| *p).count();
    assert_eq!(expected.len(), 1 + TREE_SHAPE.len() + calls + pulled);
    let mut expected_names: Vec<&str> = expected.iter().map(|(n, ..)| n.as_str()).collect();
    expected_names.sort_unstable();

    let traces = &jaeger_traces(&run_dir);
    let mut trace_ids: Vec<&str> = traces
        .iter()
        .map(|t| t["traceID"].as_str().expect("traceID"))
        .collect();
    trace_ids.sort_unstable();
    trace_ids.dedup();
    assert_eq!(trace_ids.len(), traces.len(), "each trace once");
    let mut traced = Vec::new();
    for trace in traces {
        let trace_id = trace["traceID"].as_str().expect("traceID");
        let spans = trace["spans"].as_array().expect("spans");
        let processes = trace["processes"].as_object().expect("processes");
        let by_id: BTreeMap<&str, &Value> = spans
            .iter()
            .map(|s| (s["spanID"].as_str().expect("spanID"), s))
            .collect();
        assert_eq!(by_id.len(), spans.len(), "span ids are unique: {trace:#}");
        let service = |s: &Value| -> String {
            processes[s["processID"].as_str().expect("processID")]["serviceName"]
                .as_str()
                .expect("serviceName")
                .to_owned()
        };
        // The load generator's span is named after its request.
        let name = |s: &Value| -> String {
            let op = s["operationName"].as_str().expect("operationName");
            if op.starts_with("request ") {
                "request".to_owned()
            } else {
                op.to_owned()
            }
        };
        let mut roots = Vec::new();
        let mut names = Vec::new();
        for s in spans {
            assert_eq!(s["traceID"], trace_id, "{s}");
            let start = s["startTime"].as_u64().expect("startTime");
            let duration = s["duration"].as_u64().expect("a duration, not negative");
            let refs = s["references"].as_array().expect("references");
            assert!(refs.len() <= 1, "one parent at most: {s}");
            let parent = refs.first().map(|r| {
                assert_eq!(r["refType"], "CHILD_OF", "{s}");
                assert_eq!(r["traceID"], trace_id, "{s}");
                let id = r["spanID"].as_str().expect("parent id");
                *by_id
                    .get(id)
                    .unwrap_or_else(|| panic!("the parent of {s} is in the trace: {trace:#}"))
            });
            let (n, svc) = (name(s), service(s));
            let want = expected
                .iter()
                .find(|(en, ..)| *en == n)
                .unwrap_or_else(|| panic!("span {n} is not in the shape: {trace:#}"));
            assert_eq!(svc, want.1, "{n}'s service: {trace:#}");
            assert_eq!(parent.map(name), want.2, "{n}'s parent: {trace:#}");
            match parent {
                None => roots.push(s),
                Some(p) => {
                    // Same host, same clock: a child starts within its
                    // parent and ends within it, or, below a queue wait
                    // (which ends when a worker takes the task), within
                    // the caller's client span above the wait (1 ms of
                    // slack for rounding and clock reads).
                    let bounds = |s: &Value| {
                        let start = s["startTime"].as_u64().expect("startTime");
                        (start, start + s["duration"].as_u64().expect("duration"))
                    };
                    let (p_start, p_end) = bounds(p);
                    assert!(start + 1_000 >= p_start, "{n} starts before its parent");
                    let enclosing = if name(p).starts_with("queue wait ") {
                        let call = p["references"][0]["spanID"]
                            .as_str()
                            .expect("wait's parent");
                        bounds(by_id[call]).1
                    } else {
                        p_end
                    };
                    assert!(
                        start + duration <= enclosing + 1_000,
                        "{n} ends after its caller: {trace:#}"
                    );
                }
            }
            names.push(n);
        }
        names.sort_unstable();
        assert_eq!(
            names, expected_names,
            "the shape's spans, once each: {trace:#}"
        );
        assert_eq!(roots.len(), 1, "one root: {trace:#}");
        assert_eq!(service(roots[0]), "loadgen");
        traced.push(
            tag(roots[0], "request_id")
                .and_then(Value::as_u64)
                .expect("the root names its request"),
        );
    }
    traced.sort_unstable();
    assert_eq!(traced, sent, "exactly one trace per sent request");

    let summary = summary(&run_dir);
    let t = &variants(&summary)[0]["traces"];
    assert_eq!(u64_at(t, "/complete"), TREE_REQUESTS as u64);
    assert_eq!(u64_at(t, "/orphan_spans"), 0);
    assert_eq!(
        u64_at(&summary, "/traces/spans"),
        (TREE_REQUESTS * expected.len()) as u64
    );
}

/// A traced run says what tracing cost it: every part the orchestrator
/// measures present, the processes' own counters either reported and
/// agreeing with the spans received, or said to be missing (null), never
/// a made-up 0. No timing thresholds: only relations that must hold.
fn a_traced_run_states_its_observer_cost() {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), "tree.toml", TREE);
    let (finished, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let summary = summary(&run_dir);
    let o = &variants(&summary)[0]["observer"];
    let spans_per_trace = expected_tree_spans().len() as u64;
    assert_eq!(o["traced"], true, "{o}");
    assert_eq!(u64_at(o, "/traced_requests"), TREE_REQUESTS as u64, "{o}");
    assert_eq!(
        u64_at(o, "/spans"),
        TREE_REQUESTS as u64 * spans_per_trace,
        "{o}"
    );
    assert_eq!(
        o["spans_per_traced_request"].as_f64(),
        Some(spans_per_trace as f64)
    );
    let cpu = &o["cpu_us"];
    let part = |key: &str| cpu[key].as_f64();
    assert!(part("receiver").is_some_and(|us| us > 0.0), "{o}");
    assert!(part("spool").is_some_and(|us| us > 0.0), "{o}");
    assert!(part("loadgen_spans").is_some_and(|us| us > 0.0), "{o}");
    assert!(part("sampling").is_some_and(|us| us >= 0.0), "{o}");
    assert!(
        o["analysis_cpu_us"].as_f64().is_some_and(|us| us > 0.0),
        "{o}"
    );
    let parts: f64 = [
        "hops_recording",
        "hops_export",
        "receiver",
        "spool",
        "sampling",
        "loadgen_spans",
    ]
    .iter()
    .filter_map(|k| part(k))
    .sum();
    let total = part("total").expect("total");
    assert!((total - parts).abs() < 1e-6 * total.max(1.0), "{o}");
    let per_request = o["cpu_us_per_traced_request"]
        .as_f64()
        .expect("per request");
    assert!(
        (per_request * TREE_REQUESTS as f64 - total).abs() < 1e-6 * total,
        "{o}"
    );
    if let Some(share) = o["share_of_cpu"].as_f64() {
        assert!(share > 0.0, "{o}");
    }
    if u64_at(o, "/processes_reporting") > 0 {
        // Every span a process recorded and did not drop was received.
        assert_eq!(
            u64_at(o, "/processes_spans") - u64_at(o, "/processes_dropped"),
            u64_at(o, "/processes_spans_received"),
            "{o}"
        );
        // All but the load generator's span of each trace.
        assert_eq!(
            u64_at(o, "/processes_spans_received"),
            TREE_REQUESTS as u64 * (spans_per_trace - 1),
            "{o}"
        );
        assert!(part("hops_export").is_some() && part("hops_recording").is_some());
        assert_eq!(o["complete"], true, "{o}");
    } else {
        // Processes that do not report: said, not guessed.
        assert!(o["processes_spans"].is_null(), "{o}");
        assert!(cpu["hops_export"].is_null() && cpu["hops_recording"].is_null());
        assert_eq!(o["complete"], false, "{o}");
    }
    let line = format!("base: observer: {spans_per_trace}.0 spans/request, ");
    assert!(finished.output().contains(&line), "{}", finished.output());
}

/// A chain kept at a small share: its processes hold their spans.
pub(crate) const HELD: &str = r#"
name = "held"
seed = 4
[load]
mode = "open"
rate = 200
warmup = "500ms"
duration = "3s"
[[hop]]
name = "a"
[[hop]]
name = "b"
slow = { probability = 0.03, extra = "20ms" }
[check]
slow_threshold = "15ms"
[telemetry]
keep_share = 0.05
"#;

fn held_spans_are_sent_for_kept_traces_only_and_a_too_small_hold_loses_some() {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), "held.toml", HELD);
    let (_, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    let (t, o) = (&v["traces"], &v["observer"]);
    // Every kept trace came whole; nothing was lost.
    let kept = u64_at(t, "/sampling/written");
    assert!(kept > 0, "{t:#}");
    assert_eq!(u64_at(t, "/expected"), u64_at(t, "/complete"), "{t:#}");
    assert_eq!(u64_at(t, "/missing"), 0, "{t:#}");
    assert_eq!(u64_at(t, "/lost"), 0, "{t:#}");
    // The dropped traces' hop spans stayed where they were made: the
    // processes sent a's and b's server and client spans of the kept
    // requests (and of the warmup's none), evicting the rest.
    let (made, received) = (
        u64_at(o, "/processes_spans"),
        u64_at(o, "/processes_spans_received"),
    );
    let evicted = u64_at(t, "/held/evicted_spans");
    assert_eq!(made, received + evicted, "{o:#}\n{t:#}");
    assert!(
        received <= 3 * kept + 3,
        "3 spans per kept trace: {received} for {kept}"
    );
    assert!(
        evicted > 10 * received,
        "{evicted} evicted, {received} sent"
    );
    // The load generator's own span went only with the kept traces too:
    // the variant's spans are the processes' sent and one per kept trace.
    assert_eq!(u64_at(t, "/spans"), received + kept, "{t:#}\n{o:#}");
    assert_eq!(u64_at(t, "/held/evicted_at_receiver"), 0, "{t:#}");

    // Three spans held at most: most kept traces were evicted before
    // their decision came, and each loss is counted and said.
    let tiny = write(
        scratch.path(),
        "tiny.toml",
        &HELD.replace("keep_share = 0.05", "keep_share = 0.05\nhold_spans = 3"),
    );
    let (finished, run_dir) = run_ok(scratch.path(), &tiny, &scratch.path().join("tiny"));
    let tiny_summary = crate::support::summary(&run_dir);
    let t = &variants(&tiny_summary)[0]["traces"];
    let lost = u64_at(t, "/lost");
    assert!(lost > 0, "{t:#}");
    assert!(
        t["held"]["lost_delay_ms"].as_f64().is_some_and(|d| d > 0.0),
        "{t:#}"
    );
    assert!(
        finished
            .stdout
            .contains(&format!("{lost} kept trace(s) lost"))
            || finished
                .stderr
                .contains(&format!("{lost} kept trace(s) lost")),
        "{}",
        finished.output()
    );
}
