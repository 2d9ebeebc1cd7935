//! The checked scenario: what the rest of the orchestrator and the analysis
//! trust. Built only by the orchestrator's parser (`tailmesh::scenario::parse`),
//! after every problem in the file has been reported; plain data, so the
//! analysis reads it without the parser.

use std::time::Duration;

use crate::calls::Calls;
use crate::discipline::Discipline;
pub use crate::policy::{ClientPolicy, Hedge};
use crate::{
    Balance, BrokerKind, Connection, EndpointOptions, ErrorInjection, HopBehavior, QueueBounds,
    ReplicaSlow, ServiceCall, Slowness, TlsMode, Transport, Work,
};

/// Most hops a scenario may declare.
pub const MAX_HOPS: usize = 256;

/// The share of a variant's requests that may fail when the file has no
/// `[check].max_error_rate`: a few failures pass, a broken mesh does not.
pub const DEFAULT_MAX_ERROR_RATE: f64 = 0.01;

/// How far a composed quantile may miss the measured one and still pass
/// `[check] distribution` when the file does not say: 10 %.
pub const DEFAULT_DISTRIBUTION_TOLERANCE: f64 = 0.10;

/// A whole experiment: one or more variants of the same mesh, run one after
/// another and compared side by side.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Name, also the results folder: `results/<name>/<run-id>/`.
    pub name: String,
    /// Free text shown in reports.
    pub description: String,
    /// Seed of every random draw (arrivals, work, faults, balancing).
    pub seed: u64,
    /// The variants, in file order. Without `[[variant]]` there is exactly
    /// one, named "base", with no overrides.
    pub variants: Vec<Variant>,
    /// What the run checks.
    pub check: Check,
    /// How results are shown.
    pub report: Report,
    /// The swept parameter, when the scenario sweeps one.
    pub sweep: Option<Sweep>,
    /// Traces: sampling and forwarding.
    pub telemetry: Telemetry,
}

/// How requests are traced.
#[derive(Clone, Debug, PartialEq)]
pub struct Telemetry {
    /// The share of requests traced, 0.0 (tracing off) to 1.0 (head
    /// sampling: decided when the request is sent).
    pub sampling: f64,
    /// An OTLP gRPC endpoint every span is also sent to (e.g. Jaeger).
    pub forward: Option<String>,
    /// Which traced requests' traces go into the Jaeger file (tail
    /// sampling: decided when the request ends).
    pub keep: Keep,
    /// The most spans each process holds while it waits for the keep
    /// decisions (when not every trace is kept).
    pub hold_spans: usize,
    /// Where the orchestrator serves live Prometheus metrics while the run
    /// lasts (`host:port`; `tailmesh run --metrics` overrides it).
    pub metrics: Option<String>,
    /// How long the metrics stay up after the run, so that the last
    /// scrape sees the final counts.
    pub metrics_grace: std::time::Duration,
}

/// How long the metrics stay up after the run by default (`[telemetry]
/// metrics_grace`): a scrape every 1 s to 2 s sees the final counts.
pub const DEFAULT_METRICS_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The spans a process holds at most by default (`[telemetry]
/// hold_spans`): about 200 bytes each, 40 MB.
pub const DEFAULT_HOLD_SPANS: usize = 200_000;

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            sampling: 1.0,
            forward: None,
            keep: Keep::default(),
            hold_spans: DEFAULT_HOLD_SPANS,
            metrics: None,
            metrics_grace: DEFAULT_METRICS_GRACE,
        }
    }
}

/// The tail sampler's rule: the traces of slow, failed and retried or
/// hedged requests, plus a uniform share of the others.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Keep {
    /// Keep requests slower than `[check] slow_threshold`.
    pub slow: bool,
    /// Keep ok requests slower than this percentile (0 to 100, exclusive)
    /// of the variant's ok requests ended before them.
    pub slow_percentile: Option<f64>,
    /// Keep requests that failed (errors and timeouts).
    pub failed: bool,
    /// Keep requests with an extra attempt (retry or hedge) at any hop.
    pub retried: bool,
    /// The share of the other requests kept.
    pub share: KeepShare,
}

impl Default for Keep {
    fn default() -> Self {
        Keep {
            slow: true,
            slow_percentile: None,
            failed: true,
            retried: true,
            share: KeepShare::Auto,
        }
    }
}

/// The share of unremarkable traces kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeepShare {
    /// All of them when the run is short, less when the estimate of the
    /// run's traces would pass the Jaeger file's size (see `traces::tail`).
    Auto,
    /// This share, 0.0 to 1.0.
    Fixed(f64),
}

/// A parameter swept over a list of values: every variant runs once per
/// value (the variants are expanded, see [`Variant::sweep`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep {
    /// `"hops"` (the first n hops of the chain) or an override path such as
    /// `"hop.*.slow.probability"`.
    pub key: String,
    /// The values in file order, as TOML text.
    pub values: Vec<String>,
}

/// Where a variant sits in a sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepPoint {
    /// The declared variant it was expanded from ("base" without variants).
    pub group: String,
    /// The swept value, as TOML text.
    pub value: String,
}

/// How results are shown beyond the files every run writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Print each variant's latency histogram in the terminal.
    pub histogram: bool,
    /// The width of the latency intervals (`<variant>.hlog`, the latency
    /// over time chart), on the measured clock (from the end of warmup).
    pub interval: Duration,
}

/// How long an interval of latency histograms waits, beyond the load's
/// timeout, before it is closed (see `analysis::latency_intervals`): the
/// slack for a request's task starting a little after the next one's.
pub const INTERVAL_GRACE: Duration = Duration::from_millis(250);

/// `[report] interval` when the file does not set it.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(1);

impl Default for Report {
    fn default() -> Self {
        Report {
            histogram: false,
            interval: DEFAULT_REPORT_INTERVAL,
        }
    }
}

/// The scenario with one variant's overrides applied, validated as a whole.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    /// Variant name (unique in the scenario).
    pub name: String,
    /// The overrides as written, `key = value` with the value in TOML syntax,
    /// for the summary's scenario echo.
    pub overrides: Vec<(String, String)>,
    pub load: Load,
    /// The hops in file order; the load generator calls `hops[0]`, or
    /// `load.entries`.
    pub hops: Vec<Hop>,
    /// Which launcher runs the hops.
    pub launcher: Launcher,
    /// The broker pull hops go through.
    pub broker: BrokerKind,
    /// How many tasks and bytes each pulled hop's queue holds (`[broker]`
    /// `queue_capacity` and `queue_bytes`), whichever the broker.
    pub queue_bounds: QueueBounds,
    /// `[mesh]`: TLS on the links.
    pub mesh: Mesh,
    /// Its place in the scenario's sweep, if any.
    pub sweep: Option<SweepPoint>,
}

/// `[mesh]`: how the mesh's links are secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// Plaintext, TLS, or mutual TLS on every link.
    pub tls: TlsMode,
    /// Whether clients resume TLS sessions; off, every new connection is
    /// a full handshake.
    pub tls_resumption: bool,
}

impl Default for Mesh {
    fn default() -> Self {
        Mesh {
            tls: TlsMode::Off,
            tls_resumption: true,
        }
    }
}

/// Which launcher runs the hop processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Processes on 127.0.0.1 with ephemeral ports.
    Local,
    /// A network namespace and address per replica on a bridge; needs root
    /// or CAP_NET_ADMIN. The only launcher that applies network faults.
    Netns,
    /// Netns when the variant has network faults and the process has the
    /// privilege, local otherwise (decided when the run starts).
    Auto,
}

impl Hop {
    /// Its calls: `calls`, or every hop of `downstream` once, side by side,
    /// when `calls` is empty (a hop built by hand, not by the parser).
    pub fn call_plan(&self) -> Calls {
        if self.calls.is_empty() {
            Calls::all_once(self.downstream.iter().cloned())
        } else {
            self.calls.clone()
        }
    }
}

impl Variant {
    /// Whether every request takes the same path: the load generator calls
    /// the first hop, and every hop calls each of its downstream hops once,
    /// side by side, on every request.
    pub fn fixed_paths(&self) -> bool {
        self.entries() == [(0, 1.0)] && self.hops.iter().all(|h| h.calls.is_fixed())
    }

    /// The hops the load generator calls, by their place in `hops`, each
    /// with its share of the requests (`[load] entries`; the first hop
    /// when there are none).
    pub fn entries(&self) -> Vec<(usize, f64)> {
        self.load.entry_hops(&self.hops)
    }

    /// The most hop visits one request can make (its reply's path records
    /// at most): counts multiplied down the tree at their largest, from
    /// the entry that reaches the most.
    pub fn most_visits(&self) -> u64 {
        let calls = |j: usize| &self.hops[j].calls;
        let index = |name: &str| self.hops.iter().position(|h| h.name == name);
        let mut memo = vec![None; self.hops.len()];
        self.entries()
            .into_iter()
            .map(|(i, _)| crate::calls::most_visits(i, &calls, &index, &mut memo))
            .max()
            .unwrap_or(0)
    }

    /// Whether any hop of the variant has a network fault (`net` or
    /// `replica_net`), or the load generators' links (`[load] net` or
    /// `generator_net`): these need a network-capable launcher.
    pub fn has_net_faults(&self) -> bool {
        self.load.has_net_faults() || self.hops.iter().any(Hop::has_net_faults)
    }
}

/// Packet-level trouble on a replica's interface, applied by the replica's
/// fault agent inside its own network namespace. Loss, delay and jitter act
/// on every packet in each direction: a request that needs several packet
/// crossings is delayed several times.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NetFault {
    /// Probability that a packet is dropped, in [0, 1].
    pub loss: f64,
    /// Added to every packet.
    pub delay: Duration,
    /// Each packet's delay is drawn uniformly from `delay ± jitter`
    /// (`jitter <= delay`).
    pub jitter: Duration,
    /// When the fault starts on the measured clock: from the end of warmup,
    /// the clock of requests.csv (a fault at 0 covers warmup too).
    pub start: Duration,
    /// How long it lasts; `None`: until the run ends.
    pub duration: Option<Duration>,
}

impl NetFault {
    /// When the fault is in force.
    pub fn window(&self) -> Window {
        Window {
            start: self.start,
            duration: self.duration,
        }
    }

    /// Whether the fault changes anything at all (zero means zero).
    pub fn is_active(&self) -> bool {
        self.loss > 0.0 || !self.delay.is_zero()
    }
}

/// A network fault on one replica only.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaNet {
    /// The replica, 0-based.
    pub replica: u32,
    /// Its fault (replaces the hop's `net` for that replica).
    pub fault: NetFault,
}

/// A network fault on one load generator's link only
/// (`[load] generator_net`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GeneratorNet {
    /// The generator, 0-based (below `[load] generators`).
    pub generator: u32,
    /// Its fault (replaces `[load] net` for that generator).
    pub fault: NetFault,
}

/// The load generator's settings.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Load {
    /// Open or closed loop.
    pub mode: LoadMode,
    /// When the measured phase ends.
    pub stop: Stop,
    /// A period before measurement whose requests are sent but not counted.
    pub warmup: Duration,
    /// Per-request deadline, sent as `grpc-timeout` and propagated hop to hop.
    pub timeout: Duration,
    /// Shared channels or a new connection per request.
    pub connection: ConnectionMode,
    /// Request payload size in bytes.
    pub payload_bytes: usize,
    /// The hops the load generator sends requests to, each with its share
    /// of the requests, one drawn per request (seeded by its id). Empty:
    /// the first hop, every request.
    pub entries: Vec<Entry>,
    /// Load generator processes sharing the load (`[load] generators`):
    /// 1 runs it inside the orchestrator, unless its link has a fault.
    pub generators: u32,
    /// A network fault on every generator's link (`[load] net`): each
    /// generator then runs as a process in a namespace of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetFault>,
    /// Faults on single generators' links, each replacing `net` for its
    /// generator (`[load] generator_net`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generator_net: Vec<GeneratorNet>,
    /// `[load.streams]`: the load sent as messages on streams to a
    /// streaming entry, instead of one call per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<StreamLoad>,
}

/// `[load.streams]`: an open loop's messages sent on streams. Each of
/// `streams` slots keeps one stream open at a time, its `messages` due on
/// a fixed schedule (the slot's share of `[load] rate`, evenly spaced); a
/// stream whose messages are all due ends, and the next one opens in its
/// slot when its first message is due. A message is sent at its due time,
/// or at once when late (never skipped), and timed from its due time.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StreamLoad {
    /// Streams open at once.
    pub streams: u32,
    /// Messages per stream.
    pub messages: u32,
    /// Most messages of one stream awaiting their answers: a message due
    /// while its stream has this many is not sent, and counted as refused
    /// by the cap (RESOURCE_EXHAUSTED). Bidi streams only.
    pub in_flight: u32,
    /// The entry hops' kind of stream: bidi, server (one request, the
    /// hop sends the messages at their times) or client (no message
    /// answered until the stream's end).
    #[serde(default = "bidi")]
    pub kind: Streaming,
}

fn bidi() -> Streaming {
    Streaming::Bidi
}

/// How a hop's callers reach it when they serve a stream themselves.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Streaming {
    /// One call per request or message.
    #[default]
    Unary,
    /// A bidirectional stream (`Hop.Stream`) per caller's stream: each
    /// message answered by one reply, in order.
    Bidi,
    /// A server stream (`Hop.ServerStream`) per caller's stream: one
    /// request, and the stream's messages sent by the last streaming hop
    /// at their times, relayed by the hops before it.
    Server,
    /// A client stream (`Hop.ClientStream`) per caller's stream: the
    /// messages go down one after another, none answered on its own; the
    /// stream's one reply, at its end, answers them all.
    Client,
}

/// An entry of the mesh (`[load] entries`): a hop the load generator
/// calls, and its share of the requests.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub hop: String,
    /// In (0, 1]; a load's shares sum to 1.
    pub share: f64,
}

impl Load {
    /// Whether each request can be traced: not a server stream's
    /// messages, which the hops send on their own, with no trace context
    /// of the request's, nor a client stream's, whose messages have no
    /// answers of their own to end their spans.
    pub fn traces_requests(&self) -> bool {
        self.streams
            .as_ref()
            .is_none_or(|s| !matches!(s.kind, Streaming::Server | Streaming::Client))
    }

    /// Whether a generator's link has a network fault.
    pub fn has_net_faults(&self) -> bool {
        self.net.is_some() || !self.generator_net.is_empty()
    }

    /// The network fault on generator `generator`'s link, if any.
    pub fn net_of(&self, generator: u32) -> Option<&NetFault> {
        self.generator_net
            .iter()
            .find(|g| g.generator == generator)
            .map(|g| &g.fault)
            .or(self.net.as_ref())
    }

    /// The entries by their place in `hops`, each with its share (the
    /// first hop when there are none).
    pub fn entry_hops(&self, hops: &[Hop]) -> Vec<(usize, f64)> {
        if self.entries.is_empty() {
            return if hops.is_empty() {
                Vec::new()
            } else {
                vec![(0, 1.0)]
            };
        }
        self.entries
            .iter()
            .filter_map(|e| Some((hops.iter().position(|h| h.name == e.hop)?, e.share)))
            .collect()
    }

    /// An open loop's load steps (empty: one rate throughout, or a closed
    /// loop).
    pub fn steps(&self) -> &[Step] {
        match &self.mode {
            LoadMode::Open { steps, .. } => steps,
            LoadMode::Closed { .. } => &[],
        }
    }

    /// The requests the load is meant to send after warmup: the count
    /// asked for, or an open loop's rate (each step's) times its duration.
    /// `None` for a closed loop that stops by time.
    pub fn planned_requests(&self) -> Option<f64> {
        match (&self.stop, &self.mode) {
            (Stop::Requests(n), _) => Some(*n as f64),
            (Stop::Duration(d), LoadMode::Open { rate, steps, .. }) if steps.is_empty() => {
                Some(rate * d.as_secs_f64())
            }
            (Stop::Duration(_), LoadMode::Open { steps, .. }) => Some(
                steps
                    .iter()
                    .map(|s| s.rate * s.duration.as_secs_f64())
                    .sum(),
            ),
            (Stop::Duration(_), LoadMode::Closed { .. }) => None,
        }
    }
}

/// Open loop (fixed rate) or closed loop (fixed number in flight).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum LoadMode {
    /// Requests at `rate` per second; latency is measured from each request's
    /// intended send time, so a stalled system cannot hide its stall.
    Open {
        /// Requests per second, > 0.
        rate: f64,
        /// Spacing of send times.
        arrivals: Arrivals,
        /// Load steps, in order (`[load] steps`): each its own rate for
        /// its own duration, and each a phase of the results. Empty: `rate`
        /// for the whole run. With steps, `rate` is the first step's (the
        /// warmup's) and the run lasts their total duration.
        steps: Vec<Step>,
    },
    /// `concurrency` requests in flight at all times.
    Closed {
        /// Requests in flight, >= 1.
        concurrency: u32,
    },
}

/// One load step: `rate` requests per second for `duration`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// Requests per second, > 0.
    pub rate: f64,
    /// How long, > 0.
    pub duration: Duration,
}

/// An open loop's rate for people: `400`, or its steps' `200→400→600`.
pub fn describe_rates(rate: f64, steps: &[Step]) -> String {
    if steps.is_empty() {
        return rate.to_string();
    }
    let rates: Vec<String> = steps.iter().map(|s| s.rate.to_string()).collect();
    format!("steps {}", rates.join("→"))
}

/// "open loop, 400/s poisson, 20s (+2s warmup)" and the like.
pub fn describe_load(load: &Load) -> String {
    let mode = match &load.mode {
        LoadMode::Open {
            rate,
            arrivals,
            steps,
        } => format!(
            "open loop, {}/s {}",
            describe_rates(*rate, steps),
            format!("{arrivals:?}").to_lowercase()
        ),
        LoadMode::Closed { concurrency } => format!("closed loop, {concurrency} in flight"),
    };
    let stop = match load.stop {
        Stop::Duration(d) => humantime::format_duration(d).to_string(),
        Stop::Requests(n) => format!("{n} requests"),
    };
    if load.warmup.is_zero() {
        format!("{mode}, {stop}")
    } else {
        format!(
            "{mode}, {stop} (+{} warmup)",
            humantime::format_duration(load.warmup)
        )
    }
}

/// Spacing of open-loop send times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Arrivals {
    /// Exactly 1/rate apart.
    Uniform,
    /// Exponential gaps with mean 1/rate (seeded).
    Poisson,
}

/// When the measured phase ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Stop {
    /// After this long (after warmup).
    Duration(Duration),
    /// After this many measured requests have been sent.
    Requests(u64),
}

/// How the load generator connects to the first hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConnectionMode {
    /// Long-lived channels, `connections` per replica, shared by all requests.
    Shared {
        /// HTTP/2 connections per replica, >= 1.
        connections: u32,
    },
    /// A new connection for every request, closed after it.
    PerRequest,
}

/// One hop of the mesh.
#[derive(Clone, Debug, PartialEq)]
pub struct Hop {
    /// Unique name, a DNS label (lowercase letters, digits, '-').
    pub name: String,
    /// Replicas, 1..=64.
    pub replicas: u32,
    /// Requests one replica works on at once (its own work and injected
    /// slowness; downstream calls do not hold a slot). Others wait: in the
    /// replica (push) or in the broker (pull, where it is the worker's
    /// credit). `None`: push replicas take everything at once, pull workers
    /// take one task at a time (back-to-back's default).
    pub concurrency: Option<u32>,
    /// With `concurrency`, the most requests that may wait for a slot at
    /// one push replica; more are refused with RESOURCE_EXHAUSTED at once.
    /// Default [`DEFAULT_QUEUE_LIMIT`](crate::DEFAULT_QUEUE_LIMIT);
    /// unused without `concurrency` and by pull hops (the broker queues).
    pub queue_limit: u32,
    /// The order waiting requests are served in: at a push replica's line
    /// for a slot, or in the hop's broker topic (pull).
    pub discipline: Discipline,
    /// How callers reach this hop.
    pub transport: Transport,
    /// Pull only: after this long without a frame from the broker, each
    /// worker sends an HTTP/2 PING on its stream: a short interval is a
    /// loss probe (see `WorkerOptions::ping_after` in tailmesh-services).
    /// `None`: the keepalive default (5 s).
    pub worker_ping: Option<Duration>,
    /// How push callers pick a replica of this hop.
    pub balance: Balance,
    /// How the hops that call this one hold their connections to it: a
    /// long-lived one, or a new connection (push) or broker client (pull)
    /// per call. Never set on the entry hop, whose caller is the load
    /// generator (`load.connection`).
    pub connection: Connection,
    /// How push callers treat this hop's replicas' endpoints: health,
    /// keepalive, ewma's parameters, outlier ejection.
    pub endpoints: EndpointOptions,
    /// The work model.
    pub work: Work,
    /// Injected per-request slowness.
    pub slow: Option<Slowness>,
    /// One slow replica.
    pub replica_slow: Option<ReplicaSlow>,
    /// Injected errors.
    pub error: Option<ErrorInjection>,
    /// When `slow`, `replica_slow` and `error` are in force.
    pub windows: AppWindows,
    /// How callers reach this hop: per-attempt timeout, budgeted retries,
    /// hedged requests (applied by every caller, the load generator too).
    pub client: ClientPolicy,
    /// A network fault on every replica of the hop.
    pub net: Option<NetFault>,
    /// Network faults of single replicas (each replaces `net` there).
    pub replica_net: Vec<ReplicaNet>,
    /// Names of the hops this one calls, each once, in the order first
    /// called in `calls`. Defaults to the next hop in file order (a
    /// chain); empty for a leaf.
    pub downstream: Vec<String>,
    /// How it calls them: stages, each call's probability and count.
    pub calls: Calls,
    /// A replica killed (SIGKILL) during the run, and perhaps restarted.
    pub kill: Option<Kill>,
    /// `[hop.service]`: a real gRPC service whose call is the hop's work
    /// (`work` is then [`Work::None`]).
    pub service: Option<HopService>,
    /// Whether the callers that serve a stream reach it by stream (the
    /// load generator's streams, `[load.streams]`, and streaming hops').
    pub streaming: Streaming,
}

/// `[hop.service]`: the gRPC service a hop calls as its work, where it is
/// or how it is started, and what is sent to it.
#[derive(Clone, Debug, PartialEq)]
pub struct HopService {
    /// Where the service is, or the command that starts one per replica.
    pub source: ServiceSource,
    /// The full method name, `package.Service/Method`.
    pub method: String,
    /// The request message or messages as JSON (inline TOML tables
    /// converted).
    pub request: crate::Requests,
    /// How many reply messages each call must get (`replies`); `None`: any
    /// number.
    pub replies: Option<u32>,
    /// `.proto` files that define the method, relative to `dir`; empty:
    /// the service's server reflection.
    pub proto: Vec<std::path::PathBuf>,
    /// Import paths for `proto`, relative to `dir`.
    pub proto_include: Vec<std::path::PathBuf>,
    /// Metadata sent with every call, in file order.
    pub metadata: Vec<(String, String)>,
    /// How long a service may take to become ready.
    pub ready_timeout: Duration,
    /// The container image `command` runs in when deployed (`tailmesh
    /// compose`, `tailmesh k8s`); the local launcher runs it on the host.
    pub image: Option<String>,
    /// Called directly by the hop's callers (the load generator or the hop
    /// before it), with no tailmesh hop in front of it: a leaf, for
    /// measuring a service's own latency.
    pub direct: bool,
    /// Runs tailmesh's serving layers itself (`layers = true`, which
    /// implies `direct`): the hop's slot, injected faults, span and record
    /// are the service's, configured from the hop's JSON
    /// (`TAILMESH_HOP_CONFIG`) and its Control API on the service's port.
    pub layers: bool,
    /// The folder relative paths are taken from, and where a `command`
    /// runs: the scenario file's (empty: the current folder).
    pub dir: std::path::PathBuf,
}

/// The default of `[hop.service] ready_timeout`.
pub const DEFAULT_SERVICE_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a hop's service is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceSource {
    /// Already running at `host:port` (one replica only).
    Address(String),
    /// Started by the launcher, one process per replica: the program and
    /// its arguments, where `{port}` becomes the port it must listen on.
    Command(Vec<String>),
}

impl HopService {
    /// `path` as the hop reads it: relative to [`HopService::dir`].
    pub fn resolve(&self, path: &std::path::Path) -> std::path::PathBuf {
        if path.is_absolute() || self.dir.as_os_str().is_empty() {
            path.to_path_buf()
        } else {
            self.dir.join(path)
        }
    }

    /// What a caller of the service at `address` sends it.
    pub fn call(&self, address: String) -> ServiceCall {
        ServiceCall {
            address,
            method: self.method.clone(),
            request: self.request.clone(),
            replies: self.replies,
            proto: self.proto.iter().map(|p| self.resolve(p)).collect(),
            proto_include: self.proto_include.iter().map(|p| self.resolve(p)).collect(),
            metadata: self.metadata.clone(),
            layered: self.layers,
        }
    }

    /// Where the schema comes from, for people: the `.proto` files, or
    /// `"reflection"`.
    pub fn schema_source(&self) -> String {
        if self.proto.is_empty() {
            "reflection".to_owned()
        } else {
            let files: Vec<String> = self.proto.iter().map(|p| p.display().to_string()).collect();
            format!("proto: {}", files.join(", "))
        }
    }
}

/// `kill = { replica, at, back }`: the launcher SIGKILLs the replica's
/// process at `at` on the measured clock (from the end of warmup, like a
/// fault window's `start`) and, with `back`, starts it again that long
/// later at the same address, so its callers can reconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The replica, 0-based.
    pub replica: u32,
    /// When it is killed, > 0.
    pub at: Duration,
    /// How long after the kill it is restarted; `None`: it stays dead.
    pub back: Option<Duration>,
}

impl Kill {
    /// When the replica is down, as a fault window: `[at, at + back)`.
    pub fn window(&self) -> Window {
        Window {
            start: self.at,
            duration: self.back,
        }
    }
}

impl Hop {
    /// Whether a replica's link has a network fault (`net` or
    /// `replica_net`).
    pub fn has_net_faults(&self) -> bool {
        self.net.is_some() || !self.replica_net.is_empty()
    }

    /// The network fault of `replica`, if any.
    pub fn net_of(&self, replica: u32) -> Option<&NetFault> {
        self.replica_net
            .iter()
            .find(|r| r.replica == replica)
            .map(|r| &r.fault)
            .or(self.net.as_ref())
    }

    /// The hop's behaviour as handed to its replica processes: without the
    /// faults that have a window (the fault schedule sets those at runtime
    /// through the replicas' Control services).
    pub fn behavior(&self, seed: u64) -> HopBehavior {
        let whole_run = |w: &Window| !w.is_scheduled();
        HopBehavior {
            name: self.name.clone(),
            seed,
            work: self.work.clone(),
            slow: self.slow.clone().filter(|_| whole_run(&self.windows.slow)),
            replica_slow: self
                .replica_slow
                .clone()
                .filter(|_| whole_run(&self.windows.replica_slow)),
            error: self
                .error
                .clone()
                .filter(|_| whole_run(&self.windows.error)),
        }
    }

    /// Whether one of the hop's application-level faults has a window.
    pub fn has_app_windows(&self) -> bool {
        (self.slow.is_some() && self.windows.slow.is_scheduled())
            || (self.replica_slow.is_some() && self.windows.replica_slow.is_scheduled())
            || (self.error.is_some() && self.windows.error.is_scheduled())
    }
}

/// When a fault is in force, on the measured clock (from the end of
/// warmup, the clock of requests.csv): `[start, start + duration)`. The
/// default is the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// When the fault starts.
    pub start: Duration,
    /// How long it lasts; `None`: until the run ends.
    pub duration: Option<Duration>,
}

impl Window {
    /// Whether the window is less than the whole run, so the fault is set
    /// and cleared at runtime.
    pub fn is_scheduled(&self) -> bool {
        !self.start.is_zero() || self.duration.is_some()
    }
}

/// The windows of a hop's application-level faults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppWindows {
    /// Of `slow`.
    pub slow: Window,
    /// Of `replica_slow`.
    pub replica_slow: Window,
    /// Of `error`.
    pub error: Window,
}

/// What the run checks.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// A request is slow if its end-to-end latency exceeds this.
    pub slow_threshold: Duration,
    /// Whether to compare the measured slow fraction with 1 - prod(1 - p_i).
    pub compounding: bool,
    /// The largest share of a variant's requests that may fail (errors
    /// plus timeouts over sent), in [0, 1].
    pub max_error_rate: f64,
    /// Whether to judge the measured end-to-end quantiles against the
    /// hops' segments composed as independent.
    pub distribution: bool,
    /// How far (a share of the measured value) a composed quantile may
    /// miss and still pass, when outside the intervals.
    pub distribution_tolerance: f64,
}
