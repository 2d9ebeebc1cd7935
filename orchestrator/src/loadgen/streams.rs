//! The open loop's messages on streams (`[load.streams]`).
//!
//! The one schedule of the open loop (uniform, at `[load] rate`) is dealt
//! out to `streams` slots in turn: message `k` of the schedule goes to slot
//! `k % streams`, so each slot's messages are due evenly at `streams /
//! rate` apart, and slots are staggered by one gap of the whole. A slot's
//! stream carries `messages` of them, then ends; the next stream opens in
//! its slot with its first message. A message keeps the id and due time it
//! has in the schedule, so its draws (work, faults) are the ones a unary
//! run of the same seed makes.
//!
//! Each stream is one task: it sends its messages in the order they are
//! due (a late one at once, never skipped), at most `in_flight` awaiting
//! their answers; a message due while the stream has that many is not
//! sent, and is recorded as refused by the cap (RESOURCE_EXHAUSTED). Every
//! message ends as a record: answered, failed (in band, or with the
//! stream when it broke: its later messages fail with the stream's
//! status, as they are lost with it), refused, or timed out.
//!
//! A client stream's task sends its messages the same way, none answered
//! on its own; once its last is sent it ends its side and waits, up to the
//! load's timeout after that last message was due, for the stream's one
//! reply. Each message then ends when the reply says it was done at the
//! last hop it reached (on the Unix clock, which the hops share with the
//! load generator on one machine): a timeout if that is past its own
//! timeout, its failure below, or lost with the stream.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt as _, stream::FuturesUnordered};
use tailmesh_proto::pb::{CallReply, CallRequest};
use tailmesh_services::{hop::stream::Streams, timer::Sleeper};
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
    time::Instant,
};

use super::{
    Drain, Shared, paced,
    schedule::{Due, Schedule},
};
use hdrhistogram::Histogram;
use tailmesh_analysis::stats::Percentiles;

use crate::{
    record::{Outcome, RecordSink, RequestRecord, StreamPlace, StreamReport},
    scenario::{Stop, StreamLoad, Streaming},
};

/// A message's stream: its streams, its first message's id (the stream's
/// entry is drawn by it), and the message's place on it.
pub(super) struct OnStream {
    pub(super) streams: Streams,
    pub(super) first: u64,
    pub(super) place: StreamPlace,
}

/// One message of a stream's, due at `intended`, and its place there.
struct Message {
    id: u64,
    intended: Instant,
    place: StreamPlace,
}

/// What a stream's task hands back: each message's record (and whether it
/// belongs to warmup), then, once, how the stream ended.
enum Done {
    Message(RequestRecord, bool),
    Ended(StreamEnd),
}

/// How one stream ended, as the load generator saw it.
#[derive(Debug, Default)]
pub(super) struct StreamEnd {
    /// The status it broke with; `None`: it held to its end.
    aborted: Option<tonic::Code>,
    /// Its messages refused by the in-flight cap.
    refused: u64,
    /// The most of its messages awaiting answers at once.
    peak: u64,
    /// Its times, when its first message was measured (not warmup's).
    times: Option<StreamTimes>,
}

/// A stream's times on the measured clock, from its messages' records.
#[derive(Clone, Copy, Debug)]
pub(super) struct StreamTimes {
    /// Its first message's id, due time and end (`None` until it ended).
    first: u64,
    first_due: Duration,
    first_end: Option<Duration>,
    /// The latest end of one of its messages.
    last_end: Duration,
}

impl StreamTimes {
    /// A stream whose first message is `first`, due at `due` on the
    /// measured clock; `None` for one that began in warmup.
    fn starting(first: u64, due: Duration, warmup: bool) -> Option<Self> {
        (!warmup).then_some(StreamTimes {
            first,
            first_due: due,
            first_end: None,
            last_end: due,
        })
    }

    /// One of its messages ended.
    fn saw(&mut self, record: &RequestRecord) {
        if record.id == self.first {
            self.first_end = Some(record.end);
        }
        self.last_end = self.last_end.max(record.end);
    }
}

/// The streams of a load phase, counted as they end: summary.json's
/// `streams` once [`StreamTally::finish`]ed.
#[derive(Debug)]
pub(super) struct StreamTally {
    report: StreamReport,
    /// From a stream's first message's due time to its answer, µs.
    first: Histogram<u64>,
    /// From a stream's first message's due time to its last one's end, µs.
    duration: Histogram<u64>,
}

impl Default for StreamTally {
    fn default() -> Self {
        let histogram = || {
            Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("1 us to 1 h at 3 significant digits is a valid histogram")
        };
        StreamTally {
            report: StreamReport::default(),
            first: histogram(),
            duration: histogram(),
        }
    }
}

impl StreamTally {
    /// A stream opened: its number, in the order they opened.
    pub(super) fn opened(&mut self) -> u64 {
        self.report.opened += 1;
        self.report.opened - 1
    }

    /// A stream ended.
    pub(super) fn ended(&mut self, end: StreamEnd) {
        let r = &mut self.report;
        r.refused_by_cap += end.refused;
        r.peak_in_flight = r.peak_in_flight.max(end.peak);
        match end.aborted {
            None => r.completed += 1,
            Some(code) => {
                let name = tailmesh_analysis::record::code_label(crate::wire::grpc_code(code));
                *r.aborted.entry(name).or_default() += 1;
            }
        }
        if let Some(t) = end.times {
            let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
            if let Some(first_end) = t.first_end {
                self.first
                    .saturating_record(us(first_end.saturating_sub(t.first_due)));
            }
            self.duration
                .saturating_record(us(t.last_end.saturating_sub(t.first_due)));
        }
    }

    /// The report, its times summarized.
    pub(super) fn finish(self) -> StreamReport {
        StreamReport {
            first_message: Percentiles::from_histogram(&self.first),
            duration: Percentiles::from_histogram(&self.duration),
            ..self.report
        }
    }
}

/// Sends the open loop's schedule as messages on streams, and hands every
/// message's record to `drain`. As the open loop: the measured phase lasts
/// from the end of warmup to the next due time when sending stopped.
#[allow(clippy::too_many_arguments)]
pub(super) async fn stream_loop<S: RecordSink + ?Sized>(
    shared: &Arc<Shared>,
    schedule: Schedule,
    rate: f64,
    streams: &StreamLoad,
    stop_at: Stop,
    sleeper: Sleeper,
    drain: &mut Drain<'_, S>,
    mut stop: watch::Receiver<u32>,
) -> ((Duration, bool), StreamReport) {
    let slots = u64::from(streams.streams.max(1));
    let per_stream = u64::from(streams.messages.max(1));
    let server = streams.kind == Streaming::Server;
    let client = streams.kind == Streaming::Client;
    // A server stream's messages come whatever is awaited, and a client
    // stream's are all answered at its end: no cap.
    let cap = if server || client {
        usize::MAX
    } else {
        usize::try_from(streams.in_flight.max(1)).unwrap_or(usize::MAX)
    };
    // A server stream asks for its messages at once: as many as the
    // schedule has for its slot.
    let mut due = Due::new(schedule, shared.origin, shared.warmup, stop_at);
    let scheduled = server.then(|| due.clone().count());
    let interval = Duration::from_secs_f64(slots as f64 / rate);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    // Each slot's open stream: where its next messages go.
    let mut open: Vec<Option<(mpsc::UnboundedSender<Message>, u64)>> = vec![None; slots as usize];
    let mut tasks = JoinSet::new();
    let mut tally = StreamTally::default();
    let measure_from = shared.origin + shared.warmup;
    let mut interrupted = false;
    let measured_end;
    let mut id = 0u64;
    let mut pacer = shared.pacing.pacer(&sleeper);
    loop {
        let intended = match due.next() {
            Ok((intended, _)) => intended,
            Err(end) => {
                measured_end = end;
                break;
            }
        };
        if !paced(&mut pacer, intended, &mut stop).await {
            interrupted = true;
            measured_end = Instant::now().saturating_duration_since(measure_from);
            break;
        }
        let slot = (id % slots) as usize;
        let nth = (id / slots) % per_stream;
        if nth == 0 {
            // The slot's last stream has all its messages: it ends once
            // they are answered, and this one opens.
            let (tx, rx) = mpsc::unbounded_channel();
            open[slot] = Some((tx, tally.opened()));
            let streams = match scheduled {
                Some(total) => {
                    let count = (total.saturating_sub(id)).div_ceil(slots).min(per_stream);
                    Streams::server(CallRequest {
                        request_id: id,
                        payload: shared.payload.clone(),
                        stream_messages: u32::try_from(count).unwrap_or(u32::MAX),
                        stream_stride: slots,
                        stream_interval_ns: u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
                        ..CallRequest::default()
                    })
                }
                None if client => Streams::client(),
                None => Streams::once(),
            };
            if client {
                tasks.spawn(one_client_stream(
                    Arc::clone(shared),
                    streams,
                    id,
                    rx,
                    done_tx.clone(),
                ));
            } else {
                tasks.spawn(one_stream(
                    Arc::clone(shared),
                    streams,
                    id,
                    cap,
                    rx,
                    done_tx.clone(),
                ));
            }
        }
        if let Some((tx, stream)) = &open[slot] {
            // A stream's task takes every message it is given until its
            // sender drops.
            let place = StreamPlace {
                stream: *stream,
                message: u32::try_from(nth).unwrap_or(u32::MAX),
            };
            let _ = tx.send(Message {
                id,
                intended,
                place,
            });
        }
        if nth + 1 == per_stream {
            open[slot] = None;
        }
        id += 1;
        drain.tick(
            due.measured(),
            intended.saturating_duration_since(measure_from),
        );
        while let Ok(done) = done_rx.try_recv() {
            take(done, drain, &mut tally);
        }
    }
    // The open streams get no more messages: each ends once its messages
    // are answered.
    open.clear();
    drop(done_tx);
    while let Some(done) = done_rx.recv().await {
        take(done, drain, &mut tally);
    }
    while tasks.join_next().await.is_some() {}
    ((measured_end, interrupted), tally.finish())
}

/// Hands one of a stream's results on.
fn take<S: RecordSink + ?Sized>(done: Done, drain: &mut Drain<'_, S>, tally: &mut StreamTally) {
    match done {
        Done::Message(record, warmup) => {
            drain.stats.peak_held = drain.stats.peak_held.max(1);
            drain.take(record, warmup);
        }
        Done::Ended(end) => tally.ended(end),
    }
}

/// One stream: its messages sent in the order they come, each answered,
/// failed, refused by the cap or timed out; then how it ended.
async fn one_stream(
    shared: Arc<Shared>,
    streams: Streams,
    first: u64,
    cap: usize,
    mut due: mpsc::UnboundedReceiver<Message>,
    done: mpsc::UnboundedSender<Done>,
) {
    let measure_from = shared.origin + shared.warmup;
    let mut waiting = FuturesUnordered::new();
    let (mut refused, mut peak) = (0u64, 0usize);
    let mut times: Option<StreamTimes> = None;
    let mut more = true;
    loop {
        tokio::select! {
            // Answers first, so a message just pushed is polled (and sent)
            // before the next one is taken: the wire order is the due
            // order.
            biased;
            Some((record, warmup)) = waiting.next(), if !waiting.is_empty() => {
                if let Some(t) = &mut times {
                    t.saw(&record);
                }
                let _ = done.send(Done::Message(record, warmup));
            }
            message = due.recv(), if more => match message {
                Some(Message { id, intended, place }) if waiting.len() >= cap => {
                    refused += 1;
                    let mut record = refused_record(id, intended, measure_from, cap);
                    record.stream = Some(place);
                    if let Some(t) = &mut times {
                        t.saw(&record);
                    }
                    let _ = done.send(Done::Message(record, intended < measure_from));
                }
                Some(Message { id, intended, place }) => {
                    if id == first {
                        let due = intended.saturating_duration_since(measure_from);
                        times = StreamTimes::starting(id, due, intended < measure_from);
                    }
                    let on = OnStream {
                        streams: streams.clone(),
                        first,
                        place,
                    };
                    waiting.push(shared.send(id, intended, Some(on)));
                    peak = peak.max(waiting.len());
                }
                None => more = false,
            },
            else => break,
        }
    }
    let _ = done.send(Done::Ended(StreamEnd {
        aborted: streams.ended_with().map(|status| status.code()),
        refused,
        peak: peak as u64,
        times,
    }));
}

/// One client stream: its messages sent in the order they come, then its
/// one reply awaited, and every message's record made from its answer
/// there (see the module's documentation); then how it ended.
async fn one_client_stream(
    shared: Arc<Shared>,
    streams: Streams,
    first: u64,
    mut due: mpsc::UnboundedReceiver<Message>,
    done: mpsc::UnboundedSender<Done>,
) {
    let measure_from = shared.origin + shared.warmup;
    let mut times: Option<StreamTimes> = None;
    let emit = |record: RequestRecord, warmup: bool, times: &mut Option<StreamTimes>| {
        if let Some(t) = times {
            t.saw(&record);
        }
        let _ = done.send(Done::Message(record, warmup));
    };
    // Each message sent: its number on the stream, its record so far.
    let mut sent: Vec<(u64, RequestRecord, bool)> = Vec::new();
    let mut last_due = None;
    while let Some(Message {
        id,
        intended,
        place,
    }) = due.recv().await
    {
        if id == first {
            let due = intended.saturating_duration_since(measure_from);
            times = StreamTimes::starting(id, due, intended < measure_from);
        }
        last_due = Some(intended);
        let on = OnStream {
            streams: streams.clone(),
            first,
            place,
        };
        let (record, warmup) = shared.send(id, intended, Some(on)).await;
        match (&record.outcome, streams.take_forwarded().first()) {
            (Outcome::Ok, Some(f)) => sent.push((f.number, record, warmup)),
            // Not sent: the stream could not be opened, or broke.
            _ => emit(record, warmup, &mut times),
        }
    }
    let wait = last_due.map_or(shared.timeout, |d| {
        (d + shared.timeout).saturating_duration_since(Instant::now())
    });
    let reply = match streams.finish(Some(wait)).await.into_iter().next() {
        Some((_, reply)) => reply,
        None => Ok(Vec::new()),
    };
    let (now, now_unix) = (Instant::now(), tailmesh_units::unix_nanos());
    let at = |unix: u64| {
        now.checked_sub(Duration::from_nanos(now_unix.saturating_sub(unix)))
            .unwrap_or(now)
            .saturating_duration_since(measure_from)
    };
    // Each answer taken by its message's number, once.
    let (mut answers, lost): (std::collections::HashMap<u64, CallReply>, _) = match reply {
        Ok(answers) => (answers.into_iter().map(|a| (a.message, a)).collect(), None),
        Err(status) => (Default::default(), Some(status)),
    };
    let peak = sent.len() as u64;
    for (number, mut record, warmup) in sent {
        let (outcome, end, path) = match (&lost, answers.remove(&number)) {
            (Some(status), _) if status.code() == tonic::Code::DeadlineExceeded => {
                (Outcome::Timeout, at(now_unix), Vec::new())
            }
            (Some(status), _) => (
                error(status.code(), status.message()),
                at(now_unix),
                Vec::new(),
            ),
            (None, None) => (
                error(
                    tonic::Code::Internal,
                    &format!("no answer to message {number} in the stream's reply"),
                ),
                at(now_unix),
                Vec::new(),
            ),
            (None, Some(a)) if a.code != 0 => (
                error(tonic::Code::from_i32(a.code), &a.error),
                at(a.done_unix_ns),
                Vec::new(),
            ),
            (None, Some(a)) => {
                let end = at(a.done_unix_ns);
                let outcome = if end.saturating_sub(record.intended) > shared.timeout {
                    Outcome::Timeout
                } else {
                    Outcome::Ok
                };
                (outcome, end, crate::wire::path_of(a.path))
            }
        };
        record.outcome = outcome;
        record.end = end.max(record.start);
        record.path = path;
        emit(record, warmup, &mut times);
    }
    let _ = done.send(Done::Ended(StreamEnd {
        aborted: lost.map(|status| status.code()),
        refused: 0,
        peak,
        times,
    }));
}

/// An error outcome of `code` saying `message`.
fn error(code: tonic::Code, message: &str) -> Outcome {
    Outcome::Error {
        code: crate::wire::grpc_code(code),
        message: message.to_owned(),
    }
}

/// The record of a message not sent because its stream had `cap` awaiting
/// answers.
fn refused_record(id: u64, intended: Instant, measure_from: Instant, cap: usize) -> RequestRecord {
    let now = Instant::now().saturating_duration_since(measure_from);
    RequestRecord {
        id,
        intended: intended.saturating_duration_since(measure_from),
        start: now,
        end: now,
        outcome: Outcome::Error {
            code: crate::wire::grpc_code(tonic::Code::ResourceExhausted),
            message: format!(
                "not sent: its stream had {cap} messages awaiting answers ([load.streams] \
                 in_flight)"
            ),
        },
        path: Vec::new(),
        extra_attempts: 0,
        attempts: Vec::new(),
        stream: None,
    }
}

/// A closed-loop worker's streams: its messages go on one stream, one in
/// flight, until the stream has all its messages or broke; then another
/// opens. Each stream's end is counted in the tally.
pub(super) struct WorkerStream {
    messages: u64,
    tally: Arc<std::sync::Mutex<StreamTally>>,
    measure_from: Instant,
    open: Option<WorkerOpen>,
}

/// A worker's open stream.
struct WorkerOpen {
    streams: Streams,
    /// Its first message's id: the stream's entry is drawn by it.
    first: u64,
    /// Its number, in the order the streams opened.
    number: u64,
    /// Messages sent on it.
    sent: u64,
    /// Its times, when it began after warmup.
    times: Option<StreamTimes>,
}

impl WorkerStream {
    pub(super) fn new(
        messages: u64,
        tally: Arc<std::sync::Mutex<StreamTally>>,
        measure_from: Instant,
    ) -> Self {
        WorkerStream {
            messages,
            tally,
            measure_from,
            open: None,
        }
    }

    /// The stream message `id`, sent at `now`, goes on: the open one, or a
    /// new one when that one has all its messages or broke.
    pub(super) fn next(&mut self, id: u64, now: Instant) -> OnStream {
        let renew = self
            .open
            .as_ref()
            .is_none_or(|o| o.sent >= self.messages || o.streams.ended_with().is_some());
        let mut number = None;
        if renew {
            self.close();
            number = Some(
                self.tally
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .opened(),
            );
        }
        let measure_from = self.measure_from;
        let open = self.open.get_or_insert_with(|| WorkerOpen {
            streams: Streams::once(),
            first: id,
            number: number.unwrap_or_default(),
            sent: 0,
            times: StreamTimes::starting(
                id,
                now.saturating_duration_since(measure_from),
                now < measure_from,
            ),
        });
        let place = StreamPlace {
            stream: open.number,
            message: u32::try_from(open.sent).unwrap_or(u32::MAX),
        };
        open.sent += 1;
        OnStream {
            streams: open.streams.clone(),
            first: open.first,
            place,
        }
    }

    /// A message of the open stream ended.
    pub(super) fn saw(&mut self, record: &RequestRecord) {
        if let Some(times) = self.open.as_mut().and_then(|o| o.times.as_mut()) {
            times.saw(record);
        }
    }

    /// Counts how the open stream ended, if one is open.
    fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        self.tally
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ended(StreamEnd {
                aborted: open.streams.ended_with().map(|s| s.code()),
                refused: 0,
                peak: 1,
                times: open.times,
            });
    }
}

impl Drop for WorkerStream {
    fn drop(&mut self) {
        self.close();
    }
}
