//! What a server does at its limits and at its edges: accept errors (out
//! of file descriptors) backed off and logged once a second, idle
//! connections closed, reflection listing only what is served, and the
//! Control API's `authorization` scheme read case-insensitively, and a
//! push client that finds a replica again after it was gone.

use std::{
    collections::{BTreeSet, VecDeque},
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use crate::support::{Running, wait_until, within};

use futures::{Stream, StreamExt};
use tailmesh_proto::pb::{CallRequest, GetFaultsRequest, control_client::ControlClient};
use tailmesh_services::{
    broker::{self, BrokerConfig},
    control::{ControlService, NoFaults},
    hop::{self, Connections, HopConfig, PushPool},
    incoming::{DEFAULT_IDLE_TIMEOUT, IdleTimeout, Incoming},
    model::{Balance, HopBehavior},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::oneshot,
    time::timeout,
};
use tonic::{
    Code, Request,
    transport::{Channel, Endpoint},
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

// ---------------------------------------------------------------------
// Accept errors

/// A listener out of file descriptors: every accept fails with EMFILE
/// until it is given connections to hand out; counts the attempts.
/// After `give_up` attempts it ends, so a server that retried at once
/// fails the test instead of spinning forever.
#[derive(Clone, Default)]
struct Exhausted {
    attempts: Arc<AtomicUsize>,
    ready: Arc<Mutex<VecDeque<u32>>>,
}

/// Far more attempts than any backoff makes in the virtual seconds tested.
const GIVE_UP: usize = 10_000;

impl Stream for Exhausted {
    type Item = io::Result<u32>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) >= GIVE_UP {
            return Poll::Ready(None);
        }
        let ready = self.ready.lock().expect("lock").pop_front();
        Poll::Ready(Some(match ready {
            Some(connection) => Ok(connection),
            None => Err(io::Error::from_raw_os_error(24)), // EMFILE
        }))
    }
}

impl Exhausted {
    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }
}

#[tokio::test(start_paused = true)]
async fn accept_errors_are_retried_with_backoff_not_at_once() {
    let accept = Exhausted::default();
    let mut incoming = Incoming::new(accept.clone(), "test", DEFAULT_IDLE_TIMEOUT);

    // One virtual second of nothing but EMFILE.
    let next = timeout(Duration::from_secs(1), incoming.next()).await;
    assert!(
        next.is_err(),
        "the stream ended or yielded while out of descriptors"
    );
    // 5, 10, 20, 40, 80 ms, then 100 ms apart: 14 attempts in a second.
    // Retrying at once would make thousands.
    let attempts = accept.attempts();
    assert!(
        (10..=16).contains(&attempts),
        "{attempts} accept attempts in a virtual second"
    );

    // Still trying: a descriptor comes free and the next connection is
    // handed on (accept errors never are).
    accept.ready.lock().expect("lock").push_back(7);
    let connection = timeout(Duration::from_secs(1), incoming.next())
        .await
        .expect("the connection is accepted within the longest pause");
    let Some(Ok(connection)) = connection else {
        panic!("the stream ended");
    };
    assert_eq!(*connection.get_ref(), 7);
}

/// Collects what a tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().expect("lock"))
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// The number in a line's "(N more accept errors since the last report)",
/// 0 without one.
fn suppressed_in(line: &str) -> u64 {
    match line.split_once(" more accept errors") {
        None => 0,
        Some((before, _)) => before
            .rsplit_once('(')
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or_else(|| panic!("a malformed count of suppressed errors in {line:?}")),
    }
}

#[tokio::test(start_paused = true)]
async fn accept_errors_are_logged_at_most_once_a_second_with_a_count() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let accept = Exhausted::default();
    let mut incoming = Incoming::new(accept.clone(), "hop \"a\" replica 0", DEFAULT_IDLE_TIMEOUT);
    let seconds = 4;
    let next = timeout(Duration::from_millis(seconds * 1000 + 500), incoming.next()).await;
    assert!(
        next.is_err(),
        "the stream ended or yielded while out of descriptors"
    );

    let lines = captured.lines();
    assert!(
        (seconds as usize..=seconds as usize + 1).contains(&lines.len()),
        "{} lines over {seconds}.5 virtual seconds of {} errors:\n{}",
        lines.len(),
        accept.attempts(),
        lines.join("\n")
    );
    assert!(
        lines[0].contains("ERROR")
            && lines[0].contains("hop \"a\" replica 0: accept: ")
            && lines[0].contains("Too many open files"),
        "{}",
        lines[0]
    );
    // Every error is either a line or counted in the next one.
    let reported: u64 = lines.iter().map(|l| 1 + suppressed_in(l)).sum();
    let unreported = (accept.attempts() as u64)
        .checked_sub(reported)
        .expect("no more errors reported than made");
    assert!(
        suppressed_in(&lines[1]) > 0 && unreported < 10,
        "{reported} errors reported of {}:\n{}",
        accept.attempts(),
        lines.join("\n")
    );
}

// ---------------------------------------------------------------------
// Idle connections

#[tokio::test]
async fn accepted_tcp_connections_have_nodelay() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut incoming = Incoming::tcp(listener, "test", DEFAULT_IDLE_TIMEOUT);
    let _client = TcpStream::connect(addr).await.expect("connect");
    let Some(Ok(accepted)) = within("the accept", incoming.next()).await else {
        panic!("the stream ended");
    };
    assert!(accepted.get_ref().nodelay().expect("nodelay"));
}

#[tokio::test(start_paused = true)]
async fn traffic_keeps_a_connection_open_and_silence_closes_it() {
    let idle = Duration::from_secs(10);
    let (server_end, mut client) = tokio::io::duplex(64);
    let mut server = IdleTimeout::new(server_end, idle);
    let mut byte = [0u8; 1];

    // A byte every 6 s, either way, for a minute: never 10 s of silence.
    for i in 0..10 {
        tokio::time::sleep(Duration::from_secs(6)).await;
        if i % 2 == 0 {
            client.write_all(b"x").await.expect("client writes");
            server.read_exact(&mut byte).await.expect("server reads");
        } else {
            server.write_all(b"y").await.expect("server writes");
            client.read_exact(&mut byte).await.expect("client reads");
        }
    }

    // Then silence: still open just before the idle timeout...
    let early = timeout(idle - Duration::from_millis(1), server.read(&mut byte)).await;
    assert!(early.is_err(), "closed before the idle timeout: {early:?}");
    // ...closed at it.
    let e = timeout(Duration::from_millis(2), server.read(&mut byte))
        .await
        .expect("the idle connection is closed at its idle timeout")
        .expect_err("the idle connection is closed");
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
}

fn hop_config(name: &str, idle_timeout: Duration) -> HopConfig {
    HopConfig {
        drain_grace: Duration::from_secs(1),
        precise_timer: false,
        idle_timeout,
        ..HopConfig::new(HopBehavior::idle(name, 1))
    }
}

async fn start_hop(config: HopConfig, control: bool) -> Running {
    start_hop_at("127.0.0.1:0", config, control).await
}

/// [`start_hop`] on a given address (a port of 0: any).
async fn start_hop_at(at: &str, config: HopConfig, control: bool) -> Running {
    let listener = TcpListener::bind(at).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let control = control.then(|| ControlService::new(TOKEN, NoFaults));
    let done = tokio::spawn(async move {
        hop::run_with_control(config, listener, shutdown, control)
            .await
            .map_err(|e| e.to_string())
    });
    Running { addr, stop, done }
}

async fn start_broker() -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let config = BrokerConfig {
        topics: vec!["t".to_owned()],
        drain_grace: Duration::from_millis(100),
        ..BrokerConfig::default()
    };
    let done = tokio::spawn(async move {
        broker::run(config, listener, async {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| e.to_string())
    });
    Running { addr, stop, done }
}

/// Reads `stream` until the peer closes it (end of stream or reset).
async fn closed_by_peer(mut stream: TcpStream) {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            // The server's HTTP/2 preface (SETTINGS).
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn a_hop_closes_a_connection_idle_for_its_idle_timeout() {
    let hop = start_hop(hop_config("idle", Duration::from_millis(200)), false).await;
    let silent = TcpStream::connect(hop.addr).await.expect("connect");
    within(
        "the hop to close a connection on which the client sends nothing",
        closed_by_peer(silent),
    )
    .await;
    hop.stop().await;
}

// ---------------------------------------------------------------------
// Reflection

async fn channel(addr: SocketAddr) -> Channel {
    within(
        "the connection",
        Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect(),
    )
    .await
    .expect("connect")
}

/// The services `addr`'s reflection lists.
async fn listed(addr: SocketAddr) -> BTreeSet<String> {
    let mut client = ServerReflectionClient::new(channel(addr).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = within(
        "the reflection stream",
        client.server_reflection_info(futures::stream::iter([request])),
    )
    .await
    .expect("reflection answers")
    .into_inner();
    let reply = within("the list", replies.message())
        .await
        .expect("a reply")
        .expect("not the end of the stream");
    match reply.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("not a service list: {other:?}"),
    }
}

fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

const HEALTH: &str = "grpc.health.v1.Health";
const REFLECTION: &str = "grpc.reflection.v1.ServerReflection";

#[tokio::test]
async fn reflection_lists_only_the_services_served() {
    let plain = start_hop(hop_config("plain", DEFAULT_IDLE_TIMEOUT), false).await;
    assert_eq!(
        listed(plain.addr).await,
        names(&["tailmesh.v1.Hop", HEALTH, REFLECTION])
    );
    plain.stop().await;

    let agent = start_hop(hop_config("agent", DEFAULT_IDLE_TIMEOUT), true).await;
    assert_eq!(
        listed(agent.addr).await,
        names(&["tailmesh.v1.Hop", "tailmesh.v1.Control", HEALTH, REFLECTION])
    );
    agent.stop().await;

    let broker = start_broker().await;
    assert_eq!(
        listed(broker.addr).await,
        names(&["tailmesh.v1.Broker", HEALTH, REFLECTION])
    );
    broker.stop().await;
}

// ---------------------------------------------------------------------
// Control authorization

#[tokio::test]
async fn control_accepts_the_bearer_scheme_in_any_case() {
    let hop = start_hop(hop_config("auth", DEFAULT_IDLE_TIMEOUT), true).await;
    let mut client = ControlClient::new(channel(hop.addr).await);
    let get = |authorization: &str| {
        let mut request = Request::new(GetFaultsRequest {});
        request.metadata_mut().insert(
            "authorization",
            authorization.parse().expect("valid metadata"),
        );
        request
    };

    for scheme in ["Bearer ", "bearer ", "BEARER ", "Bearer    "] {
        let value = format!("{scheme}{TOKEN}");
        client
            .get_faults(get(&value))
            .await
            .unwrap_or_else(|e| panic!("{value:?} refused: {e:?}"));
    }
    for value in [
        format!("Basic {TOKEN}"),
        format!("bearer {}", TOKEN.to_uppercase()),
        "bearer wrong".to_owned(),
    ] {
        let e = client
            .get_faults(get(&value))
            .await
            .expect_err("not the token");
        assert_eq!(e.code(), Code::Unauthenticated, "{value:?}: {e:?}");
    }
    hop.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_client_connects_again_to_a_replica_that_came_back() {
    let first = start_hop(hop_config("back", DEFAULT_IDLE_TIMEOUT), false).await;
    let addr = first.addr;
    let pool = PushPool::new(
        "back",
        &[addr],
        Balance::RoundRobin,
        Connections::Shared(1),
        1,
        "t",
    )
    .expect("pool");
    let call = |id| {
        pool.call(
            CallRequest {
                request_id: id,
                payload: Default::default(),
                attempt: 0,
                caller: String::new(),
                caller_slow: false,
                branch: 0,
                ..Default::default()
            },
            Some(Duration::from_secs(2)),
        )
    };
    within("the first call", call(1))
        .await
        .expect("the first call");
    first.stop().await;
    // The replica's shutdown ends the connection; the client sees it end.
    wait_until("the client to see its connection end", || {
        (pool.link_counts().closed > 0).then_some(())
    })
    .await;
    let again = start_hop_at(
        &addr.to_string(),
        hop_config("back", DEFAULT_IDLE_TIMEOUT),
        false,
    )
    .await;
    within("a call to the replica that came back", call(2))
        .await
        .expect("a call after the replica came back");
    let counts = pool.link_counts();
    assert_eq!(
        (counts.opened, counts.closed, counts.broken),
        (2, 1, 0),
        "{counts:?}"
    );
    again.stop().await;
}
