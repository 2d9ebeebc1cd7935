//! The commands of the tailmesh binary, one module per concern, each a thin
//! layer over the library: its flags, the library call, what it prints.
//!
//! - `error`: [`CliError`], how a command ends other than in success, and
//!   the one place that turns it into an exit status.
//! - `run`: `tailmesh run`.
//! - `validate`: `tailmesh validate`.
//! - `predict`: `tailmesh predict`, the latency a scenario declares.
//! - `report`: `tailmesh report` and `tailmesh compare`, over finished runs.
//! - `deploy`: `tailmesh compose` and `tailmesh k8s`.
//! - `serve`: what the binary does inside a mesh or a container: `hop`,
//!   `broker` and `delay-line`, and the `health` and `token` helpers.
//! - `search`: `tailmesh search`, the highest rate that meets an objective.
//! - `cases`: `tailmesh cases`, labelled fault cases for root-cause
//!   analysis, and their scoring.
//! - `clean`: `tailmesh clean`.
//! - `import`: `tailmesh import`, the mesh a system's traces show.
//! - `probe`: `tailmesh probe`, one call to a real gRPC service as a hop
//!   would make it.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub(crate) mod cases;
pub(crate) mod clean;
pub(crate) mod deploy;
pub(crate) mod error;
pub(crate) mod import;
pub(crate) mod predict;
pub(crate) mod probe;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod search;
pub(crate) mod serve;
pub(crate) mod validate;
pub(crate) mod what_if;

pub(crate) use error::{CliError, finish};
