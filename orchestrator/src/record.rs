//! What the load generator measured: each request (the raw material of
//! every statistic, CSV row and verdict), the warmup's accounting, and the
//! machine during the load window; and [`RecordSink`], where each request
//! goes as it completes. Plain data shared by `loadgen` (which
//! fills it) and `analysis` (which judges it), so neither imports the other.

use std::time::Duration;

use tailmesh_proto::pb::{AttemptTiming, HopRecord};

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
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
        code: tonic::Code,
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
                .map(tonic::Code::from_i32)
                .find(|c| code_label(*c) == label)
                .map(|code| Outcome::Error {
                    code,
                    message: String::new(),
                }),
        }
    }
}

/// A gRPC code in snake case, as used in summary.json and requests.csv.
pub(crate) fn code_label(code: tonic::Code) -> String {
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
#[derive(Clone, Debug, PartialEq)]
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

/// Where completed measured requests go, one at a time, as they complete:
/// the analysis accumulator, the requests file, the trace sampler. Nothing
/// downstream of the load generator holds every record.
pub(crate) trait RecordSink {
    /// Takes one completed request of the measured phase.
    fn record(&mut self, record: &RequestRecord);

    /// The wall-clock time of the measured clock's 0 (the end of warmup),
    /// told once as the load starts, before any record.
    fn measuring_from(&mut self, _at: std::time::SystemTime) {}
}

/// What the record pipeline held at most while a variant ran: the
/// structures that could grow with the number of requests, counted, so a
/// test can show they stay bounded by what is in flight instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PipelineStats {
    /// Measured records that went through the pipeline.
    pub records: u64,
    /// Requests sent and not yet ended, at most.
    pub peak_in_flight: usize,
    /// Records ended but not yet handed to the sinks, at most.
    pub peak_held: usize,
}

/// Requests sent during warmup: not measured, but still accounted for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WarmupCounts {
    /// Sent during warmup.
    pub sent: u64,
    /// Of those, answered ok.
    pub ok: u64,
    /// Of those, errors and timeouts.
    pub failed: u64,
}

/// What the load generator's self-watch measured over one load window (the
/// machine's side; `analysis::instrument` judges whether it was busy).
#[derive(Clone, Debug, Default)]
pub(crate) struct MachineSamples {
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
}

/// CPU time used during a window, in CPUs (1.0: one CPU busy the whole
/// window).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct CpuUse {
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
            code_label(tonic::Code::ResourceExhausted),
            "resource_exhausted"
        );
        assert_eq!(code_label(tonic::Code::Unavailable), "unavailable");
        assert_eq!(
            code_label(tonic::Code::DeadlineExceeded),
            "deadline_exceeded"
        );
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
        };
        assert_eq!(r.latency(), Duration::from_millis(7));
        assert_eq!(r.service_latency(), Duration::from_millis(2));
    }
}
