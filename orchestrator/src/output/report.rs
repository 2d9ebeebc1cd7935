//! `report.html`: one self-contained page per run (inline CSS and SVG, no
//! script, no network) with the latency histograms of all variants
//! overlaid, the percentile spectrum, the per-hop breakdown, errors and
//! timeouts, throughput over time, latency over time (fault windows and
//! load steps as bands), the phases of each run (a table, and for load
//! steps latency and goodput against the offered load), the compounding
//! check, the scenario and the environment.

use std::{collections::BTreeMap, fmt::Write, path::Path};

use hdrhistogram::Histogram;
use tailmesh_units::{micros, percent, signed_percent};

use super::{
    OutputError, phases,
    svg::{
        self, Band, BandKind, Frame, LineChart, Panel, Scale, Series, SmallMultiples, StackedBars,
        escape,
    },
};
use crate::analysis::{
    IntervalSeries, SpectrumPoint, Summary, SweepSummary, VariantReport, sweep::SweepRow,
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

/// What tracing cost in each variant that says, one line each.
fn observer_section(variants: &[VariantReport]) -> String {
    let lines: Vec<String> = variants
        .iter()
        .filter_map(|v| {
            let o = v.observer.as_ref()?;
            Some(format!(
                "<tr><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&o.line())
            ))
        })
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "<h2>What tracing cost</h2><p class=\"note\">The observer's own CPU while the load ran: \
         the hops recording and exporting spans, and the orchestrator receiving, spooling and \
         sampling them and making its own (summary.json's <code>observer</code>, per part).</p>\
         <table id=\"observer\"><tr><th>variant</th><th>observer</th></tr>{}</table>",
        lines.concat()
    )
}

fn latency_table(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<h2>End to end</h2><table id=\"latency\"><tr><th>variant</th><th>sent</th><th>ok</th><th>errors</th><th>timeouts</th><th>rate</th><th>extra requests</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>p99.99</th><th>max</th></tr>",
    );
    for v in variants {
        let l = &v.latency;
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}/s</td><td>{}</td>",
            escape(&v.name),
            v.sent,
            v.ok,
            v.errors.values().sum::<u64>(),
            v.timeouts,
            v.achieved_rate,
            percent(v.extra_load)
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
                    micros(us as f64)
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
            "<tr><td>{}</td><td>{} / {}</td><td>{}</td><td>[{}, {}]</td><td>{}</td><td>{}</td><td class=\"{verdict}\">{verdict}</td></tr>",
            escape(&v.name),
            c.slow,
            c.n,
            percent(c.measured),
            percent(c.ci_lo),
            percent(c.ci_hi),
            percent(c.model),
            percent(c.declared_model),
        );
    }
    out.push_str("</table>");
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
        frame: HISTOGRAM,
        x_range: None,
        bands: Vec::new(),
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
            points: spectrum_points(&v.latency_histogram),
            dashed: false,
            colour: i,
            intervals: Vec::new(),
        })
        .collect();
    LineChart {
        id: "spectrum",
        title: "Percentile spectrum",
        frame: SPECTRUM,
        x_range: None,
        bands: Vec::new(),
        series,
    }
}

/// (1/(1-q), latency in µs) along `h`'s percentiles, ending at its
/// maximum (placed at 1/(1-q) = the sample count).
fn spectrum_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    h.iter_quantiles(5)
        .filter(|q| q.quantile_iterated_to() < 1.0)
        .map(|q| {
            (
                1.0 / (1.0 - q.quantile_iterated_to()),
                q.value_iterated_to() as f64,
            )
        })
        .chain((!h.is_empty()).then(|| ((h.len() as f64).max(1.0), h.max() as f64)))
        .collect()
}

/// A spectrum point's value with its interval, µs.
type PointBand = (Option<f64>, Option<f64>, Option<f64>);

/// The whole tail, predicted against measured: per variant, the spectra
/// (measured, composed from the hops' segments, shuffled, declared) with
/// their 95 % intervals, a table at p50 to p99.9, the dependence and the
/// distribution verdict.
fn composition_section(variants: &[VariantReport]) -> String {
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
        x_format: micros,
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
            // A hop whose work is a real gRPC service says which.
            let service = h.grpc_service.as_ref().map_or(String::new(), |s| {
                format!("<br><small>service {}</small>", escape(&s.method))
            });
            let _ = write!(
                out,
                "<tr><td>{} / {}{service}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&h.hop),
                escape(&h.transport),
                split.join(" / "),
                h.p_slow.map_or("-".into(), percent),
                micros(h.service.p50_us as f64),
                micros(h.service.p99_us as f64),
                micros(h.queue_wait.p99_us as f64),
                micros(h.total.p99_us as f64),
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

/// The width of a throughput bucket, seconds (wider for runs so long that
/// one-second buckets would crowd the chart).
fn bucket_width(end_s: f64) -> f64 {
    const MOST_BUCKETS: f64 = 600.0;
    (end_s / MOST_BUCKETS).ceil().max(1.0)
}

/// One throughput bucket: seconds into the measured phase, and answers per
/// second of the time it covers.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RateBucket {
    start: f64,
    end: f64,
    ok: f64,
    failed: f64,
}

/// A variant's answers over its sending window.
#[derive(Clone, Debug, PartialEq)]
struct Throughput {
    /// Buckets covering `[0, end]` without gaps.
    buckets: Vec<RateBucket>,
    /// Where the window ends (where sending ended).
    end: f64,
    /// Ok answers that arrived after `end`.
    late_ok: u64,
    /// Errors and timeouts that arrived after `end`.
    late_failed: u64,
}

/// Bucket edges over `[0, end]`, one-second series' own.
#[cfg(test)]
fn bucket_edges(end: f64) -> Vec<(f64, f64)> {
    bucket_edges_with(end, bucket_width(end))
}

/// Bucket edges `width` apart over `[0, end]`.
fn bucket_edges_with(end: f64, width: f64) -> Vec<(f64, f64)> {
    if !(end.is_finite() && end > 0.0 && width > 0.0) {
        return Vec::new();
    }
    let whole = (end / width).floor() as usize;
    let rest = end - whole as f64 * width;
    let mut edges: Vec<(f64, f64)> = (0..whole)
        .map(|i| (i as f64 * width, (i + 1) as f64 * width))
        .collect();
    match edges.last_mut() {
        // A remainder under half a bucket widens the last one (its rate is
        // still count / covered time): alone, a sliver would plot noise.
        Some(last) if rest < width / 2.0 => last.1 = end,
        _ if rest > 0.0 => edges.push((whole as f64 * width, end)),
        _ => {}
    }
    edges
}

/// Answers per second in buckets over the sending window, from the
/// series' answers by arrival time (a bucket spans whole intervals of the
/// series; answers after the window are the series' late counts).
fn throughput(series: &IntervalSeries) -> Throughput {
    let end = series.sending_end;
    let step = series.interval.as_secs_f64().max(f64::MIN_POSITIVE);
    // The chart's width in whole intervals of the series.
    let width = (bucket_width(end) / step).ceil().max(1.0) * step;
    let edges = bucket_edges_with(end, width);
    let (mut ok, mut failed) = (vec![0u64; edges.len()], vec![0u64; edges.len()]);
    if !edges.is_empty() {
        for (k, interval) in series.buckets.iter().enumerate() {
            let i = ((k as f64 * step / width) as usize).min(edges.len() - 1);
            ok[i] += interval.answered_ok;
            failed[i] += interval.answered_failed;
        }
    }
    let buckets = edges
        .iter()
        .zip(ok.iter().zip(&failed))
        .map(|(&(start, end), (&ok, &failed))| {
            let covered = end - start;
            RateBucket {
                start,
                end,
                ok: ok as f64 / covered,
                failed: failed as f64 / covered,
            }
        })
        .collect();
    Throughput {
        buckets,
        end,
        late_ok: series.late_ok,
        late_failed: series.late_failed,
    }
}

/// Each variant's throughput, by name, over its own sending window.
fn throughputs(variants: &[VariantReport]) -> Vec<(String, Throughput)> {
    variants
        .iter()
        .map(|v| (v.name.clone(), throughput(&v.intervals)))
        .collect()
}

/// The heading, the chart and a note on the answers left out.
fn throughput_section(variants: &[VariantReport]) -> String {
    let all = throughputs(variants);
    let mut out = String::from(
        "<h2>Throughput over time</h2><p class=\"note\">Answers per second while the load was sent, by arrival time; each step is one bucket; dashed: errors and timeouts.</p>",
    );
    out.push_str(&svg::line_chart(&throughput_chart(
        &all,
        shared_bands(variants),
    )));
    let late: Vec<String> = all
        .iter()
        .filter(|(_, t)| t.late_ok + t.late_failed > 0)
        .map(|(name, t)| {
            format!(
                "{}: {} ok, {} failed",
                escape(name),
                t.late_ok,
                t.late_failed
            )
        })
        .collect();
    if !late.is_empty() {
        let _ = write!(
            out,
            "<p class=\"note\" id=\"throughput-late\">Not plotted: answers that arrived after sending ended, from requests still in flight then ({}).</p>",
            late.join("; ")
        );
    }
    out
}

/// Each variant's answers per second, ok and failed, with `bands`
/// shaded under the lines.
fn throughput_chart(all: &[(String, Throughput)], bands: Vec<Band>) -> LineChart<'static> {
    let mut series = Vec::new();
    for (i, (name, t)) in all.iter().enumerate() {
        let steps = |rate: fn(&RateBucket) -> f64| {
            t.buckets
                .iter()
                .flat_map(|b| [(b.start, rate(b)), (b.end, rate(b))])
                .collect()
        };
        series.push(Series {
            name: format!("{name} ok"),
            points: steps(|b| b.ok),
            dashed: false,
            colour: i,
            intervals: Vec::new(),
        });
        if t.buckets.iter().any(|b| b.failed > 0.0) {
            series.push(Series {
                name: format!("{name} failed"),
                points: steps(|b| b.failed),
                dashed: true,
                colour: i,
                intervals: Vec::new(),
            });
        }
    }
    let end = all.iter().map(|(_, t)| t.end).fold(0.0, f64::max);
    LineChart {
        id: "throughput",
        title: "Throughput over time",
        frame: Frame {
            x_label: "seconds into the measured phase",
            y_label: "answers per second",
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_format: plain,
            y_format: plain,
        },
        x_range: (end > 0.0).then_some((0.0, end)),
        bands,
        series,
    }
}

/// Latency over time: one chart per variant (three lines for each of
/// several variants in one chart cannot be read), p50, p99 and p99.9 of
/// each interval's ok requests, by intended send time.
fn latency_over_time_section(variants: &[VariantReport]) -> String {
    let mut out = String::from(
        "<h2>Latency over time</h2><p class=\"note\">End-to-end latency of the ok requests meant to be sent in each interval, from their intended send time (each variant's <code>.hlog</code> holds the intervals' whole histograms, per hop too).</p>",
    );
    if variants.iter().any(|v| !v.phases.is_empty()) {
        out.push_str("<p class=\"note\">Shaded: fault windows and replicas killed on schedule, as planned (the label at the top); tinted in turn: load steps (the offered rate at the bottom).</p>");
    }
    if variants.iter().any(|v| !v.endpoints.is_empty()) {
        out.push_str("<p class=\"note\">Dashed: a replica's state changes as its callers saw them first (<code>hop/replica</code> and TRANSIENT_FAILURE, READY, EJECTED or READMITTED); the table below has them all.</p>");
    }
    for v in variants {
        let id = format!("latency-over-time-{}", v.name);
        let mut bands = bands_of(v);
        bands.extend(endpoint_marks(v));
        out.push_str(&svg::line_chart(&latency_over_time_chart(v, &id, bands)));
    }
    out
}

/// The most endpoint marks on one chart: past it, the table says the rest.
const MAX_ENDPOINT_MARKS: usize = 12;

/// A dashed mark for each state change of a called replica: the first
/// time any caller saw it (the callers of one replica see it within
/// moments of each other; a change seen again half a second later is
/// another mark).
fn endpoint_marks(v: &VariantReport) -> Vec<Band> {
    let mut events: Vec<(f64, String)> = v
        .endpoints
        .iter()
        .flat_map(|c| {
            c.events.iter().map(move |e| {
                let kind = match e.kind.as_str() {
                    "transient_failure" => "TRANSIENT_FAILURE",
                    "ready" => "READY",
                    "ejected" => "EJECTED",
                    "readmitted" => "READMITTED",
                    other => other,
                };
                (e.at_s, format!("{}/{} {kind}", c.hop, e.replica))
            })
        })
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut marks: Vec<Band> = Vec::new();
    for (at, label) in events {
        let repeated = marks
            .iter()
            .any(|m| m.label == label && (at - m.from).abs() < 0.5);
        if !repeated && marks.len() < MAX_ENDPOINT_MARKS {
            marks.push(Band {
                from: at,
                to: at,
                label,
                kind: BandKind::Mark,
            });
        }
    }
    marks
}

/// Per variant, each push caller that saw something happen to the
/// replicas it calls: a row per called replica, with its counts and its
/// state changes (seconds from the end of warmup).
fn endpoint_table(variants: &[VariantReport]) -> String {
    let eventful: Vec<(&VariantReport, &crate::analysis::CallerEndpoints)> = variants
        .iter()
        .flat_map(|v| {
            v.endpoints
                .iter()
                .filter(|c| c.eventful())
                .map(move |c| (v, c))
        })
        .collect();
    let killed = variants.iter().any(|v| !v.kills.is_empty());
    if eventful.is_empty() && !killed {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Endpoints</h2><p class=\"note\">What each push caller (the load generator, or a calling replica <code>hop/replica</code>) saw of the replicas it calls: calls sent (picks), times in TRANSIENT_FAILURE, failed reconnects, keepalive timeouts, calls moved to another replica before they left, ejections and re-admissions; only callers that saw a change are listed. Errors per variant are in the errors table above.</p>",
    );
    if killed {
        out.push_str("<table id=\"kills\"><tr><th>variant</th><th>replica</th><th>killed at</th><th>back at</th><th>calls sent to it while down</th></tr>");
        for v in variants {
            for k in &v.kills {
                let at = |t: Option<f64>| t.map_or_else(|| "-".to_owned(), |t| format!("{t:.2} s"));
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{}/{}</td><td>{} (planned {:.2} s)</td><td>{}{}</td><td>{}</td></tr>",
                    escape(&v.name),
                    escape(&k.hop),
                    k.replica,
                    at(k.killed_at_s),
                    k.at_s,
                    at(k.restarted_at_s),
                    k.back_s
                        .map(|b| format!(" (planned {b:.2} s)"))
                        .unwrap_or_default(),
                    if k.picks_while_down.is_empty() {
                        "not reported".to_owned()
                    } else {
                        k.picks_while_down
                            .iter()
                            .map(|c| format!("{} {}", escape(&c.caller), c.picks))
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                );
            }
        }
        out.push_str("</table>");
    }
    if eventful.is_empty() {
        return out;
    }
    out.push_str("<table id=\"endpoints\"><tr><th>variant</th><th>caller</th><th>replica</th><th>picks</th><th>transient failures</th><th>failed connects</th><th>keepalive timeouts</th><th>redirected</th><th>ejections</th><th>readmissions</th><th>events</th></tr>");
    for (v, c) in eventful {
        for (i, r) in c.replicas.iter().enumerate() {
            let events: Vec<String> = c
                .events
                .iter()
                .filter(|e| e.replica as usize == i)
                .map(|e| {
                    if e.reason.is_empty() {
                        format!("{} {:.2} s", e.kind, e.at_s)
                    } else {
                        format!("{} {:.2} s ({})", e.kind, e.at_s, escape(&e.reason))
                    }
                })
                .collect();
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}/{i}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&v.name),
                escape(&c.caller),
                escape(&c.hop),
                r.picks,
                r.transient_failures,
                r.failed_connects,
                r.keepalive_timeouts,
                r.redirected,
                r.ejections,
                r.readmissions,
                events.join("<br>"),
            );
        }
    }
    out.push_str("</table>");
    out
}

/// `v`'s load steps and fault windows, as bands of its time charts (the
/// steps first: they tile the axis under the windows).
fn bands_of(v: &VariantReport) -> Vec<Band> {
    let mut bands = phases::step_bands(v);
    bands.extend(phases::fault_bands(v));
    bands
}

/// The bands of a chart all `variants` share: each one's own when they
/// agree; otherwise each labelled with its variant's name, identical
/// spans sharing a band.
fn shared_bands(variants: &[VariantReport]) -> Vec<Band> {
    let each: Vec<Vec<Band>> = variants.iter().map(bands_of).collect();
    match each.split_first() {
        None => Vec::new(),
        Some((first, rest)) if rest.iter().all(|b| b == first) => first.clone(),
        Some(_) => {
            let mut bands: Vec<Band> = Vec::new();
            for (v, own) in variants.iter().zip(each) {
                for b in own {
                    let label = format!("{}: {}", v.name, b.label);
                    let same = |x: &&mut Band| x.from == b.from && x.to == b.to && x.kind == b.kind;
                    match bands.iter_mut().find(same) {
                        Some(x) => {
                            x.label.push_str("; ");
                            x.label.push_str(&label);
                        }
                        None => bands.push(Band { label, ..b }),
                    }
                }
            }
            bands
        }
    }
}

/// Per variant with phases: a table of them and, for load steps, latency
/// and goodput against the offered load with the knee marked.
fn phases_section(variants: &[VariantReport]) -> String {
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
fn step_charts<'a>(
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

/// `v`'s latency over time, with `bands` shaded under the lines.
fn latency_over_time_chart<'a>(v: &VariantReport, id: &'a str, bands: Vec<Band>) -> LineChart<'a> {
    type Quantile = fn(&crate::analysis::LatencyPoint) -> u64;
    let quantiles: [(&str, Quantile); 3] = [
        ("p50", |p| p.p50_us),
        ("p99", |p| p.p99_us),
        ("p99.9", |p| p.p99_9_us),
    ];
    let series = quantiles
        .iter()
        .enumerate()
        .map(|(i, (name, value))| Series {
            name: (*name).to_owned(),
            points: v
                .latency_over_time
                .iter()
                .filter(|p| p.ok > 0)
                .map(|p| (p.start_s + p.width_s / 2.0, value(p) as f64))
                .collect(),
            dashed: false,
            colour: i,
            intervals: Vec::new(),
        })
        .collect();
    let end = v
        .latency_over_time
        .last()
        .map_or(0.0, |p| p.start_s + p.width_s);
    LineChart {
        id,
        title: "Latency over time",
        frame: Frame {
            x_label: "seconds into the measured phase (intended send time)",
            y_label: "latency",
            x_scale: Scale::Linear,
            y_scale: Scale::Log,
            x_format: plain,
            y_format: micros,
        },
        x_range: (end > 0.0).then_some((0.0, end)),
        series,
        bands,
    }
}

/// The sweep's charts and table: the compounding curve (measured slow
/// fraction with 95 % intervals against the declared model) and p99 against
/// the swept value, one series per declared variant.
fn sweep_section(sweep: &SweepSummary) -> String {
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
fn side_by_side_section(sweep: &SweepSummary, variants: &[VariantReport]) -> String {
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
const LOAD_RATE: &str = "load.rate";

/// An offered-load sweep's hockey stick: goodput (ok answers per second)
/// against the offered load, with the offered load itself dashed (where
/// goodput leaves it, the system saturated), and the share of requests that
/// failed; p99 of the answered requests is the sweep's p99 chart. One
/// series per declared variant.
fn hockey_stick_section(sweep: &SweepSummary) -> String {
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
                micros(t.queue_wait_p50_ns as f64 / 1e3),
                micros(t.queue_wait_p99_ns as f64 / 1e3),
                micros(t.queue_wait_max_ns as f64 / 1e3),
            );
        }
    }
    out.push_str("</table>");
    out
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::analysis::intervals::{IntervalRecorder, Window, sending_end};
    use crate::analysis::testing::summary;
    use crate::output::svg::tests::panel_points;
    use crate::record::{Outcome, RequestRecord};

    #[test]
    fn the_page_is_self_contained_and_has_every_section() {
        let s = summary();
        let html = render_report(&s);
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
    fn latency_over_time_has_a_chart_per_variant() {
        let mut s = summary();
        let mut other = s.variants[0].clone();
        other.name = "pull".into();
        s.variants.push(other);
        let base = &s.variants[0].latency_over_time;
        // mixed_records: 2.5 s of requests in 1 s intervals, one slow in
        // ten at each hop.
        assert_eq!(
            base.iter()
                .map(|p| (p.start_s, p.ok))
                .take(3)
                .collect::<Vec<_>>(),
            [(0.0, 400), (1.0, 400), (2.0, 200)]
        );
        let html = render_report(&s);
        for id in ["latency-over-time-base", "latency-over-time-pull"] {
            let at = html
                .find(&format!("id=\"{id}\""))
                .unwrap_or_else(|| panic!("no {id}"));
            let chart = &html[at..at + html[at..].find("</svg>").expect("closed")];
            for q in ["p50", "p99", "p99.9"] {
                assert!(
                    chart.contains(&format!("data-series=\"{q}\"")),
                    "{id} has no {q} line"
                );
            }
        }
        // The p99 line goes through each interval's p99, at its middle.
        let chart = latency_over_time_chart(&s.variants[0], "c", Vec::new());
        let p99 = series(&chart, "p99");
        assert_eq!(p99[0].0, 0.5);
        assert_eq!(p99[0].1, base[0].p99_us as f64);
        assert!(
            base[0].p99_us > 20_000 && base[0].p50_us < 2_000,
            "{base:?}"
        );
        // The latency histograms came with the report.
        assert_eq!(s.variants[0].intervals_written, 20);
    }

    #[test]
    fn the_observer_cost_has_a_section_when_measured() {
        let mut s = summary();
        assert!(!render_report(&s).contains("id=\"observer\""));
        s.variants[0].observer = Some(crate::analysis::ObserverReport::off());
        let html = render_report(&s);
        assert!(html.contains("id=\"observer\""), "{html}");
        assert!(
            html.contains("<td>traces off: no observer cost</td>"),
            "{html}"
        );
    }

    #[test]
    fn an_offered_load_sweep_draws_the_hockey_stick_per_variant() {
        use crate::analysis::sweep::SweepRow;
        let row = |group: &str, value: &str, ok_rate: f64, error_share: f64| SweepRow {
            group: group.into(),
            value: value.into(),
            variant: format!("{group}-load.rate-{value}"),
            sent: 1000,
            ok: 900,
            ok_rate,
            error_share,
            p50_us: 5_000,
            p99_us: 250_000,
            p99_9_us: 400_000,
            compounding: None,
        };
        let mut sweep = SweepSummary {
            key: "load.rate".into(),
            values: vec!["100".into(), "300".into()],
            rows: vec![
                row("fifo", "100", 99.5, 0.0),
                row("fifo", "300", 120.25, 0.6),
                row("adaptive", "100", 99.5, 0.0),
                row("adaptive", "300", 195.0, 0.35),
            ],
        };
        let html = hockey_stick_section(&sweep);
        for id in ["hockey-goodput", "hockey-errors", "hockey"] {
            assert!(html.contains(&format!("id=\"{id}\"")), "missing {id}");
        }
        for text in [
            ">fifo<",
            ">adaptive<",
            ">offered<",
            "<td>120</td>",
            "<td>60.0 %</td>",
        ] {
            assert!(html.contains(text), "missing {text}: {html}");
        }
        let mut s = summary();
        s.sweep = Some(sweep.clone());
        let page = render_report(&s);
        assert!(page.contains("id=\"hockey-goodput\""));
        sweep.key = "hops".into();
        s.sweep = Some(sweep);
        let page = render_report(&s);
        assert!(
            !page.contains("id=\"hockey-goodput\""),
            "only for load.rate"
        );
    }

    /// The `<svg>` element with `id` in `html`.
    fn svg_with_id<'a>(html: &'a str, id: &str) -> &'a str {
        let at = html
            .find(&format!("<svg id=\"{id}\""))
            .unwrap_or_else(|| panic!("no {id}"));
        &html[at..at + html[at..].find("</svg>").expect("closed")]
    }

    /// The x pixel of the highest point (the mode) of series `name` in
    /// `panel`.
    fn mode_x(panel: &str, name: &str) -> f64 {
        panel_points(panel, name)
            .into_iter()
            .fold((f64::NAN, f64::INFINITY), |best, p| {
                if p.1 < best.1 { p } else { best }
            })
            .0
    }

    #[test]
    fn a_sweep_of_variants_shows_them_side_by_side_at_each_value() {
        let s = crate::analysis::testing::swept_summary(&["python", "cpp"], &["1", "8"]);
        let html = render_report(&s);
        assert!(html.contains("<h2>Side by side at each load.concurrency</h2>"));
        let chart = svg_with_id(&html, "sweep-distributions");
        let panels: Vec<&str> = chart.split("<g class=\"panel\"").skip(1).collect();
        assert_eq!(panels.len(), 2, "{chart}");
        for (panel, value) in panels.iter().zip(["1", "8"]) {
            assert!(
                panel.starts_with(&format!(" data-panel=\"load.concurrency = {value}\"")),
                "{panel}"
            );
            // One histogram per variant, each in its own colour in every
            // panel; cpp (ten times slower) peaks to the right of python.
            assert_eq!(stroke_of(panel, "python"), svg::PALETTE[0], "{panel}");
            assert_eq!(stroke_of(panel, "cpp"), svg::PALETTE[1], "{panel}");
            assert!(
                mode_x(panel, "cpp") > mode_x(panel, "python") + 20.0,
                "{panel}"
            );
        }
        // The spectra: one panel per value too, cpp above python.
        let spectra = svg_with_id(&html, "sweep-spectra");
        let panels_of_spectra: Vec<&str> = spectra.split("<g class=\"panel\"").skip(1).collect();
        assert_eq!(panels_of_spectra.len(), 2, "{spectra}");
        for panel in &panels_of_spectra {
            let top = |name: &str| {
                panel_points(panel, name)
                    .iter()
                    .map(|p| p.1)
                    .fold(f64::INFINITY, f64::min)
            };
            assert!(top("cpp") < top("python"), "{panel}");
        }
        // Shared axes: python at 8 (1 ms) peaks where cpp at 1 (1 ms) does,
        // one panel's width to the right.
        let width = mode_x(panels[1], "python") - mode_x(panels[0], "cpp");
        assert!(width > 300.0 && width < 400.0, "{width}");
        let table = &html[html
            .find("<table id=\"sweep-side-by-side\">")
            .expect("the table")..];
        assert!(
            table.starts_with(
                "<table id=\"sweep-side-by-side\"><tr><th>load.concurrency</th>\
                 <th>python p50 / p99</th><th>cpp p50 / p99</th></tr>\
                 <tr><td>1</td><td>100 us / 200 us</td><td>1.00 ms / 2.00 ms</td></tr>\
                 <tr><td>8</td><td>1.00 ms / 2.00 ms</td><td>10.0 ms / 20.0 ms</td></tr></table>"
            ),
            "{table}"
        );
        // Unchecked: the sweep table has no compounding columns.
        let sweep = &html[html.find("<table id=\"sweep\">").expect("the sweep table")..];
        let sweep = &sweep[..sweep.find("</table>").expect("closed")];
        assert!(sweep.contains("<th>p99.9</th></tr>") && !sweep.contains("slow measured"));
        // p50 beside p99 across the sweep, per variant.
        let percentiles = svg_with_id(&html, "sweep-p99");
        for name in ["python p50", "python p99", "cpp p50", "cpp p99"] {
            assert!(
                percentiles.contains(&format!("data-series=\"{name}\"")),
                "{name}"
            );
        }
    }

    #[test]
    fn a_sweep_of_one_variant_has_nothing_to_put_side_by_side() {
        let s = crate::analysis::testing::swept_summary(&["tailmesh"], &["1", "2", "4"]);
        let html = render_report(&s);
        assert!(html.contains("id=\"sweep-p99\""));
        for id in ["sweep-distributions", "sweep-spectra", "sweep-side-by-side"] {
            assert!(!html.contains(id), "{id}");
        }
        // Checked: the compounding columns, "-" where a point has none.
        let mut sweep = s.sweep.clone().expect("a sweep");
        sweep.rows[0].compounding = Some(crate::analysis::sweep::SweepCompounding {
            measured: 0.1,
            ci_lo: 0.08,
            ci_hi: 0.12,
            model: 0.1,
            declared_model: 0.1,
            verdict: crate::analysis::Verdict::Pass,
        });
        let html = sweep_section(&sweep);
        assert!(
            html.contains("<th>p99.9</th><th>slow measured</th>"),
            "{html}"
        );
        assert!(html.contains("<td class=\"pass\">pass</td></tr>"), "{html}");
        assert!(html.contains("<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td></tr>"));
    }

    /// The stroke colour of series `name`'s line in `panel`.
    fn stroke_of<'a>(panel: &'a str, name: &str) -> &'a str {
        let tag = &panel[panel
            .find(&format!("data-series=\"{name}\""))
            .expect("the series")..];
        let from = tag.find("stroke=\"").expect("a stroke") + "stroke=\"".len();
        &tag[from..from + tag[from..].find('"').expect("closed")]
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

    /// Open loop at 100/s: request `i` is meant for `i * 10 ms` and ends
    /// as `answer(i)` says, that long after.
    fn every_10ms(n: u64, answer: impl Fn(u64) -> (u64, Outcome)) -> Vec<RequestRecord> {
        (0..n)
            .map(|i| {
                let (after_ms, outcome) = answer(i);
                crate::analysis::testing::at(i, i * 10, after_ms, outcome)
            })
            .collect()
    }

    /// `v` with its intervals rebuilt from `records`.
    fn with(records: &[RequestRecord], mut v: VariantReport) -> VariantReport {
        let mut rebuild = crate::analysis::Rebuild::new(&v);
        for r in records {
            rebuild.record(r);
        }
        rebuild.finish(&mut v);
        v
    }

    /// The series of `records` with sending ended at `end` seconds.
    fn series_of(records: &[RequestRecord], end: f64) -> IntervalSeries {
        let mut recorder = IntervalRecorder::default();
        for r in records {
            recorder.record(r);
        }
        recorder.finish(end)
    }

    /// The summary's variant, planned for `duration_s` (count-stopped when
    /// `None`).
    fn planned(duration_s: Option<f64>) -> VariantReport {
        let mut v = summary().variants.remove(0);
        v.load.duration_s = duration_s;
        v
    }

    fn series<'a>(chart: &'a LineChart<'_>, name: &str) -> &'a [(f64, f64)] {
        chart
            .series
            .iter()
            .find(|s| s.name == name)
            .map_or(&[], |s| s.points.as_slice())
    }

    #[test]
    fn a_late_answer_after_the_phase_neither_widens_the_axis_nor_plots_a_collapse() {
        // 10 s at 100/s answered in 5 ms, but the last one comes at 10.3 s.
        let records = every_10ms(1000, |i| (if i == 999 { 310 } else { 5 }, Outcome::Ok));
        let variants = [with(&records, planned(Some(10.0)))];
        let all = throughputs(&variants);
        let chart = throughput_chart(&all, Vec::new());
        assert_eq!(chart.x_range, Some((0.0, 10.0)));
        let ok = series(&chart, "base ok");
        assert_eq!(ok.first().map(|p| p.0), Some(0.0));
        assert_eq!(ok.last().map(|p| p.0), Some(10.0));
        assert!(
            ok.iter().all(|&(x, rate)| x <= 10.0 && rate >= 95.0),
            "{ok:?}"
        );
        assert_eq!((all[0].1.late_ok, all[0].1.late_failed), (1, 0));
        let svg = svg::line_chart(&chart);
        assert!(
            svg.contains(">10</text>")
                && !svg.contains(">12</text>")
                && !svg.contains(">15</text>"),
            "{svg}"
        );
        let html = throughput_section(&variants);
        assert!(html.contains("(base: 1 ok, 0 failed)"), "{html}");
    }

    #[test]
    fn a_real_collapse_still_plots_as_zero() {
        // Sends go on for 10 s, but from 7 s on nothing answers: those
        // requests time out 2 s later.
        let records = every_10ms(1000, |i| {
            if i < 700 {
                (5, Outcome::Ok)
            } else {
                (2_000, Outcome::Timeout)
            }
        });
        let variants = [with(&records, planned(Some(10.0)))];
        let all = throughputs(&variants);
        let chart = throughput_chart(&all, Vec::new());
        assert_eq!(chart.x_range, Some((0.0, 10.0)));
        let ok = series(&chart, "base ok");
        // Two points per bucket: the last three buckets are the collapse.
        assert_eq!(ok.len(), 20, "{ok:?}");
        let (before, after) = ok.split_at(14);
        assert!(before.iter().all(|p| p.1 >= 95.0), "{ok:?}");
        assert!(after.iter().all(|p| p.1 == 0.0), "{ok:?}");
        assert_eq!((after[0].0, after[5].0), (7.0, 10.0));
        // The timeouts of sends from 7 s to 8 s land in the last bucket.
        assert_eq!(series(&chart, "base failed").last(), Some(&(10.0, 100.0)));
        assert_eq!((all[0].1.late_ok, all[0].1.late_failed), (0, 200));
    }

    #[test]
    fn a_partial_last_bucket_is_a_rate_over_the_time_it_covers() {
        assert_eq!(bucket_edges(2.6), vec![(0.0, 1.0), (1.0, 2.0), (2.0, 2.6)]);
        // A sliver joins the bucket before it.
        assert_eq!(bucket_edges(2.2), vec![(0.0, 1.0), (1.0, 2.2)]);
        assert_eq!(bucket_edges(0.3), vec![(0.0, 0.3)]);
        assert!(bucket_edges(0.0).is_empty() && bucket_edges(f64::NAN).is_empty());
        // A day-long run gets fewer, wider buckets.
        assert_eq!(bucket_edges(86_400.0).len(), 600);
        for end in [10.6f64, 10.2] {
            let records = every_10ms((end * 100.0).round() as u64, |_| (1, Outcome::Ok));
            let t = throughput(&series_of(&records, end));
            let last = t.buckets.last().copied();
            assert!(
                last.is_some_and(|b| b.end == end && (b.ok - 100.0).abs() < 1e-6),
                "{end}: {last:?}"
            );
        }
    }

    #[test]
    fn the_sending_window_is_the_plan_or_where_sending_stopped() {
        // The last of 300 sends every 10 ms.
        let last_send = 2.99;
        let end = |v: &VariantReport| sending_end(Some(&Window::of(v)), last_send);
        assert_eq!(end(&planned(Some(10.0))), 10.0);
        // Interrupted: the plan no longer holds.
        let mut v = planned(Some(10.0));
        v.interrupted = true;
        v.measured_s = 3.0;
        assert_eq!(end(&v), 3.0);
        // Stopped by count, open loop: the next intended send.
        let mut v = planned(None);
        v.measured_s = 3.0;
        assert_eq!(end(&v), 3.0);
        // Closed loop: its measured phase runs to the last answer (3.49 s);
        // sending stopped at the last send.
        v.load.mode = "closed".into();
        v.measured_s = 3.49;
        assert_eq!(end(&v), 2.99);
        assert_eq!(sending_end(None, last_send), 2.99);
    }

    /// The summary's variant (20 s) with b slow from 5 s to 10 s on both
    /// replicas and c's replica 1 losing packets over the same span, in
    /// three phases; the tail not back by the end.
    fn windowed() -> crate::analysis::Summary {
        use crate::analysis::{Recovery, RecoveryOutcome};
        use crate::output::phases::tests::{phase, window};
        let mut s = summary();
        let v = &mut s.variants[0];
        v.measured_s = 20.0;
        v.fault_windows = vec![
            window("b", 0, "slow", 5.0, Some(10.0)),
            window("b", 1, "slow", 5.0, Some(10.0)),
            window("c", 1, "net", 5.0, Some(10.0)),
        ];
        let mut during = phase("during", (5.0, 10.0), 2000, 90);
        during.faults = vec!["slow b".into(), "net c/1".into()];
        let mut after = phase("after", (10.0, 20.0), 4000, 60);
        after.recovery = Some(Recovery {
            after: vec!["slow b".into(), "net c/1".into()],
            baseline: Some("before".into()),
            baseline_p99_us: Some(12_000),
            band: 1.25,
            min_requests: 200,
            outcome: RecoveryOutcome::Recovered {
                recovery_s: 2.0,
                p99_us: 14_000,
            },
        });
        v.phases = vec![phase("before", (0.0, 5.0), 2000, 12), during, after];
        s
    }

    #[test]
    fn endpoint_changes_are_marked_once_and_tabled_with_the_kills() {
        use crate::analysis::{CallerEndpoints, EndpointEvent};
        let mut s = summary();
        assert!(!render_report(&s).contains("<h2>Endpoints</h2>"));
        let event = |at_s: f64, kind: &str| EndpointEvent {
            at_s,
            replica: 1,
            kind: kind.into(),
            reason: "connection ended".into(),
        };
        let caller = |name: &str, shift: f64| CallerEndpoints {
            caller: name.into(),
            hop: "b".into(),
            replicas: vec![Default::default(), Default::default()],
            events: vec![
                event(1.0 + shift, "transient_failure"),
                event(2.0 + shift, "ready"),
            ],
            dropped: 0,
        };
        let v = &mut s.variants[0];
        // Two callers see each change 10 ms apart: one mark each.
        v.endpoints = vec![caller("a/0", 0.0), caller("a/1", 0.01)];
        v.kills = vec![crate::analysis::testing::kill_of_b1(&[("a/0", 0)])];
        let marks = endpoint_marks(&s.variants[0]);
        let labels: Vec<(&str, f64)> = marks.iter().map(|m| (m.label.as_str(), m.from)).collect();
        assert_eq!(labels, [("b/1 TRANSIENT_FAILURE", 1.0), ("b/1 READY", 2.0)]);
        assert!(marks.iter().all(|m| m.kind == BandKind::Mark));
        let html = render_report(&s);
        let at = html
            .find("id=\"latency-over-time-base\"")
            .expect("the chart");
        let chart = &html[at..at + html[at..].find("</svg>").expect("closed")];
        assert!(
            chart.contains("<title>b/1 TRANSIENT_FAILURE</title>"),
            "{chart}"
        );
        assert!(html.contains("<table id=\"kills\">"));
        assert!(html.contains("<td>b/1</td><td>1.00 s (planned 1.00 s)</td>"));
        let table = &html[html.find("<table id=\"endpoints\">").expect("the table")..];
        assert_eq!(
            table[..table.find("</table>").expect("closed")]
                .matches("<tr><td>base</td>")
                .count(),
            4
        );
        assert!(table.contains("transient_failure 1.00 s (connection ended)"));
    }

    /// A ramp of 200/s, 400/s, 800/s, 5 s each, the knee at 800/s.
    fn stepped() -> crate::analysis::Summary {
        use crate::output::phases::tests::phase;
        let mut s = summary();
        let v = &mut s.variants[0];
        v.measured_s = 15.0;
        v.phases = [(200.0, 10), (400.0, 11), (800.0, 45)]
            .iter()
            .enumerate()
            .map(|(i, &(rate, p99))| {
                let from = i as f64 * 5.0;
                let mut p = phase(&format!("step {}", i + 1), (from, from + 5.0), 100, p99);
                p.offered_rate = Some(rate);
                p.ok_rate = rate.min(500.0);
                p
            })
            .collect();
        v.knee = Some(crate::analysis::Knee {
            step: "step 3".into(),
            rate: 800.0,
            reason: "p99 45ms is 4.1 times step 2's 11ms".into(),
        });
        s
    }

    /// The `<svg>` with `id` in `html`.
    fn chart<'a>(html: &'a str, id: &str) -> &'a str {
        let at = html
            .find(&format!("<svg id=\"{id}\""))
            .unwrap_or_else(|| panic!("no chart {id}"));
        &html[at..at + html[at..].find("</svg>").expect("closed")]
    }

    /// Text with its tags taken out.
    fn text_of(html: &str) -> String {
        let mut out = String::new();
        let mut in_tag = false;
        for c in html.chars() {
            match c {
                '<' => in_tag = true,
                '>' => in_tag = false,
                c if !in_tag => out.push(c),
                _ => {}
            }
        }
        out
    }

    /// The cells of `<table id="{id}">`, row by row, as text.
    fn table_rows(html: &str, id: &str) -> Vec<Vec<String>> {
        let at = html
            .find(&format!("<table id=\"{id}\">"))
            .unwrap_or_else(|| panic!("no table {id}"));
        let table = &html[at..at + html[at..].find("</table>").expect("closed")];
        table
            .split("<tr>")
            .skip(1)
            .map(|row| {
                row.split("</t")
                    .filter_map(|cell| cell.rsplit_once("<t").map(|(_, c)| c))
                    .filter_map(|cell| cell.split_once('>').map(|(_, c)| text_of(c)))
                    .collect()
            })
            .collect()
    }

    /// The (label, from px, width px) of each band rect of `svg`.
    fn bands_in(svg: &str) -> Vec<(String, f64, f64)> {
        svg.split("<rect class=\"band\"")
            .skip(1)
            .map(|tag| {
                let num = |n: &str| {
                    let key = format!(" {n}=\"");
                    let from = tag.find(&key).expect("attribute") + key.len();
                    tag[from..from + tag[from..].find('"').expect("closed")]
                        .parse::<f64>()
                        .expect("a number")
                };
                let label = tag
                    .split_once("<title>")
                    .and_then(|(_, t)| t.split_once("</title>"))
                    .map_or(String::new(), |(t, _)| t.to_owned());
                (label, num("x"), num("width"))
            })
            .collect()
    }

    #[test]
    fn fault_windows_band_latency_and_throughput_over_time() {
        let html = render_report(&windowed());
        for id in ["latency-over-time-base", "throughput"] {
            let svg = chart(&html, id);
            let bands = bands_in(svg);
            assert_eq!(bands.len(), 1, "{id}: {svg}");
            // One window over 5..10 s: both faults, one band.
            assert_eq!(bands[0].0, "slow b, net c/1", "{id}");
            assert!(
                svg.contains(">slow b, net c/1</text>"),
                "{id} labels it: {svg}"
            );
        }
        // On the latency chart's 0..20 s axis (the intervals span it).
        let v = &windowed().variants[0];
        let chart = latency_over_time_chart(v, "c", bands_of(v));
        assert_eq!(chart.bands.len(), 1);
        assert_eq!((chart.bands[0].from, chart.bands[0].to), (5.0, 10.0));
        assert_eq!(chart.bands[0].kind, BandKind::Window);
    }

    #[test]
    fn each_phased_variant_gets_a_table_with_recovery_and_compounding() {
        let s = windowed();
        let html = render_report(&s);
        let rows = table_rows(&html, "phases-base");
        assert_eq!(rows.len(), 4, "{rows:?}");
        assert_eq!(rows[0][0], "phase");
        assert_eq!(rows[0].last().map(String::as_str), Some("compounding"));
        assert_eq!(
            rows[2][..10],
            [
                "during",
                "5-10",
                "slow b, net c/1",
                "2000",
                "400",
                "2.00 ms",
                "90.0 ms",
                "180 ms",
                "0",
                "-"
            ]
        );
        assert_eq!(rows[3][9], "2.00 s");
        assert!(
            html.contains("<td title=\"p99 within 1.25 x before&#39;s 12.0 ms, over 200 ok requests\">2.00 s</td>"),
            "the rule as the tooltip: {html}"
        );
        // The hand-made phases have no check: a dash, not a verdict.
        assert_eq!(rows[1][10], "-");
        let mut s = s;
        s.variants[0].phases[1].compounding = s.variants[0].compounding.clone();
        let c = s.variants[0].compounding.clone().expect("checked");
        let rows = table_rows(&render_report(&s), "phases-base");
        assert_eq!(
            rows[2][10],
            format!(
                "{} vs {}: {}",
                tailmesh_units::percent(c.measured),
                tailmesh_units::percent(c.model),
                c.verdict.as_str()
            )
        );
        // No check asked for: no column.
        s.variants[0].compounding = None;
        let rows = table_rows(&render_report(&s), "phases-base");
        assert_eq!(rows[0].len(), 10, "{rows:?}");
    }

    #[test]
    fn a_ramp_is_drawn_against_offered_load_with_its_knee() {
        let s = stepped();
        let html = render_report(&s);
        // The steps tint the time charts, labelled with their rates.
        let over_time = chart(&html, "latency-over-time-base");
        let labels: Vec<String> = bands_in(over_time).into_iter().map(|b| b.0).collect();
        assert_eq!(labels, ["200/s", "400/s", "800/s"], "{over_time}");
        assert!(html.contains("<p id=\"knee-base\">knee: step 3 (800/s): p99 45ms is 4.1 times step 2&#39;s 11ms</p>"), "{html}");
        let rows = table_rows(&html, "phases-base");
        let load: Vec<&str> = rows.iter().skip(1).map(|r| r[2].as_str()).collect();
        assert_eq!(load, ["200/s", "400/s", "800/s"]);
        for id in ["steps-latency-base", "steps-goodput-base"] {
            let svg = chart(&html, id);
            assert_eq!(svg.matches("class=\"band-mark\"").count(), 1, "{id}");
            assert!(svg.contains(">knee: step 3</text>"), "{id}: {svg}");
        }
        let v = &s.variants[0];
        let (latency, goodput) = step_charts(v, "l", "g");
        assert_eq!(
            series(&latency, "p99"),
            [(200.0, 10_000.0), (400.0, 11_000.0), (800.0, 45_000.0)]
        );
        assert_eq!(series(&latency, "p50").len(), 3);
        assert_eq!(
            series(&goodput, "goodput"),
            [(200.0, 200.0), (400.0, 400.0), (800.0, 500.0)]
        );
        assert_eq!(
            series(&goodput, "offered"),
            [(200.0, 200.0), (400.0, 400.0), (800.0, 800.0)]
        );
        assert_eq!(latency.bands[0].from, 800.0);
        assert_eq!(latency.bands[0].kind, BandKind::Mark);
        // Without a knee: nothing marked.
        let mut s = s;
        s.variants[0].knee = None;
        let html = render_report(&s);
        assert!(!html.contains("band-mark") && !html.contains("knee-base"));
    }

    #[test]
    fn variants_with_different_schedules_name_theirs_on_the_shared_chart() {
        let mut s = windowed();
        let mut other = s.variants[0].clone();
        other.name = "pull".into();
        // The same windows: the bands as they are.
        s.variants.push(other.clone());
        let same = shared_bands(&s.variants);
        assert_eq!(same, bands_of(&s.variants[0]));
        // Pull's window later: its phases say so.
        for w in &mut other.fault_windows {
            w.start_s = 8.0;
        }
        other.phases[0].end_s = 8.0;
        other.phases[1].start_s = 8.0;
        s.variants[1] = other;
        let labels: Vec<String> = shared_bands(&s.variants)
            .into_iter()
            .map(|b| b.label)
            .collect();
        assert_eq!(labels, ["base: slow b, net c/1", "pull: slow b, net c/1"]);
        let html = render_report(&s);
        assert!(html.contains("id=\"phases-pull\""), "a table each");
    }

    #[test]
    fn without_phases_the_page_has_no_phase_section_and_no_bands() {
        let html = render_report(&summary());
        for absent in [
            "<h2>Phases",
            "id=\"phases-",
            "class=\"band",
            "steps-latency",
            "band-label",
            "Shaded: fault windows",
        ] {
            assert!(!html.contains(absent), "{absent} in {html}");
        }
        // Beside a variant with phases, one without keeps its chart bare
        // and gets no table.
        let mut s = windowed();
        let mut plain = summary().variants.remove(0);
        plain.name = "pull".into();
        s.variants.push(plain);
        let html = render_report(&s);
        assert_eq!(bands_in(chart(&html, "latency-over-time-base")).len(), 1);
        assert!(bands_in(chart(&html, "latency-over-time-pull")).is_empty());
        assert!(html.contains("id=\"phases-base\"") && !html.contains("id=\"phases-pull\""));
        assert_eq!(html.matches("<h3>").count(), 1, "{html}");
    }

    #[test]
    fn spectrum_ticks_read_as_percentiles() {
        assert_eq!(spectrum_tick(10.0), "90%");
        assert_eq!(spectrum_tick(1000.0), "99.9%");
        assert_eq!(spectrum_tick(1.0), "0%");
    }
}
