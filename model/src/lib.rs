//! The behaviour of one hop as plain data: what work it does, what faults
//! it injects, how it reaches its downstream hops. The orchestrator builds
//! these from a scenario and hands them to hop processes as JSON; the
//! services run them and the analysis reads them. Plain data only (serde,
//! no runtime), so a crate that must not pull tokio in can use it;
//! `tailmesh_services::model` re-exports it whole.
//!
//! Beside a hop's behaviour, the other plain types more than one crate
//! reads:
//!
//! - `policy`: a caller's client policy (timeout, retries, hedge) and which
//!   gRPC codes are worth a retry.
//! - `calls`: how a hop calls its downstream hops (stages, probability,
//!   count).
//! - `discipline`: the order a queue serves its waiting requests in.
//! - `fault`: a network fault and its window as summary.json records them.
//! - `scenario`: the checked scenario the orchestrator's parser builds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod calls;
pub mod discipline;
pub mod fault;
pub mod policy;
pub mod scenario;

/// A distribution of durations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case")]
pub enum DurationDist {
    /// Always the same value.
    Fixed { value: Duration },
    /// Uniform between `min` and `max` (inclusive).
    Uniform {
        /// Lower bound.
        min: Duration,
        /// Upper bound.
        max: Duration,
    },
    /// Exponential with the given mean.
    Exp { mean: Duration },
    /// Log-normal with the given mean; `sigma` is the standard deviation of
    /// the underlying normal (larger means a heavier tail).
    Lognormal {
        /// Mean of the distribution (not of the underlying normal).
        mean: Duration,
        /// Shape: standard deviation of the underlying normal.
        sigma: f64,
    },
    /// Read from measured quantiles: `(q, value)` points, `q` from 0 to 1
    /// and values never falling, with the values between two points
    /// spread evenly (the quantile function drawn straight between
    /// them). Built by [`DurationDist::empirical`], which checks them.
    Empirical {
        /// The points, the first at `q` = 0 and the last at `q` = 1.
        quantiles: Vec<(f64, Duration)>,
    },
}

/// Why quantiles do not make an empirical distribution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmpiricalError {
    /// Fewer than two points.
    TooFew,
    /// A `q` outside [0, 1] or not a number (its index).
    OutOfRange(usize),
    /// No point at `q` = 0, or none at `q` = 1.
    Ends,
    /// Point `.0` has a lower `q`, or a lower value, than the one before.
    Falling(usize),
}

impl std::fmt::Display for EmpiricalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmpiricalError::TooFew => write!(f, "needs at least two quantiles"),
            EmpiricalError::OutOfRange(i) => write!(f, "quantile {} is not in [0, 1]", i + 1),
            EmpiricalError::Ends => write!(
                f,
                "needs the lowest value (quantile 0, p0) and the highest (quantile 1, p100)"
            ),
            EmpiricalError::Falling(i) => write!(
                f,
                "quantile {} is below the one before it: higher quantiles need values at least as high",
                i + 1
            ),
        }
    }
}

impl std::error::Error for EmpiricalError {}

impl DurationDist {
    /// An empirical distribution through `quantiles`, sorted by `q` (ties
    /// keep their order): each `q` in [0, 1], one at 0 and one at 1,
    /// values never falling as `q` rises.
    pub fn empirical(mut quantiles: Vec<(f64, Duration)>) -> Result<Self, EmpiricalError> {
        if quantiles.len() < 2 {
            return Err(EmpiricalError::TooFew);
        }
        if let Some(i) = quantiles.iter().position(|(q, _)| !(0.0..=1.0).contains(q)) {
            return Err(EmpiricalError::OutOfRange(i));
        }
        quantiles.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (first, last) = (quantiles[0].0, quantiles[quantiles.len() - 1].0);
        if first != 0.0 || last != 1.0 {
            return Err(EmpiricalError::Ends);
        }
        if let Some(i) = (1..quantiles.len()).find(|&i| quantiles[i].1 < quantiles[i - 1].1) {
            return Err(EmpiricalError::Falling(i));
        }
        Ok(DurationDist::Empirical { quantiles })
    }

    /// The largest value drawn, or `None` for a distribution without one
    /// (exponential, log-normal).
    pub fn max(&self) -> Option<Duration> {
        match self {
            DurationDist::Fixed { value } => Some(*value),
            DurationDist::Uniform { max, .. } => Some(*max),
            DurationDist::Exp { .. } | DurationDist::Lognormal { .. } => None,
            DurationDist::Empirical { quantiles } => quantiles.last().map(|(_, v)| *v),
        }
    }

    /// The value at `u` in [0, 1] of an empirical distribution's quantile
    /// function (straight between its points); `None` for the others.
    pub fn empirical_quantile(&self, u: f64) -> Option<Duration> {
        let DurationDist::Empirical { quantiles } = self else {
            return None;
        };
        let u = u.clamp(0.0, 1.0);
        let i = quantiles.partition_point(|(q, _)| *q < u);
        let Some(&(q1, v1)) = quantiles.get(i) else {
            return quantiles.last().map(|(_, v)| *v);
        };
        let Some(&(q0, v0)) = i.checked_sub(1).and_then(|j| quantiles.get(j)) else {
            return Some(v1);
        };
        if q1 <= q0 {
            return Some(v1);
        }
        let t = (u - q0) / (q1 - q0);
        Some(v0 + (v1 - v0).mul_f64(t))
    }
}

/// What a hop does for each request before calling downstream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Work {
    /// Nothing: answer (or call downstream) at once.
    None,
    /// Wait for a duration drawn per request (an I/O-bound service).
    Sleep {
        /// How long to wait.
        dist: DurationDist,
    },
    /// CPU-bound work as in back-to-back's sim: `rounds` SHA-256 passes over
    /// a `block_bytes` buffer, the round count drawn uniformly per request
    /// from `min_rounds..=max_rounds`.
    Cpu {
        /// Fewest rounds.
        min_rounds: u32,
        /// Most rounds.
        max_rounds: u32,
        /// Size of the hashed buffer (back-to-back: 100 KB).
        block_bytes: usize,
    },
}

/// A real gRPC service a hop calls as its work, in place of synthetic
/// work (`[hop.service]`): one call of the method's kind (unary, server,
/// client or bidirectional streaming) per request, made before the hop
/// calls its downstream hops, carrying the request's deadline and
/// `traceparent`. Its answer code is the hop's; its time, until the
/// service's last reply and status, is the hop's service time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceCall {
    /// Where this replica's service listens (`host:port`).
    pub address: String,
    /// The full method name, `package.Service/Method`.
    pub method: String,
    /// The request message or messages in protobuf's JSON mapping, each
    /// encoded once against the service's own schema.
    pub request: Requests,
    /// How many reply messages each call must get; `None`: any number
    /// (a unary or client-streaming method's one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replies: Option<u32>,
    /// `.proto` files that define the method; empty: the service's
    /// server reflection (v1, then v1alpha).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proto: Vec<std::path::PathBuf>,
    /// Import paths for `proto` (the files' own directories are searched
    /// too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proto_include: Vec<std::path::PathBuf>,
    /// Metadata sent with every call, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<(String, String)>,
    /// The service runs tailmesh's serving layers
    /// (`tailmesh_services::serving`): its caller sends the request's id,
    /// attempt and caller in `tm-*` metadata and takes the hop's record
    /// from the reply's `tm-hop-bin` header.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layered: bool,
}

/// A service call's request messages, each a JSON object in protobuf's
/// JSON mapping: one (`request`), or a list sent in order (`requests`, a
/// streaming method's; one only a streaming method takes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Requests {
    One(String),
    List(Vec<String>),
}

impl Requests {
    /// The messages, in the order they are sent.
    pub fn messages(&self) -> &[String] {
        match self {
            Requests::One(one) => std::slice::from_ref(one),
            Requests::List(list) => list,
        }
    }
}

impl From<&str> for Requests {
    fn from(json: &str) -> Self {
        Requests::One(json.to_owned())
    }
}

/// Per-request injected slowness: with `probability`, add a delay drawn
/// from `extra` on top of the work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slowness {
    /// Chance that a request is slowed at this hop, in [0, 1].
    pub probability: f64,
    /// The added delay.
    pub extra: DurationDist,
    /// Chance, in [0, 1], used instead of `probability` for a request the
    /// calling hop slowed with its own injected slowness: slowness that
    /// runs down a chain, so hops' tails are dependent on purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<f64>,
}

impl Slowness {
    /// The chance that a request is slowed here, given whether its caller
    /// slowed it.
    pub fn chance(&self, caller_slow: bool) -> f64 {
        match self.follow {
            Some(follow) if caller_slow => follow,
            _ => self.probability,
        }
    }
}

/// One replica of a hop that is slower than its siblings: its work takes
/// `factor` times as long (sleep durations and CPU rounds alike).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaSlow {
    /// Index of the slow replica (0-based).
    pub replica: u32,
    /// Multiplier on the work, at least 1.
    pub factor: f64,
}

/// Per-request injected errors: with `probability`, answer with `code`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorInjection {
    /// Chance that a request fails at this hop, in [0, 1].
    pub probability: f64,
    /// The gRPC status code returned (for example 14 = UNAVAILABLE).
    pub code: i32,
}

/// How a caller reaches a hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// The caller picks a replica and calls it directly.
    Push,
    /// The caller submits to the hop's broker topic; replicas pull.
    Pull,
}

impl Transport {
    /// The name used in scenarios, paths and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Push => "push",
            Transport::Pull => "pull",
        }
    }
}

/// How the callers of a hop hold their connections to it (the hop's
/// `connection` key): what a push caller does with its HTTP/2 connections
/// to the hop's replicas, and what a pull hop's producers do with their
/// broker clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Connection {
    /// Long-lived: one connection per replica (push), one broker client per
    /// caller (pull), opened on first use and kept.
    #[default]
    Shared,
    /// A new connection (push; with TLS, a new handshake) or a new broker
    /// client (pull) for every call, closed after it.
    PerRequest,
}

impl Connection {
    /// The name used in scenarios and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Connection::Shared => "shared",
            Connection::PerRequest => "per_request",
        }
    }
}

/// Which broker pull hops go through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokerKind {
    /// tailmesh's own broker (`tailmesh broker`).
    #[default]
    Tailmesh,
    /// RabbitMQ over AMQP 0-9-1: a queue per pulled hop.
    Rabbitmq,
    /// NATS JetStream: a work-queue stream and a pull consumer per pulled hop.
    Nats,
}

impl BrokerKind {
    /// The name used in scenarios and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerKind::Tailmesh => "tailmesh",
            BrokerKind::Rabbitmq => "rabbitmq",
            BrokerKind::Nats => "nats",
        }
    }
}

/// How many tasks, and how many payload bytes, may wait in a pulled hop's
/// queue before submits are refused with RESOURCE_EXHAUSTED, whichever the
/// broker: tailmesh's broker's `--queue-capacity` and `--queue-bytes`,
/// RabbitMQ's `x-max-length` and `x-max-length-bytes`, JetStream's
/// `max_messages` and `max_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueBounds {
    /// Most tasks waiting per topic.
    pub capacity: u32,
    /// Most payload bytes waiting per topic.
    pub bytes: u64,
}

impl QueueBounds {
    /// The default number of tasks: 10,000.
    pub const DEFAULT_CAPACITY: u32 = 10_000;
    /// The default number of bytes: 64 MiB (see tailmesh-services'
    /// `BrokerConfig::queue_bytes`).
    pub const DEFAULT_BYTES: u64 = 64 * 1024 * 1024;
}

impl Default for QueueBounds {
    fn default() -> Self {
        QueueBounds {
            capacity: Self::DEFAULT_CAPACITY,
            bytes: Self::DEFAULT_BYTES,
        }
    }
}

/// How a push caller picks a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Each replica in turn.
    RoundRobin,
    /// A replica drawn uniformly at random (seeded).
    Random,
    /// Power of two choices: of two random replicas, the one with fewer
    /// requests in flight.
    P2c,
    /// Peak-EWMA latency (Finagle's and Linkerd's): of two random
    /// replicas, the one whose decayed peak latency times (requests in
    /// flight + 1) is lower; see [`EwmaParams`].
    Ewma,
}

/// How a push caller treats its replicas' endpoints: what a gRPC client
/// and a mesh proxy do that a naive client does not. Every caller of the
/// hop (the load generator too) applies the same.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointOptions {
    /// Endpoint health as gRPC clients have it: a replica whose connection
    /// fails or is refused leaves the pick list (TRANSIENT_FAILURE) until a
    /// reconnect succeeds, retried with `backoff`; a request not yet sent
    /// when its connection failed goes to another replica. `false`: the
    /// naive client, which keeps picking a dead replica.
    #[serde(default = "default_true")]
    pub health: bool,
    /// The reconnect backoff of a replica in TRANSIENT_FAILURE.
    #[serde(default)]
    pub backoff: Backoff,
    /// HTTP/2 keepalive: a PING on each open connection every this long;
    /// with `keepalive_timeout`, a replica that stops answering is noticed
    /// within `keepalive + keepalive_timeout` of its last answer. `None`: no
    /// keepalive (a black-holed replica is noticed only through calls'
    /// deadlines).
    #[serde(default)]
    pub keepalive: Option<Duration>,
    /// How long a keepalive PING may go unanswered before the connection
    /// is deemed dead (and the replica in TRANSIENT_FAILURE).
    #[serde(default = "default_keepalive_timeout")]
    pub keepalive_timeout: Duration,
    /// `balance = "ewma"`'s parameters.
    #[serde(default)]
    pub ewma: EwmaParams,
    /// Outlier ejection, if any.
    #[serde(default)]
    pub ejection: Option<Ejection>,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        EndpointOptions {
            health: true,
            backoff: Backoff::default(),
            keepalive: None,
            keepalive_timeout: default_keepalive_timeout(),
            ewma: EwmaParams::default(),
            ejection: None,
        }
    }
}

fn default_true() -> bool {
    true
}

/// gRPC's keepalive timeout default: 20 s.
fn default_keepalive_timeout() -> Duration {
    Duration::from_secs(20)
}

/// gRPC's connection backoff (`connection-backoff.md` in grpc/grpc): the
/// n-th reconnect waits `min(initial * multiplier^n, max)`, spread by
/// +-`jitter` of itself.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    /// The first wait (gRPC: 1 s).
    pub initial: Duration,
    /// Growth per failed attempt (gRPC: 1.6).
    pub multiplier: f64,
    /// Relative spread, in [0, 1] (gRPC: 0.2).
    pub jitter: f64,
    /// The longest wait (gRPC: 120 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            multiplier: 1.6,
            jitter: 0.2,
            max: Duration::from_secs(120),
        }
    }
}

/// Peak-EWMA's parameters (Finagle's `PeakEwma`, Linkerd's balancer).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EwmaParams {
    /// The decay time of the moving average: an observation's weight falls
    /// by 1/e over this long (Finagle and Linkerd: 10 s).
    pub decay: Duration,
    /// The latency assumed of a replica not yet observed (Linkerd: 30 ms).
    pub default_rtt: Duration,
}

impl Default for EwmaParams {
    fn default() -> Self {
        EwmaParams {
            decay: Duration::from_secs(10),
            default_rtt: Duration::from_millis(30),
        }
    }
}

/// Outlier ejection after Envoy's: a replica that fails `consecutive_errors`
/// calls in a row, or whose recent latency is `latency_factor` times its
/// peers', leaves the pick list for `base_time` times the number of times
/// it was ejected (at most `max_time`); never more than `max_share` of the
/// replicas at once, and never the last pickable one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ejection {
    /// Failed calls in a row that eject (Envoy's consecutive_5xx: 5);
    /// `None`: no error rule.
    pub consecutive_errors: Option<u32>,
    /// The latency rule: ejected when its statistic over the last interval
    /// is this many times the median of its peers'; `None`: no latency rule.
    pub latency_factor: Option<f64>,
    /// Which statistic the latency rule compares.
    pub latency_stat: LatencyStat,
    /// How often the latency rule is judged (Envoy's interval: 10 s).
    pub interval: Duration,
    /// Calls a replica needs in an interval to be judged by the latency
    /// rule (Envoy's success_rate_request_volume: 100).
    pub min_requests: u32,
    /// The first ejection's length (Envoy's base_ejection_time: 30 s).
    pub base_time: Duration,
    /// The longest ejection (Envoy's max_ejection_time: 300 s).
    pub max_time: Duration,
    /// The most replicas ejected at once, as a share, in (0, 1].
    pub max_share: f64,
}

/// The latency statistic of the ejection rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyStat {
    /// The mean answer time.
    Mean,
    /// The 99th percentile of answer times.
    P99,
}

/// Everything a hop replica needs to know about its own behaviour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HopBehavior {
    /// The hop's name (unique in the scenario).
    pub name: String,
    /// The scenario seed; per-request draws are keyed on it.
    pub seed: u64,
    /// The work model.
    pub work: Work,
    /// Injected per-request slowness, if any.
    pub slow: Option<Slowness>,
    /// A slow replica of this hop, if any.
    pub replica_slow: Option<ReplicaSlow>,
    /// Injected errors, if any.
    pub error: Option<ErrorInjection>,
}

/// Faults set at runtime on one replica (through its Control API), each
/// replacing the scenario's of its kind while it is set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    /// Replaces `slow`.
    pub slow: Option<Slowness>,
    /// This replica's work factor; replaces `replica_slow`.
    pub work_factor: Option<f64>,
    /// Replaces `error`.
    pub error: Option<ErrorInjection>,
}

impl Overrides {
    /// Whether nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self.slow.is_none() && self.work_factor.is_none() && self.error.is_none()
    }
}

impl HopBehavior {
    /// The behaviour of replica `replica` under `overrides`: each kind set
    /// there replaces this one's. Per-request draws keep their keys, so the
    /// same requests are slowed or failed as when the scenario had the
    /// fault from the start.
    pub fn overridden(&self, overrides: &Overrides, replica: u32) -> HopBehavior {
        HopBehavior {
            slow: overrides.slow.clone().or_else(|| self.slow.clone()),
            replica_slow: match overrides.work_factor {
                Some(factor) => Some(ReplicaSlow { replica, factor }),
                None => self.replica_slow.clone(),
            },
            error: overrides.error.clone().or_else(|| self.error.clone()),
            ..self.clone()
        }
    }

    /// A hop that does no work and has no faults: the plainest there is.
    pub fn idle(name: impl Into<String>, seed: u64) -> Self {
        HopBehavior {
            name: name.into(),
            seed,
            work: Work::None,
            slow: None,
            replica_slow: None,
            error: None,
        }
    }
}

/// The transport a directly reached hop's records name (a service called
/// with no hop in front of it).
pub const DIRECT_TRANSPORT: &str = "direct";

/// Longest duration a distribution may produce: one hour. A heavy-tailed
/// draw beyond it is capped rather than overflowing.
pub const MAX_DRAW: Duration = Duration::from_secs(3600);

/// How a run's links are secured (`[mesh] tls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsMode {
    /// Plaintext HTTP/2.
    #[default]
    Off,
    /// Servers present a certificate the clients verify.
    Tls,
    /// Both sides present certificates signed by the run's CA.
    Mtls,
}

impl TlsMode {
    /// The name used in scenarios.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Off => "off",
            TlsMode::Tls => "tls",
            TlsMode::Mtls => "mtls",
        }
    }

    /// Whether links are encrypted at all.
    pub fn is_on(self) -> bool {
        self != TlsMode::Off
    }
}

/// What happened to one caller's connections (a snapshot of
/// `tailmesh_services::link::LinkEvents`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCounts {
    /// TCP connections opened (each reconnect counts).
    pub opened: u64,
    /// Connections that ended, for whatever reason: with long-lived
    /// connections, one that ends while the caller is still calling was
    /// lost; with a connection per call, every call closes one.
    pub closed: u64,
    /// Calls that failed because the peer sent GOAWAY.
    pub goaway_received: u64,
    /// Calls that failed because this side's HTTP/2 stack sent GOAWAY (a
    /// protection limit of its own, not the peer's doing).
    pub goaway_sent: u64,
    /// Calls whose stream the peer reset (RST_STREAM).
    pub reset_by_peer: u64,
    /// Calls that failed because the connection broke under them (an I/O
    /// error, the peer closing it, a failed connect).
    pub broken: u64,
    /// TLS handshakes that were full (a certificate sent and verified).
    #[serde(default)]
    pub tls_full: u64,
    /// TLS handshakes that resumed an earlier session.
    #[serde(default)]
    pub tls_resumed: u64,
}

impl LinkCounts {
    /// Both callers' counts together.
    pub fn plus(&self, other: &LinkCounts) -> LinkCounts {
        LinkCounts {
            opened: self.opened + other.opened,
            closed: self.closed + other.closed,
            goaway_received: self.goaway_received + other.goaway_received,
            goaway_sent: self.goaway_sent + other.goaway_sent,
            reset_by_peer: self.reset_by_peer + other.reset_by_peer,
            broken: self.broken + other.broken,
            tls_full: self.tls_full + other.tls_full,
            tls_resumed: self.tls_resumed + other.tls_resumed,
        }
    }

    /// Calls ended by the transport rather than answered by the peer.
    pub fn transport_failures(&self) -> u64 {
        self.goaway_received + self.goaway_sent + self.reset_by_peer + self.broken
    }
}

/// The most requests that may wait for a slot at one push replica with
/// limited concurrency when the scenario sets no `queue_limit`: far more
/// than a healthy queue holds (1000 service times of waiting), yet a fixed
/// count, so an overloaded replica's memory stays bounded.
pub const DEFAULT_QUEUE_LIMIT: u32 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn empirical_quantiles_are_sorted_and_checked() {
        let d =
            DurationDist::empirical(vec![(1.0, ms(9)), (0.0, ms(1)), (0.5, ms(3))]).expect("valid");
        assert_eq!(
            d,
            DurationDist::Empirical {
                quantiles: vec![(0.0, ms(1)), (0.5, ms(3)), (1.0, ms(9))]
            }
        );
        assert_eq!(d.max(), Some(ms(9)));
        let e = |q: Vec<(f64, Duration)>| DurationDist::empirical(q).err();
        assert_eq!(e(vec![(0.0, ms(1))]), Some(EmpiricalError::TooFew));
        assert_eq!(
            e(vec![(0.0, ms(1)), (1.5, ms(2))]),
            Some(EmpiricalError::OutOfRange(1))
        );
        assert_eq!(
            e(vec![(0.0, ms(1)), (f64::NAN, ms(2)), (1.0, ms(3))]),
            Some(EmpiricalError::OutOfRange(1))
        );
        assert_eq!(
            e(vec![(0.1, ms(1)), (1.0, ms(2))]),
            Some(EmpiricalError::Ends)
        );
        assert_eq!(
            e(vec![(0.0, ms(1)), (0.9, ms(2))]),
            Some(EmpiricalError::Ends)
        );
        assert_eq!(
            e(vec![(0.0, ms(5)), (0.5, ms(4)), (1.0, ms(6))]),
            Some(EmpiricalError::Falling(1))
        );
    }

    #[test]
    fn the_empirical_quantile_function_is_straight_between_points() {
        let d = DurationDist::empirical(vec![
            (0.0, ms(0)),
            (0.5, ms(10)),
            (0.5, ms(20)),
            (1.0, ms(30)),
        ])
        .expect("valid");
        let q = |u: f64| d.empirical_quantile(u).expect("empirical");
        assert_eq!(q(0.0), ms(0));
        assert_eq!(q(0.25), ms(5));
        // A jump at 0.5: below it the first point's side, above the second's.
        assert_eq!(q(0.5), ms(10));
        assert_eq!(q(0.75), ms(25));
        assert_eq!(q(1.0), ms(30));
        assert_eq!(q(7.0), ms(30));
        assert_eq!(
            DurationDist::Exp { mean: ms(1) }.empirical_quantile(0.5),
            None
        );
    }
}
