//! Background work done in short turns. A run's own background threads (a
//! process's span exporter, the load generator's records thread and its
//! requests.csv writer) work in batches of a millisecond or more, at the
//! priority of the threads they share the cores with; on a small machine a
//! serving thread woken on a core where one of them runs waited for the
//! rest of its batch (about a third of a millisecond on average, 150 to
//! 200 times in three seconds of a zero-work chain on 2 cores,
//! `perf sched timehist`). A thread that offers its core every [`TURN`]
//! of work holds a woken serving thread off for at most about a turn.
//!
//! On a saturated machine such a thread gets far less than its share (each
//! offer puts it behind every thread waiting for the core), as it would
//! at a lower priority; a thread whose work must keep up with the load
//! (the load generator's records wait for room in its queue) stops
//! offering while it is behind, and works at its full share until it has
//! caught up.

use std::time::Duration;

// Outside a runtime (these threads have none, or run outside its clock)
// tokio's clock is the OS's monotonic clock.
use tokio::time::Instant;

/// How long a background thread works before it offers its core.
pub const TURN: Duration = Duration::from_micros(50);

/// Offers the calling thread's core once a [`TURN`] of work.
#[derive(Debug)]
pub struct Turns {
    since: Instant,
}

impl Default for Turns {
    fn default() -> Self {
        Turns::new()
    }
}

impl Turns {
    pub fn new() -> Turns {
        Turns {
            since: Instant::now(),
        }
    }

    /// Called after each piece of work: a [`TURN`] after the last offer
    /// (or the last [`Turns::begin`]), offers the core (`sched_yield`:
    /// the kernel runs a thread waiting for this core, if one is, and
    /// returns at once if none is). Whether it offered.
    pub fn tick(&mut self) -> bool {
        if self.since.elapsed() < TURN {
            return false;
        }
        std::thread::yield_now();
        self.since = Instant::now();
        true
    }

    /// Starts a turn: after a wait, the thread has not been working.
    pub fn begin(&mut self) {
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // tokio's paused clock moves only when told, so no preemption of the
    // test's thread can pass a turn between two lines.
    #[tokio::test(start_paused = true)]
    async fn a_turn_is_offered_only_after_a_turn_of_work() {
        let mut turns = Turns::new();
        assert!(!turns.tick());
        tokio::time::advance(TURN - Duration::from_micros(1)).await;
        assert!(!turns.tick());
        tokio::time::advance(Duration::from_micros(1)).await;
        assert!(turns.tick());
        // The offer began the next turn.
        assert!(!turns.tick());
        tokio::time::advance(3 * TURN).await;
        // A wait is not work.
        turns.begin();
        assert!(!turns.tick());
        tokio::time::advance(TURN).await;
        assert!(turns.tick());
    }
}
