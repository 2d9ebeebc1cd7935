//! `traces.jaeger.json`: the kept traces in the JSON that Jaeger's UI opens
//! with "Upload JSON" (the query service's `/api/traces` answer): one entry
//! per trace with its spans (`startTime` and `duration` in microseconds,
//! `CHILD_OF` references) and the processes that sent them: each a service
//! name and its resource's attributes as tags, as Jaeger shows an OTLP
//! resource (a hop replica's `hop`, `replica`, `transport` and `variant`
//! are there, not on its spans).
//! Traces are set aside one at a time as they are kept ([`KeptTraces`]) and
//! split into files of at most [`super::tail::JAEGER_FILE_LIMIT`] bytes,
//! each a whole `{"data":[...]}` file: `traces.jaeger.json`,
//! `traces-2.jaeger.json`, ...

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
};

use opentelemetry_proto::tonic::common::v1::any_value::Value;
use serde::Serialize;

use opentelemetry_proto::tonic::common::v1::KeyValue;

use super::{FlatSpan, hex, identity};

/// One trace.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerTrace {
    /// 32 hex digits.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// Its spans.
    pub spans: Vec<JaegerSpan>,
    /// `p1`, `p2`...: the processes of its spans.
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
    /// Its resource's attributes but `service.name` and the observer's
    /// counters.
    pub tags: Vec<JaegerTag>,
}

/// The resource attributes that become a process's tags.
fn process_tags(resource: &[KeyValue]) -> impl Iterator<Item = &KeyValue> {
    identity(resource).filter(|kv| kv.key != "service.name")
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

/// One trace, from its spans (all of the same trace id), spans in order of
/// their start.
pub fn trace(spans: &[FlatSpan<'_>]) -> JaegerTrace {
    let mut spans: Vec<&FlatSpan<'_>> = spans.iter().collect();
    spans.sort_by_key(|s| s.span.start_time_unix_nano);
    let trace_id = hex(spans
        .first()
        .map(|s| s.span.trace_id.as_slice())
        .unwrap_or_default());
    let mut processes: BTreeMap<String, JaegerProcess> = BTreeMap::new();
    // A process: its service and resource, and its id.
    let mut ids: Vec<(&str, &[KeyValue], String)> = Vec::new();
    let spans = spans
        .iter()
        .map(|s| {
            let known = ids.iter().find(|(service, resource, _)| {
                *service == s.service && process_tags(resource).eq(process_tags(s.resource))
            });
            let pid = match known {
                Some((_, _, pid)) => pid.clone(),
                None => {
                    let pid = format!("p{}", ids.len() + 1);
                    ids.push((s.service, s.resource, pid.clone()));
                    processes.insert(
                        pid.clone(),
                        JaegerProcess {
                            service_name: s.service.to_string(),
                            tags: process_tags(s.resource)
                                .filter_map(|kv| {
                                    Some(tag(&kv.key, kv.value.as_ref()?.value.as_ref()?))
                                })
                                .collect(),
                        },
                    );
                    pid
                }
            };
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
}

/// What wraps a file's traces: `{"data":[` and `]}`.
const OPEN: &[u8] = b"{\"data\":[";
const CLOSE: &[u8] = b"]}";

/// The name of the run's `index`th Jaeger file (from 0):
/// `traces.jaeger.json`, then `traces-2.jaeger.json`, ...
pub fn file_name(index: usize) -> String {
    if index == 0 {
        "traces.jaeger.json".to_owned()
    } else {
        format!("traces-{}.jaeger.json", index + 1)
    }
}

/// Why kept traces could not be set aside.
#[derive(Debug, thiserror::Error)]
#[error("kept traces {}: {source}", path.display())]
pub struct KeptError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// The run's kept traces as they are decided, one JSON trace a line in a
/// hidden file of the run folder, split into Jaeger files of at most
/// `limit` bytes (a trace larger than that gets a file of its own). A
/// write error (a full disk) stops it, and writing the Jaeger files then
/// fails with that error, as writing them directly would have.
pub struct KeptTraces {
    path: PathBuf,
    /// `None` once an error stopped it.
    out: Option<BufWriter<File>>,
    limit: u64,
    /// Traces per Jaeger file.
    files: Vec<u64>,
    /// Bytes of the last file so far.
    bytes: u64,
    error: Option<KeptError>,
}

impl KeptTraces {
    /// An empty set at `path`, files of at most `limit` bytes.
    pub fn create(path: &Path, limit: u64) -> Self {
        let mut kept = KeptTraces {
            path: path.to_owned(),
            out: None,
            limit,
            files: Vec::new(),
            bytes: 0,
            error: None,
        };
        match File::create(path) {
            Ok(file) => kept.out = Some(BufWriter::new(file)),
            Err(e) => kept.fail(e),
        }
        kept
    }

    fn fail(&mut self, source: std::io::Error) {
        if let Some(out) = self.out.take() {
            // What is buffered may continue a line cut short: not written.
            let (_file, _unwritten) = out.into_parts();
        }
        self.error.get_or_insert(KeptError {
            path: self.path.clone(),
            source,
        });
    }

    /// Sets `trace` aside for the Jaeger files; false when an error has
    /// stopped the set.
    pub fn push(&mut self, trace: &JaegerTrace) -> bool {
        let Some(out) = self.out.as_mut() else {
            return false;
        };
        let written = serde_json::to_vec(trace)
            .map_err(std::io::Error::from)
            .and_then(|line| {
                out.write_all(&line)?;
                out.write_all(b"\n")?;
                Ok(line.len() as u64)
            });
        let len = match written {
            Ok(len) => len,
            Err(e) => {
                self.fail(e);
                return false;
            }
        };
        match self.files.last_mut() {
            Some(n) if self.bytes + 1 + len <= self.limit => {
                *n += 1;
                self.bytes += 1 + len;
            }
            _ => {
                self.files.push(1);
                self.bytes = (OPEN.len() + CLOSE.len()) as u64 + len;
            }
        }
        true
    }

    /// The Jaeger files the traces set aside so far fill.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Done: the traces, ready to be written as Jaeger files.
    pub fn finish(mut self) -> KeptFile {
        if let Some(Err(e)) = self.out.as_mut().map(Write::flush) {
            self.fail(e);
        }
        KeptFile {
            path: self.path,
            files: self.files,
            error: self.error.map(|e| (e.source.kind(), e.to_string())),
        }
    }
}

/// The kept traces set aside, and how they split into Jaeger files.
#[derive(Debug)]
pub struct KeptFile {
    path: PathBuf,
    files: Vec<u64>,
    /// Why not all of them could be set aside: the kind and the message.
    error: Option<(std::io::ErrorKind, String)>,
}

impl KeptFile {
    /// How many Jaeger files they fill (0: no trace kept).
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Writes Jaeger file `index` (see [`file_name`]) to `out`: a
    /// self-contained `{"data":[...]}` of its share of the traces. Writes
    /// an empty one when there are no traces. Fails when the traces could
    /// not all be set aside.
    pub fn write_file(&self, index: usize, out: &mut impl Write) -> std::io::Result<()> {
        if let Some((kind, message)) = &self.error {
            return Err(std::io::Error::new(*kind, message.clone()));
        }
        let skip: u64 = self.files.iter().take(index).sum();
        let take = self.files.get(index).copied().unwrap_or(0);
        out.write_all(OPEN)?;
        if take > 0 {
            let mut lines = BufReader::new(File::open(&self.path)?).split(b'\n');
            for _ in 0..skip {
                lines.next().transpose()?;
            }
            for i in 0..take {
                let line = lines.next().transpose()?.ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("{}: {} trace(s) short", self.path.display(), take - i),
                    )
                })?;
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(&line)?;
            }
        }
        out.write_all(CLOSE)
    }

    /// Removes the file set aside (best effort: it is hidden in the run
    /// folder).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::Span;

    use super::*;

    fn span(trace: u8, id: u8) -> Span {
        Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            name: format!("span {id}"),
            start_time_unix_nano: u64::from(id) * 1_000,
            end_time_unix_nano: u64::from(id) * 1_000 + 500,
            ..Span::default()
        }
    }

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(opentelemetry_proto::tonic::common::v1::AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    /// A hop replica's resource as its export request `batch` has it.
    fn replica(hop: &str, replica: i64, batch: i64) -> Vec<KeyValue> {
        vec![
            kv("service.name", Value::StringValue(format!("hop-{hop}"))),
            kv("hop", Value::StringValue(hop.into())),
            kv("replica", Value::IntValue(replica)),
            kv("variant", Value::StringValue("v".into())),
            kv("tailmesh.observer.spans", Value::IntValue(batch)),
        ]
    }

    #[test]
    fn resource_attributes_are_the_process_tags_one_process_per_replica() {
        let spans: Vec<Span> = (1..=4).map(|id| span(1, id)).collect();
        // Replica 0 of c in two export requests, replica 1 of c, and a
        // process with no resource attributes.
        let (c0, c0_later, c1) = (replica("c", 0, 1), replica("c", 0, 9), replica("c", 1, 1));
        let flat = [
            FlatSpan {
                service: "hop-c",
                resource: &c0,
                span: &spans[0],
            },
            FlatSpan {
                service: "hop-c",
                resource: &c0_later,
                span: &spans[1],
            },
            FlatSpan {
                service: "hop-c",
                resource: &c1,
                span: &spans[2],
            },
            FlatSpan {
                service: "loadgen",
                resource: &[],
                span: &spans[3],
            },
        ];
        let json = serde_json::to_value(trace(&flat)).expect("json");
        let pids: Vec<&str> = json["spans"]
            .as_array()
            .expect("spans")
            .iter()
            .map(|s| s["processID"].as_str().expect("pid"))
            .collect();
        assert_eq!(pids, ["p1", "p1", "p2", "p3"]);
        let tags = |pid: &str| -> Vec<(String, serde_json::Value)> {
            json["processes"][pid]["tags"]
                .as_array()
                .expect("tags")
                .iter()
                .map(|t| {
                    (
                        t["key"].as_str().expect("key").to_owned(),
                        t["value"].clone(),
                    )
                })
                .collect()
        };
        assert_eq!(json["processes"]["p2"]["serviceName"], "hop-c");
        assert_eq!(
            tags("p2"),
            [
                ("hop".to_owned(), serde_json::json!("c")),
                ("replica".to_owned(), serde_json::json!(1)),
                ("variant".to_owned(), serde_json::json!("v")),
            ]
        );
        assert_eq!(tags("p1")[1], ("replica".to_owned(), serde_json::json!(0)));
        assert!(tags("p3").is_empty());
        // The spans themselves carry no process attribute.
        for s in json["spans"].as_array().expect("spans") {
            let keys: Vec<&str> = s["tags"]
                .as_array()
                .expect("tags")
                .iter()
                .map(|t| t["key"].as_str().expect("key"))
                .collect();
            assert_eq!(keys, ["span.kind"], "{s}");
        }
    }

    #[test]
    fn kept_traces_split_into_whole_files_under_the_limit() {
        let dir = tempfile::tempdir().expect("temp dir");
        let one = serde_json::to_vec(&trace(&[FlatSpan {
            service: "s",
            resource: &[],
            span: &span(1, 1),
        }]))
        .expect("json")
        .len() as u64;
        // Room for two traces a file, not three.
        let limit = 11 + 2 * one + 1 + one / 2;
        let mut kept = KeptTraces::create(&dir.path().join("k"), limit);
        for t in 1..=5u8 {
            let spans = [span(t, 1)];
            let flat: Vec<FlatSpan<'_>> = spans
                .iter()
                .map(|s| FlatSpan {
                    service: "s",
                    resource: &[],
                    span: s,
                })
                .collect();
            assert!(kept.push(&trace(&flat)));
        }
        let kept = kept.finish();
        assert_eq!(kept.files(), 3);
        let mut seen = Vec::new();
        for i in 0..kept.files() {
            let mut bytes = Vec::new();
            kept.write_file(i, &mut bytes).expect("write");
            assert!(
                bytes.len() as u64 <= limit,
                "file {i}: {} bytes",
                bytes.len()
            );
            let file: serde_json::Value = serde_json::from_slice(&bytes).expect("whole JSON");
            for t in file["data"].as_array().expect("data") {
                seen.push(t["traceID"].as_str().expect("id").to_owned());
            }
        }
        let expected: Vec<String> = (1..=5u8).map(|t| hex(&[t; 16])).collect();
        assert_eq!(seen, expected, "every trace once, in order");
        assert_eq!(file_name(0), "traces.jaeger.json");
        assert_eq!(file_name(2), "traces-3.jaeger.json");
    }

    #[test]
    fn traces_that_could_not_be_set_aside_fail_the_jaeger_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut kept = KeptTraces::create(&dir.path().join("gone").join("k"), 1_000);
        let spans = [span(1, 1)];
        let flat = [FlatSpan {
            service: "s",
            resource: &[],
            span: &spans[0],
        }];
        assert!(!kept.push(&trace(&flat)));
        let kept = kept.finish();
        let e = kept
            .write_file(0, &mut Vec::new())
            .expect_err("nothing to write");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        assert!(e.to_string().contains("kept traces"), "{e}");
    }
}
