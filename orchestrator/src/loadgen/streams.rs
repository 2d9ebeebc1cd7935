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

use std::{sync::Arc, time::Duration};

use futures::{StreamExt as _, stream::FuturesUnordered};
use tailmesh_services::{hop::stream::Streams, timer::Sleeper};
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
    time::Instant,
};

use super::{Drain, STOP_SENDING, Shared, pacing, schedule::Schedule};
use crate::{
    record::{Outcome, RecordSink, RequestRecord, StreamReport},
    scenario::{Stop, StreamLoad},
};

/// One message of a stream's, due at `intended`.
struct Due {
    id: u64,
    intended: Instant,
}

/// What a stream's task hands back: each message's record (and whether it
/// belongs to warmup), then, once, how the stream ended.
enum Done {
    Message(RequestRecord, bool),
    Ended {
        refused: u64,
        peak: u64,
        aborted: Option<tonic::Code>,
    },
}

/// Sends the open loop's schedule as messages on streams, and hands every
/// message's record to `drain`. As the open loop: the measured phase lasts
/// from the end of warmup to the next due time when sending stopped.
#[allow(clippy::too_many_arguments)]
pub(super) async fn stream_loop<S: RecordSink + ?Sized>(
    shared: &Arc<Shared>,
    mut schedule: Schedule,
    streams: &StreamLoad,
    stop_at: Stop,
    sleeper: Sleeper,
    drain: &mut Drain<'_, S>,
    mut stop: watch::Receiver<u32>,
) -> ((Duration, bool), StreamReport) {
    let slots = u64::from(streams.streams.max(1));
    let per_stream = u64::from(streams.messages.max(1));
    let cap = usize::try_from(streams.in_flight.max(1)).unwrap_or(usize::MAX);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    // Each slot's open stream: where its next messages go.
    let mut open: Vec<Option<mpsc::UnboundedSender<Due>>> = vec![None; slots as usize];
    let mut tasks = JoinSet::new();
    let mut report = StreamReport::default();
    let measure_from = shared.origin + shared.warmup;
    let mut measured_sent = 0u64;
    let mut interrupted = false;
    let measured_end;
    let pacing = pacing::Pacing::from_env();
    let _placed = pacing.enter();
    let mut id = 0u64;
    loop {
        let intended = shared.origin + schedule.next_offset();
        let measuring = intended >= measure_from;
        let finished = match stop_at {
            Stop::Duration(d) => intended >= measure_from + d,
            Stop::Requests(n) => measuring && measured_sent >= n,
        };
        if finished {
            measured_end = intended.saturating_duration_since(measure_from);
            break;
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|n| *n >= STOP_SENDING) => {
                interrupted = true;
                measured_end = Instant::now().saturating_duration_since(measure_from);
                break;
            }
            () = pacing.wait_until(&sleeper, intended) => {}
        }
        let slot = (id % slots) as usize;
        let nth = (id / slots) % per_stream;
        if nth == 0 {
            // The slot's last stream has all its messages: it ends once
            // they are answered, and this one opens.
            let (tx, rx) = mpsc::unbounded_channel();
            open[slot] = Some(tx);
            report.opened += 1;
            tasks.spawn(one_stream(Arc::clone(shared), id, cap, rx, done_tx.clone()));
        }
        if let Some(tx) = &open[slot] {
            // A stream's task takes every message it is given until its
            // sender drops.
            let _ = tx.send(Due { id, intended });
        }
        if nth + 1 == per_stream {
            open[slot] = None;
        }
        id += 1;
        if measuring {
            measured_sent += 1;
        }
        drain.tick(
            measured_sent,
            intended.saturating_duration_since(measure_from),
        );
        while let Ok(done) = done_rx.try_recv() {
            take(done, drain, &mut report);
        }
    }
    // The open streams get no more messages: each ends once its messages
    // are answered.
    open.clear();
    drop(done_tx);
    while let Some(done) = done_rx.recv().await {
        take(done, drain, &mut report);
    }
    while tasks.join_next().await.is_some() {}
    ((measured_end, interrupted), report)
}

/// Hands one of a stream's results on.
fn take<S: RecordSink + ?Sized>(done: Done, drain: &mut Drain<'_, S>, report: &mut StreamReport) {
    match done {
        Done::Message(record, warmup) => {
            drain.stats.peak_held = drain.stats.peak_held.max(1);
            drain.take(record, warmup);
        }
        Done::Ended {
            refused,
            peak,
            aborted,
        } => {
            report.refused_by_cap += refused;
            report.peak_in_flight = report.peak_in_flight.max(peak);
            count_end(report, aborted);
        }
    }
}

/// Counts a stream's end in `report`: held to its end, or broken with
/// `aborted`'s code.
pub(super) fn count_end(report: &mut StreamReport, aborted: Option<tonic::Code>) {
    match aborted {
        None => report.completed += 1,
        Some(code) => {
            let name = tailmesh_analysis::record::code_label(crate::wire::grpc_code(code));
            *report.aborted.entry(name).or_default() += 1;
        }
    }
}

/// One stream: its messages sent in the order they come, each answered,
/// failed, refused by the cap or timed out; then how it ended.
async fn one_stream(
    shared: Arc<Shared>,
    first: u64,
    cap: usize,
    mut due: mpsc::UnboundedReceiver<Due>,
    done: mpsc::UnboundedSender<Done>,
) {
    let streams = Streams::once();
    let measure_from = shared.origin + shared.warmup;
    let mut waiting = FuturesUnordered::new();
    let (mut refused, mut peak) = (0u64, 0usize);
    let mut more = true;
    loop {
        tokio::select! {
            // Answers first, so a message just pushed is polled (and sent)
            // before the next one is taken: the wire order is the due
            // order.
            biased;
            Some((record, warmup)) = waiting.next(), if !waiting.is_empty() => {
                let _ = done.send(Done::Message(record, warmup));
            }
            message = due.recv(), if more => match message {
                Some(Due { id, intended }) if waiting.len() >= cap => {
                    refused += 1;
                    let record = refused_record(id, intended, measure_from, cap);
                    let _ = done.send(Done::Message(record, intended < measure_from));
                }
                Some(Due { id, intended }) => {
                    waiting.push(shared.send(id, intended, Some((streams.clone(), first))));
                    peak = peak.max(waiting.len());
                }
                None => more = false,
            },
            else => break,
        }
    }
    let aborted = streams.ended_with().map(|status| status.code());
    let _ = done.send(Done::Ended {
        refused,
        peak: peak as u64,
        aborted,
    });
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
    }
}
