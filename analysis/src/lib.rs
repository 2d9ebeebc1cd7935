//! tailmesh's analysis: from measured requests, fed one at a time, and
//! plain data about the run to the finished reports. No runtime, no I/O,
//! no clock (the orchestrator reads the host's facts, converts the mesh's
//! protobuf answers and writes the files); warnings come back as strings
//! for the caller to print. Its inputs are its own plain types (`record`,
//! `traces`) and `tailmesh-model`'s (the checked scenario, client policies,
//! fault records).
//!
//! - `record`: what the load generator measured: each request with its
//!   reply's path and attempts, the warmup, the machine during the load,
//!   the processes' peak memory.
//! - `traces`: what the run's traces showed, as summary.json holds it.
//! - `facts`: what the scenario says, read once: the faults with a window
//!   and their labels, a hop's declared slow probability and work bound.
//! - `stats`: latency histograms (µs, 3 digits), percentiles, Wilson interval.
//! - `compounding`: `1 - prod(1 - p_i)` against the measured slow fraction.
//! - `attribution`: why each slow request was slow, counted per cause.
//! - `verdict`: the compounding verdict, refined by the attribution and the
//!   machine's state, decided in one place.
//! - `instrument`: whether the machine was busy during the load window.
//! - `observer`: what tracing cost in the run it traced.
//! - `intervals`: requests and answers over time, in fixed intervals.
//! - `latency_intervals`: latency over time, a histogram per interval (end
//!   to end and per hop), closed when no request meant for it can still
//!   come, handed to the `.hlog` writer and summarized for the chart.
//! - `slice`: one slice of the requests (the whole variant, or a phase)
//!   counted and judged the same way: outcomes, latency, slow counts,
//!   attribution, composition.
//! - `phases`: results per phase of the schedule (fault windows, load
//!   steps), the recovery after a window, the knee of a ramp.
//! - `broker`: the broker's per-topic statistics as summary.json holds them.
//! - `endpoints`: what the push callers saw of the replicas they call, and
//!   the replicas killed on schedule.
//! - `variant`: one variant's requests -> [`VariantReport`], through
//!   `VariantAccumulator`.
//! - `summary`: the whole run -> [`Summary`] (summary.json's shape).
//! - `sweep`: a swept scenario's table and compounding curve.
//! - `compose`: latency distributions on a grid, composed by the rules of
//!   chains, fan-outs, hedges, retries and timeouts; bootstrap intervals for
//!   measured quantiles.
//! - `declared`: the end-to-end latency a scenario declares, composed
//!   from its hops' work, faults and client policies before anything runs.
//! - `composition`: the whole tail composed from each request's segments
//!   (as if independent, and shuffled) against the measured one, the
//!   dependence figure and `[check] distribution`.
//! - `what_if`: a changed variant's latency composed from a run's measured
//!   segments with the change applied.
//! - `gate`: `compare --gate`, run B against run A with bootstrap intervals.
//! - `testing` (tests and the `testing` feature): builders of variants,
//!   records and summaries.

pub mod attribution;
pub mod broker;
pub mod compose;
pub mod composition;
pub mod compounding;
pub mod declared;
pub mod endpoints;
pub mod facts;
pub mod gate;
pub mod instrument;
pub mod intervals;
pub mod latency_intervals;
pub mod observer;
pub mod phases;
pub mod record;
pub mod slice;
pub mod stats;
pub mod summary;
pub mod sweep;
pub mod traces;
pub mod variant;
pub mod verdict;
pub mod what_if;

/// Builders of variants, records and summaries for tests, here and in
/// the orchestrator's (the `testing` feature).
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use broker::BrokerTopicStats;
pub use compose::{ComposeError, Dist, Grid, MAX_BINS, MIN_BIN, bootstrap_quantiles, grid_for};
pub use composition::{
    CompositionReport, Correlation, Dependence, HOP_SEGMENTS, MeasuredSegments, QuantileBand,
    Quantiles, SegmentSummary, SpectrumPoint, TailSegment,
};
pub use declared::{BUSY, Declared, Overhead, Undeclared, declared, declared_in_force};
pub use endpoints::{CallerEndpoints, CallerPicks, EndpointEvent, KillRecord, ReplicaCounts};
pub use gate::{
    DEFAULT_ERROR_TOLERANCE, DEFAULT_REPLICATES, DEFAULT_TOLERANCE, GateReport, GateRule,
    GateVerdict, MetricGate, VariantGate, gate,
};
pub use instrument::InstrumentReport;
pub use intervals::{IntervalSeries, IntervalStats};
pub use latency_intervals::LatencyPoint;
pub use observer::ObserverReport;
pub use phases::{Knee, PhaseReport, Recovery, RecoveryOutcome};
pub use stats::Percentiles;
pub use summary::{CheckSummary, Summary};
pub use sweep::SweepSummary;
pub use variant::VariantReport;
pub use verdict::{CompoundingReport, DistributionCheck, Verdict};

pub use summary::{RunFacts, summarize_run};
pub use sweep::summarize_sweep;
pub use variant::{Rebuild, VariantAccumulator, VariantContext};
