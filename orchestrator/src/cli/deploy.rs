//! `tailmesh compose` and `tailmesh k8s`: a deployment file from a
//! scenario, on standard output or written where asked. A scenario that
//! cannot be deployed is bad input, with every problem listed; manifests
//! that carry private keys are never written to a terminal.

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
    /// Write to this file instead of standard output.
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
    let report = deploy::tls::compose_folder(&dir, &deploy::project_name(scenario), identities)
        .map_err(|e| undeployable(path, e))?;
    tell_folder(&dir, &report);
    Ok(compose::TlsFolder {
        path: format!("./{name}"),
        ca_sha256: report.ca_sha256,
    })
}

/// Names a CA folder on standard error, and what was kept and made in it.
fn tell_folder(dir: &Path, report: &deploy::tls::FolderReport) {
    let verb = if report.ca_kept && report.issued.is_empty() {
        "reusing"
    } else if report.ca_kept {
        "updated"
    } else {
        "wrote"
    };
    tailmesh::tell!("{verb} {} (TLS: {report})", dir.display());
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
    #[arg(long, conflicts_with = "output")]
    out_dir: Option<PathBuf>,
    /// With TLS: keep the CA in this folder (its key, mode 0600, is never
    /// in the manifests) and sign with it on every later generation,
    /// keeping unchanged services' certificates, so applying again
    /// replaces no pod. Made on first use.
    #[arg(long)]
    ca_dir: Option<PathBuf>,
}

/// Writes the Kubernetes manifests: one stream, or one file per object
/// kind (each path printed). The TLS Secret's private keys are written to
/// a file of mode 0600 or a pipe, never to a terminal.
pub(crate) fn k8s(args: K8sArgs) -> Result<(), CliError> {
    if let (Some(ca_dir), Some(out_dir)) = (&args.ca_dir, &args.out_dir)
        && same_folder(ca_dir, out_dir)
    {
        return Err(CliError::BadInput(anyhow::anyhow!(
            "--ca-dir and --out-dir are both {}: the CA's private key does not belong beside \
             the manifests; give the CA a folder of its own",
            ca_dir.display()
        )));
    }
    let to_terminal = args.out_dir.is_none()
        && args.deploy.output.is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let options = k8s::Options {
        image: args.deploy.image,
        net_admin: !args.deploy.no_net_admin,
        ca_dir: args.ca_dir.clone(),
    };
    let (scenario, text) = scenario::load(&args.scenario)?;
    let manifests = k8s::generate(&scenario, &text, &options)
        .map_err(|reason| undeployable(&args.scenario, reason))?;
    match (&args.ca_dir, &manifests.ca_folder) {
        (Some(dir), Some(report)) => tell_folder(dir, report),
        (Some(dir), None) => tailmesh::tell!(
            "no variant uses TLS: {} is not used (--ca-dir)",
            dir.display()
        ),
        (None, _) => {}
    }
    let keys = manifests.has_keys();
    if keys && to_terminal {
        return Err(CliError::BadInput(anyhow::anyhow!(
            "the manifests carry the TLS Secret's private keys ({}), which are not written to \
             a terminal: give -o FILE or --out-dir DIR, or pipe them (tailmesh k8s ... | \
             kubectl apply -f -)",
            k8s::TLS_FILE
        )));
    }
    let Some(dir) = args.out_dir else {
        let stream: String = manifests.files.into_iter().map(|(_, body)| body).collect();
        return match args.deploy.output.as_deref() {
            Some(out) if keys => tailmesh::deploy::write_private(out, &stream)
                .map_err(|e| CliError::Failed(anyhow::anyhow!(e))),
            output => write_out(output, &stream),
        };
    };
    k8s::write_dir(&dir, &manifests.files).map_err(|e| anyhow::anyhow!(e))?;
    for (name, _) in &manifests.files {
        say!("{}", dir.join(name).display());
    }
    Ok(())
}

/// Whether `a` and `b` name one folder (as given, or once both exist).
fn same_folder(a: &Path, b: &Path) -> bool {
    a == b
        || a.canonicalize()
            .is_ok_and(|a| b.canonicalize().is_ok_and(|b| a == b))
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
