//! A push client's endpoints against real hop replicas on loopback: a
//! replica that dies leaves the pick list and comes back when it does (and
//! without endpoint health keeps being called), peak-EWMA sends fewer calls
//! to a slow replica, the keepalive notices a black-holed one, and a hop's
//! Control API reports what its own client saw.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::support::{Running, wait_until, within};

use tailmesh_proto::pb::{
    CallRequest, EndpointEventKind, GetEndpointEventsRequest, PoolEvents,
    control_client::ControlClient,
};
use tailmesh_services::{
    control::{ControlService, NoFaults},
    hop::{self, Connections, DownstreamConfig, HopConfig, PushPool},
    model::{
        Backoff, Balance, DurationDist, EndpointOptions, HopBehavior, ReplicaSlow, Transport, Work,
    },
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::oneshot,
    task::JoinHandle,
};

/// Every call's deadline.
const DEADLINE: Duration = Duration::from_secs(2);

fn config(behavior: &HopBehavior, replica: u32) -> HopConfig {
    HopConfig {
        replica,
        drain_grace: Duration::from_millis(200),
        precise_timer: false,
        ..HopConfig::new(behavior.clone())
    }
}

async fn start_at(at: &str, config: HopConfig) -> Running {
    let listener = TcpListener::bind(at).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        hop::run(config, listener, async {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| e.to_string())
    });
    Running { addr, stop, done }
}

fn request(id: u64) -> CallRequest {
    CallRequest {
        request_id: id,
        payload: Default::default(),
        attempt: 0,
        caller: String::new(),
        caller_slow: false,
        branch: 0,
        ..Default::default()
    }
}

/// Quick reconnects, so the tests wait little for READY.
fn options(health: bool) -> EndpointOptions {
    EndpointOptions {
        health,
        backoff: Backoff {
            initial: Duration::from_millis(50),
            multiplier: 1.6,
            jitter: 0.2,
            max: Duration::from_millis(400),
        },
        ..EndpointOptions::default()
    }
}

fn pool(addrs: &[SocketAddr], balance: Balance, endpoints: EndpointOptions) -> PushPool {
    PushPool::new("e", addrs, balance, Connections::Shared(1), 1, "t")
        .expect("pool")
        .with_endpoints(endpoints)
}

fn kinds(events: &PoolEvents, replica: u32) -> Vec<EndpointEventKind> {
    events
        .events
        .iter()
        .filter(|e| e.replica == replica)
        .map(|e| EndpointEventKind::try_from(e.kind).unwrap_or(EndpointEventKind::Unspecified))
        .collect()
}

fn picks(pool: &PushPool) -> Vec<u64> {
    pool.endpoint_events()
        .replicas
        .iter()
        .map(|r| r.picks)
        .collect()
}

/// Calls `pool` `n` times, `concurrency` at a time; the failures' messages.
async fn calls(pool: &PushPool, n: u64, concurrency: usize) -> Vec<String> {
    use futures::StreamExt;
    futures::stream::iter(0..n)
        .map(|id| pool.call(request(id), Some(DEADLINE)))
        .buffer_unordered(concurrency)
        .filter_map(|r| async move { r.err().map(|e| e.message().to_owned()) })
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_leaves_the_pick_list_until_it_is_back() {
    let behavior = HopBehavior::idle("e", 1);
    let r0 = start_at("127.0.0.1:0", config(&behavior, 0)).await;
    let r1 = start_at("127.0.0.1:0", config(&behavior, 1)).await;
    let at1 = r1.addr.to_string();
    let pool = Arc::new(pool(
        &[r0.addr, r1.addr],
        Balance::RoundRobin,
        options(true),
    ));
    let failures = within("the first calls", calls(&pool, 20, 2)).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert!(picks(&pool).iter().all(|&p| p > 0), "{:?}", picks(&pool));

    // Calls keep flowing while replica 1 dies.
    let flowing = Arc::new(AtomicBool::new(true));
    let errors = Arc::new(AtomicU64::new(0));
    let flow = tokio::spawn({
        let (pool, flowing, errors) = (pool.clone(), flowing.clone(), errors.clone());
        async move {
            while flowing.load(Ordering::Relaxed) {
                let failed = calls(&pool, 2, 2).await.len() as u64;
                errors.fetch_add(failed, Ordering::Relaxed);
            }
        }
    });
    r1.stop().await;
    wait_until("replica 1's TRANSIENT_FAILURE", || {
        (kinds(&pool.endpoint_events(), 1).last() == Some(&EndpointEventKind::TransientFailure))
            .then_some(())
    })
    .await;
    flowing.store(false, Ordering::Relaxed);
    within("the flow to stop", flow).await.expect("flow task");
    // 2 calls in flight at most when it died.
    let lost = errors.load(Ordering::Relaxed);
    assert!(lost <= 2, "{lost} calls failed around the death");

    let before = picks(&pool);
    let failures = within("calls with replica 1 down", calls(&pool, 50, 2)).await;
    assert!(failures.is_empty(), "{failures:?}");
    let after = picks(&pool);
    assert_eq!(after[1], before[1], "a call was routed to the dead replica");
    assert_eq!(after[0], before[0] + 50);

    let _r1 = start_at(&at1, config(&behavior, 1)).await;
    wait_until("replica 1's READY", || {
        (kinds(&pool.endpoint_events(), 1).last() == Some(&EndpointEventKind::Ready)).then_some(())
    })
    .await;
    let before = picks(&pool);
    let failures = within("calls with replica 1 back", calls(&pool, 50, 2)).await;
    assert!(failures.is_empty(), "{failures:?}");
    let after = picks(&pool);
    assert!(after[1] > before[1], "{before:?} -> {after:?}");
    let events = pool.endpoint_events();
    assert!(events.replicas[1].transient_failures >= 1, "{events:?}");
    assert_eq!(events.replicas[0].transient_failures, 0, "{events:?}");
    r0.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_health_calls_keep_going_to_a_dead_replica() {
    let behavior = HopBehavior::idle("e", 1);
    let r0 = start_at("127.0.0.1:0", config(&behavior, 0)).await;
    let r1 = start_at("127.0.0.1:0", config(&behavior, 1)).await;
    let pool = pool(&[r0.addr, r1.addr], Balance::RoundRobin, options(false));
    let failures = within("the first calls", calls(&pool, 20, 1)).await;
    assert!(failures.is_empty(), "{failures:?}");
    r1.stop().await;
    let before = picks(&pool);
    let failures = within("calls with replica 1 down", calls(&pool, 40, 1)).await;
    let after = picks(&pool);
    assert_eq!(after[1] - before[1], 20, "{before:?} -> {after:?}");
    assert_eq!(failures.len(), 20, "{failures:?}");
    assert!(
        failures.iter().all(|m| m.contains("replica 1")),
        "{failures:?}"
    );
    let events = pool.endpoint_events();
    assert!(events.events.is_empty(), "{events:?}");
    r0.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ewma_sends_fewer_calls_to_a_slow_replica() {
    let behavior = HopBehavior {
        work: Work::Sleep {
            dist: DurationDist::Fixed {
                value: Duration::from_millis(2),
            },
        },
        replica_slow: Some(ReplicaSlow {
            replica: 1,
            factor: 10.0,
        }),
        ..HopBehavior::idle("e", 1)
    };
    let r0 = start_at("127.0.0.1:0", config(&behavior, 0)).await;
    let r1 = start_at("127.0.0.1:0", config(&behavior, 1)).await;
    let endpoints = EndpointOptions {
        ewma: tailmesh_services::model::EwmaParams {
            // Below both replicas' latencies, so both are tried at first.
            default_rtt: Duration::from_micros(100),
            ..Default::default()
        },
        ..options(true)
    };
    let pool = pool(&[r0.addr, r1.addr], Balance::Ewma, endpoints);
    // One at a time: p2c by requests in flight would split them evenly.
    let failures = within("the calls", calls(&pool, 200, 1)).await;
    assert!(failures.is_empty(), "{failures:?}");
    let p = picks(&pool);
    assert!(p[1] > 0, "the slow replica was never tried: {p:?}");
    assert!(p[1] * 4 < p[0], "{p:?}");
    r0.stop().await;
    r1.stop().await;
}

/// A TCP relay to `to` that, once `hole` is set, forwards nothing more but
/// keeps its sockets open: a black hole.
async fn relay(to: SocketAddr, hole: Arc<AtomicBool>) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut pipes = tokio::task::JoinSet::new();
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = TcpStream::connect(to).await else {
                continue;
            };
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            pipes.spawn(pipe(ri, wo, hole.clone()));
            pipes.spawn(pipe(ro, wi, hole.clone()));
        }
    });
    (addr, task)
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    hole: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if !hole.load(Ordering::Relaxed) && to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepalive_notices_a_black_holed_replica() {
    let behavior = HopBehavior::idle("e", 1);
    let r0 = start_at("127.0.0.1:0", config(&behavior, 0)).await;
    let r1 = start_at("127.0.0.1:0", config(&behavior, 1)).await;
    let hole = Arc::new(AtomicBool::new(false));
    let (via, relay) = relay(r0.addr, hole.clone()).await;
    let endpoints = EndpointOptions {
        keepalive: Some(Duration::from_millis(100)),
        keepalive_timeout: Duration::from_millis(300),
        ..options(true)
    };
    let pool = pool(&[via, r1.addr], Balance::RoundRobin, endpoints);
    let failures = within("the first calls", calls(&pool, 20, 1)).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert!(picks(&pool)[0] > 0);

    hole.store(true, Ordering::Relaxed);
    wait_until("replica 0's keepalive timeout", || {
        let events = pool.endpoint_events();
        (events.replicas[0].keepalive_timeouts >= 1
            && kinds(&events, 0).last() == Some(&EndpointEventKind::TransientFailure))
        .then_some(())
    })
    .await;
    let events = pool.endpoint_events();
    assert!(
        events
            .events
            .iter()
            .any(|e| e.replica == 0 && e.reason == "keepalive timeout"),
        "{events:?}"
    );
    // The reconnect probe's connections get through the relay but their
    // PINGs are not answered: replica 0 stays out.
    let before = picks(&pool);
    let failures = within("calls with replica 0 black-holed", calls(&pool, 30, 1)).await;
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(picks(&pool)[0], before[0]);
    relay.abort();
    r0.stop().await;
    r1.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_reports_its_downstream_endpoints_through_control() {
    const TOKEN: &str = "0123456789abcdef0123456789abcdef";
    let leaf = start_at("127.0.0.1:0", config(&HopBehavior::idle("b", 1), 0)).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let front = HopConfig {
        downstream: vec![DownstreamConfig {
            hop: "b".to_owned(),
            transport: Transport::Push,
            balance: Balance::RoundRobin,
            replicas: vec![leaf.addr.into()],
            policy: Default::default(),
            endpoints: options(true),
            connection: Default::default(),
            service: None,
            streaming: false,
        }],
        ..config(&HopBehavior::idle("a", 1), 0)
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        hop::run_with_control(
            front,
            listener,
            async {
                let _ = stopped.await;
            },
            Some(ControlService::new(TOKEN, NoFaults)),
        )
        .await
        .map_err(|e| e.to_string())
    });
    let front = Running { addr, stop, done };
    let entry = PushPool::new(
        "a",
        &[addr],
        Balance::RoundRobin,
        Connections::Shared(1),
        1,
        "t",
    )
    .expect("pool");
    let failures = within("calls through a", calls(&entry, 7, 1)).await;
    assert!(failures.is_empty(), "{failures:?}");

    let channel = within(
        "the control connection",
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect(),
    )
    .await
    .expect("connect");
    let mut request = tonic::Request::new(GetEndpointEventsRequest {});
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {TOKEN}").parse().expect("metadata"),
    );
    let events = within(
        "the endpoint events",
        ControlClient::new(channel).get_endpoint_events(request),
    )
    .await
    .expect("endpoint events")
    .into_inner();
    assert_eq!(events.pools.len(), 1, "{events:?}");
    assert_eq!(events.pools[0].hop, "b");
    assert_eq!(events.pools[0].replicas.len(), 1);
    assert_eq!(events.pools[0].replicas[0].picks, 7, "{events:?}");
    front.stop().await;
    leaf.stop().await;
}
