//! What a run's traces showed, as summary.json holds it: the receiver's
//! counts, each variant's per-hop breakdown checked against the reply
//! paths, and what the tail sampler kept. The orchestrator's `traces`
//! module builds these from the spans; the analysis and the report read
//! them.

use serde::{Deserialize, Serialize};

/// What the receiver and the forwarder counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceCounts {
    /// Spans received and kept (spooled).
    pub spans: u64,
    /// Spans dropped because the spool was full or could not be written.
    pub dropped: u64,
    /// Batches rejected as malformed.
    pub rejected_batches: u64,
    /// Spans delivered to the forward target.
    pub forwarded: u64,
    /// Spans that could not be forwarded (queue full, target unreachable
    /// or too slow).
    pub forward_dropped: u64,
}

/// A distribution of one time, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub mean_us: f64,
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    pub max_us: f64,
}

impl Dist {
    /// The distribution of `values` (ns); zeros when empty.
    pub fn of(mut values: Vec<u64>) -> Self {
        if values.is_empty() {
            return Dist::default();
        }
        values.sort_unstable();
        let at = |q: f64| {
            let i = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
            values[i] as f64 / 1_000.0
        };
        Dist {
            mean_us: values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64 / 1_000.0,
            p50_us: at(0.50),
            p99_us: at(0.99),
            max_us: at(1.0),
        }
    }
}

/// One hop's times, from its server spans in the measured requests'
/// traces.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HopBreakdown {
    pub hop: String,
    /// Server spans seen.
    pub spans: u64,
    /// Server span minus the longest of its downstream client spans
    /// (downstream calls run in parallel) and minus its wait for a slot.
    pub self_time: Dist,
    /// The longest downstream client span of each request.
    pub downstream: Dist,
    /// The caller's client span minus this hop's server span (and minus
    /// the broker queue wait for pull). For the entry hop the caller is the
    /// load generator, whose span starts at the intended send time.
    pub network: Dist,
    /// The broker queue-wait span (pull hops) plus the wait for a slot in
    /// the replica (hops with limited concurrency).
    pub queue_wait: Dist,
}

/// The processes' holds of their spans over one variant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeldTraces {
    /// How long a trace's spans waited for its decision, ms.
    pub hold_ms: f64,
    /// Spans evicted unsent (traces not kept: their whole cost).
    pub evicted_spans: u64,
    /// Of those, spans the receiver held and evicted: sent by processes
    /// that do not hold their own (a real service's SDK).
    #[serde(default)]
    pub evicted_at_receiver: u64,
    /// The longest a lost trace's decision came after its first span,
    /// ms: a hold that long would have kept it.
    pub lost_delay_ms: f64,
    /// Decisions the run had forgotten when a process asked for them.
    pub forgotten_decisions: u64,
}

/// What one variant's traces show.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceReport {
    /// Spans of this variant.
    pub spans: u64,
    /// Traces (distinct trace ids).
    pub traces: u64,
    /// Measured ok requests that should have a trace (sampled).
    pub expected: u64,
    /// Of those, traces whose server spans match the reply path hop for hop.
    pub complete: u64,
    /// Expected traces not found (no load-generator span with that id).
    pub missing: u64,
    /// Traces found whose server spans disagree with the reply path
    /// (count or hops).
    pub incomplete: u64,
    /// Spans whose parent is not in their trace.
    pub orphan_spans: u64,
    /// Hop records of complete traces whose server span's duration differs
    /// from the reply path's `total_ns` for that hop and replica by more
    /// than [`TIMING_TOLERANCE_NS`] (both time the same handler).
    pub timing_disagreements: u64,
    /// Kept traces lost: the processes that held their spans had evicted
    /// them before the keep decision came (see `held`).
    #[serde(default)]
    pub lost: u64,
    /// What the processes' holds did, when they held their spans until
    /// the run's keep decisions (retroactive sampling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldTraces>,
    /// Per hop, in the order the reply path lists them.
    pub hops: Vec<HopBreakdown>,
    /// What the tail sampler kept and dropped (absent in runs before it
    /// existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<TailCounts>,
    /// Per hop, its spans in the sampled ok requests' traces against
    /// their reply paths (for the warning; not written).
    #[serde(skip)]
    pub coverage: Vec<HopCoverage>,
}

/// What the tail sampler (the orchestrator's `traces::tail`) decided over one variant's traced requests, by
/// reason (each request counted once, under its first reason).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TailCounts {
    /// The share of the other traced requests kept.
    pub keep_share: f64,
    /// Measured requests that were traced (head sampling).
    pub traced: u64,
    /// Kept: failed (errors and timeouts).
    pub kept_failed: u64,
    /// Kept: slower than the check's threshold.
    pub kept_slow: u64,
    /// Kept: an extra attempt (retry or hedge) at some hop.
    pub kept_retried: u64,
    /// Kept: in the uniform share.
    pub kept_sampled: u64,
    /// Not kept.
    pub dropped: u64,
    /// Traces written to the Jaeger file(s): the kept ones that arrived,
    /// and warmup's when every trace is kept.
    pub written: u64,
    /// Jaeger files the run's kept traces fill (the same for every variant).
    pub files: u64,
}

impl TailCounts {
    /// Requests kept, all reasons.
    pub fn kept(&self) -> u64 {
        self.kept_failed + self.kept_slow + self.kept_retried + self.kept_sampled
    }
}

/// How many of the sampled ok requests through one hop have its spans.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HopCoverage {
    pub hop: String,
    /// Sampled ok requests whose reply path passes through it.
    pub expected: u64,
    /// Of those, the ones whose trace has its server span.
    pub server_spans: u64,
    /// Of those, the ones whose trace has the broker's queue-wait span
    /// for it (pull hops only).
    pub queue_waits: u64,
}

/// Below this share of complete traces among a variant's sampled ok
/// requests, the run warns.
pub const COMPLETE_WARN_SHARE: f64 = 0.9;

/// The warning for a variant with fewer than [`COMPLETE_WARN_SHARE`] of
/// its sampled ok requests traced completely, naming the services whose
/// spans fall short of the requests that passed through them (`pulled`
/// says which hops are reached through the broker); `None` otherwise.
pub fn completeness_warning(
    variant: &str,
    report: &TraceReport,
    pulled: impl Fn(&str) -> bool,
) -> Option<String> {
    if report.expected == 0
        || report.complete as f64 >= COMPLETE_WARN_SHARE * report.expected as f64
    {
        return None;
    }
    let mut services: Vec<String> = Vec::new();
    let mut broker = false;
    for c in &report.coverage {
        if c.server_spans < c.expected {
            services.push(format!(
                "hop-{} ({} of {})",
                c.hop, c.server_spans, c.expected
            ));
        }
        if pulled(&c.hop) && c.queue_waits < c.expected {
            broker = true;
        }
    }
    if broker {
        services.push("broker".to_string());
    }
    let whose = if services.is_empty() {
        "every service sent its spans, but they do not match the reply paths".to_string()
    } else {
        format!("spans missing from {}", services.join(", "))
    };
    Some(format!(
        "variant {variant}: only {} of {} sampled ok requests have complete traces ({:.1} %); {whose}",
        report.complete,
        report.expected,
        report.complete as f64 * 100.0 / report.expected as f64
    ))
}

/// How far a server span and its path record may differ.
pub const TIMING_TOLERANCE_NS: u64 = 1_000_000;
