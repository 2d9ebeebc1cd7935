//! Composing latency distributions: what a mesh's end-to-end latency
//! should be, predicted from its hops' latencies, to hold against what was
//! measured.
//!
//! A [`Dist`] is a latency distribution on a linear [`Grid`]: `bins` bins of
//! width `bin` (at least 1 µs, at most [`MAX_BINS`] bins; [`grid_for`] picks
//! the width for a horizon such as the load's timeout). Bin `k` holds the
//! probability of a latency in `[k * bin, (k + 1) * bin)`, spread uniformly
//! across the bin; `beyond` holds the probability of a latency past the grid,
//! including requests that timed out or failed (censored: never dropped).
//! Invariant: every mass is finite and non-negative, and the bins and
//! `beyond` sum to 1 (constructors and operations normalize); trailing empty
//! bins are trimmed, so a short distribution on a long grid stays cheap.
//!
//! The rules, each an operation returning a new `Dist` on the same grid
//! (two grids that differ are a programming error, asserted):
//! - a chain, or the segments of one hop: the sum of the times,
//!   [`Dist::then`], a convolution (direct for small operands, FFT for large);
//! - a fan-out that waits for all: the maximum, [`Dist::max_of`], the product
//!   of the CDFs (`beyond` counts as infinitely late); the first of several:
//!   [`Dist::min_of`], the product of the survival functions;
//! - a constant added: [`Dist::shift`];
//! - a hedge sent `after` a delay: `min(X1, after + X2)`, [`Dist::hedge`];
//! - retries: a mixture over the number of failed attempts of
//!   `failed * k + ok`, all attempts failed into `beyond`, [`Dist::retry`];
//! - a timeout: the mass at or past it moves to `beyond`, [`Dist::truncate`];
//! - a mixture of paths (replicas, slow and fast requests): [`Dist::mix`].
//!
//! Independence is assumed on purpose: every rule treats its operands as
//! independent (two hops, two copies of a hedged request, two attempts).
//! That is the model whose prediction the measurement is checked against; a
//! measured tail worse than the prediction shows the dependence (a shared
//! queue, a slow machine) that the model leaves out.
//!
//! Accuracy is the grid's resolution. Given distributions that are uniform
//! within each bin, every operation computes the result's bin masses exactly
//! (the sum of two bins' uniforms is a triangle over two bins, split half
//! and half; a CDF product is exact at the bin edges; a shift or a timeout
//! inside a bin splits it in proportion) up to rounding, and keeps a
//! convolution's mean exact. The approximation is the shape within a bin, so
//! a quantile is good to about one bin per operation behind it, and a point
//! mass ([`Dist::point`], a `Fixed` duration, [`Dist::zero`]) stands for a
//! value somewhere in its bin: chaining with `zero()` adds half a bin on
//! average, [`Dist::shift`] adds a constant exactly. An FFT's rounding noise
//! (about 1e-16 of the largest bin, clamped at 0) bounds how small a
//! tail mass is meaningful after a large convolution.
//!
//! [`bootstrap_quantiles`] gives percentile bootstrap intervals for a
//! measured histogram's quantiles, to tell whether a prediction's miss is
//! more than the measurement's noise.

use std::time::Duration;

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Binomial, Distribution};
use rustfft::FftPlanner;
use rustfft::num_complex::Complex;
use tailmesh_model::DurationDist;
use tailmesh_model::MAX_DRAW;

/// The most bins a grid has: 2^20, so a convolution's FFT (twice the grid)
/// stays at 32 MiB of complex numbers.
pub const MAX_BINS: usize = 1 << 20;

/// The finest bin: 1 µs, the resolution of the measured histograms.
pub const MIN_BIN: Duration = Duration::from_micros(1);

/// A convolution is direct when the product of the operands' lengths is at
/// most this many times `n log2 n` of the FFT's size `n`. Measured on the
/// 2-core machine (release build, rustfft 6.4): direct convolution costs
/// about 0.4 ns per product, the FFT route about 6 ns per `n log2 n`; at
/// 256 x 16384 bins the two took the same time (1.5 ms), 64 x 65536 was 8
/// times faster direct, 1024 x 1024 3 times faster by FFT.
const DIRECT_FACTOR: f64 = 10.0;

/// A declared distribution's tail below this survival is negligible: the
/// bins stop there (and the rest is normalized away).
const NEGLIGIBLE: f64 = 1e-17;

/// How far a quantile may reach past the grid's mass, for rounding, before
/// it falls into `beyond`.
const QUANTILE_SLACK: f64 = 1e-12;

/// The bin width that lets `horizon` fit in [`MAX_BINS`] bins: whole
/// microseconds, at least 1 µs.
pub fn grid_for(horizon: Duration) -> Duration {
    let per_bin = horizon.as_nanos().div_ceil(MAX_BINS as u128);
    let micros = per_bin.div_ceil(1000).max(1);
    Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
}

/// Why a grid or a distribution could not be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ComposeError {
    #[error("bin width {bin:?} is finer than the 1 µs grid resolution")]
    BinTooFine { bin: Duration },
    #[error(
        "a {horizon:?} horizon in {bin:?} bins needs {bins} bins, more than {MAX_BINS}: use a bin of at least {:?}",
        grid_for(*horizon)
    )]
    TooManyBins {
        bin: Duration,
        horizon: Duration,
        bins: u128,
    },
    #[error(
        "no latency to build a distribution from: the histogram is empty and nothing was censored"
    )]
    Empty,
}

/// A linear grid: `bins` bins of width `bin`, covering `[0, bin * bins)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    bin: Duration,
    bins: usize,
}

impl Grid {
    /// The grid of `bin`-wide bins that covers `horizon` (at least one bin).
    pub fn new(bin: Duration, horizon: Duration) -> Result<Grid, ComposeError> {
        if bin < MIN_BIN {
            return Err(ComposeError::BinTooFine { bin });
        }
        let bins = horizon.as_nanos().div_ceil(bin.as_nanos()).max(1);
        if bins > MAX_BINS as u128 {
            return Err(ComposeError::TooManyBins { bin, horizon, bins });
        }
        Ok(Grid {
            bin,
            bins: bins as usize,
        })
    }

    /// The finest grid that covers `horizon` ([`grid_for`]'s bin width).
    pub fn for_horizon(horizon: Duration) -> Grid {
        let bin = grid_for(horizon);
        let bins = horizon.as_nanos().div_ceil(bin.as_nanos()).max(1);
        Grid {
            bin,
            bins: usize::try_from(bins).unwrap_or(MAX_BINS).min(MAX_BINS),
        }
    }

    pub fn bin(&self) -> Duration {
        self.bin
    }

    pub fn bins(&self) -> usize {
        self.bins
    }

    /// Where the grid ends: latencies from here on are `beyond`.
    pub fn horizon(&self) -> Duration {
        u32::try_from(self.bins)
            .ok()
            .and_then(|bins| self.bin.checked_mul(bins))
            .unwrap_or(Duration::MAX)
    }

    /// `t` in bins (fractional).
    fn position(&self, t: Duration) -> f64 {
        t.as_nanos() as f64 / self.bin.as_nanos() as f64
    }

    /// `position` bins as a duration.
    fn duration_at(&self, position: f64) -> Duration {
        Duration::try_from_secs_f64(position.max(0.0) * self.bin.as_secs_f64())
            .unwrap_or(Duration::MAX)
    }
}

/// A latency distribution on a grid (see the module doc for the model and
/// its invariant).
#[derive(Clone, Debug, PartialEq)]
pub struct Dist {
    grid: Grid,
    /// Probability of a latency in bin k, for k below the grid's bins; the
    /// last entry, if any, is not 0.
    mass: Vec<f64>,
    /// Probability of a latency past the grid (censored included).
    beyond: f64,
}

impl Dist {
    /// A measured distribution: each recorded count (µs) spread across the
    /// latencies its histogram bucket stands for (a value `v` µs is a latency
    /// in `[v, v + 1)` µs), `censored` requests (timed out, failed) beyond.
    pub fn from_histogram(
        h: &Histogram<u64>,
        censored: u64,
        grid: Grid,
    ) -> Result<Dist, ComposeError> {
        if h.is_empty() && censored == 0 {
            return Err(ComposeError::Empty);
        }
        let mut acc = Accumulator::new(grid);
        let us = 1000.0 / grid.bin.as_nanos() as f64;
        for step in h.iter_recorded() {
            let value = step.value_iterated_to();
            let lo = h.lowest_equivalent(value) as f64 * us;
            let hi = (h.highest_equivalent(value) as f64 + 1.0) * us;
            acc.spread(lo, hi, step.count_at_value() as f64);
        }
        acc.beyond += censored as f64;
        Ok(acc.finish())
    }

    /// The distribution a hop's declared duration is drawn from, as the hop
    /// draws it (`services::hop::draw::sample`): bins by CDF differences, the
    /// rest beyond; capped at the draw's one-hour maximum, and parameters
    /// the sampler cannot use give 0 as they do there.
    pub fn declared(dist: &DurationDist, grid: Grid) -> Dist {
        match dist {
            DurationDist::Fixed { value } => Dist::point(grid, (*value).min(MAX_DRAW)),
            DurationDist::Uniform { min, max } => {
                if min >= max {
                    return Dist::point(grid, *min);
                }
                // The draw caps at one hour: the part above is drawn as that.
                let top = (*max).min(MAX_DRAW).max(*min);
                let over = (*max - top).as_secs_f64() / (*max - *min).as_secs_f64();
                let mut acc = Accumulator::new(grid);
                if top > *min {
                    acc.spread(grid.position(*min), grid.position(top), 1.0 - over);
                }
                acc.spread(grid.position(top), grid.position(top), over);
                acc.finish()
            }
            DurationDist::Exp { mean } => {
                let m = mean.as_secs_f64();
                if !(m > 0.0 && m.is_finite()) {
                    return Dist::zero(grid);
                }
                Dist::from_law(grid, |t| (-(-t / m).exp_m1(), (-t / m).exp()))
            }
            DurationDist::Lognormal { mean, sigma } => {
                let m = mean.as_secs_f64();
                if !(m > 0.0 && *sigma >= 0.0 && sigma.is_finite()) {
                    return Dist::zero(grid);
                }
                if *sigma == 0.0 {
                    return Dist::point(grid, (*mean).min(MAX_DRAW));
                }
                let mu = m.ln() - sigma * sigma / 2.0;
                Dist::from_law(grid, |t| {
                    if t <= 0.0 {
                        return (0.0, 1.0);
                    }
                    normal_cdf((t.ln() - mu) / sigma)
                })
            }
            DurationDist::Empirical { quantiles } => {
                // Each step between two points holds its share of the
                // mass, spread evenly over its values (at one value when
                // they are equal), as the quantile function drawn
                // straight between them gives.
                let mut acc = Accumulator::new(grid);
                for pair in quantiles.windows(2) {
                    let [(q0, v0), (q1, v1)] = [pair[0], pair[1]];
                    if q1 > q0 {
                        let (lo, hi) = (v0.min(MAX_DRAW), v1.min(MAX_DRAW));
                        acc.spread(grid.position(lo), grid.position(hi), q1 - q0);
                    }
                }
                acc.finish()
            }
        }
    }

    /// The product-limit (Kaplan-Meier) estimate of a time measured on
    /// some requests (`events`, µs) and only known to exceed a value on
    /// others (`censored`, µs: an attempt cancelled when another answered
    /// first). At each recorded value the survival drops by the share of
    /// those still at risk whose time ended there; a value censored at the
    /// same time as events counts as at risk for them. The survival left
    /// after the last event (the largest times were all censored) is
    /// beyond: the estimate says nothing about where it lies.
    pub fn kaplan_meier(
        events: &Histogram<u64>,
        censored: &Histogram<u64>,
        grid: Grid,
    ) -> Result<Dist, ComposeError> {
        if events.is_empty() {
            return Err(ComposeError::Empty);
        }
        let mut times: Vec<(u64, u64, u64)> = events
            .iter_recorded()
            .map(|s| (s.value_iterated_to(), s.count_at_value(), 0))
            .chain(
                censored
                    .iter_recorded()
                    .map(|s| (s.value_iterated_to(), 0, s.count_at_value())),
            )
            .collect();
        times.sort_unstable_by_key(|t| t.0);
        let mut at_risk = (events.len() + censored.len()) as f64;
        let mut survival = 1.0;
        let mut acc = Accumulator::new(grid);
        let us = 1000.0 / grid.bin.as_nanos() as f64;
        for (value, ended, cut) in times {
            if ended > 0 && at_risk > 0.0 {
                let drop = survival * ended as f64 / at_risk;
                let lo = events.lowest_equivalent(value) as f64 * us;
                let hi = (events.highest_equivalent(value) as f64 + 1.0) * us;
                acc.spread(lo, hi, drop);
                survival -= drop;
            }
            at_risk -= (ended + cut) as f64;
        }
        acc.beyond += survival.max(0.0);
        Ok(acc.finish())
    }

    /// The distribution given that the latency is on the grid, with
    /// `beyond` set to `censored` instead: the shape of the answered
    /// requests, with the share that did not answer taken as given.
    pub fn with_beyond(&self, censored: f64) -> Dist {
        let censored = censored.clamp(0.0, 1.0);
        let on_grid = self.on_grid();
        if on_grid <= 0.0 || censored >= 1.0 {
            let mut acc = Accumulator::new(self.grid);
            acc.beyond = 1.0;
            return acc.finish();
        }
        let mut acc = Accumulator::from_mass(
            self.grid,
            self.mass
                .iter()
                .map(|m| m / on_grid * (1.0 - censored))
                .collect(),
        );
        acc.beyond = censored;
        acc.finish()
    }

    /// All mass at `d` (within its bin; past the grid, beyond).
    pub fn point(grid: Grid, d: Duration) -> Dist {
        let mut acc = Accumulator::new(grid);
        acc.spread(grid.position(d), grid.position(d), 1.0);
        acc.finish()
    }

    /// All mass in the first bin: no time, to within a bin.
    pub fn zero(grid: Grid) -> Dist {
        Dist::point(grid, Duration::ZERO)
    }

    /// Bins from a law's `(F(t), 1 - F(t))` at each edge (t in seconds),
    /// differences of whichever is smaller so the tail keeps its digits.
    fn from_law(grid: Grid, law: impl Fn(f64) -> (f64, f64)) -> Dist {
        let bin = grid.bin.as_secs_f64();
        let cap = MAX_DRAW.as_secs_f64();
        let mut mass = Vec::new();
        let (mut f, mut s) = law(0.0);
        let mut edge = 0.0;
        for k in 0..grid.bins {
            if s < NEGLIGIBLE || edge >= cap {
                break;
            }
            let next = ((k + 1) as f64 * bin).min(cap);
            let (f1, s1) = law(next);
            mass.push(if f1 <= 0.5 { f1 - f } else { s - s1 }.max(0.0));
            (f, s, edge) = (f1, s1, next);
        }
        let mut acc = Accumulator::from_mass(grid, mass);
        if s >= NEGLIGIBLE {
            // The draw's cap: the tail past one hour is drawn as one hour.
            if edge >= cap {
                acc.spread(grid.position(MAX_DRAW), grid.position(MAX_DRAW), s);
            } else {
                acc.beyond += s;
            }
        }
        acc.finish()
    }

    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// The bins' masses (trailing empty bins trimmed).
    pub fn mass(&self) -> &[f64] {
        &self.mass
    }

    /// The probability of a latency past the grid: censored requests and
    /// any mass that left the grid.
    pub fn beyond(&self) -> f64 {
        self.beyond
    }

    fn on_grid(&self) -> f64 {
        self.mass.iter().sum()
    }

    fn same_grid(&self, other: &Dist) {
        assert_eq!(
            self.grid, other.grid,
            "distributions on different grids cannot be composed"
        );
    }

    /// `X + Y` for independent `X` (self) and `Y` (other): a chain of two
    /// hops, or two segments of one.
    pub fn then(&self, other: &Dist) -> Dist {
        self.same_grid(other);
        let (a, b) = (&self.mass, &other.mass);
        let mut acc = Accumulator::new(self.grid);
        if !a.is_empty() && !b.is_empty() {
            let sum = convolve(a, b, self.grid.bins);
            // Uniforms on bins i and j sum to a triangle on bins i + j and
            // i + j + 1, half in each.
            for (k, m) in sum.iter().enumerate() {
                acc.add(k, m / 2.0);
                acc.add(k + 1, m / 2.0);
            }
            // The terms past the grid were not computed: their mass is
            // what the computed ones leave of the product of the masses.
            if a.len() + b.len() - 1 > sum.len() {
                let computed: f64 = sum.iter().sum();
                acc.beyond += (self.on_grid() * other.on_grid() - computed).max(0.0);
            }
        }
        acc.beyond += self.beyond + other.beyond - self.beyond * other.beyond;
        acc.finish()
    }

    /// The maximum of independent latencies: a fan-out that waits for every
    /// branch. `beyond` counts as infinitely late.
    ///
    /// # Panics
    /// On an empty slice or different grids.
    pub fn max_of(dists: &[Dist]) -> Dist {
        let first = dists
            .first()
            .expect("max_of needs at least one distribution");
        dists.iter().for_each(|d| first.same_grid(d));
        let len = dists.iter().map(|d| d.mass.len()).max().unwrap_or(0);
        let mut cdfs = vec![0.0; dists.len()];
        let mut below = 0.0;
        let mut mass = Vec::with_capacity(len);
        for k in 0..len {
            for (cdf, d) in cdfs.iter_mut().zip(dists) {
                *cdf += d.mass.get(k).copied().unwrap_or(0.0);
            }
            let upto: f64 = cdfs.iter().product();
            mass.push((upto - below).max(0.0));
            below = upto;
        }
        let mut acc = Accumulator::from_mass(first.grid, mass);
        acc.beyond = 1.0 - dists.iter().map(|d| 1.0 - d.beyond).product::<f64>();
        acc.finish()
    }

    /// The minimum of independent latencies: the first answer of several.
    ///
    /// # Panics
    /// On an empty slice or different grids.
    pub fn min_of(dists: &[Dist]) -> Dist {
        let first = dists
            .first()
            .expect("min_of needs at least one distribution");
        dists.iter().for_each(|d| first.same_grid(d));
        let len = dists.iter().map(|d| d.mass.len()).max().unwrap_or(0);
        // Survival at each bin's lower edge, from the top so the tail keeps
        // its digits.
        let survivals: Vec<Vec<f64>> = dists
            .iter()
            .map(|d| {
                let mut s = vec![d.beyond; len + 1];
                for k in (0..len).rev() {
                    s[k] = s[k + 1] + d.mass.get(k).copied().unwrap_or(0.0);
                }
                s
            })
            .collect();
        let joint = |k: usize| survivals.iter().map(|s| s[k]).product::<f64>();
        let mass = (0..len)
            .map(|k| (joint(k) - joint(k + 1)).max(0.0))
            .collect();
        let mut acc = Accumulator::from_mass(first.grid, mass);
        acc.beyond = joint(len);
        acc.finish()
    }

    /// `X + d`, exact: a shift by part of a bin splits each bin in
    /// proportion.
    pub fn shift(&self, d: Duration) -> Dist {
        let by = self.grid.position(d);
        let frac = by - by.floor();
        let mut acc = Accumulator::new(self.grid);
        // Past the grid, all is beyond; no index overflows on the way.
        let whole = by.floor().min(self.grid.bins as f64) as usize;
        for (k, m) in self.mass.iter().enumerate() {
            acc.add(k + whole, m * (1.0 - frac));
            acc.add(k + whole + 1, m * frac);
        }
        acc.beyond += self.beyond;
        acc.finish()
    }

    /// `X - d`, at least 0: the mirror of [`Dist::shift`], the mass that
    /// would fall below 0 in the first bin.
    pub fn shift_back(&self, d: Duration) -> Dist {
        let by = self.grid.position(d);
        let frac = by - by.floor();
        let whole = by.floor();
        let mut acc = Accumulator::new(self.grid);
        for (k, m) in self.mass.iter().enumerate() {
            let at = k as f64 - whole;
            acc.add((at.max(0.0)) as usize, m * (1.0 - frac));
            acc.add(((at - 1.0).max(0.0)) as usize, m * frac);
        }
        acc.beyond += self.beyond;
        acc.finish()
    }

    /// The distribution with each bin's mass weighted by `weight(t)`, `t`
    /// the bin's middle, and normalized (`beyond` keeps its weight 1): an
    /// importance reweighting, as of a sample drawn with a bias known per
    /// value. Falls back to `self` when no weighted mass is left.
    pub fn reweighted(&self, weight: impl Fn(Duration) -> f64) -> Dist {
        let mut acc = Accumulator::new(self.grid);
        for (k, m) in self.mass.iter().enumerate() {
            let w = weight(self.grid.duration_at(k as f64 + 0.5));
            if w.is_finite() && w > 0.0 {
                acc.add(k, m * w);
            }
        }
        acc.beyond += self.beyond;
        if acc.mass.iter().sum::<f64>() + acc.beyond <= 0.0 {
            return self.clone();
        }
        acc.finish()
    }

    /// A hedged request: a second copy is sent `after` the first unless the
    /// first has answered, and the first answer wins: `min(X1, after + X2)`.
    pub fn hedge(&self, after: Duration) -> Dist {
        Dist::min_of(&[self.clone(), self.shift(after)])
    }

    /// Attempts with retries: an attempt fails with `p_fail` after a time
    /// drawn from `failed`, else succeeds after a time drawn from `ok`; up to
    /// `retries` more attempts follow a failure, and when all fail the
    /// request is beyond. The mixture over `k` failures of
    /// `p_fail^k (1 - p_fail)` times `failed * k + ok`.
    ///
    /// # Panics
    /// When `p_fail` is not in [0, 1] or the grids differ.
    pub fn retry(ok: &Dist, failed: &Dist, p_fail: f64, retries: u32) -> Dist {
        assert!(
            (0.0..=1.0).contains(&p_fail),
            "p_fail {p_fail} is not a probability"
        );
        ok.same_grid(failed);
        let mut parts = Vec::new();
        let mut weight = 1.0 - p_fail;
        let mut after_failures: Option<Dist> = None;
        for _ in 0..=retries {
            let success = match &after_failures {
                None => ok.clone(),
                Some(spent) => spent.then(ok),
            };
            if weight > 0.0 {
                parts.push((weight, success));
            }
            weight *= p_fail;
            if weight == 0.0 {
                break;
            }
            after_failures = Some(match after_failures {
                None => failed.clone(),
                Some(spent) => spent.then(failed),
            });
        }
        let all_failed = p_fail.powi(i32::try_from(retries).unwrap_or(i32::MAX).saturating_add(1));
        let mut acc = Accumulator::new(ok.grid);
        for (w, d) in &parts {
            acc.add_scaled(d, *w);
        }
        acc.beyond += all_failed;
        acc.finish()
    }

    /// A timeout: the mass at or past `timeout` moves to `beyond` (the bin
    /// it falls in, in proportion).
    pub fn truncate(&self, timeout: Duration) -> Dist {
        let at = self.grid.position(timeout);
        let mut acc = Accumulator::new(self.grid);
        for (k, m) in self.mass.iter().enumerate() {
            let kept = (at - k as f64).clamp(0.0, 1.0);
            acc.add(k, m * kept);
            acc.beyond += m * (1.0 - kept);
        }
        acc.beyond += self.beyond;
        acc.finish()
    }

    /// A mixture: each distribution with probability proportional to its
    /// weight.
    ///
    /// # Panics
    /// When a weight is negative or not finite, all are 0, the slice is
    /// empty or the grids differ.
    pub fn mix(parts: &[(f64, Dist)]) -> Dist {
        let (_, first) = parts.first().expect("mix needs at least one distribution");
        assert!(
            parts.iter().all(|(w, _)| *w >= 0.0 && w.is_finite()),
            "mixture weights must be finite and non-negative"
        );
        let total: f64 = parts.iter().map(|(w, _)| w).sum();
        assert!(total > 0.0, "mixture weights sum to 0");
        let mut acc = Accumulator::new(first.grid);
        for (w, d) in parts {
            first.same_grid(d);
            acc.add_scaled(d, w / total);
        }
        acc.finish()
    }

    /// The latency below which a fraction `q` of requests fall (linear
    /// within a bin); `None` when `q` falls in `beyond` or is not in [0, 1].
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if !(0.0..=1.0).contains(&q)
            || q > 1.0 - self.beyond + QUANTILE_SLACK
            || self.mass.is_empty()
        {
            return None;
        }
        let mut below = 0.0;
        for (k, m) in self.mass.iter().enumerate() {
            if *m > 0.0 && below + m >= q {
                let within = ((q - below) / m).clamp(0.0, 1.0);
                return Some(self.grid.duration_at(k as f64 + within));
            }
            below += m;
        }
        // Rounding left q just past the last bin's mass.
        Some(self.grid.duration_at(self.mass.len() as f64))
    }

    /// The probability of a latency below `t`.
    pub fn cdf(&self, t: Duration) -> f64 {
        let at = self.grid.position(t);
        self.mass
            .iter()
            .enumerate()
            .map(|(k, m)| m * (at - k as f64).clamp(0.0, 1.0))
            .sum()
    }

    /// The mean of the latencies on the grid (`beyond` left out), `None`
    /// when all mass is beyond.
    pub fn mean(&self) -> Option<Duration> {
        let on_grid = self.on_grid();
        if on_grid <= 0.0 {
            return None;
        }
        let bins: f64 = self
            .mass
            .iter()
            .enumerate()
            .map(|(k, m)| m * (k as f64 + 0.5))
            .sum();
        Some(self.grid.duration_at(bins / on_grid))
    }
}

/// Builds a `Dist`: masses added bin by bin, whatever falls past the grid
/// into `beyond`, then clamped, trimmed and normalized.
struct Accumulator {
    grid: Grid,
    mass: Vec<f64>,
    beyond: f64,
}

impl Accumulator {
    fn new(grid: Grid) -> Accumulator {
        Accumulator {
            grid,
            mass: Vec::new(),
            beyond: 0.0,
        }
    }

    fn from_mass(grid: Grid, mass: Vec<f64>) -> Accumulator {
        let mut acc = Accumulator::new(grid);
        for (k, m) in mass.into_iter().enumerate() {
            acc.add(k, m);
        }
        acc
    }

    fn add(&mut self, k: usize, m: f64) {
        if m == 0.0 {
            return;
        }
        if k >= self.grid.bins {
            self.beyond += m;
            return;
        }
        if k >= self.mass.len() {
            self.mass.resize(k + 1, 0.0);
        }
        self.mass[k] += m;
    }

    fn add_scaled(&mut self, d: &Dist, w: f64) {
        for (k, m) in d.mass.iter().enumerate() {
            self.add(k, m * w);
        }
        self.beyond += d.beyond * w;
    }

    /// `m` spread uniformly over `[lo, hi)` (in bins); all in `lo`'s bin
    /// when the interval is empty.
    fn spread(&mut self, lo: f64, hi: f64, m: f64) {
        let lo = lo.max(0.0);
        if hi <= lo {
            self.add(lo.floor() as usize, m);
            return;
        }
        let end = hi.min(self.grid.bins as f64);
        if end < hi {
            self.beyond += m * (hi - end.max(lo)) / (hi - lo);
        }
        let mut k = lo.floor();
        while k < end {
            let overlap = (k + 1.0).min(end) - k.max(lo);
            self.add(k as usize, m * overlap / (hi - lo));
            k += 1.0;
        }
    }

    fn finish(mut self) -> Dist {
        for m in &mut self.mass {
            if !(m.is_finite() && *m > 0.0) {
                *m = 0.0;
            }
        }
        while self.mass.last() == Some(&0.0) {
            self.mass.pop();
        }
        let beyond = if self.beyond.is_finite() {
            self.beyond.max(0.0)
        } else {
            0.0
        };
        let total = self.mass.iter().sum::<f64>() + beyond;
        assert!(total > 0.0, "a distribution with no mass");
        self.mass.iter_mut().for_each(|m| *m /= total);
        Dist {
            grid: self.grid,
            mass: self.mass,
            beyond: beyond / total,
        }
    }
}

/// The convolution of `a` and `b`, its first `limit` terms at most: direct
/// for small operands, by FFT for large ones (see [`DIRECT_FACTOR`]).
fn convolve(a: &[f64], b: &[f64], limit: usize) -> Vec<f64> {
    let len = (a.len() + b.len() - 1).min(limit);
    let n = (a.len() + b.len() - 1).next_power_of_two();
    let fft_cost = n as f64 * (n as f64).log2().max(1.0);
    if (a.len() as f64) * (b.len() as f64) <= DIRECT_FACTOR * fft_cost {
        convolve_direct(a, b, len)
    } else {
        convolve_fft(a, b, len)
    }
}

fn convolve_direct(a: &[f64], b: &[f64], len: usize) -> Vec<f64> {
    let mut out = vec![0.0; len];
    for (i, x) in a.iter().enumerate().take(len) {
        if *x == 0.0 {
            continue;
        }
        for (o, y) in out[i..].iter_mut().zip(b) {
            *o += x * y;
        }
    }
    out
}

/// Both real inputs in one complex FFT (`a + i b`), the product of their
/// transforms from it, one inverse FFT; negative rounding noise clamped.
fn convolve_fft(a: &[f64], b: &[f64], len: usize) -> Vec<f64> {
    let n = (a.len() + b.len() - 1).next_power_of_two();
    let mut planner = FftPlanner::<f64>::new();
    let mut z: Vec<Complex<f64>> = (0..n)
        .map(|k| {
            Complex::new(
                a.get(k).copied().unwrap_or(0.0),
                b.get(k).copied().unwrap_or(0.0),
            )
        })
        .collect();
    planner.plan_fft_forward(n).process(&mut z);
    // With Z = A + iB: A_k = (Z_k + conj Z_-k) / 2, B_k = (Z_k - conj Z_-k) / 2i,
    // so A_k B_k = (Z_k^2 - (conj Z_-k)^2) / 4i.
    let quarter_over_i = Complex::new(0.0, -0.25);
    let mut product: Vec<Complex<f64>> = (0..n)
        .map(|k| {
            let zk = z[k];
            let zm = z[(n - k) % n].conj();
            (zk * zk - zm * zm) * quarter_over_i
        })
        .collect();
    planner.plan_fft_inverse(n).process(&mut product);
    product
        .iter()
        .take(len)
        .map(|c| (c.re / n as f64).max(0.0))
        .collect()
}

/// The standard normal's `(Φ(z), 1 - Φ(z))`, each to nearly full relative
/// precision.
fn normal_cdf(z: f64) -> (f64, f64) {
    let tail = 0.5 * erfc(z.abs() / std::f64::consts::SQRT_2);
    if z < 0.0 {
        (tail, 1.0 - tail)
    } else {
        (1.0 - tail, tail)
    }
}

/// The complementary error function for `x >= 0`: a series (all terms
/// positive) below 2, a continued fraction from 2 on (relative error below
/// 2e-13 on both sides, 1e-15 in the far tail).
fn erfc(x: f64) -> f64 {
    let x = x.max(0.0);
    if x < 2.0 {
        // erf x = 2/sqrt(pi) e^-x^2 sum_n 2^n x^(2n+1) / (1 3 5 ... (2n+1))
        let (mut term, mut sum, mut n) = (x, x, 0.0);
        while term > sum * 1e-17 {
            n += 1.0;
            term *= 2.0 * x * x / (2.0 * n + 1.0);
            sum += term;
        }
        1.0 - 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp() * sum
    } else {
        // erfc x = e^-x^2 / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))),
        // evaluated by the modified Lentz method.
        let tiny = 1e-300;
        let mut f = x;
        let (mut c, mut d) = (x, 0.0);
        for i in 1..200 {
            let a = i as f64 / 2.0;
            d = x + a * d;
            d = if d == 0.0 { tiny } else { 1.0 / d };
            c = x + a / c;
            if c == 0.0 {
                c = tiny;
            }
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / f
    }
}

/// A histogram's recorded values and their counts, in order.
fn recorded(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|s| (s.value_iterated_to(), s.count_at_value()))
        .collect()
}

/// One multinomial draw of `n` requests over categories seen `seen[i]`
/// times each (out of `n`): a binomial per category, in turn, of the
/// requests not yet placed, into `counts`. Costs the categories, not the
/// requests.
fn multinomial(seen: &[u64], n: u64, rng: &mut ChaCha8Rng, counts: &mut [u64]) {
    let (mut left, mut unseen) = (n, n);
    for (count, c) in counts.iter_mut().zip(seen) {
        *count = if left == 0 || *c == 0 {
            0
        } else if *c >= unseen {
            left
        } else {
            Binomial::new(left, *c as f64 / unseen as f64)
                .map(|b| b.sample(rng))
                .unwrap_or(0)
        };
        left -= *count;
        unseen = unseen.saturating_sub(*c);
    }
}

/// A bootstrap replicate of `h`: as many values, drawn with replacement
/// from its recorded ones.
pub fn resample(h: &Histogram<u64>, rng: &mut ChaCha8Rng) -> Histogram<u64> {
    let steps = recorded(h);
    let seen: Vec<u64> = steps.iter().map(|(_, c)| *c).collect();
    let mut counts = vec![0u64; steps.len()];
    multinomial(&seen, h.len(), rng, &mut counts);
    let mut out = Histogram::new_from(h);
    for ((value, _), count) in steps.iter().zip(&counts) {
        if *count > 0 {
            // Recorded values of `h` fit a histogram shaped like `h`.
            let _ = out.record_n(*value, *count);
        }
    }
    out
}

/// 95 % percentile bootstrap intervals (µs) for the quantiles `qs` of a
/// measured histogram with `censored` requests past every value: one
/// `(low, high)` per quantile, `None` where the bound falls among the
/// censored. Each replicate resamples the counts multinomially (the
/// censored requests are the last category), so it costs the histogram's
/// recorded values, not its requests. A quantile reads as the histogram
/// reads it: the ceil(q n)-th smallest, its bucket's highest equivalent
/// value.
pub fn bootstrap_quantiles(
    h: &Histogram<u64>,
    censored: u64,
    qs: &[f64],
    replicates: usize,
    seed: u64,
) -> Vec<(Option<u64>, Option<u64>)> {
    let steps = recorded(h);
    let n = h.len() + censored;
    if n == 0 || replicates == 0 {
        return vec![(None, None); qs.len()];
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut draws: Vec<Vec<Option<u64>>> = vec![Vec::with_capacity(replicates); qs.len()];
    let seen: Vec<u64> = steps.iter().map(|(_, c)| *c).collect();
    let mut counts = vec![0u64; steps.len()];
    for _ in 0..replicates {
        // What is left after the recorded values is the censored requests' draw.
        multinomial(&seen, n, &mut rng, &mut counts);
        for (q, out) in qs.iter().zip(&mut draws) {
            let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
            let mut seen = 0;
            let at = steps.iter().zip(&counts).find_map(|((v, _), c)| {
                seen += c;
                (seen >= rank).then_some(*v)
            });
            out.push(at);
        }
    }
    draws
        .into_iter()
        .map(|mut d| {
            // None (censored) sorts last: it is later than any value.
            d.sort_by_key(|v| (v.is_none(), *v));
            let at = |p: f64| d[((p * d.len() as f64).ceil() as usize).clamp(1, d.len()) - 1];
            (at(0.025), at(0.975))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;
    use rand_distr::Exp;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn grid(bin: Duration, horizon: Duration) -> Grid {
        Grid::new(bin, horizon).expect("a valid grid")
    }

    fn total(d: &Dist) -> f64 {
        d.mass().iter().sum::<f64>() + d.beyond()
    }

    fn close(a: f64, b: f64, tol: f64, what: &str) {
        assert!((a - b).abs() <= tol, "{what}: {a} vs {b} (tolerance {tol})");
    }

    fn close_duration(a: Option<Duration>, b: Duration, tol: Duration, what: &str) {
        let a = a.unwrap_or_else(|| panic!("{what}: no value (beyond)"));
        assert!(
            a.abs_diff(b) <= tol,
            "{what}: {a:?} vs {b:?} (tolerance {tol:?})"
        );
    }

    /// The same distribution, to rounding.
    fn same(a: &Dist, b: &Dist, what: &str) {
        assert_eq!(a.grid(), b.grid(), "{what}: grid");
        assert_eq!(a.mass().len(), b.mass().len(), "{what}: bins");
        for (k, (x, y)) in a.mass().iter().zip(b.mass()).enumerate() {
            close(*x, *y, 1e-15, &format!("{what}: bin {k}"));
        }
        close(a.beyond(), b.beyond(), 1e-15, &format!("{what}: beyond"));
    }

    fn uniform(g: Grid, min: Duration, max: Duration) -> Dist {
        Dist::declared(&DurationDist::Uniform { min, max }, g)
    }

    fn exp(g: Grid, mean: Duration) -> Dist {
        Dist::declared(&DurationDist::Exp { mean }, g)
    }

    #[test]
    fn grid_for_fits_the_horizon_in_whole_microseconds() {
        assert_eq!(grid_for(Duration::ZERO), us(1));
        assert_eq!(grid_for(Duration::from_secs(1)), us(1));
        // 10 s / 2^20 = 9.54 µs
        assert_eq!(grid_for(Duration::from_secs(10)), us(10));
        let widest = Grid::for_horizon(Duration::MAX);
        assert_eq!(widest.bins(), MAX_BINS);
        assert_eq!(widest.horizon(), Duration::MAX);
        for horizon in [ms(1), Duration::from_secs(30), Duration::from_secs(3600)] {
            let g = Grid::new(grid_for(horizon), horizon).expect("grid_for's bin fits");
            assert!(g.bins() <= MAX_BINS && g.horizon() >= horizon, "{g:?}");
            assert_eq!(Grid::for_horizon(horizon), g);
        }
        assert_eq!(
            Grid::new(Duration::from_nanos(999), ms(1)),
            Err(ComposeError::BinTooFine {
                bin: Duration::from_nanos(999)
            })
        );
        let err = Grid::new(us(1), Duration::from_secs(2)).expect_err("2e6 bins");
        assert!(
            err.to_string().contains("use a bin of at least 2µs"),
            "{err}"
        );
    }

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122_186_953_5),
            (1.0, 0.157_299_207_050_285_13),
            (1.5, 0.033_894_853_524_689_27),
            (1.999, 0.004_698_443_348_629_488),
            (2.0, 0.004_677_734_981_047_266),
            (2.9, 4.109_787_809_945_886e-5),
            (3.0, 2.209_049_699_858_543_8e-5),
            (5.0, 1.537_459_794_428_034_8e-12),
            (10.0, 2.088_487_583_762_545e-45),
        ] {
            let got = erfc(x);
            assert!(
                ((got - want) / want).abs() < 2e-13,
                "erfc({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn two_uniform_hops_convolve_to_the_triangle() {
        let g = grid(us(10), ms(10));
        let hop = uniform(g, Duration::ZERO, ms(1));
        let chain = hop.then(&hop);
        // CDF of the sum of two U[0, 1] (ms).
        let triangle = |t: f64| {
            if t <= 1.0 {
                t * t / 2.0
            } else {
                1.0 - (2.0 - t) * (2.0 - t) / 2.0
            }
        };
        for t_us in [100, 250, 505, 1000, 1333, 1500, 1900, 1995, 2000] {
            let t = t_us as f64 / 1000.0;
            // Exact at bin edges; within a bin, the density's slope over a
            // bin (1/ms^2 x 10 µs) times the bin.
            close(
                chain.cdf(us(t_us)),
                triangle(t),
                1e-4,
                &format!("F({t} ms)"),
            );
        }
        close(chain.cdf(ms(2)), 1.0, 1e-12, "all mass below 2 ms");
        close_duration(chain.mean(), ms(1), Duration::from_nanos(1), "mean");
        close_duration(chain.quantile(0.5), ms(1), us(1), "median");
        close(total(&chain), 1.0, 1e-12, "total mass");
        assert_eq!(chain.beyond(), 0.0);
    }

    #[test]
    fn the_max_of_eight_exponentials_is_the_cdf_to_the_eighth() {
        let g = grid(us(2), ms(60));
        let m = 1.0;
        let hop = exp(g, ms(1));
        let fan = Dist::max_of(&vec![hop; 8]);
        for q in [0.5, 0.99] {
            // (1 - e^(-x/m))^8 = q
            let x = -m * (1.0 - f64::powf(q, 1.0 / 8.0)).ln();
            let want = Duration::from_secs_f64(x / 1000.0);
            close_duration(fan.quantile(q), want, us(4), &format!("p{}", q * 100.0));
        }
        close(total(&fan), 1.0, 1e-12, "total mass");
    }

    #[test]
    fn the_max_and_min_count_beyond_as_infinitely_late() {
        let g = grid(us(10), ms(10));
        let a = Dist::mix(&[(0.9, Dist::point(g, ms(1))), (0.1, Dist::point(g, ms(20)))]);
        let b = Dist::point(g, ms(2));
        close(a.beyond(), 0.1, 1e-15, "a past the grid");
        let max = Dist::max_of(&[a.clone(), b.clone()]);
        close(max.beyond(), 0.1, 1e-15, "max beyond");
        close(max.cdf(ms(3)), 0.9, 1e-12, "max at 3 ms");
        let min = Dist::min_of(&[a.clone(), b.clone()]);
        assert_eq!(min.beyond(), 0.0);
        close(min.cdf(us(1010)), 0.9, 1e-12, "min: a first");
        close(min.cdf(us(2010)), 1.0, 1e-12, "min: b otherwise");
        let none = Dist::min_of(&[a.clone(), a.truncate(Duration::ZERO)]);
        close(none.beyond(), 0.1, 1e-15, "min with an always-late copy");
    }

    #[test]
    fn a_hedged_bimodal_hop_matches_the_closed_form() {
        let g = grid(us(10), ms(200));
        let hop = Dist::mix(&[
            (0.95, Dist::point(g, ms(1))),
            (0.05, Dist::point(g, ms(50))),
        ]);
        let hedged = hop.hedge(ms(5));
        // min(X1, 5 ms + X2): 1 ms when the first is fast; else 6 ms when the
        // hedge is fast (50 ms otherwise, as 55 ms loses).
        let want = Dist::mix(&[
            (0.95, Dist::point(g, ms(1))),
            (0.05 * 0.95, Dist::point(g, ms(6))),
            (0.05 * 0.05, Dist::point(g, ms(50))),
        ]);
        assert_eq!(hedged.mass().len(), want.mass().len());
        for (k, (a, b)) in hedged.mass().iter().zip(want.mass()).enumerate() {
            close(*a, *b, 1e-12, &format!("bin {k}"));
        }
        close_duration(hedged.quantile(0.99), ms(6), us(10), "p99");
        close_duration(hedged.quantile(0.999), ms(50), us(10), "p99.9");
        // 0.95 + 0.0475 x 6 + 0.0025 x 50 = 1.36 ms, plus half a bin.
        close_duration(hedged.mean(), us(1365), Duration::from_nanos(10), "mean");
        // Unhedged, p99 is the slow mode.
        close_duration(hop.quantile(0.99), ms(50), us(10), "unhedged p99");
    }

    #[test]
    fn retries_are_a_mixture_of_sums() {
        let g = grid(us(10), ms(100));
        let ok = uniform(g, ms(2), ms(4));
        let failed = Dist::point(g, ms(10));
        let d = Dist::retry(&ok, &failed, 0.1, 2);
        // 0.9 at U[2, 4], 0.09 at 10 + U[2, 4], 0.009 at 20 + U[2, 4], 0.001
        // beyond.
        close(d.beyond(), 0.001, 1e-15, "all three attempts failed");
        close(d.cdf(ms(3)), 0.45, 1e-12, "half of the first attempt's");
        close(d.cdf(ms(5)), 0.9, 1e-12, "first attempt");
        close(
            d.cdf(ms(11)),
            0.9,
            1e-12,
            "nothing before the second attempt",
        );
        close(d.cdf(ms(16)), 0.99, 1e-12, "second attempt");
        close(d.cdf(ms(26)), 0.999, 1e-12, "third attempt");
        close(total(&d), 1.0, 1e-12, "total mass");
        // Hand-computed: first attempt mean 3 ms; the failed point at 10 ms
        // stands for its bin, [10, 10.01) ms, so each failure adds 10.005.
        let mean = (0.9 * 3.0 + 0.09 * 13.005 + 0.009 * 23.01) / 0.999;
        close_duration(
            d.mean(),
            Duration::from_secs_f64(mean / 1000.0),
            us(1),
            "mean",
        );
        assert_eq!(d.quantile(0.9995), None);
        // No retry: the first attempt or beyond.
        let once = Dist::retry(&ok, &failed, 0.1, 0);
        close(once.beyond(), 0.1, 1e-15, "no retry");
        // Never failing: just ok.
        same(&Dist::retry(&ok, &failed, 0.0, 3), &ok, "never failing");
    }

    #[test]
    fn truncate_moves_the_mass_past_the_timeout_beyond() {
        let g = grid(us(10), ms(20));
        let hop = uniform(g, Duration::ZERO, ms(10));
        let cut = hop.truncate(ms(4));
        close(cut.beyond(), 0.6, 1e-12, "at a bin edge");
        close(cut.cdf(ms(4)), 0.4, 1e-12, "kept below the timeout");
        assert_eq!(cut.mass().len(), 400);
        // Inside a bin, in proportion.
        let mid = hop.truncate(us(4005));
        close(mid.beyond(), 0.5995, 1e-12, "inside a bin");
        // Censored mass stays censored.
        let censored = Dist::mix(&[(0.5, hop.clone()), (0.5, Dist::point(g, ms(30)))]);
        close(
            censored.truncate(ms(4)).beyond(),
            0.5 + 0.5 * 0.6,
            1e-12,
            "with censored",
        );
        same(&hop.truncate(ms(15)), &hop, "a timeout past the mass");
        let all = hop.truncate(Duration::ZERO);
        assert_eq!((all.beyond(), all.mass().len()), (1.0, 0));
        assert_eq!(all.quantile(0.0), None);
    }

    #[test]
    fn fft_and_direct_convolution_agree() {
        let a: Vec<f64> = (0..700)
            .map(|i| ((i * 37 % 101) as f64 + 0.5) / 1e4)
            .collect();
        let b: Vec<f64> = (0..1300)
            .map(|i| ((i * 53 % 97) as f64).powi(2) / 1e6)
            .collect();
        let direct = convolve_direct(&a, &b, 1999);
        let fft = convolve_fft(&a, &b, 1999);
        assert_eq!(direct.len(), fft.len());
        let largest = direct.iter().copied().fold(0.0, f64::max);
        for (k, (x, y)) in direct.iter().zip(&fft).enumerate() {
            close(*x, *y, largest * 1e-12, &format!("term {k}"));
        }
        // Cut at a limit, both ways.
        assert_eq!(convolve_fft(&a, &b, 10).len(), 10);
        assert_eq!(convolve_direct(&a, &b, 10), direct[..10].to_vec());
        // A long chain takes the FFT route; so does the sum of two
        // lognormals on a fine grid, against the direct sum.
        let g = grid(us(10), ms(100));
        let hop = Dist::declared(
            &DurationDist::Lognormal {
                mean: ms(5),
                sigma: 1.0,
            },
            g,
        );
        assert!(hop.mass().len() > 5_000, "{}", hop.mass().len());
        let (la, n) = (
            hop.mass().len() as f64,
            (2 * hop.mass().len()).next_power_of_two() as f64,
        );
        assert!(la * la > DIRECT_FACTOR * n * n.log2(), "the FFT route");
        let by_fft = hop.then(&hop);
        let by_hand = convolve_direct(hop.mass(), hop.mass(), g.bins());
        // Everything the grid's terms leave is beyond.
        let direct_sum = Dist::from_halves(g, &by_hand, 1.0 - by_hand.iter().sum::<f64>());
        assert!(by_fft.beyond() > 1e-4, "{}", by_fft.beyond());
        close(by_fft.beyond(), direct_sum.beyond(), 1e-12, "past the grid");
        for q in [0.1, 0.5, 0.9, 0.99] {
            let (x, y) = (by_fft.quantile(q), direct_sum.quantile(q));
            close_duration(
                x,
                y.expect("on the grid"),
                Duration::from_nanos(1),
                &format!("q{q}"),
            );
        }
    }

    impl Dist {
        /// A convolution's terms split into bins as `then` does.
        fn from_halves(grid: Grid, sum: &[f64], beyond: f64) -> Dist {
            let mut acc = Accumulator::new(grid);
            for (k, m) in sum.iter().enumerate() {
                acc.add(k, m / 2.0);
                acc.add(k + 1, m / 2.0);
            }
            acc.beyond += beyond;
            acc.finish()
        }
    }

    #[test]
    fn declared_distributions_have_their_moments() {
        let g = grid(us(1), Duration::from_secs(1));
        let e = exp(g, ms(2));
        close_duration(e.mean(), ms(2), us(1), "exp mean");
        // median m ln 2
        close_duration(
            e.quantile(0.5),
            Duration::from_secs_f64(0.002 * 2f64.ln()),
            us(1),
            "exp median",
        );
        let sigma = 0.8;
        let ln = Dist::declared(&DurationDist::Lognormal { mean: ms(3), sigma }, g);
        close_duration(ln.mean(), ms(3), us(2), "lognormal mean");
        let median = 0.003 * (-sigma * sigma / 2.0f64).exp();
        close_duration(
            ln.quantile(0.5),
            Duration::from_secs_f64(median),
            us(1),
            "lognormal median",
        );
        close(total(&ln), 1.0, 1e-12, "lognormal total");
        // A heavy tail reaches past a short grid.
        let short = grid(us(10), ms(10));
        let heavy = Dist::declared(
            &DurationDist::Lognormal {
                mean: ms(3),
                sigma: 2.0,
            },
            short,
        );
        // P(X > 10 ms) = 1 - Phi((ln 0.01 - mu) / sigma), mu = ln 0.003 - 2
        let z = ((0.01f64).ln() - (0.003f64.ln() - 2.0)) / 2.0;
        close(
            heavy.beyond(),
            normal_cdf(z).1,
            1e-12,
            "lognormal tail beyond",
        );
        // Empirical: straight between its points, a jump where two share
        // a quantile, as the hop draws them.
        let emp = Dist::declared(
            &DurationDist::Empirical {
                quantiles: vec![(0.0, ms(1)), (0.5, ms(3)), (0.5, ms(5)), (1.0, ms(9))],
            },
            g,
        );
        close(total(&emp), 1.0, 1e-12, "empirical total");
        close(emp.cdf(ms(1)), 0.0, 1e-9, "empirical at its lowest");
        close(emp.cdf(ms(2)), 0.25, 1e-9, "empirical inside a step");
        close(emp.cdf(ms(4)), 0.5, 1e-9, "empirical in its gap");
        close(emp.cdf(ms(7)), 0.75, 1e-9, "empirical in the last step");
        close_duration(emp.quantile(0.9), us(8200), us(10), "empirical p90");
        // As the hop draws them.
        assert_eq!(
            Dist::declared(&DurationDist::Fixed { value: ms(3) }, short),
            Dist::point(short, ms(3))
        );
        assert_eq!(
            Dist::declared(
                &DurationDist::Uniform {
                    min: ms(3),
                    max: ms(1)
                },
                short
            ),
            Dist::point(short, ms(3))
        );
        assert_eq!(exp(short, Duration::ZERO), Dist::zero(short));
        assert_eq!(
            Dist::declared(
                &DurationDist::Lognormal {
                    mean: ms(3),
                    sigma: -1.0
                },
                short
            ),
            Dist::zero(short)
        );
        // The draw's one-hour cap: a uniform up to two hours is half at one
        // hour.
        let long = Grid::for_horizon(Duration::from_secs(3 * 3600));
        let capped = uniform(long, Duration::ZERO, Duration::from_secs(2 * 3600));
        close(
            capped.cdf(Duration::from_secs(1800)),
            0.25,
            1e-9,
            "first half hour",
        );
        close(
            capped.cdf(MAX_DRAW + long.bin()),
            1.0,
            1e-9,
            "all by the cap",
        );
        close_duration(
            capped.quantile(0.6),
            MAX_DRAW,
            long.bin(),
            "the cap's point mass",
        );
        let u = uniform(short, ms(1), ms(3));
        close(u.cdf(ms(2)), 0.5, 1e-12, "uniform half");
        assert_eq!(u.mass().len(), 300);
    }

    #[test]
    fn a_histogram_becomes_a_dist_with_its_censored_beyond() {
        let g = grid(us(10), ms(100));
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        for v in [1000, 1000, 1000, 2000, 5000, 5000] {
            h.record(v).expect("record");
        }
        let d = Dist::from_histogram(&h, 2, g).expect("not empty");
        close(d.beyond(), 0.25, 1e-15, "censored");
        // 1000 µs stands for [1000, 1001) µs: bin 100.
        close(d.mass()[100], 3.0 / 8.0, 1e-15, "three at 1 ms");
        close(d.cdf(ms(3)), 0.5, 1e-15, "half below 3 ms");
        // The 5 ms value fills its 10 µs bin, so p75 is the bin's top.
        close_duration(d.quantile(0.75), us(5010), Duration::ZERO, "p75");
        assert_eq!(d.quantile(0.8), None);
        // A wide bucket is spread: 100 000 µs is in a 64 µs bucket, over
        // several 10 µs bins.
        let mut wide = Histogram::<u64>::new(3).expect("histogram");
        wide.record(100_000).expect("record");
        let w = Dist::from_histogram(&wide, 0, grid(us(10), ms(200))).expect("not empty");
        let lo = wide.lowest_equivalent(100_000);
        let hi = wide.highest_equivalent(100_000) + 1;
        assert!(hi - lo > 10, "{lo}..{hi}");
        close_duration(w.mean(), us((lo + hi) / 2), us(1), "bucket middle");
        assert_eq!(
            Dist::from_histogram(&Histogram::<u64>::new(3).expect("histogram"), 0, g),
            Err(ComposeError::Empty)
        );
        let all_censored =
            Dist::from_histogram(&Histogram::<u64>::new(3).expect("histogram"), 5, g)
                .expect("censored only");
        assert_eq!((all_censored.beyond(), all_censored.mean()), (1.0, None));
    }

    #[test]
    fn shift_and_mix_keep_the_mass() {
        let g = grid(us(10), ms(10));
        let hop = uniform(g, ms(1), ms(2));
        let later = hop.shift(us(2505));
        close_duration(
            later.mean(),
            us(4005),
            Duration::from_nanos(1),
            "shifted mean",
        );
        // [3.505, 4.505) ms: half of each end bin is filled, spread over
        // the bin.
        close(later.cdf(us(3500)), 0.0, 1e-15, "nothing before");
        close(later.cdf(us(3510)), 0.005, 1e-12, "half a bin");
        close(later.cdf(us(4000)), 0.495, 1e-12, "bin edge");
        close(later.cdf(us(4510)), 1.0, 1e-12, "all before");
        let off = hop.shift(us(8500));
        close(off.beyond(), 0.5, 1e-12, "half past the grid");
        let m = Dist::mix(&[(3.0, hop.clone()), (1.0, later)]);
        close(m.cdf(ms(2)), 0.75, 1e-12, "weights normalized");
        close(total(&m), 1.0, 1e-12, "total");
        assert_eq!(Dist::zero(g).then(&hop).mass().len(), hop.mass().len() + 1);
        let never = hop.shift(Duration::MAX);
        assert_eq!((never.beyond(), never.mass().len()), (1.0, 0));
    }

    #[test]
    fn a_sum_past_the_grid_is_beyond() {
        let g = grid(us(10), ms(10));
        let hop = uniform(g, Duration::ZERO, ms(6));
        // P(U1 + U2 >= 10 ms) for U[0, 6 ms]: (2/6)^2 / 2.
        let chain = hop.then(&hop);
        close(chain.beyond(), 1.0 / 18.0, 1e-12, "past the grid");
        close(chain.cdf(ms(6)), 0.5, 1e-12, "half below 6 ms");
        // With censored mass on both sides: 1 - (1 - 0.2)^2 more.
        let lossy = Dist::mix(&[(0.8, hop.clone()), (0.2, Dist::point(g, ms(20)))]);
        let both = lossy.then(&lossy);
        close(
            both.beyond(),
            0.36 + 0.64 / 18.0,
            1e-12,
            "censored and past the grid",
        );
        close(total(&both), 1.0, 1e-12, "total");
    }

    #[test]
    #[should_panic(expected = "different grids")]
    fn different_grids_do_not_compose() {
        let a = Dist::zero(grid(us(10), ms(10)));
        let b = Dist::zero(grid(us(20), ms(10)));
        let _ = a.then(&b);
    }

    /// Exponential samples (µs, truncated as the load generator records
    /// them) into a histogram.
    fn sample_histogram(rng: &mut ChaCha8Rng, n: usize, mean_us: f64) -> Histogram<u64> {
        let law = Exp::new(1.0 / mean_us).expect("positive rate");
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        for _ in 0..n {
            h.record(law.sample(rng) as u64).expect("record");
        }
        h
    }

    #[test]
    fn bootstrap_intervals_cover_the_true_quantile_about_95_percent_of_the_time() {
        let (trials, n, mean) = (200, 500, 1000.0);
        let qs = [0.5, 0.9];
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        let mut covered = [0usize; 2];
        for trial in 0..trials {
            let h = sample_histogram(&mut rng, n, mean);
            let intervals = bootstrap_quantiles(&h, 0, &qs, 400, trial);
            for ((q, (lo, hi)), hits) in qs.iter().zip(&intervals).zip(&mut covered) {
                let truth = -mean * (1.0 - q).ln();
                let (lo, hi) = (lo.expect("on the grid"), hi.expect("on the grid"));
                // A recorded value v stands for [v, v + 1) µs.
                if lo as f64 <= truth && truth < hi as f64 + 1.0 {
                    *hits += 1;
                }
            }
        }
        for (q, hits) in qs.iter().zip(covered) {
            let coverage = hits as f64 / trials as f64;
            assert!(
                (0.90..=0.99).contains(&coverage),
                "q{q}: coverage {coverage}"
            );
        }
    }

    #[test]
    fn bootstrap_intervals_reach_into_the_censored() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let h = sample_histogram(&mut rng, 950, 1000.0);
        let intervals = bootstrap_quantiles(&h, 50, &[0.5, 0.95, 0.99], 300, 1);
        let (lo, hi) = intervals[0];
        let (lo, hi) = (lo.expect("p50 low"), hi.expect("p50 high"));
        assert!(lo < hi && lo > 500 && hi < 1000, "{lo}..{hi}");
        // p95 is at the edge: 950 of 1000 values seen; resamples put it on
        // both sides.
        assert!(
            intervals[1].0.is_some() && intervals[1].1.is_none(),
            "{:?}",
            intervals[1]
        );
        assert_eq!(intervals[2], (None, None));
        // Seeded: the same intervals again.
        assert_eq!(
            bootstrap_quantiles(&h, 50, &[0.5, 0.95, 0.99], 300, 1),
            intervals
        );
        assert_eq!(
            bootstrap_quantiles(&Histogram::new(3).expect("histogram"), 0, &[0.5], 10, 1),
            vec![(None, None)]
        );
    }

    #[test]
    fn kaplan_meier_recovers_an_exponential_from_censored_observations() {
        // Times drawn from an exponential of mean 1 ms; half of them are
        // only seen up to a uniform cut (cancelled). Dropping the cut ones
        // would bias the estimate low; the product-limit must not.
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let law = Exp::new(1.0 / 1000.0).expect("rate");
        let (mut ended, mut cut) = (
            Histogram::<u64>::new(3).expect("histogram"),
            Histogram::<u64>::new(3).expect("histogram"),
        );
        for i in 0..40_000 {
            let t: f64 = law.sample(&mut rng);
            let c = if i % 2 == 0 {
                f64::INFINITY
            } else {
                rng.random_range(0.0..3000.0)
            };
            if t <= c {
                ended.record(t as u64).expect("record");
            } else {
                cut.record(c as u64).expect("record");
            }
        }
        let g = Grid::new(us(10), ms(100)).expect("grid");
        let km = Dist::kaplan_meier(&ended, &cut, g).expect("estimate");
        let naive = Dist::from_histogram(&ended, 0, g).expect("naive");
        let truth = |q: f64| -1000.0 * (1.0 - q).ln();
        for q in [0.5, 0.9, 0.99] {
            let at = km.quantile(q).expect("quantile").as_micros() as f64;
            assert!(
                (at / truth(q) - 1.0).abs() < 0.05,
                "q {q}: {at} vs {}",
                truth(q)
            );
        }
        let naive_p90 = naive.quantile(0.9).expect("quantile").as_micros() as f64;
        assert!(
            naive_p90 < truth(0.9) * 0.95,
            "the cut ones bias a naive estimate: {naive_p90}"
        );
        // Nothing censored: the product-limit is the histogram itself.
        same(
            &Dist::kaplan_meier(&ended, &Histogram::<u64>::new(3).expect("histogram"), g)
                .expect("estimate"),
            &naive,
            "uncensored",
        );
        // Censored past every event: that survival is beyond.
        let mut late = Histogram::<u64>::new(3).expect("histogram");
        late.record_n(50_000, 40_000).expect("record");
        let km = Dist::kaplan_meier(&ended, &late, g).expect("estimate");
        let share = ended.len() as f64 / (ended.len() + 40_000) as f64;
        close(km.beyond(), 1.0 - share, 1e-9, "beyond");
        assert_eq!(
            Dist::kaplan_meier(&Histogram::<u64>::new(3).expect("histogram"), &late, g),
            Err(ComposeError::Empty)
        );
    }

    #[test]
    fn with_beyond_keeps_the_shape_and_sets_the_censored_share() {
        let g = Grid::new(us(1), ms(10)).expect("grid");
        let d = uniform(g, ms(1), ms(2)).truncate(Duration::from_micros(1500));
        assert!(d.beyond() > 0.4);
        let c = d.with_beyond(0.1);
        close(c.beyond(), 0.1, 1e-12, "beyond");
        // The shape: uniform on 1-1.5 ms, holding 0.9.
        close(
            c.quantile(0.45).expect("q").as_secs_f64(),
            0.00125,
            1e-6,
            "middle",
        );
        close(
            c.quantile(0.9).expect("q").as_secs_f64(),
            0.0015,
            1e-6,
            "top",
        );
        assert_eq!(c.quantile(0.95), None, "among the censored");
        close(d.with_beyond(1.0).beyond(), 1.0, 0.0, "all censored");
    }

    #[test]
    fn a_resample_has_as_many_values_drawn_from_the_same_ones() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let h = sample_histogram(&mut rng, 5000, 1000.0);
        let values: std::collections::BTreeSet<u64> =
            h.iter_recorded().map(|s| s.value_iterated_to()).collect();
        let a = resample(&h, &mut rng);
        let b = resample(&h, &mut rng);
        assert_eq!((a.len(), b.len()), (h.len(), h.len()));
        assert!(
            a.iter_recorded()
                .all(|s| values.contains(&s.value_iterated_to()))
        );
        assert_ne!(a, b, "two replicates differ");
        let mean = |x: &Histogram<u64>| x.mean();
        assert!((mean(&a) / mean(&h) - 1.0).abs() < 0.1);
    }

    #[test]
    fn shift_back_undoes_a_shift_and_stops_at_zero() {
        let g = Grid::new(us(10), ms(10)).expect("grid");
        let d = uniform(g, ms(1), ms(2));
        same(
            &d.shift(us(2_500)).shift_back(us(2_500)),
            &d,
            "there and back, whole bins",
        );
        let back = d.shift_back(us(734));
        close_duration(back.mean(), us(766), us(1), "mean moved by the shift");
        // Below 0 clamps: E[max(X - 1.234 ms, 0)] = 293.4 µs for X uniform
        // on 1-2 ms, plus the first bin's half width for the 23.4 % there.
        let clamped = d.shift_back(us(1_234));
        close_duration(clamped.mean(), us(295), us(1), "clamped at 0");
        // Past 0: everything lands in the first bin.
        let gone = d.shift_back(ms(5));
        assert_eq!(gone.mass().len(), 1);
        close(gone.mass()[0], 1.0, 1e-12, "all at 0");
    }

    #[test]
    fn reweighting_undoes_a_known_selection() {
        // Values seen with probability proportional to 1 - F(t) of an
        // exponential: weighting by 1 / (1 - F) gives back the uniform.
        let g = Grid::new(us(10), ms(10)).expect("grid");
        let truth = uniform(g, ms(0), ms(4));
        let survive = |t: Duration| (-t.as_secs_f64() / 0.002).exp();
        let seen = truth.reweighted(survive);
        assert!(
            seen.mean().expect("mean") < ms(2),
            "the selection favours short values"
        );
        let back = seen.reweighted(|t| 1.0 / survive(t));
        for q in [0.1, 0.5, 0.9] {
            close_duration(
                back.quantile(q),
                truth.quantile(q).expect("q"),
                us(15),
                "quantile",
            );
        }
    }
}
