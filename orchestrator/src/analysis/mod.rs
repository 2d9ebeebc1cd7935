//! Analysis: pure functions from measured records to reports. Nothing here
//! does I/O except [`Environment::detect`], which reads the host's facts.
//!
//! - `stats`: latency histograms (µs, 3 digits), percentiles, Wilson interval.
//! - `compounding`: `1 - prod(1 - p_i)` against the measured slow fraction.
//! - `attribution`: why each slow request was slow, and the verdict's
//!   decomposition by cause.
//! - `variant`: one variant's records -> [`VariantReport`].
//! - `summary`: the whole run -> [`Summary`] (summary.json's shape).
//! - `sweep`: a swept scenario's table and compounding curve.

pub(crate) mod attribution;
pub(crate) mod compounding;
pub(crate) mod stats;
pub(crate) mod summary;
pub(crate) mod sweep;
pub(crate) mod variant;

#[cfg(test)]
pub(crate) mod testing;

pub(crate) use stats::Percentiles;
pub(crate) use summary::Summary;
pub(crate) use sweep::{SweepSummary, summarize_sweep};
pub(crate) use variant::VariantReport;
