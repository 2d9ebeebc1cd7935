//! Tail compounding: does the end-to-end slow fraction match
//! `1 - prod(1 - p_i)`, the chance that at least one hop was slow?
//!
//! Which requests count, precisely:
//!
//! - **Trials** `n` = ok requests + timeouts whose latency (from the intended
//!   send time) exceeds the threshold. A timeout that exceeded the threshold
//!   is certainly slow. A timeout at or below it (a deadline shorter than the
//!   threshold) is censored: it might have finished fast or slow, so it is
//!   left out and reported as `timeouts_censored`.
//! - **Slow** = ok requests with latency > threshold, plus the counted
//!   timeouts.
//! - **Errors** (any other outcome) are left out and reported as
//!   `errors_excluded`: a failed request has no latency to judge.
//! - **Per-hop p_i** = (path records of the hop with `slow == true`) /
//!   (path records of the hop), over the paths of ok requests (only those
//!   carry a path). If injected slowness pushes requests into timeouts, p_i
//!   is biased low; the censoring counts make that visible.
//!
//! The model assumes that a slowed hop pushes its request over the
//! threshold and that nothing else does; in a fan-out tree a request is
//! slow when any hop on it is slow, so the same formula applies.
//!
//! When paths vary (calls made with a probability, more than once, in
//! stages), a request visits each hop `v_i` times, 0 included: the model
//! is then per path, `1 - prod(1 - p_i)^v_i`, weighted by how often the ok
//! requests took each path ([`compound_over`]). A timeout has no path; it
//! is taken to have taken the ok requests' mix.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::stats::wilson95;
use crate::record::{Outcome, RequestRecord};

/// Requests below this many trials give no verdict: the interval is too wide
/// to say anything.
pub const MIN_TRIALS: u64 = 30;

/// `1 - prod(1 - p_i)`: the chance that at least one of independent events
/// with probabilities `p` happens. Probabilities are clamped to [0, 1].
///
/// It is the model for chains and fan-outs alike: in a chain the delays add
/// up, in a fan-out the caller waits for the slowest of k children (max of
/// k), and either way one slow hop makes the request slow when the injected
/// delay exceeds the threshold. For k hops each slow with p it is
/// `1 - (1-p)^k`.
pub fn compound(p: &[f64]) -> f64 {
    1.0 - p.iter().map(|p| 1.0 - p.clamp(0.0, 1.0)).product::<f64>()
}

/// [`compound`] per path, weighted: `paths` holds each path's visits per
/// hop (in the order of `p`) and how many requests took it; no path is
/// every hop once.
pub fn compound_over(p: &[f64], paths: &[(Vec<u32>, u64)]) -> f64 {
    let total: u64 = paths.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return compound(p);
    }
    let sum: f64 = paths
        .iter()
        .map(|(visits, n)| {
            let fast: f64 = p
                .iter()
                .zip(visits)
                .map(|(p, v)| (1.0 - p.clamp(0.0, 1.0)).powi(i32::try_from(*v).unwrap_or(i32::MAX)))
                .product();
            (1.0 - fast) * *n as f64
        })
        .sum();
    sum / total as f64
}

/// One hop's measured and declared slow probability.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HopSlowness {
    /// Hop name.
    pub hop: String,
    /// Path records of the hop (ok requests).
    pub requests: u64,
    /// Of those, with injected slowness.
    pub slow: u64,
    /// `slow / requests`, 0 when the hop was never seen.
    pub p: f64,
    /// The scenario's `slow.probability` for the hop (0 without `slow`).
    pub declared_p: f64,
}

/// The counts the check is computed from (see the module docs for which
/// requests count).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowCounts {
    /// Trials: ok requests plus counted timeouts.
    pub n: u64,
    /// Slow trials.
    pub slow: u64,
    /// Timeouts at or below the threshold, left out.
    pub timeouts_censored: u64,
    /// Errors, left out.
    pub errors_excluded: u64,
}

impl SlowCounts {
    /// Counts one completed request, slow when its latency exceeds
    /// `threshold`: ok requests are trials, timeouts are trials when slow
    /// (else censored), errors are left out.
    pub fn count(&mut self, r: &RequestRecord, threshold: Duration) {
        let slow = r.latency() > threshold;
        match &r.outcome {
            Outcome::Ok => {
                self.n += 1;
                self.slow += u64::from(slow);
            }
            Outcome::Timeout if slow => {
                self.n += 1;
                self.slow += 1;
            }
            Outcome::Timeout => self.timeouts_censored += 1,
            Outcome::Error { .. } => self.errors_excluded += 1,
        }
    }
}

/// The measured slow fraction against the model, before any verdict
/// (`super::verdict` decides it).
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The threshold, µs: a request is slow if its latency exceeds it.
    pub slow_threshold_us: u64,
    /// The counts it was computed from.
    pub counts: SlowCounts,
    /// Measured slow fraction `slow / n` (0 when `n == 0`).
    pub measured: f64,
    /// The measured fraction's 95 % Wilson interval.
    pub ci: (f64, f64),
    /// `1 - prod(1 - p_i)` with p_i measured from the paths.
    pub model: f64,
    /// `1 - prod(1 - p_i)` with p_i as declared in the scenario.
    pub declared_model: f64,
    /// `(model - measured)` over the distance from `measured` to the
    /// interval's end on the model's side: |deviation| <= 1 means inside;
    /// `None` when that distance is 0 and the model differs.
    pub deviation: Option<f64>,
    /// The per-hop probabilities behind the model, in scenario order.
    pub hops: Vec<HopSlowness>,
}

/// Whether the comparison says anything, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// The model lies inside the interval.
    Inside,
    /// The model lies outside it.
    Outside,
    /// Nothing can be said, and why: too few trials, or nothing injected
    /// and nothing slow (agreement would be vacuous).
    Undecided(String),
}

impl Comparison {
    /// Whether the model agrees with the measured fraction.
    pub fn agreement(&self) -> Agreement {
        let injected: u64 = self.hops.iter().map(|h| h.slow).sum();
        if self.counts.n < MIN_TRIALS {
            Agreement::Undecided(format!(
                "{} trials, fewer than the {MIN_TRIALS} needed",
                self.counts.n
            ))
        } else if injected == 0 && self.counts.slow == 0 {
            Agreement::Undecided("no hop injected slowness and no request was slow".to_string())
        } else if self.deviation.is_some_and(|d| d.abs() <= 1.0) {
            Agreement::Inside
        } else {
            Agreement::Outside
        }
    }
}

/// Compares measured counts with the model of the per-hop probabilities.
pub fn compare(counts: SlowCounts, hops: Vec<HopSlowness>, slow_threshold_us: u64) -> Comparison {
    compare_over(counts, hops, slow_threshold_us, &[])
}

/// [`compare`] on paths that vary: the model per path, weighted by
/// `paths` (see [`compound_over`]).
pub fn compare_over(
    counts: SlowCounts,
    hops: Vec<HopSlowness>,
    slow_threshold_us: u64,
    paths: &[(Vec<u32>, u64)],
) -> Comparison {
    let measured_p: Vec<f64> = hops.iter().map(|h| h.p).collect();
    let declared_p: Vec<f64> = hops.iter().map(|h| h.declared_p).collect();
    let model = compound_over(&measured_p, paths);
    let measured = if counts.n == 0 {
        0.0
    } else {
        counts.slow as f64 / counts.n as f64
    };
    let ci = wilson95(counts.slow, counts.n);
    Comparison {
        slow_threshold_us,
        counts,
        measured,
        ci,
        model,
        declared_model: compound_over(&declared_p, paths),
        deviation: deviation(measured, ci.0, ci.1, model),
        hops,
    }
}

/// Signed distance of `model` from `measured` in units of the half-interval
/// on the model's side.
fn deviation(measured: f64, lo: f64, hi: f64, model: f64) -> Option<f64> {
    let diff = model - measured;
    let half = if diff >= 0.0 {
        hi - measured
    } else {
        measured - lo
    };
    if half > 0.0 {
        Some(diff / half)
    } else if diff == 0.0 {
        Some(0.0)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fan_out_is_max_of_k() {
        // Four leaves each slow with p = 0.05: 1 - 0.95^4.
        assert!((compound(&[0.05; 4]) - 0.185_493_75).abs() < 1e-12);
        // The Tail at Scale: 100 servers each slow 1 % of the time make a
        // request slow 63 % of the time.
        assert!((compound(&[0.01; 100]) - 0.633_967_658_726_771).abs() < 1e-12);
        // A root that is never slow adds nothing to its children's model.
        assert_eq!(
            compound(&[0.0, 0.05, 0.05, 0.05, 0.05]),
            compound(&[0.05; 4])
        );
    }

    use super::*;

    #[test]
    fn varying_paths_compound_per_path_weighted_by_how_often_each_was_taken() {
        // a always, b on half the requests, twice: 0.1 alone, else
        // 1 - 0.9 * 0.8^2.
        let paths = [(vec![1, 0], 50), (vec![1, 2], 50)];
        let want = 0.5 * 0.1 + 0.5 * (1.0 - 0.9 * 0.64);
        assert!((compound_over(&[0.1, 0.2], &paths) - want).abs() < 1e-12);
        assert_eq!(compound_over(&[0.1, 0.2], &[]), compound(&[0.1, 0.2]));
    }

    #[test]
    fn three_hops_at_ten_percent_compound_to_0_271() {
        assert!((compound(&[0.1, 0.1, 0.1]) - 0.271).abs() < 1e-12);
        assert!((compound(&[0.5, 0.2]) - 0.6).abs() < 1e-12);
        assert_eq!(compound(&[]), 0.0);
        assert_eq!(compound(&[0.0, 1.0]), 1.0);
    }
}
