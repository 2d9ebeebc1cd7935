//! `tailmesh probe` against the tests' server of
//! `examples/servers/echo.proto` (no reflection: the probe reads the
//! `.proto`): the reply as JSON and exit 0; exit 1 when the service
//! answers non-OK; exit 2 for an unknown method, a request that does not
//! fit, or nobody listening.

use serde_json::Value;

use crate::support::{
    echo::{EchoServer, METHOD, echo_proto},
    *,
};

tests! {
    sync the_probe_prints_the_reply_as_json,
    sync the_probe_exits_1_when_the_service_fails_and_2_when_it_cannot_call,
}

fn probe(scratch: &Scratch, server: &EchoServer, method: &str, json: &str) -> Finished {
    let addr = server.addr.to_string();
    let proto = echo_proto();
    tailmesh(
        scratch.path(),
        &[
            "probe",
            &addr,
            method,
            "--json",
            json,
            "--proto",
            path_str(&proto),
            "--metadata",
            "x-tenant=-blue",
            "--timeout",
            "2s",
        ],
    )
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
