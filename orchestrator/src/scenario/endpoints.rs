//! The `[[hop]]` keys of a mesh client and of a replica's death: how the
//! hop's push callers treat its replicas' endpoints (`health`, `backoff`,
//! `keepalive`, `keepalive_timeout`, `ewma`, `ejection`), and `kill`.
//! Called from `validate::hop`; the schema is in docs/scenarios.md.

use std::time::Duration;

use tailmesh_services::model::{
    Backoff, Ejection, EndpointOptions, EwmaParams, LatencyStat, Transport,
};

use super::error::Problems;
use super::model::{Hop, Kill};
use super::read::{Section, table_section};
use super::tree::{Table, Value};

/// The keys of a hop that set its [`EndpointOptions`].
pub(super) const ENDPOINT_KEYS: &[&str] = &[
    "health",
    "backoff",
    "keepalive",
    "keepalive_timeout",
    "ewma",
    "ejection",
];

/// `ejection`'s defaults, sized for runs of 10 to 20 s (Envoy's are for
/// hours: a 10 s interval and 30 s ejections would never act in a short
/// run).
pub const EJECTION_DEFAULTS: Ejection = Ejection {
    consecutive_errors: Some(5),
    latency_factor: None,
    latency_stat: LatencyStat::Mean,
    interval: Duration::from_secs(1),
    min_requests: 20,
    base_time: Duration::from_secs(5),
    max_time: Duration::from_secs(60),
    max_share: 0.5,
};

/// The hop's endpoint options. A pull hop has no push callers: every
/// endpoint key is refused there.
pub(super) fn endpoint_options(
    s: &Section<'_>,
    transport: Option<Transport>,
    p: &mut Problems,
) -> Option<EndpointOptions> {
    if transport == Some(Transport::Pull) {
        let mut ok = true;
        for key in ENDPOINT_KEYS {
            if s.get(key).is_some() {
                ok = false;
                s.forbid(
                    p,
                    key,
                    "applies to push callers only: a pull hop's workers take tasks from the \
                     broker, nobody picks its replicas",
                );
            }
        }
        return ok.then(EndpointOptions::default);
    }
    let defaults = EndpointOptions::default();
    let health = match s.get("health") {
        None => Some(defaults.health),
        Some(_) => s.boolean(p, "health"),
    };
    let backoff = match table_section(s, p, "backoff") {
        None => Some(defaults.backoff),
        Some(section) => section.and_then(|b| backoff(&b, p)),
    };
    let keepalive = match s.get("keepalive") {
        None => Some(defaults.keepalive),
        Some(_) => s.positive_duration(p, "keepalive").map(Some),
    };
    let keepalive_timeout = match s.get("keepalive_timeout") {
        None => Some(defaults.keepalive_timeout),
        Some(_) => s.positive_duration(p, "keepalive_timeout"),
    };
    let ewma = match table_section(s, p, "ewma") {
        None => Some(defaults.ewma),
        Some(section) => section.and_then(|e| ewma(&e, p)),
    };
    let ejection = match table_section(s, p, "ejection") {
        None => Some(None),
        Some(section) => section.and_then(|e| ejection(&e, p)).map(Some),
    };
    Some(EndpointOptions {
        health: health?,
        backoff: backoff?,
        keepalive: keepalive?,
        keepalive_timeout: keepalive_timeout?,
        ewma: ewma?,
        ejection: ejection?,
    })
}

/// `backoff = { initial, multiplier, jitter, max }`, each defaulting to
/// gRPC's.
fn backoff(s: &Section<'_>, p: &mut Problems) -> Option<Backoff> {
    s.unknown_keys(p, &["initial", "multiplier", "jitter", "max"]);
    let defaults = Backoff::default();
    let initial = match s.get("initial") {
        None => Some(defaults.initial),
        Some(_) => s.positive_duration(p, "initial"),
    };
    let multiplier = match s.get("multiplier") {
        None => Some(defaults.multiplier),
        Some(_) => s.number_in(p, "multiplier", 1.0, false, 100.0),
    };
    let jitter = match s.get("jitter") {
        None => Some(defaults.jitter),
        Some(_) => s.probability(p, "jitter"),
    };
    let max = match s.get("max") {
        None => Some(defaults.max.max(initial.unwrap_or_default())),
        Some(_) => s.duration(p, "max").and_then(|(max, entry)| match initial {
            Some(initial) if max < initial => {
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} ({}) must be at least {} ({})",
                        s.name("max"),
                        humantime::format_duration(max),
                        s.name("initial"),
                        humantime::format_duration(initial)
                    ),
                );
                None
            }
            _ => Some(max),
        }),
    };
    Some(Backoff {
        initial: initial?,
        multiplier: multiplier?,
        jitter: jitter?,
        max: max?,
    })
}

/// `ewma = { decay, default_rtt }`, each defaulting to Linkerd's.
fn ewma(s: &Section<'_>, p: &mut Problems) -> Option<EwmaParams> {
    s.unknown_keys(p, &["decay", "default_rtt"]);
    let defaults = EwmaParams::default();
    let decay = match s.get("decay") {
        None => Some(defaults.decay),
        Some(_) => s.positive_duration(p, "decay"),
    };
    let default_rtt = match s.get("default_rtt") {
        None => Some(defaults.default_rtt),
        Some(_) => s.positive_duration(p, "default_rtt"),
    };
    Some(EwmaParams {
        decay: decay?,
        default_rtt: default_rtt?,
    })
}

/// `ejection = { consecutive_errors, latency_factor, latency_stat,
/// interval, min_requests, base_time, max_time, max_share }`: every field
/// optional ([`EJECTION_DEFAULTS`]). Without `latency_factor` the error
/// rule is on; with `latency_factor` and no `consecutive_errors`, the
/// latency rule only: at least one rule is always on.
fn ejection(s: &Section<'_>, p: &mut Problems) -> Option<Ejection> {
    s.unknown_keys(
        p,
        &[
            "consecutive_errors",
            "latency_factor",
            "latency_stat",
            "interval",
            "min_requests",
            "base_time",
            "max_time",
            "max_share",
        ],
    );
    let d = EJECTION_DEFAULTS;
    // The error rule is on by default; a table that sets the latency rule
    // and not `consecutive_errors` has the latency rule only.
    let consecutive_errors = match (s.get("consecutive_errors"), s.get("latency_factor")) {
        (None, None) => Some(d.consecutive_errors),
        (None, Some(_)) => Some(None),
        (Some(_), _) => s
            .int_in(p, "consecutive_errors", 1, 1_000_000)
            .and_then(|n| u32::try_from(n).ok())
            .map(Some),
    };
    let latency_factor = match s.get("latency_factor") {
        None => Some(None),
        Some(_) => s
            .number_in(p, "latency_factor", 1.0, true, 1000.0)
            .map(Some),
    };
    let latency_stat = match s.get("latency_stat") {
        None => Some(d.latency_stat),
        Some(_) => s.choice(
            p,
            "latency_stat",
            &[("mean", LatencyStat::Mean), ("p99", LatencyStat::P99)],
        ),
    };
    let interval = match s.get("interval") {
        None => Some(d.interval),
        Some(_) => s.positive_duration(p, "interval"),
    };
    let min_requests = match s.get("min_requests") {
        None => Some(d.min_requests),
        Some(_) => s
            .int_in(p, "min_requests", 1, 1_000_000)
            .and_then(|n| u32::try_from(n).ok()),
    };
    let base_time = match s.get("base_time") {
        None => Some(d.base_time),
        Some(_) => s.positive_duration(p, "base_time"),
    };
    let max_time = match s.get("max_time") {
        None => Some(d.max_time.max(base_time.unwrap_or_default())),
        Some(_) => s
            .duration(p, "max_time")
            .and_then(|(max, entry)| match base_time {
                Some(base) if max < base => {
                    s.report(
                        p,
                        &entry.node.span,
                        format!(
                            "{} ({}) must be at least {} ({})",
                            s.name("max_time"),
                            humantime::format_duration(max),
                            s.name("base_time"),
                            humantime::format_duration(base)
                        ),
                    );
                    None
                }
                _ => Some(max),
            }),
    };
    let max_share = match s.get("max_share") {
        None => Some(d.max_share),
        Some(_) => s.number_in(p, "max_share", 0.0, true, 1.0),
    };
    Some(Ejection {
        consecutive_errors: consecutive_errors?,
        latency_factor: latency_factor?,
        latency_stat: latency_stat?,
        interval: interval?,
        min_requests: min_requests?,
        base_time: base_time?,
        max_time: max_time?,
        max_share: max_share?,
    })
}

/// `kill = { replica, at, back }`: `replica` below the hop's `replicas`,
/// `at` > 0, `back` > 0 if given. Checked against the load's length in
/// [`kills_within_the_load`].
pub(super) fn kill(s: &Section<'_>, replicas: Option<u32>, p: &mut Problems) -> Option<Kill> {
    s.unknown_keys(p, &["replica", "at", "back"]);
    let replica = s
        .required(p, "replica", |s, p, k| s.int_in(p, k, 0, 63))
        .and_then(|r| u32::try_from(r).ok())
        .and_then(|replica| match replicas {
            Some(replicas) if replica >= replicas => {
                if let Some(entry) = s.get("replica") {
                    s.report(
                        p,
                        &entry.node.span,
                        format!(
                            "kill.replica must be less than replicas ({replicas}), got {replica} \
                             (replicas are numbered from 0)"
                        ),
                    );
                }
                None
            }
            _ => Some(replica),
        });
    let at = s.required(p, "at", Section::positive_duration);
    let back = match s.get("back") {
        None => Some(None),
        Some(_) => s.positive_duration(p, "back").map(Some),
    };
    Some(Kill {
        replica: replica?,
        at: at?,
        back: back?,
    })
}

/// Every kill happens before the end of the load, and its replica is back
/// before it too; each problem is reported at the key (`at` or `back`).
pub(super) fn kills_within_the_load(
    tables: &[&Table],
    hops: &[Hop],
    length: Duration,
    p: &mut Problems,
) {
    let human = |d: Duration| humantime::format_duration(d).to_string();
    for (hop, table) in hops.iter().zip(tables) {
        let Some(kill) = hop.kill else { continue };
        let span_of = |key: &str| -> usize {
            match table.get("kill").map(|e| &e.node.value) {
                Some(Value::Table(t)) => t.get(key).map_or(0, |e| e.node.span.start),
                _ => 0,
            }
        };
        if kill.at >= length {
            p.at(
                span_of("at"),
                format!(
                    "hop \"{}\": kill.at ({}) is at or past the end of the load ({} after warmup)",
                    hop.name,
                    human(kill.at),
                    human(length)
                ),
            );
        } else if let Some(back) = kill.back
            && kill.at + back >= length
        {
            p.at(
                span_of("back"),
                format!(
                    "hop \"{}\": kill.back: the replica would be back at {}, at or past the end \
                     of the load ({} after warmup)",
                    hop.name,
                    human(kill.at + back),
                    human(length)
                ),
            );
        }
    }
}
