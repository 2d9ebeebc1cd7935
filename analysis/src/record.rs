//! What the load generator measured: each request (the raw material of
//! every statistic, CSV row and verdict) with the path its reply carried,
//! the warmup's accounting, the machine during the load window and the
//! processes' peak memory. Plain data: the orchestrator's load generator
//! fills it, converting the protobuf reply once at its edge, and the
//! analysis judges it, so neither imports the other.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::instrument::InstrumentReport;

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A reply arrived before the deadline.
    Ok,
    /// The deadline passed first: the client gave up, or a hop answered
    /// DEADLINE_EXCEEDED.
    Timeout,
    /// Any other gRPC error (including transport failures, mapped by tonic
    /// to UNAVAILABLE/UNKNOWN), with its message.
    Error {
        /// The gRPC status code.
        code: GrpcCode,
        /// The status message, for logs and the CSV.
        message: String,
    },
}

impl Outcome {
    /// A short label: "ok", "timeout", or the gRPC code in snake case
    /// ("unavailable", "resource_exhausted", ...).
    pub fn label(&self) -> String {
        match self {
            Outcome::Ok => "ok".to_string(),
            Outcome::Timeout => "timeout".to_string(),
            Outcome::Error { code, .. } => code_label(*code),
        }
    }
}

impl Outcome {
    /// The outcome a [`Outcome::label`] names (errors with no message).
    pub fn from_label(label: &str) -> Option<Outcome> {
        match label {
            "ok" => Some(Outcome::Ok),
            "timeout" => Some(Outcome::Timeout),
            _ => (1..=16)
                .map(GrpcCode::from_i32)
                .find(|c| code_label(*c) == label)
                .map(|code| Outcome::Error {
                    code,
                    message: String::new(),
                }),
        }
    }
}

/// A gRPC status code, named as gRPC (and tonic) name it, without the
/// transport library: the load generator converts tonic's by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GrpcCode {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl GrpcCode {
    /// Every code, in the order of its number (0 to 16).
    const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code of a number; a number gRPC does not define is `Unknown`,
    /// as tonic reads it.
    pub fn from_i32(code: i32) -> GrpcCode {
        usize::try_from(code)
            .ok()
            .and_then(|i| GrpcCode::ALL.get(i).copied())
            .unwrap_or(GrpcCode::Unknown)
    }

    /// Its number on the wire.
    pub fn as_i32(self) -> i32 {
        self as i32
    }
}

/// A gRPC code in snake case, as used in summary.json and requests.csv.
pub fn code_label(code: GrpcCode) -> String {
    let name = format!("{code:?}");
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// One measured request. Times are offsets from the start of the measured
/// phase (the end of warmup).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The request id sent on the wire (unique within a variant).
    pub id: u64,
    /// When the schedule meant to send it. Closed loop: equal to `start`.
    pub intended: Duration,
    /// When it was actually sent.
    pub start: Duration,
    /// When its answer (or error, or timeout) arrived.
    pub end: Duration,
    /// How it ended.
    pub outcome: Outcome,
    /// The reply's path: one record per hop visited (empty unless ok).
    pub path: Vec<HopRecord>,
    /// Attempts the load generator sent beyond the first (retries and
    /// hedges under the first hop's client policy).
    pub extra_attempts: u32,
    /// The load generator's own attempts at the first hop, in the order
    /// sent (empty when the call was abandoned in flight).
    pub attempts: Vec<AttemptTiming>,
    /// Which message of which stream it was (`[load.streams]`); `None` for
    /// a call.
    #[serde(default)]
    pub stream: Option<StreamPlace>,
}

/// Where a message was on the load's streams: the stream, numbered in the
/// order the streams opened (warmup's included), and its place on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPlace {
    pub stream: u64,
    pub message: u32,
}

impl RequestRecord {
    /// End-to-end latency from the intended send time: the honest number
    /// (no coordinated omission).
    pub fn latency(&self) -> Duration {
        self.end.saturating_sub(self.intended)
    }

    /// Time from the actual send to the answer (what a naive tool reports).
    pub fn service_latency(&self) -> Duration {
        self.end.saturating_sub(self.start)
    }

    /// Whether any attempt beyond the first was sent for it, by the load
    /// generator or by a hop on its path (retries and hedges; failed
    /// requests carry no path, so only the generator's are seen for them).
    pub fn retried(&self) -> bool {
        self.extra_attempts > 0 || self.path.iter().any(|h| h.extra_attempts > 0)
    }
}

/// One hop a reply passed through, as the hop recorded it (the plain twin
/// of the protobuf `HopRecord`, field for field).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HopRecord {
    pub hop: String,
    pub replica: u32,
    /// Time spent in this hop's own work, injected slowness included, in ns.
    pub service_ns: u64,
    /// Time from the hop receiving the request to it answering, in ns.
    pub total_ns: u64,
    /// Whether injected slowness applied to this request at this hop.
    pub slow: bool,
    /// Time the request waited in a broker queue before this hop took it
    /// (pull only), plus its wait for a slot, in ns.
    pub queue_wait_ns: u64,
    /// Name of the hop that called this one (empty for the first hop).
    pub parent: String,
    /// How the caller reached this hop: "push", "pull" or "direct".
    pub transport: String,
    /// Attempts this hop sent to its downstream hops beyond one per call:
    /// retries and hedges, the extra load its client policies cost.
    pub extra_attempts: u32,
    /// The part of `queue_wait_ns` spent waiting for a concurrency slot
    /// inside this replica, in ns.
    pub slot_wait_ns: u64,
    /// One per downstream call this hop made for the request, in the order
    /// made (stage by stage).
    pub calls: Vec<CallTiming>,
    /// From its first downstream call's start to its last one's end, in
    /// ns (0 when it made none, or from a hop that did not say).
    pub downstream_ns: u64,
}

/// One downstream call a hop made, as the caller timed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CallTiming {
    /// The hop called.
    pub hop: String,
    /// From the call's start to its result, the client policy's attempts
    /// included, in ns.
    pub call_ns: u64,
    /// Every attempt, in the order sent (one without a policy).
    pub attempts: Vec<AttemptTiming>,
}

/// One attempt of a call (a retry or a hedge is another attempt).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptTiming {
    /// When it was sent, after the call's start, in ns.
    pub start_ns: u64,
    /// From its send to its end (answer, error, or cancel when another
    /// attempt won), in ns.
    pub took_ns: u64,
    /// How it ended: an [`AttemptEnd`]'s number, as on the wire, so a
    /// number this version does not know survives a round trip.
    pub end: i32,
}

impl AttemptTiming {
    /// How it ended; a number with no [`AttemptEnd`] reads as `Unspecified`.
    pub fn end(&self) -> AttemptEnd {
        AttemptEnd::try_from(self.end).unwrap_or(AttemptEnd::Unspecified)
    }
}

/// How an attempt ended (the protobuf `AttemptEnd`, number for number).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttemptEnd {
    #[default]
    Unspecified = 0,
    Ok = 1,
    Failed = 2,
    /// Still running when another attempt answered (or the call gave up):
    /// censored at `took_ns`.
    Cancelled = 3,
}

/// A number that is no [`AttemptEnd`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownAttemptEnd(pub i32);

impl TryFrom<i32> for AttemptEnd {
    type Error = UnknownAttemptEnd;

    fn try_from(n: i32) -> Result<Self, Self::Error> {
        match n {
            0 => Ok(AttemptEnd::Unspecified),
            1 => Ok(AttemptEnd::Ok),
            2 => Ok(AttemptEnd::Failed),
            3 => Ok(AttemptEnd::Cancelled),
            n => Err(UnknownAttemptEnd(n)),
        }
    }
}

/// The peak resident memory of one process of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakMemory {
    /// The process (`hop-b-1`, `broker`, `orchestrator`).
    pub process: String,
    /// Its peak resident set size so far (Linux's VmHWM), in bytes.
    pub peak_rss_bytes: u64,
}

/// One sample of a process the run started, taken once a second while
/// the load runs (`processes.csv`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    /// When, in seconds on the measured clock (negative during warmup).
    pub t_s: f64,
    /// The process (`hop-b-1`, `broker`).
    pub process: String,
    /// Its process id.
    pub pid: u32,
    /// Its user plus system CPU time so far, seconds.
    pub cpu_s: f64,
    /// Its resident set size then (VmRSS), bytes.
    pub rss_bytes: u64,
}

/// One sample of a broker topic (a pulled hop's queue), taken with the
/// processes' samples (`queues.csv`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueSample {
    /// When, in seconds on the measured clock.
    pub t_s: f64,
    /// The topic: the pulled hop's name.
    pub topic: String,
    /// Tasks waiting in it.
    pub depth: u64,
    /// Tasks workers held.
    pub in_flight: u64,
}

/// Requests sent during warmup: not measured, but still accounted for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmupCounts {
    /// Sent during warmup.
    pub sent: u64,
    /// Of those, answered ok.
    pub ok: u64,
    /// Of those, errors and timeouts.
    pub failed: u64,
}

/// One generator as the orchestrator sees it (summary.json's
/// `variants[].generators`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GeneratorReport {
    /// Which part of the load it sent.
    pub index: u32,
    /// Its process id.
    pub pid: u32,
    /// Its wall clock minus the orchestrator's, measured before the start.
    pub clock_offset_us: f64,
    /// The round trip of the probe the offset comes from: the offset's
    /// uncertainty is at most half of it.
    pub clock_probe_rtt_us: f64,
    /// When its load began, minus the common start, on the orchestrator's
    /// clock.
    pub start_skew_us: f64,
    /// Measured requests it sent on.
    pub records: u64,
    /// Its warmup.
    pub warmup: WarmupCounts,
    /// Requests it had sent whose records had not reached the orchestrator
    /// when it stopped reporting: in flight, or ended and waiting for its
    /// next beat.
    pub lost_in_flight: u64,
    /// Why it stopped before its part was done, when it did.
    pub stopped: Option<String>,
    /// Its self-watch, judged with its own sends' lateness.
    pub instrument: Option<InstrumentReport>,
}

/// What became of the streams of a variant whose load went on streams
/// (`[load.streams]`; summary.json's `variants[].streams`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamReport {
    /// Streams opened, warmup's included.
    pub opened: u64,
    /// Streams that ended with all their messages sent and answered (or
    /// failed in band): the stream itself held.
    pub completed: u64,
    /// Streams that broke, by the status's code name: their waiting and
    /// later messages failed with it.
    pub aborted: std::collections::BTreeMap<String, u64>,
    /// Messages due while their stream had `in_flight` awaiting answers:
    /// not sent, recorded as RESOURCE_EXHAUSTED.
    pub refused_by_cap: u64,
    /// The most messages one stream had awaiting answers at once.
    pub peak_in_flight: u64,
    /// From each stream's first message's due time to its answer: what a
    /// stream's set-up and first trip cost (streams that began after
    /// warmup).
    #[serde(default)]
    pub first_message: crate::stats::Percentiles,
    /// From each stream's first message's due time to its last message's
    /// end (streams that began after warmup).
    #[serde(default)]
    pub duration: crate::stats::Percentiles,
}

/// The load generator processes of a variant (summary.json's
/// `variants[].generators`): several that shared its load, or one that
/// ran in a process of its own (a fault on its link, or `tailmesh run
/// --generator-processes`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Generators {
    /// How many shared the load.
    pub count: u32,
    /// The latest origin minus the earliest, on the orchestrator's clock,
    /// µs.
    pub start_skew_us: f64,
    /// What that spread can be at most, µs: each origin is moved onto the
    /// orchestrator's clock by an offset whose error is at most half its
    /// probe's round trip, so two origins may be further apart than
    /// measured by up to half of the two longest round trips together.
    #[serde(default)]
    pub start_skew_bound_us: f64,
    /// Each one, by index.
    pub each: Vec<GeneratorReport>,
}

/// What the load generator's self-watch measured over one load window (the
/// machine's side; `instrument` judges whether it was busy).
#[derive(Clone, Debug, Default)]
pub struct MachineSamples {
    /// How late the watcher's 1 ms sleeps woke, µs.
    pub timer_error: Option<hdrhistogram::Histogram<u64>>,
    /// The worst one-second window's p99 of that error, µs.
    pub timer_error_worst_second_us: u64,
    /// CPUs available.
    pub cpus: usize,
    /// How long the window lasted.
    pub elapsed: Duration,
    /// Mean runnable tasks on the machine besides the watcher (the mesh's
    /// own included).
    pub runnable_mean: Option<f64>,
    /// 1-minute load average at the start, the end, and its largest sample.
    pub load_average: Option<[f64; 3]>,
    /// Share of the window some task waited for a CPU (`/proc/pressure/cpu`).
    pub cpu_pressure: Option<f64>,
    /// Share of CPU time stolen by the hypervisor over the window.
    pub steal: Option<f64>,
    /// CPU time used over the window, split between this process and its
    /// descendants (the mesh) and everything else on the machine.
    pub cpu_use: Option<CpuUse>,
    /// Involuntary context switches of the load generator's thread.
    pub involuntary_switches: Option<u64>,
    /// Whether the load generator's thread paced at real-time priority
    /// (`None`: a closed loop, which does not pace).
    pub realtime: Option<bool>,
}

/// CPU time used during a window, in CPUs (1.0: one CPU busy the whole
/// window).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuUse {
    /// The orchestrator and its descendants (the hops, the broker).
    pub mesh: f64,
    /// Every other process on the machine.
    pub others: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_labels_are_snake_case() {
        assert_eq!(
            code_label(GrpcCode::ResourceExhausted),
            "resource_exhausted"
        );
        assert_eq!(code_label(GrpcCode::Unavailable), "unavailable");
        assert_eq!(code_label(GrpcCode::DeadlineExceeded), "deadline_exceeded");
    }

    #[test]
    fn codes_read_by_number_as_grpc_numbers_them() {
        assert_eq!(GrpcCode::from_i32(14), GrpcCode::Unavailable);
        assert_eq!(GrpcCode::from_i32(4), GrpcCode::DeadlineExceeded);
        assert_eq!(GrpcCode::from_i32(16), GrpcCode::Unauthenticated);
        assert_eq!(GrpcCode::from_i32(99), GrpcCode::Unknown);
        for (i, c) in GrpcCode::ALL.into_iter().enumerate() {
            assert_eq!(c.as_i32() as usize, i);
        }
    }

    #[test]
    fn attempt_ends_read_by_number() {
        for e in [
            AttemptEnd::Unspecified,
            AttemptEnd::Ok,
            AttemptEnd::Failed,
            AttemptEnd::Cancelled,
        ] {
            let a = AttemptTiming {
                end: e as i32,
                ..AttemptTiming::default()
            };
            assert_eq!(a.end(), e);
        }
        let odd = AttemptTiming {
            end: 7,
            ..AttemptTiming::default()
        };
        assert_eq!(odd.end(), AttemptEnd::Unspecified);
    }

    #[test]
    fn latency_counts_from_intended_send_time() {
        let r = RequestRecord {
            id: 1,
            intended: Duration::from_millis(10),
            start: Duration::from_millis(15),
            end: Duration::from_millis(17),
            outcome: Outcome::Ok,
            path: vec![],
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        };
        assert_eq!(r.latency(), Duration::from_millis(7));
        assert_eq!(r.service_latency(), Duration::from_millis(2));
    }
}
