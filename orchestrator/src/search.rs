//! `tailmesh search`: the highest open-loop rate at which a variant meets
//! a service-level objective. Each step is a short run at one rate, judged
//! against the objective ([`Objective`]); the search climbs by doubling
//! from a start below the hops' declared capacity until a step fails, then
//! halves the bracket until it is within [`SearchPlan::precision`], and
//! confirms the answer by running it again ([`search`]). The search itself
//! is pure: it is handed a function that runs a step.

use std::time::Duration;

use tailmesh_analysis::variant::VariantReport;
use tailmesh_model::Work;
use tailmesh_model::scenario::Variant;

/// What a quantile names: `p50`, `p90`, `p99`, `p99.9`, `p99.99`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantile {
    P50,
    P90,
    P99,
    P999,
    P9999,
}

impl Quantile {
    fn parse(text: &str) -> Option<Quantile> {
        Some(match text {
            "p50" => Quantile::P50,
            "p90" => Quantile::P90,
            "p99" => Quantile::P99,
            "p99.9" => Quantile::P999,
            "p99.99" => Quantile::P9999,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Quantile::P50 => "p50",
            Quantile::P90 => "p90",
            Quantile::P99 => "p99",
            Quantile::P999 => "p99.9",
            Quantile::P9999 => "p99.99",
        }
    }

    fn of(self, p: &tailmesh_analysis::stats::Percentiles) -> Duration {
        Duration::from_micros(match self {
            Quantile::P50 => p.p50_us,
            Quantile::P90 => p.p90_us,
            Quantile::P99 => p.p99_us,
            Quantile::P999 => p.p99_9_us,
            Quantile::P9999 => p.p99_99_us,
        })
    }
}

/// One term of an objective.
#[derive(Clone, Debug, PartialEq)]
pub enum Objective {
    /// An end-to-end quantile of the ok requests below a bound.
    Latency { quantile: Quantile, below: Duration },
    /// A hop's quantile of its time to answer below a bound.
    Hop {
        hop: String,
        quantile: Quantile,
        below: Duration,
    },
    /// The share of measured requests that failed (errors and timeouts)
    /// below a bound.
    Errors { below: f64 },
}

/// Why an objective cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("--slo {term:?}: {why}")]
pub struct SloError {
    pub term: String,
    pub why: String,
}

/// Reads an objective: terms joined by commas, each `NAME<LIMIT`: `p99<50ms`
/// (`p50`, `p90`, `p99`, `p99.9`, `p99.99`), `errors<0.1%` (or a share,
/// `errors<0.001`), `hop.b.p99<10ms`.
pub fn parse_slo(text: &str) -> Result<Vec<Objective>, SloError> {
    let mut out = Vec::new();
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let bad = |why: &str| SloError {
            term: term.to_owned(),
            why: why.to_owned(),
        };
        let (name, limit) = term
            .split_once('<')
            .map(|(n, l)| (n.trim(), l.trim()))
            .ok_or_else(|| bad("expected NAME<LIMIT, such as p99<50ms or errors<0.1%"))?;
        let duration = |limit: &str| {
            humantime::parse_duration(limit)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| bad("the limit must be a duration above 0, such as 50ms"))
        };
        let objective = if name == "errors" {
            let share = match limit.strip_suffix('%') {
                Some(pct) => pct.trim().parse::<f64>().map(|p| p / 100.0),
                None => limit.parse::<f64>(),
            }
            .ok()
            .filter(|s| (0.0..=1.0).contains(s) && *s > 0.0)
            .ok_or_else(|| bad("the error limit must be a share above 0, such as 0.1% or 0.001"))?;
            Objective::Errors { below: share }
        } else if let Some(rest) = name.strip_prefix("hop.") {
            let (hop, q) = rest
                .rsplit_once('.')
                .filter(|(_, q)| Quantile::parse(q).is_some())
                .or_else(|| {
                    // `hop.b.p99.9`: the quantile has a dot of its own.
                    let (hop, q) = rest.split_once('.')?;
                    Quantile::parse(q).map(|_| (hop, q))
                })
                .ok_or_else(|| bad("expected hop.NAME.QUANTILE, such as hop.b.p99"))?;
            Objective::Hop {
                hop: hop.to_owned(),
                quantile: Quantile::parse(q).ok_or_else(|| bad("unknown quantile"))?,
                below: duration(limit)?,
            }
        } else {
            let quantile = Quantile::parse(name).ok_or_else(|| {
                bad("unknown measure: p50, p90, p99, p99.9, p99.99, errors or hop.NAME.p99")
            })?;
            Objective::Latency {
                quantile,
                below: duration(limit)?,
            }
        };
        out.push(objective);
    }
    if out.is_empty() {
        return Err(SloError {
            term: text.to_owned(),
            why: "no objective".to_owned(),
        });
    }
    Ok(out)
}

impl Objective {
    /// The objective as written.
    pub fn describe(&self) -> String {
        match self {
            Objective::Latency { quantile, below } => {
                format!("{}<{}", quantile.name(), humantime::format_duration(*below))
            }
            Objective::Hop {
                hop,
                quantile,
                below,
            } => format!(
                "hop.{hop}.{}<{}",
                quantile.name(),
                humantime::format_duration(*below)
            ),
            Objective::Errors { below } => format!("errors<{}%", below * 100.0),
        }
    }

    /// What the step measured for it, and whether it is met; a measure the
    /// step has nothing for (no ok request, a hop never reached) is not met.
    fn judge(&self, v: &VariantReport) -> (String, bool) {
        match self {
            Objective::Latency { quantile, below } => {
                if v.ok == 0 {
                    return ("no ok request".to_owned(), false);
                }
                let got = quantile.of(&v.latency);
                (tailmesh_units::duration(got), got < *below)
            }
            Objective::Hop {
                hop,
                quantile,
                below,
            } => match v.hops.iter().find(|h| &h.hop == hop && h.requests > 0) {
                Some(h) => {
                    let got = quantile.of(&h.total);
                    (tailmesh_units::duration(got), got < *below)
                }
                None => (format!("hop {hop} served nothing"), false),
            },
            Objective::Errors { below } => {
                let share = if v.sent == 0 {
                    1.0
                } else {
                    v.sent.saturating_sub(v.ok) as f64 / v.sent as f64
                };
                (tailmesh_units::percent(share), share < *below)
            }
        }
    }
}

/// A step's verdict: each objective with what was measured and whether it
/// was met.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepVerdict {
    /// The requested rate, per second.
    pub rate: f64,
    /// The rate achieved, per second.
    pub achieved_rate: f64,
    /// Ok requests per second: the goodput.
    pub ok_rate: f64,
    /// The end-to-end p99 of the ok requests, in ms (0 without any).
    pub p99_ms: f64,
    /// Each objective, what was measured, and whether it held.
    pub measured: Vec<Measured>,
    /// Whether every objective held and the load went as planned.
    pub met: bool,
    /// Why the step is not to be judged (interrupted, requests not
    /// accounted for), if so.
    pub unjudged: Option<String>,
    /// The step's run folder.
    pub run: String,
}

/// One objective as a step measured it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Measured {
    /// The objective as written (`p99<50ms`).
    pub objective: String,
    /// What the step measured (`12.3 ms`).
    pub measured: String,
    /// Whether it held.
    pub met: bool,
}

/// Judges a step's variant against `objectives`.
pub fn judge(objectives: &[Objective], rate: f64, v: &VariantReport, run: &str) -> StepVerdict {
    let measured: Vec<Measured> = objectives
        .iter()
        .map(|o| {
            let (measured, met) = o.judge(v);
            Measured {
                objective: o.describe(),
                measured,
                met,
            }
        })
        .collect();
    let unjudged = if v.interrupted {
        Some("interrupted".to_owned())
    } else if !v.accounted {
        Some("not every request was accounted for".to_owned())
    } else {
        None
    };
    StepVerdict {
        rate,
        achieved_rate: v.achieved_rate,
        ok_rate: v.ok_rate,
        p99_ms: v.latency.p99_us as f64 / 1000.0,
        met: unjudged.is_none() && measured.iter().all(|m| m.met),
        measured,
        unjudged,
        run: run.to_owned(),
    }
}

/// How a search goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchPlan {
    /// Stop when the bracket's width is at most this share of its low end.
    pub precision: f64,
    /// The most steps, confirmations aside.
    pub max_steps: usize,
    /// The times the answer is run again to confirm it.
    pub repeats: usize,
}

impl Default for SearchPlan {
    fn default() -> Self {
        Self {
            precision: 0.02,
            max_steps: 12,
            repeats: 2,
        }
    }
}

/// How a search ended.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Answer {
    /// The highest rate found that meets the objective (`rate`), the lowest
    /// that did not (`fails_at`), and whether the repeats confirmed it.
    Found {
        rate: f64,
        fails_at: f64,
        confirmed: bool,
    },
    /// The first step failed already.
    FirstStepFails { rate: f64 },
    /// Every step met the objective up to the step limit.
    NoFailureUpTo { rate: f64 },
    /// The bracket was still wider than asked at the step limit.
    StepLimit { rate: f64, fails_at: f64 },
}

/// A search: every step in order (confirmations marked) and the answer.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Search {
    pub steps: Vec<(StepKind, StepVerdict)>,
    pub answer: Answer,
}

/// What a step was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Climbing by doubling.
    Climb,
    /// Halving the bracket.
    Bisect,
    /// Running the answer again.
    Confirm,
}

/// Searches from `start` requests per second with `run`, which runs one
/// step at a rate and judges it (its error ends the search: interrupted,
/// or the run failed).
pub fn search<E>(
    start: f64,
    plan: SearchPlan,
    mut run: impl FnMut(StepKind, f64) -> Result<StepVerdict, E>,
) -> Result<Search, E> {
    let mut steps = Vec::new();
    let mut step = |kind: StepKind, rate: f64, steps: &mut Vec<(StepKind, StepVerdict)>| {
        let verdict = run(kind, rate)?;
        let met = verdict.met;
        steps.push((kind, verdict));
        Ok(met)
    };
    // Rates are kept whole: a step is a rate people can write down.
    let whole = |r: f64| r.round().max(1.0);
    let mut lo = whole(start);
    if !step(StepKind::Climb, lo, &mut steps)? {
        return Ok(Search {
            steps,
            answer: Answer::FirstStepFails { rate: lo },
        });
    }
    let mut hi = None;
    let mut taken = 1;
    while hi.is_none() {
        if taken >= plan.max_steps {
            return Ok(Search {
                steps,
                answer: Answer::NoFailureUpTo { rate: lo },
            });
        }
        let next = whole(lo * 2.0);
        taken += 1;
        if step(StepKind::Climb, next, &mut steps)? {
            lo = next;
        } else {
            hi = Some(next);
        }
    }
    let mut hi = hi.unwrap_or(lo);
    let mut confirmed = false;
    loop {
        while hi - lo > plan.precision * lo && hi - lo > 1.0 {
            if taken >= plan.max_steps {
                return Ok(Search {
                    steps,
                    answer: Answer::StepLimit {
                        rate: lo,
                        fails_at: hi,
                    },
                });
            }
            let mid = whole((lo + hi) / 2.0);
            taken += 1;
            if step(StepKind::Bisect, mid, &mut steps)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // The answer again: a step that passed by luck fails now and then.
        let mut held = true;
        for _ in 0..plan.repeats {
            if !step(StepKind::Confirm, lo, &mut steps)? {
                held = false;
                break;
            }
        }
        if held {
            confirmed = plan.repeats > 0;
            break;
        }
        // It did not hold: it is the failing end now, and the search goes
        // on below it, once more at most within the step limit.
        hi = lo;
        lo = whole(lo / (1.0 + plan.precision));
        if taken >= plan.max_steps {
            break;
        }
        taken += 1;
        if !step(StepKind::Bisect, lo, &mut steps)? {
            return Ok(Search {
                steps,
                answer: Answer::FirstStepFails { rate: lo },
            });
        }
    }
    Ok(Search {
        steps,
        answer: Answer::Found {
            rate: lo,
            fails_at: hi,
            confirmed,
        },
    })
}

/// The rate the variant's hops can serve at most, from what they declare:
/// for each hop with a concurrency limit and sleeping work, its replicas
/// times its concurrency over its work's mean; the least of them. `None`
/// when no hop declares one.
pub fn declared_capacity(variant: &Variant) -> Option<f64> {
    let grid = tailmesh_analysis::compose::Grid::for_horizon(variant.load.timeout);
    variant
        .hops
        .iter()
        .filter_map(|hop| {
            let slots = hop.concurrency?;
            let Work::Sleep { dist } = &hop.work else {
                return None;
            };
            let mean = tailmesh_analysis::compose::Dist::declared(dist, grid).mean()?;
            (!mean.is_zero())
                .then(|| f64::from(slots) * f64::from(hop.replicas) / mean.as_secs_f64())
        })
        .min_by(f64::total_cmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(rate: f64, met: bool) -> StepVerdict {
        StepVerdict {
            rate,
            achieved_rate: rate,
            ok_rate: rate,
            p99_ms: 1.0,
            measured: Vec::new(),
            met,
            unjudged: None,
            run: String::new(),
        }
    }

    #[test]
    fn objectives_are_read_with_their_units_and_bad_ones_say_why() {
        let slo = parse_slo("p99<50ms, errors<0.1%, hop.b.p99.9<10ms,p50<1s").expect("valid");
        assert_eq!(
            slo,
            [
                Objective::Latency {
                    quantile: Quantile::P99,
                    below: Duration::from_millis(50)
                },
                Objective::Errors { below: 0.001 },
                Objective::Hop {
                    hop: "b".to_owned(),
                    quantile: Quantile::P999,
                    below: Duration::from_millis(10)
                },
                Objective::Latency {
                    quantile: Quantile::P50,
                    below: Duration::from_secs(1)
                },
            ]
        );
        for (bad, why) in [
            ("p98<1ms", "unknown measure"),
            ("p99>1ms", "expected NAME<LIMIT"),
            ("p99<fast", "a duration above 0"),
            ("errors<150%", "a share above 0"),
            ("hop.b<1ms", "hop.NAME.QUANTILE"),
            ("", "no objective"),
        ] {
            let e = parse_slo(bad).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// A mesh that meets the objective below `limit` requests per second.
    fn up_to(limit: f64) -> impl FnMut(StepKind, f64) -> Result<StepVerdict, ()> {
        move |_, rate| Ok(verdict(rate, rate < limit))
    }

    #[test]
    fn the_search_brackets_the_limit_within_its_precision_in_few_steps() {
        // From a start within a factor of 5 below the limit (half the
        // declared capacity is the default start).
        for limit in [37.0, 1000.0, 1234.5, 9000.0] {
            for start in [limit * 0.2, limit * 0.5, limit * 0.9] {
                let s = search(start, SearchPlan::default(), up_to(limit)).expect("no error");
                let Answer::Found {
                    rate,
                    fails_at,
                    confirmed,
                } = s.answer
                else {
                    panic!("{limit} from {start}: {:?}", s.answer);
                };
                assert!(
                    rate < limit && fails_at >= limit,
                    "{rate} {fails_at} {limit}"
                );
                assert!(
                    fails_at - rate <= 0.02 * rate || fails_at - rate <= 1.0,
                    "{rate}..{fails_at}"
                );
                assert!(confirmed);
                let searched = s
                    .steps
                    .iter()
                    .filter(|(k, _)| *k != StepKind::Confirm)
                    .count();
                assert!(searched <= 12, "{searched} steps for {limit} from {start}");
            }
        }
    }

    #[test]
    fn a_first_step_that_fails_stops_and_a_failed_confirmation_moves_down() {
        let s = search(500.0, SearchPlan::default(), up_to(100.0)).expect("no error");
        assert_eq!(s.answer, Answer::FirstStepFails { rate: 500.0 });
        assert_eq!(s.steps.len(), 1);
        // Far below the limit the climb uses up the steps: the bracket
        // found so far is the answer, said to be one.
        let s = search(10.0, SearchPlan::default(), up_to(1000.0)).expect("no error");
        assert_eq!(
            s.answer,
            Answer::StepLimit {
                rate: 960.0,
                fails_at: 1000.0
            }
        );

        // Passes at 1000 once, then not: the confirmation fails and the
        // answer moves below it.
        let mut seen_1000 = 0;
        let flaky = |_: StepKind, rate: f64| -> Result<StepVerdict, ()> {
            let met = if rate == 1000.0 {
                seen_1000 += 1;
                seen_1000 == 1
            } else {
                rate < 1000.0
            };
            Ok(verdict(rate, met))
        };
        let s = search(500.0, SearchPlan::default(), flaky).expect("no error");
        match s.answer {
            Answer::Found { rate, fails_at, .. } => {
                assert!(rate < 1000.0 && fails_at <= 1000.0, "{rate} {fails_at}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn declared_capacity_is_the_tightest_hops_slots_over_its_work() {
        let text = "name = \"c\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"5s\"\n\
                    [[hop]]\nname = \"a\"\nconcurrency = 4\nreplicas = 2\n\
                    work = { kind = \"sleep\", dist = \"fixed\", value = \"2ms\" }\n\
                    [[hop]]\nname = \"b\"\nconcurrency = 1\n\
                    work = { kind = \"sleep\", dist = \"fixed\", value = \"1ms\" }\n";
        let s = crate::scenario::parse(text, "c.toml").unwrap_or_else(|e| panic!("{e}"));
        let c = declared_capacity(&s.variants[0]).expect("a capacity");
        assert!((c - 1000.0).abs() < 20.0, "{c}");
        let free = "name = \"c\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"5s\"\n\
                    [[hop]]\nname = \"a\"\n";
        let s = crate::scenario::parse(free, "c.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(declared_capacity(&s.variants[0]), None);
    }
}
