//! A hop's `[hop.work]`: none, sleep or CPU work, and the duration
//! distributions (`fixed`, `uniform`, `exp`, `lognormal`) they draw from.

use tailmesh_services::model::{DurationDist, Work};

use crate::scenario::error::Problems;
use crate::scenario::read::Section;

pub(super) const DIST_KEYS: &[&str] = &["dist", "value", "min", "max", "mean", "sigma"];

/// The most rounds of CPU work per request.
const MAX_ROUNDS: i64 = 100_000;

pub(super) fn work(s: &Section<'_>, p: &mut Problems) -> Option<Work> {
    let kind = s.required(p, "kind", |s, p, k| {
        s.choice(p, k, &[("none", 0), ("sleep", 1), ("cpu", 2)])
    });
    match kind {
        Some(0) => {
            s.unknown_keys(p, &["kind"]);
            Some(Work::None)
        }
        Some(1) => {
            let mut known = vec!["kind"];
            known.extend_from_slice(DIST_KEYS);
            s.unknown_keys(p, &known);
            dist(s, p).map(|dist| Work::Sleep { dist })
        }
        Some(2) => {
            s.unknown_keys(p, &["kind", "rounds", "min_rounds", "max_rounds", "block"]);
            cpu(s, p)
        }
        _ => {
            let mut known = vec!["kind", "rounds", "min_rounds", "max_rounds", "block"];
            known.extend_from_slice(DIST_KEYS);
            s.unknown_keys(p, &known);
            None
        }
    }
}

fn cpu(s: &Section<'_>, p: &mut Problems) -> Option<Work> {
    let rounds = match (s.get("rounds"), s.get("min_rounds"), s.get("max_rounds")) {
        (Some(_), None, None) => s.int_in(p, "rounds", 0, MAX_ROUNDS).map(|r| (r, r)),
        (None, Some(_), Some(_)) => {
            let min = s.int_in(p, "min_rounds", 0, MAX_ROUNDS);
            let max = s.int_in(p, "max_rounds", 0, MAX_ROUNDS);
            match (min, max) {
                (Some(min), Some(max)) if min > max => {
                    if let Some(entry) = s.get("min_rounds") {
                        s.report(
                            p,
                            &entry.node.span,
                            format!(
                                "{} ({min}) must not exceed {} ({max})",
                                s.name("min_rounds"),
                                s.name("max_rounds")
                            ),
                        );
                    }
                    None
                }
                (min, max) => min.zip(max),
            }
        }
        (None, None, None) => {
            p.at(
                s.span.start,
                format!(
                    "{} needs either \"rounds\" or both \"min_rounds\" and \"max_rounds\"",
                    s.label
                ),
            );
            None
        }
        (None, Some(_), None) => {
            s.missing(p, "max_rounds");
            None
        }
        (None, None, Some(_)) => {
            s.missing(p, "min_rounds");
            None
        }
        (rounds, min, max) => {
            let at = rounds
                .or(min)
                .or(max)
                .map_or(s.span.start, |e| e.key_span.start);
            p.at(
                at,
                format!(
                    "{} needs either \"rounds\" or both \"min_rounds\" and \"max_rounds\", not a mix",
                    s.label
                ),
            );
            None
        }
    };
    let block = match s.get("block") {
        None => Some(102_400),
        Some(_) => s.int_in(p, "block", 1, 16_777_216),
    };
    let (min, max) = rounds?;
    Some(Work::Cpu {
        min_rounds: u32::try_from(min).ok()?,
        max_rounds: u32::try_from(max).ok()?,
        block_bytes: usize::try_from(block?).ok()?,
    })
}

/// The distribution fields of `s` (sleep work, or a table `slow.extra`).
pub(super) fn dist(s: &Section<'_>, p: &mut Problems) -> Option<DurationDist> {
    let kind = match s.get("dist") {
        None => Some("fixed"),
        Some(_) => s.choice(
            p,
            "dist",
            &[
                ("fixed", "fixed"),
                ("uniform", "uniform"),
                ("exp", "exp"),
                ("lognormal", "lognormal"),
            ],
        ),
    }?;
    let own: &[&str] = match kind {
        "fixed" => &["value"],
        "uniform" => &["min", "max"],
        "exp" => &["mean"],
        _ => &["mean", "sigma"],
    };
    for field in ["value", "min", "max", "mean", "sigma"] {
        if !own.contains(&field) {
            s.forbid(p, field, &format!("is not used by dist = \"{kind}\""));
        }
    }
    let need = |p: &mut Problems, key: &str| {
        s.required(p, key, |s, p, k| s.duration(p, k).map(|(d, _)| d))
    };
    let positive =
        |p: &mut Problems, key: &str| s.required(p, key, |s, p, k| s.positive_duration(p, k));
    match kind {
        "fixed" => need(p, "value").map(|value| DurationDist::Fixed { value }),
        "uniform" => {
            let min = need(p, "min");
            let max = need(p, "max");
            let (min, max) = min.zip(max)?;
            if min > max {
                if let Some(entry) = s.get("min") {
                    s.report(
                        p,
                        &entry.node.span,
                        format!(
                            "{} ({}) must not exceed {} ({})",
                            s.name("min"),
                            humantime::format_duration(min),
                            s.name("max"),
                            humantime::format_duration(max)
                        ),
                    );
                }
                return None;
            }
            Some(DurationDist::Uniform { min, max })
        }
        "exp" => positive(p, "mean").map(|mean| DurationDist::Exp { mean }),
        _ => {
            let mean = positive(p, "mean");
            let sigma = s.required(p, "sigma", |s, p, k| s.number_in(p, k, 0.0, true, 10.0));
            let (mean, sigma) = mean.zip(sigma)?;
            Some(DurationDist::Lognormal { mean, sigma })
        }
    }
}
