//! The end-to-end latency a scenario declares, predicted before anything
//! runs: each hop's declared work and faults composed along the call tree
//! with [`compose`](super::compose)'s rules, plus an overhead per hop
//! reached (network, client and server) that the caller supplies: the
//! machine's measured floor before a run (`tailmesh predict`), the run's
//! measured overhead per hop after one.
//!
//! The composition, from the first hop (reached from the load generator):
//! - a hop's own time: its work (a sleep's declared distribution, a slow
//!   replica's factor scaling it), then its injected slowness (a mixture:
//!   `1 - p` nothing more, `p` the extra); replicas that differ (a slow
//!   replica, a replica's network fault) are a mixture in equal shares;
//! - an injected error ends the attempt after that time (the hop fails
//!   after its work, as `handle_from` does), with a code the caller may
//!   retry or not (`tailmesh_model::policy::retryable_code`);
//! - then its downstream calls, stage after stage (times add up), each
//!   stage's calls at once: the maximum of the children's calls, a failure
//!   if any fails (with the code of the first failing child in declared
//!   order, as the hop propagates it); a call made with probability `p` is
//!   a mixture (`1 - p` nothing), a call made `n` times `n` visits one
//!   after another (their sum) or together (their maximum), a weighted
//!   count the mixture of its counts;
//! - a call: the overhead of reaching the child, its network faults (each
//!   packet crossing of a faulty replica's link, two per call), the child's
//!   time, under the caller's client policy: each attempt cut at the
//!   per-attempt timeout (the cut share fails with DEADLINE_EXCEEDED,
//!   which is retried), a hedge (`min(X1, after + X2)` on the answers),
//!   retries of the retryable failures, limited by the budget;
//! - the load's timeout censors the end-to-end distribution.
//!
//! Outcomes are kept apart as sub-distributions (`Outcome`: ok, a
//! retryable failure, a terminal one, each a share and the conditional
//! distribution of its time), because a retry follows a failure's time and
//! a timeout turns late answers into failures. Latency past the grid (the
//! load's timeout) is censored wherever it arises, even where a per-attempt
//! timeout would have cut it and retried it.
//!
//! Fault windows make the whole run's prediction a mixture over the
//! stretches between window edges, each weighted by its planned requests
//! (a closed loop's: the stretch's length over its predicted mean latency),
//! each composed with the faults in force then ([`declared_in_force`]
//! composes one such set, named by the labels the phases use).
//!
//! Queueing is not modelled; each hop's utilization is computed and a hop
//! above [`BUSY`] is named in the assumptions.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tailmesh_model::calls::{Call, Repeats};
use tailmesh_model::policy::retryable_code;
use tailmesh_model::{Balance, DurationDist, Transport, Work};

use super::compose::{Dist, Grid};
use super::facts::{self, windowed_faults};
use tailmesh_model::scenario::{
    ConnectionMode, Hedge, Hop, LoadMode, NetFault, Stop, Variant, Window,
};

/// The utilization above which a hop's queueing, which the prediction
/// leaves out, is named in the assumptions.
pub const BUSY: f64 = 0.5;

/// The time to reach a hop beyond its declared work (network, client and
/// server overhead, both ways), per call attempt, on the grid the
/// prediction is made on (a different grid panics, as compose's rules do).
pub type Overhead<'a> = &'a dyn Fn(&Hop) -> Dist;

/// A prediction: the end-to-end distribution (failures and timeouts
/// beyond), and every assumption it made that the scenario did not state.
#[derive(Clone, Debug, PartialEq)]
pub struct Declared {
    pub dist: Dist,
    pub assumptions: Vec<String>,
}

/// Why a variant has no declared prediction.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Undeclared {
    #[error("hop \"{hop}\" does cpu work: its time depends on the machine, not on the scenario")]
    CpuWork { hop: String },
    #[error(
        "hop \"{hop}\" calls a real gRPC service ([hop.service]): its time is the service's, \
         not the scenario's"
    )]
    Service { hop: String },
    #[error("hop \"{hop}\" calls itself through its downstream hops")]
    Cycle { hop: String },
}

/// The whole run's prediction for `variant` on `grid`: a mixture over the
/// stretches between its fault windows' edges (one stretch without
/// windows), each weighted by its planned requests.
pub fn declared(
    variant: &Variant,
    grid: Grid,
    overhead: Overhead<'_>,
) -> Result<Declared, Undeclared> {
    let spans = windowed_faults(variant);
    if spans.is_empty() {
        return declared_in_force(variant, grid, overhead, &|_| false);
    }
    let mut assumptions = Vec::new();
    let length = match planned_length(variant) {
        Some(l) => l,
        None => {
            // A closed loop that stops by count: Little's law on the
            // prediction without any window in force.
            let quiet = declared_in_force(variant, grid, overhead, &|_| false)?;
            let n = match variant.load.stop {
                Stop::Requests(n) => n as f64,
                Stop::Duration(d) => d.as_secs_f64(),
            };
            let in_flight = match variant.load.mode {
                LoadMode::Closed { concurrency } => f64::from(concurrency),
                LoadMode::Open { .. } => 1.0,
            };
            let mean = quiet.dist.mean().unwrap_or(grid.horizon()).as_secs_f64();
            note(
                &mut assumptions,
                "the run's length taken as requests x predicted mean latency / in flight (Little's law), to weigh the fault windows".to_owned(),
            );
            Duration::from_secs_f64((n * mean / in_flight).max(1e-6))
        }
    };
    let mut edges: Vec<Duration> = vec![Duration::ZERO, length];
    for (_, w) in &spans {
        edges.push(w.start);
        if let Some(d) = w.duration {
            edges.push(w.start + d);
        }
    }
    edges.retain(|e| *e <= length);
    edges.sort();
    edges.dedup();
    // The same set of faults in force is composed once.
    let mut by_set: BTreeMap<Vec<String>, f64> = BTreeMap::new();
    for pair in edges.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let in_force: Vec<String> = spans
            .iter()
            .filter(|(_, w)| in_window(w, from))
            .map(|(label, _)| label.clone())
            .collect();
        *by_set.entry(in_force).or_insert(0.0) += requests_between(variant, from, to);
    }
    let mut parts = Vec::new();
    for (in_force, weight) in by_set {
        if weight <= 0.0 {
            continue;
        }
        let part = declared_in_force(variant, grid, overhead, &|label| {
            in_force.iter().any(|l| l == label)
        })?;
        for a in part.assumptions {
            note(&mut assumptions, a);
        }
        // A closed loop sends in a stretch its length over the latency
        // there, times its in flight (Little's law).
        let weight = match (&variant.load.mode, part.dist.mean()) {
            (LoadMode::Closed { .. }, Some(mean)) if mean > Duration::ZERO => {
                weight / mean.as_secs_f64()
            }
            _ => weight,
        };
        parts.push((weight, part.dist));
    }
    let dist = if parts.is_empty() {
        declared_in_force(variant, grid, overhead, &|_| false)?.dist
    } else {
        Dist::mix(&parts)
    };
    Ok(Declared { dist, assumptions })
}

/// The prediction with the faults that have a window in force or not, as
/// `in_force` says of each one's label (`slow b`, `replica_slow b/2`,
/// `error b`, `net b`, `net b/1`, as the phases name them); faults without
/// a window are always in force.
pub fn declared_in_force(
    variant: &Variant,
    grid: Grid,
    overhead: Overhead<'_>,
    in_force: &dyn Fn(&str) -> bool,
) -> Result<Declared, Undeclared> {
    let mut c = Composer::new(variant, grid, overhead, in_force)?;
    // The entry hops, a mixture by their shares of the requests, each
    // reached from the generators' links (a mixture too when they differ).
    let links = c.generator_links();
    let mut entries = Vec::new();
    for (i, share) in variant.entries() {
        for (link_share, net) in &links {
            let net = net.as_ref().and_then(|n| crossings(n, grid));
            entries.push((share * link_share, c.call(i, net.as_ref(), 0)?));
        }
    }
    let root = match entries.len() {
        1 => entries
            .pop()
            .map(|(_, o)| o)
            .unwrap_or_else(|| Outcome::done(never(grid))),
        _ => Outcome::mix(&entries),
    };
    let ok = root.ok.as_ref();
    let share = ok.map_or(0.0, |p| p.p.clamp(0.0, 1.0));
    let dist = match ok {
        Some(p) if share >= 1.0 => p.d.clone(),
        Some(p) if share > 0.0 => Dist::mix(&[(share, p.d.clone()), (1.0 - share, never(grid))]),
        _ => never(grid),
    }
    .truncate(variant.load.timeout);
    let mut assumptions = std::mem::take(&mut c.assumptions);
    if variant.load.connection == ConnectionMode::PerRequest {
        note(
            &mut assumptions,
            "a new connection per request: its handshake is not in the overhead".to_owned(),
        );
    }
    let at = if variant.load.steps().is_empty() {
        ""
    } else {
        " at the highest step's rate"
    };
    for (hop, u) in c.utilization(&dist) {
        // As printed: a half-bin of rounding does not make 50 % busy.
        if (u * 100.0).round() > BUSY * 100.0 {
            note(
                &mut assumptions,
                format!(
                    "hop {hop} at {:.0} % utilization{at}: queueing not modelled, the prediction is optimistic",
                    u * 100.0
                ),
            );
        }
    }
    Ok(Declared { dist, assumptions })
}

/// Adds an assumption once.
fn note(assumptions: &mut Vec<String>, line: String) {
    if !assumptions.contains(&line) {
        assumptions.push(line);
    }
}

/// All mass beyond the grid.
fn never(grid: Grid) -> Dist {
    Dist::point(grid, grid.horizon())
}

fn in_window(w: &Window, t: Duration) -> bool {
    w.start <= t && w.duration.is_none_or(|d| t < w.start + d)
}

/// The measured duration the load is planned to last, when the scenario
/// fixes it.
fn planned_length(variant: &Variant) -> Option<Duration> {
    let load = &variant.load;
    match (&load.mode, load.stop) {
        (LoadMode::Open { steps, .. }, _) if !steps.is_empty() => {
            Some(steps.iter().map(|s| s.duration).sum())
        }
        (_, Stop::Duration(d)) => Some(d),
        (LoadMode::Open { rate, .. }, Stop::Requests(n)) if *rate > 0.0 => {
            Some(Duration::from_secs_f64(n as f64 / rate))
        }
        _ => None,
    }
}

/// The requests planned between `from` and `to` on the measured clock,
/// up to a constant: the time, times the step's rate under load steps.
fn requests_between(variant: &Variant, from: Duration, to: Duration) -> f64 {
    let steps = variant.load.steps();
    if steps.is_empty() {
        return (to - from).as_secs_f64();
    }
    let mut at = Duration::ZERO;
    let mut total = 0.0;
    for s in steps {
        let (lo, hi) = (at.max(from), (at + s.duration).min(to));
        if hi > lo {
            total += s.rate * (hi - lo).as_secs_f64();
        }
        at += s.duration;
    }
    total
}

/// A share of the outcomes and the distribution of their time, given the
/// outcome (beyond: past the grid).
#[derive(Clone, Debug)]
struct Part {
    p: f64,
    d: Dist,
}

/// How an attempt or a call ends: answered, failed with a code callers
/// retry, failed otherwise. The shares sum to 1.
#[derive(Clone, Debug)]
struct Outcome {
    ok: Option<Part>,
    retryable: Option<Part>,
    terminal: Option<Part>,
}

/// The mixture of `parts` (share, distribution) as one part; `None` when
/// no share is positive.
fn merge(parts: Vec<(f64, Dist)>) -> Option<Part> {
    let parts: Vec<(f64, Dist)> = parts
        .into_iter()
        .filter(|(w, _)| *w > 0.0 && w.is_finite())
        .collect();
    if parts.is_empty() {
        return None;
    }
    let p = parts.iter().map(|(w, _)| w).sum();
    let d = if parts.len() == 1 {
        parts.into_iter().next().map(|(_, d)| d)?
    } else {
        Dist::mix(&parts)
    };
    Some(Part { p, d })
}

impl Outcome {
    fn parts(&self) -> [&Option<Part>; 3] {
        [&self.ok, &self.retryable, &self.terminal]
    }

    /// Every part's time plus `d`.
    fn then(&self, d: &Dist) -> Outcome {
        let add = |part: &Option<Part>| {
            part.as_ref().map(|p| Part {
                p: p.p,
                d: p.d.then(d),
            })
        };
        Outcome {
            ok: add(&self.ok),
            retryable: add(&self.retryable),
            terminal: add(&self.terminal),
        }
    }

    /// The time an attempt ends, whatever the outcome.
    fn any(&self) -> Option<Dist> {
        merge(
            self.parts()
                .into_iter()
                .flatten()
                .map(|p| (p.p, p.d.clone()))
                .collect(),
        )
        .map(|p| p.d)
    }

    /// The mixture of `outcomes` with weights.
    fn mix(outcomes: &[(f64, Outcome)]) -> Outcome {
        let pick = |f: fn(&Outcome) -> &Option<Part>| {
            merge(
                outcomes
                    .iter()
                    .filter_map(|(w, o)| f(o).as_ref().map(|p| (w * p.p, p.d.clone())))
                    .collect(),
            )
        };
        Outcome {
            ok: pick(|o| &o.ok),
            retryable: pick(|o| &o.retryable),
            terminal: pick(|o| &o.terminal),
        }
    }

    /// Done in `d`, always ok.
    fn done(d: Dist) -> Outcome {
        Outcome {
            ok: Some(Part { p: 1.0, d }),
            retryable: None,
            terminal: None,
        }
    }

    /// This, then `next` once this is ok: times add up; a failure of
    /// either ends it then.
    fn followed_by(&self, next: &Outcome) -> Outcome {
        let after_ok = |kind: &Option<Part>| {
            self.ok.as_ref().zip(kind.as_ref()).map(|(a, b)| Part {
                p: a.p * b.p,
                d: a.d.then(&b.d),
            })
        };
        let either = |mine: &Option<Part>, theirs: &Option<Part>| {
            merge(
                [mine.clone(), after_ok(theirs)]
                    .into_iter()
                    .flatten()
                    .map(|p| (p.p, p.d))
                    .collect(),
            )
        };
        Outcome {
            ok: after_ok(&next.ok),
            retryable: either(&self.retryable, &next.retryable),
            terminal: either(&self.terminal, &next.terminal),
        }
    }

    /// Calls made together, waited for together: the maximum of their
    /// times; ok when all are, else failed with the kind of the first
    /// failure in order.
    fn all(calls: Vec<Outcome>) -> Option<Outcome> {
        let mut calls = calls.into_iter();
        let mut acc = calls.next()?;
        for x in calls {
            let both = |a: &Option<Part>, b: &Option<Part>| {
                a.as_ref()
                    .zip(b.as_ref())
                    .map(|(a, b)| (a.p * b.p, Dist::max_of(&[a.d.clone(), b.d.clone()])))
            };
            let x_any = x.any().map(|d| Part { p: 1.0, d });
            let ok = both(&acc.ok, &x.ok).and_then(|(p, d)| merge(vec![(p, d)]));
            let failed = |acc_kind: &Option<Part>, x_kind: &Option<Part>| {
                merge(
                    [both(acc_kind, &x_any), both(&acc.ok, x_kind)]
                        .into_iter()
                        .flatten()
                        .collect(),
                )
            };
            let retryable = failed(&acc.retryable, &x.retryable);
            let terminal = failed(&acc.terminal, &x.terminal);
            acc = Outcome {
                ok,
                retryable,
                terminal,
            };
        }
        Some(acc)
    }
}

/// The part of `d` below `t`, as its share and its distribution given
/// that; `None` when nothing is below `t`.
fn below(d: &Dist, t: Duration) -> Option<(f64, Dist)> {
    let grid = d.grid();
    let at = t.as_secs_f64() / grid.bin().as_secs_f64();
    let mass = d.mass();
    if d.beyond() == 0.0 && (mass.len() as f64) <= at {
        return Some((1.0, d.clone()));
    }
    let kept: Vec<f64> = mass
        .iter()
        .enumerate()
        .map(|(k, m)| m * (at - k as f64).clamp(0.0, 1.0))
        .collect();
    let share: f64 = kept.iter().sum();
    if share.is_nan() || share <= 0.0 {
        return None;
    }
    Some((share, from_mass(grid, &kept)?))
}

/// The distribution with these bin masses (normalized), built from points
/// by exact whole-bin shifts: halves, recursively, so the cost stays
/// about `n log n` for `n` bins.
fn from_mass(grid: Grid, mass: &[f64]) -> Option<Dist> {
    let total: f64 = mass.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    if mass.len() == 1 {
        return Some(Dist::zero(grid));
    }
    let mid = mass.len() / 2;
    let (lo, hi) = mass.split_at(mid);
    let (w_lo, w_hi): (f64, f64) = (lo.iter().sum(), hi.iter().sum());
    let offset = grid.bin() * u32::try_from(mid).ok()?;
    let mut parts = Vec::new();
    if w_lo > 0.0 {
        parts.push((w_lo, from_mass(grid, lo)?));
    }
    if w_hi > 0.0 {
        parts.push((w_hi, from_mass(grid, hi)?.shift(offset)));
    }
    if parts.len() == 1 {
        return parts.pop().map(|(_, d)| d);
    }
    Some(Dist::mix(&parts))
}

/// A sleep's declared distribution with every duration times `factor`.
fn scaled(dist: &DurationDist, factor: f64) -> DurationDist {
    if factor == 1.0 {
        return dist.clone();
    }
    let f = |d: &Duration| d.mul_f64(factor);
    match dist {
        DurationDist::Fixed { value } => DurationDist::Fixed { value: f(value) },
        DurationDist::Uniform { min, max } => DurationDist::Uniform {
            min: f(min),
            max: f(max),
        },
        DurationDist::Exp { mean } => DurationDist::Exp { mean: f(mean) },
        DurationDist::Lognormal { mean, sigma } => DurationDist::Lognormal {
            mean: f(mean),
            sigma: *sigma,
        },
        DurationDist::Empirical { quantiles } => DurationDist::Empirical {
            quantiles: quantiles.iter().map(|(q, v)| (*q, f(v))).collect(),
        },
    }
}

/// The time of one packet crossing of a link with `net`'s delay (uniform
/// within its jitter), twice: a call's request in and its answer out.
fn crossings(net: &NetFault, grid: Grid) -> Option<Dist> {
    if net.delay.is_zero() {
        return None;
    }
    let once = if net.jitter.is_zero() {
        DurationDist::Fixed { value: net.delay }
    } else {
        DurationDist::Uniform {
            min: net.delay.saturating_sub(net.jitter),
            max: net.delay + net.jitter,
        }
    };
    let once = Dist::declared(&once, grid);
    Some(once.then(&once))
}

/// Replicas of a hop that behave alike: their share, work factor and
/// network fault in force.
struct Group {
    share: f64,
    factor: f64,
    net: Option<NetFault>,
}

/// One composition: a variant with one set of faults in force.
struct Composer<'a> {
    variant: &'a Variant,
    grid: Grid,
    overhead: Overhead<'a>,
    in_force: &'a dyn Fn(&str) -> bool,
    index: HashMap<&'a str, usize>,
    /// Each hop's attempt as its callers see it, without their own
    /// network faults.
    attempts: HashMap<usize, Outcome>,
    /// Each hop's expected attempts per call.
    tries: HashMap<usize, f64>,
    assumptions: Vec<String>,
}

impl<'a> Composer<'a> {
    fn new(
        variant: &'a Variant,
        grid: Grid,
        overhead: Overhead<'a>,
        in_force: &'a dyn Fn(&str) -> bool,
    ) -> Result<Composer<'a>, Undeclared> {
        if let Some(hop) = variant
            .hops
            .iter()
            .find(|h| matches!(h.work, Work::Cpu { .. }))
        {
            return Err(Undeclared::CpuWork {
                hop: hop.name.clone(),
            });
        }
        if let Some(hop) = variant.hops.iter().find(|h| h.service.is_some()) {
            return Err(Undeclared::Service {
                hop: hop.name.clone(),
            });
        }
        Ok(Composer {
            variant,
            grid,
            overhead,
            in_force,
            index: variant
                .hops
                .iter()
                .enumerate()
                .map(|(i, h)| (h.name.as_str(), i))
                .collect(),
            attempts: HashMap::new(),
            tries: HashMap::new(),
            assumptions: Vec::new(),
        })
    }

    fn on(&self, w: &Window, label: String) -> bool {
        !w.is_scheduled() || (self.in_force)(&label)
    }

    fn hop(&self, i: usize) -> &'a Hop {
        &self.variant.hops[i]
    }

    /// The slowness of hop `i` in force: its probability and extra.
    fn slow(&self, i: usize) -> Option<(f64, &'a DurationDist)> {
        let hop = self.hop(i);
        let s = hop.slow.as_ref()?;
        (s.probability > 0.0 && self.on(&hop.windows.slow, format!("slow {}", hop.name)))
            .then_some((s.probability, &s.extra))
    }

    /// The injected errors of hop `i` in force: probability and code.
    fn error(&self, i: usize) -> Option<(f64, i32)> {
        let hop = self.hop(i);
        let e = hop.error.as_ref()?;
        (e.probability > 0.0 && self.on(&hop.windows.error, format!("error {}", hop.name)))
            .then_some((e.probability, e.code))
    }

    /// The load generators' links grouped by their fault in force, each
    /// with its share of the requests (equal shares: an open loop's
    /// requests are dealt in turn, a closed loop's concurrency split).
    fn generator_links(&mut self) -> Vec<(f64, Option<NetFault>)> {
        let variant = self.variant;
        let load = &variant.load;
        let n = load.generators.max(1);
        let mut links: Vec<(f64, Option<NetFault>)> = Vec::new();
        for k in 0..n {
            let net = load
                .net_of(k)
                .filter(|f| {
                    f.is_active() && self.on(&f.window(), facts::generator_net_label(load, k))
                })
                .cloned();
            if let Some(f) = net.as_ref().filter(|f| f.loss > 0.0) {
                note(
                    &mut self.assumptions,
                    format!(
                        "a load generator's link: {} % packet loss not modelled (retransmissions ignored), the prediction is optimistic",
                        f.loss * 100.0
                    ),
                );
            }
            match links.iter_mut().find(|(_, l)| *l == net) {
                Some((share, _)) => *share += 1.0,
                None => links.push((1.0, net)),
            }
        }
        for (share, _) in &mut links {
            *share /= f64::from(n);
        }
        links
    }

    /// Hop `i`'s replicas grouped by what sets them apart.
    fn groups(&mut self, i: usize) -> Vec<Group> {
        let hop = self.hop(i);
        let slow_replica = hop.replica_slow.as_ref().filter(|r| {
            self.on(
                &hop.windows.replica_slow,
                format!("replica_slow {}/{}", hop.name, r.replica),
            )
        });
        let mut groups: Vec<Group> = Vec::new();
        for r in 0..hop.replicas {
            let factor = slow_replica
                .filter(|s| s.replica == r)
                .map_or(1.0, |s| s.factor);
            let label = if hop.replica_net.iter().any(|n| n.replica == r) {
                format!("net {}/{r}", hop.name)
            } else {
                format!("net {}", hop.name)
            };
            let net = hop
                .net_of(r)
                .filter(|n| n.is_active() && self.on(&n.window(), label))
                .cloned();
            if let Some(n) = net.as_ref().filter(|n| n.loss > 0.0) {
                note(
                    &mut self.assumptions,
                    format!(
                        "hop {}: {} % packet loss not modelled (retransmissions ignored), the prediction is optimistic",
                        hop.name,
                        n.loss * 100.0
                    ),
                );
            }
            match groups
                .iter_mut()
                .find(|g| g.factor == factor && g.net == net)
            {
                Some(g) => g.share += 1.0,
                None => groups.push(Group {
                    share: 1.0,
                    factor,
                    net,
                }),
            }
        }
        if groups.len() > 1 {
            let why = match (hop.transport, hop.balance) {
                (Transport::Pull, _) => Some("is pulled"),
                (Transport::Push, Balance::P2c) => Some("balances p2c"),
                _ => None,
            };
            if let Some(why) = why {
                note(
                    &mut self.assumptions,
                    format!(
                        "hop {} {why}: its replicas taken to serve equal shares",
                        hop.name
                    ),
                );
            }
        }
        let n = f64::from(hop.replicas.max(1));
        for g in &mut groups {
            g.share /= n;
        }
        groups
    }

    /// The own time of hop `i` at a replica with work `factor`: its work,
    /// then its slowness in force. `None`: no time at all.
    fn own(&self, i: usize, factor: f64) -> Option<Dist> {
        let work = match &self.hop(i).work {
            Work::Sleep { dist } => Some(Dist::declared(&scaled(dist, factor), self.grid)),
            Work::None | Work::Cpu { .. } => None,
        };
        let Some((p, extra)) = self.slow(i) else {
            return work;
        };
        let extra = Dist::declared(extra, self.grid);
        let slowed = match &work {
            Some(w) => w.then(&extra),
            None => extra,
        };
        let fast = work.unwrap_or_else(|| Dist::zero(self.grid));
        Some(Dist::mix(&[(1.0 - p, fast), (p, slowed)]))
    }

    /// An attempt to reach hop `i` from a caller without network faults.
    fn attempt(&mut self, i: usize, depth: usize) -> Result<Outcome, Undeclared> {
        if let Some(o) = self.attempts.get(&i) {
            return Ok(o.clone());
        }
        if depth > self.variant.hops.len() {
            return Err(Undeclared::Cycle {
                hop: self.hop(i).name.clone(),
            });
        }
        let hop = self.hop(i);
        let reach = (self.overhead)(hop);
        let error = self.error(i);
        let plan = hop.call_plan();
        let mut by_group = Vec::new();
        for g in self.groups(i) {
            let net = g.net.as_ref().and_then(|n| crossings(n, self.grid));
            // Reaching the replica, its answer's way back, its own time.
            let mut time = reach.clone();
            if let Some(n) = &net {
                time = time.then(n);
            }
            if let Some(own) = self.own(i, g.factor) {
                time = time.then(&own);
            }
            // Its downstream calls cross its own link too: stage after
            // stage, each stage's calls together, each call a mixture of
            // its counts (none with the share not called).
            let mut after = Outcome::done(time.clone());
            for stage in &plan.stages {
                let mut calls = Vec::with_capacity(stage.len());
                for call in stage {
                    let Some(&c) = self.index.get(call.hop.as_str()) else {
                        continue;
                    };
                    let visit = self.call(c, net.as_ref(), depth + 1)?;
                    calls.push(self.repeated(call, &visit));
                }
                if let Some(stage) = Outcome::all(calls) {
                    after = after.followed_by(&stage);
                }
            }
            let outcome = match error {
                None => after,
                Some((p, code)) => {
                    let failed = Outcome {
                        ok: None,
                        retryable: retryable_code(code).then(|| Part {
                            p: 1.0,
                            d: time.clone(),
                        }),
                        terminal: (!retryable_code(code)).then(|| Part {
                            p: 1.0,
                            d: time.clone(),
                        }),
                    };
                    Outcome::mix(&[(1.0 - p, after), (p, failed)])
                }
            };
            by_group.push((g.share, outcome));
        }
        let o = Outcome::mix(&by_group);
        self.attempts.insert(i, o.clone());
        Ok(o)
    }

    /// A call of a caller's plan whose one visit is `visit`: not made with
    /// the share `1 - probability` (done at once), else made each count's
    /// times, the repeats one after another or together.
    fn repeated(&self, call: &Call, visit: &Outcome) -> Outcome {
        let made: Vec<(f64, Outcome)> = call
            .visits()
            .into_iter()
            .filter_map(|(n, w)| {
                let o = match (n, call.repeats) {
                    (0, _) => Some(Outcome::done(Dist::zero(self.grid))),
                    (_, Repeats::Parallel) => Outcome::all(vec![visit.clone(); n as usize]),
                    (_, Repeats::Sequential) => {
                        Some((1..n).fold(visit.clone(), |acc, _| acc.followed_by(visit)))
                    }
                };
                Some((w, o?))
            })
            .collect();
        Outcome::mix(&made)
    }

    /// A call to hop `i` from a caller whose own link adds `net`, under
    /// hop `i`'s client policy.
    fn call(&mut self, i: usize, net: Option<&Dist>, depth: usize) -> Result<Outcome, Undeclared> {
        let mut attempt = self.attempt(i, depth)?;
        if let Some(n) = net {
            attempt = attempt.then(n);
        }
        let (called, tries) = self.policy(i, attempt);
        self.tries.insert(i, tries);
        Ok(called)
    }

    /// `attempt` under hop `i`'s client policy, and the expected attempts
    /// per call.
    fn policy(&mut self, i: usize, attempt: Outcome) -> (Outcome, f64) {
        let hop = self.hop(i);
        let policy = &hop.client;
        if policy.is_plain() {
            return (attempt, 1.0);
        }
        let grid = self.grid;
        let mut o = attempt;
        // Each attempt cut at its timeout: what is late fails there with
        // DEADLINE_EXCEEDED, which callers retry.
        if let Some(t) = policy.timeout.filter(|t| *t < grid.horizon()) {
            let mut late = 0.0;
            let mut cut = |part: &Option<Part>| {
                let part = part.as_ref()?;
                let kept = below(&part.d, t);
                let share = kept.as_ref().map_or(0.0, |(s, _)| *s);
                late += part.p * (1.0 - share);
                kept.map(|(s, d)| Part { p: part.p * s, d })
            };
            let ok = cut(&o.ok);
            let retryable = cut(&o.retryable);
            let terminal = cut(&o.terminal);
            let mut failed: Vec<(f64, Dist)> = retryable.map(|p| (p.p, p.d)).into_iter().collect();
            failed.push((late, Dist::point(grid, t)));
            o = Outcome {
                ok,
                retryable: merge(failed),
                terminal,
            };
        }
        let mut tries = 1.0;
        if let Some(h) = policy.hedge {
            let after = match h {
                Hedge::After(d) => Some(d),
                Hedge::Percentile(q) => o.ok.as_ref().and_then(|p| p.d.quantile(q / 100.0)),
            };
            match after {
                Some(after) => {
                    let any = o.any();
                    tries += any.map_or(0.0, |d| 1.0 - d.cdf(after));
                    o = hedged(o, after, grid);
                }
                None => note(
                    &mut self.assumptions,
                    format!(
                        "hop {}: no answer to hedge at a percentile of, so no hedge",
                        hop.name
                    ),
                ),
            }
        }
        if policy.retries > 0 {
            let (p_fail, fail_time) = match &o.retryable {
                Some(p) => (p.p, p.d.clone()),
                None => return (o, tries),
            };
            let n = policy.retries;
            let expected: f64 = (1..=n).map(|k| p_fail.powi(k as i32)).sum();
            let share = if expected > 0.0 {
                (policy.retry_budget / expected).min(1.0)
            } else {
                1.0
            };
            if share < 1.0 {
                note(
                    &mut self.assumptions,
                    format!(
                        "hop {}: retries ({:.2} per call at {:.1} % failures) exceed the {:.0} % budget: {:.0} % of failures taken as retried",
                        hop.name,
                        expected,
                        p_fail * 100.0,
                        policy.retry_budget * 100.0,
                        share * 100.0
                    ),
                );
            }
            tries += expected * share;
            o = retried(o, &fail_time, p_fail, share, n);
        }
        (o, tries)
    }

    /// Each hop's utilization at its busiest replica: calls per second
    /// times the mean of its own time, over its servers (`replicas x
    /// concurrency`; a pull hop without concurrency: one per replica; a push
    /// hop without concurrency never waits: left out).
    fn utilization(&mut self, end_to_end: &Dist) -> Vec<(String, f64)> {
        let load = &self.variant.load;
        let rate = match &load.mode {
            LoadMode::Open { rate, steps, .. } => {
                steps.iter().map(|s| s.rate).fold(*rate, f64::max)
            }
            LoadMode::Closed { concurrency } => match end_to_end.mean() {
                Some(m) if m > Duration::ZERO => f64::from(*concurrency) / m.as_secs_f64(),
                _ => return Vec::new(),
            },
        };
        let mut calls = vec![0.0; self.variant.hops.len()];
        for (i, share) in self.variant.entries() {
            self.count_calls(i, rate * share, &mut calls, 0);
        }
        let mut out = Vec::new();
        for (i, hop) in self.variant.hops.iter().enumerate() {
            let per_replica = match (hop.concurrency, hop.transport) {
                (Some(c), _) => f64::from(c),
                (None, Transport::Pull) => 1.0,
                (None, Transport::Push) => continue,
            };
            let replicas = f64::from(hop.replicas.max(1));
            let mut busiest: f64 = 0.0;
            for g in self.groups(i) {
                let mean = self
                    .own(i, g.factor)
                    .and_then(|d| d.mean())
                    .map_or(0.0, |m| m.as_secs_f64());
                busiest = busiest.max(calls[i] / replicas * mean / per_replica);
            }
            out.push((hop.name.clone(), busiest));
        }
        out
    }

    /// Adds to `calls` the attempts per second hop `i` and those below it
    /// receive when it is called `rate` times a second.
    fn count_calls(&self, i: usize, rate: f64, calls: &mut [f64], depth: usize) {
        if depth > self.variant.hops.len() {
            return;
        }
        let attempts = rate * self.tries.get(&i).copied().unwrap_or(1.0);
        calls[i] += attempts;
        let passed = attempts * (1.0 - self.error(i).map_or(0.0, |(p, _)| p));
        for call in self.hop(i).call_plan().iter() {
            if let Some(&c) = self.index.get(call.hop.as_str()) {
                self.count_calls(c, passed * call.mean(), calls, depth + 1);
            }
        }
    }
}

/// A hedge sent `after` the first attempt unless it answered: the first
/// answer wins. A failed attempt is taken as never answering (so a hedge
/// is sent even after an early failure), and the call fails when both
/// fail, at the later failure.
fn hedged(o: Outcome, after: Duration, grid: Grid) -> Outcome {
    let Some(ok) = o.ok.as_ref() else {
        return o;
    };
    let answers = if ok.p >= 1.0 {
        ok.d.clone()
    } else {
        Dist::mix(&[(ok.p, ok.d.clone()), (1.0 - ok.p, never(grid))])
    };
    let first = answers.hedge(after);
    let answered = below(&first, grid.horizon());
    let ok_share = answered.as_ref().map_or(0.0, |(s, _)| *s);
    let failed_share = (1.0 - ok_share).max(0.0);
    let (r, t) = (
        o.retryable.as_ref().map_or(0.0, |p| p.p),
        o.terminal.as_ref().map_or(0.0, |p| p.p),
    );
    let fail_time = merge(
        [&o.retryable, &o.terminal]
            .into_iter()
            .flatten()
            .map(|p| (p.p, p.d.clone()))
            .collect(),
    )
    .map(|p| Dist::max_of(&[p.d.clone(), p.d.shift(after)]));
    let (retryable, terminal) = match fail_time {
        Some(d) if r + t > 0.0 => (
            merge(vec![(failed_share * r / (r + t), d.clone())]),
            merge(vec![(failed_share * t / (r + t), d)]),
        ),
        // Only answers past the grid: censored.
        _ => (None, merge(vec![(failed_share, never(grid))])),
    };
    Outcome {
        ok: answered.map(|(p, d)| Part { p, d }),
        retryable,
        terminal,
    }
}

/// Up to `n` retries of the retryable failures (time `fail_time`, share
/// `p_fail` of attempts), each failure retried with probability `share`
/// (the budget's).
fn retried(o: Outcome, fail_time: &Dist, p_fail: f64, share: f64, n: u32) -> Outcome {
    let again = p_fail * share;
    let mut ok = Vec::new();
    let mut retryable = Vec::new();
    let mut terminal = Vec::new();
    // The time spent on k failed attempts.
    let mut spent: Option<Dist> = None;
    let mut weight = 1.0;
    for k in 0..=n {
        let plus = |d: &Dist| spent.as_ref().map_or_else(|| d.clone(), |s| s.then(d));
        if let Some(p) = &o.ok {
            ok.push((weight * p.p, plus(&p.d)));
        }
        if let Some(p) = &o.terminal {
            terminal.push((weight * p.p, plus(&p.d)));
        }
        let failed = plus(fail_time);
        // Not retried: out of retries, or not granted by the budget.
        let kept = if k == n {
            p_fail
        } else {
            p_fail * (1.0 - share)
        };
        retryable.push((weight * kept, failed.clone()));
        spent = Some(failed);
        weight *= again;
        if weight == 0.0 {
            break;
        }
    }
    Outcome {
        ok: merge(ok),
        retryable: merge(retryable),
        terminal: merge(terminal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn near(got: f64, want: f64, tol: f64, what: &str) {
        assert!(
            (got - want).abs() <= tol,
            "{what}: {got}, expected {want} within {tol}"
        );
    }

    #[test]
    fn below_keeps_the_shape_under_the_cut() {
        let grid = Grid::for_horizon(ms(100));
        let d = Dist::declared(&DurationDist::Exp { mean: ms(2) }, grid);
        let (share, kept) = below(&d, ms(3)).expect("mass below");
        near(share, d.cdf(ms(3)), 1e-12, "share");
        for t in [ms(1), ms(2), us(2500)] {
            near(kept.cdf(t), d.cdf(t) / share, 1e-12, "conditional");
        }
        assert_eq!(kept.beyond(), 0.0);
        assert!(below(&d, Duration::ZERO).is_none());
        let (all, same) = below(&d, ms(100)).expect("all");
        near(all, 1.0 - d.beyond(), 1e-12, "whole");
        near(same.cdf(ms(4)), d.cdf(ms(4)) / all, 1e-12, "whole shape");
    }
}
