//! The thread behind the load generator's: each measured request's record
//! is handed over in memory, and what reads it (the variant's analysis,
//! the tail sampler, requests.csv) runs there, so the thread that sends
//! the requests and times their answers does none of it.
//!
//! The load generator's side only pushes onto a queue, under a lock held
//! for a push or a swap. It wakes the thread behind once every
//! [`WAKE_EVERY`] records (a wake is a system call); the thread behind
//! also looks on its own every [`LOOK_EVERY`], so at a low rate a record
//! waits at most about that long. A message (a variant beginning or
//! ending) wakes it at once, in order with the records. The queue holds
//! at most [`QUEUE_LIMIT`] records: past that the load generator waits
//! for room, as it does for a full requests.csv queue, so memory stays
//! bounded and nothing is dropped.

use std::{
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, mpsc},
    thread::JoinHandle,
    time::Duration,
};

use tailmesh_services::turns::Turns;

use super::RequestRecord;

/// What the thread behind does with what it is handed, in the order it
/// was handed.
pub(crate) trait Behind: Send + 'static {
    /// What the load generator's side tells it besides records.
    type Message: Send + 'static;

    /// One measured request's record.
    fn record(&mut self, record: RequestRecord);

    /// One message.
    fn message(&mut self, message: Self::Message);
}

/// Records queued before the thread behind is woken.
pub(crate) const WAKE_EVERY: usize = 128;
/// How often the thread behind looks at the queue when not woken.
pub(crate) const LOOK_EVERY: Duration = Duration::from_millis(10);
/// Records queued at most; the load generator waits past it.
pub(crate) const QUEUE_LIMIT: usize = 4096;

enum Item<M> {
    Record(RequestRecord),
    Message(M),
    /// Everything before it is done: the sender is told.
    Settled(mpsc::SyncSender<()>),
}

struct Queue<M> {
    items: Vec<Item<M>>,
    /// Records among `items`.
    records: usize,
    /// A message waits: the thread behind takes the queue at once.
    urgent: bool,
    /// No more will come (the handle finished or went).
    closed: bool,
    /// The thread behind is gone (it panicked): what comes is dropped.
    gone: bool,
    /// The load generator's side waits for room.
    waiting_for_room: bool,
    /// The most records queued at once.
    peak: usize,
}

struct Handoff<M> {
    queue: Mutex<Queue<M>>,
    /// The thread behind waits on it.
    ready: Condvar,
    /// The load generator's side waits on it when the queue is full.
    room: Condvar,
}

impl<M> Handoff<M> {
    fn lock(&self) -> MutexGuard<'_, Queue<M>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The handle of a thread behind, owning a `B` until
/// [`BehindThread::finish`] gives it back.
pub(crate) struct BehindThread<B: Behind> {
    handoff: Arc<Handoff<B::Message>>,
    thread: Option<JoinHandle<B>>,
}

impl<B: Behind> std::fmt::Debug for BehindThread<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BehindThread").finish_non_exhaustive()
    }
}

/// The thread behind ended without giving its state back: it panicked.
#[derive(Debug, thiserror::Error)]
#[error("the thread behind the load generator ({0}) stopped without finishing")]
pub struct BehindPanicked(pub String);

impl<B: Behind> BehindThread<B> {
    /// Moves `state` to a new thread called `name`.
    pub(crate) fn start(name: &str, state: B) -> std::io::Result<Self> {
        let handoff = Arc::new(Handoff {
            queue: Mutex::new(Queue {
                items: Vec::new(),
                records: 0,
                urgent: false,
                closed: false,
                gone: false,
                waiting_for_room: false,
                peak: 0,
            }),
            ready: Condvar::new(),
            room: Condvar::new(),
        });
        let behind = Arc::clone(&handoff);
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || serve(state, &behind))?;
        Ok(BehindThread {
            handoff,
            thread: Some(thread),
        })
    }

    /// Hands `record` over; waits while the queue is full.
    pub(crate) fn record(&self, record: RequestRecord) {
        let mut q = self.handoff.lock();
        while q.records >= QUEUE_LIMIT && !q.gone {
            q.waiting_for_room = true;
            self.handoff.ready.notify_one();
            q = self
                .handoff
                .room
                .wait(q)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if q.gone {
            return;
        }
        q.items.push(Item::Record(record));
        q.records += 1;
        q.peak = q.peak.max(q.records);
        if q.records == WAKE_EVERY {
            self.handoff.ready.notify_one();
        }
    }

    /// Hands `message` over, after the records before it.
    pub(crate) fn send(&self, message: B::Message) {
        self.push_urgent(Item::Message(message));
    }

    /// Waits until the thread behind has done everything handed to it so
    /// far.
    pub(crate) fn settle(&self) {
        let (done, settled) = mpsc::sync_channel(1);
        self.push_urgent(Item::Settled(done));
        // Dropped unanswered only when the thread is gone.
        let _ = settled.recv();
    }

    fn push_urgent(&self, item: Item<B::Message>) {
        let mut q = self.handoff.lock();
        if q.gone {
            return;
        }
        q.items.push(item);
        q.urgent = true;
        self.handoff.ready.notify_one();
    }

    /// The most records that waited for the thread behind at once, since
    /// the last time asked.
    pub(crate) fn take_peak(&self) -> usize {
        let mut q = self.handoff.lock();
        let now = q.records;
        std::mem::replace(&mut q.peak, now)
    }

    /// Lets the thread behind finish what it was handed, and takes its
    /// state back.
    pub(crate) fn finish(mut self) -> Result<B, BehindPanicked> {
        self.close();
        let name = self
            .thread
            .as_ref()
            .and_then(|t| t.thread().name().map(str::to_owned))
            .unwrap_or_default();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(state)) => Ok(state),
            _ => Err(BehindPanicked(name)),
        }
    }

    fn close(&self) {
        self.handoff.lock().closed = true;
        self.handoff.ready.notify_one();
    }
}

impl<B: Behind> Drop for BehindThread<B> {
    /// Unfinished: the thread behind does what it was handed and ends.
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.close();
            let _ = thread.join();
        }
    }
}

/// Marks the queue gone when the thread behind ends, however it ends, so
/// the load generator's side never waits for room that will not come.
struct Gone<'a, M>(&'a Handoff<M>);

impl<M> Drop for Gone<'_, M> {
    fn drop(&mut self) {
        let mut q = self.0.lock();
        q.gone = true;
        // What it did not get to: a settle waiting is told by its sender
        // going.
        q.items.clear();
        self.0.room.notify_all();
    }
}

/// The thread behind: takes the whole queue when woken, when it holds
/// [`WAKE_EVERY`] records, or every [`LOOK_EVERY`], and hands each item to
/// `state` in order.
fn serve<B: Behind>(mut state: B, handoff: &Handoff<B::Message>) -> B {
    let _gone = Gone(handoff);
    let mut taken = Vec::new();
    let mut turns = Turns::new();
    loop {
        let closed = {
            let mut q = handoff.lock();
            if !q.closed && !q.urgent && q.records < WAKE_EVERY && !q.waiting_for_room {
                q = handoff
                    .ready
                    .wait_timeout(q, LOOK_EVERY)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            std::mem::swap(&mut q.items, &mut taken);
            q.records = 0;
            q.urgent = false;
            if std::mem::take(&mut q.waiting_for_room) {
                handoff.room.notify_all();
            }
            q.closed
        };
        let last = closed && taken.is_empty();
        // Half the queue's room taken at once is a thread falling behind:
        // it works through it without offering its core, so that the load
        // generator does not wait for room.
        let keeping_up = taken.len() < QUEUE_LIMIT / 2;
        turns.begin();
        for item in taken.drain(..) {
            if keeping_up {
                turns.tick();
            }
            match item {
                Item::Record(r) => state.record(r),
                Item::Message(m) => state.message(m),
                Item::Settled(done) => {
                    let _ = done.send(());
                }
            }
        }
        if last {
            return state;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Outcome;

    /// Notes what it was handed, in order.
    #[derive(Default)]
    struct Notes(Vec<String>);

    impl Behind for Notes {
        type Message = &'static str;

        fn record(&mut self, record: RequestRecord) {
            self.0.push(format!("r{}", record.id));
        }

        fn message(&mut self, message: &'static str) {
            self.0.push(message.to_owned());
        }
    }

    fn record(id: u64) -> RequestRecord {
        tailmesh_analysis::testing::at(id, 0, 0, Outcome::Ok)
    }

    #[test]
    fn everything_handed_over_arrives_once_and_in_order() {
        let behind = BehindThread::start("behind-test", Notes::default()).expect("a thread");
        let mut expected = Vec::new();
        let mut id = 0;
        // More than the queue holds, so the sender waits for room too.
        for round in 0..3 {
            for _ in 0..QUEUE_LIMIT + WAKE_EVERY + 7 {
                behind.record(record(id));
                expected.push(format!("r{id}"));
                id += 1;
            }
            let message = ["one", "two", "three"][round];
            behind.send(message);
            expected.push(message.to_owned());
        }
        let Notes(got) = behind.finish().expect("its state back");
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "out of order or changed");
    }

    /// Counts records; answers whether it has seen a given count through
    /// a shared cell, read by the test while the thread runs.
    struct Seen(Arc<Mutex<u64>>);

    impl Behind for Seen {
        type Message = ();

        fn record(&mut self, _: RequestRecord) {
            *self.0.lock().expect("unpoisoned") += 1;
        }

        fn message(&mut self, (): ()) {}
    }

    #[test]
    fn a_settle_returns_once_every_record_before_it_is_done() {
        let seen = Arc::new(Mutex::new(0));
        let behind = BehindThread::start("behind-test", Seen(Arc::clone(&seen))).expect("a thread");
        // Fewer than wake it: only the settle (or its own look) does.
        for id in 0..(WAKE_EVERY as u64 / 2) {
            behind.record(record(id));
        }
        behind.settle();
        assert_eq!(*seen.lock().expect("unpoisoned"), WAKE_EVERY as u64 / 2);
        assert_eq!(behind.take_peak(), WAKE_EVERY / 2);
        assert_eq!(
            behind.take_peak(),
            0,
            "the peak starts again from what waits"
        );
        drop(behind.finish().expect("its state back"));
    }

    /// Panics on its first record.
    #[derive(Debug)]
    struct Breaks;

    impl Behind for Breaks {
        type Message = ();

        fn record(&mut self, _: RequestRecord) {
            panic!("broken on purpose");
        }

        fn message(&mut self, (): ()) {}
    }

    #[test]
    fn a_thread_behind_that_panics_neither_blocks_the_sender_nor_passes_for_finished() {
        let behind = BehindThread::start("behind-test", Breaks).expect("a thread");
        // Far more than the queue holds: a sender waiting for room that
        // never comes would hang here.
        for id in 0..(3 * QUEUE_LIMIT as u64) {
            behind.record(record(id));
        }
        behind.settle();
        let err = behind.finish().expect_err("it panicked");
        assert!(err.to_string().contains("behind-test"), "{err}");
    }
}
