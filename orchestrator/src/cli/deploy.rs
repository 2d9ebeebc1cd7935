//! `tailmesh compose` and `tailmesh k8s`: a deployment file from a
//! scenario, on standard output or written where asked. A scenario that
//! cannot be deployed is bad input, with every problem listed.

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{
    error::Error,
    path::{Path, PathBuf},
};

use anyhow::Context;
use clap::Args;
use tailmesh::{
    deploy::{self, compose, k8s},
    say, scenario,
};

use super::CliError;

/// What every deployment generator takes.
#[derive(Args)]
pub(crate) struct DeployArgs {
    /// The tailmesh image every container runs.
    #[arg(long, default_value = deploy::DEFAULT_IMAGE)]
    image: String,
    /// Generate for a runtime that does not grant CAP_NET_ADMIN (scenarios
    /// with network faults are then refused).
    #[arg(long)]
    no_net_admin: bool,
    /// Write to this file instead of standard output (compose).
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// `tailmesh compose`.
#[derive(Args)]
pub(crate) struct ComposeArgs {
    /// The scenario file.
    #[arg(default_value = "scenarios/default.toml")]
    scenario: PathBuf,
    #[command(flatten)]
    deploy: DeployArgs,
    /// The build context of the image (the repository), relative to the
    /// Compose file. Default: "." when the file is written here, else
    /// this directory's absolute path.
    #[arg(long)]
    context: Option<String>,
    /// Where the results go on the host, relative to the Compose file.
    #[arg(long, default_value = "./results")]
    results: String,
}

/// Writes the Compose file.
pub(crate) fn compose(args: ComposeArgs) -> Result<(), CliError> {
    let context = match args.context {
        Some(context) => context,
        None => default_context(args.deploy.output.as_deref()).map_err(CliError::Context)?,
    };
    let mut options = compose::Options {
        image: args.deploy.image,
        net_admin: !args.deploy.no_net_admin,
        context,
        results: args.results,
        tls: None,
    };
    let (scenario, text) = scenario::load(&args.scenario)?;
    // Checked before any certificate is written.
    let services = deploy::services(&scenario, compose::runtime(&options))
        .map_err(|reason| undeployable(&args.scenario, reason))?;
    let identities = deploy::tls::identities(&services, |name| vec![name.to_owned()]);
    if !identities.is_empty() {
        options.tls = Some(tls_folder(
            &args.scenario,
            &scenario,
            args.deploy.output.as_deref(),
            &identities,
        )?);
    }
    let generated = compose::generate(&scenario, &text, &options)
        .map_err(|reason| undeployable(&args.scenario, reason))?;
    write_out(args.deploy.output.as_deref(), &generated)
}

/// The TLS folder of a Compose file written to `output`: made beside it,
/// or reused when it holds this deployment's certificates already (it is
/// named on standard error either way).
fn tls_folder(
    path: &Path,
    scenario: &scenario::Scenario,
    output: Option<&Path>,
    identities: &[deploy::tls::Identity],
) -> Result<compose::TlsFolder, CliError> {
    let name = compose::tls_folder_name(scenario);
    let Some(output) = output else {
        return Err(undeployable(
            path,
            format!(
                "[mesh] tls is on: the certificates are written to a folder beside the Compose \
                 file ({name}/), so tailmesh compose needs the file's path: -o FILE"
            ),
        ));
    };
    let dir = output.parent().unwrap_or(Path::new("")).join(&name);
    let (ca_sha256, reused) =
        deploy::tls::compose_folder(&dir, &deploy::project_name(scenario), identities)
            .map_err(|e| undeployable(path, e))?;
    tailmesh::tell!(
        "{} {} (TLS: CA sha256 {ca_sha256})",
        if reused { "reusing" } else { "wrote" },
        dir.display()
    );
    Ok(compose::TlsFolder {
        path: format!("./{name}"),
        ca_sha256,
    })
}

/// Why `tailmesh compose` cannot name the build context itself.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ContextError {
    /// The current directory is unknown.
    #[error("the current directory: {0}")]
    Cwd(#[source] std::io::Error),
    /// The current directory cannot be written into a Compose file.
    #[error("{} is not UTF-8: give --context", .0.display())]
    NotUtf8(PathBuf),
}

/// The build context for a Compose file written to `output`: "." when it
/// lands in the current directory (the repository root, as the committed
/// file), else the current directory's absolute path, so the file builds
/// from wherever it is.
fn default_context(output: Option<&Path>) -> Result<String, ContextError> {
    let cwd = std::env::current_dir().map_err(ContextError::Cwd)?;
    let here = match output.map(|o| o.parent().unwrap_or(Path::new(""))) {
        None => true,
        Some(dir) if dir.as_os_str().is_empty() => true,
        Some(dir) => dir
            .canonicalize()
            .is_ok_and(|d| cwd.canonicalize().is_ok_and(|c| c == d)),
    };
    if here {
        Ok(".".to_owned())
    } else {
        match cwd.to_str() {
            Some(cwd) => Ok(cwd.to_owned()),
            None => Err(ContextError::NotUtf8(cwd)),
        }
    }
}

/// `tailmesh k8s`.
#[derive(Args)]
pub(crate) struct K8sArgs {
    /// The scenario file.
    #[arg(default_value = "scenarios/default.toml")]
    scenario: PathBuf,
    #[command(flatten)]
    deploy: DeployArgs,
    /// Write one file per object kind into this folder instead of one
    /// stream on standard output.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// Writes the Kubernetes manifests: one stream, or one file per object
/// kind (each path printed).
pub(crate) fn k8s(args: K8sArgs) -> Result<(), CliError> {
    let options = k8s::Options {
        image: args.deploy.image,
        net_admin: !args.deploy.no_net_admin,
    };
    let (scenario, text) = scenario::load(&args.scenario)?;
    let files = k8s::generate(&scenario, &text, &options)
        .map_err(|reason| undeployable(&args.scenario, reason))?;
    let Some(dir) = args.out_dir else {
        let stream: String = files.into_iter().map(|(_, body)| body).collect();
        return write_out(args.deploy.output.as_deref(), &stream);
    };
    k8s::write_dir(&dir, &files).map_err(|e| anyhow::anyhow!(e))?;
    for (name, _) in &files {
        say!("{}", dir.join(name).display());
    }
    Ok(())
}

fn undeployable(path: &Path, reason: impl Into<Box<dyn Error + Send + Sync>>) -> CliError {
    CliError::Undeployable {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Writes `text` to `output`, or to standard output.
fn write_out(output: Option<&Path>, text: &str) -> Result<(), CliError> {
    match output {
        None => tailmesh::console::out_text(text),
        Some(out) => {
            std::fs::write(out, text).with_context(|| format!("write {}", out.display()))?;
        }
    }
    Ok(())
}
