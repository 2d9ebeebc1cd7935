//! tailmesh's serving layers around a user's own tonic server, so that it
//! joins a run as a hop with no sidecar in front.
//!
//! ```no_run
//! # async fn serve(
//! #     listener: tokio::net::TcpListener,
//! #     echo: tonic::service::Routes,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use tailmesh_services::serving::HopLayers;
//!
//! let layers = HopLayers::from_env()?;
//! let _telemetry = layers.init_telemetry();
//! let control = layers.control_from_env()?;
//! tonic::transport::Server::builder()
//!     .layer(layers)
//!     .add_routes(echo)
//!     .add_optional_service(control)
//!     .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Every call of the server's own methods goes through the hop's serving
//! stack ([`crate::hop::serve`]): the server span (child of the call's
//! `traceparent`), the replica's slot (`concurrency`, `queue_limit`,
//! `discipline` of its configuration), the planned faults under the
//! behaviour the Control API may override (injected slowness after the
//! service's answer; an injected error answered at once, as a
//! trailers-only gRPC status, without calling the service), and the hop's
//! own path record, sent back in the [`RECORD_HEADER`] response header
//! (the protobuf `HopRecord`). A unary handler has finished when its
//! response headers are made, so the record times the whole call.
//! Health, reflection and `tailmesh.v1.Control` calls pass untouched.
//!
//! What a caller sends, in the call's metadata: [`REQUEST_ID_HEADER`],
//! [`ATTEMPT_HEADER`], [`CALLER_HEADER`], [`CALLER_SLOW_HEADER`],
//! [`BRANCH_HEADER`] (the per-request draws are keyed on the request id,
//! its branch and the attempt; without an
//! id, the replica numbers its calls itself), `grpc-timeout` and
//! `traceparent`.
//!
//! What the process reads from its environment (a run sets them for a
//! `[hop.service]` with `layers = true`): [`HOP_CONFIG_ENV`], the path
//! of the hop's JSON configuration (the hop replica's, [`HopConfig`]);
//! [`CONTROL_TOKEN_FILE_ENV`] or [`CONTROL_TOKEN_ENV`], the Control
//! token; and the `OTEL_*` variables of trace export
//! ([`crate::telemetry`]).

use std::{
    convert::Infallible,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use base64::Engine;
use futures::future::BoxFuture;
use prost::Message;
use tailmesh_proto::pb::control_server::ControlServer;
use tailmesh_units::unix_nanos;
use tokio::time::Instant;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::{Code, Status};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

use super::serve::{
    FaultLayer, HopRequest, RecordLayer, Served, ServerSpanLayer, SlotLayer, SpanStart,
    faults::{Behavior, Faults},
    record::Record,
    slot::SlotGate,
    span::ServerSpan,
};
use crate::{
    control::{ControlService, NoFaults},
    hop::{HopConfig, slots::Slots},
    model::Transport,
    telemetry::{self, SpanContext},
    timer::Sleeper,
};

/// A `grpc-timeout` value read as tailmesh's hops read it, for a service
/// that reports the deadline it was given.
pub use crate::deadline::parse_grpc_timeout;

pub use super::metadata::{
    ATTEMPT_HEADER, BRANCH_HEADER, CALLER_HEADER, CALLER_SLOW_HEADER, RECORD_HEADER,
    REQUEST_ID_HEADER, insert_call_metadata, record_of,
};

/// The environment variable naming the hop's JSON configuration file.
pub const HOP_CONFIG_ENV: &str = "TAILMESH_HOP_CONFIG";
/// The environment variable naming a file that holds the Control token.
pub const CONTROL_TOKEN_FILE_ENV: &str = "TAILMESH_CONTROL_TOKEN_FILE";
/// The environment variable holding the Control token itself.
pub const CONTROL_TOKEN_ENV: &str = "TAILMESH_CONTROL_TOKEN";

/// Paths that are not the hop's work: they pass the layers untouched.
const PASSING: [&str; 3] = [
    "/grpc.health.v1.",
    "/grpc.reflection.",
    "/tailmesh.v1.Control/",
];

/// Why the layers could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("{HOP_CONFIG_ENV} is not set: the path of the hop's JSON configuration")]
    NoConfig,
    #[error("read {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a hop configuration")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: the Control token is empty")]
    EmptyToken { path: PathBuf },
}

/// tailmesh's serving layers for one replica of a hop, as a tower
/// [`Layer`] over an HTTP-level gRPC service (`Server::builder().layer`).
/// Cheap to clone: the replica's state is shared.
#[derive(Clone)]
pub struct HopLayers {
    behavior: Arc<Behavior>,
    span: ServerSpanLayer,
    record: RecordLayer,
    slot: SlotLayer,
    faults: FaultLayer,
    /// The id of the next call that came without one.
    ids: Arc<AtomicU64>,
    config: Arc<HopConfig>,
}

impl HopLayers {
    /// The layers of the replica `config` describes; its downstream hops,
    /// broker and service, if any, are not used (the wrapped service is
    /// the work, and calls whom it likes). Made inside a tokio runtime, its
    /// injected delays sleep on that runtime's own timer
    /// ([`Sleeper::precise_here`]): serve it in that runtime.
    pub fn new(config: &HopConfig) -> Self {
        let name = &config.behavior.name;
        let behavior = Arc::new(Behavior::new(config.behavior.clone(), config.replica));
        let sleeper = if config.precise_timer {
            Sleeper::precise_here()
        } else {
            Sleeper::Tokio
        };
        let slots = config
            .concurrency
            .map(|n| Slots::new(n, Some(config.queue_limit), config.discipline));
        HopLayers {
            span: ServerSpanLayer::new(name),
            record: RecordLayer::new(name, config.replica, Transport::Push),
            slot: SlotLayer::new(name, config.replica, slots),
            faults: FaultLayer::new(Arc::clone(&behavior), sleeper).error_first(),
            behavior,
            ids: Arc::new(AtomicU64::new(1)),
            config: Arc::new(config.clone()),
        }
    }

    /// The layers of the replica whose configuration is in the JSON file
    /// named by [`HOP_CONFIG_ENV`].
    pub fn from_env() -> Result<Self, ServingError> {
        let path = std::env::var_os(HOP_CONFIG_ENV)
            .map(PathBuf::from)
            .ok_or(ServingError::NoConfig)?;
        let json = std::fs::read_to_string(&path).map_err(|source| ServingError::Read {
            path: path.clone(),
            source,
        })?;
        let config: HopConfig =
            serde_json::from_str(&json).map_err(|source| ServingError::Parse { path, source })?;
        Ok(Self::new(&config))
    }

    /// The replica's configuration.
    pub fn config(&self) -> &HopConfig {
        &self.config
    }

    /// Trace export for this replica, when `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// is set, and log output to stderr; keep it until the server stops,
    /// then call its `shutdown` to flush the spans.
    pub fn init_telemetry(&self) -> telemetry::Telemetry {
        let process = telemetry::Process::hop(
            &self.config.behavior.name,
            self.config.replica,
            Transport::Push,
        );
        telemetry::init_process("warn", &process)
    }

    /// The Control service (`tailmesh.v1.Control`), guarded by `token`,
    /// which sets the faults these layers inject.
    pub fn control(&self, token: &str) -> ControlServer<ControlService<NoFaults>> {
        let behavior = Arc::clone(&self.behavior);
        ControlService::new(token, NoFaults)
            .with_behavior(Arc::new(move |overrides| behavior.set(&overrides)))
            .into_server()
    }

    /// [`HopLayers::control`] with the token from the file named by
    /// [`CONTROL_TOKEN_FILE_ENV`] or else from [`CONTROL_TOKEN_ENV`];
    /// `None` when neither is set (no run-time faults then).
    pub fn control_from_env(
        &self,
    ) -> Result<Option<ControlServer<ControlService<NoFaults>>>, ServingError> {
        let token = match std::env::var_os(CONTROL_TOKEN_FILE_ENV) {
            Some(path) => {
                let path = PathBuf::from(path);
                let token =
                    std::fs::read_to_string(&path).map_err(|source| ServingError::Read {
                        path: path.clone(),
                        source,
                    })?;
                let token = token.trim().to_owned();
                if token.is_empty() {
                    return Err(ServingError::EmptyToken { path });
                }
                token
            }
            None => match std::env::var(CONTROL_TOKEN_ENV) {
                Ok(token) if !token.is_empty() => token,
                _ => return Ok(None),
            },
        };
        Ok(Some(self.control(&token)))
    }
}

/// The stack a user's service `S` runs in.
type Stack<S> = ServerSpan<Record<SlotGate<Faults<Work<S>>>>>;

impl<S> Layer<S> for HopLayers
where
    S: Clone,
{
    type Service = Hop<S>;

    fn layer(&self, inner: S) -> Hop<S> {
        let stack = ServiceBuilder::new()
            // Outermost, so the span covers the whole call and ends with
            // the record's total.
            .layer(self.span.clone())
            // The record times the call from its arrival, slot wait and
            // slowness included.
            .layer(self.record.clone())
            // The slot bounds the calls the service works on at once.
            .layer(self.slot.clone())
            // Injected errors spare the service; slowness follows it.
            .layer(self.faults.clone())
            .service(Work(inner.clone()));
        Hop {
            stack,
            inner,
            ids: Arc::clone(&self.ids),
        }
    }
}

/// A user's service `S` as one hop replica (see [`HopLayers`]).
#[derive(Clone)]
pub struct Hop<S> {
    stack: Stack<S>,
    /// The service itself, for calls that pass the layers.
    inner: S,
    ids: Arc<AtomicU64>,
}

impl<S, B, RB> Service<http::Request<B>> for Hop<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<RB>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each call runs on a clone, made ready there.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        if PASSING.iter().any(|p| path.starts_with(p)) {
            let inner = self.inner.clone();
            return Box::pin(async move {
                Ok(inner
                    .oneshot(request)
                    .await
                    .unwrap_or_else(|e| Status::from_error(e.into()).into_http()))
            });
        }
        // One moment on both clocks: the span's start and the record's.
        let arrived = Instant::now();
        let started = unix_nanos();
        let request = hop_request(request, arrived, started, &self.ids);
        let stack = self.stack.clone();
        Box::pin(async move {
            Ok(match stack.oneshot(request).await {
                Ok(served) => with_record(served),
                Err(status) => status.into_http(),
            })
        })
    }
}

/// The call as the layers see it, from its metadata.
fn hop_request<B>(
    request: http::Request<B>,
    arrived: Instant,
    started: u64,
    ids: &AtomicU64,
) -> HopRequest<http::Request<B>> {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let request_id = text(REQUEST_ID_HEADER)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| ids.fetch_add(1, Ordering::Relaxed));
    let timeout = text("grpc-timeout").and_then(parse_grpc_timeout);
    HopRequest {
        arrived,
        span: Some(SpanStart {
            started,
            parent: traceparent(headers),
        }),
        request_id,
        attempt: text(ATTEMPT_HEADER)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        caller: text(CALLER_HEADER).unwrap_or_default().to_owned(),
        caller_slow: text(CALLER_SLOW_HEADER) == Some("1"),
        branch: text(BRANCH_HEADER)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        deadline: timeout.map(|t| arrived + t),
        queue_wait: std::time::Duration::ZERO,
        release: None,
        work: None,
        stream: None,
        payload: request,
    }
}

fn traceparent(headers: &HeaderMap) -> Option<SpanContext> {
    headers
        .get("traceparent")
        .and_then(|v| SpanContext::parse_bytes(v.as_bytes()))
}

/// The service's response with the hop's record (the path's last) in
/// [`RECORD_HEADER`].
fn with_record<RB>(served: Served<http::Response<RB>>) -> http::Response<RB> {
    let mut response = served.reply;
    if let Some(own) = served.path.last() {
        let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(own.encode_to_vec());
        if let Ok(value) = HeaderValue::from_str(&encoded) {
            response.headers_mut().insert(RECORD_HEADER, value);
        }
    }
    response
}

/// The user's service as the stack's work: a gRPC error it answers (in
/// its response headers: a trailers-only response) is the call's.
#[derive(Clone)]
pub struct Work<S>(S);

impl<S, B, RB> Service<HopRequest<http::Request<B>>> for Work<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = Served<http::Response<RB>>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Served<http::Response<RB>>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: HopRequest<http::Request<B>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            let response = inner
                .oneshot(request.payload)
                .await
                .map_err(|e| Status::from_error(e.into()))?;
            match Status::from_header_map(response.headers()) {
                Some(status) if status.code() != Code::Ok => Err(status),
                _ => Ok(Served::new(response)),
            }
        })
    }
}
