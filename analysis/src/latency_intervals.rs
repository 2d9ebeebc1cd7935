//! Latency over time: a variant's requests cut into fixed intervals of the
//! measured clock (`[report] interval`, from the end of warmup), each with
//! an end-to-end latency histogram and one per hop, closed as soon as no
//! request meant for it can still arrive, then handed on (to the
//! `<variant>.hlog` writer) and summarized: only a [`LatencyPoint`] per
//! chart point stays in memory, so a long run's memory stays flat.
//!
//! - A request belongs to the interval of its **intended** send time, as
//!   every latency here is measured from it.
//! - Records arrive in completion order, and a request may be sent late,
//!   so an interval cannot close when the next one sees its first record.
//!   Interval `i`, ending at `b`, closes once a record R meant for `b` or
//!   later has been seen and some record has ended at `R.start + settle`
//!   or later, `settle` being the load's timeout plus [`INTERVAL_GRACE`]
//!   plus the generator's lateness (`start - intended`) seen so far, at
//!   most the timeout. The generator starts requests in the order they
//!   are meant for (open loop: spawned in id order; closed loop:
//!   `intended == start`), so every request meant before `b` started by
//!   `R.start` (the grace covers the tasks' polling order) and ended by
//!   its start plus the timeout, plus the time its task waited to run
//!   again: a generator thread that sends late resumes its tasks late too.
//! - A record for an interval already closed (the rule failed: a timer far
//!   behind on a busy machine) is counted in the oldest open interval and
//!   in `late`, so the totals still add up; summary.json shows `late`.
//! - The rule needs nothing from the generator, so `tailmesh report`
//!   applies it to requests.csv (rows in completion order) and gets the
//!   same series as the run.
//! - Closed intervals' histograms come back (from the writer) and are
//!   reset and reused: allocation stops after the first intervals.
//!
//! [`INTERVAL_GRACE`]: tailmesh_model::scenario::INTERVAL_GRACE

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::intervals::MAX_INTERVALS;
use super::stats::{SIGFIG, micros};
use crate::record::{Outcome, RequestRecord};
use tailmesh_model::scenario::INTERVAL_GRACE;

/// One interval's histograms, µs: end to end (ok requests, from the
/// intended send time) and each hop's time including its downstream calls
/// (`HopRecord::total_ns`), in the scenario's hop order. `u32` counts: half
/// the memory of `u64`, and the log's format does not care.
#[derive(Debug)]
pub struct IntervalHists {
    pub e2e: Histogram<u32>,
    pub hops: Vec<Histogram<u32>>,
}

fn new_hist() -> Histogram<u32> {
    Histogram::new(SIGFIG).expect("3 significant digits is a valid histogram configuration")
}

fn record(h: &mut Histogram<u32>, us: u64) {
    if h.record(us).is_err() {
        h.saturating_record(us);
    }
}

impl IntervalHists {
    fn new(hops: usize) -> IntervalHists {
        IntervalHists {
            e2e: new_hist(),
            hops: (0..hops).map(|_| new_hist()).collect(),
        }
    }

    fn reset(&mut self) {
        self.e2e.reset();
        for h in &mut self.hops {
            h.reset();
        }
    }
}

/// An interval still open.
#[derive(Debug)]
struct OpenInterval {
    index: u64,
    /// `None` until an ok request lands in it.
    hists: Option<IntervalHists>,
    ok: u64,
    errors: u64,
    timeouts: u64,
}

impl OpenInterval {
    fn new(index: u64) -> OpenInterval {
        OpenInterval {
            index,
            hists: None,
            ok: 0,
            errors: 0,
            timeouts: 0,
        }
    }
}

/// A closed interval, in order of `index`, every index from 0 on.
#[derive(Debug)]
pub struct ClosedInterval {
    /// Its number: it starts at `index * interval`. (The writer places an
    /// interval by `start`; the tests check the order by this.)
    #[cfg_attr(not(test), allow(dead_code))]
    pub index: u64,
    /// Its start on the measured clock.
    pub start: Duration,
    /// Its width: the interval's, or less for the last one (the run's end).
    pub width: Duration,
    /// Its histograms; `None` when no request in it was ok (empty ones).
    pub hists: Option<IntervalHists>,
    /// Requests meant for it that were ok, failed, timed out.
    pub ok: u64,
    pub errors: u64,
    pub timeouts: u64,
}

/// Cuts records into intervals and closes them by the rule in the module
/// doc; closed ones wait in a queue for [`LatencyIntervals::pop_closed`].
#[derive(Debug)]
pub struct LatencyIntervals {
    width: Duration,
    /// The load's timeout plus [`INTERVAL_GRACE`].
    settle: Duration,
    timeout: Duration,
    /// The generator's largest lateness seen, at most `timeout`.
    slack: Duration,
    hop_index: BTreeMap<String, usize>,
    /// Open intervals, contiguous indexes from `first`.
    open: VecDeque<OpenInterval>,
    /// The index of the oldest open interval.
    first: u64,
    pool: Vec<IntervalHists>,
    /// Per interval after `first` that has records: the earliest start
    /// among the records meant for it.
    earliest_start: BTreeMap<u64, Duration>,
    /// The earliest of `earliest_start`'s values.
    earliest_after_first: Option<Duration>,
    max_end: Duration,
    max_intended: Duration,
    late: u64,
    closed: VecDeque<ClosedInterval>,
    /// Histogram sets made (not taken from the pool), for the tests.
    allocated: usize,
    ended: bool,
}

impl LatencyIntervals {
    /// Intervals `width` wide over `hops` (by name, in scenario order);
    /// requests end by their start plus `timeout`.
    pub fn new(width: Duration, timeout: Duration, hops: &[String]) -> LatencyIntervals {
        LatencyIntervals {
            width: width.max(Duration::from_micros(1)),
            settle: timeout + INTERVAL_GRACE,
            timeout,
            slack: Duration::ZERO,
            hop_index: hops
                .iter()
                .enumerate()
                .map(|(i, h)| (h.clone(), i))
                .collect(),
            open: VecDeque::new(),
            first: 0,
            pool: Vec::new(),
            earliest_start: BTreeMap::new(),
            earliest_after_first: None,
            max_end: Duration::ZERO,
            max_intended: Duration::ZERO,
            late: 0,
            closed: VecDeque::new(),
            allocated: 0,
            ended: false,
        }
    }

    /// The interval width.
    pub fn width(&self) -> Duration {
        self.width
    }

    /// Records that came after their interval had closed.
    pub fn late(&self) -> u64 {
        self.late
    }

    /// Counts one completed request; closes what it lets close.
    pub fn record(&mut self, r: &RequestRecord) {
        let k = self.index(r.intended);
        self.max_end = self.max_end.max(r.end);
        self.slack = self
            .slack
            .max(r.start.saturating_sub(r.intended))
            .min(self.timeout);
        self.max_intended = self.max_intended.max(r.intended);
        let target = if k < self.first || self.ended {
            self.late += 1;
            self.first
        } else {
            k
        };
        while self.first + self.open.len() as u64 <= target {
            let next = self.first + self.open.len() as u64;
            self.open.push_back(OpenInterval::new(next));
        }
        let slot = (target - self.first) as usize;
        match &r.outcome {
            Outcome::Ok => {
                let hops = self.hop_index.len();
                let hists = match self.open[slot].hists.take() {
                    Some(h) => h,
                    None => self.pool.pop().unwrap_or_else(|| {
                        self.allocated += 1;
                        IntervalHists::new(hops)
                    }),
                };
                let interval = &mut self.open[slot];
                let hists = interval.hists.insert(hists);
                interval.ok += 1;
                record(&mut hists.e2e, micros(r.latency()));
                for h in &r.path {
                    if let Some(&i) = self.hop_index.get(h.hop.as_str()) {
                        record(&mut hists.hops[i], h.total_ns / 1_000);
                    }
                }
            }
            Outcome::Timeout => self.open[slot].timeouts += 1,
            Outcome::Error { .. } => self.open[slot].errors += 1,
        }
        if k > self.first && !self.ended {
            let e = self.earliest_start.entry(k).or_insert(r.start);
            *e = (*e).min(r.start);
            self.earliest_after_first = Some(
                self.earliest_after_first
                    .map_or(r.start, |s| s.min(r.start)),
            );
        }
        while self
            .earliest_after_first
            .is_some_and(|s| s + self.settle + self.slack <= self.max_end)
        {
            self.close_first(None);
        }
    }

    /// Closes every interval left: through the one holding `end` (the
    /// measured phase's end, seconds), the last one only as wide as the
    /// time to `end`. Later records count as late.
    pub fn end(&mut self, end: f64) {
        if self.ended {
            return;
        }
        let end = Duration::try_from_secs_f64(end.max(0.0))
            .unwrap_or(Duration::ZERO)
            .max(self.max_intended);
        let w = self.width.as_nanos();
        let through = u64::try_from(end.as_nanos().div_ceil(w)).unwrap_or(u64::MAX);
        let last = through.max(self.first + self.open.len() as u64).max(1) - 1;
        while self.first <= last {
            let real = (self.first == last).then(|| end.saturating_sub(self.start_of(last)));
            self.close_first(real.filter(|r| !r.is_zero() && *r < self.width));
        }
        self.ended = true;
    }

    /// The next closed interval, oldest first.
    pub fn pop_closed(&mut self) -> Option<ClosedInterval> {
        self.closed.pop_front()
    }

    /// Takes back histograms handed out in a [`ClosedInterval`], for reuse.
    pub fn give_back(&mut self, mut hists: IntervalHists) {
        hists.reset();
        self.pool.push(hists);
    }

    fn start_of(&self, index: u64) -> Duration {
        Duration::from_nanos(
            u64::try_from(u128::from(index) * self.width.as_nanos()).unwrap_or(u64::MAX),
        )
    }

    fn index(&self, t: Duration) -> u64 {
        u64::try_from(t.as_nanos() / self.width.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Closes the oldest open interval, `width` wide if given.
    fn close_first(&mut self, width: Option<Duration>) {
        let interval = match self.open.pop_front() {
            Some(i) => i,
            None => OpenInterval::new(self.first),
        };
        debug_assert_eq!(interval.index, self.first);
        self.closed.push_back(ClosedInterval {
            index: interval.index,
            start: self.start_of(interval.index),
            width: width.unwrap_or(self.width),
            hists: interval.hists,
            ok: interval.ok,
            errors: interval.errors,
            timeouts: interval.timeouts,
        });
        self.first += 1;
        self.earliest_start.remove(&self.first);
        self.earliest_after_first = self.earliest_start.values().min().copied();
    }
}

/// One point of the latency over time chart: one or more whole intervals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencyPoint {
    /// Its start, seconds on the measured clock.
    pub start_s: f64,
    /// Its width, seconds.
    pub width_s: f64,
    /// Requests meant for it that were ok.
    pub ok: u64,
    /// Requests meant for it that failed or timed out.
    pub failed: u64,
    /// End-to-end latency of its ok requests, µs (0 without any).
    pub p50_us: u64,
    pub p99_us: u64,
    pub p99_9_us: u64,
    pub max_us: u64,
}

/// The chart's points: `k` intervals each (the smallest power of two that
/// keeps a planned run within [`MAX_INTERVALS`] points); a run of unknown
/// length doubles `k` each time it has made that many more points, so
/// later points are wider.
#[derive(Debug)]
struct LatencySeries {
    k: u64,
    limit: usize,
    acc: Histogram<u32>,
    merged: u64,
    start: Duration,
    width: Duration,
    ok: u64,
    failed: u64,
    points: Vec<LatencyPoint>,
}

impl LatencySeries {
    fn new(width: Duration, planned: Option<Duration>) -> LatencySeries {
        let intervals = planned.map_or(1, |p| {
            (p.as_nanos().div_ceil(width.as_nanos().max(1))).max(1)
        });
        let k = intervals
            .div_ceil(MAX_INTERVALS as u128)
            .next_power_of_two()
            .try_into()
            .unwrap_or(u64::MAX);
        LatencySeries {
            k,
            limit: MAX_INTERVALS,
            acc: new_hist(),
            merged: 0,
            start: Duration::ZERO,
            width: Duration::ZERO,
            ok: 0,
            failed: 0,
            points: Vec::new(),
        }
    }

    fn add(&mut self, c: &ClosedInterval) {
        if self.merged == 0 {
            self.start = c.start;
            self.width = Duration::ZERO;
        }
        if let Some(h) = &c.hists {
            // Same configuration, auto-resizing: adding cannot fail.
            let _ = self.acc.add(&h.e2e);
        }
        self.merged += 1;
        self.width += c.width;
        self.ok += c.ok;
        self.failed += c.errors + c.timeouts;
        if self.merged >= self.k {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.merged == 0 {
            return;
        }
        let q = |q: f64| {
            if self.acc.is_empty() {
                0
            } else {
                self.acc.value_at_quantile(q)
            }
        };
        self.points.push(LatencyPoint {
            start_s: self.start.as_secs_f64(),
            width_s: self.width.as_secs_f64(),
            ok: self.ok,
            failed: self.failed,
            p50_us: q(0.5),
            p99_us: q(0.99),
            p99_9_us: q(0.999),
            max_us: if self.acc.is_empty() {
                0
            } else {
                self.acc.max()
            },
        });
        self.acc.reset();
        (self.merged, self.ok, self.failed) = (0, 0, 0);
        if self.points.len() >= self.limit {
            self.k = self.k.saturating_mul(2);
            self.limit += MAX_INTERVALS;
        }
    }
}

/// A variant's latency over time, fed one record at a time: the intervals,
/// the chart's points made from each as it closes, and (when exported)
/// the closed intervals themselves for the `.hlog` writer.
#[derive(Debug)]
pub struct LatencyOverTime {
    intervals: LatencyIntervals,
    series: LatencySeries,
    /// Whether closed intervals are kept for [`LatencyOverTime::pop_closed`]
    /// (else their histograms are reused at once).
    export: bool,
    exported: VecDeque<ClosedInterval>,
    closed: u64,
}

/// What a variant's intervals came to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyTail {
    /// The chart's points, in order.
    pub points: Vec<LatencyPoint>,
    /// Intervals closed (every one written to the .hlog).
    pub intervals: u64,
    /// Records that came after their interval had closed.
    pub late: u64,
}

impl LatencyOverTime {
    /// Intervals `width` wide; `planned`: the measured phase's planned
    /// length, when known; the load's `timeout`; the hops by name.
    pub fn new(
        width: Duration,
        planned: Option<Duration>,
        timeout: Duration,
        hops: &[String],
    ) -> LatencyOverTime {
        LatencyOverTime {
            intervals: LatencyIntervals::new(width, timeout, hops),
            series: LatencySeries::new(width, planned),
            export: false,
            exported: VecDeque::new(),
            closed: 0,
        }
    }

    /// Keeps closed intervals for [`LatencyOverTime::pop_closed`] from now on.
    pub fn export(&mut self) {
        self.export = true;
    }

    /// The interval width.
    pub fn width(&self) -> Duration {
        self.intervals.width()
    }

    /// Counts one completed request.
    #[cfg(any(test, feature = "testing"))]
    pub fn record(&mut self, r: &RequestRecord) {
        self.record_seen(r, |_| {});
    }

    /// Counts one completed request; `seen` sees each interval it closes.
    pub fn record_seen(&mut self, r: &RequestRecord, seen: impl FnMut(&ClosedInterval)) {
        self.intervals.record(r);
        self.take_closed(seen);
    }

    /// Closes every interval left (see [`LatencyIntervals::end`]).
    #[cfg(any(test, feature = "testing"))]
    pub fn end(&mut self, end: f64) {
        self.end_seen(end, |_| {});
    }

    /// Closes every interval left; `seen` sees each.
    pub fn end_seen(&mut self, end: f64, seen: impl FnMut(&ClosedInterval)) {
        self.intervals.end(end);
        self.take_closed(seen);
        self.series.flush();
    }

    /// The next closed interval, when exported.
    pub fn pop_closed(&mut self) -> Option<ClosedInterval> {
        self.exported.pop_front()
    }

    /// Takes back an exported interval's histograms.
    pub fn give_back(&mut self, hists: IntervalHists) {
        self.intervals.give_back(hists);
    }

    /// The series, once [`LatencyOverTime::end_seen`] has run.
    pub fn finish(self) -> LatencyTail {
        LatencyTail {
            points: self.series.points,
            intervals: self.closed,
            late: self.intervals.late(),
        }
    }

    fn take_closed(&mut self, mut seen: impl FnMut(&ClosedInterval)) {
        while let Some(c) = self.intervals.pop_closed() {
            seen(&c);
            self.series.add(&c);
            self.closed += 1;
            if self.export {
                self.exported.push_back(c);
            } else if let Some(h) = c.hists {
                self.intervals.give_back(h);
            }
        }
    }
}

/// Where a variant's intervals end, seconds on the measured clock: the
/// planned length when it ran to it, else the measured phase's end (or
/// the latest intended send, if later).
pub fn intervals_end(window: &super::intervals::Window, last_send: f64) -> f64 {
    match window.planned_s {
        Some(d) if !window.interrupted && d > 0.0 => d,
        _ => window.measured_s.max(last_send),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::hop_record;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// An ok request meant for `intended_ms`, sent `late_ms` after, taking
    /// `took_ms` from the send, through hops a and b.
    fn ok(id: u64, intended_ms: u64, late_ms: u64, took_ms: u64) -> RequestRecord {
        RequestRecord {
            id,
            intended: ms(intended_ms),
            start: ms(intended_ms + late_ms),
            end: ms(intended_ms + late_ms + took_ms),
            outcome: Outcome::Ok,
            path: vec![
                hop_record("b", 0, 300, false),
                hop_record("a", 0, 800, false),
            ],
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    fn hops() -> Vec<String> {
        vec!["a".to_owned(), "b".to_owned()]
    }

    /// Feeds `records` in order (completion order) to 1 s intervals with a
    /// 1 s timeout; returns the closed intervals as they came, each with
    /// the position of the record after which it closed.
    fn feed(records: &[RequestRecord]) -> (LatencyIntervals, Vec<(usize, ClosedInterval)>) {
        let mut li = LatencyIntervals::new(ms(1000), ms(1000), &hops());
        let mut closed = Vec::new();
        for (i, r) in records.iter().enumerate() {
            li.record(r);
            while let Some(c) = li.pop_closed() {
                closed.push((i, c));
            }
        }
        (li, closed)
    }

    #[test]
    fn an_interval_closes_only_when_every_request_meant_for_it_can_have_ended() {
        // Completion order. Request 1 is meant for 0.9 s but sent 300 ms
        // late (at 1.2 s) and takes 0.9 s: it ends at 2.1 s, after requests
        // meant for 1.0-1.5 s ended, and after one that ended at 2.05 s.
        let records = [
            ok(0, 100, 0, 10),    // ends 0.11
            ok(2, 1000, 0, 10),   // ends 1.01: interval 1's first record
            ok(3, 1500, 0, 500),  // ends 2.0
            ok(4, 1100, 0, 950),  // ends 2.05
            ok(1, 900, 300, 900), // ends 2.1: interval 0's, 300 ms late
            ok(5, 2100, 0, 10),   // ends 2.11
            ok(6, 2300, 0, 300),  // ends 2.6: 1.0 + 1.25 + 0.3 <= 2.6, interval 0 closes
            ok(7, 3400, 0, 300),  // ends 3.7: 2.1 + 1.55 <= 3.7, interval 1 closes
        ];
        let (li, closed) = feed(&records);
        assert_eq!(li.late(), 0);
        let order: Vec<(usize, u64, u64)> =
            closed.iter().map(|(at, c)| (*at, c.index, c.ok)).collect();
        // Interval 0 holds requests 0 and 1; it closed after record 6, the
        // first to end 1.25 s (and the 300 ms the generator was late) after
        // the start of a request meant for 1 s.
        assert_eq!(order, [(6, 0, 2), (7, 1, 3)]);
        let e2e = |c: &ClosedInterval| c.hists.as_ref().map_or(0, |h| h.e2e.len());
        assert_eq!(e2e(&closed[0].1), 2);
        // Closing on `end` alone (interval 0 as soon as a record ends past
        // 1 s) would have lost request 1 to a later interval.
        assert_eq!(
            closed[0].1.hists.as_ref().map(|h| h.e2e.max()),
            Some(1_200_127)
        );
    }

    #[test]
    fn interval_counts_sum_to_the_ok_count_and_errors_are_counted_aside() {
        let mut records = Vec::new();
        for i in 0..3000u64 {
            let mut r = ok(i, i, 0, 1);
            if i % 100 == 7 {
                r.outcome = Outcome::Timeout;
                r.path.clear();
            } else if i % 100 == 9 {
                r.outcome = Outcome::Error {
                    code: crate::record::GrpcCode::Unavailable,
                    message: String::new(),
                };
                r.path.clear();
            }
            records.push(r);
        }
        let mut over = LatencyOverTime::new(ms(1000), Some(ms(3000)), ms(1000), &hops());
        over.export();
        let mut closed = Vec::new();
        for r in &records {
            over.record(r);
            while let Some(c) = over.pop_closed() {
                closed.push(c);
            }
        }
        over.end(3.0);
        while let Some(c) = over.pop_closed() {
            closed.push(c);
        }
        assert_eq!(closed.len(), 3);
        let e2e: u64 = closed
            .iter()
            .filter_map(|c| c.hists.as_ref())
            .map(|h| h.e2e.len())
            .sum();
        let hop_a: u64 = closed
            .iter()
            .filter_map(|c| c.hists.as_ref())
            .map(|h| h.hops[0].len())
            .sum();
        let ok: u64 = closed.iter().map(|c| c.ok).sum();
        assert_eq!((e2e, hop_a, ok), (2940, 2940, 2940));
        assert!(closed.iter().all(|c| c.errors == 10 && c.timeouts == 10));
        // Hop a's time: 800 µs of service plus 0.5 µs, recorded as 800.
        assert_eq!(closed[0].hists.as_ref().map(|h| h.hops[0].max()), Some(800));
        let tail = over.finish();
        assert_eq!((tail.intervals, tail.late), (3, 0));
        let points: Vec<(f64, u64, u64)> = tail
            .points
            .iter()
            .map(|p| (p.start_s, p.ok, p.failed))
            .collect();
        assert_eq!(points, [(0.0, 980, 20), (1.0, 980, 20), (2.0, 980, 20)]);
        assert_eq!(tail.points[0].p50_us, 1_000);
    }

    #[test]
    fn the_pool_stays_bounded_over_an_hour_of_records() {
        // 1000/s for an hour, each sent up to 3 ms late and taking up to
        // 40 ms, completing out of order within each batch of ten.
        let hour = 3_600_000u64;
        let mut over = LatencyOverTime::new(ms(1000), Some(ms(hour)), ms(1000), &hops());
        over.export();
        let mut batch = Vec::with_capacity(10);
        let mut closed = 0u64;
        let mut held = 0usize;
        for i in 0..hour {
            let r = ok(i, i, i % 3, (i * 7) % 40);
            batch.push(r);
            if batch.len() == 10 {
                batch.sort_by_key(|r| r.end);
                for r in batch.drain(..) {
                    over.record(&r);
                }
                // The writer hands histograms back as it goes.
                while let Some(c) = over.pop_closed() {
                    closed += 1;
                    if let Some(h) = c.hists {
                        over.give_back(h);
                    }
                }
                held = held.max(over.intervals.open.len());
            }
        }
        over.end(hour as f64 / 1e3);
        while let Some(c) = over.pop_closed() {
            closed += 1;
            if let Some(h) = c.hists {
                over.give_back(h);
            }
        }
        // ceil(settle / width) + 2 sets at most: 1.25 s of 1 s intervals.
        assert!(
            over.intervals.allocated <= 4,
            "{}",
            over.intervals.allocated
        );
        assert!(held <= 4, "{held}");
        let tail = over.finish();
        assert_eq!((closed, tail.intervals, tail.late), (3600, 3600, 0));
        assert_eq!(tail.points.len(), 3600);
        assert_eq!(tail.points.iter().map(|p| p.ok).sum::<u64>(), hour);
    }

    #[test]
    fn a_run_of_unknown_length_widens_its_points_instead_of_growing() {
        let mut over = LatencyOverTime::new(ms(1000), None, ms(100), &hops());
        // One request a second for 3 hours.
        let n = 3 * 3600;
        for i in 0..n {
            over.record(&ok(i, i * 1000, 0, 1));
        }
        over.end(n as f64);
        let tail = over.finish();
        assert_eq!(tail.intervals, n);
        // 4096 points of 1 s, then the other 6704 s in points of 2 s.
        assert_eq!(tail.points.len(), 4096 + 3352, "{}", tail.points.len());
        assert_eq!(tail.points[4095].width_s, 1.0);
        assert_eq!(tail.points[4096].width_s, 2.0);
        assert_eq!(tail.points.last().map(|p| p.width_s), Some(2.0));
        assert_eq!(tail.points.iter().map(|p| p.ok).sum::<u64>(), n);
        // A planned run picks its width up front.
        let planned = LatencySeries::new(ms(1000), Some(Duration::from_secs(3 * 3600)));
        assert_eq!(planned.k, 4);
    }

    #[test]
    fn a_late_generator_keeps_its_intervals_open_longer() {
        let records = [
            // The generator is 600 ms behind: its tasks resume late too.
            ok(0, 50, 600, 10),
            ok(2, 1000, 0, 10),
            // Ends 2.31 s: past 1.0 + 1.25, not past 1.0 + 1.25 + 0.6.
            ok(3, 2300, 0, 10),
            // Meant for 0.1 s, sent at 0.7 s, its answer taken 1.8 s later.
            ok(1, 100, 600, 1800),
            ok(4, 3000, 0, 900),
        ];
        let (li, closed) = feed(&records);
        assert_eq!(li.late(), 0);
        let order: Vec<(usize, u64, u64)> =
            closed.iter().map(|(at, c)| (*at, c.index, c.ok)).collect();
        assert_eq!(order, [(4, 0, 2)]);
    }

    #[test]
    fn a_record_later_than_the_rule_is_counted_late_not_lost() {
        let records = [
            ok(0, 100, 0, 10),
            ok(2, 1000, 0, 10),
            ok(3, 2400, 0, 10), // ends 2.41 >= 1.0 + 1.25: interval 0 closes
            // Meant for 0.5 s, sent 2 s late by a stalled generator.
            ok(1, 500, 2000, 10),
        ];
        let (mut li, mut closed) = feed(&records);
        li.end(3.0);
        while let Some(c) = li.pop_closed() {
            closed.push((records.len(), c));
        }
        assert_eq!(li.late(), 1);
        let ok: Vec<(u64, u64)> = closed.iter().map(|(_, c)| (c.index, c.ok)).collect();
        // Counted in the oldest open interval (1) instead.
        assert_eq!(ok, [(0, 1), (1, 2), (2, 1)]);
    }

    #[test]
    fn finish_closes_the_partial_last_interval_with_its_real_width() {
        let mut li = LatencyIntervals::new(ms(1000), ms(1000), &hops());
        li.record(&ok(0, 100, 0, 10));
        li.record(&ok(1, 2_200, 0, 10));
        li.end(2.5);
        let mut closed = Vec::new();
        while let Some(c) = li.pop_closed() {
            closed.push((c.index, c.start, c.width, c.ok, c.hists.is_some()));
        }
        assert_eq!(
            closed,
            [
                (0, ms(0), ms(1000), 1, true),
                // Empty, written as such: no gap in the time axis.
                (1, ms(1000), ms(1000), 0, false),
                (2, ms(2000), ms(500), 1, true),
            ]
        );
        // A run that ends on an interval boundary has no empty one after.
        let mut li = LatencyIntervals::new(ms(1000), ms(1000), &hops());
        li.record(&ok(0, 100, 0, 10));
        li.end(1.0);
        assert_eq!(li.pop_closed().map(|c| c.width), Some(ms(1000)));
        assert!(li.pop_closed().is_none());
    }
}
