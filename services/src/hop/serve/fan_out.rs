//! The hop's downstream calls ([`FanOutLayer`]): once its own work (and
//! injected slowness) is done, every downstream hop is called in parallel
//! through its call stack, within what is left of the deadline; their
//! records join the path, their timings the hop's calls. The first failed
//! call fails the request.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::future::BoxFuture;
use tailmesh_proto::pb::{CallRequest, CallTiming};
use tailmesh_units::nanos;
use tokio::time::Instant;
use tonic::Status;
use tower::{Layer, Service};

use super::{HopRequest, Served};
use crate::hop::call::CallStack;

/// A downstream hop: its name, and the call stack that reaches it.
pub struct Downstream {
    pub hop: Arc<str>,
    pub stack: CallStack,
}

/// Calls hop `caller`'s downstream hops after its own work.
#[derive(Clone)]
pub struct FanOutLayer {
    caller: Arc<str>,
    downstream: Arc<[Downstream]>,
}

impl FanOutLayer {
    /// Hop `caller`'s calls of `downstream`.
    pub fn new(caller: &str, downstream: Arc<[Downstream]>) -> Self {
        FanOutLayer {
            caller: Arc::from(caller),
            downstream,
        }
    }
}

impl<S> Layer<S> for FanOutLayer {
    type Service = FanOut<S>;

    fn layer(&self, inner: S) -> FanOut<S> {
        FanOut {
            inner,
            layer: self.clone(),
        }
    }
}

/// `S`, then the downstream calls (see [`FanOutLayer`]).
#[derive(Clone)]
pub struct FanOut<S> {
    inner: S,
    layer: FanOutLayer,
}

impl<S> Service<HopRequest<Bytes>> for FanOut<S>
where
    S: Service<HopRequest<Bytes>, Response = Served<Bytes>, Error = Status>,
    S::Future: Send + 'static,
{
    type Response = Served<Bytes>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Served<Bytes>, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HopRequest<Bytes>) -> Self::Future {
        let (request_id, deadline) = (request.request_id, request.deadline);
        let layer = self.layer.clone();
        let own = self.inner.call(request);
        Box::pin(async move {
            let mut served = own.await?;
            if layer.downstream.is_empty() {
                return Ok(served);
            }
            // What is left of this hop's deadline, the same for every
            // downstream call (a spent one is refused by their stacks).
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let child = CallRequest {
                request_id,
                payload: served.reply.clone(),
                attempt: 0,
                caller: layer.caller.to_string(),
                // Followers downstream slow it more often when this hop did.
                caller_slow: served.slow,
            };
            let replies = futures::future::join_all(layer.downstream.iter().map(|d| {
                let child = child.clone();
                async move {
                    let t0 = Instant::now();
                    let called = d.stack.call(child, remaining).await;
                    (d, called, t0.elapsed())
                }
            }))
            .await;
            served.calls.reserve(layer.downstream.len());
            for (d, reply, took) in replies {
                served.extra_attempts += reply.extra_attempts;
                served.calls.push(CallTiming {
                    hop: d.hop.to_string(),
                    call_ns: nanos(took),
                    attempts: reply.attempts,
                });
                served.path.extend(reply.result?.path);
            }
            Ok(served)
        })
    }
}
