//! Results per phase of the schedule (fault windows, load steps): the
//! phase table with its recovery and compounding, and for load steps
//! latency and goodput against the offered load.

use std::fmt::Write;

use tailmesh_units::{micros, percent};

use crate::analysis::VariantReport;
use crate::output::{
    phases,
    svg::{self, Band, BandKind, Frame, LineChart, Scale, Series, escape},
};

use super::{GOODPUT, plain};

/// Per variant with phases: a table of them and, for load steps, latency
/// and goodput against the offered load with the knee marked.
pub(super) fn phases_section(variants: &[VariantReport]) -> String {
    let phased: Vec<&VariantReport> = variants.iter().filter(|v| !v.phases.is_empty()).collect();
    if phased.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Phases</h2><p class=\"note\">Each run cut at every fault window's start and end and at every load step, in seconds from the end of warmup; a request counts in the phase of its intended send time. Recovery: from a window's end to the first rolling stretch of ok requests whose p99 is back near the p99 of the last phase without a fault (the rule in each cell's tooltip). Compounding: the check on the phase's requests alone, measured against the model of the slowness then in force.</p>",
    );
    for v in phased {
        let _ = write!(out, "<h3>{}</h3>", escape(&v.name));
        out.push_str(&phase_table(v));
        if let Some(k) = &v.knee {
            let _ = write!(
                out,
                "<p id=\"knee-{}\">{}</p>",
                escape(&v.name),
                escape(&phases::knee_line(k))
            );
        }
        if phases::stepped(v) {
            let ids = (
                format!("steps-latency-{}", v.name),
                format!("steps-goodput-{}", v.name),
            );
            let (latency, goodput) = step_charts(v, &ids.0, &ids.1);
            out.push_str(&svg::line_chart(&latency));
            out.push_str(&svg::line_chart(&goodput));
        }
    }
    out
}

/// `v`'s phases, a row each; a compounding column when the scenario asks
/// for the check.
fn phase_table(v: &VariantReport) -> String {
    let checked = v.compounding.is_some();
    let mut out = format!("<table id=\"phases-{}\"><tr>", escape(&v.name));
    for column in phases::COLUMNS {
        let _ = write!(out, "<th>{}</th>", escape(column));
    }
    if checked {
        out.push_str("<th>compounding</th>");
    }
    out.push_str("</tr>");
    for p in &v.phases {
        out.push_str("<tr>");
        let cells = phases::cells(p);
        let (recovery, rest) = cells.split_last().expect("the table has columns");
        for cell in rest {
            let _ = write!(out, "<td>{}</td>", escape(cell));
        }
        match &p.recovery {
            Some(r) => {
                let _ = write!(
                    out,
                    "<td title=\"{}\">{}</td>",
                    escape(&phases::recovery_rule(r)),
                    escape(recovery)
                );
            }
            None => out.push_str("<td>-</td>"),
        }
        if checked {
            out.push_str(&phase_compounding(p));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// A phase's compounding check in one cell: `27.5 % vs 27.1 %: pass`,
/// the verdict's reason as its tooltip.
fn phase_compounding(p: &crate::analysis::PhaseReport) -> String {
    let Some(c) = &p.compounding else {
        return "<td>-</td>".to_owned();
    };
    let verdict = c.verdict.as_str();
    let title = c
        .reason
        .as_ref()
        .map_or_else(String::new, |r| format!(" title=\"{}\"", escape(r)));
    let measured = if c.n == 0 {
        "-".to_owned()
    } else {
        percent(c.measured)
    };
    format!(
        "<td{title}>{measured} vs {}: <span class=\"{verdict}\">{verdict}</span></td>",
        percent(c.model)
    )
}

/// A stepped variant's latency (p50, p99, p99.9) and goodput against the
/// offered rate, a point per step phase in time order (a step a window
/// cuts has a point per part), the knee marked.
pub(super) fn step_charts<'a>(
    v: &VariantReport,
    latency_id: &'a str,
    goodput_id: &'a str,
) -> (LineChart<'a>, LineChart<'a>) {
    let steps: Vec<&crate::analysis::PhaseReport> = v
        .phases
        .iter()
        .filter(|p| p.offered_rate.is_some())
        .collect();
    let points = |y: fn(&crate::analysis::PhaseReport) -> Option<f64>| -> Vec<(f64, f64)> {
        steps
            .iter()
            .filter_map(|p| Some((p.offered_rate?, y(p)?)))
            .collect()
    };
    type Quantile = fn(&crate::analysis::PhaseReport) -> Option<f64>;
    let quantiles: [(&str, Quantile); 3] = [
        ("p50", |p| (p.ok > 0).then_some(p.latency.p50_us as f64)),
        ("p99", |p| (p.ok > 0).then_some(p.latency.p99_us as f64)),
        ("p99.9", |p| (p.ok > 0).then_some(p.latency.p99_9_us as f64)),
    ];
    let line = |name: &str, points, dashed, colour| Series {
        name: name.to_owned(),
        points,
        dashed,
        colour,
        intervals: Vec::new(),
    };
    let knee: Vec<Band> = v
        .knee
        .iter()
        .map(|k| Band {
            from: k.rate,
            to: k.rate,
            label: format!("knee: {}", k.step),
            kind: BandKind::Mark,
        })
        .collect();
    let latency = LineChart {
        id: latency_id,
        title: "Latency against offered load",
        frame: Frame {
            x_label: "offered load (requests/s)",
            y_label: "latency",
            x_scale: Scale::Linear,
            y_scale: Scale::Log,
            x_format: plain,
            y_format: micros,
        },
        x_range: None,
        series: quantiles
            .iter()
            .enumerate()
            .map(|(i, (name, q))| line(name, points(*q), false, i))
            .collect(),
        bands: knee.clone(),
    };
    let goodput = LineChart {
        id: goodput_id,
        title: "Goodput against offered load",
        frame: GOODPUT,
        x_range: None,
        series: vec![
            line("goodput", points(|p| Some(p.ok_rate)), false, 0),
            line("offered", points(|p| p.offered_rate), true, 1),
        ],
        bands: knee,
    };
    (latency, goodput)
}
