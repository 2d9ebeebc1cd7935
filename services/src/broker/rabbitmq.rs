//! RabbitMQ (AMQP 0-9-1) as a pull backend.
//!
//! - **A queue per pulled hop**: `tm.<hop>`, not durable, at most the
//!   hop's [`QueueBounds`] of messages (`x-max-length`) and of body bytes
//!   (`x-max-length-bytes`) with `x-overflow = reject-publish`: producers
//!   publish with confirms, and a refused publish (a nack) is answered
//!   RESOURCE_EXHAUSTED. A queue already declared with other bounds is
//!   not changed (RabbitMQ refuses a redeclare with other arguments): the
//!   declare is answered FAILED_PRECONDITION, naming the queue.
//! - **Credit**: each worker consumes on its own channel with `basic.qos`
//!   prefetch equal to its credit (the hop's `concurrency`), so the broker
//!   has at most that many unreleased tasks out at the worker.
//! - **Acknowledgement** after the reply is sent, also for a hop that
//!   releases its credit while it waits on downstream hops (the prefetch
//!   grows by the tasks released and not yet acknowledged: `Credit`);
//!   unacknowledged tasks of a worker whose channel closes (a crash, a
//!   kill) are requeued by the broker and delivered again (a classic queue
//!   sets no limit on redeliveries).
//! - **Replies** through direct reply-to (`amq.rabbitmq.reply-to`): no
//!   reply queue, the producer's channel consumes its own pseudo-queue.
//! - **Deadlines**: the remaining deadline becomes the message's
//!   `expiration`, so RabbitMQ drops a task that expires in the queue; the
//!   worker checks the absolute deadline header too and rejects a task past
//!   it unprocessed. Both dead-letter the task to the hop's expired queue
//!   (`tm.<hop>.expired`), whose depth is the `expired` count of the hop's
//!   statistics; it keeps those tasks until the server stops.

use std::{
    collections::HashMap,
    pin::pin,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::BoxFuture};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm,
    message::Delivery,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
        BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
    },
    protocol::{AMQPErrorKind, AMQPSoftError},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use tailmesh_proto::pb;
use tailmesh_units::unix_nanos;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::{
    pull::{
        BackendError, BrokerAt, PullBackend, Release, SessionEnd, Shutdown, TaskHandler,
        WorkerSpec, reply_within,
    },
    wire::{
        CODE_HEADER, Deadline, MESSAGE_HEADER, Received, reply_headers, reply_of, task_headers,
        within_deadline,
    },
};
use crate::{addr::PeerAddr, model::QueueBounds};

/// Most tasks a worker tracks at once (its prefetch bounds those it has
/// not acknowledged; acknowledged ones waiting on downstream hops add).
const TASKS_HELD: u32 = 1 << 20;
/// Direct reply-to's pseudo-queue.
const REPLY_TO: &str = "amq.rabbitmq.reply-to";
/// User and password the launcher's broker and the deployments' images
/// are given.
pub const USER: &str = "tailmesh";
/// See [`USER`].
pub const PASSWORD: &str = "tailmesh";

/// The queue of a hop's tasks.
pub fn queue_name(topic: &str) -> String {
    format!("tm.{topic}")
}

/// The AMQP URI of the broker at `addr`, with tailmesh's user.
pub fn uri(addr: &PeerAddr) -> String {
    format!("amqp://{USER}:{PASSWORD}@{addr}/%2f")
}

/// The heartbeat a producer made for one call asks for: a connection whose
/// close was lost (its process killed mid-call) is dropped by the broker
/// within two of them.
pub const PER_CALL_HEARTBEAT: Duration = Duration::from_secs(1);

/// RabbitMQ at `addr`, as errors name it.
fn at(addr: &PeerAddr) -> BrokerAt {
    BrokerAt {
        name: "RabbitMQ",
        addr: addr.clone(),
    }
}

fn unavailable(at: &BrokerAt, what: impl Into<String>, e: lapin::Error) -> BackendError {
    BackendError::unavailable(at, what, e)
}

async fn connect(at: &BrokerAt) -> Result<Connection, BackendError> {
    connect_with(at, None).await
}

/// Connects with `heartbeat` (whole seconds, at least 1) instead of the
/// broker's.
async fn connect_with(
    at: &BrokerAt,
    heartbeat: Option<Duration>,
) -> Result<Connection, BackendError> {
    let mut uri = uri(&at.addr);
    if let Some(every) = heartbeat {
        uri.push_str(&format!("?heartbeat={}", every.as_secs().max(1)));
    }
    Connection::connect(&uri, ConnectionProperties::default())
        .await
        .map_err(|e| unavailable(at, "connect", e))
}

/// The queue that keeps a hop's expired tasks, only to count them.
pub fn expired_queue_name(topic: &str) -> String {
    format!("tm.{topic}.expired")
}

/// Declares the hop's queue (idempotent: every producer and worker asks for
/// the same) and the queue its expired tasks are dead-lettered to; returns
/// the hop queue's depth and consumers, and the expired tasks so far. A
/// hop queue that exists with other arguments (other `bounds`) is
/// FAILED_PRECONDITION.
async fn declare(
    channel: &Channel,
    at: &BrokerAt,
    bounds: QueueBounds,
    topic: &str,
) -> Result<(u32, u32, u32), BackendError> {
    let expired = channel
        .queue_declare(
            expired_queue_name(topic).into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| {
            unavailable(
                at,
                format!("declare queue {}", expired_queue_name(topic)),
                e,
            )
        })?;
    let mut args = FieldTable::default();
    args.insert(
        "x-max-length".into(),
        AMQPValue::LongLongInt(i64::from(bounds.capacity)),
    );
    args.insert(
        "x-max-length-bytes".into(),
        AMQPValue::LongLongInt(i64::try_from(bounds.bytes).unwrap_or(i64::MAX)),
    );
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    // A task past its `expiration` in the queue, or dropped unprocessed by
    // a worker that found its deadline passed, is dead-lettered to the
    // expired queue, whose depth counts them.
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(expired_queue_name(topic).as_str().into()),
    );
    let queue = channel
        .queue_declare(
            queue_name(topic).into(),
            QueueDeclareOptions::default(),
            args,
        )
        .await
        .map_err(|e| {
            let name = queue_name(topic);
            if precondition_failed(&e) {
                BackendError::OtherBounds {
                    at: at.clone(),
                    queue: format!("queue {name}"),
                    bounds,
                    source: Some(e.into()),
                }
            } else {
                unavailable(at, format!("declare queue {name}"), e)
            }
        })?;
    Ok((
        queue.message_count(),
        queue.consumer_count(),
        expired.message_count(),
    ))
}

/// Whether RabbitMQ refused a declare whose arguments differ from the
/// existing queue's.
fn precondition_failed(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp)
        if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)))
}

fn header_map(properties: &BasicProperties) -> HashMap<String, String> {
    let Some(table) = properties.headers() else {
        return HashMap::new();
    };
    table
        .inner()
        .iter()
        .filter_map(|(k, v)| {
            let v = match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.as_str().to_owned(),
                _ => return None,
            };
            Some((k.as_str().to_owned(), v))
        })
        .collect()
}

fn field_table<K: AsRef<str>, V: AsRef<str>>(
    entries: impl IntoIterator<Item = (K, V)>,
) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in entries {
        table.insert(
            ShortString::from(k.as_ref()),
            AMQPValue::LongString(LongString::from(v.as_ref().as_bytes().to_vec())),
        );
    }
    table
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

type Waiters = Mutex<HashMap<u64, oneshot::Sender<Delivery>>>;

/// Replies through direct reply-to (`amq.rabbitmq.reply-to`), RabbitMQ's
/// request/reply without a reply queue: the channel that publishes
/// requests consumes its own pseudo-queue, and each reply goes to the
/// request whose correlation id it carries. Requests and replies need not
/// alternate: any number can wait at once.
#[derive(Debug)]
pub struct DirectReplies {
    waiters: Arc<Waiters>,
    next_id: AtomicU64,
    /// Set when the reply consumer ended (its channel or connection closed).
    ended: Arc<AtomicBool>,
}

impl DirectReplies {
    /// Starts consuming `channel`'s replies (with automatic
    /// acknowledgement, as direct reply-to requires) on a task of the
    /// current runtime; requests must be published on the same channel.
    pub async fn consume(channel: &Channel) -> Result<Self, lapin::Error> {
        let mut replies = channel
            .basic_consume(
                REPLY_TO.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let waiters: Arc<Waiters> = Arc::default();
        let ended = Arc::new(AtomicBool::new(false));
        let (routing, ending) = (waiters.clone(), ended.clone());
        tokio::spawn(async move {
            while let Some(Ok(reply)) = replies.next().await {
                let id = reply
                    .properties
                    .correlation_id()
                    .as_ref()
                    .and_then(|c| c.as_str().parse::<u64>().ok());
                if let Some(tx) = id.and_then(|id| lock(&routing).remove(&id)) {
                    let _ = tx.send(reply);
                }
            }
            ending.store(true, Ordering::Release);
            // Whoever still waits learns it now, not at its deadline.
            lock(&routing).clear();
        });
        Ok(DirectReplies {
            waiters,
            next_id: AtomicU64::new(0),
            ended,
        })
    }

    /// Whether the reply consumer ended: no more replies will come.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// A new request: the properties to publish it with (reply-to and a
    /// fresh correlation id; add others to them) and its reply to wait on.
    pub fn request(&self) -> (BasicProperties, PendingReply<'_>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiters).insert(id, tx);
        let properties = BasicProperties::default()
            .with_reply_to(REPLY_TO.into())
            .with_correlation_id(id.to_string().into());
        (
            properties,
            PendingReply {
                waiters: &self.waiters,
                id,
                reply: rx,
            },
        )
    }
}

/// The reply a request waits for; dropping it forgets the request.
#[derive(Debug)]
pub struct PendingReply<'a> {
    waiters: &'a Waiters,
    id: u64,
    reply: oneshot::Receiver<Delivery>,
}

impl PendingReply<'_> {
    /// The reply, or `None` if the reply consumer ended first.
    pub async fn received(mut self) -> Option<Delivery> {
        (&mut self.reply).await.ok()
    }
}

impl Drop for PendingReply<'_> {
    fn drop(&mut self) {
        lock(self.waiters).remove(&self.id);
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        // Closed politely, so the broker does not log a lost client, and
        // this side's I/O loop ends now rather than when the broker stops.
        if let (Ok(runtime), Some(connection)) = (
            tokio::runtime::Handle::try_current(),
            self.connection.take(),
        ) {
            runtime.spawn(async move {
                let _ = connection.close(200, "done".into()).await;
            });
        }
    }
}

/// Most publishes a producer keeps awaiting their confirms; the next
/// publish waits for room (so a flood cannot grow memory).
const PUBLISH_WINDOW: usize = 1024;

/// A publish's confirm, awaited by its submit or, once the reply came
/// first, on a task of its own; it holds its room in the producer's
/// window until the broker confirms. (lapin keeps an unresolved confirm
/// dropped unawaited until the channel's `wait_for_confirms`, which a
/// producer never calls, so none is dropped unresolved.)
struct Confirming {
    /// `None` once resolved.
    confirm: Option<PublisherConfirm>,
    /// Given back once the confirm came.
    room: Option<OwnedSemaphorePermit>,
}

impl Confirming {
    /// The confirm (`NotRequested` once it was returned).
    async fn next(&mut self) -> Result<Confirmation, lapin::Error> {
        let Some(confirm) = self.confirm.as_mut() else {
            return Ok(Confirmation::NotRequested);
        };
        let confirmed = confirm.await;
        self.confirm = None;
        self.room = None;
        confirmed
    }
}

impl Drop for Confirming {
    fn drop(&mut self) {
        if let (Some(confirm), Ok(runtime)) =
            (self.confirm.take(), tokio::runtime::Handle::try_current())
        {
            let room = self.room.take();
            runtime.spawn(async move {
                let _ = confirm.await;
                drop(room);
            });
        }
    }
}

/// A producer's connection and channel, consuming its direct reply-to.
struct Connected {
    /// Taken only by `drop`, to close it.
    connection: Option<Connection>,
    channel: Channel,
    /// Room for the publishes awaiting confirms ([`PUBLISH_WINDOW`]).
    window: Arc<Semaphore>,
    /// When they end, the next submit reconnects.
    replies: DirectReplies,
    declared: Mutex<Vec<String>>,
}

/// RabbitMQ at one address: the producer side over one AMQP connection and
/// channel, opened on first use (and again after it broke); each worker
/// session connects on its own.
pub(crate) struct RabbitBackend {
    at: BrokerAt,
    bounds: QueueBounds,
    /// The heartbeat a producer asks for; `None`: the broker's.
    heartbeat: Option<Duration>,
    conn: tokio::sync::Mutex<Option<Arc<Connected>>>,
}

impl std::fmt::Debug for RabbitBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitBackend")
            .field("at", &self.at)
            .field("bounds", &self.bounds)
            .finish()
    }
}

impl RabbitBackend {
    /// The RabbitMQ broker at `addr` whose hop queues are declared with
    /// `bounds`; a producer connects on first submit.
    pub(crate) fn new(addr: &PeerAddr, bounds: QueueBounds) -> Self {
        RabbitBackend {
            at: at(addr),
            bounds,
            heartbeat: None,
            conn: tokio::sync::Mutex::default(),
        }
    }

    /// The backend's producer asking for a heartbeat `every` (whole
    /// seconds, at least 1) instead of the broker's 60 s.
    pub(crate) fn with_heartbeat(self, every: Duration) -> Self {
        RabbitBackend {
            heartbeat: Some(every),
            ..self
        }
    }

    /// Closes the producer's connection, if it opened one, and waits for
    /// the broker to confirm (connection.close-ok); a submit still waiting
    /// on it fails UNAVAILABLE. A connection a submit still uses is closed
    /// when that submit is done.
    async fn close_producer(&self) {
        let connected = self.conn.lock().await.take();
        let Some(mut connected) = connected.and_then(Arc::into_inner) else {
            return;
        };
        if let Some(connection) = connected.connection.take() {
            let _ = connection.close(200, "done".into()).await;
        }
    }

    async fn connected(&self) -> Result<Arc<Connected>, BackendError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.replies.ended()) {
            return Ok(c.clone());
        }
        let at = &self.at;
        let connection = connect_with(at, self.heartbeat).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| unavailable(at, "channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| unavailable(at, "confirm.select", e))?;
        let replies = DirectReplies::consume(&channel)
            .await
            .map_err(|e| unavailable(at, "consume direct reply-to", e))?;
        let connected = Arc::new(Connected {
            connection: Some(connection),
            channel,
            window: Arc::new(Semaphore::new(PUBLISH_WINDOW)),
            replies,
            declared: Mutex::default(),
        });
        *slot = Some(connected.clone());
        Ok(connected)
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
        let at = &self.at;
        let wait = async {
            let c = self.connected().await?;
            if !lock(&c.declared).iter().any(|t| t == topic) {
                declare(&c.channel, at, self.bounds, topic).await?;
                lock(&c.declared).push(topic.to_owned());
            }
            let (properties, pending) = c.replies.request();
            let mut properties =
                properties.with_headers(field_table(task_headers(headers, deadline)));
            if let Some(d) = deadline {
                // What is left of it now, in whole milliseconds, at least
                // one: "0" would expire at once.
                let left = Duration::from_nanos(d.unix_nanos.saturating_sub(unix_nanos()));
                let ms = left.as_millis().max(1);
                properties = properties.with_expiration(ms.to_string().into());
            }
            let room = c
                .window
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| BackendError::unavailable(at, "publish window", e))?;
            let confirm = c
                .channel
                .basic_publish(
                    "".into(),
                    queue_name(topic).into(),
                    BasicPublishOptions::default(),
                    &payload,
                    properties,
                )
                .await
                .map_err(|e| unavailable(at, "publish", e))?;
            let mut confirming = Confirming {
                confirm: Some(confirm),
                room: Some(room),
            };
            // The confirm and the reply are awaited together: a reply
            // means the task was queued, whichever comes first, and a nack
            // answers at once.
            let mut received = pin!(pending.received());
            let reply = loop {
                tokio::select! {
                    reply = &mut received => break reply,
                    confirmed = confirming.next(), if confirming.confirm.is_some() => {
                        let confirmed =
                            confirmed.map_err(|e| unavailable(at, "publish confirm", e))?;
                        if let Confirmation::Nack(_) = confirmed {
                            return Err(BackendError::Full {
                                at: at.clone(),
                                topic: topic.to_owned(),
                                bounds: self.bounds,
                            });
                        }
                    }
                }
            };
            drop(confirming);
            let reply = reply.ok_or_else(|| BackendError::Ended {
                at: at.clone(),
                what: "the reply consumer",
            })?;
            let headers = header_map(&reply.properties);
            reply_of(
                headers.get(CODE_HEADER).map(String::as_str),
                headers.get(MESSAGE_HEADER).map(String::as_str),
                reply.data,
            )
            .map_err(BackendError::Answered)
        };
        reply_within(at, topic, deadline, wait).await
    }
}

impl PullBackend for RabbitBackend {
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
        stats(&self.at, self.bounds, topics).boxed()
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
    let prefetch = u16::try_from(spec.credits).unwrap_or(u16::MAX);
    let session = async {
        let connection = connect(at).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| unavailable(at, "channel", e))?;
        declare(&channel, at, spec.bounds, topic).await?;
        let credit = Arc::new(Credit::new(channel.clone(), prefetch));
        credit
            .apply()
            .await
            .map_err(|e| unavailable(at, "basic.qos", e))?;
        let consumer = channel
            .basic_consume(
                queue_name(topic).into(),
                worker.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| unavailable(at, "consume", e))?;
        tracing::debug!(broker = %at, %topic, %worker, prefetch, "RabbitMQ worker connected");
        Ok::<_, BackendError>((connection, channel, credit, consumer))
    };
    let (connection, channel, credit, mut consumer) = tokio::select! {
        connected = session => match connected {
            Ok(c) => c,
            Err(why) => return SessionEnd::Unreachable(why),
        },
        () = shutdown.fired() => return SessionEnd::ShutDown,
    };
    // One permit per task held, to wait for them at shutdown (the
    // broker's prefetch is the credit).
    let in_flight = Arc::new(tokio::sync::Semaphore::new(TASKS_HELD as usize));
    loop {
        tokio::select! {
            () = shutdown.fired() => {
                // Stop taking tasks; finish and answer those held.
                let _ = channel
                    .basic_cancel(worker.as_str().into(), Default::default())
                    .await;
                let _ = in_flight.acquire_many(TASKS_HELD).await;
                let _ = connection.close(200, "shutdown".into()).await;
                return SessionEnd::ShutDown;
            }
            next = consumer.next() => match next {
                Some(Ok(delivery)) => {
                    let Ok(slot) = in_flight.clone().try_acquire_owned() else {
                        let _ = delivery.acker.reject(BasicRejectOptions { requeue: true }).await;
                        continue;
                    };
                    let (channel, credit) = (channel.clone(), credit.clone());
                    let (handler, topic) = (handler.clone(), topic.clone());
                    tokio::spawn(async move {
                        serve_delivery(channel, credit, delivery, &topic, handler).await;
                        drop(slot);
                    });
                }
                Some(Err(e)) => return SessionEnd::Lost(unavailable(at, "consume", e)),
                None => {
                    return SessionEnd::Lost(BackendError::Ended { at: at.clone(), what: "the consumer" });
                }
            },
        }
    }
}

/// A worker's credit on its channel: the channel's prefetch (`basic.qos`,
/// for the whole channel, which RabbitMQ applies at once when it changes)
/// is the credit plus the tasks released but not yet acknowledged. So a
/// task released while it waits on downstream hops frees its credit for
/// the next task, yet stays unacknowledged, to be delivered again if the
/// worker is lost before its reply.
struct Credit {
    channel: Channel,
    credits: u16,
    released: Mutex<u16>,
    /// Orders the `basic.qos` calls: each sends the count as it is then,
    /// so the last one sent holds the latest.
    sending: tokio::sync::Mutex<()>,
}

impl Credit {
    fn new(channel: Channel, credits: u16) -> Self {
        Credit {
            channel,
            credits,
            released: Mutex::new(0),
            sending: tokio::sync::Mutex::new(()),
        }
    }

    /// Sends the prefetch the count asks for now.
    async fn apply(&self) -> Result<(), lapin::Error> {
        let _order = self.sending.lock().await;
        let prefetch = self.credits.saturating_add(*lock(&self.released));
        self.channel
            .basic_qos(prefetch, BasicQosOptions { global: true })
            .await
    }

    /// One task's credit freed before its acknowledgement: counted now
    /// (before [`Credit::settle`] can run), sent by the caller's `apply`.
    fn release(&self) {
        *lock(&self.released) += 1;
    }

    /// A released task about to be acknowledged: the prefetch shrinks
    /// first, so the acknowledgement does not open a slot beyond the credit.
    async fn settle(&self) {
        {
            let mut released = lock(&self.released);
            *released = released.saturating_sub(1);
        }
        let _ = self.apply().await;
    }
}

async fn serve_delivery(
    channel: Channel,
    credit: Arc<Credit>,
    delivery: Delivery,
    topic: &str,
    handler: TaskHandler,
) {
    let acker = delivery.acker.clone();
    let reply_to = delivery.properties.reply_to().clone();
    let correlation = delivery.properties.correlation_id().clone();
    let received = Received {
        topic: topic.to_owned(),
        task_id: delivery.delivery_tag,
        headers: header_map(&delivery.properties),
        payload: delivery.data,
        delivery: if delivery.redelivered { 2 } else { 1 },
    };
    let Some(task) = received.take_at(unix_nanos()) else {
        // Nobody waits for it any more: dead-lettered to the expired
        // queue (counted there), not worked on.
        tracing::debug!(%topic, "task expired in the queue; dropped");
        let _ = acker.reject(BasicRejectOptions { requeue: false }).await;
        return;
    };
    let deadline = task.deadline_unix_nanos;
    let released = Arc::new(AtomicBool::new(false));
    let release = {
        let (credit, released) = (credit.clone(), released.clone());
        Release::callback(move || {
            if !released.swap(true, Ordering::AcqRel) {
                credit.release();
                tokio::spawn(async move {
                    let _ = credit.apply().await;
                });
            }
        })
    };
    let outcome = within_deadline(handler(task, release), deadline).await;
    if let Some(reply_to) = reply_to {
        let mut properties =
            BasicProperties::default().with_headers(field_table(reply_headers(&outcome)));
        if let Some(c) = correlation {
            properties = properties.with_correlation_id(c);
        }
        let payload = outcome.unwrap_or_default();
        let published = channel
            .basic_publish(
                "".into(),
                reply_to,
                BasicPublishOptions::default(),
                &payload,
                properties,
            )
            .await;
        if let Err(e) = published {
            tracing::warn!(%topic, "RabbitMQ reply: {e}");
        }
    }
    if released.swap(true, Ordering::AcqRel) {
        credit.settle().await;
    }
    let _ = acker.ack(BasicAckOptions::default()).await;
}

/// Per-topic statistics RabbitMQ tells any client (without its management
/// plugin): the queue's depth and consumers now, and the tasks expired so
/// far (the depth of its expired queue).
async fn stats(
    at: &BrokerAt,
    bounds: QueueBounds,
    topics: &[String],
) -> Result<Vec<pb::TopicStats>, BackendError> {
    let connection = connect(at).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| unavailable(at, "channel", e))?;
    let mut out = Vec::new();
    for topic in topics {
        let (depth, consumers, expired) = declare(&channel, at, bounds, topic).await?;
        out.push(pb::TopicStats {
            topic: topic.clone(),
            depth: u64::from(depth),
            workers: consumers,
            expired: u64::from(expired),
            ..Default::default()
        });
    }
    let _ = connection.close(200, "stats read".into()).await;
    Ok(out)
}
