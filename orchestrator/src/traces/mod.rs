//! The run's traces: the embedded OTLP receiver and forwarder
//! (`collector`), which spools every span to disk as it arrives (`spool`),
//! or, when the run holds spans for its keep decisions (`decisions`),
//! only the kept traces' (`held`: spans of processes that do not hold
//! their own wait at the receiver);
//! the load generator's own spans (`loadgen`); the tail sampler, which
//! decides at each request's end whether its trace is kept (`tail`); the
//! streaming pass over a variant's spool (`sift`), which feeds every trace
//! to the per-hop breakdown (`breakdown`) and writes the kept ones as
//! Jaeger JSON (`jaeger`). What all of it costs while the load runs is
//! metered in `observer`.
//!
//! What every span of a process shares (a hop replica's `hop`, `replica`,
//! `transport`, and the `variant`) comes in the resource of its export
//! requests, not on each span: readers take a span's own attribute first
//! and its process's otherwise ([`FlatSpan::attr`]).

pub mod breakdown;
pub mod collector;
pub mod decisions;
mod held;
pub mod jaeger;
pub mod loadgen;
pub mod observer;
pub mod otlp_json;
mod raw;
pub mod sift;
pub mod spool;
pub mod tail;

use opentelemetry_proto::tonic::{
    common::v1::{AnyValue, KeyValue, any_value::Value},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, Span},
};

/// The prefix of the resource attributes in which a process reports its
/// own cost (cumulative counters: they change from one export request to
/// the next, so they do not name the process).
pub const OBSERVER_PREFIX: &str = "tailmesh.observer.";

/// Whether the hop of a path record exports a server span: every hop but
/// a service its caller reached directly (`[hop.service] direct`), which
/// has no tailmesh hop in front of it to export one.
pub fn has_server_span(record: &crate::record::HopRecord) -> bool {
    record.transport != tailmesh_services::hop::direct::DIRECT_TRANSPORT
}

/// One span with the process that sent it.
#[derive(Clone, Copy, Debug)]
pub struct FlatSpan<'a> {
    /// The sender's `service.name`.
    pub service: &'a str,
    /// The sender's resource attributes: what every span of the process
    /// shares (a hop replica's `hop`, `replica`, `transport`, and the
    /// `variant`).
    pub resource: &'a [KeyValue],
    pub span: &'a Span,
}

impl<'a> FlatSpan<'a> {
    /// The span's attribute `key`, else its resource's.
    pub fn attr(&self, key: &str) -> Option<&'a Value> {
        attr(self.span, key).or_else(|| value_of(self.resource, key))
    }

    /// [`FlatSpan::attr`] as a string (numbers and bools are written out).
    pub fn attr_string(&self, key: &str) -> Option<String> {
        self.attr(key).map(value_string)
    }

    /// [`FlatSpan::attr`] as an integer.
    pub fn attr_int(&self, key: &str) -> Option<i64> {
        value_int(self.attr(key)?)
    }
}

/// A process as its resource names it: its service name and the
/// attributes it shares with all its spans, the observer's counters left
/// out ([`identity`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Process {
    pub service: String,
    pub attributes: Vec<KeyValue>,
}

impl Process {
    /// The process whose resource is `resource`.
    pub fn of(resource: Option<&Resource>) -> Self {
        let attributes = resource.map_or(&[][..], |r| &r.attributes[..]);
        Process {
            service: service_name(attributes).to_owned(),
            attributes: identity(attributes).cloned().collect(),
        }
    }

    /// A span of this process.
    pub fn span<'a>(&'a self, span: &'a Span) -> FlatSpan<'a> {
        FlatSpan {
            service: &self.service,
            resource: &self.attributes,
            span,
        }
    }
}

/// The attributes of a resource that name its process: all but the
/// observer's counters.
pub fn identity(attributes: &[KeyValue]) -> impl Iterator<Item = &KeyValue> {
    attributes
        .iter()
        .filter(|kv| !kv.key.starts_with(OBSERVER_PREFIX))
}

/// The `service.name` among resource `attributes`, "unknown" without one.
fn service_name(attributes: &[KeyValue]) -> &str {
    match value_of(attributes, "service.name") {
        Some(Value::StringValue(s)) => s,
        _ => "unknown",
    }
}

/// Every span of `batches` with its service name and resource.
pub fn flatten(batches: &[ResourceSpans]) -> Vec<FlatSpan<'_>> {
    let mut out = Vec::new();
    for r in batches {
        let resource = r
            .resource
            .as_ref()
            .map_or(&[][..], |res| &res.attributes[..]);
        let service = service_name(resource);
        for s in r.scope_spans.iter().flat_map(|s| &s.spans) {
            out.push(FlatSpan {
                service,
                resource,
                span: s,
            });
        }
    }
    out
}

/// The value of `key` among `attributes`.
fn value_of<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn value_string(v: &Value) -> String {
    match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn value_int(v: &Value) -> Option<i64> {
    match v {
        Value::IntValue(i) => Some(*i),
        Value::StringValue(s) => s.parse().ok(),
        _ => None,
    }
}

/// The value of attribute `key` of `span` itself (see [`FlatSpan::attr`]
/// for the span's or else its process's).
pub fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    value_of(&span.attributes, key)
}

/// Attribute `key` of `span` itself as a string (numbers and bools are
/// written out).
pub fn attr_string(span: &Span, key: &str) -> Option<String> {
    attr(span, key).map(value_string)
}

/// Attribute `key` of `span` itself as an integer.
pub fn attr_int(span: &Span, key: &str) -> Option<i64> {
    value_int(attr(span, key)?)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
