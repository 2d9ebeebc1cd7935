//! `report.html`: one self-contained page per run (inline CSS and SVG, no
//! script, no network) with the latency histograms of all variants
//! overlaid, the percentile spectrum, the per-hop breakdown, errors and
//! timeouts, throughput over time, the compounding check, the scenario and
//! the environment.

use std::{collections::BTreeMap, fmt::Write, path::Path};

use hdrhistogram::Histogram;

use super::{
    OutputError,
    svg::{self, LineChart, Scale, Series, StackedBars, escape},
    table::format_us,
};
use crate::{
    analysis::{Summary, SweepSummary, VariantReport},
    record::{Outcome, RequestRecord},
};

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f4f4f4}
.pass{color:#0a7d22;font-weight:bold}.fail{color:#b00020;font-weight:bold}.inconclusive{color:#8a6d00;font-weight:bold}
.note{color:#555;font-size:.9rem}pre{background:#f7f7f7;padding:.7rem;overflow:auto;font-size:.85rem}
svg.chart{display:block;margin:.5rem 0;max-width:100%;height:auto}
svg .title{font-size:14px;font-weight:bold}svg .tick,svg .legend{font-size:11px}svg .label{font-size:12px}
svg .grid{stroke:#eee}svg .axis{stroke:#555}";

/// Writes `report.html` for `summary`; `records` are each variant's
/// requests (for throughput over time).
pub fn write_report(
    path: &Path,
    summary: &Summary,
    records: &[(&str, &[RequestRecord])],
) -> Result<(), OutputError> {
    let page = render_report(summary, records);
    super::write_atomically(path, |out| std::io::Write::write_all(out, page.as_bytes()))
}

/// The whole page.
pub fn render_report(summary: &Summary, records: &[(&str, &[RequestRecord])]) -> String {
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
    if summary.check.compounding_requested {
        let verdict = summary.check.verdict.as_str();
        let _ = write!(
            out,
            "<p>check: <span class=\"{verdict}\" id=\"verdict\">{verdict}</span></p>"
        );
    }
    out.push_str(&latency_table(&summary.variants));
    out.push_str(&compounding_table(&summary.variants));
    if let Some(sweep) = &summary.sweep {
        out.push_str(&sweep_section(sweep));
    }
    out.push_str("<h2>Latency distribution</h2><p class=\"note\">End-to-end latency of ok requests, measured from the intended send time. Share of requests per bucket (ten buckets per decade).</p>");
    out.push_str(&svg::line_chart(&histogram_chart(&summary.variants)));
    out.push_str("<h2>Percentile spectrum</h2><p class=\"note\">Latency against percentile, on HdrHistogram's 1/(1-q) axis: the right edge is the tail.</p>");
    out.push_str(&svg::line_chart(&spectrum_chart(&summary.variants)));
    out.push_str("<h2>Where the time goes, hop by hop</h2><p class=\"note\">Mean per request at each hop: its own work (service), the wait for a slot or in the broker (queue wait), and the rest of its time: downstream calls and the network.</p>");
    out.push_str(&svg::stacked_bars(&hop_bars(&summary.variants)));
    out.push_str(&hop_table(&summary.variants));
    out.push_str("<h2>Errors and timeouts</h2>");
    out.push_str(&error_table(&summary.variants));
    out.push_str("<h2>Throughput over time</h2><p class=\"note\">Answers per second of the measured phase; dashed: errors and timeouts.</p>");
    out.push_str(&svg::line_chart(&throughput_chart(records)));
    out.push_str(&broker_table(&summary.variants));
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

fn latency_table(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<h2>End to end</h2><table id=\"latency\"><tr><th>variant</th><th>sent</th><th>ok</th><th>errors</th><th>timeouts</th><th>rate</th><th>extra requests</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>p99.99</th><th>max</th></tr>",
    );
    for v in variants {
        let l = &v.latency;
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}/s</td><td>{:.1} %</td>",
            escape(&v.name),
            v.sent,
            v.ok,
            v.errors.values().sum::<u64>(),
            v.timeouts,
            v.achieved_rate,
            v.extra_load * 100.0
        );
        for us in [
            l.p50_us,
            l.p90_us,
            l.p99_us,
            l.p99_9_us,
            l.p99_99_us,
            l.max_us,
        ] {
            let _ = write!(
                out,
                "<td>{}</td>",
                if l.count == 0 {
                    "-".into()
                } else {
                    format_us(us)
                }
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

fn compounding_table(variants: &[VariantReport]) -> String {
    let rows: Vec<_> = variants
        .iter()
        .filter_map(|v| v.compounding.as_ref().map(|c| (v, c)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Tail compounding</h2><table id=\"compounding\"><tr><th>variant</th><th>slow / n</th><th>measured</th><th>95 % interval</th><th>model 1 - prod(1 - p_i)</th><th>declared</th><th>verdict</th></tr>",
    );
    for (v, c) in rows {
        let verdict = c.verdict.as_str();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{} / {}</td><td>{:.1} %</td><td>[{:.1}, {:.1}] %</td><td>{:.1} %</td><td>{:.1} %</td><td class=\"{verdict}\">{verdict}</td></tr>",
            escape(&v.name),
            c.slow,
            c.n,
            c.measured * 100.0,
            c.ci_lo * 100.0,
            c.ci_hi * 100.0,
            c.model * 100.0,
            c.declared_model * 100.0,
        );
    }
    out.push_str("</table>");
    out
}

fn ms(us: f64) -> String {
    let ms = us / 1000.0;
    if ms >= 10.0 || ms == 0.0 {
        format!("{ms:.0}ms")
    } else if ms >= 1.0 {
        format!("{ms:.1}ms")
    } else if us >= 1.0 {
        format!("{us:.0}us")
    } else {
        format!("{us:.2}us")
    }
}

fn percent(v: f64) -> String {
    format!("{v}%")
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

fn histogram_chart(variants: &[VariantReport]) -> LineChart<'static> {
    let series = variants
        .iter()
        .enumerate()
        .map(|(i, v)| Series {
            name: v.name.clone(),
            points: log_buckets(&v.latency_histogram),
            dashed: false,
            colour: i,
            intervals: Vec::new(),
        })
        .collect();
    LineChart {
        id: "histogram",
        title: "Latency histogram",
        x_label: "latency (log scale)",
        y_label: "share of requests (%)",
        x_scale: Scale::Log,
        y_scale: Scale::Linear,
        x_format: ms,
        y_format: percent,
        series,
    }
}

/// (bucket centre in µs, share in %) for ten buckets per decade.
fn log_buckets(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut counts: BTreeMap<i64, u64> = BTreeMap::new();
    for v in h.iter_recorded() {
        let us = v.value_iterated_to().max(1) as f64;
        *counts
            .entry((us.log10() * 10.0).floor() as i64)
            .or_insert(0) += v.count_since_last_iteration();
    }
    let total = h.len() as f64;
    let (Some(&lo), Some(&hi)) = (counts.keys().next(), counts.keys().next_back()) else {
        return Vec::new();
    };
    (lo - 1..=hi + 1)
        .map(|b| {
            let centre = 10f64.powf((b as f64 + 0.5) / 10.0);
            let share = counts.get(&b).copied().unwrap_or(0) as f64 / total * 100.0;
            (centre, share)
        })
        .collect()
}

fn spectrum_chart(variants: &[VariantReport]) -> LineChart<'static> {
    let series = variants
        .iter()
        .enumerate()
        .map(|(i, v)| Series {
            name: v.name.clone(),
            points: v
                .latency_histogram
                .iter_quantiles(5)
                .filter(|q| q.quantile_iterated_to() < 1.0)
                .map(|q| {
                    (
                        1.0 / (1.0 - q.quantile_iterated_to()),
                        q.value_iterated_to() as f64,
                    )
                })
                .chain((!v.latency_histogram.is_empty()).then(|| {
                    let n = v.latency_histogram.len() as f64;
                    (n.max(1.0), v.latency_histogram.max() as f64)
                }))
                .collect(),
            dashed: false,
            colour: i,
            intervals: Vec::new(),
        })
        .collect();
    LineChart {
        id: "spectrum",
        title: "Percentile spectrum",
        x_label: "percentile",
        y_label: "latency",
        x_scale: Scale::Log,
        y_scale: Scale::Linear,
        x_format: spectrum_tick,
        y_format: ms,
        series,
    }
}

fn hop_bars(variants: &[VariantReport]) -> StackedBars<'static> {
    let multi = variants.len() > 1;
    let bars = variants
        .iter()
        .flat_map(|v| {
            v.hops.iter().map(move |h| {
                let service = h.service.mean_us;
                let queue = h.queue_wait.mean_us;
                let rest = (h.total.mean_us - service - queue).max(0.0);
                let label = if multi {
                    format!("{} / {}", v.name, h.hop)
                } else {
                    h.hop.clone()
                };
                (label, vec![service, queue, rest])
            })
        })
        .collect();
    StackedBars {
        id: "hops",
        title: "Mean time per request at each hop",
        x_label: "time per request",
        x_format: ms,
        segments: vec![
            "service".into(),
            "queue wait".into(),
            "downstream and network".into(),
        ],
        bars,
    }
}

fn hop_table(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<table id=\"hop-table\"><tr><th>variant / hop</th><th>transport</th><th>requests per replica</th><th>p_slow</th><th>service p50</th><th>service p99</th><th>queue wait p99</th><th>total p99</th></tr>",
    );
    for v in variants {
        for h in &v.hops {
            let split: Vec<String> = h.replica_requests.iter().map(u64::to_string).collect();
            let _ = write!(
                out,
                "<tr><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&h.hop),
                escape(&h.transport),
                split.join(" / "),
                h.p_slow
                    .map_or("-".into(), |p| format!("{:.1} %", p * 100.0)),
                format_us(h.service.p50_us),
                format_us(h.service.p99_us),
                format_us(h.queue_wait.p99_us),
                format_us(h.total.p99_us),
            );
        }
    }
    out.push_str("</table>");
    out
}

fn error_table(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<table id=\"errors\"><tr><th>variant</th><th>sent</th><th>timeouts</th><th>errors by code</th><th>accounted</th><th>incidents</th></tr>",
    );
    for v in variants {
        let errors: Vec<String> = v
            .errors
            .iter()
            .map(|(k, n)| format!("{} {n}", escape(k)))
            .collect();
        let incidents: Vec<String> = v.incidents.iter().map(|i| escape(i)).collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            escape(&v.name),
            v.sent,
            v.timeouts,
            if errors.is_empty() {
                "none".into()
            } else {
                errors.join(", ")
            },
            if v.accounted { "pass" } else { "fail" },
            if v.accounted { "yes" } else { "no" },
            incidents.join("<br>"),
        );
    }
    out.push_str("</table>");
    out
}

fn throughput_chart(records: &[(&str, &[RequestRecord])]) -> LineChart<'static> {
    let mut series = Vec::new();
    for (i, (name, rs)) in records.iter().enumerate() {
        let last = rs.iter().map(|r| r.end.as_secs()).max().unwrap_or(0) as usize;
        let (mut ok, mut failed) = (vec![0u64; last + 1], vec![0u64; last + 1]);
        for r in rs.iter() {
            let s = r.end.as_secs() as usize;
            if r.outcome == Outcome::Ok {
                ok[s] += 1;
            } else {
                failed[s] += 1;
            }
        }
        let points = |counts: &[u64]| {
            counts
                .iter()
                .enumerate()
                .map(|(s, n)| (s as f64 + 0.5, *n as f64))
                .collect()
        };
        series.push(Series {
            name: format!("{name} ok"),
            points: points(&ok),
            dashed: false,
            colour: i,
            intervals: Vec::new(),
        });
        if failed.iter().any(|n| *n > 0) {
            series.push(Series {
                name: format!("{name} failed"),
                points: points(&failed),
                dashed: true,
                colour: i,
                intervals: Vec::new(),
            });
        }
    }
    LineChart {
        id: "throughput",
        title: "Throughput over time",
        x_label: "seconds into the measured phase",
        y_label: "answers per second",
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        x_format: plain,
        y_format: plain,
        series,
    }
}

/// The sweep's charts and table: the compounding curve (measured slow
/// fraction with 95 % intervals against the declared model) and p99 against
/// the swept value, one series per declared variant.
fn sweep_section(sweep: &SweepSummary) -> String {
    let mut groups: Vec<&str> = Vec::new();
    for r in &sweep.rows {
        if !groups.contains(&r.group.as_str()) {
            groups.push(&r.group);
        }
    }
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
            x_label: &sweep.key,
            y_label: "slow requests (%)",
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_format: plain,
            y_format: percent,
            series,
        }));
    }
    let series = groups
        .iter()
        .enumerate()
        .map(|(i, g)| Series {
            name: format!("{g} p99"),
            points: sweep
                .rows
                .iter()
                .filter(|r| r.group == *g)
                .map(|r| (x_of(&r.value), r.p99_us as f64))
                .collect(),
            dashed: false,
            colour: i,
            intervals: Vec::new(),
        })
        .collect();
    out.push_str(&svg::line_chart(&LineChart {
        id: "sweep-p99",
        title: "p99 across the sweep",
        x_label: &sweep.key,
        y_label: "p99 latency",
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
        x_format: plain,
        y_format: ms,
        series,
    }));
    out.push_str("<table id=\"sweep\"><tr><th>variant</th><th>value</th><th>sent</th><th>p50</th><th>p99</th><th>p99.9</th><th>slow measured</th><th>95 % interval</th><th>model</th><th>declared</th><th>verdict</th></tr>");
    for r in &sweep.rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            escape(&r.group),
            escape(&r.value),
            r.sent,
            format_us(r.p50_us),
            format_us(r.p99_us),
            format_us(r.p99_9_us)
        );
        match &r.compounding {
            Some(c) => {
                let verdict = c.verdict.as_str();
                let _ = write!(
                    out,
                    "<td>{:.1} %</td><td>[{:.1}, {:.1}] %</td><td>{:.1} %</td><td>{:.1} %</td><td class=\"{verdict}\">{verdict}</td></tr>",
                    c.measured * 100.0,
                    c.ci_lo * 100.0,
                    c.ci_hi * 100.0,
                    c.model * 100.0,
                    c.declared_model * 100.0
                );
            }
            None => out.push_str("<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td></tr>"),
        }
    }
    out.push_str("</table>");
    out
}

fn broker_table(variants: &[VariantReport]) -> String {
    if variants.iter().all(|v| v.broker.is_empty()) {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Broker</h2><table id=\"broker\"><tr><th>variant / topic</th><th>enqueued</th><th>completed</th><th>expired</th><th>redelivered</th><th>rejected full</th><th>max depth</th><th>queue wait p50</th><th>p99</th><th>max</th></tr>",
    );
    for v in variants {
        for t in &v.broker {
            let _ = write!(
                out,
                "<tr><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&t.topic),
                t.enqueued,
                t.completed,
                t.expired + t.expired_in_flight,
                t.redelivered,
                t.rejected_full,
                t.max_depth,
                format_us(t.queue_wait_p50_ns / 1000),
                format_us(t.queue_wait_p99_ns / 1000),
                format_us(t.queue_wait_max_ns / 1000),
            );
        }
    }
    out.push_str("</table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::testing::{mixed_records, summary};

    #[test]
    fn the_page_is_self_contained_and_has_every_section() {
        let s = summary();
        let records = mixed_records();
        let html = render_report(&s, &[("base", &records)]);
        assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
        for id in [
            "histogram",
            "spectrum",
            "hops",
            "throughput",
            "latency",
            "compounding",
            "errors",
        ] {
            assert!(html.contains(&format!("id=\"{id}\"")), "missing {id}");
        }
        for external in ["<script", "http://", "https://", "<link"] {
            let allowed = html.matches("http://www.w3.org/2000/svg").count();
            let found = html.matches(external).count();
            let found = if external == "http://" {
                found - allowed
            } else {
                found
            };
            assert_eq!(found, 0, "external reference {external}");
        }
        assert!(
            html.contains("class=\"pass\" id=\"verdict\""),
            "verdict shown"
        );
    }

    #[test]
    fn log_buckets_cover_the_data_and_sum_to_all() {
        let mut h = crate::analysis::stats::new_histogram();
        for us in [100, 120, 1_000, 20_000] {
            crate::analysis::stats::record_us(&mut h, us);
        }
        let buckets = log_buckets(&h);
        let total: f64 = buckets.iter().map(|b| b.1).sum();
        assert!((total - 100.0).abs() < 1e-9, "{buckets:?}");
        assert!(buckets.first().is_some_and(|b| b.0 < 100.0 && b.1 == 0.0));
        assert!(buckets.last().is_some_and(|b| b.0 > 20_000.0 && b.1 == 0.0));
        assert!(log_buckets(&crate::analysis::stats::new_histogram()).is_empty());
    }

    #[test]
    fn spectrum_ticks_read_as_percentiles() {
        assert_eq!(spectrum_tick(10.0), "90%");
        assert_eq!(spectrum_tick(1000.0), "99.9%");
        assert_eq!(spectrum_tick(1.0), "0%");
    }
}
