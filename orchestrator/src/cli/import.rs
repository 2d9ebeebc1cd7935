//! `tailmesh import`: reads traces of a real system and prints the mesh
//! they show, with every repair the traces needed; with `-o`, writes it
//! as a scenario.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{fs::File, io::BufReader, path::PathBuf};

use anyhow::Context as _;
use clap::Args;
use tailmesh::say;
use tailmesh_import::{Format, ImportError, Imported, Mesh, scenario};

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
    /// Also write the mesh as a scenario file here (where the scenario
    /// format can say what the traces show; otherwise every reason it
    /// cannot, exit status 2).
    #[arg(short = 'o', long = "output", value_name = "SCENARIO")]
    output: Option<PathBuf>,
    /// The written scenario's name (a DNS label; default: the output
    /// file's name, made one).
    #[arg(long, requires = "output")]
    name: Option<String>,
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
    let mesh = Mesh::from_traces(&imported.traces);
    for line in mesh.describe() {
        say!("{line}");
    }
    let Some(output) = &args.output else {
        return Ok(());
    };
    let name = match &args.name {
        Some(name) if scenario::dns_label(name, 63) == *name => name.clone(),
        Some(name) => {
            return Err(CliError::BadInput(anyhow::anyhow!(
                "--name {name:?} is not a DNS label (1 to 63 of a-z, 0-9 and '-', no '-' at either end)"
            )));
        }
        None => label_of(output),
    };
    let sources: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let text = scenario::scenario(
        &mesh,
        &scenario::Options {
            name: &name,
            source: &sources.join(", "),
        },
    )
    .map_err(|e| CliError::BadInput(e.into()))?;
    std::fs::write(output, &text)
        .with_context(|| format!("write {}", output.display()))
        .map_err(CliError::Failed)?;
    say!(
        "wrote {} ({} hops); run it with: tailmesh run {}",
        output.display(),
        text.matches("[[hop]]").count(),
        output.display()
    );
    Ok(())
}

/// A DNS label from `path`'s file name (`Shop Traces.toml` -> `shop-traces`).
fn label_of(path: &std::path::Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match scenario::dns_label(&stem, 63) {
        label if label.is_empty() => "imported".to_string(),
        label => label,
    }
}

/// A file that cannot be read fails the command (1); one that is not of
/// its format is bad input (2).
fn import_error(e: ImportError) -> CliError {
    match e {
        ImportError::Io { .. } => CliError::Failed(e.into()),
        other => CliError::BadInput(other.into()),
    }
}
