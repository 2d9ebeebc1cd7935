//! What the load generator measured lives in `tailmesh-analysis`
//! (`tailmesh_analysis::record`, plain data, re-exported here at its old
//! path; `crate::wire` converts a reply's protobuf path into it). This
//! module keeps the orchestrator's side: [`RecordSink`], where each request
//! goes as it completes, the pipeline's bounds, and the thread behind the
//! load generator's (`behind`) where the orchestrator's sink reads them.

pub(crate) mod behind;

pub(crate) use tailmesh_analysis::record::{
    AttemptEnd, AttemptTiming, CallTiming, CpuUse, GeneratorReport, GrpcCode, HopRecord,
    MachineSamples, Outcome, RequestRecord, StreamPlace, StreamReport, WarmupCounts,
};

/// Where completed measured requests go, one at a time, as they complete:
/// the analysis accumulator, the requests file, the trace sampler. Nothing
/// downstream of the load generator holds every record.
pub(crate) trait RecordSink {
    /// Takes one completed request of the measured phase (by value: a
    /// sink may hand it on to another thread without a copy).
    fn record(&mut self, record: RequestRecord);

    /// The wall-clock time of the measured clock's 0 (the end of warmup),
    /// told once as the load starts, before any record.
    fn measuring_from(&mut self, _at: std::time::SystemTime) {}

    /// Measured requests sent so far (by this generator), told as they go.
    fn sent(&mut self, _measured: u64) {}
}

/// What the record pipeline held at most while a variant ran: the
/// structures that could grow with the number of requests, counted, so a
/// test can show they stay bounded by what is in flight instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PipelineStats {
    /// Measured records that went through the pipeline.
    pub records: u64,
    /// Requests sent and not yet ended, at most.
    pub peak_in_flight: usize,
    /// Records ended but not yet handed to the sinks, at most.
    pub peak_held: usize,
}
