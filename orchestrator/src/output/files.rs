//! The run folder's files, listed once: summary.json's `files` map and the
//! writer both come from [`run_files`].

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{HlogFile, OutputError, RequestsWriter};
use crate::{
    analysis::Summary,
    traces::jaeger::{self, KeptFile},
};
use tailmesh_analysis::record::{ProcessSample, QueueSample};

/// The (first) Jaeger JSON file in the run folder.
pub const TRACES_FILE: &str = "traces.jaeger.json";

/// The folder of the hop processes' configs and logs, and what it holds.
pub(crate) const LOGS: (&str, &str) = ("logs/", "each hop process's config and log");

/// What a file of the run folder holds, which says how it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// summary.json.
    Summary,
    /// requests.csv: every measured request.
    Requests,
    /// One variant's `.hgrm` (its index in the summary).
    Histogram(usize),
    /// One variant's `.hlog` (its index in the summary), written while
    /// the run went.
    IntervalLog(usize),
    /// One variant's measured segments (its index in the summary), when
    /// it has a composition.
    Segments(usize),
    /// The kept traces' share of Jaeger file `n` (from 0), as Jaeger JSON.
    Traces(usize),
    /// processes.csv: the processes' CPU and memory once a second.
    Processes,
    /// queues.csv: the broker's topics once a second.
    Queues,
    /// report.html.
    Report,
    /// The hop processes' configs and logs, written by the launcher while
    /// the hops run (listed, not written here).
    Logs,
}

/// One file of the run folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFile {
    /// Its name in the folder (`logs/` for the folder of logs).
    pub name: String,
    /// What it is, for summary.json's `files`.
    pub description: String,
    /// What it holds.
    pub content: Content,
}

/// The run folder's files, in the order they are written: the most
/// important first, should the disk fill up. `trace_files`: how many Jaeger
/// files the kept traces fill (at least one when any variant was traced).
pub fn run_files(summary: &Summary, trace_files: usize) -> Vec<RunFile> {
    let file = |name: &str, description: &str, content| RunFile {
        name: name.to_string(),
        description: description.to_string(),
        content,
    };
    let mut files = vec![
        file("summary.json", "this file", Content::Summary),
        file(
            "requests.csv",
            "one row per measured request",
            Content::Requests,
        ),
    ];
    for (i, report) in summary.variants.iter().enumerate() {
        files.push(RunFile {
            name: format!("{}.hgrm", report.name),
            description: format!("latency percentile distribution of variant {}", report.name),
            content: Content::Histogram(i),
        });
        files.push(RunFile {
            name: super::hlog::file_name(&report.name),
            description: format!(
                "latency per interval of variant {}, HdrHistogram interval log",
                report.name
            ),
            content: Content::IntervalLog(i),
        });
        if report
            .composition
            .as_ref()
            .is_some_and(|c| c.measured_segments.is_some())
        {
            files.push(RunFile {
                name: super::segments::file_name(&report.name),
                description: format!(
                    "the measured segments of variant {}, for tailmesh predict --from",
                    report.name
                ),
                content: Content::Segments(i),
            });
        }
    }
    for i in 0..trace_files {
        let description = if trace_files == 1 {
            "the kept traces, for Jaeger's UI (Search, Upload JSON)".to_owned()
        } else {
            format!(
                "the kept traces, part {} of {trace_files}, for Jaeger's UI (Search, Upload JSON)",
                i + 1
            )
        };
        files.push(RunFile {
            name: jaeger::file_name(i),
            description,
            content: Content::Traces(i),
        });
    }
    let started = |r: &tailmesh_analysis::variant::VariantReport| {
        r.peak_memory.iter().any(|m| m.process != "orchestrator")
    };
    if summary.variants.iter().any(started) {
        files.push(file(
            PROCESSES,
            "each process's CPU time and resident memory, once a second of the load",
            Content::Processes,
        ));
        if summary.variants.iter().any(|r| !r.broker.is_empty()) {
            files.push(file(
                QUEUES,
                "each broker topic's depth and tasks in flight, once a second of the load",
                Content::Queues,
            ));
        }
    }
    files.push(file(
        "report.html",
        "the self-contained HTML report (tailmesh report <run-folder> redraws it)",
        Content::Report,
    ));
    files.push(file(LOGS.0, LOGS.1, Content::Logs));
    files
}

/// summary.json's `files`: each file's name and description.
pub fn describe(files: &[RunFile]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|f| (f.name.clone(), f.description.clone()))
        .collect()
}

/// What the files hold besides the summary.
pub struct RunData<'a> {
    /// requests.csv, written row by row while the run went (every
    /// variant's measured requests, in the summary's order): finished in
    /// its turn; or why it was lost during the run.
    pub requests: Result<RequestsWriter, OutputError>,
    /// The kept traces of every variant, when traced.
    pub traces: Option<&'a KeptFile>,
    /// Each variant's `.hlog`, written while the run went, in the
    /// summary's order: renamed into place in its turn.
    pub(crate) interval_logs: Vec<HlogFile>,
    /// Each variant's name and its processes' samples.
    pub processes: Vec<(&'a str, &'a [ProcessSample])>,
    /// Each variant's name and its broker topics' samples.
    pub queues: Vec<(&'a str, &'a [QueueSample])>,
}

/// The processes' samples: `processes.csv`.
pub const PROCESSES: &str = "processes.csv";

/// A samples file's text: `header`, then per variant one row per sample,
/// the variant first and `row`'s fields after it.
fn samples_csv<T>(header: &str, sets: &[(&str, &[T])], row: impl Fn(&T) -> String) -> String {
    let mut out = format!("{header}\n");
    for (variant, samples) in sets {
        for s in *samples {
            out.push_str(&super::csv::quote(variant));
            out.push(',');
            out.push_str(&row(s));
            out.push('\n');
        }
    }
    out
}

/// `processes.csv`'s text: a header, then one row per sample.
pub fn processes_csv(processes: &[(&str, &[ProcessSample])]) -> String {
    samples_csv("variant,t_s,process,pid,cpu_s,rss_bytes", processes, |s| {
        format!(
            "{:.3},{},{},{:.2},{}",
            s.t_s,
            super::csv::quote(&s.process),
            s.pid,
            s.cpu_s,
            s.rss_bytes
        )
    })
}

/// The broker topics' samples: `queues.csv`.
pub const QUEUES: &str = "queues.csv";

/// `queues.csv`'s text: a header, then one row per sample.
pub fn queues_csv(queues: &[(&str, &[QueueSample])]) -> String {
    samples_csv("variant,t_s,topic,depth,in_flight", queues, |s| {
        format!(
            "{:.3},{},{},{}",
            s.t_s,
            super::csv::quote(&s.topic),
            s.depth,
            s.in_flight
        )
    })
}

/// Writes `files` into `dir` in their order, each whole or not at all;
/// returns the paths written. An error ends the list, except those of the
/// files written during the run, requests.csv and the `.hlog`s (a disk
/// that filled during the run: their partial files are gone, and the files
/// after them may fit): the first of those is returned once the others are
/// written.
pub fn write_run(
    dir: &Path,
    summary: &Summary,
    files: &[RunFile],
    data: RunData<'_>,
) -> Result<Vec<PathBuf>, OutputError> {
    let mut written = Vec::new();
    let mut requests = Some(data.requests);
    let mut logs: Vec<Option<HlogFile>> = data.interval_logs.into_iter().map(Some).collect();
    let mut requests_failed = None;
    for f in files {
        let path = dir.join(&f.name);
        let done = match f.content {
            Content::Summary => super::write_summary(&path, summary),
            Content::Requests => {
                match requests.take().map(|r| r.and_then(RequestsWriter::finish)) {
                    Some(Err(e)) => {
                        requests_failed = Some(e);
                        continue;
                    }
                    _ => Ok(()),
                }
            }
            Content::IntervalLog(i) => match logs.get_mut(i).and_then(Option::take) {
                Some(log) => match log.finish() {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        requests_failed.get_or_insert(e);
                        continue;
                    }
                },
                None => continue,
            },
            Content::Histogram(i) => match summary.variants.get(i) {
                Some(report) => super::write_hgrm(&path, &report.latency_histogram),
                None => Ok(()),
            },
            Content::Segments(i) => match summary
                .variants
                .get(i)
                .and_then(|r| Some((r, r.composition.as_ref()?.measured_segments.as_ref()?)))
            {
                Some((report, segments)) => {
                    super::segments::write_segments(&path, &report.name, segments)
                }
                None => continue,
            },
            Content::Traces(i) => write_jaeger(&path, data.traces, i),
            Content::Processes => super::write_atomically(&path, |out| {
                std::io::Write::write_all(out, processes_csv(&data.processes).as_bytes())
            }),
            Content::Queues => super::write_atomically(&path, |out| {
                std::io::Write::write_all(out, queues_csv(&data.queues).as_bytes())
            }),
            Content::Report => super::write_report(&path, summary),
            Content::Logs => continue,
        };
        if let Err(e) = done {
            // The requests file failed first (during the run): its error
            // is the one to tell.
            return Err(requests_failed.unwrap_or(e));
        }
        written.push(path);
    }
    match requests_failed {
        Some(e) => Err(e),
        None => Ok(written),
    }
}

/// Jaeger file `index`: its share of the kept traces (an empty file when
/// none was kept).
fn write_jaeger(path: &Path, kept: Option<&KeptFile>, index: usize) -> Result<(), OutputError> {
    super::write_atomically(path, |w| match kept {
        Some(kept) => kept.write_file(index, w),
        None => std::io::Write::write_all(w, b"{\"data\":[]}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::analysis::testing::{mixed_records, summary};

    /// Writes `files` into `dir` with `requests`, `interval_logs` and no
    /// traces.
    fn write_untraced(
        dir: &Path,
        s: &Summary,
        files: &[RunFile],
        requests: RequestsWriter,
        interval_logs: Vec<HlogFile>,
    ) -> Result<Vec<PathBuf>, OutputError> {
        write_run(
            dir,
            s,
            files,
            RunData {
                requests: Ok(requests),
                traces: None,
                interval_logs,
                processes: Vec::new(),
                queues: Vec::new(),
            },
        )
    }

    #[test]
    fn the_summary_lists_exactly_the_files_written() {
        let s = summary();
        let files = run_files(&s, 1);
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "summary.json",
                "requests.csv",
                "base.hgrm",
                "base.hlog",
                TRACES_FILE,
                "report.html",
                "logs/"
            ]
        );
        // summary.json's `files`, as it has always read.
        let listed = describe(&files);
        let expected: BTreeMap<String, String> = [
            ("summary.json", "this file"),
            ("requests.csv", "one row per measured request"),
            (
                "base.hgrm",
                "latency percentile distribution of variant base",
            ),
            (
                "base.hlog",
                "latency per interval of variant base, HdrHistogram interval log",
            ),
            (
                TRACES_FILE,
                "the kept traces, for Jaeger's UI (Search, Upload JSON)",
            ),
            (
                "report.html",
                "the self-contained HTML report (tailmesh report <run-folder> redraws it)",
            ),
            ("logs/", "each hop process's config and log"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(listed, expected);
        assert!(!describe(&run_files(&s, 0)).contains_key(TRACES_FILE));
        let split: Vec<String> = run_files(&s, 2).into_iter().map(|f| f.name).collect();
        assert!(
            split.contains(&"traces-2.jaeger.json".to_owned()),
            "{split:?}"
        );

        let dir = tempfile::tempdir().expect("temp dir");
        let records = mixed_records();
        let mut requests =
            RequestsWriter::create(&dir.path().join("requests.csv"), Duration::from_millis(15))
                .expect("requests.csv started");
        requests.begin_variant("base");
        for r in &records {
            requests.write(r).expect("a row");
        }
        let spool = crate::output::HlogSpool::start(|_, e| panic!("{e}")).expect("the thread");
        spool.begin_variant(&dir.path().join("base.hlog"), "base", vec!["a".into()]);
        spool.end_variant();
        let logs = spool.finish().expect("the log written");
        let written = write_untraced(dir.path(), &s, &files, requests, logs).expect("written");
        let written: Vec<String> = written
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        // Every file listed but the launcher's logs, in the listed order.
        assert_eq!(written, names[..names.len() - 1]);
        for name in &written {
            assert!(dir.path().join(name).is_file(), "{name}");
        }
        let rows = crate::output::read_requests_csv(&dir.path().join("requests.csv"))
            .expect("requests.csv reads");
        assert_eq!(rows.len(), records.len());
    }

    #[test]
    fn a_requests_file_lost_mid_run_is_reported_after_the_other_files() {
        let s = summary();
        let files = run_files(&s, 0);
        let dir = tempfile::tempdir().expect("temp dir");
        let requests = RequestsWriter::create(&dir.path().join("requests.csv"), Duration::ZERO)
            .expect("requests.csv started");
        // The partial file vanishes, as on a disk that filled mid-run.
        std::fs::remove_dir_all(dir.path()).expect("remove");
        std::fs::create_dir(dir.path()).expect("recreate");
        let mut requests = requests;
        requests.begin_variant("base");
        for r in &mixed_records() {
            // Rows still go into the unlinked file: make the flush fail.
            let _ = requests.write(r);
        }
        let err = write_untraced(dir.path(), &s, &files, requests, Vec::new());
        // Every file but requests.csv was written, requests.csv is absent.
        assert!(dir.path().join("summary.json").is_file());
        assert!(dir.path().join("report.html").is_file());
        assert!(!dir.path().join("requests.csv").exists());
        let e = err.expect_err("the lost file is reported");
        assert!(e.to_string().contains("requests.csv"), "{e}");
    }
}
