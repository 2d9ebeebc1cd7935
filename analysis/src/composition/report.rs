//! The composition as summary.json holds it (`variants[].composition`):
//! the measured, composed, shuffled and declared quantiles, the segments'
//! summaries, the dependence figure, the check and the spectrum.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::verdict::DistributionCheck;

/// The quantiles summary.json gives: p50, p90, p99, p99.9.
pub const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// The spectrum the report draws: predicted against measured (it holds
/// every one of [`QUANTILES`]).
pub const SPECTRUM: [f64; 12] = [
    0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999,
];

pub(super) fn summary_of(name: &str, h: &Histogram<u64>) -> SegmentSummary {
    let at = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q) as f64);
    SegmentSummary {
        segment: name.to_string(),
        mean_us: (!h.is_empty()).then(|| h.mean()),
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

/// p50, p90, p99 and p99.9 in µs; `null` where unknown (censored).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
}

impl Quantiles {
    pub(super) fn from_fn(mut f: impl FnMut(f64) -> Option<f64>) -> Quantiles {
        Quantiles {
            p50_us: f(QUANTILES[0]),
            p90_us: f(QUANTILES[1]),
            p99_us: f(QUANTILES[2]),
            p999_us: f(QUANTILES[3]),
        }
    }

    pub(super) fn from_slice(v: &[Option<f64>]) -> Quantiles {
        let at = |k: usize| v.get(k).copied().flatten();
        Quantiles {
            p50_us: at(0),
            p90_us: at(1),
            p99_us: at(2),
            p999_us: at(3),
        }
    }

    /// The value at the k-th quantile: p50, p90, p99, p99.9.
    pub fn get(&self, k: usize) -> Option<f64> {
        [self.p50_us, self.p90_us, self.p99_us, self.p999_us]
            .get(k)
            .copied()
            .flatten()
    }
}

/// Quantiles with their 95 % interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantileBand {
    #[serde(flatten)]
    pub point: Quantiles,
    pub low: Quantiles,
    pub high: Quantiles,
}

/// One segment over the run, µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentSummary {
    /// `lateness`, or `<segment>:<hop>` (`reach`, `queue`, `own`, `rest`).
    pub segment: String,
    pub mean_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// Two segments that rise and fall together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Correlation {
    pub a: String,
    pub b: String,
    /// Pearson's r of `ln(1 + µs)` over the sampled requests.
    pub r: f64,
}

/// A segment's mean in the slowest 1 % of requests, measured against
/// shuffled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TailSegment {
    pub segment: String,
    pub measured_us: f64,
    pub shuffled_us: f64,
}

/// What the hops' dependence adds to the tail.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dependence {
    /// Measured minus composed, µs.
    pub excess: Quantiles,
    /// The same over composed (0.25: the measured quantile is 25 % above).
    pub excess_share: Quantiles,
    /// The strongest correlations between segments of different hops.
    pub correlations: Vec<Correlation>,
    /// Segments longer in the measured tail than in the shuffled one.
    pub tail: Vec<TailSegment>,
    /// Where it comes from, when the correlations tell.
    pub source: Option<String>,
}

/// One point of the percentile spectrum, µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpectrumPoint {
    pub q: f64,
    pub measured_us: Option<f64>,
    pub measured_low_us: Option<f64>,
    pub measured_high_us: Option<f64>,
    pub composed_us: Option<f64>,
    pub composed_low_us: Option<f64>,
    pub composed_high_us: Option<f64>,
    pub shuffled_us: Option<f64>,
    pub declared_us: Option<f64>,
}

/// The whole tail, composed and measured (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompositionReport {
    /// Requests measured: ok ones composed, plus the censored.
    pub requests: u64,
    /// Failed and timed-out requests (past every latency).
    pub censored: u64,
    /// Ok requests whose path lacked a hop (left out).
    pub incomplete: u64,
    /// The grid's bin, µs.
    pub bin_us: f64,
    pub measured: QuantileBand,
    /// The measured segments composed as independent.
    pub composed: QuantileBand,
    /// Requests recomposed from segments of different requests.
    pub shuffled: Quantiles,
    /// The scenario's declared distributions with the run's measured
    /// overheads; `null` with `declared_note` saying why.
    pub declared: Option<Quantiles>,
    pub declared_note: Option<String>,
    /// The share of requests the composed policies fail (all attempts
    /// failed), before the measured censored share is set.
    pub predicted_censored: Option<f64>,
    pub segments: Vec<SegmentSummary>,
    pub dependence: Dependence,
    /// With `[check] distribution`.
    pub check: Option<DistributionCheck>,
    pub spectrum: Vec<SpectrumPoint>,
    /// The segments' histograms themselves, for a what-if prediction from
    /// this run (`tailmesh predict --from`); not in summary.json.
    #[serde(skip)]
    pub measured_segments: Option<MeasuredSegments>,
}

/// A run's measured segments, µs: what a what-if prediction composes from.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredSegments {
    pub lateness: Histogram<u64>,
    /// Per hop, in the scenario's order: its name and its segments in
    /// [`HOP_SEGMENTS`](super::HOP_SEGMENTS) order (reach, queue, own,
    /// rest).
    pub hops: Vec<(String, [Histogram<u64>; 4])>,
}
