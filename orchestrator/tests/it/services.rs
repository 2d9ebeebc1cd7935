//! A real gRPC service as a hop's work (`[hop.service]`): the scenario's
//! refusals with their line and column, a service command that exits at
//! once or never gets ready (exit 2 naming the hop and replica, nothing
//! left running), and end to end through the test binary's own Echo server
//! (`support::echo`): a push chain and the same hop pulled, with every
//! request accounted for and the service's time in the path, slowness
//! injected at the service hop as the compounding check sees it, a service
//! answering errors, a service that dies mid-run, nothing left running
//! after the orchestrator's SIGKILL, and the Python example's spans under
//! the sidecar's in traces.jaeger.json, and the shipped server study
//! (`scenarios/servers.toml`, scaled down) over all three examples.
//! Streaming methods: the Python and Node.js examples' bidirectional,
//! server- and client-streaming echoes behind their sidecars, in a mesh of
//! bidi streams (one call per message) and in a unary one; a stream
//! answering the wrong number of replies, or failing one message, fails
//! its calls with that.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;

use crate::support::{
    echo::{self, EchoServer},
    *,
};

tests! {
    sync bad_service_keys_are_refused_with_their_line_and_column,
    sync deployments_refuse_a_service_without_an_image_and_attached_runs_accept_one,
    sync a_service_command_that_exits_at_once_fails_the_run_naming_the_hop,
    sync a_service_that_never_gets_ready_fails_the_run_within_its_ready_timeout,
    sync an_unknown_method_fails_the_run_naming_the_hop,
    sync a_push_and_a_pulled_service_hop_account_for_every_request,
    sync a_service_started_per_replica_gets_its_port_and_environment,
    sync the_load_generator_calls_a_direct_service_without_a_sidecar,
    sync a_hop_calls_a_direct_leaf_service_with_the_requests_deadline,
    sync slowness_at_the_service_hop_is_seen_by_the_compounding_check,
    sync a_service_answering_errors_is_counted_by_code,
    sync a_service_that_dies_mid_run_is_an_incident,
    sync a_service_dies_with_a_killed_orchestrator,
    sync the_python_example_joins_the_trace_under_its_sidecar,
    sync the_shipped_servers_study_compares_four_implementations_side_by_side,
    sync the_examples_streaming_methods_serve_each_message_of_every_kind_of_stream,
    sync the_examples_streaming_methods_serve_each_request_of_a_unary_mesh,
    sync a_stream_of_the_wrong_length_or_a_failed_message_fails_its_calls,
}

/// The load and the first hop of every scenario here; `{hops}` follows.
fn scenario(name: &str, load: &str, hops: &str) -> String {
    format!(
        "name = \"{name}\"\n[load]\n{load}\n[[hop]]\nname = \"a\"\n{hops}\n[check]\nslow_threshold = \"1s\"\n"
    )
}

/// Runs [`scenario`] with errors allowed (`max_error_rate = 1.0`, no
/// slowness threshold) and no traces; every request accounted for.
fn run_allowing_errors(scratch: &Scratch, name: &str, load: &str, hops: &str) -> Accounted {
    let text = format!(
        "{}[check]\nmax_error_rate = 1.0\n",
        scenario(name, load, hops).replace("[check]\nslow_threshold = \"1s\"\n", "")
    );
    let path = write(scratch.path(), "s.toml", &text);
    let out = tailmesh(
        scratch.path(),
        &run_args(&path, &scratch.results(), &["--no-traces"]),
    );
    accounted(out, &scratch.results())
}

/// A closed loop of 2 in flight for `requests` requests.
fn closed(requests: u32) -> String {
    format!("mode = \"closed\"\nconcurrency = 2\nrequests = {requests}\ntimeout = \"2s\"")
}

/// `[hop.service]` keys calling the Echo method with the schema from
/// echo.proto; `source` is `address = ...` or `command = [...]`.
fn echo_service(source: &str, request: &str) -> String {
    format!(
        "[hop.service]\n{source}\nmethod = \"{}\"\nrequest = {request}\nproto = [\"{}\"]\n",
        echo::METHOD,
        echo_proto_str()
    )
}

fn echo_proto_str() -> String {
    echo::echo_proto().display().to_string()
}

/// `command = [...]` starting this test binary as an Echo server on
/// `{port}`, with `extra` arguments.
fn echo_command(extra: &[&str]) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut words = vec![
        exe.display().to_string(),
        echo::FLAG.to_owned(),
        "--port".to_owned(),
        "{port}".to_owned(),
    ];
    words.extend(extra.iter().map(|s| (*s).to_owned()));
    let quoted: Vec<String> = words.iter().map(|w| format!("{w:?}")).collect();
    format!("command = [{}]", quoted.join(", "))
}

/// Every process whose command line holds `marker`, but `except`.
fn processes_with(marker: &str, except: u32) -> Vec<u32> {
    pids_where(|pid| pid != except && runs_ours(pid, marker))
}

/// `tailmesh validate` of `text`: its exit code and its messages.
fn validate(dir: &Path, text: &str) -> (Option<i32>, String) {
    let path = write(dir, "s.toml", text);
    let out = tailmesh(dir, &["validate", path_str(&path)]);
    (out.code(), out.stderr + &out.stdout)
}

fn bad_service_keys_are_refused_with_their_line_and_column() {
    let dir = tempfile::tempdir().expect("temp dir");
    let head = "name = \"s\"\n[load]\nmode = \"closed\"\nconcurrency = 1\nrequests = 5\n";
    // Each case: the hop's lines (from line 6), where the problem is, and
    // words of its message.
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "[[hop]]\nname = \"b\"\n[hop.work]\nkind = \"none\"\n[hop.service]\naddress = \"127.0.0.1:1\"\nmethod = \"p.S/M\"\n",
            "s.toml:8:6",
            &["hop \"b\"", "work cannot go with service"],
        ),
        (
            "[[hop]]\nname = \"b\"\n[hop.service]\naddress = \"127.0.0.1:1\"\nmethod = \"p.S.M\"\n",
            "s.toml:10:10",
            &[
                "service.method",
                "not a full method name",
                "package.Service/Method",
            ],
        ),
        (
            "[[hop]]\nname = \"b\"\n[hop.service]\naddress = \"127.0.0.1:1\"\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\n",
            "s.toml:10:1",
            &["service.command", "cannot go with address"],
        ),
        (
            "[[hop]]\nname = \"b\"\n[hop.service]\nmethod = \"p.S/M\"\n",
            "s.toml:8:1",
            &["needs \"address\"", "or \"command\""],
        ),
        (
            "[[hop]]\nname = \"b\"\nreplicas = 2\n[hop.service]\naddress = \"127.0.0.1:1\"\nmethod = \"p.S/M\"\n",
            "s.toml:10:1",
            &["service.address serves one replica", "replicas = 2"],
        ),
        (
            "[[hop]]\nname = \"b\"\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\nrequest = '{\"a\": }'\n",
            "s.toml:11:11",
            &["service.request is not JSON"],
        ),
        (
            "[[hop]]\nname = \"b\"\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\ntimeout = \"1s\"\n",
            "s.toml:11:1",
            &["unknown key \"timeout\"", "ready_timeout"],
        ),
        (
            "[[hop]]\nname = \"b\"\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\ndirect = true\n[[hop]]\nname = \"c\"\n",
            "s.toml:6:1",
            &["hop \"b\" has service.direct = true", "must be a leaf"],
        ),
        (
            "[[hop]]\nname = \"b\"\nslow = { probability = 0.1, extra = \"1ms\" }\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\ndirect = true\n",
            "s.toml:8:1",
            &["slow cannot go with service.direct = true", "drop direct"],
        ),
        (
            "[[hop]]\nname = \"b\"\ntransport = \"pull\"\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\ndirect = true\n",
            "s.toml:8:1",
            &["transport cannot go with service.direct = true"],
        ),
        (
            "[[hop]]\nname = \"b\"\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"tailmesh.examples.v1.Echo/Echo\"\nproto = [ECHO_PROTO]\nrequests = [{}, {}]\n",
            "s.toml:12:1",
            &[
                "hop \"b\": service.requests for tailmesh.examples.v1.Echo/Echo",
                "a unary method takes one request message",
            ],
        ),
        (
            "[[hop]]\nname = \"b\"\nnet = { loss = 0.01 }\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\n",
            "s.toml:9:6",
            &["hop \"b\"", "not supported yet with the netns launcher"],
        ),
    ];
    for (hop, at, words) in cases {
        let hop = hop.replace("ECHO_PROTO", &format!("{:?}", echo_proto_str()));
        let (code, text) = validate(dir.path(), &format!("{head}{hop}"));
        assert_eq!(code, Some(2), "{hop}\n{text}");
        assert!(
            text.contains(at),
            "expected a problem at {at}:\n{hop}\n{text}"
        );
        for word in *words {
            assert!(text.contains(word), "expected {word:?}:\n{hop}\n{text}");
        }
    }
    // The netns launcher named, and a well-formed table, the same.
    let (code, text) = validate(
        dir.path(),
        &format!(
            "launcher = \"netns\"\n{head}[[hop]]\nname = \"b\"\n[hop.service]\naddress = \"127.0.0.1:9\"\nmethod = \"p.S/M\"\n"
        ),
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("s.toml:9:6") && text.contains("netns"),
        "{text}"
    );
    // A directly called entry hop keeps the load generator's connections.
    let (code, text) = validate(
        dir.path(),
        &format!(
            "{head}connection = \"per_request\"\n[[hop]]\nname = \"b\"\n[hop.service]\ncommand = [\"srv\"]\nmethod = \"p.S/M\"\ndirect = true\n"
        ),
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("s.toml:6:1") && text.contains("load.connection = \"per_request\" cannot go"),
        "{text}"
    );
    // And a good one passes, its request written as a table.
    let (code, text) = validate(
        dir.path(),
        &format!(
            "{head}[[hop]]\nname = \"b\"\n[hop.service]\ncommand = [\"srv\", \"--port\", \"{{port}}\"]\nmethod = \"p.S/M\"\nrequest = {{ message = \"hi\", work_us = 10 }}\nmetadata = {{ tenant = \"t1\" }}\nready_timeout = \"3s\"\n"
        ),
    );
    assert_eq!(code, Some(0), "{text}");
}

/// A deployment runs a service's command in the scenario's image, and has
/// no .proto files: without an image, and with proto, `tailmesh compose`
/// and `tailmesh k8s` refuse the scenario, naming the hop and the key
/// (exit status 2); with an image and reflection, it deploys (the files
/// themselves: `deploy::a_service_hop_deploys_its_service_beside_its_sidecar`).
/// Attached to a deployment, a run no longer refuses a service: it waits
/// for the hops (here, in a network namespace of its own, for nothing).
fn deployments_refuse_a_service_without_an_image_and_attached_runs_accept_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = scenario(
        "svc-deploy",
        &closed(5),
        &format!(
            "[[hop]]\nname = \"b\"\n{}",
            echo_service("command = [\"srv\", \"{port}\"]", "'{}'")
        ),
    );
    let path = write(dir.path(), "s.toml", &text);
    let compose = dir.path().join("compose.yml");
    let k8s = dir.path().join("k8s");
    for args in [
        vec!["compose", path_str(&path), "-o", path_str(&compose)],
        vec!["k8s", path_str(&path), "--out-dir", path_str(&k8s)],
    ] {
        let out = tailmesh(dir.path(), &args);
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.output());
        for words in [
            "hop \"b\": [hop.service] proto: the .proto files are not in the containers",
            "hop \"b\": [hop.service] command runs in a container beside each replica's \
             sidecar",
            "name its image with [hop.service] image",
        ] {
            assert!(out.stderr.contains(words), "{args:?}: {}", out.output());
        }
    }
    assert!(!compose.exists(), "no Compose file for a refused scenario");
    assert!(!k8s.exists(), "no manifests for a refused scenario");

    if !tailmesh_netfault::tool::has_privilege() {
        crate::harness::skip(
            "attaching in a network namespace of its own needs root (unshare --net)",
        );
    }
    let results = dir.path().join("results");
    let out = std::process::Command::new("unshare")
        .arg("--net")
        .arg(TAILMESH)
        .args([
            "run",
            path_str(&path),
            "--attach",
            "--attach-timeout",
            "1s",
            "--no-traces",
            "--results",
            path_str(&results),
        ])
        .output()
        .expect("run unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Not refused (2): the run waited for the service hop, which is not there.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("hop-b-0: service \"hop-b-0\" not ready after 1.0"),
        "{stderr}"
    );
}

fn a_service_command_that_exits_at_once_fails_the_run_naming_the_hop() {
    let scratch = Scratch::new();
    let text = scenario(
        "svc-exits",
        &closed(10),
        &format!(
            "[[hop]]\nname = \"b\"\n{}",
            echo_service(
                "command = [\"sh\", \"-c\", \"echo 'no such flag: --bogus' >&2; exit 3\"]",
                "'{}'"
            )
        ),
    );
    let path = write(scratch.path(), "s.toml", &text);
    let out = tailmesh(scratch.path(), &run_args(&path, &scratch.results(), &[]));
    let said = out.output();
    assert_eq!(out.code(), Some(2), "{said}");
    for words in [
        "hop \"b\" replica 0",
        "hop-b-0.service",
        "exited before it was ready (exit status 3)",
        "no such flag: --bogus",
    ] {
        assert!(out.stderr.contains(words), "expected {words:?}:\n{said}");
    }
    // Its log is in the run folder, under the replica's name.
    let logs = find_files(&scratch.results(), "hop-b-0.service.log");
    assert_eq!(logs.len(), 1, "{said}");
    assert!(read_lossy(&logs[0]).contains("no such flag"));
}

fn a_service_that_never_gets_ready_fails_the_run_within_its_ready_timeout() {
    let scratch = Scratch::new();
    // Python sleeping, its command line marked with the scratch folder.
    let command = format!(
        "command = [\"python3\", \"-c\", \"import sys, time; time.sleep(60)\", \"{}\"]\nready_timeout = \"1s\"",
        scratch.marker()
    );
    let text = scenario(
        "svc-never",
        &closed(10),
        &format!("[[hop]]\nname = \"b\"\n{}", echo_service(&command, "'{}'")),
    );
    let path = write(scratch.path(), "s.toml", &text);
    if find_in_path("python3").is_none() {
        crate::harness::skip("python3 is not installed (the test's never-ready service)");
    }
    let out = tailmesh(scratch.path(), &run_args(&path, &scratch.results(), &[]));
    let said = out.output();
    assert_eq!(out.code(), Some(2), "{said}");
    for words in [
        "hop \"b\" replica 0",
        "hop-b-0.service",
        "not ready after 1.0",
    ] {
        assert!(out.stderr.contains(words), "expected {words:?}:\n{said}");
    }
    // The launcher killed it before it gave up.
    let left = processes_with(scratch.marker(), std::process::id());
    assert!(left.is_empty(), "left running: {left:?}\n{said}");
}

fn an_unknown_method_fails_the_run_naming_the_hop() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    let text = scenario(
        "svc-method",
        &closed(10),
        &format!(
            "[[hop]]\nname = \"b\"\n[hop.service]\naddress = \"{}\"\nmethod = \"tailmesh.examples.v1.Echo/Nope\"\nproto = [\"{}\"]\n",
            server.addr,
            echo_proto_str()
        ),
    );
    let path = write(scratch.path(), "s.toml", &text);
    let out = tailmesh(scratch.path(), &run_args(&path, &scratch.results(), &[]));
    let said = out.output();
    assert_eq!(out.code(), Some(2), "{said}");
    assert!(
        out.stderr.contains("hop \"b\" replica 0") && out.stderr.contains("Nope"),
        "{said}"
    );
    assert_eq!(server.calls(), 0, "{said}");
}

/// A chain a -> b (the service hop) -> c, b pushed and, in the second
/// variant, pulled from the broker.
fn chain_through(service: &str, b_extra: &str, requests: u32) -> String {
    let variants = "[[variant]]\nname = \"push\"\n[[variant]]\nname = \"pull\"\nset = { \"hop.b.transport\" = \"pull\" }\n";
    format!(
        "{}{variants}",
        scenario(
            "svc-chain",
            &closed(requests),
            &format!("[[hop]]\nname = \"b\"\n{b_extra}{service}[[hop]]\nname = \"c\"\n"),
        )
    )
}

fn a_push_and_a_pulled_service_hop_account_for_every_request() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    let service = echo_service(
        &format!("address = \"{}\"", server.addr),
        "{ message = \"hi\", work_us = 3000 }",
    );
    let path = write(scratch.path(), "s.toml", &chain_through(&service, "", 60));
    let out = tailmesh(
        scratch.path(),
        &run_args(&path, &scratch.results(), &["--no-traces"]),
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let run_dir = only_run_dir(&scratch.results());
    let summary = summary(&run_dir);
    let by_name = variants_by_name(&summary);
    let mut ok_total = 0;
    for name in ["push", "pull"] {
        let v = by_name[name];
        let context = format!("variant {name}: {v:#}\n{}", out.output());
        assert_accounted(v, &context);
        let ok = u64_at(v, "/ok");
        assert_eq!(ok, u64_at(v, "/sent"), "{context}");
        ok_total += ok;
        let b = hop(v, "b");
        // Every request went through the service hop and on to c.
        assert_eq!(u64_at(b, "/requests"), ok, "{context}");
        assert_eq!(u64_at(hop(v, "c"), "/requests"), ok, "{context}");
        // The service's 3 ms of work is the hop's service time.
        assert!(u64_at(b, "/service/min_us") >= 3000, "{context}");
        assert!(
            u64_at(b, "/total/min_us") >= u64_at(b, "/service/min_us"),
            "{context}"
        );
        assert!(u64_at(hop(v, "c"), "/service/max_us") < 3000, "{context}");
        // summary.json says which hop is a real service.
        assert_eq!(str_at(b, "/grpc_service/method"), echo::METHOD, "{context}");
        assert_eq!(
            str_at(b, "/grpc_service/address"),
            server.addr.to_string(),
            "{context}"
        );
        assert!(
            str_at(b, "/grpc_service/schema").contains("echo.proto"),
            "{context}"
        );
        assert!(hop(v, "a").get("grpc_service").is_none(), "{context}");
    }
    // The report's hop table names the service.
    let report = read_lossy(&run_dir.join("report.html"));
    assert!(
        report.contains(&format!("b<br><small>service {}</small>", echo::METHOD)),
        "report.html does not name the service"
    );
    // Warmup is none: the service answered every request, and no more.
    assert_eq!(server.calls(), ok_total);
    assert_eq!(
        server
            .seen
            .with_deadline
            .load(std::sync::atomic::Ordering::SeqCst),
        ok_total,
        "every call carried the request's deadline"
    );
}

fn a_service_started_per_replica_gets_its_port_and_environment() {
    let scratch = Scratch::new();
    // The scratch folder on its command line tells its processes apart;
    // without a health service it is ready once it answers a call at all.
    let service = echo_service(
        &echo_command(&["--no-health", "--tag", scratch.marker()]),
        "{ work_us = 500 }",
    );
    // c, which b's services are told about, has two replicas.
    let text = scenario(
        "svc-command",
        &closed(40),
        &format!(
            "[[hop]]\nname = \"b\"\nreplicas = 2\n{service}[[hop]]\nname = \"c\"\nreplicas = 2\n"
        ),
    );
    let path = write(scratch.path(), "s.toml", &text);
    let out = tailmesh(scratch.path(), &run_args(&path, &scratch.results(), &[]));
    let accounted = accounted(out, &scratch.results());
    let (v, context) = (&accounted.v, &accounted.context);
    assert_eq!(u64_at(v, "/ok"), u64_at(v, "/sent"), "{context}");
    let b = hop(v, "b");
    // Round robin over two sidecars, each calling its own service.
    let split = replica_requests(b);
    assert_eq!(split.len(), 2, "{context}");
    assert!(split.iter().all(|&n| n > 0), "{context}");
    assert!(u64_at(b, "/service/min_us") >= 500, "{context}");
    assert!(b["grpc_service"]["command"].is_array(), "{context}");
    let logs = accounted.run_dir.join("logs").join("base");
    for replica in 0..2 {
        let log = read_lossy(&logs.join(format!("hop-b-{replica}.service.log")));
        let port = log
            .split("echo server: port ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .unwrap_or_else(|| panic!("replica {replica} did not start: {log}"));
        for words in [
            format!("PORT={port} "),
            "TAILMESH_HOP=b ".to_owned(),
            format!("TAILMESH_REPLICA={replica} "),
            "OTEL_SERVICE_NAME=hop-b-service".to_owned(),
        ] {
            assert!(
                log.contains(&words),
                "replica {replica}: {words:?} in {log}"
            );
        }
        // Its sidecar was configured with its address.
        let config = read_lossy(&logs.join(format!("hop-b-{replica}.json")));
        assert!(
            config.contains(&format!("127.0.0.1:{port}")),
            "replica {replica}: {config}"
        );
        // It was told where its downstream hop's replicas are: those its
        // sidecar calls.
        let config: Value = serde_json::from_str(&config).expect("hop config JSON");
        let c: Vec<&str> = config["downstream"][0]["replicas"]
            .as_array()
            .expect("c's replicas")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(c.len(), 2, "{config:#}");
        for words in [
            format!("TAILMESH_DOWNSTREAM={} ", c.join(",")),
            format!("TAILMESH_DOWNSTREAM_C={} ", c.join(",")),
        ] {
            assert!(
                log.contains(&words),
                "replica {replica}: {words:?} in {log}"
            );
        }
    }
    // Stopped with the run: nothing of it is left.
    let left = processes_with(scratch.marker(), std::process::id());
    assert!(left.is_empty(), "left running: {left:?}\n{context}");
}

/// `[hop.service]` with `direct = true` after `source`.
fn direct_service(source: &str, request: &str) -> String {
    echo_service(&format!("{source}\ndirect = true"), request)
}

fn the_load_generator_calls_a_direct_service_without_a_sidecar() {
    let scratch = Scratch::new();
    // Hop a is the service itself, two replicas started by the run.
    let service = direct_service(
        &echo_command(&["--tag", scratch.marker()]),
        "{ work_us = 500 }",
    );
    let text = scenario(
        "svc-direct",
        &closed(40),
        &format!("replicas = 2\n{service}"),
    );
    let path = write(scratch.path(), "s.toml", &text);
    let out = tailmesh(scratch.path(), &run_args(&path, &scratch.results(), &[]));
    let accounted = accounted(out, &scratch.results());
    let (v, context) = (&accounted.v, &accounted.context);
    assert_eq!(u64_at(v, "/ok"), u64_at(v, "/sent"), "{context}");
    let a = hop(v, "a");
    // The load generator's own record of the hop: its replicas in turn,
    // the call's time (at least the service's work) as the hop's time.
    assert_eq!(str_at(a, "/transport"), "direct", "{context}");
    assert_eq!(u64_at(a, "/requests"), u64_at(v, "/ok"), "{context}");
    assert_eq!(
        a["replica_requests"],
        serde_json::json!([20, 20]),
        "{context}"
    );
    assert!(u64_at(a, "/service/min_us") >= 500, "{context}");
    assert_eq!(a["grpc_service"]["direct"], Value::Bool(true), "{context}");
    // Services, and no hop process in front of them.
    let logs = accounted.run_dir.join("logs").join("base");
    for replica in 0..2 {
        assert!(
            logs.join(format!("hop-a-{replica}.service.log")).exists(),
            "replica {replica}: {context}"
        );
        assert!(
            !logs.join(format!("hop-a-{replica}.json")).exists(),
            "replica {replica} has a sidecar: {context}"
        );
    }
    let left = processes_with(scratch.marker(), std::process::id());
    assert!(left.is_empty(), "left running: {left:?}\n{context}");
}

fn a_hop_calls_a_direct_leaf_service_with_the_requests_deadline() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    let service = direct_service(
        &format!("address = \"{}\"", server.addr),
        "{ message = \"hi\", work_us = 1000 }",
    );
    let accounted = run_allowing_errors(
        &scratch,
        "svc-direct-leaf",
        &closed(30),
        &format!("[[hop]]\nname = \"b\"\n{service}"),
    );
    let (v, context) = (&accounted.v, &accounted.context);
    let ok = u64_at(v, "/ok");
    assert_eq!(ok, u64_at(v, "/sent"), "{context}");
    let b = hop(v, "b");
    assert_eq!(str_at(b, "/transport"), "direct", "{context}");
    assert_eq!(u64_at(b, "/requests"), ok, "{context}");
    assert!(u64_at(b, "/service/min_us") >= 1000, "{context}");
    // a's time includes its call to b.
    assert!(
        u64_at(hop(v, "a"), "/total/min_us") >= u64_at(b, "/service/min_us"),
        "{context}"
    );
    // Hop a called the service once per request, with its deadline.
    assert_eq!(server.calls(), ok, "{context}");
    assert_eq!(
        server
            .seen
            .with_deadline
            .load(std::sync::atomic::Ordering::SeqCst),
        ok,
        "{context}"
    );
}

fn slowness_at_the_service_hop_is_seen_by_the_compounding_check() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    let service = echo_service(
        &format!("address = \"{}\"", server.addr),
        "{ work_us = 200 }",
    );
    let text = format!(
        "name = \"svc-slow\"\nseed = 5\n[load]\nmode = \"open\"\nrate = 100\nrequests = 300\ntimeout = \"2s\"\n\
         [[hop]]\nname = \"a\"\n[[hop]]\nname = \"b\"\nslow = {{ probability = 0.2, extra = \"30ms\" }}\n{service}\
         [[hop]]\nname = \"c\"\n[check]\nslow_threshold = \"15ms\"\ncompounding = true\n"
    );
    let path = write(scratch.path(), "s.toml", &text);
    let out = tailmesh(
        scratch.path(),
        &run_args(&path, &scratch.results(), &["--no-traces"]),
    );
    let accounted = accounted(out, &scratch.results());
    let (v, context) = (&accounted.v, &accounted.context);
    let b = hop(v, "b");
    let slowed = u64_at(b, "/slow");
    assert!(slowed > 0, "p = 0.2 slowed nothing: {context}");
    let compounding = v.pointer("/compounding").expect("compounding requested");
    // Every request slowed at the service hop (30 ms against a 15 ms
    // threshold) is among the slow ones the check counts.
    let rows = requests_csv(&accounted.run_dir);
    let slowed_rows = rows
        .iter()
        .filter(|r| r.slow_hops.iter().any(|h| h == "b"))
        .count() as u64;
    assert_eq!(slowed_rows, slowed, "{context}");
    assert!(u64_at(compounding, "/slow") >= slowed, "{context}");
    // The model is built from the service hop's own slowness: 1 - (1 - 0.2).
    let declared = compounding
        .pointer("/declared_model")
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no declared model: {context}"));
    assert!((declared - 0.2).abs() < 1e-9, "{context}");
    assert_ne!(str_at(compounding, "/verdict"), "fail", "{context}");
}

fn a_service_answering_errors_is_counted_by_code() {
    let scratch = Scratch::new();
    let server = EchoServer::start();
    // FAILED_PRECONDITION (9): a code tailmesh itself never answers with.
    let service = echo_service(
        &format!("address = \"{}\"", server.addr),
        "'{\"fail_code\": 9}'",
    );
    let accounted = run_allowing_errors(
        &scratch,
        "svc-errors",
        &closed(30),
        &format!("[[hop]]\nname = \"b\"\n{service}[[hop]]\nname = \"c\"\n"),
    );
    let (v, context) = (&accounted.v, &accounted.context);
    let sent = u64_at(v, "/sent");
    assert_eq!(
        errors(v).get("failed_precondition").copied(),
        Some(sent),
        "{context}"
    );
    assert_eq!(u64_at(v, "/ok"), 0, "{context}");
    // The error stopped at the service hop: c never saw a request.
    assert_eq!(server.calls(), sent, "{context}");
    assert_eq!(u64_at(hop(v, "c"), "/requests"), 0, "{context}");
}

fn a_service_that_dies_mid_run_is_an_incident() {
    let scratch = Scratch::new();
    let service = echo_service(&echo_command(&["--exit-after", "20"]), "{}");
    let accounted = run_allowing_errors(
        &scratch,
        "svc-dies",
        "mode = \"open\"\nrate = 100\nrequests = 100\ntimeout = \"1s\"",
        &format!("[[hop]]\nname = \"b\"\n{service}"),
    );
    let (v, context) = (&accounted.v, &accounted.context);
    // It answered 20 calls and died on the 21st: the rest failed.
    assert_eq!(u64_at(v, "/ok"), 20, "{context}");
    let incidents: Vec<&str> = v
        .pointer("/incidents")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        incidents
            .iter()
            .any(|i| i.contains("hop-b-0.service") && i.contains("exit status 7")),
        "{context}"
    );
}

/// SIGKILL of the orchestrator leaves nothing: its hops read EOF on their
/// stdin, its services get their parent-death signal (setpriv).
fn a_service_dies_with_a_killed_orchestrator() {
    if find_in_path("setpriv").is_none() {
        crate::harness::skip("util-linux's setpriv is not installed (the parent-death signal)");
    }
    let scratch = Scratch::new();
    let service = echo_service(&echo_command(&["--tag", scratch.marker()]), "{}");
    let text = scenario(
        "svc-orphan",
        "mode = \"open\"\nrate = 50\nduration = \"60s\"",
        &format!("[[hop]]\nname = \"b\"\n{service}"),
    );
    let path = write(scratch.path(), "s.toml", &text);
    let mut running = Running::start(
        scratch.path(),
        &run_args(&path, &scratch.results(), &["--no-traces"]),
    );
    let results = scratch.results();
    let service_pid = running.wait_for("the service's pid file", || {
        pid_files(&results)
            .get(&("base".to_owned(), "hop-b-0.service".to_owned()))
            .copied()
            .filter(|&pid| runs_ours(pid, scratch.marker()))
    });
    // The load is running once the entry hop has written its pid too.
    running.wait_for("the hops' pid files", || {
        pid_files(&results)
            .contains_key(&("base".to_owned(), "hop-a-0".to_owned()))
            .then_some(())
    });
    let orchestrator = running.pid();
    kill(Pid::from_raw(orchestrator as i32), Signal::SIGKILL).expect("SIGKILL tailmesh");
    wait_until(
        after(Duration::from_secs(15)),
        later(|| {
            format!(
                "every process of the run to exit after the orchestrator's SIGKILL: \
                 {:?} left (the service was {service_pid})",
                processes_with(scratch.marker(), std::process::id())
            )
        }),
        || {
            processes_with(scratch.marker(), std::process::id())
                .is_empty()
                .then_some(())
        },
    );
    assert!(!runs_ours(service_pid, scratch.marker()));
}

/// The Python example's interpreter, when examples/servers/setup.sh made
/// its virtual environment.
fn python_example() -> Option<(PathBuf, PathBuf)> {
    let servers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/servers");
    let python = servers.join(".venv/bin/python");
    let server = servers.join("python/server.py");
    (python.is_file() && server.is_file()).then_some((python, server))
}

fn the_python_example_joins_the_trace_under_its_sidecar() {
    let Some((python, server)) = python_example() else {
        crate::harness::skip(
            "examples/servers/.venv is absent: run examples/servers/setup.sh for the Python \
             example",
        );
    };
    let scratch = Scratch::new();
    let command = format!(
        "command = [{:?}, {:?}, \"--port\", \"{{port}}\"]\nready_timeout = \"30s\"",
        python.display().to_string(),
        server.display().to_string()
    );
    let service = echo_service(&command, "{ message = \"hi\", work_us = 1000 }");
    // A share of the traces kept: the rest are dropped, and the service's
    // SDK, which sends every span it makes, has those held and evicted at
    // the receiver.
    let text = scenario(
        "svc-traces",
        &closed(20),
        &format!("[[hop]]\nname = \"b\"\n{service}"),
    ) + "[telemetry]\nkeep_share = 0.3\n";
    let path = write(scratch.path(), "s.toml", &text);
    let out = tailmesh(scratch.path(), &run_args(&path, &scratch.results(), &[]));
    let accounted = accounted(out, &scratch.results());
    let (v, context) = (&accounted.v, &accounted.context);
    assert_eq!(u64_at(v, "/ok"), u64_at(v, "/sent"), "{context}");
    let traces = jaeger_traces(&accounted.run_dir);
    assert!(!traces.is_empty(), "{context}");
    // In every trace with a span of the service, that span's parent is the
    // sidecar's (hop-b's) client span of the call, child of its server
    // span.
    let mut under_sidecar = 0;
    for trace in &traces {
        let spans = trace["spans"].as_array().expect("spans");
        let service_of = |span: &Value| {
            let pid = span["processID"].as_str().unwrap_or_default();
            trace["processes"][pid]["serviceName"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        let parent_of = |span: &Value| {
            let parent = span["references"]
                .as_array()
                .and_then(|r| r.first())
                .and_then(|r| r["spanID"].as_str())
                .unwrap_or_else(|| panic!("the span has no parent: {span:#}"))
                .to_owned();
            spans
                .iter()
                .find(|s| s["spanID"] == parent.as_str())
                .unwrap_or_else(|| panic!("its parent {parent} is not in the trace"))
        };
        for span in spans.iter().filter(|s| service_of(s) == "hop-b-service") {
            let client = parent_of(span);
            assert_eq!(service_of(client), "hop-b", "{span:#}");
            assert_eq!(
                client["operationName"], "b -> tailmesh.examples.v1.Echo.Echo",
                "{client:#}"
            );
            let server = parent_of(client);
            assert_eq!(service_of(server), "hop-b", "{client:#}");
            assert_ne!(server["spanID"], client["spanID"]);
            under_sidecar += 1;
        }
    }
    // Every kept trace has its request's one call to the service, and
    // the dropped traces' spans of the service stopped at the receiver.
    assert_eq!(
        under_sidecar,
        traces.len(),
        "spans of the Python service in {} traces: {context}",
        traces.len()
    );
    let t = &v["traces"];
    assert!(u64_at(t, "/sampling/dropped") > 0, "{t:#}");
    assert!(u64_at(t, "/held/evicted_at_receiver") > 0, "{t:#}");
    assert_eq!(u64_at(t, "/lost"), 0, "{t:#}");
}

/// What examples/servers/setup.sh makes, by implementation, when it is
/// missing: the Python virtualenv, the Node.js modules, the C++ binary.
fn examples_missing() -> Vec<&'static str> {
    let servers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/servers");
    [
        ("python", ".venv/bin/python"),
        ("node", "node/node_modules/@grpc/grpc-js"),
        ("cpp", "cpp/build/echo-server"),
    ]
    .into_iter()
    .filter(|(_, made)| !servers.join(made).exists())
    .map(|(name, _)| name)
    .chain(
        find_in_path("node")
            .is_none()
            .then_some("node (the command)"),
    )
    .collect()
}

fn the_shipped_servers_study_compares_four_implementations_side_by_side() {
    let missing = examples_missing();
    if !missing.is_empty() {
        crate::harness::skip(format!(
            "example servers not set up ({}): run examples/servers/setup.sh",
            missing.join(", ")
        ));
    }
    let scratch = Scratch::new();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/servers.toml"
    ))
    .expect("read the shipped servers scenario");
    let scaled = shipped
        .replace("requests = 5000", "requests = 60")
        .replace("warmup = \"500ms\"", "warmup = \"100ms\"")
        .replace("\"../examples/", &format!("\"{}/", examples.display()));
    assert!(
        scaled.contains("requests = 60")
            && scaled.contains("warmup = \"100ms\"")
            && !scaled.contains("\"../examples/"),
        "the scenario's load keys or paths changed: update this test\n{scaled}"
    );
    let path = write(scratch.path(), "servers.toml", &scaled);
    let out = tailmesh(scratch.path(), &run_args(&path, &scratch.results(), &[]));
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let run_dir = only_run_dir(&scratch.results());
    let summary = summary(&run_dir);
    let by_name = variants_by_name(&summary);
    let implementations = ["tailmesh", "python", "node", "cpp"];
    let in_flight = [1, 2, 4, 8];
    assert_eq!(by_name.len(), 16, "{:?}", by_name.keys());
    for implementation in implementations {
        for c in in_flight {
            let name = format!("{implementation}-concurrency-{c}");
            let v = by_name
                .get(name.as_str())
                .unwrap_or_else(|| panic!("no variant {name}: {:?}", by_name.keys()));
            let context = format!("{v:#}\n{}", out.output());
            assert_accounted(v, &context);
            assert_eq!(u64_at(v, "/ok"), 60, "{context}");
            assert_eq!(u64_at(v, "/load/concurrency"), c, "{context}");
            // tailmesh's own hop is pushed to; every example is called
            // directly, with no sidecar in front of it.
            let expected = if implementation == "tailmesh" {
                "push"
            } else {
                "direct"
            };
            assert_eq!(
                str_at(hop(v, "server"), "/transport"),
                expected,
                "{context}"
            );
        }
    }
    // The report's side-by-side table: a column per implementation, a row
    // per in-flight count, every cell measured.
    let html = std::fs::read_to_string(run_dir.join("report.html")).expect("read report.html");
    let table = html
        .split_once("<table id=\"sweep-side-by-side\">")
        .and_then(|(_, rest)| rest.split_once("</table>"))
        .map(|(table, _)| table)
        .unwrap_or_else(|| panic!("no side-by-side table in report.html"));
    for implementation in implementations {
        assert!(
            table.contains(&format!("<th>{implementation} p50 / p99</th>")),
            "no column for {implementation}: {table}"
        );
    }
    for c in in_flight {
        assert!(
            table.contains(&format!("<tr><td>{c}</td>")),
            "no row for {c}: {table}"
        );
    }
    assert!(
        !table.contains("<td>-</td>"),
        "a cell without a measurement: {table}"
    );
    assert!(
        html.contains("id=\"sweep-distributions\"") && html.contains("id=\"sweep-spectra\""),
        "the report lacks the side-by-side charts"
    );
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// `command = [...]` of the example server `implementation` (`python` or
/// `node`) on `{port}`, with the time it may take to start; the test is
/// skipped when examples/servers/setup.sh has not made it.
fn example_command(implementation: &str) -> String {
    let missing = examples_missing();
    if let Some(why) = missing.iter().find(|m| m.starts_with(implementation)) {
        crate::harness::skip(format!(
            "the {implementation} example server is not set up ({why} missing): run \
             examples/servers/setup.sh {implementation}"
        ));
    }
    let servers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/servers");
    let (program, script) = match implementation {
        "python" => (
            servers.join(".venv/bin/python").display().to_string(),
            servers.join("python/server.py"),
        ),
        _ => ("node".to_owned(), servers.join("node/server.js")),
    };
    format!(
        "command = [{program:?}, {:?}, \"--port\", \"{{port}}\"]\nready_timeout = \"30s\"",
        script.display().to_string()
    )
}

/// `[hop.service]` keys calling the Echo service's `method` with `keys`
/// (`request = ...` or `requests = [...]`, `replies = N`), the schema from
/// echo.proto.
fn echo_method(source: &str, method: &str, keys: &str) -> String {
    format!(
        "[hop.service]\n{source}\nmethod = \"tailmesh.examples.v1.Echo/{method}\"\n{keys}\nproto = [\"{}\"]\n",
        echo_proto_str()
    )
}

/// An open loop of bidi streams: 2 streams of 20 messages, 40 a second.
const STREAMS_LOAD: &str = "mode = \"open\"\nrate = 40\nduration = \"1s\"\ntimeout = \"2s\"\n\
                            [load.streams]\nstreams = 2\nmessages = 20";

/// Asserts that every request was answered OK and passed `service_hops`,
/// each of whose service times is at least its `min_us` (its messages'
/// work, done once per request).
fn assert_served_by(v: &Value, context: &str, service_hops: &[(&str, u64)]) {
    let sent = u64_at(v, "/sent");
    assert_eq!(u64_at(v, "/ok"), sent, "{context}");
    for (name, min_us) in service_hops {
        let h = hop(v, name);
        assert_eq!(u64_at(h, "/requests"), sent, "hop {name}: {context}");
        assert!(
            u64_at(h, "/service/min_us") >= *min_us,
            "hop {name}'s service time under {min_us} us: {context}"
        );
    }
}

/// A mesh of streams of each kind (bidi, server, client), a -> b -> c,
/// where b calls the example's bidirectional echo (two messages each
/// taking 1 ms, two replies) and c its server-streaming echo (three
/// replies of 0.5 ms each) for every message of the load's streams.
fn the_examples_streaming_methods_serve_each_message_of_every_kind_of_stream() {
    for implementation in ["python", "node"] {
        let command = example_command(implementation);
        let bidi = echo_method(
            &command,
            "EchoStream",
            "requests = [{ message = \"x\", work_us = 1000 }, { message = \"y\", work_us = 1000 }]\n\
             replies = 2",
        );
        let server = echo_method(
            &command,
            "EchoServerStream",
            "request = { message = \"s\", work_us = 500, replies = 3 }\nreplies = 3",
        );
        for kind in ["bidi", "server", "client"] {
            let scratch = Scratch::shared();
            let accounted = run_allowing_errors(
                &scratch,
                &format!("svc-{kind}-{implementation}"),
                STREAMS_LOAD,
                &format!(
                    "streaming = \"{kind}\"\n[[hop]]\nname = \"b\"\nstreaming = \"{kind}\"\n\
                     {bidi}[[hop]]\nname = \"c\"\nstreaming = \"{kind}\"\n{server}"
                ),
            );
            let (v, context) = (&accounted.v, &accounted.context);
            let context = format!("{implementation}, {kind} streams: {context}");
            assert_eq!(u64_at(v, "/sent"), 40, "{context}");
            assert_served_by(v, &context, &[("b", 2000), ("c", 1500)]);
            let streams = v.pointer("/streams").expect("the streams' report");
            assert_eq!(u64_at(streams, "/completed"), 2, "{context}");
        }
    }
}

/// A unary chain, a -> b -> c, where b calls the example's
/// client-streaming echo (two messages of 1 ms, one reply) and c its
/// bidirectional echo (three messages of 0.5 ms, three replies) once per
/// request.
fn the_examples_streaming_methods_serve_each_request_of_a_unary_mesh() {
    for implementation in ["python", "node"] {
        let command = example_command(implementation);
        let scratch = Scratch::shared();
        let client = echo_method(
            &command,
            "EchoClientStream",
            "requests = [{ message = \"p\", work_us = 1000 }, { message = \"q\", work_us = 1000 }]",
        );
        let bidi = echo_method(
            &command,
            "EchoStream",
            "requests = '[{\"workUs\": 500}, {\"workUs\": 500}, {\"workUs\": 500}]'\nreplies = 3",
        );
        let accounted = run_allowing_errors(
            &scratch,
            &format!("svc-unary-{implementation}"),
            &closed(30),
            &format!("[[hop]]\nname = \"b\"\n{client}[[hop]]\nname = \"c\"\n{bidi}"),
        );
        let (v, context) = (&accounted.v, &accounted.context);
        let context = format!("{implementation}: {context}");
        assert_eq!(u64_at(v, "/sent"), 30, "{context}");
        assert_served_by(v, &context, &[("b", 2000), ("c", 1500)]);
    }
}

/// Through the test binary's own Echo server, in a mesh of bidi streams:
/// a stream answering two replies where `replies = 3` fails every call
/// with INTERNAL naming the method and both counts; a stream whose second
/// message asks for FAILED_PRECONDITION fails every call with that code.
/// Each failure is its message's, in band: the load's streams hold.
fn a_stream_of_the_wrong_length_or_a_failed_message_fails_its_calls() {
    let server = EchoServer::start();
    let address = format!("address = \"{}\"", server.addr);
    let cases = [
        (
            "svc-stream-count",
            "requests = [{ message = \"a\" }, { message = \"b\" }]\nreplies = 3",
            "internal",
            "tailmesh.examples.v1.Echo.EchoStream answered with 2 reply messages, expected \
             replies = 3",
        ),
        (
            "svc-stream-fails",
            "requests = [{ message = \"a\" }, { message = \"b\", fail_code = 9 }]",
            "failed_precondition",
            "asked to fail",
        ),
    ];
    for (name, keys, code, words) in cases {
        let scratch = Scratch::new();
        let service = echo_method(&address, "EchoStream", keys);
        let accounted = run_allowing_errors(
            &scratch,
            name,
            STREAMS_LOAD,
            &format!(
                "streaming = \"bidi\"\n[[hop]]\nname = \"b\"\nstreaming = \"bidi\"\n{service}"
            ),
        );
        let (v, context) = (&accounted.v, &accounted.context);
        let sent = u64_at(v, "/sent");
        assert_eq!(sent, 40, "{context}");
        assert_eq!(
            errors(v).get(code).copied(),
            Some(sent),
            "{name}: {context}"
        );
        let streams = v.pointer("/streams").expect("the streams' report");
        assert_eq!(u64_at(streams, "/completed"), 2, "{name}: {context}");
        let rows = requests_csv(&accounted.run_dir);
        assert!(!rows.is_empty(), "{name}: {context}");
        for row in &rows {
            assert!(
                row.error.contains("hop \"b\"") && row.error.contains(words),
                "{name}: {row:?}"
            );
        }
    }
}
