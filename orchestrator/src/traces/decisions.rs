//! The run's keep decisions for the processes that hold their spans
//! (retroactive sampling, `services::telemetry::held`): the tail sampler
//! appends each kept trace as its request ends, and every process asks
//! for the ones after its last position (`TraceDecisions.Kept`, served
//! beside the OTLP receiver, so whatever reaches the receiver reaches
//! the decisions). The log keeps the last [`REMEMBERED`] decisions: a
//! process that asks later than that is told how many it missed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tailmesh_proto::pb::{
    KeptReply, KeptRequest,
    trace_decisions_server::{TraceDecisions, TraceDecisionsServer},
};

/// Decisions remembered: at 16 bytes each, 16 MiB.
pub const REMEMBERED: usize = 1 << 20;

/// Trace ids in one reply at most (64 KiB).
const PER_REPLY: usize = 4096;

/// The kept traces in the order they were kept.
#[derive(Debug, Default)]
pub struct DecisionLog {
    inner: Mutex<Log>,
}

#[derive(Debug, Default)]
struct Log {
    /// The position of `kept[0]` (positions count from 1).
    first: u64,
    kept: VecDeque<u128>,
    capacity: usize,
}

impl DecisionLog {
    /// A log remembering the last `capacity` decisions.
    pub fn new(capacity: usize) -> DecisionLog {
        DecisionLog {
            inner: Mutex::new(Log {
                first: 1,
                kept: VecDeque::new(),
                capacity: capacity.max(1),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run kept `trace`.
    pub fn keep(&self, trace: u128) {
        let mut log = self.lock();
        if log.kept.len() == log.capacity {
            log.kept.pop_front();
            log.first += 1;
        }
        log.kept.push_back(trace);
    }

    /// Hands every decision after position `after` to `each`; returns
    /// the position to read from next and how many decisions after
    /// `after` were forgotten already.
    pub fn read_after(&self, after: u64, mut each: impl FnMut(u128)) -> (u64, u64) {
        let log = self.lock();
        let from = (after + 1).max(log.first);
        let skip = usize::try_from(from - log.first).unwrap_or(usize::MAX);
        for id in log.kept.iter().skip(skip) {
            each(*id);
        }
        let end = log.first + log.kept.len() as u64;
        (end.saturating_sub(1).max(after), from - (after + 1))
    }

    /// The decisions after position `after`, at most `limit`.
    pub fn after(&self, after: u64, limit: usize) -> KeptReply {
        let log = self.lock();
        let end = log.first + log.kept.len() as u64;
        let from = (after + 1).max(log.first);
        let forgotten = from - (after + 1).min(from);
        let skip = usize::try_from(from - log.first).unwrap_or(usize::MAX);
        let mut trace_ids = Vec::with_capacity(limit.min(log.kept.len()) * 16);
        let mut taken = 0;
        for id in log.kept.iter().skip(skip).take(limit) {
            trace_ids.extend_from_slice(&id.to_be_bytes());
            taken += 1;
        }
        let next = from + taken as u64 - 1;
        KeptReply {
            next: next.max(after),
            trace_ids,
            forgotten,
            more: next + 1 < end,
        }
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
        Ok(tonic::Response::new(
            self.log.after(request.into_inner().after, PER_REPLY),
        ))
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
