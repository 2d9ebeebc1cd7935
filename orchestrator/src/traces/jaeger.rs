//! `traces.jaeger.json`: the spans in the JSON that Jaeger's UI opens with
//! "Upload JSON" (the query service's `/api/traces` answer): one entry per
//! trace with its spans (`startTime` and `duration` in microseconds,
//! `CHILD_OF` references) and the processes (services) that sent them.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::{common::v1::any_value::Value, trace::v1::ResourceSpans};
use serde::Serialize;

use super::{FlatSpan, flatten, hex};

/// The whole file.
#[derive(Debug, Serialize)]
pub struct JaegerFile {
    /// One entry per trace.
    pub data: Vec<JaegerTrace>,
}

/// One trace.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerTrace {
    /// 32 hex digits.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// Its spans.
    pub spans: Vec<JaegerSpan>,
    /// `p1`, `p2`...: the services of its spans.
    pub processes: BTreeMap<String, JaegerProcess>,
    /// Always null.
    pub warnings: Option<Vec<String>>,
}

/// One span.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerSpan {
    /// 32 hex digits.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// 16 hex digits.
    #[serde(rename = "spanID")]
    pub span_id: String,
    /// 1: sampled.
    pub flags: u32,
    /// The span's name.
    pub operation_name: String,
    /// Its parent, if any.
    pub references: Vec<JaegerReference>,
    /// Microseconds since the Unix epoch.
    pub start_time: u64,
    /// Microseconds.
    pub duration: u64,
    /// Attributes, kind and status.
    pub tags: Vec<JaegerTag>,
    /// Always empty.
    pub logs: Vec<serde_json::Value>,
    /// A key of the trace's `processes`.
    #[serde(rename = "processID")]
    pub process_id: String,
    /// Always null.
    pub warnings: Option<Vec<String>>,
}

/// A reference to the parent span.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerReference {
    /// `CHILD_OF`.
    pub ref_type: &'static str,
    /// The parent's trace.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    #[serde(rename = "spanID")]
    pub span_id: String,
}

/// A key, a type and a value.
#[derive(Debug, Serialize)]
pub struct JaegerTag {
    pub key: String,
    /// `string`, `bool`, `int64` or `float64`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub value: serde_json::Value,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerProcess {
    /// Its name.
    pub service_name: String,
    /// Always empty.
    pub tags: Vec<JaegerTag>,
}

fn tag(key: &str, value: &Value) -> JaegerTag {
    let (kind, value) = match value {
        Value::StringValue(s) => ("string", serde_json::json!(s)),
        Value::BoolValue(b) => ("bool", serde_json::json!(b)),
        Value::IntValue(i) => ("int64", serde_json::json!(i)),
        Value::DoubleValue(d) => ("float64", serde_json::json!(d)),
        other => ("string", serde_json::json!(format!("{other:?}"))),
    };
    JaegerTag {
        key: key.to_string(),
        kind,
        value,
    }
}

const KINDS: [&str; 6] = [
    "unspecified",
    "internal",
    "server",
    "client",
    "producer",
    "consumer",
];

/// Groups `batches` by trace, traces in order of their first span's start.
pub fn to_jaeger(batches: &[ResourceSpans]) -> JaegerFile {
    let mut by_trace: BTreeMap<Vec<u8>, Vec<FlatSpan<'_>>> = BTreeMap::new();
    for s in flatten(batches) {
        by_trace.entry(s.span.trace_id.clone()).or_default().push(s);
    }
    let mut data: Vec<JaegerTrace> = by_trace
        .into_iter()
        .map(|(trace_id, mut spans)| {
            spans.sort_by_key(|s| s.span.start_time_unix_nano);
            let trace_id = hex(&trace_id);
            let mut processes: BTreeMap<String, JaegerProcess> = BTreeMap::new();
            let mut ids: BTreeMap<&str, String> = BTreeMap::new();
            let spans = spans
                .iter()
                .map(|s| {
                    let next = ids.len() + 1;
                    let pid = ids
                        .entry(s.service)
                        .or_insert_with(|| format!("p{next}"))
                        .clone();
                    processes
                        .entry(pid.clone())
                        .or_insert_with(|| JaegerProcess {
                            service_name: s.service.to_string(),
                            tags: Vec::new(),
                        });
                    let span = s.span;
                    let mut tags: Vec<JaegerTag> = span
                        .attributes
                        .iter()
                        .filter_map(|kv| Some(tag(&kv.key, kv.value.as_ref()?.value.as_ref()?)))
                        .collect();
                    let kind = KINDS
                        .get(span.kind as usize)
                        .copied()
                        .unwrap_or("unspecified");
                    tags.push(tag("span.kind", &Value::StringValue(kind.into())));
                    if let Some(status) = &span.status
                        && status.code == 2
                    {
                        tags.push(tag("error", &Value::BoolValue(true)));
                        tags.push(tag(
                            "otel.status_description",
                            &Value::StringValue(status.message.clone()),
                        ));
                    }
                    JaegerSpan {
                        trace_id: trace_id.clone(),
                        span_id: hex(&span.span_id),
                        flags: 1,
                        operation_name: span.name.clone(),
                        references: if span.parent_span_id.is_empty() {
                            Vec::new()
                        } else {
                            vec![JaegerReference {
                                ref_type: "CHILD_OF",
                                trace_id: trace_id.clone(),
                                span_id: hex(&span.parent_span_id),
                            }]
                        },
                        start_time: span.start_time_unix_nano / 1_000,
                        duration: span
                            .end_time_unix_nano
                            .saturating_sub(span.start_time_unix_nano)
                            / 1_000,
                        tags,
                        logs: Vec::new(),
                        process_id: pid,
                        warnings: None,
                    }
                })
                .collect();
            JaegerTrace {
                trace_id,
                spans,
                processes,
                warnings: None,
            }
        })
        .collect();
    data.sort_by_key(|t| t.spans.first().map(|s| s.start_time).unwrap_or(0));
    JaegerFile { data }
}
