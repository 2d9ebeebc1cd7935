//! Scenario files: parse the TOML, validate everything (every problem with
//! its line and column), then build the checked [`Scenario`].
//!
//! - `model`: the checked types the rest of the orchestrator uses.

mod model;

pub use model::*;
