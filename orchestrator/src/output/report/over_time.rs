//! Latency over time per variant with fault windows, kills, load steps
//! and endpoint changes as bands, and the table of kills and endpoint
//! events.

use std::fmt::Write;

use tailmesh_units::micros;

use crate::analysis::VariantReport;
use crate::output::{
    phases,
    svg::{self, Band, BandKind, Frame, LineChart, Scale, Series, escape},
};

use super::plain;

/// Latency over time: one chart per variant (three lines for each of
/// several variants in one chart cannot be read), p50, p99 and p99.9 of
/// each interval's ok requests, by intended send time.
pub(super) fn latency_over_time_section(variants: &[VariantReport]) -> String {
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
pub(super) fn endpoint_marks(v: &VariantReport) -> Vec<Band> {
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
pub(super) fn endpoint_table(variants: &[VariantReport]) -> String {
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
pub(super) fn bands_of(v: &VariantReport) -> Vec<Band> {
    let mut bands = phases::step_bands(v);
    bands.extend(phases::fault_bands(v));
    bands
}

/// The bands of a chart all `variants` share: each one's own when they
/// agree; otherwise each labelled with its variant's name, identical
/// spans sharing a band.
pub(super) fn shared_bands(variants: &[VariantReport]) -> Vec<Band> {
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

/// `v`'s latency over time, with `bands` shaded under the lines.
pub(super) fn latency_over_time_chart<'a>(
    v: &VariantReport,
    id: &'a str,
    bands: Vec<Band>,
) -> LineChart<'a> {
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
