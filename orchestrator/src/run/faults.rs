//! The fault schedule of a variant: each network fault, and each
//! application-level fault with a window (`slow`, `replica_slow`, `error`
//! with a `start` or a `duration`), is set through its replica's Control
//! API (with the run's token) when its start comes, cleared (that kind
//! only) when its duration ends, and every fault still set is cleared when
//! the load ends.
//!
//! Windows are on the measured clock (from the end of warmup, the clock of
//! requests.csv): a window `[start, start + duration)` is applied at
//! `warmup + start` from the load's origin (the [`LoadClock`] the load
//! generator shares) and cleared at `warmup + start + duration`. A window
//! that starts at 0 is applied before the load starts, so warmup runs
//! under it too.

use std::time::Duration;

use tailmesh_netfault::{self as netfault, FaultRecord, WindowRecord};
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
    addr: PeerAddr,
    /// The connection to the agent, opened before its fault is applied and
    /// kept for clearing it: a new connection across a lossy link can take
    /// longer to set up than the call allows (a SYN lost twice is 3 s).
    channel: Option<tonic::transport::Channel>,
    hop: String,
    replica: u32,
    action: Action,
    window: Window,
    at: Timing,
    /// When the agent answered that the fault was applied.
    applied: Option<Instant>,
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
    /// `launcher` knows, at the addresses the hops were launched at.
    pub(super) fn plan(plan: &MeshPlan, launcher: &AnyLauncher, addrs: &Addrs) -> Self {
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
            let addr = addrs
                .hops
                .get(&hop.name)
                .and_then(|a| a.get(replica as usize));
            let (Some((token, place)), Some(addr)) = (launcher.fault_place(&process.name), addr)
            else {
                faults.incidents.push(format!(
                    "hop \"{}\" replica {replica}: fault not applied: the {} launcher has \
                     no fault agent for it{}",
                    hop.name,
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
                (Some(fault), _) => Action::Net(
                    fault.clone(),
                    Box::new(FaultRecord {
                        hop: hop.name.clone(),
                        replica,
                        namespace: place,
                        loss: fault.loss,
                        delay_us: u64::try_from(fault.delay.as_micros()).unwrap_or(u64::MAX),
                        jitter_us: u64::try_from(fault.jitter.as_micros()).unwrap_or(u64::MAX),
                        start_ms: netfault::ms(fault.start),
                        duration_ms: fault.duration.map(netfault::ms),
                        mechanisms: Vec::new(),
                        packets: None,
                        applied_at_s: None,
                        cleared_at_s: None,
                    }),
                ),
                (None, Some(app)) => Action::App(app),
                (None, None) => continue,
            };
            faults.pending.push(PlannedFault {
                addr: addr.clone(),
                channel: None,
                hop: hop.name.clone(),
                replica,
                action,
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
                let request = planned.action.set();
                match control_call(
                    &planned.addr,
                    &mut planned.channel,
                    &self.token,
                    Ok(request),
                )
                .await
                {
                    Ok(state) => {
                        if let Action::Net(_, record) = &mut planned.action {
                            record.mechanisms = state
                                .mechanisms
                                .iter()
                                .filter_map(|m| netfault::mechanism_of(m))
                                .collect();
                        }
                        planned.applied = Some(Instant::now());
                    }
                    Err(e) => {
                        let line = format!(
                            "hop \"{}\" replica {}: {} fault not applied: {}",
                            planned.hop,
                            planned.replica,
                            planned.action.kind(),
                            e
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
        let request = planned.action.clear();
        match control_call(
            &planned.addr,
            &mut planned.channel,
            &self.token,
            Err(request),
        )
        .await
        {
            Ok(state) => {
                cleared = Some(Instant::now());
                if let Action::Net(_, record) = &mut planned.action
                    && record.mechanisms.iter().any(|m| {
                        matches!(
                            m,
                            netfault::Mechanism::NftablesNumgen | netfault::Mechanism::Netem
                        )
                    })
                {
                    record.packets = Some([state.packets_seen, state.packets_dropped]);
                }
            }
            Err(e) => self.incidents.push(format!(
                "hop \"{}\" replica {}: {} fault not cleared{}: {}",
                planned.hop,
                planned.replica,
                planned.action.kind(),
                match planned.action {
                    Action::Net(..) => " (the namespace removal clears it)",
                    Action::App(_) => " (it lasted until the hop stopped)",
                },
                e
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
                    "hop \"{}\" replica {}: {} fault never started (the load ended before {} \
                     after warmup)",
                    planned.hop,
                    planned.replica,
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
                windows.push(WindowRecord {
                    hop: planned.hop.clone(),
                    replica: planned.replica,
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
            addr: PeerAddr::new("127.0.0.1", 1).expect("a loopback address"),
            channel: None,
            hop: "b".to_owned(),
            replica: 0,
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
