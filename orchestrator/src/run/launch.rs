//! Starting a variant's mesh: which launcher it gets, and its processes
//! started in the plan's order, each handed its configuration, the
//! addresses of the processes it calls, and its trace environment.

use tailmesh_netfault::tool;
use tailmesh_services::{
    addr::PeerAddr,
    broker::{BrokerClient, BrokerError, TopicStats, backend},
    model::{BrokerKind, QueueBounds},
    serving,
    tls::{TlsFiles, TlsMode},
};

use super::{RunError, RunOptions, TraceSetup};
use crate::{
    launcher::{AnyLauncher, LaunchError, ProcessSpec, brokers, health},
    plan::{Addrs, MeshPlan, Process, Role},
    scenario::{HopService, Launcher, ServiceSource},
};

/// Why a variant cannot get the launcher it needs.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LauncherError {
    /// Network namespaces need privileges this process lacks.
    #[error(
        "{why} needs root or CAP_NET_ADMIN and CAP_SYS_ADMIN (to create network namespaces): \
         run as root (sudo), or remove the net/replica_net faults to run with the local launcher"
    )]
    NoPrivilege {
        /// What asked for the netns launcher.
        why: &'static str,
    },
    /// Tools the netns launcher runs are missing.
    #[error("{why} needs {}", .missing.join(", "))]
    MissingTools {
        /// What asked for the netns launcher.
        why: &'static str,
        /// Each missing tool with its Debian package.
        missing: Vec<String>,
    },
}

/// Which launcher a plan gets: `auto` becomes netns when its variant has
/// network faults and the process may build namespaces. Netns without the
/// privilege or the tools fails here, before anything starts; the error
/// says what is needed.
///
/// A fault written with nothing to do (`loss = 0`, no delay) still asks
/// for netns, though no process of the plan applies it: a sweep over loss
/// from 0 runs every variant on the same kind of network.
pub(crate) fn resolve_launcher(plan: &MeshPlan) -> Result<Launcher, LauncherError> {
    let variant = &plan.variant;
    let wanted = match variant.launcher {
        Launcher::Auto if variant.has_net_faults() => Launcher::Netns,
        Launcher::Auto => Launcher::Local,
        other => other,
    };
    if wanted != Launcher::Netns {
        return Ok(wanted);
    }
    let why = if variant.has_net_faults() {
        "its network faults need the netns launcher, which"
    } else {
        "launcher = \"netns\""
    };
    if !tool::has_privilege() {
        return Err(LauncherError::NoPrivilege { why });
    }
    let missing = missing_tools();
    if !missing.is_empty() {
        return Err(LauncherError::MissingTools { why, missing });
    }
    Ok(Launcher::Netns)
}

/// Each tool the netns launcher runs that this machine lacks, with its
/// Debian package.
fn missing_tools() -> Vec<String> {
    tool::missing_tools()
        .iter()
        .map(|(tool, package)| format!("{tool} (Debian package {package})"))
        .collect()
}

/// The orchestrator's client TLS for `plan`'s variant: `None` when the
/// variant runs plaintext.
pub(super) fn client_tls(
    plan: &MeshPlan,
    options: &RunOptions,
) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, RunError> {
    let mesh = plan.variant.mesh;
    if !mesh.tls.is_on() {
        return Ok(None);
    }
    // Attached: the deployment's CA and the orchestrator's certificate.
    if let Some(dir) = options.attach.as_ref().and_then(|a| a.tls_dir.as_ref()) {
        return crate::deploy::tls::client_in(dir, mesh.tls_resumption)
            .map(Some)
            .map_err(|e| RunError::TlsDir(Box::new(e)));
    }
    match &options.tls_ca {
        Some(ca) => Ok(Some(ca.client_config(
            "tailmesh",
            mesh.tls == TlsMode::Mtls,
            mesh.tls_resumption,
        )?)),
        None => Ok(None),
    }
}

/// The certificates the load generator processes connect with (one
/// identity for all of them, `generator`), as files they read; `None` when
/// the variant runs plaintext. Attached, the deployment's own folder.
pub(super) fn generator_tls(
    plan: &MeshPlan,
    options: &RunOptions,
) -> Result<Option<TlsFiles>, RunError> {
    let mesh = plan.variant.mesh;
    if !mesh.tls.is_on() {
        return Ok(None);
    }
    if let Some(dir) = options.attach.as_ref().and_then(|a| a.tls_dir.as_ref()) {
        return crate::deploy::tls::files_in(dir, true, mesh.tls_resumption)
            .map(Some)
            .map_err(|e| RunError::TlsDir(Box::new(e)));
    }
    let names = ["127.0.0.1", "localhost", "generator"].map(str::to_owned);
    write_tls_files(plan, options, "generator", &names)
}

/// `process`'s certificate and key, written to the run's `tls/<variant>/`
/// folder beside the CA's certificate; `None` when the variant runs
/// plaintext. The certificate names 127.0.0.1 and localhost (the local
/// launcher's addresses), the process's name, and `own` when the launcher
/// gives the process an address of its own (netns: its namespace's).
fn tls_files(
    process: &Process,
    plan: &MeshPlan,
    options: &RunOptions,
    own: Option<std::net::IpAddr>,
) -> Result<Option<TlsFiles>, RunError> {
    let mut names = vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        process.name.clone(),
    ];
    names.extend(own.map(|ip| ip.to_string()));
    write_tls_files(plan, options, &process.name, &names)
}

/// A certificate for `names` and its key, signed by the run's CA, written
/// as `stem`'s files to the run's `tls/<variant>/` folder; `None` when the
/// variant runs plaintext.
fn write_tls_files(
    plan: &MeshPlan,
    options: &RunOptions,
    stem: &str,
    names: &[String],
) -> Result<Option<TlsFiles>, RunError> {
    let mesh = plan.variant.mesh;
    let Some(ca) = options.tls_ca.as_ref().filter(|_| mesh.tls.is_on()) else {
        return Ok(None);
    };
    let dir = options.dir.join("tls").join(&plan.variant.name);
    std::fs::create_dir_all(&dir).map_err(|source| RunError::Io {
        what: "create",
        path: dir.clone(),
        source,
    })?;
    Ok(Some(ca.write_files(
        &dir,
        stem,
        names,
        mesh.tls == TlsMode::Mtls,
        mesh.tls_resumption,
    )?))
}

/// Starts every process of `plan` in its order (the broker, then each hop
/// after the hops it calls) and returns where they are.
pub(super) async fn launch_mesh(
    plan: &MeshPlan,
    options: &RunOptions,
    launcher: &mut AnyLauncher,
) -> Result<Addrs, RunError> {
    let variant = &plan.variant.name;
    let launch_error = |source| RunError::Launch {
        variant: variant.clone(),
        source: Box::new(source),
    };
    let mut addrs = Addrs::default();
    if let Some(broker) = plan.broker() {
        // A deployment runs another broker from its official image.
        if let (AnyLauncher::Attached(attached), kind) = (&*launcher, plan.variant.broker)
            && kind != BrokerKind::Tailmesh
        {
            addrs.broker = Some(attached.attach_broker(kind).await.map_err(launch_error)?);
            return launch_hops(plan, options, launcher, addrs).await;
        }
        let spec = spec_of(broker, plan, options, launcher, &addrs)?;
        let addr = launcher.launch(spec).await.map_err(launch_error)?;
        // Another broker is reached where its wrapper says it listens.
        addrs.broker = Some(match plan.variant.broker {
            BrokerKind::Tailmesh => addr,
            _ if matches!(launcher, AnyLauncher::Attached(_)) => addr,
            _ => brokers::read_endpoint(&options.dir.join("logs").join(variant), &broker.name)
                .map_err(|source| RunError::BrokerEndpoint {
                    variant: variant.clone(),
                    source,
                })?,
        });
    }
    launch_hops(plan, options, launcher, addrs).await
}

/// Starts every hop of `plan`, callees first, once the broker is at
/// `addrs.broker`.
async fn launch_hops(
    plan: &MeshPlan,
    options: &RunOptions,
    launcher: &mut AnyLauncher,
    mut addrs: Addrs,
) -> Result<Addrs, RunError> {
    let launch_error = |source| RunError::Launch {
        variant: plan.variant.name.clone(),
        source: Box::new(source),
    };
    for (process, hop, replica) in plan.hops() {
        // A replica's service first: the hop resolves its schema at start.
        if let Some(service) = &hop.service {
            // A layered service is the hop: it reads the hop's configuration.
            let layered = match service.layers {
                true => Some(write_hop_config(
                    process,
                    &plan.hop_config(hop, replica, &addrs),
                    plan,
                    options,
                )?),
                false => None,
            };
            let address = start_service(
                (process, hop, replica),
                (service, layered.as_deref()),
                plan,
                &addrs,
                options,
                launcher,
            )
            .await
            .map_err(|source| RunError::Service {
                variant: plan.variant.name.clone(),
                hop: hop.name.clone(),
                replica,
                source: Box::new(source),
            })?;
            if service.direct {
                // No hop in front of it: its callers call the service.
                let peer = address.parse().map_err(|e| RunError::Service {
                    variant: plan.variant.name.clone(),
                    hop: hop.name.clone(),
                    replica,
                    source: Box::new(ServiceError::Address {
                        address: address.clone(),
                        why: format!("{e}"),
                    }),
                })?;
                addrs.hops.entry(hop.name.clone()).or_default().push(peer);
                addrs.services.insert(process.name.clone(), address);
                continue;
            }
            addrs.services.insert(process.name.clone(), address);
        }
        let spec = spec_of(process, plan, options, launcher, &addrs)?;
        let addr = match launcher.launch(spec).await {
            Ok(addr) => addr,
            // Attached, a hop that is not there is the deployment's.
            Err(source)
                if hop.service.is_some() && !matches!(launcher, AnyLauncher::Attached(_)) =>
            {
                return Err(RunError::ServiceHop {
                    variant: plan.variant.name.clone(),
                    hop: hop.name.clone(),
                    replica,
                    address: addrs
                        .services
                        .get(&process.name)
                        .cloned()
                        .unwrap_or_default(),
                    source: Box::new(source),
                });
            }
            Err(source) => return Err(launch_error(source)),
        };
        addrs.hops.entry(hop.name.clone()).or_default().push(addr);
    }
    Ok(addrs)
}

/// Why a hop replica's service is not there to be called.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Its command could not be started, exited, or never got ready.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// Called directly, its method or request does not fit its schema.
    #[error(transparent)]
    Resolve(tailmesh_services::hop::ServiceError),
    /// The service at its `address` did not get ready in time.
    #[error(
        "{address} not ready after {}: {}",
        tailmesh_units::duration(*waited),
        last_problem.as_deref().unwrap_or("no answer")
    )]
    NotReady {
        address: String,
        waited: std::time::Duration,
        last_problem: Option<String>,
    },
    /// `address` is not an address.
    #[error("address {address:?}: {why}")]
    Address { address: String, why: String },
    /// No free port could be had for it.
    #[error("find a free port on 127.0.0.1: {0}")]
    Port(#[source] std::io::Error),
    /// A layered service's configuration path could not be made absolute
    /// (the current folder is unknown).
    #[error("the hop configuration's absolute path: {0}")]
    ConfigPath(#[source] std::io::Error),
    /// This launcher cannot start services.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// Makes `hop`'s service for `replica` ready and returns its address
/// (attached to a deployment, which runs it: only where it is, for
/// messages): waits for the one at `address`, or starts `command` on a free port of
/// 127.0.0.1 (`{port}` in its arguments, and `PORT`), with `TAILMESH_HOP`,
/// `TAILMESH_REPLICA`, where its downstream hops are ([`crate::plan::downstream_env`])
/// and, when the run traces, the OTLP variables that
/// make a service exporting spans join the request's trace (its resource
/// names the variant, as every span of a run's traces must). A layered
/// service (`layered`: its hop configuration's path) is given that path in
/// `TAILMESH_HOP_CONFIG`, the run's Control token, and the hop's own name
/// for its spans. Its output goes to `hop-<hop>-<replica>.service.log` in
/// the variant's log folder.
async fn start_service(
    (process, hop, replica): (&Process, &crate::scenario::Hop, u32),
    (service, layered): (&HopService, Option<&std::path::Path>),
    plan: &MeshPlan,
    addrs: &Addrs,
    options: &RunOptions,
    launcher: &mut AnyLauncher,
) -> Result<String, ServiceError> {
    match launcher {
        AnyLauncher::Local(_) => {}
        // The deployment runs the service (or calls its address) beside
        // the replica, whose sidecar serves, and so passes the health
        // checks attaching waits for, only once the service is ready.
        AnyLauncher::Attached(_) if service.direct => {
            return Err(ServiceError::Unsupported(
                "[hop.service] direct = true (or layers = true) is not supported yet by a \
                 deployment (it puts a tailmesh hop in front of every service)",
            ));
        }
        AnyLauncher::Attached(_) => {
            return Ok(match &service.source {
                ServiceSource::Address(address) => address.clone(),
                ServiceSource::Command(_) => format!("the deployment's, beside {}", process.name),
            });
        }
        _ => {
            return Err(ServiceError::Unsupported(
                "[hop.service] is not supported yet with this launcher (the local launcher \
                 starts or waits for services, and a deployment runs them)",
            ));
        }
    }
    let words = match &service.source {
        ServiceSource::Address(address) => {
            wait_for_address(address, service.ready_timeout).await?;
            return Ok(address.clone());
        }
        ServiceSource::Command(words) => words,
    };
    let Some((program, args)) = words.split_first() else {
        return Err(ServiceError::Unsupported("[hop.service] command is empty"));
    };
    let port = super::service_port::service_port().map_err(ServiceError::Port)?;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // A program named by a relative path is the scenario's, like its
    // other paths; a bare name is looked up in PATH.
    let program = std::path::Path::new(program);
    let program = if program.components().count() > 1 {
        service.resolve(program)
    } else {
        program.to_path_buf()
    };
    let port_text = port.to_string();
    let mut spec = ProcessSpec::new(format!("{}.service", process.name), program)
        .args(args.iter().map(|a| a.replace("{port}", &port_text)))
        .env("PORT", &port_text)
        .env("TAILMESH_HOP", &hop.name)
        .env("TAILMESH_REPLICA", replica.to_string())
        .ready_within(service.ready_timeout)
        .service(addr, service.dir.clone());
    let replicas = |name: &str| {
        let replicas = addrs.hops.get(name)?;
        Some(replicas.iter().map(ToString::to_string).collect())
    };
    for (key, value) in crate::plan::downstream_env(hop, &plan.variant, replicas) {
        spec = spec.env(key, value);
    }
    if let Some(config) = layered {
        // The service runs in the scenario's folder, not the run's.
        let config = std::path::absolute(config).map_err(ServiceError::ConfigPath)?;
        spec = spec.env(serving::HOP_CONFIG_ENV, config.into_os_string());
        if let AnyLauncher::Local(local) = launcher
            && let Some(token) = local.token()
        {
            spec = spec.env(serving::CONTROL_TOKEN_ENV, token);
        }
    }
    if let Some(t) = &options.traces {
        // A layered service's spans are the hop's own.
        let otel_name = match layered {
            Some(_) => process.otel_name.clone(),
            None => format!("{}-service", process.otel_name),
        };
        let hold = t.hold(&plan.variant);
        for (key, value) in process.trace_env(&t.endpoint, t.sampling, &plan.variant.name, hold) {
            let value = if key == "OTEL_SERVICE_NAME" {
                otel_name.clone()
            } else {
                value
            };
            spec = spec.env(key, value);
        }
        // The run's traces are its variant's spans: an OpenTelemetry SDK
        // puts this on the service's resource.
        spec = spec.env(
            "OTEL_RESOURCE_ATTRIBUTES",
            format!("variant={}", plan.variant.name),
        );
    }
    launcher.launch(spec).await?;
    Ok(addr.to_string())
}

/// How often a service at a fixed address is asked whether it is ready.
const ADDRESS_PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Waits until the service at `address` is ready
/// ([`health::check`] with
/// [`health::Readiness::SERVICE`]), at most `timeout`.
pub(crate) async fn wait_for_address(
    address: &str,
    timeout: std::time::Duration,
) -> Result<(), ServiceError> {
    let peer: PeerAddr = address.parse().map_err(|e| ServiceError::Address {
        address: address.to_owned(),
        why: format!("{e}"),
    })?;
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let mut last_problem = None;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(ServiceError::NotReady {
                address: address.to_owned(),
                waited: started.elapsed(),
                last_problem,
            });
        }
        match health::check(
            &peer,
            left.min(std::time::Duration::from_secs(1)),
            health::Readiness::SERVICE,
        )
        .await
        {
            Ok(()) => return Ok(()),
            Err(e) => last_problem = Some(e.to_string()),
        }
        tokio::time::sleep_until((tokio::time::Instant::now() + ADDRESS_PROBE_EVERY).min(deadline))
            .await;
    }
}

/// How `launcher` starts `process`: `tailmesh broker` or `tailmesh hop`
/// with its configuration written to the variant's log folder, traced when
/// the run traces. Deployed processes read the scenario themselves; the
/// attached launcher only needs their name.
fn spec_of(
    process: &Process,
    plan: &MeshPlan,
    options: &RunOptions,
    launcher: &mut AnyLauncher,
    addrs: &Addrs,
) -> Result<ProcessSpec, RunError> {
    let spec = ProcessSpec::new(&process.name, &options.exe);
    if matches!(launcher, AnyLauncher::Attached(_)) {
        return Ok(spec);
    }
    let tls = if plan.variant.mesh.tls.is_on() {
        // Under netns the namespace, and so the address the certificate
        // must name, exists before the process.
        let own = launcher
            .address_before_launch(&process.name)
            .map_err(|source| RunError::Launch {
                variant: plan.variant.name.clone(),
                source: Box::new(source),
            })?;
        tls_files(process, plan, options, own)?
    } else {
        None
    };
    let spec = match &process.role {
        Role::Broker {
            topics,
            disciplines,
            bounds,
        } => {
            let mut spec = spec
                .args(crate::plan::broker_args(topics, disciplines, *bounds))
                .arg("--kind")
                .arg(plan.variant.broker.as_str())
                .ready_within(brokers::READY_TIMEOUT);
            if let Some(tls) = tls {
                spec = spec
                    .arg("--tls-ca")
                    .arg(tls.ca)
                    .arg("--tls-cert")
                    .arg(tls.cert)
                    .arg("--tls-key")
                    .arg(tls.key);
                if tls.mutual {
                    spec = spec.arg("--tls-mutual");
                }
            }
            spec
        }
        Role::Hop { hop, replica } => {
            let mut config = plan.hop_config(hop, *replica, addrs);
            config.tls = tls;
            let path = write_hop_config(process, &config, plan, options)?;
            spec.arg("hop").arg("--config").arg(path)
        }
    };
    Ok(traced(
        spec,
        process,
        options.traces.as_ref(),
        &plan.variant,
    ))
}

/// Writes a hop replica's configuration where its process reads it,
/// `logs/<variant>/<process>.json`, and returns that path.
fn write_hop_config(
    process: &Process,
    config: &tailmesh_services::hop::HopConfig,
    plan: &MeshPlan,
    options: &RunOptions,
) -> Result<std::path::PathBuf, RunError> {
    let path = options
        .dir
        .join("logs")
        .join(&plan.variant.name)
        .join(format!("{}.json", process.name));
    let json = serde_json::to_string_pretty(config).map_err(|source| RunError::HopConfig {
        variant: plan.variant.name.clone(),
        process: process.name.clone(),
        source,
    })?;
    std::fs::write(&path, json).map_err(|source| RunError::Io {
        what: "write",
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Asks a process to export its spans to the run's receiver.
fn traced(
    spec: ProcessSpec,
    process: &Process,
    traces: Option<&TraceSetup>,
    variant: &crate::scenario::Variant,
) -> ProcessSpec {
    let Some(t) = traces else {
        return spec;
    };
    process
        .trace_env(&t.endpoint, t.sampling, &variant.name, t.hold(variant))
        .into_iter()
        .fold(spec, |spec, (key, value)| spec.env(key, value))
}

/// Why the broker's statistics could not be had.
#[derive(Debug, thiserror::Error)]
pub(super) enum StatsError {
    /// No connection.
    #[error(transparent)]
    Connect(#[from] BrokerError),
    /// The Stats call failed.
    #[error("{}", .0.message())]
    Call(#[source] tonic::Status),
}

/// The broker's per-topic statistics now (for another broker than
/// tailmesh's, what it reports of the pulled hops' queues).
pub(super) async fn broker_stats(
    kind: BrokerKind,
    addr: &PeerAddr,
    bounds: QueueBounds,
    topics: &[String],
) -> Result<Vec<TopicStats>, StatsError> {
    if kind == BrokerKind::Tailmesh {
        let mut client = BrokerClient::connect(addr).await?;
        return client.stats(None).await.map_err(StatsError::Call);
    }
    backend::stats(kind, addr, bounds, topics)
        .await
        .map_err(StatsError::Call)
}

/// Reads tailmesh's broker's topics once a second while the load runs,
/// on one connection kept from read to read (made again after a failed
/// read). Other brokers are not read while the load runs: a RabbitMQ read
/// opens and declares a connection of its own, load a sample must not add.
pub(super) struct QueueReader {
    addr: PeerAddr,
    client: Option<BrokerClient>,
}

impl QueueReader {
    /// A reader of `addr` when it is tailmesh's broker.
    pub(super) fn of(kind: BrokerKind, addr: Option<&PeerAddr>) -> Option<QueueReader> {
        let addr = addr?;
        (kind == BrokerKind::Tailmesh).then(|| QueueReader {
            addr: addr.clone(),
            client: None,
        })
    }

    /// The topics now, or `None` when the broker did not answer.
    pub(super) async fn read(&mut self) -> Option<Vec<TopicStats>> {
        if self.client.is_none() {
            self.client = BrokerClient::connect(&self.addr).await.ok();
        }
        match self.client.as_mut()?.stats(None).await {
            Ok(stats) => Some(stats),
            Err(_) => {
                self.client = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of the only variant of `hops` (TOML `[[hop]]` tables) with
    /// `head` (top-level keys) before them.
    fn plan(head: &str, hops: &str) -> MeshPlan {
        let text = format!(
            "{head}name = \"s\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 10\n{hops}"
        );
        let scenario = crate::scenario::parse(&text, "s.toml").unwrap_or_else(|e| panic!("{e}"));
        MeshPlan::new(&scenario, &scenario.variants[0])
    }

    /// What `resolve_launcher` must answer for a plan that needs netns
    /// because of `why`, on this machine: root (or the capabilities) and
    /// the tools, checked in that order.
    fn netns_here(why: &'static str) -> Result<Launcher, LauncherError> {
        if !tool::has_privilege() {
            Err(LauncherError::NoPrivilege { why })
        } else if !missing_tools().is_empty() {
            Err(LauncherError::MissingTools {
                why,
                missing: missing_tools(),
            })
        } else {
            Ok(Launcher::Netns)
        }
    }

    #[test]
    fn auto_without_network_faults_is_local_and_with_them_netns_or_a_clear_error() {
        let clean = "[[hop]]\nname = \"a\"\n";
        assert_eq!(resolve_launcher(&plan("", clean)), Ok(Launcher::Local));
        assert_eq!(
            resolve_launcher(&plan("launcher = \"local\"\n", clean)),
            Ok(Launcher::Local)
        );

        let faults = "its network faults need the netns launcher, which";
        let lossy = plan("", "[[hop]]\nname = \"a\"\nnet = { loss = 0.01 }\n");
        assert_eq!(lossy.net_faults().len(), 1);
        assert_eq!(resolve_launcher(&lossy), netns_here(faults));

        // A fault that does nothing is applied by no process, and still
        // gets the launcher the other variants of a loss sweep get.
        let zero = plan("", "[[hop]]\nname = \"a\"\nnet = { loss = 0.0 }\n");
        assert_eq!(zero.net_faults().len(), 0);
        assert_eq!(resolve_launcher(&zero), netns_here(faults));

        let asked = plan("launcher = \"netns\"\n", clean);
        assert_eq!(resolve_launcher(&asked), netns_here("launcher = \"netns\""));
    }

    #[test]
    fn launcher_errors_say_what_is_needed() {
        let why = "its network faults need the netns launcher, which";
        assert_eq!(
            LauncherError::NoPrivilege { why }.to_string(),
            "its network faults need the netns launcher, which needs root or CAP_NET_ADMIN and \
             CAP_SYS_ADMIN (to create network namespaces): run as root (sudo), or remove the \
             net/replica_net faults to run with the local launcher"
        );
        let missing = vec![
            "tc (Debian package iproute2)".to_owned(),
            "nft (Debian package nftables)".to_owned(),
        ];
        assert_eq!(
            LauncherError::MissingTools { why, missing }.to_string(),
            "its network faults need the netns launcher, which needs tc (Debian package \
             iproute2), nft (Debian package nftables)"
        );
    }
}
