//! A small gRPC server of examples/servers/echo.proto for the `[hop.service]`
//! tests, with no toolchain but Rust's: `tailmesh.examples.v1.Echo/Echo`
//! (waits `work_us`, answers `fail_code` when set, reports what it saw,
//! appends the `x-tenant` metadata to the message), `EchoStream` and
//! `EchoServerStream` (each message so answered, in order) and
//! grpc.health.v1 (SERVING). It runs on a thread of the test process
//! ([`EchoServer::start`], for `address = ...`), or as a process of its own
//! when the test binary is started with `--echo-server` ([`serve_if_asked`],
//! for `command = [...]`).

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use prost::Message;
use tailmesh_services::hop::RawCodec;
use tonic::{
    Status, Streaming,
    codegen::{BoxFuture, http},
    server::{Grpc, NamedService, ServerStreamingService, StreamingService, UnaryService},
};

/// The method the tests call.
pub(crate) const METHOD: &str = "tailmesh.examples.v1.Echo/Echo";
/// Its bidirectional and server-streaming forms.
pub(crate) const STREAM_METHOD: &str = "tailmesh.examples.v1.Echo/EchoStream";
pub(crate) const SERVER_STREAM_METHOD: &str = "tailmesh.examples.v1.Echo/EchoServerStream";

/// The example servers' schema, for `proto = [...]`.
pub(crate) fn echo_proto() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/servers/echo.proto")
        .canonicalize()
        .expect("examples/servers/echo.proto exists")
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EchoRequest {
    #[prost(string, tag = "1")]
    pub message: String,
    #[prost(uint32, tag = "2")]
    pub work_us: u32,
    #[prost(uint32, tag = "3")]
    pub fail_code: u32,
    #[prost(bytes = "vec", tag = "4")]
    pub payload: Vec<u8>,
    #[prost(uint32, tag = "5")]
    pub replies: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EchoReply {
    #[prost(string, tag = "1")]
    pub message: String,
    #[prost(string, tag = "2")]
    pub server: String,
    #[prost(int64, tag = "3")]
    pub deadline_left_us: i64,
    #[prost(string, tag = "4")]
    pub traceparent: String,
    #[prost(uint32, tag = "5")]
    pub worked_us: u32,
    #[prost(uint32, tag = "6")]
    pub received: u32,
}

/// What the server counts, shared by its calls.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Calls answered (ok or not).
    pub calls: AtomicU64,
    /// Calls that carried a `traceparent`.
    pub traced: AtomicU64,
    /// Calls that carried a deadline.
    pub with_deadline: AtomicU64,
}

/// The Echo service.
#[derive(Clone)]
struct Echo {
    seen: Arc<Seen>,
    /// Exit the process after this many calls (a service that dies
    /// mid-run).
    exit_after: Option<u64>,
}

/// What a call saw when it came: its `traceparent`, the time left of its
/// deadline (-1 without one) and its `x-tenant` metadata. Counts the call.
struct Came {
    traceparent: String,
    deadline_left_us: i64,
    tenant: String,
}

impl Echo {
    fn came(&self, metadata: &tonic::metadata::MetadataMap) -> Came {
        let calls = self.seen.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.exit_after.is_some_and(|n| calls > n) {
            std::process::exit(7);
        }
        let text = |key: &str| {
            metadata
                .get(key)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let traceparent = text("traceparent");
        if !traceparent.is_empty() {
            self.seen.traced.fetch_add(1, Ordering::SeqCst);
        }
        let deadline_left_us = grpc_timeout_us(&text("grpc-timeout")).unwrap_or(-1);
        if deadline_left_us >= 0 {
            self.seen.with_deadline.fetch_add(1, Ordering::SeqCst);
        }
        // The `x-tenant` metadata, when sent, is appended to the message:
        // the probe's test sees that metadata arrived.
        Came {
            traceparent,
            deadline_left_us,
            tenant: text("x-tenant"),
        }
    }
}

/// One request message's answer: its work, then its reply (`received`:
/// the messages the call has had), or its `fail_code`.
async fn answer(came: &Came, body: Bytes, received: u32) -> Result<Bytes, Status> {
    let mut body = EchoRequest::decode(body)
        .map_err(|e| Status::invalid_argument(format!("not an EchoRequest: {e}")))?;
    body.message.push_str(&came.tenant);
    tokio::time::sleep(Duration::from_micros(u64::from(body.work_us))).await;
    if body.fail_code != 0 {
        return Err(Status::new(
            tonic::Code::from_i32(body.fail_code as i32),
            "asked to fail",
        ));
    }
    let reply = EchoReply {
        message: body.message,
        server: "rust-test".to_owned(),
        deadline_left_us: came.deadline_left_us,
        traceparent: came.traceparent.clone(),
        worked_us: body.work_us,
        received,
    };
    Ok(reply.encode_to_vec().into())
}

struct EchoCall(Echo);

impl UnaryService<Bytes> for EchoCall {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let echo = self.0.clone();
        Box::pin(async move {
            let came = echo.came(request.metadata());
            let reply = answer(&came, request.into_inner(), 1).await?;
            Ok(tonic::Response::new(reply))
        })
    }
}

type Answers = tokio_stream::wrappers::ReceiverStream<Result<Bytes, Status>>;

/// `EchoStream`: each request message answered in order; a failed one
/// ends the stream with its status.
struct EchoStreamCall(Echo);

impl StreamingService<Bytes> for EchoStreamCall {
    type Response = Bytes;
    type ResponseStream = Answers;
    type Future = BoxFuture<tonic::Response<Answers>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let echo = self.0.clone();
        Box::pin(async move {
            let came = echo.came(request.metadata());
            let mut inbound = request.into_inner();
            let (tx, rx) = tokio::sync::mpsc::channel(16);
            tokio::spawn(async move {
                let mut received = 0;
                while let Some(body) = inbound.message().await.transpose() {
                    received += 1;
                    let reply = match body {
                        Ok(body) => answer(&came, body, received).await,
                        Err(status) => Err(status),
                    };
                    let failed = reply.is_err();
                    if tx.send(reply).await.is_err() || failed {
                        break;
                    }
                }
            });
            Ok(tonic::Response::new(Answers::new(rx)))
        })
    }
}

/// `EchoServerStream`: the request answered `replies` times (once when 0).
struct EchoServerStreamCall(Echo);

impl ServerStreamingService<Bytes> for EchoServerStreamCall {
    type Response = Bytes;
    type ResponseStream = Answers;
    type Future = BoxFuture<tonic::Response<Answers>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let echo = self.0.clone();
        Box::pin(async move {
            let came = echo.came(request.metadata());
            let body = request.into_inner();
            let replies = EchoRequest::decode(body.clone()).map_or(1, |r| r.replies.max(1));
            let (tx, rx) = tokio::sync::mpsc::channel(16);
            tokio::spawn(async move {
                for _ in 0..replies {
                    let reply = answer(&came, body.clone(), 1).await;
                    let failed = reply.is_err();
                    if tx.send(reply).await.is_err() || failed {
                        break;
                    }
                }
            });
            Ok(tonic::Response::new(Answers::new(rx)))
        })
    }
}

/// `grpc-timeout`'s value (`100m`, `2S`...) in microseconds.
fn grpc_timeout_us(value: &str) -> Option<i64> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: i64 = digits.parse().ok()?;
    Some(match unit {
        "H" => n * 3_600_000_000,
        "M" => n * 60_000_000,
        "S" => n * 1_000_000,
        "m" => n * 1_000,
        "u" => n,
        "n" => n / 1_000,
        _ => return None,
    })
}

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let echo = self.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(RawCodec);
            let path = request.uri().path().trim_start_matches('/');
            if path == METHOD {
                return Ok(grpc.unary(EchoCall(echo), request).await);
            }
            if path == STREAM_METHOD {
                return Ok(grpc.streaming(EchoStreamCall(echo), request).await);
            }
            if path == SERVER_STREAM_METHOD {
                return Ok(grpc
                    .server_streaming(EchoServerStreamCall(echo), request)
                    .await);
            }
            let mut response = http::Response::new(tonic::body::Body::default());
            let headers = response.headers_mut();
            headers.insert(
                Status::GRPC_STATUS,
                (tonic::Code::Unimplemented as i32).into(),
            );
            headers.insert(
                http::header::CONTENT_TYPE,
                tonic::metadata::GRPC_CONTENT_TYPE,
            );
            Ok(response)
        })
    }
}

impl NamedService for Echo {
    const NAME: &'static str = "tailmesh.examples.v1.Echo";
}

/// Serves Echo, and health unless `health` is false, on `listener` until
/// `stop` resolves.
async fn serve(
    listener: tokio::net::TcpListener,
    echo: Echo,
    health: bool,
    stop: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let (_reporter, health_service) = tonic_health::server::health_reporter();
    // Without TCP_NODELAY a reply can wait for the client's delayed ACK
    // (40 ms), which a test of the tail would count as the service's time.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |accepted| accepted.and_then(|s| s.set_nodelay(true).map(|()| s)),
    );
    let mut server = tonic::transport::Server::builder();
    if health {
        server
            .add_service(health_service)
            .add_service(echo)
            .serve_with_incoming_shutdown(incoming, stop)
            .await
    } else {
        server
            .add_service(echo)
            .serve_with_incoming_shutdown(incoming, stop)
            .await
    }
}

/// An Echo server on a thread of the test process, stopped when dropped.
pub(crate) struct EchoServer {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    /// Starts one on a free port of 127.0.0.1; it is listening on return.
    pub(crate) fn start() -> EchoServer {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind the echo server");
        std_listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = std_listener.local_addr().expect("its address");
        let seen = Arc::new(Seen::default());
        let echo = Echo {
            seen: Arc::clone(&seen),
            exit_after: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the echo server's runtime");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(std_listener).expect("a tokio listener");
                let stop = async {
                    let _ = stopped.await;
                };
                if let Err(e) = serve(listener, echo, true, stop).await {
                    eprintln!("echo server: {e}");
                }
            });
        });
        EchoServer {
            addr,
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub(crate) fn calls(&self) -> u64 {
        self.seen.calls.load(Ordering::SeqCst)
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

/// The flag that makes the test binary an Echo server process:
/// `it --echo-server --port P [--exit-after N] [--no-health]`.
pub(crate) const FLAG: &str = "--echo-server";

/// When the binary was started with [`FLAG`], serves until SIGTERM (its
/// default action ends the process) and returns the exit code; `None`
/// otherwise. It prints one line with what the launcher gave it.
pub(crate) fn serve_if_asked() -> Option<std::process::ExitCode> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some(FLAG) {
        return None;
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let Some(port) = value("--port").and_then(|p| p.parse::<u16>().ok()) else {
        eprintln!("echo server: --port PORT is required");
        return Some(std::process::ExitCode::from(2));
    };
    let exit_after = value("--exit-after").and_then(|n| n.parse().ok());
    // Without grpc.health.v1: ready once a call is answered (UNIMPLEMENTED).
    let health = !args.iter().any(|a| a == "--no-health");
    let env = |key: &str| std::env::var(key).unwrap_or_default();
    // The downstream hops' variables, each with its value.
    let mut downstream: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("TAILMESH_DOWNSTREAM"))
        .map(|(k, v)| format!("{k}={v} "))
        .collect();
    downstream.sort();
    println!(
        "echo server: port {port}, PORT={} TAILMESH_HOP={} TAILMESH_REPLICA={} \
         OTEL_SERVICE_NAME={} {}",
        env("PORT"),
        env("TAILMESH_HOP"),
        env("TAILMESH_REPLICA"),
        env("OTEL_SERVICE_NAME"),
        downstream.concat()
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("echo server: runtime: {e}");
            return Some(std::process::ExitCode::from(1));
        }
    };
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
        let echo = Echo {
            seen: Arc::new(Seen::default()),
            exit_after,
        };
        serve(listener, echo, health, std::future::pending())
            .await
            .map_err(|e| e.to_string())
    });
    match served {
        Ok(()) => Some(std::process::ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("echo server: {e}");
            Some(std::process::ExitCode::from(1))
        }
    }
}
