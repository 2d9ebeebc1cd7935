//! Jaeger's JSON: `{"data": [trace, ...]}`, the UI's "Download JSON" and
//! the query service's `/api/traces` answer, and tailmesh's own
//! `traces.jaeger.json`. Times are microseconds; a span's parent is its
//! `CHILD_OF` (or `FOLLOWS_FROM`) reference, or an older export's
//! `parentSpanID`; its service and instance are its process's.

use std::{collections::HashMap, io::BufRead};

use serde::Deserialize;

use crate::{
    ImportError,
    span::{Kind, OWN_TIME_ATTRIBUTES, Span},
};

#[derive(Deserialize)]
struct File {
    data: Vec<Trace>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Trace {
    #[serde(rename = "traceID", default)]
    trace_id: String,
    #[serde(default)]
    spans: Vec<JSpan>,
    #[serde(default)]
    processes: HashMap<String, Process>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JSpan {
    #[serde(rename = "traceID", default)]
    trace_id: String,
    #[serde(rename = "spanID")]
    span_id: String,
    #[serde(default)]
    operation_name: String,
    #[serde(default)]
    references: Vec<Reference>,
    #[serde(rename = "parentSpanID", default)]
    parent_span_id: Option<String>,
    start_time: i64,
    duration: i64,
    #[serde(default)]
    tags: Vec<Tag>,
    #[serde(rename = "processID", default)]
    process_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reference {
    ref_type: String,
    #[serde(rename = "spanID")]
    span_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Process {
    #[serde(default)]
    service_name: String,
    #[serde(default)]
    tags: Vec<Tag>,
}

#[derive(Deserialize)]
struct Tag {
    key: String,
    #[serde(default)]
    value: serde_json::Value,
}

/// The tags that name a replica, most specific first.
pub(crate) const INSTANCE_KEYS: [&str; 6] = [
    "service.instance.id",
    "k8s.pod.name",
    "container.id",
    "host.name",
    "hostname",
    "replica",
];

/// Every span of the file.
pub fn read(file: &str, mut input: impl BufRead) -> Result<Vec<Span>, ImportError> {
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .map_err(|e| ImportError::io(file, e))?;
    let parsed: File = serde_json::from_str(&text).map_err(|e| ImportError::json(file, 0, &e))?;
    let mut spans = Vec::new();
    for trace in parsed.data {
        for s in trace.spans {
            let process = trace.processes.get(&s.process_id);
            let tag = |key: &str| s.tags.iter().find(|t| t.key == key).map(|t| &t.value);
            let reference = s
                .references
                .iter()
                .find(|r| r.ref_type.eq_ignore_ascii_case("CHILD_OF"))
                .or_else(|| s.references.first());
            let follows_from =
                reference.is_some_and(|r| r.ref_type.eq_ignore_ascii_case("FOLLOWS_FROM"));
            let parent = reference
                .map(|r| r.span_id.clone())
                .or(s.parent_span_id.clone())
                .filter(|p| !p.is_empty() && !p.trim_start_matches('0').is_empty());
            if s.duration < 0 {
                return Err(ImportError::field(
                    file,
                    format!("span {}", s.span_id),
                    format!("a negative duration, {} us", s.duration),
                ));
            }
            let start = s.start_time.saturating_mul(1_000);
            spans.push(Span {
                trace_id: if s.trace_id.is_empty() {
                    trace.trace_id.clone()
                } else {
                    s.trace_id.clone()
                },
                span_id: s.span_id.clone(),
                parent,
                follows_from,
                service: process
                    .map(|p| p.service_name.clone())
                    .filter(|n| !n.is_empty()),
                instance: process.and_then(|p| instance(&p.tags)),
                operation: s.operation_name.clone(),
                kind: tag("span.kind")
                    .and_then(|v| v.as_str())
                    .map(Kind::from_name)
                    .unwrap_or_default(),
                start,
                end: start.saturating_add(s.duration.saturating_mul(1_000)),
                error: tag("error").is_some_and(truthy)
                    || tag("otel.status_code").and_then(|v| v.as_str()) == Some("ERROR"),
                own: OWN_TIME_ATTRIBUTES.iter().find_map(|key| match tag(key)? {
                    serde_json::Value::String(s) => s.parse().ok(),
                    other => other.as_i64(),
                }),
            });
        }
    }
    Ok(spans)
}

fn instance(tags: &[Tag]) -> Option<String> {
    INSTANCE_KEYS.iter().find_map(|key| {
        tags.iter().find(|t| t.key == *key).map(|t| match &t.value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    })
}

fn truthy(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::String(s) => s == "true",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"data":[{"traceID":"abc","spans":[
      {"traceID":"abc","spanID":"1","operationName":"GET /","references":[],
       "startTime":1000,"duration":100,"tags":[{"key":"span.kind","type":"string","value":"server"}],
       "processID":"p1"},
      {"traceID":"abc","spanID":"2","operationName":"call","references":[{"refType":"CHILD_OF","traceID":"abc","spanID":"1"}],
       "startTime":1010,"duration":50,"tags":[{"key":"span.kind","type":"string","value":"client"}],
       "processID":"p1"},
      {"traceID":"abc","spanID":"3","operationName":"serve","references":[{"refType":"CHILD_OF","traceID":"abc","spanID":"2"}],
       "startTime":1020,"duration":30,"tags":[{"key":"span.kind","type":"string","value":"server"},{"key":"error","type":"bool","value":true}],
       "processID":"p2"},
      {"traceID":"abc","spanID":"4","operationName":"later","references":[{"refType":"FOLLOWS_FROM","traceID":"abc","spanID":"1"}],
       "startTime":1090,"duration":500,"tags":[],"processID":"p3"}],
     "processes":{"p1":{"serviceName":"front","tags":[{"key":"hostname","type":"string","value":"h1"}]},
                  "p2":{"serviceName":"back","tags":[{"key":"replica","type":"int64","value":2}]},
                  "p3":{"serviceName":"audit","tags":[]}}}]}"#;

    #[test]
    fn reads_spans_with_their_process_kind_and_references() {
        let spans = read("t.json", SAMPLE.as_bytes()).expect("reads");
        assert_eq!(spans.len(), 4);
        assert_eq!(spans[0].service.as_deref(), Some("front"));
        assert_eq!(spans[0].instance.as_deref(), Some("h1"));
        assert_eq!((spans[0].start, spans[0].end), (1_000_000, 1_100_000));
        assert_eq!(spans[1].kind, Kind::Client);
        assert_eq!(spans[2].parent.as_deref(), Some("2"));
        assert_eq!(spans[2].instance.as_deref(), Some("2"));
        assert!(spans[2].error);
        assert!(spans[3].follows_from);
        let imported =
            crate::read(crate::Format::Jaeger, "t.json", SAMPLE.as_bytes()).expect("reads");
        let root = &imported.traces[0][0];
        assert_eq!(root.children[0].service, "back");
        assert!(root.children[0].error);
        assert_eq!(root.detached.len(), 1);
    }

    #[test]
    fn bad_json_names_the_file_and_line() {
        let e = read("bad.json", "{\"data\": [\n{\"spans\": 3}]}".as_bytes()).expect_err("fails");
        let text = e.to_string();
        assert!(text.starts_with("bad.json: line 2"), "{text}");
    }
}
