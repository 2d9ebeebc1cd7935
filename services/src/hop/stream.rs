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
//!
//! A client stream (`Hop.ClientStream`) answers no message on its own: a
//! message given to it is sent and at once taken as sent (its call's
//! answer is a stand-in with no path), and [`Streams`] notes which of its
//! streams' messages went out while the caller served each of its own.
//! Once the caller's own messages are all served, [`Streams::finish`]
//! ends each stream's request side and waits for its one reply: every
//! message's answer, with when it was done below.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use prost::Message;
use tailmesh_proto::pb::{CallReply, CallRequest, ClientStreamReply};
use tokio::{sync::oneshot, task::AbortHandle};
use tonic::{Code, Status};

use super::unary::{encode, end_status, head_status, next_message, transport_status};
use crate::link::LinkEvents;

/// Which stream: a bidirectional one (`Hop.Stream`), whose replies are
/// matched to their messages by number, a server stream
/// (`Hop.ServerStream`), whose messages the hop sends on its own, matched
/// by their ids, or a client stream (`Hop.ClientStream`), whose one reply
/// answers every message at its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bidi,
    Server,
    Client,
}

/// What a caller's streams open: bidi streams, server streams asking for
/// one request's messages, or client streams.
#[derive(Clone, Debug)]
pub enum Opening {
    Bidi,
    Server(CallRequest),
    Client,
}

/// A client stream's one reply, or why there is none: handed from its
/// reader to [`MessageStream::finish`].
type ClientAnswer = Result<ClientStreamReply, Status>;

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

/// The next stream's [`MessageStream::serial`].
static SERIALS: AtomicU64 = AtomicU64::new(0);

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
    /// Which stream it is among the process's, for a client stream's
    /// messages to find their answers.
    serial: u64,
    /// A client stream's one reply, to come from its reader; taken by
    /// [`MessageStream::finish`].
    reply: Mutex<Option<oneshot::Receiver<ClientAnswer>>>,
    /// A connection of its own (`connection = "per-request"`), kept open
    /// as long as the stream.
    _own: Option<Box<dyn Send + Sync>>,
}

impl Drop for MessageStream {
    fn drop(&mut self) {
        let mut send = self.send.lock().unwrap_or_else(|e| e.into_inner());
        let unfinished =
            self.kind == Kind::Client && self.reply.get_mut().map_or(true, |reply| reply.is_some());
        if unfinished {
            // A client stream given up before its end: its hop must not
            // take the messages sent so far as all there are.
            send.send_reset(h2::Reason::CANCEL);
        } else {
            // The request side ends; a stream already reset refuses, which
            // is fine: it is over either way.
            let _ = send.send_data(Bytes::new(), true);
        }
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
        let (reply_tx, reply_rx) = oneshot::channel();
        let reader = tokio::spawn(read_answers(
            kind,
            answer,
            Arc::clone(&pending),
            events,
            reply_tx,
        ));
        MessageStream {
            kind,
            send: Mutex::new(send),
            pending,
            next: AtomicU64::new(0),
            reader: reader.abort_handle(),
            hop,
            replica,
            serial: SERIALS.fetch_add(1, Ordering::Relaxed),
            reply: Mutex::new((kind == Kind::Client).then_some(reply_rx)),
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
    /// of it, as a unary call's `grpc-timeout`); a client stream's is only
    /// sent. The trace context current here goes with the message.
    async fn exchange(
        &self,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<Sent, Status> {
        match self.kind {
            Kind::Bidi => self
                .send_and_await(request, timeout)
                .await
                .map(Sent::Answered),
            Kind::Server => self
                .await_message(request.request_id, timeout)
                .await
                .map(Sent::Answered),
            Kind::Client => self.forward(request).map(Sent::Forwarded),
        }
    }

    /// Sends `request` as a client stream's next message. Its answer comes
    /// with the others' in the stream's one reply
    /// ([`MessageStream::finish`]).
    fn forward(&self, mut request: CallRequest) -> Result<Forwarded, Status> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        request.message = number;
        request.timeout_ns = 0;
        request.trace = crate::telemetry::current_wire();
        let body = encode(&request)?;
        if let Some(status) = &self.pending.lock().unwrap_or_else(|e| e.into_inner()).ended {
            return Err(self.named(status.clone()));
        }
        let sent = tailmesh_units::unix_nanos();
        self.send
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send_data(body, false)
            .map_err(|e| {
                self.named(Status::unavailable(format!(
                    "the stream could not take a message: {e}"
                )))
            })?;
        Ok(Forwarded {
            hop: Arc::clone(&self.hop),
            stream: self.serial,
            number,
            sent_unix_ns: sent,
        })
    }

    /// Ends a client stream's request side and waits for its one reply,
    /// within `timeout` when given: every message's answer, by number.
    pub async fn finish(&self, timeout: Option<Duration>) -> Result<Vec<CallReply>, Status> {
        let reply = self
            .reply
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| Status::internal("not a client stream, or finished already"))?;
        // A stream already reset refuses; its reader has the reason.
        let _ = self
            .send
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send_data(Bytes::new(), true);
        let reply = async {
            reply
                .await
                .unwrap_or_else(|_| Err(Status::internal("the stream's reader stopped")))
        };
        let reply = match timeout {
            Some(t) => tokio::time::timeout(t, reply).await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "no reply within {t:?} of the stream's end"
                )))
            }),
            None => reply.await,
        };
        reply
            .map(|reply| reply.messages)
            .map_err(|status| self.named(status))
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
        request.trace = crate::telemetry::current_wire();
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

/// Reads a stream's answer: each reply to its message's waiter (a client
/// stream's one reply to `client`), then the stream's end to every message
/// still waiting.
async fn read_answers(
    kind: Kind,
    answer: h2::client::ResponseFuture,
    pending: Arc<Mutex<Pending>>,
    events: Arc<LinkEvents>,
    client: oneshot::Sender<ClientAnswer>,
) {
    let mut reply = None;
    let ended = read_replies(answer, &events, |message| match kind {
        Kind::Client => {
            let decoded = ClientStreamReply::decode(message)
                .map_err(|e| Status::internal(format!("decode the client stream's reply: {e}")))?;
            reply = Some(decoded);
            Ok(())
        }
        Kind::Bidi | Kind::Server => {
            let reply = CallReply::decode(message)
                .map_err(|e| Status::internal(format!("decode a reply on the stream: {e}")))?;
            let key = match kind {
                Kind::Server => reply.request_id,
                _ => reply.message,
            };
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .answer(kind, key, result_of(reply));
            Ok(())
        }
    })
    .await;
    let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
    match ended {
        Ok(()) => {
            pending.ended_ok = true;
            pending.end(Status::unavailable("the stream ended before its answer"));
            let _ = client.send(
                reply.ok_or_else(|| Status::internal("the stream ended OK without its reply")),
            );
        }
        Err(status) => {
            pending.end(status);
            // Ended with "the stream broke: ..." for every message.
            let _ = client
                .send(Err(pending.ended.clone().unwrap_or_else(|| {
                    Status::internal("the stream ended without a reason")
                })));
        }
    }
}

/// The messages of `answer`, each handed to `take`, until its end: `Ok`
/// when the stream ended with status OK, else its status (or `take`'s
/// error).
async fn read_replies(
    answer: h2::client::ResponseFuture,
    events: &LinkEvents,
    mut take: impl FnMut(Bytes) -> Result<(), Status>,
) -> Result<(), Status> {
    let answer = answer.await.map_err(|e| transport_status(events, e))?;
    let (head, mut body) = answer.into_parts();
    head_status(&head)?;
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| transport_status(events, e))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while let Some(message) = next_message(&mut buf)? {
            take(message)?;
        }
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| transport_status(events, e))?;
    end_status(&head.headers, trailers.as_ref())
}

/// Opens a stream to a hop: what a push pool does for [`Streams`].
pub trait OpenStream: Send + Sync {
    /// The hop its streams go to: a caller keeps one stream per hop.
    fn hop(&self) -> &str;

    /// A new stream to one of the hop's replicas, picked as calls are, of
    /// the kind `opening` says.
    fn open<'a>(
        &'a self,
        opening: &'a Opening,
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
            .field("opening", &self.inner.opening)
            .finish()
    }
}

struct StreamsInner {
    /// Each downstream hop's stream, by the hop's name, opened on first
    /// use.
    open: tokio::sync::Mutex<HashMap<String, Arc<MessageStream>>>,
    /// Whether a stream that broke is opened again for later messages.
    reopen: bool,
    /// What its streams are.
    opening: Opening,
    /// Client streams opened again after they broke: their messages'
    /// answers (failures) are still to be had from them.
    retired: Mutex<Vec<Arc<MessageStream>>>,
    /// Client streams' messages sent since [`Streams::take_forwarded`]
    /// was last called.
    forwarded: Mutex<Vec<Forwarded>>,
}

/// What became of a message given to a stream: answered, or (a client
/// stream's) sent.
enum Sent {
    Answered(CallReply),
    Forwarded(Forwarded),
}

/// A message sent on a client stream, to be matched with its answer in the
/// stream's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwarded {
    /// The hop the stream goes to, and which stream it is
    /// ([`Streams::finish`]'s key).
    pub hop: Arc<str>,
    pub stream: u64,
    /// Its number on that stream.
    pub number: u64,
    /// When it was sent, on the Unix clock, in ns.
    pub sent_unix_ns: u64,
}

impl Streams {
    /// A hop relaying a stream: a broken downstream stream is opened again.
    pub fn relaying() -> Self {
        Self::new(true, Opening::Bidi)
    }

    /// The load generator's stream: once its stream broke, its later
    /// messages fail with that stream's status.
    pub fn once() -> Self {
        Self::new(false, Opening::Bidi)
    }

    /// The load generator's client stream: once it broke, the answers of
    /// the messages sent on it are lost with it, and its later messages
    /// fail with its status.
    pub fn client() -> Self {
        Self::new(false, Opening::Client)
    }

    /// A hop relaying a client stream: the answers of the messages sent on
    /// a stream that broke are lost with it; later ones go on another.
    pub fn client_relaying() -> Self {
        Self::new(true, Opening::Client)
    }

    /// Server streams asking for `request`'s messages (its
    /// `stream_messages`, ids and interval): the load generator's, or a
    /// hop's relaying a server stream. A broken one is not opened again:
    /// its messages cannot be asked for again from where it broke.
    pub fn server(request: CallRequest) -> Self {
        Self::new(false, Opening::Server(request))
    }

    fn new(reopen: bool, opening: Opening) -> Self {
        Streams {
            inner: Arc::new(StreamsInner {
                open: tokio::sync::Mutex::new(HashMap::new()),
                reopen,
                opening,
                retired: Mutex::new(Vec::new()),
                forwarded: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The client streams' messages sent since the last call: those of the
    /// message the caller served since, when it serves them one at a time.
    pub fn take_forwarded(&self) -> Vec<Forwarded> {
        std::mem::take(
            &mut *self
                .inner
                .forwarded
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Ends every client stream's request side and waits for their
    /// replies, each within `timeout` when given: each stream's serial
    /// ([`Forwarded::stream`]) and its messages' answers, or why they are
    /// lost.
    pub async fn finish(&self, timeout: Option<Duration>) -> Vec<Finished> {
        let mut streams: Vec<Arc<MessageStream>> =
            self.inner.open.lock().await.values().cloned().collect();
        streams.append(&mut self.inner.retired.lock().unwrap_or_else(|e| e.into_inner()));
        futures::future::join_all(streams.into_iter().map(|stream| async move {
            let answers = stream.finish(timeout).await;
            (stream.serial, answers)
        }))
        .await
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
        let stream = Arc::new(opener.open(&self.inner.opening).await?);
        if let Some(broken) = open.insert(opener.hop().to_owned(), Arc::clone(&stream))
            && broken.kind == Kind::Client
        {
            self.inner
                .retired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(broken);
        }
        Ok(stream)
    }

    /// Sends `request` on the stream `opener` opens, within `timeout`.
    pub async fn exchange(
        &self,
        opener: &dyn OpenStream,
        request: CallRequest,
        timeout: Option<Duration>,
    ) -> Result<CallReply, Status> {
        match self
            .stream(opener)
            .await?
            .exchange(request, timeout)
            .await?
        {
            Sent::Answered(reply) => Ok(reply),
            Sent::Forwarded(f) => {
                let message = f.number;
                self.inner
                    .forwarded
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(f);
                // A stand-in: the message's answer comes in the stream's
                // reply.
                Ok(CallReply {
                    message,
                    ..CallReply::default()
                })
            }
        }
    }
}

/// A client stream finished: its serial, and its messages' answers or why
/// they are lost.
pub type Finished = (u64, Result<Vec<CallReply>, Status>);

/// One message a hop served on a client stream, waiting for the answers
/// of the hops it was relayed to.
#[derive(Clone, Debug)]
pub struct Served {
    /// The hop's own answer: its outcome, its number, and its path (this
    /// hop's record last, after those of the hops it called per message).
    pub reply: CallReply,
    /// When the hop read it, and when the hop was done with it, on the
    /// Unix clock, in ns.
    pub started_unix_ns: u64,
    pub done_unix_ns: u64,
    /// What the hop sent on its own client streams while serving it.
    pub forwarded: Vec<Forwarded>,
}

/// A client stream's answers, one per message `served`, in their order,
/// given the replies `below` of the client streams the messages were
/// relayed on, finished at `now_unix_ns`.
///
/// A message that failed here keeps its failure. One relayed takes the
/// first failure below it (its answer's, when it was done, or its
/// stream's status, when the stream ended; as a call's failure fails its
/// caller), or else the paths of the hops below
/// it, and is done when the last of them was: its record's call to each
/// hop then ends when that hop's answer says it was done, and its own
/// total and downstream times grow by the time it was done after this
/// hop's own part, as a unary call's would by waiting for its answers.
pub fn answer_messages(
    served: Vec<Served>,
    below: &[Finished],
    now_unix_ns: u64,
) -> Vec<CallReply> {
    let answers: Below<'_> = below
        .iter()
        .map(|(serial, answers)| {
            let by_number = answers
                .as_ref()
                .map(|answers| answers.iter().map(|a| (a.message, a)).collect());
            (*serial, by_number)
        })
        .collect();
    served
        .into_iter()
        .map(|served| answer_one(served, &answers, now_unix_ns))
        .collect()
}

/// The answers of finished client streams, by serial and number.
type Below<'a> = HashMap<u64, Result<HashMap<u64, &'a CallReply>, &'a Status>>;

/// One message's answer (see [`answer_messages`]).
fn answer_one(served: Served, below: &Below<'_>, now_unix_ns: u64) -> CallReply {
    let Served {
        mut reply,
        started_unix_ns,
        done_unix_ns,
        forwarded,
    } = served;
    reply.done_unix_ns = done_unix_ns;
    if reply.code != 0 {
        return reply;
    }
    let failed = |reply: CallReply, code: Code, error: String, done: u64| CallReply {
        code: code as i32,
        error,
        path: Vec::new(),
        done_unix_ns: done.max(done_unix_ns),
        ..reply
    };
    let mut answered = Vec::with_capacity(forwarded.len());
    for f in &forwarded {
        let answer = match below.get(&f.stream) {
            None => Err((
                Code::Internal,
                format!("hop \"{}\": the stream's reply is missing", f.hop),
                now_unix_ns,
            )),
            Some(Err(status)) => Err((status.code(), status.message().to_owned(), now_unix_ns)),
            Some(Ok(by_number)) => match by_number.get(&f.number) {
                None => Err((
                    Code::Internal,
                    format!(
                        "hop \"{}\": no answer to message {} in the stream's reply",
                        f.hop, f.number
                    ),
                    now_unix_ns,
                )),
                Some(a) if a.code != 0 => {
                    Err((Code::from_i32(a.code), a.error.clone(), a.done_unix_ns))
                }
                Some(a) => Ok(*a),
            },
        };
        match answer {
            Ok(a) => answered.push((f, a)),
            Err((code, error, done)) => return failed(reply, code, error, done),
        }
    }
    let done = answered
        .iter()
        .map(|(_, a)| a.done_unix_ns)
        .fold(done_unix_ns, u64::max);
    let later = done - done_unix_ns;
    let mut own = reply.path.pop();
    if let Some(record) = &mut own {
        // Each hop's calls in the record, in order, are its messages sent.
        let mut calls = record.calls.iter_mut();
        for (f, a) in &answered {
            let Some(call) = calls.by_ref().find(|c| *c.hop == *f.hop) else {
                break;
            };
            let took = a.done_unix_ns.saturating_sub(f.sent_unix_ns);
            call.call_ns = took;
            if let Some(attempt) = call.attempts.first_mut() {
                attempt.took_ns = took;
            }
        }
        record.total_ns = record.total_ns.max(done.saturating_sub(started_unix_ns));
        if !record.calls.is_empty() {
            record.downstream_ns += later;
        }
    }
    for (_, a) in &answered {
        reply.path.extend(a.path.iter().cloned());
    }
    reply.path.extend(own);
    reply.done_unix_ns = done;
    reply
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

    fn record(hop: &str, total_ns: u64, calls: &[&str]) -> tailmesh_proto::pb::HopRecord {
        tailmesh_proto::pb::HopRecord {
            hop: hop.into(),
            total_ns,
            downstream_ns: if calls.is_empty() { 0 } else { 10 },
            calls: calls
                .iter()
                .map(|c| tailmesh_proto::pb::CallTiming {
                    hop: (*c).into(),
                    call_ns: 10,
                    attempts: vec![tailmesh_proto::pb::AttemptTiming {
                        start_ns: 0,
                        took_ns: 10,
                        end: 1,
                    }],
                })
                .collect(),
            ..Default::default()
        }
    }

    fn served(message: u64, code: i32, forwarded: &[(&str, u64)]) -> Served {
        let calls: Vec<&str> = forwarded.iter().map(|(hop, _)| *hop).collect();
        Served {
            reply: CallReply {
                request_id: 100 + message,
                message,
                code,
                path: if code == 0 {
                    vec![record("a", 1_000, &calls)]
                } else {
                    Vec::new()
                },
                ..Default::default()
            },
            started_unix_ns: 10_000 * (message + 1),
            done_unix_ns: 10_000 * (message + 1) + 1_000,
            forwarded: forwarded
                .iter()
                .map(|(hop, number)| Forwarded {
                    hop: Arc::from(*hop),
                    stream: 7,
                    number: *number,
                    sent_unix_ns: 10_000 * (message + 1) + 900,
                })
                .collect(),
        }
    }

    #[test]
    fn a_client_streams_answers_take_the_paths_times_and_failures_from_below() {
        let b_answer = |number: u64, code: i32, done: u64| CallReply {
            message: number,
            code,
            error: if code == 0 {
                String::new()
            } else {
                "injected".into()
            },
            path: if code == 0 {
                vec![record("b", 500, &[])]
            } else {
                Vec::new()
            },
            done_unix_ns: done,
            ..Default::default()
        };
        let below = vec![(7, Ok(vec![b_answer(0, 0, 12_400), b_answer(1, 14, 35_000)]))];
        let answers = answer_messages(
            vec![
                served(0, 0, &[("b", 0)]),
                served(1, 13, &[]),
                served(2, 0, &[("b", 1)]),
            ],
            &below,
            50_000,
        );
        // Message 0: b's record before a's; a's call to b ends when b was
        // done (12,400 - 10,900 sent), and a's times grow by the 1,400 ns
        // b was done after a's own part.
        let first = &answers[0];
        assert_eq!(first.code, 0);
        assert_eq!(first.done_unix_ns, 12_400);
        let hops: Vec<&str> = first.path.iter().map(|r| r.hop.as_str()).collect();
        assert_eq!(hops, ["b", "a"]);
        let a = &first.path[1];
        assert_eq!(a.calls[0].call_ns, 1_500);
        assert_eq!(a.calls[0].attempts[0].took_ns, 1_500);
        assert_eq!(a.total_ns, 2_400);
        assert_eq!(a.downstream_ns, 10 + 1_400);
        // Message 1 failed here and keeps it; message 2 takes b's failure,
        // known when b was done with it.
        assert_eq!(
            (answers[1].code, answers[1].message, answers[1].done_unix_ns),
            (13, 1, 21_000)
        );
        assert_eq!(
            (
                answers[2].code,
                answers[2].error.as_str(),
                answers[2].path.len(),
                answers[2].done_unix_ns
            ),
            (14, "injected", 0, 35_000)
        );
        // A stream that broke fails what was relayed on it, known when it
        // was finished.
        let broke = vec![(7, Err(Status::unavailable("the stream broke: gone")))];
        let answers = answer_messages(
            vec![served(0, 0, &[("b", 0)]), served(1, 0, &[])],
            &broke,
            50_000,
        );
        assert_eq!(
            (
                answers[0].code,
                answers[0].error.as_str(),
                answers[0].done_unix_ns
            ),
            (Code::Unavailable as i32, "the stream broke: gone", 50_000)
        );
        // One relayed nowhere is done when this hop was.
        assert_eq!((answers[1].code, answers[1].done_unix_ns), (0, 21_000));
        assert_eq!(answers[1].path.len(), 1);
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
