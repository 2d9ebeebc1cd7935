//! The hop's request handler ([`HopCore`]), its gRPC face, and [`run`].

use std::{future::Future, sync::Arc, time::Duration};

use prost::Message;
use serde::{Deserialize, Serialize};
use tailmesh_model::calls::Calls;
use tailmesh_proto::pb::{
    CallReply, CallRequest, ClientStreamReply, control_server,
    hop_server::{self, Hop, HopServer},
};
use tailmesh_units::unix_nanos;
use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{
    call::{
        CallStack, Reach,
        reach::{ReachError, ReachPlan},
    },
    error::{CallError, HopError},
    policy::ClientPolicy,
    serve::{
        self, FanOutLayer, FaultLayer, HopRequest, RecordLayer, ServerSpanLayer, SlotLayer,
        SpanStart, Work, fan_out::Downstream, faults::Behavior,
    },
    service::ServiceClient,
    slots::Slots,
    stream::{Served, Streams},
};
use crate::{
    addr::PeerAddr,
    broker::{BrokerError, Release, Task, WorkerOptions, backend::run_backend_worker},
    deadline::grpc_timeout,
    discipline::Discipline,
    incoming::DEFAULT_IDLE_TIMEOUT,
    limits::{DEFAULT_QUEUE_LIMIT, MAX_CALL_MESSAGE_BYTES},
    model::{
        Balance, BrokerKind, Connection, EndpointOptions, HopBehavior, QueueBounds, Transport,
    },
    reflection::reflection_service,
    telemetry,
    timer::Sleeper,
};

/// How long a hop waits for its service's reflection to answer at start
/// while the service cannot be reached (it is still starting).
pub const SERVICE_PATIENCE: Duration = Duration::from_secs(10);

/// One downstream hop as its caller sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DownstreamConfig {
    /// The downstream hop's name.
    pub hop: String,
    /// How it is reached.
    pub transport: Transport,
    /// How a replica is picked (push).
    pub balance: Balance,
    /// Its replicas' addresses, replica `i` at index `i` (push).
    pub replicas: Vec<PeerAddr>,
    /// Timeout, retries and hedging for calls to it.
    #[serde(default)]
    pub policy: ClientPolicy,
    /// Endpoint health, keepalive, ewma's parameters and outlier ejection
    /// for calls to its replicas (push).
    #[serde(default)]
    pub endpoints: EndpointOptions,
    /// Whether each call opens a connection of its own (push) or a broker
    /// client of its own (pull), closed after it, or shares a long-lived
    /// one.
    #[serde(default)]
    pub connection: Connection,
    /// A leaf service reached directly (`[hop.service] direct = true`):
    /// what to call on it; `replicas` are the services' addresses. `None`:
    /// a tailmesh hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<crate::model::ServiceCall>,
    /// Whether it is reached by stream (`Hop.Stream`) when this hop serves
    /// a stream: each message goes on to it on a stream of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streaming: bool,
}

/// Everything a hop replica process needs: plain data, handed over as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HopConfig {
    /// What this hop does.
    pub behavior: HopBehavior,
    /// This replica's index.
    pub replica: u32,
    /// How callers reach this hop.
    pub transport: Transport,
    /// The hops this one calls, each once.
    pub downstream: Vec<DownstreamConfig>,
    /// How it calls them, by name: stages, probabilities, counts; empty:
    /// every one once, side by side.
    #[serde(default, skip_serializing_if = "Calls::is_empty")]
    pub calls: Calls,
    /// The broker, when this hop or a downstream one is reached by pull.
    #[serde(default)]
    pub broker: Option<PeerAddr>,
    /// Which broker that is.
    #[serde(default)]
    pub broker_kind: BrokerKind,
    /// The bounds of the pulled hops' queues in an external broker
    /// (RabbitMQ, NATS JetStream), which this replica's producers and
    /// worker declare them with; tailmesh's broker takes its own from its
    /// arguments.
    #[serde(default)]
    pub queue_bounds: QueueBounds,
    /// Requests this replica works on at once; the rest wait for a slot
    /// (that wait is reported as queue wait). `None`: no limit for push;
    /// one task at a time for a pull worker (its credit).
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// With `concurrency`, the most requests that may wait for a slot at
    /// this replica (push); one more is refused with RESOURCE_EXHAUSTED at
    /// once. Unused by a pull worker, whose queue is the broker's.
    #[serde(default = "default_queue_limit")]
    pub queue_limit: u32,
    /// The order waiting requests get a slot in (push); a pull hop's queue
    /// is its broker topic, which has its own.
    #[serde(default)]
    pub discipline: Discipline,
    /// How long shutdown waits for requests in flight.
    #[serde(default = "default_grace")]
    pub drain_grace: Duration,
    /// Sub-millisecond sleeps (true) or tokio's millisecond timer (false).
    #[serde(default = "default_true")]
    pub precise_timer: bool,
    /// How long a client connection may go without a byte read or written
    /// before this replica closes it (see [`DEFAULT_IDLE_TIMEOUT`]).
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: Duration,
    /// A pull worker's HTTP/2 PING interval on its broker stream (see
    /// [`WorkerOptions::ping_after`]); `None`: the keepalive default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_ping: Option<Duration>,
    /// TLS on this replica's listener and on every connection it opens
    /// (`[mesh] tls`); `None`: plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls::TlsFiles>,
    /// The real gRPC service this replica calls as its work (its own
    /// process, beside it); `None`: the synthetic work in `behavior`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<crate::model::ServiceCall>,
}

impl HopConfig {
    /// Replica 0 of a push hop with `behavior` that calls nothing, with the
    /// defaults a config file gets for what it leaves out; change fields
    /// with struct update syntax.
    pub fn new(behavior: HopBehavior) -> Self {
        HopConfig {
            behavior,
            replica: 0,
            transport: Transport::Push,
            downstream: Vec::new(),
            calls: Calls::default(),
            broker: None,
            broker_kind: BrokerKind::Tailmesh,
            queue_bounds: QueueBounds::default(),
            concurrency: None,
            queue_limit: default_queue_limit(),
            discipline: Discipline::Fifo,
            drain_grace: default_grace(),
            precise_timer: default_true(),
            idle_timeout: default_idle_timeout(),
            worker_ping: None,
            tls: None,
            service: None,
        }
    }
}

fn default_grace() -> Duration {
    Duration::from_secs(5)
}
fn default_queue_limit() -> u32 {
    DEFAULT_QUEUE_LIMIT
}
fn default_true() -> bool {
    true
}
fn default_idle_timeout() -> Duration {
    DEFAULT_IDLE_TIMEOUT
}

struct Inner {
    /// The behaviour as configured and as the fault agent overrode it,
    /// read by the fault layer.
    behavior: Arc<Behavior>,
    /// `behavior.name`.
    name: String,
    replica: u32,
    downstream: Arc<[Downstream]>,
    /// The serving layers over the work, built once.
    stack: serve::Service,
    /// How the hop sleeps: a server stream's source waits for each
    /// message's time with it.
    sleeper: Sleeper,
}

/// The request handler shared by the gRPC service and the pull worker.
#[derive(Clone)]
pub struct HopCore {
    inner: Arc<Inner>,
}

impl HopCore {
    /// Builds the handler and its downstream clients (lazily connected).
    /// A hop whose work is a service needs [`HopCore::resolve`].
    pub fn new(config: &HopConfig) -> Result<Self, HopError> {
        if config.service.is_some() {
            return Err(HopError::ServiceUnresolved {
                hop: config.behavior.name.clone(),
            });
        }
        let reaches = config
            .downstream
            .iter()
            .map(|d| Reach::of(&reach_plan(config, d)).map_err(|e| reach_error(config, e)))
            .collect::<Result<_, _>>()?;
        Self::build(config, None, reaches)
    }

    /// [`HopCore::new`], and the hop's service (`config.service`) resolved
    /// first: its schema, method and request, so that a method it lacks or
    /// a request that does not fit fails the hop's start, not its calls.
    /// The downstream services reached directly are resolved too.
    pub async fn resolve(config: &HopConfig) -> Result<Self, HopError> {
        let service = match &config.service {
            Some(call) => Some(
                ServiceClient::resolve(call, SERVICE_PATIENCE)
                    .await
                    .map_err(|e| reach_error(config, ReachError::Service(Box::new(e))))?,
            ),
            None => None,
        };
        let mut reaches = Vec::with_capacity(config.downstream.len());
        for d in &config.downstream {
            reaches.push(
                Reach::resolve(&reach_plan(config, d), SERVICE_PATIENCE)
                    .await
                    .map_err(|e| reach_error(config, e))?,
            );
        }
        Self::build(config, service, reaches)
    }

    /// Builds the hop; `reaches` are its downstream hops' reaches, in the
    /// order of `config.downstream`.
    fn build(
        config: &HopConfig,
        service: Option<ServiceClient>,
        reaches: Vec<Reach>,
    ) -> Result<Self, HopError> {
        let mut downstream = Vec::with_capacity(config.downstream.len());
        for (d, reach) in config.downstream.iter().zip(reaches) {
            downstream.push(Downstream {
                hop: d.hop.as_str().into(),
                stack: CallStack::for_hop(&config.behavior.name, &d.hop, reach, d.policy.clone()),
                streaming: d.streaming,
            });
        }
        let name = &config.behavior.name;
        let downstream: Arc<[Downstream]> = downstream.into();
        let behavior = Arc::new(Behavior::new(config.behavior.clone(), config.replica));
        let sleeper = if config.precise_timer {
            Sleeper::precise_here()
        } else {
            Sleeper::Tokio
        };
        let slots = config.concurrency.map(|n| match config.transport {
            Transport::Push => Slots::new(n, Some(config.queue_limit), config.discipline),
            // The broker orders a pull hop's queue; the worker never
            // takes more tasks than it has slots.
            Transport::Pull => Slots::new(n, None, Discipline::Fifo),
        });
        let stack = serve::stack(
            ServerSpanLayer::new(name),
            RecordLayer::new(name, config.replica, config.transport),
            FanOutLayer::new(
                name,
                Arc::clone(&downstream),
                &config.calls,
                config.behavior.seed,
            ),
            SlotLayer::new(name, config.replica, slots),
            FaultLayer::new(Arc::clone(&behavior), sleeper.clone()),
            Work::new(name, config.replica, sleeper.clone(), service),
        );
        Ok(HopCore {
            inner: Arc::new(Inner {
                behavior,
                name: name.clone(),
                replica: config.replica,
                downstream,
                stack,
                sleeper,
            }),
        })
    }

    /// What this replica's clients did with the replicas of each push hop
    /// it calls.
    pub fn endpoint_events(&self) -> Vec<tailmesh_proto::pb::PoolEvents> {
        self.inner
            .downstream
            .iter()
            .filter_map(|d| d.stack.reach().endpoint_events())
            .collect()
    }

    /// [`HopCore::endpoint_events`] for the Control service.
    pub fn endpoint_events_source(&self) -> crate::control::EndpointEventsSource {
        let core = self.clone();
        Arc::new(move || core.endpoint_events())
    }

    /// A setter for the replica's runtime faults (the fault agent's).
    pub fn behavior_setter(&self) -> crate::control::BehaviorSetter {
        let behavior = Arc::clone(&self.inner.behavior);
        Arc::new(move |overrides: crate::model::Overrides| behavior.set(&overrides))
    }

    /// Handles one request through the replica's serving stack
    /// ([`super::serve`]), without a server span: work, injected slowness
    /// and errors, downstream calls in parallel, then this hop's record
    /// appended to the path.
    /// `timeout` is what remains of the caller's deadline; `queue_wait` is
    /// the time the request spent in a broker queue (pull); `release`, for
    /// a pull worker, gives the broker credit back once this hop's own work
    /// is done, so waiting on downstream hops does not hold it.
    pub async fn handle(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
        queue_wait: Duration,
        release: Option<Release>,
    ) -> Result<CallReply, Status> {
        self.handle_from(Instant::now(), request, timeout, queue_wait, release)
            .await
    }

    /// [`HopCore::handle`] for a request that arrived at `arrived`: a clock
    /// reading the caller took with its own span's start, if it keeps one,
    /// so that span and the path record time the same stretch.
    pub async fn handle_from(
        &self,
        arrived: Instant,
        request: CallRequest,
        timeout: Option<Duration>,
        queue_wait: Duration,
        release: Option<Release>,
    ) -> Result<CallReply, Status> {
        let how = Arrival {
            arrived,
            span: None,
            timeout,
            queue_wait,
            release,
            stream: None,
        };
        self.serve(request, how).await
    }

    /// Serves one message of a stream (`Hop.Stream`) as a call, with its
    /// own deadline and trace context (the message's fields), its
    /// streaming downstream hops reached on `downstream`'s streams; its
    /// failure is answered in band, so the stream goes on. It was read at
    /// `arrived` (`started` on the Unix clock): its deadline and its
    /// record's total count from then, and the wait until now behind the
    /// stream's earlier messages is its queue wait.
    pub async fn serve_message(
        &self,
        arrived: Instant,
        started: u64,
        mut request: CallRequest,
        downstream: &Streams,
    ) -> CallReply {
        let waited = arrived.elapsed();
        let (request_id, message) = (request.request_id, request.message);
        let timeout = (request.timeout_ns > 0).then(|| Duration::from_nanos(request.timeout_ns));
        let span = SpanStart {
            started,
            parent: request
                .trace
                .take()
                .and_then(|t| telemetry::wire_context(&t)),
        };
        let served = self
            .serve(
                request,
                Arrival {
                    arrived,
                    span: Some(span),
                    timeout,
                    queue_wait: waited,
                    release: None,
                    stream: Some(downstream.clone()),
                },
            )
            .await;
        match served {
            Ok(reply) => CallReply { message, ..reply },
            Err(status) => CallReply {
                request_id,
                message,
                code: status.code() as i32,
                error: status.message().to_owned(),
                ..CallReply::default()
            },
        }
    }

    /// Serves `request`, which came as `how` says, through the replica's
    /// stack.
    async fn serve(&self, request: CallRequest, how: Arrival) -> Result<CallReply, Status> {
        let Arrival {
            arrived,
            span,
            timeout,
            queue_wait,
            release,
            stream,
        } = how;
        let request_id = request.request_id;
        let served = serve::serve(
            &self.inner.stack,
            HopRequest {
                arrived,
                span,
                request_id,
                attempt: request.attempt,
                caller: request.caller,
                caller_slow: request.caller_slow,
                branch: request.branch,
                deadline: timeout.map(|t| arrived + t),
                queue_wait,
                release,
                work: None,
                stream,
                payload: request.payload,
            },
        )
        .await?;
        Ok(CallReply {
            request_id,
            payload: served.reply,
            path: served.path,
            ..CallReply::default()
        })
    }
}

/// How `config`'s hop reaches its downstream hop `d`.
fn reach_plan<'a>(config: &'a HopConfig, d: &'a DownstreamConfig) -> ReachPlan<'a> {
    ReachPlan {
        hop: &d.hop,
        caller: Some(&config.behavior.name),
        transport: d.transport,
        replicas: &d.replicas,
        balance: d.balance,
        connection: d.connection,
        channels: 1,
        seed: config.behavior.seed ^ u64::from(config.replica),
        endpoints: &d.endpoints,
        broker: config
            .broker
            .as_ref()
            .map(|b| (config.broker_kind, config.queue_bounds, b)),
        service: d.service.as_ref(),
    }
}

/// A reach (or the hop's own service) that could not be had, as the
/// hop's error.
fn reach_error(config: &HopConfig, error: ReachError) -> HopError {
    let hop = config.behavior.name.clone();
    match error {
        ReachError::Pool(source) => HopError::Downstream { hop, source },
        ReachError::NoBroker { hop: downstream } => HopError::NoBroker { hop, downstream },
        ReachError::Service(source) => HopError::Service {
            hop,
            replica: config.replica,
            source,
        },
        ReachError::ServiceUnresolved { .. } => HopError::ServiceUnresolved { hop },
    }
}

/// How a request came to the replica.
struct Arrival {
    /// When it reached the hop: its deadline and its record's total count
    /// from then.
    arrived: Instant,
    /// Its server span's start and parent; `None`: the caller keeps no
    /// span for it.
    span: Option<SpanStart>,
    /// What is left of the caller's deadline.
    timeout: Option<Duration>,
    /// Time it waited before the hop took it: in a broker queue (pull), or
    /// behind its stream's earlier messages.
    queue_wait: Duration,
    /// A pull worker's broker credit, given back once the hop's own work is
    /// done, so waiting on downstream hops does not hold it.
    release: Option<Release>,
    /// The streams to the streaming downstream hops, for a message of a
    /// stream the hop serves.
    stream: Option<Streams>,
}

struct HopService {
    core: HopCore,
}

#[tonic::async_trait]
impl Hop for HopService {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let timeout = grpc_timeout(request.metadata());
        let (metadata, _, mut request) = request.into_parts();
        // One moment on both clocks: the span's start and the record's.
        let arrived = Instant::now();
        let started = unix_nanos();
        let span = SpanStart {
            started,
            parent: telemetry::extract_call(request.trace.take().as_ref(), &metadata),
        };
        self.core
            .serve(
                request,
                Arrival {
                    arrived,
                    span: Some(span),
                    timeout,
                    queue_wait: Duration::ZERO,
                    release: None,
                    stream: None,
                },
            )
            .await
            .map(Response::new)
    }

    type StreamStream = ReceiverStream<Result<CallReply, Status>>;

    /// Serves a stream's messages one after another, in the order they
    /// came (a slow one holds the ones behind it, as a handler looping
    /// over its stream does), each answered as it is served. The stream
    /// ends when the caller ends its side (status OK) or goes away; the
    /// streams to downstream hops end with it.
    async fn stream(
        &self,
        request: Request<Streaming<CallRequest>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let (answers, out) = mpsc::channel(STREAM_ANSWERS);
        let core = self.core.clone();
        let (reader, mut line) = read_stamped(request.into_inner());
        tokio::spawn(async move {
            let downstream = Streams::relaying();
            loop {
                let next = tokio::select! {
                    next = line.recv() => next,
                    () = answers.closed() => break,
                };
                let Some(((arrived, started), message)) = next else {
                    break;
                };
                let reply = core
                    .serve_message(arrived, started, message, &downstream)
                    .await;
                if answers.send(Ok(reply)).await.is_err() {
                    break;
                }
            }
            reader.abort();
        });
        Ok(Response::new(ReceiverStream::new(out)))
    }

    /// Serves a client stream's messages as a `Stream`'s are, one after
    /// another in the order they came, answering none on its own. Once the
    /// caller has ended its side and every message is served, the client
    /// streams to downstream hops end, and their replies and this hop's
    /// own answers make the one reply: each message's outcome, path, and
    /// when it was done at the last hop it reached. A caller that goes
    /// away first ends the streams downstream with it (reset).
    async fn client_stream(
        &self,
        request: Request<Streaming<CallRequest>>,
    ) -> Result<Response<ClientStreamReply>, Status> {
        let (reader, mut line) = read_stamped(request.into_inner());
        let downstream = Streams::client_relaying();
        let mut served = Vec::new();
        while let Some(((arrived, started), message)) = line.recv().await {
            let reply = self
                .core
                .serve_message(arrived, started, message, &downstream)
                .await;
            served.push(Served {
                reply,
                started_unix_ns: started,
                done_unix_ns: unix_nanos(),
                forwarded: downstream.take_forwarded(),
            });
        }
        match reader.await {
            Ok(Ok(())) => {}
            Ok(Err(status)) => return Err(status),
            Err(e) => return Err(Status::internal(format!("the stream's reader: {e}"))),
        }
        let below = downstream.finish(None).await;
        // Every message's answer at once: work for a blocking thread, so
        // the other streams' messages on this replica are not held.
        let now = unix_nanos();
        let messages = tokio::task::spawn_blocking(move || {
            super::stream::answer_messages(served, &below, now)
        })
        .await
        .map_err(|e| Status::internal(format!("answering the stream's messages: {e}")))?;
        let reply = ClientStreamReply { messages };
        let len = reply.encoded_len();
        if len > MAX_CALL_MESSAGE_BYTES {
            return Err(Status::resource_exhausted(format!(
                "hop \"{}\": the client stream's reply, {} messages' answers, would take \
                 {len} bytes, over the {MAX_CALL_MESSAGE_BYTES} a message may: send fewer \
                 messages per stream",
                self.core.inner.name,
                reply.messages.len()
            )));
        }
        Ok(Response::new(reply))
    }

    type ServerStreamStream = ReceiverStream<Result<CallReply, Status>>;

    /// Serves a server stream: message `i` of the request's
    /// `stream_messages` is request `request_id + i * stream_stride`,
    /// served as a call (its draws keyed on that id), one after another,
    /// each answered in band like a `Stream`'s. Where no downstream hop is
    /// reached by stream, this hop is the stream's source and message `i`
    /// is due `i * stream_interval_ns` after the request came; otherwise
    /// each message comes from the downstream hops' stream as they send
    /// it.
    async fn server_stream(
        &self,
        request: Request<CallRequest>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        let took = Instant::now();
        let request = request.into_inner();
        if !(1..=MAX_SERVER_STREAM_MESSAGES).contains(&request.stream_messages) {
            return Err(Status::invalid_argument(format!(
                "a server stream asks for 1 to {MAX_SERVER_STREAM_MESSAGES} messages \
                 (stream_messages), not {}",
                request.stream_messages
            )));
        }
        let (answers, out) = mpsc::channel(STREAM_ANSWERS);
        tokio::spawn(Self::serve_server_stream(
            self.core.clone(),
            took,
            request,
            answers,
        ));
        Ok(Response::new(ReceiverStream::new(out)))
    }
}

impl HopService {
    /// Serves a server stream's messages (see `server_stream`), each
    /// answered as it is served, until they are all sent or the caller
    /// goes away.
    async fn serve_server_stream(
        core: HopCore,
        took: Instant,
        request: CallRequest,
        answers: mpsc::Sender<Result<CallReply, Status>>,
    ) {
        let inner = &core.inner;
        let downstream = Streams::server(CallRequest {
            caller: inner.name.clone(),
            trace: None,
            ..request.clone()
        });
        // The streams downstream open now, so each one's source counts its
        // messages' times from about when this hop took the request, not
        // from the first message that happens to call it (a failed one
        // does not).
        for d in inner.downstream.iter().filter(|d| d.streaming) {
            // One that cannot be opened fails its messages' calls.
            let _ = d.stack.reach().open_on(&downstream).await;
        }
        // Every hop takes message i at its time after it took the request:
        // the last streaming hop (the stream's source) sends it once its
        // own work is done; a hop before it does its own work, then waits
        // for the message from downstream, as it would for a call's
        // answer.
        let interval = Duration::from_nanos(request.stream_interval_ns);
        for i in 0..request.stream_messages {
            inner.sleeper.sleep_until(took + interval * i).await;
            let message = CallRequest {
                request_id: request
                    .request_id
                    .wrapping_add(u64::from(i).wrapping_mul(request.stream_stride)),
                payload: request.payload.clone(),
                caller: request.caller.clone(),
                caller_slow: request.caller_slow,
                message: u64::from(i),
                ..CallRequest::default()
            };
            let reply = core
                .serve_message(Instant::now(), unix_nanos(), message, &downstream)
                .await;
            if answers.send(Ok(reply)).await.is_err() {
                break;
            }
        }
    }
}

/// A stream's message as read: when, on the monotonic and Unix clocks.
type Stamped = ((Instant, u64), CallRequest);

/// Reads a stream's messages as they come, each stamped on both clocks
/// when read, into a line served one message after another: the wait
/// behind the ones before it is a message's queue wait (head-of-line
/// blocking), as the wait for a slot is a call's. The line ends when the
/// caller ends its side (the reader's `Ok`) or goes away (its status).
fn read_stamped(
    mut inbound: Streaming<CallRequest>,
) -> (
    tokio::task::JoinHandle<Result<(), Status>>,
    mpsc::Receiver<Stamped>,
) {
    let (queued, line) = mpsc::channel(STREAM_LINE);
    let reader = tokio::spawn(async move {
        while let Some(message) = inbound.message().await? {
            let stamp = (Instant::now(), unix_nanos());
            if queued.send((stamp, message)).await.is_err() {
                break;
            }
        }
        Ok(())
    });
    (reader, line)
}

/// Messages of a stream read and not yet served: the most a load
/// generator's stream may have awaiting answers (`[load.streams]
/// in_flight`), so its messages wait here, timed, rather than in the
/// connection's buffers; more are held back by HTTP/2 flow control.
const STREAM_LINE: usize = 4096;

/// The most messages one server stream may ask for.
const MAX_SERVER_STREAM_MESSAGES: u32 = 10_000_000;

/// Answers of a stream served and not yet written: a caller that stops
/// reading holds the stream's next message back once these are queued.
const STREAM_ANSWERS: usize = 64;

/// Serves one hop replica on `listener` until `shutdown` resolves, then
/// drains requests in flight for up to `config.drain_grace`. Serves
/// `tailmesh.v1.Hop`, the gRPC health service and server reflection (which
/// lists those three). Connections idle for `config.idle_timeout` are
/// closed; accept errors are logged and retried with backoff.
pub async fn run(
    config: HopConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), HopError> {
    run_with_control::<crate::control::NoFaults>(config, listener, shutdown, None).await
}

/// [`run`], plus the fault agent (`tailmesh.v1.Control`) when `control`
/// is given (and then listed by reflection).
pub async fn run_with_control<B: crate::control::FaultBackend>(
    config: HopConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    control: Option<crate::control::ControlService<B>>,
) -> Result<(), HopError> {
    // Before the downstream pools exist: their links take the client side.
    let tls = match &config.tls {
        Some(files) => {
            let tls = files.load().map_err(|source| HopError::Tls {
                hop: config.behavior.name.clone(),
                source,
            })?;
            crate::tls::install_client(Some(tls.client.clone()));
            Some(tls)
        }
        None => None,
    };
    // A service's schema and request are resolved before serving: a
    // method it lacks or a request that does not fit fails the start.
    let core = HopCore::resolve(&config).await?;
    let name = config.behavior.name.clone();
    let _anchor = crate::timer::keep_timer_armed();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<HopServer<HopService>>().await;
    let served: &[&str] = match control {
        Some(_) => &[hop_server::SERVICE_NAME, control_server::SERVICE_NAME],
        None => &[hop_server::SERVICE_NAME],
    };
    let reflection = reflection_service(served).map_err(|source| HopError::Reflection {
        hop: name.clone(),
        source,
    })?;

    let (stop, stopped) = oneshot::channel::<()>();
    let (stop_worker, worker_stopped) = watch::channel(false);
    let worker = match (config.transport, config.broker.clone()) {
        (Transport::Pull, Some(broker)) => Some(tokio::spawn(pull_worker(
            core.clone(),
            config.broker_kind,
            config.queue_bounds,
            broker,
            WorkerOptions {
                credits: config.concurrency.unwrap_or(1),
                ping_after: config
                    .worker_ping
                    .unwrap_or(crate::broker::KEEPALIVE_INTERVAL),
            },
            worker_stopped,
        ))),
        (Transport::Pull, None) => {
            return Err(HopError::NoBroker {
                hop: name.clone(),
                downstream: name,
            });
        }
        (Transport::Push, _) => None,
    };
    let incoming = crate::incoming::accept(
        listener,
        &format!("hop \"{name}\" replica {}", config.replica),
        config.idle_timeout,
        tls.map(|t| t.server),
    );
    let server = crate::link::server()
        .add_service(health)
        .add_service(reflection)
        .add_service(
            // tonic's 4 MiB default would refuse a full payload's framing.
            HopServer::new(HopService { core: core.clone() })
                .max_decoding_message_size(MAX_CALL_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_CALL_MESSAGE_BYTES),
        )
        .add_optional_service(control.map(|c| {
            c.with_behavior(core.behavior_setter())
                .with_endpoint_events(core.endpoint_events_source())
                .into_server()
        }))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => r,
        () = shutdown => {
            let _ = stop.send(());
            let _ = stop_worker.send(true);
            match tokio::time::timeout(config.drain_grace, &mut server).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!(hop = %name, "requests still in flight after the drain grace; stopping");
                    Ok(())
                }
            }
        }
    };
    let _ = stop_worker.send(true);
    if let Some(worker) = worker {
        match tokio::time::timeout(config.drain_grace, worker).await {
            Ok(Ok(Err(e))) => tracing::error!(hop = %name, "pull worker: {e}"),
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(hop = %name, "pull worker still busy after the drain grace; stopping")
            }
        }
    }
    result.map_err(|source| HopError::Serve {
        hop: name,
        replica: config.replica,
        source,
    })
}

/// Takes this hop's requests from its broker topic (the hop's name), one
/// per credit, until `stopped` turns true.
async fn pull_worker(
    core: HopCore,
    kind: BrokerKind,
    bounds: QueueBounds,
    broker: PeerAddr,
    options: WorkerOptions,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), BrokerError> {
    let topic = core.inner.name.clone();
    let worker = format!("{topic}-{}", core.inner.replica);
    let handler = move |task: Task, release: Release| {
        let core = core.clone();
        async move {
            let request = CallRequest::decode(task.payload.as_slice()).map_err(|source| {
                CallError::UndecodableRequest {
                    task: task.task_id,
                    source,
                }
            })?;
            // One clock reading decides whether the task is still wanted
            // and is when this hop took it: a task past its deadline is
            // refused here, never started.
            let taken = unix_nanos();
            let arrived = Instant::now();
            let timeout = (task.deadline_unix_nanos > 0)
                .then(|| Duration::from_nanos(task.deadline_unix_nanos.saturating_sub(taken)));
            if timeout == Some(Duration::ZERO) {
                return Err(CallError::TakenAfterDeadline {
                    hop: core.inner.name.clone(),
                    task: task.task_id,
                }
                .into());
            }
            let span = SpanStart {
                started: taken,
                parent: task.trace.as_ref().and_then(telemetry::wire_context),
            };
            let reply = core
                .serve(
                    request,
                    Arrival {
                        arrived,
                        span: Some(span),
                        timeout,
                        queue_wait: Duration::from_nanos(task.queue_wait_ns),
                        release: Some(release),
                        stream: None,
                    },
                )
                .await?;
            Ok(reply.encode_to_vec())
        }
    };
    let shutdown = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    // Every broker takes the task back from a worker lost before its reply
    // (the external brokers acknowledge only after it); a hop that calls
    // others frees its credit once its own work is done, while it waits on
    // them (the serving stack's slot layer releases it).
    run_backend_worker(
        kind, broker, bounds, topic, worker, options, handler, shutdown,
    )
    .await
}
