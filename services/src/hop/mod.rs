//! The hop server: one replica of one hop of the mesh.
//!
//! - `draw`: seeded per-request decisions (work, slowness, errors).
//! - `work`: doing the work (sleep or CPU).
//! - `client`: reaching a push hop's replicas: endpoint health, keepalive.
//! - `balance`: picking among the pickable replicas (round robin, random,
//!   p2c, peak-EWMA) and outlier ejection.
//! - `events`: what a caller did with a hop's replicas (counts and timed
//!   state changes).
//! - `unary`: the call itself, over HTTP/2 with h2 (no tonic channel).
//! - `policy`: timeouts, budgeted retries and hedged requests.
//! - [`call`]: the client call stack, tower layers composed once over the
//!   reach (push, pull or direct): deadline, client span and trace
//!   propagation, policy; used by a hop for its downstream calls and by
//!   the load generator.
//! - `pull`: reaching a pulled hop through its broker topic.
//! - `service`: a real gRPC service as the hop's work: its schema (`.proto`
//!   files or server reflection), the request encoded once, the call.
//! - `fits`: whether a service's reply fits its output message, checked
//!   on the wire format without decoding it.
//! - `direct`: a leaf service called without a sidecar, by its caller.
//! - [`serve`]: the serving stack, tower layers composed once around a
//!   replica's work: server span, path record, downstream fan-out, slot
//!   and credit, planned faults.
//! - `server`: the request handler over that stack, the gRPC service and
//!   `run`.
//! - [`stream`]: a caller's messages to a streaming hop on one HTTP/2
//!   stream (`Hop.Stream`), each matched to its reply.
//! - `slots`: a replica's slots for its own work and the bounded line of
//!   requests waiting for one, in the hop's queue discipline.
//! - `error`: [`HopError`], and the one mapping of a call's failures to a
//!   gRPC status.

mod balance;
pub mod call;
pub mod client;
pub mod direct;
pub mod draw;
mod error;
pub mod events;
pub mod fits;
mod metadata;
pub mod policy;
mod pull;
pub mod serve;
pub mod server;
pub mod service;
pub mod serving;
mod slots;
pub mod stream;
mod unary;
pub mod work;

pub use client::{Connections, PushPool};
pub use direct::DirectTarget;
pub use error::HopError;
pub use pull::PullTarget;
pub use server::{DownstreamConfig, HopConfig, HopCore, run, run_with_control};
pub use service::{
    MethodKind, RawCodec, Replies, ServiceClient, ServiceError, ServiceReply, method_kind_in,
};
