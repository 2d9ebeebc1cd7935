//! One variant's report, built one completed request at a time
//! ([`VariantAccumulator`]): accounting, rates, latency percentiles,
//! per-hop statistics, requests over time, attribution, and the verdict,
//! finished with what the run knew besides the requests
//! ([`VariantContext`]).
//!
//! What it holds grows with the latency bands and intervals seen (both
//! bounded), the gaps in the request ids still open (about the requests in
//! flight); nothing else grows with the run. The traces' breakdown comes
//! finished, from the streaming pass over the variant's spans.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tailmesh_model::LinkCounts;

use super::attribution::AttributionReport;
use super::broker::BrokerTopicStats;
use super::compose::{Dist, Grid};
use super::composition::{CompositionContext, CompositionReport};
use super::declared::{declared, declared_in_force};
use super::facts::declared_p;
use super::instrument::{self, InstrumentReport};
use super::intervals::{IntervalRecorder, IntervalSeries, Window, sending_end};
use super::latency_intervals::{
    ClosedInterval, IntervalHists, LatencyOverTime, LatencyPoint, intervals_end,
};
use super::observer::{ObserverInputs, ObserverReport};
use super::phases::Phases;
use super::slice::{SliceAcc, SliceJudging};
use super::stats::{Percentiles, micros, new_histogram, record_us};
use super::verdict::{
    CompoundingReport, DistributionCheck, compounding_by_phase, distribution_by_phase,
};
use crate::record::{Generators, MachineSamples, Outcome, RequestRecord, WarmupCounts};
use crate::traces::{self as breakdown, TraceReport};
use tailmesh_model::scenario::{Arrivals, Check, ConnectionMode, Hop, LoadMode, Stop, Variant};

/// Error messages kept per hop as samples.
const ERROR_SAMPLES: usize = 3;

/// One override of a variant, as written in the scenario.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// The key, e.g. `hop.*.transport`.
    pub key: String,
    /// The value in TOML syntax, e.g. `"pull"`.
    pub value: String,
}

/// Wraps a variant's `(key, value)` overrides for serialization.
pub fn overrides(variant: &Variant) -> Vec<Override> {
    variant
        .overrides
        .iter()
        .map(|(key, value)| Override {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

/// The load a variant was driven with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadSummary {
    /// "open" or "closed".
    pub mode: String,
    /// Requested rate, requests per second (open loop only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// "poisson" or "uniform" (open loop only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrivals: Option<String>,
    /// Requests in flight (closed loop only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Measured phase length in seconds, when the scenario stops by time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Measured requests, when the scenario stops by count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Warmup, seconds.
    pub warmup_s: f64,
    /// Per-request deadline, milliseconds.
    pub timeout_ms: f64,
    /// "shared(N)" or "per_request".
    pub connection: String,
    /// Payload bytes per request.
    pub payload_bytes: usize,
    /// One line for people, e.g. "open 400/s poisson, 20s".
    pub description: String,
    /// The load steps of an open loop, in order (empty: `rate`
    /// throughout); `rate` is then the first step's and `duration_s` their
    /// total.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepSummary>,
    /// The hops the requests entered at, with their declared shares
    /// (empty: the first hop, every request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<EntrySummary>,
}

/// An entry hop and its declared share of the requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntrySummary {
    pub hop: String,
    pub share: f64,
}

/// One load step: its rate for its duration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    /// Requests per second.
    pub rate: f64,
    /// Seconds.
    pub duration_s: f64,
}

impl LoadSummary {
    /// Describes `variant`'s load.
    pub fn of(variant: &Variant) -> LoadSummary {
        let load = &variant.load;
        let (mode, rate, arrivals, concurrency, head) = match &load.mode {
            LoadMode::Open {
                rate,
                arrivals,
                steps,
            } => {
                let a = match arrivals {
                    Arrivals::Poisson => "poisson",
                    Arrivals::Uniform => "uniform",
                };
                (
                    "open",
                    Some(*rate),
                    Some(a),
                    None,
                    format!(
                        "open {}/s {a}",
                        tailmesh_model::scenario::describe_rates(*rate, steps)
                    ),
                )
            }
            LoadMode::Closed { concurrency } => (
                "closed",
                None,
                None,
                Some(*concurrency),
                format!("closed, {concurrency} in flight"),
            ),
        };
        let (duration_s, requests, stop) = match load.stop {
            Stop::Duration(d) => (Some(d.as_secs_f64()), None, format!("{}s", d.as_secs_f64())),
            Stop::Requests(n) => (None, Some(n), format!("{n} requests")),
        };
        let connection = match load.connection {
            ConnectionMode::Shared { connections } => format!("shared({connections})"),
            ConnectionMode::PerRequest => "per_request".to_string(),
        };
        LoadSummary {
            mode: mode.to_string(),
            rate,
            arrivals: arrivals.map(str::to_string),
            concurrency,
            duration_s,
            requests,
            warmup_s: load.warmup.as_secs_f64(),
            timeout_ms: load.timeout.as_secs_f64() * 1e3,
            connection,
            payload_bytes: load.payload_bytes,
            description: format!("{head}, {stop}{}", entries_text(&load.entries)),
            steps: load
                .steps()
                .iter()
                .map(|s| StepSummary {
                    rate: s.rate,
                    duration_s: s.duration.as_secs_f64(),
                })
                .collect(),
            entries: load
                .entries
                .iter()
                .map(|e| EntrySummary {
                    hop: e.hop.clone(),
                    share: e.share,
                })
                .collect(),
        }
    }
}

/// `, entering at a 70 %, b 30 %`; empty without entries.
fn entries_text(entries: &[tailmesh_model::scenario::Entry]) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let each: Vec<String> = entries
        .iter()
        .map(|e| format!("{} {}", e.hop, tailmesh_units::percent(e.share)))
        .collect();
    format!(", entering at {}", each.join(", "))
}

/// What one hop did, from the paths of ok requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HopReport {
    /// Hop name.
    pub hop: String,
    /// How callers reach it: "push" or "pull".
    pub transport: String,
    /// Declared replicas.
    pub replicas: u32,
    /// Path records of this hop (one per visit; ok requests only).
    pub requests: u64,
    /// Of those, with injected slowness.
    pub slow: u64,
    /// `slow / requests`; `null` when the hop was never seen.
    pub p_slow: Option<f64>,
    /// The scenario's `slow.probability` (0 without `slow`).
    pub declared_p_slow: f64,
    /// Records per replica index: the load distribution. At least
    /// `replicas` long; longer only if a path names an undeclared replica.
    pub replica_requests: Vec<u64>,
    /// Service time (own work plus injected slowness).
    pub service: Percentiles,
    /// Time from receiving the request to answering (downstream included).
    pub total: Percentiles,
    /// Queue wait: time in the broker queue (pull) plus time waiting for a
    /// free slot in the replica (a hop with `concurrency`); 0 otherwise.
    pub queue_wait: Percentiles,
    /// Errors blamed on this hop, by label: the innermost hop an error
    /// message names (callers prefix `hop "<name>" replica <i> (<addr>): `
    /// as an error travels back up, so the last name is where it arose).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, u64>,
    /// The first few such error messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_samples: Vec<String>,
    /// The real gRPC service whose call is this hop's work
    /// (`[hop.service]`); absent for tailmesh's synthetic work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_service: Option<GrpcService>,
}

/// A hop's `[hop.service]` as summary.json tells it: a reader knows which
/// hops are real services, and which.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GrpcService {
    /// The full method name called.
    pub method: String,
    /// The running service's `host:port`, when the scenario gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The command that started one service per replica, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Where the method's schema came from: `"reflection"`, or `"proto: "`
    /// and the files.
    pub schema: String,
    /// Called directly by its callers, with no tailmesh hop in front.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
    /// Runs tailmesh's serving layers itself: the hop's records are the
    /// service's own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layers: bool,
}

impl GrpcService {
    /// The summary of `service`.
    pub fn of(service: &tailmesh_model::scenario::HopService) -> GrpcService {
        let (address, command) = match &service.source {
            tailmesh_model::scenario::ServiceSource::Address(a) => (Some(a.clone()), None),
            tailmesh_model::scenario::ServiceSource::Command(c) => (None, Some(c.clone())),
        };
        GrpcService {
            method: service.method.clone(),
            address,
            command,
            schema: service.schema_source(),
            direct: service.direct,
            layers: service.layers,
        }
    }
}

/// One variant's results. The end-to-end histogram is kept (not serialized)
/// for the `.hgrm` writer and the terminal table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VariantReport {
    /// Variant name.
    pub name: String,
    /// Its overrides, as written.
    pub overrides: Vec<Override>,
    /// "push", "pull" or "mixed": how the hops are reached.
    pub transport: String,
    pub load: LoadSummary,
    /// Length of the measured phase, seconds.
    pub measured_s: f64,
    /// Requests sent in the measured phase (records).
    pub sent: u64,
    /// Attempts beyond one per call (retries and hedges), by the load
    /// generator and every hop, as seen in ok requests' paths.
    #[serde(default)]
    pub extra_attempts: u64,
    /// `extra_attempts` per call made (load generator to the first hop, and
    /// hop to hop): the extra load the client policies cost.
    #[serde(default)]
    pub extra_load: f64,
    /// Answered before the deadline.
    pub ok: u64,
    /// Deadline passed first.
    pub timeouts: u64,
    /// Other failures by label (`Outcome::label`, e.g. "unavailable").
    pub errors: BTreeMap<String, u64>,
    /// Request ids seen more than once (should be 0).
    pub duplicate_ids: u64,
    /// `sent == ok + sum(errors) + timeouts` and no duplicate ids.
    pub accounted: bool,
    /// `sent / measured_s`, requests per second.
    pub achieved_rate: f64,
    /// `ok / measured_s`, requests per second.
    pub ok_rate: f64,
    /// End-to-end latency from the **intended** send time, ok requests
    /// only (errors and timeouts are counted above, not timed).
    pub latency: Percentiles,
    /// Latency from the actual send time, ok requests only: what a tool
    /// with coordinated omission would report, for contrast.
    pub latency_uncorrected: Percentiles,
    /// How late the generator sent (`start - intended`), all requests.
    pub lateness: Percentiles,
    /// Per-hop statistics in scenario order.
    pub hops: Vec<HopReport>,
    /// Path records naming hops the scenario does not declare.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown_hops: BTreeMap<String, u64>,
    /// The compounding check, if the scenario asks for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compounding: Option<CompoundingReport>,
    /// Requests sent during warmup (not measured, still accounted for).
    pub warmup: WarmupCounts,
    /// Whether the run was cut short (Ctrl-C, or a results disk that
    /// filled) while this variant ran.
    pub interrupted: bool,
    /// What happened to the load generator's own connections: opened,
    /// closed, and calls ended by the transport (GOAWAY received or sent,
    /// a stream reset by the peer, a broken connection). Absent through
    /// RabbitMQ or NATS, whose clients do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_links: Option<LinkCounts>,
    /// The load generator processes, when several shared the load
    /// (`[load] generators`): each one's clock, start and self-watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generators: Option<Generators>,
    /// What became of the streams, when the load went on streams
    /// (`[load.streams]`); each message is one of the requests counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<crate::record::StreamReport>,
    /// What went wrong around the measurement (a hop process that died...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<String>,
    /// The broker's per-topic statistics (queue depth, waits, redeliveries)
    /// when hops are reached by pull; queue wait values are in ns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker: Vec<BrokerTopicStats>,
    /// The peak resident memory of each process of the variant (hops, the
    /// broker) and of the orchestrator, when the load ended (absent when
    /// attached to containers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peak_memory: Vec<crate::record::PeakMemory>,
    /// Seconds from the first of the variant's processes started (the
    /// broker, services, hops) to the last one ready, before the load
    /// began; attached to a deployment, the time its readiness was
    /// checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_s: Option<f64>,
    /// Network faults applied, each with its mechanism (netem or nftables)
    /// and the packets its rules or qdiscs saw and dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<tailmesh_model::fault::FaultRecord>,
    /// Every fault window (a fault with a `start` or a `duration`), planned
    /// and as applied and cleared, on the measured clock.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fault_windows: Vec<tailmesh_model::fault::WindowRecord>,
    /// Replicas killed on schedule (`kill`), planned and as carried out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kills: Vec<super::KillRecord>,
    /// Per push caller (the load generator, each calling replica) and
    /// called hop: the replicas' counts and state changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<super::CallerEndpoints>,
    /// Why the slow requests were slow: counts per cause (absent in
    /// summaries from before attribution).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<AttributionReport>,
    /// The load generator watching itself and the machine while the
    /// variant ran (absent when read back from an older summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instrument: Option<InstrumentReport>,
    /// The per-hop breakdown from the traces and its cross-check against
    /// the reply paths (absent when tracing was off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<TraceReport>,
    /// What tracing cost in this variant (absent when read back from an
    /// older summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer: Option<ObserverReport>,
    /// End-to-end latency histogram (µs, intended send time, ok only).
    /// Not in summary.json: rebuilt from requests.csv when read back.
    #[serde(skip, default = "super::stats::new_histogram")]
    pub latency_histogram: Histogram<u64>,
    /// Requests and answers over time, in fixed intervals. Not in
    /// summary.json: rebuilt from requests.csv when read back.
    #[serde(skip)]
    pub intervals: IntervalSeries,
    /// The width of the latency intervals (`[report] interval`, the
    /// `<variant>.hlog`'s), seconds.
    #[serde(default = "default_interval_s")]
    pub interval_s: f64,
    /// Latency intervals closed, each written to `<variant>.hlog` (one
    /// untagged histogram and one per hop), from 0 to the end of the
    /// measured phase without gaps.
    #[serde(default)]
    pub intervals_written: u64,
    /// Requests that came after their interval had closed, counted in the
    /// oldest interval still open instead (0 unless the machine held a
    /// request back far past its timeout).
    #[serde(default)]
    pub intervals_late: u64,
    /// Latency over time: p50, p99, p99.9 per interval (or per run of
    /// intervals in a very long run). Not in summary.json: rebuilt from
    /// requests.csv when read back.
    #[serde(skip)]
    pub latency_over_time: Vec<LatencyPoint>,
    /// Results per phase of the schedule (fault windows and load steps),
    /// in time order; empty when nothing changes during the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<super::phases::PhaseReport>,
    /// A load ramp's knee, when a step departed from the one before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knee: Option<super::phases::Knee>,
    /// The whole tail composed from the hops' segments, against the
    /// measurement; `null` without an ok request.
    #[serde(default)]
    pub composition: Option<CompositionReport>,
}

fn default_interval_s() -> f64 {
    tailmesh_model::scenario::DEFAULT_REPORT_INTERVAL.as_secs_f64()
}

/// `secs` as a whole number of nanoseconds (what a `Duration` written as
/// seconds in summary.json was).
fn whole_ns(secs: f64) -> Duration {
    Duration::from_nanos((secs.max(0.0) * 1e9).round() as u64)
}

/// The measured phase's planned length, when `load` says it: its
/// duration, or requests over rate.
fn planned_length(load: &LoadSummary) -> Option<Duration> {
    match (load.duration_s, load.requests, load.rate) {
        (Some(d), _, _) => Some(whole_ns(d)),
        (None, Some(n), Some(rate)) if rate > 0.0 => {
            Duration::try_from_secs_f64(n as f64 / rate).ok()
        }
        _ => None,
    }
}

/// Accumulates one hop's statistics.
struct HopAcc {
    replicas: Vec<u64>,
    service: Histogram<u64>,
    total: Histogram<u64>,
    queue_wait: Histogram<u64>,
    errors: BTreeMap<String, u64>,
    error_samples: Vec<String>,
}

impl HopAcc {
    fn new(replicas: u32) -> HopAcc {
        HopAcc {
            replicas: vec![0; replicas as usize],
            service: new_histogram(),
            total: new_histogram(),
            queue_wait: new_histogram(),
            errors: BTreeMap::new(),
            error_samples: Vec::new(),
        }
    }

    /// Counts one path record of an ok request.
    fn record(&mut self, h: &crate::record::HopRecord) {
        let replica = h.replica as usize;
        if self.replicas.len() <= replica {
            self.replicas.resize(replica + 1, 0);
        }
        self.replicas[replica] += 1;
        record_us(&mut self.service, h.service_ns / 1_000);
        record_us(&mut self.total, h.total_ns / 1_000);
        record_us(&mut self.queue_wait, h.queue_wait_ns / 1_000);
    }

    /// The hop's report; `requests` and `slow` are its path records and
    /// slow ones, as the whole variant's slice counted them.
    fn into_report(self, variant: &Variant, hop: &Hop, (requests, slow): (u64, u64)) -> HopReport {
        HopReport {
            hop: hop.name.clone(),
            transport: if hop.service.as_ref().is_some_and(|s| s.direct) {
                tailmesh_model::DIRECT_TRANSPORT.to_owned()
            } else {
                hop.transport.as_str().to_owned()
            },
            replicas: hop.replicas,
            requests,
            slow,
            p_slow: (requests > 0).then(|| slow as f64 / requests as f64),
            declared_p_slow: declared_p(variant, hop),
            replica_requests: self.replicas,
            service: Percentiles::from_histogram(&self.service),
            total: Percentiles::from_histogram(&self.total),
            queue_wait: Percentiles::from_histogram(&self.queue_wait),
            errors: self.errors,
            error_samples: self.error_samples,
            grpc_service: hop.service.as_ref().map(GrpcService::of),
        }
    }
}

/// The innermost hop named in an error message (`... hop "b" ...`).
pub fn blamed_hop(message: &str) -> Option<&str> {
    let start = message.rfind("hop \"")? + "hop \"".len();
    let len = message[start..].find('"')?;
    Some(&message[start..start + len])
}

/// The request ids seen, as ranges `first -> last`: ids are
/// handed out in order, so the ranges merge as requests complete and the
/// set holds about as many ranges as requests were in flight at once.
#[derive(Debug, Default)]
struct IdSet {
    ranges: BTreeMap<u64, u64>,
}

impl IdSet {
    /// Adds `id`; false when it was already there.
    fn insert(&mut self, id: u64) -> bool {
        let before = self.ranges.range(..=id).next_back().map(|(&s, &l)| (s, l));
        if before.is_some_and(|(_, last)| last >= id) {
            return false;
        }
        let start = match before {
            Some((start, last)) if last.checked_add(1) == Some(id) => start,
            _ => id,
        };
        let last = match id.checked_add(1).and_then(|next| self.ranges.remove(&next)) {
            Some(last) => last,
            None => id,
        };
        self.ranges.insert(start, last);
        true
    }
}

/// What the run knew about a variant besides its requests: plain data,
/// gathered by the caller and handed to [`VariantAccumulator::finish`].
#[derive(Default)]
pub struct VariantContext {
    /// Length of the measured phase (for rates).
    pub measured: Duration,
    /// Requests sent during warmup.
    pub warmup: WarmupCounts,
    /// Whether the run was cut short while this variant ran.
    pub interrupted: bool,
    /// The load generator's connections.
    pub generator_links: Option<LinkCounts>,
    /// The load generator processes, when several shared the load.
    pub generators: Option<Generators>,
    /// What became of the streams, when the load went on streams.
    pub streams: Option<crate::record::StreamReport>,
    /// What went wrong around the measurement.
    pub incidents: Vec<String>,
    /// The broker's per-topic statistics.
    pub broker: Vec<BrokerTopicStats>,
    /// Peak resident memory of the variant's processes.
    pub peak_memory: Vec<crate::record::PeakMemory>,
    /// How long the variant's processes took to start and get ready.
    pub launch: Option<Duration>,
    /// Network faults applied.
    pub faults: Vec<tailmesh_model::fault::FaultRecord>,
    /// Fault windows, planned and as applied.
    pub fault_windows: Vec<tailmesh_model::fault::WindowRecord>,
    /// Replicas killed on schedule.
    pub kills: Vec<super::KillRecord>,
    /// What the push callers saw of the replicas they call.
    pub endpoints: Vec<super::CallerEndpoints>,
    /// What the self-watch measured over the load window.
    pub machine: Option<MachineSamples>,
    /// The traces' breakdown (from every trace), when it was traced.
    pub traces: Option<TraceReport>,
}

/// A finished variant: its report and the warnings for the terminal.
#[derive(Debug)]
pub struct Analyzed {
    pub report: VariantReport,
    /// One line each, without the `warning: ` prefix.
    pub warnings: Vec<String>,
}

/// Builds one variant's report from its completed requests, one at a time.
pub struct VariantAccumulator {
    variant: Variant,
    check: Check,
    index: BTreeMap<String, usize>,
    /// Everything a phase counts too, for the whole measured phase.
    whole: SliceAcc,
    uncorrected: Histogram<u64>,
    lateness: Histogram<u64>,
    hops: Vec<HopAcc>,
    unknown_hops: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    ids: IdSet,
    /// The most ranges `ids` held at once.
    peak_id_ranges: usize,
    duplicate_ids: u64,
    extra_attempts: u64,
    calls: u64,
    intervals: IntervalRecorder,
    over_time: LatencyOverTime,
    phases: Phases,
}

impl VariantAccumulator {
    /// An empty accumulator for `variant` under `check`, with latency
    /// intervals `interval` wide.
    pub fn new(variant: &Variant, check: &Check, interval: Duration) -> Self {
        let hops: Vec<String> = variant.hops.iter().map(|h| h.name.clone()).collect();
        let planned = planned_length(&LoadSummary::of(variant));
        VariantAccumulator {
            over_time: LatencyOverTime::new(interval, planned, variant.load.timeout, &hops),
            phases: Phases::new(variant, check, planned),
            whole: SliceAcc::new(variant, check),
            variant: variant.clone(),
            check: check.clone(),
            index: variant
                .hops
                .iter()
                .enumerate()
                .map(|(i, h)| (h.name.clone(), i))
                .collect(),
            uncorrected: new_histogram(),
            lateness: new_histogram(),
            hops: variant
                .hops
                .iter()
                .map(|h| HopAcc::new(h.replicas))
                .collect(),
            unknown_hops: BTreeMap::new(),
            errors: BTreeMap::new(),
            ids: IdSet::default(),
            peak_id_ranges: 0,
            duplicate_ids: 0,
            extra_attempts: 0,
            calls: 0,
            intervals: IntervalRecorder::default(),
        }
    }

    /// Counts one completed request of the measured phase.
    pub fn record(&mut self, r: &RequestRecord) {
        self.whole.record(r, self.check.slow_threshold, &self.index);
        if !self.ids.insert(r.id) {
            self.duplicate_ids += 1;
        }
        self.peak_id_ranges = self.peak_id_ranges.max(self.ids.ranges.len());
        record_us(
            &mut self.lateness,
            micros(r.start.saturating_sub(r.intended)),
        );
        // Retries and hedges: the load generator's, and every hop's recorded
        // in the paths (failed requests carry no path, so theirs are not
        // seen).
        self.extra_attempts += u64::from(r.extra_attempts)
            + r.path
                .iter()
                .map(|h| u64::from(h.extra_attempts))
                .sum::<u64>();
        self.calls += 1 + r.path.len().saturating_sub(1) as u64;
        match &r.outcome {
            Outcome::Ok => {
                record_us(&mut self.uncorrected, micros(r.service_latency()));
                for h in &r.path {
                    let Some(&i) = self.index.get(h.hop.as_str()) else {
                        *self.unknown_hops.entry(h.hop.clone()).or_insert(0) += 1;
                        continue;
                    };
                    self.hops[i].record(h);
                }
            }
            Outcome::Timeout => {}
            Outcome::Error { message, .. } => {
                let label = r.outcome.label();
                *self.errors.entry(label.clone()).or_insert(0) += 1;
                if let Some(acc) = blamed_hop(message)
                    .and_then(|h| self.index.get(h))
                    .map(|&i| &mut self.hops[i])
                {
                    *acc.errors.entry(label).or_insert(0) += 1;
                    if acc.error_samples.len() < ERROR_SAMPLES {
                        acc.error_samples.push(message.clone());
                    }
                }
            }
        }
        self.intervals.record(r);
        self.phases.record(r);
        let phases = &mut self.phases;
        self.over_time
            .record_seen(r, |closed| phases.interval_closed(closed));
    }

    /// Keeps the latency intervals as they close, for
    /// [`VariantAccumulator::closed_interval`] (the .hlog writer), instead
    /// of only summarizing them.
    pub fn export_intervals(&mut self) {
        self.over_time.export();
    }

    /// The next latency interval closed, when exported; its histograms
    /// come back through [`VariantAccumulator::give_back`].
    pub fn closed_interval(&mut self) -> Option<ClosedInterval> {
        self.over_time.pop_closed()
    }

    /// Takes back a closed interval's histograms, for reuse.
    pub fn give_back(&mut self, hists: IntervalHists) {
        self.over_time.give_back(hists);
    }

    /// Closes the latency intervals still open, once the load is over:
    /// the measured phase lasted `measured`, cut short if `interrupted`.
    /// [`VariantAccumulator::finish`] does it too, when not done before.
    pub fn end_load(&mut self, measured: Duration, interrupted: bool) {
        let load = LoadSummary::of(&self.variant);
        let window = Window {
            planned_s: load.duration_s,
            open: load.mode == "open",
            measured_s: measured.as_secs_f64(),
            interrupted,
        };
        let end = intervals_end(&window, self.intervals.last_send());
        self.phases.end(end);
        let phases = &mut self.phases;
        self.over_time
            .end_seen(end, |closed| phases.interval_closed(closed));
    }

    /// The most ranges of request ids held at once: the one structure here
    /// that follows the requests (it grows with the requests in flight,
    /// ended out of order, not with the run's length).
    pub fn peak_id_ranges(&self) -> usize {
        self.peak_id_ranges
    }

    /// The finished report: everything recorded, with `context`, the
    /// machine's judgement, the verdict and the traces' breakdown.
    pub fn finish(mut self, context: VariantContext) -> Analyzed {
        self.end_load(context.measured, context.interrupted);
        let interval_s = self.over_time.width().as_secs_f64();
        let over_time = self.over_time.finish();
        let mut warnings = Vec::new();
        let variant = &self.variant;
        let secs = context.measured.as_secs_f64();
        let per_sec = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let lateness = Percentiles::from_histogram(&self.lateness);

        if let Some(line) = context
            .generator_links
            .as_ref()
            .and_then(|links| link_warning(&variant.name, links, variant.load.connection))
        {
            warnings.push(line);
        }
        let instrument = context
            .machine
            .as_ref()
            .map(|m| instrument::judge(m, &lateness));
        if let Some(line) = instrument.as_ref().and_then(InstrumentReport::warning) {
            warnings.push(format!("variant {}: {line}", variant.name));
        }
        // Each generator process judged itself too: its own sends and timer.
        for g in context.generators.iter().flat_map(|g| &g.each) {
            if let Some(line) = g.instrument.as_ref().and_then(InstrumentReport::warning) {
                warnings.push(format!(
                    "variant {}: load generator {}: {line}",
                    variant.name, g.index
                ));
            }
        }
        let machine = instrument
            .as_ref()
            .map(InstrumentReport::machine)
            .unwrap_or_default();

        let by_phase = self.phases.slowness_windowed();
        // The measured overhead of reaching a hop holds its network faults'
        // delay already: the declared side leaves them out.
        let without_net = {
            let mut v = variant.clone();
            for h in &mut v.hops {
                h.net = None;
                h.replica_net.clear();
            }
            v
        };
        let declare = |grid: Grid, overhead: &dyn Fn(usize) -> Dist, faults: Option<&[String]>| {
            let variant = &without_net;
            let per_hop = |hop: &Hop| match variant.hops.iter().position(|h| h.name == hop.name) {
                Some(i) => overhead(i),
                None => Dist::zero(grid),
            };
            let predicted = match faults {
                None => declared(variant, grid, &per_hop),
                Some(faults) => {
                    declared_in_force(variant, grid, &per_hop, &|f| faults.iter().any(|x| x == f))
                }
            };
            predicted.map(|d| d.dist)
        };
        let composing = CompositionContext {
            machine: &machine,
            check: self.check.distribution,
            tolerance: self.check.distribution_tolerance,
            declare: &declare,
            faults: None,
        };
        let (phases, knee) = self.phases.finish(&machine, &composing);
        let hop_names: Vec<String> = variant.hops.iter().map(|h| h.name.clone()).collect();
        let declared_p: Vec<f64> = variant
            .hops
            .iter()
            .map(|h| declared_p(variant, h))
            .collect();
        let whole = self.whole.finish(&SliceJudging {
            hop_names: &hop_names,
            declared_p: &declared_p,
            check: &self.check,
            machine: &machine,
            composing: &composing,
        });
        let hop_reports: Vec<HopReport> = self
            .hops
            .into_iter()
            .zip(&variant.hops)
            .zip(&whole.hops)
            .map(|((acc, hop), &counts)| acc.into_report(variant, hop, counts))
            .collect();
        let mut composition = whole.composition;
        if let Some(c) = composition.as_mut()
            && phases.iter().any(|p| !p.faults.is_empty())
        {
            c.check = c.check.take().map(|whole| {
                let judged: Vec<(&str, &DistributionCheck)> = phases
                    .iter()
                    .filter_map(|p| {
                        Some((p.name.as_str(), p.composition.as_ref()?.check.as_ref()?))
                    })
                    .collect();
                distribution_by_phase(whole, &judged)
            });
        }
        let compounding = whole.compounding.map(|whole| {
            if by_phase {
                let judged: Vec<(&str, &CompoundingReport)> = phases
                    .iter()
                    .filter_map(|p| Some((p.name.as_str(), p.compounding.as_ref()?)))
                    .collect();
                compounding_by_phase(whole, &judged)
            } else {
                whole
            }
        });

        let traces = match context.traces {
            Some(report) => {
                let report = trace_breakdown(variant, report);
                let pulled = |hop: &str| {
                    variant
                        .hops
                        .iter()
                        .any(|h| h.name == hop && h.transport == tailmesh_model::Transport::Pull)
                };
                if let Some(line) = breakdown::completeness_warning(&variant.name, &report, pulled)
                {
                    warnings.push(line);
                }
                Some(report)
            }
            None => None,
        };

        let load = LoadSummary::of(variant);
        let window = Window {
            planned_s: load.duration_s,
            open: load.mode == "open",
            measured_s: secs,
            interrupted: context.interrupted,
        };
        let last_send = self.intervals.last_send();
        let intervals = self.intervals.finish(sending_end(Some(&window), last_send));
        let error_total: u64 = self.errors.values().sum();
        let report = VariantReport {
            name: variant.name.clone(),
            overrides: overrides(variant),
            transport: transport_summary(&variant.hops).to_string(),
            load,
            measured_s: secs,
            sent: whole.sent,
            extra_attempts: self.extra_attempts,
            extra_load: if self.calls > 0 {
                self.extra_attempts as f64 / self.calls as f64
            } else {
                0.0
            },
            ok: whole.ok,
            timeouts: whole.timeouts,
            errors: self.errors,
            duplicate_ids: self.duplicate_ids,
            accounted: whole.sent == whole.ok + error_total + whole.timeouts
                && self.duplicate_ids == 0,
            achieved_rate: per_sec(whole.sent),
            ok_rate: per_sec(whole.ok),
            latency: Percentiles::from_histogram(&whole.latency),
            latency_uncorrected: Percentiles::from_histogram(&self.uncorrected),
            lateness,
            hops: hop_reports,
            unknown_hops: self.unknown_hops,
            compounding,
            warmup: context.warmup,
            interrupted: context.interrupted,
            generator_links: context.generator_links,
            generators: context.generators,
            streams: context.streams,
            incidents: context.incidents,
            broker: context.broker,
            peak_memory: context.peak_memory,
            launch_s: context.launch.map(|d| d.as_secs_f64()),
            faults: context.faults,
            fault_windows: context.fault_windows,
            kills: context.kills,
            endpoints: context.endpoints,
            attribution: Some(whole.attribution),
            instrument,
            traces,
            // The caller's: it knows what tracing cost.
            observer: None,
            latency_histogram: whole.latency,
            intervals,
            interval_s,
            intervals_written: over_time.intervals,
            intervals_late: over_time.late,
            latency_over_time: over_time.points,
            phases,
            knee,
            composition,
        };
        Analyzed { report, warnings }
    }
}

impl ObserverReport {
    /// The report of a traced variant from what was measured, `variant`
    /// giving the load window's CPU (here, beside the report it reads, so
    /// `observer` need not know a variant's report).
    pub fn assess(m: &ObserverInputs, variant: &VariantReport) -> Self {
        let window_cpu_us = variant
            .instrument
            .as_ref()
            .and_then(|i| Some(i.mesh_cpus? * i.window_s? * 1e6))
            .filter(|w| *w > 0.0);
        ObserverReport::from_inputs(m, window_cpu_us)
    }
}

impl Window {
    /// The window of a finished report (here, beside the report, so
    /// `intervals` need not know it).
    pub fn of(report: &VariantReport) -> Window {
        Window {
            planned_s: report.load.duration_s,
            open: report.load.mode == "open",
            measured_s: report.measured_s,
            interrupted: report.interrupted,
        }
    }
}

/// The traces' per-hop breakdown of `variant`, hops in the scenario's
/// order as everywhere else.
fn trace_breakdown(variant: &Variant, mut traces: TraceReport) -> TraceReport {
    let order = |hop: &str| variant.hops.iter().position(|h| h.name == hop);
    traces
        .hops
        .sort_by_key(|h| order(&h.hop).unwrap_or(usize::MAX));
    traces
        .coverage
        .sort_by_key(|c| order(&c.hop).unwrap_or(usize::MAX));
    traces
}

/// Rebuilds the parts of `report` that summary.json leaves out (the
/// latency histogram, the intervals) from its requests, one at a time,
/// as read back from requests.csv.
pub struct Rebuild {
    latency: Histogram<u64>,
    intervals: IntervalRecorder,
    over_time: LatencyOverTime,
}

impl Rebuild {
    /// Nothing of `report`'s requests read yet.
    pub fn new(report: &VariantReport) -> Rebuild {
        let hops: Vec<String> = report.hops.iter().map(|h| h.hop.clone()).collect();
        Rebuild {
            latency: new_histogram(),
            intervals: IntervalRecorder::default(),
            over_time: LatencyOverTime::new(
                whole_ns(report.interval_s),
                planned_length(&report.load),
                Duration::from_nanos((report.load.timeout_ms * 1e6).round() as u64),
                &hops,
            ),
        }
    }

    /// Counts one request.
    pub fn record(&mut self, r: &RequestRecord) {
        if r.outcome == Outcome::Ok {
            record_us(&mut self.latency, micros(r.latency()));
        }
        self.intervals.record(r);
        self.over_time.record_seen(r, |_| {});
    }

    /// Puts what was rebuilt into `report`.
    pub fn finish(mut self, report: &mut VariantReport) {
        let window = Window::of(report);
        let last_send = self.intervals.last_send();
        self.over_time
            .end_seen(intervals_end(&window, last_send), |_| {});
        report.latency_histogram = self.latency;
        report.intervals = self.intervals.finish(sending_end(Some(&window), last_send));
        report.latency_over_time = self.over_time.finish().points;
    }
}

/// A warning naming what happened to the generator's connections, when
/// they did not hold: calls the transport ended, or long-lived connections
/// that closed while the load ran. Requests on them are counted as what the
/// system did (UNAVAILABLE and the like); this says where to look.
pub fn link_warning(
    variant: &str,
    links: &LinkCounts,
    connection: ConnectionMode,
) -> Option<String> {
    let mut parts = Vec::new();
    let mut count = |n: u64, what: &str| {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    };
    if matches!(connection, ConnectionMode::Shared { .. }) {
        count(links.closed, "connection(s) lost");
    }
    count(
        links.goaway_received,
        "call(s) ended by a GOAWAY from the peer",
    );
    count(
        links.goaway_sent,
        "call(s) ended by a GOAWAY of the generator's own HTTP/2 stack",
    );
    count(links.reset_by_peer, "stream(s) reset by the peer");
    count(links.broken, "call(s) on a broken connection");
    (!parts.is_empty()).then(|| {
        format!(
            "variant {variant}: the load generator's connections: {} (summary.json: generator_links)",
            parts.join(", ")
        )
    })
}

/// "push" or "pull" when every hop agrees, "mixed" otherwise ("push" for
/// no hops).
fn transport_summary(hops: &[Hop]) -> &'static str {
    let mut kinds = hops.iter().map(|h| h.transport.as_str());
    let first = kinds.next().unwrap_or("push");
    if kinds.all(|k| k == first) {
        first
    } else {
        "mixed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{analyze_variant, chain3, check, failed, mixed_records, ok_records};
    use crate::verdict::Verdict;

    #[test]
    fn a_stepped_load_is_summarized_with_its_steps_and_a_constant_one_without() {
        let mut v = chain3();
        let constant = serde_json::to_value(LoadSummary::of(&v)).expect("serializes");
        assert!(constant.get("steps").is_none(), "{constant:#}");
        assert_eq!(constant["description"], "open 400/s poisson, 20s");

        let step = |rate: f64, secs: u64| tailmesh_model::scenario::Step {
            rate,
            duration: Duration::from_secs(secs),
        };
        v.load.mode = LoadMode::Open {
            rate: 200.0,
            arrivals: Arrivals::Uniform,
            steps: vec![step(200.0, 4), step(400.0, 4), step(600.5, 2)],
        };
        v.load.stop = Stop::Duration(Duration::from_secs(10));
        let summary = LoadSummary::of(&v);
        assert_eq!(summary.rate, Some(200.0));
        assert_eq!(summary.duration_s, Some(10.0));
        assert_eq!(
            summary.description,
            "open steps 200→400→600.5/s uniform, 10s"
        );
        assert_eq!(
            tailmesh_model::scenario::describe_load(&v.load),
            "open loop, steps 200→400→600.5/s uniform, 10s (+2s warmup)"
        );
        let json = serde_json::to_value(&summary).expect("serializes");
        assert_eq!(
            json["steps"],
            serde_json::json!([
                { "rate": 200.0, "duration_s": 4.0 },
                { "rate": 400.0, "duration_s": 4.0 },
                { "rate": 600.5, "duration_s": 2.0 },
            ])
        );
        // Read back, and a summary written before steps existed still reads.
        let back: LoadSummary = serde_json::from_value(json).expect("reads back");
        assert_eq!(back, summary);
        let old: LoadSummary = serde_json::from_value(constant).expect("reads back");
        assert!(old.steps.is_empty());
    }

    #[test]
    fn errors_are_blamed_on_the_innermost_hop_named() {
        let message =
            "hop \"a\" replica 0 (127.0.0.1:1): hop \"b\" replica 1 (127.0.0.1:2): refused";
        assert_eq!(blamed_hop(message), Some("b"));
        assert_eq!(
            blamed_hop("injected error at hop \"c\" replica 0"),
            Some("c")
        );
        // A full wait queue at "b", forwarded by "a": blamed on "b".
        assert_eq!(
            blamed_hop(
                "hop \"b\" replica 0 (127.0.0.1:2): hop \"b\" replica 0: \
                 1000 requests already wait for a slot (queue_limit)"
            ),
            Some("b")
        );
        assert_eq!(blamed_hop("transport error"), None);
        assert_eq!(blamed_hop("hop \"unterminated"), None);
    }

    #[test]
    fn every_request_is_accounted_for() {
        let r = analyze_variant(
            &chain3(),
            &check(),
            &mixed_records(),
            Duration::from_secs(2),
        );
        assert_eq!(r.sent, 1010);
        assert_eq!(r.ok, 1000);
        assert_eq!(r.timeouts, 5);
        assert_eq!(r.errors.get("unavailable"), Some(&3));
        assert_eq!(r.errors.get("resource_exhausted"), Some(&2));
        assert_eq!(r.errors.len(), 2);
        assert!(r.accounted);
        assert!((r.achieved_rate - 505.0).abs() < 1e-9);
        assert!((r.ok_rate - 500.0).abs() < 1e-9);
    }

    #[test]
    fn duplicate_ids_break_the_accounting() {
        let mut records = ok_records();
        records.push(failed(7, Outcome::Timeout, 100_000));
        let r = analyze_variant(&chain3(), &check(), &records, Duration::from_secs(1));
        assert_eq!(r.duplicate_ids, 1);
        assert!(!r.accounted);
    }

    #[test]
    fn latency_counts_ok_requests_from_the_intended_time() {
        let r = analyze_variant(
            &chain3(),
            &check(),
            &mixed_records(),
            Duration::from_secs(2),
        );
        // 729 of 1000 ok requests took 1 ms, 271 took 21 ms.
        assert_eq!(r.latency.count, 1000);
        assert_eq!(r.latency.p50_us, 1_000);
        assert_eq!(r.latency.p90_us, 21_007);
        assert_eq!(r.latency.max_us, 21_007);
        assert_eq!(r.latency.min_us, 1_000);
        // From the actual send, 100 µs less.
        assert_eq!(r.latency_uncorrected.p50_us, 900);
        assert_eq!(r.lateness.count, 1010);
        assert_eq!(r.lateness.max_us, 100);
        assert_eq!(r.latency_histogram.len(), 1000);
    }

    #[test]
    fn per_hop_probabilities_and_load_split_come_from_the_paths() {
        let r = analyze_variant(
            &chain3(),
            &check(),
            &mixed_records(),
            Duration::from_secs(2),
        );
        let names: Vec<&str> = r.hops.iter().map(|h| h.hop.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        for h in &r.hops {
            assert_eq!(h.requests, 1000);
            assert_eq!(h.slow, 100);
            assert_eq!(h.p_slow, Some(0.1));
            assert_eq!(h.replica_requests, [500, 500]);
            assert_eq!(h.service.min_us, 300);
            assert_eq!(h.service.p90_us, 300);
            assert!(h.service.p99_us >= 20_300 && h.service.p99_us < 20_330);
        }
        assert_eq!(r.hops[1].errors.get("unavailable"), Some(&3));
        assert_eq!(r.hops[1].error_samples.len(), 3);
        assert!(r.hops[0].errors.is_empty());
    }

    #[test]
    fn compounding_matches_the_constructed_schedule() {
        let r = analyze_variant(
            &chain3(),
            &check(),
            &mixed_records(),
            Duration::from_secs(2),
        );
        let c = r.compounding.expect("compounding requested");
        assert_eq!(c.n, 1005);
        assert_eq!(c.slow, 276);
        assert_eq!(c.errors_excluded, 5);
        assert_eq!(c.timeouts_censored, 0);
        assert!((c.model - 0.271).abs() < 1e-12);
        assert!((c.declared_model - 0.271).abs() < 1e-12);
        assert_eq!(c.verdict, Verdict::Pass);
    }

    #[test]
    fn timeouts_under_the_threshold_are_censored() {
        let mut records = ok_records();
        records.push(failed(5000, Outcome::Timeout, 10_000));
        let r = analyze_variant(&chain3(), &check(), &records, Duration::from_secs(2));
        let c = r.compounding.expect("compounding requested");
        assert_eq!((c.n, c.slow, c.timeouts_censored), (1000, 271, 1));
    }

    #[test]
    fn the_order_requests_complete_in_changes_nothing() {
        let records = mixed_records();
        let sorted = analyze_variant(&chain3(), &check(), &records, Duration::from_secs(2));
        let mut reversed = records.clone();
        reversed.reverse();
        let reversed = analyze_variant(&chain3(), &check(), &reversed, Duration::from_secs(2));
        let json = |r: &VariantReport| {
            let mut v = serde_json::to_value(r).expect("serialize");
            // The first few error messages kept are the first seen.
            for hop in v["hops"].as_array_mut().into_iter().flatten() {
                hop["error_samples"].take();
            }
            // Records for latency intervals already closed are late: in
            // reverse order, every record after the first seconds' ends.
            v["intervals_late"].take();
            v
        };
        assert_eq!(json(&sorted), json(&reversed));
        assert_eq!(sorted.intervals, reversed.intervals);
        assert_eq!(sorted.latency_histogram, reversed.latency_histogram);
        assert_eq!(sorted.intervals_late, 0);
        assert!(reversed.intervals_late > 0);
        let ok = |r: &VariantReport| r.latency_over_time.iter().map(|p| p.ok).sum::<u64>();
        assert_eq!((ok(&sorted), ok(&reversed)), (1000, 1000));
    }

    #[test]
    fn the_latency_series_rebuilt_from_the_requests_is_the_runs() {
        let records = mixed_records();
        // 100 ms: a width that is not a whole number of float seconds.
        let mut acc = VariantAccumulator::new(&chain3(), &check(), Duration::from_millis(100));
        for r in &records {
            acc.record(r);
        }
        let live = acc
            .finish(VariantContext {
                measured: Duration::from_secs(2),
                ..VariantContext::default()
            })
            .report;
        assert_eq!(live.interval_s, 0.1);
        assert_eq!(live.intervals_written, 200);
        assert_eq!(live.latency_over_time.len(), 200);
        assert_eq!(
            live.latency_over_time.iter().map(|p| p.ok).sum::<u64>(),
            1000
        );
        // Read back as `tailmesh report` does: summary.json, then the rows.
        let mut read: VariantReport =
            serde_json::from_value(serde_json::to_value(&live).expect("serialize"))
                .expect("deserialize");
        assert!(read.latency_over_time.is_empty(), "not in summary.json");
        let mut rebuild = Rebuild::new(&read);
        for r in &records {
            rebuild.record(r);
        }
        rebuild.finish(&mut read);
        assert_eq!(read.latency_over_time, live.latency_over_time);
    }

    #[test]
    fn ids_are_kept_as_ranges_that_merge() {
        let mut ids = IdSet::default();
        // Completed out of order within a window of 8 in flight.
        for base in (0..10_000u64).step_by(8) {
            for id in [3, 1, 0, 7, 2, 6, 4, 5] {
                assert!(ids.insert(base + id), "{}", base + id);
            }
        }
        assert_eq!(ids.ranges.len(), 1, "{:?}", ids.ranges);
        assert!(!ids.insert(0) && !ids.insert(9_999) && !ids.insert(4_321));
        assert!(ids.insert(10_005) && ids.insert(u64::MAX));
        assert!(!ids.insert(u64::MAX));
        assert_eq!(ids.ranges.len(), 3);
    }

    #[test]
    fn the_context_lands_in_the_report_and_warnings_come_back() {
        let mut acc = VariantAccumulator::new(&chain3(), &check(), Duration::from_secs(1));
        for r in &mixed_records() {
            acc.record(r);
        }
        let analyzed = acc.finish(VariantContext {
            measured: Duration::from_secs(2),
            warmup: WarmupCounts {
                sent: 10,
                ok: 9,
                failed: 1,
            },
            interrupted: true,
            generator_links: Some(LinkCounts {
                broken: 2,
                ..LinkCounts::default()
            }),
            incidents: vec!["hop b replica 1 exited".into()],
            broker: vec![BrokerTopicStats {
                topic: "b".into(),
                enqueued: 5,
                ..BrokerTopicStats::default()
            }],
            machine: Some(MachineSamples {
                cpus: 2,
                steal: Some(0.2),
                ..MachineSamples::default()
            }),
            ..VariantContext::default()
        });
        let r = &analyzed.report;
        assert_eq!((r.warmup.sent, r.interrupted), (10, true));
        assert_eq!(r.incidents, ["hop b replica 1 exited"]);
        assert_eq!(r.broker[0].enqueued, 5);
        assert_eq!(r.generator_links.map(|l| l.broken), Some(2));
        let instrument = r.instrument.as_ref().expect("judged");
        assert!(instrument.busy, "{instrument:?}");
        assert_eq!(analyzed.warnings.len(), 2, "{:?}", analyzed.warnings);
        assert!(analyzed.warnings[0].contains("2 call(s) on a broken connection"));
        assert!(analyzed.warnings[1].starts_with("variant base: the machine was busy"));
        // Interrupted: sending ended at the last intended send (2.5225 s,
        // after the measured phase's 2 s).
        assert_eq!(r.intervals.sending_end, 2.5225);
        assert!(r.traces.is_none(), "not traced");
    }

    #[test]
    fn no_records_give_an_empty_report() {
        let r = analyze_variant(&chain3(), &check(), &[], Duration::ZERO);
        assert_eq!((r.sent, r.ok, r.achieved_rate), (0, 0, 0.0));
        assert!(r.accounted);
        assert_eq!(r.hops[0].p_slow, None);
        assert_eq!(r.hops[0].replica_requests, [0, 0]);
        let c = r.compounding.expect("compounding requested");
        assert_eq!(c.verdict, Verdict::Inconclusive);
    }
}
