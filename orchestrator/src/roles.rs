//! The service roles the one tailmesh binary can play besides orchestrating:
//! `tailmesh hop` (a hop replica) and `tailmesh broker` (the pull broker). The launcher re-executes the binary with
//! these subcommands, so a fresh clone needs nothing else. Each role sets up
//! its own tracing, with OTLP export when the launcher asks for it.

use std::{future::Future, net::SocketAddr, path::PathBuf, pin::Pin};

use tailmesh_netfault::agent::{AgentBackend, NetBackend};
use tailmesh_services::{
    broker::{BrokerConfig, BrokerError},
    hop::{HopConfig, HopError},
    process,
    telemetry::Process,
};

use crate::scenario::{ScenarioErrors, ServiceSource};

/// The tokio runtime could not be built.
#[derive(Debug, thiserror::Error)]
#[error("start the tokio runtime: {0}")]
pub struct RuntimeError(#[source] std::io::Error);

/// Why a service role could not start or stopped with an error. Each
/// message names the role (`hop "b" replica 1`, `broker`) or the file it
/// came from.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The role's runtime could not be built.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The hop's config file could not be read.
    #[error("read hop config {}: {source}", path.display())]
    ReadConfig {
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The hop's config file is not a hop config.
    #[error("parse hop config {}: {source}", path.display())]
    ParseConfig {
        path: PathBuf,
        /// The JSON error, with its line and column.
        source: serde_json::Error,
    },
    /// A deployed hop's scenario is not valid.
    #[error("{0}")]
    Scenario(#[from] ScenarioErrors),
    /// `--variant` names no variant of the scenario.
    #[error("{}: no variant {variant:?} (it has {})", scenario.display(), names.join(", "))]
    NoVariant {
        /// The scenario file.
        scenario: PathBuf,
        /// The variant asked for.
        variant: String,
        /// The scenario's variants.
        names: Vec<String>,
    },
    /// The scenario has several variants and `--variant` was not given.
    #[error("{}: the scenario has {count} variants; say which with --variant", scenario.display())]
    WhichVariant {
        /// The scenario file.
        scenario: PathBuf,
        /// How many variants it has.
        count: usize,
    },
    /// `--hop` names no hop of the variant.
    #[error("{}: variant {variant:?} has no hop {hop:?}", scenario.display())]
    NoHop {
        /// The scenario file.
        scenario: PathBuf,
        variant: String,
        /// The hop asked for.
        hop: String,
    },
    /// `--replica` is past the hop's replicas.
    #[error(
        "{}: hop {hop:?} has {replicas} replica(s); there is no replica {replica}",
        scenario.display()
    )]
    NoReplica {
        /// The scenario file.
        scenario: PathBuf,
        hop: String,
        /// Its replicas.
        replicas: u32,
        /// The replica asked for.
        replica: u32,
    },
    /// The deployment's service names do not make addresses.
    #[error("{}: {source}", scenario.display())]
    Naming {
        /// The scenario file.
        scenario: PathBuf,
        /// The NamingError it failed with.
        source: crate::plan::NamingError,
    },
    /// A deployed hop whose service is started by a command was not told
    /// where the deployment runs it.
    #[error(
        "{}: hop {hop:?} has [hop.service] command, run beside it by the deployment: give its \
         address with --service-address (tailmesh compose and tailmesh k8s do)",
        scenario.display()
    )]
    NoServiceAddress {
        /// The scenario file.
        scenario: PathBuf,
        hop: String,
    },
    /// `--service-address` for a hop that has no service started by a
    /// command.
    #[error(
        "{}: --service-address is for a hop whose [hop.service] has a command, and hop {hop:?} \
         has none",
        scenario.display()
    )]
    UnusedServiceAddress {
        /// The scenario file.
        scenario: PathBuf,
        hop: String,
    },
    /// The path of this executable (the fault agent's delay line runs it).
    #[error("find the tailmesh executable: {0}")]
    Exe(#[source] std::io::Error),
    /// The Control token file could not be read.
    #[error(
        "read the Control token from {} ({}): {source}",
        path.display(),
        crate::deploy::TOKEN_FILE_ENV
    )]
    ReadToken {
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The Control token file holds no token.
    #[error("the Control token file {} is empty", path.display())]
    EmptyToken { path: PathBuf },
    /// The fault agent of a deployed hop cannot act in its container.
    #[error(
        "fault agent on {iface}: the container needs CAP_NET_ADMIN and the nft and iptables \
         commands: {source}"
    )]
    OwnNamespace {
        /// The container's interface.
        iface: String,
        /// The FaultError it failed with.
        source: tailmesh_netfault::FaultError,
    },
    /// The netns launcher's description of the agent is not readable.
    #[error("{name}: parse {}: {source}", crate::launcher::netns::AGENT_ENV)]
    AgentEnv {
        name: String,
        /// The JSON error, with its line and column.
        source: serde_json::Error,
    },
    /// The fault agent under the netns launcher cannot act.
    #[error("{name}: fault agent: {source}")]
    Agent {
        name: String,
        /// The FaultError it failed with.
        source: tailmesh_netfault::FaultError,
    },
    /// The deployed hop's variant uses TLS and no `--tls-dir` was given.
    #[error(
        "{}: variant {variant:?} has [mesh] tls = {mode:?}: give the folder of this replica's \
         certificates with --tls-dir (tailmesh compose and tailmesh k8s mount it at {})",
        scenario.display(),
        crate::deploy::tls::TLS_DIR
    )]
    NoTlsDir {
        /// The scenario file.
        scenario: PathBuf,
        variant: String,
        /// `tls` or `mtls`.
        mode: &'static str,
    },
    /// The replica's TLS folder is unusable.
    #[error("hop {hop:?} replica {replica}: {source}")]
    TlsDir {
        hop: String,
        replica: u32,
        source: Box<crate::deploy::tls::TlsDirError>,
    },
    /// The listening address could not be bound.
    #[error("{name}: bind {addr}: {source}")]
    Bind {
        name: String,
        addr: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The bound address could not be read.
    #[error("{name}: local address: {source}")]
    LocalAddr {
        name: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The bound address could not be handed to the launcher.
    #[error("{name}: write {}: {source}", path.display())]
    AddrFile {
        name: String,
        /// The address file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The service failed while serving.
    #[error("{name} on {addr}: {source}")]
    Serve {
        name: String,
        /// Where it listened.
        addr: SocketAddr,
        /// The ServiceError it failed with.
        source: Box<ServiceError>,
    },
}

/// The error of the service a role runs.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A hop replica's.
    #[error(transparent)]
    Hop(#[from] HopError),
    /// The broker's.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// Another broker's server, run as a child.
    #[error(transparent)]
    BrokerServer(#[from] crate::launcher::brokers::BrokerProcessError),
    /// A deployed hop's service did not get ready in time.
    #[error("its service: {0}")]
    NotReady(#[source] Box<crate::run::ServiceError>),
}

/// Options of `tailmesh hop`.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Where to write the bound address once listening.
    pub addr_file: Option<PathBuf>,
    /// Exit when standard input closes (the launcher holds its write end).
    pub supervised: bool,
    /// Runtime threads: 1 runs a current-thread runtime, the fastest on
    /// small machines, where a mesh's processes already share the few cores
    /// and a multi-thread runtime only adds wake-ups across threads.
    pub threads: usize,
}

/// Builds the runtime the options ask for.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, RuntimeError> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all().build().map_err(RuntimeError)
}

/// Runs a hop replica from its JSON config file (written by the local and
/// netns launchers) until told to stop.
pub fn serve_hop(config_path: &std::path::Path, options: &ServeOptions) -> Result<(), RoleError> {
    let text = std::fs::read_to_string(config_path).map_err(|source| RoleError::ReadConfig {
        path: config_path.to_owned(),
        source,
    })?;
    let config: HopConfig =
        serde_json::from_str(&text).map_err(|source| RoleError::ParseConfig {
            path: config_path.to_owned(),
            source,
        })?;
    let control = netns_agent(&config)?;
    serve_hop_config(config, control, options, None)
}

/// Which deployed replica a `tailmesh hop --scenario` process is.
#[derive(Clone, Debug)]
pub struct DeployedHop {
    /// The scenario file.
    pub scenario: PathBuf,
    /// The variant (may be omitted when the scenario has one).
    pub variant: Option<String>,
    pub hop: String,
    /// The replica index.
    pub replica: u32,
    /// The folder of its CA, certificate and key, when its variant uses
    /// TLS (`--tls-dir`).
    pub tls_dir: Option<PathBuf>,
    /// Where its own service (`[hop.service] command`) is, run beside it
    /// by the deployment (`--service-address`).
    pub service_address: Option<String>,
}

/// Runs a replica of a deployed mesh (Docker Compose, Kubernetes): its
/// configuration comes from the scenario, the addresses of the broker and
/// of the hops it calls from the deployment's service names, its Control
/// token (when the deployment applies faults at run time) from the file
/// named by `TAILMESH_CONTROL_TOKEN_FILE`.
pub fn serve_deployed_hop(which: &DeployedHop, options: &ServeOptions) -> Result<(), RoleError> {
    let (scenario, _) = crate::scenario::load(&which.scenario)?;
    let variant = match &which.variant {
        Some(name) => scenario
            .variants
            .iter()
            .find(|v| &v.name == name)
            .ok_or_else(|| RoleError::NoVariant {
                scenario: which.scenario.clone(),
                variant: name.clone(),
                names: scenario.variants.iter().map(|v| v.name.clone()).collect(),
            })?,
        None => match scenario.variants.as_slice() {
            [only] => only,
            all => {
                return Err(RoleError::WhichVariant {
                    scenario: which.scenario.clone(),
                    count: all.len(),
                });
            }
        },
    };
    let hop = variant
        .hops
        .iter()
        .find(|h| h.name == which.hop)
        .ok_or_else(|| RoleError::NoHop {
            scenario: which.scenario.clone(),
            variant: variant.name.clone(),
            hop: which.hop.clone(),
        })?;
    if which.replica >= hop.replicas {
        return Err(RoleError::NoReplica {
            scenario: which.scenario.clone(),
            hop: hop.name.clone(),
            replicas: hop.replicas,
            replica: which.replica,
        });
    }
    let addrs = crate::plan::Naming::for_variant(&scenario, variant, crate::deploy::SERVICE_PORT)
        .addrs(variant)
        .map_err(|source| RoleError::Naming {
            scenario: which.scenario.clone(),
            source,
        })?;
    let mut addrs = addrs;
    match (&hop.service, &which.service_address) {
        (Some(service), Some(address)) if matches!(service.source, ServiceSource::Command(_)) => {
            addrs.services.insert(
                crate::plan::hop_role(&hop.name, which.replica),
                address.clone(),
            );
        }
        (Some(service), None) if matches!(service.source, ServiceSource::Command(_)) => {
            return Err(RoleError::NoServiceAddress {
                scenario: which.scenario.clone(),
                hop: hop.name.clone(),
            });
        }
        (_, Some(_)) => {
            return Err(RoleError::UnusedServiceAddress {
                scenario: which.scenario.clone(),
                hop: hop.name.clone(),
            });
        }
        _ => {}
    }
    let mut config =
        crate::plan::MeshPlan::new(&scenario, variant).hop_config(hop, which.replica, &addrs);
    // The sidecar serves (and so passes its health checks) only once its
    // service is ready, as the local launcher starts a hop only then.
    let wait = config
        .service
        .as_ref()
        .zip(hop.service.as_ref())
        .map(|(call, service)| (call.address.clone(), service.ready_timeout));
    let mesh = variant.mesh;
    if mesh.tls.is_on() {
        let dir = which.tls_dir.as_ref().ok_or_else(|| RoleError::NoTlsDir {
            scenario: which.scenario.clone(),
            variant: variant.name.clone(),
            mode: mesh.tls.as_str(),
        })?;
        let files = crate::deploy::tls::files_in(
            dir,
            mesh.tls == tailmesh_services::tls::TlsMode::Mtls,
            mesh.tls_resumption,
        )
        .map_err(|source| RoleError::TlsDir {
            hop: hop.name.clone(),
            replica: which.replica,
            source: Box::new(source),
        })?;
        config.tls = Some(files);
    }
    // A replica with a network fault changes its own namespace (NET_ADMIN);
    // one with only windows of slowness or errors needs no network agent.
    let net_fault = hop.net_of(which.replica).is_some_and(|f| f.is_active());
    let control = match read_token_file()? {
        Some(token) => {
            let backend = if net_fault {
                let exe = std::env::current_exe().map_err(RoleError::Exe)?;
                Some(own_namespace_backend(exe, agent_seed(&config))?)
            } else {
                None
            };
            Some(tailmesh_services::control::ControlService::new(
                token,
                AgentBackend(backend),
            ))
        }
        None => None,
    };
    serve_hop_config(config, control, options, wait)
}

/// The Control token in the file named by `TAILMESH_CONTROL_TOKEN_FILE`,
/// if the variable is set.
pub fn read_token_file() -> Result<Option<String>, RoleError> {
    let Some(path) = std::env::var_os(crate::deploy::TOKEN_FILE_ENV) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    let token = std::fs::read_to_string(&path).map_err(|source| RoleError::ReadToken {
        path: path.clone(),
        source,
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(RoleError::EmptyToken { path });
    }
    Ok(Some(token.to_owned()))
}

/// The fault agent of a hop in its own namespace (a container or pod): it
/// shapes the interface of the default route, starts its delay line
/// itself, and fails the hop's start when it cannot act (no NET_ADMIN, no
/// nft), so a deployment never runs a fault it cannot apply.
fn own_namespace_backend(exe: PathBuf, seed: u64) -> Result<NetBackend, RoleError> {
    let iface = tailmesh_netfault::container_iface();
    NetBackend::own(
        iface.clone(),
        std::env::temp_dir().join("tailmesh-delay-line.log"),
        exe,
        seed,
    )
    .map_err(|source| RoleError::OwnNamespace { iface, source })
}

/// The seed of a replica's fault agent (its delay line's jitter draws).
fn agent_seed(config: &HopConfig) -> u64 {
    config.behavior.seed ^ u64::from(config.replica)
}

fn serve_hop_config(
    config: HopConfig,
    control: Option<tailmesh_services::control::ControlService<AgentBackend>>,
    options: &ServeOptions,
    wait_for_service: Option<(String, std::time::Duration)>,
) -> Result<(), RoleError> {
    let name = format!(
        "hop \"{}\" replica {}",
        config.behavior.name, config.replica
    );
    let process = Process::hop(&config.behavior.name, config.replica, config.transport);
    serve_as(&name, options, &process, |listener, shutdown| async move {
        if let Some((address, timeout)) = wait_for_service {
            crate::run::wait_for_address(&address, timeout)
                .await
                .map_err(|source| ServiceError::NotReady(Box::new(source)))?;
        }
        tailmesh_services::hop::run_with_control(config, listener, shutdown, control)
            .await
            .map_err(ServiceError::from)
    })
}

/// The fault agent of a hop: it serves only with the run's token, and acts
/// on the namespace the netns launcher describes; without a description
/// (the local launcher, for fault windows) it changes only the hop's
/// application-level faults.
fn netns_agent(
    config: &HopConfig,
) -> Result<Option<tailmesh_services::control::ControlService<AgentBackend>>, RoleError> {
    let name = format!(
        "hop \"{}\" replica {}",
        config.behavior.name, config.replica
    );
    let control = match std::env::var(tailmesh_services::serving::CONTROL_TOKEN_ENV) {
        Ok(token) if !token.is_empty() => {
            let agent = std::env::var(crate::launcher::netns::AGENT_ENV)
                .ok()
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .map_err(|source| RoleError::AgentEnv {
                    name: name.clone(),
                    source,
                })?;
            let exe = std::env::current_exe().map_err(RoleError::Exe)?;
            let seed = agent_seed(config);
            let backend = agent
                .map(|a| NetBackend::new(a, exe, seed))
                .transpose()
                .map_err(|source| RoleError::Agent { name, source })?;
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
pub fn serve_broker(config: BrokerConfig, options: &ServeOptions) -> Result<(), RoleError> {
    serve("broker", options, |listener, shutdown| async move {
        tailmesh_services::broker::run(config, listener, shutdown)
            .await
            .map_err(ServiceError::from)
    })
}

/// Runs a RabbitMQ or NATS server for the run until told to stop (see
/// [`crate::launcher::brokers`]): serves gRPC health, SERVING once the
/// server takes connections and its address is in the endpoint file. The
/// server's output goes to `<name>.server.log` beside the address file.
pub fn serve_broker_server(
    kind: tailmesh_services::model::BrokerKind,
    options: &ServeOptions,
) -> Result<(), RoleError> {
    use crate::launcher::brokers::{
        BrokerProcessError, BrokerServer, ServerSpec, endpoint_file, server_log_file,
    };
    let endpoint = options.addr_file.as_deref().map(endpoint_file);
    let server_log = options.addr_file.as_deref().map(server_log_file);
    serve("broker", options, |listener, shutdown| async move {
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| {
                ServiceError::from(BrokerProcessError::Io {
                    kind: kind.as_str(),
                    what,
                    source,
                })
            }
        };
        let ip = listener.local_addr().map_err(io("its listener"))?.ip();
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let (stop_health, health_stopped) = tokio::sync::oneshot::channel::<()>();
        let health_server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = health_stopped.await;
                    },
                ),
        );
        let mut shutdown = shutdown;
        let started = tokio::select! {
            s = BrokerServer::start(match server_log {
                Some(log) => ServerSpec::new(kind, ip).log_to(log),
                None => ServerSpec::new(kind, ip),
            }) => s,
            () = &mut shutdown => {
                let _ = stop_health.send(());
                return Ok(());
            }
        };
        let mut server = started?;
        if let Some(path) = &endpoint {
            process::write_addr_file(path, server.addr).map_err(io("write its endpoint file"))?;
        }
        reporter
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let result = tokio::select! {
            () = &mut shutdown => Ok(()),
            status = server.exited() => Err(io("the server")(std::io::Error::other(format!(
                "exited while the run needed it: {status}"
            )))),
        };
        server.stop().await;
        let _ = stop_health.send(());
        let _ = health_server.await;
        result
    })
}

/// Binds, announces the address to the launcher, and runs `service` until
/// a signal or the end of standard input.
fn serve<F, Fut>(name: &str, options: &ServeOptions, service: F) -> Result<(), RoleError>
where
    F: FnOnce(tokio::net::TcpListener, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), ServiceError>>,
{
    serve_as(name, options, &Process::default(), service)
}

/// [`serve`] for `process`, which its spans' resource names.
fn serve_as<F, Fut>(
    name: &str,
    options: &ServeOptions,
    process: &Process,
    service: F,
) -> Result<(), RoleError>
where
    F: FnOnce(tokio::net::TcpListener, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), ServiceError>>,
{
    runtime(options.threads)?.block_on(async {
        let telemetry = tailmesh_services::telemetry::init_process("warn", process);
        let result = serve_in(name, options, service).await;
        telemetry.shutdown();
        result
    })
}

async fn serve_in<F, Fut>(name: &str, options: &ServeOptions, service: F) -> Result<(), RoleError>
where
    F: FnOnce(tokio::net::TcpListener, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), ServiceError>>,
{
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| RoleError::Bind {
            name: name.to_owned(),
            addr: options.listen,
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| RoleError::LocalAddr {
            name: name.to_owned(),
            source,
        })?;
    if let Some(path) = &options.addr_file {
        process::write_addr_file(path, addr).map_err(|source| RoleError::AddrFile {
            name: name.to_owned(),
            path: path.clone(),
            source,
        })?;
    }
    tracing::info!(%addr, "{name} listening");
    let shutdown = Box::pin(process::shutdown_signal(options.supervised));
    service(listener, shutdown)
        .await
        .map_err(|source| RoleError::Serve {
            name: name.to_owned(),
            addr,
            source: Box::new(source),
        })
}
