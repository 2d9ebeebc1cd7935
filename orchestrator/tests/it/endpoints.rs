//! Replicas that die or go dark under a mesh client: `kill` carried out by
//! the local launcher (the death is no incident, the replica comes back at
//! its address, every request is accounted for, and what the callers did
//! with the dead replica is counted), and a black-holed replica found by
//! HTTP/2 keepalive (netns, root).
//!
//! What the callers report (endpoint events, pick counts) comes from the
//! push client: the load generator's own pool (generator processes' over
//! their connections to the orchestrator), and each calling hop's through
//! its Control API's `GetEndpointEvents`. Every caller here has
//! endpoint health, so a kill or a black hole with no event about it is a
//! failure, not a reason to judge less.

use crate::support::*;
use serde_json::Value;

tests! {
    sync a_replica_killed_on_schedule_is_no_incident_and_health_keeps_calls_off_it,
    sync generator_processes_count_their_calls_to_a_killed_replica,
    sync keepalive_finds_a_black_holed_replica,
}

/// Two variants, `health` (the default client) and `naive`, of an entry
/// hop `a` with 2 replicas, replica 1 killed 1.5 s into the measured phase
/// and back 2 s later, in front of `b`.
const KILLED: &str = r#"
name = "killed"
seed = 5

[load]
mode = "open"
rate = 200
arrivals = "uniform"
duration = "5s"
warmup = "500ms"
timeout = "1s"

[[hop]]
name = "a"
replicas = 2
backoff = { initial = "250ms", max = "500ms" }
kill = { replica = 1, at = "1.5s", back = "2s" }

[[hop]]
name = "b"

[check]
max_error_rate = 0.6

[telemetry]
sampling = 0.0

[[variant]]
name = "health"

[[variant]]
name = "naive"
set = { "hop.a.health" = false }
"#;

/// The calls each caller sent to the killed replica while it was down.
fn picks_while_down(kill: &Value) -> Vec<(String, u64)> {
    kill["picks_while_down"]
        .as_array()
        .map(|callers| {
            callers
                .iter()
                .map(|c| (str_at(c, "/caller").to_owned(), u64_at(c, "/picks")))
                .collect()
        })
        .unwrap_or_default()
}

/// The events every caller reported about `hop`'s replica `replica`, in
/// time order: (kind, reason).
fn events_of(v: &Value, hop: &str, replica: u64) -> Vec<(String, String)> {
    let mut events: Vec<(f64, String, String)> = v["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["hop"] == hop)
        .flat_map(|c| c["events"].as_array().into_iter().flatten())
        .filter(|e| e["replica"].as_u64() == Some(replica))
        .map(|e| {
            (
                e["at_s"].as_f64().unwrap_or(f64::NAN),
                str_at(e, "/kind").to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    events.into_iter().map(|(_, k, r)| (k, r)).collect()
}

fn a_replica_killed_on_schedule_is_no_incident_and_health_keeps_calls_off_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "killed.toml", KILLED);
    let results = dir.path().join("results");
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
    let summary = summary(&run_dir);
    let by_name = variants_by_name(&summary);
    let mut errors_of = std::collections::BTreeMap::new();
    for (name, v) in &by_name {
        let context = format!("{name}: {v:#}\n{}", finished.output());
        assert_accounted(v, &context);
        // The scheduled death is not an incident, and it happened.
        assert!(v.get("incidents").is_none(), "{context}");
        let kills = v["kills"].as_array().expect("kills in summary.json");
        assert_eq!(kills.len(), 1, "{context}");
        let kill = &kills[0];
        assert_eq!((str_at(kill, "/hop"), u64_at(kill, "/replica")), ("a", 1));
        assert_eq!(kill["at_s"].as_f64(), Some(1.5), "{context}");
        assert_eq!(kill["back_s"].as_f64(), Some(3.5), "{context}");
        let killed = kill["killed_at_s"].as_f64().expect("killed");
        let restarted = kill["restarted_at_s"].as_f64().expect("restarted");
        assert!(killed < restarted, "{context}");
        assert!(
            finished
                .stdout
                .contains(&format!("{name}: kill: a/1 at 1.50 s")),
            "{}",
            finished.output()
        );
        // The restart listened where the replica had: its log holds a
        // second launch, told its address.
        let log = read_lossy(&run_dir.join("logs").join(name).join("hop-a-1.log"));
        let launches: Vec<&str> = log.lines().filter(|l| l.contains(" launching ")).collect();
        assert_eq!(launches.len(), 2, "{log}");
        assert!(
            !launches[0].contains("--listen") && launches[1].contains("--listen 127.0.0.1:"),
            "{launches:#?}"
        );
        // The load generator calls `a`: it always counts its picks.
        let down = picks_while_down(kill);
        assert_eq!(
            down.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
            ["loadgen"],
            "{context}"
        );
        errors_of.insert(*name, (errors(v).values().sum::<u64>(), down[0].1));
    }
    // About half the 400 requests sent while the replica was down went to
    // it under the naive client, and each failed.
    let (naive_errors, naive_down) = errors_of["naive"];
    assert!(
        naive_down >= 150,
        "naive: {naive_down} calls to the dead replica"
    );
    assert!(
        naive_errors >= naive_down,
        "naive: {naive_errors} errors for {naive_down} calls to the dead replica"
    );

    // The load generator's pool (the default client, with endpoint
    // health) saw the replica fail, kept calls off it, and took it back.
    let health = by_name["health"];
    let events = events_of(health, "a", 1);
    assert!(
        !events.is_empty(),
        "the load generator reported no endpoint events about the killed a/1:\n{health:#}\n{}",
        finished.output()
    );
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    let failed = kinds
        .iter()
        .position(|k| *k == "transient_failure")
        .unwrap_or_else(|| panic!("no transient_failure for a/1: {events:?}"));
    assert!(
        kinds[failed..].contains(&"ready"),
        "a/1 never ready again: {events:?}"
    );
    // The count starts when the launcher has reaped the replica: a call
    // picked before the load generator read the end of its connection
    // may be in it; none after.
    let (health_errors, health_down) = errors_of["health"];
    assert!(
        health_down <= 1,
        "health: {health_down} calls sent to the dead replica: {health:#}"
    );
    // Only the calls in flight on it when it died fail.
    assert!(
        health_errors * 10 <= naive_errors,
        "health {health_errors} errors, naive {naive_errors}"
    );
}

/// The same kill with two generator processes sending the load: each is
/// asked for its pool's picks at the kill and at the restart over its
/// frame connection, and counts as `loadgen/<index>`.
fn generator_processes_count_their_calls_to_a_killed_replica() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let text = KILLED.replace("[load]\n", "[load]\ngenerators = 2\n");
    assert_ne!(text, KILLED, "the scenario's [load] takes the generators");
    let scenario = write(dir.path(), "killed.toml", &text);
    let results = dir.path().join("results");
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
    let summary = summary(&run_dir);
    let by_name = variants_by_name(&summary);
    let mut down_of = std::collections::BTreeMap::new();
    for (name, v) in &by_name {
        let context = format!("{name}: {v:#}\n{}", finished.output());
        assert_accounted(v, &context);
        assert!(v.get("incidents").is_none(), "{context}");
        let kill = &v["kills"][0];
        assert!(kill["restarted_at_s"].as_f64().is_some(), "{context}");
        let down = picks_while_down(kill);
        assert_eq!(
            down.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
            ["loadgen/0", "loadgen/1"],
            "{context}"
        );
        // Each generator's count is its own pool's: between the two
        // reads, it sent at most the calls it picked in all.
        for (caller, picks) in &down {
            let all = v["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["caller"] == caller.as_str() && c["hop"] == "a")
                .map(|c| u64_at(c, "/replicas/1/picks"))
                .unwrap_or_else(|| panic!("no endpoint view of {caller}: {context}"));
            assert!(*picks <= all, "{caller}: {picks} of {all}: {context}");
        }
        down_of.insert(*name, (errors(v).values().sum::<u64>(), down));
    }
    // Half the 400 requests sent while the replica was down went to it
    // under the naive client, about half of them from each generator, and
    // each failed.
    let (naive_errors, naive) = &down_of["naive"];
    for (caller, picks) in naive {
        assert!(
            *picks >= 60,
            "naive: {caller} sent {picks} calls to the dead replica"
        );
    }
    let naive_down: u64 = naive.iter().map(|(_, p)| p).sum();
    assert!(
        *naive_errors >= naive_down,
        "naive: {naive_errors} errors for {naive_down} calls to the dead replica"
    );
    // With endpoint health each generator's pool keeps calls off it.
    let (_, health) = &down_of["health"];
    for (caller, picks) in health {
        assert!(
            *picks <= 1,
            "health: {caller} sent {picks} calls to the dead replica"
        );
    }
}

fn keepalive_finds_a_black_holed_replica() {
    require_privilege(&[]);
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(
        dir.path(),
        "blackhole.toml",
        r#"
name = "blackhole"
seed = 9

[load]
mode = "open"
rate = 100
arrivals = "uniform"
duration = "5s"
warmup = "500ms"
timeout = "1s"

[[hop]]
name = "a"

[[hop]]
name = "b"
replicas = 2
keepalive = "500ms"
keepalive_timeout = "500ms"
replica_net = { replica = 1, loss = 1.0, start = "1.5s" }

[check]
max_error_rate = 1.0

[telemetry]
sampling = 0.0
"#,
    );
    let results = dir.path().join("results");
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    let context = format!("{v:#}\n{}", finished.output());
    assert_accounted(v, &context);
    let events = events_of(v, "b", 1);
    assert!(
        !events.is_empty(),
        "hop a reported no endpoint events about the black-holed b/1:\n{context}"
    );
    assert!(
        events
            .iter()
            .any(|(kind, reason)| kind == "transient_failure" && reason.contains("keepalive")),
        "no keepalive TRANSIENT_FAILURE of b/1: {events:?}\n{context}"
    );
    // Its peer was never lost.
    assert!(
        events_of(v, "b", 0)
            .iter()
            .all(|(kind, _)| kind != "transient_failure"),
        "{context}"
    );
    let keepalive_timeouts: u64 = v["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["hop"] == "b")
        .filter_map(|c| c["replicas"][1]["keepalive_timeouts"].as_u64())
        .sum();
    assert!(keepalive_timeouts >= 1, "{context}");
}
