//! `tailmesh probe`: one call to a real gRPC service made the way a hop
//! whose work it is makes it (the schema resolved the same way, the
//! request encoded once, deadline, `traceparent` and metadata sent, the
//! reply checked against the output message), so its wiring can be
//! checked before a run.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{path::PathBuf, time::Duration};

use clap::Args;
use tailmesh::{say, tell};
use tailmesh_services::{
    hop::{ServiceClient, ServiceError},
    model::ServiceCall,
    protojson,
    telemetry::{self, SpanContext},
};
use tonic::Status;

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
            ProbeError::Resolve(_) | ProbeError::Unreachable { .. } => 2,
        }
    }
}

/// Resolves the method, makes one call, prints the reply as JSON on
/// standard output and the status, time and trace context on standard
/// error.
pub(crate) fn probe(args: ProbeArgs) -> Result<(), CliError> {
    let runtime = tailmesh::roles::runtime(1).map_err(|e| CliError::Probe(e.into()))?;
    runtime.block_on(call(args)).map_err(CliError::Probe)
}

async fn call(args: ProbeArgs) -> Result<(), ProbeError> {
    let service = ServiceCall {
        address: args.address.clone(),
        method: args.method,
        request: args.json,
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
    let started = std::time::Instant::now();
    let answer = telemetry::scope(Some(cx), None, client.call(Some(args.timeout))).await;
    let took = started.elapsed();
    let traceparent = cx.traceparent();
    let answer = answer.and_then(|reply| Ok((reply.message()?, reply.bytes)));
    match answer {
        Ok((message, bytes)) => {
            let json = protojson::to_json(&message);
            say!(
                "{}",
                serde_json::to_string_pretty(&json).unwrap_or_else(|_| json.to_string())
            );
            tell!(
                "OK: {} from {} in {took:.3?} ({} reply bytes; traceparent {traceparent})",
                client.method_name(),
                client.address(),
                bytes
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
