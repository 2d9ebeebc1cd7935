//! The pull backends side by side: tailmesh's own broker, RabbitMQ and NATS
//! JetStream, behind one producer type ([`Producer`]), one worker entry
//! point ([`run_backend_worker`]) and one statistics call ([`stats`]), so
//! a hop's caller and worker code is written once.
//!
//! This is the dispatcher: it picks the backend for a [`BrokerKind`] once
//! and then uses it only through the `PullBackend` trait (`pull`); what a
//! task carries through an external broker is the `wire` module's.

use std::{future::Future, sync::Arc, time::Duration};

use tailmesh_proto::pb;
use tonic::Status;

use super::{
    BrokerClient, BrokerError, Release, WorkerOptions,
    nats::NatsBackend,
    pull::{PullBackend, WorkerSpec, serve, task_handler},
    rabbitmq::{self, RabbitBackend},
    tailmesh::TailmeshBackend,
    wire::Deadline,
};
use crate::{
    addr::PeerAddr,
    link::{LinkCounts, LinkEvents},
    model::{BrokerKind, QueueBounds},
};

/// The `kind` broker at `addr`, whose queues an external broker declares
/// with `bounds` (tailmesh's broker has its own, from its arguments).
fn backend(kind: BrokerKind, addr: &PeerAddr, bounds: QueueBounds) -> Arc<dyn PullBackend> {
    match kind {
        BrokerKind::Tailmesh => Arc::new(TailmeshBackend::new(
            addr,
            BrokerClient::connect_lazy(addr.clone()),
        )),
        BrokerKind::Nats => Arc::new(NatsBackend::new(addr, bounds)),
        BrokerKind::Rabbitmq => Arc::new(RabbitBackend::new(addr, bounds)),
    }
}

/// The producer side of a pull hop, whichever broker it goes through: a
/// cheap `Clone` sharing one connection.
#[derive(Clone, Debug)]
pub struct Producer {
    backend: Arc<dyn PullBackend>,
}

impl Producer {
    /// What happened to the connection to tailmesh's broker so far; `None`
    /// for RabbitMQ and NATS, whose clients keep their connections to
    /// themselves.
    pub fn link_counts(&self) -> Option<LinkCounts> {
        self.backend.link_counts()
    }

    /// A producer for the `kind` broker at `addr`, connecting on first use.
    /// An external broker's queue is declared with `bounds` by whichever of
    /// its producers and workers comes first (tailmesh's broker has its
    /// own, from its arguments).
    pub fn connect_lazy(kind: BrokerKind, addr: &PeerAddr, bounds: QueueBounds) -> Self {
        Producer {
            backend: backend(kind, addr, bounds),
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
        events: &Arc<LinkEvents>,
    ) -> Self {
        let backend: Arc<dyn PullBackend> = match kind {
            BrokerKind::Tailmesh => Arc::new(TailmeshBackend::new(
                addr,
                BrokerClient::connect_lazy_counted(addr.clone(), events),
            )),
            BrokerKind::Nats => Arc::new(NatsBackend::new(addr, bounds)),
            BrokerKind::Rabbitmq => Arc::new(
                RabbitBackend::new(addr, bounds).with_heartbeat(rabbitmq::PER_CALL_HEARTBEAT),
            ),
        };
        Producer { backend }
    }

    /// Closes the producer's connection to the broker (if it opened one)
    /// and waits for the close to be done: a submit still waiting on it,
    /// through a clone, fails UNAVAILABLE. Dropping every clone closes it
    /// too, later.
    pub async fn close(self) {
        self.backend.close().await;
    }

    /// Submits `payload` to `topic`, traced under `trace` when there is
    /// one, and waits for the worker's reply
    /// payload. `deadline` is the time the caller still waits, counted
    /// from this call: past it the answer is DEADLINE_EXCEEDED, and a full
    /// queue answers RESOURCE_EXHAUSTED, whichever the broker. The
    /// backend's error becomes the status here, and only here.
    pub async fn submit(
        &self,
        topic: &str,
        payload: Vec<u8>,
        trace: Option<crate::telemetry::SpanContext>,
        deadline: Option<Duration>,
    ) -> Result<Vec<u8>, Status> {
        // Read now, before the backend connects or waits for room, so
        // neither lengthens the task's deadline.
        let deadline = Deadline::of(deadline);
        self.backend
            .submit(topic, payload, trace, deadline)
            .await
            .map_err(Status::from)
    }
}

/// Runs a worker for `topic` on the `kind` broker at `addr` until
/// `shutdown`, at most `options.credits` tasks at once, each answered by
/// `handler` (see [`run_worker_releasing`] for
/// tailmesh's broker; the external brokers' workers behave alike: a task
/// whose deadline passed before it reached the worker is dropped
/// unprocessed, a handler running past it is answered DEADLINE_EXCEEDED).
/// A handler's [`Release`] frees its credit, so the worker takes its next
/// task while this one waits on downstream hops; the external brokers'
/// workers acknowledge a task only after its reply is sent, so a worker
/// lost at any point (even after the release) leaves its tasks to be
/// delivered again, as tailmesh's broker does. An external broker's queue
/// is declared with `bounds` (see [`Producer::connect_lazy`]).
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
        bounds,
        topic,
        worker,
        credits: options.credits.max(1),
    };
    let backend: Arc<dyn PullBackend> = match kind {
        BrokerKind::Tailmesh => Arc::new(TailmeshBackend::worker(&addr, options)),
        BrokerKind::Nats | BrokerKind::Rabbitmq => backend(kind, &addr, bounds),
    };
    serve(backend.as_ref(), spec, task_handler(handler), shutdown).await
}

/// Runs a worker for `topic` against the broker at `addr` until `shutdown`
/// resolves.
///
/// The worker says Hello with `credits` (at least 1), so the broker hands
/// it up to `credits` tasks at once; each result it sends returns one
/// credit, so with the default of 1 it takes a task only when free. Every
/// task runs `handler` in its own tokio task (so CPU-bound handlers spread
/// over a multi-thread runtime's threads, and a panic answers INTERNAL
/// instead of killing the worker). A handler still running at the task's
/// deadline is dropped and the task answered DEADLINE_EXCEEDED.
///
/// If the stream breaks, the worker drops its running handlers (the broker
/// redelivers their tasks to other workers) and reconnects with exponential
/// backoff from 10 ms to 1 s. It returns an error only when the broker
/// refuses it for good (an unknown topic: NOT_FOUND, a malformed Hello).
///
/// On `shutdown` it sends Drain (the broker stops sending it tasks),
/// finishes and answers the tasks it holds, closes its stream and returns
/// `Ok(())`; dropping the returned future instead stops at once.
pub async fn run_worker<H, F>(
    addr: impl Into<PeerAddr>,
    topic: String,
    worker: String,
    credits: u32,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BrokerError>
where
    H: Fn(pb::Task) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Vec<u8>, Status>> + Send + 'static,
{
    let handler = move |task, _release: Release| handler(task);
    let options = WorkerOptions::credits(credits);
    run_worker_releasing(addr, topic, worker, options, handler, shutdown).await
}

/// [`run_worker`] for handlers that take a [`Release`] along with each
/// task, to free their credit before they answer, with [`WorkerOptions`].
pub async fn run_worker_releasing<H, F>(
    addr: impl Into<PeerAddr>,
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
    // tailmesh's broker bounds its queues by its own arguments.
    let bounds = QueueBounds::default();
    let kind = BrokerKind::Tailmesh;
    run_backend_worker(
        kind,
        addr.into(),
        bounds,
        topic,
        worker,
        options,
        handler,
        shutdown,
    )
    .await
}

/// Per-topic statistics of the `kind` broker at `addr`, in tailmesh's
/// broker's terms: what the broker itself reports (tailmesh's broker:
/// every topic's counters; NATS JetStream: stream and consumer state;
/// RabbitMQ: queue depth and consumers), the rest left zero (queue waits
/// are measured by the workers and travel in the reply paths). RabbitMQ's
/// queues are declared to read them, with `bounds`.
pub async fn stats(
    kind: BrokerKind,
    addr: &PeerAddr,
    bounds: QueueBounds,
    topics: &[String],
) -> Result<Vec<pb::TopicStats>, Status> {
    backend(kind, addr, bounds)
        .stats(topics)
        .await
        .map_err(Status::from)
}
