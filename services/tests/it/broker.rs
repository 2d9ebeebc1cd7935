//! The broker on loopback: every semantic promised in `broker/mod.rs`,
//! driven through real gRPC. Raw worker streams (`RawWorker`) give exact
//! control over credits, answers and disconnects; `run_worker` is tested as
//! the library's own worker. Every wait is on a condition with a deadline.

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tailmesh_proto::pb::{self, broker_client, broker_message, worker_message};
use tailmesh_services::broker::{
    BrokerClient, BrokerConfig, BrokerError, SubmitReply, TopicStats, run, run_worker,
};
use tokio::{
    net::TcpListener,
    sync::{Notify, mpsc, oneshot},
    task::JoinHandle,
    time::{Instant, timeout},
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};

/// Longest any single condition may take before the test fails.
const WAIT: Duration = Duration::from_secs(5);

fn config(topics: &[&str]) -> BrokerConfig {
    BrokerConfig {
        topics: topics.iter().map(|t| t.to_string()).collect(),
        ..BrokerConfig::default()
    }
}

/// A broker serving on an ephemeral loopback port.
struct TestBroker {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: JoinHandle<Result<(), BrokerError>>,
}

async fn start(config: BrokerConfig) -> TestBroker {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    start_on(config, listener)
}

fn start_on(config: BrokerConfig, listener: TcpListener) -> TestBroker {
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(run(config, listener, async {
        let _ = stopped.await;
    }));
    TestBroker {
        addr,
        stop: Some(stop),
        done,
    }
}

impl TestBroker {
    async fn client(&self) -> BrokerClient {
        BrokerClient::connect(self.addr).await.expect("connect")
    }

    fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    async fn shutdown(mut self) -> Result<(), BrokerError> {
        self.begin_shutdown();
        timeout(WAIT, self.done)
            .await
            .expect("broker stops in time")
            .expect("broker task")
    }
}

/// Awaits `fut` or fails the test after [`WAIT`].
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The topic's statistics now.
async fn stats_of(client: &BrokerClient, topic: &str) -> TopicStats {
    client
        .clone()
        .stats(Some(topic))
        .await
        .expect("stats")
        .remove(0)
}

/// Polls the topic's statistics until `cond` holds.
async fn wait_stats(
    client: &BrokerClient,
    topic: &str,
    what: &str,
    cond: impl Fn(&TopicStats) -> bool,
) -> TopicStats {
    let mut client = client.clone();
    let deadline = Instant::now() + WAIT;
    loop {
        let stats = client.stats(Some(topic)).await.expect("stats").remove(0);
        if cond(&stats) {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {stats:?}"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Submits in the background, so the test can act while the call waits.
fn submit_bg(
    client: &BrokerClient,
    topic: &str,
    payload: &str,
    deadline: Option<Duration>,
) -> JoinHandle<Result<SubmitReply, Status>> {
    let mut client = client.clone();
    let (topic, payload) = (topic.to_owned(), payload.as_bytes().to_vec());
    tokio::spawn(async move {
        client
            .submit(&topic, payload, HashMap::new(), deadline)
            .await
    })
}

/// Submits `payloads` in this order, each queued before the next is sent.
async fn submit_in_order(
    client: &BrokerClient,
    topic: &str,
    payloads: &[&str],
) -> Vec<JoinHandle<Result<SubmitReply, Status>>> {
    let before = client.clone().stats(Some(topic)).await.expect("stats")[0].enqueued;
    let mut calls = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        calls.push(submit_bg(client, topic, p, None));
        let n = before + i as u64 + 1;
        wait_stats(client, topic, "the task to be queued", |s| s.enqueued >= n).await;
    }
    calls
}

async fn answer_of(call: JoinHandle<Result<SubmitReply, Status>>) -> Result<SubmitReply, Status> {
    within("the producer's answer", call)
        .await
        .expect("submit task")
}

/// A worker stream driven by hand.
struct RawWorker {
    tx: mpsc::UnboundedSender<pb::WorkerMessage>,
    rx: Streaming<pb::BrokerMessage>,
}

fn msg(kind: worker_message::Kind) -> pb::WorkerMessage {
    pb::WorkerMessage { kind: Some(kind) }
}

fn hello(topic: &str, credits: u32) -> pb::WorkerMessage {
    msg(worker_message::Kind::Hello(pb::Hello {
        topic: topic.into(),
        worker: "raw".into(),
        credits,
    }))
}

/// Opens a Work stream whose first message is `first`.
async fn open_stream(addr: SocketAddr, first: pb::WorkerMessage) -> Result<RawWorker, Status> {
    let mut client = broker_client::BrokerClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(first).expect("queue first message");
    let rx = client
        .work(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok(RawWorker { tx, rx })
}

async fn raw_worker(addr: SocketAddr, topic: &str, credits: u32) -> RawWorker {
    open_stream(addr, hello(topic, credits))
        .await
        .expect("Hello accepted")
}

impl RawWorker {
    async fn next(&mut self) -> broker_message::Kind {
        within("a broker message", self.rx.message())
            .await
            .expect("stream ok")
            .expect("stream open")
            .kind
            .expect("message kind")
    }

    async fn task(&mut self) -> pb::Task {
        match self.next().await {
            broker_message::Kind::Task(t) => t,
            other => panic!("expected a task, got {other:?}"),
        }
    }

    async fn rejected(&mut self) -> pb::Rejected {
        match self.next().await {
            broker_message::Kind::Rejected(r) => r,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn answer(&self, task_id: u64, payload: &[u8]) {
        self.send(worker_message::Kind::Result(pb::TaskResult {
            task_id,
            payload: payload.to_vec(),
            code: 0,
            message: String::new(),
        }));
    }

    fn send(&self, kind: worker_message::Kind) {
        self.tx.send(msg(kind)).expect("stream open");
    }
}

fn text(payload: &[u8]) -> &str {
    std::str::from_utf8(payload).expect("utf-8 payload")
}

#[tokio::test]
async fn one_credit_takes_tasks_in_order_only_when_free() {
    let broker = start(config(&["t"])).await;
    let client = broker.client().await;
    let calls = submit_in_order(&client, "t", &["a", "b", "c"]).await;

    let mut worker = raw_worker(broker.addr, "t", 1).await;
    let mut seen = Vec::new();
    for (i, call) in calls.into_iter().enumerate() {
        let task = worker.task().await;
        // Holding one task with one credit: nothing else may be dispatched.
        let s = stats_of(&client, "t").await;
        assert_eq!(
            (s.dispatched, s.in_flight, s.depth),
            (i as u64 + 1, 1, 2 - i as u64),
            "{s:?}"
        );
        assert_eq!(task.delivery, 1);
        seen.push(text(&task.payload).to_owned());
        worker.answer(task.task_id, format!("{}!", text(&task.payload)).as_bytes());
        let reply = answer_of(call).await.expect("ok");
        assert_eq!(text(&reply.payload), format!("{}!", seen[i]));
        assert_eq!((reply.task_id, reply.deliveries), (task.task_id, 1));
        assert_eq!(reply.queue_wait_ns, task.queue_wait_ns);
    }
    assert_eq!(seen, ["a", "b", "c"]);
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn release_frees_the_credit_early_and_the_later_result_returns_none() {
    let broker = start(config(&["t"])).await;
    let client = broker.client().await;
    let calls = submit_in_order(&client, "t", &["a", "b"]).await;
    let mut worker = raw_worker(broker.addr, "t", 1).await;

    let a = worker.task().await;
    assert_eq!(text(&a.payload), "a");
    worker.send(worker_message::Kind::Release(pb::Release {
        task_id: a.task_id,
    }));
    // Released, the worker gets "b" while "a" is still unanswered.
    let b = worker.task().await;
    assert_eq!(text(&b.payload), "b");
    let s = wait_stats(&client, "t", "two held tasks", |s| s.in_flight == 2).await;
    assert_eq!(s.credits, 0, "{s:?}");

    // A second Release of the same task, or of one it does not hold, is refused.
    worker.send(worker_message::Kind::Release(pb::Release {
        task_id: a.task_id,
    }));
    assert_eq!(worker.rejected().await.task_id, a.task_id);

    worker.answer(a.task_id, b"a!");
    worker.answer(b.task_id, b"b!");
    let mut calls = calls.into_iter();
    for expected in ["a!", "b!"] {
        let call = calls.next().expect("a call");
        assert_eq!(text(&answer_of(call).await.expect("ok").payload), expected);
    }
    // One credit came back by Release, one by b's result, none by a's.
    let s = wait_stats(&client, "t", "both answered", |s| s.completed == 2).await;
    assert_eq!((s.credits, s.in_flight), (1, 0), "{s:?}");
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn explicit_credit_grants_more_and_results_return_it() {
    let broker = start(config(&["t"])).await;
    let client = broker.client().await;
    let mut worker = raw_worker(broker.addr, "t", 0).await;
    let calls = submit_in_order(&client, "t", &["a", "b", "c"]).await;
    let s = wait_stats(&client, "t", "the worker", |s| s.workers == 1).await;
    assert_eq!((s.dispatched, s.depth), (0, 3), "no credit, no task: {s:?}");

    worker.send(worker_message::Kind::Credit(pb::Credit { credits: 2 }));
    let (a, b) = (worker.task().await, worker.task().await);
    assert_eq!((text(&a.payload), text(&b.payload)), ("a", "b"));
    let s = stats_of(&client, "t").await;
    assert_eq!((s.dispatched, s.in_flight, s.depth), (2, 2, 1), "{s:?}");

    worker.answer(b.task_id, b"B");
    let c = worker.task().await;
    assert_eq!(text(&c.payload), "c");
    worker.answer(a.task_id, b"A");
    worker.answer(c.task_id, b"C");
    let answers: Vec<_> = futures_join(calls).await;
    assert_eq!(answers, ["A", "B", "C"]);
    broker.shutdown().await.expect("clean shutdown");
}

async fn futures_join(calls: Vec<JoinHandle<Result<SubmitReply, Status>>>) -> Vec<String> {
    let mut out = Vec::new();
    for call in calls {
        out.push(text(&answer_of(call).await.expect("ok").payload).to_owned());
    }
    out
}

#[tokio::test]
async fn full_topic_refuses_at_once_and_stays_bounded() {
    let broker = start(BrokerConfig {
        queue_capacity: 3,
        // The queued tasks never get a worker; do not wait long for one.
        drain_grace: Duration::from_millis(100),
        ..config(&["t"])
    })
    .await;
    let client = broker.client().await;
    let _queued = submit_in_order(&client, "t", &["1", "2", "3"]).await;

    let mut c = client.clone();
    for _ in 0..5 {
        let started = Instant::now();
        let err = c
            .submit("t", b"extra".to_vec(), HashMap::new(), None)
            .await
            .expect_err("topic is full");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        assert!(err.message().contains("full"), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refused at once"
        );
    }
    let s = stats_of(&client, "t").await;
    assert_eq!(
        (s.depth, s.max_depth, s.rejected_full, s.enqueued),
        (3, 3, 5, 3),
        "{s:?}"
    );
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn byte_limit_refuses_at_once_and_frees_room_as_tasks_leave() {
    let broker = start(BrokerConfig {
        queue_bytes: 100,
        max_payload_bytes: 100,
        ..config(&["t"])
    })
    .await;
    let client = broker.client().await;
    let forty = "x".repeat(40);
    let queued = submit_in_order(&client, "t", &[&forty, &forty]).await;

    // 80 of 100 bytes queued: 30 more do not fit, whatever the task count.
    let started = Instant::now();
    let mut c = client.clone();
    let err = within(
        "the refusal",
        c.submit("t", vec![b'y'; 30], HashMap::new(), None),
    )
    .await
    .expect_err("over the byte limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("80 of its 100 bytes"), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    let s = stats_of(&client, "t").await;
    assert_eq!(
        (s.depth, s.depth_bytes, s.rejected_full),
        (2, 80, 1),
        "{s:?}"
    );

    // A worker takes one: its bytes leave the queue with it.
    let mut worker = raw_worker(broker.addr, "t", 1).await;
    let first = worker.task().await;
    wait_stats(&client, "t", "the bytes to be released", |s| {
        s.depth_bytes == 40
    })
    .await;
    let mut calls = queued;
    calls.extend(submit_in_order(&client, "t", &[&"z".repeat(60)]).await);
    let s = stats_of(&client, "t").await;
    assert_eq!(
        (s.depth, s.depth_bytes, s.max_depth_bytes),
        (2, 100, 100),
        "{s:?}"
    );

    worker.answer(first.task_id, b"ok");
    for _ in 0..2 {
        let task = worker.task().await;
        worker.answer(task.task_id, b"ok");
    }
    for call in calls {
        answer_of(call).await.expect("ok");
    }
    let s = stats_of(&client, "t").await;
    assert_eq!(
        (s.completed, s.rejected_full, s.depth_bytes),
        (3, 1, 0),
        "{s:?}"
    );
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn byte_limit_below_the_payload_limit_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let config = BrokerConfig {
        queue_bytes: 1024,
        max_payload_bytes: 4096,
        ..config(&["t"])
    };
    let err = run(config, listener, std::future::pending())
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("queue_bytes (1024)"), "{err}");
}

#[tokio::test]
async fn worker_without_credit_never_gets_tasks_that_expired_meanwhile() {
    let broker = start(config(&["t"])).await;
    let client = broker.client().await;
    // Connected, but granting no credit while the tasks wait.
    let mut worker = raw_worker(broker.addr, "t", 0).await;
    let late: Vec<_> = (0..3)
        .map(|i| {
            submit_bg(
                &client,
                "t",
                &format!("late {i}"),
                Some(Duration::from_millis(100)),
            )
        })
        .collect();
    for call in late {
        let err = answer_of(call).await.expect_err("expires");
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
        assert!(err.message().contains("never dispatched"), "{err:?}");
    }

    worker.send(worker_message::Kind::Credit(pb::Credit { credits: 1 }));
    let fresh = submit_bg(&client, "t", "fresh", Some(Duration::from_secs(30)));
    let task = worker.task().await;
    assert_eq!(
        text(&task.payload),
        "fresh",
        "no expired task was delivered"
    );
    worker.answer(task.task_id, b"ok");
    answer_of(fresh).await.expect("ok");
    let s = stats_of(&client, "t").await;
    assert_eq!(
        (s.expired, s.expired_in_flight, s.dispatched, s.completed),
        (3, 0, 1, 1),
        "{s:?}"
    );
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn task_expired_in_queue_is_answered_and_never_dispatched() {
    let broker = start(config(&["t"])).await;
    let client = broker.client().await;
    let mut worker = raw_worker(broker.addr, "t", 1).await;
    let busy = submit_in_order(&client, "t", &["busy"]).await;
    let held = worker.task().await;

    // Queued behind the held task, with a deadline that passes there.
    let started = Instant::now();
    let err = answer_of(submit_bg(
        &client,
        "t",
        "late",
        Some(Duration::from_millis(100)),
    ))
    .await
    .expect_err("expires");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("never dispatched"), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(90));

    worker.answer(held.task_id, b"done");
    answer_of(busy.into_iter().next().expect("one call"))
        .await
        .expect("ok");
    let next = submit_bg(&client, "t", "fresh", None);
    let task = worker.task().await;
    assert_eq!(text(&task.payload), "fresh", "the expired task was skipped");
    worker.answer(task.task_id, b"ok");
    answer_of(next).await.expect("ok");
    let s = stats_of(&client, "t").await;
    assert_eq!((s.dispatched, s.expired, s.completed), (2, 1, 2), "{s:?}");
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn producer_grpc_timeout_is_respected_and_carried_to_the_worker() {
    let broker = start(config(&["t"])).await;
    let client = broker.client().await;
    let mut raw = broker_client::BrokerClient::connect(format!("http://{}", broker.addr))
        .await
        .expect("connect");
    let request = |timeout| {
        let mut r = tonic::Request::new(pb::SubmitRequest {
            topic: "t".into(),
            payload: b"x".to_vec(),
            ..Default::default()
        });
        r.set_timeout(timeout);
        r
    };

    // No worker: only the call's own grpc-timeout can end it.
    let started = Instant::now();
    let err = within(
        "the timed-out call",
        raw.submit(request(Duration::from_millis(150))),
    )
    .await
    .expect_err("times out");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(140));
    wait_stats(&client, "t", "the task to leave the queue", |s| {
        s.depth == 0 && s.expired + s.abandoned == 1
    })
    .await;

    // The timeout becomes the task's deadline for the worker to see.
    let mut worker = raw_worker(broker.addr, "t", 1).await;
    let mut raw2 = raw.clone();
    let call = tokio::spawn(async move { raw2.submit(request(Duration::from_secs(30))).await });
    let task = worker.task().await;
    assert_ne!(task.deadline_unix_nanos, 0);
    worker.answer(task.task_id, b"ok");
    within("the answer", call).await.expect("task").expect("ok");
    let s = stats_of(&client, "t").await;
    assert_eq!(
        s.dispatched, 1,
        "the timed-out task never reached the worker: {s:?}"
    );
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn lost_worker_tasks_go_back_to_the_head_and_late_results_are_ignored() {
    let broker = start(config(&["t"])).await;
    let client = broker.client().await;
    let mut calls = submit_in_order(&client, "t", &["first", "second"])
        .await
        .into_iter();
    let (first, second) = (calls.next().expect("call"), calls.next().expect("call"));

    let mut w1 = raw_worker(broker.addr, "t", 1).await;
    let t1 = w1.task().await;
    assert_eq!((text(&t1.payload), t1.delivery), ("first", 1));
    drop(w1); // disconnects mid-task

    let mut w2 = raw_worker(broker.addr, "t", 1).await;
    let again = w2.task().await;
    assert_eq!(
        again.task_id, t1.task_id,
        "redelivered before the younger task"
    );
    assert_eq!((text(&again.payload), again.delivery), ("first", 2));
    assert!(again.queue_wait_ns >= t1.queue_wait_ns);
    w2.answer(again.task_id, b"from w2");
    let reply = answer_of(first).await.expect("ok");
    assert_eq!((text(&reply.payload), reply.deliveries), ("from w2", 2));

    // The first worker comes back and answers the task it had lost.
    let mut w1_again = raw_worker(broker.addr, "t", 0).await;
    w1_again.answer(t1.task_id, b"from w1, too late");
    let rejected = w1_again.rejected().await;
    assert_eq!(
        (rejected.task_id, rejected.code),
        (t1.task_id, Code::NotFound as i32)
    );
    assert!(rejected.message.contains("not held"), "{rejected:?}");

    let t2 = w2.task().await;
    assert_eq!((text(&t2.payload), t2.delivery), ("second", 1));
    w2.answer(t2.task_id, b"2");
    answer_of(second).await.expect("ok");
    let s = stats_of(&client, "t").await;
    assert_eq!(
        (s.redelivered, s.dispatched, s.completed, s.late_results),
        (1, 3, 2, 1),
        "{s:?}"
    );
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn task_fails_clearly_after_max_deliveries() {
    let broker = start(BrokerConfig {
        max_deliveries: 2,
        ..config(&["t"])
    })
    .await;
    let client = broker.client().await;
    let call = submit_in_order(&client, "t", &["doomed"]).await.remove(0);
    for delivery in 1..=2 {
        let mut w = raw_worker(broker.addr, "t", 1).await;
        let t = w.task().await;
        assert_eq!(t.delivery, delivery);
        drop(w);
    }
    let err = answer_of(call).await.expect_err("lost");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    assert!(err.message().contains("lost its worker 2 times"), "{err:?}");
    let s = stats_of(&client, "t").await;
    assert_eq!((s.lost, s.redelivered, s.depth), (1, 1, 0), "{s:?}");
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn bad_messages_get_readable_errors_without_disturbing_others() {
    let broker = start(BrokerConfig {
        max_payload_bytes: 1024,
        ..config(&["good", "raw"])
    })
    .await;
    let client = broker.client().await;
    let (stop_worker, stopped) = oneshot::channel::<()>();
    let good = tokio::spawn(run_worker(
        broker.addr,
        "good".into(),
        "echo".into(),
        1,
        |task: pb::Task| async move { Ok(task.payload) },
        async {
            let _ = stopped.await;
        },
    ));
    let mut c = client.clone();
    let mut check_good = async move || {
        let reply = within(
            "good traffic",
            c.submit("good", b"ping".to_vec(), HashMap::new(), None),
        )
        .await
        .expect("good traffic flows");
        assert_eq!(reply.payload, b"ping");
    };
    check_good().await;

    // Work streams that never become workers.
    let credit_first = msg(worker_message::Kind::Credit(pb::Credit { credits: 1 }));
    let err = open_stream(broker.addr, credit_first)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("must start with a Hello"), "{err:?}");
    let err = open_stream(broker.addr, hello("nope", 1))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("unknown topic \"nope\""), "{err:?}");

    // An established stream: refusals arrive as notices, the stream lives on.
    let mut raw = raw_worker(broker.addr, "raw", 1).await;
    raw.answer(999_999, b"?");
    let r = raw.rejected().await;
    assert_eq!(
        (r.task_id, r.code),
        (999_999, Code::InvalidArgument as i32),
        "{r:?}"
    );
    assert!(r.message.contains("never issued"), "{r:?}");
    raw.send(worker_message::Kind::Hello(pb::Hello::default()));
    let r = raw.rejected().await;
    assert_eq!(r.code, Code::InvalidArgument as i32, "{r:?}");

    // Producers.
    let mut c = client.clone();
    let err = c
        .submit("nope", b"x".to_vec(), HashMap::new(), None)
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = c
        .submit("raw", vec![0; 2000], HashMap::new(), None)
        .await
        .expect_err("too big");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("2000 bytes"), "{err:?}");

    // An oversized result: the producer learns, the worker is told, and its
    // credit comes back.
    let call = submit_bg(&client, "raw", "x", None);
    let t = raw.task().await;
    raw.answer(t.task_id, &[0; 2000]);
    let r = raw.rejected().await;
    assert_eq!(r.task_id, t.task_id);
    let err = answer_of(call).await.expect_err("result too large");
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    let call = submit_bg(&client, "raw", "y", None);
    let t = raw.task().await;
    raw.answer(t.task_id, b"fine");
    assert_eq!(answer_of(call).await.expect("ok").payload, b"fine");

    check_good().await;
    let _ = stop_worker.send(());
    within("the worker to stop", good)
        .await
        .expect("task")
        .expect("clean stop");
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn producer_that_leaves_frees_its_slot() {
    let broker = start(BrokerConfig {
        queue_capacity: 1,
        ..config(&["t"])
    })
    .await;
    let client = broker.client().await;

    // Queued, then abandoned: the only slot frees up.
    let gone = submit_in_order(&client, "t", &["gone"]).await.remove(0);
    gone.abort();
    wait_stats(&client, "t", "the slot to free", |s| {
        s.depth == 0 && s.abandoned == 1
    })
    .await;
    let second = submit_in_order(&client, "t", &["second"]).await.remove(0);
    let mut worker = raw_worker(broker.addr, "t", 1).await;
    let t = worker.task().await;
    assert_eq!(text(&t.payload), "second");
    worker.answer(t.task_id, b"2");
    answer_of(second).await.expect("ok");

    // Held, then abandoned: the result is discarded, the credit returns.
    let third = submit_bg(&client, "t", "third", None);
    let t = worker.task().await;
    third.abort();
    wait_stats(&client, "t", "the producer to leave", |s| s.abandoned == 2).await;
    worker.answer(t.task_id, b"nobody listens");
    let fourth = submit_bg(&client, "t", "fourth", None);
    let t = worker.task().await;
    assert_eq!(text(&t.payload), "fourth");
    worker.answer(t.task_id, b"4");
    assert_eq!(answer_of(fourth).await.expect("ok").payload, b"4");
    let s = stats_of(&client, "t").await;
    assert_eq!(
        (s.late_results, s.completed, s.depth, s.in_flight),
        (1, 2, 0, 0),
        "{s:?}"
    );
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn shutdown_refuses_new_work_drains_then_answers_unavailable() {
    let mut broker = start(BrokerConfig {
        drain_grace: Duration::from_millis(300),
        ..config(&["t"])
    })
    .await;
    let client = broker.client().await;
    let mut worker = raw_worker(broker.addr, "t", 1).await;
    let mut calls = submit_in_order(&client, "t", &["held", "queued"])
        .await
        .into_iter();
    let (held_call, queued_call) = (calls.next().expect("call"), calls.next().expect("call"));
    let held = worker.task().await;

    broker.begin_shutdown();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", broker.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let deadline = Instant::now() + WAIT;
    loop {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "tailmesh.v1.Broker".into(),
            })
            .await
            .expect("health")
            .into_inner()
            .status;
        if status == tonic_health::pb::health_check_response::ServingStatus::NotServing as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "health never turned NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let err = client
        .clone()
        .submit("t", b"new".to_vec(), HashMap::new(), None)
        .await
        .expect_err("no new work");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    // In-flight work still completes, and queued work is still dispatched.
    worker.answer(held.task_id, b"finished");
    assert_eq!(answer_of(held_call).await.expect("ok").payload, b"finished");
    let queued = worker.task().await;
    assert_eq!(text(&queued.payload), "queued");
    // ... but not answered within the grace.
    let err = answer_of(queued_call).await.expect_err("unanswered");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("shut down before"), "{err:?}");
    let end = within("the worker stream to end", worker.rx.message()).await;
    assert_eq!(
        end.expect_err("ended with a status").code(),
        Code::Unavailable
    );
    within("run to return", broker.done)
        .await
        .expect("task")
        .expect("clean shutdown");
}

#[tokio::test]
async fn stats_report_counts_and_queue_wait_percentiles() {
    let broker = start(config(&["t", "idle"])).await;
    let client = broker.client().await;
    let (stop_worker, stopped) = oneshot::channel::<()>();
    let worker = tokio::spawn(run_worker(
        broker.addr,
        "t".into(),
        "slow".into(),
        1,
        |task: pb::Task| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(task.payload)
        },
        async {
            let _ = stopped.await;
        },
    ));
    let calls: Vec<_> = (0..10)
        .map(|i| submit_bg(&client, "t", &i.to_string(), Some(Duration::from_secs(10))))
        .collect();
    let mut max_wait = 0;
    for call in calls {
        max_wait = max_wait.max(answer_of(call).await.expect("ok").queue_wait_ns);
    }
    let all = client.clone().stats(None).await.expect("stats");
    assert_eq!(
        all.iter().map(|s| s.topic.as_str()).collect::<Vec<_>>(),
        ["t", "idle"]
    );
    let s = &all[0];
    assert_eq!(
        (s.enqueued, s.dispatched, s.completed, s.queue_wait_count),
        (10, 10, 10, 10),
        "{s:?}"
    );
    assert_eq!((s.depth, s.in_flight, s.workers), (0, 0, 1), "{s:?}");
    assert!(s.max_depth >= 2, "ten tasks for one credit queue up: {s:?}");
    // One 5 ms worker for ten tasks: the last one waited for nine others.
    assert!(s.queue_wait_max_ns >= 40_000_000, "{s:?}");
    assert!(
        s.queue_wait_p50_ns <= s.queue_wait_p99_ns && s.queue_wait_p99_ns <= s.queue_wait_max_ns
    );
    // hdrhistogram keeps 3 significant digits.
    assert!(
        s.queue_wait_max_ns.abs_diff(max_wait) <= max_wait / 500,
        "{s:?} vs {max_wait}"
    );
    let err = client
        .clone()
        .stats(Some("nope"))
        .await
        .expect_err("unknown topic");
    assert_eq!(err.code(), Code::NotFound);

    let _ = stop_worker.send(());
    within("the worker to stop", worker)
        .await
        .expect("task")
        .expect("clean stop");
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn run_worker_drains_on_shutdown_and_reconnects_after_a_broker_restart() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let broker = start_on(config(&["t"]), listener);
    let client = broker.client().await;

    let release = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (stop_worker, stopped) = oneshot::channel::<()>();
    let handler = {
        let (release, runs) = (release.clone(), runs.clone());
        move |task: pb::Task| {
            let (release, runs) = (release.clone(), runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if task.payload == b"hold" {
                    release.notified().await;
                }
                Ok(task.payload)
            }
        }
    };
    let worker = tokio::spawn(run_worker(
        addr,
        "t".into(),
        "w".into(),
        2,
        handler,
        async {
            let _ = stopped.await;
        },
    ));
    let mut c = client.clone();
    let reply = within(
        "a first answer",
        c.submit("t", b"one".to_vec(), HashMap::new(), None),
    )
    .await
    .expect("ok");
    assert_eq!(reply.payload, b"one");

    // The broker restarts on the same address; the worker finds it again.
    broker.shutdown().await.expect("clean shutdown");
    let listener = within("the port to free up", async {
        loop {
            match TcpListener::bind(addr).await {
                Ok(l) => return l,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await;
    let broker = start_on(config(&["t"]), listener);
    let client = broker.client().await;
    wait_stats(&client, "t", "the worker to reconnect", |s| s.workers == 1).await;

    // Shutdown while a task is held: the worker drains, finishes it, leaves.
    let held = submit_bg(&client, "t", "hold", None);
    wait_stats(&client, "t", "the task to be held", |s| s.in_flight == 1).await;
    let _ = stop_worker.send(());
    wait_stats(&client, "t", "the worker's Drain", |s| s.credits == 0).await;
    let after = submit_bg(&client, "t", "after", None);
    wait_stats(&client, "t", "the new task to queue", |s| s.enqueued == 2).await;
    release.notify_one();
    assert_eq!(answer_of(held).await.expect("ok").payload, b"hold");
    within("the worker to stop", worker)
        .await
        .expect("task")
        .expect("clean stop");
    let s = wait_stats(&client, "t", "the worker to leave", |s| s.workers == 0).await;
    assert_eq!(
        (s.depth, s.dispatched),
        (1, 1),
        "the drained worker took nothing new: {s:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    after.abort();
    broker.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn serves_health_and_reflection() {
    let broker = start(config(&["t"])).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", broker.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "tailmesh.v1.Broker"] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health")
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}"
        );
    }

    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let reply = within("a reflection reply", replies.message())
        .await
        .expect("ok")
        .expect("one reply");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reflection reply {reply:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"tailmesh.v1.Broker"), "{names:?}");
    broker.shutdown().await.expect("clean shutdown");
}

/// Producers on the SubmitStream path: every `BrokerClient` submit above
/// already travels on it; these cover what only a shared stream can
/// get wrong (correlation, per-task errors, cancels, breaks).
mod stream {
    use super::*;

    /// An echo worker on `topic` that answers `payload!` after a delay
    /// that varies with the payload, so answers come back out of order.
    fn shuffling_worker(
        addr: SocketAddr,
        topic: &str,
        credits: u32,
    ) -> (oneshot::Sender<()>, JoinHandle<Result<(), BrokerError>>) {
        let (stop, stopped) = oneshot::channel::<()>();
        let worker = tokio::spawn(run_worker(
            addr,
            topic.into(),
            "shuffle".into(),
            credits,
            |task: pb::Task| async move {
                let n: u64 = text(&task.payload).parse().unwrap_or(0);
                tokio::time::sleep(Duration::from_micros((n * 7919) % 3000)).await;
                Ok(format!("{}!", text(&task.payload)).into_bytes())
            },
            async {
                let _ = stopped.await;
            },
        ));
        (stop, worker)
    }

    #[tokio::test]
    async fn many_concurrent_submits_each_get_their_own_answer() {
        let broker = start(config(&["t"])).await;
        let client = broker.client().await;
        let (stop, worker) = shuffling_worker(broker.addr, "t", 16);
        let calls: Vec<_> = (0..400)
            .map(|i| submit_bg(&client, "t", &i.to_string(), Some(Duration::from_secs(20))))
            .collect();
        let mut task_ids = Vec::new();
        for (i, call) in calls.into_iter().enumerate() {
            let reply = answer_of(call).await.expect("ok");
            assert_eq!(text(&reply.payload), format!("{i}!"));
            task_ids.push(reply.task_id);
        }
        task_ids.sort_unstable();
        task_ids.dedup();
        assert_eq!(task_ids.len(), 400, "one broker task per submit");
        let s = stats_of(&client, "t").await;
        assert_eq!(
            (s.enqueued, s.completed, s.abandoned),
            (400, 400, 0),
            "{s:?}"
        );
        let _ = stop.send(());
        within("the worker to stop", worker)
            .await
            .expect("task")
            .expect("clean stop");
        broker.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn errors_arrive_per_task_and_the_stream_carries_on() {
        let broker = start(BrokerConfig {
            queue_capacity: 2,
            max_payload_bytes: 1024,
            ..config(&["t"])
        })
        .await;
        let client = broker.client().await;
        let queued = submit_in_order(&client, "t", &["a", "b"]).await;

        let mut c = client.clone();
        let mut expect_err = async |topic: &str, payload: Vec<u8>, code: Code, text: &str| {
            let err = within("a refusal", c.submit(topic, payload, HashMap::new(), None))
                .await
                .expect_err("refused");
            assert_eq!(err.code(), code, "{err:?}");
            assert!(err.message().contains(text), "{err:?}");
        };
        expect_err("t", b"c".to_vec(), Code::ResourceExhausted, "is full").await;
        expect_err(
            "nope",
            b"x".to_vec(),
            Code::NotFound,
            "unknown topic \"nope\"",
        )
        .await;
        expect_err("t", vec![0; 2000], Code::InvalidArgument, "2000 bytes").await;

        // The worker's own status reaches its producer unchanged; the
        // queued tasks, on the same stream all along, are still served.
        let mut worker = raw_worker(broker.addr, "t", 1).await;
        let a = worker.task().await;
        worker.send(worker_message::Kind::Result(pb::TaskResult {
            task_id: a.task_id,
            payload: Vec::new(),
            code: Code::FailedPrecondition as i32,
            message: "a is not welcome".into(),
        }));
        let b = worker.task().await;
        worker.answer(b.task_id, b"b!");
        let mut queued = queued.into_iter();
        let err = answer_of(queued.next().expect("a"))
            .await
            .expect_err("the worker's error");
        assert_eq!(
            (err.code(), err.message()),
            (Code::FailedPrecondition, "a is not welcome")
        );
        let reply = answer_of(queued.next().expect("b")).await.expect("ok");
        assert_eq!(text(&reply.payload), "b!");
        let s = stats_of(&client, "t").await;
        assert_eq!(
            (s.completed, s.failed, s.rejected_full, s.abandoned),
            (1, 1, 1, 0),
            "{s:?}"
        );
        broker.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn a_dropped_submit_cancels_its_task_which_no_worker_ever_sees() {
        let broker = start(config(&["t"])).await;
        let client = broker.client().await;

        // Dropped while queued, as a losing hedge is.
        let mut c = client.clone();
        // Boxed, not pinned in place, so that drop() really drops it.
        let mut submit = Box::pin(c.submit("t", b"gone".to_vec(), HashMap::new(), None));
        tokio::select! {
            r = &mut submit => panic!("answered without a worker: {r:?}"),
            _ = wait_stats(&client, "t", "the task to queue", |s| s.depth == 1) => {}
        }
        drop(submit);
        let s = wait_stats(&client, "t", "the cancel", |s| s.abandoned == 1).await;
        assert_eq!((s.depth, s.enqueued), (0, 1), "{s:?}");

        // Many at once: every one is cancelled, the stream stays usable.
        let many: Vec<_> = (0..200)
            .map(|i| submit_bg(&client, "t", &i.to_string(), None))
            .collect();
        wait_stats(&client, "t", "all to queue", |s| s.depth == 200).await;
        for call in &many {
            call.abort();
        }
        let s = wait_stats(&client, "t", "all cancelled", |s| s.abandoned == 201).await;
        assert_eq!(s.depth, 0, "{s:?}");

        let kept = submit_bg(&client, "t", "kept", None);
        let mut worker = raw_worker(broker.addr, "t", 1).await;
        let task = worker.task().await;
        assert_eq!(
            text(&task.payload),
            "kept",
            "no cancelled task was dispatched"
        );
        worker.answer(task.task_id, b"kept!");
        assert_eq!(answer_of(kept).await.expect("ok").payload, b"kept!");
        let s = stats_of(&client, "t").await;
        assert_eq!((s.dispatched, s.completed), (1, 1), "{s:?}");
        broker.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn deadlines_bound_queued_and_held_tasks() {
        let broker = start(config(&["t"])).await;
        let client = broker.client().await;
        let mut worker = raw_worker(broker.addr, "t", 1).await;

        // Held by a worker that never answers.
        let started = Instant::now();
        let held = submit_bg(&client, "t", "held", Some(Duration::from_millis(150)));
        let task = worker.task().await;
        assert_ne!(task.deadline_unix_nanos, 0, "the worker sees the deadline");
        let err = answer_of(held).await.expect_err("expires");
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
        assert!(err.message().contains("while worker"), "{err:?}");
        assert!(started.elapsed() >= Duration::from_millis(140));

        // Queued behind it, never dispatched.
        let err = answer_of(submit_bg(
            &client,
            "t",
            "queued",
            Some(Duration::from_millis(100)),
        ))
        .await
        .expect_err("expires");
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
        assert!(err.message().contains("never dispatched"), "{err:?}");
        let s = stats_of(&client, "t").await;
        assert_eq!(
            (s.expired_in_flight, s.expired, s.dispatched),
            (1, 1, 1),
            "{s:?}"
        );
        broker.shutdown().await.expect("clean shutdown");
    }

    /// A raw SubmitStream, for what `BrokerClient` never sends.
    struct RawProducer {
        tx: mpsc::UnboundedSender<pb::SubmitStreamRequest>,
        rx: Streaming<pb::SubmitStreamReply>,
    }

    impl RawProducer {
        async fn open(addr: SocketAddr) -> Self {
            let mut client = broker_client::BrokerClient::connect(format!("http://{addr}"))
                .await
                .expect("connect");
            let (tx, rx) = mpsc::unbounded_channel();
            let rx = client
                .submit_stream(UnboundedReceiverStream::new(rx))
                .await
                .expect("stream opens")
                .into_inner();
            RawProducer { tx, rx }
        }

        fn submit(&self, id: u64, payload: &str, timeout: Option<Duration>) {
            self.tx
                .send(pb::SubmitStreamRequest {
                    id,
                    kind: Some(pb::submit_stream_request::Kind::Submit(pb::SubmitRequest {
                        topic: "t".into(),
                        payload: payload.as_bytes().to_vec(),
                        ..Default::default()
                    })),
                    timeout_ns: timeout.map_or(0, |t| t.as_nanos() as u64),
                })
                .expect("stream open");
        }

        fn cancel(&self, id: u64) {
            self.tx
                .send(pb::SubmitStreamRequest {
                    id,
                    kind: Some(pb::submit_stream_request::Kind::Cancel(pb::CancelTask {})),
                    timeout_ns: 0,
                })
                .expect("stream open");
        }

        async fn reply(&mut self) -> Result<pb::SubmitStreamReply, Status> {
            within("a stream reply", self.rx.message())
                .await
                .map(|r| r.expect("stream open"))
        }
    }

    #[tokio::test]
    async fn raw_stream_timeout_cancel_half_close_and_protocol_errors() {
        let broker = start(config(&["t"])).await;
        let client = broker.client().await;
        let mut p = RawProducer::open(broker.addr).await;

        // The relative timeout plays grpc-timeout's part.
        p.submit(7, "short", Some(Duration::from_millis(100)));
        let r = p.reply().await.expect("reply");
        let Some(pb::submit_stream_reply::Result::Error(e)) = r.result else {
            panic!("expected an error, got {r:?}");
        };
        assert_eq!((r.id, e.code), (7, Code::DeadlineExceeded as i32), "{e:?}");

        // A cancel by id frees the queue.
        p.submit(8, "cancelled", None);
        wait_stats(&client, "t", "task 8 to queue", |s| s.depth == 1).await;
        p.cancel(8);
        p.cancel(12345); // unknown: ignored
        wait_stats(&client, "t", "the cancel", |s| {
            s.depth == 0 && s.abandoned == 1
        })
        .await;

        // Half-closed: the open task is still answered, then the stream ends.
        p.submit(9, "last", None);
        let mut worker = raw_worker(broker.addr, "t", 1).await;
        let task = worker.task().await;
        assert_eq!(text(&task.payload), "last");
        let RawProducer { tx, mut rx } = p;
        drop(tx);
        worker.answer(task.task_id, b"last!");
        let r = within("the last reply", rx.message())
            .await
            .expect("ok")
            .expect("a reply");
        assert_eq!(r.id, 9);
        let Some(pb::submit_stream_reply::Result::Reply(reply)) = r.result else {
            panic!("expected a reply, got {r:?}");
        };
        assert_eq!(reply.payload, b"last!");
        assert!(
            within("the stream to end", rx.message())
                .await
                .expect("ends cleanly")
                .is_none()
        );

        // An id reused while its task is open ends the stream, giving
        // the task up.
        drop(worker);
        wait_stats(&client, "t", "the worker to leave", |s| s.workers == 0).await;
        let mut p = RawProducer::open(broker.addr).await;
        p.submit(1, "first", None);
        wait_stats(&client, "t", "task 1 to queue", |s| s.depth == 1).await;
        p.submit(1, "again", None);
        let err = p.reply().await.expect_err("the stream ends");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("already in use"), "{err:?}");
        let s = wait_stats(&client, "t", "task 1 given up", |s| s.abandoned == 2).await;
        assert_eq!(s.depth, 0, "{s:?}");
        broker.shutdown().await.expect("clean shutdown");
    }

    /// A TCP relay to a target it can switch, whose connections can be
    /// cut at once, as a dying broker host would.
    struct Relay {
        addr: SocketAddr,
        target: Arc<std::sync::Mutex<SocketAddr>>,
        conns: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
        accept: JoinHandle<()>,
    }

    impl Relay {
        async fn start(target: SocketAddr) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let target = Arc::new(std::sync::Mutex::new(target));
            let conns = Arc::new(std::sync::Mutex::new(Vec::new()));
            let accept = tokio::spawn({
                let (target, conns) = (target.clone(), conns.clone());
                async move {
                    while let Ok((mut inbound, _)) = listener.accept().await {
                        let to = *target.lock().expect("target");
                        let conn = tokio::spawn(async move {
                            if let Ok(mut out) = tokio::net::TcpStream::connect(to).await {
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                            }
                        });
                        conns.lock().expect("conns").push(conn.abort_handle());
                    }
                }
            });
            Relay {
                addr,
                target,
                conns,
                accept,
            }
        }

        fn cut(&self) {
            for conn in self.conns.lock().expect("conns").drain(..) {
                conn.abort();
            }
        }

        fn point_to(&self, target: SocketAddr) {
            *self.target.lock().expect("target") = target;
        }
    }

    impl Drop for Relay {
        fn drop(&mut self) {
            self.accept.abort();
            self.cut();
        }
    }

    #[tokio::test]
    async fn a_broken_stream_fails_waiting_submits_and_the_next_submit_reopens_it() {
        let first = start(config(&["t"])).await;
        let direct = first.client().await;
        let relay = Relay::start(first.addr).await;
        let client = BrokerClient::connect(relay.addr).await.expect("connect");
        let waiting: Vec<_> = ["a", "b"]
            .iter()
            .map(|p| submit_bg(&client, "t", p, None))
            .collect();
        wait_stats(&direct, "t", "both to queue", |s| s.depth == 2).await;

        relay.cut();
        for call in waiting {
            let err = answer_of(call).await.expect_err("the stream broke");
            assert_eq!(err.code(), Code::Unavailable, "{err:?}");
            assert!(
                err.message().contains(&relay.addr.to_string()),
                "names the broker: {err:?}"
            );
        }
        // The broker gave the stream's tasks up as it would dropped calls.
        let s = wait_stats(&direct, "t", "the tasks given up", |s| s.abandoned == 2).await;
        assert_eq!(s.depth, 0, "{s:?}");
        first.shutdown().await.expect("clean shutdown");

        // A new broker behind the same address: the same client works.
        let second = start(config(&["t"])).await;
        relay.point_to(second.addr);
        let (stop, worker) = shuffling_worker(second.addr, "t", 1);
        let mut c = client.clone();
        let reply = within(
            "a submit after the break",
            c.submit("t", b"1".to_vec(), HashMap::new(), None),
        )
        .await
        .expect("a new stream");
        assert_eq!(reply.payload, b"1!");
        let _ = stop.send(());
        within("the worker to stop", worker)
            .await
            .expect("task")
            .expect("clean stop");
        drop(relay);
        second.shutdown().await.expect("clean shutdown");
    }

    /// One producer far faster than the broker, with small tasks each sent
    /// as its own HTTP/2 frame: the broker keeps reading the stream, so
    /// every task is answered (queued and expired, or refused because the
    /// topic is full) and the connection survives. A broker that stopped
    /// reading let the unread frames pile up in h2 until it ended the
    /// connection (GOAWAY `too_many_data_frames`) and every task with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_producer_that_outruns_the_broker_keeps_its_connection() {
        const TASKS: usize = 12_000;
        let capacity = 10_000;
        let broker = start(BrokerConfig {
            queue_capacity: capacity,
            ..config(&["t"])
        })
        .await;
        let client = broker.client().await;
        // No worker: every queued task waits until its deadline.
        let deadline = Duration::from_secs(3);
        let runtime = tokio::runtime::Handle::current();
        let producer = {
            let client = client.clone();
            std::thread::spawn(move || {
                (0..TASKS)
                    .map(|i| {
                        let mut client = client.clone();
                        let call = runtime.spawn(async move {
                            client
                                .submit("t", i.to_string(), HashMap::new(), Some(deadline))
                                .await
                        });
                        // Paced, so the tasks leave one frame each rather
                        // than coalesced into a few large ones.
                        std::thread::sleep(Duration::from_micros(40));
                        call
                    })
                    .collect::<Vec<_>>()
            })
        };
        let calls = tokio::task::spawn_blocking(move || producer.join())
            .await
            .expect("join")
            .expect("the producer thread");
        let mut codes: HashMap<Code, usize> = HashMap::new();
        for call in calls {
            let code = match timeout(deadline + WAIT, call).await {
                Ok(Ok(Ok(_))) => Code::Ok,
                Ok(Ok(Err(status))) => status.code(),
                Ok(Err(join)) => panic!("submit task: {join}"),
                Err(_) => panic!("a submit was never answered"),
            };
            *codes.entry(code).or_default() += 1;
        }
        let expired = codes.get(&Code::DeadlineExceeded).copied().unwrap_or(0);
        let refused = codes.get(&Code::ResourceExhausted).copied().unwrap_or(0);
        assert_eq!(expired + refused, TASKS, "answers by code: {codes:?}");
        assert!(expired >= capacity / 2, "answers by code: {codes:?}");
        let links = client.link_counts();
        assert_eq!(
            (links.opened, links.closed, links.transport_failures()),
            (1, 0, 0),
            "{links:?}"
        );
        let s = stats_of(&client, "t").await;
        assert_eq!(
            s.enqueued + s.rejected_full,
            TASKS as u64,
            "every task reached the broker: {s:?}"
        );
        broker.shutdown().await.expect("clean shutdown");
    }
}
