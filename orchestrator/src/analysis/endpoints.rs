//! What the mesh's push callers saw of the replicas they call (summary.json's
//! `endpoints`) and the replicas killed on schedule (`kills`), with the
//! short terminal line that sums them up per called hop.
//!
//! Times are on the measured clock (seconds from the end of warmup), like
//! the rest of summary.json; the callers stamp their events with the wall
//! clock, converted with one reading of both clocks taken when the events
//! were collected.

use serde::{Deserialize, Serialize};
use tailmesh_proto::pb;

/// A replica killed on schedule (`kill` on a hop).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KillRecord {
    /// The hop.
    pub hop: String,
    /// The replica, 0-based.
    pub replica: u32,
    /// When it was to be killed, seconds on the measured clock.
    pub at_s: f64,
    /// When it was to be back (the kill's `at + back`); absent: it stayed
    /// dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_s: Option<f64>,
    /// When the launcher had killed and reaped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub killed_at_s: Option<f64>,
    /// When its new process answered health checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at_s: Option<f64>,
    /// Per caller of its hop, the calls it sent to the replica while it
    /// was down: between the kill and the restart (or the load's end), as
    /// the caller's pick counts said then. Absent for callers that do not
    /// report endpoint events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub picks_while_down: Vec<CallerPicks>,
}

/// A caller's calls to one replica over a stretch of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerPicks {
    /// `loadgen`, or the calling replica as `hop/replica`.
    pub caller: String,
    /// Calls sent.
    pub picks: u64,
}

/// What one caller did with one called hop's replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallerEndpoints {
    /// `loadgen`, or the calling replica as `hop/replica` (`a/0`).
    pub caller: String,
    /// The hop called.
    pub hop: String,
    /// Per replica of the called hop, replica i at index i.
    pub replicas: Vec<ReplicaCounts>,
    /// The state changes in time order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EndpointEvent>,
    /// Events the caller only counted (it keeps the first 10,000).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A caller's counts for one replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaCounts {
    /// Calls sent to it.
    pub picks: u64,
    /// Times it entered TRANSIENT_FAILURE.
    pub transient_failures: u64,
    /// Reconnect attempts that failed.
    pub failed_connects: u64,
    /// Keepalive PINGs unanswered.
    pub keepalive_timeouts: u64,
    /// Calls picked for it but sent to another replica (its connection
    /// failed before they left).
    pub redirected: u64,
    /// Times outlier ejection ejected it, and re-admitted it.
    pub ejections: u64,
    pub readmissions: u64,
}

/// A state change of a replica, as one caller saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointEvent {
    /// When, seconds on the measured clock.
    pub at_s: f64,
    /// The replica of the called hop.
    pub replica: u32,
    /// `transient_failure`, `ready`, `ejected` or `readmitted`.
    pub kind: String,
    /// Why, for people (`connect refused`, `keepalive timeout`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// The name of an event kind, as summary.json writes it.
pub(crate) fn kind_name(kind: i32) -> &'static str {
    match pb::EndpointEventKind::try_from(kind) {
        Ok(pb::EndpointEventKind::TransientFailure) => "transient_failure",
        Ok(pb::EndpointEventKind::Ready) => "ready",
        Ok(pb::EndpointEventKind::Ejected) => "ejected",
        Ok(pb::EndpointEventKind::Readmitted) => "readmitted",
        _ => "unspecified",
    }
}

impl CallerEndpoints {
    /// `pool` as seen by `caller`; an event stamped `unix_ns` is placed on
    /// the measured clock by `measured_s(unix_ns)`.
    pub fn from_pool(caller: &str, pool: &pb::PoolEvents, measured_s: impl Fn(u64) -> f64) -> Self {
        CallerEndpoints {
            caller: caller.to_owned(),
            hop: pool.hop.clone(),
            replicas: pool
                .replicas
                .iter()
                .map(|r| ReplicaCounts {
                    picks: r.picks,
                    transient_failures: r.transient_failures,
                    failed_connects: r.failed_connects,
                    keepalive_timeouts: r.keepalive_timeouts,
                    redirected: r.redirected,
                    ejections: r.ejections,
                    readmissions: r.readmissions,
                })
                .collect(),
            events: pool
                .events
                .iter()
                .map(|e| EndpointEvent {
                    at_s: measured_s(e.unix_ns),
                    replica: e.replica,
                    kind: kind_name(e.kind).to_owned(),
                    reason: e.reason.clone(),
                })
                .collect(),
            dropped: pool.dropped,
        }
    }

    /// Whether anything happened beyond picking: a state change or a
    /// counted trouble.
    pub fn eventful(&self) -> bool {
        !self.events.is_empty()
            || self.dropped > 0
            || self.replicas.iter().any(|r| {
                r.transient_failures + r.failed_connects + r.keepalive_timeouts + r.ejections > 0
            })
    }
}

/// The terminal's summary of `endpoints` per called hop, one clause per
/// hop that had events: `middle r1 transient_failure x2 (first 3.02 s),
/// ready x2 (last 6.11 s)`; `None` when nothing happened.
pub(crate) fn describe(endpoints: &[CallerEndpoints]) -> Option<String> {
    use std::collections::BTreeMap;
    /// How many times a change was seen, first and last.
    type Seen = (u64, f64, f64);
    // (hop, replica) -> kind -> what was seen
    let mut seen: BTreeMap<(&str, u32), BTreeMap<&str, Seen>> = BTreeMap::new();
    for c in endpoints {
        for e in &c.events {
            let entry = seen
                .entry((c.hop.as_str(), e.replica))
                .or_default()
                .entry(e.kind.as_str())
                .or_insert((0, e.at_s, e.at_s));
            entry.0 += 1;
            entry.1 = entry.1.min(e.at_s);
            entry.2 = entry.2.max(e.at_s);
        }
    }
    if seen.is_empty() {
        return None;
    }
    let order = ["transient_failure", "ready", "ejected", "readmitted"];
    let clauses: Vec<String> = seen
        .iter()
        .map(|((hop, replica), kinds)| {
            let mut parts = Vec::new();
            for kind in order {
                let Some((n, first, last)) = kinds.get(kind) else {
                    continue;
                };
                parts.push(if *n == 1 {
                    format!("{kind} ({first:.2} s)")
                } else {
                    format!("{kind} x{n} ({first:.2}..{last:.2} s)")
                });
            }
            format!("{hop} r{replica} {}", parts.join(", "))
        })
        .collect();
    Some(clauses.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> pb::PoolEvents {
        pb::PoolEvents {
            hop: "b".into(),
            replicas: vec![
                pb::ReplicaCounts {
                    picks: 10,
                    ..Default::default()
                },
                pb::ReplicaCounts {
                    picks: 4,
                    transient_failures: 1,
                    failed_connects: 2,
                    ..Default::default()
                },
            ],
            events: vec![
                pb::EndpointEvent {
                    unix_ns: 4_000_000_000,
                    replica: 1,
                    kind: pb::EndpointEventKind::TransientFailure as i32,
                    reason: "connection ended".into(),
                },
                pb::EndpointEvent {
                    unix_ns: 7_500_000_000,
                    replica: 1,
                    kind: pb::EndpointEventKind::Ready as i32,
                    reason: String::new(),
                },
            ],
            dropped: 0,
        }
    }

    #[test]
    fn pool_events_land_on_the_measured_clock_with_their_counts() {
        // The measured clock's 0 at 1 s of wall time.
        let c = CallerEndpoints::from_pool("a/0", &pool(), |ns| ns as f64 / 1e9 - 1.0);
        assert_eq!(c.caller, "a/0");
        assert_eq!(c.replicas[1].failed_connects, 2);
        assert_eq!(c.events[0].kind, "transient_failure");
        assert!((c.events[0].at_s - 3.0).abs() < 1e-9);
        assert!((c.events[1].at_s - 6.5).abs() < 1e-9);
        assert!(c.eventful());

        let quiet = pb::PoolEvents {
            events: Vec::new(),
            replicas: vec![pb::ReplicaCounts {
                picks: 3,
                ..Default::default()
            }],
            ..pool()
        };
        assert!(!CallerEndpoints::from_pool("loadgen", &quiet, |_| 0.0).eventful());
    }

    #[test]
    fn the_terminal_line_sums_up_per_called_replica() {
        let a = CallerEndpoints::from_pool("a/0", &pool(), |ns| ns as f64 / 1e9 - 1.0);
        let mut b = a.clone();
        b.caller = "a/1".into();
        for e in &mut b.events {
            e.at_s += 0.01;
        }
        assert_eq!(
            describe(&[a, b]).as_deref(),
            Some("b r1 transient_failure x2 (3.00..3.01 s), ready x2 (6.50..6.51 s)")
        );
        assert_eq!(describe(&[]), None);
    }
}
