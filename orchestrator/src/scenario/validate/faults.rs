//! A hop's injected faults (`slow`, `replica_slow`, `net`, `replica_net`,
//! `error`), their windows, and the check that every window falls within
//! the load.

use std::time::Duration;

use tailmesh_services::model::{DurationDist, ErrorInjection, ReplicaSlow, Slowness};

use crate::scenario::error::Problems;
use crate::scenario::model::{GeneratorNet, Hop, Load, NetFault, ReplicaNet, Window};
use crate::scenario::read::{Section, duration_of, table_section};
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

/// What numbers a per-member fault: its key (`replica`, `generator`) and
/// how many members there are (`replicas`, `load.generators`), when that
/// is known.
#[derive(Clone, Copy)]
pub(super) struct Members<'n> {
    key: &'static str,
    count_name: &'n str,
    count: Option<u32>,
}

impl<'n> Members<'n> {
    /// A hop's replicas.
    pub(super) fn replicas(count: Option<u32>) -> Self {
        Self {
            key: "replica",
            count_name: "replicas",
            count,
        }
    }

    /// The load generators.
    pub(super) fn generators(count: Option<u32>) -> Self {
        Self {
            key: "generator",
            count_name: "load.generators",
            count,
        }
    }
}

/// The member key of a per-member fault's table (`replica_slow`,
/// `replica_net`, `generator_net`): required, and below the members' count
/// (when that is known).
fn member_index(s: &Section<'_>, p: &mut Problems, members: Members<'_>) -> Option<u32> {
    let key = members.key;
    let index = s
        .required(p, key, |s, p, k| s.int_in(p, k, 0, 63))
        .and_then(|r| u32::try_from(r).ok())?;
    match members.count {
        Some(count) if index >= count => {
            if let Some(entry) = s.get(key) {
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} must be less than {} ({count}), got {index} ({key}s are numbered \
                         from 0)",
                        s.name(key),
                        members.count_name
                    ),
                );
            }
            None
        }
        _ => Some(index),
    }
}

pub(super) fn replica_slow(
    s: &Section<'_>,
    replicas: Option<u32>,
    p: &mut Problems,
) -> Option<(ReplicaSlow, Window)> {
    s.unknown_keys(p, &["replica", "factor", "start", "duration"]);
    let replica = member_index(s, p, Members::replicas(replicas));
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

/// The `net` table of `s` (a hop's, or `[load]`'s for the generators'
/// links): `Some(None)` when there is none, `None` when it is wrong.
pub(super) fn net_table(s: &Section<'_>, p: &mut Problems) -> Option<Option<NetFault>> {
    match table_section(s, p, "net") {
        None => Some(None),
        Some(section) => section
            .and_then(|w| {
                w.unknown_keys(p, NET_KEYS);
                net_fault(&w, p)
            })
            .map(Some),
    }
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

/// Every fault window (the hops' and the generators' links') starts before
/// the end of the load and ends at it at the latest; each problem is
/// reported at the window's key.
pub(super) fn windows_within_the_load(
    top: &Section<'_>,
    hops: &[Hop],
    load: &Load,
    p: &mut Problems,
) {
    let Some(length) = load_length(load) else {
        return;
    };
    if let Some(Value::Table(table)) = top.get("load").map(|e| &e.node.value) {
        let mut windows: Vec<(&str, Option<u32>, Window)> = Vec::new();
        if let Some(net) = &load.net {
            windows.push(("net", None, net.window()));
        }
        for g in &load.generator_net {
            windows.push(("generator_net", Some(g.generator), g.fault.window()));
        }
        for (kind, generator, w) in windows {
            let what = match generator {
                Some(g) => format!("load.generator_net of generator {g}"),
                None => format!("load.{kind}"),
            };
            let member = generator.map(|g| ("generator", g));
            window_within(p, &what, w, length, |key| {
                fault_key_at(table, kind, member, key)
            });
        }
    }
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
            let what = match replica {
                Some(r) => format!("hop \"{}\": replica_net of replica {r}", hop.name),
                None => format!("hop \"{}\": {kind}", hop.name),
            };
            let member = replica.map(|r| ("replica", r));
            window_within(p, &what, w, length, |key| {
                fault_key_at(table, kind, member, key)
            });
        }
    }
}

/// Where `key` of the fault `kind` is written in `table`: in its table, or,
/// for a per-member fault written as an array, in the table of `member`
/// (its key and index).
fn fault_key_at(
    table: &Table,
    kind: &str,
    member: Option<(&str, u32)>,
    key: &str,
) -> Option<usize> {
    let fault = table.get(kind)?;
    let fault = match (&fault.node.value, member) {
        (Value::Table(t), _) => t,
        (Value::Array(items), Some((member_key, index))) => {
            items.iter().find_map(|i| match &i.value {
                Value::Table(t)
                    if matches!(
                        t.get(member_key).map(|e| &e.node.value),
                        Some(Value::Integer(n)) if *n == i64::from(index)
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
}

/// The window `w` of `what` starts before `length` (unless at 0) and ends
/// by it; `span_of` says where a key is written.
fn window_within(
    p: &mut Problems,
    what: &str,
    w: Window,
    length: Duration,
    span_of: impl Fn(&str) -> Option<usize>,
) {
    let human = |d: Duration| humantime::format_duration(d).to_string();
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

/// `replica_net`: one table or an array of tables, each `replica` plus the
/// fields of `net`; a replica appears at most once.
pub(super) fn replica_nets(
    s: &Section<'_>,
    replicas: Option<u32>,
    p: &mut Problems,
) -> Option<Vec<ReplicaNet>> {
    let nets = member_nets(s, "replica_net", Members::replicas(replicas), p)?;
    Some(
        nets.into_iter()
            .map(|(replica, fault)| ReplicaNet { replica, fault })
            .collect(),
    )
}

/// `[load] generator_net`: as [`replica_nets`], each table a `generator`.
pub(super) fn generator_nets(
    s: &Section<'_>,
    generators: Option<u32>,
    p: &mut Problems,
) -> Option<Vec<GeneratorNet>> {
    let nets = member_nets(s, "generator_net", Members::generators(generators), p)?;
    Some(
        nets.into_iter()
            .map(|(generator, fault)| GeneratorNet { generator, fault })
            .collect(),
    )
}

/// The network faults of single members under `what`: one table or an
/// array of tables, each the member's index plus the fields of `net`; a
/// member appears at most once.
fn member_nets(
    s: &Section<'_>,
    what: &str,
    members: Members<'_>,
    p: &mut Problems,
) -> Option<Vec<(u32, NetFault)>> {
    let Some(entry) = s.get(what) else {
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
                        format!("expected a table for each {what}, got {}", other.kind()),
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
    let mut out: Vec<(u32, NetFault)> = Vec::with_capacity(tables.len());
    let mut ok = tables.len()
        == match &entry.node.value {
            Value::Array(items) => items.len(),
            _ => 1,
        };
    let key = members.key;
    for (span, table) in tables {
        let child = Section {
            table,
            span: span.clone(),
            prefix: s.prefix.clone(),
            path: format!("{}.", s.name(what)),
            label: if s.prefix.is_empty() {
                format!("[{}]", s.name(what))
            } else {
                format!(
                    "{} of {}",
                    s.name(what),
                    s.prefix.trim_end_matches([':', ' '])
                )
            },
        };
        let mut known = vec![key];
        known.extend_from_slice(NET_KEYS);
        child.unknown_keys(p, &known);
        let index = match member_index(&child, p, members) {
            Some(index) if out.iter().any(|(i, _)| *i == index) => {
                if let Some(entry) = child.get(key) {
                    child.report(
                        p,
                        &entry.node.span,
                        format!("{} names {key} {index} twice", s.name(what)),
                    );
                }
                None
            }
            index => index,
        };
        let fault = net_fault(&child, p);
        match (index, fault) {
            (Some(index), Some(fault)) => out.push((index, fault)),
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
