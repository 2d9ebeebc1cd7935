//! OTLP trace export requests written straight as protobuf bytes, and the
//! gRPC codec that sends them as they are.
//!
//! A batch is one `ExportTraceServiceRequest` with one `ResourceSpans`
//! holding one `ScopeSpans`. Field numbers and wire types are those of
//! opentelemetry-proto's `trace.proto`, `common.proto`, `resource.proto`
//! and `trace_service.proto`; fields holding their default value are left
//! out, as prost leaves them out, so a batch is byte for byte what prost
//! makes of the same request. Nested messages get their length once
//! written: one byte (two for a span) is kept for it, and the body moves
//! when the length needs more.

use bytes::{BufMut, Bytes, BytesMut};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceResponse,
    trace::v1::{span::SpanKind, status::StatusCode},
};
use prost::Message;
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
};

use super::recorder::{FieldValue, SpanRecord};

/// The path of OTLP trace export.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// Its service and method, as gRPC clients name them.
pub const SERVICE: &str = "opentelemetry.proto.collector.trace.v1.TraceService";
pub const METHOD: &str = "Export";

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// The longest varint.
pub const MAX_VARINT: usize = 10;

/// Bytes the varint of `v` takes.
pub fn varint_len(v: u64) -> usize {
    // 1 byte per started 7 bits, at least 1.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub fn varint(buf: &mut impl BufMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

pub fn tag(buf: &mut impl BufMut, field: u32, wire: u8) {
    varint(buf, u64::from((field << 3) | u32::from(wire)));
}

pub fn bytes_field(buf: &mut impl BufMut, field: u32, value: &[u8]) {
    tag(buf, field, LEN);
    varint(buf, value.len() as u64);
    buf.put_slice(value);
}

pub fn varint_field(buf: &mut impl BufMut, field: u32, value: u64) {
    tag(buf, field, VARINT);
    varint(buf, value);
}

pub fn fixed64_field(buf: &mut impl BufMut, field: u32, value: u64) {
    tag(buf, field, FIXED64);
    buf.put_u64_le(value);
}

pub fn fixed32_field(buf: &mut impl BufMut, field: u32, value: u32) {
    tag(buf, field, FIXED32);
    buf.put_u32_le(value);
}

/// A length-delimited field being written: where its length goes and
/// how many bytes were kept for it.
#[must_use]
pub struct Open {
    at: usize,
    kept: usize,
}

/// Starts the message field `field`, keeping `kept` bytes for its length.
pub fn open(buf: &mut BytesMut, field: u32, kept: usize) -> Open {
    tag(buf, field, LEN);
    let at = buf.len();
    buf.put_bytes(0, kept);
    Open { at, kept }
}

/// Ends a field [`open`]ed in `buf`, writing its length (moving its
/// body when the length takes other than the bytes kept).
pub fn close(buf: &mut BytesMut, open: Open) {
    let Open { at, kept } = open;
    let body = at + kept;
    let len = buf.len() - body;
    let need = varint_len(len as u64);
    if need > kept {
        let end = buf.len();
        buf.put_bytes(0, need - kept);
        buf.copy_within(body..end, at + need);
    } else if need < kept {
        buf.copy_within(body.., at + need);
        buf.truncate(at + need + len);
    }
    let mut length = &mut buf[at..at + need];
    varint(&mut length, len as u64);
}

/// A `KeyValue` (in a `Resource` or a `Span`, field 1 or 9) whose value
/// is an int.
pub fn int_attribute(buf: &mut BytesMut, field: u32, key: &str, value: i64) {
    let kv = open(buf, field, 1);
    bytes_field(buf, 1, key.as_bytes());
    let any = open(buf, 2, 1);
    varint_field(buf, 3, value as u64);
    close(buf, any);
    close(buf, kv);
}

/// A `KeyValue` (field `field`: 1 in a `Resource`, 9 in a `Span`).
pub fn attribute(buf: &mut BytesMut, field: u32, key: &str, value: FieldValue<'_>) {
    let kv = open(buf, field, 1);
    bytes_field(buf, 1, key.as_bytes());
    let any = open(buf, 2, 1);
    match value {
        FieldValue::Str(s) => bytes_field(buf, 1, s.as_bytes()),
        FieldValue::Bool(b) => varint_field(buf, 2, u64::from(b)),
        FieldValue::Int(i) => varint_field(buf, 3, i as u64),
    }
    close(buf, any);
    close(buf, kv);
}

/// OTLP span flags: sampled, "has is-remote", and is-remote when the
/// parent came from another process (as the SDK's exporter sets them).
pub fn flags(parent_remote: bool) -> u32 {
    0x1 | 0x100 | if parent_remote { 0x200 } else { 0 }
}

fn kind(kind: &opentelemetry::trace::SpanKind) -> SpanKind {
    use opentelemetry::trace::SpanKind as K;
    match kind {
        K::Client => SpanKind::Client,
        K::Server => SpanKind::Server,
        K::Producer => SpanKind::Producer,
        K::Consumer => SpanKind::Consumer,
        K::Internal => SpanKind::Internal,
    }
}

/// `r` as a `Span` (field 2 of `ScopeSpans`), its fields as at most
/// `attribute_limit` attributes (the others counted as dropped).
pub fn span(buf: &mut BytesMut, r: &SpanRecord, attribute_limit: usize) {
    let span = open(buf, 2, 2);
    bytes_field(buf, 1, &r.trace_id.to_be_bytes());
    bytes_field(buf, 2, &r.span_id.to_be_bytes());
    if r.parent_span_id != 0 {
        bytes_field(buf, 4, &r.parent_span_id.to_be_bytes());
    }
    if !r.name.as_str().is_empty() {
        bytes_field(buf, 5, r.name.as_str().as_bytes());
    }
    varint_field(buf, 6, kind(&r.kind) as u64);
    if r.start_unix_ns != 0 {
        fixed64_field(buf, 7, r.start_unix_ns);
    }
    if r.end_unix_ns != 0 {
        fixed64_field(buf, 8, r.end_unix_ns);
    }
    let mut dropped = 0u32;
    for (i, (key, value)) in r.fields.attributes().enumerate() {
        if i < attribute_limit {
            attribute(buf, 9, key, value);
        } else {
            dropped += 1;
        }
    }
    if dropped != 0 {
        varint_field(buf, 10, u64::from(dropped));
    }
    // The status is always there, unset or error with no message.
    let status = open(buf, 15, 1);
    if r.error {
        varint_field(buf, 3, StatusCode::Error as u64);
    }
    close(buf, status);
    fixed32_field(buf, 16, flags(r.parent_remote));
    close(buf, span);
}

/// The codec of export calls: requests are bytes already encoded,
/// replies are decoded (and then ignored).
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

#[derive(Debug)]
pub struct BytesEncoder;

#[derive(Debug)]
pub struct ReplyDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = BytesEncoder;
    type Decoder = ReplyDecoder;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> ReplyDecoder {
        ReplyDecoder
    }
}

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for ReplyDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<ExportTraceServiceResponse>, Status> {
        ExportTraceServiceResponse::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_moved_lengths_match_prost() {
        for v in [0, 1, 127, 128, 300, 16_383, 16_384, u64::MAX] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            varint(&mut ours, v);
            prost::encoding::encode_varint(v, &mut theirs);
            assert_eq!(ours, theirs, "{v}");
            assert_eq!(varint_len(v), ours.len(), "{v}");
        }
        // Bodies shorter and longer than the length kept.
        for (kept, len) in [(1, 0), (1, 127), (1, 128), (1, 20_000), (2, 5), (2, 200)] {
            let mut buf = BytesMut::new();
            let field = open(&mut buf, 3, kept);
            buf.put_bytes(7, len);
            close(&mut buf, field);
            let mut expected = vec![(3 << 3) | 2];
            varint(&mut expected, len as u64);
            expected.extend(std::iter::repeat_n(7, len));
            assert_eq!(&buf[..], &expected[..], "kept {kept}, len {len}");
        }
    }
}
