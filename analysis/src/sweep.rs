//! A swept scenario's results as one table: for every declared variant
//! (the sweep's groups) and every swept value, the tail and, when checked,
//! the compounding numbers. This is the compounding curve: measured slow
//! fraction with its 95 % interval against 1 - prod(1 - p) for each n.

use serde::{Deserialize, Serialize};

use super::{variant::VariantReport, verdict::Verdict};
use tailmesh_model::scenario::Scenario;

/// The sweep's table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    /// What was swept (`"hops"` or an override path).
    pub key: String,
    /// The values in order, as written.
    pub values: Vec<String>,
    /// One row per variant run, grouped by declared variant, in value order.
    pub rows: Vec<SweepRow>,
}

impl SweepSummary {
    /// The declared variants (the rows' groups), in the order they first
    /// appear.
    pub fn groups(&self) -> Vec<&str> {
        let mut groups: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !groups.contains(&r.group.as_str()) {
                groups.push(&r.group);
            }
        }
        groups
    }

    /// The row of declared variant `group` at swept value `value`.
    pub fn row(&self, group: &str, value: &str) -> Option<&SweepRow> {
        self.rows
            .iter()
            .find(|r| r.group == group && r.value == value)
    }
}

/// One point of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// The declared variant ("push", "pull", or "base").
    pub group: String,
    /// The swept value.
    pub value: String,
    /// The variant that ran it.
    pub variant: String,
    /// Requests sent and answered ok.
    pub sent: u64,
    /// Answered ok.
    pub ok: u64,
    /// Goodput: requests answered ok per second of the measured window.
    #[serde(default)]
    pub ok_rate: f64,
    /// Share of the requests sent that failed (errors and timeouts).
    #[serde(default)]
    pub error_share: f64,
    /// End-to-end latency percentiles, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p99_9_us: u64,
    /// Measured slow fraction, its 95 % interval, the model from measured
    /// p_i, the declared model, and the verdict (when checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compounding: Option<SweepCompounding>,
}

/// The compounding numbers of one sweep point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepCompounding {
    /// Measured slow fraction.
    pub measured: f64,
    /// 95 % Wilson interval, low end.
    pub ci_lo: f64,
    /// 95 % Wilson interval, high end.
    pub ci_hi: f64,
    /// 1 - prod(1 - p_i) from the measured p_i.
    pub model: f64,
    /// 1 - prod(1 - p) from the declared probabilities.
    pub declared_model: f64,
    /// Whether the model lies in the interval.
    pub verdict: Verdict,
}

/// The sweep table of `scenario`'s run, or `None` without a sweep.
pub fn summarize_sweep(scenario: &Scenario, reports: &[VariantReport]) -> Option<SweepSummary> {
    let sweep = scenario.sweep.as_ref()?;
    let mut rows = Vec::new();
    for v in &scenario.variants {
        let (Some(point), Some(r)) = (&v.sweep, reports.iter().find(|r| r.name == v.name)) else {
            continue;
        };
        rows.push(SweepRow {
            group: point.group.clone(),
            value: point.value.clone(),
            variant: v.name.clone(),
            sent: r.sent,
            ok: r.ok,
            ok_rate: r.ok_rate,
            error_share: if r.sent == 0 {
                0.0
            } else {
                r.sent.saturating_sub(r.ok) as f64 / r.sent as f64
            },
            p50_us: r.latency.p50_us,
            p99_us: r.latency.p99_us,
            p99_9_us: r.latency.p99_9_us,
            compounding: r.compounding.as_ref().map(|c| SweepCompounding {
                measured: c.measured,
                ci_lo: c.ci_lo,
                ci_hi: c.ci_hi,
                model: c.model,
                declared_model: c.declared_model,
                verdict: c.verdict,
            }),
        });
    }
    Some(SweepSummary {
        key: sweep.key.clone(),
        values: sweep.values.clone(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::{analyze_variant, chain3, check, mixed_records};
    use tailmesh_model::scenario::{Report, Sweep, SweepPoint};

    #[test]
    fn rows_follow_the_variants_and_agree_with_their_reports() {
        let mut variants = Vec::new();
        let mut reports = Vec::new();
        for (group, value) in [("push", "1"), ("push", "2"), ("pull", "1")] {
            let mut v = chain3();
            v.name = format!("{group}-hops-{value}");
            v.sweep = Some(SweepPoint {
                group: group.into(),
                value: value.into(),
            });
            let mut r = analyze_variant(&v, &check(), &mixed_records(), Duration::from_secs(2));
            r.name = v.name.clone();
            variants.push(v);
            reports.push(r);
        }
        let scenario = Scenario {
            name: "s".into(),
            description: String::new(),
            seed: 1,
            variants,
            check: check(),
            report: Report::default(),
            telemetry: Default::default(),
            sweep: Some(Sweep {
                key: "hops".into(),
                values: vec!["1".into(), "2".into()],
            }),
        };
        let summary = summarize_sweep(&scenario, &reports).expect("a sweep");
        assert_eq!(summary.rows.len(), 3);
        let row = &summary.rows[1];
        assert_eq!(
            (row.group.as_str(), row.value.as_str(), row.variant.as_str()),
            ("push", "2", "push-hops-2")
        );
        assert_eq!(row.p99_us, reports[1].latency.p99_us);
        assert_eq!(row.ok_rate, reports[1].ok_rate);
        let failed = reports[1].sent - reports[1].ok;
        assert!(failed > 0, "the records hold failures");
        assert_eq!(row.error_share, failed as f64 / reports[1].sent as f64);
        let c = row.compounding.as_ref().expect("checked");
        let rc = reports[1].compounding.as_ref().expect("checked");
        assert_eq!(
            (c.measured, c.model, c.verdict),
            (rc.measured, rc.model, rc.verdict)
        );
        let mut plain = scenario.clone();
        plain.sweep = None;
        assert!(summarize_sweep(&plain, &reports).is_none());
    }
}
