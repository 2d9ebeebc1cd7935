//! One variant's records turned into its report: accounting, rates,
//! latency percentiles, per-hop statistics and the compounding check.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tailmesh_services::link::LinkCounts;

use super::compounding::{CompoundingReport, HopSlowness, SlowCounts, judge};
use super::stats::{Percentiles, micros, new_histogram, record_us};
use crate::loadgen::WarmupCounts;
use crate::record::{Outcome, RequestRecord};
use crate::scenario::{Arrivals, Check, ConnectionMode, Hop, LoadMode, Stop, Variant};

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
pub(crate) fn overrides(variant: &Variant) -> Vec<Override> {
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
}

impl LoadSummary {
    /// Describes `variant`'s load.
    pub fn of(variant: &Variant) -> LoadSummary {
        let load = &variant.load;
        let (mode, rate, arrivals, concurrency, head) = match &load.mode {
            LoadMode::Open { rate, arrivals } => {
                let a = match arrivals {
                    Arrivals::Poisson => "poisson",
                    Arrivals::Uniform => "uniform",
                };
                (
                    "open",
                    Some(*rate),
                    Some(a),
                    None,
                    format!("open {rate}/s {a}"),
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
            description: format!("{head}, {stop}"),
        }
    }
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
    /// The load.
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
    /// Whether the run was cut short (Ctrl-C) while this variant ran.
    pub interrupted: bool,
    /// What happened to the load generator's own connections: opened,
    /// closed, and calls ended by the transport (GOAWAY received or sent,
    /// a stream reset by the peer, a broken connection). Absent through
    /// RabbitMQ or NATS, whose clients do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator_links: Option<LinkCounts>,
    /// What went wrong around the measurement (a hop process that died...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<String>,
    /// The broker's per-topic statistics (queue depth, waits, redeliveries)
    /// when hops are reached by pull; queue wait values are in ns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker: Vec<tailmesh_services::broker::TopicStats>,
    /// The peak resident memory of each process of the variant (hops, the
    /// broker) and of the orchestrator, when the load ended (absent when
    /// attached to containers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peak_memory: Vec<crate::launcher::PeakMemory>,
    /// Network faults applied, each with its mechanism (netem or nftables)
    /// and the packets its rules or qdiscs saw and dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<tailmesh_netfault::FaultRecord>,
    /// Why the slow requests were slow: counts per cause (absent in
    /// summaries from before attribution).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<super::attribution::AttributionReport>,
    /// The load generator watching itself and the machine while the
    /// variant ran (absent when read back from an older summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instrument: Option<crate::loadgen::selfwatch::InstrumentReport>,
    /// The per-hop breakdown from the traces and its cross-check against
    /// the reply paths (absent when tracing was off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<crate::traces::breakdown::TraceReport>,
    /// End-to-end latency histogram (µs, intended send time, ok only).
    /// Not in summary.json: rebuilt from requests.csv when read back.
    #[serde(skip, default = "super::stats::new_histogram")]
    pub latency_histogram: Histogram<u64>,
}

/// Accumulates one hop's statistics.
struct HopAcc {
    requests: u64,
    slow: u64,
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
            requests: 0,
            slow: 0,
            replicas: vec![0; replicas as usize],
            service: new_histogram(),
            total: new_histogram(),
            queue_wait: new_histogram(),
            errors: BTreeMap::new(),
            error_samples: Vec::new(),
        }
    }

    fn into_report(self, hop: &Hop) -> HopReport {
        HopReport {
            hop: hop.name.clone(),
            transport: hop.transport.as_str().to_string(),
            replicas: hop.replicas,
            requests: self.requests,
            slow: self.slow,
            p_slow: (self.requests > 0).then(|| self.slow as f64 / self.requests as f64),
            declared_p_slow: declared_p(hop),
            replica_requests: self.replicas,
            service: Percentiles::from_histogram(&self.service),
            total: Percentiles::from_histogram(&self.total),
            queue_wait: Percentiles::from_histogram(&self.queue_wait),
            errors: self.errors,
            error_samples: self.error_samples,
        }
    }
}

/// The declared per-request slow probability of a hop (0 without `slow`).
pub(crate) fn declared_p(hop: &Hop) -> f64 {
    hop.slow.as_ref().map_or(0.0, |s| s.probability)
}

/// The longest a hop's work should take: the 99.99th percentile of its
/// declared sleep (times a slow replica's factor); `None` for CPU-bound
/// work, whose time depends on the machine.
pub(crate) fn work_bound(hop: &Hop) -> Option<Duration> {
    use tailmesh_services::model::{DurationDist, Work};
    let bound = match &hop.work {
        Work::None => Duration::ZERO,
        Work::Cpu { .. } => return None,
        Work::Sleep { dist } => match dist {
            DurationDist::Fixed { value } => *value,
            DurationDist::Uniform { max, .. } => *max,
            // -ln(1e-4) = 9.21 means.
            DurationDist::Exp { mean } => mean.mul_f64(9.21),
            // exp(mu + 3.72 sigma) with mu = ln(mean) - sigma^2 / 2.
            DurationDist::Lognormal { mean, sigma } => {
                mean.mul_f64((3.72 * sigma - sigma * sigma / 2.0).exp().min(1e6))
            }
        },
    };
    let factor = hop.replica_slow.as_ref().map_or(1.0, |r| r.factor.max(1.0));
    Some(bound.mul_f64(factor))
}

/// The innermost hop named in an error message (`... hop "b" ...`).
fn blamed_hop(message: &str) -> Option<&str> {
    let start = message.rfind("hop \"")? + "hop \"".len();
    let len = message[start..].find('"')?;
    Some(&message[start..start + len])
}

/// Analyzes one variant's measured records. `measured` is the length of the
/// measured phase (for rates). Pure: same input, same report.
pub(crate) fn analyze_variant(
    variant: &Variant,
    check: &Check,
    records: &[RequestRecord],
    measured: Duration,
) -> VariantReport {
    let mut latency = new_histogram();
    let mut uncorrected = new_histogram();
    let mut lateness = new_histogram();
    let mut hops: Vec<HopAcc> = variant
        .hops
        .iter()
        .map(|h| HopAcc::new(h.replicas))
        .collect();
    let index: BTreeMap<&str, usize> = variant
        .hops
        .iter()
        .enumerate()
        .map(|(i, h)| (h.name.as_str(), i))
        .collect();
    let mut unknown_hops = BTreeMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = HashSet::with_capacity(records.len());
    let (mut ok, mut timeouts, mut duplicate_ids) = (0u64, 0u64, 0u64);
    let mut counts = SlowCounts::default();

    for r in records {
        if !seen.insert(r.id) {
            duplicate_ids += 1;
        }
        record_us(&mut lateness, micros(r.start.saturating_sub(r.intended)));
        let slow = r.latency() > check.slow_threshold;
        match &r.outcome {
            Outcome::Ok => {
                ok += 1;
                record_us(&mut latency, micros(r.latency()));
                record_us(&mut uncorrected, micros(r.service_latency()));
                counts.n += 1;
                counts.slow += u64::from(slow);
                for h in &r.path {
                    let Some(&i) = index.get(h.hop.as_str()) else {
                        *unknown_hops.entry(h.hop.clone()).or_insert(0) += 1;
                        continue;
                    };
                    let acc = &mut hops[i];
                    acc.requests += 1;
                    acc.slow += u64::from(h.slow);
                    let replica = h.replica as usize;
                    if acc.replicas.len() <= replica {
                        acc.replicas.resize(replica + 1, 0);
                    }
                    acc.replicas[replica] += 1;
                    record_us(&mut acc.service, h.service_ns / 1_000);
                    record_us(&mut acc.total, h.total_ns / 1_000);
                    record_us(&mut acc.queue_wait, h.queue_wait_ns / 1_000);
                }
            }
            Outcome::Timeout => {
                timeouts += 1;
                if slow {
                    counts.n += 1;
                    counts.slow += 1;
                } else {
                    counts.timeouts_censored += 1;
                }
            }
            Outcome::Error { message, .. } => {
                let label = r.outcome.label();
                *errors.entry(label.clone()).or_insert(0) += 1;
                counts.errors_excluded += 1;
                if let Some(acc) = blamed_hop(message)
                    .and_then(|h| index.get(h))
                    .map(|&i| &mut hops[i])
                {
                    *acc.errors.entry(label.clone()).or_insert(0) += 1;
                    if acc.error_samples.len() < ERROR_SAMPLES {
                        acc.error_samples.push(message.clone());
                    }
                }
            }
        }
    }

    let sent = records.len() as u64;
    let error_total: u64 = errors.values().sum();
    // Retries and hedges: the load generator's, and every hop's recorded in
    // the paths (failed requests carry no path, so theirs are not seen).
    let extra_attempts: u64 = records
        .iter()
        .map(|r| {
            u64::from(r.extra_attempts)
                + r.path
                    .iter()
                    .map(|h| u64::from(h.extra_attempts))
                    .sum::<u64>()
        })
        .sum();
    let calls = sent
        + records
            .iter()
            .map(|r| r.path.len().saturating_sub(1) as u64)
            .sum::<u64>();
    let secs = measured.as_secs_f64();
    let per_sec = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let hop_reports: Vec<HopReport> = hops
        .into_iter()
        .zip(&variant.hops)
        .map(|(acc, hop)| acc.into_report(hop))
        .collect();
    let compounding = check.compounding.then(|| {
        let slowness = hop_reports
            .iter()
            .map(|h| HopSlowness {
                hop: h.hop.clone(),
                requests: h.requests,
                slow: h.slow,
                p: h.p_slow.unwrap_or(0.0),
                declared_p: h.declared_p_slow,
            })
            .collect();
        judge(counts, slowness, micros(check.slow_threshold))
    });

    VariantReport {
        name: variant.name.clone(),
        overrides: overrides(variant),
        transport: transport_summary(&variant.hops).to_string(),
        load: LoadSummary::of(variant),
        measured_s: secs,
        sent,
        extra_attempts,
        extra_load: if calls > 0 {
            extra_attempts as f64 / calls as f64
        } else {
            0.0
        },
        ok,
        timeouts,
        errors,
        duplicate_ids,
        accounted: sent == ok + error_total + timeouts && duplicate_ids == 0,
        achieved_rate: per_sec(sent),
        ok_rate: per_sec(ok),
        latency: Percentiles::from_histogram(&latency),
        latency_uncorrected: Percentiles::from_histogram(&uncorrected),
        lateness: Percentiles::from_histogram(&lateness),
        hops: hop_reports,
        unknown_hops,
        compounding,
        warmup: WarmupCounts::default(),
        interrupted: false,
        generator_links: None,
        incidents: Vec::new(),
        broker: Vec::new(),
        peak_memory: Vec::new(),
        faults: Vec::new(),
        attribution: Some(super::attribution::summarize(
            records,
            check.slow_threshold,
            &variant
                .hops
                .iter()
                .filter_map(|h| Some((h.name.clone(), work_bound(h)?)))
                .collect(),
        )),
        instrument: None,
        traces: None,
        latency_histogram: latency,
    }
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
    use crate::analysis::compounding::Verdict;
    use crate::analysis::testing::{chain3, check, failed, mixed_records, ok_records};

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
