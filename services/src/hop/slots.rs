//! A replica's slots for its own work, and the bounded line of requests
//! waiting for one, served in the hop's [`Discipline`].
//!
//! Invariants:
//! - `free` slots exist only while nobody waits: a released slot goes
//!   straight to the next waiter the discipline picks. A slot that finds
//!   nobody waiting, or a request served at once, tells the discipline the
//!   line is idle (what ends a standing queue for `adaptive`).
//! - `line` holds the waiters in arrival order; a waiter whose request was
//!   cancelled leaves its entry behind with a closed channel (skipped when
//!   met, compacted once such entries outnumber live ones), so it stays
//!   bounded by the queue limit plus as many cancelled entries.
//! - `waiting` counts the live entries. Sending a waiter its grant and a
//!   waiter closing its channel both happen under the lock, so an entry is
//!   either granted (by whoever pops it) or cancelled (by its waiter), never
//!   both, and a grant that arrives as its waiter gives up is passed on.

use std::{
    collections::VecDeque,
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::{sync::oneshot, time::Instant};

use super::error::CallError;
use crate::discipline::{Discipline, Line};

/// Cancelled entries tolerated before compaction is considered.
const STALE_COMPACT_MIN: usize = 64;

/// What a waiter is told.
#[derive(Debug)]
enum Grant {
    /// A slot is now its own.
    Slot,
    /// The discipline gave up on it after this wait.
    Shed(Duration),
}

struct Waiter {
    since: Instant,
    tx: oneshot::Sender<Grant>,
}

struct State {
    free: u32,
    line: VecDeque<Waiter>,
    waiting: usize,
    discipline: Line,
}

/// A replica's slots and its line for them.
pub(crate) struct Slots {
    state: Mutex<State>,
    /// The most that may wait (push); `None` for a pull worker, which never
    /// takes more tasks than it has slots (its queue is the broker's).
    queue_limit: Option<u32>,
}

/// A slot held until dropped; then it goes to the next waiter.
pub(crate) struct Slot<'a> {
    slots: &'a Slots,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.release();
    }
}

impl Slots {
    /// `slots` slots (at least one), with a line of at most `queue_limit`
    /// waiters (`None`: unbounded) served in `discipline`.
    pub(crate) fn new(slots: u32, queue_limit: Option<u32>, discipline: Discipline) -> Self {
        Slots {
            state: Mutex::new(State {
                free: slots.max(1),
                line: VecDeque::new(),
                waiting: 0,
                discipline: Line::new(discipline, Instant::now()),
            }),
            queue_limit,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a few field writes; a panic cannot leave one half
        // done in a way later callers could trip on.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests waiting for a slot now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// A slot, at once or after waiting in line; refused at once when the
    /// line is full, or later when the discipline sheds the request.
    pub(crate) async fn acquire(&self, hop: &str, replica: u32) -> Result<Slot<'_>, CallError> {
        let rx = {
            let now = Instant::now();
            let mut state = self.lock();
            state.shed(now);
            if state.free > 0 {
                state.free -= 1;
                state.discipline.idle(now);
                return Ok(Slot { slots: self });
            }
            if let Some(limit) = self.queue_limit
                && state.waiting >= limit as usize
            {
                return Err(CallError::QueueFull {
                    hop: hop.to_owned(),
                    replica,
                    limit,
                });
            }
            let (tx, rx) = oneshot::channel();
            state.line.push_back(Waiter { since: now, tx });
            state.waiting += 1;
            state.compact();
            rx
        };
        let mut waiting = InLine {
            slots: self,
            rx,
            answered: false,
        };
        let grant = (&mut waiting.rx).await;
        waiting.answered = true;
        match grant {
            Ok(Grant::Slot) => Ok(Slot { slots: self }),
            Ok(Grant::Shed(waited)) => Err(CallError::Shed {
                hop: hop.to_owned(),
                replica,
                waited,
            }),
            // Senders are only dropped unsent when the state is: never
            // while `self` lives. Treat it as a refusal anyway.
            Err(_) => Err(CallError::ShuttingDown {
                hop: hop.to_owned(),
            }),
        }
    }

    /// A slot came free: it goes to the next waiter, or back to the pool.
    fn release(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        state.shed(now);
        state.pass_on(now);
    }
}

impl State {
    /// Takes the next live waiter in the discipline's order.
    fn pop(&mut self, now: Instant) -> Option<Waiter> {
        let newest_first = self.discipline.newest_first(now);
        while let Some(w) = if newest_first {
            self.line.pop_back()
        } else {
            self.line.pop_front()
        } {
            if w.tx.is_closed() {
                continue;
            }
            self.waiting -= 1;
            return Some(w);
        }
        None
    }

    /// Hands a free slot to the next waiter, or back to the pool when
    /// nobody waits (the line is then idle).
    fn pass_on(&mut self, now: Instant) {
        // The receiver is open (checked under this lock), so the send
        // arrives.
        let granted = self
            .pop(now)
            .is_some_and(|w| w.tx.send(Grant::Slot).is_ok());
        if !granted {
            self.free += 1;
            self.discipline.idle(now);
        }
    }

    /// Answers the waiters the discipline gives up on, oldest first.
    fn shed(&mut self, now: Instant) {
        while let Some(w) = self.line.front() {
            if w.tx.is_closed() {
                self.line.pop_front();
                continue;
            }
            if !self.discipline.sheds(w.since, now) {
                break;
            }
            if let Some(w) = self.line.pop_front() {
                self.waiting -= 1;
                let _ =
                    w.tx.send(Grant::Shed(now.saturating_duration_since(w.since)));
            }
        }
    }

    /// Drops cancelled entries once they outnumber live ones.
    fn compact(&mut self) {
        let stale = self.line.len() - self.waiting;
        if stale > STALE_COMPACT_MIN && stale > self.waiting {
            self.line.retain(|w| !w.tx.is_closed());
        }
    }
}

/// A place in line, given up when dropped before its grant arrived (the
/// caller gave up and the request was cancelled).
struct InLine<'a> {
    slots: &'a Slots,
    rx: oneshot::Receiver<Grant>,
    /// The grant was received: nothing to give up.
    answered: bool,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let now = Instant::now();
        let mut state = self.slots.lock();
        self.rx.close();
        match self.rx.try_recv() {
            // Granted as it gave up: pass the slot on.
            Ok(Grant::Slot) => state.pass_on(now),
            // Already answered; nothing to undo.
            Ok(Grant::Shed(_)) => {}
            Err(_) => state.waiting -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{future::Future, pin::Pin, sync::Arc, task::Poll};

    use futures::poll;

    use super::*;

    type Acquire<'a> = Pin<Box<dyn Future<Output = Result<Slot<'a>, CallError>> + 'a>>;

    /// A waiter that is in line: polled once, not served.
    async fn queued(slots: &Slots) -> Acquire<'_> {
        let mut w: Acquire<'_> = Box::pin(slots.acquire("b", 0));
        tokio::task::yield_now().await;
        assert!(poll!(&mut w).is_pending(), "got a slot at once");
        w
    }

    /// Holds the one slot, queues `n` waiters 1 ms apart, waits `age`,
    /// then frees the slot and lets each waiter served use it and free it
    /// again: the order they were served in, by arrival index.
    async fn served_order(slots: &Slots, n: usize, age: Duration) -> Vec<usize> {
        let held = slots.acquire("b", 0).await.expect("a free slot");
        let mut waiters = Vec::new();
        for _ in 0..n {
            waiters.push(Some(queued(slots).await));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        tokio::time::advance(age).await;
        drop(held);
        let mut order = Vec::new();
        'serve: while order.len() < n {
            for (i, w) in waiters.iter_mut().enumerate() {
                let Some(fut) = w else { continue };
                tokio::task::yield_now().await;
                if let Poll::Ready(r) = poll!(fut) {
                    *w = None;
                    drop(r.expect("served, not refused"));
                    order.push(i);
                    continue 'serve;
                }
            }
            panic!("nobody got the free slot; served so far {order:?}");
        }
        order
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_serves_the_oldest_first() {
        let slots = Slots::new(1, Some(10), Discipline::Fifo);
        let order = served_order(&slots, 4, Duration::from_secs(1)).await;
        assert_eq!(order, vec![0, 1, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn lifo_serves_the_newest_first() {
        let slots = Slots::new(1, Some(10), Discipline::Lifo);
        let order = served_order(&slots, 4, Duration::from_secs(1)).await;
        assert_eq!(order, vec![3, 2, 1, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn adaptive_is_fifo_in_a_burst() {
        let slots = Slots::new(1, Some(10), Discipline::Adaptive);
        // The line stands for 10 ms, well under the interval: no shedding,
        // although every wait is over the target.
        let order = served_order(&slots, 4, Duration::from_millis(6)).await;
        assert_eq!(order, vec![0, 1, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn adaptive_sheds_the_old_and_serves_the_new_once_the_line_stands() {
        let slots = Slots::new(1, Some(1000), Discipline::Adaptive);
        let held = slots.acquire("b", 0).await.expect("a free slot");
        // One arrival per ms for 150 ms while the slot stays busy: the line
        // stands from 100 ms on.
        let mut waiters = Vec::new();
        for _ in 0..150 {
            waiters.push(queued(&slots).await);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // Freed at 150 ms: whoever waited over the 20 ms target (0..=129)
        // is shed, the newest (149) is served, 130..=148 still wait.
        drop(held);
        let mut outcome = Vec::new();
        let mut held = Vec::new();
        for w in &mut waiters {
            // A fresh coop budget for each poll: an exhausted one reads as
            // pending.
            tokio::task::yield_now().await;
            outcome.push(match poll!(w) {
                Poll::Ready(Ok(slot)) => {
                    held.push(slot);
                    "served"
                }
                Poll::Ready(Err(e @ CallError::Shed { .. })) => {
                    let status = tonic::Status::from(e);
                    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
                    "shed"
                }
                Poll::Ready(Err(e)) => panic!("unexpected {e}"),
                Poll::Pending => "waiting",
            });
        }
        let count = |what| outcome.iter().filter(|o| **o == what).count();
        assert_eq!(outcome[149], "served", "{outcome:?}");
        assert_eq!(&outcome[130..149], ["waiting"; 19]);
        assert_eq!((count("shed"), count("waiting")), (130, 19), "{outcome:?}");
        assert_eq!(slots.waiting(), 19);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_place_in_line_back() {
        let slots = Arc::new(Slots::new(1, Some(1), Discipline::Fifo));
        let held = slots.acquire("b", 0).await.expect("a free slot");
        let waiter = tokio::spawn({
            let slots = Arc::clone(&slots);
            async move {
                slots
                    .acquire("b", 0)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        });
        while slots.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let refused = slots
            .acquire("b", 0)
            .await
            .map(drop)
            .map_err(|e| e.to_string());
        assert_eq!(
            refused,
            Err("hop \"b\" replica 0: 1 requests already wait for a slot (queue_limit)".into())
        );

        // The caller gives up (its request is dropped): the line empties.
        waiter.abort();
        assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(slots.waiting(), 0);
        drop(held);
        assert!(slots.acquire("b", 0).await.is_ok());
    }

    #[tokio::test]
    async fn a_grant_to_a_waiter_that_gives_up_is_passed_on() {
        let slots = Slots::new(1, None, Discipline::Fifo);
        let held = slots.acquire("b", 0).await.expect("a free slot");
        let first = queued(&slots).await;
        let second = queued(&slots).await;
        // The slot goes to the first, which is cancelled before it sees it.
        drop(held);
        drop(first);
        assert!(second.await.is_ok());
        assert_eq!(slots.waiting(), 0);
        assert!(slots.acquire("b", 0).await.is_ok(), "the slot came back");
    }

    #[tokio::test]
    async fn a_zero_limit_refuses_whenever_every_slot_is_busy() {
        let slots = Slots::new(1, Some(0), Discipline::Fifo);
        let held = slots.acquire("b", 0).await.expect("a free slot");
        assert!(matches!(
            slots.acquire("b", 0).await,
            Err(CallError::QueueFull { limit: 0, .. })
        ));
        drop(held);
        assert!(slots.acquire("b", 0).await.is_ok());
    }
}
