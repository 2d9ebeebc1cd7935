//! A lean unary-gRPC client over HTTP/2, written against the wire itself:
//! the measuring instrument that tells how much of the load generator's
//! CPU per request is the h2 crate's and how much is the generator's own.
//!
//! Each connection is one task that owns its socket and does everything
//! in turn: it writes every frame it has queued in one write, reads what
//! came, handles every complete frame, and opens a new stream for each
//! one that finished, as long as the run has requests left (closed loop,
//! `streams` in flight per connection, like `h2load -c C -m M`). There is
//! no other task, no channel and no per-request allocation beyond the
//! reply's bytes.
//!
//! - Requests: HEADERS from one HPACK block built once per connection
//!   (static-table indices and literals without indexing, no Huffman),
//!   then one DATA frame with END_STREAM holding the gRPC message (a
//!   `CallRequest` with its own `request_id` and the payload).
//! - Answers: header blocks decoded with a real HPACK decoder (the server
//!   uses Huffman and its dynamic table), `:status` and `grpc-status`
//!   read; the reply's message checked to echo the request's id and
//!   payload.
//! - The connection: the preface and SETTINGS, SETTINGS and PING
//!   acknowledged, both flow-control windows (ours replenished with
//!   WINDOW_UPDATE, the server's respected before each request), the
//!   server's stream limit, RST_STREAM and GOAWAY.
//!
//! Every request started is counted once, as ok or failed; a connection
//! that fails counts its streams in flight as failed and stops.

use std::{
    borrow::Cow,
    cell::Cell,
    collections::HashMap,
    net::SocketAddr,
    rc::Rc,
    time::{Duration, Instant},
};

use bytes::{Buf, BytesMut};
use hdrhistogram::Histogram;
use loona_hpack::decoder::{Decoder, DecoderError};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{HIST_MAX_NS, histogram};

/// What the client sends first on every connection.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame's header.
const FRAME_HEADER: usize = 9;
/// The largest frame we accept (our SETTINGS_MAX_FRAME_SIZE: the default).
const MAX_FRAME: usize = 16_384;
/// Our per-stream receive window (SETTINGS_INITIAL_WINDOW_SIZE) and the
/// connection's, as h2load's defaults (`-w 30 -W 30`).
const RECV_WINDOW: u32 = (1 << 30) - 1;
/// The largest window HTTP/2 allows.
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// The header table size our decoder allows (the default).
const HEADER_TABLE: usize = 4_096;
/// The gRPC message prefix: a compression flag and a 4-byte length.
const GRPC_PREFIX: usize = 5;
/// The largest reply message accepted.
const MAX_REPLY: usize = tailmesh_services::limits::MAX_CALL_MESSAGE_BYTES;
/// The largest payload one request may carry: its message fits in one
/// DATA frame of the smallest size a server may allow.
pub const MAX_PAYLOAD: usize = MAX_FRAME - 64;

mod frame {
    pub(super) const DATA: u8 = 0x0;
    pub(super) const HEADERS: u8 = 0x1;
    pub(super) const RST_STREAM: u8 = 0x3;
    pub(super) const SETTINGS: u8 = 0x4;
    pub(super) const PUSH_PROMISE: u8 = 0x5;
    pub(super) const PING: u8 = 0x6;
    pub(super) const GOAWAY: u8 = 0x7;
    pub(super) const WINDOW_UPDATE: u8 = 0x8;
    pub(super) const CONTINUATION: u8 = 0x9;

    pub(super) const END_STREAM: u8 = 0x1;
    pub(super) const ACK: u8 = 0x1;
    pub(super) const END_HEADERS: u8 = 0x4;
    pub(super) const PADDED: u8 = 0x8;
    pub(super) const PRIORITY: u8 = 0x20;

    pub(super) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
    pub(super) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub(super) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

    pub(super) const CANCEL: u32 = 0x8;
}

/// What to run.
#[derive(Clone, Debug)]
pub struct LeanConfig {
    /// The server.
    pub addr: SocketAddr,
    /// HTTP/2 connections.
    pub connections: usize,
    /// Streams in flight per connection.
    pub streams: usize,
    /// Requests in all.
    pub requests: u64,
    /// Payload bytes per request (at most [`MAX_PAYLOAD`]).
    pub payload: usize,
    /// The method's path.
    pub path: String,
}

/// What a run measured: the same fields as `tailmesh load`'s report where
/// they mean the same.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LeanReport {
    /// Requests started.
    pub sent: u64,
    /// Of those, answered with HTTP 200, grpc-status 0 and a reply that
    /// echoes the request's id and payload.
    pub ok: u64,
    /// Of those, anything else.
    pub failed: u64,
    /// Ok answers per second, from the first connection attempt to the
    /// last answer.
    pub ok_per_s: f64,
    /// Latency percentiles of the ok answers, in microseconds (from the
    /// write that sent the request to the read that brought its end).
    pub p50_us: u64,
    /// See `p50_us`.
    pub p99_us: u64,
    /// See `p50_us`.
    pub max_us: u64,
    /// The whole run, in seconds.
    pub elapsed_s: f64,
    /// Connections opened.
    pub connections: usize,
    /// Streams in flight per connection.
    pub streams: usize,
    /// The first failed request's cause.
    pub first_failure: Option<String>,
    /// Each connection that failed, with its cause.
    pub connection_errors: Vec<String>,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeanError {
    /// The configuration asks for something this client does not do.
    #[error("{0}")]
    Config(&'static str),
    /// A connection could not be opened.
    #[error("connect to {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The runtime could not run the connections.
    #[error("a connection's task ended abnormally")]
    Task(#[from] tokio::task::JoinError),
}

/// Why a connection stopped before its work was done.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("read or write")]
    Io(#[from] std::io::Error),
    #[error("the server closed the connection")]
    Closed,
    #[error("the server sent GOAWAY (error code {code}{})", debug_text(.debug))]
    GoAway { code: u32, debug: String },
    #[error("a frame of {len} bytes, over the {MAX_FRAME} allowed")]
    FrameTooLarge { len: usize },
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("a header block does not decode")]
    Hpack(#[source] DecoderError),
    #[error("the server's window for a new stream is {window} bytes, a request needs {needed}")]
    WindowTooSmall { window: i64, needed: usize },
    #[error("no stream ids left on the connection")]
    StreamIdsExhausted,
}

fn debug_text(debug: &str) -> String {
    if debug.is_empty() {
        String::new()
    } else {
        format!(": {debug}")
    }
}

/// Why one request failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamFailure {
    #[error("HTTP status {0} instead of 200")]
    HttpStatus(u16),
    #[error("the answer's headers carry no :status")]
    NoStatus,
    #[error("grpc-status {code}: {message}")]
    Grpc { code: u32, message: String },
    #[error("the answer ended without a grpc-status")]
    NoGrpcStatus,
    #[error("the server reset the stream (error code {0})")]
    Reset(u32),
    #[error("the server's GOAWAY left the stream unprocessed")]
    Refused,
    #[error("the connection failed with the stream in flight")]
    ConnectionLost,
    #[error("the reply is over {MAX_REPLY} bytes")]
    TooLarge,
    #[error("the reply: {0}")]
    Reply(&'static str),
}

/// The requests left to start, shared by the connections of one thread.
#[derive(Clone)]
struct Budget {
    next_id: Rc<Cell<u64>>,
    last_id: u64,
}

impl Budget {
    fn new(requests: u64) -> Self {
        Budget {
            next_id: Rc::new(Cell::new(1)),
            last_id: requests,
        }
    }

    /// The next request's id, if one is left.
    fn take(&self) -> Option<u64> {
        let id = self.next_id.get();
        (id <= self.last_id).then(|| {
            self.next_id.set(id + 1);
            id
        })
    }

    fn is_empty(&self) -> bool {
        self.next_id.get() > self.last_id
    }
}

/// What one connection counted.
struct Tally {
    sent: u64,
    ok: u64,
    failed: u64,
    hist: Histogram<u64>,
    first_failure: Option<StreamFailure>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            sent: 0,
            ok: 0,
            failed: 0,
            hist: histogram(),
            first_failure: None,
        }
    }

    fn fail(&mut self, why: StreamFailure) {
        self.failed += 1;
        self.first_failure.get_or_insert(why);
    }
}

/// Runs `config` on the current thread (a current-thread runtime inside
/// a `LocalSet`) and reports what it measured.
pub async fn run(config: &LeanConfig) -> Result<LeanReport, LeanError> {
    if config.connections == 0 || config.streams == 0 {
        return Err(LeanError::Config(
            "connections and streams must be at least 1",
        ));
    }
    if config.payload > MAX_PAYLOAD {
        return Err(LeanError::Config(
            "the payload must fit in one DATA frame (at most 16320 bytes)",
        ));
    }
    let started = Instant::now();
    let mut sockets = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        let tcp = TcpStream::connect(config.addr)
            .await
            .map_err(|source| LeanError::Connect {
                addr: config.addr,
                source,
            })?;
        // Without it each small write waits for the peer's delayed ACK.
        tcp.set_nodelay(true).map_err(|source| LeanError::Connect {
            addr: config.addr,
            source,
        })?;
        sockets.push(tcp);
    }
    let budget = Budget::new(config.requests);
    let headers = Rc::new(request_headers(&config.addr.to_string(), &config.path));
    let payload: Rc<[u8]> = payload_bytes(config.payload).into();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, tcp) in sockets.into_iter().enumerate() {
        let mut conn = Conn::new(n, config.streams, Rc::clone(&headers), Rc::clone(&payload));
        let budget = budget.clone();
        tasks.spawn_local(async move {
            let result = conn.drive(tcp, &budget).await;
            if result.is_err() {
                conn.fail_in_flight();
            }
            (conn.id, conn.tally, result)
        });
    }
    let mut total = Tally::new();
    let mut connection_errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (id, tally, result) = joined?;
        total.sent += tally.sent;
        total.ok += tally.ok;
        total.failed += tally.failed;
        // Same bounds: adding cannot fail.
        let _ = total.hist.add(&tally.hist);
        if total.first_failure.is_none() {
            total.first_failure = tally.first_failure;
        }
        if let Err(e) = result {
            connection_errors.push(format!("connection {id}: {}", chain(&e)));
        }
    }
    let elapsed = started.elapsed();
    let us = |q: f64| {
        if total.hist.is_empty() {
            0
        } else {
            total.hist.value_at_quantile(q).div_ceil(1_000)
        }
    };
    Ok(LeanReport {
        sent: total.sent,
        ok: total.ok,
        failed: total.failed,
        ok_per_s: rate(total.ok, elapsed),
        p50_us: us(0.5),
        p99_us: us(0.99),
        max_us: us(1.0),
        elapsed_s: elapsed.as_secs_f64(),
        connections: config.connections,
        streams: config.streams,
        first_failure: total.first_failure.map(|f| f.to_string()),
        connection_errors,
    })
}

fn rate(n: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// An error and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The payload every request carries: the bytes bench/floor.py's body
/// holds (i mod 251).
pub fn payload_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Appends `value` as an HPACK integer with an `n`-bit prefix whose other
/// bits are `flags` (RFC 7541, 5.1).
fn put_int(out: &mut Vec<u8>, n: u32, flags: u8, value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// Appends a string literal without Huffman coding.
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_int(out, 7, 0, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// The request's header block: what a gRPC client sends for a unary
/// call, using no dynamic table so one block serves every request.
pub fn request_headers(authority: &str, path: &str) -> Vec<u8> {
    // Static table (RFC 7541, appendix A): 1 :authority, 3 :method POST,
    // 4 :path, 6 :scheme http, 31 content-type.
    let mut out = Vec::with_capacity(64 + authority.len() + path.len());
    put_int(&mut out, 7, 0x80, 3);
    put_int(&mut out, 7, 0x80, 6);
    // Literals without indexing: 0000 then a 4-bit name index (0: a
    // literal name follows).
    put_int(&mut out, 4, 0x00, 4);
    put_str(&mut out, path);
    put_int(&mut out, 4, 0x00, 1);
    put_str(&mut out, authority);
    put_int(&mut out, 4, 0x00, 31);
    put_str(&mut out, "application/grpc");
    put_int(&mut out, 4, 0x00, 0);
    put_str(&mut out, "te");
    put_str(&mut out, "trailers");
    out
}

/// Appends a frame header.
fn put_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

fn put_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    put_frame_header(out, 4, frame::WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&increment.to_be_bytes());
}

/// Appends a protobuf varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// The length of the `CallRequest` message for `request_id` and a payload
/// of `payload` bytes.
fn request_message_len(request_id: u64, payload: usize) -> usize {
    let id = 1 + varint_len(request_id);
    let data = if payload == 0 {
        0
    } else {
        1 + varint_len(payload as u64) + payload
    };
    id + data
}

/// Appends one gRPC-framed `CallRequest`: field 1 `request_id`, field 2
/// `payload` (as prost encodes it).
fn put_request(out: &mut Vec<u8>, request_id: u64, payload: &[u8]) {
    let len = request_message_len(request_id, payload.len());
    out.push(0);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.push(0x08);
    put_varint(out, request_id);
    if !payload.is_empty() {
        out.push(0x12);
        put_varint(out, payload.len() as u64);
        out.extend_from_slice(payload);
    }
}

/// Checks that `body` is one uncompressed gRPC message holding a
/// `CallReply` to request `request_id` that echoes `payload`.
pub fn check_reply(body: &[u8], request_id: u64, payload: &[u8]) -> Result<(), StreamFailure> {
    if body.len() < GRPC_PREFIX {
        return Err(StreamFailure::Reply("grpc-status 0 but no message"));
    }
    if body[0] != 0 {
        return Err(StreamFailure::Reply("compressed, which was not asked for"));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let mut msg = &body[GRPC_PREFIX..];
    if msg.len() != len {
        return Err(StreamFailure::Reply(
            "its length prefix differs from its body",
        ));
    }
    let (mut id, mut echoed) = (0, &[][..]);
    while msg.has_remaining() {
        let bad = |_| StreamFailure::Reply("not a protobuf message");
        let key = prost::encoding::decode_varint(&mut msg).map_err(bad)?;
        match (key >> 3, key & 7) {
            (_, 0) => {
                let v = prost::encoding::decode_varint(&mut msg).map_err(bad)?;
                if key >> 3 == 1 {
                    id = v;
                }
            }
            (field, 2) => {
                let n = prost::encoding::decode_varint(&mut msg).map_err(bad)?;
                let n = usize::try_from(n)
                    .ok()
                    .filter(|n| *n <= msg.len())
                    .ok_or(StreamFailure::Reply("a field runs past the message"))?;
                if field == 2 {
                    echoed = &msg[..n];
                }
                msg.advance(n);
            }
            _ => return Err(StreamFailure::Reply("an unexpected wire type")),
        }
    }
    if id != request_id {
        return Err(StreamFailure::Reply("its request_id is not the request's"));
    }
    if echoed != payload {
        return Err(StreamFailure::Reply("its payload is not the request's"));
    }
    Ok(())
}

/// One request in flight.
struct Stream {
    request_id: u64,
    sent_at: Instant,
    /// `:status`, once the answer's headers came.
    status: Option<u16>,
    /// The reply's bytes.
    data: Vec<u8>,
    /// Bytes received since our last WINDOW_UPDATE for the stream.
    unacked: u32,
}

/// A header block being received (HEADERS then CONTINUATION frames).
struct Block {
    stream: u32,
    end_stream: bool,
    bytes: Vec<u8>,
}

/// What a header block said that matters here.
#[derive(Debug, Default, PartialEq)]
struct Heard {
    status: Option<u16>,
    grpc_status: Option<u32>,
    grpc_message: String,
}

/// One connection's state.
struct Conn {
    id: usize,
    streams_wanted: usize,
    headers: Rc<Vec<u8>>,
    payload: Rc<[u8]>,
    hpack: Decoder<'static>,
    streams: HashMap<u32, Stream>,
    next_stream: u32,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS.
    peer_max_streams: u32,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE.
    peer_stream_window: i64,
    /// What we may still send on the connection.
    send_window: i64,
    /// Bytes received since our last connection WINDOW_UPDATE.
    unacked: u32,
    /// A header block whose CONTINUATION frames are still to come.
    block: Option<Block>,
    /// The server's GOAWAY: no new streams.
    goaway: Option<ConnError>,
    /// The server's first SETTINGS came.
    settled: bool,
    out: Vec<u8>,
    tally: Tally,
}

impl Conn {
    fn new(id: usize, streams: usize, headers: Rc<Vec<u8>>, payload: Rc<[u8]>) -> Self {
        let mut hpack = Decoder::new();
        hpack.set_max_allowed_table_size(HEADER_TABLE);
        Conn {
            id,
            streams_wanted: streams,
            headers,
            payload,
            hpack,
            streams: HashMap::with_capacity(streams * 2),
            next_stream: 1,
            peer_max_streams: u32::MAX,
            peer_stream_window: 65_535,
            send_window: 65_535,
            unacked: 0,
            block: None,
            goaway: None,
            settled: false,
            out: Vec::with_capacity(16 * 1024),
            tally: Tally::new(),
        }
    }

    /// Runs the connection until the budget is spent and every stream
    /// answered, or it fails.
    async fn drive(&mut self, mut tcp: TcpStream, budget: &Budget) -> Result<(), ConnError> {
        self.out.extend_from_slice(PREFACE);
        put_frame_header(&mut self.out, 12, frame::SETTINGS, 0, 0);
        for (id, value) in [
            (frame::SETTINGS_ENABLE_PUSH, 0),
            (frame::SETTINGS_INITIAL_WINDOW_SIZE, RECV_WINDOW),
        ] {
            self.out.extend_from_slice(&id.to_be_bytes());
            self.out.extend_from_slice(&value.to_be_bytes());
        }
        put_window_update(&mut self.out, 0, RECV_WINDOW - 65_535);
        let mut input = BytesMut::with_capacity(64 * 1024);
        loop {
            if self.settled && self.goaway.is_none() {
                self.open_streams(budget)?;
            }
            if !self.out.is_empty() {
                tcp.write_all(&self.out).await?;
                self.out.clear();
            }
            if self.streams.is_empty()
                && self.settled
                && (budget.is_empty() || self.goaway.is_some())
            {
                break;
            }
            if input.capacity() - input.len() < 16 * 1024 {
                input.reserve(64 * 1024);
            }
            if tcp.read_buf(&mut input).await? == 0 {
                return Err(ConnError::Closed);
            }
            let now = Instant::now();
            while let Some((kind, flags, stream, len)) = frame_at(&input)? {
                input.advance(FRAME_HEADER);
                let payload = input.split_to(len);
                self.on_frame(kind, flags, stream, &payload, now)?;
            }
        }
        if let Some(goaway) = self.goaway.take() {
            return Err(goaway);
        }
        // Done: tell the server, then close.
        put_frame_header(&mut self.out, 8, frame::GOAWAY, 0, 0);
        self.out.extend_from_slice(&[0; 8]);
        tcp.write_all(&self.out).await?;
        Ok(())
    }

    /// Opens as many streams as the budget, our wish, the server's limit
    /// and its window allow, queueing their frames.
    fn open_streams(&mut self, budget: &Budget) -> Result<(), ConnError> {
        let limit = self.streams_wanted.min(self.peer_max_streams as usize);
        if limit == 0 {
            // Nothing would ever be sent, nor answered.
            return Err(ConnError::Protocol("the server allows no streams"));
        }
        let mut sent_at = None;
        while self.streams.len() < limit && !budget.is_empty() {
            // The longest message any request id makes (a 10-byte varint).
            let worst = GRPC_PREFIX + request_message_len(u64::MAX, self.payload.len());
            if self.peer_stream_window < worst as i64 {
                return Err(ConnError::WindowTooSmall {
                    window: self.peer_stream_window,
                    needed: worst,
                });
            }
            if self.send_window < worst as i64 {
                // Wait for the server's WINDOW_UPDATE.
                break;
            }
            if self.next_stream > i32::MAX as u32 {
                return Err(ConnError::StreamIdsExhausted);
            }
            let Some(request_id) = budget.take() else {
                break;
            };
            let stream = self.next_stream;
            self.next_stream += 2;
            put_frame_header(
                &mut self.out,
                self.headers.len(),
                frame::HEADERS,
                frame::END_HEADERS,
                stream,
            );
            self.out.extend_from_slice(&self.headers);
            let body = GRPC_PREFIX + request_message_len(request_id, self.payload.len());
            put_frame_header(&mut self.out, body, frame::DATA, frame::END_STREAM, stream);
            put_request(&mut self.out, request_id, &self.payload);
            self.send_window -= body as i64;
            let at = *sent_at.get_or_insert_with(Instant::now);
            self.streams.insert(
                stream,
                Stream {
                    request_id,
                    sent_at: at,
                    status: None,
                    data: Vec::new(),
                    unacked: 0,
                },
            );
            self.tally.sent += 1;
        }
        Ok(())
    }

    fn on_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        now: Instant,
    ) -> Result<(), ConnError> {
        if let Some(block) = &mut self.block {
            if kind != frame::CONTINUATION || stream != block.stream {
                return Err(ConnError::Protocol(
                    "a header block interrupted by another frame",
                ));
            }
            block.bytes.extend_from_slice(payload);
            if flags & frame::END_HEADERS != 0
                && let Some(block) = self.block.take()
            {
                self.on_header_block(block, now)?;
            }
            return Ok(());
        }
        match kind {
            frame::DATA => self.on_data(flags, stream, payload),
            frame::HEADERS => {
                if stream == 0 {
                    return Err(ConnError::Protocol("HEADERS on stream 0"));
                }
                let fragment = strip_headers(flags, payload)?;
                let block = Block {
                    stream,
                    end_stream: flags & frame::END_STREAM != 0,
                    bytes: fragment.to_vec(),
                };
                if flags & frame::END_HEADERS != 0 {
                    self.on_header_block(block, now)
                } else {
                    self.block = Some(block);
                    Ok(())
                }
            }
            frame::CONTINUATION => Err(ConnError::Protocol("CONTINUATION without HEADERS")),
            frame::RST_STREAM => {
                if payload.len() != 4 {
                    return Err(ConnError::Protocol("RST_STREAM of the wrong size"));
                }
                let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                if self.streams.remove(&stream).is_some() {
                    self.tally.fail(StreamFailure::Reset(code));
                }
                Ok(())
            }
            frame::SETTINGS => self.on_settings(flags, stream, payload),
            frame::PING => {
                if payload.len() != 8 || stream != 0 {
                    return Err(ConnError::Protocol("a malformed PING"));
                }
                if flags & frame::ACK == 0 {
                    put_frame_header(&mut self.out, 8, frame::PING, frame::ACK, 0);
                    self.out.extend_from_slice(payload);
                }
                Ok(())
            }
            frame::GOAWAY => self.on_goaway(payload),
            frame::WINDOW_UPDATE => {
                if payload.len() != 4 {
                    return Err(ConnError::Protocol("WINDOW_UPDATE of the wrong size"));
                }
                let inc = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                if stream == 0 {
                    self.send_window += i64::from(inc);
                    if self.send_window > MAX_WINDOW {
                        return Err(ConnError::Protocol(
                            "the connection's send window overflowed",
                        ));
                    }
                }
                // A stream's window: each request's one DATA frame is
                // sent already.
                Ok(())
            }
            frame::PUSH_PROMISE => Err(ConnError::Protocol("PUSH_PROMISE with push disabled")),
            // PRIORITY and unknown frames are ignored, as the spec says.
            _ => Ok(()),
        }
    }

    fn on_data(&mut self, flags: u8, id: u32, payload: &[u8]) -> Result<(), ConnError> {
        if id == 0 {
            return Err(ConnError::Protocol("DATA on stream 0"));
        }
        // Flow control counts the whole payload, padding included.
        self.unacked += payload.len() as u32;
        if self.unacked >= RECV_WINDOW / 2 {
            put_window_update(&mut self.out, 0, self.unacked);
            self.unacked = 0;
        }
        let data = strip_padding(flags, payload)?;
        let end = flags & frame::END_STREAM != 0;
        let Some(stream) = self.streams.get_mut(&id) else {
            // A stream we reset or that failed already.
            return if id < self.next_stream {
                Ok(())
            } else {
                Err(ConnError::Protocol("DATA on a stream never opened"))
            };
        };
        if stream.status.is_none() {
            return Err(ConnError::Protocol("DATA before the answer's headers"));
        }
        stream.unacked += payload.len() as u32;
        if !end && stream.unacked >= RECV_WINDOW / 2 {
            put_window_update(&mut self.out, id, stream.unacked);
            stream.unacked = 0;
        }
        if stream.data.len() + data.len() > GRPC_PREFIX + MAX_REPLY {
            self.streams.remove(&id);
            put_frame_header(&mut self.out, 4, frame::RST_STREAM, 0, id);
            self.out.extend_from_slice(&frame::CANCEL.to_be_bytes());
            self.tally.fail(StreamFailure::TooLarge);
            return Ok(());
        }
        stream.data.extend_from_slice(data);
        if end {
            self.streams.remove(&id);
            self.tally.fail(StreamFailure::NoGrpcStatus);
        }
        Ok(())
    }

    fn on_header_block(&mut self, block: Block, now: Instant) -> Result<(), ConnError> {
        // Decoded whatever the stream's state, so the dynamic table stays
        // in step with the server's.
        let heard = decode_block(&mut self.hpack, &block.bytes)?;
        let id = block.stream;
        let Some(stream) = self.streams.get_mut(&id) else {
            return if id < self.next_stream {
                Ok(())
            } else {
                Err(ConnError::Protocol("HEADERS on a stream never opened"))
            };
        };
        let first = stream.status.is_none();
        if first {
            match heard.status {
                Some(200) => stream.status = Some(200),
                Some(other) => {
                    self.fail_stream(id, StreamFailure::HttpStatus(other));
                    return Ok(());
                }
                None => {
                    self.fail_stream(id, StreamFailure::NoStatus);
                    return Ok(());
                }
            }
        }
        if !block.end_stream {
            return if first {
                Ok(())
            } else {
                Err(ConnError::Protocol("trailers without END_STREAM"))
            };
        }
        let Some(stream) = self.streams.remove(&id) else {
            return Ok(());
        };
        let outcome = match heard.grpc_status {
            None => Err(StreamFailure::NoGrpcStatus),
            Some(0) => check_reply(&stream.data, stream.request_id, &self.payload),
            Some(code) => Err(StreamFailure::Grpc {
                code,
                message: heard.grpc_message,
            }),
        };
        match outcome {
            Ok(()) => {
                self.tally.ok += 1;
                let ns = u64::try_from(now.duration_since(stream.sent_at).as_nanos())
                    .unwrap_or(u64::MAX);
                self.tally.hist.saturating_record(ns.clamp(1, HIST_MAX_NS));
            }
            Err(why) => self.tally.fail(why),
        }
        Ok(())
    }

    /// Ends a stream the answer already failed: reset it, count it.
    fn fail_stream(&mut self, id: u32, why: StreamFailure) {
        if self.streams.remove(&id).is_some() {
            put_frame_header(&mut self.out, 4, frame::RST_STREAM, 0, id);
            self.out.extend_from_slice(&frame::CANCEL.to_be_bytes());
            self.tally.fail(why);
        }
    }

    fn on_settings(&mut self, flags: u8, stream: u32, payload: &[u8]) -> Result<(), ConnError> {
        if stream != 0 {
            return Err(ConnError::Protocol("SETTINGS on a stream"));
        }
        if flags & frame::ACK != 0 {
            return if payload.is_empty() {
                Ok(())
            } else {
                Err(ConnError::Protocol(
                    "a SETTINGS acknowledgement with a payload",
                ))
            };
        }
        if !payload.len().is_multiple_of(6) {
            return Err(ConnError::Protocol("SETTINGS of the wrong size"));
        }
        for entry in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([entry[0], entry[1]]);
            let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
            match id {
                frame::SETTINGS_MAX_CONCURRENT_STREAMS => self.peer_max_streams = value,
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if i64::from(value) > MAX_WINDOW {
                        return Err(ConnError::Protocol("an initial window over 2^31-1"));
                    }
                    self.peer_stream_window = i64::from(value);
                }
                // Header table size: our requests use no dynamic table;
                // max frame size: our frames are within any allowed one.
                _ => {}
            }
        }
        if !self.settled && (self.peer_max_streams as usize) < self.streams_wanted {
            eprintln!(
                "h2lean: connection {}: the server allows {} streams at once, fewer than the {} asked",
                self.id, self.peer_max_streams, self.streams_wanted
            );
        }
        self.settled = true;
        put_frame_header(&mut self.out, 0, frame::SETTINGS, frame::ACK, 0);
        Ok(())
    }

    fn on_goaway(&mut self, payload: &[u8]) -> Result<(), ConnError> {
        if payload.len() < 8 {
            return Err(ConnError::Protocol("GOAWAY too short"));
        }
        let last =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
        let refused: Vec<u32> = self
            .streams
            .keys()
            .copied()
            .filter(|id| *id > last)
            .collect();
        for id in refused {
            self.streams.remove(&id);
            self.tally.fail(StreamFailure::Refused);
        }
        self.goaway = Some(ConnError::GoAway {
            code,
            debug: String::from_utf8_lossy(&payload[8..]).into_owned(),
        });
        Ok(())
    }

    /// Counts every stream still in flight as failed.
    fn fail_in_flight(&mut self) {
        for _ in self.streams.drain() {
            self.tally.fail(StreamFailure::ConnectionLost);
        }
    }
}

/// The next complete frame's header at the start of `input`, if all of it
/// is there: type, flags, stream, payload length.
fn frame_at(input: &[u8]) -> Result<Option<(u8, u8, u32, usize)>, ConnError> {
    if input.len() < FRAME_HEADER {
        return Ok(None);
    }
    let len = u32::from_be_bytes([0, input[0], input[1], input[2]]) as usize;
    if len > MAX_FRAME {
        return Err(ConnError::FrameTooLarge { len });
    }
    if input.len() < FRAME_HEADER + len {
        return Ok(None);
    }
    let stream = u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
    Ok(Some((input[3], input[4], stream, len)))
}

/// A DATA or HEADERS payload without its padding.
fn strip_padding(flags: u8, payload: &[u8]) -> Result<&[u8], ConnError> {
    if flags & frame::PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or(ConnError::Protocol("a padded frame without its pad length"))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|n| &rest[..n])
        .ok_or(ConnError::Protocol("padding longer than the frame"))
}

/// A HEADERS payload's header block fragment (padding and priority
/// removed).
fn strip_headers(flags: u8, payload: &[u8]) -> Result<&[u8], ConnError> {
    let fragment = strip_padding(flags, payload)?;
    if flags & frame::PRIORITY == 0 {
        return Ok(fragment);
    }
    fragment
        .get(5..)
        .ok_or(ConnError::Protocol("HEADERS too short for its priority"))
}

/// Decodes one header block, keeping `:status`, `grpc-status` and
/// `grpc-message`.
fn decode_block(hpack: &mut Decoder<'static>, block: &[u8]) -> Result<Heard, ConnError> {
    let mut heard = Heard::default();
    let mut bad = None;
    hpack
        .decode_with_cb(
            block,
            |name: Cow<'_, [u8]>, value: Cow<'_, [u8]>| match &*name {
                b":status" => match parse_u32(&value) {
                    Some(s) if s <= u32::from(u16::MAX) => heard.status = Some(s as u16),
                    _ => bad = Some(":status is not a number"),
                },
                b"grpc-status" => match parse_u32(&value) {
                    Some(s) => heard.grpc_status = Some(s),
                    None => bad = Some("grpc-status is not a number"),
                },
                b"grpc-message" => {
                    heard.grpc_message = String::from_utf8_lossy(&value).into_owned()
                }
                _ => {}
            },
        )
        .map_err(ConnError::Hpack)?;
    match bad {
        Some(what) => Err(ConnError::Protocol(what)),
        None => Ok(heard),
    }
}

fn parse_u32(digits: &[u8]) -> Option<u32> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_encode_as_rfc_7541_shows() {
        // C.1.1, C.1.2, C.1.3.
        let mut out = Vec::new();
        put_int(&mut out, 5, 0, 10);
        assert_eq!(out, [0x0a]);
        out.clear();
        put_int(&mut out, 5, 0, 1337);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        out.clear();
        put_int(&mut out, 8, 0, 42);
        assert_eq!(out, [0x2a]);
        out.clear();
        put_int(&mut out, 4, 0, 31);
        assert_eq!(out, [0x0f, 0x10]);
    }

    #[test]
    fn the_request_block_decodes_to_a_grpc_call() {
        let block = request_headers("127.0.0.1:4000", "/tailmesh.v1.Hop/Call");
        let headers = Decoder::new()
            .decode(&block)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let text: Vec<(String, String)> = headers
            .into_iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(&n).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect();
        let want = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/tailmesh.v1.Hop/Call"),
            (":authority", "127.0.0.1:4000"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(text, want);
    }

    #[test]
    fn the_request_message_is_what_prost_encodes() {
        use prost::Message;
        for (id, len) in [(1, 64), (300, 0), (u64::MAX, 5), (127, 200)] {
            let payload = payload_bytes(len);
            let mut out = Vec::new();
            put_request(&mut out, id, &payload);
            let want = tailmesh_proto::pb::CallRequest {
                request_id: id,
                payload: payload.clone().into(),
                ..Default::default()
            };
            assert_eq!(out.len(), GRPC_PREFIX + request_message_len(id, len));
            assert_eq!(&out[..1], &[0]);
            assert_eq!(&out[1..5], &(want.encoded_len() as u32).to_be_bytes());
            assert_eq!(out[5..], want.encode_to_vec()[..], "id {id}, {len} bytes");
        }
    }

    fn framed_reply(request_id: u64, payload: &[u8]) -> Vec<u8> {
        use prost::Message;
        let reply = tailmesh_proto::pb::CallReply {
            request_id,
            payload: payload.to_vec().into(),
            path: vec![tailmesh_proto::pb::HopRecord {
                hop: "floor".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let msg = reply.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        out.extend_from_slice(&msg);
        out
    }

    #[test]
    fn a_reply_must_echo_its_request() {
        let payload = payload_bytes(64);
        let good = framed_reply(7, &payload);
        assert!(check_reply(&good, 7, &payload).is_ok());
        assert!(
            check_reply(&good, 8, &payload).is_err(),
            "another request's id"
        );
        assert!(
            check_reply(&good, 7, &payload[1..]).is_err(),
            "another payload"
        );
        assert!(
            check_reply(&good[..good.len() - 1], 7, &payload).is_err(),
            "truncated"
        );
        let mut compressed = good.clone();
        compressed[0] = 1;
        assert!(check_reply(&compressed, 7, &payload).is_err(), "compressed");
        assert!(check_reply(&[], 7, &payload).is_err(), "empty");
    }

    #[test]
    fn frames_are_taken_only_when_complete() {
        let mut out = Vec::new();
        put_frame_header(&mut out, 3, frame::DATA, frame::END_STREAM, 5);
        out.extend_from_slice(b"abc");
        assert!(matches!(frame_at(&out[..8]), Ok(None)));
        assert!(matches!(frame_at(&out[..11]), Ok(None)));
        assert!(matches!(
            frame_at(&out),
            Ok(Some((frame::DATA, frame::END_STREAM, 5, 3)))
        ));
        let mut big = Vec::new();
        put_frame_header(&mut big, MAX_FRAME + 1, frame::DATA, 0, 1);
        assert!(matches!(
            frame_at(&big),
            Err(ConnError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn padding_is_removed_and_checked() {
        assert_eq!(
            strip_padding(frame::PADDED, &[2, b'a', b'b', 0, 0]).ok(),
            Some(&b"ab"[..])
        );
        assert!(strip_padding(frame::PADDED, &[5, b'a']).is_err());
        assert!(strip_padding(frame::PADDED, &[]).is_err());
        assert_eq!(strip_padding(0, b"xy").ok(), Some(&b"xy"[..]));
    }
}
