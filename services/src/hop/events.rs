//! What a push caller did with a hop's replicas, counted per replica and
//! kept as timed events: picks, TRANSIENT_FAILURE and READY, keepalive
//! timeouts, calls redirected from a failed connection, ejections and
//! re-admissions. Read through [`EndpointLog::snapshot`] (the load
//! generator's own pool) or the Control API's `GetEndpointEvents` (a hop's).

use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};

use tailmesh_proto::pb::{EndpointEvent, EndpointEventKind, PoolEvents, ReplicaCounts};

use tailmesh_units::unix_nanos;

/// The most events one pool keeps; later ones are only counted.
pub const MAX_EVENTS: usize = 10_000;

/// A replica's counters.
#[derive(Debug, Default)]
struct Counters {
    picks: AtomicU64,
    transient_failures: AtomicU64,
    failed_connects: AtomicU64,
    keepalive_timeouts: AtomicU64,
    redirected: AtomicU64,
    ejections: AtomicU64,
    readmissions: AtomicU64,
}

/// What a counter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// A call sent to the replica.
    Pick,
    /// A reconnect attempt that failed.
    FailedConnect,
    /// A keepalive PING unanswered.
    KeepaliveTimeout,
    /// A call moved to another replica before it left.
    Redirected,
}

/// The counters and events of one pool.
#[derive(Debug)]
pub struct EndpointLog {
    replicas: Vec<Counters>,
    events: Mutex<Vec<EndpointEvent>>,
    dropped: AtomicU64,
}

impl EndpointLog {
    /// A log for `replicas` replicas.
    pub fn new(replicas: usize) -> Self {
        EndpointLog {
            replicas: (0..replicas).map(|_| Counters::default()).collect(),
            events: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
        }
    }

    /// Counts one `what` for `replica`.
    pub fn count(&self, replica: usize, what: Count) {
        let Some(c) = self.replicas.get(replica) else {
            return;
        };
        let counter = match what {
            Count::Pick => &c.picks,
            Count::FailedConnect => &c.failed_connects,
            Count::KeepaliveTimeout => &c.keepalive_timeouts,
            Count::Redirected => &c.redirected,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a state change of `replica` now, and counts it (READY is
    /// not counted: it is the end of a TRANSIENT_FAILURE).
    pub fn event(&self, replica: usize, kind: EndpointEventKind, reason: impl Into<String>) {
        if let Some(c) = self.replicas.get(replica) {
            let counter = match kind {
                EndpointEventKind::TransientFailure => Some(&c.transient_failures),
                EndpointEventKind::Ejected => Some(&c.ejections),
                EndpointEventKind::Readmitted => Some(&c.readmissions),
                EndpointEventKind::Ready | EndpointEventKind::Unspecified => None,
            };
            if let Some(counter) = counter {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.len() >= MAX_EVENTS {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        events.push(EndpointEvent {
            unix_ns: unix_nanos(),
            replica: u32::try_from(replica).unwrap_or(u32::MAX),
            kind: kind as i32,
            reason: reason.into(),
        });
    }

    /// Everything so far, for the hop `hop`.
    pub fn snapshot(&self, hop: &str) -> PoolEvents {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PoolEvents {
            hop: hop.to_string(),
            replicas: self
                .replicas
                .iter()
                .map(|c| ReplicaCounts {
                    picks: get(&c.picks),
                    transient_failures: get(&c.transient_failures),
                    failed_connects: get(&c.failed_connects),
                    keepalive_timeouts: get(&c.keepalive_timeouts),
                    redirected: get(&c.redirected),
                    ejections: get(&c.ejections),
                    readmissions: get(&c.readmissions),
                })
                .collect(),
            events: self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            dropped: get(&self.dropped),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_counted_per_replica_and_kept_in_order() {
        let log = EndpointLog::new(2);
        log.count(0, Count::Pick);
        log.count(0, Count::Pick);
        log.count(1, Count::Redirected);
        log.event(1, EndpointEventKind::TransientFailure, "connect refused");
        log.event(1, EndpointEventKind::Ready, "connected");
        log.event(0, EndpointEventKind::Ejected, "5 consecutive errors");
        let s = log.snapshot("c");
        assert_eq!(s.hop, "c");
        assert_eq!((s.replicas[0].picks, s.replicas[1].picks), (2, 0));
        assert_eq!(s.replicas[1].redirected, 1);
        assert_eq!(s.replicas[1].transient_failures, 1);
        assert_eq!(s.replicas[0].ejections, 1);
        let kinds: Vec<(u32, i32)> = s.events.iter().map(|e| (e.replica, e.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (1, EndpointEventKind::TransientFailure as i32),
                (1, EndpointEventKind::Ready as i32),
                (0, EndpointEventKind::Ejected as i32),
            ]
        );
        assert!(s.events.windows(2).all(|w| w[0].unix_ns <= w[1].unix_ns));
    }
}
