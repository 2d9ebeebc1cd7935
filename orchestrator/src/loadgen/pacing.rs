//! How the open loop waits for each intended send time, as precisely as the
//! machine allows:
//!
//! - sleep on the precise timer until `spin` before the send time, then
//!   spin on the generator's own thread for the last microseconds (a
//!   wake-up through the timer thread costs tens of microseconds, a spin
//!   none); the spin yields to the runtime at every turn, so answers that
//!   arrive meanwhile are still read and timed at once;
//! - real-time priority (`SCHED_FIFO` 1, reset on fork so no child process
//!   inherits it) for the generator's thread and the timer thread while the
//!   load runs, where the process is allowed it, and silently not
//!   otherwise (the self-watch reports which); the spin is bounded, so no
//!   other thread starves;
//! - optionally, the generator's thread pinned to one CPU.
//!
//! `TAILMESH_PACING` overrides the defaults, for the lateness benchmark
//! (`bench/lateness.sh`): a comma-separated list of `plain` (no spin, no
//! real-time priority, no pinning: the timer alone), `spin=<duration>`,
//! `rt`, `nort`, `pin=<cpu>`.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use tailmesh_services::timer::{PreciseTimer, Sleeper};
use tokio::time::Instant;

/// The default spin: a little more than the precise timer's usual wake-up
/// error on a quiet machine.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(150);

/// How the open loop waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pacing {
    /// Spin this long before each send time (0: no spin).
    pub spin: Duration,
    /// Ask for real-time priority.
    pub realtime: bool,
    /// Pin the generator's thread to this CPU.
    pub pin: Option<usize>,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            spin: DEFAULT_SPIN,
            realtime: true,
            pin: None,
        }
    }
}

/// Why a `TAILMESH_PACING` value was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub(crate) enum PacingError {
    #[error("spin={value}: {source}")]
    Spin {
        value: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("spin={0:?}: at most 1ms")]
    SpinTooLong(Duration),
    #[error("pin={value}: {source}")]
    Pin {
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("unknown setting {0:?}")]
    Unknown(String),
}

impl Pacing {
    /// The defaults, overridden by `TAILMESH_PACING` when it is set and
    /// valid (an invalid value is told and ignored).
    pub(crate) fn from_env() -> Pacing {
        match std::env::var("TAILMESH_PACING") {
            Ok(text) => Pacing::parse(&text).unwrap_or_else(|e| {
                crate::tell!("warning: TAILMESH_PACING ignored: {e}");
                Pacing::default()
            }),
            Err(_) => Pacing::default(),
        }
    }

    /// Parses `TAILMESH_PACING`'s value.
    pub(crate) fn parse(text: &str) -> Result<Pacing, PacingError> {
        let mut p = Pacing::default();
        for token in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match token.split_once('=') {
                None if token == "plain" => {
                    p = Pacing {
                        spin: Duration::ZERO,
                        realtime: false,
                        pin: None,
                    }
                }
                None if token == "rt" => p.realtime = true,
                None if token == "nort" => p.realtime = false,
                Some(("spin", d)) => {
                    let spin =
                        humantime::parse_duration(d).map_err(|source| PacingError::Spin {
                            value: d.to_string(),
                            source,
                        })?;
                    if spin > Duration::from_millis(1) {
                        return Err(PacingError::SpinTooLong(spin));
                    }
                    p.spin = spin;
                }
                Some(("pin", cpu)) => {
                    p.pin = Some(cpu.parse().map_err(|source| PacingError::Pin {
                        value: cpu.to_string(),
                        source,
                    })?);
                }
                _ => return Err(PacingError::Unknown(token.to_string())),
            }
        }
        Ok(p)
    }

    /// Applies priority and placement to the calling thread (and priority
    /// to the timer thread) until the guard drops.
    pub(crate) fn enter(&self) -> PacingGuard {
        let mut guard = PacingGuard {
            realtime: Vec::new(),
            own_realtime: false,
            pinned: None,
        };
        if self.realtime {
            let me = nix::unistd::gettid().as_raw();
            let timer = PreciseTimer::global().thread_id();
            for tid in std::iter::once(me).chain(timer) {
                if chrt(&["--fifo", "--reset-on-fork", "-p", "1", &tid.to_string()]) {
                    guard.realtime.push(tid);
                }
            }
            guard.own_realtime = guard.realtime.first() == Some(&me);
        }
        if let Some(cpu) = self.pin {
            guard.pinned = pin(cpu);
        }
        guard
    }

    /// Waits until `deadline`: the timer until `spin` before it, then a
    /// spin. Only the precise timer spins (tokio's timer may be paused).
    pub(crate) async fn wait_until(&self, sleeper: &Sleeper, deadline: Instant) {
        match sleeper {
            Sleeper::Precise if !self.spin.is_zero() => {
                sleeper.sleep_until(deadline - self.spin).await;
                // Bounded by `spin` (the timer never wakes early). Spin by
                // yielding: the runtime (one thread) still polls its
                // sockets between turns, so an answer that arrives during
                // the spin is timed when it arrives, not after the spin.
                while Instant::now() < deadline {
                    tokio::task::yield_now().await;
                }
            }
            _ => sleeper.sleep_until(deadline).await,
        }
    }
}

/// Runs `chrt` with `args`: whether it succeeded. A process without the
/// privilege, or without `chrt`, gets `false` and nothing is told.
fn chrt(args: &[&str]) -> bool {
    Command::new("chrt")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Pins the calling thread to `cpu`; returns the affinity to restore.
fn pin(cpu: usize) -> Option<nix::sched::CpuSet> {
    use nix::{sched, unistd::Pid};
    let before = sched::sched_getaffinity(Pid::from_raw(0)).ok()?;
    let mut only = sched::CpuSet::new();
    only.set(cpu).ok()?;
    sched::sched_setaffinity(Pid::from_raw(0), &only).ok()?;
    Some(before)
}

/// Restores normal priority and placement when dropped.
pub(crate) struct PacingGuard {
    /// Threads given real-time priority.
    realtime: Vec<i32>,
    /// Whether the generator's own thread is one of them.
    own_realtime: bool,
    pinned: Option<nix::sched::CpuSet>,
}

impl PacingGuard {
    /// Whether the generator's thread got real-time priority.
    pub(crate) fn realtime(&self) -> bool {
        self.own_realtime
    }
}

impl Drop for PacingGuard {
    fn drop(&mut self) {
        for tid in &self.realtime {
            chrt(&["--other", "-p", "0", &tid.to_string()]);
        }
        if let Some(before) = &self.pinned {
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), before);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_ones_are_named() {
        assert_eq!(Pacing::parse(""), Ok(Pacing::default()));
        assert_eq!(
            Pacing::parse("plain"),
            Ok(Pacing {
                spin: Duration::ZERO,
                realtime: false,
                pin: None
            })
        );
        assert_eq!(
            Pacing::parse("plain, spin=50us, rt, pin=1"),
            Ok(Pacing {
                spin: Duration::from_micros(50),
                realtime: true,
                pin: Some(1)
            })
        );
        assert_eq!(Pacing::parse("nort").map(|p| p.realtime), Ok(false));
        for bad in ["spin=2ms", "spin=x", "pin=-1", "fast"] {
            assert!(Pacing::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_spinning_wait_never_ends_early() {
        let p = Pacing::default();
        for us in [0u64, 40, 300, 2_000] {
            let deadline = Instant::now() + Duration::from_micros(us);
            p.wait_until(&Sleeper::Precise, deadline).await;
            assert!(Instant::now() >= deadline, "{us} us");
        }
    }
}
