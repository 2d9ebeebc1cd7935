//! The commands of the tailmesh binary, one module per concern, each a thin
//! layer over the library: its flags, the library call, what it prints.
//!
//! - `error`: [`CliError`], how a command ends other than in success, and
//!   the one place that turns it into an exit status.
//! - `run`: `tailmesh run`.
//! - `validate`: `tailmesh validate`.
//! - `report`: `tailmesh report` and `tailmesh compare`, over finished runs.
//! - `deploy`: `tailmesh compose` and `tailmesh k8s`.
//! - `serve`: what the binary does inside a mesh or a container: `hop`,
//!   `broker` and `delay-line`, and the `health` and `token` helpers.
//! - `clean`: `tailmesh clean`.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod clean;
pub mod deploy;
pub mod error;
pub mod report;
pub mod run;
pub mod serve;
pub mod validate;

pub use error::{CliError, finish};
