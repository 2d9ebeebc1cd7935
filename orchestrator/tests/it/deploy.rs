//! Deployment files: the committed docker-compose.yml and deploy/k8s/ are
//! what `tailmesh compose` and `tailmesh k8s` generate from
//! scenarios/default.toml; the manifests pass the Kubernetes schemas
//! (kubernetes-validate, offline) and the Compose file `docker compose
//! config`; undeployable scenarios are refused with the reason; and a hop
//! started the way a container starts it (`tailmesh hop --scenario`)
//! serves and answers `tailmesh health`; with TLS, the certificate folder
//! and Secret, and an attached mTLS run by service names (root).
//!
//! The running Compose deployment itself is exercised by CI (`.ci/docker`),
//! which needs a Docker engine. Without kubernetes-validate or docker
//! compose the schema checks skip with a message, unless
//! TAILMESH_REQUIRE_ALL=1 (CI), where a skip is a failure.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use crate::{harness::skip, support::*};
use tailmesh::deploy::{compose, k8s};

tests! {
    sync the_committed_compose_file_is_the_generated_form_of_the_default_scenario,
    sync the_committed_manifests_are_the_generated_form_of_the_default_scenario,
    sync every_shipped_scenario_generates_manifests_that_pass_the_kubernetes_schemas,
    sync the_committed_compose_file_passes_docker_compose_config,
    sync the_docker_tests_pass_or_skip_with_compose_without_it_and_without_any_client,
    sync undeployable_scenarios_are_refused_with_what_and_where,
    sync a_hop_started_as_a_container_starts_it_serves_and_answers_health_checks,
    sync the_token_service_writes_a_private_token_once,
    sync attaching_to_a_missing_deployment_names_the_service_it_waited_for,
    sync a_tls_scenario_deploys_with_a_certificate_folder_per_service_and_a_secret,
    sync k8s_with_a_ca_folder_generates_the_same_secret_again_and_keeps_keys_off_terminals,
    sync a_tls_hop_started_as_a_container_reads_its_folder_and_answers_health_over_tls,
    sync an_attached_mtls_run_reaches_each_hop_by_its_service_name_with_the_folders,
    sync deployed_hops_hold_their_spans_for_each_attached_runs_decisions,
    sync a_service_hop_deploys_its_service_beside_its_sidecar,
    sync a_service_hop_started_as_its_container_starts_it_waits_for_its_service,
    sync compose_starts_a_container_per_load_generator_and_the_orchestrator_awaits_them,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn default_scenario() -> (tailmesh::scenario::Scenario, String) {
    let path = repo().join("scenarios/default.toml");
    let text = std::fs::read_to_string(&path).expect("read scenarios/default.toml");
    let scenario = tailmesh::scenario::parse(&text, "scenarios/default.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    (scenario, text)
}

fn the_committed_compose_file_is_the_generated_form_of_the_default_scenario() {
    let (scenario, text) = default_scenario();
    let generated =
        compose::generate(&scenario, &text, &compose::Options::default()).expect("generate");
    let committed = std::fs::read_to_string(repo().join("docker-compose.yml"))
        .expect("read docker-compose.yml");
    assert!(
        generated == committed,
        "docker-compose.yml is not what scenarios/default.toml generates; run\n  \
         cargo run -- compose scenarios/default.toml -o docker-compose.yml\n\
         first differing line: {:?}",
        first_difference(&generated, &committed)
    );
}

fn the_committed_manifests_are_the_generated_form_of_the_default_scenario() {
    let (scenario, text) = default_scenario();
    let generated = k8s::generate(&scenario, &text, &k8s::Options::default())
        .expect("generate")
        .files;
    let dir = repo().join("deploy/k8s");
    let mut committed: Vec<String> = std::fs::read_dir(&dir)
        .expect("read deploy/k8s")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    committed.sort();
    let names: Vec<String> = generated.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(
        committed, names,
        "deploy/k8s holds other files than generated"
    );
    for (name, body) in &generated {
        let on_disk = std::fs::read_to_string(dir.join(name)).expect("read a manifest");
        assert!(
            *body == on_disk,
            "deploy/k8s/{name} is not what scenarios/default.toml generates; run\n  \
             cargo run -- k8s scenarios/default.toml --out-dir deploy/k8s\n\
             first differing line: {:?}",
            first_difference(body, &on_disk)
        );
    }
}

fn first_difference(a: &str, b: &str) -> Option<(usize, String, String)> {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (None, None) => return None,
            (x, y) if x != y => {
                return Some((
                    n,
                    x.unwrap_or("<end>").to_owned(),
                    y.unwrap_or("<end>").to_owned(),
                ));
            }
            _ => {}
        }
    }
    None
}

/// Every shipped scenario deploys but those that kill a replica (which only
/// a launcher that started it can do: they are refused, naming `kill`);
/// its manifests pass the Kubernetes schemas (strict: unknown fields are
/// errors).
fn every_shipped_scenario_generates_manifests_that_pass_the_kubernetes_schemas() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(repo().join("scenarios")).expect("read scenarios") {
        let path = entry.expect("an entry").path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a scenario");
        let scenario = tailmesh::scenario::parse(&text, &path.display().to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        // Deployments cannot kill a replica, nor run a service's command
        // without its image: both generators refuse, saying why.
        let refusal = if scenario
            .variants
            .iter()
            .any(|v| v.hops.iter().any(|h| h.kill.is_some()))
        {
            Some("kill needs")
        } else if scenario.variants.iter().any(|v| {
            v.hops
                .iter()
                .any(|h| h.service.as_ref().is_some_and(|s| s.image.is_none()))
        }) {
            Some("name its image with [hop.service] image")
        } else {
            None
        };
        if let Some(why) = refusal {
            for refused in [
                k8s::generate(&scenario, &text, &k8s::Options::default()).map(|_| ()),
                compose::generate(&scenario, &text, &compose::Options::default()).map(|_| ()),
            ] {
                let error = refused.expect_err("the scenario is refused").to_string();
                assert!(error.contains(why), "{}: {error}", path.display());
            }
            continue;
        }
        let generated = k8s::generate(&scenario, &text, &k8s::Options::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stem = path.file_stem().expect("a name").to_string_lossy();
        for (name, body) in generated.files {
            let file = dir.path().join(format!("{stem}-{name}"));
            std::fs::write(&file, body).expect("write a manifest");
            files.push(file);
        }
        // The Compose file generates too; with TLS, given the folder of
        // its certificates (without, it asks for one).
        let tls = scenario.variants.iter().any(|v| v.mesh.tls.is_on());
        if tls {
            let error = compose::generate(&scenario, &text, &compose::Options::default())
                .expect_err("TLS without a folder")
                .to_string();
            assert!(error.contains("-o FILE"), "{}: {error}", path.display());
        }
        let options = compose::Options {
            tls: tls.then(|| compose::TlsFolder {
                path: "./tls".to_owned(),
                ca_sha256: "00".repeat(32),
            }),
            ..compose::Options::default()
        };
        compose::generate(&scenario, &text, &options)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    assert!(files.len() >= 5 * 12, "{} manifests", files.len());
    let validator = Command::new("kubernetes-validate")
        .arg("--strict")
        .arg("--quiet")
        .args(&files)
        .output();
    match validator {
        Err(e) => skip(format!(
            "kubernetes-validate not found ({e}); pip install kubernetes-validate"
        )),
        Ok(out) => assert!(
            out.status.success(),
            "kubernetes-validate refused the manifests:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Whether `docker compose` (the Compose v2 plugin) answers here; the
/// error says what is missing. Docker's client without the plugin takes
/// `compose` for an unknown command, and `-f` after it for one of its own
/// flags, so only `docker compose version` tells the plugin apart.
fn docker_compose() -> Result<(), String> {
    match Command::new("docker").args(["compose", "version"]).output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("docker is not installed (no `docker` on PATH)".to_owned())
        }
        Err(e) => Err(format!("docker could not be started: {e}")),
        Ok(out)
            if out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains("Docker Compose") =>
        {
            Ok(())
        }
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "docker compose (the Compose v2 plugin) is not installed: \
                 `docker compose version` exited with {} saying {:?}",
                out.status,
                said.lines().next().unwrap_or_default()
            ))
        }
    }
}

fn the_committed_compose_file_passes_docker_compose_config() {
    if let Err(why) = docker_compose() {
        skip(why);
    }
    let out = Command::new("docker")
        .args(["compose", "-f"])
        .arg(repo().join("docker-compose.yml"))
        .args(["config", "--quiet"])
        .output()
        .expect("docker ran a moment ago");
    assert!(
        out.status.success(),
        "docker compose config refused docker-compose.yml:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tests above that call `docker`, by full name.
const DOCKER_TESTS: [&str; 1] = ["deploy::the_committed_compose_file_passes_docker_compose_config"];

/// Docker's client as Docker 28 answers without the Compose plugin.
const CLIENT_WITHOUT_COMPOSE: &str = r#"#!/bin/sh
if [ "$1" = compose ] && [ "$2" = version ]; then
  printf "docker: unknown command: docker compose\n\nRun 'docker --help' for more information\n" >&2
  exit 1
fi
if [ "$1" = compose ]; then
  printf "unknown shorthand flag: 'f' in -f\n" >&2
  exit 125
fi
echo "docker: unknown command: docker $1" >&2
exit 1
"#;

/// The Docker tests pass or skip, never fail, on each kind of machine
/// people have: Docker's client without the Compose plugin, no Docker at
/// all (both faked by what is on PATH), and Docker with the plugin (this
/// machine's own, where it has one). Each case runs this test binary
/// again with only those tests and that PATH.
fn the_docker_tests_pass_or_skip_with_compose_without_it_and_without_any_client() {
    let dir = tempfile::tempdir().expect("tempdir");
    let client_only = dir.path().join("client-only");
    let nothing = dir.path().join("nothing");
    for d in [&client_only, &nothing] {
        std::fs::create_dir(d).expect("a PATH directory");
    }
    let docker = write(&client_only, "docker", CLIENT_WITHOUT_COMPOSE);
    std::fs::set_permissions(&docker, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make the fake docker executable");

    let run = |path: &std::ffi::OsStr| {
        let out = Command::new(std::env::current_exe().expect("this test binary"))
            .args(DOCKER_TESTS)
            .args(["--exact", "--test-threads", "1"])
            .env("PATH", path)
            .env_remove(crate::harness::REQUIRE_ALL)
            .output()
            .expect("run this test binary again");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    for (case, path, reason) in [
        (
            "docker's client without the Compose plugin",
            &client_only,
            "Compose v2 plugin",
        ),
        ("no docker", &nothing, "docker is not installed"),
    ] {
        let (ok, text) = run(path.as_os_str());
        assert!(ok, "{case}: the Docker tests failed:\n{text}");
        assert!(
            text.contains(&format!("{} ignored", DOCKER_TESTS.len()))
                && DOCKER_TESTS
                    .iter()
                    .all(|t| text.contains(&format!("skipped {t}: ")))
                && text.contains(reason),
            "{case}: every Docker test should be skipped with the reason ({reason}):\n{text}"
        );
    }
    if let Err(why) = docker_compose() {
        skip(format!("the case with the Compose plugin: {why}"));
    }
    let (ok, text) = run(&std::env::var_os("PATH").unwrap_or_default());
    assert!(
        ok && text.contains(&format!("{} passed", DOCKER_TESTS.len())),
        "with the Compose plugin the Docker tests should run and pass:\n{text}"
    );
}

/// Hop a calling hop b's two replicas.
const TWO_HOPS: &str = r#"
name = "two"
[load]
mode = "open"
rate = 10
requests = 10
[[hop]]
name = "a"
[[hop]]
name = "b"
replicas = 2
"#;

fn scenario_file(dir: &Path, text: &str) -> PathBuf {
    write(dir, "scenario.toml", text)
}

fn undeployable_scenarios_are_refused_with_what_and_where() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Every name is a DNS label already (the scenario parser sees to
    // that); joined into service names they can grow too long.
    let long = "a".repeat(55);
    let variant = "v".repeat(20);
    let long_names = scenario_file(
        dir.path(),
        &format!(
            r#"
name = "{long}"
[load]
mode = "open"
rate = 10
requests = 10
[[hop]]
name = "{long}"
[[variant]]
name = "{variant}"
[[variant]]
name = "w"
"#
        ),
    );
    for command in ["compose", "k8s"] {
        let out = tailmesh(dir.path(), &[command, path_str(&long_names)]);
        assert_eq!(out.code(), Some(2), "{}", out.output());
        let service = format!("{variant}-hop-{long}-0");
        for expected in [
            format!(
                "variant \"{variant}\", hop \"{long}\" replica 0: its service name \"{service}\""
            ),
            format!("scenario name \"{long}\": the deployment is named \"tailmesh-{long}\""),
            "is not a DNS label (82 characters".to_owned(),
            "is not a DNS label (64 characters".to_owned(),
        ] {
            assert!(
                out.stderr.contains(&expected),
                "{expected}\n{}",
                out.output()
            );
        }
        // The short variant's services are fine and not mentioned.
        assert!(!out.stderr.contains("\"w-hop"), "{}", out.output());
        assert!(out.stdout.is_empty(), "{}", out.output());
    }

    let faults = scenario_file(
        dir.path(),
        &format!("{TWO_HOPS}replica_net = {{ replica = 1, loss = 0.05 }}\n"),
    );
    let out = tailmesh(dir.path(), &["k8s", path_str(&faults), "--no-net-admin"]);
    assert_eq!(out.code(), Some(2), "{}", out.output());
    assert!(
        out.stderr.contains("hop \"b\" replica 1") && out.stderr.contains("CAP_NET_ADMIN"),
        "{}",
        out.output()
    );
    // With NET_ADMIN allowed, only the faulty replica gets it, and the
    // token.
    let out = tailmesh(dir.path(), &["compose", path_str(&faults)]);
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let services = service_blocks(&out.stdout);
    let with_admin: Vec<&str> = services
        .iter()
        .filter(|(_, body)| body.contains("NET_ADMIN"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(with_admin, ["hop-b-1"], "{}", out.stdout);
    let with_token: Vec<&str> = services
        .iter()
        .filter(|(_, body)| body.contains("TAILMESH_CONTROL_TOKEN_FILE"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(with_token, ["hop-b-1", "orchestrator"], "{}", out.stdout);

    // A window of slowness is set through Control too: every replica of
    // its hop gets the token, none NET_ADMIN, and no runtime refuses it.
    let window = scenario_file(
        dir.path(),
        &format!(
            "{TWO_HOPS}slow = {{ probability = 1.0, extra = \"5ms\", start = \"200ms\", duration = \"500ms\" }}\n"
        ),
    );
    let out = tailmesh(
        dir.path(),
        &["compose", path_str(&window), "--no-net-admin"],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let services = service_blocks(&out.stdout);
    assert!(
        services.iter().all(|(_, body)| !body.contains("NET_ADMIN")),
        "{}",
        out.stdout
    );
    let with_token: Vec<&str> = services
        .iter()
        .filter(|(_, body)| body.contains("TAILMESH_CONTROL_TOKEN_FILE"))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        with_token,
        ["hop-b-0", "hop-b-1", "orchestrator"],
        "{}",
        out.stdout
    );
}

fn compose_starts_a_container_per_load_generator_and_the_orchestrator_awaits_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = write(dir.path(), "one.toml", TWO_HOPS);
    let out = tailmesh(dir.path(), &["compose", path_str(&one)]);
    assert_eq!(out.code(), Some(0), "{}", out.output());
    assert!(!out.stdout.contains("generator"), "{}", out.stdout);
    // The most any variant uses: 3.
    let three = write(
        dir.path(),
        "three.toml",
        &format!(
            "{TWO_HOPS}[[variant]]\nname = \"two\"\nset = {{ \"load.generators\" = 2 }}\n\
             [[variant]]\nname = \"three\"\nset = {{ \"load.generators\" = 3 }}\n"
        ),
    );
    let out = tailmesh(dir.path(), &["compose", path_str(&three)]);
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let services = service_blocks(&out.stdout);
    let body = |name: &str| {
        services
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_str())
            .unwrap_or_else(|| panic!("no service {name}:\n{}", out.stdout))
    };
    let generators: Vec<&str> = services
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| n.starts_with("generator-"))
        .collect();
    assert_eq!(generators, ["generator-0", "generator-1", "generator-2"]);
    for (k, name) in generators.iter().enumerate() {
        let b = body(name);
        assert!(
            b.contains(&format!(
                "command: [generator, --hub, orchestrator:7100, --index, \"{k}\", --stay]"
            )),
            "{name}:\n{b}"
        );
        assert!(b.contains("TAILMESH_CONTROL_TOKEN_FILE"), "{name}:\n{b}");
        assert!(!b.contains("NET_ADMIN"), "{name}:\n{b}");
    }
    let orchestrator = body("orchestrator");
    assert!(
        orchestrator.contains("--generators-at") && orchestrator.contains("0.0.0.0:7100"),
        "{orchestrator}"
    );
    for name in &generators {
        assert!(
            orchestrator.contains(&format!("{name}:\n        condition: service_started")),
            "the orchestrator waits for {name} to start:\n{orchestrator}"
        );
    }
    assert!(
        body("control-token").contains("token"),
        "the generators' token is drawn:\n{}",
        out.stdout
    );

    // Kubernetes: an Indexed Job of 3 pods at once, each taking its index
    // from the Job; the orchestrator awaits them on its Service.
    let out_dir = dir.path().join("k8s");
    let out = tailmesh(
        dir.path(),
        &["k8s", path_str(&three), "--out-dir", path_str(&out_dir)],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let job = std::fs::read_to_string(out_dir.join("45-generators.yaml")).expect("the Job");
    for expected in [
        "kind: Job",
        "completionMode: Indexed",
        "completions: 3",
        "parallelism: 3",
        "args: [generator, --hub, orchestrator:7100, --index-env, JOB_COMPLETION_INDEX, --stay]",
        "secretName: tailmesh-control",
    ] {
        assert!(job.contains(expected), "{expected}:\n{job}");
    }
    let orchestrator =
        std::fs::read_to_string(out_dir.join("40-orchestrator.yaml")).expect("the orchestrator");
    assert!(
        orchestrator.contains("--generators-at, \"0.0.0.0:7100\"")
            && orchestrator.contains("name: generators\n      port: 7100"),
        "{orchestrator}"
    );
    let single = dir.path().join("k8s-one");
    let out = tailmesh(
        dir.path(),
        &["k8s", path_str(&one), "--out-dir", path_str(&single)],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    assert!(!single.join("45-generators.yaml").exists());
}

/// `(name, body)` of each service of a generated Compose file.
fn service_blocks(compose: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut inside = false;
    for line in compose.lines() {
        if line == "services:" {
            inside = true;
            continue;
        }
        if inside && !line.starts_with(' ') {
            break;
        }
        if !inside {
            continue;
        }
        if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':'))
            && !name.starts_with(' ')
        {
            out.push((name.to_owned(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// `tailmesh hop --scenario SCENARIO --hop HOP EXTRA...` as its container
/// starts it, here listening on loopback, and the address it wrote.
fn hop_on_loopback(dir: &Path, scenario: &str, hop: &str, extra: &[&str]) -> (Running, String) {
    let addr_file = dir.join(format!("{hop}.addr"));
    let mut args = vec!["hop", "--scenario", scenario, "--hop", hop];
    args.extend_from_slice(extra);
    args.extend([
        "--listen",
        "127.0.0.1:0",
        "--addr-file",
        path_str(&addr_file),
    ]);
    let mut running = Running::start(dir, &args);
    let addr = running.wait_for("the hop's address file", || {
        std::fs::read_to_string(&addr_file)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
    });
    (running, addr)
}

fn a_hop_started_as_a_container_starts_it_serves_and_answers_health_checks() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = scenario_file(dir.path(), TWO_HOPS);
    let scenario = path_str(&scenario);
    // A wrong hop or replica is named, with what the scenario has.
    let out = tailmesh(dir.path(), &["hop", "--scenario", scenario, "--hop", "c"]);
    assert_ne!(out.code(), Some(0), "{}", out.output());
    assert!(out.stderr.contains("has no hop \"c\""), "{}", out.output());
    let out = tailmesh(
        dir.path(),
        &[
            "hop",
            "--scenario",
            scenario,
            "--hop",
            "b",
            "--replica",
            "2",
        ],
    );
    assert_ne!(out.code(), Some(0), "{}", out.output());
    assert!(
        out.stderr
            .contains("hop \"b\" has 2 replica(s); there is no replica 2"),
        "{}",
        out.output()
    );

    // Replica 1 of b, as its container runs it (here on loopback).
    let (hop, addr) = hop_on_loopback(dir.path(), scenario, "b", &["--replica", "1"]);
    let healthy = tailmesh(dir.path(), &["health", &addr]);
    assert_eq!(healthy.code(), Some(0), "{}", healthy.output());
    // SIGTERM stops it cleanly; then nothing answers there.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(hop.pid()).expect("a pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal the hop");
    let stopped = hop.wait();
    assert_eq!(stopped.code(), Some(0), "{}", stopped.output());
    let gone = tailmesh(dir.path(), &["health", &addr, "--timeout", "1s"]);
    assert_eq!(gone.code(), Some(1), "{}", gone.output());
    assert!(gone.stderr.contains(&addr), "{}", gone.output());
}

fn the_token_service_writes_a_private_token_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("token");
    let out = tailmesh(dir.path(), &["token", path_str(&path)]);
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let token = std::fs::read_to_string(&path).expect("the token");
    let token = token.trim();
    assert_eq!(token.len(), 32, "{token:?}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token:?}");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // A restarted token service keeps it.
    let again = tailmesh(dir.path(), &["token", path_str(&path)]);
    assert_eq!(again.code(), Some(0), "{}", again.output());
    assert_eq!(
        std::fs::read_to_string(&path).expect("the token").trim(),
        token
    );
}

/// `run --attach` against a deployment that is not there: it waits for the
/// service by name, then fails naming it and what was expected. Run in a
/// network namespace of its own (`unshare --net`, root), so the name
/// lookup reaches no resolver and no traffic leaves the test.
fn attaching_to_a_missing_deployment_names_the_service_it_waited_for() {
    if !tailmesh_netfault::tool::has_privilege() {
        skip("attaching in a network namespace of its own needs root (unshare --net)");
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = scenario_file(dir.path(), TWO_HOPS);
    let results = dir.path().join("results");
    let started = Instant::now();
    let out = Command::new("unshare")
        .arg("--net")
        .arg(TAILMESH)
        .args([
            "run",
            path_str(&scenario),
            "--attach",
            "--attach-timeout",
            "1s",
        ])
        .arg("--results")
        .arg(&results)
        .output()
        .expect("run unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // The hop called last is looked for first: b's replicas before a.
    assert!(
        stderr.contains("hop-b-0: service \"hop-b-0\" not ready after 1.0")
            && stderr.contains("connect hop-b-0:7000")
            && stderr.contains("was it generated from this scenario"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(20), "{stderr}");
}

/// Two hops under mutual TLS.
const MTLS_HOPS: &str = r#"
name = "sec"
[load]
mode = "open"
rate = 10
requests = 10
[mesh]
tls = "mtls"
[[hop]]
name = "a"
[[hop]]
name = "b"
"#;

/// The SHA-256 of a file's text, hex.
fn sha256_of(path: &Path) -> String {
    tailmesh::deploy::digest(&std::fs::read_to_string(path).expect("read a certificate"))
}

/// `tailmesh compose` with TLS: refused without -o, saying so; with it, a
/// folder beside the file with each service's and the orchestrator's CA,
/// certificate and private key, mounted read-only where `--tls-dir` reads
/// it, the CA's digest on every TLS service; generated again, the folder is
/// reused; for another set of services, the CA kept at its top signs the
/// new service's certificate and the others keep theirs. And
/// `tailmesh k8s`: a Secret with the same layout, each pod projecting its
/// own, probed by `tailmesh health --tls-dir`.
fn a_tls_scenario_deploys_with_a_certificate_folder_per_service_and_a_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = scenario_file(dir.path(), MTLS_HOPS);
    let out = tailmesh(dir.path(), &["compose", path_str(&scenario)]);
    assert_eq!(out.code(), Some(2), "{}", out.output());
    assert!(
        out.stderr.contains("-o FILE") && out.stderr.contains("tailmesh-sec-tls"),
        "{}",
        out.output()
    );
    assert!(!dir.path().join("tailmesh-sec-tls").exists());

    let deployed = dir.path().join("deployed");
    std::fs::create_dir(&deployed).expect("a folder");
    let file = deployed.join("compose.yml");
    let out = tailmesh(
        dir.path(),
        &["compose", path_str(&scenario), "-o", path_str(&file)],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let folder = deployed.join("tailmesh-sec-tls");
    let ca = sha256_of(&folder.join("orchestrator/ca.crt"));
    for service in ["hop-a-0", "hop-b-0", "orchestrator"] {
        let sub = folder.join(service);
        assert_eq!(sha256_of(&sub.join("ca.crt")), ca, "{service}: one CA");
        assert!(sub.join("tls.crt").is_file(), "{service}");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(sub.join("tls.key"))
                .expect("a key")
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{service}");
    }
    let compose = std::fs::read_to_string(&file).expect("the Compose file");
    let services = service_blocks(&compose);
    for (name, body) in &services {
        if name == "jaeger" {
            continue;
        }
        for expected in [
            format!("./tailmesh-sec-tls/{name}:/etc/tailmesh/tls:ro"),
            format!("tailmesh.tls-ca-sha256: {ca}"),
            format!("TAILMESH_TLS_CA_SHA256: {ca}"),
            "--tls-dir, /etc/tailmesh/tls".to_owned(),
        ] {
            assert!(body.contains(&expected), "{name}: {expected}\n{body}");
        }
    }
    for hop in ["hop-a-0", "hop-b-0"] {
        let (_, body) = services
            .iter()
            .find(|(n, _)| n == hop)
            .unwrap_or_else(|| panic!("no {hop} in\n{compose}"));
        assert!(
            body.contains("health, \"127.0.0.1:7000\", --tls-dir, /etc/tailmesh/tls"),
            "{hop}: {body}"
        );
    }
    if docker_compose().is_ok() {
        let out = Command::new("docker")
            .args(["compose", "-f"])
            .arg(&file)
            .args(["config", "--quiet"])
            .output()
            .expect("docker compose config");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Again: the same folder, the same CA.
    let out = tailmesh(
        dir.path(),
        &["compose", path_str(&scenario), "-o", path_str(&file)],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    assert!(out.stderr.contains("reusing"), "{}", out.output());
    assert_eq!(sha256_of(&folder.join("hop-b-0/ca.crt")), ca);
    // A third hop: the kept CA (its key at the folder's top, mode 0600,
    // mounted nowhere) signs its certificate; the others keep theirs.
    assert_eq!(sha256_of(&folder.join("ca.crt")), ca);
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(folder.join("ca.key"))
            .expect("the CA's key")
            .permissions(),
    );
    assert_eq!(key_mode & 0o777, 0o600);
    assert!(
        !compose.contains("tailmesh-sec-tls:"),
        "the top is not mounted"
    );
    let a_key = sha256_of(&folder.join("hop-a-0/tls.key"));
    let grown = write(
        dir.path(),
        "grown.toml",
        &format!("{MTLS_HOPS}[[hop]]\nname = \"c\"\n"),
    );
    let out = tailmesh(
        dir.path(),
        &["compose", path_str(&grown), "-o", path_str(&file)],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    assert!(
        out.stderr.contains("updated") && out.stderr.contains("hop-c-0"),
        "{}",
        out.output()
    );
    assert_eq!(sha256_of(&folder.join("hop-c-0/ca.crt")), ca);
    assert_eq!(sha256_of(&folder.join("hop-a-0/tls.key")), a_key);
    let compose = std::fs::read_to_string(&file).expect("the Compose file");
    assert!(
        compose.contains("./tailmesh-sec-tls/hop-c-0:/etc/tailmesh/tls:ro")
            && compose.contains(&format!("TAILMESH_TLS_CA_SHA256: {ca}")),
        "{compose}"
    );

    // Kubernetes: the Secret, each pod's projection and exec probe.
    let manifests = dir.path().join("k8s");
    let out = tailmesh(
        dir.path(),
        &[
            "k8s",
            path_str(&scenario),
            "--out-dir",
            path_str(&manifests),
        ],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let secret = std::fs::read_to_string(manifests.join("15-tls.yaml")).expect("15-tls.yaml");
    for key in [
        "ca.crt: |",
        "hop-a-0.crt: |",
        "hop-a-0.key: |",
        "hop-b-0.key: |",
        "orchestrator.key: |",
        "kind: Secret",
        "name: tailmesh-tls",
    ] {
        assert!(secret.contains(key), "{key}\n{secret}");
    }
    let mesh = std::fs::read_to_string(manifests.join("20-mesh.yaml")).expect("20-mesh.yaml");
    assert_eq!(mesh.matches("key: hop-b-0.key").count(), 1, "{mesh}");
    assert_eq!(mesh.matches("path: tls/tls.key").count(), 2, "{mesh}");
    assert_eq!(
        mesh.matches(
            "command: [tailmesh, health, \"127.0.0.1:7000\", --tls-dir, /etc/tailmesh/tls]"
        )
        .count(),
        2,
        "{mesh}"
    );
    assert!(!mesh.contains("grpc:\n"), "no plaintext gRPC probe: {mesh}");
    assert_eq!(mesh.matches("tailmesh/tls-ca-sha256").count(), 2, "{mesh}");
    let job = std::fs::read_to_string(manifests.join("40-orchestrator.yaml")).expect("the Job");
    assert!(
        job.contains("key: orchestrator.key") && job.contains("--tls-dir, /etc/tailmesh/tls"),
        "{job}"
    );
    let files: Vec<PathBuf> = ["15-tls.yaml", "20-mesh.yaml", "40-orchestrator.yaml"]
        .iter()
        .map(|f| manifests.join(f))
        .collect();
    match Command::new("kubernetes-validate")
        .arg("--strict")
        .arg("--quiet")
        .args(&files)
        .output()
    {
        Err(e) => skip(format!(
            "kubernetes-validate not found ({e}); pip install kubernetes-validate"
        )),
        Ok(out) => assert!(
            out.status.success(),
            "kubernetes-validate refused the manifests:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The file modes' permission bits.
fn mode_of(path: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions(),
    ) & 0o777
}

/// The files of a `tailmesh k8s --out-dir` folder, by name.
fn manifests_in(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("read the manifests")
        .map(|e| {
            let path = e.expect("an entry").path();
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            (
                name,
                std::fs::read_to_string(&path).expect("read a manifest"),
            )
        })
        .collect();
    files.sort();
    files
}

/// `tailmesh k8s --ca-dir`: the first generation writes the CA there (its
/// key mode 0600, in no manifest); the second signs with it and keeps
/// every certificate, so every manifest, the Secret included, is the same
/// to the byte, whether written to a folder or a file (both private). The
/// CA folder cannot be the manifests' folder; and the Secret's keys are
/// not written to a terminal, where plaintext manifests still are.
fn k8s_with_a_ca_folder_generates_the_same_secret_again_and_keeps_keys_off_terminals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = scenario_file(dir.path(), MTLS_HOPS);
    let ca = dir.path().join("ca");
    let generate = |out: &Path| {
        tailmesh(
            dir.path(),
            &[
                "k8s",
                path_str(&scenario),
                "--ca-dir",
                path_str(&ca),
                "--out-dir",
                path_str(out),
            ],
        )
    };
    let first_dir = dir.path().join("first");
    let out = generate(&first_dir);
    assert_eq!(out.code(), Some(0), "{}", out.output());
    assert!(
        out.stderr.contains("wrote") && out.stderr.contains(path_str(&ca)),
        "{}",
        out.output()
    );
    assert_eq!(mode_of(&ca.join("ca.key")), 0o600);
    assert_eq!(mode_of(&first_dir.join("15-tls.yaml")), 0o600);
    let first = manifests_in(&first_dir);
    let key = std::fs::read_to_string(ca.join("ca.key")).expect("the CA's key");
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        for (name, body) in &first {
            assert!(!body.contains(line), "the CA's key in {name}");
        }
    }
    let secret = &first
        .iter()
        .find(|(name, _)| name == "15-tls.yaml")
        .expect("the Secret")
        .1;
    let ca_cert = std::fs::read_to_string(ca.join("ca.crt")).expect("the CA's certificate");
    for line in ca_cert.lines().filter(|l| !l.starts_with("-----")) {
        assert!(secret.contains(line), "the CA's certificate in the Secret");
    }

    let second_dir = dir.path().join("second");
    let out = generate(&second_dir);
    assert_eq!(out.code(), Some(0), "{}", out.output());
    assert!(out.stderr.contains("reusing"), "{}", out.output());
    let second = manifests_in(&second_dir);
    assert_eq!(second, first, "a second generation differs");
    assert_eq!(
        std::fs::read_to_string(ca.join("ca.key")).expect("key"),
        key
    );

    // One stream to a file: the same documents, private.
    let stream = dir.path().join("stream.yaml");
    let out = tailmesh(
        dir.path(),
        &[
            "k8s",
            path_str(&scenario),
            "--ca-dir",
            path_str(&ca),
            "-o",
            path_str(&stream),
        ],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let joined: String = first.iter().map(|(_, body)| body.as_str()).collect();
    assert_eq!(
        std::fs::read_to_string(&stream).expect("the stream"),
        joined
    );
    assert_eq!(mode_of(&stream), 0o600);

    // The CA's folder is not the manifests'.
    let out = generate(&ca);
    assert_eq!(out.code(), Some(2), "{}", out.output());
    assert!(
        out.stderr.contains("--ca-dir and --out-dir"),
        "{}",
        out.output()
    );

    // A terminal on standard output: refused, saying what to do instead,
    // no key written; a plaintext scenario is still shown.
    if Command::new("script").arg("--version").output().is_err() {
        skip("script (util-linux) not found: the terminal refusal is not checked");
    }
    let on_terminal = |scenario: &Path| {
        let command = format!(
            "'{}' k8s '{}'",
            crate::support::TAILMESH,
            path_str(scenario)
        );
        Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("script")
    };
    let out = on_terminal(&scenario);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("not written to a terminal")
            && text.contains("-o FILE")
            && text.contains("--out-dir")
            && text.contains("pipe"),
        "{text}"
    );
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    let plain = write(
        dir.path(),
        "plain.toml",
        &MTLS_HOPS.replace("tls = \"mtls\"", ""),
    );
    let out = on_terminal(&plain);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("kind: Deployment"), "{text}");
}

/// A TLS hop as its container starts it (`tailmesh hop --scenario ...
/// --tls-dir`, here on loopback) with the folder `tailmesh compose` wrote:
/// without the folder it says which flag is missing; with it, it serves
/// TLS only, under its service name, and `tailmesh health --tls-dir`
/// (another service's folder: mtls) finds it SERVING where a plaintext
/// check does not; a folder of another CA than the deployment's is named.
fn a_tls_hop_started_as_a_container_reads_its_folder_and_answers_health_over_tls() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = scenario_file(dir.path(), MTLS_HOPS);
    let scenario = path_str(&scenario);
    let file = dir.path().join("compose.yml");
    let out = tailmesh(dir.path(), &["compose", scenario, "-o", path_str(&file)]);
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let folder = dir.path().join("tailmesh-sec-tls");

    // Without their folders, a hop and the attached orchestrator say
    // which flag is missing, before reaching for anything.
    let out = tailmesh(dir.path(), &["hop", "--scenario", scenario, "--hop", "b"]);
    assert_ne!(out.code(), Some(0), "{}", out.output());
    assert!(out.stderr.contains("--tls-dir"), "{}", out.output());
    let results = dir.path().join("results");
    let out = tailmesh(
        dir.path(),
        &["run", scenario, "--attach", "--results", path_str(&results)],
    );
    assert_ne!(out.code(), Some(0), "{}", out.output());
    assert!(
        out.stderr.contains("--tls-dir") && out.stderr.contains("mtls"),
        "{}",
        out.output()
    );

    let b_folder = folder.join("hop-b-0");
    let (hop, addr) = hop_on_loopback(
        dir.path(),
        scenario,
        "b",
        &["--tls-dir", path_str(&b_folder)],
    );
    let a = folder.join("hop-a-0");
    let healthy = tailmesh(dir.path(), &["health", &addr, "--tls-dir", path_str(&a)]);
    assert_eq!(healthy.code(), Some(0), "{}", healthy.output());
    let plain = tailmesh(dir.path(), &["health", &addr, "--timeout", "2s"]);
    assert_eq!(plain.code(), Some(1), "{}", plain.output());
    crate::tls::assert_refuses_plaintext_http2(&addr);
    // Its certificate names its service (what its callers dial).
    let client = tailmesh::deploy::tls::client_in(&a, false).expect("a's material");
    crate::tls::assert_serves_http2_over_tls(&addr, client, "hop-b-0");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(hop.pid()).expect("a pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal the hop");
    let stopped = hop.wait();
    assert_eq!(stopped.code(), Some(0), "{}", stopped.output());

    // The deployment was generated with another CA: the hop says so.
    let stale = Command::new(TAILMESH)
        .args(["hop", "--scenario", scenario, "--hop", "b", "--tls-dir"])
        .arg(folder.join("hop-b-0"))
        .env(tailmesh::deploy::tls::CA_SHA256_ENV, "00".repeat(32))
        .output()
        .expect("run tailmesh hop");
    let said = String::from_utf8_lossy(&stale.stderr);
    assert_ne!(stale.status.code(), Some(0), "{said}");
    assert!(
        said.contains("generate the deployment file again") && said.contains(&"00".repeat(32)),
        "{said}"
    );
}

/// The deployment's mTLS end to end without a container runtime: in a
/// network and mount namespace of their own (`unshare`, root), with an
/// /etc/hosts naming each service (`hop-a-0` is 127.0.0.2 ...), the two
/// hops run as their containers run them, each with its folder from
/// `tailmesh compose -o`, and `tailmesh run --attach --tls-dir` with the
/// orchestrator's: every request is answered, over connections that each
/// had a TLS handshake verified against the services' names.
fn an_attached_mtls_run_reaches_each_hop_by_its_service_name_with_the_folders() {
    if !tailmesh_netfault::tool::has_privilege() {
        skip("a network and mount namespace of its own (unshare --net --mount) needs root");
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = scenario_file(dir.path(), MTLS_HOPS);
    let file = dir.path().join("compose.yml");
    let out = tailmesh(
        dir.path(),
        &["compose", path_str(&scenario), "-o", path_str(&file)],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let folder = dir.path().join("tailmesh-sec-tls");
    let hosts = write(
        dir.path(),
        "hosts",
        "127.0.0.1 localhost\n127.0.0.2 hop-a-0\n127.0.0.3 hop-b-0\n127.0.0.4 orchestrator\n",
    );
    let results = dir.path().join("results");
    // The hops are the script's children, killed (by their pids) when it
    // ends, however it ends; `timeout` bounds the run.
    let script = r#"
set -eu
mount --bind "$HOSTS" /etc/hosts
ip link set lo up
hops=""
trap 'for p in $hops; do kill "$p" 2>/dev/null || true; done; wait' EXIT
for hop in b a; do
  case $hop in a) ip=127.0.0.2 ;; b) ip=127.0.0.3 ;; esac
  "$TAILMESH" hop --scenario "$SCENARIO" --hop "$hop" --tls-dir "$FOLDER/hop-$hop-0" \
    --listen "$ip:7000" >"$RESULTS.hop-$hop.log" 2>&1 &
  hops="$hops $!"
done
timeout 60 "$TAILMESH" run "$SCENARIO" --attach --attach-timeout 20s \
  --tls-dir "$FOLDER/orchestrator" --results "$RESULTS" --quiet
"#;
    let out = Command::new("unshare")
        .args(["--net", "--mount", "sh", "-c", script])
        .env("HOSTS", &hosts)
        .env("TAILMESH", TAILMESH)
        .env("SCENARIO", &scenario)
        .env("FOLDER", &folder)
        .env("RESULTS", &results)
        .output()
        .expect("run unshare");
    let context = format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}\n--- hop a\n{}\n--- hop b\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        read_lossy(Path::new(&format!("{}.hop-a.log", results.display()))),
        read_lossy(Path::new(&format!("{}.hop-b.log", results.display()))),
    );
    assert_eq!(out.status.code(), Some(0), "{context}");
    let summary = summary(&only_run_dir(&results));
    let v = &variants(&summary)[0];
    let context = format!("{v:#}\n{context}");
    assert_eq!(
        summary.pointer("/environment/launcher"),
        Some(&serde_json::Value::from("attached")),
        "{context}"
    );
    assert_accounted(v, &context);
    assert_eq!(u64_at(v, "/ok"), 10, "{context}");
    let links = |key: &str| u64_at(v, &format!("/generator_links/{key}"));
    assert!(links("opened") > 0, "{context}");
    assert_eq!(
        links("tls_full") + links("tls_resumed"),
        links("opened"),
        "{context}"
    );
}

/// A service's name, command line and environment, as the Compose file
/// gives them.
struct ComposedHop {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// Each hop service of `compose`.
fn hop_services(compose: &str) -> Vec<ComposedHop> {
    let unquote = |v: &str| v.trim().trim_matches('"').to_owned();
    service_blocks(compose)
        .into_iter()
        .filter(|(name, _)| name.starts_with("hop-"))
        .map(|(name, body)| {
            let command = body
                .lines()
                .find_map(|l| l.trim().strip_prefix("command: ["))
                .and_then(|l| l.strip_suffix(']'))
                .unwrap_or_else(|| panic!("{name} has a command: {body}"));
            let args = command.split(", ").map(unquote).collect();
            let env = body
                .lines()
                .skip_while(|l| l.trim() != "environment:")
                .skip(1)
                .take_while(|l| l.starts_with("      "))
                .filter_map(|l| l.trim().split_once(": "))
                .map(|(k, v)| (k.to_owned(), unquote(v)))
                .collect();
            ComposedHop { name, args, env }
        })
        .collect()
}

/// Deployed hops hold their spans as a local run's do. A scenario keeping
/// 5 % of its traces besides the slow ones (`traces::HELD`) gives each hop
/// service the hold in its environment;
/// started as their containers start them (in a network and mount
/// namespace of their own, /etc/hosts naming the services and the
/// orchestrator), the hops send the orchestrator that attaches only the
/// kept traces' spans: none is evicted at its receiver, every kept trace
/// is whole and none lost. Twice against the same hops: the second run's
/// orchestrator keeps a new log of decisions, which the hops, whose
/// position is in the first run's, read from its start.
fn deployed_hops_hold_their_spans_for_each_attached_runs_decisions() {
    if !tailmesh_netfault::tool::has_privilege() {
        skip("a network and mount namespace of its own (unshare --net --mount) needs root");
    }
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = scenario_file(dir.path(), crate::traces::HELD);
    let file = dir.path().join("compose.yml");
    let out = tailmesh(
        dir.path(),
        &["compose", path_str(&scenario), "-o", path_str(&file)],
    );
    assert_eq!(out.code(), Some(0), "{}", out.output());
    let compose = std::fs::read_to_string(&file).expect("read the Compose file");
    let hops = hop_services(&compose);
    assert_eq!(hops.len(), 2, "{compose}");
    let mut starts = String::new();
    let mut hosts = String::from("127.0.0.1 localhost\n127.0.0.2 orchestrator\n");
    for (k, ComposedHop { name, args, env }) in hops.iter().enumerate() {
        assert!(
            env.iter()
                .any(|(key, _)| key == tailmesh_services::telemetry::export::HOLD_ENV),
            "{env:?}"
        );
        let ip = format!("127.0.0.{}", k + 3);
        hosts.push_str(&format!("{ip} {name}\n"));
        let hop = &args[args.iter().position(|a| a == "--hop").expect("--hop") + 1];
        let mut line = String::from("env");
        for (key, value) in env {
            line.push_str(&format!(" {key}='{value}'"));
        }
        line.push_str(" \"$TAILMESH\"");
        for arg in args {
            let arg = match arg.as_str() {
                "/etc/tailmesh/scenario.toml" => "$SCENARIO".to_owned(),
                "0.0.0.0:7000" => format!("{ip}:7000"),
                _ => arg.clone(),
            };
            line.push_str(&format!(" \"{arg}\""));
        }
        line.push_str(&format!(
            " >\"$RESULTS.hop-{hop}.log\" 2>&1 &\nhops=\"$hops $!\"\n"
        ));
        starts.push_str(&line);
    }
    let hosts = write(dir.path(), "hosts", &hosts);
    let results = dir.path().join("results");
    // The hops are the script's children, killed (by their pids) when it
    // ends, however it ends; `timeout` bounds each run.
    let script = format!(
        r#"
set -eu
mount --bind "$HOSTS" /etc/hosts
ip link set lo up
hops=""
trap 'for p in $hops; do kill "$p" 2>/dev/null || true; done; wait' EXIT
{starts}
for run in 1 2; do
  timeout 60 "$TAILMESH" run "$SCENARIO" --attach --attach-timeout 20s \
    --results "$RESULTS-$run" --quiet
done
"#
    );
    let out = Command::new("unshare")
        .args(["--net", "--mount", "sh", "-c", &script])
        .env("HOSTS", &hosts)
        .env("TAILMESH", TAILMESH)
        .env("SCENARIO", &scenario)
        .env("RESULTS", &results)
        .output()
        .expect("run unshare");
    let log = |hop: &str| read_lossy(Path::new(&format!("{}.hop-{hop}.log", results.display())));
    let context = format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}\n--- hop a\n{}\n--- hop b\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        log("a"),
        log("b"),
    );
    assert_eq!(out.status.code(), Some(0), "{context}");
    for run in 1..=2 {
        let summary = summary(&only_run_dir(Path::new(&format!(
            "{}-{run}",
            results.display()
        ))));
        let v = &variants(&summary)[0];
        let (t, o) = (&v["traces"], &v["observer"]);
        let context = format!("run {run}\n{t:#}\n{o:#}\n{context}");
        assert_accounted(v, &context);
        let kept = u64_at(t, "/sampling/written");
        assert!(kept > 0, "{context}");
        assert_eq!(u64_at(t, "/expected"), u64_at(t, "/complete"), "{context}");
        assert_eq!(u64_at(t, "/missing"), 0, "{context}");
        assert_eq!(u64_at(t, "/lost"), 0, "{context}");
        // The hops sent a's and b's spans of the kept traces only: the
        // receiver had none to evict.
        assert_eq!(u64_at(t, "/held/evicted_at_receiver"), 0, "{context}");
        let received = u64_at(o, "/processes_spans_received");
        assert!(
            received <= 3 * kept + 3,
            "3 spans per kept trace: {received} for {kept}\n{context}"
        );
        assert!(u64_at(t, "/held/evicted_spans") > 5 * received, "{context}");
    }
}

/// scenarios/deployed-services.toml: each service hop replica gets its
/// service from the scenario's image, `{port}` the fixed port, with the
/// local launcher's environment; in Compose a service of its own, which
/// the sidecar depends on and calls by name (its health check allowing for
/// the service's ready_timeout), in Kubernetes a second container in the
/// pod, ready once its port accepts connections, called on 127.0.0.1.
fn a_service_hop_deploys_its_service_beside_its_sidecar() {
    let path = repo().join("scenarios/deployed-services.toml");
    let text = std::fs::read_to_string(&path).expect("read the scenario");
    let scenario = tailmesh::scenario::parse(&text, "deployed-services.toml")
        .unwrap_or_else(|e| panic!("{e}"));

    let compose = compose::generate(&scenario, &text, &compose::Options::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let services = service_blocks(&compose);
    let block = |name: &str| -> &str {
        services
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, body)| body.as_str())
            .unwrap_or_else(|| panic!("no service {name} in:\n{compose}"))
    };
    for (hop, image, program) in [
        (
            "py",
            "tailmesh-example-python:latest",
            "[../examples/servers/.venv/bin/python, ../examples/servers/python/server.py, \
             --port, \"50051\", --sleep]",
        ),
        (
            "cpp",
            "tailmesh-example-cpp:latest",
            "[../examples/servers/cpp/build/echo-server, --port, \"50051\", --sleep]",
        ),
    ] {
        let name = format!("hop-{hop}-0-service");
        let service = block(&name);
        for words in [
            format!("image: {image}"),
            format!("entrypoint: {program}"),
            "PORT: \"50051\"".to_owned(),
            format!("TAILMESH_HOP: {hop}"),
            "TAILMESH_REPLICA: \"0\"".to_owned(),
            format!("OTEL_SERVICE_NAME: hop-{hop}-service"),
            "OTEL_EXPORTER_OTLP_ENDPOINT: http://orchestrator:4317".to_owned(),
            "OTEL_RESOURCE_ATTRIBUTES: variant=base".to_owned(),
        ] {
            assert!(
                service.contains(&words),
                "{name} lacks {words:?}:\n{service}"
            );
        }
        // Not tailmesh's image, build or health check.
        assert!(!service.contains("*tailmesh"), "{name}:\n{service}");
        let sidecar = block(&format!("hop-{hop}-0"));
        for words in [
            format!("--service-address, hop-{hop}-0-service:50051,"),
            format!("{name}:\n        condition: service_started"),
            "start_period: 70s".to_owned(),
        ] {
            assert!(
                sidecar.contains(&words),
                "hop-{hop}-0 lacks {words:?}:\n{sidecar}"
            );
        }
    }
    // The leaf and the entry have no service beside them.
    assert!(!block("hop-back-0").contains("--service-address"));
    assert!(services.iter().all(|(n, _)| n != "hop-back-0-service"));

    let files =
        k8s::generate(&scenario, &text, &k8s::Options::default()).unwrap_or_else(|e| panic!("{e}"));
    let (_, mesh) = files
        .files
        .iter()
        .find(|(name, _)| name == "20-mesh.yaml")
        .expect("20-mesh.yaml");
    let pod = mesh
        .split("---\n")
        .find(|doc| doc.contains("kind: Deployment") && doc.contains("name: hop-py-0\n"))
        .unwrap_or_else(|| panic!("no Deployment hop-py-0 in:\n{mesh}"));
    for words in [
        "--service-address, \"127.0.0.1:50051\"",
        "- name: service\n",
        "image: tailmesh-example-python:latest",
        "command: [../examples/servers/.venv/bin/python, ../examples/servers/python/server.py, \
         --port, \"50051\", --sleep]",
        "tcpSocket:\n",
        "name: TAILMESH_HOP\n",
        "value: hop-py-service",
    ] {
        assert!(
            pod.contains(words),
            "hop-py-0's pod lacks {words:?}:\n{pod}"
        );
    }
    let back = mesh
        .split("---\n")
        .find(|doc| doc.contains("kind: Deployment") && doc.contains("name: hop-back-0\n"))
        .expect("a Deployment hop-back-0");
    assert!(!back.contains("- name: service\n"), "{back}");
}

/// A service hop as its container starts it: without the service's
/// address it refuses to start, saying how to give it (and a hop without
/// a service refuses one); with an address
/// where nothing answers it waits the service's ready_timeout, then fails
/// naming it; with the service there (the tests' Echo server) it serves
/// and answers health checks.
fn a_service_hop_started_as_its_container_starts_it_waits_for_its_service() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "name = \"svc\"\n[load]\nmode = \"open\"\nrate = 10\nrequests = 10\n\
         [[hop]]\nname = \"s\"\n[hop.service]\ncommand = [\"srv\", \"{{port}}\"]\n\
         image = \"echo:1\"\nmethod = \"{}\"\nproto = [{:?}]\nready_timeout = \"1s\"\n",
        echo::METHOD,
        echo::echo_proto().display().to_string()
    );
    let scenario = scenario_file(dir.path(), &text);
    let scenario = path_str(&scenario);

    let out = tailmesh(dir.path(), &["hop", "--scenario", scenario, "--hop", "s"]);
    assert_ne!(out.code(), Some(0), "{}", out.output());
    assert!(
        out.stderr
            .contains("give its address with --service-address"),
        "{}",
        out.output()
    );

    // A port nothing listens on: taken, then let go.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let started = Instant::now();
    let out = tailmesh(
        dir.path(),
        &[
            "hop",
            "--scenario",
            scenario,
            "--hop",
            "s",
            "--service-address",
            &free.to_string(),
            "--listen",
            "127.0.0.1:0",
        ],
    );
    assert_ne!(out.code(), Some(0), "{}", out.output());
    assert!(
        out.stderr
            .contains(&format!("its service: {free} not ready after")),
        "{}",
        out.output()
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{}",
        out.output()
    );

    // A hop whose service is not the deployment's has no use for one.
    let plain = dir.path().join("plain.toml");
    std::fs::write(&plain, TWO_HOPS).expect("write a scenario");
    let out = tailmesh(
        dir.path(),
        &[
            "hop",
            "--scenario",
            path_str(&plain),
            "--hop",
            "b",
            "--service-address",
            "127.0.0.1:1",
        ],
    );
    assert_ne!(out.code(), Some(0), "{}", out.output());
    assert!(
        out.stderr
            .contains("--service-address is for a hop whose [hop.service] has a command"),
        "{}",
        out.output()
    );

    let echo = echo::EchoServer::start();
    let (_hop, addr) = hop_on_loopback(
        dir.path(),
        scenario,
        "s",
        &["--service-address", &echo.addr.to_string()],
    );
    let healthy = tailmesh(dir.path(), &["health", &addr]);
    assert_eq!(healthy.code(), Some(0), "{}", healthy.output());
}
