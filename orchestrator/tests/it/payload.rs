//! The largest payload a scenario may declare, end to end: it must cross
//! every message it travels in (load generator to hop, hop to hop, through
//! the broker and back), and one byte more is refused by validation.

use crate::support::*;

tests! {
    sync the_largest_payload_crosses_push_and_pull_hops,
    sync one_byte_over_the_largest_payload_is_refused_naming_the_maximum,
}

/// `tailmesh_services::limits::MAX_PAYLOAD_BYTES`, written out: the number
/// the README and the scenario documentation promise.
const MAX_PAYLOAD: u64 = 4_194_304;

/// A two-hop chain carrying `payload` bytes per request, run with the
/// second hop reached by pull ("push-pull") and with both reached by pull
/// ("pull"): the load generator calls a push hop and the broker, a hop calls
/// the broker, and a pull worker answers through it.
fn two_hops(payload: u64) -> String {
    format!(
        r#"
name = "big-payload"
seed = 5

[load]
mode = "closed"
concurrency = 2
requests = 12
timeout = "20s"
payload = {payload}

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"

[[variant]]
name = "push-pull"

[[variant]]
name = "pull"
set = {{ "hop.*.transport" = "pull" }}
"#
    )
}

fn the_largest_payload_crosses_push_and_pull_hops() {
    // Counts and files, not timing: it shares the machine.
    let _turn = shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "big.toml", &two_hops(MAX_PAYLOAD));
    let results = dir.path().join("results");
    let (finished, run_dir) = run_ok(dir.path(), &scenario, &results);
    let summary = summary(&run_dir);
    let context = format!("{summary:#}\n{}", finished.output());
    let variants = variants(&summary);
    assert_eq!(variants.len(), 2, "{context}");
    for v in variants {
        assert_eq!(u64_at(v, "/load/payload_bytes"), MAX_PAYLOAD, "{context}");
        assert_eq!(u64_at(v, "/sent"), 12, "{context}");
        assert_eq!(u64_at(v, "/ok"), 12, "every request ok:\n{context}");
    }
}

fn one_byte_over_the_largest_payload_is_refused_naming_the_maximum() {
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "too-big.toml", &two_hops(MAX_PAYLOAD + 1));
    let finished = tailmesh(dir.path(), &["validate", path_str(&scenario)]);
    assert_eq!(finished.code(), Some(2), "{}", finished.output());
    let expected = format!(
        "load.payload must be between 0 and {MAX_PAYLOAD}, got {}",
        MAX_PAYLOAD + 1
    );
    assert!(
        finished.stderr.contains(&expected),
        "expected {expected:?} in:\n{}",
        finished.output()
    );
}
