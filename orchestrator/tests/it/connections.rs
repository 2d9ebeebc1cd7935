//! A hop's `connection` key, counted in connections rather than timed: a
//! counting TCP relay (`support::relay`) sits between a caller and the hop
//! it calls (push) or the broker its producer submits to (pull), and the
//! caller's calls are counted through it. With `per_request`, every call
//! opens one connection of its own and closes it; with `shared`, one
//! connection carries every call. Through tailmesh's broker, RabbitMQ and
//! NATS JetStream alike (the last two skipped, naming the Debian package,
//! where the server is not installed).

use std::{net::SocketAddr, time::Duration};

use tailmesh::launcher::brokers::{BrokerServer, ServerSpec};
use tailmesh_proto::pb::{CallReply, CallRequest};
use tailmesh_services::{
    broker::{self, BrokerConfig},
    hop::{self, DownstreamConfig, HopConfig, HopCore},
    model::{Balance, BrokerKind, Connection, HopBehavior, Transport},
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};

use crate::support::{Scratch, relay::Relay};

tests! {
    tokio a_push_caller_opens_a_connection_per_call_only_with_per_request,
    tokio a_pull_caller_connects_a_tailmesh_broker_client_per_call_only_with_per_request,
    sync a_pull_caller_connects_a_rabbitmq_client_per_call_only_with_per_request,
    sync a_pull_caller_connects_a_nats_client_per_call_only_with_per_request,
}

/// Calls each test makes.
const CALLS: u64 = 12;
/// Longest a closed connection may take to be seen ending at the relay.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// Each call's deadline (a broker server's first call declares its queue).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A server task (hop replica or broker) and the means to stop it.
struct Serving {
    stop: oneshot::Sender<()>,
    done: JoinHandle<()>,
}

impl Serving {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(CLOSE_WAIT, self.done).await;
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback listener");
    let addr = listener.local_addr().expect("its address");
    (listener, addr)
}

/// Hop `b`, a leaf doing no work: pushed to at the returned address, or a
/// pull worker of `broker` (of `kind`).
async fn hop_b(pulled_from: Option<(BrokerKind, SocketAddr)>) -> (Serving, SocketAddr) {
    let (listener, addr) = listener().await;
    let config = HopConfig {
        transport: match pulled_from {
            Some(_) => Transport::Pull,
            None => Transport::Push,
        },
        broker: pulled_from.map(|(_, addr)| addr.into()),
        broker_kind: pulled_from.map_or(BrokerKind::Tailmesh, |(kind, _)| kind),
        drain_grace: Duration::from_millis(200),
        precise_timer: false,
        ..HopConfig::new(HopBehavior::idle("b", 1))
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        if let Err(e) = hop::run(config, listener, async {
            let _ = stopped.await;
        })
        .await
        {
            panic!("hop b: {e}");
        }
    });
    (Serving { stop, done }, addr)
}

/// Hop `a`'s request handler, calling `b` with `connection`: pushed to at
/// `b` or, with `broker`, pulled through the broker at `b`.
fn hop_a(b: SocketAddr, broker: Option<BrokerKind>, connection: Connection) -> HopCore {
    let config = HopConfig {
        downstream: vec![DownstreamConfig {
            hop: "b".to_owned(),
            transport: match broker {
                Some(_) => Transport::Pull,
                None => Transport::Push,
            },
            balance: Balance::RoundRobin,
            replicas: match broker {
                Some(_) => Vec::new(),
                None => vec![b.into()],
            },
            policy: Default::default(),
            endpoints: Default::default(),
            connection,
            service: None,
            streaming: false,
        }],
        broker: broker.map(|_| b.into()),
        broker_kind: broker.unwrap_or_default(),
        precise_timer: false,
        ..HopConfig::new(HopBehavior::idle("a", 1))
    };
    HopCore::new(&config).unwrap_or_else(|e| panic!("hop a: {e}"))
}

/// `CALLS` calls to `a`, one after the other, each answered by `b` too.
async fn call(a: &HopCore) {
    for id in 1..=CALLS {
        let request = CallRequest {
            request_id: id,
            caller: "test".to_owned(),
            ..CallRequest::default()
        };
        let reply: CallReply = a
            .handle(request, Some(CALL_TIMEOUT), Duration::ZERO, None)
            .await
            .unwrap_or_else(|status| panic!("call {id}: {status}"));
        let hops: Vec<&str> = reply.path.iter().map(|r| r.hop.as_str()).collect();
        assert_eq!(hops, ["b", "a"], "call {id}");
    }
}

/// Calls `a` (calling through `relay`) and checks the connections: one
/// per call, each closed, with `per_request`; one for all with `shared`.
async fn count(relay: &Relay, a: HopCore, connection: Connection) {
    let before = relay.through();
    call(&a).await;
    let opened = relay.through().opened - before.opened;
    match connection {
        Connection::PerRequest => {
            assert_eq!(
                opened as u64,
                CALLS,
                "one connection per call: {:?}",
                relay.through()
            );
            relay
                .wait_for("every per-call connection to close", CLOSE_WAIT, |t| {
                    t.open() == 0
                })
                .await;
        }
        Connection::Shared => {
            assert_eq!(opened, 1, "one connection for every call");
            assert_eq!(relay.through().open(), 1, "still open, for the next call");
            drop(a);
        }
    }
}

async fn a_push_caller_opens_a_connection_per_call_only_with_per_request() {
    let (b, b_addr) = hop_b(None).await;
    let relay = Relay::start(b_addr).await;
    count(
        &relay,
        hop_a(relay.addr(), None, Connection::PerRequest),
        Connection::PerRequest,
    )
    .await;
    count(
        &relay,
        hop_a(relay.addr(), None, Connection::Shared),
        Connection::Shared,
    )
    .await;
    b.stop().await;
}

/// The shared and per-request producers of hop a, through a relay to the
/// broker at `broker`, with hop b pulling from it directly.
async fn pull_through(kind: BrokerKind, broker: SocketAddr) {
    let (b, _) = hop_b(Some((kind, broker))).await;
    let relay = Relay::start(broker).await;
    for connection in [Connection::PerRequest, Connection::Shared] {
        count(
            &relay,
            hop_a(relay.addr(), Some(kind), connection),
            connection,
        )
        .await;
    }
    // A shared producer dropped with its hop closes its connection too.
    relay
        .wait_for(
            "the shared producer's connection to close",
            CLOSE_WAIT,
            |t| t.open() == 0,
        )
        .await;
    b.stop().await;
}

async fn a_pull_caller_connects_a_tailmesh_broker_client_per_call_only_with_per_request() {
    let (listener, addr) = listener().await;
    let config = BrokerConfig {
        topics: vec!["b".to_owned()],
        drain_grace: Duration::from_millis(200),
        ..BrokerConfig::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        if let Err(e) = broker::run(config, listener, async {
            let _ = stopped.await;
        })
        .await
        {
            panic!("broker: {e}");
        }
    });
    pull_through(BrokerKind::Tailmesh, addr).await;
    Serving { stop, done }.stop().await;
}

fn a_pull_caller_connects_a_rabbitmq_client_per_call_only_with_per_request() {
    through_server(BrokerKind::Rabbitmq);
}

fn a_pull_caller_connects_a_nats_client_per_call_only_with_per_request() {
    through_server(BrokerKind::Nats);
}

/// [`pull_through`] a server of `kind` started for the test (skipped
/// unless it is installed).
fn through_server(kind: BrokerKind) {
    crate::brokers::require(kind);
    let scratch = Scratch::shared();
    crate::harness::block_on(async {
        let server = BrokerServer::start(
            ServerSpec::new(kind, std::net::Ipv4Addr::LOCALHOST.into())
                .log_to(scratch.path().join("server.log")),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        pull_through(kind, server.addr).await;
        server.stop().await;
    });
}
