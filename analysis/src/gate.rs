//! The regression gate of `tailmesh compare --gate`: is run B worse than
//! run A, by more than a tolerance and by more than chance explains?
//!
//! For every variant both runs hold, three metrics: p50 and p99 of the
//! end-to-end latency (ok requests, from the intended send time) and the
//! error share ((errors + timeouts) / sent). Each gets its change from A to
//! B (relative for latencies, in points for the error share) and a
//! percentile bootstrap interval on that change. A metric **regressed**
//! when its change is beyond the tolerance and its interval excludes no
//! change.
//!
//! The bootstrap resamples no rows. The q-quantile of a resample of n
//! values is its k-th smallest value, k = ceil(q n) (how HdrHistogram reads
//! a quantile), and the k-th smallest of n draws from the empirical
//! distribution F_n is F_n^-1(U_(k)), where U_(k) ~ Beta(k, n + 1 - k) is
//! the k-th smallest of n uniforms. One Beta draw and one lookup in the
//! histogram's cumulative counts is therefore exactly one bootstrap
//! replicate of the quantile, whatever n. The error share's replicate is
//! Binomial(n, share) / n. The two runs are resampled independently: with
//! one seed their injected faults are the same draws, so treating them as
//! independent overstates the noise, which errs towards passing.

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Beta, Binomial, Distribution};
use serde::{Deserialize, Serialize};

use super::{Summary, VariantReport};

/// The `schema` value of the gate's JSON (`compare --gate --json`).
pub const SCHEMA: &str = "tailmesh.compare/v1";

/// How much slower (a fraction) B's p50 or p99 may be than A's before the
/// gate fails, by default.
///
/// Chosen from run-to-run noise: `bench/gate-noise.sh` runs one scenario
/// several times with one seed and prints, over all pairs of runs, the
/// 95th percentile of max(B/A, A/B) - 1 for p50 and for p99; the default
/// is 1.5 times the larger of the two, rounded up to 5 %. On a quiet
/// 2-core machine (load average 1.4 before, 0.7 after), 10 runs of
/// `scenarios/default.toml` (2060 ok requests each) had p50s from 2.04 to
/// 2.70 ms (95th percentile of the pairs' spread 27 %) and p99s from 42.4
/// to 43.4 ms (2 %), hence 45 %.
pub const DEFAULT_TOLERANCE: f64 = 0.45;

pub const DEFAULT_ERROR_TOLERANCE: f64 = 0.005;

/// The two-sided confidence of the intervals.
pub const CONFIDENCE: f64 = 0.95;

/// Bootstrap replicates per metric, by default.
pub const DEFAULT_REPLICATES: u32 = 2000;

/// Ok requests a run needs in a variant for its p50 and p99 to be judged:
/// at 1000, p99 rests on the 10 slowest.
pub const MIN_OK: u64 = 1000;

/// What the gate decides by.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateRule {
    /// How much slower (a fraction: 0.45 = 45 %) p50 or p99 may get.
    pub tolerance: f64,
    /// How many points (a share: 0.005 = 0.5 %) the error share may rise.
    pub error_tolerance: f64,
    /// Confidence of the bootstrap intervals (0.95).
    pub confidence: f64,
    /// Bootstrap replicates per metric.
    pub replicates: u32,
    /// Ok requests each run needs in a variant for its latencies to be
    /// judged.
    pub min_ok: u64,
    /// Seed of the bootstrap's random draws.
    pub seed: u64,
}

impl Default for GateRule {
    fn default() -> GateRule {
        GateRule {
            tolerance: DEFAULT_TOLERANCE,
            error_tolerance: DEFAULT_ERROR_TOLERANCE,
            confidence: CONFIDENCE,
            replicates: DEFAULT_REPLICATES,
            min_ok: MIN_OK,
            seed: 1,
        }
    }
}

/// The gate's decision, for the whole comparison or one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateVerdict {
    /// Nothing regressed, and every metric could be judged.
    Pass,
    /// At least one metric regressed.
    Regressed,
    /// Nothing regressed, but the runs cannot tell (see the reasons).
    Inconclusive,
}

impl GateVerdict {
    /// "pass", "regressed" or "inconclusive".
    pub fn as_str(self) -> &'static str {
        match self {
            GateVerdict::Pass => "pass",
            GateVerdict::Regressed => "regressed",
            GateVerdict::Inconclusive => "inconclusive",
        }
    }
}

/// Which run is which.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunLabel {
    /// The run folder, as given.
    pub run: String,
    /// The run's id.
    pub run_id: String,
    /// Its scenario's name.
    pub scenario: String,
    /// Its scenario's seed.
    pub seed: u64,
    /// Whether it was interrupted.
    pub interrupted: bool,
}

impl RunLabel {
    fn of(summary: &Summary, run: &str) -> RunLabel {
        RunLabel {
            run: run.to_string(),
            run_id: summary.run_id.clone(),
            scenario: summary.scenario.name.clone(),
            seed: summary.scenario.seed,
            interrupted: summary.interrupted,
        }
    }
}

/// The whole comparison: the JSON of `compare --gate --json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    /// Always `tailmesh.compare/v1`.
    pub schema: String,
    pub verdict: GateVerdict,
    /// The baseline.
    pub a: RunLabel,
    /// The run judged against it.
    pub b: RunLabel,
    pub rule: GateRule,
    /// Every variant both runs hold, in B's order.
    pub variants: Vec<VariantGate>,
    /// Why the comparison, or a part of it, cannot tell: about the runs
    /// (the verdict is then inconclusive), then about each variant (empty
    /// when everything was judged).
    pub reasons: Vec<String>,
    /// What was left out: variants only one run holds.
    pub notes: Vec<String>,
}

/// One variant's comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantGate {
    pub name: String,
    pub verdict: GateVerdict,
    /// Run A's counts.
    pub a: Counts,
    /// Run B's counts.
    pub b: Counts,
    pub metrics: Metrics,
    /// Why some metric could not be judged (absent when all were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A variant's requests in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests sent in the measured phase.
    pub sent: u64,
    /// Ok requests with a latency (the rebuilt histogram's count).
    pub ok: u64,
    /// Errors and timeouts.
    pub failed: u64,
}

/// The judged metrics; one is absent when it could not be judged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50: Option<MetricGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99: Option<MetricGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_share: Option<MetricGate>,
}

impl Metrics {
    /// The metrics present, each with its name.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, &MetricGate)> {
        [
            ("p50", &self.p50),
            ("p99", &self.p99),
            ("error_share", &self.error_share),
        ]
        .into_iter()
        .filter_map(|(name, m)| m.as_ref().map(|m| (name, m)))
    }
}

/// One metric of one variant, A against B.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricGate {
    /// "us" (p50, p99: microseconds) or "share" (the error share, 0..1).
    pub unit: String,
    /// Run A's value.
    pub a: f64,
    /// Run B's value.
    pub b: f64,
    /// B / A - 1 for "us" (0.3 = 30 % slower), B - A for "share".
    pub change: f64,
    /// The bootstrap interval on `change`, low and high.
    pub interval: [f64; 2],
    /// `change` is beyond the tolerance and `interval` excludes 0.
    pub regressed: bool,
    /// The same, the other way: B better beyond the tolerance (for "us",
    /// A / B - 1 beyond it, so that 2x faster mirrors 2x slower) and the
    /// interval's high end below 0.
    pub improved: bool,
}

impl MetricGate {
    /// Whether the change, either way, is beyond `tolerance` (on the
    /// scale of [`MetricGate::improved`] when B is better).
    pub fn beyond(&self, tolerance: f64) -> bool {
        self.change > tolerance || better_by(&self.unit, self.change) > tolerance
    }
}

/// Compares run `b` with the baseline `a` (labelled by their folders)
/// under `rule`. Reads each variant's rebuilt latency histogram and its
/// counts; holds no rows.
pub fn gate(a: &Summary, a_run: &str, b: &Summary, b_run: &str, rule: &GateRule) -> GateReport {
    let mut reasons = Vec::new();
    let mut notes = Vec::new();
    if a.scenario.name != b.scenario.name {
        reasons.push(format!(
            "the runs are of different scenarios (\"{}\" and \"{}\")",
            a.scenario.name, b.scenario.name
        ));
    }
    if a.scenario.seed != b.scenario.seed {
        reasons.push(format!(
            "the runs have different seeds ({} and {}), so their injected faults differ",
            a.scenario.seed, b.scenario.seed
        ));
    }
    for (which, s) in [("A", a), ("B", b)] {
        if s.interrupted {
            reasons.push(format!("run {which} was interrupted"));
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(rule.seed);
    let mut variants = Vec::new();
    for vb in &b.variants {
        match a.variants.iter().find(|va| va.name == vb.name) {
            Some(va) => variants.push(variant_gate(va, vb, rule, &mut rng)),
            None => notes.push(format!(
                "variant \"{}\" is only in run B: not compared",
                vb.name
            )),
        }
    }
    for va in &a.variants {
        if !b.variants.iter().any(|vb| vb.name == va.name) {
            notes.push(format!(
                "variant \"{}\" is only in run A: not compared",
                va.name
            ));
        }
    }
    if variants.is_empty() {
        reasons.push("the runs share no variant".to_string());
    }
    // Reasons about the runs themselves: nothing they show counts then.
    let runs_comparable = reasons.is_empty();
    reasons.extend(variants.iter().filter_map(|v| {
        v.reason
            .as_ref()
            .map(|r| format!("variant \"{}\": {r}", v.name))
    }));
    let verdict = if !runs_comparable {
        GateVerdict::Inconclusive
    } else if variants.iter().any(|v| v.verdict == GateVerdict::Regressed) {
        GateVerdict::Regressed
    } else if variants
        .iter()
        .any(|v| v.verdict == GateVerdict::Inconclusive)
    {
        GateVerdict::Inconclusive
    } else {
        GateVerdict::Pass
    };
    GateReport {
        schema: SCHEMA.to_string(),
        verdict,
        a: RunLabel::of(a, a_run),
        b: RunLabel::of(b, b_run),
        rule: rule.clone(),
        variants,
        reasons,
        notes,
    }
}

fn counts(v: &VariantReport) -> Counts {
    Counts {
        sent: v.sent,
        ok: v.latency_histogram.len(),
        failed: v.errors.values().sum::<u64>() + v.timeouts,
    }
}

fn variant_gate(
    a: &VariantReport,
    b: &VariantReport,
    rule: &GateRule,
    rng: &mut ChaCha8Rng,
) -> VariantGate {
    let (ca, cb) = (counts(a), counts(b));
    let mut reasons = Vec::new();
    let mut metrics = Metrics::default();
    if ca.ok < rule.min_ok || cb.ok < rule.min_ok {
        reasons.push(format!(
            "{} ok requests in run A and {} in run B: p50 and p99 need {} in each",
            ca.ok, cb.ok, rule.min_ok
        ));
    } else {
        let (la, lb) = (
            Ladder::of(&a.latency_histogram),
            Ladder::of(&b.latency_histogram),
        );
        metrics.p50 = latency_gate(&la, &lb, 0.5, rule, rng);
        metrics.p99 = latency_gate(&la, &lb, 0.99, rule, rng);
    }
    if ca.sent == 0 || cb.sent == 0 {
        reasons.push("a run sent no request: no error share".to_string());
    } else {
        metrics.error_share = share_gate(ca, cb, rule, rng);
    }
    let verdict = if metrics.named().any(|(_, m)| m.regressed) {
        GateVerdict::Regressed
    } else if reasons.is_empty() {
        GateVerdict::Pass
    } else {
        GateVerdict::Inconclusive
    };
    VariantGate {
        name: b.name.clone(),
        verdict,
        a: ca,
        b: cb,
        metrics,
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
    }
}

/// A histogram's recorded values with their cumulative counts: a quantile
/// by binary search, as `Histogram::value_at_quantile` reads it.
struct Ladder {
    /// Count of values at or below each step's value.
    cumulative: Vec<u64>,
    /// Each step's value (the highest equivalent of its bucket).
    values: Vec<u64>,
}

impl Ladder {
    fn of(h: &Histogram<u64>) -> Ladder {
        let mut total = 0;
        let (mut cumulative, mut values) = (Vec::new(), Vec::new());
        for step in h.iter_recorded() {
            total += step.count_at_value();
            cumulative.push(total);
            values.push(step.value_iterated_to());
        }
        Ladder { cumulative, values }
    }

    fn len(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// The ceil(u n)-th smallest value (at least the first), or 0 when
    /// empty.
    fn at(&self, u: f64) -> u64 {
        let n = self.len();
        let target = ((u * n as f64).ceil() as u64).clamp(1, n.max(1));
        let i = self.cumulative.partition_point(|&c| c < target);
        self.values
            .get(i)
            .or(self.values.last())
            .copied()
            .unwrap_or(0)
    }

    /// The bootstrap distribution of the q-quantile: the Beta law of the
    /// resample's k-th smallest value's place in the sample, k = ceil(q n).
    fn bootstrap(&self, q: f64) -> Option<Beta<f64>> {
        let n = self.len();
        let k = ((q * n as f64).ceil() as u64).clamp(1, n.max(1));
        Beta::new(k as f64, (n + 1 - k) as f64).ok()
    }
}

fn latency_gate(
    a: &Ladder,
    b: &Ladder,
    q: f64,
    rule: &GateRule,
    rng: &mut ChaCha8Rng,
) -> Option<MetricGate> {
    let (ba, bb) = (a.bootstrap(q)?, b.bootstrap(q)?);
    let (va, vb) = (a.at(q), b.at(q));
    let ratio = |x: u64, y: u64| x as f64 / y.max(1) as f64;
    let changes: Vec<f64> = (0..rule.replicates)
        .map(|_| {
            let ra = a.at(ba.sample(rng));
            let rb = b.at(bb.sample(rng));
            ratio(rb, ra) - 1.0
        })
        .collect();
    Some(judge(
        "us",
        va as f64,
        vb as f64,
        ratio(vb, va) - 1.0,
        changes,
        rule.tolerance,
        rule.confidence,
    ))
}

fn share_gate(a: Counts, b: Counts, rule: &GateRule, rng: &mut ChaCha8Rng) -> Option<MetricGate> {
    let share = |c: Counts| c.failed.min(c.sent) as f64 / c.sent as f64;
    let (sa, sb) = (share(a), share(b));
    let (da, db) = (
        Binomial::new(a.sent, sa).ok()?,
        Binomial::new(b.sent, sb).ok()?,
    );
    let changes: Vec<f64> = (0..rule.replicates)
        .map(|_| {
            let ra = da.sample(rng) as f64 / a.sent as f64;
            let rb = db.sample(rng) as f64 / b.sent as f64;
            rb - ra
        })
        .collect();
    Some(judge(
        "share",
        sa,
        sb,
        sb - sa,
        changes,
        rule.error_tolerance,
        rule.confidence,
    ))
}

/// The percentile interval of the replicated `changes` and the decision.
fn judge(
    unit: &str,
    a: f64,
    b: f64,
    change: f64,
    mut changes: Vec<f64>,
    tolerance: f64,
    confidence: f64,
) -> MetricGate {
    changes.sort_by(f64::total_cmp);
    let interval = percentile_interval(&changes, confidence);
    MetricGate {
        unit: unit.to_string(),
        a,
        b,
        change,
        interval,
        regressed: change > tolerance && interval[0] > 0.0,
        improved: better_by(unit, change) > tolerance && interval[1] < 0.0,
    }
}

/// How much better a change is, on the tolerance's scale: A / B - 1 for a
/// relative change (B / A - 1), minus the change in points for a share.
fn better_by(unit: &str, change: f64) -> f64 {
    if unit == "us" {
        1.0 / (1.0 + change).max(f64::MIN_POSITIVE) - 1.0
    } else {
        -change
    }
}

/// The central `confidence` interval of `sorted` (ascending), or
/// `[0, 0]` when empty.
fn percentile_interval(sorted: &[f64], confidence: f64) -> [f64; 2] {
    let n = sorted.len();
    if n == 0 {
        return [0.0, 0.0];
    }
    let tail = (1.0 - confidence) / 2.0;
    let lo = ((tail * n as f64).floor() as usize).min(n - 1);
    let hi = (((1.0 - tail) * n as f64).ceil() as usize).clamp(1, n) - 1;
    [sorted[lo], sorted[hi]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{new_histogram, record_us};
    use crate::testing::summary;
    use rand::Rng;

    /// 500 values from 1 ms up, each 0.5 % above the one before: far apart
    /// for a 3-digit histogram, so ranks stay distinct.
    fn spread_sample() -> Vec<u64> {
        (0..500)
            .map(|i| (1000.0 * 1.005f64.powi(i)).round() as u64)
            .collect()
    }

    fn histogram_of(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = new_histogram();
        for v in values {
            record_us(&mut h, v);
        }
        h
    }

    /// The share of `sorted` at or below `x`.
    fn cdf(sorted: &[u64], x: u64) -> f64 {
        sorted.partition_point(|&v| v <= x) as f64 / sorted.len() as f64
    }

    #[test]
    fn the_ladder_reads_quantiles_as_the_histogram_does() {
        let h = histogram_of(spread_sample().into_iter().chain([5, 5, 5, 70_000]));
        let ladder = Ladder::of(&h);
        assert_eq!(ladder.len(), 504);
        for q in [0.0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(ladder.at(q), h.value_at_quantile(q.max(1e-9)), "q {q}");
        }
    }

    #[test]
    fn the_beta_shortcut_matches_resampling_on_a_small_sample() {
        let sample = spread_sample();
        let h = histogram_of(sample.iter().copied());
        let ladder = Ladder::of(&h);
        let n = sample.len();
        let replicates = 4000;
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for q in [0.5, 0.99] {
            let k = (q * n as f64).ceil() as usize;
            // By brute force: resample n values, take the k-th smallest.
            let mut brute: Vec<u64> = (0..replicates)
                .map(|_| {
                    let mut draw: Vec<usize> = (0..n).map(|_| rng.random_range(0..n)).collect();
                    draw.sort_unstable();
                    h.highest_equivalent(sample[draw[k - 1]])
                })
                .collect();
            let beta = ladder.bootstrap(q).expect("a valid Beta");
            let mut shortcut: Vec<u64> = (0..replicates)
                .map(|_| ladder.at(beta.sample(&mut rng)))
                .collect();
            brute.sort_unstable();
            shortcut.sort_unstable();
            // The two distributions agree everywhere (two-sample
            // Kolmogorov distance; 0.044 is its 0.1 % critical value at
            // these sizes). k off by one moves the shortcut by a rank,
            // about 0.07 (p50) and 0.16 (p99) of probability.
            let distance = sample
                .iter()
                .map(|&x| {
                    let x = h.highest_equivalent(x);
                    (cdf(&brute, x) - cdf(&shortcut, x)).abs()
                })
                .fold(0.0, f64::max);
            assert!(distance < 0.044, "q {q}: distance {distance}");
            // And so do their 2.5 % and 97.5 % points, within 2 %.
            let to_f = |v: &Vec<u64>| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let (ib, is) = (
                percentile_interval(&to_f(&brute), 0.95),
                percentile_interval(&to_f(&shortcut), 0.95),
            );
            for (x, y) in ib.iter().zip(is) {
                assert!((x / y - 1.0).abs() < 0.02, "q {q}: {ib:?} vs {is:?}");
            }
        }
    }

    /// A summary like `testing::summary` whose one variant has `ok`
    /// latencies from an exponential law with mean `mean_us` (seeded by
    /// `seed`), and `failed` of `sent` requests failed.
    fn run(ok: u64, mean_us: f64, failed: u64, seed: u64) -> Summary {
        let mut s = summary();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let exp = rand_distr::Exp::new(1.0 / mean_us).expect("positive rate");
        let v = &mut s.variants[0];
        v.latency_histogram = histogram_of((0..ok).map(|_| 100 + exp.sample(&mut rng) as u64));
        v.ok = ok;
        v.sent = ok + failed;
        v.errors.clear();
        v.errors.insert("unavailable".into(), failed);
        v.timeouts = 0;
        s
    }

    fn judged(a: &Summary, b: &Summary) -> GateReport {
        gate(a, "runs/a", b, "runs/b", &GateRule::default())
    }

    #[test]
    fn identical_runs_pass() {
        let a = run(5000, 2000.0, 5, 1);
        let report = judged(&a, &a);
        assert_eq!(report.verdict, GateVerdict::Pass, "{report:#?}");
        let v = &report.variants[0];
        assert_eq!(v.metrics.named().count(), 3);
        for (name, m) in v.metrics.named() {
            assert_eq!(m.change, 0.0, "{name}");
            assert!(m.interval[0] < 0.0 && m.interval[1] > 0.0, "{name}: {m:?}");
            assert!(!m.regressed && !m.improved, "{name}");
        }
        assert!(report.reasons.is_empty() && report.notes.is_empty());
        // Two draws of the same law, different seeds, pass too.
        let b = run(5000, 2000.0, 5, 2);
        assert_eq!(judged(&a, &b).verdict, GateVerdict::Pass);
    }

    #[test]
    fn a_b_three_times_slower_regresses_on_p99_and_names_it() {
        let a = run(5000, 2000.0, 0, 1);
        let b = run(5000, 6000.0, 0, 2);
        let report = judged(&a, &b);
        assert_eq!(report.verdict, GateVerdict::Regressed, "{report:#?}");
        let v = &report.variants[0];
        assert_eq!(
            (v.name.as_str(), v.verdict),
            ("base", GateVerdict::Regressed)
        );
        let p99 = v.metrics.p99.as_ref().expect("p99 judged");
        assert!(p99.regressed && p99.change > 1.5, "{p99:?}");
        assert!(p99.interval[0] > DEFAULT_TOLERANCE, "{p99:?}");
        assert!(p99.b > p99.a && p99.unit == "us");
        assert!(!v.metrics.error_share.as_ref().expect("judged").regressed);
        // The other way round it is an improvement, not a failure.
        let back = judged(&b, &a);
        assert_eq!(back.verdict, GateVerdict::Pass);
        let p99 = back.variants[0].metrics.p99.as_ref().expect("p99 judged");
        assert!(p99.improved && !p99.regressed, "{p99:?}");
        // Three times faster mirrors three times slower: improved beyond a
        // 100 % tolerance too, though its change is above -100 %.
        let wide = GateRule {
            tolerance: 1.0,
            ..GateRule::default()
        };
        let back = gate(&b, "b", &a, "a", &wide);
        let p99 = back.variants[0].metrics.p99.as_ref().expect("p99 judged");
        assert!(p99.improved && p99.change > -1.0, "{p99:?}");
    }

    #[test]
    fn a_change_within_tolerance_passes_even_when_significant() {
        const { assert!(DEFAULT_TOLERANCE > 0.1) };
        // 10 % slower with 200 000 requests each: the interval excludes no
        // change, but the change is within the default tolerance.
        let a = run(200_000, 2000.0, 0, 1);
        let b = run(200_000, 2200.0, 0, 2);
        let report = judged(&a, &b);
        let p50 = report.variants[0].metrics.p50.as_ref().expect("judged");
        assert!(p50.interval[0] > 0.05, "significant: {p50:?}");
        assert!(!p50.regressed);
        assert_eq!(report.verdict, GateVerdict::Pass, "{report:#?}");
        // A tighter tolerance fails it.
        let strict = GateRule {
            tolerance: 0.05,
            ..GateRule::default()
        };
        let report = gate(&a, "a", &b, "b", &strict);
        assert_eq!(report.verdict, GateVerdict::Regressed);
    }

    #[test]
    fn a_change_beyond_tolerance_that_chance_explains_passes() {
        // 150 ok requests each (the floor lowered for the test): p99 rests
        // on the two slowest, so B's 50 % slower law, beyond the
        // tolerance, is still within what chance explains.
        let rule = GateRule {
            min_ok: 100,
            ..GateRule::default()
        };
        let a = run(150, 2000.0, 0, 1);
        let b = run(150, 3000.0, 0, 2);
        let report = gate(&a, "a", &b, "b", &rule);
        let p99 = report.variants[0].metrics.p99.as_ref().expect("judged");
        assert!(p99.change > rule.tolerance, "{p99:?}");
        assert!(p99.interval[0] <= 0.0, "{p99:?}");
        assert!(!p99.regressed);
        assert_ne!(report.verdict, GateVerdict::Regressed, "{report:#?}");
    }

    #[test]
    fn fewer_than_1000_ok_is_inconclusive() {
        let a = run(5000, 2000.0, 0, 1);
        let b = run(999, 2000.0, 0, 2);
        let report = judged(&a, &b);
        assert_eq!(report.verdict, GateVerdict::Inconclusive, "{report:#?}");
        let v = &report.variants[0];
        assert!(v.metrics.p99.is_none() && v.metrics.p50.is_none());
        assert!(v.metrics.error_share.is_some());
        assert_eq!(report.reasons.len(), 1, "{:?}", report.reasons);
        assert!(
            report.reasons[0].contains("\"base\"") && report.reasons[0].contains("999"),
            "{:?}",
            report.reasons
        );
        // Errors that regress still fail it: nothing to wait for.
        let b = run(999, 2000.0, 500, 2);
        assert_eq!(judged(&a, &b).verdict, GateVerdict::Regressed);
    }

    #[test]
    fn more_errors_regress_on_error_share() {
        let a = run(5000, 2000.0, 10, 1);
        let b = run(5000, 2000.0, 100, 1);
        let report = judged(&a, &b);
        assert_eq!(report.verdict, GateVerdict::Regressed, "{report:#?}");
        let share = report.variants[0]
            .metrics
            .error_share
            .as_ref()
            .expect("judged");
        assert!(share.regressed && share.unit == "share", "{share:?}");
        assert!((share.change - (100.0 / 5100.0 - 10.0 / 5010.0)).abs() < 1e-12);
        assert!(share.interval[0] > 0.0);
        // Within the 0.5-point tolerance: 10 more of 5000.
        let b = run(5000, 2000.0, 20, 1);
        assert_eq!(judged(&a, &b).verdict, GateVerdict::Pass);
    }

    #[test]
    fn runs_that_cannot_be_compared_are_inconclusive_with_their_reasons() {
        let a = run(5000, 2000.0, 0, 1);
        let mut b = run(5000, 6000.0, 0, 2);
        b.scenario.seed += 1;
        b.interrupted = true;
        let report = judged(&a, &b);
        // Slower, but the runs' faults differ: not a verdict on the code.
        assert_eq!(report.verdict, GateVerdict::Inconclusive);
        assert!(
            report.variants[0]
                .metrics
                .p99
                .as_ref()
                .is_some_and(|m| m.regressed)
        );
        let reasons = report.reasons.join("\n");
        assert!(reasons.contains("different seeds") && reasons.contains("run B was interrupted"));

        let mut b = run(5000, 2000.0, 0, 2);
        b.variants[0].name = "other".into();
        let report = judged(&a, &b);
        assert_eq!(report.verdict, GateVerdict::Inconclusive);
        assert_eq!(report.reasons, ["the runs share no variant"]);
        assert_eq!(
            report.notes,
            [
                "variant \"other\" is only in run B: not compared",
                "variant \"base\" is only in run A: not compared"
            ]
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_report() {
        let a = run(3000, 2000.0, 3, 1);
        let b = run(3000, 2100.0, 4, 2);
        assert_eq!(judged(&a, &b), judged(&a, &b));
        let other = GateRule {
            seed: 9,
            ..GateRule::default()
        };
        assert_ne!(judged(&a, &b), gate(&a, "runs/a", &b, "runs/b", &other));
    }
}
