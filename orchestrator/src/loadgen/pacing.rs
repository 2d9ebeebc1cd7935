//! How the open loop waits for each intended send time, as precisely as the
//! machine allows:
//!
//! - sleep until `spin` before the send time on the generator's own alarm:
//!   a `timerfd` in its runtime's poll, so the kernel's timer wakes the
//!   generator's thread itself (the process's shared precise timer would
//!   wake a timer thread of its own first, which then wakes the generator:
//!   two wake-ups, and one more thread at real-time priority); then spin
//!   on the generator's own thread for the last microseconds; the spin
//!   yields to the runtime at every turn, so answers that arrive meanwhile
//!   are still read and timed at once;
//! - real-time priority (`SCHED_FIFO` 1, reset on fork so no child process
//!   inherits it) for the generator's thread (and the timer thread, when
//!   the generator waits on it) while the load runs, where the process is
//!   allowed it, and silently not otherwise (the self-watch reports which);
//!   the spin is bounded, so no other thread starves;
//! - optionally, the generator's thread pinned to one CPU.
//!
//! `TAILMESH_PACING` overrides the defaults, for the lateness benchmark
//! (`bench/lateness.sh`): a comma-separated list of `plain` (no spin, no
//! real-time priority, no pinning: the alarm alone), `spin=<duration>`,
//! `rt`, `nort`, `pin=<cpu>`, `shared-timer` (wait on the process's shared
//! precise timer instead of an alarm of the generator's own).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use tailmesh_services::timer::{Alarm, PreciseTimer, Sleeper};
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
    /// Wait on the process's shared precise timer instead of an alarm of
    /// the generator's own.
    pub shared_timer: bool,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            spin: DEFAULT_SPIN,
            realtime: true,
            pin: None,
            shared_timer: false,
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
                        shared_timer: p.shared_timer,
                    }
                }
                None if token == "rt" => p.realtime = true,
                None if token == "nort" => p.realtime = false,
                None if token == "shared-timer" => p.shared_timer = true,
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
    /// to the timer thread, when the generator waits on it) until the guard
    /// drops.
    pub(crate) fn enter(&self) -> PacingGuard {
        let mut guard = PacingGuard {
            realtime: Vec::new(),
            own_realtime: false,
            pinned: None,
        };
        if self.realtime {
            let me = nix::unistd::gettid().as_raw();
            let timer = self
                .shared_timer
                .then(|| PreciseTimer::global().thread_id())
                .flatten();
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

    /// What waits for one loop's send times, one at a time.
    pub(crate) fn pacer<'a>(&'a self, sleeper: &'a Sleeper) -> Pacer<'a> {
        let alarm = match sleeper {
            s if s.is_precise() && !self.shared_timer => match Alarm::new() {
                Ok(alarm) => Some(alarm),
                Err(e) => {
                    crate::tell!(
                        "warning: the load generator's own alarm (a timerfd): {e}; \
                         it waits on the shared timer instead"
                    );
                    None
                }
            },
            _ => None,
        };
        Pacer {
            pacing: self,
            sleeper,
            alarm,
        }
    }
}

/// Waits for one loop's send times by its [`Pacing`]; `&mut`, because its
/// alarm holds one deadline at a time.
pub(crate) struct Pacer<'a> {
    pacing: &'a Pacing,
    sleeper: &'a Sleeper,
    /// The generator's own alarm; `None` waits on `sleeper`.
    alarm: Option<Alarm>,
}

impl Pacer<'_> {
    /// Waits until `deadline`: the alarm (or the sleeper) until `spin`
    /// before it, then a spin. Only a precise wait spins (tokio's timer may
    /// be paused).
    pub(crate) async fn wait_until(&mut self, deadline: Instant) {
        let spin = if self.sleeper.is_precise() {
            self.pacing.spin
        } else {
            Duration::ZERO
        };
        let wake = deadline.checked_sub(spin).unwrap_or(deadline);
        match &mut self.alarm {
            Some(alarm) => alarm_until(alarm, wake).await,
            None => self.sleeper.sleep_until(wake).await,
        }
        // Bounded by `spin` (neither timer wakes early). Spin by yielding:
        // the runtime (one thread) still polls its sockets between turns,
        // so an answer that arrives during the spin is timed when it
        // arrives, not after the spin.
        while !spin.is_zero() && Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
    }
}

/// Waits on `alarm` until `deadline`. Should the `timerfd` fail (it cannot
/// with a valid descriptor and a positive time), the wait ends on the
/// shared timer rather than not at all.
async fn alarm_until(alarm: &mut Alarm, deadline: Instant) {
    if alarm.sleep_until(deadline).await.is_err() {
        PreciseTimer::global().sleep_until(deadline).await;
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
                pin: None,
                shared_timer: false,
            })
        );
        assert_eq!(
            Pacing::parse("plain, spin=50us, rt, pin=1"),
            Ok(Pacing {
                spin: Duration::from_micros(50),
                realtime: true,
                pin: Some(1),
                shared_timer: false,
            })
        );
        assert_eq!(
            Pacing::parse("shared-timer,plain").map(|p| (p.shared_timer, p.spin)),
            Ok((true, Duration::ZERO))
        );
        assert_eq!(Pacing::parse("nort").map(|p| p.realtime), Ok(false));
        for bad in ["spin=2ms", "spin=x", "pin=-1", "fast"] {
            assert!(Pacing::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn no_wait_ends_early_on_either_timer_with_or_without_the_spin() {
        for text in ["", "spin=0", "shared-timer", "shared-timer,spin=0"] {
            let p = Pacing::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let mut pacer = p.pacer(&Sleeper::Precise);
            assert_eq!(pacer.alarm.is_some(), !p.shared_timer, "{text:?}");
            // Past, now, under the spin, over it, and in turn: each wait
            // sets the one alarm again.
            for us in [-50i64, 0, 40, 300, 2_000, 1, 700] {
                let now = Instant::now();
                let deadline = if us < 0 {
                    now - Duration::from_micros(us.unsigned_abs())
                } else {
                    now + Duration::from_micros(us.unsigned_abs())
                };
                pacer.wait_until(deadline).await;
                assert!(Instant::now() >= deadline, "{text:?}, {us} us");
            }
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_alarm_wait_given_up_leaves_the_next_one_whole() {
        // A wait dropped before its alarm (the run told to stop) leaves the
        // alarm set for a deadline no one waits for; the next wait sets it
        // again and ends at its own deadline, not the stale one.
        let p = Pacing::parse("spin=0").unwrap_or_else(|e| panic!("{e}"));
        let mut pacer = p.pacer(&Sleeper::Precise);
        let far = Instant::now() + Duration::from_secs(30);
        let given_up = tokio::time::timeout(Duration::from_millis(5), pacer.wait_until(far)).await;
        assert!(given_up.is_err(), "a wait of 30 s ended within 5 ms");
        let deadline = Instant::now() + Duration::from_millis(2);
        tokio::time::timeout(Duration::from_secs(20), pacer.wait_until(deadline))
            .await
            .unwrap_or_else(|_| panic!("the next wait waited for the stale deadline"));
        assert!(Instant::now() >= deadline);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn tokios_timer_is_waited_on_without_an_alarm_or_a_spin() {
        // Tests pause tokio's clock: a wait on it must follow the paused
        // clock, which an alarm on the kernel's clock would not.
        let p = Pacing::default();
        let mut pacer = p.pacer(&Sleeper::Tokio);
        assert!(pacer.alarm.is_none());
        let deadline = Instant::now() + Duration::from_secs(3600);
        pacer.wait_until(deadline).await;
        assert!(Instant::now() >= deadline);
    }
}
