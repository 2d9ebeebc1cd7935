//! Fan-out end to end: a root calls four leaves in parallel; every reply
//! path holds all five hops with the right parents, and the measured slow
//! fraction lands on the max-of-k model 1 - (1-p)^k (`--check` passes).

use crate::support::*;

tests! {
    sync a_fan_out_reaches_every_leaf_and_its_tail_follows_max_of_k,
}

fn a_fan_out_reaches_every_leaf_and_its_tail_follows_max_of_k() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/fanout.toml"
    ))
    .expect("read the shipped fan-out scenario");
    let scaled = shipped
        .replace("duration = \"10s\"", "requests = 800")
        .replace("warmup = \"1s\"", "warmup = \"200ms\"")
        // Wider margins than the shipped file: the tests run debug builds
        // on a shared machine, and only injected slowness may cross.
        .replace("extra = \"30ms\"", "extra = \"150ms\"")
        .replace("slow_threshold = \"15ms\"", "slow_threshold = \"75ms\"");
    assert_ne!(
        scaled, shipped,
        "the scenario's load keys changed: update this test"
    );
    let scenario = write(dir.path(), "fanout.toml", &scaled);
    let results = dir.path().join("results");
    let out = tailmesh(dir.path(), &run_args(&scenario, &results, &["--check"]));
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let run_dir = only_run_dir(&results);

    let rows = requests_csv(&run_dir);
    assert_eq!(rows.len(), 800);
    for row in rows.iter().filter(|r| r.status == "ok") {
        let mut hops: Vec<&str> = row.path.iter().map(|(h, _)| h.as_str()).collect();
        // Leaves finish in any order; the root answers last.
        assert_eq!(hops.pop(), Some("root"), "{row:?}");
        hops.sort_unstable();
        assert_eq!(hops, ["leaf-a", "leaf-b", "leaf-c", "leaf-d"], "{row:?}");
    }
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    let c = v.pointer("/compounding").expect("the check ran");
    let f = |key: &str| c.pointer(key).and_then(|x| x.as_f64()).expect(key);
    // The declared model is max-of-4 with p = 0.05.
    assert!(
        (f("/declared_model") - (1.0 - 0.95f64.powi(4))).abs() < 1e-9,
        "{c}"
    );
    assert_eq!(str_at(c, "/verdict"), "pass", "{c}");
    assert!(
        f("/ci_lo") <= f("/model") && f("/model") <= f("/ci_hi"),
        "{c}"
    );
}
