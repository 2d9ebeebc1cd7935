//! The whole run as summary.json sees it: the scenario echo, the host, every
//! variant's report and the overall check.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::compounding::Verdict;
use super::variant::{Override, VariantReport, overrides};
use crate::scenario::Scenario;

/// The `schema` value of summary.json; bump on incompatible changes.
pub(crate) const SCHEMA: &str = "tailmesh.summary/v1";

/// Everything summary.json holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    /// Always [`SCHEMA`].
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
    /// The files written, by role ("requests" -> "requests.csv", ...),
    /// relative to the results folder. Filled in by whoever writes them.
    pub files: BTreeMap<String, String>,
    /// What the trace receiver counted (absent when tracing was off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<crate::traces::collector::TraceCounts>,
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
        let check = CheckSummary::of(&variants);
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

/// `t` in UTC as RFC 3339, e.g. `2025-01-02T03:04:05.123Z`.
pub(crate) fn rfc3339_utc(t: OffsetDateTime) -> String {
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
        }
    }
}

/// The host a run happened on.
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

impl Environment {
    /// Reads the host's facts: the kernel release from
    /// /proc/sys/kernel/osrelease (else `uname -r`), the host name from
    /// /proc/sys/kernel/hostname (else `uname -n`). Facts that cannot be
    /// read are `None`, never an error.
    pub fn detect(launcher: &str) -> Environment {
        Environment {
            tailmesh_version: env!("CARGO_PKG_VERSION").to_string(),
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            kernel: read_fact("/proc/sys/kernel/osrelease", "-r"),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            hostname: read_fact("/proc/sys/kernel/hostname", "-n"),
            launcher: launcher.to_string(),
        }
    }
}

/// The trimmed content of `file`, else the output of `uname <flag>`.
fn read_fact(file: &str, uname_flag: &str) -> Option<String> {
    let text = std::fs::read_to_string(file).ok().or_else(|| {
        let out = std::process::Command::new("uname")
            .arg(uname_flag)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// The run's overall verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckSummary {
    /// "fail" if any variant's compounding check failed, else
    /// "inconclusive" if any was inconclusive, else "pass" (also when no
    /// variant requested the check: see `compounding_requested`).
    pub verdict: Verdict,
    /// Whether any variant ran the compounding check.
    pub compounding_requested: bool,
    /// Each variant's compounding verdict (absent: not requested).
    pub variants: BTreeMap<String, Verdict>,
    /// Whether every variant accounted for every request.
    pub accounted: bool,
}

impl CheckSummary {
    /// Combines the variants' verdicts.
    pub fn of(variants: &[VariantReport]) -> CheckSummary {
        let verdicts: BTreeMap<String, Verdict> = variants
            .iter()
            .filter_map(|v| v.compounding.as_ref().map(|c| (v.name.clone(), c.verdict)))
            .collect();
        let any = |x: Verdict| verdicts.values().any(|&v| v == x);
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
            accounted: variants.iter().all(|v| v.accounted),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::analysis::testing::{chain3, check, mixed_records};
    use crate::analysis::variant::analyze_variant;

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
            CheckSummary::of(std::slice::from_ref(&pass)).verdict,
            Verdict::Pass
        );
        let both = CheckSummary::of(&[pass.clone(), inconclusive]);
        assert_eq!(both.verdict, Verdict::Inconclusive);
        assert_eq!(both.variants.len(), 2);
        let mut failing = pass.clone();
        if let Some(c) = failing.compounding.as_mut() {
            c.verdict = Verdict::Fail;
        }
        failing.name = "bad".into();
        assert_eq!(CheckSummary::of(&[pass, failing]).verdict, Verdict::Fail);
    }

    #[test]
    fn not_requested_passes_but_says_so() {
        let mut r = report("base", &mixed_records());
        r.compounding = None;
        let c = CheckSummary::of(&[r]);
        assert_eq!(c.verdict, Verdict::Pass);
        assert!(!c.compounding_requested);
        assert!(c.accounted);
    }

    #[test]
    fn started_at_is_utc_rfc3339() {
        let t = OffsetDateTime::from_unix_timestamp(1_700_000_000)
            .expect("valid timestamp")
            .to_offset(time::UtcOffset::from_hms(2, 0, 0).expect("valid offset"));
        assert_eq!(rfc3339_utc(t), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn environment_knows_this_host() {
        let e = Environment::detect("local");
        assert_eq!(e.launcher, "local");
        assert_eq!(e.tailmesh_version, env!("CARGO_PKG_VERSION"));
        assert!(e.cpus >= 1);
        if cfg!(target_os = "linux") {
            assert!(e.kernel.is_some());
        }
    }
}
