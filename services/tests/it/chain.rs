//! A 3-hop chain on loopback: reply paths, slow flags, seeded schedules,
//! errors and deadlines, end to end through real gRPC.

use std::{net::SocketAddr, time::Duration};

use futures::{StreamExt, stream::FuturesUnordered};
use tailmesh_proto::pb::CallRequest;
use tailmesh_services::{
    hop::{self, Connections, DownstreamConfig, HopConfig, PushPool, draw},
    model::{Balance, DurationDist, ErrorInjection, HopBehavior, Slowness, Transport, Work},
};
use tokio::{net::TcpListener, sync::watch};
use tonic::Code;

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
        });
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

/// Starts the hops last to first, each calling the next, and returns a pool
/// over the first hop's replicas.
async fn chain(hops: Vec<HopSpec>) -> Chain {
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut next: Option<(String, Vec<SocketAddr>)> = None;
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
                    })
                    .collect(),
                broker: None,
                broker_kind: Default::default(),
                concurrency: spec.concurrency,
                queue_limit: spec.queue_limit,
                discipline: Default::default(),
                drain_grace: Duration::from_secs(1),
                precise_timer: true,
                idle_timeout: tailmesh_services::incoming::DEFAULT_IDLE_TIMEOUT,
                worker_ping: None,
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
    Chain { entry, stop, tasks }
}

impl Chain {
    async fn call(&self, id: u64) -> Result<tailmesh_proto::pb::CallReply, tonic::Status> {
        let request = CallRequest {
            request_id: id,
            payload: vec![7; 16].into(),
            attempt: 0,
            caller: String::new(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_flags_follow_the_seeded_schedule_and_add_the_delay() {
    let extra = Duration::from_millis(20);
    let specs = vec![
        hop("a").slow(0.3, extra),
        hop("b").slow(0.3, extra),
        hop("c"),
    ];
    let c = chain(specs.clone()).await;
    let mut slow_seen = 0;
    for id in 0..40 {
        let reply = c.call(id).await.expect("call succeeds");
        for record in &reply.path {
            let spec = specs
                .iter()
                .find(|s| s.name == record.hop)
                .expect("known hop");
            let expected = draw::plan(&spec.behavior(SEED), record.replica, id, 0)
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
    };
    let status = c
        .entry
        .call(request, Some(Duration::from_millis(100)))
        .await
        .expect_err("the chain needs 230 ms, the deadline is 100 ms");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    c.stop().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limited_concurrency_queues_requests_and_reports_the_wait() {
    let work = Duration::from_millis(40);
    let c = chain(vec![hop("a").sleep(work).concurrency(1)]).await;
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
