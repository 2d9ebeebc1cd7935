//! The contract every pull backend keeps (tailmesh's broker, NATS
//! JetStream, RabbitMQ), between the [`wire`](super::wire) format below and
//! the dispatcher (`backend`) above: [`PullBackend`], the operations a pull
//! hop needs from a broker; [`BackendError`], what goes wrong in them,
//! keeping the broker client's own error as its source and mapped to a gRPC
//! status in one place; and [`serve`], the worker loop that runs a
//! backend's sessions until shutdown, reconnecting after a lost one.

use std::{error::Error, fmt, future::Future, pin::pin, sync::Arc, time::Duration};

use futures::future::BoxFuture;
use tailmesh_proto::pb;
use tokio::sync::watch;
use tonic::{Code, Status};

use super::error::BrokerError;
use crate::{addr::PeerAddr, link::LinkCounts, model::QueueBounds};

use super::wire::{Deadline, REPLY_SLACK};

/// What a pull hop needs from a broker, whichever it is: produce a task and
/// await its reply; run a worker session that takes tasks as it has credit
/// and returns their results; read the broker's per-topic statistics.
///
/// A backend is a handle on one broker (address, queue bounds, and the
/// producer's connection, opened on first use and shared by its clones);
/// each worker session opens a connection of its own.
pub(crate) trait PullBackend: fmt::Debug + Send + Sync + 'static {
    /// Which broker, where: names it in errors and logs.
    fn at(&self) -> &BrokerAt;

    /// Submits `payload` to `topic`, traced under `trace` when there is
    /// one, and waits for the worker's reply
    /// payload, at most `deadline` (see [`wire::Deadline`]) plus
    /// [`wire::REPLY_SLACK`](super::wire::REPLY_SLACK).
    ///
    /// [`wire::Deadline`]: super::wire::Deadline
    fn submit<'a>(
        &'a self,
        topic: &'a str,
        payload: Vec<u8>,
        trace: Option<crate::telemetry::SpanContext>,
        deadline: Option<Deadline>,
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>>;

    /// Closes the producer's connection, if it opened one, and waits for
    /// the close to be done; a submit still waiting on it fails.
    fn close(&self) -> BoxFuture<'_, ()>;

    /// What happened to the producer's connection so far, where the
    /// backend's client tells it (tailmesh's broker).
    fn link_counts(&self) -> Option<LinkCounts> {
        None
    }

    /// One worker session: connects, then takes tasks for `spec.topic`
    /// with `spec.credits` credits, answers each with `handler`, until the
    /// connection is lost or `shutdown` fires (then it finishes and
    /// answers the tasks it holds).
    fn session<'a>(
        &'a self,
        spec: &'a WorkerSpec,
        handler: TaskHandler,
        shutdown: Shutdown,
    ) -> BoxFuture<'a, SessionEnd>;

    /// Per-topic statistics in tailmesh's broker's terms, as far as the
    /// broker tells them.
    fn stats<'a>(
        &'a self,
        topics: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<pb::TopicStats>, BackendError>>;
}

/// Which broker, where: "NATS 127.0.0.1:4222".
#[derive(Clone, Debug)]
pub(crate) struct BrokerAt {
    /// The broker's name for people ("tailmesh's broker", "NATS").
    pub(crate) name: &'static str,
    pub(crate) addr: PeerAddr,
}

impl fmt::Display for BrokerAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.addr)
    }
}

/// A broker client's own error (async-nats's, lapin's, tonic's), kept as
/// the source.
pub(crate) type Source = Box<dyn Error + Send + Sync>;

/// What went wrong talking to a pull backend. Each keeps what it can of
/// the cause; `From<BackendError> for Status` is the one mapping to the
/// answer a caller reads.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackendError {
    /// An operation on the broker failed (connect, subscribe, declare,
    /// publish, a pull request): worth another try later.
    #[error("{at}: {what}")]
    Unavailable {
        at: BrokerAt,
        /// The operation, as "publish to \"b\"".
        what: String,
        #[source]
        source: Source,
    },
    /// Something the producer or the worker relies on ended under it (the
    /// reply subscription, the consumer).
    #[error("{at}: {what} ended")]
    Ended { at: BrokerAt, what: &'static str },
    /// The topic's queue refused the task: it holds its bounds already.
    #[error(
        "topic {topic:?} is full ({} tasks or {} bytes queued in {at}); try again later",
        bounds.capacity,
        bounds.bytes
    )]
    Full {
        at: BrokerAt,
        topic: String,
        bounds: QueueBounds,
    },
    /// The topic's queue exists with other bounds than this producer or
    /// worker asks for; it is not changed under those that made it.
    #[error(
        "{at}: {queue} exists with other bounds than {} tasks, {} bytes",
        bounds.capacity,
        bounds.bytes
    )]
    OtherBounds {
        at: BrokerAt,
        /// The stream or queue, by its name on the broker, and what it
        /// holds instead where the broker says.
        queue: String,
        bounds: QueueBounds,
        #[source]
        source: Option<Source>,
    },
    /// No reply came within the task's deadline (and the slack).
    #[error("no reply from hop {topic:?} through {at} within its deadline ({deadline:?})")]
    NoReply {
        at: BrokerAt,
        topic: String,
        deadline: Duration,
    },
    /// The broker or the worker answered with this status (tailmesh's
    /// broker's refusals, a worker's error): passed on as it is.
    #[error("{}", .0.message())]
    Answered(Status),
    /// A pull request ended in a way the worker's count of requested tasks
    /// cannot follow, so its credit would no longer be exact.
    #[error(
        "{at}: pull request ended: {status} {description} ({unsent:?} of {requested} requested \
         tasks unsent)"
    )]
    PullEnded {
        at: BrokerAt,
        status: async_nats::StatusCode,
        description: String,
        unsent: Option<usize>,
        requested: usize,
    },
    /// A worker with open pull requests heard nothing (neither a task nor a
    /// heartbeat) for this long: the server forgot them.
    #[error("{at}: no task or heartbeat for {silence:?} with {requested} tasks requested")]
    Silent {
        at: BrokerAt,
        silence: Duration,
        requested: usize,
    },
    /// The worker session's own task failed (a panic).
    #[error("{at}: the worker session's task failed")]
    Task {
        at: BrokerAt,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl BackendError {
    /// An operation on the broker at `at` failed with `source`.
    pub(crate) fn unavailable(
        at: &BrokerAt,
        what: impl Into<String>,
        source: impl Into<Source>,
    ) -> Self {
        BackendError::Unavailable {
            at: at.clone(),
            what: what.into(),
            source: source.into(),
        }
    }

    /// The error and its sources, "a: b: c", for a status message or a log.
    pub(crate) fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = self.source();
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }
}

impl From<BackendError> for Status {
    fn from(err: BackendError) -> Self {
        let code = match &err {
            BackendError::Answered(status) => return status.clone(),
            BackendError::Full { .. } => Code::ResourceExhausted,
            BackendError::OtherBounds { .. } => Code::FailedPrecondition,
            BackendError::NoReply { .. } => Code::DeadlineExceeded,
            BackendError::Unavailable { .. }
            | BackendError::Ended { .. }
            | BackendError::PullEnded { .. }
            | BackendError::Silent { .. } => Code::Unavailable,
            BackendError::Task { .. } => Code::Internal,
        };
        Status::new(code, err.chain())
    }
}

/// Awaits an external broker's reply `wait` for at most the task's
/// `deadline` plus [`REPLY_SLACK`]; past it the producer gives up with
/// [`BackendError::NoReply`].
pub(crate) async fn reply_within(
    at: &BrokerAt,
    topic: &str,
    deadline: Option<Deadline>,
    wait: impl Future<Output = Result<Vec<u8>, BackendError>>,
) -> Result<Vec<u8>, BackendError> {
    let Some(Deadline { left, .. }) = deadline else {
        return wait.await;
    };
    tokio::time::timeout(left + REPLY_SLACK, wait)
        .await
        .unwrap_or_else(|_| {
            Err(BackendError::NoReply {
                at: at.clone(),
                topic: topic.to_owned(),
                deadline: left,
            })
        })
}

/// Lets a handler give its credit back before its result is ready: once it
/// has done its own work and only waits on others (a hop waiting on its
/// downstream hops), the worker can take its next task. Dropping it
/// without calling [`Release::release`] keeps the credit until the result.
pub struct Release(Box<dyn FnOnce() + Send>);

impl Release {
    /// A release that runs `free`, whatever frees the credit at the
    /// worker's broker.
    pub(crate) fn callback(free: impl FnOnce() + Send + 'static) -> Self {
        Release(Box::new(free))
    }

    /// Returns the task's credit to the broker now.
    pub fn release(self) {
        (self.0)()
    }
}

/// A worker's handler as every backend's session runs it: the task and its
/// [`Release`] in, the reply payload or the status to answer out.
pub(crate) type TaskHandler =
    Arc<dyn Fn(pb::Task, Release) -> BoxFuture<'static, Result<Vec<u8>, Status>> + Send + Sync>;

/// `handler` as a [`TaskHandler`].
pub(crate) fn task_handler<H, F>(handler: H) -> TaskHandler
where
    H: Fn(pb::Task, Release) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Vec<u8>, Status>> + Send + 'static,
{
    Arc::new(move |task, release| Box::pin(handler(task, release)))
}

/// What a worker serves, as plain data: each session gets it.
#[derive(Clone, Debug)]
pub(crate) struct WorkerSpec {
    /// Its queue's bounds, which an external broker's worker declares it
    /// with.
    pub(crate) bounds: QueueBounds,
    pub(crate) topic: String,
    /// The worker's name, in logs (and RabbitMQ's consumer tag).
    pub(crate) worker: String,
    /// Tasks the worker holds at once, at least 1.
    pub(crate) credits: u32,
}

/// Shutdown as a worker session sees it: a cheap clone of one signal, so
/// each session (and each of its waits) can watch it.
#[derive(Clone, Debug)]
pub(crate) struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Resolves once shutdown came (or whoever could signal it is gone).
    pub(crate) async fn fired(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// How one worker session ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// Shutdown came; the tasks the worker held were finished and answered.
    ShutDown,
    /// The worker was connected, then lost its stream or consumer: why.
    Lost(BackendError),
    /// The worker could not connect: why.
    Unreachable(BackendError),
    /// The broker refused the worker for a reason no retry can fix (an
    /// unknown topic, a malformed Hello).
    Refused(Status),
}

/// The first wait before a worker reconnects; it doubles per failed
/// attempt up to [`BACKOFF_MAX`], and starts again after a session that
/// connected.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest wait before a worker reconnects.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Runs a worker on `backend` until `shutdown`: each session connects and
/// serves `spec` until it ends; a lost or failed session is logged and run
/// again after a backoff. Only shutdown ends the worker, or a refusal no
/// retry can fix. At shutdown a connected session finishes and answers
/// the tasks it holds before this returns.
pub(crate) async fn serve(
    backend: &dyn PullBackend,
    spec: WorkerSpec,
    handler: TaskHandler,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BrokerError> {
    let (stop, stopping) = watch::channel(false);
    let sessions = async {
        let (topic, worker) = (&spec.topic, &spec.worker);
        let at = backend.at();
        let mut backoff = BACKOFF_MIN;
        loop {
            let session = backend.session(&spec, handler.clone(), Shutdown(stopping.clone()));
            match session.await {
                SessionEnd::ShutDown => return Ok(()),
                SessionEnd::Refused(status) => {
                    return Err(BrokerError::WorkerRefused {
                        addr: at.addr.clone(),
                        topic: topic.clone(),
                        worker: worker.clone(),
                        status,
                    });
                }
                SessionEnd::Lost(why) => {
                    backoff = BACKOFF_MIN;
                    let why = why.chain();
                    tracing::warn!(broker = %at, %topic, %worker, %why, retry_in = ?backoff, "worker lost its stream or consumer");
                }
                SessionEnd::Unreachable(why) => {
                    let why = why.chain();
                    tracing::warn!(broker = %at, %topic, %worker, reason = %why, retry_in = ?backoff, "worker cannot connect");
                }
            }
            let mut shutdown = Shutdown(stopping.clone());
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shutdown.fired() => return Ok(()),
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    };
    // The caller's shutdown becomes a signal every session can watch, and
    // the sessions run on until the one it reaches has drained.
    let mut sessions = pin!(sessions);
    tokio::select! {
        ended = &mut sessions => return ended,
        () = shutdown => {}
    }
    let _ = stop.send(true);
    sessions.await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> BrokerAt {
        BrokerAt {
            name: "NATS",
            addr: PeerAddr::from(std::net::SocketAddr::from(([127, 0, 0, 1], 4222))),
        }
    }

    #[test]
    fn each_error_maps_to_its_status_once_with_its_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let status = Status::from(BackendError::unavailable(&at(), "connect", io));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "NATS 127.0.0.1:4222: connect: refused");
        let full = Status::from(BackendError::Full {
            at: at(),
            topic: "b".into(),
            bounds: QueueBounds::default(),
        });
        assert_eq!(full.code(), Code::ResourceExhausted);
        assert!(full.message().contains("is full"), "{full:?}");
        let answered = Status::from(BackendError::Answered(Status::aborted("lost")));
        assert_eq!(
            (answered.code(), answered.message()),
            (Code::Aborted, "lost")
        );
        let late = Status::from(BackendError::NoReply {
            at: at(),
            topic: "b".into(),
            deadline: Duration::from_millis(5),
        });
        assert_eq!(late.code(), Code::DeadlineExceeded);
        let other = Status::from(BackendError::OtherBounds {
            at: at(),
            queue: "tm_b".into(),
            bounds: QueueBounds::default(),
            source: None,
        });
        assert_eq!(other.code(), Code::FailedPrecondition);
        assert!(other.message().contains("tm_b"), "{other:?}");
    }
}
