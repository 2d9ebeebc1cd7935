//! Latency histograms, their percentiles, and the Wilson score interval.
//!
//! Every latency series is an HdrHistogram of **microseconds** with 3
//! significant digits that grows as needed (auto-resize), so no latency is
//! ever clamped or dropped.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Significant decimal digits kept by every latency histogram.
pub const SIGFIG: u8 = 3;

/// The z value of a two-sided 95 % interval (the 0.975 normal quantile).
pub const Z95: f64 = 1.959964;

/// A new, empty latency histogram: microseconds, [`SIGFIG`] digits,
/// auto-resizing.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new(SIGFIG).expect("3 significant digits is a valid histogram configuration")
}

/// Whole microseconds in `d`, truncated (sub-microsecond times count as 0),
/// saturating at `u64::MAX`.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Records `us` microseconds once. Uses `record`, never `record_correct`:
/// open-loop latencies are already measured from the intended send time, so
/// a second correction for coordinated omission would count stalls twice.
pub fn record_us(histogram: &mut Histogram<u64>, us: u64) {
    // An auto-resizing histogram only refuses values beyond its largest
    // possible range; clamp those rather than lose the sample.
    if histogram.record(us).is_err() {
        histogram.saturating_record(us);
    }
}

/// A histogram's summary, every value in **microseconds**: integers as the
/// histogram reports them (the highest value equivalent to the percentile's
/// bucket, within 0.1 %), except `mean_us`. With `count == 0` every value
/// is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Samples recorded.
    pub count: u64,
    /// Smallest sample, µs.
    pub min_us: u64,
    /// Arithmetic mean, µs (fractional).
    pub mean_us: f64,
    /// Median, µs.
    pub p50_us: u64,
    /// 90th percentile, µs.
    pub p90_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p99_9_us: u64,
    /// 99.99th percentile, µs.
    pub p99_99_us: u64,
    /// Largest sample, µs.
    pub max_us: u64,
}

impl Percentiles {
    /// Summarizes a histogram of microseconds.
    pub fn from_histogram(histogram: &Histogram<u64>) -> Percentiles {
        if histogram.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: histogram.len(),
            min_us: histogram.min(),
            mean_us: histogram.mean(),
            p50_us: histogram.value_at_quantile(0.5),
            p90_us: histogram.value_at_quantile(0.9),
            p99_us: histogram.value_at_quantile(0.99),
            p99_9_us: histogram.value_at_quantile(0.999),
            p99_99_us: histogram.value_at_quantile(0.9999),
            max_us: histogram.max(),
        }
    }
}

/// The Wilson score interval `(lo, hi)` for `successes` out of `n` trials at
/// normal quantile `z` (use [`Z95`] for 95 %). Unlike the normal
/// approximation it stays inside [0, 1] and is sensible for 0 or `n`
/// successes. With `n == 0` nothing is known: `(0.0, 1.0)`.
pub fn wilson(successes: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n_f = n as f64;
    let p = successes.min(n) as f64 / n_f;
    let z2 = z * z;
    let denom = 1.0 + z2 / n_f;
    let center = (p + z2 / (2.0 * n_f)) / denom;
    let half = z / denom * (p * (1.0 - p) / n_f + z2 / (4.0 * n_f * n_f)).sqrt();
    ((center - half).max(0.0), (center + half).min(1.0))
}

/// [`wilson`] at 95 %.
pub fn wilson95(successes: u64, n: u64) -> (f64, f64) {
    wilson(successes, n, Z95)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn percentiles_of_one_to_one_thousand() {
        let mut h = new_histogram();
        for us in 1..=1000 {
            record_us(&mut h, us);
        }
        let p = Percentiles::from_histogram(&h);
        // Values below 2048 are exact at 3 significant digits.
        assert_eq!(p.count, 1000);
        assert_eq!(p.min_us, 1);
        assert_eq!(p.p50_us, 500);
        assert_eq!(p.p90_us, 900);
        assert_eq!(p.p99_us, 990);
        assert_eq!(p.p99_9_us, 999);
        assert_eq!(p.p99_99_us, 1000);
        assert_eq!(p.max_us, 1000);
        assert!(close(p.mean_us, 500.5), "mean {}", p.mean_us);
    }

    #[test]
    fn percentiles_keep_three_digits_on_large_values() {
        let mut h = new_histogram();
        for _ in 0..99 {
            record_us(&mut h, 1_000);
        }
        // One request of 20 s: the histogram grows instead of dropping it.
        record_us(&mut h, 20_000_000);
        let p = Percentiles::from_histogram(&h);
        assert_eq!(p.p99_us, 1_000);
        assert_eq!(p.p99_9_us, p.max_us);
        assert!(
            p.max_us >= 20_000_000 && p.max_us <= 20_020_000,
            "{}",
            p.max_us
        );
    }

    #[test]
    fn empty_histogram_gives_zeros() {
        assert_eq!(
            Percentiles::from_histogram(&new_histogram()),
            Percentiles::default()
        );
    }

    #[test]
    fn micros_truncates() {
        assert_eq!(micros(Duration::from_nanos(1_999)), 1);
        assert_eq!(micros(Duration::from_millis(3)), 3_000);
    }

    // Expected values computed independently (Python, float64, same formula).
    #[test]
    fn wilson_known_answers() {
        let cases = [
            (0, 10, 0.0, 0.277_532_803_0),
            (27, 100, 0.192_695_841_0, 0.364_321_168_5),
            (271, 1000, 0.244_366_719_5, 0.299_385_935_9),
            (10, 10, 0.722_467_197_0, 1.0),
            (5, 10, 0.236_593_089_0, 0.763_406_911_0),
        ];
        for (k, n, lo, hi) in cases {
            let (l, h) = wilson95(k, n);
            assert!(close(l, lo) && close(h, hi), "{k}/{n}: got ({l}, {h})");
        }
    }

    #[test]
    fn wilson_without_trials_knows_nothing() {
        assert_eq!(wilson95(0, 0), (0.0, 1.0));
    }
}
