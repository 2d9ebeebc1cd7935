//! Sleeps with sub-millisecond precision.
//!
//! tokio's timer wheel has a resolution of one millisecond: a 200 us sleep
//! takes about a millisecond, which would distort every sub-millisecond work
//! model and open-loop schedule this testbed exists to measure. Two precise
//! timers keep deadlines in a heap:
//!
//! - a runtime's own [`RuntimeTimer`]: one [`Alarm`] (a `timerfd`) in the
//!   runtime's poll, set for the earliest deadline. Its expiry wakes the
//!   runtime's own thread, which wakes the sleeping tasks itself: one
//!   wake-up a sleep. A hop's work and injected delays sleep on it.
//! - the process-wide [`PreciseTimer`]: one thread that waits on a
//!   condition variable (a futex) and wakes the sleeping task through a
//!   oneshot channel, so a sleep costs two wake-ups, that thread's and then
//!   the runtime's. It serves what has no runtime timer, and takes over a
//!   runtime timer's sleeps should that runtime stop.
//!
//! [`Sleeper`] chooses among them and tokio's timer, which tests use with
//! `tokio::time::pause()`. `TAILMESH_TIMER=shared` makes
//! [`Sleeper::precise_here`] choose the shared timer thread (to compare the
//! two, `bench/hop-timer.sh`).

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    os::fd::{AsFd, AsRawFd, RawFd},
    sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError},
    thread,
    time::Duration,
};

use nix::sys::{
    time::TimeSpec,
    timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags},
};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::oneshot,
    time::Instant,
};

/// How a component waits.
#[derive(Clone, Debug, Default)]
pub enum Sleeper {
    /// tokio's timer: millisecond resolution, follows `tokio::time::pause()`.
    Tokio,
    /// The process-wide precise timer thread.
    #[default]
    Precise,
    /// The precise timer of the runtime it was made in (see
    /// [`Sleeper::precise_here`]).
    Runtime(RuntimeTimer),
}

/// The variable that chooses the timer [`Sleeper::precise_here`] makes.
pub const TIMER_ENV: &str = "TAILMESH_TIMER";

/// Which precise timer `TAILMESH_TIMER` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerChoice {
    /// The runtime's own (unset, empty or `runtime`).
    Runtime,
    /// The process-wide timer thread (`shared`).
    Shared,
}

/// A `TAILMESH_TIMER` value that names no timer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{TIMER_ENV}={0:?}: expected `runtime` or `shared`")]
pub struct UnknownTimer(pub String);

impl TimerChoice {
    /// Parses `TAILMESH_TIMER`'s value (`None`: unset).
    pub fn parse(value: Option<&str>) -> Result<TimerChoice, UnknownTimer> {
        match value.map(str::trim) {
            None | Some("" | "runtime") => Ok(TimerChoice::Runtime),
            Some("shared") => Ok(TimerChoice::Shared),
            Some(other) => Err(UnknownTimer(other.to_owned())),
        }
    }

    /// The process's choice: read once; an invalid value is told once and
    /// the runtime's own timer used.
    fn from_env() -> TimerChoice {
        static CHOICE: OnceLock<TimerChoice> = OnceLock::new();
        *CHOICE.get_or_init(|| {
            let value = std::env::var(TIMER_ENV).ok();
            TimerChoice::parse(value.as_deref()).unwrap_or_else(|e| {
                eprintln!("warning: {e}; using the runtime's own timer");
                TimerChoice::Runtime
            })
        })
    }
}

impl Sleeper {
    /// A precise sleeper for the current runtime: its own
    /// [`RuntimeTimer`], or the shared [`PreciseTimer`] outside a runtime,
    /// when `TAILMESH_TIMER=shared`, or should the runtime's timer fail to
    /// start (told). Sleep on it only in the runtime it was made in (which
    /// must have I/O enabled, as every runtime of tailmesh's has): its
    /// alarm rings only while that runtime runs.
    pub fn precise_here() -> Sleeper {
        if TimerChoice::from_env() == TimerChoice::Shared
            || tokio::runtime::Handle::try_current().is_err()
        {
            return Sleeper::Precise;
        }
        match RuntimeTimer::start() {
            Ok(timer) => Sleeper::Runtime(timer),
            Err(e) => {
                eprintln!(
                    "warning: the runtime's own timer (a timerfd): {e}; \
                     sleeping on the shared timer thread instead"
                );
                Sleeper::Precise
            }
        }
    }

    /// Whether it is one of the precise timers (not tokio's).
    pub fn is_precise(&self) -> bool {
        !matches!(self, Sleeper::Tokio)
    }

    /// Waits until `deadline`.
    pub async fn sleep_until(&self, deadline: Instant) {
        match self {
            Sleeper::Tokio => tokio::time::sleep_until(deadline).await,
            Sleeper::Precise => PreciseTimer::global().sleep_until(deadline).await,
            Sleeper::Runtime(timer) => timer.sleep_until(deadline).await,
        }
    }

    /// Waits for `duration`.
    pub async fn sleep(&self, duration: std::time::Duration) {
        if duration.is_zero() {
            return;
        }
        self.sleep_until(Instant::now() + duration).await;
    }
}

/// How often [`keep_timer_armed`]'s timer fires.
pub const TIMER_ANCHOR_PERIOD: std::time::Duration = std::time::Duration::from_millis(10);

/// Keeps a timer due within [`TIMER_ANCHOR_PERIOD`] in the current tokio
/// runtime for as long as the returned guard lives.
///
/// tokio's timer wakes its own driver (a write to an eventfd, then one
/// more `epoll_wait`) whenever a timer is registered that is due earlier
/// than the wake-up the driver last parked for. A process that handles one
/// request at a time parks with no timer due, so each request's deadlines
/// (the server's `grpc-timeout`, the client's own) cost two such wake-ups,
/// on the runtime's own thread, which is awake anyway. With this timer
/// always due within 10 ms, deadlines further out than that register
/// silently; it costs the process 100 wake-ups a second.
pub fn keep_timer_armed() -> TimerAnchor {
    TimerAnchor(tokio::spawn(async {
        let mut tick = tokio::time::interval(TIMER_ANCHOR_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
        }
    }))
}

/// Stops [`keep_timer_armed`]'s timer when dropped.
#[derive(Debug)]
pub struct TimerAnchor(tokio::task::JoinHandle<()>);

impl Drop for TimerAnchor {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One sleep waiting for its deadline.
struct Entry {
    deadline: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

/// The sleeps a timer has yet to wake, earliest first (equal deadlines in
/// the order they came).
#[derive(Default)]
struct Deadlines {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

impl Deadlines {
    /// Adds a sleep until `deadline`, woken through `wake`.
    fn push(&mut self, deadline: Instant, wake: oneshot::Sender<()>) {
        self.seq += 1;
        let seq = self.seq;
        self.heap.push(Reverse(Entry {
            deadline,
            seq,
            wake,
        }));
    }

    /// The earliest deadline.
    fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(e)| e.deadline)
    }

    /// Wakes every sleep whose deadline is at or before `now`.
    fn wake_due(&mut self, now: Instant) {
        while self.next().is_some_and(|d| d <= now) {
            if let Some(Reverse(entry)) = self.heap.pop() {
                // The sleep may have been given up (its task dropped).
                let _ = entry.wake.send(());
            }
        }
    }

    /// Every sleep still waiting, in no order.
    fn drain(&mut self) -> impl Iterator<Item = Entry> + '_ {
        self.heap.drain().map(|Reverse(e)| e)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A timer thread serving sleeps with the precision of the OS's futex wait.
pub struct PreciseTimer {
    deadlines: Mutex<Deadlines>,
    changed: Condvar,
    /// The serving thread's kernel thread id, once it runs (0 before).
    tid: std::sync::atomic::AtomicI32,
}

impl PreciseTimer {
    /// The process-wide timer, started on first use.
    pub fn global() -> &'static Arc<PreciseTimer> {
        static GLOBAL: OnceLock<Arc<PreciseTimer>> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let timer = Arc::new(PreciseTimer {
                deadlines: Mutex::new(Deadlines::default()),
                changed: Condvar::new(),
                tid: std::sync::atomic::AtomicI32::new(0),
            });
            let serving = Arc::clone(&timer);
            // If the thread cannot be spawned, sleeps never wake; that is a
            // broken process, so fail loudly at once.
            #[allow(clippy::expect_used)]
            thread::Builder::new()
                .name("tailmesh-timer".into())
                .spawn(move || serving.serve())
                .expect("spawn the timer thread");
            timer
        })
    }

    /// Waits until `deadline`; returns at once if it has passed.
    pub async fn sleep_until(&self, deadline: Instant) {
        if deadline <= Instant::now() {
            return;
        }
        let (wake, woken) = oneshot::channel();
        self.adopt(std::iter::once((deadline, wake)));
        // The timer thread never drops a sender before its deadline.
        let _ = woken.await;
    }

    /// Takes sleeps on: each is woken through its sender at its deadline.
    fn adopt(&self, sleeps: impl IntoIterator<Item = (Instant, oneshot::Sender<()>)>) {
        let mut deadlines = lock(&self.deadlines);
        let before = deadlines.next();
        for (deadline, wake) in sleeps {
            deadlines.push(deadline, wake);
        }
        if deadlines.next() != before {
            self.changed.notify_one();
        }
    }

    /// The timer thread's kernel thread id (Linux), e.g. to raise its
    /// priority; `None` before it runs or elsewhere.
    pub fn thread_id(&self) -> Option<i32> {
        let tid = self.tid.load(std::sync::atomic::Ordering::Relaxed);
        (tid > 0).then_some(tid)
    }

    fn serve(&self) {
        #[cfg(target_os = "linux")]
        self.tid.store(
            nix::unistd::gettid().as_raw(),
            std::sync::atomic::Ordering::Relaxed,
        );
        // The kernel may otherwise let this thread's waits run up to 50 us
        // late (the default timer slack) to batch wake-ups.
        #[cfg(target_os = "linux")]
        let _ = nix::sys::prctl::set_timerslack(1_000);
        let mut deadlines = lock(&self.deadlines);
        loop {
            let now = Instant::now();
            deadlines.wake_due(now);
            deadlines = match deadlines.next() {
                Some(next) => {
                    let wait = next.saturating_duration_since(now);
                    self.changed
                        .wait_timeout(deadlines, wait)
                        .map(|(d, _)| d)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
                None => self
                    .changed
                    .wait(deadlines)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

/// A `timerfd` on the monotonic clock (the clock of `Instant`), watched by
/// the poll of the runtime it was made in: its expiry wakes the thread that
/// polls that runtime, with no other thread between. The kernel gives a
/// `timerfd` no timer slack.
pub struct Alarm(AsyncFd<AlarmFd>);

/// The alarm's `timerfd`, which owns its descriptor for as long as it lives.
struct AlarmFd(TimerFd);

impl AsRawFd for AlarmFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl Alarm {
    /// A new alarm, not set, in the current runtime (which must have I/O
    /// enabled).
    pub fn new() -> std::io::Result<Alarm> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // tokio deprecates this safe constructor for the unsafe `register`,
        // whose one condition is that `as_raw_fd` name the same open
        // descriptor for the `AsyncFd`'s life: an `AlarmFd` owns its
        // descriptor (an `OwnedFd` in the `TimerFd`), which closes only when
        // the `AsyncFd` drops it, so the condition holds without `unsafe`.
        #[allow(deprecated)]
        let watched = AsyncFd::with_interest(AlarmFd(fd), Interest::READABLE)?;
        Ok(Alarm(watched))
    }

    /// Sets the alarm to ring `left` from now (at least a nanosecond: a
    /// one-shot time of zero would disarm it), replacing any earlier
    /// setting.
    pub fn set_in(&self, left: Duration) -> std::io::Result<()> {
        let left = left.max(Duration::from_nanos(1));
        self.0.get_ref().0.set(
            Expiration::OneShot(TimeSpec::from_duration(left)),
            TimerSetTimeFlags::empty(),
        )?;
        Ok(())
    }

    /// Waits until the alarm rings, and clears it. (A ring of a setting
    /// since replaced can end the wait too: check the time.)
    pub async fn rung(&self) -> std::io::Result<()> {
        loop {
            let mut ready = self.0.readable().await?;
            // Reading the expiry count clears the alarm; `EAGAIN` means the
            // poll's readiness was stale: wait again.
            match nix::unistd::read(&self.0.get_ref().0, &mut [0u8; 8]) {
                Ok(_) => {
                    // Not readable again until it rings again.
                    ready.clear_ready();
                    return Ok(());
                }
                Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits until `deadline`; returns at once if it has passed, never
    /// before it: the alarm is set for what is left of it, and set again if
    /// it rang early by `Instant`'s reading. For one wait at a time: the
    /// alarm holds one deadline.
    pub async fn sleep_until(&mut self, deadline: Instant) -> std::io::Result<()> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            self.set_in(left)?;
            self.rung().await?;
        }
    }
}

/// A runtime's own precise timer: the sleeps of tasks in one runtime in a
/// heap, and one [`Alarm`] set for the earliest, served by a task of that
/// runtime. When the alarm rings, that task wakes the sleeps that are due
/// and sets the alarm for the next: the runtime's thread is woken by the
/// kernel's timer and wakes the sleeping tasks itself, so a sleep costs one
/// wake-up, where the [`PreciseTimer`] costs two (its thread's, then the
/// runtime's). Should the runtime stop (or the alarm fail), its sleeps and
/// later ones go on to the [`PreciseTimer`]. When the last clone is
/// dropped, the task ends and the alarm closes.
#[derive(Clone)]
pub struct RuntimeTimer(Arc<Owner>);

/// What the timer's clones share: its alarms, whose task it stops when
/// dropped (no sleep can be waiting then: each borrows a clone).
struct Owner(Arc<Alarms>);

impl Drop for Owner {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.closed = true;
        // Ring now, so the task wakes and sees it is closed (should the
        // alarm fail, the task lives on until its runtime ends).
        let _ = self.0.alarm.set_in(Duration::ZERO);
    }
}

impl std::fmt::Debug for RuntimeTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RuntimeTimer")
    }
}

struct Alarms {
    alarm: Alarm,
    state: Mutex<AlarmState>,
}

#[derive(Default)]
struct AlarmState {
    deadlines: Deadlines,
    /// The deadline the alarm is set for (`None`: not set).
    set_for: Option<Instant>,
    /// The serving task has stopped: sleeps go to the [`PreciseTimer`].
    gone: bool,
    /// Every clone of the timer was dropped: the serving task ends.
    closed: bool,
}

impl RuntimeTimer {
    /// A timer for the current runtime (which must have I/O enabled), its
    /// task started.
    pub fn start() -> std::io::Result<RuntimeTimer> {
        let alarms = Arc::new(Alarms {
            alarm: Alarm::new()?,
            state: Mutex::new(AlarmState::default()),
        });
        tokio::spawn(serve_alarms(Handover(Arc::clone(&alarms))));
        Ok(RuntimeTimer(Arc::new(Owner(alarms))))
    }

    /// Waits until `deadline`; returns at once if it has passed.
    pub async fn sleep_until(&self, deadline: Instant) {
        let now = Instant::now();
        if deadline <= now {
            return;
        }
        let (wake, woken) = oneshot::channel();
        {
            let mut state = lock(&self.0.0.state);
            if state.gone {
                drop(state);
                PreciseTimer::global().adopt(std::iter::once((deadline, wake)));
            } else {
                state.deadlines.push(deadline, wake);
                if state.set_for.is_none_or(|set| deadline < set) {
                    if let Err(e) = self.0.0.alarm.set_in(deadline - now) {
                        give_up(&mut state, &e);
                    } else {
                        state.set_for = Some(deadline);
                    }
                }
            }
        }
        // No sender is dropped before its deadline: the serving task wakes
        // each, and hands any left over to the shared timer when it stops.
        let _ = woken.await;
    }
}

/// The alarm's task: wakes the due sleeps each time it rings and sets it
/// for the next; when it stops (its runtime shuts down, or the alarm
/// fails), the sleeps left go to the shared timer. (`Handover` is an
/// argument, not made in the body, so that it acts even when the task is
/// dropped before it first runs.)
async fn serve_alarms(handover: Handover) {
    let alarms = &handover.0;
    loop {
        if let Err(e) = alarms.alarm.rung().await {
            give_up(&mut lock(&alarms.state), &e);
            return;
        }
        let mut state = lock(&alarms.state);
        if state.closed {
            return;
        }
        let now = Instant::now();
        state.deadlines.wake_due(now);
        state.set_for = None;
        if let Some(next) = state.deadlines.next() {
            match alarms.alarm.set_in(next - now) {
                Ok(()) => state.set_for = Some(next),
                Err(e) => {
                    give_up(&mut state, &e);
                    return;
                }
            }
        }
    }
}

/// Stops the runtime timer for good: tells why, and hands its sleeps to the
/// shared timer, as later ones will be.
fn give_up(state: &mut AlarmState, e: &std::io::Error) {
    if !state.gone {
        eprintln!(
            "warning: the runtime's own timer (a timerfd): {e}; sleeping on the shared timer thread"
        );
    }
    hand_over(state);
}

fn hand_over(state: &mut AlarmState) {
    state.gone = true;
    state.set_for = None;
    // Only when there is something to hand over: the shared timer's
    // thread starts on first use.
    if state.deadlines.next().is_some() {
        PreciseTimer::global().adopt(state.deadlines.drain().map(|e| (e.deadline, e.wake)));
    }
}

/// Hands the sleeps left to the shared timer when the serving task ends,
/// however it ends (its runtime dropping it included).
struct Handover(Arc<Alarms>);

impl Drop for Handover {
    fn drop(&mut self) {
        hand_over(&mut lock(&self.0.state));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Three sleeps of `sleeper`, begun out of order, end in deadline order
    /// and none before its deadline.
    async fn sleeps_in_order(sleeper: Sleeper) {
        let start = Instant::now();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, us) in [900u64, 300, 600].into_iter().enumerate() {
            let order = Arc::clone(&order);
            let sleeper = sleeper.clone();
            tasks.push(tokio::spawn(async move {
                let deadline = start + Duration::from_micros(us);
                sleeper.sleep_until(deadline).await;
                assert!(Instant::now() >= deadline, "woke before its deadline");
                lock(&order).push(i);
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .unwrap_or_else(|_| panic!("a sleep of at most 900 us never woke"))
                .unwrap_or_else(|e| panic!("sleep task failed: {e}"));
        }
        assert_eq!(*lock(&order), vec![1, 2, 0]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sleeps_end_in_deadline_order_and_not_early() {
        sleeps_in_order(Sleeper::Precise).await;
        let here = Sleeper::precise_here();
        if TimerChoice::from_env() == TimerChoice::Runtime {
            assert!(
                matches!(here, Sleeper::Runtime(_)),
                "a runtime with I/O gets its own timer, got {here:?}"
            );
        }
        sleeps_in_order(here.clone()).await;
        // Again, on the same alarm, after it has rung and been left unset.
        sleeps_in_order(here).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_runtime_timer_serves_a_multi_thread_runtime() {
        sleeps_in_order(Sleeper::precise_here()).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_earlier_sleep_sets_the_alarm_sooner() {
        let sleeper = Sleeper::precise_here();
        let long = {
            let sleeper = sleeper.clone();
            tokio::spawn(async move { sleeper.sleep(Duration::from_secs(60)).await })
        };
        // Let the long sleep set the alarm first.
        tokio::task::yield_now().await;
        let short = sleeper.sleep(Duration::from_millis(1));
        assert!(
            tokio::time::timeout(Duration::from_secs(10), short)
                .await
                .is_ok(),
            "a 1 ms sleep begun after a 60 s one waited for the 60 s alarm"
        );
        assert!(!long.is_finished(), "the 60 s sleep ended early");
        long.abort();
    }

    #[test]
    fn sleeps_left_when_a_runtime_stops_are_woken_by_the_shared_timer() {
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let sleeper = first.block_on(async { Sleeper::precise_here() });
        assert!(matches!(sleeper, Sleeper::Runtime(_)));
        // A sleep on the first runtime's timer, waited for on a second
        // runtime while the first does not run: its alarm rings unheard
        // until the first runtime drops its serving task.
        let second = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let deadline = Instant::now() + Duration::from_millis(5);
        let pending = {
            let sleeper = sleeper.clone();
            second.spawn(async move {
                sleeper.sleep_until(deadline).await;
                Instant::now()
            })
        };
        drop(first);
        let woke = second
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), pending).await })
            .unwrap_or_else(|_| panic!("a sleep left on a stopped runtime's timer never woke"))
            .unwrap_or_else(|e| panic!("sleep task failed: {e}"));
        assert!(woke >= deadline, "woke before its deadline");
        // Later sleeps on it go to the shared timer at once.
        let later = Instant::now() + Duration::from_millis(1);
        second.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), sleeper.sleep_until(later))
                .await
                .unwrap_or_else(|_| panic!("a sleep on a stopped runtime's timer never woke"));
        });
        assert!(Instant::now() >= later);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_timer_no_one_holds_ends_its_task_and_closes_its_alarm() {
        let timer = RuntimeTimer::start().unwrap_or_else(|e| panic!("{e}"));
        Sleeper::Runtime(timer.clone())
            .sleep(Duration::from_micros(200))
            .await;
        let alarms = Arc::downgrade(&timer.0.0);
        drop(timer);
        let deadline = Instant::now() + Duration::from_secs(10);
        while alarms.strong_count() > 0 {
            assert!(
                Instant::now() < deadline,
                "the alarm's task outlived every clone of its timer"
            );
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn outside_a_runtime_the_shared_timer_is_chosen() {
        assert!(matches!(Sleeper::precise_here(), Sleeper::Precise));
    }

    #[test]
    fn the_timer_variable_parses_and_a_bad_value_is_named() {
        assert_eq!(TimerChoice::parse(None), Ok(TimerChoice::Runtime));
        assert_eq!(TimerChoice::parse(Some("")), Ok(TimerChoice::Runtime));
        assert_eq!(
            TimerChoice::parse(Some("runtime")),
            Ok(TimerChoice::Runtime)
        );
        assert_eq!(
            TimerChoice::parse(Some(" shared ")),
            Ok(TimerChoice::Shared)
        );
        let e = TimerChoice::parse(Some("thread"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("TAILMESH_TIMER") && e.contains("\"thread\""),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn past_deadlines_return_at_once() {
        let before = Instant::now();
        PreciseTimer::global().sleep_until(before).await;
        Sleeper::Precise.sleep(Duration::ZERO).await;
        Sleeper::precise_here().sleep_until(before).await;
        assert!(before.elapsed() < Duration::from_secs(1));
    }
}
