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
//!   deployment by [`tls`].

pub mod brokers;
pub mod compose;
pub mod k8s;
pub mod tls;
mod yaml;

use tailmesh_services::{model::BrokerKind, tls::TlsMode};

pub use crate::plan::{BROKER, Role};
use crate::{
    plan::{MeshPlan, Naming},
    scenario::Scenario,
};

/// The port every hop and the broker listen on inside their container.
pub const SERVICE_PORT: u16 = 7000;
/// The orchestrator's OTLP trace receiver inside its container.
pub const TRACE_PORT: u16 = 4317;
/// Where every container finds the scenario.
pub const SCENARIO_PATH: &str = "/etc/tailmesh/scenario.toml";
/// The environment variable naming the file that holds the Control token.
pub const TOKEN_FILE_ENV: &str = "TAILMESH_CONTROL_TOKEN_FILE";
/// Where containers mount the Control token.
pub const TOKEN_DIR: &str = "/run/tailmesh";
/// The token file inside [`TOKEN_DIR`].
pub const TOKEN_FILE: &str = "/run/tailmesh/token";
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
    /// The Control token could not be written.
    #[error("write the Control token to {}: {source}", path.display())]
    Token {
        /// The token file.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// What the runtime that will run the files allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runtime {
    /// `"Docker Compose"` or `"Kubernetes"`, for messages.
    pub name: &'static str,
    /// Whether containers may get CAP_NET_ADMIN (network faults need it).
    pub net_admin: bool,
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
        let naming = Naming::for_variant(scenario, variant, SERVICE_PORT);
        let plan = MeshPlan::new(scenario, variant);
        for process in &plan.processes {
            let name = naming.service(&process.name);
            let net_faults = process.net_fault.is_some();
            let control = match &process.role {
                Role::Hop { hop, .. } => net_faults || hop.has_app_windows(),
                _ => net_faults,
            };
            if let Role::Hop { hop, replica } = &process.role {
                let kill = hop.kill;
                let service = hop.service.is_some();
                let hop = &hop.name;
                if let Some(e) = label_problem(&name) {
                    problems.push(format!(
                        "variant {:?}, hop {hop:?} replica {replica}: its service name {name:?} {e}; \
                         use a shorter hop or variant name",
                        variant.name
                    ));
                }
                if *replica == 0 && service {
                    problems.push(format!(
                        "variant {:?}, hop {hop:?}: [hop.service] is not supported yet with \
                         this launcher ({}): run the scenario with tailmesh run (the local \
                         launcher), or remove [hop.service] from the deployed scenario",
                        variant.name, runtime.name
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
                trace_env: process.trace_env(
                    &format!("http://orchestrator:{TRACE_PORT}"),
                    scenario.telemetry.sampling,
                    &variant.name,
                ),
                broker: variant.broker,
                tls: variant.mesh.tls,
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
            ],
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
pub fn orchestrator_command(sampling: f64, attach_timeout: Option<&str>, tls: bool) -> Vec<String> {
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
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    if std::fs::read_to_string(path).is_ok_and(|t| !t.trim().is_empty()) {
        return Ok(());
    }
    let token = crate::launcher::netns::new_token();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| DeployError::Token {
            path: path.to_path_buf(),
            source,
        })?;
    writeln!(file, "{token}").map_err(|source| DeployError::Token {
        path: path.to_path_buf(),
        source,
    })
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

    #[test]
    fn a_scenario_that_kills_a_replica_is_refused_naming_it() {
        let text = "name = \"k\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"5s\"\n\
                    [[hop]]\nname = \"a\"\nreplicas = 2\nkill = { replica = 1, at = \"1s\" }\n";
        let scenario = crate::scenario::parse(text, "k.toml").unwrap_or_else(|e| panic!("{e}"));
        let runtime = Runtime {
            name: "Kubernetes",
            net_admin: true,
        };
        match services(&scenario, runtime) {
            Err(DeployError::Undeployable { problems, .. }) => {
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert!(
                    problems[0].starts_with(
                        "variant \"base\", hop \"a\" replica 1: kill needs the local or netns \
                         launcher"
                    ),
                    "{problems:?}"
                );
            }
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_scenario_with_a_service_is_refused_naming_the_hop() {
        let text = "name = \"k\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"5s\"\n\
                    [[hop]]\nname = \"a\"\nreplicas = 2\n[hop.service]\ncommand = [\"srv\"]\n\
                    method = \"p.S/M\"\n";
        let scenario = crate::scenario::parse(text, "k.toml").unwrap_or_else(|e| panic!("{e}"));
        let runtime = Runtime {
            name: "Docker Compose",
            net_admin: true,
        };
        match services(&scenario, runtime) {
            Err(DeployError::Undeployable { problems, .. }) => {
                // Once per hop, not per replica.
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert!(
                    problems[0].starts_with(
                        "variant \"base\", hop \"a\": [hop.service] is not supported yet with \
                         this launcher (Docker Compose)"
                    ),
                    "{problems:?}"
                );
            }
            other => panic!("not refused: {other:?}"),
        }
    }
}
