//! Spans held at the receiver. tailmesh's processes hold their spans by
//! trace until the run's keep decisions and send only the kept traces'
//! (`services::telemetry::held`); a process that does not (a real
//! service's OpenTelemetry SDK behind its sidecar, exporting straight to
//! the run's receiver) sends every span it makes. The receiver holds
//! those here, by trace and under the same decisions, so only kept
//! traces reach the spool: a batch whose spans are all of kept traces
//! (every batch of a holding process, and one with no spans, which
//! carries a process's counters) passes whole; any other is split, its
//! kept spans passed on re-encoded and the rest held. Spans are held as
//! the slices of the request the receiver's check cut it into, never
//! decoded again.

use bytes::BytesMut;
use tailmesh_services::telemetry::{
    held::{Held, HeldCounts, HeldSpan, HoldLimits},
    otlp,
};

use super::{
    decisions::DecisionLog,
    raw::{RawBatch, RawSpan},
};

impl HeldSpan for RawSpan {
    fn trace_id(&self) -> u128 {
        self.trace
    }
}

/// The receiver's held spans and its place in the decisions.
#[derive(Debug)]
pub(super) struct ReceiverHold {
    held: Held<RawSpan>,
    /// The position of the last decision read.
    after: u64,
}

impl ReceiverHold {
    pub(super) fn new(limits: HoldLimits) -> Self {
        ReceiverHold {
            held: Held::new(limits),
            after: 0,
        }
    }

    /// Takes `batch`, come at `now` (ns), after reading the decisions
    /// since the last: what goes on to the spool (the batch whole, or the
    /// kept spans re-encoded); the rest is held. Evicts what waited past
    /// its hold.
    pub(super) fn take(
        &mut self,
        mut batch: RawBatch,
        log: &DecisionLog,
        now: u64,
    ) -> Vec<RawBatch> {
        let mut out = Vec::new();
        self.decide(log, now, &mut out);
        self.held.expire(now);
        // A batch checked before the hold began was not cut: it passes
        // whole, as every batch did then.
        if batch.parts.iter().all(|s| self.held.is_kept(s.trace)) {
            return encode(&out).into_iter().chain([batch]).collect();
        }
        for span in std::mem::take(&mut batch.parts) {
            self.held.add(span, now, &mut out);
        }
        encode(&out).into_iter().collect()
    }

    /// The run's last decisions, read when the variant's processes have
    /// stopped: the kept traces' spans to spool, and what holding did.
    pub(super) fn finish(mut self, log: &DecisionLog, now: u64) -> (Option<RawBatch>, HeldCounts) {
        let mut out = Vec::new();
        self.decide(log, now, &mut out);
        self.held.evict_all(now);
        (encode(&out), self.held.counts())
    }

    fn decide(&mut self, log: &DecisionLog, now: u64, out: &mut Vec<RawSpan>) {
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        let (next, forgotten) = log.read_after(self.after, |t, keep| {
            if keep { &mut kept } else { &mut dropped }.push(t)
        });
        self.after = next;
        self.held.forgotten(forgotten);
        self.held.keep(kept, now, out);
        self.held.drop_traces(dropped);
    }
}

/// `spans` as one export request, each run of spans of one process and
/// scope under one `ResourceSpans`; `None` without spans.
fn encode(spans: &[RawSpan]) -> Option<RawBatch> {
    if spans.is_empty() {
        return None;
    }
    let mut buf = BytesMut::new();
    let mut rest = spans;
    while let Some(first) = rest.first() {
        let run = rest
            .iter()
            .take_while(|s| s.resource == first.resource && s.scope == first.scope)
            .count();
        let resource_spans = otlp::open(&mut buf, 1, 3);
        otlp::bytes_field(&mut buf, 1, &first.resource);
        let scope_spans = otlp::open(&mut buf, 2, 3);
        otlp::bytes_field(&mut buf, 1, &first.scope);
        for s in &rest[..run] {
            otlp::bytes_field(&mut buf, 2, &s.span);
        }
        otlp::close(&mut buf, scope_spans);
        otlp::close(&mut buf, resource_spans);
        rest = &rest[run..];
    }
    Some(RawBatch::encoded(buf.freeze(), spans.len() as u64))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use opentelemetry_proto::tonic::{
        collector::trace::v1::ExportTraceServiceRequest,
        common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value},
        resource::v1::Resource,
        trace::v1::{ResourceSpans, ScopeSpans, Span},
    };

    use prost::Message;

    use super::*;

    const MS: u64 = 1_000_000;

    fn span(trace: u128, id: u64) -> Span {
        Span {
            trace_id: trace.to_be_bytes().to_vec(),
            span_id: id.to_be_bytes().to_vec(),
            name: format!("s{id}"),
            start_time_unix_nano: 1,
            end_time_unix_nano: 2,
            ..Span::default()
        }
    }

    fn process(name: &str, spans: Vec<Span>) -> ResourceSpans {
        ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(Value::StringValue(name.into())),
                    }),
                    ..KeyValue::default()
                }],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "sdk".into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }
    }

    fn raw(batch: Vec<ResourceSpans>) -> RawBatch {
        let body = ExportTraceServiceRequest {
            resource_spans: batch,
        }
        .encode_to_vec();
        super::super::raw::check(body.into(), true).expect("well-formed")
    }

    /// The spans passed on, as (service, span name), in order.
    fn passed(batches: &[RawBatch]) -> Vec<(String, String)> {
        batches
            .iter()
            .flat_map(|b| b.decode().expect("decodes").resource_spans)
            .flat_map(|r| {
                let service = super::super::Process::of(r.resource.as_ref()).service;
                r.scope_spans
                    .into_iter()
                    .flat_map(|s| s.spans)
                    .map(move |s| (service.clone(), s.name))
            })
            .collect()
    }

    fn names(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn a_process_sending_every_span_has_only_its_kept_traces_passed_on() {
        let log = DecisionLog::new(100);
        let mut hold = ReceiverHold::new(HoldLimits {
            hold: Duration::from_millis(100),
            max_spans: 1000,
        });
        // An SDK's batch: traces 1 and 2, two processes.
        let out = hold.take(
            raw(vec![
                process("python", vec![span(1, 10), span(2, 20)]),
                process("node", vec![span(1, 11)]),
            ]),
            &log,
            0,
        );
        assert!(passed(&out).is_empty(), "nothing before a decision");
        log.keep(1);
        // The next batch brings the decision along: trace 1's held spans
        // go, each under its own process; trace 3 waits.
        let out = hold.take(raw(vec![process("python", vec![span(3, 30)])]), &log, MS);
        assert_eq!(passed(&out), names(&[("python", "s10"), ("node", "s11")]));
        // A holding process's batch, all of kept traces, passes whole,
        // and so does one with no spans (a process's counters).
        let out = hold.take(raw(vec![process("hop", vec![span(1, 12)])]), &log, 2 * MS);
        assert_eq!(passed(&out), names(&[("hop", "s12")]));
        let out = hold.take(raw(vec![process("hop", Vec::new())]), &log, 3 * MS);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].spans, 0);
        // Trace 2 waited past its hold: evicted; a decision for it after
        // is a lost trace.
        let out = hold.take(
            raw(vec![process("python", vec![span(4, 40)])]),
            &log,
            150 * MS,
        );
        assert!(passed(&out).is_empty());
        log.keep(2);
        log.keep(4);
        let (last, counts) = hold.finish(&log, 160 * MS);
        assert_eq!(
            passed(&last.into_iter().collect::<Vec<_>>()),
            names(&[("python", "s40")])
        );
        assert_eq!(counts.lost_traces, 1);
        // Trace 2's span and trace 3's, never kept.
        assert_eq!(counts.evicted_spans, 2);
    }
}
