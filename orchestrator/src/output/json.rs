//! `summary.json`: the run's `Summary`, pretty-printed; and the JSON of
//! `compare --gate` (`tailmesh.compare/v1`), the `GateReport`.

use std::io::Write;
use std::path::Path;

use super::OutputError;
use crate::analysis::{GateReport, Summary};

/// Writes `summary` to `path` as pretty-printed JSON with a final newline,
/// whole or not at all.
pub fn write_summary(path: &Path, summary: &Summary) -> Result<(), OutputError> {
    super::write_atomically(path, |out| {
        serde_json::to_writer_pretty(&mut *out, summary)?;
        out.write_all(b"\n")
    })
}

/// The gate's report as pretty-printed JSON with a final newline.
pub fn comparison_json(report: &GateReport) -> Result<String, serde_json::Error> {
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    Ok(text)
}

/// Writes the gate's report to `path` as [`comparison_json`], whole or not
/// at all.
pub fn write_comparison(path: &Path, report: &GateReport) -> Result<(), OutputError> {
    super::write_atomically(path, |out| {
        serde_json::to_writer_pretty(&mut *out, report)?;
        out.write_all(b"\n")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::testing::summary;

    #[test]
    fn summary_parses_back_with_its_schema() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("summary.json");
        write_summary(&path, &summary()).expect("written");
        let text = std::fs::read_to_string(&path).expect("readable");
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["schema"], "tailmesh.summary/v1");
        assert_eq!(v["run_id"], "run-1");
        assert_eq!(v["started_at"], "1970-01-01T00:00:00Z");
        assert_eq!(v["scenario"]["seed"], 7);
        assert_eq!(v["scenario"]["source"], "name = \"chain3\"\n");
        assert_eq!(
            v["scenario"]["variants"][0]["overrides"][0]["key"],
            "hop.*.transport"
        );
        assert_eq!(v["environment"]["launcher"], "local");
        let variant = &v["variants"][0];
        assert_eq!(variant["sent"], 1010);
        assert_eq!(variant["errors"]["unavailable"], 3);
        assert_eq!(variant["accounted"], true);
        assert_eq!(variant["latency"]["p50_us"], 1000);
        assert_eq!(
            variant["hops"][1]["replica_requests"],
            serde_json::json!([500, 500])
        );
        assert_eq!(variant["compounding"]["verdict"], "pass");
        assert!(variant.get("latency_histogram").is_none());
        assert_eq!(v["check"]["verdict"], "pass");
        assert_eq!(v["files"]["requests"], "requests.csv");
        assert!(text.ends_with("}\n"));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bad = dir.path().join("gone").join("summary.json");
        let err = write_summary(&bad, &summary()).expect_err("no such folder");
        assert!(err.to_string().contains("gone/summary.json"), "{err}");
    }

    #[test]
    fn the_gate_report_parses_back_with_its_schema() {
        use crate::analysis::{GateRule, gate};
        let s = summary();
        let rule = GateRule {
            min_ok: 1,
            ..GateRule::default()
        };
        let report = gate(&s, "runs/a", &s, "runs/b", &rule);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gate.json");
        write_comparison(&path, &report).expect("written");
        let text = std::fs::read_to_string(&path).expect("readable");
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["schema"], "tailmesh.compare/v1");
        assert_eq!(v["verdict"], "pass");
        assert_eq!(v["a"]["run"], "runs/a");
        assert_eq!(v["b"]["scenario"], "chain3");
        assert_eq!(v["rule"]["tolerance"], rule.tolerance);
        let variant = &v["variants"][0];
        assert_eq!(variant["name"], "base");
        assert_eq!(variant["a"]["failed"], 10);
        assert_eq!(variant["metrics"]["p99"]["regressed"], false);
        assert_eq!(variant["metrics"]["p99"]["unit"], "us");
        assert_eq!(variant["metrics"]["error_share"]["unit"], "share");
        let back: GateReport = serde_json::from_str(&text).expect("a GateReport");
        assert_eq!(back, report);
    }
}
