//! A network fault as summary.json records it: where it was, what it did,
//! how it was applied and when its window was in force. `tailmesh-netfault`
//! applies faults and fills these in; the analysis and the report read them.

use serde::{Deserialize, Serialize};

/// How a fault was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// `tc netem` on both ends of the replica's veth.
    Netem,
    /// An nftables `numgen` drop rule inside the replica's namespace.
    NftablesNumgen,
    /// `tailmesh delay-line` on NFQUEUE inside the replica's namespace.
    NfqueueDelayLine,
}

/// One fault as recorded in summary.json: on a hop replica's link, or on
/// a load generator's (`generator` set, `hop` empty and left out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaultRecord {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hop: String,
    /// The replica, 0-based (0 for a generator's link).
    pub replica: u32,
    /// The load generator whose link it was on, 0-based.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<u32>,
    /// Its namespace.
    pub namespace: String,
    /// Drop probability per packet per direction.
    pub loss: f64,
    /// Added delay per packet per direction, in microseconds.
    pub delay_us: u64,
    /// Jitter of that delay, in microseconds.
    pub jitter_us: u64,
    /// When it was planned to start, on the measured clock: from the end
    /// of warmup, the clock of requests.csv (ms).
    pub start_ms: u64,
    /// How long it lasted (ms); absent: until the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// How it was applied: one mechanism (netem), or the loss and the
    /// delay mechanisms of the fallback.
    pub mechanisms: Vec<Mechanism>,
    /// Packets the fault saw and dropped, read when it was cleared:
    /// `[seen, dropped]` over both directions, from the nftables rules'
    /// counters or the netem qdiscs' statistics (`tc -s qdisc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<[u64; 2]>,
    /// When the agent answered that it was applied, in seconds on the
    /// measured clock (negative: during warmup, or before the load when the
    /// window starts at 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at_s: Option<f64>,
    /// When the agent answered that it was cleared, in seconds on the
    /// measured clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_at_s: Option<f64>,
}

/// A fault window as recorded in summary.json: planned on the measured
/// clock (seconds from the end of warmup, the clock of requests.csv), and
/// when the replica's agent answered that it was applied and cleared. A
/// window on a load generator's link has `generator` set and no `hop`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowRecord {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hop: String,
    /// The replica, 0-based (0 for a generator's link).
    pub replica: u32,
    /// The load generator whose link it was on, 0-based.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<u32>,
    /// `net`, `slow`, `replica_slow` or `error`.
    pub kind: String,
    /// The planned start.
    pub start_s: f64,
    /// The planned end; absent: the end of the load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_s: Option<f64>,
    /// When it was applied; absent if it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at_s: Option<f64>,
    /// When it was cleared; absent if the agent did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_at_s: Option<f64>,
}
