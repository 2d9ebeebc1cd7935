//! The fault schedule of a variant: each network fault, and each
//! application-level fault with a window (`slow`, `replica_slow`, `error`
//! with a `start` or a `duration`), is set through its replica's Control
//! API (with the run's token) when its start comes, cleared (that kind
//! only) when its duration ends, and every fault still set is cleared when
//! the load ends. A fault on a load generator's link (`[load] net`,
//! `generator_net`) keeps the same schedule, applied from here to the
//! generator's namespace: the generator serves no Control API.
//!
//! Windows are on the measured clock (from the end of warmup, the clock of
//! requests.csv): a window `[start, start + duration)` is applied at
//! `warmup + start` from the load's origin (the [`LoadClock`] the load
//! generator shares) and cleared at `warmup + start + duration`. A window
//! that starts at 0 is applied before the load starts, so warmup runs
//! under it too.

use std::{fmt, path::Path, sync::Arc, time::Duration};

use tailmesh_netfault::{
    self as netfault, FaultError, FaultRecord, FaultSpec, WindowRecord,
    agent::{FaultBackend, NetBackend},
};
use tailmesh_proto::pb;
use tailmesh_services::{addr::PeerAddr, control};
use tokio::time::Instant;

use crate::{
    launcher::AnyLauncher,
    loadgen::LoadClock,
    plan::{Addrs, AppFault, MeshPlan},
    scenario::{NetFault, Window},
};

/// The scheduled faults of a variant: set through each replica's fault
/// agent (its Control API, with the run's token) when their start comes,
/// cleared when their duration ends, and all cleared when the load ends.
pub(super) struct Faults {
    token: String,
    pending: Vec<PlannedFault>,
    done: Vec<Done>,
    incidents: Vec<String>,
}

/// A fault that was applied and cleared (or that the agent failed to clear).
struct Done {
    planned: PlannedFault,
    /// When the agent answered that the fault was cleared.
    cleared: Option<Instant>,
}

struct PlannedFault {
    agent: Agent,
    who: Who,
    action: Action,
    window: Window,
    at: Timing,
    /// When the agent answered that the fault was applied.
    applied: Option<Instant>,
}

/// Whose fault it is, as incidents and records name it.
#[derive(Clone, Debug, PartialEq)]
enum Who {
    Replica { hop: String, replica: u32 },
    Generator(u32),
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Replica { hop, replica } => write!(f, "hop \"{hop}\" replica {replica}"),
            Who::Generator(k) => write!(f, "load generator {k}"),
        }
    }
}

impl Who {
    /// `(hop, replica, generator)` as the records hold them.
    fn record(&self) -> (String, u32, Option<u32>) {
        match self {
            Who::Replica { hop, replica } => (hop.clone(), *replica, None),
            Who::Generator(k) => (String::new(), 0, Some(*k)),
        }
    }
}

/// Where a planned fault is applied.
enum Agent {
    /// A hop replica's fault agent, through its Control API.
    Control {
        addr: PeerAddr,
        /// The connection to the agent, opened before its fault is applied
        /// and kept for clearing it: a new connection across a lossy link
        /// can take longer to set up than the call allows (a SYN lost
        /// twice is 3 s).
        channel: Option<tonic::transport::Channel>,
    },
    /// A load generator's link, shaped from here in its namespace with
    /// the fault `spec`.
    Here {
        backend: Arc<NetBackend>,
        spec: FaultSpec,
    },
}

/// What an agent answered: the mechanisms in force, and the packets seen
/// and dropped when it cleared a fault.
struct Answer {
    mechanisms: Vec<String>,
    packets: Option<[u64; 2]>,
}

/// Why an agent did not apply or clear a fault.
#[derive(Debug, thiserror::Error)]
enum AgentError {
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Fault(#[from] FaultError),
    #[error("the fault's task ended without an answer: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl Agent {
    /// Applies (`set`) or clears `action` at this agent.
    async fn call(
        &mut self,
        token: &str,
        action: &Action,
        set: bool,
    ) -> Result<Answer, AgentError> {
        match self {
            Agent::Control { addr, channel } => {
                let call = if set {
                    Ok(action.set())
                } else {
                    Err(action.clear())
                };
                let state = control_call(addr, channel, token, call).await?;
                Ok(Answer {
                    mechanisms: state.mechanisms,
                    packets: Some([state.packets_seen, state.packets_dropped]),
                })
            }
            Agent::Here { backend, spec } => {
                let (backend, spec) = (Arc::clone(backend), spec.clone());
                let applied = tokio::task::spawn_blocking(move || {
                    if set {
                        backend.apply(&spec)
                    } else {
                        backend.clear()
                    }
                })
                .await??;
                Ok(Answer {
                    mechanisms: applied.mechanisms,
                    packets: applied.packets,
                })
            }
        }
    }
}

/// What a planned fault sets.
enum Action {
    /// A network fault, with its record for summary.json.
    Net(NetFault, Box<FaultRecord>),
    /// An application-level fault.
    App(AppFault),
}

impl Action {
    /// The name of its kind, as scenarios write it.
    fn kind(&self) -> &'static str {
        match self {
            Action::Net(..) => "net",
            Action::App(AppFault::Slow(_)) => "slow",
            Action::App(AppFault::WorkFactor(_)) => "replica_slow",
            Action::App(AppFault::Error(_)) => "error",
        }
    }

    /// The SetFaults request that applies it.
    fn set(&self) -> pb::SetFaultsRequest {
        match self {
            Action::Net(fault, record) => pb::SetFaultsRequest {
                net: Some(pb::NetFault {
                    loss: fault.loss,
                    delay_us: record.delay_us,
                    jitter_us: record.jitter_us,
                }),
                ..Default::default()
            },
            Action::App(AppFault::Slow(slow)) => pb::SetFaultsRequest {
                slow: Some(control::slowness_message(slow)),
                ..Default::default()
            },
            Action::App(AppFault::WorkFactor(factor)) => pb::SetFaultsRequest {
                work_factor: Some(*factor),
                ..Default::default()
            },
            Action::App(AppFault::Error(error)) => pb::SetFaultsRequest {
                error: Some(control::error_message(error)),
                ..Default::default()
            },
        }
    }

    /// The ClearFaults request that removes it, and it only.
    fn clear(&self) -> pb::ClearFaultsRequest {
        let kind = match self {
            Action::Net(..) => pb::FaultKind::Net,
            Action::App(AppFault::Slow(_)) => pb::FaultKind::Slow,
            Action::App(AppFault::WorkFactor(_)) => pb::FaultKind::WorkFactor,
            Action::App(AppFault::Error(_)) => pb::FaultKind::Error,
        };
        pb::ClearFaultsRequest {
            kinds: vec![kind as i32],
        }
    }
}

/// When a window is applied and cleared, from the load's origin.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Timing {
    apply_at: Duration,
    clear_at: Option<Duration>,
}

impl Timing {
    /// The window `[start, start + duration)` on the measured clock, whose
    /// 0 is `warmup` after the origin. A window at 0 is applied before the
    /// load starts.
    fn of(start: Duration, duration: Option<Duration>, warmup: Duration) -> Self {
        Self {
            apply_at: if start.is_zero() {
                Duration::ZERO
            } else {
                warmup + start
            },
            clear_at: duration.map(|d| warmup + start + d),
        }
    }
}

impl Faults {
    /// The faults of `plan`'s processes, to be applied through the agents
    /// `launcher` knows, at the addresses the hops were launched at, and
    /// those of its generators' links, applied from here (`exe`: tailmesh
    /// itself, for a delay line).
    pub(super) fn plan(plan: &MeshPlan, launcher: &AnyLauncher, addrs: &Addrs, exe: &Path) -> Self {
        let warmup = plan.variant.load.warmup;
        let mut faults = Self {
            token: String::new(),
            pending: Vec::new(),
            done: Vec::new(),
            incidents: Vec::new(),
        };
        let net = plan
            .net_faults()
            .into_iter()
            .map(|(process, hop, replica, fault)| {
                (process, hop, replica, fault.window(), None, Some(fault))
            });
        let app =
            plan.windowed_faults()
                .into_iter()
                .map(|(process, hop, replica, fault, window)| {
                    (process, hop, replica, window, Some(fault), None)
                });
        for (process, hop, replica, window, app, net) in net.chain(app) {
            let who = Who::Replica {
                hop: hop.name.clone(),
                replica,
            };
            let addr = addrs
                .hops
                .get(&hop.name)
                .and_then(|a| a.get(replica as usize));
            let (Some((token, place)), Some(addr)) = (launcher.fault_place(&process.name), addr)
            else {
                faults.incidents.push(format!(
                    "{who}: fault not applied: the {} launcher has no fault agent for it{}",
                    launcher.kind(),
                    if launcher.kind() == "attached" {
                        " (the deployment has no Control token: was it generated from this \
                         scenario?)"
                    } else {
                        ""
                    }
                ));
                continue;
            };
            faults.token = token.to_owned();
            let action = match (net, app) {
                (Some(fault), _) => {
                    Action::Net(fault.clone(), Box::new(record(&who, place, fault)))
                }
                (None, Some(app)) => Action::App(app),
                (None, None) => continue,
            };
            faults.pending.push(PlannedFault {
                agent: Agent::Control {
                    addr: addr.clone(),
                    channel: None,
                },
                who,
                action,
                window,
                at: Timing::of(window.start, window.duration, warmup),
                applied: None,
            });
        }
        for (k, fault) in plan.generator_net_faults() {
            let who = Who::Generator(k);
            let agent = match launcher {
                AnyLauncher::Netns(netns) => netns.generator_agent(k),
                _ => None,
            };
            let Some(agent) = agent else {
                faults.incidents.push(format!(
                    "{who}: net fault not applied: the {} launcher gave it no namespace",
                    launcher.kind()
                ));
                continue;
            };
            let place = match &agent.place {
                netfault::Place::Member { member, .. } => member.ns.clone(),
                netfault::Place::Own { iface } => iface.clone(),
            };
            let seed = plan.seed ^ u64::from(k) ^ GENERATOR_DELAY_SEED;
            let backend = match NetBackend::new(agent, exe.to_owned(), seed) {
                Ok(backend) => Arc::new(backend),
                Err(e) => {
                    faults
                        .incidents
                        .push(format!("{who}: net fault not applied: {e}"));
                    continue;
                }
            };
            let window = fault.window();
            faults.pending.push(PlannedFault {
                agent: Agent::Here {
                    backend,
                    spec: crate::scenario::fault_spec(fault),
                },
                action: Action::Net(fault.clone(), Box::new(record(&who, place, fault))),
                who,
                window,
                at: Timing::of(window.start, window.duration, warmup),
                applied: None,
            });
        }
        faults
    }

    /// Applies the faults whose window has opened and clears those whose
    /// window has closed, `since_origin` from the load's origin (zero
    /// before the load starts).
    pub(super) async fn advance(&mut self, since_origin: Duration) {
        let mut i = 0;
        while i < self.pending.len() {
            let planned = &mut self.pending[i];
            if planned.applied.is_none() && planned.at.apply_at <= since_origin {
                match planned.agent.call(&self.token, &planned.action, true).await {
                    Ok(answer) => {
                        if let Action::Net(_, record) = &mut planned.action {
                            record.mechanisms = answer
                                .mechanisms
                                .iter()
                                .filter_map(|m| netfault::mechanism_of(m))
                                .collect();
                        }
                        planned.applied = Some(Instant::now());
                    }
                    Err(e) => {
                        let line = format!(
                            "{}: {} fault not applied: {e}",
                            planned.who,
                            planned.action.kind(),
                        );
                        crate::tell!("warning: {line}");
                        self.incidents.push(line);
                        self.pending.remove(i);
                        continue;
                    }
                }
            } else if planned.applied.is_some()
                && planned.at.clear_at.is_some_and(|at| at <= since_origin)
            {
                let planned = self.pending.remove(i);
                let done = self.clear(planned).await;
                self.done.push(done);
                continue;
            }
            i += 1;
        }
    }

    /// When, from the load's origin, the schedule next applies or clears a
    /// fault; `None` when nothing is left to change.
    pub(super) fn next_change(&self) -> Option<Duration> {
        self.pending
            .iter()
            .filter_map(|p| match p.applied {
                None => Some(p.at.apply_at),
                Some(_) => p.at.clear_at,
            })
            .min()
    }

    async fn clear(&mut self, mut planned: PlannedFault) -> Done {
        let mut cleared = None;
        match planned
            .agent
            .call(&self.token, &planned.action, false)
            .await
        {
            Ok(answer) => {
                cleared = Some(Instant::now());
                if let Action::Net(_, record) = &mut planned.action
                    && record.mechanisms.iter().any(|m| {
                        matches!(
                            m,
                            netfault::Mechanism::NftablesNumgen | netfault::Mechanism::Netem
                        )
                    })
                {
                    record.packets = answer.packets;
                }
            }
            Err(e) => self.incidents.push(format!(
                "{}: {} fault not cleared{}: {e}",
                planned.who,
                planned.action.kind(),
                match planned.action {
                    Action::Net(..) => " (the namespace removal clears it)",
                    Action::App(_) => " (it lasted until the hop stopped)",
                },
            )),
        }
        Done { planned, cleared }
    }

    /// Clears every fault still applied; returns the network faults'
    /// records, every window's record and the incidents.
    pub(super) async fn finish(
        mut self,
        clock: &LoadClock,
    ) -> (Vec<FaultRecord>, Vec<WindowRecord>, Vec<String>) {
        let pending = std::mem::take(&mut self.pending);
        for planned in pending {
            if planned.applied.is_some() {
                let done = self.clear(planned).await;
                self.done.push(done);
            } else {
                self.incidents.push(format!(
                    "{}: {} fault never started (the load ended before {} after warmup)",
                    planned.who,
                    planned.action.kind(),
                    tailmesh_units::duration(planned.window.start)
                ));
            }
        }
        let mut records = Vec::new();
        let mut windows = Vec::new();
        for Done { planned, cleared } in self.done {
            let applied_at_s = planned.applied.map(|t| clock.measured_s(t));
            let cleared_at_s = cleared.map(|t| clock.measured_s(t));
            if planned.window.is_scheduled() {
                let (hop, replica, generator) = planned.who.record();
                windows.push(WindowRecord {
                    hop,
                    replica,
                    generator,
                    kind: planned.action.kind().to_owned(),
                    start_s: planned.window.start.as_secs_f64(),
                    end_s: planned
                        .window
                        .duration
                        .map(|d| (planned.window.start + d).as_secs_f64()),
                    applied_at_s,
                    cleared_at_s,
                });
            }
            if let Action::Net(_, record) = planned.action {
                records.push(FaultRecord {
                    applied_at_s,
                    cleared_at_s,
                    ..*record
                });
            }
        }
        (records, windows, self.incidents)
    }
}

/// Mixed into a generator's delay-line seed, so that its draws are not
/// those of a hop replica with the same number.
const GENERATOR_DELAY_SEED: u64 = 0x6765_6e65_7261_746f;

/// The summary.json record of `fault` on `who`'s link in `namespace`,
/// before it is applied.
fn record(who: &Who, namespace: String, fault: &NetFault) -> FaultRecord {
    let (hop, replica, generator) = who.record();
    FaultRecord {
        hop,
        replica,
        generator,
        namespace,
        loss: fault.loss,
        delay_us: u64::try_from(fault.delay.as_micros()).unwrap_or(u64::MAX),
        jitter_us: u64::try_from(fault.jitter.as_micros()).unwrap_or(u64::MAX),
        start_ms: netfault::ms(fault.start),
        duration_ms: fault.duration.map(netfault::ms),
        mechanisms: Vec::new(),
        packets: None,
        applied_at_s: None,
        cleared_at_s: None,
    }
}

/// SetFaults (`Ok`) or ClearFaults (`Err`) on the agent at `addr`, over
/// `channel`, connected first if it is not yet.
async fn control_call(
    addr: &PeerAddr,
    channel: &mut Option<tonic::transport::Channel>,
    token: &str,
    call: Result<pb::SetFaultsRequest, pb::ClearFaultsRequest>,
) -> Result<pb::FaultState, ControlError> {
    let channel = match channel {
        Some(channel) => channel.clone(),
        None => {
            // Pings keep the connection from looking idle to the hop,
            // which closes idle connections, however long the fault.
            let connected = control_channel(addr, Duration::from_secs(10), |e| {
                e.http2_keep_alive_interval(Duration::from_secs(30))
                    .keep_alive_while_idle(true)
            })
            .await?;
            channel.insert(connected).clone()
        }
    };
    let mut client = pb::control_client::ControlClient::new(channel);
    let bearer = bearer(token)?;
    let refused = |status| ControlError::Refused {
        addr: addr.clone(),
        status,
    };
    let reply = match call {
        Ok(set) => {
            let mut request = tonic::Request::new(set);
            request.metadata_mut().insert("authorization", bearer);
            client.set_faults(request).await.map_err(refused)?
        }
        Err(clear) => {
            let mut request = tonic::Request::new(clear);
            request.metadata_mut().insert("authorization", bearer);
            client.clear_faults(request).await.map_err(refused)?
        }
    };
    Ok(reply.into_inner())
}

/// Why a call to a replica's Control API got no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum ControlError {
    /// The address does not make a gRPC endpoint.
    #[error("{addr}: not an endpoint: {source}")]
    Endpoint {
        addr: PeerAddr,
        source: tonic::transport::Error,
    },
    #[error("connect {addr}: {source}")]
    Connect {
        addr: PeerAddr,
        source: tonic::transport::Error,
    },
    /// The run's token cannot travel as gRPC metadata (it is made of
    /// visible ASCII, so this is a bug or a hand-made token file).
    #[error("the run's token is not valid gRPC metadata")]
    Token,
    /// The agent answered with an error status.
    #[error("{addr}: {}", .status.message())]
    Refused {
        addr: PeerAddr,
        status: tonic::Status,
    },
}

/// A channel to the Control API at `addr`, each call bounded by `timeout`,
/// over TLS when the run's links use it (the process's client config);
/// `tune` sets anything else on the endpoint.
pub(super) async fn control_channel(
    addr: &PeerAddr,
    timeout: Duration,
    tune: impl FnOnce(tonic::transport::Endpoint) -> tonic::transport::Endpoint,
) -> Result<tonic::transport::Channel, ControlError> {
    let endpoint = tonic::transport::Endpoint::from_shared(addr.uri())
        .map_err(|source| ControlError::Endpoint {
            addr: addr.clone(),
            source,
        })?
        .connect_timeout(timeout)
        .timeout(timeout);
    tailmesh_services::link::connect(&tune(endpoint), &Default::default())
        .await
        .map_err(|source| ControlError::Connect {
            addr: addr.clone(),
            source,
        })
}

/// The `authorization` metadata of the run's token.
pub(super) fn bearer(
    token: &str,
) -> Result<tonic::metadata::MetadataValue<tonic::metadata::Ascii>, ControlError> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| ControlError::Token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(at: Timing) -> PlannedFault {
        PlannedFault {
            agent: Agent::Control {
                addr: PeerAddr::new("127.0.0.1", 1).expect("a loopback address"),
                channel: None,
            },
            who: Who::Replica {
                hop: "b".to_owned(),
                replica: 0,
            },
            window: Window::default(),
            action: Action::App(AppFault::WorkFactor(2.0)),
            at,
            applied: None,
        }
    }

    #[test]
    fn windows_are_applied_at_warmup_plus_start() {
        let s = Duration::from_secs;
        let at = Timing::of(s(5), Some(s(10)), s(1));
        assert_eq!(
            at,
            Timing {
                apply_at: s(6),
                clear_at: Some(s(16)),
            }
        );
        let mut faults = Faults {
            token: String::new(),
            pending: vec![planned(at), planned(Timing::of(s(8), None, s(1)))],
            done: Vec::new(),
            incidents: Vec::new(),
        };
        assert_eq!(faults.next_change(), Some(s(6)));
        faults.pending[0].applied = Some(Instant::now());
        assert_eq!(faults.next_change(), Some(s(9)));
        faults.pending[1].applied = Some(Instant::now());
        assert_eq!(faults.next_change(), Some(s(16)));
        faults.pending.remove(0);
        assert_eq!(
            faults.next_change(),
            None,
            "an open-ended window never clears"
        );

        // A window at 0 covers warmup too: it is applied before the load.
        assert_eq!(
            Timing::of(Duration::ZERO, Some(s(3)), s(1)),
            Timing {
                apply_at: Duration::ZERO,
                clear_at: Some(s(4)),
            }
        );
    }

    #[test]
    fn times_are_recorded_on_the_measured_clock() {
        let clock = LoadClock {
            origin: Instant::now(),
            warmup: Duration::from_secs(2),
        };
        let at = |ms: u64| clock.origin + Duration::from_millis(ms);
        assert!((clock.measured_s(at(5_500)) - 3.5).abs() < 1e-9);
        assert!((clock.measured_s(at(500)) + 1.5).abs() < 1e-9);
        if let Some(before) = clock.origin.checked_sub(Duration::from_millis(250)) {
            assert!((clock.measured_s(before) + 2.25).abs() < 1e-9);
        }
    }
}
