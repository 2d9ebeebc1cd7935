//! `[check]`: the slow threshold, the compounding and distribution checks
//! and the error budget the verdict holds a run to.

use crate::scenario::error::Problems;
use crate::scenario::model::{Check, DEFAULT_DISTRIBUTION_TOLERANCE, DEFAULT_MAX_ERROR_RATE};
use crate::scenario::read::Section;

use super::DEFAULT_SLOW_THRESHOLD;

const CHECK_KEYS: &[&str] = &[
    "slow_threshold",
    "compounding",
    "max_error_rate",
    "distribution",
    "distribution_tolerance",
];

pub(super) fn check(s: &Section<'_>, p: &mut Problems) -> Option<Check> {
    s.unknown_keys(p, CHECK_KEYS);
    let threshold = s
        .get("slow_threshold")
        .map(|_| s.positive_duration(p, "slow_threshold"));
    let compounding = match s.get("compounding") {
        None => Some(false),
        Some(_) => s.boolean(p, "compounding"),
    };
    if compounding == Some(true) && threshold.is_none() {
        s.forbid(
            p,
            "compounding",
            "= true needs check.slow_threshold: a slow request must be defined to count them",
        );
    }
    let max_error_rate = match s.get("max_error_rate") {
        None => Some(DEFAULT_MAX_ERROR_RATE),
        Some(_) => s.probability(p, "max_error_rate"),
    };
    let distribution = match s.get("distribution") {
        None => Some(false),
        Some(_) => s.boolean(p, "distribution"),
    };
    let distribution_tolerance = match s.get("distribution_tolerance") {
        None => Some(DEFAULT_DISTRIBUTION_TOLERANCE),
        Some(_) => s.number_in(p, "distribution_tolerance", 0.0, true, 1.0),
    };
    Some(Check {
        slow_threshold: threshold.unwrap_or(Some(DEFAULT_SLOW_THRESHOLD))?,
        compounding: compounding?,
        max_error_rate: max_error_rate?,
        distribution: distribution?,
        distribution_tolerance: distribution_tolerance?,
    })
}
