//! What a running load shows: elapsed time, requests sent, the rate and
//! the p99 so far. On a terminal, the progress bar's line is redrawn a few
//! times a second; elsewhere (a log file, CI), one line every
//! [`LINE_EVERY`], so a long run neither floods its output nor goes silent.

use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use tokio::time::Instant;

use crate::record::{Outcome, RequestRecord};
use crate::scenario::Stop;

/// How often a non-terminal output gets a progress line.
pub(crate) const LINE_EVERY: Duration = Duration::from_secs(10);
/// How often the bar's numbers are recomputed (its drawing is rate-limited
/// by the bar itself).
const BAR_EVERY: Duration = Duration::from_millis(250);

/// Where progress goes.
pub(crate) enum View {
    /// The terminal's progress bar: position and message updated in place.
    Bar(ProgressBar),
    /// One line per [`LINE_EVERY`] on standard error, naming the variant.
    Lines {
        /// The variant's name.
        variant: String,
    },
}

/// Progress of one variant's load: what was sent, and the latency of the
/// ok requests so far in a histogram (bounded: no sample is kept).
pub(crate) struct Progress {
    view: View,
    stop_at: Stop,
    latency_us: Histogram<u64>,
    next: Option<Instant>,
}

impl Progress {
    /// Progress shown in `view` for a load that stops at `stop_at`.
    pub(crate) fn new(view: View, stop_at: Stop) -> Progress {
        Progress {
            view,
            stop_at,
            // Auto-resizing, 3 significant digits: a few KiB however long the run.
            latency_us: Histogram::new(3).expect("3 significant digits is a valid histogram"),
            next: None,
        }
    }

    /// Counts one completed request of the measured phase.
    pub(crate) fn record(&mut self, r: &RequestRecord) {
        if r.outcome == Outcome::Ok {
            let us = u64::try_from(r.latency().as_micros()).unwrap_or(u64::MAX);
            // `record` grows the histogram to the value; `saturating_record`
            // would clamp it to the range the histogram has so far (2 us
            // when new). It fails only past what a usize counts.
            if self.latency_us.record(us).is_err() {
                self.latency_us.saturating_record(us);
            }
        }
    }

    /// `sent` measured requests so far, `elapsed` into the measured phase.
    pub(crate) fn tick(&mut self, sent: u64, elapsed: Duration) {
        let now = Instant::now();
        let every = match &self.view {
            View::Bar(bar) => {
                bar.set_position(match self.stop_at {
                    Stop::Requests(_) => sent,
                    Stop::Duration(_) => u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                });
                BAR_EVERY
            }
            View::Lines { .. } => LINE_EVERY,
        };
        match self.next {
            // The first line comes after a full period, not at once.
            None => {
                self.next = Some(now + every);
                if matches!(self.view, View::Lines { .. }) {
                    return;
                }
            }
            Some(next) if now < next => return,
            Some(_) => self.next = Some(now + every),
        }
        let line = self.line(sent, elapsed);
        match &self.view {
            View::Bar(bar) => bar.set_message(line),
            View::Lines { variant } => crate::tell!("variant {variant}: {line}"),
        }
    }

    /// "12.0 s, 48012 sent, 4001/s, p99 so far 1.23 ms".
    fn line(&self, sent: u64, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64();
        let rate = if secs > 0.0 { sent as f64 / secs } else { 0.0 };
        let p99 = if self.latency_us.is_empty() {
            "-".to_owned()
        } else {
            tailmesh_units::micros(self.latency_us.value_at_quantile(0.99) as f64)
        };
        let elapsed = tailmesh_units::duration(elapsed);
        format!("{elapsed}, {sent} sent, {rate:.0}/s, p99 so far {p99}")
    }

    /// Clears the bar (lines stay where they are).
    pub(crate) fn finish(&self) {
        if let View::Bar(bar) = &self.view {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(latency_ms: u64) -> RequestRecord {
        RequestRecord {
            id: 0,
            intended: Duration::ZERO,
            start: Duration::ZERO,
            end: Duration::from_millis(latency_ms),
            outcome: Outcome::Ok,
            path: vec![],
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    #[test]
    fn the_line_says_elapsed_sent_rate_and_p99() {
        let mut p = Progress::new(
            View::Lines {
                variant: "base".into(),
            },
            Stop::Requests(1000),
        );
        assert_eq!(p.line(0, Duration::ZERO), "0 s, 0 sent, 0/s, p99 so far -");
        for i in 0..100 {
            p.record(&ok(if i == 99 { 50 } else { 2 }));
        }
        // The 99th of 100 is 2 ms; failures are not timed.
        p.record(&RequestRecord {
            outcome: Outcome::Timeout,
            ..ok(900)
        });
        assert_eq!(
            p.line(500, Duration::from_secs(2)),
            "2.00 s, 500 sent, 250/s, p99 so far 2.00 ms"
        );
    }

    #[test]
    fn the_p99_so_far_is_the_latency_however_long() {
        let mut p = Progress::new(
            View::Lines {
                variant: "base".into(),
            },
            Stop::Requests(1000),
        );
        for _ in 0..100 {
            p.record(&ok(250));
        }
        let line = p.line(100, Duration::from_secs(1));
        let ms: f64 = line
            .rsplit("p99 so far ")
            .next()
            .and_then(|v| v.strip_suffix(" ms"))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("a p99 in ms: {line}"));
        // 3 significant digits.
        assert!((ms - 250.0).abs() <= 0.25, "{line}");
    }

    #[tokio::test(start_paused = true)]
    async fn lines_come_one_per_period_however_often_it_ticks() {
        let bar = ProgressBar::hidden();
        bar.set_length(10_000);
        let mut p = Progress::new(View::Bar(bar.clone()), Stop::Requests(10_000));
        p.record(&ok(3));
        p.tick(1, Duration::from_millis(1));
        assert_eq!(bar.position(), 1);
        let first = bar.message();
        assert!(first.contains("1 sent"), "{first}");
        // Ticks within the period move the bar but leave its numbers.
        p.tick(2, Duration::from_millis(2));
        assert_eq!((bar.position(), bar.message()), (2, first.clone()));
        tokio::time::advance(BAR_EVERY).await;
        p.tick(3, Duration::from_millis(300));
        assert!(bar.message().contains("3 sent"), "{}", bar.message());
    }
}
