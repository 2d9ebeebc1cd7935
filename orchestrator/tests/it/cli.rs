//! The command line as a new user meets it: what the terminal says at the
//! end of a run, output into a pipe that closes early, a results folder
//! that cannot take the files (before the run, at its end, or filling up
//! during it), Ctrl-C pressed twice, and `compare --gate` as a CI
//! pipeline runs it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::Value;

use crate::support::*;

tests! {
    sync the_summary_explains_its_columns_and_ends_with_the_files_and_the_report,
    sync output_into_closed_pipes_changes_no_exit_status,
    sync an_unwritable_results_folder_fails_before_anything_starts,
    sync a_full_disk_leaves_whole_files_or_none_and_the_numbers_on_the_terminal,
    sync a_disk_that_fills_mid_run_stops_the_load_and_leaves_whole_files_or_none,
    sync a_run_whose_output_cannot_fit_is_refused_before_anything_starts,
    sync a_second_ctrl_c_gives_up_the_requests_in_flight_and_stops_at_once,
    sync a_second_ctrl_c_gives_up_the_closed_loops_requests_in_flight_too,
    sync the_gate_passes_the_same_seed_twice_and_fails_a_slowed_run,
    sync a_ctrl_c_still_writes_the_latency_intervals_measured,
}

/// A run of about 0.2 s through one hop.
const TINY: &str = r#"
name = "tiny"
[load]
mode = "open"
rate = 200
requests = 40
[[hop]]
name = "a"
[check]
slow_threshold = "15ms"
compounding = true
"#;

/// Runs `tailmesh args` with both output streams read through pipes.
fn output_of(args: &[&str], fsize_limit: Option<u64>) -> Output {
    let mut command = match fsize_limit {
        // SIGXFSZ ignored, so a write past the limit fails with EFBIG the
        // way a write to a full disk fails with ENOSPC.
        Some(limit) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(r#"trap '' XFSZ; exec prlimit --fsize="$0" -- "$@""#)
                .arg(limit.to_string())
                .arg(TAILMESH);
            c
        }
        None => Command::new(TAILMESH),
    };
    command
        .args(args)
        .stdin(Stdio::null())
        .env_remove("RUST_LOG")
        .output()
        .expect("run tailmesh")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn the_summary_explains_its_columns_and_ends_with_the_files_and_the_report() {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), "tiny.toml", TINY);
    let results = scratch.results();
    let (finished, run_dir) = run_ok(scratch.path(), &scenario, &results);
    let out = &finished.stdout;
    for column in [
        "sent = ok + errors + timeouts",
        "rate/requested:",
        "p50 .. max:",
        "p_slow:",
        "compounding: measured",
        "declared",
    ] {
        assert!(out.contains(column), "no line explains {column:?}:\n{out}");
    }
    // The files, in the order written, then the report's path, last.
    let listed: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("files written to "))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    assert_eq!(
        listed,
        [
            "summary.json",
            "requests.csv",
            "base.hgrm",
            "base.hlog",
            "base.segments.json",
            "traces.jaeger.json",
            "processes.csv",
            "report.html",
            "logs/ (each hop process's config and log)"
        ],
        "{out}"
    );
    let report = run_dir.join("report.html");
    assert_eq!(
        out.trim_end().lines().last(),
        Some(format!("report: {}", report.display()).as_str()),
        "{out}"
    );
    for name in &listed[..8] {
        assert!(run_dir.join(name).is_file(), "{name} listed but missing");
    }
    // processes.csv: each hop process sampled at whole seconds.
    let samples = read_lossy(&run_dir.join("processes.csv"));
    assert!(
        samples.starts_with("variant,t_s,process,pid,cpu_s,rss_bytes\n"),
        "{samples}"
    );
    assert!(
        samples
            .lines()
            .skip(1)
            .any(|l| l.starts_with("base,0.000,hop-")),
        "{samples}"
    );
    // How long the mesh took to get ready: printed, and in the summary.
    let ready = finished
        .stderr
        .lines()
        .chain(out.lines())
        .find(|l| l.starts_with("variant base: ready in "));
    assert!(ready.is_some(), "no start-up line:\n{}", finished.output());
    let launch = summary(&run_dir)
        .pointer("/variants/0/launch_s")
        .and_then(serde_json::Value::as_f64)
        .unwrap_or_else(|| panic!("no launch_s:\n{}", finished.output()));
    assert!(launch > 0.0 && launch < 60.0, "launch_s {launch}");
}

/// Both streams go to pipes whose reading end is already closed, as with
/// `tailmesh ... 2>&1 | head -c 100` once head has what it wants.
fn with_closed_pipes(args: &[&str]) -> Output {
    let (out_reader, out_writer) = std::io::pipe().expect("a pipe");
    let (err_reader, err_writer) = std::io::pipe().expect("a pipe");
    drop((out_reader, err_reader));
    /// Killed and reaped if the wait fails.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let mut child = Reaped(
        Command::new(TAILMESH)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out_writer)
            .stderr(err_writer)
            .spawn()
            .expect("start tailmesh"),
    );
    let status = wait_until(
        after(RUN_DEADLINE),
        format!("tailmesh {args:?} to exit"),
        || child.0.try_wait().expect("wait for tailmesh"),
    );
    Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    }
}

fn output_into_closed_pipes_changes_no_exit_status() {
    let scratch = Scratch::new();
    // Many problems: far more than a pipe's buffer could hide.
    let mut bad = String::from("name = \"bad\"\n");
    for i in 0..5000 {
        bad.push_str(&format!("unknown{i} = 1\n"));
    }
    let bad = write(scratch.path(), "bad.toml", &bad);
    let good = write(scratch.path(), "tiny.toml", TINY);
    let results = scratch.results();

    let cases: [(&str, Vec<&str>, i32); 4] = [
        ("run, bad scenario", vec!["run", path_str(&bad)], 2),
        (
            "validate, bad scenario",
            vec!["validate", path_str(&bad)],
            2,
        ),
        (
            "validate, good scenario",
            vec!["validate", path_str(&good)],
            0,
        ),
        ("compose to stdout", vec!["compose", path_str(&good)], 0),
    ];
    for (case, args, code) in cases {
        let out = with_closed_pipes(&args);
        assert_eq!(out.status.code(), Some(code), "{case}: {}", out.status);
    }
    // A whole run: it measures and writes its files with nobody reading.
    let out = with_closed_pipes(&["run", path_str(&good), "--results", path_str(&results)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "run into closed pipes: {}",
        out.status
    );
    let run_dir = only_run_dir(&results);
    assert!(run_dir.join("report.html").is_file());
}

fn an_unwritable_results_folder_fails_before_anything_starts() {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), "tiny.toml", TINY);
    let results = scratch.results();
    // Not one byte may be written: as on a disk that is already full.
    let out = output_of(&run_args(&scenario, &results, &[]), Some(0));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("cannot be written") && stderr.contains(path_str(&results)),
        "the error should name the results folder:\n{stderr}"
    );
    assert!(
        !stderr.contains("variant tiny") && !stderr.contains("variant base"),
        "the run started before the folder was checked:\n{stderr}"
    );
    assert!(pid_files(&results).is_empty(), "hops were started");
    let leftovers = find_files(&results, ".write-check.partial");
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// What a run whose file writes fail past a limit (a full disk) left.
struct FullDisk {
    /// Its folder, kept as long as the run is read.
    _scratch: Scratch,
    stdout: String,
    stderr: String,
    /// Both streams, for assertion messages.
    context: String,
    run_dir: PathBuf,
}

/// Writes the scenario `toml` as `file` in a new [`Scratch`] and runs it with its
/// files limited to 48 KiB: room for summary.json (a few KiB) but not for
/// report.html (far more). The run must exit 1 and have made its run
/// folder.
fn run_on_a_full_disk(file: &str, toml: &str) -> FullDisk {
    let scratch = Scratch::new();
    let scenario = write(scratch.path(), file, toml);
    let results = scratch.results();
    let out = output_of(&run_args(&scenario, &results, &[]), Some(48 * 1024));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let context = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert_eq!(out.status.code(), Some(1), "{context}");
    FullDisk {
        run_dir: only_run_dir(&results),
        _scratch: scratch,
        stdout,
        stderr,
        context,
    }
}

/// The names of the files in `run_dir`, sorted, none of them left partial.
fn whole_file_names(run_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(run_dir)
        .expect("read the run folder")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(
        names.iter().all(|n| !n.ends_with(".partial")),
        "partial files left: {names:?}"
    );
    names
}

fn a_full_disk_leaves_whole_files_or_none_and_the_numbers_on_the_terminal() {
    let run = run_on_a_full_disk("tiny.toml", TINY);
    let context = &run.context;
    assert!(
        run.stdout.contains("p99.9") && run.stdout.contains("compounding: measured"),
        "the measured numbers were not printed:\n{context}"
    );
    assert!(
        run.stderr
            .contains(&format!("write {}/", run.run_dir.display()))
            && run.stderr.contains("is incomplete"),
        "the error should name the file and say the folder is incomplete:\n{context}"
    );
    // summary.json is written first and fits; every other file is whole
    // or absent, and the one that did not fit is absent.
    let summary: Value = summary(&run.run_dir);
    assert_eq!(str_at(&summary, "/schema"), "tailmesh.summary/v1");
    let names = whole_file_names(&run.run_dir);
    assert!(
        !names.iter().any(|n| n == "report.html"),
        "{names:?}\n{context}"
    );
    for name in &names {
        let path = run.run_dir.join(name);
        match name.as_str() {
            "requests.csv" => assert_eq!(requests_csv(&run.run_dir).len(), 40, "{name}"),
            "traces.jaeger.json" => {
                let text = std::fs::read_to_string(&path).expect("read the traces");
                serde_json::from_str::<Value>(&text).expect("whole JSON");
            }
            n if n.ends_with(".hgrm") => {
                assert!(read_lossy(&path).contains("#[Max"), "{name} is cut short")
            }
            _ => {}
        }
    }
}

/// 20,000 requests (10 s) whose rows would take about 2 MB: requests.csv
/// meets the limit within the first thousand.
const FILLING: &str = r#"
name = "filling"
[load]
mode = "open"
rate = 2000
requests = 20000
[[hop]]
name = "a"
[check]
slow_threshold = "15ms"
"#;

fn a_disk_that_fills_mid_run_stops_the_load_and_leaves_whole_files_or_none() {
    let run = run_on_a_full_disk("filling.toml", FILLING);
    let context = &run.context;
    assert!(
        run.stderr.contains("the results disk is full")
            && run
                .stderr
                .contains(&format!("write {}/requests.csv", run.run_dir.display()))
            && run.stderr.contains("is incomplete"),
        "the error should say the disk filled, name the file, and say the folder is incomplete:\n{context}"
    );
    assert!(
        run.stdout.contains("p99.9"),
        "the measured numbers were not printed:\n{context}"
    );
    // Sending stopped: far fewer than the 20,000 requests, each accounted
    // for, and the variant says why.
    let summary = summary(&run.run_dir);
    let v = &variants(&summary)[0];
    assert!(u64_at(v, "/sent") < 20_000, "sending went on:\n{v:#}");
    assert!(u64_at(v, "/sent") > 0, "{v:#}");
    assert_accounted(v, &run.context);
    let incidents = v.pointer("/incidents").map(ToString::to_string);
    assert!(
        incidents
            .as_deref()
            .is_some_and(|i| i.contains("requests.csv is absent")),
        "no incident names the lost file:\n{v:#}"
    );
    // Every file whole or absent; the one that overflowed, absent.
    let names = whole_file_names(&run.run_dir);
    assert!(!names.iter().any(|n| n == "requests.csv"), "{names:?}");
    for name in &names {
        let path = run.run_dir.join(name);
        if name.ends_with(".hgrm") {
            assert!(read_lossy(&path).contains("#[Max"), "{name} is cut short");
        }
        if name == "report.html" {
            assert!(
                read_lossy(&path).trim_end().ends_with("</html>"),
                "{name} is cut short"
            );
        }
    }
}

fn a_run_whose_output_cannot_fit_is_refused_before_anything_starts() {
    let scratch = Scratch::new();
    // A trillion requests: hundreds of terabytes of rows, more than any
    // disk here holds.
    let scenario = write(
        scratch.path(),
        "huge.toml",
        r#"
name = "huge"
[load]
mode = "open"
rate = 1000
requests = 1000000000000
[[hop]]
name = "a"
"#,
    );
    let results = scratch.results();
    let out = output_of(&run_args(&scenario, &results, &["--no-traces"]), None);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(path_str(&results))
            && stderr.contains(" free, but this run is estimated to write ")
            && stderr.contains("1000000000000 measured requests"),
        "the error should name the folder, its free space and the estimate:\n{stderr}"
    );
    assert!(
        !stderr.contains("variant huge") && !stderr.contains("variant base"),
        "the run started before its output was estimated:\n{stderr}"
    );
    assert!(pid_files(&results).is_empty(), "hops were started");
}

fn a_second_ctrl_c_gives_up_the_requests_in_flight_and_stops_at_once() {
    second_ctrl_c_gives_up(
        r#"mode = "open"
rate = 20
arrivals = "uniform""#,
    );
}

fn a_second_ctrl_c_gives_up_the_closed_loops_requests_in_flight_too() {
    second_ctrl_c_gives_up(
        r#"mode = "closed"
concurrency = 4"#,
    );
}

/// Two Ctrl-Cs during a run whose requests each take a minute, its load
/// section starting with `mode`.
fn second_ctrl_c_gives_up(mode: &str) {
    let scratch = Scratch::new();
    // Every request takes a minute at `b`: after the first Ctrl-C the run
    // would wait that long for the ones in flight.
    let scenario = write(
        scratch.path(),
        "stuck.toml",
        &format!(
            r#"
name = "stuck"
[load]
{mode}
duration = "60s"
timeout = "90s"
[[hop]]
name = "a"
[[hop]]
name = "b"
work = {{ kind = "sleep", dist = "fixed", value = "60s" }}
"#
        ),
    );
    let results = scratch.results();
    let mut run = Running::start(scratch.path(), &run_args(&scenario, &results, &[]));
    // A request is in flight once hop a has called b: a hop's downstream
    // channel connects on its first call, and nothing else of a connects
    // to b. (The orchestrator's own connection to a proves nothing: its
    // readiness probe makes one before any request is sent.)
    let hops = run.wait_for("the first request to reach b", || {
        let (a, b) = (
            pid_of(&results, "base", "hop-a-0")?,
            pid_of(&results, "base", "hop-b-0")?,
        );
        let b_addr = addr_of(&results, "base", "hop-b-0")?;
        connected(a, b_addr.port()).then_some([a, b])
    });
    let pid = Pid::from_raw(run.pid() as i32);
    kill(pid, Signal::SIGINT).expect("SIGINT tailmesh");
    // It goes on after one Ctrl-C, finishing what is in flight.
    run.wait_for_output("finishing requests in flight");
    kill(pid, Signal::SIGINT).expect("SIGINT tailmesh again");
    // Far less than the minute the requests in flight would take.
    let finished = run.wait_within(Duration::from_secs(15));
    let context = finished.output();
    assert_eq!(finished.code(), Some(130), "{context}");
    for hop in hops {
        assert!(
            !runs_ours(hop, scratch.marker()),
            "hop {hop} outlived the run"
        );
    }
    let run_dir = only_run_dir(&results);
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    let cancelled = errors(v).get("cancelled").copied().unwrap_or(0);
    assert!(cancelled > 0, "no request was given up:\n{v:#}\n{context}");
    assert_eq!(
        u64_at(v, "/sent"),
        u64_at(v, "/ok") + errors(v).values().sum::<u64>() + u64_at(v, "/timeouts"),
        "not every request accounted for:\n{v:#}"
    );
    assert_eq!(v.pointer("/accounted"), Some(&Value::Bool(true)), "{v:#}");
    assert_eq!(requests_csv(&run_dir).len() as u64, u64_at(v, "/sent"));
    // The latency intervals measured are written all the same (empty:
    // nothing was answered), up to where the load stopped.
    let (entries, _, _) = read_hlog(&run_dir.join("base.hlog"));
    assert_eq!(hlog_total(&entries, None), u64_at(v, "/ok"));
    let written = u64_at(v, "/intervals_written");
    assert!(written >= 1, "{v:#}");
    assert_eq!(
        entries.iter().filter(|e| e.tag.is_none()).count() as u64,
        written
    );
}

/// Ctrl-C once in a long run: the `.hlog` holds every interval up to
/// where sending stopped, and they sum to what the summary counts.
fn a_ctrl_c_still_writes_the_latency_intervals_measured() {
    let scratch = Scratch::new();
    let scenario = write(
        scratch.path(),
        "long.toml",
        r#"
name = "long"
[load]
mode = "open"
rate = 200
arrivals = "uniform"
duration = "60s"
[[hop]]
name = "a"
work = { kind = "sleep", dist = "fixed", value = "1ms" }
[report]
interval = "250ms"
"#,
    );
    let results = scratch.results();
    let mut run = Running::start(scratch.path(), &run_args(&scenario, &results, &[]));
    // requests.csv reaches the disk 64 KiB at a time: a few hundred
    // requests have ended once it has.
    run.wait_for("requests to end", || {
        find_files(&results, ".requests.csv.partial")
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 64 * 1024))
            .then_some(())
    });
    kill(Pid::from_raw(run.pid() as i32), Signal::SIGINT).expect("SIGINT tailmesh");
    let finished = run.wait();
    assert_eq!(finished.code(), Some(130), "{}", finished.output());
    let run_dir = only_run_dir(&results);
    let summary = summary(&run_dir);
    let v = &variants(&summary)[0];
    assert_eq!(v.pointer("/interrupted"), Some(&Value::Bool(true)), "{v:#}");
    let (entries, _, _) = read_hlog(&run_dir.join("base.hlog"));
    let ok = u64_at(v, "/ok");
    assert!(ok >= 300, "{v:#}");
    assert_eq!(hlog_total(&entries, None), ok, "{v:#}");
    assert_eq!(hlog_total(&entries, Some("hop.a")), ok, "{v:#}");
    // Every interval from 0 to where sending stopped, contiguous.
    let untagged: Vec<&HlogEntry> = entries.iter().filter(|e| e.tag.is_none()).collect();
    let measured = v
        .pointer("/measured_s")
        .and_then(Value::as_f64)
        .expect("measured_s");
    assert_eq!(untagged.len() as u64, u64_at(v, "/intervals_written"));
    assert_eq!(
        untagged.len(),
        (measured / 0.25).ceil() as usize,
        "{measured}"
    );
    let mut at = Duration::ZERO;
    for e in &untagged {
        assert_eq!(e.start, at, "{untagged:#?}");
        at += e.length;
    }
    assert_eq!(u64_at(v, "/intervals_late"), 0, "{v:#}");
}

/// Two hops whose sleeps make up most of the latency, p50 about 35 ms and
/// p99 about 230 ms (a loaded machine's stalls add tens of milliseconds,
/// at times over a hundred, to both: on a scale this long they move the
/// ratios the gate judges less), 4000 measured requests; `BACK` is the
/// second hop's mean work.
const GATE: &str = r#"
name = "gate"
seed = 11
[load]
mode = "open"
rate = 250
arrivals = "uniform"
duration = "16s"
warmup = "1s"
timeout = "5s"
[[hop]]
name = "front"
work = { kind = "sleep", dist = "exp", mean = "1ms" }
[[hop]]
name = "back"
work = { kind = "sleep", dist = "exp", mean = "BACK" }
"#;

fn the_gate_passes_the_same_seed_twice_and_fails_a_slowed_run() {
    let scratch = Scratch::new();
    // A run's folder by the first folder under the scratch one: a, b, slow.
    let file_name = |p: &Path| {
        let relative = p.strip_prefix(scratch.path()).unwrap_or(p);
        let first = relative.components().next();
        first.map_or_else(String::new, |c| {
            c.as_os_str().to_string_lossy().into_owned()
        })
    };
    let run = |name: &str, back: &str| -> PathBuf {
        let toml = GATE.replace("BACK", back);
        let scenario = write(scratch.path(), &format!("{name}.toml"), &toml);
        let results = scratch.path().join(name);
        let (_, run_dir) = run_ok_with(scratch.path(), &scenario, &results, &["--no-traces"]);
        let s = summary(&run_dir);
        let v = &variants(&s)[0];
        assert!(
            u64_at(v, "/ok") >= 4000,
            "{name}: too few ok requests: {v:#}"
        );
        run_dir
    };
    // The three runs side by side: their hops mostly sleep (1 ms and 50 or
    // 250 ms of work), so they share the machine without moving the
    // margins below. The hop that holds most of the latency, five times
    // slower in the third: p50 and p99 about 4.5 times A's. The tolerance,
    // 100 % (the default is far tighter), sits a factor of 2 or more from
    // both: a loaded machine must double the same-seed pair's p50 or p99
    // to fail it (they moved under 10 % on a 2-core machine at load 4), or
    // take the slowed run's p50 and p99 from 4.5 to 2 times A's to pass
    // that.
    let (a, b, slow) = std::thread::scope(|s| {
        let a = s.spawn(|| run("a", "50ms"));
        let b = s.spawn(|| run("b", "50ms"));
        let slow = s.spawn(|| run("slow", "250ms"));
        let join = |h: std::thread::ScopedJoinHandle<'_, PathBuf>| {
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
        };
        (join(a), join(b), join(slow))
    });
    let gate = |x: &Path, y: &Path, extra: &[&str]| {
        let mut args = vec![
            "compare",
            path_str(x),
            path_str(y),
            "--gate",
            "--tolerance",
            "100%",
        ];
        args.extend_from_slice(extra);
        let finished = tailmesh(scratch.path(), &args);
        // The judged lines, for the margins on this machine in the log.
        let text = format!("{}{}", finished.stdout, finished.stderr);
        for line in text.lines().filter(|l| l.starts_with("base: p")) {
            eprintln!("gate {} -> {}: {line}", file_name(x), file_name(y));
        }
        finished
    };

    let same = gate(&a, &b, &[]);
    assert_eq!(same.code(), Some(0), "{}", same.output());
    assert_eq!(
        same.stdout.trim_end().lines().last(),
        Some("gate: pass"),
        "{}",
        same.output()
    );
    for metric in ["p50", "p99", "error share"] {
        let line = same
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("base: {metric} ")))
            .unwrap_or_else(|| panic!("no {metric} line:\n{}", same.output()));
        assert!(
            line.ends_with("tolerance") && !line.contains("regressed"),
            "{line}"
        );
    }

    let json = scratch.path().join("gate.json");
    let slowed = gate(&a, &slow, &["--json", path_str(&json)]);
    assert_eq!(slowed.code(), Some(3), "{}", slowed.output());
    assert!(
        slowed.stderr.contains("tailmesh: regressed: ") && slowed.stderr.contains("base p99"),
        "{}",
        slowed.output()
    );
    let report: Value = serde_json::from_str(&read_lossy(&json)).expect("the gate's JSON parses");
    assert_eq!(report["schema"], "tailmesh.compare/v1");
    assert_eq!(report["verdict"], "regressed");
    let p99 = &report["variants"][0]["metrics"]["p99"];
    assert_eq!(p99["regressed"], true, "{report:#}");
    let low = p99["interval"][0].as_f64().expect("an interval");
    assert!(
        low > 1.0,
        "the interval should clear the tolerance: {report:#}"
    );
    assert!(
        p99["b"].as_f64() > p99["a"].as_f64(),
        "B's p99 above A's: {report:#}"
    );

    // The other way round the slowed run is the baseline: an improvement,
    // which passes; the JSON goes to standard output, the text to standard
    // error.
    let back = gate(&slow, &a, &["--json", "-"]);
    assert_eq!(back.code(), Some(0), "{}", back.output());
    let report: Value = serde_json::from_str(&back.stdout).expect("JSON on standard output");
    assert_eq!(report["verdict"], "pass");
    assert_eq!(report["variants"][0]["metrics"]["p99"]["improved"], true);
    assert!(
        back.stderr.trim_end().ends_with("gate: pass"),
        "{}",
        back.output()
    );

    // A run of another seed (A's files with the seed changed) cannot tell:
    // its injected faults would differ.
    let other = scratch.path().join("other-seed");
    std::fs::create_dir(&other).expect("a folder for it");
    std::fs::copy(a.join("requests.csv"), other.join("requests.csv")).expect("copy the rows");
    let mut s = summary(&a);
    s["scenario"]["seed"] = Value::from(12);
    std::fs::write(other.join("summary.json"), s.to_string()).expect("write its summary");
    let reseeded = gate(&a, &other, &[]);
    assert_eq!(reseeded.code(), Some(4), "{}", reseeded.output());
    assert!(
        reseeded.stderr.contains("different seeds (11 and 12)")
            && reseeded.stdout.trim_end().ends_with("gate: inconclusive"),
        "{}",
        reseeded.output()
    );
}
