//! `tailmesh validate`: checks scenario files without running them.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;

use clap::Args;
use tailmesh::{say, scenario, tell};

use super::CliError;

/// `tailmesh validate`.
#[derive(Args)]
pub(crate) struct ValidateArgs {
    /// The scenario files.
    #[arg(required = true)]
    scenarios: Vec<PathBuf>,
}

/// Reads and checks every file, saying "ok" or telling its problems as it
/// goes; invalid if any file is.
pub(crate) fn validate(args: ValidateArgs) -> Result<(), CliError> {
    let mut invalid = false;
    for path in &args.scenarios {
        match scenario::load(path) {
            Ok((s, _)) => say!("{}: ok ({} variant(s))", path.display(), s.variants.len()),
            Err(errors) => {
                invalid = true;
                tell!("{errors}");
            }
        }
    }
    if invalid {
        Err(CliError::Invalid)
    } else {
        Ok(())
    }
}
