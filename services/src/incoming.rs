//! The connections a server accepts: [`Incoming`], the stream the hop and
//! the broker hand to tonic instead of its `TcpIncoming`, and [`Secured`],
//! the same connections through a TLS handshake each when the mesh runs
//! TLS ([`accept`] builds both).
//!
//! Three things tonic's stream does not do: an accept error (out of file
//! descriptors, most often) is retried after a growing pause instead of at
//! once, which spun a core; those errors are
//! logged, at most once a second, instead of only at trace level; and a
//! connection on which no byte moved for the idle timeout is closed, so
//! clients that hold connections without using them cannot keep the
//! descriptors forever. Accepted TCP connections get `TCP_NODELAY`.

use std::{
    fmt,
    io::{self, IoSlice},
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use futures::Stream;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    time::{Instant, Sleep},
};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Connected;

/// How long a connection may go without a byte read or written before the
/// server closes it: far longer than any gap between a live experiment's
/// requests, and than the orchestrator's Control connection waits between
/// setting a fault and clearing it in any shipped scenario (a fault lasts
/// at most its load: 4 to 15 s there); yet descriptors held by forgotten
/// clients come back within minutes. HTTP/2 keepalive pings count as
/// traffic, so a client that pings is never cut.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The first pause after an accept error, doubled after each error in a
/// row up to [`BACKOFF_MAX`]: short, so a one-off error (a handshake its
/// client aborted) barely delays the connections behind it.
pub const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest pause between accept attempts: out of descriptors, ten
/// tries a second cost nothing, and a connection waiting in the backlog is
/// taken within 100 ms of a descriptor coming free.
pub const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// At most one log line per this much time about accept errors.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Accepted connections, each closed once idle for the idle timeout (see
/// [`IdleTimeout`]); accept errors are logged and retried with backoff,
/// never handed on (hence the [`std::convert::Infallible`] error type).
pub struct Incoming<S> {
    accept: S,
    /// Names the server in log lines (`hop "a" replica 0 on 127.0.0.1:4100`).
    name: String,
    idle_timeout: Duration,
    /// Set while pausing after an accept error.
    pause: Option<Pin<Box<Sleep>>>,
    next_pause: Duration,
    log: ErrorLog,
}

impl Incoming<TcpAccept> {
    /// Accepts from `listener`, with `TCP_NODELAY` on every connection
    /// (Nagle would add delayed-ACK stalls to every hop). `name` says whose
    /// listener it is in log lines; the local address is added to it.
    pub fn tcp(listener: TcpListener, name: &str, idle_timeout: Duration) -> Self {
        let name = match listener.local_addr() {
            Ok(local) => format!("{name} on {local}"),
            Err(_) => name.to_owned(),
        };
        Self::new(
            TcpAccept(TcpListenerStream::new(listener)),
            name,
            idle_timeout,
        )
    }
}

impl<S> Incoming<S> {
    /// Accepts from `accept`, any stream of accept results (tests feed
    /// their own errors).
    pub fn new(accept: S, name: impl Into<String>, idle_timeout: Duration) -> Self {
        Incoming {
            accept,
            name: name.into(),
            idle_timeout,
            pause: None,
            next_pause: BACKOFF_MIN,
            log: ErrorLog::default(),
        }
    }
}

impl<S, IO> Stream for Incoming<S>
where
    S: Stream<Item = io::Result<IO>> + Unpin,
{
    type Item = Result<IdleTimeout<IO>, std::convert::Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = &mut this.pause {
                ready!(pause.as_mut().poll(cx));
                this.pause = None;
            }
            match ready!(Pin::new(&mut this.accept).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(io)) => {
                    this.next_pause = BACKOFF_MIN;
                    return Poll::Ready(Some(Ok(IdleTimeout::new(io, this.idle_timeout))));
                }
                Some(Err(error)) => {
                    let pause = this.next_pause;
                    this.next_pause = (pause * 2).min(BACKOFF_MAX);
                    if let Some(suppressed) = this.log.record(Instant::now()) {
                        let since = match suppressed {
                            0 => String::new(),
                            n => format!(" ({n} more accept errors since the last report)"),
                        };
                        tracing::error!(
                            "{}: accept: {error}; retrying in {pause:?}{since}",
                            this.name,
                        );
                    }
                    this.pause = Some(Box::pin(tokio::time::sleep(pause)));
                }
            }
        }
    }
}

impl<S> fmt::Debug for Incoming<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming")
            .field("name", &self.name)
            .field("idle_timeout", &self.idle_timeout)
            .field("pausing", &self.pause.is_some())
            .finish_non_exhaustive()
    }
}

/// A TCP listener's accept results, `TCP_NODELAY` set on each connection.
#[derive(Debug)]
pub struct TcpAccept(TcpListenerStream);

impl Stream for TcpAccept {
    type Item = io::Result<TcpStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = Pin::new(&mut self.0).poll_next(cx);
        if let Poll::Ready(Some(Ok(stream))) = &polled
            && let Err(e) = stream.set_nodelay(true)
        {
            // The connection still works, only with Nagle's delays.
            tracing::warn!("setting TCP_NODELAY on a connection accepted: {e}");
        }
        polled
    }
}

/// Says when an error may be logged: the first at once, then at most one
/// per [`LOG_INTERVAL`], each with the number kept quiet since the last.
#[derive(Debug, Default)]
struct ErrorLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl ErrorLog {
    /// Records an error at `now`; `Some(errors suppressed since the last
    /// line)` when this one is to be logged.
    fn record(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < LOG_INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// A connection that fails with [`io::ErrorKind::TimedOut`] once no byte
/// was read or written on it for its idle timeout; the server then drops
/// it, which closes it.
///
/// The clock is read on every transfer, the timer re-armed only when it
/// fires: a busy connection costs no timer operations.
pub struct IdleTimeout<IO> {
    io: IO,
    timeout: Duration,
    last_activity: Instant,
    timer: Pin<Box<Sleep>>,
}

impl<IO> IdleTimeout<IO> {
    /// Wraps `io`, idle from now.
    pub fn new(io: IO, timeout: Duration) -> Self {
        let now = Instant::now();
        IdleTimeout {
            io,
            timeout,
            last_activity: now,
            timer: Box::pin(tokio::time::sleep_until(now + timeout)),
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    fn touch(&mut self) {
        self.last_activity = Instant::now();
    }

    /// Ready with the error once the connection has been idle for its
    /// timeout; otherwise pending, with the timer set to wake `cx` then.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            ready!(self.timer.as_mut().poll(cx));
            let deadline = self.last_activity + self.timeout;
            if deadline <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "closing the connection: no byte read or written for {:?} (idle timeout)",
                        self.timeout
                    ),
                ));
            }
            self.timer.as_mut().reset(deadline);
        }
    }

    /// A transfer's result, with the idle check when it is pending: hyper
    /// always has a read or a write pending on a live connection, so the
    /// timer is always armed.
    fn after<T>(
        &mut self,
        polled: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.poll_idle(cx).map(Err),
            ready => ready,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleTimeout<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.touch();
        }
        this.after(polled, cx)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        this.after(polled, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        this.after(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.after(polled, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for IdleTimeout<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO> fmt::Debug for IdleTimeout<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleTimeout")
            .field("timeout", &self.timeout)
            .field("last_activity", &self.last_activity)
            .finish_non_exhaustive()
    }
}

/// How long a client may take over its TLS handshake before the server
/// drops the connection: a client that connects and never speaks holds no
/// slot for longer.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// An accepted connection: plain, or TLS once its handshake is done.
pub enum ServerIo<IO> {
    Plain(IO),
    Tls(Box<tokio_rustls::server::TlsStream<IO>>),
}

/// Forwards a call to whichever stream a [`ServerIo`] holds.
macro_rules! forward {
    ($io:expr, $s:ident => $call:expr) => {
        match $io {
            ServerIo::Plain($s) => $call,
            ServerIo::Tls($s) => $call,
        }
    };
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for ServerIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ServerIo<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        forward!(self, s => s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        forward!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}

impl<IO: Connected> Connected for ServerIo<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            ServerIo::Plain(io) => io.connect_info(),
            ServerIo::Tls(tls) => tls.get_ref().0.connect_info(),
        }
    }
}

impl<IO> fmt::Debug for ServerIo<IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerIo::Plain(_) => "ServerIo::Plain",
            ServerIo::Tls(_) => "ServerIo::Tls",
        })
    }
}

type Handshake<IO> = Pin<Box<dyn Future<Output = Option<ServerIo<IO>>> + Send>>;

/// The connections of an [`Incoming`], through a TLS handshake each when
/// `tls` is given: handshakes run side by side, so one slow client delays
/// no other; a failed one (a plaintext client, a certificate the run's CA
/// did not sign) drops its connection, logged at debug level.
pub struct Secured<S, IO> {
    accept: S,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshakes: futures::stream::FuturesUnordered<Handshake<IO>>,
    accept_ended: bool,
}

impl<S, IO> Secured<S, IO> {
    /// `accept`'s connections, TLS ones if `tls` is given.
    pub fn new(accept: S, tls: Option<std::sync::Arc<rustls::ServerConfig>>) -> Self {
        Secured {
            accept,
            tls: tls.map(tokio_rustls::TlsAcceptor::from),
            handshakes: futures::stream::FuturesUnordered::new(),
            accept_ended: false,
        }
    }
}

impl<S, IO> Stream for Secured<S, IO>
where
    S: Stream<Item = Result<IO, std::convert::Infallible>> + Unpin,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Item = Result<ServerIo<IO>, std::convert::Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while !this.accept_ended {
            match Pin::new(&mut this.accept).poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => this.accept_ended = true,
                Poll::Ready(Some(Ok(io))) => match &this.tls {
                    None => return Poll::Ready(Some(Ok(ServerIo::Plain(io)))),
                    Some(acceptor) => {
                        let accepting = acceptor.accept(io);
                        this.handshakes.push(Box::pin(async move {
                            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, accepting).await {
                                Ok(Ok(tls)) => Some(ServerIo::Tls(Box::new(tls))),
                                Ok(Err(e)) => {
                                    tracing::debug!("TLS handshake refused: {e}");
                                    None
                                }
                                Err(_) => {
                                    tracing::debug!("TLS handshake not done in time");
                                    None
                                }
                            }
                        }));
                    }
                },
                Poll::Ready(Some(Err(never))) => match never {},
            }
        }
        loop {
            match Pin::new(&mut this.handshakes).poll_next(cx) {
                Poll::Ready(Some(Some(io))) => return Poll::Ready(Some(Ok(io))),
                Poll::Ready(Some(None)) => continue,
                Poll::Ready(None) if this.accept_ended => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S, IO> fmt::Debug for Secured<S, IO> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secured")
            .field("tls", &self.tls.is_some())
            .field("handshaking", &self.handshakes.len())
            .finish_non_exhaustive()
    }
}

/// A server's accepted connections on `listener` (see [`Incoming::tcp`]),
/// through TLS when `tls` is given.
pub fn accept(
    listener: TcpListener,
    name: &str,
    idle_timeout: Duration,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
) -> Secured<Incoming<TcpAccept>, IdleTimeout<TcpStream>> {
    Secured::new(Incoming::tcp(listener, name, idle_timeout), tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn error_log_says_the_first_error_then_one_a_second_with_the_count() {
        let mut log = ErrorLog::default();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        assert_eq!(log.record(at(0)), Some(0));
        assert_eq!(log.record(at(10)), None);
        assert_eq!(log.record(at(999)), None);
        assert_eq!(log.record(at(1000)), Some(2));
        assert_eq!(log.record(at(1500)), None);
        assert_eq!(log.record(at(5000)), Some(1));
    }
}
