//! Where the measured tail departs from independence: the correlations of
//! the reservoir's segments between hops, the segments longer in the
//! measured tail than in the shuffled one, and the dependence figure
//! (measured minus composed at each quantile) with its likeliest source
//! in words.

use super::report::{Correlation, Dependence, QUANTILES, QuantileBand, Quantiles, TailSegment};
use super::segments::{PER_HOP, Tree, column_names, recompose, used_columns};
use super::shuffle::Shuffled;

/// Correlations smaller than this are not reported.
pub(super) const MIN_CORRELATION: f64 = 0.1;

/// Pearson correlations of the reservoir's segments (of `ln(1 + µs)`:
/// heavy tails would let a few requests decide), between segments of
/// different hops (and the lateness), largest first, `MIN_CORRELATION`
/// and above.
pub(super) fn correlations(tree: &Tree, rows: &[Vec<u64>], names: &[String]) -> Vec<Correlation> {
    if rows.len() < 3 {
        return Vec::new();
    }
    let cols = used_columns(tree);
    let hop_of = |c: usize| {
        if c == 0 {
            usize::MAX
        } else {
            (c - 1) / PER_HOP
        }
    };
    let series: Vec<Vec<f64>> = cols
        .iter()
        .map(|&c| {
            rows.iter()
                .map(|r| ((r[c] as f64) / 1_000.0).ln_1p())
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    for a in 0..cols.len() {
        for b in a + 1..cols.len() {
            if hop_of(cols[a]) == hop_of(cols[b]) {
                continue;
            }
            if let Some(r) = pearson(&series[a], &series[b])
                && r.abs() >= MIN_CORRELATION
            {
                out.push(Correlation {
                    a: names[cols[a]].clone(),
                    b: names[cols[b]].clone(),
                    r,
                });
            }
        }
    }
    out.sort_by(|x, y| y.r.abs().total_cmp(&x.r.abs()));
    out
}

pub(super) fn pearson(x: &[f64], y: &[f64]) -> Option<f64> {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    // A constant column (its variance rounding noise) correlates with nothing.
    let varies = |ss: f64| ss / n > 1e-9;
    (varies(sxx) && varies(syy)).then(|| sxy / (sxx * syy).sqrt())
}

/// The segments longer in the measured tail (the slowest 1 % of the
/// reservoir's requests) than in the shuffled tail, by their mean, µs,
/// largest first: where the measured tail differs from independence.
pub(super) fn tail_excess(
    tree: &Tree,
    rows: &[Vec<u64>],
    shuffled: &Shuffled,
    names: &[String],
) -> Vec<TailSegment> {
    let Some(width) = rows.first().map(Vec::len) else {
        return Vec::new();
    };
    let mut lat: Vec<(u64, usize)> = rows
        .iter()
        .enumerate()
        .map(|(k, r)| (recompose(tree, r), k))
        .collect();
    lat.sort_unstable();
    let tail = &lat[lat.len() - (lat.len() / 100).max(1)..];
    let real: Vec<f64> = (0..width)
        .map(|c| {
            tail.iter().map(|(_, k)| rows[*k][c] as f64).sum::<f64>() / tail.len() as f64 / 1_000.0
        })
        .collect();
    let mut out: Vec<TailSegment> = used_columns(tree)
        .into_iter()
        .filter_map(|c| {
            Some(TailSegment {
                segment: names.get(c)?.clone(),
                measured_us: real[c],
                shuffled_us: *shuffled.tail_mean.get(c)?,
            })
        })
        .filter(|t| t.measured_us > t.shuffled_us)
        .collect();
    out.sort_by(|a, b| (b.measured_us - b.shuffled_us).total_cmp(&(a.measured_us - a.shuffled_us)));
    out.truncate(4);
    out
}

/// The correlations reported: at most this many, the one explained
/// included.
pub(super) const REPORTED_CORRELATIONS: usize = 6;

/// Where the dependence comes from, in words, when the correlations say,
/// and the pair that says it. The causes the scenario declares come
/// first: two hops' own times correlated where one's slowness follows the
/// other's (`slow.follow`); then queueing (a queue wait correlated with
/// another hop's segment: requests waiting behind the same slow one);
/// then own times rising together (shared CPU or a shared cause); else
/// the strongest correlation.
pub(super) fn explain(
    correlations: &[Correlation],
    tail: &[TailSegment],
    follows: &[bool],
    hops: &[String],
) -> Option<(String, Correlation)> {
    let kind = |s: &str| s.split(':').next().unwrap_or("").to_string();
    let follower = |s: &str| {
        let hop = s.split(':').nth(1).unwrap_or("");
        hops.iter()
            .position(|h| h == hop)
            .is_some_and(|i| follows.get(i).copied().unwrap_or(false))
    };
    let positive = || correlations.iter().filter(|c| c.r > 0.0);
    let own_pair = |c: &&Correlation| kind(&c.a) == "own" && kind(&c.b) == "own";
    let (what, pair) = if let Some(c) =
        positive().find(|c| own_pair(c) && (follower(&c.a) || follower(&c.b)))
    {
        (
            "injected slowness follows the request from hop to hop (slow.follow)",
            c,
        )
    } else if let Some(c) = positive().find(|c| kind(&c.a) == "queue" || kind(&c.b) == "queue") {
        ("queueing behind the same slow requests", c)
    } else if let Some(c) = positive().find(own_pair) {
        (
            "the hops' own times rise together: shared CPU or a shared cause",
            c,
        )
    } else {
        (
            "the hops' times rise together (shared CPU, network or scheduling)",
            positive().next()?,
        )
    };
    let tail = tail
        .first()
        .map(|t| {
            format!(
                "; in the tail, {} averages {} against {} if independent",
                t.segment,
                tailmesh_units::micros(t.measured_us),
                tailmesh_units::micros(t.shuffled_us)
            )
        })
        .unwrap_or_default();
    Some((
        format!(
            "{what}: {} and {} correlate (r = {:.2}){tail}",
            pair.a, pair.b, pair.r
        ),
        pair.clone(),
    ))
}

/// The dependence figure and where it comes from, from the reservoir's
/// `rows` and `follows` (per hop: whether its slowness follows its
/// caller's).
pub(super) fn dependence(
    tree: &Tree,
    rows: &[Vec<u64>],
    follows: &[bool],
    measured: &QuantileBand,
    composed: &QuantileBand,
    shuffled: Option<&Shuffled>,
) -> Dependence {
    let excess = Quantiles::from_fn(|q| {
        let k = QUANTILES.iter().position(|x| *x == q)?;
        Some(measured.point.get(k)? - composed.point.get(k)?)
    });
    let excess_share = Quantiles::from_fn(|q| {
        let k = QUANTILES.iter().position(|x| *x == q)?;
        let (m, c) = (measured.point.get(k)?, composed.point.get(k)?);
        (c > 0.0).then(|| (m - c) / c)
    });
    let names = column_names(tree);
    let mut correlations = correlations(tree, rows, &names);
    let tail = shuffled
        .map(|s| tail_excess(tree, rows, s, &names))
        .unwrap_or_default();
    let explained = explain(&correlations, &tail, follows, &tree.names);
    correlations.truncate(REPORTED_CORRELATIONS);
    let source = explained.map(|(source, pair)| {
        if !correlations.contains(&pair) {
            correlations.pop();
            correlations.push(pair);
        }
        source
    });
    Dependence {
        excess,
        excess_share,
        correlations,
        tail,
        source,
    }
}
