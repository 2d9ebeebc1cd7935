//! Traces of a real system read into one shape, and the mesh they show.
//!
//! Every tracing backend records the same thing in its own format: which
//! service served a request, when, and which services it called while it
//! did. This crate reads four such formats into one call tree per trace
//! ([`Invocation`]), repairing what real traces get wrong and counting each
//! repair ([`Repairs`]), then folds the trees into a [`Mesh`]: the services,
//! who calls whom, how often and in what order, and each service's own
//! time as an empirical distribution. No I/O beyond the reader handed in,
//! no clock, no async: plain data in, plain data out.
//!
//! - [`span`]: the span formats' common shape ([`span::Span`]) and the
//!   call tree built from a trace's spans (`span::invocations`).
//! - [`jaeger`], [`otlp`], [`zipkin`]: the span formats' readers.
//! - [`alibaba`]: Alibaba's microservice call-graph CSV (MSCallGraph),
//!   whose rows are calls, not spans.
//! - [`tree`]: [`Invocation`], one service serving one request, and the
//!   timing repairs every format shares.
//! - [`mesh`]: [`Mesh`], the services and edges the trees show.
//! - [`scenario`]: a mesh written as a tailmesh scenario, where the
//!   scenario format can say what it shows.
//! - `error`: [`ImportError`], always naming the file and the line or span.

pub mod alibaba;
mod error;
pub mod jaeger;
pub mod mesh;
pub mod otlp;
pub mod scenario;
pub mod span;
pub mod tree;
pub mod zipkin;

use std::io::BufRead;

pub use error::ImportError;
pub use mesh::Mesh;
pub use tree::{Invocation, Repairs};

/// The formats `tailmesh import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Jaeger's JSON (`{"data": [trace, ...]}`): the UI's download and
    /// tailmesh's own `traces.jaeger.json`.
    Jaeger,
    /// OTLP JSON: one `ExportTraceServiceRequest` per line, as the
    /// OpenTelemetry Collector's file exporter writes it.
    Otlp,
    /// Zipkin v2 JSON: a list of spans.
    Zipkin,
    /// Alibaba's MSCallGraph CSV (cluster-trace-microservices-v2022).
    Alibaba,
}

impl Format {
    /// Every format with its name on the command line.
    pub const ALL: [(&'static str, Format); 4] = [
        ("jaeger", Format::Jaeger),
        ("otlp", Format::Otlp),
        ("zipkin", Format::Zipkin),
        ("alibaba", Format::Alibaba),
    ];

    /// The format called `name` on the command line.
    pub fn from_name(name: &str) -> Option<Format> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, f)| f)
    }
}

/// What one import read: each trace's call trees, and what was repaired
/// or dropped on the way.
#[derive(Debug, Default)]
pub struct Imported {
    /// One entry per trace kept: its root invocations (a trace has more
    /// than one root only when its entry service's own record is missing).
    pub traces: Vec<Vec<Invocation>>,
    pub repairs: Repairs,
}

impl Imported {
    /// Adds another file's traces and repairs to these.
    pub fn extend(&mut self, other: Imported) {
        self.traces.extend(other.traces);
        self.repairs.add(&other.repairs);
    }
}

/// Records grouped by trace, the traces in the order they first appear
/// (a file's order is kept, so the same file always imports the same way).
pub(crate) struct ByTrace<V> {
    order: Vec<String>,
    groups: std::collections::HashMap<String, V>,
}

impl<V: Default> ByTrace<V> {
    pub(crate) fn new() -> Self {
        ByTrace {
            order: Vec::new(),
            groups: std::collections::HashMap::new(),
        }
    }

    /// The group of `trace`, made empty the first time.
    pub(crate) fn entry(&mut self, trace: &str) -> &mut V {
        if !self.groups.contains_key(trace) {
            self.order.push(trace.to_string());
        }
        self.groups.entry(trace.to_string()).or_default()
    }

    /// Each trace's call trees, made by `tree` from its group, in order; a
    /// trace left with no tree is counted as dropped for `why`.
    pub(crate) fn assemble(
        mut self,
        mut repairs: Repairs,
        why: &str,
        mut tree: impl FnMut(V, &mut Repairs) -> Vec<Invocation>,
    ) -> Imported {
        let mut imported = Imported::default();
        for trace in self.order {
            let group = self.groups.remove(&trace).unwrap_or_default();
            repairs.traces_read += 1;
            let roots = tree(group, &mut repairs);
            if roots.is_empty() {
                repairs.drop(why);
            } else {
                imported.traces.push(roots);
            }
        }
        imported.repairs = repairs;
        imported
    }
}

/// Reads one file's contents in `format`; `file` names it in errors.
pub fn read(format: Format, file: &str, input: impl BufRead) -> Result<Imported, ImportError> {
    match format {
        Format::Jaeger => span::assemble(jaeger::read(file, input)?),
        Format::Otlp => span::assemble(otlp::read(file, input)?),
        Format::Zipkin => span::assemble(zipkin::read(file, input)?),
        Format::Alibaba => alibaba::read(file, input),
    }
}
