//! Tests of `parse` and `load` on inline scenario files.

use std::time::Duration;

use tailmesh_services::discipline::Discipline;
use tailmesh_services::model::{
    Balance, Connection, DurationDist, ErrorInjection, ReplicaSlow, Slowness, Transport, Work,
};

use super::*;

/// `(line, column, message)` of every problem, in the order reported.
fn problems(source: &str) -> Vec<(usize, usize, String)> {
    match parse(source, "t.toml") {
        Ok(s) => panic!("expected problems, parsed {s:#?}"),
        Err(e) => e
            .errors
            .into_iter()
            .map(|e| (e.line, e.column, e.message))
            .collect(),
    }
}

fn ok(source: &str) -> Scenario {
    match parse(source, "t.toml") {
        Ok(s) => s,
        Err(e) => panic!("unexpected problems:\n{e}"),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A valid head for tests that are about hops or variants.
const HEAD: &str = "name = \"t\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 100\n";

/// A hop with every default.
fn plain(name: &str, downstream: &[&str]) -> Hop {
    Hop {
        name: name.to_owned(),
        replicas: 1,
        concurrency: None,
        queue_limit: tailmesh_services::limits::DEFAULT_QUEUE_LIMIT,
        discipline: Discipline::Fifo,
        transport: Transport::Push,
        worker_ping: None,
        balance: Balance::RoundRobin,
        connection: Default::default(),
        endpoints: Default::default(),
        work: Work::None,
        slow: None,
        replica_slow: None,
        net: None,
        replica_net: Vec::new(),
        error: None,
        windows: Default::default(),
        client: Default::default(),
        downstream: downstream.iter().map(|s| (*s).to_owned()).collect(),
        calls: tailmesh_model::calls::Calls::all_once(downstream.iter().copied()),
        kill: None,
        service: None,
        streaming: Default::default(),
    }
}

const FULL: &str = r#"
name = "slow-replica"
description = "three hops, one slow replica"
seed = 7
launcher = "auto"

[load]
mode = "open"
rate = 400.5
arrivals = "uniform"
duration = "20s"
warmup = "2s"
timeout = "250ms"
connection = "shared"
connections = 4
payload = 128

[[hop]]
name = "frontend"
replicas = 2
transport = "push"
balance = "p2c"
work = { kind = "sleep", dist = "exp", mean = "1ms" }
slow = { probability = 0.1, extra = "20ms" }
downstream = ["backend", "cache"]

[[hop]]
name = "backend"
replicas = 3
concurrency = 4
transport = "pull"
balance = "random"
work = { kind = "cpu", min_rounds = 10, max_rounds = 20, block = 4096 }
replica_slow = { replica = 2, factor = 10 }
error = { probability = 0.01, code = "unavailable" }
downstream = []

[[hop]]
name = "cache"
work = { kind = "sleep", dist = "lognormal", mean = "500us", sigma = 0.5 }
slow = { probability = 0.05, extra = { dist = "uniform", min = "1ms", max = "1.5s" } }
error = { probability = 0.5, code = 13 }

[check]
slow_threshold = "15ms"
compounding = true
max_error_rate = 0.6
distribution = true
distribution_tolerance = 0.05

[report]
histogram = true
interval = "500ms"

[telemetry]
sampling = 0.5
forward = "http://127.0.0.1:4317"
keep_retried = false
keep_share = 0.25
"#;

#[test]
fn full_scenario_parses_into_the_exact_model() {
    let expected = Scenario {
        name: "slow-replica".to_owned(),
        description: "three hops, one slow replica".to_owned(),
        seed: 7,
        variants: vec![Variant {
            name: "base".to_owned(),
            overrides: Vec::new(),
            load: Load {
                mode: LoadMode::Open {
                    rate: 400.5,
                    arrivals: Arrivals::Uniform,
                    steps: Vec::new(),
                },
                stop: Stop::Duration(Duration::from_secs(20)),
                warmup: Duration::from_secs(2),
                timeout: ms(250),
                connection: ConnectionMode::Shared { connections: 4 },
                payload_bytes: 128,
                generators: 1,
                net: None,
                generator_net: Vec::new(),
                streams: None,
                entries: Vec::new(),
            },
            hops: vec![
                Hop {
                    name: "frontend".to_owned(),
                    replicas: 2,
                    concurrency: None,
                    queue_limit: tailmesh_services::limits::DEFAULT_QUEUE_LIMIT,
                    discipline: Discipline::Fifo,
                    transport: Transport::Push,
                    worker_ping: None,
                    balance: Balance::P2c,
                    connection: Default::default(),
                    endpoints: Default::default(),
                    work: Work::Sleep {
                        dist: DurationDist::Exp { mean: ms(1) },
                    },
                    slow: Some(Slowness {
                        probability: 0.1,
                        extra: DurationDist::Fixed { value: ms(20) },
                        follow: None,
                    }),
                    replica_slow: None,
                    net: None,
                    replica_net: Vec::new(),
                    error: None,
                    windows: Default::default(),
                    client: Default::default(),
                    downstream: vec!["backend".to_owned(), "cache".to_owned()],
                    calls: tailmesh_model::calls::Calls::all_once(vec![
                        "backend".to_owned(),
                        "cache".to_owned(),
                    ]),
                    kill: None,
                    service: None,
                    streaming: Default::default(),
                },
                Hop {
                    name: "backend".to_owned(),
                    replicas: 3,
                    concurrency: Some(4),
                    queue_limit: tailmesh_services::limits::DEFAULT_QUEUE_LIMIT,
                    discipline: Discipline::Fifo,
                    transport: Transport::Pull,
                    worker_ping: None,
                    balance: Balance::Random,
                    connection: Default::default(),
                    endpoints: Default::default(),
                    work: Work::Cpu {
                        min_rounds: 10,
                        max_rounds: 20,
                        block_bytes: 4096,
                    },
                    slow: None,
                    replica_slow: Some(ReplicaSlow {
                        replica: 2,
                        factor: 10.0,
                    }),
                    net: None,
                    replica_net: Vec::new(),
                    error: Some(ErrorInjection {
                        probability: 0.01,
                        code: 14,
                    }),
                    windows: Default::default(),
                    client: Default::default(),
                    downstream: Vec::new(),
                    calls: Default::default(),
                    kill: None,
                    service: None,
                    streaming: Default::default(),
                },
                Hop {
                    name: "cache".to_owned(),
                    replicas: 1,
                    concurrency: None,
                    queue_limit: tailmesh_services::limits::DEFAULT_QUEUE_LIMIT,
                    discipline: Discipline::Fifo,
                    transport: Transport::Push,
                    worker_ping: None,
                    balance: Balance::RoundRobin,
                    connection: Default::default(),
                    endpoints: Default::default(),
                    work: Work::Sleep {
                        dist: DurationDist::Lognormal {
                            mean: Duration::from_micros(500),
                            sigma: 0.5,
                        },
                    },
                    slow: Some(Slowness {
                        probability: 0.05,
                        extra: DurationDist::Uniform {
                            min: ms(1),
                            max: ms(1500),
                        },
                        follow: None,
                    }),
                    replica_slow: None,
                    net: None,
                    replica_net: Vec::new(),
                    error: Some(ErrorInjection {
                        probability: 0.5,
                        code: 13,
                    }),
                    windows: Default::default(),
                    client: Default::default(),
                    downstream: Vec::new(),
                    calls: Default::default(),
                    kill: None,
                    service: None,
                    streaming: Default::default(),
                },
            ],
            launcher: Launcher::Auto,
            broker: tailmesh_services::model::BrokerKind::Tailmesh,
            queue_bounds: tailmesh_services::model::QueueBounds::default(),
            mesh: Default::default(),
            sweep: None,
        }],
        check: Check {
            slow_threshold: ms(15),
            compounding: true,
            max_error_rate: 0.6,
            distribution: true,
            distribution_tolerance: 0.05,
        },
        report: Report {
            histogram: true,
            interval: ms(500),
        },
        sweep: None,
        telemetry: Telemetry {
            hold_spans: tailmesh_model::scenario::DEFAULT_HOLD_SPANS,
            metrics: None,
            metrics_grace: tailmesh_model::scenario::DEFAULT_METRICS_GRACE,
            sampling: 0.5,
            forward: Some("http://127.0.0.1:4317".to_owned()),
            keep: Keep {
                slow: true,
                slow_percentile: None,
                failed: true,
                retried: false,
                share: KeepShare::Fixed(0.25),
            },
        },
    };
    assert_eq!(ok(FULL), expected);
}

#[test]
fn every_problem_is_reported_with_its_place_in_source_order() {
    let source = r#"name = "demo"
seed = 7

[load]
mode = "open"
rat = 400
rate = "fast"
duration = "-3s"

[[hop]]
name = "a"
replicas = "two"
downstream = ["b", "zz"]

[[hop]]
name = "b"
replicas = 0
slow = { probability = 1.5, extra = "20ms" }
downstream = ["c"]

[[hop]]
name = "c"
downstream = ["b"]
"#;
    let load_keys = "mode, rate, arrivals, concurrency, duration, requests, warmup, timeout, \
                     connection, connections, payload, steps, entries, generators, net, \
                     generator_net, streams";
    assert_eq!(
        problems(source),
        vec![
            (
                6,
                1,
                format!("unknown key \"rat\" in [load] (expected one of: {load_keys})")
            ),
            (
                7,
                8,
                "expected a number for load.rate, got a string".to_owned()
            ),
            (
                8,
                12,
                "negative duration \"-3s\" for load.duration".to_owned()
            ),
            (
                12,
                12,
                "hop \"a\": expected an integer for replicas, got a string".to_owned()
            ),
            (
                13,
                20,
                "downstream \"zz\" of hop \"a\" does not exist".to_owned()
            ),
            (
                17,
                12,
                "hop \"b\": replicas must be between 1 and 64, got 0".to_owned()
            ),
            (
                18,
                24,
                "hop \"b\": slow.probability must be between 0 and 1, got 1.5".to_owned()
            ),
            (
                23,
                15,
                "downstream cycle: \"b\" -> \"c\" -> \"b\"".to_owned()
            ),
        ]
    );
    // The display form is one "origin:line:col: message" per line.
    let Err(errors) = parse(source, "dir/demo.toml") else {
        panic!("expected problems");
    };
    let text = errors.to_string();
    assert_eq!(text.lines().count(), 8);
    assert!(text.starts_with("dir/demo.toml:6:1: unknown key \"rat\""));
}

#[test]
fn more_hops_than_the_limit_is_an_error_at_the_first_too_many() {
    let mut source = HEAD.to_owned();
    for i in 0..MAX_HOPS + 6 {
        source.push_str(&format!("[[hop]]\nname = \"h{i}\"\n"));
    }
    let header = source
        .match_indices("[[hop]]")
        .nth(MAX_HOPS)
        .map(|(at, _)| at);
    let line = source[..header.unwrap_or(0)].lines().count() + 1;
    assert_eq!(
        problems(&source),
        vec![(
            line,
            1,
            format!(
                "too many hops: {} (at most 256); this is hop number 257",
                MAX_HOPS + 6
            )
        )]
    );
    // The limit itself is fine.
    let mut source = HEAD.to_owned();
    for i in 0..MAX_HOPS {
        source.push_str(&format!("[[hop]]\nname = \"h{i}\"\n"));
    }
    assert_eq!(ok(&source).variants[0].hops.len(), MAX_HOPS);
}

#[test]
fn duplicate_hop_names_are_reported_at_the_second() {
    let source = format!("{HEAD}[[hop]]\nname = \"a\"\n[[hop]]\nname = \"a\"\n");
    assert_eq!(
        problems(&source),
        vec![(
            8,
            1,
            "duplicate hop name \"a\" (also used by the hop at index 0)".to_owned()
        )]
    );
}

#[test]
fn syntax_error_is_located() {
    let source = "name = \"d\"\n[load]\nrate = = 5\n";
    let found = problems(source);
    assert_eq!(found.len(), 1);
    let (line, column, message) = &found[0];
    assert_eq!((*line, *column), (3, 8));
    assert!(message.starts_with("TOML syntax error: "), "{message}");
}

#[test]
fn missing_required_keys_are_located_at_their_table() {
    let source = r#"description = 3

[load]
mode = "closed"

[[hop]]
replicas = 2
work = { kind = "cpu", min_rounds = 5 }
[[hop]]
name = "x"
work = { kind = "sleep", dist = "uniform", min = "5ms", mean = "1ms" }
error = { code = "ok" }
replica_slow = { replica = 1, factor = 0.5 }
[check]
compounding = true
"#;
    let found = problems(source);
    let summary: Vec<(usize, usize, &str)> =
        found.iter().map(|(l, c, m)| (*l, *c, m.as_str())).collect();
    assert_eq!(
        summary[..8],
        [
            (1, 1, "missing required key \"name\" in the top level"),
            (1, 15, "expected a string for description, got an integer"),
            (3, 1, "missing required key \"concurrency\" in [load]"),
            (
                3,
                1,
                "[load] needs exactly one of \"duration\" or \"requests\""
            ),
            (6, 1, "missing required key \"name\" in [[hop]] at index 0"),
            (
                8,
                8,
                "missing required key \"max_rounds\" in work of hop at index 0"
            ),
            (11, 8, "missing required key \"max\" in work of hop \"x\""),
            (
                11,
                57,
                "hop \"x\": work.mean is not used by dist = \"uniform\""
            ),
        ]
    );
    assert_eq!(
        summary[8],
        (
            12,
            9,
            "missing required key \"probability\" in error of hop \"x\""
        )
    );
    assert_eq!(summary[9].0..=summary[9].1, 12..=18);
    assert!(summary[9].2.contains("got \"ok\""), "{}", summary[9].2);
    assert_eq!(
        summary[10..],
        [
            (
                13,
                28,
                "hop \"x\": replica_slow.replica must be less than replicas (1), got 1 \
                 (replicas are numbered from 0)"
            ),
            (
                13,
                40,
                "hop \"x\": replica_slow.factor must be between 1 and 1000, got 0.5"
            ),
            (
                15,
                1,
                "check.compounding = true needs check.slow_threshold: a slow request must be \
                 defined to count them"
            ),
        ]
    );
}

#[test]
fn no_load_and_no_hops_are_missing_at_the_top() {
    assert_eq!(
        problems("name = \"x\"\n"),
        vec![
            (
                1,
                1,
                "missing required key \"load\" in the top level".to_owned()
            ),
            (
                1,
                1,
                "missing [[hop]]: a scenario needs at least one hop".to_owned()
            ),
        ]
    );
}

#[test]
fn defaults_fill_in_a_minimal_scenario() {
    let source =
        format!("{HEAD}[[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\n[[hop]]\nname = \"c\"\n");
    let expected = Scenario {
        name: "t".to_owned(),
        description: String::new(),
        seed: 1,
        variants: vec![Variant {
            name: "base".to_owned(),
            overrides: Vec::new(),
            load: Load {
                mode: LoadMode::Open {
                    rate: 10.0,
                    arrivals: Arrivals::Poisson,
                    steps: Vec::new(),
                },
                stop: Stop::Requests(100),
                warmup: Duration::ZERO,
                timeout: Duration::from_secs(1),
                connection: ConnectionMode::Shared { connections: 1 },
                payload_bytes: 64,
                generators: 1,
                net: None,
                generator_net: Vec::new(),
                streams: None,
                entries: Vec::new(),
            },
            // A chain in file order; the last hop is a leaf.
            hops: vec![plain("a", &["b"]), plain("b", &["c"]), plain("c", &[])],
            launcher: Launcher::Local,
            broker: tailmesh_services::model::BrokerKind::Tailmesh,
            queue_bounds: tailmesh_services::model::QueueBounds::default(),
            mesh: Default::default(),
            sweep: None,
        }],
        check: Check {
            slow_threshold: Duration::from_secs(1),
            compounding: false,
            max_error_rate: DEFAULT_MAX_ERROR_RATE,
            distribution: false,
            distribution_tolerance: crate::scenario::DEFAULT_DISTRIBUTION_TOLERANCE,
        },
        report: Report::default(),
        sweep: None,
        telemetry: Telemetry::default(),
    };
    assert_eq!(ok(&source), expected);
}

#[test]
fn closed_loop_and_per_request_connections() {
    let source = r#"name = "c"
[load]
mode = "closed"
concurrency = 8
requests = 5
connection = "per_request"
[[hop]]
name = "a"
work = { kind = "cpu", rounds = 7 }
slow = { probability = 1, extra = { value = "2m" } }
[check]
slow_threshold = "1.5s"
"#;
    let s = ok(source);
    let v = &s.variants[0];
    assert_eq!(v.load.mode, LoadMode::Closed { concurrency: 8 });
    assert_eq!(v.load.connection, ConnectionMode::PerRequest);
    assert_eq!(
        v.hops[0].work,
        Work::Cpu {
            min_rounds: 7,
            max_rounds: 7,
            block_bytes: 102_400
        }
    );
    assert_eq!(
        v.hops[0].slow,
        Some(Slowness {
            probability: 1.0,
            extra: DurationDist::Fixed {
                value: Duration::from_secs(120)
            },
            follow: None,
        })
    );
    assert_eq!(s.check.slow_threshold, ms(1500));
    assert!(!s.check.compounding);
}

#[test]
fn mode_specific_and_exclusive_load_keys() {
    let source = r#"name = "c"
[load]
mode = "closed"
rate = 5
concurrency = 0
duration = 20
requests = 10
connection = "per_request"
connections = 2
[[hop]]
name = "a"
"#;
    assert_eq!(
        problems(source),
        vec![
            (4, 1, "load.rate is only for mode = \"open\"".to_owned()),
            (
                5,
                15,
                "load.concurrency must be between 1 and 10000, got 0".to_owned()
            ),
            (
                7,
                1,
                "load.duration and load.requests exclude each other: give exactly one".to_owned()
            ),
            (
                9,
                1,
                "load.connections is only for connection = \"shared\" (per_request opens one per \
                 request)"
                    .to_owned()
            ),
        ]
    );
    // A number where a duration is expected says what a duration looks like.
    let source = format!("{HEAD}warmup = 20\ntimeout = \"0s\"\n[[hop]]\nname = \"a\"\n");
    assert_eq!(
        problems(&source),
        vec![
            (
                6,
                10,
                "expected a duration string such as \"20ms\" for load.warmup, got an integer"
                    .to_owned()
            ),
            (7, 11, "load.timeout must be greater than 0".to_owned()),
        ]
    );
}

#[test]
fn self_calls_and_unreachable_hops() {
    let source = format!(
        "{HEAD}[[hop]]\nname = \"a\"\ndownstream = [\"c\"]\n[[hop]]\nname = \"b\"\n\
         [[hop]]\nname = \"c\"\n"
    );
    assert_eq!(
        problems(&source),
        vec![(
            9,
            1,
            "hop \"b\" is never called: it is not reachable from the entry hop \"a\"".to_owned()
        )]
    );
    let source = format!("{HEAD}[[hop]]\nname = \"a\"\ndownstream = [\"a\"]\n");
    assert_eq!(
        problems(&source),
        vec![(8, 15, "hop \"a\" lists itself in downstream".to_owned())]
    );
}

#[test]
fn names_must_be_dns_labels() {
    let source = "name = \"Demo\"\n[load]\nmode = \"open\"\nrate = 1\nrequests = 1\n\
                  [[hop]]\nname = \"-a\"\n";
    let found = problems(source);
    assert_eq!(found.len(), 2);
    assert_eq!((found[0].0, found[0].1), (1, 8));
    assert!(found[0].2.starts_with("name \"Demo\" is not a DNS label"));
    assert_eq!((found[1].0, found[1].1), (7, 8));
    assert!(found[1].2.starts_with("hop name \"-a\" is not a DNS label"));
}

const MESH: &str = r#"name = "v"
[load]
mode = "open"
rate = 100
arrivals = "uniform"
requests = 1000

[[hop]]
name = "front"

[[hop]]
name = "backend"
slow = { probability = 0.1, extra = "5ms" }

[[hop]]
name = "db"
"#;

#[test]
fn slow_follow_is_a_probability_and_variants_set_it() {
    let source = format!(
        "{HEAD}[[hop]]\nname = \"a\"\nslow = {{ probability = 0.01, extra = \"50ms\" }}\n\
         downstream = [\"b\"]\n\
         [[hop]]\nname = \"b\"\nslow = {{ probability = 0.01, extra = \"50ms\", follow = 0.9 }}\n\
         [[variant]]\nname = \"plain\"\n\
         [[variant]]\nname = \"tighter\"\nset = {{ \"hop.b.slow.follow\" = 0.5, \"hop.a.slow.follow\" = 1 }}\n"
    );
    let s = ok(&source);
    let follows = |v: usize| -> Vec<Option<f64>> {
        s.variants[v]
            .hops
            .iter()
            .map(|h| h.slow.as_ref().and_then(|s| s.follow))
            .collect()
    };
    assert_eq!(follows(0), [None, Some(0.9)]);
    assert_eq!(follows(1), [Some(1.0), Some(0.5)]);
    assert_eq!(
        s.variants[1].hops[1].slow.as_ref().map(|s| s.probability),
        Some(0.01),
        "follow leaves the probability as it was"
    );

    let bad = format!(
        "{HEAD}[[hop]]\nname = \"b\"\nslow = {{ probability = 0.01, extra = \"50ms\", follow = 1.5 }}\n"
    );
    let found = problems(&bad);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].2,
        "hop \"b\": slow.follow must be between 0 and 1, got 1.5"
    );
    let swept = format!(
        "{HEAD}[[hop]]\nname = \"b\"\nslow = {{ probability = 0.01, extra = \"50ms\" }}\n\
         [[variant]]\nname = \"v\"\nset = {{ \"hop.b.slow.follow\" = -0.1 }}\n"
    );
    assert!(
        problems(&swept)
            .iter()
            .any(|(_, _, m)| m.contains("slow.follow must be between 0 and 1, got -0.1")),
        "{:?}",
        problems(&swept)
    );
}

#[test]
fn variants_override_by_star_name_and_index_and_unset() {
    let source = format!(
        r#"{MESH}
[[variant]]
name = "push"

[[variant]]
name = "pull"
set = {{ "hop.*.transport" = "pull" }}

[[variant]]
name = "picked"
set = {{ "hop.backend.slow.probability" = 0.2, "hop.2.replicas" = 3, "hop.0.work" = {{ kind = "cpu", rounds = 5 }} }}

[[variant]]
name = "closed"
set = {{ "load.mode" = "closed", "load.concurrency" = 4 }}
unset = ["load.rate", "load.arrivals", "hop.backend.slow"]
"#
    );
    let s = ok(&source);
    let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["push", "pull", "picked", "closed"]);
    let [push, pull, picked, closed] = &s.variants[..] else {
        panic!("four variants");
    };

    // The empty variant is the file as written.
    assert!(push.overrides.is_empty());
    assert!(push.hops.iter().all(|h| h.transport == Transport::Push));
    assert_eq!(push.hops[1].slow.as_ref().map(|s| s.probability), Some(0.1));

    assert!(pull.hops.iter().all(|h| h.transport == Transport::Pull));
    assert_eq!(
        pull.overrides,
        [("hop.*.transport".to_owned(), "\"pull\"".to_owned())]
    );

    assert_eq!(
        picked.hops[1].slow,
        Some(Slowness {
            probability: 0.2,
            extra: DurationDist::Fixed { value: ms(5) },
            follow: None,
        })
    );
    assert_eq!(
        picked.hops.iter().map(|h| h.replicas).collect::<Vec<_>>(),
        [1, 1, 3]
    );
    assert_eq!(
        picked.hops[0].work,
        Work::Cpu {
            min_rounds: 5,
            max_rounds: 5,
            block_bytes: 102_400
        }
    );
    assert_eq!(picked.overrides[2].1, "{ kind = \"cpu\", rounds = 5 }");

    assert_eq!(closed.load.mode, LoadMode::Closed { concurrency: 4 });
    assert_eq!(closed.hops[1].slow, None);
    assert_eq!(
        closed.overrides,
        [
            ("load.mode".to_owned(), "\"closed\"".to_owned()),
            ("load.concurrency".to_owned(), "4".to_owned()),
            ("load.rate".to_owned(), "<unset>".to_owned()),
            ("load.arrivals".to_owned(), "<unset>".to_owned()),
            ("hop.backend.slow".to_owned(), "<unset>".to_owned()),
        ]
    );
    // Untouched parts are shared.
    assert_eq!(push.load, pull.load);
    assert_eq!(pull.load.stop, closed.load.stop);
}

#[test]
fn a_bad_override_is_located_at_the_override_and_a_base_error_once() {
    // Line 5 (arrivals) stays in the closed variant; line 9 (replicas 0) is
    // a base problem that every variant shares.
    let source = r#"name = "v"
[load]
mode = "open"
rate = 100
arrivals = "uniform"
requests = 1000
[[hop]]
name = "a"
replicas = 0
[[hop]]
name = "b"
[[variant]]
name = "pull"
set = { "hop.*.transport" = "pull", "hop.b.replicas" = 65 }
[[variant]]
name = "closed"
set = { "load.mode" = "closed", "load.concurrency" = 2, "hop.zz.replicas" = 2 }
unset = ["load.rate"]
[[variant]]
name = "odd"
set = { "seed" = 3, "check.compounding" = true, "nope.x" = 1, "hop.1.slow.probability" = 0.5 }
"#;
    assert_eq!(
        problems(source),
        vec![
            (
                5,
                1,
                "variant \"closed\": load.arrivals is only for mode = \"open\"".to_owned()
            ),
            (
                9,
                12,
                "hop \"a\": replicas must be between 1 and 64, got 0".to_owned()
            ),
            (
                14,
                56,
                "variant \"pull\": hop \"b\": replicas must be between 1 and 64, got 65".to_owned()
            ),
            (
                17,
                57,
                "variant \"closed\": hop selector \"zz\" in \"hop.zz.replicas\" matches no hop"
                    .to_owned()
            ),
            (
                21,
                9,
                "variant \"odd\": seed cannot be overridden by a variant: it is per scenario"
                    .to_owned()
            ),
            (
                21,
                21,
                "variant \"odd\": override path \"check.compounding\": [check] cannot be \
                 overridden by a variant, it is per scenario"
                    .to_owned()
            ),
            (
                21,
                49,
                "variant \"odd\": unknown section \"nope\" in override path \"nope.x\" \
                 (expected load, hop, launcher, broker or mesh)"
                    .to_owned()
            ),
            (
                21,
                63,
                "variant \"odd\": missing required key \"extra\" in slow of hop \"b\"".to_owned()
            ),
        ]
    );
}

#[test]
fn variant_tables_are_checked() {
    let source = format!(
        "{MESH}[[variant]]\nname = \"x\"\nsett = {{}}\n[[variant]]\nname = \"x\"\n\
         unset = [\"load.rat\"]\n"
    );
    let found = problems(&source);
    let summary: Vec<(usize, usize, &str)> =
        found.iter().map(|(l, c, m)| (*l, *c, m.as_str())).collect();
    assert_eq!(
        summary,
        [
            (
                19,
                1,
                "unknown key \"sett\" in [[variant]] \"x\" (expected one of: name, set, unset)"
            ),
            (
                21,
                8,
                "duplicate variant name \"x\" (also used by the variant at index 0)"
            ),
            (22, 10, "variant \"x\": unset \"load.rat\": no such key"),
        ]
    );
}

#[test]
fn load_reads_files_and_reports_a_missing_one() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let missing = dir.path().join("missing.toml");
    let Err(errors) = load(&missing) else {
        panic!("a missing file must not load");
    };
    assert_eq!(errors.errors.len(), 1);
    let error = &errors.errors[0];
    assert_eq!(error.origin, missing.display().to_string());
    assert_eq!((error.line, error.column), (0, 0));
    assert!(error.message.starts_with("cannot read the scenario: "));
    assert!(
        errors
            .to_string()
            .starts_with(&format!("{}: cannot", missing.display()))
    );

    let present = dir.path().join("full.toml");
    std::fs::write(&present, FULL).unwrap_or_else(|e| panic!("write: {e}"));
    assert_eq!(
        load(&present).ok(),
        parse(FULL, "x").ok().map(|s| (s, FULL.to_owned()))
    );
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "name = 3\n").unwrap_or_else(|e| panic!("write: {e}"));
    let Err(errors) = load(&broken) else {
        panic!("a broken file must not load");
    };
    assert_eq!(errors.errors[0].origin, broken.display().to_string());
}

/// Mutated scenarios never make the parser panic.
#[test]
fn mangled_input_never_panics() {
    const PIECES: &[&str] = &[
        "[",
        "]",
        "{",
        "}",
        "\"",
        "=",
        ".",
        ",",
        "-",
        "0",
        "\n",
        "#",
        "[[hop]]",
        "[[variant]]",
        "99999999999999999999",
        "-1",
        "1e400",
        "nan",
        "\"hop.*.x\"",
        "\"-1ms\"",
        "é",
        "downstream = [\"frontend\"]",
        "set = { \"hop.0.slow.extra.dist\" = 1 }",
    ];
    let base =
        format!("{FULL}\n[[variant]]\nname = \"v\"\nset = {{ \"hop.*.transport\" = \"pull\" }}\n");
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        usize::try_from(state % bound as u64).unwrap_or(0)
    };
    for _ in 0..1500 {
        let mut text = base.clone();
        for _ in 0..1 + next(4) {
            let mut at = next(text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            if next(2) == 0 {
                let mut end = (at + next(12)).min(text.len());
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.replace_range(at..end, "");
            } else {
                text.insert_str(at, PIECES[next(PIECES.len())]);
            }
        }
        let _ = parse(&text, "fuzz.toml");
    }
}

#[test]
fn lower_bounds_and_distribution_rules() {
    let source = r#"name = "d"
seed = -1
[load]
mode = "open"
rate = 0
requests = 0
[[hop]]
name = "a"
work = { kind = "sleep", dist = "lognormal", mean = "0s", sigma = 11 }
slow = { probability = 0.5, extra = { dist = "uniform", min = "3ms", max = "2ms" } }
error = { probability = 0, code = 17 }
[[hop]]
name = "b"
work = { kind = "sleep", value = "1ms", mean = "2ms" }
slow = { probability = 0.5, extra = 20 }
"#;
    assert_eq!(
        problems(source),
        vec![
            (2, 8, "seed must be at least 0, got -1".to_owned()),
            (
                5,
                8,
                "load.rate must be greater than 0 and at most 1000000, got 0".to_owned()
            ),
            (6, 12, "load.requests must be at least 1, got 0".to_owned()),
            (
                9,
                53,
                "hop \"a\": work.mean must be greater than 0".to_owned()
            ),
            (
                9,
                67,
                "hop \"a\": work.sigma must be greater than 0 and at most 10, got 11".to_owned()
            ),
            (
                10,
                63,
                "hop \"a\": slow.extra.min (3ms) must not exceed slow.extra.max (2ms)".to_owned()
            ),
            (
                11,
                35,
                "hop \"a\": error.code must be between 1 and 16, got 17".to_owned()
            ),
            (
                14,
                41,
                "hop \"b\": work.mean is not used by dist = \"fixed\"".to_owned()
            ),
            (
                15,
                37,
                "hop \"b\": expected a duration string such as \"20ms\" or a distribution table \
                 for slow.extra, got an integer"
                    .to_owned()
            ),
        ]
    );
}

const NET_HEAD: &str = "name = \"n\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"1s\"\n";

#[test]
fn net_faults_parse_with_schedules_and_pick_a_capable_launcher() {
    // The window (5 s to 15 s after warmup) lies within the 20 s load.
    let head = NET_HEAD.replace("duration = \"1s\"", "duration = \"20s\"");
    let source = format!(
        "{head}[[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\nreplicas = 3\n\
         net = {{ loss = 0.01, delay = \"2ms\", jitter = \"500us\", start = \"5s\", duration = \"10s\" }}\n\
         replica_net = [{{ replica = 1, loss = 0.05 }}, {{ replica = 2, delay = \"1ms\" }}]\n"
    );
    let s = ok(&source);
    let v = &s.variants[0];
    assert_eq!(
        v.launcher,
        Launcher::Auto,
        "net faults without a launcher pick auto"
    );
    assert!(v.has_net_faults());
    let b = &v.hops[1];
    assert_eq!(
        b.net,
        Some(NetFault {
            loss: 0.01,
            delay: ms(2),
            jitter: Duration::from_micros(500),
            start: Duration::from_secs(5),
            duration: Some(Duration::from_secs(10)),
        })
    );
    assert_eq!(b.replica_net.len(), 2);
    assert_eq!(b.net_of(0), b.net.as_ref());
    assert_eq!(b.net_of(1).map(|f| f.loss), Some(0.05));
    assert_eq!(b.net_of(1).map(|f| f.delay), Some(Duration::ZERO));
    assert_eq!(b.net_of(2).map(|f| f.delay), Some(ms(1)));
    assert_eq!(v.hops[0].net_of(0), None);

    // A single table works too, and an explicit launcher is kept.
    let source = format!(
        "launcher = \"netns\"\n{NET_HEAD}[[hop]]\nname = \"a\"\nreplicas = 2\n\
         replica_net = {{ replica = 1, loss = 0.2 }}\n"
    );
    let v = &ok(&source).variants[0];
    assert_eq!(v.launcher, Launcher::Netns);
    assert_eq!(v.hops[0].net_of(1).map(|f| f.loss), Some(0.2));
    assert_eq!(v.hops[0].net_of(0), None);

    // Without faults the default stays local.
    let v = &ok(&format!("{NET_HEAD}[[hop]]\nname = \"a\"\n")).variants[0];
    assert_eq!(v.launcher, Launcher::Local);
    assert!(!v.has_net_faults());
}

#[test]
fn bad_net_values_are_located() {
    let source = format!(
        "{NET_HEAD}[[hop]]\nname = \"a\"\nreplicas = 2\n\
         net = {{ loss = 1.5, delay = \"-2ms\", bogus = 1 }}\n\
         replica_net = {{ replica = 2, jitter = \"1ms\" }}\n\
         [[hop]]\nname = \"b\"\nnet = {{ delay = \"1ms\", jitter = \"2ms\", duration = \"0s\" }}\n"
    );
    let found = problems(&source);
    let summary: Vec<(usize, usize, &str)> =
        found.iter().map(|(l, c, m)| (*l, *c, m.as_str())).collect();
    assert_eq!(
        summary,
        [
            (
                9,
                16,
                "hop \"a\": net.loss must be between 0 and 1, got 1.5"
            ),
            (9, 29, "hop \"a\": negative duration \"-2ms\" for net.delay"),
            (
                9,
                37,
                "unknown key \"bogus\" in net of hop \"a\" (expected one of: loss, delay, \
                 jitter, start, duration)"
            ),
            (
                10,
                27,
                "hop \"a\": replica_net.replica must be less than replicas (2), got 2 \
                 (replicas are numbered from 0)"
            ),
            (
                10,
                39,
                "hop \"a\": replica_net.jitter needs replica_net.delay: jitter varies a \
                 packet's delay around it"
            ),
            (
                13,
                33,
                "hop \"b\": net.jitter (2ms) must not exceed net.delay (1ms): a packet's \
                 delay is drawn from delay ± jitter and cannot be negative"
            ),
            (13, 51, "hop \"b\": net.duration must be greater than 0"),
        ]
    );
}

#[test]
fn net_faults_under_the_local_launcher_are_refused() {
    let source =
        format!("launcher = \"local\"\n{NET_HEAD}[[hop]]\nname = \"a\"\nnet = {{ loss = 0.01 }}\n");
    let found = problems(&source);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].0, found[0].1), (1, 12));
    assert!(
        found[0]
            .2
            .contains("use launcher = \"netns\" (needs root or CAP_NET_ADMIN)"),
        "{}",
        found[0].2
    );
    // A variant can switch the launcher and is refused the same way.
    let source = format!(
        "{NET_HEAD}[[hop]]\nname = \"a\"\nnet = {{ loss = 0.01 }}\n\
         [[variant]]\nname = \"l\"\nset = {{ launcher = \"local\" }}\n"
    );
    let found = problems(&source);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .2
            .starts_with("variant \"l\": launcher = \"local\""),
        "{}",
        found[0].2
    );
    // Overriding a fault's value works like any other key.
    let source = format!(
        "{NET_HEAD}[[hop]]\nname = \"a\"\nnet = {{ loss = 0.01 }}\n\
         [[variant]]\nname = \"five\"\nset = {{ \"hop.a.net.loss\" = 0.05 }}\n"
    );
    let s = ok(&source);
    assert_eq!(
        s.variants[0].hops[0].net.as_ref().map(|n| n.loss),
        Some(0.05)
    );
}

const SWEPT: &str = r#"name = "sweep"
[load]
mode = "open"
rate = 10
requests = 5
[[hop]]
name = "a"
slow = { probability = 0.1, extra = "20ms" }
[[hop]]
name = "b"
[[hop]]
name = "c"
[[variant]]
name = "push"
[[variant]]
name = "pull"
set = { "hop.*.transport" = "pull" }
"#;

#[test]
fn a_hops_sweep_runs_every_variant_on_each_prefix_of_the_chain() {
    let s = ok(&format!(
        "{SWEPT}[sweep]\nkey = \"hops\"\nfrom = 1\nto = 3\n"
    ));
    let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "push-hops-1",
            "push-hops-2",
            "push-hops-3",
            "pull-hops-1",
            "pull-hops-2",
            "pull-hops-3"
        ]
    );
    let hops: Vec<usize> = s.variants.iter().map(|v| v.hops.len()).collect();
    assert_eq!(hops, [1, 2, 3, 1, 2, 3]);
    // The last hop of a prefix calls nobody; the pull group keeps its override.
    assert!(s.variants[1].hops[1].downstream.is_empty());
    assert!(
        s.variants[4]
            .hops
            .iter()
            .all(|h| h.transport == Transport::Pull)
    );
    let point = s.variants[4].sweep.as_ref().expect("a sweep point");
    assert_eq!((point.group.as_str(), point.value.as_str()), ("pull", "2"));
    let sweep = s.sweep.expect("the sweep");
    assert_eq!((sweep.key.as_str(), sweep.values.len()), ("hops", 3));
}

#[test]
fn a_sweep_over_an_override_path_sets_each_value() {
    let s = ok(&format!(
        "{SWEPT}[sweep]\nkey = \"hop.a.slow.probability\"\nvalues = [0.05, 0.2]\n"
    ));
    let p: Vec<(String, f64)> = s
        .variants
        .iter()
        .map(|v| {
            (
                v.name.clone(),
                v.hops[0].slow.as_ref().map_or(0.0, |s| s.probability),
            )
        })
        .collect();
    assert_eq!(
        p,
        [
            ("push-probability-0-05".to_owned(), 0.05),
            ("push-probability-0-2".to_owned(), 0.2),
            ("pull-probability-0-05".to_owned(), 0.05),
            ("pull-probability-0-2".to_owned(), 0.2),
        ]
    );
}

#[test]
fn bad_sweeps_are_reported_where_they_are_written() {
    let empty = problems(&format!("{SWEPT}[sweep]\nkey = \"hops\"\nvalues = []\n"));
    assert!(
        empty
            .iter()
            .any(|(l, _, m)| *l == 20 && m.contains("empty list")),
        "{empty:?}"
    );
    let unknown = problems(&format!(
        "{SWEPT}[sweep]\nkey = \"hop.*.nope\"\nvalues = [1]\n"
    ));
    assert!(
        unknown
            .iter()
            .any(|(l, _, m)| *l == 20 && m.contains("unknown key \"nope\"")),
        "{unknown:?}"
    );
    let too_many = problems(&format!(
        "{SWEPT}[sweep]\nkey = \"hops\"\nvalues = [1, 4]\n"
    ));
    assert!(
        too_many.iter().any(|(l, c, m)| (*l, *c) == (20, 14)
            && m.contains("takes 1 to 3")
            && m.contains("got 4")),
        "{too_many:?}"
    );
    let bad_value = problems(&format!(
        "{SWEPT}[sweep]\nkey = \"hop.a.slow.probability\"\nvalues = [1.5]\n"
    ));
    assert!(
        bad_value
            .iter()
            .any(|(_, _, m)| m.contains("sweep hop.a.slow.probability = 1.5")
                && m.contains("probability")),
        "{bad_value:?}"
    );
}

#[test]
fn once_a_hop_names_its_downstream_hops_without_the_key_are_leaves() {
    let s = ok(r#"name = "tree"
[load]
mode = "closed"
concurrency = 1
requests = 1
[[hop]]
name = "root"
downstream = ["a", "b"]
[[hop]]
name = "a"
[[hop]]
name = "b"
"#);
    let downstream: Vec<Vec<String>> = s.variants[0]
        .hops
        .iter()
        .map(|h| h.downstream.clone())
        .collect();
    assert_eq!(
        downstream,
        [vec!["a".to_owned(), "b".to_owned()], vec![], vec![]]
    );
}

#[test]
fn max_error_rate_defaults_to_one_percent_and_is_a_share() {
    let base =
        "name = \"e\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 5\n[[hop]]\nname = \"a\"\n";
    assert_eq!(ok(base).check.max_error_rate, 0.01);
    let all = ok(&format!("{base}[check]\nmax_error_rate = 1.0\n"));
    assert_eq!(all.check.max_error_rate, 1.0);
    let none = ok(&format!("{base}[check]\nmax_error_rate = 0\n"));
    assert_eq!(none.check.max_error_rate, 0.0);
    for bad in ["1.5", "-0.1", "\"1%\""] {
        let found = problems(&format!("{base}[check]\nmax_error_rate = {bad}\n"));
        assert_eq!(found.len(), 1, "{bad}: {found:#?}");
        assert!(found[0].2.contains("check.max_error_rate"), "{found:#?}");
    }
    let variant = problems(&format!(
        "{base}[[variant]]\nname = \"v\"\nset = {{ \"check.max_error_rate\" = 0.5 }}\n"
    ));
    assert_eq!(variant.len(), 1, "{variant:#?}");
    assert!(variant[0].2.contains("per scenario"), "{variant:#?}");
}

#[test]
fn the_distribution_check_is_off_by_default_and_its_tolerance_a_share() {
    let base =
        "name = \"d\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 5\n[[hop]]\nname = \"a\"\n";
    let plain = ok(base);
    assert!(!plain.check.distribution);
    assert_eq!(plain.check.distribution_tolerance, 0.10);
    let on = ok(&format!(
        "{base}[check]\ndistribution = true\ndistribution_tolerance = 0.02\n"
    ));
    assert!(on.check.distribution);
    assert_eq!(on.check.distribution_tolerance, 0.02);
    for bad in ["0", "1.5", "\"5%\""] {
        let found = problems(&format!("{base}[check]\ndistribution_tolerance = {bad}\n"));
        assert_eq!(found.len(), 1, "{bad}: {found:#?}");
        assert!(
            found[0].2.contains("check.distribution_tolerance"),
            "{found:#?}"
        );
    }
    let found = problems(&format!("{base}[check]\ndistribution = \"yes\"\n"));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].2.contains("check.distribution"), "{found:#?}");
}

#[test]
fn telemetry_defaults_to_full_sampling_and_checks_its_keys() {
    let base =
        "name = \"t\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 5\n[[hop]]\nname = \"a\"\n";
    assert_eq!(ok(base).telemetry, Telemetry::default());
    assert_eq!(Telemetry::default().sampling, 1.0);
    let off = ok(&format!("{base}[telemetry]\nsampling = 0.0\n"));
    assert_eq!(off.telemetry.sampling, 0.0);
    let bad = problems(&format!(
        "{base}[telemetry]\nsampling = 1.5\nforward = \"127.0.0.1:4317\"\nexport = true\n"
    ));
    let messages: Vec<&str> = bad.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(bad.len(), 3, "{messages:#?}");
    assert!(
        messages[2].contains("unknown key \"export\""),
        "{messages:#?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("sampling")),
        "{messages:#?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("forward") && m.contains("http://127.0.0.1:4317")),
        "{messages:#?}"
    );
    let variant = problems(&format!(
        "{base}[[variant]]\nname = \"v\"\nset = {{ \"telemetry.sampling\" = 0.5 }}\n"
    ));
    assert_eq!(variant.len(), 1, "{variant:#?}");
    assert!(variant[0].2.contains("per scenario"), "{variant:#?}");
}

#[test]
fn tail_sampling_keeps_the_tail_and_a_share_by_default_and_checks_its_keys() {
    let base =
        "name = \"t\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 5\n[[hop]]\nname = \"a\"\n";
    let keep = ok(base).telemetry.keep;
    assert_eq!(
        keep,
        Keep {
            slow: true,
            slow_percentile: None,
            failed: true,
            retried: true,
            share: KeepShare::Auto
        }
    );
    let p99 = ok(&format!("{base}[telemetry]\nkeep_slow_percentile = 99.9\n"));
    assert_eq!(p99.telemetry.keep.slow_percentile, Some(99.9));
    for bad in ["0", "100", "101", "\"p99\""] {
        let got = problems(&format!(
            "{base}[telemetry]\nkeep_slow_percentile = {bad}\n"
        ));
        assert_eq!(got.len(), 1, "{bad}: {got:#?}");
        assert_eq!((got[0].0, got[0].1), (9, 24), "{bad}: {got:#?}");
        assert!(got[0].2.contains("keep_slow_percentile"), "{got:#?}");
    }
    let set = ok(&format!(
        "{base}[telemetry]\nkeep_slow = false\nkeep_failed = false\nkeep_share = \"auto\"\n"
    ));
    assert_eq!(
        (set.telemetry.keep.slow, set.telemetry.keep.failed),
        (false, false)
    );
    assert_eq!(set.telemetry.keep.share, KeepShare::Auto);
    // Line 8 is [telemetry]; each bad value is named where it stands.
    let bad = problems(&format!(
        "{base}[telemetry]\nkeep_slow = 1\nkeep_share = 1.5\nkeep_failed = \"yes\"\n\
         keep_retried = true\nkeep_all = true\n"
    ));
    let got: Vec<(usize, usize)> = bad.iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(got, [(9, 13), (10, 14), (11, 15), (13, 1)], "{bad:#?}");
    assert!(
        bad[0].2.contains("keep_slow") && bad[0].2.contains("boolean"),
        "{bad:#?}"
    );
    assert!(bad[1].2.contains("keep_share"), "{bad:#?}");
    assert!(bad[2].2.contains("keep_failed"), "{bad:#?}");
    assert!(bad[3].2.contains("unknown key \"keep_all\""), "{bad:#?}");
    let word = problems(&format!("{base}[telemetry]\nkeep_share = \"most\"\n"));
    assert_eq!(word.len(), 1, "{word:#?}");
    assert_eq!((word[0].0, word[0].1), (9, 14));
    assert!(
        word[0]
            .2
            .contains("must be \"auto\" or a share from 0.0 to 1.0, not \"most\""),
        "{word:#?}"
    );
}

#[test]
fn a_file_that_is_not_utf8_is_named_with_the_line_and_column_of_its_first_bad_byte() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let latin1 = dir.path().join("latin1.toml");
    // "é" in Latin-1 (0xe9) on line 2, after "name = \"caf".
    std::fs::write(&latin1, b"seed = 1\nname = \"caf\xe9\"\n")
        .unwrap_or_else(|e| panic!("write: {e}"));
    let Err(errors) = load(&latin1) else {
        panic!("a Latin-1 file must not load");
    };
    assert_eq!(errors.errors.len(), 1, "{errors}");
    let e = &errors.errors[0];
    assert_eq!((e.line, e.column), (2, 12), "{errors}");
    assert!(
        e.message.contains("not UTF-8") && e.message.contains("0xe9"),
        "{errors}"
    );

    let binary = dir.path().join("picture.toml");
    std::fs::write(&binary, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
        .unwrap_or_else(|e| panic!("write: {e}"));
    let Err(errors) = load(&binary) else {
        panic!("a binary file must not load");
    };
    let e = &errors.errors[0];
    assert_eq!((e.line, e.column), (1, 1), "{errors}");
    assert!(e.message.contains("a binary file"), "{errors}");
}

/// Any input is checked in time linear in its size: 300,000 unknown keys
/// (each its own problem) and 300,000 on one line. Quadratic work on these
/// took minutes; the deadline is far above what linear work needs, so it
/// catches the quadratic case without timing anything finer.
#[test]
fn many_problems_are_reported_in_time_linear_in_the_input() {
    const KEYS: usize = 300_000;
    let head =
        "name = \"x\"\n[load]\nmode = \"open\"\nrate = 1\nrequests = 1\n[[hop]]\nname = \"a\"\n";
    let mut lines = String::from(head);
    let mut inline = String::from(head);
    inline.push_str("work = { kind = \"none\"");
    for i in 0..KEYS {
        lines.push_str(&format!("k{i} = 1\n"));
        inline.push_str(&format!(", k{i} = 1"));
    }
    inline.push_str(" }\n");
    for (what, source) in [("one key a line", lines), ("one line", inline)] {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let count = match parse(&source, "big.toml") {
                Ok(_) => 0,
                Err(errors) => errors.errors.len(),
            };
            let _ = done.send(count);
        });
        let count = finished
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{what}: {KEYS} unknown keys not checked within 120 s"));
        assert!(
            count >= KEYS,
            "{what}: {count} problems for {KEYS} unknown keys"
        );
    }
}

#[test]
fn queue_limit_bounds_the_wait_of_a_hop_with_concurrency() {
    let s = ok(&format!(
        "{HEAD}[[hop]]\nname = \"a\"\nconcurrency = 2\nqueue_limit = 0\n\
         [[hop]]\nname = \"b\"\nconcurrency = 1\n"
    ));
    let v = &s.variants[0];
    assert_eq!((v.hops[0].concurrency, v.hops[0].queue_limit), (Some(2), 0));
    assert_eq!(
        v.hops[1].queue_limit,
        tailmesh_services::limits::DEFAULT_QUEUE_LIMIT
    );

    assert_eq!(
        problems(&format!(
            "{HEAD}[[hop]]\nname = \"a\"\nqueue_limit = 5\n\
             [[hop]]\nname = \"b\"\nconcurrency = 1\nqueue_limit = -1\n"
        )),
        vec![
            (
                8,
                1,
                "hop \"a\": queue_limit needs concurrency (it bounds the wait for a slot)"
                    .to_owned()
            ),
            (
                12,
                15,
                "hop \"b\": queue_limit must be between 0 and 1000000, got -1".to_owned()
            ),
        ]
    );
}

#[test]
fn a_load_that_could_hold_more_than_the_in_flight_budget_is_refused_at_its_key() {
    let load = |extra: &str| {
        format!(
            "name = \"t\"\n[load]\nmode = \"open\"\nrate = 1000\nduration = \"1s\"\n{extra}[[hop]]\nname = \"a\"\n"
        )
    };
    // 1000/s x 2 s x (1 MiB + 8 KiB): about 2 GiB, at the payload key.
    let found = problems(&load("timeout = \"2s\"\npayload = 1048576\n"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].0, found[0].1), (7, 1), "{found:?}");
    assert!(
        found[0]
            .2
            .contains("up to 2000 requests may be in flight (rate x timeout)"),
        "{found:?}"
    );
    // The boundary: 2000 x (528678 + 8192) bytes is 1 GiB, less 8.
    assert_eq!(
        problems(&load("timeout = \"2s\"\npayload = 528679\n")).len(),
        1
    );
    ok(&load("timeout = \"2s\"\npayload = 528678\n"));
    // Without a payload key the timeout is the culprit: 10^6 in flight.
    let found = problems(&load("timeout = \"1000s\"\n"));
    assert_eq!((found.len(), found[0].0), (1, 6), "{found:?}");
    // Closed loop: the concurrency.
    let closed = "name = \"t\"\n[load]\nmode = \"closed\"\nconcurrency = 10000\nrequests = 10\n\
                  payload = 4194304\n[[hop]]\nname = \"a\"\n";
    let found = problems(closed);
    assert!(found[0].2.contains("(the concurrency)"), "{found:?}");
}

#[test]
fn discipline_orders_a_push_line_or_a_pull_topic() {
    let s = ok(&format!(
        "{HEAD}[[hop]]\nname = \"a\"\nconcurrency = 1\ndiscipline = \"lifo\"\n\
         [[hop]]\nname = \"b\"\ntransport = \"pull\"\ndiscipline = \"adaptive\"\n\
         [[hop]]\nname = \"c\"\n\
         [[variant]]\nname = \"v\"\nset = {{ \"hop.a.discipline\" = \"adaptive\" }}\n"
    ));
    // The one declared variant: its override replaces hop a's lifo.
    let disciplines: Vec<_> = s.variants[0].hops.iter().map(|h| h.discipline).collect();
    assert_eq!(
        disciplines,
        [Discipline::Adaptive, Discipline::Adaptive, Discipline::Fifo]
    );

    assert_eq!(
        problems(&format!(
            "{HEAD}[[hop]]\nname = \"a\"\ndiscipline = \"lifo\"\n\
             [[hop]]\nname = \"b\"\nconcurrency = 1\ndiscipline = \"codel\"\n\
             [[hop]]\nname = \"c\"\ndiscipline = \"fifo\"\n"
        )),
        vec![
            (
                8,
                1,
                "hop \"a\": discipline needs concurrency on a push hop (it orders the wait for a slot)"
                    .to_owned()
            ),
            (
                12,
                14,
                "hop \"b\": discipline must be one of \"fifo\", \"lifo\", \"adaptive\", got \"codel\""
                    .to_owned()
            ),
        ]
    );
}

#[test]
fn the_report_interval_defaults_to_a_second_and_is_checked_against_the_run() {
    // HEAD: 100 requests at 10/s, about 10 s.
    let hop = "[[hop]]\nname = \"a\"\n";
    assert_eq!(ok(&format!("{HEAD}{hop}")).report.interval, ms(1000));
    // A run shorter than the default keeps it: one interval, the run's length.
    let short = "name = \"t\"\n[load]\nmode = \"open\"\nrate = 200\nrequests = 40\n";
    assert_eq!(ok(&format!("{short}{hop}")).report.interval, ms(1000));
    assert_eq!(
        ok(&format!("{HEAD}{hop}[report]\ninterval = \"10ms\"\n"))
            .report
            .interval,
        ms(10)
    );
    assert_eq!(
        problems(&format!("{HEAD}{hop}[report]\ninterval = \"5ms\"\n")),
        vec![(
            9,
            12,
            "report.interval must be at least 10ms, got 5ms".to_owned()
        )]
    );
    assert_eq!(
        problems(&format!("{HEAD}{hop}[report]\ninterval = \"30s\"\n")),
        vec![(
            9,
            12,
            "report.interval (30s) is longer than the run (about 10.000s: 100 requests at \
             10/s)"
                .to_owned()
        )]
    );
    let timed = "name = \"t\"\n[load]\nmode = \"closed\"\nconcurrency = 2\nduration = \"10s\"\n";
    assert_eq!(
        problems(&format!("{timed}{hop}[report]\ninterval = \"11s\"\n")),
        vec![(
            9,
            12,
            "report.interval (11s) is longer than the run (10s of load after warmup)".to_owned()
        )]
    );
    // A closed loop that stops by count has no length known up front.
    let counted = "name = \"t\"\n[load]\nmode = \"closed\"\nconcurrency = 2\nrequests = 10\n";
    assert_eq!(
        ok(&format!("{counted}{hop}[report]\ninterval = \"1h\"\n"))
            .report
            .interval,
        Duration::from_secs(3600)
    );
    // A variant whose load is shorter than the interval is refused too.
    let variants = "[[variant]]\nname = \"short\"\nset = { \"load.requests\" = 20 }\n";
    let found = problems(&format!(
        "{HEAD}{hop}[report]\ninterval = \"5s\"\n{variants}"
    ));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].2.starts_with("variant \"short\"")
            && found[0]
                .2
                .contains("report.interval (5s) is longer than the run"),
        "{found:?}"
    );
}

/// Head of the window tests: 10 s of load after 1 s of warmup.
const WINDOW_HEAD: &str =
    "name = \"w\"\n[load]\nmode = \"open\"\nrate = 10\nwarmup = \"1s\"\nduration = \"10s\"\n";

#[test]
fn windows_on_slow_replica_slow_and_error_parse_like_net() {
    let source = format!(
        "{WINDOW_HEAD}[[hop]]\nname = \"a\"\nreplicas = 2\n\
         slow = {{ probability = 0.2, extra = \"20ms\", start = \"3s\", duration = \"3s\" }}\n\
         replica_slow = {{ replica = 1, factor = 4, start = \"2s\" }}\n\
         error = {{ probability = 0.1, code = \"unavailable\", duration = \"10s\" }}\n\
         [[hop]]\nname = \"b\"\nslow = {{ probability = 0.5, extra = \"1ms\" }}\n"
    );
    let s = ok(&source);
    let v = &s.variants[0];
    assert_eq!(
        v.launcher,
        Launcher::Local,
        "application windows need no root"
    );
    let (a, b) = (&v.hops[0], &v.hops[1]);
    let w = |start: u64, duration: Option<u64>| Window {
        start: Duration::from_secs(start),
        duration: duration.map(Duration::from_secs),
    };
    assert_eq!(
        a.windows,
        AppWindows {
            slow: w(3, Some(3)),
            replica_slow: w(2, None),
            error: w(0, Some(10)),
        }
    );
    assert!(a.has_app_windows());
    assert_eq!(b.windows, AppWindows::default());
    assert!(!b.has_app_windows());
    // Replicas start without their windowed faults; the schedule sets them.
    let behavior = a.behavior(1);
    assert_eq!(
        (behavior.slow, behavior.replica_slow, behavior.error),
        (None, None, None)
    );
    assert_eq!(
        b.behavior(1).slow,
        b.slow,
        "a fault without a window is always on"
    );
}

#[test]
fn a_window_at_or_past_the_end_of_the_load_is_refused() {
    let hop = |fault: &str| format!("{WINDOW_HEAD}[[hop]]\nname = \"a\"\n{fault}\n");
    // Ending exactly at the end of the load is fine.
    ok(&hop(
        "slow = { probability = 0.2, extra = \"20ms\", start = \"4s\", duration = \"6s\" }",
    ));
    assert_eq!(
        problems(&hop(
            "slow = { probability = 0.2, extra = \"20ms\", start = \"4s\", duration = \"6001ms\" }"
        )),
        [(
            9,
            70,
            "hop \"a\": slow window 4s..10s 1ms runs past the end of the load (10s after \
             warmup)"
                .to_owned()
        )]
    );
    assert_eq!(
        problems(&hop(
            "error = { probability = 0.1, code = 14, start = \"10s\" }"
        )),
        [(
            9,
            49,
            "hop \"a\": error.start (10s) is at or past the end of the load (10s after warmup)"
                .to_owned()
        )]
    );
    assert_eq!(
        problems(&hop(
            "replicas = 2\nreplica_slow = { replica = 1, factor = 3, start = \"12s\", duration = \"1s\" }"
        )),
        [(
            10,
            51,
            "hop \"a\": replica_slow.start (12s) is at or past the end of the load (10s after \
             warmup)"
                .to_owned()
        )]
    );
    // A closed loop with a request count has no length to check against.
    let closed = "name = \"w\"\n[load]\nmode = \"closed\"\nconcurrency = 2\nrequests = 50\n\
                  [[hop]]\nname = \"a\"\nslow = { probability = 0.2, extra = \"20ms\", start = \"1h\" }\n";
    ok(closed);
    // An open loop with a request count lasts requests / rate: 50 / 10 = 5 s.
    let counted = "name = \"w\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 50\n\
                   [[hop]]\nname = \"a\"\nerror = { probability = 0.1, code = 14, start = \"5s\" }\n";
    assert_eq!(
        problems(counted).len(),
        1,
        "a window at 5 s of a 5 s load is refused"
    );
}

#[test]
fn an_interval_whose_open_histograms_pass_the_budget_is_refused_with_the_shortest_that_fits() {
    let mut source =
        "name = \"t\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"1h\"\ntimeout = \"20s\"\n"
            .to_owned();
    for i in 0..12 {
        source.push_str(&format!("[[hop]]\nname = \"h{i}\"\n"));
    }
    let fits = format!("{source}[report]\ninterval = \"1s\"\n");
    assert_eq!(ok(&fits).report.interval, ms(1000));
    let found = problems(&format!("{source}[report]\ninterval = \"10ms\"\n"));
    assert_eq!(found.len(), 1, "{found:?}");
    let (line, column, message) = &found[0];
    assert_eq!((*line, *column), (32, 12), "{message}");
    assert!(
        message.starts_with("report.interval = 10ms with timeout 20s and 12 hops keeps up to ")
            && message.contains(
                "MiB of interval histograms (at most 128 MiB); use an interval of at least "
            ),
        "{message}"
    );
    // The interval it names fits; a millisecond less does not.
    let least = message
        .rsplit("at least ")
        .next()
        .and_then(|d| humantime::parse_duration(d).ok())
        .expect("a duration at the end");
    assert_eq!(
        ok(&format!(
            "{source}[report]\ninterval = \"{}\"\n",
            humantime::format_duration(least)
        ))
        .report
        .interval,
        least
    );
    let less = least - ms(1);
    let refused = problems(&format!(
        "{source}[report]\ninterval = \"{}\"\n",
        humantime::format_duration(less)
    ));
    assert_eq!(refused.len(), 1, "{refused:?}");
}

#[test]
fn a_zero_window_duration_is_refused_with_its_place() {
    let source = format!(
        "{WINDOW_HEAD}[[hop]]\nname = \"a\"\n\
         slow = {{ probability = 0.2, extra = \"20ms\", start = \"1s\", duration = \"0s\" }}\n"
    );
    assert_eq!(
        problems(&source),
        [(
            9,
            70,
            "hop \"a\": slow.duration must be greater than 0".to_owned()
        )]
    );
}

#[test]
fn an_override_that_moves_a_window_past_the_end_is_refused_in_that_variant() {
    let source = format!(
        "{WINDOW_HEAD}[[hop]]\nname = \"a\"\n\
         slow = {{ probability = 0.2, extra = \"20ms\", start = \"4s\", duration = \"2s\" }}\n\
         [[variant]]\nname = \"fits\"\n\
         [[variant]]\nname = \"late\"\nset = {{ \"hop.a.slow.duration\" = \"8s\" }}\n"
    );
    let found = problems(&source);
    assert_eq!(found.len(), 1, "{found:?}");
    let (_, _, message) = &found[0];
    assert!(
        message.contains("late") && message.contains("slow window 4s..12s runs past the end"),
        "{message}"
    );
}

/// Head of the load step tests: an open loop of two uniform steps after a
/// second of warmup.
const STEPS_HEAD: &str = "name = \"s\"\n[load]\nmode = \"open\"\narrivals = \"uniform\"\n\
                          warmup = \"1s\"\n\
                          steps = [ { rate = 200, duration = \"4s\" }, { rate = 400.5, duration = \"2s\" } ]\n";

#[test]
fn load_steps_set_the_rate_and_the_length() {
    let s = ok(&format!("{STEPS_HEAD}[[hop]]\nname = \"a\"\n"));
    let load = &s.variants[0].load;
    assert_eq!(
        load.mode,
        LoadMode::Open {
            rate: 200.0,
            arrivals: Arrivals::Uniform,
            steps: vec![
                Step {
                    rate: 200.0,
                    duration: ms(4000)
                },
                Step {
                    rate: 400.5,
                    duration: ms(2000)
                },
            ],
        }
    );
    assert_eq!(load.stop, Stop::Duration(ms(6000)));
    assert_eq!(load.warmup, ms(1000));
    assert_eq!(load.planned_requests(), Some(200.0 * 4.0 + 400.5 * 2.0));
    // Fault windows are checked against the steps' total: 6 s.
    let window = |start: &str| {
        format!(
            "{STEPS_HEAD}[[hop]]\nname = \"a\"\n\
             slow = {{ probability = 0.2, extra = \"20ms\", start = \"{start}\" }}\n"
        )
    };
    ok(&window("5s"));
    assert_eq!(
        problems(&window("6s")),
        [(
            9,
            53,
            "hop \"a\": slow.start (6s) is at or past the end of the load (6s after warmup)"
                .to_owned()
        )]
    );
    // And so is the report interval.
    let hop = "[[hop]]\nname = \"a\"\n";
    assert_eq!(
        ok(&format!("{STEPS_HEAD}{hop}[report]\ninterval = \"6s\"\n"))
            .report
            .interval,
        ms(6000)
    );
    assert_eq!(
        problems(&format!("{STEPS_HEAD}{hop}[report]\ninterval = \"7s\"\n")),
        [(
            10,
            12,
            "report.interval (7s) is longer than the run (6s of load after warmup)".to_owned()
        )]
    );
}

#[test]
fn bad_load_steps_are_reported_at_their_keys() {
    let source = r#"name = "s"
[load]
mode = "open"
rate = 100
duration = "4s"
steps = [
  { rate = 0, duration = "4s" },
  { rate = 2000000, duration = "0s" },
  { duration = "1s" },
  { rate = 10 },
  { rate = 10, duration = "1s", burst = 2 },
  5,
]
requests = 10
[[hop]]
name = "a"
"#;
    assert_eq!(
        problems(source),
        vec![
            (
                4,
                1,
                "load.rate cannot go with load.steps: each step sets its own rate (the first \
                 step's also runs the warmup); change the steps instead"
                    .to_owned()
            ),
            (
                5,
                1,
                "load.duration cannot go with load.steps: the load lasts the steps' total \
                 duration; change the steps instead"
                    .to_owned()
            ),
            (
                7,
                12,
                "load.steps, step 1: rate must be greater than 0 and at most 1000000, got 0"
                    .to_owned()
            ),
            (
                8,
                12,
                "load.steps, step 2: rate must be greater than 0 and at most 1000000, got \
                 2000000"
                    .to_owned()
            ),
            (
                8,
                32,
                "load.steps, step 2: duration must be greater than 0".to_owned()
            ),
            (
                9,
                3,
                "missing required key \"rate\" in step 3 of load.steps".to_owned()
            ),
            (
                10,
                3,
                "missing required key \"duration\" in step 4 of load.steps".to_owned()
            ),
            (
                11,
                33,
                "unknown key \"burst\" in step 5 of load.steps (expected one of: rate, \
                 duration)"
                    .to_owned()
            ),
            (
                12,
                3,
                "expected a table such as { rate = 200, duration = \"4s\" } for step 6 of \
                 load.steps, got an integer"
                    .to_owned()
            ),
            (
                14,
                1,
                "load.requests cannot go with load.steps: the load lasts the steps' total \
                 duration; change the steps instead"
                    .to_owned()
            ),
        ]
    );
    let hop = "[[hop]]\nname = \"a\"\n";
    let closed = format!(
        "name = \"s\"\n[load]\nmode = \"closed\"\nconcurrency = 2\nduration = \"1s\"\n\
         steps = [{{ rate = 10, duration = \"1s\" }}]\n{hop}"
    );
    assert_eq!(
        problems(&closed),
        [(6, 1, "load.steps is only for mode = \"open\"".to_owned())]
    );
    let empty = format!("name = \"s\"\n[load]\nmode = \"open\"\nsteps = []\n{hop}");
    assert_eq!(
        problems(&empty),
        [(
            4,
            9,
            "load.steps is empty: give at least one { rate, duration }, or rate and duration \
             for a constant rate"
                .to_owned()
        )]
    );
    let not_a_list = format!("name = \"s\"\n[load]\nmode = \"open\"\nsteps = 5\n{hop}");
    assert_eq!(
        problems(&not_a_list),
        [(
            4,
            9,
            "expected an array of steps such as [{ rate = 200, duration = \"4s\" }] for \
             load.steps, got an integer"
                .to_owned()
        )]
    );
    let many = format!(
        "name = \"s\"\n[load]\nmode = \"open\"\nsteps = [{}]\n{hop}",
        vec!["{ rate = 1, duration = \"1s\" }"; 101].join(", ")
    );
    assert_eq!(
        problems(&many),
        [(
            4,
            9,
            "load.steps has 101 steps, at most 100: each is a phase of the results".to_owned()
        )]
    );
    let hundred = many.replacen("{ rate = 1, duration = \"1s\" }, ", "", 1);
    assert_eq!(
        ok(&hundred).variants[0].load.stop,
        Stop::Duration(ms(100_000))
    );
    // The busiest step decides what may be in flight.
    let busy = format!(
        "name = \"s\"\n[load]\nmode = \"open\"\ntimeout = \"10s\"\n\
         steps = [{{ rate = 1, duration = \"1s\" }}, {{ rate = 1000000, duration = \"1s\" }}]\n{hop}"
    );
    let found = problems(&busy);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .2
            .contains("up to 10000000 requests may be in flight"),
        "{found:?}"
    );
}

#[test]
fn variants_override_the_steps_but_not_the_rate_or_length_they_decide() {
    let hop = "[[hop]]\nname = \"a\"\n";
    let source = format!(
        "{STEPS_HEAD}{hop}[[variant]]\nname = \"faster\"\n\
         set = {{ \"load.steps\" = [{{ rate = 800, duration = \"3s\" }}] }}\n"
    );
    let s = ok(&source);
    let faster = &s.variants[0].load;
    assert_eq!(faster.stop, Stop::Duration(ms(3000)));
    assert!(matches!(&faster.mode, LoadMode::Open { rate, steps, .. }
        if *rate == 800.0 && steps.len() == 1));

    let source = format!(
        "{STEPS_HEAD}{hop}[[variant]]\nname = \"rate\"\nset = {{ \"load.rate\" = 300 }}\n\
         [[variant]]\nname = \"long\"\nset = {{ \"load.duration\" = \"10s\" }}\n"
    );
    assert_eq!(
        problems(&source),
        [
            (
                11,
                9,
                "variant \"rate\": load.rate cannot go with load.steps: each step sets its own \
                 rate (the first step's also runs the warmup); change the steps instead"
                    .to_owned()
            ),
            (
                14,
                9,
                "variant \"long\": load.duration cannot go with load.steps: the load lasts the \
                 steps' total duration; change the steps instead"
                    .to_owned()
            ),
        ]
    );
    // A sweep of the rate over a stepped load is refused at each value.
    let sweep = format!("{STEPS_HEAD}{hop}[sweep]\nkey = \"load.rate\"\nvalues = [100, 200]\n");
    let found = problems(&sweep);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found
            .iter()
            .all(|(line, _, m)| *line == 11 && m.contains("load.rate cannot go with load.steps")),
        "{found:?}"
    );
    // A constant load turns into steps when the variant unsets rate and
    // duration.
    let constant = "name = \"s\"\n[load]\nmode = \"open\"\nrate = 100\nduration = \"5s\"\n";
    let source = format!(
        "{constant}{hop}[[variant]]\nname = \"ramp\"\nunset = [\"load.rate\", \"load.duration\"]\n\
         set = {{ \"load.steps\" = [{{ rate = 100, duration = \"1s\" }}, {{ rate = 200, duration = \"1s\" }}] }}\n"
    );
    let s = ok(&source);
    assert_eq!(s.variants[0].load.stop, Stop::Duration(ms(2000)));
}

/// A 10 s open loop whose hop "b" (2 push replicas) gets `keys`, called by
/// "a".
fn mesh_client(keys: &str) -> String {
    format!(
        "name = \"t\"\n[load]\nmode = \"open\"\nrate = 10\nduration = \"10s\"\n\
         [[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\nreplicas = 2\n{keys}\n"
    )
}

#[test]
fn mesh_client_keys_parse_into_the_endpoint_options() {
    use tailmesh_services::model::{Backoff, Ejection, EndpointOptions, EwmaParams, LatencyStat};
    let s = Duration::from_secs;
    let b = |text: &str| ok(&mesh_client(text)).variants[0].hops[1].clone();

    // Without any key: gRPC's client, health on, nothing else.
    let plain = b("");
    assert_eq!(plain.endpoints, EndpointOptions::default());
    assert_eq!(plain.kill, None);

    let hop = b("balance = \"ewma\"\nhealth = false\n\
         backoff = { initial = \"250ms\", multiplier = 2, jitter = 0, max = \"4s\" }\n\
         keepalive = \"500ms\"\nkeepalive_timeout = \"1s\"\n\
         ewma = { decay = \"5s\", default_rtt = \"10ms\" }\n\
         ejection = { consecutive_errors = 3, latency_factor = 2.5, latency_stat = \"p99\", \
         interval = \"2s\", min_requests = 5, base_time = \"1s\", max_time = \"3s\", max_share = 1 }\n\
         kill = { replica = 1, at = \"3s\", back = \"2s\" }");
    assert_eq!(hop.balance, Balance::Ewma);
    assert_eq!(
        hop.endpoints,
        EndpointOptions {
            health: false,
            backoff: Backoff {
                initial: ms(250),
                multiplier: 2.0,
                jitter: 0.0,
                max: s(4),
            },
            keepalive: Some(ms(500)),
            keepalive_timeout: s(1),
            ewma: EwmaParams {
                decay: s(5),
                default_rtt: ms(10),
            },
            ejection: Some(Ejection {
                consecutive_errors: Some(3),
                latency_factor: Some(2.5),
                latency_stat: LatencyStat::P99,
                interval: s(2),
                min_requests: 5,
                base_time: s(1),
                max_time: s(3),
                max_share: 1.0,
            }),
        }
    );
    assert_eq!(
        hop.kill,
        Some(Kill {
            replica: 1,
            at: s(3),
            back: Some(s(2)),
        })
    );

    // An empty ejection table has the error rule with the documented
    // defaults; the latency factor alone turns the error rule off.
    assert_eq!(
        b("ejection = {}").endpoints.ejection,
        Some(EJECTION_DEFAULTS)
    );
    let latency = b("ejection = { latency_factor = 3 }").endpoints.ejection;
    assert_eq!(
        latency.map(|e| (e.consecutive_errors, e.latency_factor)),
        Some((None, Some(3.0)))
    );
    // A backoff of one key keeps gRPC's others.
    assert_eq!(
        b("backoff = { initial = \"100ms\" }").endpoints.backoff,
        Backoff {
            initial: ms(100),
            ..Backoff::default()
        }
    );
}

#[test]
fn mesh_client_keys_are_set_per_variant() {
    let text = format!(
        "{}[[variant]]\nname = \"health\"\n[[variant]]\nname = \"naive\"\n\
         set = {{ \"hop.b.health\" = false, \"hop.b.ejection\" = {{ consecutive_errors = 2 }} }}\n",
        mesh_client("kill = { replica = 0, at = \"1s\" }")
    );
    let s = ok(&text);
    let b = |v: usize| &s.variants[v].hops[1];
    assert!(b(0).endpoints.health && b(0).endpoints.ejection.is_none());
    assert!(!b(1).endpoints.health);
    assert_eq!(
        b(1).endpoints.ejection.and_then(|e| e.consecutive_errors),
        Some(2)
    );
    assert_eq!(b(1).kill.map(|k| k.back), Some(None));
}

#[test]
fn bad_mesh_client_values_are_located() {
    // Line 10 is the hop's first key line (see `mesh_client`).
    let at = |keys: &str| problems(&mesh_client(keys));
    assert_eq!(
        at("backoff = { initial = \"0s\", multiplier = 0.5, jitter = 1.5 }"),
        [
            (
                11,
                23,
                "hop \"b\": backoff.initial must be greater than 0".to_owned()
            ),
            (
                11,
                42,
                "hop \"b\": backoff.multiplier must be between 1 and 100, got 0.5".to_owned()
            ),
            (
                11,
                56,
                "hop \"b\": backoff.jitter must be between 0 and 1, got 1.5".to_owned()
            ),
        ]
    );
    assert_eq!(
        at("backoff = { initial = \"2s\", max = \"1s\" }"),
        [(
            11,
            35,
            "hop \"b\": backoff.max (1s) must be at least backoff.initial (2s)".to_owned()
        )]
    );
    assert_eq!(
        at("keepalive = \"0s\"\nkeepalive_timeout = \"0ms\""),
        [
            (
                11,
                13,
                "hop \"b\": keepalive must be greater than 0".to_owned()
            ),
            (
                12,
                21,
                "hop \"b\": keepalive_timeout must be greater than 0".to_owned()
            ),
        ]
    );
    let ejection = at(
        "ejection = { consecutive_errors = 0, latency_factor = 1, max_share = 0, \
                       min_requests = 0, base_time = \"2s\", max_time = \"1s\", foo = 1 }",
    );
    let messages: Vec<&str> = ejection.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(
        messages,
        [
            "hop \"b\": ejection.consecutive_errors must be between 1 and 1000000, got 0",
            "hop \"b\": ejection.latency_factor must be greater than 1 and at most 1000, got 1",
            "hop \"b\": ejection.max_share must be greater than 0 and at most 1, got 0",
            "hop \"b\": ejection.min_requests must be between 1 and 1000000, got 0",
            "hop \"b\": ejection.max_time (1s) must be at least ejection.base_time (2s)",
            "unknown key \"foo\" in ejection of hop \"b\" (expected one of: consecutive_errors, \
             latency_factor, latency_stat, interval, min_requests, base_time, max_time, max_share)",
        ]
    );
    assert!(
        ejection
            .iter()
            .all(|(line, column, _)| *line == 11 && *column > 1)
    );
    assert_eq!(
        at("balance = \"least_request\"")[0].2,
        "hop \"b\": balance must be one of \"round_robin\", \"random\", \"p2c\", \"ewma\", got \
         \"least_request\""
    );
}

#[test]
fn kill_needs_an_existing_replica_within_the_run() {
    let at = |keys: &str| problems(&mesh_client(keys));
    assert_eq!(
        at("kill = { replica = 2, at = \"1s\" }"),
        [(
            11,
            20,
            "hop \"b\": kill.replica must be less than replicas (2), got 2 (replicas are \
             numbered from 0)"
                .to_owned()
        )]
    );
    assert_eq!(
        at("kill = { replica = 0, at = \"0s\" }"),
        [(
            11,
            28,
            "hop \"b\": kill.at must be greater than 0".to_owned()
        )]
    );
    assert_eq!(
        at("kill = { replica = 0, at = \"10s\" }"),
        [(
            11,
            28,
            "hop \"b\": kill.at (10s) is at or past the end of the load (10s after warmup)"
                .to_owned()
        )]
    );
    assert_eq!(
        at("kill = { replica = 0, at = \"4s\", back = \"6s\" }"),
        [(
            11,
            41,
            "hop \"b\": kill.back: the replica would be back at 10s, at or past the end of the \
             load (10s after warmup)"
                .to_owned()
        )]
    );
    assert_eq!(
        at("kill = { at = \"1s\" }")[0].2,
        "missing required key \"replica\" in kill of hop \"b\""
    );
}

#[test]
fn mesh_client_keys_on_a_pull_hop_are_refused() {
    let found = problems(&mesh_client(
        "transport = \"pull\"\nhealth = false\nkeepalive = \"1s\"",
    ));
    assert_eq!(
        found,
        [
            (
                12,
                1,
                "hop \"b\": health applies to push callers only: a pull hop's workers take \
                 tasks from the broker, nobody picks its replicas"
                    .to_owned()
            ),
            (
                13,
                1,
                "hop \"b\": keepalive applies to push callers only: a pull hop's workers take \
                 tasks from the broker, nobody picks its replicas"
                    .to_owned()
            ),
        ]
    );
}

#[test]
fn a_hops_connection_reaches_its_callers_and_is_refused_on_the_entry_hop() {
    let source = format!(
        "{HEAD}[[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\nconnection = \"per_request\"\n\
         [[hop]]\nname = \"c\"\ntransport = \"pull\"\n\
         [[variant]]\nname = \"shared\"\n\
         [[variant]]\nname = \"pulled-per-request\"\nset = {{ \"hop.c.connection\" = \"per_request\" }}\n"
    );
    let scenario = ok(&source);
    let connections = |v: usize| -> Vec<Connection> {
        scenario.variants[v]
            .hops
            .iter()
            .map(|h| h.connection)
            .collect()
    };
    assert_eq!(
        connections(0),
        [
            Connection::Shared,
            Connection::PerRequest,
            Connection::Shared
        ]
    );
    assert_eq!(
        connections(1),
        [
            Connection::Shared,
            Connection::PerRequest,
            Connection::PerRequest
        ]
    );

    // The entry hop's caller is the load generator: whatever the value.
    let source = format!(
        "{HEAD}[[hop]]\nname = \"a\"\nconnection = \"per_request\"\n[[hop]]\nname = \"b\"\n\
         connection = \"always\"\n"
    );
    assert_eq!(
        problems(&source),
        vec![
            (
                8,
                1,
                "hop \"a\": connection is not for the entry hop, whose caller is the load \
                 generator: set load.connection instead"
                    .to_owned()
            ),
            (
                11,
                14,
                "hop \"b\": connection must be one of \"shared\", \"per_request\", got \"always\""
                    .to_owned()
            ),
        ]
    );
}

#[test]
fn empirical_work_reads_percentiles_in_any_order() {
    let source = format!(
        "{HEAD}[[hop]]\nname = \"a\"\n[hop.work]\nkind = \"sleep\"\ndist = \"empirical\"\n\
         quantiles = {{ p100 = \"60ms\", p0 = \"1ms\", p50 = \"3ms\", \"p99.9\" = \"40ms\" }}\n\
         [[hop]]\nname = \"b\"\n\
         slow = {{ probability = 0.1, extra = {{ dist = \"empirical\", quantiles = {{ p0 = \"5ms\", p100 = \"5ms\" }} }} }}\n"
    );
    let s = ok(&source);
    let hops = &s.variants[0].hops;
    assert_eq!(
        hops[0].work,
        Work::Sleep {
            dist: DurationDist::Empirical {
                quantiles: vec![(0.0, ms(1)), (0.5, ms(3)), (0.999, ms(40)), (1.0, ms(60))]
            }
        }
    );
    assert_eq!(
        hops[1].slow.as_ref().map(|s| &s.extra),
        Some(&DurationDist::Empirical {
            quantiles: vec![(0.0, ms(5)), (1.0, ms(5))]
        })
    );
}

#[test]
fn empirical_work_needs_rising_percentiles_from_p0_to_p100() {
    let hop = |quantiles: &str| {
        format!(
            "{HEAD}[[hop]]\nname = \"a\"\n\
             work = {{ kind = \"sleep\", dist = \"empirical\", quantiles = {quantiles} }}\n"
        )
    };
    let cases = [
        (
            hop(r#"{ p0 = "1ms", p50 = "3ms" }"#),
            (
                8,
                58,
                "hop \"a\": work.quantiles needs p0 (the lowest value) and p100 (the highest): values beyond the ones given are not made up",
            ),
        ),
        (
            hop(r#"{ p0 = "1ms", p50 = "3ms", p90 = "2ms", p100 = "4ms" }"#),
            (
                8,
                91,
                "hop \"a\": work.quantiles.p90 (2ms) is below work.quantiles.p50 (3ms): a higher percentile needs a value at least as high",
            ),
        ),
        (
            hop(r#"{ p0 = "1ms", median = "3ms", p101 = "2ms", p100 = "4ms" }"#),
            (
                8,
                72,
                "hop \"a\": \"median\" in work.quantiles is not a percentile: write p0 (the lowest value) to p100 (the highest), such as p50, p99, \"p99.9\"",
            ),
        ),
        (
            hop(r#"{ p0 = "1ms", p50 = "3ms", "p50.0" = "3ms", p100 = "4ms" }"#),
            (
                8,
                85,
                "hop \"a\": work.quantiles.p50.0 names the same percentile as work.quantiles.p50",
            ),
        ),
        (
            hop(r#"{ p0 = "1ms", p100 = 4 }"#),
            (
                8,
                79,
                "hop \"a\": expected a duration string such as \"20ms\" for work.quantiles.p100, got an integer",
            ),
        ),
        (
            format!(
                "{HEAD}[[hop]]\nname = \"a\"\nwork = {{ kind = \"sleep\", dist = \"empirical\" }}\n"
            ),
            (
                8,
                8,
                "missing required key \"quantiles\" in work of hop \"a\"",
            ),
        ),
        (
            hop(r#""p50""#),
            (
                8,
                58,
                "hop \"a\": expected a table for work.quantiles, got a string",
            ),
        ),
    ];
    for (source, (line, column, message)) in cases {
        let found = problems(&source);
        assert!(
            found
                .iter()
                .any(|(l, c, m)| (*l, *c, m.as_str()) == (line, column, message)),
            "{source}\nwanted {line}:{column}: {message}\ngot {found:#?}"
        );
    }
}

#[test]
fn downstream_stages_and_calls_with_a_probability_and_a_count() {
    use tailmesh_model::calls::{Call, CallCount, Repeats};
    let s = ok(r#"name = "t"
[load]
mode = "closed"
concurrency = 1
requests = 1
[[hop]]
name = "root"
downstream = [["auth"], ["cart", { hop = "price", probability = 0.25, count = { 1 = 3, 2 = 1 }, repeats = "parallel" }], [{ hop = "auth", count = 2 }]]
[[hop]]
name = "auth"
[[hop]]
name = "cart"
downstream = [{ hop = "price", probability = 0.5 }]
[[hop]]
name = "price"
"#);
    let hops = &s.variants[0].hops;
    assert_eq!(hops[0].downstream, ["auth", "cart", "price"]);
    assert_eq!(
        hops[0].calls.stages,
        vec![
            vec![Call::once("auth")],
            vec![
                Call::once("cart"),
                Call {
                    hop: "price".to_owned(),
                    probability: 0.25,
                    count: CallCount::Weighted(vec![(1, 0.75), (2, 0.25)]),
                    repeats: Repeats::Parallel,
                }
            ],
            vec![Call {
                count: CallCount::Fixed(2),
                ..Call::once("auth")
            }],
        ]
    );
    assert_eq!(hops[1].downstream, Vec::<String>::new());
    assert!(!s.variants[0].fixed_paths());
    assert!(hops[2].calls.stages[0][0].probability == 0.5);
    // root, auth, cart and its price, price twice, auth twice.
    assert_eq!(s.variants[0].most_visits(), 8);
    // A plain list is one stage of single calls: a fixed path.
    let plain = ok(&format!(
        "{HEAD}[[hop]]\nname = \"a\"\ndownstream = [\"b\", \"c\"]\n[[hop]]\nname = \"b\"\n[[hop]]\nname = \"c\"\n"
    ));
    assert!(plain.variants[0].fixed_paths());
    assert_eq!(plain.variants[0].most_visits(), 3);
}

#[test]
fn bad_calls_are_reported_where_they_are_written() {
    let hops = "[[hop]]\nname = \"b\"\n[[hop]]\nname = \"c\"\n";
    for (downstream, want) in [
        (r#"["b", ["c"]]"#, "mixes stages"),
        (
            r#"[{ hop = "b", probability = 0 }]"#,
            "probability must be greater than 0",
        ),
        (r#"[{ hop = "b", probability = 1.5 }]"#, "probability"),
        (r#"[{ hop = "b", count = 0 }]"#, "count"),
        (r#"[{ hop = "b", count = 65 }]"#, "count"),
        (
            r#"[{ hop = "b", count = { x = 1 } }]"#,
            "\"x\" is not a count",
        ),
        (r#"[{ hop = "b", count = { 2 = -1 } }]"#, "weight of 2"),
        (
            r#"[{ hop = "b", repeats = "sideways" }]"#,
            "repeats must be one of",
        ),
        (r#"[{ hop = "b", often = 2 }]"#, "unknown key \"often\""),
        (r#"[{ probability = 0.5 }]"#, "hop"),
        (r#"["b", { hop = "b" }]"#, "listed twice in one stage"),
        (
            r#"[[{ hop = "d" }], ["c"]]"#,
            "\"d\" of hop \"a\" does not exist",
        ),
        (r#"[3]"#, "expected a hop name or a call table"),
    ] {
        let file = format!("{HEAD}[[hop]]\nname = \"a\"\ndownstream = {downstream}\n{hops}");
        let found = problems(&file);
        assert!(
            found
                .iter()
                .any(|(line, _, m)| *line == 8 && m.contains(want)),
            "{downstream}: want {want:?} on line 8, got {found:?}"
        );
    }
    // Counts multiply down the tree: 40 x 40 visits is too many.
    let deep = format!(
        "{HEAD}[[hop]]\nname = \"a\"\ndownstream = [{{ hop = \"b\", count = 40 }}]\n\
         [[hop]]\nname = \"b\"\ndownstream = [{{ hop = \"c\", count = 40 }}]\n[[hop]]\nname = \"c\"\n"
    );
    let found = problems(&deep);
    assert!(
        found
            .iter()
            .any(|(_, _, m)| m.contains("up to 1641 hops") && m.contains("more than 1024")),
        "{found:?}"
    );
}

#[test]
fn load_entries_name_the_hops_the_load_generator_calls_with_their_shares() {
    // Two entries over a shared leaf: every hop reached from one of them.
    let source = format!(
        "{HEAD}entries = [\"front\", {{ hop = \"admin\", weight = 3 }}]\n\
         [[hop]]\nname = \"front\"\ndownstream = [\"db\"]\n\
         [[hop]]\nname = \"admin\"\ndownstream = [\"db\"]\n\
         [[hop]]\nname = \"db\"\nconnection = \"per_request\"\n"
    );
    let s = ok(&source);
    let v = &s.variants[0];
    assert_eq!(
        v.load.entries,
        [
            Entry {
                hop: "front".into(),
                share: 0.25
            },
            Entry {
                hop: "admin".into(),
                share: 0.75
            }
        ]
    );
    assert_eq!(v.entries(), [(0, 0.25), (1, 0.75)]);
    assert!(!v.fixed_paths(), "requests enter at either hop");
    // Without entries, the first hop takes every request.
    let plain = ok(&format!(
        "{HEAD}[[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\n"
    ));
    assert_eq!(plain.variants[0].entries(), [(0, 1.0)]);
    assert!(plain.variants[0].fixed_paths());
    // One entry other than the first hop: its path starts there.
    let one = ok(&format!(
        "{HEAD}entries = [\"b\"]\n[[hop]]\nname = \"a\"\ndownstream = []\n\
         [[hop]]\nname = \"b\"\ndownstream = [\"a\"]\n"
    ));
    assert_eq!(one.variants[0].entries(), [(1, 1.0)]);
    assert!(!one.variants[0].fixed_paths());
}

#[test]
fn bad_load_entries_are_refused_at_their_place() {
    let hops = "[[hop]]\nname = \"a\"\ndownstream = []\n[[hop]]\nname = \"b\"\ndownstream = []\n";
    let entries = |list: &str| problems(&format!("{HEAD}entries = {list}\n{hops}"));
    assert_eq!(
        entries("[\"a\", \"zz\"]"),
        [(6, 17, "load.entries: hop \"zz\" does not exist".to_owned())]
    );
    assert_eq!(
        entries("[\"a\", { hop = \"a\", weight = 2 }, \"b\"]"),
        [(
            6,
            25,
            "hop \"a\" is listed twice in load.entries (give it one weight)".to_owned()
        )]
    );
    assert_eq!(
        entries("[\"a\", { hop = \"b\", weight = 0 }]"),
        [(
            6,
            39,
            "load.entries.weight must be greater than 0 and at most 1000000000, got 0".to_owned()
        )]
    );
    assert_eq!(
        entries("[]"),
        [(
            6,
            11,
            "load.entries is empty: name at least one hop, or leave it out for the first hop"
                .to_owned()
        )]
    );
    assert_eq!(
        entries("[3]"),
        [(
            6,
            12,
            "expected a hop name or { hop = \"name\", weight = .. } in load.entries, got an integer"
                .to_owned()
        )]
    );
    // A hop no entry reaches is never called.
    assert_eq!(
        entries("[\"a\"]"),
        [(
            10,
            1,
            "hop \"b\" is never called: it is not reachable from the entry hop \"a\"".to_owned()
        )]
    );
    // An entry no hop calls is reached over [load]'s connections; one a
    // hop calls as well takes `connection` for those calls.
    let source = format!(
        "{HEAD}entries = [\"a\", \"b\", \"c\"]\n[[hop]]\nname = \"a\"\ndownstream = [\"b\"]\n\
         [[hop]]\nname = \"b\"\nconnection = \"per_request\"\n[[hop]]\nname = \"c\"\n\
         connection = \"per_request\"\n[[hop]]\nname = \"d\"\n"
    );
    assert_eq!(
        problems(&source),
        [
            (
                15,
                1,
                "hop \"c\": connection is not for the entry hop, whose caller is the load \
                 generator: set load.connection instead"
                    .to_owned()
            ),
            (
                16,
                1,
                "hop \"d\" is never called: it is not reachable from the entry hops \"a\", \"b\", \"c\""
                    .to_owned()
            ),
        ]
    );
}

#[test]
fn load_generators_default_to_one_and_must_each_have_a_request_in_flight() {
    let hop = "[[hop]]\nname = \"a\"\n";
    assert_eq!(ok(&format!("{HEAD}{hop}")).variants[0].load.generators, 1);
    assert_eq!(
        ok(&format!("{HEAD}generators = 4\n{hop}")).variants[0]
            .load
            .generators,
        4
    );
    let zero = problems(&format!("{HEAD}generators = 0\n{hop}"));
    assert_eq!(zero.len(), 1, "{zero:?}");
    assert_eq!(zero[0].0, 6, "{zero:?}");
    assert!(zero[0].2.contains("generators"), "{zero:?}");
    let closed = problems(&format!(
        "name = \"t\"\n[load]\nmode = \"closed\"\nconcurrency = 2\nrequests = 10\n\
         generators = 3\n{hop}"
    ));
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert_eq!(closed[0].0, 6, "{closed:?}");
    assert!(
        closed[0].2.contains("splits the 2 requests in flight"),
        "{closed:?}"
    );
}

#[test]
fn generator_links_take_net_faults_each_or_all_and_pick_a_capable_launcher() {
    let head = NET_HEAD.replace("duration = \"1s\"", "duration = \"20s\"");
    let source = format!(
        "{head}generators = 3\nnet = {{ delay = \"5ms\" }}\n\
         generator_net = [{{ generator = 1, loss = 0.02, start = \"5s\", duration = \"10s\" }}]\n\
         [[hop]]\nname = \"a\"\n"
    );
    let v = &ok(&source).variants[0];
    assert_eq!(
        v.launcher,
        Launcher::Auto,
        "a generator's link fault picks a launcher that can apply it"
    );
    assert!(v.has_net_faults());
    let load = &v.load;
    assert_eq!(load.net_of(0).map(|f| f.delay), Some(ms(5)));
    assert_eq!(load.net_of(2).map(|f| f.delay), Some(ms(5)));
    let one = load.net_of(1).expect("generator 1 has its own fault");
    assert_eq!(
        (one.loss, one.delay, one.start, one.duration),
        (
            0.02,
            Duration::ZERO,
            Duration::from_secs(5),
            Some(Duration::from_secs(10))
        )
    );

    // One generator with a fault on its link is a fault all the same.
    let single = format!(
        "{NET_HEAD}generator_net = {{ generator = 0, loss = 0.1 }}\n[[hop]]\nname = \"a\"\n"
    );
    let v = &ok(&single).variants[0];
    assert!(v.has_net_faults());
    assert_eq!(v.load.net_of(0).map(|f| f.loss), Some(0.1));

    // Not on the local launcher, which cannot shape a link.
    let local = problems(&format!(
        "launcher = \"local\"\n{NET_HEAD}net = {{ loss = 0.1 }}\n[[hop]]\nname = \"a\"\n"
    ));
    assert_eq!(local.len(), 1, "{local:?}");
    assert!(
        local[0].2.contains("([load] has net or generator_net)"),
        "{local:?}"
    );
}

#[test]
fn bad_generator_links_are_located() {
    let source = format!(
        "{NET_HEAD}generators = 2\nnet = {{ loss = 2, start = \"1s\" }}\n\
         generator_net = [{{ generator = 2, loss = 0.1 }}, {{ generator = 0, delay = \"1ms\" }}, \
         {{ generator = 0, loss = 0.1, bogus = 1 }}]\n[[hop]]\nname = \"a\"\n"
    );
    let found = problems(&source);
    let messages: Vec<(usize, &str)> = found.iter().map(|(l, _, m)| (*l, m.as_str())).collect();
    assert_eq!(
        messages,
        [
            (7, "load.net.loss must be between 0 and 1, got 2"),
            (
                8,
                "load.generator_net.generator must be less than load.generators (2), got 2 \
                 (generators are numbered from 0)"
            ),
            (8, "load.generator_net names generator 0 twice"),
            (
                8,
                "unknown key \"bogus\" in [load.generator_net] (expected one of: generator, \
                 loss, delay, jitter, start, duration)"
            ),
        ]
    );
    // A window past the load's end is named by whose link it is on.
    let late = problems(&format!(
        "{NET_HEAD}generator_net = {{ generator = 0, loss = 0.1, start = \"2s\" }}\n\
         [[hop]]\nname = \"a\"\n"
    ));
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(
        late[0].2,
        "load.generator_net of generator 0.start (2s) is at or past the end of the load (1s \
         after warmup)"
    );
}

#[test]
fn telemetry_metrics_take_an_address_and_a_bounded_grace() {
    let hop = "[[hop]]\nname = \"a\"\n";
    let s = ok(&format!(
        "{HEAD}{hop}[telemetry]\nmetrics = \"127.0.0.1:9464\"\nmetrics_grace = \"2s\"\n"
    ));
    assert_eq!(s.telemetry.metrics.as_deref(), Some("127.0.0.1:9464"));
    assert_eq!(s.telemetry.metrics_grace, Duration::from_secs(2));
    let s = ok(&format!("{HEAD}{hop}"));
    assert_eq!(
        (s.telemetry.metrics, s.telemetry.metrics_grace),
        (None, tailmesh_model::scenario::DEFAULT_METRICS_GRACE)
    );
    let bad = problems(&format!(
        "{HEAD}{hop}[telemetry]\nmetrics = \"localhost\"\nmetrics_grace = \"1h\"\n"
    ));
    let messages: Vec<&str> = bad.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(
        messages,
        [
            "telemetry.metrics must be an address to listen on like \"127.0.0.1:9464\", not \
             \"localhost\"",
            "telemetry.metrics_grace must be at most 10m",
        ]
    );
}

#[test]
fn streams_parse_and_their_rules_are_located() {
    let load = "name = \"t\"\n[load]\nmode = \"open\"\nrate = 100\nduration = \"1s\"\n";
    let streams = "[load.streams]\nstreams = 4\nmessages = 10\n";
    let s = ok(&format!(
        "{load}{streams}[[hop]]\nname = \"a\"\nstreaming = \"bidi\"\n[[hop]]\nname = \"b\"\n"
    ));
    let v = &s.variants[0];
    assert_eq!(
        v.load.streams,
        Some(StreamLoad {
            streams: 4,
            messages: 10,
            in_flight: 16,
            kind: Streaming::Bidi,
        })
    );
    // A stream's messages are due on a fixed schedule.
    assert!(matches!(
        v.load.mode,
        LoadMode::Open {
            arrivals: Arrivals::Uniform,
            ..
        }
    ));
    assert_eq!(
        v.hops.iter().map(|h| h.streaming).collect::<Vec<_>>(),
        [Streaming::Bidi, Streaming::Unary]
    );

    let messages =
        |source: &str| -> Vec<String> { problems(source).into_iter().map(|(_, _, m)| m).collect() };
    // The entry must be reached by stream.
    assert_eq!(
        messages(&format!("{load}{streams}[[hop]]\nname = \"a\"\n")),
        [
            "load.streams sends messages on streams, but the entry hop \"a\" is not reached by \
          stream: set streaming = \"bidi\", \"server\" or \"client\" on it"
        ]
    );
    // A stream's length instead of its messages: 2.5 s at 100 a second
    // over 4 streams is 63 messages each (62.5 rounded); not both, not
    // neither, not in a closed loop.
    let lasting = ok(&format!(
        "{load}[load.streams]\nstreams = 4\nlength = \"2500ms\"\n[[hop]]\nname = \"a\"\nstreaming = \"bidi\"\n"
    ));
    assert_eq!(
        lasting.variants[0]
            .load
            .streams
            .as_ref()
            .map(|s| s.messages),
        Some(63)
    );
    assert_eq!(
        messages(&format!(
            "{load}{streams}length = \"1s\"\n[[hop]]\nname = \"a\"\nstreaming = \"bidi\"\n"
        )),
        ["load.streams.messages and load.streams.length say the same thing: give one"]
    );
    assert_eq!(
        messages(&format!(
            "{load}[load.streams]\nstreams = 4\n[[hop]]\nname = \"a\"\nstreaming = \"bidi\"\n"
        )),
        ["[load.streams] needs messages (each stream's) or length (how long each stream lasts)"]
    );
    // Client streams: no cap and no closed loop (nothing is answered
    // before the stream's end), and a stream's one reply must hold every
    // message's answer.
    let hop = |extra: &str| format!("[[hop]]\nname = \"a\"\n{extra}\n");
    let client = ok(&format!("{load}{streams}{}", hop("streaming = \"client\"")));
    assert_eq!(
        client.variants[0].load.streams.as_ref().map(|s| s.kind),
        Some(Streaming::Client)
    );
    assert_eq!(
        messages(&format!(
            "{load}{streams}in_flight = 4\n{}",
            hop("streaming = \"client\"")
        )),
        [
            "load.streams.in_flight is for bidi streams: a client stream's messages are all \
             answered at its end"
        ]
    );
    let closed = "name = \"t\"\n[load]\nmode = \"closed\"\nconcurrency = 3\nduration = \"1s\"\n";
    assert_eq!(
        messages(&format!(
            "{closed}[load.streams]\nmessages = 7\n{}",
            hop("streaming = \"client\"")
        )),
        [
            "load.streams with client streams needs mode = \"open\": a client stream answers no \
             message before its end, so none can wait for the last"
        ]
    );
    assert_eq!(
        messages(&format!(
            "{load}[load.streams]\nstreams = 4\nmessages = 100000\n{}",
            hop("streaming = \"client\"")
        )),
        [
            "load.streams.messages = 100000 is too many for a client stream through 1 hop: its \
             one reply answers every message, about 304 bytes each, and may take 5242880 bytes, \
             so at most 17246"
        ]
    );
    // Pull, a closed loop, Poisson arrivals, generators.
    // Server streams: the load's streams take the entries' kind; their
    // messages come at their times (no cap, an open loop); one kind of
    // stream per mesh.
    let server = ok(&format!(
        "{load}{streams}{}[[hop]]\nname = \"b\"\nstreaming = \"server\"\n",
        hop("streaming = \"server\"")
    ));
    assert_eq!(
        server.variants[0].load.streams.as_ref().map(|s| s.kind),
        Some(Streaming::Server)
    );
    assert_eq!(
        messages(&format!(
            "{load}{streams}in_flight = 4\n{}",
            hop("streaming = \"server\"")
        )),
        [
            "load.streams.in_flight is for bidi streams: a server stream's messages come at their \
          times whatever is awaited"
        ]
    );
    assert_eq!(
        messages(&format!(
            "{load}{streams}{}[[hop]]\nname = \"b\"\nstreaming = \"bidi\"\n",
            hop("streaming = \"server\"")
        )),
        [
            "the streaming hops mix kinds of stream (\"a\" server, \"b\" bidi): a stream's \
          messages go down the mesh as the stream they came on, so give them one kind"
        ]
    );
    assert_eq!(
        messages(&format!(
            "{load}{}[[hop]]\nname = \"b\"\nstreaming = \"bidi\"\ntransport = \"pull\"\n",
            hop("")
        )),
        [
            "hop \"b\": streaming = \"bidi\" goes by push only: a broker's workers take each task \
          on its own, so a stream's order and its one connection would be lost (leave out \
          transport = \"pull\")"
        ]
    );
    // A closed loop: load.concurrency streams, one message in flight each.
    assert_eq!(
        ok(&format!(
            "{closed}[load.streams]\nmessages = 7\n{}",
            hop("streaming = \"bidi\"")
        ))
        .variants[0]
            .load
            .streams,
        Some(StreamLoad {
            streams: 3,
            messages: 7,
            in_flight: 1,
            kind: Streaming::Bidi,
        })
    );
    assert_eq!(
        messages(&format!(
            "{closed}{streams}in_flight = 2\n{}",
            hop("streaming = \"bidi\"")
        )),
        [
            "load.streams.streams is for mode = \"open\": in a closed loop, load.concurrency \
             streams are open at once",
            "load.streams.in_flight is for mode = \"open\": in a closed loop, each stream has \
             one message in flight",
        ]
    );
    assert_eq!(
        messages(&format!(
            "{closed}[load.streams]\nmessages = 7\nlength = \"1s\"\n{}",
            hop("streaming = \"bidi\"")
        )),
        [
            "load.streams.length is for mode = \"open\": in a closed loop, a stream's messages \
             go as fast as they are answered (give messages)"
        ]
    );
    assert_eq!(
        messages(&format!(
            "{load}arrivals = \"poisson\"\n{streams}{}",
            hop("streaming = \"bidi\"")
        )),
        [
            "load.arrivals cannot be \"poisson\" with load.streams: each stream's messages are \
             due on a fixed schedule (leave arrivals out)",
        ]
    );
    // Several generators share the streams, a generator's link may carry
    // a fault.
    let shared = ok(&format!(
        "{load}generators = 3\nnet = {{ delay = \"1ms\" }}\n\
         generator_net = {{ generator = 1, loss = 1 }}\n{streams}{}",
        hop("streaming = \"bidi\"")
    ));
    let shared = &shared.variants[0].load;
    assert_eq!(
        (
            shared.generators,
            shared.streams.is_some(),
            shared.generator_net.len()
        ),
        (3, true, 1)
    );
    assert_eq!(
        messages(&format!(
            "{load}[load.streams]\nstreams = 0\nmessages = 10\nin_flight = 5000\n{}",
            hop("streaming = \"bidi\"")
        ))
        .len(),
        2
    );
}

#[test]
fn binary_metadata_is_written_in_base64() {
    let service = |metadata: &str| {
        format!(
            "{HEAD}[[hop]]\nname = \"a\"\n[hop.service]\naddress = \"127.0.0.1:50051\"\n\
             method = \"pkg.Svc/Call\"\nrequest = {{}}\nmetadata = {metadata}\n"
        )
    };
    let s = ok(&service("{ trace-bin = \"AP8Q\", tenant = \"blue\" }"));
    let got = s.variants[0].hops[0]
        .service
        .as_ref()
        .map(|s| s.metadata.clone())
        .unwrap_or_default();
    assert_eq!(
        got,
        [
            ("trace-bin".to_owned(), "AP8Q".to_owned()),
            ("tenant".to_owned(), "blue".to_owned())
        ]
    );
    let found = problems(&service("{ trace-bin = \"not base64!\" }"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .2
            .ends_with("trace-bin is binary metadata (a -bin key): its value is its bytes in base64, standard or URL-safe"),
        "{found:?}"
    );
}
