//! The network-fault schedule of a variant: each fault is applied through
//! its replica's fault agent (the Control API, with the run's token) when
//! its start comes, cleared when its duration ends, and every fault still
//! applied is cleared when the load ends.

use std::time::Duration;

use tailmesh_netfault::{self as netfault, FaultRecord};
use tailmesh_proto::pb;
use tailmesh_services::addr::PeerAddr;

use crate::{
    launcher::AnyLauncher,
    plan::{Addrs, MeshPlan},
    scenario::NetFault,
};

/// The network faults of a variant: set through each replica's fault
/// agent (its Control API, with the run's token) when their start comes,
/// cleared when their duration ends, and all cleared when the load ends.
pub(super) struct Faults {
    token: String,
    pending: Vec<PlannedFault>,
    done: Vec<FaultRecord>,
    incidents: Vec<String>,
}

struct PlannedFault {
    addr: PeerAddr,
    /// The connection to the agent, opened before its fault is applied and
    /// kept for clearing it: a new connection across a lossy link can take
    /// longer to set up than the call allows (a SYN lost twice is 3 s).
    channel: Option<tonic::transport::Channel>,
    record: FaultRecord,
    fault: NetFault,
    applied: bool,
}

impl Faults {
    /// The faults of `plan`'s processes, to be applied through the agents
    /// `launcher` knows, at the addresses the hops were launched at.
    pub(super) fn plan(plan: &MeshPlan, launcher: &AnyLauncher, addrs: &Addrs) -> Self {
        let mut faults = Self {
            token: String::new(),
            pending: Vec::new(),
            done: Vec::new(),
            incidents: Vec::new(),
        };
        for (process, hop, replica, fault) in plan.net_faults() {
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
            faults.pending.push(PlannedFault {
                addr: addr.clone(),
                channel: None,
                record: FaultRecord {
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
                },
                fault: fault.clone(),
                applied: false,
            });
        }
        faults
    }

    /// Applies faults whose start has come and clears those whose
    /// duration is over, `now` from the start of the load.
    pub(super) async fn start(&mut self, now: Duration) {
        let mut i = 0;
        while i < self.pending.len() {
            let planned = &mut self.pending[i];
            if !planned.applied && planned.fault.start <= now {
                let net = pb::NetFault {
                    loss: planned.fault.loss,
                    delay_us: planned.record.delay_us,
                    jitter_us: planned.record.jitter_us,
                };
                match control_call(&planned.addr, &mut planned.channel, &self.token, Some(net))
                    .await
                {
                    Ok(state) => {
                        planned.record.mechanisms = state
                            .mechanisms
                            .iter()
                            .filter_map(|m| netfault::mechanism_of(m))
                            .collect();
                        planned.applied = true;
                    }
                    Err(e) => {
                        let line = format!(
                            "hop \"{}\" replica {}: fault not applied: {}",
                            planned.record.hop,
                            planned.record.replica,
                            e.message()
                        );
                        crate::tell!("warning: {line}");
                        self.incidents.push(line);
                        self.pending.remove(i);
                        continue;
                    }
                }
            } else if planned.applied
                && planned
                    .fault
                    .duration
                    .is_some_and(|d| planned.fault.start + d <= now)
            {
                let planned = self.pending.remove(i);
                let record = self.clear(planned).await;
                self.done.push(record);
                continue;
            }
            i += 1;
        }
    }

    async fn clear(&mut self, mut planned: PlannedFault) -> FaultRecord {
        let mut record = planned.record;
        match control_call(&planned.addr, &mut planned.channel, &self.token, None).await {
            Ok(state) => {
                if record.mechanisms.iter().any(|m| {
                    matches!(
                        m,
                        netfault::Mechanism::NftablesNumgen | netfault::Mechanism::Netem
                    )
                }) {
                    record.packets = Some([state.packets_seen, state.packets_dropped]);
                }
            }
            Err(e) => self.incidents.push(format!(
                "hop \"{}\" replica {}: fault not cleared (the namespace removal clears it): {}",
                record.hop,
                record.replica,
                e.message()
            )),
        }
        record
    }

    /// Clears every fault still applied; returns the records and incidents.
    pub(super) async fn finish(mut self) -> (Vec<FaultRecord>, Vec<String>) {
        let pending = std::mem::take(&mut self.pending);
        for planned in pending {
            if planned.applied {
                let record = self.clear(planned).await;
                self.done.push(record);
            } else {
                self.incidents.push(format!(
                    "hop \"{}\" replica {}: fault never started (the load ended before {} ms)",
                    planned.record.hop, planned.record.replica, planned.record.start_ms
                ));
            }
        }
        (self.done, self.incidents)
    }
}

/// SetFaults (`Some`) or ClearFaults (`None`) on the agent at `addr`,
/// over `channel`, connected first if it is not yet.
async fn control_call(
    addr: &PeerAddr,
    channel: &mut Option<tonic::transport::Channel>,
    token: &str,
    net: Option<pb::NetFault>,
) -> Result<pb::FaultState, tonic::Status> {
    let channel = match channel {
        Some(channel) => channel.clone(),
        None => {
            let connected = tonic::transport::Endpoint::from_shared(addr.uri())
                .map_err(|e| tonic::Status::internal(e.to_string()))?
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(10))
                // Pings keep the connection from looking idle to the hop,
                // which closes idle connections, however long the fault.
                .http2_keep_alive_interval(Duration::from_secs(30))
                .keep_alive_while_idle(true)
                .connect()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("connect {addr}: {e}")))?;
            channel.insert(connected).clone()
        }
    };
    let mut client = pb::control_client::ControlClient::new(channel);
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .map_err(|_| tonic::Status::internal("the token is not valid metadata"))?;
    let reply = match net {
        Some(net) => {
            let mut request = tonic::Request::new(pb::SetFaultsRequest {
                net: Some(net),
                slow: None,
            });
            request.metadata_mut().insert("authorization", bearer);
            client.set_faults(request).await?
        }
        None => {
            let mut request = tonic::Request::new(pb::ClearFaultsRequest {});
            request.metadata_mut().insert("authorization", bearer);
            client.clear_faults(request).await?
        }
    };
    Ok(reply.into_inner())
}
