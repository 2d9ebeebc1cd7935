//! Open-loop send times: uniform or Poisson, seeded, at one rate or in
//! load steps.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tailmesh_services::hop::draw::keyed_rng;

use tokio::time::Instant;

use crate::scenario::{Arrivals, Step, Stop};

/// A stretch of the schedule at one rate: `[start, start + length)` from
/// the load's origin; the last one has no end.
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: Duration,
    length: Option<Duration>,
    rate: f64,
}

/// The offsets (from the start of the load) at which requests are meant to
/// be sent. The same seed gives the same schedule.
#[derive(Clone)]
pub(crate) struct Schedule {
    arrivals: Arrivals,
    rng: ChaCha8Rng,
    segments: Vec<Segment>,
    /// The segment of the next send time.
    segment: usize,
    /// Uniform: requests sent so far in the current segment.
    sent: u64,
    /// Poisson: the next send time, in seconds from the segment's start.
    within_secs: f64,
}

/// A schedule's send times on the clock, up to where the load stops: the
/// one walk of it the open loops and the count of a server stream's
/// messages share.
#[derive(Clone)]
pub(crate) struct Due {
    schedule: Schedule,
    origin: Instant,
    measure_from: Instant,
    stop: Stop,
    /// Send times after warmup given so far.
    measured: u64,
}

impl Due {
    /// `schedule`'s times from `origin`, measured after `warmup`, until
    /// `stop`.
    pub(crate) fn new(schedule: Schedule, origin: Instant, warmup: Duration, stop: Stop) -> Self {
        Due {
            schedule,
            origin,
            measure_from: origin + warmup,
            stop,
            measured: 0,
        }
    }

    /// The next send time and whether it is measured (after warmup); or,
    /// once the load stops there, the measured phase's length: from the
    /// end of warmup to the first time not sent.
    pub(crate) fn next(&mut self) -> Result<(Instant, bool), Duration> {
        let intended = self.origin + self.schedule.next_offset();
        let measuring = intended >= self.measure_from;
        let finished = match self.stop {
            Stop::Duration(d) => intended >= self.measure_from + d,
            Stop::Requests(n) => measuring && self.measured >= n,
        };
        if finished {
            return Err(intended.saturating_duration_since(self.measure_from));
        }
        self.measured += u64::from(measuring);
        Ok((intended, measuring))
    }

    /// How many send times there are in all, warmup's included.
    pub(crate) fn count(mut self) -> u64 {
        let mut all = 0;
        while self.next().is_ok() {
            all += 1;
        }
        all
    }
}

impl Schedule {
    /// A schedule of `rate` requests per second; or, with `steps`, a
    /// warmup over `[0, warmup)` at the first step's rate, then each step
    /// over its own stretch at its rate. Past the last step its rate goes
    /// on (the generator stops at the end of the steps).
    pub(crate) fn new(
        rate: f64,
        arrivals: Arrivals,
        seed: u64,
        warmup: Duration,
        steps: &[Step],
    ) -> Self {
        let mut segments = Vec::with_capacity(steps.len() + 2);
        match (steps.first(), steps.last()) {
            (Some(first), Some(last)) => {
                if !warmup.is_zero() {
                    segments.push(Segment {
                        start: Duration::ZERO,
                        length: Some(warmup),
                        rate: first.rate,
                    });
                }
                let mut start = warmup;
                for step in steps {
                    segments.push(Segment {
                        start,
                        length: Some(step.duration),
                        rate: step.rate,
                    });
                    start = start.saturating_add(step.duration);
                }
                segments.push(Segment {
                    start,
                    length: None,
                    rate: last.rate,
                });
            }
            _ => segments.push(Segment {
                start: Duration::ZERO,
                length: None,
                rate,
            }),
        }
        Schedule {
            arrivals,
            rng: keyed_rng(seed, "arrivals", 0, 0),
            segments,
            segment: 0,
            sent: 0,
            within_secs: 0.0,
        }
    }

    /// The next send time. Uniform arrivals are computed from the
    /// segment's start and the request's number in it, not summed, so they
    /// do not drift and each step sends exactly its share.
    pub(crate) fn next_offset(&mut self) -> Duration {
        match self.arrivals {
            Arrivals::Uniform => loop {
                let seg = self.segments[self.segment];
                let within = Duration::from_secs_f64((self.sent as f64 / seg.rate).max(0.0));
                if seg.length.is_some_and(|l| within >= l) {
                    self.segment += 1;
                    self.sent = 0;
                    continue;
                }
                self.sent += 1;
                return seg.start.saturating_add(within);
            },
            Arrivals::Poisson => {
                let seg = self.segments[self.segment];
                let now = seg
                    .start
                    .saturating_add(Duration::from_secs_f64(self.within_secs.max(0.0)));
                loop {
                    let seg = self.segments[self.segment];
                    // Inverse transform: an exponential gap with mean 1 / rate.
                    let u: f64 = self.rng.random();
                    let next = self.within_secs - (1.0 - u).ln() / seg.rate;
                    match seg.length {
                        // Past the segment's end: the process starts over
                        // at the boundary at the next rate (memoryless, so
                        // this is exact).
                        Some(l) if next >= l.as_secs_f64() => {
                            self.segment += 1;
                            self.within_secs = 0.0;
                        }
                        _ => {
                            self.within_secs = next;
                            break;
                        }
                    }
                }
                now
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_exact() {
        let mut s = Schedule::new(400.0, Arrivals::Uniform, 1, Duration::ZERO, &[]);
        let offsets: Vec<Duration> = (0..4).map(|_| s.next_offset()).collect();
        assert_eq!(
            offsets,
            [0, 2500, 5000, 7500].map(Duration::from_micros).to_vec()
        );
    }

    #[test]
    fn poisson_has_the_right_rate_and_is_seeded() {
        let take = |seed| {
            let mut s = Schedule::new(1000.0, Arrivals::Poisson, seed, Duration::ZERO, &[]);
            (0..100_000).map(|_| s.next_offset()).collect::<Vec<_>>()
        };
        let a = take(5);
        assert_eq!(a, take(5));
        assert_ne!(a, take(6));
        let last = a.last().copied().unwrap_or_default().as_secs_f64();
        // 100k arrivals at 1000/s span 100 s; the sum of 100k exponential
        // gaps has a standard deviation of 0.32 s.
        assert!((last - 100.0).abs() < 1.6, "span {last}");
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn step(rate: f64, s: f64) -> Step {
        Step {
            rate,
            duration: secs(s),
        }
    }

    /// Send times of `schedule` before `end`, counted in each of the
    /// stretches that `bounds` cut (warmup first, then each step), and the
    /// first send time at or past `end`.
    fn counts(schedule: &mut Schedule, bounds: &[Duration]) -> (Vec<u64>, Duration) {
        let end = bounds.last().copied().unwrap_or_default();
        let mut counts = vec![0u64; bounds.len()];
        let mut previous = Duration::ZERO;
        loop {
            let t = schedule.next_offset();
            assert!(t >= previous, "{t:?} after {previous:?}");
            previous = t;
            if t >= end {
                return (counts, t);
            }
            let i = bounds.iter().position(|b| t < *b).unwrap_or(bounds.len());
            counts[i] += 1;
        }
    }

    /// The ends of warmup and of each step, from the origin.
    fn bounds(warmup: Duration, steps: &[Step]) -> Vec<Duration> {
        let mut ends = vec![warmup];
        for s in steps {
            ends.push(*ends.last().unwrap_or(&Duration::ZERO) + s.duration);
        }
        ends
    }

    #[test]
    fn uniform_steps_send_exactly_their_share_from_their_own_start() {
        let steps = [step(200.0, 4.0), step(400.0, 4.0), step(333.3, 1.0)];
        let warmup = secs(1.0);
        let mut s = Schedule::new(200.0, Arrivals::Uniform, 1, warmup, &steps);
        let (counts, end) = counts(&mut s, &bounds(warmup, &steps));
        // Warmup at the first step's rate, then rate x duration, rounded up
        // where it is not whole (333.3 in 1 s: 334 sends, at 0 .. 333/333.3).
        assert_eq!(counts, [200, 800, 1600, 334]);
        // The generator stops at the first send time past the last step:
        // exactly its end.
        assert_eq!(end, secs(10.0));

        // Each step's first send is at its start, the next 1/rate later.
        let mut s = Schedule::new(200.0, Arrivals::Uniform, 1, warmup, &steps);
        let offsets: Vec<Duration> = (0..1003).map(|_| s.next_offset()).collect();
        assert_eq!(offsets[199], secs(0.995));
        assert_eq!(offsets[200], secs(1.0));
        assert_eq!(offsets[999], secs(4.995));
        assert_eq!(offsets[1000], secs(5.0));
        assert_eq!(offsets[1001], secs(5.0025));
    }

    #[test]
    fn poisson_steps_have_each_its_rate_and_are_seeded() {
        let steps = [
            step(1000.0, 10.0),
            step(3000.0, 5.0),
            step(200.0, 10.0),
            step(2000.0, 0.5),
        ];
        let warmup = secs(2.0);
        let take = |seed| {
            let mut s = Schedule::new(1000.0, Arrivals::Poisson, seed, warmup, &steps);
            counts(&mut s, &bounds(warmup, &steps))
        };
        let (a, end) = take(5);
        assert_eq!((a.clone(), end), take(5));
        assert_ne!(a, take(6).0);
        assert!(end >= secs(27.5), "{end:?}");
        let expected = [2000.0, 10_000.0, 15_000.0, 2000.0, 1000.0];
        for (count, mean) in a.iter().zip(expected) {
            // A Poisson count: variance = mean; 3 sigma.
            let sigma = f64::sqrt(mean);
            assert!(
                (*count as f64 - mean).abs() <= 3.0 * sigma,
                "{count} sends where {mean} were expected: {a:?}"
            );
        }
    }
}
