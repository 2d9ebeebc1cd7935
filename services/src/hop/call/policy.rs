//! The client policy as a layer ([`PolicyLayer`]): a per-attempt timeout,
//! retries limited by a budget and hedged requests, around the reach. The
//! algorithm, its state and its accounting are [`crate::hop::policy`]'s;
//! this layer numbers each attempt on its request and clones the service
//! below for each (a hedge runs beside the attempt it hedges).
//!
//! Its answer is a [`Called`] and never an error: how many attempts a call
//! took, and when, is part of the answer even when the call failed.

use std::{
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use tailmesh_proto::pb::{CallReply, CallRequest};
use tonic::Status;
use tower::{Layer, Service, ServiceExt};

use super::Call;
use crate::hop::policy::{self, Called, ClientPolicy, PolicyState};

/// Puts calls under a [`ClientPolicy`]; each service it makes remembers
/// its own answers and retry budget ([`PolicyState`]), shared by its
/// clones.
#[derive(Clone, Debug)]
pub struct PolicyLayer {
    policy: Arc<ClientPolicy>,
}

impl PolicyLayer {
    pub fn new(policy: ClientPolicy) -> Self {
        PolicyLayer {
            policy: Arc::new(policy),
        }
    }
}

impl<S> Layer<S> for PolicyLayer {
    type Service = Policy<S>;

    fn layer(&self, inner: S) -> Policy<S> {
        Policy {
            inner,
            policy: Arc::clone(&self.policy),
            state: Arc::new(PolicyState::default()),
        }
    }
}

/// `S` under a client policy (see [`PolicyLayer`]).
#[derive(Clone)]
pub struct Policy<S> {
    inner: S,
    policy: Arc<ClientPolicy>,
    state: Arc<PolicyState>,
}

impl<S> Service<Call> for Policy<S>
where
    S: Service<Call, Response = CallReply, Error = Status> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Called<CallReply>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Called<CallReply>, Infallible>>;

    /// Ready at once: each attempt waits for the readiness of its own
    /// clone of the service below.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let inner = self.inner.clone();
        let policy = Arc::clone(&self.policy);
        let state = Arc::clone(&self.state);
        Box::pin(async move {
            let Call {
                request,
                timeout,
                stream,
            } = call;
            let called = policy::call(&policy, &state, timeout, move |attempt, timeout| {
                let request = CallRequest {
                    attempt,
                    ..request.clone()
                };
                inner.clone().oneshot(Call {
                    request,
                    timeout,
                    stream: stream.clone(),
                })
            })
            .await;
            Ok(called)
        })
    }
}
