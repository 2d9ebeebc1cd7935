//! The service roles the one tailmesh binary can play besides orchestrating:
//! `tailmesh hop` (a hop replica) and `tailmesh broker` (the pull broker). The launcher re-executes the binary with
//! these subcommands, so a fresh clone needs nothing else. Each role sets up
//! its own tracing, with OTLP export when the launcher asks for it.

use std::{future::Future, net::SocketAddr, path::PathBuf, pin::Pin};

use anyhow::Context;
use tailmesh_netfault::agent::{AgentBackend, NetBackend};
use tailmesh_services::{broker::BrokerConfig, hop::HopConfig, process};

/// Options of `tailmesh hop`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Where to write the bound address once listening.
    pub addr_file: Option<PathBuf>,
    /// Exit when standard input closes (the launcher holds its write end).
    pub supervised: bool,
    /// Runtime threads: 1 runs a current-thread runtime (the fastest on
    /// small machines, see PERF.md).
    pub threads: usize,
}

/// Builds the runtime the options ask for.
pub fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder
        .enable_all()
        .build()
        .context("start the tokio runtime")
}

/// Runs a hop replica from its JSON config file (written by the local and
/// netns launchers) until told to stop.
pub fn serve_hop(config_path: &std::path::Path, options: &ServeOptions) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("read hop config {}", config_path.display()))?;
    let config: HopConfig = serde_json::from_str(&text)
        .with_context(|| format!("parse hop config {}", config_path.display()))?;
    let control = netns_agent(&config)?;
    serve_hop_config(config, control, options)
}

/// Which deployed replica a `tailmesh hop --scenario` process is.
#[derive(Clone, Debug)]
pub struct DeployedHop {
    /// The scenario file.
    pub scenario: PathBuf,
    /// The variant (may be omitted when the scenario has one).
    pub variant: Option<String>,
    /// The hop.
    pub hop: String,
    /// The replica index.
    pub replica: u32,
}

/// Runs a replica of a deployed mesh (Docker Compose, Kubernetes): its
/// configuration comes from the scenario, the addresses of the broker and
/// of the hops it calls from the deployment's service names, its Control
/// token (when the deployment applies network faults) from the file named
/// by `TAILMESH_CONTROL_TOKEN_FILE`.
pub fn serve_deployed_hop(which: &DeployedHop, options: &ServeOptions) -> anyhow::Result<()> {
    let (scenario, _) =
        crate::scenario::load(&which.scenario).map_err(|e| anyhow::anyhow!("{e}"))?;
    let variant = match &which.variant {
        Some(name) => scenario
            .variants
            .iter()
            .find(|v| &v.name == name)
            .with_context(|| {
                let names: Vec<&str> = scenario.variants.iter().map(|v| v.name.as_str()).collect();
                format!(
                    "{}: no variant {name:?} (it has {})",
                    which.scenario.display(),
                    names.join(", ")
                )
            })?,
        None if scenario.variants.len() == 1 => &scenario.variants[0],
        None => anyhow::bail!(
            "{}: the scenario has {} variants; say which with --variant",
            which.scenario.display(),
            scenario.variants.len()
        ),
    };
    let hop = variant
        .hops
        .iter()
        .find(|h| h.name == which.hop)
        .with_context(|| {
            format!(
                "{}: variant {:?} has no hop {:?}",
                which.scenario.display(),
                variant.name,
                which.hop
            )
        })?;
    anyhow::ensure!(
        which.replica < hop.replicas,
        "{}: hop {:?} has {} replica(s); there is no replica {}",
        which.scenario.display(),
        hop.name,
        hop.replicas,
        which.replica
    );
    let addrs = crate::plan::Naming::for_variant(&scenario, variant, crate::deploy::SERVICE_PORT)
        .addrs(variant)
        .map_err(|e| anyhow::anyhow!("{}: {e}", which.scenario.display()))?;
    let config =
        crate::plan::MeshPlan::new(&scenario, variant).hop_config(hop, which.replica, &addrs);
    let control = match read_token_file()? {
        Some(token) => {
            let exe = std::env::current_exe().context("find the tailmesh executable")?;
            let seed = agent_seed(&config);
            Some(tailmesh_services::control::ControlService::new(
                token,
                AgentBackend(Some(own_namespace_backend(exe, seed)?)),
            ))
        }
        None => None,
    };
    serve_hop_config(config, control, options)
}

/// The Control token in the file named by `TAILMESH_CONTROL_TOKEN_FILE`,
/// if the variable is set.
pub fn read_token_file() -> anyhow::Result<Option<String>> {
    let Some(path) = std::env::var_os(crate::deploy::TOKEN_FILE_ENV) else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "read the Control token from {} ({})",
            PathBuf::from(&path).display(),
            crate::deploy::TOKEN_FILE_ENV
        )
    })?;
    let token = token.trim().to_owned();
    anyhow::ensure!(
        !token.is_empty(),
        "the Control token file {} is empty",
        PathBuf::from(&path).display()
    );
    Ok(Some(token))
}

/// The fault agent of a hop in its own namespace (a container or pod): it
/// shapes the interface of the default route, starts its delay line
/// itself, and fails the hop's start when it cannot act (no NET_ADMIN, no
/// nft), so a deployment never runs a fault it cannot apply.
fn own_namespace_backend(exe: PathBuf, seed: u64) -> anyhow::Result<NetBackend> {
    let iface = tailmesh_netfault::container_iface();
    NetBackend::own(
        iface.clone(),
        std::env::temp_dir().join("tailmesh-delay-line.log"),
        exe,
        seed,
    )
    .with_context(|| {
        format!(
            "fault agent on {iface}: the container needs CAP_NET_ADMIN and the nft and \
             iptables commands"
        )
    })
}

/// The seed of a replica's fault agent (its delay line's jitter draws).
fn agent_seed(config: &HopConfig) -> u64 {
    config.behavior.seed ^ u64::from(config.replica)
}

fn serve_hop_config(
    config: HopConfig,
    control: Option<tailmesh_services::control::ControlService<AgentBackend>>,
    options: &ServeOptions,
) -> anyhow::Result<()> {
    let name = format!(
        "hop \"{}\" replica {}",
        config.behavior.name, config.replica
    );
    serve(&name, options, |listener, shutdown| async move {
        tailmesh_services::hop::run_with_control(config, listener, shutdown, control)
            .await
            .map_err(anyhow::Error::from)
    })
}

/// The fault agent of a hop under the netns launcher: it serves only with
/// the run's token, and acts on the namespace the launcher describes.
fn netns_agent(
    config: &HopConfig,
) -> anyhow::Result<Option<tailmesh_services::control::ControlService<AgentBackend>>> {
    let name = format!(
        "hop \"{}\" replica {}",
        config.behavior.name, config.replica
    );
    let control = match std::env::var(crate::launcher::netns::CONTROL_TOKEN_ENV) {
        Ok(token) if !token.is_empty() => {
            let agent = std::env::var(crate::launcher::netns::AGENT_ENV)
                .ok()
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .with_context(|| format!("{name}: parse {}", crate::launcher::netns::AGENT_ENV))?;
            let exe = std::env::current_exe().context("find the tailmesh executable")?;
            let seed = agent_seed(config);
            let backend = agent
                .map(|a| NetBackend::new(a, exe, seed))
                .transpose()
                .with_context(|| format!("{name}: fault agent"))?;
            Some(tailmesh_services::control::ControlService::new(
                token,
                AgentBackend(backend),
            ))
        }
        _ => None,
    };
    Ok(control)
}

/// Runs the pull broker until told to stop.
pub fn serve_broker(config: BrokerConfig, options: &ServeOptions) -> anyhow::Result<()> {
    serve("broker", options, |listener, shutdown| async move {
        tailmesh_services::broker::run(config, listener, shutdown)
            .await
            .map_err(anyhow::Error::from)
    })
}

/// Binds, announces the address to the launcher, and runs `service` until
/// a signal or the end of standard input.
fn serve<F, Fut>(name: &str, options: &ServeOptions, service: F) -> anyhow::Result<()>
where
    F: FnOnce(tokio::net::TcpListener, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    runtime(options.threads)?.block_on(async {
        let telemetry = tailmesh_services::telemetry::init("warn");
        let result = serve_in(name, options, service).await;
        telemetry.shutdown();
        result
    })
}

async fn serve_in<F, Fut>(name: &str, options: &ServeOptions, service: F) -> anyhow::Result<()>
where
    F: FnOnce(tokio::net::TcpListener, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    {
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("{name}: bind {}", options.listen))?;
        let addr = listener
            .local_addr()
            .with_context(|| format!("{name}: local address"))?;
        if let Some(path) = &options.addr_file {
            process::write_addr_file(path, addr)
                .with_context(|| format!("{name}: write {}", path.display()))?;
        }
        tracing::info!(%addr, "{name} listening");
        let shutdown = Box::pin(process::shutdown_signal(options.supervised));
        service(listener, shutdown)
            .await
            .with_context(|| format!("{name} on {addr}"))
    }
}
