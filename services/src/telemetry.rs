//! Traces: the tracing subscriber of a hop or broker process, its
//! OpenTelemetry export over OTLP gRPC, and W3C trace context carried in
//! gRPC metadata (push) and in broker task headers (pull).
//!
//! Export is on only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the
//! orchestrator sets it to its embedded receiver); then the process's
//! service name comes from `OTEL_SERVICE_NAME` and the parent-based
//! sampling ratio from `OTEL_TRACES_SAMPLER_ARG` (default 1.0).
//!
//! Spans ([`TraceSpan`]) are made with the OpenTelemetry API directly, not
//! through `tracing`: only tailmesh's own spans exist for export (h2,
//! hyper, tonic and tower's `tracing` spans never reach it), and a span
//! costs one SDK span, with no subscriber bookkeeping on every poll. When
//! export is off no span is made at all.

use std::{borrow::Cow, collections::HashMap, sync::OnceLock, time::Duration};

use opentelemetry::{
    Context, KeyValue,
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::{SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _},
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider},
};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};

/// The environment variable naming the variant a process serves in.
pub const VARIANT_ENV: &str = "TAILMESH_VARIANT";
/// Spans waiting for export at most; more are dropped by the SDK.
const MAX_QUEUE: usize = 65_536;

static VARIANT: OnceLock<String> = OnceLock::new();
/// The tracer of tailmesh's spans, set once when export is on (also for
/// spans whose start lies in the past: see [`past_span`]).
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// The variant this process serves in (from [`VARIANT_ENV`]), or "".
pub fn variant() -> &'static str {
    VARIANT.get_or_init(|| std::env::var(VARIANT_ENV).unwrap_or_default())
}

/// The process's tracing set-up; call [`Telemetry::shutdown`] before exit
/// so spans still queued are flushed.
#[must_use = "shut telemetry down to flush its spans"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    exporter: Option<ExportThread>,
}

/// The exporter's own thread and runtime: encoding and sending span
/// batches never runs on the thread that serves requests.
type ExportThread = crate::runtime_thread::RuntimeThread;

impl Telemetry {
    /// Flushes queued spans (waiting up to 5 s) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5))
        {
            tracing::warn!("trace export shutdown: {e}");
        }
        // Dropping the thread stops and joins it.
        drop(self.exporter);
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
/// spans when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
pub fn init(default_filter: &str) -> Telemetry {
    let log_filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(log_filter);
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty());
    let (provider, exporter) = match endpoint.map(|e| (export_thread(&e), e)) {
        None => (None, None),
        Some((Ok((p, t)), _)) => (Some(p), Some(t)),
        Some((Err(e), endpoint)) => {
            eprintln!("warning: trace export to {endpoint} disabled: {e}");
            (None, None)
        }
    };
    if let Some(p) = &provider {
        let _ = TRACER.set(p.tracer("tailmesh"));
    }
    let _ = tracing_subscriber::registry().with(fmt).try_init();
    Telemetry { provider, exporter }
}

/// Why spans cannot be exported (the process then runs without export).
#[derive(Debug, thiserror::Error)]
enum ExportError {
    /// The exporter could not be built for the endpoint.
    #[error(transparent)]
    Build(#[from] opentelemetry_otlp::ExporterBuildError),
    /// The exporter's thread could not start.
    #[error(transparent)]
    Thread(#[from] crate::runtime_thread::ThreadError),
}

/// Starts the exporter's thread and builds the provider there, so the
/// tonic channel's tasks run on that thread's runtime.
fn export_thread(endpoint: &str) -> Result<(SdkTracerProvider, ExportThread), ExportError> {
    let endpoint = endpoint.to_string();
    ExportThread::spawn("otlp-export", move |ready, stopped| async move {
        let _ = ready.send(provider(&endpoint).map_err(ExportError::from));
        let _ = stopped.await;
    })
}

fn provider(endpoint: &str) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()?;
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(MAX_QUEUE)
                .with_max_export_batch_size(512)
                .with_scheduled_delay(Duration::from_millis(200))
                .build(),
        )
        .build();
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "tailmesh".into());
    Ok(SdkTracerProvider::builder()
        .with_span_processor(batch)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            ratio_from_env(),
        ))))
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}

/// One of tailmesh's spans, or nothing when export is off. It ends when
/// [`TraceSpan::end`] is called or when dropped.
pub struct TraceSpan {
    /// The parent's context with this span in it; `None` when export is
    /// off.
    cx: Option<Context>,
}

impl TraceSpan {
    /// Starts a span of `kind`, child of `parent()`, named and attributed
    /// by `describe()`. Neither closure runs when export is off.
    pub fn start(
        kind: SpanKind,
        parent: impl FnOnce() -> Context,
        describe: impl FnOnce() -> (Cow<'static, str>, Vec<KeyValue>),
    ) -> Self {
        let Some(tracer) = TRACER.get() else {
            return TraceSpan { cx: None };
        };
        let parent = parent();
        let (name, attributes) = describe();
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent);
        TraceSpan {
            cx: Some(parent.with_span(span)),
        }
    }

    /// The context to run this span's work in (current while it is
    /// polled, so clients inject it): empty when there is no span.
    pub fn context(&self) -> Context {
        self.cx.clone().unwrap_or_default()
    }

    /// Sets attributes made by `attributes()` (not run without a span).
    pub fn set(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.cx {
            cx.span().set_attributes(attributes());
        }
    }

    /// Marks the span failed with the gRPC code of an error `result`.
    pub fn mark_error<T>(&self, result: &Result<T, tonic::Status>) {
        if let (Some(cx), Err(status)) = (&self.cx, result) {
            let span = cx.span();
            span.set_status(Status::error(""));
            span.set_attribute(KeyValue::new("grpc_code", status.code().description()));
        }
    }

    /// Ends the span now.
    pub fn end(self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }
}

/// Sets attributes made by `attributes()` on the current span (the one
/// whose context the running future carries); nothing when export is off.
pub fn set_current(attributes: impl FnOnce() -> Vec<KeyValue>) {
    if TRACER.get().is_some() {
        Context::map_current(|cx| cx.span().set_attributes(attributes()));
    }
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        Vec::new()
    }
}

/// Writes the current OpenTelemetry context (the entered span's) into
/// gRPC metadata as `traceparent`; nothing when there is none.
pub fn inject_metadata(metadata: &mut MetadataMap) {
    let cx = Context::current();
    if has_span(&cx) {
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(metadata));
    }
}

/// The caller's context from gRPC metadata.
pub fn extract_metadata(metadata: &MetadataMap) -> Context {
    TraceContextPropagator::new().extract(&MetadataExtractor(metadata))
}

/// Writes `cx` into broker task headers; nothing when it has no span.
pub fn inject_headers(cx: &Context, headers: &mut HashMap<String, String>) {
    if has_span(cx) {
        TraceContextPropagator::new().inject_context(cx, headers);
    }
}

/// The producer's context from broker task headers.
pub fn extract_headers(headers: &HashMap<String, String>) -> Context {
    TraceContextPropagator::new().extract(headers)
}

/// Whether `cx` holds a valid span context.
pub fn has_span(cx: &Context) -> bool {
    cx.span().span_context().is_valid()
}

/// A W3C `traceparent` value: version 00, the ids in lower-case hex, and
/// the sampled flag.
pub fn traceparent(trace_id: u128, span_id: u64, sampled: bool) -> String {
    format!(
        "00-{trace_id:032x}-{span_id:016x}-{:02x}",
        u8::from(sampled)
    )
}

/// Records a finished internal span `name` under `parent` that started at
/// `start` and ends now (a queue wait measured from a broker's enqueue
/// time, which no `tracing` span can start at), with `attributes`; returns
/// the context under which its children go. Without export, or without a
/// sampled parent, nothing is recorded and `parent` comes back.
pub fn past_span(
    name: String,
    start: std::time::SystemTime,
    attributes: Vec<opentelemetry::KeyValue>,
    parent: Context,
) -> Context {
    use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer};
    let Some(tracer) = TRACER.get() else {
        return parent;
    };
    if !has_span(&parent) {
        return parent;
    }
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Internal)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    let cx = parent.with_span(span);
    cx.span().end();
    cx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_through_headers_and_metadata() {
        use opentelemetry::trace::TraceContextExt;
        let value = traceparent(0xabc, 0x12, true);
        assert_eq!(
            value,
            "00-00000000000000000000000000000abc-0000000000000012-01"
        );
        let headers = HashMap::from([("traceparent".to_string(), value.clone())]);
        let cx = extract_headers(&headers);
        let sc = cx.span().span_context().clone();
        assert_eq!(format!("{:032x}", sc.trace_id()), format!("{:032x}", 0xabc));
        assert!(sc.is_sampled());
        let mut out = HashMap::new();
        inject_headers(&cx, &mut out);
        assert_eq!(out.get("traceparent"), Some(&value));
        let mut md = MetadataMap::new();
        md.insert("traceparent", value.parse().expect("ascii"));
        let sc2 = extract_metadata(&md).span().span_context().clone();
        assert_eq!(sc2.span_id(), sc.span_id());
    }

    #[test]
    fn no_context_injects_nothing() {
        let mut out = HashMap::new();
        inject_headers(&Context::new(), &mut out);
        assert!(out.is_empty());
        let mut md = MetadataMap::new();
        inject_metadata(&mut md);
        assert!(md.is_empty());
    }
}
