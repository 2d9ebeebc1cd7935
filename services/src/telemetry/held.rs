//! Spans held where they were made until the run decides which traces to
//! keep (retroactive sampling): the exporter thread puts every span it
//! takes into [`Held`], by trace; a keep decision sends that trace's
//! spans on, and its later spans at once; a drop decision evicts the
//! trace's spans unsent, which is all a dropped trace costs; a trace not
//! decided within the hold time, or the oldest when the spans held pass
//! their cap, is evicted too. A keep decision
//! that comes after its trace was evicted is a lost trace: counted, with
//! how long after the trace's first span it came (the hold that would
//! have kept it).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use super::recorder::SpanRecord;

/// What [`Held`] holds: a span (as a process recorded it, or as bytes a
/// receiver took) and its trace.
pub trait HeldSpan {
    /// The span's trace id.
    fn trace_id(&self) -> u128;
    /// What recording it cost its process, ns (0 when unknown).
    fn cost_ns(&self) -> u64 {
        0
    }
}

impl HeldSpan for SpanRecord {
    fn trace_id(&self) -> u128 {
        self.trace_id
    }

    fn cost_ns(&self) -> u64 {
        self.cost_ns
    }
}

/// How long, and how many spans, a process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldLimits {
    /// A trace's spans wait this long after its first one for a decision.
    pub hold: Duration,
    /// Spans held at most; past it, the oldest traces are evicted early.
    pub max_spans: usize,
}

/// What [`Held`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldCounts {
    /// Spans evicted unsent: their traces were not kept.
    pub evicted_spans: u64,
    /// Of those, spans evicted before their hold ran out (the cap).
    pub evicted_early: u64,
    /// The serving threads' cost of the spans evicted, ns.
    pub evicted_cost_ns: u64,
    /// Traces kept after their spans were evicted.
    pub lost_traces: u64,
    /// The longest a lost trace's decision came after its first span.
    pub lost_delay: Duration,
    /// Decisions the run had forgotten when this process asked (it asked
    /// too late): their traces, if held here, are lost uncounted above.
    pub forgotten_decisions: u64,
}

/// Spans by trace, waiting for the run's decisions.
#[derive(Debug)]
pub struct Held<S = SpanRecord> {
    limits: HoldLimits,
    traces: HashMap<u128, Vec<S>>,
    /// Traces in the order their first span came, with when (ns since
    /// the holder's epoch); a trace already sent or evicted is skipped.
    order: VecDeque<(u128, u64)>,
    spans: usize,
    /// Traces kept whose later spans go on at once, with when they were
    /// kept, for one hold.
    kept: HashSet<u128>,
    kept_order: VecDeque<(u128, u64)>,
    /// Traces evicted, with their first span's time, for one hold past
    /// their eviction: a decision for one of them is a loss.
    evicted: HashMap<u128, u64>,
    evicted_order: VecDeque<(u128, u64)>,
    counts: HeldCounts,
}

impl<S: HeldSpan> Held<S> {
    pub fn new(limits: HoldLimits) -> Held<S> {
        Held {
            limits,
            traces: HashMap::new(),
            order: VecDeque::new(),
            spans: 0,
            kept: HashSet::new(),
            kept_order: VecDeque::new(),
            evicted: HashMap::new(),
            evicted_order: VecDeque::new(),
            counts: HeldCounts::default(),
        }
    }

    pub fn counts(&self) -> HeldCounts {
        self.counts
    }

    /// Whether `trace` was kept within the last hold: its spans go on
    /// as they come.
    pub fn is_kept(&self, trace: u128) -> bool {
        self.kept.contains(&trace)
    }

    /// Spans held now.
    pub fn len(&self) -> usize {
        self.spans
    }

    pub fn is_empty(&self) -> bool {
        self.spans == 0
    }

    /// Takes `span`, come at `now` (ns): into `out` when its trace was
    /// kept, else held (evicting the oldest traces past the cap).
    pub fn add(&mut self, span: S, now: u64, out: &mut Vec<S>) {
        let trace = span.trace_id();
        if self.kept.contains(&trace) {
            out.push(span);
            return;
        }
        let spans = self.traces.entry(trace).or_default();
        if spans.is_empty() {
            self.order.push_back((trace, now));
        }
        spans.push(span);
        self.spans += 1;
        while self.spans > self.limits.max_spans {
            if !self.evict_oldest(now, true) {
                break;
            }
        }
    }

    /// The run kept `traces`, decided at `now`: their held spans into
    /// `out`, their later ones sent as they come.
    pub fn keep(&mut self, traces: impl IntoIterator<Item = u128>, now: u64, out: &mut Vec<S>) {
        for trace in traces {
            if let Some(spans) = self.traces.remove(&trace) {
                self.spans -= spans.len();
                out.extend(spans);
            }
            // Some or all of its spans went unsent.
            if let Some(first) = self.evicted.remove(&trace) {
                self.counts.lost_traces += 1;
                let delay = Duration::from_nanos(now.saturating_sub(first));
                self.counts.lost_delay = self.counts.lost_delay.max(delay);
            }
            if self.kept.insert(trace) {
                self.kept_order.push_back((trace, now));
            }
        }
    }

    /// The run dropped `traces`: their held spans are evicted now, not
    /// when their hold runs out (a later span of one waits out its hold).
    pub fn drop_traces(&mut self, traces: impl IntoIterator<Item = u128>) {
        for trace in traces {
            if let Some(spans) = self.traces.remove(&trace) {
                let n = spans.len();
                self.spans -= n;
                self.counts.evicted_spans += n as u64;
                self.counts.evicted_cost_ns += spans.iter().map(HeldSpan::cost_ns).sum::<u64>();
            }
        }
    }

    /// Notes `n` decisions the run had forgotten when asked.
    pub fn forgotten(&mut self, n: u64) {
        self.counts.forgotten_decisions += n;
    }

    /// Evicts the traces held past their hold at `now`, and forgets
    /// decisions and evictions older than a hold.
    pub fn expire(&mut self, now: u64) {
        let hold = u64::try_from(self.limits.hold.as_nanos()).unwrap_or(u64::MAX);
        while self
            .order
            .front()
            .is_some_and(|(_, first)| now.saturating_sub(*first) >= hold)
        {
            // The front trace itself, when still held: one sent or
            // dropped since leaves only its entry.
            if let Some((trace, first)) = self.order.pop_front() {
                self.evict(trace, first, now, false);
            }
        }
        while let Some(&(trace, at)) = self.kept_order.front() {
            if now.saturating_sub(at) < hold {
                break;
            }
            self.kept_order.pop_front();
            self.kept.remove(&trace);
        }
        while let Some(&(trace, at)) = self.evicted_order.front() {
            if now.saturating_sub(at) < hold {
                break;
            }
            self.evicted_order.pop_front();
            self.evicted.remove(&trace);
        }
    }

    /// Evicts the oldest trace still held; `false` when none is.
    fn evict_oldest(&mut self, now: u64, early: bool) -> bool {
        while let Some((trace, first)) = self.order.pop_front() {
            if self.evict(trace, first, now, early) {
                return true;
            }
        }
        false
    }

    /// Evicts `trace`, whose first span came at `first`, if it is still
    /// held (it may have been sent or dropped since).
    fn evict(&mut self, trace: u128, first: u64, now: u64, early: bool) -> bool {
        let Some(spans) = self.traces.remove(&trace) else {
            return false;
        };
        let n = spans.len();
        self.spans -= n;
        self.counts.evicted_spans += n as u64;
        self.counts.evicted_cost_ns += spans.iter().map(HeldSpan::cost_ns).sum::<u64>();
        if early {
            self.counts.evicted_early += n as u64;
        }
        self.evicted.insert(trace, first);
        self.evicted_order.push_back((trace, now));
        true
    }

    /// Evicts every trace still held (a process stopping: its last
    /// decisions were asked for already).
    pub fn evict_all(&mut self, now: u64) {
        while self.evict_oldest(now, false) {}
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::SpanKind;

    use super::*;

    const MS: u64 = 1_000_000;

    fn span(trace: u128, id: u64) -> SpanRecord {
        SpanRecord {
            trace_id: trace,
            span_id: id,
            parent_span_id: 0,
            parent_remote: false,
            kind: SpanKind::Server,
            name: "s".into(),
            start_unix_ns: 0,
            end_unix_ns: 1,
            error: false,
            fields: Default::default(),
            cost_ns: 0,
        }
    }

    fn ids(out: &[SpanRecord]) -> Vec<u64> {
        let mut v: Vec<u64> = out.iter().map(|s| s.span_id).collect();
        v.sort_unstable();
        v
    }

    fn held(hold_ms: u64, max_spans: usize) -> Held<SpanRecord> {
        Held::new(HoldLimits {
            hold: Duration::from_millis(hold_ms),
            max_spans,
        })
    }

    #[test]
    fn a_kept_trace_is_sent_whole_and_its_late_spans_at_once() {
        let mut h = held(100, 1000);
        let mut out = Vec::new();
        h.add(span(1, 10), 0, &mut out);
        h.add(span(2, 20), MS, &mut out);
        h.add(span(1, 11), 2 * MS, &mut out);
        assert!(out.is_empty(), "nothing goes before a decision");
        h.keep([1], 3 * MS, &mut out);
        assert_eq!(ids(&out), [10, 11]);
        assert_eq!(h.len(), 1, "trace 2 still waits");
        // A span of the kept trace that comes after the decision (a hop
        // still working when the request timed out) goes at once.
        out.clear();
        h.add(span(1, 12), 4 * MS, &mut out);
        assert_eq!(ids(&out), [12]);
        assert_eq!(h.counts(), HeldCounts::default());
    }

    #[test]
    fn a_trace_not_kept_within_its_hold_is_evicted_and_a_late_decision_is_a_loss() {
        let mut h = held(100, 1000);
        let mut out = Vec::new();
        h.add(span(1, 10), 0, &mut out);
        h.add(span(1, 11), 5 * MS, &mut out);
        h.add(span(2, 20), 50 * MS, &mut out);
        h.expire(99 * MS);
        assert_eq!(h.len(), 3, "within the hold");
        h.expire(100 * MS);
        assert_eq!(h.len(), 1, "trace 1 evicted at its first span's hold");
        assert_eq!(h.counts().evicted_spans, 2);
        assert_eq!(h.counts().evicted_early, 0);
        h.keep([1, 3], 130 * MS, &mut out);
        assert!(out.is_empty());
        let c = h.counts();
        assert_eq!(c.lost_traces, 1, "trace 3 was never here: no loss");
        assert_eq!(c.lost_delay, Duration::from_millis(130));
        // Trace 2 is still there to keep.
        h.keep([2], 131 * MS, &mut out);
        assert_eq!(ids(&out), [20]);
        // A decision long after an eviction is forgotten with it.
        h.add(span(4, 40), 140 * MS, &mut out);
        h.expire(400 * MS);
        h.expire(600 * MS);
        h.keep([4], 600 * MS, &mut out);
        assert_eq!(h.counts().lost_traces, 1);
    }

    #[test]
    fn a_dropped_trace_goes_at_its_decision_and_its_late_spans_wait_out_their_hold() {
        let mut h = held(100, 1000);
        let mut out = Vec::new();
        h.add(span(1, 10), 0, &mut out);
        h.add(span(1, 11), MS, &mut out);
        h.add(span(2, 20), MS, &mut out);
        h.drop_traces([1, 3]);
        assert_eq!(h.len(), 1, "trace 1 went at once; trace 3 was never here");
        let c = h.counts();
        assert_eq!((c.evicted_spans, c.evicted_early), (2, 0));
        // A span of trace 1 after its decision is held, and evicted after
        // its hold like any undecided trace's.
        h.add(span(1, 12), 2 * MS, &mut out);
        h.expire(102 * MS);
        assert!(h.is_empty());
        assert!(out.is_empty());
        assert_eq!(h.counts().evicted_spans, 4);
        assert_eq!(h.counts().lost_traces, 0);
    }

    #[test]
    fn the_hold_of_a_trace_sent_or_dropped_early_never_evicts_a_younger_one() {
        let mut h = held(100, 1000);
        let mut out = Vec::new();
        h.add(span(1, 10), 0, &mut out);
        h.add(span(2, 20), 0, &mut out);
        h.keep([1], MS, &mut out);
        h.drop_traces([2]);
        h.add(span(3, 30), 90 * MS, &mut out);
        // Traces 1 and 2's holds run out; trace 3's has 90 ms to go.
        h.expire(101 * MS);
        assert_eq!(h.len(), 1);
        h.keep([3], 102 * MS, &mut out);
        assert_eq!(ids(&out), [10, 30]);
        assert_eq!(h.counts().lost_traces, 0);
    }

    #[test]
    fn past_the_cap_the_oldest_traces_go_early() {
        let mut h = held(10_000, 3);
        let mut out = Vec::new();
        for (t, s) in [(1, 10), (1, 11), (2, 20), (3, 30)] {
            h.add(span(t, s), s, &mut out);
        }
        assert_eq!(h.len(), 2, "trace 1's two spans made room");
        let c = h.counts();
        assert_eq!((c.evicted_spans, c.evicted_early), (2, 2));
        h.keep([1, 2], 100, &mut out);
        assert_eq!(ids(&out), [20]);
        assert_eq!(h.counts().lost_traces, 1);
        // What is left is evicted when the process stops.
        h.evict_all(200);
        assert!(h.is_empty());
        assert_eq!(h.counts().evicted_spans, 3);
    }
}
