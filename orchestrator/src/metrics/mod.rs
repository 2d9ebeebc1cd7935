//! Live Prometheus metrics of a run (`tailmesh run --metrics ADDR`,
//! `[telemetry] metrics`): the orchestrator serves `/metrics` over HTTP
//! while the run lasts, and `[telemetry] metrics_grace` after it, so the
//! last scrape sees the final counts. Every measured request feeds them
//! as it ends, from the record pipeline that feeds the analysis, the
//! `.hlog` and requests.csv, so the counts a scrape sees at the end are
//! those of summary.json.
//!
//! - `histogram`: a latency histogram with native and classic buckets.
//! - `expose`: the text and protobuf formats.
//! - `serve`: the HTTP listener on a thread of its own.

mod expose;
mod histogram;
mod serve;

use std::{
    collections::BTreeMap,
    sync::{Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use tailmesh_analysis::{facts::windowed_faults, record::RequestRecord};
use tailmesh_model::scenario::{Step, Variant, Window};

pub(crate) use serve::{MetricsError, MetricsServer};

use expose::{Family, Kind, Sample, Value};
use histogram::Histogram;

/// The run's metrics, fed by the record pipeline and read by scrapes.
#[derive(Debug)]
pub(crate) struct LiveMetrics {
    /// The `run` label: the run folder's name.
    run: String,
    state: Mutex<Vec<VariantLive>>,
}

/// One variant's metrics, cumulative from its start.
#[derive(Debug, Default)]
struct VariantLive {
    name: String,
    /// Measured requests sent.
    sent: u64,
    /// Measured requests ended ok.
    ok: u64,
    /// Measured requests ended otherwise, by outcome (`timeout`, or the
    /// gRPC code): named only for these, so an ok request costs no name.
    failed: BTreeMap<String, u64>,
    /// Ok requests, from their intended send time.
    latency: Histogram,
    /// How late each measured request was sent.
    lateness: Histogram,
    /// Each hop replica's time to answer (its downstream calls included),
    /// from ok requests' paths, in the order first seen: a few, found by
    /// a scan that copies no name.
    hops: Vec<(String, u32, Histogram)>,
    /// The fault windows, by their phases' labels.
    windows: Vec<(String, Window)>,
    /// The load steps (open loop), with the rate before them.
    steps: Vec<Step>,
    rate: Option<f64>,
    /// The processes as last sampled (every one running then).
    processes: Vec<tailmesh_analysis::record::ProcessSample>,
    /// The broker's topics as last sampled.
    queues: Vec<tailmesh_analysis::record::QueueSample>,
    /// The measured clock's 0 on the wall clock, once the load began.
    measuring_from: Option<SystemTime>,
    /// Whether its load is over.
    done: bool,
}

impl VariantLive {
    /// Measured requests ended, however.
    fn ended(&self) -> u64 {
        self.ok + self.failed.values().sum::<u64>()
    }
}

impl LiveMetrics {
    pub(crate) fn new(run: &str) -> Self {
        Self {
            run: run.to_owned(),
            state: Mutex::new(Vec::new()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Vec<VariantLive>) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn current<T>(&self, f: impl FnOnce(&mut VariantLive) -> T) -> Option<T> {
        self.with(|variants| variants.last_mut().map(f))
    }

    /// The records that follow are `variant`'s.
    pub(crate) fn begin_variant(&self, variant: &Variant) {
        let (rate, steps) = match &variant.load.mode {
            tailmesh_model::scenario::LoadMode::Open { rate, steps, .. } => {
                (Some(*rate), steps.clone())
            }
            tailmesh_model::scenario::LoadMode::Closed { .. } => (None, Vec::new()),
        };
        let live = VariantLive {
            name: variant.name.clone(),
            windows: windowed_faults(variant),
            steps,
            rate,
            ..Default::default()
        };
        self.with(|variants| variants.push(live));
    }

    /// The measured clock's 0, on the wall clock.
    pub(crate) fn measuring_from(&self, at: SystemTime) {
        self.current(|v| v.measuring_from = Some(at));
    }

    /// Measured requests sent so far.
    pub(crate) fn sent(&self, measured: u64) {
        self.current(|v| v.sent = v.sent.max(measured));
    }

    /// One measured request ended.
    pub(crate) fn record(&self, r: &RequestRecord) {
        self.current(|v| {
            v.lateness
                .observe(r.start.saturating_sub(r.intended).as_secs_f64());
            if !matches!(r.outcome, tailmesh_analysis::record::Outcome::Ok) {
                *v.failed.entry(r.outcome.label()).or_insert(0) += 1;
                return;
            }
            v.ok += 1;
            v.latency.observe(r.latency().as_secs_f64());
            for hop in &r.path {
                let seconds = Duration::from_nanos(hop.total_ns).as_secs_f64();
                match v
                    .hops
                    .iter_mut()
                    .find(|(name, replica, _)| *name == hop.hop && *replica == hop.replica)
                {
                    Some((_, _, h)) => h.observe(seconds),
                    None => {
                        let mut h = Histogram::default();
                        h.observe(seconds);
                        v.hops.push((hop.hop.clone(), hop.replica, h));
                    }
                }
            }
        });
    }

    /// The variant's processes, sampled.
    pub(crate) fn processes(&self, samples: &[tailmesh_analysis::record::ProcessSample]) {
        self.current(|v| v.processes = samples.to_vec());
    }

    /// The variant's broker topics, sampled.
    pub(crate) fn queues(&self, samples: &[tailmesh_analysis::record::QueueSample]) {
        self.current(|v| v.queues = samples.to_vec());
    }

    /// The variant's load is over: every request sent has ended.
    pub(crate) fn end_variant(&self) {
        self.current(|v| {
            v.done = true;
            v.sent = v.sent.max(v.ended());
        });
    }

    /// Every family as a scrape at `now` sees it.
    fn families(&self, now: SystemTime) -> Vec<Family> {
        let run = self.run.clone();
        self.with(|variants| families(&run, variants, now))
    }
}

fn families(run: &str, variants: &[VariantLive], now: SystemTime) -> Vec<Family> {
    let base = |v: &VariantLive| vec![("run", run.to_owned()), ("variant", v.name.clone())];
    let family = |name, help, kind, samples| Family {
        name,
        help,
        kind,
        samples,
    };
    let number = |labels, value: f64| Sample {
        labels,
        value: Value::Number(value),
    };
    let mut sent = Vec::new();
    let mut ended = Vec::new();
    let mut in_flight = Vec::new();
    let mut running = Vec::new();
    let mut latency = Vec::new();
    let mut lateness = Vec::new();
    let mut hops = Vec::new();
    let mut faults = Vec::new();
    let mut offered = Vec::new();
    let mut cpu = Vec::new();
    let mut memory = Vec::new();
    let mut depth = Vec::new();
    let mut held = Vec::new();
    for v in variants {
        for q in &v.queues {
            let mut labels = base(v);
            labels.push(("topic", q.topic.clone()));
            depth.push(number(labels.clone(), q.depth as f64));
            held.push(number(labels, q.in_flight as f64));
        }
        for p in &v.processes {
            let mut labels = base(v);
            labels.push(("process", p.process.clone()));
            cpu.push(number(labels.clone(), p.cpu_s));
            memory.push(number(labels, p.rss_bytes as f64));
        }
        let ended_total = v.ended();
        sent.push(number(base(v), v.sent as f64));
        let outcomes = (v.ok > 0).then_some(("ok", v.ok));
        for (outcome, n) in outcomes
            .into_iter()
            .chain(v.failed.iter().map(|(o, n)| (o.as_str(), *n)))
        {
            let mut labels = base(v);
            labels.push(("outcome", outcome.to_owned()));
            ended.push(number(labels, n as f64));
        }
        in_flight.push(number(base(v), v.sent.saturating_sub(ended_total) as f64));
        running.push(number(base(v), if v.done { 0.0 } else { 1.0 }));
        latency.push(Sample {
            labels: base(v),
            value: Value::Histogram(v.latency.clone()),
        });
        lateness.push(Sample {
            labels: base(v),
            value: Value::Histogram(v.lateness.clone()),
        });
        for (hop, replica, h) in &v.hops {
            let mut labels = base(v);
            labels.push(("hop", hop.clone()));
            labels.push(("replica", replica.to_string()));
            hops.push(Sample {
                labels,
                value: Value::Histogram(h.clone()),
            });
        }
        // Where the measured clock is now (before the load: nothing in
        // force yet; after it: nothing any more).
        let at = v
            .measuring_from
            .filter(|_| !v.done)
            .and_then(|from| now.duration_since(from).ok());
        for (label, w) in &v.windows {
            let on = at.is_some_and(|t| w.start <= t && w.duration.is_none_or(|d| t < w.start + d));
            let mut labels = base(v);
            labels.push(("fault", label.clone()));
            faults.push(number(labels, if on { 1.0 } else { 0.0 }));
        }
        if let Some(rate) = v.rate {
            let mut current = if v.done { 0.0 } else { rate };
            if let Some(t) = at {
                let mut start = Duration::ZERO;
                for step in &v.steps {
                    if start <= t {
                        current = step.rate;
                    }
                    start += step.duration;
                }
            }
            offered.push(number(base(v), current));
        }
    }
    vec![
        family(
            "tailmesh_requests_sent_total",
            "Measured requests sent (warmup excluded).",
            Kind::Counter,
            sent,
        ),
        family(
            "tailmesh_requests_total",
            "Measured requests ended, by outcome: ok, timeout, or the gRPC code.",
            Kind::Counter,
            ended,
        ),
        family(
            "tailmesh_requests_in_flight",
            "Measured requests sent and not ended yet.",
            Kind::Gauge,
            in_flight,
        ),
        family(
            "tailmesh_variant_running",
            "1 while the variant's load runs, 0 once it is over.",
            Kind::Gauge,
            running,
        ),
        family(
            "tailmesh_latency_seconds",
            "End-to-end latency of ok requests, from each one's intended send time.",
            Kind::Histogram,
            latency,
        ),
        family(
            "tailmesh_hop_seconds",
            "A hop replica's time to answer (its downstream calls included), from ok requests' paths.",
            Kind::Histogram,
            hops,
        ),
        family(
            "tailmesh_send_lateness_seconds",
            "How late the load generator sent each measured request after its intended time.",
            Kind::Histogram,
            lateness,
        ),
        family(
            "tailmesh_fault_in_force",
            "1 while a scheduled fault window is in force, by its phase label (slow b, net b/1, ...).",
            Kind::Gauge,
            faults,
        ),
        family(
            "tailmesh_process_cpu_seconds_total",
            "A process of the run (hop-b-1, broker): its user and system CPU time, sampled each second.",
            Kind::Counter,
            cpu,
        ),
        family(
            "tailmesh_process_resident_memory_bytes",
            "A process of the run: its resident memory (VmRSS), sampled each second.",
            Kind::Gauge,
            memory,
        ),
        family(
            "tailmesh_broker_queue_depth",
            "A broker topic (a pulled hop's queue): the tasks waiting in it, sampled each second.",
            Kind::Gauge,
            depth,
        ),
        family(
            "tailmesh_broker_in_flight",
            "A broker topic: the tasks its workers held, sampled each second.",
            Kind::Gauge,
            held,
        ),
        family(
            "tailmesh_offered_rate",
            "The open loop's requested rate now (its step's), requests per second; 0 once over.",
            Kind::Gauge,
            offered,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailmesh_analysis::record::{HopRecord, Outcome};

    fn record(id: u64, latency_ms: u64, outcome: Outcome) -> RequestRecord {
        let ok = matches!(outcome, Outcome::Ok);
        RequestRecord {
            id,
            intended: Duration::from_millis(id),
            start: Duration::from_millis(id),
            end: Duration::from_millis(id + latency_ms),
            outcome,
            path: if ok {
                vec![HopRecord {
                    hop: "a".to_owned(),
                    replica: 1,
                    total_ns: latency_ms * 1_000_000,
                    ..Default::default()
                }]
            } else {
                Vec::new()
            },
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    fn value<'a>(families: &'a [Family], name: &str, label: Option<(&str, &str)>) -> &'a Value {
        let f = families
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no {name}"));
        &f.samples
            .iter()
            .find(|s| label.is_none_or(|(k, v)| s.labels.iter().any(|(a, b)| *a == k && b == v)))
            .unwrap_or_else(|| panic!("no sample of {name} with {label:?}"))
            .value
    }

    #[test]
    fn processes_and_queues_show_their_last_samples() {
        use tailmesh_analysis::record::{ProcessSample, QueueSample};
        let scenario = crate::scenario::parse(
            "name = \"m\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"10s\"\n\
             [[hop]]\nname = \"a\"\ntransport = \"pull\"\n",
            "m.toml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let metrics = LiveMetrics::new("run-1");
        metrics.begin_variant(&scenario.variants[0]);
        let process = |t_s: f64, cpu_s: f64, rss_bytes: u64| ProcessSample {
            t_s,
            process: "hop-a-0".into(),
            pid: 7,
            cpu_s,
            rss_bytes,
        };
        metrics.processes(&[process(0.0, 0.5, 100)]);
        metrics.processes(&[process(1.0, 0.75, 300)]);
        let queue = |depth| QueueSample {
            t_s: 1.0,
            topic: "a".into(),
            depth,
            in_flight: 2,
        };
        metrics.queues(&[queue(9)]);
        metrics.queues(&[queue(4)]);
        let now = metrics.families(SystemTime::UNIX_EPOCH);
        let of = |name| value(&now, name, None).clone();
        assert_eq!(
            of("tailmesh_process_cpu_seconds_total"),
            Value::Number(0.75)
        );
        assert_eq!(
            of("tailmesh_process_resident_memory_bytes"),
            Value::Number(300.0)
        );
        assert_eq!(
            value(&now, "tailmesh_broker_queue_depth", Some(("topic", "a"))),
            &Value::Number(4.0)
        );
        assert_eq!(of("tailmesh_broker_in_flight"), Value::Number(2.0));
    }

    #[test]
    fn records_count_by_outcome_and_feed_the_histograms_and_windows_follow_the_clock() {
        let text = "name = \"m\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"10s\"\n\
                    [[hop]]\nname = \"a\"\nreplicas = 2\n\
                    slow = { probability = 0.5, extra = \"1ms\", start = \"2s\", duration = \"3s\" }\n";
        let scenario = crate::scenario::parse(text, "m.toml").unwrap_or_else(|e| panic!("{e}"));
        let metrics = LiveMetrics::new("run-1");
        metrics.begin_variant(&scenario.variants[0]);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        metrics.measuring_from(t0);
        metrics.sent(4);
        metrics.record(&record(1, 3, Outcome::Ok));
        metrics.record(&record(2, 5, Outcome::Ok));
        metrics.record(&record(3, 100, Outcome::Timeout));

        let at = |s: u64| metrics.families(t0 + Duration::from_secs(s));
        let during = at(3);
        assert_eq!(
            value(&during, "tailmesh_requests_total", Some(("outcome", "ok"))),
            &Value::Number(2.0)
        );
        assert_eq!(
            value(
                &during,
                "tailmesh_requests_total",
                Some(("outcome", "timeout"))
            ),
            &Value::Number(1.0)
        );
        assert_eq!(
            value(&during, "tailmesh_requests_in_flight", None),
            &Value::Number(1.0)
        );
        let Value::Histogram(latency) = value(&during, "tailmesh_latency_seconds", None) else {
            panic!("not a histogram");
        };
        assert_eq!(latency.count, 2, "only ok requests");
        assert!((latency.sum - 0.008).abs() < 1e-9, "{}", latency.sum);
        let Value::Histogram(hop) = value(&during, "tailmesh_hop_seconds", Some(("replica", "1")))
        else {
            panic!("not a histogram");
        };
        assert_eq!(hop.count, 2);
        assert_eq!(
            value(
                &during,
                "tailmesh_fault_in_force",
                Some(("fault", "slow a"))
            ),
            &Value::Number(1.0)
        );
        assert_eq!(
            value(&at(1), "tailmesh_fault_in_force", Some(("fault", "slow a"))),
            &Value::Number(0.0),
            "before the window"
        );
        assert_eq!(
            value(&at(5), "tailmesh_fault_in_force", Some(("fault", "slow a"))),
            &Value::Number(0.0),
            "the window ends at 5 s"
        );

        metrics.record(&record(4, 2, Outcome::Ok));
        metrics.end_variant();
        let end = at(3);
        assert_eq!(
            value(&end, "tailmesh_requests_in_flight", None),
            &Value::Number(0.0)
        );
        assert_eq!(
            value(&end, "tailmesh_variant_running", None),
            &Value::Number(0.0)
        );
        assert_eq!(
            value(&end, "tailmesh_fault_in_force", Some(("fault", "slow a"))),
            &Value::Number(0.0),
            "nothing in force once the load is over"
        );
    }
}
