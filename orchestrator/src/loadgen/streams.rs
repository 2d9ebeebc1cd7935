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
    Drain, Part, Shared, paced,
    schedule::{Due, Schedule},
};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
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
/// `streams` once [`StreamTally::report`]ed. A generator process sends its
/// tally to the orchestrator whole (its histograms bucket by bucket), which
/// adds the generators' together.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "TallyWire", try_from = "TallyWire")]
pub(crate) struct StreamTally {
    /// Its counts; the times' summaries are left empty until
    /// [`StreamTally::report`].
    report: StreamReport,
    /// From a stream's first message's due time to its answer, µs.
    first: Histogram<u64>,
    /// From a stream's first message's due time to its last one's end, µs.
    duration: Histogram<u64>,
}

/// The longest stream time a tally holds, µs: an hour.
const LONGEST_US: u64 = 3_600_000_000;

fn stream_times() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LONGEST_US, 3)
        .expect("1 us to 1 h at 3 significant digits is a valid histogram")
}

impl Default for StreamTally {
    fn default() -> Self {
        StreamTally {
            report: StreamReport::default(),
            first: stream_times(),
            duration: stream_times(),
        }
    }
}

impl StreamTally {
    /// A stream opened: how many this tally saw open before it.
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

    /// Adds `other`'s streams (another generator's) to these: counts
    /// summed, the peak the larger, the times bucket for bucket.
    pub(crate) fn add(&mut self, other: &StreamTally) {
        let (r, o) = (&mut self.report, &other.report);
        r.opened += o.opened;
        r.completed += o.completed;
        for (code, n) in &o.aborted {
            *r.aborted.entry(code.clone()).or_default() += n;
        }
        r.refused_by_cap += o.refused_by_cap;
        r.peak_in_flight = r.peak_in_flight.max(o.peak_in_flight);
        // Both have the same bounds: nothing to refuse.
        let _ = self.first.add(&other.first);
        let _ = self.duration.add(&other.duration);
    }

    /// The report, its times summarized.
    pub(crate) fn report(&self) -> StreamReport {
        StreamReport {
            first_message: Percentiles::from_histogram(&self.first),
            duration: Percentiles::from_histogram(&self.duration),
            ..self.report.clone()
        }
    }
}

/// A [`StreamTally`] on the wire between a generator process and the
/// orchestrator: its counts, and each histogram as (value, count) pairs,
/// one per bucket recorded, the value the bucket's highest (which lands in
/// the same bucket again).
#[derive(Serialize, Deserialize)]
struct TallyWire {
    counts: StreamReport,
    first_message_us: Vec<(u64, u64)>,
    duration_us: Vec<(u64, u64)>,
}

/// Why a tally from a generator process was refused.
#[derive(Debug, thiserror::Error)]
#[error("a stream time of {value_us} us, past the longest a tally holds ({LONGEST_US} us)")]
pub(crate) struct TallyError {
    value_us: u64,
}

impl From<StreamTally> for TallyWire {
    fn from(t: StreamTally) -> Self {
        let buckets = |h: &Histogram<u64>| {
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect()
        };
        TallyWire {
            first_message_us: buckets(&t.first),
            duration_us: buckets(&t.duration),
            counts: t.report,
        }
    }
}

impl TryFrom<TallyWire> for StreamTally {
    type Error = TallyError;

    fn try_from(w: TallyWire) -> Result<Self, TallyError> {
        let histogram = |buckets: &[(u64, u64)]| {
            let mut h = stream_times();
            for &(value_us, count) in buckets {
                h.record_n(value_us, count)
                    .map_err(|_| TallyError { value_us })?;
            }
            Ok::<_, TallyError>(h)
        };
        Ok(StreamTally {
            first: histogram(&w.first_message_us)?,
            duration: histogram(&w.duration_us)?,
            report: w.counts,
        })
    }
}

/// Where message `id` of the open loop's schedule goes, with `slots`
/// streams at once of `per_stream` messages each: the stream's number, in
/// the order the streams open (the schedule opens `slots` of them, one a
/// slot, every `per_stream` rounds of the slots), its slot, and the
/// message's place on it.
fn stream_of(id: u64, slots: u64, per_stream: u64) -> (u64, usize, u64) {
    let (round, slot) = (id / slots, id % slots);
    let number = round / per_stream * slots + slot;
    (number, slot as usize, round % per_stream)
}

/// Sends the open loop's schedule as messages on streams, and hands every
/// message's record to `drain`. As the open loop: the measured phase lasts
/// from the end of warmup to the next due time when sending stopped. A
/// part of the load sends the streams it [`Part::owns`] by their numbers,
/// every message of each: the streams and their messages keep the numbers,
/// ids and due times the whole load gives them.
#[allow(clippy::too_many_arguments)]
pub(super) async fn stream_loop<S: RecordSink + ?Sized>(
    shared: &Arc<Shared>,
    schedule: Schedule,
    rate: f64,
    streams: &StreamLoad,
    stop_at: Stop,
    sleeper: Sleeper,
    part: Part,
    drain: &mut Drain<'_, S>,
    mut stop: watch::Receiver<u32>,
) -> ((Duration, bool), StreamTally) {
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
    let mut own_measured = 0u64;
    let mut pacer = shared.pacing.pacer(&sleeper);
    let mut next_id = 0u64;
    loop {
        let id = next_id;
        next_id += 1;
        let (intended, measuring) = match due.next() {
            Ok(next) => next,
            Err(end) => {
                measured_end = end;
                break;
            }
        };
        let (number, slot, nth) = stream_of(id, slots, per_stream);
        // Another part's stream.
        if !part.owns(number) {
            continue;
        }
        if !paced(&mut pacer, intended, &mut stop).await {
            interrupted = true;
            measured_end = Instant::now().saturating_duration_since(measure_from);
            break;
        }
        if nth == 0 {
            // The slot's last stream has all its messages: it ends once
            // they are answered, and this one opens.
            let (tx, rx) = mpsc::unbounded_channel();
            tally.opened();
            open[slot] = Some((tx, number));
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
        own_measured += u64::from(measuring);
        drain.tick(
            own_measured,
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
    ((measured_end, interrupted), tally)
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
/// opens. Each stream's end is counted in the tally. A part of the load
/// numbers its streams as it does its requests ([`Part::closed_id`]): the
/// parts' numbers are disjoint, and the whole load's are in the order the
/// streams opened.
pub(super) struct WorkerStream {
    messages: u64,
    part: Part,
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
        part: Part,
        tally: Arc<std::sync::Mutex<StreamTally>>,
        measure_from: Instant,
    ) -> Self {
        WorkerStream {
            messages,
            part,
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
            let opened = self
                .tally
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .opened();
            number = Some(self.part.closed_id(opened));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_send_whole_streams_numbered_as_the_whole_load_numbers_them() {
        let (slots, per_stream) = (4, 5);
        // The whole load opens a stream at each slot's first message and
        // numbers them as they open.
        let mut opened = 0;
        let mut whole = Vec::new();
        for id in 0..203 {
            let (number, slot, nth) = stream_of(id, slots, per_stream);
            assert_eq!(slot as u64, id % slots);
            if nth == 0 {
                assert_eq!(number, opened, "message {id}");
                opened += 1;
            }
            whole.push((id, number, nth));
        }
        // Ten rounds of 4 streams, and 3 opened by messages 200 to 202.
        assert_eq!(opened, 43);
        // Three parts: every message sent by one of them, each stream's
        // messages all by the same one, each part sending some.
        let parts: Vec<Part> = (0..3).map(|index| Part { index, of: 3 }).collect();
        let mut by_stream = std::collections::HashMap::new();
        let mut each = [0u32; 3];
        for &(id, number, _) in &whole {
            let owners: Vec<&Part> = parts.iter().filter(|p| p.owns(number)).collect();
            assert_eq!(owners.len(), 1, "message {id}");
            each[owners[0].index as usize] += 1;
            let owner = *by_stream.entry(number).or_insert(owners[0].index);
            assert_eq!(owner, owners[0].index, "stream {number}");
        }
        assert!(each.iter().all(|&n| n > 60), "{each:?}");
    }

    /// A stream's end that held, with `first` and `last` µs from its first
    /// message's due time.
    fn held(first: u64, last: u64) -> StreamEnd {
        StreamEnd {
            aborted: None,
            refused: 0,
            peak: first % 5,
            times: Some(StreamTimes {
                first: 0,
                first_due: Duration::ZERO,
                first_end: Some(Duration::from_micros(first)),
                last_end: Duration::from_micros(last),
            }),
        }
    }

    #[test]
    fn generators_tallies_cross_the_wire_and_add_up_to_the_whole_bucket_for_bucket() {
        let mut whole = StreamTally::default();
        let mut parts = [StreamTally::default(), StreamTally::default()];
        for k in 0..400u64 {
            let part = &mut parts[(k % 2) as usize];
            for tally in [&mut whole, &mut *part] {
                tally.opened();
                if k % 50 == 7 {
                    tally.ended(StreamEnd {
                        aborted: Some(tonic::Code::Unavailable),
                        refused: 2,
                        peak: 3,
                        times: None,
                    });
                } else {
                    tally.ended(held(100 + k * 37, 5_000 + k * k * 13));
                }
            }
        }
        let [a, b] = parts;
        let over = |t: &StreamTally| -> StreamTally {
            let text = serde_json::to_string(t).expect("a tally serializes");
            serde_json::from_str(&text).expect("and reads back")
        };
        let mut merged = over(&a);
        merged.add(&over(&b));
        assert_eq!(merged.first, whole.first);
        assert_eq!(merged.duration, whole.duration);
        let report = merged.report();
        assert_eq!(report, whole.report());
        assert_eq!(
            (report.opened, report.completed, report.refused_by_cap),
            (400, 392, 16)
        );
        assert_eq!(report.aborted.get("unavailable"), Some(&8));
        assert_eq!(report.first_message.count, 392);
    }

    #[test]
    fn a_tally_with_a_time_past_an_hour_is_refused_and_named() {
        let text = r#"{"counts":{"opened":1,"completed":1,"aborted":{},"refused_by_cap":0,
            "peak_in_flight":1},"first_message_us":[[5000000000,1]],"duration_us":[]}"#;
        let err = serde_json::from_str::<StreamTally>(text)
            .expect_err("a time past the tally's bounds")
            .to_string();
        assert!(
            err.contains("a stream time of 5000000000 us, past the longest a tally holds"),
            "{err}"
        );
    }
}
