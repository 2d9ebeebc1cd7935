//! Client policies end to end: hedged requests cut the tail of a leaf that
//! is slow 2 % of the time, for a few percent more requests, and the run
//! reports both sides of that trade.

use crate::support::*;

tests! {
    sync hedging_cuts_the_tail_for_a_few_percent_more_requests,
    sync a_hedge_delay_longer_than_the_timeout_is_refused_with_its_place,
}

const HEDGING: &str = r#"
name = "hedging"
seed = 17

[load]
mode = "open"
rate = 300
requests = 1500
timeout = "2s"

[[hop]]
name = "front"

[[hop]]
name = "leaf"
replicas = 3
work = { kind = "sleep", dist = "exp", mean = "1ms" }
slow = { probability = 0.03, extra = "100ms" }

[[variant]]
name = "plain"

[[variant]]
name = "hedged"
set = { "hop.leaf.client" = { hedge_after = "15ms" } }
"#;

fn hedging_cuts_the_tail_for_a_few_percent_more_requests() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "hedging.toml", HEDGING);
    let results = dir.path().join("results");
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
    let summary = summary(&run_dir);
    let v = variants(&summary);
    let (plain, hedged) = (&v[0], &v[1]);
    for variant in [plain, hedged] {
        assert_eq!(
            u64_at(variant, "/ok"),
            1500,
            "every request answered: {variant}"
        );
    }
    let p99 = |v: &serde_json::Value| u64_at(v, "/latency/p99_us");
    // 3 % of plain requests take 100 ms more: its p99 is above 100 ms.
    assert!(p99(plain) > 100_000, "plain p99 {} us", p99(plain));
    // A hedge after 15 ms answers them from another replica.
    assert!(
        p99(hedged) * 3 < p99(plain),
        "hedged p99 {} us vs plain {} us",
        p99(hedged),
        p99(plain)
    );
    let extra = |v: &serde_json::Value| {
        v.pointer("/extra_load")
            .and_then(|x| x.as_f64())
            .expect("extra_load")
    };
    assert_eq!(extra(plain), 0.0);
    // About the slow share of the hop calls were hedged (half of all calls
    // go to the leaf): between 0.5 % and 5 % extra requests.
    assert!(
        (0.005..0.05).contains(&extra(hedged)),
        "extra load {}",
        extra(hedged)
    );
    assert!(
        finished.output().contains("hedged vs plain:")
            && finished.output().contains("extra requests"),
        "{}",
        finished.output()
    );
}

fn a_hedge_delay_longer_than_the_timeout_is_refused_with_its_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = HEDGING.replace(
        "hedge_after = \"15ms\" }",
        "hedge_after = \"50ms\", timeout = \"20ms\" }",
    );
    let scenario = write(dir.path(), "bad.toml", &bad);
    let out = tailmesh(dir.path(), &["validate", path_str(&scenario)]);
    assert_eq!(out.code(), Some(2), "{}", out.output());
    let line = bad
        .lines()
        .position(|l| l.contains("hedge_after"))
        .expect("the line")
        + 1;
    assert!(
        out.output().contains(&format!("bad.toml:{line}:"))
            && out.output().contains("shorter than the timeout"),
        "{}",
        out.output()
    );
}
