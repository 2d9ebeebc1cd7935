//! Was the machine busy while the load ran? Judged from what the load
//! generator's self-watch measured over the load window
//! ([`MachineSamples`]): other processes' share of the CPU (the mesh's own
//! processes, which raise runnable tasks and CPU pressure by themselves,
//! do not count against the machine), CPU pressure and steal over the
//! window, the timer's wake-up error and the generator's lateness. The
//! one-minute load average and the runnable tasks are kept as information
//! only: right after a build the load average still holds the build,
//! though the machine is quiet.

use serde::{Deserialize, Serialize};

use super::stats::Percentiles;
use super::verdict::MachineState;
use crate::record::MachineSamples;

/// Busy: the probe's wake-up error p99 is at least this (µs).
pub const BUSY_TIMER_ERROR_US: u64 = 1_000;
/// Busy: other processes used at least this many CPUs over the window...
pub const BUSY_OTHERS_CPUS: f64 = 0.5;
/// ... while the machine's CPUs were at least this share busy (mesh and
/// others together): with CPUs to spare, others do not slow the mesh.
pub const BUSY_MACHINE_SHARE: f64 = 0.75;
/// Other processes count as present, for the signals the mesh raises by
/// itself too (CPU pressure, the generator's lateness), from this many
/// CPUs on.
pub const OTHERS_PRESENT_CPUS: f64 = 0.25;
/// Busy: some task waited for a CPU at least this share of the time
/// (Linux pressure stall information, `/proc/pressure/cpu`), with others
/// present.
pub const BUSY_CPU_PRESSURE: f64 = 0.5;
/// Busy: the hypervisor took at least this share of CPU time (steal).
pub const BUSY_STEAL: f64 = 0.05;
/// Busy: the generator's lateness p99 is at least this (µs), with others
/// present.
pub const BUSY_LATENESS_US: u64 = 1_000;

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
    /// Mean runnable tasks on the machine besides the watcher (the mesh's
    /// own included; information, not judged).
    pub runnable_mean: Option<f64>,
    /// 1-minute load average at the start, the end, and its largest sample
    /// (information, not judged: it lags by minutes).
    pub load_average: Option<[f64; 3]>,
    /// Share of the time some task waited for a CPU (`/proc/pressure/cpu`),
    /// over the load; absent where the kernel does not report it.
    pub cpu_pressure: Option<f64>,
    /// Share of CPU time stolen by the hypervisor, over the load; absent
    /// where the kernel does not report it.
    pub steal: Option<f64>,
    /// CPUs used over the load window by the orchestrator and its
    /// descendants (the load generator, the hops, the broker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh_cpus: Option<f64>,
    /// CPUs used over the load window by every other process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others_cpus: Option<f64>,
    /// How long the load window was, s (warmup and measured phase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Involuntary context switches of the load generator's thread.
    pub involuntary_switches: Option<u64>,
    /// The same per second of load.
    pub involuntary_switches_per_s: Option<f64>,
    /// Whether the load generator's thread paced its sends at real-time
    /// priority, which only a process allowed it gets (absent for a closed
    /// loop, which does not pace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realtime: Option<bool>,
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
                tailmesh_units::micros(self.timer_error_worst_second_us as f64)
            ))
        } else {
            None
        }
    }
}

/// Judges a load window: `samples` from the self-watch, `lateness` the
/// generator's sends (`start - intended`).
pub fn judge(samples: &MachineSamples, lateness: &Percentiles) -> InstrumentReport {
    let secs = samples.elapsed.as_secs_f64();
    let mut report = InstrumentReport {
        timer_error: samples
            .timer_error
            .as_ref()
            .map(Percentiles::from_histogram)
            .unwrap_or_default(),
        timer_error_worst_second_us: samples.timer_error_worst_second_us,
        cpus: samples.cpus,
        runnable_mean: samples.runnable_mean,
        load_average: samples.load_average,
        cpu_pressure: samples.cpu_pressure,
        steal: samples.steal,
        mesh_cpus: samples.cpu_use.map(|u| u.mesh),
        others_cpus: samples.cpu_use.map(|u| u.others),
        window_s: Some(secs),
        involuntary_switches: samples.involuntary_switches,
        involuntary_switches_per_s: samples
            .involuntary_switches
            .filter(|_| secs > 0.0)
            .map(|n| n as f64 / secs),
        realtime: samples.realtime,
        busy: false,
        busy_reasons: Vec::new(),
    };
    report.busy_reasons = busy_reasons(&report, lateness);
    report.busy = !report.busy_reasons.is_empty();
    report
}

/// Each busy bound `r` crosses, in words.
fn busy_reasons(r: &InstrumentReport, lateness: &Percentiles) -> Vec<String> {
    let cpus = r.cpus.max(1) as f64;
    let mut reasons = Vec::new();
    if r.timer_error.p99_us >= BUSY_TIMER_ERROR_US {
        reasons.push(format!(
            "timer wake-up error p99 {}",
            tailmesh_units::micros(r.timer_error.p99_us as f64)
        ));
    }
    // Without a CPU split (no /proc), every other signal counts as before.
    let others_present = r.others_cpus.is_none_or(|o| o >= OTHERS_PRESENT_CPUS);
    if let Some(others) = r.others_cpus {
        let mesh = r.mesh_cpus.unwrap_or(0.0);
        if others >= BUSY_OTHERS_CPUS && mesh + others >= BUSY_MACHINE_SHARE * cpus {
            reasons.push(format!(
                "other processes used {others:.1} of {} CPUs",
                r.cpus
            ));
        }
    }
    if let Some(p) = r
        .cpu_pressure
        .filter(|p| *p >= BUSY_CPU_PRESSURE && others_present)
    {
        reasons.push(format!("CPU pressure {}", tailmesh_units::percent(p)));
    }
    if let Some(s) = r.steal.filter(|s| *s >= BUSY_STEAL) {
        reasons.push(format!("CPU steal {}", tailmesh_units::percent(s)));
    }
    if lateness.p99_us >= BUSY_LATENESS_US && others_present && r.others_cpus.is_some() {
        reasons.push(format!(
            "the load generator sent late (p99 {})",
            tailmesh_units::micros(lateness.p99_us as f64)
        ));
    }
    reasons
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::record::CpuUse;

    /// A quiet window on 2 CPUs: the mesh used 0.8 of them, nothing else.
    fn quiet() -> MachineSamples {
        let mut timer = hdrhistogram::Histogram::<u64>::new(3).expect("3 digits");
        for us in [60, 60, 60, 200] {
            timer.record(us).expect("in range");
        }
        MachineSamples {
            timer_error: Some(timer),
            timer_error_worst_second_us: 300,
            cpus: 2,
            elapsed: Duration::from_secs(10),
            runnable_mean: Some(0.3),
            load_average: Some([0.2, 0.4, 0.5]),
            cpu_pressure: Some(0.02),
            steal: Some(0.0),
            cpu_use: Some(CpuUse {
                mesh: 0.8,
                others: 0.02,
            }),
            involuntary_switches: Some(12),
            realtime: Some(true),
        }
    }

    fn on_time() -> Percentiles {
        Percentiles {
            count: 1000,
            p99_us: 40,
            ..Percentiles::default()
        }
    }

    #[test]
    fn each_bound_makes_the_machine_busy_and_is_named() {
        let q = judge(&quiet(), &on_time());
        assert!(!q.busy && q.busy_reasons.is_empty() && q.warning().is_none());
        assert_eq!(q.involuntary_switches_per_s, Some(1.2));
        assert_eq!((q.mesh_cpus, q.others_cpus), (Some(0.8), Some(0.02)));

        type Make = fn(&mut MachineSamples, &mut Percentiles);
        let cases: [(Make, &str); 5] = [
            (
                |s, _| {
                    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("3 digits");
                    h.record(2_500).expect("in range");
                    s.timer_error = Some(h);
                },
                "timer wake-up error p99 2.50 ms",
            ),
            (
                |s, _| {
                    s.cpu_use = Some(CpuUse {
                        mesh: 0.6,
                        others: 1.2,
                    })
                },
                "other processes used 1.2 of 2 CPUs",
            ),
            (
                |s, _| {
                    s.cpu_pressure = Some(0.87);
                    s.cpu_use = Some(CpuUse {
                        mesh: 0.8,
                        others: 0.3,
                    });
                },
                "CPU pressure 87.0 %",
            ),
            (|s, _| s.steal = Some(0.12), "CPU steal 12.0 %"),
            (
                |s, late| {
                    late.p99_us = 4_000;
                    s.cpu_use = Some(CpuUse {
                        mesh: 0.8,
                        others: 0.3,
                    });
                },
                "the load generator sent late (p99 4.00 ms)",
            ),
        ];
        for (make_busy, reason) in cases {
            let (mut s, mut late) = (quiet(), on_time());
            make_busy(&mut s, &mut late);
            let r = judge(&s, &late);
            assert!(r.busy, "{reason}");
            assert_eq!(r.busy_reasons, [reason]);
            assert!(r.warning().is_some_and(|w| w.contains(reason)));
            assert_eq!(r.machine().reasons, [reason]);
        }
    }

    #[test]
    fn a_quiet_window_after_a_build_is_not_busy() {
        // The build just ended: the 1-minute load average still holds it,
        // but during the window nothing else ran.
        let mut s = quiet();
        s.load_average = Some([3.9, 2.8, 3.9]);
        let r = judge(&s, &on_time());
        assert!(!r.busy, "{:?}", r.busy_reasons);
        assert_eq!(r.load_average, Some([3.9, 2.8, 3.9]), "kept as information");
        // Others using a core while the mesh uses the other: busy.
        s.cpu_use = Some(CpuUse {
            mesh: 0.9,
            others: 1.0,
        });
        let r = judge(&s, &on_time());
        assert!(r.busy);
        assert_eq!(r.busy_reasons, ["other processes used 1.0 of 2 CPUs"]);
    }

    #[test]
    fn the_mesh_loading_the_machine_by_itself_is_not_busy() {
        // The mesh takes both CPUs: many runnable tasks, high pressure, a
        // late generator; nothing else ran.
        let mut s = quiet();
        s.runnable_mean = Some(6.0);
        s.cpu_pressure = Some(0.9);
        s.cpu_use = Some(CpuUse {
            mesh: 1.95,
            others: 0.05,
        });
        let late = Percentiles {
            p99_us: 5_000,
            ..on_time()
        };
        let r = judge(&s, &late);
        assert!(!r.busy, "{:?}", r.busy_reasons);
        // Others using a core on a machine with CPUs to spare: not busy.
        s.cpus = 16;
        s.cpu_pressure = Some(0.0);
        s.cpu_use = Some(CpuUse {
            mesh: 2.0,
            others: 1.0,
        });
        assert!(!judge(&s, &on_time()).busy);
    }

    #[test]
    fn a_bad_second_warns_without_making_the_run_busy() {
        let mut s = quiet();
        s.timer_error_worst_second_us = 4_000;
        let r = judge(&s, &on_time());
        assert!(!r.busy);
        assert!(r.warning().is_some_and(|w| w.contains("4.00 ms")));
    }
}
