//! The hop's request handler ([`HopCore`]), its gRPC face, and [`run`].

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use tailmesh_proto::{
    FILE_DESCRIPTOR_SET,
    pb::{
        CallReply, CallRequest, HopRecord,
        hop_server::{Hop, HopServer},
    },
};
use tokio::{net::TcpListener, sync::oneshot, time::Instant};
use tonic::{Code, Request, Response, Status, transport::server::TcpIncoming};

use super::{
    client::{Connections, PoolError, PushPool},
    deadline::parse_grpc_timeout,
    draw::plan,
    work::perform,
};
use crate::{
    model::{Balance, HopBehavior, Transport},
    timer::Sleeper,
};

/// One downstream hop as its caller sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DownstreamConfig {
    /// The downstream hop's name.
    pub hop: String,
    /// How it is reached.
    pub transport: Transport,
    /// How a replica is picked (push).
    pub balance: Balance,
    /// Its replicas' addresses, replica `i` at index `i` (push).
    pub replicas: Vec<SocketAddr>,
}

/// Everything a hop replica process needs: plain data, handed over as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HopConfig {
    /// What this hop does.
    pub behavior: HopBehavior,
    /// This replica's index.
    pub replica: u32,
    /// How callers reach this hop.
    pub transport: Transport,
    /// The hops this one calls, in parallel, for every request.
    pub downstream: Vec<DownstreamConfig>,
    /// The broker, when this hop or a downstream one is reached by pull.
    #[serde(default)]
    pub broker: Option<SocketAddr>,
    /// Tasks a pull worker holds at once (1: take work only when free).
    #[serde(default = "default_credits")]
    pub worker_credits: u32,
    /// How long shutdown waits for requests in flight.
    #[serde(default = "default_grace")]
    pub drain_grace: Duration,
    /// Sub-millisecond sleeps (true) or tokio's millisecond timer (false).
    #[serde(default = "default_true")]
    pub precise_timer: bool,
}

fn default_credits() -> u32 {
    1
}
fn default_grace() -> Duration {
    Duration::from_secs(5)
}
fn default_true() -> bool {
    true
}

/// Errors starting or running a hop.
#[derive(Debug, thiserror::Error)]
pub enum HopError {
    /// A downstream pool could not be built.
    #[error("hop \"{hop}\": downstream: {source}")]
    Downstream {
        /// This hop.
        hop: String,
        /// Why.
        source: PoolError,
    },
    /// A pull downstream but no broker address.
    #[error(
        "hop \"{hop}\": downstream \"{downstream}\" is reached by pull but no broker address was given"
    )]
    NoBroker {
        /// This hop.
        hop: String,
        /// The pull downstream.
        downstream: String,
    },
    /// The gRPC server failed.
    #[error("hop \"{hop}\" replica {replica}: serve: {source}")]
    Serve {
        /// This hop.
        hop: String,
        /// This replica.
        replica: u32,
        /// Why.
        source: tonic::transport::Error,
    },
    /// Reflection could not be set up.
    #[error("hop \"{hop}\": reflection: {source}")]
    Reflection {
        /// This hop.
        hop: String,
        /// Why.
        source: tonic_reflection::server::Error,
    },
}

enum Downstream {
    Push(PushPool),
}

impl Downstream {
    async fn call(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        match self {
            Downstream::Push(pool) => pool.call(request, timeout).await,
        }
    }
}

struct Inner {
    behavior: HopBehavior,
    replica: u32,
    transport: Transport,
    downstream: Vec<Downstream>,
    sleeper: Sleeper,
}

/// The request handler shared by the gRPC service and the pull worker.
#[derive(Clone)]
pub struct HopCore {
    inner: Arc<Inner>,
}

impl HopCore {
    /// Builds the handler and its downstream clients (lazily connected).
    pub fn new(config: &HopConfig) -> Result<Self, HopError> {
        let mut downstream = Vec::with_capacity(config.downstream.len());
        for d in &config.downstream {
            match d.transport {
                Transport::Push => {
                    let pool = PushPool::new(
                        &d.hop,
                        &d.replicas,
                        d.balance,
                        Connections::Shared(1),
                        config.behavior.seed ^ u64::from(config.replica),
                        &config.behavior.name,
                    )
                    .map_err(|source| HopError::Downstream {
                        hop: config.behavior.name.clone(),
                        source,
                    })?;
                    downstream.push(Downstream::Push(pool));
                }
                Transport::Pull => {
                    return Err(HopError::NoBroker {
                        hop: config.behavior.name.clone(),
                        downstream: d.hop.clone(),
                    });
                }
            }
        }
        Ok(HopCore {
            inner: Arc::new(Inner {
                behavior: config.behavior.clone(),
                replica: config.replica,
                transport: config.transport,
                downstream,
                sleeper: if config.precise_timer {
                    Sleeper::Precise
                } else {
                    Sleeper::Tokio
                },
            }),
        })
    }

    /// Handles one request: work, injected slowness and errors, downstream
    /// calls in parallel, then this hop's record appended to the path.
    /// `timeout` is what remains of the caller's deadline; `queue_wait` is
    /// the time the request spent in a broker queue (pull).
    pub async fn handle(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
        queue_wait: Duration,
    ) -> Result<CallReply, Status> {
        let inner = &*self.inner;
        let started = Instant::now();
        let deadline = timeout.map(|t| started + t);
        let plan = plan(
            &inner.behavior,
            inner.replica,
            request.request_id,
            request.attempt,
        );

        perform(plan.work, &inner.sleeper).await;
        if let Some(extra) = plan.slow {
            inner.sleeper.sleep(extra).await;
        }
        let service = started.elapsed();
        if let Some(code) = plan.error {
            return Err(Status::new(
                Code::from(code),
                format!(
                    "injected error at hop \"{}\" replica {}",
                    inner.behavior.name, inner.replica
                ),
            ));
        }

        let mut path = Vec::new();
        if !inner.downstream.is_empty() {
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if remaining == Some(Duration::ZERO) {
                return Err(Status::deadline_exceeded(format!(
                    "hop \"{}\": deadline passed before calling downstream",
                    inner.behavior.name
                )));
            }
            let child = CallRequest {
                request_id: request.request_id,
                payload: request.payload.clone(),
                attempt: 0,
                caller: inner.behavior.name.clone(),
            };
            let replies = futures::future::join_all(
                inner
                    .downstream
                    .iter()
                    .map(|d| d.call(child.clone(), remaining)),
            )
            .await;
            for reply in replies {
                path.extend(reply?.path);
            }
        }

        path.push(HopRecord {
            hop: inner.behavior.name.clone(),
            replica: inner.replica,
            service_ns: nanos(service),
            total_ns: nanos(started.elapsed()),
            slow: plan.slow.is_some(),
            queue_wait_ns: nanos(queue_wait),
            parent: request.caller,
            transport: inner.transport.as_str().to_string(),
        });
        Ok(CallReply {
            request_id: request.request_id,
            payload: request.payload,
            path,
        })
    }
}

/// Saturating nanoseconds of a duration.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

struct HopService {
    core: HopCore,
}

#[tonic::async_trait]
impl Hop for HopService {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallReply>, Status> {
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        self.core
            .handle(request.into_inner(), timeout, Duration::ZERO)
            .await
            .map(Response::new)
    }
}

/// Serves one hop replica on `listener` until `shutdown` resolves, then
/// drains requests in flight for up to `config.drain_grace`. Serves
/// `tailmesh.v1.Hop`, the gRPC health service and server reflection.
pub async fn run(
    config: HopConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), HopError> {
    let core = HopCore::new(&config)?;
    let name = config.behavior.name.clone();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<HopServer<HopService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|source| HopError::Reflection {
            hop: name.clone(),
            source,
        })?;

    let (stop, stopped) = oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(HopServer::new(HopService { core }))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => r,
        () = shutdown => {
            let _ = stop.send(());
            match tokio::time::timeout(config.drain_grace, &mut server).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!(hop = %name, "requests still in flight after the drain grace; stopping");
                    Ok(())
                }
            }
        }
    };
    result.map_err(|source| HopError::Serve {
        hop: name,
        replica: config.replica,
        source,
    })
}
