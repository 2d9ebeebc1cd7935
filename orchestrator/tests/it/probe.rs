//! `tailmesh probe` against a test server of `examples/servers/echo.proto`
//! (a raw handler, no reflection: the probe reads the `.proto`): the
//! reply as JSON and exit 0; exit 1 when the service answers non-OK;
//! exit 2 for an unknown method, a request that does not fit, or nobody
//! listening.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use serde_json::Value;
use tonic::{
    Code, Status,
    body::Body,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    codegen::http,
    server::NamedService,
};

use crate::support::*;

tests! {
    sync the_probe_prints_the_reply_as_json,
    sync the_probe_exits_1_when_the_service_fails_and_2_when_it_cannot_call,
}

#[derive(Clone, PartialEq, Message)]
struct EchoRequest {
    #[prost(string, tag = "1")]
    message: String,
    #[prost(uint32, tag = "2")]
    work_us: u32,
    #[prost(uint32, tag = "3")]
    fail_code: u32,
}

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
}

/// Echo: answers `fail_code` when set, else its message, the server's
/// name, whether a deadline came (1 when it did, -1 when not) and the
/// `traceparent` it got.
#[derive(Clone)]
struct Echo;

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
        Box::pin(async move {
            if request.uri().path() != "/tailmesh.examples.v1.Echo/Echo" {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            Ok(tonic::server::Grpc::new(Raw).unary(Handler, request).await)
        })
    }
}

struct Handler;

impl tonic::server::UnaryService<Bytes> for Handler {
    type Response = Bytes;
    type Future = BoxFuture<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        Box::pin(async move {
            let header = |name: &str| {
                request
                    .metadata()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let deadline = header("grpc-timeout").map_or(-1, |_| 1);
            let traceparent = header("traceparent").unwrap_or_default();
            let tenant = header("x-tenant").unwrap_or_default();
            let decoded = EchoRequest::decode(request.into_inner())
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            if decoded.fail_code != 0 {
                let code = i32::try_from(decoded.fail_code).unwrap_or(2);
                return Err(Status::new(Code::from(code), "asked to fail"));
            }
            let reply = EchoReply {
                message: format!("{}{tenant}", decoded.message),
                server: "rust-test".into(),
                deadline_left_us: deadline,
                traceparent,
            };
            Ok(tonic::Response::new(reply.encode_to_vec().into()))
        })
    }
}

#[derive(Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The echo server on its own thread and runtime, stopped when dropped.
struct EchoServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    fn start() -> EchoServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                tonic::transport::Server::builder()
                    .add_service(Echo)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .expect("the echo server serves");
            });
        });
        EchoServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn echo_proto() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/servers/echo.proto")
}

const METHOD: &str = "tailmesh.examples.v1.Echo/Echo";

fn probe(scratch: &Scratch, server: &EchoServer, method: &str, json: &str) -> Finished {
    let addr = server.addr.to_string();
    let proto = echo_proto();
    tailmesh(
        scratch.path(),
        &[
            "probe",
            &addr,
            method,
            "--json",
            json,
            "--proto",
            path_str(&proto),
            "--metadata",
            "x-tenant=-blue",
            "--timeout",
            "2s",
        ],
    )
}

fn the_probe_prints_the_reply_as_json() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    let done = probe(&scratch, &server, METHOD, r#"{"message": "hi"}"#);
    assert_eq!(done.code(), Some(0), "{}", done.output());
    let reply: Value = serde_json::from_str(&done.stdout).expect("the reply as JSON");
    assert_eq!(reply["message"], "hi-blue", "{}", done.output());
    assert_eq!(reply["server"], "rust-test");
    // A deadline and a trace context were sent, as a hop sends them.
    assert_eq!(reply["deadlineLeftUs"], "1");
    let traceparent = reply["traceparent"].as_str().expect("a string");
    assert!(
        traceparent.starts_with("00-") && traceparent.len() == 55,
        "{traceparent:?}"
    );
    assert!(
        done.stderr.contains("OK: tailmesh.examples.v1.Echo.Echo"),
        "{}",
        done.output()
    );
    assert!(done.stderr.contains(traceparent), "{}", done.output());
}

fn the_probe_exits_1_when_the_service_fails_and_2_when_it_cannot_call() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    // The service answers non-OK: exit 1, its code named.
    let done = probe(&scratch, &server, METHOD, r#"{"failCode": 5}"#);
    assert_eq!(done.code(), Some(1), "{}", done.output());
    assert!(done.stdout.is_empty(), "{}", done.output());
    assert!(
        done.stderr
            .contains("tailmesh probe: NOT_FOUND (5): asked to fail"),
        "{}",
        done.output()
    );
    // An unknown method: exit 2, the methods there are named.
    let done = probe(&scratch, &server, "tailmesh.examples.v1.Echo/Shout", "{}");
    assert_eq!(done.code(), Some(2), "{}", done.output());
    assert!(
        done.stderr.contains("unknown method \"Shout\"") && done.stderr.contains("Echo"),
        "{}",
        done.output()
    );
    // A request that does not fit: exit 2, field, line and column.
    let done = probe(&scratch, &server, METHOD, "{\n \"workUs\": \"x\"}");
    assert_eq!(done.code(), Some(2), "{}", done.output());
    assert!(
        done.stderr.contains("field `work_us`") && done.stderr.contains("line 2, column 12"),
        "{}",
        done.output()
    );
    // Nobody listens: exit 2.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nobody = closed.local_addr().expect("local addr").to_string();
    drop(closed);
    let done = tailmesh(scratch.path(), &["probe", &nobody, METHOD, "--json", "{}"]);
    assert_eq!(done.code(), Some(2), "{}", done.output());
    assert!(done.stderr.contains("cannot connect"), "{}", done.output());
}
