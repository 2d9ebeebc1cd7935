//! The hop's errors: [`PoolError`] building a push pool, [`HopError`]
//! for callers of this library, and
//! [`CallError`] for everything a hop answers on the wire, mapped to a
//! gRPC status in exactly one place (`From<CallError> for Status`).

use tonic::{Code, Status};

use crate::addr::PeerAddr;

/// Errors building a pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The hop has no replica addresses.
    #[error("hop \"{0}\" has no replicas to call")]
    NoReplicas(String),
    /// An address could not be turned into an endpoint.
    #[error("hop \"{hop}\" replica {replica} ({addr}): {source}")]
    Endpoint {
        hop: String,
        /// The replica index.
        replica: usize,
        /// Its address.
        addr: PeerAddr,
        /// Why it is not a URI.
        source: tonic::codegen::http::uri::InvalidUri,
    },
}

/// Errors starting or running a hop.
#[derive(Debug, thiserror::Error)]
pub enum HopError {
    /// A downstream pool could not be built.
    #[error("hop \"{hop}\": downstream: {source}")]
    Downstream {
        /// This hop.
        hop: String,
        /// The PoolError it failed with.
        source: PoolError,
    },
    /// A pull downstream but no broker address.
    #[error(
        "hop \"{hop}\": downstream \"{downstream}\" is reached by pull but no broker address was given"
    )]
    NoBroker {
        /// This hop.
        hop: String,
        /// The pull downstream.
        downstream: String,
    },
    /// The gRPC server failed.
    #[error("hop \"{hop}\" replica {replica}: serve: {source}")]
    Serve {
        /// This hop.
        hop: String,
        /// This replica.
        replica: u32,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// The TLS files could not be used.
    #[error("hop \"{hop}\": TLS: {source}")]
    Tls {
        hop: String,
        source: crate::tls::TlsError,
    },
    /// The hop's service (`[hop.service]`) could not be resolved: its
    /// schema, its method, its request or its metadata.
    #[error("hop \"{hop}\" replica {replica}: service: {source}")]
    Service {
        /// This hop.
        hop: String,
        /// This replica.
        replica: u32,
        /// What was wrong (boxed: it is large, and rare).
        source: Box<super::service::ServiceError>,
    },
    /// A hop with a service built without resolving it
    /// ([`HopCore::resolve`](super::HopCore::resolve)).
    #[error("hop \"{hop}\": its service must be resolved first (HopCore::resolve)")]
    ServiceUnresolved {
        /// This hop.
        hop: String,
    },
    /// Reflection could not be set up.
    #[error("hop \"{hop}\": reflection: {source}")]
    Reflection {
        /// This hop.
        hop: String,
        /// The reflection builder's error.
        source: tonic_reflection::server::Error,
    },
}

/// Why a hop did not answer a call with a reply. Its `Display` is the
/// status message the caller reads: each names the hop (and the replica or
/// broker) it happened at, which is how the analysis blames a hop for a
/// failed request, so the wording is part of the results.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The replica is stopping and takes no more work.
    #[error("hop \"{hop}\" is shutting down")]
    ShuttingDown { hop: String },
    /// The scenario's injected error for this request.
    #[error("injected error at hop \"{hop}\" replica {replica}")]
    Injected {
        hop: String,
        replica: u32,
        code: Code,
    },
    /// A push replica with limited concurrency already has `limit`
    /// requests waiting for a slot; this one is refused, never queued.
    #[error(
        "hop \"{hop}\" replica {replica}: {limit} requests already wait for a slot (queue_limit)"
    )]
    QueueFull {
        hop: String,
        replica: u32,
        limit: u32,
    },
    /// The replica's adaptive discipline gave up on a request that waited
    /// too long in a line that stands.
    #[error(
        "hop \"{hop}\" replica {replica}: shed after {waited:?} waiting for a slot: the line has not been empty for {interval:?}, so its adaptive discipline sheds waits over {target:?}",
        interval = crate::discipline::ADAPTIVE_INTERVAL,
        target = crate::discipline::ADAPTIVE_TARGET
    )]
    Shed {
        hop: String,
        replica: u32,
        waited: std::time::Duration,
    },
    /// The caller's deadline passed while the request waited for a slot.
    #[error("hop \"{hop}\" replica {replica}: deadline passed after {waited:?} waiting for a slot")]
    DeadlineInLine {
        hop: String,
        replica: u32,
        waited: std::time::Duration,
    },
    /// A pull worker took a broker task whose deadline had already passed;
    /// it is refused, never started.
    #[error("hop \"{hop}\": task {task} taken after its deadline")]
    TakenAfterDeadline { hop: String, task: u64 },
    /// Nothing was left of the caller's deadline for the downstream calls.
    #[error("hop \"{hop}\": deadline passed before calling downstream")]
    DeadlineBeforeDownstream { hop: String },
    /// The hop's service answered non-OK (or not at all, or garbled);
    /// `status` keeps its code.
    #[error("hop \"{hop}\" replica {replica}: service {address}: {}", status.message())]
    Service {
        hop: String,
        replica: u32,
        address: String,
        status: Status,
    },
    /// Nothing was left of the caller's deadline for the service call.
    #[error("hop \"{hop}\": deadline passed before calling its service")]
    DeadlineBeforeService { hop: String },
    /// A broker task whose payload is not a `CallRequest`.
    #[error("task {task}: undecodable request: {source}")]
    UndecodableRequest {
        task: u64,
        source: prost::DecodeError,
    },
    /// A push replica's call failed; `status` is what it (or the transport)
    /// said, its code kept.
    #[error("hop \"{hop}\" replica {replica} ({addr}): {}", status.message())]
    Replica {
        hop: String,
        replica: usize,
        addr: PeerAddr,
        status: Status,
    },
    /// A call through the broker failed; `status` is the broker's (or the
    /// worker's) answer, its code kept.
    #[error("hop \"{hop}\" via broker {broker}: {}", status.message())]
    ViaBroker {
        hop: String,
        broker: PeerAddr,
        status: Status,
    },
    /// The worker's reply through the broker is not a `CallReply`.
    #[error("hop \"{hop}\" via broker {broker}: undecodable reply: {source}")]
    UndecodableReply {
        hop: String,
        broker: PeerAddr,
        source: prost::DecodeError,
    },
}

impl From<CallError> for Status {
    fn from(err: CallError) -> Self {
        let code = match &err {
            CallError::ShuttingDown { .. } => Code::Unavailable,
            CallError::Injected { code, .. } => *code,
            CallError::QueueFull { .. } | CallError::Shed { .. } => Code::ResourceExhausted,
            CallError::DeadlineBeforeDownstream { .. }
            | CallError::DeadlineBeforeService { .. }
            | CallError::DeadlineInLine { .. }
            | CallError::TakenAfterDeadline { .. } => Code::DeadlineExceeded,
            CallError::UndecodableRequest { .. } => Code::InvalidArgument,
            CallError::Replica { status, .. }
            | CallError::ViaBroker { status, .. }
            | CallError::Service { status, .. } => status.code(),
            CallError::UndecodableReply { .. } => Code::Internal,
        };
        Status::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_keep_their_codes_and_name_the_hop() {
        let addr: PeerAddr = "127.0.0.1:7000".parse().expect("an address");
        let cases = [
            (
                CallError::ShuttingDown { hop: "b".into() },
                Code::Unavailable,
                "hop \"b\" is shutting down",
            ),
            (
                CallError::Injected {
                    hop: "b".into(),
                    replica: 1,
                    code: Code::ResourceExhausted,
                },
                Code::ResourceExhausted,
                "injected error at hop \"b\" replica 1",
            ),
            (
                CallError::QueueFull {
                    hop: "b".into(),
                    replica: 0,
                    limit: 1000,
                },
                Code::ResourceExhausted,
                "hop \"b\" replica 0: 1000 requests already wait for a slot (queue_limit)",
            ),
            (
                CallError::DeadlineBeforeDownstream { hop: "b".into() },
                Code::DeadlineExceeded,
                "hop \"b\": deadline passed before calling downstream",
            ),
            (
                CallError::TakenAfterDeadline {
                    hop: "b".into(),
                    task: 7,
                },
                Code::DeadlineExceeded,
                "hop \"b\": task 7 taken after its deadline",
            ),
            (
                CallError::Replica {
                    hop: "c".into(),
                    replica: 2,
                    addr: addr.clone(),
                    status: Status::unavailable("refused"),
                },
                Code::Unavailable,
                "hop \"c\" replica 2 (127.0.0.1:7000): refused",
            ),
            (
                CallError::Service {
                    hop: "s".into(),
                    replica: 1,
                    address: "127.0.0.1:9".into(),
                    status: Status::failed_precondition("no stock"),
                },
                Code::FailedPrecondition,
                "hop \"s\" replica 1: service 127.0.0.1:9: no stock",
            ),
            (
                CallError::ViaBroker {
                    hop: "c".into(),
                    broker: addr,
                    status: Status::not_found("unknown topic"),
                },
                Code::NotFound,
                "hop \"c\" via broker 127.0.0.1:7000: unknown topic",
            ),
        ];
        for (err, code, message) in cases {
            let status = Status::from(err);
            assert_eq!((status.code(), status.message()), (code, message));
        }
    }
}
