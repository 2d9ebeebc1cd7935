//! `tailmesh report` and `tailmesh compare`: over finished runs, read back
//! from their folders.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};

use clap::Args;
use tailmesh::{experiment, say};

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
}

/// Prints the two runs side by side.
pub(crate) fn compare(args: CompareArgs) -> Result<(), CliError> {
    let run_a = experiment::read_run(&args.a)?;
    let run_b = experiment::read_run(&args.b)?;
    let label = |p: &Path| p.display().to_string();
    tailmesh::console::out_text(&tailmesh::output::render_comparison(
        &run_a,
        &label(&args.a),
        &run_b,
        &label(&args.b),
    ));
    Ok(())
}
