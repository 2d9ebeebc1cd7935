//! One `[[hop]]` in named steps (its section, name, serving keys,
//! balancing, connections, service, work, faults, downstream names).

use std::time::Duration;

use tailmesh_model::calls::{Call, CallCount, Calls, MAX_COUNT, Repeats};
use tailmesh_services::{
    discipline::Discipline,
    limits::{DEFAULT_QUEUE_LIMIT, MAX_QUEUE_LIMIT},
    model::{Balance, Connection, ErrorInjection, ReplicaSlow, Slowness, Transport, Work},
};

use crate::scenario::error::Problems;
use crate::scenario::model::{
    AppWindows, ClientPolicy, Hop, HopService, NetFault, ReplicaNet, Streaming, Window,
};
use crate::scenario::read::{Section, dns_label_problem, is_dns_label, table_section};
use crate::scenario::tree::{Node, Span, Table, Value};

use super::client::client_policy;
use super::faults::{error_injection, net_table, replica_nets, replica_slow, slowness};
use super::work::work;

const HOP_KEYS: &[&str] = &[
    "name",
    "replicas",
    "concurrency",
    "queue_limit",
    "discipline",
    "transport",
    "worker_ping",
    "balance",
    "connection",
    "work",
    "slow",
    "replica_slow",
    "net",
    "replica_net",
    "error",
    "downstream",
    "client",
    // Mesh-client keys and `kill` (see `crate::scenario::endpoints`).
    "health",
    "backoff",
    "keepalive",
    "keepalive_timeout",
    "ewma",
    "ejection",
    "kill",
    // A real gRPC service as the hop's work (see `crate::scenario::service`).
    "service",
    "streaming",
];

/// Bounds of a hop's `worker_ping`.
const MIN_WORKER_PING: Duration = Duration::from_millis(1);

const MAX_WORKER_PING: Duration = Duration::from_secs(60);

/// Which hops a hop calls, as read.
pub(super) enum Downstream<'a> {
    /// Not given: the next hop in file order.
    Chain,
    /// Given: the stages, one after another, each of calls side by side.
    Stages(Vec<Vec<CallDraft<'a>>>),
    /// Given but unreadable (reported).
    Invalid,
}

/// One call in `downstream` as read, with where its hop is named.
pub(super) struct CallDraft<'a> {
    pub(super) name: &'a str,
    pub(super) span: &'a Span,
    pub(super) call: Call,
}

/// One `[[hop]]` as read, before the mesh-wide checks.
pub(super) struct HopDraft<'a> {
    pub(super) header: &'a Span,
    /// The name as written, even if it is not a valid label.
    pub(super) raw_name: Option<&'a str>,
    pub(super) hop: Option<Hop>,
    pub(super) downstream: Downstream<'a>,
    /// Where `connection` is written, if it is: a hop only the load
    /// generator calls has none (the mesh's check).
    pub(super) connection_at: Option<&'a Span>,
}

/// One `[[hop]]` read in steps: its own keys (serving, calling, faults),
/// its sections, then its downstream names; the mesh-wide checks come
/// after every hop is read ([`mesh`]).
pub(super) fn hop<'a>(
    index: usize,
    node: &'a Node,
    table: &'a Table,
    p: &mut Problems,
) -> HopDraft<'a> {
    let raw_name = match table.get("name").map(|e| &e.node.value) {
        Some(Value::String(name)) => Some(name.as_str()),
        _ => None,
    };
    let s = hop_section(index, node, table, raw_name);
    s.unknown_keys(p, HOP_KEYS);

    let name = hop_name(&s, p);
    let serving = serving(&s, p);
    let balance = balance(&s, p);
    let connection = connection(&s, p);
    let endpoints = crate::scenario::endpoints::endpoint_options(&s, serving.transport, p);
    let kill = match table_section(&s, p, "kill") {
        None => Some(None),
        Some(section) => section
            .and_then(|k| crate::scenario::endpoints::kill(&k, serving.replicas, p))
            .map(Some),
    };
    let service = hop_service(&s, serving.replicas, p);
    let streaming = streaming(&s, p);
    let work = hop_work(&s, p);
    let faults = hop_faults(&s, serving.replicas, p);
    let client = match table_section(&s, p, "client") {
        None => Some(ClientPolicy::default()),
        Some(section) => section.and_then(|c| client_policy(&c, p)),
    };
    let downstream = downstream(&s, p);

    let hop = (|| {
        Some(Hop {
            name: name?,
            replicas: serving.replicas?,
            concurrency: serving.concurrency?,
            queue_limit: serving.queue_limit?,
            discipline: serving.discipline?,
            transport: serving.transport?,
            worker_ping: serving.worker_ping?,
            balance: balance?,
            connection: connection?,
            endpoints: endpoints?,
            work: work?,
            windows: faults.windows(),
            slow: faults.slow?.map(|(s, _)| s),
            replica_slow: faults.replica_slow?.map(|(r, _)| r),
            net: faults.net?,
            replica_net: faults.replica_net?,
            error: faults.error?.map(|(e, _)| e),
            client: client?,
            downstream: Vec::new(),
            calls: Calls::default(),
            kill: kill?,
            service: service?,
            streaming: streaming?,
        })
    })();
    HopDraft {
        header: &node.span,
        raw_name,
        hop,
        downstream,
        connection_at: table.get("connection").map(|e| &e.key_span),
    }
}

/// The section of hop number `index`, named in messages by its name as
/// written (`hop "b"`), or by its index when it has none.
fn hop_section<'a>(
    index: usize,
    node: &'a Node,
    table: &'a Table,
    raw_name: Option<&str>,
) -> Section<'a> {
    let who = match raw_name {
        Some(name) => format!("hop \"{name}\""),
        None => format!("hop at index {index}"),
    };
    Section {
        table,
        span: node.span.clone(),
        prefix: format!("{who}: "),
        path: String::new(),
        label: match raw_name {
            Some(name) => format!("[[hop]] \"{name}\""),
            None => format!("[[hop]] at index {index}"),
        },
    }
}

fn hop_name(s: &Section<'_>, p: &mut Problems) -> Option<String> {
    s.required(p, "name", Section::string)
        .and_then(|(name, entry)| {
            if is_dns_label(name) {
                Some(name.to_owned())
            } else {
                p.at(entry.node.span.start, dns_label_problem("hop name", name));
                None
            }
        })
}

/// How a hop's replicas take their requests, each `None` when its key has
/// a problem (reported).
struct Serving {
    replicas: Option<u32>,
    concurrency: Option<Option<u32>>,
    queue_limit: Option<u32>,
    transport: Option<Transport>,
    discipline: Option<Discipline>,
    worker_ping: Option<Option<Duration>>,
}

fn serving(s: &Section<'_>, p: &mut Problems) -> Serving {
    let replicas = match s.get("replicas") {
        None => Some(1),
        Some(_) => s
            .int_in(p, "replicas", 1, 64)
            .and_then(|r| u32::try_from(r).ok()),
    };
    let concurrency = match s.get("concurrency") {
        None => Some(None),
        Some(_) => s
            .int_in(p, "concurrency", 1, 10_000)
            .and_then(|c| u32::try_from(c).ok())
            .map(Some),
    };
    let queue_limit = match s.get("queue_limit") {
        None => Some(DEFAULT_QUEUE_LIMIT),
        Some(_) if s.get("concurrency").is_none() => {
            s.forbid(
                p,
                "queue_limit",
                "needs concurrency (it bounds the wait for a slot)",
            );
            None
        }
        Some(_) => s
            .int_in(p, "queue_limit", 0, i64::from(MAX_QUEUE_LIMIT))
            .and_then(|q| u32::try_from(q).ok()),
    };
    let transport = match s.get("transport") {
        None => Some(Transport::Push),
        Some(_) => s.choice(
            p,
            "transport",
            &[("push", Transport::Push), ("pull", Transport::Pull)],
        ),
    };
    let discipline = discipline(s, transport, p);
    let worker_ping = worker_ping(s, p);
    Serving {
        replicas,
        concurrency,
        queue_limit,
        transport,
        discipline,
        worker_ping,
    }
}

fn discipline(
    s: &Section<'_>,
    transport: Option<Transport>,
    p: &mut Problems,
) -> Option<Discipline> {
    match s.get("discipline") {
        None => Some(Discipline::Fifo),
        Some(_) => s
            .choice(p, "discipline", &Discipline::ALL.map(|d| (d.as_str(), d)))
            .filter(|d| {
                // A push replica without concurrency takes every request at
                // once: it has no line to order. A pull hop's line is its
                // broker topic.
                let lineless = *d != Discipline::Fifo
                    && transport == Some(Transport::Push)
                    && s.get("concurrency").is_none();
                if lineless {
                    s.forbid(
                        p,
                        "discipline",
                        "needs concurrency on a push hop (it orders the wait for a slot)",
                    );
                }
                !lineless
            }),
    }
}

fn worker_ping(s: &Section<'_>, p: &mut Problems) -> Option<Option<Duration>> {
    match s.get("worker_ping") {
        None => Some(None),
        Some(_) => s.duration(p, "worker_ping").and_then(|(d, entry)| {
            if (MIN_WORKER_PING..=MAX_WORKER_PING).contains(&d) {
                Some(Some(d))
            } else {
                s.report(
                    p,
                    &entry.node.span,
                    format!(
                        "{} must be from {} to {}, got {}",
                        s.name("worker_ping"),
                        humantime::format_duration(MIN_WORKER_PING),
                        humantime::format_duration(MAX_WORKER_PING),
                        humantime::format_duration(d)
                    ),
                );
                None
            }
        }),
    }
}

fn balance(s: &Section<'_>, p: &mut Problems) -> Option<Balance> {
    match s.get("balance") {
        None => Some(Balance::RoundRobin),
        Some(_) => s.choice(
            p,
            "balance",
            &[
                ("round_robin", Balance::RoundRobin),
                ("random", Balance::Random),
                ("p2c", Balance::P2c),
                ("ewma", Balance::Ewma),
            ],
        ),
    }
}

/// `streaming`: how the callers that serve a stream reach this hop. A
/// streaming hop goes by push: a broker's workers take each task on its
/// own (a stream's order and its one connection would be lost). With a
/// `[hop.service]`, each of its stream's messages is one call of the
/// service's method.
fn streaming(s: &Section<'_>, p: &mut Problems) -> Option<Streaming> {
    let Some(entry) = s.get("streaming") else {
        return Some(Streaming::Unary);
    };
    let kind = s.choice(
        p,
        "streaming",
        &[
            ("unary", Some(Streaming::Unary)),
            ("bidi", Some(Streaming::Bidi)),
            ("server", Some(Streaming::Server)),
            ("client", Some(Streaming::Client)),
        ],
    )??;
    if kind != Streaming::Unary {
        let named = super::load::kind_name(kind);
        if let Some(transport) = s.get("transport")
            && matches!(&transport.node.value, Value::String(t) if t == "pull")
        {
            s.report(
                p,
                &entry.key_span,
                format!(
                    "{} = \"{named}\" goes by push only: a broker's workers take each task on \
                     its own, so a stream's order and its one connection would be lost (leave \
                     out transport = \"pull\")",
                    s.name("streaming")
                ),
            );
            return None;
        }
    }
    Some(kind)
}

/// `connection`: how this hop's callers hold their connections to it
/// (whether a hop calls it at all is the mesh's check).
pub(super) fn connection(s: &Section<'_>, p: &mut Problems) -> Option<Connection> {
    match s.get("connection") {
        None => Some(Connection::Shared),
        Some(_) => s.choice(
            p,
            "connection",
            &[
                ("shared", Connection::Shared),
                ("per_request", Connection::PerRequest),
            ],
        ),
    }
}

fn hop_service(
    s: &Section<'_>,
    replicas: Option<u32>,
    p: &mut Problems,
) -> Option<Option<HopService>> {
    let service = match table_section(s, p, "service") {
        None => Some(None),
        Some(section) => section
            .and_then(|w| crate::scenario::service::service(&w, replicas, p))
            .map(Some),
    };
    if let Some(Some(service)) = &service
        && service.direct
    {
        crate::scenario::service::refuse_beside_direct(s, service.layers, p);
    }
    service
}

fn hop_work(s: &Section<'_>, p: &mut Problems) -> Option<Work> {
    match table_section(s, p, "work") {
        None => Some(Work::None),
        Some(_) if s.get("service").is_some() => {
            s.forbid(
                p,
                "work",
                "cannot go with service: the call to the service is the hop's work",
            );
            None
        }
        Some(section) => section.and_then(|w| work(&w, p)),
    }
}

/// A hop's injected faults as read, each with its window where it has
/// one; the outer `None` when its section has a problem (reported).
struct HopFaults {
    slow: Option<Option<(Slowness, Window)>>,
    replica_slow: Option<Option<(ReplicaSlow, Window)>>,
    net: Option<Option<NetFault>>,
    replica_net: Option<Vec<ReplicaNet>>,
    error: Option<Option<(ErrorInjection, Window)>>,
}

impl HopFaults {
    /// The windows of the application-level faults (a default window for
    /// an absent or unreadable one).
    fn windows(&self) -> AppWindows {
        fn window_of<T>(fault: &Option<Option<(T, Window)>>) -> Window {
            fault
                .as_ref()
                .and_then(|f| f.as_ref().map(|(_, w)| *w))
                .unwrap_or_default()
        }
        AppWindows {
            slow: window_of(&self.slow),
            replica_slow: window_of(&self.replica_slow),
            error: window_of(&self.error),
        }
    }
}

fn hop_faults(s: &Section<'_>, replicas: Option<u32>, p: &mut Problems) -> HopFaults {
    let slow = match table_section(s, p, "slow") {
        None => Some(None),
        Some(section) => section.and_then(|w| slowness(&w, p)).map(Some),
    };
    let replica_slow = match table_section(s, p, "replica_slow") {
        None => Some(None),
        Some(_) if s.get("service").is_some() => {
            s.forbid(
                p,
                "replica_slow",
                "cannot go with service: it scales the hop's own work, and a service's time is \
                 the service's (slow a replica's service with its own command, or use slow)",
            );
            None
        }
        Some(section) => section
            .and_then(|w| replica_slow(&w, replicas, p))
            .map(Some),
    };
    let net = net_table(s, p);
    let replica_net = replica_nets(s, replicas, p);
    let error = match table_section(s, p, "error") {
        None => Some(None),
        Some(section) => section.and_then(|w| error_injection(&w, p)).map(Some),
    };
    HopFaults {
        slow,
        replica_slow,
        net,
        replica_net,
        error,
    }
}

pub(super) fn downstream<'a>(s: &Section<'a>, p: &mut Problems) -> Downstream<'a> {
    let Some(entry) = s.get("downstream") else {
        return Downstream::Chain;
    };
    let Value::Array(items) = &entry.node.value else {
        s.wrong_type(p, entry, "an array of calls (hop names or call tables)");
        return Downstream::Invalid;
    };
    // An array of arrays is stages, one after another; otherwise one stage.
    let staged = items.iter().any(|i| matches!(i.value, Value::Array(_)));
    let mut stages = Vec::new();
    let mut ok = true;
    if staged {
        for item in items {
            match &item.value {
                Value::Array(calls) => match stage(s, calls, p) {
                    Some(calls) => stages.push(calls),
                    None => ok = false,
                },
                other => {
                    ok = false;
                    s.report(
                        p,
                        &item.span,
                        format!(
                            "downstream mixes stages (arrays) with {}: write every stage as an \
                             array, e.g. downstream = [[\"a\"], [\"b\", \"c\"]]",
                            other.kind()
                        ),
                    );
                }
            }
        }
    } else {
        match stage(s, items, p) {
            Some(calls) if !calls.is_empty() => stages.push(calls),
            Some(_) => {}
            None => ok = false,
        }
    }
    if ok {
        Downstream::Stages(stages)
    } else {
        Downstream::Invalid
    }
}

/// The keys of a call written as a table in `downstream`.
const CALL_KEYS: &[&str] = &["hop", "probability", "count", "repeats"];

/// One stage of `downstream`: its calls, each a hop name or a table.
fn stage<'a>(s: &Section<'a>, items: &'a [Node], p: &mut Problems) -> Option<Vec<CallDraft<'a>>> {
    let mut calls = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        match &item.value {
            Value::String(name) => calls.push(CallDraft {
                name,
                span: &item.span,
                call: Call::once(name.as_str()),
            }),
            Value::Table(table) => match call_table(s, item, table, p) {
                Some(c) => calls.push(c),
                None => ok = false,
            },
            other => {
                ok = false;
                s.report(
                    p,
                    &item.span,
                    format!(
                        "expected a hop name or a call table {{ hop = \"name\", probability = .., \
                         count = .. }} in downstream, got {}",
                        other.kind()
                    ),
                );
            }
        }
    }
    ok.then_some(calls)
}

/// `{ hop = "b", probability = 0.3, count = 2 | { 1 = 0.7, 2 = 0.3 },
/// repeats = "sequential" | "parallel" }`.
fn call_table<'a>(
    s: &Section<'a>,
    item: &'a Node,
    table: &'a Table,
    p: &mut Problems,
) -> Option<CallDraft<'a>> {
    let c = Section {
        table,
        span: item.span.clone(),
        prefix: s.prefix.clone(),
        path: "downstream.".to_owned(),
        label: format!("a call in downstream of {}", s.label),
    };
    c.unknown_keys(p, CALL_KEYS);
    let hop = c.required(p, "hop", Section::string);
    let probability = match c.get("probability") {
        None => Some(1.0),
        Some(_) => c.number_in(p, "probability", 0.0, true, 1.0),
    };
    let count = match c.get("count").map(|e| (e, &e.node.value)) {
        None => Some(CallCount::Fixed(1)),
        Some((_, Value::Table(weights))) => count_weights(&c, weights, p),
        Some(_) => c
            .int_in(p, "count", 1, i64::from(MAX_COUNT))
            .and_then(|n| u32::try_from(n).ok())
            .map(CallCount::Fixed),
    };
    let repeats = match c.get("repeats") {
        None => Some(Repeats::Sequential),
        Some(_) => c.choice(
            p,
            "repeats",
            &[
                ("sequential", Repeats::Sequential),
                ("parallel", Repeats::Parallel),
            ],
        ),
    };
    let (name, entry) = hop?;
    Some(CallDraft {
        name,
        span: &entry.node.span,
        call: Call {
            hop: name.to_owned(),
            probability: probability?,
            count: count?,
            repeats: repeats?,
        },
    })
}

/// `count = { 1 = 0.7, 2 = 0.3 }`: counts and their relative weights,
/// normalised to sum to 1.
fn count_weights(c: &Section<'_>, weights: &Table, p: &mut Problems) -> Option<CallCount> {
    let mut out: Vec<(u32, f64)> = Vec::new();
    let mut ok = true;
    for e in &weights.entries {
        let n = e
            .key
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_COUNT).contains(n));
        let w = match e.node.value {
            #[allow(clippy::cast_precision_loss)]
            Value::Integer(i) => Some(i as f64),
            Value::Float(f) => Some(f),
            _ => None,
        }
        .filter(|w| w.is_finite() && *w > 0.0);
        match (n, w) {
            (Some(n), Some(w)) => out.push((n, w)),
            (None, _) => {
                ok = false;
                c.report(
                    p,
                    &e.key_span,
                    format!(
                        "downstream.count: \"{}\" is not a count from 1 to {MAX_COUNT}",
                        e.key
                    ),
                );
            }
            (_, None) => {
                ok = false;
                c.report(
                    p,
                    &e.node.span,
                    format!(
                        "downstream.count: the weight of {} must be a number greater than 0",
                        e.key
                    ),
                );
            }
        }
    }
    if ok && out.is_empty() {
        c.report(
            p,
            &c.span,
            "downstream.count: give at least one count and its weight, e.g. { 1 = 0.7, 2 = 0.3 }",
        );
        return None;
    }
    if !ok {
        return None;
    }
    out.sort_by_key(|(n, _)| *n);
    let total: f64 = out.iter().map(|(_, w)| w).sum();
    Some(CallCount::Weighted(
        out.into_iter().map(|(n, w)| (n, w / total)).collect(),
    ))
}
