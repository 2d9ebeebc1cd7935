//! `tailmesh cases`: labelled fault cases for root-cause analysis. Each
//! case is a short run of a scenario's steady mesh with one fault drawn
//! from a seed ([`draw`]); a case is kept when the fault moved the
//! end-to-end objective ([`judge`]). A kept case's folder holds what a
//! root-cause tool reads (traces as Jaeger and OTLP JSON, per-service
//! metrics at 1 s in RCAEval's layout ([`series`]), the hops' logs) and
//! its label; rankings of suspects ([`rank`]) are scored against the
//! labels ([`score`]).
//!
//! ```text
//! DIR/index.json                  every injection, kept or not, and why
//! DIR/case-007/label.json         the root cause, the fault, its window
//! DIR/case-007/inject_time.txt    the fault's start, Unix seconds (RCAEval)
//! DIR/case-007/metrics.csv        time, <service>_<metric>, ... at 1 s
//! DIR/case-007/traces.jaeger.json every trace of the case
//! DIR/case-007/traces.otlp.json   the same, as OTLP JSON
//! DIR/case-007/logs/              each process's log
//! DIR/case-007/rankings/*.json    tailmesh's ranking and the baselines'
//! DIR/runs/case-007/              the whole run folder (holds the truth)
//! ```

pub mod draw;
pub mod files;
pub mod rank;
pub mod score;
pub mod series;

use serde::{Deserialize, Serialize};
use tailmesh_analysis::phases::PhaseReport;
use tailmesh_model::scenario::Check;

pub use draw::{Fault, Kind};

/// The end-to-end measures of a stretch of a case.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stretch {
    pub start_s: f64,
    pub end_s: f64,
    pub sent: u64,
    #[serde(default)]
    pub ok: u64,
    pub p99_us: u64,
    pub error_share: f64,
}

impl Stretch {
    fn of(p: &PhaseReport) -> Stretch {
        Stretch {
            start_s: p.start_s,
            end_s: p.end_s,
            sent: p.sent,
            ok: p.ok,
            p99_us: p.latency.p99_us,
            error_share: p.error_share,
        }
    }

    /// Whether it breaks the objective: p99 over the slow threshold or
    /// the error share over the check's limit.
    fn breaks(&self, check: &Check) -> bool {
        self.p99_us as f64 > check.slow_threshold.as_secs_f64() * 1e6
            || self.error_share > check.max_error_rate
    }

    fn describe(&self) -> String {
        let p99 = if self.ok == 0 {
            "no ok request".to_owned()
        } else {
            format!(
                "p99 {}",
                tailmesh_units::duration(std::time::Duration::from_micros(self.p99_us))
            )
        };
        format!("{p99}, errors {:.2} %", self.error_share * 100.0)
    }
}

/// Whether a case is kept, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub kept: bool,
    pub reason: String,
    /// Before the window, and in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Stretch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub during: Option<Stretch>,
}

/// Judges a case's run: kept when the objective held before the window
/// and broke in it (p99 over the slow threshold, or the error share over
/// `[check] max_error_rate`), from the run's phases.
pub fn judge(phases: &[PhaseReport], fault: &Fault, check: &Check) -> Verdict {
    let near = |a: f64, b: f64| (a - b).abs() < 0.05;
    let during = phases
        .iter()
        .find(|p| near(p.start_s, fault.start_s) && !p.faults.is_empty())
        .map(Stretch::of);
    let before = phases
        .iter()
        .find(|p| near(p.end_s, fault.start_s) && p.faults.is_empty())
        .map(Stretch::of);
    let threshold = tailmesh_units::duration(check.slow_threshold);
    let limit = format!("{:.2} %", check.max_error_rate * 100.0);
    let (kept, reason) = match (&before, &during) {
        (Some(b), Some(_)) if b.breaks(check) => (
            false,
            format!(
                "the objective (p99 under {threshold}, errors under {limit}) was already broken \
                 before the window: {}",
                b.describe()
            ),
        ),
        (Some(b), Some(d)) if d.breaks(check) => (
            true,
            format!("before the window {}; in it {}", b.describe(), d.describe()),
        ),
        (Some(_), Some(d)) => (
            false,
            format!(
                "invisible: in the window {}, within the objective (p99 under {threshold}, \
                 errors under {limit})",
                d.describe()
            ),
        ),
        _ => (
            false,
            "the run has no phases before and during the window (was it interrupted?)".to_owned(),
        ),
    };
    Verdict {
        kept,
        reason,
        before,
        during,
    }
}

/// `label.json`: the truth of one case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Label {
    pub case: String,
    /// The root cause: a service (a hop of the scenario).
    pub service: String,
    /// Its replica, when the fault was on one.
    #[serde(default)]
    pub replica: Option<u32>,
    pub fault: Fault,
    /// The window on the metrics' clock (Unix seconds).
    pub start_unix_s: f64,
    pub end_unix_s: f64,
    /// When the fault agent answered that the fault was applied and
    /// cleared, on the run's measured clock (seconds from the end of
    /// warmup), when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_at_s: Option<f64>,
    /// The end of warmup, Unix seconds: 0 on the measured clock.
    pub origin_unix_s: f64,
    pub verdict: Verdict,
}

/// One injection in `index.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub case: String,
    pub fault: Fault,
    pub verdict: Verdict,
    /// The run folder, relative to the cases' folder.
    pub run: String,
}

/// `index.json`: how the cases were made and every injection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Index {
    pub scenario: String,
    pub variant: String,
    pub seed: u64,
    pub length_s: f64,
    pub background: bool,
    pub kinds: Vec<Kind>,
    pub services: Vec<String>,
    /// The scenario's slow threshold, µs.
    pub slow_threshold_us: u64,
    pub kept: u64,
    pub dropped: u64,
    pub cases: Vec<Entry>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tailmesh_analysis::stats::Percentiles;

    fn phase(
        start_s: f64,
        end_s: f64,
        faults: &[&str],
        p99_ms: u64,
        error_share: f64,
    ) -> PhaseReport {
        PhaseReport {
            name: String::new(),
            start_s,
            end_s,
            faults: faults.iter().map(|f| (*f).to_owned()).collect(),
            offered_rate: None,
            sent: 100,
            ok: 100,
            errors: 0,
            timeouts: 0,
            rate: 100.0,
            ok_rate: 100.0,
            error_share,
            latency: Percentiles {
                p99_us: p99_ms * 1_000,
                ..Percentiles::default()
            },
            recovery: None,
            compounding: None,
            attribution: None,
            composition: None,
        }
    }

    fn fault() -> Fault {
        Fault {
            kind: Kind::Slow,
            service: "b".into(),
            replica: None,
            start_s: 4.0,
            end_s: 7.0,
            probability: Some(0.1),
            extra_us: Some(20_000),
            factor: None,
            code: None,
            loss: None,
            delay_us: None,
            jitter_us: None,
        }
    }

    #[test]
    fn a_case_is_kept_when_the_window_broke_an_objective_that_held_before() {
        let check = Check {
            slow_threshold: Duration::from_millis(15),
            compounding: false,
            max_error_rate: 0.01,
            distribution: false,
            distribution_tolerance: 0.1,
        };
        let judged = |before: PhaseReport, during: PhaseReport| {
            let phases = [before, during, phase(7.0, 12.0, &[], 2, 0.0)];
            judge(&phases, &fault(), &check)
        };
        let kept = judged(
            phase(0.0, 4.0, &[], 2, 0.0),
            phase(4.0, 7.0, &["slow b"], 30, 0.0),
        );
        assert!(kept.kept, "{kept:?}");
        assert_eq!(kept.during.as_ref().map(|d| d.p99_us), Some(30_000));
        let errors = judged(
            phase(0.0, 4.0, &[], 2, 0.0),
            phase(4.0, 7.0, &["slow b"], 2, 0.02),
        );
        assert!(errors.kept);
        let invisible = judged(
            phase(0.0, 4.0, &[], 2, 0.0),
            phase(4.0, 7.0, &["slow b"], 14, 0.0),
        );
        assert!(!invisible.kept);
        assert!(
            invisible.reason.starts_with("invisible"),
            "{}",
            invisible.reason
        );
        let broken = judged(
            phase(0.0, 4.0, &[], 20, 0.0),
            phase(4.0, 7.0, &["slow b"], 30, 0.0),
        );
        assert!(!broken.kept);
        assert!(
            broken.reason.contains("already broken"),
            "{}",
            broken.reason
        );
        assert!(!judge(&[], &fault(), &check).kept);
    }
}
