//! A case's per-service metrics at 1 s, in the layout of RCAEval's
//! datasets (`metrics.csv`: a `time` column in Unix seconds, then
//! `<service>_<metric>` columns): CPU (cores) and resident memory (bytes)
//! of each hop's processes, latency p50 and p99 (ms, the hop's time with
//! its downstream calls, as the `.hlog` has it), workload (requests per
//! second) and error share; other processes (a broker) get CPU and memory
//! only. Built from the run's requests (by intended send time, as every
//! interval of a run) and its process samples. Pure: no I/O.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use tailmesh_analysis::record::{Outcome, RequestRecord};

pub use tailmesh_analysis::record::{ProcessSample, QueueSample};

/// One second of one hop.
#[derive(Clone, Debug)]
struct HopSecond {
    latency: Histogram<u64>,
    errors: u64,
}

/// The series being built.
pub struct SeriesAcc {
    hops: Vec<String>,
    seconds: Vec<Vec<HopSecond>>,
}

/// The finished series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Column groups: the hops, then other processes.
    pub hops: Vec<String>,
    pub others: Vec<String>,
    /// The broker's topics (`broker_queue-<topic>` columns).
    pub topics: Vec<String>,
    /// Per second: per hop `[p50_ms, p99_ms, workload, error]` (latency
    /// absent without requests), then CPU and memory per column group.
    pub rows: Vec<Row>,
}

/// One second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub hops: Vec<HopRow>,
    /// Per hop then per other process: cores and bytes, absent without two
    /// samples.
    pub cpu: Vec<Option<f64>>,
    pub mem: Vec<Option<f64>>,
    /// Per topic: its depth at its last sample in the second.
    pub queue: Vec<Option<f64>>,
}

/// One hop's second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HopRow {
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub workload: f64,
    pub error: f64,
}

impl SeriesAcc {
    pub fn new(hops: Vec<String>) -> SeriesAcc {
        SeriesAcc {
            hops,
            seconds: Vec::new(),
        }
    }

    fn second(&mut self, at: f64) -> Option<&mut Vec<HopSecond>> {
        // Negative (warmup) and NaN times have no second.
        if at.is_nan() || at < 0.0 {
            return None;
        }
        let i = at as usize;
        while self.seconds.len() <= i {
            let hist = Histogram::new_with_bounds(1, 3_600_000_000, 2).ok()?;
            self.seconds.push(
                self.hops
                    .iter()
                    .map(|_| HopSecond {
                        latency: hist.clone(),
                        errors: 0,
                    })
                    .collect(),
            );
        }
        self.seconds.get_mut(i)
    }

    /// Counts a request in the second of its intended send time.
    pub fn record(&mut self, r: &RequestRecord) {
        let at = r.intended.as_secs_f64();
        match &r.outcome {
            Outcome::Ok => {
                for h in &r.path {
                    let Some(i) = self.hops.iter().position(|x| *x == h.hop) else {
                        continue;
                    };
                    if let Some(second) = self.second(at) {
                        second[i]
                            .latency
                            .saturating_record((h.total_ns / 1_000).max(1));
                    }
                }
            }
            Outcome::Error { message, .. } => {
                let blamed = tailmesh_analysis::variant::blamed_hop(message)
                    .and_then(|b| self.hops.iter().position(|x| x == b));
                if let (Some(i), Some(second)) = (blamed, self.second(at)) {
                    second[i].errors += 1;
                }
            }
            Outcome::Timeout => {}
        }
    }

    /// The series over `seconds` whole seconds, with the processes'
    /// samples (`hop-<hop>-<replica>` processes count for their hop) and
    /// the broker's topics'.
    pub fn finish(
        mut self,
        seconds: usize,
        samples: &[ProcessSample],
        queues: &[QueueSample],
    ) -> Series {
        if seconds > 0 {
            let _ = self.second((seconds - 1) as f64);
        }
        self.seconds.truncate(seconds);
        let hops = self.hops;
        let group = |process: &str| -> String {
            hop_of(process, &hops).map_or_else(|| process.to_owned(), str::to_owned)
        };
        let mut others: Vec<String> = samples
            .iter()
            .map(|s| group(&s.process))
            .filter(|g| !hops.contains(g))
            .collect();
        others.sort();
        others.dedup();
        let groups: Vec<&String> = hops.iter().chain(&others).collect();
        // Per group and second: cores used and resident bytes, summed over
        // its processes, from each pair of a process's successive samples.
        let mut cpu: BTreeMap<(usize, usize), f64> = BTreeMap::new();
        // A process's memory in a second: its last sample there.
        let mut rss: BTreeMap<(usize, &str), (usize, u64)> = BTreeMap::new();
        let mut last: BTreeMap<&str, &ProcessSample> = BTreeMap::new();
        for s in samples {
            let Some(g) = groups.iter().position(|g| **g == group(&s.process)) else {
                continue;
            };
            if s.t_s < 0.0 {
                last.insert(&s.process, s);
                continue;
            }
            let second = s.t_s.ceil().max(1.0) as usize - 1;
            if let Some(prev) = last.insert(&s.process, s) {
                let dt = s.t_s - prev.t_s;
                if dt > 0.0 && s.cpu_s >= prev.cpu_s {
                    *cpu.entry((second, g)).or_default() += (s.cpu_s - prev.cpu_s) / dt;
                }
            }
            rss.insert((second, &s.process), (g, s.rss_bytes));
        }
        let mut mem: BTreeMap<(usize, usize), f64> = BTreeMap::new();
        for ((second, _), (g, bytes)) in rss {
            *mem.entry((second, g)).or_default() += bytes as f64;
        }
        let mut topics: Vec<String> = queues.iter().map(|q| q.topic.clone()).collect();
        topics.sort();
        topics.dedup();
        let mut depth: BTreeMap<(usize, usize), f64> = BTreeMap::new();
        for q in queues.iter().filter(|q| q.t_s >= 0.0) {
            if let Some(i) = topics.iter().position(|t| *t == q.topic) {
                let second = q.t_s.ceil().max(1.0) as usize - 1;
                depth.insert((second, i), q.depth as f64);
            }
        }
        let rows = self
            .seconds
            .iter()
            .enumerate()
            .map(|(t, second)| Row {
                hops: second
                    .iter()
                    .map(|h| {
                        let n = h.latency.len();
                        let quantile =
                            |q: f64| (n > 0).then(|| h.latency.value_at_quantile(q) as f64 / 1e3);
                        HopRow {
                            p50_ms: quantile(0.5),
                            p99_ms: quantile(0.99),
                            workload: (n + h.errors) as f64,
                            error: if n + h.errors == 0 {
                                0.0
                            } else {
                                h.errors as f64 / (n + h.errors) as f64
                            },
                        }
                    })
                    .collect(),
                cpu: (0..groups.len())
                    .map(|g| cpu.get(&(t, g)).copied())
                    .collect(),
                mem: (0..groups.len())
                    .map(|g| mem.get(&(t, g)).copied())
                    .collect(),
                queue: (0..topics.len())
                    .map(|i| depth.get(&(t, i)).copied())
                    .collect(),
            })
            .collect();
        Series {
            hops,
            others,
            topics,
            rows,
        }
    }
}

/// The hop a process `hop-<hop>-<replica>` serves.
pub fn hop_of<'a>(process: &str, hops: &'a [String]) -> Option<&'a str> {
    let rest = process.strip_prefix("hop-")?;
    let (name, replica) = rest.rsplit_once('-')?;
    replica.parse::<u32>().ok()?;
    hops.iter().find(|h| *h == name).map(String::as_str)
}

/// The metrics of each hop in `metrics.csv`, in their columns' order.
pub const HOP_METRICS: [&str; 6] = [
    "cpu",
    "mem",
    "latency-50",
    "latency-99",
    "workload",
    "error",
];

impl Series {
    /// `metrics.csv`: seconds from `origin_unix_s` (the end of warmup).
    pub fn csv(&self, origin_unix_s: f64) -> String {
        let mut out = String::from("time");
        for h in &self.hops {
            for m in HOP_METRICS {
                let _ = write!(out, ",{h}_{m}");
            }
        }
        for o in &self.others {
            let _ = write!(out, ",{o}_cpu,{o}_mem");
        }
        for t in &self.topics {
            let _ = write!(out, ",broker_queue-{t}");
        }
        out.push('\n');
        let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.6}"));
        for (t, row) in self.rows.iter().enumerate() {
            let _ = write!(out, "{:.3}", origin_unix_s + t as f64);
            for (i, h) in row.hops.iter().enumerate() {
                let _ = write!(
                    out,
                    ",{},{},{},{},{},{}",
                    cell(row.cpu[i]),
                    row.mem[i].map_or_else(String::new, |m| format!("{m:.0}")),
                    cell(h.p50_ms),
                    cell(h.p99_ms),
                    h.workload,
                    cell(Some(h.error)),
                );
            }
            for i in self.hops.len()..row.cpu.len() {
                let _ = write!(
                    out,
                    ",{},{}",
                    cell(row.cpu[i]),
                    row.mem[i].map_or_else(String::new, |m| format!("{m:.0}"))
                );
            }
            for q in &row.queue {
                let _ = write!(
                    out,
                    ",{}",
                    q.map_or_else(String::new, |d| format!("{d:.0}"))
                );
            }
            out.push('\n');
        }
        out
    }

    /// Each hop's mean p99 over the seconds in `[from, to)` that have one.
    pub fn mean_p99(&self, from: f64, to: f64) -> Vec<Option<f64>> {
        (0..self.hops.len())
            .map(|i| {
                let values: Vec<f64> = self
                    .rows
                    .iter()
                    .enumerate()
                    .filter(|(t, _)| (*t as f64) >= from && ((*t as f64) + 1.0) <= to)
                    .filter_map(|(_, r)| r.hops[i].p99_ms)
                    .collect();
                (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;
    use tailmesh_analysis::record::HopRecord;

    pub(crate) fn record(
        intended_ms: u64,
        outcome: Outcome,
        path: Vec<HopRecord>,
    ) -> RequestRecord {
        let intended = Duration::from_millis(intended_ms);
        RequestRecord {
            id: intended_ms,
            intended,
            start: intended,
            end: intended + Duration::from_millis(1),
            outcome,
            path,
            extra_attempts: 0,
            attempts: Vec::new(),
            stream: None,
        }
    }

    fn ok(intended_ms: u64, path: &[(&str, u64)]) -> RequestRecord {
        let path = path
            .iter()
            .map(|(hop, total_us)| HopRecord {
                hop: (*hop).to_owned(),
                total_ns: total_us * 1_000,
                ..HopRecord::default()
            })
            .collect();
        record(intended_ms, Outcome::Ok, path)
    }

    #[test]
    fn each_second_has_each_hops_latency_workload_errors_and_processes() {
        let hops = vec!["a".to_owned(), "b".to_owned()];
        let mut acc = SeriesAcc::new(hops);
        for i in 0..100 {
            acc.record(&ok(i * 10, &[("a", 2_000 + i), ("b", 1_000)]));
        }
        acc.record(&ok(1_500, &[("a", 30_000), ("b", 29_000)]));
        acc.record(&record(
            1_200,
            Outcome::Error {
                code: tailmesh_analysis::record::GrpcCode::Unavailable,
                message: "hop \"a\" replica 0 (x): injected error at hop \"b\" replica 0".into(),
            },
            Vec::new(),
        ));
        let samples = [
            ("hop-b-0", 0.0, 1.0, 100),
            ("hop-b-1", 0.0, 1.0, 100),
            ("hop-b-0", 1.0, 1.5, 200),
            ("hop-b-1", 1.0, 1.25, 300),
            ("broker", 0.0, 0.0, 7),
            ("broker", 1.0, 0.1, 9),
        ]
        .map(|(p, t, c, m)| ProcessSample {
            t_s: t,
            process: p.into(),
            pid: 1,
            cpu_s: c,
            rss_bytes: m,
        });
        let queues = [(0.0, 9), (1.0, 4), (2.0, 6)].map(|(t, depth)| QueueSample {
            t_s: t,
            topic: "b".into(),
            depth,
            in_flight: 1,
        });
        let series = acc.finish(3, &samples, &queues);
        assert_eq!(series.topics, vec!["b".to_owned()]);
        assert_eq!(series.rows[0].queue, vec![Some(4.0)]);
        assert_eq!(series.rows[1].queue, vec![Some(6.0)]);
        assert_eq!(series.rows[2].queue, vec![None]);
        assert_eq!(series.others, vec!["broker".to_owned()]);
        assert_eq!(series.rows.len(), 3);
        let first = &series.rows[0];
        assert_eq!(first.hops[0].workload, 100.0);
        assert!((first.hops[0].p50_ms.unwrap_or(0.0) - 2.05).abs() < 0.02);
        assert_eq!(first.cpu[1], Some(0.75));
        assert_eq!(first.mem[1], Some(500.0));
        assert_eq!(first.cpu[2], Some(0.1));
        assert_eq!(first.cpu[0], None);
        let second = &series.rows[1];
        assert_eq!(second.hops[1].workload, 2.0);
        assert_eq!(second.hops[1].error, 0.5);
        assert!(second.hops[0].p99_ms.unwrap_or(0.0) > 29.0);
        assert_eq!(series.rows[2].hops[0].p99_ms, None);
        let csv = series.csv(1_000.0);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some(
                "time,a_cpu,a_mem,a_latency-50,a_latency-99,a_workload,a_error,b_cpu,b_mem,\
                 b_latency-50,b_latency-99,b_workload,b_error,broker_cpu,broker_mem,broker_queue-b"
            )
        );
        assert!(lines.next().is_some_and(|l| l.starts_with("1000.000,,,")));
        assert_eq!(csv.lines().count(), 4);
        assert_eq!(series.mean_p99(0.0, 1.0)[1], first.hops[1].p99_ms);
    }

    #[test]
    fn a_process_serves_the_hop_its_name_says() {
        let hops = vec!["a-b".to_owned(), "a".to_owned()];
        assert_eq!(hop_of("hop-a-b-2", &hops), Some("a-b"));
        assert_eq!(hop_of("hop-a-0", &hops), Some("a"));
        assert_eq!(hop_of("hop-c-0", &hops), None);
        assert_eq!(hop_of("broker", &hops), None);
    }
}
