//! OTLP JSON: the protobuf JSON mapping of `ExportTraceServiceRequest`,
//! one request per line, as the OpenTelemetry Collector's file exporter
//! writes it. Ids are hex (the mapping's exception to base64), 64-bit
//! integers may be strings or numbers, enums names or numbers; the older
//! `instrumentationLibrarySpans` is read as `scopeSpans`.

use std::io::BufRead;

use serde::Deserialize;

use crate::{
    ImportError,
    jaeger::INSTANCE_KEYS,
    span::{Kind, OWN_TIME_ATTRIBUTES, Span},
};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    #[serde(default)]
    resource_spans: Vec<ResourceSpans>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpans {
    #[serde(default)]
    resource: Resource,
    #[serde(default, alias = "instrumentationLibrarySpans")]
    scope_spans: Vec<ScopeSpans>,
}

#[derive(Deserialize, Default)]
struct Resource {
    #[serde(default)]
    attributes: Vec<KeyValue>,
}

#[derive(Deserialize)]
struct ScopeSpans {
    #[serde(default)]
    spans: Vec<OSpan>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OSpan {
    trace_id: String,
    span_id: String,
    #[serde(default)]
    parent_span_id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    kind: serde_json::Value,
    start_time_unix_nano: serde_json::Value,
    end_time_unix_nano: serde_json::Value,
    #[serde(default)]
    attributes: Vec<KeyValue>,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize, Default)]
struct Status {
    #[serde(default)]
    code: serde_json::Value,
}

#[derive(Deserialize)]
struct KeyValue {
    key: String,
    #[serde(default)]
    value: AnyValue,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AnyValue {
    string_value: Option<String>,
    int_value: Option<serde_json::Value>,
    bool_value: Option<bool>,
    double_value: Option<f64>,
}

impl AnyValue {
    fn text(&self) -> Option<String> {
        self.string_value
            .clone()
            .or_else(|| {
                self.int_value
                    .as_ref()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            })
            .or_else(|| self.bool_value.map(|b| b.to_string()))
            .or_else(|| self.double_value.map(|d| d.to_string()))
    }
}

/// Every span of the file, a request per non-empty line.
pub fn read(file: &str, input: impl BufRead) -> Result<Vec<Span>, ImportError> {
    let mut spans = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| ImportError::io(file, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let request: Request =
            serde_json::from_str(&line).map_err(|e| ImportError::json(file, n, &e))?;
        for rs in request.resource_spans {
            let attr = |key: &str| {
                rs.resource
                    .attributes
                    .iter()
                    .find(|a| a.key == key)
                    .and_then(|a| a.value.text())
            };
            let service = attr("service.name");
            let instance = INSTANCE_KEYS.iter().find_map(|k| attr(k));
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let place = || format!("line {}, span {}", n + 1, s.span_id);
                    let start = nanos(&s.start_time_unix_nano).ok_or_else(|| {
                        ImportError::field(file, place(), "startTimeUnixNano is not an integer")
                    })?;
                    let end = nanos(&s.end_time_unix_nano).ok_or_else(|| {
                        ImportError::field(file, place(), "endTimeUnixNano is not an integer")
                    })?;
                    let error = match &s.status.code {
                        serde_json::Value::Number(n) => n.as_u64() == Some(2),
                        serde_json::Value::String(s) => s == "STATUS_CODE_ERROR",
                        _ => false,
                    };
                    spans.push(Span {
                        trace_id: s.trace_id.to_ascii_lowercase(),
                        span_id: s.span_id.to_ascii_lowercase(),
                        parent: Some(s.parent_span_id.to_ascii_lowercase())
                            .filter(|p| !p.is_empty() && !p.trim_start_matches('0').is_empty()),
                        follows_from: false,
                        service: service.clone(),
                        instance: instance.clone(),
                        operation: s.name,
                        kind: kind(&s.kind),
                        start,
                        end,
                        error: error
                            || s.attributes
                                .iter()
                                .any(|a| a.key == "error" && a.value.bool_value == Some(true)),
                        own: OWN_TIME_ATTRIBUTES.iter().find_map(|key| {
                            s.attributes
                                .iter()
                                .find(|a| a.key == *key)
                                .and_then(|a| a.value.text()?.parse().ok())
                        }),
                    });
                }
            }
        }
    }
    Ok(spans)
}

fn nanos(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|u| i64::try_from(u).unwrap_or(i64::MAX))),
        serde_json::Value::String(s) => s.parse::<i64>().ok(),
        _ => None,
    }
}

fn kind(v: &serde_json::Value) -> Kind {
    match v {
        serde_json::Value::Number(n) => match n.as_u64() {
            Some(1) => Kind::Internal,
            Some(2) => Kind::Server,
            Some(3) => Kind::Client,
            Some(4) => Kind::Producer,
            Some(5) => Kind::Consumer,
            _ => Kind::Unspecified,
        },
        serde_json::Value::String(s) => Kind::from_name(s.trim_start_matches("SPAN_KIND_")),
        _ => Kind::Unspecified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_request_per_line_with_either_spelling_of_numbers_and_enums() {
        let text = concat!(
            r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"front"}},{"key":"host.name","value":{"stringValue":"h1"}}]},"scopeSpans":[{"scope":{"name":"x"},"spans":[{"traceId":"AB12","spanId":"01","name":"GET","kind":"SPAN_KIND_SERVER","startTimeUnixNano":"1000","endTimeUnixNano":"5000","status":{}}]}]}]}"#,
            "\n\n",
            r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"back"}},{"key":"replica","value":{"intValue":"3"}}]},"instrumentationLibrarySpans":[{"spans":[{"traceId":"ab12","spanId":"02","parentSpanId":"01","name":"serve","kind":2,"startTimeUnixNano":2000,"endTimeUnixNano":3000,"status":{"code":2}}]}]}]}"#,
            "\n"
        );
        let spans = read("t.otlp.json", text.as_bytes()).expect("reads");
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].trace_id, spans[1].trace_id);
        assert_eq!(spans[0].kind, Kind::Server);
        assert_eq!(spans[0].instance.as_deref(), Some("h1"));
        assert_eq!(spans[1].instance.as_deref(), Some("3"));
        assert_eq!(spans[1].parent.as_deref(), Some("01"));
        assert!(spans[1].error);
        assert_eq!((spans[1].start, spans[1].end), (2000, 3000));
    }

    #[test]
    fn a_bad_line_is_named() {
        let text = "{\"resourceSpans\":[]}\n{\"resourceSpans\":[{\"scopeSpans\":[{\"spans\":[{\"traceId\":\"a\",\"spanId\":\"b\",\"startTimeUnixNano\":\"x\",\"endTimeUnixNano\":\"1\"}]}]}]}\n";
        let e = read("f.json", text.as_bytes()).expect_err("fails");
        assert_eq!(
            e.to_string(),
            "f.json: line 2, span b: startTimeUnixNano is not an integer"
        );
        let e = read("f.json", "{}\n{nope\n".as_bytes()).expect_err("fails");
        assert!(e.to_string().starts_with("f.json: line 2, column"), "{e}");
    }
}
