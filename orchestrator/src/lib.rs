//! tailmesh's orchestrator: scenario model, launchers, load generator,
//! analysis and outputs. The binary in `main.rs` is a thin shell over this.
//!
//! - `scenario`: parse, validate and model scenario files.
//! - `record`: what was measured for each request.

pub mod record;
pub mod scenario;
