//! `tailmesh run`: runs a scenario, shows what was measured, then writes
//! the run folder's files.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{path::PathBuf, time::Duration};

use clap::Args;
use tailmesh::{
    analysis::Verdict,
    experiment::{self, RunCommand},
    launcher::Attach,
    output, roles, say,
};

use super::CliError;

/// `tailmesh run`.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// The scenario file.
    #[arg(default_value = "scenarios/default.toml")]
    scenario: PathBuf,
    /// Folder for results: <RESULTS>/<scenario>/<run-id>/.
    #[arg(long, default_value = "results")]
    results: PathBuf,
    /// Exit with status 3 when a check fails or a request is unaccounted
    /// for, 4 when a compounding verdict is inconclusive.
    #[arg(long)]
    check: bool,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    /// Trace nothing (overrides the scenario's [telemetry] sampling).
    #[arg(long)]
    no_traces: bool,
    /// Also forward every span over OTLP gRPC to this collector, e.g.
    /// http://127.0.0.1:4317 (overrides [telemetry] forward).
    #[arg(long, value_name = "URL")]
    otlp_forward: Option<String>,
    /// Start nothing: run against the hops and broker already running
    /// under the names `tailmesh compose` / `tailmesh k8s` gave them
    /// (the orchestrator container of a deployment runs this).
    #[arg(long)]
    attach: bool,
    /// Attached: how long to wait for each service to answer health checks.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "120s", requires = "attach")]
    attach_timeout: Duration,
    /// Attached, with [mesh] tls on: the folder of the orchestrator's
    /// ca.crt, tls.crt and tls.key (what tailmesh compose and tailmesh k8s
    /// mount).
    #[arg(long, requires = "attach", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Await the load generators of variants with `[load] generators`
    /// above 1 at this address, host:port, instead of starting them: they
    /// run elsewhere as `tailmesh generator --hub ADDR --index K --stay`
    /// (`tailmesh compose` and `tailmesh k8s` start them so). With a
    /// Control token in the environment, a generator must show it.
    #[arg(long, value_name = "HOST:PORT")]
    generators_at: Option<String>,
    /// With --generators-at: how long each variant waits for its
    /// generators to connect.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "120s", requires = "generators_at")]
    generators_timeout: Duration,
    /// Run the load in load generator processes even where a variant has
    /// one generator (`[load] generators = 1`), the form several take,
    /// instead of inside this process: to compare one generator with
    /// several like for like.
    #[arg(long, conflicts_with = "generators_at")]
    generator_processes: bool,
    /// Serve live Prometheus metrics at this address while the run lasts
    /// (`host:port`, e.g. 127.0.0.1:9464; overrides `[telemetry] metrics`).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// Runs the scenario; interrupted, or a failed check under `--check`, once
/// the results are written.
pub(crate) fn run(args: RunArgs) -> Result<(), CliError> {
    let token = roles::read_token_file()?;
    let generators_at = args.generators_at.map(|addr| experiment::GeneratorsAt {
        addr,
        token: token.clone(),
        patience: args.generators_timeout,
    });
    let attach = if args.attach {
        Some(Attach {
            token,
            ready_timeout: args.attach_timeout,
            tls_dir: args.tls_dir,
        })
    } else {
        None
    };
    let mut finished = experiment::execute(&RunCommand {
        scenario: args.scenario,
        results: args.results,
        progress: !args.quiet,
        no_traces: args.no_traces,
        otlp_forward: args.otlp_forward,
        attach,
        generators_at,
        generator_processes: args.generator_processes,
        metrics: args.metrics,
    })?;
    // What was measured is shown before any file is written: a full disk
    // loses files, never the numbers.
    if finished.histograms {
        for v in &finished.summary.variants {
            let title = format!("{}: latency from intended send time, ok requests", v.name);
            say!("{}", output::render_histogram(&title, &v.latency_histogram));
        }
    }
    say!("{}", output::render_table(&finished.summary));
    say!("{}", output::render_legend(&finished.summary));
    let files = finished.write().map_err(|source| CliError::Incomplete {
        dir: finished.dir.clone(),
        source,
    })?;
    say!("{}", output::render_files(&finished.dir, &files));
    finished.finish_metrics();
    let lost: Vec<String> = finished
        .summary
        .variants
        .iter()
        .flat_map(|v| {
            v.generators.iter().flat_map(|g| &g.each).filter_map(|g| {
                let why = g.stopped.as_ref()?;
                Some(format!(
                    "variant {}: load generator {} stopped before its part was done: {why}",
                    v.name, g.index
                ))
            })
        })
        .collect();
    if !lost.is_empty() {
        return Err(CliError::GeneratorLost { lost });
    }
    if finished.interrupted {
        return Err(CliError::Interrupted);
    }
    if args.check && !finished.passed() {
        return Err(CliError::CheckFailed {
            verdict: finished.summary.check.verdict,
            accounted: finished.summary.check.accounted,
            too_many_errors: finished.summary.check.error_failures(),
        });
    }
    if args.check && finished.summary.check.verdict == Verdict::Inconclusive {
        return Err(CliError::CheckInconclusive {
            reasons: finished.summary.inconclusive_reasons(),
        });
    }
    Ok(())
}
