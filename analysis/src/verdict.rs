//! The compounding verdict, decided in one place: the comparison of the
//! measured slow fraction with the model (`compounding`) gives pass, fail
//! or inconclusive; then the attribution of the slow requests
//! (`attribution`) may turn a fail into inconclusive, when the excess is
//! mostly the instrument's (the load generator, unexplained slowness) or a
//! busy machine's, and otherwise names the cause of the excess.
//!
//! ```text
//! compare(counts, hops) --agreement--> pass | fail | inconclusive
//!                                          |
//!               attribution + machine -----+--> fail stays fail (cause named)
//!                                          +--> inconclusive (instrument or machine named)
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::attribution::{AttributionReport, CauseKind, describe_label};
use super::compounding::{Agreement, Comparison, HopSlowness};
use super::stats::wilson95;
use tailmesh_units::percent;

/// A failed compounding check whose excess is at least this share from the
/// instrument (the generator, unexplained slowness, or a busy machine's
/// network and work delays) is inconclusive.
pub const INSTRUMENT_SHARE: f64 = 0.5;

/// The outcome of the compounding check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The model lies inside the measured fraction's 95 % Wilson interval.
    Pass,
    /// The model lies outside it, and the excess is the mesh's.
    Fail,
    /// Too few trials, nothing was slow-injected and nothing was slow (so
    /// agreement would be vacuous), or the model lies outside the interval
    /// because of the instrument or a busy machine.
    Inconclusive,
}

impl Verdict {
    /// "pass", "fail" or "inconclusive".
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// `[check] distribution`'s verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistributionCheck {
    pub verdict: Verdict,
    pub reason: String,
}

/// What the verdict needs to know about the machine during the run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MachineState {
    /// Whether the self-watch found the machine busy.
    pub busy: bool,
    /// Its reasons, in words ("CPU pressure 87 %", ...).
    pub reasons: Vec<String>,
}

/// The verdict's decomposition: the model against the measured fraction,
/// and the excess split by cause.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Decomposition {
    /// Slow requests with injected slowness on their path (what the model
    /// predicts).
    pub slow_injected: u64,
    /// Ok requests with injected slowness that stayed under the threshold.
    pub injected_fast: u64,
    /// Slow requests without injected slowness, by primary cause label.
    pub excess: BTreeMap<String, u64>,
    /// Of the excess, slow from the instrument (the generator, unexplained).
    pub instrument: u64,
    /// Of the excess, slow from the network or from work longer than its
    /// declared distribution allows, while the machine was busy (0 when it
    /// was not).
    pub machine: u64,
}

/// The compounding check of one variant (summary.json's
/// `variants[].compounding`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompoundingReport {
    /// The threshold, µs: a request is slow if its latency exceeds it.
    pub slow_threshold_us: u64,
    /// Trials (ok requests plus timeouts above the threshold).
    pub n: u64,
    /// Slow trials.
    pub slow: u64,
    /// Timeouts at or below the threshold, left out of `n`.
    pub timeouts_censored: u64,
    /// Errors, left out of `n`.
    pub errors_excluded: u64,
    /// Measured slow fraction `slow / n` (0 when `n == 0`).
    pub measured: f64,
    /// Lower end of the measured fraction's 95 % Wilson interval.
    pub ci_lo: f64,
    /// Upper end of the measured fraction's 95 % Wilson interval.
    pub ci_hi: f64,
    /// `1 - prod(1 - p_i)` with p_i measured from the paths.
    pub model: f64,
    /// `1 - prod(1 - p_i)` with p_i as declared in the scenario.
    pub declared_model: f64,
    /// `(model - measured)` divided by the distance from `measured` to the
    /// interval's end on the model's side: |deviation| <= 1 means inside.
    /// `null` when that distance is 0 and the model differs.
    pub deviation: Option<f64>,
    /// The per-hop probabilities behind the model, in scenario order.
    pub hops: Vec<HopSlowness>,
    /// The verdict (see `decide`).
    pub verdict: Verdict,
    /// Why the verdict is inconclusive, or what failed: the cause of most
    /// of the excess.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The excess split by cause (absent in summaries from before
    /// attribution).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decomposition: Option<Decomposition>,
}

/// The verdict of the comparison alone: pass inside the interval, fail
/// outside, inconclusive when nothing can be said (with why).
pub fn judge(c: &Comparison) -> (Verdict, Option<String>) {
    match c.agreement() {
        Agreement::Inside => (Verdict::Pass, None),
        Agreement::Outside => (Verdict::Fail, None),
        Agreement::Undecided(why) => (Verdict::Inconclusive, Some(why)),
    }
}

/// Decides the compounding verdict: [`judge`] the comparison, then refine
/// a fail with the attribution. A fail whose excess is mostly the
/// instrument's (the generator, unexplained slowness, or network and work
/// delays on a busy machine) becomes inconclusive and names it; a
/// remaining fail names the cause of most of its excess.
///
/// The rule, for a measured fraction above the model: let `removed` be the
/// excess requests the instrument made slow. Inconclusive when they are at
/// least [`INSTRUMENT_SHARE`] of the excess (slow requests without injected
/// slowness), or when, left out of the trials, the interval of the rest
/// reaches down to the model. Below the model: fail, naming the share of
/// requests with injected slowness that stayed under the threshold.
pub fn decide(
    c: Comparison,
    attribution: &AttributionReport,
    machine: &MachineState,
) -> CompoundingReport {
    let decomposition = decompose(attribution, machine);
    let (verdict, reason) = match judge(&c) {
        (Verdict::Fail, _) if c.counts.n > 0 => {
            refine_fail(&c, attribution, &decomposition, machine)
        }
        judged => judged,
    };
    report(c, verdict, reason, Some(decomposition))
}

/// The worst decided verdict of a variant's phases, each judged on its
/// own: fail if one fails, else pass if one passes, else inconclusive
/// (also when none was judged).
pub fn worst(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
    let mut worst = Verdict::Inconclusive;
    for v in verdicts {
        match v {
            Verdict::Fail => return Verdict::Fail,
            Verdict::Pass => worst = Verdict::Pass,
            Verdict::Inconclusive => {}
        }
    }
    worst
}

/// The variant's compounding verdict when its slowness has a window: the
/// whole run mixes phases whose models differ (p during the window, 0
/// outside it, on every slowed hop at once), so each phase is judged on
/// its own (`judged`: each phase's name and report) and the variant takes
/// the [`worst`]. The whole run's numbers stay, for reference.
pub fn compounding_by_phase(
    mut whole: CompoundingReport,
    judged: &[(&str, &CompoundingReport)],
) -> CompoundingReport {
    let verdict = worst(judged.iter().map(|(_, c)| c.verdict));
    let failed = judged
        .iter()
        .find(|(_, c)| c.verdict == Verdict::Fail)
        .map(|(name, c)| {
            format!(
                "{name}: {}",
                c.reason
                    .as_deref()
                    .unwrap_or("the model lies outside the interval")
            )
        });
    let each: Vec<String> = judged
        .iter()
        .map(|(name, c)| format!("{name} {}", c.verdict.as_str()))
        .collect();
    let per_phase = format!(
        "judged per phase, the slowness having a window: {}",
        each.join(", ")
    );
    whole.verdict = verdict;
    whole.reason = Some(match failed {
        Some(reason) => format!("{per_phase}; {reason}"),
        None => per_phase,
    });
    whole
}

/// The variant's distribution verdict when its schedule has fault
/// windows: the whole run mixes phases whose segments differ (a slow
/// window lengthens every request in it at once: a dependence through
/// time that no independent composition of the whole run can show), so
/// each phase is judged on its own (`judged`: each phase's name and
/// check) and the variant takes the [`worst`]; the whole run's when no
/// phase was judged.
pub fn distribution_by_phase(
    whole: DistributionCheck,
    judged: &[(&str, &DistributionCheck)],
) -> DistributionCheck {
    if judged.is_empty() {
        return whole;
    }
    let verdict = worst(judged.iter().map(|(_, c)| c.verdict));
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

/// The attribution's split of the excess, with the machine's share when it
/// was busy.
fn decompose(a: &AttributionReport, machine: &MachineState) -> Decomposition {
    Decomposition {
        slow_injected: a.slow_injected,
        injected_fast: a.injected_fast,
        excess: a.excess.clone(),
        instrument: a.excess_where(CauseKind::is_instrument),
        machine: if machine.busy {
            a.excess_where(CauseKind::is_machine) + a.work_overrun
        } else {
            0
        },
    }
}

/// A failed comparison, explained: still a fail naming the cause of the
/// excess, or inconclusive naming the instrument or the machine.
fn refine_fail(
    c: &Comparison,
    a: &AttributionReport,
    d: &Decomposition,
    machine: &MachineState,
) -> (Verdict, Option<String>) {
    let n = c.counts.n;
    let share = |k: u64| k as f64 / n as f64;
    if c.measured < c.model {
        return (
            Verdict::Fail,
            Some(format!(
                "{} of requests had injected slowness and stayed under the threshold \
                 (the model counts every one as slow)",
                percent(share(a.injected_fast))
            )),
        );
    }
    let excess: u64 = a.excess.values().sum();
    let removed = d.instrument + d.machine;
    let rest_lo = wilson95(
        c.counts.slow.saturating_sub(removed),
        n.saturating_sub(removed),
    )
    .0;
    let mostly = excess > 0 && removed as f64 >= INSTRUMENT_SHARE * excess as f64;
    // Without the instrument's requests, the rest reaches down to the model.
    if removed > 0 && (mostly || c.model >= rest_lo) {
        let who = if d.machine > d.instrument {
            format!(
                "the machine was busy ({}): {} of requests were slow between hops, or from hop work \
                 beyond its declared distribution, without injected slowness",
                machine.reasons.join(", "),
                percent(share(d.machine))
            )
        } else {
            let generator = a.excess_where(|k| k == CauseKind::Generator);
            let what = if generator * 2 >= d.instrument {
                "the load generator's lateness"
            } else {
                "unexplained slowness (no one hop, link or queue took a quarter of the threshold)"
            };
            let busy = if machine.busy {
                format!("; the machine was busy ({})", machine.reasons.join(", "))
            } else {
                String::new()
            };
            format!(
                "the instrument: {} of requests were slow from {what}{busy}",
                percent(share(d.instrument))
            )
        };
        let reason = format!(
            "{who}; that is {} of the {} slow requests the model does not predict",
            percent(if excess > 0 {
                removed as f64 / excess as f64
            } else {
                0.0
            }),
            excess
        );
        return (Verdict::Inconclusive, Some(reason));
    }
    let top = a
        .excess
        .iter()
        .filter(|(label, _)| CauseKind::of_label(label).is_some_and(|k| !k.is_instrument()))
        .max_by_key(|(_, n)| **n);
    let reason = match top {
        Some((label, &k)) => {
            let behind = match CauseKind::of_label(label) {
                Some(CauseKind::Queue) => {
                    let hop = label.split_once(':').map_or("", |(_, h)| h);
                    if c.hops.iter().any(|h| h.hop == hop && h.slow > 0) {
                        " behind injected-slow requests"
                    } else {
                        " behind slow requests"
                    }
                }
                _ => "",
            };
            format!(
                "{} of requests were slow from {}{behind}, with no injected slowness of \
                 their own ({} of the {} slow requests the model does not predict)",
                percent(share(k)),
                describe_label(label),
                percent(k as f64 / excess.max(1) as f64),
                excess
            )
        }
        None => "slow requests without injected slowness".to_string(),
    };
    (Verdict::Fail, Some(reason))
}

/// The report of a comparison and its verdict.
fn report(
    c: Comparison,
    verdict: Verdict,
    reason: Option<String>,
    decomposition: Option<Decomposition>,
) -> CompoundingReport {
    CompoundingReport {
        slow_threshold_us: c.slow_threshold_us,
        n: c.counts.n,
        slow: c.counts.slow,
        timeouts_censored: c.counts.timeouts_censored,
        errors_excluded: c.counts.errors_excluded,
        measured: c.measured,
        ci_lo: c.ci.0,
        ci_hi: c.ci.1,
        model: c.model,
        declared_model: c.declared_model,
        deviation: c.deviation,
        hops: c.hops,
        verdict,
        reason,
        decomposition,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::attribution::summarize;
    use crate::compounding::{SlowCounts, compare};
    use crate::record::RequestRecord;
    use crate::testing::{T, rec, variant_records};

    fn hop(name: &str, requests: u64, slow: u64, declared_p: f64) -> HopSlowness {
        HopSlowness {
            hop: name.to_string(),
            requests,
            slow,
            p: if requests == 0 {
                0.0
            } else {
                slow as f64 / requests as f64
            },
            declared_p,
        }
    }

    /// The compounding check alone, as a report.
    fn judged(counts: SlowCounts, hops: Vec<HopSlowness>, threshold_us: u64) -> CompoundingReport {
        let c = compare(counts, hops, threshold_us);
        let (verdict, reason) = judge(&c);
        report(c, verdict, reason, None)
    }

    #[test]
    fn model_inside_the_interval_passes() {
        let hops = vec![
            hop("a", 1000, 100, 0.1),
            hop("b", 1000, 100, 0.1),
            hop("c", 1000, 100, 0.1),
        ];
        let counts = SlowCounts {
            n: 1000,
            slow: 271,
            ..Default::default()
        };
        let r = judged(counts, hops, 15_000);
        assert_eq!(r.verdict, Verdict::Pass);
        assert!((r.model - 0.271).abs() < 1e-12);
        assert!((r.declared_model - 0.271).abs() < 1e-12);
        assert!((r.measured - 0.271).abs() < 1e-12);
        assert!(r.deviation.is_some_and(|d| d.abs() < 1e-9));
    }

    #[test]
    fn model_outside_the_interval_fails_with_deviation_above_one() {
        // 271 of 1000: interval [0.2444, 0.2994]; a model of 0.36 is above it.
        let hops = vec![hop("a", 1000, 200, 0.1), hop("b", 1000, 200, 0.1)];
        let counts = SlowCounts {
            n: 1000,
            slow: 271,
            ..Default::default()
        };
        let r = judged(counts, hops, 15_000);
        assert_eq!(r.verdict, Verdict::Fail);
        let expected = (0.36 - 0.271) / (0.299_385_935_9 - 0.271);
        assert!(
            (r.deviation.unwrap_or(0.0) - expected).abs() < 1e-6,
            "{:?}",
            r.deviation
        );
    }

    #[test]
    fn too_few_trials_are_inconclusive() {
        let counts = SlowCounts {
            n: 29,
            slow: 29,
            ..Default::default()
        };
        let r = judged(counts, vec![hop("a", 29, 29, 1.0)], 1);
        assert_eq!(r.verdict, Verdict::Inconclusive);
        assert!(r.reason.is_some());
    }

    #[test]
    fn nothing_injected_and_nothing_slow_is_inconclusive() {
        let counts = SlowCounts {
            n: 500,
            slow: 0,
            ..Default::default()
        };
        let r = judged(counts, vec![hop("a", 500, 0, 0.0)], 1);
        assert_eq!(r.verdict, Verdict::Inconclusive);
        // But slow requests without any injection contradict a zero model.
        let counts = SlowCounts {
            n: 500,
            slow: 50,
            ..Default::default()
        };
        let r = judged(counts, vec![hop("a", 500, 0, 0.0)], 1);
        assert_eq!(r.verdict, Verdict::Fail);
    }

    /// The decided verdict of `records` through a -> b, a slow at 5 %.
    fn verdict(records: &[RequestRecord], machine: &MachineState) -> CompoundingReport {
        let a = summarize(records.iter(), T, &BTreeMap::new());
        let injected = records
            .iter()
            .filter(|r| r.path.iter().any(|h| h.slow))
            .count() as u64;
        let hops = vec![
            HopSlowness {
                hop: "a".into(),
                requests: 1000,
                slow: injected,
                p: injected as f64 / 1000.0,
                declared_p: 0.05,
            },
            HopSlowness {
                hop: "b".into(),
                requests: 1000,
                slow: 0,
                p: 0.0,
                declared_p: 0.0,
            },
        ];
        let counts = SlowCounts {
            n: a.requests,
            slow: a.slow,
            ..SlowCounts::default()
        };
        decide(compare(counts, hops, 15_000), &a, machine)
    }

    #[test]
    fn queue_wait_beyond_the_model_fails_and_is_named() {
        let records = variant_records(50, 60, CauseKind::Queue);
        let a = summarize(records.iter(), T, &BTreeMap::new());
        assert_eq!((a.slow, a.slow_injected), (110, 50));
        assert_eq!(a.excess.get("queue:b"), Some(&60));
        assert_eq!(a.per_hop["b"]["queue"], 60);
        let c = verdict(&records, &MachineState::default());
        assert_eq!(c.verdict, Verdict::Fail);
        let reason = c.reason.unwrap_or_default();
        assert!(
            reason.starts_with(
                "6.00 % of requests were slow from queue wait at hop b behind slow requests, \
                 with no injected slowness of their own (100 % of the 60"
            ),
            "{reason}"
        );
        // A busy machine does not excuse queueing, also when it made a few
        // requests slow between hops.
        let busy = MachineState {
            busy: true,
            reasons: vec!["CPU pressure 90 %".into()],
        };
        assert_eq!(verdict(&records, &busy).verdict, Verdict::Fail);
        let mut records = records;
        let network = variant_records(50, 65, CauseKind::Network);
        records[110..115].clone_from_slice(&network[110..115]);
        let c = verdict(&records, &busy);
        assert_eq!(c.verdict, Verdict::Fail, "{:?}", c.reason);
        assert_eq!(c.decomposition.map(|d| d.machine), Some(5));
    }

    #[test]
    fn a_late_generator_makes_a_failure_inconclusive_and_is_named() {
        let records = variant_records(50, 60, CauseKind::Generator);
        let c = verdict(&records, &MachineState::default());
        assert_eq!(c.verdict, Verdict::Inconclusive);
        let reason = c.reason.unwrap_or_default();
        assert!(reason.contains("the load generator's lateness"), "{reason}");
        assert_eq!(c.decomposition.map(|d| d.instrument), Some(60));
    }

    #[test]
    fn network_excess_fails_on_a_quiet_machine_and_is_the_machine_on_a_busy_one() {
        let records = variant_records(50, 60, CauseKind::Network);
        let quiet = verdict(&records, &MachineState::default());
        assert_eq!(quiet.verdict, Verdict::Fail);
        assert!(
            quiet
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("network between hops a and b")),
            "{:?}",
            quiet.reason
        );
        let busy = MachineState {
            busy: true,
            reasons: vec!["other processes used 1.6 of 2 CPUs".into()],
        };
        let c = verdict(&records, &busy);
        assert_eq!(c.verdict, Verdict::Inconclusive);
        let reason = c.reason.unwrap_or_default();
        assert!(
            reason.starts_with("the machine was busy (other processes used 1.6 of 2 CPUs)"),
            "{reason}"
        );
    }

    #[test]
    fn work_beyond_its_declared_bound_is_the_machine_only_when_busy() {
        // 60 requests whose hop a worked 16.5 ms, uninjected.
        let mut records = variant_records(50, 0, CauseKind::Queue);
        for r in &mut records[50..110] {
            r.path[1] = rec("a", "", "push", [165, 170, 0], false);
            r.end = r.start + Duration::from_micros(17_100);
        }
        let bounds: BTreeMap<String, Duration> =
            [("a".to_string(), Duration::from_millis(2))].into();
        let a = summarize(records.iter(), T, &bounds);
        assert_eq!((a.excess.get("work:a"), a.work_overrun), (Some(&60), 60));
        let busy = MachineState {
            busy: true,
            reasons: vec!["CPU pressure 90 %".into()],
        };
        let judged = |a: &AttributionReport, machine: &MachineState| {
            let hops = vec![HopSlowness {
                hop: "a".into(),
                requests: 1000,
                slow: 50,
                p: 0.05,
                declared_p: 0.05,
            }];
            let counts = SlowCounts {
                n: a.requests,
                slow: a.slow,
                ..SlowCounts::default()
            };
            let c = decide(compare(counts, hops, 15_000), a, machine);
            (c.verdict, c.reason)
        };
        assert_eq!(judged(&a, &busy).0, Verdict::Inconclusive);
        assert_eq!(judged(&a, &MachineState::default()).0, Verdict::Fail);
        // Work its distribution allows is the mesh's, busy or not.
        let unbounded = summarize(records.iter(), T, &BTreeMap::new());
        assert_eq!(unbounded.work_overrun, 0);
        let (verdict, reason) = judged(&unbounded, &busy);
        assert_eq!(verdict, Verdict::Fail, "{reason:?} {unbounded:?}");
    }

    #[test]
    fn agreement_passes_whatever_the_machine() {
        let records = variant_records(50, 0, CauseKind::Queue);
        let busy = MachineState {
            busy: true,
            reasons: vec!["x".into()],
        };
        let c = verdict(&records, &busy);
        assert_eq!(c.verdict, Verdict::Pass);
        assert_eq!(c.decomposition.map(|d| d.slow_injected), Some(50));
    }
}
