//! A hop's `[hop.work]`: none, sleep or CPU work, and the duration
//! distributions (`fixed`, `uniform`, `exp`, `lognormal`, `empirical`)
//! they draw from.

use tailmesh_services::model::{DurationDist, Work};

use crate::scenario::error::Problems;
use crate::scenario::read::{Section, table_section};

pub(super) const DIST_KEYS: &[&str] =
    &["dist", "value", "min", "max", "mean", "sigma", "quantiles"];

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
                ("empirical", "empirical"),
            ],
        ),
    }?;
    let own: &[&str] = match kind {
        "fixed" => &["value"],
        "uniform" => &["min", "max"],
        "exp" => &["mean"],
        "empirical" => &["quantiles"],
        _ => &["mean", "sigma"],
    };
    for field in &DIST_KEYS[1..] {
        if !own.contains(field) {
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
        "empirical" => {
            let quantiles = table_section(s, p, "quantiles");
            match quantiles {
                None => {
                    s.missing(p, "quantiles");
                    None
                }
                Some(quantiles) => empirical(&quantiles?, p),
            }
        }
        _ => {
            let mean = positive(p, "mean");
            let sigma = s.required(p, "sigma", |s, p, k| s.number_in(p, k, 0.0, true, 10.0));
            let (mean, sigma) = mean.zip(sigma)?;
            Some(DurationDist::Lognormal { mean, sigma })
        }
    }
}

/// `quantiles = { p0 = "1ms", p50 = "3ms", "p99.9" = "40ms", p100 = "60ms" }`:
/// percentiles from p0 (the lowest value) to p100 (the highest), in any
/// order, values never falling as the percentile rises.
fn empirical(s: &Section<'_>, p: &mut Problems) -> Option<DurationDist> {
    let table = s.path.trim_end_matches('.');
    let mut points = Vec::new();
    let mut fine = true;
    for entry in &s.table.entries {
        let q = entry
            .key
            .strip_prefix('p')
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
            // "99.9e-2" reads as the decimal 0.999 does, exactly.
            .and_then(|n| format!("{n}e-2").parse::<f64>().ok())
            .filter(|q| (0.0..=1.0).contains(q));
        let Some(q) = q else {
            p.at(
                entry.key_span.start,
                format!(
                    "{}\"{}\" in {} is not a percentile: write p0 (the lowest value) to p100 (the highest), such as p50, p99, \"p99.9\"",
                    s.prefix,
                    entry.key,
                    table
                ),
            );
            fine = false;
            continue;
        };
        match s.duration(p, &entry.key) {
            Some((value, _)) => points.push((q, value, entry)),
            None => fine = false,
        }
    }
    if !fine {
        return None;
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    if let Some(pair) = points.windows(2).find(|w| w[0].0 == w[1].0) {
        s.report(
            p,
            &pair[1].2.key_span,
            format!(
                "{} names the same percentile as {}",
                s.name(&pair[1].2.key),
                s.name(&pair[0].2.key)
            ),
        );
        return None;
    }
    if let Some(pair) = points.windows(2).find(|w| w[1].1 < w[0].1) {
        s.report(
            p,
            &pair[1].2.node.span,
            format!(
                "{} ({}) is below {} ({}): a higher percentile needs a value at least as high",
                s.name(&pair[1].2.key),
                humantime::format_duration(pair[1].1),
                s.name(&pair[0].2.key),
                humantime::format_duration(pair[0].1)
            ),
        );
        return None;
    }
    let ends = points.first().map(|f| f.0) == Some(0.0) && points.last().map(|l| l.0) == Some(1.0);
    if !ends {
        p.at(
            s.span.start,
            format!(
                "{}{table} needs p0 (the lowest value) and p100 (the highest): values beyond the ones given are not made up",
                s.prefix
            ),
        );
        return None;
    }
    let quantiles = points.into_iter().map(|(q, v, _)| (q, v)).collect();
    match DurationDist::empirical(quantiles) {
        Ok(dist) => Some(dist),
        Err(e) => {
            p.at(s.span.start, format!("{}{table}: {e}", s.prefix));
            None
        }
    }
}
