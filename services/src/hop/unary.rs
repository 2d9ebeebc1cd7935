//! `tailmesh.v1.Hop/Call` over HTTP/2 directly with h2: the client every
//! push caller uses (the load generator and each hop's downstream calls),
//! and, with its bytes framed by the caller ([`Link::call_framed`],
//! [`Link::call_streaming`]), a service hop's one call of its service's
//! method, unary or streaming.
//!
//! A tonic channel hands each call through three tasks before it reaches
//! the socket and back (its buffer's worker, hyper's connection task, and a
//! task hyper spawns per request to wait for the answer), and hyper writes
//! a request's HEADERS and DATA in separate socket writes, because the body
//! waits for flow-control capacity that the connection task assigns only
//! after it has sent the HEADERS. Here the calling task itself opens the
//! stream, queues HEADERS and the one DATA frame (END_STREAM) together, and
//! awaits the answer; h2's connection task, the only other task, writes both
//! frames in one go and wakes the caller when the answer is in. What goes
//! on the wire is the same gRPC a tonic client sends (the hop's server is
//! tonic), and the answer's status is read the way tonic reads it.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::{Ping, PingPong, client::SendRequest};
use prost::Message;
use tailmesh_proto::pb::{CallReply, CallRequest, TraceContext};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    task::AbortHandle,
};
use tonic::{
    Code, Status,
    codegen::http::{self, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, header},
};

use crate::{
    addr::PeerAddr,
    limits::MAX_CALL_MESSAGE_BYTES,
    link::{self, LinkEvents},
};

/// The method's path.
const PATH: &str = "/tailmesh.v1.Hop/Call";
/// The stream methods' paths.
const STREAM_PATH: &str = "/tailmesh.v1.Hop/Stream";
const SERVER_STREAM_PATH: &str = "/tailmesh.v1.Hop/ServerStream";
const CLIENT_STREAM_PATH: &str = "/tailmesh.v1.Hop/ClientStream";
/// The gRPC message prefix: a compression flag and a 4-byte length.
pub(crate) const PREFIX: usize = 5;
/// The deadline's header.
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// The W3C trace context's header.
const TRACEPARENT: HeaderName = HeaderName::from_static(crate::telemetry::context::TRACEPARENT);

/// HTTP/2 settings of every connection: hyper's client defaults, which a
/// tonic channel used before.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const MAX_FRAME: u32 = 16 * 1024;
const MAX_SEND_BUFFER: usize = 1024 * 1024;

/// An open connection: its number and its request handle.
type Open = (u64, SendRequest<Bytes>);

/// What a link tells its watcher about its connections.
#[derive(Debug)]
pub(crate) enum LinkState<'a> {
    /// A connection opened (TCP and the HTTP/2 handshake).
    Connected,
    /// Opening one failed (refused, timed out, handshake failed).
    ConnectFailed(&'a Status),
    /// The open connection ended (GOAWAY, EOF, an I/O error), for this
    /// reason.
    Ended(String),
    /// A keepalive PING went unanswered: the connection was dropped.
    KeepaliveTimeout,
}

/// Who hears of a link's connection states (the pool's endpoint health).
pub(crate) type Watch = Arc<dyn Fn(LinkState<'_>) + Send + Sync>;

/// HTTP/2 keepalive on a link's connections: a PING every `every`, and
/// the connection deemed dead when one is unanswered after `timeout`; a
/// peer that stops answering (a black hole) is noticed within
/// `every + timeout` of its last answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keepalive {
    pub(crate) every: Duration,
    pub(crate) timeout: Duration,
}

/// Why a call on a link failed: before the request left (its connection
/// could not be had: another replica may take it), or after.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// Nothing was sent.
    Unsent(Status),
    /// The request left, or could not be made at all.
    Failed(Status),
}

/// One HTTP/2 connection to one replica, opened on first use and again
/// after it ends; calls on it are multiplexed.
pub(crate) struct Link {
    addr: PeerAddr,
    uri: Uri,
    connect_timeout: Duration,
    events: Arc<LinkEvents>,
    /// TLS over each connection, when the mesh runs it.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The open connection's request handle, with a number telling this
    /// connection from the ones before it (so one that ended clears only
    /// itself).
    open: Arc<Mutex<Option<Open>>>,
    /// Held while connecting, so concurrent first calls open one
    /// connection, not one each.
    connecting: tokio::sync::Mutex<u64>,
    /// The headers every call carries, built once and cloned per call.
    headers: HeaderMap,
    /// The last deadline sent and its `grpc-timeout` value: the load
    /// generator's calls all carry the same one, formatted once.
    last_timeout: Mutex<Option<(Duration, HeaderValue)>>,
    watch: Option<Watch>,
    keepalive: Option<Keepalive>,
    /// The task driving the latest connection: aborted when the link
    /// drops, so no connection outlives its link.
    driver: Mutex<Option<AbortHandle>>,
    /// The latest connection's PINGs, when the keepalive does not use them.
    spare_ping: Mutex<Option<PingPong>>,
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(driver) = self
            .driver
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            driver.abort();
        }
    }
}

impl Link {
    /// A link to `addr`, with TLS when `tls` is given; nothing is
    /// connected yet.
    pub(crate) fn new(
        addr: PeerAddr,
        connect_timeout: Duration,
        events: &Arc<LinkEvents>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Self, http::uri::InvalidUri> {
        Self::for_method(addr, PATH, connect_timeout, events, tls)
    }

    /// A link to `addr` whose calls go to the method at `path`
    /// (`/package.Service/Method`); nothing is connected yet.
    pub(crate) fn for_method(
        addr: PeerAddr,
        path: &str,
        connect_timeout: Duration,
        events: &Arc<LinkEvents>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<Self, http::uri::InvalidUri> {
        let uri = format!("{}{path}", addr.uri()).parse()?;
        let mut headers = HeaderMap::with_capacity(4);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        Ok(Link {
            addr,
            uri,
            connect_timeout,
            events: Arc::clone(events),
            tls,
            open: Arc::default(),
            connecting: tokio::sync::Mutex::new(0),
            headers,
            last_timeout: Mutex::new(None),
            watch: None,
            keepalive: None,
            driver: Mutex::new(None),
            spare_ping: Mutex::new(None),
        })
    }

    /// The link with `headers` sent with every call too (a service's
    /// metadata), after the ones gRPC needs.
    pub(crate) fn with_headers(
        mut self,
        headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
    ) -> Self {
        for (name, value) in headers {
            self.headers.append(name, value);
        }
        self
    }

    /// The link with `watch` told of its connections' states and
    /// `keepalive` on them.
    pub(crate) fn watched(mut self, watch: Option<Watch>, keepalive: Option<Keepalive>) -> Self {
        self.watch = watch;
        self.keepalive = keepalive;
        self
    }

    /// Opens a connection if there is none and checks that the peer
    /// answers a PING within `within`: the HTTP/2 handshake completes
    /// without a word from the peer, so a black-holed replica would pass
    /// for a live one without it (the reconnect probe's check).
    pub(crate) async fn connect_checked(&self, within: Duration) -> Result<(), Status> {
        self.sender().await?;
        let spare = self
            .spare_ping
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(mut ping) = spare else {
            return Ok(());
        };
        match tokio::time::timeout(within, ping.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => Ok(()),
            Ok(Err(e)) => Err(Status::unavailable(format!(
                "connect to {}: connection failed: {e}",
                self.addr
            ))),
            Err(_) => Err(Status::unavailable(format!(
                "connect to {}: no answer to a PING within {within:?}",
                self.addr
            ))),
        }
    }

    /// One call of a tailmesh hop: `timeout` becomes its `grpc-timeout`,
    /// `trace` (the trace context) the request's field of that name. The
    /// caller bounds the wait.
    pub(crate) async fn call(
        &self,
        request: &CallRequest,
        timeout: Option<Duration>,
        trace: Option<TraceContext>,
    ) -> Result<CallReply, LinkError> {
        let body = encode_call(request, trace.as_ref()).map_err(LinkError::Failed)?;
        let (_, message) = self
            .call_framed(body, timeout, None, HeaderMap::new())
            .await?;
        CallReply::decode(message)
            .map_err(|e| LinkError::Failed(Status::internal(format!("decode the answer: {e}"))))
    }

    /// One call of `body`, one gRPC message already framed ([`frame`]):
    /// the answer's headers and its message, unframed and not decoded, or
    /// its status. `timeout` becomes its `grpc-timeout`, `traceparent` its
    /// header of that name, and `extra` is sent after the link's own
    /// headers. The caller bounds the wait.
    pub(crate) async fn call_framed(
        &self,
        body: Bytes,
        timeout: Option<Duration>,
        traceparent: Option<HeaderValue>,
        extra: HeaderMap,
    ) -> Result<(HeaderMap, Bytes), LinkError> {
        let answer = self.send_framed(body, timeout, traceparent, extra).await?;
        self.read_reply(answer).await.map_err(LinkError::Failed)
    }

    /// [`Link::call_framed`] of a streaming method: `body` holds every
    /// request message, framed, and the request side closes after it;
    /// each reply message, unframed and not decoded, goes to `each` as it
    /// comes (its error ends the call, the stream reset). The answer's
    /// headers once it ended with status OK, or its status.
    pub(crate) async fn call_streaming(
        &self,
        body: Bytes,
        timeout: Option<Duration>,
        traceparent: Option<HeaderValue>,
        extra: HeaderMap,
        each: impl FnMut(Bytes) -> Result<(), Status>,
    ) -> Result<HeaderMap, LinkError> {
        let answer = self.send_framed(body, timeout, traceparent, extra).await?;
        self.read_messages(answer, each)
            .await
            .map_err(LinkError::Failed)
    }

    /// Sends `body` as a whole request (see [`Link::call_framed`]) and
    /// awaits the answer's head.
    async fn send_framed(
        &self,
        body: Bytes,
        timeout: Option<Duration>,
        traceparent: Option<HeaderValue>,
        extra: HeaderMap,
    ) -> Result<http::Response<h2::RecvStream>, LinkError> {
        let mut http = Request::new(());
        *http.method_mut() = Method::POST;
        *http.uri_mut() = self.uri.clone();
        let headers = http.headers_mut();
        *headers = self.headers.clone();
        headers.extend(extra);
        if let Some(value) = traceparent {
            headers.insert(TRACEPARENT, value);
        }
        if let Some(t) = timeout {
            headers.insert(GRPC_TIMEOUT, self.timeout_value(t));
        }

        let (generation, mut send) = self.ready().await.map_err(LinkError::Unsent)?;
        let (answer, mut stream) = send
            .send_request(http, false)
            .map_err(|e| LinkError::Unsent(self.lost(generation, e)))?;
        let sent = async {
            stream
                .send_data(body, true)
                .map_err(|e| self.transport(e))?;
            answer.await.map_err(|e| self.transport(e))
        };
        sent.await.map_err(LinkError::Failed)
    }

    /// Opens a `Hop.Stream`, `Hop.ServerStream` or `Hop.ClientStream`, as
    /// `opening` says, on this link's connection (connecting first if
    /// there is none): the answer to come, and the request's body, to which
    /// the caller writes its messages (a server stream's one request). The stream's deadline,
    /// if any, is each message's own.
    pub(crate) async fn open_stream(
        &self,
        opening: &super::stream::Opening,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), Status> {
        use super::stream::Opening;
        let path = match opening {
            Opening::Bidi => STREAM_PATH,
            Opening::Server(_) => SERVER_STREAM_PATH,
            Opening::Client => CLIENT_STREAM_PATH,
        };
        let mut http = Request::new(());
        *http.method_mut() = Method::POST;
        *http.uri_mut() = format!("{}{path}", self.addr.uri())
            .parse()
            .map_err(|e| Status::internal(format!("the stream's address: {e}")))?;
        *http.headers_mut() = self.headers.clone();
        let (generation, mut send) = self.ready().await?;
        send.send_request(http, false)
            .map_err(|e| self.lost(generation, e))
    }

    /// The events this link counts its connections' failures in.
    pub(crate) fn events(&self) -> &Arc<LinkEvents> {
        &self.events
    }

    /// `grpc-timeout` for `t`, formatted again only when it changed.
    fn timeout_value(&self, t: Duration) -> HeaderValue {
        let mut last = self.last_timeout.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some((sent, value)) if *sent == t => value.clone(),
            _ => {
                let value = grpc_timeout_value(t);
                *last = Some((t, value.clone()));
                value
            }
        }
    }

    /// A handle ready for a new stream, with its connection's number: on
    /// the open connection, or on a new one if that one has just ended (a
    /// replica that restarted). The request has not left yet, so trying
    /// again sends nothing twice; a second failure is the call's.
    async fn ready(&self) -> Result<Open, Status> {
        let (generation, send) = self.sender().await?;
        match send.ready().await {
            Ok(send) => Ok((generation, send)),
            Err(e) => {
                // Counted, and the connection forgotten; the status is not
                // the call's.
                let _ = self.lost(generation, e);
                let (generation, send) = self.sender().await?;
                let send = send.ready().await.map_err(|e| self.lost(generation, e))?;
                Ok((generation, send))
            }
        }
    }

    /// The open connection's number and handle, connecting first if there
    /// is none.
    async fn sender(&self) -> Result<Open, Status> {
        if let Some(open) = self.current() {
            return Ok(open);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(open) = self.current() {
            return Ok(open);
        }
        *generation += 1;
        let connected = self.connect(*generation).await;
        if let Some(watch) = &self.watch {
            match &connected {
                Ok(_) => watch(LinkState::Connected),
                Err(status) => watch(LinkState::ConnectFailed(status)),
            }
        }
        Ok((*generation, connected?))
    }

    fn current(&self) -> Option<Open> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.clone()
    }

    /// Opens connection number `generation` and runs it on its own task,
    /// which forgets it when it ends.
    async fn connect(&self, generation: u64) -> Result<SendRequest<Bytes>, Status> {
        let unavailable = |what: String| {
            self.events.count_broken();
            Status::unavailable(format!("connect to {}: {what}", self.addr))
        };
        let tcp = match tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect(self.addr.to_string()),
        )
        .await
        {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => return Err(unavailable(e.to_string())),
            Err(_) => {
                return Err(unavailable(format!(
                    "no connection within {:?}",
                    self.connect_timeout
                )));
            }
        };
        // Without it every call would wait for the peer's delayed ACK.
        tcp.set_nodelay(true)
            .map_err(|e| unavailable(format!("TCP_NODELAY: {e}")))?;
        let io = match tokio::time::timeout(
            self.connect_timeout,
            link::open(tcp, self.tls.clone(), self.addr.host(), &self.events),
        )
        .await
        {
            Ok(Ok(io)) => io,
            Ok(Err(e)) => return Err(unavailable(format!("TLS: {e}"))),
            Err(_) => return Err(unavailable("no TLS handshake in time".to_owned())),
        };
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .enable_push(false)
            // See the `link` module: tailmesh's clients keep their
            // connections whatever the system under test does.
            .max_local_error_reset_streams(None)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| unavailable(format!("HTTP/2 handshake: {e}")))?;
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation, send.clone()));
        self.drive(generation, connection);
        Ok(send)
    }

    /// Runs connection number `generation` on its own task, with the
    /// keepalive if any; when it ends, forgets it and tells the watcher.
    fn drive<T>(&self, generation: u64, mut connection: h2::client::Connection<T, Bytes>)
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let open = Arc::clone(&self.open);
        let watch = self.watch.clone();
        let ping = connection.ping_pong();
        let keepalive = match self.keepalive {
            Some(k) => ping.map(|ping| (ping, k)),
            None => {
                *self.spare_ping.lock().unwrap_or_else(|e| e.into_inner()) = ping;
                None
            }
        };
        let task = tokio::spawn(async move {
            // An error here also fails the calls on the connection, which
            // count it; the connection's end is counted when `io` drops.
            let ended = match keepalive {
                None => Some((&mut connection).await),
                Some((ping, keepalive)) => {
                    tokio::select! {
                        ended = &mut connection => Some(ended),
                        () = keep_alive(ping, keepalive) => None,
                    }
                }
            };
            // Dropped here on a keepalive timeout: its calls fail.
            drop(connection);
            {
                let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
                if open.as_ref().is_some_and(|(g, _)| *g == generation) {
                    *open = None;
                }
            }
            if let Some(watch) = watch {
                watch(match ended {
                    None => LinkState::KeepaliveTimeout,
                    Some(Ok(())) => LinkState::Ended("connection closed by the replica".into()),
                    Some(Err(e)) => LinkState::Ended(format!("connection ended: {e}")),
                });
            }
        });
        let previous = self
            .driver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(task.abort_handle());
        // The previous connection ended or was given up: its task is done
        // or about to be.
        drop(previous);
    }

    /// The answer's message, or its status: in the headers of a
    /// trailers-only answer, else in the trailers.
    async fn read_reply(
        &self,
        answer: http::Response<h2::RecvStream>,
    ) -> Result<(HeaderMap, Bytes), Status> {
        let (head, mut body) = answer.into_parts();
        head_status(&head)?;
        let mut message = Bytes::new();
        let mut gathered: Option<BytesMut> = None;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| self.transport(e))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            match &mut gathered {
                Some(buf) => buf.extend_from_slice(&chunk),
                None if message.is_empty() => message = chunk,
                None => {
                    let mut buf = BytesMut::with_capacity(message.len() + chunk.len());
                    buf.extend_from_slice(&message);
                    buf.extend_from_slice(&chunk);
                    gathered = Some(buf);
                }
            }
            let len = gathered.as_ref().map_or(message.len(), BytesMut::len);
            if len > PREFIX + MAX_CALL_MESSAGE_BYTES {
                return Err(too_large(len - PREFIX));
            }
        }
        let trailers = body.trailers().await.map_err(|e| self.transport(e))?;
        end_status(&head.headers, trailers.as_ref())?;
        Ok((
            head.headers,
            unframe(gathered.map_or(message, BytesMut::freeze))?,
        ))
    }

    /// A streaming answer's messages, each unframed and handed to `each`
    /// as it comes, then its status: the answer's headers when OK.
    async fn read_messages(
        &self,
        answer: http::Response<h2::RecvStream>,
        mut each: impl FnMut(Bytes) -> Result<(), Status>,
    ) -> Result<HeaderMap, Status> {
        let (head, mut body) = answer.into_parts();
        head_status(&head)?;
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| self.transport(e))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            buf.extend_from_slice(&chunk);
            while let Some(message) = next_message(&mut buf)? {
                each(message)?;
            }
        }
        if !buf.is_empty() {
            return Err(Status::internal(format!(
                "the answer ended inside a message ({} bytes of it)",
                buf.len()
            )));
        }
        let trailers = body.trailers().await.map_err(|e| self.transport(e))?;
        end_status(&head.headers, trailers.as_ref())?;
        Ok(head.headers)
    }

    /// A failure before the request left: connection number `generation`
    /// is gone (or going), so forget it, unless another has replaced it
    /// already; the next call opens another.
    fn lost(&self, generation: u64, error: h2::Error) -> Status {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.as_ref().is_some_and(|(g, _)| *g == generation) {
            *open = None;
        }
        drop(open);
        self.transport(error)
    }

    /// A transport failure, counted and turned into the status a tonic
    /// client would answer with.
    fn transport(&self, error: h2::Error) -> Status {
        transport_status(&self.events, error)
    }
}

/// A transport failure on a connection whose failures `events` counts,
/// counted and turned into the status a tonic client would answer with.
pub(crate) fn transport_status(events: &LinkEvents, error: h2::Error) -> Status {
    events.note_h2(&error);
    let code = match error.reason() {
        _ if error.is_io() => Code::Unavailable,
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::NO_ERROR) if error.is_go_away() => Code::Unavailable,
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        Some(_) => Code::Internal,
        None if error.is_go_away() => Code::Unavailable,
        None => Code::Unknown,
    };
    Status::new(code, format!("h2 protocol error: {error}"))
}

/// An answer's head as gRPC reads it: a non-200 status, or a
/// trailers-only answer's non-OK `grpc-status`, is the call's failure.
pub(crate) fn head_status(head: &http::response::Parts) -> Result<(), Status> {
    if head.status != http::StatusCode::OK {
        return Err(http_status(head.status));
    }
    match Status::from_header_map(&head.headers) {
        Some(status) if status.code() != Code::Ok => Err(status),
        _ => Ok(()),
    }
}

/// How an answer ended: its trailers' `grpc-status`, or a trailers-only
/// answer's in its `headers`; none at all is INTERNAL.
pub(crate) fn end_status(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Result<(), Status> {
    match trailers.and_then(Status::from_header_map) {
        Some(status) if status.code() == Code::Ok => Ok(()),
        Some(status) => Err(status),
        None if Status::from_header_map(headers).is_some() => Ok(()),
        None => Err(Status::internal("the answer ended without a grpc-status")),
    }
}

/// The next whole gRPC message at the front of `buf`, unframed and taken
/// out of it (`None`: not all of it is in yet).
pub(crate) fn next_message(buf: &mut BytesMut) -> Result<Option<Bytes>, Status> {
    if buf.len() < PREFIX {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf[0] != 0 {
        return Err(Status::internal(
            "a message of the answer is compressed, which was not asked for",
        ));
    }
    if len > MAX_CALL_MESSAGE_BYTES {
        return Err(too_large(len));
    }
    if buf.len() < PREFIX + len {
        return Ok(None);
    }
    buf.advance(PREFIX);
    Ok(Some(buf.split_to(len).freeze()))
}

/// Pings every `every` until a PING goes unanswered for `timeout`, then
/// returns; if the connection fails first, waits for its end to be seen.
async fn keep_alive(mut ping: PingPong, keepalive: Keepalive) {
    loop {
        tokio::time::sleep(keepalive.every).await;
        match tokio::time::timeout(keepalive.timeout, ping.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_) => return,
        }
    }
}

/// The request as one gRPC message: the prefix, then the protobuf.
pub(crate) fn encode(request: &impl Message) -> Result<Bytes, Status> {
    encode_with(request, 0, |_| {})
}

/// `CallRequest.trace`'s field number in hop.proto.
const TRACE_FIELD: u32 = 13;

/// A call's request as one gRPC message, `trace` as its `trace` field:
/// encoded after the request's own fields, so the request is not copied
/// to set it (protobuf merges a message field met again; the callers'
/// requests have none).
pub(crate) fn encode_call(
    request: &CallRequest,
    trace: Option<&TraceContext>,
) -> Result<Bytes, Status> {
    let Some(trace) = trace else {
        return encode(request);
    };
    encode_with(
        request,
        prost::encoding::message::encoded_len(TRACE_FIELD, trace),
        |buf| prost::encoding::message::encode(TRACE_FIELD, trace, buf),
    )
}

/// `request` as one gRPC message, followed by `extra` bytes that `after`
/// writes.
fn encode_with(
    request: &impl Message,
    extra: usize,
    after: impl FnOnce(&mut BytesMut),
) -> Result<Bytes, Status> {
    let len = request.encoded_len() + extra;
    if len > MAX_CALL_MESSAGE_BYTES {
        return Err(Status::out_of_range(format!(
            "the request is {len} bytes, over the limit of {MAX_CALL_MESSAGE_BYTES}"
        )));
    }
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    // Within MAX_CALL_MESSAGE_BYTES, so within u32.
    buf.put_u32(len as u32);
    request
        .encode(&mut buf)
        .map_err(|e| Status::internal(format!("encode the request: {e}")))?;
    after(&mut buf);
    Ok(buf.freeze())
}

/// An encoded message as one gRPC message: the prefix (uncompressed, its
/// length), then the bytes; `None` over [`MAX_CALL_MESSAGE_BYTES`].
pub(crate) fn frame(message: &[u8]) -> Option<Bytes> {
    if message.len() > MAX_CALL_MESSAGE_BYTES {
        return None;
    }
    let mut buf = BytesMut::with_capacity(PREFIX + message.len());
    buf.put_u8(0);
    // Within MAX_CALL_MESSAGE_BYTES, so within u32.
    buf.put_u32(message.len() as u32);
    buf.extend_from_slice(message);
    Some(buf.freeze())
}

/// The one message of an answer's body, its prefix checked and removed.
fn unframe(mut body: Bytes) -> Result<Bytes, Status> {
    if body.len() < PREFIX {
        return Err(Status::internal(
            "the answer has grpc-status OK but no message",
        ));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err(Status::internal(
            "the answer is compressed, which was not asked for",
        ));
    }
    if len > MAX_CALL_MESSAGE_BYTES {
        return Err(too_large(len));
    }
    if body.len() != len {
        return Err(Status::internal(format!(
            "the answer's message says {len} bytes, its body holds {}",
            body.len()
        )));
    }
    Ok(body)
}

pub(crate) fn too_large(len: usize) -> Status {
    Status::out_of_range(format!(
        "the answer is {len} bytes, over the limit of {MAX_CALL_MESSAGE_BYTES}"
    ))
}

/// A non-200 answer, mapped as gRPC over HTTP says (and tonic does).
pub(crate) fn http_status(status: http::StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP status {status} instead of 200"))
}

/// `grpc-timeout` for `t`: the finest unit whose value fits in the 8 digits
/// the header allows.
fn grpc_timeout_value(t: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let (n, unit) = [
        (t.as_nanos(), 'n'),
        (t.as_micros(), 'u'),
        (t.as_millis(), 'm'),
        (u128::from(t.as_secs()), 'S'),
        (u128::from(t.as_secs() / 60), 'M'),
    ]
    .into_iter()
    .find(|(n, _)| *n <= MAX)
    .unwrap_or(((u128::from(t.as_secs() / 3600)).min(MAX), 'H'));
    HeaderValue::from_str(&format!("{n}{unit}")).unwrap_or(HeaderValue::from_static("99999999H"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::parse_grpc_timeout;

    #[test]
    fn grpc_timeouts_round_trip_at_the_finest_unit_that_fits() {
        for (t, text) in [
            (Duration::from_millis(50), "50000000n"),
            (Duration::from_millis(150), "150000u"),
            (Duration::from_secs(2), "2000000u"),
            (Duration::from_secs(500), "500000m"),
            (Duration::from_secs(200_000), "200000S"),
        ] {
            let value = grpc_timeout_value(t);
            assert_eq!(value.to_str().ok(), Some(text), "{t:?}");
            assert_eq!(parse_grpc_timeout(text), Some(t), "{t:?}");
        }
    }

    #[test]
    fn a_calls_trace_context_is_its_trace_field() {
        let request = CallRequest {
            request_id: 7,
            caller: "a".into(),
            payload: Bytes::from_static(b"xyz"),
            ..CallRequest::default()
        };
        let trace = TraceContext {
            trace_id_high: 1,
            trace_id_low: 2,
            span_id: 3,
            sampled: true,
        };
        let decode = |framed: Bytes| {
            let message = unframe(framed).expect("one message");
            CallRequest::decode(message).expect("a CallRequest")
        };
        let traced = decode(encode_call(&request, Some(&trace)).expect("encoded"));
        assert_eq!(traced.trace, Some(trace));
        assert_eq!(
            CallRequest {
                trace: None,
                ..traced
            },
            request
        );
        assert_eq!(
            decode(encode_call(&request, None).expect("encoded")),
            request
        );
    }

    #[test]
    fn a_message_round_trips_through_the_framing() {
        let sent = CallReply {
            request_id: 7,
            payload: Bytes::from_static(b"abc"),
            ..CallReply::default()
        };
        let framed = encode(&sent).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(framed[0], 0);
        assert_eq!(framed.len(), PREFIX + sent.encoded_len());
        let message = unframe(framed).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(CallReply::decode(message).ok(), Some(sent.clone()));
        let again = frame(&sent.encode_to_vec()).unwrap_or_else(|| panic!("within the limit"));
        assert_eq!(again, encode(&sent).unwrap_or_else(|e| panic!("{e}")));
    }

    #[test]
    fn a_streams_compressed_or_oversized_message_is_refused() {
        let mut compressed = BytesMut::from(&[1u8, 0, 0, 0, 1, 0][..]);
        assert_eq!(
            next_message(&mut compressed).map_err(|s| s.code()),
            Err(Code::Internal)
        );
        let len = (MAX_CALL_MESSAGE_BYTES as u32 + 1).to_be_bytes();
        let mut large = BytesMut::from(&[0u8, len[0], len[1], len[2], len[3]][..]);
        assert_eq!(
            next_message(&mut large).map_err(|s| s.code()),
            Err(Code::OutOfRange)
        );
    }

    #[test]
    fn a_truncated_or_compressed_answer_is_refused() {
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0]))
                .err()
                .map(|s| s.code()),
            Some(Code::Internal)
        );
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0, 0, 9, 1]))
                .err()
                .map(|s| s.code()),
            Some(Code::Internal)
        );
        assert_eq!(
            unframe(Bytes::from_static(&[1, 0, 0, 0, 0]))
                .err()
                .map(|s| s.code()),
            Some(Code::Internal)
        );
    }
}
