//! The span formats' common shape, [`Span`], and the call tree built from
//! one trace's spans ([`assemble`]).
//!
//! A span starts a new [`Invocation`] when it serves a request: a root, a
//! SERVER or CONSUMER span, or a span of another service than its parent's.
//! Every other span (internal work, the CLIENT span of an outgoing call)
//! belongs to the invocation above it. A CLIENT or PRODUCER span directly
//! above an invocation is its caller's view of the call: its interval is
//! the caller's wait, network included.

use std::collections::HashMap;

use crate::{ByTrace, ImportError, Imported, Invocation, Repairs};

/// A span's kind, as OpenTelemetry names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

impl Kind {
    /// The kind a `span.kind` tag (Jaeger) or `kind` field (Zipkin) names.
    pub fn from_name(name: &str) -> Kind {
        match name.to_ascii_lowercase().as_str() {
            "server" => Kind::Server,
            "client" => Kind::Client,
            "producer" => Kind::Producer,
            "consumer" => Kind::Consumer,
            "internal" => Kind::Internal,
            _ => Kind::Unspecified,
        }
    }

    fn serves(self) -> bool {
        matches!(self, Kind::Server | Kind::Consumer)
    }

    fn calls(self) -> bool {
        matches!(self, Kind::Client | Kind::Producer)
    }
}

/// One span, as every span format has it. Times in nanoseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent: Option<String>,
    /// The reference to the parent is FOLLOWS_FROM: the parent did not
    /// wait for it.
    pub follows_from: bool,
    pub service: Option<String>,
    pub instance: Option<String>,
    pub operation: String,
    pub kind: Kind,
    pub start: i64,
    pub end: i64,
    pub error: bool,
    /// The service's own time as the span states it (ns): tailmesh's hops
    /// write the work and injected slowness they drew (`work_ns`) and the
    /// time it took (`service_ns`); the first of these there is.
    pub own: Option<i64>,
}

/// The attributes a span states its service's own time in, in the order
/// they are preferred: the time asked of a tailmesh hop, then the time it
/// took (which adds the machine's timer and scheduling delays, which a
/// hop running the imported scenario would add again).
pub const OWN_TIME_ATTRIBUTES: [&str; 2] = ["work_ns", "service_ns"];

/// Builds each trace's call tree from its spans, in the order the traces
/// first appear.
pub fn assemble(spans: Vec<Span>) -> Result<Imported, ImportError> {
    let mut by_trace: ByTrace<Vec<Span>> = ByTrace::new();
    let mut repairs = Repairs {
        records_read: spans.len() as u64,
        ..Repairs::default()
    };
    for span in spans {
        if span.trace_id.is_empty() || span.span_id.is_empty() {
            repairs.drop("a span without a trace or span id");
            continue;
        }
        by_trace.entry(&span.trace_id.clone()).push(span);
    }
    Ok(by_trace.assemble(repairs, "a trace with no span left", trace_tree))
}

/// One trace's spans as invocation trees.
fn trace_tree(spans: Vec<Span>, repairs: &mut Repairs) -> Vec<Invocation> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut kept: Vec<Span> = Vec::with_capacity(spans.len());
    for span in spans {
        if seen.contains_key(&span.span_id) {
            repairs.duplicates += 1;
            continue;
        }
        seen.insert(span.span_id.clone(), kept.len());
        kept.push(span);
    }
    let spans = kept;
    // A span whose parent is itself or missing has no place in the tree.
    let parent_of: Vec<Option<usize>> = spans
        .iter()
        .map(|s| {
            s.parent
                .as_ref()
                .and_then(|p| seen.get(p).copied())
                .filter(|&p| spans[p].span_id != s.span_id)
        })
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); spans.len()];
    let mut roots = Vec::new();
    let mut orphans = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        match (&s.parent, parent_of[i]) {
            (_, Some(p)) => children[p].push(i),
            (None, None) => roots.push(i),
            (Some(_), None) => orphans.push(i),
        }
    }
    // A parent cycle (a -> b -> a) leaves spans reachable from no root:
    // they are orphans too.
    repairs.orphans += orphans.len() as u64;
    if roots.is_empty() {
        if !orphans.is_empty() {
            repairs.rootless_traces += 1;
        }
        roots = orphans;
    }
    let services = services(&spans, &parent_of, repairs);
    let mut builder = Builder {
        spans: &spans,
        children: &children,
        services: &services,
        repairs,
        visited: vec![false; spans.len()],
    };
    let mut out = Vec::new();
    for r in roots {
        let mut root = builder.invocation(r, None);
        root.repair(builder.repairs);
        out.push(root);
    }
    // The orphans of a rooted trace were never reached: their subtrees are
    // left out (counted above), since where they hang is unknown.
    out
}

/// Each span's service: its own, else its nearest ancestor's, else
/// `unknown`.
fn services(spans: &[Span], parent_of: &[Option<usize>], repairs: &mut Repairs) -> Vec<String> {
    spans
        .iter()
        .enumerate()
        .map(|(i, s)| match &s.service {
            Some(name) if !name.is_empty() => name.clone(),
            _ => {
                repairs.no_service += 1;
                let mut at = parent_of[i];
                let mut steps = 0;
                while let Some(p) = at {
                    if let Some(name) = spans[p].service.as_ref().filter(|n| !n.is_empty()) {
                        return name.clone();
                    }
                    at = parent_of[p];
                    steps += 1;
                    if steps > spans.len() {
                        break;
                    }
                }
                "unknown".to_string()
            }
        })
        .collect()
}

struct Builder<'a> {
    spans: &'a [Span],
    children: &'a [Vec<usize>],
    services: &'a [String],
    repairs: &'a mut Repairs,
    visited: Vec<bool>,
}

impl Builder<'_> {
    /// The invocation span `i` starts; `caller` is the CLIENT or PRODUCER
    /// span its caller made the call with, if any.
    fn invocation(&mut self, i: usize, caller: Option<usize>) -> Invocation {
        self.visited[i] = true;
        let s = &self.spans[i];
        let (called_at, returned_at) = match caller {
            Some(c) => (self.spans[c].start, self.spans[c].end),
            None => (s.start, s.end),
        };
        let mut inv = Invocation {
            service: self.services[i].clone(),
            instance: s.instance.clone(),
            operation: s.operation.clone(),
            start: s.start,
            end: s.end,
            called_at,
            returned_at,
            error: s.error,
            own: s.own,
            children: Vec::new(),
            detached: Vec::new(),
        };
        self.descend(i, &mut inv);
        inv
    }

    /// Walks the spans below `i` that belong to `inv`, adding the
    /// invocations they lead to.
    fn descend(&mut self, i: usize, inv: &mut Invocation) {
        let mut made_a_call = false;
        for &c in &self.children[i] {
            if self.visited[c] {
                continue;
            }
            let span = &self.spans[c];
            let starts_invocation = span.kind.serves() || self.services[c] != inv.service;
            if starts_invocation {
                let caller = self.spans[i].kind.calls().then_some(i);
                let child = self.invocation(c, caller);
                if span.follows_from {
                    self.repairs.detached += 1;
                    inv.detached.push(child);
                } else {
                    inv.children.push(child);
                }
                made_a_call = true;
            } else {
                self.visited[c] = true;
                if span.error && span.kind.serves() {
                    inv.error = true;
                }
                self.descend(c, inv);
            }
        }
        if self.spans[i].kind.calls() && !made_a_call && self.children[i].is_empty() {
            self.repairs.uninstrumented_calls += 1;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A span of `service` in trace "t".
    pub(crate) fn span(
        id: &str,
        parent: Option<&str>,
        service: &str,
        kind: Kind,
        start: i64,
        end: i64,
    ) -> Span {
        Span {
            trace_id: "t".into(),
            span_id: id.into(),
            parent: parent.map(Into::into),
            service: Some(service.into()),
            operation: format!("{service}-op"),
            kind,
            start,
            end,
            ..Span::default()
        }
    }

    #[test]
    fn a_client_span_is_the_callers_view_of_the_call_below_it() {
        let spans = vec![
            span("1", None, "front", Kind::Server, 0, 100),
            span("2", Some("1"), "front", Kind::Client, 10, 60),
            span("3", Some("2"), "back", Kind::Server, 20, 50),
            span("4", Some("1"), "front", Kind::Internal, 70, 80),
        ];
        let imported = assemble(spans).expect("assembles");
        assert_eq!(imported.traces.len(), 1);
        let root = &imported.traces[0][0];
        assert_eq!(root.service, "front");
        assert_eq!(root.children.len(), 1);
        let back = &root.children[0];
        assert_eq!((back.start, back.end), (20, 50));
        assert_eq!((back.called_at, back.returned_at), (10, 60));
        // front waited 10..60 for back: its own time is 100 - 50.
        assert_eq!(root.own_time(), 50);
        assert_eq!(imported.repairs.uninstrumented_calls, 0);
    }

    #[test]
    fn messy_traces_are_repaired_and_counted() {
        let mut spans = vec![
            span("1", None, "front", Kind::Server, 100, 200),
            // Clock skew: starts before its caller.
            span("2", Some("1"), "back", Kind::Server, 90, 120),
            // A duplicate of it.
            span("2", Some("1"), "back", Kind::Server, 90, 120),
            // An orphan: its parent is not in the trace.
            span("3", Some("missing"), "lost", Kind::Server, 130, 140),
            // A client span to nothing instrumented.
            span("5", Some("1"), "front", Kind::Client, 150, 160),
        ];
        // No service name: takes its parent's.
        let mut nameless = span("4", Some("2"), "x", Kind::Internal, 95, 100);
        nameless.service = None;
        spans.push(nameless);
        // Asynchronous child.
        let mut later = span("6", Some("1"), "audit", Kind::Consumer, 190, 400);
        later.follows_from = true;
        spans.push(later);

        let imported = assemble(spans).expect("assembles");
        let r = &imported.repairs;
        assert_eq!(r.duplicates, 1);
        assert_eq!(r.orphans, 1);
        assert_eq!(r.no_service, 1);
        assert_eq!(r.clock_skew, 1);
        assert_eq!(r.detached, 1);
        assert_eq!(r.uninstrumented_calls, 1);
        let root = &imported.traces[0][0];
        assert_eq!(root.children.len(), 1, "the orphan is not hung anywhere");
        assert_eq!(root.children[0].start, 100, "shifted into its caller");
        assert_eq!(root.detached[0].service, "audit");
    }

    #[test]
    fn a_trace_without_its_root_keeps_its_subtrees() {
        let spans = vec![
            span("2", Some("gone"), "a", Kind::Server, 0, 10),
            span("3", Some("gone"), "b", Kind::Server, 20, 30),
        ];
        let imported = assemble(spans).expect("assembles");
        assert_eq!(imported.repairs.rootless_traces, 1);
        assert_eq!(imported.traces[0].len(), 2);
    }
}
