//! Traces: the tracing subscriber of a hop or broker process, export of
//! tailmesh's spans over OTLP gRPC, and W3C trace context carried in gRPC
//! metadata (push) and in broker task headers (pull).
//!
//! Export is on only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the
//! orchestrator sets it to its embedded receiver); then the process's
//! service name comes from `OTEL_SERVICE_NAME` and the parent-based
//! sampling ratio from `OTEL_TRACES_SAMPLER_ARG` (default 1.0); the other
//! `OTEL_*` variables read are listed in [`export`].
//!
//! Spans are tailmesh's own, not `tracing`'s nor the OpenTelemetry SDK's:
//! a span costs a plain record on the serving thread and is encoded and
//! sent by one exporter thread per process. When export is off no span is
//! made at all. What every span of a process shares (a hop replica's hop,
//! replica and transport, and the variant: [`Process`]) is said once, in
//! the resource of its export requests; a span carries only its own
//! facts, in fixed fields ([`SpanFields`]).
//!
//! - [`context`]: the `Copy` trace context, the current one while a
//!   future is polled, `traceparent` formatting and parsing;
//! - [`fields`]: a span's fixed fields ([`SpanFields`]) and their
//!   attribute values;
//! - [`recorder`]: [`TraceSpan`], ids, sampling,
//!   hand-over to the exporter, the observer's serving-thread cost;
//! - [`export`]: the exporter thread, its batches, the observer's
//!   counters in every request's resource;
//! - [`held`]: spans held by trace until the run's keep decisions;
//! - [`otlp`]: spans written straight as OTLP protobuf bytes, and the
//!   gRPC codec sending those bytes as they are.

pub mod context;
pub mod export;
pub mod fields;
pub mod held;
pub mod otlp;
pub mod recorder;

use std::{collections::HashMap, sync::OnceLock};

use tailmesh_proto::pb::TraceContext;

pub use context::{SpanContext, current, scope};
pub use fields::{SpanFields, intern};
pub use recorder::{TraceSpan, past_span};
use tonic::{
    codegen::http::HeaderValue,
    metadata::{MetadataMap, MetadataValue},
};
use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};

use crate::model::Transport;

/// The environment variable naming the variant a process serves in.
pub const VARIANT_ENV: &str = "TAILMESH_VARIANT";
/// Spans a serving thread leaves for export at most between two of the
/// exporter's takes (about 6 MB of records; the exporter is woken long
/// before, every [`recorder::WAKE_EVERY`], so a buffer fills only when
/// the exporter cannot keep up); more are dropped and counted.
pub const MAX_QUEUE: usize = 32_768;

static VARIANT: OnceLock<String> = OnceLock::new();

/// The variant this process serves in (from [`VARIANT_ENV`]), or "".
pub fn variant() -> &'static str {
    VARIANT.get_or_init(|| std::env::var(VARIANT_ENV).unwrap_or_default())
}

/// What a process is, for every span it exports: the `hop`, `replica` and
/// `transport` attributes of its resource (a hop replica's; none for the
/// broker, which serves many hops and names each on its spans), beside
/// `variant` (from [`VARIANT_ENV`]), which every process's resource has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub hop: Option<String>,
    pub replica: Option<u32>,
    /// How callers reach the hop.
    pub transport: Option<Transport>,
}

impl Process {
    /// Replica `replica` of hop `hop`, reached by `transport`.
    pub fn hop(hop: &str, replica: u32, transport: Transport) -> Self {
        Process {
            hop: Some(hop.to_owned()),
            replica: Some(replica),
            transport: Some(transport),
        }
    }
}

/// The process's tracing set-up; call [`Telemetry::shutdown`] before exit
/// so spans still queued are flushed.
#[must_use = "shut telemetry down to flush its spans"]
pub struct Telemetry {
    exporter: Option<export::ExportThread>,
}

impl Telemetry {
    /// Flushes queued spans (waiting up to 5 s) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(exporter) = self.exporter {
            exporter.shutdown();
        }
    }
}

/// The sampling ratio from `OTEL_TRACES_SAMPLER_ARG`, 1.0 when unset or
/// invalid.
fn ratio_from_env() -> f64 {
    std::env::var("OTEL_TRACES_SAMPLER_ARG")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|r| (0.0..=1.0).contains(r))
        .unwrap_or(1.0)
}

/// Installs the global subscriber: log lines to stderr filtered by
/// `RUST_LOG` (default `default_filter`), plus OTLP export of tailmesh's
/// spans when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, from a process that
/// says no more of itself than its variant.
pub fn init(default_filter: &str) -> Telemetry {
    init_process(default_filter, &Process::default())
}

/// [`init`] for `process`, which its spans' resource names.
pub fn init_process(default_filter: &str, process: &Process) -> Telemetry {
    let log_filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(log_filter);
    let _ = tracing_subscriber::registry().with(fmt).try_init();
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty());
    let exporter = endpoint.and_then(|endpoint| match start_export(&endpoint, process) {
        Ok(exporter) => Some(exporter),
        Err(e) => {
            eprintln!("warning: trace export to {endpoint} disabled: {e}");
            None
        }
    });
    Telemetry { exporter }
}

/// Starts the exporter thread and installs the recorder feeding it.
fn start_export(
    endpoint: &str,
    process: &Process,
) -> Result<export::ExportThread, export::ExportError> {
    let config = export::ExportConfig::from_env(endpoint, process)?;
    let (recorder, spans, counters) = recorder::Recorder::new(ratio_from_env(), MAX_QUEUE);
    let exporter = export::ExportThread::spawn(config, spans, counters)?;
    let recorder = recorder.waking(exporter.waker());
    if !recorder.install() {
        tracing::warn!("trace export: a recorder was already installed; keeping it");
    }
    Ok(exporter)
}

/// Sets fields with `set` on the current span (the one whose
/// [`TraceSpan::scope`] is running); nothing when export is off or the
/// current context is not a recorded span of this process.
pub fn set_current(set: impl FnOnce(&mut SpanFields)) {
    if recorder::recorder().is_some() && current().is_some_and(|c| c.sampled && !c.remote) {
        context::set_pending(set);
    }
}

/// The current context (see [`scope`]) as a `traceparent` header value,
/// made from a stack buffer (the value's own bytes are its one
/// allocation); `None` when there is none. It is marked never to be
/// indexed by HPACK: a value used once would only churn both ends'
/// dynamic tables, evicting the headers that do repeat.
pub fn traceparent_header() -> Option<HeaderValue> {
    let cx = current()?;
    let cost = recorder::cost_start();
    let value = HeaderValue::from_bytes(&cx.traceparent_bytes())
        .ok()
        .map(|mut v| {
            v.set_sensitive(true);
            v
        });
    recorder::cost_end(cost);
    value
}

/// The current context (see [`scope`]) as a call's binary trace context
/// (`CallRequest.trace`), for a callee that is a tailmesh process; `None`
/// when there is none.
pub fn current_wire() -> Option<TraceContext> {
    let cx = current()?;
    let cost = recorder::cost_start();
    let wire = wire(&cx);
    recorder::cost_end(cost);
    Some(wire)
}

/// `cx` as a binary trace context.
pub fn wire(cx: &SpanContext) -> TraceContext {
    TraceContext {
        trace_id_high: (cx.trace_id >> 64) as u64,
        trace_id_low: cx.trace_id as u64,
        span_id: cx.span_id,
        sampled: cx.sampled,
    }
}

/// The caller's context of a unary call: its binary one (`trace`, from a
/// tailmesh process), or else its `traceparent` metadata (from a caller
/// of another kind). A binary context with a zero trace or span id is
/// none, as such a `traceparent` is.
pub fn extract_call(trace: Option<&TraceContext>, metadata: &MetadataMap) -> Option<SpanContext> {
    match trace {
        Some(t) => wire_context(t),
        None => extract_metadata(metadata),
    }
}

/// The context a binary trace context (a call's or stream message's
/// `trace`) gives; none for a zero trace or span id, as for such a
/// `traceparent`.
pub fn wire_context(t: &TraceContext) -> Option<SpanContext> {
    let trace_id = (u128::from(t.trace_id_high) << 64) | u128::from(t.trace_id_low);
    (trace_id != 0 && t.span_id != 0).then_some(SpanContext {
        trace_id,
        span_id: t.span_id,
        sampled: t.sampled,
        remote: true,
    })
}

/// Writes the current context (see [`scope`]) into gRPC metadata as
/// `traceparent`; nothing when there is none.
pub fn inject_metadata(metadata: &mut MetadataMap) {
    let Some(cx) = current() else {
        return;
    };
    let cost = recorder::cost_start();
    if let Ok(mut value) = MetadataValue::try_from(&cx.traceparent_bytes()) {
        // Used once: not worth a place in HPACK's dynamic tables.
        value.set_sensitive(true);
        metadata.insert(context::TRACEPARENT, value);
    }
    recorder::cost_end(cost);
}

/// The caller's context from gRPC metadata, parsed in place.
pub fn extract_metadata(metadata: &MetadataMap) -> Option<SpanContext> {
    let cost = recorder::cost_start();
    let cx = metadata
        .get(context::TRACEPARENT)
        .and_then(|v| SpanContext::parse_bytes(v.as_encoded_bytes()));
    recorder::cost_end(cost);
    cx
}

/// Writes `cx` into broker task headers, over the `traceparent` already
/// there (in its memory) if any; nothing when there is none.
pub fn inject_headers(cx: &Option<SpanContext>, headers: &mut HashMap<String, String>) {
    if let Some(cx) = cx {
        let cost = recorder::cost_start();
        match headers.get_mut(context::TRACEPARENT) {
            Some(value) => cx.write_traceparent(value),
            None => {
                headers.insert(context::TRACEPARENT.to_owned(), cx.traceparent());
            }
        }
        recorder::cost_end(cost);
    }
}

/// The producer's context from broker task headers, taken out of them:
/// a broker passes its queue-wait span's context on instead, in the task's
/// binary `trace`.
pub fn take_from_headers(headers: &mut HashMap<String, String>) -> Option<SpanContext> {
    let cx = extract_headers(headers);
    headers.remove(context::TRACEPARENT);
    cx
}

/// The producer's context from broker task headers.
pub fn extract_headers(headers: &HashMap<String, String>) -> Option<SpanContext> {
    let cost = recorder::cost_start();
    let cx = headers
        .get(context::TRACEPARENT)
        .and_then(|v| SpanContext::parse(v));
    recorder::cost_end(cost);
    cx
}

/// A W3C `traceparent` value: version 00, the ids in lower-case hex, and
/// the sampled flag.
pub fn traceparent(trace_id: u128, span_id: u64, sampled: bool) -> String {
    SpanContext {
        trace_id,
        span_id,
        sampled,
        remote: false,
    }
    .traceparent()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_through_headers_and_metadata() {
        let value = traceparent(0xabc, 0x12, true);
        assert_eq!(
            value,
            "00-00000000000000000000000000000abc-0000000000000012-01"
        );
        let headers = HashMap::from([("traceparent".to_string(), value.clone())]);
        let cx = extract_headers(&headers);
        let sc = cx.expect("a context");
        assert_eq!(sc.trace_id, 0xabc);
        assert!(sc.sampled && sc.remote);
        let mut out = HashMap::new();
        inject_headers(&cx, &mut out);
        assert_eq!(out.get("traceparent"), Some(&value));
        let mut md = MetadataMap::new();
        md.insert("traceparent", value.parse().expect("ascii"));
        let sc2 = extract_metadata(&md).expect("a context");
        assert_eq!(sc2.span_id, sc.span_id);
    }

    #[tokio::test]
    async fn a_binary_context_round_trips_and_comes_before_the_header() {
        assert_eq!(current_wire(), None);
        let cx = SpanContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .expect("a context");
        let wire = scope(Some(cx), None, async { current_wire() })
            .await
            .expect("a binary context");
        assert_eq!(wire.trace_id_high, 0x0af7_6519_16cd_43dd);
        assert_eq!(wire.trace_id_low, 0x8448_eb21_1c80_319c);
        let mut md = MetadataMap::new();
        md.insert(
            "traceparent",
            traceparent(0xabc, 0x12, false).parse().expect("ascii"),
        );
        // The binary context wins over the header; without it, the header.
        assert_eq!(extract_call(Some(&wire), &md), Some(cx));
        assert_eq!(
            extract_call(None, &md).map(|c| (c.trace_id, c.span_id, c.sampled)),
            Some((0xabc, 0x12, false))
        );
        // Zero ids are no context, as in a `traceparent`.
        for bad in [
            TraceContext { span_id: 0, ..wire },
            TraceContext {
                trace_id_high: 0,
                trace_id_low: 0,
                ..wire
            },
        ] {
            assert_eq!(extract_call(Some(&bad), &MetadataMap::new()), None);
        }
    }

    #[tokio::test]
    async fn the_current_context_is_injected_into_metadata() {
        let cx = SpanContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
        let md = scope(cx, None, async {
            let mut md = MetadataMap::new();
            inject_metadata(&mut md);
            md
        })
        .await;
        assert_eq!(extract_metadata(&md), cx);
    }

    #[tokio::test]
    async fn the_traceparent_header_is_the_w3c_value_of_the_current_context() {
        assert_eq!(traceparent_header(), None);
        let cx = SpanContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let value = scope(cx, None, async { traceparent_header() })
            .await
            .expect("a value");
        assert_eq!(
            value.to_str().ok(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        assert_eq!(SpanContext::parse_bytes(value.as_bytes()), cx);
        assert!(value.is_sensitive(), "never indexed by HPACK");
    }

    #[test]
    fn injecting_over_a_traceparent_rewrites_it_in_place() {
        let first = SpanContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let second = SpanContext::parse("00-11111111111111111111111111111111-2222222222222222-00");
        let mut headers = HashMap::from([("other".to_string(), "x".to_string())]);
        inject_headers(&first, &mut headers);
        let before = headers[context::TRACEPARENT].as_ptr();
        inject_headers(&second, &mut headers);
        assert_eq!(extract_headers(&headers), second);
        assert_eq!(
            headers[context::TRACEPARENT].as_ptr(),
            before,
            "same memory"
        );
        assert_eq!(headers["other"], "x");
        assert_eq!(headers.len(), 2);
    }

    #[test]
    fn no_context_injects_nothing() {
        let mut out = HashMap::new();
        inject_headers(&None, &mut out);
        assert!(out.is_empty());
        let mut md = MetadataMap::new();
        inject_metadata(&mut md);
        assert!(md.is_empty());
    }
}
