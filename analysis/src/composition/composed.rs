//! The segments' distributions over the run, on one grid, composed along
//! the call tree as if independent: a chain by convolution, a fan-out by
//! its slowest branch, on paths that vary each call the mixture of the
//! times it was made, a policed call from its attempts by the policy's
//! rule (retries, a hedge); the grid's moves of the means taken back; and
//! the 95 % intervals of replicates.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hdrhistogram::Histogram;
use tailmesh_model::calls::Repeats;
use tailmesh_model::policy::{ClientPolicy, Hedge};

use super::report::{QuantileBand, Quantiles};
use super::segments::{AttemptAcc, Tree};
use crate::compose::{Dist, Grid};

/// The smallest chance of a first attempt still being out that a hedge
/// delay's weight uses (caps the weight at 1000).
pub(super) const MIN_STILL_OUT: f64 = 1e-3;

/// Every segment's distribution, on one grid.
pub(super) struct Segments<'a> {
    pub(super) lateness: Piece,
    pub(super) hops: Vec<HopDists>,
    /// On paths that vary, how often each hop called each other one.
    pub(super) counts: &'a CallCounts,
}

/// On paths that vary: per hop its visits and the requests that entered
/// there, and per (caller, callee) how many of the caller's visits called
/// it how many times (1 or more).
#[derive(Clone, Debug, Default)]
pub(super) struct CallCounts {
    pub(super) visits: Vec<u64>,
    pub(super) entered: Vec<u64>,
    pub(super) called: HashMap<(usize, usize), BTreeMap<u32, u64>>,
}

impl CallCounts {
    pub(super) fn new(hops: usize) -> CallCounts {
        CallCounts {
            visits: vec![0; hops],
            entered: vec![0; hops],
            called: HashMap::new(),
        }
    }

    /// The entries' shares of the requests, as measured; as declared
    /// before any request entered.
    fn entry_shares(&self, declared: &[(usize, f64)]) -> Vec<(usize, f64)> {
        let n: u64 = declared.iter().map(|(e, _)| self.entered[*e]).sum();
        if n == 0 {
            return declared.to_vec();
        }
        declared
            .iter()
            .map(|&(e, _)| (e, self.entered[e] as f64 / n as f64))
            .collect()
    }

    /// How many times a visit of `caller` called `callee`, with the share
    /// of visits (0 included); `None` before any visit of `caller`.
    fn weights(&self, caller: usize, callee: usize) -> Option<Vec<(u32, f64)>> {
        let n = *self.visits.get(caller)?;
        if n == 0 {
            return None;
        }
        let counts = self.called.get(&(caller, callee));
        let calling: u64 = counts.map_or(0, |c| c.values().sum());
        let mut out = vec![(0, n.saturating_sub(calling) as f64 / n as f64)];
        out.extend(
            counts
                .into_iter()
                .flatten()
                .map(|(k, v)| (*k, *v as f64 / n as f64)),
        );
        Some(out)
    }
}

/// A segment's distribution on the grid, and how far the grid moved its
/// mean (µs): a segment shorter than a bin (a queue wait of 0, a few µs of
/// rest) lands in the first bin, which stands for anything in it, half a
/// bin on average. Summed along the tree, the moves are taken back from
/// the composition ([`settle`]).
pub(super) struct Piece {
    pub(super) dist: Dist,
    pub(super) moved_us: f64,
}

impl Piece {
    /// From a histogram of µs (each value truncated from ns, so half a µs
    /// short on average).
    pub(super) fn of(h: &Histogram<u64>, grid: Grid) -> Piece {
        let dist = Dist::from_histogram(h, 0, grid).unwrap_or_else(|_| Dist::zero(grid));
        let true_mean = if h.is_empty() { 0.0 } else { h.mean() + 0.5 };
        let moved_us = dist
            .mean()
            .map_or(0.0, |m| m.as_secs_f64() * 1e6 - true_mean);
        Piece { dist, moved_us }
    }
}

/// `d` with the grid's move of its mean taken back.
pub(super) fn settle(d: Dist, moved_us: f64) -> Dist {
    let by = Duration::from_secs_f64((moved_us.abs() / 1e6).min(3600.0));
    if moved_us > 0.0 {
        d.shift_back(by)
    } else {
        d.shift(by)
    }
}

pub(super) struct HopDists {
    pub(super) segments: [Piece; 4],
    /// A policed call's attempts, composed by its policy.
    pub(super) attempts: Option<Dist>,
}

/// A policed call's distribution from its attempts: the answering time
/// by Kaplan-Meier (cancelled and failed attempts censored), failures by
/// their own times and share, then the policy's rule: retries after
/// failures, or a hedge: `min(X1, D + X2)` with `D` the delays the
/// second copies were measured to go after. `None` without an answered
/// attempt.
pub(super) fn attempt_dists(acc: &AttemptAcc, policy: &ClientPolicy, grid: Grid) -> Option<Dist> {
    let mut cut = acc.cancelled.clone();
    let _ = cut.add(&acc.failed);
    let ok = Dist::kaplan_meier(&acc.ok, &cut, grid).ok()?;
    let (oks, fails) = (acc.ok.len(), acc.failed.len());
    let p_fail = if oks + fails > 0 {
        fails as f64 / (oks + fails) as f64
    } else {
        0.0
    };
    let failed = Dist::from_histogram(&acc.failed, 0, grid).ok();
    // When the second copies went, as measured (a timer fires late on a
    // busy machine; a percentile hedge's delay moves with its answers);
    // the policy's own delay when none went. A copy goes only when the
    // first attempt is still out at its delay, so long delays are seen
    // less often than they happen: each is weighted by 1 / P(first
    // attempt still out), capped.
    let hedge_after = match policy.hedge {
        Some(_) if !acc.second_at.is_empty() => Dist::from_histogram(&acc.second_at, 0, grid)
            .ok()
            .map(|seen| seen.reweighted(|t| 1.0 / (1.0 - ok.cdf(t)).max(MIN_STILL_OUT))),
        Some(Hedge::After(d)) => Some(Dist::point(grid, d)),
        Some(Hedge::Percentile(_)) | None => None,
    };
    let attempt = match &failed {
        Some(f) if p_fail > 0.0 && hedge_after.is_none() => {
            Dist::retry(&ok, f, p_fail, policy.retries)
        }
        _ if p_fail > 0.0 => {
            Dist::mix(&[(1.0 - p_fail, ok.clone()), (p_fail, ok.with_beyond(1.0))])
        }
        _ => ok,
    };
    Some(match hedge_after {
        Some(delay) => Dist::min_of(&[attempt.clone(), delay.then(&attempt)]),
        None => attempt,
    })
}

/// A hop's time without its calls (reach, queue, own and rest in turn),
/// and the grid's move of its mean.
fn own_part(hop: &HopDists) -> (Dist, f64) {
    let [reach, queue, own, rest] = &hop.segments;
    let time = reach
        .dist
        .then(&queue.dist)
        .then(&own.dist)
        .then(&rest.dist);
    let moved = reach.moved_us + queue.moved_us + own.moved_us + rest.moved_us;
    (time, moved)
}

/// The end-to-end distribution by the tree's rules, the grid's moves of
/// the segments' means taken back (summed along a chain, the largest of a
/// fan-out's branches); `None` when a policed call had no answered
/// attempt.
pub(super) fn compose(tree: &Tree, s: &Segments<'_>) -> Option<Dist> {
    if tree.hops() == 0 {
        return Some(settle(s.lateness.dist.clone(), s.lateness.moved_us));
    }
    // The entry hops, a mixture by their shares of the requests.
    let mut entries = Vec::with_capacity(tree.entries.len());
    let mut moved = 0.0;
    for (e, share) in s.counts.entry_shares(&tree.entries) {
        if share <= 0.0 {
            continue;
        }
        let (d, m) = call(tree, e, s)?;
        moved += share * m;
        entries.push((share, d));
    }
    let first = match entries.len() {
        0 => return None,
        1 => entries.pop().map(|(_, d)| d)?,
        _ => Dist::mix(&entries),
    };
    Some(settle(
        s.lateness.dist.then(&first),
        s.lateness.moved_us + moved,
    ))
}

/// A call of hop `i`: its segments, then its stages one after another,
/// each stage's calls at once, each call the mixture of the times it was
/// made per visit (its repeats one after another or together, as the
/// scenario says): as measured on paths that vary, as the scenario says
/// otherwise (every call once: a fan-out is its slowest branch) and for a
/// hop called in more than one stage by one caller, the measured counts
/// not telling its stages apart.
fn call(tree: &Tree, i: usize, s: &Segments<'_>) -> Option<(Dist, f64)> {
    let hop = &s.hops[i];
    if tree.policed(i) {
        return hop.attempts.clone().map(|d| (d, 0.0));
    }
    let grid = s.lateness.dist.grid();
    let (mut time, mut moved) = own_part(hop);
    let plan = &tree.calls[i];
    for stage in &plan.stages {
        let mut calls: Vec<(Dist, f64)> = Vec::with_capacity(stage.len());
        for c in stage {
            let Some(&j) = tree.index.get(c.hop.as_str()) else {
                continue;
            };
            let (visit, visit_moved) = call(tree, j, s)?;
            let once = plan.iter().filter(|other| other.hop == c.hop).count() == 1;
            let weights = once
                .then(|| s.counts.weights(i, j))
                .flatten()
                .unwrap_or_else(|| c.visits());
            let mut parts = Vec::with_capacity(weights.len());
            let mut mean_moved = 0.0;
            for (n, w) in weights.into_iter().filter(|(_, w)| *w > 0.0) {
                let d = match (n, c.repeats) {
                    (0, _) => Dist::zero(grid),
                    (_, Repeats::Parallel) => {
                        mean_moved += w * visit_moved;
                        Dist::max_of(&vec![visit.clone(); n as usize])
                    }
                    (_, Repeats::Sequential) => {
                        mean_moved += w * f64::from(n) * visit_moved;
                        (1..n).fold(visit.clone(), |acc, _| acc.then(&visit))
                    }
                };
                parts.push((w, d));
            }
            let mixed = match parts.len() {
                0 => continue,
                // Every request made it the same number of times.
                1 => parts.pop().map(|(_, d)| d)?,
                _ => Dist::mix(&parts),
            };
            calls.push((mixed, mean_moved));
        }
        if calls.is_empty() {
            continue;
        }
        let dists: Vec<Dist> = calls.iter().map(|(d, _)| d.clone()).collect();
        time = time.then(&Dist::max_of(&dists));
        moved += calls.iter().map(|(_, m)| *m).fold(f64::MIN, f64::max);
    }
    Some((time, moved))
}

/// 95 % intervals (µs), one per quantile; `None` past the grid.
pub(super) type Intervals = Vec<(Option<f64>, Option<f64>)>;

/// The quantile `q` of `d` in µs, `None` beyond.
pub(super) fn us_at(d: &Dist, q: f64) -> Option<f64> {
    d.quantile(q).map(|t| t.as_secs_f64() * 1e6)
}

/// The 2.5th and 97.5th percentiles of replicates (a missing value, past
/// the grid, sorts last).
pub(super) fn interval(mut draws: Vec<Option<f64>>) -> (Option<f64>, Option<f64>) {
    if draws.is_empty() {
        return (None, None);
    }
    draws.sort_by(|a, b| match (a, b) {
        (Some(x), Some(y)) => x.total_cmp(y),
        (None, None) => std::cmp::Ordering::Equal,
        (None, _) => std::cmp::Ordering::Greater,
        (_, None) => std::cmp::Ordering::Less,
    });
    let at = |p: f64| draws[((p * draws.len() as f64).ceil() as usize).clamp(1, draws.len()) - 1];
    (at(0.025), at(0.975))
}

pub(super) fn band_of(d: &Dist, qs: &[f64], bands: &[(Option<f64>, Option<f64>)]) -> QuantileBand {
    QuantileBand {
        point: Quantiles::from_slice(&qs.iter().map(|q| us_at(d, *q)).collect::<Vec<_>>()),
        low: Quantiles::from_slice(&bands.iter().map(|b| b.0).collect::<Vec<_>>()),
        high: Quantiles::from_slice(&bands.iter().map(|b| b.1).collect::<Vec<_>>()),
    }
}
