//! Helpers shared by the end-to-end tests: running the real binary with a
//! deadline, finding its processes, reading its results back.
//!
//! - Every test that runs a mesh takes a turn ([`serial`] or [`shared`]):
//!   a test that judges latency or wall time runs alone, since on a
//!   2-core machine a second mesh would add its scheduling delays to the
//!   latencies judged; a test that judges counts, files and exit codes
//!   shares the machine with up to [`SHARED_TURNS`] - 1 others like it.
//! - Every run has a wall-time deadline; past it the run is killed and the
//!   test fails with the run's output. Every wait is on a condition with a
//!   deadline ([`wait_until`], which every wait of these tests goes
//!   through); nothing sleeps and hopes.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Display,
    io::Read,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Condvar, Mutex},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use tailmesh_netfault::tool::{has_privilege, missing_tools, tool_available};

use crate::harness::skip;

/// The Echo server of the `[hop.service]` tests.
pub(crate) mod echo;
/// The counting TCP relay of the connection tests.
pub(crate) mod relay;

pub(crate) const TAILMESH: &str = env!("CARGO_BIN_EXE_tailmesh");

/// No run of these tests should come near this; past it the run is killed.
pub(crate) const RUN_DEADLINE: Duration = Duration::from_secs(40);

/// How many times slower than the machines the tests' loads and deadlines
/// were set on this one is: a machine that sets it (the netem guest,
/// emulated) gets runs with deadlines that much longer, and the network
/// fault tests' loads that much lighter and longer (see [`slowdown`]).
pub(crate) const SLOWDOWN_ENV: &str = "TAILMESH_TEST_SLOWDOWN";

/// [`SLOWDOWN_ENV`]'s factor, at least 1 (1 when unset or invalid).
pub(crate) fn slowdown() -> u32 {
    std::env::var(SLOWDOWN_ENV)
        .ok()
        .and_then(|f| f.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// [`RUN_DEADLINE`] times [`slowdown`].
pub(crate) fn run_deadline() -> Duration {
    RUN_DEADLINE * slowdown()
}

/// How often a wait re-checks its condition.
pub(crate) const POLL: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------------
// Waiting

/// Polls `condition` every [`POLL`] until it yields a value, and returns
/// it; fails the test, saying `what` it waited for, once `deadline` has
/// passed. `what` is formatted only then, so it may read a run's output
/// at that moment ([`later`]).
pub(crate) fn wait_until<T>(
    deadline: Instant,
    what: impl Display,
    mut condition: impl FnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = condition() {
            return found;
        }
        past_deadline(deadline, started, &what);
        sleep(POLL);
    }
}

/// [`wait_until`] for an async test, with a condition that may await:
/// the runtime's other tasks (the launcher's watchers) go on between polls.
pub(crate) async fn wait_until_async<T>(
    deadline: Instant,
    what: impl Display,
    mut condition: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = condition().await {
            return found;
        }
        past_deadline(deadline, started, &what);
        tokio::time::sleep(POLL).await;
    }
}

fn past_deadline(deadline: Instant, started: Instant, what: &dyn Display) {
    let now = Instant::now();
    assert!(
        now < deadline,
        "not within {:?}: {what}",
        now.duration_since(started)
    );
}

/// A description made only when a wait fails.
pub(crate) fn later<F: Fn() -> String>(describe: F) -> impl Display {
    struct Later<F>(F);
    impl<F: Fn() -> String> Display for Later<F> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&(self.0)())
        }
    }
    Later(describe)
}

/// `within` from now, for [`wait_until`].
pub(crate) fn after(within: Duration) -> Instant {
    Instant::now() + within
}

// ---------------------------------------------------------------------------
// Turns on the machine

/// How many tests that share the machine ([`shared`]) may run meshes at
/// once. Their meshes mostly wait (sleeps, low rates), so on 2 cores three
/// at a time shorten the suite without starving one another.
pub(crate) const SHARED_TURNS: usize = 3;

/// Who runs a mesh now: one test alone, or up to [`SHARED_TURNS`] sharing.
#[derive(Default)]
struct Turns {
    alone: bool,
    shared: usize,
    /// Tests waiting to run alone: while one waits, no new shared turn
    /// starts, so it is not starved.
    waiting_alone: usize,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns {
    alone: false,
    shared: 0,
    waiting_alone: 0,
});
static TURN_ENDED: Condvar = Condvar::new();

/// A test's turn to run meshes, held as long as it lives.
pub(crate) struct Turn {
    alone: bool,
    since: Instant,
}

/// The variable naming a file to which every turn's length is appended
/// (seconds, `alone` or `shared`, the test), to find where the suite's
/// time goes: `sort -rn` it.
pub(crate) const TURN_TIMES: &str = "TAILMESH_TURN_TIMES";

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(path) = std::env::var_os(TURN_TIMES) {
            let line = format!(
                "{:.1}\t{}\t{}\n",
                self.since.elapsed().as_secs_f64(),
                if self.alone { "alone" } else { "shared" },
                crate::harness::running(),
            );
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            if let Err(e) = appended {
                eprintln!("{TURN_TIMES}: cannot append to {}: {e}", path.display());
            }
        }
        // A failed test may panic while holding the lock; the count is
        // still right.
        let mut turns = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        if self.alone {
            turns.alone = false;
        } else {
            turns.shared -= 1;
        }
        TURN_ENDED.notify_all();
    }
}

fn wait_for_turn(ready: impl Fn(&Turns) -> bool) -> std::sync::MutexGuard<'static, Turns> {
    let turns = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    TURN_ENDED
        .wait_while(turns, |t| !ready(t))
        .unwrap_or_else(|e| e.into_inner())
}

/// Runs the calling test's meshes alone: for a test that judges latency,
/// a ratio of latencies or a wall time, which a mesh beside it would skew.
pub(crate) fn serial() -> Turn {
    {
        let mut turns = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        turns.waiting_alone += 1;
    }
    let mut turns = wait_for_turn(|t| !t.alone && t.shared == 0);
    turns.waiting_alone -= 1;
    turns.alone = true;
    Turn {
        alone: true,
        since: Instant::now(),
    }
}

/// Runs the calling test's meshes beside other tests' (at most
/// [`SHARED_TURNS`] at once, never beside one that runs alone): for a test
/// that judges what a run counted, wrote and exited with, not how fast.
pub(crate) fn shared() -> Turn {
    let mut turns = wait_for_turn(|t| !t.alone && t.waiting_alone == 0 && t.shared < SHARED_TURNS);
    turns.shared += 1;
    Turn {
        alone: false,
        since: Instant::now(),
    }
}

/// A test's own folder, with its turn to run meshes held as long as it
/// lives (the folder goes first). Its path is on the command line of every
/// process a run started in it, so `marker` tells them from a reused pid.
pub(crate) struct Scratch {
    dir: tempfile::TempDir,
    _turn: Turn,
}

impl Scratch {
    /// A folder for a test that runs alone ([`serial`]).
    pub(crate) fn new() -> Scratch {
        Scratch::with_turn(serial())
    }

    /// A folder for a test that shares the machine ([`shared`]).
    pub(crate) fn shared() -> Scratch {
        Scratch::with_turn(shared())
    }

    fn with_turn(turn: Turn) -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("temp dir"),
            _turn: turn,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The folder's path as it stands on its runs' command lines.
    pub(crate) fn marker(&self) -> &str {
        path_str(self.dir.path())
    }

    /// Where the runs started here write their results.
    pub(crate) fn results(&self) -> PathBuf {
        self.dir.path().join("results")
    }
}

// ---------------------------------------------------------------------------
// Running the binary

/// A started `tailmesh`, killed and reaped if the test fails before it
/// exits (its hops follow: they exit when its stdin pipe closes).
pub(crate) struct Running {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    started: Instant,
    deadline: Duration,
}

/// A finished `tailmesh`.
#[derive(Debug)]
pub(crate) struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// From its start to its exit (as polled).
    pub took: Duration,
}

impl Finished {
    pub(crate) fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Both streams, for assertion messages.
    pub(crate) fn output(&self) -> String {
        format!(
            "status {}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

impl Running {
    /// Starts `tailmesh args...` with its output in files under `dir`.
    pub(crate) fn start(dir: &Path, args: &[&str]) -> Running {
        Running::start_with_env(dir, args, &[])
    }

    /// [`Running::start`] with variables `env` set (`RUST_LOG` is unset
    /// unless given).
    pub(crate) fn start_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
        Running::spawn(dir, args, env, None)
    }

    /// Starts it with its output in `dir`, in the folder `cwd` if given
    /// (else this process's).
    fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)], cwd: Option<&Path>) -> Running {
        let n = std::fs::read_dir(dir).map_or(0, |d| d.count());
        let out = dir.join(format!("tailmesh-{n}.out"));
        let err = dir.join(format!("tailmesh-{n}.err"));
        let mut command = Command::new(TAILMESH);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("create the stdout file"))
            .stderr(std::fs::File::create(&err).expect("create the stderr file"))
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .spawn()
            .expect("start tailmesh");
        Running {
            child,
            out,
            err,
            started: Instant::now(),
            deadline: run_deadline(),
        }
    }

    /// Gives the run longer than [`RUN_DEADLINE`] (a RabbitMQ server takes
    /// tens of seconds to start on a busy machine), times the slowdown.
    pub(crate) fn with_deadline(mut self, deadline: Duration) -> Running {
        self.deadline =
            deadline * (run_deadline().as_secs_f64() / RUN_DEADLINE.as_secs_f64()) as u32;
        self
    }

    /// Time since it was started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it wrote so far.
    pub(crate) fn output(&self) -> String {
        output_of(&self.out, &self.err)
    }

    /// Reads what it wrote so far without holding on to the run (inside a
    /// [`Running::wait_for`] on it).
    pub(crate) fn output_reader(&self) -> impl Fn() -> String + use<> {
        let (out, err) = (self.out.clone(), self.err.clone());
        move || output_of(&out, &err)
    }

    /// Whether it has exited (it is then reaped by `wait`).
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// When the run is past its deadline.
    pub(crate) fn deadline(&self) -> Instant {
        self.started + self.deadline
    }

    /// Polls `found` until it finds something, failing the test if the run
    /// exits first or passes its deadline.
    pub(crate) fn wait_for<T>(
        &mut self,
        waiting_for: &str,
        mut found: impl FnMut() -> Option<T>,
    ) -> T {
        let (deadline, limit) = (self.deadline(), self.deadline);
        let (out, err) = (&self.out, &self.err);
        let child = &mut self.child;
        wait_until(
            deadline,
            later(|| {
                format!(
                    "tailmesh still running after {limit:?} ({waiting_for}):\n{}",
                    output_of(out, err)
                )
            }),
            || {
                let found = found();
                if found.is_none() && matches!(child.try_wait(), Ok(Some(_))) {
                    panic!(
                        "the run ended first ({waiting_for}):\n{}",
                        output_of(out, err)
                    );
                }
                found
            },
        )
    }

    /// Polls until what it wrote contains `text`, failing the test if the
    /// run exits first or passes its deadline.
    pub(crate) fn wait_for_output(&mut self, text: &str) {
        let (out, err) = (self.out.clone(), self.err.clone());
        self.wait_for(&format!("{text:?} in its output"), || {
            output_of(&out, &err).contains(text).then_some(())
        });
    }

    /// Waits for it to exit, within [`run_deadline`] of its start.
    pub(crate) fn wait(self) -> Finished {
        self.wait_meanwhile(|| {})
    }

    /// [`Running::wait`], calling `meanwhile` at every poll (to collect
    /// what exists only while the run goes, such as pid files).
    pub(crate) fn wait_meanwhile(self, meanwhile: impl FnMut()) -> Finished {
        let (deadline, limit) = (self.deadline(), self.deadline);
        self.wait_by(deadline, &format!("after {limit:?}"), meanwhile)
    }

    /// Waits for it to exit within `within` from now (a claim of the test:
    /// it stops that soon).
    pub(crate) fn wait_within(self, within: Duration) -> Finished {
        self.wait_by(after(within), &format!("{within:?} later"), || {})
    }

    fn wait_by(mut self, deadline: Instant, when: &str, mut meanwhile: impl FnMut()) -> Finished {
        let (out, err) = (&self.out, &self.err);
        let child = &mut self.child;
        let status = wait_until(
            deadline,
            later(|| format!("tailmesh still running {when}:\n{}", output_of(out, err))),
            || {
                meanwhile();
                child.try_wait().expect("wait for tailmesh")
            },
        );
        Finished {
            status,
            stdout: read_lossy(&self.out),
            stderr: read_lossy(&self.err),
            took: self.started.elapsed(),
        }
    }
}

fn output_of(out: &Path, err: &Path) -> String {
    format!(
        "--- stdout\n{}\n--- stderr\n{}",
        read_lossy(out),
        read_lossy(err)
    )
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.exited() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(crate) fn read_lossy(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Runs `tailmesh args...` to the end.
pub(crate) fn tailmesh(dir: &Path, args: &[&str]) -> Finished {
    Running::start(dir, args).wait()
}

/// [`tailmesh`] with `dir` its current folder too (for relative paths).
pub(crate) fn tailmesh_in(dir: &Path, args: &[&str]) -> Finished {
    Running::spawn(dir, args, &[], Some(dir)).wait()
}

/// `tailmesh run <scenario> --results <results> --quiet [extra...]`.
pub(crate) fn run_args<'a>(
    scenario: &'a Path,
    results: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        path_str(scenario),
        "--results",
        path_str(results),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    args
}

pub(crate) fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

pub(crate) fn write(dir: &Path, file: &str, text: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write a scenario");
    path
}

/// Runs a scenario that must succeed (exit 0) and returns its run folder.
pub(crate) fn run_ok(dir: &Path, scenario: &Path, results: &Path) -> (Finished, PathBuf) {
    run_ok_with(dir, scenario, results, &[])
}

/// [`run_ok`] with `extra` flags.
pub(crate) fn run_ok_with(
    dir: &Path,
    scenario: &Path,
    results: &Path,
    extra: &[&str],
) -> (Finished, PathBuf) {
    let finished = tailmesh(dir, &run_args(scenario, results, extra));
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let run_dir = only_run_dir(results);
    (finished, run_dir)
}

/// A run that exited 0, its first variant checked for accounting.
pub(crate) struct Accounted {
    pub run_dir: PathBuf,
    /// The first variant of summary.json.
    pub v: Value,
    /// The variant and the run's output, for assertion messages.
    pub context: String,
}

/// Asserts that `finished` (which wrote into `results`) exited 0 and its
/// first variant accounts for every request it sent.
pub(crate) fn accounted(finished: Finished, results: &Path) -> Accounted {
    assert_eq!(finished.code(), Some(0), "{}", finished.output());
    let run_dir = only_run_dir(results);
    let v = variants(&summary(&run_dir))[0].clone();
    let context = format!("{v:#}\n{}", finished.output());
    assert_accounted(&v, &context);
    Accounted {
        run_dir,
        v,
        context,
    }
}

/// The one run folder under `<results>/<scenario>/` (besides `latest`).
pub(crate) fn only_run_dir(results: &Path) -> PathBuf {
    let scenarios: Vec<PathBuf> = dirs_in(results);
    assert_eq!(scenarios.len(), 1, "one scenario folder: {scenarios:?}");
    let runs: Vec<PathBuf> = dirs_in(&scenarios[0])
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "latest"))
        .collect();
    assert_eq!(runs.len(), 1, "one run folder: {runs:?}");
    runs.into_iter().next().expect("checked above")
}

pub(crate) fn dirs_in(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Every file called `file_name` under `dir`, at any depth.
pub(crate) fn find_files(dir: &Path, file_name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_symlink() {
            continue;
        }
        if path.is_dir() {
            found.extend(find_files(&path, file_name));
        } else if path.file_name().is_some_and(|n| n == file_name) {
            found.push(path);
        }
    }
    found
}

/// Every `<variant>/<name>.pid` under `dir`, read now: (variant, name) to pid.
/// A file caught half-written or just removed is skipped.
pub(crate) fn pid_files(dir: &Path) -> BTreeMap<(String, String), u32> {
    let mut pids = BTreeMap::new();
    collect_pid_files(dir, &mut pids);
    pids
}

fn collect_pid_files(dir: &Path, pids: &mut BTreeMap<(String, String), u32>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_symlink() {
            continue;
        }
        if path.is_dir() {
            collect_pid_files(&path, pids);
            continue;
        }
        let (Some(stem), Some("pid")) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        let variant = path
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            pids.insert((variant, stem.to_string()), pid);
        }
    }
}

/// The pids in /proc (but this process's) that `wanted` keeps.
pub(crate) fn pids_where(wanted: impl Fn(u32) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id() && wanted(pid))
        .collect()
}

/// Whether `pid` runs a process whose command line mentions `marker` (a
/// temp dir path): a zombie or a reused pid does not count.
pub(crate) fn runs_ours(pid: u32, marker: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state letter follows the parenthesized command name.
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    !zombie && String::from_utf8_lossy(&cmdline).contains(marker)
}

// ---------------------------------------------------------------------------
// Reading results

/// A per-hop report's requests per replica.
pub(crate) fn replica_requests(hop: &Value) -> Vec<u64> {
    hop.pointer("/replica_requests")
        .and_then(Value::as_array)
        .expect("replica_requests")
        .iter()
        .map(|n| n.as_u64().expect("a count"))
        .collect()
}

/// The per-hop report of hop `name` in variant `v`.
pub(crate) fn hop<'a>(v: &'a Value, name: &str) -> &'a Value {
    v.pointer("/hops")
        .and_then(Value::as_array)
        .and_then(|hops| hops.iter().find(|h| h["hop"] == name))
        .unwrap_or_else(|| panic!("no hop {name:?} in {v:#}"))
}

pub(crate) fn summary(run_dir: &Path) -> Value {
    let path = run_dir.join("summary.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

pub(crate) fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no unsigned integer at {pointer} in {v:#}"))
}

pub(crate) fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v:#}"))
}

/// One histogram of a `.hlog`: its tag (`None`: end to end), its start
/// and length (seconds from BaseTime, as written), its count, and the
/// histogram itself.
#[derive(Clone, Debug)]
pub(crate) struct HlogEntry {
    pub tag: Option<String>,
    pub start: Duration,
    pub length: Duration,
    pub count: u64,
    pub histogram: hdrhistogram::Histogram<u64>,
}

/// Every histogram of the `.hlog` at `path`, read with the hdrhistogram
/// crate's own reader and deserializer; (StartTime, BaseTime) as written.
pub(crate) fn read_hlog(path: &Path) -> (Vec<HlogEntry>, Option<Duration>, Option<Duration>) {
    use base64::Engine as _;
    use hdrhistogram::serialization::{
        Deserializer,
        interval_log::{IntervalLogIterator, LogEntry},
    };
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let (mut entries, mut start, mut base) = (Vec::new(), None, None);
    for entry in IntervalLogIterator::new(&bytes) {
        match entry.unwrap_or_else(|e| panic!("{}: {e:?}", path.display())) {
            LogEntry::StartTime(t) => start = Some(t),
            LogEntry::BaseTime(t) => base = Some(t),
            LogEntry::Interval(h) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(h.encoded_histogram())
                    .unwrap_or_else(|e| panic!("{}: base64: {e}", path.display()));
                let histogram: hdrhistogram::Histogram<u64> = Deserializer::new()
                    .deserialize(&mut &raw[..])
                    .unwrap_or_else(|e| panic!("{}: histogram: {e:?}", path.display()));
                entries.push(HlogEntry {
                    tag: h.tag().map(|t| t.as_str().to_owned()),
                    start: h.start_timestamp(),
                    length: h.duration(),
                    count: histogram.len(),
                    histogram,
                });
            }
        }
    }
    (entries, start, base)
}

/// The total count of the `.hlog` histograms tagged `tag`.
pub(crate) fn hlog_total(entries: &[HlogEntry], tag: Option<&str>) -> u64 {
    entries
        .iter()
        .filter(|e| e.tag.as_deref() == tag)
        .map(|e| e.count)
        .sum()
}

pub(crate) fn variants(summary: &Value) -> &Vec<Value> {
    summary
        .pointer("/variants")
        .and_then(Value::as_array)
        .expect("summary.json has variants")
}

/// The broker statistics summary.json holds for `topic` in variant `v`.
pub(crate) fn broker_topic<'a>(v: &'a Value, topic: &str) -> &'a Value {
    v.pointer("/broker")
        .and_then(Value::as_array)
        .and_then(|topics| topics.iter().find(|t| t["topic"] == topic))
        .unwrap_or_else(|| panic!("no broker statistics for topic {topic:?} in {v:#}"))
}

/// Every trace of traces.jaeger.json (each with its spans).
pub(crate) fn jaeger_traces(run_dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(run_dir.join("traces.jaeger.json")).expect("jaeger file");
    let file: Value = serde_json::from_str(&text).expect("jaeger JSON");
    file["data"].as_array().expect("data array").clone()
}

/// Attribute `key` of `span` in Jaeger `trace`: the span's own tag, else
/// its process's (where a process's OTLP resource attributes are: a hop
/// replica's `hop`, `replica`, `transport`, `variant`).
pub(crate) fn jaeger_attribute<'a>(
    trace: &'a Value,
    span: &'a Value,
    key: &str,
) -> Option<&'a Value> {
    let tag = |tags: &'a Value| {
        tags.as_array()?
            .iter()
            .find(|t| t["key"] == key)
            .map(|t| &t["value"])
    };
    tag(&span["tags"]).or_else(|| {
        let pid = span["processID"].as_str()?;
        tag(&trace["processes"][pid]["tags"])
    })
}

/// summary.json's variants by name.
pub(crate) fn variants_by_name(summary: &Value) -> BTreeMap<&str, &Value> {
    variants(summary)
        .iter()
        .map(|v| (str_at(v, "/name"), v))
        .collect()
}

/// Asserts sent = ok + every error kind + timeouts and `accounted`.
pub(crate) fn assert_accounted(v: &Value, context: &str) {
    let (sent, ok, timeouts) = (u64_at(v, "/sent"), u64_at(v, "/ok"), u64_at(v, "/timeouts"));
    let errors: u64 = errors(v).values().sum();
    assert!(sent > 0, "nothing sent:\n{context}");
    assert_eq!(sent, ok + errors + timeouts, "sent vs outcomes:\n{context}");
    assert_eq!(
        v.pointer("/accounted"),
        Some(&Value::Bool(true)),
        "{context}"
    );
}

/// The variant's error counts by label.
pub(crate) fn errors(variant: &Value) -> BTreeMap<String, u64> {
    variant
        .pointer("/errors")
        .and_then(Value::as_object)
        .expect("errors is an object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().expect("an error count")))
        .collect()
}

/// One row of requests.csv.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub variant: String,
    pub id: u64,
    /// `latency_us` in nanoseconds (the file prints exactly three decimals).
    pub latency_ns: u64,
    /// How late it was sent (`start_us - intended_us`), in nanoseconds.
    pub send_delay_ns: u64,
    pub status: String,
    pub slow_hops: Vec<String>,
    /// (hop, replica) per path record.
    pub path: Vec<(String, u32)>,
    /// The primary cause of a slow request (empty when not slow).
    pub cause: String,
    /// Whether a retry or hedge was sent for it at any hop.
    pub retried: bool,
    /// An error's message (empty otherwise).
    pub error: String,
    /// Per path record, its downstream calls as written (`hop@call_us:attempts`
    /// joined by `|`; empty for a hop that called nothing).
    pub calls: Vec<String>,
    /// The load generator's attempts as written.
    pub attempts: String,
    /// A stream's message: its stream and its place there.
    pub stream: Option<(u64, u32)>,
}

/// One attempt of a call as requests.csv writes it: (start, took) in
/// nanoseconds and how it ended (`ok`, `failed`, `cancelled`).
pub(crate) fn attempts_of(field: &str) -> Vec<(u64, u64, String)> {
    field
        .split('/')
        .filter(|a| !a.is_empty())
        .map(|a| {
            let (start, rest) = a
                .split_once('+')
                .unwrap_or_else(|| panic!("start+took: {a}"));
            let at = rest
                .find(|c: char| c.is_ascii_alphabetic())
                .unwrap_or_else(|| panic!("an end: {a}"));
            let (took, end) = rest.split_at(at);
            (micros3_to_ns(start), micros3_to_ns(took), end.to_owned())
        })
        .collect()
}

/// requests.csv's header (format version 5).
pub(crate) const CSV_HEADER: &str = "variant,id,intended_us,start_us,end_us,latency_us,status,slow_hops,path,extra_attempts,cause,causes,retried,hops,error,calls,attempts,stream";

/// CSV text split into rows of fields (the library's own RFC 4180 reader:
/// error messages carry quotes and commas); the last row must end in a
/// line end.
pub(crate) fn csv_rows(text: &str) -> Vec<Vec<String>> {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the last row ends in a line end"
    );
    tailmesh::output::csv::split_rows(text)
}

pub(crate) fn requests_csv(run_dir: &Path) -> Vec<Row> {
    let text = std::fs::read_to_string(run_dir.join("requests.csv")).expect("read requests.csv");
    let mut rows = csv_rows(&text).into_iter();
    assert_eq!(
        rows.next().map(|h| h.join(",")).as_deref(),
        Some(CSV_HEADER)
    );
    rows.map(|f| {
        let line = f.join(",");
        assert_eq!(f.len(), 18, "18 fields: {line}");
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        let list = |s: &str| -> Vec<String> {
            s.split(';')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        };
        Row {
            variant: f[0].to_string(),
            id: f[1].parse().unwrap_or_else(|e| panic!("id in {line}: {e}")),
            latency_ns: micros3_to_ns(f[5]),
            send_delay_ns: micros3_to_ns(f[3]).saturating_sub(micros3_to_ns(f[2])),
            status: f[6].to_string(),
            slow_hops: list(f[7]),
            path: list(f[8])
                .iter()
                .map(|rec| {
                    let parts: Vec<&str> = rec.split('/').collect();
                    assert_eq!(parts.len(), 3, "hop/replica/service_us: {rec}");
                    let replica = parts[1]
                        .parse()
                        .unwrap_or_else(|e| panic!("replica in {rec}: {e}"));
                    (parts[0].to_string(), replica)
                })
                .collect(),
            cause: f[10].to_string(),
            retried: match f[12] {
                "0" => false,
                "1" => true,
                other => panic!("retried is 0 or 1, not {other:?}: {line}"),
            },
            error: f[14].to_string(),
            calls: match f[15] {
                "" => Vec::new(),
                calls => calls.split(';').map(str::to_string).collect(),
            },
            attempts: f[16].to_string(),
            stream: f[17].split_once('/').map(|(s, m)| {
                let n = |x: &str| {
                    x.parse::<u64>()
                        .unwrap_or_else(|e| panic!("stream in {line}: {e}"))
                };
                (n(s), n(m) as u32)
            }),
        }
    })
    .collect()
}

/// "1234.567" (µs with three decimals) as nanoseconds.
pub(crate) fn micros3_to_ns(s: &str) -> u64 {
    let (whole, frac) = s
        .split_once('.')
        .unwrap_or_else(|| panic!("three decimals: {s}"));
    assert_eq!(frac.len(), 3, "three decimals: {s}");
    let whole: u64 = whole.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    let frac: u64 = frac.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    whole * 1_000 + frac
}

// ---------------------------------------------------------------------------
// Processes and sockets

/// Socket inodes `pid` holds open.
pub(crate) fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether process `pid` holds an established TCP connection to `port` on
/// this host: a hop's downstream channel connects on its first call.
pub(crate) fn connected(pid: u32, port: u16) -> bool {
    let inodes = socket_inodes(pid);
    ["tcp", "tcp6"].iter().any(|table| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        text.lines().skip(1).any(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let remote_port = f
                .get(2)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            let established = f.get(3) == Some(&"01");
            let inode = f.get(9).and_then(|i| i.parse::<u64>().ok());
            established && remote_port == Some(port) && inode.is_some_and(|i| inodes.contains(&i))
        })
    })
}

/// The variant's incidents name the SIGKILLed replica `hop-b-1` (`victim`
/// is its pid) and not its surviving sibling `hop-b-0`.
pub(crate) fn assert_killed_replica_is_the_incident(v: &Value, victim: u32, context: &str) {
    let incidents: Vec<&str> = v
        .pointer("/incidents")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no incidents:\n{context}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        incidents.iter().any(|i| i.contains("hop-b-1")
            && i.contains(&format!("pid {victim}"))
            && i.contains("SIGKILL")),
        "incidents do not name hop-b-1: {incidents:?}"
    );
    assert!(
        incidents.iter().all(|i| !i.contains("hop-b-0")),
        "the survivor is not an incident: {incidents:?}"
    );
}

/// The address a launched process (`broker`, `hop-b-1`...) of `variant`
/// listens on, once its address file is written.
pub(crate) fn addr_of(results: &Path, variant: &str, name: &str) -> Option<SocketAddr> {
    find_files(results, &format!("{name}.addr"))
        .iter()
        .find(|p| {
            p.parent()
                .and_then(Path::file_name)
                .is_some_and(|v| v == variant)
        })
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| t.trim().parse().ok())
}

/// The pid of a launched process of `variant`, while its pid file exists.
pub(crate) fn pid_of(results: &Path, variant: &str, name: &str) -> Option<u32> {
    pid_files(results)
        .get(&(variant.to_string(), name.to_string()))
        .copied()
}

/// A variant's phases around one fault window, `fault` (`slow b`,
/// `net b`): before, during (with only `fault` in force) and after, every
/// request in one of them, and after the window a recovery judged against
/// the before phase. Returns the phases, checked, and each one's p99, µs.
pub(crate) fn before_during_after<'a>(v: &'a Value, fault: &str) -> (&'a [Value], Vec<u64>) {
    let phases = v["phases"]
        .as_array()
        .unwrap_or_else(|| panic!("no phases: {v:#}"));
    let names: Vec<&str> = phases.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["before", "during", "after"], "{phases:#?}");
    assert_eq!(
        phases[1]["faults"],
        serde_json::json!([fault]),
        "{phases:#?}"
    );
    let sent: u64 = phases.iter().map(|p| u64_at(p, "/sent")).sum();
    assert_eq!(sent, u64_at(v, "/sent"), "every request in one phase");
    let recovery = &phases[2]["recovery"];
    assert_eq!(
        recovery["after"],
        serde_json::json!([fault]),
        "{recovery:#}"
    );
    assert_eq!(recovery["baseline"], "before", "{recovery:#}");
    let p99 = phases
        .iter()
        .map(|p| u64_at(p, "/latency/p99_us"))
        .collect();
    (phases, p99)
}

/// Skips the calling test (a failure under `TAILMESH_REQUIRE_ALL`) unless
/// this process may make namespaces and has the netns launcher's tools and
/// `extra` ones (name, Debian package).
pub(crate) fn require_privilege(extra: &[(&'static str, &'static str)]) {
    let mut missing = missing_tools();
    missing.extend(extra.iter().filter(|(tool, _)| !tool_available(tool)));
    if !has_privilege() {
        skip("needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)");
    }
    if !missing.is_empty() {
        skip(format!("needs {missing:?} (tool, Debian package)"));
    }
}

/// `GET path` on `addr` over HTTP/1.0: the body of a 200 answer.
pub(crate) fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")).then(|| body.to_owned())
}

/// The address `tailmesh run --metrics 127.0.0.1:0` serves its metrics
/// at, once it says so.
pub(crate) fn metrics_address(run: &mut Running) -> String {
    let output = run.output_reader();
    run.wait_for("the metrics' address", || {
        let text = output();
        let rest = text.split("metrics at http://").nth(1)?;
        Some(rest.split('/').next()?.to_owned())
    })
}

/// The sum of the samples of `metric` in a scrape whose labels include
/// every one of `labels` (`name="value"`).
pub(crate) fn metric_sum(scrape: &str, metric: &str, labels: &[&str]) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(metric)?;
            (rest.starts_with('{') && labels.iter().all(|want| rest.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}
