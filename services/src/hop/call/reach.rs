//! The bottom of the call stack: one attempt at a downstream hop, by the
//! way it is reached ([`Reach`]). Balancing (peak-EWMA and the others) and
//! outlier ejection are the push pool's; the request's timeout becomes its
//! `grpc-timeout` (push), its task's deadline (pull) or the service call's
//! (direct), and the trace context current while the call runs travels
//! with it.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use tailmesh_proto::pb::{CallReply, PoolEvents};
use tonic::Status;
use tower::Service;

use super::Call;
use crate::{
    addr::PeerAddr,
    hop::{
        client::{Connections, PoolError, PushPool},
        direct::DirectTarget,
        pull::PullTarget,
        service::ServiceError,
    },
    link::LinkCounts,
    model::{
        Balance, BrokerKind, Connection, EndpointOptions, QueueBounds, ServiceCall, Transport,
    },
};

/// Everything a caller (a hop, or the load generator) knows of one hop it
/// calls, to reach it: [`Reach::resolve`] builds the reach from it, the
/// same way for both.
#[derive(Clone, Copy, Debug)]
pub struct ReachPlan<'a> {
    /// The hop called.
    pub hop: &'a str,
    /// The calling hop; `None`: the load generator.
    pub caller: Option<&'a str>,
    /// How it is reached when it has no direct `service`.
    pub transport: Transport,
    /// Its replicas' addresses (push, direct).
    pub replicas: &'a [PeerAddr],
    /// How push balances over them.
    pub balance: Balance,
    /// Shared connections or one per call (push and pull).
    pub connection: Connection,
    /// Shared connections per replica (push, direct).
    pub channels: usize,
    /// The seed of the push pool's choices.
    pub seed: u64,
    /// Endpoint health, keepalive and ejection of the push pool.
    pub endpoints: &'a EndpointOptions,
    /// The broker of a pulled hop: its kind, queue bounds and address.
    pub broker: Option<(BrokerKind, QueueBounds, &'a PeerAddr)>,
    /// The service called directly, when the hop is one.
    pub service: Option<&'a ServiceCall>,
}

/// Why a hop cannot be reached as planned.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    /// The push pool could not be built.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Reached by pull, with no broker.
    #[error("\"{hop}\" is reached by pull but no broker address was given")]
    NoBroker { hop: String },
    /// The direct service's method, schema or request did not resolve.
    #[error(transparent)]
    Service(Box<ServiceError>),
    /// A direct service given to [`Reach::of`], which cannot resolve it.
    #[error("\"{hop}\" is a service: it must be resolved first (Reach::resolve)")]
    ServiceUnresolved { hop: String },
}

/// The push pool's name for the load generator as a caller.
const LOADGEN: &str = "loadgen";

/// How a downstream hop is reached; a cheap clone (its clients are
/// shared), as every layer above clones it per attempt.
#[derive(Clone)]
pub enum Reach {
    /// Over the push pool of its replicas (balanced, health-checked).
    Push(Arc<PushPool>),
    /// Through its broker topic.
    Pull(Arc<PullTarget>),
    /// Its service, called directly (no hop in front).
    Direct(Arc<DirectTarget>),
}

impl Reach {
    /// The reach `plan` describes: a direct service resolved (its schema,
    /// waiting up to `patience` for one still starting), else as [`Reach::of`].
    pub async fn resolve(
        plan: &ReachPlan<'_>,
        patience: std::time::Duration,
    ) -> Result<Reach, ReachError> {
        let Some(call) = plan.service else {
            return Reach::of(plan);
        };
        let addresses: Vec<String> = plan.replicas.iter().map(ToString::to_string).collect();
        let channels = match plan.connection {
            Connection::Shared => plan.channels,
            Connection::PerRequest => 1,
        };
        let target = DirectTarget::resolve(
            plan.hop,
            plan.caller.unwrap_or_default(),
            call,
            &addresses,
            channels,
            patience,
        )
        .await
        .map_err(|e| ReachError::Service(Box::new(e)))?;
        Ok(Reach::Direct(Arc::new(target)))
    }

    /// The reach `plan` describes, when it is not a direct service: its
    /// replicas' push pool, or its broker topic.
    pub fn of(plan: &ReachPlan<'_>) -> Result<Reach, ReachError> {
        if plan.service.is_some() {
            return Err(ReachError::ServiceUnresolved {
                hop: plan.hop.to_owned(),
            });
        }
        Ok(match plan.transport {
            Transport::Push => {
                let connections = match plan.connection {
                    Connection::Shared => Connections::Shared(plan.channels),
                    Connection::PerRequest => Connections::PerRequest,
                };
                let pool = PushPool::new(
                    plan.hop,
                    plan.replicas,
                    plan.balance,
                    connections,
                    plan.seed,
                    plan.caller.unwrap_or(LOADGEN),
                )?
                .with_endpoints(plan.endpoints.clone());
                Reach::Push(Arc::new(pool))
            }
            Transport::Pull => {
                let (kind, bounds, broker) = plan.broker.ok_or_else(|| ReachError::NoBroker {
                    hop: plan.hop.to_owned(),
                })?;
                Reach::Pull(Arc::new(
                    PullTarget::of_kind(kind, bounds, broker.clone(), plan.hop)
                        .with_connection(plan.connection),
                ))
            }
        })
    }

    /// The transport a client span names (`None`: a direct call, which is
    /// neither).
    pub fn transport(&self) -> Option<Transport> {
        match self {
            Reach::Push(_) => Some(Transport::Push),
            Reach::Pull(_) => Some(Transport::Pull),
            Reach::Direct(_) => None,
        }
    }

    /// What happened to the connections so far (`None` through RabbitMQ
    /// or NATS, whose clients keep theirs to themselves, and for a direct
    /// service).
    pub fn link_counts(&self) -> Option<LinkCounts> {
        match self {
            Reach::Push(pool) => Some(pool.link_counts()),
            Reach::Pull(target) => target.link_counts(),
            Reach::Direct(_) => None,
        }
    }

    /// What the push pool did with the hop's replicas (`None` unless
    /// pushed).
    pub fn endpoint_events(&self) -> Option<PoolEvents> {
        match self {
            Reach::Push(pool) => Some(pool.endpoint_events()),
            Reach::Pull(_) | Reach::Direct(_) => None,
        }
    }
}

impl Reach {
    /// Opens `streams`' stream to this hop now rather than on its first
    /// message; a stream goes by push only (the scenario's checks refuse
    /// others), so another reach has none to open.
    pub async fn open_on(&self, streams: &crate::hop::stream::Streams) -> Result<(), Status> {
        match self {
            Reach::Push(pool) => streams.stream(pool.as_ref()).await.map(drop),
            Reach::Pull(_) | Reach::Direct(_) => Ok(()),
        }
    }
}

impl Service<Call> for Reach {
    type Response = CallReply;
    type Error = Status;
    type Future = BoxFuture<'static, Result<CallReply, Status>>;

    /// Always ready: the pool, the broker client and the service clients
    /// take calls at any time (a replica's own limits answer in the call).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let reach = self.clone();
        Box::pin(async move {
            let Call {
                request,
                timeout,
                stream,
            } = call;
            match (&reach, stream) {
                (Reach::Push(pool), Some(streams)) => {
                    streams.exchange(pool.as_ref(), request, timeout).await
                }
                (Reach::Pull(_) | Reach::Direct(_), Some(_)) => Err(Status::unimplemented(
                    "a stream's messages go by push only (the scenario's checks refuse others)",
                )),
                (Reach::Push(pool), None) => pool.call(request, timeout).await,
                (Reach::Pull(target), None) => target.call(request, timeout).await,
                (Reach::Direct(target), None) => target.call(request, timeout).await,
            }
        })
    }
}
