//! The instrument watching itself: while a variant's load runs, a thread
//! measures how late its own timed sleeps wake (the timer's wake-up error),
//! samples the machine's runnable tasks, load average and CPU pressure, and
//! at the end reads the CPU steal and the generator thread's involuntary
//! context switches. The verdict uses it to tell a busy machine from the
//! mesh.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use crate::analysis::{
    Percentiles,
    attribution::MachineState,
    stats::{new_histogram, record_us},
};

/// The probe sleeps this long, every [`PROBE_EVERY`].
const PROBE_SLEEP: Duration = Duration::from_millis(1);
/// How often the probe sleeps.
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How often the machine's counters are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Busy: the probe's wake-up error p99 is at least this (µs).
pub(crate) const BUSY_TIMER_ERROR_US: u64 = 1_000;
/// Busy: on average at least this many runnable tasks per CPU besides the
/// watcher (every CPU taken).
pub(crate) const BUSY_RUNNABLE_PER_CPU: f64 = 1.0;
/// Busy: some task waited for a CPU at least this share of the time
/// (Linux pressure stall information, `/proc/pressure/cpu`).
pub(crate) const BUSY_CPU_PRESSURE: f64 = 0.5;
/// Busy: the hypervisor took at least this share of CPU time (steal).
pub(crate) const BUSY_STEAL: f64 = 0.05;
/// Busy: the 1-minute load average reached this many times the CPUs.
pub(crate) const BUSY_LOAD_PER_CPU: f64 = 1.5;

/// What the self-watch saw during one variant's load (summary.json's
/// `variants[].instrument`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstrumentReport {
    /// How late the watcher's 1 ms sleeps woke, µs: the machine's
    /// scheduling delay as the load generator meets it.
    pub timer_error: Percentiles,
    /// The worst one-second window's p99 of that error, µs.
    pub timer_error_worst_second_us: u64,
    /// CPUs available.
    pub cpus: usize,
    /// Mean runnable tasks on the machine besides the watcher.
    pub runnable_mean: Option<f64>,
    /// 1-minute load average at the start, the end, and its largest sample.
    pub load_average: Option<[f64; 3]>,
    /// Share of the time some task waited for a CPU (`/proc/pressure/cpu`),
    /// over the load; absent where the kernel does not report it.
    pub cpu_pressure: Option<f64>,
    /// Share of CPU time stolen by the hypervisor, over the load; absent
    /// where the kernel does not report it.
    pub steal: Option<f64>,
    /// Involuntary context switches of the load generator's thread.
    pub involuntary_switches: Option<u64>,
    /// The same per second of load.
    pub involuntary_switches_per_s: Option<f64>,
    /// Whether any of the busy bounds was crossed.
    pub busy: bool,
    /// Each bound crossed, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub busy_reasons: Vec<String>,
}

impl InstrumentReport {
    /// What the verdict needs of it.
    pub fn machine(&self) -> MachineState {
        MachineState {
            busy: self.busy,
            reasons: self.busy_reasons.clone(),
        }
    }

    /// A warning for the terminal when the machine was busy or the timer
    /// degraded during the load, else `None`.
    pub fn warning(&self) -> Option<String> {
        if self.busy {
            Some(format!(
                "the machine was busy while the load ran ({}): requests it made slow are \
                 the machine's, not the mesh's",
                self.busy_reasons.join(", ")
            ))
        } else if self.timer_error_worst_second_us >= BUSY_TIMER_ERROR_US {
            Some(format!(
                "the timer's wake-up error reached {} (p99 over one second) during the load",
                ms(self.timer_error_worst_second_us)
            ))
        } else {
            None
        }
    }
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1e3)
}

/// Judges the measurements against the busy bounds.
fn judge(report: &mut InstrumentReport) {
    let cpus = report.cpus.max(1) as f64;
    let mut reasons = Vec::new();
    if report.timer_error.p99_us >= BUSY_TIMER_ERROR_US {
        reasons.push(format!(
            "timer wake-up error p99 {}",
            ms(report.timer_error.p99_us)
        ));
    }
    if let Some(r) = report
        .runnable_mean
        .filter(|r| *r >= BUSY_RUNNABLE_PER_CPU * cpus)
    {
        reasons.push(format!("{r:.1} runnable tasks on {} CPUs", report.cpus));
    }
    if let Some(p) = report.cpu_pressure.filter(|p| *p >= BUSY_CPU_PRESSURE) {
        reasons.push(format!("CPU pressure {:.0} %", p * 100.0));
    }
    if let Some(s) = report.steal.filter(|s| *s >= BUSY_STEAL) {
        reasons.push(format!("CPU steal {:.1} %", s * 100.0));
    }
    if let Some([_, _, max]) = report
        .load_average
        .filter(|l| l[2] >= BUSY_LOAD_PER_CPU * cpus)
    {
        reasons.push(format!("load average {max:.1} on {} CPUs", report.cpus));
    }
    report.busy = !reasons.is_empty();
    report.busy_reasons = reasons;
}

/// CPU time counters of `/proc/stat`'s `cpu` line: (steal, total), ticks.
fn cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest counted in user).
    let steal = *fields.get(7)?;
    Some((steal, fields.iter().take(8).sum()))
}

/// The `total` stall time of `/proc/pressure/cpu`'s `some` line, µs.
fn cpu_pressure_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))
        .and_then(|v| v.parse().ok())
}

/// The 1-minute load average and the runnable tasks of `/proc/loadavg`.
fn loadavg() -> Option<(f64, u64)> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace();
    let one = fields.next()?.parse().ok()?;
    let running = fields.nth(2)?.split('/').next()?.parse().ok()?;
    Some((one, running))
}

/// Involuntary context switches of the calling thread.
fn involuntary_switches() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::resource::{UsageWho, getrusage};
        getrusage(UsageWho::RUSAGE_THREAD)
            .ok()
            .and_then(|u| u64::try_from(u.involuntary_context_switches()).ok())
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// What the watcher thread measured.
#[derive(Default)]
struct Samples {
    errors_us: Vec<(Duration, u64)>,
    runnable: Vec<u64>,
    load: Vec<f64>,
}

/// The self-watch of one load phase: started and finished on the load
/// generator's thread.
pub(crate) struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<Samples>>,
    started: Instant,
    cpu: Option<(u64, u64)>,
    pressure: Option<u64>,
    switches: Option<u64>,
}

impl Watch {
    /// Starts watching (a thread of its own; none if it cannot be spawned,
    /// and the report then holds only the counters).
    pub(crate) fn start() -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name("tailmesh-watch".into())
            .spawn(move || watch(&flag))
            .ok();
        Watch {
            stop,
            thread,
            started: Instant::now(),
            cpu: cpu_times(),
            pressure: cpu_pressure_total(),
            switches: involuntary_switches(),
        }
    }

    /// Stops watching and reports.
    pub(crate) fn finish(mut self) -> InstrumentReport {
        let elapsed = self.started.elapsed();
        self.stop.store(true, Ordering::Relaxed);
        let samples = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let mut all = new_histogram();
        let mut worst = 0;
        let mut second = new_histogram();
        let mut window_end = Duration::from_secs(1);
        for &(at, us) in &samples.errors_us {
            if at >= window_end {
                worst = worst.max(second.value_at_quantile(0.99));
                second.reset();
                window_end = at + Duration::from_secs(1);
            }
            record_us(&mut all, us);
            record_us(&mut second, us);
        }
        if second.len() >= 20 {
            worst = worst.max(second.value_at_quantile(0.99));
        }
        let secs = elapsed.as_secs_f64();
        let steal = self.cpu.zip(cpu_times()).and_then(|((s0, t0), (s1, t1))| {
            let total = t1.saturating_sub(t0);
            (total > 0).then(|| s1.saturating_sub(s0) as f64 / total as f64)
        });
        let cpu_pressure = self
            .pressure
            .zip(cpu_pressure_total())
            .and_then(|(p0, p1)| {
                (secs > 0.0).then(|| (p1.saturating_sub(p0) as f64 / 1e6 / secs).min(1.0))
            });
        let switches = self
            .switches
            .zip(involuntary_switches())
            .map(|(a, b)| b.saturating_sub(a));
        let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let runnable: Vec<f64> = samples
            .runnable
            .iter()
            // The watcher itself is running when it reads the file.
            .map(|&r| r.saturating_sub(1) as f64)
            .collect();
        let load_average = match (samples.load.first(), samples.load.last()) {
            (Some(&first), Some(&last)) => Some([
                first,
                last,
                samples.load.iter().copied().fold(f64::MIN, f64::max),
            ]),
            _ => None,
        };
        let mut report = InstrumentReport {
            timer_error: Percentiles::from_histogram(&all),
            timer_error_worst_second_us: worst,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            runnable_mean: mean(&runnable),
            load_average,
            cpu_pressure,
            steal,
            involuntary_switches: switches,
            involuntary_switches_per_s: switches.filter(|_| secs > 0.0).map(|n| n as f64 / secs),
            busy: false,
            busy_reasons: Vec::new(),
        };
        judge(&mut report);
        report
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn watch(stop: &AtomicBool) -> Samples {
    let origin = Instant::now();
    let mut samples = Samples::default();
    let mut next_sample = origin;
    while !stop.load(Ordering::Relaxed) {
        let before = Instant::now();
        thread::sleep(PROBE_SLEEP);
        let woke = Instant::now();
        let late = woke.saturating_duration_since(before + PROBE_SLEEP);
        samples.errors_us.push((
            woke.saturating_duration_since(origin),
            u64::try_from(late.as_micros()).unwrap_or(u64::MAX),
        ));
        if woke >= next_sample {
            if let Some((load, running)) = loadavg() {
                samples.load.push(load);
                samples.runnable.push(running);
            }
            next_sample = woke + SAMPLE_EVERY;
        }
        thread::sleep(PROBE_EVERY.saturating_sub(PROBE_SLEEP));
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> InstrumentReport {
        InstrumentReport {
            timer_error: Percentiles {
                count: 1000,
                p50_us: 60,
                p99_us: 200,
                ..Percentiles::default()
            },
            timer_error_worst_second_us: 300,
            cpus: 2,
            runnable_mean: Some(0.3),
            load_average: Some([0.2, 0.4, 0.5]),
            cpu_pressure: Some(0.02),
            steal: Some(0.0),
            involuntary_switches: Some(12),
            involuntary_switches_per_s: Some(1.2),
            busy: false,
            busy_reasons: Vec::new(),
        }
    }

    #[test]
    fn each_bound_makes_the_machine_busy_and_is_named() {
        let mut q = quiet();
        judge(&mut q);
        assert!(!q.busy && q.busy_reasons.is_empty() && q.warning().is_none());

        type Make = fn(&mut InstrumentReport);
        let cases: [(Make, &str); 5] = [
            (
                |r| r.timer_error.p99_us = 2_500,
                "timer wake-up error p99 2.5 ms",
            ),
            (
                |r| r.runnable_mean = Some(2.4),
                "2.4 runnable tasks on 2 CPUs",
            ),
            (|r| r.cpu_pressure = Some(0.87), "CPU pressure 87 %"),
            (|r| r.steal = Some(0.12), "CPU steal 12.0 %"),
            (
                |r| r.load_average = Some([1.0, 4.0, 4.5]),
                "load average 4.5 on 2 CPUs",
            ),
        ];
        for (make_busy, reason) in cases {
            let mut r = quiet();
            make_busy(&mut r);
            judge(&mut r);
            assert!(r.busy, "{reason}");
            assert_eq!(r.busy_reasons, [reason]);
            assert!(r.warning().is_some_and(|w| w.contains(reason)));
            assert_eq!(r.machine().reasons, [reason]);
        }
    }

    #[test]
    fn a_bad_second_warns_without_making_the_run_busy() {
        let mut r = quiet();
        r.timer_error_worst_second_us = 4_000;
        judge(&mut r);
        assert!(!r.busy);
        assert!(r.warning().is_some_and(|w| w.contains("4.0 ms")));
    }

    #[test]
    fn the_watch_measures_its_own_sleeps() {
        let w = Watch::start();
        let deadline = Instant::now() + Duration::from_secs(10);
        // Wait until the probe has slept a few times (not a fixed sleep).
        while Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
            if w.started.elapsed() >= Duration::from_millis(200) {
                break;
            }
        }
        let r = w.finish();
        assert!(r.timer_error.count >= 1, "{r:?}");
        assert!(r.cpus >= 1);
        if cfg!(target_os = "linux") {
            assert!(
                r.load_average.is_some() && r.runnable_mean.is_some(),
                "{r:?}"
            );
        }
    }
}
