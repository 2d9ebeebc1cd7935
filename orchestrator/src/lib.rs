//! tailmesh's orchestrator: scenario model, launchers, load generator,
//! analysis and outputs. The binary in `main.rs` is a thin shell over this.
//!
//! - `console`: lines for people on stdout and stderr that survive a
//!   closed pipe.
//! - `error_chain`: an error told with its causes.
//! - `scenario`: parse, validate and model scenario files.
//! - `record`: where each measured request goes as it completes (the
//!   records themselves are `tailmesh-analysis`'s, re-exported here).
//! - `wire`: the mesh's protobuf answers (reply paths, endpoint events,
//!   broker statistics) turned into the analysis's plain data, once.
//! - `plan`: what a variant becomes: every process, its role, name,
//!   configuration and environment, and the order they start in.
//! - `roles`: `tailmesh hop` and the other service roles of the one binary.
//! - `launcher`: start, watch and stop the hop and broker processes (or
//!   attach to deployed ones).
//! - `deploy`: Docker Compose files and Kubernetes manifests from a scenario.
//! - `loadgen`: open- and closed-loop load, measured from intended send times.
//! - `run`: launch each variant, drive its load, collect what it measured.
//! - `experiment`: the whole of `tailmesh run`, from file to results.
//! - `analysis`: the `tailmesh-analysis` crate, re-exported: one request at
//!   a time to each variant's finished report, percentiles, intervals over
//!   time, attribution, the verdict, and the whole-run summary
//!   (summary.json's types).
//! - `traces`: the embedded OTLP receiver, the load generator's spans,
//!   `traces.jaeger.json` and the per-hop breakdown from traces.
//! - `output`: the result files (`summary.json`, `*.hgrm`, `requests.csv`,
//!   the traces, `report.html`), listed once, and the terminal table.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub use tailmesh_analysis as analysis;
pub mod cases;
pub mod console;
pub mod deploy;
mod error_chain;
pub mod experiment;
pub mod launcher;
pub mod loadgen;
mod metrics;
pub mod output;
mod plan;
mod record;
pub mod roles;
mod run;
pub mod scenario;
pub mod search;
pub mod traces;
mod wire;

pub use error_chain::error_chain;
