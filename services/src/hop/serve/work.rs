//! The hop's own work for one request ([`Work`]): the synthetic work the
//! fault layer drew, or, for a hop with a real service, one call of that
//! service within what is left of the deadline, in a client span of its
//! own under the hop's server span (so the service's spans are children of
//! the call that made them). Its reply carries the request's payload back.

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use futures::future::BoxFuture;
use opentelemetry::trace::SpanKind;
use tokio::time::Instant;
use tonic::Status;
use tower::Service;

use super::{HopRequest, Served};
use crate::{
    hop::{error::CallError, service::ServiceClient, work::perform},
    telemetry,
    timer::Sleeper,
};

/// Replica `replica` of hop `hop`'s work.
#[derive(Clone)]
pub struct Work {
    hop: Arc<str>,
    replica: u32,
    sleeper: Sleeper,
    /// The real service called in place of synthetic work, if any, and
    /// its calls' span name ("`<hop> -> <method>`"), made once.
    service: Option<(ServiceClient, &'static str)>,
}

impl Work {
    /// Synthetic work (slept with `sleeper`) or, with `service`, its call.
    pub fn new(hop: &str, replica: u32, sleeper: Sleeper, service: Option<ServiceClient>) -> Self {
        Work {
            hop: Arc::from(hop),
            replica,
            sleeper,
            service: service.map(|s| {
                let name = telemetry::intern(&format!("{hop} -> {}", s.method_name()));
                (s, name)
            }),
        }
    }
}

impl Service<HopRequest<Bytes>> for Work {
    type Response = Served<Bytes>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Served<Bytes>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: HopRequest<Bytes>) -> Self::Future {
        let work = self.clone();
        Box::pin(async move {
            match &work.service {
                Some((service, span_name)) => {
                    work.call_service(service, span_name, request.request_id, request.deadline)
                        .await?;
                }
                None => {
                    if let Some(planned) = request.work {
                        perform(planned, &work.sleeper).await;
                    }
                }
            }
            Ok(Served::new(request.payload))
        })
    }
}

impl Work {
    /// One call of the hop's service for request `request_id` within what
    /// is left of `deadline`, in a client span named `span_name`; its
    /// failure (a non-OK answer, no answer, a garbled one) is the hop's,
    /// named for the hop, replica and service, its code kept.
    async fn call_service(
        &self,
        service: &ServiceClient,
        span_name: &'static str,
        request_id: u64,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if remaining == Some(Duration::ZERO) {
            return Err(CallError::DeadlineBeforeService {
                hop: self.hop.to_string(),
            }
            .into());
        }
        // Started within the server span's scope: its parent; the call's
        // `traceparent` is this span's.
        let mut span = telemetry::TraceSpan::start(SpanKind::Client, telemetry::current, || {
            (
                span_name.into(),
                telemetry::SpanFields {
                    request_id: Some(request_id),
                    ..telemetry::SpanFields::default()
                },
            )
        });
        // With export off the span has no context: the current one (an
        // incoming `traceparent`, or none) goes on as it is.
        let called = match span.context() {
            Some(_) => span.scope(service.call(remaining)).await,
            None => service.call(remaining).await,
        };
        span.mark_error(&called);
        span.end();
        called.map(drop).map_err(|status| {
            CallError::Service {
                hop: self.hop.to_string(),
                replica: self.replica,
                address: service.address().to_owned(),
                status,
            }
            .into()
        })
    }
}
