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
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let scenario = write(tmp.path(), "mixed.toml", MIXED);
    let results = tmp.path().join("results");
    let second = ReceiverThread::start(1_000_000, None, ([127, 0, 0, 1], 0).into())
        .expect("second receiver");
    let finished = tailmesh(
        tmp.path(),
        &run_args(&scenario, &results, &["--otlp-forward", &second.endpoint]),
    );
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let run_dir = only_run_dir(&results);
    let rows = requests_csv(&run_dir);
    assert_eq!(rows.len(), REQUESTS);
    assert!(rows.iter().all(|r| r.status == "ok"), "{rows:?}");
    let latency: HashMap<u64, u64> = rows.iter().map(|r| (r.id, r.latency_ns)).collect();

    let text = std::fs::read_to_string(run_dir.join("traces.jaeger.json")).expect("jaeger file");
    let file: Value = serde_json::from_str(&text).expect("jaeger JSON");
    let traces = file["data"].as_array().expect("data array");
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
            assert_eq!(tag(s, "variant"), Some(&Value::from("base")), "{s}");
        }
        let server_a = parent_of(leaf)
            .and_then(parent_of)
            .and_then(parent_of)
            .and_then(parent_of)
            .and_then(parent_of)
            .expect("a's server span");
        assert_eq!(tag(server_a, "request_id"), Some(&Value::from(id)));
        assert_eq!(tag(server_a, "transport"), Some(&Value::from("push")));
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
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let scenario = write(tmp.path(), "mixed.toml", MIXED);
    let results = tmp.path().join("results");
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let finished = tailmesh(
        tmp.path(),
        &run_args(&scenario, &results, &["--otlp-forward", &url]),
    );
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let run_dir = only_run_dir(&results);
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
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let scenario = write(tmp.path(), "mixed.toml", MIXED);
    let results = tmp.path().join("results");
    let finished = tailmesh(tmp.path(), &run_args(&scenario, &results, &["--no-traces"]));
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let run_dir = only_run_dir(&results);
    assert!(!Path::new(&run_dir.join("traces.jaeger.json")).exists());
    let summary = summary(&run_dir);
    assert!(summary.get("traces").is_none());
    assert!(variants(&summary)[0].get("traces").is_none());
    assert_eq!(requests_csv(&run_dir).len(), REQUESTS);
}

fn failed_requests_have_error_spans_from_the_failing_hop_up() {
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let scenario = write(
        tmp.path(),
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
    let results = tmp.path().join("results");
    let finished = tailmesh(tmp.path(), &run_args(&scenario, &results, &[]));
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let run_dir = only_run_dir(&results);
    let failed: Vec<u64> = requests_csv(&run_dir)
        .iter()
        .filter(|r| r.status != "ok")
        .map(|r| r.id)
        .collect();
    assert!(!failed.is_empty(), "30 % errors in 40 requests");
    let text = std::fs::read_to_string(run_dir.join("traces.jaeger.json")).expect("jaeger file");
    let file: Value = serde_json::from_str(&text).expect("jaeger JSON");
    let mut errored = Vec::new();
    for trace in file["data"].as_array().expect("data") {
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
    let _serial = serial();
    let tmp = tempfile::tempdir().expect("tempdir");
    let scenario = write(
        tmp.path(),
        "half.toml",
        &format!("{MIXED}\n[telemetry]\nsampling = 0.5\n"),
    );
    let results = tmp.path().join("results");
    let finished = tailmesh(tmp.path(), &run_args(&scenario, &results, &[]));
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let run_dir = only_run_dir(&results);
    let text = std::fs::read_to_string(run_dir.join("traces.jaeger.json")).expect("jaeger file");
    let file: Value = serde_json::from_str(&text).expect("jaeger JSON");
    let traces = file["data"].as_array().expect("data");
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
