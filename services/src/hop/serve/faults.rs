//! The hop's plan for a request and its injected faults ([`FaultLayer`]):
//! the seeded draws (the work, slowness, an error) under the behaviour
//! the Control API may have overridden, the drawn work handed down,
//! injected slowness after the work, then an injected error. Slowness and
//! the work are the hop's service time either way; a failed service call
//! (the work's own error) wins over an injected one.

use std::{
    sync::{Arc, RwLock},
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use tailmesh_units::nanos;
use tokio::time::Instant;
use tonic::{Code, Status};
use tower::{Layer, Service};

use super::{HopRequest, Served};
use crate::{
    hop::{
        draw::{PlannedWork, plan},
        error::CallError,
    },
    model::{HopBehavior, Overrides},
    telemetry,
    timer::Sleeper,
};

/// A replica's behaviour as configured, and as the Control API last
/// overrode it; shared by the fault layer that reads it and the Control
/// service that sets it.
#[derive(Debug)]
pub struct Behavior {
    configured: Arc<HopBehavior>,
    replica: u32,
    /// `configured` under the faults set at runtime; `None` while none are.
    overridden: RwLock<Option<Arc<HopBehavior>>>,
}

impl Behavior {
    /// Replica `replica` of a hop configured with `configured`.
    pub fn new(configured: HopBehavior, replica: u32) -> Self {
        Behavior {
            configured: Arc::new(configured),
            replica,
            overridden: RwLock::new(None),
        }
    }

    /// The behaviour in force now.
    pub fn current(&self) -> Arc<HopBehavior> {
        self.overridden
            .read()
            .ok()
            .and_then(|b| b.clone())
            .unwrap_or_else(|| Arc::clone(&self.configured))
    }

    /// Sets the runtime faults (none: back to the configured behaviour).
    pub fn set(&self, overrides: &Overrides) {
        let effective = (!overrides.is_empty())
            .then(|| Arc::new(self.configured.overridden(overrides, self.replica)));
        if let Ok(mut current) = self.overridden.write() {
            *current = effective;
        }
    }
}

/// Plans each request of a replica and injects its faults.
#[derive(Clone)]
pub struct FaultLayer {
    behavior: Arc<Behavior>,
    sleeper: Sleeper,
    /// Whether an injected error answers at once, without the work (a
    /// user's own service is not called for a request that fails here).
    error_first: bool,
}

impl FaultLayer {
    /// Faults of the replica whose behaviour is `behavior`, slept with
    /// `sleeper`.
    pub fn new(behavior: Arc<Behavior>, sleeper: Sleeper) -> Self {
        FaultLayer {
            behavior,
            sleeper,
            error_first: false,
        }
    }

    /// The layer with injected errors answered before the work, which is
    /// then not done.
    pub fn error_first(self) -> Self {
        FaultLayer {
            error_first: true,
            ..self
        }
    }
}

impl<S> Layer<S> for FaultLayer {
    type Service = Faults<S>;

    fn layer(&self, inner: S) -> Faults<S> {
        Faults {
            inner,
            layer: self.clone(),
        }
    }
}

/// `S` under the replica's planned faults (see [`FaultLayer`]).
#[derive(Clone)]
pub struct Faults<S> {
    inner: S,
    layer: FaultLayer,
}

impl<S, P, R> Service<HopRequest<P>> for Faults<S>
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
        let behavior = self.layer.behavior.current();
        let replica = self.layer.behavior.replica;
        let plan = plan(
            &behavior,
            replica,
            request.request_id ^ request.branch,
            request.attempt,
            request.caller_slow,
        );
        let injected = plan.error.map(|code| -> Status {
            CallError::Injected {
                hop: behavior.name.clone(),
                replica,
                code: Code::from(code),
            }
            .into()
        });
        if self.layer.error_first
            && let Some(status) = injected
        {
            return Box::pin(futures::future::ready(Err(status)));
        }
        // The time asked of the hop, where the plan says it.
        let asked = match plan.work {
            PlannedWork::Sleep(d) => Some(d + plan.slow.unwrap_or_default()),
            PlannedWork::Cpu { .. } => None,
        };
        request.work = Some(plan.work);
        let sleeper = self.layer.sleeper.clone();
        let worked = self.inner.call(request);
        Box::pin(async move {
            // Called by the slot layer once its slot is held: the service
            // time starts here.
            let started = Instant::now();
            let worked = worked.await;
            if let Some(extra) = plan.slow {
                sleeper.sleep(extra).await;
            }
            let service = started.elapsed();
            telemetry::set_current(|fields| {
                fields.slow = Some(plan.slow.is_some());
                fields.service_ns = Some(nanos(service));
                fields.work_ns = asked.map(nanos);
            });
            let mut served = worked?;
            if let Some(status) = injected {
                return Err(status);
            }
            served.service = service;
            served.slow = plan.slow.is_some();
            Ok(served)
        })
    }
}
