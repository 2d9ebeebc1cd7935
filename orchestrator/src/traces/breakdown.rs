//! The per-hop breakdown of each variant's traces (self time, downstream
//! time, network time, queue wait), cross-checked against the reply
//! paths the load generator measured.

use std::collections::{BTreeMap, HashMap, HashSet};

use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, Span, span::SpanKind};
use serde::Serialize;

use super::{FlatSpan, attr_int, attr_string, flatten, loadgen::SERVICE};
use crate::record::{Outcome, RequestRecord};

/// A distribution of one time, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Dist {
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Maximum.
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

/// One hop's times, from its server spans.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HopBreakdown {
    /// The hop.
    pub hop: String,
    /// Server spans seen.
    pub spans: u64,
    /// Server span minus the longest of its downstream client spans
    /// (downstream calls run in parallel).
    pub self_time: Dist,
    /// The longest downstream client span of each request.
    pub downstream: Dist,
    /// The caller's client span minus this hop's server span (and minus
    /// the broker queue wait for pull). For the entry hop the caller is the
    /// load generator, whose span starts at the intended send time.
    pub network: Dist,
    /// The broker queue-wait span (pull hops).
    pub queue_wait: Dist,
}

/// What one variant's traces show.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
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
    /// Per hop, in the order the reply path lists them.
    pub hops: Vec<HopBreakdown>,
}

fn duration(s: &Span) -> u64 {
    s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano)
}

fn is_queue_wait(s: &Span) -> bool {
    s.name.starts_with("queue wait")
}

#[derive(Default)]
struct Times {
    spans: u64,
    self_time: Vec<u64>,
    downstream: Vec<u64>,
    network: Vec<u64>,
    queue_wait: Vec<u64>,
}

/// Analyzes the spans of `variant` against its measured `records`;
/// `sampled` says which request ids were meant to be traced.
pub fn analyze(
    batches: &[ResourceSpans],
    variant: &str,
    records: &[RequestRecord],
    sampled: impl Fn(u64) -> bool,
) -> TraceReport {
    let spans: Vec<FlatSpan<'_>> = flatten(batches)
        .into_iter()
        .filter(|s| attr_string(s.span, "variant").as_deref() == Some(variant))
        .collect();
    let mut traces: HashMap<&[u8], Vec<&Span>> = HashMap::new();
    for s in &spans {
        traces
            .entry(s.span.trace_id.as_slice())
            .or_default()
            .push(s.span);
    }
    let mut report = TraceReport {
        spans: spans.len() as u64,
        traces: traces.len() as u64,
        ..TraceReport::default()
    };
    let mut by_request: HashMap<u64, &[u8]> = HashMap::new();
    for s in &spans {
        if s.service == SERVICE
            && let Some(id) = attr_int(s.span, "request_id")
        {
            by_request.insert(id as u64, s.span.trace_id.as_slice());
        }
    }
    let mut times: BTreeMap<String, Times> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for trace in traces.values() {
        let ids: HashSet<&[u8]> = trace.iter().map(|s| s.span_id.as_slice()).collect();
        report.orphan_spans += trace
            .iter()
            .filter(|s| !s.parent_span_id.is_empty() && !ids.contains(s.parent_span_id.as_slice()))
            .count() as u64;
        let by_id: HashMap<&[u8], &Span> =
            trace.iter().map(|s| (s.span_id.as_slice(), *s)).collect();
        let children = |parent: &Span| -> Vec<&Span> {
            trace
                .iter()
                .filter(|c| c.parent_span_id == parent.span_id)
                .copied()
                .collect()
        };
        for server in trace.iter().filter(|s| s.kind == SpanKind::Server as i32) {
            let Some(hop) = attr_string(server, "hop") else {
                continue;
            };
            if !times.contains_key(&hop) {
                order.push(hop.clone());
            }
            let t = times.entry(hop).or_default();
            t.spans += 1;
            let total = duration(server);
            let down = children(server)
                .iter()
                .filter(|c| c.kind == SpanKind::Client as i32)
                .map(|c| duration(c))
                .max()
                .unwrap_or(0);
            t.self_time.push(total.saturating_sub(down));
            t.downstream.push(down);
            // The caller's side: a queue-wait span (pull) then the client
            // span, or the client span directly (push).
            let mut caller = by_id.get(server.parent_span_id.as_slice()).copied();
            let mut waited = 0;
            if let Some(q) = caller.filter(|q| is_queue_wait(q)) {
                waited = duration(q);
                t.queue_wait.push(waited);
                caller = by_id.get(q.parent_span_id.as_slice()).copied();
            }
            if let Some(c) = caller {
                t.network
                    .push(duration(c).saturating_sub(waited).saturating_sub(total));
            }
        }
    }
    for record in records.iter().filter(|r| r.outcome == Outcome::Ok) {
        if !sampled(record.id) {
            continue;
        }
        report.expected += 1;
        let Some(trace) = by_request.get(&record.id).and_then(|t| traces.get(t)) else {
            report.missing += 1;
            continue;
        };
        let mut from_trace: Vec<String> = trace
            .iter()
            .filter(|s| s.kind == SpanKind::Server as i32)
            .filter_map(|s| attr_string(s, "hop"))
            .collect();
        let mut from_path: Vec<String> = record.path.iter().map(|h| h.hop.clone()).collect();
        from_trace.sort();
        from_path.sort();
        if from_trace == from_path {
            report.complete += 1;
        } else {
            report.incomplete += 1;
        }
    }
    report.hops = order
        .into_iter()
        .filter_map(|hop| {
            let t = times.remove(&hop)?;
            Some(HopBreakdown {
                hop,
                spans: t.spans,
                self_time: Dist::of(t.self_time),
                downstream: Dist::of(t.downstream),
                network: Dist::of(t.network),
                queue_wait: Dist::of(t.queue_wait),
            })
        })
        .collect();
    report.hops.sort_by(|a, b| a.hop.cmp(&b.hop));
    report
}
