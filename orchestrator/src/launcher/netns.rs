//! The netns launcher: every process in its own network namespace, with its
//! own address, so a network fault hits one replica's packets only. The
//! namespaces, veths and bridge are a [`Network`] of `tailmesh-netfault`
//! (its `netns` module has the topology and the cleanup of leftovers).
//!
//! Processes run as `ip netns exec <ns> <program> ... --listen <addr>:0`;
//! `ip` execs the program after joining the namespace, so the process
//! handling of [`LocalLauncher`] (process group, stdin pipe, pid and log
//! files, health checks) applies unchanged. Each hop's fault agent learns
//! the run's Control token and its [`Place`] from its environment.

use std::{ffi::OsString, fmt, io, net::IpAddr, path::PathBuf, time::Duration};

use tailmesh_netfault::{
    Place,
    agent::AgentEnv,
    netns::{Member, NetnsError, Network},
    tool::find_in_path,
};

use tailmesh_services::serving::CONTROL_TOKEN_ENV;

use super::{ExitedChild, Killed, LaunchError, Launched, LocalLauncher, ProcessSpec};

/// The environment variable telling a hop's fault agent where it acts: an
/// [`AgentEnv`] as JSON.
pub const AGENT_ENV: &str = "TAILMESH_AGENT";

/// The namespace name of load generator `k`: one no hop process has (hop
/// names are DNS labels, without dots).
pub fn generator_member(k: u32) -> String {
    format!("generator.{k}")
}

/// The netns launcher: a [`LocalLauncher`] whose children run inside their
/// own namespaces of a [`Network`].
pub struct NetnsLauncher {
    local: LocalLauncher,
    net: Network,
    token: String,
}

impl fmt::Debug for NetnsLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetnsLauncher")
            .field("net", &self.net)
            .finish_non_exhaustive()
    }
}

impl NetnsLauncher {
    /// Builds the run's network; children's files go to `log_dir`.
    pub fn new(log_dir: PathBuf) -> Result<Self, NetnsError> {
        Ok(Self {
            local: LocalLauncher::new(log_dir),
            net: Network::create()?,
            token: super::new_token(),
        })
    }

    /// The run's network.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// The token every fault agent of the run accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The namespace of the process `name`, created (with its address)
    /// if it has none yet: what must be known before the process starts,
    /// such as the address its TLS certificate names.
    pub fn member(&mut self, name: &str) -> Result<Member, NetnsError> {
        if let Some(member) = self.net.members().iter().find(|m| m.name == name) {
            return Ok(member.clone());
        }
        self.net.add_member(name)
    }

    /// Where a fault agent shapes `member`'s link, and where its delay
    /// line writes.
    pub fn agent_env(&self, member: &Member) -> AgentEnv {
        AgentEnv {
            place: Place::Member {
                member: member.clone(),
                hub: self.net.hub(),
                run_id: self.net.id().to_owned(),
            },
            log: self
                .local
                .log_dir()
                .join(format!("delay-line-{}.log", member.name)),
        }
    }

    /// The fault agent of load generator `k`'s link, shaped from the
    /// orchestrator (the generator itself serves no Control API); `None`
    /// until its namespace exists.
    pub fn generator_agent(&self, k: u32) -> Option<AgentEnv> {
        let name = generator_member(k);
        let member = self.net.members().iter().find(|m| m.name == name)?;
        Some(self.agent_env(member))
    }

    /// Starts `spec` in its namespace ([`NetnsLauncher::member`]: the one
    /// made for it beforehand, or a new one), listening on its address.
    pub async fn launch(&mut self, spec: ProcessSpec) -> Result<Launched, LaunchError> {
        let member = self.member(&spec.name).map_err(|e| LaunchError::Spawn {
            name: spec.name.clone(),
            program: spec.program.clone(),
            source: io::Error::other(e.to_string()),
        })?;
        let mut args: Vec<OsString> = vec![
            "netns".into(),
            "exec".into(),
            member.ns.clone().into(),
            spec.program.clone().into_os_string(),
        ];
        args.extend(spec.args);
        args.push("--listen".into());
        args.push(format!("{}:0", IpAddr::V4(member.addr)).into());
        let mut env = spec.env;
        // The fault agent of a hop: the run's token and where it lives.
        let agent =
            serde_json::to_string(&self.agent_env(&member)).map_err(|e| LaunchError::Spawn {
                name: spec.name.clone(),
                program: spec.program.clone(),
                source: io::Error::other(e),
            })?;
        env.push((CONTROL_TOKEN_ENV.into(), self.token.clone().into()));
        env.push((AGENT_ENV.into(), agent.into()));
        let wrapped = ProcessSpec {
            name: spec.name,
            program: find_in_path("ip").unwrap_or_else(|| "ip".into()),
            args,
            env,
            ready_timeout: spec.ready_timeout,
            service: None,
        };
        self.local.launch(wrapped).await
    }

    /// See [`LocalLauncher::running`].
    pub fn running(&self) -> impl Iterator<Item = &Launched> {
        self.local.running()
    }

    /// See [`LocalLauncher::kill`].
    pub async fn kill(&mut self, name: &str) -> Result<Killed, LaunchError> {
        self.local.kill(name).await
    }

    /// See [`LocalLauncher::relaunch`]: in the namespace it had, which
    /// stays until the network is removed.
    pub async fn relaunch(&mut self, killed: &Killed) -> Result<Launched, LaunchError> {
        self.local.relaunch(killed).await
    }

    /// See [`LocalLauncher::exited`].
    pub fn exited(&mut self) -> Vec<ExitedChild> {
        self.local.exited()
    }

    /// Stops the children, then removes the network.
    pub async fn shutdown(&mut self, grace: Duration) -> Vec<ExitedChild> {
        let stopped = self.local.shutdown(grace).await;
        self.net.remove();
        stopped
    }
}
