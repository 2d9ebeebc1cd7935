//! The producer side: [`BrokerClient`] submits tasks and reads statistics.
//!
//! Submits travel on one SubmitStream per client (shared by its clones),
//! not one unary call each: a task goes out under an id the client picks, a
//! background task reads the replies and hands each to the submit waiting
//! on that id. The stream opens on the first submit; if it breaks, every
//! submit still waiting fails UNAVAILABLE and the next submit opens a new
//! one.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tailmesh_proto::pb::{self, broker_client, submit_stream_reply, submit_stream_request};
use tailmesh_units::nanos;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Code, Status,
    transport::{Channel, Endpoint},
};

use super::{error::BrokerError, wire::Deadline};
use crate::{
    addr::PeerAddr,
    link::{self, LinkCounts, LinkEvents},
};

/// How long connecting to the broker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests (tasks and cancels) queued for the stream before a submit
/// waits for room: with the broker's own per-stream limit, this bounds
/// what one client has outstanding beyond the submits actually waiting.
const STREAM_REQUEST_BUFFER: usize = 1024;

/// A producer's handle on the broker: a cheap `Clone` over one tonic
/// channel (HTTP/2 connection) and one submit stream on it, so many tasks
/// can share them concurrently.
#[derive(Clone, Debug)]
pub struct BrokerClient {
    inner: broker_client::BrokerClient<Channel>,
    /// Names the broker in errors.
    broker: Arc<str>,
    /// The submit stream this client and its clones share: opened on the
    /// first submit, replaced by the first submit after it ended.
    stream: Arc<Mutex<Option<SubmitStream>>>,
    /// What happened to the connection and the submit streams on it.
    events: Arc<LinkEvents>,
}

impl BrokerClient {
    /// Connects to the broker at `addr`.
    pub async fn connect(addr: impl Into<PeerAddr>) -> Result<Self, BrokerError> {
        let addr = addr.into();
        let events = Arc::default();
        let channel = link::connect(&endpoint(&addr), &events)
            .await
            .map_err(|source| BrokerError::Connect {
                addr: addr.clone(),
                source,
            })?;
        Ok(Self::named(channel, addr.to_string(), events))
    }

    /// A client for the broker at `addr` that connects on first use, so a
    /// caller can be built before the broker answers.
    pub fn connect_lazy(addr: impl Into<PeerAddr>) -> Self {
        let addr = addr.into();
        let events = Arc::default();
        let channel = link::connect_lazy(&endpoint(&addr), &events);
        Self::named(channel, addr.to_string(), events)
    }

    /// [`BrokerClient::connect_lazy`], its connection counted in `events`
    /// (which other clients may share).
    pub(crate) fn connect_lazy_counted(
        addr: impl Into<PeerAddr>,
        events: &Arc<LinkEvents>,
    ) -> Self {
        let addr = addr.into();
        let channel = link::connect_lazy(&endpoint(&addr), events);
        Self::named(channel, addr.to_string(), Arc::clone(events))
    }

    /// Ends this client's submit stream (a submit still waiting on it, in
    /// a clone, fails UNAVAILABLE) and lets its connection go: it closes
    /// once no clone holds it, at once (by the connection's own task) for
    /// a client that was never cloned.
    pub async fn close(self) {
        let stream = lock(&self.stream).take();
        if let Some(stream) = stream {
            stream.waiters.end(Status::unavailable(format!(
                "broker {}: the client was closed",
                self.broker
            )));
            // Its reader holds a handle on the connection.
            stream.reader.abort();
        }
        // The connection's own task ends it when the last handle goes.
        drop(self);
    }

    /// Wraps an existing channel (for callers that build their own, e.g.
    /// with a balancer or extra layers).
    pub fn from_channel(channel: Channel) -> Self {
        Self::named(channel, "(caller's channel)".to_owned(), Arc::default())
    }

    fn named(channel: Channel, broker: String, events: Arc<LinkEvents>) -> Self {
        // The broker bounds what it sends (its max_payload_bytes); tonic's
        // 4 MiB default would refuse a full-size payload plus its framing.
        let inner = broker_client::BrokerClient::new(channel).max_decoding_message_size(usize::MAX);
        BrokerClient {
            inner,
            broker: broker.into(),
            stream: Arc::default(),
            events,
        }
    }

    /// What happened to this client's connection so far (shared by its
    /// clones): connections opened and closed, and submit streams ended by
    /// the transport, each counted once for the stream.
    pub fn link_counts(&self) -> LinkCounts {
        self.events.counts()
    }

    /// Submits one task to `topic` and waits for the worker's answer.
    ///
    /// `deadline` is the time the caller is still willing to wait: the task
    /// carries it as an absolute deadline, the broker answers
    /// DEADLINE_EXCEEDED when it passes (and never dispatches a task whose
    /// deadline passed in the queue), and the call gives up locally
    /// shortly after it. Errors are the broker's statuses (see
    /// `broker.proto`) or the worker's own; UNAVAILABLE naming the broker
    /// if the submit stream breaks first. Dropping the future cancels the
    /// task at the broker.
    pub async fn submit(
        &mut self,
        topic: &str,
        payload: impl Into<Vec<u8>>,
        headers: HashMap<String, String>,
        deadline: Option<Duration>,
    ) -> Result<pb::SubmitReply, Status> {
        self.submit_by(topic, payload.into(), headers, None, Deadline::of(deadline))
            .await
    }

    /// [`BrokerClient::submit`] with the deadline read off the clock
    /// already (when the caller handed the task over), and a binary trace
    /// context.
    pub(crate) async fn submit_by(
        &self,
        topic: &str,
        payload: Vec<u8>,
        headers: HashMap<String, String>,
        trace: Option<pb::TraceContext>,
        deadline: Option<Deadline>,
    ) -> Result<pb::SubmitReply, Status> {
        let request = pb::SubmitRequest {
            topic: topic.to_owned(),
            payload,
            headers,
            deadline_unix_nanos: Deadline::unix_nanos_of(deadline),
            trace,
        };
        let Some(Deadline { left, .. }) = deadline else {
            return self.submit_on_stream(request, None).await;
        };
        // The task's relative timeout (like the local wait) is a little
        // longer than its own deadline, so the broker's precise answer
        // arrives before either safety net fires.
        let patience = left + crate::deadline::ANSWER_SLACK;
        crate::deadline::within(left, self.submit_on_stream(request, Some(patience)), || {
            format!("no answer from the broker (task deadline {left:?})")
        })
        .await
    }

    /// Sends one task on the shared stream and waits for its reply.
    /// `timeout` is the relative bound the broker applies besides the
    /// absolute deadline (what grpc-timeout is to a unary Submit).
    async fn submit_on_stream(
        &self,
        request: pb::SubmitRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::SubmitReply, Status> {
        let stream = self.stream();
        let (id, mut answer) = stream.waiters.register()?;
        // From here on, dropping this future gives the task up.
        let mut task = Outstanding {
            stream: &stream,
            id,
            sent: false,
        };
        let message = pb::SubmitStreamRequest {
            id,
            kind: Some(submit_stream_request::Kind::Submit(request)),
            timeout_ns: timeout.map_or(0, nanos),
        };
        tokio::select! {
            biased;
            // The stream ending while we wait for room answers us too.
            a = &mut answer => return flatten(a, &self.broker),
            sent = stream.requests.send(message) => {
                if sent.is_err() {
                    return Err(Status::unavailable(format!(
                        "broker {}: submit stream closed before task could be sent",
                        self.broker
                    )));
                }
                task.sent = true;
            }
        }
        flatten(answer.await, &self.broker)
    }

    /// The open submit stream, opening one if there is none or the last one
    /// ended.
    fn stream(&self) -> SubmitStream {
        let mut slot = lock(&self.stream);
        if let Some(stream) = slot.as_ref().filter(|s| !s.waiters.has_ended()) {
            return stream.clone();
        }
        let stream = SubmitStream::open(
            self.inner.clone(),
            self.broker.clone(),
            Arc::clone(&self.events),
        );
        *slot = Some(stream.clone());
        stream
    }

    /// Per-topic statistics: one topic, or every topic when `topic` is
    /// `None`.
    pub async fn stats(&mut self, topic: Option<&str>) -> Result<Vec<pb::TopicStats>, Status> {
        let request = pb::StatsRequest {
            topic: topic.unwrap_or_default().to_owned(),
        };
        Ok(self.inner.stats(request).await?.into_inner().topics)
    }
}

type AnswerTx = oneshot::Sender<Result<pb::SubmitReply, Status>>;
type AnswerRx = oneshot::Receiver<Result<pb::SubmitReply, Status>>;

/// A reply as the submit waiting for it sees it.
fn flatten(
    answer: Result<Result<pb::SubmitReply, Status>, oneshot::error::RecvError>,
    broker: &str,
) -> Result<pb::SubmitReply, Status> {
    answer.unwrap_or_else(|_| {
        Err(Status::unavailable(format!(
            "broker {broker}: submit stream dropped the task unanswered"
        )))
    })
}

/// One SubmitStream: where requests go, and who waits for which reply.
#[derive(Clone, Debug)]
struct SubmitStream {
    requests: mpsc::Sender<pb::SubmitStreamRequest>,
    waiters: Arc<Waiters>,
    /// The task reading the replies.
    reader: tokio::task::AbortHandle,
}

impl SubmitStream {
    /// Opens the stream in the background: requests queue until the call
    /// is up, and a failure to open it ends the stream like a break.
    fn open(
        client: broker_client::BrokerClient<Channel>,
        broker: Arc<str>,
        events: Arc<LinkEvents>,
    ) -> Self {
        let (requests, outbound) = mpsc::channel(STREAM_REQUEST_BUFFER);
        let waiters = Arc::new(Waiters::default());
        let reader = tokio::spawn(read_replies(
            client,
            ReceiverStream::new(outbound),
            waiters.clone(),
            broker,
            events,
        ))
        .abort_handle();
        SubmitStream {
            requests,
            waiters,
            reader,
        }
    }
}

/// Runs the stream's call and hands each reply to its waiter until the
/// stream ends, then fails every submit still waiting.
async fn read_replies(
    mut client: broker_client::BrokerClient<Channel>,
    outbound: ReceiverStream<pb::SubmitStreamRequest>,
    waiters: Arc<Waiters>,
    broker: Arc<str>,
    events: Arc<LinkEvents>,
) {
    let why = match client.submit_stream(outbound).await {
        Err(status) => status,
        Ok(response) => {
            let mut inbound = response.into_inner();
            loop {
                match inbound.message().await {
                    Ok(Some(reply)) => waiters.answer(reply),
                    Ok(None) => break Status::unavailable("the broker ended it"),
                    Err(status) => break status,
                }
            }
        }
    };
    tracing::debug!(%broker, status = %why, "submit stream ended");
    events.note(&why);
    waiters.end(Status::unavailable(format!(
        "broker {broker}: submit stream ended: {:?}: {}",
        why.code(),
        why.message()
    )));
}

/// The submits waiting on one stream, by task id.
#[derive(Debug, Default)]
struct Waiters(Mutex<WaitersInner>);

#[derive(Debug, Default)]
struct WaitersInner {
    next_id: u64,
    waiting: HashMap<u64, AnswerTx>,
    /// Why the stream ended, once it has: late submits get this too.
    ended: Option<Status>,
}

impl Waiters {
    /// A fresh task id and the receiver of its answer, or the reason the
    /// stream ended.
    fn register(&self) -> Result<(u64, AnswerRx), Status> {
        let mut inner = lock(&self.0);
        if let Some(status) = &inner.ended {
            return Err(status.clone());
        }
        inner.next_id += 1;
        let id = inner.next_id;
        let (tx, rx) = oneshot::channel();
        inner.waiting.insert(id, tx);
        Ok((id, rx))
    }

    fn has_ended(&self) -> bool {
        lock(&self.0).ended.is_some()
    }

    /// Removes task `id`; true if it was still waiting.
    fn forget(&self, id: u64) -> bool {
        lock(&self.0).waiting.remove(&id).is_some()
    }

    /// Hands a reply to its waiter, if it still waits (one that gave up
    /// has cancelled the task, but the answer may have crossed the cancel).
    fn answer(&self, reply: pb::SubmitStreamReply) {
        let Some(tx) = lock(&self.0).waiting.remove(&reply.id) else {
            return;
        };
        let result = match reply.result {
            Some(submit_stream_reply::Result::Reply(reply)) => Ok(reply),
            Some(submit_stream_reply::Result::Error(e)) => {
                Err(Status::new(Code::from(e.code), e.message))
            }
            None => Err(Status::internal(format!(
                "the broker answered task {} with an empty reply",
                reply.id
            ))),
        };
        let _ = tx.send(result);
    }

    /// The stream ended: every waiter gets `status`, and so does any
    /// later submit on this stream.
    fn end(&self, status: Status) {
        let waiting = {
            let mut inner = lock(&self.0);
            inner.ended = Some(status.clone());
            std::mem::take(&mut inner.waiting)
        };
        for tx in waiting.into_values() {
            let _ = tx.send(Err(status.clone()));
        }
    }
}

/// A task some submit still waits for; dropping it unanswered (the caller
/// gave up, or its local patience ran out) removes the waiter and, if the
/// task went out, cancels it at the broker.
struct Outstanding<'a> {
    stream: &'a SubmitStream,
    id: u64,
    sent: bool,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        if !self.stream.waiters.forget(self.id) || !self.sent {
            return; // answered, or the broker never saw it
        }
        let cancel = pb::SubmitStreamRequest {
            id: self.id,
            kind: Some(submit_stream_request::Kind::Cancel(pb::CancelTask {})),
            timeout_ns: 0,
        };
        // Queued behind the task itself, so it can never overtake it.
        match self.stream.requests.try_send(cancel) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(cancel)) => {
                // Drop cannot wait; a task can. Without a runtime (only at
                // process exit) the task's deadline still bounds it.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let requests = self.stream.requests.clone();
                    runtime.spawn(async move {
                        let _ = requests.send(cancel).await;
                    });
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a map update: a panic inside one
    // leaves nothing half-done worth refusing to read.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The endpoint every broker client uses.
pub(crate) fn endpoint(addr: &PeerAddr) -> Endpoint {
    link::endpoint(
        addr.uri()
            .parse::<tonic::codegen::http::Uri>()
            .expect("a checked host and port make a valid URI"),
        CONNECT_TIMEOUT,
    )
}
