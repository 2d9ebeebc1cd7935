//! What if the mesh were changed: the end-to-end latency of a changed
//! variant, composed from a run's measured segments with the change
//! applied (`tailmesh predict --from RUN --what-if KEY=VALUE`).
//!
//! The run measured each hop's segments (reach, queue, own, rest: see
//! [`composition`](crate::composition)). The prediction is the declared
//! composition ([`declared`]) of the changed variant, fed with what was
//! measured wherever the change leaves it alone:
//! - a hop whose own time's settings (work, service, injected slowness, a
//!   slow replica, replicas) are unchanged does its measured own time
//!   (its work, its injected slowness, its timer's overshoot, as the run
//!   saw them);
//! - a hop whose settings changed does what the changed scenario declares,
//!   plus the overshoot the run measured over its old declaration (the
//!   mean own time above the declared mean);
//! - every hop is reached at its measured cost, reach, queue wait and
//!   rest together, plus the difference of the machine's floors when its
//!   transport changed (push to pull adds a broker's two round trips); a
//!   hop the run did not have at the floor of its transport;
//! - calls, stages, client policies (retries, a hedge), network faults
//!   and errors as the changed scenario declares them, by the declared
//!   composition's rules;
//! - the load generator's lateness as measured.
//!
//! The same with no change (`as run`) is the method's own error, held
//! against the run's measured latency. Queueing is not modelled: a change
//! that moves a hop's utilization (a replica added or removed, a slower
//! hop under load) moves its queue wait, which keeps its measured value.

use std::time::Duration;

use hdrhistogram::Histogram;
use tailmesh_model::scenario::{Hop, Variant};
use tailmesh_model::{DurationDist, Transport, Work};

use crate::compose::{Dist, Grid};
use crate::composition::MeasuredSegments;
use crate::declared::{Declared, Undeclared, declared};

/// The reach of a hop the run did not have, and the difference a
/// transport change makes, by transport.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Floors {
    pub push: Duration,
    pub pull: Duration,
}

impl Floors {
    fn of(&self, t: Transport) -> Duration {
        match t {
            Transport::Push => self.push,
            Transport::Pull => self.pull,
        }
    }
}

/// The quantiles at which a measured own time becomes an empirical
/// distribution: every percent, then the far tail.
fn own_points() -> Vec<f64> {
    let mut q: Vec<f64> = (0..100).map(|k| f64::from(k) / 100.0).collect();
    q.extend([0.995, 0.999, 0.9999, 1.0]);
    q
}

/// `h` (µs) as an empirical distribution; `None` when empty.
fn empirical_of(h: &Histogram<u64>) -> Option<DurationDist> {
    if h.is_empty() {
        return None;
    }
    let points = own_points()
        .into_iter()
        .map(|q| {
            // The value's bucket stands for [v, v + 1) µs: its middle.
            let v = if q >= 1.0 {
                h.max()
            } else {
                h.value_at_quantile(q)
            };
            (q, Duration::from_nanos(v * 1_000 + 500))
        })
        .collect();
    DurationDist::empirical(points).ok()
}

/// Whether `a` and `b` do the same own work: what makes a hop's measured
/// own time stand for the changed one.
fn same_own(a: &Hop, b: &Hop) -> bool {
    a.work == b.work
        && a.service == b.service
        && a.slow == b.slow
        && a.replica_slow == b.replica_slow
        && a.replicas == b.replicas
        && a.windows == b.windows
}

/// The mean of what `hop` declares for its own time, on `grid`; `None`
/// for work it does not declare (cpu, a service).
fn declared_own_mean(hop: &Hop, grid: Grid) -> Option<f64> {
    let work = match (&hop.work, &hop.service) {
        (Work::Sleep { dist }, None) => Dist::declared(dist, grid).mean()?.as_secs_f64(),
        (Work::None, None) => 0.0,
        _ => return None,
    };
    let slow = hop.slow.as_ref().map_or(0.0, |s| {
        s.probability
            * Dist::declared(&s.extra, grid)
                .mean()
                .map_or(0.0, |d| d.as_secs_f64())
    });
    Some(work + slow)
}

/// A what-if's two predictions: the run's own variant recomposed (the
/// method's error), and the changed one.
#[derive(Debug)]
pub struct WhatIf {
    pub as_run: Result<Declared, Undeclared>,
    pub changed: Result<Declared, Undeclared>,
}

/// `changed`'s end-to-end latency composed from the segments `measured`
/// of a run of `as_run` (see the module doc), and `as_run`'s the same
/// way, on `grid`.
pub fn what_if(
    as_run: &Variant,
    changed: &Variant,
    measured: &MeasuredSegments,
    floors: Floors,
    grid: Grid,
) -> WhatIf {
    WhatIf {
        as_run: predict(as_run, as_run, measured, floors, grid),
        changed: predict(as_run, changed, measured, floors, grid),
    }
}

fn predict(
    base: &Variant,
    target: &Variant,
    measured: &MeasuredSegments,
    floors: Floors,
    grid: Grid,
) -> Result<Declared, Undeclared> {
    let segments = |name: &str| {
        measured
            .hops
            .iter()
            .find(|(h, _)| h == name)
            .map(|(_, s)| s)
    };
    let mut variant = target.clone();
    // Per hop: its measured reach (queue and rest in), and what is added.
    let mut reach: Vec<(String, Dist)> = Vec::with_capacity(variant.hops.len());
    for hop in &mut variant.hops {
        let old = base.hops.iter().find(|h| h.name == hop.name);
        let seen = segments(&hop.name).filter(|s| !s[2].is_empty() || !s[0].is_empty());
        let (Some(old), Some([r, q, own, rest])) = (old, seen) else {
            reach.push((
                hop.name.clone(),
                Dist::point(grid, floors.of(hop.transport)),
            ));
            continue;
        };
        let mut overhead = [r, q, rest]
            .iter()
            .filter_map(|h| Dist::from_histogram(h, 0, grid).ok())
            .reduce(|a, b| a.then(&b))
            .unwrap_or_else(|| Dist::zero(grid));
        if old.transport != hop.transport {
            let (from, to) = (floors.of(old.transport), floors.of(hop.transport));
            overhead = if to >= from {
                overhead.shift(to - from)
            } else {
                overhead.shift_back(from - to)
            };
        }
        if same_own(old, hop) {
            if let Some(dist) = empirical_of(own) {
                hop.work = Work::Sleep { dist };
                hop.service = None;
                // The measured own time has them in.
                hop.slow = None;
                hop.replica_slow = None;
            }
        } else if let (Some(declared), false) = (declared_own_mean(old, grid), own.is_empty()) {
            let seen = own.mean() / 1e6 + 0.5e-6;
            let over = (seen - declared).max(0.0);
            overhead = overhead.shift(Duration::from_secs_f64(over));
        }
        reach.push((hop.name.clone(), overhead));
    }
    let overhead = |hop: &Hop| {
        reach.iter().find(|(n, _)| *n == hop.name).map_or_else(
            || Dist::point(grid, floors.of(hop.transport)),
            |(_, d)| d.clone(),
        )
    };
    let mut d = declared(&variant, grid, &overhead)?;
    if let Ok(lateness) = Dist::from_histogram(&measured.lateness, 0, grid) {
        d.dist = d.dist.then(&lateness);
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    const FLOORS: Floors = Floors {
        push: Duration::from_micros(100),
        pull: Duration::from_micros(300),
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn hist(values_us: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        for v in values_us {
            h.record(v).expect("in range");
        }
        h
    }

    /// a calls b; b's own time measured 2 to 4 ms evenly, reach 100 us
    /// for both, no queue or rest.
    fn run() -> (Variant, MeasuredSegments) {
        let mut v = testing::variant("v", vec![testing::hop("a", None), testing::hop("b", None)]);
        v.hops[0].downstream = vec!["b".to_owned()];
        v.hops[1].work = Work::Sleep {
            dist: DurationDist::Uniform {
                min: ms(2),
                max: ms(4),
            },
        };
        let zero = || hist([0; 100]);
        let measured = MeasuredSegments {
            lateness: zero(),
            hops: vec![
                ("a".to_owned(), [hist([100; 100]), zero(), zero(), zero()]),
                (
                    "b".to_owned(),
                    [
                        hist([100; 100]),
                        zero(),
                        hist((0..100).map(|k| 2000 + 20 * k)),
                        zero(),
                    ],
                ),
            ],
        };
        (v, measured)
    }

    fn q(d: &Result<Declared, Undeclared>, q: f64) -> f64 {
        let d = d.as_ref().expect("declared");
        d.dist.quantile(q).expect("on the grid").as_secs_f64() * 1e3
    }

    #[test]
    fn unchanged_the_run_recomposes_and_a_change_moves_what_it_changes() {
        let (base, measured) = run();
        let grid = Grid::for_horizon(ms(100));
        let same = what_if(&base, &base, &measured, FLOORS, grid);
        // 0.2 ms of reach, then b's 2 to 4 ms: the median 3.2 ms.
        assert!(
            (q(&same.as_run, 0.5) - 3.2).abs() < 0.1,
            "{}",
            q(&same.as_run, 0.5)
        );
        assert!((q(&same.changed, 0.5) - q(&same.as_run, 0.5)).abs() < 1e-9);

        // b 2 ms slower, declared: the median moves by 2 ms.
        let mut slower = base.clone();
        slower.hops[1].work = Work::Sleep {
            dist: DurationDist::Uniform {
                min: ms(4),
                max: ms(6),
            },
        };
        let w = what_if(&base, &slower, &measured, FLOORS, grid);
        assert!(
            (q(&w.changed, 0.5) - q(&w.as_run, 0.5) - 2.0).abs() < 0.1,
            "{} vs {}",
            q(&w.changed, 0.5),
            q(&w.as_run, 0.5)
        );

        // b pulled: its reach grows by the floors' difference.
        let mut pulled = base.clone();
        pulled.hops[1].transport = Transport::Pull;
        let w = what_if(&base, &pulled, &measured, FLOORS, grid);
        assert!((q(&w.changed, 0.5) - q(&w.as_run, 0.5) - 0.2).abs() < 0.05);

        // b called on half the requests: the median falls to a's part or
        // just above; the p90 stays in b's range.
        let mut maybe = base.clone();
        maybe.hops[0].calls = tailmesh_model::calls::Calls {
            stages: vec![vec![tailmesh_model::calls::Call {
                probability: 0.5,
                ..tailmesh_model::calls::Call::once("b")
            }]],
        };
        let w = what_if(&base, &maybe, &measured, FLOORS, grid);
        assert!(q(&w.changed, 0.4) < 0.5, "{}", q(&w.changed, 0.4));
        assert!(q(&w.changed, 0.9) > 3.0, "{}", q(&w.changed, 0.9));
    }
}
