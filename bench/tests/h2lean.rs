//! The lean client against h2's server on loopback: the server's answers
//! use Huffman strings and its dynamic table, limit the streams in flight,
//! and fail some requests, and the client must count each request once.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use bytes::Bytes;
use prost::Message;
use tailmesh_bench::h2lean::{self, LeanConfig};
use tailmesh_proto::pb::{CallReply, CallRequest, HopRecord};
use tokio::net::TcpListener;
use tonic::codegen::http::{HeaderMap, HeaderValue, Request, Response};

/// Requests whose id is a multiple of this are answered grpc-status 5.
const FAIL_EVERY: u64 = 10;

/// Streams in flight on the server, now and at most.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// Serves every connection of `listener`: each request is answered with
/// a `CallReply` echoing it, or a trailers-only grpc-status 5 when its id
/// is a multiple of [`FAIL_EVERY`].
async fn serve(listener: TcpListener, max_streams: u32, in_flight: Arc<InFlight>) {
    while let Ok((tcp, _)) = listener.accept().await {
        let in_flight = Arc::clone(&in_flight);
        tokio::spawn(async move {
            let Ok(mut conn) = h2::server::Builder::new()
                .max_concurrent_streams(max_streams)
                .handshake::<_, Bytes>(tcp)
                .await
            else {
                return;
            };
            while let Some(Ok((request, respond))) = conn.accept().await {
                let in_flight = Arc::clone(&in_flight);
                tokio::spawn(answer(request, respond, in_flight));
            }
        });
    }
}

async fn answer(
    request: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    in_flight: Arc<InFlight>,
) {
    let now = in_flight.now.fetch_add(1, Ordering::SeqCst) + 1;
    in_flight.most.fetch_max(now, Ordering::SeqCst);
    let mut body = request.into_body();
    let mut bytes = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    // Let the other streams of the batch arrive, so the limit is tested.
    tokio::task::yield_now().await;
    in_flight.now.fetch_sub(1, Ordering::SeqCst);
    let Some(message) = bytes.get(5..) else {
        return;
    };
    let Ok(call) = CallRequest::decode(message) else {
        return;
    };
    let grpc = |status: &'static str| {
        Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .header("server", "a-server-whose-headers-take-huffman")
            .header("grpc-status", status)
            .header("grpc-message", "not found")
            .body(())
    };
    if call.request_id % FAIL_EVERY == 0 {
        if let Ok(head) = grpc("5") {
            let _ = respond.send_response(head, true);
        }
        return;
    }
    let Ok(head) = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .header("server", "a-server-whose-headers-take-huffman")
        .body(())
    else {
        return;
    };
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let reply = CallReply {
        request_id: call.request_id,
        payload: call.payload,
        path: vec![HopRecord {
            hop: "lean".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();
    let mut framed = vec![0];
    framed.extend_from_slice(&(reply.len() as u32).to_be_bytes());
    framed.extend_from_slice(&reply);
    let _ = send.send_data(framed.into(), false);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

#[tokio::test]
async fn every_request_is_counted_once_and_the_servers_stream_limit_is_kept() {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local address: {e}"));
    let in_flight = Arc::new(InFlight::default());
    let server = tokio::spawn(serve(listener, 3, Arc::clone(&in_flight)));
    let config = LeanConfig {
        addr,
        connections: 2,
        streams: 5,
        requests: 500,
        payload: 64,
        path: "/tailmesh.v1.Hop/Call".into(),
    };
    let report = tokio::task::LocalSet::new()
        .run_until(h2lean::run(&config))
        .await
        .unwrap_or_else(|e| panic!("run: {e}"));
    server.abort();

    assert_eq!(report.sent, 500);
    assert_eq!(report.failed, 500 / FAIL_EVERY, "{report:?}");
    assert_eq!(report.ok, 500 - 500 / FAIL_EVERY, "{report:?}");
    assert!(report.connection_errors.is_empty(), "{report:?}");
    assert_eq!(
        report.first_failure.as_deref(),
        Some("grpc-status 5: not found")
    );
    assert!(report.p50_us > 0 && report.p50_us <= report.p99_us);
    // 2 connections of at most 3 streams each (the server's limit, below
    // the 5 asked): had the client opened more, the server would have
    // refused them and they would count as failed above.
    let most = in_flight.most.load(Ordering::SeqCst);
    assert!((2..=6).contains(&most), "{most} streams in flight at once");
}

#[tokio::test]
async fn a_refused_connection_is_an_error_with_its_address() {
    // Bound then dropped: nothing listens there.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let config = LeanConfig {
        addr,
        connections: 1,
        streams: 1,
        requests: 1,
        payload: 8,
        path: "/tailmesh.v1.Hop/Call".into(),
    };
    let err = tokio::task::LocalSet::new()
        .run_until(h2lean::run(&config))
        .await
        .err()
        .unwrap_or_else(|| panic!("a run against a closed port succeeded"));
    assert_eq!(err.to_string(), format!("connect to {addr}"));
}
