//! The worker side: [`run_worker`] holds one Work stream to the broker,
//! runs a handler for each task it receives, and sends the results back.

use std::{
    collections::HashMap,
    future::Future,
    pin::{Pin, pin},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tailmesh_proto::pb::{self, broker_client, broker_message, worker_message};
use tokio::{sync::mpsc, task::JoinSet};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming, transport::Endpoint};

use super::{client::endpoint, error::BrokerError};
use crate::addr::PeerAddr;

/// First and longest wait between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// HTTP/2 pings that notice a broker gone silent (a dead host, a partition)
/// while the worker waits for work, so the stream does not hang forever
/// (the default of [`WorkerOptions::ping_after`]).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a drained worker waits for the broker to close the stream.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

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

/// How a worker holds its stream to the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerOptions {
    /// Tasks it may hold at once (at least 1).
    pub credits: u32,
    /// After this long without a frame from the broker, the worker sends
    /// an HTTP/2 PING (and another each time as long again passes without
    /// one); no answer within 5 s breaks the stream. Default
    /// [`KEEPALIVE_INTERVAL`], which only notices a dead broker.
    ///
    /// Short (a few round trips), it is a loss probe: with one credit the
    /// stream is stop-and-wait, a task out and nothing more until its
    /// result comes back, so a lost task or result is the last segment in
    /// flight and TCP recovers it only by its tail-loss probe or
    /// retransmission timeout, about 200 ms on Linux. A PING sent behind it
    /// carries later data (and draws the broker's PING ACK behind a lost
    /// task), so the receiver's SACK reports the hole at once and the
    /// sender retransmits within a round trip or two.
    pub ping_after: Duration,
}

impl WorkerOptions {
    /// `credits` credits, pings after the default [`KEEPALIVE_INTERVAL`].
    pub fn credits(credits: u32) -> Self {
        WorkerOptions {
            credits,
            ping_after: KEEPALIVE_INTERVAL,
        }
    }
}

/// Lets a handler give its credit back before its result is ready: once it
/// has done its own work and only waits on others (a hop waiting on its
/// downstream hops), the worker can take its next task. Dropping it
/// without calling [`Release::release`] keeps the credit until the result.
pub struct Release(ReleaseTo);

enum ReleaseTo {
    /// tailmesh's broker: a Release message on the Work stream.
    Stream {
        task_id: u64,
        out: mpsc::UnboundedSender<pb::WorkerMessage>,
    },
    /// Another broker's worker: whatever frees the credit there.
    Callback(Box<dyn FnOnce() + Send>),
}

impl Release {
    /// A release that runs `free` (the worker of another broker).
    pub(crate) fn callback(free: impl FnOnce() + Send + 'static) -> Self {
        Release(ReleaseTo::Callback(Box::new(free)))
    }

    /// Returns the task's credit to the broker now.
    pub fn release(self) {
        match self.0 {
            ReleaseTo::Stream { task_id, out } => {
                let release = pb::Release { task_id };
                let _ = out.send(message(worker_message::Kind::Release(release)));
            }
            ReleaseTo::Callback(free) => free(),
        }
    }
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
    H: Fn(pb::Task, Release) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Vec<u8>, Status>> + Send + 'static,
{
    let addr = addr.into();
    let hello = pb::Hello {
        topic,
        worker,
        credits: options.credits.max(1),
    };
    let endpoint = endpoint(&addr)
        .http2_keep_alive_interval(options.ping_after)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let mut shutdown = pin!(shutdown);
    let mut backoff = BACKOFF_MIN;
    loop {
        match session(&endpoint, &hello, &handler, shutdown.as_mut()).await {
            Ended::Shutdown => return Ok(()),
            Ended::Refused(status) => {
                return Err(BrokerError::WorkerRefused {
                    addr,
                    topic: hello.topic,
                    worker: hello.worker,
                    status,
                });
            }
            Ended::Broke {
                established,
                reason,
            } => {
                if established {
                    backoff = BACKOFF_MIN;
                }
                tracing::warn!(%addr, topic = %hello.topic, worker = %hello.worker, %reason, retry_in = ?backoff, "broker stream lost");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.as_mut() => return Ok(()),
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// How one connection attempt ended.
enum Ended {
    /// Shutdown was asked for (and, if connected, the drain completed).
    Shutdown,
    /// The broker refused the worker for a reason retrying cannot fix.
    Refused(Status),
    /// Connecting failed or the stream broke; worth another try.
    Broke { established: bool, reason: String },
}

/// One Work stream: connect, Hello, then serve tasks until it ends.
async fn session<H, F>(
    endpoint: &Endpoint,
    hello: &pb::Hello,
    handler: &H,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Ended
where
    H: Fn(pb::Task, Release) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Vec<u8>, Status>> + Send + 'static,
{
    let broke = |reason: String| Ended::Broke {
        established: false,
        reason,
    };
    let events = Default::default();
    let channel = tokio::select! {
        c = crate::link::connect(endpoint, &events) => c,
        () = shutdown.as_mut() => return Ended::Shutdown,
    };
    let channel = match channel {
        Ok(channel) => channel,
        Err(e) => return broke(format!("connect: {e}")),
    };
    let mut client =
        broker_client::BrokerClient::new(channel).max_decoding_message_size(usize::MAX);
    let (out, out_rx) = mpsc::unbounded_channel();
    let _ = out.send(message(worker_message::Kind::Hello(hello.clone())));
    let response = tokio::select! {
        r = client.work(UnboundedReceiverStream::new(out_rx)) => r,
        () = shutdown.as_mut() => return Ended::Shutdown,
    };
    let mut inbound = match response {
        Ok(response) => response.into_inner(),
        Err(status) if is_permanent(status.code()) => return Ended::Refused(status),
        Err(status) => return broke(format!("Hello: {status}")),
    };
    tracing::debug!(topic = %hello.topic, worker = %hello.worker, "worker connected");

    // Dropping the set (when this function returns) aborts running handlers.
    let mut running: JoinSet<(u64, Result<Vec<u8>, Status>)> = JoinSet::new();
    let mut task_ids: HashMap<tokio::task::Id, u64> = HashMap::new();
    let mut draining = false;
    loop {
        tokio::select! {
            biased;
            () = shutdown.as_mut(), if !draining => {
                draining = true;
                let _ = out.send(message(worker_message::Kind::Drain(pb::Drain {})));
                if running.is_empty() {
                    return close(out, inbound).await;
                }
            }
            Some(joined) = running.join_next_with_id() => {
                let (task_id, outcome) = match joined {
                    Ok((id, done)) => {
                        task_ids.remove(&id);
                        done
                    }
                    Err(e) => {
                        let task_id = task_ids.remove(&e.id()).unwrap_or_default();
                        (task_id, Err(Status::internal(format!("worker handler failed: {e}"))))
                    }
                };
                let _ = out.send(message(worker_message::Kind::Result(task_result(task_id, outcome))));
                if draining && running.is_empty() {
                    return close(out, inbound).await;
                }
            }
            msg = inbound.message() => match msg {
                Ok(Some(pb::BrokerMessage { kind: Some(broker_message::Kind::Task(task)) })) => {
                    let (task_id, deadline) = (task.task_id, task.deadline_unix_nanos);
                    let release = Release(ReleaseTo::Stream { task_id, out: out.clone() });
                    let work = with_deadline(handler(task, release), deadline);
                    let abort = running.spawn(async move { (task_id, work.await) });
                    task_ids.insert(abort.id(), task_id);
                }
                Ok(Some(pb::BrokerMessage { kind: Some(broker_message::Kind::Rejected(r)) })) => {
                    tracing::warn!(topic = %hello.topic, worker = %hello.worker, task = r.task_id, code = ?Code::from_i32(r.code), reason = %r.message, "broker rejected a message");
                }
                Ok(Some(pb::BrokerMessage { kind: None })) => {}
                Ok(None) | Err(_) if draining => return Ended::Shutdown,
                Ok(None) => return Ended::Broke { established: true, reason: "broker ended the stream".into() },
                Err(status) => return Ended::Broke { established: true, reason: status.to_string() },
            },
        }
    }
}

/// Ends a drained stream: closes the worker's side, then waits (briefly)
/// for the broker to end its side, so the last results are delivered
/// rather than cut off by a reset. A task the broker sent before it read
/// the Drain is left unanswered here; the broker redelivers it.
async fn close(
    out: mpsc::UnboundedSender<pb::WorkerMessage>,
    mut inbound: Streaming<pb::BrokerMessage>,
) -> Ended {
    drop(out);
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    Ended::Shutdown
}

/// Runs `work` until the task's wall-clock deadline (0 = none).
async fn with_deadline<F>(work: F, deadline_unix_nanos: u64) -> Result<Vec<u8>, Status>
where
    F: Future<Output = Result<Vec<u8>, Status>>,
{
    if deadline_unix_nanos == 0 {
        return work.await;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let remaining = Duration::from_nanos(deadline_unix_nanos).saturating_sub(now);
    tokio::time::timeout(remaining, work)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(
                "the worker's handler ran past the task's deadline",
            ))
        })
}

fn task_result(task_id: u64, outcome: Result<Vec<u8>, Status>) -> pb::TaskResult {
    match outcome {
        Ok(payload) => pb::TaskResult {
            task_id,
            payload,
            code: Code::Ok as i32,
            message: String::new(),
        },
        Err(status) => pb::TaskResult {
            task_id,
            payload: Vec::new(),
            code: status.code() as i32,
            message: status.message().to_owned(),
        },
    }
}

fn message(kind: worker_message::Kind) -> pb::WorkerMessage {
    pb::WorkerMessage { kind: Some(kind) }
}

/// Statuses on Hello that no retry can fix.
fn is_permanent(code: Code) -> bool {
    matches!(
        code,
        Code::NotFound
            | Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}
