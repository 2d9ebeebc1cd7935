//! Result writers: the files in `results/<run>/` and the terminal table.
//!
//! - `hgrm`: HdrHistogram percentile distributions (`*.hgrm`).
//! - `csv`: one row per request (`requests.csv`).
//! - `hlog`: latency per interval, HdrHistogram interval logs (`*.hlog`),
//!   written while the run goes.
//! - `json`: the run summary (`summary.json`).
//! - `files`: the run folder's files, listed once, and their writer.
//! - `table`: the human summary printed at the end of a run.
//! - `causes`: why requests were slow, for the terminal and the report.
//! - `bars`: terminal latency histograms, a bar per bucket.
//! - `phases`: a variant's phases as text (the per-phase table's cells,
//!   the knee) and the bands of fault windows and load steps.
//! - `report`: the self-contained HTML report (`report.html`).
//! - `svg`: the hand-written SVG charts the report inlines.
//! - `compare`: two runs side by side (`tailmesh compare`).

pub mod bars;
pub mod causes;
pub mod compare;
pub mod csv;
pub mod files;
pub mod hgrm;
pub mod hlog;
pub mod json;
pub(crate) mod phases;
pub mod report;
pub mod segments;
pub mod svg;
pub mod table;

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

pub use bars::render_histogram;
pub use compare::{regressed_metrics, render_comparison, render_gate};
pub use csv::{
    CSV_HEADER, CSV_VERSION, RequestsSpool, RequestsWriter, for_each_request, read_requests_csv,
    write_requests_csv,
};
pub use files::{RunData, RunFile, TRACES_FILE, describe, run_files, write_run};
pub use hgrm::{format_percentile_distribution, write_hgrm};
pub(crate) use hlog::{HlogFile, HlogSpool};
pub use json::{comparison_json, write_comparison, write_summary};
pub use report::{render_report, write_report};
pub use table::{render_files, render_legend, render_table};

/// Why a result file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Creating or writing the file failed.
    #[error("write {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The results folder cannot take files (checked before a run starts).
    #[error("the results folder {} cannot be written: {source}", dir.display())]
    NotWritable {
        /// The run folder.
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The results disk cannot hold what the run is estimated to write
    /// (checked before a run starts).
    #[error(
        "the results folder {} has {} free, but this run is estimated to write {} \
         ({} measured requests at about {} bytes per requests.csv row{}); \
         free some space or pass --results a folder on a larger disk",
        dir.display(),
        megabytes(*free),
        megabytes(estimate.bytes),
        estimate.requests,
        estimate.row_bytes,
        if estimate.trace_bytes > 0 {
            format!(", plus {} of traces", megabytes(estimate.trace_bytes))
        } else {
            String::new()
        }
    )]
    NoRoom {
        /// The run folder.
        dir: PathBuf,
        /// Bytes available to this user on its disk.
        free: u64,
        /// What the run would write.
        estimate: OutputEstimate,
    },
    /// An interval of a `.hlog` could not be serialized or written.
    #[error("write {}: {source}", path.display())]
    Hlog {
        path: PathBuf,
        source: hdrhistogram::serialization::interval_log::IntervalLogWriterError<
            hdrhistogram::serialization::V2DeflateSerializeError,
        >,
    },
    /// A results file read back is not what tailmesh writes.
    #[error("read {}: line {line}: unexpected {what}", path.display())]
    Parse {
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// What was wrong.
        what: String,
    },
}

impl OutputError {
    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + '_ {
        move |source| OutputError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Writes a result file whole or not at all: into a hidden file beside
/// `path`, synced, then renamed over it. On any error the hidden file is
/// removed and `path` is untouched, so a full disk leaves no truncated
/// result behind.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), OutputError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let partial = path.with_file_name(format!(".{name}.partial"));
    let result = File::create(&partial).and_then(|file| {
        let mut out = BufWriter::new(file);
        write(&mut out)?;
        out.flush()?;
        out.get_ref().sync_data()?;
        std::fs::rename(&partial, path)
    });
    result.map_err(|source| {
        let _ = std::fs::remove_file(&partial);
        OutputError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// What a run is expected to write into its folder, estimated before it
/// starts from its request count (rate x duration, or the requests asked
/// for).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutputEstimate {
    /// Measured requests expected, every variant together.
    pub requests: u64,
    /// Bytes of one requests.csv row, about (the widest variant's).
    pub row_bytes: u64,
    /// Bytes of traces expected (0 untraced).
    pub trace_bytes: u64,
    /// Everything: the rows, the traces, and the fixed files (summary,
    /// histograms, report).
    pub bytes: u64,
}

/// `bytes` in megabytes, one decimal: "12.3 MB".
fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Checks, before a run starts, that the disk of `dir` has room for
/// `estimate`: a run that cannot keep its results is refused at once
/// instead of failing hours in. A disk whose free space cannot be read is
/// not refused (the write check above still guards it).
pub fn check_room(dir: &Path, estimate: &OutputEstimate) -> Result<(), OutputError> {
    let Ok(stat) = nix::sys::statvfs::statvfs(dir) else {
        return Ok(());
    };
    let free = stat.blocks_available().saturating_mul(stat.fragment_size());
    if free < estimate.bytes {
        return Err(OutputError::NoRoom {
            dir: dir.to_path_buf(),
            free,
            estimate: *estimate,
        });
    }
    Ok(())
}

/// Checks, before a run starts, that `dir` takes a file: a read-only or
/// full disk fails the run at once instead of after the experiment.
pub fn check_writable(dir: &Path) -> Result<(), OutputError> {
    write_atomically(&dir.join(".write-check"), |out| {
        out.write_all(b"tailmesh\n")
    })
    .and_then(|()| std::fs::remove_file(dir.join(".write-check")).map_err(OutputError::io(dir)))
    .map_err(|e| OutputError::NotWritable {
        dir: dir.to_path_buf(),
        source: match e {
            OutputError::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        },
    })
}
