//! The whole run as summary.json sees it: the scenario echo, the host, every
//! variant's report and the overall check.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tailmesh_units::percent;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::variant::{Override, VariantReport, overrides};
use super::verdict::Verdict;
use tailmesh_model::scenario::Scenario;

/// The `schema` value of summary.json; bump on incompatible changes.
pub const SCHEMA: &str = "tailmesh.summary/v1";

/// Everything summary.json holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    /// Always `SCHEMA` (the current version).
    pub schema: String,
    /// The run's id (also its results folder).
    pub run_id: String,
    /// When the run started, RFC 3339 in UTC.
    pub started_at: String,
    /// The scenario as run.
    pub scenario: ScenarioEcho,
    /// The host it ran on.
    pub environment: Environment,
    /// One report per variant, in scenario order.
    pub variants: Vec<VariantReport>,
    /// The overall verdict.
    pub check: CheckSummary,
    /// The swept parameter's table, for a swept scenario.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<super::sweep::SweepSummary>,
    /// Whether Ctrl-C or SIGTERM cut the run short.
    #[serde(default)]
    pub interrupted: bool,
    /// Variants that never ran because the run was interrupted first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The run folder's files: name (relative to the folder) -> what it
    /// holds. Filled in from the writer's own list (the orchestrator's `output::run_files`).
    pub files: BTreeMap<String, String>,
    /// What the trace receiver counted (absent when tracing was off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<crate::traces::TraceCounts>,
}

impl Summary {
    /// Assembles a summary and derives its overall check; `files` starts
    /// empty.
    pub fn new(
        run_id: impl Into<String>,
        started_at: OffsetDateTime,
        scenario: ScenarioEcho,
        environment: Environment,
        variants: Vec<VariantReport>,
    ) -> Summary {
        let check = CheckSummary::of(&variants, scenario.max_error_rate);
        Summary {
            schema: SCHEMA.to_string(),
            run_id: run_id.into(),
            started_at: rfc3339_utc(started_at),
            scenario,
            environment,
            variants,
            check,
            sweep: None,
            interrupted: false,
            skipped: Vec::new(),
            files: BTreeMap::new(),
            traces: None,
        }
    }
}

/// What the run knew besides its variants' reports: plain data for
/// [`summarize_run`].
pub struct RunFacts<'a> {
    /// The scenario as run.
    pub scenario: &'a Scenario,
    /// The scenario file, as given.
    pub origin: &'a Path,
    /// The scenario file's text.
    pub source: &'a str,
    /// The run's id (its folder's name).
    pub run_id: &'a str,
    /// When the run started.
    pub started_at: OffsetDateTime,
    /// The host.
    pub environment: Environment,
    /// What the trace receiver counted, when tracing was on.
    pub traces: Option<crate::traces::TraceCounts>,
}

/// The whole run's summary from the reports of the variants that ran (in
/// scenario order; fewer than the scenario's when it was interrupted).
/// `files` is left for the writer to fill.
pub fn summarize_run(facts: RunFacts<'_>, reports: Vec<VariantReport>) -> Summary {
    let ran = reports.len();
    let interrupted = ran < facts.scenario.variants.len() || reports.iter().any(|r| r.interrupted);
    let mut summary = Summary::new(
        facts.run_id,
        facts.started_at,
        ScenarioEcho::new(facts.scenario, facts.origin, facts.source),
        facts.environment,
        reports,
    );
    summary.sweep = super::summarize_sweep(facts.scenario, &summary.variants);
    summary.interrupted = interrupted;
    summary.skipped = facts
        .scenario
        .variants
        .iter()
        .skip(ran)
        .map(|v| v.name.clone())
        .collect();
    summary.traces = facts.traces;
    summary
}

impl Summary {
    /// One line per variant whose compounding verdict is inconclusive:
    /// `variant "base": inconclusive: <reason>`.
    pub fn inconclusive_reasons(&self) -> Vec<String> {
        self.variants
            .iter()
            .filter_map(|v| {
                let c = v.compounding.as_ref()?;
                (c.verdict == Verdict::Inconclusive).then(|| {
                    format!(
                        "variant \"{}\": inconclusive: {}",
                        v.name,
                        c.reason.as_deref().unwrap_or("no reason recorded")
                    )
                })
            })
            .collect()
    }
}

/// `t` in UTC as RFC 3339, e.g. `2025-01-02T03:04:05.123Z`.
pub fn rfc3339_utc(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

/// The scenario as it was run: enough to reproduce it without the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioEcho {
    /// Scenario name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// The seed of every random draw.
    pub seed: u64,
    /// The file it came from, as given.
    pub origin: String,
    /// The file's full text.
    pub source: String,
    /// The variants and their overrides.
    pub variants: Vec<VariantEcho>,
    /// Slow threshold of the check, µs.
    pub slow_threshold_us: u64,
    /// Whether the compounding check was requested.
    pub compounding: bool,
    /// The largest share of a variant's requests that may fail (errors
    /// plus timeouts over sent).
    #[serde(default = "default_max_error_rate")]
    pub max_error_rate: f64,
}

/// What a summary written before `max_error_rate` existed was held to.
fn default_max_error_rate() -> f64 {
    tailmesh_model::scenario::DEFAULT_MAX_ERROR_RATE
}

/// One variant in the scenario echo.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantEcho {
    /// Variant name.
    pub name: String,
    /// Its overrides, as written.
    pub overrides: Vec<Override>,
}

impl ScenarioEcho {
    /// Echoes `scenario`, read from `origin` whose text is `source`.
    pub fn new(scenario: &Scenario, origin: &Path, source: impl Into<String>) -> ScenarioEcho {
        ScenarioEcho {
            name: scenario.name.clone(),
            description: scenario.description.clone(),
            seed: scenario.seed,
            origin: origin.display().to_string(),
            source: source.into(),
            variants: scenario
                .variants
                .iter()
                .map(|v| VariantEcho {
                    name: v.name.clone(),
                    overrides: overrides(v),
                })
                .collect(),
            slow_threshold_us: super::stats::micros(scenario.check.slow_threshold),
            compounding: scenario.check.compounding,
            max_error_rate: scenario.check.max_error_rate,
        }
    }
}

/// The host a run happened on (read by the caller: `experiment.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    /// tailmesh's version.
    pub tailmesh_version: String,
    /// Operating system (`linux`, `macos`, ...).
    pub os: String,
    /// CPU architecture.
    pub arch: String,
    /// Kernel release, if it could be read.
    pub kernel: Option<String>,
    /// CPUs available to this process.
    pub cpus: usize,
    /// Host name, if it could be read.
    pub hostname: Option<String>,
    /// The launcher that ran the hops ("local", ...).
    pub launcher: String,
}

/// The run's overall verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckSummary {
    /// "fail" if any variant's compounding or distribution check failed,
    /// else "inconclusive" if any was inconclusive, else "pass" (also when
    /// no variant requested a check: see `compounding_requested` and
    /// `distribution`).
    pub verdict: Verdict,
    /// Whether any variant ran the compounding check.
    pub compounding_requested: bool,
    /// Each variant's compounding verdict (absent: not requested).
    pub variants: BTreeMap<String, Verdict>,
    /// Each variant's distribution verdict (`[check] distribution`;
    /// absent: not requested). `verdict` counts them too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub distribution: BTreeMap<String, Verdict>,
    /// Whether every variant accounted for every request.
    pub accounted: bool,
    /// Whether every variant's share of failed requests stayed within
    /// `max_error_rate`, and each variant's share (absent in summaries
    /// written before this check existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<ErrorRateCheck>,
}

/// The error check: no variant may fail a larger share of its requests
/// than the scenario's `[check] max_error_rate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorRateCheck {
    /// Whether every variant's `error_rate` is at most `max_error_rate`.
    pub passed: bool,
    /// The largest share of a variant's requests that may fail.
    pub max_error_rate: f64,
    /// Each variant's outcome, by name.
    pub variants: BTreeMap<String, VariantErrorRate>,
}

/// One variant's outcome in the error check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantErrorRate {
    /// Requests sent in the measured phase.
    pub sent: u64,
    /// Of those, the ones that failed: errors of every kind plus timeouts.
    pub failed: u64,
    /// `failed / sent`; 0 when nothing was sent.
    pub error_rate: f64,
    /// Whether `error_rate` is at most the check's `max_error_rate`.
    pub passed: bool,
}

impl VariantErrorRate {
    /// `failed` of `sent` requests, held to `max_error_rate`.
    pub fn judge(sent: u64, failed: u64, max_error_rate: f64) -> VariantErrorRate {
        let error_rate = if sent == 0 {
            0.0
        } else {
            failed as f64 / sent as f64
        };
        VariantErrorRate {
            sent,
            failed,
            error_rate,
            passed: error_rate <= max_error_rate,
        }
    }
}

impl ErrorRateCheck {
    /// Holds every variant's errors plus timeouts over sent to
    /// `max_error_rate`.
    pub fn of(variants: &[VariantReport], max_error_rate: f64) -> ErrorRateCheck {
        let variants: BTreeMap<String, VariantErrorRate> = variants
            .iter()
            .map(|v| {
                let failed = v.errors.values().sum::<u64>().saturating_add(v.timeouts);
                let judged = VariantErrorRate::judge(v.sent, failed, max_error_rate);
                (v.name.clone(), judged)
            })
            .collect();
        ErrorRateCheck {
            passed: variants.values().all(|v| v.passed),
            max_error_rate,
            variants,
        }
    }

    /// The variants that failed more than `max_error_rate` of their
    /// requests, by name.
    pub fn failing(&self) -> impl Iterator<Item = (&str, &VariantErrorRate)> {
        self.variants
            .iter()
            .filter(|(_, v)| !v.passed)
            .map(|(name, v)| (name.as_str(), v))
    }
}

impl CheckSummary {
    /// Combines the variants' verdicts, and holds each variant's share of
    /// failed requests to `max_error_rate`.
    pub fn of(variants: &[VariantReport], max_error_rate: f64) -> CheckSummary {
        let verdicts: BTreeMap<String, Verdict> = variants
            .iter()
            .filter_map(|v| v.compounding.as_ref().map(|c| (v.name.clone(), c.verdict)))
            .collect();
        let distribution: BTreeMap<String, Verdict> = variants
            .iter()
            .filter_map(|v| {
                let check = v.composition.as_ref()?.check.as_ref()?;
                Some((v.name.clone(), check.verdict))
            })
            .collect();
        let any = |x: Verdict| {
            verdicts
                .values()
                .chain(distribution.values())
                .any(|&v| v == x)
        };
        let verdict = if any(Verdict::Fail) {
            Verdict::Fail
        } else if any(Verdict::Inconclusive) {
            Verdict::Inconclusive
        } else {
            Verdict::Pass
        };
        CheckSummary {
            verdict,
            compounding_requested: !verdicts.is_empty(),
            variants: verdicts,
            distribution,
            accounted: variants.iter().all(|v| v.accounted),
            error_rate: Some(ErrorRateCheck::of(variants, max_error_rate)),
        }
    }

    /// One line per variant that failed more of its requests than
    /// `max_error_rate` allows, naming the variant, its share and the limit.
    pub fn error_failures(&self) -> Vec<String> {
        let Some(check) = &self.error_rate else {
            return Vec::new();
        };
        check
            .failing()
            .map(|(name, v)| {
                format!(
                    "variant \"{name}\": {} of {} requests failed (errors and timeouts), \
                     an error share of {}, above check.max_error_rate = {} ({})",
                    v.failed,
                    v.sent,
                    percent(v.error_rate),
                    check.max_error_rate,
                    percent(check.max_error_rate),
                )
            })
            .collect()
    }

    /// Whether the run passes `--check`: no compounding verdict "fail",
    /// every request accounted for, and no variant failing more than
    /// `max_error_rate` of its requests.
    pub fn passed(&self) -> bool {
        self.verdict != Verdict::Fail
            && self.accounted
            && self.error_rate.as_ref().is_none_or(|e| e.passed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::analyze_variant;
    use crate::testing::{chain3, check, mixed_records};

    fn report(name: &str, records: &[crate::record::RequestRecord]) -> VariantReport {
        let mut v = chain3();
        v.name = name.to_string();
        analyze_variant(&v, &check(), records, Duration::from_secs(2))
    }

    #[test]
    fn overall_verdict_needs_every_variant_to_pass() {
        let pass = report("push", &mixed_records());
        let inconclusive = report("pull", &[]);
        assert_eq!(
            CheckSummary::of(std::slice::from_ref(&pass), 1.0).verdict,
            Verdict::Pass
        );
        let both = CheckSummary::of(&[pass.clone(), inconclusive], 1.0);
        assert_eq!(both.verdict, Verdict::Inconclusive);
        assert_eq!(both.variants.len(), 2);
        let mut failing = pass.clone();
        if let Some(c) = failing.compounding.as_mut() {
            c.verdict = Verdict::Fail;
        }
        failing.name = "bad".into();
        assert_eq!(
            CheckSummary::of(&[pass, failing], 1.0).verdict,
            Verdict::Fail
        );
    }

    #[test]
    fn not_requested_passes_but_says_so() {
        let mut r = report("base", &mixed_records());
        r.compounding = None;
        let c = CheckSummary::of(&[r], 1.0);
        assert_eq!(c.verdict, Verdict::Pass);
        assert!(!c.compounding_requested);
        assert!(c.accounted);
    }

    #[test]
    fn the_error_rule_holds_failed_over_sent_to_the_limit() {
        let judge = VariantErrorRate::judge;
        assert!(judge(100, 1, 0.01).passed, "at the limit passes");
        assert!(!judge(100, 2, 0.01).passed);
        assert!(!judge(100, 1, 0.0).passed);
        assert!(judge(100, 100, 1.0).passed);
        assert_eq!(judge(100, 100, 0.01).error_rate, 1.0);
        assert_eq!(judge(8, 2, 0.5).error_rate, 0.25);
        let nothing_sent = judge(0, 0, 0.0);
        assert_eq!(nothing_sent.error_rate, 0.0);
        assert!(nothing_sent.passed);
    }

    #[test]
    fn the_error_check_counts_errors_and_timeouts_per_variant() {
        // 5 timeouts and 5 errors of 1010 requests: a share of 0.0099.
        let r = report("push", &mixed_records());
        let within = CheckSummary::of(std::slice::from_ref(&r), 0.01);
        let e = within.error_rate.as_ref().expect("always evaluated");
        let push = &e.variants["push"];
        assert_eq!((push.sent, push.failed), (1010, 10));
        assert!((push.error_rate - 10.0 / 1010.0).abs() < 1e-12);
        assert!(e.passed && within.passed());

        let clean = report("clean", &crate::testing::ok_records());
        let above = CheckSummary::of(&[r, clean], 0.009);
        assert_eq!(
            above.verdict,
            Verdict::Pass,
            "compounding is a separate check"
        );
        assert!(!above.passed());
        let e = above.error_rate.as_ref().expect("always evaluated");
        let failing: Vec<&str> = e.failing().map(|(name, _)| name).collect();
        assert_eq!(failing, ["push"]);
        assert_eq!(
            above.error_failures(),
            [
                "variant \"push\": 10 of 1010 requests failed (errors and timeouts), an error \
                 share of 0.99 %, above check.max_error_rate = 0.009 (0.9 %)"
            ]
        );
    }

    #[test]
    fn a_summary_from_before_the_error_check_still_reads_and_passes() {
        let mut json =
            serde_json::to_value(crate::testing::summary()).expect("a summary serializes");
        for (object, key) in [("/check", "error_rate"), ("/scenario", "max_error_rate")] {
            json.pointer_mut(object)
                .and_then(serde_json::Value::as_object_mut)
                .and_then(|o| o.remove(key))
                .expect("the key is written");
        }
        let old: Summary = serde_json::from_value(json).expect("an older summary reads");
        assert_eq!(old.check.error_rate, None);
        assert!(old.check.passed());
        assert_eq!(old.scenario.max_error_rate, 0.01);
    }

    #[test]
    fn started_at_is_utc_rfc3339() {
        let t = OffsetDateTime::from_unix_timestamp(1_700_000_000)
            .expect("valid timestamp")
            .to_offset(time::UtcOffset::from_hms(2, 0, 0).expect("valid offset"));
        assert_eq!(rfc3339_utc(t), "2023-11-14T22:13:20Z");
    }
}
