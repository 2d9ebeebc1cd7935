//! `tailmesh-echo`: the example echo server in Rust, inside tailmesh's
//! serving layers (or `--plain`). Prints `echo-rust listening on
//! HOST:PORT` once it serves; stops on SIGTERM or Ctrl-C.

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::Parser;
use tailmesh_example_echo::{Echo, run};
use tailmesh_services::{
    hop::HopConfig,
    model::HopBehavior,
    serving::{self, HopLayers},
};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Flags {
    /// The port to listen on; 0 picks a free one (printed).
    #[arg(long, env = "PORT", default_value_t = 50051)]
    port: u16,
    /// The address to listen on.
    #[arg(long, env = "HOST", default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// The work per call, in microseconds, when the request asks none.
    #[arg(long, env = "WORK_US", default_value_t = 0)]
    work_us: u64,
    /// Sleep for the work time instead of spinning on the CPU.
    #[arg(long)]
    sleep: bool,
    /// Serve the echo without tailmesh's layers (to measure their cost).
    #[arg(long, env = "TAILMESH_ECHO_PLAIN")]
    plain: bool,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(flags: Flags) -> anyhow::Result<()> {
    let echo = Echo {
        default_work: Duration::from_micros(flags.work_us),
        sleep: flags.sleep,
    };
    // The hop's configuration from a run, or, standalone, an idle hop
    // "echo" (no faults until the Control API sets some).
    let layers = match (flags.plain, std::env::var_os(serving::HOP_CONFIG_ENV)) {
        (true, _) => None,
        (false, Some(_)) => Some(HopLayers::from_env()?),
        (false, None) => Some(HopLayers::new(&HopConfig::new(HopBehavior::idle(
            "echo", 0,
        )))),
    };
    let telemetry = layers.as_ref().map(HopLayers::init_telemetry);
    let token = control_token()?;
    let addr = SocketAddr::new(flags.host, flags.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listen on {addr}"))?;
    let bound = listener.local_addr().context("the bound address")?;
    println!(
        "echo-rust listening on {bound} ({})",
        if layers.is_some() { "layered" } else { "plain" }
    );
    let result = run(echo, layers, token, listener, stopped()).await;
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    Ok(result?)
}

/// The Control token a run gives, from its file or inline.
fn control_token() -> anyhow::Result<Option<String>> {
    if let Some(path) = std::env::var_os(serving::CONTROL_TOKEN_FILE_ENV) {
        let token = std::fs::read_to_string(&path)
            .with_context(|| format!("read the Control token {}", path.display()))?;
        return Ok(Some(token.trim().to_owned()).filter(|t| !t.is_empty()));
    }
    Ok(std::env::var(serving::CONTROL_TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty()))
}

/// SIGTERM or Ctrl-C.
async fn stopped() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
