//! `tailmesh cases`: one injection of each fault kind (the last one by a
//! second command that goes on with the set), each run read
//! back to check that the label says what was injected, where and when
//! (true by construction); the kept cases' folders hold the files
//! root-cause tools read, without what gives the fault away; and `cases
//! score` scores the built-in rankings and an outside tool's.

use std::path::Path;

use serde_json::Value;

use crate::support::*;

tests! {
    sync a_case_of_each_kind_is_labelled_with_what_its_run_injected_and_scored,
}

/// A chain whose middle hop has two replicas and whose last is pulled
/// through the broker; every hop works 300 us.
const SCENARIO: &str = "name = \"rca\"\nseed = 11\n[load]\nmode = \"open\"\nrate = 150\n\
                        duration = \"1s\"\nwarmup = \"500ms\"\ntimeout = \"2s\"\n\
                        [[hop]]\nname = \"a\"\nwork = { kind = \"sleep\", dist = \"fixed\", value = \"300us\" }\n\
                        [[hop]]\nname = \"b\"\nreplicas = 2\n\
                        work = { kind = \"sleep\", dist = \"fixed\", value = \"300us\" }\n\
                        [[hop]]\nname = \"c\"\ntransport = \"pull\"\n\
                        work = { kind = \"sleep\", dist = \"fixed\", value = \"300us\" }\n\
                        [check]\nslow_threshold = \"50ms\"\n";

fn json(path: &Path) -> Value {
    serde_json::from_str(&read_lossy(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The phase label the run gives a case's fault.
fn phase_label(fault: &Value) -> String {
    let kind = fault["kind"].as_str().unwrap_or("");
    let service = fault["service"].as_str().unwrap_or("");
    let kind = if kind == "loss" || kind == "delay" {
        "net"
    } else {
        kind
    };
    match fault["replica"].as_u64() {
        Some(r) => format!("{kind} {service}/{r}"),
        None => format!("{kind} {service}"),
    }
}

fn a_case_of_each_kind_is_labelled_with_what_its_run_injected_and_scored() {
    require_privilege(&[]);
    // What the runs counted and wrote, not how fast: beside other tests
    // (a slow threshold of 50 ms keeps the steady mesh under it on a busy
    // machine).
    let _turn = shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "rca.toml", SCENARIO);
    let out = dir.path().join("cases");

    // Bad input says what and where.
    let bad = tailmesh(
        dir.path(),
        &[
            "cases",
            path_str(&scenario),
            "--faults",
            "slow,fire",
            "-o",
            path_str(&out),
        ],
    );
    assert_eq!(bad.code(), Some(2), "{}", bad.output());
    assert!(
        bad.output().contains("unknown kind \"fire\""),
        "{}",
        bad.output()
    );

    let length = format!("{}s", 4 * slowdown());
    // `count` cases of seed 4 on the netns launcher: a run of a few
    // seconds each, started and written.
    let make = |count: u32| {
        let count = count.to_string();
        Running::start(
            dir.path(),
            &[
                "cases",
                path_str(&scenario),
                "--count",
                &count,
                "--seed",
                "4",
                "--netns",
                "--length",
                &length,
                "-o",
                path_str(&out),
            ],
        )
        .wait_within(std::time::Duration::from_secs(
            40 * 6 * u64::from(slowdown()),
        ))
    };
    let made = make(5);
    let output = made.output();
    assert_eq!(made.code(), Some(0), "{output}");
    // Other settings into the same folder: refused.
    let again = tailmesh(
        dir.path(),
        &["cases", path_str(&scenario), "-o", path_str(&out)],
    );
    assert_eq!(again.code(), Some(2), "{}", again.output());
    assert!(
        again.output().contains("other settings"),
        "{}",
        again.output()
    );
    // The same settings and a larger count: the set goes on where it ended.
    let before = json(&out.join("index.json"));
    let more = make(6);
    assert_eq!(more.code(), Some(0), "{}", more.output());
    assert!(more.output().contains("5 already in"), "{}", more.output());
    let after = json(&out.join("index.json"));
    let (before, after) = (
        before["cases"].as_array().expect("cases"),
        after["cases"].as_array().expect("cases"),
    );
    assert_eq!(after.len(), 6);
    assert_eq!(after[..5], before[..]);
    assert_eq!(after[5]["case"], "case-005");

    let index = json(&out.join("index.json"));
    let cases = index["cases"].as_array().expect("cases");
    let kinds: Vec<&str> = cases
        .iter()
        .map(|c| c["fault"]["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["slow", "replica_slow", "error", "loss", "delay", "kill"]
    );
    let mut kept = Vec::new();
    for case in cases {
        let fault = &case["fault"];
        let name = case["case"].as_str().expect("a case name");
        let service = fault["service"].as_str().expect("a service");
        let (start, end) = (
            fault["start_s"].as_f64().expect("start"),
            fault["end_s"].as_f64().expect("end"),
        );
        let run = out.join(case["run"].as_str().expect("its run folder"));
        let summary = summary(&run);
        let v = &variants(&summary)[0];
        // The run had that fault and no other, in force from its start to
        // its end.
        let label = phase_label(fault);
        let phases = v["phases"].as_array().expect("phases");
        for p in phases {
            let faults: Vec<&str> = p["faults"]
                .as_array()
                .map_or(Vec::new(), |f| f.iter().filter_map(Value::as_str).collect());
            let inside = p["start_s"].as_f64() == Some(start);
            assert_eq!(
                faults,
                if inside { vec![label.as_str()] } else { vec![] },
                "{name}: {p:#}"
            );
        }
        assert!(
            phases
                .iter()
                .any(|p| p["start_s"].as_f64() == Some(start) && p["end_s"].as_f64() == Some(end)),
            "{name}: no phase from {start} to {end}: {phases:#?}"
        );
        let rows = std::fs::read_to_string(run.join("requests.csv")).expect("requests.csv");
        let in_window = |row: &str| {
            let intended: f64 = row
                .split(',')
                .nth(2)
                .and_then(|t| t.parse().ok())
                .unwrap_or(-1.0)
                / 1e6;
            (start..end).contains(&intended)
        };
        match fault["kind"].as_str() {
            Some("slow") => {
                let slowed: Vec<&str> = rows
                    .lines()
                    .skip(1)
                    .filter(|r| r.split(',').nth(7) == Some(service))
                    .collect();
                assert!(
                    slowed.iter().all(|r| in_window(r)),
                    "{name}: slowed outside its window"
                );
                assert!(
                    rows.lines()
                        .skip(1)
                        .map(|r| r.split(',').nth(7).unwrap_or(""))
                        .all(|s| s.is_empty() || s == service),
                    "{name}: another hop slowed"
                );
            }
            Some("error") => {
                let injected = format!("injected error at hop \"\"{service}\"\"");
                let errors: Vec<&str> = rows.lines().filter(|r| r.contains(&injected)).collect();
                assert!(
                    errors.iter().all(|r| in_window(r)),
                    "{name}: errors outside the window"
                );
                let all = rows
                    .lines()
                    .filter(|r| r.contains("injected error at hop"))
                    .count();
                assert_eq!(all, errors.len(), "{name}: errors injected at another hop");
            }
            Some("loss") | Some("delay") => {
                let applied = v["faults"].as_array().expect("the link fault");
                assert_eq!(applied.len(), 1, "{name}: {applied:#?}");
                assert_eq!(applied[0]["hop"], fault["service"], "{name}");
                assert_eq!(
                    applied[0]["replica"].as_u64(),
                    Some(fault["replica"].as_u64().unwrap_or(0)),
                    "{name}"
                );
                if fault["kind"] == "loss" {
                    assert_eq!(applied[0]["loss"], fault["loss"], "{name}");
                } else {
                    assert_eq!(applied[0]["delay_us"], fault["delay_us"], "{name}");
                }
            }
            Some("kill") => {
                let kills = v["kills"].as_array().expect("kills");
                assert_eq!(kills.len(), 1, "{name}: {kills:#?}");
                assert_eq!(kills[0]["hop"], fault["service"], "{name}");
                assert_eq!(kills[0]["replica"], fault["replica"], "{name}");
            }
            _ => {}
        }
        if case["verdict"]["kept"] == true {
            kept.push((name.to_owned(), service.to_owned(), fault.clone()));
        } else {
            assert!(
                !out.join(name).exists(),
                "{name}: a dropped case has no folder"
            );
        }
    }
    eprintln!(
        "cases kept: {:?}",
        kept.iter().map(|k| &k.0).collect::<Vec<_>>()
    );
    assert!(!kept.is_empty(), "no case kept:\n{output}");

    // A kept case's folder: its label, the metrics, the traces without
    // the truth, the logs, the rankings.
    for (name, service, fault) in &kept {
        let case = out.join(name);
        let label = json(&case.join("label.json"));
        assert_eq!(&label["fault"], fault, "{name}");
        assert_eq!(label["service"].as_str(), Some(service.as_str()));
        let start_unix = label["start_unix_s"].as_f64().expect("start_unix_s");
        assert_eq!(
            read_lossy(&case.join("inject_time.txt")).trim(),
            (start_unix.floor() as i64).to_string()
        );
        let metrics = read_lossy(&case.join("metrics.csv"));
        let header: Vec<&str> = metrics.lines().next().unwrap_or("").split(',').collect();
        for hop in ["a", "b", "c"] {
            for m in tailmesh::cases::series::HOP_METRICS {
                assert!(
                    header.contains(&format!("{hop}_{m}").as_str()),
                    "{name}: {header:?}"
                );
            }
        }
        let times: Vec<f64> = metrics
            .lines()
            .skip(1)
            .filter_map(|l| l.split(',').next()?.parse().ok())
            .collect();
        assert!(
            times.len() >= 4 * slowdown() as usize,
            "{name}: {} rows",
            times.len()
        );
        assert!(
            times.windows(2).all(|w| (w[1] - w[0] - 1.0).abs() < 1e-6),
            "{name}: {times:?}"
        );
        assert!(
            times[0] <= start_unix && start_unix < times[times.len() - 1] + 1.0,
            "{name}"
        );
        // The broker and its queue for c were sampled too.
        let depth = header.iter().position(|h| *h == "broker_queue-c");
        assert!(
            header.contains(&"broker_mem") && depth.is_some(),
            "{name}: {header:?}"
        );
        assert!(
            metrics.lines().skip(1).any(|l| l
                .split(',')
                .nth(depth.unwrap_or(0))
                .is_some_and(|d| d.parse::<u64>().is_ok())),
            "{name}: no queue depth sampled"
        );
        // The processes were sampled: every hop used some CPU and memory.
        let cpu = header.iter().position(|h| *h == "a_mem").expect("a_mem");
        assert!(
            metrics.lines().skip(1).any(|l| l
                .split(',')
                .nth(cpu)
                .and_then(|m| m.parse::<f64>().ok())
                .is_some_and(|m| m > 0.0)),
            "{name}: no memory sampled"
        );
        let jaeger = read_lossy(&case.join("traces.jaeger.json"));
        assert!(jaeger.contains("\"data\""), "{name}");
        assert!(
            !jaeger.contains("\"key\":\"slow\"")
                && !jaeger.contains("work_ns")
                && !jaeger.contains("injected"),
            "{name}"
        );
        let otlp = json(&case.join("traces.otlp.json"));
        assert!(
            otlp["resourceSpans"]
                .as_array()
                .is_some_and(|r| !r.is_empty()),
            "{name}"
        );
        assert!(case.join("logs").join("hop-a-0.log").exists(), "{name}");
        assert!(
            !case.join("logs").join("hop-a-0.json").exists(),
            "{name}: configs stay out"
        );
        for method in ["tailmesh", "p99-rise", "slow-own-time"] {
            let r = json(&case.join("rankings").join(format!("{method}.json")));
            let names: Vec<&str> = r["ranking"]
                .as_array()
                .expect("ranking")
                .iter()
                .filter_map(|s| s["service"].as_str())
                .collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(sorted, ["a", "b", "c"], "{name} {method}");
        }
    }

    // An outside tool that always names the truth, and one that names it last.
    let right = dir.path().join("right");
    let wrong = dir.path().join("wrong");
    std::fs::create_dir_all(&right).expect("mkdir");
    std::fs::create_dir_all(&wrong).expect("mkdir");
    for (name, service, _) in &kept {
        let others: Vec<&str> = ["a", "b", "c"]
            .into_iter()
            .filter(|s| s != service)
            .collect();
        std::fs::write(
            right.join(format!("{name}.json")),
            format!("[\"{service}\", \"{}\"]", others[0]),
        )
        .expect("write");
        std::fs::write(
            wrong.join(format!("{name}.csv")),
            format!("service\n{}\n{}\n{service}\n", others[0], others[1]),
        )
        .expect("write");
    }
    let scored = tailmesh(
        dir.path(),
        &[
            "cases",
            "score",
            path_str(&out),
            "--ranking",
            path_str(&right),
            "--ranking",
            path_str(&wrong),
        ],
    );
    let text = scored.output();
    assert_eq!(scored.code(), Some(0), "{text}");
    let scores = json(&out.join("scores.json"));
    let methods = scores["methods"].as_array().expect("methods");
    let names: Vec<&str> = methods
        .iter()
        .filter_map(|m| m["method"].as_str())
        .collect();
    assert_eq!(
        names,
        ["tailmesh", "p99-rise", "slow-own-time", "right", "wrong"]
    );
    let all = |m: &Value| {
        m["kinds"]
            .as_array()
            .and_then(|k| k.last())
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(all(&methods[3])["kind"], "all");
    assert_eq!(all(&methods[3])["cases"].as_u64(), Some(kept.len() as u64));
    assert_eq!(all(&methods[3])["ac1"].as_f64(), Some(1.0), "{text}");
    assert_eq!(all(&methods[4])["ac1"].as_f64(), Some(0.0), "{text}");
    assert_eq!(all(&methods[4])["ac3"].as_f64(), Some(1.0), "{text}");
    assert!(
        (all(&methods[4])["avg5"].as_f64().unwrap_or(0.0) - 0.6).abs() < 1e-9,
        "{text}"
    );
    eprintln!("{text}");
}
