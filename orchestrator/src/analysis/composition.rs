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

use std::time::Duration;

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tailmesh_services::hop::policy::{ClientPolicy, Hedge};

use super::compose::{Dist, Grid, bootstrap_quantiles, grid_for, resample};
use super::phases::PhaseReport;
use super::stats::{new_histogram, record_us};
use super::verdict::{MachineState, Verdict};
use crate::record::{Outcome, RequestRecord};
use crate::scenario::Variant;
use tailmesh_proto::pb::{AttemptEnd as ProtoEnd, AttemptTiming, HopRecord};

/// The quantiles summary.json gives: p50, p90, p99, p99.9.
pub(crate) const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// The spectrum the report draws: predicted against measured (it holds
/// every one of [`QUANTILES`]).
pub(crate) const SPECTRUM: [f64; 12] = [
    0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999,
];

/// Requests the reservoir keeps for the shuffled estimate and the
/// correlations (a uniform sample of the run's ok requests), at most: a
/// row holds 1 + 5 values per hop, and the reservoir at most
/// [`RESERVOIR_VALUES`] (20 000 rows of a 3-hop chain, 6 000 of 64 hops:
/// 16 MB).
const RESERVOIR: usize = 20_000;
const RESERVOIR_VALUES: usize = 2_000_000;

/// Requests drawn for the shuffled estimate, at most, and the values they
/// draw at most (a 64-hop row draws 321).
const SHUFFLED: usize = 200_000;
const SHUFFLED_VALUES: usize = 20_000_000;

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

/// A quantile is judged only when the grid's bin is at most this share of
/// it: coarser, the composition cannot place it.
const FINEST_SHARE: f64 = 0.02;

/// Ok requests below which a distribution check is inconclusive.
const MIN_REQUESTS: u64 = 200;

/// Values the measurement must have above a quantile for the check to
/// judge it (p99.9 wants 10 000 requests).
const ABOVE_FOR_CHECK: f64 = 10.0;

/// The smallest chance of a first attempt still being out that a hedge
/// delay's weight uses (caps the weight at 1000).
const MIN_STILL_OUT: f64 = 1e-3;

/// Correlations smaller than this are not reported.
const MIN_CORRELATION: f64 = 0.1;

/// The segments of a hop, in a row's column order.
const HOP_SEGMENTS: [&str; 4] = ["reach", "queue", "own", "rest"];

/// A row's columns: lateness, then per hop reach, queue, own, rest and the
/// whole call as the caller timed it.
const PER_HOP: usize = 5;

/// The call tree as composition walks it.
#[derive(Clone, Debug)]
struct Tree {
    names: Vec<String>,
    /// Each hop's place in `names`, for the path records of every request.
    index: std::collections::HashMap<String, usize>,
    children: Vec<Vec<usize>>,
    policies: Vec<ClientPolicy>,
}

impl Tree {
    fn of(variant: &Variant) -> Tree {
        let index = |name: &str| variant.hops.iter().position(|h| h.name == name);
        Tree {
            names: variant.hops.iter().map(|h| h.name.clone()).collect(),
            index: variant
                .hops
                .iter()
                .enumerate()
                .map(|(i, h)| (h.name.clone(), i))
                .collect(),
            children: variant
                .hops
                .iter()
                .map(|h| h.downstream.iter().filter_map(|d| index(d)).collect())
                .collect(),
            policies: variant.hops.iter().map(|h| h.client.clone()).collect(),
        }
    }

    fn hops(&self) -> usize {
        self.names.len()
    }

    /// Whether calls into hop `i` go through a client policy.
    fn policed(&self, i: usize) -> bool {
        !self.policies[i].is_plain()
    }
}

/// How an attempt of a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    Ok,
    Failed,
    /// Still running when another attempt answered or the call ended.
    Cancelled,
}

/// One attempt of a call, as the caller timed it (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attempt {
    pub start_ns: u64,
    pub took_ns: u64,
    pub end: AttemptEnd,
}

/// One hop's part of one ok request (ns).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HopPart {
    pub reach: u64,
    pub queue: u64,
    pub own: u64,
    pub rest: u64,
    /// The whole call into this hop, policy included, as the caller timed
    /// it.
    pub call: u64,
    /// The call's attempts.
    pub attempts: Vec<Attempt>,
}

/// One ok request cut into segments: the row composition reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Row {
    pub lateness: u64,
    /// Per hop, in the scenario's order.
    pub hops: Vec<HopPart>,
    /// The request's measured latency.
    pub latency: u64,
}

/// A call's attempts over the run.
struct AttemptAcc {
    ok: Histogram<u64>,
    failed: Histogram<u64>,
    cancelled: Histogram<u64>,
    /// When the second attempt went, for calls that sent one.
    second_at: Histogram<u64>,
}

impl AttemptAcc {
    fn new() -> AttemptAcc {
        AttemptAcc {
            ok: new_histogram(),
            failed: new_histogram(),
            cancelled: new_histogram(),
            second_at: new_histogram(),
        }
    }

    fn record(&mut self, attempts: &[Attempt]) {
        for a in attempts {
            let h = match a.end {
                AttemptEnd::Ok => &mut self.ok,
                AttemptEnd::Failed => &mut self.failed,
                AttemptEnd::Cancelled => &mut self.cancelled,
            };
            record_us(h, a.took_ns / 1_000);
        }
        if let Some(second) = attempts.get(1) {
            record_us(&mut self.second_at, second.start_ns / 1_000);
        }
    }

    fn resampled(&self, rng: &mut ChaCha8Rng) -> AttemptAcc {
        AttemptAcc {
            ok: resample(&self.ok, rng),
            failed: resample(&self.failed, rng),
            cancelled: resample(&self.cancelled, rng),
            second_at: self.second_at.clone(),
        }
    }
}

/// One hop's segments over the run, µs.
struct HopAcc {
    segments: [Histogram<u64>; 4],
    attempts: AttemptAcc,
}

/// A uniform sample of the run's rows (Vitter's algorithm R), seeded.
struct Reservoir {
    rows: Vec<Vec<u64>>,
    /// The most rows it keeps.
    size: usize,
    seen: u64,
    rng: ChaCha8Rng,
}

impl Reservoir {
    fn offer(&mut self, row: impl FnOnce() -> Vec<u64>) {
        self.seen += 1;
        if self.rows.len() < self.size {
            self.rows.push(row());
            return;
        }
        let at = self.rng.random_range(0..self.seen);
        if let Ok(at) = usize::try_from(at)
            && at < self.size
        {
            self.rows[at] = row();
        }
    }
}

/// Accumulates one variant's segments, request by request.
pub(crate) struct CompositionAcc {
    tree: Tree,
    lateness: Histogram<u64>,
    hops: Vec<HopAcc>,
    latency: Histogram<u64>,
    reservoir: Reservoir,
    ok: u64,
    censored: u64,
    /// Ok requests whose path did not have every hop (not composed).
    incomplete: u64,
    timeout: Duration,
    follows: Vec<bool>,
}

/// What the caller knows besides the requests.
#[derive(Clone, Copy)]
pub(crate) struct CompositionContext<'a> {
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
pub(crate) type Declare<'a> =
    dyn Fn(Grid, &dyn Fn(usize) -> Dist, Option<&[String]>) -> Result<Dist, String> + 'a;

impl CompositionAcc {
    pub(crate) fn new(variant: &Variant) -> CompositionAcc {
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
            reservoir: Reservoir {
                rows: Vec::new(),
                size: RESERVOIR.min(RESERVOIR_VALUES / (1 + PER_HOP * variant.hops.len())),
                seen: 0,
                rng: ChaCha8Rng::seed_from_u64(0x636f_6d70),
            },
            ok: 0,
            censored: 0,
            incomplete: 0,
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
    pub(crate) fn observe(&mut self, r: &RequestRecord) {
        match r.outcome {
            Outcome::Ok => {
                let row = row_of(&self.tree, r);
                self.record(row);
            }
            _ => self.censored(),
        }
    }

    /// Counts a request that failed or timed out: censored.
    pub(crate) fn censored(&mut self) {
        self.censored += 1;
    }

    /// Counts an ok request's row; `None` (its path lacked a hop) counts
    /// as incomplete.
    pub(crate) fn record(&mut self, row: Option<Row>) {
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

    /// The finished composition; `None` without an ok request to compose.
    pub(crate) fn finish(self, context: &CompositionContext<'_>) -> Option<CompositionReport> {
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
        let shuffle = self.shuffle();
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
        let dependence = self.dependence(&measured, &composed, shuffle.as_ref());
        let check = context
            .check
            .then(|| judge(&measured, &composed, &dependence, self.ok, grid, context));
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
            declared_note: declared.err(),
            predicted_censored,
            segments: self.segment_summaries(),
            dependence,
            check,
            spectrum,
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
    fn dists(&self, grid: Grid, hops: &[HopAcc], lateness: &Histogram<u64>) -> Segments {
        Segments {
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
    ) -> Result<Dist, String> {
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

    /// The shuffled estimate, from the reservoir; `None` when it is empty.
    /// Each synthetic request takes every column from a request drawn
    /// apart. Two passes over the same seeded draws: the latencies, then
    /// the columns' means over the slowest 1 % (so no synthetic row is
    /// kept).
    fn shuffle(&self) -> Option<Shuffled> {
        let rows = &self.reservoir.rows;
        let width = rows.first()?.len();
        let draws = SHUFFLED.min(SHUFFLED_VALUES / width).max(rows.len());
        let synthetic = |rng: &mut ChaCha8Rng, row: &mut Vec<u64>| {
            row.clear();
            row.extend((0..width).map(|c| rows[rng.random_range(0..rows.len())][c]));
        };
        let mut row = Vec::with_capacity(width);
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let mut sorted: Vec<u64> = (0..draws)
            .map(|_| {
                synthetic(&mut rng, &mut row);
                recompose(&self.tree, &row)
            })
            .collect();
        sorted.sort_unstable();
        let tail_from = sorted[draws - (draws / 100).max(1)];
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let (mut sums, mut count) = (vec![0.0; width], 0usize);
        for _ in 0..draws {
            synthetic(&mut rng, &mut row);
            if recompose(&self.tree, &row) >= tail_from {
                count += 1;
                for (s, v) in sums.iter_mut().zip(&row) {
                    *s += *v as f64;
                }
            }
        }
        let tail_mean = sums
            .iter()
            .map(|s| s / count.max(1) as f64 / 1_000.0)
            .collect();
        Some(Shuffled { sorted, tail_mean })
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

    /// The dependence figure and where it comes from.
    fn dependence(
        &self,
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
        let names = column_names(&self.tree);
        let mut correlations = correlations(&self.tree, &self.reservoir.rows, &names);
        let tail = shuffled
            .map(|s| tail_excess(&self.tree, &self.reservoir.rows, s, &names))
            .unwrap_or_default();
        let explained = explain(&correlations, &tail, &self.follows, &self.tree.names);
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
}

/// An ok request cut into the segments of the module doc; `None` when its
/// path lacks a hop of the tree or a caller's timing of a call.
fn row_of(tree: &Tree, r: &RequestRecord) -> Option<Row> {
    let mut records: Vec<Option<&HopRecord>> = vec![None; tree.hops()];
    for h in &r.path {
        let &i = tree.index.get(h.hop.as_str())?;
        records[i] = Some(h);
    }
    let records: Vec<&HopRecord> = records.into_iter().collect::<Option<_>>()?;
    let mut hops = Vec::with_capacity(tree.hops());
    for (i, h) in records.iter().enumerate() {
        // The call into this hop: the generator's for the first hop, the
        // caller's own record's timing for the others.
        let (call, attempts): (u64, &[AttemptTiming]) = if i == 0 {
            (nanos(r.service_latency()), &r.attempts)
        } else {
            let &parent = tree.index.get(h.parent.as_str())?;
            let timing = records[parent].calls.iter().find(|c| c.hop == h.hop)?;
            (timing.call_ns, &timing.attempts)
        };
        let attempts: Vec<Attempt> = attempts.iter().map(attempt_of).collect();
        let answered = attempts
            .iter()
            .rev()
            .find(|a| a.end == AttemptEnd::Ok)
            .map_or(call, |a| a.took_ns);
        let slot = h.slot_wait_ns.min(h.queue_wait_ns);
        let broker = h.queue_wait_ns - slot;
        let longest = h.calls.iter().map(|c| c.call_ns).max().unwrap_or(0);
        hops.push(HopPart {
            reach: answered.saturating_sub(h.total_ns + broker),
            queue: h.queue_wait_ns,
            own: h.service_ns,
            rest: h.total_ns.saturating_sub(slot + h.service_ns + longest),
            call,
            attempts,
        });
    }
    Some(Row {
        lateness: nanos(r.start.saturating_sub(r.intended)),
        hops,
        latency: nanos(r.latency()),
    })
}

fn attempt_of(a: &AttemptTiming) -> Attempt {
    Attempt {
        start_ns: a.start_ns,
        took_ns: a.took_ns,
        end: match ProtoEnd::try_from(a.end) {
            Ok(ProtoEnd::Ok) => AttemptEnd::Ok,
            Ok(ProtoEnd::Cancelled) => AttemptEnd::Cancelled,
            _ => AttemptEnd::Failed,
        },
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether a hop's slowness is tied to its caller's (`slow.follow`).
fn slow_follows(slow: &tailmesh_services::model::Slowness) -> bool {
    slow.follow.is_some_and(|f| f > 0.0)
}

/// A hop part's four segments, in [`HOP_SEGMENTS`] order.
fn segments(part: &HopPart) -> [u64; 4] {
    [part.reach, part.queue, part.own, part.rest]
}

/// A row's columns (ns): lateness, then per hop its segments and its call.
fn columns(row: &Row) -> Vec<u64> {
    let mut out = Vec::with_capacity(1 + PER_HOP * row.hops.len());
    out.push(row.lateness);
    for part in &row.hops {
        out.extend(segments(part));
        out.push(part.call);
    }
    out
}

fn column_names(tree: &Tree) -> Vec<String> {
    let mut out = vec!["lateness".to_string()];
    for name in &tree.names {
        for s in HOP_SEGMENTS {
            out.push(format!("{s}:{name}"));
        }
        out.push(format!("call:{name}"));
    }
    out
}

/// The columns the tree's rules read for a row: a policed hop's call
/// stands for its reach and everything under it.
fn used_columns(tree: &Tree) -> Vec<usize> {
    let mut out = vec![0];
    fn walk(tree: &Tree, i: usize, out: &mut Vec<usize>) {
        let base = 1 + PER_HOP * i;
        if tree.policed(i) {
            out.push(base + 4);
            return;
        }
        out.extend([base, base + 1, base + 2, base + 3]);
        for &c in &tree.children[i] {
            walk(tree, c, out);
        }
    }
    if tree.hops() > 0 {
        walk(tree, 0, &mut out);
    }
    out
}

/// A row's latency by the tree's rules (ns).
fn recompose(tree: &Tree, row: &[u64]) -> u64 {
    fn call(tree: &Tree, i: usize, row: &[u64]) -> u64 {
        let base = 1 + PER_HOP * i;
        if tree.policed(i) {
            return row[base + 4];
        }
        let below = tree.children[i]
            .iter()
            .map(|&c| call(tree, c, row))
            .max()
            .unwrap_or(0);
        row[base] + row[base + 1] + row[base + 2] + row[base + 3] + below
    }
    if tree.hops() == 0 {
        return row[0];
    }
    row[0] + call(tree, 0, row)
}

/// Every segment's distribution, on one grid.
struct Segments {
    lateness: Piece,
    hops: Vec<HopDists>,
}

/// A segment's distribution on the grid, and how far the grid moved its
/// mean (µs): a segment shorter than a bin (a queue wait of 0, a few µs of
/// rest) lands in the first bin, which stands for anything in it, half a
/// bin on average. Summed along the tree, the moves are taken back from
/// the composition ([`settle`]).
struct Piece {
    dist: Dist,
    moved_us: f64,
}

impl Piece {
    /// From a histogram of µs (each value truncated from ns, so half a µs
    /// short on average).
    fn of(h: &Histogram<u64>, grid: Grid) -> Piece {
        let dist = Dist::from_histogram(h, 0, grid).unwrap_or_else(|_| Dist::zero(grid));
        let true_mean = if h.is_empty() { 0.0 } else { h.mean() + 0.5 };
        let moved_us = dist
            .mean()
            .map_or(0.0, |m| m.as_secs_f64() * 1e6 - true_mean);
        Piece { dist, moved_us }
    }
}

/// `d` with the grid's move of its mean taken back.
fn settle(d: Dist, moved_us: f64) -> Dist {
    let by = Duration::from_secs_f64((moved_us.abs() / 1e6).min(3600.0));
    if moved_us > 0.0 {
        d.shift_back(by)
    } else {
        d.shift(by)
    }
}

struct HopDists {
    segments: [Piece; 4],
    /// A policed call's attempts, composed by its policy.
    attempts: Option<Dist>,
}

/// A policed call's distribution from its attempts: the answering time
/// by Kaplan-Meier (cancelled and failed attempts censored), failures by
/// their own times and share, then the policy's rule: retries after
/// failures, or a hedge: `min(X1, D + X2)` with `D` the delays the
/// second copies were measured to go after. `None` without an answered
/// attempt.
fn attempt_dists(acc: &AttemptAcc, policy: &ClientPolicy, grid: Grid) -> Option<Dist> {
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

/// The end-to-end distribution by the tree's rules, the grid's moves of
/// the segments' means taken back (summed along a chain, the largest of a
/// fan-out's branches); `None` when a policed call had no answered
/// attempt.
fn compose(tree: &Tree, s: &Segments) -> Option<Dist> {
    fn call(tree: &Tree, i: usize, s: &Segments) -> Option<(Dist, f64)> {
        let hop = &s.hops[i];
        if tree.policed(i) {
            return hop.attempts.clone().map(|d| (d, 0.0));
        }
        let [reach, queue, own, rest] = &hop.segments;
        let mut time = reach
            .dist
            .then(&queue.dist)
            .then(&own.dist)
            .then(&rest.dist);
        let mut moved = reach.moved_us + queue.moved_us + own.moved_us + rest.moved_us;
        let below: Vec<(Dist, f64)> = tree.children[i]
            .iter()
            .map(|&c| call(tree, c, s))
            .collect::<Option<_>>()?;
        if !below.is_empty() {
            let dists: Vec<Dist> = below.iter().map(|(d, _)| d.clone()).collect();
            time = time.then(&Dist::max_of(&dists));
            moved += below.iter().map(|(_, m)| *m).fold(f64::MIN, f64::max);
        }
        Some((time, moved))
    }
    if tree.hops() == 0 {
        return Some(settle(s.lateness.dist.clone(), s.lateness.moved_us));
    }
    let (first, moved) = call(tree, 0, s)?;
    Some(settle(
        s.lateness.dist.then(&first),
        s.lateness.moved_us + moved,
    ))
}

/// The shuffled requests' latencies (ns, sorted) and each column's mean
/// over the slowest 1 % of them (µs).
struct Shuffled {
    sorted: Vec<u64>,
    tail_mean: Vec<f64>,
}

impl Shuffled {
    /// The quantile `q` (µs) of all requests, the censored share last.
    fn quantile(&self, q: f64, censored: f64) -> Option<f64> {
        let within = q / (1.0 - censored);
        if within > 1.0 || self.sorted.is_empty() {
            return None;
        }
        let k =
            ((within * self.sorted.len() as f64).ceil() as usize).clamp(1, self.sorted.len()) - 1;
        Some(self.sorted[k] as f64 / 1_000.0)
    }
}

/// 95 % intervals (µs), one per quantile; `None` past the grid.
type Intervals = Vec<(Option<f64>, Option<f64>)>;

/// The quantile `q` of `d` in µs, `None` beyond.
fn us_at(d: &Dist, q: f64) -> Option<f64> {
    d.quantile(q).map(|t| t.as_secs_f64() * 1e6)
}

/// The 2.5th and 97.5th percentiles of replicates (a missing value, past
/// the grid, sorts last).
fn interval(mut draws: Vec<Option<f64>>) -> (Option<f64>, Option<f64>) {
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

fn band_of(d: &Dist, qs: &[f64], bands: &[(Option<f64>, Option<f64>)]) -> QuantileBand {
    QuantileBand {
        point: Quantiles::from_slice(&qs.iter().map(|q| us_at(d, *q)).collect::<Vec<_>>()),
        low: Quantiles::from_slice(&bands.iter().map(|b| b.0).collect::<Vec<_>>()),
        high: Quantiles::from_slice(&bands.iter().map(|b| b.1).collect::<Vec<_>>()),
    }
}

fn summary_of(name: &str, h: &Histogram<u64>) -> SegmentSummary {
    let at = |q: f64| (!h.is_empty()).then(|| h.value_at_quantile(q) as f64);
    SegmentSummary {
        segment: name.to_string(),
        mean_us: (!h.is_empty()).then(|| h.mean()),
        p50_us: at(0.5),
        p99_us: at(0.99),
    }
}

/// Pearson correlations of the reservoir's segments (of `ln(1 + µs)`:
/// heavy tails would let a few requests decide), between segments of
/// different hops (and the lateness), largest first, `MIN_CORRELATION`
/// and above.
fn correlations(tree: &Tree, rows: &[Vec<u64>], names: &[String]) -> Vec<Correlation> {
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

fn pearson(x: &[f64], y: &[f64]) -> Option<f64> {
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
fn tail_excess(
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
const REPORTED_CORRELATIONS: usize = 6;

/// Where the dependence comes from, in words, when the correlations say,
/// and the pair that says it. The causes the scenario declares come
/// first: two hops' own times correlated where one's slowness follows the
/// other's (`slow.follow`); then queueing (a queue wait correlated with
/// another hop's segment: requests waiting behind the same slow one);
/// then own times rising together (shared CPU or a shared cause); else
/// the strongest correlation.
fn explain(
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
                "; in the tail, {} averages {:.1} ms against {:.1} ms if independent",
                t.segment,
                t.measured_us / 1e3,
                t.shuffled_us / 1e3
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

/// The distribution check: each quantile the measurement can judge,
/// measured against composed, within the intervals or the tolerance.
fn judge(
    measured: &QuantileBand,
    composed: &QuantileBand,
    dependence: &Dependence,
    ok: u64,
    grid: Grid,
    context: &CompositionContext<'_>,
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
        if !(overlap || (c - m).abs() <= context.tolerance * m) {
            misses.push(format!(
                "{}: measured {} against composed {} ({:+.0} %)",
                label(*q),
                ms(m),
                ms(c),
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
                context.tolerance * 100.0
            ),
        };
    }
    let why = dependence.source.clone().or_else(|| {
        dependence.tail.first().map(|t| {
            format!(
                "{} is longer in the measured tail ({:.1} ms) than if independent ({:.1} ms)",
                t.segment,
                t.measured_us / 1e3,
                t.shuffled_us / 1e3
            )
        })
    });
    let reason = format!(
        "{}{}",
        misses.join("; "),
        why.map(|w| format!(" — {w}")).unwrap_or_default()
    );
    if context.machine.busy {
        return DistributionCheck {
            verdict: Verdict::Inconclusive,
            reason: format!(
                "the machine was busy ({}): {reason}",
                context.machine.reasons.join(", ")
            ),
        };
    }
    DistributionCheck {
        verdict: Verdict::Fail,
        reason,
    }
}

/// The variant's distribution verdict when its schedule has fault
/// windows: the whole run mixes phases whose segments differ (a slow
/// window lengthens every request in it at once: a dependence through
/// time that no independent composition of the whole run can show), so
/// each phase is judged on its own and the variant takes the worst
/// decided verdict: fail if a phase fails, else pass if one passes, else
/// inconclusive.
pub(crate) fn judged_by_phase(
    whole: DistributionCheck,
    phases: &[PhaseReport],
) -> DistributionCheck {
    let judged: Vec<(&str, &DistributionCheck)> = phases
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.composition.as_ref()?.check.as_ref()?)))
        .collect();
    if judged.is_empty() {
        return whole;
    }
    let verdict = if judged.iter().any(|(_, c)| c.verdict == Verdict::Fail) {
        Verdict::Fail
    } else if judged.iter().any(|(_, c)| c.verdict == Verdict::Pass) {
        Verdict::Pass
    } else {
        Verdict::Inconclusive
    };
    let each: Vec<String> = judged
        .iter()
        .map(|(name, c)| match c.verdict {
            Verdict::Pass => format!("{name} pass"),
            v => format!("{name} {} ({})", v.as_str(), c.reason),
        })
        .collect();
    DistributionCheck {
        verdict,
        reason: format!(
            "judged per phase: {}; the whole run: {} ({})",
            each.join("; "),
            whole.verdict.as_str(),
            whole.reason
        ),
    }
}

fn label(q: f64) -> String {
    match q {
        0.5 => "p50".into(),
        0.9 => "p90".into(),
        0.99 => "p99".into(),
        0.999 => "p99.9".into(),
        _ => format!("p{}", q * 100.0),
    }
}

fn ms(us: f64) -> String {
    format!("{:.2} ms", us / 1e3)
}

/// p50, p90, p99 and p99.9 in µs; `null` where unknown (censored).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
}

impl Quantiles {
    fn from_fn(mut f: impl FnMut(f64) -> Option<f64>) -> Quantiles {
        Quantiles {
            p50_us: f(QUANTILES[0]),
            p90_us: f(QUANTILES[1]),
            p99_us: f(QUANTILES[2]),
            p999_us: f(QUANTILES[3]),
        }
    }

    fn from_slice(v: &[Option<f64>]) -> Quantiles {
        let at = |k: usize| v.get(k).copied().flatten();
        Quantiles {
            p50_us: at(0),
            p90_us: at(1),
            p99_us: at(2),
            p999_us: at(3),
        }
    }

    /// The value at the k-th quantile: p50, p90, p99, p99.9.
    pub fn get(&self, k: usize) -> Option<f64> {
        [self.p50_us, self.p90_us, self.p99_us, self.p999_us]
            .get(k)
            .copied()
            .flatten()
    }
}

/// Quantiles with their 95 % interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantileBand {
    #[serde(flatten)]
    pub point: Quantiles,
    pub low: Quantiles,
    pub high: Quantiles,
}

/// One segment over the run, µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentSummary {
    /// `lateness`, or `<segment>:<hop>` (`reach`, `queue`, `own`, `rest`).
    pub segment: String,
    pub mean_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// Two segments that rise and fall together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Correlation {
    pub a: String,
    pub b: String,
    /// Pearson's r of `ln(1 + µs)` over the sampled requests.
    pub r: f64,
}

/// A segment's mean in the slowest 1 % of requests, measured against
/// shuffled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TailSegment {
    pub segment: String,
    pub measured_us: f64,
    pub shuffled_us: f64,
}

/// What the hops' dependence adds to the tail.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dependence {
    /// Measured minus composed, µs.
    pub excess: Quantiles,
    /// The same over composed (0.25: the measured quantile is 25 % above).
    pub excess_share: Quantiles,
    /// The strongest correlations between segments of different hops.
    pub correlations: Vec<Correlation>,
    /// Segments longer in the measured tail than in the shuffled one.
    pub tail: Vec<TailSegment>,
    /// Where it comes from, when the correlations tell.
    pub source: Option<String>,
}

/// `[check] distribution`'s verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistributionCheck {
    pub verdict: Verdict,
    pub reason: String,
}

/// One point of the percentile spectrum, µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpectrumPoint {
    pub q: f64,
    pub measured_us: Option<f64>,
    pub measured_low_us: Option<f64>,
    pub measured_high_us: Option<f64>,
    pub composed_us: Option<f64>,
    pub composed_low_us: Option<f64>,
    pub composed_high_us: Option<f64>,
    pub shuffled_us: Option<f64>,
    pub declared_us: Option<f64>,
}

/// The whole tail, composed and measured (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompositionReport {
    /// Requests measured: ok ones composed, plus the censored.
    pub requests: u64,
    /// Failed and timed-out requests (past every latency).
    pub censored: u64,
    /// Ok requests whose path lacked a hop (left out).
    pub incomplete: u64,
    /// The grid's bin, µs.
    pub bin_us: f64,
    pub measured: QuantileBand,
    /// The measured segments composed as independent.
    pub composed: QuantileBand,
    /// Requests recomposed from segments of different requests.
    pub shuffled: Quantiles,
    /// The scenario's declared distributions with the run's measured
    /// overheads; `null` with `declared_note` saying why.
    pub declared: Option<Quantiles>,
    pub declared_note: Option<String>,
    /// The share of requests the composed policies fail (all attempts
    /// failed), before the measured censored share is set.
    pub predicted_censored: Option<f64>,
    pub segments: Vec<SegmentSummary>,
    pub dependence: Dependence,
    /// With `[check] distribution`.
    pub check: Option<DistributionCheck>,
    pub spectrum: Vec<SpectrumPoint>,
}

#[cfg(test)]
mod tests {
    use rand_distr::{Distribution, Exp};

    use super::*;
    use crate::analysis::testing::{hop, variant};

    const MS: u64 = 1_000_000;

    /// a -> b -> c, no slowness declared.
    fn chain() -> Variant {
        let mut hops = vec![hop("a", None), hop("b", None), hop("c", None)];
        hops[0].downstream = vec!["b".into()];
        hops[1].downstream = vec!["c".into()];
        variant("chain", hops)
    }

    fn quiet() -> MachineState {
        MachineState {
            busy: false,
            reasons: Vec::new(),
        }
    }

    fn no_declared(
        _: Grid,
        _: &dyn Fn(usize) -> Dist,
        _: Option<&[String]>,
    ) -> Result<Dist, String> {
        Err("not declared".into())
    }

    fn context(machine: &MachineState) -> CompositionContext<'_> {
        CompositionContext {
            machine,
            check: true,
            tolerance: crate::scenario::DEFAULT_DISTRIBUTION_TOLERANCE,
            declare: &no_declared,
            faults: None,
        }
    }

    /// A row of a plain chain whose latency is the sum of its segments.
    fn row(lateness: u64, parts: Vec<[u64; 4]>) -> Row {
        let mut hops: Vec<HopPart> = parts
            .iter()
            .map(|s| HopPart {
                reach: s[0],
                queue: s[1],
                own: s[2],
                rest: s[3],
                call: 0,
                attempts: Vec::new(),
            })
            .collect();
        // Each call is its segments plus the calls below it.
        let mut below = 0;
        for part in hops.iter_mut().rev() {
            part.call = part.reach + part.queue + part.own + part.rest + below;
            below = part.call;
        }
        Row {
            lateness,
            latency: lateness + below,
            hops,
        }
    }

    fn run(
        variant: &Variant,
        rows: impl IntoIterator<Item = Row>,
        machine: &MachineState,
    ) -> CompositionReport {
        let mut acc = CompositionAcc::new(variant);
        for r in rows {
            acc.record(Some(r));
        }
        acc.finish(&context(machine)).expect("a composition")
    }

    fn rel(a: Option<f64>, b: Option<f64>) -> f64 {
        let (a, b) = (a.expect("a value"), b.expect("a value"));
        (a - b).abs() / b
    }

    #[test]
    fn a_row_recomposes_to_its_latency() {
        let v = chain();
        let tree = Tree::of(&v);
        let r = row(
            7_000,
            vec![
                [100_000, 0, MS, 5_000],
                [90_000, 2_000, 3 * MS, 4_000],
                [80_000, 0, 2 * MS, 1_000],
            ],
        );
        assert_eq!(recompose(&tree, &columns(&r)), r.latency);
        // A fan-out waits for its slowest branch.
        let mut fan = vec![hop("root", None), hop("x", None), hop("y", None)];
        fan[0].downstream = vec!["x".into(), "y".into()];
        let tree = Tree::of(&variant("fan", fan));
        let cols = columns(&Row {
            lateness: 0,
            latency: 0,
            hops: vec![
                HopPart {
                    own: MS,
                    ..HopPart::default()
                },
                HopPart {
                    own: 5 * MS,
                    ..HopPart::default()
                },
                HopPart {
                    own: 2 * MS,
                    ..HopPart::default()
                },
            ],
        });
        assert_eq!(recompose(&tree, &cols), 6 * MS);
    }

    #[test]
    fn independent_hops_compose_to_what_was_measured() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let work = Exp::new(1.0 / 2e6).expect("rate");
        let rows: Vec<Row> = (0..30_000)
            .map(|_| {
                let mut part = || {
                    [
                        50_000 + rng.random_range(0..20_000),
                        0,
                        work.sample(&mut rng) as u64,
                        10_000,
                    ]
                };
                let parts = vec![part(), part(), part()];
                row(rng.random_range(0..5_000), parts)
            })
            .collect();
        let report = run(&chain(), rows, &quiet());
        // The segments shorter than a bin (a queue of 0, 10 µs of rest, a
        // few µs of lateness) keep their means: the composed median is the
        // shuffled one, to the grid's resolution.
        let (c, s) = (report.composed.point.get(0), report.shuffled.get(0));
        assert!(
            rel(c, s) < 0.005,
            "median: composed {c:?} shuffled {s:?}, bin {} µs",
            report.bin_us
        );
        for k in 0..3 {
            let (m, c) = (report.measured.point.get(k), report.composed.point.get(k));
            assert!(
                rel(c, m) < 0.03,
                "quantile {k}: composed {c:?} measured {m:?}"
            );
            assert!(
                rel(report.shuffled.get(k), m) < 0.03,
                "quantile {k}: shuffled {:?} measured {m:?}",
                report.shuffled.get(k)
            );
        }
        let check = report.check.expect("checked");
        assert_eq!(check.verdict, Verdict::Pass, "{}", check.reason);
        assert!(
            report.dependence.correlations.is_empty(),
            "{:?}",
            report.dependence.correlations
        );
        // Intervals hold the points.
        for band in [&report.measured, &report.composed] {
            for k in 0..3 {
                let (lo, p, hi) = (
                    band.low.get(k).expect("low"),
                    band.point.get(k).expect("p"),
                    band.high.get(k).expect("high"),
                );
                assert!(lo <= p * 1.01 && p <= hi * 1.01, "{lo} {p} {hi}");
            }
        }
    }

    #[test]
    fn slowness_shared_by_two_hops_is_named_and_fails_the_check() {
        // A request slow at b is slow at c too: 3 % of requests take 30 ms
        // at both. Independence predicts 30 ms more for about 6 % of
        // requests and 60 ms for 0.09 %: a p99 about 33 ms, where the
        // measured one is 63 ms.
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let rows: Vec<Row> = (0..30_000)
            .map(|_| {
                let slow = rng.random::<f64>() < 0.03;
                let extra = if slow { 30 * MS } else { 0 };
                let jitter = |rng: &mut ChaCha8Rng| MS + rng.random_range(0..100_000);
                row(
                    1_000,
                    vec![
                        [60_000, 0, jitter(&mut rng), 5_000],
                        [60_000, 0, jitter(&mut rng) + extra, 5_000],
                        [60_000, 0, jitter(&mut rng) + extra, 5_000],
                    ],
                )
            })
            .collect();
        let report = run(&chain(), rows.clone(), &quiet());
        let check = report.check.clone().expect("checked");
        assert_eq!(check.verdict, Verdict::Fail, "{}", check.reason);
        assert!(check.reason.contains("p99"), "{}", check.reason);
        let top = &report.dependence.correlations[0];
        assert_eq!(
            (top.a.as_str(), top.b.as_str()),
            ("own:b", "own:c"),
            "{:?}",
            report.dependence.correlations
        );
        assert!(top.r > 0.5, "{top:?}");
        assert!(check.reason.contains("own:b and own:c"), "{}", check.reason);
        let excess = report.dependence.excess.p99_us.expect("p99 excess");
        assert!(
            excess > 20_000.0,
            "measured above the prediction by {excess} µs"
        );
        // On a busy machine the same miss is inconclusive, never a fail.
        let busy = MachineState {
            busy: true,
            reasons: vec!["CPU pressure 90 %".into()],
        };
        let check = run(&chain(), rows, &busy).check.expect("checked");
        assert_eq!(check.verdict, Verdict::Inconclusive, "{}", check.reason);
        assert!(check.reason.contains("busy"), "{}", check.reason);
    }

    #[test]
    fn a_hedged_call_is_composed_from_all_its_attempts() {
        // Attempts take 1 ms, or 50 ms one time in ten; the caller hedges
        // after 5 ms. The answer is min(X1, 5 ms + X2): 1 ms 90 %, 6 ms
        // 9 %, 50 ms 1 %. The cancelled attempts are censored: dropping
        // them (the winners only) would see no 50 ms at all.
        let mut hops = vec![hop("front", None), hop("leaf", None)];
        hops[0].downstream = vec!["leaf".into()];
        hops[1].client.hedge = Some(Hedge::After(Duration::from_millis(5)));
        let v = variant("hedged", hops);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let draw = |rng: &mut ChaCha8Rng| {
            if rng.random::<f64>() < 0.1 {
                50 * MS
            } else {
                MS
            }
        };
        let rows: Vec<Row> = (0..40_000)
            .map(|_| {
                let (x1, x2) = (draw(&mut rng), draw(&mut rng));
                let attempts = if x1 <= 5 * MS {
                    vec![Attempt {
                        start_ns: 0,
                        took_ns: x1,
                        end: AttemptEnd::Ok,
                    }]
                } else if 5 * MS + x2 < x1 {
                    vec![
                        Attempt {
                            start_ns: 0,
                            took_ns: 5 * MS + x2,
                            end: AttemptEnd::Cancelled,
                        },
                        Attempt {
                            start_ns: 5 * MS,
                            took_ns: x2,
                            end: AttemptEnd::Ok,
                        },
                    ]
                } else {
                    vec![
                        Attempt {
                            start_ns: 0,
                            took_ns: x1,
                            end: AttemptEnd::Ok,
                        },
                        Attempt {
                            start_ns: 5 * MS,
                            took_ns: x1 - 5 * MS,
                            end: AttemptEnd::Cancelled,
                        },
                    ]
                };
                let call = x1.min(5 * MS + x2);
                Row {
                    lateness: 0,
                    latency: 10_000 + call,
                    hops: vec![
                        HopPart {
                            reach: 10_000,
                            call: 10_000 + call,
                            ..HopPart::default()
                        },
                        HopPart {
                            own: call,
                            call,
                            attempts,
                            ..HopPart::default()
                        },
                    ],
                }
            })
            .collect();
        let report = run(&v, rows, &quiet());
        let c = |k| report.composed.point.get(k).expect("composed");
        assert!((c(0) / 1_010.0 - 1.0).abs() < 0.05, "p50 {}", c(0));
        assert!(
            (c(2) / 16_010.0 - 1.0).abs() < 0.02 || (c(2) - 6_010.0).abs() < 300.0,
            "p99 {}",
            c(2)
        );
        assert!((c(3) / 50_010.0 - 1.0).abs() < 0.05, "p99.9 {}", c(3));
        let check = report.check.expect("checked");
        assert_eq!(check.verdict, Verdict::Pass, "{}", check.reason);
    }

    #[test]
    fn failed_requests_are_censored_past_every_latency() {
        let v = chain();
        let mut acc = CompositionAcc::new(&v);
        for _ in 0..980 {
            acc.record(Some(row(
                0,
                vec![[0, 0, MS, 0], [0, 0, MS, 0], [0, 0, MS, 0]],
            )));
        }
        for _ in 0..20 {
            acc.censored();
        }
        acc.record(None);
        let report = acc.finish(&context(&quiet())).expect("composition");
        assert_eq!(
            (report.requests, report.censored, report.incomplete),
            (1000, 20, 1)
        );
        assert!(report.measured.point.p50_us.is_some() && report.composed.point.p50_us.is_some());
        // 2 % failed: p99 and p99.9 lie among them, in both.
        assert_eq!(
            (report.measured.point.p99_us, report.composed.point.p99_us),
            (None, None)
        );
        assert_eq!(report.shuffled.p999_us, None);
        assert_eq!(report.declared_note.as_deref(), Some("not declared"));
        // Nothing ok: nothing to compose.
        let mut acc = CompositionAcc::new(&v);
        acc.censored();
        assert!(acc.finish(&context(&quiet())).is_none());
    }

    #[test]
    fn a_declared_cause_is_named_before_a_stronger_correlation() {
        let pair = |a: &str, b: &str, r: f64| Correlation {
            a: a.into(),
            b: b.into(),
            r,
        };
        let hops = ["a".to_string(), "b".to_string(), "c".to_string()];
        let found = [
            pair("lateness", "reach:a", 0.6),
            pair("reach:a", "reach:b", 0.5),
            pair("queue:b", "own:a", 0.3),
            pair("own:b", "own:c", 0.2),
        ];
        // c follows b's slowness: that is the cause, though weaker.
        let (source, named) = explain(&found, &[], &[false, false, true], &hops).expect("a source");
        assert_eq!(named, found[3]);
        assert!(source.starts_with("injected slowness follows"), "{source}");
        // Nothing follows: queueing comes next.
        let (source, named) = explain(&found, &[], &[false; 3], &hops).expect("a source");
        assert_eq!(named, found[2]);
        assert!(source.starts_with("queueing"), "{source}");
        // Only negative correlations: no source.
        assert!(explain(&[pair("own:a", "own:b", -0.4)], &[], &[false; 3], &hops).is_none());
    }

    #[test]
    fn a_far_outlier_coarsens_the_grid_and_the_quantiles_it_cannot_place_are_not_judged() {
        // A lost packet's retransmission: one request of 2 000 takes 3 s
        // where the median is 6 ms. The grid spans the 3 s in 16 384 bins
        // (184 µs each), too coarse to judge the median (3 % of it), fine
        // enough for the p99 near 11 ms.
        let mut v = chain();
        v.load.timeout = Duration::from_secs(5);
        let mut rows: Vec<Row> = (0..2_000u64)
            .map(|i| {
                row(
                    0,
                    vec![
                        [0, 0, MS / 2 + i % 100 * 100_000, 0],
                        [0, 0, MS / 4, 0],
                        [0, 0, MS / 4, 0],
                    ],
                )
            })
            .collect();
        rows.push(row(
            0,
            vec![
                [3_000 * MS, 0, MS / 2, 0],
                [0, 0, MS / 4, 0],
                [0, 0, MS / 4, 0],
            ],
        ));
        let report = run(&v, rows, &quiet());
        assert!(report.bin_us > 150.0, "bin {} µs", report.bin_us);
        let check = report.check.expect("checked");
        assert!(
            !check.reason.contains("p50"),
            "p50 is not judged: {}",
            check.reason
        );
        assert!(check.reason.contains("p99"), "p99 is: {}", check.reason);
    }
}
