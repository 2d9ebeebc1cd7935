//! The caller's client span around a call to a downstream hop
//! ([`SpanLayer`]), and trace propagation: the span is the current context
//! while the layers below run, so every attempt (a retry, a hedge) injects
//! it (`traceparent` in the gRPC metadata or the broker task's headers),
//! and its callee's server span is its child.
//!
//! Its interface is narrow on purpose: the span's name and fixed fields
//! are made once, and the span is started, scoped and ended here only, so
//! what keeps the spans (today the process's recorder) can change behind
//! it.

use std::{
    convert::Infallible,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use opentelemetry::trace::SpanKind;
use tailmesh_proto::pb::CallReply;
use tower::{Layer, Service};

use super::Call;
use crate::{hop::policy::Called, model::Transport, telemetry};

/// Opens the client span "`<caller> -> <hop>`" around each call, child of
/// the context current when the call starts (the caller's server span).
#[derive(Clone, Debug)]
pub struct SpanLayer {
    /// The span's name and the hop's name, made once: a span refers to
    /// them rather than copying them.
    name: &'static str,
    hop: &'static str,
    transport: Option<Transport>,
}

impl SpanLayer {
    /// Spans of `caller`'s calls to `hop`, reached by `transport` (`None`:
    /// a service called directly). The caller's hop, replica and variant
    /// are its process's resource, not the span's.
    pub fn new(caller: &str, hop: &str, transport: Option<Transport>) -> Self {
        SpanLayer {
            name: telemetry::intern(&format!("{caller} -> {hop}")),
            hop: telemetry::intern(hop),
            transport,
        }
    }
}

impl<S> Layer<S> for SpanLayer {
    type Service = ClientSpan<S>;

    fn layer(&self, inner: S) -> ClientSpan<S> {
        ClientSpan {
            inner,
            layer: self.clone(),
        }
    }
}

/// `S` inside a client span (see [`SpanLayer`]).
#[derive(Clone)]
pub struct ClientSpan<S> {
    inner: S,
    layer: SpanLayer,
}

impl<S> Service<Call> for ClientSpan<S>
where
    S: Service<Call, Response = Called<CallReply>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Called<CallReply>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Called<CallReply>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let request_id = call.request.request_id;
        let layer = self.layer.clone();
        let called = self.inner.call(call);
        Box::pin(async move {
            // Started on the first poll, within the caller's scope: its
            // parent is the caller's current span.
            let mut span =
                telemetry::TraceSpan::start(SpanKind::Client, telemetry::current, || {
                    (
                        layer.name.into(),
                        telemetry::SpanFields {
                            downstream: Some(layer.hop),
                            transport: layer.transport,
                            request_id: Some(request_id),
                            ..telemetry::SpanFields::default()
                        },
                    )
                });
            let Ok(called) = span.scope(called).await;
            span.mark_error(&called.result);
            span.end();
            Ok(called)
        })
    }
}
