//! The broker's errors: [`BrokerError`] for callers of this library, and
//! [`TaskError`] for everything the broker answers on the wire, mapped to a
//! gRPC status in exactly one place (`From<TaskError> for Status`).

use std::time::Duration;

use crate::addr::PeerAddr;

use tonic::{Code, Status};

/// What can go wrong running the broker, a producer client or a worker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The configuration cannot be served.
    #[error("broker config: {0}")]
    Config(String),
    /// The listener's address could not be read.
    #[error("broker listener: {0}")]
    Listener(#[source] std::io::Error),
    /// The reflection service could not be built from the descriptors.
    #[error("broker reflection service: {0}")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// The TLS files could not be used.
    #[error("broker TLS: {0}")]
    Tls(#[source] crate::tls::TlsError),
    /// The gRPC server failed.
    #[error("broker server: {0}")]
    Serve(#[source] tonic::transport::Error),
    /// A client could not reach the broker.
    #[error("connect broker {addr}: {source}")]
    Connect {
        /// The broker's address.
        addr: PeerAddr,
        /// Why connecting failed.
        #[source]
        source: tonic::transport::Error,
    },
    /// The broker refused a worker for a reason retrying cannot fix (an
    /// unknown topic, a malformed Hello).
    #[error("worker {worker:?} on topic {topic:?}: broker {addr} refused it: {status}")]
    WorkerRefused {
        /// The broker's address.
        addr: PeerAddr,
        /// The topic the worker asked for.
        topic: String,
        /// The worker's name.
        worker: String,
        /// The broker's answer.
        status: Status,
    },
}

/// Why the broker did not (or could not) answer a call with a worker's
/// result. Its `Display` is the status message the caller reads.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TaskError {
    #[error("unknown topic {topic:?} (this broker serves {served})")]
    UnknownTopic { topic: String, served: String },
    #[error("payload is {len} bytes, over the broker's limit of {limit} bytes")]
    PayloadTooLarge { len: usize, limit: usize },
    #[error("topic {topic:?} is full ({capacity} tasks queued); try again later")]
    Full { topic: String, capacity: usize },
    #[error(
        "topic {topic:?} is full ({queued} of its {limit} bytes queued, this task needs {len}); try again later"
    )]
    FullBytes {
        topic: String,
        queued: usize,
        len: usize,
        limit: usize,
    },
    #[error("this submit stream already has {limit} unanswered tasks; try again later")]
    StreamFull { limit: usize },
    #[error("broker is shutting down and takes no new tasks")]
    ShuttingDown,
    #[error("deadline had already passed when the task reached the broker")]
    DeadlineOnArrival,
    #[error("task {task} expired after {waited:?} in the queue; it was never dispatched")]
    Expired { task: u64, waited: Duration },
    #[error(
        "task {task} passed its deadline while worker {worker:?} held it (delivery {delivery})"
    )]
    ExpiredInFlight {
        task: u64,
        worker: String,
        delivery: u32,
    },
    #[error(
        "task {task} shed after {waited:?} in the queue: the topic's queue has not been empty for {interval:?}, so its adaptive discipline sheds waits over {target:?}",
        interval = crate::discipline::ADAPTIVE_INTERVAL,
        target = crate::discipline::ADAPTIVE_TARGET
    )]
    Shed { task: u64, waited: Duration },
    #[error("task {task} lost its worker {deliveries} times (max_deliveries reached); giving up")]
    Lost { task: u64, deliveries: u32 },
    #[error("broker shut down before task {task} was answered")]
    Unanswered { task: u64 },
    #[error("{message}")]
    Worker { code: Code, message: String },
    #[error(
        "worker {worker:?} answered task {task} with {len} bytes, over the broker's limit of {limit} bytes"
    )]
    ResultTooLarge {
        task: u64,
        worker: String,
        len: usize,
        limit: usize,
    },
    #[error("{0}")]
    Protocol(String),
    #[error(
        "task {task} is not held by this stream (already answered, or redelivered after a disconnect); result ignored"
    )]
    NotHeld { task: u64 },
    #[error("task {task} was never issued by this broker; result ignored")]
    NeverIssued { task: u64 },
}

impl From<TaskError> for Status {
    fn from(err: TaskError) -> Self {
        let code = match &err {
            TaskError::UnknownTopic { .. } | TaskError::NotHeld { .. } => Code::NotFound,
            TaskError::PayloadTooLarge { .. }
            | TaskError::Protocol(_)
            | TaskError::NeverIssued { .. } => Code::InvalidArgument,
            TaskError::Full { .. }
            | TaskError::FullBytes { .. }
            | TaskError::StreamFull { .. }
            | TaskError::Shed { .. } => Code::ResourceExhausted,
            TaskError::ShuttingDown | TaskError::Unanswered { .. } => Code::Unavailable,
            TaskError::DeadlineOnArrival
            | TaskError::Expired { .. }
            | TaskError::ExpiredInFlight { .. } => Code::DeadlineExceeded,
            TaskError::Lost { .. } => Code::Aborted,
            TaskError::Worker { code, .. } => *code,
            TaskError::ResultTooLarge { .. } => Code::Internal,
        };
        Status::new(code, err.to_string())
    }
}
