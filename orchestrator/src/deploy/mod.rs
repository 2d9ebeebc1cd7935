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
//!   file named by [`TOKEN_FILE_ENV`].

pub mod compose;
pub mod k8s;
mod yaml;

use std::collections::BTreeMap;

use tailmesh_services::{addr::PeerAddr, model::Transport};

use crate::scenario::{Scenario, Variant};

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
/// The broker's role name.
pub const BROKER: &str = "broker";
/// The image the generated files run, unless told otherwise.
pub const DEFAULT_IMAGE: &str = "tailmesh:latest";

/// The role name of replica `replica` of hop `hop`: `hop-<hop>-<replica>`
/// (also its process name under the local and netns launchers).
pub fn hop_role(hop: &str, replica: u32) -> String {
    format!("hop-{hop}-{replica}")
}

/// The service names of one variant's mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Naming {
    prefix: String,
    port: u16,
}

impl Naming {
    /// The names `variant` of `scenario` is deployed under.
    pub fn for_variant(scenario: &Scenario, variant: &Variant) -> Self {
        let prefix = if scenario.variants.len() > 1 {
            format!("{}-", variant.name)
        } else {
            String::new()
        };
        Self {
            prefix,
            port: SERVICE_PORT,
        }
    }

    /// The service that plays `role` (`hop-b-1`, `broker`).
    pub fn service(&self, role: &str) -> String {
        format!("{}{role}", self.prefix)
    }

    /// Where the service playing `role` is reached.
    pub fn addr(&self, role: &str) -> Result<PeerAddr, String> {
        PeerAddr::new(&self.service(role), self.port).map_err(|e| e.to_string())
    }

    /// The broker's address (when a hop is reached by pull) and every hop's
    /// replica addresses, as a deployed hop hands them to its clients.
    pub fn addrs(&self, variant: &Variant) -> Result<Addrs, String> {
        let broker = if variant.hops.iter().any(|h| h.transport == Transport::Pull) {
            Some(self.addr(BROKER)?)
        } else {
            None
        };
        let mut hops = BTreeMap::new();
        for hop in &variant.hops {
            let replicas = (0..hop.replicas)
                .map(|r| self.addr(&hop_role(&hop.name, r)))
                .collect::<Result<Vec<_>, _>>()?;
            hops.insert(hop.name.clone(), replicas);
        }
        Ok(Addrs { broker, hops })
    }
}

/// Where a variant's broker and hop replicas are reached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addrs {
    /// The broker, when some hop is reached by pull.
    pub broker: Option<PeerAddr>,
    /// Each hop's replicas, replica `i` at index `i`.
    pub hops: BTreeMap<String, Vec<PeerAddr>>,
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Its name in the container network.
    pub name: String,
    /// The variant it belongs to.
    pub variant: String,
    /// What it runs.
    pub role: Role,
    /// Whether its fault agent applies network faults (needs NET_ADMIN).
    pub net_faults: bool,
    /// The `OTEL_SERVICE_NAME` of its spans (`hop-<hop>`, `broker`).
    pub otel_name: String,
}

/// What a service runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Replica `replica` of hop `hop`.
    Hop {
        /// The hop.
        hop: String,
        /// The replica index.
        replica: u32,
    },
    /// The broker, serving `topics`.
    Broker {
        /// The hops reached by pull.
        topics: Vec<String>,
    },
}

/// Every service of every variant, in start order (each variant's broker
/// first, then hops with the hops they call before them), after checking
/// that the scenario can be deployed on `runtime`: every name a DNS label,
/// network faults only where NET_ADMIN is allowed. The error lists every
/// problem, each naming the variant and hop it is about.
pub fn services(scenario: &Scenario, runtime: Runtime) -> Result<Vec<Service>, String> {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    if let Err(e) = check_label(&project_name(scenario)) {
        problems.push(format!(
            "scenario name {:?}: the deployment is named {:?}, which {e}; rename the scenario",
            scenario.name,
            project_name(scenario)
        ));
    }
    for variant in &scenario.variants {
        let naming = Naming::for_variant(scenario, variant);
        let topics: Vec<String> = variant
            .hops
            .iter()
            .filter(|h| h.transport == Transport::Pull)
            .map(|h| h.name.clone())
            .collect();
        if !topics.is_empty() {
            out.push(Service {
                name: naming.service(BROKER),
                variant: variant.name.clone(),
                role: Role::Broker { topics },
                net_faults: false,
                otel_name: BROKER.to_owned(),
            });
        }
        for hop in crate::run::launch_order(&variant.hops) {
            for replica in 0..hop.replicas {
                let name = naming.service(&hop_role(&hop.name, replica));
                if let Err(e) = check_label(&name) {
                    problems.push(format!(
                        "variant {:?}, hop {:?} replica {replica}: its service name {name:?} {e}; \
                         use a shorter hop or variant name",
                        variant.name, hop.name
                    ));
                }
                let net_faults = hop.net_of(replica).is_some_and(|f| f.is_active());
                if net_faults && !runtime.net_admin {
                    problems.push(format!(
                        "variant {:?}, hop {:?} replica {replica}: its network fault needs \
                         CAP_NET_ADMIN, which this {} runtime does not grant (generated without \
                         NET_ADMIN); remove the net/replica_net fault or allow NET_ADMIN",
                        variant.name, hop.name, runtime.name
                    ));
                }
                out.push(Service {
                    name,
                    variant: variant.name.clone(),
                    role: Role::Hop {
                        hop: hop.name.clone(),
                        replica,
                    },
                    net_faults,
                    otel_name: format!("hop-{}", hop.name),
                });
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(format!(
            "scenario {:?} cannot be deployed on {}:\n  {}",
            scenario.name,
            runtime.name,
            problems.join("\n  ")
        ))
    }
}

impl Service {
    /// The tailmesh arguments its container runs.
    pub fn command(&self) -> Vec<String> {
        let listen = format!("0.0.0.0:{SERVICE_PORT}");
        let args: Vec<String> = match &self.role {
            Role::Hop { hop, replica } => vec![
                "hop".into(),
                "--scenario".into(),
                SCENARIO_PATH.into(),
                "--variant".into(),
                self.variant.clone(),
                "--hop".into(),
                hop.clone(),
                "--replica".into(),
                replica.to_string(),
            ],
            Role::Broker { topics } => vec!["broker".into(), "--topics".into(), topics.join(",")],
        };
        args.into_iter()
            .chain(["--listen".to_owned(), listen])
            .collect()
    }

    /// Its environment: where its spans go (when tracing), its variant,
    /// and, when it applies network faults, the token file.
    pub fn env(&self, sampling: f64) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if sampling > 0.0 {
            env.push((
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                format!("http://orchestrator:{TRACE_PORT}"),
            ));
            env.push(("OTEL_SERVICE_NAME".to_owned(), self.otel_name.clone()));
            env.push((
                "OTEL_TRACES_SAMPLER".to_owned(),
                "parentbased_traceidratio".to_owned(),
            ));
            env.push(("OTEL_TRACES_SAMPLER_ARG".to_owned(), sampling.to_string()));
        }
        env.push((
            tailmesh_services::telemetry::VARIANT_ENV.to_owned(),
            self.variant.clone(),
        ));
        if self.net_faults {
            env.push((TOKEN_FILE_ENV.to_owned(), TOKEN_FILE.to_owned()));
        }
        env
    }
}

/// The arguments of the orchestrator container: the experiment against
/// the running services, results in /results, spans forwarded to Jaeger
/// when the scenario traces (Jaeger need not be up: spans it cannot take
/// are counted, and the run's traces.jaeger.json has them all), waiting up
/// to `attach_timeout` for each service when given.
pub fn orchestrator_command(sampling: f64, attach_timeout: Option<&str>) -> Vec<String> {
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
    command
}

/// `tailmesh-<scenario>`: the Compose project and the Kubernetes namespace.
pub fn project_name(scenario: &Scenario) -> String {
    format!("tailmesh-{}", scenario.name)
}

/// Whether any service of the deployment applies network faults.
pub fn needs_token(services: &[Service]) -> bool {
    services.iter().any(|s| s.net_faults)
}

/// Why `name` cannot name a service: Kubernetes requires RFC 1123 labels
/// of Service names, and Compose service names become DNS names too. The
/// scenario's own names are labels already; joined, they may be too long.
fn check_label(name: &str) -> Result<(), String> {
    if crate::scenario::is_dns_label(name) {
        Ok(())
    } else {
        Err(format!(
            "is not a DNS label ({} characters; at most 63 lowercase letters, digits and '-')",
            name.len()
        ))
    }
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
pub fn write_token(path: &std::path::Path) -> anyhow::Result<()> {
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
        .map_err(|e| anyhow::anyhow!("write the Control token to {}: {e}", path.display()))?;
    writeln!(file, "{token}")
        .map_err(|e| anyhow::anyhow!("write the Control token to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_must_be_dns_labels() {
        assert!(check_label("hop-middle-1").is_ok());
        for bad in ["", "hop_a", "-a", &"a".repeat(64)] {
            assert!(check_label(bad).is_err(), "{bad:?}");
        }
    }
}
