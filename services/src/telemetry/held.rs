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

/// Spans by trace, waiting for the run's decisions. Every span the
/// process makes passes through here, so nothing here allocates per span
/// or per trace once warm: spans sit in a slab of slots chained by trace,
/// and the maps key trace ids with [`TraceIds`].
#[derive(Debug)]
pub struct Held<S = SpanRecord> {
    limits: HoldLimits,
    traces: HashMap<u128, Chain, TraceIds>,
    slots: Vec<Slot<S>>,
    /// Slots free for reuse.
    free: Vec<u32>,
    /// Traces in the order their first span came, with when (ns since
    /// the holder's epoch); an entry whose trace was sent, evicted or
    /// held again since is skipped.
    order: VecDeque<(u128, u64)>,
    spans: usize,
    /// Traces kept whose later spans go on at once, with when they were
    /// kept, for one hold.
    kept: HashSet<u128, TraceIds>,
    kept_order: VecDeque<(u128, u64)>,
    /// Traces evicted, with their first span's time, for one hold past
    /// their eviction: a decision for one of them is a loss.
    evicted: HashMap<u128, u64, TraceIds>,
    evicted_order: VecDeque<(u128, u64)>,
    counts: HeldCounts,
}

/// A held trace: its slots, first to last, and when its first span came.
#[derive(Debug, Clone, Copy)]
struct Chain {
    head: u32,
    tail: u32,
    len: u32,
    first: u64,
}

#[derive(Debug)]
struct Slot<S> {
    span: Option<S>,
    /// The trace's next slot ([`NONE`] for its last).
    next: u32,
}

const NONE: u32 = u32::MAX;

impl<S: HeldSpan> Held<S> {
    pub fn new(limits: HoldLimits) -> Held<S> {
        Held {
            limits,
            traces: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            order: VecDeque::new(),
            spans: 0,
            kept: HashSet::default(),
            kept_order: VecDeque::new(),
            evicted: HashMap::default(),
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

    /// Spans held at most.
    pub fn max_spans(&self) -> usize {
        self.limits.max_spans
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
        let slot = self.slot(span);
        match self.traces.get_mut(&trace) {
            Some(chain) => {
                self.slots[chain.tail as usize].next = slot;
                chain.tail = slot;
                chain.len += 1;
            }
            None => {
                self.traces.insert(
                    trace,
                    Chain {
                        head: slot,
                        tail: slot,
                        len: 1,
                        first: now,
                    },
                );
                self.order.push_back((trace, now));
            }
        }
        self.spans += 1;
        while self.spans > self.limits.max_spans {
            if !self.evict_oldest(now, true) {
                break;
            }
        }
    }

    /// A slot holding `span`: a free one, or a new one.
    fn slot(&mut self, span: S) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Slot {
                    span: Some(span),
                    next: NONE,
                };
                i
            }
            None => {
                // The cap bounds the slots well below u32::MAX.
                let i = u32::try_from(self.slots.len()).unwrap_or(NONE - 1);
                self.slots.push(Slot {
                    span: Some(span),
                    next: NONE,
                });
                i
            }
        }
    }

    /// Takes `trace`'s held spans out, first to last, into `each`; its
    /// chain, when it was held.
    fn take(&mut self, trace: u128, mut each: impl FnMut(S)) -> Option<Chain> {
        let chain = self.traces.remove(&trace)?;
        let mut i = chain.head;
        while i != NONE {
            let slot = &mut self.slots[i as usize];
            if let Some(span) = slot.span.take() {
                each(span);
            }
            self.free.push(i);
            i = slot.next;
        }
        self.spans -= chain.len as usize;
        Some(chain)
    }

    /// Evicts `trace`'s held spans, counting them; how many there were.
    fn discard(&mut self, trace: u128) -> Option<Chain> {
        let mut cost = 0;
        let chain = self.take(trace, |span| cost += span.cost_ns())?;
        self.counts.evicted_spans += u64::from(chain.len);
        self.counts.evicted_cost_ns += cost;
        Some(chain)
    }

    /// The run kept `traces`, decided at `now`: their held spans into
    /// `out`, their later ones sent as they come.
    pub fn keep(&mut self, traces: impl IntoIterator<Item = u128>, now: u64, out: &mut Vec<S>) {
        for trace in traces {
            self.take(trace, |span| out.push(span));
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
            self.discard(trace);
        }
    }

    /// The run's latest decisions (`decided`: kept or not, by trace),
    /// come at `now`, applied to the traces held, then to `taken`, the
    /// spans taken since the decisions before: a span of a kept trace
    /// goes into `out`, of a dropped one away (counted as evicted), of
    /// one not decided yet into the hold. Most spans are decided by the
    /// time they are looked at, so they never touch the hold's maps.
    pub fn decide(
        &mut self,
        decided: &HashMap<u128, bool, TraceIds>,
        taken: impl IntoIterator<Item = S>,
        now: u64,
        out: &mut Vec<S>,
    ) {
        self.keep(
            decided.iter().filter(|(_, kept)| **kept).map(|(t, _)| *t),
            now,
            out,
        );
        self.drop_traces(decided.iter().filter(|(_, kept)| !**kept).map(|(t, _)| *t));
        for span in taken {
            match decided.get(&span.trace_id()) {
                Some(true) => out.push(span),
                Some(false) => {
                    self.counts.evicted_spans += 1;
                    self.counts.evicted_cost_ns += span.cost_ns();
                }
                None => self.add(span, now, out),
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

    /// Evicts `trace` if it is still held from `first` (it may have been
    /// sent or dropped since, and held again from a later span).
    fn evict(&mut self, trace: u128, first: u64, now: u64, early: bool) -> bool {
        if self.traces.get(&trace).is_none_or(|c| c.first != first) {
            return false;
        }
        let Some(chain) = self.discard(trace) else {
            return false;
        };
        if early {
            self.counts.evicted_early += u64::from(chain.len);
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

/// Hashes trace ids, already random (or a run's nonce beside a request
/// id), with one multiply-and-shift mix instead of SipHash: the holders
/// look up every span's and every decision's trace.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceIds;

impl std::hash::BuildHasher for TraceIds {
    type Hasher = TraceIdHasher;

    fn build_hasher(&self) -> TraceIdHasher {
        TraceIdHasher(0)
    }
}

/// [`TraceIds`]'s hasher.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceIdHasher(u64);

impl std::hash::Hasher for TraceIdHasher {
    fn finish(&self) -> u64 {
        // splitmix64's finalizer: every bit of the id reaches the low
        // bits (the bucket) and the high ones (the control byte).
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
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
    fn a_trace_held_again_after_its_drop_waits_its_own_hold() {
        let mut h = held(100, 1000);
        let mut out = Vec::new();
        h.add(span(1, 10), 0, &mut out);
        h.drop_traces([1]);
        // A late span of trace 1: its hold starts at 60 ms, not at 0.
        h.add(span(1, 11), 60 * MS, &mut out);
        h.expire(101 * MS);
        assert_eq!(h.len(), 1, "the first hold's entry evicted the second");
        h.keep([1], 102 * MS, &mut out);
        assert_eq!(ids(&out), [11]);
        assert_eq!(h.counts().lost_traces, 0);
    }

    #[test]
    fn slots_are_reused_once_their_traces_go() {
        let mut h = held(100, 1000);
        let mut out = Vec::new();
        for round in 0..10u64 {
            for t in 0..50u128 {
                h.add(span(t + 1000 * u128::from(round), round), round, &mut out);
            }
            let traces = (0..50u128).map(|t| t + 1000 * u128::from(round));
            if round % 2 == 0 {
                h.drop_traces(traces);
            } else {
                h.keep(traces, round, &mut out);
            }
        }
        assert!(h.is_empty());
        assert_eq!(
            h.slots.len(),
            50,
            "every round fits in the first round's slots"
        );
        assert_eq!(out.len(), 250);
        assert_eq!(h.counts().evicted_spans, 250);
    }

    #[test]
    fn spans_decided_when_first_looked_at_are_never_held() {
        let mut held = held(1000, 100);
        let mut out = Vec::new();
        // Trace 1 waits undecided from an earlier ask.
        held.add(span(1, 10), 0, &mut out);
        let decided: HashMap<u128, bool, TraceIds> =
            [(1, true), (2, true), (3, false)].into_iter().collect();
        // Taken since: trace 2 (kept), 3 (dropped), 4 (not decided yet).
        let taken = vec![span(2, 20), span(3, 30), span(3, 31), span(4, 40)];
        held.decide(&decided, taken, 5, &mut out);
        assert_eq!(ids(&out), vec![10, 20]);
        // Only the undecided span is held; the dropped ones count as
        // evicted without ever having been held.
        assert_eq!(held.len(), 1);
        assert_eq!(held.counts().evicted_spans, 2);
        // A later span of a kept trace goes on at once; of the dropped
        // one, it waits out its hold.
        out.clear();
        held.add(span(2, 21), 6, &mut out);
        held.add(span(3, 32), 6, &mut out);
        assert_eq!(ids(&out), vec![21]);
        assert_eq!(held.len(), 2);
        // The undecided trace's decision comes at the next ask.
        let next: HashMap<u128, bool, TraceIds> = [(4, true)].into_iter().collect();
        held.decide(&next, Vec::new(), 7, &mut out);
        assert_eq!(ids(&out), vec![21, 40]);
        assert_eq!(held.counts().lost_traces, 0);
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
