//! Request/reply through each pull backend, side by side in one run:
//! tailmesh's broker, NATS JetStream and RabbitMQ, through the very
//! producer and worker code pull hops use
//! (`tailmesh_services::broker::backend`).
//!
//! Cases, each a closed loop after a warmup:
//! - `echo`: the worker echoes the payload, at each `--inflight` value;
//! - `hop`: the worker is a zero-work pull hop (`HopCore::handle`, the
//!   request decoded, its reply path built and encoded), 1 in flight: the
//!   cost one pull hop adds to a request, broker round trip included.
//!
//! The producers run on a current-thread runtime on the main thread, the
//! worker on one of its own thread; tailmesh's broker runs in process on a
//! third thread, nats-server and rabbitmq-server as child processes
//! (started and stopped as a run starts them, see
//! `tailmesh::launcher::brokers`). Rounds alternate the order of the
//! backends. A backend whose server is missing is skipped with a message.

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use hdrhistogram::Histogram;
use prost::Message;
use tailmesh::launcher::brokers::BrokerServer;
use tailmesh_proto::pb::CallRequest;
use tailmesh_services::{
    addr::PeerAddr,
    broker::{
        self, BrokerConfig, Release, Task, WorkerOptions,
        backend::{AckWhen, Producer, run_backend_worker},
    },
    hop::{HopConfig, HopCore},
    model::{BrokerKind, HopBehavior, Transport, Work},
};
use tokio::sync::watch;

const TOPIC: &str = "bench";

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
    let kinds = [BrokerKind::Tailmesh, BrokerKind::Nats, BrokerKind::Rabbitmq];
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
    println!("| backend | case | in flight | p50 | p99 | throughput |");
    println!("|---|---|---|---|---|---|");
    for ((kind, case, inflight), r) in &results {
        let Some(h) = &r.hist else { continue };
        println!(
            "| {} | {case} | {inflight} | {} | {} | {:.0}/s |",
            kind.as_str(),
            fmt_ns(h.value_at_quantile(0.5)),
            fmt_ns(h.value_at_quantile(0.99)),
            r.requests as f64 / r.seconds
        );
    }
    Ok(())
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
                let thread = std::thread::spawn(move || -> Result<()> {
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
                });
                Ok::<_, anyhow::Error>((PeerAddr::from(addr), None, Some(thread)))
            }
            _ => {
                let server = BrokerServer::start(kind, Ipv4Addr::LOCALHOST.into())
                    .await
                    .context("start the server")?;
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
    let (stop, stopped) = watch::channel(false);
    let worker = {
        let (addr, topic) = (addr.clone(), topic.clone());
        std::thread::spawn(move || -> Result<()> {
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
                    topic,
                    "bench-worker".into(),
                    WorkerOptions::credits(64),
                    AckWhen::AfterReply,
                    handler,
                    async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    },
                )
                .await
                .map_err(|e| anyhow!("{e}"))
            })
        })
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let producer = Producer::connect_lazy(kind, addr);
        let payload = if case == "echo" {
            vec![7u8; args.payload]
        } else {
            CallRequest {
                request_id: 1,
                payload: vec![7u8; args.payload].into(),
                attempt: 0,
                caller: "bench".into(),
            }
            .encode_to_vec()
        };
        // Warm up until the worker answers, then measure.
        let warmup = (args.requests / 10).max(200);
        closed_loop(&producer, &topic, &payload, inflight, warmup).await?;
        closed_loop(&producer, &topic, &payload, inflight, args.requests).await
    });
    let _ = stop.send(true);
    let _ = worker.join();
    result
}

async fn closed_loop(
    producer: &Producer,
    topic: &str,
    payload: &[u8],
    inflight: usize,
    requests: u64,
) -> Result<Result1> {
    let hist = Arc::new(std::sync::Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        60_000_000_000,
        3,
    )?));
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let loops = (0..inflight).map(|_| {
        let (hist, next) = (hist.clone(), next.clone());
        async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                let t = Instant::now();
                producer
                    .submit(
                        topic,
                        payload.to_vec(),
                        HashMap::new(),
                        Some(Duration::from_secs(30)),
                    )
                    .await
                    .map_err(|s| anyhow!("submit: {}", s.message()))?;
                let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                if let Ok(mut h) = hist.lock() {
                    let _ = h.record(ns.max(1));
                }
            }
            Ok::<_, anyhow::Error>(())
        }
    });
    for r in futures::future::join_all(loops).await {
        r?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let hist = Arc::try_unwrap(hist)
        .map_err(|_| anyhow!("histogram still shared"))?
        .into_inner()
        .map_err(|_| anyhow!("histogram poisoned"))?;
    Ok(Result1 {
        hist: Some(hist),
        seconds,
        requests,
    })
}
