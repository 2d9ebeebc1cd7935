//! The replica's capacity, held for its own work only ([`SlotLayer`]).
//!
//! With limited concurrency a request holds a slot while the layers below
//! run; the wait for one is queueing, like a broker queue's, and as
//! bounded: a full line refuses the request rather than grow, and nobody
//! waits past the request's deadline (it leaves the line rather than take
//! a slot late). Once the layers below are done, the slot goes to the
//! next request and a pull worker's broker credit is given back, while the
//! hop waits on its downstream hops.

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::future::BoxFuture;
use tailmesh_units::nanos;
use tokio::time::Instant;
use tonic::Status;
use tower::{Layer, Service, ServiceExt};

use super::{HopRequest, Served};
use crate::{
    hop::{error::CallError, slots::Slots},
    telemetry,
};

/// Holds replica `replica` of hop `hop`'s slots (if its concurrency is
/// limited) and credit for each request's own work.
#[derive(Clone)]
pub struct SlotLayer {
    hop: Arc<str>,
    replica: u32,
    slots: Option<Arc<Slots>>,
}

impl SlotLayer {
    /// `slots`: `None` when the replica's concurrency is not limited.
    pub(crate) fn new(hop: &str, replica: u32, slots: Option<Slots>) -> Self {
        SlotLayer {
            hop: Arc::from(hop),
            replica,
            slots: slots.map(Arc::new),
        }
    }
}

impl<S> Layer<S> for SlotLayer {
    type Service = SlotGate<S>;

    fn layer(&self, inner: S) -> SlotGate<S> {
        SlotGate {
            inner,
            layer: self.clone(),
        }
    }
}

/// `S` holding a slot and the credit (see [`SlotLayer`]).
#[derive(Clone)]
pub struct SlotGate<S> {
    inner: S,
    layer: SlotLayer,
}

impl<S, P, R> Service<HopRequest<P>> for SlotGate<S>
where
    S: Service<HopRequest<P>, Response = Served<R>, Error = Status> + Clone + Send + 'static,
    S::Future: Send + 'static,
    P: Send + 'static,
{
    type Response = Served<R>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Served<R>, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: HopRequest<P>) -> Self::Future {
        let layer = self.layer.clone();
        // The layers below run once the slot is held: on a clone, called
        // then.
        let inner = self.inner.clone();
        Box::pin(async move {
            let (slot, slot_wait) = match &layer.slots {
                Some(slots) => {
                    let waiting = Instant::now();
                    let acquire = slots.acquire(&layer.hop, layer.replica);
                    let slot = match request.deadline {
                        Some(d) => tokio::time::timeout_at(d, acquire).await.map_err(|_| {
                            CallError::DeadlineInLine {
                                hop: layer.hop.to_string(),
                                replica: layer.replica,
                                waited: waiting.elapsed(),
                            }
                        })??,
                        None => acquire.await?,
                    };
                    (Some(slot), waiting.elapsed())
                }
                None => (None, Duration::ZERO),
            };
            let queue_wait = request.queue_wait + slot_wait;
            let release = request.release.take();
            let result = inner.oneshot(request).await;
            telemetry::set_current(|fields| {
                fields.queue_wait_ns = Some(nanos(queue_wait));
                // The part of this span spent waiting for a slot, which a
                // trace breakdown counts as queue wait, not the hop's own
                // time.
                if slot.is_some() {
                    fields.slot_wait_ns = Some(nanos(slot_wait));
                }
            });
            drop(slot);
            if let Some(release) = release {
                release.release();
            }
            let mut served = result?;
            served.queue_wait = queue_wait;
            served.slot_wait = slot_wait;
            Ok(served)
        })
    }
}
