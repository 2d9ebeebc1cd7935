//! The tailmesh command line: parses flags, sets up logging, and hands each
//! command to its module under `cli/`, a thin layer over the library.
//! Whatever keeps a command from succeeding is a [`cli::CliError`], which
//! alone decides the exit status (2 for a bad scenario or flags).

#![deny(clippy::print_stdout, clippy::print_stderr)]

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tailmesh",
    version,
    about = "A testbed for tail latency in multi-hop microservice meshes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario: launch its hops, drive the load, write the results.
    Run(cli::run::RunArgs),
    /// Write a Docker Compose file for a scenario: a container per hop
    /// replica, the broker, Jaeger, and an orchestrator container that runs
    /// the experiment against them.
    Compose(cli::deploy::ComposeArgs),
    /// Write Kubernetes manifests for a scenario: a namespace, a Deployment
    /// and Service per hop replica, the broker, Jaeger, and the
    /// orchestrator as a Job.
    K8s(cli::deploy::K8sArgs),
    /// Ask a tailmesh service whether it is SERVING (gRPC health): exit 0
    /// if so, 1 otherwise. Container health checks run it.
    #[command(hide = true)]
    Health(cli::serve::HealthArgs),
    /// Drive one running hop replica with the load generator, closed loop,
    /// and print what it measured as JSON (the generator benchmark runs it).
    #[command(hide = true)]
    Load(cli::serve::LoadArgs),
    /// Send a part of each variant's load for an orchestrator (`[load]
    /// generators`): the one that started it, or, with --stay, one that
    /// awaits it (`tailmesh run --generators-at`).
    Generator(cli::serve::GeneratorArgs),
    /// Write a fresh random Control token to a file (the token service of
    /// a Compose deployment with network faults runs this).
    #[command(hide = true)]
    Token(cli::serve::TokenArgs),
    /// Serve the pull broker (started by the launchers).
    Broker(cli::serve::BrokerArgs),
    /// Redraw a run's report.html from its summary.json and requests.csv.
    Report(cli::report::ReportArgs),
    /// Put two runs side by side; with --gate, fail when the second
    /// regressed against the first.
    Compare(cli::report::CompareArgs),
    /// Serve a userspace delay line on NFQUEUE (started by the netns
    /// launcher inside a replica's namespace on kernels without netem).
    #[command(hide = true)]
    DelayLine(cli::serve::DelayLineArgs),
    /// Remove the namespaces, interfaces and rules of netns runs whose
    /// orchestrator is gone (after a crash or SIGKILL).
    Clean,
    /// Check scenario files without running them.
    Validate(cli::validate::ValidateArgs),
    /// Predict each variant's end-to-end latency from the scenario alone:
    /// its hops' declared work, faults and client policies composed, plus
    /// an overhead per hop reached.
    Predict(cli::predict::PredictArgs),
    /// Find the highest open-loop rate at which each variant meets an
    /// objective (`--slo 'p99<50ms,errors<0.1%'`), by short runs.
    Search(cli::search::SearchArgs),
    /// Make labelled fault cases for root-cause analysis (short runs with
    /// one drawn fault each, traces and metrics in the formats RCA tools
    /// read); `cases score DIR` scores rankings of suspects against them.
    Cases(cli::cases::CasesArgs),
    /// Read traces of a real system (Jaeger, OTLP or Zipkin JSON, Alibaba's
    /// call-graph CSV) and print the mesh they show: services, who calls
    /// whom, how often and in what order, each service's own time; with
    /// -o, write it as a scenario to run.
    Import(cli::import::ImportArgs),
    /// Call a gRPC service once the way a hop whose work it is would, and
    /// print its reply as JSON: exit 0 OK, 1 it answered non-OK, 2 bad
    /// input, unreachable or unknown method.
    Probe(cli::probe::ProbeArgs),
    /// Serve one hop replica (started by the launchers, or by a container
    /// of a deployment with --scenario).
    Hop(cli::serve::HopArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::finish(Err(cli::CliError::Flags(e))),
    };
    // Service roles set up their own tracing (with span export) inside
    // their runtime.
    if !matches!(cli.command, Command::Hop(_) | Command::Broker(_)) {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    // lapin logs a RabbitMQ broker closing at the end of a
                    // variant as an error; the run reports what matters.
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lapin=off")),
            )
            .with_writer(std::io::stderr)
            .init();
    }
    cli::finish(match cli.command {
        Command::Run(args) => cli::run::run(args),
        Command::Compose(args) => cli::deploy::compose(args),
        Command::K8s(args) => cli::deploy::k8s(args),
        Command::Health(args) => cli::serve::health(args),
        Command::Token(args) => cli::serve::token(args),
        Command::Load(args) => cli::serve::load(args),
        Command::Generator(args) => cli::serve::generator(args),
        Command::Broker(args) => cli::serve::broker(args),
        Command::Report(args) => cli::report::report(args),
        Command::Compare(args) => cli::report::compare(args),
        Command::DelayLine(args) => cli::serve::delay_line(args),
        Command::Clean => cli::clean::clean(),
        Command::Validate(args) => cli::validate::validate(args),
        Command::Predict(args) => cli::predict::predict(args),
        Command::Search(args) => cli::search::search(args),
        Command::Cases(args) => cli::cases::cases(args),
        Command::Probe(args) => cli::probe::probe(args),
        Command::Import(args) => cli::import::import(args),
        Command::Hop(args) => cli::serve::hop(args),
    })
}
