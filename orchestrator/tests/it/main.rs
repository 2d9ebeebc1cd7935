//! The orchestrator's integration and end-to-end tests, in one binary:
//! one link instead of one per file, and one process-wide lock
//! ([`support::serial`]) that keeps meshes from running side by side.
//!
//! - `harness`: the test runner (libtest's command line and output, skips
//!   with reasons) and the `tests!` registration macro;
//! - `support`: running the real binary with deadlines, reading results;
//! - one module per subject: `launcher`, `run`, `pull`, `fanout`,
//!   `policy`, `payload`, `traces`, `report`, `deploy`, `netfaults`,
//!   `overload` (queue disciplines), `stress` (the instrument under
//!   overload), `steps` (load steps), `attribution`, `netem` (the
//!   network-fault tests again on a netem kernel), `cli` (the command
//!   line as a new user meets it), `predict` (the prediction from a
//!   scenario alone), `probe` (`tailmesh probe` against a test gRPC
//!   service), `windows` (fault windows without root),
//!   `composition` (the whole tail composed against the measured one),
//!   `endpoints` (replicas killed on schedule, a black-holed replica under
//!   a mesh client), `connections` (a hop's callers' connections counted
//!   through a relay), `services` (a real gRPC service as a hop's work,
//!   `[hop.service]`), `import` (a run's traces imported as a scenario
//!   and run again), and `links` (every relative link and anchor in
//!   README.md and docs/ resolves).

#[macro_use]
mod harness;
mod support;

mod attribution;
mod brokers;
mod cases;
mod cli;
mod composition;
mod connections;
mod deploy;
mod endpoints;
mod fanout;
mod generators;
mod import;
mod launcher;
mod layered;
mod links;
mod metrics;
mod netem;
mod netfaults;
mod overload;
mod payload;
mod policy;
mod predict;
mod probe;
mod pull;
mod report;
mod run;
mod search;
mod services;
mod steps;
mod streams;
mod stress;
mod tls;
mod traces;
mod windows;

fn main() -> std::process::ExitCode {
    // The `[hop.service]` tests start this binary as their gRPC service.
    if let Some(code) = support::echo::serve_if_asked() {
        return code;
    }
    harness::main(&[
        harness::TESTS,
        cli::TESTS,
        launcher::TESTS,
        run::TESTS,
        pull::TESTS,
        brokers::TESTS,
        payload::TESTS,
        fanout::TESTS,
        layered::TESTS,
        import::TESTS,
        policy::TESTS,
        traces::TESTS,
        streams::TESTS,
        report::TESTS,
        deploy::TESTS,
        endpoints::TESTS,
        netfaults::TESTS,
        generators::TESTS,
        overload::TESTS,
        stress::TESTS,
        steps::TESTS,
        attribution::TESTS,
        links::TESTS,
        netem::TESTS,
        windows::TESTS,
        predict::TESTS,
        probe::TESTS,
        composition::TESTS,
        tls::TESTS,
        services::TESTS,
        connections::TESTS,
        metrics::TESTS,
        search::TESTS,
        cases::TESTS,
    ])
}
