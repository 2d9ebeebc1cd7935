//! The whole tail, composed from its parts (summary.json's
//! `variants[].composition`): each ok request's reply path cut into
//! segments, each segment's distribution over the run, and those composed
//! along the call tree as if independent, to hold against the end-to-end
//! latency measured in the same run.
//!
//! The segments of a request (ns, from its path records and the callers'
//! timings of each call):
//! - `lateness`: the load generator's send after the intended time;
//! - per hop, `reach`: the network, the client and the broker's transit
//!   between the caller's send of the answering attempt and its answer,
//!   less the hop's own time there (`took - total - broker wait`);
//!   `queue`: waiting in a broker topic or for a slot in the replica;
//!   `own`: the hop's own work and injected slowness; `rest`: the rest of
//!   the hop's time, less its calls (`total - slot wait - own - longest
//!   call`).
//!
//! They add up to the request's latency by the tree's rules:
//! `latency = lateness + call(first hop)`, `call(h) = reach(h) + time(h)`,
//! `time(h) = queue(h) + own(h) + rest(h) + max over h's downstream of
//! call(c)`. A call under a client policy (hedges, retries, a per-attempt
//! timeout) is composed from its attempts instead, all of them, as the
//! caller timed them: an answer is an event, a cancelled attempt (another
//! answered first) a censored one, and the policy's rule is applied to
//! that (`Dist::hedge`, `Dist::retry`).
//!
//! Three end-to-end distributions, side by side:
//! - `measured`: the requests' own latencies, with 95 % bootstrap intervals;
//! - `composed`: every segment's distribution over the run composed by the
//!   rules with [`Dist`], independence assumed, with intervals from
//!   resampling every segment;
//! - `shuffled`: the same independence, reached another way: requests
//!   recomposed from segments drawn from different requests (a reservoir
//!   of the run's requests, shuffled column by column).
//!
//! The measured minus the independent prediction at each quantile is the
//! dependence figure: what the hops' dependence (a request slow at two
//! hops, queueing behind the same slow request, shared CPU) adds to the
//! tail. The correlations of the reservoir's segments, and the segments
//! that stand out in the measured tail against the shuffled tail, say
//! where it comes from.
//!
//! Failed and timed-out requests have no path: they are censored, the
//! share past every latency in both distributions (taken as measured in
//! the prediction, so its quantiles read against the same ranks).
//!
//! - `segments`: the call tree, a request cut into its segments (a
//!   `Row`), a hop's segments and attempts over the run, a row
//!   recomposed by the tree's rules.
//! - `composed`: the segments' distributions on a grid composed along the
//!   tree (policies from their attempts), with bootstrap intervals.
//! - `shuffle`: the reservoir of rows and the shuffled estimate.
//! - `correlation`: the segments' correlations, the tail's excess over
//!   the shuffled one, and the dependence figure with its source.
//! - `judge`: `[check] distribution`, measured against composed.
//! - `report`: what summary.json holds (`variants[].composition`).

mod composed;
mod correlation;
mod judge;
mod report;
mod segments;
mod shuffle;
#[cfg(test)]
mod tests;

use std::time::Duration;

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::compose::{Dist, Grid, bootstrap_quantiles, grid_for, resample};
use super::declared::Undeclared;
use super::facts::slow_follows;
use super::stats::{new_histogram, record_us};
use super::verdict::MachineState;
use crate::record::{Outcome, RequestRecord};
use composed::{
    CallCounts, HopDists, Intervals, Piece, Segments, attempt_dists, band_of, compose, interval,
    settle, us_at,
};
use correlation::dependence;
use judge::judge;
use report::summary_of;
pub use report::{
    CompositionReport, Correlation, Dependence, MeasuredSegments, QuantileBand, Quantiles,
    SegmentSummary, SpectrumPoint, TailSegment,
};
pub use report::{QUANTILES, SPECTRUM};
pub use segments::HOP_SEGMENTS;
use segments::{AttemptAcc, HopAcc, Row, Tree, Visit, columns, row_of, segments, visits_of};
use shuffle::{Reservoir, shuffle};
use tailmesh_model::scenario::Variant;
use tailmesh_units::nanos;

/// Bootstrap replicates of the measurement and of the composition.
const REPLICATES: usize = 100;

/// Bins below the measured median: the grid's resolution (1 % of it),
/// never finer than 1 µs nor than the timeout allows.
const BINS_PER_MEDIAN: u64 = 100;

/// The most bins the measured latencies span: a run whose slowest request
/// is far out in the tail (a lost packet's retransmission, seconds past a
/// millisecond median) gets a coarser grid, so the composition stays cheap.
const SPAN_BINS: u64 = 16_384;

/// Past this many bins spanned, the composition is resampled fewer times.
const WIDE_SPAN: u64 = 2_048;
const WIDE_REPLICATES: usize = 30;

/// Accumulates one variant's segments, request by request.
pub struct CompositionAcc {
    tree: Tree,
    lateness: Histogram<u64>,
    hops: Vec<HopAcc>,
    latency: Histogram<u64>,
    reservoir: Reservoir,
    ok: u64,
    censored: u64,
    /// Ok requests whose path did not have every hop (not composed).
    incomplete: u64,
    /// On paths that vary, how often each hop called each other one.
    counts: CallCounts,
    timeout: Duration,
    follows: Vec<bool>,
}

/// What the caller knows besides the requests.
#[derive(Clone, Copy)]
pub struct CompositionContext<'a> {
    pub machine: &'a MachineState,
    /// `[check] distribution`: judge the composition.
    pub check: bool,
    pub tolerance: f64,
    /// The scenario's own prediction, given each hop's measured overhead
    /// (`reach + rest`) on the grid and the windowed faults in force
    /// (`None`: the whole run, its windows mixed by time): the declared
    /// distribution or why there is none.
    pub declare: &'a Declare<'a>,
    /// The faults in force, for a phase's composition.
    pub faults: Option<&'a [String]>,
}

/// How the caller predicts from the scenario: see
/// [`CompositionContext::declare`].
pub type Declare<'a> =
    dyn Fn(Grid, &dyn Fn(usize) -> Dist, Option<&[String]>) -> Result<Dist, Undeclared> + 'a;

impl CompositionAcc {
    pub fn new(variant: &Variant) -> CompositionAcc {
        let tree = Tree::of(variant);
        CompositionAcc {
            lateness: new_histogram(),
            hops: (0..tree.hops())
                .map(|_| HopAcc {
                    segments: std::array::from_fn(|_| new_histogram()),
                    attempts: AttemptAcc::new(),
                })
                .collect(),
            tree,
            latency: new_histogram(),
            reservoir: Reservoir::for_hops(variant.hops.len()),
            ok: 0,
            censored: 0,
            incomplete: 0,
            counts: CallCounts::new(variant.hops.len()),
            timeout: variant.load.timeout,
            follows: variant
                .hops
                .iter()
                .map(|h| h.slow.as_ref().is_some_and(slow_follows))
                .collect(),
        }
    }

    /// Counts one completed request: an ok one cut into its segments, a
    /// failed or timed-out one censored.
    pub fn observe(&mut self, r: &RequestRecord) {
        match r.outcome {
            Outcome::Ok if self.tree.fixed => {
                let row = row_of(&self.tree, r);
                self.record(row);
            }
            Outcome::Ok => {
                let visits = visits_of(&self.tree, r);
                self.record_visits(visits, r);
            }
            _ => self.censored(),
        }
    }

    /// Counts a request that failed or timed out: censored.
    pub fn censored(&mut self) {
        self.censored += 1;
    }

    /// Counts an ok request's row; `None` (its path lacked a hop) counts
    /// as incomplete.
    pub fn record(&mut self, row: Option<Row>) {
        let Some(row) = row.filter(|r| r.hops.len() == self.tree.hops()) else {
            self.incomplete += 1;
            return;
        };
        self.ok += 1;
        record_us(&mut self.latency, row.latency / 1_000);
        record_us(&mut self.lateness, row.lateness / 1_000);
        for (i, (acc, part)) in self.hops.iter_mut().zip(&row.hops).enumerate() {
            for (h, v) in acc.segments.iter_mut().zip(segments(part)) {
                record_us(h, v / 1_000);
            }
            // Only a policed call is composed from its attempts.
            if self.tree.policed(i) {
                acc.attempts.record(&part.attempts);
            }
        }
        self.reservoir.offer(|| columns(&row));
    }

    /// Counts an ok request on paths that vary by its visits; `None` (its
    /// path did not read as the tree's) counts as incomplete. Such rows do
    /// not line up column by column, so nothing is kept for the shuffled
    /// estimate and the correlations.
    fn record_visits(&mut self, visits: Option<Vec<Visit>>, r: &RequestRecord) {
        let Some(visits) = visits else {
            self.incomplete += 1;
            return;
        };
        self.ok += 1;
        record_us(&mut self.latency, nanos(r.latency()) / 1_000);
        record_us(
            &mut self.lateness,
            nanos(r.start.saturating_sub(r.intended)) / 1_000,
        );
        // The entry's record is the path's last.
        if let Some(entry) = visits.last() {
            self.counts.entered[entry.hop] += 1;
        }
        for v in &visits {
            let acc = &mut self.hops[v.hop];
            for (h, x) in acc.segments.iter_mut().zip(segments(&v.part)) {
                record_us(h, x / 1_000);
            }
            if self.tree.policed(v.hop) {
                acc.attempts.record(&v.part.attempts);
            }
            self.counts.visits[v.hop] += 1;
            for &(j, n) in &v.called {
                *self
                    .counts
                    .called
                    .entry((v.hop, j))
                    .or_default()
                    .entry(n)
                    .or_default() += 1;
            }
        }
    }

    /// The finished composition; `None` without an ok request to compose.
    pub fn finish(self, context: &CompositionContext<'_>) -> Option<CompositionReport> {
        if self.ok == 0 {
            return None;
        }
        let n = self.ok + self.censored;
        let censored_share = self.censored as f64 / n as f64;
        let grid = self.grid();
        // The measured spectrum and its intervals, once; the summary's
        // quantiles are among its points.
        let measured_spectrum = self.quantiles(&SPECTRUM, n);
        let measured_bands =
            bootstrap_quantiles(&self.latency, self.censored, &SPECTRUM, REPLICATES, 7);
        let pick = |f: &dyn Fn(usize) -> Option<f64>| {
            Quantiles::from_fn(|q| f(SPECTRUM.iter().position(|x| *x == q)?))
        };
        let measured = QuantileBand {
            point: pick(&|k| measured_spectrum[k]),
            low: pick(&|k| measured_bands[k].0.map(|v| v as f64)),
            high: pick(&|k| measured_bands[k].1.map(|v| v as f64)),
        };
        let composed_raw = compose(&self.tree, &self.dists(grid, &self.hops, &self.lateness));
        let predicted_censored = composed_raw.as_ref().map(Dist::beyond);
        let composed_dist = composed_raw.map(|d| d.with_beyond(censored_share));
        let (composed, composed_spectrum) = match &composed_dist {
            Some(d) => {
                let bands = self.composed_bands(grid, censored_share);
                (band_of(d, &QUANTILES, &bands.0), bands.1)
            }
            None => (QuantileBand::default(), vec![(None, None); SPECTRUM.len()]),
        };
        let shuffle = shuffle(&self.tree, &self.reservoir.rows);
        let declared = self.declared(grid, context, censored_share);
        let spectrum = SPECTRUM
            .iter()
            .enumerate()
            .map(|(k, q)| SpectrumPoint {
                q: *q,
                measured_us: measured_spectrum[k],
                measured_low_us: measured_bands[k].0.map(|v| v as f64),
                measured_high_us: measured_bands[k].1.map(|v| v as f64),
                composed_us: composed_dist.as_ref().and_then(|d| us_at(d, *q)),
                composed_low_us: composed_spectrum[k].0,
                composed_high_us: composed_spectrum[k].1,
                shuffled_us: shuffle
                    .as_ref()
                    .and_then(|s| s.quantile(*q, censored_share)),
                declared_us: declared.as_ref().ok().and_then(|d| us_at(d, *q)),
            })
            .collect();
        let shuffled = shuffle
            .as_ref()
            .map(|s| Quantiles::from_fn(|q| s.quantile(q, censored_share)))
            .unwrap_or_default();
        let dependence = dependence(
            &self.tree,
            &self.reservoir.rows,
            &self.follows,
            &measured,
            &composed,
            shuffle.as_ref(),
        );
        let check = context.check.then(|| {
            judge(
                &measured,
                &composed,
                &dependence,
                self.ok,
                grid,
                context.tolerance,
                context.machine,
            )
        });
        Some(CompositionReport {
            requests: n,
            censored: self.censored,
            incomplete: self.incomplete,
            bin_us: grid.bin().as_secs_f64() * 1e6,
            measured,
            composed,
            shuffled,
            declared: declared
                .as_ref()
                .ok()
                .map(|d| Quantiles::from_fn(|q| us_at(d, q))),
            declared_note: declared.err().map(|e| e.to_string()),
            predicted_censored,
            segments: self.segment_summaries(),
            dependence,
            check,
            spectrum,
            measured_segments: Some(MeasuredSegments {
                lateness: self.lateness.clone(),
                hops: self
                    .tree
                    .names
                    .iter()
                    .cloned()
                    .zip(self.hops.iter().map(|h| h.segments.clone()))
                    .collect(),
            }),
        })
    }

    /// The grid: 1 % of the measured median per bin, in whole µs, unless
    /// the slowest request is more than [`SPAN_BINS`] of those away (then
    /// coarser: the composition's cost grows with the bins it spans), and
    /// at least what fits the load's timeout (twice it: a sum of segments
    /// may pass it before the timeout cuts).
    fn grid(&self) -> Grid {
        let median = self.latency.value_at_quantile(0.5);
        let span = self.latency.max().div_ceil(SPAN_BINS);
        let bin = Duration::from_micros((median / BINS_PER_MEDIAN).max(span).max(1))
            .max(grid_for(self.timeout * 2));
        Grid::new(bin, self.timeout * 2).unwrap_or_else(|_| Grid::for_horizon(self.timeout * 2))
    }

    /// The measured quantiles (µs) of the requests, censored last.
    fn quantiles(&self, qs: &[f64], n: u64) -> Vec<Option<f64>> {
        qs.iter()
            .map(|q| {
                let within = q * n as f64 / self.ok as f64;
                (within <= 1.0).then(|| self.latency.value_at_quantile(within) as f64)
            })
            .collect()
    }

    /// Each segment's distribution on `grid`.
    fn dists(&self, grid: Grid, hops: &[HopAcc], lateness: &Histogram<u64>) -> Segments<'_> {
        Segments {
            counts: &self.counts,
            lateness: Piece::of(lateness, grid),
            hops: hops
                .iter()
                .enumerate()
                .map(|(i, acc)| HopDists {
                    segments: std::array::from_fn(|k| Piece::of(&acc.segments[k], grid)),
                    attempts: self
                        .tree
                        .policed(i)
                        .then(|| attempt_dists(&acc.attempts, &self.tree.policies[i], grid))
                        .flatten(),
                })
                .collect(),
        }
    }

    /// 95 % intervals of the composition: every segment resampled and the
    /// whole composed again, `REPLICATES` times; at the [`QUANTILES`] and
    /// at the [`SPECTRUM`].
    fn composed_bands(&self, grid: Grid, censored: f64) -> (Intervals, Intervals) {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut at_q: Vec<Vec<Option<f64>>> = vec![Vec::new(); QUANTILES.len()];
        let mut at_s: Vec<Vec<Option<f64>>> = vec![Vec::new(); SPECTRUM.len()];
        let span = self.latency.max() as f64 / (grid.bin().as_secs_f64() * 1e6);
        let replicates = if span > WIDE_SPAN as f64 {
            WIDE_REPLICATES
        } else {
            REPLICATES
        };
        for _ in 0..replicates {
            let hops: Vec<HopAcc> = self
                .hops
                .iter()
                .map(|acc| HopAcc {
                    segments: std::array::from_fn(|k| resample(&acc.segments[k], &mut rng)),
                    attempts: acc.attempts.resampled(&mut rng),
                })
                .collect();
            let lateness = resample(&self.lateness, &mut rng);
            let Some(d) = compose(&self.tree, &self.dists(grid, &hops, &lateness)) else {
                continue;
            };
            let d = d.with_beyond(censored);
            for (q, out) in QUANTILES.iter().zip(&mut at_q) {
                out.push(us_at(&d, *q));
            }
            for (q, out) in SPECTRUM.iter().zip(&mut at_s) {
                out.push(us_at(&d, *q));
            }
        }
        (
            at_q.into_iter().map(interval).collect(),
            at_s.into_iter().map(interval).collect(),
        )
    }

    /// The scenario's own prediction with the run's measured overheads.
    fn declared(
        &self,
        grid: Grid,
        context: &CompositionContext<'_>,
        censored: f64,
    ) -> Result<Dist, Undeclared> {
        let overhead = |i: usize| match self.hops.get(i) {
            Some(acc) => {
                let (reach, rest) = (
                    Piece::of(&acc.segments[0], grid),
                    Piece::of(&acc.segments[3], grid),
                );
                settle(reach.dist.then(&rest.dist), reach.moved_us + rest.moved_us)
            }
            None => Dist::zero(grid),
        };
        let lateness = Piece::of(&self.lateness, grid);
        (context.declare)(grid, &overhead, context.faults)
            .map(|d| settle(d.then(&lateness.dist), lateness.moved_us).with_beyond(censored))
    }

    fn segment_summaries(&self) -> Vec<SegmentSummary> {
        let mut out = vec![summary_of("lateness", &self.lateness)];
        for (i, acc) in self.hops.iter().enumerate() {
            for (k, name) in HOP_SEGMENTS.iter().enumerate() {
                out.push(summary_of(
                    &format!("{name}:{}", self.tree.names[i]),
                    &acc.segments[k],
                ));
            }
        }
        out
    }
}
