//! The pull transport end to end: the real binary on small scenarios with
//! hops reached through the broker, its results read back and checked
//! against the broker's own statistics.
//!
//! Running, waiting and reading results live in `support` (shared with
//! `run.rs`): runs are serialized, every run has a deadline, every wait is
//! on a condition with a deadline; nothing sleeps and hopes.

use std::{
    collections::HashMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::support::*;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;
use tailmesh_services::broker::{BrokerClient, TopicStats};

tests! {
    sync a_pull_worker_killed_mid_run_loses_no_request,
    sync pull_beats_push_at_p99_with_one_slow_replica,
    sync ctrl_c_stops_the_run_writes_partial_results_and_leaves_no_process,
    sync a_mixed_push_pull_chain_and_an_all_pull_chain_answer_every_request,
}

/// The broker's statistics for `topic` now, asked over its own Stats RPC
/// (`None` while it does not answer yet).
fn topic_stats(
    runtime: &tokio::runtime::Runtime,
    broker: SocketAddr,
    topic: &str,
) -> Option<TopicStats> {
    runtime.block_on(async {
        let mut client = BrokerClient::connect(broker).await.ok()?;
        client.stats(Some(topic)).await.ok()?.into_iter().next()
    })
}

// ---------------------------------------------------------------------------
// 1. A pull worker SIGKILLed mid-run: its tasks are redelivered.

fn a_pull_worker_killed_mid_run_loses_no_request() {
    let scratch = Scratch::shared();
    // Each task sleeps 200 ms and arrives every 10 ms: about 20 tasks are
    // held at any moment, ten per worker (the broker hands tasks to workers
    // with credit in turn). Credit 40 lets the survivor take the victim's
    // share as well, so nothing queues for long and nothing times out.
    let scenario = write(
        scratch.path(),
        "kill-pull.toml",
        r#"
name = "kill-pull"
seed = 5

[load]
mode = "open"
rate = 100
arrivals = "uniform"
duration = "4s"
timeout = "3s"

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"
replicas = 2
concurrency = 40
work = { kind = "sleep", dist = "fixed", value = "200ms" }
"#,
    );
    let results = scratch.results();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut run = Running::start(scratch.path(), &run_args(&scenario, &results, &[]));

    // Kill once both workers are connected and the broker says at least
    // ten tasks are held: then each worker holds some.
    let (victim, held) = run.wait_for("waiting for tasks held by both pull workers", || {
        let victim = pid_of(&results, "base", "hop-b-1")?;
        let stats = topic_stats(&runtime, addr_of(&results, "base", "broker")?, "b")?;
        (stats.workers == 2 && stats.in_flight >= 10).then_some((victim, stats.in_flight))
    });
    assert!(
        runs_ours(victim, scratch.marker()),
        "pid {victim} is not hop-b-1"
    );
    kill(Pid::from_raw(victim as i32), Signal::SIGKILL).expect("SIGKILL hop-b-1");
    let Accounted {
        ref v, ref context, ..
    } = accounted(run.wait(), &results);
    assert!(!runs_ours(victim, scratch.marker()));

    // The broker put back what the dead worker held and the survivor did
    // it: no producer saw the loss.
    let (sent, ok) = (u64_at(v, "/sent"), u64_at(v, "/ok"));
    assert_eq!(
        ok, sent,
        "a request failed although pull redelivers:\n{context}"
    );
    assert!(errors(v).is_empty(), "{context}");
    let b = broker_topic(v, "b");
    let stat = |field: &str| u64_at(b, &format!("/{field}"));
    assert!(
        stat("redelivered") >= 1,
        "the killed worker held tasks ({held} in flight at the kill), none redelivered:\n{context}"
    );
    // Every task enqueued ended exactly one way.
    let terminal: u64 = [
        "completed",
        "failed",
        "expired",
        "expired_in_flight",
        "lost",
        "abandoned",
        "shutdown_unanswered",
    ]
    .iter()
    .map(|f| stat(f))
    .sum();
    assert_eq!(
        terminal,
        stat("enqueued"),
        "terminal outcomes vs enqueued:\n{context}"
    );
    // Each producer got exactly one answer: one task per request, each
    // completed once, each redelivery one extra dispatch.
    assert_eq!(stat("enqueued"), sent, "{context}");
    assert_eq!(stat("completed"), ok, "{context}");
    assert_eq!(
        stat("dispatched"),
        stat("completed") + stat("redelivered"),
        "{context}"
    );
    assert_eq!(stat("lost"), 0, "{context}");
    assert_eq!(stat("in_flight"), 0, "{context}");
    assert_eq!(
        stat("workers"),
        1,
        "the dead worker is still registered:\n{context}"
    );

    // Replica 1 answered only before it died; the path split matches ok.
    let split = replica_requests(hop(v, "b"));
    assert_eq!(split.iter().sum::<u64>(), ok, "{context}");
    assert!(split[1] < split[0], "{split:?}:\n{context}");

    assert_killed_replica_is_the_incident(v, victim, context);
}

// ---------------------------------------------------------------------------
// 2. One slow replica: pull's tail beats round-robin push's.

fn pull_beats_push_at_p99_with_one_slow_replica() {
    let scratch = Scratch::new();
    // The worker's replicas take 4 ms and 40 ms, one request at a time:
    // 250/s and 25/s. Round robin sends the slow one 40/s of the 80/s, so
    // its backlog grows by 15/s (to about 1.8 s of waiting after 3 s).
    // Pulled, the fast replica takes whatever arrives while the slow one is
    // busy, and a request waits at most about one slow service time.
    let scenario = write(
        scratch.path(),
        "slow-replica-small.toml",
        r#"
name = "slow-replica-small"
seed = 13

[load]
mode = "open"
rate = 80
arrivals = "uniform"
duration = "3s"
timeout = "10s"

[[hop]]
name = "front"

[[hop]]
name = "worker"
replicas = 2
concurrency = 1
balance = "round_robin"
work = { kind = "sleep", dist = "fixed", value = "4ms" }
replica_slow = { replica = 1, factor = 10 }

[[variant]]
name = "push"
set = { "hop.worker.transport" = "push" }

[[variant]]
name = "pull"
set = { "hop.worker.transport" = "pull" }
"#,
    );
    let (finished, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let summary = summary(&run_dir);
    let context = format!("{summary:#}\n{}", finished.output());
    let by_name = variants_by_name(&summary);
    let (push, pull) = (by_name["push"], by_name["pull"]);
    for v in [push, pull] {
        assert_accounted(v, &context);
        // A generous timeout: every request is in the percentiles.
        assert_eq!(u64_at(v, "/ok"), u64_at(v, "/sent"), "{context}");
    }
    assert_eq!(str_at(hop(push, "worker"), "/transport"), "push");
    assert_eq!(str_at(hop(pull, "worker"), "/transport"), "pull");

    let p99 = |v: &Value| u64_at(v, "/latency/p99_us");
    assert!(
        2 * p99(pull) < p99(push),
        "pull p99 {} us is not under half of push p99 {} us:\n{context}",
        p99(pull),
        p99(push)
    );

    // Round robin splits evenly; pull sends most to the fast replica.
    let push_split = replica_requests(hop(push, "worker"));
    assert!(push_split[0].abs_diff(push_split[1]) <= 1, "{push_split:?}");
    let pull_split = replica_requests(hop(pull, "worker"));
    assert!(
        pull_split[0] > 2 * pull_split[1],
        "pull split {pull_split:?}: the fast replica took too little:\n{context}"
    );
    assert_eq!(
        u64_at(broker_topic(pull, "worker"), "/completed"),
        u64_at(pull, "/ok")
    );
}

// ---------------------------------------------------------------------------
// 3. Ctrl-C: exit 130, partial results written, no process left.

fn ctrl_c_stops_the_run_writes_partial_results_and_leaves_no_process() {
    let scratch = Scratch::new();
    // 50 ms of work at 100/s: a few requests are in flight at any moment,
    // and Ctrl-C must let them finish rather than drop them.
    const RATE: u64 = 100;
    // Stopping waits for the requests in flight (at most their 1 s
    // timeout), gives the hops their 3 s to drain, and writes the results:
    // about 4 s at worst. The bound leaves a loaded machine more than three
    // times that, and still tells a run that stopped at the interrupt from
    // one that did not: with 60 s of load, that one runs into the run's
    // deadline (40 s from its start) or past this bound, however slowly it
    // started.
    const STOP_BOUND: Duration = Duration::from_secs(15);
    let scenario = write(
        scratch.path(),
        "long.toml",
        &format!(
            r#"
name = "long"
seed = 2

[load]
mode = "open"
rate = {RATE}
arrivals = "uniform"
duration = "60s"
timeout = "1s"

[[hop]]
name = "a"

[[hop]]
name = "b"
work = {{ kind = "sleep", dist = "fixed", value = "50ms" }}
"#
        ),
    );
    let results = scratch.results();
    let mut run = Running::start(scratch.path(), &run_args(&scenario, &results, &[]));

    // Measuring: the variant was announced, and hop a (launched last) has
    // called hop b, so requests flow through both.
    let mut seen: HashMap<(String, String), u32> = HashMap::new();
    let output = run.output_reader();
    run.wait_for("the load to flow", || {
        seen.extend(pid_files(&results));
        let announced = output().contains("variant base:");
        let flowing = match (
            pid_of(&results, "base", "hop-a-0"),
            addr_of(&results, "base", "hop-b-0"),
        ) {
            (Some(a), Some(b)) => connected(a, b.port()),
            _ => false,
        };
        (announced && flowing).then_some(())
    });
    let running_for = run.elapsed();
    let tailmesh_pid = run.pid();
    kill(Pid::from_raw(tailmesh_pid as i32), Signal::SIGINT).expect("SIGINT tailmesh");
    let interrupted_at = Instant::now();
    let finished = run.wait_meanwhile(|| seen.extend(pid_files(&results)));
    let stopped_in = interrupted_at.elapsed();

    assert_eq!(finished.code(), Some(130), "{}", finished.output());
    assert!(
        stopped_in < STOP_BOUND,
        "took {stopped_in:?} to stop after SIGINT:\n{}",
        finished.output()
    );
    assert!(
        finished.stderr.contains("interrupted"),
        "the terminal does not say it was interrupted:\n{}",
        finished.output()
    );

    let mut names: Vec<&str> = seen.keys().map(|(_, n)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["hop-a-0", "hop-b-0"], "pid files seen");
    let left: Vec<_> = seen
        .iter()
        .filter(|(_, pid)| runs_ours(**pid, scratch.marker()))
        .collect();
    assert!(left.is_empty(), "still running after Ctrl-C: {left:?}");
    assert!(pid_files(&results).is_empty(), "pid files left behind");

    let run_dir = only_run_dir(&results);
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    let context = format!("{v:#}\n{}", finished.output());
    assert_eq!(
        v.pointer("/interrupted"),
        Some(&Value::Bool(true)),
        "{context}"
    );
    assert_accounted(v, &context);
    assert_eq!(
        u64_at(v, "/ok"),
        u64_at(v, "/sent"),
        "requests in flight at the interrupt were not finished:\n{context}"
    );
    // It stopped sending at the interrupt, long before the 60 s were up.
    let sent = u64_at(v, "/sent");
    let stopped_by = running_for + stopped_in;
    eprintln!("interrupted after {running_for:?}, stopped in {stopped_in:?}, {sent} sent");
    assert!(
        sent <= RATE * stopped_by.as_millis() as u64 / 1000 + 1,
        "{sent} sent within {stopped_by:?} at {RATE}/s:\n{context}"
    );
    assert_eq!(requests_csv(&run_dir).len() as u64, sent);
}

// ---------------------------------------------------------------------------
// 4. A chain mixing push and pull, and the same chain all pull.

fn a_mixed_push_pull_chain_and_an_all_pull_chain_answer_every_request() {
    let scratch = Scratch::shared();
    let scenario = write(
        scratch.path(),
        "mixed.toml",
        r#"
name = "mixed"
seed = 4

[load]
mode = "open"
rate = 150
requests = 300
timeout = "3s"

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"
replicas = 2
work = { kind = "sleep", dist = "exp", mean = "3ms" }

[[hop]]
name = "c"

[[variant]]
name = "mixed"

[[variant]]
name = "pull"
set = { "hop.*.transport" = "pull" }
"#,
    );
    let (finished, run_dir) = run_ok(scratch.path(), &scenario, &scratch.results());
    let summary = summary(&run_dir);
    let context = format!("{summary:#}\n{}", finished.output());
    let by_name = variants_by_name(&summary);
    let (mixed, pull) = (by_name["mixed"], by_name["pull"]);

    // Every request ok, each path naming the chain innermost first.
    let rows = requests_csv(&run_dir);
    for name in ["mixed", "pull"] {
        let v = by_name[name];
        assert_accounted(v, &context);
        assert_eq!(u64_at(v, "/ok"), 300, "variant {name}:\n{context}");
        let mine: Vec<&Row> = rows.iter().filter(|r| r.variant == name).collect();
        assert_eq!(mine.len(), 300, "variant {name}");
        for r in mine {
            assert_eq!(r.status, "ok", "{r:?}");
            let hops: Vec<&str> = r.path.iter().map(|(h, _)| h.as_str()).collect();
            assert_eq!(hops, ["c", "b", "a"], "{r:?}");
            assert!(
                r.path.iter().all(|(h, i)| *i == 0 || (h == "b" && *i == 1)),
                "{r:?}"
            );
        }
    }

    let transports = |v: &Value| -> Vec<String> {
        ["a", "b", "c"]
            .iter()
            .map(|h| str_at(hop(v, h), "/transport").to_string())
            .collect()
    };
    assert_eq!(transports(mixed), ["push", "pull", "push"]);
    assert_eq!(str_at(mixed, "/transport"), "mixed");
    assert_eq!(transports(pull), ["pull", "pull", "pull"]);
    assert_eq!(str_at(pull, "/transport"), "pull");

    // The broker saw exactly the pulled hops, each request once.
    let topics = |v: &Value| -> Vec<String> {
        v.pointer("/broker")
            .and_then(Value::as_array)
            .map(|t| t.iter().map(|s| str_at(s, "/topic").to_string()).collect())
            .unwrap_or_default()
    };
    assert_eq!(topics(mixed), ["b"], "{context}");
    assert_eq!(topics(pull), ["a", "b", "c"], "{context}");
    for (v, topic) in [(mixed, "b"), (pull, "a"), (pull, "b"), (pull, "c")] {
        let t = broker_topic(v, topic);
        assert_eq!(u64_at(t, "/enqueued"), 300, "topic {topic}:\n{context}");
        assert_eq!(u64_at(t, "/completed"), 300, "topic {topic}:\n{context}");
    }

    // Queue wait is the broker's (and a full replica's): it shows on the
    // pulled hop and on no pushed hop without a concurrency limit.
    let max_wait = |v: &Value, h: &str| u64_at(hop(v, h), "/queue_wait/max_us");
    assert!(max_wait(mixed, "b") > 0, "{context}");
    for h in ["a", "c"] {
        assert_eq!(
            max_wait(mixed, h),
            0,
            "push hop {h} with unlimited concurrency reports a queue wait:\n{}",
            hop(mixed, h)
        );
    }
}
