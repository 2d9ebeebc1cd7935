//! Deployment beyond one machine's processes: the names services get in a
//! container network or a cluster, what a scenario needs there, and the
//! generators of Compose files (`compose`) and Kubernetes manifests
//! (`k8s`), both from the same scenario model as `tailmesh run`.
//!
//! The contract between generated files and the binary inside them:
//!
//! - every hop replica is a service named `hop-<hop>-<replica>` and the
//!   broker `broker`, each listening on [`SERVICE_PORT`]; with more than
//!   one variant each name is prefixed with `<variant>-`, so every variant
//!   has its own mesh, as it has its own processes locally;
//! - every container reads the scenario at [`SCENARIO_PATH`]: a hop
//!   derives its own configuration from it (`tailmesh hop --scenario`), the
//!   orchestrator runs it against the running services (`tailmesh run
//!   --attach`), so both always agree;
//! - hops export spans to the orchestrator's receiver on [`TRACE_PORT`];
//! - fault agents and the orchestrator share a Control token read from the
//!   file named by [`TOKEN_FILE_ENV`];
//! - with `[mesh] tls` on, every tailmesh container reads its CA,
//!   certificate and key from [`tls::TLS_DIR`] (`--tls-dir`), made per
//!   deployment by [`tls`];
//! - a hop replica whose `[hop.service]` has a `command` gets that service
//!   beside it ([`HopWorkService`]): from the scenario's `image`, listening
//!   on [`HOP_SERVICE_PORT`], reached at `<service>-service` (Compose) or
//!   127.0.0.1 (the pod's other container), which the sidecar is told with
//!   `tailmesh hop --service-address` and waits for before it serves.

pub mod brokers;
pub mod compose;
pub mod k8s;
pub mod tls;
mod yaml;

use tailmesh_services::{model::BrokerKind, tls::TlsMode};

use crate::scenario::ServiceSource;

pub use crate::plan::{BROKER, Role};
use crate::{
    plan::{MeshPlan, Naming, hop_role},
    run::HoldRule,
    scenario::Scenario,
};

/// The port every hop and the broker listen on inside their container.
pub const SERVICE_PORT: u16 = 7000;
/// The orchestrator's OTLP trace receiver inside its container.
pub const TRACE_PORT: u16 = 4317;
/// The port the orchestrator awaits a deployment's load generators at
/// (`[load] generators` above 1; `tailmesh run --generators-at`).
pub const GENERATOR_HUB_PORT: u16 = 7100;
/// Where every container finds the scenario.
pub const SCENARIO_PATH: &str = "/etc/tailmesh/scenario.toml";
/// The environment variable naming the file that holds the Control token.
pub const TOKEN_FILE_ENV: &str = "TAILMESH_CONTROL_TOKEN_FILE";
/// Where containers mount the Control token.
pub const TOKEN_DIR: &str = "/run/tailmesh";
/// The token file inside [`TOKEN_DIR`].
pub const TOKEN_FILE: &str = "/run/tailmesh/token";
/// The port a hop replica's own service (`[hop.service] command`) listens
/// on in its container or pod: its command's `{port}` and its `PORT`.
pub const HOP_SERVICE_PORT: u16 = 50051;
/// The image the generated files run, unless told otherwise.
pub const DEFAULT_IMAGE: &str = "tailmesh:latest";

/// Why deployment files could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The scenario cannot run on the runtime; every reason, each naming
    /// the variant and hop it is about.
    #[error("scenario {scenario:?} cannot be deployed on {runtime}:\n  {}", .problems.join("\n  "))]
    Undeployable {
        /// The scenario's name.
        scenario: String,
        /// `"Docker Compose"` or `"Kubernetes"`.
        runtime: &'static str,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// A generated file or folder could not be written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The deployment's TLS material could not be made, reused or read.
    #[error("TLS: {0}")]
    Tls(#[source] Box<tls::TlsDirError>),
}

/// What the runtime that will run the files allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// `"Docker Compose"` or `"Kubernetes"`, for messages.
    pub name: &'static str,
    /// Whether containers may get CAP_NET_ADMIN (network faults need it).
    pub net_admin: bool,
    /// Whether a replica's containers share one network namespace (a
    /// Kubernetes pod): its service is then called on 127.0.0.1, else by
    /// its own service name.
    pub pod: bool,
}

/// One service of a deployment: a hop replica or the broker of a variant.
#[derive(Clone, Debug, PartialEq)]
pub struct Service {
    /// Its name in the container network.
    pub name: String,
    /// The variant it belongs to.
    pub variant: String,
    /// What it runs.
    pub role: Role,
    /// Whether its fault agent applies network faults (needs NET_ADMIN).
    pub net_faults: bool,
    /// Whether it serves the Control API (its token file mounted): for
    /// network faults, or for windows of slowness or errors, which need no
    /// capability.
    pub control: bool,
    /// The `OTEL_SERVICE_NAME` of its spans (`hop-<hop>`, `broker`).
    pub otel_name: String,
    /// Its trace environment at the scenario's sampling (empty when off).
    trace_env: Vec<(String, String)>,
    /// The broker a broker service runs (its image when not tailmesh's).
    pub broker: BrokerKind,
    /// Its variant's `[mesh] tls`: with TLS on it reads its certificate
    /// from [`tls::TLS_DIR`].
    pub tls: TlsMode,
    /// The hop replica's own service, run beside it, when its
    /// `[hop.service]` has a `command`.
    pub work: Option<HopWorkService>,
}

/// A hop replica's own gRPC service (`[hop.service] command`), run from
/// the scenario's `image` beside its sidecar: a Compose service of its
/// own, or a second container in the replica's pod.
#[derive(Clone, Debug, PartialEq)]
pub struct HopWorkService {
    /// Its Compose service name, `<replica's service>-service` (in a pod,
    /// its container is named `service`).
    pub name: String,
    /// Its image.
    pub image: String,
    /// Its container's whole command line (Compose's `entrypoint`,
    /// Kubernetes' `command`): the scenario's `command` with `{port}`
    /// replaced by [`HOP_SERVICE_PORT`].
    pub command: Vec<String>,
    /// Its environment: `PORT`, `TAILMESH_HOP`, `TAILMESH_REPLICA`, where
    /// its downstream hops are (`TAILMESH_DOWNSTREAM*`, by their service
    /// names) and, when the scenario traces, the OTLP variables that make a service
    /// exporting spans join the request's trace (service name
    /// `hop-<hop>-service`, the variant on its resource).
    pub env: Vec<(String, String)>,
    /// Where the sidecar calls it (`--service-address`).
    pub address: String,
    /// How long the sidecar waits for it before it serves.
    pub ready_timeout: std::time::Duration,
}

/// Every service of every variant, in start order (each variant's broker
/// first, then hops with the hops they call before them), after checking
/// that the scenario can be deployed on `runtime`: every name a DNS label,
/// network faults only where NET_ADMIN is allowed. The error lists every
/// problem, each naming the variant and hop it is about.
pub fn services(scenario: &Scenario, runtime: Runtime) -> Result<Vec<Service>, DeployError> {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    if let Some(e) = label_problem(&project_name(scenario)) {
        problems.push(format!(
            "scenario name {:?}: the deployment is named {:?}, which {e}; rename the scenario",
            scenario.name,
            project_name(scenario)
        ));
    }
    for variant in &scenario.variants {
        if variant.load.has_net_faults() {
            problems.push(format!(
                "variant {:?}: [load] net and generator_net need the netns launcher (tailmesh \
                 run), which gives each load generator a namespace whose link the orchestrator \
                 shapes; a {} deployment's generators have no fault agent: remove them from the \
                 deployed scenario",
                variant.name, runtime.name
            ));
        }
        let naming = Naming::for_variant(scenario, variant, SERVICE_PORT);
        let plan = MeshPlan::new(scenario, variant);
        // Deployed processes hold their spans as local ones do, for the
        // decisions of the orchestrator that attaches.
        let hold = HoldRule::of(scenario).hold(variant, scenario.telemetry.sampling);
        for process in &plan.processes {
            let name = naming.service(&process.name);
            let net_faults = process.net_fault.is_some();
            let control = match &process.role {
                Role::Hop { hop, .. } => net_faults || hop.has_app_windows(),
                _ => net_faults,
            };
            let trace_env = process.trace_env(
                &format!("http://orchestrator:{TRACE_PORT}"),
                scenario.telemetry.sampling,
                &variant.name,
                hold,
            );
            let mut work = None;
            if let Role::Hop { hop, replica } = &process.role {
                let kill = hop.kill;
                if let Some(service) = &hop.service {
                    let problem = |what: String| {
                        format!(
                            "variant {:?}, hop {:?}: [hop.service] {what}",
                            variant.name, hop.name
                        )
                    };
                    if *replica == 0 && service.direct {
                        let key = if service.layers { "layers" } else { "direct" };
                        problems.push(problem(format!(
                            "{key} = true is not supported yet by a deployment ({}): a \
                             deployment puts a tailmesh hop in front of every service; drop \
                             {key} (and run the service plain) or run the scenario locally",
                            runtime.name
                        )));
                    }
                    if *replica == 0 && !service.proto.is_empty() {
                        problems.push(problem(format!(
                            "proto: the .proto files are not in the containers ({}); leave \
                             proto out and let the sidecar ask the service's server reflection",
                            runtime.name
                        )));
                    }
                    match (&service.source, &service.image) {
                        (ServiceSource::Address(_), _) => {}
                        (ServiceSource::Command(_), None) if *replica == 0 => {
                            problems.push(problem(format!(
                                "command runs in a container beside each replica's sidecar \
                                 ({}): name its image with [hop.service] image",
                                runtime.name
                            )));
                        }
                        (ServiceSource::Command(_), None) => {}
                        (ServiceSource::Command(_), Some(_)) => {
                            let downstream = crate::plan::downstream_env(hop, variant, |h| {
                                let replicas = variant.hops.iter().find(|x| x.name == h)?.replicas;
                                let at = |r| {
                                    format!("{}:{SERVICE_PORT}", naming.service(&hop_role(h, r)))
                                };
                                Some((0..replicas).map(at).collect())
                            });
                            work = work_service(
                                (&name, hop, *replica),
                                &trace_env,
                                downstream,
                                runtime,
                            );
                        }
                    }
                    if let Some(work) = &work
                        && let Some(e) = label_problem(&work.name)
                    {
                        problems.push(format!(
                            "variant {:?}, hop {:?} replica {replica}: its service's name {:?} \
                             {e}; use a shorter hop or variant name",
                            variant.name, hop.name, work.name
                        ));
                    }
                }
                let hop = &hop.name;
                if let Some(e) = label_problem(&name) {
                    problems.push(format!(
                        "variant {:?}, hop {hop:?} replica {replica}: its service name {name:?} {e}; \
                         use a shorter hop or variant name",
                        variant.name
                    ));
                }
                if kill.is_some_and(|k| k.replica == *replica) {
                    problems.push(format!(
                        "variant {:?}, hop {hop:?} replica {replica}: kill needs the local or \
                         netns launcher (tailmesh run), which start the replica's process and \
                         can SIGKILL and restart it; a {} runtime restarts containers on its \
                         own: remove kill from the deployed scenario",
                        variant.name, runtime.name
                    ));
                }
                if net_faults && !runtime.net_admin {
                    problems.push(format!(
                        "variant {:?}, hop {hop:?} replica {replica}: its network fault needs \
                         CAP_NET_ADMIN, which this {} runtime does not grant (generated without \
                         NET_ADMIN); remove the net/replica_net fault or allow NET_ADMIN",
                        variant.name, runtime.name
                    ));
                }
            }
            out.push(Service {
                name,
                variant: variant.name.clone(),
                role: process.role.clone(),
                net_faults,
                control,
                otel_name: process.otel_name.clone(),
                trace_env,
                broker: variant.broker,
                tls: variant.mesh.tls,
                work,
            });
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(DeployError::Undeployable {
            scenario: scenario.name.clone(),
            runtime: runtime.name,
            problems,
        })
    }
}

/// The service beside replica `replica` of `hop` (whose own service is
/// `sidecar`, traced with `sidecar_trace_env`), when its `[hop.service]`
/// has a `command` and an `image`: the command in the image, on
/// [`HOP_SERVICE_PORT`], with the environment the local launcher gives a
/// service it starts (`downstream`: where the hop's downstream hops are).
fn work_service(
    (sidecar, hop, replica): (&str, &crate::scenario::Hop, u32),
    sidecar_trace_env: &[(String, String)],
    downstream: Vec<(String, String)>,
    runtime: Runtime,
) -> Option<HopWorkService> {
    let service = hop.service.as_ref()?;
    let (ServiceSource::Command(command), Some(image)) = (&service.source, &service.image) else {
        return None;
    };
    let port = HOP_SERVICE_PORT.to_string();
    let name = format!("{sidecar}-service");
    let mut env = vec![
        ("PORT".to_owned(), port.clone()),
        ("TAILMESH_HOP".to_owned(), hop.name.clone()),
        ("TAILMESH_REPLICA".to_owned(), replica.to_string()),
    ];
    env.extend(downstream);
    if let Some((_, variant)) = sidecar_trace_env
        .iter()
        .find(|(k, _)| k == tailmesh_services::telemetry::VARIANT_ENV)
    {
        for (key, value) in sidecar_trace_env {
            let value = if key == "OTEL_SERVICE_NAME" {
                format!("{value}-service")
            } else {
                value.clone()
            };
            env.push((key.clone(), value));
        }
        // The run's traces are its variant's spans: an OpenTelemetry SDK
        // puts this on the service's resource.
        env.push((
            "OTEL_RESOURCE_ATTRIBUTES".to_owned(),
            format!("variant={variant}"),
        ));
    }
    let host = if runtime.pod { "127.0.0.1" } else { &name };
    Some(HopWorkService {
        address: format!("{host}:{HOP_SERVICE_PORT}"),
        image: image.clone(),
        command: command.iter().map(|w| w.replace("{port}", &port)).collect(),
        env,
        ready_timeout: service.ready_timeout,
        name,
    })
}

impl Service {
    /// The official image it runs instead of tailmesh's: the broker of a
    /// variant whose pull hops go through RabbitMQ or NATS.
    pub fn broker_image(&self) -> Option<brokers::BrokerImage> {
        match self.role {
            Role::Broker { .. } => brokers::image(self.broker),
            Role::Hop { .. } => None,
        }
    }

    /// The tailmesh arguments its container runs.
    pub fn command(&self) -> Vec<String> {
        let listen = format!("0.0.0.0:{SERVICE_PORT}");
        let mut args: Vec<String> = match &self.role {
            Role::Hop { hop, replica } => vec![
                "hop".into(),
                "--scenario".into(),
                SCENARIO_PATH.into(),
                "--variant".into(),
                self.variant.clone(),
                "--hop".into(),
                hop.name.clone(),
                "--replica".into(),
                replica.to_string(),
            ]
            .into_iter()
            .chain(
                self.work
                    .iter()
                    .flat_map(|w| ["--service-address".to_owned(), w.address.clone()]),
            )
            .collect(),
            Role::Broker {
                topics,
                disciplines,
                bounds,
            } => crate::plan::broker_args(topics, disciplines, *bounds),
        };
        if self.tls.is_on() {
            match &self.role {
                Role::Hop { .. } => args.extend(["--tls-dir".into(), tls::TLS_DIR.into()]),
                Role::Broker { .. } => {
                    let at = |file: &str| format!("{}/{file}", tls::TLS_DIR);
                    args.extend([
                        "--tls-ca".into(),
                        at(tls::CA_FILE),
                        "--tls-cert".into(),
                        at(tls::CERT_FILE),
                        "--tls-key".into(),
                        at(tls::KEY_FILE),
                    ]);
                    if self.tls == TlsMode::Mtls {
                        args.push("--tls-mutual".into());
                    }
                }
            }
        }
        args.into_iter()
            .chain(["--listen".to_owned(), listen])
            .collect()
    }

    /// The command of its health check (`tailmesh health`, over TLS with
    /// its own certificate when its variant uses TLS).
    pub fn health_command(&self) -> Vec<String> {
        let mut command = vec![
            "tailmesh".to_owned(),
            "health".to_owned(),
            format!("127.0.0.1:{SERVICE_PORT}"),
        ];
        if self.tls.is_on() {
            command.extend(["--tls-dir".to_owned(), tls::TLS_DIR.to_owned()]);
        }
        command
    }

    /// Its environment: where its spans go (when tracing), its variant,
    /// and, when it serves the Control API, the token file.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = self.trace_env.clone();
        if env.is_empty() {
            env.push((
                tailmesh_services::telemetry::VARIANT_ENV.to_owned(),
                self.variant.clone(),
            ));
        }
        if self.control {
            env.push((TOKEN_FILE_ENV.to_owned(), TOKEN_FILE.to_owned()));
        }
        env
    }
}

/// The arguments of the orchestrator container: the experiment against
/// the running services, results in /results, spans forwarded to Jaeger
/// when the scenario traces (Jaeger need not be up: spans it cannot take
/// are counted, and the run's traces.jaeger.json has them all), waiting up
/// to `attach_timeout` for each service when given, its TLS material in
/// [`tls::TLS_DIR`] with `tls`.
pub fn orchestrator_command(
    sampling: f64,
    attach_timeout: Option<&str>,
    tls: bool,
    generators: bool,
) -> Vec<String> {
    let mut command: Vec<String> = [
        "run",
        SCENARIO_PATH,
        "--attach",
        "--results",
        "/results",
        "--quiet",
    ]
    .map(str::to_owned)
    .to_vec();
    if sampling > 0.0 {
        command.push("--otlp-forward".to_owned());
        command.push(format!("http://jaeger:{TRACE_PORT}"));
    }
    if let Some(timeout) = attach_timeout {
        command.push("--attach-timeout".to_owned());
        command.push(timeout.to_owned());
    }
    if tls {
        command.push("--tls-dir".to_owned());
        command.push(tls::TLS_DIR.to_owned());
    }
    if generators {
        command.push("--generators-at".to_owned());
        command.push(format!("0.0.0.0:{GENERATOR_HUB_PORT}"));
        if let Some(timeout) = attach_timeout {
            command.push("--generators-timeout".to_owned());
            command.push(timeout.to_owned());
        }
    }
    command
}

/// The most load generator processes any variant uses: a deployment runs
/// that many beside the orchestrator when it is above 1.
pub fn generator_count(scenario: &Scenario) -> u32 {
    scenario
        .variants
        .iter()
        .map(|v| v.load.generators)
        .max()
        .unwrap_or(1)
}

/// A deployment's load generator `index`: it reaches the orchestrator at
/// `hub` and serves every variant of the run.
pub fn generator_command(hub: &str, index: Option<u32>) -> Vec<String> {
    let mut command = vec!["generator".to_owned(), "--hub".to_owned(), hub.to_owned()];
    match index {
        Some(k) => command.extend(["--index".to_owned(), k.to_string()]),
        None => command.extend(["--index-env".to_owned(), "JOB_COMPLETION_INDEX".to_owned()]),
    }
    command.push("--stay".to_owned());
    command
}

/// `tailmesh-<scenario>`: the Compose project and the Kubernetes namespace.
pub fn project_name(scenario: &Scenario) -> String {
    format!("tailmesh-{}", scenario.name)
}

/// Whether any service of the deployment serves the Control API.
pub fn needs_token(services: &[Service]) -> bool {
    services.iter().any(|s| s.control)
}

/// Why `name` cannot name a service, if it cannot: Kubernetes requires RFC
/// 1123 labels of Service names, and Compose service names become DNS
/// names too. The scenario's own names are labels already; joined, they
/// may be too long.
fn label_problem(name: &str) -> Option<String> {
    (!crate::scenario::is_dns_label(name)).then(|| {
        format!(
            "is not a DNS label ({} characters; at most 63 lowercase letters, digits and '-')",
            name.len()
        )
    })
}

/// The sha256 of the scenario text, in hex: stamped on every generated
/// service, so a changed scenario recreates its containers and pods.
pub fn digest(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes a fresh Control token (128 random bits, hex) to `path` with
/// mode 0600, unless the file already holds one (a restarted token service
/// must not change the token under running agents).
pub fn write_token(path: &std::path::Path) -> Result<(), DeployError> {
    if std::fs::read_to_string(path).is_ok_and(|t| !t.trim().is_empty()) {
        return Ok(());
    }
    write_private(path, &format!("{}\n", crate::launcher::new_token()))
}

/// Writes `body`, which carries secrets (keys, a token), to `path` with
/// mode 0600, an existing file made private before it is written.
pub fn write_private(path: &std::path::Path, body: &str) -> Result<(), DeployError> {
    use std::{
        io::Write,
        os::unix::fs::{OpenOptionsExt, PermissionsExt},
    };
    let io = |what| {
        move |source| DeployError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io("write"))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod"))?;
    file.write_all(body.as_bytes()).map_err(io("write"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_must_be_dns_labels() {
        assert_eq!(label_problem("hop-middle-1"), None);
        for bad in ["", "hop_a", "-a", &"a".repeat(64)] {
            assert!(label_problem(bad).is_some(), "{bad:?}");
        }
    }

    /// The problems `runtime` refuses the scenario `body` (after its
    /// `[load]`'s head) for, one expected to start each with `starts`.
    fn refused(body: &str, runtime: Runtime, starts: &[&str]) {
        let text =
            format!("name = \"k\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"5s\"\n{body}");
        let scenario = crate::scenario::parse(&text, "k.toml").unwrap_or_else(|e| panic!("{e}"));
        match services(&scenario, runtime) {
            Err(DeployError::Undeployable { problems, .. }) => {
                assert_eq!(problems.len(), starts.len(), "{problems:?}");
                for (problem, start) in problems.iter().zip(starts) {
                    assert!(problem.starts_with(start), "{problems:?}");
                }
            }
            other => panic!("not refused: {other:?}"),
        }
    }

    const KUBERNETES: Runtime = Runtime {
        name: "Kubernetes",
        net_admin: true,
        pod: true,
    };

    const COMPOSE: Runtime = Runtime {
        name: "Docker Compose",
        net_admin: true,
        pod: false,
    };

    #[test]
    fn a_scenario_that_kills_a_replica_is_refused_naming_it() {
        refused(
            "[[hop]]\nname = \"a\"\nreplicas = 2\nkill = { replica = 1, at = \"1s\" }\n",
            KUBERNETES,
            &["variant \"base\", hop \"a\" replica 1: kill needs the local or netns launcher"],
        );
    }

    #[test]
    fn a_fault_on_a_generators_link_is_refused_naming_the_variant() {
        refused(
            "generators = 2\ngenerator_net = { generator = 1, loss = 0.1 }\n[[hop]]\nname = \"a\"\n",
            COMPOSE,
            &["variant \"base\": [load] net and generator_net need the netns launcher"],
        );
    }

    #[test]
    fn a_service_command_without_an_image_or_with_proto_files_is_refused_naming_the_hop() {
        // Once per hop, not per replica.
        refused(
            "[[hop]]\nname = \"a\"\nreplicas = 2\n[hop.service]\ncommand = [\"srv\"]\n\
             method = \"p.S/M\"\nproto = [\"e.proto\"]\n",
            COMPOSE,
            &[
                "variant \"base\", hop \"a\": [hop.service] proto: the .proto files are not in \
                 the containers (Docker Compose)",
                "variant \"base\", hop \"a\": [hop.service] command runs in a container beside \
                 each replica's sidecar (Docker Compose): name its image",
            ],
        );
    }

    /// Each replica of a service hop gets its service: the command in the
    /// image, `{port}` replaced, the local launcher's environment (the
    /// trace variables under `hop-<hop>-service`), reached by its own name
    /// in Compose and on 127.0.0.1 in a pod, which the sidecar is told.
    #[test]
    fn a_service_command_with_an_image_runs_beside_each_replica() {
        let text = "name = \"k\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"5s\"\n\
                    [[hop]]\nname = \"a\"\nreplicas = 2\n[hop.service]\n\
                    command = [\"srv\", \"--port\", \"{port}\"]\nimage = \"echo:1\"\n\
                    method = \"p.S/M\"\nready_timeout = \"20s\"\n\
                    [telemetry]\nsampling = 0.5\n";
        let scenario = crate::scenario::parse(text, "k.toml").unwrap_or_else(|e| panic!("{e}"));
        for pod in [false, true] {
            let runtime = Runtime {
                name: "test",
                net_admin: true,
                pod,
            };
            let services = services(&scenario, runtime).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(services.len(), 2);
            for (replica, service) in services.iter().enumerate() {
                let work = service.work.as_ref().expect("a service beside the replica");
                assert_eq!(work.name, format!("hop-a-{replica}-service"));
                assert_eq!(work.image, "echo:1");
                assert_eq!(work.command, ["srv", "--port", "50051"]);
                assert_eq!(work.ready_timeout, std::time::Duration::from_secs(20));
                let address = if pod {
                    "127.0.0.1:50051".to_owned()
                } else {
                    format!("hop-a-{replica}-service:50051")
                };
                assert_eq!(work.address, address);
                let env: std::collections::BTreeMap<_, _> = work.env.iter().cloned().collect();
                assert_eq!(env["PORT"], "50051");
                assert_eq!(env["TAILMESH_HOP"], "a");
                assert_eq!(env["TAILMESH_REPLICA"], replica.to_string());
                assert_eq!(env["OTEL_SERVICE_NAME"], "hop-a-service");
                assert_eq!(
                    env["OTEL_EXPORTER_OTLP_ENDPOINT"],
                    "http://orchestrator:4317"
                );
                assert_eq!(env["OTEL_RESOURCE_ATTRIBUTES"], "variant=base");
                let command = service.command();
                let at = command
                    .iter()
                    .position(|a| a == "--service-address")
                    .expect("the sidecar is told where its service is");
                assert_eq!(command[at + 1], address);
            }
        }
    }

    /// A service beside a hop that calls others is told where they are,
    /// as under the local launcher: the push hops' replicas by their
    /// service names (the variant's prefix too), no pull hop.
    #[test]
    fn a_deployed_service_is_told_where_its_downstream_hops_are() {
        let text = "name = \"k\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"5s\"\n\
                    [[hop]]\nname = \"a\"\ndownstream = [\"d\", \"next-hop\"]\n\
                    [hop.service]\ncommand = [\"srv\"]\nimage = \"echo:1\"\nmethod = \"p.S/M\"\n\
                    [[hop]]\nname = \"next-hop\"\nreplicas = 2\n\
                    [[hop]]\nname = \"d\"\ntransport = \"pull\"\n\
                    [[variant]]\nname = \"x\"\n[[variant]]\nname = \"y\"\n";
        let scenario = crate::scenario::parse(text, "k.toml").unwrap_or_else(|e| panic!("{e}"));
        let runtime = Runtime {
            name: "test",
            net_admin: true,
            pod: false,
        };
        let services = services(&scenario, runtime).unwrap_or_else(|e| panic!("{e}"));
        for variant in ["x", "y"] {
            let work = services
                .iter()
                .find(|s| s.variant == variant && s.work.is_some())
                .and_then(|s| s.work.as_ref())
                .unwrap_or_else(|| panic!("no service in variant {variant}"));
            let downstream: Vec<_> = work
                .env
                .iter()
                .filter(|(k, _)| k.starts_with("TAILMESH_DOWNSTREAM"))
                .cloned()
                .collect();
            let replicas = format!("{variant}-hop-next-hop-0:7000,{variant}-hop-next-hop-1:7000");
            assert_eq!(
                downstream,
                [
                    ("TAILMESH_DOWNSTREAM".to_owned(), replicas.clone()),
                    ("TAILMESH_DOWNSTREAM_NEXT_HOP".to_owned(), replicas),
                ],
                "variant {variant}"
            );
        }
    }
}
