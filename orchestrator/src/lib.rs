//! tailmesh's orchestrator: scenario model, launchers, load generator,
//! analysis and outputs. The binary in `main.rs` is a thin shell over this.
//!
//! - `scenario`: parse, validate and model scenario files.
//! - `record`: what was measured for each request.
//! - `analysis`: pure statistics over the records: percentiles, accounting,
//!   per-hop stats, the compounding check, the run summary.
//! - `output`: result writers (`.hgrm`, requests.csv, summary.json) and the
//!   terminal table.

pub mod analysis;
pub mod output;
pub mod record;
pub mod scenario;
