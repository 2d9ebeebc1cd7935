//! `[check] distribution`: each quantile the run can judge, measured
//! against composed, passes within the intervals or the tolerance; a miss
//! on a busy machine is inconclusive.

use super::report::{Dependence, QUANTILES, QuantileBand};
use crate::compose::Grid;
use crate::verdict::{DistributionCheck, MachineState, Verdict};

/// A quantile is judged only when the grid's bin is at most this share of
/// it: coarser, the composition cannot place it.
pub(super) const FINEST_SHARE: f64 = 0.02;

/// Ok requests below which a distribution check is inconclusive.
pub(super) const MIN_REQUESTS: u64 = 200;

/// Values the measurement must have above a quantile for the check to
/// judge it (p99.9 wants 10 000 requests).
pub(super) const ABOVE_FOR_CHECK: f64 = 10.0;

/// The distribution check: each quantile the measurement can judge,
/// measured against composed, within the intervals or the tolerance.
pub(super) fn judge(
    measured: &QuantileBand,
    composed: &QuantileBand,
    dependence: &Dependence,
    ok: u64,
    grid: Grid,
    tolerance: f64,
    machine: &MachineState,
) -> DistributionCheck {
    let bin_us = grid.bin().as_secs_f64() * 1e6;
    if ok < MIN_REQUESTS {
        return DistributionCheck {
            verdict: Verdict::Inconclusive,
            reason: format!(
                "{ok} ok requests, fewer than {MIN_REQUESTS}: too few to judge the distribution"
            ),
        };
    }
    let mut misses = Vec::new();
    let mut judged = Vec::new();
    for (k, q) in QUANTILES.iter().enumerate() {
        if (1.0 - q) * (ok as f64) < ABOVE_FOR_CHECK {
            continue;
        }
        let (Some(m), Some(c)) = (measured.point.get(k), composed.point.get(k)) else {
            continue;
        };
        if bin_us > FINEST_SHARE * m {
            continue;
        }
        judged.push(label(*q));
        let overlap = match (
            measured.low.get(k),
            measured.high.get(k),
            composed.low.get(k),
            composed.high.get(k),
        ) {
            (Some(ml), Some(mh), Some(cl), Some(ch)) => ml <= ch && cl <= mh,
            _ => false,
        };
        if !(overlap || (c - m).abs() <= tolerance * m) {
            misses.push(format!(
                "{}: measured {} against composed {} ({:+.0} %)",
                label(*q),
                tailmesh_units::micros(m),
                tailmesh_units::micros(c),
                (m - c) / c * 100.0
            ));
        }
    }
    if judged.is_empty() {
        return DistributionCheck {
            verdict: Verdict::Inconclusive,
            reason: format!(
                "no quantile to judge: the censored requests reach every one, or the grid's {bin_us:.0} µs bins are too coarse for them"
            ),
        };
    }
    if misses.is_empty() {
        return DistributionCheck {
            verdict: Verdict::Pass,
            reason: format!(
                "{} within {:.0} % or the intervals",
                judged.join(", "),
                tolerance * 100.0
            ),
        };
    }
    let why = dependence.source.clone().or_else(|| {
        dependence.tail.first().map(|t| {
            format!(
                "{} is longer in the measured tail ({}) than if independent ({})",
                t.segment,
                tailmesh_units::micros(t.measured_us),
                tailmesh_units::micros(t.shuffled_us)
            )
        })
    });
    let reason = format!(
        "{}{}",
        misses.join("; "),
        why.map(|w| format!(" — {w}")).unwrap_or_default()
    );
    if machine.busy {
        return DistributionCheck {
            verdict: Verdict::Inconclusive,
            reason: format!(
                "the machine was busy ({}): {reason}",
                machine.reasons.join(", ")
            ),
        };
    }
    DistributionCheck {
        verdict: Verdict::Fail,
        reason,
    }
}

pub(super) fn label(q: f64) -> String {
    match q {
        0.5 => "p50".into(),
        0.9 => "p90".into(),
        0.99 => "p99".into(),
        0.999 => "p99.9".into(),
        _ => format!("p{}", q * 100.0),
    }
}
