//! A hop whose work is a real gRPC service (`[hop.service]`), against a
//! test server of `examples/servers/echo.proto` written here: a raw
//! handler that works `work_us`, fails with `fail_code`, writes down the
//! `grpc-timeout`, `traceparent` and metadata each call carried, and can
//! garble its reply. Its reflection (v1, v1alpha only, or none) is
//! tonic's, built from the same `.proto`.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use prost::Message;
use tailmesh_proto::pb::{CallRequest, hop_client::HopClient};
use tailmesh_services::{
    broker::{BrokerConfig, run as run_broker},
    hop::{self, HopConfig, HopCore, HopError, PullTarget, RawCodec, ServiceClient, ServiceError},
    model::{HopBehavior, ServiceCall, Transport},
    telemetry::{self, SpanContext},
};
use tokio::{net::TcpListener, sync::oneshot};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Status, body::Body, codegen::http, server::NamedService};

use crate::support::{Running, within};

/// `tailmesh.examples.v1.EchoRequest`, by hand.
#[derive(Clone, PartialEq, Message)]
struct EchoRequest {
    #[prost(string, tag = "1")]
    message: String,
    #[prost(uint32, tag = "2")]
    work_us: u32,
    #[prost(uint32, tag = "3")]
    fail_code: u32,
    #[prost(bytes = "vec", tag = "4")]
    payload: Vec<u8>,
}

/// `tailmesh.examples.v1.EchoReply`, by hand.
#[derive(Clone, PartialEq, Message)]
struct EchoReply {
    #[prost(string, tag = "1")]
    message: String,
    #[prost(string, tag = "2")]
    server: String,
    #[prost(int64, tag = "3")]
    deadline_left_us: i64,
    #[prost(string, tag = "4")]
    traceparent: String,
    #[prost(uint32, tag = "5")]
    worked_us: u32,
}

const METHOD: &str = "tailmesh.examples.v1.Echo/Echo";

/// What one call to the test server carried.
#[derive(Clone, Debug)]
struct Seen {
    request: EchoRequest,
    timeout: Option<String>,
    traceparent: Option<String>,
    tenant: Option<String>,
}

/// Which reflection the test server serves.
#[derive(Clone, Copy, PartialEq)]
enum Reflection {
    V1,
    V1alphaOnly,
    None,
}

/// The Echo service, a raw handler (no generated code): the request's
/// message "garble" makes it answer bytes that are no `EchoReply`.
#[derive(Clone, Default)]
struct Echo {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Echo {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl NamedService for Echo {
    const NAME: &'static str = "tailmesh.examples.v1.Echo";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for Echo {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let echo = self.clone();
        Box::pin(async move {
            if request.uri().path() != "/tailmesh.examples.v1.Echo/Echo" {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(EchoHandler(echo), request).await)
        })
    }
}

struct EchoHandler(Echo);

impl tonic::server::UnaryService<Bytes> for EchoHandler {
    type Response = Bytes;
    type Future = BoxFuture<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let echo = self.0.clone();
        Box::pin(async move {
            let header = |name: &str| {
                request
                    .metadata()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let (timeout, traceparent, tenant) = (
                header("grpc-timeout"),
                header("traceparent"),
                header("x-tenant"),
            );
            let decoded = EchoRequest::decode(request.into_inner())
                .map_err(|e| Status::invalid_argument(format!("not an EchoRequest: {e}")))?;
            echo.seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Seen {
                    request: decoded.clone(),
                    timeout: timeout.clone(),
                    traceparent: traceparent.clone(),
                    tenant,
                });
            if decoded.work_us > 0 {
                tokio::time::sleep(Duration::from_micros(u64::from(decoded.work_us))).await;
            }
            if decoded.fail_code != 0 {
                let code = i32::try_from(decoded.fail_code).unwrap_or(2);
                return Err(Status::new(Code::from(code), "asked to fail"));
            }
            if decoded.message == "garble" {
                // A length-delimited field 1 whose length runs past the end.
                return Ok(tonic::Response::new(Bytes::from_static(&[
                    0x0a, 0x7f, 0x01,
                ])));
            }
            let reply = EchoReply {
                message: decoded.message,
                server: "rust-test".into(),
                deadline_left_us: -1,
                traceparent: traceparent.unwrap_or_default(),
                worked_us: decoded.work_us,
            };
            Ok(tonic::Response::new(reply.encode_to_vec().into()))
        })
    }
}

fn echo_proto() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/servers/echo.proto")
}

/// echo.proto's descriptors, for the test server's reflection.
fn echo_descriptors() -> Vec<u8> {
    let proto = echo_proto();
    let dir = proto.parent().expect("a directory").to_path_buf();
    protox::compile([proto], [dir])
        .expect("echo.proto compiles")
        .encode_to_vec()
}

/// The test server on a loopback port, with `reflection`.
async fn start_echo(reflection: Reflection) -> (Echo, Running) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let echo = Echo::default();
    let descriptors: &'static [u8] = Box::leak(echo_descriptors().into_boxed_slice());
    let builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(descriptors);
    let mut router = tonic::transport::Server::builder().add_service(echo.clone());
    match reflection {
        Reflection::V1 => {
            router = router.add_service(builder.build_v1().expect("v1 reflection"));
        }
        Reflection::V1alphaOnly => {
            router = router.add_service(builder.build_v1alpha().expect("v1alpha reflection"));
        }
        Reflection::None => {}
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.to_string())
    });
    (echo, Running { addr, stop, done })
}

fn service_call(addr: SocketAddr, request: &str) -> ServiceCall {
    ServiceCall {
        address: addr.to_string(),
        method: METHOD.into(),
        request: request.into(),
        replies: None,
        proto: Vec::new(),
        proto_include: Vec::new(),
        metadata: vec![("x-tenant".into(), "blue".into())],
        layered: false,
    }
}

fn hop_config(call: ServiceCall) -> HopConfig {
    HopConfig {
        drain_grace: Duration::from_secs(1),
        service: Some(call),
        ..HopConfig::new(HopBehavior::idle("svc", 7))
    }
}

/// A hop replica serving `config` on loopback.
async fn start_hop(config: HopConfig) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        hop::run(config, listener, async {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| e.to_string())
    });
    Running { addr, stop, done }
}

async fn call_hop(
    addr: SocketAddr,
    deadline: Duration,
) -> Result<tailmesh_proto::pb::CallReply, Status> {
    let mut client = within(
        "a connection to the hop",
        HopClient::connect(format!("http://{addr}")),
    )
    .await
    .expect("connect to the hop");
    let mut request = tonic::Request::new(CallRequest {
        request_id: 42,
        ..CallRequest::default()
    });
    request.set_timeout(deadline);
    within("the hop's answer", client.call(request))
        .await
        .map(tonic::Response::into_inner)
}

/// A `grpc-timeout` value as a duration.
fn timeout_of(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().expect("digits");
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        other => panic!("unit {other:?}"),
    }
}

#[tokio::test]
async fn a_push_hop_calls_its_service_with_deadline_and_metadata() {
    let (echo, server) = start_echo(Reflection::V1).await;
    let hop = start_hop(hop_config(service_call(
        server.addr,
        r#"{"message": "hi", "workUs": 3000}"#,
    )))
    .await;
    let deadline = Duration::from_secs(5);
    let reply = call_hop(hop.addr, deadline).await.expect("an ok reply");
    let own = reply.path.last().expect("the hop's record");
    assert_eq!(own.hop, "svc");
    // The service's call is the hop's work: at least its 3 ms.
    assert!(
        own.service_ns >= 3_000_000,
        "service_ns {} below the service's work",
        own.service_ns
    );
    assert!(own.total_ns >= own.service_ns);
    let seen = echo.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].request.message, "hi");
    assert_eq!(seen[0].request.work_us, 3000);
    assert_eq!(seen[0].tenant.as_deref(), Some("blue"));
    let sent = timeout_of(seen[0].timeout.as_deref().expect("a grpc-timeout"));
    assert!(
        sent <= deadline && sent > Duration::ZERO,
        "sent {sent:?} for {deadline:?}"
    );
    hop.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn the_services_error_is_the_hops_with_its_code() {
    let (echo, server) = start_echo(Reflection::V1).await;
    let hop = start_hop(hop_config(service_call(
        server.addr,
        r#"{"message": "no", "failCode": 9}"#,
    )))
    .await;
    let status = call_hop(hop.addr, Duration::from_secs(5))
        .await
        .expect_err("the service fails");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("hop \"svc\" replica 0: service")
            && status.message().contains("asked to fail"),
        "{status:?}"
    );
    assert_eq!(echo.seen().len(), 1);
    hop.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_garbled_reply_is_internal() {
    let (_echo, server) = start_echo(Reflection::V1).await;
    let hop = start_hop(hop_config(service_call(
        server.addr,
        r#"{"message": "garble"}"#,
    )))
    .await;
    let status = call_hop(hop.addr, Duration::from_secs(5))
        .await
        .expect_err("the reply is no EchoReply");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        status.message().contains("tailmesh.examples.v1.EchoReply"),
        "{status:?}"
    );
    hop.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn the_current_trace_context_is_sent_as_traceparent() {
    let (echo, server) = start_echo(Reflection::None).await;
    let call = ServiceCall {
        proto: vec![echo_proto()],
        ..service_call(server.addr, r#"{"message": "traced"}"#)
    };
    let core = HopCore::resolve(&hop_config(call))
        .await
        .expect("resolves from the .proto");
    let cx = SpanContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .expect("a traceparent");
    let reply = within(
        "the hop's answer",
        telemetry::scope(
            Some(cx),
            None,
            core.handle(CallRequest::default(), None, Duration::ZERO, None),
        ),
    )
    .await
    .expect("an ok reply");
    assert_eq!(reply.path.len(), 1);
    let seen = echo.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].traceparent.as_deref(),
        Some(cx.traceparent().as_str())
    );
    // No deadline, no grpc-timeout.
    assert_eq!(seen[0].timeout, None);
    server.stop().await;
}

#[tokio::test]
async fn a_pull_hop_calls_its_service_too() {
    let (echo, server) = start_echo(Reflection::V1).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let broker_addr = listener.local_addr().expect("local addr");
    let (stop_broker, broker_stopped) = oneshot::channel::<()>();
    let broker = tokio::spawn(run_broker(
        BrokerConfig {
            topics: vec!["svc".into()],
            ..BrokerConfig::default()
        },
        listener,
        async {
            let _ = broker_stopped.await;
        },
    ));
    let hop = start_hop(HopConfig {
        transport: Transport::Pull,
        broker: Some(broker_addr.into()),
        ..hop_config(service_call(
            server.addr,
            r#"{"message": "pulled", "workUs": 2000}"#,
        ))
    })
    .await;
    let target = PullTarget::new(broker_addr, "svc");
    let deadline = Duration::from_secs(5);
    let reply = within(
        "the pulled hop's answer",
        target.call(CallRequest::default(), Some(deadline)),
    )
    .await
    .expect("an ok reply");
    let own = reply.path.last().expect("the hop's record");
    assert_eq!((own.hop.as_str(), own.transport.as_str()), ("svc", "pull"));
    assert!(own.service_ns >= 2_000_000, "{own:?}");
    let seen = echo.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].request.message, "pulled");
    let sent = timeout_of(seen[0].timeout.as_deref().expect("a grpc-timeout"));
    assert!(sent <= deadline, "sent {sent:?} for {deadline:?}");
    hop.stop().await;
    let _ = stop_broker.send(());
    within("the broker to stop", broker)
        .await
        .expect("broker task")
        .expect("the broker stops cleanly");
    server.stop().await;
}

#[tokio::test]
async fn v1alpha_reflection_serves_when_v1_is_unimplemented() {
    let (_echo, server) = start_echo(Reflection::V1alphaOnly).await;
    let client = within(
        "resolution",
        ServiceClient::resolve(
            &service_call(server.addr, r#"{"message": "a"}"#),
            Duration::ZERO,
        ),
    )
    .await
    .expect("resolves through v1alpha");
    let mut replies = Vec::new();
    within(
        "the service's answer",
        client.call_each(None, Default::default(), |reply| replies.push(reply)),
    )
    .await
    .expect("an ok reply");
    let [reply] = &replies[..] else {
        panic!("{} replies to a unary call", replies.len());
    };
    let text = tailmesh_services::protojson::to_json(&reply.message().expect("a decodable reply"))
        .to_string();
    assert!(text.contains(r#""message":"a""#), "{text}");
    assert!(text.contains(r#""deadlineLeftUs":"-1""#), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_method_or_a_misfit_request_fails_the_start() {
    let (echo, server) = start_echo(Reflection::V1).await;
    // Unknown method: the hop does not start, and says why.
    let config = hop_config(ServiceCall {
        method: "tailmesh.examples.v1.Echo/Shout".into(),
        ..service_call(server.addr, "{}")
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let err = within(
        "the hop's start to fail",
        hop::run(config, listener, std::future::pending()),
    )
    .await
    .expect_err("an unknown method");
    assert!(
        matches!(&err, HopError::Service { source, .. }
            if matches!(**source, ServiceError::UnknownMethod { .. })),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("hop \"svc\" replica 0")
            && text.contains("unknown method \"Shout\"")
            && text.contains("Echo"),
        "{text}"
    );
    // Unknown service.
    let err = within(
        "resolution",
        ServiceClient::resolve(
            &ServiceCall {
                method: "nope.Svc/Echo".into(),
                ..service_call(server.addr, "{}")
            },
            Duration::ZERO,
        ),
    )
    .await
    .expect_err("an unknown service");
    assert!(err.to_string().contains("nope.Svc"), "{err}");
    // A field the message lacks, on line 3 column 3.
    let err = within(
        "resolution",
        ServiceClient::resolve(
            &service_call(server.addr, "{\n  \"message\": \"x\",\n  \"wrk_us\": 1\n}"),
            Duration::ZERO,
        ),
    )
    .await
    .expect_err("a misfit request");
    let ServiceError::Request { source, .. } = &err else {
        panic!("not a request error: {err}");
    };
    assert_eq!((source.line, source.column), (3, 3), "{err}");
    assert!(source.message.contains("wrk_us"), "{err}");
    // A value of the wrong type names the field.
    let err = within(
        "resolution",
        ServiceClient::resolve(
            &service_call(server.addr, "{\"workUs\": -5}"),
            Duration::ZERO,
        ),
    )
    .await
    .expect_err("a negative uint32");
    let ServiceError::Request { source, .. } = &err else {
        panic!("not a request error: {err}");
    };
    assert_eq!(
        (source.field.as_str(), source.line, source.column),
        ("work_us", 1, 12),
        "{err}"
    );
    // Nothing was called.
    assert!(echo.seen().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_service_without_reflection_needs_its_proto() {
    let (_echo, server) = start_echo(Reflection::None).await;
    let err = within(
        "resolution",
        ServiceClient::resolve(&service_call(server.addr, "{}"), Duration::ZERO),
    )
    .await
    .expect_err("no reflection");
    assert!(err.to_string().contains("no reflection"), "{err}");
    // An unreachable service is said to be so, not waited for.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let nobody = closed.local_addr().expect("local addr");
    drop(closed);
    let err = within(
        "resolution",
        ServiceClient::resolve(&service_call(nobody, "{}"), Duration::ZERO),
    )
    .await
    .expect_err("nobody listens");
    assert!(matches!(err, ServiceError::Reflection { .. }), "{err}");
    server.stop().await;
}
