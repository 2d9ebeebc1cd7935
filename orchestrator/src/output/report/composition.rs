//! The whole tail composed from each request's segments against the
//! measured one: quantiles with their intervals, the shuffled and declared
//! curves, and the dependence figure.

use std::fmt::Write;

use tailmesh_units::{micros, signed_percent};

use crate::analysis::{SpectrumPoint, VariantReport};
use crate::output::svg::{self, LineChart, Series, escape};

use super::SPECTRUM;

/// A spectrum point's value with its interval, µs.
type PointBand = (Option<f64>, Option<f64>, Option<f64>);

/// The whole tail, predicted against measured: per variant, the spectra
/// (measured, composed from the hops' segments, shuffled, declared) with
/// their 95 % intervals, a table at p50 to p99.9, the dependence and the
/// distribution verdict.
pub(super) fn composition_section(variants: &[VariantReport]) -> String {
    let rows: Vec<_> = variants
        .iter()
        .filter_map(|v| v.composition.as_ref().map(|c| (v, c)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>The whole tail, predicted and measured</h2><p class=\"note\">Measured: the requests' end-to-end latencies. Composed: each hop's measured segments (reach, queue, own time, rest; a policed call from all its attempts) composed along the call tree as if independent. Shuffled: requests rebuilt from segments of different requests. Declared: the scenario's distributions with the measured overheads. Bars: 95 % bootstrap intervals. Measured above composed is what the hops' dependence adds.</p>",
    );
    for (v, c) in rows {
        let id = format!("composition-{}", v.name);
        let x = |q: f64| 1.0 / (1.0 - q);
        let line =
            |name: &str, dashed: bool, colour: usize, get: &dyn Fn(&SpectrumPoint) -> PointBand| {
                Series {
                    name: name.to_string(),
                    points: c
                        .spectrum
                        .iter()
                        .filter_map(|p| Some((x(p.q), get(p).0?)))
                        .collect(),
                    dashed,
                    colour,
                    intervals: c
                        .spectrum
                        .iter()
                        .filter_map(|p| {
                            let (_, lo, hi) = get(p);
                            Some((x(p.q), lo?, hi?))
                        })
                        .collect(),
                }
            };
        let series = vec![
            line("measured", false, 0, &|p| {
                (p.measured_us, p.measured_low_us, p.measured_high_us)
            }),
            line("composed", true, 1, &|p| {
                (p.composed_us, p.composed_low_us, p.composed_high_us)
            }),
            line("shuffled", true, 2, &|p| (p.shuffled_us, None, None)),
            line("declared", true, 3, &|p| (p.declared_us, None, None)),
        ]
        .into_iter()
        .filter(|s| !s.points.is_empty())
        .collect();
        let title = format!("{}: predicted and measured percentile spectra", v.name);
        let _ = write!(out, "<h3>{}</h3>", escape(&v.name));
        out.push_str(&svg::line_chart(&LineChart {
            id: &id,
            title: &title,
            frame: SPECTRUM,
            x_range: None,
            bands: Vec::new(),
            series,
        }));
        let cell = |x: Option<f64>| x.map_or("-".to_string(), micros);
        let band = |b: &crate::analysis::QuantileBand, k: usize| match (b.low.get(k), b.high.get(k))
        {
            (Some(lo), Some(hi)) => format!(" [{}, {}]", micros(lo), micros(hi)),
            _ => String::new(),
        };
        let _ = write!(
            out,
            "<table id=\"{}\"><tr><th>quantile</th><th>measured [95 %]</th><th>composed [95 %]</th><th>shuffled</th><th>declared</th><th>measured over composed</th></tr>",
            escape(&id)
        );
        for (k, label) in ["p50", "p90", "p99", "p99.9"].iter().enumerate() {
            let share = c
                .dependence
                .excess_share
                .get(k)
                .map_or("-".to_string(), signed_percent);
            let _ = write!(
                out,
                "<tr><td>{label}</td><td>{}{}</td><td>{}{}</td><td>{}</td><td>{}</td><td>{share}</td></tr>",
                cell(c.measured.point.get(k)),
                band(&c.measured, k),
                cell(c.composed.point.get(k)),
                band(&c.composed, k),
                cell(c.shuffled.get(k)),
                cell(c.declared.as_ref().and_then(|d| d.get(k))),
            );
        }
        out.push_str("</table>");
        let mut notes = Vec::new();
        if let Some(check) = &c.check {
            let verdict = check.verdict.as_str();
            notes.push(format!(
                "distribution: <span class=\"{verdict}\">{verdict}</span> ({})",
                escape(&check.reason)
            ));
        }
        if let Some(source) = &c.dependence.source {
            notes.push(format!("dependence: {}", escape(source)));
        }
        if !c.dependence.correlations.is_empty() {
            let pairs: Vec<String> = c
                .dependence
                .correlations
                .iter()
                .map(|r| format!("{} ~ {} (r = {:.2})", escape(&r.a), escape(&r.b), r.r))
                .collect();
            notes.push(format!("correlated segments: {}", pairs.join(", ")));
        }
        if let Some(note) = &c.declared_note {
            notes.push(format!("declared: {}", escape(note)));
        }
        if c.censored > 0 {
            notes.push(format!("{} of {} requests failed or timed out: censored, past every latency in every distribution", c.censored, c.requests));
        }
        for n in notes {
            let _ = write!(out, "<p class=\"note\">{n}</p>");
        }
    }
    out
}
