//! The example echo server (examples/servers/echo.proto) in Rust, with
//! tonic, served plain or inside tailmesh's serving layers
//! ([`tailmesh_services::serving`]), so it joins a run as a hop with no
//! sidecar in front.
//!
//! - [`pb`]: the generated echo service.
//! - [`Echo`]: the service: it works for the time a call asks (or its
//!   default), fails with the status a call asks for, and answers with
//!   what it saw (deadline left, `traceparent`), as the other example
//!   servers do.
//! - [`run`]: serves it, with gRPC health, on a bound listener until a
//!   shutdown future resolves.

use std::{future::Future, time::Duration};

use tailmesh_services::serving::HopLayers;
use tokio::{net::TcpListener, time::Instant};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Request, Response, Status};

/// The generated echo service.
pub mod pb {
    tonic::include_proto!("tailmesh.examples.v1");
}

use pb::{
    EchoReply, EchoRequest,
    echo_server::{self, EchoServer},
};

/// The name this implementation answers in `EchoReply.server`.
pub const SERVER: &str = "rust";

/// How the echo works.
#[derive(Clone, Debug, Default)]
pub struct Echo {
    /// The work of a call that asks none (`work_us` 0).
    pub default_work: Duration,
    /// Sleep for the work time instead of spinning on the CPU.
    pub sleep: bool,
}

#[tonic::async_trait]
impl echo_server::Echo for Echo {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let arrived = Instant::now();
        let metadata = request.metadata();
        let deadline_left_us = metadata
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(tailmesh_services::serving::parse_grpc_timeout)
            .map_or(-1, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let traceparent = metadata
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let request = request.into_inner();
        let work = match request.work_us {
            0 => self.default_work,
            us => Duration::from_micros(u64::from(us)),
        };
        if self.sleep {
            tokio::time::sleep(work).await;
        } else {
            // A CPU-bound handler holds its thread, as the other examples'
            // busy work does.
            while arrived.elapsed() < work {
                std::hint::spin_loop();
            }
        }
        let worked_us = u32::try_from(arrived.elapsed().as_micros()).unwrap_or(u32::MAX);
        match request.fail_code {
            0 => Ok(Response::new(EchoReply {
                message: request.message,
                server: SERVER.to_owned(),
                deadline_left_us,
                traceparent,
                worked_us,
            })),
            code @ 1..=16 => Err(Status::new(
                Code::from(code as i32),
                format!("failed on request with code {code}"),
            )),
            code => Err(Status::invalid_argument(format!(
                "fail_code {code} is not a gRPC status code (1..16)"
            ))),
        }
    }
}

/// Why the server stopped.
#[derive(Debug, thiserror::Error)]
#[error("serve the echo: {0}")]
pub struct EchoError(#[from] tonic::transport::Error);

/// Serves `echo` and gRPC health on `listener` until `shutdown` resolves;
/// inside `layers` (with their Control service when `control_token` is
/// given) or plain (`None`).
pub async fn run(
    echo: Echo,
    layers: Option<HopLayers>,
    control_token: Option<String>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EchoError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<EchoServer<Echo>>().await;
    let incoming = TcpListenerStream::new(listener);
    match layers {
        Some(layers) => {
            let control = control_token.map(|token| layers.control(&token));
            tonic::transport::Server::builder()
                // Every echo call is the hop's work: span, slot, faults
                // and its record in the reply.
                .layer(layers)
                .add_service(health)
                .add_service(EchoServer::new(echo))
                .add_optional_service(control)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
        None => {
            tonic::transport::Server::builder()
                .add_service(health)
                .add_service(EchoServer::new(echo))
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
    }
    Ok(())
}
