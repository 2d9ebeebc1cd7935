//! Analysis: pure functions from measured records to reports. Nothing here
//! does I/O except [`Environment::detect`], which reads the host's facts.
//!
//! - `stats`: latency histograms (µs, 3 digits), percentiles, Wilson interval.
//! - `compounding`: `1 - prod(1 - p_i)` against the measured slow fraction.
//! - `variant`: one variant's records -> [`VariantReport`].
//! - `summary`: the whole run -> [`Summary`] (summary.json's shape).
//! - `sweep`: a swept scenario's table and compounding curve.

pub mod compounding;
pub mod stats;
pub mod summary;
pub mod sweep;
pub mod variant;

#[cfg(test)]
pub(crate) mod testing;

pub use compounding::{CompoundingReport, HopSlowness, Verdict, compound};
pub use stats::{Percentiles, SIGFIG, Z95, new_histogram, record_us, wilson, wilson95};
pub use summary::{CheckSummary, Environment, ScenarioEcho, Summary};
pub use sweep::{SweepSummary, summarize_sweep};
pub use variant::{HopReport, LoadSummary, Override, VariantReport, analyze_variant};
