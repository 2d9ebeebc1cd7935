//! The local launcher against real children: `tailmesh hop` replicas, the
//! same re-executed binary a run starts.
//!
//! Every wait is on a condition with a deadline ([`wait_until_async`]);
//! nothing sleeps and hopes.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use nix::{
    errno::Errno,
    sys::signal::{Signal, kill},
    unistd::{Pid, getpgid},
};
use tailmesh::launcher::{LaunchError, LocalLauncher, ProcessSpec};
use tailmesh_services::{hop::HopConfig, model::HopBehavior};
use tokio::time::Instant;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::support::{after, later, wait_until_async};

tests! {
    tokio launch_returns_a_serving_address_and_writes_its_files,
    tokio a_child_that_fails_at_start_is_reported_with_its_log,
    tokio a_child_that_never_gets_ready_is_killed_at_the_deadline,
    tokio names_must_be_plain_and_unique,
    tokio exited_reports_a_child_killed_mid_run,
    tokio a_child_killed_on_purpose_is_not_reported_and_comes_back_at_its_address,
    tokio shutdown_stops_every_child_gracefully_and_is_idempotent,
    tokio dropping_the_launcher_kills_and_reaps_its_children,
    helper orphan_guard_intermediate,
    tokio children_die_when_their_launcher_is_killed,
    tokio hops_die_when_tailmesh_run_is_killed,
}

const TAILMESH: &str = env!("CARGO_BIN_EXE_tailmesh");

/// Writes a minimal hop config (no work, no downstream) and returns the
/// spec that serves it.
fn hop(dir: &Path, name: &str) -> ProcessSpec {
    let config = HopConfig {
        drain_grace: Duration::from_secs(1),
        precise_timer: false,
        ..HopConfig::new(HopBehavior::idle(name, 7))
    };
    let path = dir.join(format!("{name}.json"));
    let json = serde_json::to_string_pretty(&config).expect("a hop config serializes");
    std::fs::write(&path, json).expect("write the hop config");
    ProcessSpec::new(name, TAILMESH)
        .arg("hop")
        .arg("--config")
        .arg(path)
}

async fn health(addr: SocketAddr) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e:?}"));
    let mut client = HealthClient::new(channel);
    let reply = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("health check on {addr}: {e}"));
    ServingStatus::try_from(reply.into_inner().status).expect("a known serving status")
}

/// Whether `pid` has been reaped (no such process at all).
fn reaped(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None) == Err(Errno::ESRCH)
}

/// Whether `pid` no longer runs: reaped, or a zombie waiting for whoever
/// adopted it (an orphan's exit is not ours to reap).
fn not_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state letter follows the parenthesized command name.
        Ok(stat) => match stat.rsplit_once(')') {
            Some((_, rest)) => matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
            None => false,
        },
    }
}

/// If the test fails, the orphans it was about must not outlive it: kills
/// those pids that still run a command line mentioning `marker` (a temp dir
/// path), so a reused pid is never hit.
struct KillLeftovers {
    pids: Vec<u32>,
    marker: String,
}

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        for &pid in &self.pids {
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&self.marker));
            if ours && !not_running(pid) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

fn read_pid_file(dir: &Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(dir.join(format!("{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

async fn launch_returns_a_serving_address_and_writes_its_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let logs = dir.path().join("logs");
    let mut launcher = LocalLauncher::new(logs.clone());

    let launched = launcher
        .launch(hop(dir.path(), "hop-a-0"))
        .await
        .expect("launch hop-a-0");

    assert_eq!(launched.name, "hop-a-0");
    assert!(launched.addr.ip().is_loopback(), "{}", launched.addr);
    assert_ne!(launched.addr.port(), 0);
    assert_eq!(health(launched.addr).await, ServingStatus::Serving);
    assert_eq!(launched.log, logs.join("hop-a-0.log"));
    assert!(
        launched.log.is_file(),
        "no log file {}",
        launched.log.display()
    );
    assert_eq!(read_pid_file(&logs, "hop-a-0"), Some(launched.pid));
    let addr_file = std::fs::read_to_string(logs.join("hop-a-0.addr")).expect("addr file");
    assert_eq!(addr_file.trim(), launched.addr.to_string());
    // Its own process group, so a terminal's Ctrl-C reaches only the
    // orchestrator.
    let pid = Pid::from_raw(launched.pid as i32);
    assert_eq!(getpgid(Some(pid)), Ok(pid));
    assert_eq!(
        launcher.running().cloned().collect::<Vec<_>>(),
        vec![launched.clone()]
    );

    let stopped = launcher.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stopped.len(), 1);
    assert!(reaped(launched.pid));
    assert!(!logs.join("hop-a-0.pid").exists());
}

async fn a_child_that_fails_at_start_is_reported_with_its_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut launcher = LocalLauncher::new(dir.path().join("logs"));

    let missing = dir.path().join("no-such-config.json");
    let started = Instant::now();
    let error = launcher
        .launch(
            ProcessSpec::new("hop-b-1", TAILMESH)
                .arg("hop")
                .arg("--config")
                .arg(&missing),
        )
        .await
        .expect_err("a hop without its config cannot start");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(error, LaunchError::ExitedBeforeReady { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.starts_with("hop-b-1 "), "{message}");
    assert!(
        message.contains("exited before it was ready (exit status 1)"),
        "{message}"
    );
    assert!(message.contains("last log lines"), "{message}");
    // The child's own words, from its log.
    assert!(message.contains("no-such-config.json"), "{message}");

    let error = launcher
        .launch(hop(dir.path(), "hop-b-2").arg("--no-such-flag"))
        .await
        .expect_err("clap refuses an unknown flag");
    let message = error.to_string();
    assert!(message.starts_with("hop-b-2 "), "{message}");
    assert!(message.contains("(exit status 2)"), "{message}");
    assert!(message.contains("--no-such-flag"), "{message}");

    assert_eq!(launcher.running().count(), 0);
    assert!(launcher.shutdown(Duration::from_secs(1)).await.is_empty());
}

async fn a_child_that_never_gets_ready_is_killed_at_the_deadline() {
    let dir = tempfile::tempdir().expect("temp dir");
    let logs = dir.path().join("logs");
    let mut launcher = LocalLauncher::new(logs.clone()).with_ready_timeout(Duration::from_secs(1));

    // Not a tailmesh service: it never writes its address, which is the
    // case under test. Its extra arguments become $1.. and are ignored.
    let started = Instant::now();
    let error = launcher
        .launch(
            ProcessSpec::new("stuck", "/bin/sh")
                .arg("-c")
                .arg("echo \"stuck $$ is starting\"; exec sleep 30")
                .arg("sh"),
        )
        .await
        .expect_err("it never answers");
    assert!(started.elapsed() < Duration::from_secs(8));
    let LaunchError::NotReady { pid, addr, .. } = &error else {
        panic!("expected NotReady, got {error:?}");
    };
    assert_eq!(*addr, None);
    assert!(reaped(*pid), "the stuck child {pid} is still there");
    let message = error.to_string();
    assert!(message.starts_with("stuck (pid "), "{message}");
    assert!(message.contains("not ready after 1.0"), "{message}");
    assert!(
        message.contains("never wrote its address file"),
        "{message}"
    );
    assert!(
        message.contains(&format!("stuck {pid} is starting")),
        "{message}"
    );
    assert!(!logs.join("stuck.pid").exists());
}

async fn names_must_be_plain_and_unique() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut launcher = LocalLauncher::new(dir.path().join("logs"));

    for bad in ["", "../x", ".hidden", "a b"] {
        let error = launcher
            .launch(ProcessSpec::new(bad, TAILMESH))
            .await
            .expect_err("a bad name");
        assert!(
            matches!(error, LaunchError::InvalidName { .. }),
            "{error:?}"
        );
    }
    launcher
        .launch(hop(dir.path(), "twice"))
        .await
        .expect("launch");
    let error = launcher
        .launch(hop(dir.path(), "twice"))
        .await
        .expect_err("the name is taken");
    assert!(error.to_string().contains("already running"), "{error}");
    assert_eq!(launcher.shutdown(Duration::from_secs(5)).await.len(), 1);
}

async fn a_child_killed_on_purpose_is_not_reported_and_comes_back_at_its_address() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut launcher = LocalLauncher::new(dir.path().join("logs"));
    let victim = launcher
        .launch(hop(dir.path(), "hop-c-0"))
        .await
        .expect("launch hop-c-0");

    let killed = launcher.kill("hop-c-0").await.expect("kill hop-c-0");
    assert_eq!(
        killed.exited.to_string(),
        format!(
            "hop-c-0 ({}, pid {}) exited: signal 9 (SIGKILL)",
            victim.addr, victim.pid
        )
    );
    assert!(reaped(victim.pid));
    assert!(launcher.exited().is_empty(), "a scheduled death is no exit");
    assert_eq!(launcher.running().count(), 0);
    assert!(matches!(
        launcher.kill("hop-c-0").await,
        Err(LaunchError::InvalidName { .. })
    ));

    let back = launcher.relaunch(&killed).await.expect("relaunch hop-c-0");
    assert_eq!(back.addr, victim.addr);
    assert_ne!(back.pid, victim.pid);
    assert_eq!(health(back.addr).await, ServingStatus::Serving);
    let stopped = launcher.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stopped.len(), 1);
    assert!(!stopped[0].forced);
}

async fn exited_reports_a_child_killed_mid_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut launcher = LocalLauncher::new(dir.path().join("logs"));
    let victim = launcher
        .launch(hop(dir.path(), "hop-c-0"))
        .await
        .expect("launch hop-c-0");
    let survivor = launcher
        .launch(hop(dir.path(), "hop-c-1"))
        .await
        .expect("launch hop-c-1");
    assert!(launcher.exited().is_empty());

    kill(Pid::from_raw(victim.pid as i32), Signal::SIGKILL).expect("SIGKILL the victim");
    let mut reported = Vec::new();
    wait_until_async(
        after(Duration::from_secs(10)),
        "exited() to report hop-c-0",
        async || {
            reported.extend(launcher.exited());
            (!reported.is_empty()).then_some(())
        },
    )
    .await;

    assert_eq!(reported.len(), 1, "{reported:?}");
    let exited = &reported[0];
    assert_eq!(
        (exited.name.as_str(), exited.pid, exited.addr),
        ("hop-c-0", victim.pid, victim.addr)
    );
    assert_eq!(
        exited.to_string(),
        format!(
            "hop-c-0 ({}, pid {}) exited: signal 9 (SIGKILL)",
            victim.addr, victim.pid
        )
    );
    assert!(reaped(victim.pid));
    // Reported once; the survivor still runs and serves.
    assert!(launcher.exited().is_empty());
    assert_eq!(health(survivor.addr).await, ServingStatus::Serving);
    let names: Vec<_> = launcher.running().map(|l| l.name.clone()).collect();
    assert_eq!(names, ["hop-c-1"]);

    let stopped = launcher.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0].name, "hop-c-1");
}

async fn shutdown_stops_every_child_gracefully_and_is_idempotent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut launcher = LocalLauncher::new(dir.path().join("logs"));
    let mut pids = Vec::new();
    for name in ["hop-d-0", "hop-d-1", "hop-d-2"] {
        pids.push(
            launcher
                .launch(hop(dir.path(), name))
                .await
                .expect(name)
                .pid,
        );
    }

    let stopped = launcher.shutdown(Duration::from_secs(5)).await;

    let mut stopped_pids: Vec<_> = stopped.iter().map(|c| c.pid).collect();
    stopped_pids.sort_unstable();
    pids.sort_unstable();
    assert_eq!(stopped_pids, pids);
    for child in &stopped {
        assert!(!child.forced, "{child} ignored SIGTERM");
        assert!(child.status.success(), "{child}");
        assert!(reaped(child.pid), "{child} is still there");
    }
    assert!(launcher.shutdown(Duration::from_secs(5)).await.is_empty());
    assert_eq!(launcher.running().count(), 0);
}

async fn dropping_the_launcher_kills_and_reaps_its_children() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut launcher = LocalLauncher::new(dir.path().join("logs"));
    let launched = launcher
        .launch(hop(dir.path(), "hop-e-0"))
        .await
        .expect("launch hop-e-0");
    assert!(!reaped(launched.pid));

    drop(launcher);

    assert!(reaped(launched.pid), "hop-e-0 outlived its launcher");
}

/// Where [`orphan_guard_intermediate`] keeps its children's files; set only
/// when [`children_die_when_their_launcher_is_killed`] re-executes this test
/// binary.
const INTERMEDIATE_DIR: &str = "TAILMESH_TEST_INTERMEDIATE_DIR";
const INTERMEDIATE_HOPS: [&str; 2] = ["hop-f-0", "hop-f-1"];

/// Not a test by itself: the orchestrator stand-in of
/// [`children_die_when_their_launcher_is_killed`], which re-executes this
/// test binary to run only this function in a process of its own. It
/// launches hops and waits to be SIGKILLed.
async fn orphan_guard_intermediate() {
    let Some(dir) = std::env::var_os(INTERMEDIATE_DIR).map(PathBuf::from) else {
        return;
    };
    let mut launcher = LocalLauncher::new(dir.join("logs"));
    for name in INTERMEDIATE_HOPS {
        launcher.launch(hop(&dir, name)).await.expect(name);
    }
    // Killed here; nothing after this runs, Drop included.
    std::future::pending::<()>().await;
}

/// The orphan guarantee with the launcher alone: a process holding a
/// `LocalLauncher` is SIGKILLed, and its children go too.
async fn children_die_when_their_launcher_is_killed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut intermediate =
        tokio::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    intermediate
        .args([
            "launcher::orphan_guard_intermediate",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(INTERMEDIATE_DIR, dir.path());
    assert_children_die_with_parent(intermediate, dir.path(), &INTERMEDIATE_HOPS).await;
}

/// The orphan guarantee end to end: `tailmesh run` on a tiny scenario is
/// SIGKILLed mid-run, and every hop process it started goes too.
async fn hops_die_when_tailmesh_run_is_killed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = dir.path().join("orphans.toml");
    std::fs::write(
        &scenario,
        r#"
name = "orphans"
seed = 1

[load]
mode = "open"
rate = 20
duration = "5m"

[[hop]]
name = "front"
replicas = 2

[[hop]]
name = "back"
"#,
    )
    .expect("write the scenario");
    let mut run = tokio::process::Command::new(TAILMESH);
    run.arg("run")
        .arg(&scenario)
        .arg("--results")
        .arg(dir.path().join("results"))
        .arg("--quiet");
    assert_children_die_with_parent(
        run,
        dir.path(),
        &["hop-front-0", "hop-front-1", "hop-back-0"],
    )
    .await;
}

/// Starts `parent`, waits until it has started every child in `names`
/// (their `.pid` and `.addr` files somewhere under `dir`), SIGKILLs it, and
/// waits until none of those children runs.
async fn assert_children_die_with_parent(
    mut parent: tokio::process::Command,
    dir: &Path,
    names: &[&str],
) {
    let output_path = dir.join("parent.out");
    let output = std::fs::File::create(&output_path).expect("create the parent's output");
    let mut parent = parent
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("dup"))
        .stderr(output)
        .kill_on_drop(true)
        .spawn()
        .expect("start the parent");
    let parent_output = || std::fs::read_to_string(&output_path).unwrap_or_default();

    let pids: Vec<u32> = wait_until_async(
        after(Duration::from_secs(30)),
        later(|| format!("the parent to start {names:?}:\n{}", parent_output())),
        async || {
            let started: Option<Vec<u32>> = names
                .iter()
                .map(|name| {
                    find_file(dir, &format!("{name}.addr"))?;
                    let pid_file = find_file(dir, &format!("{name}.pid"))?;
                    std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()
                })
                .collect();
            if started.is_none()
                && let Ok(Some(status)) = parent.try_wait()
            {
                panic!("the parent exited early ({status}):\n{}", parent_output());
            }
            started
        },
    )
    .await;
    let _leftovers = KillLeftovers {
        pids: pids.clone(),
        marker: dir.display().to_string(),
    };
    for &pid in &pids {
        assert!(
            !not_running(pid),
            "child {pid} is not running before the kill"
        );
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        assert!(
            String::from_utf8_lossy(&cmdline).contains("--supervised"),
            "pid {pid} is not a supervised child"
        );
    }

    parent.start_kill().expect("SIGKILL the parent");
    let status = parent.wait().await.expect("reap the parent");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{}",
        parent_output()
    );

    wait_until_async(
        after(Duration::from_secs(10)),
        "every child of the killed parent to exit",
        async || pids.iter().all(|&pid| not_running(pid)).then_some(()),
    )
    .await;
}

/// The first file called `file_name` under `dir`, at any depth (a run puts
/// its logs under `<results>/<scenario>/<run id>/logs/<variant>/`).
fn find_file(dir: &Path, file_name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, file_name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == file_name) {
            return Some(path);
        }
    }
    None
}
