//! A hop's injected faults (`slow`, `replica_slow`, `net`, `replica_net`,
//! `error`), their windows, and the check that every window falls within
//! the load.

use std::time::Duration;

use tailmesh_services::model::{DurationDist, ErrorInjection, ReplicaSlow, Slowness};

use crate::scenario::error::Problems;
use crate::scenario::model::{Hop, Load, NetFault, ReplicaNet, Window};
use crate::scenario::read::{Section, duration_of};
use crate::scenario::tree::{Span, Table, Value};

use super::load::load_length;
use super::work::{DIST_KEYS, dist};

pub(super) const NET_KEYS: &[&str] = &["loss", "delay", "jitter", "start", "duration"];

pub(super) fn slowness(s: &Section<'_>, p: &mut Problems) -> Option<(Slowness, Window)> {
    s.unknown_keys(p, &["probability", "extra", "follow", "start", "duration"]);
    let window = window(s, p);
    let probability = s.required(p, "probability", Section::probability);
    // Absent: `None`; present: `Some(Some(f))` when valid, `Some(None)` not.
    let follow = s.get("follow").map(|_| s.probability(p, "follow"));
    let extra = match s.get("extra") {
        None => {
            s.missing(p, "extra");
            None
        }
        Some(entry) => match &entry.node.value {
            Value::Table(table) => {
                let child = s.child(entry, table);
                child.unknown_keys(p, DIST_KEYS);
                dist(&child, p)
            }
            Value::String(_) => s
                .duration(p, "extra")
                .map(|(value, _)| DurationDist::Fixed { value }),
            _ => {
                // Reuse the duration wording, plus the table alternative.
                if let Err(problem) = duration_of(&entry.node) {
                    let message = problem.message(&s.name("extra"));
                    if !message.is_empty() {
                        s.report(
                            p,
                            &entry.node.span,
                            message.replacen(
                                "such as \"20ms\"",
                                "such as \"20ms\" or a distribution table",
                                1,
                            ),
                        );
                    }
                }
                None
            }
        },
    };
    Some((
        Slowness {
            probability: probability?,
            extra: extra?,
            follow: follow.map_or(Some(None), |f| f.map(Some))?,
        },
        window?,
    ))
}

/// The `replica` key of `what` (`replica_slow`, `replica_net`): required,
/// and below the hop's `replicas` (when that is known).
fn replica_index(
    s: &Section<'_>,
    p: &mut Problems,
    replicas: Option<u32>,
    what: &str,
) -> Option<u32> {
    let replica = s
        .required(p, "replica", |s, p, k| s.int_in(p, k, 0, 63))
        .and_then(|r| u32::try_from(r).ok())?;
    match replicas {
        Some(replicas) if replica >= replicas => {
            if let Some(entry) = s.get("replica") {
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{what}.replica must be less than replicas ({replicas}), got {replica} \
                         (replicas are numbered from 0)"
                    ),
                );
            }
            None
        }
        _ => Some(replica),
    }
}

pub(super) fn replica_slow(
    s: &Section<'_>,
    replicas: Option<u32>,
    p: &mut Problems,
) -> Option<(ReplicaSlow, Window)> {
    s.unknown_keys(p, &["replica", "factor", "start", "duration"]);
    let replica = replica_index(s, p, replicas, "replica_slow");
    let factor = s.required(p, "factor", |s, p, k| s.number_in(p, k, 1.0, false, 1000.0));
    let window = window(s, p);
    Some((
        ReplicaSlow {
            replica: replica?,
            factor: factor?,
        },
        window?,
    ))
}

/// The fields of a `net` table (also the fault fields of `replica_net`).
pub(super) fn net_fault(s: &Section<'_>, p: &mut Problems) -> Option<NetFault> {
    let loss = match s.get("loss") {
        None => Some(0.0),
        Some(_) => s.probability(p, "loss"),
    };
    let delay = match s.get("delay") {
        None => Some(Duration::ZERO),
        Some(_) => s.duration(p, "delay").map(|(d, _)| d),
    };
    let jitter = match s.get("jitter") {
        None => Some(Duration::ZERO),
        Some(_) => s
            .duration(p, "jitter")
            .and_then(|(jitter, entry)| match delay {
                Some(delay) if jitter > delay => {
                    let message = if delay.is_zero() {
                        format!(
                            "{} needs {}: jitter varies a packet's delay around it",
                            s.name("jitter"),
                            s.name("delay")
                        )
                    } else {
                        format!(
                            "{} ({}) must not exceed {} ({}): a packet's delay is drawn from \
                         delay ± jitter and cannot be negative",
                            s.name("jitter"),
                            humantime::format_duration(jitter),
                            s.name("delay"),
                            humantime::format_duration(delay)
                        )
                    };
                    s.report(p, &entry.node.span, message);
                    None
                }
                _ => Some(jitter),
            }),
    };
    let window = window(s, p);
    Some(NetFault {
        loss: loss?,
        delay: delay?,
        jitter: jitter?,
        start: window?.start,
        duration: window?.duration,
    })
}

/// The `start` (default 0) and `duration` (> 0; default: until the end)
/// of a fault's window. Checked against the load's length in
/// [`windows_within_the_load`].
fn window(s: &Section<'_>, p: &mut Problems) -> Option<Window> {
    let start = match s.get("start") {
        None => Some(Duration::ZERO),
        Some(_) => s.duration(p, "start").map(|(d, _)| d),
    };
    let duration = match s.get("duration") {
        None => Some(None),
        Some(_) => s.positive_duration(p, "duration").map(Some),
    };
    Some(Window {
        start: start?,
        duration: duration?,
    })
}

/// Every fault window starts before the end of the load and ends at it at
/// the latest; each problem is reported at the window's key.
pub(super) fn windows_within_the_load(
    top: &Section<'_>,
    hops: &[Hop],
    load: &Load,
    p: &mut Problems,
) {
    let Some(length) = load_length(load) else {
        return;
    };
    let tables: Vec<&Table> = match top.get("hop").map(|e| &e.node.value) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| match &i.value {
                Value::Table(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => return,
    };
    crate::scenario::endpoints::kills_within_the_load(&tables, hops, length, p);
    let human = |d: Duration| humantime::format_duration(d).to_string();
    for (hop, table) in hops.iter().zip(tables) {
        let mut windows: Vec<(&str, Option<u32>, Window)> = Vec::new();
        if hop.slow.is_some() {
            windows.push(("slow", None, hop.windows.slow));
        }
        if hop.replica_slow.is_some() {
            windows.push(("replica_slow", None, hop.windows.replica_slow));
        }
        if hop.error.is_some() {
            windows.push(("error", None, hop.windows.error));
        }
        if let Some(net) = &hop.net {
            windows.push(("net", None, net.window()));
        }
        for r in &hop.replica_net {
            windows.push(("replica_net", Some(r.replica), r.fault.window()));
        }
        for (kind, replica, w) in windows {
            let span_of = |key: &str| -> Option<usize> {
                let fault = table.get(kind)?;
                let fault = match (&fault.node.value, replica) {
                    (Value::Table(t), _) => t,
                    (Value::Array(items), Some(replica)) => {
                        items.iter().find_map(|i| match &i.value {
                            Value::Table(t)
                                if matches!(
                                    t.get("replica").map(|e| &e.node.value),
                                    Some(Value::Integer(n)) if *n == i64::from(replica)
                                ) =>
                            {
                                Some(t)
                            }
                            _ => None,
                        })?
                    }
                    _ => return None,
                };
                fault.get(key).map(|e| e.node.span.start)
            };
            let what = match replica {
                Some(r) => format!("hop \"{}\": replica_net of replica {r}", hop.name),
                None => format!("hop \"{}\": {kind}", hop.name),
            };
            if w.start >= length && !w.start.is_zero() {
                p.at(
                    span_of("start").unwrap_or(0),
                    format!(
                        "{what}.start ({}) is at or past the end of the load ({} after warmup)",
                        human(w.start),
                        human(length)
                    ),
                );
            } else if let Some(d) = w.duration
                && w.start + d > length
            {
                p.at(
                    span_of("duration").unwrap_or(0),
                    format!(
                        "{what} window {}..{} runs past the end of the load ({} after warmup)",
                        human(w.start),
                        human(w.start + d),
                        human(length)
                    ),
                );
            }
        }
    }
}

/// `replica_net`: one table or an array of tables, each `replica` plus the
/// fields of `net`; a replica appears at most once.
pub(super) fn replica_nets(
    s: &Section<'_>,
    replicas: Option<u32>,
    p: &mut Problems,
) -> Option<Vec<ReplicaNet>> {
    let Some(entry) = s.get("replica_net") else {
        return Some(Vec::new());
    };
    let tables: Vec<(&Span, &Table)> = match &entry.node.value {
        Value::Table(table) => vec![(&entry.node.span, table)],
        Value::Array(items) => {
            let mut tables = Vec::new();
            for item in items {
                match &item.value {
                    Value::Table(table) => tables.push((&item.span, table)),
                    other => s.report(
                        p,
                        &item.span,
                        format!(
                            "expected a table for each replica_net, got {}",
                            other.kind()
                        ),
                    ),
                }
            }
            tables
        }
        _ => {
            s.wrong_type(p, entry, "a table or an array of tables");
            return None;
        }
    };
    let mut out = Vec::with_capacity(tables.len());
    let mut ok = tables.len()
        == match &entry.node.value {
            Value::Array(items) => items.len(),
            _ => 1,
        };
    for (span, table) in tables {
        let child = Section {
            table,
            span: span.clone(),
            prefix: s.prefix.clone(),
            path: "replica_net.".to_owned(),
            label: format!("replica_net of {}", s.prefix.trim_end_matches([':', ' '])),
        };
        let mut known = vec!["replica"];
        known.extend_from_slice(NET_KEYS);
        child.unknown_keys(p, &known);
        let replica = match replica_index(&child, p, replicas, "replica_net") {
            Some(replica) if out.iter().any(|r: &ReplicaNet| r.replica == replica) => {
                if let Some(entry) = child.get("replica") {
                    child.report(
                        p,
                        &entry.node.span,
                        format!("replica_net names replica {replica} twice"),
                    );
                }
                None
            }
            replica => replica,
        };
        let fault = net_fault(&child, p);
        match (replica, fault) {
            (Some(replica), Some(fault)) => out.push(ReplicaNet { replica, fault }),
            _ => ok = false,
        }
    }
    ok.then_some(out)
}

/// gRPC status codes by their snake_case names (`OK` is not an error).
const GRPC_CODES: &[(&str, i32)] = &[
    ("cancelled", 1),
    ("unknown", 2),
    ("invalid_argument", 3),
    ("deadline_exceeded", 4),
    ("not_found", 5),
    ("already_exists", 6),
    ("permission_denied", 7),
    ("resource_exhausted", 8),
    ("failed_precondition", 9),
    ("aborted", 10),
    ("out_of_range", 11),
    ("unimplemented", 12),
    ("internal", 13),
    ("unavailable", 14),
    ("data_loss", 15),
    ("unauthenticated", 16),
];

pub(super) fn error_injection(
    s: &Section<'_>,
    p: &mut Problems,
) -> Option<(ErrorInjection, Window)> {
    s.unknown_keys(p, &["probability", "code", "start", "duration"]);
    let window = window(s, p);
    let probability = s.required(p, "probability", Section::probability);
    let code = match s.get("code") {
        None => {
            s.missing(p, "code");
            None
        }
        Some(entry) => match &entry.node.value {
            Value::Integer(_) => s
                .int_in(p, "code", 1, 16)
                .and_then(|c| i32::try_from(c).ok()),
            Value::String(_) => s.choice(p, "code", GRPC_CODES),
            _ => {
                s.wrong_type(
                    p,
                    entry,
                    "a gRPC code name such as \"unavailable\" or 1..=16",
                );
                None
            }
        },
    };
    Some((
        ErrorInjection {
            probability: probability?,
            code: code?,
        },
        window?,
    ))
}
