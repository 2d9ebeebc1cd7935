//! A 3-hop chain on loopback: reply paths, slow flags, seeded schedules,
//! errors and deadlines, end to end through real gRPC.
//!
//! Tests that compare durations run on tokio's paused clock (hops sleep on
//! tokio's timer then, not the precise one): a duration there is what the
//! hop was told to wait, not what a busy machine made of it.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use tailmesh_proto::pb::{
    AttemptEnd, CallReply, CallRequest, HopRecord,
    hop_server::{Hop, HopServer},
};
use tailmesh_services::{
    hop::{self, Connections, DownstreamConfig, HopConfig, PushPool, draw},
    model::{Balance, DurationDist, ErrorInjection, HopBehavior, Slowness, Transport, Work},
};
use tokio::{net::TcpListener, sync::watch};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Request, Response, Status};

/// A hop under construction.
#[derive(Clone)]
struct HopSpec {
    name: String,
    replicas: u32,
    slow: Option<Slowness>,
    error: Option<ErrorInjection>,
    work: Work,
    concurrency: Option<u32>,
    queue_limit: u32,
}

fn hop(name: &str) -> HopSpec {
    HopSpec {
        name: name.into(),
        replicas: 1,
        slow: None,
        error: None,
        work: Work::None,
        concurrency: None,
        queue_limit: tailmesh_services::limits::DEFAULT_QUEUE_LIMIT,
    }
}

impl HopSpec {
    fn replicas(mut self, n: u32) -> Self {
        self.replicas = n;
        self
    }
    fn slow(mut self, probability: f64, extra: Duration) -> Self {
        self.slow = Some(Slowness {
            probability,
            extra: DurationDist::Fixed { value: extra },
            follow: None,
        });
        self
    }
    /// With `slow`: the chance used instead after a slow caller.
    fn follow(mut self, follow: f64) -> Self {
        if let Some(slow) = &mut self.slow {
            slow.follow = Some(follow);
        }
        self
    }
    fn error(mut self, probability: f64, code: i32) -> Self {
        self.error = Some(ErrorInjection { probability, code });
        self
    }
    fn sleep(mut self, d: Duration) -> Self {
        self.work = Work::Sleep {
            dist: DurationDist::Fixed { value: d },
        };
        self
    }
    fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }
    fn queue_limit(mut self, n: u32) -> Self {
        self.queue_limit = n;
        self
    }
    fn behavior(&self, seed: u64) -> HopBehavior {
        HopBehavior {
            name: self.name.clone(),
            seed,
            work: self.work.clone(),
            slow: self.slow.clone(),
            replica_slow: None,
            error: self.error.clone(),
        }
    }
}

/// A running chain: the entry pool and a switch that stops every hop.
struct Chain {
    entry: PushPool,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const SEED: u64 = 11;

/// How a chain is built besides its hops.
#[derive(Clone, Copy, Default)]
struct Options {
    /// The last hop calls a [`Leaf`] the test plays.
    leaf: bool,
    /// Hops sleep on tokio's timer, which follows a paused clock, instead
    /// of the precise timer (real time, whatever the clock).
    tokio_timer: bool,
}

/// A chain of `hops` on the precise timer, as hops run for real.
async fn chain(hops: Vec<HopSpec>) -> Chain {
    start_chain(hops, Options::default()).await.0
}

/// [`chain`] for a test on tokio's paused clock.
async fn paused_chain(hops: Vec<HopSpec>) -> Chain {
    let options = Options {
        tokio_timer: true,
        ..Options::default()
    };
    start_chain(hops, options).await.0
}

/// [`chain`] whose last hop calls a [`Leaf`], returned beside it.
async fn chain_to_leaf(hops: Vec<HopSpec>) -> (Chain, Leaf) {
    let options = Options {
        leaf: true,
        ..Options::default()
    };
    let (chain, leaf) = start_chain(hops, options).await;
    (chain, leaf.expect("a leaf was asked for"))
}

/// Starts the leaf (if asked for), then the hops last to first, each
/// calling the next, and returns a pool over the first hop's replicas.
async fn start_chain(hops: Vec<HopSpec>, options: Options) -> (Chain, Option<Leaf>) {
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut next: Option<(String, Vec<SocketAddr>)> = None;
    let mut leaf = None;
    if options.leaf {
        let (played, addr, task) = Leaf::start(stopped.clone()).await;
        next = Some((LEAF.to_owned(), vec![addr]));
        leaf = Some(played);
        tasks.push(task);
    }
    for spec in hops.iter().rev() {
        let mut addrs = Vec::new();
        for replica in 0..spec.replicas {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            addrs.push(listener.local_addr().expect("local addr"));
            let config = HopConfig {
                behavior: spec.behavior(SEED),
                replica,
                transport: Transport::Push,
                downstream: next
                    .iter()
                    .map(|(name, replicas)| DownstreamConfig {
                        hop: name.clone(),
                        transport: Transport::Push,
                        balance: Balance::RoundRobin,
                        replicas: replicas.iter().map(Into::into).collect(),
                        policy: Default::default(),
                        endpoints: Default::default(),
                        connection: Default::default(),
                        service: None,
                        streaming: false,
                    })
                    .collect(),
                calls: Default::default(),
                broker: None,
                broker_kind: Default::default(),
                queue_bounds: Default::default(),
                concurrency: spec.concurrency,
                queue_limit: spec.queue_limit,
                discipline: Default::default(),
                drain_grace: Duration::from_secs(1),
                precise_timer: !options.tokio_timer,
                idle_timeout: tailmesh_services::incoming::DEFAULT_IDLE_TIMEOUT,
                worker_ping: None,
                tls: None,
                service: None,
            };
            let mut stopped = stopped.clone();
            tasks.push(tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                hop::run(config, listener, shutdown)
                    .await
                    .expect("hop serves");
            }));
        }
        next = Some((spec.name.clone(), addrs));
    }
    let (name, addrs) = next.expect("at least one hop");
    let entry = PushPool::new(
        &name,
        &addrs,
        Balance::RoundRobin,
        Connections::Shared(1),
        SEED,
        "test",
    )
    .expect("entry pool");
    (Chain { entry, stop, tasks }, leaf)
}

/// The name the [`Leaf`] answers as.
const LEAF: &str = "leaf";

/// The last hop of a chain, played by the test: a bare `tailmesh.v1.Hop`
/// server that writes down the `grpc-timeout` each call arrived with (what
/// its caller propagated) and answers at once with its own path record.
#[derive(Clone, Default)]
struct Leaf {
    /// The raw `grpc-timeout` of each call, in arrival order (`None`: the
    /// call came without one).
    timeouts: Arc<Mutex<Vec<Option<String>>>>,
}

impl Leaf {
    /// Serves a leaf on a loopback port until `stopped` turns true.
    async fn start(
        mut stopped: watch::Receiver<bool>,
    ) -> (Leaf, SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let leaf = Leaf::default();
        let server = tonic::transport::Server::builder()
            .add_service(HopServer::new(leaf.clone()))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                let _ = stopped.wait_for(|s| *s).await;
            });
        let task = tokio::spawn(async move { server.await.expect("the leaf serves") });
        (leaf, addr, task)
    }

    fn timeouts(&self) -> Vec<Option<String>> {
        self.timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[tonic::async_trait]
impl Hop for Leaf {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        self.timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(timeout);
        let request = request.into_inner();
        Ok(Response::new(CallReply {
            request_id: request.request_id,
            payload: request.payload,
            path: vec![HopRecord {
                hop: LEAF.to_owned(),
                parent: request.caller,
                transport: "push".to_owned(),
                ..HopRecord::default()
            }],
            ..CallReply::default()
        }))
    }

    type StreamStream = futures::stream::Empty<Result<CallReply, Status>>;

    /// The leaf answers calls only.
    async fn stream(
        &self,
        _: Request<tonic::Streaming<CallRequest>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        Err(Status::unimplemented("the leaf answers calls only"))
    }

    type ServerStreamStream = futures::stream::Empty<Result<CallReply, Status>>;

    /// The leaf answers calls only.
    async fn server_stream(
        &self,
        _: Request<CallRequest>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("the leaf answers calls only"))
    }

    /// The leaf answers calls only.
    async fn client_stream(
        &self,
        _: Request<tonic::Streaming<CallRequest>>,
    ) -> Result<Response<tailmesh_proto::pb::ClientStreamReply>, Status> {
        Err(Status::unimplemented("the leaf answers calls only"))
    }
}

/// A `grpc-timeout` value as gRPC's HTTP/2 protocol spells it: at most 8
/// digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let digits = value.len().checked_sub(1)?;
    let (number, unit) = value.split_at(digits);
    if number.is_empty() || number.len() > 8 || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = number.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl Chain {
    async fn call(&self, id: u64) -> Result<CallReply, Status> {
        let request = CallRequest {
            request_id: id,
            payload: vec![7; 16].into(),
            attempt: 0,
            caller: String::new(),
            caller_slow: false,
            branch: 0,
            ..Default::default()
        };
        self.entry.call(request, Some(Duration::from_secs(5))).await
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            t.await.expect("hop task ends cleanly");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_name_every_hop_in_order_with_parents() {
    let c = chain(vec![hop("a").replicas(2), hop("b"), hop("c").replicas(3)]).await;
    let mut replicas_of_c = std::collections::BTreeSet::new();
    for id in 0..6 {
        let reply = c.call(id).await.expect("call succeeds");
        assert_eq!(reply.request_id, id);
        assert_eq!(reply.payload, vec![7; 16]);
        let hops: Vec<&str> = reply.path.iter().map(|r| r.hop.as_str()).collect();
        assert_eq!(hops, ["c", "b", "a"]);
        let parents: Vec<&str> = reply.path.iter().map(|r| r.parent.as_str()).collect();
        assert_eq!(parents, ["b", "a", ""]);
        for r in &reply.path {
            assert!(r.total_ns >= r.service_ns, "{r:?}");
            assert_eq!(r.transport, "push");
            assert_eq!(r.slot_wait_ns, 0, "no concurrency limit, no slot wait");
        }
        // Each hop timed its one downstream call: one attempt, answered,
        // within the call, within the caller's own time.
        let calls: Vec<Vec<&str>> = reply
            .path
            .iter()
            .map(|r| r.calls.iter().map(|c| c.hop.as_str()).collect())
            .collect();
        assert_eq!(calls, [vec![], vec!["c"], vec!["b"]]);
        for r in &reply.path {
            for call in &r.calls {
                let [attempt] = &call.attempts[..] else {
                    panic!("one attempt without a policy: {call:?}");
                };
                assert_eq!(attempt.end(), AttemptEnd::Ok);
                assert_eq!(attempt.start_ns, 0);
                assert!(attempt.took_ns <= call.call_ns, "{call:?}");
                assert!(call.call_ns <= r.total_ns, "{r:?}");
            }
        }
        replicas_of_c.insert(reply.path[0].replica);
    }
    assert_eq!(
        replicas_of_c.len(),
        3,
        "round robin reaches every replica of c"
    );
    c.stop().await;
}

// On the paused clock: a request without slowness has no work to do, and
// its service time must stay under the injected 20 ms, which on a busy
// machine's real clock one preemption between two readings can exceed.
// Paused, time moves only when every task waits for a timer; loopback
// sockets deliver inside the sender's write, so the runtime sees the bytes
// on its next poll and no call's deadline is skipped to.
// b follows a's slowness (`slow.follow`): its schedule is the seeded one
// given whether a slowed the request.
#[tokio::test(start_paused = true)]
async fn slow_flags_follow_the_seeded_schedule_and_add_the_delay() {
    let extra = Duration::from_millis(20);
    let specs = vec![
        hop("a").slow(0.3, extra),
        hop("b").slow(0.3, extra).follow(0.9),
        hop("c"),
    ];
    let c = paused_chain(specs.clone()).await;
    let mut slow_seen = 0;
    for id in 0..40 {
        let reply = c.call(id).await.expect("call succeeds");
        for record in &reply.path {
            let spec = specs
                .iter()
                .find(|s| s.name == record.hop)
                .expect("known hop");
            let caller_slow = reply.path.iter().any(|r| r.hop == record.parent && r.slow);
            let expected = draw::plan(&spec.behavior(SEED), record.replica, id, 0, caller_slow)
                .slow
                .is_some();
            assert_eq!(record.slow, expected, "request {id} hop {}", record.hop);
            if record.slow {
                slow_seen += 1;
                assert!(record.service_ns >= extra.as_nanos() as u64, "{record:?}");
            } else {
                assert!(record.service_ns < extra.as_nanos() as u64, "{record:?}");
            }
        }
    }
    assert!(
        slow_seen > 0,
        "with p = 0.3 on two hops, 40 requests must see slowness"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_propagate_with_their_code_and_hop_names() {
    let c = chain(vec![hop("a"), hop("b").error(1.0, 14)]).await;
    let status = c.call(1).await.expect_err("b always fails");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("injected error at hop \"b\""),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("hop \"a\" replica 0"),
        "{}",
        status.message()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_propagate_downstream() {
    // What the leaf is told: the caller's deadline less the time hop a
    // spent before calling it (at least its 30 ms of work). The entry
    // pool's own wait cannot stand in for this: only the header the leaf
    // received shows that the deadline went downstream. The bounds hold on
    // any machine: the work can only take longer, and what is left of 10 s
    // stays positive unless hop a stalls for seconds.
    let work = Duration::from_millis(30);
    let deadline = Duration::from_secs(10);
    let (c, leaf) = chain_to_leaf(vec![hop("a").sleep(work)]).await;
    let request = CallRequest {
        request_id: 1,
        payload: Default::default(),
        attempt: 0,
        caller: String::new(),
        caller_slow: false,
        branch: 0,
        ..Default::default()
    };
    let reply = c
        .entry
        .call(request, Some(deadline))
        .await
        .expect("the chain answers in time");
    let hops: Vec<(&str, &str)> = reply
        .path
        .iter()
        .map(|r| (r.hop.as_str(), r.parent.as_str()))
        .collect();
    assert_eq!(hops, [(LEAF, "a"), ("a", "")], "{reply:?}");
    let received = leaf.timeouts();
    assert_eq!(received.len(), 1, "one call reached the leaf: {received:?}");
    let header = received[0]
        .as_deref()
        .expect("hop a sent its downstream call without a grpc-timeout");
    let left = parse_grpc_timeout(header)
        .unwrap_or_else(|| panic!("grpc-timeout {header:?} is not a gRPC timeout"));
    assert!(
        left > Duration::ZERO && left <= deadline - work,
        "the leaf was given {left:?} ({header:?}) of a {deadline:?} deadline \
         after {work:?} of work upstream"
    );
    c.stop().await;

    // A chain slower than its deadline ends in DEADLINE_EXCEEDED.
    let c = chain(vec![
        hop("a").sleep(Duration::from_millis(30)),
        hop("b").sleep(Duration::from_millis(200)),
    ])
    .await;
    let request = CallRequest {
        request_id: 1,
        payload: Default::default(),
        attempt: 0,
        caller: String::new(),
        caller_slow: false,
        branch: 0,
        ..Default::default()
    };
    let status = c
        .entry
        .call(request, Some(Duration::from_millis(100)))
        .await
        .expect_err("the chain needs 230 ms, the deadline is 100 ms");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    c.stop().await;
}

#[test]
fn grpc_timeouts_parse_as_the_protocol_spells_them() {
    assert_eq!(
        parse_grpc_timeout("9970m"),
        Some(Duration::from_millis(9970))
    );
    assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
    assert_eq!(
        parse_grpc_timeout("12345678u"),
        Some(Duration::from_micros(12_345_678))
    );
    for bad in ["", "m", "5", "123456789n", "1.5S", "-1m", "10x"] {
        assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_downstream_is_named() {
    // Bind and drop: the port refuses connections.
    let dead = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let pool = PushPool::new(
        "gone",
        &[dead],
        Balance::RoundRobin,
        Connections::Shared(1),
        1,
        "t",
    )
    .expect("pool");
    let request = CallRequest {
        request_id: 1,
        payload: Default::default(),
        attempt: 0,
        caller: String::new(),
        caller_slow: false,
        branch: 0,
        ..Default::default()
    };
    let status = pool
        .call(request, Some(Duration::from_secs(2)))
        .await
        .expect_err("nobody listens");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let message = status.message();
    assert!(
        message.contains("hop \"gone\" replica 0") && message.contains(&dead.to_string()),
        "{message}"
    );
}

// On the paused clock (see the slow flags' test): the second request's
// wait is the first's work left when it arrived, and on a real clock a
// busy machine can put milliseconds between two requests sent together.
#[tokio::test(start_paused = true)]
async fn limited_concurrency_queues_requests_and_reports_the_wait() {
    let work = Duration::from_millis(40);
    let c = paused_chain(vec![hop("a").sleep(work).concurrency(1)]).await;
    let (first, second) = tokio::join!(c.call(1), c.call(2));
    let (first, second) = (first.expect("first call"), second.expect("second call"));
    let waits = [first.path[0].queue_wait_ns, second.path[0].queue_wait_ns];
    let (short, long) = (waits.iter().min().copied(), waits.iter().max().copied());
    assert!(
        long >= Some(work.as_nanos() as u64 * 9 / 10),
        "one request waits for the other: {waits:?}"
    );
    assert!(
        short < Some(work.as_nanos() as u64 / 2),
        "the other starts at once: {waits:?}"
    );
    for r in [&first.path[0], &second.path[0]] {
        assert!(r.total_ns >= r.service_ns + r.queue_wait_ns, "{r:?}");
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_wait_queue_refuses_at_once_until_a_slot_frees() {
    // Four requests at once at a replica with one slot and room for two in
    // line: whichever arrives last is refused, and its answer is the first
    // to come back, while the request holding the slot still works.
    let c = chain(vec![
        hop("b")
            .sleep(Duration::from_millis(500))
            .concurrency(1)
            .queue_limit(2),
    ])
    .await;
    let mut calls: FuturesUnordered<_> = (1..=4).map(|id| c.call(id)).collect();
    let first = calls.next().await.expect("four calls");
    let refused = first.expect_err("the fourth request is refused before any work ends");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("hop \"b\" replica 0: 2 requests already wait for a slot (queue_limit)"),
        "{}",
        refused.message()
    );

    // The next to end is the one that held the slot; the line is down to
    // one, so a new request is accepted and waits its turn.
    let done = calls.next().await.expect("three calls left");
    done.expect("the request in the slot succeeds");
    calls.push(c.call(5));
    let mut accepted = 0;
    while let Some(result) = calls.next().await {
        result.expect("every request in line is served");
        accepted += 1;
    }
    assert_eq!(
        accepted, 3,
        "two that waited and the one after the slot freed"
    );
    drop(calls);
    c.stop().await;
}
