//! The load generator's client span of each request: the root of its
//! trace, started at the request's intended send time so client-side
//! queueing shows in the trace, recorded straight into the collector.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value::Value},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span::SpanKind, status::StatusCode},
};

use tailmesh_services::telemetry::SpanContext;

use super::{
    collector::Collector,
    observer::{CpuMeter, CpuReading},
};

/// The service name of the load generator's spans.
pub const SERVICE: &str = "loadgen";

/// Makes the load generator's spans for one variant.
pub struct LoadTracer {
    collector: Arc<Collector>,
    variant: String,
    ratio: f64,
    /// Distinguishes this variant's trace ids from other runs'.
    nonce: u64,
    /// Making the client spans (spooling them is the collector's).
    making: CpuMeter,
}

impl std::fmt::Debug for LoadTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadTracer")
            .field("variant", &self.variant)
            .field("ratio", &self.ratio)
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
            ratio,
            nonce,
            making: CpuMeter::sampled(),
        }
    }

    /// The CPU spent making this variant's client spans so far.
    pub fn cost(&self) -> CpuReading {
        self.making.read()
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

    /// Whether request `id` is traced.
    pub fn sampled(&self, id: u64) -> bool {
        self.request(id).sampled
    }

    /// The context the request's downstream calls carry.
    pub fn context(&self, t: RequestTrace) -> SpanContext {
        SpanContext {
            trace_id: t.trace_id,
            span_id: t.span_id,
            sampled: t.sampled,
            remote: true,
        }
    }

    /// Records the request's client span, from its intended send time to
    /// `ended` (wall clock) having lasted `latency`.
    pub fn record(
        &self,
        t: RequestTrace,
        request_id: u64,
        ended: SystemTime,
        latency: Duration,
        error: Option<&str>,
    ) {
        if !t.sampled {
            return;
        }
        let batch = self
            .making
            .measure(|| self.batch(t, request_id, ended, latency, error));
        self.collector.accept(batch);
    }

    /// The request's client span, as the batch the collector takes.
    fn batch(
        &self,
        t: RequestTrace,
        request_id: u64,
        ended: SystemTime,
        latency: Duration,
        error: Option<&str>,
    ) -> Vec<ResourceSpans> {
        let end = ended
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let start = end.saturating_sub(latency.as_nanos() as u64);
        let kv = |key: &str, value: Value| KeyValue {
            key: key.to_string(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        };
        let span = Span {
            trace_id: t.trace_id.to_be_bytes().to_vec(),
            span_id: t.span_id.to_be_bytes().to_vec(),
            name: format!("request {request_id}"),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            flags: 1,
            attributes: vec![
                kv("request_id", Value::IntValue(request_id as i64)),
                kv("variant", Value::StringValue(self.variant.clone())),
                kv("hop", Value::StringValue(SERVICE.into())),
            ],
            status: error.map(|message| Status {
                message: message.to_string(),
                code: StatusCode::Error as i32,
            }),
            ..Span::default()
        };
        vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", Value::StringValue(SERVICE.into()))],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "tailmesh".into(),
                    ..InstrumentationScope::default()
                }),
                spans: vec![span],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }]
    }
}
