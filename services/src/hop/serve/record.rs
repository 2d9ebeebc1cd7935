//! The hop's own path record ([`RecordLayer`]): appended to the reply's
//! path once everything below is done, from what the layers below found
//! (service time, queue and slot wait, downstream calls) and the total
//! since the request arrived.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use tailmesh_proto::pb::HopRecord;
use tailmesh_units::nanos;
use tonic::Status;
use tower::{Layer, Service};

use super::{HopRequest, Served};
use crate::model::Transport;

/// Appends replica `replica` of hop `hop`'s record to every reply's path.
#[derive(Clone, Debug)]
pub struct RecordLayer {
    hop: Arc<str>,
    replica: u32,
    transport: Transport,
}

impl RecordLayer {
    /// Records of `hop`'s replica `replica`, reached by `transport`.
    pub fn new(hop: &str, replica: u32, transport: Transport) -> Self {
        RecordLayer {
            hop: Arc::from(hop),
            replica,
            transport,
        }
    }
}

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            layer: self.clone(),
        }
    }
}

/// `S` with the hop's record on its replies (see [`RecordLayer`]).
#[derive(Clone)]
pub struct Record<S> {
    inner: S,
    layer: RecordLayer,
}

impl<S, P, R> Service<HopRequest<P>> for Record<S>
where
    S: Service<HopRequest<P>, Response = Served<R>, Error = Status>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = Served<R>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Served<R>, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: HopRequest<P>) -> Self::Future {
        let arrived = request.arrived;
        // Only this layer needs the caller's name.
        let parent = std::mem::take(&mut request.caller);
        let layer = self.layer.clone();
        let served = self.inner.call(request);
        Box::pin(async move {
            let mut served = served.await?;
            let record = HopRecord {
                hop: layer.hop.to_string(),
                replica: layer.replica,
                service_ns: nanos(served.service),
                total_ns: nanos(arrived.elapsed()),
                slow: served.slow,
                queue_wait_ns: nanos(served.queue_wait),
                parent,
                transport: layer.transport.as_str().to_string(),
                extra_attempts: served.extra_attempts,
                slot_wait_ns: nanos(served.slot_wait),
                calls: std::mem::take(&mut served.calls),
                downstream_ns: nanos(served.downstream),
            };
            served.path.push(record);
            Ok(served)
        })
    }
}
