//! Throughput over time: ok, failed and timed-out requests per bucket of
//! a width chosen from the run's length.

use std::fmt::Write;

use crate::analysis::{IntervalSeries, VariantReport};
use crate::output::svg::{self, Band, Frame, LineChart, Scale, Series, escape};

use super::over_time::shared_bands;
use super::plain;

/// The width of a throughput bucket, seconds (wider for runs so long that
/// one-second buckets would crowd the chart).
fn bucket_width(end_s: f64) -> f64 {
    const MOST_BUCKETS: f64 = 600.0;
    (end_s / MOST_BUCKETS).ceil().max(1.0)
}

/// One throughput bucket: seconds into the measured phase, and answers per
/// second of the time it covers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct RateBucket {
    pub(super) start: f64,
    pub(super) end: f64,
    pub(super) ok: f64,
    pub(super) failed: f64,
}

/// A variant's answers over its sending window.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Throughput {
    /// Buckets covering `[0, end]` without gaps.
    pub(super) buckets: Vec<RateBucket>,
    /// Where the window ends (where sending ended).
    pub(super) end: f64,
    /// Ok answers that arrived after `end`.
    pub(super) late_ok: u64,
    /// Errors and timeouts that arrived after `end`.
    pub(super) late_failed: u64,
}

/// Bucket edges over `[0, end]`, one-second series' own.
#[cfg(test)]
pub(super) fn bucket_edges(end: f64) -> Vec<(f64, f64)> {
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
pub(super) fn throughput(series: &IntervalSeries) -> Throughput {
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
pub(super) fn throughputs(variants: &[VariantReport]) -> Vec<(String, Throughput)> {
    variants
        .iter()
        .map(|v| (v.name.clone(), throughput(&v.intervals)))
        .collect()
}

/// The heading, the chart and a note on the answers left out.
pub(super) fn throughput_section(variants: &[VariantReport]) -> String {
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
pub(super) fn throughput_chart(
    all: &[(String, Throughput)],
    bands: Vec<Band>,
) -> LineChart<'static> {
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
