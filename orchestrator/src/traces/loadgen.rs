//! The load generator's client span of each request: the root of its
//! trace, started at the request's intended send time so client-side
//! queueing shows in the trace, recorded straight into the collector.
//! When the processes hold their spans for the run's keep decisions
//! ([`LoadTracer::holding`]), the load generator makes none as requests
//! end: the span of a request the tail sampler keeps is made from its
//! record when it decides ([`LoadTracer::decide`]), on the thread behind
//! the load generator's, and a dropped one is never made.

use std::{
    fmt::Write as _,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use bytes::{BufMut, Bytes, BytesMut};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode};
use tailmesh_services::telemetry::{SpanContext, otlp, recorder::FieldValue};

use crate::record::{Outcome, RequestRecord, StreamPlace};

use super::{
    collector::Collector,
    observer::{CpuMeter, CpuReading},
};

/// The service name of the load generator's spans.
pub const SERVICE: &str = "loadgen";
/// Their instrumentation scope.
const SCOPE: &str = "tailmesh";

/// Makes the load generator's spans for one variant.
pub struct LoadTracer {
    collector: Arc<Collector>,
    variant: String,
    ids: TraceIds,
    /// Making the client spans (spooling them is the collector's).
    making: CpuMeter,
    /// The spans recorded and not yet handed on.
    batch: Mutex<Batch>,
    /// What every batch starts with.
    resource: Head,
    /// The processes hold their spans for the keep decisions: so is a
    /// measured request's span made only when kept, from its record.
    holding: bool,
    /// The wall-clock time (unix ns) the records' times count from; 0
    /// until told.
    measuring_from_ns: AtomicU64,
    /// Requests traced (head-sampled) so far, warmup's included.
    traced: AtomicU64,
}

impl std::fmt::Debug for LoadTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadTracer")
            .field("variant", &self.variant)
            .field("ratio", &self.ids.ratio)
            .finish()
    }
}

/// One request's trace identity.
#[derive(Clone, Copy, Debug)]
pub struct RequestTrace {
    trace_id: u128,
    span_id: u64,
    sampled: bool,
}

/// Each request's trace identity, from its id alone: what a load
/// generator process needs to send a request in its trace, while the
/// orchestrator records the request's span ([`LoadTracer`]).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TraceIds {
    /// Head sampling: the share of requests traced.
    ratio: f64,
    /// Distinguishes this variant's trace ids from other runs'.
    nonce: u64,
}

impl TraceIds {
    /// Requests sampled at `ratio`, their trace ids kept apart from other
    /// runs' by `nonce`.
    pub fn new(ratio: f64, nonce: u64) -> Self {
        TraceIds { ratio, nonce }
    }

    /// The trace of request `id`: its ids and whether it is sampled (the
    /// same decision for the same id, so runs repeat).
    pub fn request(&self, id: u64) -> RequestTrace {
        let h = mix(self.nonce ^ mix(id));
        let sampled = ((h >> 11) as f64 / (1u64 << 53) as f64) < self.ratio;
        RequestTrace {
            trace_id: (u128::from(mix(self.nonce).max(1)) << 64) | u128::from(id + 1),
            span_id: mix(h).max(1),
            sampled,
        }
    }

    /// The context the request's downstream calls carry.
    pub fn context(t: RequestTrace) -> SpanContext {
        SpanContext {
            trace_id: t.trace_id,
            span_id: t.span_id,
            sampled: t.sampled,
            remote: true,
        }
    }
}

impl RequestTrace {
    /// Whether the request is traced.
    pub fn sampled(&self) -> bool {
        self.sampled
    }
}

pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl LoadTracer {
    /// Spans of `variant` at sampling `ratio` into `collector`; `nonce`
    /// keeps trace ids apart between runs.
    pub fn new(collector: Arc<Collector>, variant: &str, ratio: f64, nonce: u64) -> Self {
        LoadTracer {
            collector,
            variant: variant.to_string(),
            ids: TraceIds { ratio, nonce },
            making: CpuMeter::sampled(),
            batch: Mutex::new(Batch::default()),
            resource: Head::new(),
            holding: false,
            measuring_from_ns: AtomicU64::new(0),
            traced: AtomicU64::new(0),
        }
    }

    /// Makes a measured request's span only when [`LoadTracer::decide`]
    /// keeps its trace (`hold`), as the processes hold theirs.
    pub fn holding(mut self, hold: bool) -> Self {
        self.holding = hold;
        self
    }

    /// Whether it makes spans only for the kept traces.
    pub fn holds(&self) -> bool {
        self.holding
    }

    /// The records' times count from `at` on the wall clock (the end of
    /// warmup), which the spans made from them need.
    pub fn measuring_from(&self, at: SystemTime) {
        self.measuring_from_ns
            .store(tailmesh_units::unix_nanos_at(at), Ordering::Relaxed);
    }

    /// Requests traced so far (head-sampled, the warmup's included),
    /// whether their traces were kept or not.
    pub fn traced(&self) -> u64 {
        self.traced.load(Ordering::Relaxed)
    }

    /// Adds `n` traced requests counted elsewhere (by a generator process
    /// that forwarded no span).
    pub fn add_traced(&self, n: u64) {
        self.traced.fetch_add(n, Ordering::Relaxed);
    }

    /// The CPU spent making this variant's client spans so far.
    pub fn cost(&self) -> CpuReading {
        self.making.read()
    }

    /// Its requests' trace identities.
    pub fn ids(&self) -> TraceIds {
        self.ids
    }

    /// The trace of request `id` ([`TraceIds::request`]).
    pub fn request(&self, id: u64) -> RequestTrace {
        self.ids.request(id)
    }

    /// Whether request `id` is traced.
    pub fn sampled(&self, id: u64) -> bool {
        self.request(id).sampled
    }

    /// The run decided `record`'s trace: the processes holding their
    /// spans are told, and when `kept` the request's own span is made
    /// from the record (its times on the wall clock of
    /// [`LoadTracer::measuring_from`]).
    pub fn decide(&self, record: &RequestRecord, kept: bool) {
        let t = self.request(record.id);
        self.collector.decisions.decide(t.trace_id, kept);
        if kept && self.holding {
            let from = SystemTime::UNIX_EPOCH
                + Duration::from_nanos(self.measuring_from_ns.load(Ordering::Relaxed));
            self.add(t, record.id, &Ended::of_record(record, from));
        }
    }

    /// Records the request's client span, as it `ended` (asked only when
    /// the span is made now). Spans wait in a
    /// batch (encoded already) until [`BATCH_SPANS`] of them are there or
    /// [`LoadTracer::flush`] runs. When holding, it only counts the
    /// request: a measured request's span is made when
    /// [`LoadTracer::decide`] keeps it, and a warmup request's, which is
    /// never decided, not at all (only a run keeping every trace, which
    /// holds nothing, keeps the warmup's).
    pub fn record(&self, t: RequestTrace, request_id: u64, ended: impl FnOnce() -> Ended) {
        if !t.sampled {
            return;
        }
        self.traced.fetch_add(1, Ordering::Relaxed);
        if !self.holding {
            self.add(t, request_id, &ended());
        }
    }

    /// Encodes a span into the batch, handing the batch on when full.
    fn add(&self, t: RequestTrace, request_id: u64, ended: &Ended) {
        let full = self.making.measure(|| {
            let mut batch = self.lock();
            self.encode(&mut batch.spans, t, request_id, ended);
            batch.count += 1;
            (batch.count >= BATCH_SPANS).then(|| batch.take(&self.resource))
        });
        if let Some((body, spans)) = full {
            self.collector.accept_encoded(body, spans);
        }
    }

    /// Hands the spans waiting in the batch to the collector. The load
    /// generator calls it every [`FLUSH_EVERY`] while it runs and once at
    /// the end, so a span waits at most that long.
    pub fn flush(&self) {
        let taken = self.making.measure(|| {
            let mut batch = self.lock();
            (batch.count > 0).then(|| batch.take(&self.resource))
        });
        if let Some((body, spans)) = taken {
            self.collector.accept_encoded(body, spans);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Batch> {
        lock(&self.batch)
    }

    /// The request's client span as a `Span` (field 2 of `ScopeSpans`),
    /// encoded straight into `buf`.
    fn encode(&self, buf: &mut BytesMut, t: RequestTrace, request_id: u64, ended: &Ended) {
        let end = tailmesh_units::unix_nanos_at(ended.ended);
        let start = end.saturating_sub(tailmesh_units::nanos(ended.latency));
        let span = otlp::open(buf, 2, 2);
        otlp::bytes_field(buf, 1, &t.trace_id.to_be_bytes());
        otlp::bytes_field(buf, 2, &t.span_id.to_be_bytes());
        // The name, "request <id>", written in place.
        let digits = request_id.checked_ilog10().unwrap_or(0) as usize + 1;
        otlp::tag(buf, 5, LEN);
        otlp::varint(buf, (NAME_PREFIX.len() + digits) as u64);
        buf.put_slice(NAME_PREFIX.as_bytes());
        let _ = write!(buf, "{request_id}");
        otlp::varint_field(buf, 6, SpanKind::Client as u64);
        otlp::fixed64_field(buf, 7, start);
        otlp::fixed64_field(buf, 8, end);
        otlp::int_attribute(buf, 9, "request_id", request_id as i64);
        otlp::attribute(buf, 9, "variant", FieldValue::Str(&self.variant));
        otlp::attribute(buf, 9, "hop", FieldValue::Str(SERVICE));
        if let Some(place) = ended.stream {
            // A stream's messages are traces of their own: these find them.
            otlp::int_attribute(buf, 9, "stream", place.stream as i64);
            otlp::int_attribute(buf, 9, "stream.message", i64::from(place.message));
        }
        if let Some(message) = &ended.error {
            let status = otlp::open(buf, 15, 1);
            if !message.is_empty() {
                otlp::bytes_field(buf, 2, message.as_bytes());
            }
            otlp::varint_field(buf, 3, StatusCode::Error as u64);
            otlp::close(buf, status);
        }
        otlp::fixed32_field(buf, 16, 1);
        otlp::close(buf, span);
    }
}

impl Drop for LoadTracer {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Spans a batch holds before it goes to the collector on its own.
pub const BATCH_SPANS: u64 = 256;
/// How often the load generator hands on the spans waiting in the batch.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

const NAME_PREFIX: &str = "request ";
/// A timed-out request's span status message (its record keeps no
/// message).
const TIMED_OUT: &str = "deadline exceeded";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a traced request ended, as its client span records it.
#[derive(Clone, Debug)]
pub struct Ended {
    /// When (wall clock), having lasted `latency` from its intended send
    /// time.
    pub ended: SystemTime,
    pub latency: Duration,
    /// Its error's message, if it failed.
    pub error: Option<String>,
    /// Which message of which stream it was, if one.
    pub stream: Option<StreamPlace>,
}

impl Ended {
    /// A call that ended at `ended` after `latency`, failed with `error`
    /// when given.
    pub fn new(ended: SystemTime, latency: Duration, error: Option<&str>) -> Self {
        Ended {
            ended,
            latency,
            error: error.map(str::to_owned),
            stream: None,
        }
    }

    /// How `record` ended, its times counted from `measuring_from` on the
    /// wall clock.
    pub fn of_record(record: &RequestRecord, measuring_from: SystemTime) -> Self {
        Ended {
            ended: measuring_from + record.end,
            latency: record.latency(),
            error: match &record.outcome {
                Outcome::Ok => None,
                Outcome::Timeout => Some(TIMED_OUT.to_owned()),
                Outcome::Error { message, .. } => Some(message.clone()),
            },
            stream: record.stream,
        }
    }
}

/// Protobuf's wire type of length-delimited fields.
const LEN: u8 = 2;

/// The client spans recorded and not yet handed to the collector: their
/// `Span` messages, encoded one after another.
#[derive(Default)]
struct Batch {
    spans: BytesMut,
    count: u64,
}

impl Batch {
    /// The waiting spans as one export request (`resource`: the encoded
    /// `Resource` and `InstrumentationScope` fields), and how many; the
    /// batch is empty after.
    fn take(&mut self, resource: &Head) -> (Bytes, u64) {
        let scope_spans = resource.scope.len() + self.spans.len();
        let resource_spans =
            resource.resource.len() + 1 + otlp::varint_len(scope_spans as u64) + scope_spans;
        let mut body = BytesMut::with_capacity(resource_spans + 2 * (1 + otlp::MAX_VARINT));
        otlp::tag(&mut body, 1, LEN);
        otlp::varint(&mut body, resource_spans as u64);
        body.put_slice(&resource.resource);
        otlp::tag(&mut body, 2, LEN);
        otlp::varint(&mut body, scope_spans as u64);
        body.put_slice(&resource.scope);
        body.put_slice(&self.spans);
        self.spans.clear();
        (body.freeze(), std::mem::take(&mut self.count))
    }
}

/// The fixed fields every batch starts with, encoded once: the
/// `Resource` (field 1 of `ResourceSpans`: `service.name` = [`SERVICE`])
/// and the `InstrumentationScope` (field 1 of `ScopeSpans`).
struct Head {
    resource: Bytes,
    scope: Bytes,
}

impl Head {
    fn new() -> Self {
        let mut resource = BytesMut::new();
        let r = otlp::open(&mut resource, 1, 1);
        otlp::attribute(&mut resource, 1, "service.name", FieldValue::Str(SERVICE));
        otlp::close(&mut resource, r);
        let mut scope = BytesMut::new();
        let s = otlp::open(&mut scope, 1, 1);
        otlp::bytes_field(&mut scope, 1, SCOPE.as_bytes());
        otlp::close(&mut scope, s);
        Head {
            resource: resource.freeze(),
            scope: scope.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::{
        common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value},
        resource::v1::Resource,
        trace::v1::{ResourceSpans, ScopeSpans, Span, Status},
    };

    use super::*;

    /// An attribute as prost builds it.
    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    /// The client span of `request_id`, built as prost structs: what the
    /// encoded batch must decode to.
    fn expected(
        tracer: &LoadTracer,
        request_id: u64,
        ended: SystemTime,
        latency: Duration,
        error: Option<&str>,
    ) -> Span {
        let t = tracer.request(request_id);
        let end = tailmesh_units::unix_nanos_at(ended);
        Span {
            trace_id: t.trace_id.to_be_bytes().to_vec(),
            span_id: t.span_id.to_be_bytes().to_vec(),
            name: format!("request {request_id}"),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: end.saturating_sub(tailmesh_units::nanos(latency)),
            end_time_unix_nano: end,
            flags: 1,
            attributes: vec![
                kv("request_id", Value::IntValue(request_id as i64)),
                kv("variant", Value::StringValue(tracer.variant.clone())),
                kv("hop", Value::StringValue(SERVICE.into())),
            ],
            status: error.map(|message| Status {
                message: message.to_string(),
                code: StatusCode::Error as i32,
            }),
            ..Span::default()
        }
    }

    #[test]
    fn a_streams_message_carries_its_stream_and_place() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(10_000, None, tmp.path()).expect("collector");
        let tracer = LoadTracer::new(Arc::clone(&collector), "v", 1.0, 7);
        let ended = Ended {
            stream: Some(StreamPlace {
                stream: 12,
                message: 7,
            }),
            ..Ended::new(SystemTime::now(), Duration::from_micros(5), None)
        };
        tracer.record(tracer.request(3), 3, || ended);
        tracer.flush();
        let span = collector
            .take()
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans)
            .next()
            .expect("one span");
        let tail: Vec<&KeyValue> = span.attributes.iter().skip(3).collect();
        assert_eq!(
            tail,
            [
                &kv("stream", Value::IntValue(12)),
                &kv("stream.message", Value::IntValue(7))
            ]
        );
    }

    /// The names of the spans the collector spooled, in order.
    fn span_names(collector: &Collector) -> Vec<String> {
        collector
            .take()
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans)
            .map(|s| s.name)
            .collect()
    }

    fn trace_ids(bytes: &[u8]) -> Vec<u128> {
        bytes
            .chunks_exact(16)
            .map(|c| u128::from_be_bytes(c.try_into().expect("16 bytes")))
            .collect()
    }

    #[test]
    fn batched_client_spans_decode_to_the_spans_recorded() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(10_000, None, tmp.path()).expect("collector");
        let tracer = LoadTracer::new(Arc::clone(&collector), "fast", 1.0, 42);
        let ended = std::time::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        let cases: [(u64, Duration, Option<&str>); 4] = [
            (0, Duration::from_micros(850), None),
            (
                9,
                Duration::from_millis(3),
                Some("deadline exceeded at hop b"),
            ),
            (1_234_567, Duration::from_nanos(1), Some("")),
            (u64::from(u32::MAX) * 300, Duration::from_secs(2), None),
        ];
        for (id, latency, error) in cases {
            tracer.record(tracer.request(id), id, || Ended::new(ended, latency, error));
        }
        // Nothing is handed on before the batch fills or is flushed.
        assert_eq!(collector.counts().spans, 0);
        tracer.flush();
        assert_eq!(collector.counts().spans, cases.len() as u64);
        let got = collector.take();
        let want = vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(Value::StringValue(SERVICE.into())),
                    }),
                    ..KeyValue::default()
                }],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: SCOPE.into(),
                    ..InstrumentationScope::default()
                }),
                spans: cases
                    .iter()
                    .map(|(id, latency, error)| expected(&tracer, *id, ended, *latency, *error))
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }];
        assert_eq!(got, want);
    }

    #[test]
    fn a_full_batch_goes_on_by_itself_and_the_rest_when_flushed_or_dropped() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(10_000, None, tmp.path()).expect("collector");
        let tracer = LoadTracer::new(Arc::clone(&collector), "v", 1.0, 7);
        let ended = SystemTime::now();
        let extra = 3;
        for id in 0..BATCH_SPANS + extra {
            tracer.record(tracer.request(id), id, || {
                Ended::new(ended, Duration::from_micros(5), None)
            });
        }
        assert_eq!(collector.counts().spans, BATCH_SPANS);
        tracer.record(tracer.request(999), 999, || {
            Ended::new(ended, Duration::from_micros(5), None)
        });
        drop(tracer);
        assert_eq!(collector.counts().spans, BATCH_SPANS + extra + 1);
        let ids = span_names(&collector);
        assert_eq!(ids.len() as u64, BATCH_SPANS + extra + 1);
        assert_eq!(ids.last().map(String::as_str), Some("request 999"));
    }

    #[test]
    fn holding_only_kept_requests_spans_are_made_from_their_records() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(10_000, None, tmp.path()).expect("collector");
        let tracer = LoadTracer::new(Arc::clone(&collector), "v", 1.0, 7).holding(true);
        let from = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        tracer.measuring_from(from);
        // Ended requests, a warmup one's among them: counted, no span yet.
        for id in 0..5 {
            tracer.record(tracer.request(id), id, || {
                Ended::new(SystemTime::now(), Duration::from_micros(5), None)
            });
        }
        tracer.flush();
        assert_eq!(collector.counts().spans, 0, "nothing before a decision");
        assert_eq!(tracer.traced(), 5);
        let ms = Duration::from_millis;
        // Meant for 7 ms after warmup, answered 3 ms later; and so on.
        let record = tailmesh_analysis::testing::at;
        tracer.decide(&record(1, 7, 3, Outcome::Ok), true);
        tracer.decide(&record(2, 19, 1, Outcome::Ok), false);
        tracer.decide(&record(3, 38, 2, Outcome::Timeout), true);
        tracer.flush();
        // Only the kept ones, made from their records, on the wall clock
        // the records count from.
        let spans: Vec<Span> = collector
            .take()
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans)
            .collect();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["request 1", "request 3"]);
        let unix_ns = |d: Duration| tailmesh_units::unix_nanos_at(from + d);
        assert_eq!(
            (spans[0].start_time_unix_nano, spans[0].end_time_unix_nano),
            (unix_ns(ms(7)), unix_ns(ms(10)))
        );
        assert_eq!(
            (spans[1].start_time_unix_nano, spans[1].end_time_unix_nano),
            (unix_ns(ms(38)), unix_ns(ms(40)))
        );
        let status = spans[1].status.as_ref().expect("a timed-out one's status");
        assert_eq!(
            (status.code, status.message.as_str()),
            (StatusCode::Error as i32, TIMED_OUT)
        );
        assert!(spans[0].status.is_none(), "ok: no status");
        // The processes were told of each: the kept ones as kept, the
        // dropped one as dropped.
        let told = collector.decisions.after(0, 100);
        let id = |r: u64| tracer.request(r).trace_id;
        assert_eq!(trace_ids(&told.trace_ids), [id(1), id(3)]);
        assert_eq!(trace_ids(&told.dropped_ids), [id(2)]);
        // Not holding (every trace kept), a span goes on as its request
        // ends, the warmup's too.
        let all = LoadTracer::new(Arc::clone(&collector), "v", 1.0, 7);
        all.record(all.request(5), 5, || {
            Ended::new(SystemTime::now(), Duration::from_micros(5), None)
        });
        all.flush();
        assert_eq!(span_names(&collector), ["request 5"]);
    }

    #[test]
    fn unsampled_requests_record_nothing() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let collector = Collector::new(10_000, None, tmp.path()).expect("collector");
        let tracer = LoadTracer::new(Arc::clone(&collector), "v", 0.0, 7);
        let t = tracer.request(1);
        assert!(!t.sampled);
        tracer.record(t, 1, || {
            Ended::new(SystemTime::now(), Duration::from_micros(5), None)
        });
        tracer.flush();
        assert_eq!(collector.counts().spans, 0);
    }
}
