//! The metrics' HTTP listener: `GET /metrics` in the protobuf format when
//! the scrape asks for it (a Prometheus with native histograms does), the
//! text format otherwise; it runs on a thread of its own, so a scrape never
//! waits for the load and the load never waits for a scrape.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, header};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use super::{LiveMetrics, expose};

/// Why the metrics cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics: {addr} is not an address to listen on")]
    Addr { addr: String },
    #[error("metrics: listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("metrics: start the listener's thread: {0}")]
    Thread(std::io::Error),
}

/// The metrics listener, serving until [`MetricsServer::finish`].
#[derive(Debug)]
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (port 0: any free one) and serves `metrics`.
    pub(crate) fn start(addr: &str, metrics: Arc<LiveMetrics>) -> Result<Self, MetricsError> {
        let wanted: SocketAddr = addr.parse().map_err(|_| MetricsError::Addr {
            addr: addr.to_owned(),
        })?;
        let std_listener =
            std::net::TcpListener::bind(wanted).map_err(|source| MetricsError::Listen {
                addr: wanted,
                source,
            })?;
        let listen_error = |source| MetricsError::Listen {
            addr: wanted,
            source,
        };
        std_listener.set_nonblocking(true).map_err(listen_error)?;
        let bound = std_listener.local_addr().map_err(listen_error)?;
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("metrics".to_owned())
            .spawn(move || serve(std_listener, metrics, stopped))
            .map_err(MetricsError::Thread)?;
        Ok(Self {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Keeps serving for `grace`, then stops.
    pub(crate) fn finish(mut self, grace: Duration) {
        std::thread::sleep(grace);
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The listener's loop, on its own single-threaded runtime, until `stop`.
fn serve(
    listener: std::net::TcpListener,
    metrics: Arc<LiveMetrics>,
    mut stop: watch::Receiver<bool>,
) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        tracing::warn!(target: "tailmesh::metrics", "no runtime for the metrics listener");
        return;
    };
    runtime.block_on(async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
            tracing::warn!(target: "tailmesh::metrics", "the metrics listener cannot run");
            return;
        };
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let metrics = Arc::clone(&metrics);
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            let metrics = Arc::clone(&metrics);
                            async move { Ok::<_, Infallible>(answer(&metrics, &request)) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        }
    });
}

/// The answer to one request.
fn answer(metrics: &LiveMetrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let respond = |status, content_type: &str, body: Bytes| {
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        if let Ok(value) = header::HeaderValue::from_str(content_type) {
            response.headers_mut().insert(header::CONTENT_TYPE, value);
        }
        response
    };
    if request.uri().path() != "/metrics" {
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"tailmesh serves /metrics only\n"),
        );
    }
    let families = metrics.families(SystemTime::now());
    let accept = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("application/vnd.google.protobuf")
        && accept.contains("io.prometheus.client.MetricFamily")
    {
        respond(
            StatusCode::OK,
            expose::PROTOBUF_TYPE,
            Bytes::from(expose::protobuf(&families)),
        )
    } else {
        respond(
            StatusCode::OK,
            expose::TEXT_TYPE,
            Bytes::from(expose::text(&families)),
        )
    }
}
