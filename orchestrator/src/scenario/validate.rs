//! Validation of one scenario tree (the base file, or a variant's copy of
//! it) into the checked model. Every problem is recorded; nothing stops
//! early, and a part that has problems simply yields no model.

use std::collections::HashMap;
use std::time::Duration;

use tailmesh_services::{
    discipline::Discipline,
    limits::{
        DEFAULT_QUEUE_LIMIT, IN_FLIGHT_REQUEST_BYTES, MAX_IN_FLIGHT_BYTES, MAX_PAYLOAD_BYTES,
        MAX_QUEUE_LIMIT,
    },
    model::{
        Balance, Connection, DurationDist, ErrorInjection, ReplicaSlow, Slowness, Transport, Work,
    },
};

use super::error::Problems;
use super::model::{
    AppWindows, Arrivals, Check, ClientPolicy, ConnectionMode, DEFAULT_DISTRIBUTION_TOLERANCE,
    DEFAULT_MAX_ERROR_RATE, Hedge, Hop, HopService, INTERVAL_GRACE, Keep, KeepShare, Launcher,
    Load, LoadMode, MAX_HOPS, NetFault, ReplicaNet, Report, Step, Stop, Telemetry, Window,
};
use super::read::{Section, dns_label_problem, duration_of, is_dns_label, table_section};
use super::tree::{Node, Span, Table, Value};

/// The slow threshold when the file has no `[check].slow_threshold`.
pub(super) const DEFAULT_SLOW_THRESHOLD: Duration = Duration::from_secs(1);

const TOP_KEYS: &[&str] = &[
    "name",
    "description",
    "seed",
    "launcher",
    "load",
    "hop",
    "variant",
    "check",
    "report",
    "sweep",
    "telemetry",
    "broker",
    "mesh",
];
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
];
const STEP_KEYS: &[&str] = &["rate", "duration"];
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
    // Mesh-client keys and `kill` (see `super::endpoints`).
    "health",
    "backoff",
    "keepalive",
    "keepalive_timeout",
    "ewma",
    "ejection",
    "kill",
    // A real gRPC service as the hop's work (see `super::service`).
    "service",
];
const NET_KEYS: &[&str] = &["loss", "delay", "jitter", "start", "duration"];
const DIST_KEYS: &[&str] = &["dist", "value", "min", "max", "mean", "sigma"];
const CHECK_KEYS: &[&str] = &[
    "slow_threshold",
    "compounding",
    "max_error_rate",
    "distribution",
    "distribution_tolerance",
];
const REPORT_KEYS: &[&str] = &["histogram", "interval"];
const TELEMETRY_KEYS: &[&str] = &[
    "sampling",
    "forward",
    "keep_slow",
    "keep_slow_percentile",
    "keep_failed",
    "keep_retried",
    "keep_share",
];

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

/// The most rounds of CPU work per request.
const MAX_ROUNDS: i64 = 100_000;
/// Bounds of a hop's `worker_ping`.
const MIN_WORKER_PING: Duration = Duration::from_millis(1);
const MAX_WORKER_PING: Duration = Duration::from_secs(60);
/// Largest `[load] payload`: what the services' message limits are sized for.
const MAX_PAYLOAD: i64 = MAX_PAYLOAD_BYTES as i64;
/// Shortest `[report] interval`.
const MIN_REPORT_INTERVAL: Duration = Duration::from_millis(10);
/// The most memory a variant's open latency intervals may hold, bytes.
const INTERVAL_MEMORY_BUDGET: f64 = 128.0 * 1024.0 * 1024.0;
/// Sets of interval histograms held besides the open intervals: the .hlog
/// writer's queue (4), the one it writes, and the chart's.
const INTERVAL_SETS_BESIDES: f64 = 6.0;

/// Everything of a scenario tree, checked.
#[derive(Debug)]
pub(super) struct Parts {
    pub name: String,
    pub description: String,
    pub seed: u64,
    pub launcher: Launcher,
    pub load: Load,
    pub hops: Vec<Hop>,
    pub check: Check,
    pub report: Report,
    pub telemetry: Telemetry,
    pub broker: super::broker::Broker,
    pub mesh: super::model::Mesh,
}

/// Validates a whole tree; `Some` only if it has no problem at all.
pub(super) fn validate(root: &Table) -> (Option<Parts>, Problems) {
    let mut p = Problems::default();
    let top = Section {
        table: root,
        span: 0..0,
        prefix: String::new(),
        path: String::new(),
        label: "the top level".to_owned(),
    };
    top.unknown_keys(&mut p, TOP_KEYS);

    let name = top
        .required(&mut p, "name", Section::string)
        .and_then(|(name, entry)| {
            if is_dns_label(name) {
                Some(name.to_owned())
            } else {
                top.report(&mut p, &entry.node.span, dns_label_problem("name", name));
                None
            }
        });
    let description = match top.get("description") {
        None => Some(String::new()),
        Some(_) => top.string(&mut p, "description").map(|(s, _)| s.to_owned()),
    };
    let seed = match top.get("seed") {
        None => Some(1),
        Some(_) => top
            .int_min(&mut p, "seed", 0)
            .and_then(|s| u64::try_from(s).ok()),
    };
    let launcher = match top.get("launcher") {
        None => Some(None),
        Some(_) => top
            .choice(
                &mut p,
                "launcher",
                &[
                    ("local", Launcher::Local),
                    ("netns", Launcher::Netns),
                    ("auto", Launcher::Auto),
                ],
            )
            .map(Some),
    };
    let load = match table_section(&top, &mut p, "load") {
        Some(Some(section)) => load(&section, &mut p),
        Some(None) => None,
        None => {
            top.missing(&mut p, "load");
            None
        }
    };
    let hops = hops(&top, &mut p);
    if let (Some(hops), Some(load)) = (&hops, &load) {
        windows_within_the_load(&top, hops, load, &mut p);
        super::service::direct_entry_fits_the_load(&top, hops, load, &mut p);
    }
    let launcher = launcher.and_then(|launcher| {
        let faulty = hops.as_ref().and_then(|hops| {
            hops.iter()
                .find(|h| h.net.is_some() || !h.replica_net.is_empty())
        });
        match (launcher, faulty) {
            // Without a launcher named, network faults pick one that can
            // apply them (or fail when the run starts, saying why).
            (None, Some(_)) => Some(Launcher::Auto),
            (None, None) => Some(Launcher::Local),
            (Some(Launcher::Local), Some(hop)) => {
                if let Some(entry) = top.get("launcher") {
                    top.report(
                        &mut p,
                        &entry.node.span,
                        format!(
                            "launcher = \"local\" cannot apply network faults (hop \"{}\" has \
                             net or replica_net): use launcher = \"netns\" (needs root or \
                             CAP_NET_ADMIN) or \"auto\"",
                            hop.name
                        ),
                    );
                }
                None
            }
            (Some(launcher), _) => Some(launcher),
        }
    });
    if let (Some(launcher), Some(hops)) = (launcher, &hops) {
        services_need_a_local_launcher(&top, &mut p, launcher, hops);
    }
    let check = match table_section(&top, &mut p, "check") {
        Some(Some(section)) => check(&section, &mut p),
        Some(None) => None,
        None => Some(Check {
            slow_threshold: DEFAULT_SLOW_THRESHOLD,
            compounding: false,
            max_error_rate: DEFAULT_MAX_ERROR_RATE,
            distribution: false,
            distribution_tolerance: DEFAULT_DISTRIBUTION_TOLERANCE,
        }),
    };

    let report = match table_section(&top, &mut p, "report") {
        Some(Some(section)) => report(&section, &mut p),
        Some(None) => None,
        None => Some((Report::default(), None)),
    };
    if let (Some((report, at)), Some(load), Some(hops)) = (&report, &load, &hops) {
        intervals_fit(&mut p, report, *at, load, hops.len());
    }
    let report = report.map(|(report, _)| report);

    let telemetry = match table_section(&top, &mut p, "telemetry") {
        Some(Some(section)) => telemetry(&section, &mut p),
        Some(None) => None,
        None => Some(Telemetry::default()),
    };

    let broker = match table_section(&top, &mut p, "broker") {
        Some(Some(section)) => super::broker::broker(&section, &mut p),
        Some(None) => None,
        None => Some(super::broker::Broker::default()),
    };

    let mesh = match table_section(&top, &mut p, "mesh") {
        Some(Some(section)) => {
            let mesh = super::mesh::mesh(&section, &mut p);
            if let (Some(mesh), Some(broker), Some(hops)) = (&mesh, &broker, &hops) {
                super::mesh::check_support(&section, &mut p, mesh, broker.kind, hops);
            }
            mesh
        }
        Some(None) => None,
        None => Some(super::model::Mesh::default()),
    };

    let parts = match (
        name,
        description,
        seed,
        launcher,
        load,
        hops,
        check,
        report,
        telemetry,
        broker,
        mesh,
    ) {
        (
            Some(name),
            Some(description),
            Some(seed),
            Some(launcher),
            Some(load),
            Some(hops),
            Some(check),
            Some(report),
            Some(telemetry),
            Some(broker),
            Some(mesh),
        ) if p.is_empty() => Some(Parts {
            name,
            description,
            seed,
            launcher,
            load,
            hops,
            check,
            report,
            telemetry,
            broker,
            mesh,
        }),
        _ => None,
    };
    (parts, p)
}

/// Reports every `[hop.service]` of a variant that runs under the netns
/// launcher (`launcher = "netns"`, or `"auto"` with network faults): its
/// services would have to be started inside the replicas' namespaces,
/// which the netns launcher does not do yet.
fn services_need_a_local_launcher(
    top: &Section<'_>,
    p: &mut Problems,
    launcher: Launcher,
    hops: &[Hop],
) {
    let netns = match launcher {
        Launcher::Netns => true,
        Launcher::Auto => hops
            .iter()
            .any(|h| h.net.is_some() || !h.replica_net.is_empty()),
        Launcher::Local => false,
    };
    if !netns {
        return;
    }
    let Some(Value::Array(items)) = top.get("hop").map(|e| &e.node.value) else {
        return;
    };
    for item in items {
        let Value::Table(table) = &item.value else {
            continue;
        };
        if let Some(entry) = table.get("service") {
            let name = match table.get("name").map(|e| &e.node.value) {
                Some(Value::String(name)) => name.as_str(),
                _ => "?",
            };
            p.at(
                entry.key_span.start,
                format!(
                    "hop \"{name}\": service is not supported yet with the netns launcher \
                     (launcher = \"netns\", or network faults): its services would have to \
                     run in the replicas' namespaces; use the local launcher, without net \
                     and replica_net faults"
                ),
            );
        }
    }
}

fn load(s: &Section<'_>, p: &mut Problems) -> Option<Load> {
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
    })
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

fn check(s: &Section<'_>, p: &mut Problems) -> Option<Check> {
    s.unknown_keys(p, CHECK_KEYS);
    let threshold = s
        .get("slow_threshold")
        .map(|_| s.positive_duration(p, "slow_threshold"));
    let compounding = match s.get("compounding") {
        None => Some(false),
        Some(_) => s.boolean(p, "compounding"),
    };
    if compounding == Some(true) && threshold.is_none() {
        s.forbid(
            p,
            "compounding",
            "= true needs check.slow_threshold: a slow request must be defined to count them",
        );
    }
    let max_error_rate = match s.get("max_error_rate") {
        None => Some(DEFAULT_MAX_ERROR_RATE),
        Some(_) => s.probability(p, "max_error_rate"),
    };
    let distribution = match s.get("distribution") {
        None => Some(false),
        Some(_) => s.boolean(p, "distribution"),
    };
    let distribution_tolerance = match s.get("distribution_tolerance") {
        None => Some(DEFAULT_DISTRIBUTION_TOLERANCE),
        Some(_) => s.number_in(p, "distribution_tolerance", 0.0, true, 1.0),
    };
    Some(Check {
        slow_threshold: threshold.unwrap_or(Some(DEFAULT_SLOW_THRESHOLD))?,
        compounding: compounding?,
        max_error_rate: max_error_rate?,
        distribution: distribution?,
        distribution_tolerance: distribution_tolerance?,
    })
}

/// The `[report]` table, with the place of its `interval` value (for the
/// checks that need the load and the hops).
fn report(s: &Section<'_>, p: &mut Problems) -> Option<(Report, Option<usize>)> {
    s.unknown_keys(p, REPORT_KEYS);
    let histogram = match s.get("histogram") {
        None => Some(false),
        Some(_) => s.boolean(p, "histogram"),
    };
    let interval = match s.duration(p, "interval") {
        None if s.get("interval").is_none() => Some((Report::default().interval, None)),
        None => None,
        Some((d, entry)) if d < MIN_REPORT_INTERVAL => {
            s.report(
                p,
                &entry.node.span,
                format!(
                    "report.interval must be at least {}, got {}",
                    humantime::format_duration(MIN_REPORT_INTERVAL),
                    humantime::format_duration(d)
                ),
            );
            None
        }
        Some((d, entry)) => Some((d, Some(entry.node.span.start))),
    };
    let (interval, at) = interval?;
    Some((
        Report {
            histogram: histogram?,
            interval,
        },
        at,
    ))
}

/// Checks a written `[report] interval` (at `at`) against the load: no
/// longer than the run (when its length is known up front), and the
/// histograms of the intervals open at once within
/// [`INTERVAL_MEMORY_BUDGET`]. The default is not checked: a run shorter
/// than it has one interval, as long as the run.
fn intervals_fit(p: &mut Problems, report: &Report, at: Option<usize>, load: &Load, hops: usize) {
    let Some(at) = at else {
        return;
    };
    let width = report.interval;
    let show = |d: Duration| humantime::format_duration(d).to_string();
    // A closed loop that stops by count has no length up front.
    let length = load_length(load).map(|d| {
        let what = match (&load.stop, &load.mode) {
            (Stop::Requests(n), LoadMode::Open { rate, .. }) => {
                format!("about {:.3}s: {n} requests at {rate}/s", d.as_secs_f64())
            }
            _ => format!("{} of load after warmup", show(d)),
        };
        (d, what)
    });
    if let Some((length, what)) = length
        && width > length
    {
        p.at(
            at,
            format!(
                "report.interval ({}) is longer than the run ({what})",
                show(width)
            ),
        );
        return;
    }
    let bytes = interval_memory(width, load.timeout, hops);
    if bytes <= INTERVAL_MEMORY_BUDGET {
        return;
    }
    // The shortest interval whose open intervals fit.
    let set = interval_set_bytes(load.timeout, hops);
    let sets = (INTERVAL_MEMORY_BUDGET / set - INTERVAL_SETS_BESIDES - 1.0).floor();
    let settle = 2 * load.timeout + INTERVAL_GRACE;
    let advice = if sets >= 1.0 {
        let shortest = settle.as_secs_f64() / sets;
        // Rounded up to a whole millisecond that fits (past float error).
        let mut ms = (shortest * 1e3).ceil() as u64;
        while interval_memory(Duration::from_millis(ms), load.timeout, hops)
            > INTERVAL_MEMORY_BUDGET
        {
            ms += 1;
        }
        format!(
            "use an interval of at least {}",
            show(Duration::from_millis(ms))
        )
    } else {
        "lower the timeout or the number of hops".to_owned()
    };
    p.at(
        at,
        format!(
            "report.interval = {} with timeout {} and {hops} hops keeps up to {:.0} MiB of \
             interval histograms (at most {:.0} MiB); {advice}",
            show(width),
            show(load.timeout),
            bytes / f64::from(1u32 << 20),
            INTERVAL_MEMORY_BUDGET / f64::from(1u32 << 20),
        ),
    );
}

/// Bytes of latency histograms a variant's intervals hold at most, about:
/// every interval a request may still land in (the timeout,
/// [`INTERVAL_GRACE`] and, for a late generator, up to the timeout again
/// past its start) and the sets held besides, each an end-to-end histogram
/// and one per hop (`u32` counts, 3 significant digits, grown to the
/// timeout's value in µs).
fn interval_memory(width: Duration, timeout: Duration, hops: usize) -> f64 {
    let settle = 2 * timeout + INTERVAL_GRACE;
    let open = (settle.as_secs_f64() / width.as_secs_f64().max(1e-9)).ceil() + 1.0;
    (open + INTERVAL_SETS_BESIDES) * interval_set_bytes(timeout, hops)
}

/// Bytes of one interval's histograms: end to end and one per hop.
fn interval_set_bytes(timeout: Duration, hops: usize) -> f64 {
    let settle = timeout + INTERVAL_GRACE;
    let max_us = u64::try_from(settle.as_micros()).unwrap_or(u64::MAX).max(2);
    let counts =
        hdrhistogram::Histogram::<u32>::new_with_max(max_us, 3).map_or(0, |h| h.distinct_values());
    (hops as f64 + 1.0) * counts as f64 * 4.0
}

fn telemetry(s: &Section<'_>, p: &mut Problems) -> Option<Telemetry> {
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
    Some(Telemetry {
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

/// Which hops a hop calls, as read.
enum Downstream<'a> {
    /// Not given: the next hop in file order.
    Chain,
    /// Given: the names and where each is written.
    Names(Vec<(&'a str, &'a Span)>),
    /// Given but unreadable (reported).
    Invalid,
}

/// One `[[hop]]` as read, before the mesh-wide checks.
struct HopDraft<'a> {
    header: &'a Span,
    /// The name as written, even if it is not a valid label.
    raw_name: Option<&'a str>,
    hop: Option<Hop>,
    downstream: Downstream<'a>,
}

fn hops(top: &Section<'_>, p: &mut Problems) -> Option<Vec<Hop>> {
    let Some(entry) = top.get("hop") else {
        p.at(0, "missing [[hop]]: a scenario needs at least one hop");
        return None;
    };
    let tables: Vec<(&Node, &Table)> = match &entry.node.value {
        Value::Array(items) => {
            let mut tables = Vec::new();
            for item in items {
                match &item.value {
                    Value::Table(t) => tables.push((item, t)),
                    other => p.at(
                        item.span.start,
                        format!("expected a table for each [[hop]], got {}", other.kind()),
                    ),
                }
            }
            tables
        }
        _ => {
            top.wrong_type(p, entry, "an array of tables ([[hop]])");
            return None;
        }
    };
    if tables.is_empty() {
        p.at(entry.node.span.start, "a scenario needs at least one hop");
        return None;
    }
    if let Some((extra, _)) = tables.get(MAX_HOPS) {
        p.at(
            extra.span.start,
            format!(
                "too many hops: {} (at most {MAX_HOPS}); this is hop number {}",
                tables.len(),
                MAX_HOPS + 1
            ),
        );
    }

    let drafts: Vec<HopDraft<'_>> = tables
        .iter()
        .enumerate()
        .map(|(index, (node, table))| hop(index, node, table, p))
        .collect();
    let downstream = mesh(&drafts, p);

    let mut hops = Vec::with_capacity(drafts.len());
    for (draft, downstream) in drafts.into_iter().zip(downstream?) {
        let mut hop = draft.hop?;
        hop.downstream = downstream;
        hops.push(hop);
    }
    (hops.len() <= MAX_HOPS).then_some(hops)
}

/// One `[[hop]]` read in steps: its own keys (serving, calling, faults),
/// its sections, then its downstream names; the mesh-wide checks come
/// after every hop is read ([`mesh`]).
fn hop<'a>(index: usize, node: &'a Node, table: &'a Table, p: &mut Problems) -> HopDraft<'a> {
    let raw_name = match table.get("name").map(|e| &e.node.value) {
        Some(Value::String(name)) => Some(name.as_str()),
        _ => None,
    };
    let s = hop_section(index, node, table, raw_name);
    s.unknown_keys(p, HOP_KEYS);

    let name = hop_name(&s, p);
    let serving = serving(&s, p);
    let balance = balance(&s, p);
    let connection = connection(&s, index, p);
    let endpoints = super::endpoints::endpoint_options(&s, serving.transport, p);
    let kill = match table_section(&s, p, "kill") {
        None => Some(None),
        Some(section) => section
            .and_then(|k| super::endpoints::kill(&k, serving.replicas, p))
            .map(Some),
    };
    let service = hop_service(&s, serving.replicas, p);
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
            kill: kill?,
            service: service?,
        })
    })();
    HopDraft {
        header: &node.span,
        raw_name,
        hop,
        downstream,
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

fn connection(s: &Section<'_>, index: usize, p: &mut Problems) -> Option<Connection> {
    match s.get("connection") {
        None => Some(Connection::Shared),
        // The load generator calls the entry hop: its connections are
        // [load]'s.
        Some(_) if index == 0 => {
            s.forbid(
                p,
                "connection",
                "is not for the entry hop, whose caller is the load generator: set \
                 load.connection instead",
            );
            None
        }
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
            .and_then(|w| super::service::service(&w, replicas, p))
            .map(Some),
    };
    if service
        .as_ref()
        .is_some_and(|s| s.as_ref().is_some_and(|s| s.direct))
    {
        super::service::refuse_beside_direct(s, p);
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
    let net = match table_section(s, p, "net") {
        None => Some(None),
        Some(section) => section
            .and_then(|w| {
                w.unknown_keys(p, NET_KEYS);
                net_fault(&w, p)
            })
            .map(Some),
    };
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

fn downstream<'a>(s: &Section<'a>, p: &mut Problems) -> Downstream<'a> {
    let Some(entry) = s.get("downstream") else {
        return Downstream::Chain;
    };
    match &entry.node.value {
        Value::Array(items) => {
            let mut names = Vec::new();
            let mut ok = true;
            for item in items {
                match &item.value {
                    Value::String(name) => names.push((name.as_str(), &item.span)),
                    other => {
                        ok = false;
                        s.report(
                            p,
                            &item.span,
                            format!(
                                "expected hop names (strings) in downstream, got {}",
                                other.kind()
                            ),
                        );
                    }
                }
            }
            if ok {
                Downstream::Names(names)
            } else {
                Downstream::Invalid
            }
        }
        _ => {
            s.wrong_type(p, entry, "an array of hop names");
            Downstream::Invalid
        }
    }
}

fn work(s: &Section<'_>, p: &mut Problems) -> Option<Work> {
    let kind = s.required(p, "kind", |s, p, k| {
        s.choice(p, k, &[("none", 0), ("sleep", 1), ("cpu", 2)])
    });
    match kind {
        Some(0) => {
            s.unknown_keys(p, &["kind"]);
            Some(Work::None)
        }
        Some(1) => {
            let mut known = vec!["kind"];
            known.extend_from_slice(DIST_KEYS);
            s.unknown_keys(p, &known);
            dist(s, p).map(|dist| Work::Sleep { dist })
        }
        Some(2) => {
            s.unknown_keys(p, &["kind", "rounds", "min_rounds", "max_rounds", "block"]);
            cpu(s, p)
        }
        _ => {
            let mut known = vec!["kind", "rounds", "min_rounds", "max_rounds", "block"];
            known.extend_from_slice(DIST_KEYS);
            s.unknown_keys(p, &known);
            None
        }
    }
}

fn cpu(s: &Section<'_>, p: &mut Problems) -> Option<Work> {
    let rounds = match (s.get("rounds"), s.get("min_rounds"), s.get("max_rounds")) {
        (Some(_), None, None) => s.int_in(p, "rounds", 0, MAX_ROUNDS).map(|r| (r, r)),
        (None, Some(_), Some(_)) => {
            let min = s.int_in(p, "min_rounds", 0, MAX_ROUNDS);
            let max = s.int_in(p, "max_rounds", 0, MAX_ROUNDS);
            match (min, max) {
                (Some(min), Some(max)) if min > max => {
                    if let Some(entry) = s.get("min_rounds") {
                        s.report(
                            p,
                            &entry.node.span,
                            format!(
                                "{} ({min}) must not exceed {} ({max})",
                                s.name("min_rounds"),
                                s.name("max_rounds")
                            ),
                        );
                    }
                    None
                }
                (min, max) => min.zip(max),
            }
        }
        (None, None, None) => {
            p.at(
                s.span.start,
                format!(
                    "{} needs either \"rounds\" or both \"min_rounds\" and \"max_rounds\"",
                    s.label
                ),
            );
            None
        }
        (None, Some(_), None) => {
            s.missing(p, "max_rounds");
            None
        }
        (None, None, Some(_)) => {
            s.missing(p, "min_rounds");
            None
        }
        (rounds, min, max) => {
            let at = rounds
                .or(min)
                .or(max)
                .map_or(s.span.start, |e| e.key_span.start);
            p.at(
                at,
                format!(
                    "{} needs either \"rounds\" or both \"min_rounds\" and \"max_rounds\", not a mix",
                    s.label
                ),
            );
            None
        }
    };
    let block = match s.get("block") {
        None => Some(102_400),
        Some(_) => s.int_in(p, "block", 1, 16_777_216),
    };
    let (min, max) = rounds?;
    Some(Work::Cpu {
        min_rounds: u32::try_from(min).ok()?,
        max_rounds: u32::try_from(max).ok()?,
        block_bytes: usize::try_from(block?).ok()?,
    })
}

/// The distribution fields of `s` (sleep work, or a table `slow.extra`).
fn dist(s: &Section<'_>, p: &mut Problems) -> Option<DurationDist> {
    let kind = match s.get("dist") {
        None => Some("fixed"),
        Some(_) => s.choice(
            p,
            "dist",
            &[
                ("fixed", "fixed"),
                ("uniform", "uniform"),
                ("exp", "exp"),
                ("lognormal", "lognormal"),
            ],
        ),
    }?;
    let own: &[&str] = match kind {
        "fixed" => &["value"],
        "uniform" => &["min", "max"],
        "exp" => &["mean"],
        _ => &["mean", "sigma"],
    };
    for field in ["value", "min", "max", "mean", "sigma"] {
        if !own.contains(&field) {
            s.forbid(p, field, &format!("is not used by dist = \"{kind}\""));
        }
    }
    let need = |p: &mut Problems, key: &str| {
        s.required(p, key, |s, p, k| s.duration(p, k).map(|(d, _)| d))
    };
    let positive =
        |p: &mut Problems, key: &str| s.required(p, key, |s, p, k| s.positive_duration(p, k));
    match kind {
        "fixed" => need(p, "value").map(|value| DurationDist::Fixed { value }),
        "uniform" => {
            let min = need(p, "min");
            let max = need(p, "max");
            let (min, max) = min.zip(max)?;
            if min > max {
                if let Some(entry) = s.get("min") {
                    s.report(
                        p,
                        &entry.node.span,
                        format!(
                            "{} ({}) must not exceed {} ({})",
                            s.name("min"),
                            humantime::format_duration(min),
                            s.name("max"),
                            humantime::format_duration(max)
                        ),
                    );
                }
                return None;
            }
            Some(DurationDist::Uniform { min, max })
        }
        "exp" => positive(p, "mean").map(|mean| DurationDist::Exp { mean }),
        _ => {
            let mean = positive(p, "mean");
            let sigma = s.required(p, "sigma", |s, p, k| s.number_in(p, k, 0.0, true, 10.0));
            let (mean, sigma) = mean.zip(sigma)?;
            Some(DurationDist::Lognormal { mean, sigma })
        }
    }
}

/// `client = { timeout, retries, retry_budget, hedge_after | hedge_percentile }`.
fn client_policy(s: &Section<'_>, p: &mut Problems) -> Option<ClientPolicy> {
    s.unknown_keys(
        p,
        &[
            "timeout",
            "retries",
            "retry_budget",
            "hedge_after",
            "hedge_percentile",
        ],
    );
    let timeout = match s.get("timeout") {
        None => Some(None),
        Some(_) => s.positive_duration(p, "timeout").map(Some),
    };
    let retries = match s.get("retries") {
        None => Some(0),
        Some(_) => s
            .int_in(p, "retries", 0, 10)
            .and_then(|r| u32::try_from(r).ok()),
    };
    let retry_budget = match s.get("retry_budget") {
        None => Some(if retries.unwrap_or(0) > 0 { 0.1 } else { 0.0 }),
        Some(_) => s.number_in(p, "retry_budget", 0.0, false, 10.0),
    };
    let hedge = match (s.get("hedge_after"), s.get("hedge_percentile")) {
        (Some(_), Some(_)) => {
            s.forbid(
                p,
                "hedge_percentile",
                "cannot go with hedge_after: choose one",
            );
            None
        }
        (Some(_), None) => s
            .positive_duration(p, "hedge_after")
            .map(|d| Some(Hedge::After(d))),
        (None, Some(_)) => s
            .number_in(p, "hedge_percentile", 0.0, true, 100.0)
            .map(|q| Some(Hedge::Percentile(q))),
        (None, None) => Some(None),
    };
    if let (Some(Some(t)), Some(Some(Hedge::After(h)))) = (timeout, hedge)
        && h >= t
    {
        s.forbid(
            p,
            "hedge_after",
            &format!(
                "({}) must be shorter than the timeout ({}): the hedge would never be sent",
                humantime::format_duration(h),
                humantime::format_duration(t)
            ),
        );
        return None;
    }
    Some(ClientPolicy {
        timeout: timeout?,
        retries: retries?,
        retry_budget: retry_budget?,
        hedge: hedge?,
    })
}

fn slowness(s: &Section<'_>, p: &mut Problems) -> Option<(Slowness, Window)> {
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

fn replica_slow(
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
fn net_fault(s: &Section<'_>, p: &mut Problems) -> Option<NetFault> {
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

/// How long the measured load lasts, when it is known before the run: its
/// duration, or `requests / rate` for an open loop.
fn load_length(load: &Load) -> Option<Duration> {
    match (load.stop, &load.mode) {
        (Stop::Duration(d), _) => Some(d),
        (Stop::Requests(n), LoadMode::Open { rate, .. }) => {
            Duration::try_from_secs_f64(n as f64 / rate).ok()
        }
        (Stop::Requests(_), LoadMode::Closed { .. }) => None,
    }
}

/// Every fault window starts before the end of the load and ends at it at
/// the latest; each problem is reported at the window's key.
fn windows_within_the_load(top: &Section<'_>, hops: &[Hop], load: &Load, p: &mut Problems) {
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
    super::endpoints::kills_within_the_load(&tables, hops, length, p);
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
fn replica_nets(
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

fn error_injection(s: &Section<'_>, p: &mut Problems) -> Option<(ErrorInjection, Window)> {
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

/// Mesh-wide checks of `downstream`: unknown names, self calls, cycles and
/// hops never called. Returns each hop's downstream names when all is well.
fn mesh(drafts: &[HopDraft<'_>], p: &mut Problems) -> Option<Vec<Vec<String>>> {
    let mut ok = true;
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, draft) in drafts.iter().enumerate() {
        let Some(name) = draft.raw_name else {
            ok = false;
            continue;
        };
        if let Some(&first) = index.get(name) {
            ok = false;
            p.at(
                draft.header.start,
                format!("duplicate hop name \"{name}\" (also used by the hop at index {first})"),
            );
        } else {
            index.insert(name, i);
        }
    }

    // Edges, each with the place that declares it. A file without any
    // `downstream` is a chain in file order; once one hop names its
    // downstream hops the file describes a tree, and a hop without the key
    // is a leaf (so a fan-out's leaves need not say `downstream = []`).
    let tree = drafts
        .iter()
        .any(|d| !matches!(d.downstream, Downstream::Chain));
    let mut edges: Vec<Vec<(usize, &Span)>> = vec![Vec::new(); drafts.len()];
    for (i, draft) in drafts.iter().enumerate() {
        let who = draft.raw_name.map_or_else(
            || format!("the hop at index {i}"),
            |n| format!("hop \"{n}\""),
        );
        match &draft.downstream {
            Downstream::Chain => {
                if !tree && i + 1 < drafts.len() {
                    edges[i].push((i + 1, draft.header));
                }
            }
            Downstream::Invalid => ok = false,
            Downstream::Names(names) => {
                for (k, (name, span)) in names.iter().enumerate() {
                    if names[..k].iter().any(|(earlier, _)| earlier == name) {
                        ok = false;
                        p.at(
                            span.start,
                            format!("downstream \"{name}\" of {who} is listed twice"),
                        );
                    } else if Some(*name) == draft.raw_name {
                        ok = false;
                        p.at(span.start, format!("{who} lists itself in downstream"));
                    } else if let Some(&j) = index.get(name) {
                        edges[i].push((j, span));
                    } else {
                        ok = false;
                        p.at(
                            span.start,
                            format!("downstream \"{name}\" of {who} does not exist"),
                        );
                    }
                }
            }
        }
    }

    for (draft, out) in drafts.iter().zip(&edges) {
        let direct = draft
            .hop
            .as_ref()
            .and_then(|h| h.service.as_ref())
            .is_some_and(|s| s.direct);
        if direct && !out.is_empty() {
            ok = false;
            p.at(
                draft.header.start,
                format!(
                    "hop \"{}\" has service.direct = true, so it must be a leaf: its callers \
                     call the service itself and no tailmesh hop is there to call downstream \
                     hops (make it the last hop, or set downstream = [], or drop direct)",
                    draft.raw_name.unwrap_or_default()
                ),
            );
        }
    }
    if !cycles(drafts, &edges, p) {
        ok = false;
    }
    if ok {
        // The entry hop is the only one the load generator calls.
        let mut reached = vec![false; drafts.len()];
        let mut todo = vec![0];
        while let Some(i) = todo.pop() {
            if std::mem::replace(&mut reached[i], true) {
                continue;
            }
            todo.extend(edges[i].iter().map(|(j, _)| *j));
        }
        let entry = drafts[0].raw_name.unwrap_or_default();
        for (draft, reached) in drafts.iter().zip(&reached) {
            if !reached {
                ok = false;
                p.at(
                    draft.header.start,
                    format!(
                        "hop \"{}\" is never called: it is not reachable from the entry hop \"{entry}\"",
                        draft.raw_name.unwrap_or_default()
                    ),
                );
            }
        }
    }
    ok.then(|| {
        edges
            .iter()
            .map(|out| {
                out.iter()
                    .map(|(j, _)| drafts[*j].raw_name.unwrap_or_default().to_owned())
                    .collect()
            })
            .collect()
    })
}

/// Reports each cycle once, at the edge that closes it; true if none.
fn cycles(drafts: &[HopDraft<'_>], edges: &[Vec<(usize, &Span)>], p: &mut Problems) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let mut mark = vec![Mark::New; drafts.len()];
    let mut acyclic = true;
    let name = |i: usize| {
        drafts[i]
            .raw_name
            .map_or_else(|| format!("hop at index {i}"), |n| format!("\"{n}\""))
    };
    for start in 0..drafts.len() {
        if mark[start] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (hop, next edge to follow).
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = Mark::OnPath;
        while let Some(top) = path.last_mut() {
            let (i, next) = *top;
            top.1 += 1;
            let Some(&(j, span)) = edges[i].get(next) else {
                mark[i] = Mark::Done;
                path.pop();
                continue;
            };
            match mark[j] {
                Mark::New => {
                    mark[j] = Mark::OnPath;
                    path.push((j, 0));
                }
                Mark::OnPath => {
                    acyclic = false;
                    let from = path.iter().position(|(k, _)| *k == j).unwrap_or(0);
                    let mut names: Vec<String> =
                        path[from..].iter().map(|(k, _)| name(*k)).collect();
                    names.push(name(j));
                    p.at(
                        span.start,
                        format!("downstream cycle: {}", names.join(" -> ")),
                    );
                }
                Mark::Done => {}
            }
        }
    }
    acyclic
}
