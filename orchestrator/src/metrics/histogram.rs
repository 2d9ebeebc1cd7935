//! A latency histogram as Prometheus reads it: native (exponential buckets
//! of schema [`SCHEMA`], each bound the previous one times 2^(1/8), about
//! 9 %) and classic (fixed bounds, [`CLASSIC_BOUNDS`]) side by side, so a
//! server with native histograms and an older one both get a histogram.

use std::collections::BTreeMap;

/// The native buckets' schema: each power of two cut into 2^3 buckets.
pub(crate) const SCHEMA: i32 = 3;

/// Values at or below this (seconds) count in the zero bucket: 2^-30 s,
/// about 1 ns, below anything a request takes.
pub(crate) const ZERO_THRESHOLD: f64 = 1.0 / (1u64 << 30) as f64;

/// The classic buckets' upper bounds, in seconds (the last one, +Inf, is
/// implied).
pub(crate) const CLASSIC_BOUNDS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Observations of seconds, cumulative since the variant began.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Histogram {
    pub(crate) count: u64,
    pub(crate) sum: f64,
    /// In the zero bucket.
    pub(crate) zero: u64,
    /// Native bucket index to its count: index `i` holds `(b^(i-1), b^i]`
    /// with `b = 2^(2^-SCHEMA)`.
    pub(crate) native: BTreeMap<i32, u64>,
    /// Per classic bound, the count at or below it and above the one
    /// before (not cumulative); the last entry is above every bound.
    pub(crate) classic: [u64; CLASSIC_BOUNDS.len() + 1],
}

impl Histogram {
    pub(crate) fn observe(&mut self, seconds: f64) {
        let seconds = seconds.max(0.0);
        self.count += 1;
        self.sum += seconds;
        if seconds <= ZERO_THRESHOLD {
            self.zero += 1;
        } else {
            *self.native.entry(native_index(seconds)).or_insert(0) += 1;
        }
        let slot = CLASSIC_BOUNDS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(CLASSIC_BOUNDS.len());
        self.classic[slot] += 1;
    }

    /// The classic buckets as Prometheus writes them: each bound with the
    /// count at or below it (cumulative), +Inf last.
    pub(crate) fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        let mut out = Vec::with_capacity(self.classic.len());
        for (i, n) in self.classic.iter().enumerate() {
            total += n;
            out.push((
                CLASSIC_BOUNDS.get(i).copied().unwrap_or(f64::INFINITY),
                total,
            ));
        }
        out
    }

    /// The native buckets as spans and deltas: each span `(offset,
    /// length)`, the first offset the first index and the others the gap
    /// since the last span; each count the difference from the bucket
    /// before it (from 0 for the first).
    pub(crate) fn spans_and_deltas(&self) -> (Vec<(i32, u32)>, Vec<i64>) {
        let mut spans: Vec<(i32, u32)> = Vec::new();
        let mut deltas = Vec::with_capacity(self.native.len());
        let mut last_index: Option<i32> = None;
        let mut last_count = 0i64;
        for (&i, &n) in &self.native {
            match last_index {
                Some(prev) if i == prev + 1 => {
                    if let Some(span) = spans.last_mut() {
                        span.1 += 1;
                    }
                }
                Some(prev) => spans.push((i - prev - 1, 1)),
                None => spans.push((i, 1)),
            }
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            deltas.push(n - last_count);
            last_count = n;
            last_index = Some(i);
        }
        (spans, deltas)
    }
}

/// The native bucket of `seconds` (> 0): the least `i` with `seconds <=
/// 2^(i / 2^SCHEMA)`.
pub(crate) fn native_index(seconds: f64) -> i32 {
    let scaled = seconds.log2() * f64::from(1 << SCHEMA);
    let mut i = scaled.ceil() as i32;
    // Correct the float rounding at the bounds themselves.
    if upper_bound(i - 1) >= seconds {
        i -= 1;
    } else if upper_bound(i) < seconds {
        i += 1;
    }
    i
}

/// The upper bound of native bucket `i`.
pub(crate) fn upper_bound(i: i32) -> f64 {
    (f64::from(i) / f64::from(1 << SCHEMA)).exp2()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_lands_in_the_bucket_whose_bounds_hold_it() {
        for v in [1e-6, 0.000_123, 0.001, 0.5, 1.0, 2.0, 3.7, 99.0] {
            let i = native_index(v);
            assert!(
                upper_bound(i - 1) < v && v <= upper_bound(i),
                "{v} in ({}, {}]",
                upper_bound(i - 1),
                upper_bound(i)
            );
        }
        // Powers of two are upper bounds: 1 s closes bucket 0, 2 s bucket 8.
        assert_eq!(native_index(1.0), 0);
        assert_eq!(native_index(2.0), 8);
        assert_eq!(native_index(0.5), -8);
    }

    #[test]
    fn spans_cover_the_populated_buckets_and_deltas_rebuild_their_counts() {
        let mut h = Histogram::default();
        // Buckets 0 (1 s) twice, 1 once, 4 three times; and a zero.
        for v in [1.0, 1.0, upper_bound(1), 0.0] {
            h.observe(v);
        }
        for _ in 0..3 {
            h.observe(upper_bound(4));
        }
        assert_eq!((h.count, h.zero), (7, 1));
        let (spans, deltas) = h.spans_and_deltas();
        assert_eq!(spans, [(0, 2), (2, 1)]);
        assert_eq!(deltas, [2, -1, 2]);
        // Rebuilt from spans and deltas.
        let mut rebuilt = BTreeMap::new();
        let (mut index, mut count, mut d) = (0i32, 0i64, deltas.iter());
        for (k, (offset, length)) in spans.iter().enumerate() {
            index += if k == 0 { *offset } else { offset + 1 };
            for j in 0..*length {
                count += d.next().copied().unwrap_or(0);
                rebuilt.insert(index + j as i32, count as u64);
            }
            index += *length as i32 - 1;
        }
        assert_eq!(rebuilt, h.native);
        // Classic: cumulative, +Inf holds every observation.
        let classic = h.cumulative();
        assert_eq!(classic.last(), Some(&(f64::INFINITY, 7)));
        let at_one = classic.iter().find(|(b, _)| *b == 1.0).map(|(_, n)| *n);
        assert_eq!(at_one, Some(3), "0, 1 s and 1 s are at or below 1 s");
    }
}
