//! `tailmesh probe` against the tests' server of
//! `examples/servers/echo.proto` (no reflection: the probe reads the
//! `.proto`): the reply as JSON and exit 0; a streaming method's replies
//! a line each; exit 1 when the service answers non-OK or the wrong
//! number of replies; exit 2 for an unknown method, a request that does
//! not fit, requests a method does not take, or nobody listening.

use serde_json::Value;

use crate::support::{
    echo::{EchoServer, METHOD, SERVER_STREAM_METHOD, STREAM_METHOD, echo_proto},
    *,
};

tests! {
    sync the_probe_prints_the_reply_as_json,
    sync the_probe_exits_1_when_the_service_fails_and_2_when_it_cannot_call,
    sync the_probe_prints_a_streams_replies_one_a_line_and_checks_their_count,
}

fn probe(scratch: &Scratch, server: &EchoServer, method: &str, json: &str) -> Finished {
    probe_with(scratch, server, method, &["--json", json])
}

/// `tailmesh probe` of `method` with `flags` (the request's), the schema
/// from echo.proto and `x-tenant` metadata.
fn probe_with(scratch: &Scratch, server: &EchoServer, method: &str, flags: &[&str]) -> Finished {
    let addr = server.addr.to_string();
    let proto = echo_proto();
    let mut args = vec!["probe", &addr, method];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[
        "--proto",
        path_str(&proto),
        "--metadata",
        "x-tenant=-blue",
        "--timeout",
        "2s",
    ]);
    tailmesh(scratch.path(), &args)
}

fn the_probe_prints_the_reply_as_json() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    let done = probe(&scratch, &server, METHOD, r#"{"message": "hi"}"#);
    assert_eq!(done.code(), Some(0), "{}", done.output());
    let reply: Value = serde_json::from_str(&done.stdout).expect("the reply as JSON");
    assert_eq!(reply["message"], "hi-blue", "{}", done.output());
    assert_eq!(reply["server"], "rust-test");
    // A deadline and a trace context were sent, as a hop sends them.
    let left: i64 = reply["deadlineLeftUs"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("deadlineLeftUs, an int64 as a string");
    assert!(left > 0 && left <= 2_000_000, "{left} us left of 2 s");
    let traceparent = reply["traceparent"].as_str().expect("a string");
    assert!(
        traceparent.starts_with("00-") && traceparent.len() == 55,
        "{traceparent:?}"
    );
    assert!(
        done.stderr.contains("OK: tailmesh.examples.v1.Echo.Echo"),
        "{}",
        done.output()
    );
    assert!(done.stderr.contains(traceparent), "{}", done.output());
}

fn the_probe_exits_1_when_the_service_fails_and_2_when_it_cannot_call() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    // The service answers non-OK: exit 1, its code named.
    let done = probe(&scratch, &server, METHOD, r#"{"failCode": 5}"#);
    assert_eq!(done.code(), Some(1), "{}", done.output());
    assert!(done.stdout.is_empty(), "{}", done.output());
    assert!(
        done.stderr
            .contains("tailmesh probe: NOT_FOUND (5): asked to fail"),
        "{}",
        done.output()
    );
    // An unknown method: exit 2, the methods there are named.
    let done = probe(&scratch, &server, "tailmesh.examples.v1.Echo/Shout", "{}");
    assert_eq!(done.code(), Some(2), "{}", done.output());
    assert!(
        done.stderr.contains("unknown method \"Shout\"") && done.stderr.contains("Echo"),
        "{}",
        done.output()
    );
    // A request that does not fit: exit 2, field, line and column.
    let done = probe(&scratch, &server, METHOD, "{\n \"workUs\": \"x\"}");
    assert_eq!(done.code(), Some(2), "{}", done.output());
    assert!(
        done.stderr.contains("field `work_us`") && done.stderr.contains("line 2, column 12"),
        "{}",
        done.output()
    );
    // Nobody listens: exit 2.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nobody = closed.local_addr().expect("local addr").to_string();
    drop(closed);
    let done = tailmesh(scratch.path(), &["probe", &nobody, METHOD, "--json", "{}"]);
    assert_eq!(done.code(), Some(2), "{}", done.output());
    assert!(done.stderr.contains("cannot connect"), "{}", done.output());
}

fn the_probe_prints_a_streams_replies_one_a_line_and_checks_their_count() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    let lines = |done: &Finished| -> Vec<Value> {
        done.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    };
    // Bidirectional: each request answered in order, a line each.
    let requests = r#"[{"message": "a"}, {"message": "b"}, {"message": "c"}]"#;
    let done = probe_with(
        &scratch,
        &server,
        STREAM_METHOD,
        &["--requests", requests, "--replies", "3"],
    );
    assert_eq!(done.code(), Some(0), "{}", done.output());
    let replies = lines(&done);
    let said: Vec<(&str, u64)> = replies
        .iter()
        .map(|r| {
            (
                r["message"].as_str().unwrap_or(""),
                r["received"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        said,
        [("a-blue", 1), ("b-blue", 2), ("c-blue", 3)],
        "{}",
        done.output()
    );
    // The stream carried the deadline, the trace context and the metadata
    // (the `-blue` above), as a unary call does.
    for reply in &replies {
        let left: i64 = reply["deadlineLeftUs"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("deadlineLeftUs");
        assert!(left > 0 && left <= 2_000_000, "{left} us left of 2 s");
        assert!(
            reply["traceparent"]
                .as_str()
                .is_some_and(|t| t.starts_with("00-")),
            "{reply}"
        );
    }
    assert!(
        done.stderr
            .contains("OK: tailmesh.examples.v1.Echo.EchoStream")
            && done.stderr.contains("3 reply messages"),
        "{}",
        done.output()
    );
    // Server streaming: one request, as many replies as it asks for.
    let done = probe_with(
        &scratch,
        &server,
        SERVER_STREAM_METHOD,
        &["--json", r#"{"message": "s", "replies": 4}"#],
    );
    assert_eq!(done.code(), Some(0), "{}", done.output());
    assert_eq!(lines(&done).len(), 4, "{}", done.output());
    // The wrong count: the replies printed, then exit 1 naming both counts.
    let done = probe_with(
        &scratch,
        &server,
        STREAM_METHOD,
        &["--requests", requests, "--replies", "2"],
    );
    assert_eq!(done.code(), Some(1), "{}", done.output());
    assert_eq!(lines(&done).len(), 3, "{}", done.output());
    assert!(
        done.stderr.contains("INTERNAL (13): service 127.0.0.1:")
            && done.stderr.contains(
                "tailmesh.examples.v1.Echo.EchoStream answered with 3 reply messages, expected \
             replies = 2"
            ),
        "{}",
        done.output()
    );
    // A message that fails ends the stream with its code, after the
    // replies before it.
    let done = probe_with(
        &scratch,
        &server,
        STREAM_METHOD,
        &["--requests", r#"[{"message": "a"}, {"failCode": 9}]"#],
    );
    assert_eq!(done.code(), Some(1), "{}", done.output());
    assert_eq!(lines(&done).len(), 1, "{}", done.output());
    assert!(
        done.stderr
            .contains("FAILED_PRECONDITION (9): asked to fail"),
        "{}",
        done.output()
    );
    // Requests a unary method does not take, a reply count it does not
    // have, a list that is not one: exit 2, before any call.
    let calls = server.calls();
    for (method, flags, words) in [
        (
            METHOD,
            &["--requests", requests][..],
            "requests for tailmesh.examples.v1.Echo/Echo: a unary method takes one request \
             message; give it as request",
        ),
        (
            METHOD,
            &["--replies", "2"][..],
            "replies for tailmesh.examples.v1.Echo/Echo: a unary method answers with one message",
        ),
        (
            STREAM_METHOD,
            &["--requests", r#"[{"message": "a"}, {"wrkUs": 1}]"#][..],
            "requests[1] for tailmesh.examples.v1.Echo/EchoStream",
        ),
        (
            STREAM_METHOD,
            &["--requests", r#"{"message": "a"}"#][..],
            "--requests: expected a JSON list of objects",
        ),
    ] {
        let done = probe_with(&scratch, &server, method, flags);
        assert_eq!(done.code(), Some(2), "{flags:?}: {}", done.output());
        assert!(done.stderr.contains(words), "{flags:?}: {}", done.output());
    }
    assert_eq!(server.calls(), calls, "nothing called");
}
