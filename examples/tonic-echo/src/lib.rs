//! The example echo server (examples/servers/echo.proto) in Rust, with
//! tonic, served plain or inside tailmesh's serving layers
//! ([`tailmesh_services::serving`]), so it joins a run as a hop with no
//! sidecar in front.
//!
//! - [`pb`]: the generated echo service.
//! - [`Echo`]: the service: it works for the time a call asks (or its
//!   default), fails with the status a call asks for, and answers with
//!   what it saw (deadline left, `traceparent`), as the other example
//!   servers do; its streaming forms do so per request message.
//! - [`run`]: serves it, with gRPC health, on a bound listener until a
//!   shutdown future resolves.

use std::{future::Future, time::Duration};

use tailmesh_services::serving::HopLayers;
use tokio::{net::TcpListener, sync::mpsc, time::Instant};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Code, Request, Response, Status, Streaming};

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

/// What a call saw when it came: the time left of its deadline (-1
/// without one) and its `traceparent`.
struct Came {
    deadline_left_us: i64,
    traceparent: String,
}

fn came(metadata: &tonic::metadata::MetadataMap) -> Came {
    Came {
        deadline_left_us: metadata
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(tailmesh_services::serving::parse_grpc_timeout)
            .map_or(-1, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
        traceparent: metadata
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
    }
}

/// A stream of replies, sent by the task that works on them.
type Replies = ReceiverStream<Result<EchoReply, Status>>;

/// Replies in flight between the task working on a stream and its caller.
const STREAM_BUFFER: usize = 16;

impl Echo {
    /// One request message's work, then its reply (`received`: the
    /// messages the call has had), or its `fail_code` as the status.
    async fn answer(
        &self,
        came: &Came,
        request: EchoRequest,
        received: u32,
    ) -> Result<EchoReply, Status> {
        let started = Instant::now();
        let work = match request.work_us {
            0 => self.default_work,
            us => Duration::from_micros(u64::from(us)),
        };
        if self.sleep {
            tokio::time::sleep(work).await;
        } else {
            // A CPU-bound handler holds its thread, as the other examples'
            // busy work does.
            while started.elapsed() < work {
                std::hint::spin_loop();
            }
        }
        let worked_us = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
        match request.fail_code {
            0 => Ok(EchoReply {
                message: request.message,
                server: SERVER.to_owned(),
                deadline_left_us: came.deadline_left_us,
                traceparent: came.traceparent.clone(),
                worked_us,
                received,
            }),
            code @ 1..=16 => Err(Status::new(
                Code::from(code as i32),
                format!("failed on request with code {code}"),
            )),
            code => Err(Status::invalid_argument(format!(
                "fail_code {code} is not a gRPC status code (1..16)"
            ))),
        }
    }

    /// Runs `work` on a task of its own, its replies streamed as it sends
    /// them.
    fn streamed<F>(work: impl FnOnce(mpsc::Sender<Result<EchoReply, Status>>) -> F) -> Replies
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(work(tx));
        ReceiverStream::new(rx)
    }
}

#[tonic::async_trait]
impl echo_server::Echo for Echo {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let came = came(request.metadata());
        let reply = self.answer(&came, request.into_inner(), 1).await?;
        Ok(Response::new(reply))
    }

    type EchoStreamStream = Replies;

    /// Each request message answered in order; a failed one ends the
    /// stream with its status.
    async fn echo_stream(
        &self,
        request: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<Replies>, Status> {
        let came = came(request.metadata());
        let mut inbound = request.into_inner();
        let echo = self.clone();
        Ok(Response::new(Self::streamed(|tx| async move {
            let mut received = 0;
            while let Some(message) = inbound.message().await.transpose() {
                received += 1;
                let reply = match message {
                    Ok(message) => echo.answer(&came, message, received).await,
                    Err(status) => Err(status),
                };
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    break;
                }
            }
        })))
    }

    type EchoServerStreamStream = Replies;

    /// The request answered `replies` times (once when 0).
    async fn echo_server_stream(
        &self,
        request: Request<EchoRequest>,
    ) -> Result<Response<Replies>, Status> {
        let came = came(request.metadata());
        let request = request.into_inner();
        let echo = self.clone();
        Ok(Response::new(Self::streamed(|tx| async move {
            for _ in 0..request.replies.max(1) {
                let reply = echo.answer(&came, request.clone(), 1).await;
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    break;
                }
            }
        })))
    }

    /// Every request message worked on in order; one reply once the
    /// caller half-closes.
    async fn echo_client_stream(
        &self,
        request: Request<Streaming<EchoRequest>>,
    ) -> Result<Response<EchoReply>, Status> {
        let came = came(request.metadata());
        let mut inbound = request.into_inner();
        let (mut messages, mut worked_us) = (Vec::new(), 0u32);
        while let Some(message) = inbound.message().await? {
            let text = message.message.clone();
            let reply = self.answer(&came, message, 0).await?;
            messages.push(text);
            worked_us = worked_us.saturating_add(reply.worked_us);
        }
        Ok(Response::new(EchoReply {
            message: messages.join(" "),
            server: SERVER.to_owned(),
            deadline_left_us: came.deadline_left_us,
            traceparent: came.traceparent,
            worked_us,
            received: u32::try_from(messages.len()).unwrap_or(u32::MAX),
        }))
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
