//! NATS JetStream as a pull backend.
//!
//! - **A work-queue stream per pulled hop**: stream `tm_<hop>` on subject
//!   `tm.<hop>`, in memory, work-queue retention (a message leaves the
//!   stream when acknowledged), at most the hop's [`QueueBounds`] of
//!   messages (`max_messages`) and bytes (`max_bytes`, which JetStream
//!   counts over subject, headers and payload) with discard-new: one more
//!   publish is refused, answered RESOURCE_EXHAUSTED. A stream that exists
//!   with other bounds is not changed: whoever finds it is answered
//!   FAILED_PRECONDITION, naming the stream.
//! - **One durable pull consumer per hop** (`workers`) shared by the hop's
//!   replicas, explicit acks, ack wait `ACK_WAIT` (2 s) (workers signal progress
//!   on long tasks) and at most `MAX_DELIVERIES` (3) deliveries.
//! - **Credit**: a worker keeps its free credit requested ahead, over one
//!   inbox subscription for its session: a pull request
//!   (`$JS.API.CONSUMER.MSG.NEXT`) asks for every slot free at the time
//!   (so at most `credits` requests are open). Messages requested
//!   and tasks held never exceed `credits` together, so the server hands
//!   the worker a task only for a free slot: each delivery takes one of the
//!   requested slots to its task; a request that ends unfilled (408 at its
//!   expiry, 409) gives back the slots of the messages it will not deliver
//!   (the server's `Nats-Pending-Messages`; each request has a reply subject
//!   of its own under the inbox, which the statuses about it carry). A
//!   status without that count ends the session rather than guess it. A
//!   task's slot frees when its handler releases
//!   it (a hop waiting on downstream hops) or when it is answered. The
//!   server's idle heartbeats on open requests tell the worker its requests
//!   are still held; silence past `PULL_SILENCE` (7 s) ends the session.
//! - **Publishes** are asynchronous: a producer awaits a task's publish
//!   acknowledgement and its reply together, so the reply never waits
//!   behind the acknowledgement; at most `PUBLISH_WINDOW` (1024) publishes of a
//!   producer await their acknowledgements at once (more wait for room),
//!   and a refused publish (stream full) is still answered
//!   RESOURCE_EXHAUSTED.
//! - **Acknowledgement** after the reply is sent, so a worker lost at any
//!   point leaves its tasks to be delivered again after `ACK_WAIT`;
//!   until then the worker signals progress on the tasks it holds.
//! - **Replies** go by core NATS to the producer's inbox, named in the
//!   `tm-reply` header (JetStream uses the message's own reply subject for
//!   its publish acknowledgement).
//! - **Deadlines**: NATS 2.9 has no per-message time to live, so the
//!   deadline travels in a header and the worker checks it: a task whose
//!   deadline passed in the queue is acknowledged (terminated) unprocessed.
//!   The server announces each termination in an advisory, which stream
//!   `tm_<hop>_expired` captures: its last sequence is the `expired` count
//!   of the hop's statistics.

use std::{
    collections::{HashMap, VecDeque},
    future::IntoFuture,
    pin::pin,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_nats::{
    HeaderMap, StatusCode,
    jetstream::{self, AckKind, consumer::pull, stream},
};
use futures::{FutureExt, StreamExt, future::BoxFuture};
use tailmesh_proto::pb;
use tailmesh_units::unix_nanos;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, oneshot},
    task::JoinSet,
    time::Instant,
};

use super::{
    pull::{
        BackendError, BrokerAt, PullBackend, Release, SessionEnd, Shutdown, TaskHandler,
        WorkerSpec, reply_within,
    },
    wire::{
        ACK_WAIT, CODE_HEADER, Deadline, MAX_DELIVERIES, MESSAGE_HEADER, Received, reply_headers,
        reply_of, task_headers, within_deadline,
    },
};
use crate::{addr::PeerAddr, model::QueueBounds};

/// Most tasks the hop's consumer has delivered and not yet seen
/// acknowledged (all its workers' together); workers' credit keeps them
/// below it.
const MAX_ACK_PENDING: i64 = 10_000;

/// Header: the producer's inbox subject for the reply.
const REPLY_HEADER: &str = "tm-reply";
/// The consumer every worker of a hop shares.
const CONSUMER: &str = "workers";
/// How long one pull request waits for messages before the server ends it
/// (408) and the worker asks again.
pub const PULL_EXPIRES: Duration = Duration::from_secs(10);
/// How often the server signals (100 Idle Heartbeat) that it still holds
/// an open pull request that has had nothing to deliver.
pub const PULL_HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a worker with open pull requests may hear nothing on its inbox
/// (neither a task nor a heartbeat) before it takes its requests for lost
/// (a restarted server forgets them silently) and starts a new session.
const PULL_SILENCE: Duration = Duration::from_secs(7);
/// Most publishes a producer keeps awaiting their acknowledgements; the
/// next publish waits for room (so a flood cannot grow memory).
const PUBLISH_WINDOW: usize = 1024;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message the broker accepts (its `max_payload`, set when the
/// launcher starts it): a full payload plus framing.
pub const MAX_PAYLOAD: usize = 8 * 1024 * 1024;

/// The stream of a hop's tasks.
pub fn stream_name(topic: &str) -> String {
    format!("tm_{topic}")
}

/// The stream that keeps the advisories of a hop's expired tasks, only to
/// count them.
pub fn expired_stream_name(topic: &str) -> String {
    format!("tm_{topic}_expired")
}

/// The advisory the server publishes when a worker terminates a message:
/// it does so only for a task whose deadline passed in the queue.
fn terminated_advisory(topic: &str) -> String {
    format!(
        "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{}.{CONSUMER}",
        stream_name(topic)
    )
}

/// Advisories of expired tasks kept; the count is the stream's last
/// sequence, so dropping older ones loses no count.
const EXPIRED_KEPT: i64 = 1_000;

fn subject(topic: &str) -> String {
    format!("tm.{topic}")
}

fn url(addr: &PeerAddr) -> String {
    format!("nats://{addr}")
}

/// NATS at `addr`, as errors name it.
fn at(addr: &PeerAddr) -> BrokerAt {
    BrokerAt {
        name: "NATS",
        addr: addr.clone(),
    }
}

async fn connect(at: &BrokerAt) -> Result<async_nats::Client, BackendError> {
    async_nats::ConnectOptions::new()
        .connection_timeout(CONNECT_TIMEOUT)
        .connect(url(&at.addr))
        .await
        .map_err(|e| BackendError::unavailable(at, "connect", e))
}

/// The hop's stream, created if it is not there yet (by whichever of its
/// producers and workers comes first; they all ask for the same), and the
/// stream that counts its expired tasks. A hop stream that exists with
/// other `bounds` is FAILED_PRECONDITION (it is not changed under the
/// producers and workers that made it).
async fn ensure_stream(
    at: &BrokerAt,
    js: &jetstream::Context,
    bounds: QueueBounds,
    topic: &str,
) -> Result<stream::Stream, BackendError> {
    let config = stream::Config {
        name: stream_name(topic),
        subjects: vec![subject(topic)],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::Memory,
        max_messages: i64::from(bounds.capacity),
        max_bytes: i64::try_from(bounds.bytes).unwrap_or(i64::MAX),
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    };
    let expired = stream::Config {
        name: expired_stream_name(topic),
        subjects: vec![terminated_advisory(topic)],
        storage: stream::StorageType::Memory,
        max_messages: EXPIRED_KEPT,
        discard: stream::DiscardPolicy::Old,
        ..Default::default()
    };
    get_or_create(at, js, expired).await?;
    let (max_messages, max_bytes) = (config.max_messages, config.max_bytes);
    let stream = get_or_create(at, js, config).await?;
    let found = &stream.cached_info().config;
    if (found.max_messages, found.max_bytes) != (max_messages, max_bytes) {
        return Err(BackendError::OtherBounds {
            at: at.clone(),
            queue: format!(
                "stream {} (of {} messages, {} bytes)",
                found.name, found.max_messages, found.max_bytes
            ),
            bounds,
            source: None,
        });
    }
    Ok(stream)
}

async fn get_or_create(
    at: &BrokerAt,
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, BackendError> {
    let name = config.name.clone();
    // Two creators may race: the loser finds the winner's stream.
    match js.get_or_create_stream(config).await {
        Ok(s) => Ok(s),
        Err(first) => js
            .get_stream(&name)
            .await
            .map_err(|_| BackendError::unavailable(at, format!("stream {name}"), first)),
    }
}

async fn ensure_consumer(
    at: &BrokerAt,
    stream: &stream::Stream,
    topic: &str,
) -> Result<jetstream::consumer::PullConsumer, BackendError> {
    let config = pull::Config {
        durable_name: Some(CONSUMER.to_owned()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_deliver: i64::from(MAX_DELIVERIES),
        max_ack_pending: MAX_ACK_PENDING,
        ..Default::default()
    };
    match stream.get_or_create_consumer(CONSUMER, config).await {
        Ok(c) => Ok(c),
        Err(first) => stream.get_consumer(CONSUMER).await.map_err(|_| {
            BackendError::unavailable(at, format!("consumer {CONSUMER} of {topic}"), first)
        }),
    }
}

/// A producer's connection: JetStream for tasks, an inbox for replies.
#[derive(Debug)]
struct Connected {
    /// Kept to drain it on close.
    client: async_nats::Client,
    /// The task routing replies, which ends with the connection.
    routing: tokio::task::JoinHandle<()>,
    js: jetstream::Context,
    inbox: String,
    waiters: Arc<Waiters>,
    next_id: AtomicU64,
    /// Topics whose stream this producer has made sure of.
    streams: Mutex<Vec<String>>,
}

impl Drop for Connected {
    fn drop(&mut self) {
        // The reply subscription keeps the connection open: a producer
        // dropped without `close` (a call given up mid-way) drains it here.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            runtime.spawn(async move {
                let _ = client.drain().await;
            });
        }
    }
}

type Waiters = Mutex<HashMap<u64, oneshot::Sender<async_nats::Message>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// NATS JetStream at one address: the producer side over one connection,
/// opened on first use; each worker session connects on its own.
#[derive(Debug)]
pub(crate) struct NatsBackend {
    at: BrokerAt,
    bounds: QueueBounds,
    conn: tokio::sync::Mutex<Option<Arc<Connected>>>,
}

impl NatsBackend {
    /// The NATS server at `addr` whose hop streams are made with `bounds`;
    /// a producer connects on first submit.
    pub(crate) fn new(addr: &PeerAddr, bounds: QueueBounds) -> Self {
        NatsBackend {
            at: at(addr),
            bounds,
            conn: tokio::sync::Mutex::default(),
        }
    }

    async fn connected(&self) -> Result<Arc<Connected>, BackendError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let client = connect(&self.at).await?;
        let inbox = client.new_inbox();
        let mut replies = client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|e| BackendError::unavailable(&self.at, "subscribe", e))?;
        let waiters: Arc<Waiters> = Arc::default();
        let routing = waiters.clone();
        let routing = tokio::spawn(async move {
            while let Some(reply) = replies.next().await {
                let id = reply
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|id| id.parse::<u64>().ok());
                if let Some(tx) = id.and_then(|id| lock(&routing).remove(&id)) {
                    let _ = tx.send(reply);
                }
            }
        });
        let js = jetstream::ContextBuilder::new()
            .max_ack_inflight(PUBLISH_WINDOW)
            .backpressure_on_inflight(true)
            .build(client.clone());
        let connected = Arc::new(Connected {
            client,
            routing,
            js,
            inbox,
            waiters,
            next_id: AtomicU64::new(0),
            streams: Mutex::default(),
        });
        *slot = Some(connected.clone());
        Ok(connected)
    }

    /// Closes the producer's connection, if it opened one: drains it
    /// (replies still on their way are delivered, nothing new is sent) and
    /// waits, at most 5 s (the connect timeout), for the connection to end. A
    /// submit still waiting on it, in a clone, fails UNAVAILABLE.
    async fn close_producer(&self) {
        let Some(connected) = self.conn.lock().await.take() else {
            return;
        };
        if connected.client.drain().await.is_err() {
            return; // the connection's task has ended already
        }
        let Some(mut connected) = Arc::into_inner(connected) else {
            return; // a clone's submit holds it; the drain ends it
        };
        // The reply subscription ends when the drain is done.
        let _ = tokio::time::timeout(CONNECT_TIMEOUT, &mut connected.routing).await;
    }

    /// Publishes the task and waits for its reply (see
    /// [`Producer::submit`](super::backend::Producer::submit)).
    async fn submit_task(
        &self,
        topic: &str,
        payload: Vec<u8>,
        headers: HashMap<String, String>,
        deadline: Option<Deadline>,
    ) -> Result<Vec<u8>, BackendError> {
        let wait = async {
            let c = self.connected().await?;
            if !lock(&c.streams).iter().any(|t| t == topic) {
                ensure_stream(&self.at, &c.js, self.bounds, topic).await?;
                lock(&c.streams).push(topic.to_owned());
            }
            let id = c.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            lock(&c.waiters).insert(id, tx);
            let _waiting = Forget(&c.waiters, id);
            let mut map = HeaderMap::new();
            for (k, v) in task_headers(headers, deadline) {
                map.insert(k.as_str(), v.as_str());
            }
            map.insert(REPLY_HEADER, format!("{}.{id}", c.inbox).as_str());
            let published =
                c.js.publish_with_headers(subject(topic), map, payload.into())
                    .await
                    .map_err(|e| self.refused(topic, e))?;
            // The acknowledgement and the reply are awaited together: a
            // reply means the task was stored, whichever comes first, and
            // a refusal answers at once.
            let mut acked = pin!(published.into_future().fuse());
            let mut rx = rx;
            let reply = loop {
                tokio::select! {
                    reply = &mut rx => break reply,
                    ack = &mut acked => {
                        ack.map_err(|e| self.refused(topic, e))?;
                    }
                }
            };
            let reply = reply.map_err(|_| BackendError::Ended {
                at: self.at.clone(),
                what: "the reply subscription",
            })?;
            let header = |k: &str| {
                reply
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(k))
                    .map(|v| v.as_str().to_owned())
            };
            reply_of(
                header(CODE_HEADER).as_deref(),
                header(MESSAGE_HEADER).as_deref(),
                reply.payload.to_vec(),
            )
            .map_err(BackendError::Answered)
        };
        reply_within(&self.at, topic, deadline, wait).await
    }

    /// A refused publish: a full stream is [`BackendError::Full`], anything
    /// else unavailable.
    fn refused(
        &self,
        topic: &str,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> BackendError {
        let why = e.to_string();
        if why.contains("maximum messages") || why.contains("maximum bytes") {
            BackendError::Full {
                at: self.at.clone(),
                topic: topic.to_owned(),
                bounds: self.bounds,
            }
        } else {
            BackendError::unavailable(&self.at, format!("publish to {topic:?}"), e)
        }
    }
}

impl PullBackend for NatsBackend {
    fn at(&self) -> &BrokerAt {
        &self.at
    }

    fn submit<'a>(
        &'a self,
        topic: &'a str,
        payload: Vec<u8>,
        trace: Option<crate::telemetry::SpanContext>,
        deadline: Option<Deadline>,
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>> {
        // Through another broker the context is a `traceparent` header.
        let mut headers = HashMap::new();
        crate::telemetry::inject_headers(&trace, &mut headers);
        self.submit_task(topic, payload, headers, deadline).boxed()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.close_producer().boxed()
    }

    fn session<'a>(
        &'a self,
        spec: &'a WorkerSpec,
        handler: TaskHandler,
        shutdown: Shutdown,
    ) -> BoxFuture<'a, SessionEnd> {
        session(&self.at, spec, handler, shutdown).boxed()
    }

    fn stats<'a>(
        &'a self,
        topics: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<pb::TopicStats>, BackendError>> {
        stats(&self.at, topics).boxed()
    }
}

/// Removes a waiter however its submit ends.
struct Forget<'a>(&'a Waiters, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

/// One session of the worker side (see
/// [`run_backend_worker`](super::backend::run_backend_worker)): connects,
/// then serves until the connection is lost or shutdown fires.
async fn session(
    at: &BrokerAt,
    spec: &WorkerSpec,
    handler: TaskHandler,
    mut shutdown: Shutdown,
) -> SessionEnd {
    let (topic, worker) = (&spec.topic, &spec.worker);
    let credits = spec.credits;
    let session = async {
        let client = connect(at).await?;
        let js = jetstream::new(client.clone());
        let stream = ensure_stream(at, &js, spec.bounds, topic).await?;
        let consumer = ensure_consumer(at, &stream, topic).await?;
        let inbox = client.new_inbox();
        let deliveries = client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|e| BackendError::unavailable(at, "subscribe", e))?;
        tracing::debug!(broker = %at, %topic, %worker, "NATS worker connected");
        Ok::<_, BackendError>(Puller {
            at: at.clone(),
            js,
            consumer,
            inbox,
            deliveries,
            topic: topic.clone(),
            requested: Vec::new(),
            open: VecDeque::new(),
            next_request: 0,
        })
    };
    let puller = tokio::select! {
        connected = session => match connected {
            Ok(p) => p,
            Err(why) => return SessionEnd::Unreachable(why),
        },
        () = shutdown.fired() => return SessionEnd::ShutDown,
    };
    let slots = Arc::new(Semaphore::new(credits as usize));
    let mut pulling = JoinSet::new();
    pulling.spawn(puller.run(slots.clone(), handler));
    tokio::select! {
        () = shutdown.fired() => {
            // No new pulls (the open requests' slots come back with the
            // puller); the tasks held are finished and answered.
            pulling.abort_all();
            let _ = slots.acquire_many(credits).await;
            SessionEnd::ShutDown
        }
        Some(ended) = pulling.join_next() => SessionEnd::Lost(match ended {
            Ok(why) => why,
            Err(source) => BackendError::Task { at: at.clone(), source },
        }),
    }
}

/// A worker session's pull side: one inbox subscription, under which each
/// pull request has its own reply subject (`<inbox>.<request>`), so the
/// server's statuses name their request (its deliveries carry the task's
/// own subject, so they do not), and the slots the open requests hold.
struct Puller {
    at: BrokerAt,
    js: jetstream::Context,
    consumer: jetstream::consumer::PullConsumer,
    inbox: String,
    deliveries: async_nats::Subscriber,
    topic: String,
    /// One slot for every message the open requests may still deliver:
    /// the sum of the server's counts of them.
    requested: Vec<OwnedSemaphorePermit>,
    /// The requests that may still be open, oldest first, with the
    /// messages each asked for (what one refused outright for want of room
    /// at the server gives back): a filled request ends without a word, so
    /// this keeps no more of them than `requested` has slots (each open
    /// request holds one at least), dropping the oldest (the server fills
    /// its requests in turn).
    open: VecDeque<(u64, usize)>,
    next_request: u64,
}

impl Puller {
    /// Keeps the worker's free credit requested: whenever a slot is free,
    /// takes every slot free by then and asks for that many messages in
    /// one request; serves what arrives. Returns why it stopped.
    async fn run(mut self, slots: Arc<Semaphore>, handler: TaskHandler) -> BackendError {
        let mut heard = Instant::now();
        let silence = tokio::time::sleep(PULL_SILENCE);
        let mut silence = pin!(silence);
        // After the server refused a request for want of room among its
        // waiting requests, no new request before this.
        let mut paused_until = Instant::now();
        loop {
            tokio::select! {
                biased;
                delivery = self.deliveries.next() => {
                    let Some(delivery) = delivery else {
                        return BackendError::Ended { at: self.at.clone(), what: "the inbox subscription" };
                    };
                    heard = Instant::now();
                    match self.delivered(delivery, &handler) {
                        Ok(Some(pause)) => paused_until = Instant::now() + pause,
                        Ok(None) => {}
                        Err(why) => return why,
                    }
                }
                slot = slots.clone().acquire_owned() => {
                    let Ok(slot) = slot else {
                        return BackendError::Ended { at: self.at.clone(), what: "the credit's slots" };
                    };
                    tokio::time::sleep_until(paused_until).await;
                    if self.requested.is_empty() {
                        // Silence counts from the first open request.
                        heard = Instant::now();
                    }
                    let mut held = vec![slot];
                    while let Ok(slot) = slots.clone().try_acquire_owned() {
                        held.push(slot);
                    }
                    if let Err(why) = self.request(held).await {
                        return why;
                    }
                }
                () = &mut silence => {
                    let due = heard + PULL_SILENCE;
                    if self.requested.is_empty() {
                        silence.as_mut().reset(Instant::now() + PULL_SILENCE);
                    } else if Instant::now() < due {
                        silence.as_mut().reset(due);
                    } else {
                        return BackendError::Silent {
                            at: self.at.clone(),
                            silence: PULL_SILENCE,
                            requested: self.requested.len(),
                        };
                    }
                }
            }
        }
    }

    /// Sends one pull request for as many messages as `held` has slots.
    async fn request(&mut self, held: Vec<OwnedSemaphorePermit>) -> Result<(), BackendError> {
        let number = self.next_request;
        self.next_request += 1;
        let batch = pull::BatchConfig {
            batch: held.len(),
            expires: Some(PULL_EXPIRES),
            idle_heartbeat: PULL_HEARTBEAT,
            ..Default::default()
        };
        // Counted before it is sent: its first delivery may come at once.
        self.open.push_back((number, held.len()));
        self.requested.extend(held);
        let reply = async_nats::Subject::from(format!("{}.{number}", self.inbox));
        self.consumer
            .request_batch(batch, reply)
            .await
            .map_err(|e| BackendError::unavailable(&self.at, "pull request", e))
    }

    /// One message on the inbox: a task for one of the requested slots
    /// (served on a task of its own), a heartbeat, or the end of a
    /// request. Returns how long to wait before the next request, if the
    /// server asked for that, or why the session must end.
    fn delivered(
        &mut self,
        message: async_nats::Message,
        handler: &TaskHandler,
    ) -> Result<Option<Duration>, BackendError> {
        let status = message.status.unwrap_or(StatusCode::OK);
        if status == StatusCode::IDLE_HEARTBEAT {
            return Ok(None);
        }
        if status == StatusCode::OK {
            let slot = self.requested.pop();
            self.forget_filled();
            let message = jetstream::Message {
                message,
                context: self.js.clone(),
            };
            let Some(slot) = slot else {
                // More than was asked for (never expected): not served, it
                // goes back to the stream for another worker.
                tracing::warn!(topic = %self.topic, "NATS delivered a task not asked for");
                tokio::spawn(async move {
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                });
                return Ok(None);
            };
            let (handler, topic) = (handler.clone(), self.topic.clone());
            tokio::spawn(async move {
                serve_message(message, &topic, slot, handler).await;
            });
            return Ok(None);
        }
        // A request ended unfilled, named by its reply subject: the slots
        // of the messages it will not deliver come back.
        let number = message
            .subject
            .strip_prefix(self.inbox.as_str())
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.parse::<u64>().ok());
        let asked = number.and_then(|n| {
            let at = self.open.iter().position(|(m, _)| *m == n)?;
            self.open.remove(at).map(|(_, asked)| asked)
        });
        let pending = message
            .headers
            .as_ref()
            .and_then(|h| h.get(PENDING_MESSAGES))
            .and_then(|v| v.as_str().parse::<usize>().ok());
        let description = message.description.unwrap_or_default();
        let refused_for_room =
            status == StatusCode::REQUEST_TERMINATED && description.contains("Exceeded MaxWaiting");
        // A request refused outright delivered nothing: all it asked for.
        let unsent = pending.or(asked.filter(|_| refused_for_room));
        match (status, unsent) {
            (
                StatusCode::TIMEOUT | StatusCode::NOT_FOUND | StatusCode::REQUEST_TERMINATED,
                Some(n),
            ) if n <= self.requested.len() => {
                let kept = self.requested.len() - n;
                self.requested.truncate(kept);
                self.forget_filled();
                Ok(refused_for_room.then_some(PULL_BACKOFF))
            }
            _ => Err(BackendError::PullEnded {
                at: self.at.clone(),
                status,
                description: description.to_string(),
                unsent,
                requested: self.requested.len(),
            }),
        }
    }

    /// Forgets the oldest requests beyond what the slots still requested
    /// allow: they were filled.
    fn forget_filled(&mut self) {
        while self.open.len() > self.requested.len() {
            self.open.pop_front();
        }
    }
}

/// Header of a pull request's end: the messages it had yet to deliver.
const PENDING_MESSAGES: &str = "Nats-Pending-Messages";
/// The wait before the next pull request after the server had no room
/// for one (too many workers' requests waiting at once).
const PULL_BACKOFF: Duration = Duration::from_millis(50);

async fn serve_message(
    message: jetstream::Message,
    topic: &str,
    slot: OwnedSemaphorePermit,
    handler: TaskHandler,
) {
    let headers: HashMap<String, String> = message
        .headers
        .as_ref()
        .map(|h| {
            h.iter()
                .filter_map(|(k, v)| Some((k.to_string(), v.first()?.as_str().to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let (sequence, delivery) = message
        .info()
        .map(|i| (i.stream_sequence, u32::try_from(i.delivered).unwrap_or(1)))
        .unwrap_or((0, 1));
    let reply_to = headers.get(REPLY_HEADER).cloned();
    let received = Received {
        topic: topic.to_owned(),
        task_id: sequence,
        payload: message.payload.to_vec(),
        headers,
        delivery,
    };
    let Some(task) = received.take_at(unix_nanos()) else {
        // Nobody waits for it any more: taken off the queue, not worked on.
        tracing::debug!(%topic, sequence, "task expired in the queue; dropped");
        let _ = message.ack_with(AckKind::Term).await;
        return;
    };
    let deadline = task.deadline_unix_nanos;
    // The slot goes back on release or at the end, whichever comes first;
    // the acknowledgement only after the reply, so a worker lost while its
    // task waits on downstream hops leaves the task to be delivered again.
    let held = Arc::new(Mutex::new(Some(slot)));
    let release = {
        let held = held.clone();
        Release::callback(move || {
            lock(&held).take();
        })
    };
    let work = within_deadline(handler(task, release), deadline);
    // Long tasks tell the broker they are alive, so it does not redeliver.
    // The first signal is due one period from now: an interval's immediate
    // first tick is not immediate (tokio's timer rounds a deadline up to
    // its next millisecond), and awaiting it held every task back ~1 ms.
    let outcome = {
        let mut work = pin!(work);
        let every = ACK_WAIT / 3;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                outcome = &mut work => break outcome,
                _ = tick.tick() => {
                    let _ = message.ack_with(AckKind::Progress).await;
                }
            }
        }
    };
    if let Some(reply_to) = reply_to {
        let mut map = HeaderMap::new();
        for (k, v) in reply_headers(&outcome) {
            map.insert(k, v.as_str());
        }
        let payload = outcome.unwrap_or_default();
        if let Err(e) = message
            .context
            .client()
            .publish_with_headers(reply_to, map, payload.into())
            .await
        {
            tracing::warn!(%topic, "NATS reply: {e}");
        }
    }
    let _ = message.ack().await;
    lock(&held).take();
}

/// Per-topic statistics from the server: stream depth, messages stored
/// since the stream was made, deliveries, redeliveries, acks pending and
/// tasks expired (the advisories of terminated messages counted).
async fn stats(at: &BrokerAt, topics: &[String]) -> Result<Vec<pb::TopicStats>, BackendError> {
    let client = connect(at).await?;
    let js = jetstream::new(client);
    let mut out = Vec::new();
    for topic in topics {
        let stream_of = || format!("stream {}", stream_name(topic));
        let mut stream = js
            .get_stream(stream_name(topic))
            .await
            .map_err(|e| BackendError::unavailable(at, stream_of(), e))?;
        let state = stream
            .info()
            .await
            .map_err(|e| BackendError::unavailable(at, stream_of(), e))?
            .state
            .clone();
        let consumer = stream.consumer_info(CONSUMER).await.ok();
        let expired = match js.get_stream(expired_stream_name(topic)).await {
            Ok(mut s) => s.info().await.map_or(0, |i| i.state.last_sequence),
            Err(_) => 0,
        };
        out.push(pb::TopicStats {
            topic: topic.clone(),
            enqueued: state.last_sequence,
            expired,
            depth: state.messages,
            dispatched: consumer
                .as_ref()
                .map_or(0, |c| c.delivered.consumer_sequence),
            // Deliveries beyond the messages delivered: the consumer's
            // sequence counts every delivery, the stream's the last
            // message delivered (work-queue streams deliver in order).
            redelivered: consumer.as_ref().map_or(0, |c| {
                c.delivered
                    .consumer_sequence
                    .saturating_sub(c.delivered.stream_sequence)
            }),
            in_flight: consumer.as_ref().map_or(0, |c| c.num_ack_pending as u64),
            workers: consumer
                .as_ref()
                .map_or(0, |c| u32::try_from(c.num_waiting).unwrap_or(u32::MAX)),
            ..Default::default()
        });
    }
    Ok(out)
}
