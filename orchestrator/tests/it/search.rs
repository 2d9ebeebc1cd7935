//! `tailmesh search`: short runs at rates the search picks, each judged
//! against the objective; the answer is a rate whose step met it below one
//! whose step did not, every step's run folder is kept with its own rate,
//! and a first step that already fails stops the search with exit 3.

use serde_json::Value;

use crate::support::*;

tests! {
    sync a_search_brackets_the_rate_that_meets_the_objective_from_its_steps_runs,
}

/// One slot of 10 ms: the hop serves 100 requests per second at most, so
/// climbing from 25/s a step fails by 400/s whatever the machine.
const SCENARIO: &str = "name = \"cap\"\nseed = 5\n[load]\nmode = \"open\"\nrate = 25\n\
                        duration = \"1s\"\nwarmup = \"200ms\"\ntimeout = \"2s\"\n\
                        [[hop]]\nname = \"a\"\nconcurrency = 1\n\
                        work = { kind = \"sleep\", dist = \"fixed\", value = \"10ms\" }\n";

fn a_search_brackets_the_rate_that_meets_the_objective_from_its_steps_runs() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "cap.toml", SCENARIO);
    let results = dir.path().join("results");
    let search = |extra: &[&str]| {
        let mut args = vec![
            "search",
            path_str(&scenario),
            "--slo",
            "p99<100ms,errors<1%",
            "--step",
            "1s",
            "--cooldown",
            "200ms",
            "--results",
            path_str(&results),
        ];
        args.extend_from_slice(extra);
        tailmesh(dir.path(), &args)
    };
    let found = search(&["--max-steps", "5", "--repeats", "1"]);
    let output = found.output();
    assert_eq!(found.code(), Some(0), "{output}");
    assert!(
        output.contains("from 50/s (half the declared capacity, 100/s)"),
        "{output}"
    );
    let written: Value =
        serde_json::from_str(&read_lossy(&results.join("cap-search").join("search.json")))
            .expect("search.json");
    let s = &written["searches"][0];
    let page = read_lossy(&results.join("cap-search").join("search.html"));
    assert!(
        page.contains("id=\"p99-0\"")
            && page.contains("id=\"goodput-0\"")
            && page.contains("answer "),
        "{page}"
    );
    let steps = s["steps"].as_array().expect("steps");
    let searched = steps.iter().filter(|st| st["kind"] != "confirm").count();
    assert!((2..=5).contains(&searched), "{searched} steps:\n{output}");
    // Each step: its own run folder, at its rate, judged as its summary
    // says.
    for st in steps {
        let v = &st["verdict"];
        let run = std::path::PathBuf::from(v["run"].as_str().expect("its run folder"));
        let summary = summary(&run);
        let report = &variants(&summary)[0];
        let rate = v["rate"].as_f64().expect("a rate");
        assert_eq!(report["load"]["rate"].as_f64(), Some(rate), "{report:#}");
        let p99_ms = u64_at(report, "/latency/p99_us") as f64 / 1000.0;
        let failed = u64_at(report, "/sent") - u64_at(report, "/ok");
        let should = p99_ms < 100.0 && (failed as f64) < 0.01 * u64_at(report, "/sent") as f64;
        assert_eq!(
            v["met"].as_bool(),
            Some(should),
            "step at {rate}/s: p99 {p99_ms} ms, {failed} failed"
        );
    }
    let met = |rate: f64| {
        steps
            .iter()
            .filter(|st| st["verdict"]["rate"].as_f64() == Some(rate))
            .map(|st| st["verdict"]["met"].as_bool() == Some(true))
            .collect::<Vec<_>>()
    };
    let answer = &s["answer"];
    let (rate, fails_at) = (
        answer["rate"].as_f64().expect("an answer's rate"),
        answer["fails_at"].as_f64().expect("where it fails"),
    );
    assert!(
        ["found", "step_limit"].contains(&answer["result"].as_str().unwrap_or("")),
        "{answer:#}"
    );
    assert!(rate < fails_at, "{answer:#}");
    assert!(
        met(rate).iter().all(|m| *m) && !met(rate).is_empty(),
        "{answer:#}\n{output}"
    );
    assert!(met(fails_at).iter().any(|m| !*m), "{answer:#}\n{output}");
    eprintln!("search: {answer}");

    // A first step that already fails stops there, with exit 3.
    let first = search(&["--start", "400"]);
    let output = first.output();
    assert_eq!(first.code(), Some(3), "{output}");
    assert!(
        output.contains("the first step, 400/s, already fails"),
        "{output}"
    );
}
