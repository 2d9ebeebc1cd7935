//! The names a variant's processes get as services of a deployment
//! (Docker Compose, Kubernetes): `hop-<hop>-<replica>` and `broker`,
//! prefixed with `<variant>-` when the scenario has several variants, so
//! every variant has its own mesh, as it has its own processes locally.

use std::collections::BTreeMap;

use tailmesh_services::{
    addr::PeerAddr,
    model::{BrokerKind, Transport},
};

use super::{Addrs, BROKER, hop_role};
use crate::scenario::{Scenario, Variant};

/// A service name that cannot be an address.
#[derive(Debug, thiserror::Error)]
#[error("service {service}: {reason}")]
pub struct NamingError {
    pub service: String,
    pub reason: String,
}

/// The port another broker's official image listens on (Compose and
/// Kubernetes run RabbitMQ and NATS from their images); `None` for
/// tailmesh's broker, which listens where the deployment says, like a hop.
pub(crate) fn broker_port(kind: BrokerKind) -> Option<u16> {
    match kind {
        BrokerKind::Tailmesh => None,
        BrokerKind::Nats => Some(4222),
        BrokerKind::Rabbitmq => Some(5672),
    }
}

/// The service names of one variant's mesh, all listening on one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Naming {
    prefix: String,
    port: u16,
}

impl Naming {
    /// The names `variant` of `scenario` is deployed under, each service
    /// listening on `port`.
    pub fn for_variant(scenario: &Scenario, variant: &Variant, port: u16) -> Self {
        let prefix = if scenario.variants.len() > 1 {
            format!("{}-", variant.name)
        } else {
            String::new()
        };
        Self { prefix, port }
    }

    /// The service that plays `role` (`hop-b-1`, `broker`).
    pub fn service(&self, role: &str) -> String {
        format!("{}{role}", self.prefix)
    }

    /// Where the service playing `role` is reached.
    pub fn addr(&self, role: &str) -> Result<PeerAddr, NamingError> {
        let service = self.service(role);
        PeerAddr::new(&service, self.port).map_err(|e| NamingError {
            reason: e.to_string(),
            service,
        })
    }

    /// Where the variant's broker of `kind` is reached: on its image's own
    /// port ([`broker_port`]), or on the mesh's port for tailmesh's broker.
    pub fn broker_addr(&self, kind: BrokerKind) -> Result<PeerAddr, NamingError> {
        let service = self.service(BROKER);
        let port = broker_port(kind).unwrap_or(self.port);
        PeerAddr::new(&service, port).map_err(|e| NamingError {
            reason: e.to_string(),
            service,
        })
    }

    /// The broker's address (when a hop is reached by pull) and every hop's
    /// replica addresses, as a deployed hop hands them to its clients.
    pub fn addrs(&self, variant: &Variant) -> Result<Addrs, NamingError> {
        let broker = if variant.hops.iter().any(|h| h.transport == Transport::Pull) {
            Some(self.broker_addr(variant.broker)?)
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
        Ok(Addrs {
            broker,
            hops,
            services: BTreeMap::new(),
        })
    }
}
