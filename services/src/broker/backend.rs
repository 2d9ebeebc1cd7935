//! The pull backends side by side: tailmesh's own broker, RabbitMQ and NATS
//! JetStream, behind one producer type ([`Producer`]) and one worker entry
//! point ([`run_backend_worker`]), so a hop's caller and worker code is
//! written once.
//!
//! The external brokers carry what tailmesh's broker keeps in its task
//! message in headers instead: W3C trace context, the absolute deadline
//! ([`DEADLINE_HEADER`]), the enqueue time ([`ENQUEUED_HEADER`]) and, on
//! replies, the gRPC code and message ([`CODE_HEADER`], [`MESSAGE_HEADER`]).
//! Their workers hand the hop the same [`pb::Task`] the tailmesh worker
//! does, so the hop's handler does not know which broker it serves.

use std::{
    collections::HashMap,
    future::Future,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::future::{FutureExt, Shared};
use tailmesh_proto::pb;
use tonic::{Code, Status};

use super::{
    BrokerClient, BrokerError, Release, WorkerOptions, nats, rabbitmq, run_worker_releasing,
};
use crate::{
    addr::PeerAddr,
    model::{BrokerKind, QueueBounds},
    telemetry,
};

/// Header: the task's absolute deadline, Unix nanoseconds (absent: none).
pub const DEADLINE_HEADER: &str = "tm-deadline";
/// Header: when the producer enqueued the task, Unix nanoseconds.
pub const ENQUEUED_HEADER: &str = "tm-enqueued";
/// Reply header: the gRPC code of the worker's answer (absent: OK).
pub const CODE_HEADER: &str = "tm-code";
/// Reply header: the status message of an error answer.
pub const MESSAGE_HEADER: &str = "tm-message";
/// Deliveries a task may have (the first and redeliveries after a lost
/// worker), as tailmesh's broker's default.
pub const MAX_DELIVERIES: u32 = 3;
/// How long a worker may hold a task without a sign of life before the
/// broker (JetStream) gives it to another worker; workers signal progress
/// at a third of it.
pub const ACK_WAIT: Duration = Duration::from_secs(2);
/// Extra time a producer waits for the reply beyond the task's deadline.
pub(crate) const REPLY_SLACK: Duration = Duration::from_millis(20);

/// Unix nanoseconds now.
pub(crate) fn unix_nanos() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_nanos()).unwrap_or(u64::MAX)
}

/// The absolute deadline of a task with `deadline` left, Unix nanoseconds.
pub(crate) fn deadline_nanos(deadline: Option<Duration>) -> u64 {
    deadline.map_or(0, |d| {
        unix_nanos().saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    })
}

/// The headers an external broker's task carries: the caller's (trace
/// context) plus deadline and enqueue time.
pub(crate) fn task_headers(
    mut headers: HashMap<String, String>,
    deadline_unix_nanos: u64,
) -> HashMap<String, String> {
    if deadline_unix_nanos > 0 {
        headers.insert(DEADLINE_HEADER.into(), deadline_unix_nanos.to_string());
    }
    headers.insert(ENQUEUED_HEADER.into(), unix_nanos().to_string());
    headers
}

/// A number header, 0 when absent or unreadable.
pub(crate) fn number(headers: &HashMap<String, String>, key: &str) -> u64 {
    headers
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// The task a worker of an external broker hands its handler. Its queue
/// wait runs from `enqueued_unix_nanos` (the broker's own time where it
/// records one) to now; when the task is traced, a "queue wait <topic>"
/// span covering it goes between the caller's span and the worker's, as
/// tailmesh's broker records one.
pub(crate) fn task_of(
    topic: &str,
    task_id: u64,
    payload: Vec<u8>,
    mut headers: HashMap<String, String>,
    enqueued_unix_nanos: u64,
    delivery: u32,
) -> pb::Task {
    let now = unix_nanos();
    let queue_wait_ns = now.saturating_sub(enqueued_unix_nanos);
    let parent = telemetry::extract_headers(&headers);
    // The worker's process is the hop's replica: its hop, transport and
    // variant are its resource.
    let cx = telemetry::past_span(
        || format!("queue wait {topic}").into(),
        UNIX_EPOCH + Duration::from_nanos(enqueued_unix_nanos.min(now)),
        telemetry::SpanFields {
            queue_wait_ns: Some(queue_wait_ns),
            ..telemetry::SpanFields::default()
        },
        parent,
    );
    telemetry::inject_headers(&cx, &mut headers);
    pb::Task {
        task_id,
        payload,
        deadline_unix_nanos: number(&headers, DEADLINE_HEADER),
        headers,
        queue_wait_ns,
        delivery,
    }
}

/// Whether a task's deadline (Unix nanoseconds, 0 = none) has passed.
pub(crate) fn expired(deadline_unix_nanos: u64) -> bool {
    deadline_unix_nanos > 0 && unix_nanos() >= deadline_unix_nanos
}

/// The reply headers of a worker's answer.
pub(crate) fn reply_headers(outcome: &Result<Vec<u8>, Status>) -> Vec<(&'static str, String)> {
    match outcome {
        Ok(_) => Vec::new(),
        Err(status) => vec![
            (CODE_HEADER, (status.code() as i32).to_string()),
            (MESSAGE_HEADER, status.message().to_owned()),
        ],
    }
}

/// A reply read back from its headers and payload.
pub(crate) fn reply_of(
    code: Option<&str>,
    message: Option<&str>,
    payload: Vec<u8>,
) -> Result<Vec<u8>, Status> {
    match code.and_then(|c| c.parse::<i32>().ok()).map(Code::from) {
        None | Some(Code::Ok) => Ok(payload),
        Some(code) => Err(Status::new(code, message.unwrap_or_default().to_owned())),
    }
}

/// The producer side of a pull hop, whichever broker it goes through: a
/// cheap `Clone` sharing one connection.
#[derive(Clone, Debug)]
pub enum Producer {
    /// tailmesh's broker.
    Tailmesh(BrokerClient),
    /// NATS JetStream.
    Nats(nats::NatsProducer),
    Rabbitmq(rabbitmq::RabbitProducer),
}

impl Producer {
    /// What happened to the connection to tailmesh's broker so far; `None`
    /// for RabbitMQ and NATS, whose clients keep their connections to
    /// themselves.
    pub fn link_counts(&self) -> Option<crate::link::LinkCounts> {
        match self {
            Producer::Tailmesh(client) => Some(client.link_counts()),
            Producer::Nats(_) | Producer::Rabbitmq(_) => None,
        }
    }

    /// A producer for the `kind` broker at `addr`, connecting on first use.
    /// An external broker's queue is declared with `bounds` by whichever of
    /// its producers and workers comes first (tailmesh's broker has its
    /// own, from its arguments).
    pub fn connect_lazy(kind: BrokerKind, addr: &PeerAddr, bounds: QueueBounds) -> Self {
        match kind {
            BrokerKind::Tailmesh => Producer::Tailmesh(BrokerClient::connect_lazy(addr)),
            BrokerKind::Nats => Producer::Nats(nats::NatsProducer::new(addr.clone(), bounds)),
            BrokerKind::Rabbitmq => {
                Producer::Rabbitmq(rabbitmq::RabbitProducer::new(addr.clone(), bounds))
            }
        }
    }

    /// A producer for one call, connecting on first use, to be
    /// [`close`](Producer::close)d after it: tailmesh's broker's client
    /// counts its connection in `events`; RabbitMQ's asks for a 1 s
    /// heartbeat ([`rabbitmq::PER_CALL_HEARTBEAT`]), so a connection whose
    /// close is lost does not linger.
    pub fn per_call(
        kind: BrokerKind,
        addr: &PeerAddr,
        bounds: QueueBounds,
        events: &std::sync::Arc<crate::link::LinkEvents>,
    ) -> Self {
        match kind {
            BrokerKind::Tailmesh => {
                Producer::Tailmesh(BrokerClient::connect_lazy_counted(addr, events))
            }
            BrokerKind::Nats => Producer::Nats(nats::NatsProducer::new(addr.clone(), bounds)),
            BrokerKind::Rabbitmq => Producer::Rabbitmq(
                rabbitmq::RabbitProducer::new(addr.clone(), bounds)
                    .with_heartbeat(rabbitmq::PER_CALL_HEARTBEAT),
            ),
        }
    }

    /// Closes the producer's connection to the broker (if it opened one)
    /// and waits for the close to be done: a submit still waiting on it,
    /// through a clone, fails UNAVAILABLE. Dropping every clone closes it
    /// too, later.
    pub async fn close(self) {
        match self {
            Producer::Tailmesh(client) => client.close().await,
            Producer::Nats(p) => p.close().await,
            Producer::Rabbitmq(p) => p.close().await,
        }
    }

    /// Submits `payload` to `topic` and waits for the worker's reply
    /// payload. `deadline` is the time the caller still waits: past it the
    /// answer is DEADLINE_EXCEEDED, and a full queue answers
    /// RESOURCE_EXHAUSTED, whichever the broker.
    pub async fn submit(
        &self,
        topic: &str,
        payload: Vec<u8>,
        headers: HashMap<String, String>,
        deadline: Option<Duration>,
    ) -> Result<Vec<u8>, Status> {
        match self {
            Producer::Tailmesh(client) => client
                .clone()
                .submit(topic, payload, headers, deadline)
                .await
                .map(|reply| reply.payload),
            Producer::Nats(p) => p.submit(topic, payload, headers, deadline).await,
            Producer::Rabbitmq(p) => p.submit(topic, payload, headers, deadline).await,
        }
    }
}

/// Runs a worker for `topic` on the `kind` broker at `addr` until
/// `shutdown`, at most `options.credits` tasks at once, each answered by
/// `handler` (see [`run_worker_releasing`] for tailmesh's broker; the
/// external brokers' workers behave alike: a task whose deadline passed
/// before it reached the worker is dropped unprocessed, a handler running
/// past it is answered DEADLINE_EXCEEDED). A handler's [`Release`] frees
/// its credit, so the worker takes its next task while this one waits on
/// downstream hops; the external brokers' workers acknowledge a task only
/// after its reply is sent, so a worker lost at any point (even after the
/// release) leaves its tasks to be delivered again, as tailmesh's broker
/// does. An external broker's queue is declared with `bounds` (see
/// [`Producer::connect_lazy`]).
#[allow(clippy::too_many_arguments)]
pub async fn run_backend_worker<H, F>(
    kind: BrokerKind,
    addr: PeerAddr,
    bounds: QueueBounds,
    topic: String,
    worker: String,
    options: WorkerOptions,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BrokerError>
where
    H: Fn(pb::Task, Release) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Vec<u8>, Status>> + Send + 'static,
{
    let spec = WorkerSpec {
        addr,
        bounds,
        topic,
        worker,
        credits: options.credits.max(1),
    };
    match kind {
        BrokerKind::Tailmesh => {
            run_worker_releasing(
                spec.addr,
                spec.topic,
                spec.worker,
                options,
                handler,
                shutdown,
            )
            .await
        }
        BrokerKind::Nats => {
            reconnecting("NATS", spec, shutdown, |spec, shutdown| {
                nats::session(spec, handler.clone(), shutdown)
            })
            .await
        }
        BrokerKind::Rabbitmq => {
            reconnecting("RabbitMQ", spec, shutdown, |spec, shutdown| {
                rabbitmq::session(spec, handler.clone(), shutdown)
            })
            .await
        }
    }
}

/// What an external broker's worker serves, as plain data: each session
/// of [`reconnecting`] gets its own copy.
#[derive(Clone, Debug)]
pub(crate) struct WorkerSpec {
    pub(crate) addr: PeerAddr,
    /// Its queue's bounds, which the worker declares it with.
    pub(crate) bounds: QueueBounds,
    pub(crate) topic: String,
    /// The worker's name, in logs (and RabbitMQ's consumer tag).
    pub(crate) worker: String,
    /// Tasks the worker holds at once, at least 1.
    pub(crate) credits: u32,
}

/// How one session of an external broker's worker ended.
pub(crate) enum SessionEnd {
    /// Shutdown came; the tasks the worker held were finished and answered.
    ShutDown,
    /// The worker was connected, then lost its consumer: why.
    Lost(String),
    /// The worker could not connect: why.
    Unreachable(String),
}

/// The first wait before a worker reconnects; it doubles per failed
/// attempt up to [`BACKOFF_MAX`], and starts again after a session that
/// connected.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest wait before a worker reconnects.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Runs an external broker's worker: `session` connects and serves `spec`
/// until it ends; a lost or failed session is logged and run again after a
/// backoff; only shutdown ends the worker. Each session is handed the
/// shutdown future (shared), to stop connecting or serving when it fires.
async fn reconnecting<Sh, S, F>(
    broker: &str,
    spec: WorkerSpec,
    shutdown: Sh,
    mut session: S,
) -> Result<(), BrokerError>
where
    Sh: Future<Output = ()>,
    S: FnMut(WorkerSpec, Shared<Sh>) -> F,
    F: Future<Output = SessionEnd>,
{
    let (addr, topic, worker) = (&spec.addr, &spec.topic, &spec.worker);
    let mut shutdown = shutdown.shared();
    let mut backoff = BACKOFF_MIN;
    loop {
        match session(spec.clone(), shutdown.clone()).await {
            SessionEnd::ShutDown => return Ok(()),
            SessionEnd::Lost(why) => {
                backoff = BACKOFF_MIN;
                tracing::warn!(%addr, %topic, %worker, %why, retry_in = ?backoff, "{broker} worker lost its consumer");
            }
            SessionEnd::Unreachable(why) => {
                tracing::warn!(%addr, %topic, %worker, reason = %why, retry_in = ?backoff, "{broker} worker cannot connect");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = &mut shutdown => return Ok(()),
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Runs `work` until the wall-clock deadline (Unix nanoseconds, 0 = none).
pub(crate) async fn within_deadline<F>(work: F, deadline_unix_nanos: u64) -> Result<Vec<u8>, Status>
where
    F: Future<Output = Result<Vec<u8>, Status>>,
{
    if deadline_unix_nanos == 0 {
        return work.await;
    }
    let remaining = Duration::from_nanos(deadline_unix_nanos.saturating_sub(unix_nanos()));
    tokio::time::timeout(remaining, work)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(
                "the worker's handler ran past the task's deadline",
            ))
        })
}

/// Per-topic statistics of the `kind` broker at `addr`, in tailmesh's
/// broker's terms: what the broker itself reports (NATS JetStream: stream
/// and consumer state; RabbitMQ: queue depth and consumers), the rest left
/// zero (queue waits are measured by the workers and travel in the reply
/// paths). RabbitMQ's queues are declared to read them, with `bounds`.
pub async fn stats(
    kind: BrokerKind,
    addr: &PeerAddr,
    bounds: QueueBounds,
    topics: &[String],
) -> Result<Vec<pb::TopicStats>, Status> {
    match kind {
        BrokerKind::Tailmesh => {
            let mut client = BrokerClient::connect(addr)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            client.stats(None).await
        }
        BrokerKind::Nats => nats::stats(addr, topics).await,
        BrokerKind::Rabbitmq => rabbitmq::stats(addr, bounds, topics).await,
    }
}
