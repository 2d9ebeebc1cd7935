//! Sleeps with sub-millisecond precision.
//!
//! tokio's timer wheel has a resolution of one millisecond: a 200 us sleep
//! takes about a millisecond, which would distort every sub-millisecond work
//! model and open-loop schedule this testbed exists to measure. The
//! [`PreciseTimer`] keeps deadlines in a heap served by one thread that
//! waits on a condition variable (a futex: tens of microseconds of slack),
//! and wakes the sleeping task through a oneshot channel.
//!
//! [`Sleeper`] chooses between it and tokio's timer, which tests use with
//! `tokio::time::pause()`.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    sync::{Arc, Condvar, Mutex, OnceLock},
    thread,
};

use tokio::{sync::oneshot, time::Instant};

/// How a component waits.
#[derive(Clone, Debug, Default)]
pub enum Sleeper {
    /// tokio's timer: millisecond resolution, follows `tokio::time::pause()`.
    Tokio,
    /// The process-wide precise timer (the default for real runs).
    #[default]
    Precise,
}

impl Sleeper {
    /// Waits until `deadline`.
    pub async fn sleep_until(&self, deadline: Instant) {
        match self {
            Sleeper::Tokio => tokio::time::sleep_until(deadline).await,
            Sleeper::Precise => PreciseTimer::global().sleep_until(deadline).await,
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

#[derive(Default)]
struct State {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

/// A timer thread serving sleeps with the precision of the OS's futex wait.
pub struct PreciseTimer {
    state: Mutex<State>,
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
                state: Mutex::new(State::default()),
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
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.seq += 1;
            let seq = state.seq;
            let earliest = state
                .heap
                .peek()
                .is_none_or(|Reverse(e)| deadline < e.deadline);
            state.heap.push(Reverse(Entry {
                deadline,
                seq,
                wake,
            }));
            if earliest {
                self.changed.notify_one();
            }
        }
        // The timer thread never drops a sender before its deadline.
        let _ = woken.await;
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
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            while state
                .heap
                .peek()
                .is_some_and(|Reverse(e)| e.deadline <= now)
            {
                if let Some(Reverse(entry)) = state.heap.pop() {
                    let _ = entry.wake.send(());
                }
            }
            state = match state.heap.peek() {
                Some(Reverse(next)) => {
                    let wait = next.deadline.saturating_duration_since(now);
                    self.changed
                        .wait_timeout(state, wait)
                        .map(|(s, _)| s)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
                None => self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn sleeps_end_in_deadline_order_and_not_early() {
        let start = Instant::now();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, us) in [900u64, 300, 600].into_iter().enumerate() {
            let order = Arc::clone(&order);
            tasks.push(tokio::spawn(async move {
                let deadline = start + Duration::from_micros(us);
                Sleeper::Precise.sleep_until(deadline).await;
                assert!(Instant::now() >= deadline, "woke before its deadline");
                order.lock().unwrap_or_else(|e| e.into_inner()).push(i);
            }));
        }
        for t in tasks {
            t.await.unwrap_or_else(|e| panic!("sleep task failed: {e}"));
        }
        let order = order.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(order, vec![1, 2, 0]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn past_deadlines_return_at_once() {
        let before = Instant::now();
        PreciseTimer::global().sleep_until(before).await;
        Sleeper::Precise.sleep(Duration::ZERO).await;
        assert!(before.elapsed() < Duration::from_secs(1));
    }
}
