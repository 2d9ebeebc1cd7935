//! One slice of a variant's requests counted on its own, for the whole
//! measured phase and for each phase of its schedule alike: how the
//! requests ended, the end-to-end latency of the ok ones, each hop's path
//! records and slow ones, the slow counts of the compounding check, the
//! attribution of the slow requests and the composition of the tail. A
//! variant's report and each phase's take these numbers from one
//! [`SliceAcc`], so the two cannot count differently.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::attribution::{AttributionAcc, AttributionReport};
use super::composition::{CompositionAcc, CompositionContext, CompositionReport};
use super::compounding::{HopSlowness, SlowCounts, compare_over};
use super::facts::work_bound;
use super::stats::{micros, new_histogram, record_us};
use super::verdict::{CompoundingReport, MachineState, decide};
use crate::record::{Outcome, RequestRecord};
use tailmesh_model::scenario::{Check, Variant};

/// One slice's requests, counted as they complete.
pub struct SliceAcc {
    sent: u64,
    ok: u64,
    errors: u64,
    timeouts: u64,
    latency: Histogram<u64>,
    counts: SlowCounts,
    /// Per hop, in scenario order: path records and slow ones.
    hops: Vec<(u64, u64)>,
    attribution: AttributionAcc,
    composition: CompositionAcc,
    /// On paths that vary: each path's visits per hop, and its ok
    /// requests (the compounding model's weights).
    paths: Option<BTreeMap<Vec<u32>, u64>>,
}

/// A finished slice.
pub struct Slice {
    /// Requests meant for it (sent), and how they ended.
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
    pub timeouts: u64,
    /// End-to-end latency of its ok requests, µs.
    pub latency: Histogram<u64>,
    /// Per hop, in scenario order: path records of ok requests, and those
    /// with injected slowness.
    pub hops: Vec<(u64, u64)>,
    /// The compounding check on its requests, when the check runs.
    pub compounding: Option<CompoundingReport>,
    /// Why its slow requests were slow.
    pub attribution: AttributionReport,
    /// Its tail composed from the segments of its requests.
    pub composition: Option<CompositionReport>,
}

/// What judging a slice needs besides its requests.
pub struct SliceJudging<'a> {
    /// The hops' names, in scenario order.
    pub hop_names: &'a [String],
    /// Per hop: the declared slow probability in force in the slice.
    pub declared_p: &'a [f64],
    /// `[check]`'s slow threshold and whether the compounding check runs.
    pub check: &'a Check,
    pub machine: &'a MachineState,
    pub composing: &'a CompositionContext<'a>,
}

impl SliceAcc {
    /// An empty slice of `variant`'s requests, slow past `check`'s
    /// threshold.
    pub fn new(variant: &Variant, check: &Check) -> SliceAcc {
        SliceAcc {
            sent: 0,
            ok: 0,
            errors: 0,
            timeouts: 0,
            latency: new_histogram(),
            counts: SlowCounts::default(),
            hops: vec![(0, 0); variant.hops.len()],
            attribution: AttributionAcc::new(
                check.slow_threshold,
                variant
                    .hops
                    .iter()
                    .filter_map(|h| Some((h.name.clone(), work_bound(h)?)))
                    .collect(),
            ),
            composition: CompositionAcc::new(variant),
            paths: (check.compounding && !variant.fixed_paths()).then(BTreeMap::new),
        }
    }

    /// Counts one completed request; `hop_index` gives a hop's place in
    /// the scenario (path records of other hops are left out here).
    pub fn record(
        &mut self,
        r: &RequestRecord,
        threshold: Duration,
        hop_index: &BTreeMap<String, usize>,
    ) {
        self.sent += 1;
        self.counts.count(r, threshold);
        match &r.outcome {
            Outcome::Ok => {
                self.ok += 1;
                record_us(&mut self.latency, micros(r.latency()));
                let mut visits = self.paths.as_ref().map(|_| vec![0u32; self.hops.len()]);
                for h in &r.path {
                    if let Some(&k) = hop_index.get(h.hop.as_str()) {
                        self.hops[k].0 += 1;
                        self.hops[k].1 += u64::from(h.slow);
                        if let Some(v) = visits.as_mut() {
                            v[k] += 1;
                        }
                    }
                }
                if let (Some(paths), Some(v)) = (self.paths.as_mut(), visits) {
                    *paths.entry(v).or_default() += 1;
                }
            }
            Outcome::Timeout => self.timeouts += 1,
            Outcome::Error { .. } => self.errors += 1,
        }
        self.attribution.record(r);
        self.composition.observe(r);
    }

    /// Ok requests so far.
    pub fn ok(&self) -> u64 {
        self.ok
    }

    /// The end-to-end latency of the ok requests so far, µs.
    pub fn latency(&self) -> &Histogram<u64> {
        &self.latency
    }

    /// The finished slice, judged by `judging`.
    pub fn finish(self, judging: &SliceJudging<'_>) -> Slice {
        let attribution = self.attribution.finish();
        let compounding = judging.check.compounding.then(|| {
            let slowness = judging
                .hop_names
                .iter()
                .zip(&self.hops)
                .zip(judging.declared_p)
                .map(|((hop, &(requests, slow)), &declared_p)| HopSlowness {
                    hop: hop.clone(),
                    requests,
                    slow,
                    p: if requests > 0 {
                        slow as f64 / requests as f64
                    } else {
                        0.0
                    },
                    declared_p,
                })
                .collect();
            let paths: Vec<(Vec<u32>, u64)> = self.paths.into_iter().flatten().collect();
            decide(
                compare_over(
                    self.counts,
                    slowness,
                    micros(judging.check.slow_threshold),
                    &paths,
                ),
                &attribution,
                judging.machine,
            )
        });
        Slice {
            sent: self.sent,
            ok: self.ok,
            errors: self.errors,
            timeouts: self.timeouts,
            latency: self.latency,
            hops: self.hops,
            compounding,
            attribution,
            composition: self.composition.finish(judging.composing),
        }
    }
}
