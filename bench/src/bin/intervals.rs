//! Medians over benchmark rounds with bootstrap 95 % intervals, each goal
//! judged on its interval (`tailmesh_bench::rounds`), beside the CPU steal
//! and load average during the rounds: the shared last step of
//! bench/floor.sh, generator.sh, tracing.sh and sidecar.sh.
//!
//! Reads VALUES (lines `NAME<TAB>VALUE`, one per ratio and round, rounds in
//! order) and, with `--machine`, the snapshots of `/proc/stat`'s `cpu`
//! line and `/proc/loadavg` taken between the rounds; prints the table on
//! stdout.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context, Result};
use clap::Parser;
use tailmesh_bench::rounds::{self, MachineReading, NamedGoal};

/// Median [95 % interval] of each ratio over the rounds, and its verdict.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Per-round values: `NAME<TAB>VALUE` lines.
    values: PathBuf,
    /// A goal, `NAME<=1.2` or `NAME>=0.9` (repeatable).
    #[arg(long = "goal", value_name = "NAME<=X|NAME>=X")]
    goals: Vec<NamedGoal>,
    /// Snapshots of /proc/stat's cpu line and /proc/loadavg between rounds.
    #[arg(long)]
    machine: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The bootstrap's seed (the same seed, the same interval).
    #[arg(long, default_value_t = 38)]
    seed: u64,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("intervals: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
    };
    let values = rounds::parse_values(&read(&args.values)?)
        .with_context(|| format!("{}", args.values.display()))?;
    let machine = match &args.machine {
        Some(path) => Some(
            MachineReading::parse(&read(path)?).with_context(|| format!("{}", path.display()))?,
        ),
        None => None,
    };
    let report = rounds::report(values, &args.goals, machine, args.seed)?;
    print!("{report}");
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).context("encode the report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
