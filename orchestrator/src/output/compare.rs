//! `tailmesh compare <run-a> <run-b>`: two runs side by side, and for each
//! variant they share, run b's numbers as multiples of run a's; with
//! `--gate`, the gate's decision for people (its JSON is
//! [`GateReport`]'s serde form).

use comfy_table::{CellAlignment, Table, presets::UTF8_FULL_CONDENSED};

use tailmesh_units::{micros, percent, signed_percent};

use crate::analysis::{GateReport, GateVerdict, MetricGate, Summary, VariantReport};

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
                micros(l.p50_us as f64),
                micros(l.p99_us as f64),
                micros(l.p99_9_us as f64),
                micros(l.max_us as f64),
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

/// The gate's decision for people: the rule, a line per metric of every
/// variant compared (what it was, what it became, the change with its
/// interval, and what the rule makes of it), the reasons and notes, and
/// last `gate: pass`, `gate: regressed` or `gate: inconclusive`.
pub fn render_gate(report: &GateReport) -> String {
    let rule = &report.rule;
    let confidence = percent(rule.confidence);
    let mut out = format!(
        "gate: run B {} against run A {}: a metric regressed when B is worse by more than \
         {} (p50, p99) or {} (error share) and the {confidence} interval \
         ({} bootstrap replicates) excludes no change\n",
        report.b.run,
        report.a.run,
        percent(rule.tolerance),
        points(rule.error_tolerance),
        rule.replicates,
    );
    for v in &report.variants {
        for (name, m) in v.metrics.named() {
            out.push_str(&format!(
                "{}: {}\n",
                v.name,
                metric_line(name, m, rule, &confidence)
            ));
        }
    }
    for reason in &report.reasons {
        out.push_str(&format!("inconclusive: {reason}\n"));
    }
    for note in &report.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    let regressed: Vec<String> = regressed_metrics(report);
    match report.verdict {
        GateVerdict::Regressed => {
            out.push_str(&format!("gate: regressed ({})\n", regressed.join(", ")));
        }
        verdict => out.push_str(&format!("gate: {}\n", verdict.as_str())),
    }
    out
}

/// `variant metric` for every metric that regressed, in report order.
pub fn regressed_metrics(report: &GateReport) -> Vec<String> {
    report
        .variants
        .iter()
        .flat_map(|v| {
            v.metrics
                .named()
                .filter(|(_, m)| m.regressed)
                .map(|(name, _)| format!("{} {}", v.name, label(name)))
        })
        .collect()
}

fn label(metric: &str) -> &str {
    if metric == "error_share" {
        "error share"
    } else {
        metric
    }
}

/// `p99 12.1 ms -> 15.9 ms (+31.0 %, 95.0 % interval +22.0 % to +41.0 %): regressed`
/// (the error share in % and its change in points).
fn metric_line(
    name: &str,
    m: &MetricGate,
    rule: &crate::analysis::GateRule,
    confidence: &str,
) -> String {
    let latency = m.unit == "us";
    let (tolerance, values, change, interval) = if latency {
        (
            percent(rule.tolerance),
            format!("{} -> {}", micros(m.a), micros(m.b)),
            signed_percent(m.change),
            format!(
                "{} to {}",
                signed_percent(m.interval[0]),
                signed_percent(m.interval[1])
            ),
        )
    } else {
        (
            points(rule.error_tolerance),
            format!("{} -> {}", percent(m.a), percent(m.b)),
            signed_points(m.change),
            format!(
                "{} to {}",
                signed_points(m.interval[0]),
                signed_points(m.interval[1])
            ),
        )
    };
    let excludes_no_change = m.interval[0] > 0.0 || m.interval[1] < 0.0;
    let tolerance_value = if latency {
        rule.tolerance
    } else {
        rule.error_tolerance
    };
    let judgement = if m.regressed {
        format!("regressed, beyond the {tolerance} tolerance")
    } else if m.improved {
        format!("improved, beyond the {tolerance} tolerance")
    } else if m.beyond(tolerance_value) && !excludes_no_change {
        format!("beyond the {tolerance} tolerance, but the interval includes no change")
    } else {
        format!("within the {tolerance} tolerance")
    };
    format!(
        "{} {values} ({change}, {confidence} interval {interval}): {judgement}",
        label(name)
    )
}

/// A difference of two shares in percentage points, written as
/// [`percent`] writes a share: `0.50 points`.
fn points(x: f64) -> String {
    percent(x).replace('%', "points")
}

/// [`points`] with its sign, for a change: `+0.50 points`, `-1.20 points`.
fn signed_points(x: f64) -> String {
    signed_percent(x).replace('%', "points")
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

    #[test]
    fn the_gate_says_what_regressed_by_how_much_and_its_verdict_last() {
        use crate::analysis::{GateRule, gate};
        let a = summary();
        let mut b = summary();
        let slower: Vec<u64> = a.variants[0]
            .latency_histogram
            .iter_recorded()
            .flat_map(|s| {
                std::iter::repeat_n(s.value_iterated_to() * 3, s.count_at_value() as usize)
            })
            .collect();
        let mut h = crate::analysis::stats::new_histogram();
        for v in slower {
            crate::analysis::stats::record_us(&mut h, v);
        }
        b.variants[0].latency_histogram = h;
        let rule = GateRule {
            min_ok: 1,
            ..GateRule::default()
        };
        let text = render_gate(&gate(&a, "runs/a", &b, "runs/b", &rule));
        assert!(
            text.starts_with("gate: run B runs/b against run A runs/a: "),
            "{text}"
        );
        let tolerance = percent(rule.tolerance);
        assert!(
            text.contains(&format!(
                "worse by more than {tolerance} (p50, p99) or 0.5 points (error share)"
            )),
            "{text}"
        );
        let p99 = text
            .lines()
            .find(|l| l.starts_with("base: p99 "))
            .expect("a p99 line");
        assert!(
            p99.contains("(+200")
                && p99.contains(" %, 95.0 % interval +")
                && p99.ends_with(&format!("regressed, beyond the {tolerance} tolerance")),
            "{p99}"
        );
        assert!(
            text.contains("base: error share 0.99 % -> 0.99 % (+0 points, 95.0 % interval -"),
            "{text}"
        );
        assert!(text.contains("within the 0.5 points tolerance"), "{text}");
        assert_eq!(
            text.lines().last(),
            Some("gate: regressed (base p50, base p99)"),
            "{text}"
        );
        let same = render_gate(&gate(&a, "runs/a", &a, "runs/a", &rule));
        assert_eq!(same.lines().last(), Some("gate: pass"), "{same}");
        assert!(!same.contains("regressed,"), "{same}");
    }

    #[test]
    fn percentage_points_read_like_percentages() {
        assert_eq!(points(0.005), "0.5 points");
        assert_eq!(points(0.00123), "0.12 points");
        assert_eq!(points(0.2), "20.0 points");
        assert_eq!(signed_points(0.0), "+0 points");
        assert_eq!(signed_points(-0.045), "-4.50 points");
    }
}
