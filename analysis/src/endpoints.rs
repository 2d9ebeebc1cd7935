//! What the mesh's push callers saw of the replicas they call (summary.json's
//! `endpoints`) and the replicas killed on schedule (`kills`), with the
//! short terminal line that sums them up per called hop.
//!
//! Times are on the measured clock (seconds from the end of warmup), like
//! the rest of summary.json; the callers stamp their events with the wall
//! clock, converted with one reading of both clocks taken when the events
//! were collected.

use serde::{Deserialize, Serialize};

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

impl CallerEndpoints {
    /// The calls it sent to `replica` of `hop`; `None` when it calls
    /// another hop, or `hop` has no such replica.
    pub fn picks_of(&self, hop: &str, replica: u32) -> Option<u64> {
        if self.hop != hop {
            return None;
        }
        self.replicas.get(replica as usize).map(|r| r.picks)
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
pub fn describe(endpoints: &[CallerEndpoints]) -> Option<String> {
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
