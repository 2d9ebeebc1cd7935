//! tailmesh's own broker as a pull backend: its producer is
//! [`BrokerClient`] (one SubmitStream per client), its worker session one
//! Work stream (`worker`), and its statistics the broker's Stats call; the
//! broker itself (`server`, `queue`) keeps the deadlines, credits and
//! redeliveries that the external brokers' workers keep by headers.
//!
//! [`run_worker`] and [`run_worker_releasing`] are its worker, for callers
//! that serve only tailmesh's broker.

use std::{collections::HashMap, future::Future};

use futures::{FutureExt, future::BoxFuture};
use tailmesh_proto::pb;
use tonic::Status;

use super::{
    client::{BrokerClient, endpoint},
    error::BrokerError,
    pull::{
        BackendError, BrokerAt, PullBackend, Release, SessionEnd, Shutdown, TaskHandler,
        WorkerSpec, serve, task_handler,
    },
    wire::Deadline,
    worker::{self, KEEPALIVE_TIMEOUT, WorkerOptions},
};
use crate::{addr::PeerAddr, link::LinkCounts, model::QueueBounds};

/// tailmesh's broker at one address: a producer's client, and how its
/// workers hold their streams.
#[derive(Debug)]
pub(crate) struct TailmeshBackend {
    at: BrokerAt,
    client: BrokerClient,
    /// The workers' keepalive ([`WorkerOptions::ping_after`]).
    options: WorkerOptions,
}

impl TailmeshBackend {
    /// The broker at `addr`, its producer's client `client`.
    pub(crate) fn new(addr: &PeerAddr, client: BrokerClient) -> Self {
        Self::with_options(addr, client, WorkerOptions::credits(1))
    }

    fn with_options(addr: &PeerAddr, client: BrokerClient, options: WorkerOptions) -> Self {
        TailmeshBackend {
            at: BrokerAt {
                name: "tailmesh broker",
                addr: addr.clone(),
            },
            client,
            options,
        }
    }

    /// The broker at `addr` for a worker held with `options`.
    pub(crate) fn worker(addr: &PeerAddr, options: WorkerOptions) -> Self {
        Self::with_options(addr, BrokerClient::connect_lazy(addr.clone()), options)
    }
}

impl PullBackend for TailmeshBackend {
    fn at(&self) -> &BrokerAt {
        &self.at
    }

    fn submit<'a>(
        &'a self,
        topic: &'a str,
        payload: Vec<u8>,
        headers: HashMap<String, String>,
        deadline: Option<Deadline>,
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>> {
        async move {
            self.client
                .submit_by(topic, payload, headers, deadline)
                .await
                .map(|reply| reply.payload)
                .map_err(BackendError::Answered)
        }
        .boxed()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.client.clone().close().boxed()
    }

    fn link_counts(&self) -> Option<LinkCounts> {
        Some(self.client.link_counts())
    }

    fn session<'a>(
        &'a self,
        spec: &'a WorkerSpec,
        handler: TaskHandler,
        shutdown: Shutdown,
    ) -> BoxFuture<'a, SessionEnd> {
        let endpoint = endpoint(&self.at.addr)
            .http2_keep_alive_interval(self.options.ping_after)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let hello = pb::Hello {
            topic: spec.topic.clone(),
            worker: spec.worker.clone(),
            credits: spec.credits,
        };
        async move { worker::session(&self.at, &endpoint, hello, handler, shutdown).await }.boxed()
    }

    fn stats<'a>(
        &'a self,
        _topics: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<pb::TopicStats>, BackendError>> {
        async move {
            let mut client = BrokerClient::connect(self.at.addr.clone())
                .await
                .map_err(|e| BackendError::unavailable(&self.at, "connect", e))?;
            client.stats(None).await.map_err(BackendError::Answered)
        }
        .boxed()
    }
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
    let addr = addr.into();
    let spec = WorkerSpec {
        // tailmesh's broker bounds its queues by its own arguments.
        bounds: QueueBounds::default(),
        topic,
        worker,
        credits: options.credits.max(1),
    };
    let backend = TailmeshBackend::worker(&addr, options);
    serve(&backend, spec, task_handler(handler), shutdown).await
}
