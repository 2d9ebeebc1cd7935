//! `[report]`: the histogram and the interval of latency over time, and
//! whether a run's interval histograms fit their memory budget.

use std::time::Duration;

use crate::scenario::error::Problems;
use crate::scenario::model::{INTERVAL_GRACE, Load, LoadMode, Report, Stop};
use crate::scenario::read::Section;

use super::load::load_length;

const REPORT_KEYS: &[&str] = &["histogram", "interval"];

/// Shortest `[report] interval`.
const MIN_REPORT_INTERVAL: Duration = Duration::from_millis(10);

/// The most memory a variant's open latency intervals may hold, bytes.
const INTERVAL_MEMORY_BUDGET: f64 = 128.0 * 1024.0 * 1024.0;

/// Sets of interval histograms held besides the open intervals: the .hlog
/// writer's queue (4), the one it writes, and the chart's.
const INTERVAL_SETS_BESIDES: f64 = 6.0;

/// The `[report]` table, with the place of its `interval` value (for the
/// checks that need the load and the hops).
pub(super) fn report(s: &Section<'_>, p: &mut Problems) -> Option<(Report, Option<usize>)> {
    s.unknown_keys(p, REPORT_KEYS);
    let histogram = match s.get("histogram") {
        None => Some(false),
        Some(_) => s.boolean(p, "histogram"),
    };
    let interval = match s.duration(p, "interval") {
        None if s.get("interval").is_none() => Some((Report::default().interval, None)),
        None => None,
        Some((d, entry)) if d < MIN_REPORT_INTERVAL => {
            s.report(
                p,
                &entry.node.span,
                format!(
                    "report.interval must be at least {}, got {}",
                    humantime::format_duration(MIN_REPORT_INTERVAL),
                    humantime::format_duration(d)
                ),
            );
            None
        }
        Some((d, entry)) => Some((d, Some(entry.node.span.start))),
    };
    let (interval, at) = interval?;
    Some((
        Report {
            histogram: histogram?,
            interval,
        },
        at,
    ))
}

/// Checks a written `[report] interval` (at `at`) against the load: no
/// longer than the run (when its length is known up front), and the
/// histograms of the intervals open at once within
/// [`INTERVAL_MEMORY_BUDGET`]. The default is not checked: a run shorter
/// than it has one interval, as long as the run.
pub(super) fn intervals_fit(
    p: &mut Problems,
    report: &Report,
    at: Option<usize>,
    load: &Load,
    hops: usize,
) {
    let Some(at) = at else {
        return;
    };
    let width = report.interval;
    let show = |d: Duration| humantime::format_duration(d).to_string();
    // A closed loop that stops by count has no length up front.
    let length = load_length(load).map(|d| {
        let what = match (&load.stop, &load.mode) {
            (Stop::Requests(n), LoadMode::Open { rate, .. }) => {
                format!("about {:.3}s: {n} requests at {rate}/s", d.as_secs_f64())
            }
            _ => format!("{} of load after warmup", show(d)),
        };
        (d, what)
    });
    if let Some((length, what)) = length
        && width > length
    {
        p.at(
            at,
            format!(
                "report.interval ({}) is longer than the run ({what})",
                show(width)
            ),
        );
        return;
    }
    let bytes = interval_memory(width, load.timeout, hops);
    if bytes <= INTERVAL_MEMORY_BUDGET {
        return;
    }
    // The shortest interval whose open intervals fit.
    let set = interval_set_bytes(load.timeout, hops);
    let sets = (INTERVAL_MEMORY_BUDGET / set - INTERVAL_SETS_BESIDES - 1.0).floor();
    let settle = 2 * load.timeout + INTERVAL_GRACE;
    let advice = if sets >= 1.0 {
        let shortest = settle.as_secs_f64() / sets;
        // Rounded up to a whole millisecond that fits (past float error).
        let mut ms = (shortest * 1e3).ceil() as u64;
        while interval_memory(Duration::from_millis(ms), load.timeout, hops)
            > INTERVAL_MEMORY_BUDGET
        {
            ms += 1;
        }
        format!(
            "use an interval of at least {}",
            show(Duration::from_millis(ms))
        )
    } else {
        "lower the timeout or the number of hops".to_owned()
    };
    p.at(
        at,
        format!(
            "report.interval = {} with timeout {} and {hops} hops keeps up to {:.0} MiB of \
             interval histograms (at most {:.0} MiB); {advice}",
            show(width),
            show(load.timeout),
            bytes / f64::from(1u32 << 20),
            INTERVAL_MEMORY_BUDGET / f64::from(1u32 << 20),
        ),
    );
}

/// Bytes of latency histograms a variant's intervals hold at most, about:
/// every interval a request may still land in (the timeout,
/// [`INTERVAL_GRACE`] and, for a late generator, up to the timeout again
/// past its start) and the sets held besides, each an end-to-end histogram
/// and one per hop (`u32` counts, 3 significant digits, grown to the
/// timeout's value in µs).
fn interval_memory(width: Duration, timeout: Duration, hops: usize) -> f64 {
    let settle = 2 * timeout + INTERVAL_GRACE;
    let open = (settle.as_secs_f64() / width.as_secs_f64().max(1e-9)).ceil() + 1.0;
    (open + INTERVAL_SETS_BESIDES) * interval_set_bytes(timeout, hops)
}

/// Bytes of one interval's histograms: end to end and one per hop.
fn interval_set_bytes(timeout: Duration, hops: usize) -> f64 {
    let settle = timeout + INTERVAL_GRACE;
    let max_us = u64::try_from(settle.as_micros()).unwrap_or(u64::MAX).max(2);
    let counts =
        hdrhistogram::Histogram::<u32>::new_with_max(max_us, 3).map_or(0, |h| h.distinct_values());
    (hops as f64 + 1.0) * counts as f64 * 4.0
}
