//! Zipkin's v2 JSON: a list of spans, times in microseconds. In B3's
//! shared-span mode a server reports under its client's span id (`shared:
//! true`): such a server span gets an id of its own, a child of the
//! client span, so the call reads like any other.

use std::{collections::HashMap, io::BufRead};

use serde::Deserialize;

use crate::{
    ImportError,
    span::{Kind, OWN_TIME_ATTRIBUTES, Span},
};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ZSpan {
    trace_id: String,
    id: String,
    #[serde(default)]
    parent_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(default)]
    duration: Option<i64>,
    #[serde(default)]
    local_endpoint: Option<Endpoint>,
    #[serde(default)]
    tags: HashMap<String, String>,
    #[serde(default)]
    shared: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Endpoint {
    #[serde(default)]
    service_name: Option<String>,
    #[serde(default)]
    ipv4: Option<String>,
    #[serde(default)]
    ipv6: Option<String>,
    #[serde(default)]
    port: Option<u16>,
}

/// Every span of the file.
pub fn read(file: &str, mut input: impl BufRead) -> Result<Vec<Span>, ImportError> {
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .map_err(|e| ImportError::io(file, e))?;
    let parsed: Vec<ZSpan> =
        serde_json::from_str(&text).map_err(|e| ImportError::json(file, 0, &e))?;
    let mut spans = Vec::with_capacity(parsed.len());
    for z in parsed {
        let place = || format!("span {}", z.id);
        let start = z
            .timestamp
            .ok_or_else(|| ImportError::field(file, place(), "no timestamp"))?
            .saturating_mul(1_000);
        let duration = z.duration.unwrap_or(0);
        if duration < 0 {
            return Err(ImportError::field(
                file,
                place(),
                format!("a negative duration, {duration} us"),
            ));
        }
        let kind = z.kind.as_deref().map(Kind::from_name).unwrap_or_default();
        let (span_id, parent) = if z.shared && kind == Kind::Server {
            (format!("{}:server", z.id), Some(z.id.clone()))
        } else {
            (z.id.clone(), z.parent_id.clone())
        };
        let endpoint = z.local_endpoint.as_ref();
        spans.push(Span {
            trace_id: z.trace_id.to_ascii_lowercase(),
            span_id,
            parent,
            follows_from: false,
            service: endpoint
                .and_then(|e| e.service_name.clone())
                .filter(|s| !s.is_empty()),
            instance: endpoint.and_then(|e| {
                let host = e.ipv4.clone().or(e.ipv6.clone())?;
                Some(match e.port {
                    Some(p) => format!("{host}:{p}"),
                    None => host,
                })
            }),
            operation: z.name.clone().unwrap_or_default(),
            kind,
            start,
            end: start.saturating_add(duration.saturating_mul(1_000)),
            error: z.tags.contains_key("error"),
            own: OWN_TIME_ATTRIBUTES
                .iter()
                .find_map(|key| z.tags.get(*key)?.parse().ok()),
        });
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_server_span_becomes_the_child_of_its_client_span() {
        let text = r#"[
          {"traceId":"T1","id":"a","name":"get","kind":"SERVER","timestamp":100,"duration":50,
           "localEndpoint":{"serviceName":"front","ipv4":"10.0.0.1","port":80}},
          {"traceId":"t1","id":"b","parentId":"a","name":"call","kind":"CLIENT","timestamp":110,"duration":30,
           "localEndpoint":{"serviceName":"front"}},
          {"traceId":"t1","id":"b","parentId":"a","name":"serve","kind":"SERVER","shared":true,"timestamp":115,"duration":20,
           "localEndpoint":{"serviceName":"back"},"tags":{"error":"boom"}}
        ]"#;
        let imported =
            crate::read(crate::Format::Zipkin, "z.json", text.as_bytes()).expect("reads");
        assert_eq!(imported.repairs.duplicates, 0);
        let root = &imported.traces[0][0];
        assert_eq!(root.instance.as_deref(), Some("10.0.0.1:80"));
        let back = &root.children[0];
        assert_eq!(back.service, "back");
        assert!(back.error);
        assert_eq!((back.called_at, back.returned_at), (110_000, 140_000));
        assert_eq!((back.start, back.end), (115_000, 135_000));
    }

    #[test]
    fn a_span_without_a_timestamp_is_named() {
        let e = read("z.json", r#"[{"traceId":"t","id":"q"}]"#.as_bytes()).expect_err("fails");
        assert_eq!(e.to_string(), "z.json: span q: no timestamp");
    }
}
