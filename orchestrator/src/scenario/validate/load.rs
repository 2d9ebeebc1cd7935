//! `[load]`: the mode, rate or steps, length, warmup, connections,
//! payload, entries, generators and their links' faults, and whether the requests in flight fit the hops'
//! memory.

use std::time::Duration;

use tailmesh_services::limits::{
    IN_FLIGHT_REQUEST_BYTES, MAX_CALL_MESSAGE_BYTES, MAX_IN_FLIGHT_BYTES, MAX_PAYLOAD_BYTES,
};

use crate::scenario::error::Problems;
use crate::scenario::model::{
    Arrivals, ConnectionMode, Entry, Hop, Load, LoadMode, Step, Stop, StreamLoad, Streaming,
};
use crate::scenario::read::{Section, table_section};
use crate::scenario::tree::{Span, Value};

const LOAD_KEYS: &[&str] = &[
    "mode",
    "rate",
    "arrivals",
    "concurrency",
    "duration",
    "requests",
    "warmup",
    "timeout",
    "connection",
    "connections",
    "payload",
    "steps",
    "entries",
    "generators",
    "net",
    "generator_net",
    "streams",
];

const STREAMS_KEYS: &[&str] = &["streams", "messages", "length", "in_flight"];

/// Most streams open at once (`[load.streams] streams`).
const MAX_STREAMS: i64 = 100_000;

/// Most messages awaiting answers on one stream (`in_flight`).
const MAX_STREAM_IN_FLIGHT: i64 = 4096;

/// Most load generator processes (`[load] generators`).
const MAX_GENERATORS: i64 = 64;

const ENTRY_KEYS: &[&str] = &["hop", "weight"];

/// Largest weight of an entry (weights are relative).
const MAX_WEIGHT: f64 = 1e9;

const STEP_KEYS: &[&str] = &["rate", "duration"];

/// Highest open-loop rate, requests per second (`rate` and each step's).
const MAX_RATE: f64 = 1_000_000.0;

/// Most load steps: each is a phase of the results, with histograms of
/// its own.
const MAX_STEPS: usize = 100;

/// Why `rate` is refused next to `steps`.
const STEPS_SET_THE_RATE: &str = "cannot go with load.steps: each step sets its own rate (the \
                                  first step's also runs the warmup); change the steps instead";
/// Why `duration` and `requests` are refused next to `steps`.
const STEPS_SET_THE_LENGTH: &str = "cannot go with load.steps: the load lasts the steps' total \
                                    duration; change the steps instead";

/// Largest `[load] payload`: what the services' message limits are sized for.
const MAX_PAYLOAD: i64 = MAX_PAYLOAD_BYTES as i64;

pub(super) fn load(s: &Section<'_>, p: &mut Problems) -> Option<Load> {
    s.unknown_keys(p, LOAD_KEYS);
    let mode = s.required(p, "mode", |s, p, k| {
        s.choice(p, k, &[("open", true), ("closed", false)])
    });
    // Steps decide the rate and the length; a closed loop has neither.
    let stepped = s.get("steps").is_some() && mode != Some(false);
    let steps = if stepped { steps(s, p) } else { None };
    let mode = match mode {
        Some(true) => {
            s.forbid(p, "concurrency", "is only for mode = \"open\"");
            let rate = if stepped {
                s.forbid(p, "rate", STEPS_SET_THE_RATE);
                steps
                    .as_ref()
                    .and_then(|steps| steps.first())
                    .map(|s| s.rate)
            } else {
                s.required(p, "rate", |s, p, k| s.number_in(p, k, 0.0, true, MAX_RATE))
            };
            let arrivals = match s.get("arrivals") {
                None => Some(Arrivals::Poisson),
                Some(_) => s.choice(
                    p,
                    "arrivals",
                    &[
                        ("poisson", Arrivals::Poisson),
                        ("uniform", Arrivals::Uniform),
                    ],
                ),
            };
            rate.zip(arrivals).map(|(rate, arrivals)| LoadMode::Open {
                rate,
                arrivals,
                steps: steps.clone().unwrap_or_default(),
            })
        }
        Some(false) => {
            s.forbid(p, "rate", "is only for mode = \"open\"");
            s.forbid(p, "arrivals", "is only for mode = \"open\"");
            s.forbid(p, "steps", "is only for mode = \"open\"");
            s.required(p, "concurrency", |s, p, k| s.int_in(p, k, 1, 10_000))
                .and_then(|c| u32::try_from(c).ok())
                .map(|concurrency| LoadMode::Closed { concurrency })
        }
        None => {
            // Still check the values' types and ranges.
            if stepped {
                s.forbid(p, "rate", STEPS_SET_THE_RATE);
            } else if s.get("rate").is_some() {
                s.number_in(p, "rate", 0.0, true, MAX_RATE);
            }
            if s.get("arrivals").is_some() {
                s.choice(p, "arrivals", &[("poisson", ()), ("uniform", ())]);
            }
            if s.get("concurrency").is_some() {
                s.int_in(p, "concurrency", 1, 10_000);
            }
            None
        }
    };

    let stop = if stepped {
        s.forbid(p, "duration", STEPS_SET_THE_LENGTH);
        s.forbid(p, "requests", STEPS_SET_THE_LENGTH);
        steps.as_deref().and_then(|steps| steps_length(s, p, steps))
    } else {
        match (s.get("duration"), s.get("requests")) {
            (None, None) => {
                p.at(
                    s.span.start,
                    format!(
                        "{} needs exactly one of \"duration\" or \"requests\"",
                        s.label
                    ),
                );
                None
            }
            (Some(duration), Some(requests)) => {
                let later = if duration.key_span.start > requests.key_span.start {
                    duration
                } else {
                    requests
                };
                s.report(
                    p,
                    &later.key_span,
                    "load.duration and load.requests exclude each other: give exactly one",
                );
                None
            }
            (Some(_), None) => s.positive_duration(p, "duration").map(Stop::Duration),
            (None, Some(_)) => s
                .int_min(p, "requests", 1)
                .and_then(|r| u64::try_from(r).ok())
                .map(Stop::Requests),
        }
    };
    let warmup = match s.get("warmup") {
        None => Some(Duration::ZERO),
        Some(_) => s.duration(p, "warmup").map(|(d, _)| d),
    };
    let timeout = match s.get("timeout") {
        None => Some(Duration::from_secs(1)),
        Some(_) => s.positive_duration(p, "timeout"),
    };
    let per_request = match s.get("connection") {
        None => Some(false),
        Some(_) => s.choice(p, "connection", &[("shared", false), ("per_request", true)]),
    };
    let connections = match s.get("connections") {
        None => Some(1),
        Some(_) => s
            .int_in(p, "connections", 1, 64)
            .and_then(|c| u32::try_from(c).ok()),
    };
    if per_request == Some(true) {
        s.forbid(
            p,
            "connections",
            "is only for connection = \"shared\" (per_request opens one per request)",
        );
    }
    let connection = match (per_request, connections) {
        (Some(true), _) => Some(ConnectionMode::PerRequest),
        (Some(false), Some(connections)) => Some(ConnectionMode::Shared { connections }),
        _ => None,
    };
    let payload_bytes = match s.get("payload") {
        None => Some(64),
        Some(_) => s
            .int_in(p, "payload", 0, MAX_PAYLOAD)
            .and_then(|b| usize::try_from(b).ok()),
    };

    let generators = match s.get("generators") {
        None => Some(1),
        Some(_) => s
            .int_in(p, "generators", 1, MAX_GENERATORS)
            .and_then(|g| u32::try_from(g).ok()),
    };
    if let (Some(LoadMode::Closed { concurrency }), Some(generators)) = (&mode, generators)
        && *concurrency < generators
    {
        s.report(
            p,
            s.get("generators").map_or(&s.span, |g| &g.key_span),
            format!(
                "load.generators = {generators} splits the {concurrency} requests in flight \
                 between them: each needs at least one (raise load.concurrency or lower \
                 load.generators)"
            ),
        );
    }

    let streams = match table_section(s, p, "streams") {
        None => Some(None),
        Some(section) => section
            .and_then(|t| stream_load(&t, mode.as_ref(), p))
            .map(Some),
    };
    // Streams send on a fixed schedule, from one generator.
    let mode = match (mode, &streams) {
        (
            Some(LoadMode::Open {
                rate,
                arrivals,
                steps,
            }),
            Some(Some(_)),
        ) => {
            let poisson = s
                .get("arrivals")
                .is_some_and(|a| matches!(&a.node.value, Value::String(v) if v == "poisson"));
            if poisson {
                s.forbid(
                    p,
                    "arrivals",
                    "cannot be \"poisson\" with load.streams: each stream's messages are due \
                     on a fixed schedule (leave arrivals out)",
                );
            }
            s.forbid(p, "steps", "cannot go with load.streams yet: give one rate");
            Some(LoadMode::Open {
                rate,
                arrivals: if poisson { arrivals } else { Arrivals::Uniform },
                steps,
            })
        }
        (mode, _) => mode,
    };
    // The generators' links: every one's, and single ones'.
    let net = super::faults::net_table(s, p);
    let generator_net = super::faults::generator_nets(s, generators, p);

    if let (Some(mode), Some(timeout), Some(payload)) = (&mode, timeout, payload_bytes) {
        in_flight_budget(s, p, mode, timeout, payload);
    }

    Some(Load {
        mode: mode?,
        stop: stop?,
        warmup: warmup?,
        timeout: timeout?,
        connection: connection?,
        payload_bytes: payload_bytes?,
        // Known once the hops are: see [`entries`].
        entries: Vec::new(),
        generators: generators?,
        net: net?,
        generator_net: generator_net?,
        streams: streams?,
    })
}

/// `[load.streams]`: how many streams at once, their messages each (or,
/// in an open loop, how long each lasts), and the cap on messages in
/// flight per stream (16 when not given). In a closed loop of
/// `concurrency`, that many streams each have one message in flight:
/// `streams`, `length` and `in_flight` are not given.
fn stream_load(s: &Section<'_>, mode: Option<&LoadMode>, p: &mut Problems) -> Option<StreamLoad> {
    s.unknown_keys(p, STREAMS_KEYS);
    if let Some(LoadMode::Closed { concurrency }) = mode {
        let concurrency = *concurrency;
        s.forbid(
            p,
            "length",
            "is for mode = \"open\": in a closed loop, a stream's messages go as fast as they \
             are answered (give messages)",
        );
        s.forbid(
            p,
            "streams",
            "is for mode = \"open\": in a closed loop, load.concurrency streams are open at once",
        );
        s.forbid(
            p,
            "in_flight",
            "is for mode = \"open\": in a closed loop, each stream has one message in flight",
        );
        let messages = s.required(p, "messages", |s, p, k| {
            s.int_in(p, k, 1, i64::from(u32::MAX))
        });
        return Some(StreamLoad {
            streams: concurrency,
            messages: u32::try_from(messages?).ok()?,
            in_flight: 1,
            kind: Streaming::Bidi,
        });
    }
    let streams = s.required(p, "streams", |s, p, k| s.int_in(p, k, 1, MAX_STREAMS));
    let messages = match (s.get("messages"), s.get("length")) {
        (Some(_), Some(length)) => {
            s.report(
                p,
                &length.key_span,
                format!(
                    "{} and {} say the same thing: give one",
                    s.name("messages"),
                    s.name("length")
                ),
            );
            None
        }
        (None, Some(_)) => {
            // Each stream's messages are `streams / rate` apart.
            let length = s.positive_duration(p, "length");
            let rate = match mode {
                Some(LoadMode::Open { rate, .. }) => Some(*rate),
                _ => None,
            };
            match (length, rate, streams) {
                (Some(length), Some(rate), Some(streams)) => {
                    let n = (length.as_secs_f64() * rate / streams as f64).round();
                    Some(n.clamp(1.0, f64::from(u32::MAX)) as i64)
                }
                _ => None,
            }
        }
        (Some(_), None) => s.int_in(p, "messages", 1, i64::from(u32::MAX)),
        (None, None) => {
            p.at(
                s.span.start,
                format!(
                    "{} needs messages (each stream's) or length (how long each stream lasts)",
                    s.label
                ),
            );
            None
        }
    };
    let in_flight = match s.get("in_flight") {
        None => Some(16),
        Some(_) => s.int_in(p, "in_flight", 1, MAX_STREAM_IN_FLIGHT),
    };
    Some(StreamLoad {
        streams: u32::try_from(streams?).ok()?,
        messages: u32::try_from(messages?).ok()?,
        in_flight: u32::try_from(in_flight?).ok()?,
        // Known once the hops are: see `streams_enter_streaming_hops`.
        kind: Streaming::Bidi,
    })
}

/// An entry of `load.entries` as written, where it is written.
pub(super) struct EntryDraft<'a> {
    pub(super) hop: &'a str,
    pub(super) weight: f64,
    pub(super) span: &'a Span,
}

/// `load.entries = ["a", { hop = "b", weight = 3 }]`: the hops the load
/// generator calls, each with its relative weight (1 when not given).
/// `Some(empty)` without the key (the first hop is the entry); `None`
/// when it has a problem (each reported at its place). Whether the hops
/// exist is the mesh's check.
pub(super) fn entries<'a>(s: &Section<'a>, p: &mut Problems) -> Option<Vec<EntryDraft<'a>>> {
    let Some(entry) = s.get("entries") else {
        return Some(Vec::new());
    };
    let Value::Array(items) = &entry.node.value else {
        s.wrong_type(
            p,
            entry,
            "an array of hops such as [\"front\", { hop = \"admin\", weight = 0.1 }]",
        );
        return None;
    };
    if items.is_empty() {
        s.report(
            p,
            &entry.node.span,
            format!(
                "{} is empty: name at least one hop, or leave it out for the first hop",
                s.name("entries")
            ),
        );
        return None;
    }
    let mut out: Vec<EntryDraft<'a>> = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        let draft = match &item.value {
            Value::String(hop) => Some(EntryDraft {
                hop,
                weight: 1.0,
                span: &item.span,
            }),
            Value::Table(table) => {
                let e = Section {
                    table,
                    span: item.span.clone(),
                    prefix: s.prefix.clone(),
                    path: format!("{}.", s.name("entries")),
                    label: format!("an entry in {}", s.name("entries")),
                };
                e.unknown_keys(p, ENTRY_KEYS);
                let hop = e.required(p, "hop", Section::string);
                let weight = match e.get("weight") {
                    None => Some(1.0),
                    Some(_) => e.number_in(p, "weight", 0.0, true, MAX_WEIGHT),
                };
                hop.zip(weight).map(|((hop, at), weight)| EntryDraft {
                    hop,
                    weight,
                    span: &at.node.span,
                })
            }
            other => {
                if !matches!(other, Value::Invalid) {
                    s.report(
                        p,
                        &item.span,
                        format!(
                            "expected a hop name or {{ hop = \"name\", weight = .. }} in {}, got {}",
                            s.name("entries"),
                            other.kind()
                        ),
                    );
                }
                None
            }
        };
        match draft {
            Some(d) if out.iter().any(|o| o.hop == d.hop) => {
                ok = false;
                s.report(
                    p,
                    d.span,
                    format!(
                        "hop \"{}\" is listed twice in {} (give it one weight)",
                        d.hop,
                        s.name("entries")
                    ),
                );
            }
            Some(d) => out.push(d),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// The entries' shares of the requests: their weights over the weights'
/// sum.
pub(super) fn entry_shares(drafts: &[EntryDraft<'_>]) -> Vec<Entry> {
    let total: f64 = drafts.iter().map(|d| d.weight).sum();
    drafts
        .iter()
        .map(|d| Entry {
            hop: d.hop.to_owned(),
            share: d.weight / total,
        })
        .collect()
}

/// `load.steps`: a non-empty array of `{ rate, duration }` tables, each
/// problem at its place. `None` when any step has a problem.
fn steps(s: &Section<'_>, p: &mut Problems) -> Option<Vec<Step>> {
    let entry = s.get("steps")?;
    let Value::Array(items) = &entry.node.value else {
        s.wrong_type(
            p,
            entry,
            "an array of steps such as [{ rate = 200, duration = \"4s\" }]",
        );
        return None;
    };
    if items.is_empty() {
        s.report(
            p,
            &entry.node.span,
            format!(
                "{} is empty: give at least one {{ rate, duration }}, or rate and duration for \
                 a constant rate",
                s.name("steps")
            ),
        );
        return None;
    }
    if items.len() > MAX_STEPS {
        s.report(
            p,
            &entry.node.span,
            format!(
                "{} has {} steps, at most {MAX_STEPS}: each is a phase of the results",
                s.name("steps"),
                items.len()
            ),
        );
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let number = i + 1;
        let Value::Table(table) = &item.value else {
            if !matches!(item.value, Value::Invalid) {
                s.report(
                    p,
                    &item.span,
                    format!(
                        "expected a table such as {{ rate = 200, duration = \"4s\" }} for step \
                         {number} of {}, got {}",
                        s.name("steps"),
                        item.value.kind()
                    ),
                );
            }
            continue;
        };
        let step = Section {
            table,
            span: item.span.clone(),
            prefix: format!("{}{}, step {number}: ", s.prefix, s.name("steps")),
            path: String::new(),
            label: format!("step {number} of {}", s.name("steps")),
        };
        step.unknown_keys(p, STEP_KEYS);
        let rate = step.required(p, "rate", |s, p, k| s.number_in(p, k, 0.0, true, MAX_RATE));
        let duration = step.required(p, "duration", Section::positive_duration);
        if let (Some(rate), Some(duration)) = (rate, duration) {
            out.push(Step { rate, duration });
        }
    }
    (out.len() == items.len()).then_some(out)
}

/// The steps' total duration, the load's length; a sum past what a
/// `Duration` holds is reported at the steps.
fn steps_length(s: &Section<'_>, p: &mut Problems, steps: &[Step]) -> Option<Stop> {
    let total = steps
        .iter()
        .try_fold(Duration::ZERO, |sum, step| sum.checked_add(step.duration));
    if total.is_none()
        && let Some(entry) = s.get("steps")
    {
        s.report(
            p,
            &entry.node.span,
            format!("{} last longer than a run can", s.name("steps")),
        );
    }
    total.map(Stop::Duration)
}

/// Refuses a load that could put more than [`MAX_IN_FLIGHT_BYTES`] in
/// flight, at the key that makes it large (the payload, else the timeout,
/// else the table).
fn in_flight_budget(
    s: &Section<'_>,
    p: &mut Problems,
    mode: &LoadMode,
    timeout: Duration,
    payload: usize,
) {
    let in_flight = match mode {
        // The busiest step's rate.
        LoadMode::Open { rate, steps, .. } => {
            let rate = steps.iter().map(|s| s.rate).fold(*rate, f64::max);
            (rate * timeout.as_secs_f64()).ceil()
        }
        LoadMode::Closed { concurrency } => f64::from(*concurrency),
    };
    let per_request = payload as f64 + IN_FLIGHT_REQUEST_BYTES as f64;
    let bytes = in_flight * per_request;
    if bytes <= MAX_IN_FLIGHT_BYTES as f64 {
        return;
    }
    let mib = |b: f64| b / f64::from(1u32 << 20);
    let why = match mode {
        LoadMode::Open { .. } => "rate x timeout",
        LoadMode::Closed { .. } => "the concurrency",
    };
    let message = format!(
        "up to {in_flight} requests may be in flight ({why}), {:.0} MiB of payload and \
         per-request state at {:.1} KiB each; the load generator holds at most {:.0} MiB in \
         flight: lower the rate, the timeout or the payload",
        mib(bytes),
        per_request / 1024.0,
        mib(MAX_IN_FLIGHT_BYTES as f64),
    );
    let span = ["payload", "timeout"]
        .iter()
        .find_map(|k| s.get(k))
        .map_or(&s.span, |entry| &entry.key_span);
    s.report(p, span, format!("{}: {message}", s.label));
}

/// How long the measured load lasts, when it is known before the run: its
/// duration, or `requests / rate` for an open loop.
pub(super) fn load_length(load: &Load) -> Option<Duration> {
    match (load.stop, &load.mode) {
        (Stop::Duration(d), _) => Some(d),
        (Stop::Requests(n), LoadMode::Open { rate, .. }) => {
            Duration::try_from_secs_f64(n as f64 / rate).ok()
        }
        (Stop::Requests(_), LoadMode::Closed { .. }) => None,
    }
}

/// `[load.streams]` sends its messages on streams: every entry hop must
/// be reached by stream, and every streaming hop with one kind of stream
/// (a stream's messages go down the mesh as the stream they came on). The
/// load's streams take that kind. A server stream's messages come at
/// their times, from an open loop, with no cap of the load's.
pub(super) fn streams_enter_streaming_hops(
    top: &Section<'_>,
    hops: &[Hop],
    load: &mut Load,
    p: &mut Problems,
) {
    let kinds: std::collections::BTreeSet<Streaming> = hops
        .iter()
        .map(|h| h.streaming)
        .filter(|k| *k != Streaming::Unary)
        .collect();
    let load_table = top.get("load").and_then(|l| match &l.node.value {
        Value::Table(t) => Some(t),
        _ => None,
    });
    let streams_at = load_table
        .and_then(|t| t.get("streams"))
        .map_or(top.span.start, |e| e.key_span.start);
    if kinds.len() > 1 {
        let named: Vec<String> = hops
            .iter()
            .filter(|h| h.streaming != Streaming::Unary)
            .map(|h| format!("\"{}\" {}", h.name, kind_name(h.streaming)))
            .collect();
        p.at(
            top.span.start,
            format!(
                "the streaming hops mix kinds of stream ({}): a stream's messages go down the \
                 mesh as the stream they came on, so give them one kind",
                named.join(", ")
            ),
        );
    }
    let entry_kinds: Vec<(String, Streaming)> = load
        .entry_hops(hops)
        .iter()
        .map(|(i, _)| (hops[*i].name.clone(), hops[*i].streaming))
        .collect();
    let Some(streams) = load.streams.as_mut() else {
        return;
    };
    for (name, kind) in &entry_kinds {
        if *kind == Streaming::Unary {
            p.at(
                streams_at,
                format!(
                    "load.streams sends messages on streams, but the entry hop \"{name}\" is not \
                     reached by stream: set streaming = \"bidi\", \"server\" or \"client\" on it"
                ),
            );
        }
    }
    if let Some(&(_, kind)) = entry_kinds.iter().find(|(_, k)| *k != Streaming::Unary) {
        streams.kind = kind;
    }
    let written = |key: &str| {
        load_table
            .and_then(|t| t.get("streams"))
            .and_then(|e| match &e.node.value {
                Value::Table(t) => t.get(key).map(|k| k.key_span.start),
                _ => None,
            })
    };
    if matches!(streams.kind, Streaming::Server | Streaming::Client) {
        let kind = kind_name(streams.kind);
        if let Some(at) = written("in_flight") {
            let why = match streams.kind {
                Streaming::Server => {
                    "a server stream's messages come at their times whatever is awaited"
                }
                _ => "a client stream's messages are all answered at its end",
            };
            p.at(
                at,
                format!("load.streams.in_flight is for bidi streams: {why}"),
            );
        }
        if matches!(load.mode, LoadMode::Closed { .. }) {
            let why = match streams.kind {
                Streaming::Server => "the stream's source sends its messages at the rate's times",
                _ => {
                    "a client stream answers no message before its end, so none can wait for the last"
                }
            };
            p.at(
                streams_at,
                format!("load.streams with {kind} streams needs mode = \"open\": {why}"),
            );
        }
    }
    if streams.kind == Streaming::Client {
        // The stream's one reply carries every message's answer, a record
        // per hop it visited: it must fit one gRPC message.
        let per_message = CLIENT_ANSWER_BYTES + CLIENT_ANSWER_BYTES_PER_HOP * hops.len() as u64;
        let most = MAX_CALL_MESSAGE_BYTES as u64 / per_message;
        if u64::from(streams.messages) > most {
            let at = written("messages").unwrap_or(streams_at);
            p.at(
                at,
                format!(
                    "load.streams.messages = {} is too many for a client stream through {} \
                     hop{}: its one reply answers every message, about {per_message} bytes \
                     each, and may take {MAX_CALL_MESSAGE_BYTES} bytes, so at most {most}",
                    streams.messages,
                    hops.len(),
                    if hops.len() == 1 { "" } else { "s" },
                ),
            );
        }
    }
}

/// Room for a client stream's answer to one message besides its hops'
/// records, and for each hop's record, in bytes (generous: a record with
/// long names and a call is under 200).
const CLIENT_ANSWER_BYTES: u64 = 48;
const CLIENT_ANSWER_BYTES_PER_HOP: u64 = 256;

/// A kind of stream as the scenario writes it.
pub(super) fn kind_name(kind: Streaming) -> &'static str {
    match kind {
        Streaming::Unary => "unary",
        Streaming::Bidi => "bidi",
        Streaming::Server => "server",
        Streaming::Client => "client",
    }
}
