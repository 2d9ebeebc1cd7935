//! Result writers: the files in `results/<run>/` and the terminal table.
//!
//! - `hgrm`: HdrHistogram percentile distributions (`*.hgrm`).
//! - `csv`: one row per request (`requests.csv`).
//! - `json`: the run summary (`summary.json`).
//! - `table`: the human summary printed at the end of a run.
//! - `bars`: terminal latency histograms, a bar per bucket.
//! - `report`: the self-contained HTML report (`report.html`).
//! - `svg`: the hand-written SVG charts the report inlines.
//! - `compare`: two runs side by side (`tailmesh compare`).

pub mod bars;
pub mod compare;
pub mod csv;
pub mod hgrm;
pub mod json;
pub mod report;
pub mod svg;
pub mod table;

use std::path::{Path, PathBuf};

pub use bars::render_histogram;
pub use compare::render_comparison;
pub use csv::{CSV_HEADER, read_requests_csv, write_requests_csv};
pub use hgrm::{format_percentile_distribution, write_hgrm};
pub use json::write_summary;
pub use report::{render_report, write_report};
pub use table::render_table;

/// Why a result file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Creating or writing the file failed.
    #[error("write {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The summary could not be serialized.
    #[error("serialize {}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// A results file read back is not what tailmesh writes.
    #[error("read {}: line {line}: unexpected {what}", path.display())]
    Parse {
        /// The file.
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
