//! A real gRPC service as a hop's work ([`ServiceClient`]): its schema found
//! once, at start, in `.proto` files (compiled with protox) or through
//! its server reflection (v1, then v1alpha); the request messages encoded
//! once against the method's input message; then, per request, one call
//! of the method's kind ([`MethodKind`]) carrying those bytes, the
//! request's deadline, its `traceparent` and the configured metadata:
//! unary, one message each way; client streaming, the messages in order,
//! then half-close, then one reply; server streaming and bidirectional,
//! every reply read until the service ends the stream. Each reply is
//! checked to fit the method's output message, and their number against
//! `replies` when it is set.
//!
//! The call takes the push pool's path, not a tonic channel: one plaintext
//! HTTP/2 connection per client, driven with h2 by the calling task itself
//! (see the `unary` module; a tonic channel hands each call through its
//! buffer's worker task and a task per request). A streaming call goes the
//! same way: its request messages are all known at start, so they leave as
//! one body, and the replies are read off the answer as they come. The
//! replies are not decoded: their wire format is walked against the output
//! message's descriptor (the `fits` module), which refuses exactly what a
//! decode would refuse.

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor};
use prost_types::FileDescriptorProto;
use tonic::{
    Code, Status,
    client::Grpc,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    codegen::http::{HeaderMap, HeaderName, HeaderValue, Uri},
    transport::{Channel, Endpoint},
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, ServerReflectionResponse, server_reflection_request::MessageRequest,
    server_reflection_response::MessageResponse,
};

use super::{
    fits,
    unary::{self, Link, LinkError},
};
use crate::{
    addr::PeerAddr,
    limits::MAX_CALL_MESSAGE_BYTES,
    model::{Requests, ServiceCall},
    protojson, telemetry,
};

/// How long connecting to the service may take, at start and per call.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long resolving the schema through reflection may take in all.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long reflection waits before asking a service it could not reach
/// again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

const REFLECTION_V1: &str = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
/// v1alpha's messages are v1's, field for field: one set of types serves
/// both, only the path differs.
const REFLECTION_V1ALPHA: &str = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

/// Why a service could not be made a hop's work (or probed).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The address is not `host:port`.
    #[error("service address \"{address}\": {reason}")]
    Address { address: String, reason: String },
    /// The method name is not `package.Service/Method`.
    #[error("method \"{method}\": expected `package.Service/Method`")]
    MethodName { method: String },
    /// The `.proto` files do not compile.
    #[error("compiling {files}: {message}")]
    Proto { files: String, message: String },
    /// Reflection failed (unreachable, not served, an incomplete answer).
    #[error("server reflection at {address}: {message}")]
    Reflection { address: String, message: String },
    /// The schema has no such service or method.
    #[error("{message}")]
    UnknownMethod { message: String },
    /// A request message's JSON does not fit the input message; `key`
    /// names it (`request`, or `requests[i]`).
    #[error("{key} for {method} ({input}): {source}")]
    Request {
        key: String,
        method: String,
        input: String,
        source: Box<protojson::JsonError>,
    },
    /// A request message encodes to more than one message may carry.
    #[error("{key} for {method}: it encodes to {bytes} bytes, over the limit of {limit}")]
    RequestTooLarge {
        key: String,
        method: String,
        bytes: usize,
        limit: usize,
    },
    /// `requests` (or `replies`) given for a method whose kind does not
    /// take them.
    #[error("{key} for {method}: {why}")]
    MethodKind {
        key: &'static str,
        method: String,
        why: String,
    },
    /// A metadata entry is not valid gRPC ASCII metadata.
    #[error("metadata \"{key}\": {reason}")]
    Metadata { key: String, reason: String },
}

/// A service's method, resolved: where it is, what to send, what to
/// expect back. Cheap to clone (the connection is shared).
#[derive(Clone)]
pub struct ServiceClient {
    address: String,
    method: MethodDescriptor,
    kind: MethodKind,
    output: MessageDescriptor,
    /// The request messages, each framed as a gRPC message (its prefix,
    /// then its bytes), one after another: the call's whole request body.
    framed: Bytes,
    /// How many request messages `framed` holds.
    requests: usize,
    /// How many replies each call must get, when set.
    replies: Option<u32>,
    /// The connection to the service, with the metadata in its headers.
    link: Arc<Link>,
}

impl fmt::Debug for ServiceClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceClient")
            .field("address", &self.address)
            .field("method", &self.method.full_name())
            .field("kind", &self.kind)
            .field("requests", &self.requests)
            .field("request_bytes", &self.framed.len())
            .finish_non_exhaustive()
    }
}

/// Which side of a method streams (the schema's `stream` keywords).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodKind {
    Unary,
    ServerStreaming,
    ClientStreaming,
    Bidi,
}

impl MethodKind {
    /// `method`'s kind.
    pub fn of(method: &MethodDescriptor) -> Self {
        match (method.is_client_streaming(), method.is_server_streaming()) {
            (false, false) => MethodKind::Unary,
            (false, true) => MethodKind::ServerStreaming,
            (true, false) => MethodKind::ClientStreaming,
            (true, true) => MethodKind::Bidi,
        }
    }

    /// The kind as people name it.
    pub fn name(self) -> &'static str {
        match self {
            MethodKind::Unary => "unary",
            MethodKind::ServerStreaming => "server-streaming",
            MethodKind::ClientStreaming => "client-streaming",
            MethodKind::Bidi => "bidirectional streaming",
        }
    }

    /// Whether the service answers with a stream (of any number of
    /// replies), not one reply.
    fn streams_replies(self) -> bool {
        matches!(self, MethodKind::ServerStreaming | MethodKind::Bidi)
    }
}

/// One reply message of a call: its bytes, checked to fit the output
/// message (not decoded: [`ServiceReply::message`] does that).
#[derive(Debug)]
pub struct ServiceReply {
    /// The reply message, encoded.
    pub body: Bytes,
    /// Its encoded size.
    pub bytes: usize,
    output: MessageDescriptor,
}

/// What a call got back: how many reply messages, how many bytes in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replies {
    pub messages: u32,
    pub bytes: usize,
}

impl ServiceReply {
    /// The reply decoded as the method's output message.
    pub fn message(&self) -> Result<DynamicMessage, Status> {
        DynamicMessage::decode(self.output.clone(), self.body.clone()).map_err(|e| {
            Status::internal(format!(
                "the reply is not a {}: {e}",
                self.output.full_name()
            ))
        })
    }
}

impl ServiceClient {
    /// Resolves `call`: its schema (from `proto` files, else the service's
    /// reflection), its method, its request messages (encoded once), its
    /// metadata; the connection opens lazily, on the first call.
    /// Reflection retries a service that cannot be reached yet for up to
    /// `patience` (one that is still starting); its channel is dropped
    /// once it has answered.
    pub async fn resolve(call: &ServiceCall, patience: Duration) -> Result<Self, ServiceError> {
        let (service, method_name) = split_method(&call.method)?;
        let endpoint = endpoint(&call.address)?;
        let peer: PeerAddr = call.address.parse().map_err(|e| ServiceError::Address {
            address: call.address.clone(),
            reason: format!("{e}"),
        })?;
        let channel = endpoint.connect_lazy();
        let pool = if call.proto.is_empty() {
            tokio::time::timeout(
                patience + RESOLVE_TIMEOUT,
                reflect(&channel, &call.address, service, patience),
            )
            .await
            .map_err(|_| ServiceError::Reflection {
                address: call.address.clone(),
                message: format!("no complete answer within {:?}", patience + RESOLVE_TIMEOUT),
            })??
        } else {
            compile(&call.proto, &call.proto_include)?
        };
        drop(channel);
        let method = find_method(&pool, service, method_name)?;
        let kind = MethodKind::of(&method);
        fits_kind(call, kind)?;
        let framed = encode_requests(call, &method)?;
        let metadata = call
            .metadata
            .iter()
            .map(|(k, v)| metadata_entry(k, v))
            .collect::<Result<Vec<_>, _>>()?;
        let link = Link::for_method(
            peer,
            &format!("/{service}/{method_name}"),
            CONNECT_TIMEOUT,
            &Arc::default(),
            None,
        )
        .map_err(|_| ServiceError::MethodName {
            method: call.method.clone(),
        })?
        .with_headers(metadata);
        Ok(ServiceClient {
            address: call.address.clone(),
            output: method.output(),
            method,
            kind,
            framed,
            requests: call.request.messages().len(),
            replies: call.replies,
            link: Arc::new(link),
        })
    }

    /// The service's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The method's full name, `package.Service.Method`.
    pub fn method_name(&self) -> &str {
        self.method.full_name()
    }

    /// The method's kind.
    pub fn kind(&self) -> MethodKind {
        self.kind
    }

    /// The method's output message.
    pub fn output(&self) -> MessageDescriptor {
        self.output.clone()
    }

    /// Makes one call: the request messages, the configured metadata,
    /// the current trace context's `traceparent` (untraced, a fresh
    /// trace's, not sampled, so a service that logs trace ids still tells
    /// its calls apart), and `grpc-timeout` from `timeout` when given;
    /// every reply read until the service ends the call. The service's
    /// non-OK status comes back as it is; a reply that does not fit the
    /// output message (one its decode would refuse), or a count of replies
    /// other than the method's or `replies`, is INTERNAL.
    pub async fn call(&self, timeout: Option<Duration>) -> Result<Replies, Status> {
        self.call_each(timeout, HeaderMap::new(), |_| ())
            .await
            .map(|(_, replies)| replies)
    }

    /// [`ServiceClient::call`] with `extra` headers sent too, answering
    /// the reply's headers as well (a layered service's record is there).
    pub async fn call_with(
        &self,
        timeout: Option<Duration>,
        extra: HeaderMap,
    ) -> Result<(HeaderMap, Replies), Status> {
        self.call_each(timeout, extra, |_| ()).await
    }

    /// [`ServiceClient::call_with`], each reply message handed to `each`
    /// as it comes, once it has been checked.
    pub async fn call_each(
        &self,
        timeout: Option<Duration>,
        extra: HeaderMap,
        mut each: impl FnMut(ServiceReply),
    ) -> Result<(HeaderMap, Replies), Status> {
        let traceparent = telemetry::traceparent_header().or_else(fresh_traceparent);
        let mut replies = Replies::default();
        let mut take = |body: Bytes| {
            fitting(&self.output, &self.address, &body)?;
            replies.messages = replies.messages.saturating_add(1);
            replies.bytes += body.len();
            each(ServiceReply {
                bytes: body.len(),
                body,
                output: self.output.clone(),
            });
            Ok(())
        };
        let call = async {
            let status_of = |(LinkError::Unsent(status) | LinkError::Failed(status))| status;
            if self.kind == MethodKind::Unary {
                let (headers, body) = self
                    .link
                    .call_framed(self.framed.clone(), timeout, traceparent, extra)
                    .await
                    .map_err(status_of)?;
                take(body)?;
                Ok(headers)
            } else {
                self.link
                    .call_streaming(self.framed.clone(), timeout, traceparent, extra, take)
                    .await
                    .map_err(status_of)
            }
        };
        let headers = match timeout {
            Some(timeout) => {
                crate::deadline::within(timeout, call, || {
                    format!("no answer from service {}", self.address)
                })
                .await
            }
            None => call.await,
        }?;
        self.counted(replies.messages)?;
        Ok((headers, replies))
    }

    /// Whether `got` replies are what the method gives (one, unless it
    /// streams its replies) and what `replies` asks for: INTERNAL naming
    /// the method and both counts when not.
    fn counted(&self, got: u32) -> Result<(), Status> {
        let want = match self.replies {
            Some(want) => want,
            None if self.kind.streams_replies() => return Ok(()),
            None => 1,
        };
        if got == want {
            return Ok(());
        }
        let asked = if self.replies.is_some() {
            format!("replies = {want}")
        } else {
            format!("one, as a {} method answers", self.kind.name())
        };
        Err(Status::internal(format!(
            "service {}: {} answered with {got} reply message{}, expected {asked}",
            self.address,
            self.method.full_name(),
            if got == 1 { "" } else { "s" },
        )))
    }
}

/// Whether `call`'s request messages and `replies` fit a method of `kind`
/// (see [`MethodKind::refuses`]).
fn fits_kind(call: &ServiceCall, kind: MethodKind) -> Result<(), ServiceError> {
    match kind.refuses(&call.request, call.replies) {
        None => Ok(()),
        Some((key, why)) => Err(ServiceError::MethodKind {
            key,
            method: call.method.clone(),
            why,
        }),
    }
}

impl MethodKind {
    /// The key (`requests` or `replies`) a method of this kind does not
    /// take as given, and why: a list of `requests` is a client-streaming
    /// or bidirectional method's (a server-streaming one takes a list of
    /// one), `replies` a server-streaming or bidirectional one's.
    pub fn refuses(
        self,
        request: &Requests,
        replies: Option<u32>,
    ) -> Option<(&'static str, String)> {
        let streams_requests = matches!(self, MethodKind::ClientStreaming | MethodKind::Bidi);
        match request {
            Requests::List(_) if self == MethodKind::Unary => {
                return Some((
                    "requests",
                    "a unary method takes one request message; give it as request".to_owned(),
                ));
            }
            Requests::List(list) if !streams_requests && list.len() != 1 => {
                return Some((
                    "requests",
                    format!(
                        "a {} method takes one request message, not a list of {}; give it as \
                         request",
                        self.name(),
                        list.len()
                    ),
                ));
            }
            _ => {}
        }
        (replies.is_some() && !self.streams_replies()).then(|| {
            (
                "replies",
                format!(
                    "a {} method answers with one message; replies counts a server-streaming \
                     or bidirectional method's",
                    self.name()
                ),
            )
        })
    }
}

/// The kind of `method` (`package.Service/Method`) in the `.proto` files
/// `proto`, with import paths `include`: what can be known of a method
/// before its service runs.
pub fn method_kind_in(
    proto: &[PathBuf],
    include: &[PathBuf],
    method: &str,
) -> Result<MethodKind, ServiceError> {
    let (service, name) = split_method(method)?;
    let pool = compile(proto, include)?;
    Ok(MethodKind::of(&find_method(&pool, service, name)?))
}

/// `call`'s request messages as `method`'s input, encoded and framed one
/// after another.
fn encode_requests(call: &ServiceCall, method: &MethodDescriptor) -> Result<Bytes, ServiceError> {
    let input = method.input();
    let key = |i: usize| match &call.request {
        Requests::One(_) => "request".to_owned(),
        Requests::List(_) => format!("requests[{i}]"),
    };
    let mut framed = BytesMut::new();
    for (i, json) in call.request.messages().iter().enumerate() {
        let message =
            protojson::parse_message(&input, json).map_err(|source| ServiceError::Request {
                key: key(i),
                method: call.method.clone(),
                input: input.full_name().to_owned(),
                source: Box::new(source),
            })?;
        let bytes = message.encode_to_vec();
        let one = unary::frame(&bytes).ok_or_else(|| ServiceError::RequestTooLarge {
            key: key(i),
            method: call.method.clone(),
            bytes: bytes.len(),
            limit: MAX_CALL_MESSAGE_BYTES,
        })?;
        framed.extend_from_slice(&one);
    }
    Ok(framed.freeze())
}

/// Whether `body`, the reply of the service at `address`, fits `output`:
/// INTERNAL when it does not (a decode would refuse it).
fn fitting(output: &MessageDescriptor, address: &str, body: &[u8]) -> Result<(), Status> {
    fits::check(output, body).map_err(|e| {
        Status::internal(format!(
            "service {address}: its reply is not a {}: {e}",
            output.full_name()
        ))
    })
}

/// `package.Service/Method` (a leading `/` and a `.` before the method
/// are accepted too) as its service and method.
fn split_method(method: &str) -> Result<(&str, &str), ServiceError> {
    let bad = || ServiceError::MethodName {
        method: method.to_owned(),
    };
    let trimmed = method.trim_start_matches('/');
    let (service, name) = trimmed
        .rsplit_once('/')
        .or_else(|| trimmed.rsplit_once('.'))
        .ok_or_else(bad)?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    if ok(service) && ok(name) && !name.contains('.') {
        Ok((service, name))
    } else {
        Err(bad())
    }
}

/// A plaintext endpoint for `host:port`.
fn endpoint(address: &str) -> Result<Endpoint, ServiceError> {
    let bad = |reason: String| ServiceError::Address {
        address: address.to_owned(),
        reason,
    };
    if address.contains("://") {
        return Err(bad(
            "give `host:port` (the service is called in plaintext)".into()
        ));
    }
    let (_, port) = address
        .rsplit_once(':')
        .ok_or_else(|| bad("expected `host:port`".into()))?;
    port.parse::<u16>()
        .map_err(|_| bad(format!("`{port}` is not a port")))?;
    let uri: Uri = format!("http://{address}")
        .parse()
        .map_err(|e| bad(format!("{e}")))?;
    Ok(crate::link::endpoint(uri, CONNECT_TIMEOUT))
}

/// A `traceparent` of a new trace, not sampled: the trace context of a
/// call made outside any trace.
fn fresh_traceparent() -> Option<HeaderValue> {
    let mut rng = rand::rng();
    let trace_id = rand::Rng::random_range(&mut rng, 1..=u128::MAX);
    let span_id = rand::Rng::random_range(&mut rng, 1..=u64::MAX);
    HeaderValue::from_str(&telemetry::traceparent(trace_id, span_id, false)).ok()
}

fn metadata_entry(key: &str, value: &str) -> Result<(HeaderName, HeaderValue), ServiceError> {
    use base64::Engine as _;
    let bad = |reason: &str| ServiceError::Metadata {
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    let lower = key.to_ascii_lowercase();
    if lower.starts_with("grpc-") || lower == "traceparent" {
        return Err(bad("set by the call itself"));
    }
    let k = HeaderName::from_bytes(lower.as_bytes()).map_err(|_| bad("not a valid key"))?;
    if lower.ends_with("-bin") {
        // Binary metadata: written as base64 (standard or URL-safe,
        // padded or not), sent as gRPC sends it, standard base64 without
        // padding.
        let bytes = crate::protojson::decode_base64(value)
            .ok_or_else(|| bad("a `-bin` key's value is its bytes in base64"))?;
        let text = base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes);
        let v = HeaderValue::from_str(&text).map_err(|_| bad("not a valid value"))?;
        return Ok((k, v));
    }
    if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(bad("not printable ASCII"));
    }
    let v = HeaderValue::from_str(value).map_err(|_| bad("not a valid value"))?;
    Ok((k, v))
}

/// The schema from `.proto` files, compiled with protox; the files' own
/// directories are import paths after `includes`.
fn compile(files: &[PathBuf], includes: &[PathBuf]) -> Result<DescriptorPool, ServiceError> {
    let names = || {
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut paths: Vec<PathBuf> = includes.to_vec();
    for file in files {
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !paths.iter().any(|p| p == dir) {
            paths.push(dir.to_path_buf());
        }
    }
    let fail = |e: protox::Error| ServiceError::Proto {
        files: names(),
        message: e.to_string(),
    };
    let mut compiler = protox::Compiler::new(&paths).map_err(fail)?;
    compiler.include_imports(true);
    compiler.open_files(files).map_err(fail)?;
    Ok(compiler.descriptor_pool())
}

fn find_method(
    pool: &DescriptorPool,
    service: &str,
    method: &str,
) -> Result<MethodDescriptor, ServiceError> {
    let Some(svc) = pool.get_service_by_name(service) else {
        let known: Vec<String> = pool.services().map(|s| s.full_name().to_owned()).collect();
        return Err(ServiceError::UnknownMethod {
            message: format!(
                "unknown service \"{service}\" (the schema has: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
        });
    };
    let found = svc.methods().find(|m| m.name() == method);
    let Some(found) = found else {
        let known: Vec<String> = svc.methods().map(|m| m.name().to_owned()).collect();
        return Err(ServiceError::UnknownMethod {
            message: format!(
                "unknown method \"{method}\" of {service} (it has: {})",
                known.join(", ")
            ),
        });
    };
    Ok(found)
}

/// The schema through `service`'s server reflection at `address`:
/// `grpc.reflection.v1`, or v1alpha when v1 answers UNIMPLEMENTED; the
/// file defining the service, then every import it lacks.
async fn reflect(
    channel: &Channel,
    address: &str,
    service: &str,
    patience: Duration,
) -> Result<DescriptorPool, ServiceError> {
    let fail = |message: String| ServiceError::Reflection {
        address: address.to_owned(),
        message,
    };
    let first = MessageRequest::FileContainingSymbol(service.to_owned());
    let give_up = tokio::time::Instant::now() + patience;
    let answer = loop {
        match ask(channel, REFLECTION_V1, first.clone()).await {
            Err(status)
                if status.code() == Code::Unavailable && tokio::time::Instant::now() < give_up =>
            {
                tokio::time::sleep(RETRY_AFTER).await;
            }
            answer => break answer,
        }
    };
    let (path, files) = match answer {
        Ok(files) => (REFLECTION_V1, files),
        Err(status) if status.code() == Code::Unimplemented => {
            let files = ask(channel, REFLECTION_V1ALPHA, first)
                .await
                .map_err(|status| fail(reflection_status(&status, service, true)))?;
            (REFLECTION_V1ALPHA, files)
        }
        Err(status) => return Err(fail(reflection_status(&status, service, false))),
    };
    let mut have: HashMap<String, FileDescriptorProto> = HashMap::new();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    let add = |files: Vec<FileDescriptorProto>,
               have: &mut HashMap<String, FileDescriptorProto>,
               wanted: &mut BTreeSet<String>| {
        for file in files {
            wanted.extend(file.dependency.iter().cloned());
            have.insert(file.name().to_owned(), file);
        }
        wanted.retain(|name| !have.contains_key(name));
    };
    add(files, &mut have, &mut wanted);
    while let Some(name) = wanted.pop_first() {
        let files = match ask(channel, path, MessageRequest::FileByFilename(name.clone())).await {
            Ok(files) => files,
            // A server may leave the well-known types out; they are known.
            Err(_) if well_known(&name).is_some() => well_known(&name).into_iter().collect(),
            Err(status) => {
                return Err(fail(format!(
                    "the import \"{name}\" could not be fetched: {}",
                    status.message()
                )));
            }
        };
        add(files, &mut have, &mut wanted);
        if !have.contains_key(&name) {
            return Err(fail(format!("the answer for \"{name}\" did not hold it")));
        }
    }
    let mut pool = DescriptorPool::new();
    pool.add_file_descriptor_protos(have.into_values())
        .map_err(|e| fail(format!("its descriptors do not build a schema: {e}")))?;
    Ok(pool)
}

fn reflection_status(status: &Status, service: &str, alpha: bool) -> String {
    match status.code() {
        Code::Unimplemented => {
            "the service serves no reflection (v1 nor v1alpha); give its .proto files".to_owned()
        }
        Code::NotFound => format!("it does not know \"{service}\""),
        _ => format!(
            "{}{}: {}",
            if alpha { "v1alpha: " } else { "" },
            status.code().description(),
            status.message()
        ),
    }
}

fn well_known(name: &str) -> Option<FileDescriptorProto> {
    name.starts_with("google/protobuf/")
        .then(|| DescriptorPool::global().get_file_by_name(name))
        .flatten()
        .map(|f| f.file_descriptor_proto().clone())
}

/// One reflection request on its own stream; the files of its answer.
async fn ask(
    channel: &Channel,
    path: &'static str,
    request: MessageRequest,
) -> Result<Vec<FileDescriptorProto>, Status> {
    let mut grpc = Grpc::new(channel.clone()).max_decoding_message_size(MAX_CALL_MESSAGE_BYTES);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not reachable: {e}")))?;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = grpc
        .streaming(
            tonic::Request::new(tokio_stream::once(request)),
            tonic::codegen::http::uri::PathAndQuery::from_static(path),
            tonic_prost::ProstCodec::<ServerReflectionRequest, ServerReflectionResponse>::default(),
        )
        .await?
        .into_inner();
    let answer = answers
        .message()
        .await?
        .ok_or_else(|| Status::unknown("the stream ended without an answer"))?;
    match answer.message_response {
        Some(MessageResponse::FileDescriptorResponse(files)) => files
            .file_descriptor_proto
            .iter()
            .map(|bytes| {
                FileDescriptorProto::decode(bytes.as_slice())
                    .map_err(|e| Status::internal(format!("an undecodable descriptor: {e}")))
            })
            .collect(),
        Some(MessageResponse::ErrorResponse(e)) => {
            Err(Status::new(Code::from(e.error_code), e.error_message))
        }
        _ => Err(Status::internal("an answer of the wrong kind")),
    }
}

/// A gRPC codec of undecoded message bytes: it sends the bytes it is given
/// and hands back the bytes it receives, leaving the (de)coding against a
/// schema to its user: a server's codec for a handler that decodes by hand
/// (the tests' echo servers), or a tonic client's for undecoded calls. A
/// service hop's own call does not go through tonic (see the module's
/// docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

/// [`RawCodec`]'s encoder: writes the bytes as they are.
#[derive(Debug)]
pub struct RawEncoder;

/// [`RawCodec`]'s decoder: yields the whole message's bytes.
#[derive(Debug)]
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_split_into_service_and_method() {
        assert_eq!(
            split_method("tailmesh.examples.v1.Echo/Echo").ok(),
            Some(("tailmesh.examples.v1.Echo", "Echo"))
        );
        assert_eq!(split_method("/a.B/C").ok(), Some(("a.B", "C")));
        assert_eq!(split_method("a.B.C").ok(), Some(("a.B", "C")));
        for bad in ["", "Echo", "a.B/", "/C", "a..B/C", "a.B/C.D", "a B/C"] {
            assert!(split_method(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_reply_that_does_not_fit_the_output_message_is_internal() {
        let pool = echo_pool();
        let output = find_method(&pool, "tailmesh.examples.v1.Echo", "Echo")
            .unwrap_or_else(|e| panic!("{e}"))
            .output();
        // EchoReply { message: "hi", deadline_left_us: -1 }.
        let fine = [
            0x0a, 2, b'h', b'i', 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert!(fitting(&output, "svc:1", &fine).is_ok());
        assert!(
            fitting(&output, "svc:1", &[]).is_ok(),
            "an empty reply is all defaults"
        );
        for misfit in [
            &[0x0a, 2, 0xff, 0xfe][..], // `message` is not UTF-8
            &[0x0a, 9, b'h'],           // `message` runs past the reply
            &[0x08, 1],                 // `message` as a varint
            &[0x18],                    // `deadline_left_us` without its value
        ] {
            let status = fitting(&output, "svc:1", misfit)
                .err()
                .unwrap_or_else(|| panic!("{misfit:02x?} fits"));
            assert_eq!(status.code(), Code::Internal, "{status:?}");
            assert!(
                status.message().contains("svc:1")
                    && status.message().contains("tailmesh.examples.v1.EchoReply"),
                "{status:?}"
            );
        }
    }

    fn echo_pool() -> DescriptorPool {
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/servers/echo.proto");
        compile(&[proto], &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_methods_kind_decides_what_requests_and_replies_it_takes() {
        let pool = echo_pool();
        let kind = |name| {
            MethodKind::of(
                &find_method(&pool, "tailmesh.examples.v1.Echo", name)
                    .unwrap_or_else(|e| panic!("{e}")),
            )
        };
        assert_eq!(
            ["Echo", "EchoStream", "EchoServerStream", "EchoClientStream"].map(kind),
            [
                MethodKind::Unary,
                MethodKind::Bidi,
                MethodKind::ServerStreaming,
                MethodKind::ClientStreaming
            ]
        );
        let call = |request: Requests, replies| ServiceCall {
            address: "h:1".into(),
            method: "p.S/M".into(),
            request,
            replies,
            proto: Vec::new(),
            proto_include: Vec::new(),
            metadata: Vec::new(),
            layered: false,
        };
        let one = || Requests::from("{}");
        let list = |n| Requests::List(vec!["{}".to_owned(); n]);
        // What each kind takes.
        for (kind, request, replies) in [
            (MethodKind::Unary, one(), None),
            (MethodKind::ServerStreaming, one(), Some(3)),
            (MethodKind::ServerStreaming, list(1), None),
            (MethodKind::ClientStreaming, list(3), None),
            (MethodKind::ClientStreaming, one(), None),
            (MethodKind::Bidi, list(2), Some(0)),
        ] {
            let c = call(request, replies);
            assert!(fits_kind(&c, kind).is_ok(), "{kind:?} {c:?}");
        }
        // And what it does not, named.
        for (kind, request, replies, words) in [
            (
                MethodKind::Unary,
                list(1),
                None,
                "requests for p.S/M: a unary method takes one request message; give it as \
                 request",
            ),
            (
                MethodKind::ServerStreaming,
                list(2),
                None,
                "requests for p.S/M: a server-streaming method takes one request message, not a \
                 list of 2",
            ),
            (
                MethodKind::Unary,
                one(),
                Some(1),
                "replies for p.S/M: a unary method answers with one message",
            ),
            (
                MethodKind::ClientStreaming,
                list(2),
                Some(1),
                "replies for p.S/M: a client-streaming method answers with one message",
            ),
        ] {
            let err = fits_kind(&call(request, replies), kind)
                .expect_err("refused")
                .to_string();
            assert!(err.starts_with(words), "{kind:?}: {err}");
        }
    }

    #[test]
    fn each_request_message_is_encoded_and_framed_in_order() {
        let pool = echo_pool();
        let method = find_method(&pool, "tailmesh.examples.v1.Echo", "EchoStream")
            .unwrap_or_else(|e| panic!("{e}"));
        let call = ServiceCall {
            address: "h:1".into(),
            method: "tailmesh.examples.v1.Echo/EchoStream".into(),
            request: Requests::List(vec![
                r#"{"message": "a"}"#.to_owned(),
                "{}".to_owned(),
                r#"{"workUs": 1}"#.to_owned(),
            ]),
            replies: None,
            proto: Vec::new(),
            proto_include: Vec::new(),
            metadata: Vec::new(),
            layered: false,
        };
        let framed = encode_requests(&call, &method).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            &framed[..],
            [
                0, 0, 0, 0, 3, 0x0a, 1, b'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0x10, 1
            ]
        );
        let bad = ServiceCall {
            request: Requests::List(vec!["{}".to_owned(), r#"{"wrk": 1}"#.to_owned()]),
            ..call
        };
        let err = encode_requests(&bad, &method)
            .expect_err("a misfit")
            .to_string();
        assert!(
            err.starts_with("requests[1] for tailmesh.examples.v1.Echo/EchoStream"),
            "{err}"
        );
    }

    #[test]
    fn a_call_outside_a_trace_carries_a_fresh_unsampled_trace_context() {
        let (a, b) = (fresh_traceparent(), fresh_traceparent());
        let parse = |v: &Option<HeaderValue>| {
            v.as_ref()
                .and_then(|v| telemetry::context::SpanContext::parse_bytes(v.as_bytes()))
        };
        let (ca, cb) = (parse(&a), parse(&b));
        let (ca, cb) = (ca.expect("a valid traceparent"), cb.expect("a valid one"));
        assert!(!ca.sampled && !cb.sampled);
        assert_ne!(ca.trace_id, cb.trace_id, "each call its own trace");
        assert!(ca.trace_id != 0 && ca.span_id != 0);
    }

    #[test]
    fn addresses_and_metadata_are_checked() {
        assert!(endpoint("127.0.0.1:50051").is_ok());
        assert!(endpoint("localhost:1").is_ok());
        for bad in ["127.0.0.1", "http://127.0.0.1:1", "h:port", "h:70000"] {
            assert!(endpoint(bad).is_err(), "{bad:?}");
        }
        assert!(metadata_entry("x-tenant", "blue").is_ok());
        // Binary metadata in any base64 form goes as gRPC sends it.
        for (written, sent) in [
            ("AP8Q", "AP8Q"),
            ("AP8=", "AP8"),
            ("AP8", "AP8"),
            ("-_8", "+/8"),
        ] {
            let (k, v) = metadata_entry("trace-bin", written).expect("base64");
            assert_eq!(k.as_str(), "trace-bin");
            assert_eq!(v.to_str().ok(), Some(sent), "{written}");
        }
        for (k, v) in [
            ("grpc-timeout", "1S"),
            ("traceparent", "x"),
            ("a-bin", "not base64!"),
            ("bad key", "x"),
            ("k", "caf\u{e9}"),
        ] {
            assert!(metadata_entry(k, v).is_err(), "{k:?}={v:?}");
        }
    }
}
