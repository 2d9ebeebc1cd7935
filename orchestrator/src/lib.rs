//! tailmesh's orchestrator: scenario model, launchers, load generator,
//! analysis and outputs. The binary in `main.rs` is a thin shell over this.
//!
//! - `scenario`: parse, validate and model scenario files.
//! - `record`: what was measured for each request.
//! - `roles`: `tailmesh hop` and the other service roles of the one binary.
//! - `run`: launch each variant, drive its load, collect what it measured.
//! - `launcher`: start, watch and stop the hop and broker processes.
//! - `loadgen`: open- and closed-loop load, measured from intended send times.

pub mod launcher;
pub mod loadgen;
pub mod record;
pub mod roles;
pub mod run;
pub mod scenario;
