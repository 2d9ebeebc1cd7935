//! `tailmesh probe`: one call to a real gRPC service made the way a hop
//! whose work it is makes it (the schema resolved the same way, the
//! request messages encoded once, deadline, `traceparent` and metadata
//! sent, each reply checked against the output message, and their count
//! against `--replies`), so its wiring can be checked before a run. A
//! streaming method's call is one stream: `--requests` sent in order, then
//! half-close, then every reply printed as it comes.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{path::PathBuf, time::Duration};

use clap::Args;
use tailmesh::{say, tell};
use tailmesh_services::{
    hop::{MethodKind, ServiceClient, ServiceError, ServiceReply},
    model::{Requests, ServiceCall},
    protojson,
    telemetry::{self, SpanContext},
};
use tonic::{Status, codegen::http::HeaderMap};

use super::CliError;

/// `tailmesh probe`.
#[derive(Args)]
pub(crate) struct ProbeArgs {
    /// The service, host:port (called in plaintext).
    address: String,
    /// The full method name, package.Service/Method.
    method: String,
    /// The request message in protobuf's JSON mapping.
    #[arg(long, default_value = "{}")]
    json: String,
    /// A streaming method's request messages in order, a JSON list of
    /// objects (instead of --json, which is a list of one).
    #[arg(long, conflicts_with = "json")]
    requests: Option<String>,
    /// How many reply messages the call must get (a server-streaming or
    /// bidirectional method's); without it, any number.
    #[arg(long)]
    replies: Option<u32>,
    /// A .proto file that defines the method (repeatable); without one,
    /// the service's server reflection (v1, then v1alpha).
    #[arg(long)]
    proto: Vec<PathBuf>,
    /// An import path for --proto (repeatable); the files' own
    /// directories are searched too.
    #[arg(long = "proto-include")]
    proto_include: Vec<PathBuf>,
    /// Metadata sent with the call, key=value (repeatable).
    #[arg(long, value_parser = key_value)]
    metadata: Vec<(String, String)>,
    /// The call's deadline (sent as grpc-timeout), and the bound on
    /// reaching the service.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    timeout: Duration,
}

fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{text}` is not key=value"))
}

/// Why `tailmesh probe` did not get an OK answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The method, its schema, the request or the metadata is wrong, or
    /// the service cannot be reached (exit 2).
    #[error(transparent)]
    Resolve(#[from] ServiceError),
    /// `--requests` is not a JSON list of objects (exit 2).
    #[error("--requests: {0}")]
    Requests(String),
    /// Nothing listens at the address, or it does not speak gRPC (exit 2).
    #[error("{address}: {message}")]
    Unreachable { address: String, message: String },
    /// The service answered non-OK, or garbled (exit 1).
    #[error("{} ({}): {}", code_name(.0.code()), i32::from(.0.code()), .0.message())]
    Answered(Status),
    /// The probe's runtime could not be built (exit 1).
    #[error(transparent)]
    Runtime(#[from] tailmesh::roles::RuntimeError),
}

/// A status code's name as gRPC spells it.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

impl ProbeError {
    /// 1 when the service answered (non-OK), 2 when the probe could not
    /// get a call to it.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            ProbeError::Answered(_) | ProbeError::Runtime(_) => 1,
            ProbeError::Resolve(_) | ProbeError::Requests(_) | ProbeError::Unreachable { .. } => 2,
        }
    }
}

/// Resolves the method, makes one call, prints each reply as JSON on
/// standard output (one pretty object for a unary or client-streaming
/// method, one line per message for a streaming reply) and the status,
/// time and trace context on standard error.
pub(crate) fn probe(args: ProbeArgs) -> Result<(), CliError> {
    let runtime = tailmesh::roles::runtime(1).map_err(|e| CliError::Probe(e.into()))?;
    runtime.block_on(call(args)).map_err(CliError::Probe)
}

/// `--requests`: a JSON list of objects, each as its own JSON text.
fn requests_list(text: &str) -> Result<Vec<String>, ProbeError> {
    let bad = |why: String| ProbeError::Requests(why);
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let serde_json::Value::Array(items) = value else {
        return Err(bad(
            "expected a JSON list of objects (the request messages)".to_owned(),
        ));
    };
    if items.is_empty() {
        return Err(bad("needs at least one message".to_owned()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.is_object()
                .then(|| item.to_string())
                .ok_or_else(|| bad(format!("message {i} is not a JSON object")))
        })
        .collect()
}

async fn call(args: ProbeArgs) -> Result<(), ProbeError> {
    let request = match &args.requests {
        Some(text) => Requests::List(requests_list(text)?),
        None => Requests::One(args.json),
    };
    let service = ServiceCall {
        address: args.address.clone(),
        method: args.method,
        request,
        replies: args.replies,
        proto: args.proto,
        proto_include: args.proto_include,
        metadata: args.metadata,
        layered: false,
    };
    let unreachable = |message: String| ProbeError::Unreachable {
        address: args.address.clone(),
        message,
    };
    // Reachable at all? (A call's UNAVAILABLE could be the service's own
    // answer; a refused connection is not.)
    match tokio::time::timeout(
        args.timeout,
        tokio::net::TcpStream::connect(args.address.as_str()),
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(unreachable(format!("cannot connect: {e}"))),
        Err(_) => {
            return Err(unreachable(format!(
                "no connection within {}",
                tailmesh_units::duration(args.timeout)
            )));
        }
    }
    let client = ServiceClient::resolve(&service, Duration::ZERO).await?;
    // A trace context of its own, as a hop's span would give, so a
    // service that exports traces can be found by it.
    let cx = SpanContext {
        trace_id: rand::random::<u128>() | 1,
        span_id: rand::random::<u64>() | 1,
        sampled: true,
        remote: false,
    };
    let streamed = matches!(
        client.kind(),
        MethodKind::ServerStreaming | MethodKind::Bidi
    );
    // Each reply printed as it comes; one that does not decode (it fit
    // the output message, so it should) fails the probe after the call.
    let mut undecodable = None;
    let print = |reply: ServiceReply| match reply.message() {
        Ok(message) => {
            let json = protojson::to_json(&message);
            let text = if streamed {
                json.to_string()
            } else {
                serde_json::to_string_pretty(&json).unwrap_or_else(|_| json.to_string())
            };
            say!("{text}");
        }
        Err(status) => {
            undecodable.get_or_insert(status);
        }
    };
    let started = std::time::Instant::now();
    let answer = telemetry::scope(
        Some(cx),
        None,
        client.call_each(Some(args.timeout), HeaderMap::new(), print),
    )
    .await;
    let took = started.elapsed();
    let traceparent = cx.traceparent();
    let answer = match (answer, undecodable) {
        (Ok(_), Some(status)) => Err(status),
        (answer, _) => answer,
    };
    match answer {
        Ok((_, replies)) => {
            let counted = if streamed || replies.messages != 1 {
                format!(
                    "{} reply messages, {} bytes",
                    replies.messages, replies.bytes
                )
            } else {
                format!("{} reply bytes", replies.bytes)
            };
            tell!(
                "OK: {} from {} in {took:.3?} ({counted}; traceparent {traceparent})",
                client.method_name(),
                client.address(),
            );
            Ok(())
        }
        Err(status) => {
            tell!(
                "{} from {} after {took:.3?} (traceparent {traceparent})",
                client.method_name(),
                client.address()
            );
            Err(ProbeError::Answered(status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_a_json_list_of_objects() {
        assert_eq!(
            requests_list(r#"[{"message": "a"}, {}]"#).ok(),
            Some(vec![r#"{"message":"a"}"#.to_owned(), "{}".to_owned()])
        );
        for (text, words) in [
            ("[{]", "not JSON"),
            (r#"{"message": "a"}"#, "a JSON list of objects"),
            ("[]", "at least one message"),
            (r#"[{}, 3]"#, "message 1 is not a JSON object"),
        ] {
            let err = requests_list(text).expect_err(text).to_string();
            assert!(
                err.starts_with("--requests: ") && err.contains(words),
                "{text}: {err}"
            );
        }
    }
}
