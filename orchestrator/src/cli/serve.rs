//! What the binary does inside a mesh or a container rather than for a
//! person at a terminal: the service roles the launchers and deployments
//! start (`hop`, `broker`, `delay-line`), the health check containers run
//! (`health`) and the Control token a Compose deployment writes (`token`).

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::Args;
use tailmesh::{
    launcher::health::ProbeError,
    roles::{self, DeployedHop, RuntimeError, ServeOptions},
};
use tailmesh_services::{
    addr::{AddrError, PeerAddr},
    broker::BrokerConfig,
    discipline::Discipline,
    limits::MAX_CALL_MESSAGE_BYTES,
    model::BrokerKind,
};

use super::CliError;

/// How a service role listens and lives.
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write the bound address to this file once listening.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Exit when standard input closes (set by the launchers).
    #[arg(long)]
    supervised: bool,
    /// Runtime threads (1: a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

impl ServeArgs {
    fn options(&self) -> ServeOptions {
        ServeOptions {
            listen: self.listen,
            addr_file: self.addr_file.clone(),
            supervised: self.supervised,
            threads: self.threads,
        }
    }
}

/// `tailmesh hop`.
#[derive(Args)]
pub(crate) struct HopArgs {
    /// The hop's JSON config file (local and netns launchers).
    #[arg(
        long,
        required_unless_present = "scenario",
        conflicts_with = "scenario"
    )]
    config: Option<PathBuf>,
    /// Deployed: the scenario to derive this replica's configuration from.
    #[arg(long, requires = "hop")]
    scenario: Option<PathBuf>,
    /// Deployed: the variant (when the scenario has several).
    #[arg(long, requires = "scenario")]
    variant: Option<String>,
    /// Deployed: the hop this replica belongs to.
    #[arg(long, requires = "scenario")]
    hop: Option<String>,
    /// Deployed: the replica index.
    #[arg(long, requires = "scenario", default_value_t = 0)]
    replica: u32,
    /// Deployed, with [mesh] tls on: the folder of this replica's ca.crt,
    /// tls.crt and tls.key (what tailmesh compose and tailmesh k8s mount).
    #[arg(long, requires = "scenario", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Deployed, with [hop.service] command: where the deployment runs
    /// this replica's service (HOST:PORT); the hop serves once it is ready.
    #[arg(long, requires = "scenario", value_name = "HOST:PORT")]
    service_address: Option<String>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Serves one hop replica until told to stop.
pub(crate) fn hop(args: HopArgs) -> Result<(), CliError> {
    let options = args.serve.options();
    match (args.config, args.scenario, args.hop) {
        (Some(config), _, _) => roles::serve_hop(&config, &options)?,
        (None, Some(scenario), Some(hop)) => roles::serve_deployed_hop(
            &DeployedHop {
                scenario,
                variant: args.variant,
                hop,
                replica: args.replica,
                tls_dir: args.tls_dir,
                service_address: args.service_address,
            },
            &options,
        )?,
        // clap's requirements leave no other case.
        _ => {
            return Err(
                anyhow::anyhow!("tailmesh hop needs --config, or --scenario and --hop").into(),
            );
        }
    }
    Ok(())
}

/// `tailmesh broker --kind`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum KindArg {
    Tailmesh,
    Rabbitmq,
    Nats,
}

/// `tailmesh broker`.
#[derive(Args)]
pub(crate) struct BrokerArgs {
    /// Topics to serve (the names of the hops reached by pull).
    #[arg(long, value_delimiter = ',', required = true)]
    topics: Vec<String>,
    /// The queue discipline of a topic, as TOPIC=fifo|lifo|adaptive (topics
    /// not named are fifo).
    #[arg(long, value_delimiter = ',', value_parser = topic_discipline)]
    discipline: Vec<(String, Discipline)>,
    /// Most tasks queued per topic; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = BrokerConfig::default().queue_capacity)]
    queue_capacity: usize,
    /// Most payload bytes queued per topic (64 MiB by default, at least the
    /// 4 MiB payload limit); more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = BrokerConfig::default().queue_bytes)]
    queue_bytes: usize,
    /// Deliveries a task may have before losing its workers fails it.
    #[arg(long, default_value_t = 3)]
    max_deliveries: u32,
    /// Which broker: tailmesh's own, or a RabbitMQ or NATS server run as
    /// this process's child (installed from their Debian packages).
    #[arg(long, value_enum, default_value_t = KindArg::Tailmesh)]
    kind: KindArg,
    /// TLS (tailmesh's broker only): the run's CA certificate, PEM; with
    /// --tls-cert and --tls-key the listener speaks TLS only.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// TLS: this broker's certificate, PEM.
    #[arg(long, requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// TLS: its private key, PEM.
    #[arg(long, requires = "tls_ca")]
    tls_key: Option<PathBuf>,
    /// TLS: refuse clients without a certificate signed by the CA (mtls).
    #[arg(long, requires = "tls_ca")]
    tls_mutual: bool,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Serves the pull broker until told to stop.
pub(crate) fn broker(args: BrokerArgs) -> Result<(), CliError> {
    let options = args.serve.options();
    let kind = match args.kind {
        KindArg::Tailmesh => None,
        KindArg::Rabbitmq => Some(BrokerKind::Rabbitmq),
        KindArg::Nats => Some(BrokerKind::Nats),
    };
    if let Some(kind) = kind {
        return Ok(roles::serve_broker_server(kind, &options)?);
    }
    let config = BrokerConfig {
        topics: args.topics,
        disciplines: args.discipline.into_iter().collect(),
        queue_capacity: args.queue_capacity,
        queue_bytes: args.queue_bytes,
        max_deliveries: args.max_deliveries,
        // Its tasks and results are whole hop messages, a full payload
        // plus its framing.
        max_payload_bytes: MAX_CALL_MESSAGE_BYTES,
        tls: match (args.tls_ca, args.tls_cert, args.tls_key) {
            (Some(ca), Some(cert), Some(key)) => Some(tailmesh_services::tls::TlsFiles {
                ca,
                cert,
                key,
                mutual: args.tls_mutual,
                resumption: true,
            }),
            _ => None,
        },
        ..BrokerConfig::default()
    };
    Ok(roles::serve_broker(config, &options)?)
}

/// One `--discipline` value: `TOPIC=DISCIPLINE`.
fn topic_discipline(value: &str) -> Result<(String, Discipline), String> {
    let (topic, discipline) = value
        .split_once('=')
        .ok_or_else(|| format!("expected TOPIC=DISCIPLINE, got {value:?}"))?;
    let discipline = discipline.parse().map_err(|e| format!("{e}"))?;
    Ok((topic.to_owned(), discipline))
}

/// `tailmesh delay-line`.
#[derive(Args)]
pub(crate) struct DelayLineArgs {
    /// The NFQUEUE number.
    #[arg(long)]
    queue: u16,
    /// Hold every packet this long ("10ms").
    #[arg(long, value_parser = humantime::parse_duration)]
    delay: Duration,
    /// Plus or minus up to this, uniformly (at most the delay).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0us")]
    jitter: Duration,
    /// Seed of the jitter draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Serves the delay line until standard input closes.
pub(crate) fn delay_line(args: DelayLineArgs) -> Result<(), CliError> {
    tailmesh_netfault::delayline::run(args.queue, args.delay, args.jitter, args.seed)
        .with_context(|| format!("delay line on queue {}", args.queue))?;
    Ok(())
}

/// `tailmesh health`.
#[derive(Args)]
pub(crate) struct HealthArgs {
    /// host:port.
    addr: String,
    /// Bound on the connection and the call.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    timeout: Duration,
    /// Check over TLS: trust the ca.crt in DIR and present its tls.crt and
    /// tls.key when the service asks for a client certificate (mtls).
    #[arg(long, value_name = "DIR")]
    tls_dir: Option<PathBuf>,
}

/// Why `tailmesh health` did not find the service SERVING.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HealthError {
    /// The address is not host:port (bad input).
    #[error(transparent)]
    Addr(#[from] AddrError),
    /// The check's runtime could not be built.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The service did not answer SERVING.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// The TLS folder is unusable.
    #[error(transparent)]
    Tls(#[from] tailmesh::deploy::tls::TlsDirError),
}

/// Asks the service once whether it is SERVING.
pub(crate) fn health(args: HealthArgs) -> Result<(), CliError> {
    let check = || -> Result<(), HealthError> {
        let addr: PeerAddr = args.addr.parse()?;
        if let Some(dir) = &args.tls_dir {
            tailmesh_services::tls::install_client(Some(tailmesh::deploy::tls::client_in(
                dir, false,
            )?));
        }
        roles::runtime(1)?.block_on(tailmesh::launcher::health::check(
            &addr,
            args.timeout,
            tailmesh::launcher::health::Readiness::PROCESS,
        ))?;
        Ok(())
    };
    check().map_err(CliError::Health)
}

/// `tailmesh load`.
#[derive(Args)]
pub(crate) struct LoadArgs {
    /// The hop replica, host:port.
    addr: String,
    /// Requests in flight.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Measured requests.
    #[arg(long, default_value_t = 20000, value_parser = clap::value_parser!(u64).range(1..))]
    requests: u64,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    connections: u32,
    /// Unmeasured time first.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    warmup: Duration,
    /// Each request's deadline.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    timeout: Duration,
    /// Payload bytes.
    #[arg(long, default_value_t = 64, value_parser = payload_bytes)]
    payload: usize,
}

/// Drives one replica closed loop and prints the numbers as JSON.
pub(crate) fn load(args: LoadArgs) -> Result<(), CliError> {
    use tailmesh::loadgen::standalone::{Standalone, against};
    let addr: PeerAddr = args
        .addr
        .parse()
        .with_context(|| format!("load: the replica {:?}", args.addr))?;
    let spec = Standalone {
        concurrency: args.concurrency,
        requests: args.requests,
        connections: args.connections,
        warmup: args.warmup,
        timeout: args.timeout,
        payload: args.payload,
    };
    let report = roles::runtime(1)
        .context("load")?
        .block_on(against(&addr, &spec))
        .context("load")?;
    let json = serde_json::to_string(&report).context("load: JSON")?;
    tailmesh::say!("{json}");
    Ok(())
}

/// `tailmesh generator`.
#[derive(Args)]
pub(crate) struct GeneratorArgs {
    /// The orchestrator's address, host:port (a name is resolved).
    #[arg(long)]
    hub: String,
    /// Which generator this is, from 0. Without it, the index is read
    /// from the environment variable `--index-env` names (a Kubernetes
    /// Indexed Job's pods get theirs in JOB_COMPLETION_INDEX).
    #[arg(long, required_unless_present = "index_env")]
    index: Option<u32>,
    /// The environment variable that holds the index.
    #[arg(long, value_name = "VAR", conflicts_with = "index")]
    index_env: Option<String>,
    /// Serve every variant of the run, connecting again after each, until
    /// the orchestrator says the run is over (a deployment's generators,
    /// awaited by `tailmesh run --generators-at`); without it, one
    /// variant (the orchestrator started this process).
    #[arg(long)]
    stay: bool,
}

/// Sends its part of each variant's load for the orchestrator at `--hub`.
pub(crate) fn generator(args: GeneratorArgs) -> Result<(), CliError> {
    let index = match (args.index, &args.index_env) {
        (Some(index), _) => index,
        (None, Some(var)) => {
            let value = std::env::var(var)
                .with_context(|| format!("--index-env {var}: the variable is not set"))?;
            value
                .trim()
                .parse()
                .with_context(|| format!("--index-env {var}: {value:?} is not a generator index"))?
        }
        (None, None) => return Err(anyhow::anyhow!("give --index or --index-env").into()),
    };
    let joining = tailmesh::loadgen::fleet::member::Joining {
        hub: args.hub,
        index,
        stay: args.stay,
        token: roles::read_token_file().context("generator")?,
    };
    roles::runtime(1)
        .context("generator")?
        .block_on(tailmesh::loadgen::fleet::member::serve(joining))
        .map_err(|e| CliError::Failed(e.into()))
}

/// `--payload`: bytes, at most what one call may carry.
fn payload_bytes(text: &str) -> Result<usize, String> {
    let max = tailmesh_services::limits::MAX_PAYLOAD_BYTES;
    match text.parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        Ok(n) => Err(format!("{n} bytes is over the limit of {max}")),
        Err(e) => Err(format!("not a number of bytes: {e}")),
    }
}

/// `tailmesh token`.
#[derive(Args)]
pub(crate) struct TokenArgs {
    /// The file to write (mode 0600); kept if it already holds a token.
    out: PathBuf,
}

/// Writes a fresh Control token, unless the file already holds one.
pub(crate) fn token(args: TokenArgs) -> Result<(), CliError> {
    tailmesh::deploy::write_token(&args.out).map_err(anyhow::Error::from)?;
    Ok(())
}
