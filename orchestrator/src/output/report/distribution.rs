//! The latency distribution of every variant overlaid (share per log
//! bucket) and the percentile spectrum on HdrHistogram's 1/(1-q) axis.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::analysis::VariantReport;
use crate::output::svg::{LineChart, Series};

use super::{HISTOGRAM, SPECTRUM};

pub(super) fn histogram_chart(variants: &[VariantReport]) -> LineChart<'static> {
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
pub(super) fn log_buckets(h: &Histogram<u64>) -> Vec<(f64, f64)> {
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

pub(super) fn spectrum_chart(variants: &[VariantReport]) -> LineChart<'static> {
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
pub(super) fn spectrum_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
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
