//! One topic: its queue of waiting tasks (served in the topic's
//! [`Discipline`]), the tasks still owed an answer, and
//! the workers that take them, all behind one mutex per topic. The lock is
//! held only for short, non-blocking work (map and deque updates plus
//! non-blocking channel sends, never an `.await`), so it serves equally on a
//! current-thread runtime and on a multi-thread one.
//!
//! Invariants the rest of the broker relies on:
//! - `tasks` holds exactly the tasks whose producer still waits. Answering
//!   removes the entry and consumes its one-shot reply sender, so every
//!   producer call gets exactly one answer, whoever answers first.
//! - `queue` holds task ids in arrival order (tasks put back after a worker
//!   loss at the head); dispatch takes the front (FIFO) or the back (LIFO)
//!   as the discipline says, and `adaptive` sheds from the front. A task
//!   answered or given up while queued leaves a stale id behind (counted in
//!   `stale`, skipped when popped, compacted away once stale ids outnumber
//!   live ones), so memory stays bounded by the capacity plus the tasks
//!   workers hold.
//! - `queued_bytes` is the sum of the payload lengths of the live queued
//!   tasks: charged when a task enters the queue (submitted, or put back
//!   after a worker loss) and released when it leaves (dispatched, expired,
//!   abandoned, closed), at the same places `queued` moves.
//! - A worker's `held` lists the tasks delivered to it that it has not
//!   answered, even when their producer gave up meanwhile: a result for a
//!   held task returns the worker's credit; a result for any other id is
//!   rejected and ignored.
//! - `ready` lists, once each, the workers that have credit: dispatch takes
//!   the front one, so idle workers are served in the order they became
//!   idle, and a worker with several credits is rotated to the back.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use hdrhistogram::Histogram;
use tailmesh_proto::pb::{self, broker_message, worker_message};
use tailmesh_units::nanos;
use tokio::{
    sync::{Notify, mpsc, oneshot},
    time::Instant,
};
use tonic::{Code, Status};

use super::error::TaskError;
use crate::discipline::{Discipline, Line};

/// What a producer call is answered with.
pub(crate) type Answer = Result<pb::SubmitReply, TaskError>;
/// The sending half of a producer call's answer.
pub(crate) type ReplyTx = oneshot::Sender<Answer>;
/// The broker's half of a worker stream.
pub(crate) type WorkerTx = mpsc::UnboundedSender<Result<pb::BrokerMessage, Status>>;
/// Identifies one worker stream (not the worker's self-chosen name).
pub(crate) type WorkerId = u64;

/// Stale queue ids tolerated before compaction is considered at all.
const STALE_COMPACT_MIN: usize = 64;
/// Queue waits above an hour are recorded as an hour.
const WAIT_HIST_MAX_NS: u64 = 3_600 * 1_000_000_000;

/// A task as the producer side hands it to the topic.
pub(crate) struct NewTask {
    pub id: u64,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
    /// The context the worker's span is a child of (a traced task's).
    pub trace: Option<pb::TraceContext>,
    /// The queue-wait span of a traced task, closed at dispatch.
    pub span: Option<crate::telemetry::TraceSpan>,
    /// When the producer stops waiting: the earlier of its absolute
    /// deadline and its grpc-timeout.
    pub deadline: Option<Instant>,
    /// The same deadline as wall-clock nanoseconds, for the worker.
    pub deadline_unix_nanos: u64,
    pub reply: ReplyTx,
}

/// One topic's queue and workers.
pub(crate) struct Topic {
    name: String,
    capacity: usize,
    /// Most payload bytes queued at once before submits are refused.
    capacity_bytes: usize,
    max_deliveries: u32,
    max_payload: usize,
    /// Woken whenever a topic that no longer accepts work has no task left.
    idle: Arc<Notify>,
    /// Its queue-wait spans' name ("queue wait <topic>") and `hop`, made
    /// once and shared by every span.
    span_names: (&'static str, &'static str),
    inner: Mutex<Inner>,
}

struct Pending {
    payload: Vec<u8>,
    headers: HashMap<String, String>,
    trace: Option<pb::TraceContext>,
    span: Option<crate::telemetry::TraceSpan>,
    deadline: Option<Instant>,
    deadline_unix_nanos: u64,
    enqueued_at: Instant,
    /// Queue wait at the latest delivery, in ns.
    wait_ns: u64,
    deliveries: u32,
    /// The worker stream holding the task; `None` while queued.
    holder: Option<WorkerId>,
    reply: ReplyTx,
}

struct Worker {
    name: String,
    credits: u32,
    /// Sent a Drain: results no longer return credit until a new grant.
    draining: bool,
    held: Vec<u64>,
    /// Held tasks whose credit a Release already returned.
    released: Vec<u64>,
    tx: WorkerTx,
    in_ready: bool,
}

#[derive(Default)]
struct Counters {
    enqueued: u64,
    dispatched: u64,
    completed: u64,
    failed: u64,
    expired: u64,
    expired_in_flight: u64,
    rejected_full: u64,
    redelivered: u64,
    lost: u64,
    abandoned: u64,
    late_results: u64,
    shutdown_unanswered: u64,
    shed: u64,
}

struct Inner {
    accepting: bool,
    closed: bool,
    queue: VecDeque<u64>,
    /// Live (still queued) ids in `queue`.
    queued: usize,
    /// Stale ids in `queue`.
    stale: usize,
    max_depth: usize,
    /// Payload bytes of the live ids in `queue`.
    queued_bytes: usize,
    max_depth_bytes: usize,
    tasks: HashMap<u64, Pending>,
    workers: HashMap<WorkerId, Worker>,
    ready: VecDeque<WorkerId>,
    counters: Counters,
    wait: Histogram<u64>,
    /// Which end dispatch takes, and what `adaptive` sheds.
    line: Line,
}

impl Topic {
    /// An empty topic; `idle` is shared by every topic of one broker.
    pub(crate) fn new(
        name: String,
        capacity: usize,
        capacity_bytes: usize,
        max_deliveries: u32,
        max_payload: usize,
        discipline: Discipline,
        idle: Arc<Notify>,
    ) -> Self {
        let wait = Histogram::new_with_bounds(1, WAIT_HIST_MAX_NS, 3)
            .expect("constant histogram bounds are valid");
        Topic {
            span_names: (
                crate::telemetry::intern(&format!("queue wait {name}")),
                crate::telemetry::intern(&name),
            ),
            name,
            capacity,
            capacity_bytes,
            max_deliveries,
            max_payload,
            idle,
            inner: Mutex::new(Inner {
                accepting: true,
                closed: false,
                // Reserved up front: the queue never reallocates under load.
                queue: VecDeque::with_capacity(capacity.min(1 << 16)),
                queued: 0,
                stale: 0,
                max_depth: 0,
                queued_bytes: 0,
                max_depth_bytes: 0,
                tasks: HashMap::new(),
                workers: HashMap::new(),
                ready: VecDeque::new(),
                counters: Counters::default(),
                wait,
                line: Line::new(discipline, Instant::now()),
            }),
        }
    }

    /// The topic's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its queue-wait spans' name and `hop`.
    pub(crate) fn span_names(&self) -> (&'static str, &'static str) {
        self.span_names
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves no half-done update behind
        // that later callers could trip on more than on a lost task.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Dispatches what can be dispatched and reports idleness; every
    /// operation ends here.
    fn settle(&self, inner: &mut Inner, now: Instant) {
        inner.pump(now, self.max_deliveries);
        if !inner.accepting && inner.tasks.is_empty() {
            self.idle.notify_waiters();
        }
    }

    /// Queues a task, or refuses it at once (full in tasks or in bytes,
    /// shutting down, deadline already passed); the refused task's reply
    /// sender is dropped.
    pub(crate) fn submit(&self, task: NewTask) -> Result<(), TaskError> {
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.accepting {
            return Err(TaskError::ShuttingDown);
        }
        if task.deadline.is_some_and(|d| d <= now) {
            // Counted as enqueued and expired at once, so every submit the
            // topic accepted ends in exactly one terminal counter.
            inner.counters.enqueued += 1;
            inner.counters.expired += 1;
            return Err(TaskError::DeadlineOnArrival);
        }
        if inner.queued >= self.capacity {
            inner.counters.rejected_full += 1;
            return Err(TaskError::Full {
                topic: self.name.clone(),
                capacity: self.capacity,
            });
        }
        let len = task.payload.len();
        if inner.queued_bytes.saturating_add(len) > self.capacity_bytes {
            inner.counters.rejected_full += 1;
            return Err(TaskError::FullBytes {
                topic: self.name.clone(),
                queued: inner.queued_bytes,
                len,
                limit: self.capacity_bytes,
            });
        }
        inner.tasks.insert(
            task.id,
            Pending {
                payload: task.payload,
                headers: task.headers,
                trace: task.trace,
                span: task.span,
                deadline: task.deadline,
                deadline_unix_nanos: task.deadline_unix_nanos,
                enqueued_at: now,
                wait_ns: 0,
                deliveries: 0,
                holder: None,
                reply: task.reply,
            },
        );
        inner.queue.push_back(task.id);
        inner.queued += 1;
        inner.max_depth = inner.max_depth.max(inner.queued);
        inner.charge_bytes(len);
        inner.counters.enqueued += 1;
        self.settle(&mut inner, now);
        Ok(())
    }

    /// The producer's deadline fired: answers DEADLINE_EXCEEDED unless the
    /// task was answered already. A worker holding it keeps it until it
    /// answers (its result is then ignored) or disconnects.
    pub(crate) fn expire(&self, id: u64) {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(p) = inner.tasks.remove(&id) else {
            return;
        };
        let err = match p.holder {
            None => {
                inner.forget_queued(p.payload.len());
                inner.counters.expired += 1;
                TaskError::Expired {
                    task: id,
                    waited: now.saturating_duration_since(p.enqueued_at),
                }
            }
            Some(w) => {
                inner.counters.expired_in_flight += 1;
                TaskError::ExpiredInFlight {
                    task: id,
                    worker: inner
                        .workers
                        .get(&w)
                        .map(|w| w.name.clone())
                        .unwrap_or_default(),
                    delivery: p.deliveries,
                }
            }
        };
        let _ = p.reply.send(Err(err));
        self.settle(&mut inner, now);
    }

    /// The producer gave up on its call: the task leaves the queue, or its
    /// worker's result will be discarded.
    pub(crate) fn abandon(&self, id: u64) {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(p) = inner.tasks.remove(&id) else {
            return;
        };
        if p.holder.is_none() {
            inner.forget_queued(p.payload.len());
        }
        inner.counters.abandoned += 1;
        self.settle(&mut inner, now);
    }

    /// Registers a worker stream that said Hello with `credits`.
    pub(crate) fn add_worker(
        &self,
        id: WorkerId,
        name: String,
        credits: u32,
        tx: WorkerTx,
    ) -> Result<(), TaskError> {
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.closed {
            return Err(TaskError::ShuttingDown);
        }
        inner.workers.insert(
            id,
            Worker {
                name,
                credits,
                draining: false,
                held: Vec::with_capacity(credits.min(1024) as usize),
                released: Vec::new(),
                tx,
                in_ready: false,
            },
        );
        inner.mark_ready(id);
        self.settle(&mut inner, now);
        Ok(())
    }

    /// Handles one message a registered worker stream sent after its Hello.
    /// `issued_below` is the broker's next task id: results naming a higher
    /// id name a task that never existed.
    pub(crate) fn on_message(&self, id: WorkerId, msg: pb::WorkerMessage, issued_below: u64) {
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.workers.contains_key(&id) {
            return;
        }
        match msg.kind {
            Some(worker_message::Kind::Result(result)) => {
                inner.on_result(id, result, issued_below, self.max_payload);
            }
            Some(worker_message::Kind::Credit(credit)) => {
                if let Some(w) = inner.workers.get_mut(&id) {
                    w.credits = w.credits.saturating_add(credit.credits);
                    w.draining = false;
                }
                inner.mark_ready(id);
            }
            Some(worker_message::Kind::Release(release)) => {
                inner.on_release(id, release.task_id, issued_below);
            }
            Some(worker_message::Kind::Drain(_)) => {
                if let Some(w) = inner.workers.get_mut(&id) {
                    w.credits = 0;
                    w.draining = true;
                }
                inner.unmark_ready(id);
            }
            Some(worker_message::Kind::Hello(_)) => {
                let err =
                    TaskError::Protocol("a stream says Hello once; second Hello ignored".into());
                inner.reject(id, 0, err);
            }
            None => {
                let err = TaskError::Protocol("empty worker message (no kind set)".into());
                inner.reject(id, 0, err);
            }
        }
        self.settle(&mut inner, now);
    }

    /// A worker stream ended: the tasks it held go back to the head of the
    /// queue, oldest first, or are answered ABORTED once they have lost
    /// `max_deliveries` workers.
    pub(crate) fn remove_worker(&self, id: WorkerId) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.remove_worker(id, self.max_deliveries);
        self.settle(&mut inner, now);
    }

    /// Refuses new submits from now on; queued and held tasks carry on.
    pub(crate) fn stop_accepting(&self) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.accepting = false;
        self.settle(&mut inner, now);
    }

    /// Whether no producer waits on this topic any more.
    pub(crate) fn is_idle(&self) -> bool {
        self.lock().tasks.is_empty()
    }

    /// Ends the topic: every waiting producer is answered UNAVAILABLE, every
    /// worker stream is ended with UNAVAILABLE, and no worker may join.
    pub(crate) fn close(&self) {
        let mut inner = self.lock();
        inner.accepting = false;
        inner.closed = true;
        let inner = &mut *inner;
        for (id, p) in inner.tasks.drain() {
            inner.counters.shutdown_unanswered += 1;
            let _ = p.reply.send(Err(TaskError::Unanswered { task: id }));
        }
        inner.queue.clear();
        inner.queued = 0;
        inner.queued_bytes = 0;
        inner.stale = 0;
        inner.ready.clear();
        for (_, w) in inner.workers.drain() {
            let _ =
                w.tx.send(Err(Status::unavailable("broker is shutting down")));
        }
        self.idle.notify_waiters();
    }

    /// The topic's statistics now.
    pub(crate) fn stats(&self) -> pb::TopicStats {
        let (mut stats, wait) = {
            let inner = self.lock();
            let c = &inner.counters;
            let stats = pb::TopicStats {
                topic: self.name.clone(),
                enqueued: c.enqueued,
                dispatched: c.dispatched,
                completed: c.completed,
                failed: c.failed,
                expired: c.expired,
                expired_in_flight: c.expired_in_flight,
                rejected_full: c.rejected_full,
                redelivered: c.redelivered,
                lost: c.lost,
                abandoned: c.abandoned,
                late_results: c.late_results,
                shutdown_unanswered: c.shutdown_unanswered,
                shed: c.shed,
                discipline: inner.line.discipline().as_str().to_owned(),
                depth: inner.queued as u64,
                max_depth: inner.max_depth as u64,
                depth_bytes: inner.queued_bytes as u64,
                max_depth_bytes: inner.max_depth_bytes as u64,
                in_flight: inner.workers.values().map(|w| w.held.len() as u64).sum(),
                workers: inner.workers.len() as u32,
                credits: inner.workers.values().map(|w| u64::from(w.credits)).sum(),
                ..Default::default()
            };
            // Percentiles are computed on a copy, outside the lock.
            (stats, inner.wait.clone())
        };
        if !wait.is_empty() {
            stats.queue_wait_count = wait.len();
            stats.queue_wait_p50_ns = wait.value_at_quantile(0.50);
            stats.queue_wait_p90_ns = wait.value_at_quantile(0.90);
            stats.queue_wait_p99_ns = wait.value_at_quantile(0.99);
            stats.queue_wait_p999_ns = wait.value_at_quantile(0.999);
            stats.queue_wait_max_ns = wait.max();
        }
        stats
    }
}

impl Inner {
    /// Bookkeeping after a queued task of `bytes` payload left `tasks`: its
    /// id turns stale.
    fn forget_queued(&mut self, bytes: usize) {
        self.queued -= 1;
        self.release_bytes(bytes);
        self.stale += 1;
        if self.stale > STALE_COMPACT_MIN && self.stale > self.queued {
            let tasks = &self.tasks;
            self.queue
                .retain(|id| tasks.get(id).is_some_and(|p| p.holder.is_none()));
            self.stale = 0;
        }
    }

    /// A task of `bytes` payload entered the queue.
    fn charge_bytes(&mut self, bytes: usize) {
        self.queued_bytes = self.queued_bytes.saturating_add(bytes);
        self.max_depth_bytes = self.max_depth_bytes.max(self.queued_bytes);
    }

    /// A task of `bytes` payload left the queue.
    fn release_bytes(&mut self, bytes: usize) {
        debug_assert!(self.queued_bytes >= bytes, "queued bytes went negative");
        self.queued_bytes = self.queued_bytes.saturating_sub(bytes);
    }

    fn mark_ready(&mut self, id: WorkerId) {
        if let Some(w) = self.workers.get_mut(&id)
            && w.credits > 0
            && !w.in_ready
        {
            w.in_ready = true;
            self.ready.push_back(id);
        }
    }

    fn unmark_ready(&mut self, id: WorkerId) {
        if let Some(w) = self.workers.get_mut(&id)
            && w.in_ready
        {
            w.in_ready = false;
            self.ready.retain(|&r| r != id);
        }
    }

    /// The next queued task, in the discipline's order, still owed an
    /// answer whose deadline has not passed; expired ones met on the way are
    /// answered DEADLINE_EXCEEDED.
    fn pop_live(&mut self, now: Instant) -> Option<u64> {
        let newest_first = self.line.newest_first(now);
        while let Some(id) = if newest_first {
            self.queue.pop_back()
        } else {
            self.queue.pop_front()
        } {
            let Some(p) = self.tasks.get(&id).filter(|p| p.holder.is_none()) else {
                self.stale = self.stale.saturating_sub(1);
                continue;
            };
            self.queued -= 1;
            let len = p.payload.len();
            let expired = p.deadline.is_some_and(|d| d <= now);
            let waited = now.saturating_duration_since(p.enqueued_at);
            self.release_bytes(len);
            if expired {
                if let Some(p) = self.tasks.remove(&id) {
                    self.counters.expired += 1;
                    let _ = p.reply.send(Err(TaskError::Expired { task: id, waited }));
                }
                continue;
            }
            return Some(id);
        }
        None
    }

    /// Sheds what the discipline gives up on, then hands queued tasks to
    /// workers with credit until either runs out.
    fn pump(&mut self, now: Instant, max_deliveries: u32) {
        self.shed(now);
        self.dispatch(now, max_deliveries);
        if self.queued == 0 && !self.ready.is_empty() {
            // A worker with credit and nothing to give it: no standing
            // queue.
            self.line.idle(now);
        }
    }

    /// Answers RESOURCE_EXHAUSTED, from the oldest on, the queued tasks the
    /// discipline sheds (only `adaptive` does, over a standing queue).
    fn shed(&mut self, now: Instant) {
        while let Some(&id) = self.queue.front() {
            let Some(p) = self.tasks.get(&id).filter(|p| p.holder.is_none()) else {
                self.queue.pop_front();
                self.stale = self.stale.saturating_sub(1);
                continue;
            };
            if !self.line.sheds(p.enqueued_at, now) {
                return;
            }
            self.queue.pop_front();
            let Some(p) = self.tasks.remove(&id) else {
                continue;
            };
            self.queued -= 1;
            self.release_bytes(p.payload.len());
            self.counters.shed += 1;
            let _ = p.reply.send(Err(TaskError::Shed {
                task: id,
                waited: now.saturating_duration_since(p.enqueued_at),
            }));
        }
    }

    /// Hands queued tasks to workers with credit until either runs out.
    fn dispatch(&mut self, now: Instant, max_deliveries: u32) {
        while let Some(&wid) = self.ready.front() {
            let Some(id) = self.pop_live(now) else {
                return;
            };
            let (Some(worker), Some(p)) = (self.workers.get_mut(&wid), self.tasks.get_mut(&id))
            else {
                // `ready` only names live workers and `pop_live` only live
                // tasks; stay safe anyway.
                self.ready.pop_front();
                continue;
            };
            p.deliveries += 1;
            p.holder = Some(wid);
            p.wait_ns = nanos(now.saturating_duration_since(p.enqueued_at));
            if let Some(mut span) = p.span.take() {
                let wait_ns = p.wait_ns;
                span.set(|f| f.queue_wait_ns = Some(wait_ns));
                span.end();
            }
            // The last allowed delivery can never be redelivered, so the
            // payload moves instead of being copied (the common case with
            // max_deliveries = 1).
            let last = p.deliveries >= max_deliveries;
            let task = pb::Task {
                task_id: id,
                payload: if last {
                    std::mem::take(&mut p.payload)
                } else {
                    p.payload.clone()
                },
                headers: if last {
                    std::mem::take(&mut p.headers)
                } else {
                    p.headers.clone()
                },
                deadline_unix_nanos: p.deadline_unix_nanos,
                queue_wait_ns: p.wait_ns,
                delivery: p.deliveries,
                trace: p.trace,
            };
            let msg = pb::BrokerMessage {
                kind: Some(broker_message::Kind::Task(task)),
            };
            if let Err(mpsc::error::SendError(msg)) = worker.tx.send(Ok(msg)) {
                // The stream is gone but its reader has not noticed yet:
                // undo this delivery, put the task back first in line, and
                // drop the worker (which requeues what it held).
                p.deliveries -= 1;
                p.holder = None;
                if let Ok(pb::BrokerMessage {
                    kind: Some(broker_message::Kind::Task(t)),
                }) = msg
                {
                    p.payload = t.payload;
                    p.headers = t.headers;
                }
                let len = p.payload.len();
                self.queue.push_front(id);
                self.queued += 1;
                self.charge_bytes(len);
                self.remove_worker(wid, max_deliveries);
                continue;
            }
            self.counters.dispatched += 1;
            worker.held.push(id);
            worker.credits -= 1;
            self.ready.pop_front();
            if worker.credits > 0 {
                self.ready.push_back(wid);
            } else {
                worker.in_ready = false;
            }
        }
    }

    fn on_release(&mut self, wid: WorkerId, task_id: u64, issued_below: u64) {
        let Some(worker) = self.workers.get_mut(&wid) else {
            return;
        };
        if !worker.held.contains(&task_id) || worker.released.contains(&task_id) {
            let err = if task_id == 0 || task_id >= issued_below {
                TaskError::NeverIssued { task: task_id }
            } else {
                TaskError::NotHeld { task: task_id }
            };
            self.reject(wid, task_id, err);
            return;
        }
        worker.released.push(task_id);
        if !worker.draining {
            worker.credits = worker.credits.saturating_add(1);
        }
        self.mark_ready(wid);
    }

    fn on_result(
        &mut self,
        wid: WorkerId,
        r: pb::TaskResult,
        issued_below: u64,
        max_payload: usize,
    ) {
        let Some(worker) = self.workers.get_mut(&wid) else {
            return;
        };
        let Some(pos) = worker.held.iter().position(|&t| t == r.task_id) else {
            let err = if r.task_id == 0 || r.task_id >= issued_below {
                TaskError::NeverIssued { task: r.task_id }
            } else {
                self.counters.late_results += 1;
                TaskError::NotHeld { task: r.task_id }
            };
            self.reject(wid, r.task_id, err);
            return;
        };
        worker.held.swap_remove(pos);
        let released = match worker.released.iter().position(|&t| t == r.task_id) {
            Some(i) => {
                worker.released.swap_remove(i);
                true
            }
            None => false,
        };
        if !worker.draining && !released {
            worker.credits = worker.credits.saturating_add(1);
        }
        let worker_name = if r.payload.len() > max_payload {
            Some(worker.name.clone())
        } else {
            None
        };
        self.mark_ready(wid);
        let Some(p) = self.tasks.remove(&r.task_id) else {
            // Its producer gave up or its deadline passed: nobody waits.
            self.counters.late_results += 1;
            return;
        };
        let answer = if let Some(worker) = worker_name {
            self.counters.failed += 1;
            let len = r.payload.len();
            let err = |limit| TaskError::ResultTooLarge {
                task: r.task_id,
                worker: worker.clone(),
                len,
                limit,
            };
            self.reject(wid, r.task_id, err(max_payload));
            Err(err(max_payload))
        } else if r.code == Code::Ok as i32 {
            self.counters.completed += 1;
            let _ = self.wait.record(p.wait_ns.clamp(1, WAIT_HIST_MAX_NS));
            Ok(pb::SubmitReply {
                payload: r.payload,
                queue_wait_ns: p.wait_ns,
                deliveries: p.deliveries,
                task_id: r.task_id,
            })
        } else {
            self.counters.failed += 1;
            Err(TaskError::Worker {
                code: Code::from_i32(r.code),
                message: r.message,
            })
        };
        let _ = p.reply.send(answer);
    }

    /// Tells a worker its message was refused; the stream stays open.
    fn reject(&mut self, wid: WorkerId, task_id: u64, err: TaskError) {
        if let Some(w) = self.workers.get(&wid) {
            let status = Status::from(err);
            let rejected = pb::Rejected {
                task_id,
                code: status.code() as i32,
                message: status.message().to_owned(),
            };
            let _ = w.tx.send(Ok(pb::BrokerMessage {
                kind: Some(broker_message::Kind::Rejected(rejected)),
            }));
        }
    }

    fn remove_worker(&mut self, wid: WorkerId, max_deliveries: u32) {
        self.unmark_ready(wid);
        let Some(mut worker) = self.workers.remove(&wid) else {
            return;
        };
        // Pushing the newest first leaves the oldest at the very head.
        worker.held.sort_unstable();
        for &id in worker.held.iter().rev() {
            let Some(p) = self.tasks.get_mut(&id) else {
                continue;
            };
            if p.deliveries >= max_deliveries {
                let deliveries = p.deliveries;
                if let Some(p) = self.tasks.remove(&id) {
                    self.counters.lost += 1;
                    let _ = p.reply.send(Err(TaskError::Lost {
                        task: id,
                        deliveries,
                    }));
                }
                continue;
            }
            p.holder = None;
            let len = p.payload.len();
            self.queue.push_front(id);
            self.queued += 1;
            self.max_depth = self.max_depth.max(self.queued);
            self.charge_bytes(len);
            self.counters.redelivered += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn topic(capacity: usize, max_deliveries: u32) -> Topic {
        Topic::new(
            "t".into(),
            capacity,
            usize::MAX,
            max_deliveries,
            1024,
            Discipline::Fifo,
            Arc::new(Notify::new()),
        )
    }

    fn task(id: u64) -> (NewTask, oneshot::Receiver<Answer>) {
        sized(id, 1, None)
    }

    /// Task `id` with a `len`-byte payload, expiring `deadline` from now.
    fn sized(
        id: u64,
        len: usize,
        deadline: Option<Duration>,
    ) -> (NewTask, oneshot::Receiver<Answer>) {
        let (reply, rx) = oneshot::channel();
        let t = NewTask {
            id,
            payload: vec![id as u8; len],
            headers: HashMap::new(),
            trace: None,
            span: None,
            deadline: deadline.map(|d| Instant::now() + d),
            // Only the worker reads it; these tests have none.
            deadline_unix_nanos: 0,
            reply,
        };
        (t, rx)
    }

    fn credit(credits: u32) -> pb::WorkerMessage {
        pb::WorkerMessage {
            kind: Some(worker_message::Kind::Credit(pb::Credit { credits })),
        }
    }

    fn next_task(
        rx: &mut mpsc::UnboundedReceiver<Result<pb::BrokerMessage, Status>>,
    ) -> Option<pb::Task> {
        match rx.try_recv().ok()?.ok()?.kind? {
            broker_message::Kind::Task(t) => Some(t),
            broker_message::Kind::Rejected(_) => None,
        }
    }

    fn result(id: u64) -> pb::WorkerMessage {
        pb::WorkerMessage {
            kind: Some(worker_message::Kind::Result(pb::TaskResult {
                task_id: id,
                payload: vec![],
                code: 0,
                message: String::new(),
            })),
        }
    }

    #[tokio::test]
    async fn stale_ids_are_compacted_and_fifo_survives() {
        let t = topic(10_000, 3);
        let mut rxs = Vec::new();
        for id in 1..=1000 {
            let (nt, rx) = task(id);
            t.submit(nt).expect("queued");
            rxs.push(rx);
        }
        // Producers of three tasks in four give up.
        for id in (1..=1000).filter(|id| id % 4 != 0) {
            t.abandon(id);
        }
        {
            let inner = t.lock();
            assert_eq!(inner.queued, 250);
            // Compaction keeps stale ids at most as many as live ones.
            assert!(
                inner.queue.len() <= 2 * 250 + STALE_COMPACT_MIN,
                "{}",
                inner.queue.len()
            );
        }
        let (tx, mut wrx) = mpsc::unbounded_channel();
        t.add_worker(1, "w".into(), 1, tx).expect("added");
        for expect in (4..=40).step_by(4) {
            let got = next_task(&mut wrx).expect("a task");
            assert_eq!(got.task_id, expect);
            t.on_message(1, result(expect), 1001);
        }
    }

    #[tokio::test]
    async fn requeued_tasks_keep_their_order_at_the_head() {
        let t = topic(100, 3);
        let mut rxs = Vec::new();
        for id in 1..=4 {
            let (nt, rx) = task(id);
            t.submit(nt).expect("queued");
            rxs.push(rx);
        }
        let (tx, mut wrx) = mpsc::unbounded_channel();
        t.add_worker(1, "a".into(), 2, tx).expect("added");
        assert_eq!(next_task(&mut wrx).map(|t| t.task_id), Some(1));
        assert_eq!(next_task(&mut wrx).map(|t| t.task_id), Some(2));
        t.remove_worker(1);
        let (tx, mut wrx) = mpsc::unbounded_channel();
        t.add_worker(2, "b".into(), 4, tx).expect("added");
        let order: Vec<_> = std::iter::from_fn(|| next_task(&mut wrx))
            .map(|t| (t.task_id, t.delivery))
            .collect();
        assert_eq!(order, vec![(1, 2), (2, 2), (3, 1), (4, 1)]);
    }

    /// Dispatch itself checks deadlines: a task whose deadline passed while
    /// queued is answered DEADLINE_EXCEEDED and skipped even when its
    /// producer's own timer (which calls `expire`) has not run yet.
    #[tokio::test(start_paused = true)]
    async fn tasks_past_their_deadline_are_never_dispatched() {
        let t = topic(100, 3);
        let (tx, mut wrx) = mpsc::unbounded_channel();
        // Connected, but holding no credit while the tasks wait.
        t.add_worker(1, "w".into(), 0, tx).expect("added");
        let mut late = Vec::new();
        for id in 1..=3 {
            let (nt, rx) = sized(id, 1, Some(Duration::from_millis(10)));
            t.submit(nt).expect("queued");
            late.push(rx);
        }
        let (nt, mut fresh) = sized(4, 1, Some(Duration::from_secs(10)));
        t.submit(nt).expect("queued");
        tokio::time::advance(Duration::from_millis(20)).await;

        t.on_message(1, credit(1), 5);
        let got = next_task(&mut wrx).expect("a task");
        assert_eq!(got.task_id, 4, "only the task still in time is delivered");
        assert!(next_task(&mut wrx).is_none());
        for mut rx in late {
            match rx.try_recv() {
                Ok(Err(e @ TaskError::Expired { .. })) => {
                    assert_eq!(Status::from(e).code(), Code::DeadlineExceeded);
                }
                other => panic!("expected Expired, got {other:?}"),
            }
        }
        t.on_message(1, result(4), 5);
        assert!(matches!(fresh.try_recv(), Ok(Ok(_))));
        let s = t.stats();
        assert_eq!(
            (s.expired, s.dispatched, s.completed, s.depth),
            (3, 1, 1, 0),
            "{s:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn queued_bytes_are_bounded_and_return_to_zero() {
        let t = Topic::new(
            "t".into(),
            100,
            100,
            3,
            1024,
            Discipline::Fifo,
            Arc::new(Notify::new()),
        );
        let bytes = |t: &Topic| t.lock().queued_bytes;
        let mut rxs = Vec::new();
        for (id, len) in [(1, 40), (2, 40)] {
            let (nt, rx) = sized(id, len, None);
            t.submit(nt).expect("queued");
            rxs.push(rx);
        }
        // 30 more would make 110 of 100 bytes.
        let (nt, _) = sized(3, 30, None);
        let err = t.submit(nt).expect_err("over the byte limit");
        assert!(
            matches!(
                err,
                TaskError::FullBytes {
                    queued: 80,
                    len: 30,
                    limit: 100,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(Status::from(err).code(), Code::ResourceExhausted);
        // Exactly to the limit is fine.
        let (nt, rx) = sized(4, 20, None);
        t.submit(nt).expect("queued");
        rxs.push(rx);
        assert_eq!(bytes(&t), 100);

        // Abandoned while queued.
        t.abandon(2);
        assert_eq!(bytes(&t), 60);
        // Expires in the queue, found expired at dispatch.
        let (nt, rx) = sized(5, 40, Some(Duration::from_millis(10)));
        t.submit(nt).expect("queued");
        rxs.push(rx);
        assert_eq!(bytes(&t), 100);
        tokio::time::advance(Duration::from_millis(20)).await;

        // Dispatched: 1 and 4 leave, 5 is skipped as expired.
        let (tx, mut wrx) = mpsc::unbounded_channel();
        t.add_worker(1, "a".into(), 3, tx).expect("added");
        assert_eq!(next_task(&mut wrx).map(|t| t.task_id), Some(1));
        assert_eq!(next_task(&mut wrx).map(|t| t.task_id), Some(4));
        assert!(next_task(&mut wrx).is_none());
        assert_eq!(bytes(&t), 0);

        // Requeued after the worker is lost: charged again.
        t.remove_worker(1);
        assert_eq!(bytes(&t), 60);
        // Expired by its producer's timer while queued.
        t.expire(1);
        assert_eq!(bytes(&t), 20);
        let (tx, mut wrx) = mpsc::unbounded_channel();
        t.add_worker(2, "b".into(), 1, tx).expect("added");
        assert_eq!(next_task(&mut wrx).map(|t| t.task_id), Some(4));
        assert_eq!(bytes(&t), 0);
        t.on_message(2, result(4), 6);

        let s = t.stats();
        assert_eq!(
            (s.depth_bytes, s.max_depth_bytes, s.rejected_full, s.expired),
            (0, 100, 1, 2),
            "{s:?}"
        );
        assert!(t.is_idle());
    }
    fn disciplined(discipline: Discipline) -> Topic {
        Topic::new(
            "t".into(),
            10_000,
            usize::MAX,
            3,
            1024,
            discipline,
            Arc::new(Notify::new()),
        )
    }

    /// Submits tasks 1..=n, 1 ms apart, while no worker has credit, waits
    /// `age`, then lets one worker with one credit take them one by one:
    /// the ids in the order dispatched.
    async fn dispatch_order(t: &Topic, n: u64, age: Duration) -> Vec<u64> {
        let mut rxs = Vec::new();
        for id in 1..=n {
            let (nt, rx) = task(id);
            t.submit(nt).expect("queued");
            rxs.push(rx);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        tokio::time::advance(age).await;
        let (tx, mut wrx) = mpsc::unbounded_channel();
        t.add_worker(1, "w".into(), 1, tx).expect("added");
        let mut order = Vec::new();
        while let Some(got) = next_task(&mut wrx) {
            order.push(got.task_id);
            t.on_message(1, result(got.task_id), n + 1);
        }
        order
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_dispatches_the_oldest_first() {
        let t = disciplined(Discipline::Fifo);
        assert_eq!(
            dispatch_order(&t, 4, Duration::from_secs(1)).await,
            [1, 2, 3, 4]
        );
        assert_eq!(t.stats().discipline, "fifo");
    }

    #[tokio::test(start_paused = true)]
    async fn lifo_dispatches_the_newest_first() {
        let t = disciplined(Discipline::Lifo);
        assert_eq!(
            dispatch_order(&t, 4, Duration::from_secs(1)).await,
            [4, 3, 2, 1]
        );
        let s = t.stats();
        assert_eq!((s.discipline.as_str(), s.shed), ("lifo", 0));
    }

    #[tokio::test(start_paused = true)]
    async fn adaptive_is_fifo_while_the_queue_does_not_stand() {
        let t = disciplined(Discipline::Adaptive);
        // Queued for 4..=20 ms: over the target, under the interval.
        assert_eq!(
            dispatch_order(&t, 4, Duration::from_millis(16)).await,
            [1, 2, 3, 4]
        );
        assert_eq!(t.stats().shed, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn adaptive_sheds_the_old_and_serves_the_new_once_the_queue_stands() {
        let t = disciplined(Discipline::Adaptive);
        let (tx, mut wrx) = mpsc::unbounded_channel();
        // Connected, with no credit: the queue stands.
        t.add_worker(1, "w".into(), 0, tx).expect("added");
        let mut rxs = Vec::new();
        for id in 1..=150 {
            let (nt, rx) = task(id);
            t.submit(nt).expect("queued");
            rxs.push(rx);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // At 150 ms the queue has stood for 150: tasks that waited over
        // the 20 ms target (ids 1..=130) are shed, and the worker's credits go to the
        // newest first.
        t.on_message(1, credit(2), 151);
        let order: Vec<_> = std::iter::from_fn(|| next_task(&mut wrx))
            .map(|t| t.task_id)
            .collect();
        assert_eq!(order, [150, 149]);
        for (i, rx) in rxs.iter_mut().enumerate().take(130) {
            match rx.try_recv() {
                Ok(Err(e @ TaskError::Shed { .. })) => {
                    assert_eq!(Status::from(e).code(), Code::ResourceExhausted);
                }
                other => panic!("task {}: expected Shed, got {other:?}", i + 1),
            }
        }
        assert!(rxs[130].try_recv().is_err(), "131 still waits");
        let s = t.stats();
        assert_eq!(
            (s.discipline.as_str(), s.shed, s.depth, s.dispatched),
            ("adaptive", 130, 18, 2),
            "{s:?}"
        );
    }
}
