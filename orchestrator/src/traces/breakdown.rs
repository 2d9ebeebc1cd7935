//! The per-hop breakdown of each variant (self time, downstream time,
//! network time, queue wait) and the traces cross-checked against the
//! reply paths the load generator measured. An ok request's hop times
//! come from its reply path ([`PathTimes`], every request, whether its
//! trace was kept or its spans were ever sent); a failed one has no path,
//! so its hop times come from its trace's spans, when the trace arrived.
//! The traces are taken one whole trace at a time ([`TraceAnalyzer`]),
//! into histograms and counters.

use std::collections::{BTreeMap, HashMap, HashSet};

#[cfg(test)]
use opentelemetry_proto::tonic::trace::v1::ResourceSpans;
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};

#[cfg(test)]
use super::flatten;
use super::{FlatSpan, loadgen::SERVICE};
use crate::record::{Outcome, RequestRecord};

pub use tailmesh_analysis::traces::{
    COMPLETE_WARN_SHARE, Dist, HopBreakdown, HopCoverage, TIMING_TOLERANCE_NS, TailCounts,
    TraceReport, completeness_warning,
};

fn duration(s: &Span) -> u64 {
    s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano)
}

fn is_queue_wait(s: &Span) -> bool {
    s.name.starts_with("queue wait")
}

/// One time's distribution as it accumulates: a histogram (3 significant
/// digits) with the exact sum and maximum.
struct DistAcc {
    histogram: hdrhistogram::Histogram<u64>,
    sum: f64,
    max: u64,
}

impl Default for DistAcc {
    fn default() -> Self {
        DistAcc {
            histogram: hdrhistogram::Histogram::new(3)
                .unwrap_or_else(|_| unreachable!("3 significant digits is a valid precision")),
            sum: 0.0,
            max: 0,
        }
    }
}

impl DistAcc {
    fn push(&mut self, ns: u64) {
        // An auto-resizing histogram takes any value.
        let _ = self.histogram.record(ns);
        self.sum += ns as f64;
        self.max = self.max.max(ns);
    }

    fn merge(&mut self, other: DistAcc) {
        // An auto-resizing histogram takes any other.
        let _ = self.histogram.add(&other.histogram);
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    fn finish(&self) -> Dist {
        let n = self.histogram.len();
        if n == 0 {
            return Dist::default();
        }
        let at = |q: f64| {
            let h = &self.histogram;
            h.lowest_equivalent(h.value_at_quantile(q)) as f64 / 1_000.0
        };
        Dist {
            mean_us: self.sum / n as f64 / 1_000.0,
            p50_us: at(0.50),
            p99_us: at(0.99),
            max_us: self.max as f64 / 1_000.0,
        }
    }
}

/// Each ok request's hop times from its reply path, as the spans would
/// give them: a hop's self time is its total less its calls (its stages'
/// time) and its wait for a slot; downstream its calls' time; queue wait
/// its wait in the broker and for a slot (hops that can wait: pulled, or
/// with limited concurrency); network its caller's time for the call
/// (the load generator's from the intended send time, for the entry)
/// less its total and its broker wait.
#[derive(Default)]
pub struct PathTimes {
    times: BTreeMap<String, Times>,
    /// The hops whose requests can wait (pulled, or with limited
    /// concurrency).
    queued: HashSet<String>,
    /// [`CallTimes`]'s buffers, kept between requests: the load
    /// generator's thread records every request here.
    calls: CallTimes,
}

impl PathTimes {
    /// For `variant`'s hops.
    pub fn new(variant: &tailmesh_model::scenario::Variant) -> Self {
        PathTimes {
            times: BTreeMap::new(),
            queued: variant
                .hops
                .iter()
                .filter(|h| {
                    h.transport == tailmesh_model::Transport::Pull || h.concurrency.is_some()
                })
                .map(|h| h.name.clone())
                .collect(),
            calls: CallTimes::default(),
        }
    }

    /// Adds an ok request's hop times; a failed one has no path.
    pub fn record(&mut self, r: &RequestRecord) {
        if r.outcome != Outcome::Ok || r.path.is_empty() {
            return;
        }
        self.calls.of(r);
        for (h, &call) in r.path.iter().zip(&self.calls.out) {
            if !super::has_server_span(h) {
                continue;
            }
            let t = match self.times.get_mut(h.hop.as_str()) {
                Some(t) => t,
                None => self.times.entry(h.hop.clone()).or_default(),
            };
            t.spans += 1;
            let down = if h.downstream_ns > 0 {
                h.downstream_ns
            } else {
                h.calls.iter().map(|c| c.call_ns).max().unwrap_or(0)
            };
            let in_line = h.slot_wait_ns.min(h.total_ns.saturating_sub(down));
            t.self_time
                .push(h.total_ns.saturating_sub(down).saturating_sub(in_line));
            t.downstream.push(down);
            let broker = h.queue_wait_ns.saturating_sub(h.slot_wait_ns);
            if self.queued.contains(&h.hop) {
                t.queue_wait.push(h.queue_wait_ns);
            }
            if let Some(call) = call {
                t.network
                    .push(call.saturating_sub(broker).saturating_sub(h.total_ns));
            }
        }
    }
}

/// Per record of a request's path, its caller's time for the call into
/// it: the records come in post order (a hop's callees', then its own;
/// the entry's last) and each record times its calls in order, so each
/// takes the last finished subtrees as its callees. `None` where the path
/// does not read that way.
#[derive(Default)]
struct CallTimes {
    out: Vec<Option<u64>>,
    roots: Vec<usize>,
}

impl CallTimes {
    /// Fills `out` for `r`.
    fn of(&mut self, r: &RequestRecord) {
        self.out.clear();
        self.out.resize(r.path.len(), None);
        self.roots.clear();
        if !self.read(r) {
            self.out.fill(None);
        }
    }

    fn read(&mut self, r: &RequestRecord) -> bool {
        let roots = &mut self.roots;
        for (i, h) in r.path.iter().enumerate() {
            let Some(first) = roots.len().checked_sub(h.calls.len()) else {
                return false;
            };
            for (timing, &child) in h.calls.iter().zip(&roots[first..]) {
                if r.path[child].hop != timing.hop {
                    return false;
                }
                self.out[child] = Some(timing.call_ns);
            }
            roots.truncate(first);
            roots.push(i);
        }
        if let [entry] = roots[..] {
            self.out[entry] = Some(u64::try_from(r.latency().as_nanos()).unwrap_or(u64::MAX));
        }
        true
    }
}

#[derive(Default)]
struct Times {
    spans: u64,
    self_time: DistAcc,
    downstream: DistAcc,
    network: DistAcc,
    queue_wait: DistAcc,
}

/// What the load generator measured of one request, as the cross-check
/// needs it (kept by the tail sampler, not as a whole record).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestFacts {
    /// Answered ok.
    pub ok: bool,
    /// Its trace was meant to exist (head sampling).
    pub sampled: bool,
    /// Its reply path: each hop with the replica and the hop's total time.
    pub path: Vec<PathHop>,
}

/// One hop of a reply path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PathHop {
    pub hop: String,
    pub replica: u32,
    pub total_ns: u64,
}

impl RequestFacts {
    /// The facts of `record`; `sampled`: whether it was traced.
    pub fn of(record: &RequestRecord, sampled: bool) -> Self {
        RequestFacts {
            ok: record.outcome == Outcome::Ok,
            sampled,
            // What the trace can hold: a directly called service's
            // record has no span to check.
            path: record
                .path
                .iter()
                .filter(|h| super::has_server_span(h))
                .map(|h| PathHop {
                    hop: h.hop.clone(),
                    replica: h.replica,
                    total_ns: h.total_ns,
                })
                .collect(),
        }
    }

    /// Whether its trace is expected and checked against its path: a
    /// sampled ok request.
    pub fn expected(&self) -> bool {
        self.ok && self.sampled
    }
}

/// Builds a variant's [`TraceReport`] one whole trace at a time, keeping
/// histograms and counters only.
pub struct TraceAnalyzer {
    report: TraceReport,
    times: BTreeMap<String, Times>,
    coverage: BTreeMap<String, HopCoverage>,
    /// Expected requests whose trace was found.
    found: u64,
}

impl Default for TraceAnalyzer {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceAnalyzer {
    /// Nothing seen yet.
    pub fn new() -> Self {
        TraceAnalyzer {
            report: TraceReport::default(),
            times: BTreeMap::new(),
            coverage: BTreeMap::new(),
            found: 0,
        }
    }

    /// Counts one request whose trace is expected ([`RequestFacts::expected`])
    /// passing through `hops`.
    pub fn expect<'h>(&mut self, hops: impl IntoIterator<Item = &'h str>) {
        self.report.expected += 1;
        for hop in hops {
            self.coverage_of(hop).expected += 1;
        }
    }

    /// Adds `n` expected requests through `hop` at once (the tail sampler
    /// counts them as they end); `requests` expected requests in all.
    pub fn expect_counted(
        &mut self,
        requests: u64,
        per_hop: impl IntoIterator<Item = (String, u64)>,
    ) {
        self.report.expected += requests;
        for (hop, n) in per_hop {
            self.coverage_of(&hop).expected += n;
        }
    }

    fn coverage_of(&mut self, hop: &str) -> &mut HopCoverage {
        self.coverage.entry(hop.to_owned()).or_default()
    }

    /// Takes one whole trace of this variant; `facts`: what the load
    /// generator measured of its request, when it was a measured one.
    pub fn trace(&mut self, trace: &[FlatSpan<'_>], facts: Option<&RequestFacts>) {
        let report = &mut self.report;
        report.spans += trace.len() as u64;
        report.traces += 1;
        let ids: HashSet<&[u8]> = trace.iter().map(|s| s.span.span_id.as_slice()).collect();
        report.orphan_spans += trace
            .iter()
            .map(|s| s.span)
            .filter(|s| !s.parent_span_id.is_empty() && !ids.contains(s.parent_span_id.as_slice()))
            .count() as u64;
        // Hop times come from the measured requests' traces only (not
        // warmup's), and an ok one's from its path ([`PathTimes`]).
        let Some(facts) = facts else {
            return;
        };
        if !facts.ok {
            self.hop_times(trace);
        }
        if facts.expected() {
            self.found += 1;
            self.cross_check(trace, facts);
        }
    }

    fn hop_times(&mut self, trace: &[FlatSpan<'_>]) {
        let by_id: HashMap<&[u8], &Span> = trace
            .iter()
            .map(|s| (s.span.span_id.as_slice(), s.span))
            .collect();
        let children = |parent: &Span| -> Vec<&Span> {
            trace
                .iter()
                .map(|c| c.span)
                .filter(|c| c.parent_span_id == parent.span_id)
                .collect()
        };
        for flat in trace
            .iter()
            .filter(|s| s.span.kind == SpanKind::Server as i32)
        {
            let server = flat.span;
            let Some(hop) = flat.attr_string("hop") else {
                continue;
            };
            let t = self.times.entry(hop).or_default();
            t.spans += 1;
            let total = duration(server);
            let down = children(server)
                .iter()
                .filter(|c| c.kind == SpanKind::Client as i32)
                .map(|c| duration(c))
                .max()
                .unwrap_or(0);
            // A replica with limited concurrency says how long the request
            // waited in its span for a slot: queue wait, not its own time.
            let slot_wait = flat
                .attr_int("slot_wait_ns")
                .map(|n| u64::try_from(n).unwrap_or(0));
            let in_line = slot_wait.unwrap_or(0).min(total.saturating_sub(down));
            t.self_time
                .push(total.saturating_sub(down).saturating_sub(in_line));
            t.downstream.push(down);
            // The caller's side: a queue-wait span (pull) then the client
            // span, or the client span directly (push).
            let mut caller = by_id.get(server.parent_span_id.as_slice()).copied();
            let mut waited = 0;
            let broker_wait = caller.filter(|q| is_queue_wait(q));
            if let Some(q) = broker_wait {
                waited = duration(q);
                caller = by_id.get(q.parent_span_id.as_slice()).copied();
            }
            if broker_wait.is_some() || slot_wait.is_some() {
                t.queue_wait.push(waited + in_line);
            }
            if let Some(c) = caller {
                t.network
                    .push(duration(c).saturating_sub(waited).saturating_sub(total));
            }
        }
    }

    fn cross_check(&mut self, trace: &[FlatSpan<'_>], facts: &RequestFacts) {
        let is_server = |s: &FlatSpan<'_>| s.span.kind == SpanKind::Server as i32;
        for rec in &facts.path {
            let has_server = trace
                .iter()
                .any(|s| is_server(s) && s.attr_string("hop").as_deref() == Some(rec.hop.as_str()));
            // The broker names its span after the topic, which is the hop.
            let queue_wait = format!("queue wait {}", rec.hop);
            let has_queue_wait = trace.iter().any(|s| s.span.name == queue_wait);
            let c = self.coverage_of(&rec.hop);
            c.server_spans += u64::from(has_server);
            c.queue_waits += u64::from(has_queue_wait);
        }
        let mut from_trace: Vec<String> = trace
            .iter()
            .filter(|s| is_server(s))
            .filter_map(|s| s.attr_string("hop"))
            .collect();
        let mut from_path: Vec<&str> = facts.path.iter().map(|h| h.hop.as_str()).collect();
        from_trace.sort();
        from_path.sort_unstable();
        if from_trace == from_path {
            self.report.complete += 1;
            // Each path hop against a server span of its own: a hop
            // visited more than once has a span per visit, and each visit
            // takes the one closest to its time not taken yet.
            let mut taken = vec![false; trace.len()];
            for rec in &facts.path {
                let span = trace
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| {
                        !taken[*i]
                            && is_server(s)
                            && s.attr_string("hop").as_deref() == Some(rec.hop.as_str())
                            && s.attr_int("replica") == Some(i64::from(rec.replica))
                    })
                    .min_by_key(|(_, s)| duration(s.span).abs_diff(rec.total_ns));
                if let Some((i, _)) = span {
                    taken[i] = true;
                }
                let agrees = span.is_some_and(|(_, s)| {
                    duration(s.span).abs_diff(rec.total_ns) <= TIMING_TOLERANCE_NS
                });
                if !agrees {
                    self.report.timing_disagreements += 1;
                }
            }
        } else {
            self.report.incomplete += 1;
        }
    }

    /// Adds the ok requests' hop times from their paths.
    pub fn path_times(&mut self, paths: PathTimes) {
        for (hop, t) in paths.times {
            let mine = self.times.entry(hop).or_default();
            mine.spans += t.spans;
            for (to, from) in [
                (&mut mine.self_time, t.self_time),
                (&mut mine.downstream, t.downstream),
                (&mut mine.network, t.network),
                (&mut mine.queue_wait, t.queue_wait),
            ] {
                to.merge(from);
            }
        }
    }

    /// The finished report, hops by name (callers put them in their
    /// scenario's order).
    pub fn finish(self) -> TraceReport {
        let mut report = self.report;
        report.missing = report.expected.saturating_sub(self.found);
        report.hops = self
            .times
            .into_iter()
            .map(|(hop, t)| HopBreakdown {
                hop,
                spans: t.spans,
                self_time: t.self_time.finish(),
                downstream: t.downstream.finish(),
                network: t.network.finish(),
                queue_wait: t.queue_wait.finish(),
            })
            .collect();
        report.coverage = self
            .coverage
            .into_iter()
            .map(|(hop, c)| HopCoverage { hop, ..c })
            .collect();
        report
    }
}

/// The request id of a trace: the one its load-generator span names.
pub fn request_id(trace: &[FlatSpan<'_>]) -> Option<u64> {
    trace
        .iter()
        .filter(|s| s.service == SERVICE)
        .find_map(|s| s.attr_int("request_id"))
        .and_then(|id| u64::try_from(id).ok())
}

/// Analyzes the spans of `variant` against its measured `records` held in
/// memory; `sampled` says which request ids were meant to be traced. The
/// known-answer form of what a run does streaming (`sift`).
#[cfg(test)]
pub fn analyze(
    batches: &[ResourceSpans],
    variant: &str,
    records: &[RequestRecord],
    sampled: impl Fn(u64) -> bool,
) -> TraceReport {
    let mut traces: BTreeMap<&[u8], Vec<FlatSpan<'_>>> = BTreeMap::new();
    for s in flatten(batches)
        .into_iter()
        .filter(|s| s.attr_string("variant").as_deref() == Some(variant))
    {
        traces
            .entry(s.span.trace_id.as_slice())
            .or_default()
            .push(s);
    }
    let facts: HashMap<u64, RequestFacts> = records
        .iter()
        .map(|r| (r.id, RequestFacts::of(r, sampled(r.id))))
        .collect();
    let mut analyzer = TraceAnalyzer::new();
    for r in records {
        let f = &facts[&r.id];
        if f.expected() {
            analyzer.expect(f.path.iter().map(|h| h.hop.as_str()));
        }
    }
    for trace in traces.values() {
        let f = request_id(trace).and_then(|id| facts.get(&id));
        analyzer.trace(trace, f);
    }
    analyzer.finish()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::record::HopRecord;
    use opentelemetry_proto::tonic::{
        common::v1::{AnyValue, KeyValue, any_value::Value},
        resource::v1::Resource,
        trace::v1::ScopeSpans,
    };

    use super::*;

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    /// A span of the test trace: id `id`, parent `parent` (0: none), from
    /// `start` to `end` ns, of hop `hop`.
    fn span(
        id: u8,
        parent: u8,
        name: &str,
        kind: SpanKind,
        hop: &str,
        start: u64,
        end: u64,
    ) -> Span {
        let mut attributes = vec![
            kv("variant", Value::StringValue("v".into())),
            kv("hop", Value::StringValue(hop.into())),
            kv("replica", Value::IntValue(0)),
        ];
        if hop == SERVICE {
            attributes.push(kv("request_id", Value::IntValue(7)));
        }
        Span {
            trace_id: vec![9; 16],
            span_id: vec![id; 8],
            parent_span_id: if parent == 0 {
                Vec::new()
            } else {
                vec![parent; 8]
            },
            name: name.into(),
            kind: kind as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes,
            ..Span::default()
        }
    }

    fn batch(spans: Vec<Span>) -> Vec<ResourceSpans> {
        vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", Value::StringValue(SERVICE.into()))],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }]
    }

    /// Request 7 with `hops` in its path, each having taken `total_ns`.
    fn record_timed(hops: &[&str], total_ns: u64) -> RequestRecord {
        let mut r = record(hops);
        for h in &mut r.path {
            h.total_ns = total_ns;
        }
        r
    }

    fn record(hops: &[&str]) -> RequestRecord {
        RequestRecord {
            id: 7,
            intended: Duration::ZERO,
            start: Duration::ZERO,
            end: Duration::from_micros(10),
            outcome: Outcome::Ok,
            path: hops
                .iter()
                .map(|h| HopRecord {
                    hop: (*h).into(),
                    ..HopRecord::default()
                })
                .collect(),
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    #[test]
    fn known_trace_gives_known_self_downstream_network_and_queue_times() {
        let spans = vec![
            span(1, 0, "request 7", SpanKind::Client, SERVICE, 1_000, 11_000),
            span(2, 1, "a", SpanKind::Server, "a", 2_000, 10_000),
            span(3, 2, "a -> b", SpanKind::Client, "a", 3_000, 9_000),
            span(4, 3, "queue wait b", SpanKind::Internal, "b", 3_500, 4_500),
            span(5, 4, "b", SpanKind::Server, "b", 5_000, 8_000),
        ];
        let r = analyze(&batch(spans.clone()), "v", &[record(&["b", "a"])], |_| true);
        assert_eq!((r.spans, r.traces, r.expected, r.complete), (5, 1, 1, 1));
        assert_eq!((r.missing, r.incomplete, r.orphan_spans), (0, 0, 0));
        // The path said 0 ns at both hops; the spans say 8 us and 3 us:
        // within the tolerance. 5 ms is not.
        assert_eq!(r.timing_disagreements, 0);
        let late = analyze(
            &batch(spans.clone()),
            "v",
            &[record_timed(&["b", "a"], 5_000_000)],
            |_| true,
        );
        assert_eq!(late.timing_disagreements, 2);
        // The spans' times, for a request without a path (an ok one's
        // come from its path).
        let mut timed_out = record(&[]);
        timed_out.outcome = Outcome::Timeout;
        let t = analyze(&batch(spans), "v", &[timed_out], |_| true);
        let a = &t.hops[0];
        assert_eq!(a.hop, "a");
        assert_eq!(a.self_time.p50_us, 2.0);
        assert_eq!(a.downstream.p50_us, 6.0);
        assert_eq!(a.network.p50_us, 2.0);
        assert_eq!(a.queue_wait, Dist::default());
        let b = &t.hops[1];
        assert_eq!(b.self_time.p50_us, 3.0);
        assert_eq!(b.downstream.p50_us, 0.0);
        assert_eq!(b.queue_wait.p50_us, 1.0);
        assert_eq!(b.network.p50_us, 2.0);
        assert_eq!(
            r.coverage,
            [
                HopCoverage {
                    hop: "a".into(),
                    expected: 1,
                    server_spans: 1,
                    queue_waits: 0
                },
                HopCoverage {
                    hop: "b".into(),
                    expected: 1,
                    server_spans: 1,
                    queue_waits: 1
                },
            ]
        );
        // A trace of no measured request (warmup) adds no hop times.
        let warmup = vec![span(1, 0, "request 7", SpanKind::Client, SERVICE, 0, 9)];
        assert!(analyze(&batch(warmup), "v", &[], |_| true).hops.is_empty());
    }

    #[test]
    fn each_visit_of_a_hop_called_twice_is_checked_against_a_span_of_its_own() {
        // a calls b twice: one b takes 3 us, the other 5 ms.
        let spans = vec![
            span(1, 0, "request 7", SpanKind::Client, SERVICE, 0, 6_000_000),
            span(2, 1, "a", SpanKind::Server, "a", 1_000, 5_900_000),
            span(3, 2, "a -> b", SpanKind::Client, "a", 2_000, 6_000),
            span(4, 3, "b", SpanKind::Server, "b", 2_500, 5_500),
            span(5, 2, "a -> b", SpanKind::Client, "a", 7_000, 5_800_000),
            span(6, 5, "b", SpanKind::Server, "b", 8_000, 5_008_000),
        ];
        let mut visits = record(&["a", "b", "b"]);
        for (hop, total) in visits.path.iter_mut().zip([5_899_000, 5_000_000, 3_000]) {
            hop.total_ns = total;
        }
        let r = analyze(&batch(spans.clone()), "v", &[visits.clone()], |_| true);
        assert_eq!((r.expected, r.complete, r.incomplete), (1, 1, 0));
        assert_eq!(r.timing_disagreements, 0, "each visit has its own span");
        // Two visits of 5 ms: the second finds only the 3 us span left.
        visits.path[2].total_ns = 5_000_000;
        let r = analyze(&batch(spans), "v", &[visits], |_| true);
        assert_eq!(r.timing_disagreements, 1);
    }

    /// A hop process's export request: `spans` with only their own facts,
    /// the hop, replica, transport and variant in the resource.
    fn hop_batch(hop: &str, replica: i64, mut spans: Vec<Span>) -> ResourceSpans {
        for s in &mut spans {
            s.attributes
                .retain(|kv| !["variant", "hop", "replica"].contains(&kv.key.as_str()));
        }
        ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", Value::StringValue(format!("hop-{hop}"))),
                    kv("hop", Value::StringValue(hop.into())),
                    kv("replica", Value::IntValue(replica)),
                    kv("transport", Value::StringValue("push".into())),
                    kv("variant", Value::StringValue("v".into())),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }
    }

    #[test]
    fn hops_and_replicas_come_from_the_resource_when_spans_do_not_say() {
        let spans = [
            span(1, 0, "request 7", SpanKind::Client, SERVICE, 1_000, 11_000),
            span(2, 1, "a", SpanKind::Server, "ignored", 2_000, 10_000),
            span(3, 2, "a -> b", SpanKind::Client, "ignored", 3_000, 9_000),
            span(5, 3, "b", SpanKind::Server, "ignored", 4_000, 8_000),
        ];
        let mut batches = batch(spans[..1].to_vec());
        batches.push(hop_batch("a", 0, spans[1..3].to_vec()));
        batches.push(hop_batch("b", 2, spans[3..].to_vec()));
        let mut path = record_timed(&["b", "a"], 4_000);
        path.path[0].replica = 2;
        let r = analyze(&batches, "v", &[path.clone()], |_| true);
        assert_eq!((r.spans, r.expected, r.complete), (4, 1, 1));
        assert_eq!(r.timing_disagreements, 0);
        // The spans' times name their hops by the resource too (a failed
        // request's: an ok one's times come from its path).
        let mut failed = path.clone();
        failed.outcome = Outcome::Timeout;
        let t = analyze(&batches, "v", &[failed], |_| true);
        let hops: Vec<(&str, u64)> = t.hops.iter().map(|h| (h.hop.as_str(), h.spans)).collect();
        assert_eq!(hops, [("a", 1), ("b", 1)]);
        assert_eq!(t.hops[0].self_time.p50_us, 2.0);
        assert_eq!(t.hops[1].network.p50_us, 2.0);
        // b's spans are replica 2's: a path through replica 0 disagrees.
        path.path[0].replica = 0;
        let other = analyze(&batches, "v", &[path], |_| true);
        assert_eq!(other.timing_disagreements, 1);
        // A span's own attribute wins over its resource's.
        let mut own = spans[3].clone();
        own.attributes
            .retain(|kv| !["variant", "hop", "replica"].contains(&kv.key.as_str()));
        own.attributes.push(kv("replica", Value::IntValue(5)));
        let flat = [FlatSpan {
            service: "hop-b",
            resource: &hop_batch("b", 2, Vec::new())
                .resource
                .expect("resource")
                .attributes,
            span: &own,
        }];
        assert_eq!(flat[0].attr_int("replica"), Some(5));
        assert_eq!(flat[0].attr_string("hop").as_deref(), Some("b"));
        // Another variant's processes are not this variant's.
        assert_eq!(analyze(&batches, "w", &[], |_| true).spans, 0);
    }

    #[test]
    fn a_directly_called_service_in_the_path_does_not_make_a_trace_incomplete() {
        // a called the service c directly: c has no span, only a record.
        let spans = vec![
            span(1, 0, "request 7", SpanKind::Client, SERVICE, 1_000, 11_000),
            span(2, 1, "a", SpanKind::Server, "a", 2_000, 10_000),
        ];
        let mut r = record(&["c", "a"]);
        r.path[0].transport = "direct".into();
        let report = analyze(&batch(spans.clone()), "v", &[r.clone()], |_| true);
        assert_eq!((report.expected, report.complete), (1, 1));
        // The same path through a tailmesh hop c is missing c's span.
        r.path[0].transport = "push".into();
        let report = analyze(&batch(spans), "v", &[r], |_| true);
        assert_eq!(
            (report.expected, report.complete, report.incomplete),
            (1, 0, 1)
        );
    }

    #[test]
    fn a_pushed_hops_wait_for_a_slot_is_queue_wait_not_its_own_time() {
        let mut b = span(4, 3, "b", SpanKind::Server, "b", 4_000, 9_000);
        // 3 us of b's 5 us span were spent in line for a slot.
        b.attributes
            .push(kv("slot_wait_ns", Value::IntValue(3_000)));
        let spans = vec![
            span(1, 0, "request 7", SpanKind::Client, SERVICE, 1_000, 11_000),
            span(2, 1, "a", SpanKind::Server, "a", 2_000, 10_000),
            span(3, 2, "a -> b", SpanKind::Client, "a", 3_000, 9_500),
            b,
        ];
        // A request that timed out has no path: its trace's spans say.
        let mut timed_out = record(&[]);
        timed_out.outcome = Outcome::Timeout;
        let r = analyze(&batch(spans), "v", &[timed_out], |_| true);
        let (a, b) = (&r.hops[0], &r.hops[1]);
        assert_eq!((b.self_time.p50_us, b.queue_wait.p50_us), (2.0, 3.0));
        assert_eq!(b.network.p50_us, 1.5);
        // A hop without slots has no queue wait at all, not a wait of 0.
        assert_eq!(a.queue_wait, Dist::default());
        assert_eq!(a.self_time.p50_us, 1.5);

        // The same request answered: its path gives the same times.
        let mut v = tailmesh_analysis::testing::variant(
            "v",
            vec![
                tailmesh_analysis::testing::hop("a", None),
                tailmesh_analysis::testing::hop("b", None),
            ],
        );
        v.hops[1].concurrency = Some(1);
        let mut paths = PathTimes::new(&v);
        let mut ok = record(&["b", "a"]);
        ok.end = Duration::from_micros(11);
        ok.intended = Duration::from_micros(1);
        ok.path[0].total_ns = 5_000;
        ok.path[0].slot_wait_ns = 3_000;
        ok.path[0].queue_wait_ns = 3_000;
        ok.path[1].total_ns = 8_000;
        ok.path[1].calls = vec![crate::record::CallTiming {
            hop: "b".into(),
            call_ns: 6_500,
            attempts: Vec::new(),
        }];
        paths.record(&ok);
        let mut analyzer = TraceAnalyzer::new();
        analyzer.path_times(paths);
        let r = analyzer.finish();
        let (a, b) = (&r.hops[0], &r.hops[1]);
        assert_eq!((a.hop.as_str(), b.hop.as_str()), ("a", "b"));
        assert_eq!((b.self_time.p50_us, b.queue_wait.p50_us), (2.0, 3.0));
        assert_eq!(b.network.p50_us, 1.5);
        assert_eq!(a.queue_wait, Dist::default());
        assert_eq!(a.self_time.p50_us, 1.5);
        assert_eq!(
            a.network.p50_us, 2.0,
            "the load generator's 10 us less a's 8"
        );
    }

    #[test]
    fn missing_incomplete_and_orphans_are_counted() {
        // b's server span hangs off a span that never arrived.
        let spans = vec![
            span(1, 0, "request 7", SpanKind::Client, SERVICE, 1_000, 11_000),
            span(2, 1, "a", SpanKind::Server, "a", 2_000, 10_000),
            span(5, 4, "b", SpanKind::Server, "b", 5_000, 8_000),
        ];
        let mut other = record(&["a"]);
        other.id = 8;
        let r = analyze(
            &batch(spans),
            "v",
            &[record(&["b", "a", "c"]), other],
            |_| true,
        );
        assert_eq!(r.expected, 2);
        assert_eq!(r.missing, 1, "request 8 has no trace");
        assert_eq!(r.incomplete, 1, "no c span in request 7's trace");
        assert_eq!(r.orphan_spans, 1);
        assert_eq!(r.complete, 0);
        // Another variant's spans are not this variant's.
        assert_eq!(analyze(&batch(Vec::new()), "w", &[], |_| true).spans, 0);
        // Per hop: request 7 passed a, b and c, request 8 only a; no c.
        let got: Vec<(&str, u64, u64)> = r
            .coverage
            .iter()
            .map(|c| (c.hop.as_str(), c.expected, c.server_spans))
            .collect();
        assert_eq!(got, [("a", 2, 1), ("b", 1, 1), ("c", 1, 0)]);
    }

    fn coverage(hop: &str, expected: u64, server_spans: u64, queue_waits: u64) -> HopCoverage {
        HopCoverage {
            hop: hop.into(),
            expected,
            server_spans,
            queue_waits,
        }
    }

    fn report(expected: u64, complete: u64, coverage: Vec<HopCoverage>) -> TraceReport {
        TraceReport {
            expected,
            complete,
            missing: expected - complete,
            coverage,
            ..TraceReport::default()
        }
    }

    #[test]
    fn ninety_percent_complete_is_quiet_and_less_names_the_short_services() {
        let whole = vec![coverage("a", 100, 100, 0), coverage("b", 100, 100, 100)];
        let pulled = |hop: &str| hop == "b";
        assert_eq!(
            completeness_warning("v", &report(100, 90, whole), pulled),
            None
        );
        assert_eq!(
            completeness_warning("v", &report(0, 0, Vec::new()), pulled),
            None
        );
        // Nothing arrived from the processes: every hop and the broker.
        let none = vec![coverage("a", 599, 0, 0), coverage("b", 599, 0, 0)];
        assert_eq!(
            completeness_warning("base", &report(599, 0, none), pulled).as_deref(),
            Some(
                "variant base: only 0 of 599 sampled ok requests have complete traces (0.0 %); \
                 spans missing from hop-a (0 of 599), hop-b (0 of 599), broker"
            )
        );
        // b's own spans all came, the broker's did not.
        let broker = vec![coverage("a", 100, 89, 0), coverage("b", 100, 100, 50)];
        assert_eq!(
            completeness_warning("v", &report(100, 89, broker), pulled).as_deref(),
            Some(
                "variant v: only 89 of 100 sampled ok requests have complete traces (89.0 %); \
                 spans missing from hop-a (89 of 100), broker"
            )
        );
        // Every span came, yet the traces disagree with the paths.
        let all = vec![coverage("a", 10, 10, 0)];
        let line = completeness_warning("v", &report(10, 5, all), pulled).unwrap_or_default();
        assert!(
            line.ends_with("every service sent its spans, but they do not match the reply paths"),
            "{line}"
        );
    }
}
