//! `tailmesh predict` as a user runs it: a line per variant from a shipped
//! scenario, `--json`, and a bad scenario refused as `validate` refuses it.

use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::support::*;

tests! {
    sync the_default_scenario_is_predicted_one_line_per_variant,
    sync the_json_prediction_parses_with_ordered_quantiles,
    sync a_bad_scenario_fails_with_the_validation_error,
    sync a_sweep_is_predicted_one_line_per_point,
}

fn tailmesh(args: &[&str]) -> Output {
    Command::new(TAILMESH)
        .args(args)
        .stdin(Stdio::null())
        .env_remove("RUST_LOG")
        .output()
        .expect("run tailmesh")
}

fn shipped(name: &str) -> String {
    format!("{}/../scenarios/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A duration as `tailmesh_units::duration` prints it (a number, then its
/// unit as the next word), in µs.
fn parse_us(number: &str, unit: &str) -> f64 {
    let scale = match unit {
        "ns" => 1e-3,
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        _ => panic!("not a duration: {number:?} {unit:?}"),
    };
    number.parse::<f64>().expect("a number") * scale
}

fn the_default_scenario_is_predicted_one_line_per_variant() {
    let out = tailmesh(&["predict", &shipped("default.toml")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("variant "))
        .collect();
    assert_eq!(lines.len(), 1, "one variant, base:\n{stdout}");
    let words: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(words[..2], ["variant", "base"], "{}", lines[0]);
    let value = |name: &str| {
        let at = words
            .iter()
            .position(|w| *w == name)
            .unwrap_or_else(|| panic!("no {name} in {}", lines[0]));
        parse_us(words[at + 1], words[at + 2])
    };
    let (p50, p90, p99, p999) = (value("p50"), value("p90"), value("p99"), value("p99.9"));
    assert!(p50 <= p90 && p90 <= p99 && p99 <= p999, "{}", lines[0]);
    // Three hops slow 10 % of the time by 20 ms each: 27.1 % of requests
    // are slowed, so p90 holds one 20 ms extra and p50 none.
    assert!(p50 < 5_000.0, "p50 {p50} us");
    assert!((20_000.0..30_000.0).contains(&p90), "p90 {p90} us");
}

fn the_json_prediction_parses_with_ordered_quantiles() {
    let out = tailmesh(&[
        "predict",
        &shipped("hedging.toml"),
        "--json",
        "--variant",
        "hedge-10ms",
        "--overhead",
        "push=100us,pull=200us",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(json["overhead_push_us"], 100);
    let variants = json["variants"].as_array().expect("variants");
    assert_eq!(variants.len(), 1, "only the variant asked for: {json}");
    let v = &variants[0];
    assert_eq!(v["variant"], "hedge-10ms");
    let q: Vec<u64> = ["p50_us", "p90_us", "p99_us", "p999_us"]
        .iter()
        .map(|k| v[*k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")))
        .collect();
    assert!(q.windows(2).all(|w| w[0] <= w[1]), "{q:?}");
    assert!(v["assumptions"].is_array(), "{v}");
    // An unknown variant is refused, naming the ones there are.
    let out = tailmesh(&["predict", &shipped("hedging.toml"), "--variant", "nope"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("\"nope\"") && stderr.contains("hedge-10ms"),
        "{stderr}"
    );
}

fn a_bad_scenario_fails_with_the_validation_error() {
    let scratch = Scratch::new();
    let bad = write(
        scratch.path(),
        "bad.toml",
        "name = \"bad\"\n[load]\nmode = \"open\"\nrate = -5\n[[hop]]\nname = \"a\"\n",
    );
    let path = bad.to_str().expect("a UTF-8 path");
    let predicted = tailmesh(&["predict", path]);
    let validated = tailmesh(&["validate", path]);
    let stderr = String::from_utf8_lossy(&predicted.stderr);
    assert_eq!(predicted.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("rate"), "{stderr}");
    assert_eq!(
        stderr,
        String::from_utf8_lossy(&validated.stderr),
        "the same problems as validate"
    );
    assert!(
        predicted.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&predicted.stdout)
    );
}

fn a_sweep_is_predicted_one_line_per_point() {
    let scratch = Scratch::new();
    let hop = |name: &str| {
        format!(
            "[[hop]]\nname = \"{name}\"\nwork = {{ kind = \"sleep\", dist = \"fixed\", value = \"10ms\" }}\n"
        )
    };
    let text = format!(
        "name = \"sweep\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"1s\"\ntimeout = \"1s\"\n{}{}{}[sweep]\nkey = \"hops\"\nvalues = [1, 3]\n",
        hop("a"),
        hop("b"),
        hop("c")
    );
    let path = write(scratch.path(), "sweep.toml", &text);
    let out = tailmesh(&["predict", path.to_str().expect("a UTF-8 path")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p50s: Vec<f64> = stdout
        .lines()
        .filter(|l| l.starts_with("variant "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            parse_us(words[3], words[4])
        })
        .collect();
    assert_eq!(p50s.len(), 2, "one line per sweep point:\n{stdout}");
    // 10 ms of work per hop, plus the overhead: 1 hop, then 3.
    assert!((10_000.0..11_000.0).contains(&p50s[0]), "{stdout}");
    assert!((30_000.0..31_000.0).contains(&p50s[1]), "{stdout}");
}
