//! How a command ends other than in success, and the one place that turns
//! that into what the user reads and the process's exit status: 0 done,
//! 1 the command could not be done, 2 a bad scenario or bad flags, 3 a
//! check failed (or `compare --gate` found a regression, or a search's
//! first step failed its objective), 4 a check was
//! inconclusive, 130 interrupted.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{error::Error, path::PathBuf, process::ExitCode};

use tailmesh::{
    analysis::Verdict, error_chain, experiment::ExperimentError, roles::RoleError,
    scenario::ScenarioErrors, tell,
};

use super::{deploy::ContextError, serve::HealthError};

/// Why a command did not end in success.
#[derive(Debug)]
pub(crate) enum CliError {
    /// The command line is not understood, or asks for `--help` or
    /// `--version` (which clap reports through this too).
    Flags(clap::Error),
    /// A scenario file is not valid: every problem, one per line.
    Scenario(ScenarioErrors),
    /// `tailmesh validate` found invalid files; their problems were told
    /// as each file was read.
    Invalid,
    /// A valid scenario that cannot be deployed as asked.
    Undeployable {
        /// The scenario file.
        path: PathBuf,
        /// Every reason, as the generator gave them.
        reason: Box<dyn Error + Send + Sync>,
    },
    /// `tailmesh health`: a bad address, or no SERVING answer.
    Health(HealthError),
    /// `tailmesh probe`: no OK answer (1 when the service answered, 2 when
    /// no call could be made).
    Probe(super::probe::ProbeError),
    /// `tailmesh compose` cannot name a build context.
    Context(ContextError),
    /// A run was measured and its numbers shown, but not all of its files
    /// could be written.
    Incomplete {
        /// The run folder.
        dir: PathBuf,
        /// The ExperimentError it failed with.
        source: ExperimentError,
    },
    /// Ctrl-C cut the run short (its results cover what ran).
    Interrupted,
    /// A load generator process stopped before its part of the load was
    /// done, which stopped the run (its results cover what was sent).
    GeneratorLost {
        /// One line per generator lost: its variant, index and why.
        lost: Vec<String>,
    },
    /// `tailmesh run --check`: a check failed, or a request was not
    /// accounted for.
    CheckFailed {
        /// The run's overall verdict.
        verdict: Verdict,
        /// Whether every request was accounted for.
        accounted: bool,
        /// One line per variant that failed more of its requests than
        /// `[check] max_error_rate` allows: its share and the limit.
        too_many_errors: Vec<String>,
    },
    /// `tailmesh search`: a variant's first step already failed the
    /// objective.
    SearchFailed {
        /// One line per such variant.
        lines: Vec<String>,
    },
    /// `tailmesh compare --gate`: run B regressed against run A.
    Regressed {
        /// Each regressed metric as `variant metric` ("base p99").
        metrics: Vec<String>,
    },
    /// `tailmesh run --check`: no check failed, but a compounding verdict
    /// was inconclusive (too few requests, or the instrument: the load
    /// generator, unexplained slowness, a busy machine). `tailmesh compare
    /// --gate`: nothing regressed, but the runs cannot tell (different
    /// scenarios or seeds, an interrupted run, too few ok requests).
    CheckInconclusive {
        /// One line per inconclusive variant: its name and the reason.
        reasons: Vec<String>,
    },
    /// Input that only the run could find wrong (exit status 2): a hop's
    /// service that exits at once, never gets ready, or refuses the
    /// method or request.
    BadInput(anyhow::Error),
    /// Anything else that kept the command from being done.
    Failed(anyhow::Error),
}

impl CliError {
    /// The exit status: the only place that decides one.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Flags(e) if !e.use_stderr() => 0,
            CliError::Flags(_)
            | CliError::Scenario(_)
            | CliError::Invalid
            | CliError::Undeployable { .. }
            | CliError::BadInput(_)
            | CliError::Health(HealthError::Addr(_)) => 2,
            CliError::Probe(e) => e.exit_code(),
            CliError::CheckFailed { .. }
            | CliError::Regressed { .. }
            | CliError::SearchFailed { .. } => 3,
            CliError::CheckInconclusive { .. } => 4,
            CliError::Interrupted => 130,
            CliError::Health(_)
            | CliError::Context(_)
            | CliError::Incomplete { .. }
            | CliError::GeneratorLost { .. }
            | CliError::Failed(_) => 1,
        }
    }

    /// Tells the user, on standard error (`--help` and `--version` go to
    /// standard output).
    pub(crate) fn report(&self) {
        match self {
            CliError::Flags(e) => {
                let _ = e.print();
            }
            CliError::Scenario(errors) => tell!("{errors}"),
            CliError::Invalid => {}
            CliError::Undeployable { path, reason } => {
                tell!("{}: {}", path.display(), error_chain(reason.as_ref()));
            }
            CliError::Health(e) => tell!("tailmesh health: {}", error_chain(e)),
            CliError::Context(e) => tell!("tailmesh compose: {}", error_chain(e)),
            CliError::Probe(e) => tell!("tailmesh probe: {}", error_chain(e)),
            CliError::Incomplete { dir, source } => tell!(
                "tailmesh: {}\ntailmesh: the results above were measured, but {} is incomplete",
                error_chain(source),
                dir.display()
            ),
            CliError::Interrupted => {
                tell!("tailmesh: interrupted; the results above cover what ran");
            }
            CliError::GeneratorLost { lost } => {
                for line in lost {
                    tell!("tailmesh: {line}");
                }
                tell!(
                    "tailmesh: the run stopped with its load generator; the results above cover \
                     what was sent until then"
                );
            }
            CliError::CheckFailed {
                verdict,
                accounted,
                too_many_errors,
            } => {
                tell!(
                    "tailmesh: check failed (verdict {}, every request accounted for: {accounted})",
                    verdict.as_str()
                );
                for line in too_many_errors {
                    tell!("tailmesh: {line}");
                }
            }
            CliError::SearchFailed { lines } => {
                for line in lines {
                    tell!("tailmesh: {line}");
                }
            }
            CliError::Regressed { metrics } => {
                tell!("tailmesh: regressed: {}", metrics.join(", "));
            }
            CliError::CheckInconclusive { reasons } => {
                tell!("tailmesh: check inconclusive");
                for line in reasons {
                    tell!("tailmesh: {line}");
                }
            }
            CliError::Failed(e) | CliError::BadInput(e) => {
                tell!("tailmesh: {}", error_chain(e.as_ref()))
            }
        }
    }
}

/// Tells the user how `result` went and returns the exit status.
pub(crate) fn finish(result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            e.report();
            ExitCode::from(e.exit_code())
        }
    }
}

impl From<ExperimentError> for CliError {
    fn from(e: ExperimentError) -> Self {
        match e {
            ExperimentError::Scenario(errors) => CliError::Scenario(errors),
            ExperimentError::Run(e) if e.is_bad_input() => {
                CliError::BadInput(ExperimentError::Run(e).into())
            }
            e @ ExperimentError::GeneratorLinks { .. } => CliError::BadInput(e.into()),
            other => CliError::Failed(other.into()),
        }
    }
}

impl From<ScenarioErrors> for CliError {
    fn from(errors: ScenarioErrors) -> Self {
        CliError::Scenario(errors)
    }
}

impl From<RoleError> for CliError {
    /// A service role's errors, a deployed hop's bad scenario included
    /// (told after "tailmesh: ", exit status 1: the container failed).
    fn from(e: RoleError) -> Self {
        CliError::Failed(e.into())
    }
}

impl From<anyhow::Error> for CliError {
    fn from(e: anyhow::Error) -> Self {
        CliError::Failed(e)
    }
}
