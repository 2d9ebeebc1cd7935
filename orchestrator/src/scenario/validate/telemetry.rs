//! `[telemetry]`: head sampling, the OTLP forward, what the tail sampler
//! keeps (slow, failed, retried, a share of the rest), and where live
//! Prometheus metrics are served.

use crate::scenario::error::Problems;
use crate::scenario::model::{Keep, KeepShare, Telemetry};
use crate::scenario::read::Section;
use crate::scenario::tree::Value;

const TELEMETRY_KEYS: &[&str] = &[
    "sampling",
    "forward",
    "keep_slow",
    "keep_slow_percentile",
    "keep_failed",
    "keep_retried",
    "keep_share",
    "hold_spans",
    "metrics",
    "metrics_grace",
];

/// The longest `metrics_grace`.
const MAX_METRICS_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// The most spans a process may be told to hold.
const MAX_HOLD_SPANS: i64 = 10_000_000;

pub(super) fn telemetry(s: &Section<'_>, p: &mut Problems) -> Option<Telemetry> {
    s.unknown_keys(p, TELEMETRY_KEYS);
    let sampling = match s.get("sampling") {
        None => Some(1.0),
        Some(_) => s.probability(p, "sampling"),
    };
    let forward = match s.get("forward") {
        None => Some(None),
        Some(_) => s.string(p, "forward").and_then(|(url, entry)| {
            let valid = (url.starts_with("http://") || url.starts_with("https://"))
                && url.split_once("://").is_some_and(|(_, rest)| {
                    !rest.is_empty() && !rest.contains(char::is_whitespace)
                });
            if valid {
                Some(Some(url.to_owned()))
            } else {
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} must be an OTLP gRPC URL like \"http://127.0.0.1:4317\", not \"{url}\"",
                        s.name("forward")
                    ),
                );
                None
            }
        }),
    };
    let flag = |p: &mut Problems, key: &str| match s.get(key) {
        None => Some(true),
        Some(_) => s.boolean(p, key),
    };
    let slow = flag(p, "keep_slow");
    let slow_percentile = match s.get("keep_slow_percentile") {
        None => Some(None),
        Some(_) => s
            .number_in(p, "keep_slow_percentile", 0.0, true, 100.0)
            .and_then(|q| {
                if q < 100.0 {
                    Some(Some(q))
                } else {
                    s.report(
                        p,
                        &s.get("keep_slow_percentile")?.node.span,
                        format!("{} must be below 100", s.name("keep_slow_percentile")),
                    );
                    None
                }
            }),
    };
    let failed = flag(p, "keep_failed");
    let retried = flag(p, "keep_retried");
    let share = match s.get("keep_share") {
        None => Some(KeepShare::Auto),
        Some(entry) => match &entry.node.value {
            Value::String(text) if text == "auto" => Some(KeepShare::Auto),
            Value::String(text) => {
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} must be \"auto\" or a share from 0.0 to 1.0, not \"{text}\"",
                        s.name("keep_share")
                    ),
                );
                None
            }
            _ => s.probability(p, "keep_share").map(KeepShare::Fixed),
        },
    };
    let hold_spans = match s.get("hold_spans") {
        None => Some(super::super::model::DEFAULT_HOLD_SPANS),
        Some(_) => s
            .int_in(p, "hold_spans", 1, MAX_HOLD_SPANS)
            .and_then(|n| usize::try_from(n).ok()),
    };
    let metrics = match s.get("metrics") {
        None => Some(None),
        Some(_) => s.string(p, "metrics").and_then(|(addr, entry)| {
            match addr.parse::<std::net::SocketAddr>() {
                Ok(_) => Some(Some(addr.to_owned())),
                Err(_) => {
                    s.report(
                        p,
                        &entry.node.span,
                        format!(
                            "{} must be an address to listen on like \"127.0.0.1:9464\", not \
                             \"{addr}\"",
                            s.name("metrics")
                        ),
                    );
                    None
                }
            }
        }),
    };
    let metrics_grace = match s.get("metrics_grace") {
        None => Some(super::super::model::DEFAULT_METRICS_GRACE),
        Some(_) => s.duration(p, "metrics_grace").and_then(|(grace, entry)| {
            if grace <= MAX_METRICS_GRACE {
                Some(grace)
            } else {
                s.report(
                    p,
                    &entry.node.span,
                    format!("{} must be at most 10m", s.name("metrics_grace")),
                );
                None
            }
        }),
    };
    Some(Telemetry {
        metrics: metrics?,
        metrics_grace: metrics_grace?,
        hold_spans: hold_spans?,
        sampling: sampling?,
        forward: forward?,
        keep: Keep {
            slow: slow?,
            slow_percentile: slow_percentile?,
            failed: failed?,
            retried: retried?,
            share: share?,
        },
    })
}
