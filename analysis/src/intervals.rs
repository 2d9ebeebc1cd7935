//! Requests over time: a variant's measured phase cut into fixed intervals,
//! each counting the requests meant to be sent in it (sent, ok, errors,
//! timeouts) and the answers that arrived in it. Filled one request at a
//! time; its size is bounded by [`MAX_INTERVALS`], not by the run's length
//! (a long run's intervals widen instead). The throughput chart draws the
//! answers. Latency over time, a histogram per interval of
//! `[report] interval`, is `latency_intervals`'.

use std::{cmp::Reverse, collections::BinaryHeap, time::Duration};

use crate::record::{Outcome, RequestRecord};

/// The first interval width; it doubles whenever a run needs more than
/// [`MAX_INTERVALS`] of them.
pub const FIRST_INTERVAL: Duration = Duration::from_secs(1);
/// The most intervals a series holds (an hour and eight minutes at 1 s).
pub const MAX_INTERVALS: usize = 4096;

/// A variant's requests over its measured phase, in fixed intervals:
/// interval `i` covers `[i * interval, (i + 1) * interval)` seconds into it.
#[derive(Clone, Debug, PartialEq)]
pub struct IntervalSeries {
    /// The width of each interval.
    pub interval: Duration,
    /// The intervals, from the start of the measured phase.
    pub buckets: Vec<IntervalStats>,
    /// Where sending ended, seconds into the measured phase (see
    /// `sending_end`): answers after it are the drain of requests still
    /// in flight, not the system's throughput.
    pub sending_end: f64,
    /// Ok answers that arrived after `sending_end` (not in `buckets`'
    /// answer counts).
    pub late_ok: u64,
    /// Errors and timeouts that arrived after `sending_end`.
    pub late_failed: u64,
}

impl Default for IntervalSeries {
    fn default() -> Self {
        IntervalSeries {
            interval: FIRST_INTERVAL,
            buckets: Vec::new(),
            sending_end: 0.0,
            late_ok: 0,
            late_failed: 0,
        }
    }
}

/// One interval's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntervalStats {
    /// Requests whose intended send time falls in the interval.
    pub sent: u64,
    /// Of those, answered ok.
    pub ok: u64,
    /// Of those, failed with an error.
    pub errors: u64,
    /// Of those, timed out.
    pub timeouts: u64,
    /// Ok answers that arrived in the interval, before sending ended.
    pub answered_ok: u64,
    /// Errors and timeouts that arrived in the interval, before sending
    /// ended.
    pub answered_failed: u64,
}

impl IntervalStats {
    fn add(&mut self, other: &IntervalStats) {
        self.sent += other.sent;
        self.ok += other.ok;
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        self.answered_ok += other.answered_ok;
        self.answered_failed += other.answered_failed;
    }
}

/// What decides where a variant's sending ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// The planned duration, seconds, when the load stops by time.
    pub planned_s: Option<f64>,
    /// Whether the load was open loop.
    pub open: bool,
    /// The measured phase's length, seconds.
    pub measured_s: f64,
    /// Whether the run was cut short.
    pub interrupted: bool,
}

/// Where a variant's sending ended, seconds into the measured phase: the
/// planned duration; when it stopped by count or was interrupted, where
/// sending actually stopped (`last_send`: the latest intended send time).
pub fn sending_end(window: Option<&Window>, last_send: f64) -> f64 {
    match window {
        Some(w) => match w.planned_s {
            Some(d) if !w.interrupted && d > 0.0 => d,
            // Open loop, the measured phase ends at the next intended send
            // (or the interruption); closed loop, at the last answer.
            _ if w.open => w.measured_s.max(last_send),
            _ => last_send,
        },
        None => last_send,
    }
}

/// Fills an [`IntervalSeries`] one request at a time.
#[derive(Debug)]
pub struct IntervalRecorder {
    interval: Duration,
    buckets: Vec<IntervalStats>,
    /// The latest intended send time seen.
    last_send: Duration,
    /// Answers (arrival, ok) that arrived after the latest send seen so
    /// far: the only ones that can arrive after sending ended. Answers
    /// earlier than a later send are dropped from it, so it holds about the
    /// requests in flight at the end, not the run.
    after_last_send: BinaryHeap<Reverse<(Duration, bool)>>,
}

impl Default for IntervalRecorder {
    fn default() -> Self {
        IntervalRecorder {
            interval: FIRST_INTERVAL,
            buckets: Vec::new(),
            last_send: Duration::ZERO,
            after_last_send: BinaryHeap::new(),
        }
    }
}

impl IntervalRecorder {
    /// Counts one completed request.
    pub fn record(&mut self, r: &RequestRecord) {
        let sent = self.bucket(r.intended);
        sent.sent += 1;
        match r.outcome {
            Outcome::Ok => sent.ok += 1,
            Outcome::Timeout => sent.timeouts += 1,
            Outcome::Error { .. } => sent.errors += 1,
        }
        let ok = r.outcome == Outcome::Ok;
        let answered = self.bucket(r.end);
        if ok {
            answered.answered_ok += 1;
        } else {
            answered.answered_failed += 1;
        }
        self.last_send = self.last_send.max(r.intended);
        self.after_last_send.push(Reverse((r.end, ok)));
        while self
            .after_last_send
            .peek()
            .is_some_and(|Reverse((end, _))| *end < self.last_send)
        {
            self.after_last_send.pop();
        }
    }

    /// The latest intended send time seen, seconds.
    pub fn last_send(&self) -> f64 {
        self.last_send.as_secs_f64()
    }

    /// The series, with sending ended at `sending_end` seconds: answers
    /// after it move from their interval to the late counts.
    pub fn finish(mut self, sending_end: f64) -> IntervalSeries {
        let (mut late_ok, mut late_failed) = (0, 0);
        for Reverse((end, ok)) in std::mem::take(&mut self.after_last_send) {
            if end.as_secs_f64() < sending_end {
                continue;
            }
            let b = self.bucket(end);
            if ok {
                b.answered_ok = b.answered_ok.saturating_sub(1);
                late_ok += 1;
            } else {
                b.answered_failed = b.answered_failed.saturating_sub(1);
                late_failed += 1;
            }
        }
        IntervalSeries {
            interval: self.interval,
            buckets: self.buckets,
            sending_end,
            late_ok,
            late_failed,
        }
    }

    /// The interval holding `t`, widening every interval as needed.
    fn bucket(&mut self, t: Duration) -> &mut IntervalStats {
        let mut i = index(t, self.interval);
        while i >= MAX_INTERVALS {
            self.widen();
            i = index(t, self.interval);
        }
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, IntervalStats::default());
        }
        &mut self.buckets[i]
    }

    /// Doubles the interval, merging each pair.
    fn widen(&mut self) {
        self.interval *= 2;
        self.buckets = self
            .buckets
            .chunks(2)
            .map(|pair| {
                let mut merged = IntervalStats::default();
                for b in pair {
                    merged.add(b);
                }
                merged
            })
            .collect();
    }
}

fn index(t: Duration, interval: Duration) -> usize {
    usize::try_from(t.as_nanos() / interval.as_nanos().max(1)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::at;

    #[test]
    fn requests_count_where_they_were_meant_to_be_sent_and_answers_where_they_arrived() {
        let mut r = IntervalRecorder::default();
        r.record(&at(0, 100, 5, Outcome::Ok));
        r.record(&at(1, 900, 300, Outcome::Ok));
        r.record(&at(2, 1_500, 2_000, Outcome::Timeout));
        let error = Outcome::Error {
            code: crate::record::GrpcCode::Unavailable,
            message: String::new(),
        };
        r.record(&at(3, 2_100, 10, error));
        assert_eq!(r.last_send(), 2.1);
        let s = r.finish(3.0);
        assert_eq!(s.interval, Duration::from_secs(1));
        let sent: Vec<u64> = s.buckets.iter().map(|b| b.sent).collect();
        assert_eq!(sent, [2, 1, 1, 0]);
        assert_eq!((s.buckets[1].timeouts, s.buckets[2].errors), (1, 1));
        let answered: Vec<(u64, u64)> = s
            .buckets
            .iter()
            .map(|b| (b.answered_ok, b.answered_failed))
            .collect();
        // The timeout arrived at 3.5 s, after sending ended: late.
        assert_eq!(answered, [(1, 0), (1, 0), (0, 1), (0, 0)]);
        assert_eq!((s.late_ok, s.late_failed, s.sending_end), (0, 1, 3.0));
    }

    #[test]
    fn late_answers_are_found_whatever_order_the_requests_come_in() {
        let records = [
            at(0, 9_990, 500, Outcome::Ok),
            at(1, 100, 9_950, Outcome::Ok),
            at(2, 5_000, 6_000, Outcome::Timeout),
            at(3, 9_000, 10, Outcome::Ok),
        ];
        for order in [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]] {
            let mut r = IntervalRecorder::default();
            for i in order {
                r.record(&records[i]);
            }
            let s = r.finish(10.0);
            assert_eq!((s.late_ok, s.late_failed), (2, 1), "{order:?}");
            let answered: u64 = s.buckets.iter().map(|b| b.answered_ok).sum();
            assert_eq!(answered, 1, "{order:?}");
        }
    }

    #[test]
    fn a_long_run_widens_its_intervals_instead_of_growing() {
        let mut r = IntervalRecorder::default();
        // One request a minute for 3 days.
        for i in 0..3 * 24 * 60 {
            r.record(&at(i, i * 60_000, 1, Outcome::Ok));
        }
        let s = r.finish(3.0 * 86_400.0);
        assert!(s.buckets.len() <= MAX_INTERVALS, "{}", s.buckets.len());
        assert_eq!(s.interval, Duration::from_secs(64));
        assert_eq!(s.buckets.iter().map(|b| b.sent).sum::<u64>(), 4320);
        assert_eq!(s.buckets.iter().map(|b| b.answered_ok).sum::<u64>(), 4320);
    }

    #[test]
    fn the_sending_window_is_the_plan_or_where_sending_stopped() {
        let planned = |planned_s| Window {
            planned_s,
            open: true,
            measured_s: 20.0,
            interrupted: false,
        };
        // 300 sends, every 10 ms: the last at 2.99 s.
        let last = 2.99;
        assert_eq!(sending_end(Some(&planned(Some(10.0))), last), 10.0);
        // Interrupted: the plan no longer holds.
        let mut w = planned(Some(10.0));
        w.interrupted = true;
        w.measured_s = 3.0;
        assert_eq!(sending_end(Some(&w), last), 3.0);
        // Stopped by count, open loop: the next intended send.
        let mut w = planned(None);
        w.measured_s = 3.0;
        assert_eq!(sending_end(Some(&w), last), 3.0);
        // Closed loop: its measured phase runs to the last answer (3.49 s);
        // sending stopped at the last send.
        w.open = false;
        w.measured_s = 3.49;
        assert_eq!(sending_end(Some(&w), last), 2.99);
        assert_eq!(sending_end(None, last), 2.99);
    }
}
