//! Client policies end to end: hedged requests cut the tail of a leaf that
//! is slow 3 % of the time, for a few percent more requests, and the run
//! reports both sides of that trade.

use std::collections::BTreeSet;

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
    // 3 % of plain requests take 100 ms more: its p99 is above 100 ms (a
    // sleep's lower bound, which a busy machine only raises).
    assert!(p99(plain) > 100_000, "plain p99 {} us", p99(plain));

    // A hedge after 15 ms answers the slow ones from another replica.
    // Counted, not timed: comparing the variants' p99s compared two runs
    // of a busy machine's noise. The leaf's slowness is drawn per request
    // id and attempt, the same in both variants, so the plain variant's
    // slow answers name the requests whose first leaf attempt was slow in
    // the hedged one too; there a hedge won when the answer came from a
    // leaf that was not slow. A hedge sent after 15 ms of a 100 ms delay
    // loses only if the machine holds it up for 85 ms more than the
    // attempt it races, so "at least two in three won" leaves a margin no
    // loaded machine crosses by accident (a hedge loses on its own merits
    // only when it is slow too: 3 % of them).
    let rows = requests_csv(&run_dir);
    let slow_leaf = |variant: &str| -> BTreeSet<u64> {
        rows.iter()
            .filter(|r| r.variant == variant && r.slow_hops.iter().any(|h| h == "leaf"))
            .map(|r| r.id)
            .collect()
    };
    let (slow_plain, slow_hedged) = (slow_leaf("plain"), slow_leaf("hedged"));
    // requests.csv marks the requests that had a hedge at any hop: none
    // without a policy; with one, at most one per extra attempt counted.
    let retried = |variant: &str| {
        rows.iter()
            .filter(|r| r.variant == variant && r.retried)
            .count() as u64
    };
    assert_eq!(retried("plain"), 0);
    assert!(
        (1..=u64_at(hedged, "/extra_attempts")).contains(&retried("hedged")),
        "{} hedged rows marked, {} extra attempts",
        retried("hedged"),
        u64_at(hedged, "/extra_attempts")
    );
    // Seeded: the same count every run (3 % of 1500 is 45).
    assert!(
        (20..=80).contains(&slow_plain.len()),
        "{} plain requests answered by a slow leaf",
        slow_plain.len()
    );
    let won = slow_plain.difference(&slow_hedged).count();
    eprintln!(
        "hedging: {won} of {} slow first attempts won by a hedge; p99 {} us hedged, {} us plain; \
         extra load {:?}",
        slow_plain.len(),
        p99(hedged),
        p99(plain),
        hedged.pointer("/extra_load")
    );
    assert!(
        won * 3 >= slow_plain.len() * 2,
        "hedges won {won} of {} slow first attempts; still slow when hedged: {slow_hedged:?}",
        slow_plain.len()
    );
    assert!(
        slow_hedged.len() * 3 < slow_plain.len(),
        "{} hedged requests answered by a slow leaf against {} plain",
        slow_hedged.len(),
        slow_plain.len()
    );

    // requests.csv has each attempt of front's call to the leaf: one, ok,
    // without a policy; with the hedge, exactly one ok and the rest failed
    // or cancelled, every hedge sent at 15 ms or later. Where a hedge won
    // over a slow first attempt, that first attempt was cancelled.
    let leaf_call = |r: &Row| -> Vec<(u64, u64, String)> {
        let front = r
            .path
            .iter()
            .position(|(hop, _)| hop == "front")
            .expect("front on the path");
        let (hop, rest) = r.calls[front]
            .split_once('@')
            .expect("one call: hop@call_us:attempts");
        assert_eq!(hop, "leaf", "{r:?}");
        let (_, attempts) = rest.split_once(':').expect("call_us:attempts");
        attempts_of(attempts)
    };
    for r in &rows {
        assert_eq!(r.calls.len(), r.path.len(), "{r:?}");
        let generator = attempts_of(&r.attempts);
        assert_eq!(generator.len(), 1, "the generator has no policy: {r:?}");
        assert_eq!(generator[0].2, "ok", "{r:?}");
        let attempts = leaf_call(r);
        if r.variant == "plain" {
            assert_eq!(attempts.len(), 1, "{r:?}");
            assert_eq!((attempts[0].0, attempts[0].2.as_str()), (0, "ok"), "{r:?}");
            continue;
        }
        let ends: Vec<&str> = attempts.iter().map(|a| a.2.as_str()).collect();
        assert_eq!(ends.iter().filter(|e| **e == "ok").count(), 1, "{r:?}");
        assert!(
            ends.iter()
                .all(|e| ["ok", "failed", "cancelled"].contains(e)),
            "{r:?}"
        );
        assert!(
            attempts[1..].iter().all(|a| a.0 >= 15_000_000),
            "hedges go after 15 ms: {r:?}"
        );
        if slow_plain.contains(&r.id) && !slow_hedged.contains(&r.id) {
            assert_eq!(ends[0], "cancelled", "the slow first attempt lost: {r:?}");
        }
    }

    let extra = |v: &serde_json::Value| {
        v.pointer("/extra_load")
            .and_then(|x| x.as_f64())
            .expect("extra_load")
    };
    assert_eq!(extra(plain), 0.0);
    // Every slow first attempt was hedged (it cannot answer within 15 ms);
    // a busy machine only adds hedges, so this bound holds anywhere.
    assert!(
        u64_at(hedged, "/extra_attempts") >= slow_plain.len() as u64,
        "{} extra attempts for {} slow first attempts",
        u64_at(hedged, "/extra_attempts"),
        slow_plain.len()
    );
    // About the slow share of the hop calls were hedged (half of all calls
    // go to the leaf): 1.2 % extra requests on a quiet machine, where a
    // fast call (1 ms on average) outlasts 15 ms once in three million by
    // its draw. A busy machine adds hedges by holding fast calls up past
    // 15 ms: 1.7 % to 2.5 % with two busy loops on the two cores. Over
    // 10 %, one in six of the leaf's fast calls would have been held up
    // that long, for the whole run: hedging would not be cheap any more.
    assert!(
        (0.005..0.10).contains(&extra(hedged)),
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
