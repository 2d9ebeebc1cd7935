//! tailmesh services: the hop server, its work and fault models, and the
//! clients that reach downstream hops.
//!
//! - `model`: hop behaviour as plain data (work, slowness, balancing).
//! - `process`: the contract between a supervised process and its launcher.
//! - `hop`: the hop server, its per-request draws and its downstream clients.
//! - `timer`: sub-millisecond sleeps.

pub mod hop;
pub mod model;
pub mod process;
pub mod timer;
