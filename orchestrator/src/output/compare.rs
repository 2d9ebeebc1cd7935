//! `tailmesh compare <run-a> <run-b>`: two runs side by side, and for each
//! variant they share, run b's numbers as multiples of run a's.

use comfy_table::{CellAlignment, Table, presets::UTF8_FULL_CONDENSED};

use super::table::format_us;
use crate::analysis::{Summary, VariantReport};

/// Renders the comparison of run `a` (labelled `a_label`) with run `b`.
pub fn render_comparison(a: &Summary, a_label: &str, b: &Summary, b_label: &str) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "run", "scenario", "variant", "sent", "ok", "errors", "timeouts", "ok/s", "p50", "p99",
        "p99.9", "max",
    ]);
    for (label, s) in [(a_label, a), (b_label, b)] {
        for v in &s.variants {
            let l = &v.latency;
            t.add_row(vec![
                label.to_string(),
                s.scenario.name.clone(),
                v.name.clone(),
                v.sent.to_string(),
                v.ok.to_string(),
                v.errors.values().sum::<u64>().to_string(),
                v.timeouts.to_string(),
                format!("{:.1}", v.ok_rate),
                format_us(l.p50_us),
                format_us(l.p99_us),
                format_us(l.p99_9_us),
                format_us(l.max_us),
            ]);
        }
    }
    for (i, column) in t.column_iter_mut().enumerate() {
        if i > 2 {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = format!("{t}\n");
    let mut shared = 0;
    for vb in &b.variants {
        if let Some(va) = a.variants.iter().find(|va| va.name == vb.name) {
            shared += 1;
            out.push_str(&ratio_line(va, vb, a_label, b_label));
        }
    }
    if shared == 0 {
        out.push_str("no variant name is in both runs: nothing to put side by side\n");
    }
    out
}

fn ratio_line(a: &VariantReport, b: &VariantReport, a_label: &str, b_label: &str) -> String {
    let ratio = |x: f64, y: f64| {
        if y > 0.0 {
            format!("x{:.2}", x / y)
        } else {
            "-".to_string()
        }
    };
    let (lb, la) = (&b.latency, &a.latency);
    format!(
        "{}: {b_label} vs {a_label}: p50 {}, p99 {}, p99.9 {}, ok/s {}\n",
        b.name,
        ratio(lb.p50_us as f64, la.p50_us as f64),
        ratio(lb.p99_us as f64, la.p99_us as f64),
        ratio(lb.p99_9_us as f64, la.p99_9_us as f64),
        ratio(b.ok_rate, a.ok_rate),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::testing::summary;

    #[test]
    fn shared_variants_get_ratios() {
        let a = summary();
        let mut b = summary();
        b.variants[0].latency.p99_us = a.variants[0].latency.p99_us * 3;
        let text = render_comparison(&a, "old", &b, "new");
        assert!(
            text.contains("base: new vs old: p50 x1.00, p99 x3.00"),
            "{text}"
        );
        assert_eq!(text.matches("chain3").count(), 2, "{text}");
        b.variants[0].name = "other".into();
        assert!(render_comparison(&a, "old", &b, "new").contains("nothing to put side by side"));
    }
}
