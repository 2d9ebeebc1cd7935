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
    hop::{client::PushPool, direct::DirectTarget, pull::PullTarget},
    link::LinkCounts,
    model::Transport,
};

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
            let Call { request, timeout } = call;
            match &reach {
                Reach::Push(pool) => pool.call(request, timeout).await,
                Reach::Pull(target) => target.call(request, timeout).await,
                Reach::Direct(target) => target.call(request, timeout).await,
            }
        })
    }
}
