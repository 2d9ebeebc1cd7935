//! A lean unary-gRPC HTTP/2 client, closed loop, like `h2load -c C -m M`
//! (`tailmesh_bench::h2lean`): how fast a client without the h2 crate
//! drives one hop. A measuring instrument for `bench/generator.sh`.
//!
//! Prints one JSON line on stdout (sent, ok, failed, ok_per_s, p50_us,
//! p99_us, ...) and a summary on stderr; exits 1 when a request failed or
//! a connection did.

use std::{net::SocketAddr, process::ExitCode};

use anyhow::{Context, Result};
use clap::Parser;
use tailmesh_bench::h2lean::{self, LeanConfig, MAX_PAYLOAD};

/// Closed-loop unary gRPC calls to `tailmesh.v1.Hop/Call` over HTTP/2,
/// on one thread.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The hop, e.g. 127.0.0.1:4000.
    addr: SocketAddr,
    /// Requests in all.
    #[arg(short = 'n', long, default_value_t = 50_000)]
    requests: u64,
    /// Connections.
    #[arg(short = 'c', long, default_value_t = 1)]
    connections: usize,
    /// Streams in flight per connection.
    #[arg(short = 'm', long, default_value_t = 1)]
    streams: usize,
    /// Payload bytes per request.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=MAX_PAYLOAD as u64))]
    payload: u64,
    /// The method's path.
    #[arg(long, default_value = "/tailmesh.v1.Hop/Call")]
    path: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("h2lean: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the load; true when every request was answered ok.
fn run(args: &Args) -> Result<bool> {
    let config = LeanConfig {
        addr: args.addr,
        connections: args.connections,
        streams: args.streams,
        requests: args.requests,
        payload: usize::try_from(args.payload).context("--payload")?,
        path: args.path.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    let local = tokio::task::LocalSet::new();
    let report = local.block_on(&runtime, h2lean::run(&config))?;
    println!(
        "{}",
        serde_json::to_string(&report).context("encode the report")?
    );
    eprintln!(
        "h2lean: {} sent, {} ok, {} failed in {:.2} s: {:.0} ok/s, p50 {} us, p99 {} us ({} x {} streams)",
        report.sent,
        report.ok,
        report.failed,
        report.elapsed_s,
        report.ok_per_s,
        report.p50_us,
        report.p99_us,
        report.connections,
        report.streams
    );
    if let Some(why) = &report.first_failure {
        eprintln!("h2lean: first failure: {why}");
    }
    for e in &report.connection_errors {
        eprintln!("h2lean: {e}");
    }
    Ok(report.failed == 0 && report.connection_errors.is_empty() && report.ok == config.requests)
}
