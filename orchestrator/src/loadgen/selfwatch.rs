//! The instrument watching itself: while a variant's load runs, a thread
//! measures how late its own timed sleeps wake (the timer's wake-up error)
//! and samples the machine's runnable tasks and load average; at the start
//! and end of the window it reads the CPU time of the whole machine and of
//! this process and its descendants (the mesh), the CPU pressure and steal,
//! and the generator thread's involuntary context switches. It only
//! measures: `analysis::instrument` judges whether the machine was busy.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;

use crate::record::{CpuUse, MachineSamples};

/// The probe sleeps this long, every [`PROBE_EVERY`].
const PROBE_SLEEP: Duration = Duration::from_millis(1);
/// How often the probe sleeps.
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How often the machine's counters are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// CPU time counters of `/proc/stat`'s `cpu` line, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CpuTimes {
    /// Every CPU state summed (user nice system idle iowait irq softirq
    /// steal).
    total: u64,
    /// Time some process or interrupt ran: user, nice, system, irq, softirq.
    busy: u64,
    /// Stolen by the hypervisor.
    steal: u64,
}

/// `/proc/stat`'s `cpu` line.
fn cpu_times() -> Option<CpuTimes> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(text.lines().find(|l| l.starts_with("cpu "))?)
}

/// Parses `cpu  user nice system idle iowait irq softirq steal ...`.
fn parse_cpu_line(line: &str) -> Option<CpuTimes> {
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest counted in user).
    let steal = *fields.get(7)?;
    Some(CpuTimes {
        total: fields.iter().take(8).sum(),
        busy: fields[0] + fields[1] + fields[2] + fields[5] + fields[6],
        steal,
    })
}

/// The parent pid and the user plus system CPU time (clock ticks) of a
/// `/proc/<pid>/stat` line.
fn parse_pid_stat(text: &str) -> Option<(u32, u64)> {
    // The command name is in parentheses and may hold spaces or ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU time (clock ticks) of this process and every descendant: the load
/// generator and the mesh it launched.
fn own_tree_ticks() -> Option<u64> {
    let me = std::process::id();
    let mut procs: Vec<(u32, u32, u64)> = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A process may exit between the listing and the read.
        if let Some((ppid, ticks)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|t| parse_pid_stat(&t))
        {
            procs.push((pid, ppid, ticks));
        }
    }
    Some(tree_ticks(me, &procs))
}

/// The ticks of `root` and its descendants among `(pid, ppid, ticks)`.
fn tree_ticks(root: u32, procs: &[(u32, u32, u64)]) -> u64 {
    let mut inside = vec![root];
    let mut total = 0;
    let mut i = 0;
    while let Some(&pid) = inside.get(i) {
        i += 1;
        for &(child, ppid, ticks) in procs {
            if child == pid {
                total += ticks;
            } else if ppid == pid && !inside.contains(&child) {
                inside.push(child);
            }
        }
    }
    total
}

/// The CPU counters at one end of the window.
#[derive(Clone, Copy, Debug, Default)]
struct CpuSnapshot {
    machine: Option<CpuTimes>,
    own: Option<u64>,
}

impl CpuSnapshot {
    fn take() -> CpuSnapshot {
        CpuSnapshot {
            machine: cpu_times(),
            own: own_tree_ticks(),
        }
    }
}

/// The mesh's and the other processes' CPU use between two snapshots, in
/// CPUs, on a machine of `cpus`.
fn cpu_use(start: CpuSnapshot, end: CpuSnapshot, cpus: usize) -> Option<CpuUse> {
    let (m0, m1) = (start.machine?, end.machine?);
    let (o0, o1) = (start.own?, end.own?);
    // All CPUs' ticks over the window, divided among them: the window's
    // length in ticks.
    let window = m1.total.saturating_sub(m0.total) as f64 / cpus.max(1) as f64;
    if window <= 0.0 {
        return None;
    }
    let busy = m1.busy.saturating_sub(m0.busy);
    let mesh = o1.saturating_sub(o0);
    Some(CpuUse {
        mesh: mesh as f64 / window,
        others: busy.saturating_sub(mesh) as f64 / window,
    })
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
    timer: TimerErrors,
    /// Runnable tasks besides the watcher: the sum of the samples, and
    /// how many.
    runnable: (f64, u64),
    /// The 1-minute load average: first, last and largest sample.
    load: Option<[f64; 3]>,
}

impl Samples {
    fn sample(&mut self, load: f64, running: u64) {
        // The watcher itself is running when it reads the file.
        self.runnable.0 += running.saturating_sub(1) as f64;
        self.runnable.1 += 1;
        self.load = Some(match self.load {
            Some([first, _, max]) => [first, load, max.max(load)],
            None => [load, load, load],
        });
    }
}

/// The probe's wake-up errors (µs): all of them, and the worst one-second
/// window's p99, kept as they come (two histograms, whatever the run's
/// length).
struct TimerErrors {
    all: Option<Histogram<u64>>,
    second: Option<Histogram<u64>>,
    window_end: Duration,
    worst: u64,
}

impl Default for TimerErrors {
    fn default() -> Self {
        TimerErrors {
            all: Histogram::new(3).ok(),
            second: Histogram::new(3).ok(),
            window_end: Duration::from_secs(1),
            worst: 0,
        }
    }
}

impl TimerErrors {
    /// One wake-up `us` late, `at` into the window.
    fn record(&mut self, at: Duration, us: u64) {
        if at >= self.window_end {
            if let Some(second) = &mut self.second {
                self.worst = self.worst.max(second.value_at_quantile(0.99));
                second.reset();
            }
            self.window_end = at + Duration::from_secs(1);
        }
        // An auto-resizing histogram refuses only values beyond any range.
        for h in [&mut self.all, &mut self.second].into_iter().flatten() {
            if h.record(us).is_err() {
                h.saturating_record(us);
            }
        }
    }

    /// The histogram of every error, and the worst second's p99 (a last,
    /// partial second counts from 20 wake-ups on).
    fn finish(self) -> (Option<Histogram<u64>>, u64) {
        let last = self
            .second
            .filter(|s| s.len() >= 20)
            .map_or(0, |s| s.value_at_quantile(0.99));
        (self.all, self.worst.max(last))
    }
}

/// The self-watch of one load phase: started and finished on the load
/// generator's thread.
pub(crate) struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<Samples>>,
    started: Instant,
    cpu: CpuSnapshot,
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
            cpu: CpuSnapshot::take(),
            pressure: cpu_pressure_total(),
            switches: involuntary_switches(),
        }
    }

    /// Stops watching and returns what it measured.
    pub(crate) fn finish(mut self) -> MachineSamples {
        let elapsed = self.started.elapsed();
        let cpu_end = CpuSnapshot::take();
        self.stop.store(true, Ordering::Relaxed);
        let samples = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let (timer_error, worst) = samples.timer.finish();
        let secs = elapsed.as_secs_f64();
        let steal = self.cpu.machine.zip(cpu_end.machine).and_then(|(a, b)| {
            let total = b.total.saturating_sub(a.total);
            (total > 0).then(|| b.steal.saturating_sub(a.steal) as f64 / total as f64)
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
        let (runnable_sum, runnable_samples) = samples.runnable;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        MachineSamples {
            timer_error,
            timer_error_worst_second_us: worst,
            cpus,
            elapsed,
            runnable_mean: (runnable_samples > 0).then(|| runnable_sum / runnable_samples as f64),
            load_average: samples.load,
            cpu_pressure,
            steal,
            cpu_use: cpu_use(self.cpu, cpu_end, cpus),
            involuntary_switches: switches,
            realtime: None,
        }
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
        samples.timer.record(
            woke.saturating_duration_since(origin),
            u64::try_from(late.as_micros()).unwrap_or(u64::MAX),
        );
        if woke >= next_sample {
            if let Some((load, running)) = loadavg() {
                samples.sample(load, running);
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
        assert!(
            r.timer_error.as_ref().is_some_and(|h| !h.is_empty()),
            "{r:?}"
        );
        assert!(r.cpus >= 1);
        if cfg!(target_os = "linux") {
            assert!(
                r.load_average.is_some() && r.runnable_mean.is_some() && r.cpu_use.is_some(),
                "{r:?}"
            );
        }
    }

    #[test]
    fn wake_up_errors_of_any_size_are_kept() {
        let mut errors = TimerErrors::default();
        for i in 0..100u64 {
            let us = if i % 50 == 49 { 250_000 } else { 80 };
            errors.record(Duration::from_millis(i * 10), us);
        }
        let (all, worst) = errors.finish();
        let all = all.expect("a histogram");
        assert_eq!(all.len(), 100);
        assert!(all.max() >= 250_000, "{}", all.max());
        assert!(all.value_at_quantile(0.5) >= 80, "not clamped");
        // Two bad wake-ups in a hundred make the second's p99.
        assert!(worst >= 250_000, "{worst}");
        // A later quiet second does not hide it.
        let mut errors = TimerErrors::default();
        for i in 0..300u64 {
            let us = if i < 100 && i % 50 == 49 { 9_000 } else { 50 };
            errors.record(Duration::from_millis(i * 10), us);
        }
        let (_, worst) = errors.finish();
        assert!((9_000..9_100).contains(&worst), "{worst}");
    }

    #[test]
    fn load_samples_keep_first_last_and_largest() {
        let mut s = Samples::default();
        for (load, running) in [(2.0, 3), (5.5, 1), (1.5, 0)] {
            s.sample(load, running);
        }
        assert_eq!(s.load, Some([2.0, 1.5, 5.5]));
        // The watcher's own reading is not counted: 2 + 0 + 0.
        assert_eq!(s.runnable, (2.0, 3));
    }

    #[test]
    fn proc_lines_parse() {
        let t = parse_cpu_line("cpu  100 5 50 1000 20 3 2 10 0 0").expect("a cpu line");
        assert_eq!(
            t,
            CpuTimes {
                total: 1190,
                busy: 160,
                steal: 10
            }
        );
        assert_eq!(parse_cpu_line("cpu 1 2 3"), None);
        // A name with spaces and a parenthesis.
        let stat = "4242 (tail mesh) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 1 0";
        assert_eq!(parse_pid_stat(stat), Some((17, 281)));
        assert_eq!(parse_pid_stat("no parenthesis"), None);
    }

    #[test]
    fn the_mesh_is_this_process_and_its_descendants() {
        // 1 -> 10 -> {11, 12}, 12 -> 13; 20 is a sibling of 10.
        let procs = [
            (1, 0, 1000),
            (10, 1, 5),
            (11, 10, 7),
            (12, 10, 11),
            (13, 12, 13),
            (20, 1, 500),
        ];
        assert_eq!(tree_ticks(10, &procs), 5 + 7 + 11 + 13);
        assert_eq!(tree_ticks(99, &procs), 0);
    }

    #[test]
    fn others_are_the_machine_minus_the_mesh() {
        let at = |total, busy, own| CpuSnapshot {
            machine: Some(CpuTimes {
                total,
                busy,
                steal: 0,
            }),
            own: Some(own),
        };
        // 2 CPUs over 100 ticks: 200 ticks; 150 busy, 60 of them the mesh.
        let u = cpu_use(at(1000, 100, 40), at(1200, 250, 100), 2).expect("both ends");
        assert!(
            (u.mesh - 0.6).abs() < 1e-9 && (u.others - 0.9).abs() < 1e-9,
            "{u:?}"
        );
        assert_eq!(cpu_use(CpuSnapshot::default(), at(1, 1, 1), 2), None);
    }
}
