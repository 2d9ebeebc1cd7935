//! The fault agent's backend: what a hop's Control service (in
//! `tailmesh-services`) calls to apply and clear its replica's network
//! fault. [`FaultBackend`] is the contract; [`NetBackend`] applies faults
//! with this crate's mechanisms at the [`Place`] the launcher described in
//! an [`AgentEnv`]; [`NoFaults`] refuses, for hops without a namespace of
//! their own.

use std::{
    path::PathBuf,
    sync::{Mutex, PoisonError},
};

use crate::{
    FaultError, FaultSpec, Mechanism, Place,
    mechanism::{self, DelayLineSpawn, InForce},
};

/// What a backend reports after applying or clearing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Mechanism names, loss first.
    pub mechanisms: Vec<String>,
    /// `[seen, dropped]` of the loss rule, when cleared.
    pub packets: Option<[u64; 2]>,
}

/// Applies faults to the replica's namespace. Calls may block (they run
/// commands); the Control service runs them on the blocking pool, one at a
/// time.
pub trait FaultBackend: Send + Sync + 'static {
    /// Applies `fault`, replacing any fault in force.
    fn apply(&self, fault: &FaultSpec) -> Result<Applied, FaultError>;
    /// Removes the fault in force.
    fn clear(&self) -> Result<Applied, FaultError>;
}

/// A backend for hops without network faults (the local launcher): every
/// change is refused.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFaults;

impl FaultBackend for NoFaults {
    fn apply(&self, _: &FaultSpec) -> Result<Applied, FaultError> {
        Err(FaultError::NoNamespace)
    }
    fn clear(&self) -> Result<Applied, FaultError> {
        Ok(Applied::default())
    }
}

/// What a hop's fault agent needs to know, passed by its launcher as JSON,
/// e.g. `{"place":{"kind":"own","iface":"eth0"},"log":"/tmp/delay-line.log"}`
/// for an agent in its own namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEnv {
    /// Where it applies faults: a member namespace of the netns launcher,
    /// or its own (a container's).
    pub place: Place,
    /// Where a delay line's output goes.
    pub log: PathBuf,
}

/// The fault agent's backend: applies faults at its [`Place`] with the
/// mechanisms of this crate (netem probed once, in member namespaces only).
#[derive(Debug)]
pub struct NetBackend {
    agent: AgentEnv,
    exe: PathBuf,
    seed: u64,
    netem: bool,
    in_force: Mutex<Option<InForce>>,
}

impl NetBackend {
    /// A backend for the agent described by `agent`; `exe` is `tailmesh`
    /// itself (for the delay line), `seed` the delay line's. In the
    /// agent's own namespace it first removes an earlier agent's leftovers.
    pub fn new(agent: AgentEnv, exe: PathBuf, seed: u64) -> Result<Self, FaultError> {
        agent.place.validate()?;
        let netem = match &agent.place {
            Place::Member { hub, run_id, .. } => {
                mechanism::netem_available(hub, &format!("tm{run_id}u"))
            }
            Place::Own { .. } => {
                mechanism::remove_leftovers(&agent.place);
                false
            }
        };
        Ok(Self {
            agent,
            exe,
            seed,
            netem,
            in_force: Mutex::new(None),
        })
    }

    /// A backend for an agent inside its own namespace (a container or a
    /// pod with CAP_NET_ADMIN) shaping interface `iface` (see
    /// [`crate::container_iface`]); the delay line writes to `log`.
    pub fn own(iface: String, log: PathBuf, exe: PathBuf, seed: u64) -> Result<Self, FaultError> {
        Self::new(
            AgentEnv {
                place: Place::Own { iface },
                log,
            },
            exe,
            seed,
        )
    }

    fn take(&self) -> Option<InForce> {
        self.in_force
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Drop for NetBackend {
    /// In its own namespace the agent removes its fault when the hop stops
    /// (nobody deletes a container's namespace between two runs of its
    /// hop); member namespaces are removed with the run.
    fn drop(&mut self) {
        if let Place::Own { .. } = self.agent.place
            && let Some(in_force) = self.take()
        {
            mechanism::clear(&self.agent.place, in_force);
        }
    }
}

fn names(mechanisms: &[Mechanism]) -> Vec<String> {
    mechanisms
        .iter()
        .map(|m| match m {
            Mechanism::Netem => "netem",
            Mechanism::NftablesNumgen => "nftables_numgen",
            Mechanism::NfqueueDelayLine => "nfqueue_delay_line",
        })
        .map(str::to_owned)
        .collect()
}

impl FaultBackend for NetBackend {
    fn apply(&self, fault: &FaultSpec) -> Result<Applied, FaultError> {
        if let Some(previous) = self.take() {
            mechanism::clear(&self.agent.place, previous);
        }
        let spawn = DelayLineSpawn {
            exe: &self.exe,
            log: &self.agent.log,
            seed: self.seed,
        };
        let in_force = mechanism::apply(&self.agent.place, fault, self.netem, &spawn)?;
        let mechanisms = names(&in_force.mechanisms);
        *self.in_force.lock().unwrap_or_else(PoisonError::into_inner) = Some(in_force);
        Ok(Applied {
            mechanisms,
            packets: None,
        })
    }

    fn clear(&self) -> Result<Applied, FaultError> {
        let Some(in_force) = self.take() else {
            return Ok(Applied::default());
        };
        let mechanisms = names(&in_force.mechanisms);
        let packets = mechanism::clear(&self.agent.place, in_force);
        Ok(Applied {
            mechanisms,
            packets,
        })
    }
}

/// A hop's fault agent backend: the mechanisms of its namespace, or
/// [`NoFaults`]' refusal when the hop has no namespace of its own (its
/// launcher described none).
#[derive(Debug)]
pub struct AgentBackend(pub Option<NetBackend>);

impl FaultBackend for AgentBackend {
    fn apply(&self, fault: &FaultSpec) -> Result<Applied, FaultError> {
        match &self.0 {
            Some(b) => b.apply(fault),
            None => NoFaults.apply(fault),
        }
    }
    fn clear(&self) -> Result<Applied, FaultError> {
        match &self.0 {
            Some(b) => b.clear(),
            None => NoFaults.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::place::testing::member;

    #[test]
    fn the_agent_env_names_its_place_in_json() {
        let env: AgentEnv = serde_json::from_str(
            r#"{"place":{"kind":"own","iface":"ens4"},"log":"/tmp/delay-line.log"}"#,
        )
        .expect("an own-namespace agent env");
        assert_eq!(
            env.place,
            Place::Own {
                iface: "ens4".to_owned()
            }
        );
        let netns = AgentEnv {
            place: member(),
            log: "/r/delay-line-hop-b-1.log".into(),
        };
        let json = serde_json::to_string(&netns).expect("serializes");
        assert!(
            json.starts_with(r#"{"place":{"kind":"member","member":{"#),
            "{json}"
        );
        let back: AgentEnv = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, netns);
        assert!(serde_json::from_str::<AgentEnv>(r#"{"place":{"kind":"own"},"log":"l"}"#).is_err());
    }
}
