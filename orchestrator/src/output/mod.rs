//! Result writers: the files in `results/<run>/` and the terminal table.
//!
//! - `hgrm`: HdrHistogram percentile distributions (`*.hgrm`).
//! - `csv`: one row per request (`requests.csv`).
//! - `json`: the run summary (`summary.json`).
//! - `table`: the human summary printed at the end of a run.
//! - `bars`: terminal latency histograms, a bar per bucket.

pub mod bars;
pub mod csv;
pub mod hgrm;
pub mod json;
pub mod table;

use std::path::{Path, PathBuf};

pub use bars::render_histogram;
pub use csv::{CSV_HEADER, write_requests_csv};
pub use hgrm::{format_percentile_distribution, write_hgrm};
pub use json::write_summary;
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
}

impl OutputError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + '_ {
        move |source| OutputError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
