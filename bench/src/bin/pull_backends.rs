//! Request/reply through each pull backend, side by side in one run:
//! tailmesh's broker, NATS JetStream and RabbitMQ, through the very
//! producer and worker code pull hops use
//! (`tailmesh_services::broker::backend`).
//!
//! Cases, each a closed loop after a warmup:
//! - `echo`: the worker echoes the payload, at each `--inflight` value;
//! - `hop`: the worker is a zero-work pull hop (`HopCore::handle`, the
//!   request decoded, its reply path built and encoded), 1 in flight: the
//!   cost one pull hop adds to a request, broker round trip included;
//! - `core` (NATS and RabbitMQ): the broker's own request/reply with no
//!   queue a worker pulls from (NATS core request/reply, RabbitMQ direct
//!   reply-to: `baseline`), at each `--inflight` value, echoing.
//!
//! After the table, the ratios the pull backends are judged by: per
//! external broker, the `hop` median over the broker's `core` median at 1
//! in flight, and its `echo` throughput at the most in flight over
//! tailmesh's broker's.
//!
//! The producers run on a current-thread runtime on the main thread, the
//! worker on one of its own thread; tailmesh's broker runs in process on a
//! third thread, nats-server and rabbitmq-server as child processes
//! (started and stopped as a run starts them: `tailmesh_bench::start_server`).
//! Rounds alternate the order of the backends. A backend whose server is
//! missing is skipped with a message. `--backends` and `--cases` run a
//! subset (for a profile of one case: `bench/broker-profile.sh`); the
//! threads are named (`broker`, `worker`, `responder`; producers on the
//! main thread) so a profile tells them apart.

use std::{net::Ipv4Addr, process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use hdrhistogram::Histogram;
use prost::Message;
use tailmesh_bench::{Call, CallError, closed_loop, start_server};
use tailmesh_proto::pb::CallRequest;
use tailmesh_services::{
    addr::PeerAddr,
    broker::{
        self, BrokerConfig, Release, Task, WorkerOptions,
        backend::{Producer, run_backend_worker},
    },
    hop::{HopConfig, HopCore},
    model::{BrokerKind, HopBehavior, Transport, Work},
};
use tokio::sync::{oneshot, watch};

#[path = "pull_backends/baseline.rs"]
mod baseline;

const TOPIC: &str = "bench";
/// Longest one measurement (warmup or measured) may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a producer waits for each answer.
const PATIENCE: Duration = Duration::from_secs(30);

/// Request/reply through tailmesh's broker, NATS JetStream and RabbitMQ.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Requests measured per case and round.
    #[arg(long, default_value_t = 5_000)]
    requests: u64,
    /// Requests in flight for the echo case, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 64])]
    inflight: Vec<usize>,
    /// Rounds; each runs every backend once, in alternating order.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Payload bytes.
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Backends to run, comma-separated (tailmesh, nats, rabbitmq).
    #[arg(long, value_delimiter = ',', default_values_t = ["tailmesh".to_owned(), "nats".to_owned(), "rabbitmq".to_owned()], value_parser = ["tailmesh", "nats", "rabbitmq"])]
    backends: Vec<String>,
    /// Cases to run, comma-separated (echo, hop, core).
    #[arg(long, value_delimiter = ',', default_values_t = ["echo".to_owned(), "hop".to_owned(), "core".to_owned()], value_parser = ["echo", "hop", "core"])]
    cases: Vec<String>,
}

/// A backend, a case and its requests in flight.
type Case = (BrokerKind, &'static str, usize);

#[derive(Default)]
struct Result1 {
    hist: Option<Histogram<u64>>,
    seconds: f64,
    requests: u64,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    // The ratios hold only on a quiet machine: its load before and after.
    println!("load average before: {}", load_average());
    let kinds: Vec<BrokerKind> = [BrokerKind::Tailmesh, BrokerKind::Nats, BrokerKind::Rabbitmq]
        .into_iter()
        .filter(|k| args.backends.iter().any(|b| b == k.as_str()))
        .collect();
    let mut results: Vec<(Case, Result1)> = Vec::new();
    for round in 0..args.rounds {
        let order: Vec<BrokerKind> = if round % 2 == 0 {
            kinds.to_vec()
        } else {
            kinds.iter().rev().copied().collect()
        };
        for kind in order {
            match bench_backend(kind, &args) {
                Ok(cases) => {
                    for (key, r) in cases {
                        merge(&mut results, key, r);
                    }
                }
                Err(e) => eprintln!("{}: skipped: {e:#}", kind.as_str()),
            }
        }
    }
    println!("load average after:  {}", load_average());
    print_table(&results);
    print_ratios(&results, &args);
    Ok(())
}

/// The 1, 5 and 15 minute load averages, and the cores, as one line.
fn load_average() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    match std::fs::read_to_string("/proc/loadavg") {
        Ok(l) => {
            let three: Vec<&str> = l.split_whitespace().take(3).collect();
            format!("{}, {cores} cores", three.join(" "))
        }
        Err(e) => format!("unknown (/proc/loadavg: {e}), {cores} cores"),
    }
}

fn print_table(results: &[(Case, Result1)]) {
    println!("| backend | case | in flight | p50 | p99 | throughput |");
    println!("|---|---|---|---|---|---|");
    for ((kind, case, inflight), r) in results {
        let Some(h) = &r.hist else { continue };
        println!(
            "| {} | {case} | {inflight} | {} | {} | {:.0}/s |",
            kind.as_str(),
            fmt_ns(h.value_at_quantile(0.5)),
            fmt_ns(h.value_at_quantile(0.99)),
            r.requests as f64 / r.seconds
        );
    }
}

fn median(results: &[(Case, Result1)], key: Case) -> Option<u64> {
    let (_, r) = results.iter().find(|(k, _)| *k == key)?;
    Some(r.hist.as_ref()?.value_at_quantile(0.5))
}

fn throughput(results: &[(Case, Result1)], key: Case) -> Option<f64> {
    let (_, r) = results.iter().find(|(k, _)| *k == key)?;
    r.hist.as_ref()?;
    Some(r.requests as f64 / r.seconds)
}

/// The goals' ratios: a pull hop at 1 in flight over the same broker's
/// core request/reply (p50), and echo throughput at the most in flight
/// over tailmesh's broker's.
fn print_ratios(results: &[(Case, Result1)], args: &Args) {
    let most = args.inflight.iter().copied().max().unwrap_or(1);
    let tailmesh = throughput(results, (BrokerKind::Tailmesh, "echo", most));
    println!();
    println!(
        "| backend | hop p50 / core p50 (1 in flight) | echo throughput / tailmesh's ({most} in flight) |"
    );
    println!("|---|---|---|");
    for kind in [BrokerKind::Nats, BrokerKind::Rabbitmq] {
        let hop = median(results, (kind, "hop", 1));
        let core = median(results, (kind, "core", 1));
        let latency = match (hop, core) {
            (Some(h), Some(c)) if c > 0 => format!("{:.2}", h as f64 / c as f64),
            _ => "-".to_owned(),
        };
        let rate = match (throughput(results, (kind, "echo", most)), tailmesh) {
            (Some(k), Some(t)) if t > 0.0 => format!("{:.2}", k / t),
            _ => "-".to_owned(),
        };
        println!("| {} | {latency} | {rate} |", kind.as_str());
    }
}

fn merge(results: &mut Vec<(Case, Result1)>, key: Case, r: Result1) {
    if let Some((_, acc)) = results.iter_mut().find(|(k, _)| *k == key) {
        if let (Some(a), Some(b)) = (acc.hist.as_mut(), r.hist.as_ref()) {
            let _ = a.add(b);
        }
        acc.seconds += r.seconds;
        acc.requests += r.requests;
    } else {
        results.push((key, r));
    }
}

fn fmt_ns(ns: u64) -> String {
    if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{} us", ns / 1000)
    }
}

/// One backend: its server, a worker thread per case, every case.
fn bench_backend(kind: BrokerKind, args: &Args) -> Result<Vec<(Case, Result1)>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop_broker, broker_stopped) = watch::channel(false);
    let (addr, server, broker_thread) = runtime.block_on(async {
        match kind {
            BrokerKind::Tailmesh => {
                let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                let addr = listener.local_addr()?;
                let mut stopped = broker_stopped.clone();
                let thread = named_thread("broker", move || -> Result<()> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    rt.block_on(async {
                        listener.set_nonblocking(true)?;
                        let listener = tokio::net::TcpListener::from_std(listener)?;
                        let config = BrokerConfig {
                            topics: vec![TOPIC.into()],
                            ..BrokerConfig::default()
                        };
                        broker::run(config, listener, async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        })
                        .await
                        .map_err(|e| anyhow!("{e}"))
                    })
                })?;
                Ok::<_, anyhow::Error>((PeerAddr::from(addr), None, Some(thread)))
            }
            _ => {
                let server = start_server(kind, None).await.context("start the server")?;
                Ok((PeerAddr::from(server.addr), Some(server), None))
            }
        }
    })?;
    let mut out = Vec::new();
    let cases: Vec<(&'static str, usize)> = args
        .inflight
        .iter()
        .map(|n| ("echo", *n))
        .chain([("hop", 1)])
        .chain(
            args.inflight
                .iter()
                .filter(|_| kind != BrokerKind::Tailmesh)
                .map(|n| ("core", *n)),
        )
        .filter(|(case, _)| args.cases.iter().any(|c| c == case))
        .collect();
    let mut failure = None;
    for (case, inflight) in cases {
        match bench_case(kind, &addr, case, inflight, args) {
            Ok(r) => out.push(((kind, case, inflight), r)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let _ = stop_broker.send(true);
    if let Some(server) = server {
        runtime.block_on(server.stop());
    }
    if let Some(thread) = broker_thread {
        let _ = thread.join();
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn bench_case(
    kind: BrokerKind,
    addr: &PeerAddr,
    case: &'static str,
    inflight: usize,
    args: &Args,
) -> Result<Result1> {
    // A fresh topic per case keeps cases apart on the persistent brokers.
    let topic = format!("{TOPIC}-{case}-{inflight}");
    let topic = if kind == BrokerKind::Tailmesh {
        TOPIC.to_owned()
    } else {
        topic
    };
    if case == "core" {
        return bench_core(kind, addr, &topic, inflight, args);
    }
    let (stop, stopped) = watch::channel(false);
    let worker = {
        let (addr, topic) = (addr.clone(), topic.clone());
        named_thread("worker", move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let core = HopCore::new(&HopConfig {
                transport: Transport::Pull,
                ..HopConfig::new(HopBehavior {
                    name: topic.clone(),
                    seed: 1,
                    work: Work::None,
                    slow: None,
                    replica_slow: None,
                    error: None,
                })
            })
            .map_err(|e| anyhow!("{e}"))?;
            let mut stopped = stopped;
            rt.block_on(async move {
                let handler = move |task: Task, release: Release| {
                    let core = core.clone();
                    async move {
                        if case == "echo" {
                            drop(release);
                            return Ok(task.payload);
                        }
                        let request = CallRequest::decode(task.payload.as_slice())
                            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
                        let reply = core
                            .handle(request, None, Duration::ZERO, Some(release))
                            .await?;
                        Ok(reply.encode_to_vec())
                    }
                };
                run_backend_worker(
                    kind,
                    addr,
                    Default::default(),
                    topic,
                    "bench-worker".into(),
                    WorkerOptions::credits(64),
                    handler,
                    async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    },
                )
                .await
                .map_err(|e| anyhow!("{e}"))
            })
        })?
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let payload = if case == "echo" {
            vec![7u8; args.payload]
        } else {
            CallRequest {
                request_id: 1,
                payload: vec![7u8; args.payload].into(),
                attempt: 0,
                caller: "bench".into(),
                caller_slow: false,
                branch: 0,
                ..Default::default()
            }
            .encode_to_vec()
        };
        let submit = Submit {
            producer: Producer::connect_lazy(kind, addr, Default::default()),
            topic: topic.into(),
            payload: payload.into(),
        };
        warm_then_measure(&submit, inflight, args).await
    });
    let _ = stop.send(true);
    let _ = worker.join();
    result
}

/// `args.requests` calls of `call` at `inflight` in flight, after a
/// tenth as many (at least 200) that warm up until the other side answers.
async fn warm_then_measure<C: Call>(call: &C, inflight: usize, args: &Args) -> Result<Result1> {
    let warmup = (args.requests / 10).max(200);
    closed_loop(call, inflight, warmup, PHASE_TIMEOUT).await?;
    perf_control("enable")?;
    let sample = closed_loop(call, inflight, args.requests, PHASE_TIMEOUT).await;
    perf_control("disable")?;
    let sample = sample?;
    Ok(Result1 {
        seconds: sample.elapsed.as_secs_f64(),
        requests: sample.hist.len(),
        hist: Some(sample.hist),
    })
}

/// The `core` case: the broker's own request/reply, a responder on a
/// thread of its own as the worker would be.
fn bench_core(
    kind: BrokerKind,
    addr: &PeerAddr,
    subject: &str,
    inflight: usize,
    args: &Args,
) -> Result<Result1> {
    let subject = format!("core.{subject}");
    let (stop, stopped) = watch::channel(false);
    let (ready, is_ready) = oneshot::channel();
    let responder = {
        let (addr, subject) = (addr.clone(), subject.clone());
        named_thread("responder", move || -> Result<()> {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(baseline::responder(kind, addr, subject, stopped, ready))
        })?
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        is_ready
            .await
            .map_err(|_| anyhow!("the {} responder did not start", kind.as_str()))?;
        let payload = vec![7u8; args.payload];
        let requester = baseline::Requester::connect(kind, addr, &subject, &payload).await?;
        warm_then_measure(&requester, inflight, args).await
    });
    let _ = stop.send(true);
    match responder.join() {
        Ok(Err(e)) if result.is_ok() => return Err(e.context("the responder")),
        _ => {}
    }
    result
}

/// Environment variable naming perf's control and acknowledgement FIFOs,
/// `CTL,ACK` (`perf record -D -1 --control fifo:CTL,ACK`): perf then
/// records only the measured requests, not warmups or servers starting.
const PERF_CONTROL: &str = "PULL_BACKENDS_PERF_CONTROL";

/// Sends `command` (`enable`, `disable`) to perf and waits for its
/// acknowledgement, when [`PERF_CONTROL`] is set.
fn perf_control(command: &str) -> Result<()> {
    use std::io::{Read, Write};
    let Some(fifos) = std::env::var_os(PERF_CONTROL) else {
        return Ok(());
    };
    let fifos = fifos.to_string_lossy().into_owned();
    let (ctl, ack) = fifos
        .split_once(',')
        .with_context(|| format!("{PERF_CONTROL}={fifos}: want CTL,ACK"))?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(ctl)
        .and_then(|mut f| f.write_all(format!("{command}\n").as_bytes()))
        .with_context(|| format!("perf control {ctl}: {command}"))?;
    // "ack\n", perhaps after the NUL that ended the previous one.
    let mut ack_fifo =
        std::fs::File::open(ack).with_context(|| format!("perf acknowledgement {ack}"))?;
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        ack_fifo
            .read_exact(&mut byte)
            .with_context(|| format!("perf acknowledgement {ack} of {command}"))?;
    }
    Ok(())
}

/// A thread with a name, so a profile tells the bench's threads apart
/// (the producers run on the main thread).
fn named_thread<F>(name: &str, f: F) -> Result<std::thread::JoinHandle<Result<()>>>
where
    F: FnOnce() -> Result<()> + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .with_context(|| format!("spawn the {name} thread"))
}

/// One task submitted to a topic, answered by the case's worker.
#[derive(Clone)]
struct Submit {
    producer: Producer,
    topic: Arc<str>,
    payload: Arc<[u8]>,
}

impl Call for Submit {
    async fn call(&mut self) -> Result<(), CallError> {
        self.producer
            .submit(&self.topic, self.payload.to_vec(), None, Some(PATIENCE))
            .await
            .map(drop)
            .map_err(|s| format!("submit: {}", s.message()).into())
    }
}
