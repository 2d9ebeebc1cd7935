//! Builders for analysis and output tests: a three-hop chain and records
//! whose slow flags are laid out so the answers are known exactly.

use std::time::Duration;

use crate::record::HopRecord;
use tailmesh_model::{Balance, DurationDist, Slowness, Transport, Work};

use crate::attribution::CauseKind;
use crate::record::{Outcome, RequestRecord};
use tailmesh_model::scenario::{
    Arrivals, Check, ConnectionMode, Hop, Launcher, Load, LoadMode, Stop, Variant,
};

/// A hop with two push replicas and `slow` probability (if any).
pub fn hop(name: &str, slow: Option<f64>) -> Hop {
    Hop {
        name: name.to_string(),
        replicas: 2,
        concurrency: None,
        queue_limit: tailmesh_model::DEFAULT_QUEUE_LIMIT,
        discipline: Default::default(),
        transport: Transport::Push,
        worker_ping: None,
        balance: Balance::RoundRobin,
        connection: Default::default(),
        endpoints: Default::default(),
        work: Work::Sleep {
            dist: DurationDist::Fixed {
                value: Duration::from_millis(1),
            },
        },
        slow: slow.map(|probability| Slowness {
            probability,
            extra: DurationDist::Fixed {
                value: Duration::from_millis(20),
            },
            follow: None,
        }),
        replica_slow: None,
        net: None,
        replica_net: Vec::new(),
        error: None,
        windows: Default::default(),
        client: Default::default(),
        downstream: Vec::new(),
        calls: Default::default(),
        kill: None,
        service: None,
        streaming: Default::default(),
    }
}

/// Open loop at 400/s for 20 s over `hops`.
pub fn variant(name: &str, hops: Vec<Hop>) -> Variant {
    Variant {
        name: name.to_string(),
        overrides: vec![("hop.*.transport".to_string(), "\"push\"".to_string())],
        load: Load {
            mode: LoadMode::Open {
                rate: 400.0,
                arrivals: Arrivals::Poisson,
                steps: Vec::new(),
            },
            stop: Stop::Duration(Duration::from_secs(20)),
            warmup: Duration::from_secs(2),
            timeout: Duration::from_millis(100),
            connection: ConnectionMode::Shared { connections: 1 },
            payload_bytes: 64,
            generators: 1,
            net: None,
            generator_net: Vec::new(),
            streams: None,
            entries: Vec::new(),
        },
        hops,
        launcher: Launcher::Local,
        broker: tailmesh_model::BrokerKind::Tailmesh,
        queue_bounds: Default::default(),
        mesh: Default::default(),
        sweep: None,
    }
}

/// The chain a -> b -> c, each slow with probability 0.1.
pub fn chain3() -> Variant {
    variant(
        "base",
        vec![
            hop("a", Some(0.1)),
            hop("b", Some(0.1)),
            hop("c", Some(0.1)),
        ],
    )
}

/// Slow threshold 15 ms, compounding on, the default error share.
pub fn check() -> Check {
    Check {
        slow_threshold: Duration::from_millis(15),
        compounding: true,
        max_error_rate: tailmesh_model::scenario::DEFAULT_MAX_ERROR_RATE,
        distribution: false,
        distribution_tolerance: tailmesh_model::scenario::DEFAULT_DISTRIBUTION_TOLERANCE,
    }
}

/// One path record.
pub fn hop_record(hop: &str, replica: u32, service_us: u64, slow: bool) -> HopRecord {
    HopRecord {
        hop: hop.to_string(),
        replica,
        service_ns: service_us * 1_000,
        total_ns: service_us * 1_000 + 500,
        slow,
        queue_wait_ns: 0,
        parent: String::new(),
        transport: "push".to_string(),
        extra_attempts: 0,
        slot_wait_ns: 0,
        calls: Vec::new(),
        downstream_ns: 0,
    }
}

/// 1000 ok requests through a, b, c. Request i is slow at a when
/// `i % 10 == 0`, at b when `(i / 10) % 10 == 0`, at c when
/// `(i / 100) % 10 == 0`: every p_i is exactly 0.1 and exactly 271 requests
/// are slow somewhere, each taking 21 ms against 1 ms for the rest. Each
/// request is sent 100 µs late and lands on replica `i % 2`.
pub fn ok_records() -> Vec<RequestRecord> {
    (0..1000u64)
        .map(|i| {
            let flags = [i % 10 == 0, (i / 10) % 10 == 0, (i / 100) % 10 == 0];
            let path: Vec<HopRecord> = ["c", "b", "a"]
                .iter()
                .zip(flags.iter().rev())
                .map(|(name, &slow)| {
                    hop_record(name, (i % 2) as u32, if slow { 20_300 } else { 300 }, slow)
                })
                .collect();
            let latency = if flags.iter().any(|&s| s) {
                21_000
            } else {
                1_000
            };
            let intended = Duration::from_micros(i * 2_500);
            RequestRecord {
                id: i,
                intended,
                start: intended + Duration::from_micros(100),
                end: intended + Duration::from_micros(latency),
                outcome: Outcome::Ok,
                path,
                extra_attempts: 0,
                attempts: Vec::new(),
                stream: None,
            }
        })
        .collect()
}

/// A failed request (no path), `latency_us` after its intended time.
pub fn failed(id: u64, outcome: Outcome, latency_us: u64) -> RequestRecord {
    let intended = Duration::from_micros(id * 2_500);
    RequestRecord {
        id,
        intended,
        start: intended,
        end: intended + Duration::from_micros(latency_us),
        outcome,
        path: Vec::new(),
        extra_attempts: 0,
        attempts: Vec::new(),
        stream: None,
    }
}

/// [`ok_records`] plus 5 timeouts at 100 ms, 3 `unavailable` errors naming
/// hop "b" and 2 `resource_exhausted` errors: 1010 records.
pub fn mixed_records() -> Vec<RequestRecord> {
    let mut records = ok_records();
    for id in 1000..1005 {
        records.push(failed(id, Outcome::Timeout, 100_000));
    }
    for id in 1005..1008 {
        let outcome = Outcome::Error {
            code: crate::record::GrpcCode::Unavailable,
            message: format!("hop \"b\" replica 1: connect 127.0.0.1:{id}: connection refused"),
        };
        records.push(failed(id, outcome, 2_000));
    }
    for id in 1008..1010 {
        let outcome = Outcome::Error {
            code: crate::record::GrpcCode::ResourceExhausted,
            message: "broker topic \"c\" full".to_string(),
        };
        records.push(failed(id, outcome, 500));
    }
    records
}

/// One variant's report from `records`, fed one at a time, with the
/// measured phase `measured` long and nothing else known.
pub fn analyze_variant(
    variant: &Variant,
    check: &Check,
    records: &[RequestRecord],
    measured: Duration,
) -> crate::VariantReport {
    let mut acc = crate::VariantAccumulator::new(
        variant,
        check,
        tailmesh_model::scenario::DEFAULT_REPORT_INTERVAL,
    );
    for r in records {
        acc.record(r);
    }
    acc.finish(crate::VariantContext {
        measured,
        ..Default::default()
    })
    .report
}

/// A one-variant summary of [`mixed_records`] on [`chain3`], started at the
/// Unix epoch, with `files` naming requests.csv.
pub fn summary() -> crate::Summary {
    use crate::{
        Summary,
        summary::{Environment, ScenarioEcho},
    };
    let variant = chain3();
    let scenario = tailmesh_model::scenario::Scenario {
        name: "chain3".into(),
        description: "three hops, 10 % slow each".into(),
        seed: 7,
        variants: vec![variant.clone()],
        check: check(),
        report: tailmesh_model::scenario::Report::default(),
        sweep: None,
        telemetry: tailmesh_model::scenario::Telemetry::default(),
    };
    let echo = ScenarioEcho::new(
        &scenario,
        std::path::Path::new("scenarios/chain3.toml"),
        "name = \"chain3\"\n",
    );
    let report = analyze_variant(&variant, &check(), &mixed_records(), Duration::from_secs(2));
    let mut s = Summary::new(
        "run-1",
        time::OffsetDateTime::UNIX_EPOCH,
        echo,
        Environment {
            tailmesh_version: env!("CARGO_PKG_VERSION").to_string(),
            os: "linux".to_string(),
            arch: "x86_64".to_string(),
            kernel: Some("6.1.0".to_string()),
            cpus: 2,
            hostname: Some("testhost".to_string()),
            launcher: "local".to_string(),
        },
        vec![report],
    );
    s.files.insert("requests".into(), "requests.csv".into());
    s
}

/// Nanoseconds in a millisecond.
pub const MS: u64 = 1_000_000;

/// A path record: hop, its caller, transport, service / total / queue
/// wait in ms, injected.
pub fn rec(hop: &str, parent: &str, transport: &str, times: [u64; 3], slow: bool) -> HopRecord {
    HopRecord {
        hop: hop.into(),
        parent: parent.into(),
        transport: transport.into(),
        service_ns: times[0] * MS / 10,
        total_ns: times[1] * MS / 10,
        queue_wait_ns: times[2] * MS / 10,
        slow,
        ..HopRecord::default()
    }
}

/// A request sent `late` tenths of a ms after its intended time, taking
/// `client` tenths of a ms, with `path`.
pub fn request(late: u64, client: u64, path: Vec<HopRecord>) -> RequestRecord {
    RequestRecord {
        id: 1,
        intended: Duration::ZERO,
        start: Duration::from_micros(late * 100),
        end: Duration::from_micros((late + client) * 100),
        outcome: Outcome::Ok,
        path,
        extra_attempts: 0,
        attempts: Vec::new(),
        stream: None,
    }
}

/// The slow threshold of the attribution tests.
pub const T: Duration = Duration::from_millis(15);

/// 1000 requests through a -> b: `injected` slow from injection at a,
/// `extra` slow from `cause` (a path built to make it primary), the rest
/// fast.
pub fn variant_records(injected: u64, extra: u64, cause: CauseKind) -> Vec<RequestRecord> {
    (0..1000u64)
        .map(|i| {
            let (late, a_total, b) = if i < injected {
                (0, 210, rec("b", "a", "push", [2, 3, 0], false))
            } else if i < injected + extra {
                match cause {
                    CauseKind::Queue => (0, 185, rec("b", "a", "push", [2, 182, 180], false)),
                    CauseKind::Generator => (180, 10, rec("b", "a", "push", [2, 3, 0], false)),
                    CauseKind::Network => (0, 185, rec("b", "a", "push", [2, 3, 0], false)),
                    _ => (0, 170, rec("b", "a", "push", [2, 3, 0], false)),
                }
            } else {
                (0, 10, rec("b", "a", "push", [2, 3, 0], false))
            };
            let a_service = if i < injected { 205 } else { 2 };
            let a = rec("a", "", "push", [a_service, a_total, 0], i < injected);
            let mut r = request(late, a_total + 1, vec![b, a]);
            r.id = i;
            r
        })
        .collect()
}

/// Request `id`, meant for `intended_ms` and sent then, ending as
/// `outcome` `after_ms` later, with no path.
pub fn at(id: u64, intended_ms: u64, after_ms: u64, outcome: Outcome) -> RequestRecord {
    let intended = Duration::from_millis(intended_ms);
    RequestRecord {
        id,
        intended,
        start: intended,
        end: intended + Duration::from_millis(after_ms),
        outcome,
        path: Vec::new(),
        extra_attempts: 0,
        attempts: Vec::new(),
        stream: None,
    }
}

/// Replica 1 of hop b killed at 1 s (1.001 s) and back at 2 s (serving at
/// 2.02 s); `picks` are each caller's calls sent to it while it was down.
pub fn kill_of_b1(picks: &[(&str, u64)]) -> crate::KillRecord {
    crate::KillRecord {
        hop: "b".into(),
        replica: 1,
        at_s: 1.0,
        back_s: Some(2.0),
        killed_at_s: Some(1.001),
        restarted_at_s: Some(2.02),
        picks_while_down: picks
            .iter()
            .map(|&(caller, picks)| crate::CallerPicks {
                caller: caller.into(),
                picks,
            })
            .collect(),
    }
}

/// [`summary`] swept over `load.concurrency` = `values` for each declared
/// variant of `groups`: the variant of the g-th group at the k-th value
/// answered 100 requests in 100 µs x 10^(g + k) each (its p50; its p99
/// is twice that), so each group is ten times slower than the one before
/// it at every value.
pub fn swept_summary(groups: &[&str], values: &[&str]) -> crate::Summary {
    use crate::{SweepSummary, sweep::SweepRow};
    let mut s = summary();
    let base = s.variants.remove(0);
    let mut rows = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for (k, value) in values.iter().enumerate() {
            let us = 100 * 10u64.pow((g + k) as u32);
            let mut v = base.clone();
            v.name = format!("{group}-concurrency-{value}");
            v.latency_histogram = crate::stats::new_histogram();
            for _ in 0..100 {
                crate::stats::record_us(&mut v.latency_histogram, us);
            }
            rows.push(SweepRow {
                group: (*group).to_owned(),
                value: (*value).to_owned(),
                variant: v.name.clone(),
                sent: 100,
                ok: 100,
                ok_rate: 100.0,
                error_share: 0.0,
                p50_us: us,
                p99_us: 2 * us,
                p99_9_us: 2 * us,
                compounding: None,
            });
            s.variants.push(v);
        }
    }
    s.sweep = Some(SweepSummary {
        key: "load.concurrency".into(),
        values: values.iter().map(|v| (*v).to_owned()).collect(),
        rows,
    });
    s
}
