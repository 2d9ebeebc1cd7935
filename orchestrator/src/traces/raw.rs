//! The receiver's gRPC service for OTLP trace export, taking each export
//! request as bytes: a light decode checks it (ids, times, the span
//! count; names and attributes are skipped) and cuts it into its spans'
//! bytes (what a hold at the receiver keeps), and the full decode waits
//! until the run's spans are taken, after the load. So the receiver's cost
//! while the load runs is a copy and a skim, not a decode into owned
//! strings and attribute lists.

use std::{
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    codegen::{BoxFuture, StdError, http},
    server::{Grpc, NamedService},
};

/// The gRPC service name of OTLP trace export.
const SERVICE: &str = "opentelemetry.proto.collector.trace.v1.TraceService";
/// The path of its one method.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// The largest export request taken.
pub(super) const MAX_REQUEST: usize = 64 * 1024 * 1024;

/// An export request as it arrived, well-formed by [`check`].
pub(super) struct RawBatch {
    body: Bytes,
    /// Its spans.
    pub(super) spans: u64,
    /// Each span as a slice of `body`, with its process and trace, as
    /// [`check`] cut them (empty when it was not asked to, and for a
    /// batch this process encoded).
    pub(super) parts: Vec<RawSpan>,
}

/// One span of an export request, as the bytes it came in, with its
/// process's resource and scope.
#[derive(Debug)]
pub(super) struct RawSpan {
    /// The `Resource` message's bytes.
    pub(super) resource: Bytes,
    /// The `InstrumentationScope` message's bytes.
    pub(super) scope: Bytes,
    /// The `Span` message's bytes.
    pub(super) span: Bytes,
    pub(super) trace: u128,
}

impl RawBatch {
    /// An export request this process encoded, holding `spans` spans
    /// (well-formed by construction, so not checked).
    pub(super) fn encoded(body: Bytes, spans: u64) -> Self {
        RawBatch {
            body,
            spans,
            parts: Vec::new(),
        }
    }

    /// The request's bytes, as they arrived.
    pub(super) fn body(&self) -> &[u8] {
        &self.body
    }

    /// The request, decoded in full.
    pub(super) fn decode(&self) -> Result<ExportTraceServiceRequest, prost::DecodeError> {
        ExportTraceServiceRequest::decode(self.body.clone())
    }
}

/// An export request cut into its processes, scopes and spans, each a
/// slice of the request's bytes; prost skips the rest without decoding
/// it.
#[derive(Clone, PartialEq, Message)]
struct LiteRequest {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<LiteResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
struct LiteResourceSpans {
    #[prost(bytes = "bytes", tag = "1")]
    resource: Bytes,
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<LiteScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
struct LiteScopeSpans {
    #[prost(bytes = "bytes", tag = "1")]
    scope: Bytes,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    spans: Vec<Bytes>,
}

/// A span's ids and times (slices of the request, not copies), and its
/// name as bytes for error messages.
#[derive(Clone, PartialEq, Message)]
struct LiteSpan {
    #[prost(bytes = "bytes", tag = "1")]
    trace_id: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    span_id: Bytes,
    #[prost(bytes = "bytes", tag = "4")]
    parent_span_id: Bytes,
    #[prost(bytes = "bytes", tag = "5")]
    name: Bytes,
    #[prost(fixed64, tag = "7")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    end_time_unix_nano: u64,
}

/// Why an export request was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum BatchError {
    #[error("undecodable: {0}")]
    Undecodable(#[source] prost::DecodeError),
    #[error("span \"{span}\": trace id of {bytes} bytes")]
    TraceId { span: String, bytes: usize },
    #[error("span \"{span}\": span id of {bytes} bytes")]
    SpanId { span: String, bytes: usize },
    #[error("span \"{span}\": parent span id of {bytes} bytes")]
    ParentId { span: String, bytes: usize },
    #[error("span \"{span}\": ends before it starts")]
    EndsBeforeStart { span: String },
}

/// Checks an export request: it must decode, and every span must have a
/// 16-byte non-zero trace id, an 8-byte non-zero span id, an empty or
/// 8-byte parent span id, and must not end before it starts. Says why not.
/// With `cut`, also cuts it into its spans' bytes (for a hold at the
/// receiver); without, nothing per span is kept.
pub(super) fn check(body: Bytes, cut: bool) -> Result<RawBatch, BatchError> {
    let lite = LiteRequest::decode(body.clone()).map_err(BatchError::Undecodable)?;
    let mut spans = 0u64;
    let mut parts = Vec::new();
    for (r, s, bytes) in lite.resource_spans.iter().flat_map(|r| {
        r.scope_spans
            .iter()
            .flat_map(move |s| s.spans.iter().map(move |span| (r, s, span)))
    }) {
        let span = LiteSpan::decode(bytes.clone()).map_err(BatchError::Undecodable)?;
        let name = || String::from_utf8_lossy(&span.name).into_owned();
        if span.trace_id.len() != 16 || span.trace_id.iter().all(|b| *b == 0) {
            return Err(BatchError::TraceId {
                span: name(),
                bytes: span.trace_id.len(),
            });
        }
        if span.span_id.len() != 8 || span.span_id.iter().all(|b| *b == 0) {
            return Err(BatchError::SpanId {
                span: name(),
                bytes: span.span_id.len(),
            });
        }
        if !(span.parent_span_id.is_empty() || span.parent_span_id.len() == 8) {
            return Err(BatchError::ParentId {
                span: name(),
                bytes: span.parent_span_id.len(),
            });
        }
        if span.end_time_unix_nano < span.start_time_unix_nano {
            return Err(BatchError::EndsBeforeStart { span: name() });
        }
        spans += 1;
        if cut {
            let mut trace = [0u8; 16];
            trace.copy_from_slice(&span.trace_id);
            parts.push(RawSpan {
                resource: r.resource.clone(),
                scope: s.scope.clone(),
                span: bytes.clone(),
                trace: u128::from_be_bytes(trace),
            });
        }
    }
    Ok(RawBatch { body, spans, parts })
}

/// Request bodies as bytes, replies as OTLP export responses.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct ReplyEncoder;
struct BodyDecoder;

impl Codec for RawCodec {
    type Encode = ExportTraceServiceResponse;
    type Decode = Bytes;
    type Encoder = ReplyEncoder;
    type Decoder = BodyDecoder;

    fn encoder(&mut self) -> ReplyEncoder {
        ReplyEncoder
    }

    fn decoder(&mut self) -> BodyDecoder {
        BodyDecoder
    }
}

impl Encoder for ReplyEncoder {
    type Item = ExportTraceServiceResponse;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encode export reply: {e}")))
    }
}

impl Decoder for BodyDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The OTLP trace service handing each request's bytes to `take`, which
/// answers with an error status to refuse it.
pub(super) struct TraceServer<F> {
    take: Arc<F>,
}

impl<F> TraceServer<F> {
    /// The service over `take`.
    pub(super) fn new(take: F) -> Self {
        TraceServer {
            take: Arc::new(take),
        }
    }
}

impl<F> Clone for TraceServer<F> {
    fn clone(&self) -> Self {
        TraceServer {
            take: Arc::clone(&self.take),
        }
    }
}

impl<F> NamedService for TraceServer<F> {
    const NAME: &'static str = SERVICE;
}

/// One export call.
struct Export<F>(Arc<F>);

impl<F> tower::Service<tonic::Request<Bytes>> for Export<F>
where
    F: Fn(Bytes) -> Result<(), Status>,
{
    type Response = tonic::Response<ExportTraceServiceResponse>;
    type Error = Status;
    type Future = std::future::Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        std::future::ready((self.0)(request.into_inner()).map(|()| {
            tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            })
        }))
    }
}

impl<F, B> tower::Service<http::Request<B>> for TraceServer<F>
where
    F: Fn(Bytes) -> Result<(), Status> + Send + Sync + 'static,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != EXPORT_PATH {
            return Box::pin(async {
                Ok(Status::unimplemented("only trace export is served").into_http())
            });
        }
        let take = Arc::clone(&self.take);
        Box::pin(async move {
            let mut grpc =
                Grpc::new(RawCodec).apply_max_message_size_config(Some(MAX_REQUEST), None);
            Ok(grpc.unary(Export(take), request).await)
        })
    }
}
