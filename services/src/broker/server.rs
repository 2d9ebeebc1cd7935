//! The gRPC face of the broker: the `Broker` service (Submit, SubmitStream,
//! Work, Stats)
//! over the per-topic queues, and [`run`], which serves it beside gRPC
//! health and reflection and shuts down in three steps (refuse new submits,
//! drain for up to `drain_grace`, answer the rest UNAVAILABLE).

use std::{
    collections::HashMap,
    future::Future,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::{
    deadline::grpc_timeout, limits::MESSAGE_OVERHEAD, model::Transport,
    reflection::reflection_service, telemetry,
};
use futures::{FutureExt, StreamExt, stream::FuturesUnordered};
use tailmesh_proto::pb::{
    self,
    broker_server::{self, BrokerServer},
    submit_stream_reply, submit_stream_request, worker_message,
};
use tailmesh_units::{nanos, unix_nanos};
use tokio::{
    net::TcpListener,
    sync::{Notify, mpsc, oneshot, watch},
    time::Instant,
};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

use super::{
    BrokerConfig,
    error::{BrokerError, TaskError},
    queue::{NewTask, Topic},
};

/// Most unanswered tasks one SubmitStream may have; a task past it is
/// answered RESOURCE_EXHAUSTED at once. The broker never stops reading a
/// stream: tasks left unread pile up in HTTP/2's buffers, and h2 ends the
/// whole connection (GOAWAY `too_many_data_frames`) when small unread
/// frames outgrow its budget, failing every task on it. Far above a
/// topic's default capacity, so a topic's own bound answers first.
const STREAM_MAX_TASKS: usize = 65_536;
/// Answers buffered per SubmitStream before writing them waits on the
/// producer reading.
const STREAM_REPLY_BUFFER: usize = 256;
/// How long the gRPC server may take to close its connections once every
/// call is answered.
const SERVER_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Serves the broker on `listener` until `shutdown` resolves, then drains.
///
/// Besides `tailmesh.v1.Broker` it serves `grpc.health.v1.Health` (SERVING
/// for `""` and `"tailmesh.v1.Broker"` until shutdown begins, NOT_SERVING
/// after) and server reflection, which lists those three services only.
/// Connections idle for [`BrokerConfig::idle_timeout`] are closed; accept
/// errors are logged and retried with backoff.
///
/// Shutdown: new submits are answered UNAVAILABLE at once; queued and held
/// tasks keep being dispatched and answered for up to
/// [`BrokerConfig::drain_grace`]; whatever is still unanswered then gets
/// UNAVAILABLE, worker streams end with UNAVAILABLE, and the server closes.
pub async fn run(
    config: BrokerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BrokerError> {
    let broker = Arc::new(Broker::new(&config)?);
    let local = listener.local_addr().map_err(BrokerError::Listener)?;

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<BrokerServer<BrokerService>>().await;
    let reflection =
        reflection_service(&[broker_server::SERVICE_NAME]).map_err(BrokerError::Reflection)?;
    let limit = config.max_payload_bytes.saturating_add(MESSAGE_OVERHEAD);
    let service = BrokerServer::new(BrokerService(broker.clone()))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    // serve_with_incoming ignores Server::tcp_nodelay; the incoming stream
    // sets it instead.
    let tls = match &config.tls {
        Some(files) => Some(files.load().map_err(BrokerError::Tls)?.server),
        None => None,
    };
    let incoming = crate::incoming::accept(listener, "broker", config.idle_timeout, tls);
    let mut server = pin!(
        crate::link::server()
            .add_service(health_service)
            .add_service(reflection)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop_rx.await;
            })
    );
    tracing::info!(%local, topics = ?config.topics, "broker serving");

    tokio::select! {
        res = &mut server => return res.map_err(BrokerError::Serve),
        () = shutdown => {}
    }

    tracing::info!(%local, grace = ?config.drain_grace, "broker draining");
    // Refuse first, then report it: a NOT_SERVING health check implies it.
    for topic in broker.topics.values() {
        topic.stop_accepting();
    }
    health
        .set_not_serving::<BrokerServer<BrokerService>>()
        .await;
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    // The server keeps running meanwhile: workers must still reach us.
    tokio::select! {
        res = &mut server => return res.map_err(BrokerError::Serve),
        _ = tokio::time::timeout(config.drain_grace, broker.wait_idle()) => {}
    }

    for topic in broker.topics.values() {
        topic.close();
    }
    let _ = broker.closed.send(true);
    let _ = stop_tx.send(());
    match tokio::time::timeout(SERVER_CLOSE_GRACE, server).await {
        Ok(res) => res.map_err(BrokerError::Serve),
        Err(_) => {
            tracing::warn!(%local, "connections still open {SERVER_CLOSE_GRACE:?} after shutdown; leaving them");
            Ok(())
        }
    }
}

/// The broker's runtime state, shared by every call.
struct Broker {
    topics: HashMap<String, Arc<Topic>>,
    /// Topic names in configuration order, for stable listings.
    order: Vec<String>,
    max_payload: usize,
    next_task: AtomicU64,
    next_worker: AtomicU64,
    idle: Arc<Notify>,
    /// Becomes true when the broker closes; worker readers stop on it.
    closed: watch::Sender<bool>,
}

impl Broker {
    fn new(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let bad = |msg: String| Err(BrokerError::Config(msg));
        if config.topics.is_empty() {
            return bad("no topics: a broker needs at least one".into());
        }
        if config.queue_capacity == 0 {
            return bad("queue_capacity must be at least 1".into());
        }
        if config.queue_bytes < config.max_payload_bytes.max(1) {
            return bad(format!(
                "queue_bytes ({}) must be at least max_payload_bytes ({}), or a payload the broker accepts could never be queued",
                config.queue_bytes, config.max_payload_bytes
            ));
        }
        if config.max_deliveries == 0 {
            return bad("max_deliveries must be at least 1".into());
        }
        if let Some(name) = config
            .disciplines
            .keys()
            .find(|name| !config.topics.contains(name))
        {
            return bad(format!(
                "a discipline is set for topic {name:?}, which is not served"
            ));
        }
        let idle = Arc::new(Notify::new());
        let mut topics = HashMap::new();
        for name in &config.topics {
            if name.is_empty() {
                return bad("a topic name is empty".into());
            }
            let topic = Topic::new(
                name.clone(),
                config.queue_capacity,
                config.queue_bytes,
                config.max_deliveries,
                config.max_payload_bytes,
                config.disciplines.get(name).copied().unwrap_or_default(),
                idle.clone(),
            );
            if topics.insert(name.clone(), Arc::new(topic)).is_some() {
                return bad(format!("topic {name:?} is listed twice"));
            }
        }
        Ok(Broker {
            topics,
            order: config.topics.clone(),
            max_payload: config.max_payload_bytes,
            next_task: AtomicU64::new(1),
            next_worker: AtomicU64::new(1),
            idle,
            closed: watch::Sender::new(false),
        })
    }

    fn topic(&self, name: &str) -> Result<&Arc<Topic>, TaskError> {
        self.topics
            .get(name)
            .ok_or_else(|| TaskError::UnknownTopic {
                topic: name.to_owned(),
                served: self.order.join(", "),
            })
    }

    /// Resolves once no producer waits on any topic.
    async fn wait_idle(&self) {
        loop {
            let mut notified = pin!(self.idle.notified());
            // Registered before checking, so a wake-up in between is kept.
            notified.as_mut().enable();
            if self.topics.values().all(|t| t.is_idle()) {
                return;
            }
            notified.await;
        }
    }

    /// One task from enqueue to answer, for Submit calls and SubmitStream
    /// tasks alike: validates it, queues it, and waits for its answer or
    /// its deadline (the earlier of `req`'s absolute deadline and
    /// `timeout`). Dropping the future gives the task up.
    async fn submit(
        &self,
        req: pb::SubmitRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::SubmitReply, TaskError> {
        let topic = self.topic(&req.topic)?;
        if req.payload.len() > self.max_payload {
            return Err(TaskError::PayloadTooLarge {
                len: req.payload.len(),
                limit: self.max_payload,
            });
        }
        let (deadline, deadline_unix_nanos) = effective_deadline(req.deadline_unix_nanos, timeout);
        let id = self.next_task.fetch_add(1, Ordering::Relaxed);
        let (reply, mut answer) = oneshot::channel();
        let mut headers = req.headers;
        let (span, trace) = queue_wait_span(topic, req.trace.as_ref(), &mut headers).unzip();
        topic.submit(NewTask {
            id,
            payload: req.payload,
            headers,
            trace,
            span,
            deadline,
            deadline_unix_nanos,
            reply,
        })?;

        // Dropped with this future if the producer goes away first.
        let guard = AbandonOnDrop { topic, id };
        let answer = match deadline {
            None => (&mut answer).await,
            Some(deadline) => {
                tokio::select! {
                    biased;
                    a = &mut answer => a,
                    () = tokio::time::sleep_until(deadline) => {
                        // Answers DEADLINE_EXCEEDED unless an answer won the race.
                        topic.expire(id);
                        (&mut answer).await
                    }
                }
            }
        };
        // Answered: nothing to give up (the guard owns no memory).
        std::mem::forget(guard);
        answer.unwrap_or(Err(TaskError::Unanswered { task: id }))
    }
}

/// The queue-wait span of a traced task (enqueue to dispatch), child of
/// the producer's context (`trace`, or else a `traceparent` in
/// `headers`, which is then taken out), and its context, the worker's
/// span's parent. `None` for an untraced task.
fn queue_wait_span(
    topic: &Topic,
    trace: Option<&pb::TraceContext>,
    headers: &mut HashMap<String, String>,
) -> Option<(telemetry::TraceSpan, pb::TraceContext)> {
    use opentelemetry::trace::SpanKind;
    let parent = match trace {
        Some(t) => telemetry::wire_context(t),
        None => telemetry::take_from_headers(headers),
    };
    parent?;
    // The broker serves many hops: each span names its own (the variant
    // is the process's resource).
    let span = telemetry::TraceSpan::start(
        SpanKind::Internal,
        || parent,
        || {
            let (name, hop) = topic.span_names();
            (
                name.into(),
                telemetry::SpanFields {
                    hop: Some(hop),
                    transport: Some(Transport::Pull),
                    ..telemetry::SpanFields::default()
                },
            )
        },
    );
    let cx = span.context()?;
    Some((span, telemetry::wire(&cx)))
}

/// The tonic service over a [`Broker`].
#[derive(Clone)]
struct BrokerService(Arc<Broker>);

#[tonic::async_trait]
impl pb::broker_server::Broker for BrokerService {
    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitReply>, Status> {
        let timeout = grpc_timeout(request.metadata());
        let reply = self.0.submit(request.into_inner(), timeout).await?;
        Ok(Response::new(reply))
    }

    type SubmitStreamStream = ReceiverStream<Result<pb::SubmitStreamReply, Status>>;

    async fn submit_stream(
        &self,
        request: Request<Streaming<pb::SubmitStreamRequest>>,
    ) -> Result<Response<Self::SubmitStreamStream>, Status> {
        let (tx, rx) = mpsc::channel(STREAM_REPLY_BUFFER);
        tokio::spawn(serve_submit_stream(
            self.0.clone(),
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type WorkStream = UnboundedReceiverStream<Result<pb::BrokerMessage, Status>>;

    async fn work(
        &self,
        request: Request<Streaming<pb::WorkerMessage>>,
    ) -> Result<Response<Self::WorkStream>, Status> {
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(pb::WorkerMessage {
                kind: Some(worker_message::Kind::Hello(hello)),
            }) => hello,
            Some(other) => {
                let got = kind_name(other.kind.as_ref());
                return Err(TaskError::Protocol(format!(
                    "a Work stream must start with a Hello, got {got}"
                ))
                .into());
            }
            None => {
                return Err(
                    TaskError::Protocol("Work stream ended before its Hello".into()).into(),
                );
            }
        };
        let broker = self.0.clone();
        let topic = broker.topic(&hello.topic)?.clone();
        let id = broker.next_worker.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        // Unbounded is bounded in practice: the broker sends at most one
        // task per credit, plus rare rejection notices.
        topic.add_worker(id, hello.worker.clone(), hello.credits, tx)?;
        tracing::debug!(topic = topic.name(), worker = %hello.worker, id, credits = hello.credits, "worker joined");
        tokio::spawn(read_worker(broker, topic, id, hello.worker, inbound));
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }

    async fn stats(
        &self,
        request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsReply>, Status> {
        let broker = &self.0;
        let name = request.into_inner().topic;
        let topics = if name.is_empty() {
            broker
                .order
                .iter()
                .filter_map(|n| broker.topics.get(n))
                .map(|t| t.stats())
                .collect()
        } else {
            vec![broker.topic(&name)?.stats()]
        };
        Ok(Response::new(pb::StatsReply { topics }))
    }
}

/// Serves one SubmitStream: reads every task as it arrives, runs
/// each through [`Broker::submit`] concurrently, and writes each answer
/// under its task's id as soon as it is ready.
///
/// Ends when the producer half-closed and every task is answered, or at
/// once (giving up the unanswered tasks, as a dropped Submit call does)
/// when the stream breaks or the producer stops reading replies. At
/// shutdown it writes the answers the broker gave and ends UNAVAILABLE.
async fn serve_submit_stream(
    broker: Arc<Broker>,
    mut inbound: Streaming<pb::SubmitStreamRequest>,
    tx: mpsc::Sender<Result<pb::SubmitStreamReply, Status>>,
) {
    let broker = &*broker;
    let mut closed = broker.closed.subscribe();
    // Dropping a task's sender cancels it; only unanswered tasks have one.
    let mut cancels: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
    let mut running = FuturesUnordered::new();
    let mut reading = true;
    let end = loop {
        if !reading && running.is_empty() {
            break None;
        }
        tokio::select! {
            biased;
            Some((id, answer)) = running.next() => {
                let Some(answer) = answer else {
                    continue; // cancelled: nobody waits for it
                };
                cancels.remove(&id);
                if tx.send(Ok(stream_reply(id, answer))).await.is_err() {
                    break None;
                }
            }
            msg = inbound.message(), if reading => {
                let msg = match msg {
                    Ok(Some(msg)) => msg,
                    Ok(None) => {
                        reading = false;
                        continue;
                    }
                    Err(status) => {
                        tracing::debug!(%status, "submit stream broke");
                        break None;
                    }
                };
                let id = msg.id;
                match msg.kind {
                    Some(submit_stream_request::Kind::Submit(req)) => {
                        if cancels.contains_key(&id) {
                            break Some(Status::from(TaskError::Protocol(format!(
                                "task id {id} is already in use by an unanswered task on this stream"
                            ))));
                        }
                        if running.len() >= STREAM_MAX_TASKS {
                            let full = TaskError::StreamFull { limit: STREAM_MAX_TASKS };
                            if tx.send(Ok(stream_reply(id, Err(full)))).await.is_err() {
                                break None;
                            }
                            continue;
                        }
                        let (cancel, cancelled) = oneshot::channel::<()>();
                        cancels.insert(id, cancel);
                        let timeout = (msg.timeout_ns != 0).then(|| Duration::from_nanos(msg.timeout_ns));
                        running.push(async move {
                            tokio::select! {
                                biased;
                                answer = broker.submit(req, timeout) => (id, Some(answer)),
                                _ = cancelled => (id, None),
                            }
                        });
                    }
                    Some(submit_stream_request::Kind::Cancel(_)) => {
                        cancels.remove(&id);
                    }
                    None => {
                        break Some(Status::from(TaskError::Protocol(format!(
                            "request {id} carries neither a task nor a cancel"
                        ))));
                    }
                }
            }
            () = async { let _ = closed.wait_for(|c| *c).await; } => {
                // Closing answered every task: pass on what is ready.
                while let Some(Some((id, answer))) = running.next().now_or_never() {
                    let Some(answer) = answer else { continue };
                    if tx.send(Ok(stream_reply(id, answer))).await.is_err() {
                        break;
                    }
                }
                break Some(Status::unavailable("broker is shutting down"));
            }
            () = tx.closed() => break None,
        }
    };
    // Whatever is still running is given up here, as a dropped Submit is.
    drop(running);
    if let Some(status) = end {
        let _ = tx.send(Err(status)).await;
    }
}

/// A task's answer as a SubmitStream reply.
fn stream_reply(id: u64, answer: Result<pb::SubmitReply, TaskError>) -> pb::SubmitStreamReply {
    let result = match answer {
        Ok(reply) => submit_stream_reply::Result::Reply(reply),
        Err(err) => {
            // The same mapping a Submit call's status goes through.
            let status = Status::from(err);
            submit_stream_reply::Result::Error(pb::TaskStatus {
                code: status.code() as i32,
                message: status.message().to_owned(),
            })
        }
    };
    pb::SubmitStreamReply {
        id,
        result: Some(result),
    }
}

/// Reads one worker stream after its Hello until it ends, breaks, or the
/// broker closes; then gives the worker's held tasks back to the queue.
async fn read_worker(
    broker: Arc<Broker>,
    topic: Arc<Topic>,
    id: u64,
    name: String,
    mut inbound: Streaming<pb::WorkerMessage>,
) {
    let mut closed = broker.closed.subscribe();
    loop {
        let msg = tokio::select! {
            msg = inbound.message() => msg,
            _ = closed.wait_for(|c| *c) => break,
        };
        match msg {
            Ok(Some(msg)) => {
                topic.on_message(id, msg, broker.next_task.load(Ordering::Relaxed));
            }
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(topic = topic.name(), worker = %name, id, %status, "worker stream broke");
                break;
            }
        }
    }
    topic.remove_worker(id);
    tracing::debug!(topic = topic.name(), worker = %name, id, "worker left");
}

/// Gives a producer's task up when its Submit future is dropped unanswered
/// (the client cancelled, or tonic's own grpc-timeout fired first).
struct AbandonOnDrop<'a> {
    topic: &'a Topic,
    id: u64,
}

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        self.topic.abandon(self.id);
    }
}

/// The earlier of an absolute wall-clock deadline (0 = none) and a
/// grpc-timeout, as a tokio instant and as wall-clock nanoseconds.
fn effective_deadline(
    deadline_unix_nanos: u64,
    timeout: Option<Duration>,
) -> (Option<Instant>, u64) {
    if deadline_unix_nanos == 0 && timeout.is_none() {
        return (None, 0);
    }
    // Wall clock read once, to put the unix deadline on tokio time: later checks ignore clock steps.
    let now = Instant::now();
    let unix_now = unix_nanos();
    let from_timeout = timeout.map(|t| unix_now.saturating_add(nanos(t)));
    let unix = match (deadline_unix_nanos, from_timeout) {
        (0, Some(t)) => t,
        (d, Some(t)) => d.min(t),
        (d, None) => d,
    };
    let remaining = Duration::from_nanos(unix.saturating_sub(unix_now));
    (
        Some(
            now.checked_add(remaining)
                .unwrap_or(now + Duration::from_secs(86_400 * 365)),
        ),
        unix,
    )
}

fn kind_name(kind: Option<&worker_message::Kind>) -> &'static str {
    match kind {
        Some(worker_message::Kind::Hello(_)) => "Hello",
        Some(worker_message::Kind::Credit(_)) => "Credit",
        Some(worker_message::Kind::Result(_)) => "TaskResult",
        Some(worker_message::Kind::Drain(_)) => "Drain",
        Some(worker_message::Kind::Release(_)) => "Release",
        None => "an empty message",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deadline_is_the_earlier_of_both() {
        let unix_now = unix_nanos();
        let far = unix_now + 60_000_000_000;
        let (at, unix) = effective_deadline(far, Some(Duration::from_millis(10)));
        assert!(unix < far);
        assert!(at.expect("a deadline") <= Instant::now() + Duration::from_millis(11));
        let (_, unix) = effective_deadline(far, None);
        assert_eq!(unix, far);
        assert_eq!(effective_deadline(0, None), (None, 0));
    }
}
