//! tailmesh services: the hop server, its work and fault models, the pull
//! broker, and the clients that reach downstream hops.
//!
//! - [`broker`]: the pull broker, its producer client and its worker loop.
//! - `control`: the fault agent, `tailmesh.v1.Control` (token-guarded).
//! - [`discipline`]: queue disciplines (fifo, lifo, adaptive) shared by the
//!   broker's topics and a push replica's line for a slot.
//! - `model`: hop behaviour as plain data (work, slowness, balancing).
//! - `process`: the contract between a supervised process and its launcher.
//! - `hop`: the hop server, its per-request draws and its downstream clients.
//! - [`serving`]: the hop's serving layers around a user's own tonic
//!   server, so it joins a run as a hop with no sidecar.
//! - [`telemetry`]: trace export and W3C trace context propagation.
//! - `timer`: sub-millisecond sleeps.
//! - `runtime_thread`: a runtime on its own thread, for background work.
//! - [`turns`]: background work that offers its core to the serving
//!   threads every 50 us.
//! - `addr`: [`addr::PeerAddr`], a service's host (address or DNS name) and port.
//! - `deadline`: reading `grpc-timeout` for deadline propagation.
//! - `incoming`: the connections a server accepts: accept errors backed
//!   off and logged, idle connections closed, TLS handshakes side by side.
//! - [`limits`]: the largest payload and the gRPC message limits derived
//!   from it.
//! - [`protojson`]: protobuf's JSON mapping for messages of a schema read
//!   at run time (a real service's request and reply).
//! - `reflection`: server reflection listing only the services served.
//! - [`tls`]: the run's CA and certificates, and the rustls configs of
//!   `[mesh] tls`.
//! - [`link`]: the client side of every connection (one endpoint set-up)
//!   and what happened to the connections ([`link::LinkCounts`]).

pub mod addr;
pub mod broker;
pub mod control;
mod deadline;
pub mod discipline;
pub mod hop;
pub mod incoming;
pub mod limits;
pub mod link;
pub mod model;
pub mod process;
pub mod protojson;
mod reflection;
pub mod runtime_thread;
pub use hop::serving;
pub mod telemetry;
pub mod timer;
pub mod tls;
pub mod turns;
