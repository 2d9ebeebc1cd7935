//! The run's traces: the embedded OTLP receiver and forwarder
//! (`collector`), which spools every span to disk as it arrives (`spool`);
//! the load generator's own spans (`loadgen`); the tail sampler, which
//! decides at each request's end whether its trace is kept (`tail`); the
//! streaming pass over a variant's spool (`sift`), which feeds every trace
//! to the per-hop breakdown (`breakdown`) and writes the kept ones as
//! Jaeger JSON (`jaeger`). What all of it costs while the load runs is
//! metered in `observer`.

pub mod breakdown;
pub mod collector;
pub mod jaeger;
pub mod loadgen;
pub mod observer;
mod raw;
pub mod sift;
pub mod spool;
pub mod tail;

use opentelemetry_proto::tonic::{
    common::v1::{AnyValue, any_value::Value},
    trace::v1::{ResourceSpans, Span},
};

/// One span with the service that sent it.
#[derive(Clone, Copy, Debug)]
pub struct FlatSpan<'a> {
    /// The sender's `service.name`.
    pub service: &'a str,
    pub span: &'a Span,
}

/// Every span of `batches` with its service name.
pub fn flatten(batches: &[ResourceSpans]) -> Vec<FlatSpan<'_>> {
    let mut out = Vec::new();
    for r in batches {
        let service = r
            .resource
            .as_ref()
            .and_then(|res| res.attributes.iter().find(|kv| kv.key == "service.name"))
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| match &v.value {
                Some(Value::StringValue(s)) => Some(s.as_str()),
                _ => None,
            })
            .unwrap_or("unknown");
        for s in r.scope_spans.iter().flat_map(|s| &s.spans) {
            out.push(FlatSpan { service, span: s });
        }
    }
    out
}

/// The value of attribute `key` of `span`.
pub fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

/// Attribute `key` as a string (numbers and bools are written out).
pub fn attr_string(span: &Span, key: &str) -> Option<String> {
    attr(span, key).map(|v| match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

/// Attribute `key` as an integer.
pub fn attr_int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key)? {
        Value::IntValue(i) => Some(*i),
        Value::StringValue(s) => s.parse().ok(),
        _ => None,
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
