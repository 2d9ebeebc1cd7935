//! Benchmarks measured in rounds: a ratio's median over the rounds with a
//! bootstrap 95 % interval, the goal judged on the interval's bound, and
//! what the machine did meanwhile (CPU steal, load average).
//!
//! These virtual machines move 20-60 % from one run to the next, so a
//! single reading settles no goal. The bench scripts interleave their
//! variants (A B C A B C ...), write one value per ratio and round, and
//! mark the machine's counters between rounds; the `intervals` binary
//! reads both and prints the table.
//!
//! - [`median_interval`]: the median of the rounds and its interval.
//! - [`Goal`], [`Verdict`]: met when the whole interval is on the right
//!   side of the goal, not met when the whole of it is on the wrong side,
//!   undecided otherwise.
//! - [`Drift`]: whether the rounds' first half and second half differ
//!   by more than chance orders them (a permutation test): the interval
//!   holds the rounds' own spread, which is one run's, and a run whose
//!   level moved while it ran says so instead of a verdict it cannot
//!   back.
//! - [`MachineReading`]: CPU steal and load average from snapshots of
//!   `/proc/stat` and `/proc/loadavg`.

use std::{fmt, str::FromStr};

use hdrhistogram::Histogram;
use rand::{SeedableRng, seq::SliceRandom};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Replicates of the bootstrap: enough that the interval's bounds, order
/// statistics of a few rounds, do not move with the seed.
pub const REPLICATES: usize = 2000;

/// Fewer rounds than this give no verdict: the percentile bootstrap of a
/// median covers the true median far less than 95 % of the time with very
/// few values (75 % with 3), while its interval still looks narrow. From 5
/// to 30 rounds it covers 88 to 96 % (93.5 % at 10).
pub const MIN_ROUNDS: usize = 5;

/// A median over rounds and its bootstrap 95 % interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Interval {
    /// The rounds' median (the mean of the two middle values for an even
    /// count).
    pub median: f64,
    pub low: f64,
    pub high: f64,
}

/// How finely values are placed on the bootstrap's integer grid: the
/// spread of the rounds in this many steps. Below the histogram's
/// sub-bucket count (32768 at 4 significant digits) every value is kept
/// exactly, so the only rounding is this grid's, 1/30000 of the spread.
const STEPS: f64 = 30_000.0;

/// Bootstrap 95 % interval of the median of `values`, through the
/// analysis' bootstrap (`bootstrap_quantiles`), the one place that names
/// it.
///
/// That bootstrap resamples an HdrHistogram of positive integers; a
/// ratio is a float and may be negative (a difference of two p50s over
/// another), so the values are shifted and scaled onto an integer grid
/// and back. Its median is the ceil(n/2)-th smallest value of each
/// replicate, as the run's own quantiles are read.
fn bootstrap_median(values: &[f64], replicates: usize, seed: u64) -> Option<(f64, f64)> {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == min {
        return Some((min, max));
    }
    let scale = STEPS / (max - min);
    // Grid values are 1 ..= STEPS + 1: exact in a histogram up to 2^15.
    let mut h = Histogram::<u64>::new_with_bounds(1, 1 << 15, 4).ok()?;
    for v in values {
        h.record(1 + ((v - min) * scale).round() as u64).ok()?;
    }
    let back = |u: u64| min + (u - 1) as f64 / scale;
    match tailmesh::analysis::bootstrap_quantiles(&h, 0, &[0.5], replicates, seed)[..] {
        [(Some(lo), Some(hi))] => Some((back(lo), back(hi))),
        _ => None,
    }
}

/// The median of `values` (rounds) and its bootstrap 95 % interval, the
/// same for the same `seed`; `None` when there is no value or one is not
/// finite.
pub fn median_interval(values: &[f64], replicates: usize, seed: u64) -> Option<Interval> {
    if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let median = median(values);
    let (low, high) = bootstrap_median(values, replicates, seed)?;
    Some(Interval {
        median,
        // The replicates' lower median can sit below an even count's
        // midpoint median; the interval always holds the printed median.
        low: low.min(median),
        high: high.max(median),
    })
}

/// The median of `values` (not empty; the mean of the two middle values
/// for an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// Rounds from which the halves are compared: each half then has
/// [`MIN_ROUNDS`], enough for an interval of its own.
pub const DRIFT_MIN_ROUNDS: usize = 2 * MIN_ROUNDS;

/// A drift test's level: the chance that rounds whose order does not
/// matter are called drifted (per ratio). Low, so that the warning is
/// rare enough to be read when it comes.
pub const DRIFT_LEVEL: f64 = 0.01;

/// Rearrangements of the rounds the permutation test draws.
pub const PERMUTATIONS: usize = 10_000;

/// The rounds' first half against their second half, in the order they
/// ran. Rounds interleave the variants, so a machine that slows down
/// moves both alike and the ratio holds; where a ratio's level itself
/// moves during a run (a machine's state that weighs on one variant more
/// than on the other), the interval, built as if the rounds were drawn
/// alike, is too narrow, and a second run can land outside it. Seen on
/// these machines: two 20-round runs of one build, 40 minutes apart, whose
/// p99 intervals did not hold each other's median.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Drift {
    /// The first half's median and interval.
    pub first: Interval,
    /// The second half's (the extra round of an odd count is here).
    pub second: Interval,
    /// The share of the rounds' rearrangements whose halves' medians
    /// differ at least as much as the rounds' own order gives (a
    /// permutation test's p-value).
    pub p: f64,
    /// Whether `p` is below [`DRIFT_LEVEL`].
    pub drifted: bool,
}

/// The drift test of `values` (rounds in order) over `permutations`
/// rearrangements: `None` below [`DRIFT_MIN_ROUNDS`] or with a value not
/// finite. The same for the same `seed`.
pub fn drift(values: &[f64], replicates: usize, permutations: usize, seed: u64) -> Option<Drift> {
    if values.len() < DRIFT_MIN_ROUNDS || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let half = values.len() / 2;
    let gap = |v: &[f64]| (median(&v[half..]) - median(&v[..half])).abs();
    let seen = gap(values);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut shuffled = values.to_vec();
    // A rearrangement's gap equal to the rounds' own (ties, common among
    // a few distinct values) counts against drift; so does a gap smaller
    // only by rounding.
    let tolerance = 1e-12 * seen.max(1.0);
    let as_large = (0..permutations)
        .filter(|_| {
            shuffled.shuffle(&mut rng);
            gap(&shuffled) >= seen - tolerance
        })
        .count();
    let p = (as_large + 1) as f64 / (permutations + 1) as f64;
    Some(Drift {
        first: median_interval(&values[..half], replicates, seed)?,
        second: median_interval(&values[half..], replicates, seed)?,
        p,
        drifted: p < DRIFT_LEVEL,
    })
}

/// A benchmark's goal for one ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// The ratio should be at most this.
    AtMost(f64),
    /// The ratio should be at least this.
    AtLeast(f64),
}

/// Whether a goal is met, judged on the interval, not on the median.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The whole interval is on the goal's side.
    Met,
    /// The whole interval is on the wrong side.
    NotMet,
    /// The interval straddles the goal, or there were too few rounds.
    Undecided,
}

impl Goal {
    /// Met when the interval's far bound is on the goal's side (at most
    /// 1.2: the upper bound <= 1.2), not met when its near bound is past
    /// it (the lower bound > 1.2), undecided otherwise.
    pub fn judge(self, interval: &Interval) -> Verdict {
        match self {
            Goal::AtMost(goal) if interval.high <= goal => Verdict::Met,
            Goal::AtMost(goal) if interval.low > goal => Verdict::NotMet,
            Goal::AtLeast(goal) if interval.low >= goal => Verdict::Met,
            Goal::AtLeast(goal) if interval.high < goal => Verdict::NotMet,
            _ => Verdict::Undecided,
        }
    }

    /// [`Goal::judge`] of the rounds' `whole` interval, which stands
    /// where they drifted only if each half's own interval gives it too.
    pub fn judge_rounds(self, whole: &Interval, drift: Option<&Drift>) -> Verdict {
        let verdict = self.judge(whole);
        match drift {
            Some(d)
                if d.drifted
                    && (self.judge(&d.first) != verdict || self.judge(&d.second) != verdict) =>
            {
                Verdict::Undecided
            }
            _ => verdict,
        }
    }
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Goal::AtMost(x) => write!(f, "<= {x}"),
            Goal::AtLeast(x) => write!(f, ">= {x}"),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Met => "met",
            Verdict::NotMet => "not met",
            Verdict::Undecided => "undecided",
        })
    }
}

/// Why a goal, a values file or a machine snapshot did not parse.
#[derive(Debug, thiserror::Error)]
pub enum RoundsError {
    #[error("goal {0:?}: expected NAME<=NUMBER or NAME>=NUMBER")]
    Goal(String),
    #[error("line {line}: expected NAME<TAB>NUMBER, got {text:?}")]
    Value { line: usize, text: String },
    #[error("goal for {0:?}: no such ratio among the values")]
    UnknownGoal(String),
    #[error("line {line}: {what}: {text:?}")]
    Machine {
        line: usize,
        what: &'static str,
        text: String,
    },
}

/// A goal for a named ratio, as given on the command line:
/// `NAME<=1.2` or `NAME>=0.9`.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedGoal {
    pub name: String,
    pub goal: Goal,
}

impl FromStr for NamedGoal {
    type Err = RoundsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || RoundsError::Goal(s.to_owned());
        let (at, ctor): (usize, fn(f64) -> Goal) = match (s.rfind("<="), s.rfind(">=")) {
            (Some(a), Some(b)) if b > a => (b, Goal::AtLeast),
            (Some(a), _) => (a, Goal::AtMost),
            (None, Some(b)) => (b, Goal::AtLeast),
            (None, None) => return Err(bad()),
        };
        let name = s[..at].trim();
        let bound: f64 = s[at + 2..].trim().parse().map_err(|_| bad())?;
        if name.is_empty() || !bound.is_finite() {
            return Err(bad());
        }
        Ok(NamedGoal {
            name: name.to_owned(),
            goal: ctor(bound),
        })
    }
}

/// Per-round values by name, in the order the names first appear: lines
/// of `NAME<TAB>VALUE`, one per ratio and round, rounds in order. Blank
/// lines are skipped.
pub fn parse_values(text: &str) -> Result<Vec<(String, Vec<f64>)>, RoundsError> {
    let mut out: Vec<(String, Vec<f64>)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || RoundsError::Value {
            line: i + 1,
            text: line.to_owned(),
        };
        let (name, value) = line.rsplit_once('\t').ok_or_else(bad)?;
        let value: f64 = value.trim().parse().map_err(|_| bad())?;
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, values)) => values.push(value),
            None => out.push((name.to_owned(), vec![value])),
        }
    }
    Ok(out)
}

/// What the machine did during the rounds, from snapshots taken between
/// them: the `cpu` line of `/proc/stat` and `/proc/loadavg`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MachineReading {
    /// CPU time stolen by the hypervisor over all the rounds, as a share
    /// of all CPU time (0..1); `None` with fewer than two snapshots.
    pub steal: Option<f64>,
    /// The most stolen between two consecutive snapshots.
    pub steal_most: Option<f64>,
    /// The lowest and highest 1-minute load average at the snapshots.
    pub load: Option<(f64, f64)>,
}

/// The counters of the `cpu` line that make up all CPU time (guest time
/// is already inside user and nice), and steal among them.
#[derive(Clone, Copy, Debug)]
struct CpuTimes {
    total: u64,
    steal: u64,
}

impl MachineReading {
    /// Reads snapshots, in order: each a `/proc/stat` `cpu ...` line and
    /// a `/proc/loadavg` line (`0.52 0.58 0.59 1/467 12345`).
    pub fn parse(text: &str) -> Result<Self, RoundsError> {
        let mut cpus = Vec::new();
        let mut loads = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let bad = |what| RoundsError::Machine {
                line: i + 1,
                what,
                text: line.to_owned(),
            };
            let mut words = line.split_whitespace();
            match words.next() {
                None => continue,
                Some("cpu") => {
                    let ticks: Vec<u64> = words
                        .take(8)
                        .map(str::parse)
                        .collect::<Result<_, _>>()
                        .map_err(|_| bad("not a /proc/stat cpu line"))?;
                    if ticks.len() < 8 {
                        return Err(bad("a /proc/stat cpu line without steal"));
                    }
                    cpus.push(CpuTimes {
                        total: ticks.iter().sum(),
                        steal: ticks[7],
                    });
                }
                Some(first) => {
                    let load: f64 = first.parse().map_err(|_| bad("not a /proc/loadavg line"))?;
                    loads.push(load);
                }
            }
        }
        let share = |a: &CpuTimes, b: &CpuTimes| {
            let total = b.total.saturating_sub(a.total);
            (total > 0).then(|| b.steal.saturating_sub(a.steal) as f64 / total as f64)
        };
        let steal = match (cpus.first(), cpus.last()) {
            (Some(a), Some(b)) if cpus.len() >= 2 => share(a, b),
            _ => None,
        };
        let steal_most = cpus
            .windows(2)
            .filter_map(|w| share(&w[0], &w[1]))
            .reduce(f64::max);
        let load = loads.iter().copied().fold(None, |acc, x| match acc {
            None => Some((x, x)),
            Some((lo, hi)) => Some((f64::min(lo, x), f64::max(hi, x))),
        });
        Ok(MachineReading {
            steal,
            steal_most,
            load,
        })
    }
}

/// One ratio over the rounds: its values, interval and verdict.
#[derive(Clone, Debug, Serialize)]
pub struct RatioRow {
    pub name: String,
    /// The values in round order.
    pub rounds: Vec<f64>,
    /// `None` when a value is not finite (a zero denominator).
    pub interval: Option<Interval>,
    pub goal: Option<String>,
    /// Undecided, whatever the interval says, when the rounds drifted
    /// and their halves, each judged on its own interval, do not both
    /// give the whole's verdict.
    pub verdict: Option<Verdict>,
    /// The halves compared; `None` below [`DRIFT_MIN_ROUNDS`].
    pub drift: Option<Drift>,
}

/// Every ratio of one benchmark over its rounds, and the machine meanwhile.
#[derive(Clone, Debug, Serialize)]
pub struct RoundsReport {
    pub ratios: Vec<RatioRow>,
    pub machine: Option<MachineReading>,
    pub replicates: usize,
    pub seed: u64,
}

/// Intervals and verdicts for `values` (from [`parse_values`]); a goal
/// naming no ratio is an error (a typo would silently judge nothing).
pub fn report(
    values: Vec<(String, Vec<f64>)>,
    goals: &[NamedGoal],
    machine: Option<MachineReading>,
    seed: u64,
) -> Result<RoundsReport, RoundsError> {
    if let Some(g) = goals
        .iter()
        .find(|g| !values.iter().any(|(n, _)| *n == g.name))
    {
        return Err(RoundsError::UnknownGoal(g.name.clone()));
    }
    let ratios = values
        .into_iter()
        .map(|(name, rounds)| {
            let interval = median_interval(&rounds, REPLICATES, seed);
            let drift = drift(&rounds, REPLICATES, PERMUTATIONS, seed);
            let goal = goals.iter().find(|g| g.name == name).map(|g| g.goal);
            let verdict = goal.map(|goal| match interval {
                Some(i) if rounds.len() >= MIN_ROUNDS => goal.judge_rounds(&i, drift.as_ref()),
                _ => Verdict::Undecided,
            });
            RatioRow {
                name,
                rounds,
                interval,
                goal: goal.map(|g| g.to_string()),
                verdict,
                drift,
            }
        })
        .collect();
    Ok(RoundsReport {
        ratios,
        machine,
        replicates: REPLICATES,
        seed,
    })
}

impl fmt::Display for RoundsReport {
    /// The table: one line per ratio, its rounds under it, the machine's
    /// steal and load last.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.ratios.iter().map(|r| r.name.len()).max().unwrap_or(0);
        writeln!(
            f,
            "{:<width$}  {:>7}  {:<16}  {:>6}  {:<8}  verdict",
            "ratio", "median", "95 % interval", "rounds", "goal"
        )?;
        for r in &self.ratios {
            let (median, interval) = match r.interval {
                Some(i) => (
                    format!("{:.2}", i.median),
                    format!("[{:.2}, {:.2}]", i.low, i.high),
                ),
                None => ("n/a".to_owned(), "n/a".to_owned()),
            };
            let drifted = r.drift.filter(|d| d.drifted);
            let verdict = match r.verdict {
                Some(Verdict::Undecided) if r.rounds.len() < MIN_ROUNDS => {
                    format!("undecided (fewer than {MIN_ROUNDS} rounds)")
                }
                Some(v) if drifted.is_some() => format!("{v} (drifted)"),
                Some(v) => v.to_string(),
                None => String::new(),
            };
            let line = format!(
                "{:<width$}  {median:>7}  {interval:<16}  {:>6}  {:<8}  {verdict}",
                r.name,
                r.rounds.len(),
                r.goal.as_deref().unwrap_or("-"),
            );
            writeln!(f, "{}", line.trim_end())?;
            let by_round: Vec<String> = r.rounds.iter().map(|v| format!("{v:.2}")).collect();
            writeln!(f, "{:<width$}  by round: {}", "", by_round.join(" "))?;
            if let Some(d) = drifted {
                writeln!(
                    f,
                    "{:<width$}  drifted: first half {:.2} [{:.2}, {:.2}], second half {:.2} \
                     [{:.2}, {:.2}] (permutation p = {:.3}): the level moved during the run, so \
                     the interval is narrower than the spread between runs; a verdict stands \
                     only where both halves give it",
                    "",
                    d.first.median,
                    d.first.low,
                    d.first.high,
                    d.second.median,
                    d.second.low,
                    d.second.high,
                    d.p,
                )?;
            }
        }
        writeln!(
            f,
            "median of the rounds, 95 % interval by percentile bootstrap ({} replicates); \
             a goal is met when the whole interval is on its side, not met when the whole of \
             it is on the other, undecided otherwise; from {DRIFT_MIN_ROUNDS} rounds the first \
             half is tested against the second ({PERMUTATIONS} permutations, level {DRIFT_LEVEL})",
            self.replicates
        )?;
        match &self.machine {
            Some(m) => {
                let steal = match (m.steal, m.steal_most) {
                    (Some(all), Some(most)) => format!(
                        "CPU steal during the rounds {} (at most {} in one round)",
                        tailmesh_units::percent(all),
                        tailmesh_units::percent(most)
                    ),
                    _ => "CPU steal during the rounds unknown".to_owned(),
                };
                let load = match m.load {
                    Some((lo, hi)) => format!("load average (1 min) {lo:.2} to {hi:.2}"),
                    None => "load average unknown".to_owned(),
                };
                writeln!(f, "{steal}; {load}")
            }
            None => writeln!(f, "CPU steal and load average not recorded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand_distr::{Distribution, LogNormal, Normal};

    use super::*;

    /// Draws `rounds` values `trials` times and counts how often the
    /// interval holds the law's true median.
    fn coverage(law: impl Distribution<f64>, truth: f64, rounds: usize, trials: u64) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(38);
        let mut hits = 0;
        for trial in 0..trials {
            let values: Vec<f64> = (0..rounds).map(|_| law.sample(&mut rng)).collect();
            let i = median_interval(&values, 1000, trial).expect("finite values");
            if i.low <= truth && truth <= i.high {
                hits += 1;
            }
        }
        hits as f64 / trials as f64
    }

    #[test]
    fn the_interval_covers_the_true_median_about_95_percent_of_the_time() {
        // Ratios as the VMs give them: log-normal, 30 % spread round to
        // round, true median 1.2. With 10 rounds the percentile interval
        // is about the 2nd to the 8th smallest, which holds the median
        // with probability 93.5 %.
        let law = LogNormal::new(1.2f64.ln(), 0.3).expect("a valid law");
        let c = coverage(law, 1.2, 10, 400);
        assert!((0.90..=0.98).contains(&c), "coverage {c} with 10 rounds");
        // Negative and positive values alike (a difference over a cost).
        let law = Normal::new(-0.1, 0.5).expect("a valid law");
        let c = coverage(law, -0.1, 15, 400);
        assert!((0.90..=0.99).contains(&c), "coverage {c} with 15 rounds");
    }

    #[test]
    fn the_interval_narrows_with_more_rounds_and_holds_the_median() {
        let law = LogNormal::new(0.0, 0.3).expect("a valid law");
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let width = |n: usize, rng: &mut ChaCha8Rng| {
            let values: Vec<f64> = (0..n).map(|_| law.sample(rng)).collect();
            let i = median_interval(&values, REPLICATES, 7).expect("finite values");
            assert!(i.low <= i.median && i.median <= i.high, "{i:?}");
            i.high - i.low
        };
        let few: f64 = (0..20).map(|_| width(10, &mut rng)).sum();
        let many: f64 = (0..20).map(|_| width(200, &mut rng)).sum();
        assert!(many < few / 2.0, "10 rounds {few}, 200 rounds {many}");
    }

    #[test]
    fn known_values_give_their_median_and_the_same_interval_for_the_same_seed() {
        let values = [1.0, 5.0, 2.0, 4.0, 3.0];
        let i = median_interval(&values, REPLICATES, 3).expect("finite values");
        assert_eq!(i.median, 3.0);
        // Bounds are order statistics of the rounds (the grid keeps them
        // to 1/30000 of the spread).
        for bound in [i.low, i.high] {
            assert!(
                values.iter().any(|v| (v - bound).abs() < 1e-3),
                "{bound} is not one of the values"
            );
        }
        assert_eq!(median_interval(&values, REPLICATES, 3), Some(i));
        let even = median_interval(&[1.0, 2.0, 3.0, 4.0], REPLICATES, 3).expect("finite values");
        assert_eq!(even.median, 2.5);
        assert_eq!(
            median_interval(&[0.8; 6], REPLICATES, 3),
            Some(Interval {
                median: 0.8,
                low: 0.8,
                high: 0.8
            })
        );
        assert_eq!(median_interval(&[], REPLICATES, 3), None);
        assert_eq!(median_interval(&[1.0, f64::NAN], REPLICATES, 3), None);
    }

    #[test]
    fn a_goal_is_met_only_when_the_whole_interval_is_on_its_side() {
        let i = |low, high| Interval {
            median: (low + high) / 2.0,
            low,
            high,
        };
        let at_most = Goal::AtMost(1.2);
        assert_eq!(at_most.judge(&i(0.9, 1.2)), Verdict::Met);
        assert_eq!(at_most.judge(&i(1.1, 1.3)), Verdict::Undecided);
        assert_eq!(at_most.judge(&i(1.2, 1.3)), Verdict::Undecided);
        assert_eq!(at_most.judge(&i(1.21, 1.3)), Verdict::NotMet);
        let at_least = Goal::AtLeast(0.9);
        assert_eq!(at_least.judge(&i(0.9, 1.0)), Verdict::Met);
        assert_eq!(at_least.judge(&i(0.85, 1.0)), Verdict::Undecided);
        assert_eq!(at_least.judge(&i(0.7, 0.89)), Verdict::NotMet);
    }

    #[test]
    fn goals_parse_with_the_last_comparison_in_the_name() {
        assert_eq!(
            "per-hop cost / h2load p50, traces off<=2.5"
                .parse::<NamedGoal>()
                .ok(),
            Some(NamedGoal {
                name: "per-hop cost / h2load p50, traces off".into(),
                goal: Goal::AtMost(2.5)
            })
        );
        assert_eq!(
            "rate >= 0.9".parse::<NamedGoal>().ok(),
            Some(NamedGoal {
                name: "rate".into(),
                goal: Goal::AtLeast(0.9)
            })
        );
        assert!("rate = 0.9".parse::<NamedGoal>().is_err());
        assert!("<=1".parse::<NamedGoal>().is_err());
        assert!("x<=many".parse::<NamedGoal>().is_err());
    }

    #[test]
    fn values_group_by_name_in_first_seen_order() {
        let text = "b / a\t1.5\nc / a\t0.5\n\nb / a\t1.25\nc / a\t0.75\n";
        assert_eq!(
            parse_values(text).expect("valid lines"),
            vec![
                ("b / a".to_owned(), vec![1.5, 1.25]),
                ("c / a".to_owned(), vec![0.5, 0.75]),
            ]
        );
        match parse_values("ok\t1\nbroken 2\n") {
            Err(RoundsError::Value { line: 2, .. }) => {}
            other => panic!("expected line 2 to fail, got {other:?}"),
        }
    }

    #[test]
    fn the_report_judges_goals_and_says_when_rounds_are_too_few() {
        let goal = |s: &str| s.parse::<NamedGoal>().expect("a valid goal");
        let values = vec![
            ("cost".to_owned(), vec![1.0, 1.1, 0.9, 1.05, 0.95, 1.0]),
            ("rate".to_owned(), vec![0.5, 0.6]),
            ("free".to_owned(), vec![2.0, f64::INFINITY]),
        ];
        let r = report(
            values.clone(),
            &[goal("cost<=1.2"), goal("rate>=0.9")],
            None,
            1,
        )
        .expect("known names");
        let verdicts: Vec<_> = r.ratios.iter().map(|row| row.verdict).collect();
        // Two rounds wholly under 0.9 still decide nothing.
        assert_eq!(
            verdicts,
            [Some(Verdict::Met), Some(Verdict::Undecided), None]
        );
        assert_eq!(r.ratios[2].interval, None);
        let text = r.to_string();
        assert!(text.contains("undecided (fewer than 5 rounds)"), "{text}");
        assert!(text.contains("by round: 2.00 inf"), "{text}");
        assert!(text.contains("not recorded"), "{text}");
        match report(values, &[goal("costs<=1.2")], None, 1) {
            Err(RoundsError::UnknownGoal(name)) => assert_eq!(name, "costs"),
            other => panic!("expected an unknown goal, got {other:?}"),
        }
    }

    #[test]
    fn a_level_that_moves_between_the_halves_is_drift_and_rounds_drawn_alike_rarely_are() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let noise = Normal::new(0.0, 0.02).expect("a valid law");
        // The p99 ratio of one run at 1.02, then at 1.06, ten rounds each.
        let moved: Vec<f64> = (0..20)
            .map(|i| if i < 10 { 1.02 } else { 1.06 } + noise.sample(&mut rng))
            .collect();
        let d = drift(&moved, REPLICATES, 2000, 1).expect("enough finite rounds");
        assert!(d.drifted && d.p < DRIFT_LEVEL, "{d:?}");
        assert!(d.first.high < d.second.median, "{d:?}");
        // The same values in an order that does not follow the level.
        let mut mixed = moved.clone();
        mixed.shuffle(&mut rng);
        let d = drift(&mixed, REPLICATES, 2000, 1).expect("enough finite rounds");
        assert!(!d.drifted, "{d:?}");
        // Rounds drawn alike: called drifted about as often as the level.
        let law = LogNormal::new(0.0, 0.3).expect("a valid law");
        let called = (0..200)
            .filter(|&trial| {
                let values: Vec<f64> = (0..20).map(|_| law.sample(&mut rng)).collect();
                drift(&values, 100, 500, trial)
                    .expect("enough finite rounds")
                    .drifted
            })
            .count();
        assert!(
            called <= 6,
            "{called} of 200 runs without drift called drifted"
        );
        assert_eq!(
            drift(&moved[..DRIFT_MIN_ROUNDS - 1], REPLICATES, 2000, 1),
            None
        );
        assert_eq!(drift(&[1.0, f64::NAN].repeat(6), REPLICATES, 2000, 1), None);
    }

    #[test]
    fn a_drifted_verdict_stands_only_where_both_halves_give_it() {
        let goal = |s: &str| s.parse::<NamedGoal>().expect("a valid goal");
        let halves = |a: f64, b: f64| -> Vec<f64> {
            (0..20)
                .map(|i| if i < 10 { a } else { b } + 0.002 * f64::from(i % 5))
                .collect()
        };
        let r = report(
            vec![
                // Past the goal in both halves: not met, drift or not.
                ("both past".to_owned(), halves(1.09, 1.13)),
                // Met in the first half only, though the whole interval,
                // which holds both, is under the goal.
                (
                    "one side".to_owned(),
                    halves(0.98, 0.98)[..10]
                        .iter()
                        .copied()
                        .chain([1.03, 1.035, 1.04, 1.042, 1.045])
                        .chain([1.055, 1.06, 1.065, 1.07, 1.075])
                        .collect(),
                ),
                ("steady".to_owned(), halves(1.02, 1.02)),
            ],
            &[
                goal("both past<=1.05"),
                goal("one side<=1.05"),
                goal("steady<=1.05"),
            ],
            None,
            3,
        )
        .expect("known names");
        let drifted: Vec<bool> = r
            .ratios
            .iter()
            .map(|row| row.drift.expect("20 rounds").drifted)
            .collect();
        assert_eq!(drifted, [true, true, false], "{:?}", r.ratios);
        let verdicts: Vec<_> = r.ratios.iter().map(|row| row.verdict).collect();
        assert_eq!(
            verdicts,
            [
                Some(Verdict::NotMet),
                Some(Verdict::Undecided),
                Some(Verdict::Met)
            ]
        );
        // The whole interval alone would have judged the second.
        let whole = r.ratios[1].interval.expect("finite values");
        assert_ne!(Goal::AtMost(1.05).judge(&whole), Verdict::Undecided);
        let text = r.to_string();
        assert!(text.contains("not met (drifted)"), "{text}");
        assert!(
            text.contains("drifted: first half 0.98 [0.98, 0.99], second half 1.05"),
            "{text}"
        );
        assert_eq!(text.matches("drifted: first half").count(), 2, "{text}");
    }

    #[test]
    fn steal_and_load_come_from_the_snapshots() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let text = "\
cpu  100 0 100 700 0 0 0 100 0 0
0.50 0.40 0.30 1/100 10
cpu  200 0 200 1500 0 0 0 100 0 0
1.75 0.60 0.40 2/100 11
cpu  300 0 300 1800 0 0 0 300 0 0
1.20 0.70 0.40 1/100 12
";
        let m = MachineReading::parse(text).expect("valid snapshots");
        // 200 stolen of 1700 ticks over both rounds; 200 of 700 in the
        // second, none in the first.
        assert_eq!(m.steal, Some(200.0 / 1700.0));
        assert_eq!(m.steal_most, Some(200.0 / 700.0));
        assert_eq!(m.load, Some((0.5, 1.75)));
        let one = MachineReading::parse("cpu  1 2 3 4 5 6 7 8 0 0\n0.1 0.1 0.1 1/1 1\n")
            .expect("valid snapshot");
        assert_eq!((one.steal, one.steal_most), (None, None));
        assert!(MachineReading::parse("cpu 1 2 3\n").is_err());
        assert!(MachineReading::parse("load high\n").is_err());
    }
}
