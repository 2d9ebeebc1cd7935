//! Queue disciplines: which waiting request a free worker or slot takes
//! next, and which it gives up on. One definition serves both queues a
//! request can wait in: a broker topic (pull) and a push replica's line for
//! a slot.
//!
//! - `fifo`: oldest first. Under overload every request waits the whole
//!   queue: the answered ones come late, and once the wait passes the
//!   callers' deadline, the work done is for requests nobody waits for any
//!   more (goodput collapses, p99 sits at the timeout).
//! - `lifo`: newest first. Most requests are served fresh, a few wait until
//!   their deadline: the median stays low under overload, the tail of the
//!   unlucky is the timeout.
//! - `adaptive`: the adaptive LIFO with a CoDel-style target from "Fail at
//!   Scale" (Facebook, ACM Queue 2015). While the queue has been empty
//!   within the last [`ADAPTIVE_INTERVAL`] (100 ms) it is FIFO and sheds
//!   nothing. Once it has not been empty for that long (a standing queue:
//!   overload, not a burst), it serves the newest first and sheds every
//!   request that has waited longer than [`ADAPTIVE_TARGET`] (20 ms),
//!   answering it RESOURCE_EXHAUSTED at once, so its caller can go
//!   elsewhere instead of timing out. Answered requests then wait at most
//!   about the target, and the workers stay busy with fresh requests:
//!   goodput stays near capacity.

use tokio::time::Instant;

pub use tailmesh_model::discipline::{
    ADAPTIVE_INTERVAL, ADAPTIVE_TARGET, Discipline, UnknownDiscipline,
};

/// A queue's discipline with the state it needs: when the queue was last
/// seen empty. The queue itself stays the caller's; this only decides.
#[derive(Clone, Debug)]
pub(crate) struct Line {
    discipline: Discipline,
    /// When capacity last found the queue empty.
    last_empty: Instant,
}

impl Line {
    /// A line that starts empty at `now`.
    pub(crate) fn new(discipline: Discipline, now: Instant) -> Self {
        Line {
            discipline,
            last_empty: now,
        }
    }

    pub(crate) fn discipline(&self) -> Discipline {
        self.discipline
    }

    /// Records that capacity found nothing waiting at `now`: a slot or
    /// worker came free with an empty queue, or a request was served at
    /// once. Only that ends a standing queue; a queue that shedding
    /// emptied while every worker stays busy still stands.
    pub(crate) fn idle(&mut self, now: Instant) {
        self.last_empty = now;
    }

    /// Whether `adaptive` sees a standing queue at `now`.
    fn standing(&self, now: Instant) -> bool {
        self.discipline == Discipline::Adaptive
            && now.saturating_duration_since(self.last_empty) > ADAPTIVE_INTERVAL
    }

    /// Whether the next request served is the newest one (the back of the
    /// queue) rather than the oldest.
    pub(crate) fn newest_first(&self, now: Instant) -> bool {
        match self.discipline {
            Discipline::Fifo => false,
            Discipline::Lifo => true,
            Discipline::Adaptive => self.standing(now),
        }
    }

    /// Whether a request queued at `enqueued_at` is shed at `now` rather
    /// than served.
    pub(crate) fn sheds(&self, enqueued_at: Instant, now: Instant) -> bool {
        self.standing(now) && now.saturating_duration_since(enqueued_at) > ADAPTIVE_TARGET
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn adaptive_turns_lifo_and_sheds_only_once_the_queue_stands() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut line = Line::new(Discipline::Adaptive, t0);
        // A burst shorter than the interval: FIFO, nothing shed.
        assert!(!line.newest_first(ms(50)));
        assert!(!line.sheds(t0, ms(50)));
        // Idle again at 60 ms: the interval counts from there.
        line.idle(ms(60));
        assert!(!line.newest_first(ms(160)));
        assert!(line.newest_first(ms(161)));
        // Standing: a 20 ms wait is kept, a longer one is shed.
        assert!(!line.sheds(ms(141), ms(161)));
        assert!(line.sheds(ms(140), ms(161)));

        let fifo = Line::new(Discipline::Fifo, t0);
        let lifo = Line::new(Discipline::Lifo, t0);
        for now in [ms(1), ms(10_000)] {
            assert!(!fifo.newest_first(now) && !fifo.sheds(t0, now));
            assert!(lifo.newest_first(now) && !lifo.sheds(t0, now));
        }
    }
}
