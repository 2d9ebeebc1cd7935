//! Collecting what the push callers saw of the replicas they call, when the
//! load has ended and before the processes stop: the load generator's own
//! pool, and every hop replica that calls a push hop, through its Control
//! API's `GetEndpointEvents` (with the run's token). A replica that answers
//! UNIMPLEMENTED (a build without endpoint events) has none to give; one
//! that cannot be reached is named in a warning, not counted as an
//! incident (it may have been killed on schedule).

use std::{sync::Arc, time::Duration};

use futures::future::join_all;
use tailmesh_proto::pb;
use tailmesh_services::{addr::PeerAddr, hop::PushPool, model::Transport};

use crate::{
    analysis::CallerEndpoints, launcher::AnyLauncher, loadgen::LoadClock, plan::Addrs,
    plan::MeshPlan,
};

/// The longest a replica gets to answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Every caller's view of every push hop it calls: the load generator's
/// (`loadgen`, from its `entries`' pools, or the generator processes',
/// `generators`, as they sent them) first, then each calling replica's in
/// plan order (`b/1`); pools with nothing in them are left out.
pub(super) async fn collect(
    plan: &MeshPlan,
    launcher: &AnyLauncher,
    addrs: &Addrs,
    clock: &LoadClock,
    entries: &[Arc<PushPool>],
    generators: &[CallerEndpoints],
) -> Vec<CallerEndpoints> {
    let variant = &plan.variant;
    let push = |name: &str| {
        variant
            .hops
            .iter()
            .any(|h| h.name == name && h.transport == Transport::Push)
    };
    let mut asks = Vec::new();
    for (process, hop, replica) in plan.hops() {
        if !hop.downstream.iter().any(|d| push(d)) {
            continue;
        }
        let Some((token, _)) = launcher.fault_place(&process.name) else {
            continue;
        };
        let Some(addr) = addrs
            .hops
            .get(&hop.name)
            .and_then(|a| a.get(replica as usize))
        else {
            continue;
        };
        let caller = format!("{}/{replica}", hop.name);
        let token = token.to_owned();
        let addr = addr.clone();
        asks.push(async move {
            let answer = ask(&addr, &token).await;
            (caller, answer)
        });
    }
    let answers = join_all(asks).await;
    // One reading of both clocks places the callers' wall-clock stamps.
    let measured_s = crate::wire::measured_seconds(clock);
    let mut out = crate::wire::pools_endpoints(crate::wire::LOADGEN_CALLER, entries, &measured_s);
    out.extend(generators.iter().cloned());
    for (caller, answer) in answers {
        match answer {
            Ok(Some(events)) => out.extend(
                events
                    .pools
                    .iter()
                    .map(|pool| crate::wire::caller_endpoints(&caller, pool, &measured_s)),
            ),
            Ok(None) => {}
            Err(e) => crate::tell!(
                "warning: variant {}: endpoint events of {caller} unavailable: {e}",
                variant.name
            ),
        }
    }
    out.retain(|c| !c.replicas.is_empty() || !c.events.is_empty());
    out
}

/// `GetEndpointEvents` of the replica at `addr`; `None` when it does not
/// implement it.
pub(super) async fn ask(
    addr: &PeerAddr,
    token: &str,
) -> Result<Option<pb::EndpointEvents>, super::faults::ControlError> {
    let channel = super::faults::control_channel(addr, CALL_TIMEOUT, |e| e).await?;
    let mut client = pb::control_client::ControlClient::new(channel);
    let mut request = tonic::Request::new(pb::GetEndpointEventsRequest {});
    let bearer = super::faults::bearer(token)?;
    request.metadata_mut().insert("authorization", bearer);
    match client.get_endpoint_events(request).await {
        Ok(reply) => Ok(Some(reply.into_inner())),
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
        Err(status) => Err(super::faults::ControlError::Refused {
            addr: addr.clone(),
            status,
        }),
    }
}
