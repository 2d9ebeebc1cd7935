//! The worker side of tailmesh's broker: one session holds one Work
//! stream, runs the handler for each task it receives and sends the
//! results back (the loop that reconnects is the pull backends' own,
//! [`serve`](super::pull::serve)).

use std::{collections::HashMap, time::Duration};

use tailmesh_proto::pb::{self, broker_client, broker_message, worker_message};
use tokio::{sync::mpsc, task::JoinSet};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming, transport::Endpoint};

use super::{
    pull::{BackendError, BrokerAt, Release, SessionEnd, Shutdown, TaskHandler},
    wire::within_deadline,
};

/// HTTP/2 pings that notice a broker gone silent (a dead host, a partition)
/// while the worker waits for work, so the stream does not hang forever
/// (the default of [`WorkerOptions::ping_after`]).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a keepalive PING may go unanswered before the stream breaks.
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a drained worker waits for the broker to close the stream.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

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

/// One Work stream on `endpoint`: connect, Hello, then serve tasks until it
/// ends or `shutdown` fires.
///
/// Every task runs `handler` in its own tokio task (so CPU-bound handlers
/// spread over a multi-thread runtime's threads, and a panic answers
/// INTERNAL instead of killing the worker), within the task's deadline. If
/// the stream breaks, the running handlers are dropped (the broker
/// redelivers their tasks to other workers). On `shutdown` the worker sends
/// Drain (the broker stops sending it tasks), finishes and answers the
/// tasks it holds and closes its stream.
pub(crate) async fn session(
    at: &BrokerAt,
    endpoint: &Endpoint,
    hello: pb::Hello,
    handler: TaskHandler,
    mut shutdown: Shutdown,
) -> SessionEnd {
    let events = Default::default();
    let channel = tokio::select! {
        c = crate::link::connect(endpoint, &events) => c,
        () = shutdown.fired() => return SessionEnd::ShutDown,
    };
    let channel = match channel {
        Ok(channel) => channel,
        Err(e) => return SessionEnd::Unreachable(BackendError::unavailable(at, "connect", e)),
    };
    let mut client =
        broker_client::BrokerClient::new(channel).max_decoding_message_size(usize::MAX);
    let (out, out_rx) = mpsc::unbounded_channel();
    let _ = out.send(message(worker_message::Kind::Hello(hello.clone())));
    let response = tokio::select! {
        r = client.work(UnboundedReceiverStream::new(out_rx)) => r,
        () = shutdown.fired() => return SessionEnd::ShutDown,
    };
    let mut inbound = match response {
        Ok(response) => response.into_inner(),
        Err(status) if is_permanent(status.code()) => return SessionEnd::Refused(status),
        Err(status) => {
            return SessionEnd::Unreachable(BackendError::unavailable(at, "Hello", status));
        }
    };
    tracing::debug!(topic = %hello.topic, worker = %hello.worker, "worker connected");

    // Dropping the set (when this function returns) aborts running handlers.
    let mut running: JoinSet<(u64, Result<Vec<u8>, Status>)> = JoinSet::new();
    let mut task_ids: HashMap<tokio::task::Id, u64> = HashMap::new();
    let mut draining = false;
    loop {
        tokio::select! {
            biased;
            () = shutdown.fired(), if !draining => {
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
                    let release = {
                        let out = out.clone();
                        Release::callback(move || {
                            let release = pb::Release { task_id };
                            let _ = out.send(message(worker_message::Kind::Release(release)));
                        })
                    };
                    let work = within_deadline(handler(task, release), deadline);
                    let abort = running.spawn(async move { (task_id, work.await) });
                    task_ids.insert(abort.id(), task_id);
                }
                Ok(Some(pb::BrokerMessage { kind: Some(broker_message::Kind::Rejected(r)) })) => {
                    tracing::warn!(topic = %hello.topic, worker = %hello.worker, task = r.task_id, code = ?Code::from_i32(r.code), reason = %r.message, "broker rejected a message");
                }
                Ok(Some(pb::BrokerMessage { kind: None })) => {}
                Ok(None) | Err(_) if draining => return SessionEnd::ShutDown,
                Ok(None) => {
                    return SessionEnd::Lost(BackendError::Ended { at: at.clone(), what: "the Work stream" });
                }
                Err(status) => {
                    return SessionEnd::Lost(BackendError::unavailable(at, "Work stream", status));
                }
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
) -> SessionEnd {
    drop(out);
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    SessionEnd::ShutDown
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
