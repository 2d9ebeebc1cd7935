//! The span recorder: a span is a plain [`SpanRecord`] made on the
//! serving thread without locks or shared allocations (ids from a
//! per-thread generator, times from the wall clock), and left, when it
//! ends, in its thread's own buffer, which the exporter
//! thread swaps for an empty one when it takes spans ([`Spans::take`]).
//! The serving thread's lock is its own but for that swap, and the
//! buffer it writes is the same few kilobytes again and again, so a span
//! ends without touching memory another thread writes. (The channel
//! every thread shared with the exporter before was, profiled in the
//! chain, the serving threads' largest tracing symbol: 70 to 140 ns a
//! span.) A full buffer drops the span and counts it.
//!
//! The time spent making, ending and propagating spans on serving threads
//! is timed on a random one in [`TIME_ONE_IN`] of those pieces of work,
//! scaled up to stand for all of them, and travels with the next span the
//! thread ends, so the exporter can report it without any shared counter.
//! Timing every piece of work took more clock readings than the spans
//! need for their start and end, and about half the span path's time
//! (bench/span-path.sh).

use std::{
    cell::{Cell, RefCell},
    future::Future,
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use opentelemetry::{StringValue, trace::SpanKind};
use tailmesh_units::{unix_nanos, unix_nanos_at};

use super::context::{self, SpanContext};
pub use super::fields::{FieldValue, SpanFields};

/// One finished span as the exporter encodes it.
#[derive(Debug)]
pub struct SpanRecord {
    pub trace_id: u128,
    pub span_id: u64,
    /// 0 for a root span.
    pub parent_span_id: u64,
    /// Whether the parent context came from another process.
    pub parent_remote: bool,
    pub kind: SpanKind,
    /// Static (an [`super::fields::intern`]ed name: no allocation and no
    /// reference count per span), owned, or shared.
    pub name: StringValue,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    /// Status error (with an empty message) rather than unset.
    pub error: bool,
    pub fields: SpanFields,
    /// Serving-thread nanoseconds this span (and any propagation or
    /// dropped spans on the same thread since the last hand-over) cost.
    pub cost_ns: u64,
}

/// Counters the recorder and the exporter share.
#[derive(Debug, Default)]
pub struct Counters {
    /// Spans that never reached the collector: the channel was full, the
    /// exporter had stopped, or their export failed.
    pub dropped: AtomicU64,
}

/// The process's recorder: where ended spans go and how root spans are
/// sampled.
#[derive(Debug)]
pub struct Recorder {
    /// Which recorder a thread's buffer belongs to (tests make several).
    id: u64,
    threads: Arc<Threads>,
    /// Spans a thread's buffer holds at most between two takes.
    capacity: usize,
    /// Root spans whose trace id's low 63 bits fall below this are
    /// sampled (the OpenTelemetry SDK's trace-id ratio rule).
    sample_below: u64,
    always: bool,
    counters: Arc<Counters>,
    /// What wakes the exporter: a thread's buffer reaching
    /// [`WAKE_EVERY`] spans.
    wake: Option<Arc<tokio::sync::Notify>>,
}

/// Spans in one thread's buffer that wake the exporter to take them
/// (about 200 kB): a wake-up is a system call on the serving thread and
/// a cold start of the exporter, so it comes once in this many spans.
/// A busy process's exporter takes them every [`super::export::INTERVAL`]
/// anyway; a quiet one's (see the exporter's `ASK_SPANS`) sleeps until
/// its next ask unless a buffer reaches this.
pub const WAKE_EVERY: usize = 1024;

/// One thread's ended spans, waiting for the exporter's next take.
#[derive(Debug, Default)]
struct ThreadSpans(Mutex<Vec<SpanRecord>>);

impl ThreadSpans {
    fn lock(&self) -> MutexGuard<'_, Vec<SpanRecord>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every thread's buffer of one recorder.
#[derive(Debug, Default)]
struct Threads(Mutex<Vec<Arc<ThreadSpans>>>);

impl Threads {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<ThreadSpans>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new buffer, for a thread that ends its first span.
    fn join(&self) -> Arc<ThreadSpans> {
        let spans = Arc::new(ThreadSpans::default());
        self.lock().push(Arc::clone(&spans));
        spans
    }
}

/// The exporter's end: takes what the threads left.
#[derive(Debug)]
pub struct Spans {
    threads: Arc<Threads>,
    /// The empty buffer the next thread taken from gets.
    spare: Vec<SpanRecord>,
}

impl Spans {
    /// Appends every span ended so far to `out`: thread by thread, each
    /// thread's in the order they ended. A thread's buffer is swapped for
    /// an empty one under its lock, and the buffers of threads gone are
    /// let go once empty.
    pub fn take(&mut self, out: &mut Vec<SpanRecord>) {
        let mut threads = self.threads.lock();
        for spans in threads.iter() {
            std::mem::swap(&mut *spans.lock(), &mut self.spare);
            out.append(&mut self.spare);
        }
        // Only this list holds a gone thread's buffer (and one a thread
        // left for another recorder's).
        threads.retain(|spans| Arc::strong_count(spans) > 1);
    }
}

thread_local! {
    /// This thread's buffer, and the recorder it belongs to.
    static MINE: RefCell<Option<(u64, Arc<ThreadSpans>)>> = const { RefCell::new(None) };
}

static RECORDER: OnceLock<Recorder> = OnceLock::new();

impl Recorder {
    /// A recorder sampling roots at `ratio` whose spans wait, at most
    /// `capacity` a thread, for [`Spans::take`] (which goes to the
    /// exporter).
    pub fn new(ratio: f64, capacity: usize) -> (Recorder, Spans, Arc<Counters>) {
        static IDS: AtomicU64 = AtomicU64::new(0);
        let threads = Arc::new(Threads::default());
        let counters = Arc::new(Counters::default());
        let recorder = Recorder {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            threads: Arc::clone(&threads),
            capacity,
            sample_below: (ratio.clamp(0.0, 1.0) * (1u64 << 63) as f64) as u64,
            always: ratio >= 1.0,
            counters: counters.clone(),
            wake: None,
        };
        let spans = Spans {
            threads,
            spare: Vec::new(),
        };
        (recorder, spans, counters)
    }

    /// Wakes `wake` whenever a thread's buffer reaches [`WAKE_EVERY`]
    /// spans: the exporter takes spans every [`super::export::INTERVAL`]
    /// anyway, and is woken between so that what it takes is still in
    /// the caches (and no buffer fills).
    pub fn waking(mut self, wake: Arc<tokio::sync::Notify>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Makes this the process's recorder; `false` if one already was.
    pub fn install(self) -> bool {
        RECORDER.set(self).is_ok()
    }

    /// Whether a new trace with `trace_id` is recorded.
    fn samples(&self, trace_id: u128) -> bool {
        self.always || ((trace_id as u64) >> 1) < self.sample_below
    }

    /// Leaves an ended span (ended at `ended`, unix ns) for the exporter.
    pub fn finish(&self, record: SpanRecord, ended: u64) {
        self.finish_in(&mut Some(record), ended);
    }

    /// [`Recorder::finish`] of the span in `slot`, which is empty after: a
    /// span (about 200 bytes) stays in its slot until the thread's buffer
    /// takes it, instead of being copied at each call on the way there.
    fn finish_in(&self, slot: &mut Option<SpanRecord>, ended: u64) {
        if let Some(record) = slot {
            record.cost_ns += UNREPORTED.take();
        }
        self.hand_over(slot);
        if timed() {
            add_unreported(scaled_since(ended));
        }
    }

    /// Leaves the span in `record` in this thread's buffer, waking the
    /// exporter when the buffer reaches [`WAKE_EVERY`]; drops and counts
    /// it when full (its cost then goes with the thread's next span).
    /// `record` is empty after.
    pub(super) fn hand_over(&self, record: &mut Option<SpanRecord>) {
        let held = MINE
            .try_with(|mine| {
                let mut mine = mine.borrow_mut();
                if !matches!(&*mine, Some((id, _)) if *id == self.id) {
                    *mine = Some((self.id, self.threads.join()));
                }
                mine.as_ref().map(|(_, spans)| self.leave(spans, record))
            })
            .ok()
            .flatten()
            // A span ended as its thread exits, after its buffer went.
            .unwrap_or_else(|| self.leave(&self.threads.join(), record));
        match held {
            Some(held) => {
                if let Some(wake) = &self.wake
                    && held.is_multiple_of(WAKE_EVERY)
                {
                    wake.notify_one();
                }
            }
            None => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                if let Some(r) = record.take() {
                    add_unreported(r.cost_ns);
                }
            }
        }
    }

    /// Puts `record` in `spans`; how many it holds then, or `None` (the
    /// record left in place) when it was full.
    fn leave(&self, spans: &ThreadSpans, record: &mut Option<SpanRecord>) -> Option<usize> {
        let mut held = spans.lock();
        if held.len() >= self.capacity {
            return None;
        }
        held.extend(record.take());
        Some(held.len())
    }
}

/// The process's recorder, when export is on.
pub(super) fn recorder() -> Option<&'static Recorder> {
    RECORDER.get()
}

/// One in this many pieces of serving-thread span work (a span's start,
/// its hand-over, a context written or read) is timed, at random; its time
/// times this stands for all of them.
pub const TIME_ONE_IN: u64 = 16;

thread_local! {
    /// splitmix64 state of this thread's ids; 0 until seeded.
    static IDS: Cell<u64> = const { Cell::new(0) };
    /// Serving-thread nanoseconds not yet carried by a span.
    static UNREPORTED: Cell<u64> = const { Cell::new(0) };
    /// xorshift64 state of this thread's choice of what to time; 0 until
    /// seeded.
    static TIMING: Cell<u64> = const { Cell::new(0) };
}

/// Whether to time this piece of work: true one time in [`TIME_ONE_IN`],
/// at random, so that work that comes in a fixed order (each request's
/// spans and headers) is timed in proportion whatever that order is.
fn timed() -> bool {
    TIMING.with(|state| {
        let mut x = state.get();
        if x == 0 {
            x = rand::random::<u64>() | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        x % TIME_ONE_IN == 0
    })
}

/// The time since `started` (unix ns), the start of a timed piece of
/// work, times [`TIME_ONE_IN`]: what it stands for.
fn scaled_since(started: u64) -> u64 {
    unix_nanos()
        .saturating_sub(started)
        .saturating_mul(TIME_ONE_IN)
}

/// Adds `ns` to this thread's unreported cost.
fn add_unreported(ns: u64) {
    UNREPORTED.set(UNREPORTED.get().saturating_add(ns));
}

/// A non-zero random 64-bit id from this thread's generator (seeded once
/// per thread from the OS).
fn next_id() -> u64 {
    IDS.with(|state| {
        let mut s = state.get();
        if s == 0 {
            s = rand::random::<u64>() | 1;
        }
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)).max(1)
    })
}

/// Starts timing serving-thread work for the observer's own cost, when
/// this piece of work is one of those timed; `None` when export is off or
/// it is not.
pub(super) fn cost_start() -> Option<u64> {
    RECORDER.get().filter(|_| timed()).map(|_| unix_nanos())
}

/// Adds the time since `started`, scaled, to this thread's unreported
/// cost.
pub(super) fn cost_end(started: Option<u64>) {
    if let Some(t) = started {
        add_unreported(scaled_since(t));
    }
}

/// One of tailmesh's spans, or nothing when export is off or its trace is
/// not sampled. It ends when [`TraceSpan::end`] is called or when dropped.
#[derive(Debug)]
pub struct TraceSpan {
    /// What this span's work carries: the span's own context, a context
    /// that is not sampled, or nothing when export is off.
    cx: Option<SpanContext>,
    record: Option<SpanRecord>,
}

impl TraceSpan {
    /// Starts a span of `kind`, child of `parent()` (a new trace when
    /// `None`), named and attributed by `describe()`. Neither closure runs
    /// when export is off; `describe` does not run when the trace is not
    /// sampled.
    pub fn start(
        kind: SpanKind,
        parent: impl FnOnce() -> Option<SpanContext>,
        describe: impl FnOnce() -> (StringValue, SpanFields),
    ) -> Self {
        Self::start_at(kind, None, parent, describe)
    }

    /// [`TraceSpan::start`] with the start time given (unix ns, a clock
    /// reading the caller has just taken and decided on) or taken now.
    pub fn start_at(
        kind: SpanKind,
        started: Option<u64>,
        parent: impl FnOnce() -> Option<SpanContext>,
        describe: impl FnOnce() -> (StringValue, SpanFields),
    ) -> Self {
        let Some(recorder) = RECORDER.get() else {
            return TraceSpan {
                cx: None,
                record: None,
            };
        };
        // The clock is read for the observer's cost when this start is
        // one of those timed, and for the start when none was given.
        let cost = cost_start();
        let started = started.or(cost).unwrap_or_else(unix_nanos);
        let parent = parent();
        let mut span = Self::begin(recorder, kind, parent, started, describe);
        span.charge(cost);
        span
    }

    /// Charges a span's start to the observer's cost, when its start was
    /// timed (`cost`: [`cost_start`]'s reading).
    fn charge(&mut self, cost: Option<u64>) {
        if let (Some(r), Some(cost)) = (&mut self.record, cost) {
            r.cost_ns = scaled_since(cost);
        }
    }

    fn begin(
        recorder: &Recorder,
        kind: SpanKind,
        parent: Option<SpanContext>,
        start_unix_ns: u64,
        describe: impl FnOnce() -> (StringValue, SpanFields),
    ) -> Self {
        let (trace_id, sampled) = match parent {
            Some(p) => (p.trace_id, p.sampled),
            None => {
                let t = (u128::from(next_id()) << 64) | u128::from(next_id());
                (t, recorder.samples(t))
            }
        };
        if !sampled {
            // Callees learn the trace is not sampled; nothing is recorded.
            let cx = parent.unwrap_or(SpanContext {
                trace_id,
                span_id: next_id(),
                sampled: false,
                remote: false,
            });
            return TraceSpan {
                cx: Some(cx),
                record: None,
            };
        }
        let span_id = next_id();
        let (name, fields) = describe();
        TraceSpan {
            cx: Some(SpanContext {
                trace_id,
                span_id,
                sampled: true,
                remote: false,
            }),
            record: Some(SpanRecord {
                trace_id,
                span_id,
                parent_span_id: parent.map_or(0, |p| p.span_id),
                parent_remote: parent.is_some_and(|p| p.remote),
                kind,
                name,
                start_unix_ns,
                end_unix_ns: start_unix_ns,
                error: false,
                fields,
                cost_ns: 0,
            }),
        }
    }

    /// The context this span's work carries (what clients inject).
    pub fn context(&self) -> Option<SpanContext> {
        self.cx
    }

    /// Runs `fut` with this span current: clients inject its context, and
    /// [`super::set_current`] sets fields on it.
    pub async fn scope<F: Future>(&mut self, fut: F) -> F::Output {
        let cx = self.cx;
        let sink = self.record.as_mut().map(|r| &mut r.fields);
        context::scope(cx, sink, fut).await
    }

    /// Sets fields with `set` (not run without a record).
    pub fn set(&mut self, set: impl FnOnce(&mut SpanFields)) {
        if let Some(r) = &mut self.record {
            set(&mut r.fields);
        }
    }

    /// Marks the span failed with the gRPC code of an error `result`.
    pub fn mark_error<T>(&mut self, result: &Result<T, tonic::Status>) {
        if let (Some(r), Err(status)) = (&mut self.record, result) {
            r.error = true;
            r.fields.grpc_code = Some(status.code());
        }
    }

    /// Ends the span now.
    pub fn end(self) {
        drop(self);
    }

    /// Ends the span `elapsed_ns` after its start: the time its work took
    /// on the work's own clock, read at the span's start, rather than
    /// whenever this runs.
    pub fn end_after(mut self, elapsed_ns: u64) {
        self.close(Some(elapsed_ns));
    }

    /// Hands the record over, ended `elapsed_ns` after its start, or now;
    /// the span has none after (its drop then does nothing).
    fn close(&mut self, elapsed_ns: Option<u64>) {
        if let (Some(record), Some(recorder)) = (&mut self.record, RECORDER.get()) {
            let ended = unix_nanos();
            record.end_unix_ns =
                elapsed_ns.map_or(ended, |e| record.start_unix_ns.saturating_add(e));
            recorder.finish_in(&mut self.record, ended);
        }
    }
}

impl Drop for TraceSpan {
    fn drop(&mut self) {
        self.close(None);
    }
}

/// Records a finished internal span `name()` under `parent` that started
/// at `start` and ends now (a queue wait measured from a broker's enqueue
/// time), with `fields`; returns the context under which its children
/// go. Without export, or without a sampled parent, nothing is recorded
/// (`name` is not called) and `parent` comes back.
pub fn past_span(
    name: impl FnOnce() -> StringValue,
    start: SystemTime,
    fields: SpanFields,
    parent: Option<SpanContext>,
) -> Option<SpanContext> {
    let Some(recorder) = RECORDER.get() else {
        return parent;
    };
    if !parent.is_some_and(|p| p.sampled) {
        return parent;
    }
    let cost = cost_start();
    let start_unix_ns = unix_nanos_at(start);
    let mut span = TraceSpan::begin(recorder, SpanKind::Internal, parent, start_unix_ns, || {
        (name(), fields)
    });
    span.charge(cost);
    let cx = span.context();
    span.end();
    cx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64) -> SpanRecord {
        SpanRecord {
            trace_id: 1,
            span_id: id,
            parent_span_id: 0,
            parent_remote: false,
            kind: SpanKind::Internal,
            name: "s".into(),
            start_unix_ns: 1,
            end_unix_ns: 2,
            error: false,
            fields: SpanFields::default(),
            cost_ns: 5,
        }
    }

    #[test]
    fn ids_are_nonzero_and_distinct() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| next_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&0));
        let other = std::thread::spawn(next_id).join().expect("thread");
        assert!(!ids.contains(&other));
    }

    #[test]
    fn work_in_a_fixed_order_is_timed_in_proportion_at_every_place() {
        // A request's span work comes in the same order every time (its
        // spans and headers): each place in that order must be timed about
        // one time in TIME_ONE_IN, not one place always and the others
        // never.
        const PLACES: usize = 16;
        const REQUESTS: u64 = 16_000;
        let mut timed_at = [0u64; PLACES];
        for _ in 0..REQUESTS {
            for count in &mut timed_at {
                *count += u64::from(timed());
            }
        }
        let expected = REQUESTS / TIME_ONE_IN;
        for (place, &count) in timed_at.iter().enumerate() {
            assert!(
                count.abs_diff(expected) < expected / 4,
                "place {place} timed {count} times of {REQUESTS}, expected about {expected}: {timed_at:?}"
            );
        }
    }

    /// What `spans` takes now.
    fn taken(spans: &mut Spans) -> Vec<SpanRecord> {
        let mut out = Vec::new();
        spans.take(&mut out);
        out
    }

    fn ids(records: &[SpanRecord]) -> Vec<u64> {
        records.iter().map(|r| r.span_id).collect()
    }

    #[test]
    fn a_full_buffer_drops_and_counts_spans() {
        let (recorder, mut spans, counters) = Recorder::new(1.0, 2);
        for id in 1..=5 {
            recorder.finish(record(id), unix_nanos());
        }
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(ids(&taken(&mut spans)), [1, 2]);
        // The dropped spans' cost is carried by the next span left.
        recorder.finish(record(6), unix_nanos());
        let next = taken(&mut spans);
        assert_eq!(ids(&next), [6], "room again after the take");
        assert!(next[0].cost_ns >= 5 + 3 * 5, "cost {}", next[0].cost_ns);
    }

    #[test]
    fn a_span_handed_over_leaves_its_slot_empty_whether_kept_or_dropped() {
        // A span's slot is emptied either way: a span ending later (its
        // drop after `end_after`) finds nothing to hand over again.
        let (recorder, mut spans, counters) = Recorder::new(1.0, 1);
        let mut kept = Some(record(1));
        recorder.finish_in(&mut kept, unix_nanos());
        assert!(kept.is_none());
        let mut dropped = Some(record(2));
        recorder.finish_in(&mut dropped, unix_nanos());
        assert!(dropped.is_none(), "the full buffer's span left in its slot");
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(ids(&taken(&mut spans)), [1]);
    }

    #[test]
    fn every_threads_spans_are_taken_in_order_and_a_gone_threads_buffer_goes() {
        let (recorder, mut spans, counters) = Recorder::new(1.0, 1_000);
        let recorder = Arc::new(recorder);
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let recorder = Arc::clone(&recorder);
                std::thread::spawn(move || {
                    for i in 0..100 {
                        recorder.finish(record(t * 1_000 + i), unix_nanos());
                    }
                })
            })
            .collect();
        // Taken while the threads end spans, and once after they are gone.
        let mut got = taken(&mut spans);
        for thread in threads {
            thread.join().expect("thread");
        }
        got.extend(taken(&mut spans));
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
        for t in 0..3u64 {
            let of_thread: Vec<u64> = ids(&got).into_iter().filter(|id| id / 1_000 == t).collect();
            let expected: Vec<u64> = (0..100).map(|i| t * 1_000 + i).collect();
            assert_eq!(of_thread, expected, "thread {t}: each span once, in order");
        }
        assert_eq!(got.len(), 300);
        assert!(
            spans.threads.lock().is_empty(),
            "the gone threads' buffers are let go"
        );
        // A thread that ended spans for another recorder gets a buffer of
        // this one's, and its spans come here.
        let (other, _other_spans, _) = Recorder::new(1.0, 8);
        other.finish(record(1), unix_nanos());
        recorder.finish(record(2), unix_nanos());
        other.finish(record(3), unix_nanos());
        recorder.finish(record(4), unix_nanos());
        assert_eq!(ids(&taken(&mut spans)), [2, 4]);
    }

    #[test]
    fn a_buffer_reaching_wake_every_wakes_the_exporter() {
        let wake = Arc::new(tokio::sync::Notify::new());
        let (recorder, mut spans, _) = Recorder::new(1.0, 4 * WAKE_EVERY);
        let recorder = recorder.waking(Arc::clone(&wake));
        let woken = |wake: &tokio::sync::Notify| {
            let notified = wake.notified();
            futures::pin_mut!(notified);
            notified.enable()
        };
        for id in 1..WAKE_EVERY as u64 {
            recorder.finish(record(id), unix_nanos());
        }
        assert!(!woken(&wake), "woken before {WAKE_EVERY} spans");
        recorder.finish(record(WAKE_EVERY as u64), unix_nanos());
        assert!(woken(&wake), "not woken at {WAKE_EVERY} spans");
        assert!(!woken(&wake), "one wake per {WAKE_EVERY} spans");
        assert_eq!(taken(&mut spans).len(), WAKE_EVERY);
        // After a take, the next wake comes WAKE_EVERY spans later again.
        for id in 1..WAKE_EVERY as u64 {
            recorder.finish(record(id), unix_nanos());
        }
        assert!(!woken(&wake), "woken before {WAKE_EVERY} more spans");
        recorder.finish(record(0), unix_nanos());
        assert!(woken(&wake), "not woken at {WAKE_EVERY} more spans");
    }

    #[test]
    fn roots_are_sampled_by_trace_id_ratio() {
        let (none, _r, _c) = Recorder::new(0.0, 1);
        let (all, _r2, _c2) = Recorder::new(1.0, 1);
        let (half, _r3, _c3) = Recorder::new(0.5, 1);
        assert!(!none.samples(u128::MAX));
        assert!(all.samples(u128::MAX));
        // The low 64 bits decide, as in the OpenTelemetry SDK.
        assert!(half.samples(0x10));
        assert!(!half.samples(u128::from(u64::MAX)));
        let sampled = (0..10_000)
            .filter(|_| half.samples(u128::from(next_id())))
            .count();
        assert!((4_000..6_000).contains(&sampled), "{sampled}");
    }

    #[test]
    fn a_span_records_its_fields_under_its_parent() {
        let (recorder, mut spans, _) = Recorder::new(1.0, 8);
        let parent = SpanContext {
            trace_id: 0xabc,
            span_id: 0x12,
            sampled: true,
            remote: true,
        };
        let mut span = TraceSpan::begin(&recorder, SpanKind::Server, Some(parent), 100, || {
            (
                "a".into(),
                SpanFields {
                    request_id: Some(7),
                    ..SpanFields::default()
                },
            )
        });
        let cx = span.context().expect("sampled");
        assert_eq!(cx.trace_id, 0xabc);
        assert_ne!(cx.span_id, 0x12);
        assert!(cx.sampled && !cx.remote);
        span.set(|f| f.slow = Some(true));
        span.mark_error::<()>(&Err(tonic::Status::unavailable("x")));
        let mut r = span.record.take().expect("record");
        r.end_unix_ns = 200;
        recorder.finish(r, 200);
        let mut left = taken(&mut spans);
        assert_eq!(left.len(), 1, "left for the exporter");
        let r = left.remove(0);
        assert_eq!(
            (r.trace_id, r.span_id, r.parent_span_id),
            (0xabc, cx.span_id, 0x12)
        );
        assert!(r.parent_remote && r.error);
        assert_eq!(r.kind, SpanKind::Server);
        assert_eq!((r.start_unix_ns, r.end_unix_ns), (100, 200));
        assert_eq!(
            r.fields,
            SpanFields {
                request_id: Some(7),
                slow: Some(true),
                grpc_code: Some(tonic::Code::Unavailable),
                ..SpanFields::default()
            }
        );
    }

    #[test]
    fn unsampled_parents_record_nothing_but_propagate() {
        let (recorder, mut spans, _) = Recorder::new(1.0, 8);
        let parent = SpanContext {
            trace_id: 7,
            span_id: 8,
            sampled: false,
            remote: true,
        };
        let span = TraceSpan::begin(&recorder, SpanKind::Server, Some(parent), 1, || {
            unreachable!("not described when not sampled")
        });
        assert_eq!(span.context(), Some(parent));
        assert!(span.record.is_none());
        drop(span);
        assert!(taken(&mut spans).is_empty());
        let (never, _r, _c) = Recorder::new(0.0, 8);
        let root = TraceSpan::begin(&never, SpanKind::Server, None, 1, || {
            unreachable!("not described when not sampled")
        });
        assert!(root.context().is_some_and(|c| !c.sampled));
    }
}
