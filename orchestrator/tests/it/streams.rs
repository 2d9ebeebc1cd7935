//! Bidirectional streams (`streaming = "bidi"`, `[load.streams]`): every
//! message relayed hop to hop on streams, answered in band when it fails,
//! accounted for; and a stalled hop holding the messages behind it, each
//! timed from its due time.

use std::time::Duration;

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::support::*;

tests! {
    sync every_message_of_every_stream_crosses_the_chain_and_is_accounted_for,
    sync a_stalled_hop_holds_the_messages_behind_it_and_their_latency_shows_it,
    sync a_killed_hop_breaks_its_streams_and_their_later_messages_are_lost_with_them,
    sync server_streams_carry_every_message_from_the_last_hop_at_its_time,
    sync client_streams_answer_every_message_at_their_end_timed_to_where_it_was_done,
    sync a_killed_hop_loses_what_its_client_streams_carried_and_a_relaying_hop_opens_another,
    sync three_generators_send_the_one_generators_streams_each_whole,
}

/// Runs `scenario` in `scratch` to its end: its first variant, accounted
/// for.
fn run_accounted(scratch: &Scratch, scenario: &std::path::Path) -> Accounted {
    let results = scratch.results();
    let (finished, _) = run_ok(scratch.path(), scenario, &results);
    accounted(finished, &results)
}

/// A 3-hop chain, every hop reached by bidi stream, with `load` and
/// `b_extra` after the hops' common keys.
fn chain(name: &str, load: &str, b_extra: &str) -> String {
    chain_of("bidi", name, load, b_extra)
}

/// [`chain`] with streams of `kind`.
fn chain_of(kind: &str, name: &str, load: &str, b_extra: &str) -> String {
    format!(
        r#"
name = "{name}"
seed = 21

[load]
mode = "open"
{load}

[check]
max_error_rate = 1.0

[[hop]]
name = "a"
streaming = "{kind}"

[[hop]]
name = "b"
streaming = "{kind}"
{b_extra}

[[hop]]
name = "c"
streaming = "{kind}"
work = {{ kind = "sleep", dist = "fixed", value = "1ms" }}
"#
    )
}

/// The chain with streams of `kind` at 200 messages a second for 2 s, 4
/// streams of 25 at once (`load_extra` after those keys), b failing a
/// tenth of the messages in band and `b_extra` after that: run, and what
/// holds whatever the kind checked. Every message sent is accounted for,
/// the failed ones with b's injected error (16 to 64 of 400: 4 sd either
/// way of 40); no failed message broke its stream, so the 20 streams (450
/// messages, warmup's 50 included, dealt to 4 slots in turn, 25 a stream)
/// all held; the load generator and each hop opened one stream to the
/// next per stream it served; every answered message went through c, b
/// and a.
fn twenty_streams(
    scratch: &Scratch,
    kind: &str,
    load_extra: &str,
    b_extra: &str,
) -> (Accounted, Vec<Row>) {
    let (run, rows) = twenty_streams_from(scratch, kind, "", load_extra, b_extra, "");
    assert_eq!(
        picks_of(&run.v, "loadgen", "a"),
        STREAMS,
        "picks of a's replica by the load generator:\n{}",
        run.context
    );
    (run, rows)
}

/// [`twenty_streams`] with `load_keys` in `[load]` before its streams, and
/// `tables` after the hops; the load generator's picks are not checked
/// (generator processes report theirs each under its own name).
fn twenty_streams_from(
    scratch: &Scratch,
    kind: &str,
    load_keys: &str,
    load_extra: &str,
    b_extra: &str,
    tables: &str,
) -> (Accounted, Vec<Row>) {
    let load = format!(
        "rate = 200\nduration = \"2s\"\nwarmup = \"250ms\"\n{load_keys}\n[load.streams]\n\
         streams = 4\nmessages = 25\n{load_extra}"
    );
    let b = format!("error = {{ probability = 0.1, code = \"unavailable\" }}\n{b_extra}");
    let scenario = write(
        scratch.path(),
        &format!("{kind}.toml"),
        &format!("{}{tables}", chain_of(kind, kind, &load, &b)),
    );
    let run = run_accounted(scratch, &scenario);
    let (v, context) = (&run.v, &run.context);
    let (sent, ok) = (u64_at(v, "/sent"), u64_at(v, "/ok"));
    // 2 s at 200 a second, as a unary open loop would send.
    assert_eq!(sent, 400, "{context}");
    let unavailable = errors(v).get("unavailable").copied().unwrap_or(0);
    assert_eq!(sent, ok + unavailable, "{context}");
    assert!((16..=64).contains(&unavailable), "{context}");
    let streams = v.pointer("/streams").expect("the streams' report");
    assert_eq!(u64_at(streams, "/opened"), STREAMS, "{context}");
    assert_eq!(u64_at(streams, "/completed"), STREAMS, "{context}");
    for (caller, hop) in [("a/0", "b"), ("b/0", "c")] {
        assert_eq!(
            picks_of(v, caller, hop),
            STREAMS,
            "picks of {hop}'s replica by {caller}:\n{context}"
        );
    }
    let rows = requests_csv(&run.run_dir);
    assert_eq!(rows.len() as u64, sent, "{context}");
    for row in &rows {
        if row.status == "ok" {
            let hops: Vec<&str> = row.path.iter().map(|(h, _)| h.as_str()).collect();
            assert_eq!(hops, ["c", "b", "a"], "{row:?}");
        } else {
            assert!(row.error.contains("injected error at hop \"b\""), "{row:?}");
        }
    }
    (run, rows)
}

fn every_message_of_every_stream_crosses_the_chain_and_is_accounted_for() {
    let scratch = Scratch::shared();
    // b fails a tenth of the messages in band, which must not end their
    // streams, and slows a twentieth by 30 ms, which holds the next
    // message behind it.
    let (
        Accounted {
            run_dir,
            v,
            context,
            ..
        },
        rows,
    ) = twenty_streams(
        &scratch,
        "bidi",
        "in_flight = 8",
        "slow = { probability = 0.05, extra = \"30ms\" }",
    );
    let v = &v;
    let streams = v.pointer("/streams").expect("the streams' report");
    assert_eq!(
        streams
            .pointer("/aborted")
            .and_then(|a| a.as_object())
            .map(|a| a.len()),
        Some(0),
        "{context}"
    );
    assert_eq!(u64_at(streams, "/refused_by_cap"), 0, "{context}");
    sixteen_timed(streams, &context);
    assert!(
        context.contains(&format!(
            "base: streams: {STREAMS} opened (warmup's included), {STREAMS} held to their end, \
             0 broke; 0 messages refused by the in-flight cap"
        )),
        "{context}"
    );

    assert_places(&rows);

    // Each hop's span joined its message's trace: the context went from
    // process to process in each message.
    let t = &v["traces"];
    assert!(u64_at(t, "/expected") >= 20, "{t:#}");
    assert_eq!(u64_at(t, "/complete"), u64_at(t, "/expected"), "{t:#}");
    assert_eq!(u64_at(t, "/orphan_spans"), 0, "{t:#}");

    // Each kept trace is one message's, its load generator's span marked
    // with the message's stream and place, as requests.csv has them.
    let checked = traces_placed(&run_dir, &rows);
    // The slow ones (b's 30 ms) and the failed ones at least.
    assert!(checked >= 20, "{checked} traces checked:\n{context}");

    // Head-of-line blocking is queue wait, where the messages pile up: a
    // message due 20 ms after one b slowed by 30 ms waits about 10 ms in
    // a's line, since a serves it only once b answered the one before;
    // b and c are sent one message at a time, so nothing waits there.
    let queue_p99 = |name: &str| u64_at(hop(v, name), "/queue_wait/p99_us");
    assert!(queue_p99("a") >= 3_000, "a's queue wait:\n{context}");
    assert!(queue_p99("b") < 1_000, "b's queue wait:\n{context}");
    assert!(queue_p99("c") < 1_000, "c's queue wait:\n{context}");

    // Hop to hop by stream too: each hop opens one stream to the next per
    // stream it serves (one pick of a replica each), not a call per
    // message; none broke, so none was opened again.
    for (caller, hop) in [("loadgen", "a"), ("a/0", "b"), ("b/0", "c")] {
        assert_eq!(
            picks_of(v, caller, hop),
            STREAMS,
            "picks of {hop}'s replica by {caller}:\n{context}"
        );
    }
}

/// The streams of the first test's load: 4 slots x 5.
const STREAMS: u64 = 20;

/// The times of the first test's 16 streams that began after warmup
/// (their first messages are ids 100 to 103, 200 to 203, ... of the one
/// schedule): each one's first answer, and its messages' span: 24 gaps of
/// 20 ms for the 12 whole ones, about 12 for the last 4, cut by the run's
/// end.
fn sixteen_timed(streams: &serde_json::Value, context: &str) {
    assert_eq!(u64_at(streams, "/first_message/count"), 16, "{context}");
    assert_eq!(u64_at(streams, "/duration/count"), 16, "{context}");
    let first_p50 = u64_at(streams, "/first_message/p50_us");
    assert!((1..100_000).contains(&first_p50), "{context}");
    let lasted = u64_at(streams, "/duration/p50_us");
    assert!(
        (480_000..1_000_000).contains(&lasted),
        "{lasted} us:\n{context}"
    );
}

/// Each row says which message of which stream it is: message k of the
/// one schedule is message (k / 4) % 25 of its slot's stream, and the
/// streams open in the order of their first messages.
fn assert_places(rows: &[Row]) {
    for row in rows {
        let (id, slots, per) = (row.id, 4, 25);
        let stream = id / (slots * per) * slots + id % slots;
        assert_eq!(
            row.stream,
            Some((stream, ((id / slots) % per) as u32)),
            "{row:?}"
        );
    }
}

/// Checks that each kept trace of a message in `rows` has its load
/// generator's span marked with the message's stream and place; how many
/// it checked.
fn traces_placed(run_dir: &std::path::Path, rows: &[Row]) -> usize {
    let places: std::collections::HashMap<u64, (u64, u32)> = rows
        .iter()
        .filter_map(|r| Some((r.id, r.stream?)))
        .collect();
    let traces = jaeger_traces(run_dir);
    let mut checked = 0;
    for trace in &traces {
        let spans = trace["spans"].as_array().expect("spans");
        let root = spans
            .iter()
            .find(|s| {
                s["operationName"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("request "))
            })
            .expect("the load generator's span");
        let int = |key: &str| {
            jaeger_attribute(trace, root, key)
                .and_then(|v| v.as_i64())
                .unwrap_or_else(|| panic!("{key} on {root}"))
        };
        let id = int("request_id") as u64;
        if let Some(&(stream, message)) = places.get(&id) {
            assert_eq!(
                (int("stream") as u64, int("stream.message") as u32),
                (stream, message),
                "{root}"
            );
            checked += 1;
        }
    }
    checked
}

/// How many times `caller`'s client (`loadgen`, or `hop/replica`) picked
/// a replica of `hop`: once per call, or once per stream.
fn picks_of(v: &serde_json::Value, caller: &str, hop: &str) -> u64 {
    let pools = v
        .pointer("/endpoints")
        .and_then(|e| e.as_array())
        .unwrap_or_else(|| panic!("the endpoints' events: {v:#}"));
    pools
        .iter()
        .filter(|p| p["caller"] == caller && p["hop"] == hop)
        .flat_map(|p| p["replicas"].as_array().cloned().unwrap_or_default())
        .map(|r| r["picks"].as_u64().unwrap_or(0))
        .sum()
}

fn a_stalled_hop_holds_the_messages_behind_it_and_their_latency_shows_it() {
    // The stall is 200 ms against messages of a few: beside other tests.
    let scratch = Scratch::shared();
    // 2 streams at 100 messages a second each; hop b stops for 200 ms.
    let scenario = write(
        scratch.path(),
        "stall.toml",
        &chain(
            "stall",
            r#"rate = 200
duration = "4s"
warmup = "250ms"
timeout = "2s"

[load.streams]
streams = 2
messages = 200
in_flight = 64"#,
            "",
        ),
    );
    let results = scratch.results();
    let mut run = Running::start(
        scratch.path(),
        &run_args(&scenario, &results, &["--metrics", "127.0.0.1:0"]),
    );
    let metrics = metrics_address(&mut run);
    // Stop b once the measured messages flow through it.
    run.wait_for("a hundred measured messages answered", || {
        let scrape = http_get(&metrics, "/metrics")?;
        (metric_sum(&scrape, "tailmesh_requests_total", &["outcome=\"ok\""]) >= 100.0).then_some(())
    });
    let victim = pid_of(&results, "base", "hop-b-0").expect("hop b's pid");
    assert!(
        runs_ours(victim, scratch.marker()),
        "pid {victim} is not hop-b-0"
    );
    let pid = Pid::from_raw(victim as i32);
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP hop-b-0");
    // The stall itself: what the test injects, not a wait for something.
    std::thread::sleep(STALL);
    kill(pid, Signal::SIGCONT).expect("SIGCONT hop-b-0");
    let Accounted {
        run_dir,
        v,
        context,
        ..
    } = accounted(run.wait(), &results);
    let v = &v;
    // Every message due was sent and answered: the stall loses none.
    assert_eq!(u64_at(v, "/sent"), 800, "{context}");
    assert_eq!(u64_at(v, "/ok"), 800, "{context}");

    // Messages due during the stall waited for its end, each from its
    // due time: about 200 ms for the first, less for each later one. A
    // load that stopped sending while its stream was stuck (coordinated
    // omission) would show one or two slow messages; timed from their due
    // times, the messages of the stall's first 100 ms (10 per stream)
    // each took more than 100 ms.
    let rows = requests_csv(&run_dir);
    let slowest = rows.iter().map(|r| r.latency_ns).max().unwrap_or(0);
    let over_100ms = rows.iter().filter(|r| r.latency_ns > 100_000_000).count();
    assert!(
        slowest >= (STALL - Duration::from_millis(20)).as_nanos() as u64,
        "slowest {slowest} ns:\n{context}"
    );
    assert!(
        over_100ms >= 15,
        "{over_100ms} messages over 100 ms:\n{context}"
    );
    // The rest of the run is fast: the stall is the tail, not the body.
    let p50 = u64_at(v, "/latency/p50_us");
    assert!(p50 < 50_000, "p50 {p50} µs:\n{context}");
}

/// How long hop b is stopped.
const STALL: Duration = Duration::from_millis(200);

fn a_killed_hop_breaks_its_streams_and_their_later_messages_are_lost_with_them() {
    let scratch = Scratch::shared();
    // Two long streams (50 messages a second each, 1,000 each: longer
    // than the run) into hop a, killed at 1 s and back at 1.5 s.
    let scenario = write(
        scratch.path(),
        "broken.toml",
        r#"
name = "broken"
seed = 5

[load]
mode = "open"
rate = 100
duration = "2500ms"
warmup = "200ms"

[load.streams]
streams = 2
messages = 1000

[check]
max_error_rate = 1.0

[[hop]]
name = "a"
streaming = "bidi"
kill = { replica = 0, at = "1s", back = "500ms" }
"#,
    );
    let Accounted {
        run_dir,
        v,
        context,
        ..
    } = run_accounted(&scratch, &scenario);
    let v = &v;
    assert_eq!(u64_at(v, "/sent"), 250, "{context}");
    // Both streams broke when a died, each with the status its messages
    // failed with; none held, none opened again.
    let streams = v.pointer("/streams").expect("the streams' report");
    assert_eq!(u64_at(streams, "/opened"), 2, "{context}");
    assert_eq!(u64_at(streams, "/completed"), 0, "{context}");
    let aborted: u64 = streams
        .pointer("/aborted")
        .and_then(|a| a.as_object())
        .map(|a| a.values().filter_map(|n| n.as_u64()).sum())
        .unwrap_or(0);
    assert_eq!(aborted, 2, "{context}");
    // Answered up to the kill (a second at 100 a second, give or take
    // the kill's moment), lost from then on: every later message failed
    // with its stream, none was sent on a new one.
    let ok = u64_at(v, "/ok");
    assert!((50..=150).contains(&ok), "{ok} answered:\n{context}");
    let rows = requests_csv(&run_dir);
    let first_failed = rows
        .iter()
        .filter(|r| r.status != "ok")
        .map(|r| r.id)
        .min()
        .unwrap_or(u64::MAX);
    assert!(
        rows.iter()
            .filter(|r| r.id > first_failed + 2)
            .all(|r| r.status != "ok"),
        "an answer after its stream broke:\n{context}"
    );
}

fn server_streams_carry_every_message_from_the_last_hop_at_its_time() {
    let scratch = Scratch::shared();
    // The first test's load as server streams: each of the 20 streams is
    // one request for its messages, which c sends at their times (50 a
    // second each), b and a relay.
    let (Accounted { v, context, .. }, _) = twenty_streams(&scratch, "server", "", "");
    let v = &v;
    // Each message came from c at its time, through b and a: timed from
    // its due time, it took about a trip back up the chain. Sent as they
    // come, not when asked for, so none waits in a line.
    let p50 = u64_at(v, "/latency/p50_us");
    assert!(p50 < 20_000, "p50 {p50} us:\n{context}");
    for name in ["a", "b", "c"] {
        let queue = u64_at(hop(v, name), "/queue_wait/p99_us");
        assert!(queue < 1_000, "{name}'s queue wait:\n{context}");
    }
}

fn client_streams_answer_every_message_at_their_end_timed_to_where_it_was_done() {
    let scratch = Scratch::shared();
    // The first test's load as client streams: no message is answered
    // before its stream's end; b slows a twentieth by 30 ms, which holds
    // the next message behind it at b.
    let (Accounted { v, context, .. }, rows) = twenty_streams(
        &scratch,
        "client",
        "",
        "slow = { probability = 0.05, extra = \"30ms\" }",
    );
    let v = &v;
    // Every answered message reached c, and is timed to when c was done
    // with it: never under c's 1 ms of work, though its stream answered
    // it only at its end, up to half a second later.
    for row in rows.iter().filter(|r| r.status == "ok") {
        assert!(row.latency_ns >= 1_000_000, "{row:?}");
    }
    let p50 = u64_at(v, "/latency/p50_us");
    assert!(p50 < 20_000, "p50 {p50} us:\n{context}");
    // Nothing waits for an answer on the way down, so the messages pile
    // up behind a slow one at the slow hop itself: b's queue wait, not
    // a's.
    let queue_p99 = |name: &str| u64_at(hop(v, name), "/queue_wait/p99_us");
    assert!(queue_p99("b") >= 3_000, "b's queue wait:\n{context}");
    assert!(queue_p99("a") < 1_000, "a's queue wait:\n{context}");
    let p99 = u64_at(v, "/latency/p99_us");
    assert!(p99 >= 25_000, "p99 {p99} us:\n{context}");
}

fn a_killed_hop_loses_what_its_client_streams_carried_and_a_relaying_hop_opens_another() {
    let scratch = Scratch::shared();
    // Two client streams longer than the run into a, which relays them
    // to b; b is killed at 1 s and back at 1.5 s.
    let scenario = write(
        scratch.path(),
        "client-broken.toml",
        r#"
name = "client-broken"
seed = 5

[load]
mode = "open"
rate = 100
duration = "2500ms"
warmup = "200ms"

[load.streams]
streams = 2
messages = 1000

[check]
max_error_rate = 1.0

[[hop]]
name = "a"
streaming = "client"

[[hop]]
name = "b"
streaming = "client"
kill = { replica = 0, at = "1s", back = "500ms" }
"#,
    );
    let Accounted {
        run_dir,
        v,
        context,
        ..
    } = run_accounted(&scratch, &scenario);
    let v = &v;
    let (sent, ok) = (u64_at(v, "/sent"), u64_at(v, "/ok"));
    assert_eq!(sent, 250, "{context}");
    let failed: u64 = errors(v).values().sum();
    assert_eq!(sent, ok + failed + u64_at(v, "/timeouts"), "{context}");
    // The load generator's streams to a held: a lost nothing of its own.
    let streams = v.pointer("/streams").expect("the streams' report");
    assert_eq!(u64_at(streams, "/completed"), 2, "{context}");
    // What a relayed to b before the kill was answered only in the reply
    // b never sent: lost with its stream. Those sent while b was down
    // failed; once b was back, a opened another stream, and the rest
    // were answered.
    let rows = requests_csv(&run_dir);
    let lost: Vec<u64> = rows
        .iter()
        .filter(|r| r.error.contains("the stream broke"))
        .map(|r| r.id)
        .collect();
    let answered: Vec<u64> = rows
        .iter()
        .filter(|r| r.status == "ok")
        .map(|r| r.id)
        .collect();
    assert!(lost.len() >= 60, "{} lost:\n{context}", lost.len());
    assert!(
        (50..=110).contains(&answered.len()),
        "{} answered:\n{context}",
        answered.len()
    );
    let last_lost = lost.iter().max().copied().unwrap_or(0);
    assert!(
        answered.iter().all(|id| *id > last_lost),
        "an answer before the kill:\n{context}"
    );
}

fn three_generators_send_the_one_generators_streams_each_whole() {
    let scratch = Scratch::shared();
    // The first test's load shared by three generator processes, every
    // trace kept: each generator forwards its requests' client spans.
    let (run, rows) = twenty_streams_from(
        &scratch,
        "bidi",
        "generators = 3",
        "in_flight = 8",
        "",
        "\n[telemetry]\nkeep_share = 1.0\n",
    );
    let (v, context) = (&run.v, &run.context);
    // Every stream opened, held and was counted once, by the generator
    // that sent it; the messages kept the one generator's ids and places.
    assert_eq!(u64_at(v, "/generators/count"), 3, "{context}");
    let each: Vec<u64> = v["generators"]["each"]
        .as_array()
        .expect("each generator")
        .iter()
        .map(|g| u64_at(g, "/records"))
        .collect();
    assert_eq!(each.iter().sum::<u64>(), rows.len() as u64, "{context}");
    assert!(each.iter().all(|&n| n >= 50), "{each:?}:\n{context}");
    assert_places(&rows);
    // The streams' times, taken in three generators and added together.
    sixteen_timed(v.pointer("/streams").expect("the streams' report"), context);
    // Each generator reports what its own pool did: one pick of a's
    // replica per stream it opened, 20 in all; the orchestrator's pool,
    // which sent nothing, is not reported as the load generator's.
    let picks: Vec<u64> = (0..3)
        .map(|k| picks_of(v, &format!("loadgen/{k}"), "a"))
        .collect();
    assert_eq!(picks.iter().sum::<u64>(), STREAMS, "{picks:?}:\n{context}");
    assert!(picks.iter().all(|&n| n >= 6), "{picks:?}:\n{context}");
    assert!(
        v["endpoints"]
            .as_array()
            .is_some_and(|e| e.iter().all(|p| p["caller"] != "loadgen")),
        "{context}"
    );
    // Every message's trace kept, its client span (made in a generator
    // process) marked with its stream and place.
    assert_eq!(traces_placed(&run.run_dir, &rows), rows.len(), "{context}");
}
