//! The tailmesh command line: parses flags, sets up logging, calls the
//! library, and maps errors to exit codes (2 for a bad scenario or flags).

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};
use tailmesh::{
    experiment::{self, ExperimentError, RunCommand},
    roles, say, scenario, tell,
};
use tailmesh_services::broker::BrokerConfig;

#[derive(Parser)]
#[command(
    name = "tailmesh",
    version,
    about = "A testbed for tail latency in multi-hop microservice meshes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario: launch its hops, drive the load, write the results.
    Run {
        /// The scenario file.
        #[arg(default_value = "scenarios/default.toml")]
        scenario: PathBuf,
        /// Folder for results: <RESULTS>/<scenario>/<run-id>/.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// Exit with status 3 when a check fails or a request is unaccounted for.
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
        attach_timeout: std::time::Duration,
    },
    /// Write a Docker Compose file for a scenario: a container per hop
    /// replica, the broker, Jaeger, and an orchestrator container that runs
    /// the experiment against them.
    Compose {
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
    },
    /// Write Kubernetes manifests for a scenario: a namespace, a Deployment
    /// and Service per hop replica, the broker, Jaeger, and the
    /// orchestrator as a Job.
    K8s {
        /// The scenario file.
        #[arg(default_value = "scenarios/default.toml")]
        scenario: PathBuf,
        #[command(flatten)]
        deploy: DeployArgs,
        /// Write one file per object kind into this folder instead of one
        /// stream on standard output.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Ask a tailmesh service whether it is SERVING (gRPC health): exit 0
    /// if so, 1 otherwise. Container health checks run it.
    #[command(hide = true)]
    Health {
        /// host:port.
        addr: String,
        /// Bound on the connection and the call.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
        timeout: std::time::Duration,
    },
    /// Write a fresh random Control token to a file (the token service of
    /// a Compose deployment with network faults runs this).
    #[command(hide = true)]
    Token {
        /// The file to write (mode 0600); kept if it already holds a token.
        out: PathBuf,
    },
    /// Serve the pull broker (started by the launchers).
    Broker {
        /// Topics to serve (the names of the hops reached by pull).
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        /// Most tasks queued per topic; more are refused with RESOURCE_EXHAUSTED.
        #[arg(long, default_value_t = 10_000)]
        queue_capacity: usize,
        /// Deliveries a task may have before losing its workers fails it.
        #[arg(long, default_value_t = 3)]
        max_deliveries: u32,
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Redraw a run's report.html from its summary.json and requests.csv.
    Report {
        /// The run folder (results/<scenario>/<run-id> or .../latest).
        run: PathBuf,
    },
    /// Put two runs side by side.
    Compare {
        /// The first run folder (the baseline).
        a: PathBuf,
        /// The second run folder.
        b: PathBuf,
    },
    /// Serve a userspace delay line on NFQUEUE (started by the netns
    /// launcher inside a replica's namespace on kernels without netem).
    #[command(hide = true)]
    DelayLine {
        /// The NFQUEUE number.
        #[arg(long)]
        queue: u16,
        /// Hold every packet this long ("10ms").
        #[arg(long, value_parser = humantime::parse_duration)]
        delay: std::time::Duration,
        /// Plus or minus up to this, uniformly (at most the delay).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0us")]
        jitter: std::time::Duration,
        /// Seed of the jitter draws.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Remove the namespaces, interfaces and rules of netns runs whose
    /// orchestrator is gone (after a crash or SIGKILL).
    Clean,
    /// Check scenario files without running them.
    Validate {
        /// The scenario files.
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
    },
    /// Serve one hop replica (started by the launchers, or by a container
    /// of a deployment with --scenario).
    Hop {
        /// The hop's JSON config file (local and netns launchers).
        #[arg(
            long,
            required_unless_present = "scenario",
            conflicts_with = "scenario"
        )]
        config: Option<PathBuf>,
        /// Deployed: the scenario to derive this replica's configuration from.
        #[arg(long, requires = "hop")]
        scenario: Option<PathBuf>,
        /// Deployed: the variant (when the scenario has several).
        #[arg(long, requires = "scenario")]
        variant: Option<String>,
        /// Deployed: the hop this replica belongs to.
        #[arg(long, requires = "scenario")]
        hop: Option<String>,
        /// Deployed: the replica index.
        #[arg(long, requires = "scenario", default_value_t = 0)]
        replica: u32,
        #[command(flatten)]
        serve: ServeArgs,
    },
}

#[derive(Args)]
struct DeployArgs {
    /// The tailmesh image every container runs.
    #[arg(long, default_value = tailmesh::deploy::DEFAULT_IMAGE)]
    image: String,
    /// Generate for a runtime that does not grant CAP_NET_ADMIN (scenarios
    /// with network faults are then refused).
    #[arg(long)]
    no_net_admin: bool,
    /// Write to this file instead of standard output (compose).
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write the bound address to this file once listening.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// Exit when standard input closes (set by the launchers).
    #[arg(long)]
    supervised: bool,
    /// Runtime threads (1: a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

impl ServeArgs {
    fn options(&self) -> roles::ServeOptions {
        roles::ServeOptions {
            listen: self.listen,
            addr_file: self.addr_file.clone(),
            supervised: self.supervised,
            threads: self.threads,
        }
    }
}

/// A bad scenario or bad flags.
const EXIT_BAD_INPUT: u8 = 2;
/// A check failed.
const EXIT_CHECK_FAILED: u8 = 3;
/// Ctrl-C.
const EXIT_INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_BAD_INPUT)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Service roles set up their own tracing (with span export) inside
    // their runtime.
    if !matches!(cli.command, Command::Hop { .. } | Command::Broker { .. }) {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match &cli.command {
        Command::Run {
            scenario,
            results,
            check,
            quiet,
            no_traces,
            otlp_forward,
            attach,
            attach_timeout,
        } => {
            let attach = match attach.then(tailmesh::roles::read_token_file).transpose() {
                Ok(token) => token.map(|token| tailmesh::run::Attach {
                    token,
                    ready_timeout: *attach_timeout,
                }),
                Err(e) => {
                    tell!("tailmesh: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            return run(
                &RunCommand {
                    scenario: scenario.clone(),
                    results: results.clone(),
                    progress: !quiet,
                    no_traces: *no_traces,
                    otlp_forward: otlp_forward.clone(),
                    attach,
                },
                *check,
            );
        }
        Command::Compose {
            scenario,
            deploy,
            context,
            results,
        } => {
            let context = match context {
                Some(context) => context.clone(),
                None => match default_context(deploy.output.as_deref()) {
                    Ok(context) => context,
                    Err(e) => {
                        tell!("tailmesh compose: {e}");
                        return ExitCode::FAILURE;
                    }
                },
            };
            let options = tailmesh::deploy::compose::Options {
                image: deploy.image.clone(),
                net_admin: !deploy.no_net_admin,
                context,
                results: results.clone(),
            };
            return generate(scenario, deploy.output.as_deref(), |s, text| {
                tailmesh::deploy::compose::generate(s, text, &options)
            });
        }
        Command::K8s {
            scenario,
            deploy,
            out_dir,
        } => {
            let options = tailmesh::deploy::k8s::Options {
                image: deploy.image.clone(),
                net_admin: !deploy.no_net_admin,
            };
            return generate_k8s(
                scenario,
                deploy.output.as_deref(),
                out_dir.as_deref(),
                &options,
            );
        }
        Command::Health { addr, timeout } => {
            return health(addr, *timeout);
        }
        Command::Token { out } => tailmesh::deploy::write_token(out),
        Command::Validate { scenarios } => return validate(scenarios),
        Command::Report { run } => experiment::regenerate_report(run)
            .map(|path| say!("{}", path.display()))
            .map_err(|e| anyhow::anyhow!("{e}")),
        Command::Compare { a, b } => compare(a, b),
        Command::DelayLine {
            queue,
            delay,
            jitter,
            seed,
        } => tailmesh::delayline::run(*queue, *delay, *jitter, *seed)
            .map_err(|e| anyhow::anyhow!("delay line on queue {queue}: {e}")),
        Command::Clean => {
            for line in tailmesh::launcher::netns::clean() {
                say!("removed {line}");
            }
            Ok(())
        }
        Command::Hop {
            config: Some(config),
            serve,
            ..
        } => roles::serve_hop(config, &serve.options()).map_err(|e| anyhow::anyhow!("{e}")),
        Command::Hop {
            config: None,
            scenario,
            variant,
            hop,
            replica,
            serve,
        } => match (scenario, hop) {
            (Some(scenario), Some(hop)) => roles::serve_deployed_hop(
                &roles::DeployedHop {
                    scenario: scenario.clone(),
                    variant: variant.clone(),
                    hop: hop.clone(),
                    replica: *replica,
                },
                &serve.options(),
            )
            .map_err(|e| anyhow::anyhow!("{e}")),
            _ => Err(anyhow::anyhow!(
                "tailmesh hop needs --config, or --scenario and --hop"
            )),
        },
        Command::Broker {
            topics,
            queue_capacity,
            max_deliveries,
            serve,
        } => roles::serve_broker(
            BrokerConfig {
                topics: topics.clone(),
                queue_capacity: *queue_capacity,
                max_deliveries: *max_deliveries,
                ..BrokerConfig::default()
            },
            &serve.options(),
        )
        .map_err(|e| anyhow::anyhow!("{e}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tell!("tailmesh: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: &RunCommand, check: bool) -> ExitCode {
    let finished = match experiment::execute(command) {
        Ok(finished) => finished,
        Err(ExperimentError::Scenario(errors)) => {
            tell!("{errors}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        Err(e) => {
            tell!("tailmesh: {e}");
            return ExitCode::FAILURE;
        }
    };
    // What was measured is shown before any file is written: a full disk
    // loses files, never the numbers.
    if finished.histograms {
        for v in &finished.summary.variants {
            let title = format!("{}: latency from intended send time, ok requests", v.name);
            say!(
                "{}",
                tailmesh::output::render_histogram(&title, &v.latency_histogram)
            );
        }
    }
    say!("{}", tailmesh::output::render_table(&finished.summary));
    say!("{}", tailmesh::output::render_legend(&finished.summary));
    match finished.write() {
        Ok(files) => say!("{}", tailmesh::output::render_files(&finished.dir, &files)),
        Err(e) => {
            tell!(
                "tailmesh: {e}\ntailmesh: the results above were measured, but {} is incomplete",
                finished.dir.display()
            );
            return ExitCode::FAILURE;
        }
    }
    if finished.interrupted {
        tell!("tailmesh: interrupted; the results above cover what ran");
        return ExitCode::from(EXIT_INTERRUPTED);
    }
    if check && !finished.passed() {
        tell!(
            "tailmesh: check failed (verdict {}, every request accounted for: {})",
            finished.summary.check.verdict.as_str(),
            finished.summary.check.accounted
        );
        return ExitCode::from(EXIT_CHECK_FAILED);
    }
    ExitCode::SUCCESS
}

/// Reads and checks a scenario, generates a deployment file from it, and
/// writes it to `output` or standard output. A scenario that cannot be
/// deployed is bad input (exit status 2), with every problem listed.
fn generate(
    path: &std::path::Path,
    output: Option<&std::path::Path>,
    generator: impl FnOnce(&scenario::Scenario, &str) -> Result<String, String>,
) -> ExitCode {
    let (scenario, text) = match read_scenario(path) {
        Ok(read) => read,
        Err(code) => return code,
    };
    let generated = match generator(&scenario, &text) {
        Ok(generated) => generated,
        Err(e) => {
            tell!("{}: {e}", path.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    match output {
        None => {
            tailmesh::console::out_text(&generated);
            ExitCode::SUCCESS
        }
        Some(out) => match std::fs::write(out, generated) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tell!("tailmesh: write {}: {e}", out.display());
                ExitCode::FAILURE
            }
        },
    }
}

/// The build context for a Compose file written to `output`: "." when it
/// lands in the current directory (the repository root, as the committed
/// file), else the current directory's absolute path, so the file builds
/// from wherever it is.
fn default_context(output: Option<&std::path::Path>) -> Result<String, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("the current directory: {e}"))?;
    let here = match output.map(|o| o.parent().unwrap_or(std::path::Path::new(""))) {
        None => true,
        Some(dir) if dir.as_os_str().is_empty() => true,
        Some(dir) => dir
            .canonicalize()
            .is_ok_and(|d| cwd.canonicalize().is_ok_and(|c| c == d)),
    };
    if here {
        Ok(".".to_owned())
    } else {
        cwd.to_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{} is not UTF-8: give --context", cwd.display()))
    }
}

fn generate_k8s(
    path: &std::path::Path,
    output: Option<&std::path::Path>,
    out_dir: Option<&std::path::Path>,
    options: &tailmesh::deploy::k8s::Options,
) -> ExitCode {
    let Some(dir) = out_dir else {
        return generate(path, output, |s, text| {
            tailmesh::deploy::k8s::generate(s, text, options)
                .map(|files| files.into_iter().map(|(_, body)| body).collect::<String>())
        });
    };
    let (scenario, text) = match read_scenario(path) {
        Ok(read) => read,
        Err(code) => return code,
    };
    let files = match tailmesh::deploy::k8s::generate(&scenario, &text, options) {
        Ok(files) => files,
        Err(e) => {
            tell!("{}: {e}", path.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    match tailmesh::deploy::k8s::write_dir(dir, &files) {
        Ok(()) => {
            for (name, _) in &files {
                say!("{}", dir.join(name).display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tell!("tailmesh: {e}");
            ExitCode::FAILURE
        }
    }
}

fn read_scenario(path: &std::path::Path) -> Result<(scenario::Scenario, String), ExitCode> {
    scenario::load(path).map_err(|errors| {
        tell!("{errors}");
        ExitCode::from(EXIT_BAD_INPUT)
    })
}

fn health(addr: &str, timeout: std::time::Duration) -> ExitCode {
    let addr: tailmesh_services::addr::PeerAddr = match addr.parse() {
        Ok(addr) => addr,
        Err(e) => {
            tell!("tailmesh health: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let checked = roles::runtime(1)
        .map_err(|e| format!("{e:#}"))
        .and_then(|rt| {
            rt.block_on(tailmesh::launcher::health::check(&addr, timeout))
                .map_err(|e| e.to_string())
        });
    match checked {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tell!("tailmesh health: {e}");
            ExitCode::FAILURE
        }
    }
}

fn validate(paths: &[PathBuf]) -> ExitCode {
    let mut bad = false;
    for path in paths {
        match scenario::load(path) {
            Ok((s, _)) => say!("{}: ok ({} variant(s))", path.display(), s.variants.len()),
            Err(errors) => {
                bad = true;
                tell!("{errors}");
            }
        }
    }
    if bad {
        ExitCode::from(EXIT_BAD_INPUT)
    } else {
        ExitCode::SUCCESS
    }
}

fn compare(a: &std::path::Path, b: &std::path::Path) -> anyhow::Result<()> {
    let (run_a, _) = experiment::read_run(a).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (run_b, _) = experiment::read_run(b).map_err(|e| anyhow::anyhow!("{e}"))?;
    let label = |p: &std::path::Path| p.display().to_string();
    tailmesh::console::out_text(&tailmesh::output::render_comparison(
        &run_a,
        &label(a),
        &run_b,
        &label(b),
    ));
    Ok(())
}
