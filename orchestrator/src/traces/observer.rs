//! What tracing costs, measured in the run it costs: CPU meters for the
//! orchestrator's own parts (the receiver thread, the spool, the tail
//! sampler, the load generator's spans) and the hop processes' own
//! counters, which every export request carries in its resource
//! attributes (`tailmesh.observer.*`, cumulative, per
//! `service.instance.id`). `analysis::observer` turns them into the
//! variant's `observer` report.

use std::{
    collections::HashMap,
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use opentelemetry_proto::tonic::{common::v1::any_value::Value, resource::v1::Resource};

/// The resource attribute naming one process.
pub const INSTANCE_ID: &str = "service.instance.id";
/// Spans the process recorded (cumulative).
pub const SPANS: &str = "tailmesh.observer.spans";
/// Spans it dropped (cumulative).
pub const DROPPED: &str = "tailmesh.observer.dropped";
/// ns its serving threads spent making and propagating spans (cumulative).
pub const RECORD_NS: &str = "tailmesh.observer.record_ns";
/// CPU ns of its exporter thread (cumulative).
pub const EXPORT_CPU_NS: &str = "tailmesh.observer.export_cpu_ns";
/// Holding its spans for the run's decisions: spans evicted unsent, kept
/// traces it no longer held, the longest such a decision came after its
/// trace's first span (ns), and decisions the run had forgotten when it
/// asked (all cumulative; see `services::telemetry::held`).
pub const EVICTED: &str = "tailmesh.observer.evicted";
pub const LOST_TRACES: &str = "tailmesh.observer.lost_traces";
pub const LOST_DELAY_NS: &str = "tailmesh.observer.lost_delay_ns";
pub const FORGOTTEN: &str = "tailmesh.observer.forgotten_decisions";

/// The calling thread's CPU time, ns; `None` where the clock cannot be
/// read.
pub fn thread_cpu_ns() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    let secs = u64::try_from(t.tv_sec()).ok()?;
    let nanos = u64::try_from(t.tv_nsec()).ok()?;
    Some(secs * 1_000_000_000 + nanos)
}

/// What two back-to-back reads of the thread CPU clock measure, ns: the
/// clock's own cost inside a timed interval, taken off every reading. The
/// least of a few tries (an interrupt can land in any one).
fn clock_overhead_ns() -> u64 {
    static OVERHEAD: OnceLock<u64> = OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        (0..32)
            .filter_map(|_| thread_cpu_ns().zip(thread_cpu_ns()))
            .map(|(a, b)| b.saturating_sub(a))
            .min()
            .unwrap_or(0)
    })
}

/// The CPU time of thread `tid` of this process, ns: the scheduler's own
/// count (`/proc/self/task/<tid>/schedstat`, first field); `None` where
/// the kernel does not give it.
pub fn task_cpu_ns(tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// How often a [`CpuMeter::sampled`] meter reads the clock: every this
/// many calls. The thread CPU clock is a system call (the kernel offers no
/// fast path for it), about as costly as the cheapest parts metered (one
/// request's share of the work); one call in 16 keeps the meter's own cost
/// a small fraction of what it measures.
pub const METER_EVERY: u64 = 16;

/// The CPU time a part of the observer spends on the threads that call
/// it: every call, or every [`METER_EVERY`]th, is timed on the calling
/// thread's CPU clock (less the clock's own cost), and the total is the
/// timed calls' mean times the calls.
#[derive(Debug)]
pub struct CpuMeter {
    every: u64,
    calls: AtomicU64,
    timed_calls: AtomicU64,
    timed_ns: AtomicU64,
}

/// A meter's reading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuReading {
    /// Calls metered.
    pub calls: u64,
    /// Calls whose CPU time was read.
    pub timed_calls: u64,
    /// The CPU time of those, ns.
    pub timed_ns: u64,
}

impl CpuReading {
    /// The estimated CPU time of every call, ns.
    pub fn total_ns(&self) -> u64 {
        if self.timed_calls == 0 {
            return 0;
        }
        let mean = self.timed_ns as f64 / self.timed_calls as f64;
        (mean * self.calls as f64).round() as u64
    }

    /// What was metered since `earlier`.
    pub fn since(&self, earlier: &CpuReading) -> CpuReading {
        CpuReading {
            calls: self.calls.saturating_sub(earlier.calls),
            timed_calls: self.timed_calls.saturating_sub(earlier.timed_calls),
            timed_ns: self.timed_ns.saturating_sub(earlier.timed_ns),
        }
    }
}

impl CpuMeter {
    /// A meter timing every call: for calls that do much (a batch of
    /// spans), where the clock costs little beside them.
    pub fn every_call() -> Self {
        CpuMeter {
            every: 1,
            calls: AtomicU64::new(0),
            timed_calls: AtomicU64::new(0),
            timed_ns: AtomicU64::new(0),
        }
    }

    /// A meter timing every [`METER_EVERY`]th call, the first timed being
    /// the last of the first round (a first call that sets something up
    /// would stand for too many).
    pub fn sampled() -> Self {
        CpuMeter {
            every: METER_EVERY,
            ..CpuMeter::every_call()
        }
    }

    /// Runs `f`, timing it when its turn comes.
    pub fn measure<T>(&self, f: impl FnOnce() -> T) -> T {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        if n % self.every != self.every - 1 {
            return f();
        }
        let overhead = clock_overhead_ns();
        let Some(before) = thread_cpu_ns() else {
            return f();
        };
        let out = f();
        if let Some(after) = thread_cpu_ns() {
            self.timed_calls.fetch_add(1, Ordering::Relaxed);
            let spent = after.saturating_sub(before).saturating_sub(overhead);
            self.timed_ns.fetch_add(spent, Ordering::Relaxed);
        }
        out
    }

    /// The reading so far.
    pub fn read(&self) -> CpuReading {
        CpuReading {
            calls: self.calls.load(Ordering::Relaxed),
            timed_calls: self.timed_calls.load(Ordering::Relaxed),
            timed_ns: self.timed_ns.load(Ordering::Relaxed),
        }
    }
}

/// One process's counters, as its latest export request gave them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    pub spans: u64,
    pub dropped: u64,
    pub record_ns: u64,
    pub export_cpu_ns: u64,
    pub evicted: u64,
    pub lost_traces: u64,
    pub lost_delay_ns: u64,
    pub forgotten: u64,
}

impl ProcessCounters {
    /// The counters of `resource`, when it names its process and carries
    /// them; a counter it lacks reads 0.
    fn of(resource: &Resource) -> Option<(&str, ProcessCounters)> {
        let mut instance = None;
        let mut counters = ProcessCounters::default();
        let mut any = false;
        for kv in &resource.attributes {
            let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
            let slot = match kv.key.as_str() {
                INSTANCE_ID => {
                    if let Some(Value::StringValue(s)) = value {
                        instance = Some(s.as_str());
                    }
                    continue;
                }
                SPANS => &mut counters.spans,
                DROPPED => &mut counters.dropped,
                RECORD_NS => &mut counters.record_ns,
                EXPORT_CPU_NS => &mut counters.export_cpu_ns,
                EVICTED => &mut counters.evicted,
                LOST_TRACES => &mut counters.lost_traces,
                LOST_DELAY_NS => &mut counters.lost_delay_ns,
                FORGOTTEN => &mut counters.forgotten,
                _ => continue,
            };
            if let Some(Value::IntValue(i)) = value {
                *slot = u64::try_from(*i).unwrap_or(0);
                any = true;
            }
        }
        Some((instance?, counters)).filter(|_| any)
    }

    /// Each counter's larger value: the counters only grow, so the
    /// largest seen is the latest, whatever order the batches came in.
    fn merge(&mut self, other: ProcessCounters) {
        self.spans = self.spans.max(other.spans);
        self.dropped = self.dropped.max(other.dropped);
        self.record_ns = self.record_ns.max(other.record_ns);
        self.export_cpu_ns = self.export_cpu_ns.max(other.export_cpu_ns);
        self.evicted = self.evicted.max(other.evicted);
        self.lost_traces = self.lost_traces.max(other.lost_traces);
        self.lost_delay_ns = self.lost_delay_ns.max(other.lost_delay_ns);
        self.forgotten = self.forgotten.max(other.forgotten);
    }
}

/// The processes' counters over a variant's export requests: the latest
/// per process, and the spans received from the processes that report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessTally {
    by_instance: HashMap<String, ProcessCounters>,
    /// Spans received in requests whose resource carried counters.
    received_from_reporting: u64,
}

/// The sum over the processes that reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportedTotals {
    /// Processes that reported their counters.
    pub processes: u64,
    pub counters: ProcessCounters,
    /// Spans received from them.
    pub received: u64,
}

impl ProcessTally {
    /// Notes the resource of `spans` spans of one export request.
    pub fn note(&mut self, resource: Option<&Resource>, spans: u64) {
        let Some((instance, counters)) = resource.and_then(ProcessCounters::of) else {
            return;
        };
        self.received_from_reporting += spans;
        match self.by_instance.get_mut(instance) {
            Some(c) => c.merge(counters),
            None => {
                self.by_instance.insert(instance.to_owned(), counters);
            }
        }
    }

    /// The totals; `None` when no process reported (not tailmesh's
    /// processes, or older ones): "not reported", not 0.
    pub fn totals(&self) -> Option<ReportedTotals> {
        if self.by_instance.is_empty() {
            return None;
        }
        let mut t = ReportedTotals {
            processes: self.by_instance.len() as u64,
            received: self.received_from_reporting,
            ..ReportedTotals::default()
        };
        for c in self.by_instance.values() {
            t.counters.spans += c.spans;
            t.counters.dropped += c.dropped;
            t.counters.record_ns += c.record_ns;
            t.counters.export_cpu_ns += c.export_cpu_ns;
            t.counters.evicted += c.evicted;
            t.counters.lost_traces += c.lost_traces;
            t.counters.lost_delay_ns = t.counters.lost_delay_ns.max(c.lost_delay_ns);
            t.counters.forgotten += c.forgotten;
        }
        Some(t)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};

    use super::*;

    fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..KeyValue::default()
        }
    }

    /// The resource of process `instance` reporting `c`.
    pub(crate) fn reporting(service: &str, instance: &str, c: ProcessCounters) -> Resource {
        let int = |v: u64| Value::IntValue(v as i64);
        Resource {
            attributes: vec![
                kv("service.name", Value::StringValue(service.into())),
                kv(INSTANCE_ID, Value::StringValue(instance.into())),
                kv(SPANS, int(c.spans)),
                kv(DROPPED, int(c.dropped)),
                kv(RECORD_NS, int(c.record_ns)),
                kv(EXPORT_CPU_NS, int(c.export_cpu_ns)),
            ],
            ..Resource::default()
        }
    }

    fn counters(spans: u64, dropped: u64, record_ns: u64, export_cpu_ns: u64) -> ProcessCounters {
        ProcessCounters {
            spans,
            dropped,
            record_ns,
            export_cpu_ns,
            ..ProcessCounters::default()
        }
    }

    #[test]
    fn the_latest_counters_of_each_process_are_summed() {
        let mut tally = ProcessTally::default();
        // Two processes, three batches each, one arriving out of order.
        tally.note(
            Some(&reporting("hop-a", "a1", counters(10, 0, 100, 50))),
            10,
        );
        tally.note(Some(&reporting("hop-b", "b1", counters(5, 1, 40, 20))), 5);
        tally.note(
            Some(&reporting("hop-a", "a1", counters(30, 2, 300, 150))),
            20,
        );
        tally.note(Some(&reporting("hop-b", "b1", counters(12, 1, 90, 60))), 7);
        tally.note(
            Some(&reporting("hop-a", "a1", counters(20, 1, 200, 90))),
            10,
        );
        let t = tally.totals().expect("reported");
        assert_eq!(t.processes, 2);
        assert_eq!(t.counters, counters(42, 3, 390, 210));
        assert_eq!(t.received, 52);
    }

    #[test]
    fn processes_with_the_same_service_are_told_apart_by_instance() {
        let mut tally = ProcessTally::default();
        tally.note(Some(&reporting("hop-c", "c0", counters(4, 0, 8, 8))), 4);
        tally.note(Some(&reporting("hop-c", "c1", counters(6, 0, 9, 9))), 6);
        let t = tally.totals().expect("reported");
        assert_eq!((t.processes, t.counters.spans), (2, 10));
    }

    #[test]
    fn without_the_attributes_nothing_is_reported() {
        let mut tally = ProcessTally::default();
        tally.note(None, 3);
        let plain = Resource {
            attributes: vec![kv("service.name", Value::StringValue("x".into()))],
            ..Resource::default()
        };
        tally.note(Some(&plain), 3);
        // Counters without an instance id cannot be told apart: skipped.
        let mut anonymous = reporting("x", "x0", counters(1, 0, 1, 1));
        anonymous.attributes.retain(|kv| kv.key != INSTANCE_ID);
        tally.note(Some(&anonymous), 1);
        // An instance id alone is not a report.
        let mut bare = reporting("x", "x0", counters(1, 0, 1, 1));
        bare.attributes
            .retain(|kv| !kv.key.starts_with("tailmesh."));
        tally.note(Some(&bare), 1);
        assert_eq!(tally.totals(), None);
    }

    #[test]
    fn a_meter_scales_its_timed_calls_to_every_call() {
        let meter = CpuMeter::sampled();
        let mut spins = 0u64;
        for _ in 0..(METER_EVERY * 4) {
            meter.measure(|| {
                for i in 0..2_000u64 {
                    spins = std::hint::black_box(spins.wrapping_add(i));
                }
            });
        }
        let r = meter.read();
        assert_eq!(r.calls, METER_EVERY * 4);
        assert_eq!(r.timed_calls, 4, "every {METER_EVERY}th call is timed");
        assert!(r.timed_ns > 0, "spinning takes CPU time");
        assert_eq!(
            r.total_ns(),
            (r.timed_ns as f64 / 4.0 * (METER_EVERY * 4) as f64).round() as u64
        );
        let later = CpuReading {
            calls: r.calls + 16,
            timed_calls: r.timed_calls + 1,
            timed_ns: r.timed_ns + 500,
        };
        assert_eq!(
            later.since(&r),
            CpuReading {
                calls: 16,
                timed_calls: 1,
                timed_ns: 500
            }
        );
        assert_eq!(CpuReading::default().total_ns(), 0);
        let every = CpuMeter::every_call();
        for _ in 0..3 {
            every.measure(|| ());
        }
        assert_eq!((every.read().calls, every.read().timed_calls), (3, 3));
    }

    #[test]
    fn a_thread_s_cpu_time_grows_with_its_work() {
        let tid = nix::unistd::gettid().as_raw();
        let (Some(before), Some(task_before)) = (thread_cpu_ns(), task_cpu_ns(tid)) else {
            panic!("this kernel gives thread CPU times");
        };
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x ^ i);
        }
        let after = thread_cpu_ns().expect("clock");
        let task_after = task_cpu_ns(tid).expect("schedstat");
        assert!(after > before);
        assert!(task_after > task_before);
    }
}
