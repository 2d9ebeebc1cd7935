//! What tracing cost in the run it traced (summary.json's
//! `variants[].observer`): the CPU the hop processes say they spent
//! recording and exporting spans, and the CPU the orchestrator spent
//! receiving, spooling and tail-sampling them and making the load
//! generator's own spans, per traced request and as a share of the CPU
//! the run's processes used in the load window. The pass over the spans
//! after the load is given apart: it does not disturb the measured load.

use serde::{Deserialize, Serialize};

/// What was measured of one traced variant, in ns (the inputs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ObserverInputs {
    /// Requests traced, kept or not (warmup's included: the processes'
    /// counters and the orchestrator's meters count them too).
    pub traced_requests: u64,
    /// Spans the orchestrator received for the variant (the load
    /// generator's included).
    pub spans: u64,
    /// The processes' own counters, `None` when none reported them.
    pub processes: Option<ProcessInputs>,
    /// The receiver's thread besides spooling; `None` when its CPU time
    /// could not be read.
    pub receiver_ns: Option<u64>,
    pub spool_ns: u64,
    pub sampling_ns: u64,
    pub loadgen_spans_ns: u64,
    /// The pass over the spans after the load; `None` when not measured.
    pub analysis_ns: Option<u64>,
}

/// The sums of the counters the hop and broker processes reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessInputs {
    /// Processes that reported.
    pub processes: u64,
    /// Spans they say they recorded.
    pub spans: u64,
    /// Spans they say they dropped.
    pub dropped: u64,
    /// Spans received from them.
    pub received: u64,
    pub record_ns: u64,
    pub export_cpu_ns: u64,
}

/// The observer's cost in one variant. A part that was not measured is
/// `null` ("not reported"), never 0; with traces off every part is 0 by
/// construction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObserverReport {
    /// Whether the variant was traced.
    pub traced: bool,
    /// Requests traced, whether their traces were kept or not (warmup's
    /// included): with held spans every one costs its spans' recording
    /// and hold, so the costs per request are over these.
    pub traced_requests: u64,
    /// Spans received for the variant, the load generator's included
    /// (with held spans, the kept traces' only).
    pub spans: u64,
    /// Spans made per traced request: the processes' recorded spans (when
    /// they reported them, else the spans received) plus the load
    /// generator's one, over `traced_requests`.
    pub spans_per_traced_request: Option<f64>,
    /// Hop and broker processes that reported their counters (0: none
    /// did, and the `processes_*` fields and their CPU are `null`).
    pub processes_reporting: u64,
    /// Spans those processes say they recorded.
    pub processes_spans: Option<u64>,
    /// Spans those processes say they dropped (never sent).
    pub processes_dropped: Option<u64>,
    /// Spans the orchestrator received from them: equal to
    /// `processes_spans - processes_dropped` when none was lost on the way.
    pub processes_spans_received: Option<u64>,
    /// CPU each part spent while the load ran, µs.
    pub cpu_us: ObserverCpu,
    /// The measured parts' sum over `traced_requests`, µs.
    pub cpu_us_per_traced_request: Option<f64>,
    /// The measured parts' sum over the CPU the orchestrator and its
    /// child processes used in the load window (`instrument.mesh_cpus`
    /// times `instrument.window_s`), 0 to 1.
    pub share_of_cpu: Option<f64>,
    /// Whether every part was measured (the processes reported, the
    /// receiver's thread was read): otherwise the sums leave out the
    /// `null` parts.
    pub complete: bool,
    /// CPU of the pass over the spans after the load (breakdown and
    /// Jaeger files), µs: not while the load ran, so not in the sums.
    pub analysis_cpu_us: Option<f64>,
}

/// CPU per part of the observer, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ObserverCpu {
    /// The hop and broker processes' serving threads making spans and
    /// their trace context headers.
    pub hops_recording: Option<f64>,
    /// Their exporter threads converting and sending spans.
    pub hops_export: Option<f64>,
    /// The orchestrator's receiver thread serving OTLP export calls,
    /// checking batches and forwarding (spooling aside).
    pub receiver: Option<f64>,
    /// Appending batches to the spool file (the load generator's own
    /// spans encoded besides).
    pub spool: f64,
    /// The tail sampler's decision as each request ends.
    pub sampling: f64,
    /// Making the load generator's client spans.
    pub loadgen_spans: f64,
    /// The sum of the measured parts.
    pub total: f64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl ObserverReport {
    /// The report of a variant that traced nothing.
    pub fn off() -> Self {
        ObserverReport {
            traced: false,
            traced_requests: 0,
            spans: 0,
            spans_per_traced_request: None,
            processes_reporting: 0,
            processes_spans: Some(0),
            processes_dropped: Some(0),
            processes_spans_received: Some(0),
            cpu_us: ObserverCpu {
                hops_recording: Some(0.0),
                hops_export: Some(0.0),
                receiver: Some(0.0),
                ..ObserverCpu::default()
            },
            cpu_us_per_traced_request: None,
            share_of_cpu: Some(0.0),
            complete: true,
            analysis_cpu_us: Some(0.0),
        }
    }

    /// The report of a traced variant from what was measured;
    /// `window_cpu_us` is the mesh's CPU over the load window, µs, when the
    /// self-watch measured it (`ObserverReport::assess` reads it from a
    /// variant's report).
    pub fn from_inputs(m: &ObserverInputs, window_cpu_us: Option<f64>) -> Self {
        let p = m.processes;
        let cpu = {
            let hops_recording = p.map(|p| us(p.record_ns));
            let hops_export = p.map(|p| us(p.export_cpu_ns));
            let receiver = m.receiver_ns.map(us);
            let (spool, sampling, loadgen_spans) =
                (us(m.spool_ns), us(m.sampling_ns), us(m.loadgen_spans_ns));
            let total = [hops_recording, hops_export, receiver]
                .into_iter()
                .flatten()
                .sum::<f64>()
                + spool
                + sampling
                + loadgen_spans;
            ObserverCpu {
                hops_recording,
                hops_export,
                receiver,
                spool,
                sampling,
                loadgen_spans,
                total,
            }
        };
        let per_request = |x: f64| (m.traced_requests > 0).then(|| x / m.traced_requests as f64);
        ObserverReport {
            traced: true,
            traced_requests: m.traced_requests,
            spans: m.spans,
            spans_per_traced_request: per_request(
                p.map_or(m.spans, |p| p.spans + m.traced_requests) as f64,
            ),
            processes_reporting: p.map_or(0, |p| p.processes),
            processes_spans: p.map(|p| p.spans),
            processes_dropped: p.map(|p| p.dropped),
            processes_spans_received: p.map(|p| p.received),
            cpu_us_per_traced_request: per_request(cpu.total),
            share_of_cpu: window_cpu_us.map(|w| cpu.total / w),
            complete: p.is_some() && m.receiver_ns.is_some(),
            cpu_us: cpu,
            analysis_cpu_us: m.analysis_ns.map(us),
        }
    }

    /// One line for the terminal and the report: "7.0 spans/request,
    /// 12.3 us CPU per request (8.1 % of the run's CPU)".
    pub fn line(&self) -> String {
        if !self.traced {
            return "traces off: no observer cost".to_owned();
        }
        let mut line = match self.spans_per_traced_request {
            Some(s) => format!("{s:.1} spans/request"),
            None => "no traced request".to_owned(),
        };
        if let Some(per) = self.cpu_us_per_traced_request {
            line.push_str(&format!(", {per:.1} us CPU per request"));
        }
        if let Some(share) = self.share_of_cpu {
            line.push_str(&format!(" ({:.1} % of the run's CPU)", share * 100.0));
        }
        if self.processes_reporting == 0 {
            line.push_str("; hops' own cost not reported");
        } else if self.cpu_us.receiver.is_none() {
            line.push_str("; receiver's cost not measured");
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InstrumentReport, VariantReport};

    fn variant(mesh_cpus: Option<f64>, window_s: Option<f64>) -> VariantReport {
        use crate::testing::{analyze_variant, chain3, check, ok_records};
        let mut v = analyze_variant(
            &chain3(),
            &check(),
            &ok_records(),
            std::time::Duration::from_secs(1),
        );
        v.instrument = Some(InstrumentReport {
            timer_error: Default::default(),
            timer_error_worst_second_us: 0,
            cpus: 2,
            runnable_mean: None,
            load_average: None,
            cpu_pressure: None,
            steal: None,
            mesh_cpus,
            others_cpus: None,
            window_s,
            involuntary_switches: None,
            involuntary_switches_per_s: None,
            realtime: None,
            busy: false,
            busy_reasons: Vec::new(),
        });
        v
    }

    fn inputs() -> ObserverInputs {
        ObserverInputs {
            traced_requests: 100,
            spans: 700,
            processes: Some(ProcessInputs {
                processes: 3,
                spans: 600,
                dropped: 0,
                received: 600,
                record_ns: 400_000,
                export_cpu_ns: 300_000,
            }),
            receiver_ns: Some(150_000),
            spool_ns: 50_000,
            sampling_ns: 20_000,
            loadgen_spans_ns: 80_000,
            analysis_ns: Some(900_000),
        }
    }

    #[test]
    fn every_part_adds_up_per_request_and_as_a_share_of_the_window() {
        // 1 s at 0.5 CPUs: 500,000 us of the run's CPU.
        let r = ObserverReport::assess(&inputs(), &variant(Some(0.5), Some(1.0)));
        let total = 400.0 + 300.0 + 150.0 + 50.0 + 20.0 + 80.0;
        assert_eq!(r.cpu_us.total, total);
        assert_eq!(r.cpu_us.hops_recording, Some(400.0));
        assert_eq!(r.cpu_us.receiver, Some(150.0));
        assert_eq!(r.cpu_us_per_traced_request, Some(total / 100.0));
        assert_eq!(r.spans_per_traced_request, Some(7.0));
        assert_eq!(r.share_of_cpu, Some(total / 500_000.0));
        assert_eq!(r.analysis_cpu_us, Some(900.0), "kept apart from the sum");
        assert!(r.complete && r.traced);
        assert_eq!((r.processes_reporting, r.processes_spans), (3, Some(600)));
        let line = r.line();
        assert!(
            line.starts_with("7.0 spans/request, 10.0 us CPU per request"),
            "{line}"
        );
        assert!(line.contains("(0.2 % of the run's CPU)"), "{line}");
    }

    #[test]
    fn what_was_not_reported_is_null_and_left_out_of_the_sums() {
        let m = ObserverInputs {
            processes: None,
            receiver_ns: None,
            ..inputs()
        };
        let r = ObserverReport::assess(&m, &variant(None, Some(1.0)));
        assert_eq!(r.cpu_us.hops_recording, None);
        assert_eq!(r.cpu_us.hops_export, None);
        assert_eq!(r.cpu_us.receiver, None);
        assert_eq!(r.processes_spans, None);
        assert_eq!(r.processes_reporting, 0);
        assert_eq!(r.cpu_us.total, 150.0);
        assert_eq!(r.share_of_cpu, None, "no window CPU, no share");
        assert!(!r.complete);
        assert!(r.line().contains("not reported"), "{}", r.line());
        let json = serde_json::to_value(&r).expect("JSON");
        assert!(json["cpu_us"]["hops_export"].is_null(), "{json}");
        assert!(json["processes_spans"].is_null(), "{json}");
    }

    #[test]
    fn no_traced_request_gives_no_rate() {
        let m = ObserverInputs {
            traced_requests: 0,
            ..inputs()
        };
        let r = ObserverReport::assess(&m, &variant(Some(1.0), Some(0.0)));
        assert_eq!(r.cpu_us_per_traced_request, None);
        assert_eq!(r.spans_per_traced_request, None);
        assert_eq!(r.share_of_cpu, None, "an empty window");
    }

    #[test]
    fn traces_off_cost_nothing_by_construction() {
        let r = ObserverReport::off();
        assert!(!r.traced);
        assert_eq!(r.cpu_us.total, 0.0);
        assert_eq!(r.share_of_cpu, Some(0.0));
        assert_eq!(r.cpu_us.hops_export, Some(0.0));
        assert_eq!(r.line(), "traces off: no observer cost");
        let back: ObserverReport =
            serde_json::from_value(serde_json::to_value(&r).expect("JSON")).expect("read back");
        assert_eq!(back, r);
    }
}
