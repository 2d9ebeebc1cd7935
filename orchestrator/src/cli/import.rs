//! `tailmesh import`: reads traces of a real system and prints the mesh
//! they show, with every repair the traces needed.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{fs::File, io::BufReader, path::PathBuf};

use clap::Args;
use tailmesh::say;
use tailmesh_import::{Format, ImportError, Imported, Mesh};

use super::CliError;

/// `tailmesh import`.
#[derive(Args)]
pub(crate) struct ImportArgs {
    /// The traces' format: jaeger (JSON, as Jaeger's UI downloads it and
    /// tailmesh writes it), otlp (JSON, a request per line, as the
    /// OpenTelemetry Collector's file exporter writes it), zipkin (v2 JSON)
    /// or alibaba (MSCallGraph CSV).
    #[arg(value_parser = format)]
    format: Format,
    /// The files, read as one set of traces.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

fn format(name: &str) -> Result<Format, String> {
    Format::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Format::ALL.iter().map(|(n, _)| *n).collect();
        format!("one of {}", names.join(", "))
    })
}

/// Reads every file, then tells what was repaired and the mesh.
pub(crate) fn import(args: ImportArgs) -> Result<(), CliError> {
    let mut imported = Imported::default();
    for path in &args.files {
        let name = path.display().to_string();
        let file = File::open(path).map_err(|e| {
            import_error(ImportError::Io {
                file: name.clone(),
                source: e,
            })
        })?;
        let one = tailmesh_import::read(args.format, &name, BufReader::new(file))
            .map_err(import_error)?;
        imported.extend(one);
    }
    for line in imported.repairs.lines() {
        say!("{line}");
    }
    for line in Mesh::from_traces(&imported.traces).describe() {
        say!("{line}");
    }
    Ok(())
}

/// A file that cannot be read fails the command (1); one that is not of
/// its format is bad input (2).
fn import_error(e: ImportError) -> CliError {
    match e {
        ImportError::Io { .. } => CliError::Failed(e.into()),
        other => CliError::BadInput(other.into()),
    }
}
