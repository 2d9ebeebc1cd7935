//! The load generator: open loop at a fixed rate, latency measured from
//! each request's intended send time (no coordinated omission, as wrk2), or
//! closed loop with a fixed number of requests in flight.
//!
//! - `schedule`: the seeded open-loop send times.
//! - `pacing`: how the open loop waits for each send time (its own
//!   alarm, spin, real-time priority, placement).
//! - `progress`: elapsed, sent, rate and p99 so far, while it runs.
//! - `selfwatch`: the generator watching itself and the machine while it runs.
//! - `standalone`: the generator against one replica already running
//!   (`tailmesh load`, for benchmarks).
//! - `fleet`: several generator processes sharing a variant's load.
//!
//! Each measured request is handed to a `RecordSink` as it completes;
//! the generator keeps none (memory holds the requests in flight).
//!
//! Every request sent is accounted for: it ends as ok, an error (by gRPC
//! code) or a timeout, and requests still in flight when the generator stops
//! are waited for (their deadline bounds the wait).

pub mod fleet;
mod pacing;
mod progress;
mod schedule;
mod selfwatch;
pub mod standalone;
mod streams;

pub(crate) use streams::StreamTally;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use pacing::Pacing;
pub(crate) use progress::{Progress, View};
use rand::Rng as _;
use schedule::Due;
pub(crate) use schedule::Schedule;
use tailmesh_model::calls::weighted_index;
use tailmesh_proto::pb::{CallReply, CallRequest};
use tailmesh_services::{
    hop::draw::keyed_rng,
    hop::{
        PushPool,
        call::{CallStack, Reach},
        policy::{Called, ClientPolicy},
        stream::Streams,
    },
    link::LinkCounts,
    timer::Sleeper,
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
    time::Instant,
};

use crate::{
    record::{MachineSamples, Outcome, PipelineStats, RecordSink, RequestRecord, WarmupCounts},
    scenario::{Load, LoadMode, Stop},
    traces::loadgen::{Ended, LoadTracer, RequestTrace, TraceIds},
};

/// What the load generator calls: its entry hops, each through the same
/// call stack a hop calls its downstream hops with (see
/// [`CallStack::for_load`] for the layers it leaves out), one drawn per
/// request by its share (`[load] entries`), seeded by the request's id.
#[derive(Clone)]
pub(crate) struct Target {
    entries: Arc<[(CallStack, f64)]>,
    seed: u64,
}

/// The draw stream of the entries.
const ENTRY_STREAM: &str = "entries";

impl Target {
    /// One hop reached by push, over `pool`.
    pub(crate) fn push(pool: PushPool, policy: ClientPolicy) -> Self {
        Self::new(vec![(Reach::Push(Arc::new(pool)), policy, 1.0)], 0)
    }

    /// The entry hops over their reaches (built by [`Reach::resolve`]),
    /// each with its client policy and its share of the requests; `seed`
    /// draws which one a request goes to.
    pub(crate) fn new(entries: Vec<(Reach, ClientPolicy, f64)>, seed: u64) -> Self {
        Target {
            entries: entries
                .into_iter()
                .map(|(reach, policy, share)| (CallStack::for_load(reach, policy), share))
                .collect(),
            seed,
        }
    }

    /// The pools of the entries reached by push: what they saw of the
    /// entry hops' replicas is the load generator's view of them.
    pub(crate) fn push_pools(&self) -> Vec<Arc<PushPool>> {
        self.entries
            .iter()
            .filter_map(|(stack, _)| match stack.reach() {
                Reach::Push(pool) => Some(Arc::clone(pool)),
                Reach::Pull(_) | Reach::Direct(_) => None,
            })
            .collect()
    }

    /// What happened to the generator's connections so far, every entry's
    /// together (`None` when none of them counts its own).
    fn link_counts(&self) -> Option<LinkCounts> {
        self.entries
            .iter()
            .filter_map(|(stack, _)| stack.reach().link_counts())
            .reduce(|a, b| a.plus(&b))
    }

    /// The entry request `id` goes to.
    fn entry_of(&self, id: u64) -> &CallStack {
        let last = self.entries.len().saturating_sub(1);
        let k = if last == 0 {
            0
        } else {
            let u: f64 = keyed_rng(self.seed, ENTRY_STREAM, id, 0).random();
            weighted_index(self.entries.iter().map(|(_, share)| *share), u)
                .map_or(0, |k| k.min(last))
        };
        &self.entries[k].0
    }

    /// Calls request `request`'s entry, or, as a message on `stream`,
    /// the entry of the stream (drawn by its first message's id).
    async fn call(
        &self,
        request: CallRequest,
        timeout: Duration,
        stream: Option<(Streams, u64)>,
    ) -> Called<CallReply> {
        match stream {
            None => {
                self.entry_of(request.request_id)
                    .call(request, Some(timeout))
                    .await
            }
            Some((streams, first)) => {
                self.entry_of(first)
                    .call_on(request, Some(timeout), Some(streams))
                    .await
            }
        }
    }
}

/// The part of the load one generator process sends when several share
/// it (`[load] generators`): open loop, every `of`-th request of the one
/// schedule from `index` on, each with the id and intended send time it
/// has in the whole; closed loop, its share of the requests in flight
/// (and of a request count), with ids `index`, `index + of`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Part {
    pub index: u32,
    pub of: u32,
}

impl Part {
    /// The whole load, one generator.
    pub(crate) const WHOLE: Part = Part { index: 0, of: 1 };

    /// Whether request `id` of an open loop's schedule is this part's.
    fn owns(self, id: u64) -> bool {
        id % u64::from(self.of.max(1)) == u64::from(self.index)
    }

    /// This part's share of `n` (requests in flight, or a count): the
    /// first `n % of` parts take one more.
    pub(crate) fn share(self, n: u64) -> u64 {
        let of = u64::from(self.of.max(1));
        n / of + u64::from(u64::from(self.index) < n % of)
    }

    /// The id of this part's `k`-th request of a closed loop.
    fn closed_id(self, k: u64) -> u64 {
        k * u64::from(self.of.max(1)) + u64::from(self.index)
    }
}

/// What one load phase produced (its requests went to the sink).
#[derive(Debug, Default)]
pub(crate) struct LoadOutcome {
    /// Warmup accounting.
    pub warmup: WarmupCounts,
    /// Length of the measured phase (see [`generate`]).
    pub measured: Duration,
    /// Whether the run was cut short (Ctrl-C, a dead hop, or a full
    /// results disk).
    pub interrupted: bool,
    /// What happened to the generator's own connections meanwhile (`None`
    /// through RabbitMQ or NATS, whose clients keep theirs to themselves).
    pub links: Option<LinkCounts>,
    /// What the self-watch saw while the load ran.
    pub instrument: Option<MachineSamples>,
    /// What the record pipeline held at most.
    pub pipeline: PipelineStats,
    /// Each generator process, when several shared the load.
    pub generators: Vec<crate::record::GeneratorReport>,
    /// Their origins' spread, µs (0 with one generator).
    pub start_skew_us: f64,
    /// What the spread can be at most, given each clock offset's
    /// uncertainty (half its probe's round trip), µs.
    pub start_skew_bound_us: f64,
    /// What became of the streams, when the load was sent on streams.
    pub streams: Option<StreamTally>,
    /// What the generator processes' entry pools did with the entry hops'
    /// replicas (`loadgen/<index>`), on the measured clock.
    pub endpoints: Vec<crate::analysis::CallerEndpoints>,
}

/// The origin of a variant's load, shared by the load generator and the
/// fault schedule so both count time from the same instant. Request records
/// and fault windows use the measured clock: seconds from `origin + warmup`,
/// the clock of requests.csv.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadClock {
    /// When the first (warmup) request is due.
    pub origin: Instant,
    /// How long warmup lasts from `origin`.
    pub warmup: Duration,
}

impl LoadClock {
    /// A clock whose origin is now.
    pub(crate) fn start(warmup: Duration) -> Self {
        Self::starting_in(Duration::ZERO, warmup)
    }

    /// A clock whose origin is `lead` from now.
    pub(crate) fn starting_in(lead: Duration, warmup: Duration) -> Self {
        Self {
            origin: Instant::now() + lead,
            warmup,
        }
    }

    /// Time from the origin to `now` (zero before it).
    pub(crate) fn since_origin(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin)
    }

    /// `t` on the measured clock, in seconds: negative during warmup, or
    /// before the load started.
    pub(crate) fn measured_s(&self, t: Instant) -> f64 {
        let since = if t >= self.origin {
            t.duration_since(self.origin).as_secs_f64()
        } else {
            -self.origin.duration_since(t).as_secs_f64()
        };
        since - self.warmup.as_secs_f64()
    }
}

/// Drives `load` against `target` and hands each measured request to
/// `sink` as it completes (warmup requests are only counted). `stop`
/// counts interrupts: the first ([`STOP_SENDING`]) ends sending early and
/// requests in flight are still awaited; the second ([`ABANDON`]) gives
/// those up. The measured phase lasts from the end of warmup to the time
/// sending stopped (open loop: the next intended send time; closed loop:
/// the last answer). Sends and records count from `clock` (built with
/// `load.warmup`), which the caller shares with the fault schedule.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn generate<S: RecordSink + ?Sized>(
    target: Target,
    load: &Load,
    clock: LoadClock,
    seed: u64,
    sleeper: Sleeper,
    progress: Option<Progress>,
    stop: watch::Receiver<u32>,
    tracing: Tracing,
    part: Part,
    sink: &mut S,
) -> LoadOutcome {
    let payload = payload(load.payload_bytes);
    let shared = Arc::new(Shared {
        target,
        timeout: load.timeout,
        payload,
        origin: clock.origin,
        warmup: clock.warmup,
        tracing,
        pacing: Pacing::from_env(),
        interrupts: stop.clone(),
    });
    let now = std::time::SystemTime::now();
    let origin = now.checked_sub(shared.origin.elapsed());
    sink.measuring_from(
        origin
            .and_then(|o| o.checked_add(load.warmup))
            .unwrap_or(now),
    );
    let watch = selfwatch::Watch::start();
    // Each request's deadline would otherwise wake the runtime's driver.
    let _anchor = tailmesh_services::timer::keep_timer_armed();
    let mut drain = Drain {
        sink,
        progress,
        warmup: WarmupCounts::default(),
        stats: PipelineStats::default(),
        last_end: Duration::ZERO,
    };
    // The load generator's client spans wait in a batch; hand them on
    // every so often, so none waits long at a low rate.
    let flusher = shared.tracing.spans.clone().map(|tracer| {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(crate::traces::loadgen::FLUSH_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                tracer.flush();
            }
        })
    });
    // An open loop paces its sends: priority and placement while it runs,
    // on this thread (the loops run on it, not spawned).
    let placed = matches!(load.mode, LoadMode::Open { .. }).then(|| shared.pacing.enter());
    let mut stream_report = None;
    let (measured, interrupted) = match (&load.mode, &load.streams) {
        (
            LoadMode::Open {
                rate,
                arrivals,
                steps,
            },
            Some(streams),
        ) => {
            let schedule = Schedule::new(*rate, *arrivals, seed, load.warmup, steps);
            let (ended, tally) = streams::stream_loop(
                &shared, schedule, *rate, streams, load.stop, sleeper, part, &mut drain, stop,
            )
            .await;
            stream_report = Some(tally);
            ended
        }
        (
            LoadMode::Open {
                rate,
                arrivals,
                steps,
            },
            None,
        ) => {
            let schedule = Schedule::new(*rate, *arrivals, seed, load.warmup, steps);
            open_loop(
                &shared, schedule, load.stop, sleeper, part, &mut drain, stop,
            )
            .await
        }
        (LoadMode::Closed { concurrency }, _) => {
            let streams = load.streams.as_ref().map(|s| {
                (
                    u64::from(s.messages.max(1)),
                    Arc::new(std::sync::Mutex::new(streams::StreamTally::default())),
                )
            });
            let ended = closed_loop(
                Arc::clone(&shared),
                *concurrency,
                load.stop,
                part,
                streams.clone(),
                &mut drain,
                stop,
            )
            .await;
            stream_report = streams.map(|(_, tally)| {
                std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()))
            });
            ended
        }
    };
    if let Some(flusher) = flusher {
        flusher.abort();
    }
    if let Some(tracer) = &shared.tracing.spans {
        tracer.flush();
    }
    if let Some(p) = &drain.progress {
        p.finish();
    }
    LoadOutcome {
        warmup: drain.warmup,
        measured,
        interrupted,
        links: shared.target.link_counts(),
        instrument: Some(MachineSamples {
            realtime: placed.as_ref().map(pacing::PacingGuard::realtime),
            ..watch.finish()
        }),
        pipeline: drain.stats,
        generators: Vec::new(),
        start_skew_us: 0.0,
        start_skew_bound_us: 0.0,
        streams: stream_report,
        endpoints: Vec::new(),
    }
}

/// Where completed requests go: warmup ones are counted, measured ones are
/// handed to the sink and the progress display at once, never kept.
struct Drain<'a, S: ?Sized> {
    sink: &'a mut S,
    progress: Option<Progress>,
    warmup: WarmupCounts,
    stats: PipelineStats,
    /// The latest end of a measured request.
    last_end: Duration,
}

impl<S: RecordSink + ?Sized> Drain<'_, S> {
    fn take(&mut self, record: RequestRecord, warmup: bool) {
        if warmup {
            self.warmup.sent += 1;
            if record.outcome == Outcome::Ok {
                self.warmup.ok += 1;
            } else {
                self.warmup.failed += 1;
            }
            return;
        }
        self.stats.records += 1;
        self.last_end = self.last_end.max(record.end);
        if let Some(p) = &mut self.progress {
            p.record(&record);
        }
        self.sink.record(record);
    }

    fn tick(&mut self, sent: u64, elapsed: Duration) {
        self.sink.sent(sent);
        if let Some(p) = &mut self.progress {
            p.tick(sent, elapsed);
        }
    }
}

/// The payload every request carries: one buffer, shared by all of them.
fn payload(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Where the load generator's client spans go: the collector, through
/// the [`LoadTracer`], or, from a generator process, the orchestrator.
pub(crate) trait ClientSpans: Send + Sync {
    /// Traced request `id` (traced as `t`) ended as `ended` says; a span
    /// made only for the kept traces, from the request's record, does not
    /// ask.
    fn record(&self, t: RequestTrace, id: u64, ended: &dyn Fn() -> Ended);

    /// Hands on the spans waiting in a batch.
    fn flush(&self);
}

impl ClientSpans for LoadTracer {
    fn record(&self, t: RequestTrace, id: u64, ended: &dyn Fn() -> Ended) {
        LoadTracer::record(self, t, id, ended);
    }

    fn flush(&self) {
        LoadTracer::flush(self);
    }
}

/// How the load generator traces its requests.
#[derive(Clone, Default)]
pub(crate) struct Tracing {
    /// Each request's trace identity, which its calls carry; `None`:
    /// untraced.
    pub ids: Option<TraceIds>,
    /// Where each traced request's client span goes.
    pub spans: Option<Arc<dyn ClientSpans>>,
}

impl Tracing {
    /// Traced, each request's span made by `tracer`.
    pub(crate) fn spans(tracer: Option<Arc<LoadTracer>>) -> Self {
        Tracing {
            ids: tracer.as_ref().map(|t| t.ids()),
            spans: tracer.map(|t| t as Arc<dyn ClientSpans>),
        }
    }
}

struct Shared {
    target: Target,
    timeout: Duration,
    payload: Bytes,
    origin: Instant,
    warmup: Duration,
    tracing: Tracing,
    /// How the open loop waits for each send time.
    pacing: Pacing,
    /// How many times the run was interrupted: from [`ABANDON`] on, requests
    /// in flight are given up.
    interrupts: watch::Receiver<u32>,
}

/// Interrupts (Ctrl-C) that stop sending; requests in flight are awaited.
pub(crate) const STOP_SENDING: u32 = 1;
/// Interrupts that also give up the requests in flight, each recorded as
/// CANCELLED, so a run stops at once and still accounts for every request.
pub(crate) const ABANDON: u32 = 2;

impl Shared {
    /// Sends request `id` meant to go at `intended`, and records its fate
    /// with times relative to the start of the measured phase. The second
    /// value says whether it belongs to warmup.
    fn send(
        &self,
        id: u64,
        intended: Instant,
        stream: Option<streams::OnStream>,
    ) -> impl Future<Output = (RequestRecord, bool)> + use<> {
        let mut interrupts = self.interrupts.clone();
        self.send_until(id, intended, stream, async move {
            let _ = interrupts.wait_for(|n| *n >= ABANDON).await;
        })
    }

    /// [`Shared::send`], given up as CANCELLED when `abandoned` completes
    /// first; a message on `stream` when given.
    fn send_until<A: Future<Output = ()>>(
        &self,
        id: u64,
        intended: Instant,
        stream: Option<streams::OnStream>,
        abandoned: A,
    ) -> impl Future<Output = (RequestRecord, bool)> + use<A> {
        let target = self.target.clone();
        let timeout = self.timeout;
        let payload = self.payload.clone();
        let measure_from = self.origin + self.warmup;
        let trace = self.tracing.ids.map(|ids| ids.request(id));
        let tracer = self.tracing.spans.clone();
        let place = stream.as_ref().map(|s| s.place);
        let stream = stream.map(|s| (s.streams, s.first));
        async move {
            let start = Instant::now();
            let request = CallRequest {
                request_id: id,
                payload,
                attempt: 0,
                ..CallRequest::default()
            };
            let call = async {
                match trace {
                    // The request's trace context is current while it is
                    // sent, so the clients inject it.
                    Some(rt) => {
                        tailmesh_services::telemetry::scope(
                            Some(TraceIds::context(rt)),
                            None,
                            target.call(request, timeout, stream),
                        )
                        .await
                    }
                    None => target.call(request, timeout, stream).await,
                }
            };
            let called = tokio::select! {
                called = call => called,
                () = abandoned => Called {
                    result: Err(tonic::Status::cancelled(
                        "abandoned in flight: the run was interrupted twice",
                    )),
                    extra_attempts: 0,
                    attempts: Vec::new(),
                },
            };
            let end = Instant::now();
            if let (Some(t), Some(rt)) = (&tracer, trace.filter(|rt| rt.sampled())) {
                t.record(rt, id, &|| Ended {
                    stream: place,
                    ..Ended::new(
                        std::time::SystemTime::now(),
                        end.saturating_duration_since(intended),
                        called.result.as_ref().err().map(|s| s.message()),
                    )
                });
            }
            let (outcome, path) = match called.result {
                Ok(reply) => (Outcome::Ok, crate::wire::path_of(reply.path)),
                Err(status) if status.code() == tonic::Code::DeadlineExceeded => {
                    (Outcome::Timeout, Vec::new())
                }
                Err(status) => (
                    Outcome::Error {
                        code: crate::wire::grpc_code(status.code()),
                        message: status.message().to_string(),
                    },
                    Vec::new(),
                ),
            };
            let rel = |t: Instant| t.saturating_duration_since(measure_from);
            let record = RequestRecord {
                id,
                intended: rel(intended),
                start: rel(start),
                end: rel(end),
                outcome,
                path,
                extra_attempts: called.extra_attempts,
                attempts: crate::wire::attempts_of(called.attempts),
                stream: place,
            };
            (record, intended < measure_from)
        }
    }
}

async fn open_loop<S: RecordSink + ?Sized>(
    shared: &Shared,
    schedule: Schedule,
    stop_at: Stop,
    sleeper: Sleeper,
    part: Part,
    drain: &mut Drain<'_, S>,
    mut stop: watch::Receiver<u32>,
) -> (Duration, bool) {
    let mut in_flight = JoinSet::new();
    // The whole schedule's send times (every part stops where the whole
    // would), and this part's measured requests so far.
    let mut due = Due::new(schedule, shared.origin, shared.warmup, stop_at);
    let mut own_sent = 0u64;
    let mut interrupted = false;
    let measure_from = shared.origin + shared.warmup;
    let measured_end;
    let mut id = 0u64;
    let mut pacer = shared.pacing.pacer(&sleeper);
    loop {
        let (intended, measuring) = match due.next() {
            Ok(next) => next,
            Err(end) => {
                measured_end = end;
                break;
            }
        };
        // Another part's request.
        if !part.owns(id) {
            id += 1;
            continue;
        }
        if !paced(&mut pacer, intended, &mut stop).await {
            interrupted = true;
            measured_end = Instant::now().saturating_duration_since(measure_from);
            break;
        }
        in_flight.spawn(shared.send(id, intended, None));
        id += 1;
        own_sent += u64::from(measuring);
        // Requests sent and not yet taken back (some may have ended).
        drain.stats.peak_in_flight = drain.stats.peak_in_flight.max(in_flight.len());
        drain.tick(own_sent, intended.saturating_duration_since(measure_from));
        // Hand finished requests on as we go: memory holds only those in
        // flight.
        while let Some(joined) = in_flight.try_join_next() {
            if let Ok((record, warmup)) = joined {
                drain.stats.peak_held = drain.stats.peak_held.max(1);
                drain.take(record, warmup);
            }
        }
    }
    while let Some(joined) = in_flight.join_next().await {
        if let Ok((record, warmup)) = joined {
            drain.take(record, warmup);
        }
    }
    (measured_end, interrupted)
}

/// Waits for `intended` with `pacer`: `false` when the run was told to
/// stop sending first.
async fn paced(
    pacer: &mut pacing::Pacer<'_>,
    intended: Instant,
    stop: &mut watch::Receiver<u32>,
) -> bool {
    tokio::select! {
        biased;
        _ = stop.wait_for(|n| *n >= STOP_SENDING) => false,
        () = pacer.wait_until(intended) => true,
    }
}

/// The closed loop: `concurrency` workers, each sending its next request
/// when its last one ended. With `streams` (messages per stream, and the
/// report to count them in), each worker's requests are the messages of
/// its stream, one in flight: after `messages` of them, or once it broke,
/// the worker's stream ends and it opens another.
async fn closed_loop<S: RecordSink + ?Sized>(
    shared: Arc<Shared>,
    concurrency: u32,
    stop_at: Stop,
    part: Part,
    streams: Option<(u64, Arc<std::sync::Mutex<streams::StreamTally>>)>,
    drain: &mut Drain<'_, S>,
    stop: watch::Receiver<u32>,
) -> (Duration, bool) {
    // This part's share of the requests in flight, and of a count.
    let concurrency = part.share(u64::from(concurrency));
    let stop_at = match stop_at {
        Stop::Requests(n) => Stop::Requests(part.share(n)),
        whole => whole,
    };
    let next_id = Arc::new(AtomicU64::new(0));
    let measured_sent = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak_in_flight = Arc::new(AtomicUsize::new(0));
    let measure_from = shared.origin + shared.warmup;
    // Each worker hands its finished request to the drain below: at most
    // one per worker waits in the channel.
    let (done_tx, mut done_rx) = mpsc::channel(usize::try_from(concurrency.max(1)).unwrap_or(1));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let (shared, next_id, measured_sent) = (
            Arc::clone(&shared),
            Arc::clone(&next_id),
            Arc::clone(&measured_sent),
        );
        let (in_flight, peak_in_flight) = (Arc::clone(&in_flight), Arc::clone(&peak_in_flight));
        let (stop, done_tx) = (stop.clone(), done_tx.clone());
        let mut stream = streams.clone().map(|(messages, tally)| {
            streams::WorkerStream::new(messages, part, tally, measure_from)
        });
        // Each worker sends its next request as soon as its previous one ends.
        workers.spawn(async move {
            // One wait for the second interrupt per worker rather than one
            // per request: a new wait registered with the watch for every
            // request showed in the CPU per request at 128 in flight.
            let mut abandon_rx = stop.clone();
            let abandoned = futures::FutureExt::fuse(async move {
                let _ = abandon_rx.wait_for(|n| *n >= ABANDON).await;
            });
            tokio::pin!(abandoned);
            while *stop.borrow() < STOP_SENDING {
                let now = Instant::now();
                if now >= measure_from {
                    match stop_at {
                        Stop::Duration(d) if now >= measure_from + d => break,
                        Stop::Duration(_) => {
                            measured_sent.fetch_add(1, Ordering::Relaxed);
                        }
                        Stop::Requests(n) => {
                            if measured_sent.fetch_add(1, Ordering::Relaxed) >= n {
                                break;
                            }
                        }
                    }
                }
                let id = part.closed_id(next_id.fetch_add(1, Ordering::Relaxed));
                let now_in_flight = in_flight.fetch_add(1, Ordering::Relaxed) + 1;
                peak_in_flight.fetch_max(now_in_flight, Ordering::Relaxed);
                let on = stream.as_mut().map(|s| s.next(id, now));
                let done = shared.send_until(id, now, on, &mut abandoned).await;
                if let Some(s) = &mut stream {
                    s.saw(&done.0);
                }
                in_flight.fetch_sub(1, Ordering::Relaxed);
                if done_tx.send(done).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(done_tx);
    while let Some((record, warmup)) = done_rx.recv().await {
        drain.stats.peak_held = drain.stats.peak_held.max(done_rx.len() + 1);
        drain.take(record, warmup);
        let sent = match stop_at {
            // Claims past the count were not sent.
            Stop::Requests(n) => measured_sent.load(Ordering::Relaxed).min(n),
            Stop::Duration(_) => measured_sent.load(Ordering::Relaxed),
        };
        drain.tick(sent, Instant::now().saturating_duration_since(measure_from));
    }
    while workers.join_next().await.is_some() {}
    drain.stats.peak_in_flight = peak_in_flight.load(Ordering::Relaxed);
    (drain.last_end, *stop.borrow() >= STOP_SENDING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_split_the_schedule_and_the_counts_without_gap_or_overlap() {
        for of in 1..=5u32 {
            let parts: Vec<Part> = (0..of).map(|index| Part { index, of }).collect();
            // Every id of the one schedule is exactly one part's.
            for id in 0..1000u64 {
                assert_eq!(
                    parts.iter().filter(|p| p.owns(id)).count(),
                    1,
                    "{id} of {of}"
                );
            }
            // Shares of a count add up to it, and differ by at most one.
            for n in [0u64, 1, 7, 100, 301] {
                let shares: Vec<u64> = parts.iter().map(|p| p.share(n)).collect();
                assert_eq!(shares.iter().sum::<u64>(), n, "{n} over {of}: {shares:?}");
                let (lo, hi) = (shares.iter().min(), shares.iter().max());
                assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "{shares:?}");
            }
            // A closed loop's ids are disjoint between parts, and each
            // part's are the ones it owns.
            let mut seen = std::collections::BTreeSet::new();
            for p in &parts {
                for k in 0..50 {
                    let id = p.closed_id(k);
                    assert!(p.owns(id) && seen.insert(id), "{p:?}: {id}");
                }
            }
        }
        assert!(Part::WHOLE.owns(12_345));
    }

    #[test]
    fn a_share_is_picked_where_the_draw_falls() {
        let shares = [0.25, 0.5, 0.25];
        let at = |u: f64| weighted_index(shares.iter().copied(), u).expect("shares");
        assert_eq!(
            [at(0.0), at(0.2), at(0.25), at(0.74), at(0.75)],
            [0, 0, 1, 1, 2]
        );
        // Rounding leaves the sum short of 1: the last one takes the rest.
        assert_eq!(weighted_index([0.3, 0.3], 0.9), Some(1));
    }

    #[test]
    fn requests_go_to_the_entries_by_their_shares_the_same_on_every_run() {
        let shares = [0.7, 0.2, 0.1];
        let draw = |seed: u64, id: u64| {
            let u: f64 = keyed_rng(seed, ENTRY_STREAM, id, 0).random();
            weighted_index(shares.iter().copied(), u).expect("shares")
        };
        let mut counts = [0u32; 3];
        for id in 0..20_000 {
            counts[draw(7, id)] += 1;
        }
        for (n, share) in counts.iter().zip(shares) {
            // Binomial sd at 20,000 draws is at most 0.0035: 5 sd.
            let got = f64::from(*n) / 20_000.0;
            assert!((got - share).abs() < 0.018, "{counts:?} against {shares:?}");
        }
        // Seeded by the request's id: the same request, the same entry.
        assert!((0..1000).all(|id| draw(7, id) == draw(7, id)));
        assert!((0..1000).any(|id| draw(7, id) != draw(8, id)));
    }
}
