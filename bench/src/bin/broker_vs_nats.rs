//! Request/reply through the tailmesh broker vs through nats-server, side by
//! side in one run.
//!
//! Both systems get the same arrangement of threads and runtimes:
//! - the requesters (tailmesh producers / NATS requesters) run on a
//!   current-thread tokio runtime on the main thread, over one connection;
//! - the responder side (the tailmesh worker / the NATS responder) runs on a
//!   current-thread runtime on its own thread, over its own connection;
//! - the middle (the tailmesh broker / nats-server) runs on its own: the
//!   broker on a current-thread runtime on a third thread (in process),
//!   nats-server as a child process on 127.0.0.1 with a free port.
//!
//! Each case is a closed loop with a fixed number of requests in flight,
//! measured after a warmup; the cases are repeated in rounds whose order
//! alternates (A B ... then ... B A), so noise on a shared machine hits every
//! system. nats-server is started and stopped as a run's NATS server is
//! (`tailmesh_bench::start_server`), its output in its own log; it is
//! stopped on success, error, Ctrl-C and SIGTERM, and killed (by its
//! process group) on a panic.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde::Serialize;
use tailmesh_bench::{Call, CallError, Sample, closed_loop, histogram, start_server};
use tailmesh_services::{
    broker::{self, BrokerClient, BrokerConfig},
    model::BrokerKind,
};
use tokio::sync::{oneshot, watch};

/// The NATS subject the responder serves.
const SUBJECT: &str = "tailmesh.bench.echo";
/// Longest any single measurement (warmup or measured) may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest the responder and the workers may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Request/reply through the tailmesh broker vs through nats-server.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Requests measured per case and round.
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Warmup requests before each measurement [default: requests / 10,
    /// at least 500].
    #[arg(long)]
    warmup: Option<u64>,
    /// Payload size in bytes (the same bytes are echoed back and checked).
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Requests in flight (closed loop), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 64])]
    inflight: Vec<usize>,
    /// Credits of the tailmesh worker, one broker topic and worker per
    /// value, comma-separated. A NATS responder has no credit limit; credit
    /// = in flight is its closest peer.
    #[arg(long, value_delimiter = ',', default_values_t = [64, 1])]
    credits: Vec<u32>,
    /// Rounds; each round runs every case once, in alternating order.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Write the results as JSON to this file as well.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The nats-server binary [default: found in PATH, /usr/sbin or
    /// /usr/local/sbin].
    #[arg(long)]
    nats_server: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("broker_vs_nats: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    ensure!(args.requests > 0, "--requests must be at least 1");
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    ensure!(
        !args.inflight.is_empty() && args.inflight.iter().all(|&k| k > 0),
        "--inflight takes positive numbers"
    );
    ensure!(
        args.credits.iter().all(|&c| c > 0),
        "--credits takes positive numbers"
    );
    let mut credits: Vec<u32> = Vec::new();
    for &c in &args.credits {
        if !credits.contains(&c) {
            credits.push(c);
        }
    }
    let warmup = args.warmup.unwrap_or((args.requests / 10).max(500));

    // Its own runtime starts and stops nats-server (a child is waited for
    // on the runtime that spawned it); declared first so a panic drops
    // (kills) it last, after the servers' threads have stopped.
    let control_rt = current_thread()?;
    let nats = control_rt
        .block_on(start_server(BrokerKind::Nats, args.nats_server.as_deref()))
        .context("start nats-server")?;
    let broker_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .context("bind the broker's listener")?;
    broker_listener
        .set_nonblocking(true)
        .context("set the broker's listener non-blocking")?;
    let broker_addr = broker_listener.local_addr().context("broker address")?;
    let topics: Vec<String> = credits.iter().map(|c| topic_for(*c)).collect();

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = Servers {
        stop: stop_tx,
        threads: Vec::new(),
    };
    servers.spawn("broker", {
        let stop = stop_rx.clone();
        let config = BrokerConfig {
            topics: topics.clone(),
            ..BrokerConfig::default()
        };
        move || {
            current_thread()?.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(broker_listener)?;
                broker::run(config, listener, stopped(stop)).await?;
                Ok(())
            })
        }
    })?;
    let (ready_tx, ready_rx) = oneshot::channel();
    servers.spawn("responder", {
        let stop = stop_rx.clone();
        let nats_addr = nats.addr;
        let credits = credits.clone();
        move || {
            current_thread()?.block_on(responders(nats_addr, broker_addr, credits, stop, ready_tx))
        }
    })?;

    let probe = CpuProbe {
        own_pid: std::process::id(),
        nats_pid: nats.pid().unwrap_or_default(),
    };
    let client_rt = current_thread()?;
    let results = client_rt.block_on(async {
        tokio::select! {
            r = bench(args, &credits, warmup, nats.addr, broker_addr, probe, ready_rx) => r,
            r = interrupted() => Err(r),
        }
    });
    drop(client_rt);
    drop(servers);
    control_rt.block_on(nats.stop());
    let results = results?;
    print_report(args, warmup, &results);
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&json_report(args, warmup, &results))?;
        std::fs::write(path, json + "\n").with_context(|| format!("write {}", path.display()))?;
        println!("\nJSON written to {}", path.display());
    }
    Ok(())
}

/// The arrangement, as printed and written to JSON.
const ARRANGEMENT: &str = "requesters: current-thread runtime on the main thread, one \
connection; responder (NATS subscriber / tailmesh worker): current-thread runtime on its own \
thread, own connection; middle: tailmesh broker on a current-thread runtime on a third thread \
(in process) / nats-server as a child process (Go, default GOMAXPROCS)";

fn topic_for(credits: u32) -> String {
    format!("echo-c{credits}")
}

fn current_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("build a tokio runtime")
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Resolves on Ctrl-C or SIGTERM, with the error to stop with.
async fn interrupted() -> anyhow::Error {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => return anyhow!("install a SIGTERM handler: {e}"),
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => anyhow!("interrupted (SIGINT)"),
        _ = term.recv() => anyhow!("terminated (SIGTERM)"),
    }
}

/// The server-side threads; told to stop and joined when dropped.
struct Servers {
    stop: watch::Sender<bool>,
    threads: Vec<(&'static str, JoinHandle<Result<()>>)>,
}

impl Servers {
    fn spawn(
        &mut self,
        name: &'static str,
        body: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(body)
            .with_context(|| format!("spawn the {name} thread"))?;
        self.threads.push((name, handle));
        Ok(())
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for (name, handle) in self.threads.drain(..) {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("broker_vs_nats: {name} thread: {e:#}"),
                Err(_) => eprintln!("broker_vs_nats: {name} thread panicked"),
            }
        }
    }
}

/// The responder thread: a NATS subscriber echoing every request, and one
/// tailmesh worker (echoing too) per credit value.
async fn responders(
    nats_addr: SocketAddr,
    broker_addr: SocketAddr,
    credits: Vec<u32>,
    stop: watch::Receiver<bool>,
    ready: oneshot::Sender<()>,
) -> Result<()> {
    let mut workers = tokio::task::JoinSet::new();
    for c in credits {
        let stop = stop.clone();
        workers.spawn(broker::run_worker(
            broker_addr,
            topic_for(c),
            format!("echo-c{c}"),
            c,
            |task: broker::Task| async move { Ok(task.payload) },
            stopped(stop),
        ));
    }

    let client = nats_connect(nats_addr).await?;
    let mut sub = client.subscribe(SUBJECT).await.context("NATS subscribe")?;
    client.flush().await.context("NATS flush")?;
    let _ = ready.send(());
    let mut stop_fut = std::pin::pin!(stopped(stop));
    loop {
        tokio::select! {
            () = &mut stop_fut => break,
            msg = sub.next() => {
                let Some(msg) = msg else { bail!("NATS subscription ended") };
                if let Some(reply) = msg.reply {
                    client.publish(reply, msg.payload).await.context("NATS publish")?;
                }
            }
        }
    }
    drop(sub);
    while let Some(joined) = workers.join_next().await {
        joined.context("worker task")?.context("tailmesh worker")?;
    }
    Ok(())
}

async fn nats_connect(addr: SocketAddr) -> Result<async_nats::Client> {
    // No per-request timer (the broker side sets no deadline either); a
    // whole phase is bounded by PHASE_TIMEOUT instead.
    async_nats::ConnectOptions::new()
        .request_timeout(None)
        .connect(format!("nats://{addr}"))
        .await
        .with_context(|| format!("connect to nats-server at {addr}"))
}

/// A NATS request whose echo is checked.
#[derive(Clone)]
struct NatsEcho {
    client: async_nats::Client,
    payload: Bytes,
}

impl Call for NatsEcho {
    async fn call(&mut self) -> Result<(), CallError> {
        let reply = self.client.request(SUBJECT, self.payload.clone()).await?;
        if reply.payload != self.payload {
            return Err("NATS echoed other bytes".into());
        }
        Ok(())
    }
}

/// A task submitted to a broker topic whose echo is checked.
#[derive(Clone)]
struct BrokerEcho {
    client: BrokerClient,
    topic: Arc<str>,
    payload: Bytes,
}

impl Call for BrokerEcho {
    async fn call(&mut self) -> Result<(), CallError> {
        let reply = self
            .client
            .submit(&self.topic, self.payload.to_vec(), HashMap::new(), None)
            .await?;
        if reply.payload != self.payload[..] {
            return Err("the broker echoed other bytes".into());
        }
        Ok(())
    }
}

/// One measurement: latencies and wall time of `requests` calls, and the
/// CPU time each component spent meanwhile.
struct Measured {
    hist: Histogram<u64>,
    elapsed: Duration,
    cpu: Cpu,
}

/// CPU time in ns, per component (from /proc/.../schedstat).
#[derive(Clone, Copy, Default, Debug)]
struct Cpu {
    /// The requesters' thread (this process's main thread).
    requesters: u64,
    /// The tailmesh broker thread, or every nats-server thread.
    middle: u64,
    /// The responder thread (NATS subscriber and tailmesh workers).
    responder: u64,
}

impl Cpu {
    fn minus(self, before: Cpu) -> Cpu {
        Cpu {
            requesters: self.requesters.saturating_sub(before.requesters),
            middle: self.middle.saturating_sub(before.middle),
            responder: self.responder.saturating_sub(before.responder),
        }
    }

    fn plus(self, other: Cpu) -> Cpu {
        Cpu {
            requesters: self.requesters + other.requesters,
            middle: self.middle + other.middle,
            responder: self.responder + other.responder,
        }
    }
}

/// Where the CPU time of each component is read.
#[derive(Clone, Copy)]
struct CpuProbe {
    own_pid: u32,
    nats_pid: u32,
}

impl CpuProbe {
    /// The CPU time so far of each component; `nats` picks nats-server as
    /// the middle, else the broker thread. Zero where /proc cannot tell.
    fn read(self, nats: bool) -> Cpu {
        let own = threads_cpu(self.own_pid);
        let thread = |name: &str| {
            own.iter()
                .filter(|(_, comm, _)| comm == name)
                .map(|(_, _, ns)| ns)
                .sum()
        };
        let requesters = own
            .iter()
            .filter(|(tid, _, _)| *tid == self.own_pid)
            .map(|(_, _, ns)| ns)
            .sum();
        let middle = if nats {
            threads_cpu(self.nats_pid).iter().map(|(_, _, ns)| ns).sum()
        } else {
            thread("broker")
        };
        Cpu {
            requesters,
            middle,
            responder: thread("responder"),
        }
    }
}

/// (tid, comm, CPU ns) of every thread of `pid`.
fn threads_cpu(pid: u32) -> Vec<(u32, String, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let tid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let path = entry.path();
        let comm = std::fs::read_to_string(path.join("comm")).ok()?;
        // The first field of schedstat: time spent on a CPU, in ns.
        let sched = std::fs::read_to_string(path.join("schedstat")).ok()?;
        let ns = sched.split_whitespace().next()?.parse().ok()?;
        Some((tid, comm.trim_end().to_owned(), ns))
    })
    .collect()
}

/// A closed loop of `requests` calls with `inflight` outstanding, and the
/// CPU time each component spent meanwhile.
async fn measure<C: Call>(
    caller: &C,
    inflight: usize,
    requests: u64,
    cpu: impl Fn() -> Cpu,
) -> Result<Measured> {
    let cpu_before = cpu();
    let Sample { hist, elapsed } = closed_loop(caller, inflight, requests, PHASE_TIMEOUT).await?;
    Ok(Measured {
        hist,
        elapsed,
        cpu: cpu().minus(cpu_before),
    })
}

/// Which system a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Nats,
    Broker { credits: u32 },
}

impl System {
    fn label(self) -> String {
        match self {
            System::Nats => "nats".into(),
            System::Broker { credits } => format!("tailmesh c={credits}"),
        }
    }
}

/// Every round of one (system, in-flight) case.
struct Case {
    system: System,
    inflight: usize,
    rounds: Vec<Measured>,
}

impl Case {
    fn merged(&self) -> Histogram<u64> {
        let mut all = histogram();
        for s in &self.rounds {
            let _ = all.add(&s.hist);
        }
        all
    }

    /// CPU time per request of each component, in us, over every round.
    fn cpu_per_request(&self) -> [f64; 3] {
        let n: u64 = self.rounds.iter().map(|s| s.hist.len()).sum();
        let cpu = self
            .rounds
            .iter()
            .fold(Cpu::default(), |acc, s| acc.plus(s.cpu));
        let per = |ns: u64| ns as f64 / 1_000.0 / n as f64;
        [per(cpu.requesters), per(cpu.middle), per(cpu.responder)]
    }

    fn throughput(&self) -> f64 {
        let n: u64 = self.rounds.iter().map(|s| s.hist.len()).sum();
        let t: f64 = self.rounds.iter().map(|s| s.elapsed.as_secs_f64()).sum();
        n as f64 / t
    }
}

fn round_throughput(s: &Measured) -> f64 {
    s.hist.len() as f64 / s.elapsed.as_secs_f64()
}

async fn bench(
    args: &Args,
    credits: &[u32],
    warmup: u64,
    nats_addr: SocketAddr,
    broker_addr: SocketAddr,
    probe: CpuProbe,
    responder_ready: oneshot::Receiver<()>,
) -> Result<Vec<Case>> {
    tokio::time::timeout(READY_TIMEOUT, responder_ready)
        .await
        .map_err(|_| anyhow!("the NATS responder was not ready within {READY_TIMEOUT:?}"))?
        .map_err(|_| anyhow!("the responder thread failed at startup"))?;
    let nats = nats_connect(nats_addr).await?;
    let mut client = BrokerClient::connect(broker_addr)
        .await
        .context("connect to the broker")?;
    wait_for_workers(&mut client, credits).await?;

    let mut systems = vec![System::Nats];
    systems.extend(credits.iter().map(|&credits| System::Broker { credits }));
    let mut cases: Vec<Case> = Vec::new();
    for &inflight in &args.inflight {
        for &system in &systems {
            cases.push(Case {
                system,
                inflight,
                rounds: Vec::new(),
            });
        }
    }
    let payload = Bytes::from(
        (0..args.payload)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>(),
    );
    let total = args.rounds as usize * cases.len();
    let mut done = 0;
    for round in 0..args.rounds {
        let mut order: Vec<usize> = (0..cases.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let case = &mut cases[i];
            done += 1;
            eprint!(
                "[{done}/{total}] round {} {} in flight {} ... ",
                round + 1,
                case.system.label(),
                case.inflight
            );
            let sample = match case.system {
                System::Nats => {
                    let conn = NatsEcho {
                        client: nats.clone(),
                        payload: payload.clone(),
                    };
                    let cpu = || probe.read(true);
                    measure(&conn, case.inflight, warmup, cpu).await?;
                    measure(&conn, case.inflight, args.requests, cpu).await?
                }
                System::Broker { credits } => {
                    let conn = BrokerEcho {
                        client: client.clone(),
                        topic: topic_for(credits).into(),
                        payload: payload.clone(),
                    };
                    let cpu = || probe.read(false);
                    measure(&conn, case.inflight, warmup, cpu).await?;
                    measure(&conn, case.inflight, args.requests, cpu).await?
                }
            };
            eprintln!(
                "p50 {:.0} us, {:.0}/s",
                us(sample.hist.value_at_quantile(0.5)),
                round_throughput(&sample)
            );
            case.rounds.push(sample);
        }
    }
    Ok(cases)
}

/// Waits until every topic has its worker connected.
async fn wait_for_workers(client: &mut BrokerClient, credits: &[u32]) -> Result<()> {
    let started = Instant::now();
    loop {
        let stats = client.stats(None).await.context("broker stats")?;
        let ready = credits.iter().all(|&c| {
            let topic = topic_for(c);
            stats.iter().any(|s| s.topic == topic && s.workers >= 1)
        });
        if ready {
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!("the tailmesh workers did not connect within {READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1_000.0
}

fn fmt_us(ns: u64) -> String {
    let v = us(ns);
    if v >= 1_000.0 {
        format!("{:.2} ms", v / 1_000.0)
    } else {
        format!("{v:.0} us")
    }
}

fn print_report(args: &Args, warmup: u64, cases: &[Case]) {
    println!();
    println!(
        "request/reply, {}-byte payload, {} requests per case and round after {} warmup, {} rounds (order alternating)",
        args.payload, args.requests, warmup, args.rounds
    );
    println!("arrangement: {ARRANGEMENT}");
    println!("tailmesh c=N: one worker with N credits; NATS responder: no credit limit");
    println!();
    println!(
        "| system | in flight | p50 | p99 | p99.9 | max | throughput | per round (p50 / req/s) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for case in cases {
        let h = case.merged();
        let per_round: Vec<String> = case
            .rounds
            .iter()
            .map(|s| {
                format!(
                    "{} / {:.0}",
                    fmt_us(s.hist.value_at_quantile(0.5)),
                    round_throughput(s)
                )
            })
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0}/s | {} |",
            case.system.label(),
            case.inflight,
            fmt_us(h.value_at_quantile(0.5)),
            fmt_us(h.value_at_quantile(0.99)),
            fmt_us(h.value_at_quantile(0.999)),
            fmt_us(h.max()),
            case.throughput(),
            per_round.join(", ")
        );
    }
    println!();
    println!(
        "CPU time per request, us (from /proc schedstat; middle = broker thread / nats-server process)"
    );
    println!("| system | in flight | requesters | middle | responder | total |");
    println!("|---|---|---|---|---|---|");
    for case in cases {
        let [r, m, w] = case.cpu_per_request();
        println!(
            "| {} | {} | {r:.1} | {m:.1} | {w:.1} | {:.1} |",
            case.system.label(),
            case.inflight,
            r + m + w
        );
    }
    println!();
    println!(
        "ratios tailmesh / NATS (latency: >1 = tailmesh slower; throughput: <1 = tailmesh lower); per-round paired ratios in brackets"
    );
    println!("| system | in flight | p50 | p99 | p99.9 | throughput |");
    println!("|---|---|---|---|---|---|");
    for (case, nats) in ratio_pairs(cases) {
        let (h, n) = (case.merged(), nats.merged());
        let q = |q: f64| {
            let rounds: Vec<String> = case
                .rounds
                .iter()
                .zip(&nats.rounds)
                .map(|(a, b)| {
                    format!(
                        "{:.2}",
                        a.hist.value_at_quantile(q) as f64 / b.hist.value_at_quantile(q) as f64
                    )
                })
                .collect();
            format!(
                "{:.2} [{}]",
                h.value_at_quantile(q) as f64 / n.value_at_quantile(q) as f64,
                rounds.join(", ")
            )
        };
        let tput_rounds: Vec<String> = case
            .rounds
            .iter()
            .zip(&nats.rounds)
            .map(|(a, b)| format!("{:.2}", round_throughput(a) / round_throughput(b)))
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {:.2} [{}] |",
            case.system.label(),
            case.inflight,
            q(0.5),
            q(0.99),
            q(0.999),
            case.throughput() / nats.throughput(),
            tput_rounds.join(", ")
        );
    }
}

/// Every tailmesh case with the NATS case of the same in-flight count.
fn ratio_pairs(cases: &[Case]) -> Vec<(&Case, &Case)> {
    cases
        .iter()
        .filter(|c| c.system != System::Nats)
        .filter_map(|c| {
            cases
                .iter()
                .find(|n| n.system == System::Nats && n.inflight == c.inflight)
                .map(|n| (c, n))
        })
        .collect()
}

#[derive(Serialize)]
struct JsonReport {
    payload_bytes: usize,
    requests: u64,
    warmup: u64,
    rounds: u32,
    arrangement: &'static str,
    cases: Vec<JsonCase>,
    ratios: Vec<JsonRatio>,
}

#[derive(Serialize)]
struct JsonCase {
    system: String,
    credits: Option<u32>,
    inflight: usize,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    throughput_per_s: f64,
    cpu_us_per_request: JsonCpu,
    rounds: Vec<JsonRound>,
}

#[derive(Serialize)]
struct JsonCpu {
    requesters: f64,
    middle: f64,
    responder: f64,
}

#[derive(Serialize)]
struct JsonRound {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    throughput_per_s: f64,
}

#[derive(Serialize)]
struct JsonRatio {
    system: String,
    inflight: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    throughput: f64,
}

fn json_report(args: &Args, warmup: u64, cases: &[Case]) -> JsonReport {
    let json_cases = cases
        .iter()
        .map(|c| {
            let h = c.merged();
            let [requesters, middle, responder] = c.cpu_per_request();
            JsonCase {
                cpu_us_per_request: JsonCpu {
                    requesters,
                    middle,
                    responder,
                },
                system: c.system.label(),
                credits: match c.system {
                    System::Nats => None,
                    System::Broker { credits } => Some(credits),
                },
                inflight: c.inflight,
                p50_us: us(h.value_at_quantile(0.5)),
                p99_us: us(h.value_at_quantile(0.99)),
                p999_us: us(h.value_at_quantile(0.999)),
                max_us: us(h.max()),
                throughput_per_s: c.throughput(),
                rounds: c
                    .rounds
                    .iter()
                    .map(|s| JsonRound {
                        p50_us: us(s.hist.value_at_quantile(0.5)),
                        p99_us: us(s.hist.value_at_quantile(0.99)),
                        p999_us: us(s.hist.value_at_quantile(0.999)),
                        throughput_per_s: round_throughput(s),
                    })
                    .collect(),
            }
        })
        .collect();
    let ratios = ratio_pairs(cases)
        .into_iter()
        .map(|(c, n)| {
            let (h, nh) = (c.merged(), n.merged());
            let r = |q: f64| h.value_at_quantile(q) as f64 / nh.value_at_quantile(q) as f64;
            JsonRatio {
                system: c.system.label(),
                inflight: c.inflight,
                p50: r(0.5),
                p99: r(0.99),
                p999: r(0.999),
                throughput: c.throughput() / n.throughput(),
            }
        })
        .collect();
    JsonReport {
        payload_bytes: args.payload,
        requests: args.requests,
        warmup,
        rounds: args.rounds,
        arrangement: ARRANGEMENT,
        cases: json_cases,
        ratios,
    }
}
