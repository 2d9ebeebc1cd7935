//! `tailmesh report` and `tailmesh compare`: over finished runs, read back
//! from their folders.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use tailmesh::analysis::{
    DEFAULT_ERROR_TOLERANCE, DEFAULT_REPLICATES, DEFAULT_TOLERANCE, GateRule, GateVerdict,
};
use tailmesh::{console, experiment, output, say};

use super::CliError;

/// `tailmesh report`.
#[derive(Args)]
pub(crate) struct ReportArgs {
    /// The run folder (results/<scenario>/<run-id> or .../latest).
    run: PathBuf,
}

/// Redraws the run's report.html and prints its path.
pub(crate) fn report(args: ReportArgs) -> Result<(), CliError> {
    let path = experiment::regenerate_report(&args.run)?;
    say!("{}", path.display());
    Ok(())
}

/// `tailmesh compare`.
#[derive(Args)]
pub(crate) struct CompareArgs {
    /// The first run folder (the baseline).
    a: PathBuf,
    /// The second run folder.
    b: PathBuf,
    /// Decide whether B regressed against A: exit 3 if a p50, p99 or
    /// error share is worse beyond the tolerance with its 95 % interval
    /// excluding no change, 4 if the runs cannot tell.
    #[arg(long)]
    gate: bool,
    /// How much slower B's p50 or p99 may be, as a fraction (0.2) or a
    /// percentage (20%).
    #[arg(long, value_name = "FRACTION", requires = "gate", default_value_t = DEFAULT_TOLERANCE, value_parser = fraction)]
    tolerance: f64,
    /// How much B's error share (errors and timeouts over sent) may rise,
    /// in points: a fraction (0.005) or a percentage (0.5%).
    #[arg(long, value_name = "SHARE", requires = "gate", default_value_t = DEFAULT_ERROR_TOLERANCE, value_parser = fraction)]
    error_tolerance: f64,
    /// Also write the decision as JSON (tailmesh.compare/v1) to FILE, or
    /// to standard output with `-` (the text then goes to standard error).
    #[arg(long, value_name = "FILE|-", requires = "gate")]
    json: Option<PathBuf>,
    /// Seed of the bootstrap's random draws.
    #[arg(long, requires = "gate", default_value_t = 1)]
    seed: u64,
    /// Bootstrap replicates per metric.
    #[arg(long, requires = "gate", default_value_t = DEFAULT_REPLICATES, value_parser = clap::value_parser!(u32).range(100..=1_000_000))]
    replicates: u32,
}

/// A tolerance: a fraction ("0.2") or a percentage ("20%"), finite and not
/// negative.
fn fraction(text: &str) -> Result<f64, String> {
    let (number, scale) = match text.trim().strip_suffix('%') {
        Some(p) => (p.trim(), 100.0),
        None => (text.trim(), 1.0),
    };
    let value = number
        .parse::<f64>()
        .map_err(|e| format!("{text:?} is not a number: {e}"))?
        / scale;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{text:?} must be a finite number, 0 or more"));
    }
    Ok(value)
}

/// Prints the two runs side by side; with `--gate`, decides.
pub(crate) fn compare(args: CompareArgs) -> Result<(), CliError> {
    let run_a = experiment::read_run(&args.a)?;
    let run_b = experiment::read_run(&args.b)?;
    let label = |p: &Path| p.display().to_string();
    let (la, lb) = (label(&args.a), label(&args.b));
    let table = output::render_comparison(&run_a, &la, &run_b, &lb);
    if !args.gate {
        console::out_text(&table);
        return Ok(());
    }
    let rule = GateRule {
        tolerance: args.tolerance,
        error_tolerance: args.error_tolerance,
        replicates: args.replicates,
        seed: args.seed,
        ..GateRule::default()
    };
    let report = tailmesh::analysis::gate(&run_a, &la, &run_b, &lb, &rule);
    let text = format!("{table}{}", output::render_gate(&report));
    match args.json.as_deref() {
        Some(path) if path == Path::new("-") => {
            let json = output::comparison_json(&report)
                .context("the gate's decision could not be put as JSON")?;
            console::out_text(&json);
            console::err(format_args!("{}", text.trim_end()));
        }
        Some(path) => {
            output::write_comparison(path, &report)
                .context("the gate's JSON could not be written")?;
            console::out_text(&text);
        }
        None => console::out_text(&text),
    }
    match report.verdict {
        GateVerdict::Pass => Ok(()),
        GateVerdict::Regressed => Err(CliError::Regressed {
            metrics: output::regressed_metrics(&report),
        }),
        GateVerdict::Inconclusive => Err(CliError::CheckInconclusive {
            reasons: report.reasons,
        }),
    }
}
