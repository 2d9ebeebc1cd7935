//! Starting a variant's mesh: which launcher it gets, and its processes
//! started in the plan's order, each handed its configuration, the
//! addresses of the processes it calls, and its trace environment.

use tailmesh_netfault::tool;
use tailmesh_services::{
    addr::PeerAddr,
    broker::{BrokerClient, TopicStats, backend},
    model::BrokerKind,
};

use super::{RunError, RunOptions, TraceSetup};
use crate::{
    launcher::{AnyLauncher, ProcessSpec, brokers},
    plan::{Addrs, MeshPlan, Process, Role},
    scenario::{Launcher, Variant},
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

/// Which launcher a variant gets: `auto` becomes netns when the variant
/// has network faults and the process may build namespaces. Netns without
/// the privilege or the tools fails here, before anything starts; the
/// error says what is needed.
pub(crate) fn resolve_launcher(variant: &Variant) -> Result<Launcher, LauncherError> {
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
    let missing = tool::missing_tools();
    if !missing.is_empty() {
        return Err(LauncherError::MissingTools {
            why,
            missing: missing
                .iter()
                .map(|(tool, package)| format!("{tool} (Debian package {package})"))
                .collect(),
        });
    }
    Ok(Launcher::Netns)
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
                .map_err(|e| RunError::Setup {
                    variant: variant.clone(),
                    message: e.to_string(),
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
    for (process, hop, _) in plan.hops() {
        let spec = spec_of(process, plan, options, launcher, &addrs)?;
        let addr = launcher.launch(spec).await.map_err(launch_error)?;
        addrs.hops.entry(hop.name.clone()).or_default().push(addr);
    }
    Ok(addrs)
}

/// How `launcher` starts `process`: `tailmesh broker` or `tailmesh hop`
/// with its configuration written to the variant's log folder, traced when
/// the run traces. Deployed processes read the scenario themselves; the
/// attached launcher only needs their name.
fn spec_of(
    process: &Process,
    plan: &MeshPlan,
    options: &RunOptions,
    launcher: &AnyLauncher,
    addrs: &Addrs,
) -> Result<ProcessSpec, RunError> {
    let spec = ProcessSpec::new(&process.name, &options.exe);
    if matches!(launcher, AnyLauncher::Attached(_)) {
        return Ok(spec);
    }
    let spec = match &process.role {
        Role::Broker {
            topics,
            disciplines,
        } => spec
            .args(crate::plan::broker_args(topics, disciplines))
            .arg("--kind")
            .arg(plan.variant.broker.as_str())
            .ready_within(brokers::READY_TIMEOUT),
        Role::Hop { hop, replica } => {
            let hop = plan
                .variant
                .hops
                .iter()
                .find(|h| &h.name == hop)
                .ok_or_else(|| RunError::Setup {
                    variant: plan.variant.name.clone(),
                    message: format!("the plan names hop {hop:?}, which the variant lacks"),
                })?;
            let config = plan.hop_config(hop, *replica, addrs);
            let path = options
                .dir
                .join("logs")
                .join(&plan.variant.name)
                .join(format!("{}.json", process.name));
            let json = serde_json::to_string_pretty(&config).map_err(|e| RunError::Setup {
                variant: plan.variant.name.clone(),
                message: format!("encode {} config: {e}", process.name),
            })?;
            std::fs::write(&path, json).map_err(|source| RunError::Io {
                what: "write",
                path: path.clone(),
                source,
            })?;
            spec.arg("hop").arg("--config").arg(path)
        }
    };
    Ok(traced(
        spec,
        process,
        options.traces.as_ref(),
        &plan.variant.name,
    ))
}

/// Asks a process to export its spans to the run's receiver.
fn traced(
    spec: ProcessSpec,
    process: &Process,
    traces: Option<&TraceSetup>,
    variant: &str,
) -> ProcessSpec {
    let Some(t) = traces else {
        return spec;
    };
    process
        .trace_env(&t.endpoint, t.sampling, variant)
        .into_iter()
        .fold(spec, |spec, (key, value)| spec.env(key, value))
}

/// Why the broker's statistics could not be had.
#[derive(Debug, thiserror::Error)]
pub(super) enum StatsError {
    /// No connection.
    #[error("{0}")]
    Connect(String),
    /// The Stats call failed.
    #[error("{}", .0.message())]
    Call(tonic::Status),
}

/// The broker's per-topic statistics now (for another broker than
/// tailmesh's, what it reports of the pulled hops' queues).
pub(super) async fn broker_stats(
    kind: BrokerKind,
    addr: &PeerAddr,
    topics: &[String],
) -> Result<Vec<TopicStats>, StatsError> {
    if kind == BrokerKind::Tailmesh {
        let mut client = BrokerClient::connect(addr)
            .await
            .map_err(|e| StatsError::Connect(e.to_string()))?;
        return client.stats(None).await.map_err(StatsError::Call);
    }
    backend::stats(kind, addr, topics)
        .await
        .map_err(StatsError::Call)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        analysis::testing::{hop, variant},
        scenario::NetFault,
    };

    #[test]
    fn auto_without_network_faults_is_local_and_with_them_netns_or_a_clear_error() {
        let mut v = variant("v", vec![hop("a", None)]);
        v.launcher = Launcher::Auto;
        assert_eq!(resolve_launcher(&v), Ok(Launcher::Local));
        v.launcher = Launcher::Local;
        assert_eq!(resolve_launcher(&v), Ok(Launcher::Local));

        v.launcher = Launcher::Auto;
        v.hops[0].net = Some(NetFault {
            loss: 0.01,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            start: Duration::ZERO,
            duration: None,
        });
        match resolve_launcher(&v) {
            Ok(kind) => {
                assert_eq!(kind, Launcher::Netns);
                assert!(tool::has_privilege());
            }
            Err(error) => {
                let message = error.to_string();
                // Without root (or the tools) the message says what is needed.
                assert!(
                    message.contains("needs root or CAP_NET_ADMIN") || message.contains("needs "),
                    "{message}"
                );
            }
        }
    }
}
