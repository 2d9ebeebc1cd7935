//! The hop's server span around everything it does for a request
//! ([`ServerSpanLayer`]): child of the caller's context, current while the
//! layers below run (so the downstream calls' client spans are its
//! children and the layers below set its fields), and ended its record's
//! `total_ns` after its start, both read at the same moment, so a thread
//! descheduled between the record and the end does not stretch the span
//! past what the path says.
//!
//! Like the call stack's client span, its interface is narrow: the span is
//! started, scoped and ended here only.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use opentelemetry::trace::SpanKind;
use tonic::Status;
use tower::{Layer, Service};

use super::{HopRequest, Served};
use crate::telemetry;

/// Opens the server span of hop `name` around each request that carries
/// a [`HopRequest::span`]. The hop, replica, transport and variant are
/// its process's resource, not the span's.
#[derive(Clone, Debug)]
pub struct ServerSpanLayer {
    name: &'static str,
}

impl ServerSpanLayer {
    pub fn new(hop: &str) -> Self {
        ServerSpanLayer {
            name: telemetry::intern(hop),
        }
    }
}

impl<S> Layer<S> for ServerSpanLayer {
    type Service = ServerSpan<S>;

    fn layer(&self, inner: S) -> ServerSpan<S> {
        ServerSpan {
            inner,
            name: self.name,
        }
    }
}

/// `S` inside the hop's server span (see [`ServerSpanLayer`]).
#[derive(Clone)]
pub struct ServerSpan<S> {
    inner: S,
    name: &'static str,
}

impl<S, P, R> Service<HopRequest<P>> for ServerSpan<S>
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

    fn call(&mut self, request: HopRequest<P>) -> Self::Future {
        let Some(start) = request.span else {
            return Box::pin(self.inner.call(request));
        };
        let request_id = request.request_id;
        let name = self.name;
        let mut span = telemetry::TraceSpan::start_at(
            SpanKind::Server,
            Some(start.started),
            || start.parent,
            || {
                (
                    name.into(),
                    telemetry::SpanFields {
                        request_id: Some(request_id),
                        ..telemetry::SpanFields::default()
                    },
                )
            },
        );
        let served = self.inner.call(request);
        Box::pin(async move {
            let result = span.scope(served).await;
            span.mark_error(&result);
            match result.as_ref().ok().and_then(|s| s.path.last()) {
                Some(own) => span.end_after(own.total_ns),
                None => span.end(),
            }
            result
        })
    }
}
