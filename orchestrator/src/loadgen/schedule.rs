//! Open-loop send times: uniform or Poisson, seeded.

use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tailmesh_services::hop::draw::keyed_rng;

use crate::scenario::Arrivals;

/// The offsets (from the start of the load) at which requests are meant to
/// be sent. The same seed gives the same schedule.
pub(crate) struct Schedule {
    rate: f64,
    arrivals: Arrivals,
    rng: ChaCha8Rng,
    sent: u64,
    offset_secs: f64,
}

impl Schedule {
    /// A schedule of `rate` requests per second.
    pub(crate) fn new(rate: f64, arrivals: Arrivals, seed: u64) -> Self {
        Schedule {
            rate,
            arrivals,
            rng: keyed_rng(seed, "arrivals", 0, 0),
            sent: 0,
            offset_secs: 0.0,
        }
    }

    /// The next send time. Uniform arrivals are computed from the request
    /// number, not summed, so they do not drift.
    pub(crate) fn next_offset(&mut self) -> Duration {
        let secs = match self.arrivals {
            Arrivals::Uniform => self.sent as f64 / self.rate,
            Arrivals::Poisson => {
                let now = self.offset_secs;
                // Inverse transform: an exponential gap with mean 1 / rate.
                let u: f64 = self.rng.random();
                self.offset_secs += -(1.0 - u).ln() / self.rate;
                now
            }
        };
        self.sent += 1;
        Duration::from_secs_f64(secs.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_exact() {
        let mut s = Schedule::new(400.0, Arrivals::Uniform, 1);
        let offsets: Vec<Duration> = (0..4).map(|_| s.next_offset()).collect();
        assert_eq!(
            offsets,
            [0, 2500, 5000, 7500].map(Duration::from_micros).to_vec()
        );
    }

    #[test]
    fn poisson_has_the_right_rate_and_is_seeded() {
        let take = |seed| {
            let mut s = Schedule::new(1000.0, Arrivals::Poisson, seed);
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
}
