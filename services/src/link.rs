//! The HTTP/2 connections between tailmesh's processes: one endpoint
//! set-up for every caller (to a hop, to the broker), one server set-up for
//! every service, and [`LinkEvents`], what happened to a caller's
//! connections while they were used. With TLS on (see [`crate::tls`]) a
//! connection is TLS over TCP, opened by one function (`open`) for every client alike.
//!
//! The set-up keeps a caller's connections whatever the system under test
//! does. h2 protects a client from a misbehaving server by ending the whole
//! connection (GOAWAY `too_many_internal_resets`) once it has reset 1024
//! streams of its own accord, and an overloaded hop makes exactly that
//! happen: a caller gives up a call at its deadline, the hop's late answer
//! then arrives on a stream h2 has forgotten, and h2 resets it. Every
//! tailmesh client talks to tailmesh's own services, so that limit is off;
//! a caller also waits a little past the deadline it sends (see
//! `deadline::ANSWER_SLACK`), so the callee's own DEADLINE_EXCEEDED
//! usually ends the call without a reset at all.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioIo};
use rustls::{ClientConfig, HandshakeKind};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tonic::{
    Status,
    codegen::http::Uri,
    transport::{Channel, Endpoint},
};

/// What happened to one caller's connections: counted by the connections
/// themselves (opened, closed) and from the errors of the calls on them.
#[derive(Debug, Default)]
pub struct LinkEvents {
    opened: AtomicU64,
    closed: AtomicU64,
    goaway_received: AtomicU64,
    goaway_sent: AtomicU64,
    reset_by_peer: AtomicU64,
    broken: AtomicU64,
    tls_full: AtomicU64,
    tls_resumed: AtomicU64,
}

pub use tailmesh_model::LinkCounts;

impl LinkEvents {
    /// The counts so far.
    pub fn counts(&self) -> LinkCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LinkCounts {
            opened: get(&self.opened),
            closed: get(&self.closed),
            goaway_received: get(&self.goaway_received),
            goaway_sent: get(&self.goaway_sent),
            reset_by_peer: get(&self.reset_by_peer),
            broken: get(&self.broken),
            tls_full: get(&self.tls_full),
            tls_resumed: get(&self.tls_resumed),
        }
    }

    /// Counts a failed call by what its status says about the transport;
    /// a status the peer answered with is not a transport event.
    pub fn note(&self, status: &Status) {
        if let Some(counter) = self.counter_for(status) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a transport failure h2 reported directly.
    pub(crate) fn note_h2(&self, error: &h2::Error) {
        if let Some(counter) = self.h2_counter(error) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a call that failed because no connection could be made.
    pub(crate) fn count_broken(&self) {
        self.broken.fetch_add(1, Ordering::Relaxed);
    }

    fn h2_counter(&self, h2: &h2::Error) -> Option<&AtomicU64> {
        if h2.is_go_away() {
            Some(if h2.is_remote() {
                &self.goaway_received
            } else {
                &self.goaway_sent
            })
        } else if h2.is_reset() && h2.is_remote() {
            Some(&self.reset_by_peer)
        } else if h2.is_io() {
            Some(&self.broken)
        } else {
            None
        }
    }

    fn counter_for(&self, status: &Status) -> Option<&AtomicU64> {
        let mut source: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(status);
        while let Some(error) = source {
            if let Some(h2) = error.downcast_ref::<h2::Error>() {
                return self.h2_counter(h2);
            }
            if let Some(hyper) = error.downcast_ref::<hyper::Error>()
                && (hyper.is_closed() || hyper.is_incomplete_message() || hyper.is_canceled())
            {
                return Some(&self.broken);
            }
            if error.is::<io::Error>() {
                // A failed connect or a broken socket, below HTTP/2.
                return Some(&self.broken);
            }
            source = error.source();
        }
        None
    }
}

/// Streams a peer may reset before the server has taken them up, per
/// connection: h2's default (20) guards a public server against a "rapid
/// reset" flood by ending the connection, which a busy machine triggers
/// from a well-behaved tailmesh caller (a hedge's loser, a call given up at
/// its deadline), failing every other call on the connection. Every peer
/// of a tailmesh server is tailmesh's own, so the bound is high.
const PENDING_ACCEPT_RESETS: usize = 65_536;

/// The gRPC server every tailmesh service (hop, broker) runs: no limit of
/// HTTP/2's that a caller under stress could trip and lose its connection
/// over.
pub(crate) fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_max_pending_accept_reset_streams(Some(PENDING_ACCEPT_RESETS))
        .http2_max_local_error_reset_streams(None)
}

/// The endpoint every tailmesh client uses for `uri`.
pub fn endpoint(uri: Uri, connect_timeout: Duration) -> Endpoint {
    Endpoint::from(uri)
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout)
        .http2_max_local_error_reset_streams(None)
}

/// A channel on `endpoint` that connects on first use, its connections
/// counted in `events`.
pub(crate) fn connect_lazy(endpoint: &Endpoint, events: &Arc<LinkEvents>) -> Channel {
    endpoint.connect_with_connector_lazy(Counting::new(events))
}

/// A channel on `endpoint`, connected now, its connections counted in
/// `events`; TLS over them when this process has a client config
/// ([`crate::tls::install_client`]).
pub async fn connect(
    endpoint: &Endpoint,
    events: &Arc<LinkEvents>,
) -> Result<Channel, tonic::transport::Error> {
    endpoint.connect_with_connector(Counting::new(events)).await
}

/// A TCP connector that counts the connections it opens and, through
/// [`Counted`], the ones that end.
#[derive(Clone)]
struct Counting {
    http: HttpConnector,
    events: Arc<LinkEvents>,
    /// The process's client TLS when the channel was made.
    tls: Option<Arc<ClientConfig>>,
}

impl Counting {
    fn new(events: &Arc<LinkEvents>) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        Counting {
            http,
            events: Arc::clone(events),
            tls: crate::tls::client(),
        }
    }
}

impl tower::Service<Uri> for Counting {
    type Response = TokioIo<Counted>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<TokioIo<Counted>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let host = uri.host().unwrap_or_default().to_owned();
        let connecting = self.http.call(uri);
        let events = Arc::clone(&self.events);
        let tls = self.tls.clone();
        Box::pin(async move {
            let io = connecting.await?;
            Ok(TokioIo::new(
                open(io.into_inner(), tls, &host, &events).await?,
            ))
        })
    }
}

/// A client's connection `tcp` to `host`, counted opened in `events` (and
/// closed when it drops); with `tls`, TLS over it, its handshake counted
/// full or resumed. A failed handshake counts the connection closed.
pub(crate) async fn open(
    tcp: TcpStream,
    tls: Option<Arc<ClientConfig>>,
    host: &str,
    events: &Arc<LinkEvents>,
) -> io::Result<Counted> {
    events.opened.fetch_add(1, Ordering::Relaxed);
    let closed = ClosedOnDrop(Arc::clone(events));
    let io = match tls {
        None => Io::Tcp(tcp),
        Some(config) => {
            let (stream, kind) = crate::tls::connect(tcp, config, host).await?;
            let counter = match kind {
                HandshakeKind::Resumed => &events.tls_resumed,
                HandshakeKind::Full | HandshakeKind::FullWithHelloRetryRequest => &events.tls_full,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Io::Tls(Box::new(stream))
        }
    };
    Ok(Counted {
        io,
        _closed: closed,
    })
}

/// Counts a connection closed when dropped: held from the moment it is
/// counted opened, so a handshake that fails or is given up still counts.
struct ClosedOnDrop(Arc<LinkEvents>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// A client connection's bytes: plain TCP or TLS over it.
enum Io {
    Tcp(TcpStream),
    Tls(Box<crate::tls::ClientStream>),
}

/// A connection that counts itself closed when it is dropped: for h2
/// directly, and for hyper (tonic's channels) through [`TokioIo`].
pub(crate) struct Counted {
    io: Io,
    _closed: ClosedOnDrop,
}

/// Forwards a call to whichever stream an [`Io`] holds.
macro_rules! forward {
    ($io:expr, $s:ident => $call:expr) => {
        match $io {
            Io::Tcp($s) => $call,
            Io::Tls($s) => $call,
        }
    };
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        forward!(&mut self.io, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        forward!(&mut self.io, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        forward!(&mut self.io, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        forward!(&mut self.io, s => Pin::new(s).poll_shutdown(cx))
    }

    fn is_write_vectored(&self) -> bool {
        forward!(&self.io, s => s.is_write_vectored())
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        forward!(&mut self.io, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }
}
