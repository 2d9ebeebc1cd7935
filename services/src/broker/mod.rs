//! The pull broker: producers submit a task to a topic and wait for its
//! result on the same call; workers hold one bidirectional stream, take
//! tasks when they have credit, and send results back on it.
//!
//! Semantics (each covered by `services/tests/it/broker.rs`):
//! - **A discipline per topic, credit-based dispatch.** Each topic serves its
//!   queue in its [`Discipline`]: `fifo`
//!   (the default), `lifo`, or `adaptive` (FIFO until the queue stands,
//!   then newest first, shedding waits over the target with
//!   RESOURCE_EXHAUSTED, counted in `shed`). A task goes to a worker only
//!   while that worker has credit. Hello grants the first credits, every
//!   result for a task the stream holds returns one credit implicitly,
//!   `Credit` grants more, `Drain` takes them all back. With one credit (the
//!   default) a worker takes a task only when free, as in back-to-back, but
//!   is woken by the broker the moment work arrives: no polling.
//! - **Bounded, in tasks and in bytes.** At most `queue_capacity` tasks and
//!   `queue_bytes` payload bytes wait per topic; a submit past either limit
//!   is answered RESOURCE_EXHAUSTED at once and counted in `rejected_full`.
//!   A task's bytes are released as soon as it leaves the queue
//!   (dispatched, expired, given up). Tasks put back after a worker loss
//!   may briefly exceed both by what workers held.
//! - **Deadlines.** A task carries the earlier of its absolute deadline and
//!   the call's grpc-timeout. Past it, the producer gets DEADLINE_EXCEEDED.
//!   Dispatch checks it too: a task whose deadline passed while it was
//!   queued is answered there, counted in `expired` and never dispatched,
//!   so workers' credit goes only to work someone still waits for. The
//!   deadline travels with the task, and the library's worker drops a
//!   handler still running when it passes (`expired_in_flight`).
//! - **Redelivery.** Tasks held by a worker whose stream ends go back to the
//!   head of their queue (oldest first) and are delivered again, up to
//!   `max_deliveries` deliveries; then the producer gets ABORTED ("task 7
//!   lost its worker 3 times").
//! - **Exactly one answer per call.** The first answer wins and removes the
//!   task; a later result (from a stream that no longer holds the task, or
//!   for a task whose producer left) is ignored and counted in
//!   `late_results`.
//! - **Readable refusals.** Unknown topic: NOT_FOUND; oversized payload or
//!   a Work stream not starting with Hello: INVALID_ARGUMENT; a bad message
//!   on an established Work stream is answered with a `Rejected` notice and
//!   the stream carries on.
//! - **One stream per producer.** Besides unary `Submit`, producers send
//!   tasks on a `SubmitStream` under their own ids and get answers in any
//!   order; [`BrokerClient`] uses it. A task there goes through exactly the
//!   path a `Submit` call does, with the same answers.
//! - **Producers may leave.** A dropped call (or a cancelled stream task, or
//!   a broken stream's tasks) removes its queued task, or makes the broker
//!   discard the worker's result; nothing leaks.
//! - **Graceful shutdown**, see [`run`].
//!
//! Layout (the pull backends from the bottom up: `wire`, then `pull`,
//! then the three backends, then `backend`; no module imports one above
//! it):
//! - `queue`: one topic's queue, pending tasks and workers behind one lock.
//! - `server`: the gRPC service and [`run`].
//! - `error`: [`BrokerError`] and the one mapping of refusals to statuses.
//! - `wire`: what a task carries through any broker: headers, task and
//!   reply encoding, its deadline on the wall clock, and the one wait
//!   that holds a worker's handler to it.
//! - `pull`: the contract of a pull backend (the `PullBackend` trait:
//!   submit a task and await its reply, a worker session with credits,
//!   statistics), its typed `BackendError` mapped to a status once, the
//!   [`Release`] of a task's credit, and the worker loop that reconnects.
//! - `client`: [`BrokerClient`], the producer side of tailmesh's broker.
//! - `worker`: a worker session of tailmesh's broker (one Work stream).
//! - `tailmesh`: tailmesh's broker as a pull backend.
//! - `nats`, `rabbitmq`: NATS JetStream and RabbitMQ as pull backends.
//! - `backend`: the dispatcher above them: one producer type, one worker
//!   entry point, one statistics call, whichever the broker.

pub mod backend;
mod client;
mod error;
pub mod nats;
mod pull;
mod queue;
pub mod rabbitmq;
mod server;
mod tailmesh;
mod wire;
mod worker;

use std::{collections::HashMap, time::Duration};

use crate::discipline::Discipline;

pub use backend::{run_worker, run_worker_releasing};
pub use client::BrokerClient;
pub use error::BrokerError;
pub use pull::Release;
pub use server::run;
pub use tailmesh_proto::pb::{SubmitReply, Task, TopicStats};
pub use worker::{KEEPALIVE_INTERVAL, WorkerOptions};

/// What a broker serves, as plain data.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// The topics producers may submit to; anything else is NOT_FOUND.
    pub topics: Vec<String>,
    /// The queue discipline of each topic named here; the others are
    /// [`Discipline::Fifo`].
    pub disciplines: HashMap<String, Discipline>,
    /// Most tasks waiting per topic before submits are refused.
    pub queue_capacity: usize,
    /// Most payload bytes waiting per topic before submits are refused
    /// (held tasks do not count); at least `max_payload_bytes`, so any
    /// accepted payload fits an empty queue. The default, 64 MiB, holds
    /// 16 tasks of the largest payload, or the full `queue_capacity` of
    /// tasks up to 6.5 KiB each, and keeps a topic's queue to a known share
    /// of memory however large the payloads.
    pub queue_bytes: usize,
    /// Deliveries a task may have before a lost worker makes it fail.
    pub max_deliveries: u32,
    /// Largest task or result payload accepted, in bytes.
    pub max_payload_bytes: usize,
    /// How long shutdown waits for queued and held tasks to be answered.
    pub drain_grace: Duration,
    /// How long a client connection may go without a byte read or written
    /// before the broker closes it (see
    /// [`DEFAULT_IDLE_TIMEOUT`](crate::incoming::DEFAULT_IDLE_TIMEOUT);
    /// workers' keepalive pings keep theirs open).
    pub idle_timeout: Duration,
    /// TLS on the listener (`[mesh] tls`); `None`: plaintext.
    pub tls: Option<crate::tls::TlsFiles>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            topics: Vec::new(),
            disciplines: HashMap::new(),
            queue_capacity: crate::model::QueueBounds::DEFAULT_CAPACITY as usize,
            queue_bytes: usize::try_from(crate::model::QueueBounds::DEFAULT_BYTES)
                .unwrap_or(usize::MAX),
            max_deliveries: 3,
            max_payload_bytes: 4 * 1024 * 1024,
            drain_grace: Duration::from_secs(5),
            idle_timeout: crate::incoming::DEFAULT_IDLE_TIMEOUT,
            tls: None,
        }
    }
}
