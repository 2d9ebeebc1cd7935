//! The run's keep decisions for the processes that hold their spans
//! (retroactive sampling, `services::telemetry::held`): the tail sampler
//! appends each traced request's decision, kept or dropped, as the
//! request ends, and every process asks for the ones after its last
//! position (`TraceDecisions.Kept`, served beside the OTLP receiver, so
//! whatever reaches the receiver reaches the decisions). A dropped
//! trace's spans leave a process as soon as it reads the decision, not
//! when their hold runs out, so a process holds about one polling
//! interval of spans, not a hold's. The log keeps the last
//! [`REMEMBERED`] decisions: a process that asks later than that is told
//! how many it missed. Each log has an id of its own, so a process that
//! outlives a run (a deployed one, started before the orchestrator that
//! attaches to it) reads the next run's log from its start, not from its
//! position in the last one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tailmesh_proto::pb::{
    KeptReply, KeptRequest,
    trace_decisions_server::{TraceDecisions, TraceDecisionsServer},
};

/// Decisions remembered: at 17 bytes each, 4.25 MiB; 87 s of decisions
/// at 3,000 traced requests a second, where a process asks every 200 ms.
pub const REMEMBERED: usize = 1 << 18;

/// Trace ids in one reply at most (64 KiB).
const PER_REPLY: usize = 4096;

/// The decided traces in the order they were decided.
#[derive(Debug)]
pub struct DecisionLog {
    inner: Mutex<Log>,
    /// This log's id (never 0), which readers show with their position.
    id: u64,
}

#[derive(Debug, Default)]
struct Log {
    /// The position of `traces[0]` (positions count from 1).
    first: u64,
    traces: VecDeque<u128>,
    /// Whether each of `traces` was kept.
    kept: VecDeque<bool>,
    capacity: usize,
}

impl DecisionLog {
    /// A log remembering the last `capacity` decisions.
    pub fn new(capacity: usize) -> DecisionLog {
        DecisionLog {
            inner: Mutex::new(Log {
                first: 1,
                traces: VecDeque::new(),
                kept: VecDeque::new(),
                capacity: capacity.max(1),
            }),
            id: rand::random::<u64>().max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run kept `trace`.
    pub fn keep(&self, trace: u128) {
        self.decide(trace, true);
    }

    /// The run decided `trace`: kept or dropped.
    pub fn decide(&self, trace: u128, kept: bool) {
        let mut log = self.lock();
        if log.traces.len() == log.capacity {
            log.traces.pop_front();
            log.kept.pop_front();
            log.first += 1;
        }
        log.traces.push_back(trace);
        log.kept.push_back(kept);
    }

    /// Hands every decision after position `after` to `each` (the trace,
    /// whether kept); returns the position to read from next and how many
    /// decisions after `after` were forgotten already.
    pub fn read_after(&self, after: u64, mut each: impl FnMut(u128, bool)) -> (u64, u64) {
        let log = self.lock();
        let (from, skip, forgotten) = log.from(after);
        for (trace, kept) in log.traces.range(skip..).zip(log.kept.range(skip..)) {
            each(*trace, *kept);
        }
        let end = log.first + log.traces.len() as u64;
        (end.saturating_sub(1).max(after).max(from - 1), forgotten)
    }

    /// The decisions after position `after` of log `of` (this one, or 0
    /// for a first ask; any other log's position reads this one from its
    /// start), at most `limit`.
    pub fn after_in(&self, of: u64, after: u64, limit: usize) -> KeptReply {
        let after = if of == self.id { after } else { 0 };
        self.after(after, limit)
    }

    /// The decisions after position `after`, at most `limit`.
    pub fn after(&self, after: u64, limit: usize) -> KeptReply {
        let log = self.lock();
        let end = log.first + log.traces.len() as u64;
        let (from, skip, forgotten) = log.from(after);
        let n = limit.min(log.traces.len().saturating_sub(skip));
        let mut trace_ids = Vec::new();
        let mut dropped_ids = Vec::new();
        for (trace, kept) in log
            .traces
            .range(skip..skip + n)
            .zip(log.kept.range(skip..skip + n))
        {
            let out = if *kept {
                &mut trace_ids
            } else {
                &mut dropped_ids
            };
            out.extend_from_slice(&trace.to_be_bytes());
        }
        let next = from + n as u64 - 1;
        KeptReply {
            next: next.max(after),
            trace_ids,
            dropped_ids,
            forgotten,
            more: next + 1 < end,
            log: self.id,
        }
    }
}

impl Log {
    /// For a reader after position `after`: the first position it reads,
    /// its index in the log, and the decisions it missed.
    fn from(&self, after: u64) -> (u64, usize, u64) {
        let from = (after + 1).max(self.first);
        let skip = usize::try_from(from - self.first)
            .unwrap_or(usize::MAX)
            .min(self.traces.len());
        (from, skip, from - (after + 1))
    }
}

/// `TraceDecisions` over a shared log.
pub fn server(log: Arc<DecisionLog>) -> TraceDecisionsServer<Service> {
    TraceDecisionsServer::new(Service { log })
}

pub struct Service {
    log: Arc<DecisionLog>,
}

#[tonic::async_trait]
impl TraceDecisions for Service {
    async fn kept(
        &self,
        request: tonic::Request<KeptRequest>,
    ) -> Result<tonic::Response<KeptReply>, tonic::Status> {
        let asked = request.into_inner();
        Ok(tonic::Response::new(self.log.after_in(
            asked.log,
            asked.after,
            PER_REPLY,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(reply: &KeptReply) -> Vec<u128> {
        reply
            .trace_ids
            .chunks(16)
            .map(|c| u128::from_be_bytes(c.try_into().expect("16 bytes")))
            .collect()
    }

    #[test]
    fn a_process_reads_each_decision_once_in_order_and_in_pieces() {
        let log = DecisionLog::new(100);
        let first = log.after(0, 10);
        assert_eq!((ids(&first), first.next, first.more), (vec![], 0, false));
        for t in 1..=5u128 {
            log.keep(t * 1000);
        }
        let a = log.after(0, 3);
        assert_eq!((ids(&a), a.next, a.more), (vec![1000, 2000, 3000], 3, true));
        let b = log.after(a.next, 3);
        assert_eq!((ids(&b), b.next, b.more), (vec![4000, 5000], 5, false));
        let c = log.after(b.next, 3);
        assert_eq!((ids(&c), c.next, c.forgotten), (vec![], 5, 0));
        // Dropped traces come apart from the kept, in the same count.
        log.decide(6000, false);
        log.keep(7000);
        log.decide(8000, false);
        let d = log.after(c.next, 2);
        let dropped: Vec<u128> = d
            .dropped_ids
            .chunks(16)
            .map(|c| u128::from_be_bytes(c.try_into().expect("16 bytes")))
            .collect();
        assert_eq!(
            (ids(&d), dropped, d.next, d.more),
            (vec![7000], vec![6000], 7, true)
        );
        let mut read = Vec::new();
        let (next, forgotten) = log.read_after(d.next, |t, kept| read.push((t, kept)));
        assert_eq!((read, next, forgotten), (vec![(8000, false)], 8, 0));
    }

    #[test]
    fn a_reader_from_another_log_reads_this_one_from_its_start() {
        let (last_run, this_run) = (DecisionLog::new(100), DecisionLog::new(100));
        assert_ne!(last_run.id, this_run.id);
        for t in 1..=5u128 {
            last_run.keep(t);
        }
        let read = last_run.after_in(0, 0, 10);
        assert_eq!(
            (ids(&read), read.next, read.log),
            (vec![1, 2, 3, 4, 5], 5, last_run.id)
        );
        this_run.keep(100);
        this_run.keep(200);
        // Its position 5 in the last run's log is past this log's end:
        // read as a position here, it would skip both.
        let moved = this_run.after_in(read.log, read.next, 10);
        assert_eq!(
            (ids(&moved), moved.next, moved.log),
            (vec![100, 200], 2, this_run.id)
        );
        // From then on, its positions are this log's.
        this_run.keep(300);
        let next = this_run.after_in(moved.log, moved.next, 10);
        assert_eq!((ids(&next), next.next), (vec![300], 3));
    }

    #[test]
    fn decisions_past_the_memory_are_counted_as_forgotten() {
        let log = DecisionLog::new(3);
        for t in 1..=5u128 {
            log.keep(t);
        }
        // Positions 1 and 2 were forgotten; 3, 4 and 5 are there.
        let r = log.after(0, 10);
        assert_eq!((ids(&r), r.next, r.forgotten), (vec![3, 4, 5], 5, 2));
        let r = log.after(1, 10);
        assert_eq!(r.forgotten, 1);
        let r = log.after(3, 10);
        assert_eq!((ids(&r), r.forgotten), (vec![4, 5], 0));
    }
}
