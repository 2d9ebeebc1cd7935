//! Streams of calls (`tailmesh.v1.Hop/Stream`): a caller's messages to a
//! streaming hop go on one HTTP/2 stream instead of one call each.
//!
//! - [`MessageStream`]: one open stream to one replica. Messages leave in
//!   the order they are given, each numbered; a reader task matches every
//!   reply to its message by number, so a message that timed out does not
//!   take a later one's answer. A message that failed at the hop comes
//!   back in band (its `code`) and the stream goes on; when the stream
//!   itself ends (the replica's status, a reset, a lost connection), every
//!   message waiting and every later one fails with that status.
//! - [`Streams`]: the streams one caller keeps while one of its own
//!   streams lasts (the load generator's stream, or the stream a hop
//!   serves), one per downstream hop, opened on its first message. A hop
//!   relaying a stream opens another when one to a replica broke, as a
//!   client of a live stream would; the load generator does not: its
//!   stream is over, and its later messages are lost with it.
//!
//! Every layer of the call stack applies per message: the deadline, the
//! client span and the policy (a retry is the message sent again, under
//! another number).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use tailmesh_proto::pb::{CallReply, CallRequest};
use tokio::{sync::oneshot, task::AbortHandle};
use tonic::{Code, Status};

use super::unary::{PREFIX, encode, http_status, too_large, transport_status};
use crate::{limits::MAX_CALL_MESSAGE_BYTES, link::LinkEvents};

/// Which stream: a bidirectional one (`Hop.Stream`), whose replies are
/// matched to their messages by number, or a server stream
/// (`Hop.ServerStream`), whose messages the hop sends on its own, matched
/// by their ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bidi,
    Server,
}

/// What a stream's messages wait on.
#[derive(Default)]
struct Pending {
    /// Each message awaited and not yet answered, by its key (a bidi
    /// message's number, a server stream message's id).
    waiting: HashMap<u64, oneshot::Sender<Result<CallReply, Status>>>,
    /// A server stream's replies that came before anyone awaited them.
    early: HashMap<u64, Result<CallReply, Status>>,
    /// A server stream's messages given up (timed out): their replies,
    /// if they come, are dropped.
    abandoned: std::collections::HashSet<u64>,
    /// Why the stream ended, once it has.
    ended: Option<Status>,
    /// Whether it ended with status OK (a server stream that sent all its
    /// messages): not a broken stream.
    ended_ok: bool,
}

impl Pending {
    /// Ends the stream with `status`: every message waiting fails with it,
    /// and so will every later one.
    fn end(&mut self, status: Status) {
        let status = Status::new(
            status.code(),
            format!("the stream broke: {}", status.message()),
        );
        for (_, waiter) in self.waiting.drain() {
            let _ = waiter.send(Err(status.clone()));
        }
        self.ended.get_or_insert(status);
    }

    /// Hands `reply` to the message awaiting `key`; a server stream's
    /// reply nobody awaits yet is kept for its message.
    fn answer(&mut self, kind: Kind, key: u64, reply: Result<CallReply, Status>) {
        if let Some(waiter) = self.waiting.remove(&key) {
            let _ = waiter.send(reply);
        } else if kind == Kind::Server && !self.abandoned.remove(&key) {
            self.early.insert(key, reply);
        }
        // A bidi message that timed out has no waiter: its answer is late.
    }
}

/// One open `Hop.Stream` to one replica (see the module's documentation).
/// Dropping it ends the stream: its request side is closed, and its
/// reader stops.
pub struct MessageStream {
    kind: Kind,
    send: Mutex<h2::SendStream<Bytes>>,
    pending: Arc<Mutex<Pending>>,
    next: AtomicU64,
    reader: AbortHandle,
    /// What it answers for: `hop` replica `replica`, for errors.
    hop: Arc<str>,
    replica: usize,
    /// A connection of its own (`connection = "per-request"`), kept open
    /// as long as the stream.
    _own: Option<Box<dyn Send + Sync>>,
}

impl Drop for MessageStream {
    fn drop(&mut self) {
        let mut send = self.send.lock().unwrap_or_else(|e| e.into_inner());
        // The request side ends; a stream already reset refuses, which is
        // fine: it is over either way.
        let _ = send.send_data(Bytes::new(), true);
        drop(send);
        self.reader.abort();
    }
}

impl MessageStream {
    /// A stream to `hop`'s replica `replica`, opened: `answer` is its
    /// answer to come, `send` its request side, `events` what counts its
    /// connection's failures, `own` a connection of its own to keep open.
    pub(crate) fn new(
        kind: Kind,
        hop: Arc<str>,
        replica: usize,
        answer: h2::client::ResponseFuture,
        send: h2::SendStream<Bytes>,
        events: Arc<LinkEvents>,
        own: Option<Box<dyn Send + Sync>>,
    ) -> Self {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let reader = tokio::spawn(read_answers(kind, answer, Arc::clone(&pending), events));
        MessageStream {
            kind,
            send: Mutex::new(send),
            pending,
            next: AtomicU64::new(0),
            reader: reader.abort_handle(),
            hop,
            replica,
            _own: own,
        }
    }

    /// Whether the stream has ended (its later messages would fail).
    pub fn ended(&self) -> bool {
        self.ended_with().is_some()
    }

    /// Why the stream broke, once it has (a server stream that sent all
    /// its messages did not).
    pub fn ended_with(&self) -> Option<Status> {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.ended.clone().filter(|_| !pending.ended_ok)
    }

    /// Sends `request` as the stream's next message and waits for its
    /// answer, within `timeout` when given (the hop is told what is left
    /// of it, as a unary call's `grpc-timeout`). The trace context current
    /// here goes with the message.
    pub async fn exchange(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        match self.kind {
            Kind::Bidi => self.send_and_await(request, timeout).await,
            Kind::Server => self.await_message(request.request_id, timeout).await,
        }
    }

    /// A server stream's message `id`, which its hop sends on its own:
    /// awaited within `timeout`.
    async fn await_message(&self, id: u64, timeout: Option<Duration>) -> Result<CallReply, Status> {
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(reply) = pending.early.remove(&id) {
                return reply.map_err(|status| self.named(status));
            }
            if let Some(status) = &pending.ended {
                let status = status.clone();
                return Err(self.named(status));
            }
            pending.waiting.insert(id, tx);
        }
        self.await_answer(id, rx, timeout).await
    }

    /// Sends `request` as the stream's next message and awaits its answer.
    async fn send_and_await(
        &self,
        mut request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        request.message = number;
        request.timeout_ns = timeout.map_or(0, |t| t.as_nanos().clamp(1, u64::MAX.into()) as u64);
        request.traceparent = crate::telemetry::context::current()
            .map(|cx| cx.traceparent())
            .unwrap_or_default();
        let body = encode(&request)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(status) = &pending.ended {
                return Err(self.named(status.clone()));
            }
            pending.waiting.insert(number, tx);
        }
        let sent = self
            .send
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send_data(body, false);
        if let Err(e) = sent {
            let status = Status::unavailable(format!("the stream could not take a message: {e}"));
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .end(status.clone());
        }
        self.await_answer(number, rx, timeout).await
    }

    /// The answer to the message awaited under `key` on `rx`, within
    /// `timeout` when given.
    async fn await_answer(
        &self,
        key: u64,
        rx: oneshot::Receiver<Result<CallReply, Status>>,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        let answer = async {
            match rx.await {
                Ok(answer) => answer,
                Err(_) => Err(Status::internal("the stream's reader stopped")),
            }
        };
        let answer = match timeout {
            Some(t) => match tokio::time::timeout(t, answer).await {
                Ok(answer) => answer,
                Err(_) => {
                    let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                    if pending.waiting.remove(&key).is_some() && self.kind == Kind::Server {
                        pending.abandoned.insert(key);
                    }
                    Err(Status::deadline_exceeded(format!(
                        "no answer to message {key} within {t:?}"
                    )))
                }
            },
            None => answer.await,
        };
        answer.map_err(|status| self.named(status))
    }

    /// `status` naming the hop and replica, as a push call's errors do.
    fn named(&self, status: Status) -> Status {
        let message = format!(
            "hop \"{}\" replica {} (stream): {}",
            self.hop,
            self.replica,
            status.message()
        );
        Status::new(status.code(), message)
    }
}

/// The answer's one reply as a message's result: an error sent in band is
/// the message's failure.
fn result_of(reply: CallReply) -> Result<CallReply, Status> {
    if reply.code == 0 {
        Ok(reply)
    } else {
        Err(Status::new(Code::from_i32(reply.code), reply.error))
    }
}

/// Reads a stream's answer: each reply to its message's waiter, then the
/// stream's end to every message still waiting.
async fn read_answers(
    kind: Kind,
    answer: h2::client::ResponseFuture,
    pending: Arc<Mutex<Pending>>,
    events: Arc<LinkEvents>,
) {
    let ended = read_replies(kind, answer, &pending, &events).await;
    let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
    match ended {
        Ok(()) => {
            pending.ended_ok = true;
            pending.end(Status::unavailable("the stream ended before its answer"));
        }
        Err(status) => pending.end(status),
    }
}

/// The replies of `answer`, each handed to its waiter, until its end:
/// `Ok` when the stream ended with status OK, else its status.
async fn read_replies(
    kind: Kind,
    answer: h2::client::ResponseFuture,
    pending: &Mutex<Pending>,
    events: &LinkEvents,
) -> Result<(), Status> {
    let answer = answer.await.map_err(|e| transport_status(events, e))?;
    let (head, mut body) = answer.into_parts();
    if head.status != tonic::codegen::http::StatusCode::OK {
        return Err(http_status(head.status));
    }
    if let Some(status) = Status::from_header_map(&head.headers)
        && status.code() != Code::Ok
    {
        return Err(status);
    }
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| transport_status(events, e))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while let Some(message) = next_message(&mut buf)? {
            let reply = CallReply::decode(message)
                .map_err(|e| Status::internal(format!("decode a reply on the stream: {e}")))?;
            let key = match kind {
                Kind::Bidi => reply.message,
                Kind::Server => reply.request_id,
            };
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .answer(kind, key, result_of(reply));
        }
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| transport_status(events, e))?;
    match trailers.as_ref().and_then(Status::from_header_map) {
        Some(status) if status.code() == Code::Ok => Ok(()),
        Some(status) => Err(status),
        None => Err(Status::internal("the stream ended without a grpc-status")),
    }
}

/// The next whole gRPC message at the front of `buf`, taken out of it
/// (`None`: not all of it is in yet).
fn next_message(buf: &mut BytesMut) -> Result<Option<Bytes>, Status> {
    if buf.len() < PREFIX {
        return Ok(None);
    }
    let compressed = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if compressed != 0 {
        return Err(Status::internal(
            "a reply on the stream is compressed, which was not asked for",
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

/// Opens a stream to a hop: what a push pool does for [`Streams`].
pub trait OpenStream: Send + Sync {
    /// The hop its streams go to: a caller keeps one stream per hop.
    fn hop(&self) -> &str;

    /// A new stream to one of the hop's replicas, picked as calls are: a
    /// bidi stream, or, given its request, a server stream.
    fn open<'a>(
        &'a self,
        server: Option<&'a CallRequest>,
    ) -> futures::future::BoxFuture<'a, Result<MessageStream, Status>>;
}

/// The streams a caller keeps to its downstream hops while one of its own
/// streams lasts (see the module's documentation). A cheap clone.
#[derive(Clone)]
pub struct Streams {
    inner: Arc<StreamsInner>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("reopen", &self.inner.reopen)
            .field("server", &self.inner.server.is_some())
            .finish()
    }
}

struct StreamsInner {
    /// Each downstream hop's stream, by the hop's name, opened on first
    /// use.
    open: tokio::sync::Mutex<HashMap<String, Arc<MessageStream>>>,
    /// Whether a stream that broke is opened again for later messages.
    reopen: bool,
    /// A server stream's request: its streams are server streams asking
    /// for it; `None`: bidi streams.
    server: Option<CallRequest>,
}

impl Streams {
    /// A hop relaying a stream: a broken downstream stream is opened again.
    pub fn relaying() -> Self {
        Self::new(true, None)
    }

    /// The load generator's stream: once its stream broke, its later
    /// messages fail with that stream's status.
    pub fn once() -> Self {
        Self::new(false, None)
    }

    /// Server streams asking for `request`'s messages (its
    /// `stream_messages`, ids and interval): the load generator's, or a
    /// hop's relaying a server stream. A broken one is not opened again:
    /// its messages cannot be asked for again from where it broke.
    pub fn server(request: CallRequest) -> Self {
        Self::new(false, Some(request))
    }

    fn new(reopen: bool, server: Option<CallRequest>) -> Self {
        Streams {
            inner: Arc::new(StreamsInner {
                open: tokio::sync::Mutex::new(HashMap::new()),
                reopen,
                server,
            }),
        }
    }

    /// Why one of the streams ended while it was in use, if one has: a
    /// stream that held is not over until it is dropped.
    pub fn ended_with(&self) -> Option<Status> {
        let open = self.inner.open.try_lock().ok()?;
        open.values().find_map(|s| s.ended_with())
    }

    /// The stream `opener` opens, opened now if there is none (or, when
    /// relaying, if it broke).
    pub async fn stream(&self, opener: &dyn OpenStream) -> Result<Arc<MessageStream>, Status> {
        let mut open = self.inner.open.lock().await;
        if let Some(stream) = open.get(opener.hop())
            && !(self.inner.reopen && stream.ended())
        {
            return Ok(Arc::clone(stream));
        }
        let stream = Arc::new(opener.open(self.inner.server.as_ref()).await?);
        open.insert(opener.hop().to_owned(), Arc::clone(&stream));
        Ok(stream)
    }

    /// Sends `request` on the stream `opener` opens, within `timeout`.
    pub async fn exchange(
        &self,
        opener: &dyn OpenStream,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        self.stream(opener).await?.exchange(request, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(reply: &CallReply) -> Bytes {
        encode(reply).expect("encodes")
    }

    #[test]
    fn replies_are_cut_from_the_stream_whatever_the_chunks() {
        let replies: Vec<CallReply> = (0..3)
            .map(|n| CallReply {
                request_id: 10 + n,
                message: n,
                payload: Bytes::from(vec![7; n as usize * 40]),
                ..Default::default()
            })
            .collect();
        let wire: Vec<u8> = replies.iter().flat_map(|r| framed(r).to_vec()).collect();
        // Fed one byte at a time and in one go, the same replies come out.
        for chunk in [1, wire.len()] {
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for piece in wire.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(message) = next_message(&mut buf).expect("well framed") {
                    out.push(CallReply::decode(message).expect("decodes"));
                }
            }
            assert_eq!(out, replies, "chunks of {chunk}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn a_compressed_or_oversized_reply_is_refused() {
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
    fn an_in_band_error_is_the_messages_failure_and_ending_fails_every_waiter() {
        let failed = result_of(CallReply {
            code: Code::Unavailable as i32,
            error: "injected".into(),
            ..Default::default()
        });
        assert_eq!(
            failed.map_err(|s| (s.code(), s.message().to_owned())),
            Err((Code::Unavailable, "injected".to_owned()))
        );
        let mut pending = Pending::default();
        let (tx, mut rx) = oneshot::channel();
        pending.waiting.insert(3, tx);
        pending.end(Status::cancelled("gone"));
        let got = rx.try_recv().expect("answered");
        assert_eq!(
            got.map_err(|s| (s.code(), s.message().to_owned())),
            Err((Code::Cancelled, "the stream broke: gone".to_owned()))
        );
        assert_eq!(
            pending.ended.as_ref().map(Status::code),
            Some(Code::Cancelled)
        );
    }
}
