//! A sweep's sections: one row per swept value, the variants side by
//! side, and for a swept load rate the hockey stick of latency against
//! the offered load.

use std::fmt::Write;

use hdrhistogram::Histogram;
use tailmesh_units::{micros, percent};

use crate::analysis::{SweepSummary, VariantReport, sweep::SweepRow};
use crate::output::svg::{self, Frame, LineChart, Panel, Scale, Series, SmallMultiples, escape};

use super::distribution::{log_buckets, spectrum_points};
use super::{GOODPUT, HISTOGRAM, SPECTRUM_LOG_Y, percent_tick, plain};

/// The sweep's charts and table: the compounding curve (measured slow
/// fraction with 95 % intervals against the declared model) and p99 against
/// the swept value, one series per declared variant.
pub(super) fn sweep_section(sweep: &SweepSummary) -> String {
    let groups = sweep.groups();
    // Numeric values are plotted as numbers; others by their position.
    let x_of = |value: &str| {
        value.parse::<f64>().ok().unwrap_or_else(|| {
            sweep
                .values
                .iter()
                .position(|v| v == value)
                .map_or(0.0, |i| i as f64 + 1.0)
        })
    };
    let mut out = format!("<h2>Sweep: {}</h2>", escape(&sweep.key));
    let checked = sweep.rows.iter().any(|r| r.compounding.is_some());
    if checked {
        let mut series = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            let rows: Vec<_> = sweep
                .rows
                .iter()
                .filter(|r| r.group == *g)
                .filter_map(|r| Some((x_of(&r.value), r.compounding.as_ref()?)))
                .collect();
            series.push(Series {
                name: format!("{g} measured"),
                points: rows.iter().map(|(x, c)| (*x, c.measured * 100.0)).collect(),
                dashed: false,
                colour: i,
                intervals: rows
                    .iter()
                    .map(|(x, c)| (*x, c.ci_lo * 100.0, c.ci_hi * 100.0))
                    .collect(),
            });
            series.push(Series {
                name: format!("{g} model"),
                points: rows
                    .iter()
                    .map(|(x, c)| (*x, c.declared_model * 100.0))
                    .collect(),
                dashed: true,
                colour: i,
                intervals: Vec::new(),
            });
        }
        out.push_str("<p class=\"note\">Share of requests slower than the threshold, with 95 % Wilson intervals, against the model 1 - prod(1 - p_i) of the declared per-hop probabilities (dashed).</p>");
        out.push_str(&svg::line_chart(&LineChart {
            id: "compounding-curve",
            title: "Tail compounding",
            frame: Frame {
                x_label: &sweep.key,
                y_label: "slow requests (%)",
                x_scale: Scale::Linear,
                y_scale: Scale::Linear,
                x_format: plain,
                y_format: percent_tick,
            },
            x_range: None,
            bands: Vec::new(),
            series,
        }));
    }
    let percentile =
        |i: usize, g: &str, name: &str, dashed: bool, us: fn(&SweepRow) -> u64| Series {
            name: format!("{g} {name}"),
            points: sweep
                .rows
                .iter()
                .filter(|r| r.group == g)
                .map(|r| (x_of(&r.value), us(r) as f64))
                .collect(),
            dashed,
            colour: i,
            intervals: Vec::new(),
        };
    let series = groups
        .iter()
        .enumerate()
        .flat_map(|(i, g)| {
            [
                percentile(i, g, "p99", false, |r| r.p99_us),
                percentile(i, g, "p50", true, |r| r.p50_us),
            ]
        })
        .collect();
    out.push_str(&svg::line_chart(&LineChart {
        id: "sweep-p99",
        title: "p99 and p50 (dashed) across the sweep",
        frame: Frame {
            x_label: &sweep.key,
            y_label: "latency",
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_format: plain,
            y_format: micros,
        },
        x_range: None,
        bands: Vec::new(),
        series,
    }));
    out.push_str("<table id=\"sweep\"><tr><th>variant</th><th>value</th><th>sent</th><th>p50</th><th>p99</th><th>p99.9</th>");
    if checked {
        out.push_str("<th>slow measured</th><th>95 % interval</th><th>model</th><th>declared</th><th>verdict</th>");
    }
    out.push_str("</tr>");
    for r in &sweep.rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            escape(&r.group),
            escape(&r.value),
            r.sent,
            micros(r.p50_us as f64),
            micros(r.p99_us as f64),
            micros(r.p99_9_us as f64)
        );
        match &r.compounding {
            Some(c) => {
                let verdict = c.verdict.as_str();
                let _ = write!(
                    out,
                    "<td>{}</td><td>[{}, {}]</td><td>{}</td><td>{}</td><td class=\"{verdict}\">{verdict}</td></tr>",
                    percent(c.measured),
                    percent(c.ci_lo),
                    percent(c.ci_hi),
                    percent(c.model),
                    percent(c.declared_model)
                );
            }
            None if checked => {
                out.push_str("<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td></tr>");
            }
            None => out.push_str("</tr>"),
        }
    }
    out.push_str("</table>");
    out
}

/// The declared variants side by side at each swept value, when there are
/// two or more: small multiples, one panel per value overlaying the
/// variants' latency histograms, then their percentile spectra, on axes
/// shared by the panels (a variant keeps its colour in every panel), and a
/// table of p50 / p99 with a row per value and a column per variant.
pub(super) fn side_by_side_section(sweep: &SweepSummary, variants: &[VariantReport]) -> String {
    let groups = sweep.groups();
    if groups.len() < 2 {
        return String::new();
    }
    // One panel per value, one series per variant run at it, its points
    // drawn from the variant's histogram by `points`.
    let panels = |points: fn(&Histogram<u64>) -> Vec<(f64, f64)>| -> Vec<Panel> {
        sweep
            .values
            .iter()
            .map(|value| Panel {
                title: format!("{} = {value}", sweep.key),
                series: groups
                    .iter()
                    .enumerate()
                    .filter_map(|(i, g)| {
                        let r = sweep.row(g, value)?;
                        let v = variants.iter().find(|v| v.name == r.variant)?;
                        Some(Series {
                            name: (*g).to_owned(),
                            points: points(&v.latency_histogram),
                            dashed: false,
                            colour: i,
                            intervals: Vec::new(),
                        })
                    })
                    .collect(),
            })
            .collect()
    };
    let key = escape(&sweep.key);
    let mut out = format!(
        "<h2>Side by side at each {key}</h2><p class=\"note\">Each panel is one value of \
         {key}, with every variant run at it (ok requests): first their latency histograms \
         (share per bucket, ten buckets per decade), then their percentile spectra (the tail \
         to the right, latency on a log scale). Within each chart all panels share their axes, so a curve further \
         right (histograms) or higher (spectra) is slower in any panel.</p>"
    );
    out.push_str(&svg::small_multiples(&SmallMultiples {
        id: "sweep-distributions",
        title: "Latency histograms side by side",
        frame: HISTOGRAM,
        columns: 2,
        panels: panels(log_buckets),
    }));
    out.push_str(&svg::small_multiples(&SmallMultiples {
        id: "sweep-spectra",
        title: "Percentile spectra side by side",
        frame: SPECTRUM_LOG_Y,
        columns: 2,
        panels: panels(spectrum_points),
    }));
    out.push_str("<table id=\"sweep-side-by-side\"><tr>");
    let _ = write!(out, "<th>{key}</th>");
    for g in &groups {
        let _ = write!(out, "<th>{} p50 / p99</th>", escape(g));
    }
    out.push_str("</tr>");
    for value in &sweep.values {
        let _ = write!(out, "<tr><td>{}</td>", escape(value));
        for g in &groups {
            match sweep.row(g, value) {
                Some(r) if r.ok > 0 => {
                    let _ = write!(
                        out,
                        "<td>{} / {}</td>",
                        micros(r.p50_us as f64),
                        micros(r.p99_us as f64)
                    );
                }
                _ => out.push_str("<td>-</td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// The sweep key that makes a sweep an offered-load sweep.
pub(super) const LOAD_RATE: &str = "load.rate";

/// An offered-load sweep's hockey stick: goodput (ok answers per second)
/// against the offered load, with the offered load itself dashed (where
/// goodput leaves it, the system saturated), and the share of requests that
/// failed; p99 of the answered requests is the sweep's p99 chart. One
/// series per declared variant.
pub(super) fn hockey_stick_section(sweep: &SweepSummary) -> String {
    let groups = sweep.groups();
    let points = |g: &str, y: fn(&SweepRow) -> f64| -> Vec<(f64, f64)> {
        sweep
            .rows
            .iter()
            .filter(|r| r.group == g)
            .filter_map(|r| Some((r.value.parse::<f64>().ok()?, y(r))))
            .collect()
    };
    let offered: Vec<(f64, f64)> = sweep
        .values
        .iter()
        .filter_map(|v| v.parse::<f64>().ok())
        .map(|x| (x, x))
        .collect();
    let series = |y: fn(&SweepRow) -> f64| -> Vec<Series> {
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| Series {
                name: (*g).to_owned(),
                points: points(g, y),
                dashed: false,
                colour: i,
                intervals: Vec::new(),
            })
            .collect()
    };
    let mut goodput = series(|r| r.ok_rate);
    goodput.push(Series {
        name: "offered".to_owned(),
        points: offered,
        dashed: true,
        colour: groups.len(),
        intervals: Vec::new(),
    });
    let mut out = String::from(
        "<h2>Overload: goodput against offered load</h2><p class=\"note\">Requests answered ok per second against the requests offered per second (dashed: goodput equal to the offered load). Past saturation goodput should stay flat at capacity; where it falls, the system spends its capacity on requests nobody waits for any more. The p99 of the answered requests is the sweep's p99 chart above.</p>",
    );
    out.push_str(&svg::line_chart(&LineChart {
        id: "hockey-goodput",
        title: "Goodput",
        frame: GOODPUT,
        x_range: None,
        bands: Vec::new(),
        series: goodput,
    }));
    out.push_str(&svg::line_chart(&LineChart {
        id: "hockey-errors",
        title: "Errors and timeouts",
        frame: Frame {
            x_label: "offered load (requests/s)",
            y_label: "failed requests (%)",
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_format: plain,
            y_format: percent_tick,
        },
        x_range: None,
        bands: Vec::new(),
        series: series(|r| r.error_share * 100.0),
    }));
    out.push_str("<table id=\"hockey\"><tr><th>variant</th><th>offered/s</th><th>sent</th><th>goodput/s</th><th>p50</th><th>p99</th><th>failed</th></tr>");
    for r in &sweep.rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.group),
            escape(&r.value),
            r.sent,
            r.ok_rate,
            micros(r.p50_us as f64),
            micros(r.p99_us as f64),
            percent(r.error_share)
        );
    }
    out.push_str("</table>");
    out
}
