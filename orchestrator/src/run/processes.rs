//! Each process the run started, sampled once a second while the load
//! runs: its CPU time (user plus system, from `/proc/<pid>/stat`) and its
//! resident memory (VmRSS, from `/proc/<pid>/status`), at whole seconds
//! of the measured clock; and with them the broker's topics, each one's
//! depth and tasks in flight. One source for `processes.csv` and
//! `queues.csv`, the cases' per-service metrics and the live metrics.

use std::time::Duration;

use tailmesh_analysis::record::{ProcessSample, QueueSample};
use tailmesh_services::broker::TopicStats;

use crate::launcher::AnyLauncher;

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's USER_HZ,
/// 100 on every architecture it runs on.
const TICKS_PER_S: f64 = 100.0;

/// The samples, and when the next is due.
pub(crate) struct ProcessWatch {
    warmup: Duration,
    /// The next sample's time since the load's origin.
    next: Duration,
    samples: Vec<ProcessSample>,
    queues: Vec<QueueSample>,
}

impl ProcessWatch {
    /// Samples at every whole second of the measured clock from the
    /// load's origin (warmup included).
    pub(crate) fn new(warmup: Duration) -> Self {
        // The first whole second at or after -warmup, from the origin.
        let skip = warmup.as_secs_f64().fract();
        Self {
            warmup,
            next: Duration::from_secs_f64(skip),
            samples: Vec::new(),
            queues: Vec::new(),
        }
    }

    /// When the next sample is due, since the origin.
    pub(crate) fn next_change(&self) -> Duration {
        self.next
    }

    /// Whether a sample is due at `since_origin`: its time on the measured
    /// clock, the next one scheduled a whole second later.
    pub(crate) fn due(&mut self, since_origin: Duration) -> Option<f64> {
        if since_origin < self.next {
            return None;
        }
        let t_s = self.next.as_secs_f64() - self.warmup.as_secs_f64();
        while self.next <= since_origin {
            self.next += Duration::from_secs(1);
        }
        Some((t_s * 1e3).round() / 1e3)
    }

    /// Samples every process still running, as of `t_s`; returns the new
    /// samples.
    pub(crate) fn sample(&mut self, t_s: f64, launcher: &AnyLauncher) -> &[ProcessSample] {
        let first = self.samples.len();
        for child in launcher.running() {
            if let Some((cpu_s, rss_bytes)) = read(child.pid) {
                self.samples.push(ProcessSample {
                    t_s,
                    process: child.name.clone(),
                    pid: child.pid,
                    cpu_s,
                    rss_bytes,
                });
            }
        }
        &self.samples[first..]
    }

    /// Records the broker's topics as of `t_s`; returns the new samples.
    pub(crate) fn queues(&mut self, t_s: f64, stats: &[TopicStats]) -> &[QueueSample] {
        let first = self.queues.len();
        self.queues.extend(stats.iter().map(|s| QueueSample {
            t_s,
            topic: s.topic.clone(),
            depth: s.depth,
            in_flight: s.in_flight,
        }));
        &self.queues[first..]
    }

    /// The processes' samples and the queues'.
    pub(crate) fn finish(self) -> (Vec<ProcessSample>, Vec<QueueSample>) {
        (self.samples, self.queues)
    }
}

/// A process's CPU seconds and resident bytes now.
fn read(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((
        cpu_ticks(&stat)? as f64 / TICKS_PER_S,
        crate::launcher::status_bytes(&status, "VmRSS")?,
    ))
}

/// utime + stime of a `/proc/<pid>/stat` line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name is in parentheses and may hold spaces or ')'.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // After the name: state(3) ... utime(14) stime(15).
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_read_from_proc_files() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 5 0 0";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(cpu_ticks("42 (x"), None);
        let status = "Name:\ttailmesh\nVmHWM:\t  9000 kB\nVmRSS:\t  8192 kB\n";
        assert_eq!(
            crate::launcher::status_bytes(status, "VmRSS"),
            Some(8192 * 1024)
        );
        assert_eq!(
            crate::launcher::status_bytes(status, "VmHWM"),
            Some(9000 * 1024)
        );
        assert_eq!(crate::launcher::status_bytes("Name:\tx\n", "VmRSS"), None);
        let me = read(std::process::id());
        assert!(me.is_some_and(|(cpu, rss)| cpu >= 0.0 && rss > 0), "{me:?}");
    }

    #[test]
    fn samples_fall_on_whole_seconds_of_the_measured_clock() {
        let mut w = ProcessWatch::new(Duration::from_millis(1_500));
        // Due at 0.5 s from the origin: -1 on the measured clock.
        assert_eq!(w.next_change(), Duration::from_millis(500));
        assert_eq!(w.due(Duration::from_millis(400)), None);
        assert_eq!(w.due(Duration::from_millis(600)), Some(-1.0));
        // Late: one sample for the seconds missed, at the first of them.
        assert_eq!(w.due(Duration::from_millis(2_600)), Some(0.0));
        assert_eq!(w.next_change(), Duration::from_millis(3_500));
        assert_eq!(w.due(Duration::from_millis(3_500)), Some(2.0));
    }
}
