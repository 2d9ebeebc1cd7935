//! Why requests were slow, as the terminal and report.html show it: slow
//! requests per primary cause, the verdict's decomposition, and the p99 and
//! p99.9 split by cause (see `analysis::attribution`).

use std::fmt::Write;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};

use super::svg::{self, StackedBars, escape};
use crate::analysis::VariantReport;
use crate::analysis::attribution::{AttributionReport, CauseKind, describe_label};

/// Labels shown in a row before the rest are summed up.
const TOP: usize = 3;

fn slow_variants(
    variants: &[VariantReport],
) -> impl Iterator<Item = (&VariantReport, &AttributionReport)> {
    variants
        .iter()
        .filter_map(|v| v.attribution.as_ref().map(|a| (v, a)))
        .filter(|(_, a)| a.slow > 0)
}

/// `queue:b 412 (61 %), injected:a 200 (30 %), +2 more`: the largest
/// entries of `counts` with their share of `total`.
fn top_labels<'a>(counts: impl Iterator<Item = (&'a String, &'a u64)>, total: u64) -> String {
    let mut sorted: Vec<(&String, &u64)> = counts.collect();
    sorted.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut parts: Vec<String> = sorted
        .iter()
        .take(TOP)
        .map(|(label, n)| {
            format!(
                "{label} {n} ({:.0} %)",
                **n as f64 * 100.0 / total.max(1) as f64
            )
        })
        .collect();
    if sorted.len() > TOP {
        parts.push(format!("+{} more", sorted.len() - TOP));
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(", ")
    }
}

/// The terminal's short table of slow requests by primary cause kind, and
/// the excess (slow without injected slowness) by cause; `None` when no
/// variant had a slow request.
pub fn causes_table(variants: &[VariantReport]) -> Option<Table> {
    let mut rows = slow_variants(variants).peekable();
    rows.peek()?;
    let mut t = Table::new();
    let mut header = vec!["variant".to_string(), "slow".to_string()];
    header.extend(CauseKind::ALL.iter().map(|k| k.as_str().to_string()));
    header.push("not injected: top causes".to_string());
    t.load_preset(UTF8_FULL_CONDENSED).set_header(header);
    for (i, column) in t.column_iter_mut().enumerate() {
        if i > 0 && i < 8 {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    for (v, a) in rows {
        let mut row = vec![v.name.clone(), a.slow.to_string()];
        row.extend(CauseKind::ALL.iter().map(|k| {
            a.primary_kind
                .get(k.as_str())
                .map_or("-".to_string(), u64::to_string)
        }));
        let excess: u64 = a.excess.values().sum();
        row.push(top_labels(a.excess.iter(), excess));
        t.add_row(row);
    }
    Some(t)
}

/// The legend lines for the causes table.
pub fn causes_legend() -> &'static str {
    "  causes: slow requests by primary cause (the largest part of the latency, if at least a \
     quarter of the slow threshold): injected slowness, queue wait, network (caller's call time \
     minus the callee's), a hop's own work, the load generator's lateness, unexplained; \
     'not injected' = slow requests the model does not predict"
}

fn us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} us")
    }
}

fn kinds() -> Vec<String> {
    CauseKind::ALL
        .iter()
        .map(|k| k.as_str().to_string())
        .collect()
}

/// report.html's section: a stacked bar per variant of its slow requests
/// by primary cause, the p99 and p99.9 split by cause, and the verdict's
/// decomposition. Empty when no variant had a slow request.
pub fn causes_section(variants: &[VariantReport]) -> String {
    let slow: Vec<(&VariantReport, &AttributionReport)> = slow_variants(variants).collect();
    if slow.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Why requests were slow</h2><p class=\"note\">Each request over the slow threshold \
         has a primary cause: the largest part of its latency along its critical path, when that \
         part is at least a quarter of the threshold (otherwise: unexplained).</p>",
    );
    let by_cause = StackedBars {
        id: "causes",
        title: "Slow requests by primary cause",
        x_label: "slow requests",
        x_format: |v| format!("{v:.0}"),
        segments: kinds(),
        bars: slow
            .iter()
            .map(|(v, a)| {
                let counts = CauseKind::ALL
                    .iter()
                    .map(|k| a.primary_kind.get(k.as_str()).copied().unwrap_or(0) as f64)
                    .collect();
                (v.name.clone(), counts)
            })
            .collect(),
    };
    out.push_str(&svg::stacked_bars(&by_cause));
    let split = StackedBars {
        id: "tail-split",
        title: "p99 and p99.9 split by cause",
        x_label: "latency",
        x_format: us,
        segments: kinds(),
        bars: slow
            .iter()
            .flat_map(|(v, a)| {
                a.split.iter().map(move |s| {
                    let parts = CauseKind::ALL
                        .iter()
                        .map(|k| s.by_kind_us.get(k.as_str()).copied().unwrap_or(0.0))
                        .collect();
                    (format!("{} {}", v.name, s.percentile), parts)
                })
            })
            .collect(),
    };
    out.push_str(&svg::stacked_bars(&split));
    out.push_str(
        "<table id=\"causes-table\"><tr><th>variant</th><th>slow</th><th>with injected slowness</th>\
         <th>injected but not slow</th><th>not injected: by cause</th><th>verdict</th></tr>",
    );
    for (v, a) in &slow {
        let excess: u64 = a.excess.values().sum();
        let mut sorted: Vec<(&String, &u64)> = a.excess.iter().collect();
        sorted.sort_by(|x, y| y.1.cmp(x.1));
        let causes: Vec<String> = sorted
            .iter()
            .map(|(label, n)| format!("{} {n}", escape(&describe_label(label))))
            .collect();
        let verdict = v.compounding.as_ref().map_or("-".to_string(), |c| {
            let mut s = c.verdict.as_str().to_string();
            if let Some(reason) = &c.reason {
                let _ = write!(s, ": {}", escape(reason));
            }
            s
        });
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} {}</td><td>{verdict}</td></tr>",
            escape(&v.name),
            a.slow,
            a.slow_injected,
            a.injected_fast,
            excess,
            if causes.is_empty() {
                String::new()
            } else {
                format!("({})", causes.join("; "))
            }
        );
    }
    out.push_str("</table>");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::analysis::attribution::PercentileSplit;
    use crate::analysis::testing::analyze_variant;
    use crate::analysis::testing::{chain3, check, ok_records};

    fn report() -> VariantReport {
        analyze_variant(
            &chain3(),
            &check(),
            &ok_records(),
            std::time::Duration::from_secs(2),
        )
    }

    #[test]
    fn the_table_counts_slow_requests_by_primary_cause() {
        let mut v = report();
        let t = causes_table(std::slice::from_ref(&v))
            .expect("271 slow requests")
            .to_string();
        assert!(t.contains("271"), "{t}");
        assert!(t.contains("injected"), "{t}");
        v.attribution = Some(AttributionReport::default());
        assert!(causes_table(&[v]).is_none());
    }

    #[test]
    fn top_labels_are_the_largest_with_their_share() {
        let counts: BTreeMap<String, u64> = [
            ("queue:b", 6),
            ("generator", 3),
            ("work:a", 1),
            ("network:a->b", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            top_labels(counts.iter(), 11),
            "queue:b 6 (55 %), generator 3 (27 %), network:a->b 1 (9 %), +1 more"
        );
        assert_eq!(top_labels(BTreeMap::new().iter(), 0), "-");
    }

    #[test]
    fn the_section_has_both_charts_and_the_decomposition() {
        let mut v = report();
        if let Some(a) = v.attribution.as_mut() {
            a.split.push(PercentileSplit {
                percentile: "p99.9".into(),
                latency_us: 21_000,
                requests: 3,
                by_kind_us: [("injected".to_string(), 20_000.0)].into_iter().collect(),
            });
        }
        let html = causes_section(&[v]);
        for needle in [
            "id=\"causes\"",
            "id=\"tail-split\"",
            "id=\"causes-table\"",
            "base p99.9",
        ] {
            assert!(html.contains(needle), "{needle} in {html}");
        }
        let mut quiet = report();
        quiet.attribution = None;
        assert_eq!(causes_section(&[quiet]), "");
    }
}
