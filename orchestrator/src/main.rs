//! The tailmesh command line: parses flags, sets up logging, calls the
//! library, and maps errors to exit codes (2 for a bad scenario or flags).

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};
use tailmesh::roles;

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
    /// Serve one hop replica (started by the launchers).
    Hop {
        /// The hop's JSON config file.
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        serve: ServeArgs,
    },
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match &cli.command {
        Command::Hop { config, serve } => roles::serve_hop(config, &serve.options()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tailmesh: {e:#}");
            ExitCode::FAILURE
        }
    }
}
