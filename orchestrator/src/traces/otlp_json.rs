//! The kept traces as OTLP JSON, converted from the run's Jaeger files
//! (`jaeger`): a root-cause case folder holds its traces in both, since
//! the RCA tools a case is handed to read OpenTelemetry's own encoding,
//! not Jaeger's UI format.
//!
//! The output is one `ExportTraceServiceRequest` in the protobuf JSON
//! mapping, on one line, as the Collector's `file` exporter writes it (so
//! `tailmesh import otlp` reads it back): a `resourceSpans` per process of
//! each Jaeger file (`service.name` and the process's tags as resource
//! attributes) with one `tailmesh` scope; ids in lower-case hex (padded to
//! 32 and 16 digits: Jaeger drops leading zeros), times as decimal strings
//! of Unix nanoseconds, `kind` and `status.code` as numbers, every other
//! tag an attribute of its own type. The tags that are only Jaeger's
//! spelling of a span's kind and status (`span.kind`, `error`,
//! `otel.status_code`, `otel.status_description`) become `kind` and
//! `status` again; a `CHILD_OF` reference is the parent, any other
//! reference a link. Span logs are not carried (tailmesh writes none).
//!
//! The Jaeger files are read one at a time, and the output is written
//! whole or not at all ([`crate::output::write_atomically`]).

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::output::{OutputError, write_atomically};

/// What was written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtlpJsonStats {
    pub traces: u64,
    pub spans: u64,
}

/// Why the OTLP JSON could not be written. The output path is then left
/// as it was (absent, or an earlier whole file).
#[derive(Debug, thiserror::Error)]
pub enum OtlpJsonError {
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not JSON, or not of the shape of a Jaeger file.
    #[error("read {}: not Jaeger JSON: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// A span or process OTLP cannot say as it is (an id that is not
    /// hex, a tag whose value is not of its type).
    #[error("read {}: {place}: {source}", path.display())]
    Invalid {
        path: PathBuf,
        /// `trace 3f2a..., span 9c1b...` or `trace ..., process p2`.
        place: String,
        source: SpanError,
    },
    /// Writing the output failed (a full disk).
    #[error(transparent)]
    Write(#[from] OutputError),
}

/// What in a span or a process OTLP cannot say as it is.
#[derive(Debug, thiserror::Error)]
pub enum SpanError {
    /// An id that is not 1 to `digits` hex digits.
    #[error("{field}: {id:?} is not an id of 1 to {digits} hex digits")]
    Id {
        /// `traceID`, `spanID`, `parentSpanID`, a reference's.
        field: &'static str,
        id: String,
        digits: usize,
    },
    /// A tag whose value is not of the type it says.
    #[error("tag {key:?}: {value} is not of type {kind}")]
    Tag {
        key: String,
        /// The value as the file has it (JSON).
        value: String,
        kind: String,
    },
    /// Times past what OTLP readers take.
    #[error(
        "startTime {start_us} us, duration {duration_us} us: ends past 2262, beyond signed \
         64-bit nanoseconds since the epoch"
    )]
    Time { start_us: u64, duration_us: u64 },
    /// A process's resource attributes could not be keyed.
    #[error("its resource attributes: {0}")]
    Resource(#[source] serde_json::Error),
}

/// Writes the traces of `jaeger_files` (tailmesh's `traces.jaeger.json`,
/// `traces-2.jaeger.json`, ... or any `{"data":[...]}` file), in their
/// order, to `out` as one OTLP JSON request.
pub fn write_from_jaeger(
    jaeger_files: &[PathBuf],
    out: &Path,
) -> Result<OtlpJsonStats, OtlpJsonError> {
    let mut stats = OtlpJsonStats::default();
    // A Jaeger file that cannot be read stops the writing with an I/O
    // error; the real error waits here.
    let mut failure = None;
    let written = write_atomically(out, |w| {
        w.write_all(b"{\"resourceSpans\":[")?;
        let mut first = true;
        for path in jaeger_files {
            let batches = match read_file(path, &mut stats) {
                Ok(batches) => batches,
                Err(e) => {
                    failure = Some(e);
                    return Err(std::io::Error::other("a Jaeger file could not be read"));
                }
            };
            for batch in &batches {
                if !first {
                    w.write_all(b",")?;
                }
                first = false;
                serde_json::to_writer(&mut *w, batch)?;
            }
        }
        // The file exporter's line end: the reader takes a request a line.
        w.write_all(b"]}\n")
    });
    if let Some(e) = failure {
        return Err(e);
    }
    written?;
    Ok(stats)
}

/// One Jaeger file as OTLP batches, its traces and spans counted in
/// `stats`.
fn read_file(path: &Path, stats: &mut OtlpJsonStats) -> Result<Vec<ResourceSpans>, OtlpJsonError> {
    let bytes = std::fs::read(path).map_err(|source| OtlpJsonError::Read {
        path: path.to_owned(),
        source,
    })?;
    let file: JaegerFile =
        serde_json::from_slice(&bytes).map_err(|source| OtlpJsonError::Parse {
            path: path.to_owned(),
            source,
        })?;
    drop(bytes);
    convert(file, stats).map_err(|Problem { place, source }| OtlpJsonError::Invalid {
        path: path.to_owned(),
        place,
        source,
    })
}

/// What is wrong, and where in the file.
struct Problem {
    place: String,
    source: SpanError,
}

/// A file's traces, a batch per distinct process (the same replica has
/// another `pN` in every trace), in the order the processes first appear.
fn convert(file: JaegerFile, stats: &mut OtlpJsonStats) -> Result<Vec<ResourceSpans>, Problem> {
    let mut batches: Vec<ResourceSpans> = Vec::new();
    // A batch's resource attributes as JSON, and the batch.
    let mut by_resource: HashMap<String, usize> = HashMap::new();
    for trace in file.data {
        stats.traces += 1;
        // This trace's process ids and their batches.
        let mut batch_of: HashMap<String, usize> = HashMap::new();
        for span in trace.spans {
            let batch = match batch_of.get(&span.process_id) {
                Some(&batch) => batch,
                None => {
                    let problem = |source: SpanError| Problem {
                        place: format!("trace {}, process {:?}", trace.trace_id, span.process_id),
                        source,
                    };
                    let attributes =
                        resource(trace.processes.get(&span.process_id)).map_err(problem)?;
                    let key = serde_json::to_string(&attributes)
                        .map_err(|e| problem(SpanError::Resource(e)))?;
                    let batch = *by_resource.entry(key).or_insert_with(|| {
                        batches.push(ResourceSpans {
                            resource: Resource { attributes },
                            scope_spans: [ScopeSpans {
                                scope: Scope { name: "tailmesh" },
                                spans: Vec::new(),
                            }],
                        });
                        batches.len() - 1
                    });
                    batch_of.insert(span.process_id.clone(), batch);
                    batch
                }
            };
            let place = format!("trace {}, span {}", trace.trace_id, span.span_id);
            let span =
                otlp_span(&trace.trace_id, span).map_err(|source| Problem { place, source })?;
            batches[batch].scope_spans[0].spans.push(span);
            stats.spans += 1;
        }
    }
    Ok(batches)
}

/// A process's resource attributes: `service.name`, then its tags.
fn resource(process: Option<&JaegerProcess>) -> Result<Vec<KeyValue>, SpanError> {
    let Some(process) = process else {
        return Ok(Vec::new());
    };
    let mut attributes = vec![KeyValue {
        key: "service.name".to_owned(),
        value: AnyValue::String(process.service_name.clone()),
    }];
    for tag in process.tags.iter().filter(|t| t.key != "service.name") {
        attributes.push(KeyValue {
            key: tag.key.clone(),
            value: any_value(tag)?,
        });
    }
    Ok(attributes)
}

/// What a tag that is only Jaeger's spelling of a span's kind or status
/// says.
enum Encoding {
    /// OTLP's `SpanKind` number.
    Kind(u8),
    /// OTLP's `StatusCode` number.
    Status(u8),
    Description(String),
}

const STATUS_OK: u8 = 1;
const STATUS_ERROR: u8 = 2;

/// What `tag` says of its span's kind or status, if that is all it is
/// (an `error` tag that is a message, or a kind OTLP does not know, stays
/// a tag).
fn encoding(tag: &JaegerTag) -> Option<Encoding> {
    use TagValue::{Bool, Text};
    Some(match (tag.key.as_str(), &tag.value) {
        ("span.kind", Text(name)) => Encoding::Kind(kind_number(name)?),
        ("error", Bool(error)) => Encoding::Status(if *error { STATUS_ERROR } else { 0 }),
        ("error", Text(error)) => Encoding::Status(match error.as_str() {
            "true" => STATUS_ERROR,
            "false" => 0,
            _ => return None,
        }),
        ("otel.status_code", Text(status)) => Encoding::Status(match status.as_str() {
            "ERROR" => STATUS_ERROR,
            "OK" => STATUS_OK,
            "UNSET" => 0,
            _ => return None,
        }),
        ("otel.status_description", Text(text)) => Encoding::Description(text.clone()),
        _ => return None,
    })
}

/// OTLP's `SpanKind` number of a `span.kind` tag's value.
fn kind_number(name: &str) -> Option<u8> {
    Some(match name.to_ascii_lowercase().as_str() {
        "unspecified" => 0,
        "internal" => 1,
        "server" => 2,
        "client" => 3,
        "producer" => 4,
        "consumer" => 5,
        _ => return None,
    })
}

fn otlp_span(trace_id: &str, span: JaegerSpan) -> Result<OtlpSpan, SpanError> {
    let trace_id = if span.trace_id.is_empty() {
        trace_id
    } else {
        &span.trace_id
    };
    let trace_id = hex_id(trace_id, 32, "traceID")?;
    let span_id = hex_id(&span.span_id, 16, "spanID")?;

    let mut parent = None;
    let mut links = Vec::new();
    for r in span.references {
        let id = hex_id(&r.span_id, 16, "a reference's spanID")?;
        if parent.is_none() && r.ref_type.eq_ignore_ascii_case("CHILD_OF") {
            parent = Some(id);
        } else {
            let trace_id = if r.trace_id.is_empty() {
                trace_id.clone()
            } else {
                hex_id(&r.trace_id, 32, "a reference's traceID")?
            };
            links.push(Link {
                trace_id,
                span_id: id,
            });
        }
    }
    // An older export's field, when there is no CHILD_OF reference.
    if parent.is_none()
        && let Some(id) = span.parent_span_id.filter(|id| !id.is_empty())
    {
        parent = Some(hex_id(&id, 16, "parentSpanID")?);
    }

    let mut kind = 0;
    let mut code = 0;
    let mut description = None;
    let mut attributes = Vec::with_capacity(span.tags.len());
    for tag in span.tags {
        match encoding(&tag) {
            Some(Encoding::Kind(k)) => kind = k,
            // Error outranks OK outranks unset, whichever tag says so.
            Some(Encoding::Status(c)) => code = code.max(c),
            Some(Encoding::Description(text)) => description = Some(text),
            None => attributes.push(KeyValue {
                value: any_value(&tag)?,
                key: tag.key,
            }),
        }
    }
    // A description is the status's message only for an error; else it
    // stays what it was.
    let message = match description {
        Some(text) if code == STATUS_ERROR => text,
        Some(text) => {
            attributes.push(KeyValue {
                key: "otel.status_description".to_owned(),
                value: AnyValue::String(text),
            });
            String::new()
        }
        None => String::new(),
    };

    let (start, end) = nanos(span.start_time)
        .zip(span.start_time.checked_add(span.duration).and_then(nanos))
        .ok_or(SpanError::Time {
            start_us: span.start_time,
            duration_us: span.duration,
        })?;
    Ok(OtlpSpan {
        trace_id,
        span_id,
        parent_span_id: parent.unwrap_or_default(),
        name: span.operation_name,
        kind,
        start_time_unix_nano: start.to_string(),
        end_time_unix_nano: end.to_string(),
        attributes,
        links,
        status: Status { code, message },
    })
}

/// Microseconds since the epoch as nanoseconds, within what OTLP readers
/// take (a signed 64-bit count).
fn nanos(micros: u64) -> Option<u64> {
    micros
        .checked_mul(1_000)
        .filter(|&ns| i64::try_from(ns).is_ok())
}

/// `id` (the span's `field`) as `digits` lower-case hex digits, leading
/// zeros put back.
fn hex_id(id: &str, digits: usize, field: &'static str) -> Result<String, SpanError> {
    if id.is_empty() || id.len() > digits || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(SpanError::Id {
            field,
            id: id.to_owned(),
            digits,
        });
    }
    Ok(format!("{:0>digits$}", id.to_ascii_lowercase()))
}

/// A tag's value as an attribute value of its Jaeger type (a tag without
/// a known type: of its JSON value's type).
fn any_value(tag: &JaegerTag) -> Result<AnyValue, SpanError> {
    let ty = tag.kind.as_deref().unwrap_or_default().to_ascii_lowercase();
    let wrong = || SpanError::Tag {
        key: tag.key.clone(),
        value: tag.value.to_string(),
        kind: ty.clone(),
    };
    Ok(match (ty.as_str(), &tag.value) {
        ("string", TagValue::Text(s)) => AnyValue::String(s.clone()),
        ("string", other) => AnyValue::String(other.to_string()),
        ("bool", TagValue::Bool(b)) => AnyValue::Bool(*b),
        ("bool", TagValue::Text(s)) => AnyValue::Bool(s.parse().map_err(|_| wrong())?),
        ("int64", TagValue::Int(i)) => AnyValue::Int(i.to_string()),
        ("int64", TagValue::Text(s)) => {
            AnyValue::Int(s.parse::<i64>().map_err(|_| wrong())?.to_string())
        }
        ("float64", TagValue::Float(f)) => AnyValue::Double(*f),
        ("float64", TagValue::Int(i)) => AnyValue::Double(*i as f64),
        ("float64", TagValue::Text(s)) => AnyValue::Double(
            s.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .ok_or_else(wrong)?,
        ),
        // Jaeger's JSON has bytes in base64, as OTLP JSON does.
        ("binary", TagValue::Text(s)) => AnyValue::Bytes(s.clone()),
        ("bool" | "int64" | "float64" | "binary", _) => return Err(wrong()),
        (_, TagValue::Text(s)) => AnyValue::String(s.clone()),
        (_, TagValue::Bool(b)) => AnyValue::Bool(*b),
        (_, TagValue::Int(i)) => AnyValue::Int(i.to_string()),
        (_, TagValue::Float(f)) => AnyValue::Double(*f),
    })
}

// What is read: a Jaeger file as `jaeger` writes it (and the UI downloads
// it); what is not needed (flags, logs, warnings) is skipped.

#[derive(Deserialize)]
struct JaegerFile {
    data: Vec<JaegerTrace>,
}

#[derive(Deserialize)]
struct JaegerTrace {
    #[serde(rename = "traceID", default)]
    trace_id: String,
    #[serde(default)]
    spans: Vec<JaegerSpan>,
    #[serde(default)]
    processes: HashMap<String, JaegerProcess>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JaegerSpan {
    /// Empty: the trace's.
    #[serde(rename = "traceID", default)]
    trace_id: String,
    #[serde(rename = "spanID")]
    span_id: String,
    #[serde(default)]
    operation_name: String,
    #[serde(default)]
    references: Vec<JaegerReference>,
    #[serde(rename = "parentSpanID", default)]
    parent_span_id: Option<String>,
    /// Microseconds since the epoch.
    start_time: u64,
    /// Microseconds.
    duration: u64,
    #[serde(default)]
    tags: Vec<JaegerTag>,
    #[serde(rename = "processID", default)]
    process_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JaegerReference {
    /// `CHILD_OF` or `FOLLOWS_FROM`.
    ref_type: String,
    #[serde(rename = "traceID", default)]
    trace_id: String,
    #[serde(rename = "spanID")]
    span_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JaegerProcess {
    #[serde(default)]
    service_name: String,
    #[serde(default)]
    tags: Vec<JaegerTag>,
}

#[derive(Deserialize)]
struct JaegerTag {
    key: String,
    /// `string`, `bool`, `int64`, `float64` or `binary`.
    #[serde(rename = "type", default)]
    kind: Option<String>,
    value: TagValue,
}

/// A tag's value as the JSON has it.
#[derive(Debug)]
enum TagValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
}

impl std::fmt::Display for TagValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TagValue::Bool(b) => write!(f, "{b}"),
            TagValue::Int(i) => write!(f, "{i}"),
            TagValue::Float(x) => write!(f, "{x}"),
            TagValue::Text(s) => write!(f, "{s:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for TagValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = TagValue;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a tag value (a string, a number or a bool)")
            }

            fn visit_bool<E>(self, v: bool) -> Result<TagValue, E> {
                Ok(TagValue::Bool(v))
            }

            fn visit_i64<E>(self, v: i64) -> Result<TagValue, E> {
                Ok(TagValue::Int(v))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TagValue, E> {
                i64::try_from(v).map(TagValue::Int).map_err(|_| {
                    E::invalid_value(
                        serde::de::Unexpected::Unsigned(v),
                        &"a 64-bit signed integer",
                    )
                })
            }

            fn visit_f64<E>(self, v: f64) -> Result<TagValue, E> {
                Ok(TagValue::Float(v))
            }

            fn visit_str<E>(self, v: &str) -> Result<TagValue, E> {
                Ok(TagValue::Text(v.to_owned()))
            }

            fn visit_string<E>(self, v: String) -> Result<TagValue, E> {
                Ok(TagValue::Text(v))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

// What is written: the protobuf JSON mapping of an
// `ExportTraceServiceRequest`'s parts.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpans {
    resource: Resource,
    scope_spans: [ScopeSpans; 1],
}

#[derive(Serialize)]
struct Resource {
    attributes: Vec<KeyValue>,
}

#[derive(Serialize)]
struct ScopeSpans {
    scope: Scope,
    spans: Vec<OtlpSpan>,
}

#[derive(Serialize)]
struct Scope {
    name: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtlpSpan {
    trace_id: String,
    span_id: String,
    /// Empty at a root, and then left out.
    #[serde(skip_serializing_if = "String::is_empty")]
    parent_span_id: String,
    name: String,
    /// 0 unspecified, 1 internal, 2 server, 3 client, 4 producer, 5
    /// consumer.
    kind: u8,
    start_time_unix_nano: String,
    end_time_unix_nano: String,
    attributes: Vec<KeyValue>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    links: Vec<Link>,
    status: Status,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Link {
    trace_id: String,
    span_id: String,
}

/// `{}` unset, `{"code":2,"message":...}` an error.
#[derive(Serialize)]
struct Status {
    #[serde(skip_serializing_if = "is_zero")]
    code: u8,
    #[serde(skip_serializing_if = "String::is_empty")]
    message: String,
}

fn is_zero(code: &u8) -> bool {
    *code == 0
}

#[derive(Serialize)]
struct KeyValue {
    key: String,
    value: AnyValue,
}

/// `{"stringValue":..}` and so on; 64-bit integers as strings.
#[derive(Serialize)]
enum AnyValue {
    #[serde(rename = "stringValue")]
    String(String),
    #[serde(rename = "intValue")]
    Int(String),
    #[serde(rename = "doubleValue")]
    Double(f64),
    #[serde(rename = "boolValue")]
    Bool(bool),
    /// Base64.
    #[serde(rename = "bytesValue")]
    Bytes(String),
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, fs::File, io::BufReader};

    use opentelemetry_proto::tonic::{
        common::v1::{AnyValue as PbAnyValue, KeyValue as PbKeyValue, any_value::Value},
        trace::v1::{Span, Status as PbStatus},
    };
    use serde_json::{Value as Json, json};
    use tailmesh_import::{Format, Imported};

    use super::*;
    use crate::traces::{FlatSpan, hex, jaeger};

    /// The first span's start, in Unix nanoseconds.
    const T0: u64 = 1_700_000_000_000_000_000;

    fn kv(key: &str, value: Value) -> PbKeyValue {
        PbKeyValue {
            key: key.into(),
            value: Some(PbAnyValue { value: Some(value) }),
            ..PbKeyValue::default()
        }
    }

    /// A span of trace `trace`, `at` µs after [`T0`] for `us` µs.
    fn span(trace: u8, id: u8, parent: Option<u8>, kind: i32, at: u64, us: u64) -> Span {
        Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            name: format!("op {id:x}"),
            kind,
            start_time_unix_nano: T0 + at * 1_000,
            end_time_unix_nano: T0 + (at + us) * 1_000,
            ..Span::default()
        }
    }

    fn failed(mut span: Span, message: &str) -> Span {
        span.status = Some(PbStatus {
            code: 2,
            message: message.into(),
        });
        span
    }

    /// A hop replica's resource.
    fn replica(hop: &str, replica: i64) -> Vec<PbKeyValue> {
        vec![
            kv("service.name", Value::StringValue(format!("hop-{hop}"))),
            kv("hop", Value::StringValue(hop.into())),
            kv("replica", Value::IntValue(replica)),
        ]
    }

    /// Writes `traces` to `path` as a run writes its Jaeger files.
    fn write_jaeger(path: &Path, traces: &[&[FlatSpan<'_>]]) {
        let data: Vec<_> = traces.iter().map(|spans| jaeger::trace(spans)).collect();
        let text = serde_json::to_vec(&json!({ "data": data })).expect("json");
        std::fs::write(path, text).expect("write the Jaeger file");
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The value of attribute `key` in an OTLP JSON attribute list.
    fn attr<'a>(attributes: &'a Json, key: &str) -> Option<&'a Json> {
        attributes
            .as_array()
            .expect("attributes")
            .iter()
            .find(|kv| kv["key"] == key)
            .map(|kv| &kv["value"])
    }

    fn import(format: Format, path: &Path) -> Imported {
        let file = File::open(path).expect("open");
        tailmesh_import::read(format, &path.display().to_string(), BufReader::new(file))
            .expect("the import reads it")
    }

    #[test]
    fn jaeger_files_become_otlp_json_that_imports_to_the_same_call_trees() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (a, b) = (replica("a", 0), replica("b", 1));
        let mut root = span(1, 0xa, None, 2, 0, 1_000);
        root.attributes = vec![
            kv("http.route", Value::StringValue("/echo".into())),
            kv("work_ns", Value::IntValue(250_000)),
            kv("retried", Value::BoolValue(false)),
            kv("share", Value::DoubleValue(0.25)),
        ];
        let call = span(1, 0xb, Some(0xa), 3, 100, 700);
        let mut served = failed(span(1, 0xc, Some(0xb), 2, 150, 600), "boom");
        served.attributes = vec![kv("work_ns", Value::IntValue(400_000))];
        let second = span(2, 0xd, None, 2, 2_000, 500);
        let inner = failed(span(2, 0xe, Some(0xd), 1, 2_100, 200), "deadline");
        let of = |resource: &'static str, span| FlatSpan {
            service: resource,
            resource: if resource == "hop-a" { &a } else { &b },
            span,
        };
        let files = [
            dir.path().join(jaeger::file_name(0)),
            dir.path().join(jaeger::file_name(1)),
        ];
        write_jaeger(
            &files[0],
            &[&[of("hop-a", &root), of("hop-a", &call), of("hop-b", &served)]],
        );
        write_jaeger(&files[1], &[&[of("hop-a", &second), of("hop-a", &inner)]]);
        let out = dir.path().join("traces.otlp.json");

        let stats = write_from_jaeger(&files, &out).expect("writes");

        assert_eq!(
            stats,
            OtlpJsonStats {
                traces: 2,
                spans: 5
            }
        );
        assert_eq!(
            names(dir.path()),
            [
                "traces-2.jaeger.json",
                "traces.jaeger.json",
                "traces.otlp.json"
            ],
            "no temporary file left"
        );
        let text = std::fs::read_to_string(&out).expect("read");
        assert_eq!(text.lines().count(), 1, "one request, one line");
        let doc: Json = serde_json::from_str(&text).expect("JSON");
        // A batch per process of each file: hop-a and hop-b, then hop-a.
        let batches = doc["resourceSpans"].as_array().expect("resourceSpans");
        let services: Vec<&Json> = batches
            .iter()
            .map(|rs| attr(&rs["resource"]["attributes"], "service.name").expect("service"))
            .collect();
        assert_eq!(
            services,
            [
                &json!({"stringValue": "hop-a"}),
                &json!({"stringValue": "hop-b"}),
                &json!({"stringValue": "hop-a"}),
            ]
        );
        // Each span by its id, with its resource.
        let mut spans: BTreeMap<String, (&Json, &Json)> = BTreeMap::new();
        for rs in batches {
            for ss in rs["scopeSpans"].as_array().expect("scopeSpans") {
                assert_eq!(ss["scope"]["name"], "tailmesh");
                for s in ss["spans"].as_array().expect("spans") {
                    let id = s["spanId"].as_str().expect("spanId").to_owned();
                    spans.insert(id, (s, &rs["resource"]));
                }
            }
        }
        let id = |n: u8| hex(&[n; 8]);
        assert_eq!(spans.len(), 5);
        let (s, _) = spans[&id(0xa)];
        assert_eq!(s["traceId"], hex(&[1; 16]));
        assert_eq!(s["traceId"], "01010101010101010101010101010101");
        assert!(s.get("parentSpanId").is_none(), "{s}");
        assert_eq!(s["name"], "op a");
        assert_eq!(s["startTimeUnixNano"], "1700000000000000000");
        assert_eq!(s["endTimeUnixNano"], "1700000000001000000");
        assert_eq!(s["status"], json!({}));
        assert_eq!(
            attr(&s["attributes"], "work_ns"),
            Some(&json!({"intValue": "250000"}))
        );
        assert_eq!(
            attr(&s["attributes"], "share"),
            Some(&json!({"doubleValue": 0.25}))
        );
        assert_eq!(
            attr(&s["attributes"], "retried"),
            Some(&json!({"boolValue": false}))
        );
        assert_eq!(
            attr(&s["attributes"], "http.route"),
            Some(&json!({"stringValue": "/echo"}))
        );
        let kinds: Vec<(u8, &Json)> = [0xa, 0xb, 0xc, 0xd, 0xe]
            .into_iter()
            .map(|n| (n, &spans[&id(n)].0["kind"]))
            .collect();
        assert_eq!(
            kinds,
            [
                (0xa, &json!(2)),
                (0xb, &json!(3)),
                (0xc, &json!(2)),
                (0xd, &json!(2)),
                (0xe, &json!(1)),
            ]
        );
        let (s, resource) = spans[&id(0xc)];
        assert_eq!(s["parentSpanId"], id(0xb));
        assert_eq!(s["status"], json!({"code": 2, "message": "boom"}));
        assert_eq!(
            attr(&resource["attributes"], "service.name"),
            Some(&json!({"stringValue": "hop-b"}))
        );
        assert_eq!(
            attr(&resource["attributes"], "replica"),
            Some(&json!({"intValue": "1"}))
        );
        assert_eq!(spans[&id(0xb)].0["parentSpanId"], id(0xa));
        assert_eq!(spans[&id(0xe)].0["traceId"], hex(&[2; 16]));
        assert_eq!(
            spans[&id(0xe)].0["status"],
            json!({"code": 2, "message": "deadline"})
        );
        for (id, (s, _)) in &spans {
            for key in ["span.kind", "error", "otel.status_description"] {
                assert!(attr(&s["attributes"], key).is_none(), "span {id}: {key}");
            }
        }
        // Every span's times are its Jaeger times, in nanoseconds.
        for file in &files {
            let jaeger: Json =
                serde_json::from_slice(&std::fs::read(file).expect("read")).expect("JSON");
            for t in jaeger["data"].as_array().expect("data") {
                for js in t["spans"].as_array().expect("spans") {
                    let (s, _) = spans[js["spanID"].as_str().expect("spanID")];
                    let start = js["startTime"].as_u64().expect("startTime");
                    let end = start + js["duration"].as_u64().expect("duration");
                    assert_eq!(s["startTimeUnixNano"], (start * 1_000).to_string());
                    assert_eq!(s["endTimeUnixNano"], (end * 1_000).to_string());
                }
            }
        }

        // The import reads both into the same call trees.
        let mut from_jaeger = Imported::default();
        for file in &files {
            from_jaeger.extend(import(Format::Jaeger, file));
        }
        let from_otlp = import(Format::Otlp, &out);
        assert_eq!(from_otlp.traces, from_jaeger.traces);
        assert_eq!(from_otlp.repairs, from_jaeger.repairs);
        assert_eq!(from_otlp.traces.len(), 2);
        let front = &from_otlp.traces[0][0];
        assert_eq!(
            (front.service.as_str(), front.own),
            ("hop-a", Some(250_000))
        );
        let back = &front.children[0];
        assert_eq!(back.service, "hop-b");
        assert_eq!(back.instance.as_deref(), Some("1"));
        assert!(back.error);
        let at = |us: u64| i64::try_from(T0 + us * 1_000).expect("fits");
        assert_eq!((back.start, back.end), (at(150), at(750)));
        assert_eq!((back.called_at, back.returned_at), (at(100), at(800)));
    }

    #[test]
    fn other_jaeger_spellings_are_read_and_a_bad_tag_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("download.json");
        // Jaeger's UI drops ids' leading zeros; a tag may come without a
        // type, or with an int64 as a string.
        let trace = |tag: Json| {
            json!({"data": [{"traceID": "ABC", "spans": [
                {"traceID": "ABC", "spanID": "1", "operationName": "GET", "startTime": 5,
                 "duration": 2, "processID": "p1", "tags": [
                    {"key": "span.kind", "type": "string", "value": "server"},
                    {"key": "otel.status_code", "type": "string", "value": "ERROR"},
                    {"key": "error", "type": "string", "value": "connection refused"}]},
                {"spanID": "2", "operationName": "later", "startTime": 6, "duration": 1,
                 "processID": "p1", "references": [
                    {"refType": "FOLLOWS_FROM", "traceID": "abc", "spanID": "1"}],
                 "tags": [tag, {"key": "hits", "value": 3}]}],
              "processes": {"p1": {"serviceName": "front", "tags": []}}}]})
        };
        std::fs::write(
            &path,
            trace(json!({"key": "retries", "type": "int64", "value": "7"})).to_string(),
        )
        .expect("write");
        let out = dir.path().join("out.json");
        write_from_jaeger(std::slice::from_ref(&path), &out).expect("writes");
        let doc: Json = serde_json::from_slice(&std::fs::read(&out).expect("read")).expect("JSON");
        let spans = &doc["resourceSpans"][0]["scopeSpans"][0]["spans"];
        assert_eq!(spans[0]["traceId"], "00000000000000000000000000000abc");
        assert_eq!(spans[0]["spanId"], "0000000000000001");
        assert_eq!(spans[0]["kind"], 2);
        assert_eq!(spans[0]["status"], json!({"code": 2}));
        assert_eq!(
            attr(&spans[0]["attributes"], "error"),
            Some(&json!({"stringValue": "connection refused"})),
            "an error message is not a status"
        );
        assert!(spans[1].get("parentSpanId").is_none());
        assert_eq!(
            spans[1]["links"],
            json!([{"traceId": "00000000000000000000000000000abc", "spanId": "0000000000000001"}])
        );
        assert_eq!(spans[1]["kind"], 0);
        assert_eq!(
            attr(&spans[1]["attributes"], "retries"),
            Some(&json!({"intValue": "7"}))
        );
        assert_eq!(
            attr(&spans[1]["attributes"], "hits"),
            Some(&json!({"intValue": "3"}))
        );

        std::fs::write(
            &path,
            trace(json!({"key": "retries", "type": "int64", "value": "seven"})).to_string(),
        )
        .expect("write");
        let e = write_from_jaeger(std::slice::from_ref(&path), &out).expect_err("fails");
        assert_eq!(
            e.to_string(),
            format!(
                "read {}: trace ABC, span 2: tag \"retries\": \"seven\" is not of type int64",
                path.display()
            )
        );
        assert!(out.exists(), "the earlier output is left as it was");
    }

    #[test]
    fn a_malformed_jaeger_file_is_an_error_naming_it_and_writes_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let good = dir.path().join("traces.jaeger.json");
        std::fs::write(&good, r#"{"data":[]}"#).expect("write");
        let bad = dir.path().join("traces-2.jaeger.json");
        std::fs::write(
            &bad,
            r#"{"data":[{"traceID":"1","spans":[{"spanID":"2","duration":5}]}]}"#,
        )
        .expect("write");
        let out = dir.path().join("traces.otlp.json");

        let e = write_from_jaeger(&[good, bad.clone()], &out).expect_err("fails");

        assert!(matches!(e, OtlpJsonError::Parse { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("read {}: not Jaeger JSON: ", bad.display())),
            "{text}"
        );
        assert!(text.contains("missing field `startTime`"), "{text}");
        assert_eq!(
            names(dir.path()),
            ["traces-2.jaeger.json", "traces.jaeger.json"],
            "no output, whole or partial"
        );

        let gone = dir.path().join("traces-3.jaeger.json");
        let e = write_from_jaeger(std::slice::from_ref(&gone), &out).expect_err("fails");
        assert!(
            e.to_string()
                .starts_with(&format!("read {}: ", gone.display())),
            "{e}"
        );
        assert!(!out.exists());
    }
}
