//! The attached launcher: the hops and the broker were started by someone
//! else (Docker Compose, Kubernetes) under the names `tailmesh compose` and
//! `tailmesh k8s` gave them. "Launching" one finds it by name and waits
//! until it answers gRPC health checks; nothing is started or stopped here.

use std::time::Duration;

use tailmesh_services::addr::PeerAddr;
use tokio::time::{Instant, sleep};

use super::{LaunchError, health, health::Readiness};
use crate::plan::Naming;

/// How long [`AttachedLauncher::launch`] waits for a service by default:
/// containers may still be starting, pods still being scheduled.
pub const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(120);

/// Pause between probes of a service that is not ready yet.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// Bound on one probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How `tailmesh run --attach` finds and controls a deployed mesh.
#[derive(Clone, Debug)]
pub struct Attach {
    /// The fault agents' Control token, when the deployment has one.
    pub token: Option<String>,
    /// How long to wait for each service to answer health checks.
    pub ready_timeout: Duration,
    /// The orchestrator's TLS material (`ca.crt`, `tls.crt`, `tls.key`),
    /// for a deployment whose variants use TLS.
    pub tls_dir: Option<std::path::PathBuf>,
}

/// Finds a variant's services by name.
#[derive(Debug)]
pub struct AttachedLauncher {
    naming: Naming,
    ready_timeout: Duration,
    token: Option<String>,
}

impl AttachedLauncher {
    /// Services named by `naming`; `token` is the fault agents' Control
    /// token, when the deployment has one.
    pub fn new(naming: Naming, token: Option<String>) -> Self {
        Self {
            naming,
            ready_timeout: DEFAULT_ATTACH_TIMEOUT,
            token,
        }
    }

    /// Sets how long [`AttachedLauncher::launch`] waits for each service.
    pub fn with_ready_timeout(mut self, ready_timeout: Duration) -> Self {
        self.ready_timeout = ready_timeout;
        self
    }

    /// The fault agents' Control token.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The service that plays `name` (`hop-b-1`, `broker`) in this variant.
    pub fn service(&self, name: &str) -> String {
        self.naming.service(name)
    }

    /// Waits until the RabbitMQ or NATS server running as the variant's
    /// `broker` service takes connections (on its own port, not
    /// tailmesh's), and returns its address.
    pub async fn attach_broker(
        &self,
        kind: tailmesh_services::model::BrokerKind,
    ) -> Result<PeerAddr, LaunchError> {
        let name = crate::plan::BROKER;
        let service = self.naming.service(name);
        let unreachable = |waited, last_problem| LaunchError::Unreachable {
            name: name.to_owned(),
            service: service.clone(),
            waited,
            last_problem,
        };
        let addr = self
            .naming
            .broker_addr(kind)
            .map_err(|e| unreachable(Duration::ZERO, e.reason))?;
        let started = Instant::now();
        loop {
            let problem = match super::brokers::probe(kind, &addr).await {
                Ok(()) => return Ok(addr),
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= self.ready_timeout {
                return Err(unreachable(started.elapsed(), problem));
            }
            sleep(PROBE_INTERVAL).await;
        }
    }

    /// Waits until the service playing `name` answers SERVING, and returns
    /// its address. A name that never resolves or answers is an error that
    /// says which service was expected where.
    pub async fn launch(&self, name: &str) -> Result<PeerAddr, LaunchError> {
        let service = self.naming.service(name);
        let addr = self
            .naming
            .addr(name)
            .map_err(|reason| LaunchError::Unreachable {
                name: name.to_owned(),
                service: service.clone(),
                waited: Duration::ZERO,
                last_problem: reason.reason,
            })?;
        let started = Instant::now();
        loop {
            let problem = match health::check(&addr, PROBE_TIMEOUT, Readiness::PROCESS).await {
                Ok(()) => {
                    tracing::info!(%name, %addr, "attached");
                    return Ok(addr);
                }
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= self.ready_timeout {
                return Err(LaunchError::Unreachable {
                    name: name.to_owned(),
                    service,
                    waited: started.elapsed(),
                    last_problem: problem,
                });
            }
            sleep(PROBE_INTERVAL).await;
        }
    }
}
