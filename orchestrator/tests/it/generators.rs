//! Several load generator processes (`[load] generators`): together they
//! send the very requests one generator sends (same ids, same intended
//! send times, so the same faults), every one accounted for once, as one
//! generator in a process of its own does (`--generator-processes`); a
//! closed loop splits its requests in flight with disjoint ids; a
//! generator killed mid-run stops the run, named; generators started
//! elsewhere (`--stay`) serve every variant at the address the run awaits
//! them at, refused without the run's token, and leave when it ends;
//! under the netns launcher each generator runs in a namespace of its own;
//! generators share a load's streams, each stream sent whole by one.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::support::*;

tests! {
    sync three_generators_send_the_one_generator_requests_each_once,
    sync a_closed_loop_splits_its_requests_in_flight_with_disjoint_ids,
    sync a_killed_generator_stops_the_run_and_is_named,
    sync generators_started_elsewhere_serve_every_variant_and_leave_when_told,
    sync under_the_netns_launcher_each_generator_has_a_namespace_of_its_own,
    sync a_fault_on_a_generators_link_is_refused_for_generators_started_elsewhere,
    sync generators_share_the_streams_each_sending_whole_ones,
}

fn scenario(load: &str) -> String {
    format!(
        "name = \"gen\"\nseed = 11\n[load]\n{load}\n\
         [[hop]]\nname = \"a\"\nwork = {{ kind = \"sleep\", dist = \"exp\", mean = \"200us\" }}\n\
         slow = {{ probability = 0.05, extra = \"5ms\" }}\n\
         [[hop]]\nname = \"b\"\n"
    )
}

/// requests.csv's rows: id -> (intended µs, slow hops).
fn requests(run_dir: &std::path::Path) -> BTreeMap<u64, (f64, String)> {
    let text = read_lossy(&run_dir.join("requests.csv"));
    let rows = csv_rows(&text);
    let header = &rows[0];
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in {header:?}"))
    };
    let (id, intended, slow) = (col("id"), col("intended_us"), col("slow_hops"));
    let mut by_id = BTreeMap::new();
    for row in &rows[1..] {
        let key: u64 = row[id].parse().expect("an id");
        let at: f64 = row[intended].parse().expect("a time");
        assert!(
            by_id.insert(key, (at, row[slow].clone())).is_none(),
            "request {key} twice in requests.csv"
        );
    }
    by_id
}

fn three_generators_send_the_one_generator_requests_each_once() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let load = "mode = \"open\"\nrate = 300\nduration = \"2s\"\nwarmup = \"300ms\"";
    let one = write(dir.path(), "one.toml", &scenario(load));
    // Holding the traces for the run's decisions (a share kept, and the
    // slow and failed): each kept request's client span is made from its
    // record, which came from a generator process.
    let three = write(
        dir.path(),
        "three.toml",
        &format!(
            "{}[telemetry]\nkeep_share = 0.3\n",
            scenario(&format!("{load}\ngenerators = 3"))
        ),
    );
    let ran_one = accounted(
        tailmesh(dir.path(), &run_args(&one, &dir.path().join("r1"), &[])),
        &dir.path().join("r1"),
    );
    let ran_three = accounted(
        tailmesh(dir.path(), &run_args(&three, &dir.path().join("r3"), &[])),
        &dir.path().join("r3"),
    );
    let (a, b) = (requests(&ran_one.run_dir), requests(&ran_three.run_dir));
    // The same requests: the same ids, each sent once, at the same
    // intended time, the same hops slow (the faults are drawn from the
    // request's id). A generator's intended times are its schedule's,
    // moved by its start skew (its origin against the common one, on the
    // orchestrator's clock): they differ from one generator's by that
    // skew, to the rounding of requests.csv's nanoseconds.
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{}",
        ran_three.context
    );
    let g = &ran_three.v["generators"];
    assert_eq!(g["count"], 3, "{g:#}");
    let each = g["each"].as_array().expect("each generator");
    let skews: Vec<f64> = each
        .iter()
        .map(|e| {
            e["start_skew_us"]
                .as_f64()
                .expect("a generator's start skew")
        })
        .collect();
    for (id, (at, slow)) in &a {
        let (at3, slow3) = &b[id];
        let k = usize::try_from(id % 3).expect("a generator index");
        // A record moved earlier than the measured start stops there.
        let expected = (at + skews[k]).max(0.0);
        assert!(
            (at3 - expected).abs() <= 0.01,
            "request {id}: intended {at} us alone, {at3} us of three \
             (its generator {k}'s start skew {} us)",
            skews[k]
        );
        assert_eq!(slow, slow3, "request {id}'s slow hops");
    }
    let skew_us = g["start_skew_us"].as_f64().expect("start skew");
    // Each generator sent its third, and the parts add up to the whole.
    let records: Vec<u64> = each.iter().map(|e| u64_at(e, "/records")).collect();
    assert_eq!(
        records.iter().sum::<u64>(),
        u64_at(&ran_three.v, "/sent"),
        "{g:#}"
    );
    for (k, e) in each.iter().enumerate() {
        let own = b.keys().filter(|id| *id % 3 == k as u64).count() as u64;
        assert_eq!(u64_at(e, "/records"), own, "generator {k}: {e:#}");
        assert!(e["stopped"].is_null(), "{e:#}");
        assert!(
            e["instrument"].is_object(),
            "generator {k} judged itself: {e:#}"
        );
    }
    merged_histograms_are_the_sum_of_the_generators(&ran_three.run_dir, 3);
    // Three generators and the mesh's two hops: warned of where they are
    // more than the machine's CPUs.
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(
        ran_three
            .context
            .contains("3 load generators and the mesh's 2 process(es) share this machine's"),
        3 + 2 > cpus,
        "{cpus} CPUs: {}",
        ran_three.context
    );
    // One generator in a process of its own (`--generator-processes`), as
    // three run: the same requests, and summary.json tells it from the one
    // inside the orchestrator, which has no `generators`.
    let ran_own = accounted(
        tailmesh(
            dir.path(),
            &run_args(&one, &dir.path().join("r1p"), &["--generator-processes"]),
        ),
        &dir.path().join("r1p"),
    );
    assert!(
        ran_one.v["generators"].is_null(),
        "one generator, in the orchestrator's process: {:#}",
        ran_one.v["generators"]
    );
    let own = &ran_own.v["generators"];
    assert_eq!(own["count"], 1, "{own:#}");
    let only = &own["each"][0];
    assert_eq!(
        u64_at(only, "/records"),
        u64_at(&ran_own.v, "/sent"),
        "{own:#}"
    );
    assert!(only["instrument"].is_object(), "{own:#}");
    let c = requests(&ran_own.run_dir);
    for (id, (_, slow)) in &a {
        let (_, slow_own) = c.get(id).unwrap_or_else(|| {
            panic!(
                "request {id} not sent by the generator process: {}",
                ran_own.context
            )
        });
        assert_eq!(slow, slow_own, "request {id}'s slow hops");
    }
    assert_eq!(a.len(), c.len(), "{}", ran_own.context);
    merged_histograms_are_the_sum_of_the_generators(&ran_own.run_dir, 1);
    // Every kept trace whole, its root the client span made from the
    // generator's record, none lost and no orphan.
    let t = &ran_three.v["traces"];
    assert!(u64_at(t, "/sampling/written") > 0, "{t:#}");
    assert!(t["held"].is_object(), "the traces were held: {t:#}");
    assert_eq!(u64_at(t, "/expected"), u64_at(t, "/complete"), "{t:#}");
    assert_eq!(u64_at(t, "/missing"), 0, "{t:#}");
    assert_eq!(u64_at(t, "/lost"), 0, "{t:#}");
    assert_eq!(u64_at(t, "/orphan_spans"), 0, "{t:#}");
    // Every request traced (sampling 1.0), counted by the generators that
    // forwarded no span: the measured and the warmup's.
    let v = &ran_three.v;
    assert_eq!(
        u64_at(v, "/observer/traced_requests"),
        u64_at(v, "/sent") + u64_at(v, "/warmup/sent"),
        "{:#}",
        v["observer"]
    );
    // Each generator, and the one in the orchestrator's process, paced at
    // real-time priority where the process may take it, and says so.
    let realtime = may_take_realtime();
    for (k, e) in each.iter().enumerate() {
        assert_eq!(
            e["instrument"]["realtime"], realtime,
            "generator {k} of three: {e:#}"
        );
    }
    assert_eq!(
        ran_one.v["instrument"]["realtime"], realtime,
        "one generator: {:#}",
        ran_one.v["instrument"]
    );
    eprintln!("three generators: start skew {skew_us} us");
}

/// Whether this process may give a thread real-time priority: it has
/// `CAP_SYS_NICE` and `chrt` is there to ask.
fn may_take_realtime() -> bool {
    use tailmesh_netfault::tool::{has_capabilities, tool_available};
    has_capabilities(&[23]) && tool_available("chrt")
}

/// The run's histograms (its `.hlog`, every interval summed), end to end
/// and per hop, equal bucket for bucket the sum of each generator's own
/// histograms, built from the requests generator k sent (ids k, k + N,
/// ... in requests.csv) with the same precision and the same truncation
/// to whole microseconds.
fn merged_histograms_are_the_sum_of_the_generators(run_dir: &std::path::Path, of: u64) {
    type Histogram = hdrhistogram::Histogram<u64>;
    let new = || Histogram::new(3).expect("a histogram");
    let (entries, _, _) = read_hlog(&run_dir.join("base.hlog"));
    let mut merged: BTreeMap<Option<String>, Histogram> = BTreeMap::new();
    for e in &entries {
        merged
            .entry(e.tag.clone())
            .or_insert_with(new)
            .add(&e.histogram)
            .expect("add");
    }
    let text = read_lossy(&run_dir.join("requests.csv"));
    let rows = csv_rows(&text);
    let col = |name: &str| rows[0].iter().position(|h| h == name).expect(name);
    let (id, latency, status, path, hops) = (
        col("id"),
        col("latency_us"),
        col("status"),
        col("path"),
        col("hops"),
    );
    let micros = |text: &str| text.parse::<f64>().expect("microseconds").floor() as u64;
    let mut own: BTreeMap<(Option<String>, u64), Histogram> = BTreeMap::new();
    for row in &rows[1..] {
        let k = row[id].parse::<u64>().expect("an id") % of;
        if row[status] == "ok" {
            own.entry((None, k))
                .or_insert_with(new)
                .record(micros(&row[latency]))
                .expect("record");
        }
        let names = row[path].split(';').filter(|p| !p.is_empty());
        for (name, times) in names.zip(row[hops].split(';')) {
            let hop = name.split('/').next().expect("a hop name");
            let total = times.split('/').next().expect("a hop's time");
            own.entry((Some(format!("hop.{hop}")), k))
                .or_insert_with(new)
                .record(micros(total))
                .expect("record");
        }
    }
    let buckets = |h: &Histogram| -> Vec<(u64, u64)> {
        h.iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    };
    for (tag, histogram) in &merged {
        let mut sum = new();
        for k in 0..of {
            let part = own
                .get(&(tag.clone(), k))
                .unwrap_or_else(|| panic!("generator {k} has no {tag:?} histogram"));
            assert!(!part.is_empty());
            sum.add(part).expect("add");
        }
        assert!(!histogram.is_empty(), "{tag:?}");
        assert_eq!(
            buckets(histogram),
            buckets(&sum),
            "{tag:?}: the run's histogram against its generators' summed"
        );
    }
    assert_eq!(
        merged.len(),
        3,
        "end to end, hop a, hop b: {:?}",
        merged.keys()
    );
}

fn a_closed_loop_splits_its_requests_in_flight_with_disjoint_ids() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        "closed.toml",
        &scenario("mode = \"closed\"\nconcurrency = 5\nrequests = 301\ngenerators = 2"),
    );
    let ran = accounted(
        tailmesh(dir.path(), &run_args(&path, &dir.path().join("r"), &[])),
        &dir.path().join("r"),
    );
    // 301 requests, split 151 + 150, each id once (requests() checks).
    let by_id = requests(&ran.run_dir);
    assert_eq!(by_id.len(), 301, "{}", ran.context);
    let each = ran.v["generators"]["each"]
        .as_array()
        .expect("each generator");
    let records: Vec<u64> = each.iter().map(|e| u64_at(e, "/records")).collect();
    assert_eq!(records, [151, 150], "{}", ran.context);
    // Generator k's ids are k, k + 2, ...
    let even = by_id.keys().filter(|id| *id % 2 == 0).count();
    assert_eq!(even, 151, "{:?}", by_id.keys().collect::<Vec<_>>());
}

fn a_killed_generator_stops_the_run_and_is_named() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        "long.toml",
        &scenario("mode = \"open\"\nrate = 200\nduration = \"60s\"\ngenerators = 2"),
    );
    let results = dir.path().join("r");
    let mut run = Running::start(dir.path(), &run_args(&path, &results, &[]));
    // Generator 1's pid, once its load runs (its first beat has come and
    // gone: the requests file being written has rows).
    let pid = run.wait_for("generator 1 running", || {
        let pid_file = find_files(&results, "generator-1.pid").into_iter().next()?;
        let pid: u32 = std::fs::read_to_string(pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let csv = find_files(&results, ".requests.csv.partial")
            .into_iter()
            .next()?;
        (std::fs::metadata(csv).ok()?.len() > 4096).then_some(pid)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill generator 1");
    let killed = std::time::Instant::now();
    let finished = run.wait();
    let took = killed.elapsed();
    // Exit 1: the run failed (not 130, which says Ctrl-C).
    assert_eq!(finished.code(), Some(1), "{}", finished.output());
    let output = finished.output();
    assert!(
        output.contains("load generator 1 (pid"),
        "the generator is named: {output}"
    );
    let run_dir = only_run_dir(&results);
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    assert_eq!(summary["interrupted"], true, "{v:#}");
    let stopped: Vec<&Value> = v["generators"]["each"]
        .as_array()
        .expect("each generator")
        .iter()
        .filter(|e| !e["stopped"].is_null())
        .collect();
    assert_eq!(stopped.len(), 1, "{v:#}");
    assert_eq!(stopped[0]["index"], 1, "{v:#}");
    assert!(
        v["incidents"].as_array().is_some_and(|i| i
            .iter()
            .any(|l| l.as_str().is_some_and(|l| l.contains("load generator 1")))),
        "{v:#}"
    );
    // What was measured is accounted for: every request sent by the
    // generator still running ended one way or another.
    assert_accounted(v, &output);
    eprintln!("a killed generator: the run ended {took:?} after the kill");
}

fn generators_started_elsewhere_serve_every_variant_and_leave_when_told() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let token = write(dir.path(), "token", "s3cret\n");
    let wrong = write(dir.path(), "wrong", "guess\n");
    let path = write(
        dir.path(),
        "two.toml",
        &format!(
            "{}[[variant]]\nname = \"three\"\n[[variant]]\nname = \"two\"\n\
             set = {{ \"load.generators\" = 2 }}\n",
            scenario("mode = \"open\"\nrate = 200\nduration = \"1s\"\ngenerators = 3")
        ),
    );
    let results = dir.path().join("r");
    let token_env = [("TAILMESH_CONTROL_TOKEN_FILE", path_str(&token))];
    let mut run = Running::start_with_env(
        dir.path(),
        &run_args(&path, &results, &["--generators-at", "127.0.0.1:0"]),
        &token_env,
    );
    let output = run.output_reader();
    let hub = run.wait_for("the address it awaits generators at", || {
        let text = output();
        let rest = text.split("awaiting load generators at ").nth(1)?;
        Some(rest.lines().next()?.trim().to_owned())
    });
    let generator = |index: &str, env: &[(&str, &str)]| {
        Running::start_with_env(
            dir.path(),
            &["generator", "--hub", &hub, "--index", index, "--stay"],
            env,
        )
    };
    // A connection that says nothing holds up no one for long.
    let _silent = std::net::TcpStream::connect(&hub).expect("connect to the hub");
    // One without the token first: refused, it gives up.
    let impostor = generator("0", &[("TAILMESH_CONTROL_TOKEN_FILE", path_str(&wrong))]);
    let impostor = impostor.wait();
    assert_ne!(impostor.code(), Some(0), "{}", impostor.output());
    let stayers: Vec<Running> = ["0", "1", "2"]
        .iter()
        .map(|k| generator(k, &token_env))
        .collect();
    let finished = run.wait();
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    assert!(
        finished
            .output()
            .contains("showed no token or the wrong one; it was refused"),
        "{}",
        finished.output()
    );
    // Told the run is over, each generator leaves by itself.
    for g in stayers {
        let left = g.wait_within(std::time::Duration::from_secs(30));
        assert_eq!(left.code(), Some(0), "{}", left.output());
    }
    let run_dir = only_run_dir(&results);
    let summary = summary(&run_dir);
    for (v, of) in variants(&summary).iter().zip([3u64, 2]) {
        let g = &v["generators"];
        assert_eq!(g["count"], of, "{v:#}");
        let records: u64 = g["each"]
            .as_array()
            .expect("each generator")
            .iter()
            .map(|e| {
                assert!(e["stopped"].is_null(), "{e:#}");
                u64_at(e, "/records")
            })
            .sum();
        assert_eq!(records, u64_at(v, "/sent"), "{v:#}");
        assert!(u64_at(v, "/sent") > 0, "{v:#}");
        assert_accounted(v, &finished.output());
    }
}

fn under_the_netns_launcher_each_generator_has_a_namespace_of_its_own() {
    require_privilege(&[]);
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        "netns.toml",
        &format!(
            "launcher = \"netns\"\n{}",
            scenario("mode = \"open\"\nrate = 200\nduration = \"30s\"\ngenerators = 2")
        ),
    );
    let results = dir.path().join("r");
    let mut run = Running::start(dir.path(), &run_args(&path, &results, &[]));
    // Each generator's network namespace, once both run and requests
    // have come back (the requests file being written has rows).
    let namespace = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let spaces = run.wait_for("both generators running", || {
        let csv = find_files(&results, ".requests.csv.partial")
            .into_iter()
            .next()?;
        if std::fs::metadata(csv).ok()?.len() <= 4096 {
            return None;
        }
        let mut spaces = Vec::new();
        for k in 0..2 {
            let pid_file = find_files(&results, &format!("generator-{k}.pid"))
                .into_iter()
                .next()?;
            let pid = std::fs::read_to_string(pid_file).ok()?;
            spaces.push(namespace(pid.trim())?);
        }
        Some(spaces)
    });
    let ours = std::fs::read_link("/proc/self/ns/net").expect("this process's namespace");
    assert!(
        spaces[0] != spaces[1] && !spaces.contains(&ours),
        "generators in {spaces:?}, the test in {ours:?}"
    );
    // Ctrl-C: the run stops sending, and every request it sent from the
    // namespaces is accounted for.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(run.pid()).expect("a pid")),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("interrupt the run");
    let finished = run.wait();
    assert_eq!(finished.code(), Some(130), "{}", finished.output());
    let run_dir = only_run_dir(&results);
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    assert_eq!(summary["environment"]["launcher"], "netns", "{v:#}");
    let records: Vec<u64> = v["generators"]["each"]
        .as_array()
        .expect("each generator")
        .iter()
        .map(|e| u64_at(e, "/records"))
        .collect();
    assert!(
        records.iter().all(|r| *r > 0) && records.iter().sum::<u64>() == u64_at(v, "/sent"),
        "{records:?}: {v:#}"
    );
    assert_accounted(v, &finished.output());
    // Nothing of the run's network is left.
    let id = finished
        .stderr
        .split("netns launcher, run ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the run's id")
        .to_owned();
    let left: Vec<String> = tailmesh_netfault::netns::list_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&format!("tm{id}")))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// `[load] generator_net` shapes the link of a generator the run starts in
/// a namespace; one started elsewhere has none: the run is refused before
/// anything starts, naming the variant.
fn a_fault_on_a_generators_link_is_refused_for_generators_started_elsewhere() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        "link.toml",
        &scenario(
            "mode = \"open\"\nrate = 50\nduration = \"1s\"\n\
             generator_net = { generator = 0, delay = \"1ms\" }",
        ),
    );
    let results = dir.path().join("r");
    let finished = tailmesh(
        dir.path(),
        &run_args(&path, &results, &["--generators-at", "127.0.0.1:0"]),
    );
    let output = finished.output();
    assert_eq!(finished.code(), Some(2), "{output}");
    assert!(
        output.contains(
            "variant \"base\": [load] net and generator_net shape the links of the load \
             generators the netns launcher starts"
        ) && output.contains("run it without --generators-at"),
        "{output}"
    );
    assert!(!results.exists(), "a results folder was made: {output}");
}

fn generators_share_the_streams_each_sending_whole_ones() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = |load: &str| {
        format!(
            "name = \"gen\"\n[load]\n{load}\ngenerators = 2\n\
             [load.streams]\nmessages = 10\n\
             [[hop]]\nname = \"a\"\nstreaming = \"server\"\n"
        )
    };
    // Server streams in an open loop: each stream is one request for its
    // messages, which the generator that owns it asks for whole. 60
    // messages (10 of warmup) dealt to 2 slots, 10 a stream: 6 streams.
    let open = write(
        dir.path(),
        "open.toml",
        &scenario("mode = \"open\"\nrate = 50\nduration = \"1s\"\nwarmup = \"200ms\"")
            .replace("messages = 10", "streams = 2\nmessages = 10"),
    );
    let ran = accounted(
        tailmesh(dir.path(), &run_args(&open, &dir.path().join("open"), &[])),
        &dir.path().join("open"),
    );
    let (v, context) = (&ran.v, &ran.context);
    assert_eq!(u64_at(v, "/generators/count"), 2, "{context}");
    assert_eq!(
        (u64_at(v, "/sent"), u64_at(v, "/ok")),
        (50, 50),
        "{context}"
    );
    let streams = v.pointer("/streams").expect("the streams' report");
    assert_eq!(
        (u64_at(streams, "/opened"), u64_at(streams, "/completed")),
        (6, 6),
        "{context}"
    );
    assert!(
        context.contains("base: streams: 6 opened (warmup's included), 6 held to their end"),
        "{context}"
    );

    // A closed loop: each generator's workers open streams numbered apart
    // from the other's, so no message's place is taken twice.
    let closed = write(
        dir.path(),
        "closed.toml",
        &scenario("mode = \"closed\"\nconcurrency = 4\nrequests = 60")
            .replace("streaming = \"server\"", "streaming = \"bidi\""),
    );
    let ran = accounted(
        tailmesh(
            dir.path(),
            &run_args(&closed, &dir.path().join("closed"), &[]),
        ),
        &dir.path().join("closed"),
    );
    let (v, context) = (&ran.v, &ran.context);
    assert_eq!(u64_at(v, "/generators/count"), 2, "{context}");
    let rows = requests_csv(&ran.run_dir);
    assert_eq!(rows.len(), 60, "{context}");
    let mut places = std::collections::BTreeSet::new();
    for row in &rows {
        let place = row.stream.expect("a stream's message");
        assert!(places.insert(place), "{place:?} twice:\n{context}");
    }
    let numbers: std::collections::BTreeSet<u64> = places.iter().map(|p| p.0).collect();
    let streams = v.pointer("/streams").expect("the streams' report");
    assert!(
        numbers.len() as u64 <= u64_at(streams, "/opened") && numbers.len() >= 6,
        "{numbers:?}:\n{context}"
    );
    // Both generators' streams: even numbers from the first, odd from the
    // second.
    assert!(numbers.iter().any(|n| n % 2 == 0) && numbers.iter().any(|n| n % 2 == 1));
}
