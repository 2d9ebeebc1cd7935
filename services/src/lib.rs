//! tailmesh services: the hop server, its work and fault models, and the
//! clients that reach downstream hops.
//!
//! - [`broker`]: the pull broker, its producer client and its worker loop.
//! - `model`: hop behaviour as plain data (work, slowness, balancing).
//! - `process`: the contract between a supervised process and its launcher.

pub mod broker;
pub mod model;
pub mod process;
