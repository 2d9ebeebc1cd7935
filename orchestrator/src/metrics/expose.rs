//! The two ways a scrape reads the metrics: Prometheus' text format
//! (0.0.4: classic histogram buckets only) and its protobuf format
//! (`io.prometheus.client.MetricFamily`, length-delimited), which carries
//! each histogram's native buckets beside its classic ones. The protobuf
//! messages are the fields of that schema the metrics use, with its tags.

use std::fmt::Write as _;

use super::histogram::{Histogram, SCHEMA, ZERO_THRESHOLD};

/// The protobuf format's content type, as a scrape asks for it.
pub(crate) const PROTOBUF_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";
/// The text format's content type.
pub(crate) const TEXT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a metric family is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A sample's value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Number(f64),
    Histogram(Histogram),
}

/// One series: its labels and value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) labels: Vec<(&'static str, String)>,
    pub(crate) value: Value,
}

/// A metric family: every series of one name.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Family {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    pub(crate) kind: Kind,
    pub(crate) samples: Vec<Sample>,
}

/// The text format.
pub(crate) fn text(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {kind}", f.name);
        for s in &f.samples {
            match &s.value {
                Value::Number(v) => {
                    let _ = writeln!(out, "{}{} {}", f.name, labels(&s.labels, None), number(*v));
                }
                Value::Histogram(h) => {
                    for (bound, count) in h.cumulative() {
                        let le = number(bound);
                        let _ = writeln!(
                            out,
                            "{}_bucket{} {count}",
                            f.name,
                            labels(&s.labels, Some(&le))
                        );
                    }
                    let _ = writeln!(
                        out,
                        "{}_sum{} {}",
                        f.name,
                        labels(&s.labels, None),
                        number(h.sum)
                    );
                    let _ = writeln!(
                        out,
                        "{}_count{} {}",
                        f.name,
                        labels(&s.labels, None),
                        h.count
                    );
                }
            }
        }
    }
    out
}

/// `{a="x",b="y"}` with `le` last when given; label values escaped.
fn labels(pairs: &[(&'static str, String)], le: Option<&str>) -> String {
    let mut parts: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A number as the text format writes it.
fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else if v.is_nan() {
        "NaN".to_owned()
    } else {
        format!("{v}")
    }
}

/// The protobuf format: each family, length-delimited.
pub(crate) fn protobuf(families: &[Family]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in families {
        let family = pb::MetricFamily {
            name: f.name.to_owned(),
            help: f.help.to_owned(),
            r#type: match f.kind {
                Kind::Counter => 0,
                Kind::Gauge => 1,
                Kind::Histogram => 4,
            },
            metric: f.samples.iter().map(|s| metric(f.kind, s)).collect(),
        };
        // Encoding into a Vec cannot run out of room.
        let _ = prost::Message::encode_length_delimited(&family, &mut out);
    }
    out
}

fn metric(kind: Kind, s: &Sample) -> pb::Metric {
    let label = s
        .labels
        .iter()
        .map(|(k, v)| pb::LabelPair {
            name: (*k).to_owned(),
            value: v.clone(),
        })
        .collect();
    let mut m = pb::Metric {
        label,
        ..Default::default()
    };
    match (&s.value, kind) {
        (Value::Number(v), Kind::Counter) => m.counter = Some(pb::Counter { value: *v }),
        (Value::Number(v), _) => m.gauge = Some(pb::Gauge { value: *v }),
        (Value::Histogram(h), _) => m.histogram = Some(native(h)),
    }
    m
}

fn native(h: &Histogram) -> pb::Histogram {
    let (spans, deltas) = h.spans_and_deltas();
    let mut positive_span: Vec<pb::BucketSpan> = spans
        .into_iter()
        .map(|(offset, length)| pb::BucketSpan { offset, length })
        .collect();
    if positive_span.is_empty() {
        // A native histogram with no observation yet: one empty span, so
        // it does not read as a classic one.
        positive_span.push(pb::BucketSpan {
            offset: 0,
            length: 0,
        });
    }
    pb::Histogram {
        sample_count: h.count,
        sample_sum: h.sum,
        bucket: h
            .cumulative()
            .into_iter()
            .map(|(upper_bound, cumulative_count)| pb::Bucket {
                cumulative_count,
                upper_bound,
            })
            .collect(),
        schema: SCHEMA,
        zero_threshold: ZERO_THRESHOLD,
        zero_count: h.zero,
        positive_span,
        positive_delta: deltas,
    }
}

/// The messages of `io.prometheus.client` the metrics use.
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Gauge {
        #[prost(double, tag = "1")]
        pub value: f64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Counter {
        #[prost(double, tag = "1")]
        pub value: f64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Bucket {
        #[prost(uint64, tag = "1")]
        pub cumulative_count: u64,
        #[prost(double, tag = "2")]
        pub upper_bound: f64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct BucketSpan {
        #[prost(sint32, tag = "1")]
        pub offset: i32,
        #[prost(uint32, tag = "2")]
        pub length: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Histogram {
        #[prost(uint64, tag = "1")]
        pub sample_count: u64,
        #[prost(double, tag = "2")]
        pub sample_sum: f64,
        #[prost(message, repeated, tag = "3")]
        pub bucket: Vec<Bucket>,
        #[prost(sint32, tag = "5")]
        pub schema: i32,
        #[prost(double, tag = "6")]
        pub zero_threshold: f64,
        #[prost(uint64, tag = "7")]
        pub zero_count: u64,
        #[prost(message, repeated, tag = "12")]
        pub positive_span: Vec<BucketSpan>,
        #[prost(sint64, repeated, tag = "13")]
        pub positive_delta: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Metric {
        #[prost(message, repeated, tag = "1")]
        pub label: Vec<LabelPair>,
        #[prost(message, optional, tag = "2")]
        pub gauge: Option<Gauge>,
        #[prost(message, optional, tag = "3")]
        pub counter: Option<Counter>,
        #[prost(message, optional, tag = "7")]
        pub histogram: Option<Histogram>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct MetricFamily {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub help: String,
        #[prost(int32, tag = "3")]
        pub r#type: i32,
        #[prost(message, repeated, tag = "4")]
        pub metric: Vec<Metric>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn families() -> Vec<Family> {
        let mut h = Histogram::default();
        for v in [0.001, 0.002, 0.002, 0.3] {
            h.observe(v);
        }
        vec![
            Family {
                name: "t_requests_total",
                help: "requests",
                kind: Kind::Counter,
                samples: vec![Sample {
                    labels: vec![("variant", "a \"b\"".to_owned())],
                    value: Value::Number(4.0),
                }],
            },
            Family {
                name: "t_latency_seconds",
                help: "latency",
                kind: Kind::Histogram,
                samples: vec![Sample {
                    labels: vec![("variant", "a".to_owned())],
                    value: Value::Histogram(h),
                }],
            },
        ]
    }

    #[test]
    fn the_text_format_has_cumulative_buckets_and_escaped_labels() {
        let text = text(&families());
        assert!(text.contains("# TYPE t_requests_total counter\n"), "{text}");
        assert!(
            text.contains("t_requests_total{variant=\"a \\\"b\\\"\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("t_latency_seconds_bucket{variant=\"a\",le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("t_latency_seconds_bucket{variant=\"a\",le=\"0.0025\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("t_latency_seconds_bucket{variant=\"a\",le=\"+Inf\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("t_latency_seconds_count{variant=\"a\"} 4\n"),
            "{text}"
        );
    }

    #[test]
    fn the_protobuf_format_decodes_back_with_native_and_classic_buckets() {
        let bytes = protobuf(&families());
        let mut rest = bytes.as_slice();
        let mut decoded = Vec::new();
        while !rest.is_empty() {
            let f: pb::MetricFamily = prost::Message::decode_length_delimited(&mut rest)
                .expect("a length-delimited family");
            decoded.push(f);
        }
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[0].r#type, 0);
        assert_eq!(
            decoded[0].metric[0].counter.as_ref().map(|c| c.value),
            Some(4.0)
        );
        assert_eq!(decoded[1].r#type, 4);
        let h = decoded[1].metric[0]
            .histogram
            .as_ref()
            .expect("a histogram");
        assert_eq!((h.sample_count, h.schema), (4, SCHEMA));
        assert!(h.zero_threshold > 0.0);
        let total: i64 = {
            let mut count = 0i64;
            h.positive_delta
                .iter()
                .map(|d| {
                    count += d;
                    count
                })
                .sum()
        };
        assert_eq!(total, 4, "the native buckets hold every observation");
        assert_eq!(h.bucket.last().map(|b| b.cumulative_count), Some(4));
    }
}
