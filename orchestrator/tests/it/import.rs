//! `tailmesh import -o` on a run's own traces: the scenario it writes has
//! the run's hops and calls, and running it gives back each hop's own time
//! and the end-to-end latency; a mesh the format cannot say is refused
//! with its reasons.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use tailmesh_import::{Format, Mesh};

use crate::support::*;

tests! {
    sync a_runs_traces_import_as_its_mesh_and_run_alike,
    sync a_mesh_the_format_cannot_say_is_refused_with_its_reasons,
}

/// Every trace kept; work of several milliseconds, well above the serving
/// around it and the machine's noise in it (bench/round-trip.sh runs it
/// too, for docs/findings/import-round-trip.md).
const SOURCE: &str = include_str!("../../../bench/round-trip.toml");

/// Each service's own times in the traces of `run_dir`, and the mesh.
fn mesh_of(run_dir: &Path) -> Mesh {
    let path = run_dir.join("traces.jaeger.json");
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let imported = tailmesh_import::read(
        Format::Jaeger,
        &path.display().to_string(),
        std::io::BufReader::new(file),
    )
    .unwrap_or_else(|e| panic!("import {}: {e}", path.display()));
    Mesh::from_traces(&imported.traces)
}

/// The two-sample Kolmogorov-Smirnov distance of two sorted samples.
fn ks(a: &[i64], b: &[i64]) -> f64 {
    let (mut i, mut j, mut d) = (0, 0, 0.0f64);
    while i < a.len() && j < b.len() {
        let t = a[i].min(b[j]);
        while i < a.len() && a[i] <= t {
            i += 1;
        }
        while j < b.len() && b[j] <= t {
            j += 1;
        }
        d = d.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
    }
    d
}

/// Each hop's callees, from a scenario file.
fn calls_of(path: &Path) -> BTreeMap<String, Vec<String>> {
    let (scenario, _) =
        tailmesh::scenario::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    scenario.variants[0]
        .hops
        .iter()
        .map(|h| {
            let mut d = h.downstream.clone();
            d.sort();
            (h.name.clone(), d)
        })
        .collect()
}

fn latency(run_dir: &Path) -> Value {
    summary(run_dir)
        .pointer("/variants/0/latency")
        .cloned()
        .unwrap_or_else(|| panic!("no latency in {}", run_dir.display()))
}

fn a_runs_traces_import_as_its_mesh_and_run_alike() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let source = write(dir.path(), "source.toml", SOURCE);
    let (_, source_run) = run_ok(dir.path(), &source, &dir.path().join("results"));
    let traces = source_run.join("traces.jaeger.json");
    let imported = dir.path().join("imported.toml");
    let finished = tailmesh(
        dir.path(),
        &[
            "import",
            "jaeger",
            path_str(&traces),
            "-o",
            path_str(&imported),
        ],
    );
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    assert!(
        finished.stdout.contains("wrote ") && finished.stdout.contains("(4 hops)"),
        "{}",
        finished.output()
    );
    // The same hops calling the same hops.
    assert_eq!(calls_of(&imported), calls_of(&source));
    // Run as written, every trace kept to read its own times back.
    let text = std::fs::read_to_string(&imported).expect("read the import");
    let rerun = write(
        dir.path(),
        "rerun.toml",
        &format!("{text}\n[telemetry]\nkeep_share = 1.0\n"),
    );
    let (_, rerun_dir) = run_ok(dir.path(), &rerun, &dir.path().join("rerun-results"));
    let (before, after) = (mesh_of(&source_run), mesh_of(&rerun_dir));
    for hop in ["front", "left", "right", "leaf"] {
        let service = format!("hop-{hop}");
        let own = |m: &Mesh| {
            m.services
                .get(&service)
                .map(|s| s.own_times.clone())
                .unwrap_or_else(|| panic!("no {service} in the traces"))
        };
        let (a, b) = (own(&before), own(&after));
        assert!(
            a.len() >= 2000 && b.len() >= 2000,
            "{hop}: {} and {}",
            a.len(),
            b.len()
        );
        let d = ks(&a, &b);
        assert!(
            d <= 0.05,
            "{hop}: own times {d:.3} apart (Kolmogorov-Smirnov)"
        );
    }
    let (was, is) = (latency(&source_run), latency(&rerun_dir));
    for q in ["p50_us", "p90_us", "p99_us"] {
        let (a, b) = (
            u64_at(&was, &format!("/{q}")),
            u64_at(&is, &format!("/{q}")),
        );
        let off = (b as f64 / a as f64 - 1.0).abs();
        assert!(
            off <= 0.10,
            "end to end {q}: {a} us, then {b} us ({off:.3} apart)"
        );
    }
    // What if the leaf took 20 ms: predicted from the run's segments.
    let finished = tailmesh(
        dir.path(),
        &[
            "predict",
            path_str(&rerun),
            "--from",
            path_str(&rerun_dir),
            "--what-if",
            r#"hop.leaf.work={kind="sleep",value="20ms"}"#,
            "--json",
        ],
    );
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let report: Value = serde_json::from_str(&finished.stdout).expect("JSON");
    let (measured, as_run, changed) = (
        report["measured"]["p50_us"].as_f64().unwrap_or(0.0),
        u64_at(&report, "/as_run/p50_us") as f64,
        u64_at(&report, "/changed/p50_us") as f64,
    );
    // Unchanged, the segments recompose to the run's median; the leaf's
    // 16 ms more (its mean was 4 ms) moves the median by most of that.
    assert!(
        (as_run / measured - 1.0).abs() <= 0.10,
        "as run {as_run} us, measured {measured} us:\n{report:#}"
    );
    assert!(
        changed - as_run > 10_000.0,
        "as run {as_run} us, what-if {changed} us:\n{report:#}"
    );
}

fn a_mesh_the_format_cannot_say_is_refused_with_its_reasons() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Alibaba's call graph: the gateway calls cart in one request of two.
    let mut csv = String::from(
        "timestamp,traceid,service,rpc_id,um,uminstanceid,rpctype,interface,dm,dminstanceid,rt\n",
    );
    for t in 0..4 {
        let at = t * 100;
        csv.push_str(&format!(
            "{at},t{t},s,0.1,USER,u,http,/checkout,gateway,g1,30\n"
        ));
        csv.push_str(&format!(
            "{},t{t},s,0.1.1,gateway,g1,rpc,get,auth,a1,5\n",
            at + 1
        ));
        if t % 2 == 0 {
            csv.push_str(&format!(
                "{},t{t},s,0.1.2,gateway,g1,rpc,put,cart,c1,5\n",
                at + 10
            ));
        }
    }
    // A call made by half the requests is written with its probability.
    let calls = write(dir.path(), "calls.csv", &csv);
    let out = dir.path().join("out.toml");
    let finished = tailmesh(
        dir.path(),
        &["import", "alibaba", path_str(&calls), "-o", path_str(&out)],
    );
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let written = std::fs::read_to_string(&out).expect("scenario written");
    assert!(
        written.contains(r#"{ hop = "cart", probability = 0.5 }"#),
        "{written}"
    );
    std::fs::remove_file(&out).expect("remove");
    // Requests that enter at two services: each entry weighted by its
    // requests, a scenario `predict` reads.
    csv.push_str("900,t9,s,0.1,USER,u,http,/search,search,s1,3\n");
    let calls = write(dir.path(), "calls.csv", &csv);
    let finished = tailmesh(
        dir.path(),
        &["import", "alibaba", path_str(&calls), "-o", path_str(&out)],
    );
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let written = std::fs::read_to_string(&out).expect("scenario written");
    assert!(
        written.contains(
            r#"entries = [{ hop = "gateway", weight = 4 }, { hop = "search", weight = 1 }]"#
        ),
        "{written}"
    );
    let predicted = tailmesh(dir.path(), &["predict", path_str(&out)]);
    assert_eq!(predicted.code(), Some(0), "{}", predicted.output());
    std::fs::remove_file(&out).expect("remove");
    // Services that call each other (a cycle) are not a scenario's.
    csv.push_str("901,t9,s,0.1.1,search,s1,rpc,get,gateway,g1,1\n");
    csv.push_str("902,t0,s,0.1.3,gateway,g1,rpc,find,search,s1,1\n");
    let calls = write(dir.path(), "calls.csv", &csv);
    let finished = tailmesh(
        dir.path(),
        &["import", "alibaba", path_str(&calls), "-o", path_str(&out)],
    );
    assert_eq!(finished.code(), Some(2), "{}", finished.output());
    assert!(
        finished
            .stderr
            .contains("the mesh cannot be written as a scenario:")
            && finished.stderr.contains(
                "gateway calls search, which calls it back (a cycle): a scenario's calls form no \
                 cycle\n  search calls gateway, which calls it back (a cycle)"
            )
            && !finished.stderr.contains("calls auth"),
        "{}",
        finished.output()
    );
    assert!(!out.exists(), "nothing written");
    // The mesh itself was still told.
    assert!(
        finished.stdout.contains("auth: 4 invocations"),
        "{}",
        finished.output()
    );
}
