//! `report.html`: one self-contained page per run (inline CSS and SVG, no
//! script, no network) with the latency histograms of all variants
//! overlaid, the percentile spectrum, the per-hop breakdown, errors and
//! timeouts, throughput over time, latency over time (fault windows and
//! load steps as bands), the phases of each run (a table, and for load
//! steps latency and goodput against the offered load), the compounding
//! check, the scenario and the environment.
//!
//! - here: the page in order ([`render_report`]), its style, the charts'
//!   shared frames and tick formats;
//! - `tables`, `distribution`, `composition`, `hops`, `throughput`,
//!   `over_time`, `schedule`, `sweep`: one section each (or a few tables);
//! - `tests`: the page section by section.

mod composition;
mod distribution;
mod hops;
mod over_time;
mod schedule;
mod sweep;
mod tables;
mod throughput;

use std::{fmt::Write, path::Path};

use tailmesh_units::{micros, percent};

use super::{
    OutputError,
    svg::{self, Frame, Scale, escape},
};
use crate::analysis::Summary;

use composition::composition_section;
use distribution::{histogram_chart, spectrum_chart};
use hops::{hop_bars, hop_table};
use over_time::{endpoint_table, latency_over_time_section};
use schedule::phases_section;
use sweep::{LOAD_RATE, hockey_stick_section, side_by_side_section, sweep_section};
use tables::{broker_table, compounding_table, error_table, latency_table, observer_section};
use throughput::throughput_section;

/// The report's style sheet, for every page of charts tailmesh writes.
pub const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f4f4f4}
.pass{color:#0a7d22;font-weight:bold}.fail{color:#b00020;font-weight:bold}.inconclusive{color:#8a6d00;font-weight:bold}
.note{color:#555;font-size:.9rem}pre{background:#f7f7f7;padding:.7rem;overflow:auto;font-size:.85rem}
svg.chart{display:block;margin:.5rem 0;max-width:100%;height:auto}
svg .title{font-size:14px;font-weight:bold}svg .tick,svg .legend{font-size:11px}svg .label{font-size:12px}
svg .grid{stroke:#eee}svg .axis{stroke:#555}";

/// Writes `report.html` for `summary`.
pub fn write_report(path: &Path, summary: &Summary) -> Result<(), OutputError> {
    let page = render_report(summary);
    super::write_atomically(path, |out| std::io::Write::write_all(out, page.as_bytes()))
}

/// The whole page.
pub fn render_report(summary: &Summary) -> String {
    let s = &summary.scenario;
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tailmesh: {name}</title><style>{STYLE}</style></head><body><h1>tailmesh: {name}</h1><p>{desc}</p><p class=\"note\">run {run} started {start}; seed {seed}; {n} variant(s){interrupted}</p>",
        name = escape(&s.name),
        desc = escape(&s.description),
        run = escape(&summary.run_id),
        start = escape(&summary.started_at),
        seed = s.seed,
        n = summary.variants.len(),
        interrupted = if summary.interrupted {
            "; <span class=\"fail\">interrupted</span>"
        } else {
            ""
        },
    );
    if summary.check.compounding_requested || !summary.check.distribution.is_empty() {
        let verdict = summary.check.verdict.as_str();
        let _ = write!(
            out,
            "<p>check: <span class=\"{verdict}\" id=\"verdict\">{verdict}</span></p>"
        );
    }
    out.push_str(&latency_table(&summary.variants));
    out.push_str(&tables::streams_section(&summary.variants));
    out.push_str(&compounding_table(&summary.variants));
    out.push_str(&super::causes::causes_section(&summary.variants));
    if let Some(sweep) = &summary.sweep {
        out.push_str(&sweep_section(sweep));
        out.push_str(&side_by_side_section(sweep, &summary.variants));
        if sweep.key == LOAD_RATE {
            out.push_str(&hockey_stick_section(sweep));
        }
    }
    out.push_str("<h2>Latency distribution</h2><p class=\"note\">End-to-end latency of ok requests, measured from the intended send time. Share of requests per bucket (ten buckets per decade).</p>");
    out.push_str(&svg::line_chart(&histogram_chart(&summary.variants)));
    out.push_str("<h2>Percentile spectrum</h2><p class=\"note\">Latency against percentile, on HdrHistogram's 1/(1-q) axis: the right edge is the tail.</p>");
    out.push_str(&svg::line_chart(&spectrum_chart(&summary.variants)));
    out.push_str(&composition_section(&summary.variants));
    out.push_str("<h2>Where the time goes, hop by hop</h2><p class=\"note\">Mean per request at each hop: its own work (service), the wait for a slot or in the broker (queue wait), and the rest of its time: downstream calls and the network.</p>");
    out.push_str(&svg::stacked_bars(&hop_bars(&summary.variants)));
    out.push_str(&hop_table(&summary.variants));
    out.push_str("<h2>Errors and timeouts</h2>");
    out.push_str(&error_table(&summary.variants));
    out.push_str(&throughput_section(&summary.variants));
    out.push_str(&latency_over_time_section(&summary.variants));
    out.push_str(&endpoint_table(&summary.variants));
    out.push_str(&phases_section(&summary.variants));
    out.push_str(&broker_table(&summary.variants));
    out.push_str(&observer_section(&summary.variants));
    let env = &summary.environment;
    let _ = write!(
        out,
        "<h2>Environment</h2><table><tr><td>tailmesh</td><td>{}</td></tr><tr><td>OS</td><td>{} {}</td></tr><tr><td>kernel</td><td>{}</td></tr><tr><td>CPUs</td><td>{}</td></tr><tr><td>launcher</td><td>{}</td></tr></table><h2>Scenario</h2><p class=\"note\">{}</p><pre>{}</pre></body></html>",
        escape(&env.tailmesh_version),
        escape(&env.os),
        escape(&env.arch),
        escape(env.kernel.as_deref().unwrap_or("unknown")),
        env.cpus,
        escape(&env.launcher),
        escape(&s.origin),
        escape(&s.source),
    );
    out.push('\n');
    out
}

/// An axis tick in percent (the charts' y values are percentages, not
/// shares).
fn percent_tick(v: f64) -> String {
    percent(v / 100.0)
}

fn plain(v: f64) -> String {
    format!("{v}")
}

fn spectrum_tick(x: f64) -> String {
    // x = 1/(1-q): 10 -> 90%, 1000 -> 99.9%.
    let q = (1.0 - 1.0 / x) * 100.0;
    let text = format!("{q:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

/// A latency histogram's axes: share of requests per bucket against the
/// latency, log-x.
const HISTOGRAM: Frame<'static> = Frame {
    x_label: "latency (log scale)",
    y_label: "share of requests (%)",
    x_scale: Scale::Log,
    y_scale: Scale::Linear,
    x_format: micros,
    y_format: percent_tick,
};

/// A percentile spectrum's axes: latency against 1/(1-q), log-x.
const SPECTRUM: Frame<'static> = Frame {
    x_label: "percentile",
    y_label: "latency",
    x_scale: Scale::Log,
    y_scale: Scale::Linear,
    x_format: spectrum_tick,
    y_format: micros,
};

/// A spectrum's axes with latency on a log scale too: for variants whose
/// latencies differ by orders of magnitude, side by side.
const SPECTRUM_LOG_Y: Frame<'static> = Frame {
    y_label: "latency (log scale)",
    y_scale: Scale::Log,
    ..SPECTRUM
};

/// Goodput's axes: ok answers per second against the offered load.
const GOODPUT: Frame<'static> = Frame {
    x_label: "offered load (requests/s)",
    y_label: "ok answers/s",
    x_scale: Scale::Linear,
    y_scale: Scale::Linear,
    x_format: plain,
    y_format: plain,
};

#[cfg(test)]
mod tests;
