//! The HTML report in a real browser: headless Chromium (Debian's chromium
//! package) loads report.html with no console errors, its charts are in the
//! DOM, and a screenshot is produced. Also `tailmesh report` redraws it and
//! `tailmesh compare` puts two runs side by side.
//!
//! Without Chromium the browser test skips with a message, unless
//! TAILMESH_REQUIRE_ALL=1 (CI), where a skip is a failure.

use std::{path::Path, process::Command};

use crate::{harness::skip, support::*};

tests! {
    sync the_browser_check_catches_console_errors_and_outside_loads,
    sync the_report_loads_in_chromium_with_its_charts_and_no_console_errors,
    sync report_redraws_from_the_files_and_compare_puts_runs_side_by_side,
}

const SCENARIO: &str = r#"
name = "report"
seed = 3

[load]
mode = "open"
rate = 200
requests = 300
timeout = "2s"

[[hop]]
name = "a"

[[hop]]
name = "b"
replicas = 2
concurrency = 1
work = { kind = "sleep", dist = "exp", mean = "1ms" }
slow = { probability = 0.2, extra = "15ms" }

[[variant]]
name = "push"

[[variant]]
name = "pull"
set = { "hop.b.transport" = "pull" }

[check]
slow_threshold = "10ms"
compounding = true
"#;

fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

fn headless(profile: &Path) -> Command {
    let mut cmd = Command::new(chromium().expect("checked by the caller"));
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // Verbose logging prints the page's console messages (`:CONSOLE`)
        // and every file the page loads (`FileURLLoader::Start`).
        "--enable-logging=stderr",
        "--v=1",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// Loads `page` headless: its DOM, its console messages, and the files it
/// loaded besides itself.
fn load(page: &Path, profile: &Path) -> (String, Vec<String>, Vec<String>) {
    let url = format!("file://{}", page.display());
    let out = headless(profile)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr);
    let console = log
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    let loads = log
        .lines()
        .filter_map(|l| {
            l.split_once("FileURLLoader::Start: ")
                .map(|(_, u)| u.trim().to_string())
        })
        .filter(|u| *u != url)
        .collect();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        console,
        loads,
    )
}

/// Chromium's path; skips the calling test where it is not installed.
fn require_chromium() -> &'static str {
    chromium().unwrap_or_else(|| skip("chromium is not installed (apt-get install chromium)"))
}

fn the_browser_check_catches_console_errors_and_outside_loads() {
    require_chromium();
    let dir = tempfile::tempdir().expect("temp dir");
    let page = write(
        dir.path(),
        "bad.html",
        "<html><body><script>console.error('boom')</script><img src=\"missing.png\"></body></html>",
    );
    let (_, console, loads) = load(&page, &dir.path().join("profile"));
    assert!(
        console.iter().any(|l| l.contains("boom")),
        "console not seen: {console:?}"
    );
    assert!(
        loads.iter().any(|u| u.ends_with("missing.png")),
        "loads not seen: {loads:?}"
    );
}

fn the_report_loads_in_chromium_with_its_charts_and_no_console_errors() {
    require_chromium();
    // Counts and files, not timing: it shares the machine.
    let _turn = shared();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "report.toml", SCENARIO);
    let results = dir.path().join("results");
    let (_, run_dir) = run_ok(dir.path(), &scenario, &results);
    let report = run_dir.join("report.html");
    let url = format!("file://{}", report.display());

    let dom = headless(&dir.path().join("profile-dom"))
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(
        dom.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let html = String::from_utf8_lossy(&dom.stdout);
    for id in ["histogram", "spectrum", "hops", "throughput"] {
        let at = html
            .find(&format!("<svg id=\"{id}\""))
            .unwrap_or_else(|| panic!("chart {id} missing from the DOM"));
        let chart = &html[at..at + html[at..].find("</svg>").expect("chart closes")];
        let marks = chart.matches("<polyline").count() + chart.matches("class=\"segment\"").count();
        assert!(marks >= 2, "chart {id} draws nothing: {chart}");
    }
    for variant in ["push", "pull"] {
        assert!(
            html.contains(&format!("data-series=\"{variant}\"")),
            "series {variant} missing"
        );
    }
    let console: Vec<&str> = std::str::from_utf8(&dom.stderr)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("CONSOLE") || l.contains("Failed to load resource") || l.contains("Uncaught")
        })
        .collect();
    assert!(console.is_empty(), "console messages: {console:#?}");

    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report.png");
    let _ = std::fs::remove_file(&screenshot);
    let shot = headless(&dir.path().join("profile-shot"))
        .arg("--window-size=1200,2600")
        .arg(format!("--screenshot={}", screenshot.display()))
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(
        shot.status.success(),
        "chromium --screenshot failed: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let png = std::fs::read(&screenshot).expect("the screenshot exists");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "not a real screenshot: {} bytes",
        png.len()
    );
    eprintln!("report screenshot: {}", screenshot.display());
}

fn report_redraws_from_the_files_and_compare_puts_runs_side_by_side() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = write(dir.path(), "report.toml", SCENARIO);
    let results = dir.path().join("results");
    let (_, run_dir) = run_ok(dir.path(), &scenario, &results);
    let report = run_dir.join("report.html");
    let original = std::fs::read_to_string(&report).expect("report.html written by the run");
    std::fs::remove_file(&report).expect("remove it");

    let redraw = tailmesh(dir.path(), &["report", path_str(&run_dir)]);
    assert_eq!(redraw.code(), Some(0), "{}", redraw.output());
    let again = std::fs::read_to_string(&report).expect("report.html redrawn");
    assert_same_charts(&original, &again);

    // A run folder from before requests.csv's version 3 (its first 12
    // columns) redraws the same.
    let csv = run_dir.join("requests.csv");
    let text = std::fs::read_to_string(&csv).expect("requests.csv");
    let mut v2 = String::new();
    for (i, row) in csv_rows(&text).into_iter().enumerate() {
        assert_eq!(row.len(), 18, "row {i}: {row:?}");
        assert!(
            row[..12].iter().all(|f| !f.contains([',', '"'])),
            "row {i} needs no quotes: {row:?}"
        );
        v2.push_str(&row[..12].join(","));
        v2.push('\n');
    }
    assert!(
        v2.starts_with("variant,id,")
            && v2
                .lines()
                .next()
                .is_some_and(|h| h.ends_with(",cause,causes"))
    );
    std::fs::write(&csv, v2).expect("write a version 2 file");
    std::fs::remove_file(&report).expect("remove it");
    let redraw = tailmesh(dir.path(), &["report", path_str(&run_dir)]);
    assert_eq!(redraw.code(), Some(0), "{}", redraw.output());
    let from_v2 = std::fs::read_to_string(&report).expect("report.html redrawn");
    assert_same_charts(&original, &from_v2);

    let compare = tailmesh(
        dir.path(),
        &["compare", path_str(&run_dir), path_str(&run_dir)],
    );
    assert_eq!(compare.code(), Some(0), "{}", compare.output());
    let out = compare.output();
    assert!(
        out.contains("push: ") && out.contains("p50 x1.00, p99 x1.00"),
        "{out}"
    );

    let missing = tailmesh(dir.path(), &["report", path_str(&dir.path().join("nope"))]);
    assert_ne!(missing.code(), Some(0));
    assert!(
        missing.output().contains("summary.json"),
        "{}",
        missing.output()
    );
}

/// The same data gives the same charts: latencies, histograms and
/// throughput all come back from summary.json and requests.csv.
fn assert_same_charts(original: &str, again: &str) {
    for id in ["histogram", "spectrum", "throughput", "hops"] {
        let chart = |html: &str| {
            let at = html
                .find(&format!("<svg id=\"{id}\""))
                .expect("chart present");
            html[at..at + html[at..].find("</svg>").expect("closes")].to_string()
        };
        let (a, b) = (chart(original), chart(again));
        let at = a
            .bytes()
            .zip(b.bytes())
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        assert!(
            a == b,
            "chart {id} differs after the redraw at byte {at}: {:?} vs {:?}",
            &a[at.saturating_sub(80)..(at + 80).min(a.len())],
            &b[at.saturating_sub(80)..(at + 80).min(b.len())]
        );
    }
}
