//! Pull hops through RabbitMQ and NATS JetStream, end to end: the real
//! binary starts the broker server as a process of the run, and the run
//! is checked for accounting, whole traces, redelivery after a worker is
//! killed, the credit, and deadlines. Each test is skipped, naming the
//! Debian package, where the server is not installed.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::support::*;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;
use tailmesh::launcher::brokers::{BrokerServer, ServerSpec};
use tailmesh_services::{
    addr::PeerAddr,
    broker::{Release, Task, WorkerOptions, backend, nats},
    model::{BrokerKind, QueueBounds},
};

tests! {
    sync nats_runs_a_pull_chain_with_whole_traces_and_every_request_accounted,
    sync rabbitmq_runs_a_pull_chain_with_whole_traces_and_every_request_accounted,
    sync nats_redelivers_the_tasks_of_a_killed_worker,
    sync rabbitmq_redelivers_the_tasks_of_a_killed_worker,
    sync nats_redelivers_the_tasks_a_worker_killed_mid_downstream_released,
    sync rabbitmq_redelivers_the_tasks_a_worker_killed_mid_downstream_released,
    sync nats_honours_the_credit_and_drops_expired_tasks,
    sync nats_counts_the_tasks_expired_behind_a_stalled_worker,
    sync rabbitmq_counts_the_tasks_expired_behind_a_stalled_worker,
    sync rabbitmq_honours_the_credit_and_drops_expired_tasks,
    sync a_nats_worker_with_credit_1_never_holds_2_tasks,
    sync a_rabbitmq_worker_with_credit_1_never_holds_2_tasks,
    sync a_nats_worker_keeps_its_credit_exact_across_expired_pull_requests,
    sync a_full_nats_stream_refuses_with_resource_exhausted,
    sync a_full_rabbitmq_queue_refuses_with_resource_exhausted,
    sync a_nats_stream_holds_the_scenarios_queue_capacity_and_refuses_the_rest,
    sync a_rabbitmq_queue_holds_the_scenarios_queue_capacity_and_refuses_the_rest,
    sync a_nats_server_killed_mid_run_is_an_incident_and_every_request_is_accounted,
}

/// How long a run with a broker server may take: RabbitMQ alone needs up
/// to half a minute to start on a busy 2-core machine.
const BROKER_RUN_DEADLINE: Duration = Duration::from_secs(150);

/// Skips the test unless `kind`'s server is installed.
pub(crate) fn require(kind: BrokerKind) {
    let (program, dirs): (&str, &[&str]) = match kind {
        BrokerKind::Nats => ("nats-server", &["/usr/sbin", "/usr/bin", "/usr/local/bin"]),
        BrokerKind::Rabbitmq => ("rabbitmq-server", &["/usr/lib/rabbitmq/bin", "/usr/sbin"]),
        BrokerKind::Tailmesh => return,
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = dirs
        .iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .any(|d| d.join(program).is_file());
    if !found {
        crate::harness::skip(format!(
            "{program} is not installed (Debian package {program})"
        ));
    }
}

/// One test through `kind`'s broker (skipped unless its server is
/// installed): its folder, holding the mesh lock, and a runtime to ask the
/// broker's server with.
struct BrokerTest {
    kind: BrokerKind,
    scratch: Scratch,
    runtime: tokio::runtime::Runtime,
}

impl BrokerTest {
    /// A server of this test's broker on loopback, its output in the
    /// test's folder (a server that does not get ready fails the test
    /// quoting the log's last lines).
    async fn server(&self) -> BrokerServer {
        BrokerServer::start(
            ServerSpec::new(self.kind, std::net::Ipv4Addr::LOCALHOST.into())
                .log_to(self.scratch.path().join("server.log")),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A test that runs alone: it judges timing (a task started within
    /// its deadline) or is the busy machine's known victim.
    fn new(kind: BrokerKind) -> BrokerTest {
        BrokerTest::with_scratch(kind, Scratch::new)
    }

    /// A test that judges counts (redeliveries, expired and refused tasks,
    /// whole traces, accounting): it shares the machine. Most of its time
    /// is the broker server's start (half a minute for RabbitMQ), which
    /// then overlaps another test's.
    fn shared(kind: BrokerKind) -> BrokerTest {
        BrokerTest::with_scratch(kind, Scratch::shared)
    }

    fn with_scratch(kind: BrokerKind, scratch: fn() -> Scratch) -> BrokerTest {
        require(kind);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        BrokerTest {
            kind,
            scratch: scratch(),
            runtime,
        }
    }

    /// Writes the scenario `name` through the broker, with open-loop
    /// uniform arrivals: `broker` holds further lines of its [broker]
    /// table, `load` the rest of its [load] table and the tables after it.
    fn scenario(&self, name: &str, seed: u64, broker: &str, load: &str) -> PathBuf {
        let text = format!(
            r#"name = "{name}"
seed = {seed}

[broker]
kind = "{kind}"
{broker}
[load]
mode = "open"
arrivals = "uniform"
{load}"#,
            kind = self.kind.as_str()
        );
        write(self.scratch.path(), &format!("{name}.toml"), &text)
    }

    fn results(&self) -> PathBuf {
        self.scratch.results()
    }

    /// Starts `scenario`, with the deadline of a run with a broker server.
    fn start(&self, scenario: &Path) -> Running {
        let results = self.results();
        Running::start(self.scratch.path(), &run_args(scenario, &results, &[]))
            .with_deadline(BROKER_RUN_DEADLINE)
    }

    /// Waits for `run` to exit 0 and checks its accounting.
    fn finish(&self, run: Running) -> Accounted {
        accounted(run.wait(), &self.results())
    }

    /// The broker server's statistics of topic b now (`None` while it has
    /// no address or does not answer).
    fn stats_of_b(&self) -> Option<tailmesh_proto::pb::TopicStats> {
        let addr = endpoint(&self.results())?;
        self.runtime.block_on(async {
            let stats = backend::stats(self.kind, &addr, QueueBounds::default(), &["b".to_owned()])
                .await
                .ok()?;
            stats.into_iter().next()
        })
    }
}

fn spans(trace: &Value) -> &Vec<Value> {
    trace["spans"].as_array().expect("spans")
}

fn name(span: &Value) -> &str {
    span["operationName"].as_str().expect("operationName")
}

fn parent<'a>(trace: &'a Value, span: &Value) -> Option<&'a Value> {
    let id = span["references"].as_array()?.first()?["spanID"].as_str()?;
    spans(trace).iter().find(|s| s["spanID"] == id)
}

fn int_tag(span: &Value, key: &str) -> Option<i64> {
    span["tags"].as_array()?.iter().find(|t| t["key"] == key)?["value"].as_i64()
}

// ---------------------------------------------------------------------------
// 1. A chain through each broker: every request answered, every trace whole.

fn nats_runs_a_pull_chain_with_whole_traces_and_every_request_accounted() {
    pull_chain(BrokerKind::Nats);
}

fn rabbitmq_runs_a_pull_chain_with_whole_traces_and_every_request_accounted() {
    pull_chain(BrokerKind::Rabbitmq);
}

fn pull_chain(kind: BrokerKind) {
    let test = BrokerTest::shared(kind);
    let scenario = test.scenario(
        "broker-chain",
        3,
        "",
        r#"rate = 50
duration = "2s"
timeout = "3s"

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"
replicas = 2
concurrency = 2
work = { kind = "sleep", dist = "exp", mean = "2ms" }

[[hop]]
name = "c"
transport = "pull"
work = { kind = "sleep", dist = "fixed", value = "1ms" }
"#,
    );
    let results = test.results();
    let mut run = test.start(&scenario);
    let broker_pid = run.wait_for("waiting for the broker process", || {
        pid_of(&results, "base", "broker")
    });
    let Accounted {
        ref run_dir,
        ref v,
        ref context,
        ..
    } = test.finish(run);
    let (sent, ok) = (u64_at(v, "/sent"), u64_at(v, "/ok"));
    assert_eq!(ok, sent, "a request failed:\n{context}");
    // Every ok request has a trace whose server spans match its path.
    assert_eq!(u64_at(v, "/traces/complete"), ok, "{context}");
    // Each pulled hop's server span hangs under its queue wait, under the
    // caller's client span: one trace through the broker.
    let traces = jaeger_traces(run_dir);
    assert_eq!(traces.len() as u64, sent, "one trace per request");
    for trace in &traces {
        for (hop, caller) in [("b", "a -> b"), ("c", "b -> c")] {
            let server = spans(trace)
                .iter()
                .find(|s| name(s) == hop)
                .unwrap_or_else(|| panic!("no span {hop}: {trace:#}"));
            let wait = parent(trace, server).expect("the server span's parent");
            assert_eq!(name(wait), format!("queue wait {hop}"), "{trace:#}");
            let client = parent(trace, wait).expect("the queue wait's parent");
            assert_eq!(name(client), caller, "{trace:#}");
        }
    }
    // The broker's own statistics reached the summary.
    let topics: Vec<&str> = v
        .pointer("/broker")
        .and_then(Value::as_array)
        .expect("broker statistics")
        .iter()
        .filter_map(|t| t["topic"].as_str())
        .collect();
    assert_eq!(topics, ["b", "c"], "{context}");
    assert_nothing_left(kind, broker_pid);
    // The server's own output is in the run's logs, beside the broker's.
    let log = run_dir.join("logs/base/broker.server.log");
    let text = std::fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("{}: {e}\n{context}", log.display()));
    assert!(
        text.lines().count() > 1,
        "{} holds only its header:\n{text}",
        log.display()
    );
}

/// No server of the run is left running, nor its directory: both are
/// named after the broker process's pid.
fn assert_nothing_left(kind: BrokerKind, broker_pid: u32) {
    let tag = format!("tailmesh-{}-{broker_pid}", kind.as_str());
    assert!(
        !std::env::temp_dir().join(&tag).exists(),
        "the broker's directory {tag} is left behind"
    );
    let left = processes_naming(&tag);
    assert!(left.is_empty(), "a server of the run still runs: {left:?}");
}

/// The processes whose command line holds `tag`: pid and command line.
fn processes_naming(tag: &str) -> Vec<(i32, String)> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
            cmdline.contains(tag).then_some((pid, cmdline))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// 2. A worker SIGKILLed while it holds tasks: they are delivered again.

fn nats_redelivers_the_tasks_of_a_killed_worker() {
    killed_worker(BrokerKind::Nats);
}

fn rabbitmq_redelivers_the_tasks_of_a_killed_worker() {
    killed_worker(BrokerKind::Rabbitmq);
}

/// The killed-worker scenarios' load, a and b: two workers of b with
/// credit 1 and 300 ms tasks take 6.7 tasks/s; 20/s arrive, so the queue
/// backs up and each worker always holds a task.
const KILLED_WORKER_LOAD: &str = r#"rate = 20
duration = "1500ms"
timeout = "30s"

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"
replicas = 2
concurrency = 1
work = { kind = "sleep", dist = "fixed", value = "300ms" }
"#;

fn killed_worker(kind: BrokerKind) {
    let test = BrokerTest::shared(kind);
    let scenario = test.scenario("broker-kill", 5, "", KILLED_WORKER_LOAD);
    kill_hop_b_1_while(
        &test,
        &scenario,
        "waiting for tasks held by both workers",
        |s| match kind {
            BrokerKind::Nats => s.in_flight >= 2,
            _ => s.workers == 2 && s.depth >= 3,
        },
    );
}

// 2b. A worker SIGKILLed while tasks it released wait on its downstream
//     hop: they were never acknowledged, so they are delivered again.

fn nats_redelivers_the_tasks_a_worker_killed_mid_downstream_released() {
    killed_mid_downstream(BrokerKind::Nats);
}

fn rabbitmq_redelivers_the_tasks_a_worker_killed_mid_downstream_released() {
    killed_mid_downstream(BrokerKind::Rabbitmq);
}

fn killed_mid_downstream(kind: BrokerKind) {
    let test = BrokerTest::shared(kind);
    // b's two workers (credit 1) do 300 ms of their own work, release
    // their credit and wait 2 s on c: each takes 3.3 tasks/s while 20/s
    // arrive, so the queue backs up, and once a worker has released a
    // task it holds that task, unacknowledged, for the 2 s c takes.
    let scenario = test.scenario(
        "broker-kill-downstream",
        6,
        "",
        &format!(
            r#"{KILLED_WORKER_LOAD}
[[hop]]
name = "c"
work = {{ kind = "sleep", dist = "fixed", value = "2s" }}
"#
        ),
    );
    // Kill hop-b-1 once both workers have released tasks that now wait on
    // c. NATS counts unacknowledged deliveries: more than the two credits
    // are released ones. RabbitMQ tells the queue's depth and consumers:
    // 8 queued behind both consumers means each worker has finished its
    // own work on at least one task (20/s arrive, 6.7/s leave).
    kill_hop_b_1_while(
        &test,
        &scenario,
        "waiting for released tasks held by both workers",
        |s| match kind {
            BrokerKind::Nats => s.in_flight >= 4 && s.depth >= 8,
            _ => s.workers == 2 && s.depth >= 8,
        },
    );
}

/// Runs `scenario`, SIGKILLs hop-b-1 once the broker's statistics of b
/// satisfy `holding`, and checks that every request was still answered
/// and the kill is the incident.
fn kill_hop_b_1_while(
    test: &BrokerTest,
    scenario: &Path,
    waiting_for: &str,
    holding: impl Fn(&tailmesh_proto::pb::TopicStats) -> bool,
) {
    let results = test.results();
    let mut run = test.start(scenario);
    let victim = run.wait_for(waiting_for, || {
        let victim = pid_of(&results, "base", "hop-b-1")?;
        test.stats_of_b()
            .as_ref()
            .is_some_and(&holding)
            .then_some(victim)
    });
    assert!(
        runs_ours(victim, test.scratch.marker()),
        "pid {victim} is not hop-b-1"
    );
    kill(Pid::from_raw(victim as i32), Signal::SIGKILL).expect("SIGKILL hop-b-1");
    let Accounted {
        ref v, ref context, ..
    } = test.finish(run);
    // The tasks the dead worker held (done with or waiting on its
    // downstream) were answered all the same: only redelivery to the
    // survivor can have done it.
    assert_eq!(
        u64_at(v, "/ok"),
        u64_at(v, "/sent"),
        "a request was lost with its worker:\n{context}"
    );
    if test.kind == BrokerKind::Nats {
        let b = broker_topic(v, "b");
        assert!(u64_at(b, "/redelivered") >= 1, "{context}");
    }
    assert_killed_replica_is_the_incident(v, victim, context);
}

/// The broker server's address, once the run's broker process wrote it.
fn endpoint(results: &Path) -> Option<PeerAddr> {
    let file = find_files(results, "broker.endpoint").into_iter().next()?;
    let addr: std::net::SocketAddr = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    Some(addr.into())
}

// ---------------------------------------------------------------------------
// 3. Overload: a worker never holds more than its credit, and a task whose
//    deadline passed in the queue is never worked on.

fn nats_honours_the_credit_and_drops_expired_tasks() {
    credit_and_deadlines(BrokerKind::Nats, 2);
}

fn rabbitmq_honours_the_credit_and_drops_expired_tasks() {
    credit_and_deadlines(BrokerKind::Rabbitmq, 2);
}

fn a_nats_worker_with_credit_1_never_holds_2_tasks() {
    credit_and_deadlines(BrokerKind::Nats, 1);
}

fn a_rabbitmq_worker_with_credit_1_never_holds_2_tasks() {
    credit_and_deadlines(BrokerKind::Rabbitmq, 1);
}

fn credit_and_deadlines(kind: BrokerKind, credits: i64) {
    let test = BrokerTest::new(kind);
    // One worker with credit 2 (1) and 100 ms tasks takes 20/s (10/s);
    // 40/s arrive with 400 ms to live: the queue grows and most requests
    // expire in it.
    let scenario = test.scenario(
        "broker-overload",
        9,
        "",
        &format!(
            r#"rate = 40
duration = "2s"
timeout = "400ms"

[check]
max_error_rate = 1.0

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"
concurrency = {credits}
work = {{ kind = "sleep", dist = "fixed", value = "100ms" }}
"#
        ),
    );
    let Accounted {
        ref run_dir,
        ref v,
        ref context,
        ..
    } = test.finish(test.start(&scenario));
    let failed = u64_at(v, "/sent") - u64_at(v, "/ok");
    assert!(
        failed >= 10,
        "the scenario did not overload the worker:\n{context}"
    );

    // The worker's own record of what it worked on: b's server spans, each
    // from taking the task to answering it (a leaf: no downstream wait).
    // The deadline b's task carries is the one hop a gave it: a's clock
    // for the request's 400 ms starts when a received it (grpc-timeout is
    // relative), which is a's server span's start. Measured from the load
    // generator's send instead, the bound would also count how late a busy
    // machine delivers the request to a, which is not the broker's doing.
    // a passes on what remains of its deadline, read a few microseconds of
    // its own code before the producer puts it back on the clock: the
    // bound allows that much (`PASS_ON_US`); a task started late by the
    // broker or the worker is late by the tens of milliseconds tasks
    // spend expired in this queue.
    const PASS_ON_US: u64 = 1_000;
    let timeout_us = 400_000;
    // When each request was sent, only to say in a failure how late a got
    // it (requests.csv has the send's delay after the intended time).
    let send_delay_us: HashMap<i64, u64> = requests_csv(run_dir)
        .iter()
        .map(|r| (r.id as i64, r.send_delay_ns / 1000))
        .collect();
    let mut intervals = Vec::new();
    let mut served: HashMap<i64, u64> = HashMap::new();
    for trace in jaeger_traces(run_dir) {
        let mut taken = spans(&trace).iter().filter(|s| name(s) == "b").peekable();
        if taken.peek().is_none() {
            continue;
        }
        let a = spans(&trace)
            .iter()
            .find(|s| name(s) == "a")
            .unwrap_or_else(|| panic!("b's span without a's, its caller:\n{trace:#}"));
        let received = a["startTime"].as_u64().expect("startTime");
        let deadline = received + timeout_us + PASS_ON_US;
        let intended = spans(&trace)
            .iter()
            .find(|s| s["references"].as_array().is_some_and(Vec::is_empty))
            .and_then(|root| root["startTime"].as_u64());
        for s in taken {
            let start = s["startTime"].as_u64().expect("startTime");
            let end = start + s["duration"].as_u64().expect("duration");
            // Taken before the task's deadline, never after.
            let id = int_tag(s, "request_id").expect("request_id");
            let sent = intended.zip(send_delay_us.get(&id)).map(|(i, d)| i + d);
            assert!(
                start < deadline,
                "b started a task {} us after its deadline (a received the request {:?} us \
                 after its send):\n{trace:#}",
                start - deadline,
                sent.map(|sent| received.saturating_sub(sent))
            );
            intervals.push((start, end));
            *served.entry(id).or_default() += 1;
        }
    }
    assert!(!intervals.is_empty(), "b served nothing:\n{context}");
    // Never more than the credit at once.
    let mut events: BTreeMap<(u64, i8), i64> = BTreeMap::new();
    for (start, end) in &intervals {
        // Ends sort before starts at the same instant.
        *events.entry((*end, -1)).or_default() += 1;
        *events.entry((*start, 1)).or_default() += 1;
    }
    let (mut now, mut most) = (0i64, 0i64);
    for ((_, kind), n) in events {
        now += i64::from(kind) * n;
        most = most.max(now);
    }
    assert!(
        most <= credits,
        "b held {most} tasks at once with credit {credits}:\n{context}"
    );
    assert!(most >= 1);
    assert!(
        served.values().all(|n| *n == 1),
        "a task was served twice: {served:?}"
    );
}

// 3a. A NATS worker keeps its free credit requested ahead in pull requests
//     that the server ends unfilled when they expire: their slots come back,
//     and the worker never holds more tasks than its credit.

fn a_nats_worker_keeps_its_credit_exact_across_expired_pull_requests() {
    let kind = BrokerKind::Nats;
    let test = BrokerTest::new(kind);
    test.runtime.block_on(async {
        let server = test.server().await;
        let addr = PeerAddr::from(server.addr);
        let bounds = QueueBounds::default();
        let (topic, credits) = ("credit", 3u32);
        // Tasks held now, and the most held at once.
        let holding = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (holding, most) = (holding.clone(), most.clone());
            move |task: Task, _release: Release| {
                let (holding, most) = (holding.clone(), most.clone());
                async move {
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    Ok(task.payload)
                }
            }
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(backend::run_backend_worker(
            kind,
            addr.clone(),
            bounds,
            topic.to_owned(),
            "credit-worker".to_owned(),
            WorkerOptions::credits(credits),
            handler,
            async {
                let _ = stopped.await;
            },
        ));
        let producer = backend::Producer::connect_lazy(kind, &addr, bounds);
        let patience = Some(Duration::from_secs(60));
        let first = producer
            .submit(topic, vec![100], None, patience)
            .await
            .expect("the first task answered");
        assert_eq!(first, [100]);
        // The worker's open pull requests now hold its whole credit; the
        // server ends them at their expiry (a time it keeps, not a guess),
        // and only the slots they give back let the worker take more.
        tokio::time::sleep(nats::PULL_EXPIRES + nats::PULL_HEARTBEAT).await;
        let mut answers = tokio::task::JoinSet::new();
        for i in 0..4 * credits as u8 {
            let producer = producer.clone();
            answers.spawn(async move {
                let reply = producer.submit(topic, vec![i], None, patience).await;
                (i, reply)
            });
        }
        while let Some(answer) = answers.join_next().await {
            let (i, reply) = answer.expect("a submit task");
            assert_eq!(reply.expect("every task answered"), [i]);
        }
        // Twelve tasks queued at once behind 200 ms handlers: the worker
        // held its whole credit at a time, never more.
        assert_eq!(
            most.load(Ordering::SeqCst),
            credits as usize,
            "the most tasks the worker held at once, with credit {credits}"
        );
        let _ = stop.send(());
        worker
            .await
            .expect("the worker task")
            .expect("the worker ended cleanly");
        drop(producer);
        server.stop().await;
    });
}

// 3b. Tasks that expire in the queue behind a stalled worker are counted in
//     summary.json.

fn nats_counts_the_tasks_expired_behind_a_stalled_worker() {
    expired_counted(BrokerKind::Nats);
}

fn rabbitmq_counts_the_tasks_expired_behind_a_stalled_worker() {
    expired_counted(BrokerKind::Rabbitmq);
}

fn expired_counted(kind: BrokerKind) {
    let test = BrokerTest::shared(kind);
    // One worker (credit 1, 5 ms tasks) keeps up with 20/s until it is
    // stopped (SIGSTOP): then tasks wait in the queue past their 300 ms.
    // The load lasts long enough for that on a busy machine, where the
    // worker may take its first tasks late.
    let scenario = test.scenario(
        "broker-stalled",
        11,
        "",
        r#"rate = 20
duration = "6s"
timeout = "300ms"

[check]
max_error_rate = 1.0

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"
concurrency = 1
work = { kind = "sleep", dist = "fixed", value = "5ms" }
"#,
    );
    let results = test.results();
    let mut run = test.start(&scenario);
    // Stop the worker once the load runs through it (stopped before, it
    // would fail the launch's health check instead). RabbitMQ's statistics
    // count no deliveries: there the sign is hop a's producer connected to
    // the broker, which it does at its first task.
    let victim = run.wait_for("waiting for the worker to take tasks", || {
        let victim = pid_of(&results, "base", "hop-b-0")?;
        let taking = match kind {
            BrokerKind::Nats => test.stats_of_b().is_some_and(|s| s.dispatched >= 3),
            _ => {
                let producer = pid_of(&results, "base", "hop-a-0")?;
                let broker = endpoint(&results)?;
                connected(producer, broker.port())
                    && test.stats_of_b().is_some_and(|s| s.workers == 1)
            }
        };
        taking.then_some(victim)
    });
    assert!(
        runs_ours(victim, test.scratch.marker()),
        "pid {victim} is not hop-b-0"
    );
    let pid = Pid::from_raw(victim as i32);
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP hop-b-0");
    // Resume it once tasks have expired behind it: RabbitMQ drops them
    // from the queue itself; JetStream keeps them until a worker takes
    // them, so enough queued tasks (20/s, 300 ms to live) will have.
    run.wait_for("tasks to expire behind the stopped worker", || {
        test.stats_of_b()
            .is_some_and(|s| match kind {
                BrokerKind::Nats => s.depth >= 10,
                _ => s.expired >= 3,
            })
            .then_some(())
    });
    kill(pid, Signal::SIGCONT).expect("SIGCONT hop-b-0");
    let Accounted { v, context, .. } = test.finish(run);
    let failed = u64_at(&v, "/sent") - u64_at(&v, "/ok");
    let expired = u64_at(broker_topic(&v, "b"), "/expired");
    // At least the tasks seen expiring (RabbitMQ) or queued long enough
    // to (JetStream), never more than the requests that failed.
    assert!(
        (3..=failed).contains(&expired),
        "{expired} expired tasks counted, {failed} requests failed:\n{context}"
    );
}

// ---------------------------------------------------------------------------
// 4. The bound: a full queue refuses the next task with RESOURCE_EXHAUSTED.

fn a_full_nats_stream_refuses_with_resource_exhausted() {
    full_queue(BrokerKind::Nats);
}

fn a_full_rabbitmq_queue_refuses_with_resource_exhausted() {
    full_queue(BrokerKind::Rabbitmq);
}

fn full_queue(kind: BrokerKind) {
    let test = BrokerTest::shared(kind);
    // The server's output stays in the test's directory; a server that
    // does not get ready fails the test quoting the log's last lines.
    test.runtime.block_on(async {
        let server = test.server().await;
        // What the server printed went to its log, not to the terminal.
        let log = std::fs::read_to_string(server.log()).expect("the server's log");
        assert!(
            log.lines().count() > 1,
            "{} holds only its header:\n{log}",
            server.log().display()
        );
        let addr = PeerAddr::from(server.addr);
        let bounds = QueueBounds::default();
        let producer = backend::Producer::connect_lazy(kind, &addr, bounds);
        let topic = "full";
        let patience = Some(Duration::from_secs(120));
        // No worker: every task stays queued until the queue is full.
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..bounds.capacity {
            let producer = producer.clone();
            waiting.spawn(async move { producer.submit(topic, vec![1; 16], None, patience).await });
        }
        let depth = std::cell::Cell::new(None);
        wait_until_async(
            after(Duration::from_secs(60)),
            later(|| format!("a full queue; it holds {:?} tasks", depth.get())),
            async || {
                depth.set(
                    backend::stats(kind, &addr, bounds, &[topic.to_owned()])
                        .await
                        .ok()
                        .and_then(|s| s.first().map(|t| t.depth)),
                );
                // A refusal before the queue is full would be an answer.
                if let Some(answered) = waiting.try_join_next() {
                    panic!("a task was answered while the queue filled: {answered:?}");
                }
                (depth.get() == Some(u64::from(bounds.capacity))).then_some(())
            },
        )
        .await;
        let refused = producer
            .submit(topic, vec![1; 16], None, patience)
            .await
            .expect_err("one task more than the queue holds");
        assert_eq!(
            refused.code(),
            tonic::Code::ResourceExhausted,
            "{refused:?}"
        );
        assert!(refused.message().contains("is full"), "{refused:?}");
        // A producer asking for other bounds finds the queue as it is and
        // is told so, naming it.
        let other = backend::Producer::connect_lazy(
            kind,
            &addr,
            QueueBounds {
                capacity: 7,
                ..bounds
            },
        );
        let mismatch = other
            .submit(topic, vec![1; 16], None, patience)
            .await
            .expect_err("a queue declared with other bounds");
        assert_eq!(
            mismatch.code(),
            tonic::Code::FailedPrecondition,
            "{mismatch:?}"
        );
        assert!(mismatch.message().contains(topic), "{mismatch:?}");
        drop(other);
        waiting.abort_all();
        drop(producer);
        server.stop().await;
    });
}

fn a_nats_stream_holds_the_scenarios_queue_capacity_and_refuses_the_rest() {
    scenario_capacity(BrokerKind::Nats);
}

fn a_rabbitmq_queue_holds_the_scenarios_queue_capacity_and_refuses_the_rest() {
    scenario_capacity(BrokerKind::Rabbitmq);
}

/// The scenario's `queue_capacity` bounds the external broker's queue: 20
/// requests at once at a hop whose one worker (credit 1) is busy for 2 s
/// find room for 5 queued tasks (JetStream: held ones included, as a work
/// queue keeps a task until it is acknowledged; RabbitMQ: plus the one its
/// worker holds, which no longer counts), and the rest are refused at once
/// with RESOURCE_EXHAUSTED, counted so in summary.json. With the default
/// bound of 10,000 none would be.
fn scenario_capacity(kind: BrokerKind) {
    let test = BrokerTest::shared(kind);
    let scenario = test.scenario(
        "broker-bounded",
        13,
        "queue_capacity = 5\n",
        r#"rate = 200
requests = 20
timeout = "3s"

[check]
max_error_rate = 1.0

[[hop]]
name = "b"
transport = "pull"
concurrency = 1
work = { kind = "sleep", dist = "fixed", value = "2s" }
"#,
    );
    let Accounted {
        ref v, ref context, ..
    } = test.finish(test.start(&scenario));
    assert_eq!(u64_at(v, "/sent"), 20, "{context}");
    let refused = errors(v).get("resource_exhausted").copied().unwrap_or(0);
    let (capacity, credit) = (5, 1);
    let least = match kind {
        BrokerKind::Rabbitmq => 20 - capacity - credit,
        _ => 20 - capacity,
    };
    assert!(
        (least..=20 - capacity).contains(&refused),
        "{refused} requests refused RESOURCE_EXHAUSTED, expected {least} to {}:\n{context}",
        20 - capacity
    );
}

// ---------------------------------------------------------------------------
// 5. The broker's server killed mid-run: an incident, every request
//    still accounted for.

fn a_nats_server_killed_mid_run_is_an_incident_and_every_request_is_accounted() {
    let test = BrokerTest::new(BrokerKind::Nats);
    let scenario = test.scenario(
        "broker-killed",
        4,
        "",
        r#"rate = 50
duration = "3s"
timeout = "500ms"

[check]
max_error_rate = 1.0

[[hop]]
name = "a"

[[hop]]
name = "b"
transport = "pull"
work = { kind = "sleep", dist = "fixed", value = "1ms" }
"#,
    );
    let results = test.results();
    let mut run = test.start(&scenario);
    // Once tasks flow, kill the server (not the broker process that runs it).
    let server = run.wait_for("waiting for tasks through NATS", || {
        let flowing = test.stats_of_b().is_some_and(|t| t.enqueued >= 20);
        let broker = pid_of(&results, "base", "broker").filter(|_| flowing)?;
        let servers = processes_naming(&format!("tailmesh-nats-{broker}"));
        let (server, _) = servers.first().expect("the nats-server of the run");
        Some(*server)
    });
    kill(Pid::from_raw(server), Signal::SIGKILL).expect("SIGKILL nats-server");
    let Accounted {
        ref v, ref context, ..
    } = test.finish(run);
    assert!(
        u64_at(v, "/ok") < u64_at(v, "/sent"),
        "nothing failed without the broker:\n{context}"
    );
    let incidents: Vec<&str> = v
        .pointer("/incidents")
        .and_then(Value::as_array)
        .map(|i| i.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        incidents.iter().any(|i| i.contains("broker")),
        "no incident names the broker: {incidents:?}"
    );
}
