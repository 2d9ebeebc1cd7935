//! The one pass over a variant's spool, after the variant: spans are
//! gathered by trace in a window of open traces; a trace closes once the
//! spool has moved past its first span's arrival by the horizon (the
//! request's timeout plus the exporters' batch delay and some slack, by
//! which every span of the request has arrived). A closed trace goes to
//! the breakdown (every trace, kept or not) and, when its request's trace
//! is kept, to the Jaeger files; then it leaves memory. So memory holds
//! the traces of one horizon of arrivals, whatever the run's length.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest, resource::v1::Resource, trace::v1::Span,
};
use prost::Message;

use super::{
    FlatSpan, Process,
    breakdown::{TraceAnalyzer, request_id},
    collector::Spool,
    identity,
    jaeger::{self, KeptTraces},
    observer::ProcessTally,
    raw,
    spool::{SpoolError, SpoolReader},
    tail::{FactsError, FactsFile},
};

/// How long the hops' exporters keep a finished span before sending it
/// at most: a process that holds its spans and sees few asks for its
/// decisions, and sends the kept spans, once a second (every 200 ms
/// otherwise, and when it does not hold them).
pub const EXPORT_DELAY: Duration = tailmesh_services::telemetry::export::QUIET_ASK;
/// Added to the horizon for exports that take longer (a busy machine).
pub const SLACK: Duration = Duration::from_secs(2);

/// Why the pass failed.
#[derive(Debug, thiserror::Error)]
pub enum SiftError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error(transparent)]
    Facts(#[from] FactsError),
}

/// What the pass is told.
#[derive(Clone, Copy, Debug)]
pub struct Sift<'a> {
    /// The variant whose spans count (their `variant` attribute, or
    /// their process's).
    pub variant: &'a str,
    /// How long after its first span a trace is whole.
    pub horizon: Duration,
    /// Keep traces of no measured request (warmup's), as when every trace
    /// is kept.
    pub keep_unmeasured: bool,
}

impl Sift<'_> {
    /// The horizon for requests that time out after `timeout`.
    pub fn horizon_for(timeout: Duration) -> Duration {
        timeout + EXPORT_DELAY + SLACK
    }
}

/// What the pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sifted {
    /// Traces written to the Jaeger files.
    pub written: u64,
    /// The most traces open at once.
    pub peak_traces: usize,
    /// The most spans held at once.
    pub peak_spans: usize,
    /// The processes' own counters of what tracing cost them, read from
    /// the resources of the export requests on the way.
    pub processes: ProcessTally,
}

/// A trace still gathering spans, each with its process.
struct Open {
    spans: Vec<(Arc<Process>, Span)>,
}

/// Reads `spool` once: every trace of `sift.variant` goes to `analyzer`,
/// looked up in `facts` (what the tail sampler noted of its request), and
/// the kept ones to `kept`.
pub fn sift(
    spool: &Spool,
    sift: Sift<'_>,
    facts: Option<&FactsFile>,
    analyzer: &mut TraceAnalyzer,
    kept: &mut KeptTraces,
) -> Result<Sifted, SiftError> {
    let mut out = Sifted::default();
    let Some(path) = &spool.path else {
        return Ok(out);
    };
    let horizon = tailmesh_units::nanos(sift.horizon);
    let mut reader = SpoolReader::open(path)?;
    let mut open: HashMap<Vec<u8>, Open> = HashMap::new();
    // Open traces by their first span's arrival (arrivals only grow).
    let mut order: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    let mut held = 0usize;
    let mut processes = Processes::default();
    let mut close = |trace: Open, out: &mut Sifted| -> Result<(), SiftError> {
        let flat: Vec<FlatSpan<'_>> = trace
            .spans
            .iter()
            .map(|(process, span)| process.span(span))
            .collect();
        let decided = match (request_id(&flat), facts) {
            (Some(id), Some(f)) => f.read(id)?,
            _ => None,
        };
        analyzer.trace(&flat, decided.as_ref().map(|(_, f)| f));
        let keep = decided.map_or(sift.keep_unmeasured, |(keep, _)| keep);
        if keep && kept.push(&jaeger::trace(&flat)) {
            out.written += 1;
        }
        Ok(())
    };
    let mut now = 0u64;
    while let Some(frame) = reader.next_frame()? {
        now = now.max(frame.arrived_ns);
        while let Some((first, _)) = order.front()
            && first.saturating_add(horizon) < now
        {
            let Some((_, id)) = order.pop_front() else {
                break;
            };
            if let Some(trace) = open.remove(&id) {
                held -= trace.spans.len();
                close(trace, &mut out)?;
            }
        }
        let request = match ExportTraceServiceRequest::decode(frame.body.clone()) {
            Ok(r) => r,
            Err(_) => {
                // It passed the check on arrival, which counts its spans.
                spool.reject(raw::check(frame.body, false).map(|b| b.spans).unwrap_or(0));
                continue;
            }
        };
        for resource in request.resource_spans {
            let spans = resource.scope_spans.iter().map(|s| s.spans.len() as u64);
            out.processes.note(resource.resource.as_ref(), spans.sum());
            let process = processes.of(resource.resource.as_ref());
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                if process.span(&span).attr_string("variant").as_deref() != Some(sift.variant) {
                    continue;
                }
                let trace = open.entry(span.trace_id.clone()).or_insert_with(|| {
                    order.push_back((now, span.trace_id.clone()));
                    Open { spans: Vec::new() }
                });
                trace.spans.push((Arc::clone(&process), span));
                held += 1;
            }
        }
        out.peak_traces = out.peak_traces.max(open.len());
        out.peak_spans = out.peak_spans.max(held);
    }
    for (_, id) in order {
        if let Some(trace) = open.remove(&id) {
            close(trace, &mut out)?;
        }
    }
    Ok(out)
}

/// The processes seen so far, each shared by its spans: export requests
/// of the same process (its resource the same but for the observer's
/// counters) share one.
#[derive(Default)]
struct Processes {
    /// By the encoded attributes that name the process.
    known: HashMap<Vec<u8>, Arc<Process>>,
}

impl Processes {
    fn of(&mut self, resource: Option<&Resource>) -> Arc<Process> {
        let key = Resource {
            attributes: resource
                .map(|r| identity(&r.attributes).cloned().collect())
                .unwrap_or_default(),
            ..Resource::default()
        }
        .encode_to_vec();
        Arc::clone(
            self.known
                .entry(key)
                .or_insert_with(|| Arc::new(Process::of(resource))),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::record::HopRecord;
    use opentelemetry_proto::tonic::{
        common::v1::{AnyValue, KeyValue, any_value::Value},
        trace::v1::{ResourceSpans, ScopeSpans, span::SpanKind},
    };

    use super::*;
    use crate::{
        record::{Outcome, RequestRecord},
        traces::{
            loadgen::SERVICE,
            tail::{TailPolicy, TailSampler},
        },
    };

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    fn trace_id(request: u64) -> Vec<u8> {
        let mut id = vec![0x5a; 8];
        id.extend_from_slice(&(request + 1).to_be_bytes());
        id
    }

    /// Request `id`'s span from `service`: the load generator's root
    /// (span 1, its hop and variant its own attributes) or hop a's server
    /// span (span 2, its child; its hop, replica and variant those of its
    /// process, as a hop sends them).
    fn batch(id: u64, service: &str) -> Vec<ResourceSpans> {
        let root = service == SERVICE;
        let process = vec![
            kv("variant", Value::StringValue("v".into())),
            kv(
                "hop",
                Value::StringValue(if root { SERVICE } else { "a" }.into()),
            ),
            kv("replica", Value::IntValue(0)),
        ];
        let mut resource = vec![kv("service.name", Value::StringValue(service.into()))];
        let mut attributes = Vec::new();
        if root {
            attributes = process;
            attributes.push(kv("request_id", Value::IntValue(id as i64)));
        } else {
            resource.extend(process);
            // The observer's counters differ from one request to the next.
            resource.push(kv("tailmesh.observer.spans", Value::IntValue(id as i64)));
        }
        let span = Span {
            trace_id: trace_id(id),
            span_id: vec![if root { 1 } else { 2 }; 8],
            parent_span_id: if root { Vec::new() } else { vec![1; 8] },
            name: if root {
                format!("request {id}")
            } else {
                "a".into()
            },
            kind: if root {
                SpanKind::Client
            } else {
                SpanKind::Server
            } as i32,
            start_time_unix_nano: 1_000,
            end_time_unix_nano: if root { 9_000 } else { 8_000 },
            attributes,
            ..Span::default()
        };
        vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource,
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![span],
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }]
    }

    fn record(id: u64) -> RequestRecord {
        // Every 10th fails, every 7th is slow; the rest are quick and ok.
        let (outcome, path) = if id % 10 == 3 {
            (Outcome::Timeout, Vec::new())
        } else {
            let hop = HopRecord {
                hop: "a".into(),
                total_ns: 7_000,
                ..HopRecord::default()
            };
            (Outcome::Ok, vec![hop])
        };
        RequestRecord {
            id,
            intended: Duration::ZERO,
            start: Duration::ZERO,
            end: Duration::from_millis(if id.is_multiple_of(7) { 50 } else { 1 }),
            outcome,
            path,
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    /// A run far longer than the window: 20,000 requests, 1 per ms of
    /// arrival time, a trace's two spans 3 ms apart, a window of 10 ms.
    #[test]
    fn memory_holds_one_window_of_traces_and_the_kept_ones_are_exactly_the_tail() {
        const REQUESTS: u64 = 20_000;
        let dir = tempfile::tempdir().expect("temp dir");
        let facts =
            FactsFile::create(&dir.path().join("facts"), vec!["a".into()], 1).expect("facts");
        let policy = TailPolicy {
            slow_above: Some(Duration::from_millis(10)),
            slow_percentile: None,
            failed: true,
            retried: true,
            share: 0.0,
        };
        // Request 11's trace was not meant to be (head sampling).
        let mut sampler = TailSampler::new(policy, 3, Box::new(|id| id != 11), facts);
        {
            let mut spool =
                crate::traces::spool::SpoolWriter::create(&dir.path().join("s")).expect("spool");
            let ms = 1_000_000u64;
            let mut frames: Vec<(u64, Vec<u8>)> = Vec::new();
            for id in 0..REQUESTS {
                if id == 11 {
                    continue;
                }
                let encode = |b| ExportTraceServiceRequest { resource_spans: b }.encode_to_vec();
                // The hop's span comes 3 ms after the load generator's.
                frames.push((id * ms, encode(batch(id, SERVICE))));
                frames.push((id * ms + 3 * ms, encode(batch(id, "hop-a"))));
            }
            frames.sort_by_key(|(at, _)| *at);
            for (at, body) in &frames {
                spool.append(*at, body).expect("append");
            }
            spool.finish().1.expect("finish");
        }
        for id in 0..REQUESTS {
            sampler.record(&record(id));
        }
        let mut analyzer = TraceAnalyzer::new();
        let (facts, counts, warning) = sampler.finish(&mut analyzer);
        assert_eq!(warning, None);
        let spool = Spool::at(dir.path().join("s"));
        let mut kept = KeptTraces::create(&dir.path().join("kept"), u64::MAX);
        let sifted = sift(
            &spool,
            Sift {
                variant: "v",
                horizon: Duration::from_millis(10),
                keep_unmeasured: false,
            },
            Some(&facts),
            &mut analyzer,
            &mut kept,
        )
        .expect("sifted");
        // The window: about 10 ms of arrivals, 1 request a ms.
        assert!(sifted.peak_traces <= 14, "{sifted:?}");
        assert!(sifted.peak_spans <= 28, "{sifted:?}");
        let report = analyzer.finish();
        assert_eq!(report.traces, REQUESTS - 1);
        assert_eq!(report.spans, 2 * (REQUESTS - 1));
        assert_eq!(report.orphan_spans, 0);
        // The failed ones are not expected; the others all complete.
        let failed = (0..REQUESTS).filter(|id| id % 10 == 3).count() as u64;
        assert_eq!(report.expected, REQUESTS - 1 - failed);
        assert_eq!(report.complete, report.expected);
        assert_eq!(report.missing, 0);
        assert_eq!(report.timing_disagreements, 0);
        // a's times: every ok request's from its path (untraced 11 too),
        // every failed one's from its trace.
        assert_eq!(report.hops[0].spans, REQUESTS);
        // Kept: exactly the failed and the slow (share 0).
        let tail: Vec<u64> = (0..REQUESTS)
            .filter(|id| *id != 11 && (id % 10 == 3 || id % 7 == 0))
            .collect();
        assert_eq!(sifted.written, tail.len() as u64);
        assert_eq!(counts.kept(), tail.len() as u64);
        assert_eq!(counts.dropped, REQUESTS - 1 - tail.len() as u64);
        let kept = kept.finish();
        let mut bytes = Vec::new();
        kept.write_file(0, &mut bytes).expect("write");
        let file: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
        let mut ids: Vec<u64> = file["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|t| {
                let spans = t["spans"].as_array().expect("spans");
                assert_eq!(spans.len(), 2, "whole: {t}");
                spans
                    .iter()
                    .find_map(|s| {
                        s["tags"]
                            .as_array()?
                            .iter()
                            .find(|tag| tag["key"] == "request_id")?["value"]
                            .as_u64()
                    })
                    .expect("request id")
            })
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, tail);
    }

    #[test]
    fn the_processes_counters_are_read_on_the_way_latest_per_instance() {
        use crate::traces::observer::{ProcessCounters, tests::reporting};
        let c = |spans, record_ns| ProcessCounters {
            spans,
            dropped: 0,
            record_ns,
            export_cpu_ns: 2 * record_ns,
            ..ProcessCounters::default()
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let mut spool =
            crate::traces::spool::SpoolWriter::create(&dir.path().join("s")).expect("spool");
        let encode = |b| ExportTraceServiceRequest { resource_spans: b }.encode_to_vec();
        // Two replicas of hop a, one span a batch; the load generator's
        // spans carry no counters.
        let sent = [("a0", c(1, 10)), ("a1", c(1, 30)), ("a0", c(2, 25))];
        for (id, (instance, counters)) in sent.iter().enumerate() {
            let mut b = batch(id as u64, "hop-a");
            b[0].resource = Some(reporting("hop-a", instance, *counters));
            spool.append(id as u64, &encode(b)).expect("append");
            spool
                .append(id as u64, &encode(batch(id as u64, SERVICE)))
                .expect("append");
        }
        spool.finish().1.expect("finish");
        let mut kept = KeptTraces::create(&dir.path().join("k"), u64::MAX);
        let sifted = sift(
            &Spool::at(dir.path().join("s")),
            Sift {
                variant: "v",
                horizon: Duration::from_millis(10),
                keep_unmeasured: true,
            },
            None,
            &mut TraceAnalyzer::new(),
            &mut kept,
        )
        .expect("sifted");
        let t = sifted.processes.totals().expect("reported");
        assert_eq!(t.processes, 2);
        assert_eq!(t.counters, c(3, 55), "a0's latest (2, 25) and a1's (1, 30)");
        assert_eq!(t.received, 3, "the hop's spans, not the generator's");
    }

    #[test]
    fn a_whole_window_later_a_trace_is_closed_and_late_spans_start_another() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut spool =
            crate::traces::spool::SpoolWriter::create(&dir.path().join("s")).expect("spool");
        let encode = |b| ExportTraceServiceRequest { resource_spans: b }.encode_to_vec();
        spool.append(0, &encode(batch(1, SERVICE))).expect("append");
        // 20 ms later, past a 10 ms horizon: the hop's span is alone.
        spool
            .append(20_000_000, &encode(batch(1, "hop-a")))
            .expect("append");
        spool.finish().1.expect("finish");
        let spool = Spool::at(dir.path().join("s"));
        let mut analyzer = TraceAnalyzer::new();
        let mut kept = KeptTraces::create(&dir.path().join("k"), u64::MAX);
        let sifted = sift(
            &spool,
            Sift {
                variant: "v",
                horizon: Duration::from_millis(10),
                keep_unmeasured: true,
            },
            None,
            &mut analyzer,
            &mut kept,
        )
        .expect("sifted");
        assert_eq!(sifted.written, 2);
        let report = analyzer.finish();
        assert_eq!((report.traces, report.orphan_spans), (2, 1));
    }
}
