//! tailmesh's network faults: real packet loss and delay on one replica's
//! link, and the network namespaces that give each replica a link of its
//! own. The orchestrator builds a run's namespaces with it and starts the
//! delay line through it; each hop's fault agent (the Control service in
//! `tailmesh-services`) applies and clears its replica's fault through its
//! [`agent::FaultBackend`]. It runs the system's `ip`, `tc`, `nft` and
//! `iptables`, never through a shell, and knows nothing of gRPC or of
//! scenarios.
//!
//! - [`tool`]: running the system's network tools; which are installed;
//!   whether this process has the privileges they need.
//! - [`netns`]: a run's network: namespaces, veths, the bridge, addresses,
//!   ownership files, and [`netns::clean`] of crashed runs' leftovers.
//! - `place`: [`Place`], where an agent acts (a netns member or its own
//!   namespace) and which interface it shapes there.
//! - `mechanism`: how a fault is applied ([`Mechanism`]: netem, nftables
//!   numgen loss, the NFQUEUE delay line) and removed; [`check`] up front.
//! - [`delayline`]: the userspace delay line on NFQUEUE (`tailmesh
//!   delay-line`).
//! - [`agent`]: the fault agent's backend: the [`agent::FaultBackend`]
//!   contract and [`agent::NetBackend`], which applies faults at a place.
//! - `record`: [`FaultRecord`], an applied fault as a run reports it, and
//!   [`WindowRecord`], a fault window with its planned and actual times.
//! - `error`: [`FaultError`], why a fault cannot be applied.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod agent;
pub mod delayline;
mod error;
mod mechanism;
pub mod netns;
mod place;
mod record;
pub mod tool;

pub use error::FaultError;
pub use mechanism::{FaultSpec, Mechanism, check, mechanism_of, netem_available};
pub use place::{Place, container_iface, default_route_iface};
pub use record::{FaultRecord, WindowRecord, ms};
