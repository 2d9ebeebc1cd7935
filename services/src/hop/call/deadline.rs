//! Deadline propagation on the caller's side ([`DeadlineLayer`]): a call
//! carries what remains of the caller's own deadline as its timeout (the
//! layers below turn it into each attempt's budget and the callee's
//! `grpc-timeout` or task deadline); a call with nothing left is refused
//! here, at once, without a span or an attempt, named for the caller.

use std::{
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::future::{Either, Ready, ready};
use tailmesh_proto::pb::CallReply;
use tower::{Layer, Service};

use super::Call;
use crate::hop::{error::CallError, policy::Called};

/// Refuses calls whose timeout is spent.
#[derive(Clone, Debug)]
pub struct DeadlineLayer {
    /// The calling hop, which the refusal names.
    caller: Arc<str>,
}

impl DeadlineLayer {
    pub fn new(caller: &str) -> Self {
        DeadlineLayer {
            caller: Arc::from(caller),
        }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            caller: Arc::clone(&self.caller),
        }
    }
}

/// `S` behind the caller's deadline (see [`DeadlineLayer`]).
#[derive(Clone)]
pub struct Deadline<S> {
    inner: S,
    caller: Arc<str>,
}

impl<S> Service<Call> for Deadline<S>
where
    S: Service<Call, Response = Called<CallReply>, Error = Infallible>,
{
    type Response = Called<CallReply>;
    type Error = Infallible;
    type Future = Either<Ready<Result<Called<CallReply>, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> Self::Future {
        if call.timeout == Some(Duration::ZERO) {
            let refused = CallError::DeadlineBeforeDownstream {
                hop: self.caller.to_string(),
            };
            return Either::Left(ready(Ok(Called {
                result: Err(refused.into()),
                extra_attempts: 0,
                attempts: Vec::new(),
            })));
        }
        Either::Right(self.inner.call(call))
    }
}
